//! Service benchmarks: compiling 1 K / 10 K / 100 K Service ports with 10 endpoints each
//! (time, and resident memory the result adds), an established cluster IP connection's packets
//! through the pipeline, new connections with endpoint choice (Maglev and random, side by
//! side), the endpoint choice alone, filling a Maglev table, and what load balancer
//! source ranges cost new and established connections. Figures:
//! docs/benchmarks.md.
// Benchmarks time themselves (and read their memory use): the purity is the library's.
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ferry_datapath::Packet;
use ferry_datapath::wire::build::{self, IpOpts};
use ferry_datapath::{
    Addr, BackendSpec, BalanceMode, BalanceSpec, FlowKey, MacAddr, NodeSpec, Pipeline, PortSpec,
    RouteSpec, ServiceSpec, Services, TablesSpec, Trace, Verdict, maglev, proto, rendezvous,
};

/// The process's resident memory in bytes (VmRSS), to report what compiled Services
/// hold.
fn rss() -> isize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<isize>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// `n` TCP Service ports, each with a cluster IP, a node port (for the first 30000) and
/// 10 endpoints spread over 10 nodes.
fn specs(n: usize) -> Vec<ServiceSpec> {
    (0..n)
        .map(|i| {
            let i = i as u32;
            ServiceSpec {
                name: format!("ns{}/svc{i}:http", i % 100),
                proto: "tcp".into(),
                port: 80,
                cluster_ips: vec![IpAddr::V4(Ipv4Addr::from(0x0a60_0000 + i))],
                node_port: (i < 30000).then(|| 30000 + (i % 30000) as u16),
                backends: (0..10u32)
                    .map(|j| BackendSpec {
                        addr: IpAddr::V4(Ipv4Addr::from(0x0af4_0000 + i * 10 + j)),
                        port: 8080,
                        node: Some(format!("node{j}")),
                        no_node: false,
                        ready: true,
                        serving: None,
                        terminating: false,
                        hints: Default::default(),
                    })
                    .collect(),
                ..ServiceSpec::default()
            }
        })
        .collect()
}

fn compile(c: &mut Criterion) {
    let mut g = c.benchmark_group("services_compile");
    g.sample_size(10);
    for n in [1_000usize, 10_000, 100_000] {
        let s = specs(n);
        let before = rss();
        let compiled = Services::compile(&s, "node0", []).unwrap();
        let held = rss() - before;
        eprintln!(
            "services_compile/{n}: compiled Services: resident memory grew by {:.1} MiB ({} bytes per Service port)",
            held as f64 / (1 << 20) as f64,
            held / n as isize
        );
        drop(compiled);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::from_parameter(n), &s, |b, s| {
            b.iter(|| Services::compile(black_box(s), "node0", []).unwrap())
        });
    }
    g.finish();
}

/// A pipeline with 10 K Services between a client port and a port towards the
/// endpoints, spreading connections by Maglev.
fn pipeline() -> Pipeline {
    pipeline_balanced(BalanceSpec::default())
}

/// The same, spreading connections as `balance` says.
fn pipeline_balanced(balance: BalanceSpec) -> Pipeline {
    pipeline_with(balance, specs(10_000))
}

/// The same with `services`.
fn pipeline_with(balance: BalanceSpec, services: Vec<ServiceSpec>) -> Pipeline {
    let spec = TablesSpec {
        services,
        balance,
        ..pipeline_spec()
    };
    Pipeline::new(Arc::new(spec.compile().unwrap()))
}

/// The tables of those pipelines, without Services.
fn pipeline_spec() -> TablesSpec {
    let port = |name: &str, last: u8| PortSpec {
        name: name.into(),
        mac: MacAddr([2, 0, 0, 0, 0, last]),
        ..PortSpec::default()
    };
    TablesSpec {
        ports: vec![port("clients", 1), port("endpoints", 2)],
        routes: vec![
            RouteSpec {
                prefix: "10.244.0.0/16".parse().unwrap(),
                port: "endpoints".into(),
                next_hop_mac: Some(MacAddr([2, 0, 0, 0, 0, 3])),
                via: None,
            },
            RouteSpec {
                prefix: "10.0.0.0/16".parse().unwrap(),
                port: "clients".into(),
                next_hop_mac: Some(MacAddr([2, 0, 0, 0, 0, 4])),
                via: None,
            },
        ],
        // Where connections of clients outside the cluster leave from.
        node: NodeSpec {
            name: "node0".into(),
            addresses: vec![IpAddr::V4(Ipv4Addr::new(192, 168, 0, 1))],
            ..NodeSpec::default()
        },
        ..TablesSpec::default()
    }
}

