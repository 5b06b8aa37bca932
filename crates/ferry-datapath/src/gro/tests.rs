use std::net::IpAddr;

use proptest::prelude::*;

use super::*;
use crate::gso;
use crate::wire::build::{self, IpOpts};
use crate::wire::parse::Parsed;

const SEQ0: u32 = 0xffff_f000; // close to wrapping, so the wrap is exercised
const ACK: u8 = tcp_flags::ACK;
const PSH: u8 = tcp_flags::PSH;

fn addrs(v6: bool, flow: u8) -> (IpAddr, IpAddr) {
    if v6 {
        (
            format!("fd00::{}", flow + 1).parse().unwrap(),
            "fd00::ff".parse().unwrap(),
        )
    } else {
        (
            format!("10.0.0.{}", flow + 1).parse().unwrap(),
            "10.0.0.255".parse().unwrap(),
        )
    }
}

/// The plain segments a sender cutting `payload` at `mss` puts on the wire, as
/// `gso::segment` makes them (full checksums, IPv4 identification counting up).
fn stream(v6: bool, flow: u8, seq: u32, payload: &[u8], flags: u8, mss: u16) -> Vec<Packet> {
    let (s, d) = addrs(v6, flow);
    let opts = IpOpts {
        id: 0xfffe,
        dont_fragment: true,
        ..IpOpts::default()
    };
    let f = build::tcp(s, d, 40000, 80, seq, 77, flags, payload, &opts);
    let mut pkt = Packet::new(f, 2, 1234);
    pkt.meta.vnet.gso_type = if v6 {
        VnetHdr::GSO_TCPV6
    } else {
        VnetHdr::GSO_TCPV4
    };
    pkt.meta.vnet.gso_size = mss;
    let mut out = Vec::new();
    resegment(&pkt, &mut out);
    out
}

fn resegment(pkt: &Packet, out: &mut Vec<Packet>) {
    let p = parse::parse(&pkt.data, 0).unwrap();
    gso::segment(pkt, &p, MAX_IP_LEN, out).unwrap();
}

fn parsed(pkt: &Packet) -> Parsed {
    parse::parse(&pkt.data, 0).unwrap()
}

/// Recomputes the IPv4 header and TCP checksums after a test edited a segment whose
/// layout before the edit was `p` (the edit may have made it longer).
fn refresh(pkt: &mut Packet, p: &Parsed) {
    if p.l3 == L3::Ipv4 {
        checksum::set_ipv4_header(&mut pkt.data[p.l3_off..p.l4_off]);
    }
    let l4_len = pkt.data.len() - p.l4_off;
    let pseudo = pseudo_header(&pkt.data, p.l3, p.l3_off, l4_len);
    let t = &mut pkt.data[p.l4_off..];
    t[16] = 0;
    t[17] = 0;
    let c = checksum::finish(checksum::add(t, pseudo));
    t[16..18].copy_from_slice(&c.to_be_bytes());
}

/// Edits the TCP header of a segment and fixes its checksums.
fn edit_tcp(pkt: &mut Packet, f: impl FnOnce(&mut [u8])) {
    let p = parsed(pkt);
    f(&mut pkt.data[p.l4_off..]);
    refresh(pkt, &p);
}

fn edit_ip(pkt: &mut Packet, f: impl FnOnce(&mut [u8])) {
    let p = parsed(pkt);
    f(&mut pkt.data[p.l3_off..]);
    refresh(pkt, &p);
}

/// How many segments each output packet stands for (1 for a plain packet).
fn shape(pkts: &[Packet]) -> Vec<usize> {
    pkts.iter()
        .map(|p| {
            if !p.meta.vnet.is_gso() {
                return 1;
            }
            let mut out = Vec::new();
            resegment(p, &mut out);
            out.len()
        })
        .collect()
}

fn coalesced(mut pkts: Vec<Packet>) -> Vec<Packet> {
    coalesce(&mut pkts);
    pkts
}

/// Completes the partial checksum of a merged packet and checks that it verifies.
fn assert_checksum_completes(pkt: &Packet) {
    let v = pkt.meta.vnet;
    assert!(v.needs_csum());
    let mut data = pkt.data.clone();
    checksum::complete_partial(
        &mut data,
        usize::from(v.csum_start),
        usize::from(v.csum_offset),
    )
    .unwrap();
    let p = parse::parse(&data, 0).unwrap();
    let l4 = &data[p.l4_off..p.ip_end];
    let pseudo = pseudo_header(&data, p.l3, p.l3_off, l4.len());
    assert_eq!(checksum::finish(checksum::add(l4, pseudo)), 0);
}

