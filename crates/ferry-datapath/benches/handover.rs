//! Handover benchmarks: the old pipeline's save and encode of its state, and the new
//! pipeline's decode and restore of it, at 10 000 and 262 143 connections (the default
//! table holds 262 144). Both run while forwarding is paused, so their sum is the
//! handover's gap. The save alone is what a checkpoint (issue 24: saved every second
//! for crash recovery, encoded off the worker) holds forwarding for. Figures and the
//! machine they ran on: docs/benchmarks.md.
// The save is timed by hand, so that dropping the state is not.
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use ferry_datapath::handover::{self, Connection, Tcp, TcpSide, TcpState, Tracking, Tuple};
use ferry_datapath::{
    BackendSpec, MacAddr, NodeSpec, Pipeline, PortKind, PortSpec, ServiceSpec, Tables, TablesSpec,
};

const SEC: u64 = 1_000_000_000;
/// Endpoints of the Service the connections go to.
const ENDPOINTS: u32 = 64;

fn endpoint(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 244, 1, 10 + (i % ENDPOINTS) as u8))
}

/// Node 1 with an uplink, a pod port and a Service with [`ENDPOINTS`] local endpoints.
fn tables() -> Arc<Tables> {
    let spec = TablesSpec {
        ports: vec![
            PortSpec {
                name: "eth0".into(),
                kind: PortKind::Uplink,
                mac: MacAddr([2, 0, 0, 0, 0, 1]),
                addresses: vec!["192.168.50.10/24".parse().unwrap()],
                ..PortSpec::default()
            },
            PortSpec {
                name: "pod-a".into(),
                kind: PortKind::Pod,
                mac: MacAddr([2, 0, 0, 0, 1, 1]),
                peer_mac: Some(MacAddr([0x0a, 0x58, 0, 0, 1, 5])),
                addresses: vec!["10.244.1.5".parse().unwrap()],
                ..PortSpec::default()
            },
        ],
        node: NodeSpec {
            name: "node1".into(),
            ..NodeSpec::default()
        },
        services: vec![ServiceSpec {
            name: "default/web:http".into(),
            proto: "tcp".into(),
            port: 80,
            cluster_ips: vec!["10.96.0.10".parse().unwrap()],
            backends: (0..ENDPOINTS)
                .map(|i| BackendSpec {
                    addr: endpoint(i),
                    port: 8080,
                    node: Some("node1".into()),
                    no_node: false,
                    ready: true,
                    serving: None,
                    terminating: false,
                    hints: Default::default(),
                })
                .collect(),
            ..ServiceSpec::default()
        }],
        ..TablesSpec::default()
    };
    Arc::new(spec.compile().unwrap())
}

fn side(end: u32) -> TcpSide {
    TcpSide {
        end,
        max_end: end.wrapping_add(64240 << 7),
        max_window: 64240 << 7,
        window_scale: 7,
        sent_window_scale: true,
        liberal: false,
        unacknowledged: false,
    }
}

/// Connection `i`: an established TCP connection from client 10.(i>>16).(i>>8).i to the
/// Service's cluster IP, translated to one of its endpoints.
fn connection(i: u32) -> Connection {
    let b = i.to_be_bytes();
    let client = IpAddr::V4(Ipv4Addr::new(10, 100 + b[1], b[2], b[3]));
    let sport = 10_000 + (i % 50_000) as u16;
    Connection {
        zone: 0,
        proto: 6,
        original: Tuple {
            src: client,
            dst: "10.96.0.10".parse().unwrap(),
            src_port: sport,
            dst_port: 80,
        },
        reply: Tuple {
            src: endpoint(i),
            dst: client,
            src_port: 8080,
            dst_port: sport,
        },
        tracking: Tracking::Tcp(Tcp {
            state: TcpState::Established,
            reset_kept: false,
            original: side(i.wrapping_mul(7919)),
            reply: side(i.wrapping_mul(104_729)),
        }),
        seen_reply: true,
        assured: true,
        dnat: true,
        snat: false,
        mark: 1,
        labels: 0,
        tunnel_peer: None,
        packets: [u64::from(i % 1000) + 3, u64::from(i % 700) + 2],
        bytes: [u64::from(i) * 1400, u64::from(i) * 700],
        first_seen_ago_ns: 30 * SEC,
        last_seen_ago_ns: u64::from(i % 1000) * 1_000_000,
    }
}

