//! Conntrack tests: whole packets built with `wire::build`, parsed, and run through
//! `process` and `commit` as the pipeline does.

use std::net::IpAddr;

use super::*;
use crate::flow::Addr;
use crate::packet::Packet;
use crate::wire::build::{self, IpOpts, tcp_flags::*};
use crate::wire::parse;

pub(super) use crate::test_frames::ip;

pub(super) const S: u64 = 1_000_000_000;

/// A frame as the pipeline hands it to conntrack.
pub(super) struct Pkt {
    pub pkt: Packet,
    pub parsed: Parsed,
}

pub(super) fn pkt_in(frame: Vec<u8>, zone: u16) -> Pkt {
    let parsed = parse(&frame, zone).unwrap();
    let mut pkt = Packet::new(frame, 0, 0);
    pkt.meta.zone = zone;
    Pkt { pkt, parsed }
}

pub(super) fn udp(src: &str, sport: u16, dst: &str, dport: u16) -> Pkt {
    pkt_in(
        build::udp(ip(src), ip(dst), sport, dport, b"data", &IpOpts::default()),
        0,
    )
}

#[allow(clippy::too_many_arguments)]
pub(super) fn tcp(
    src: &str,
    sport: u16,
    dst: &str,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    len: usize,
) -> Pkt {
    pkt_in(
        build::tcp(
            ip(src),
            ip(dst),
            sport,
            dport,
            seq,
            ack,
            flags,
            &vec![0x55; len],
            &IpOpts::default(),
        ),
        0,
    )
}

pub(super) fn ping(src: &str, dst: &str, id: u16) -> Pkt {
    pkt_in(
        build::echo_request(ip(src), ip(dst), id, 1, b"ping", &IpOpts::default()),
        0,
    )
}

/// An echo reply: an echo request with its type changed (and checksum fixed).
pub(super) fn pong(src: &str, dst: &str, id: u16) -> Pkt {
    let mut f = build::echo_request(ip(src), ip(dst), id, 1, b"ping", &IpOpts::default());
    let p = parse(&f, 0).unwrap();
    let (ty, sum) = if p.l3 == crate::wire::L3::Ipv4 {
        (0u8, 8u16 << 8)
    } else {
        (129u8, 1u16 << 8)
    };
    let l4 = p.l4_off;
    let old = u16::from_be_bytes([f[l4], f[l4 + 1]]);
    f[l4] = ty;
    let c = u16::from_be_bytes([f[l4 + 2], f[l4 + 3]]);
    let c = crate::wire::checksum::update16(c, old, old.wrapping_sub(sum));
    f[l4 + 2..l4 + 4].copy_from_slice(&c.to_be_bytes());
    pkt_in(f, 0)
}

/// Runs a packet through process and, when NEW, commit.
pub(super) fn run(ct: &mut Conntrack, p: &mut Pkt, nat: Option<&Nat>, now: u64) -> CtResult {
    let mut r = ct.process(&mut p.pkt, &mut p.parsed, nat, now).unwrap();
    if let Some(pending) = r.pending.take() {
        r.entry = Some(ct.commit(pending, now).unwrap());
    }
    ct.check();
    r
}

/// Runs a packet built for the purpose through process and commit, without NAT.
pub(super) fn step(ct: &mut Conntrack, mut p: Pkt, now: u64) -> CtResult {
    run(ct, &mut p, None, now)
}

/// A table with the default configuration but for its timeouts.
pub(super) fn with_timeouts(timeouts: Timeouts) -> Conntrack {
    Conntrack::new(Config {
        timeouts,
        ..Config::default()
    })
}

fn ct() -> Conntrack {
    Conntrack::new(Config::default())
}

#[test]
fn udp_first_packet_is_new_and_inserted_only_by_commit() {
    let mut ct = ct();
    let mut p = udp("10.0.0.1", 4000, "10.0.0.2", 53);
    let r = ct.process(&mut p.pkt, &mut p.parsed, None, 0).unwrap();
    assert_eq!(r.state, CtState::New);
    assert!(r.entry.is_none());
    assert!(ct.is_empty(), "nothing inserted before commit");
    let pending = r.pending.unwrap();
    assert_eq!(pending.entry().reply(), reverse(&p.parsed.key));
    let id = ct.commit(pending, 0).unwrap();
    assert_eq!(ct.len(), 1);
    assert_eq!(ct.lookup(&p.parsed.key), Some((id, false)));
    assert_eq!(ct.stats().new, 1);
    assert_eq!(ct.stats().inserted, 1);
    ct.check();
}

/// The NAT of a new connection is decided only for a packet that can start one: a TCP
/// RST or SYN-ACK of no connection, or an echo reply, is INVALID without asking.
#[test]
fn nat_is_not_decided_for_a_packet_that_cannot_start_a_connection() {
    for (pickup, mut p) in [
        (true, tcp("10.0.0.1", 4000, "10.0.0.2", 80, 1, 0, RST, 0)),
        (
            true,
            tcp("10.0.0.1", 4000, "10.0.0.2", 80, 1, 1, SYN | ACK, 0),
        ),
        (true, pong("10.0.0.1", "10.0.0.2", 7)),
        (false, tcp("10.0.0.1", 4000, "10.0.0.2", 80, 1, 1, ACK, 0)),
    ] {
        let mut ct = Conntrack::new(Config {
            tcp_pickup: pickup,
            ..Config::default()
        });
        let r = ct.begin(&mut p.pkt, &mut p.parsed, 0).unwrap();
        assert!(
            matches!(&r, Begin::Tracked(r) if r.state == CtState::Invalid),
            "{:?}: {r:?}",
            p.parsed.key
        );
    }
    let mut ct = ct();
    let mut p = tcp("10.0.0.1", 4000, "10.0.0.2", 80, 1, 0, SYN, 0);
    let Begin::Starts(s) = ct.begin(&mut p.pkt, &mut p.parsed, 0).unwrap() else {
        panic!("a SYN can start a connection");
    };
    let r = ct.start(s, &mut p.pkt, &mut p.parsed, None, 0).unwrap();
    assert_eq!(r.state, CtState::New);
}

#[test]
fn entry_is_found_from_both_directions() {
    let mut ct = ct();
    let r = step(&mut ct, udp("10.0.0.1", 4000, "10.0.0.2", 53), 0);
    let id = r.entry.unwrap();
    let r = step(&mut ct, udp("10.0.0.2", 53, "10.0.0.1", 4000), S);
    assert_eq!(
        (r.state, r.reply, r.entry),
        (CtState::Established, true, Some(id))
    );
    let r = step(&mut ct, udp("10.0.0.1", 4000, "10.0.0.2", 53), 2 * S);
    assert_eq!(
        (r.state, r.reply, r.entry),
        (CtState::Established, false, Some(id))
    );
    let e = ct.get(id).unwrap();
    assert_eq!(e.packets(), [2, 1]);
    assert_eq!(e.first_seen_ns, 0);
    assert_eq!(e.last_seen_ns, 2 * S);
    assert_eq!(ct.len(), 1);
}

#[test]
fn same_tuple_in_two_zones_is_two_entries() {
    let mut ct = ct();
    let mut a = udp("10.0.0.1", 4000, "10.0.0.2", 53);
    let f = a.pkt.data.clone();
    let mut b = pkt_in(f, 7);
    let ra = run(&mut ct, &mut a, None, 0);
    let rb = run(&mut ct, &mut b, None, 0);
    assert_eq!((ra.state, rb.state), (CtState::New, CtState::New));
    assert_ne!(ra.entry, rb.entry);
    assert_eq!(ct.len(), 2);
    assert_eq!(ct.get(rb.entry.unwrap()).unwrap().zone(), 7);
}

#[test]
fn udp_unreplied_replied_assured_have_their_own_timeouts() {
    let t = Timeouts {
        udp_unreplied_ns: 10 * S,
        udp_replied_ns: 20 * S,
        udp_assured_ns: 300 * S,
        ..Timeouts::default()
    };
    let mut ct = with_timeouts(t);
    let id = step(&mut ct, udp("10.0.0.1", 1, "10.0.0.2", 2), 0)
        .entry
        .unwrap();
    assert_eq!(ct.get(id).unwrap().timeout_ns(&t), 10 * S);
    step(&mut ct, udp("10.0.0.2", 2, "10.0.0.1", 1), S);
    let e = ct.get(id).unwrap();
    assert!(e.status.has(Status::SEEN_REPLY) && !e.status.has(Status::ASSURED));
    assert_eq!(e.timeout_ns(&t), 20 * S);
    step(&mut ct, udp("10.0.0.1", 1, "10.0.0.2", 2), 3 * S);
    let e = ct.get(id).unwrap();
    assert!(e.status.has(Status::ASSURED));
    assert_eq!(e.timeout_ns(&t), 300 * S);
}

/// glibc's A and AAAA queries from one socket: query, query, reply, reply, all within
/// milliseconds. A lookup, not a stream: it keeps the short timeout and stays
/// unassured (Linux assures only traffic still seen both ways after 2 s).
#[test]
fn udp_dns_exchange_within_two_seconds_is_not_assured() {
    let t = Timeouts {
        udp_replied_ns: 20 * S,
        udp_assured_ns: 300 * S,
        ..Timeouts::default()
    };
    let mut ct = with_timeouts(t);
    let ms = S / 1000;
    let id = step(&mut ct, udp("10.0.0.1", 41000, "10.0.0.9", 53), 0)
        .entry
        .unwrap();
    step(&mut ct, udp("10.0.0.1", 41000, "10.0.0.9", 53), ms);
    step(&mut ct, udp("10.0.0.9", 53, "10.0.0.1", 41000), 5 * ms);
    let r = step(&mut ct, udp("10.0.0.9", 53, "10.0.0.1", 41000), 6 * ms);
    assert_eq!((r.state, r.entry), (CtState::Established, Some(id)));
    let e = ct.get(id).unwrap();
    assert!(e.status.has(Status::SEEN_REPLY));
    assert!(!e.status.has(Status::ASSURED));
    assert_eq!(e.timeout_ns(&t), 20 * S);
    // Exactly 2 s after the first packet is not yet "more than 2 s".
    step(&mut ct, udp("10.0.0.1", 41000, "10.0.0.9", 53), 2 * S);
    assert!(!ct.get(id).unwrap().status.has(Status::ASSURED));
}