fn to_service(client: u32, sport: u16, svc: u32) -> Vec<u8> {
    to_frontend(client, sport, 0x0a60_0000 + svc)
}

/// A SYN from client `client` (10.0.0.0/8) at port `sport` to `frontend`:80.
fn to_frontend(client: u32, sport: u16, frontend: u32) -> Vec<u8> {
    build::tcp(
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + client)),
        IpAddr::V4(Ipv4Addr::from(frontend)),
        sport,
        80,
        1,
        0,
        build::tcp_flags::SYN,
        &[],
        &IpOpts::default(),
    )
}

fn packets(c: &mut Criterion) {
    let mut g = c.benchmark_group("services");
    g.throughput(Throughput::Elements(1));
    let mut out = Vec::with_capacity(4);
    let mut trace = Trace::disabled();

    // One established connection to a cluster IP: its packets are translated by the
    // conntrack entry, never balanced again.
    let mut p = pipeline();
    let client = IpAddr::V4(Ipv4Addr::from(0x0a00_0001));
    let syn = to_service(1, 40000, 4321);
    assert_eq!(
        p.process(Packet::new(syn, 0, 1), &mut out, &mut trace),
        Verdict::Forwarded
    );
    // The client is outside the cluster: the connection leaves with the node's address.
    let sent = ferry_datapath::wire::parse(&out[0].1.data, 0).unwrap().key;
    let synack = build::tcp(
        sent.dst.ip(),
        sent.src.ip(),
        sent.dst_port,
        sent.src_port,
        100,
        2,
        build::tcp_flags::SYN | build::tcp_flags::ACK,
        &[],
        &IpOpts::default(),
    );
    assert_eq!(
        p.process(Packet::new(synack, 1, 2), &mut out, &mut trace),
        Verdict::Forwarded
    );
    let ack = build::tcp(
        client,
        IpAddr::V4(Ipv4Addr::from(0x0a60_0000 + 4321)),
        40000,
        80,
        2,
        101,
        build::tcp_flags::ACK,
        &[0u8; 6],
        &IpOpts::default(),
    );
    let mut check = Vec::new();
    assert_eq!(
        p.process(Packet::new(ack.clone(), 0, 3), &mut check, &mut trace),
        Verdict::Forwarded
    );
    g.bench_function("established_cluster_ip_dnat", |b| {
        b.iter_batched(
            || Packet::new(ack.clone(), 0, 3),
            |pkt| {
                out.clear();
                p.process(pkt, &mut out, &mut trace)
            },
            BatchSize::SmallInput,
        )
    });

    // New connections: a fresh client address and port each time, to one of 10 K
    // Services; the table stays at its default bound by evicting unreplied entries.
    // Consistent (the default), Maglev and random, one after the other in this run.
    let mode = |mode| BalanceSpec {
        mode,
        ..BalanceSpec::default()
    };
    for (name, balance) in [
        (
            "new_connection_with_endpoint_choice",
            BalanceSpec::default(),
        ),
        (
            "new_connection_with_endpoint_choice_maglev",
            mode(BalanceMode::Maglev),
        ),
        (
            "new_connection_with_endpoint_choice_random",
            mode(BalanceMode::Random),
        ),
    ] {
        let mut p = pipeline_balanced(balance);
        let mut n = 0u32;
        g.bench_function(name, |b| {
            b.iter_batched(
                || {
                    n = n.wrapping_add(1);
                    Packet::new(
                        to_service(n >> 8, 1024 + (n & 0xff) as u16, n % 10_000),
                        0,
                        u64::from(n),
                    )
                },
                |pkt| {
                    out.clear();
                    p.process(pkt, &mut out, &mut trace)
                },
                BatchSize::SmallInput,
            )
        });
        // (When a filter left this benchmark out, nothing was sent.)
        assert!(n == 0 || p.stats().service_balanced > 0);
        // The same in receive batches of 32, as a worker runs them (figures per packet).
        g.throughput(Throughput::Elements(32));
        g.bench_function(format!("{name}_batch32"), |b| {
            b.iter_batched(
                || {
                    (0..32)
                        .map(|_| {
                            n = n.wrapping_add(1);
                            Packet::new(
                                to_service(n >> 8, 1024 + (n & 0xff) as u16, n % 10_000),
                                0,
                                u64::from(n),
                            )
                        })
                        .collect::<Vec<_>>()
                },
                |pkts| {
                    out.clear();
                    p.process_batch(pkts, &mut out, &mut trace)
                },
                BatchSize::SmallInput,
            )
        });
        g.throughput(Throughput::Elements(1));
    }
    g.finish();
}

