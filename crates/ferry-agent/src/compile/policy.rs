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
//! (every rule but an ingress rule with a named port) is compiled once.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use ferry_datapath::policy::{
    ActionSpec, BlockSpec, DirectionSpec, MatchSpec, PodPolicySpec, PolicySpec, PortRangeSpec,
    RuleSpec, SetSpec,
};
use ipnet::IpNet;

use crate::cluster::{Cluster, ObjectKey};
use crate::config::FerryConfig;
use crate::fields::{NodeFields, Protocol};
use crate::policy::{
    Action, ClusterNetworkPolicyFields, ClusterPeer, ClusterRule, NAMESPACE_NAME_LABEL, Namespaces,
    NetworkPolicyFields, NetworkPolicyRule, Peer, PodSet, PolicyPort, Selector, Tier,
};

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;

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
    /// NetworkPolicies, by key.
    pub network_policies: Vec<(&'a ObjectKey, &'a NetworkPolicyFields)>,
    /// ClusterNetworkPolicies, by name.
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Dir {
    Ingress,
    Egress,
}

impl Dir {
    fn name(self) -> &'static str {
        match self {
            Dir::Ingress => "ingress",
            Dir::Egress => "egress",
        }
    }
}

/// What makes a compiled rule: its policy, direction and index, and for an ingress
/// rule with named ports the numbers they took on the pod.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RuleKey {
    policy: String,
    dir: Dir,
    index: usize,
    resolved: Vec<(Protocol, u16)>,
}

fn proto_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

fn one_port(p: Protocol, n: u16) -> PortRangeSpec {
    PortRangeSpec {
        proto: proto_name(p).into(),
        port: Some(n),
        end: None,
    }
}

/// The pod addresses of `pods`, as blocks of one address each.
fn pod_blocks<'p>(pods: impl IntoIterator<Item = &'p PodView<'p>>) -> Vec<BlockSpec> {
    let mut blocks: Vec<BlockSpec> = pods
        .into_iter()
        .flat_map(|p| p.ips.iter())
        .map(|ip| BlockSpec {
            cidr: IpNet::from(*ip),
            except: vec![],
        })
        .collect();
    blocks.sort_by_key(|b| b.cidr);
    blocks.dedup();
    blocks
}

struct Builder<'a> {
    inputs: &'a Inputs<'a>,
    spec: PolicySpec,
    /// Pods by namespace (indexes in `inputs.pods`).
    by_ns: BTreeMap<&'a str, Vec<usize>>,
    policy_ids: HashMap<String, u32>,
    set_ids: HashMap<Vec<BlockSpec>, u32>,
    rule_ids: HashMap<RuleKey, u32>,
}

