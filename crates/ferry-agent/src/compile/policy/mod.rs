//! NetworkPolicy and ClusterNetworkPolicy for this node's pods, resolved into the
//! datapath's policy section ([`PolicySpec`]).
//!
//! Everything that needs the cluster is resolved here, so that the datapath sees only
//! addresses and ports: selectors become the addresses of the pods they select (in the
//! namespaces they select), named ports become numbers (ingress: the destination pod's,
//! which is this node's pod; egress: each peer pod's own, so that one rule can mean
//! different numbers on different pods), and each pod port of this node gets, per
//! direction, the Admin tier rules in priority order, the NetworkPolicies isolating it
//! with their rules, and the Baseline tier rules.
//!
//! Peers are pods with addresses that are neither on the host network nor finished: a
//! selector never selects a host-network pod (as the APIs say). A namespace without a
//! Namespace object has the one label the API server would give it,
//! `kubernetes.io/metadata.name`, so that the file datastore works without Namespace
//! manifests.
//!
//! Sets of peers and rules are shared: a rule that means the same for several pods
//! (every rule but an ingress rule with a named port) is compiled once, and a
//! [`PolicyCache`] keeps them for the next compilation, which resolves again only what
//! a change touched.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ferry_datapath::policy::PolicySpec;

use crate::cluster::{Cluster, ObjectKey};
use crate::config::FerryConfig;
use crate::fields::{NodeFields, Protocol};
use crate::policy::{ClusterNetworkPolicyFields, NAMESPACE_NAME_LABEL, NetworkPolicyFields};

mod cache;
mod rules;

#[cfg(test)]
mod cache_tests;
#[cfg(test)]
mod tests;

pub use cache::{Changes, PolicyCache};

/// A pod as policy sees it.
#[derive(Clone, Copy, Debug)]
pub struct PodView<'a> {
    /// Namespace and name.
    pub key: &'a ObjectKey,
    /// Its labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Its addresses.
    pub ips: &'a [IpAddr],
    /// Its named container ports.
    pub named: &'a BTreeMap<String, (Protocol, u16)>,
}

/// A node as an egress peer (ClusterNetworkPolicy `nodes`).
#[derive(Clone, Debug)]
pub struct NodeView<'a> {
    /// Its labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Its InternalIP and ExternalIP addresses.
    pub ips: Vec<IpAddr>,
}

/// What the compilation reads of the cluster.
#[derive(Clone, Debug, Default)]
pub struct Inputs<'a> {
    /// Every pod that can be a peer or a subject, in key order.
    pub pods: Vec<PodView<'a>>,
    /// The labels of each Namespace object, by name.
    pub namespaces: BTreeMap<&'a str, &'a BTreeMap<String, String>>,
    /// NetworkPolicies, in key order.
    pub network_policies: Vec<(&'a ObjectKey, &'a NetworkPolicyFields)>,
    /// ClusterNetworkPolicies, in name order.
    pub cluster_policies: Vec<(&'a str, &'a ClusterNetworkPolicyFields)>,
    /// Nodes.
    pub nodes: Vec<NodeView<'a>>,
}

/// Settings that are not in the policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyOptions {
    /// The node's own stack reaches its pods whatever their ingress policy.
    pub host_to_pods: bool,
    /// A policy change ends tracked connections it no longer allows.
    pub reevaluate: bool,
}

impl PolicyOptions {
    /// The options the ConfigMap `ferry-config` sets.
    pub fn of(config: &FerryConfig) -> PolicyOptions {
        PolicyOptions {
            host_to_pods: config.policy_host_to_pods,
            reevaluate: config.policy_reevaluate,
        }
    }
}

impl Default for PolicyOptions {
    fn default() -> PolicyOptions {
        PolicyOptions {
            host_to_pods: true,
            reevaluate: false,
        }
    }
}

