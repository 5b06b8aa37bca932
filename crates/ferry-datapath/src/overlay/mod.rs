//! The VXLAN overlay (RFC 7348): encapsulation towards peer nodes, and the numbers that
//! follow from it (overhead, derived pod MTU, outer source port).
//!
//! An encapsulated frame is: outer Ethernet (uplink MAC -> underlay next hop), outer IPv4
//! (DF clear, TTL 64, as Linux's vxlan device sends by default; an underlay that fragments
//! it is fine: the receiver reassembles before decapsulating; so every datagram gets an
//! identification of its own, counted up by the sender, see [`Outer::id`]) or IPv6 (hop limit 64, flow
//! label from the inner flow), UDP (source port from the inner flow hash in 49152-65535,
//! destination 4789; checksum 0 over IPv4, computed over IPv6), the VXLAN header with the
//! VNI, then the inner Ethernet frame (VTEP MACs, see [`vtep_mac`]). The segments of one
//! GSO packet may leave together as a UDP GSO super-frame ([`encapsulate_run`]) for the
//! kernel or the NIC to cut into such datagrams (their UDP checksum then computed).

mod spec;

pub use spec::{ModeSpec, OverlaySpec, PeerSpec};

use std::net::{IpAddr, Ipv6Addr};

use crate::flow::{FlowKey, proto};
use crate::gso;
use crate::packet::VnetHdr;
use crate::wire::ethernet::ethertype;
use crate::wire::parse::{ETH_LEN, IPV6_LEN};
use crate::wire::{checksum, ethernet, ipv4, ipv6, vxlan};

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

/// The MTU of a pod port when the overlay encapsulates and the tables do not say: the
/// uplink MTU minus [`overhead`] (of IPv6 when the underlay is IPv6), so that
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
    /// IPv4 identification of the (first) outer datagram; those after it in a run of
    /// [`encapsulate_run`] count up from it, one per datagram. The sender keeps a counter
    /// (as Linux does per destination): datagrams that may be fragmented on the way need
    /// identifications that differ (RFC 6864), or a lost fragment of one makes the
    /// receiver's reassembly of the next, with the same identification, fail.
    pub id: u16,
}

/// Wraps the Ethernet frame `inner` in the outer headers `o`.
pub fn encapsulate(inner: &[u8], o: &Outer) -> Vec<u8> {
    encapsulate_one(&[inner][..], 0, o)
}

/// Frame `i` of `frames` as one plain VXLAN datagram.
fn encapsulate_one(frames: &(impl InnerFrames + ?Sized), i: usize, o: &Outer) -> Vec<u8> {
    let udp_len = 8 + vxlan::LEN + frames.frame_len(i);
    let mut v = Vec::with_capacity(ETH_LEN + ip_header_len(o) + udp_len);
    let udp = outer_headers(&mut v, o, udp_len, o.id.wrapping_add(i as u16));
    push_vxlan(&mut v, o);
    frames.write_frame(i, &mut v);
    finish_outer(&mut v, o, udp);
    if o.dst.is_ipv6() {
        // RFC 8200 requires the UDP checksum over IPv6; Linux's vxlan computes it too.
        let sum = checksum::add(&v[udp..], pseudo(o, udp_len));
        let mut c = checksum::finish(sum);
        if c == 0 {
            c = 0xffff;
        }
        v[udp + 6..udp + 8].copy_from_slice(&c.to_be_bytes());
    }
    v
}

/// Inner Ethernet frames to encapsulate, each written straight into its place in the
/// outer frame: frames held in buffers, or the segments of a GSO packet as
/// [`gso::Segmenter`] cuts them.
pub trait InnerFrames {
    /// How many frames.
    fn frame_count(&self) -> usize;
    /// Bytes of frame `i`.
    fn frame_len(&self, i: usize) -> usize;
    /// Appends frame `i` to `out`.
    fn write_frame(&self, i: usize, out: &mut Vec<u8>);
}