/// The load balancer IP of Service port `i` of [`ranged`].
fn lb_ip(i: u32) -> u32 {
    0x0b60_0000 + i
}

/// [`specs`] with a load balancer IP each, and with `ranges` as their
/// loadBalancerSourceRanges.
fn ranged(n: usize, ranges: &[&str]) -> Vec<ServiceSpec> {
    let mut s = specs(n);
    for (i, spec) in s.iter_mut().enumerate() {
        spec.load_balancer_ips = vec![IpAddr::V4(Ipv4Addr::from(lb_ip(i as u32)))];
        spec.source_ranges = ranges.iter().map(|r| r.parse().unwrap()).collect();
    }
    s
}

/// What loadBalancerSourceRanges cost, side by side in one run: new connections to the
/// load balancer IPs of 10 000 Service ports without ranges, and with four ranges whose
/// last holds the client (every range is compared); then one established connection's
/// segments to such an IP, with and without ranges (they never look at them).
fn source_ranges(c: &mut Criterion) {
    let mut g = c.benchmark_group("source_ranges");
    g.throughput(Throughput::Elements(1));
    let mut out = Vec::with_capacity(4);
    let mut trace = Trace::disabled();
    let four = [
        "192.0.2.0/24",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "10.0.0.0/8",
    ];
    for (name, ranges) in [("none", &[][..]), ("four", &four[..])] {
        let mut p = pipeline_with(BalanceSpec::default(), ranged(10_000, ranges));
        let mut n = 0u32;
        g.bench_function(format!("new_connection/{name}"), |b| {
            b.iter_batched(
                || {
                    n = n.wrapping_add(1);
                    Packet::new(
                        to_frontend(n >> 8, 1024 + (n & 0xff) as u16, lb_ip(n % 10_000)),
                        0,
                        u64::from(n),
                    )
                },
                |pkt| {
                    out.clear();
                    p.process(pkt, &mut out, &mut trace)
                },
                BatchSize::SmallInput,
            )
        });
        assert!(n == 0 || p.stats().service_balanced > 0);
        assert_eq!(
            p.drops()
                .get(ferry_datapath::DropReason::ServiceSourceDenied),
            0,
            "every client is in a range"
        );

        // One established connection: SYN, SYN-ACK, then its ACKs.
        let mut p = pipeline_with(BalanceSpec::default(), ranged(10_000, ranges));
        let syn = to_frontend(1, 40000, lb_ip(4321));
        out.clear();
        assert_eq!(
            p.process(Packet::new(syn, 0, 1), &mut out, &mut trace),
            Verdict::Forwarded
        );
        let sent = ferry_datapath::wire::parse(&out[0].1.data, 0).unwrap().key;
        let synack = build::tcp(
            sent.dst.ip(),
            sent.src.ip(),
            sent.dst_port,
            sent.src_port,
            100,
            2,
            build::tcp_flags::SYN | build::tcp_flags::ACK,
            &[],
            &IpOpts::default(),
        );
        assert_eq!(
            p.process(Packet::new(synack, 1, 2), &mut out, &mut trace),
            Verdict::Forwarded
        );
        let ack = build::tcp(
            IpAddr::V4(Ipv4Addr::from(0x0a00_0001)),
            IpAddr::V4(Ipv4Addr::from(lb_ip(4321))),
            40000,
            80,
            2,
            101,
            build::tcp_flags::ACK,
            &[0u8; 6],
            &IpOpts::default(),
        );
        g.bench_function(format!("established/{name}"), |b| {
            b.iter_batched(
                || Packet::new(ack.clone(), 0, 3),
                |pkt| {
                    out.clear();
                    p.process(pkt, &mut out, &mut trace)
                },
                BatchSize::SmallInput,
            )
        });
    }
    // The check alone, on a Service port with four ranges: a source in the last, and
    // one in none.
    let services = Services::compile(&ranged(1, &four), "node0", []).unwrap();
    let svc = &services.services[0];
    for (name, src) in [("in_the_last", "10.1.2.3"), ("in_none", "100.64.0.1")] {
        let src: IpAddr = src.parse().unwrap();
        g.bench_function(format!("check/{name}"), |b| {
            b.iter(|| svc.source_allowed(black_box(src)))
        });
    }
    g.finish();
}