#[test]
fn test_construct_v4_and_v6() {
    for v6 in [false, true] {
        let payload = build::pattern(10_000, 3);
        let segs = stream(v6, 0, SEQ0, &payload, ACK | PSH, 1448);
        assert_eq!(segs.len(), 7);
        let out = coalesced(segs.clone());
        assert_eq!(out.len(), 1);
        let m = &out[0];
        let p = parsed(m);
        let v = m.meta.vnet;
        let (gso_type, l3_len) = if v6 {
            (VnetHdr::GSO_TCPV6, IPV6_LEN)
        } else {
            (VnetHdr::GSO_TCPV4, IPV4_LEN)
        };
        assert_eq!(v.gso_type, gso_type);
        assert_eq!(v.gso_size, 1448);
        assert_eq!(usize::from(v.csum_start), p.l4_off);
        assert_eq!(v.csum_offset, 16);
        assert_eq!(usize::from(v.hdr_len), p.l4_off + 20);
        assert_eq!(p.ip_len(), l3_len + 20 + payload.len());
        assert_eq!(m.data.len(), p.ip_end);
        assert_eq!(&m.data[p.l4_off + 20..], &payload[..]);
        assert_eq!(p.tcp_flags, ACK | PSH, "PSH from the last segment");
        assert_eq!(m.meta.in_port, 2);
        assert_checksum_completes(m);
        let mut again = Vec::new();
        resegment(m, &mut again);
        assert_eq!(again, segs);
    }
}

#[test]
fn test_single_and_unrelated_packets_pass_unchanged() {
    let segs = stream(false, 0, SEQ0, &build::pattern(100, 1), ACK, 1448);
    assert_eq!(coalesced(segs.clone()), segs);
    let (s, d) = addrs(false, 0);
    let udp = Packet::new(build::udp(s, d, 1, 2, &[1; 1400], &IpOpts::default()), 0, 0);
    let pkts = vec![udp.clone(), udp.clone()];
    assert_eq!(coalesced(pkts.clone()), pkts);
}

#[test]
fn test_flags_end_runs() {
    let payload = build::pattern(1000 * 4, 5);
    // PSH in the middle: that segment closes its run.
    let mut segs = stream(false, 0, SEQ0, &payload, ACK, 1000);
    edit_tcp(&mut segs[1], |t| t[13] = ACK | PSH);
    assert_eq!(shape(&coalesced(segs)), [2, 2]);
    for flag in [
        tcp_flags::FIN,
        tcp_flags::SYN,
        tcp_flags::RST,
        tcp_flags::URG,
        0x40, // ECE
        0x80, // CWR
    ] {
        let mut segs = stream(false, 0, SEQ0, &payload, ACK, 1000);
        edit_tcp(&mut segs[2], |t| t[13] |= flag);
        assert_eq!(shape(&coalesced(segs)), [2, 1, 1], "flag {flag:#x}");
    }
    // Without ACK.
    let mut segs = stream(true, 0, SEQ0, &payload, ACK, 1000);
    edit_tcp(&mut segs[0], |t| t[13] = 0);
    assert_eq!(shape(&coalesced(segs)), [1, 3]);
}

/// A change a test makes to a segment.
type Edit = fn(&mut Packet);

#[test]
fn test_gaps_and_header_changes_end_runs() {
    let payload = build::pattern(1000 * 4, 6);
    let base = stream(false, 0, SEQ0, &payload, ACK, 1000);
    let cases: [(&str, Edit); 8] = [
        ("seq gap", |p| {
            edit_tcp(p, |t| {
                let s = u32::from_be_bytes([t[4], t[5], t[6], t[7]]) + 1;
                t[4..8].copy_from_slice(&s.to_be_bytes());
            })
        }),
        ("ack", |p| edit_tcp(p, |t| t[11] ^= 1)),
        ("window", |p| edit_tcp(p, |t| t[15] ^= 1)),
        ("ttl", |p| edit_ip(p, |ip| ip[8] -= 1)),
        ("tos", |p| edit_ip(p, |ip| ip[1] = 0x10)),
        ("df", |p| edit_ip(p, |ip| ip[6] &= !0x40)),
        ("id jump", |p| {
            edit_ip(p, |ip| ip[5] = ip[5].wrapping_add(5))
        }),
        ("bad checksum", |p| {
            let at = parsed(p).l4_off + 16;
            p.data[at] ^= 0xff;
        }),
    ];
    for (what, edit) in cases {
        let mut segs = base.clone();
        edit(&mut segs[2]);
        let out = coalesced(segs);
        assert_eq!(shape(&out), [2, 1, 1], "{what}");
    }
    // The same IPv4 identification throughout is a run too (not re-segmented byte for
    // byte: gso::segment counts identifications up).
    let mut segs = base.clone();
    for s in &mut segs {
        edit_ip(s, |ip| ip[4..6].copy_from_slice(&[7, 7]));
    }
    assert_eq!(shape(&coalesced(segs)), [4]);
    // ... but not a mix of equal and counting identifications.
    let mut segs = base.clone();
    edit_ip(&mut segs[1], |ip| ip[4..6].copy_from_slice(&[0xff, 0xfe]));
    edit_ip(&mut segs[2], |ip| ip[4..6].copy_from_slice(&[0xff, 0xff]));
    edit_ip(&mut segs[3], |ip| ip[4..6].copy_from_slice(&[0, 0]));
    assert_eq!(shape(&coalesced(segs)), [2, 2]);
}

