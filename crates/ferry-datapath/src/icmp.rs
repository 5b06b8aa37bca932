//! ICMP and ICMPv6 error messages: the one place that builds them, and the node-wide rate
//! limiter that keeps them from being an amplifier.
//!
//! [`build_error`] answers a frame with "fragmentation needed"/"packet too big", "time
//! exceeded" or "destination unreachable", or declines (returns `None`) where RFC 1122
//! section 3.2.2 and RFC 4443 section 2.4(e) forbid sending one. [`eligible`] makes the
//! same decision without building anything, so that a caller can ask it, then the
//! [`RateLimiter`], and only then pay for the frame. The limiter is a token bucket with
//! time passed in, like everything in the datapath.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::flow::proto;
use crate::wire::ethernet::ethertype;
use crate::wire::icmp::{self, v4, v6};
use crate::wire::parse::{ETH_LEN, IPV6_LEN, L3, Parsed};
use crate::wire::{checksum, ethernet, ipv4, ipv6};

/// Largest IPv4 ICMP error datagram (RFC 1812 section 4.3.2.3: at most 576 bytes).
pub const V4_ERROR_MAX: usize = 576;
/// Largest ICMPv6 error packet (RFC 4443 section 2.4(c): the IPv6 minimum MTU).
pub const V6_ERROR_MAX: usize = 1280;

/// IPv4 header length of a built error (no options).
const V4_HDR: usize = ipv4::HEADER_LEN;
/// ICMP/ICMPv6 header length: type, code, checksum and four type-specific bytes.
const ICMP_HDR: usize = icmp::HEADER_LEN;
/// TTL / hop limit of a built error.
const HOP_LIMIT: u8 = 64;
/// IPv4 TOS of a built error: precedence "internetwork control", as routers use.
const TOS_INTERNETWORK_CONTROL: u8 = 0xc0;

/// The ICMP error to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// IPv4 type 3 code 4 "fragmentation needed" with the next-hop MTU (clamped to 16
    /// bits) / ICMPv6 type 2 "packet too big" with the MTU.
    TooBig {
        /// The MTU of the link the packet did not fit.
        mtu: u32,
    },
    /// IPv4 type 11 code 0 / ICMPv6 type 3 code 0: TTL or hop limit exceeded in transit.
    TimeExceeded,
    /// IPv4 type 3 / ICMPv6 type 1 with a code (port unreachable: IPv4 code 3, IPv6 code 4).
    Unreachable {
        /// The ICMP code, which differs between the families.
        code: u8,
    },
}

/// True when an error of this `kind` from `src_ip` may be sent about `orig` (a frame,
/// parsed as `parsed`): exactly when [`build_error`] would build one. It reads a few
/// header bytes and allocates nothing, so it can come before the rate limiter.
///
/// False about an ICMP error (or a packet whose header chain is too incomplete to tell),
/// about a fragment that is not the first, about a packet to a multicast or broadcast
/// address (IP or link layer; for IPv6 "packet too big" is the exception RFC 4443 2.4(e)
/// makes), from a source that is not one host (unspecified, multicast, broadcast,
/// loopback, IPv4 class E), from a `src_ip` that is not unicast, for ARP, or when
/// `src_ip`'s family differs from the packet's. A subnet-directed IPv4 broadcast is not
/// recognised here: this layer does not know the subnets; callers that do must not ask.
pub fn eligible(orig: &[u8], parsed: &Parsed, kind: ErrorKind, src_ip: IpAddr) -> bool {
    if !parsed.is_ip()
        || parsed.is_later_fragment()
        || parsed.ip_end > orig.len()
        || parsed.l3_off >= parsed.ip_end
        || orig.len() < ETH_LEN
    {
        return false;
    }
    let l2_group = orig[0] & 1 != 0;
    match (parsed.key.src.ip(), parsed.key.dst.ip(), src_ip) {
        (IpAddr::V4(to), IpAddr::V4(orig_dst), IpAddr::V4(from)) => {
            !l2_group
                && single_host_v4(to)
                && single_host_v4(from)
                && !orig_dst.is_multicast()
                && !orig_dst.is_broadcast()
                && !is_icmp_error(orig, parsed)
        }
        (IpAddr::V6(to), IpAddr::V6(orig_dst), IpAddr::V6(from)) => {
            let too_big = matches!(kind, ErrorKind::TooBig { .. });
            single_host_v6(to)
                && single_host_v6(from)
                && (too_big || !(l2_group || orig_dst.is_multicast()))
                && parsed.chain_complete
                && !is_icmp_error(orig, parsed)
        }
        _ => false,
    }
}