impl<T: AsRef<[u8]>> InnerFrames for [T] {
    fn frame_count(&self) -> usize {
        self.len()
    }
    fn frame_len(&self, i: usize) -> usize {
        self[i].as_ref().len()
    }
    fn write_frame(&self, i: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(self[i].as_ref());
    }
}

impl InnerFrames for gso::Segmenter<'_> {
    fn frame_count(&self) -> usize {
        self.count()
    }
    fn frame_len(&self, i: usize) -> usize {
        self.len(i)
    }
    fn write_frame(&self, i: usize, out: &mut Vec<u8>) {
        self.write(i, out);
    }
}

/// Largest IP packet an outer super-frame of [`encapsulate_run`] may be: the IPv4 total
/// length and the IPv6 payload length are 16-bit fields.
const MAX_SUPER_IP: usize = 65_535;
/// Most datagrams in one super-frame. Linux refuses a UDP GSO packet of more than
/// `UDP_MAX_SEGMENTS` segments (64 in older kernels, 128 in recent ones; small segments
/// of a 64 KiB packet can be more); 64 suits both, and a receiving ferry takes at most
/// [`gso::MAX_SEGMENTS_UDP`].
pub const MAX_RUN_DATAGRAMS: usize = 64;
const _: () = assert!(MAX_RUN_DATAGRAMS <= gso::MAX_SEGMENTS_UDP);

/// Encapsulates consecutive Ethernet frames of one inner flow, the segments of one GSO
/// packet cut to fit the tunnel, for an uplink that takes UDP segmentation offload: as
/// few outer frames as possible, each either one plain VXLAN datagram (as
/// [`encapsulate`] makes it) or a UDP GSO super-frame. A super-frame carries the outer
/// headers once and, back to back, VXLAN header + inner frame of several datagrams, all
/// but the last of the same length; its [`VnetHdr`] asks whoever transmits it (the
/// kernel, or the NIC) to cut the UDP payload at that length, which gives exactly the
/// datagrams [`encapsulate`] would have made, one per segment, with their outer IP
/// lengths, IPv4 identifications (counting up from [`Outer::id`], one per datagram of
/// the whole run, as the datagrams [`encapsulate`] would make) and UDP lengths and
/// checksums filled in. So the uplink takes one frame per run instead of one per
/// segment, and what reaches the wire is plain VXLAN. The outer UDP checksum of a
/// super-frame is left partial (computed per datagram by the segmentation) over IPv4 as
/// well as IPv6: a VXLAN receiver accepts a checksum over IPv4.
///
/// Appends `(frame, vnet)` pairs to `out`.
pub fn encapsulate_run(
    frames: &(impl InnerFrames + ?Sized),
    o: &Outer,
    out: &mut Vec<(Vec<u8>, VnetHdr)>,
) {
    let headers = ip_header_len(o) + 8;
    // The run being gathered: frames first..i, all of `size` bytes (VXLAN included)
    // but the last, which may be shorter.
    let mut first = 0;
    let mut bytes = headers;
    for i in 0..frames.frame_count() {
        let chunk = vxlan::LEN + frames.frame_len(i);
        if i > first {
            let size = vxlan::LEN + frames.frame_len(first);
            let last = vxlan::LEN + frames.frame_len(i - 1);
            // A longer frame, or any after a shorter one, starts a new run; so does a
            // full one.
            if last != size
                || chunk > size
                || bytes + chunk > MAX_SUPER_IP
                || i - first == MAX_RUN_DATAGRAMS
            {
                flush_run(frames, first..i, o, out);
                first = i;
                bytes = headers;
            }
        }
        bytes += chunk;
    }
    flush_run(frames, first..frames.frame_count(), o, out);
}