/// A UDP stream (seen both ways, still active after 2 s) is assured and gets the
/// stream timeout, whichever direction the packet that crosses 2 s goes.
#[test]
fn udp_stream_active_after_two_seconds_is_assured() {
    let t = Timeouts {
        udp_replied_ns: 20 * S,
        udp_assured_ns: 300 * S,
        ..Timeouts::default()
    };
    let mut ct = with_timeouts(t);
    let id = step(&mut ct, udp("10.0.0.1", 5000, "10.0.0.2", 6000), 0)
        .entry
        .unwrap();
    for i in 1..=4u64 {
        let now = i * S / 2;
        step(&mut ct, udp("10.0.0.2", 6000, "10.0.0.1", 5000), now);
        let e = ct.get(id).unwrap();
        assert!(!e.status.has(Status::ASSURED), "at {now}");
        assert_eq!(e.deadline_ns(&t), now + 20 * S);
    }
    let now = 2 * S + 1;
    step(&mut ct, udp("10.0.0.2", 6000, "10.0.0.1", 5000), now);
    let e = ct.get(id).unwrap();
    assert!(e.status.has(Status::ASSURED));
    assert_eq!(e.deadline_ns(&t), now + 300 * S);
    ct.check();
}

#[test]
fn icmp_echo_reply_matches_request_by_identifier() {
    let mut ct = ct();
    let r = step(&mut ct, ping("10.0.0.1", "10.0.0.2", 0x77), 0);
    assert_eq!(r.state, CtState::New);
    let id = r.entry.unwrap();
    let r = step(&mut ct, pong("10.0.0.2", "10.0.0.1", 0x77), S);
    assert_eq!(
        (r.state, r.reply, r.entry),
        (CtState::Established, true, Some(id))
    );
    // Another identifier is another connection; its reply without request is INVALID.
    let r = step(&mut ct, pong("10.0.0.2", "10.0.0.1", 0x78), S);
    assert_eq!(r.state, CtState::Invalid);
    // ICMPv6 the same way.
    let r = step(&mut ct, ping("fd00::1", "fd00::2", 5), 0);
    let id6 = r.entry.unwrap();
    let r = step(&mut ct, pong("fd00::2", "fd00::1", 5), S);
    assert_eq!(
        (r.state, r.reply, r.entry),
        (CtState::Established, true, Some(id6))
    );
}

#[test]
fn full_table_evicts_oldest_unreplied_first() {
    let mut ct = Conntrack::new(Config {
        max_entries: 3,
        ..Config::default()
    });
    let a = step(&mut ct, udp("10.0.0.1", 1, "10.0.0.9", 53), 0).entry;
    let b = step(&mut ct, udp("10.0.0.2", 1, "10.0.0.9", 53), 1).entry;
    step(&mut ct, udp("10.0.0.9", 53, "10.0.0.1", 1), 2); // a is replied
    let c = step(&mut ct, udp("10.0.0.3", 1, "10.0.0.9", 53), 3).entry;
    let d = step(&mut ct, udp("10.0.0.4", 1, "10.0.0.9", 53), 4).entry;
    assert_eq!(ct.len(), 3);
    assert_eq!(ct.stats().evicted, 1);
    // b was the oldest unreplied: it went, a (replied) stayed.
    let key_b = udp("10.0.0.2", 1, "10.0.0.9", 53).parsed.key;
    assert_eq!(ct.lookup(&key_b), None);
    assert!(ct.get(a.unwrap()).is_some());
    assert!(c.is_some() && d.is_some());
    let _ = b;
}

#[test]
fn full_table_with_nothing_evictable_refuses_and_counts() {
    let mut ct = Conntrack::new(Config {
        max_entries: 1,
        ..Config::default()
    });
    let a = step(&mut ct, udp("10.0.0.1", 1, "10.0.0.9", 53), 0)
        .entry
        .unwrap();
    step(&mut ct, udp("10.0.0.9", 53, "10.0.0.1", 1), 1);
    let mut p = udp("10.0.0.2", 1, "10.0.0.9", 53);
    let r = ct.process(&mut p.pkt, &mut p.parsed, None, 2).unwrap();
    assert_eq!(
        ct.commit(r.pending.unwrap(), 2),
        Err(DropReason::CtTableFull)
    );
    assert_eq!(ct.stats().insert_failed, 1);
    // The established connection goes on.
    let r = step(&mut ct, udp("10.0.0.1", 1, "10.0.0.9", 53), 3);
    assert_eq!((r.state, r.entry), (CtState::Established, Some(a)));
}

#[test]
fn expiry_removes_due_entries_with_bounded_work() {
    let mut ct = ct();
    for i in 0..100u16 {
        step(&mut ct, udp("10.0.0.1", 1000 + i, "10.0.0.2", 53), 0);
    }
    // One connection stays active.
    let keep = step(&mut ct, udp("10.0.0.1", 5000, "10.0.0.2", 53), 0)
        .entry
        .unwrap();
    step(&mut ct, udp("10.0.0.1", 5000, "10.0.0.2", 53), 25 * S);
    assert_eq!(ct.expire(10 * S, 1000), 0, "nothing due yet");
    let now = 32 * S;
    // Ten entries examined: the refreshed one may be among them and is re-filed.
    let first = ct.expire(now, 10);
    assert!((9..=10).contains(&first), "budget bounds the work: {first}");
    ct.check();
    let mut total = first;
    while total < 100 {
        let n = ct.expire(now, 10);
        assert!(n > 0);
        total += n;
        ct.check();
    }
    assert_eq!(ct.len(), 1);
    assert!(
        ct.get(keep).is_some(),
        "refreshed entry re-filed, not removed"
    );
    assert_eq!(ct.stats().expired, 100);
    assert_eq!(ct.expire(60 * S, 1000), 1);
    assert!(ct.is_empty());
    ct.check();
}

#[test]
fn expired_entry_is_not_found_before_it_is_reaped() {
    let mut ct = ct();
    step(&mut ct, udp("10.0.0.1", 1, "10.0.0.2", 2), 0);
    let r = step(&mut ct, udp("10.0.0.2", 2, "10.0.0.1", 1), 31 * S);
    assert_eq!(
        r.state,
        CtState::New,
        "the old entry timed out: this starts a new one"
    );
    let e = ct.get(r.entry.unwrap()).unwrap();
    assert_eq!(e.original().src, ip("10.0.0.2"));
}

#[test]
fn non_ip_and_untracked_icmp_are_untracked() {
    let mut ct = ct();
    // ICMPv6 neighbour solicitation (type 135) is not tracked.
    let mut p = ping("fd00::1", "fd00::2", 1);
    p.parsed.key.dst_port = 135 << 8;
    let r = ct.process(&mut p.pkt, &mut p.parsed, None, 0).unwrap();
    assert_eq!(r.state, CtState::Untracked);
    assert!(ct.is_empty());
}

#[test]
fn size_of_entry_and_memory_per_connection() {
    let entry = std::mem::size_of::<Entry>();
    let slot = std::mem::size_of::<table::Slot>();
    assert_eq!(entry, 176, "Entry is {entry} bytes");
    assert_eq!(
        slot, entry,
        "a slot (entry or free link) is no bigger than an entry"
    );
    let mut ct = ct();
    let n = Config::DEFAULT_MAX_ENTRIES as u32;
    for i in 0..n {
        let a = std::net::Ipv4Addr::from(0x0a00_0000 + i);
        let mut p = pkt_in(
            build::udp(
                IpAddr::V4(a),
                ip("10.96.0.10"),
                40000,
                53,
                b"",
                &IpOpts::default(),
            ),
            0,
        );
        let r = ct.process(&mut p.pkt, &mut p.parsed, None, 0).unwrap();
        ct.commit(r.pending.unwrap(), 0).unwrap();
    }
    assert_eq!(ct.len(), n as usize);
    assert_eq!(ct.table.slab_capacity(), n as usize, "no slab overshoot");
    let per_conn = ct.memory_bytes() / ct.len();
    println!("size_of::<Entry>() = {entry}, bytes per connection at {n} = {per_conn}");
    assert!(per_conn <= 200, "{per_conn} bytes per connection");
}

#[test]
fn small_tables_do_not_preallocate() {
    let mut ct = ct();
    let mut p = udp("10.0.0.1", 1000, "10.0.0.2", 53);
    let r = ct.process(&mut p.pkt, &mut p.parsed, None, 0).unwrap();
    ct.commit(r.pending.unwrap(), 0).unwrap();
    assert!(ct.table.slab_capacity() <= 16);
    assert!(ct.memory_bytes() < 16 * 1024);
}

#[test]
fn slab_stops_at_max_entries() {
    let mut ct = Conntrack::new(Config {
        max_entries: 100,
        ..Config::default()
    });
    for i in 0..300u16 {
        let mut p = udp("10.0.0.1", 1000 + i, "10.0.0.2", 53);
        let r = ct.process(&mut p.pkt, &mut p.parsed, None, 0).unwrap();
        ct.commit(r.pending.unwrap(), 0).unwrap();
    }
    assert_eq!(ct.len(), 100);
    assert_eq!(ct.table.slab_capacity(), 100);
    ct.check();
}