/// The policy section of this node's tables: for each pod port in `local` (pod key ->
/// port name), the rules that apply to it. Compiled from nothing; an agent that keeps
/// a [`PolicyCache`] compiles again only what a change touches.
pub fn compile(
    inputs: &Inputs<'_>,
    local: &BTreeMap<ObjectKey, String>,
    opts: PolicyOptions,
) -> PolicySpec {
    PolicyCache::new().compile(inputs, local, opts, Changes::All)
}

/// The owned parts of [`Inputs`] that the cluster does not hold as such: the empty
/// label map of a pod without labels, and the labels of the namespaces that have pods
/// but no Namespace object (the name label alone, see [`NAMESPACE_NAME_LABEL`]).
#[derive(Debug, Default)]
pub struct Held {
    no_labels: BTreeMap<String, String>,
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// The addresses of this node's pod ports ([`Held::with_ports`]).
    ports: BTreeMap<ObjectKey, Vec<IpAddr>>,
}

impl Held {
    /// What [`inputs`] of `cluster` needs.
    pub fn of(cluster: &Cluster) -> Held {
        let mut namespaces = BTreeMap::new();
        // Pods come in key order, namespace by namespace: each is looked up once.
        let mut last = None;
        for key in cluster.pods.keys() {
            let ns = key.namespace.as_str();
            if last == Some(ns) {
                continue;
            }
            last = Some(ns);
            if cluster.namespace_labels(ns).is_none() {
                let labels = BTreeMap::from([(NAMESPACE_NAME_LABEL.to_string(), ns.to_string())]);
                namespaces.insert(ns.to_string(), labels);
            }
        }
        Held {
            no_labels: BTreeMap::new(),
            namespaces,
            ports: BTreeMap::new(),
        }
    }

    /// With the addresses of this node's pod ports (pod key -> the port's addresses):
    /// a pod of this node is known to policy by its port's, which the CNI plugin gave
    /// it, also while its Pod object says none yet or that it finished (a new sandbox
    /// of a pod of that name), so that no pod of this node is ever left out.
    pub fn with_ports(mut self, ports: BTreeMap<ObjectKey, Vec<IpAddr>>) -> Held {
        self.ports = ports;
        self
    }
}

/// What the compilation reads of `cluster`: the pods that can be peers or subjects
/// (with addresses, not on the host network, not finished; this node's pods with the
/// addresses of their ports, [`Held::with_ports`]), in key order, the
/// Namespaces' labels (those of `held` for namespaces without an object), the policies
/// whose fields are good (the datastores let no bad one in), and the nodes.
pub fn inputs<'a>(cluster: &'a Cluster, held: &'a Held) -> Inputs<'a> {
    let pods = cluster
        .pods_with_fields()
        .filter_map(|(key, pod, f)| {
            let f = f.ok()?;
            let ips = match held.ports.get(key) {
                Some(port) => port,
                None if f.finished => return None,
                None => &f.ips,
            };
            if f.host_network || ips.is_empty() {
                return None;
            }
            Some(PodView {
                key,
                labels: pod.metadata.labels.as_ref().unwrap_or(&held.no_labels),
                ips,
                named: &f.named_ports,
            })
        })
        .collect();
    let namespaces = (cluster.namespaces.keys())
        .filter_map(|k| Some((k.name.as_str(), cluster.namespace_labels(&k.name)?)))
        .chain(held.namespaces.iter().map(|(n, l)| (n.as_str(), l)))
        .collect();
    let network_policies = cluster
        .all_network_policy_fields()
        .filter_map(|(k, f)| Some((k, f.ok()?)))
        .collect();
    let cluster_policies = cluster
        .all_cluster_network_policy_fields()
        .filter_map(|(k, f)| Some((k.name.as_str(), f.ok()?)))
        .collect();
    let nodes = cluster
        .nodes
        .values()
        .filter_map(|n| {
            let f = NodeFields::parse(n).ok()?;
            Some(NodeView {
                labels: n.metadata.labels.as_ref().unwrap_or(&held.no_labels),
                ips: f.internal_ips.into_iter().chain(f.external_ips).collect(),
            })
        })
        .collect();
    Inputs {
        pods,
        namespaces,
        network_policies,
        cluster_policies,
        nodes,
    }
}