impl<'a> Builder<'a> {
    fn new(inputs: &'a Inputs<'a>, opts: PolicyOptions) -> Builder<'a> {
        let mut by_ns: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, p) in inputs.pods.iter().enumerate() {
            by_ns.entry(p.key.namespace.as_str()).or_default().push(i);
        }
        Builder {
            inputs,
            spec: PolicySpec {
                host_to_pods: opts.host_to_pods,
                reevaluate: opts.reevaluate,
                ..PolicySpec::default()
            },
            by_ns,
            policy_ids: HashMap::new(),
            set_ids: HashMap::new(),
            rule_ids: HashMap::new(),
        }
    }

    /// A namespace's labels: its object's, or the name label alone.
    fn ns_matches(&self, ns: &str, sel: &Selector) -> bool {
        match self.inputs.namespaces.get(ns) {
            Some(labels) => sel.matches(labels),
            None => sel.matches(&BTreeMap::from([(
                NAMESPACE_NAME_LABEL.to_string(),
                ns.to_string(),
            )])),
        }
    }

    /// The pods `pods` selects in the namespaces `namespaces` selects.
    fn select(&self, namespaces: &Namespaces, pods: &Selector) -> Vec<&'a PodView<'a>> {
        let all = &self.inputs.pods;
        let pick = |idx: &Vec<usize>| -> Vec<&'a PodView<'a>> {
            idx.iter()
                .map(|i| &all[*i])
                .filter(|p| pods.matches(p.labels))
                .collect()
        };
        match namespaces {
            Namespaces::Own(ns) => self.by_ns.get(ns.as_str()).map(pick).unwrap_or_default(),
            Namespaces::Selected(sel) => self
                .by_ns
                .iter()
                .filter(|(ns, _)| self.ns_matches(ns, sel))
                .flat_map(|(_, idx)| pick(idx))
                .collect(),
        }
    }

    fn select_set(&self, s: &PodSet) -> Vec<&'a PodView<'a>> {
        self.select(&Namespaces::Selected(s.namespaces.clone()), &s.pods)
    }

    fn policy(&mut self, name: String) -> u32 {
        if let Some(id) = self.policy_ids.get(&name) {
            return *id;
        }
        let id = self.spec.policies.len() as u32;
        self.spec.policies.push(name.clone());
        self.policy_ids.insert(name, id);
        id
    }

    fn set(&mut self, name: String, blocks: Vec<BlockSpec>) -> u32 {
        if let Some(id) = self.set_ids.get(&blocks) {
            return *id;
        }
        let id = self.spec.sets.len() as u32;
        self.spec.sets.push(SetSpec {
            name,
            blocks: blocks.clone(),
        });
        self.set_ids.insert(blocks, id);
        id
    }

    fn rule(&mut self, key: RuleKey, make: impl FnOnce(&mut Self) -> RuleSpec) -> u32 {
        if let Some(id) = self.rule_ids.get(&key) {
            return *id;
        }
        let r = make(self);
        let id = self.spec.rules.len() as u32;
        self.spec.rules.push(r);
        self.rule_ids.insert(key, id);
        id
    }
}

/// Ports split by kind: numbers and ranges, named ports resolved on a pod, and named
/// ports left to resolve (with the protocol they ask for, if any).
type SplitPorts = (
    Vec<PortRangeSpec>,
    Vec<(Protocol, u16)>,
    Vec<(Option<Protocol>, String)>,
);

/// The numeric ports of `ports` and the named ones, resolved on `dst` when it is given
/// (ingress: the destination pod is known); without it named ports stay named.
fn split_ports(ports: &[PolicyPort], dst: Option<&PodView<'_>>) -> SplitPorts {
    let mut numeric = Vec::new();
    let mut resolved = Vec::new();
    let mut named = Vec::new();
    for p in ports {
        match p {
            PolicyPort::All(proto) => numeric.push(PortRangeSpec {
                proto: proto_name(*proto).into(),
                port: None,
                end: None,
            }),
            PolicyPort::Range {
                protocol,
                first,
                last,
            } => numeric.push(PortRangeSpec {
                proto: proto_name(*protocol).into(),
                port: Some(*first),
                end: (last != first).then_some(*last),
            }),
            PolicyPort::Named { protocol, name } => match dst {
                Some(pod) => {
                    if let Some((np, n)) = pod.named.get(name)
                        && protocol.is_none_or(|p| p == *np)
                    {
                        resolved.push((*np, *n));
                    }
                }
                None => named.push((*protocol, name.clone())),
            },
        }
    }
    (numeric, resolved, named)
}

