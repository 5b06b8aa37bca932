use std::net::IpAddr;

use proptest::prelude::*;

use super::*;
use crate::wire::build::{self, IpOpts};
use crate::wire::checksum::{add, finish, pseudo, pseudo_v6};
use crate::wire::parse::{self, v6_octets};

const SEQ0: u32 = 0xffff_f000; // close to wrapping, so the wrap is exercised
const ID0: u16 = 0xfffe;

fn addrs(v6: bool) -> (IpAddr, IpAddr) {
    if v6 {
        ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap())
    } else {
        ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap())
    }
}

fn opts() -> IpOpts {
    IpOpts {
        id: ID0,
        dont_fragment: true,
        ..IpOpts::default()
    }
}

/// A TCP super-packet with a garbage checksum and a GSO request.
fn tcp_super(v6: bool, payload: &[u8], flags: u8, gso_size: u16) -> Packet {
    let (s, d) = addrs(v6);
    let mut f = build::tcp(s, d, 40000, 80, SEQ0, 77, flags, payload, &opts());
    let p = parse::parse(&f, 0).unwrap();
    f[p.l4_off + 16] = 0xde;
    f[p.l4_off + 17] = 0xad;
    gso(
        f,
        if v6 {
            VnetHdr::GSO_TCPV6
        } else {
            VnetHdr::GSO_TCPV4
        },
        gso_size,
    )
}

fn udp_super(v6: bool, payload: &[u8], gso_size: u16) -> Packet {
    let (s, d) = addrs(v6);
    let mut f = build::udp(s, d, 5000, 6000, payload, &opts());
    let p = parse::parse(&f, 0).unwrap();
    f[p.l4_off + 6] = 0x12;
    f[p.l4_off + 7] = 0x34;
    gso(f, VnetHdr::GSO_UDP_L4, gso_size)
}

fn gso(data: Vec<u8>, gso_type: u8, gso_size: u16) -> Packet {
    let mut pkt = Packet::new(data, 3, 1234);
    pkt.meta.zone = 9;
    pkt.meta.vnet = VnetHdr {
        flags: VnetHdr::F_NEEDS_CSUM,
        gso_type,
        hdr_len: 54,
        gso_size,
        csum_start: 34,
        csum_offset: 16,
    };
    pkt
}

/// Fixes the IP length fields (and IPv4 header checksum) after the test edited a frame.
fn fix_ip_lengths(f: &mut [u8], l3_off: usize, v6: bool) {
    let ip_len = f.len() - l3_off;
    if v6 {
        f[l3_off + 4..l3_off + 6].copy_from_slice(&((ip_len - 40) as u16).to_be_bytes());
    } else {
        f[l3_off + 2..l3_off + 4].copy_from_slice(&(ip_len as u16).to_be_bytes());
        let ihl = usize::from(f[l3_off] & 0xf) * 4;
        checksum::set_ipv4_header(&mut f[l3_off..l3_off + ihl]);
    }
}

fn run(pkt: &Packet, max_ip_len: usize) -> Result<Vec<Packet>, DropReason> {
    let p = parse::parse(&pkt.data, pkt.meta.zone).unwrap();
    let mut out = Vec::new();
    segment(pkt, &p, max_ip_len, &mut out).map(|()| out)
}

/// Parses a segment and checks every checksum in it; returns the parse and its payload.
fn verify(seg: &Packet) -> (Parsed, Vec<u8>) {
    assert_eq!(
        seg.meta.vnet,
        VnetHdr::default(),
        "segments are plain packets"
    );
    let p = parse::parse(&seg.data, seg.meta.zone).expect("segment parses");
    assert_eq!(p.ip_end, seg.data.len(), "no bytes past the IP packet");
    let l4 = &seg.data[p.l4_off..p.ip_end];
    let pseudo = pseudo(p.key.src.ip(), p.key.dst.ip(), p.proto, l4.len());
    assert_eq!(finish(add(l4, pseudo)), 0, "transport checksum verifies");
    let hdr = match p.proto {
        proto::TCP => usize::from(l4[12] >> 4) * 4,
        _ => {
            assert_eq!(usize::from(u16::from_be_bytes([l4[4], l4[5]])), l4.len());
            assert_ne!(
                u16::from_be_bytes([l4[6], l4[7]]),
                0,
                "UDP checksum present"
            );
            8
        }
    };
    (p, l4[hdr..].to_vec())
}

