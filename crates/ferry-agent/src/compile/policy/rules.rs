//! One rule of a policy resolved against the cluster: its peers as address blocks, its
//! ports as numbers, and what of the cluster it read to get there ([`Deps`]), so that
//! a later change can tell whether the resolution still holds ([`super::PolicyCache`]).

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Arc;

use ferry_datapath::policy::{ActionSpec, BlockSpec, PortRangeSpec};
use ipnet::IpNet;

use super::{Inputs, PodView};
use crate::cluster::ObjectKey;
use crate::fields::Protocol;
use crate::policy::{
    Action, ClusterPeer, ClusterRule, NAMESPACE_NAME_LABEL, Namespaces, NetworkPolicyFields,
    NetworkPolicyRule, Peer, PolicyPort, Selector,
};

/// A direction of a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Dir {
    Ingress,
    Egress,
}

impl Dir {
    pub(super) fn name(self) -> &'static str {
        match self {
            Dir::Ingress => "ingress",
            Dir::Egress => "egress",
        }
    }
}

/// What makes a compiled rule: its policy, direction and index, and for an ingress
/// rule with named ports the numbers they took on the pod.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct RuleKey {
    pub(super) policy: Arc<str>,
    pub(super) dir: Dir,
    pub(super) index: usize,
    pub(super) resolved: Vec<(Protocol, u16)>,
}

/// The address blocks of a peer set, shared by every rule that resolves to the same.
pub(super) type Blocks = Arc<Vec<BlockSpec>>;

/// What a resolution read of the cluster besides its own policy.
#[derive(Clone, Debug, Default)]
pub(super) struct Deps {
    /// The pods of these namespaces (a policy's own, or those a selector selects:
    /// their labels too).
    pub(super) pods_in: Vec<Namespaces>,
    /// Every pod (named ports looked for on every peer pod, or in an ipBlock).
    pub(super) every_pod: bool,
}

impl Deps {
    /// True when a change to the pods of namespace `ns` (labelled `labels`) may change
    /// what was resolved.
    pub(super) fn reads_pods_of(&self, ns: &str, labels: &BTreeMap<String, String>) -> bool {
        self.every_pod
            || self.pods_in.iter().any(|n| match n {
                Namespaces::Own(own) => own == ns,
                Namespaces::Selected(sel) => sel.matches(labels),
            })
    }

    /// True when it read namespaces' labels.
    pub(super) fn reads_namespace_labels(&self) -> bool {
        (self.pods_in.iter()).any(|n| matches!(n, Namespaces::Selected(_)))
    }
}

/// A peer set of a match: what it stands for, and its blocks.
#[derive(Clone, Debug)]
pub(super) struct ResolvedSet {
    pub(super) name: String,
    pub(super) blocks: Blocks,
}

/// Peers and ports together, as [`ferry_datapath::policy::MatchSpec`] with its set.
#[derive(Clone, Debug)]
pub(super) struct ResolvedMatch {
    /// None: every peer.
    pub(super) peers: Option<ResolvedSet>,
    pub(super) ports: Vec<PortRangeSpec>,
}

/// A rule resolved: what [`ferry_datapath::policy::RuleSpec`] says, sets included.
#[derive(Clone, Debug)]
pub(super) struct Resolved {
    pub(super) name: String,
    pub(super) action: ActionSpec,
    pub(super) matches: Vec<ResolvedMatch>,
    pub(super) deps: Deps,
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

/// True when namespace `ns` has labels `sel` selects: its object's, or the name label
/// alone.
pub(super) fn ns_matches(inputs: &Inputs<'_>, ns: &str, sel: &Selector) -> bool {
    match inputs.namespaces.get(ns) {
        Some(labels) => sel.matches(labels),
        None => sel.matches(&name_label(ns)),
    }
}

/// The labels of a namespace without an object.
pub(super) fn name_label(ns: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(NAMESPACE_NAME_LABEL.to_string(), ns.to_string())])
}

/// Resolves rules against one state of the cluster.
pub(super) struct Resolver<'a, 'c> {
    pub(super) inputs: &'a Inputs<'a>,
    /// Pods by namespace (indexes in `inputs.pods`), empty until needed.
    by_ns: BTreeMap<&'a str, Range<usize>>,
    /// Blocks by content, so that equal sets share one allocation (kept across
    /// compilations by the cache).
    sets: &'c mut HashMap<Vec<BlockSpec>, Blocks>,
    /// What the rule being resolved read.
    deps: Deps,
}

