//! What `ferry policy` shows: the policies in force with the pods of this node each
//! applies to, and one pod's rules as the datapath holds them (selectors, namespaces
//! and named ports resolved), in evaluation order.
//!
//! Both read the same compilation as the tables ([`crate::compile`]), so what is shown
//! is what is enforced.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ferry_api::{DirectionInfo, MatchInfo, PodPolicyInfo, PolicyAnswer, PolicyInfo, RuleInfo};
use ferry_datapath::policy::{ActionSpec, DirectionSpec, PolicySpec};

use super::Tier;
use crate::cluster::{Cluster, Kind, Object, ObjectKey};
use crate::compile::policy::{self, Held, PolicyOptions};

/// The policies of `cluster`: ClusterNetworkPolicies by tier, priority and name, then
/// NetworkPolicies by namespace and name, each with the pods of `local` (this node's
/// pods and their ports; `addresses`, those of the ports) it applies to.
pub fn list(
    cluster: &Cluster,
    local: &BTreeMap<ObjectKey, String>,
    addresses: &BTreeMap<ObjectKey, Vec<std::net::IpAddr>>,
    opts: PolicyOptions,
) -> PolicyAnswer {
    let held = Held::of(cluster).with_ports(addresses.clone());
    let spec = policy::compile(&policy::inputs(cluster, &held), local, opts);
    let by_port: BTreeMap<&str, &ObjectKey> = local.iter().map(|(k, p)| (p.as_str(), k)).collect();
    // The pods each policy (by its name in the spec) applies to.
    let mut applies: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for pod in &spec.pods {
        let Some(key) = by_port.get(pod.port.as_str()) else {
            continue;
        };
        for d in [&pod.ingress, &pod.egress] {
            for p in policies_of(&spec, d) {
                applies
                    .entry(spec.policies[p as usize].as_str())
                    .or_default()
                    .insert(key.to_string());
            }
        }
    }
    let local_pods = |name: &str| -> Vec<String> {
        applies
            .get(name)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    };
    let mut cnps: Vec<_> = cluster
        .all_cluster_network_policy_fields()
        .filter_map(|(k, f)| Some((k, f.ok()?)))
        .collect();
    cnps.sort_by_key(|(k, f)| (f.tier == Tier::Baseline, f.priority, k.name.clone()));
    let mut policies = Vec::new();
    for (k, f) in cnps {
        let name = format!("ClusterNetworkPolicy {}", k.name);
        policies.push(PolicyInfo {
            tier: Some(
                match f.tier {
                    Tier::Admin => "admin",
                    Tier::Baseline => "baseline",
                }
                .into(),
            ),
            priority: Some(f.priority),
            isolates: Vec::new(),
            rules: f.ingress.len() + f.egress.len(),
            local_pods: local_pods(&name),
            warnings: f.warnings.iter().map(ToString::to_string).collect(),
            name,
        });
    }
    for (k, f) in cluster.all_network_policy_fields() {
        let Ok(f) = f else { continue };
        let name = format!("NetworkPolicy {k}");
        let mut isolates = Vec::new();
        let mut rules = 0;
        for (dir, r) in [("ingress", &f.ingress), ("egress", &f.egress)] {
            if let Some(r) = r {
                isolates.push(dir.to_string());
                rules += r.len();
            }
        }
        policies.push(PolicyInfo {
            tier: None,
            priority: None,
            isolates,
            rules,
            local_pods: local_pods(&name),
            warnings: Vec::new(),
            name,
        });
    }
    PolicyAnswer {
        policies,
        pod: None,
        preview: None,
        enforcement: None,
    }
}

/// `cluster` with the NetworkPolicies, ClusterNetworkPolicies and Namespaces of
/// `manifests` (YAML) put in, or with `delete` taken out, and the objects named
/// (`Kind NS/NAME`). Manifests that do not read, or hold another kind, are refused
/// with every problem named; nothing of them is taken then.
pub fn candidate(
    cluster: &Cluster,
    manifests: &str,
    delete: bool,
) -> Result<(Cluster, Vec<String>), String> {
    let (given, _) = crate::datastore::file::parse("the preview's manifests", manifests)
        .map_err(|r| r.to_string())?;
    let mut out = cluster.clone();
    let mut objects = Vec::new();
    let others = given.nodes.len()
        + given.pods.len()
        + given.services.len()
        + given.endpoint_slices.len()
        + given.config_maps.len();
    if others > 0 {
        return Err(format!(
            "the preview's manifests hold {others} objects of other kinds: a preview takes NetworkPolicy, ClusterNetworkPolicy and Namespace objects only"
        ));
    }
    let mut take = |kind: Kind, key: &ObjectKey, obj: Object| {
        objects.push(format!("{} {key}", kind.name()));
        if delete {
            out.delete(kind, &key.namespace, &key.name);
        } else {
            out.apply(obj).expect("a named object");
        }
    };
    for (k, o) in given.namespaces {
        take(Kind::Namespace, &k, Arc::unwrap_or_clone(o).into());
    }
    for (k, o) in given.network_policies {
        take(Kind::NetworkPolicy, &k, Arc::unwrap_or_clone(o).into());
    }
    for (k, o) in given.cluster_network_policies {
        take(
            Kind::ClusterNetworkPolicy,
            &k,
            Arc::unwrap_or_clone(o).into(),
        );
    }
    if objects.is_empty() {
        return Err(
            "the preview's manifests hold no NetworkPolicy, ClusterNetworkPolicy or Namespace"
                .into(),
        );
    }
    Ok((out, objects))
}