#[test]
fn test_ipv6_header_changes_end_runs() {
    let payload = build::pattern(1000 * 3, 8);
    for (what, at, bit) in [
        ("flow label", 3, 1),
        ("traffic class", 1, 0x10),
        ("hop limit", 7, 1),
    ] {
        let mut segs = stream(true, 0, SEQ0, &payload, ACK, 1000);
        edit_ip(&mut segs[1], |ip| ip[at] ^= bit);
        edit_ip(&mut segs[2], |ip| ip[at] ^= bit);
        assert_eq!(shape(&coalesced(segs)), [1, 2], "{what}");
    }
}

#[test]
fn test_options_must_match() {
    // Timestamps-like options: 12 bytes, data offset 8.
    let payload = build::pattern(1000 * 3, 9);
    let segs = stream(false, 0, SEQ0, &payload, ACK, 1000);
    let with_opts = |pkt: &Packet, stamp: u8| {
        let p = parsed(pkt);
        let mut data = pkt.data[..p.l4_off + 20].to_vec();
        data[p.l4_off + 12] = 8 << 4;
        data.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, stamp, 0, 0, 0, 1]);
        data.extend_from_slice(&pkt.data[p.l4_off + 20..p.ip_end]);
        let mut out = Packet {
            data,
            meta: pkt.meta,
        };
        edit_ip(&mut out, |ip| {
            let len = (u16::from_be_bytes([ip[2], ip[3]]) + 12).to_be_bytes();
            ip[2..4].copy_from_slice(&len);
        });
        out
    };
    let same: Vec<Packet> = segs.iter().map(|s| with_opts(s, 1)).collect();
    assert_eq!(shape(&coalesced(same)), [3]);
    let differ = vec![
        with_opts(&segs[0], 1),
        with_opts(&segs[1], 1),
        with_opts(&segs[2], 2),
    ];
    assert_eq!(shape(&coalesced(differ)), [2, 1]);
    let mixed = vec![segs[0].clone(), with_opts(&segs[1], 1)];
    assert_eq!(shape(&coalesced(mixed)), [1, 1]);
}

#[test]
fn test_interleaved_flows_coalesce_per_run() {
    let payload = build::pattern(1000 * 4, 10);
    let a = stream(false, 0, SEQ0, &payload, ACK, 1000);
    let b = stream(false, 1, 5, &payload, ACK, 1000);
    let alternating = vec![a[0].clone(), b[0].clone(), a[1].clone(), b[1].clone()];
    assert_eq!(coalesced(alternating.clone()), alternating);
    let out = coalesced(vec![
        a[0].clone(),
        a[1].clone(),
        b[0].clone(),
        b[1].clone(),
        b[2].clone(),
        a[2].clone(),
        a[3].clone(),
    ]);
    assert_eq!(shape(&out), [2, 3, 2]);
    assert_eq!(parsed(&out[1]).key, parsed(&b[0]).key);
}

#[test]
fn test_size_rules() {
    let payload = build::pattern(1000 * 3 + 500, 11);
    // A short segment ends its run: [1000, 1000, 1000, 500] is one run...
    let segs = stream(false, 0, SEQ0, &payload, ACK, 1000);
    assert_eq!(shape(&coalesced(segs.clone())), [4]);
    // ...but a short one in the middle closes the run there.
    let short = stream(false, 0, SEQ0, &payload[..2500], ACK, 1000);
    let rest = stream(
        false,
        0,
        SEQ0.wrapping_add(2500),
        &payload[2500..],
        ACK,
        1000,
    );
    let mut pkts = short;
    pkts.extend(rest);
    assert_eq!(shape(&coalesced(pkts)), [3, 1]);
    // A segment larger than the first does not join.
    let small = stream(false, 0, SEQ0, &payload[..500], ACK, 1000);
    let big = stream(
        false,
        0,
        SEQ0.wrapping_add(500),
        &payload[500..1500],
        ACK,
        1000,
    );
    let mut pkts = small;
    pkts.extend(big);
    assert_eq!(shape(&coalesced(pkts)), [1, 1]);
    // Pure ACKs are never merged.
    let acks = vec![
        stream(false, 0, SEQ0, &[], ACK, 1000).remove(0),
        stream(false, 0, SEQ0, &[], ACK, 1000).remove(0),
    ];
    assert_eq!(coalesced(acks.clone()), acks);
}

