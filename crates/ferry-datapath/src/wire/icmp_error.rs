//! The packet that an ICMP or ICMPv6 error quotes.
//!
//! An error carries the start of the packet that caused it (RFC 792: the IP header and at
//! least 8 bytes of its data; RFC 4443 2.4(c): as much as fits in 1280 bytes). Conntrack
//! relates the error to a connection by the quoted packet's flow key, which is in the
//! orientation of the original sender; NAT then translates that quote (see
//! [`super::rewrite::rewrite_icmp_error`]). Quotes are often truncated, so the quoted
//! header's lengths and checksum are not checked against the quote.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::drop::DropReason;
use crate::flow::{Addr, FlowKey, proto};
use crate::wire::icmp::{self, v6};
use crate::wire::ipv6_ext::{self, Walker};
use crate::wire::parse::{IPV6_LEN, L3, Parsed};

/// Length of the ICMP/ICMPv6 header before the quote: type, code, checksum, 4 bytes.
pub const ICMP_HDR: usize = icmp::HEADER_LEN;
/// Bytes of the quoted transport header that RFC 792 and RFC 4443 guarantee.
pub const QUOTED_L4_MIN: usize = 8;

/// IPv4 header length without options.
const IPV4_MIN: usize = crate::wire::ipv4::HEADER_LEN;

/// The packet an ICMP/ICMPv6 error quotes, as the original sender sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Embedded {
    /// Flow key of the quoted packet (zone = the outer packet's zone), built exactly as
    /// wire::parse builds keys (ports for TCP/UDP; for ICMP echo src_port = id, dst_port = type<<8|code).
    pub key: FlowKey,
    /// Offset (in the frame) of the quoted IP header, and of its transport header.
    pub l3_off: usize,
    /// Offset (in the frame) of the quoted transport header.
    pub l4_off: usize,
    /// How many bytes of the quoted packet are present (quotes are often truncated).
    pub len: usize,
}

/// True for the error types whose quote [`embedded`] reads: every ICMP error (RFC 792
/// gives them all the same layout), and the ICMPv6 errors RFC 4443 defines (destination
/// unreachable, packet too big, time exceeded, parameter problem).
fn has_known_quote(icmp_proto: u8, t: u8) -> bool {
    match icmp_proto {
        proto::ICMPV6 => (v6::DEST_UNREACHABLE..=v6::PARAMETER_PROBLEM).contains(&t),
        _ => icmp::is_error(icmp_proto, t),
    }
}

/// For an ICMP error (see [`is_error`]) or an ICMPv6 error of types 1 to 4, the quoted
/// packet. `Ok(None)` for non-error ICMP and non-ICMP packets, for a fragment that is not
/// the first (it holds no ICMP header), and for an ICMPv6 error of another type (0, 5 to
/// 127): no such type is defined with a quote ferry could trust, so it relates to no
/// connection, and conntrack calls it INVALID (it never starts a connection either).
///
/// `Err(DropReason::IcmpMalformed)` when the quote is too short for its IP header plus
/// the first 8 bytes of its transport header, when its IP version differs from the outer
/// one, or when it quotes a fragment that is not the first (errors are only ever sent
/// about the first, RFC 792; such a quote has no transport header). The quoted IP
/// header's checksum and lengths are not checked against the quote.
///
/// IPv6 quotes: hop-by-hop, routing, destination-options, authentication and fragment
/// headers are walked as `wire::parse` walks them.
pub fn embedded(frame: &[u8], parsed: &Parsed) -> Result<Option<Embedded>, DropReason> {
    let icmp_proto = match parsed.l3 {
        L3::Ipv4 => proto::ICMP,
        L3::Ipv6 => proto::ICMPV6,
        L3::Arp => return Ok(None),
    };
    if parsed.proto != icmp_proto || parsed.is_later_fragment() || !parsed.l4_complete {
        return Ok(None);
    }
    let ip = frame
        .get(..parsed.ip_end)
        .ok_or(DropReason::IcmpMalformed)?;
    let icmp = ip
        .get(parsed.l4_off..)
        .filter(|m| m.len() >= ICMP_HDR)
        .ok_or(DropReason::IcmpMalformed)?;
    if !has_known_quote(icmp_proto, icmp[0]) {
        return Ok(None);
    }
    let q_off = parsed.l4_off + ICMP_HDR;
    let quote = &icmp[ICMP_HDR..];
    let (src, dst, qproto, hdr_len) = match parsed.l3 {
        L3::Ipv4 => quoted_v4(quote)?,
        _ => quoted_v6(quote)?,
    };
    let l4 = quote
        .get(hdr_len..hdr_len + QUOTED_L4_MIN)
        .ok_or(DropReason::IcmpMalformed)?;
    let (src_port, dst_port) = match qproto {
        proto::TCP | proto::UDP => (
            u16::from_be_bytes([l4[0], l4[1]]),
            u16::from_be_bytes([l4[2], l4[3]]),
        ),
        p @ (proto::ICMP | proto::ICMPV6) => {
            let id = if icmp::is_echo(p, l4[0]) {
                u16::from_be_bytes([l4[4], l4[5]])
            } else {
                0
            };
            (id, u16::from(l4[0]) << 8 | u16::from(l4[1]))
        }
        _ => (0, 0),
    };
    Ok(Some(Embedded {
        key: FlowKey {
            zone: parsed.key.zone,
            src: src.into(),
            dst: dst.into(),
            proto: qproto,
            src_port,
            dst_port,
        },
        l3_off: q_off,
        l4_off: q_off + hdr_len,
        len: quote.len(),
    }))
}