fn seq(seg: &Packet, p: &Parsed) -> u32 {
    let t = &seg.data[p.l4_off..];
    u32::from_be_bytes([t[4], t[5], t[6], t[7]])
}

fn v4_id(seg: &Packet, p: &Parsed) -> u16 {
    u16::from_be_bytes([seg.data[p.l3_off + 4], seg.data[p.l3_off + 5]])
}

fn check_tcp_segments(v6: bool) {
    let payload = build::pattern(10_000, 7);
    let pkt = tcp_super(v6, &payload, tcp_flags::ACK | tcp_flags::PSH, 1448);
    let max = if v6 { 1508 } else { 1488 }; // exactly one full segment
    let segs = run(&pkt, max).unwrap();
    assert_eq!(segs.len(), 10_000usize.div_ceil(1448));
    let mut joined = Vec::new();
    for (i, s) in segs.iter().enumerate() {
        let (p, data) = verify(s);
        assert_eq!(s.meta.in_port, 3);
        assert_eq!(s.meta.zone, 9);
        assert_eq!(s.meta.time_ns, 1234);
        assert!(p.ip_len() <= max);
        assert_eq!(seq(s, &p), SEQ0.wrapping_add((i * 1448) as u32));
        assert_eq!(data.len(), if i == 6 { 10_000 - 6 * 1448 } else { 1448 });
        if v6 {
            assert_eq!(p.ip_len(), 40 + 20 + data.len());
        } else {
            assert_eq!(p.ip_len(), 20 + 20 + data.len());
            assert_eq!(v4_id(s, &p), ID0.wrapping_add(i as u16));
            assert!(p.dont_fragment, "DF copied");
        }
        assert_eq!(p.key.src_port, 40000);
        assert_eq!(p.ttl, 64);
        joined.extend_from_slice(&data);
    }
    assert_eq!(joined, payload);
}

#[test]
fn test_tcp_v4_seq_ids_lengths_and_checksums() {
    check_tcp_segments(false);
}

#[test]
fn test_tcp_v6_seq_lengths_and_checksums() {
    check_tcp_segments(true);
}

#[test]
fn test_cwr_first_fin_psh_last_others_copied() {
    let all = tcp_flags::ACK
        | tcp_flags::PSH
        | tcp_flags::FIN
        | tcp_flags::CWR
        | tcp_flags::ECE
        | tcp_flags::URG;
    for v6 in [false, true] {
        let mut pkt = tcp_super(v6, &build::pattern(4000, 1), all, 1000);
        pkt.meta.vnet.gso_type |= VnetHdr::GSO_ECN;
        let segs = run(&pkt, 1500).unwrap();
        assert_eq!(segs.len(), 4);
        for (i, s) in segs.iter().enumerate() {
            let (p, _) = verify(s);
            let mut want = tcp_flags::ACK | tcp_flags::ECE | tcp_flags::URG;
            if i == 0 {
                want |= tcp_flags::CWR;
            }
            if i == 3 {
                want |= tcp_flags::FIN | tcp_flags::PSH;
            }
            assert_eq!(p.tcp_flags, want, "segment {i} v6={v6}");
            // The urgent pointer and the ack number are copied unchanged.
            let t = &s.data[p.l4_off..];
            assert_eq!(u32::from_be_bytes([t[8], t[9], t[10], t[11]]), 77);
        }
    }
}

#[test]
fn test_ecn_bit_accepted_with_tcp() {
    let mut pkt = tcp_super(false, &build::pattern(3000, 2), tcp_flags::ACK, 1448);
    pkt.meta.vnet.gso_type = VnetHdr::GSO_TCPV4 | VnetHdr::GSO_ECN;
    assert_eq!(run(&pkt, 1500).unwrap().len(), 3);
}

