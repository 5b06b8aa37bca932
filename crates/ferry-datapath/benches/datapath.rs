//! Datapath micro-benchmarks: parse + flow key, reassembly, segmentation, and one packet
//! through the whole pipeline. Figures and the machine they ran on: docs/benchmarks.md.
// Benchmarks time themselves (and read their memory use): the purity is the library's.
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;
use std::net::IpAddr;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use ferry_datapath::DropCounters;
use ferry_datapath::ipf::{self, Reassembler};
use ferry_datapath::wire::build::{self, IpOpts, tcp_flags};
use ferry_datapath::{
    MacAddr, Packet, Pipeline, PortSpec, RouteSpec, TablesSpec, Trace, VnetHdr, gso, wire,
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A 64-byte frame (60 bytes plus FCS on the wire): UDP over IPv4 with 18 bytes of payload.
fn frame64() -> Vec<u8> {
    build::udp(
        ip("10.0.0.1"),
        ip("10.0.0.2"),
        40000,
        8080,
        &[0u8; 18],
        &IpOpts::default(),
    )
}

fn parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse");
    g.throughput(Throughput::Elements(1));
    let v4 = frame64();
    assert_eq!(v4.len(), 60);
    g.bench_function("udp4_64B_flow_key", |b| {
        b.iter(|| wire::parse(black_box(&v4), 0))
    });
    let v6 = build::tcp(
        ip("fd00::1"),
        ip("fd00::2"),
        40000,
        80,
        1,
        1,
        tcp_flags::ACK,
        &[],
        &IpOpts::default(),
    );
    g.bench_function("tcp6_flow_key", |b| {
        b.iter(|| wire::parse(black_box(&v6), 0))
    });
    g.finish();
}

fn fragments(len: usize, id: u16) -> Vec<Packet> {
    let o = IpOpts {
        id,
        ..IpOpts::default()
    };
    let whole = build::udp(
        ip("10.0.0.1"),
        ip("10.0.0.2"),
        40000,
        8080,
        &build::pattern(len, 1),
        &o,
    );
    let parsed = wire::parse(&whole, 0).unwrap();
    let mut out = Vec::new();
    ipf::refragment(&Packet::new(whole, 0, 0), &parsed, 1500, &mut out).unwrap();
    out
}

fn reassembly(c: &mut Criterion) {
    let mut g = c.benchmark_group("ipf");
    // 4000 bytes of UDP: three fragments of at most 1500 bytes.
    let frags = fragments(4000, 1);
    assert_eq!(frags.len(), 3);
    let parsed: Vec<_> = frags
        .iter()
        .map(|p| wire::parse(&p.data, 0).unwrap())
        .collect();
    g.throughput(Throughput::Elements(1));
    // Steady state, as on a live port: each round copies the three fragments into fresh
    // buffers (as receiving them would), reassembles, and frees the datagram (as sending
    // it would). The copies are part of the figure, so it is a lower bound.
    g.bench_function("reassemble_3_fragments_v4", |b| {
        let mut r = Reassembler::new(ipf::Config::default());
        let mut drops = DropCounters::default();
        b.iter(|| {
            let mut done = None;
            for (f, p) in frags.iter().zip(&parsed) {
                if let ipf::Outcome::Complete(pkt, _) = r.process(f.clone(), p, &mut drops) {
                    done = Some(pkt.data.len());
                }
            }
            done.expect("datagram completes")
        })
    });
    g.finish();
}

fn segmentation(c: &mut Criterion) {
    let mut g = c.benchmark_group("gso");
    // The largest IPv4 TCP packet: 65535 bytes.
    let payload = 65535 - 20 - 20;
    let f = build::tcp(
        ip("10.0.0.1"),
        ip("10.0.0.2"),
        40000,
        80,
        1,
        1,
        tcp_flags::ACK,
        &build::pattern(payload, 3),
        &IpOpts::default(),
    );
    let mut pkt = Packet::new(f, 0, 0);
    pkt.meta.vnet.gso_type = VnetHdr::GSO_TCPV4;
    pkt.meta.vnet.gso_size = 1448;
    let parsed = wire::parse(&pkt.data, 0).unwrap();
    g.throughput(Throughput::Bytes(payload as u64));
    let mut out = Vec::with_capacity(64);
    g.bench_function("tcp4_64KiB_mss1448", |b| {
        b.iter(|| {
            out.clear();
            gso::segment(black_box(&pkt), &parsed, 1500, &mut out).unwrap();
            out.len()
        })
    });
    g.finish();
}

fn pipeline(c: &mut Criterion) {
    let port = |name: &str, last: u8| PortSpec {
        name: name.into(),
        mac: MacAddr([2, 0, 0, 0, 0, last]),
        mtu: Some(1500),
        ..PortSpec::default()
    };
    let spec = TablesSpec {
        ports: vec![port("a", 1), port("b", 2)],
        routes: vec![RouteSpec {
            prefix: "10.0.0.0/24".parse().unwrap(),
            port: "b".into(),
            next_hop_mac: Some(MacAddr([2, 0, 0, 0, 0, 3])),
            via: None,
        }],
        ..TablesSpec::default()
    };
    let mut p = Pipeline::new(Arc::new(spec.compile().unwrap()));
    let f = frame64();
    let mut out = Vec::with_capacity(4);
    let mut trace = Trace::disabled();
    let mut g = c.benchmark_group("pipeline");
    g.throughput(Throughput::Elements(1));
    g.bench_function("forward_udp4_64B", |b| {
        b.iter_batched(
            || Packet::new(f.clone(), 0, 0),
            |pkt| {
                out.clear();
                p.process(pkt, &mut out, &mut trace)
            },
            BatchSize::SmallInput,
        )
    });
    // As a worker hands over a receive batch: per packet, in batches of 32.
    g.bench_function("forward_udp4_64B_batch32", |b| {
        b.iter_custom(|iters| {
            let start = std::time::Instant::now();
            let mut left = iters;
            while left > 0 {
                let n = left.min(32);
                out.clear();
                p.process_batch(
                    (0..n).map(|_| Packet::new(f.clone(), 0, 0)),
                    &mut out,
                    &mut trace,
                );
                black_box(out.len());
                left -= n;
            }
            start.elapsed()
        })
    });
    g.finish();
}

criterion_group!(benches, parse, reassembly, segmentation, pipeline);
criterion_main!(benches);