impl<'a, 'c> Resolver<'a, 'c> {
    pub(super) fn new(
        inputs: &'a Inputs<'a>,
        sets: &'c mut HashMap<Vec<BlockSpec>, Blocks>,
    ) -> Resolver<'a, 'c> {
        Resolver {
            inputs,
            by_ns: BTreeMap::new(),
            sets,
            deps: Deps::default(),
        }
    }

    /// The pods of each namespace, found the first time a rule needs them (most
    /// compilations after a change resolve few rules, or none): the pods are in key
    /// order, so each namespace's are one run.
    fn by_ns(&mut self) -> &BTreeMap<&'a str, Range<usize>> {
        if self.by_ns.is_empty() && !self.inputs.pods.is_empty() {
            let pods = &self.inputs.pods;
            let mut start = 0;
            for i in 1..=pods.len() {
                if i == pods.len() || pods[i].key.namespace != pods[start].key.namespace {
                    self.by_ns
                        .insert(pods[start].key.namespace.as_str(), start..i);
                    start = i;
                }
            }
        }
        &self.by_ns
    }

    /// The pods `pods` selects in the namespaces `namespaces` selects.
    fn select(&mut self, namespaces: &Namespaces, pods: &Selector) -> Vec<&'a PodView<'a>> {
        self.deps.pods_in.push(namespaces.clone());
        let inputs = self.inputs;
        let all = &inputs.pods;
        let pick = |idx: &Range<usize>| -> Vec<&'a PodView<'a>> {
            all[idx.clone()]
                .iter()
                .filter(|p| pods.matches(p.labels))
                .collect()
        };
        let by_ns = self.by_ns();
        match namespaces {
            Namespaces::Own(ns) => by_ns.get(ns.as_str()).map(pick).unwrap_or_default(),
            Namespaces::Selected(sel) => by_ns
                .iter()
                .filter(|(ns, _)| ns_matches(inputs, ns, sel))
                .flat_map(|(_, idx)| pick(idx))
                .collect(),
        }
    }

    fn every_pod(&mut self) -> &'a [PodView<'a>] {
        self.deps.every_pod = true;
        &self.inputs.pods
    }

    fn set(&mut self, name: String, blocks: Vec<BlockSpec>) -> ResolvedSet {
        let blocks = match self.sets.get(&blocks) {
            Some(b) => Arc::clone(b),
            None => {
                let b = Arc::new(blocks.clone());
                self.sets.insert(blocks, Arc::clone(&b));
                b
            }
        };
        ResolvedSet { name, blocks }
    }

    fn finish(
        &mut self,
        name: String,
        action: ActionSpec,
        matches: Vec<ResolvedMatch>,
    ) -> Resolved {
        Resolved {
            name,
            action,
            matches,
            deps: std::mem::take(&mut self.deps),
        }
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
pub(super) fn split_ports(ports: &[PolicyPort], dst: Option<&PodView<'_>>) -> SplitPorts {
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
fn matches_of<'a>(
    r: &mut Resolver<'a, '_>,
    what: &str,
    peers: Option<(Vec<BlockSpec>, Vec<&'a PodView<'a>>)>,
    ports: Option<&[PolicyPort]>,
    dst: Option<&PodView<'_>>,
) -> Vec<ResolvedMatch> {
    let Some(ports) = ports else {
        let peers = peers.map(|(blocks, _)| r.set(what.to_string(), blocks));
        return vec![ResolvedMatch {
            peers,
            ports: vec![],
        }];
    };
    let (mut numeric, resolved, named) = split_ports(ports, dst);
    numeric.extend(resolved.iter().map(|(p, n)| one_port(*p, *n)));
    let mut out = Vec::new();
    if !numeric.is_empty() {
        let peers = peers
            .as_ref()
            .map(|(blocks, _)| r.set(what.to_string(), blocks.clone()));
        out.push(ResolvedMatch {
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
            all = r.every_pod().iter().collect();
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
        let set = r.set(
            format!("{what}, named port {n}/{}", proto_name(proto)),
            blocks,
        );
        out.push(ResolvedMatch {
            peers: Some(set),
            ports: vec![one_port(proto, n)],
        });
    }
    out
}

/// A NetworkPolicy rule's peers: their blocks, and the pods among them (for named
/// ports: the pods inside its ipBlocks are looked for only with `named`). None: every
/// peer.
fn np_peers<'a>(
    r: &mut Resolver<'a, '_>,
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
            } => selected.extend(r.select(namespaces, sel)),
            Peer::IpBlock(ib) => {
                blocks.push(BlockSpec {
                    cidr: ib.cidr,
                    except: ib.except.clone(),
                });
                if !named {
                    continue;
                }
                in_blocks.extend(
                    r.every_pod()
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
    r: &mut Resolver<'a, '_>,
    rule: &ClusterRule,
) -> Option<(Vec<BlockSpec>, Vec<&'a PodView<'a>>)> {
    let mut blocks = Vec::new();
    let mut pods: Vec<&PodView<'_>> = Vec::new();
    for p in &rule.peers {
        match p {
            ClusterPeer::Pods(set) => {
                let namespaces = Namespaces::Selected(set.namespaces.clone());
                pods.extend(r.select(&namespaces, &set.pods));
            }
            // Nodes are not followed by the cache: a change of one compiles all again.
            ClusterPeer::Nodes(sel) => blocks.extend(
                r.inputs
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

pub(super) fn has_named(ports: Option<&[PolicyPort]>) -> bool {
    ports.is_some_and(|ps| ps.iter().any(|p| matches!(p, PolicyPort::Named { .. })))
}

/// The key of the NetworkPolicy rule `index` of `np` (named `name`) in direction `dir`,
/// for the pod `pod`.
pub(super) fn np_rule_key(
    name: &Arc<str>,
    np: &NetworkPolicyFields,
    dir: Dir,
    index: usize,
    pod: &PodView<'_>,
) -> RuleKey {
    let ports = np_rules(np, dir)[index].ports.as_deref();
    rule_key(name, dir, index, ports, pod)
}

/// The key of rule `index` of the policy named `name` in direction `dir` on `ports`,
/// for `pod`: an ingress rule's named ports take the pod's numbers.
fn rule_key(
    name: &Arc<str>,
    dir: Dir,
    index: usize,
    ports: Option<&[PolicyPort]>,
    pod: &PodView<'_>,
) -> RuleKey {
    let resolved = (dir == Dir::Ingress && has_named(ports))
        .then(|| split_ports(ports.unwrap_or_default(), Some(pod)).1);
    RuleKey {
        policy: Arc::clone(name),
        dir,
        index,
        resolved: resolved.unwrap_or_default(),
    }
}

fn np_rules(np: &NetworkPolicyFields, dir: Dir) -> &[NetworkPolicyRule] {
    let rules = match dir {
        Dir::Ingress => np.ingress.as_deref(),
        Dir::Egress => np.egress.as_deref(),
    };
    rules.expect("a direction of the policy")
}

/// The NetworkPolicy rule `index` of `np` (`key`) in direction `dir`, for `pod`.
pub(super) fn np_rule(
    r: &mut Resolver<'_, '_>,
    key: &ObjectKey,
    np: &NetworkPolicyFields,
    dir: Dir,
    index: usize,
    pod: &PodView<'_>,
) -> Resolved {
    let rule = &np_rules(np, dir)[index];
    let ports = rule.ports.as_deref();
    let dst = (dir == Dir::Ingress && has_named(ports)).then_some(pod);
    let what = format!("NetworkPolicy {key} {}[{index}]", dir.name());
    let peers = np_peers(r, rule, has_named(ports));
    let matches = matches_of(r, &what, peers, ports, dst);
    r.finish(
        format!("{}[{index}]", dir.name()),
        ActionSpec::Accept,
        matches,
    )
}

/// The key of the ClusterNetworkPolicy rule `rule` of the policy named `name` (its
/// full name) in direction `dir`, for `pod`.
pub(super) fn cnp_rule_key(
    name: &Arc<str>,
    dir: Dir,
    rule: &ClusterRule,
    pod: &PodView<'_>,
) -> RuleKey {
    rule_key(name, dir, rule.index, rule.ports.as_deref(), pod)
}

/// The ClusterNetworkPolicy rule `rule` of `name` in direction `dir`, for `pod`.
pub(super) fn cnp_rule(
    r: &mut Resolver<'_, '_>,
    name: &str,
    dir: Dir,
    rule: &ClusterRule,
    pod: &PodView<'_>,
) -> Resolved {
    let ports = rule.ports.as_deref();
    let dst = (dir == Dir::Ingress && has_named(ports)).then_some(pod);
    let label = if rule.name.is_empty() {
        format!("{}[{}]", dir.name(), rule.index)
    } else {
        format!("{} rule {}", dir.name(), rule.name)
    };
    let what = format!("ClusterNetworkPolicy {name} {label}");
    let peers = cnp_peers(r, rule);
    let matches = matches_of(r, &what, peers, ports, dst);
    let action = match rule.action {
        Action::Accept => ActionSpec::Accept,
        Action::Deny => ActionSpec::Deny,
        Action::Pass => ActionSpec::Pass,
    };
    r.finish(label, action, matches)
}
