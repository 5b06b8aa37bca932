//! The saved records, one struct per kind, as the sections carry them (postcard over
//! these serde structs). Field order and enum variant order are the wire format: a
//! change to either is a new format version (see the module documentation of
//! `handover`).
//!
//! Times are durations before (`*_ago_ns`) or after (`remaining_ns`) the moment of the
//! save, never a pipeline's clock: each agent has its own. Nothing refers to an index of
//! the producing tables: ports are named, Service ports too.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// What the producing pipeline says of itself (section `META`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// The node's name in the producing tables: the state is this node's only.
    pub node: String,
    /// The IPv4 identification of the next outer datagram through the overlay, so that
    /// peers reassembling fragmented outer datagrams do not see identifications again
    /// soon after the handover.
    pub outer_id: u16,
}

/// One direction's addresses and ports. For ICMP echo, `src_port` is the identifier and
/// `dst_port` the type and code (`type << 8 | code`), as conntrack keys them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tuple {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port (ICMP echo: identifier).
    pub src_port: u16,
    /// Destination port (ICMP: type and code).
    pub dst_port: u16,
}

/// TCP connection states, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TcpState {
    /// SYN seen from the originator.
    SynSent,
    /// SYN-ACK seen from the responder.
    SynRecv,
    /// Handshake completed, or picked up mid-stream.
    Established,
    /// A FIN was seen.
    FinWait,
    /// The first FIN was acknowledged.
    CloseWait,
    /// Both sides sent a FIN.
    LastAck,
    /// The last FIN was acknowledged.
    TimeWait,
    /// Reset, or fully closed.
    Close,
}

/// One direction of a TCP connection's window tracking.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpSide {
    /// Highest sequence number sent, plus one.
    pub end: u32,
    /// Highest sequence number the other side allowed.
    pub max_end: u32,
    /// Largest (scaled) window advertised; zero until the side is seen.
    pub max_window: u32,
    /// Window scale shift (at most 14).
    pub window_scale: u8,
    /// The window scale option was in this side's SYN.
    pub sent_window_scale: bool,
    /// Its segments pass without window checks (picked up mid-stream).
    pub liberal: bool,
    /// It has data the other side has not acknowledged.
    pub unacknowledged: bool,
}

/// A TCP connection's tracking.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tcp {
    /// Its state.
    pub state: TcpState,
    /// The last segment was an RST let through without closing the connection.
    pub reset_kept: bool,
    /// The originator's side.
    pub original: TcpSide,
    /// The responder's side.
    pub reply: TcpSide,
}

/// What is tracked of a connection besides its tuples, by protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Tracking {
    /// TCP: state machine and windows.
    Tcp(Tcp),
    /// UDP: its state follows from `seen_reply` and `assured`.
    Udp,
    /// ICMP or ICMPv6 echo.
    Icmp,
    /// Another protocol, by addresses only.
    Other,
    /// SCTP (since version 4): association state and verification tags.
    Sctp(Sctp),
}

/// An SCTP association's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SctpState {
    /// INIT seen.
    CookieWait,
    /// COOKIE ECHO seen.
    CookieEchoed,
    /// Up.
    Established,
    /// SHUTDOWN seen.
    ShutdownSent,
    /// SHUTDOWN ACK seen.
    ShutdownAckSent,
    /// Picked up from a HEARTBEAT.
    HeartbeatSent,
    /// Ended.
    Closed,
}

/// An SCTP association's tracking.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sctp {
    /// Its state.
    pub state: SctpState,
    /// The verification tags of the original and reply directions (zero: not learnt).
    pub vtag: [u32; 2],
}

/// One tracked connection (section `CONN`). The original tuple is its first packet's as
/// it arrived; the reply tuple is what replies carry on arrival: the reverse of the
/// original after NAT. Its NAT port (or echo identifier) is the reply tuple's
/// destination, and is reserved again by restoring the connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connection {
    /// Conntrack zone.
    pub zone: u16,
    /// IP protocol number.
    pub proto: u8,
    /// The original direction.
    pub original: Tuple,
    /// The reply direction.
    pub reply: Tuple,
    /// Protocol tracking.
    pub tracking: Tracking,
    /// A packet was seen in the reply direction.
    pub seen_reply: bool,
    /// Established enough never to be evicted (TCP handshake done, UDP stream).
    pub assured: bool,
    /// The original destination is translated.
    pub dnat: bool,
    /// The original source is translated.
    pub snat: bool,
    /// The mark other stages set: bit 0 load balanced to a Service endpoint by this
    /// node, bit 1 forced through the tunnel, bit 2 started by the node's own stack;
    /// other bits as the agent set them.
    pub mark: u32,
    /// Labels other stages set.
    pub labels: u128,
    /// The node the original direction came through, which replies return through.
    pub tunnel_peer: Option<IpAddr>,
    /// Packets seen (original, reply).
    pub packets: [u64; 2],
    /// Bytes of whole IP packets seen (original, reply).
    pub bytes: [u64; 2],
    /// How long before the save its first packet came.
    pub first_seen_ago_ns: u64,
    /// How long before the save its last refreshing packet came.
    pub last_seen_ago_ns: u64,
}