/// What topology hints cost, side by side in one run: compiling 10 000 Service ports
/// of 10 endpoints on 10 nodes in 5 zones without hints and with PreferSameZone's, and
/// a new connection's endpoint choice among them (the hints leave 2 of the 10).
fn topology(c: &mut Criterion) {
    let mut g = c.benchmark_group("topology");
    let mut out = Vec::with_capacity(4);
    let mut trace = Trace::disabled();
    let hinted = |hints: bool| {
        let mut s = specs(10_000);
        for spec in &mut s {
            for (j, b) in spec.backends.iter_mut().enumerate() {
                if hints {
                    b.hints.zones = vec![format!("zone-{}", j / 2)];
                }
            }
        }
        s
    };
    for (name, hints) in [("none", false), ("zone_hints", true)] {
        let s = hinted(hints);
        g.throughput(Throughput::Elements(s.len() as u64));
        g.bench_function(format!("compile/{name}"), |b| {
            b.iter(|| {
                Services::compile_on(
                    black_box(&s),
                    "node0",
                    Some("zone-0"),
                    [],
                    BalanceSpec::default(),
                )
                .unwrap()
            })
        });
        let mut spec = TablesSpec {
            services: s,
            ..pipeline_spec()
        };
        spec.node.zone = Some("zone-0".into());
        let mut p = Pipeline::new(Arc::new(spec.compile().unwrap()));
        let mut n = 0u32;
        g.throughput(Throughput::Elements(1));
        g.bench_function(format!("new_connection/{name}"), |b| {
            b.iter_batched(
                || {
                    n = n.wrapping_add(1);
                    Packet::new(
                        to_service(n >> 8, 1024 + (n & 0xff) as u16, n % 10_000),
                        0,
                        u64::from(n),
                    )
                },
                |pkt| {
                    out.clear();
                    p.process(pkt, &mut out, &mut trace)
                },
                BatchSize::SmallInput,
            )
        });
        assert!(n == 0 || p.stats().service_balanced > 0);
        if hints && n > 0 {
            // Every connection went to one of the zone's two endpoints (j = 0, 1).
            let s = &p.tables().services.services[0];
            assert_eq!(
                s.eligible(0, ferry_datapath::TrafficPolicy::Cluster).len(),
                2
            );
        }
    }
    g.finish();
}

/// Flow `i` of a stream of new connections: clients and ports that change every time.
fn flow(i: u32) -> FlowKey {
    FlowKey {
        src: Addr::from(Ipv4Addr::from(0x0a00_0000 + (i >> 8))),
        dst: Addr::from(Ipv4Addr::from(0x0a60_0000 + (i % 10_000))),
        zone: 0,
        proto: proto::TCP,
        src_port: 1024 + (i & 0xff) as u16,
        dst_port: 80,
    }
}