/// The policies a direction's rules come from and those isolating it.
fn policies_of<'s>(spec: &'s PolicySpec, d: &'s DirectionSpec) -> impl Iterator<Item = u32> + 's {
    (d.admin.iter().chain(&d.allow).chain(&d.baseline))
        .map(|r| spec.rules[*r as usize].policy)
        .chain(d.isolated_by.iter().copied())
}

/// The rules that apply to the pod `pod` (`NAMESPACE/NAME`, on any node), as its node
/// would enforce them; an error when the cluster has no such pod.
pub fn explain(cluster: &Cluster, pod: &str, opts: PolicyOptions) -> Result<PodPolicyInfo, String> {
    let (ns, name) = pod
        .split_once('/')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty())
        .ok_or_else(|| format!("{pod:?}: expected NAMESPACE/NAME"))?;
    let key = ObjectKey::new(ns, name);
    let fields = match cluster.pod_fields(&key) {
        None => return Err(format!("no pod {key} in the cluster")),
        Some(Err(e)) => {
            return Err(crate::fields::describe(&format_args!("Pod {key}"), e));
        }
        Some(Ok(f)) => f,
    };
    let mut info = PodPolicyInfo {
        pod: key.to_string(),
        node: fields.node.clone(),
        addresses: fields.ips.clone(),
        directions: Vec::new(),
        notes: Vec::new(),
    };
    if fields.host_network {
        info.notes.push(
            "a host-network pod: it has no port of its own, no policy selects it, and its traffic is the node's".into(),
        );
    } else if fields.ips.is_empty() {
        info.notes
            .push("no address yet: no policy applies until it has one".into());
    } else if fields.finished {
        info.notes
            .push("finished (Succeeded or Failed): no policy applies".into());
    }
    if !opts.host_to_pods {
        info.notes.push(
            "policy-host-to-pods is policy: the node's own stack meets the ingress rules like any peer".into(),
        );
    } else {
        info.notes.push(
            "the node's own stack (kubelet probes) reaches the pod whatever its ingress rules (policy-host-to-pods: allow)".into(),
        );
    }
    let held = Held::of(cluster);
    let local = BTreeMap::from([(key.clone(), String::from("pod"))]);
    let spec = policy::compile(&policy::inputs(cluster, &held), &local, opts);
    let pod_spec = spec.pods.first();
    for (dir, d) in [
        ("ingress", pod_spec.map(|p| &p.ingress)),
        ("egress", pod_spec.map(|p| &p.egress)),
    ] {
        let d = d.cloned().unwrap_or_default();
        info.directions.push(direction(&spec, dir, &d));
    }
    Ok(info)
}

fn direction(spec: &PolicySpec, dir: &str, d: &DirectionSpec) -> DirectionInfo {
    let mut rules = Vec::new();
    for (tier, ids) in [
        ("admin", &d.admin),
        ("network_policy", &d.allow),
        ("baseline", &d.baseline),
    ] {
        for id in ids {
            rules.push(rule(spec, tier, *id));
        }
    }
    DirectionInfo {
        direction: dir.into(),
        isolated_by: (d.isolated_by.iter())
            .map(|p| spec.policies[*p as usize].clone())
            .collect(),
        rules,
    }
}

