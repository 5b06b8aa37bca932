//! The cache gives, after each change, the section a compilation from nothing gives,
//! and resolves again only the rules the change touched.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Pod, PodIP, PodSpec, PodStatus};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use super::*;
use crate::cluster::Kind;
use crate::policy::ClusterNetworkPolicy;

const NODE: &str = "n1";

fn pod(ns: &str, name: &str, labels: &[(&str, &str)], ip: &str, node: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            pod_ips: Some(vec![PodIP { ip: ip.into() }]),
            ..PodStatus::default()
        }),
    }
}

fn namespace(name: &str, labels: &[(&str, &str)]) -> Namespace {
    let mut l: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.insert(NAMESPACE_NAME_LABEL.into(), name.into());
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(l),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

fn np(v: serde_json::Value) -> NetworkPolicy {
    serde_json::from_value(v).unwrap()
}

fn cnp(v: serde_json::Value) -> ClusterNetworkPolicy {
    serde_json::from_value(v).unwrap()
}

/// Namespaces x (team=red) and y (team=blue), z without an object; pods on this node
/// (x/a, y/a) and on another (x/b, y/b, z/c); a policy of each kind.
fn cluster() -> Cluster {
    let mut c = Cluster::default();
    c.apply(namespace("x", &[("team", "red")])).unwrap();
    c.apply(namespace("y", &[("team", "blue")])).unwrap();
    c.apply(pod("x", "a", &[("app", "a")], "10.0.1.1", NODE))
        .unwrap();
    c.apply(pod("y", "a", &[("app", "a")], "10.0.1.2", NODE))
        .unwrap();
    c.apply(pod("x", "b", &[("app", "b")], "10.0.2.1", "n2"))
        .unwrap();
    c.apply(pod("y", "b", &[("app", "b")], "10.0.2.2", "n2"))
        .unwrap();
    c.apply(pod("z", "c", &[("app", "c")], "10.0.2.3", "n2"))
        .unwrap();
    c.apply(np(json!({
        "metadata": {"namespace": "x", "name": "a-from-b"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "a"}},
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": "b"}}}], "ports": [{"port": 80}]},
                {"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}]}
            ],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.3.0/24"]}}]}]
        }
    })))
    .unwrap();
    c.apply(np(json!({
        "metadata": {"namespace": "y", "name": "a-to-all"},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}
    })))
    .unwrap();
    c.apply(cnp(json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha2",
        "kind": "ClusterNetworkPolicy",
        "metadata": {"name": "deny-red"},
        "spec": {
            "tier": "Admin",
            "priority": 10,
            "subject": {"namespaces": {"matchLabels": {"team": "blue"}}},
            "ingress": [{"action": "Deny", "from": [{"namespaces": {"matchLabels": {"team": "red"}}}]}]
        }
    })))
    .unwrap();
    c
}

fn local() -> BTreeMap<ObjectKey, String> {
    BTreeMap::from([
        (ObjectKey::new("x", "a"), "x.a".to_string()),
        (ObjectKey::new("y", "a"), "y.a".to_string()),
    ])
}

/// Compiles `after` with `cache` (which compiled `before`) and from nothing; both must
/// agree. Returns how many rules the cache resolved.
fn step(cache: &mut PolicyCache, before: &Cluster, after: &Cluster) -> usize {
    let changed = before.diff(after);
    let held = Held::of(after);
    let inputs = inputs(after, &held);
    let opts = PolicyOptions::default();
    let got = cache.compile(&inputs, &local(), opts, Changes::Only(&changed));
    let want = compile(&inputs, &local(), opts);
    assert_eq!(got, want, "after {changed:?}");
    cache.resolved()
}

fn start() -> (PolicyCache, Cluster) {
    let c = cluster();
    let mut cache = PolicyCache::new();
    let held = Held::of(&c);
    let spec = cache.compile(
        &inputs(&c, &held),
        &local(),
        PolicyOptions::default(),
        Changes::All,
    );
    assert_eq!(spec.pods.len(), 2);
    assert_eq!(cache.resolved(), spec.rules.len());
    (cache, c)
}

#[test]
fn a_policy_edited_resolves_its_own_rules_alone() {
    let (mut cache, before) = start();
    let mut after = before.clone();
    after
        .apply(np(json!({
            "metadata": {"namespace": "x", "name": "a-from-b"},
            "spec": {
                "podSelector": {"matchLabels": {"app": "a"}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "b"}}}], "ports": [{"port": 81}]}]
            }
        })))
        .unwrap();
    // Its one rule now; the others are kept.
    assert_eq!(step(&mut cache, &before, &after), 1);
    // Deleted: nothing to resolve, and its pod is open again.
    let mut gone = after.clone();
    gone.delete(Kind::NetworkPolicy, "x", "a-from-b");
    assert_eq!(step(&mut cache, &after, &gone), 0);
}

