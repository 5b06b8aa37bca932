//! Property tests: random packet sequences over a small set of hosts and ports, with
//! random TCP flags and sequence numbers, UDP, ICMP echo and errors, random NAT, refused
//! commits, expiry, deletes and a tiny table, never panic and keep the table consistent
//! (both tuples of every entry found, no index slot pointing to a removed entry, the
//! wheel and the eviction FIFO holding exactly the live entries, `len()` right).

use std::net::IpAddr;

use proptest::prelude::*;

use super::*;
use crate::icmp::{ErrorKind, build_error};
use crate::packet::Packet;
use crate::wire::build::{self, IpOpts};
use crate::wire::parse;

const V4: [&str; 4] = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.96.0.10"];
const V6: [&str; 3] = ["fd00::1", "fd00::2", "fd00::3"];
const PORTS: [u16; 4] = [1, 53, 80, 8080];

fn addr(v6: bool, i: usize) -> IpAddr {
    if v6 {
        V6[i % V6.len()].parse().unwrap()
    } else {
        V4[i % V4.len()].parse().unwrap()
    }
}

#[derive(Clone, Debug)]
enum L4 {
    Tcp {
        flags: u8,
        seq: u32,
        ack: u32,
        len: u8,
    },
    Udp,
    Ping {
        id: u16,
        reply: bool,
    },
    /// An ICMP error about the n-th frame sent so far (after NAT), from host `from`.
    Error {
        of: usize,
        from: usize,
        kind: u8,
    },
    /// An answer to the n-th frame sent so far: its translated tuple reversed.
    Answer {
        of: usize,
        flags: u8,
        seq: u32,
        ack: u32,
    },
    /// The n-th frame sent so far, again, as it was before conntrack.
    Again {
        of: usize,
    },
}

/// DNAT (address index, port index) and SNAT (address index, port range) choices.
type NatChoice = (
    Option<(usize, Option<usize>)>,
    Option<(usize, Option<(u16, u16)>)>,
);

#[derive(Clone, Debug)]
enum Op {
    Packet {
        v6: bool,
        zone: u16,
        src: usize,
        dst: usize,
        sport: usize,
        dport: usize,
        l4: L4,
        nat: Option<NatChoice>,
        commit: bool,
        dt_ms: u32,
    },
    Expire {
        dt_s: u8,
        budget: u8,
    },
    Delete {
        addr: usize,
        zone: Option<u16>,
    },
}

fn seq_value() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..3, 1000u32..1004, 5000u32..5004, any::<u32>()]
}

/// Mostly flag combinations real stacks send, sometimes anything.
fn flags() -> impl Strategy<Value = u8> {
    use crate::wire::build::tcp_flags::*;
    prop_oneof![
        3 => proptest::sample::select(vec![SYN, SYN | ACK, ACK, ACK | PSH, FIN | ACK, RST, RST | ACK]),
        1 => any::<u8>(),
    ]
}

