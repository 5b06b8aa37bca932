//! Arbitrary sequences of packets, NAT decisions, commits, clock steps, expiry and deletes
//! through a small connection table: it never panics, and after every step each listed
//! entry is found from both its tuples, the table's size is what it lists, and it never
//! holds more than its limit.
#![no_main]
#![forbid(unsafe_code)]

use std::net::IpAddr;

use ferry_datapath::conntrack::{Config, Conntrack, CtState, Filter, Nat, TcpState};
use ferry_datapath::{IcmpError as ErrorKind, build_icmp_error as build_error};
use ferry_datapath::Packet;
use ferry_datapath::wire::build::{self, IpOpts};
use ferry_datapath::wire::{Parsed, parse};
use libfuzzer_sys::fuzz_target;

mod repair;

const MAX_ENTRIES: usize = 16;
const PORTS: [u16; 4] = [53, 80, 1000, 1001];
const MS: u64 = 1_000_000;

/// The fuzz input, read a byte at a time (zeros once it runs out).
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u32(&mut self) -> u32 {
        u32::from(self.u16()) << 16 | u32::from(self.u16())
    }

    fn bytes(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }

    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// One of four hosts of either family.
fn host(b: u8, v6: bool) -> IpAddr {
    let n = b % 4 + 1;
    if v6 {
        IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, u16::from(n)])
    } else {
        IpAddr::from([10, 0, 0, n])
    }
}

fn port(b: u8) -> u16 {
    PORTS[usize::from(b % 4)]
}

/// A sequence or acknowledgement number: mostly near a few bases so that windows match.
fn seq(i: &mut Input) -> u32 {
    match i.u8() % 4 {
        0 => i.u32(),
        k => u32::from(k) * 1_000_000 + u32::from(i.u16()),
    }
}

fn nat(i: &mut Input, v6: bool) -> Option<Nat> {
    let b = i.u8();
    if b.is_multiple_of(3) {
        return None;
    }
    let mut n = Nat::default();
    if b & 4 != 0 {
        let p = (b & 8 != 0).then(|| port(i.u8()));
        n.dnat = Some((host(i.u8(), v6 ^ (b & 64 != 0 && b & 128 != 0)).into(), p));
    }
    if b & 16 != 0 {
        let range = match i.u8() % 4 {
            0 => None,
            1 => Some((1000, 1003)),
            2 => Some((port(i.u8()), port(i.u8()))),
            _ => Some((i.u16(), i.u16())),
        };
        n.snat = Some((host(i.u8(), v6).into(), range));
    }
    Some(n)
}

fn filter(i: &mut Input) -> Filter {
    let b = i.u8();
    Filter {
        zone: (b & 1 != 0).then(|| u16::from(i.u8() % 2)),
        addr: (b & 2 != 0).then(|| host(i.u8(), b & 64 != 0)),
        port: (b & 4 != 0).then(|| port(i.u8())),
        proto: (b & 8 != 0).then(|| [1, 6, 17, 58][usize::from(i.u8() % 4)]),
        state: (b & 16 != 0).then(|| TcpState::ALL[usize::from(i.u8() % 8)]),
        mark: (b & 32 != 0).then(|| u32::from(i.u8() % 4)),
    }
}

/// A frame built from the input: a packet between the hosts, an ICMP error about a
/// recent one, or raw bytes.
fn frame(i: &mut Input, recent: &[Vec<u8>]) -> Option<Vec<u8>> {
    let op = i.u8();
    let v6 = op & 8 != 0;
    let (src, dst) = (host(i.u8(), v6), host(i.u8(), v6));
    let o = IpOpts::default();
    let payload = vec![0u8; usize::from(i.u8() % 64)];
    Some(match op % 8 {
        0 | 1 => build::udp(src, dst, port(i.u8()), port(i.u8()), &payload, &o),
        2 | 3 => {
            let (sp, dp) = (port(i.u8()), port(i.u8()));
            let flags = match i.u8() % 8 {
                0 => 0x02,
                1 => 0x12,
                2 | 3 => 0x10,
                4 => 0x11,
                5 => 0x04,
                6 => 0x14,
                _ => i.u8(),
            };
            let (s, a) = (seq(i), seq(i));
            build::tcp(src, dst, sp, dp, s, a, flags, &payload, &o)
        }
        4 => {
            let mut f = build::echo_request(src, dst, u16::from(i.u8() % 4), 1, &payload, &o);
            if i.u8() & 1 != 0 {
                // An echo reply: the type is all that differs to conntrack.
                let p = parse(&f, 0).ok()?;
                f[p.l4_off] = if v6 { 129 } else { 0 };
            }
            f
        }
        5 => {
            let about = recent.get(usize::from(i.u8()) % recent.len().max(1))?;
            let p = parse(about, 0).ok()?;
            let kind = match i.u8() % 3 {
                0 => ErrorKind::TimeExceeded,
                1 => ErrorKind::Unreachable { code: 3 },
                _ => ErrorKind::TooBig { mtu: 1280 },
            };
            // From a router, or from the packet's destination.
            let from = if i.u8() & 1 != 0 { p.key.dst.ip() } else { src };
            build_error(about, &p, kind, from, [2, 0, 0, 0, 0, 9])?
        }
        _ => {
            let len = usize::from(i.u8());
            let mut f = i.bytes(len).to_vec();
            repair::repair(&mut f, op >> 4);
            f
        }
    })
}

