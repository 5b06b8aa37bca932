//! A checkpoint restored after a crash, through real packets: the state saved by the old
//! pipeline, its connections carrying a megabyte more each way after the save (as they
//! do while the agent that saved it dies and the next one starts), then the stale state
//! restored into a new pipeline on a young clock (a restarted agent's): the next
//! segments each way must be forwarded and translated exactly as the old pipeline does.

use super::handover_tests::*;
use super::test_support::*;
use super::*;
use crate::handover::{Dropped, RestoreOptions, Restored, SavedState, TcpSide, Tracking};

/// A restarted agent's clock when it restores: its own, started with the process.
const YOUNG: u64 = 300_000_000;
/// Data each side of each connection sends after the save.
const MOVED_ON: u32 = 1 << 20;
/// Payload of each segment.
const SEGMENT: usize = 1200;

/// How one side's segments arrive: its port, and its segment with the given sequence
/// number, acknowledgement, flags and payload.
type Build = Box<dyn Fn(u32, u32, u8, &[u8]) -> Vec<u8>>;

/// One side of a TCP connection: its port, its segments, its next sequence number.
struct Side {
    port: &'static str,
    build: Build,
    seq: u32,
}

/// A TCP connection of the state, both sides.
struct Conn {
    name: &'static str,
    sides: [Side; 2],
}

fn side(port: &'static str, seq: u32, build: Build) -> Side {
    Side { port, build, seq }
}

/// The TCP connections `opened` leaves established, at their next sequence numbers: a
/// pod's to a cluster IP (DNAT to a local endpoint), the node port's from an external
/// client (SNAT, to node 2's endpoint through the tunnel; its source port is
/// `nat_port`), and one node 2 forwarded here (its tunnel peer).
fn connections(nat_port: u16) -> Vec<Conn> {
    let pod = |src, dst, sport, dport, opts: IpOpts| -> Build {
        Box::new(move |seq, ack, flags, data: &[u8]| {
            tcp(src, dst, sport, dport)
                .seq(seq, ack)
                .flags(flags)
                .opts(&opts)
                .frame(data)
        })
    };
    let via_node2 = |src, dst, sport, dport| -> Build {
        Box::new(move |seq, ack, flags, data: &[u8]| {
            tunnelled(
                tcp(src, dst, sport, dport)
                    .seq(seq, ack)
                    .flags(flags)
                    .opts(&from_node2())
                    .frame(data),
            )
        })
    };
    let (pod_a, pod_b) = (from_pod(1, 5), from_pod(1, 6));
    vec![
        Conn {
            name: "service",
            sides: [
                side(
                    "pod-a",
                    1001,
                    pod("10.244.1.5", "10.96.0.10", 40000, 80, pod_a),
                ),
                side(
                    "pod-b",
                    7001,
                    pod("10.244.1.6", "10.244.1.5", 8080, 40000, pod_b),
                ),
            ],
        },
        Conn {
            name: "node port",
            sides: [
                side("eth0", 101, pod(CLIENT, NODE1, 50000, 30081, client())),
                side("eth0", 7001, via_node2("10.244.2.5", NODE1, 8080, nat_port)),
            ],
        },
        Conn {
            name: "tunnel peer",
            sides: [
                side("eth0", 1001, via_node2(CLIENT, "10.244.1.6", 50001, 8080)),
                side("pod-b", 7001, pod("10.244.1.6", CLIENT, 8080, 50001, pod_b)),
            ],
        },
    ]
}

/// The segment side `dir` of `c` sends next, acknowledging all of the other's.
fn segment(c: &Conn, dir: usize, data: &[u8]) -> (&'static str, Vec<u8>) {
    let (s, other) = (&c.sides[dir], &c.sides[1 - dir]);
    (s.port, (s.build)(s.seq, other.seq, ACK | PSH, data))
}

/// Each side of `c` sends [`MOVED_ON`] bytes through `p` from `t` on, in turns.
fn carry(p: &mut Pipeline, c: &mut Conn, t: u64) {
    let data = build::pattern(SEGMENT, 3);
    for round in 0..MOVED_ON.div_ceil(SEGMENT as u32) {
        for dir in 0..2 {
            let (port, frame) = segment(c, dir, &data);
            let at = t + u64::from(round) * 20_000;
            assert_eq!(send(p, port, frame, at).0, Verdict::Forwarded, "{}", c.name);
            c.sides[dir].seq += SEGMENT as u32;
        }
    }
}

/// The old pipeline, the state it saved at 5 s, and its TCP connections after carrying
/// data from 6 s on.
fn moved_on() -> (Pipeline, SavedState, Vec<Conn>) {
    let (mut old, _) = opened();
    let saved = handed_over(&old);
    let np = saved
        .connections
        .iter()
        .find(|c| c.original.dst_port == 30081);
    let mut conns = connections(np.unwrap().reply.dst_port);
    for c in &mut conns {
        carry(&mut old, c, 6 * SEC);
    }
    (old, saved, conns)
}