#[test]
fn preallocated_table_never_moves_and_keeps_its_memory_per_connection() {
    let mut ct = Conntrack::new(Config {
        max_entries: 1000,
        ..Config::default()
    });
    ct.preallocate();
    let regions: Vec<(*const u8, usize)> = ct.memory_regions().collect();
    assert_eq!(regions[0].1, 1000 * std::mem::size_of::<table::Slot>());
    assert_eq!(
        ct.memory_bytes(),
        1000 * 176 + 2858 * 8,
        "slab and index (2000 tuples at most 7/10 full) allocated at once"
    );
    for i in 0..1500u16 {
        let mut p = udp("10.0.0.1", 1000 + i, "10.0.0.2", 53);
        let r = ct.process(&mut p.pkt, &mut p.parsed, None, 0).unwrap();
        ct.commit(r.pending.unwrap(), 0).unwrap();
        if i % 7 == 0 {
            let port = Some(1000 + i / 2);
            ct.delete(&Filter {
                port,
                ..Filter::default()
            });
        }
    }
    assert_eq!(ct.len(), 1000, "full: the oldest unreplied evicted");
    assert!(
        ct.memory_regions().eq(regions.iter().copied()),
        "nothing grew"
    );
    ct.check();
}

#[test]
fn prefetch_changes_nothing() {
    let mut ct = ct();
    let mut keys = Vec::new();
    for i in 0..40u16 {
        let mut p = udp("10.0.0.1", 1000 + i, "10.0.0.2", 53);
        keys.push(p.parsed.key);
        if i % 2 == 0 {
            let r = ct.process(&mut p.pkt, &mut p.parsed, None, 0).unwrap();
            ct.commit(r.pending.unwrap(), 0).unwrap();
        }
    }
    ct.prefetch(&keys);
    ct.prefetch(std::iter::empty());
    assert_eq!(ct.len(), 20);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(ct.lookup(k).is_some(), i % 2 == 0);
    }
    ct.check();
}

/// IPv6 tuples with every combination of translated addresses and tunnel peer come back
/// as they went in, with the extra allocation only past three distinct addresses.
#[test]
fn ipv6_tuples_round_trip_through_compact_storage() {
    let (a, b, c, d) = (ip("fd00::1"), ip("fd00::2"), ip("fd00::3"), ip("fd00::4"));
    let key = |src, dst, sport, dport| FlowKey {
        zone: 7,
        src,
        dst,
        proto: proto::UDP,
        src_port: sport,
        dst_port: dport,
    };
    let o = key(a.into(), b.into(), 1000, 53);
    let replies = [
        (key(b.into(), a.into(), 53, 1000), false),
        (key(c.into(), a.into(), 5353, 1000), false),
        (key(b.into(), d.into(), 53, 2000), false),
        (key(c.into(), d.into(), 5353, 2000), true),
    ];
    for (r, more) in replies {
        for peer in [None, Some(ip("192.168.0.9")), Some(ip("fd01::9"))] {
            let mut e = Entry::new(o, r, ProtoState::Udp, 5);
            e.set_tunnel_peer(peer);
            assert_eq!((e.original(), e.reply(), e.tunnel_peer()), (o, r, peer));
            assert!(e.tuple_is(ORIGINAL, &o) && e.tuple_is(REPLY, &r));
            assert!(!e.tuple_is(ORIGINAL, &r) && !e.tuple_is(REPLY, &o));
            let distinct = 2 + usize::from(r.src != b) + usize::from(r.dst != a);
            let places = distinct + usize::from(peer.is_some());
            assert_eq!(e.has_more(), more || places > 3, "{r:?} {peer:?}");
            e.set_tunnel_peer(None);
            assert_eq!((e.original(), e.reply(), e.tunnel_peer()), (o, r, None));
            assert_eq!(e.has_more(), more);
        }
    }
}

#[test]
fn ipv4_tuples_and_peer_round_trip() {
    let o = FlowKey {
        zone: 1,
        src: Addr::from(ip("10.0.0.1")),
        dst: Addr::from(ip("10.96.0.1")),
        proto: proto::TCP,
        src_port: 40000,
        dst_port: 80,
    };
    let r = FlowKey {
        zone: 1,
        src: Addr::from(ip("10.0.1.5")),
        dst: Addr::from(ip("192.168.0.1")),
        proto: proto::TCP,
        src_port: 8080,
        dst_port: 1234,
    };
    let mut e = Entry::new(o, r, ProtoState::Other, 0);
    for peer in [Some(ip("172.16.0.1")), Some(ip("fd00::1")), None] {
        e.set_tunnel_peer(peer);
        assert_eq!((e.original(), e.reply(), e.tunnel_peer()), (o, r, peer));
        assert!(!e.has_more());
    }
    // An IPv6 tuple whose addresses end in the same four bytes is another tuple.
    let v6 = FlowKey {
        src: ip("::10.0.0.1").into(),
        dst: ip("::10.96.0.1").into(),
        ..o
    };
    assert!(!e.tuple_is(ORIGINAL, &v6), "families never match");
}

/// The reply count reads zero until a reply, though its place holds the list links.
#[test]
fn reply_counters_start_at_the_first_reply() {
    let mut ct = ct();
    let mut ids = Vec::new();
    for port in [1000, 1001, 1002] {
        let mut p = udp("10.0.0.1", port, "10.0.0.2", 53);
        let r = ct.process(&mut p.pkt, &mut p.parsed, None, 0).unwrap();
        ids.push(ct.commit(r.pending.unwrap(), 0).unwrap());
    }
    for &id in &ids {
        assert_eq!(ct.get(id).unwrap().packets()[REPLY], 0);
        assert_eq!(ct.get(id).unwrap().bytes()[REPLY], 0);
    }
    let mut p = udp("10.0.0.2", 53, "10.0.0.1", 1001);
    ct.process(&mut p.pkt, &mut p.parsed, None, 1).unwrap();
    let e = ct.get(ids[1]).unwrap();
    assert_eq!(e.packets(), [1, 1]);
    assert_eq!(e.bytes()[REPLY], p.parsed.ip_len() as u64);
    assert_eq!(ct.get(ids[0]).unwrap().packets(), [1, 0]);
    ct.check();
}

// --- TCP

const C: &str = "10.0.0.1";
const V: &str = "10.0.0.2";

/// Client 10.0.0.1:40000 -> server 10.0.0.2:80, ISNs 1000 (client) and 5000 (server),
/// handshake done at t=0..2 ns; returns the entry.
fn handshake(ct: &mut Conntrack) -> EntryId {
    let r = step(ct, tcp(C, 40000, V, 80, 1000, 0, SYN, 0), 0);
    assert_eq!(r.state, CtState::New);
    let id = r.entry.unwrap();
    let r = step(ct, tcp(V, 80, C, 40000, 5000, 1001, SYN | ACK, 0), 1);
    assert_eq!((r.state, r.reply), (CtState::Established, true));
    let r = step(ct, tcp(C, 40000, V, 80, 1001, 5001, ACK, 0), 2);
    assert_eq!(r.state, CtState::Established);
    id
}

/// A Service's backend, which connections to `V`:80 are translated to (port 8080).
const BACKEND: &str = "10.244.1.5";

/// The NAT of a connection to the backend.
fn to_backend() -> Nat {
    Nat {
        dnat: Some((Addr::from(ip(BACKEND)), Some(8080))),
        snat: None,
    }
}

/// The handshake of `handshake`, translated to the backend.
fn handshake_to_backend(ct: &mut Conntrack) -> EntryId {
    let id = run(
        ct,
        &mut tcp(C, 40000, V, 80, 1000, 0, SYN, 0),
        Some(&to_backend()),
        0,
    )
    .entry
    .unwrap();
    step(
        ct,
        tcp(BACKEND, 8080, C, 40000, 5000, 1001, SYN | ACK, 0),
        1,
    );
    step(ct, tcp(C, 40000, V, 80, 1001, 5001, ACK, 0), 2);
    id
}

fn tcp_state(ct: &Conntrack, id: EntryId) -> TcpState {
    ct.get(id).unwrap().tcp_state().unwrap()
}

#[test]
fn tcp_handshake_reaches_established_and_assured() {
    let mut ct = ct();
    let id = handshake(&mut ct);
    let e = ct.get(id).unwrap();
    assert_eq!(e.tcp_state(), Some(TcpState::Established));
    assert!(e.status.has(Status::ASSURED | Status::SEEN_REPLY));
    assert_eq!(
        e.timeout_ns(&ct.config().timeouts),
        Timeouts::default().tcp_established_ns
    );
}

/// Data its receiver never acknowledged (a peer that vanished with data in flight) caps
/// an established connection's timeout at `tcp_unacknowledged_ns` from the packet that
/// carried it; once all of it is acknowledged, the full timeout is back.
#[test]
fn tcp_unacknowledged_data_caps_the_timeout_until_it_is_acknowledged() {
    let mut ct = ct();
    let t = ct.config().timeouts;
    assert_eq!(t.tcp_unacknowledged_ns, 300 * S);
    let id = handshake(&mut ct);
    let deadline = |ct: &Conntrack| ct.get(id).unwrap().deadline_ns(&t);
    assert_eq!(deadline(&ct), 2 + t.tcp_established_ns);
    let now = 10 * S;
    let r = step(
        &mut ct,
        tcp(C, 40000, V, 80, 1001, 5001, ACK | PSH, 100),
        now,
    );
    assert_eq!(r.state, CtState::Established);
    assert_eq!(deadline(&ct), now + 300 * S);
    step(&mut ct, tcp(V, 80, C, 40000, 5001, 1051, ACK, 0), now + S);
    assert_eq!(deadline(&ct), now + S + 300 * S, "half of it acknowledged");
    step(
        &mut ct,
        tcp(V, 80, C, 40000, 5001, 1101, ACK, 0),
        now + 2 * S,
    );
    assert_eq!(deadline(&ct), now + 2 * S + t.tcp_established_ns);
    // Filed in the wheel for the shorter deadline, the entry is filed again, not removed.
    assert_eq!(ct.expire(now + 2 * S + 301 * S, 100), 0);
    assert_eq!(tcp_state(&ct, id), TcpState::Established);
    // The server's answer never acknowledged (the client went away): gone after 300 s,
    // still ESTABLISHED.
    let later = now + 400 * S;
    step(
        &mut ct,
        tcp(V, 80, C, 40000, 5001, 1101, ACK | PSH, 200),
        later,
    );
    assert_eq!(ct.expire(later + 299 * S, 100), 0);
    assert_eq!(ct.expire(later + 301 * S, 100), 1);
    assert!(ct.is_empty());
    ct.check();
}

