//! The connection table on 4 KiB pages and on transparent huge pages, as the worker sets
//! it up ([`Conntrack::preallocate`], then [`ferry_linux::advise_huge_pages`] over its
//! regions): a packet of an established connection with 1 M tracked, alone and in
//! prefetched batches of 32, and a new connection with source NAT (in a table that
//! grows, and in a full one where it evicts the oldest unreplied). The traffic is that of
//! `crates/ferry-datapath/benches/conntrack.rs`; both page sizes run here, in one
//! sitting, so that they compare. And the whole pipeline forwarding packets of 1 M
//! established connections, on huge pages with the prefetch instruction as a worker runs
//! it, one packet at a time and in receive batches of 32 (`Pipeline::process_batch`).
//! Last, what the machine's memory allows for those rows (`memory_floor`).
//! Figures: docs/benchmarks.md.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ferry_datapath::Packet;
use ferry_datapath::conntrack::{Begin, Config, Conntrack, CtState, Nat};
use ferry_datapath::wire::build::{self, IpOpts};
use ferry_datapath::wire::{Parsed, parse};
use ferry_datapath::{CtSpec, MacAddr, Pipeline, PortSpec, RouteSpec, TablesSpec, Trace};

/// Connection `i`: UDP from 10.(i>>16).(i>>8).(i) port 1024 + i%50000 to one of 1000
/// servers on port 53 (as in the datapath's benchmark).
fn conn(i: u32) -> (Vec<u8>, Parsed) {
    let b = i.to_be_bytes();
    let src = IpAddr::V4(Ipv4Addr::new(10, b[1], b[2], b[3]));
    let dst = IpAddr::V4(Ipv4Addr::new(
        172,
        16,
        (i % 1000 / 250) as u8,
        (i % 250) as u8 + 1,
    ));
    let f = build::udp(
        src,
        dst,
        1024 + (i % 50000) as u16,
        53,
        &[0u8; 18],
        &IpOpts::default(),
    );
    let p = parse(&f, 0).unwrap();
    (f, p)
}

/// Times `iters` packets in batches of 32 taken in turn from 4096 prepared ones:
/// `batch(k, n)` handles packets `k..k + n`.
fn in_batches(iters: u64, mut batch: impl FnMut(usize, usize)) -> Duration {
    let start = Instant::now();
    let mut left = iters as usize;
    let mut k = 0usize;
    while left > 0 {
        let n = left.min(32);
        batch(k, n);
        left -= n;
        k = (k + 32) & 4095;
    }
    start.elapsed()
}

/// The two page sizes.
const PAGES: [(&str, bool); 2] = [("4k", false), ("huge", true)];

/// An empty table for `max` connections, allocated whole, on huge pages if asked.
fn table(max: usize, huge: bool) -> Conntrack {
    let mut ct = Conntrack::new(Config {
        max_entries: max,
        ..Config::default()
    });
    ct.preallocate();
    ct.set_prefetch(Some(ferry_linux::prefetch));
    if huge {
        for (ptr, len) in ct.memory_regions() {
            ferry_linux::advise_huge_pages(ptr, len).unwrap();
        }
    }
    ct
}

fn established(c: &mut Criterion) {
    const N: u32 = 1_000_000;
    let mut g = c.benchmark_group("conntrack_pages");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    for (label, huge) in PAGES {
        let mut ct = table(N as usize + 1, huge);
        for i in 0..N {
            let (f, mut p) = conn(i);
            let mut pkt = Packet::new(f, 0, 0);
            let r = ct.process(&mut pkt, &mut p, None, 0).unwrap();
            ct.commit(r.pending.unwrap(), 0).unwrap();
        }
        // 4096 packets of connections spread over the whole table.
        let mut pkts: Vec<(Packet, Parsed)> = (0..4096u32)
            .map(|i| {
                let (f, p) = conn(i.wrapping_mul(2_654_435_761) % N);
                (Packet::new(f, 0, 0), p)
            })
            .collect();
        let mut k = 0usize;
        g.bench_function(format!("lookup_update_1M_{label}"), |b| {
            b.iter(|| {
                let (pkt, p) = &mut pkts[k & 4095];
                k += 1;
                black_box(established_entry(&mut ct, pkt, p))
            })
        });
        // As a worker receives them: each batch of 32 is first written into 32 receive
        // buffers (the parsed headers conntrack reads; frame bytes do not matter to a UDP
        // packet without NAT), so that, as after parsing, the packets themselves are in
        // cache while the table is not. The copy is timed too.
        let parsed: Vec<Parsed> = pkts.iter().map(|(_, p)| *p).collect();
        let mut rx: Vec<(Packet, Parsed)> = pkts[..32].to_vec();
        g.bench_function(format!("lookup_update_1M_{label}_batch32_rx"), |b| {
            b.iter_custom(|iters| {
                in_batches(iters, |k, n| {
                    for ((_, p), q) in rx.iter_mut().zip(&parsed[k..k + n]) {
                        *p = *q;
                    }
                    let batch = &mut rx[..n];
                    ct.prefetch_batch(batch.iter().map(|(_, p)| &p.key));
                    for (pkt, p) in batch.iter_mut() {
                        black_box(established_entry(&mut ct, pkt, p));
                    }
                })
            })
        });
        // Batches of 32 prefetched first; one iteration is one packet.
        g.bench_function(format!("lookup_update_1M_{label}_batch32"), |b| {
            b.iter_custom(|iters| {
                in_batches(iters, |k, n| {
                    let batch = &mut pkts[k..k + n];
                    ct.prefetch_batch(batch.iter().map(|(_, p)| &p.key));
                    for (pkt, p) in batch.iter_mut() {
                        black_box(established_entry(&mut ct, pkt, p));
                    }
                })
            })
        });
    }
    g.finish();
}