fn state(n: u32) -> handover::SavedState {
    handover::SavedState {
        meta: handover::Meta {
            node: "node1".into(),
            outer_id: 0,
        },
        connections: (0..n).map(connection).collect(),
        ..handover::SavedState::default()
    }
}

/// A pipeline tracking the `n` connections of [`state`].
fn filled(tables: &Arc<Tables>, n: u32) -> Pipeline {
    let mut p = Pipeline::new(Arc::clone(tables));
    let r = p.restore_state(&state(n), 100 * SEC).unwrap();
    assert_eq!(r.connections, n as usize);
    p
}

fn bench(c: &mut Criterion) {
    let tables = tables();
    let mut g = c.benchmark_group("handover");
    g.sample_size(10);
    for n in [10_000u32, 262_143] {
        g.throughput(Throughput::Elements(u64::from(n)));
        let old = filled(&tables, n);
        // The state is dropped off the clock: the agent drops it after encoding, on
        // another thread than the worker's.
        g.bench_function(format!("save/{n}"), |b| {
            b.iter_custom(|iters| {
                let mut took = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let saved = black_box(&old).save_state(101 * SEC);
                    took += start.elapsed();
                    drop(black_box(saved));
                }
                took
            })
        });
        // A checkpoint's save into the state the last one gave back.
        let mut reused = old.save_state(100 * SEC);
        g.bench_function(format!("save_into/{n}"), |b| {
            b.iter(|| black_box(&old).save_state_into(101 * SEC, black_box(&mut reused)))
        });
        drop(reused);
        g.bench_function(format!("save_encode/{n}"), |b| {
            b.iter(|| handover::encode(&black_box(&old).save_state(101 * SEC)))
        });
        let bytes = handover::encode(&old.save_state(101 * SEC));
        drop(old);
        eprintln!("handover/{n}: {} bytes", bytes.len());
        g.bench_function(format!("decode_restore/{n}"), |b| {
            b.iter_batched(
                || Pipeline::new(Arc::clone(&tables)),
                |mut new| {
                    let s = handover::decode(black_box(&bytes)).unwrap();
                    let r = new.restore_state(&s, 5 * SEC).unwrap();
                    assert_eq!(r.connections, n as usize);
                    new
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

/// Slots of the table a pre-copy saves of its base in one hold (the agent's
/// `PRECOPY_PART`).
const PART: usize = 16_384;

/// A pre-copy of a full table: one part of its base (what one hold of the workers
/// costs while the base is saved), and the pause at its end with `k` connections
/// changed since the base began: the giver's save and encode of the changes, the
/// taker's decode and apply of them over the base (the handover's gap but for the
/// socket).
fn precopy(c: &mut Criterion) {
    let tables = tables();
    let n = 262_143u32;
    let mut g = c.benchmark_group("handover");
    g.sample_size(10);
    let mut old = filled(&tables, n);
    old.track_changes();
    let mut part = handover::SavedState::default();
    g.throughput(Throughput::Elements(PART as u64));
    g.bench_function(format!("precopy_part/{n}"), |b| {
        b.iter(|| black_box(&old).save_base_into(101 * SEC, 0, PART, black_box(&mut part)))
    });
    drop(part);
    let mut base = handover::SavedState::default();
    let mut from = Some(0);
    while let Some(f) = from {
        from = old.save_base_into(101 * SEC, f, PART, &mut base);
    }
    let mut new = Pipeline::new(Arc::clone(&tables));
    new.restore_state(&base, 5 * SEC).unwrap();
    drop(base);
    for k in [0u32, n / 100, n / 10] {
        g.throughput(Throughput::Elements(u64::from(k.max(1))));
        g.bench_function(format!("precopy_pause/{n}/{k}"), |b| {
            b.iter_custom(|iters| {
                let mut took = Duration::ZERO;
                for _ in 0..iters {
                    old.track_changes();
                    for id in (0..n).step_by((n / k.max(1)) as usize).take(k as usize) {
                        black_box(old.conntrack_mut().get_mut(id));
                    }
                    let start = Instant::now();
                    let bytes = handover::encode(&old.save_changes(101 * SEC));
                    let changes = handover::decode(black_box(&bytes)).unwrap();
                    let r = new.apply_changes(&changes, 5 * SEC).unwrap();
                    took += start.elapsed();
                    assert_eq!(r.connections, k as usize);
                }
                took
            })
        });
    }
    assert_eq!(new.conntrack().len(), n as usize);
    g.finish();
}

criterion_group!(benches, bench, precopy);
criterion_main!(benches);