/// Data that becomes unacknowledged brings a TCP entry's deadline no earlier than where
/// the expiry wheel files it: requests and their answers do not move the entry there.
#[test]
fn tcp_unacknowledged_data_does_not_move_the_entry_in_the_wheel() {
    let mut ct = ct();
    let id = handshake(&mut ct);
    let slot = ct.table.wheel_slot(id);
    assert!(slot.is_some());
    for i in 0..3u32 {
        let now = (10 + u64::from(i)) * S;
        let (c, v) = (1001 + 100 * i, 5001 + 200 * i);
        step(&mut ct, tcp(C, 40000, V, 80, c, v, ACK | PSH, 100), now);
        step(
            &mut ct,
            tcp(V, 80, C, 40000, v, c + 100, ACK | PSH, 200),
            now + 1,
        );
        step(
            &mut ct,
            tcp(C, 40000, V, 80, c + 100, v + 200, ACK, 0),
            now + 2,
        );
        assert_eq!(ct.table.wheel_slot(id), slot, "round {i}");
    }
    let ProtoState::Tcp(c) = ct.get(id).unwrap().proto_state else {
        unreachable!()
    };
    assert!(!c.unacknowledged());
}

#[test]
fn tcp_out_of_window_packet_is_invalid_and_leaves_entry_unchanged() {
    let mut ct = ct();
    let id = handshake(&mut ct);
    let before = ct.get(id).unwrap().clone();
    // Far beyond anything the server allowed.
    let r = step(
        &mut ct,
        tcp(C, 40000, V, 80, 1001 + 3_000_000, 5001, ACK, 10),
        3,
    );
    assert_eq!((r.state, r.entry), (CtState::Invalid, Some(id)));
    // Acknowledging data the server never sent.
    let r = step(&mut ct, tcp(C, 40000, V, 80, 1001, 900_000, ACK, 0), 4);
    assert_eq!(r.state, CtState::Invalid);
    assert_eq!(
        ct.get(id).unwrap(),
        &before,
        "entry untouched, counters included"
    );
    assert_eq!(ct.stats().invalid, 2);
}

/// An RST out of window, or behind what its receiver acknowledged, is INVALID and
/// changes nothing; one at the exact sequence number closes the connection.
#[test]
fn tcp_rst_out_of_window_is_invalid_and_at_the_exact_sequence_closes() {
    let mut ct = ct();
    let id = handshake(&mut ct);
    let before = ct.get(id).unwrap().clone();
    for seq in [5001 + 2_000_000_000, 4001] {
        let r = step(&mut ct, tcp(V, 80, C, 40000, seq, 0, RST, 0), 3);
        assert_eq!(
            (r.state, r.entry),
            (CtState::Invalid, Some(id)),
            "seq {seq}"
        );
        assert_eq!(ct.get(id).unwrap(), &before, "seq {seq}");
    }
    let r = step(&mut ct, tcp(V, 80, C, 40000, 5001, 0, RST, 0), 4);
    assert_eq!(r.state, CtState::Established);
    assert_eq!(tcp_state(&ct, id), TcpState::Close);
    // CLOSE lasts 10 s: the entry is re-filed earlier in the wheel and expires on time.
    assert_eq!(ct.expire(4 + 9 * S, 100), 0);
    assert_eq!(ct.expire(4 + 12 * S, 100), 1);
    assert!(ct.is_empty());
}

/// RFC 5961 as in Linux: an RST in window but off the exact sequence number passes, so
/// that its receiver can send its challenge ACK, and the connection stays ESTABLISHED
/// with CLOSE's timeout until that ACK brings its own back; the sender, if really gone,
/// answers the challenge ACK with an RST at the exact number, which closes.
#[test]
fn tcp_rst_off_the_exact_sequence_keeps_the_connection_for_the_challenge_ack() {
    let mut ct = ct();
    let t = ct.config().timeouts;
    let id = handshake_to_backend(&mut ct);
    let before = ct.get(id).unwrap().proto_state;
    let now = 5 * S;
    let mut rst = tcp("10.244.1.5", 8080, C, 40000, 6001, 1001, RST | ACK, 0);
    let r = run(&mut ct, &mut rst, None, now);
    assert_eq!(
        (r.state, r.reply, r.entry),
        (CtState::Established, true, Some(id)),
        "let through"
    );
    assert_eq!(rst.parsed.key.src, Addr::from(ip(V)), "translated back");
    assert_eq!(tcp_state(&ct, id), TcpState::Established);
    assert_eq!(ct.get(id).unwrap().deadline_ns(&t), now + t.tcp_close_ns);
    // The client's challenge ACK: the full timeout again, the connection as it was.
    let r = step(&mut ct, tcp(C, 40000, V, 80, 1001, 5001, ACK, 0), now + S);
    assert_eq!(r.state, CtState::Established);
    assert_eq!(
        ct.get(id).unwrap().deadline_ns(&t),
        now + S + t.tcp_established_ns
    );
    assert_eq!(ct.get(id).unwrap().proto_state, before);
    // Not followed by anything, a kept RST leaves the entry for CLOSE's 10 s only.
    let later = now + 2 * S;
    step(
        &mut ct,
        tcp("10.244.1.5", 8080, C, 40000, 6001, 0, RST, 0),
        later,
    );
    assert_eq!(ct.expire(later + 9 * S, 100), 0);
    assert_eq!(tcp_state(&ct, id), TcpState::Established);
    // The exact number closes.
    step(
        &mut ct,
        tcp("10.244.1.5", 8080, C, 40000, 5001, 0, RST, 0),
        later + 9 * S,
    );
    assert_eq!(tcp_state(&ct, id), TcpState::Close);
    assert_eq!(ct.expire(later + 20 * S, 100), 1);
    assert!(ct.is_empty());
    ct.check();
}

/// A kept RST that nothing follows: the entry goes after CLOSE's timeout, still
/// ESTABLISHED.
#[test]
fn tcp_rst_kept_and_unanswered_expires_after_the_close_timeout() {
    let mut ct = ct();
    let id = handshake(&mut ct);
    let now = 5 * S;
    let r = step(&mut ct, tcp(V, 80, C, 40000, 6001, 0, RST, 0), now);
    assert_eq!((r.state, r.entry), (CtState::Established, Some(id)));
    assert_eq!(tcp_state(&ct, id), TcpState::Established);
    assert_eq!(ct.expire(now + 9 * S, 100), 0);
    assert_eq!(ct.expire(now + 12 * S, 100), 1);
    assert!(ct.is_empty());
}

/// A SYN retransmitted before any reply does not renew the entry (as in Linux: else a
/// client or NAT reusing the port could keep it, and its NAT, alive forever).
#[test]
fn tcp_syn_retransmitted_in_syn_sent_does_not_renew_the_timeout() {
    let mut ct = ct();
    let t = ct.config().timeouts;
    let id = step(&mut ct, tcp(C, 40000, V, 80, 1000, 0, SYN, 0), 0)
        .entry
        .unwrap();
    for now in [S, 60 * S, 119 * S] {
        let r = step(&mut ct, tcp(C, 40000, V, 80, 1000, 0, SYN, 0), now);
        assert_eq!((r.state, r.entry), (CtState::Established, Some(id)));
        assert_eq!(tcp_state(&ct, id), TcpState::SynSent);
        assert_eq!(ct.get(id).unwrap().deadline_ns(&t), 120 * S, "at {now}");
    }
    let r = step(&mut ct, tcp(C, 40000, V, 80, 1000, 0, SYN, 0), 120 * S);
    assert_eq!(r.state, CtState::New, "the first SYN's timeout passed");
    assert_eq!(ct.stats().expired, 1);
}

/// An RST as the only answer to a SYN ends the connection at once (Linux kills it), yet
/// the RST itself is translated and its entry is still there for the stages after
/// conntrack (its tunnel peer routes the RST back); the next packet of the tuple finds
/// nothing, and expiry reaps the entry without waiting out CLOSE.
#[test]
fn tcp_rst_as_the_only_reply_removes_the_entry_at_once() {
    let mut ct = ct();
    let nat = to_backend();
    let t0 = 20 * S;
    let id = run(
        &mut ct,
        &mut tcp(C, 40000, V, 80, 1000, 0, SYN, 0),
        Some(&nat),
        t0,
    )
    .entry
    .unwrap();
    ct.get_mut(id)
        .unwrap()
        .set_tunnel_peer(Some(ip("192.168.0.7")));
    let mut rst = tcp("10.244.1.5", 8080, C, 40000, 0, 1001, RST | ACK, 0);
    let r = run(&mut ct, &mut rst, None, t0 + S);
    assert_eq!(
        (r.state, r.reply, r.entry),
        (CtState::Established, true, Some(id))
    );
    assert_eq!(rst.parsed.key.src, Addr::from(ip(V)), "translated back");
    assert_eq!(
        ct.get(id).and_then(|e| e.tunnel_peer()),
        Some(ip("192.168.0.7")),
        "still readable for this packet"
    );
    // Gone for the next packet: the client's next SYN starts afresh.
    let r = run(
        &mut ct,
        &mut tcp(C, 40000, V, 80, 5000, 0, SYN, 0),
        Some(&nat),
        t0 + S,
    );
    assert_eq!(r.state, CtState::New);
    assert_eq!(ct.stats().expired, 1);
    assert_eq!(ct.len(), 1);
    // Unanswered, then reset by the client itself: due at once as well, and reaped by
    // the next expiry pass.
    let again = r.entry.unwrap();
    let t = ct.config().timeouts;
    let now = t0 + 2 * S;
    step(&mut ct, tcp(C, 40000, V, 80, 5001, 0, RST, 0), now);
    assert_eq!(ct.get(again).unwrap().deadline_ns(&t), now);
    assert_eq!(ct.expire(now + 2 * S, 100), 1);
    assert!(ct.is_empty());
    ct.check();
}