/// Tracks a packet of an established connection as the pipeline does: the result of
/// [`Conntrack::begin`] read where it was returned; its entry.
#[inline(always)]
fn established_entry(ct: &mut Conntrack, pkt: &mut Packet, p: &mut Parsed) -> Option<u32> {
    match &ct.begin(pkt, p, 1) {
        Ok(Begin::Tracked(r)) => {
            debug_assert_eq!(r.state, CtState::Established);
            r.entry
        }
        _ => None,
    }
}

/// A new connection: packet `f` (parsed as `p`) copied into `pkt`, tracked with source
/// NAT `nat`, committed.
fn connect(ct: &mut Conntrack, pkt: &mut Packet, (f, p): &(Vec<u8>, Parsed), nat: &Nat) -> u32 {
    pkt.data.clear();
    pkt.data.extend_from_slice(f);
    let mut p = *p;
    // As the pipeline does: begin, then the NAT given to start.
    let Ok(Begin::Starts(s)) = ct.begin(pkt, &mut p, 1) else {
        panic!("a new connection");
    };
    let r = ct.start(s, pkt, &mut p, Some(nat), 1).unwrap();
    ct.commit(r.pending.unwrap(), 1).unwrap()
}

/// New connections with source NAT: in a table that grows from empty, on both page
/// sizes; then in a full one, where each evicts (below).
fn new_with_nat(c: &mut Criterion) {
    const N: u32 = 1 << 20;
    let pristine: Vec<(Vec<u8>, Parsed)> = (0..N).map(conn).collect();
    let nat = Nat {
        dnat: None,
        snat: Some((
            IpAddr::V4(Ipv4Addr::new(192, 168, 50, 10)).into(),
            Some((1024, 65535)),
        )),
    };
    let mut g = c.benchmark_group("conntrack_pages");
    g.throughput(Throughput::Elements(1));
    for (label, huge) in PAGES {
        g.bench_function(format!("snat_port_allocation_and_commit_{label}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut done = 0u64;
                let mut pkt = Packet::new(Vec::with_capacity(128), 0, 0);
                while done < iters {
                    // A fresh table for each round (not timed); pages first touched in
                    // the loop.
                    let round = (iters - done).min(u64::from(N));
                    let mut ct = table(N as usize, huge);
                    let start = Instant::now();
                    for conn in &pristine[..round as usize] {
                        black_box(connect(&mut ct, &mut pkt, conn, &nat));
                    }
                    total += start.elapsed();
                    done += round;
                }
                total
            })
        });
    }
    // In a full table (allocated whole for 2^19 connections, huge pages, the prefetch
    // instruction): each new connection evicts the oldest one that never saw a reply, as
    // a worker's table does once it is full of unanswered connections. The connections
    // cycle through the 2^20 keys, so a key comes back only long after its connection
    // was evicted.
    const MAX: u32 = 1 << 19;
    let mut ct = table(MAX as usize, true);
    let mut pkt = Packet::new(Vec::with_capacity(128), 0, 0);
    for conn in &pristine[..MAX as usize] {
        connect(&mut ct, &mut pkt, conn, &nat);
    }
    assert_eq!(ct.len(), MAX as usize);
    g.sample_size(20);
    let mut k = MAX;
    g.bench_function("snat_new_connection_evicting_in_full_table_huge", |b| {
        b.iter(|| {
            let id = connect(&mut ct, &mut pkt, &pristine[(k % N) as usize], &nat);
            k = k.wrapping_add(1);
            id
        })
    });
    g.finish();
    assert_eq!(ct.len(), MAX as usize);
    assert!(ct.stats().evicted >= u64::from(k - MAX));
}

