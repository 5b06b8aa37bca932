//! Policy benchmarks: what a new connection pays for the decision with 1,000
//! NetworkPolicy rules (and 1,000 ordered tier rules) selecting its pod, the datapath's
//! share of compiling them, and an established packet's cost with and without policies
//! present. Figures and the machine they ran on: docs/benchmarks.md.
// Benchmarks time themselves: the purity is the library's.
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use ferry_datapath::policy::{
    ActionSpec, BlockSpec, Direction, DirectionSpec, MatchSpec, PodPolicySpec, PolicySpec,
    PortRangeSpec, Query, RuleSpec, SetSpec,
};
use ferry_datapath::proto;
use ferry_datapath::wire::build::{self, IpOpts};
use ferry_datapath::{MacAddr, Packet, Pipeline, PortKind, PortSpec, TablesSpec, Trace, Verdict};
use ipnet::IpNet;

const POD: &str = "10.0.0.2";
const POD_PORT: u16 = 1;

/// Peer `i` of rule `r`: 10.(1 + r / 256).(r % 256).i, ten of them per rule.
fn peer(r: usize, i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(
        10,
        1 + (r / 256) as u8,
        (r % 256) as u8,
        i as u8,
    ))
}

/// `n` rules selecting the pod, each from 10 pods of its own on one of 50 TCP ports
/// (as many policies, one rule each), in the tier `tier` (None: NetworkPolicy).
fn policy(n: usize, tier: Option<ActionSpec>) -> PolicySpec {
    let mut spec = PolicySpec::default();
    for r in 0..n {
        spec.policies.push(format!("NetworkPolicy bench/p{r}"));
        spec.sets.push(SetSpec {
            name: String::new(),
            blocks: (0..10)
                .map(|i| BlockSpec {
                    cidr: IpNet::new(peer(r, i), 32).unwrap(),
                    except: vec![],
                })
                .collect(),
        });
        spec.rules.push(RuleSpec {
            name: "ingress[0]".into(),
            policy: r as u32,
            action: tier.unwrap_or(ActionSpec::Accept),
            matches: vec![MatchSpec {
                peers: Some(vec![r as u32]),
                ports: vec![PortRangeSpec {
                    proto: "udp".into(),
                    port: Some(8000 + (r % 50) as u16),
                    end: None,
                }],
            }],
        });
    }
    let ids: Vec<u32> = (0..n as u32).collect();
    let ingress = match tier {
        None => DirectionSpec {
            isolated_by: ids.clone(),
            allow: ids,
            ..DirectionSpec::default()
        },
        Some(_) => DirectionSpec {
            admin: ids,
            ..DirectionSpec::default()
        },
    };
    spec.pods.push(PodPolicySpec {
        port: "pod".into(),
        ingress,
        egress: DirectionSpec::default(),
    });
    spec
}

fn tables(policy: PolicySpec) -> TablesSpec {
    TablesSpec {
        ports: vec![
            PortSpec {
                name: "up".into(),
                mac: MacAddr([2, 0, 0, 0, 0, 1]),
                mtu: Some(1500),
                ..PortSpec::default()
            },
            PortSpec {
                name: "pod".into(),
                kind: PortKind::Pod,
                mac: MacAddr([2, 0, 0, 0, 0, 2]),
                peer_mac: Some(MacAddr([2, 0, 0, 0, 0, 3])),
                addresses: vec![POD.parse().unwrap()],
                ..PortSpec::default()
            },
        ],
        policy,
        ..TablesSpec::default()
    }
}

fn decide(c: &mut Criterion) {
    let mut g = c.benchmark_group("policy");
    g.throughput(Throughput::Elements(1));
    let np = tables(policy(1000, None)).compile().unwrap();
    let last = Query {
        peer: peer(999, 9),
        proto: proto::UDP,
        port: 8000 + (999 % 50),
    };
    assert!(
        np.policy
            .decide(POD_PORT, Direction::Ingress, &last)
            .allowed
    );
    g.bench_function("decide_1000_np_rules_allowed_by_the_last", |b| {
        b.iter(|| {
            black_box(
                np.policy
                    .decide(POD_PORT, Direction::Ingress, black_box(&last)),
            )
        })
    });
    let stranger = Query {
        peer: "192.0.2.1".parse().unwrap(),
        ..last
    };
    assert!(
        !np.policy
            .decide(POD_PORT, Direction::Ingress, &stranger)
            .allowed
    );
    g.bench_function("decide_1000_np_rules_denied", |b| {
        b.iter(|| {
            black_box(
                np.policy
                    .decide(POD_PORT, Direction::Ingress, black_box(&stranger)),
            )
        })
    });
    let admin = tables(policy(1000, Some(ActionSpec::Accept)))
        .compile()
        .unwrap();
    assert!(
        admin
            .policy
            .decide(POD_PORT, Direction::Ingress, &last)
            .allowed
    );
    g.bench_function("decide_1000_admin_rules_matched_by_the_last", |b| {
        b.iter(|| {
            black_box(
                admin
                    .policy
                    .decide(POD_PORT, Direction::Ingress, black_box(&last)),
            )
        })
    });
    for n in [1000, 10000] {
        let spec = tables(policy(n, None));
        g.bench_function(format!("compile_tables_{n}_np_rules"), |b| {
            b.iter(|| black_box(spec.compile().unwrap()))
        });
    }
    g.finish();
}

/// An established UDP flow from an allowed peer to the pod, with no policy and with
/// 1,000 rules selecting the pod: the same work per packet.
fn established(c: &mut Criterion) {
    let mut g = c.benchmark_group("policy");
    g.throughput(Throughput::Elements(1));
    for (name, spec) in [
        ("established_udp4_no_policy", PolicySpec::default()),
        ("established_udp4_1000_np_rules", policy(1000, None)),
    ] {
        let mut p = Pipeline::new(Arc::new(tables(spec).compile().unwrap()));
        let f = build::udp(
            peer(999, 9),
            POD.parse().unwrap(),
            40000,
            8000 + (999 % 50),
            &[0u8; 18],
            &IpOpts::default(),
        );
        let mut out = Vec::with_capacity(4);
        let mut trace = Trace::disabled();
        let v = p.process(Packet::new(f.clone(), 0, 0), &mut out, &mut trace);
        assert_eq!(v, Verdict::Forwarded);
        g.bench_function(name, |b| {
            b.iter_batched(
                || Packet::new(f.clone(), 0, 0),
                |pkt| {
                    out.clear();
                    p.process(pkt, &mut out, &mut trace)
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, decide, established);
criterion_main!(benches);