#[test]
fn tcp_syn_on_established_passes_without_state_change() {
    let mut ct = ct();
    let id = handshake(&mut ct);
    let before = ct.get(id).unwrap().proto_state;
    // The client restarted and reuses the port with a new ISN: its SYN must reach the
    // server so that the challenge ACK comes back.
    let r = step(&mut ct, tcp(C, 40000, V, 80, 77_000_000, 0, SYN, 0), 3);
    assert_eq!((r.state, r.entry), (CtState::Established, Some(id)));
    assert_eq!(ct.get(id).unwrap().proto_state, before);
    let r = step(&mut ct, tcp(V, 80, C, 40000, 5001, 1001, ACK, 0), 4);
    assert_eq!(
        r.state,
        CtState::Established,
        "the challenge ACK goes through"
    );
}

/// The SYN of a client that reuses the port, but the server still has the old
/// connection: it answers with a challenge ACK (RFC 5961), which passes and leaves the
/// old connection ESTABLISHED, as does a SYN-ACK that does not acknowledge that SYN. The
/// ignored segments change nothing in the entry.
#[test]
fn tcp_challenge_ack_to_an_ignored_syn_keeps_the_old_connection() {
    let mut ct = ct();
    let id = handshake(&mut ct);
    let before = ct.get(id).unwrap().clone();
    let r = step(&mut ct, tcp(C, 40000, V, 80, 77_000_000, 0, SYN, 0), 3);
    assert_eq!((r.state, r.entry), (CtState::Established, Some(id)));
    assert_eq!(ct.get(id).unwrap(), &before, "not refreshed, not counted");
    // A late copy of the old SYN-ACK.
    let r = step(&mut ct, tcp(V, 80, C, 40000, 5000, 1001, SYN | ACK, 0), 4);
    assert_eq!((r.state, r.reply), (CtState::Established, true));
    assert_eq!(ct.get(id).unwrap(), &before);
    let r = step(&mut ct, tcp(V, 80, C, 40000, 5001, 1001, ACK, 0), 5);
    assert_eq!(r.state, CtState::Established, "the challenge ACK");
    let r = step(&mut ct, tcp(C, 40000, V, 80, 1001, 5001, ACK | PSH, 100), 6);
    assert_eq!(r.state, CtState::Established);
    assert_eq!(tcp_state(&ct, id), TcpState::Established);
}

/// A client restarted and reuses the tuple of a connection whose ESTABLISHED entry
/// lingers (here to a Service's backend); the server has no socket left for it and
/// answers the new SYN with a SYN-ACK. As in Linux, that SYN-ACK resynchronises the
/// entry: the new connection goes through SYN_RECV to ESTABLISHED, with its NAT, instead
/// of being INVALID until the stale entry times out.
#[test]
fn tcp_syn_ack_answering_an_ignored_syn_restarts_a_stale_connection() {
    let mut ct = ct();
    let backend = BACKEND;
    let id = handshake_to_backend(&mut ct);
    assert_eq!(tcp_state(&ct, id), TcpState::Established);

    let t = 3 * S;
    let mut syn = tcp(C, 40000, V, 80, 77_000_000, 0, SYN, 0);
    let r = run(&mut ct, &mut syn, None, t);
    assert_eq!((r.state, r.entry), (CtState::Established, Some(id)));
    assert_eq!(syn.parsed.key.dst, Addr::from(ip(backend)), "translated");
    assert_eq!(tcp_state(&ct, id), TcpState::Established);
    let mut synack = tcp(backend, 8080, C, 40000, 9_000_000, 77_000_001, SYN | ACK, 0);
    let r = run(&mut ct, &mut synack, None, t + 1);
    assert_eq!((r.state, r.reply), (CtState::Established, true));
    assert_eq!(synack.parsed.key.src, Addr::from(ip(V)), "translated back");
    assert_eq!(tcp_state(&ct, id), TcpState::SynRecv);
    assert_eq!(
        ct.get(id).unwrap().deadline_ns(&ct.config().timeouts),
        t + 1 + Timeouts::default().tcp_syn_recv_ns
    );
    let r = step(
        &mut ct,
        tcp(C, 40000, V, 80, 77_000_001, 9_000_001, ACK, 0),
        t + 2,
    );
    assert_eq!(r.state, CtState::Established);
    assert_eq!(tcp_state(&ct, id), TcpState::Established);
    let r = step(
        &mut ct,
        tcp(C, 40000, V, 80, 77_000_001, 9_000_001, ACK | PSH, 100),
        t + 3,
    );
    assert_eq!(r.state, CtState::Established);
    let r = step(
        &mut ct,
        tcp(backend, 8080, C, 40000, 9_000_001, 77_000_101, ACK, 0),
        t + 4,
    );
    assert_eq!(r.state, CtState::Established);
    let ProtoState::Tcp(c) = ct.get(id).unwrap().proto_state else {
        unreachable!()
    };
    assert_eq!(c.end, [77_000_101, 9_000_001]);
    // The old connection's segments are out of window now.
    let r = step(&mut ct, tcp(C, 40000, V, 80, 1001, 5001, ACK, 10), t + 5);
    assert_eq!(r.state, CtState::Invalid);
}

/// A segment let through untracked (a SYN-ACK on an established connection, here one
/// picked up mid-stream that never saw a reply) changes nothing in its entry, as in
/// Linux: no reply seen and not assured (so the entry keeps its short timeout and can
/// still be evicted), not refreshed, not counted.
#[test]
fn tcp_ignored_segment_changes_nothing_in_its_entry() {
    let mut ct = Conntrack::new(Config {
        max_entries: 1,
        ..Config::default()
    });
    let id = step(
        &mut ct,
        tcp(C, 40000, V, 80, 123_456, 654_321, ACK | PSH, 100),
        0,
    )
    .entry
    .unwrap();
    let before = ct.get(id).unwrap().clone();
    let r = step(
        &mut ct,
        tcp(V, 80, C, 40000, 9_000_000, 123_556, SYN | ACK, 0),
        5 * S,
    );
    assert_eq!(
        (r.state, r.reply, r.entry),
        (CtState::Established, true, Some(id))
    );
    assert_eq!(ct.get(id).unwrap(), &before);
    let mut p = tcp(C, 40001, V, 80, 1, 0, SYN, 0);
    let r = ct.process(&mut p.pkt, &mut p.parsed, None, 6 * S).unwrap();
    assert!(
        ct.commit(r.pending.unwrap(), 6 * S).is_ok(),
        "the stale entry is evicted to make room"
    );
    assert_eq!(ct.stats().evicted, 1);
}

/// Corrupts a TCP segment: its checksum no longer matches.
fn corrupt(p: &mut Pkt) {
    p.pkt.data[p.parsed.l4_off + 16] ^= 0x5a;
}

/// A corrupted RST or FIN would end the connection (and a new one could then pick
/// another backend): as in Linux, a segment that can change the state and fails its
/// checksum is INVALID and changes nothing.
#[test]
fn tcp_rst_or_fin_with_a_bad_checksum_is_invalid_and_changes_nothing() {
    let mut ct = ct();
    let id = handshake(&mut ct);
    let before = ct.get(id).unwrap().clone();
    for flags in [RST, RST | ACK, FIN | ACK] {
        let mut p = tcp(V, 80, C, 40000, 5001, 1001, flags, 0);
        corrupt(&mut p);
        let r = run(&mut ct, &mut p, None, 3);
        assert_eq!(
            (r.state, r.entry),
            (CtState::Invalid, Some(id)),
            "flags {flags:#x}"
        );
        assert_eq!(ct.get(id).unwrap(), &before, "flags {flags:#x}");
    }
    assert_eq!(ct.stats().invalid, 3);
    let r = step(&mut ct, tcp(V, 80, C, 40000, 5001, 1001, RST, 0), 4);
    assert_eq!(r.state, CtState::Established, "the same RST intact");
    assert_eq!(tcp_state(&ct, id), TcpState::Close);
}

#[test]
fn tcp_syn_with_a_bad_checksum_creates_nothing() {
    let mut ct = ct();
    for v6 in [false, true] {
        let (c, v) = if v6 { ("fd00::1", "fd00::2") } else { (C, V) };
        let mut p = tcp(c, 40000, v, 80, 1000, 0, SYN, 0);
        corrupt(&mut p);
        let r = run(&mut ct, &mut p, None, 0);
        assert_eq!(r.state, CtState::Invalid);
        assert!(r.pending.is_none() && r.entry.is_none());
    }
    assert!(ct.is_empty());
    assert_eq!((ct.stats().new, ct.stats().invalid), (0, 2));
}