/// A connection removed since the base of a pre-copy (section `GONE` of a state of
/// changes, from version 3), by its original tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removed {
    /// Conntrack zone.
    pub zone: u16,
    /// IP protocol number.
    pub proto: u8,
    /// The original direction.
    pub original: Tuple,
}

/// A session affinity record (section `AFFN`): a client of a Service port kept on its
/// endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Affinity {
    /// The Service port, `namespace/name:port`.
    pub service: String,
    /// The client's address.
    pub client: IpAddr,
    /// The endpoint's address.
    pub endpoint: IpAddr,
    /// The endpoint's port.
    pub endpoint_port: u16,
    /// How long after the save the record lapses without a new connection.
    pub remaining_ns: u64,
}

impl From<TcpState> for crate::conntrack::TcpState {
    fn from(s: TcpState) -> Self {
        use crate::conntrack::TcpState as S;
        match s {
            TcpState::SynSent => S::SynSent,
            TcpState::SynRecv => S::SynRecv,
            TcpState::Established => S::Established,
            TcpState::FinWait => S::FinWait,
            TcpState::CloseWait => S::CloseWait,
            TcpState::LastAck => S::LastAck,
            TcpState::TimeWait => S::TimeWait,
            TcpState::Close => S::Close,
        }
    }
}

impl From<crate::conntrack::TcpState> for TcpState {
    fn from(s: crate::conntrack::TcpState) -> Self {
        use crate::conntrack::TcpState as S;
        match s {
            S::SynSent => TcpState::SynSent,
            S::SynRecv => TcpState::SynRecv,
            S::Established => TcpState::Established,
            S::FinWait => TcpState::FinWait,
            S::CloseWait => TcpState::CloseWait,
            S::LastAck => TcpState::LastAck,
            S::TimeWait => TcpState::TimeWait,
            S::Close => TcpState::Close,
        }
    }
}

/// Neighbour states, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NeighState {
    /// Probed, not answered yet: no MAC.
    Incomplete,
    /// Confirmed recently.
    Reachable,
    /// Not confirmed.
    Stale,
    /// Used while stale, to be probed unless confirmed.
    Delay,
    /// Being probed at its MAC.
    Probe,
}

/// A neighbour of the uplink or host port (section `NEIG`, from version 2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Neighbour {
    /// The port's name.
    pub port: String,
    /// Its address.
    pub addr: IpAddr,
    /// Its MAC (zero while incomplete).
    pub mac: [u8; 6],
    /// Its state.
    pub state: NeighState,
    /// How long before the save it was created, changed or confirmed.
    pub updated_ago_ns: u64,
    /// How long before the save a packet last looked it up.
    pub used_ago_ns: u64,
    /// How long before the save it was last probed, if ever.
    pub probed_ago_ns: Option<u64>,
    /// Probes sent to its MAC in PROBE.
    pub probes: u8,
}

/// The headers of a datagram's first fragment: the frame up to its data (link layer, IP
/// header, and for IPv6 the extension headers before the fragment header).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirstHeaders {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Where the IP header starts in them.
    pub ip_offset: u16,
    /// IPv6: the next header named by the fragment header.
    pub next_header: u8,
    /// IPv6: where the next-header field that names the fragment header is in them.
    pub next_header_at: u16,
}

/// One fragment's data in a datagram.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fragment {
    /// Offset of its data in the datagram's.
    pub offset: u32,
    /// Its data.
    pub data: Vec<u8>,
}

/// A datagram in reassembly (section `FRAG`, from version 2), with the fragments it
/// holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Datagram {
    /// Conntrack zone of its fragments.
    pub zone: u16,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// IPv4: the protocol (0 for IPv6, whose fragments need not agree on it).
    pub proto: u8,
    /// Identification.
    pub id: u32,
    /// How long after the save it expires incomplete.
    pub remaining_ns: u64,
    /// The first fragment's headers, once it came.
    pub first: Option<FirstHeaders>,
    /// The data's length, once the last fragment came.
    pub end: Option<u32>,
    /// The fragments held, in the order they came.
    pub fragments: Vec<Fragment>,
    /// Their whole IP lengths, added up (what the byte limit counts).
    pub bytes: u32,
    /// The largest fragment, as a whole IP length.
    pub mru: u16,
    /// IPv4: the largest fragment with DF set.
    pub max_df: u16,
    /// The ECN codepoints of its fragments, as bits (`1 << ecn`).
    pub ecn_seen: u8,
}
