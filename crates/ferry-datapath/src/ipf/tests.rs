//! Tests of reassembly and refragmentation. Fragments are cut by hand from frames built
//! with `wire::build`, so that reassembly is not only checked against `refragment`.

use std::net::IpAddr;

use super::*;
use crate::drop::DropCounters;
use crate::flow::proto;
use crate::test_frames::ip;
use crate::wire::build::{self, IpOpts, tcp_flags};
use crate::wire::{L3, parse};

const ETH: usize = 14;

fn l3_of(frame: &[u8]) -> usize {
    if frame[12..14] == [0x81, 0x00] {
        18
    } else {
        ETH
    }
}

/// The source and destination of the test frames of a family.
fn addrs(v6: bool) -> (IpAddr, IpAddr) {
    if v6 {
        (ip("fd00::1"), ip("fd00::2"))
    } else {
        (ip("10.0.0.1"), ip("10.0.0.2"))
    }
}

/// A UDP frame with a payload of `len` pattern bytes.
fn udp_frame(v6: bool, len: usize, id: u16) -> Vec<u8> {
    let (s, d) = addrs(v6);
    let o = IpOpts {
        id,
        ..IpOpts::default()
    };
    build::udp(s, d, 4000, 53, &build::pattern(len, id as u8), &o)
}

fn tcp_frame(v6: bool, len: usize) -> Vec<u8> {
    let (s, d) = addrs(v6);
    build::tcp(
        s,
        d,
        40000,
        80,
        1,
        1,
        tcp_flags::ACK,
        &build::pattern(len, 3),
        &IpOpts::default(),
    )
}

/// Data ranges of `size` bytes (the last one shorter) covering `total` bytes.
fn pieces(total: usize, size: usize) -> Vec<(usize, usize)> {
    (0..total)
        .step_by(size)
        .map(|a| (a, (a + size).min(total)))
        .collect()
}

/// Cuts a whole IPv4 frame into fragments carrying the given data ranges. With
/// `strip_options`, fragments other than the first carry a plain 20-byte header.
fn cut_v4(frame: &[u8], ranges: &[(usize, usize)], strip_options: bool) -> Vec<Vec<u8>> {
    let l3 = l3_of(frame);
    let ihl = usize::from(frame[l3] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([frame[l3 + 2], frame[l3 + 3]]));
    let data = &frame[l3 + ihl..l3 + total];
    ranges
        .iter()
        .map(|&(a, b)| {
            let hl = if strip_options && a != 0 { 20 } else { ihl };
            let mut f = frame[..l3 + hl].to_vec();
            f[l3] = 0x40 | (hl / 4) as u8;
            f.extend_from_slice(&data[a..b]);
            let len = (hl + b - a) as u16;
            f[l3 + 2..l3 + 4].copy_from_slice(&len.to_be_bytes());
            let more = if b < data.len() { 0x2000 } else { 0 };
            let fo = (more | (a / 8) as u16).to_be_bytes();
            f[l3 + 6] = (f[l3 + 6] & 0x80) | fo[0];
            f[l3 + 7] = fo[1];
            crate::wire::checksum::set_ipv4_header(&mut f[l3..l3 + hl]);
            f
        })
        .collect()
}

/// Cuts a whole IPv6 frame into fragments: the base header and the first `unfrag`
/// bytes of extension headers stay in each fragment, a fragment header follows.
fn cut_v6(frame: &[u8], unfrag: usize, ranges: &[(usize, usize)], id: u32) -> Vec<Vec<u8>> {
    let l3 = l3_of(frame);
    let keep = l3 + 40 + unfrag;
    let mut nh_at = l3 + 6;
    let mut off = l3 + 40;
    while off < keep {
        nh_at = off;
        off += (usize::from(frame[off + 1]) + 1) * 8;
    }
    let end = l3 + 40 + usize::from(u16::from_be_bytes([frame[l3 + 4], frame[l3 + 5]]));
    let data = &frame[keep..end];
    ranges
        .iter()
        .map(|&(a, b)| {
            let mut f = frame[..keep].to_vec();
            let nh = f[nh_at];
            f[nh_at] = 44;
            let more = u16::from(b < data.len());
            f.push(nh);
            f.push(0);
            f.extend_from_slice(&((a as u16) | more).to_be_bytes());
            f.extend_from_slice(&id.to_be_bytes());
            f.extend_from_slice(&data[a..b]);
            let plen = (f.len() - l3 - 40) as u16;
            f[l3 + 4..l3 + 6].copy_from_slice(&plen.to_be_bytes());
            f
        })
        .collect()
}

/// Cuts `frame` into fragments of the data ranges: IPv6 with identification `id` and no
/// extension header kept in each, IPv4 with its header (options included) in each.
fn cut(v6: bool, frame: &[u8], ranges: &[(usize, usize)], id: u32) -> Vec<Vec<u8>> {
    if v6 {
        cut_v6(frame, 0, ranges, id)
    } else {
        cut_v4(frame, ranges, false)
    }
}

