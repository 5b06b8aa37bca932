//! Policy compilation benchmarks: a cluster of 10 K pods in 100 namespaces (100 of them
//! on this node) with 1 K or 10 K NetworkPolicies and ClusterNetworkPolicies, compiled
//! into this node's policy section (time, and the resident memory the result adds), and
//! one policy edited: the policy section compiled again and patched into the node's
//! tables (what a policy change costs before the worker takes the tables). Figures: docs/benchmarks.md.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ferry_agent::cluster::Cluster;
use ferry_agent::cluster::ObjectKey;
use ferry_agent::compile::policy::{Changes, Held, PolicyOptions, compile, inputs};
use ferry_agent::compile::{AttachedPod, CompileOptions, node_tables, pod_port};
use ferry_agent::policy::ClusterNetworkPolicy;
use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeSpec, NodeStatus, Pod, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

const NODE: &str = "node0";
const PODS: u32 = 10_000;
const NAMESPACES: u32 = 100;
/// Pods of this node: every 101st (99 pods, one per namespace but one).
const LOCAL_EVERY: u32 = 101;
/// Distinct `app` labels per namespace.
const APPS: u32 = 20;

fn node() -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(NODE.into()),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            pod_cidrs: Some(vec!["10.0.0.0/8".into()]),
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

fn pod(i: u32) -> Pod {
    let ns = i % NAMESPACES;
    Pod {
        metadata: ObjectMeta {
            namespace: Some(format!("ns{ns}")),
            name: Some(format!("pod{i}")),
            labels: Some(BTreeMap::from([
                ("app".to_string(), format!("app{}", (i / NAMESPACES) % APPS)),
                (
                    "tier".to_string(),
                    ["web", "db", "cache"][(i % 3) as usize].into(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(if i.is_multiple_of(LOCAL_EVERY) {
                NODE.into()
            } else {
                format!("node{}", 1 + i % 99)
            }),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            pod_ips: Some(vec![PodIP {
                ip: Ipv4Addr::from(0x0a00_0000 + i + 1).to_string(),
            }]),
            ..PodStatus::default()
        }),
    }
}

/// NetworkPolicy `i`: ingress to one app of its namespace from another app of it, from
/// every pod of the namespaces of one tier label, and from a CIDR less a block, on TCP
/// 80 and 8000-8100; egress to DNS.
fn network_policy(i: u32, edit: u16) -> NetworkPolicy {
    let ns = i % NAMESPACES;
    serde_json::from_value(json!({
        "metadata": {"namespace": format!("ns{ns}"), "name": format!("np{i}")},
        "spec": {
            "podSelector": {"matchLabels": {"app": format!("app{}", (i / NAMESPACES) % APPS)}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": format!("app{}", (i + 1) % APPS)}}}],
                 "ports": [{"port": 80}, {"port": 8000, "endPort": 8100 + edit}]},
                {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": format!("ns{}", (ns + 1) % NAMESPACES)}},
                           "podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web", "cache"]}]}}]},
                {"from": [{"ipBlock": {"cidr": "172.16.0.0/12", "except": ["172.16.1.0/24"]}}]}
            ],
            "egress": [{"ports": [{"protocol": "UDP", "port": 53}]}]
        }
    }))
    .unwrap()
}

/// ClusterNetworkPolicy `i`: Admin tier, over one namespace, denying another.
fn cluster_policy(i: u32) -> ClusterNetworkPolicy {
    serde_json::from_value(json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha2",
        "kind": "ClusterNetworkPolicy",
        "metadata": {"name": format!("cnp{i}")},
        "spec": {
            "tier": if i.is_multiple_of(2) { "Admin" } else { "Baseline" },
            "priority": i % 1000,
            "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": format!("ns{}", i % NAMESPACES)}}},
            "ingress": [{"action": "Deny", "from": [{"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": format!("ns{}", (i + 7) % NAMESPACES)}}}]}],
            "egress": [{"action": "Accept", "to": [{"networks": ["10.0.0.0/8"]}]}]
        }
    }))
    .unwrap()
}

/// 10 K pods, `n` policies: nine NetworkPolicies to one ClusterNetworkPolicy.
fn cluster(n: u32) -> Cluster {
    let mut c = Cluster::default();
    c.apply(node()).unwrap();
    for i in 0..PODS {
        c.apply(pod(i)).unwrap();
    }
    for i in 0..n {
        if i % 10 == 9 {
            c.apply(cluster_policy(i)).unwrap();
        } else {
            c.apply(network_policy(i, 0)).unwrap();
        }
    }
    c
}

fn local() -> BTreeMap<ObjectKey, String> {
    (0..PODS)
        .step_by(LOCAL_EVERY as usize)
        .map(|i| {
            let ns = format!("ns{}", i % NAMESPACES);
            let name = format!("pod{i}");
            (ObjectKey::new(&ns, &name), pod_port(&ns, &name))
        })
        .collect()
}

fn attached() -> Vec<AttachedPod> {
    local()
        .keys()
        .map(|k| AttachedPod::new(&k.namespace, &k.name))
        .collect()
}