/// Builds the Ethernet frame of an ICMP/ICMPv6 error about `orig` (a frame, parsed as
/// `parsed`), from `src_ip`/`src_mac` back to the original sender's IP and MAC. An 802.1Q
/// tag of the original is kept.
///
/// Returns `None` where no error may be sent, that is when [`eligible`] is false.
///
/// The error quotes as much of the original IP packet as keeps it within 576 bytes
/// (IPv4) or 1280 bytes (IPv6). Checksums are complete (ICMPv6's with the pseudo-header).
pub fn build_error(
    orig: &[u8],
    parsed: &Parsed,
    kind: ErrorKind,
    src_ip: IpAddr,
    src_mac: [u8; 6],
) -> Option<Vec<u8>> {
    if !eligible(orig, parsed, kind, src_ip) {
        return None;
    }
    let quoted = &orig[parsed.l3_off..parsed.ip_end];
    let (to, from) = (parsed.key.src.ip(), src_ip);
    let v6 = to.is_ipv6();
    let (ty, code, rest) = message(kind, v6);
    let (ip_hdr, max, etype) = if v6 {
        (IPV6_LEN, V6_ERROR_MAX, ethertype::IPV6)
    } else {
        (V4_HDR, V4_ERROR_MAX, ethertype::IPV4)
    };
    let quote = &quoted[..quoted.len().min(max - ip_hdr - ICMP_HDR)];
    let icmp_len = ICMP_HDR + quote.len();
    let mut f = Vec::with_capacity(parsed.l3_off + ip_hdr + icmp_len);
    ethernet::Repr::reply(orig, src_mac, etype).emit(&mut f);
    match (to, from) {
        (IpAddr::V4(to), IpAddr::V4(from)) => ipv4::Repr {
            src: from,
            dst: to,
            protocol: proto::ICMP,
            payload_len: icmp_len,
            ttl: HOP_LIMIT,
            tos: TOS_INTERNETWORK_CONTROL,
            // Identification 0 with DF: an atomic datagram (RFC 6864).
            id: 0,
            dont_fragment: true,
        }
        .emit(&mut f),
        (IpAddr::V6(to), IpAddr::V6(from)) => ipv6::Repr {
            src: from,
            dst: to,
            next_header: proto::ICMPV6,
            payload_len: icmp_len,
            hop_limit: HOP_LIMIT,
            traffic_class: 0,
            flow_label: 0,
        }
        .emit(&mut f),
        _ => return None,
    }
    let icmp_off = f.len();
    f.extend_from_slice(&[ty, code, 0, 0]);
    f.extend_from_slice(&rest);
    f.extend_from_slice(quote);
    // ICMPv6 sums a pseudo-header too; ICMP does not.
    let pseudo = if v6 {
        checksum::pseudo(from, to, proto::ICMPV6, icmp_len)
    } else {
        0
    };
    let c = checksum::finish(checksum::add(&f[icmp_off..], pseudo));
    f[icmp_off + 2..icmp_off + 4].copy_from_slice(&c.to_be_bytes());
    Some(f)
}

/// Type, code and the four type-specific bytes of the error `kind`, for ICMPv6 when `v6`.
fn message(kind: ErrorKind, v6: bool) -> (u8, u8, [u8; 4]) {
    match (kind, v6) {
        (ErrorKind::TooBig { mtu }, false) => {
            let m = (mtu.min(u32::from(u16::MAX)) as u16).to_be_bytes();
            (
                v4::DEST_UNREACHABLE,
                v4::CODE_FRAG_NEEDED,
                [0, 0, m[0], m[1]],
            )
        }
        (ErrorKind::TooBig { mtu }, true) => (v6::PACKET_TOO_BIG, 0, mtu.to_be_bytes()),
        (ErrorKind::TimeExceeded, false) => (v4::TIME_EXCEEDED, 0, [0; 4]),
        (ErrorKind::TimeExceeded, true) => (v6::TIME_EXCEEDED, 0, [0; 4]),
        (ErrorKind::Unreachable { code }, false) => (v4::DEST_UNREACHABLE, code, [0; 4]),
        (ErrorKind::Unreachable { code }, true) => (v6::DEST_UNREACHABLE, code, [0; 4]),
    }
}