/// Inserts IPv4 options (a multiple of 4 bytes) into a frame.
fn with_v4_options(frame: &[u8], opts: &[u8]) -> Vec<u8> {
    let l3 = l3_of(frame);
    let mut f = frame[..l3 + 20].to_vec();
    f.extend_from_slice(opts);
    f.extend_from_slice(&frame[l3 + 20..]);
    f[l3] = 0x40 | ((20 + opts.len()) / 4) as u8;
    let total = u16::from_be_bytes([f[l3 + 2], f[l3 + 3]]) + opts.len() as u16;
    f[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
    crate::wire::checksum::set_ipv4_header(&mut f[l3..l3 + 20 + opts.len()]);
    f
}

/// Inserts IPv6 extension headers `(type, total length)` (lengths multiples of 8,
/// padded with PadN-free zeros) right after the base header.
fn with_v6_ext(frame: &[u8], exts: &[(u8, usize)]) -> Vec<u8> {
    let l3 = l3_of(frame);
    let mut f = frame[..l3 + 40].to_vec();
    let upper = f[l3 + 6];
    f[l3 + 6] = exts[0].0;
    for (i, &(_, len)) in exts.iter().enumerate() {
        let next = exts.get(i + 1).map_or(upper, |e| e.0);
        f.push(next);
        f.push((len / 8 - 1) as u8);
        // PadN option filling the rest, so the header is well formed.
        f.push(1);
        f.push((len - 4) as u8);
        f.extend(std::iter::repeat_n(0, len - 4));
    }
    f.extend_from_slice(&frame[l3 + 40..]);
    let plen = (f.len() - l3 - 40) as u16;
    f[l3 + 4..l3 + 6].copy_from_slice(&plen.to_be_bytes());
    f
}

fn packet(frame: &[u8], zone: u16, time_ns: u64) -> (Packet, Parsed) {
    let parsed = parse(frame, zone).expect("test fragment parses");
    let mut p = Packet::new(frame.to_vec(), 1, time_ns);
    p.meta.zone = zone;
    (p, parsed)
}

fn feed(r: &mut Reassembler, frame: &[u8], zone: u16, t: u64, d: &mut DropCounters) -> Outcome {
    let (p, parsed) = packet(frame, zone, t);
    assert!(parsed.frag.is_some(), "test input must be a fragment");
    r.process(p, &parsed, d)
}

/// Feeds fragments in the given order; every one but the last must be held, the last
/// must complete. Returns the output.
fn reassemble(r: &mut Reassembler, frags: &[Vec<u8>], order: &[usize]) -> (Packet, Parsed) {
    let mut d = DropCounters::default();
    for (n, &i) in order.iter().enumerate() {
        match feed(r, &frags[i], 0, n as u64, &mut d) {
            Outcome::Held if n + 1 < order.len() => {}
            Outcome::Complete(p, parsed) if n + 1 == order.len() => {
                assert_eq!(d.total(), 0);
                return (p, parsed);
            }
            o => panic!("fragment {i} (#{n}): unexpected {o:?}"),
        }
    }
    unreachable!()
}

/// Feeds a fragment that must be held.
fn feed_held(r: &mut Reassembler, frame: &[u8], zone: u16, t: u64, d: &mut DropCounters) {
    let o = feed(r, frame, zone, t, d);
    assert!(matches!(o, Outcome::Held), "{o:?}");
}

/// A reassembler of `config` and the drop counters it counts into.
fn reassembler(config: Config) -> (Reassembler, DropCounters) {
    (Reassembler::new(config), DropCounters::default())
}

fn dropped(o: Outcome) -> DropReason {
    match o {
        Outcome::Dropped(r) => r,
        o => panic!("expected a drop, got {o:?}"),
    }
}

fn small_min() -> Config {
    Config {
        min_fragment_v4: 0,
        min_fragment_v6: 0,
        ..Config::default()
    }
}

// ---------------------------------------------------------------- reassembly

#[test]
fn test_defaults_are_documented_values() {
    let c = Config::default();
    assert_eq!(c.timeout_ns, 30_000_000_000);
    assert_eq!(c.max_datagrams, 1000);
    assert_eq!(c.max_bytes, 4 * 1024 * 1024);
    assert_eq!((c.min_fragment_v4, c.min_fragment_v6), (400, 1280));
}

#[test]
fn test_reassembles_v4_in_order_out_of_order_and_last_first() {
    let whole = udp_frame(false, 3000, 7);
    let frags = cut_v4(&whole, &pieces(3008, 1200), false);
    assert_eq!(frags.len(), 3);
    for order in [[0, 1, 2], [1, 0, 2], [2, 1, 0], [2, 0, 1], [0, 2, 1]] {
        let mut r = Reassembler::new(Config::default());
        let (p, parsed) = reassemble(&mut r, &frags, &order);
        assert_eq!(p.data, whole, "order {order:?}");
        assert_eq!(parsed, parse(&whole, 0).unwrap());
        assert_eq!((r.held_datagrams(), r.held_bytes()), (0, 0));
        assert_eq!(r.stats().v4.completed, 1);
        assert_eq!(r.stats().v4.accepted, 3);
    }
}

#[test]
fn test_reassembles_v6_in_order_out_of_order_and_last_first() {
    let whole = udp_frame(true, 4000, 9);
    let frags = cut_v6(&whole, 0, &pieces(4008, 1400), 0xdead_beef);
    assert_eq!(frags.len(), 3);
    for order in [[0, 1, 2], [1, 0, 2], [2, 1, 0], [2, 0, 1], [0, 2, 1]] {
        let mut r = Reassembler::new(Config::default());
        let (p, parsed) = reassemble(&mut r, &frags, &order);
        assert_eq!(p.data, whole, "order {order:?}");
        assert_eq!(parsed, parse(&whole, 0).unwrap());
        assert_eq!(p.meta.frag_id, 0xdead_beef);
        assert_eq!((r.held_datagrams(), r.held_bytes()), (0, 0));
        assert_eq!(r.stats().v6.completed, 1);
    }
}

#[test]
fn test_key_has_real_ports_whichever_fragment_arrives_last() {
    for v6 in [false, true] {
        let whole = udp_frame(v6, 4000, 5);
        let frags = cut(v6, &whole, &pieces(4008, 1400), 77);
        // Fragments other than the first carry no ports.
        assert_eq!(parse(&frags[2], 0).unwrap().key.src_port, 0);
        // The first, the middle, then the last fragment arrives last.
        for order in [[1, 2, 0], [0, 2, 1], [0, 1, 2]] {
            let mut r = Reassembler::new(Config::default());
            let (_, parsed) = reassemble(&mut r, &frags, &order);
            assert_eq!((parsed.key.src_port, parsed.key.dst_port), (4000, 53));
            assert_eq!(parsed.key.proto, proto::UDP);
            assert!(parsed.frag.is_none() && parsed.l4_complete);
        }
    }
}

#[test]
fn test_fragments_in_different_zones_are_never_joined() {
    let whole = udp_frame(false, 2000, 1);
    let frags = cut_v4(&whole, &pieces(2008, 1200), false);
    let (mut r, mut d) = reassembler(Config::default());
    feed_held(&mut r, &frags[0], 1, 0, &mut d);
    feed_held(&mut r, &frags[1], 2, 0, &mut d);
    assert_eq!(r.held_datagrams(), 2);
    match feed(&mut r, &frags[1], 1, 0, &mut d) {
        Outcome::Complete(p, parsed) => {
            assert_eq!(p.data, whole);
            assert_eq!(parsed.key.zone, 1);
        }
        o => panic!("{o:?}"),
    }
    assert_eq!(r.held_datagrams(), 1);
}

#[test]
fn test_exact_duplicates_are_tolerated_and_counted() {
    let whole = udp_frame(false, 3000, 2);
    let frags = cut_v4(&whole, &pieces(3008, 1200), false);
    let (mut r, mut d) = reassembler(Config::default());
    for i in [0, 0, 2, 2, 0] {
        feed_held(&mut r, &frags[i], 0, 0, &mut d);
    }
    match feed(&mut r, &frags[1], 0, 0, &mut d) {
        Outcome::Complete(p, _) => assert_eq!(p.data, whole),
        o => panic!("{o:?}"),
    }
    assert_eq!(r.stats().v4.duplicates, 3);
    assert_eq!(r.stats().v4.accepted, 3);
    assert_eq!(d.total(), 0);
}

#[test]
fn test_overlap_drops_the_whole_datagram_and_counts_every_fragment() {
    for v6 in [false, true] {
        let whole = udp_frame(v6, 4000, 3);
        let held = cut(v6, &whole, &[(0, 1400), (1400, 2800)], 5);
        let overlapping = cut(v6, &whole, &[(2400, 4008)], 5);
        let (mut r, mut d) = reassembler(Config::default());
        for f in &held {
            feed_held(&mut r, f, 0, 0, &mut d);
        }
        let o = feed(&mut r, &overlapping[0], 0, 0, &mut d);
        assert_eq!(dropped(o), DropReason::FragOverlap);
        assert_eq!(d.get(DropReason::FragOverlap), 2, "held fragments counted");
        let s = if v6 { r.stats().v6 } else { r.stats().v4 };
        assert_eq!(s.overlapped, 3);
        assert_eq!(r.held_bytes(), 0, "the failed datagram's buffer is freed");
        assert_eq!(r.held_fragments(), 0);
    }
}

#[test]
fn test_same_range_with_different_bytes_is_an_overlap() {
    let whole = udp_frame(false, 3000, 4);
    let frags = cut_v4(&whole, &pieces(3008, 1200), false);
    let mut evil = frags[1].clone();
    let last = evil.len() - 1;
    evil[last] ^= 0xff;
    let (mut r, mut d) = reassembler(Config::default());
    feed_held(&mut r, &frags[1], 0, 0, &mut d);
    assert_eq!(
        dropped(feed(&mut r, &evil, 0, 0, &mut d)),
        DropReason::FragOverlap
    );
    assert_eq!(d.get(DropReason::FragOverlap), 1);
}

#[test]
fn test_fragments_of_a_failed_datagram_are_dropped_until_its_timeout() {
    let whole = udp_frame(false, 3000, 6);
    let frags = cut_v4(&whole, &pieces(3008, 1200), false);
    let bad = cut_v4(&whole, &[(8, 1208)], false);
    let cfg = Config::default();
    let timeout = cfg.timeout_ns;
    let (mut r, mut d) = reassembler(cfg);
    feed_held(&mut r, &frags[0], 0, 0, &mut d);
    assert_eq!(
        dropped(feed(&mut r, &bad[0], 0, 1, &mut d)),
        DropReason::FragOverlap
    );
    for f in &frags {
        assert_eq!(
            dropped(feed(&mut r, f, 0, timeout - 1, &mut d)),
            DropReason::FragDatagramFailed
        );
    }
    assert_eq!(r.held_bytes(), 0);
    assert_eq!(r.held_datagrams(), 1, "a marker without data remains");
    // After the timeout the same identification makes a new datagram.
    let (p, _) = {
        let mut out = None;
        for (n, f) in frags.iter().enumerate() {
            let o = feed(&mut r, f, 0, timeout + n as u64, &mut d);
            if let Outcome::Complete(p, parsed) = o {
                out = Some((p, parsed));
            }
        }
        out.expect("completes after the marker expired")
    };
    assert_eq!(p.data, whole);
}

#[test]
fn test_non_final_length_not_multiple_of_8_is_refused_v4_and_v6() {
    let v4 = cut_v4(&udp_frame(false, 3000, 1), &[(0, 1204)], false);
    let v6 = cut_v6(&udp_frame(true, 3000, 1), 0, &[(0, 1404)], 1);
    for f in [&v4[0], &v6[0]] {
        let (mut r, mut d) = reassembler(Config::default());
        assert_eq!(
            dropped(feed(&mut r, f, 0, 0, &mut d)),
            DropReason::FragLengthNotMultipleOf8
        );
        assert_eq!(r.stats().v4.invalid + r.stats().v6.invalid, 1);
        assert_eq!(r.held_datagrams(), 0);
    }
}

#[test]
fn test_v6_first_fragment_without_whole_header_chain_is_refused() {
    // A destination-options header after the fragment header that runs past the first
    // fragment: the upper-layer header is not in the first fragment (RFC 7112).
    let whole = with_v6_ext(&udp_frame(true, 3000, 1), &[(60, 2048)]);
    let frags = cut_v6(&whole, 0, &pieces(whole.len() - ETH - 40, 1400), 3);
    let (_, parsed) = packet(&frags[0], 0, 0);
    assert!(!parsed.chain_complete);
    let (mut r, mut d) = reassembler(Config::default());
    assert_eq!(
        dropped(feed(&mut r, &frags[0], 0, 0, &mut d)),
        DropReason::FragIncompleteHeaderChain
    );
    assert_eq!(r.stats().v6.invalid, 1);
}

#[test]
fn test_first_fragment_too_short_for_transport_header_is_refused() {
    // Needs minimums below a TCP header's worth, so that the size check does not fire first.
    for v6 in [false, true] {
        let whole = tcp_frame(v6, 100);
        let frags = cut(v6, &whole, &[(0, 16), (16, 120)], 1);
        let (mut r, mut d) = reassembler(small_min());
        assert_eq!(
            dropped(feed(&mut r, &frags[0], 0, 0, &mut d)),
            DropReason::FragFirstTooShort
        );
    }
}

#[test]
fn test_tcp_fragment_at_offset_8_is_refused() {
    for v6 in [false, true] {
        let whole = tcp_frame(v6, 100);
        let frags = cut(v6, &whole, &[(0, 8), (8, 120)], 1);
        let (mut r, mut d) = reassembler(small_min());
        assert_eq!(
            dropped(feed(&mut r, &frags[1], 0, 0, &mut d)),
            DropReason::FragTcpOffsetOne
        );
    }
}

#[test]
fn test_datagram_over_65535_bytes_is_refused_v4_and_v6() {
    // A final fragment at the largest offset, carrying enough to pass 65535.
    let v4 = cut_v4(&udp_frame(false, 65000, 1), &[(65000, 65008)], false);
    let mut f4 = v4[0].clone();
    f4[ETH + 6..ETH + 8].copy_from_slice(&(65528u16 / 8).to_be_bytes());
    crate::wire::checksum::set_ipv4_header(&mut f4[ETH..ETH + 20]);
    let v6 = cut_v6(&udp_frame(true, 65000, 1), 0, &[(65000, 65008)], 1);
    let mut f6 = v6[0].clone();
    f6[ETH + 42..ETH + 44].copy_from_slice(&65528u16.to_be_bytes());
    for f in [&f4, &f6] {
        let (_, parsed) = packet(f, 0, 0);
        assert_eq!(parsed.frag.unwrap().offset, 65528);
        let (mut r, mut d) = reassembler(Config::default());
        assert_eq!(
            dropped(feed(&mut r, f, 0, 0, &mut d)),
            DropReason::FragDatagramTooBig
        );
    }
}

#[test]
fn test_non_final_fragment_below_minimum_is_refused() {
    let v4 = cut_v4(&udp_frame(false, 3000, 1), &[(0, 376), (0, 384)], false);
    let v6 = cut_v6(&udp_frame(true, 3000, 1), 0, &[(0, 1224), (0, 1232)], 1);
    let cases = [(&v4[0], &v4[1], 396, 404), (&v6[0], &v6[1], 1272, 1280)];
    for (small, ok, small_len, ok_len) in cases {
        let (mut r, mut d) = reassembler(Config::default());
        assert_eq!(packet(small, 0, 0).1.ip_len(), small_len);
        assert_eq!(packet(ok, 0, 0).1.ip_len(), ok_len);
        assert_eq!(
            dropped(feed(&mut r, small, 0, 0, &mut d)),
            DropReason::FragTooSmall
        );
        feed_held(&mut r, ok, 0, 0, &mut d);
        assert_eq!(r.stats().v4.too_small + r.stats().v6.too_small, 1);
    }
}

#[test]
fn test_two_different_final_fragments_are_an_inconsistent_end() {
    let whole = udp_frame(false, 3000, 1);
    let a = cut_v4(&whole, &[(0, 1200), (1200, 3008)], false);
    let b = cut_v4(&udp_frame(false, 2600, 1), &[(2400, 2608)], false);
    let (mut r, mut d) = reassembler(Config::default());
    feed_held(&mut r, &a[0], 0, 0, &mut d);
    feed_held(&mut r, &b[0], 0, 0, &mut d);
    assert_eq!(
        dropped(feed(&mut r, &a[1], 0, 0, &mut d)),
        DropReason::FragInconsistentEnd
    );
    assert_eq!(d.get(DropReason::FragInconsistentEnd), 2);
}

#[test]
fn test_data_past_the_final_end_is_an_inconsistent_end() {
    let short = cut_v4(&udp_frame(false, 1500, 1), &[(1200, 1508)], false);
    let long = cut_v4(&udp_frame(false, 3000, 1), &[(1600, 2800)], false);
    let (mut r, mut d) = reassembler(Config::default());
    feed_held(&mut r, &short[0], 0, 0, &mut d);
    assert_eq!(
        dropped(feed(&mut r, &long[0], 0, 0, &mut d)),
        DropReason::FragInconsistentEnd
    );
    // A final fragment ending before data already held is just as inconsistent.
    let mut r = Reassembler::new(Config::default());
    feed_held(&mut r, &long[0], 0, 0, &mut d);
    assert_eq!(
        dropped(feed(&mut r, &short[0], 0, 0, &mut d)),
        DropReason::FragInconsistentEnd
    );
}

#[test]
fn test_full_table_refuses_new_datagrams_but_not_those_in_flight() {
    let cfg = Config {
        max_datagrams: 2,
        ..Config::default()
    };
    let (mut r, mut d) = reassembler(cfg);
    let dgs: Vec<_> = (1..=3u16)
        .map(|id| {
            let w = udp_frame(false, 2000, id);
            (w.clone(), cut_v4(&w, &pieces(2008, 1200), false))
        })
        .collect();
    feed_held(&mut r, &dgs[0].1[0], 0, 0, &mut d);
    feed_held(&mut r, &dgs[1].1[0], 0, 0, &mut d);
    assert_eq!(
        dropped(feed(&mut r, &dgs[2].1[0], 0, 0, &mut d)),
        DropReason::FragTableFull
    );
    assert_eq!(r.stats().v4.table_full, 1);
    match feed(&mut r, &dgs[0].1[1], 0, 0, &mut d) {
        Outcome::Complete(p, _) => assert_eq!(p.data, dgs[0].0),
        o => panic!("{o:?}"),
    }
    // Room again.
    feed_held(&mut r, &dgs[2].1[0], 0, 0, &mut d);
}

#[test]
fn test_lowered_datagram_limit_keeps_those_in_flight_and_refuses_new_ones() {
    let (mut r, mut d) = reassembler(Config::default());
    let dgs: Vec<_> = (1..=3u16)
        .map(|id| {
            let w = udp_frame(false, 2000, id);
            (w.clone(), cut_v4(&w, &pieces(2008, 1200), false))
        })
        .collect();
    for dg in &dgs[..2] {
        feed_held(&mut r, &dg.1[0], 0, 0, &mut d);
    }
    r.set_config(Config {
        max_datagrams: 1,
        ..Config::default()
    });
    assert_eq!(r.config().max_datagrams, 1);
    assert_eq!(
        dropped(feed(&mut r, &dgs[2].1[0], 0, 0, &mut d)),
        DropReason::FragTableFull
    );
    for dg in &dgs[..2] {
        match feed(&mut r, &dg.1[1], 0, 0, &mut d) {
            Outcome::Complete(p, _) => assert_eq!(p.data, dg.0),
            o => panic!("{o:?}"),
        }
    }
    feed_held(&mut r, &dgs[2].1[0], 0, 0, &mut d);
}

#[test]
fn test_byte_limit_counts_fragments_held_and_lets_a_datagram_in_flight_complete() {
    // Datagram a: fragments of 1220 and 828 IP bytes.
    let cfg = Config {
        max_bytes: 2100,
        ..Config::default()
    };
    let (mut r, mut d) = reassembler(cfg);
    let a = udp_frame(false, 2000, 1);
    let fa = cut_v4(&a, &pieces(2008, 1200), false);
    let b = cut_v4(&udp_frame(false, 2000, 2), &pieces(2008, 1200), false);
    feed_held(&mut r, &fa[0], 0, 0, &mut d);
    assert_eq!(r.held_bytes(), 1220);
    assert_eq!(
        dropped(feed(&mut r, &b[0], 0, 0, &mut d)),
        DropReason::FragTableFull
    );
    assert_eq!(
        r.held_datagrams(),
        1,
        "the refused datagram leaves no entry"
    );
    // 1220 + 828 fits, but the completing fragment would get in even if it did not.
    match feed(&mut r, &fa[1], 0, 0, &mut d) {
        Outcome::Complete(p, _) => assert_eq!(p.data, a),
        o => panic!("{o:?}"),
    }
    assert_eq!(r.held_bytes(), 0);
}

#[test]
fn test_byte_limit_refuses_growth_but_not_the_completing_fragment() {
    // Fragments of 1220, 1220 and 628 IP bytes.
    let cfg = Config {
        max_bytes: 2500,
        ..Config::default()
    };
    let (mut r, mut d) = reassembler(cfg);
    let cut = |id| cut_v4(&udp_frame(false, 3000, id), &pieces(3008, 1200), false);
    let (fa, fb, fc) = (cut(1), cut(2), cut(3));
    feed_held(&mut r, &fa[0], 0, 0, &mut d);
    feed_held(&mut r, &fa[2], 0, 0, &mut d);
    assert_eq!(r.held_bytes(), 1848);
    assert_eq!(r.held_fragments(), 2);
    assert_eq!(
        dropped(feed(&mut r, &fb[0], 0, 0, &mut d)),
        DropReason::FragTableFull
    );
    // Over the limit too, but it completes the datagram, so it is never held.
    assert!(matches!(
        feed(&mut r, &fa[1], 0, 0, &mut d),
        Outcome::Complete(..)
    ));
    assert_eq!(r.held_bytes(), 0);
    assert_eq!(r.held_fragments(), 0);
    // Growth of a datagram in flight that would be held is refused.
    feed_held(&mut r, &fb[0], 0, 0, &mut d);
    feed_held(&mut r, &fc[0], 0, 0, &mut d);
    assert_eq!(
        dropped(feed(&mut r, &fb[2], 0, 0, &mut d)),
        DropReason::FragTableFull
    );
    assert_eq!(r.stats().v4.table_full, 2);
    assert_eq!(r.held_bytes(), 2440);
    assert_eq!(r.held_fragments(), 2, "one of b and one of c");
}

#[test]
fn test_tiny_fragments_at_a_high_offset_do_not_fill_the_byte_limit() {
    // Final fragments of 16 data bytes at offset 64000: each makes a 64 KiB buffer, which
    // used to count against max_bytes, so 69 of them blocked every new datagram.
    // One source sends them all: its datagram limit is lifted here, the byte limit is
    // what this test is about.
    let cfg = Config {
        max_datagrams_per_source: Config::default().max_datagrams,
        ..Config::default()
    };
    let timeout = cfg.timeout_ns;
    let (mut r, mut d) = reassembler(cfg);
    for id in 0..100u16 {
        let tail = cut_v4(&udp_frame(false, 64008, id), &[(64000, 64016)], false);
        feed_held(&mut r, &tail[0], 0, 0, &mut d);
    }
    assert_eq!(r.held_datagrams(), 100);
    assert_eq!(r.held_bytes(), 100 * 36);
    let whole = udp_frame(false, 3000, 500);
    let frags = cut_v4(&whole, &pieces(3008, 1200), false);
    let (p, _) = reassemble(&mut r, &frags, &[0, 1, 2]);
    assert_eq!(p.data, whole);
    assert_eq!(r.stats().v4.table_full, 0);
    assert_eq!(r.expire(timeout + 10, 1000, &mut d), 100);
    assert_eq!((r.held_datagrams(), r.held_bytes()), (0, 0));
}

/// A final fragment of one data byte at offset 63992 (a 21-byte IP packet) from `src`.
fn tiny_final_fragment(src: &str, id: u16) -> Vec<u8> {
    let o = IpOpts {
        id,
        ..IpOpts::default()
    };
    let whole = build::udp(
        ip(src),
        ip("10.0.0.2"),
        4000,
        53,
        &build::pattern(63985, 0),
        &o,
    );
    cut_v4(&whole, &[(63992, 63993)], false).pop().unwrap()
}

#[test]
fn test_one_source_cannot_take_the_whole_table() {
    // Each tiny fragment at a high offset is charged about 64 KiB, so with the default
    // max_bytes one source's would fill the bytes first; lift it to see the datagrams.
    let cfg = Config {
        max_bytes: 1000 * 65536,
        ..Config::default()
    };
    let (timeout, per_source) = (cfg.timeout_ns, cfg.max_datagrams_per_source);
    let (mut r, mut d) = reassembler(cfg);
    for id in 0..1000u16 {
        let o = feed(&mut r, &tiny_final_fragment("10.0.0.66", id), 0, 1, &mut d);
        if usize::from(id) < per_source {
            assert!(matches!(o, Outcome::Held), "{id}: {o:?}");
        } else {
            assert_eq!(dropped(o), DropReason::FragSourceLimit);
        }
    }
    assert_eq!(r.held_datagrams(), per_source);
    assert_eq!(r.stats().v4.table_full, (1000 - per_source) as u64);
    // The same source in another zone is another source.
    let f = tiny_final_fragment("10.0.0.66", 1);
    feed_held(&mut r, &f, 7, 1, &mut d);
    // Another host's datagrams are still reassembled.
    let (p, _) = reassemble(
        &mut r,
        &cut_v4(&udp_frame(false, 3000, 4242), &pieces(3008, 1480), false),
        &[0, 1, 2],
    );
    assert_eq!(p.data, udp_frame(false, 3000, 4242));
    // Once its datagrams expire, the source has its share again.
    r.expire(timeout + 1, 1000, &mut d);
    assert_eq!(r.held_datagrams(), 0);
    let f = tiny_final_fragment("10.0.0.66", 5000);
    feed_held(&mut r, &f, 0, timeout + 2, &mut d);
}

#[test]
fn test_fragment_past_the_per_datagram_limit_fails_the_datagram() {
    for v6 in [false, true] {
        let whole = udp_frame(v6, 2000, 4);
        let frags = cut(v6, &whole, &pieces(2008, 8), 6);
        let limit = Config::MAX_FRAGMENTS_PER_DATAGRAM;
        assert!(frags.len() > limit + 1);
        let (mut r, mut d) = reassembler(small_min());
        for f in &frags[..limit] {
            feed_held(&mut r, f, 0, 0, &mut d);
        }
        // A duplicate is not a new fragment.
        feed_held(&mut r, &frags[1], 0, 0, &mut d);
        assert_eq!(
            dropped(feed(&mut r, &frags[limit], 0, 0, &mut d)),
            DropReason::FragTooMany
        );
        assert_eq!(d.get(DropReason::FragTooMany), limit as u64);
        let stats = if v6 { r.stats().v6 } else { r.stats().v4 };
        assert_eq!(stats.too_many, limit as u64 + 1);
        assert_eq!(
            r.held_bytes(),
            0,
            "the failed datagram's fragments are freed"
        );
        assert_eq!(
            dropped(feed(&mut r, &frags[limit + 1], 0, 0, &mut d)),
            DropReason::FragDatagramFailed
        );
    }
}

#[test]
fn test_memory_returns_to_zero_after_expiry() {
    let cfg = Config::default();
    let timeout = cfg.timeout_ns;
    let (mut r, mut d) = reassembler(cfg);
    for id in 0..50u16 {
        let v6 = id % 2 == 0;
        let w = udp_frame(v6, 3000, id);
        let f = if v6 {
            cut_v6(&w, 0, &pieces(3008, 1400), u32::from(id))
        } else {
            cut_v4(&w, &pieces(3008, 1200), false)
        };
        feed(&mut r, &f[0], 0, u64::from(id), &mut d);
        feed(&mut r, &f[1], 0, u64::from(id), &mut d);
    }
    assert_eq!(r.held_datagrams(), 50);
    assert!(r.held_bytes() > 0);
    assert_eq!(r.expire(timeout - 1, 1000, &mut d), 0);
    assert_eq!(r.expire(timeout + 100, 1000, &mut d), 50);
    assert_eq!((r.held_datagrams(), r.held_bytes()), (0, 0));
    assert_eq!(d.get(DropReason::FragExpired), 100);
    assert_eq!(r.stats().v4.expired + r.stats().v6.expired, 100);
    assert_eq!(r.stats().v4.expired, 50);
}

#[test]
fn test_expire_does_at_most_budget_datagrams_of_work() {
    let (mut r, mut d) = reassembler(Config::default());
    for id in 0..10u16 {
        let f = cut_v4(&udp_frame(false, 3000, id), &[(0, 1200)], false);
        feed(&mut r, &f[0], 0, 0, &mut d);
    }
    let late = r.config().timeout_ns;
    assert_eq!(r.expire(late, 3, &mut d), 3);
    assert_eq!(r.held_datagrams(), 7);
    assert_eq!(r.expire(late, 100, &mut d), 7);
    assert_eq!(r.expire(late, 100, &mut d), 0);
}

#[test]
fn test_fragment_after_the_deadline_starts_a_new_datagram() {
    let whole = udp_frame(false, 3000, 8);
    let frags = cut_v4(&whole, &pieces(3008, 1200), false);
    let mut r = Reassembler::new(Config::default());
    let timeout = r.config().timeout_ns;
    let mut d = DropCounters::default();
    feed(&mut r, &frags[0], 0, 0, &mut d);
    feed(&mut r, &frags[1], 0, 0, &mut d);
    // Without a call to expire, the stale datagram must not be joined.
    feed_held(&mut r, &frags[2], 0, timeout, &mut d);
    assert_eq!(d.get(DropReason::FragExpired), 2);
    assert_eq!(r.held_datagrams(), 1);
}

#[test]
fn test_ethernet_padding_is_not_fragment_data() {
    let whole = udp_frame(false, 2000, 1);
    let mut frags = cut_v4(&whole, &pieces(2008, 1200), false);
    frags[1].extend_from_slice(&[0xee; 30]);
    let mut r = Reassembler::new(Config::default());
    let (p, _) = reassemble(&mut r, &frags, &[1, 0]);
    assert_eq!(p.data, whole);
}

#[test]
fn test_output_meta_is_the_completing_fragments_with_mru_and_frag_id() {
    let whole = udp_frame(false, 3000, 0x4321);
    let frags = cut_v4(&whole, &[(0, 1480), (1480, 2000), (2000, 3008)], false);
    let (mut r, mut d) = reassembler(Config::default());
    feed(&mut r, &frags[1], 0, 5, &mut d);
    feed(&mut r, &frags[2], 0, 6, &mut d);
    let (mut p, parsed) = packet(&frags[0], 0, 7);
    p.meta.in_port = 9;
    match r.process(p, &parsed, &mut d) {
        Outcome::Complete(p, _) => {
            assert_eq!((p.meta.in_port, p.meta.time_ns), (9, 7));
            assert_eq!(p.meta.mru, 1500);
            assert_eq!(p.meta.frag_id, 0x4321);
        }
        o => panic!("{o:?}"),
    }
}

#[test]
fn test_output_vnet_header_is_cleared_not_the_completing_fragments() {
    let whole = udp_frame(false, 3000, 0x99);
    let frags = cut_v4(&whole, &pieces(3008, 1200), false);
    let (mut r, mut d) = reassembler(Config::default());
    feed(&mut r, &frags[0], 0, 0, &mut d);
    feed(&mut r, &frags[1], 0, 0, &mut d);
    let (mut p, parsed) = packet(&frags[2], 0, 1);
    p.meta.vnet = crate::packet::VnetHdr {
        flags: crate::packet::VnetHdr::F_NEEDS_CSUM,
        gso_type: crate::packet::VnetHdr::GSO_UDP_L4,
        hdr_len: 42,
        gso_size: 1000,
        csum_start: 34,
        csum_offset: 6,
    };
    match r.process(p, &parsed, &mut d) {
        Outcome::Complete(p, _) => {
            assert_eq!(p.data, whole);
            assert_eq!(p.meta.vnet, crate::packet::VnetHdr::default());
        }
        o => panic!("{o:?}"),
    }
}

#[test]
fn test_v6_fragment_header_removed_and_next_header_patched_after_extension_headers() {
    // Hop-by-hop and routing stay before the fragment header; destination options after
    // it are part of the fragmentable data.
    let whole = with_v6_ext(&udp_frame(true, 3000, 1), &[(0, 8), (43, 16), (60, 24)]);
    let data_len = whole.len() - ETH - 40 - 24;
    let frags = cut_v6(&whole, 24, &pieces(data_len, 1400), 99);
    let first = parse(&frags[0], 0).unwrap();
    assert_eq!(first.frag_hdr_off, ETH + 64);
    for order in [[0, 1, 2], [2, 1, 0]] {
        let mut r = Reassembler::new(Config::default());
        let (p, parsed) = reassemble(&mut r, &frags, &order);
        assert_eq!(p.data, whole);
        assert_eq!(parsed.key.src_port, 4000);
    }
    // Without extension headers the base header's next header is patched.
    let plain = udp_frame(true, 2000, 1);
    let frags = cut_v6(&plain, 0, &pieces(2008, 1400), 1);
    let mut r = Reassembler::new(Config::default());
    assert_eq!(reassemble(&mut r, &frags, &[1, 0]).0.data, plain);
}

#[test]
fn test_v4_first_fragment_with_longer_headers_than_later_ones() {
    // A record-route option (not copied) is only in the first fragment; a later
    // fragment arriving first guessed a shorter header.
    let mut rr = vec![7, 11, 4];
    rr.extend_from_slice(&[0; 8]);
    rr.push(0); // end of options
    let whole = with_v4_options(&udp_frame(false, 3000, 1), &rr);
    let frags = cut_v4(&whole, &pieces(3008, 1200), true);
    assert_eq!(frags[1][ETH], 0x45);
    for order in [[2, 1, 0], [0, 1, 2], [1, 0, 2]] {
        let mut r = Reassembler::new(Config::default());
        let (p, _) = reassemble(&mut r, &frags, &order);
        assert_eq!(p.data, whole, "order {order:?}");
        assert_eq!(r.held_bytes(), 0);
    }
}

#[test]
fn test_vlan_tag_is_kept() {
    let plain = udp_frame(false, 2000, 1);
    let mut whole = plain[..12].to_vec();
    whole.extend_from_slice(&[0x81, 0x00, 0x00, 0x2a]);
    whole.extend_from_slice(&plain[12..]);
    let frags = cut_v4(&whole, &pieces(2008, 1200), false);
    let mut r = Reassembler::new(Config::default());
    let (p, parsed) = reassemble(&mut r, &frags, &[1, 0]);
    assert_eq!(p.data, whole);
    assert_eq!(parsed.vlan, Some(42));
}

#[test]
fn test_stats_are_kept_per_family() {
    let mut r = Reassembler::new(Config::default());
    let w4 = udp_frame(false, 2000, 1);
    reassemble(&mut r, &cut_v4(&w4, &pieces(2008, 1200), false), &[0, 1]);
    let w6 = udp_frame(true, 3000, 1);
    reassemble(&mut r, &cut_v6(&w6, 0, &pieces(3008, 1400), 1), &[0, 1, 2]);
    let s = r.stats();
    assert_eq!((s.v4.accepted, s.v4.completed), (2, 1));
    assert_eq!((s.v6.accepted, s.v6.completed), (3, 1));
}

/// Sets the ECN field of a fragment (IPv4 TOS low bits, checksum fixed; IPv6 traffic
/// class low bits).
fn set_ecn(f: &mut [u8], ecn: u8) {
    let l3 = l3_of(f);
    if f[l3] >> 4 == 4 {
        f[l3 + 1] = (f[l3 + 1] & !3) | ecn;
        let ihl = usize::from(f[l3] & 0x0f) * 4;
        crate::wire::checksum::set_ipv4_header(&mut f[l3..l3 + ihl]);
    } else {
        f[l3 + 1] = (f[l3 + 1] & !0x30) | (ecn << 4);
    }
}

fn ecn_of(f: &[u8]) -> u8 {
    let l3 = l3_of(f);
    if f[l3] >> 4 == 4 {
        f[l3 + 1] & 3
    } else {
        (f[l3 + 1] >> 4) & 3
    }
}

const ECT0: u8 = 0b10;
const ECT1: u8 = 0b01;
const CE: u8 = 0b11;

/// Three fragments of a UDP datagram of the family, with these ECN fields.
fn ecn_fragments(v6: bool, ecn: [u8; 3]) -> Vec<Vec<u8>> {
    let whole = udp_frame(v6, 3000, 9);
    let mut frags = if v6 {
        cut_v6(&whole, 0, &pieces(3008, 1448), 77)
    } else {
        cut_v4(&whole, &pieces(3008, 1480), false)
    };
    for (f, e) in frags.iter_mut().zip(ecn) {
        set_ecn(f, e);
    }
    frags
}

#[test]
fn test_ce_on_a_later_fragment_marks_the_datagram_and_its_refragmented_pieces() {
    for v6 in [false, true] {
        let frags = ecn_fragments(v6, [ECT0, CE, ECT0]);
        let mut r = Reassembler::new(Config::default());
        // The output parses, so the IPv4 header checksum was recomputed.
        let (p, parsed) = reassemble(&mut r, &frags, &[0, 1, 2]);
        assert_eq!(ecn_of(&p.data), CE, "v6 {v6}");
        let mut out = Vec::new();
        refragment(&p, &parsed, 1500, &mut out).unwrap();
        assert_eq!(out.len(), 3);
        for f in &out {
            assert_eq!(ecn_of(&f.data), CE, "v6 {v6}");
            parse(&f.data, 0).unwrap();
        }
    }
}

#[test]
fn test_ect_fragments_without_ce_keep_the_first_fragments_field() {
    for v6 in [false, true] {
        let frags = ecn_fragments(v6, [ECT0, ECT1, ECT0]);
        let mut r = Reassembler::new(Config::default());
        let (p, _) = reassemble(&mut r, &frags, &[1, 2, 0]);
        assert_eq!(ecn_of(&p.data), ECT0, "v6 {v6}");
    }
}

#[test]
fn test_not_ect_mixed_with_ect_or_ce_drops_the_datagram_and_every_fragment() {
    for v6 in [false, true] {
        for ecn in [[ECT0, 0, 0], [0, 0, CE], [0, ECT1, 0]] {
            let frags = ecn_fragments(v6, ecn);
            let (mut r, mut d) = reassembler(Config::default());
            feed_held(&mut r, &frags[0], 0, 1, &mut d);
            feed_held(&mut r, &frags[1], 0, 2, &mut d);
            let o = feed(&mut r, &frags[2], 0, 3, &mut d);
            assert_eq!(dropped(o), DropReason::FragEcnMismatch, "{ecn:?}");
            // The two held fragments are counted here; the caller counts the third.
            assert_eq!(d.get(DropReason::FragEcnMismatch), 2);
            assert_eq!((r.held_datagrams(), r.held_bytes()), (0, 0));
            let s = if v6 { r.stats().v6 } else { r.stats().v4 };
            assert_eq!((s.completed, s.invalid), (0, 3));
        }
    }
}

/// Sets or clears DF on an IPv4 fragment, checksum fixed.
fn set_df(f: &mut [u8], df: bool) {
    let l3 = l3_of(f);
    f[l3 + 6] = (f[l3 + 6] & !0x40) | if df { 0x40 } else { 0 };
    let ihl = usize::from(f[l3] & 0x0f) * 4;
    crate::wire::checksum::set_ipv4_header(&mut f[l3..l3 + ihl]);
}

/// Reassembles a 3000-byte UDP datagram cut at `cut` with DF set on the fragments as
/// `df` says; returns whether the datagram has DF, and whether each of its pieces
/// refragmented to its MRU has.
fn reassembled_df(cut: usize, df: [bool; 2]) -> (bool, Vec<bool>) {
    let whole = udp_frame(false, 3000, 9);
    let mut frags = cut_v4(&whole, &[(0, cut), (cut, 3008)], false);
    for (f, df) in frags.iter_mut().zip(df) {
        set_df(f, df);
    }
    let mut r = Reassembler::new(Config::default());
    let (p, parsed) = reassemble(&mut r, &frags, &[1, 0]);
    let mut out = Vec::new();
    refragment(&p, &parsed, usize::from(p.meta.mru), &mut out).unwrap();
    let pieces = out
        .iter()
        .map(|f| parse(&f.data, 0).unwrap().dont_fragment)
        .collect();
    (parsed.dont_fragment, pieces)
}

#[test]
fn test_reassembled_v4_has_df_when_its_largest_fragment_had_it_and_its_pieces_keep_it() {
    // First fragment the larger one, with DF.
    assert_eq!(
        reassembled_df(2000, [true, false]),
        (true, vec![true, true])
    );
    // The larger fragment second, with DF, the first without: DF all the same.
    assert_eq!(
        reassembled_df(1000, [false, true]),
        (true, vec![true, true])
    );
    assert_eq!(reassembled_df(1480, [true, true]), (true, vec![true, true]));
}

#[test]
fn test_reassembled_v4_has_no_df_when_its_largest_fragment_lacked_it() {
    // DF on the first fragment only, which is the smaller one: the path that cut the
    // larger one could fragment, so the pieces may be cut again.
    assert_eq!(
        reassembled_df(1000, [true, false]),
        (false, vec![false, false])
    );
    assert_eq!(
        reassembled_df(1480, [false, false]),
        (false, vec![false, false])
    );
}

#[test]
fn test_v6_fragments_with_other_next_headers_are_joined_and_the_first_ones_is_used() {
    // RFC 8200 section 4.5: the next header of fragments other than the first may differ
    // from the first's, and only the first's counts.
    let whole = udp_frame(true, 3000, 9);
    let mut frags = cut_v6(&whole, 0, &pieces(3008, 1448), 77);
    frags[1][ETH + 40] = 59;
    frags[2][ETH + 40] = 60;
    for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0]] {
        let mut r = Reassembler::new(Config::default());
        let (p, parsed) = reassemble(&mut r, &frags, &order);
        assert_eq!(p.data, whole, "{order:?}");
        assert_eq!(parsed.proto, proto::UDP);
    }
}

