//! Frame parsing: Ethernet (one optional 802.1Q tag), ARP, IPv4 with options, IPv6 with
//! its extension-header chain, and the TCP/UDP/ICMP/ICMPv6 header that yields the flow key.
//!
//! Individual headers are read through etherparse's header slices, which validate lengths
//! and versions. The IPv6 chain is walked with [`ipv6_ext::Walker`], once: in a fragment
//! that is not the first, the bytes after the fragment header are data, not headers,
//! whatever its next-header field says; and what later stages need of the chain (the
//! fragment header, the end of the unfragmentable part, the routing header) is recorded
//! in [`Parsed`] so that none of them walks it again.

use etherparse::{
    ArpPacketSlice, Ethernet2HeaderSlice, Ipv4HeaderSlice, Ipv6HeaderSlice, SingleVlanHeaderSlice,
    TcpHeaderSlice, UdpHeaderSlice,
};

use crate::drop::DropReason;
use crate::flow::{Addr, FlowKey, proto};
use crate::wire::ethernet::ethertype;
use crate::wire::ipv6_ext::{self, Walker};
use crate::wire::{ethernet, icmp, ipv6};

/// Length of an Ethernet header without a tag ([`ethernet::HEADER_LEN`]).
pub const ETH_LEN: usize = ethernet::HEADER_LEN;
/// Length of an IPv6 fixed header ([`ipv6::HEADER_LEN`]).
pub const IPV6_LEN: usize = ipv6::HEADER_LEN;

/// The network layer of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L3 {
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
    /// ARP (Ethernet/IPv4).
    Arp,
}

/// Fragment information of an IP packet that is a real fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frag {
    /// Identification (16 bits for IPv4, 32 for IPv6).
    pub id: u32,
    /// Offset of this fragment's data in the datagram, in bytes.
    pub offset: u16,
    /// More fragments follow.
    pub more: bool,
}

/// Where the headers of a frame are, and its flow key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parsed {
    /// The 802.1Q tag control information, when tagged.
    pub vlan: Option<u16>,
    /// Network layer kind.
    pub l3: L3,
    /// Offset of the IP (or ARP) header.
    pub l3_off: usize,
    /// End of the IP packet per its length field; the frame may carry padding beyond.
    pub ip_end: usize,
    /// IPv6: offset of the fragment header, or 0 when there is none.
    pub frag_hdr_off: usize,
    /// Where the unfragmentable part ends (RFC 8200 section 4.5): where a fragment header
    /// is inserted to fragment the packet, or where it is. For IPv6 without one: after
    /// the last hop-by-hop or routing header among the hop-by-hop, routing and
    /// destination-options headers that lead the chain, else after the fixed header
    /// (destination options after them travel in the fragmentable part), as Linux's
    /// `ip6_find_1stfragopt` finds it. For IPv4, the end of the header; for ARP, 0.
    pub unfrag_end: usize,
    /// The next-header field that names the header at [`Self::unfrag_end`] (the one a
    /// fragment header inserted there takes over): in the fixed IPv6 header or the last
    /// header of the unfragmentable part. For IPv4, the protocol field; for ARP, 0.
    pub unfrag_nh: usize,
    /// IPv6: offset of the (first) routing header before the upper-layer header, or 0.
    pub routing_off: usize,
    /// IPv6: how many routing headers there are before the upper-layer header (at most
    /// 255 counted).
    pub routing_headers: u8,
    /// Offset of the upper-layer header; for a fragment that is not the first, the
    /// offset of its fragment data.
    pub l4_off: usize,
    /// Upper-layer protocol (IPv4 protocol / final IPv6 next header).
    pub proto: u8,
    /// Set when the packet is a fragment (not an IPv6 atomic fragment).
    pub frag: Option<Frag>,
    /// IPv4 DF bit.
    pub dont_fragment: bool,
    /// The whole IPv6 header chain through the upper-layer header is present.
    pub chain_complete: bool,
    /// The transport header is present and valid, so the key's ports are real.
    pub l4_complete: bool,
    /// TCP flags byte (zero for other protocols).
    pub tcp_flags: u8,
    /// TTL / hop limit.
    pub ttl: u8,
    /// The flow key (for IP; zeroed addresses for ARP).
    pub key: FlowKey,
}

impl Parsed {
    /// True for an IPv4 or IPv6 packet.
    pub fn is_ip(&self) -> bool {
        self.l3 != L3::Arp
    }