/// True when the packet is an ICMP error message, or might be one (header unreadable).
fn is_icmp_error(orig: &[u8], p: &Parsed) -> bool {
    let icmp_proto = match p.l3 {
        L3::Ipv4 => proto::ICMP,
        _ => proto::ICMPV6,
    };
    if p.proto != icmp_proto {
        return false;
    }
    let Some(&ty) = orig.get(p.l4_off).filter(|_| p.l4_complete) else {
        return true;
    };
    icmp::is_error(icmp_proto, ty)
}

/// An IPv4 address that names one host (RFC 1122 section 3.2.2).
fn single_host_v4(a: Ipv4Addr) -> bool {
    !(a.is_unspecified()
        || a.is_broadcast()
        || a.is_multicast()
        || a.is_loopback()
        || a.octets()[0] >= 240)
}

/// An IPv6 address that names one node (RFC 4443 section 2.4(e.6)).
fn single_host_v6(a: Ipv6Addr) -> bool {
    !(a.is_unspecified() || a.is_multicast())
}

/// Token bucket for ICMP errors sent by the node, with time passed in.
///
/// The bucket starts full. It holds at most `burst` tokens and gains `per_second` tokens
/// per second; each allowed error takes one. The defaults, 1000 per second with a burst
/// of 50, are Linux's `net.ipv4.icmp_msgs_per_sec` and `net.ipv4.icmp_msgs_burst`.
#[derive(Clone, Debug)]
pub struct RateLimiter {
    per_second: u64,
    /// Capacity in nano-tokens (tokens * 1e9), so that refill is exact integer arithmetic.
    capacity: u64,
    /// Current fill in nano-tokens.
    level: u64,
    /// Time of the last refill; `None` until the first call.
    last_ns: Option<u64>,
    limited: u64,
}

/// Nano-tokens in one token.
const TOKEN: u64 = 1_000_000_000;

impl RateLimiter {
    /// Default refill rate (Linux `icmp_msgs_per_sec`).
    pub const DEFAULT_PER_SECOND: u32 = 1000;
    /// Default bucket size (Linux `icmp_msgs_burst`).
    pub const DEFAULT_BURST: u32 = 50;

    /// A full bucket of `burst` tokens refilled at `per_second` tokens per second.
    /// A zero burst refuses everything.
    pub fn new(per_second: u32, burst: u32) -> RateLimiter {
        let capacity = u64::from(burst) * TOKEN;
        RateLimiter {
            per_second: u64::from(per_second),
            capacity,
            level: capacity,
            last_ns: None,
            limited: 0,
        }
    }

    /// Takes a token at `now_ns` if there is one. Time that goes backwards adds nothing.
    pub fn allow(&mut self, now_ns: u64) -> bool {
        let last = self.last_ns.unwrap_or(now_ns);
        if now_ns > last {
            // elapsed ns * tokens/s = nano-tokens; saturate rather than overflow.
            let gained = (now_ns - last).saturating_mul(self.per_second);
            self.level = self.level.saturating_add(gained).min(self.capacity);
        }
        self.last_ns = Some(last.max(now_ns));
        if self.level >= TOKEN {
            self.level -= TOKEN;
            true
        } else {
            self.limited += 1;
            false
        }
    }

    /// Changes the rate and the bucket size, keeping the tokens in the bucket (at most
    /// the new size): a new limit does not grant a fresh burst.
    pub fn set_limits(&mut self, per_second: u32, burst: u32) {
        self.per_second = u64::from(per_second);
        self.capacity = u64::from(burst) * TOKEN;
        self.level = self.level.min(self.capacity);
    }

    /// The rate (tokens per second) and bucket size (tokens) in force.
    #[cfg(test)]
    pub(crate) fn limits(&self) -> (u32, u32) {
        (
            u32::try_from(self.per_second).unwrap_or(u32::MAX),
            u32::try_from(self.capacity / TOKEN).unwrap_or(u32::MAX),
        )
    }

    /// How many errors were refused.
    #[cfg(test)]
    pub(crate) fn limited(&self) -> u64 {
        self.limited
    }
}

impl Default for RateLimiter {
    /// 1000 per second, burst 50 (Linux's defaults).
    fn default() -> Self {
        RateLimiter::new(Self::DEFAULT_PER_SECOND, Self::DEFAULT_BURST)
    }
}