/// The endpoint choice alone, for one Service port of 10 endpoints and across 10 K of
/// them (each a table, or a set, of its own: the memory a choice touches): a Maglev
/// table's lookup and rendezvous hashing against the random choice, a keyed hash of the
/// flow modulo the number of endpoints (what `random` and the choice before Maglev do);
/// and both consistent choices across 10 K Service ports of 64 endpoints, the largest
/// set `consistent` chooses from by rendezvous hashing.
fn choice(c: &mut Criterion) {
    let mut g = c.benchmark_group("endpoint_choice");
    g.throughput(Throughput::Elements(1));
    let endpoints = |s: u32| -> Vec<(IpAddr, u16)> {
        (0..10u32)
            .map(|j| (IpAddr::V4(Ipv4Addr::from(0x0af4_0000 + s * 10 + j)), 8080))
            .collect()
    };
    let seed = maglev::DEFAULT_SEED;
    for services in [1u32, 10_000] {
        let tables: Vec<maglev::Table> = (0..services)
            .map(|s| maglev::Table::new(&endpoints(s), seed))
            .collect();
        if services > 1 {
            // The same tables one after another in one arena on transparent huge pages:
            // whether their misses cost a page walk as well as a cache line.
            let m = tables[0].len();
            let mut arena: Vec<u8> = Vec::with_capacity(m * services as usize);
            advise_huge_pages(arena.as_ptr(), arena.capacity());
            for t in &tables {
                arena.extend_from_slice(t.narrow_slots().unwrap());
            }
            let mut i = 0u32;
            g.bench_function(BenchmarkId::new("maglev_arena_huge_pages", services), |b| {
                b.iter(|| {
                    i = i.wrapping_add(1);
                    let k = flow(i);
                    let at = (i % services) as usize * m;
                    let h = maglev::flow_hash(black_box(&k), seed);
                    black_box(arena[at + (h % m as u64) as usize])
                })
            });
        }
        let weights: Vec<rendezvous::Weights> = (0..services)
            .map(|s| rendezvous::Weights::new(&endpoints(s), seed))
            .collect();
        let mut i = 0u32;
        g.bench_function(BenchmarkId::new("rendezvous", services), |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                let k = flow(i);
                let w = &weights[(i % services) as usize];
                black_box(w.pick(maglev::flow_hash(black_box(&k), seed)))
            })
        });
        let sets: Vec<Vec<u16>> = (0..services).map(|_| (0..10).collect()).collect();
        let hasher = ahash::RandomState::new();
        let mut i = 0u32;
        g.bench_function(BenchmarkId::new("maglev", services), |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                let k = flow(i);
                let t = &tables[(i % services) as usize];
                black_box(t.pick(black_box(&k), seed))
            })
        });
        let mut i = 0u32;
        g.bench_function(BenchmarkId::new("random", services), |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                let k = flow(i);
                let set = &sets[(i % services) as usize];
                black_box(set[(hasher.hash_one(black_box(&k)) % set.len() as u64) as usize])
            })
        });
    }
    let wide = |s: u32| -> Vec<(IpAddr, u16)> {
        (0..64u32)
            .map(|j| (IpAddr::V4(Ipv4Addr::from(0x0b00_0000 + s * 64 + j)), 8080))
            .collect()
    };
    let services = 10_000u32;
    let weights: Vec<rendezvous::Weights> = (0..services)
        .map(|s| rendezvous::Weights::new(&wide(s), seed))
        .collect();
    let mut i = 0u32;
    g.bench_function(BenchmarkId::new("rendezvous_64", services), |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let k = flow(i);
            let w = &weights[(i % services) as usize];
            black_box(w.pick(maglev::flow_hash(black_box(&k), seed)))
        })
    });
    drop(weights);
    let tables: Vec<maglev::Table> = (0..services)
        .map(|s| maglev::Table::new(&wide(s), seed))
        .collect();
    let mut i = 0u32;
    g.bench_function(BenchmarkId::new("maglev_64", services), |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let k = flow(i);
            black_box(tables[(i % services) as usize].pick(black_box(&k), seed))
        })
    });
    g.finish();
    let mut g = c.benchmark_group("maglev_fill");
    g.sample_size(20);
    for n in [2u32, 10, 100, 1000] {
        let eps: Vec<(IpAddr, u16)> = (0..n)
            .map(|j| (IpAddr::V4(Ipv4Addr::from(0x0af4_0000 + j)), 8080))
            .collect();
        g.bench_with_input(BenchmarkId::from_parameter(n), &eps, |b, eps| {
            b.iter(|| maglev::Table::new(black_box(eps), seed))
        });
    }
    g.finish();
}

criterion_group!(benches, compile, packets, choice, source_ranges, topology);
criterion_main!(benches);

/// Asks for transparent huge pages over the whole 2 MiB pages of `[ptr, ptr + len)`,
/// before they are touched (as the worker does for the connection table); best effort.
fn advise_huge_pages(ptr: *const u8, len: usize) {
    const HUGE: usize = 2 << 20;
    let start = (ptr as usize).next_multiple_of(HUGE);
    let end = (ptr as usize + len) / HUGE * HUGE;
    if end > start {
        // SAFETY: madvise(MADV_HUGEPAGE) only changes how the kernel backs the range,
        // which lies inside the allocation; it reads, writes and unmaps nothing.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}