/// `out` with the outer IPv4 identification (and so the header checksum) of VXLAN
/// frames cleared: the old pipeline sent tunnelled packets after the save, the new one
/// numbers on from the saved identification.
fn without_outer_id(mut out: Out) -> Out {
    for (_, f) in &mut out.1 {
        let vxlan = f.len() > 42 && f[12..14] == [8, 0] && f[23] == 17 && f[36..38] == [0x12, 0xb5];
        if vxlan {
            f[18..20].fill(0);
            f[24..26].fill(0);
        }
    }
    out
}

/// What `c`'s next segments each way do in `old` (at 8 s) and in `new` (its clock at
/// [`YOUNG`]).
fn next_in_both(old: &mut Pipeline, new: &mut Pipeline, c: &mut Conn) -> [(Out, Out); 2] {
    let data = build::pattern(100, 9);
    let mut got = Vec::new();
    for dir in 0..2 {
        let (port, frame) = segment(c, dir, &data);
        let was = send(old, port, frame.clone(), 8 * SEC + dir as u64);
        let now = send(new, port, frame, YOUNG + dir as u64);
        got.push((without_outer_id(was), without_outer_id(now)));
        c.sides[dir].seq += data.len() as u32;
    }
    [got.remove(0), got.remove(0)]
}

/// The records of `saved` as a stale restore `age_ns` later at [`YOUNG`] keeps them:
/// TCP windows forgotten, times aged (those before the young clock's start at its
/// start), everything else as it was.
fn as_stale(saved: &SavedState, age_ns: u64) -> SavedState {
    let forgotten = |s: &mut TcpSide| {
        (s.end, s.max_end, s.max_window) = (0, 0, 0);
        s.liberal = true;
    };
    let mut s = saved.clone();
    for c in &mut s.connections {
        if let Tracking::Tcp(t) = &mut c.tracking {
            forgotten(&mut t.original);
            forgotten(&mut t.reply);
        }
        c.first_seen_ago_ns = (c.first_seen_ago_ns + age_ns).min(YOUNG);
        c.last_seen_ago_ns = (c.last_seen_ago_ns + age_ns).min(YOUNG);
    }
    s
}

#[test]
fn test_a_stale_checkpoint_continues_connections_whose_sequence_numbers_moved_on() {
    let (mut old, saved, mut conns) = moved_on();
    let mut new = fresh(services(true), false);
    let age = 3 * SEC;
    let r = new
        .restore_state_with(&saved, YOUNG, RestoreOptions::checkpoint(age))
        .unwrap();
    let want = Restored {
        connections: 6,
        affinity: 1,
        neighbours: 2,
        datagrams: 0,
        dropped: Dropped {
            frag_stale: 1,
            ..Dropped::default()
        },
    };
    assert_eq!(r, want);
    assert!(
        r.to_string().contains("1 datagrams of a stale state"),
        "{r}"
    );
    // State, NAT both ways, mark, labels, tunnel peer and counts as saved.
    let kept = new.save_state(YOUNG);
    assert_eq!(
        ordered(kept.clone()).connections,
        ordered(as_stale(&saved, age)).connections
    );
    assert_eq!(
        kept.affinity[0].remaining_ns,
        saved.affinity[0].remaining_ns - age
    );
    for c in &mut conns {
        for (dir, (was, now)) in next_in_both(&mut old, &mut new, c).into_iter().enumerate() {
            assert_eq!(was.0, Verdict::Forwarded, "{}, side {dir}", c.name);
            assert_eq!(now, was, "{}, side {dir}", c.name);
        }
    }
    // The windows were learnt from those segments: both sides' ends as the old one has
    // them.
    let ends = |s: SavedState| -> Vec<_> {
        ordered(s)
            .connections
            .into_iter()
            .filter_map(|c| match c.tracking {
                // The IPv6 one sent nothing since the save.
                Tracking::Tcp(t) if c.original.src.is_ipv4() => Some((t.original.end, t.reply.end)),
                _ => None,
            })
            .collect()
    };
    assert_eq!(
        ends(new.save_state(YOUNG + 2)),
        ends(old.save_state(8 * SEC + 2))
    );
}

#[test]
fn test_the_same_checkpoint_restored_as_a_handover_drops_them_out_of_window() {
    let (mut old, saved, mut conns) = moved_on();
    let mut new = fresh(services(true), false);
    assert_eq!(new.restore_state(&saved, YOUNG).unwrap().connections, 6);
    for c in &mut conns {
        for (dir, (was, now)) in next_in_both(&mut old, &mut new, c).into_iter().enumerate() {
            assert_eq!(was.0, Verdict::Forwarded, "{}, side {dir}", c.name);
            assert_eq!(
                now,
                (Verdict::Dropped(DropReason::CtInvalid), vec![]),
                "{}, side {dir}",
                c.name
            );
        }
    }
}