/// Two ports, the servers' /16 routed out of the second, a table for 1 M connections set
/// up as the worker sets it up (whole, huge pages, the prefetch instruction).
fn forwarding_pipeline(max: usize) -> Pipeline {
    let port = |name: &str, last: u8| PortSpec {
        name: name.into(),
        mac: MacAddr([2, 0, 0, 0, 0, last]),
        mtu: Some(1500),
        ..PortSpec::default()
    };
    let spec = TablesSpec {
        ports: vec![port("a", 1), port("b", 2)],
        routes: vec![RouteSpec {
            prefix: "172.16.0.0/16".parse().unwrap(),
            port: "b".into(),
            next_hop_mac: Some(MacAddr([2, 0, 0, 0, 0, 3])),
            via: None,
        }],
        ct: CtSpec {
            max_entries: Some(max),
            ..CtSpec::default()
        },
        ..TablesSpec::default()
    };
    let mut p = Pipeline::new(Arc::new(spec.compile().unwrap()));
    let ct = p.conntrack_mut();
    ct.preallocate();
    ct.set_prefetch(Some(ferry_linux::prefetch));
    for (ptr, len) in ct.memory_regions() {
        ferry_linux::advise_huge_pages(ptr, len).unwrap();
    }
    p
}

fn pipeline(c: &mut Criterion) {
    const N: u32 = 1_000_000;
    let mut p = forwarding_pipeline(N as usize + 1);
    let mut out = Vec::with_capacity(64);
    let mut trace = Trace::disabled();
    for i in 0..N {
        out.clear();
        p.process(Packet::new(conn(i).0, 0, 0), &mut out, &mut trace);
    }
    assert_eq!(p.conntrack().len(), N as usize);
    // 4096 frames of connections spread over the whole table.
    let frames: Vec<Vec<u8>> = (0..4096u32)
        .map(|i| conn(i.wrapping_mul(2_654_435_761) % N).0)
        .collect();
    let mut g = c.benchmark_group("pipeline_pages");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.bench_function("forward_udp4_64B_1M_huge", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for k in 0..iters as usize {
                out.clear();
                let pkt = Packet::new(frames[k & 4095].clone(), 0, 1);
                black_box(p.process(pkt, &mut out, &mut trace));
            }
            start.elapsed()
        })
    });
    g.bench_function("forward_udp4_64B_1M_huge_batch32", |b| {
        b.iter_custom(|iters| {
            in_batches(iters, |k, n| {
                out.clear();
                let pkts = frames[k..k + n]
                    .iter()
                    .map(|f| Packet::new(f.clone(), 0, 1));
                p.process_batch(pkts, &mut out, &mut trace);
                black_box(out.len());
            })
        })
    });
    g.finish();
}

/// What this machine's memory allows, for the 1 M rows above: 64-byte lines read at
/// random from 256 MiB on huge pages (more than the table at 1 M connections).
/// `random_line_in_groups_of_32`: 32 random lines prefetched, then read, per line: the
/// rate at which the core brings in lines when it keeps as many misses in flight as it
/// can. `dependent_line`: each line read names the next (a random cycle through all of
/// them): the latency of one miss.
fn memory_floor(c: &mut Criterion) {
    const LINES: usize = 4 << 20;
    let mut mem: Vec<[u64; 8]> = Vec::with_capacity(LINES);
    ferry_linux::advise_huge_pages(mem.as_ptr().cast(), LINES * 64).unwrap();
    mem.resize(LINES, [0; 8]);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    // Every line in a random order (Fisher-Yates), followed as one cycle.
    let mut order: Vec<u32> = (0..LINES as u32).collect();
    for i in (1..LINES).rev() {
        let j = (rnd() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    for (i, &line) in order.iter().enumerate() {
        mem[line as usize][0] = u64::from(order[(i + 1) % LINES]);
    }
    let mut g = c.benchmark_group("memory_floor");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.bench_function("random_line_in_groups_of_32_huge", |b| {
        b.iter_custom(|iters| {
            let mut addrs = [std::ptr::null::<u8>(); 32];
            let mut lines = [0usize; 32];
            let mut sum = 0u64;
            let start = Instant::now();
            for _ in 0..iters.div_ceil(32) {
                for (l, a) in lines.iter_mut().zip(&mut addrs) {
                    *l = rnd() as usize & (LINES - 1);
                    *a = mem[*l].as_ptr().cast();
                }
                ferry_linux::prefetch(&addrs);
                for &l in &lines {
                    sum = sum.wrapping_add(mem[l][1]);
                }
            }
            black_box(sum);
            start.elapsed()
        })
    });
    let mut at = 0usize;
    g.bench_function("dependent_line_huge", |b| {
        b.iter(|| {
            at = mem[at][0] as usize;
            at
        })
    });
    g.finish();
}

criterion_group!(benches, established, new_with_nat, pipeline, memory_floor);
criterion_main!(benches);