#[test]
fn test_v6_fragments_after_destination_options_are_joined() {
    // The first fragment's parsed protocol is UDP (after destination options); the later
    // ones only know "destination options": they must still be joined.
    let whole = with_v6_ext(&udp_frame(true, 3000, 1), &[(60, 16)]);
    let frags = cut_v6(&whole, 0, &pieces(whole.len() - ETH - 40, 1400), 4);
    assert_eq!(parse(&frags[0], 0).unwrap().proto, proto::UDP);
    assert_eq!(parse(&frags[1], 0).unwrap().proto, 60);
    let mut r = Reassembler::new(Config::default());
    assert_eq!(reassemble(&mut r, &frags, &[2, 0, 1]).0.data, whole);
}

// ---------------------------------------------------------------- refragmentation

/// Refragments a frame whose meta says it was reassembled (MRU and id set).
fn refrag(frame: &[u8], max: usize, frag_id: u32) -> Result<Vec<Packet>, DropReason> {
    let (mut p, parsed) = packet(frame, 0, 42);
    p.meta.mru = 1500;
    p.meta.frag_id = frag_id;
    let mut out = Vec::new();
    refragment(&p, &parsed, max, &mut out).map(|()| out)
}

/// Checks the shape of refragmented output and reassembles it in reverse order.
fn check_and_reassemble(frags: &[Packet], max: usize) -> Vec<u8> {
    let parsed: Vec<Parsed> = frags.iter().map(|f| parse(&f.data, 0).unwrap()).collect();
    for (i, p) in parsed.iter().enumerate() {
        assert!(p.ip_len() <= max, "fragment {i} is {} > {max}", p.ip_len());
        let frag = p.frag.expect("every output is a fragment");
        assert_eq!(frag.more, i + 1 < frags.len());
        if frag.more {
            let start = if p.l3 == L3::Ipv6 {
                p.frag_hdr_off + 8
            } else {
                p.l4_off
            };
            assert_eq!((p.ip_end - start) % 8, 0);
        }
        assert_eq!((frags[i].meta.mru, frags[i].meta.frag_id), (0, 0));
    }
    let mut r = Reassembler::new(small_min());
    let order: Vec<usize> = (0..frags.len()).rev().collect();
    let data: Vec<Vec<u8>> = frags.iter().map(|p| p.data.clone()).collect();
    reassemble(&mut r, &data, &order).0.data
}