/// What ran out of time between the save and the restore is dropped as expired, judged
/// by how long ago it was seen rather than by the young clock's times: the UDP flow and
/// the echo (30 s each, last seen 4 s before the save) and the affinity record (6 s
/// left) after 40 s; the TCP connections stay.
#[test]
fn test_what_ran_out_of_time_since_the_checkpoint_is_dropped_as_expired() {
    let (old, _) = opened();
    let saved = handed_over(&old);
    let mut new = fresh(services(true), false);
    let r = new
        .restore_state_with(&saved, YOUNG, RestoreOptions::checkpoint(40 * SEC))
        .unwrap();
    let want = Restored {
        connections: 4,
        affinity: 0,
        neighbours: 2,
        datagrams: 0,
        dropped: Dropped {
            ct_expired: 2,
            affinity_expired: 1,
            frag_stale: 1,
            ..Dropped::default()
        },
    };
    assert_eq!(r, want);
    // An affinity record 3 s younger than its 6 s lapses 3 s after the restore.
    let mut aged = fresh(services(true), false);
    let r = aged
        .restore_state_with(&saved, YOUNG, RestoreOptions::checkpoint(3 * SEC))
        .unwrap();
    assert_eq!(r.affinity, 1);
    aged.tick(YOUNG + 2 * SEC, &mut Vec::new());
    assert_eq!(aged.affinity().len(), 1);
    aged.tick(YOUNG + 4 * SEC, &mut Vec::new());
    assert_eq!(aged.affinity().len(), 0);
}

/// Age without staleness (a state that waited, its connections paused meanwhile): the
/// windows stay checked, a datagram in reassembly keeps what is left of its time (26 s
/// at the save), and what had less left is dropped.
#[test]
fn test_an_aged_state_that_is_not_stale_keeps_its_windows_and_fragments() {
    let (mut old, next) = opened();
    let saved = handed_over(&old);
    let aged = |age_ns| RestoreOptions {
        stale: false,
        age_ns,
    };
    let age = 20 * SEC;
    let mut new = fresh(services(true), false);
    let r = new.restore_state_with(&saved, 40 * SEC, aged(age)).unwrap();
    let d = r.dropped;
    assert_eq!((r.connections, r.neighbours, r.datagrams), (6, 2, 1), "{r}");
    assert_eq!((d.affinity_expired, d.total()), (1, 1), "6 s left: {r}");
    // Every record as saved, 20 s older; the windows as they were.
    let mut older = saved.clone();
    for c in &mut older.connections {
        c.first_seen_ago_ns += age;
        c.last_seen_ago_ns += age;
    }
    for n in &mut older.neighbours {
        n.updated_ago_ns += age;
        n.used_ago_ns += age;
        n.probed_ago_ns = n.probed_ago_ns.map(|a| a + age);
    }
    older.datagrams[0].remaining_ns -= age;
    older.affinity.clear();
    assert_eq!(ordered(new.save_state(40 * SEC)), ordered(older));
    for (i, (conn, port, frame)) in next.into_iter().enumerate() {
        let was = send(&mut old, port, frame.clone(), 6 * SEC);
        let got = send(&mut new, port, frame, 41 * SEC);
        assert_eq!(was.0, Verdict::Forwarded, "{conn}, packet {i}");
        assert_eq!(got, was, "{conn}, packet {i}");
    }

    let mut late = fresh(services(true), false);
    let r = late
        .restore_state_with(&saved, 20 * SEC, aged(27 * SEC))
        .unwrap();
    let d = r.dropped;
    assert_eq!(
        (d.ct_expired, d.affinity_expired, d.frag_expired),
        (2, 1, 1),
        "{r}"
    );
    assert!(r.to_string().contains("1 datagrams expired"), "{r}");
}

/// A checkpoint saved into the last one's state (its memory reused) is the state a new
/// save gives, whatever the old one held: more connections and neighbours, another
/// producer and format.
#[test]
fn test_a_state_saved_into_an_older_one_is_a_new_save() {
    let (old, _) = opened();
    let mut reused = handed_over(&old);
    let mut extra = reused.neighbours[0].clone();
    extra.port = "a port with a long name".into();
    reused.neighbours.push(extra);
    (reused.format, reused.producer) = (1, "0.0.1".into());
    reused.meta.node = "another node".into();
    let p = node1(services(true));
    let fresh = p.save_state(3 * SEC);
    assert_eq!((fresh.connections.len(), fresh.neighbours.len()), (0, 2));
    p.save_state_into(3 * SEC, &mut reused);
    assert_eq!(reused, fresh);
    // And the other way: fewer records before than after.
    let mut small = fresh.clone();
    old.save_state_into(5 * SEC, &mut small);
    assert_eq!(small, old.save_state(5 * SEC));
}