fn l4() -> impl Strategy<Value = L4> {
    prop_oneof![
        4 => (flags(), seq_value(), seq_value(), 0u8..3)
            .prop_map(|(flags, seq, ack, len)| L4::Tcp { flags, seq, ack, len }),
        2 => Just(L4::Udp),
        2 => (0u16..3, any::<bool>()).prop_map(|(id, reply)| L4::Ping { id, reply }),
        1 => (any::<usize>(), 0usize..4, 0u8..3)
            .prop_map(|(of, from, kind)| L4::Error { of, from, kind }),
        4 => (any::<usize>(), flags(), seq_value(), seq_value())
            .prop_map(|(of, flags, seq, ack)| L4::Answer { of, flags, seq, ack }),
        3 => any::<usize>().prop_map(|of| L4::Again { of }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let nat = proptest::option::weighted(
        0.5,
        (
            proptest::option::of((0usize..4, proptest::option::of(0usize..4))),
            proptest::option::of((0usize..4, proptest::option::of((1u16..3, 1u16..4)))),
        ),
    );
    prop_oneof![
        10 => (
            any::<bool>(),
            0u16..2,
            0usize..4,
            0usize..4,
            0usize..4,
            0usize..4,
            l4(),
            nat,
            proptest::bool::weighted(0.9),
            0u32..2000,
        )
            .prop_map(
                |(v6, zone, src, dst, sport, dport, l4, nat, commit, dt_ms)| Op::Packet {
                    v6,
                    zone,
                    src,
                    dst,
                    sport,
                    dport,
                    l4,
                    nat,
                    commit,
                    dt_ms,
                }
            ),
        1 => (0u8..40, 0u8..20).prop_map(|(dt_s, budget)| Op::Expire { dt_s, budget }),
        1 => (0usize..4, proptest::option::of(0u16..2))
            .prop_map(|(addr, zone)| Op::Delete { addr, zone }),
    ]
}

/// Runs one sequence; `sent` keeps the frames that left conntrack, for errors to quote.
fn run_ops(ops: Vec<Op>, max_entries: usize) {
    let mut ct = Conntrack::new(Config {
        max_entries,
        ..Config::default()
    });
    let mut now: u64 = 1;
    // Frames after conntrack with their parse, and the frames as they came in.
    let mut sent: Vec<(Vec<u8>, Parsed, Vec<u8>)> = Vec::new();
    for op in ops {
        match op {
            Op::Packet {
                v6,
                zone,
                src,
                dst,
                sport,
                dport,
                l4,
                nat,
                commit,
                dt_ms,
            } => {
                now += u64::from(dt_ms) * 1_000_000;
                let (s, d) = (addr(v6, src), addr(v6, dst));
                let (sp, dp) = (PORTS[sport], PORTS[dport]);
                let o = IpOpts::default();
                let frame = match l4 {
                    L4::Tcp {
                        flags,
                        seq,
                        ack,
                        len,
                    } => build::tcp(s, d, sp, dp, seq, ack, flags, &vec![1; len.into()], &o),
                    L4::Udp => build::udp(s, d, sp, dp, b"x", &o),
                    L4::Ping { id, reply } => {
                        let mut f = build::echo_request(s, d, id, 1, b"p", &o);
                        if reply {
                            // Turn the request into a reply; the checksum is left stale,
                            // which conntrack does not check.
                            let p = parse(&f, zone).unwrap();
                            f[p.l4_off] = if v6 { 129 } else { 0 };
                        }
                        f
                    }
                    L4::Error { of, from, kind } => {
                        if sent.is_empty() {
                            continue;
                        }
                        let (f, p, _) = &sent[of % sent.len()];
                        let from = if p.key.src.is_ipv4() {
                            addr(false, from)
                        } else {
                            addr(true, from)
                        };
                        let kind = match kind {
                            0 => ErrorKind::Unreachable { code: 3 },
                            1 => ErrorKind::TimeExceeded,
                            _ => ErrorKind::TooBig { mtu: 1280 },
                        };
                        match build_error(f, p, kind, from, [2, 0, 0, 0, 0, 7]) {
                            Some(e) => e,
                            None => continue,
                        }
                    }
                    L4::Answer {
                        of,
                        flags,
                        seq,
                        ack,
                    } => {
                        if sent.is_empty() {
                            continue;
                        }
                        let k = sent[of % sent.len()].1.key;
                        match k.proto {
                            proto::TCP => build::tcp(
                                k.dst.ip(),
                                k.src.ip(),
                                k.dst_port,
                                k.src_port,
                                seq,
                                ack,
                                flags,
                                b"",
                                &o,
                            ),
                            proto::UDP => {
                                build::udp(k.dst.ip(), k.src.ip(), k.dst_port, k.src_port, b"y", &o)
                            }
                            proto::ICMP | proto::ICMPV6
                                if k.dst_port >> 8 == 8 || k.dst_port >> 8 == 128 =>
                            {
                                let mut f = build::echo_request(
                                    k.dst.ip(),
                                    k.src.ip(),
                                    k.src_port,
                                    1,
                                    b"p",
                                    &o,
                                );
                                let p = parse(&f, zone).unwrap();
                                f[p.l4_off] = if k.proto == proto::ICMP { 0 } else { 129 };
                                f
                            }
                            _ => continue,
                        }
                    }
                    L4::Again { of } => {
                        if sent.is_empty() {
                            continue;
                        }
                        sent[of % sent.len()].2.clone()
                    }
                };
                let pre = frame.clone();
                let Ok(mut parsed) = parse(&frame, zone) else {
                    continue;
                };
                let mut pkt = Packet::new(frame, 0, now);
                pkt.meta.zone = zone;
                let nat = nat.map(|(dn, sn)| Nat {
                    dnat: dn.map(|(a, p)| (addr(v6, a).into(), p.map(|i| PORTS[i]))),
                    snat: sn.map(|(a, r)| (addr(v6, a).into(), r)),
                });
                let r = ct.process(&mut pkt, &mut parsed, nat.as_ref(), now);
                if let Ok(mut r) = r {
                    if let Some(pending) = r.pending.take() {
                        assert_eq!(r.state, CtState::New);
                        if commit {
                            let _ = ct.commit(pending, now);
                        }
                    }
                    // What left conntrack must still parse, with the key it reports.
                    let q = parse(&pkt.data, zone).expect("rewritten frame parses");
                    assert_eq!(q.key, parsed.key);
                    if sent.len() < 64 {
                        sent.push((pkt.data, parsed, pre));
                    }
                }
            }
            Op::Expire { dt_s, budget } => {
                now += u64::from(dt_s) * 1_000_000_000;
                ct.expire(now, budget.into());
            }
            Op::Delete { addr: a, zone } => {
                let f = Filter {
                    addr: Some(addr(false, a)),
                    zone,
                    ..Filter::default()
                };
                ct.delete(&f);
            }
        }
        ct.check();
        assert!(ct.len() <= max_entries);
        assert_eq!(ct.dump(&Filter::default()).count(), ct.len());
    }
    // Everything expires in the end, and the table empties consistently.
    now += 10 * 24 * 3600 * 1_000_000_000;
    while ct.expire(now, 7) > 0 {
        ct.check();
    }
    assert!(ct.is_empty(), "{} entries left", ct.len());
    ct.check();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_packet_sequences_keep_the_index_consistent(
        ops in proptest::collection::vec(op(), 1..120),
        max_entries in prop_oneof![Just(4usize), Just(1000usize)],
    ) {
        run_ops(ops, max_entries);
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        frame in proptest::collection::vec(any::<u8>(), 0..200),
        nat in any::<bool>(),
    ) {
        let mut ct = Conntrack::new(Config::default());
        if let Ok(mut parsed) = parse(&frame, 0) {
            let mut pkt = Packet::new(frame, 0, 0);
            let n = Nat {
                dnat: Some(("10.0.0.9".parse().unwrap(), Some(9))),
                snat: Some(("10.0.0.8".parse().unwrap(), None)),
            };
            if let Ok(r) = ct.process(&mut pkt, &mut parsed, nat.then_some(&n), 0)
                && let Some(p) = r.pending
            {
                let _ = ct.commit(p, 0);
            }
            ct.check();
        }
    }
}
