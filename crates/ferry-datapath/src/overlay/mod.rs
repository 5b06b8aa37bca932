//! The VXLAN overlay (RFC 7348): encapsulation towards peer nodes, and the numbers that
//! follow from it (overhead, derived pod MTU, outer source port).
//!
//! An encapsulated frame is: outer Ethernet (uplink MAC -> underlay next hop), outer IPv4
//! (DF clear, TTL 64, as Linux's vxlan device sends by default; an underlay that fragments
//! it is fine: the receiver reassembles before decapsulating) or IPv6 (hop limit 64, flow
//! label from the inner flow), UDP (source port from the inner flow hash in 49152-65535,
//! destination 4789; checksum 0 over IPv4, computed over IPv6), the VXLAN header with the
//! VNI, then the inner Ethernet frame (VTEP MACs, see [`vtep_mac`]).

use std::net::IpAddr;

use crate::flow::{FlowKey, proto};
use crate::wire::checksum;
use crate::wire::parse::{ETH_LEN, IPV6_LEN, ethertype};
use crate::wire::vxlan;

/// Default VNI: Calico's, so that a ferry node and a Calico VXLAN node agree unconfigured.
pub const DEFAULT_VNI: u32 = 4096;
/// Default UDP port (IANA).
pub const DEFAULT_PORT: u16 = vxlan::PORT;
/// Largest VNI (24 bits).
pub const MAX_VNI: u32 = (1 << 24) - 1;
/// Outer IPv4 + UDP + VXLAN bytes in front of the inner frame (Ethernet not counted).
const OUTER_V4: usize = 20 + 8 + vxlan::LEN;
/// Outer IPv6 + UDP + VXLAN bytes in front of the inner frame.
const OUTER_V6: usize = IPV6_LEN + 8 + vxlan::LEN;
/// Outer TTL / hop limit.
const OUTER_TTL: u8 = 64;
/// Lowest outer UDP source port (RFC 7348 recommends the dynamic range).
pub const SRC_PORT_MIN: u16 = 49152;

/// When traffic to another node's pods is encapsulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Always.
    Always,
    /// Only when the peer is not in the uplink's own subnet; else routed directly.
    CrossSubnet,
    /// Never: pod CIDRs are routed by the underlay.
    Never,
}

/// Bytes an IP packet grows by when encapsulated: outer IP, UDP, VXLAN and the inner
/// Ethernet header. 50 over an IPv4 underlay, 70 over IPv6.
pub fn overhead(underlay_v6: bool) -> u16 {
    let outer = if underlay_v6 { OUTER_V6 } else { OUTER_V4 };
    (outer + ETH_LEN) as u16
}

/// The MTU of a pod port when the overlay is configured and the tables do not say: the
/// uplink MTU minus [`overhead`] (of IPv6 when any peer is reached over IPv6), so that
/// a full-size pod packet still fits the uplink once encapsulated. 1450 for a 1500-byte
/// IPv4 underlay, as Linux's vxlan devices and Calico use.
pub fn pod_mtu(uplink_mtu: u16, underlay_v6: bool) -> u16 {
    uplink_mtu.saturating_sub(overhead(underlay_v6))
}

/// The largest inner IP packet (with `inner_l2` bytes of inner link-layer header) that
/// fits an uplink MTU once encapsulated over the given underlay family.
pub fn inner_mtu(uplink_mtu: u16, underlay_v6: bool, inner_l2: usize) -> usize {
    let outer = if underlay_v6 { OUTER_V6 } else { OUTER_V4 };
    usize::from(uplink_mtu).saturating_sub(outer + inner_l2)
}

/// The VTEP MAC a node uses on inner frames when the tables do not give one: 0e:fe
/// followed by the last four bytes of its underlay address. ferry ignores inner MACs on
/// decapsulation; a Linux vxlan peer needs its device's real MAC in the tables.
pub fn vtep_mac(addr: IpAddr) -> [u8; 6] {
    let o = crate::wire::parse::v6_octets(addr);
    [0x0e, 0xfe, o[12], o[13], o[14], o[15]]
}

/// A hash of a flow, the same for every packet of it and on every run (replays are
/// reproducible): FNV-1a over the key's fields. It only spreads flows over underlay
/// paths, so it need not resist collisions.
pub fn flow_hash(key: &FlowKey) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    let mut eat = |b: &[u8]| {
        for x in b {
            h ^= u32::from(*x);
            h = h.wrapping_mul(0x0100_0193);
        }
    };
    eat(&crate::wire::parse::v6_octets(key.src));
    eat(&crate::wire::parse::v6_octets(key.dst));
    eat(&[key.proto]);
    eat(&key.src_port.to_be_bytes());
    eat(&key.dst_port.to_be_bytes());
    h ^ (h >> 16)
}

/// The outer UDP source port for a flow hash: in 49152-65535.
pub fn source_port(hash: u32) -> u16 {
    SRC_PORT_MIN + (hash % 16384) as u16
}