/// One frame for the run `frames[run]` of [`encapsulate_run`].
fn flush_run(
    frames: &(impl InnerFrames + ?Sized),
    run: std::ops::Range<usize>,
    o: &Outer,
    out: &mut Vec<(Vec<u8>, VnetHdr)>,
) {
    match run.len() {
        0 => {}
        1 => out.push((encapsulate_one(frames, run.start, o), VnetHdr::default())),
        _ => {
            let size = vxlan::LEN + frames.frame_len(run.start);
            let udp_len = 8 + run
                .clone()
                .map(|i| vxlan::LEN + frames.frame_len(i))
                .sum::<usize>();
            let mut v = Vec::with_capacity(ETH_LEN + ip_header_len(o) + udp_len);
            let udp = outer_headers(&mut v, o, udp_len, o.id.wrapping_add(run.start as u16));
            for i in run {
                push_vxlan(&mut v, o);
                frames.write_frame(i, &mut v);
            }
            finish_outer(&mut v, o, udp);
            // Partial: the pseudo-header sum alone, for the segmentation to complete.
            let partial = checksum::fold(pseudo(o, udp_len));
            v[udp + 6..udp + 8].copy_from_slice(&partial.to_be_bytes());
            let vnet = VnetHdr {
                flags: VnetHdr::F_NEEDS_CSUM,
                gso_type: VnetHdr::GSO_UDP_L4,
                hdr_len: (udp + 8) as u16,
                gso_size: size as u16,
                csum_start: udp as u16,
                csum_offset: 6,
            };
            out.push((v, vnet));
        }
    }
}

fn ip_header_len(o: &Outer) -> usize {
    if o.dst.is_ipv6() { IPV6_LEN } else { 20 }
}

/// The UDP pseudo-header sum of an outer datagram of `udp_len` bytes.
fn pseudo(o: &Outer, udp_len: usize) -> u64 {
    checksum::pseudo(o.src, o.dst, proto::UDP, udp_len)
}

/// Writes the outer Ethernet, IP and UDP headers (checksum 0) of a datagram with
/// `udp_len` bytes of UDP, IPv4 identification `id`; returns where the UDP header starts.
/// The ECN field is left to [`finish_outer`], which updates the IPv4 header checksum.
fn outer_headers(v: &mut Vec<u8>, o: &Outer, udp_len: usize, id: u16) -> usize {
    let etype = if o.dst.is_ipv6() {
        ethertype::IPV6
    } else {
        ethertype::IPV4
    };
    ethernet::Repr {
        dst: o.dst_mac,
        src: o.src_mac,
        tag: None,
        ethertype: etype,
    }
    .emit(v);
    match (o.src, o.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => ipv4::Repr {
            src: s,
            dst: d,
            protocol: proto::UDP,
            payload_len: udp_len,
            ttl: OUTER_TTL,
            tos: 0,
            id,
            dont_fragment: false,
        }
        .emit(v),
        (s, d) => ipv6::Repr {
            src: Ipv6Addr::from(crate::wire::parse::v6_octets(s)),
            dst: Ipv6Addr::from(crate::wire::parse::v6_octets(d)),
            next_header: proto::UDP,
            payload_len: udp_len,
            hop_limit: OUTER_TTL,
            traffic_class: 0,
            flow_label: o.hash,
        }
        .emit(v),
    }
    let udp = v.len();
    v.extend_from_slice(&source_port(o.hash).to_be_bytes());
    v.extend_from_slice(&o.port.to_be_bytes());
    v.extend_from_slice(&(udp_len as u16).to_be_bytes());
    v.extend_from_slice(&[0, 0]);
    udp
}