#[test]
fn test_reassemble_of_refragment_is_the_original_v4_and_v6() {
    for v6 in [false, true] {
        for len in [600, 1473, 3000, 8000] {
            for max in [576, 1280, 1500] {
                let whole = udp_frame(v6, len, 3);
                if whole.len() - ETH <= max {
                    continue;
                }
                let frags = refrag(&whole, max, 0x5151).unwrap();
                assert!(frags.len() > 1);
                assert_eq!(
                    check_and_reassemble(&frags, max),
                    whole,
                    "v6 {v6} {len} {max}"
                );
            }
        }
    }
}

#[test]
fn test_refragment_v4_first_keeps_all_options_later_only_copied_ones() {
    // Loose source route (copied), NOP, record route (not copied), end of options.
    let lsrr = [0x83, 7, 4, 10, 0, 0, 9];
    let mut opts = lsrr.to_vec();
    opts.extend_from_slice(&[1, 7, 7, 4, 0, 0, 0, 0, 0]);
    assert_eq!(opts.len(), 16);
    let whole = with_v4_options(&udp_frame(false, 3000, 1), &opts);
    let frags = refrag(&whole, 1000, 0).unwrap();
    assert_eq!(frags[0].data[ETH], 0x49);
    assert_eq!(&frags[0].data[ETH + 20..ETH + 36], &opts[..]);
    for f in &frags[1..] {
        assert_eq!(f.data[ETH], 0x47, "20 bytes + LSRR padded to 28");
        assert_eq!(&f.data[ETH + 20..ETH + 27], &lsrr);
        assert_eq!(f.data[ETH + 27], 0);
        // parse() verifies the header checksum.
        assert!(parse(&f.data, 0).is_ok());
    }
    assert_eq!(check_and_reassemble(&frags, 1000), whole);
}