/// Only segments that can change the state are verified: data and ACKs are most of the
/// bytes, and a corrupted one is left for the receiver to drop.
#[test]
fn tcp_data_with_a_bad_checksum_is_not_verified() {
    let mut ct = ct();
    let id = handshake(&mut ct);
    let mut p = tcp(C, 40000, V, 80, 1001, 5001, ACK | PSH, 100);
    corrupt(&mut p);
    let r = run(&mut ct, &mut p, None, 3);
    assert_eq!((r.state, r.entry), (CtState::Established, Some(id)));
    // Nor is the ACK that picks a connection up mid-stream.
    let mut p = tcp(C, 40001, V, 80, 1001, 5001, ACK, 0);
    corrupt(&mut p);
    assert_eq!(run(&mut ct, &mut p, None, 4).state, CtState::New);
}

/// A checksum left to offload by a local sender (`NEEDS_CSUM`: the field holds only the
/// pseudo-header sum) is not verified, as Linux exempts CHECKSUM_PARTIAL; nor is one
/// the virtio-net header says was verified (`DATA_VALID`).
#[test]
fn tcp_rst_with_a_partial_or_verified_checksum_is_accepted() {
    use crate::packet::VnetHdr;
    use crate::wire::checksum;
    for flags in [VnetHdr::F_NEEDS_CSUM, VnetHdr::F_DATA_VALID] {
        let mut ct = ct();
        let id = handshake(&mut ct);
        let mut p = tcp(V, 80, C, 40000, 5001, 1001, RST, 0);
        let (l3, l4) = (p.parsed.l3_off, p.parsed.l4_off);
        let len = p.parsed.ip_end - l4;
        let partial = checksum::fold(checksum::pseudo_header(&p.pkt.data[l3..], false, 6, len));
        p.pkt.data[l4 + 16..l4 + 18].copy_from_slice(&partial.to_be_bytes());
        p.pkt.meta.vnet = VnetHdr {
            flags,
            csum_start: l4 as u16,
            csum_offset: 16,
            ..VnetHdr::default()
        };
        let r = run(&mut ct, &mut p, None, 3);
        assert_eq!(r.state, CtState::Established, "vnet flags {flags}");
        assert_eq!(tcp_state(&ct, id), TcpState::Close);
    }
}

#[test]
fn tcp_new_syn_in_time_wait_or_close_starts_fresh_connection() {
    let mut ct = ct();
    let id = handshake(&mut ct);
    step(&mut ct, tcp(C, 40000, V, 80, 1001, 5001, FIN | ACK, 0), 3);
    step(&mut ct, tcp(V, 80, C, 40000, 5001, 1002, FIN | ACK, 0), 4);
    step(&mut ct, tcp(C, 40000, V, 80, 1002, 5002, ACK, 0), 5);
    assert_eq!(tcp_state(&ct, id), TcpState::TimeWait);
    let r = step(&mut ct, tcp(C, 40000, V, 80, 90_000, 0, SYN, 0), 6);
    assert_eq!(r.state, CtState::New);
    let new = r.entry.unwrap();
    assert_eq!(tcp_state(&ct, new), TcpState::SynSent);
    assert_eq!(ct.len(), 1, "the old entry was replaced");
    assert_eq!(ct.get(new).unwrap().first_seen_ns, 6);
    // After an RST (CLOSE) as well.
    step(&mut ct, tcp(V, 80, C, 40000, 0, 90_001, RST | ACK, 0), 7);
    assert_eq!(tcp_state(&ct, new), TcpState::Close);
    let r = step(&mut ct, tcp(C, 40000, V, 80, 190_000, 0, SYN, 0), 8);
    assert_eq!(r.state, CtState::New);
    assert_eq!(ct.len(), 1);
}

#[test]
fn tcp_midstream_pickup_creates_established_liberal_entry() {
    let mut ct = ct();
    let r = step(
        &mut ct,
        tcp(C, 40000, V, 80, 123_456, 654_321, ACK | PSH, 100),
        0,
    );
    assert_eq!(r.state, CtState::New);
    let id = r.entry.unwrap();
    assert_eq!(tcp_state(&ct, id), TcpState::Established);
    let ProtoState::Tcp(c) = ct.get(id).unwrap().proto_state else {
        unreachable!()
    };
    assert!(c.liberal());
    assert!(!ct.get(id).unwrap().status.has(Status::ASSURED));
    // Not assured yet: the short cap applies instead of 5 days.
    assert_eq!(
        ct.get(id).unwrap().timeout_ns(&ct.config().timeouts),
        300 * S
    );
    let r = step(&mut ct, tcp(V, 80, C, 40000, 654_321, 123_556, ACK, 0), 1);
    assert_eq!((r.state, r.reply), (CtState::Established, true));
    let e = ct.get(id).unwrap();
    let ProtoState::Tcp(c) = e.proto_state else {
        unreachable!()
    };
    assert!(c.liberal(), "still liberal with both directions seen");
    assert!(e.status.has(Status::ASSURED));
    let r = step(&mut ct, tcp(C, 40000, V, 80, 123_556, 654_321, ACK, 10), 2);
    assert_eq!(r.state, CtState::Established);
    let r = step(
        &mut ct,
        tcp(C, 40000, V, 80, 1_500_123_556, 654_321, ACK, 10),
        3,
    );
    // Far off the stream, as Linux lets through on a picked-up connection; the windows
    // do not move for it.
    assert_eq!(r.state, CtState::Established);
    let ProtoState::Tcp(c) = ct.get(id).unwrap().proto_state else {
        unreachable!()
    };
    assert_eq!(c.end[0], 123_566);
}

/// After a restart the first packet seen is a retransmission, and the receiver, which
/// had received more, answers with a duplicate ACK beyond anything seen: the reply must
/// pass, and so must the rest of the stream (Linux keeps a picked-up connection liberal).
#[test]
fn tcp_midstream_pickup_accepts_a_duplicate_ack_beyond_what_was_seen() {
    let mut ct = ct();
    let r = step(
        &mut ct,
        tcp(C, 40000, V, 80, 123_456, 654_321, ACK | PSH, 100),
        0,
    );
    let id = r.entry.unwrap();
    for t in 1..4 {
        let r = step(&mut ct, tcp(V, 80, C, 40000, 654_321, 200_000, ACK, 0), t);
        assert_eq!((r.state, r.reply), (CtState::Established, true), "at {t}");
    }
    let r = step(
        &mut ct,
        tcp(C, 40000, V, 80, 200_000, 654_321, ACK | PSH, 100),
        4,
    );
    assert_eq!(r.state, CtState::Established);
    let r = step(&mut ct, tcp(V, 80, C, 40000, 654_321, 200_100, ACK, 0), 5);
    assert_eq!(r.state, CtState::Established);
    let e = ct.get(id).unwrap();
    assert!(e.status.has(Status::ASSURED));
    let ProtoState::Tcp(c) = e.proto_state else {
        unreachable!()
    };
    assert!(c.liberal(), "liberal for the connection's lifetime");
    assert_eq!(
        c.end,
        [200_100, 654_321],
        "in-window segments still tracked"
    );
}

/// After a restart the picked-up connection knows the client's stream only from a
/// retransmission; the client then aborts, and its RST carries its real next sequence
/// number, well past anything seen: the connection closes all the same.
#[test]
fn tcp_midstream_pickup_closes_on_the_rst_of_an_endpoint_ahead_of_what_was_seen() {
    let mut ct = ct();
    let id = step(
        &mut ct,
        tcp(C, 40000, V, 80, 123_456, 654_321, ACK | PSH, 100),
        0,
    )
    .entry
    .unwrap();
    step(&mut ct, tcp(V, 80, C, 40000, 654_321, 200_000, ACK, 0), 1);
    let r = step(
        &mut ct,
        tcp(C, 40000, V, 80, 200_000, 654_321, RST | ACK, 0),
        2,
    );
    assert_eq!((r.state, r.entry), (CtState::Established, Some(id)));
    assert_eq!(tcp_state(&ct, id), TcpState::Close);
}

#[test]
fn tcp_synack_or_non_syn_without_entry_and_pickup_off_is_invalid() {
    let mut ct = Conntrack::new(Config {
        tcp_pickup: false,
        ..Config::default()
    });
    for flags in [SYN | ACK, ACK, FIN | ACK, RST, ACK | PSH] {
        let r = step(&mut ct, tcp(C, 40000, V, 80, 1, 1, flags, 0), 0);
        assert_eq!(r.state, CtState::Invalid, "flags {flags:#x}");
    }
    // With pickup on, a SYN-ACK, FIN or RST still does not create a connection.
    let mut ct = Conntrack::new(Config::default());
    for flags in [SYN | ACK, FIN | ACK, RST, RST | ACK, SYN | FIN] {
        let r = step(&mut ct, tcp(C, 40000, V, 80, 1, 1, flags, 0), 0);
        assert_eq!(r.state, CtState::Invalid, "flags {flags:#x}");
    }
    assert!(ct.is_empty());
}

#[test]
fn tcp_close_sequence_shortens_timeouts() {
    let mut ct = ct();
    let id = handshake(&mut ct);
    let t = ct.config().timeouts;
    step(&mut ct, tcp(C, 40000, V, 80, 1001, 5001, FIN | ACK, 0), 3);
    assert_eq!(tcp_state(&ct, id), TcpState::FinWait);
    step(&mut ct, tcp(V, 80, C, 40000, 5001, 1002, ACK, 0), 4);
    assert_eq!(tcp_state(&ct, id), TcpState::CloseWait);
    step(&mut ct, tcp(V, 80, C, 40000, 5001, 1002, FIN | ACK, 0), 5);
    assert_eq!(tcp_state(&ct, id), TcpState::LastAck);
    assert_eq!(ct.get(id).unwrap().timeout_ns(&t), t.tcp_last_ack_ns);
    step(&mut ct, tcp(C, 40000, V, 80, 1002, 5002, ACK, 0), 6);
    assert_eq!(tcp_state(&ct, id), TcpState::TimeWait);
    assert_eq!(ct.expire(6 + 119 * S, 100), 0);
    assert_eq!(
        ct.expire(6 + 122 * S, 100),
        1,
        "TIME_WAIT's 120 s, not 5 days"
    );
}