/// Every listed entry is found from both its tuples, and the count matches.
fn check(ct: &Conntrack) {
    let mut n = 0;
    for (id, e) in ct.dump(&Filter::default()) {
        n += 1;
        let (o, r) = (e.original(), e.reply());
        let found = ct.lookup(&o);
        assert!(
            found == Some((id, false)) || (o == r && found.is_some_and(|(f, _)| f == id)),
            "entry {id} not found by its original tuple: {found:?}\n{e}"
        );
        let found = ct.lookup(&r);
        assert!(
            found == Some((id, true)) || (o == r && found.is_some_and(|(f, _)| f == id)),
            "entry {id} not found by its reply tuple: {found:?}\n{e}"
        );
        assert_eq!(ct.get(id), Some(e));
        let _ = e.to_string();
    }
    assert_eq!(n, ct.len(), "listed entries");
    assert!(ct.len() <= MAX_ENTRIES, "{} entries", ct.len());
}

fuzz_target!(|data: &[u8]| {
    let mut i = Input(data);
    let mut ct = Conntrack::new(Config {
        max_entries: MAX_ENTRIES,
        tcp_pickup: i.u8() & 1 != 0,
        ..Config::default()
    });
    let mut now = 0u64;
    let mut recent: Vec<Vec<u8>> = Vec::new();
    while !i.done() {
        // Most steps at the same time, some up to 3 s on, a few a quarter hour on.
        let step = i.u8();
        now += match step {
            0..0xe0 => 0,
            0xe0..0xff => u64::from(step & 31) * 100 * MS,
            0xff => 900_000 * MS,
        };
        match i.u8() % 16 {
            0 => {
                let budget = i.u8();
                if budget == 0xff {
                    // Unbounded: nothing is left more than a wheel tick (~1 s) past due.
                    ct.expire(now, usize::MAX);
                    let t = ct.config().timeouts;
                    for (id, e) in ct.dump(&Filter::default()) {
                        let due = e.deadline_ns(&t);
                        assert!(due + (2 << 30) > now, "entry {id} due at {due}, now {now}");
                    }
                } else {
                    ct.expire(now, usize::from(budget));
                }
            }
            1 => {
                let f = filter(&mut i);
                ct.delete(&f);
                assert_eq!(ct.dump(&f).count(), 0, "left after delete: {f:?}");
            }
            2 | 3 => {
                // Other stages annotate a tracked connection.
                let id = u32::from(i.u8() % MAX_ENTRIES as u8);
                let (mark, peer) = (u32::from(i.u8() % 4), peer(&mut i));
                if let Some(e) = ct.get_mut(id) {
                    e.mark = mark;
                    e.set_tunnel_peer(peer);
                    assert_eq!(ct.get(id).map(|e| e.tunnel_peer()), Some(peer));
                }
            }
            _ => packet(&mut ct, &mut i, &mut recent, now),
        }
        check(&ct);
    }
});

fn peer(i: &mut Input) -> Option<IpAddr> {
    match i.u8() % 3 {
        0 => None,
        1 => Some(IpAddr::from([192, 168, 0, i.u8()])),
        _ => Some(IpAddr::from([0xfd01, 0, 0, 0, 0, 0, 0, u16::from(i.u8())])),
    }
}

fn packet(ct: &mut Conntrack, i: &mut Input, recent: &mut Vec<Vec<u8>>, now: u64) {
    let Some(f) = frame(i, recent) else { return };
    let zone = u16::from(i.u8() % 2);
    let Ok(mut parsed): Result<Parsed, _> = parse(&f, zone) else {
        return;
    };
    if recent.len() == 16 {
        recent.remove(0);
    }
    recent.push(f.clone());
    let v6 = parsed.key.src.is_ipv6();
    let nat = nat(i, v6);
    let mut pkt = Packet::new(f, 0, now);
    let Ok(r) = ct.process(&mut pkt, &mut parsed, nat.as_ref(), now) else {
        return;
    };
    match r.state {
        CtState::New => assert!(r.pending.is_some() && r.entry.is_none()),
        CtState::Established | CtState::Related => assert!(r.entry.is_some()),
        CtState::Invalid | CtState::Untracked => assert!(r.pending.is_none()),
    }
    let Some(mut pending) = r.pending else { return };
    let how = i.u8();
    if how.is_multiple_of(4) {
        return;
    }
    let (mark, labels, peer) = (u32::from(how >> 6), u128::from(how) << 100, peer(i));
    let e = pending.entry_mut();
    e.mark = mark;
    e.labels = labels;
    e.set_tunnel_peer(peer);
    let (o, rep) = (e.original(), e.reply());
    if let Ok(id) = ct.commit(pending, now) {
        let e = ct.get(id).expect("committed entry");
        assert_eq!((e.original(), e.reply()), (o, rep));
        assert_eq!((e.mark, e.labels, e.tunnel_peer()), (mark, labels, peer));
    }
}