    /// True for a fragment whose offset is not zero.
    pub fn is_later_fragment(&self) -> bool {
        self.frag.is_some_and(|f| f.offset != 0)
    }

    /// Bytes of the IP packet, header included.
    pub fn ip_len(&self) -> usize {
        self.ip_end - self.l3_off
    }
}

/// Parses a frame from the Ethernet header on. Malformed frames return the reason to
/// count; nothing here panics on any input.
pub fn parse(frame: &[u8], zone: u16) -> Result<Parsed, DropReason> {
    let eth = Ethernet2HeaderSlice::from_slice(frame).map_err(|_| DropReason::FrameTooShort)?;
    let mut etype = eth.ether_type().0;
    let mut l3_off = ETH_LEN;
    let mut vlan = None;
    if etype == ethertype::VLAN || etype == ethertype::QINQ {
        let tag = SingleVlanHeaderSlice::from_slice(&frame[ETH_LEN..])
            .map_err(|_| DropReason::FrameTooShort)?;
        etype = tag.ether_type().0;
        if etype == ethertype::VLAN || etype == ethertype::QINQ {
            return Err(DropReason::TooManyVlanTags);
        }
        let s = tag.slice();
        vlan = Some(u16::from_be_bytes([s[0], s[1]]));
        l3_off += 4;
    }
    let rest = &frame[l3_off..];
    match etype {
        ethertype::IPV4 => parse_ipv4(rest, l3_off, vlan, zone),
        ethertype::IPV6 => parse_ipv6(rest, l3_off, vlan, zone),
        ethertype::ARP => {
            let arp = ArpPacketSlice::from_slice(rest).map_err(|_| DropReason::ArpMalformed)?;
            if arp.hw_addr_size() != 6 || arp.proto_addr_size() != 4 {
                return Err(DropReason::ArpMalformed);
            }
            Ok(Parsed {
                vlan,
                l3: L3::Arp,
                l3_off,
                ip_end: l3_off + arp.slice().len(),
                frag_hdr_off: 0,
                unfrag_end: 0,
                unfrag_nh: 0,
                routing_off: 0,
                routing_headers: 0,
                l4_off: l3_off + arp.slice().len(),
                proto: 0,
                frag: None,
                dont_fragment: false,
                chain_complete: true,
                l4_complete: true,
                tcp_flags: 0,
                ttl: 0,
                key: FlowKey {
                    zone,
                    src: Addr::V4_UNSPECIFIED,
                    dst: Addr::V4_UNSPECIFIED,
                    proto: 0,
                    src_port: 0,
                    dst_port: 0,
                },
            })
        }
        _ => Err(DropReason::UnsupportedEthertype),
    }
}

/// Offset of the protocol field in the IPv4 header.
const IPV4_PROTOCOL: usize = 9;

fn parse_ipv4(b: &[u8], l3_off: usize, vlan: Option<u16>, zone: u16) -> Result<Parsed, DropReason> {
    let h = Ipv4HeaderSlice::from_slice(b).map_err(|_| DropReason::Ipv4HeaderMalformed)?;
    let hlen = h.slice().len();
    let total = usize::from(h.total_len());
    if total < hlen || total > b.len() {
        return Err(DropReason::IpLengthInvalid);
    }
    if crate::wire::checksum::checksum(h.slice()) != 0 {
        return Err(DropReason::Ipv4BadChecksum);
    }
    let offset = h.fragments_offset().value() * 8;
    let more = h.more_fragments();
    let frag = (offset != 0 || more).then_some(Frag {
        id: u32::from(h.identification()),
        offset,
        more,
    });
    let protocol = h.protocol().0;
    // Everything is read into locals first and `Parsed` built once at the end: building
    // it in place and patching fields made the hot path pay for stack copies.
    let l4 = if offset == 0 {
        parse_l4(protocol, frag.is_some(), &b[hlen..total])?
    } else {
        L4::default()
    };
    Ok(Parsed {
        vlan,
        l3: L3::Ipv4,
        l3_off,
        ip_end: l3_off + total,
        frag_hdr_off: 0,
        unfrag_end: l3_off + hlen,
        unfrag_nh: l3_off + IPV4_PROTOCOL,
        routing_off: 0,
        routing_headers: 0,
        l4_off: l3_off + hlen,
        proto: protocol,
        frag,
        dont_fragment: h.dont_fragment(),
        chain_complete: true,
        l4_complete: l4.complete,
        tcp_flags: l4.tcp_flags,
        ttl: h.ttl(),
        key: FlowKey {
            zone,
            src: Addr::v4(h.source_addr()),
            dst: Addr::v4(h.destination_addr()),
            proto: protocol,
            src_port: l4.src_port,
            dst_port: l4.dst_port,
        },
    })
}