#[test]
fn a_new_policy_selecting_a_pod_resolves_its_rules_alone() {
    let (mut cache, before) = start();
    let mut after = before.clone();
    after
        .apply(np(json!({
            "metadata": {"namespace": "y", "name": "a-from-c"},
            "spec": {
                "podSelector": {"matchLabels": {"app": "a"}},
                "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "c"}}}]}]
            }
        })))
        .unwrap();
    assert_eq!(step(&mut cache, &before, &after), 1);
    let mut more = after.clone();
    more.apply(cnp(json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha2",
        "kind": "ClusterNetworkPolicy",
        "metadata": {"name": "base-deny"},
        "spec": {
            "tier": "Baseline",
            "priority": 5,
            "subject": {"namespaces": {}},
            "egress": [{"action": "Deny", "to": [{"networks": ["192.168.0.0/16"]}]}]
        }
    })))
    .unwrap();
    // One rule, met by both pods: resolved once.
    assert_eq!(step(&mut cache, &after, &more), 1);
}

#[test]
fn a_pod_elsewhere_changing_labels_resolves_the_rules_that_read_its_namespace() {
    let (mut cache, before) = start();
    let mut after = before.clone();
    after
        .apply(pod("x", "b", &[("app", "other")], "10.0.2.1", "n2"))
        .unwrap();
    // x/a-from-b's ingress[0] reads the pods of x, and deny-red's rule those of the
    // red namespaces (x); ingress[1] reads the blue ones (not x) and the ipBlock no
    // pod: two rules.
    assert_eq!(step(&mut cache, &before, &after), 2);
    // A pod in y: ingress[1] of x/a-from-b (y is blue) and deny-red's rule (reads
    // red namespaces: not y) and y/a-to-all's (no peers): one.
    let mut more = after.clone();
    more.apply(pod("y", "d", &[("app", "d")], "10.0.2.9", "n2"))
        .unwrap();
    assert_eq!(step(&mut cache, &after, &more), 1);
    // A pod in a namespace no one had seen: only rules whose selector picks it.
    let mut new_ns = more.clone();
    new_ns
        .apply(pod("w", "e", &[("app", "b")], "10.0.2.10", "n2"))
        .unwrap();
    assert_eq!(step(&mut cache, &more, &new_ns), 0);
}

#[test]
fn a_namespace_relabelled_changes_subjects_and_namespace_selectors() {
    let (mut cache, before) = start();
    let mut after = before.clone();
    // x turns blue: deny-red now selects x/a, and x's pods become blue peers.
    after.apply(namespace("x", &[("team", "blue")])).unwrap();
    let resolved = step(&mut cache, &before, &after);
    assert!(resolved >= 2, "{resolved}");
    let held = Held::of(&after);
    let spec = compile(&inputs(&after, &held), &local(), PolicyOptions::default());
    let xa = spec.pods.iter().find(|p| p.port == "x.a").unwrap();
    assert_eq!(xa.ingress.admin.len(), 1, "deny-red selects x/a now");
}

#[test]
fn a_change_it_does_not_follow_compiles_everything_again() {
    let (mut cache, before) = start();
    let mut after = before.clone();
    // A pod of this node: its ports and subjects change.
    after
        .apply(pod("x", "a", &[("app", "z")], "10.0.1.1", NODE))
        .unwrap();
    let all = step(&mut cache, &before, &after);
    let held = Held::of(&after);
    let spec = compile(&inputs(&after, &held), &local(), PolicyOptions::default());
    assert_eq!(all, spec.rules.len());
}

#[test]
fn a_tier_reordered_puts_the_pods_rules_in_the_new_order() {
    let (mut cache, before) = start();
    let tier = |name: &str, priority: u16| {
        cnp(json!({
            "apiVersion": "policy.networking.k8s.io/v1alpha2",
            "kind": "ClusterNetworkPolicy",
            "metadata": {"name": name},
            "spec": {
                "tier": "Admin",
                "priority": priority,
                "subject": {"namespaces": {"matchLabels": {"team": "blue"}}},
                "ingress": [{"action": "Pass", "from": [{"networks": ["10.0.9.0/24"]}]}]
            }
        }))
    };
    let mut after = before.clone();
    after.apply(tier("pass-first", 20)).unwrap();
    assert_eq!(step(&mut cache, &before, &after), 1);
    // Now ahead of deny-red (priority 10): y/a's Admin list changes order, nothing is
    // resolved again but the edited policy's rule.
    let mut ahead = after.clone();
    ahead.apply(tier("pass-first", 5)).unwrap();
    assert_eq!(step(&mut cache, &after, &ahead), 1);
    let held = Held::of(&ahead);
    let spec = compile(&inputs(&ahead, &held), &local(), PolicyOptions::default());
    let ya = spec.pods.iter().find(|p| p.port == "y.a").unwrap();
    let first = &spec.rules[ya.ingress.admin[0] as usize];
    assert_eq!(
        spec.policies[first.policy as usize],
        "ClusterNetworkPolicy pass-first"
    );
}
