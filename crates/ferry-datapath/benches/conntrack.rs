//! Conntrack benchmarks: a packet of an established connection at 1 K, 1 M and 10 M
//! tracked connections, alone and in prefetched batches of 32 (and at 1 K with packets
//! that stay in cache, for the work alone); a new connection with
//! source NAT port allocation (in a table growing to 1 M, and in a small one that stays
//! in cache); memory per connection. Figures and the machine they ran
//! on: docs/benchmarks.md.
// Benchmarks time themselves (and read their memory use): the purity is the library's.
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ferry_datapath::Addr;
use ferry_datapath::Packet;
use ferry_datapath::conntrack::{Begin, Config, Conntrack, CtState, Nat};
use ferry_datapath::wire::build::{self, IpOpts};
use ferry_datapath::wire::{Parsed, parse};

/// Connection `i`: UDP from 10.(i>>16).(i>>8).(i) port 1024 + i%50000 to one of 1000
/// servers on port 53, so that tuples are distinct and spread.
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

/// A table holding `n` replied (established) UDP connections.
fn filled(n: u32) -> Conntrack {
    let mut ct = Conntrack::new(Config {
        max_entries: n as usize + 1,
        ..Config::default()
    });
    for i in 0..n {
        let (f, mut p) = conn(i);
        let mut pkt = Packet::new(f, 0, 0);
        let r = ct.process(&mut pkt, &mut p, None, 0).unwrap();
        ct.commit(r.pending.unwrap(), 0).unwrap();
    }
    ct
}

/// Cheap deterministic shuffle of connection numbers, so that consecutive packets hit
/// unrelated entries (the cache-unfriendly case).
fn spread(i: u32, n: u32) -> u32 {
    (i.wrapping_mul(2_654_435_761)) % n
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

/// Processes `iters` packets from `pkts` (4096 of them) in batches of 32, prefetching
/// each batch's keys first; returns the time taken.
fn batched(ct: &mut Conntrack, pkts: &mut [(Packet, Parsed)], iters: u64) -> Duration {
    let start = Instant::now();
    let mut left = iters as usize;
    let mut k = 0usize;
    while left > 0 {
        let batch = &mut pkts[k..k + left.min(32)];
        ct.prefetch_batch(batch.iter().map(|(_, p)| &p.key));
        for (pkt, p) in batch.iter_mut() {
            black_box(established_entry(ct, pkt, p));
        }
        left -= batch.len();
        k = (k + 32) & 4095;
    }
    start.elapsed()
}

fn established(c: &mut Criterion) {
    let mut g = c.benchmark_group("conntrack_established");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    for (label, n) in [("1K", 1_000u32), ("1M", 1_000_000), ("10M", 10_000_000)] {
        let mut ct = filled(n);
        // 4096 packets of connections spread over the whole table.
        let pkts: Vec<(Packet, Parsed)> = (0..4096u32)
            .map(|i| {
                let (f, p) = conn(spread(i, n));
                (Packet::new(f, 0, 0), p)
            })
            .collect();
        let mut pkts = pkts;
        let mut k = 0usize;
        g.bench_function(format!("lookup_update_{label}"), |b| {
            b.iter(|| {
                let (pkt, p) = &mut pkts[k & 4095];
                k += 1;
                black_box(established_entry(&mut ct, pkt, p))
            })
        });
        if n == 1_000 {
            // 64 packets, whose headers stay in cache as right after parsing: the work
            // itself, without the misses on 4096 packets' headers.
            let mut k = 0usize;
            g.bench_function("lookup_update_1K_hot", |b| {
                b.iter(|| {
                    let (pkt, p) = &mut pkts[k & 63];
                    k += 1;
                    black_box(established_entry(&mut ct, pkt, p))
                })
            });
        }
        // The same packets in batches of 32, each batch prefetched before it is processed
        // (as a worker could do with a receive batch); one iteration is still one packet.
        g.bench_function(format!("lookup_update_{label}_batch32"), |b| {
            b.iter_custom(|iters| batched(&mut ct, &mut pkts, iters))
        });
        eprintln!(
            "conntrack memory at {n} connections: {} bytes per connection",
            ct.memory_bytes() / ct.len()
        );
    }
    g.finish();
}

fn new_with_nat(c: &mut Criterion) {
    let mut g = c.benchmark_group("conntrack_new");
    g.throughput(Throughput::Elements(1));
    // Up to 1 M connections in a table that grows from empty.
    new_connections(&mut g, "snat_port_allocation_and_commit", 1 << 20, false);
    // Rounds of 4 096 connections in a table allocated for 4 096, which stays in the
    // second-level cache: the work itself.
    new_connections(&mut g, "snat_port_allocation_and_commit_4K_hot", 4096, true);
    g.finish();
}

/// New UDP connections with source NAT, each committed, in rounds of at most `n`, each
/// round in a fresh table for `n` (preallocated when `prealloc`, else growing).
fn new_connections(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    n: u32,
    prealloc: bool,
) {
    let pristine: Vec<(Vec<u8>, Parsed)> = (0..n).map(conn).collect();
    let nat = Nat {
        dnat: None,
        snat: Some((
            Addr::from(IpAddr::V4(Ipv4Addr::new(192, 168, 50, 10))),
            Some((1024, 65535)),
        )),
    };
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut done = 0u64;
            let mut pkt = Packet::new(Vec::with_capacity(128), 0, 0);
            while done < iters {
                // A fresh table for each round of at most n connections (not timed).
                let round = (iters - done).min(u64::from(n));
                let mut ct = Conntrack::new(Config {
                    max_entries: n as usize,
                    ..Config::default()
                });
                if prealloc {
                    ct.preallocate();
                }
                let start = Instant::now();
                for (f, p) in &pristine[..round as usize] {
                    pkt.data.clear();
                    pkt.data.extend_from_slice(f);
                    let mut p = *p;
                    // As the pipeline does: begin, then the NAT given to start.
                    let Ok(Begin::Starts(s)) = ct.begin(&mut pkt, &mut p, 1) else {
                        panic!("a new connection");
                    };
                    let r = ct.start(s, &mut pkt, &mut p, Some(&nat), 1).unwrap();
                    black_box(ct.commit(r.pending.unwrap(), 1).unwrap());
                }
                total += start.elapsed();
                done += round;
            }
            total
        })
    });
}

criterion_group!(benches, established, new_with_nat);
criterion_main!(benches);