#[test]
fn test_mtu_smaller_than_gso_size_limits_payload() {
    for v6 in [false, true] {
        let pkt = tcp_super(v6, &build::pattern(5000, 3), tcp_flags::ACK, 1448);
        let segs = run(&pkt, 1000).unwrap();
        let hdr = if v6 { 60 } else { 40 };
        let mss = 1000 - hdr;
        assert_eq!(segs.len(), 5000usize.div_ceil(mss));
        for s in &segs[..segs.len() - 1] {
            let (p, data) = verify(s);
            assert_eq!(p.ip_len(), 1000);
            assert_eq!(data.len(), mss);
        }
    }
}

#[test]
fn test_small_packet_is_one_plain_packet() {
    for v6 in [false, true] {
        for len in [0, 1, 1440] {
            let payload = build::pattern(len, 4);
            let pkt = tcp_super(v6, &payload, tcp_flags::ACK | tcp_flags::FIN, 1448);
            let segs = run(&pkt, 1500).unwrap();
            assert_eq!(segs.len(), 1);
            let (p, data) = verify(&segs[0]);
            assert_eq!(data, payload);
            assert_eq!(p.tcp_flags, tcp_flags::ACK | tcp_flags::FIN);
            if !v6 {
                assert_eq!(v4_id(&segs[0], &p), ID0);
            }
        }
    }
}

#[test]
fn test_tcp_options_copied_into_every_segment() {
    let mut pkt = tcp_super(false, &build::pattern(3000, 5), tcp_flags::ACK, 1400);
    // Insert NOP, NOP, timestamps (12 bytes) after the 20-byte TCP header.
    let opts = [1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];
    let at = 14 + 20 + 20;
    pkt.data.splice(at..at, opts);
    pkt.data[14 + 20 + 12] = (32 / 4) << 4;
    fix_ip_lengths(&mut pkt.data, 14, false);
    let segs = run(&pkt, 1500).unwrap();
    assert_eq!(segs.len(), 3);
    let mut joined = Vec::new();
    for s in &segs {
        let (p, data) = verify(s);
        assert_eq!(&s.data[p.l4_off + 20..p.l4_off + 32], &opts);
        joined.extend(data);
    }
    assert_eq!(joined, build::pattern(3000, 5));
}

#[test]
fn test_ipv4_options_and_vlan_tag_kept() {
    let mut pkt = tcp_super(false, &build::pattern(3000, 6), tcp_flags::ACK, 1448);
    // An 802.1Q tag (VLAN 100) and a 4-byte IPv4 option (NOP x3, EOL).
    pkt.data.splice(12..12, [0x81, 0x00, 0x00, 0x64]);
    pkt.data.splice(18 + 20..18 + 20, [1, 1, 1, 0]);
    pkt.data[18] = 0x46;
    fix_ip_lengths(&mut pkt.data, 18, false);
    let segs = run(&pkt, 1500).unwrap();
    assert_eq!(segs.len(), 3);
    for s in &segs {
        let (p, data) = verify(s);
        assert_eq!(p.vlan, Some(100));
        assert_eq!(p.l4_off, 18 + 24);
        assert!(p.ip_len() <= 1500);
        assert!(data.len() <= 1500 - 44);
        assert_eq!(&s.data[18 + 20..18 + 24], &[1, 1, 1, 0]);
    }
}

#[test]
fn test_ipv6_extension_headers_kept() {
    let mut pkt = tcp_super(true, &build::pattern(4000, 8), tcp_flags::ACK, 1448);
    // Destination options header (8 bytes, PadN) between IPv6 and TCP.
    pkt.data[14 + 6] = 60;
    pkt.data
        .splice(14 + 40..14 + 40, [proto::TCP, 0, 1, 4, 0, 0, 0, 0]);
    fix_ip_lengths(&mut pkt.data, 14, true);
    let segs = run(&pkt, 1500).unwrap();
    let mut joined = Vec::new();
    for s in &segs {
        let (p, data) = verify(s);
        assert_eq!(p.l4_off, 14 + 48);
        assert_eq!(s.data[14 + 6], 60);
        assert!(p.ip_len() <= 1500);
        joined.extend(data);
    }
    assert_eq!(joined, build::pattern(4000, 8));
}