/// Everything about the outer headers of one encapsulated frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outer {
    /// Outer Ethernet source (the uplink).
    pub src_mac: [u8; 6],
    /// Outer Ethernet destination (underlay next hop).
    pub dst_mac: [u8; 6],
    /// This node's underlay address.
    pub src: IpAddr,
    /// The peer node's underlay address (same family).
    pub dst: IpAddr,
    /// VXLAN network identifier.
    pub vni: u32,
    /// UDP destination port.
    pub port: u16,
    /// The inner flow's hash: UDP source port and IPv6 flow label.
    pub hash: u32,
}

/// Wraps the Ethernet frame `inner` in the outer headers `o`.
pub fn encapsulate(inner: &[u8], o: &Outer) -> Vec<u8> {
    let v6 = o.dst.is_ipv6();
    let ip_hdr = if v6 { IPV6_LEN } else { 20 };
    let udp_len = 8 + vxlan::LEN + inner.len();
    let mut v = Vec::with_capacity(ETH_LEN + ip_hdr + udp_len);
    let etype = if v6 { ethertype::IPV6 } else { ethertype::IPV4 };
    crate::neigh::eth_header(&mut v, o.dst_mac, o.src_mac, None, etype);
    match (o.src, o.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let total = (20 + udp_len) as u16;
            v.extend_from_slice(&[0x45, 0]);
            v.extend_from_slice(&total.to_be_bytes());
            // Identification from the flow hash; DF clear, no fragment offset.
            v.extend_from_slice(&(o.hash as u16).to_be_bytes());
            v.extend_from_slice(&[0, 0, OUTER_TTL, proto::UDP, 0, 0]);
            v.extend_from_slice(&s.octets());
            v.extend_from_slice(&d.octets());
            checksum::set_ipv4_header(&mut v[ETH_LEN..ETH_LEN + 20]);
        }
        (s, d) => {
            let label = o.hash & 0x000f_ffff;
            v.extend_from_slice(&(0x6000_0000 | label).to_be_bytes());
            v.extend_from_slice(&(udp_len as u16).to_be_bytes());
            v.extend_from_slice(&[proto::UDP, OUTER_TTL]);
            v.extend_from_slice(&crate::wire::parse::v6_octets(s));
            v.extend_from_slice(&crate::wire::parse::v6_octets(d));
        }
    }
    let udp = v.len();
    v.extend_from_slice(&source_port(o.hash).to_be_bytes());
    v.extend_from_slice(&o.port.to_be_bytes());
    v.extend_from_slice(&(udp_len as u16).to_be_bytes());
    v.extend_from_slice(&[0, 0]);
    let mut hdr = [0u8; vxlan::LEN];
    vxlan::Repr { vni: o.vni }.emit(&mut hdr);
    v.extend_from_slice(&hdr);
    v.extend_from_slice(inner);
    if v6 {
        // RFC 8200 requires the UDP checksum over IPv6; Linux's vxlan computes it too.
        let sum = checksum::add(
            &v[udp..],
            checksum::pseudo_v6(
                &crate::wire::parse::v6_octets(o.src),
                &crate::wire::parse::v6_octets(o.dst),
                proto::UDP,
                udp_len as u32,
            ),
        );
        let mut c = checksum::finish(sum);
        if c == 0 {
            c = 0xffff;
        }
        v[udp + 6..udp + 8].copy_from_slice(&c.to_be_bytes());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::build::{self, IpOpts};
    use crate::wire::parse;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn test_overhead_and_derived_mtu() {
        assert_eq!(overhead(false), 50);
        assert_eq!(overhead(true), 70);
        assert_eq!(pod_mtu(1500, false), 1450);
        assert_eq!(pod_mtu(9000, true), 8930);
        assert_eq!(inner_mtu(1500, false, 14), 1450);
    }

    #[test]
    fn test_source_port_in_dynamic_range() {
        for h in [0, 1, 16383, 16384, u32::MAX] {
            assert!(source_port(h) >= SRC_PORT_MIN);
        }
    }

    #[test]
    fn test_encapsulate_v6_underlay_has_valid_udp_checksum() {
        let inner = build::udp(
            ip("10.244.1.5"),
            ip("10.244.2.7"),
            1,
            2,
            b"hello",
            &IpOpts::default(),
        );
        let o = Outer {
            src_mac: [2; 6],
            dst_mac: [4; 6],
            src: ip("fd00:50::10"),
            dst: ip("fd00:50::20"),
            vni: 4096,
            port: 4789,
            hash: 0xabcdef,
        };
        let f = encapsulate(&inner, &o);
        let p = parse(&f, 0).unwrap();
        assert_eq!(p.key.dst_port, 4789);
        let l4 = &f[p.l4_off..p.ip_end];
        let sum = checksum::add(
            l4,
            checksum::pseudo_v6(
                &parse::v6_octets(o.src),
                &parse::v6_octets(o.dst),
                17,
                l4.len() as u32,
            ),
        );
        assert_eq!(checksum::fold(sum), 0xffff);
        assert_eq!(&f[p.l4_off + 16..], &inner[..]);
        assert_eq!(f.len() - inner.len(), 14 + 70 - 14);
    }
}