fn parse_ipv6(b: &[u8], l3_off: usize, vlan: Option<u16>, zone: u16) -> Result<Parsed, DropReason> {
    let h = Ipv6HeaderSlice::from_slice(b).map_err(|_| DropReason::Ipv6HeaderMalformed)?;
    let payload_len = usize::from(h.payload_length());
    // A zero payload length announces a jumbogram, which ferry does not carry.
    if payload_len == 0 && h.next_header().0 != 59 || IPV6_LEN + payload_len > b.len() {
        return Err(DropReason::IpLengthInvalid);
    }
    let d = &b[..IPV6_LEN + payload_len];
    let (src, dst) = (Addr::v6(h.source_addr()), Addr::v6(h.destination_addr()));
    // A flow key holds an IPv4 address in its IPv4-mapped form: such an address in an
    // IPv6 header (a form for IPv4 addresses inside a host, RFC 4291 section 2.5.5.2;
    // Linux drops such a source too) would read as IPv4.
    if src.is_ipv4() || dst.is_ipv4() {
        return Err(DropReason::Ipv6V4MappedAddress);
    }
    // As for IPv4, the walk works on locals and `Parsed` is built once at the end.
    let mut walk = Walker::new(d);
    let mut frag = None;
    let mut frag_hdr_off = 0;
    let mut chain_complete = true;
    // The unfragmentable part, and whether the headers walked so far all lead the chain.
    let (mut unfrag_end, mut unfrag_nh) = (IPV6_LEN, ipv6_ext::FIXED_NEXT_HEADER);
    let mut leading = true;
    // The next-header field that named the header being looked at.
    let mut named_at = ipv6_ext::FIXED_NEXT_HEADER;
    let (mut routing_off, mut routing_headers) = (0, 0u8);
    loop {
        let h = match walk.step() {
            Ok(Some(h)) => h,
            Ok(None) => break,
            // A header that does not fit: malformed, except in a first fragment, whose
            // chain may legitimately run past its end (ipf refuses that, RFC 7112); a
            // second fragment header is malformed whether it fits or not.
            Err(ipv6_ext::Error::Truncated)
                if frag.is_some() && walk.next_header() != ipv6_ext::FRAGMENT =>
            {
                chain_complete = false;
                break;
            }
            Err(_) => return Err(DropReason::Ipv6ExtHeaderMalformed),
        };
        match h.kind {
            ipv6_ext::FRAGMENT => {
                if frag_hdr_off != 0 {
                    return Err(DropReason::Ipv6ExtHeaderMalformed);
                }
                let f = ipv6_ext::Fragment::parse(&d[h.off..])
                    .ok_or(DropReason::Ipv6ExtHeaderMalformed)?;
                frag_hdr_off = l3_off + h.off;
                (unfrag_end, unfrag_nh) = (h.off, named_at);
                leading = false;
                // An atomic fragment (offset 0, no more) is processed as a whole packet (RFC 6946).
                if f.offset != 0 || f.more {
                    frag = Some(Frag {
                        id: f.id,
                        offset: f.offset,
                        more: f.more,
                    });
                }
                if f.offset != 0 {
                    // What follows is fragment data, not headers.
                    break;
                }
            }
            ipv6_ext::HOP_BY_HOP | ipv6_ext::ROUTING => {
                if h.kind == ipv6_ext::ROUTING {
                    if routing_headers == 0 {
                        routing_off = l3_off + h.off;
                    }
                    routing_headers = routing_headers.saturating_add(1);
                }
                if leading {
                    (unfrag_end, unfrag_nh) = (h.off + h.len, h.off);
                }
            }
            ipv6_ext::DEST_OPTS => {}
            _ => leading = false,
        }
        named_at = h.off;
    }
    let (nh, off) = (walk.next_header(), walk.offset());
    let later_fragment = frag.is_some_and(|f: Frag| f.offset != 0);
    let l4 = if chain_complete && !later_fragment {
        parse_l4(nh, frag.is_some(), &d[off..])?
    } else {
        L4::default()
    };
    Ok(Parsed {
        vlan,
        l3: L3::Ipv6,
        l3_off,
        ip_end: l3_off + d.len(),
        frag_hdr_off,
        unfrag_end: l3_off + unfrag_end,
        unfrag_nh: l3_off + unfrag_nh,
        routing_off,
        routing_headers,
        l4_off: l3_off + off,
        proto: nh,
        frag,
        dont_fragment: false,
        chain_complete: chain_complete && !later_fragment,
        l4_complete: l4.complete,
        tcp_flags: l4.tcp_flags,
        ttl: h.hop_limit(),
        key: FlowKey {
            zone,
            src,
            dst,
            proto: nh,
            src_port: l4.src_port,
            dst_port: l4.dst_port,
        },
    })
}