fn rule(spec: &PolicySpec, tier: &str, id: u32) -> RuleInfo {
    let r = &spec.rules[id as usize];
    RuleInfo {
        tier: tier.into(),
        policy: spec.policies[r.policy as usize].clone(),
        rule: r.name.clone(),
        action: match r.action {
            ActionSpec::Accept => "accept",
            ActionSpec::Deny => "deny",
            ActionSpec::Pass => "pass",
        }
        .into(),
        matches: r
            .matches
            .iter()
            .map(|m| MatchInfo {
                peers: m.peers.as_ref().map(|sets| {
                    sets.iter()
                        .flat_map(|s| &spec.sets[*s as usize].blocks)
                        .map(|b| {
                            if b.except.is_empty() {
                                b.cidr.to_string()
                            } else {
                                let x: Vec<String> =
                                    b.except.iter().map(ToString::to_string).collect();
                                format!("{} except {}", b.cidr, x.join(", "))
                            }
                        })
                        .collect()
                }),
                ports: m
                    .ports
                    .iter()
                    .map(|p| match (p.port, p.end) {
                        (None, _) => p.proto.clone(),
                        (Some(a), None) => format!("{}/{a}", p.proto),
                        (Some(a), Some(b)) => format!("{}/{a}-{b}", p.proto),
                    })
                    .collect(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Pod, PodIP, PodSpec, PodStatus};
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod(ns: &str, name: &str, app: &str, ip: &str, node: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels: Some(BTreeMap::from([("app".to_string(), app.to_string())])),
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

    fn cluster() -> Cluster {
        let mut c = Cluster::default();
        c.apply(pod("x", "a", "a", "10.0.1.1", "n1")).unwrap();
        c.apply(pod("x", "b", "b", "10.0.2.1", "n2")).unwrap();
        let np: NetworkPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "x", "name": "b-from-a"},
            "spec": {
                "podSelector": {"matchLabels": {"app": "b"}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}],
                             "ports": [{"port": 80}]}]
            }
        }))
        .unwrap();
        c.apply(np).unwrap();
        c
    }

    #[test]
    fn list_names_each_policy_with_the_local_pods_it_isolates() {
        let c = cluster();
        let mut local = BTreeMap::from([(ObjectKey::new("x", "a"), "pod-a".to_string())]);
        let a = list(&c, &local, &BTreeMap::new(), PolicyOptions::default());
        assert_eq!(a.policies.len(), 1);
        let p = &a.policies[0];
        assert_eq!(p.name, "NetworkPolicy x/b-from-a");
        assert_eq!(p.isolates, ["ingress"]);
        assert_eq!(p.rules, 1);
        assert!(p.local_pods.is_empty(), "x/a is not selected: {p:?}");
        local.insert(ObjectKey::new("x", "b"), "pod-b".into());
        let a = list(&c, &local, &BTreeMap::new(), PolicyOptions::default());
        assert_eq!(a.policies[0].local_pods, ["x/b"]);
    }

    #[test]
    fn explain_resolves_a_pod_on_another_node_to_addresses_and_ports() {
        let c = cluster();
        let info = explain(&c, "x/b", PolicyOptions::default()).unwrap();
        assert_eq!(info.node.as_deref(), Some("n2"));
        let ingress = &info.directions[0];
        assert_eq!(ingress.direction, "ingress");
        assert_eq!(ingress.isolated_by, ["NetworkPolicy x/b-from-a"]);
        assert_eq!(ingress.rules.len(), 1);
        let r = &ingress.rules[0];
        assert_eq!(
            (r.tier.as_str(), r.action.as_str()),
            ("network_policy", "accept")
        );
        assert_eq!(r.rule, "ingress[0]");
        assert_eq!(r.matches.len(), 1);
        assert_eq!(
            r.matches[0].peers.as_deref(),
            Some(&["10.0.1.1/32".to_string()][..])
        );
        assert_eq!(r.matches[0].ports, ["tcp/80"]);
        let egress = &info.directions[1];
        assert!(egress.rules.is_empty() && egress.isolated_by.is_empty());
        // The pod a is isolated in neither direction.
        let a = explain(&c, "x/a", PolicyOptions::default()).unwrap();
        assert!(a.directions.iter().all(|d| d.rules.is_empty()));
    }

    #[test]
    fn a_preview_takes_policies_and_namespaces_only() {
        let c = cluster();
        let deny = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: deny-a, namespace: x }
spec: { podSelector: { matchLabels: { app: a } } }
";
        let (with, objects) = candidate(&c, deny, false).unwrap();
        assert_eq!(objects, ["NetworkPolicy x/deny-a"]);
        assert_eq!(with.network_policies.len(), 2);
        let (without, _) = candidate(&with, deny, true).unwrap();
        assert_eq!(without.network_policies.len(), 1);
        let pod = "apiVersion: v1\nkind: Pod\nmetadata: { name: p }\n";
        assert!(
            candidate(&c, pod, false)
                .unwrap_err()
                .contains("other kinds")
        );
        let bad = deny.replace("app: a", "app: [a]");
        assert!(
            candidate(&c, &bad, false)
                .unwrap_err()
                .contains("NetworkPolicy x/deny-a")
        );
        assert!(
            candidate(&c, "", false)
                .unwrap_err()
                .contains("no NetworkPolicy")
        );
    }

    #[test]
    fn explain_refuses_an_unknown_pod_and_a_bad_name() {
        let c = cluster();
        assert!(
            explain(&c, "x/zz", PolicyOptions::default())
                .unwrap_err()
                .contains("no pod x/zz")
        );
        assert!(
            explain(&c, "nope", PolicyOptions::default())
                .unwrap_err()
                .contains("NAMESPACE/NAME")
        );
    }
}
