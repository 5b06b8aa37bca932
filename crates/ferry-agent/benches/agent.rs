//! Agent benchmarks: compiling a node's tables from 1 K / 10 K / 100 K Services with 10
//! endpoints each (time, and resident memory the result adds), and the time from one
//! EndpointSlice change to a running worker using the new tables, at 10 K Services.
//! The latter runs a real worker on a TAP, so it needs root. Figures:
//! docs/benchmarks.md.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ferry_agent::cluster::{Cluster, Kind, ObjectKey};
use ferry_agent::compile::{CompileOptions, node_tables};
use ferry_agent::run::{Agent, Options};
use ferry_datapath::TablesSpec;
use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeSpec, NodeStatus, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

const NODE: &str = "node0";

fn meta(ns: Option<&str>, name: &str, labels: Option<(&str, &str)>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: ns.map(Into::into),
        labels: labels.map(|(k, v)| BTreeMap::from([(k.to_string(), v.to_string())])),
        ..ObjectMeta::default()
    }
}

fn node() -> Node {
    Node {
        metadata: meta(None, NODE, None),
        spec: Some(NodeSpec {
            pod_cidr: Some("10.244.0.0/24".into()),
            pod_cidrs: Some(vec!["10.244.0.0/24".into()]),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: "192.168.77.1".into(),
            }]),
            ..NodeStatus::default()
        }),
    }
}

fn service(i: u32) -> Service {
    let ip = Ipv4Addr::from(0x0a60_0000 + i).to_string();
    Service {
        metadata: meta(Some(&format!("ns{}", i % 100)), &format!("svc{i}"), None),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: Some(ip.clone()),
            cluster_ips: Some(vec![ip]),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                protocol: Some("TCP".into()),
                port: 80,
                target_port: Some(IntOrString::Int(8080)),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The slice of Service `i`: 10 endpoints on 10 nodes, the first `ready` of them ready.
fn slice(i: u32, ready: usize) -> EndpointSlice {
    EndpointSlice {
        metadata: meta(
            Some(&format!("ns{}", i % 100)),
            &format!("svc{i}-abcde"),
            Some(("kubernetes.io/service-name", &format!("svc{i}"))),
        ),
        address_type: "IPv4".into(),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            protocol: Some("TCP".into()),
            port: Some(8080),
            ..EndpointPort::default()
        }]),
        endpoints: Some(
            (0..10u32)
                .map(|j| Endpoint {
                    addresses: vec![Ipv4Addr::from(0x0af4_0000 + i * 10 + j).to_string()],
                    conditions: Some(EndpointConditions {
                        ready: Some((j as usize) < ready),
                        ..EndpointConditions::default()
                    }),
                    node_name: Some(format!("node{j}")),
                    ..Endpoint::default()
                })
                .collect(),
        ),
    }
}

fn cluster(n: u32) -> Cluster {
    let mut c = Cluster::default();
    c.apply(node()).unwrap();
    for i in 0..n {
        c.apply(service(i)).unwrap();
        c.apply(slice(i, 10)).unwrap();
    }
    c
}

fn rss() -> isize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<isize>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn compile(c: &mut Criterion) {
    let mut g = c.benchmark_group("agent_compile");
    g.sample_size(10);
    for n in [1_000u32, 10_000, 100_000] {
        let cl = cluster(n);
        let before = rss();
        let compiled = node_tables(&cl, NODE, None, &[], &CompileOptions::default()).unwrap();
        eprintln!(
            "agent_compile/{n}: node tables (spec and compiled) add {:.1} MiB resident",
            (rss() - before) as f64 / (1 << 20) as f64
        );
        drop(compiled);
        g.throughput(Throughput::Elements(u64::from(n)));
        g.bench_with_input(BenchmarkId::from_parameter(n), &cl, |b, cl| {
            b.iter(|| {
                node_tables(black_box(cl), NODE, None, &[], &CompileOptions::default()).unwrap()
            })
        });
    }
    g.finish();
}

/// One EndpointSlice change (an endpoint turns unready, then ready again) at 10 K
/// Services, from the agent learning of it to the worker using the new tables.
fn endpoint_change(c: &mut Criterion) {
    if not_root() {
        eprintln!("endpoint_change: needs root (it runs a worker on a TAP); skipped");
        return;
    }
    let base: TablesSpec = serde_saphyr::from_str(
        r#"
ports:
  - { name: host, kind: host, mac: "02:fe:00:00:01:01", addresses: [169.254.1.1] }
"#,
    )
    .unwrap();
    let tap = format!("fybench{}", std::process::id() % 10_000);
    let opts = Options {
        node: NODE.into(),
        base: Some(base),
        host_tap: Some(tap),
        ..Options::default()
    };
    let n = 10_000;
    let mut current = Arc::new(cluster(n));
    let (mut agent, _) = Agent::start(opts, Arc::clone(&current)).unwrap();
    let mut g = c.benchmark_group("endpoint_change_to_worker");
    g.sample_size(50);
    let mut flip = false;
    let slice_key = ObjectKey::new("ns42", "svc4242-abcde");
    g.bench_function(BenchmarkId::from_parameter(n), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                flip = !flip;
                let mut next = (*current).clone();
                next.apply(slice(4242, if flip { 9 } else { 10 })).unwrap();
                let next = Arc::new(next);
                let changed = [(Kind::EndpointSlice, slice_key.clone())];
                let t0 = Instant::now();
                let a = agent.apply_changes(Arc::clone(&next), &changed).unwrap();
                total += t0.elapsed();
                assert!(a.incremental);
                current = next;
            }
            total
        })
    });
    g.finish();
    agent.stop().unwrap();
}

/// True unless running as root.
fn not_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|v| v.split_whitespace().next() != Some("0"))
        })
        .unwrap_or(true)
}

criterion_group!(benches, compile, endpoint_change);
criterion_main!(benches);