/// What the transport header says: the key's ports, the TCP flags, and whether it was there.
#[derive(Clone, Copy, Default)]
struct L4 {
    src_port: u16,
    dst_port: u16,
    tcp_flags: u8,
    complete: bool,
}

/// Reads the transport header at the start of `l4` (the rest of the IP payload).
/// For a first fragment, a header that does not fit leaves `complete` false so that
/// ipf can refuse it with its own reason.
#[inline]
fn parse_l4(proto: u8, fragment: bool, l4: &[u8]) -> Result<L4, DropReason> {
    let short = |reason| {
        if fragment {
            Ok(L4::default())
        } else {
            Err(reason)
        }
    };
    match proto {
        proto::TCP => match TcpHeaderSlice::from_slice(l4) {
            Ok(t) => Ok(L4 {
                src_port: t.source_port(),
                dst_port: t.destination_port(),
                tcp_flags: t.slice()[13],
                complete: true,
            }),
            Err(_) => short(DropReason::TcpHeaderMalformed),
        },
        proto::UDP => match UdpHeaderSlice::from_slice(l4) {
            Ok(u) => {
                let len = usize::from(u.length());
                if !fragment && (len < 8 || len > l4.len()) {
                    return Err(DropReason::UdpHeaderMalformed);
                }
                Ok(L4 {
                    src_port: u.source_port(),
                    dst_port: u.destination_port(),
                    tcp_flags: 0,
                    complete: true,
                })
            }
            Err(_) => short(DropReason::UdpHeaderMalformed),
        },
        // The common header: source and destination ports, verification tag, checksum
        // (RFC 9260 section 3.1). Its ports key the flow like TCP's and UDP's.
        proto::SCTP => match l4 {
            [s0, s1, d0, d1, _, _, _, _, _, _, _, _, ..] => Ok(L4 {
                src_port: u16::from_be_bytes([*s0, *s1]),
                dst_port: u16::from_be_bytes([*d0, *d1]),
                tcp_flags: 0,
                complete: true,
            }),
            _ => short(DropReason::SctpHeaderMalformed),
        },
        proto::ICMP | proto::ICMPV6 => {
            if l4.len() < 8 {
                return short(DropReason::IcmpMalformed);
            }
            let (ty, code) = (l4[0], l4[1]);
            Ok(L4 {
                src_port: if icmp::is_echo(proto, ty) {
                    u16::from_be_bytes([l4[4], l4[5]])
                } else {
                    0
                },
                dst_port: u16::from(ty) << 8 | u16::from(code),
                tcp_flags: 0,
                complete: true,
            })
        }
        _ => Ok(L4 {
            complete: true,
            ..L4::default()
        }),
    }
}

/// The addresses of an IPv6 key as arrays (for pseudo-headers).
pub fn v6_octets(a: impl Into<Addr>) -> [u8; 16] {
    *a.into().octets()
}