#[test]
fn test_refragment_v4_keeps_df_and_sets_mf_on_all_but_the_last() {
    let o = IpOpts {
        dont_fragment: true,
        id: 0x7777,
        ..IpOpts::default()
    };
    let whole = build::udp(ip("10.0.0.1"), ip("10.0.0.2"), 1, 2, &[7; 4000], &o);
    let frags = refrag(&whole, 1500, 0).unwrap();
    assert_eq!(frags.len(), 3);
    let mut next_offset = 0;
    for (i, f) in frags.iter().enumerate() {
        let p = parse(&f.data, 0).unwrap();
        assert!(p.dont_fragment);
        let frag = p.frag.unwrap();
        assert_eq!(frag.id, 0x7777);
        assert_eq!(frag.more, i < 2);
        assert_eq!(usize::from(frag.offset), next_offset);
        next_offset += p.ip_end - p.l4_off;
        assert_eq!(p.ip_len(), f.data.len() - ETH, "total length right");
    }
    assert_eq!(next_offset, 4008);
}

#[test]
fn test_refragment_refuses_an_mtu_that_cannot_carry_8_bytes() {
    let v4 = udp_frame(false, 100, 1);
    assert_eq!(refrag(&v4, 27, 0).unwrap_err(), DropReason::MtuTooSmall);
    assert_eq!(check_and_reassemble(&refrag(&v4, 28, 0).unwrap(), 28), v4);
    let v6 = udp_frame(true, 100, 1);
    assert_eq!(refrag(&v6, 55, 1).unwrap_err(), DropReason::MtuTooSmall);
    assert_eq!(check_and_reassemble(&refrag(&v6, 56, 1).unwrap(), 56), v6);
}