/// Completes the outer IP header of `v`, whose first inner frame (after the UDP header
/// at `udp` and the VXLAN header) is written: the ECN field copied from the inner packet
/// (RFC 6040 section 4.1, normal mode, as Linux's tunnels do: CE as ECT(0)), the IPv4
/// header checksum updated for it.
fn finish_outer(v: &mut [u8], o: &Outer, udp: usize) {
    let inner = &v[udp + 8 + vxlan::LEN..];
    let ecn = match inner_l3(inner).map_or(ecn::NOT_ECT, |l3| ecn_of(&inner[l3..])) {
        ecn::CE => ecn::ECT_0,
        e => e,
    };
    if o.dst.is_ipv6() {
        v[ETH_LEN + 1] |= ecn << 4;
    } else if ecn != ecn::NOT_ECT {
        // The emitter summed the header with TOS 0: updated for the new first word.
        let h = &mut v[ETH_LEN..ETH_LEN + 20];
        let old = u16::from_be_bytes([h[0], h[1]]);
        h[1] = ecn;
        let new = u16::from_be_bytes([h[0], h[1]]);
        let c = u16::from_be_bytes([h[10], h[11]]);
        h[10..12].copy_from_slice(&checksum::update16(c, old, new).to_be_bytes());
    }
}

/// ECN codepoints (RFC 3168): the low two bits of the IPv4 TOS and of the IPv6 traffic
/// class.
pub mod ecn {
    /// Not ECN-capable transport.
    pub const NOT_ECT: u8 = 0b00;
    /// ECN-capable transport (1).
    #[allow(
        dead_code,
        reason = "RFC 3168's fourth codepoint, named with the other three"
    )]
    pub const ECT_1: u8 = 0b01;
    /// ECN-capable transport (0).
    pub const ECT_0: u8 = 0b10;
    /// Congestion experienced.
    pub const CE: u8 = 0b11;
}

/// The ECN field of the IP header at the start of `ip`, by its version (Not-ECT for
/// anything else or a header too short).
pub fn ecn_of(ip: &[u8]) -> u8 {
    match (ip.first().map(|b| b >> 4), ip.get(1)) {
        (Some(4), Some(tos)) => tos & 0b11,
        (Some(6), Some(b)) => (b >> 4) & 0b11,
        _ => ecn::NOT_ECT,
    }
}

/// Sets the ECN field of the IP header at the start of `ip` to `e` (IPv4: the header
/// checksum updated). The header is whole (the caller parsed it).
pub fn set_ecn(ip: &mut [u8], e: u8) {
    match ip[0] >> 4 {
        4 => {
            ip[1] = (ip[1] & !0b11) | e;
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            checksum::set_ipv4_header(&mut ip[..ihl]);
        }
        6 => ip[1] = (ip[1] & !0b0011_0000) | (e << 4),
        _ => {}
    }
}

/// The ECN field of a decapsulated packet (RFC 6040 section 4.2, as Linux's
/// `INET_ECN_decapsulate`): an outer CE marks an ECN-capable inner packet CE, and drops
/// one that is not ECN-capable (`vxlan_ce_not_ect`); any other outer field changes
/// nothing. `outer` is the outer header's field; `ip` is the inner IP header onwards,
/// parsed whole.
pub fn decap_ecn(outer: u8, ip: &mut [u8]) -> Result<(), crate::drop::DropReason> {
    if outer != ecn::CE {
        return Ok(());
    }
    match ecn_of(ip) {
        ecn::NOT_ECT => Err(crate::drop::DropReason::VxlanCeNotEct),
        ecn::CE => Ok(()),
        _ => {
            set_ecn(ip, ecn::CE);
            Ok(())
        }
    }
}

/// Where the IP header of the Ethernet frame `f` starts, past up to two VLAN tags.
fn inner_l3(f: &[u8]) -> Option<usize> {
    let mut at = 12;
    for _ in 0..3 {
        let t = u16::from_be_bytes([*f.get(at)?, *f.get(at + 1)?]);
        if t == ethertype::VLAN || t == ethertype::QINQ {
            at += 4;
        } else {
            return Some(at + 2);
        }
    }
    None
}