fn rss() -> isize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<isize>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn policy_compile(c: &mut Criterion) {
    let mut g = c.benchmark_group("policy_compile");
    g.sample_size(10);
    let local = local();
    for n in [1_000u32, 10_000] {
        let cl = cluster(n);
        let held = Held::of(&cl);
        let before = rss();
        let spec = compile(&inputs(&cl, &held), &local, PolicyOptions::default());
        let ports: Vec<(&str, bool)> = local.values().map(|p| (p.as_str(), true)).collect();
        let compiled = spec.compile(&ports).unwrap();
        eprintln!(
            "policy_compile/{n}: {} rules, {} sets, {} pods with policy; spec and compiled add {:.1} MiB resident",
            spec.rules.len(),
            spec.sets.len(),
            spec.pods.len(),
            (rss() - before) as f64 / (1 << 20) as f64
        );
        drop(compiled);
        g.throughput(Throughput::Elements(u64::from(n)));
        g.bench_with_input(BenchmarkId::new("agent", n), &cl, |b, cl| {
            b.iter(|| {
                compile(
                    &inputs(black_box(cl), &held),
                    &local,
                    PolicyOptions::default(),
                )
            })
        });
        g.bench_with_input(BenchmarkId::new("datapath", n), &spec, |b, spec| {
            b.iter(|| black_box(spec).compile(&ports).unwrap())
        });
    }
    g.finish();
}

/// One NetworkPolicy edited (a port range one longer) and the policy section compiled
/// again and patched into the node's tables, as the agent does with a change only
/// policy reads before it hands the tables to the worker: `whole` compiles the section
/// from nothing, `cached` keeps the node's policy cache and compiles again only what
/// the change touched (what the agent does), the objects changed found by
/// [`Cluster::diff`] of the state in force and the new one (as the agent finds them).
fn policy_change(c: &mut Criterion) {
    let mut g = c.benchmark_group("policy_change_compile");
    g.sample_size(10);
    let attached = attached();
    for n in [1_000u32, 10_000] {
        let mut cl = cluster(n);
        let node = node_tables(&cl, NODE, None, &attached, &CompileOptions::default()).unwrap();
        let mut edit = 0u16;
        g.bench_function(BenchmarkId::new("whole", n), |b| {
            b.iter(|| {
                edit = (edit + 1) % 100;
                cl.apply(network_policy(0, edit)).unwrap();
                let held = Held::of(&cl);
                let spec = compile(
                    &inputs(&cl, &held),
                    &node.pod_ports,
                    PolicyOptions::default(),
                );
                node.compiled.with_policy(&spec).unwrap()
            })
        });
        let mut cache = node.policy_cache.clone();
        let mut in_force = Arc::new(cl.clone());
        phases(
            n,
            &mut cache,
            &mut in_force,
            &node.pod_ports,
            &node.compiled,
        );
        g.bench_function(BenchmarkId::new("cached", n), |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    edit = (edit + 1) % 100;
                    // The datastore's part: a new state with the edit.
                    let mut next = (*in_force).clone();
                    next.apply(network_policy(0, edit)).unwrap();
                    let next = Arc::new(next);
                    let t0 = Instant::now();
                    let changed = in_force.diff(&next);
                    let held = Held::of(&next);
                    let spec = cache.compile(
                        &inputs(&next, &held),
                        &node.pod_ports,
                        PolicyOptions::default(),
                        Changes::Only(&changed),
                    );
                    black_box(node.compiled.with_policy(&spec).unwrap());
                    timed += t0.elapsed();
                    in_force = next;
                }
                timed
            })
        });
    }
    g.finish();
}

/// Prints where the time of a cached change goes, phase by phase (medians of 21).
fn phases(
    n: u32,
    cache: &mut ferry_agent::compile::policy::PolicyCache,
    in_force: &mut Arc<Cluster>,
    pod_ports: &BTreeMap<ObjectKey, String>,
    tables: &ferry_datapath::Tables,
) {
    let mut t = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for i in 0..21u16 {
        let mut next = (**in_force).clone();
        next.apply(network_policy(0, 200 + i)).unwrap();
        let next = Arc::new(next);
        let t0 = Instant::now();
        let changed = in_force.diff(&next);
        let t1 = Instant::now();
        let held = Held::of(&next);
        let inputs = inputs(&next, &held);
        let t2 = Instant::now();
        let spec = cache.compile(
            &inputs,
            pod_ports,
            PolicyOptions::default(),
            Changes::Only(&changed),
        );
        let t3 = Instant::now();
        black_box(tables.with_policy(&spec).unwrap());
        let t4 = Instant::now();
        for (v, d) in t.iter_mut().zip([t1 - t0, t2 - t1, t3 - t2, t4 - t3]) {
            v.push(d);
        }
        drop(inputs);
        *in_force = next;
    }
    let med = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    eprintln!(
        "policy_change_compile/cached/{n} phases: diff {:?}, inputs {:?}, policy section {:?}, datapath {:?}",
        med(&mut t[0]),
        med(&mut t[1]),
        med(&mut t[2]),
        med(&mut t[3])
    );
}

criterion_group!(benches, policy_compile, policy_change);
criterion_main!(benches);