#[test]
fn test_refragment_v6_repeats_hop_by_hop_and_routing_in_every_fragment() {
    // HBH, dest-opts before routing, routing, dest-opts after routing, UDP.
    let whole = with_v6_ext(
        &udp_frame(true, 3000, 1),
        &[(0, 8), (60, 8), (43, 16), (60, 16)],
    );
    let frags = refrag(&whole, 1280, 9).unwrap();
    for (i, f) in frags.iter().enumerate() {
        let p = parse(&f.data, 0).unwrap();
        assert_eq!(p.frag_hdr_off, ETH + 72, "fragment {i}");
        // The unfragmentable part is repeated as is, except the routing header's next header.
        assert_eq!(&f.data[ETH..ETH + 4], &whole[ETH..ETH + 4]);
        assert_eq!(&f.data[ETH + 6..ETH + 56], &whole[ETH + 6..ETH + 56]);
        assert_eq!(&f.data[ETH + 57..ETH + 72], &whole[ETH + 57..ETH + 72]);
        assert_eq!(f.data[ETH + 56], 44);
        assert_eq!(f.data[ETH + 72], 60, "fragment header names the dest-opts");
    }
    assert_eq!(check_and_reassemble(&frags, 1280), whole);
}

#[test]
fn test_refragment_v6_uses_frag_id_or_derives_one_deterministically() {
    let whole = udp_frame(true, 3000, 1);
    let ids = |frags: &[Packet]| -> Vec<u32> {
        frags
            .iter()
            .map(|f| parse(&f.data, 0).unwrap().frag.unwrap().id)
            .collect()
    };
    assert_eq!(ids(&refrag(&whole, 1280, 0xabcd).unwrap()), [0xabcd; 3]);
    let a = ids(&refrag(&whole, 1280, 0).unwrap());
    let b = ids(&refrag(&whole, 1280, 0).unwrap());
    assert_eq!(a, b);
    assert!(a[0] != 0 && a.iter().all(|&id| id == a[0]));
}