/// The IPv4 address as an array, or the unspecified address for IPv6.
#[cfg(test)]
pub(crate) fn v4_octets(a: impl Into<Addr>) -> [u8; 4] {
    a.into().to_v4().map_or([0; 4], |v| v.octets())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::build::{self, IpOpts, tcp_flags};
    use std::net::IpAddr;

    fn v4(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// An Ethernet frame with an IPv4 SCTP packet of `l4` bytes (header and chunks).
    fn sctp_frame(l4: &[u8]) -> Vec<u8> {
        let b = etherparse::PacketBuilder::ethernet2([2; 6], [4; 6]).ipv4(
            [10, 0, 0, 1],
            [10, 0, 0, 2],
            64,
        );
        let mut v = Vec::new();
        b.write(&mut v, etherparse::IpNumber(proto::SCTP), l4)
            .unwrap();
        v
    }

    #[test]
    fn test_sctp_ports_key_the_flow_and_a_short_header_is_refused() {
        let mut l4 = vec![0x9c, 0x40, 0x00, 0x50];
        l4.extend_from_slice(&[0; 12]);
        let p = parse(&sctp_frame(&l4), 0).unwrap();
        assert_eq!(
            (p.key.proto, p.key.src_port, p.key.dst_port),
            (proto::SCTP, 40000, 80)
        );
        assert_eq!(
            parse(&sctp_frame(&l4[..11]), 0).unwrap_err(),
            DropReason::SctpHeaderMalformed
        );
    }

    #[test]
    fn test_parse_udp_v4_key() {
        let f = build::udp(
            v4("10.0.0.1"),
            v4("10.0.0.2"),
            4000,
            53,
            b"query",
            &IpOpts::default(),
        );
        let p = parse(&f, 7).unwrap();
        assert_eq!(p.l3, L3::Ipv4);
        assert_eq!((p.l3_off, p.l4_off, p.ip_end), (14, 34, f.len()));
        assert!(p.frag.is_none() && p.l4_complete);
        assert_eq!(
            p.key,
            FlowKey {
                zone: 7,
                src: Addr::from(v4("10.0.0.1")),
                dst: Addr::from(v4("10.0.0.2")),
                proto: proto::UDP,
                src_port: 4000,
                dst_port: 53
            }
        );
    }

    #[test]
    fn test_parse_tcp_v6_flags() {
        let f = build::tcp(
            v4("fd00::1"),
            v4("fd00::2"),
            40000,
            80,
            1,
            0,
            tcp_flags::SYN,
            b"",
            &IpOpts::default(),
        );
        let p = parse(&f, 0).unwrap();
        assert_eq!(p.l3, L3::Ipv6);
        assert_eq!(p.l4_off, 14 + 40);
        assert_eq!(p.tcp_flags, tcp_flags::SYN);
        assert_eq!(
            (p.key.src_port, p.key.dst_port, p.key.proto),
            (40000, 80, proto::TCP)
        );
    }

    /// A key holds IPv4 addresses in their IPv4-mapped IPv6 form, so an IPv6 packet with
    /// such an address (a form for IPv4 addresses inside a host) is dropped rather than
    /// read as IPv4.
    #[test]
    fn test_parse_v6_with_v4_mapped_address_is_dropped() {
        for (src, dst) in [
            ("::ffff:10.0.0.1", "fd00::2"),
            ("fd00::1", "::ffff:10.0.0.2"),
        ] {
            let f = build::udp(v4(src), v4(dst), 1, 2, b"x", &IpOpts::default());
            assert_eq!(parse(&f, 0).err(), Some(DropReason::Ipv6V4MappedAddress));
        }
        // The deprecated IPv4-compatible form (`::a.b.c.d`) is plain IPv6.
        let f = build::udp(
            v4("::10.0.0.1"),
            v4("fd00::2"),
            1,
            2,
            b"x",
            &IpOpts::default(),
        );
        let p = parse(&f, 0).unwrap();
        assert!(p.key.src.is_ipv6());
        assert_eq!(p.key.src.ip(), v4("::10.0.0.1"));
    }

    #[test]
    fn test_parse_icmp_echo_key() {
        let f = build::echo_request(
            v4("10.0.0.1"),
            v4("10.0.0.2"),
            0x77,
            1,
            b"ping",
            &IpOpts::default(),
        );
        let p = parse(&f, 0).unwrap();
        assert_eq!((p.key.src_port, p.key.dst_port), (0x77, 8 << 8));
        assert_eq!(p.key.icmp_type(), Some(8));
        let f = build::echo_request(
            v4("fd00::1"),
            v4("fd00::2"),
            0x78,
            1,
            b"ping",
            &IpOpts::default(),
        );
        let p = parse(&f, 0).unwrap();
        assert_eq!((p.key.src_port, p.key.dst_port), (0x78, 128 << 8));
    }

    #[test]
    fn test_parse_vlan_and_padding() {
        let f = build::udp(
            v4("10.0.0.1"),
            v4("10.0.0.2"),
            1,
            2,
            b"",
            &IpOpts::default(),
        );
        let mut tagged = f[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x64]);
        tagged.extend_from_slice(&f[12..]);
        tagged.extend_from_slice(&[0; 10]); // Ethernet padding past the IP packet
        let p = parse(&tagged, 0).unwrap();
        assert_eq!(p.vlan, Some(100));
        assert_eq!(p.l3_off, 18);
        assert_eq!(p.ip_end, 18 + 28);
        // QinQ is refused.
        let mut qinq = f[..12].to_vec();
        qinq.extend_from_slice(&[0x88, 0xa8, 0, 1, 0x81, 0x00, 0, 2]);
        qinq.extend_from_slice(&f[12..]);
        assert_eq!(parse(&qinq, 0), Err(DropReason::TooManyVlanTags));
    }

    #[test]
    fn test_parse_rejects_malformed() {
        let f = build::udp(
            v4("10.0.0.1"),
            v4("10.0.0.2"),
            1,
            2,
            b"abcd",
            &IpOpts::default(),
        );
        assert_eq!(parse(&f[..10], 0), Err(DropReason::FrameTooShort));
        let mut bad = f.clone();
        bad[24] ^= 0xff; // header checksum
        assert_eq!(parse(&bad, 0), Err(DropReason::Ipv4BadChecksum));
        assert_eq!(
            parse(&f[..f.len() - 1], 0),
            Err(DropReason::IpLengthInvalid)
        );
        let mut ihl = f.clone();
        ihl[14] = 0x44;
        assert_eq!(parse(&ihl, 0), Err(DropReason::Ipv4HeaderMalformed));
        let mut et = f.clone();
        et[12] = 0x88;
        et[13] = 0xcc;
        assert_eq!(parse(&et, 0), Err(DropReason::UnsupportedEthertype));
        let mut ulen = f.clone();
        ulen[14 + 20 + 4] = 0xff; // UDP length beyond the packet
        assert_eq!(parse(&ulen, 0), Err(DropReason::UdpHeaderMalformed));
    }

    #[test]
    fn test_parse_v6_later_fragment_is_data() {
        // Fragment header (next header = destination options) at offset 8: the bytes
        // after it are data and must not be parsed as a destination-options header.
        let f = build::udp(
            v4("fd00::1"),
            v4("fd00::2"),
            1,
            2,
            &[0u8; 16],
            &IpOpts::default(),
        );
        let mut g = f[..14 + 40].to_vec();
        g[14 + 6] = 44; // next header: fragment
        g.extend_from_slice(&[60, 0, 0x00, 0x09, 0, 0, 0, 42]); // offset 1 (8 bytes), M=1, id 42
        g.extend_from_slice(&[0xff; 16]); // "dest opts" with a length far past the end
        let plen = (g.len() - 14 - 40) as u16;
        g[14 + 4..14 + 6].copy_from_slice(&plen.to_be_bytes());
        let p = parse(&g, 0).unwrap();
        assert_eq!(
            p.frag,
            Some(Frag {
                id: 42,
                offset: 8,
                more: true
            })
        );
        assert_eq!(p.frag_hdr_off, 14 + 40);
        assert_eq!(p.l4_off, 14 + 48);
        assert_eq!(p.proto, 60);
        assert_eq!((p.key.src_port, p.key.dst_port), (0, 0));
    }

    /// Extension headers: type, and the body after the next-header and length bytes.
    type Chain<'a> = &'a [(u8, &'a [u8])];

    /// A UDP packet over IPv6 with the extension headers `chain` between the fixed header
    /// and UDP.
    fn v6_with_chain(chain: Chain) -> Vec<u8> {
        let f = build::udp(
            v4("fd00::1"),
            v4("fd00::2"),
            1,
            2,
            b"data",
            &IpOpts::default(),
        );
        let mut g = f[..14 + 40].to_vec();
        let mut named_at = 14 + 6;
        for (kind, body) in chain {
            g[named_at] = *kind;
            named_at = g.len();
            let units = if *kind == ipv6_ext::AUTH {
                (body.len() + 2) / 4 - 2
            } else {
                (body.len() + 2) / 8 - 1
            };
            g.extend_from_slice(&[0, units as u8]);
            g.extend_from_slice(body);
        }
        g[named_at] = proto::UDP;
        g.extend_from_slice(&f[14 + 40..]);
        let plen = (g.len() - 14 - 40) as u16;
        g[14 + 4..14 + 6].copy_from_slice(&plen.to_be_bytes());
        g
    }

    #[test]
    fn test_parse_v6_records_the_unfragmentable_part_and_routing_header() {
        use ipv6_ext::{AUTH, DEST_OPTS, FRAGMENT, HOP_BY_HOP, ROUTING};
        let (o6, o14) = (&[0u8; 6][..], &[0u8; 14][..]);
        let base = 14 + 40;
        // (chain, unfrag_end, unfrag_nh, routing_off, routing headers)
        let cases: [(Chain, usize, usize, usize, u8); 6] = [
            (&[], base, 14 + 6, 0, 0),
            // Destination options alone travel in the fragmentable part.
            (&[(DEST_OPTS, o6)], base, 14 + 6, 0, 0),
            (&[(HOP_BY_HOP, o6), (DEST_OPTS, o6)], base + 8, base, 0, 0),
            // Through the routing header, destination options before it included.
            (
                &[
                    (HOP_BY_HOP, o6),
                    (DEST_OPTS, o6),
                    (ROUTING, o14),
                    (DEST_OPTS, o6),
                ],
                base + 32,
                base + 16,
                base + 16,
                1,
            ),
            // The run ends at an authentication header; its routing header still counts.
            (
                &[
                    (HOP_BY_HOP, o6),
                    (AUTH, &[0; 10]),
                    (ROUTING, o6),
                    (ROUTING, o6),
                ],
                base + 8,
                base,
                base + 20,
                2,
            ),
            // A fragment header is where the unfragmentable part ends.
            (
                &[(HOP_BY_HOP, o6), (DEST_OPTS, o6), (FRAGMENT, o6)],
                base + 16,
                base + 8,
                0,
                0,
            ),
        ];
        for (chain, end, nh, routing, count) in cases {
            let f = v6_with_chain(chain);
            let p = parse(&f, 0).unwrap();
            assert_eq!(
                (p.unfrag_end, p.unfrag_nh, p.routing_off, p.routing_headers),
                (end, nh, routing, count),
                "{chain:?}"
            );
            assert_eq!((p.proto, p.key.dst_port), (proto::UDP, 2));
        }
        let f = build::udp(
            v4("10.0.0.1"),
            v4("10.0.0.2"),
            1,
            2,
            b"",
            &IpOpts::default(),
        );
        let p = parse(&f, 0).unwrap();
        assert_eq!((p.unfrag_end, p.unfrag_nh), (14 + 20, 14 + 9));
    }

    #[test]
    fn test_parse_v6_chain_errors() {
        use ipv6_ext::{DEST_OPTS, FRAGMENT, HOP_BY_HOP};
        let o6 = &[0u8; 6][..];
        // Hop-by-hop must come first; one fragment header at most.
        for chain in [
            &[(DEST_OPTS, o6), (HOP_BY_HOP, o6)][..],
            &[(FRAGMENT, o6), (FRAGMENT, o6)][..],
        ] {
            let f = v6_with_chain(chain);
            assert_eq!(parse(&f, 0), Err(DropReason::Ipv6ExtHeaderMalformed));
        }
        // A header running past the packet: malformed, but in a first fragment the
        // chain is only incomplete.
        let mut f = v6_with_chain(&[(DEST_OPTS, o6)]);
        f[14 + 41] = 9;
        assert_eq!(parse(&f, 0), Err(DropReason::Ipv6ExtHeaderMalformed));
        let mut f = v6_with_chain(&[(FRAGMENT, &[0, 1, 0, 0, 0, 7]), (DEST_OPTS, o6)]);
        f[14 + 49] = 9;
        let p = parse(&f, 0).unwrap();
        assert!(!p.chain_complete && !p.l4_complete);
        assert_eq!(p.frag.map(|f| (f.id, f.more)), Some((7, true)));
    }

    #[test]
    fn test_parse_arp() {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&build::MAC_SRC);
        f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&build::MAC_SRC);
        f.extend_from_slice(&[10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2]);
        let p = parse(&f, 0).unwrap();
        assert_eq!(p.l3, L3::Arp);
        assert!(!p.is_ip());
        assert_eq!(parse(&f[..20], 0), Err(DropReason::ArpMalformed));
    }
}