/// Inserts a routing header (type, segments left, addresses) between IPv6 and TCP/UDP.
fn with_routing(pkt: &mut Packet, kind: u8, segments_left: u8, addrs: &[[u8; 16]]) {
    let upper = pkt.data[14 + 6];
    pkt.data[14 + 6] = 43;
    let mut rh = vec![
        upper,
        (addrs.len() * 2) as u8,
        kind,
        segments_left,
        0,
        0,
        0,
        0,
    ];
    if kind == 4 {
        rh[4] = (addrs.len() - 1) as u8; // last entry
    }
    for a in addrs {
        rh.extend_from_slice(a);
    }
    pkt.data.splice(14 + 40..14 + 40, rh);
    fix_ip_lengths(&mut pkt.data, 14, true);
}

/// Checks a segment's transport checksum against the pseudo-header with `dst`.
fn checksum_verifies_with(seg: &Packet, dst: [u8; 16]) -> bool {
    let p = parse::parse(&seg.data, 0).unwrap();
    let l4 = &seg.data[p.l4_off..p.ip_end];
    let pseudo = pseudo_v6(&v6_octets(p.key.src), &dst, p.proto, l4.len() as u32);
    finish(add(l4, pseudo)) == 0
}

#[test]
fn test_ipv6_routing_header_checksum_uses_the_final_destination() {
    let via = v6_octets("fd00::99".parse::<IpAddr>().unwrap());
    let last = v6_octets("fd00::2".parse::<IpAddr>().unwrap());
    let final_dst = v6_octets("fd00::77".parse::<IpAddr>().unwrap());
    for udp in [false, true] {
        let make = || {
            let payload = build::pattern(3000, 11);
            if udp {
                udp_super(true, &payload, 1200)
            } else {
                tcp_super(true, &payload, tcp_flags::ACK, 1200)
            }
        };
        // SRH on its way: the header holds the active segment, the final one is [0].
        let mut pkt = make();
        with_routing(&mut pkt, 4, 1, &[final_dst, last]);
        let segs = run(&pkt, 1500).unwrap();
        assert_eq!(segs.len(), 3);
        for s in &segs {
            assert!(checksum_verifies_with(s, final_dst), "udp={udp}");
            assert!(!checksum_verifies_with(s, last));
        }
        // Mobile IPv6 type 2: the home address.
        let mut pkt = make();
        with_routing(&mut pkt, 2, 1, &[final_dst]);
        for s in &run(&pkt, 1500).unwrap() {
            assert!(checksum_verifies_with(s, final_dst));
        }
        // No segments left: the IPv6 header's destination is the final one.
        let mut pkt = make();
        with_routing(&mut pkt, 4, 0, &[via]);
        for s in &run(&pkt, 1500).unwrap() {
            assert!(checksum_verifies_with(s, last));
        }
        // Compressed RPL addresses (type 3) and the deprecated type 0 are refused, not
        // guessed at; so is a type 2 header with more than one address.
        for (kind, addrs) in [
            (3, vec![via]),
            (0, vec![via, final_dst]),
            (2, vec![via, via]),
        ] {
            let mut pkt = make();
            with_routing(&mut pkt, kind, 1, &addrs);
            assert_eq!(run(&pkt, 1500), Err(DropReason::GsoMalformed));
            let mut pkt = make();
            with_routing(&mut pkt, kind, 0, &addrs);
            assert!(run(&pkt, 1500).is_ok(), "segments left 0 needs no address");
        }
    }
}

#[test]
fn test_uso_splits_into_datagrams() {
    for v6 in [false, true] {
        let payload = build::pattern(3500, 9);
        let pkt = udp_super(v6, &payload, 1200);
        let segs = run(&pkt, 1500).unwrap();
        assert_eq!(segs.len(), 3);
        let mut joined = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            let (p, data) = verify(s);
            assert_eq!(p.proto, proto::UDP);
            assert_eq!((p.key.src_port, p.key.dst_port), (5000, 6000));
            assert_eq!(data.len(), if i == 2 { 1100 } else { 1200 });
            if !v6 {
                assert_eq!(v4_id(s, &p), ID0.wrapping_add(i as u16));
            }
            joined.extend(data);
        }
        assert_eq!(joined, payload);
    }
}