/// ICMP error rate limit (node-wide token bucket).
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct IcmpSpec {
    /// Errors per second (default 1000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_second: Option<u32>,
    /// Burst size (default 50).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
}

impl IcmpSpec {
    /// The error rate and burst asked for, defaults where nothing is said.
    pub fn limits(&self) -> (u32, u32) {
        (
            self.per_second.unwrap_or(RateLimiter::DEFAULT_PER_SECOND),
            self.burst.unwrap_or(RateLimiter::DEFAULT_BURST),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::build::{self, IpOpts};
    use crate::wire::parse::parse;

    const ME: [u8; 6] = [0x02, 0xfe, 0, 0, 0, 0x01];

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn udp(src: &str, dst: &str, len: usize) -> Vec<u8> {
        build::udp(
            ip(src),
            ip(dst),
            4000,
            53,
            &build::pattern(len, 3),
            &IpOpts::default(),
        )
    }

    fn err(orig: &[u8], kind: ErrorKind, from: &str) -> Option<Vec<u8>> {
        let p = parse(orig, 0).unwrap();
        build_error(orig, &p, kind, ip(from), ME)
    }

    /// Parses an error frame, checks its addresses, checksums and quote; returns
    /// (type, code, the four type-specific bytes).
    fn check(f: &[u8], orig: &[u8], from: &str) -> (u8, u8, [u8; 4]) {
        let p = parse(f, 0).expect("error parses");
        let po = parse(orig, 0).unwrap();
        assert_eq!(
            &f[..6],
            &orig[6..12],
            "sent back to the original sender's MAC"
        );
        assert_eq!(&f[6..12], &ME);
        assert_eq!(p.vlan, po.vlan);
        assert_eq!(p.key.src, ip(from));
        assert_eq!(p.key.dst, po.key.src);
        assert_eq!(p.ip_end, f.len());
        let icmp = &f[p.l4_off..];
        let sum = match p.l3 {
            L3::Ipv4 => {
                assert_eq!(p.proto, proto::ICMP);
                assert!(p.ip_len() <= V4_ERROR_MAX);
                checksum::add(icmp, 0)
            }
            _ => {
                assert_eq!(p.proto, proto::ICMPV6);
                assert!(p.ip_len() <= V6_ERROR_MAX);
                let (IpAddr::V6(s), IpAddr::V6(d)) = (p.key.src.ip(), p.key.dst.ip()) else {
                    unreachable!()
                };
                checksum::pseudo_v6(&s.octets(), &d.octets(), 58, icmp.len() as u32)
                    + checksum::add(icmp, 0)
            }
        };
        assert_eq!(checksum::finish(sum), 0, "ICMP checksum verifies");
        let quote = &icmp[8..];
        let orig_ip = &orig[po.l3_off..po.ip_end];
        assert!(!quote.is_empty());
        assert_eq!(quote, &orig_ip[..quote.len()], "quotes the original");
        (icmp[0], icmp[1], [icmp[4], icmp[5], icmp[6], icmp[7]])
    }

    #[test]
    fn test_v4_kinds() {
        let orig = udp("10.0.0.1", "10.0.0.2", 100);
        let f = err(&orig, ErrorKind::TooBig { mtu: 1450 }, "10.0.0.254").unwrap();
        assert_eq!(check(&f, &orig, "10.0.0.254"), (3, 4, [0, 0, 0x05, 0xaa]));
        assert_eq!(
            f.len(),
            14 + 20 + 8 + orig.len() - 14,
            "whole original quoted"
        );
        let f = err(&orig, ErrorKind::TimeExceeded, "10.0.0.254").unwrap();
        assert_eq!(check(&f, &orig, "10.0.0.254"), (11, 0, [0; 4]));
        let f = err(&orig, ErrorKind::Unreachable { code: 3 }, "10.0.0.2").unwrap();
        assert_eq!(check(&f, &orig, "10.0.0.2"), (3, 3, [0; 4]));
        // The MTU field has 16 bits.
        let f = err(&orig, ErrorKind::TooBig { mtu: 100_000 }, "10.0.0.254").unwrap();
        assert_eq!(check(&f, &orig, "10.0.0.254").2, [0, 0, 0xff, 0xff]);
    }

    #[test]
    fn test_v6_kinds() {
        let orig = udp("fd00::1", "fd00::2", 100);
        let f = err(&orig, ErrorKind::TooBig { mtu: 1400 }, "fd00::fe").unwrap();
        assert_eq!(check(&f, &orig, "fd00::fe"), (2, 0, 1400u32.to_be_bytes()));
        let f = err(&orig, ErrorKind::TimeExceeded, "fd00::fe").unwrap();
        assert_eq!(check(&f, &orig, "fd00::fe"), (3, 0, [0; 4]));
        let f = err(&orig, ErrorKind::Unreachable { code: 4 }, "fd00::2").unwrap();
        assert_eq!(check(&f, &orig, "fd00::2"), (1, 4, [0; 4]));
    }

    #[test]
    fn test_quote_is_capped_at_576_and_1280() {
        let orig = udp("10.0.0.1", "10.0.0.2", 1400);
        let f = err(&orig, ErrorKind::TooBig { mtu: 1000 }, "10.0.0.254").unwrap();
        check(&f, &orig, "10.0.0.254");
        assert_eq!(f.len() - 14, V4_ERROR_MAX);
        let orig = udp("fd00::1", "fd00::2", 1400);
        let f = err(&orig, ErrorKind::TooBig { mtu: 1280 }, "fd00::fe").unwrap();
        check(&f, &orig, "fd00::fe");
        assert_eq!(f.len() - 14, V6_ERROR_MAX);
    }

    #[test]
    fn test_vlan_tag_kept() {
        for (s, d, from) in [
            ("10.0.0.1", "10.0.0.2", "10.0.0.254"),
            ("fd00::1", "fd00::2", "fd00::fe"),
        ] {
            let plain = udp(s, d, 50);
            let mut orig = plain[..12].to_vec();
            orig.extend_from_slice(&[0x81, 0x00, 0x20, 0x07]);
            orig.extend_from_slice(&plain[12..]);
            let f = err(&orig, ErrorKind::TimeExceeded, from).unwrap();
            check(&f, &orig, from);
            assert_eq!(&f[12..16], &[0x81, 0x00, 0x20, 0x07]);
            assert_eq!(parse(&f, 0).unwrap().vlan, Some(0x2007));
        }
    }

    #[test]
    fn test_no_error_about_an_icmp_error() {
        let orig = udp("10.0.0.1", "10.0.0.2", 100);
        let e = err(&orig, ErrorKind::Unreachable { code: 3 }, "10.0.0.2").unwrap();
        assert_eq!(err(&e, ErrorKind::TimeExceeded, "10.0.0.254"), None);
        let orig = udp("fd00::1", "fd00::2", 100);
        let e = err(&orig, ErrorKind::Unreachable { code: 4 }, "fd00::2").unwrap();
        assert_eq!(err(&e, ErrorKind::TooBig { mtu: 1280 }, "fd00::fe"), None);
        // Queries (echo requests) do get errors.
        for (s, d, from) in [
            ("10.0.0.1", "10.0.0.2", "10.0.0.254"),
            ("fd00::1", "fd00::2", "fd00::fe"),
        ] {
            let echo = build::echo_request(ip(s), ip(d), 1, 1, b"ping", &IpOpts::default());
            let f = err(&echo, ErrorKind::TimeExceeded, from).unwrap();
            check(&f, &echo, from);
        }
    }

    #[test]
    fn test_no_error_about_a_later_fragment() {
        let mut orig = udp("10.0.0.1", "10.0.0.2", 100);
        orig[14 + 6..14 + 8].copy_from_slice(&185u16.to_be_bytes()); // offset 1480
        checksum::set_ipv4_header(&mut orig[14..34]);
        assert_eq!(err(&orig, ErrorKind::TimeExceeded, "10.0.0.254"), None);
        // The first fragment does get one.
        let mut first = udp("10.0.0.1", "10.0.0.2", 100);
        first[14 + 6] = 0x20; // more fragments, offset 0
        checksum::set_ipv4_header(&mut first[14..34]);
        assert!(err(&first, ErrorKind::TimeExceeded, "10.0.0.254").is_some());
    }

    #[test]
    fn test_no_error_to_or_from_group_addresses() {
        let t = ErrorKind::TimeExceeded;
        let r = "10.0.0.254";
        assert_eq!(err(&udp("10.0.0.1", "224.0.0.5", 10), t, r), None);
        assert_eq!(err(&udp("10.0.0.1", "255.255.255.255", 10), t, r), None);
        assert_eq!(err(&udp("0.0.0.0", "10.0.0.2", 10), t, r), None);
        assert_eq!(err(&udp("224.0.0.9", "10.0.0.2", 10), t, r), None);
        assert_eq!(err(&udp("255.255.255.255", "10.0.0.2", 10), t, r), None);
        assert_eq!(err(&udp("240.0.0.1", "10.0.0.2", 10), t, r), None);
        // Not from an address that is not one host either.
        assert_eq!(err(&udp("10.0.0.1", "10.0.0.2", 10), t, "0.0.0.0"), None);
        assert_eq!(err(&udp("10.0.0.1", "10.0.0.2", 10), t, "224.0.0.1"), None);
        // A link-layer broadcast.
        let mut bcast = udp("10.0.0.1", "10.0.0.2", 10);
        bcast[..6].copy_from_slice(&[0xff; 6]);
        assert_eq!(err(&bcast, t, r), None);

        let r6 = "fd00::fe";
        let mcast6 = udp("fd00::1", "ff02::1", 10);
        assert_eq!(err(&mcast6, t, r6), None);
        assert_eq!(err(&mcast6, ErrorKind::Unreachable { code: 4 }, r6), None);
        // RFC 4443 2.4(e.3): "packet too big" is sent even about multicast.
        let f = err(&mcast6, ErrorKind::TooBig { mtu: 1280 }, r6).unwrap();
        check(&f, &mcast6, r6);
        let mut l2mcast = udp("fd00::1", "fd00::2", 10);
        l2mcast[..6].copy_from_slice(&[0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(err(&l2mcast, t, r6), None);
        assert!(err(&l2mcast, ErrorKind::TooBig { mtu: 1280 }, r6).is_some());
        assert_eq!(err(&udp("::", "fd00::2", 10), t, r6), None);
        assert_eq!(
            err(
                &udp("ff02::1", "fd00::2", 10),
                ErrorKind::TooBig { mtu: 1280 },
                r6
            ),
            None
        );
        assert_eq!(err(&udp("fd00::1", "fd00::2", 10), t, "::"), None);
    }

    #[test]
    fn test_no_error_across_families_or_for_arp() {
        assert_eq!(
            err(
                &udp("10.0.0.1", "10.0.0.2", 10),
                ErrorKind::TimeExceeded,
                "fd00::fe"
            ),
            None
        );
        assert_eq!(
            err(
                &udp("fd00::1", "fd00::2", 10),
                ErrorKind::TimeExceeded,
                "10.0.0.254"
            ),
            None
        );
        let mut arp = vec![0xff; 6];
        arp.extend_from_slice(&build::MAC_SRC);
        arp.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
        arp.extend_from_slice(&build::MAC_SRC);
        arp.extend_from_slice(&[10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2]);
        assert_eq!(err(&arp, ErrorKind::TimeExceeded, "10.0.0.254"), None);
    }

    /// Frames that cover every reason `build_error` declines, and some it accepts.
    fn corpus() -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        for (s, d) in [
            ("10.0.0.1", "10.0.0.2"),
            ("10.0.0.1", "224.0.0.5"),
            ("10.0.0.1", "255.255.255.255"),
            ("0.0.0.0", "10.0.0.2"),
            ("127.0.0.1", "10.0.0.2"),
            ("240.0.0.1", "10.0.0.2"),
            ("fd00::1", "fd00::2"),
            ("fd00::1", "ff02::1"),
            ("::", "fd00::2"),
            ("ff02::1", "fd00::2"),
        ] {
            let u = udp(s, d, 20);
            let mut l2 = u.clone();
            l2[..6].copy_from_slice(&[0x33, 0x33, 0, 0, 0, 1]);
            v.push(u);
            v.push(l2);
        }
        for (s, d, from) in [
            ("10.0.0.1", "10.0.0.2", "10.0.0.254"),
            ("fd00::1", "fd00::2", "fd00::fe"),
        ] {
            let echo = build::echo_request(ip(s), ip(d), 1, 1, b"ping", &IpOpts::default());
            let e = err(&echo, ErrorKind::TimeExceeded, from).unwrap();
            v.push(echo);
            v.push(e);
        }
        let mut later = udp("10.0.0.1", "10.0.0.2", 100);
        later[14 + 6..14 + 8].copy_from_slice(&185u16.to_be_bytes());
        checksum::set_ipv4_header(&mut later[14..34]);
        v.push(later);
        let mut arp = vec![0xff; 6];
        arp.extend_from_slice(&build::MAC_SRC);
        arp.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
        arp.extend_from_slice(&build::MAC_SRC);
        arp.extend_from_slice(&[10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2]);
        v.push(arp);
        v
    }

    const KINDS: [ErrorKind; 3] = [
        ErrorKind::TooBig { mtu: 1280 },
        ErrorKind::TimeExceeded,
        ErrorKind::Unreachable { code: 3 },
    ];
    const FROM: [&str; 5] = ["10.0.0.254", "224.0.0.1", "fd00::fe", "::", "ff02::2"];

    #[test]
    fn test_eligible_agrees_with_build_error() {
        let (mut yes, mut no) = (0, 0);
        for f in corpus() {
            let p = parse(&f, 0).unwrap();
            for kind in KINDS {
                for from in FROM {
                    let built = build_error(&f, &p, kind, ip(from), ME).is_some();
                    assert_eq!(eligible(&f, &p, kind, ip(from)), built, "{kind:?} {from}");
                    if built { yes += 1 } else { no += 1 }
                }
            }
        }
        assert!(yes > 5 && no > 50, "the corpus exercises both answers");
    }

    proptest::proptest! {
        #[test]
        fn prop_eligible_agrees_with_build_error_on_mutated_frames(
            pick in 0usize..64,
            flips in proptest::collection::vec((0usize..120, proptest::prelude::any::<u8>()), 0..4),
            kind in 0usize..3,
            from in 0usize..5,
        ) {
            let frames = corpus();
            let mut f = frames[pick % frames.len()].clone();
            for (at, x) in flips {
                if let Some(b) = f.get_mut(at) {
                    *b ^= x;
                }
            }
            if let Ok(p) = parse(&f, 0) {
                let (kind, from) = (KINDS[kind], ip(FROM[from]));
                proptest::prop_assert_eq!(
                    eligible(&f, &p, kind, from),
                    build_error(&f, &p, kind, from, ME).is_some()
                );
            }
        }
    }

    #[test]
    fn test_rate_limiter_bursts_then_refills() {
        let mut rl = RateLimiter::default();
        let t0 = 5_000_000_000;
        for i in 0..50 {
            assert!(rl.allow(t0), "burst token {i}");
        }
        assert!(!rl.allow(t0));
        assert_eq!(rl.limited(), 1);
        // 1000/s: one token per millisecond, not before.
        assert!(!rl.allow(t0 + 999_999));
        assert!(rl.allow(t0 + 1_000_000));
        assert!(!rl.allow(t0 + 1_000_000));
        assert_eq!(rl.limited(), 3);
        // A long pause refills only up to the burst.
        let t1 = t0 + 3_600_000_000_000;
        for _ in 0..50 {
            assert!(rl.allow(t1));
        }
        assert!(!rl.allow(t1));
        // Time going backwards adds nothing.
        assert!(!rl.allow(t0));
        assert!(!rl.allow(t1));
        assert_eq!(rl.limited(), 6);
    }

    #[test]
    fn test_rate_limiter_rate_over_a_second() {
        let mut rl = RateLimiter::new(10, 2);
        let mut allowed = 0;
        // One attempt every millisecond for a second: the burst plus 10 refills.
        for ms in 0..1000u64 {
            allowed += u64::from(rl.allow(ms * 1_000_000));
        }
        assert_eq!(allowed, 2 + 9);
        assert_eq!(rl.limited(), 1000 - allowed);
        let mut none = RateLimiter::new(1000, 0);
        assert!(!none.allow(0));
        assert!(!none.allow(u64::MAX));
    }

    #[test]
    fn test_rate_limiter_new_limits_keep_the_tokens_left() {
        let mut rl = RateLimiter::new(1000, 10);
        for _ in 0..8 {
            assert!(rl.allow(0));
        }
        // Two tokens left: a bigger bucket does not refill them...
        rl.set_limits(10, 100);
        assert_eq!(rl.limits(), (10, 100));
        assert!(rl.allow(0) && rl.allow(0));
        assert!(!rl.allow(0));
        // ...and the new rate applies: 10/s is one token per 100 ms.
        assert!(!rl.allow(99_999_999));
        assert!(rl.allow(100_000_000));
        // A smaller bucket caps what is left.
        rl.set_limits(10, 1);
        assert!(rl.allow(10_000_000_000));
        assert!(!rl.allow(10_000_000_000));
    }
}
