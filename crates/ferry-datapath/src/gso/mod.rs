//! Segmentation of GSO super-packets: TCP (TSO) and UDP (USO), never IP fragmentation.
//!
//! A host that coalesced a flow (GRO, or a guest using TSO through a TAP's virtio-net
//! header) hands ferry one large packet plus a [`VnetHdr`] saying how to cut it. When such
//! a packet meets an MTU, it is cut here into plain packets, each with a complete,
//! freshly computed checksum: the super-packet's own checksum may be partial
//! (`NEEDS_CSUM`) or stale, so it is never trusted.
//!
//! Each segment is allocated once with its exact size, the headers and its payload are
//! copied into it, and the length/sequence/identification fields are fixed. The headers'
//! part of the checksums is summed once per super-packet with those fields left out;
//! each segment adds its own fields as numbers and the sum of its payload, read where it
//! lies in the super-packet. No checksum reads back a segment just written.

use crate::drop::DropReason;
use crate::flow::proto;
use crate::packet::{Meta, Packet, VnetHdr};
use crate::wire::Parsed;
use crate::wire::build::tcp_flags;
use crate::wire::checksum;
use crate::wire::ipv6_ext::{self, routing_type};
use crate::wire::parse::{IPV6_LEN, L3};

/// TCP header length without options.
const TCP_MIN_LEN: usize = 20;
/// UDP header length.
const UDP_LEN: usize = 8;

/// Most segments one UDP super-packet may become, Linux's `UDP_MAX_SEGMENTS`: senders
/// cannot ask for more, so a request for more is not from a well-behaved stack.
pub const MAX_SEGMENTS_UDP: usize = 128;
/// Most segments one TCP super-packet may become. Linux never uses an MSS below 88 bytes
/// (`TCP_MIN_MSS`), so a 64 KiB super-packet is at most 745 segments; 1024 leaves margin
/// while keeping a `gso_size` of 1 from turning one packet into 64 000 allocations.
pub const MAX_SEGMENTS_TCP: usize = 1024;

/// What kind of segmentation a super-packet asks for, once checked against the packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Tcp,
    Udp,
}

impl Kind {
    fn max_segments(self) -> usize {
        match self {
            Kind::Tcp => MAX_SEGMENTS_TCP,
            Kind::Udp => MAX_SEGMENTS_UDP,
        }
    }
}

/// Where the pieces of a checked super-packet are.
struct Layout {
    kind: Kind,
    l3: L3,
    l3_off: usize,
    l4_off: usize,
    /// End of the transport header: everything before it is copied into every segment.
    hdr_end: usize,
    ip_end: usize,
    /// IPv6: the destination address of the transport pseudo-header, which is the final
    /// destination when a routing header has segments left.
    v6_dst: [u8; 16],
}

/// Cuts a GSO super-packet (`pkt.meta.vnet.is_gso()`) into segments, appending them to
/// `out`.
///
/// TCP segments carry `min(vnet.gso_size, what fits in max_ip_len)` payload bytes each, so
/// they all fit in `max_ip_len`: TCP is a byte stream and any cut is as good as another.
/// UDP (USO) is always cut at `vnet.gso_size`, whatever `max_ip_len` says: each piece is
/// one datagram the application wrote, and cutting it smaller would deliver different
/// datagrams. A UDP segment may therefore be longer than `max_ip_len`; the caller handles
/// it like any other too-big datagram (fragmenting IPv4 without DF, otherwise an ICMP
/// error). `max_ip_len` must still leave room for the headers and one byte of payload.
///
/// TCP segments get advancing sequence numbers, FIN/PSH only on the last segment and CWR
/// only on the first; UDP (USO) segments are separate datagrams with their own UDP header.
/// IPv4 identification increments by one per segment from the original. Link-layer
/// headers (including an 802.1Q tag), IP options and IPv6 extension headers are copied
/// into every segment. Output packets carry the input's metadata with a default
/// [`VnetHdr`]: they are plain packets with complete checksums. A packet whose payload
/// fits in one segment still comes out as one such plain packet. Over IPv6 with a
/// routing header that has segments left, the checksum covers the final destination
/// (RFC 8200 section 8.1): the address of a type 2 header or Segment List\[0\] of a
/// Segment Routing Header; other routing types with segments left are refused.
///
/// Segmentation itself never makes IP fragments: old UFO (`GSO_UDP`) is refused with
/// [`DropReason::GsoUnsupported`], as is an unknown GSO type. A request that does not
/// match the packet (wrong family or protocol, `gso_size` 0, truncated headers, a
/// fragment, an IPv6 routing header whose final destination ferry does not read, a packet that is not GSO at all, or a `gso_size` so small that the packet
/// would become more than [`MAX_SEGMENTS_TCP`] or [`MAX_SEGMENTS_UDP`] segments) is
/// [`DropReason::GsoMalformed`]; an MTU that leaves no room for payload, or so little that
/// a TCP packet would become more than [`MAX_SEGMENTS_TCP`] segments, is
/// [`DropReason::MtuTooSmall`]. On error nothing is appended to `out`.
pub fn segment(
    pkt: &Packet,
    parsed: &Parsed,
    max_ip_len: usize,
    out: &mut Vec<Packet>,
) -> Result<(), DropReason> {
    let s = Segmenter::new(pkt, parsed, max_ip_len)?;
    let meta = Meta {
        vnet: VnetHdr::default(),
        ..pkt.meta
    };
    out.reserve(s.count());
    for i in 0..s.count() {
        let mut seg = Vec::with_capacity(s.len(i));
        s.write(i, &mut seg);
        out.push(Packet { data: seg, meta });
    }
    Ok(())
}