#[test]
fn test_uso_cuts_at_gso_size_even_past_the_mtu() {
    for v6 in [false, true] {
        let payload = build::pattern(4 * 1400, 10);
        let pkt = udp_super(v6, &payload, 1400);
        let segs = run(&pkt, 1280).unwrap();
        assert_eq!(segs.len(), 4);
        let mut joined = Vec::new();
        for s in &segs {
            let (p, data) = verify(s);
            assert_eq!(data.len(), 1400, "one application datagram each");
            assert!(p.ip_len() > 1280, "too big is the caller's business");
            joined.extend(data);
        }
        assert_eq!(joined, payload);
    }
}

#[test]
fn test_udp_ufo_is_unsupported() {
    let mut pkt = udp_super(false, &build::pattern(3000, 1), 1200);
    pkt.meta.vnet.gso_type = VnetHdr::GSO_UDP;
    assert_eq!(run(&pkt, 1500), Err(DropReason::GsoUnsupported));
    pkt.meta.vnet.gso_type = 0x42;
    assert_eq!(run(&pkt, 1500), Err(DropReason::GsoUnsupported));
}

#[test]
fn test_inconsistent_requests_are_malformed() {
    let payload = build::pattern(3000, 1);
    // TCPV4 on IPv6 and TCPV6 on IPv4.
    let mut pkt = tcp_super(true, &payload, tcp_flags::ACK, 1448);
    pkt.meta.vnet.gso_type = VnetHdr::GSO_TCPV4;
    assert_eq!(run(&pkt, 1500), Err(DropReason::GsoMalformed));
    let mut pkt = tcp_super(false, &payload, tcp_flags::ACK, 1448);
    pkt.meta.vnet.gso_type = VnetHdr::GSO_TCPV6;
    assert_eq!(run(&pkt, 1500), Err(DropReason::GsoMalformed));
    // A TCP type on UDP, and USO on TCP.
    let mut pkt = udp_super(false, &payload, 1448);
    pkt.meta.vnet.gso_type = VnetHdr::GSO_TCPV4;
    assert_eq!(run(&pkt, 1500), Err(DropReason::GsoMalformed));
    let mut pkt = tcp_super(false, &payload, tcp_flags::ACK, 1448);
    pkt.meta.vnet.gso_type = VnetHdr::GSO_UDP_L4;
    assert_eq!(run(&pkt, 1500), Err(DropReason::GsoMalformed));
    // gso_size zero.
    let pkt = tcp_super(false, &payload, tcp_flags::ACK, 0);
    assert_eq!(run(&pkt, 1500), Err(DropReason::GsoMalformed));
    // Not a GSO packet at all.
    let mut pkt = tcp_super(false, &payload, tcp_flags::ACK, 1448);
    pkt.meta.vnet.gso_type = VnetHdr::GSO_NONE;
    assert_eq!(run(&pkt, 1500), Err(DropReason::GsoMalformed));
}

#[test]
fn test_fragment_is_malformed() {
    let mut pkt = tcp_super(false, &build::pattern(3000, 1), tcp_flags::ACK, 1448);
    pkt.data[14 + 6] |= 0x20; // more fragments
    fix_ip_lengths(&mut pkt.data, 14, false);
    assert_eq!(run(&pkt, 1500), Err(DropReason::GsoMalformed));
}

#[test]
fn test_truncated_headers_are_malformed() {
    let pkt = tcp_super(false, &build::pattern(3000, 1), tcp_flags::ACK, 1448);
    let p = parse::parse(&pkt.data, 0).unwrap();
    let mut out = Vec::new();
    // The parse describes more bytes than the packet holds.
    let short = Packet {
        data: pkt.data[..40].to_vec(),
        meta: pkt.meta,
    };
    assert_eq!(
        segment(&short, &p, 1500, &mut out),
        Err(DropReason::GsoMalformed)
    );
    // A TCP data offset pointing past the end of the packet.
    let mut bad = pkt.clone();
    bad.data.truncate(14 + 20 + 40);
    bad.data[14 + 20 + 12] = 0xf0;
    fix_ip_lengths(&mut bad.data, 14, false);
    let p = parse::parse(&bad.data, 0);
    // etherparse already refuses it; a stale parse must be refused here too.
    assert!(p.is_err());
    let mut stale = parse::parse(&pkt.data, 0).unwrap();
    stale.ip_end = bad.data.len();
    assert_eq!(
        segment(&bad, &stale, 1500, &mut out),
        Err(DropReason::GsoMalformed)
    );
    assert!(out.is_empty(), "nothing appended on error");
}

