//! The packet as it travels through the pipeline: bytes plus metadata.

/// Index of a port in the node tables.
pub type PortId = u16;

/// Offload state as a virtio-net header describes it (`struct virtio_net_hdr`).
///
/// Pods' TAP devices and the uplink's AF_PACKET socket exchange this header with the
/// kernel; ferry keeps it with the packet so that a coalesced ("GSO super-") packet is
/// segmented, not fragmented, and a partial checksum is completed only when needed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHdr {
    /// `VIRTIO_NET_HDR_F_*` flags.
    pub flags: u8,
    /// `VIRTIO_NET_HDR_GSO_*` type, possibly with the ECN bit.
    pub gso_type: u8,
    /// Length of the headers to copy into every segment (a hint; ferry recomputes it).
    pub hdr_len: u16,
    /// Payload bytes per segment (the MSS for TCP).
    pub gso_size: u16,
    /// Where checksumming starts, from the start of the frame.
    pub csum_start: u16,
    /// Where the checksum is stored, from `csum_start`.
    pub csum_offset: u16,
}

impl VnetHdr {
    /// The checksum field holds only the pseudo-header sum; the rest is still to be added.
    pub const F_NEEDS_CSUM: u8 = 1;
    /// The checksum was already verified.
    pub const F_DATA_VALID: u8 = 2;
    /// Not a GSO packet.
    pub const GSO_NONE: u8 = 0;
    /// TCP over IPv4 segmentation.
    pub const GSO_TCPV4: u8 = 1;
    /// UDP fragmentation offload (obsolete UFO); ferry refuses it.
    pub const GSO_UDP: u8 = 3;
    /// TCP over IPv6 segmentation.
    pub const GSO_TCPV6: u8 = 4;
    /// UDP segmentation offload (USO): split into datagrams, never fragments.
    pub const GSO_UDP_L4: u8 = 5;
    /// The TCP packet had CWR set before segmentation (ECN).
    pub const GSO_ECN: u8 = 0x80;

    /// True when the packet is a GSO super-packet to be cut into `gso_size` pieces.
    #[inline]
    pub fn is_gso(&self) -> bool {
        self.gso_type & !Self::GSO_ECN != Self::GSO_NONE
    }

    /// True when the L4 checksum is partial and must be completed before the wire.
    #[inline]
    pub fn needs_csum(&self) -> bool {
        self.flags & Self::F_NEEDS_CSUM != 0
    }
}

/// What the pipeline knows about a packet besides its bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    /// The port the packet was received on.
    pub in_port: PortId,
    /// Receive time in nanoseconds on the pipeline's clock (pcap time in replay).
    pub time_ns: u64,
    /// Conntrack / fragment zone.
    pub zone: u16,
    /// Offload state from the receiving port.
    pub vnet: VnetHdr,
    /// For a datagram reassembled from fragments: the largest fragment received (its
    /// whole IP packet length). Zero for packets that were never reassembled.
    pub mru: u16,
    /// For a datagram reassembled from fragments: its identification, so that
    /// refragmentation keeps it (IPv6 loses it with the fragment header).
    pub frag_id: u32,
}

/// A packet: the whole frame, starting at the Ethernet header, and its metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Packet {
    /// Frame bytes from the destination MAC on.
    pub data: Vec<u8>,
    /// Metadata.
    pub meta: Meta,
}

impl Packet {
    /// A packet received on `in_port` at `time_ns`, with no offload state.
    pub fn new(data: Vec<u8>, in_port: PortId, time_ns: u64) -> Packet {
        Packet {
            data,
            meta: Meta {
                in_port,
                time_ns,
                ..Meta::default()
            },
        }
    }
}