/// The matches of a rule with `peers` (None: every peer, as blocks and the pods
/// they hold) on `ports` (None: every port). `dst` is the destination pod for ingress.
/// A rule whose ports are all named and resolve to nothing matches nothing.
fn matches_of(
    b: &mut Builder<'_>,
    what: &str,
    peers: Option<(Vec<BlockSpec>, Vec<&PodView<'_>>)>,
    ports: Option<&[PolicyPort]>,
    dst: Option<&PodView<'_>>,
) -> Vec<MatchSpec> {
    let peer_set =
        |b: &mut Builder<'_>, blocks: &Vec<BlockSpec>| b.set(what.to_string(), blocks.clone());
    let Some(ports) = ports else {
        let peers = peers.as_ref().map(|(blocks, _)| vec![peer_set(b, blocks)]);
        return vec![MatchSpec {
            peers,
            ports: vec![],
        }];
    };
    let (mut numeric, resolved, named) = split_ports(ports, dst);
    numeric.extend(resolved.iter().map(|(p, n)| one_port(*p, *n)));
    let mut out = Vec::new();
    if !numeric.is_empty() {
        let peers = peers.as_ref().map(|(blocks, _)| vec![peer_set(b, blocks)]);
        out.push(MatchSpec {
            peers,
            ports: numeric,
        });
    }
    if named.is_empty() {
        return out;
    }
    // Egress to named ports: each peer pod's own number. Every pod when the rule
    // names no peers; only pods, never other addresses, have named ports.
    let all: Vec<&PodView<'_>>;
    let candidates: &[&PodView<'_>] = match &peers {
        Some((_, pods)) => pods,
        None => {
            all = b.inputs.pods.iter().collect();
            &all
        }
    };
    let mut by_port: BTreeMap<(Protocol, u16), Vec<&PodView<'_>>> = BTreeMap::new();
    for pod in candidates {
        for (proto, name) in &named {
            if let Some((np, n)) = pod.named.get(name)
                && proto.is_none_or(|p| p == *np)
            {
                by_port.entry((*np, *n)).or_default().push(pod);
            }
        }
    }
    for ((proto, n), pods) in by_port {
        let blocks = pod_blocks(pods.iter().copied());
        let set = b.set(
            format!("{what}, named port {n}/{}", proto_name(proto)),
            blocks,
        );
        out.push(MatchSpec {
            peers: Some(vec![set]),
            ports: vec![one_port(proto, n)],
        });
    }
    out
}

/// A NetworkPolicy rule's peers: their blocks, and the pods among them (for named
/// ports: the pods inside its ipBlocks are looked for only with `named`). None: every
/// peer.
fn np_peers<'a>(
    b: &Builder<'a>,
    rule: &NetworkPolicyRule,
    named: bool,
) -> Option<(Vec<BlockSpec>, Vec<&'a PodView<'a>>)> {
    let peers = rule.peers.as_ref()?;
    let mut blocks = Vec::new();
    let mut selected: Vec<&PodView<'_>> = Vec::new();
    // The pods a named port may be found on: those selected and those in the blocks.
    let mut in_blocks: Vec<&PodView<'_>> = Vec::new();
    for p in peers {
        match p {
            Peer::Pods {
                namespaces,
                pods: sel,
            } => selected.extend(b.select(namespaces, sel)),
            Peer::IpBlock(ib) => {
                blocks.push(BlockSpec {
                    cidr: ib.cidr,
                    except: ib.except.clone(),
                });
                if !named {
                    continue;
                }
                in_blocks.extend(
                    b.inputs
                        .pods
                        .iter()
                        .filter(|pod| pod.ips.iter().any(|ip| ib.contains(*ip))),
                );
            }
        }
    }
    let mut all = pod_blocks(selected.iter().copied());
    all.extend(blocks);
    selected.extend(in_blocks);
    Some((all, selected))
}

/// A ClusterNetworkPolicy rule's peers, with the pods among them. None: every peer
/// (an unrecognized peer in a Deny or Pass rule, which fails closed).
fn cnp_peers<'a>(
    b: &Builder<'a>,
    rule: &ClusterRule,
) -> Option<(Vec<BlockSpec>, Vec<&'a PodView<'a>>)> {
    let mut blocks = Vec::new();
    let mut pods: Vec<&PodView<'_>> = Vec::new();
    for p in &rule.peers {
        match p {
            ClusterPeer::Pods(set) => pods.extend(b.select_set(set)),
            ClusterPeer::Nodes(sel) => blocks.extend(
                b.inputs
                    .nodes
                    .iter()
                    .filter(|n| sel.matches(n.labels))
                    .flat_map(|n| n.ips.iter())
                    .map(|ip| BlockSpec {
                        cidr: IpNet::from(*ip),
                        except: vec![],
                    }),
            ),
            ClusterPeer::Networks(nets) => blocks.extend(nets.iter().map(|n| BlockSpec {
                cidr: *n,
                except: vec![],
            })),
            ClusterPeer::Unrecognized => {
                if rule.action != Action::Accept {
                    return None;
                }
            }
        }
    }
    let mut all = pod_blocks(pods.iter().copied());
    all.extend(blocks);
    Some((all, pods))
}