#[test]
fn test_refragment_leaves_a_packet_that_fits_alone() {
    let whole = udp_frame(false, 1000, 1);
    let mut padded = whole.clone();
    padded.extend_from_slice(&[0; 4]);
    let out = refrag(&padded, 1500, 5).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].data, whole);
    assert_eq!((out[0].meta.mru, out[0].meta.frag_id), (0, 0));
}

#[test]
fn test_refragment_keeps_l2_header_vlan_and_meta() {
    let plain = udp_frame(false, 3000, 1);
    let mut whole = plain[..12].to_vec();
    whole.extend_from_slice(&[0x81, 0x00, 0x00, 0x2a]);
    whole.extend_from_slice(&plain[12..]);
    let (mut p, parsed) = packet(&whole, 3, 99);
    p.meta.in_port = 4;
    p.meta.mru = 1400;
    p.meta.frag_id = 1;
    let mut out = Vec::new();
    refragment(&p, &parsed, 1400, &mut out).unwrap();
    for f in &out {
        assert_eq!(&f.data[..18], &whole[..18]);
        assert_eq!((f.meta.in_port, f.meta.time_ns, f.meta.zone), (4, 99, 3));
        assert_eq!((f.meta.mru, f.meta.frag_id), (0, 0));
    }
    assert_eq!(check_and_reassemble(&out, 1400), whole);
}