/// A checked GSO super-packet and how it is cut: the segments of [`segment`], which
/// [`Segmenter::write`] appends one at a time to any buffer, so a caller can put them
/// where they go (back to back in an encapsulated super-frame, say) without a buffer of
/// their own each.
pub(crate) struct Segmenter<'a> {
    data: &'a [u8],
    lay: Layout,
    /// Payload bytes per segment.
    mss: usize,
    count: usize,
    v4_id: u16,
    seq0: u32,
    flags0: u8,
    /// IPv4: the sum of the IP header without its total length, identification and
    /// checksum, which differ per segment.
    ip_sum: u64,
    /// The sum of the pseudo-header without its length and of the transport header
    /// without the fields that differ per segment (TCP: sequence number, the word of the
    /// data offset and flags, checksum; UDP: length, checksum).
    l4_sum: u64,
}

impl<'a> Segmenter<'a> {
    /// Checks the super-packet and works out its segments; the errors of [`segment`].
    pub fn new(
        pkt: &'a Packet,
        parsed: &Parsed,
        max_ip_len: usize,
    ) -> Result<Segmenter<'a>, DropReason> {
        let vnet = pkt.meta.vnet;
        let lay = check(&pkt.data, parsed, &vnet)?;
        let ip_hdr_len = lay.hdr_end - lay.l3_off;
        let room = max_ip_len
            .checked_sub(ip_hdr_len)
            .filter(|r| *r > 0)
            .ok_or(DropReason::MtuTooSmall)?;
        let mss = match lay.kind {
            Kind::Tcp => room.min(usize::from(vnet.gso_size)),
            Kind::Udp => usize::from(vnet.gso_size),
        };
        let data = &pkt.data[..];
        let v4_id = match lay.l3 {
            L3::Ipv4 => u16::from_be_bytes([data[lay.l3_off + 4], data[lay.l3_off + 5]]),
            _ => 0,
        };
        let (seq0, flags0) = match lay.kind {
            Kind::Tcp => {
                let t = &data[lay.l4_off..];
                (u32::from_be_bytes([t[4], t[5], t[6], t[7]]), t[13])
            }
            Kind::Udp => (0, 0),
        };
        let count = (lay.ip_end - lay.hdr_end).div_ceil(mss).max(1);
        if count > lay.kind.max_segments() {
            // A tiny gso_size is the sender's doing; a tiny MSS forced by the MTU is ours.
            return Err(if mss < usize::from(vnet.gso_size) {
                DropReason::MtuTooSmall
            } else {
                DropReason::GsoMalformed
            });
        }
        let (ip_sum, l4_sum) = header_sums(data, &lay);
        Ok(Segmenter {
            data,
            lay,
            mss,
            count,
            v4_id,
            seq0,
            flags0,
            ip_sum,
            l4_sum,
        })
    }

    /// How many segments.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Where segment `i`'s payload lies in the super-packet.
    fn chunk(&self, i: usize) -> std::ops::Range<usize> {
        let start = self.lay.hdr_end + i * self.mss;
        start..self.lay.ip_end.min(start + self.mss)
    }

    /// Bytes of segment `i` (link-layer header included).
    pub fn len(&self, i: usize) -> usize {
        self.lay.hdr_end + self.chunk(i).len()
    }

    /// Offset of the IP header in every segment.
    pub fn l3_off(&self) -> usize {
        self.lay.l3_off
    }

    /// Appends segment `i` (`i < count()`) to `out`: a plain packet with a complete
    /// checksum.
    pub fn write(&self, i: usize, out: &mut Vec<u8>) {
        let lay = &self.lay;
        let chunk = self.chunk(i);
        let last = i + 1 == self.count;
        let base = out.len();
        out.extend_from_slice(&self.data[..lay.hdr_end]);
        out.extend_from_slice(&self.data[chunk.clone()]);
        let seg = &mut out[base..];

        let ip_len = seg.len() - lay.l3_off;
        let l4_len = seg.len() - lay.l4_off;
        let mut l4_sum = self.l4_sum + checksum::add(&self.data[chunk.clone()], 0);
        match lay.l3 {
            L3::Ipv4 => {
                let id = self.v4_id.wrapping_add(i as u16);
                let ip = &mut seg[lay.l3_off..lay.l4_off];
                ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
                ip[4..6].copy_from_slice(&id.to_be_bytes());
                let c = checksum::finish(self.ip_sum + ip_len as u64 + u64::from(id));
                ip[10..12].copy_from_slice(&c.to_be_bytes());
                l4_sum += l4_len as u64;
            }
            _ => {
                let ip = &mut seg[lay.l3_off..];
                ip[4..6].copy_from_slice(&((ip_len - IPV6_LEN) as u16).to_be_bytes());
                l4_sum += (l4_len >> 16) as u64 + (l4_len & 0xffff) as u64;
            }
        }

        let l4 = &mut seg[lay.l4_off..];
        let csum_at = match lay.kind {
            Kind::Tcp => {
                let seq = self.seq0.wrapping_add((chunk.start - lay.hdr_end) as u32);
                l4[4..8].copy_from_slice(&seq.to_be_bytes());
                let mut flags = self.flags0;
                if !last {
                    flags &= !(tcp_flags::FIN | tcp_flags::PSH);
                }
                if i != 0 {
                    flags &= !tcp_flags::CWR;
                }
                l4[13] = flags;
                l4_sum += u64::from(seq >> 16)
                    + u64::from(seq & 0xffff)
                    + u64::from(u16::from_be_bytes([l4[12], flags]));
                16
            }
            Kind::Udp => {
                l4[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
                l4_sum += l4_len as u64;
                6
            }
        };
        let mut c = checksum::finish(l4_sum);
        // In UDP a zero checksum means "none"; its ones' complement twin says the same sum.
        if lay.kind == Kind::Udp && c == 0 {
            c = 0xffff;
        }
        l4[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
    }
}

/// The parts of the checksums that every segment of a super-packet shares
/// ([`Segmenter`]'s `ip_sum` and `l4_sum`), summed from the super-packet's headers in
/// pieces that leave out the fields a segment sets. Every piece starts at an even offset.
fn header_sums(data: &[u8], lay: &Layout) -> (u64, u64) {
    let sum = |pieces: &[&[u8]]| pieces.iter().map(|p| checksum::add(p, 0)).sum::<u64>();
    let ip = &data[lay.l3_off..lay.l4_off];
    let l4 = &data[lay.l4_off..lay.hdr_end];
    let (ip_sum, pseudo) = match lay.l3 {
        L3::Ipv4 => {
            // Without total length (2..4), identification (4..6) and checksum (10..12).
            let src = [ip[12], ip[13], ip[14], ip[15]];
            let dst = [ip[16], ip[17], ip[18], ip[19]];
            (
                sum(&[&ip[..2], &ip[6..10], &ip[12..]]),
                checksum::pseudo_v4(src, dst, ip[9], 0),
            )
        }
        _ => {
            let mut src = [0u8; 16];
            src.copy_from_slice(&ip[8..24]);
            let nh = match lay.kind {
                Kind::Tcp => proto::TCP,
                Kind::Udp => proto::UDP,
            };
            (0, checksum::pseudo_v6(&src, &lay.v6_dst, nh, 0))
        }
    };
    let l4_fixed = match lay.kind {
        // Without sequence number (4..8), data offset and flags (12..14), checksum (16..18).
        Kind::Tcp => sum(&[&l4[..4], &l4[8..12], &l4[14..16], &l4[18..]]),
        // Without length (4..6) and checksum (6..8).
        Kind::Udp => sum(&[&l4[..4]]),
    };
    (ip_sum, pseudo + l4_fixed)
}

/// Checks that a packet's GSO request (`vnet`, which must ask for segmentation) matches
/// the packet, as [`segment`] would before cutting it: the errors of [`segment`] but
/// those of the MTU. For a packet that may be sent on whole, so that a port is never
/// handed a request its kernel would refuse.
pub(crate) fn check_request(
    data: &[u8],
    parsed: &Parsed,
    vnet: &VnetHdr,
) -> Result<(), DropReason> {
    check(data, parsed, vnet).map(|_| ())
}

/// Checks that the GSO request matches the packet and finds its pieces.
fn check(data: &[u8], p: &Parsed, vnet: &VnetHdr) -> Result<Layout, DropReason> {
    let kind = match vnet.gso_type & !VnetHdr::GSO_ECN {
        VnetHdr::GSO_TCPV4 => {
            if p.l3 != L3::Ipv4 || p.proto != proto::TCP {
                return Err(DropReason::GsoMalformed);
            }
            Kind::Tcp
        }
        VnetHdr::GSO_TCPV6 => {
            if p.l3 != L3::Ipv6 || p.proto != proto::TCP {
                return Err(DropReason::GsoMalformed);
            }
            Kind::Tcp
        }
        VnetHdr::GSO_UDP_L4 => {
            // ECN is a TCP notion; USO with it set is not a request the kernel makes.
            if !p.is_ip() || p.proto != proto::UDP || vnet.gso_type & VnetHdr::GSO_ECN != 0 {
                return Err(DropReason::GsoMalformed);
            }
            Kind::Udp
        }
        VnetHdr::GSO_NONE => return Err(DropReason::GsoMalformed),
        _ => return Err(DropReason::GsoUnsupported),
    };
    if vnet.gso_size == 0 || p.frag.is_some() || p.frag_hdr_off != 0 || !p.l4_complete {
        return Err(DropReason::GsoMalformed);
    }
    // `p` comes from the caller: check its offsets against these bytes before slicing.
    if p.ip_end > data.len() || p.l4_off > p.ip_end || p.l3_off >= p.l4_off {
        return Err(DropReason::GsoMalformed);
    }
    let l4_hdr_len = match kind {
        Kind::Tcp => {
            let off = data.get(p.l4_off + 12).ok_or(DropReason::GsoMalformed)?;
            usize::from(off >> 4) * 4
        }
        Kind::Udp => UDP_LEN,
    };
    let hdr_end = p.l4_off + l4_hdr_len;
    if (kind == Kind::Tcp && l4_hdr_len < TCP_MIN_LEN) || hdr_end > p.ip_end {
        return Err(DropReason::GsoMalformed);
    }
    // A segment size so small that the packet would become too many segments, whether
    // ferry cuts it or hands it on whole.
    if (p.ip_end - hdr_end).div_ceil(usize::from(vnet.gso_size)) > kind.max_segments() {
        return Err(DropReason::GsoMalformed);
    }
    let min_l3 = match p.l3 {
        L3::Ipv4 => 20,
        _ => IPV6_LEN,
    };
    if p.l4_off - p.l3_off < min_l3 {
        return Err(DropReason::GsoMalformed);
    }
    let v6_dst = match p.l3 {
        L3::Ipv4 => [0; 16],
        _ => pseudo_header_dst_v6(data, p)?,
    };
    Ok(Layout {
        kind,
        l3: p.l3,
        l3_off: p.l3_off,
        l4_off: p.l4_off,
        hdr_end,
        ip_end: p.ip_end,
        v6_dst,
    })
}

/// The destination address for the transport checksum of the IPv6 packet `p` in `data`
/// (RFC 8200 section 8.1): the address in the IPv6 header, unless a routing header still
/// has segments left, in which case the final destination. That is the one address of a
/// type 2 routing header (Mobile IPv6's home address), and Segment List[0] of a Segment
/// Routing Header. Other routing types with segments left (RPL's compressed addresses,
/// the deprecated type 0) are refused rather than guessed at, as are two routing headers.
/// The parser found the routing header ([`Parsed::routing_off`]).
fn pseudo_header_dst_v6(data: &[u8], p: &Parsed) -> Result<[u8; 16], DropReason> {
    let ip = &data[p.l3_off..p.l4_off];
    let mut dst = [0u8; 16];
    dst.copy_from_slice(ip.get(24..IPV6_LEN).ok_or(DropReason::GsoMalformed)?);
    match p.routing_headers {
        0 => return Ok(dst),
        1 => {}
        _ => return Err(DropReason::GsoMalformed),
    }
    // `p` comes from the caller: the header must lie within the extension headers.
    let h = p
        .routing_off
        .checked_sub(p.l3_off)
        .filter(|&at| at >= IPV6_LEN)
        .and_then(|at| ip.get(at..))
        .ok_or(DropReason::GsoMalformed)?;
    let len = ipv6_ext::header_len(ipv6_ext::ROUTING, h).ok_or(DropReason::GsoMalformed)?;
    let (kind, segments_left) = (h[2], h[3]);
    if segments_left > 0 {
        // Type 2 holds exactly one address, SRH at least one (Segment List[0]); both
        // from byte 8.
        let readable = match kind {
            routing_type::TYPE_2 => len == 24,
            routing_type::SRH => len >= 24,
            _ => false,
        };
        if !readable {
            return Err(DropReason::GsoMalformed);
        }
        dst.copy_from_slice(&h[8..24]);
    }
    Ok(dst)
}

/// Checks the offload state a port reported against the packet: a partial checksum must
/// start at the transport header and name its checksum field, so that completing it can
/// never write elsewhere (after routing and other checks); a GSO request must match the
/// packet ([`check_request`]: family, protocol, headers, a segment size; never a
/// fragment), whether it is cut here later or handed on whole to a port that takes GSO.
#[inline]
pub(crate) fn check_offload(data: &[u8], v: &VnetHdr, parsed: &Parsed) -> Result<(), DropReason> {
    if v.needs_csum() {
        let field = match parsed.proto {
            proto::TCP => 16,
            proto::UDP => 6,
            proto::ICMP | proto::ICMPV6 => 2,
            _ => return Err(DropReason::CsumOffloadInvalid),
        };
        if parsed.frag.is_some()
            || !parsed.l4_complete
            || usize::from(v.csum_start) != parsed.l4_off
            || usize::from(v.csum_offset) != field
            || parsed.l4_off + field + 2 > parsed.ip_end
        {
            return Err(DropReason::CsumOffloadInvalid);
        }
    }
    if v.is_gso() {
        // Checked here, whether the packet is cut later or handed on whole.
        check_request(data, parsed, v)?;
    } else if v.gso_type != VnetHdr::GSO_NONE {
        // The ECN bit alone: no GSO type to go with it, which Linux refuses
        // (`virtio_net_hdr_to_skb`), so that no port would take the packet.
        return Err(DropReason::GsoUnsupported);
    }
    Ok(())
}

/// The bytes of IP and transport headers copied into every segment of a GSO packet.
#[inline]
pub(crate) fn headers_len(data: &[u8], parsed: &Parsed) -> usize {
    let l4 = if parsed.proto == proto::TCP {
        data.get(parsed.l4_off + 12)
            .map_or(20, |b| usize::from(b >> 4) * 4)
    } else {
        8
    };
    parsed.l4_off - parsed.l3_off + l4
}

/// The IP length of the largest datagram a USO packet becomes: its headers and at most
/// `gso_size` bytes of payload. A packet whose payload is no longer than `gso_size` is a
/// single datagram of its own length, as Linux takes it ("too small packets are not
/// really GSO ones", `virtio_net_hdr_to_skb`).
#[inline]
pub(crate) fn largest_datagram(pkt: &Packet, parsed: &Parsed) -> usize {
    let headers = headers_len(&pkt.data, parsed);
    let payload = (parsed.ip_end - parsed.l3_off).saturating_sub(headers);
    headers + payload.min(usize::from(pkt.meta.vnet.gso_size))
}

/// True for a packet that asks for UDP segmentation (USO), the ECN bit aside.
#[inline]
pub(crate) fn is_uso(v: &VnetHdr) -> bool {
    v.gso_type & !VnetHdr::GSO_ECN == VnetHdr::GSO_UDP_L4
}

#[cfg(test)]
mod tests;