/// Addresses, protocol and header length of a quoted IPv4 header.
fn quoted_v4(q: &[u8]) -> Result<(IpAddr, IpAddr, u8, usize), DropReason> {
    let h = q.get(..IPV4_MIN).ok_or(DropReason::IcmpMalformed)?;
    let hdr_len = usize::from(h[0] & 0x0f) * 4;
    if h[0] >> 4 != 4 || hdr_len < IPV4_MIN {
        return Err(DropReason::IcmpMalformed);
    }
    let frag_offset = u16::from_be_bytes([h[6], h[7]]) & 0x1fff;
    if frag_offset != 0 {
        return Err(DropReason::IcmpMalformed);
    }
    let src = Ipv4Addr::new(h[12], h[13], h[14], h[15]);
    let dst = Ipv4Addr::new(h[16], h[17], h[18], h[19]);
    Ok((IpAddr::V4(src), IpAddr::V4(dst), h[9], hdr_len))
}

/// Addresses, upper-layer protocol and header-chain length of a quoted IPv6 packet.
fn quoted_v6(q: &[u8]) -> Result<(IpAddr, IpAddr, u8, usize), DropReason> {
    let h = q.get(..IPV6_LEN).ok_or(DropReason::IcmpMalformed)?;
    if h[0] >> 4 != 6 {
        return Err(DropReason::IcmpMalformed);
    }
    let mut a = [0u8; 16];
    a.copy_from_slice(&h[8..24]);
    let src = Ipv6Addr::from(a);
    a.copy_from_slice(&h[24..40]);
    let dst = Ipv6Addr::from(a);
    // As in a packet's own header (see `parse`): an IPv4-mapped address would read as IPv4.
    if Addr::v6(src).is_ipv4() || Addr::v6(dst).is_ipv4() {
        return Err(DropReason::Ipv6V4MappedAddress);
    }
    let mut walk = Walker::new(q);
    while let Some(e) = walk.step().map_err(|_| DropReason::IcmpMalformed)? {
        // A quoted fragment that is not the first has no transport header to read.
        if e.kind == ipv6_ext::FRAGMENT
            && ipv6_ext::Fragment::parse(&q[e.off..]).is_some_and(|f| f.offset != 0)
        {
            return Err(DropReason::IcmpMalformed);
        }
    }
    Ok((
        IpAddr::V6(src),
        IpAddr::V6(dst),
        walk.next_header(),
        walk.offset(),
    ))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::icmp::{ErrorKind, build_error};
    use crate::wire::build::{self, IpOpts, tcp_flags};
    use crate::wire::parse;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn router(orig_src: IpAddr) -> IpAddr {
        if orig_src.is_ipv4() {
            ip("192.0.2.254")
        } else {
            ip("2001:db8::fe")
        }
    }

    fn error_about(orig: &[u8], kind: ErrorKind) -> Vec<u8> {
        let p = parse(orig, 3).unwrap();
        build_error(orig, &p, kind, router(p.key.src.ip()), build::MAC_DST).unwrap()
    }

    /// An ICMPv6 port unreachable about a UDP datagram from fd00::1 to fd00::2.
    fn port_unreachable_v6() -> Vec<u8> {
        let u = build::udp(
            ip("fd00::1"),
            ip("fd00::2"),
            4000,
            53,
            b"q",
            &IpOpts::default(),
        );
        error_about(&u, ErrorKind::Unreachable { code: 4 })
    }

    #[test]
    fn test_embedded_udp_and_tcp_keys() {
        for (s, d) in [("10.0.0.1", "10.0.0.2"), ("fd00::1", "fd00::2")] {
            let u = build::udp(ip(s), ip(d), 4000, 53, b"query", &IpOpts::default());
            let t = build::tcp(
                ip(s),
                ip(d),
                40000,
                443,
                7,
                0,
                tcp_flags::SYN,
                b"",
                &IpOpts::default(),
            );
            for (orig, kind) in [
                (&u, ErrorKind::Unreachable { code: 3 }),
                (&t, ErrorKind::TooBig { mtu: 1280 }),
                (&u, ErrorKind::TimeExceeded),
            ] {
                let e = error_about(orig, kind);
                let p = parse(&e, 3).unwrap();
                let emb = embedded(&e, &p).unwrap().unwrap();
                let op = parse(orig, 3).unwrap();
                assert_eq!(emb.key, op.key);
                assert_eq!(emb.l3_off, p.l4_off + ICMP_HDR);
                assert_eq!(emb.l4_off - emb.l3_off, op.l4_off - op.l3_off);
                assert_eq!(emb.len, op.ip_len());
                assert_eq!(&e[emb.l3_off..emb.l3_off + emb.len], &orig[14..]);
            }
        }
    }

    /// An ICMPv6 error quoting an IPv6 header with an IPv4-mapped address is dropped like
    /// such a packet itself: its quoted key would read as IPv4.
    #[test]
    fn test_embedded_v4_mapped_quote_is_dropped() {
        let mut e = port_unreachable_v6();
        let p = parse(&e, 0).unwrap();
        let quoted_src = p.l4_off + ICMP_HDR + 8;
        let mapped: Ipv6Addr = "::ffff:10.0.0.1".parse().unwrap();
        e[quoted_src..quoted_src + 16].copy_from_slice(&mapped.octets());
        let p = parse(&e, 0).unwrap();
        assert_eq!(embedded(&e, &p), Err(DropReason::Ipv6V4MappedAddress));
    }

    #[test]
    fn test_embedded_echo_key() {
        for (s, d, ty) in [("10.0.0.1", "10.0.0.2", 8u16), ("fd00::1", "fd00::2", 128)] {
            let echo = build::echo_request(ip(s), ip(d), 0x4242, 9, b"ping", &IpOpts::default());
            let e = error_about(&echo, ErrorKind::TimeExceeded);
            let p = parse(&e, 3).unwrap();
            let emb = embedded(&e, &p).unwrap().unwrap();
            assert_eq!(emb.key, parse(&echo, 3).unwrap().key);
            assert_eq!((emb.key.src_port, emb.key.dst_port), (0x4242, ty << 8));
        }
    }

    #[test]
    fn test_embedded_none_for_v6_error_types_without_a_known_quote() {
        let e = port_unreachable_v6();
        let p = parse(&e, 0).unwrap();
        assert!(embedded(&e, &p).unwrap().is_some());
        for t in [0u8, 5, 100, 127] {
            let mut x = e.clone();
            x[p.l4_off] = t;
            let p = parse(&x, 0).unwrap();
            assert_eq!(embedded(&x, &p), Ok(None), "type {t}");
        }
    }

    #[test]
    fn test_embedded_none_for_non_errors() {
        for (s, d) in [("10.0.0.1", "10.0.0.2"), ("fd00::1", "fd00::2")] {
            let echo = build::echo_request(ip(s), ip(d), 1, 1, b"", &IpOpts::default());
            assert_eq!(embedded(&echo, &parse(&echo, 0).unwrap()), Ok(None));
            let u = build::udp(ip(s), ip(d), 1, 2, b"", &IpOpts::default());
            assert_eq!(embedded(&u, &parse(&u, 0).unwrap()), Ok(None));
        }
    }

    /// Cuts the quote of error frame `e` to `quote_len` bytes, fixing lengths and checksums.
    pub(crate) fn truncate(e: &[u8], quote_len: usize) -> Vec<u8> {
        let p = parse(e, 0).unwrap();
        let mut f = e[..p.l4_off + ICMP_HDR + quote_len].to_vec();
        let icmp_len = f.len() - p.l4_off;
        f[p.l4_off + 2..p.l4_off + 4].fill(0);
        let c = match p.l3 {
            L3::Ipv4 => {
                let total = (f.len() - p.l3_off) as u16;
                f[p.l3_off + 2..p.l3_off + 4].copy_from_slice(&total.to_be_bytes());
                crate::wire::checksum::set_ipv4_header(&mut f[p.l3_off..p.l4_off]);
                crate::wire::checksum::checksum(&f[p.l4_off..])
            }
            _ => {
                f[p.l3_off + 4..p.l3_off + 6].copy_from_slice(&(icmp_len as u16).to_be_bytes());
                let pseudo = crate::wire::checksum::pseudo_v6(
                    &parse::v6_octets(p.key.src),
                    &parse::v6_octets(p.key.dst),
                    proto::ICMPV6,
                    icmp_len as u32,
                );
                crate::wire::checksum::finish(crate::wire::checksum::add(&f[p.l4_off..], pseudo))
            }
        };
        f[p.l4_off + 2..p.l4_off + 4].copy_from_slice(&c.to_be_bytes());
        f
    }

    #[test]
    fn test_embedded_requires_ip_header_and_8_bytes_of_l4() {
        for (s, d, hdr) in [("10.0.0.1", "10.0.0.2", 20), ("fd00::1", "fd00::2", 40)] {
            let u = build::udp(ip(s), ip(d), 4000, 53, &[7; 40], &IpOpts::default());
            let e = error_about(&u, ErrorKind::Unreachable { code: 3 });
            let short = truncate(&e, hdr + 8);
            let p = parse(&short, 0).unwrap();
            let emb = embedded(&short, &p).unwrap().unwrap();
            assert_eq!(emb.len, hdr + 8);
            assert_eq!((emb.key.src_port, emb.key.dst_port), (4000, 53));
            for cut in [0, 10, hdr, hdr + 7] {
                let t = truncate(&e, cut);
                let p = parse(&t, 0).unwrap();
                assert_eq!(embedded(&t, &p), Err(DropReason::IcmpMalformed), "{cut}");
            }
        }
    }

    #[test]
    fn test_embedded_rejects_other_family() {
        // A v4 error quoting something with version 6 in the first nibble.
        let u = build::udp(
            ip("10.0.0.1"),
            ip("10.0.0.2"),
            1,
            2,
            &[0; 40],
            &IpOpts::default(),
        );
        let mut e = error_about(&u, ErrorKind::TimeExceeded);
        let p = parse(&e, 0).unwrap();
        e[p.l4_off + ICMP_HDR] = 0x65;
        assert_eq!(embedded(&e, &p), Err(DropReason::IcmpMalformed));
        let u = build::udp(
            ip("fd00::1"),
            ip("fd00::2"),
            1,
            2,
            &[0; 40],
            &IpOpts::default(),
        );
        let mut e = error_about(&u, ErrorKind::TimeExceeded);
        let p = parse(&e, 0).unwrap();
        e[p.l4_off + ICMP_HDR] = 0x45;
        assert_eq!(embedded(&e, &p), Err(DropReason::IcmpMalformed));
    }

    #[test]
    fn test_embedded_walks_v6_extension_headers() {
        // Quote: IPv6 + hop-by-hop (8) + destination options (16) + fragment (offset 0) + UDP.
        let u = build::udp(
            ip("fd00::1"),
            ip("fd00::2"),
            5353,
            53,
            b"x",
            &IpOpts::default(),
        );
        let mut q = u[14..54].to_vec();
        q[6] = ipv6_ext::HOP_BY_HOP;
        q.extend_from_slice(&[ipv6_ext::DEST_OPTS, 0, 1, 4, 0, 0, 0, 0]);
        q.extend_from_slice(&[
            ipv6_ext::FRAGMENT,
            1,
            1,
            12,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ]);
        q.extend_from_slice(&[proto::UDP, 0, 0, 1, 0, 0, 0, 9]);
        let chain = q.len();
        q.extend_from_slice(&u[54..]);
        let mut orig = u[..14].to_vec();
        orig.extend_from_slice(&q);
        let plen = (orig.len() - 54) as u16;
        orig[18..20].copy_from_slice(&plen.to_be_bytes());
        let e = error_about(&orig, ErrorKind::TooBig { mtu: 1280 });
        let p = parse(&e, 0).unwrap();
        let emb = embedded(&e, &p).unwrap().unwrap();
        assert_eq!(emb.l4_off - emb.l3_off, chain);
        assert_eq!(emb.key.proto, proto::UDP);
        assert_eq!((emb.key.src_port, emb.key.dst_port), (5353, 53));
        // A quoted later fragment has no transport header.
        let mut later = e.clone();
        later[emb.l3_off + 64 + 3] = 0x08; // fragment offset 1
        assert_eq!(embedded(&later, &p), Err(DropReason::IcmpMalformed));
    }
}