// --- dump, delete, display

fn populated() -> Conntrack {
    let mut ct = ct();
    let nat = to_backend();
    run(
        &mut ct,
        &mut tcp(C, 40000, "10.96.0.10", 80, 1000, 0, SYN, 0),
        Some(&nat),
        0,
    );
    step(&mut ct, udp("10.0.0.3", 5000, "10.0.0.4", 53), 0);
    step(&mut ct, ping("10.0.0.3", "10.0.0.5", 9), 0);
    let mut z7 = udp("10.0.0.3", 5000, "10.0.0.4", 53);
    z7.parsed.key.zone = 7;
    run(&mut ct, &mut z7, None, 0);
    ct
}

fn count(ct: &Conntrack, f: Filter) -> usize {
    ct.dump(&f).count()
}

#[test]
fn dump_filters_by_zone_address_port_protocol_and_state() {
    let ct = populated();
    assert_eq!(count(&ct, Filter::default()), 4);
    let f = Filter::default();
    assert_eq!(count(&ct, Filter { zone: Some(7), ..f }), 1);
    // The backend address appears only in the reply tuple: still selected.
    assert_eq!(
        count(
            &ct,
            Filter {
                addr: Some(ip("10.244.1.5")),
                ..f
            }
        ),
        1
    );
    assert_eq!(
        count(
            &ct,
            Filter {
                addr: Some(ip("10.0.0.3")),
                ..f
            }
        ),
        3
    );
    assert_eq!(
        count(
            &ct,
            Filter {
                port: Some(8080),
                ..f
            }
        ),
        1
    );
    assert_eq!(
        count(
            &ct,
            Filter {
                proto: Some(proto::UDP),
                zone: Some(0),
                ..f
            }
        ),
        1
    );
    assert_eq!(
        count(
            &ct,
            Filter {
                state: Some(TcpState::SynSent),
                ..f
            }
        ),
        1
    );
    assert_eq!(
        count(
            &ct,
            Filter {
                state: Some(TcpState::Established),
                ..f
            }
        ),
        0
    );
}

#[test]
fn delete_by_filter_removes_both_directions_from_the_index() {
    let mut ct = populated();
    let backend = Filter {
        addr: Some(ip("10.244.1.5")),
        ..Filter::default()
    };
    let (id, e) = ct
        .dump(&backend)
        .next()
        .map(|(i, e)| (i, e.clone()))
        .unwrap();
    assert_eq!(ct.delete(&backend), 1);
    ct.check();
    assert!(ct.get(id).is_none());
    assert_eq!(ct.lookup(&e.original()), None);
    assert_eq!(ct.lookup(&e.reply()), None);
    assert_eq!(ct.len(), 3);
    assert_eq!(ct.stats().deleted, 1);
    // A reply of the deleted connection is no longer recognised.
    let r = step(
        &mut ct,
        tcp("10.244.1.5", 8080, C, 40000, 5000, 1001, SYN | ACK, 0),
        1,
    );
    assert_eq!(r.state, CtState::Invalid);
    assert_eq!(ct.delete(&Filter::default()), 3);
    assert!(ct.is_empty());
    ct.check();
}

#[test]
fn retain_removes_rejected_entries_from_every_structure_and_keeps_the_rest() {
    let mut ct = ct();
    // Sixty UDP flows: even ones answered (out of the eviction FIFO), odd ones not.
    for i in 0..60u16 {
        let mut p = udp(C, 10_000 + i, V, 53);
        run(&mut ct, &mut p, None, 0);
        if i % 2 == 0 {
            step(&mut ct, udp(V, 53, C, 10_000 + i), 1);
        }
    }
    let rejected = |e: &Entry| e.original().src_port.is_multiple_of(3);
    let gone: Vec<FlowKey> = ct
        .dump(&Filter::default())
        .filter(|(_, e)| rejected(e))
        .map(|(_, e)| e.reply())
        .collect();
    assert_eq!(ct.retain(|e| !rejected(e)), 20);
    ct.check();
    assert_eq!(ct.len(), 40);
    assert_eq!(ct.stats().deleted, 20);
    for k in &gone {
        assert_eq!(ct.lookup(k), None, "{k} still indexed");
    }
    assert!(ct.dump(&Filter::default()).all(|(_, e)| !rejected(e)));
    // Freed slots are reused and the expiry wheel still reaps everything.
    step(&mut ct, udp(C, 9, V, 53), 2);
    ct.check();
    assert_eq!(ct.expire(3600 * S, 1000), 41);
    assert!(ct.is_empty());
    ct.check();
}

#[test]
fn entry_line_looks_like_conntrack_list() {
    let mut ct = ct();
    let nat = to_backend();
    let id = run(
        &mut ct,
        &mut tcp(C, 40000, "10.96.0.10", 80, 1000, 0, SYN, 0),
        Some(&nat),
        0,
    )
    .entry
    .unwrap();
    let t = ct.config().timeouts;
    assert_eq!(
        ct.get(id).unwrap().line(&t, S).to_string(),
        "tcp 6 119 SYN_SENT src=10.0.0.1 dst=10.96.0.10 sport=40000 dport=80 [UNREPLIED] \
         src=10.244.1.5 dst=10.0.0.1 sport=8080 dport=40000 zone=0 mark=0"
    );
    step(
        &mut ct,
        tcp("10.244.1.5", 8080, C, 40000, 5000, 1001, SYN | ACK, 0),
        1,
    );
    step(
        &mut ct,
        tcp(C, 40000, "10.96.0.10", 80, 1001, 5001, ACK, 0),
        2,
    );
    let e = ct.get_mut(id).unwrap();
    e.mark = 3;
    e.set_tunnel_peer(Some(ip("192.168.0.2")));
    let e = ct.get(id).unwrap();
    assert_eq!(
        e.line(&t, 2 + S).to_string(),
        "tcp 6 431999 ESTABLISHED src=10.0.0.1 dst=10.96.0.10 sport=40000 dport=80 \
         src=10.244.1.5 dst=10.0.0.1 sport=8080 dport=40000 [ASSURED] zone=0 mark=3 \
         tunnel_peer=192.168.0.2"
    );
    assert!(e.to_string().starts_with("tcp 6 432000 ESTABLISHED"));
    let icmp = step(&mut ct, ping("10.0.0.3", "10.0.0.5", 9), 0)
        .entry
        .unwrap();
    assert_eq!(
        ct.get(icmp).unwrap().line(&t, 0).to_string(),
        "icmp 1 30 src=10.0.0.3 dst=10.0.0.5 type=8 code=0 id=9 [UNREPLIED] \
         src=10.0.0.5 dst=10.0.0.3 type=0 code=0 id=9 zone=0 mark=0"
    );
}

#[test]
fn entry_is_serializable_for_json_dumps() {
    fn serializable<T: serde::Serialize>(_: &T) {}
    let ct = populated();
    for (_, e) in ct.dump(&Filter::default()) {
        serializable(e);
    }
}

/// The hot fields of an entry sit in its first 73 bytes, the TCP state right after them
/// (see the layout in `Entry`), and the slab's enum adds nothing.
#[test]
fn entry_layout_keeps_what_a_packet_touches_together() {
    use std::mem::offset_of;
    assert_eq!(offset_of!(Entry, last_seen_ns), 0);
    assert_eq!(offset_of!(Entry, proto_state), 72);
    assert_eq!(std::mem::size_of::<ProtoState>(), 28);
    assert_eq!(offset_of!(TcpConn, state), 0);
}

/// A prefetch that prefetches nothing, to run the code that hands addresses to one.
fn no_prefetch(addrs: &[*const u8]) {
    std::hint::black_box(addrs.len());
}

/// One batch of packets for [`batch_gives_the_same_results_as_packet_by_packet`]: new,
/// established both ways, a duplicate within the batch, SNAT with a port clash, a TCP
/// handshake, an unsolicited echo reply (INVALID), a refused connection (not committed),
/// and a packet dropped before conntrack (`process` false: prefetched, not processed).
struct BatchPkt {
    p: Pkt,
    nat: Option<Nat>,
    process: bool,
    commit: bool,
}

fn batch() -> Vec<BatchPkt> {
    let snat = Some(Nat {
        dnat: None,
        snat: Some((Addr::from(ip("192.168.0.9")), Some((1000, 1001)))),
    });
    let b = |p, nat, process, commit| BatchPkt {
        p,
        nat,
        process,
        commit,
    };
    vec![
        b(udp("10.0.0.1", 1000, "10.0.9.9", 53), snat, true, true),
        b(udp("10.0.0.2", 1000, "10.0.9.9", 53), snat, true, true),
        b(udp("10.0.9.9", 53, "192.168.0.9", 1000), None, true, true),
        b(udp("10.0.0.3", 7, "10.0.9.9", 53), None, false, true),
        b(udp("10.0.0.1", 1000, "10.0.9.9", 53), snat, true, true),
        b(
            tcp("10.0.1.1", 2000, "10.0.2.2", 80, 100, 0, SYN, 0),
            None,
            true,
            true,
        ),
        b(
            tcp("10.0.2.2", 80, "10.0.1.1", 2000, 500, 101, SYN | ACK, 0),
            None,
            true,
            true,
        ),
        b(
            tcp("10.0.1.1", 2000, "10.0.2.2", 80, 101, 501, ACK, 10),
            None,
            true,
            true,
        ),
        b(pong("10.0.3.3", "10.0.4.4", 9), None, true, true),
        b(ping("10.0.3.3", "10.0.4.4", 9), None, true, true),
        b(udp("10.0.9.9", 53, "192.168.0.9", 1001), None, true, true),
        b(udp("10.0.5.5", 5000, "10.0.9.9", 53), None, true, false),
        b(udp("10.0.5.5", 5000, "10.0.9.9", 53), None, true, true),
    ]
}