fn has_named(ports: Option<&[PolicyPort]>) -> bool {
    ports.is_some_and(|ps| ps.iter().any(|p| matches!(p, PolicyPort::Named { .. })))
}

/// The NetworkPolicy rule `index` of `policy` in direction `dir`, for the pod `pod`.
fn np_rule(
    b: &mut Builder<'_>,
    policy: u32,
    key: &ObjectKey,
    np: &NetworkPolicyFields,
    dir: Dir,
    index: usize,
    pod: &PodView<'_>,
) -> u32 {
    let rules = match dir {
        Dir::Ingress => np.ingress.as_deref(),
        Dir::Egress => np.egress.as_deref(),
    };
    let rule = &rules.expect("a direction of the policy")[index];
    let ports = rule.ports.as_deref();
    let dst = (dir == Dir::Ingress && has_named(ports)).then_some(pod);
    let resolved = dst.map(|d| split_ports(ports.unwrap_or_default(), Some(d)).1);
    let k = RuleKey {
        policy: format!("NetworkPolicy {key}"),
        dir,
        index,
        resolved: resolved.unwrap_or_default(),
    };
    b.rule(k, |b| {
        let what = format!("NetworkPolicy {key} {}[{index}]", dir.name());
        let peers = np_peers(b, rule, has_named(ports));
        RuleSpec {
            name: format!("{}[{index}]", dir.name()),
            policy,
            action: ActionSpec::Accept,
            matches: matches_of(b, &what, peers, ports, dst),
        }
    })
}

/// The ClusterNetworkPolicy rule `rule` of `name` in direction `dir`, for `pod`.
fn cnp_rule(
    b: &mut Builder<'_>,
    policy: u32,
    name: &str,
    dir: Dir,
    rule: &ClusterRule,
    pod: &PodView<'_>,
) -> u32 {
    let ports = rule.ports.as_deref();
    let dst = (dir == Dir::Ingress && has_named(ports)).then_some(pod);
    let resolved = dst.map(|d| split_ports(ports.unwrap_or_default(), Some(d)).1);
    let k = RuleKey {
        policy: format!("ClusterNetworkPolicy {name}"),
        dir,
        index: rule.index,
        resolved: resolved.unwrap_or_default(),
    };
    b.rule(k, |b| {
        let label = if rule.name.is_empty() {
            format!("{}[{}]", dir.name(), rule.index)
        } else {
            format!("{} rule {}", dir.name(), rule.name)
        };
        let what = format!("ClusterNetworkPolicy {name} {label}");
        let peers = cnp_peers(b, rule);
        RuleSpec {
            name: label,
            policy,
            action: match rule.action {
                Action::Accept => ActionSpec::Accept,
                Action::Deny => ActionSpec::Deny,
                Action::Pass => ActionSpec::Pass,
            },
            matches: matches_of(b, &what, peers, ports, dst),
        }
    })
}