#[test]
fn test_mtu_without_room_for_payload() {
    let pkt = tcp_super(false, &build::pattern(3000, 1), tcp_flags::ACK, 1448);
    assert_eq!(run(&pkt, 40), Err(DropReason::MtuTooSmall));
    // One byte per segment would be 3000 segments, over the limit; three bytes are 1000.
    assert_eq!(run(&pkt, 41), Err(DropReason::MtuTooSmall));
    assert_eq!(run(&pkt, 43).unwrap().len(), 1000);
}

#[test]
fn test_tcp_gso_size_that_would_exceed_max_segments_is_malformed() {
    for v6 in [false, true] {
        let payload = build::pattern(MAX_SEGMENTS_TCP * 4, 2);
        let pkt = tcp_super(v6, &payload, tcp_flags::ACK, 4);
        assert_eq!(run(&pkt, 1500).unwrap().len(), MAX_SEGMENTS_TCP);
        let pkt = tcp_super(v6, &payload, tcp_flags::ACK, 3);
        assert_eq!(run(&pkt, 1500), Err(DropReason::GsoMalformed));
        let pkt = tcp_super(v6, &build::pattern(60_000, 2), tcp_flags::ACK, 1);
        assert_eq!(run(&pkt, 1500), Err(DropReason::GsoMalformed));
    }
}

#[test]
fn test_udp_gso_size_that_would_exceed_max_segments_is_malformed() {
    for v6 in [false, true] {
        let payload = build::pattern(MAX_SEGMENTS_UDP * 100, 2);
        let pkt = udp_super(v6, &payload, 100);
        assert_eq!(run(&pkt, 1500).unwrap().len(), MAX_SEGMENTS_UDP);
        let pkt = udp_super(v6, &payload, 99);
        assert_eq!(run(&pkt, 1500), Err(DropReason::GsoMalformed));
        let pkt = udp_super(v6, &build::pattern(60_000, 2), 1);
        let mut out = Vec::new();
        let p = parse::parse(&pkt.data, 0).unwrap();
        assert_eq!(
            segment(&pkt, &p, 1500, &mut out),
            Err(DropReason::GsoMalformed)
        );
        assert!(out.is_empty());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn prop_tcp_segments_reassemble_and_fit(
        len in 0usize..20_000,
        gso_size in 64u16..9000,
        max_ip_len in 200usize..9000,
        v6 in any::<bool>(),
        seed in any::<u8>(),
        seq0 in any::<u32>(),
        flags in any::<u8>(),
        id in any::<u16>(),
    ) {
        let payload = build::pattern(len, seed);
        let mut pkt = tcp_super(v6, &payload, flags, gso_size);
        let p = parse::parse(&pkt.data, 0).unwrap();
        pkt.data[p.l4_off + 4..p.l4_off + 8].copy_from_slice(&seq0.to_be_bytes());
        if !v6 {
            pkt.data[p.l3_off + 4..p.l3_off + 6].copy_from_slice(&id.to_be_bytes());
            fix_ip_lengths(&mut pkt.data, p.l3_off, false);
        }
        let segs = run(&pkt, max_ip_len).unwrap();
        let mut joined = vec![0u8; len];
        let mut covered = 0;
        for s in &segs {
            let (sp, data) = verify(s);
            prop_assert!(sp.ip_len() <= max_ip_len);
            prop_assert!(data.len() <= usize::from(gso_size));
            let at = seq(s, &sp).wrapping_sub(seq0) as usize;
            prop_assert!(at + data.len() <= len);
            joined[at..at + data.len()].copy_from_slice(&data);
            covered += data.len();
        }
        prop_assert_eq!(covered, len);
        prop_assert_eq!(joined, payload);
    }
}