#[test]
fn test_limits() {
    // 50 full segments of 1448 bytes are more than one 64 KiB packet holds.
    let payload = build::pattern(1448 * 50, 12);
    let (a, b) = payload.split_at(1448 * 25);
    let mut segs = stream(false, 0, SEQ0, a, ACK, 1448);
    let more = stream(false, 0, SEQ0.wrapping_add(a.len() as u32), b, ACK, 1448);
    // The second half's identifications go on from the first's.
    for (i, mut s) in more.into_iter().enumerate() {
        let id = 0xfffeu16.wrapping_add((25 + i) as u16);
        edit_ip(&mut s, |ip| ip[4..6].copy_from_slice(&id.to_be_bytes()));
        segs.push(s);
    }
    let out = coalesced(segs);
    let fits = (MAX_IP_LEN - 40) / 1448;
    assert_eq!(shape(&out), [fits, 50 - fits]);
    assert!(out.iter().all(|p| parsed(p).ip_len() <= MAX_IP_LEN));
    // Small segments stop at MAX_SEGMENTS.
    let payload = build::pattern(100 * 100, 13);
    let out = coalesced(stream(true, 0, SEQ0, &payload, ACK, 100));
    assert_eq!(shape(&out), [MAX_SEGMENTS, 100 - MAX_SEGMENTS]);
}

#[test]
fn test_offloaded_packets_are_left_alone() {
    let payload = build::pattern(1000 * 3, 14);
    let mut segs = stream(false, 0, SEQ0, &payload, ACK, 1000);
    segs[1].meta.vnet.flags = VnetHdr::F_NEEDS_CSUM;
    assert_eq!(shape(&coalesced(segs)), [1, 1, 1]);
    // DATA_VALID skips verification: a stale checksum is then not looked at.
    let mut segs = stream(false, 0, SEQ0, &payload, ACK, 1000);
    for s in &mut segs {
        let at = parsed(s).l4_off + 16;
        s.data[at] ^= 0xff;
        s.meta.vnet.flags = VnetHdr::F_DATA_VALID;
    }
    let out = coalesced(segs);
    assert_eq!(shape(&out), [3]);
    assert_checksum_completes(&out[0]);
}

#[test]
fn test_frames_offered_as_slices_coalesce_as_packets_do() {
    let payload = build::pattern(1000 * 4, 12);
    let a = stream(false, 0, SEQ0, &payload, ACK, 1000);
    let b = stream(true, 1, 5, &payload, ACK | PSH, 1000);
    let (src, dst) = addrs(false, 0);
    let ack = Packet::new(
        build::tcp(src, dst, 40000, 80, 9, 77, ACK, b"", &IpOpts::default()),
        2,
        1234,
    );
    let mixed = vec![
        a[0].clone(),
        a[1].clone(),
        ack,
        b[0].clone(),
        b[1].clone(),
        b[2].clone(),
        b[3].clone(),
        a[2].clone(),
        a[3].clone(),
    ];
    let mut c = Coalescer::default();
    // Each frame in the middle of a larger buffer, as in a super-frame.
    for pkt in &mixed {
        let mut buf = vec![0xaa; 7];
        buf.extend_from_slice(&pkt.data);
        buf.extend_from_slice(&[0xbb; 5]);
        let frame = &buf[7..7 + pkt.data.len()];
        c.push_frame(frame, &parsed(pkt), &pkt.meta);
    }
    let by_slices = c.finish();
    assert_eq!(by_slices, coalesced(mixed));
    assert_eq!(shape(&by_slices), [2, 1, 4, 2]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn prop_segments_coalesce_back(
        len in 1usize..30_000,
        mss in 536u16..4000,
        v6 in any::<bool>(),
        psh in any::<bool>(),
        seed in any::<u8>(),
        seq0 in any::<u32>(),
    ) {
        let payload = build::pattern(len, seed);
        let flags = if psh { ACK | PSH } else { ACK };
        let segs = stream(v6, 0, seq0, &payload, flags, mss);
        let out = coalesced(segs.clone());
        prop_assert_eq!(out.len(), 1);
        if segs.len() == 1 {
            prop_assert_eq!(&out, &segs);
        } else {
            assert_checksum_completes(&out[0]);
            let mut again = Vec::new();
            resegment(&out[0], &mut again);
            prop_assert_eq!(again, segs);
        }
    }
}