/// The policy section of this node's tables: for each pod port in `local` (pod key ->
/// port name), the rules that apply to it.
pub fn compile(
    inputs: &Inputs<'_>,
    local: &BTreeMap<ObjectKey, String>,
    opts: PolicyOptions,
) -> PolicySpec {
    let mut b = Builder::new(inputs, opts);
    // Tiers in evaluation order: priority, then name (the API leaves ties to the
    // implementation; by name, every node orders them alike).
    let mut tiers: BTreeMap<(bool, u16, &str), &ClusterNetworkPolicyFields> = BTreeMap::new();
    for (name, c) in &inputs.cluster_policies {
        tiers.insert((c.tier == Tier::Baseline, c.priority, *name), c);
    }
    debug_assert!(inputs.pods.is_sorted_by_key(|p| p.key), "pods in key order");
    let pod_of = |key: &ObjectKey| {
        (inputs.pods.binary_search_by(|p| p.key.cmp(key))).map(|i| &inputs.pods[i])
    };
    // A NetworkPolicy selects pods of its own namespace only.
    let mut by_ns: HashMap<&str, Vec<(&ObjectKey, &NetworkPolicyFields)>> = HashMap::new();
    for (k, np) in &inputs.network_policies {
        by_ns.entry(k.namespace.as_str()).or_default().push((k, np));
    }
    for (key, port) in local {
        let Ok(pod) = pod_of(key) else {
            continue;
        };
        let mut dirs = [DirectionSpec::default(), DirectionSpec::default()];
        for ((baseline, _, name), c) in &tiers {
            if !(b.ns_matches(&key.namespace, &c.subject.namespaces)
                && c.subject.pods.matches(pod.labels))
            {
                continue;
            }
            let policy = b.policy(format!("ClusterNetworkPolicy {name}"));
            for (i, (dir, rules)) in [(Dir::Ingress, &c.ingress), (Dir::Egress, &c.egress)]
                .into_iter()
                .enumerate()
            {
                for r in rules {
                    let id = cnp_rule(&mut b, policy, name, dir, r, pod);
                    let list = if *baseline {
                        &mut dirs[i].baseline
                    } else {
                        &mut dirs[i].admin
                    };
                    list.push(id);
                }
            }
        }
        for (pkey, np) in by_ns.get(key.namespace.as_str()).into_iter().flatten() {
            if !np.pod_selector.matches(pod.labels) {
                continue;
            }
            let policy = b.policy(format!("NetworkPolicy {pkey}"));
            for (i, (dir, rules)) in [(Dir::Ingress, &np.ingress), (Dir::Egress, &np.egress)]
                .into_iter()
                .enumerate()
            {
                let Some(rules) = rules else { continue };
                dirs[i].isolated_by.push(policy);
                for index in 0..rules.len() {
                    let id = np_rule(&mut b, policy, pkey, np, dir, index, pod);
                    dirs[i].allow.push(id);
                }
            }
        }
        let [ingress, egress] = dirs;
        if ingress != DirectionSpec::default() || egress != DirectionSpec::default() {
            b.spec.pods.push(PodPolicySpec {
                port: port.clone(),
                ingress,
                egress,
            });
        }
    }
    b.spec
}

/// The owned parts of [`Inputs`] that the cluster does not hold as such: the empty
/// label map of a pod without labels, and the labels of the namespaces that have pods
/// but no Namespace object (the name label alone, see [`NAMESPACE_NAME_LABEL`]).
#[derive(Debug, Default)]
pub struct Held {
    no_labels: BTreeMap<String, String>,
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
}

impl Held {
    /// What [`inputs`] of `cluster` needs.
    pub fn of(cluster: &Cluster) -> Held {
        let mut namespaces = BTreeMap::new();
        for key in cluster.pods.keys() {
            let ns = key.namespace.as_str();
            if cluster.namespace_labels(ns).is_none() && !namespaces.contains_key(ns) {
                let labels = BTreeMap::from([(NAMESPACE_NAME_LABEL.to_string(), ns.to_string())]);
                namespaces.insert(ns.to_string(), labels);
            }
        }
        Held {
            no_labels: BTreeMap::new(),
            namespaces,
        }
    }
}

/// What the compilation reads of `cluster`: the pods that can be peers or subjects
/// (with addresses, not on the host network, not finished), in key order, the
/// Namespaces' labels (those of `held` for namespaces without an object), the policies
/// whose fields are good (the datastores let no bad one in), and the nodes.
pub fn inputs<'a>(cluster: &'a Cluster, held: &'a Held) -> Inputs<'a> {
    let pods = cluster
        .all_pod_fields()
        .filter_map(|(key, f)| {
            let f = f.ok()?;
            if f.host_network || f.finished || f.ips.is_empty() {
                return None;
            }
            let pod = cluster.pods.get(key)?;
            Some(PodView {
                key,
                labels: pod.metadata.labels.as_ref().unwrap_or(&held.no_labels),
                ips: &f.ips,
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