fn push_vxlan(v: &mut Vec<u8>, o: &Outer) {
    let mut hdr = [0u8; vxlan::LEN];
    vxlan::Repr { vni: o.vni }.emit(&mut hdr);
    v.extend_from_slice(&hdr);
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
            id: 0,
        };
        let f = encapsulate(&inner, &o);
        let p = parse(&f, 0).unwrap();
        assert_eq!(p.key.dst_port, 4789);
        let l4 = &f[p.l4_off..p.ip_end];
        let sum = checksum::add(l4, checksum::pseudo(o.src, o.dst, 17, l4.len()));
        assert_eq!(checksum::fold(sum), 0xffff);
        assert_eq!(&f[p.l4_off + 16..], &inner[..]);
        assert_eq!(f.len() - inner.len(), 14 + 70 - 14);
    }

    fn outer(src: &str, dst: &str) -> Outer {
        Outer {
            src_mac: [2; 6],
            dst_mac: [4; 6],
            src: ip(src),
            dst: ip(dst),
            vni: 4096,
            port: 4789,
            hash: 0x1234,
            id: 0xfffe,
        }
    }

    /// Inner frames of `sizes` bytes of TCP payload each, as segmentation makes them.
    fn segments(sizes: &[usize]) -> Vec<Vec<u8>> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                build::tcp(
                    ip("10.244.1.5"),
                    ip("10.244.2.7"),
                    40000,
                    80,
                    1 + 1000 * i as u32,
                    1,
                    crate::wire::build::tcp_flags::ACK,
                    &build::pattern(n, i as u8),
                    &IpOpts::default(),
                )
            })
            .collect()
    }

    /// Cuts a super-frame as the kernel would, with ferry's own USO segmentation (which
    /// completes every UDP checksum and counts IPv4 identifications up).
    fn cut(frame: &[u8], vnet: VnetHdr) -> Vec<Vec<u8>> {
        let p = parse(frame, 0).unwrap();
        let mut pkt = crate::packet::Packet::new(frame.to_vec(), 0, 0);
        pkt.meta.vnet = vnet;
        let mut out = Vec::new();
        crate::gso::segment(&pkt, &p, 1500, &mut out).unwrap();
        out.into_iter().map(|p| p.data).collect()
    }

    fn udp_checksum_ok(f: &[u8]) -> bool {
        let p = parse(f, 0).unwrap();
        let l4 = &f[p.l4_off..p.ip_end];
        let pseudo = checksum::pseudo(p.key.src.ip(), p.key.dst.ip(), 17, l4.len());
        checksum::fold(checksum::add(l4, pseudo)) == 0xffff
    }

    #[test]
    fn test_encapsulate_run_is_one_super_frame_that_cuts_into_the_plain_datagrams() {
        for (src, dst) in [
            ("192.168.50.10", "192.168.50.20"),
            ("fd00:50::10", "fd00:50::20"),
        ] {
            let o = outer(src, dst);
            let segs = segments(&[1398, 1398, 1398, 700]);
            let mut out = Vec::new();
            encapsulate_run(&segs[..], &o, &mut out);
            assert_eq!(out.len(), 1, "{dst}: one super-frame");
            let (frame, vnet) = &out[0];
            assert_eq!(vnet.gso_type, VnetHdr::GSO_UDP_L4);
            assert!(vnet.needs_csum());
            assert_eq!(usize::from(vnet.gso_size), vxlan::LEN + segs[0].len());
            let p = parse(frame, 0).unwrap();
            assert_eq!(usize::from(vnet.csum_start), p.l4_off);
            assert_eq!(p.ip_end, frame.len());
            let datagrams = cut(frame, *vnet);
            assert_eq!(datagrams.len(), segs.len());
            for (i, (d, s)) in datagrams.iter().zip(&segs).enumerate() {
                let plain = encapsulate(s, &o);
                assert_eq!(d.len(), plain.len());
                assert!(udp_checksum_ok(d), "{dst}: the cut datagram's UDP checksum");
                let dp = parse(d, 0).unwrap();
                if dp.l3 == parse::L3::Ipv4 {
                    assert_eq!(ipv4_id(d), ipv4_id(&plain).wrapping_add(i as u16), "{dst}");
                }
                // All else as encapsulate() makes it: over IPv4 the identification
                // counts up and the UDP checksum is filled in.
                let mut d = d.clone();
                if dp.l3 == parse::L3::Ipv4 {
                    d[ETH_LEN + 4..ETH_LEN + 6].copy_from_slice(&plain[ETH_LEN + 4..ETH_LEN + 6]);
                    checksum::set_ipv4_header(&mut d[ETH_LEN..ETH_LEN + 20]);
                    d[dp.l4_off + 6..dp.l4_off + 8].copy_from_slice(&[0, 0]);
                }
                assert_eq!(d, plain, "{dst}");
            }
        }
    }

    #[test]
    fn test_encapsulate_run_splits_runs_by_size_and_length_limit() {
        let o = outer("192.168.50.10", "192.168.50.20");
        let mut out = Vec::new();
        // A lone segment is a plain datagram.
        let one = segments(&[100]);
        encapsulate_run(&one[..], &o, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0], (encapsulate(&one[0], &o), VnetHdr::default()));
        // A longer segment after shorter ones, and anything after a short one, start a
        // new run.
        out.clear();
        let segs = segments(&[500, 500, 300, 300, 900]);
        encapsulate_run(&segs[..], &o, &mut out);
        let shapes: Vec<(bool, usize)> = out
            .iter()
            .map(|(f, v)| (v.is_gso(), cut_or_one(f, *v)))
            .collect();
        assert_eq!(shapes, [(true, 3), (false, 1), (false, 1)]);
        // 45 segments of a 64 KiB packet do not fit one IP packet: two super-frames.
        out.clear();
        let segs = segments(&[1398; 47]);
        encapsulate_run(&segs[..], &o, &mut out);
        assert!(out.len() >= 2);
        let mut total = 0;
        for (f, v) in &out {
            let p = parse(f, 0).unwrap();
            assert!(p.ip_len() <= MAX_SUPER_IP);
            total += cut_or_one(f, *v);
        }
        assert_eq!(total, 47);
    }

    fn ipv4_id(f: &[u8]) -> u16 {
        u16::from_be_bytes([f[ETH_LEN + 4], f[ETH_LEN + 5]])
    }

    /// Small segments of a 64 KiB packet (a peer's MSS of 88 bytes, say) would be several
    /// hundred datagrams in one IP packet: a super-frame holds at most
    /// [`MAX_RUN_DATAGRAMS`], which Linux takes, and every datagram of the run has its own
    /// identification, counted on across frames (and through the wrap).
    #[test]
    fn test_encapsulate_run_caps_datagrams_per_super_frame_and_counts_identifications() {
        let o = outer("192.168.50.10", "192.168.50.20");
        assert_eq!(o.id, 0xfffe);
        let segs = segments(&[88; 300]);
        let mut out = Vec::new();
        encapsulate_run(&segs[..], &o, &mut out);
        let mut ids = Vec::new();
        for (f, v) in &out {
            let datagrams = if v.is_gso() {
                cut(f, *v)
            } else {
                vec![f.clone()]
            };
            assert!(datagrams.len() <= MAX_RUN_DATAGRAMS);
            assert_eq!(ipv4_id(f), ipv4_id(&datagrams[0]));
            ids.extend(datagrams.iter().map(|d| ipv4_id(d)));
        }
        let expect: Vec<u16> = (0..300u16).map(|i| o.id.wrapping_add(i)).collect();
        assert_eq!(ids, expect);
        assert_eq!(out.len(), 300usize.div_ceil(MAX_RUN_DATAGRAMS));
    }

    fn cut_or_one(f: &[u8], v: VnetHdr) -> usize {
        if v.is_gso() { cut(f, v).len() } else { 1 }
    }
}