/// Processing a batch after [`Conntrack::prefetch_batch`] (with plain reads or a prefetch
/// instruction) gives the packet-by-packet results: states, entries, rewritten packets,
/// the table and its counters, across rounds where entries expire.
#[test]
fn batch_gives_the_same_results_as_packet_by_packet() {
    let mut one = ct();
    let mut batched = ct();
    let mut prefetched = ct();
    prefetched.set_prefetch(Some(no_prefetch));
    for now in [0, S, 2 * S, 200 * S, 201 * S, 400 * S] {
        let mut seen = Vec::new();
        for (i, ct) in [&mut one, &mut batched, &mut prefetched]
            .into_iter()
            .enumerate()
        {
            let mut pkts = batch();
            if i > 0 {
                ct.prefetch_batch(pkts.iter().map(|b| &b.p.parsed.key));
            }
            let mut out = Vec::new();
            for b in pkts.iter_mut().filter(|b| b.process) {
                let mut r = ct
                    .process(&mut b.p.pkt, &mut b.p.parsed, b.nat.as_ref(), now)
                    .unwrap();
                if let Some(pending) = r.pending.take().filter(|_| b.commit) {
                    r.entry = Some(ct.commit(pending, now).unwrap());
                }
                out.push((r, b.p.pkt.data.clone(), b.p.parsed.key));
            }
            ct.end_batch();
            ct.check();
            let entries: Vec<(EntryId, Entry)> = ct
                .dump(&Filter::default())
                .map(|(id, e)| (id, e.clone()))
                .collect();
            seen.push((out, entries, *ct.stats()));
        }
        assert_eq!(
            seen[0], seen[1],
            "at {now}: prefetch_batch with plain reads"
        );
        assert_eq!(seen[0], seen[2], "at {now}: prefetch_batch with a prefetch");
        let states: Vec<CtState> = seen[0].0.iter().map(|(r, _, _)| r.state).collect();
        if now == 0 {
            use CtState::*;
            assert_eq!(
                states,
                [
                    New,
                    New,
                    Established,
                    Established,
                    New,
                    Established,
                    Established,
                    Invalid,
                    New,
                    Established,
                    New,
                    New
                ]
            );
        }
    }
}

thread_local! {
    /// Addresses given to [`record_prefetch`] on this thread.
    static PREFETCHED: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A prefetch instruction that notes the addresses it is given.
fn record_prefetch(addrs: &[*const u8]) {
    PREFETCHED.with(|p| p.borrow_mut().extend(addrs.iter().map(|&a| a as usize)));
}

/// With a prefetch instruction, `prefetch_batch` prefetches the entry of every kept key
/// of the batch (both directions, two groups), and processing the packets prefetches
/// nothing more.
#[test]
fn batch_prefetches_every_entry_up_front_and_nothing_per_packet() {
    let mut ct = ct();
    ct.set_prefetch(Some(record_prefetch));
    let pkts = || -> Vec<Pkt> {
        (0..40u16)
            .map(|i| {
                if i % 2 == 0 {
                    udp("10.0.0.1", 3000 + i, "10.0.0.2", 53)
                } else {
                    udp("10.0.0.2", 53, "10.0.0.1", 3000 + i - 1)
                }
            })
            .collect()
    };
    for p in &mut pkts() {
        run(&mut ct, p, None, 0);
    }
    let mut batch = pkts();
    PREFETCHED.with(|p| p.borrow_mut().clear());
    ct.prefetch_batch(batch.iter().map(|p| &p.parsed.key));
    let prefetched = PREFETCHED.with(|p| std::mem::take(&mut *p.borrow_mut()));
    for p in &batch {
        let (id, _) = ct.lookup(&p.parsed.key).unwrap();
        let e = std::ptr::from_ref(ct.get(id).unwrap()) as usize;
        assert!(prefetched.contains(&e), "entry of {:?}", p.parsed.key);
    }
    for p in &mut batch {
        let r = ct.process(&mut p.pkt, &mut p.parsed, None, S).unwrap();
        assert_eq!(r.state, CtState::Established);
    }
    ct.end_batch();
    PREFETCHED.with(|p| assert!(p.borrow().is_empty(), "prefetched per packet"));
}

/// In a full table, a new connection prefetches what evicting the oldest unreplied entry
/// will touch, the next oldest entry among it, and everything else goes as without the
/// prefetch: the same entry evicted, the same table and counters.
#[test]
fn full_table_prefetches_the_eviction_and_changes_nothing_else() {
    let cfg = Config {
        max_entries: 8,
        ..Config::default()
    };
    let mut plain = Conntrack::new(cfg);
    let mut fetching = Conntrack::new(cfg);
    fetching.set_prefetch(Some(record_prefetch));
    for ct in [&mut plain, &mut fetching] {
        for i in 0..8u16 {
            step(ct, udp("10.0.0.1", 1000 + i, "10.0.0.2", 53), 0);
        }
    }
    let key = |port| udp("10.0.0.1", port, "10.0.0.2", 53).parsed.key;
    let (second, _) = fetching.lookup(&key(1001)).unwrap();
    let second = std::ptr::from_ref(fetching.get(second).unwrap()) as usize;
    PREFETCHED.with(|p| p.borrow_mut().clear());
    for ct in [&mut plain, &mut fetching] {
        step(ct, udp("10.0.0.1", 2000, "10.0.0.2", 53), 0);
        assert_eq!(ct.lookup(&key(1000)), None, "the oldest is evicted");
        assert!(ct.lookup(&key(1001)).is_some());
    }
    let prefetched = PREFETCHED.with(|p| std::mem::take(&mut *p.borrow_mut()));
    assert!(prefetched.contains(&second), "the next oldest entry");
    // Its two index slots, a wheel neighbour, three lines of the next oldest.
    assert!(prefetched.len() >= 6, "{prefetched:?}");
    let dump = |ct: &Conntrack| -> Vec<(EntryId, Entry)> {
        ct.dump(&Filter::default())
            .map(|(id, e)| (id, e.clone()))
            .collect()
    };
    assert_eq!(dump(&plain), dump(&fetching));
    assert_eq!(plain.stats(), fetching.stats());
    assert_eq!(fetching.stats().evicted, 1);
}

/// A pending connection keeps the hashes of the table that decided it; committed into
/// another table (a scratch table, say), it is hashed there again.
#[test]
fn pending_from_another_table_is_hashed_again() {
    let mut a = ct();
    let mut b = ct();
    let mut p = udp("10.0.0.1", 1000, "10.0.0.2", 53);
    let r = a.process(&mut p.pkt, &mut p.parsed, None, 0).unwrap();
    let id = b.commit(r.pending.unwrap(), 0).unwrap();
    b.check();
    let mut q = udp("10.0.0.2", 53, "10.0.0.1", 1000);
    let r = b.process(&mut q.pkt, &mut q.parsed, None, 0).unwrap();
    assert_eq!(
        (r.state, r.reply, r.entry),
        (CtState::Established, true, Some(id))
    );
}

/// A batch longer than a prefetch group and than the hashes kept, every connection twice
/// in it (new, then established) and some of it in the reply direction, gives the
/// packet-by-packet results.
#[test]
fn long_batch_gives_the_same_results_as_packet_by_packet() {
    let pkts = || -> Vec<Pkt> {
        (0..90u16)
            .map(|i| match i % 3 {
                0 | 1 => udp("10.0.0.1", 2000 + i / 3, "10.0.0.2", 53),
                _ => udp("10.0.0.2", 53, "10.0.0.1", 2000 + i / 3),
            })
            .collect()
    };
    let mut one = ct();
    let mut batched = ct();
    batched.set_prefetch(Some(no_prefetch));
    for now in [0, 3 * S, 100 * S] {
        let mut seen = Vec::new();
        for (i, ct) in [&mut one, &mut batched].into_iter().enumerate() {
            let mut pkts = pkts();
            if i > 0 {
                ct.prefetch_batch(pkts.iter().map(|p| &p.parsed.key));
            }
            let out: Vec<CtResult> = pkts.iter_mut().map(|p| run(ct, p, None, now)).collect();
            seen.push((out, *ct.stats()));
        }
        assert_eq!(seen[0], seen[1], "at {now}");
    }
    assert_eq!(one.stats().found, 60 + 90 + 90);
}

/// Commit skips looking up the tuples again only while the table is as process left it:
/// two pending connections with one tuple, the second committed after the first, clash;
/// one whose tuple was freed in between is inserted.
#[test]
fn pending_after_the_table_changed_is_checked_again() {
    let mut ct = ct();
    let mut p = udp("10.0.0.1", 1000, "10.0.0.2", 53);
    let first = ct.process(&mut p.pkt, &mut p.parsed, None, 0).unwrap();
    let mut p = udp("10.0.0.1", 1000, "10.0.0.2", 53);
    let second = ct.process(&mut p.pkt, &mut p.parsed, None, 0).unwrap();
    let id = ct.commit(first.pending.unwrap(), 0).unwrap();
    let again = second.pending.unwrap();
    assert_eq!(ct.commit(again.clone(), 0), Err(DropReason::CtInvalid));
    assert_eq!(ct.stats().clash, 1);
    ct.check();
    assert_eq!(ct.delete(&Filter::default()), 1);
    assert!(ct.get(id).is_none());
    ct.commit(again, 0).unwrap();
    assert_eq!(ct.len(), 1);
    ct.check();
}