// ---------------------------------------------------------------- properties

mod props {
    use proptest::prelude::*;

    use super::*;

    /// A small deterministic generator, so that one seed drives shuffles and picks.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// A whole frame, its hand-cut fragments and their data ranges.
    type Cut = (Vec<u8>, Vec<Vec<u8>>, Vec<(usize, usize)>);

    /// The datagram, its hand-cut fragments and their data ranges.
    fn datagram(v6: bool, len: usize, unit: usize) -> Cut {
        let whole = udp_frame(v6, len, (len % 251) as u8 as u16);
        let ranges = pieces(len + 8, unit * 8);
        let frags = cut(v6, &whole, &ranges, 0x0102_0304);
        (whole, frags, ranges)
    }

    fn shuffled(n: usize, rng: &mut Rng) -> Vec<usize> {
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, rng.below(i + 1));
        }
        order
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn prop_any_permutation_and_duplication_reassembles_exactly(
            v6 in any::<bool>(),
            len in 1usize..9000,
            unit in 1usize..200,
            seed in 1u64..u64::MAX,
            dups in 0usize..8,
        ) {
            let (whole, frags, _) = datagram(v6, len, unit);
            prop_assume!(frags.len() > 1 && frags.len() <= Config::MAX_FRAGMENTS_PER_DATAGRAM);
            let mut rng = Rng(seed);
            let mut order = shuffled(frags.len(), &mut rng);
            // Duplicates of anything but the fragment that completes, anywhere before it.
            let last = order.pop().unwrap();
            for _ in 0..dups {
                let dup = order[rng.below(order.len())];
                let at = rng.below(order.len() + 1);
                order.insert(at, dup);
            }
            order.push(last);
            let (mut r, mut d) = reassembler(small_min());
            for (n, &i) in order.iter().enumerate() {
                match feed(&mut r, &frags[i], 5, n as u64, &mut d) {
                    Outcome::Held => prop_assert!(n + 1 < order.len()),
                    Outcome::Complete(p, parsed) => {
                        prop_assert_eq!(n + 1, order.len());
                        prop_assert_eq!(&p.data, &whole);
                        prop_assert_eq!(parsed.key, parse(&whole, 5).unwrap().key);
                        prop_assert_eq!((parsed.key.src_port, parsed.key.dst_port), (4000, 53));
                    }
                    Outcome::Dropped(reason) => prop_assert!(false, "dropped: {}", reason),
                }
            }
            prop_assert_eq!(d.total(), 0);
            prop_assert_eq!((r.held_datagrams(), r.held_bytes()), (0, 0));
            let s = if v6 { r.stats().v6 } else { r.stats().v4 };
            prop_assert_eq!(s.duplicates, dups as u64);
        }

        #[test]
        fn prop_a_set_with_an_overlap_never_delivers(
            v6 in any::<bool>(),
            len in 16usize..9000,
            unit in 1usize..200,
            seed in 1u64..u64::MAX,
        ) {
            let (whole, frags, ranges) = datagram(v6, len, unit);
            prop_assume!(frags.len() > 1);
            let total = len + 8;
            let mut rng = Rng(seed);
            // A range on 8-byte boundaries that is not one of the pieces.
            let a = rng.below(total.div_ceil(8)) * 8;
            let b = (a + 8 * (1 + rng.below(400))).min(total);
            prop_assume!(a < b && !ranges.contains(&(a, b)) && (a, b) != (0, total));
            let evil = cut(v6, &whole, &[(a, b)], 0x0102_0304);
            let mut order = shuffled(frags.len(), &mut rng);
            let at = rng.below(order.len());
            order.insert(at, usize::MAX);
            let (mut r, mut d) = reassembler(small_min());
            // The odd range may tile exactly with what came before it (e.g. it covers the
            // two last pieces at once): then the datagram legitimately completes before any
            // overlap was seen. Once an overlap arrived, nothing may complete.
            let mut seen: Vec<(usize, usize)> = Vec::new();
            let mut overlapped = false;
            for &i in &order {
                let (f, range) = if i == usize::MAX { (&evil[0], (a, b)) } else { (&frags[i], ranges[i]) };
                overlapped |= seen.iter().any(|&(x, y)| x < range.1 && range.0 < y && (x, y) != range);
                seen.push(range);
                let o = feed(&mut r, f, 0, 0, &mut d);
                if overlapped {
                    prop_assert!(!matches!(o, Outcome::Complete(..)), "delivered despite an overlap");
                } else if matches!(o, Outcome::Complete(..)) {
                    break;
                }
            }
            prop_assert_eq!(r.held_bytes(), 0);
        }

        #[test]
        fn prop_random_bytes_and_truncations_never_panic(
            v6 in any::<bool>(),
            len in 1usize..3000,
            cut in 0usize..3100,
            flips in proptest::collection::vec((0usize..3100, any::<u8>()), 0..6),
            noise in proptest::collection::vec(any::<u8>(), 0..200),
            max in 0usize..2000,
        ) {
            let (_, frags, _) = datagram(v6, len, 50);
            let (mut r, mut d) = reassembler(small_min());
            let mut inputs: Vec<Vec<u8>> = Vec::new();
            for f in &frags {
                let mut g = f.clone();
                for &(at, x) in &flips {
                    if let Some(b) = g.get_mut(at) {
                        *b ^= x;
                    }
                }
                if v6 || g.len() < ETH + 20 {
                } else {
                    // Keep the IPv4 checksum right so mutations get past the parser.
                    let ihl = usize::from(g[ETH] & 0x0f) * 4;
                    if ihl >= 20 && ETH + ihl <= g.len() {
                        crate::wire::checksum::set_ipv4_header(&mut g[ETH..ETH + ihl]);
                    }
                }
                g.truncate(cut.max(ETH));
                inputs.push(g);
            }
            let mut junk = frags[0][..ETH.min(frags[0].len())].to_vec();
            junk.extend_from_slice(&noise);
            inputs.push(junk);
            for g in &inputs {
                let Ok(parsed) = parse(g, 0) else { continue };
                let mut out = Vec::new();
                let _ = refragment(&Packet::new(g.clone(), 0, 0), &parsed, max, &mut out);
                if parsed.frag.is_some() {
                    let _ = r.process(Packet::new(g.clone(), 0, 0), &parsed, &mut d);
                    // A Parsed that does not describe the packet must not panic either.
                    let short = g[..g.len() / 2].to_vec();
                    let _ = r.process(Packet::new(short, 0, 0), &parsed, &mut d);
                }
            }
            r.expire(u64::MAX, usize::MAX, &mut d);
            prop_assert_eq!((r.held_datagrams(), r.held_bytes()), (0, 0));
        }
    }
}
