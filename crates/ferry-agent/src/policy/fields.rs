//! What ferry reads of Namespaces, NetworkPolicies and ClusterNetworkPolicies, parsed
//! and checked once as they come in and kept with them in the cluster
//! ([`crate::Cluster::network_policy_fields`] and its siblings), like a Service's
//! fields. The checks are the API server's (for NetworkPolicy) and the CRD schema's
//! (for ClusterNetworkPolicy), so that a manifest the API server would refuse is
//! refused from a file too, naming the field as the API does
//! (`spec.ingress[0].from[1].podSelector.matchExpressions[0].operator`).

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::crd::{
    ClusterNetworkPolicy, ClusterNetworkPolicyEgressPeer, ClusterNetworkPolicyProtocol,
    NamespacedPod, ProtocolPort,
};
use super::selector::{Selector, is_port_name};
use crate::fields::{Errors, FieldError, Protocol, parse_cidr, parse_port};

/// The label the API server sets on every Namespace, to its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// What ferry reads of a Namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceFields {
    /// metadata.labels, with `kubernetes.io/metadata.name` set to the name as the API
    /// server sets it (a manifest may lack it; a value that differs is replaced, as
    /// the API server does).
    pub labels: BTreeMap<String, String>,
}

impl NamespaceFields {
    /// Reads a Namespace.
    pub fn parse(ns: &Namespace) -> Result<NamespaceFields, Vec<FieldError>> {
        let mut labels = ns.metadata.labels.clone().unwrap_or_default();
        if let Some(name) = ns.metadata.name.as_deref().filter(|n| !n.is_empty()) {
            labels.insert(NAMESPACE_NAME_LABEL.to_string(), name.to_string());
        }
        Ok(NamespaceFields { labels })
    }
}

/// The ports a rule matches, at the destination.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyPort {
    /// Every port of the protocol (a NetworkPolicy port with a protocol and no port).
    All(Protocol),
    /// The ports `first..=last` of the protocol (one port: `first == last`).
    Range {
        /// The protocol.
        protocol: Protocol,
        /// The first port.
        first: u16,
        /// The last port, `>= first`.
        last: u16,
    },
    /// A container port of the destination pod, by name: it means its number (and
    /// protocol) on each pod, and nothing on a pod without a port of that name.
    Named {
        /// The protocol the named port must have; `None` (ClusterNetworkPolicy's
        /// `destinationNamedPort`) takes whatever protocol the port has.
        protocol: Option<Protocol>,
        /// The name, an IANA service name.
        name: String,
    },
}

impl PolicyPort {
    /// True when a packet of `protocol` to `port` on a pod with the container ports
    /// `named` (name -> protocol and number: [`crate::fields::PodFields::named_ports`])
    /// matches. A destination that is not a pod has no named ports (an empty map).
    pub fn matches(
        &self,
        protocol: Protocol,
        port: u16,
        named: &BTreeMap<String, (Protocol, u16)>,
    ) -> bool {
        match self {
            PolicyPort::All(p) => *p == protocol,
            PolicyPort::Range {
                protocol: p,
                first,
                last,
            } => *p == protocol && (*first..=*last).contains(&port),
            PolicyPort::Named { protocol: p, name } => named.get(name).is_some_and(|(np, n)| {
                *np == protocol && *n == port && p.is_none_or(|p| p == protocol)
            }),
        }
    }
}

/// An `ipBlock`: a CIDR without its exceptions.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IpBlock {
    /// The CIDR, host bits cleared (the API takes `10.0.0.1/24` for `10.0.0.0/24`).
    pub cidr: IpNet,
    /// Prefixes inside it that are left out, each strictly inside `cidr`, host bits
    /// cleared.
    pub except: Vec<IpNet>,
}

impl IpBlock {
    /// True when `ip` is in the block.
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        self.cidr.contains(&ip) && !self.except.iter().any(|e| e.contains(&ip))
    }
}

/// Which namespaces a NetworkPolicy peer's pods are in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Namespaces {
    /// The policy's own namespace (a peer without `namespaceSelector`).
    Own(String),
    /// The namespaces whose labels the selector selects.
    Selected(Selector),
}

/// A peer of a NetworkPolicy rule (`from` / `to` item).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Peer {
    /// The pods `pods` selects in the namespaces `namespaces` says (both must hold:
    /// `namespaceSelector` and `podSelector` in one peer are ANDed; an absent
    /// `podSelector` selects every pod).
    Pods {
        /// The namespaces.
        namespaces: Namespaces,
        /// The pods in them.
        pods: Selector,
    },
    /// Addresses: pods' and anything else's.
    IpBlock(IpBlock),
}

/// A NetworkPolicy rule: traffic from (ingress) or to (egress) one of its peers, on one
/// of its ports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkPolicyRule {
    /// The peers; `None` when `from` / `to` is absent or empty: every peer.
    pub peers: Option<Vec<Peer>>,
    /// The ports; `None` when `ports` is absent or empty: every port.
    pub ports: Option<Vec<PolicyPort>>,
}

/// What ferry reads of a NetworkPolicy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkPolicyFields {
    /// The policy's namespace: its pods are selected, and a peer without
    /// `namespaceSelector` is in it.
    pub namespace: String,
    /// spec.podSelector: the pods of the namespace the policy selects (empty: all).
    pub pod_selector: Selector,
    /// The ingress rules when the policy is of type Ingress (the selected pods are
    /// isolated for ingress: only what a rule allows comes in; `Some(vec![])` allows
    /// nothing); `None` when it is not (its `spec.ingress`, if any, is ignored).
    pub ingress: Option<Vec<NetworkPolicyRule>>,
    /// The egress rules when the policy is of type Egress, likewise.
    pub egress: Option<Vec<NetworkPolicyRule>>,
}

impl NetworkPolicyFields {
    /// Reads and checks a NetworkPolicy. `policyTypes` defaults as the API server
    /// defaults it: Ingress always, Egress when `spec.egress` has rules.
    pub fn parse(np: &NetworkPolicy) -> Result<NetworkPolicyFields, Vec<FieldError>> {
        let mut e = Errors::default();
        let namespace = np
            .metadata
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| crate::cluster::DEFAULT_NAMESPACE.to_string());
        let spec = np.spec.clone().unwrap_or_default();
        let pod_selector = Selector::parse_into(
            &spec.pod_selector.unwrap_or_default(),
            "spec.podSelector",
            &mut e,
        );
        let ingress_rules = spec.ingress.unwrap_or_default();
        let egress_rules = spec.egress.unwrap_or_default();
        let types = spec.policy_types.unwrap_or_default();
        let (mut is_ingress, mut is_egress) = (false, false);
        if types.is_empty() {
            is_ingress = true;
            is_egress = !egress_rules.is_empty();
        } else if types.len() > 2 {
            e.push("spec.policyTypes", "at most two: Ingress and Egress");
        }
        for (i, t) in types.iter().enumerate() {
            match t.as_str() {
                "Ingress" => is_ingress = true,
                "Egress" => is_egress = true,
                o => e.push(
                    format!("spec.policyTypes[{i}]"),
                    format!("{o:?}: expected Ingress or Egress"),
                ),
            }
        }
        let mut rules = |dir: &str, peer_list: &str, given: Vec<GivenRule>| {
            given
                .into_iter()
                .enumerate()
                .map(|(i, (peers, ports))| {
                    let base = format!("spec.{dir}[{i}]");
                    let peers = peers.filter(|p| !p.is_empty()).map(|peers| {
                        (peers.iter().enumerate())
                            .filter_map(|(j, p)| {
                                peer(p, &format!("{base}.{peer_list}[{j}]"), &namespace, &mut e)
                            })
                            .collect()
                    });
                    let ports = ports.filter(|p| !p.is_empty()).map(|ports| {
                        (ports.iter().enumerate())
                            .filter_map(|(j, p)| port(p, &format!("{base}.ports[{j}]"), &mut e))
                            .collect()
                    });
                    NetworkPolicyRule { peers, ports }
                })
                .collect::<Vec<_>>()
        };
        // Rules are checked whatever the types: the API server checks them too.
        let ingress = rules(
            "ingress",
            "from",
            ingress_rules
                .into_iter()
                .map(|r| (r.from, r.ports))
                .collect(),
        );
        let egress = rules(
            "egress",
            "to",
            egress_rules.into_iter().map(|r| (r.to, r.ports)).collect(),
        );
        e.finish(NetworkPolicyFields {
            namespace: namespace.clone(),
            pod_selector,
            ingress: is_ingress.then_some(ingress),
            egress: is_egress.then_some(egress),
        })
    }
}

/// A NetworkPolicy rule as given: its peers (`from` or `to`) and ports.
type GivenRule = (
    Option<Vec<NetworkPolicyPeer>>,
    Option<Vec<NetworkPolicyPort>>,
);

fn selector(s: &LabelSelector, field: String, e: &mut Errors) -> Selector {
    Selector::parse_into(s, &field, e)
}

/// One NetworkPolicy peer at `field`; `None` when it is refused.
fn peer(p: &NetworkPolicyPeer, field: &str, own: &str, e: &mut Errors) -> Option<Peer> {
    let before = e.len();
    let selectors = p.pod_selector.is_some() || p.namespace_selector.is_some();
    if let Some(b) = &p.ip_block {
        if selectors {
            e.push(
                field,
                "ipBlock may not be combined with podSelector or namespaceSelector",
            );
            return None;
        }
        let block = ip_block(b, &format!("{field}.ipBlock"), e);
        return block.map(Peer::IpBlock);
    }
    if !selectors {
        e.push(
            field,
            "must specify podSelector, namespaceSelector or ipBlock",
        );
        return None;
    }
    let namespaces = match &p.namespace_selector {
        Some(s) => Namespaces::Selected(selector(s, format!("{field}.namespaceSelector"), e)),
        None => Namespaces::Own(own.to_string()),
    };
    let pods = match &p.pod_selector {
        Some(s) => selector(s, format!("{field}.podSelector"), e),
        None => Selector::everything(),
    };
    (e.len() == before).then_some(Peer::Pods { namespaces, pods })
}

/// Parses a CIDR, host bits cleared.
fn cidr(s: &str, field: &str, e: &mut Errors) -> Option<IpNet> {
    e.take(parse_cidr(s, field)).map(|n| n.trunc())
}

fn ip_block(b: &IPBlock, field: &str, e: &mut Errors) -> Option<IpBlock> {
    let before = e.len();
    let c = cidr(&b.cidr, &format!("{field}.cidr"), e);
    let mut except = Vec::new();
    for (i, x) in b.except.iter().flatten().enumerate() {
        let f = format!("{field}.except[{i}]");
        let Some(x) = cidr(x, &f, e) else { continue };
        if let Some(c) = c
            && !(c.contains(&x) && x.prefix_len() > c.prefix_len())
        {
            e.push(f, format!("{x} is not strictly inside cidr {c}"));
            continue;
        }
        except.push(x);
    }
    let cidr = c?;
    (e.len() == before).then_some(IpBlock { cidr, except })
}

/// One NetworkPolicy port at `field`.
fn port(p: &NetworkPolicyPort, field: &str, e: &mut Errors) -> Option<PolicyPort> {
    let protocol = e.take(Protocol::parse(
        p.protocol.as_deref(),
        format!("{field}.protocol"),
    ));
    let end_field = format!("{field}.endPort");
    let end = p
        .end_port
        .and_then(|n| e.take(parse_port(n, end_field.clone())));
    let port = match &p.port {
        None => {
            if p.end_port.is_some() {
                e.push(end_field, "requires a numeric port");
                return None;
            }
            return protocol.map(PolicyPort::All);
        }
        Some(IntOrString::Int(n)) => {
            let first = e.take(parse_port(*n, format!("{field}.port")))?;
            if let Some(end) = end
                && end < first
            {
                e.push(end_field, format!("{end} is below port {first}"));
                return None;
            }
            if p.end_port.is_some() && end.is_none() {
                return None;
            }
            PolicyPort::Range {
                protocol: protocol?,
                first,
                last: end.unwrap_or(first),
            }
        }
        Some(IntOrString::String(name)) => {
            let name = e.take(port_name(name, format!("{field}.port")))?;
            if p.end_port.is_some() {
                e.push(end_field, "requires a numeric port, not a named one");
                return None;
            }
            PolicyPort::Named {
                protocol: Some(protocol?),
                name,
            }
        }
    };
    Some(port)
}

/// Checks a port name (an IANA service name).
pub(crate) fn port_name(s: &str, field: impl Into<String>) -> Result<String, FieldError> {
    if is_port_name(s) {
        Ok(s.to_string())
    } else {
        Err(FieldError::new(
            field,
            format!(
                "{s:?} is not a port name (1-15 of lowercase letters, digits and '-', a letter at least, no '-' first, last or twice in a row)"
            ),
        ))
    }
}

/// A ClusterNetworkPolicy's tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Before NetworkPolicies.
    Admin,
    /// After NetworkPolicies, for pods they leave undecided.
    Baseline,
}

/// What a ClusterNetworkPolicy rule does with the traffic it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// Allowed; no further rule of the direction is looked at.
    Accept,
    /// Dropped; no further rule is looked at.
    Deny,
    /// The rest of the tier is skipped: the next tier decides.
    Pass,
}

/// Pods by namespace and pod selector (both must hold), or every pod of the
/// namespaces selected: a ClusterNetworkPolicy's subject, or a pod peer.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodSet {
    /// The namespaces, by their labels (empty: all).
    pub namespaces: Selector,
    /// The pods in them, by their labels (empty: all).
    pub pods: Selector,
}

/// A peer of a ClusterNetworkPolicy rule.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClusterPeer {
    /// Pods (`namespaces` peers have an empty pod selector). Host-network pods are
    /// not included.
    Pods(PodSet),
    /// Node addresses (status.addresses InternalIP and ExternalIP) of the nodes whose
    /// labels the selector selects: egress only, experimental channel.
    Nodes(Selector),
    /// Addresses in any of the CIDRs (host bits cleared): egress only. They match pod
    /// addresses too.
    Networks(Vec<IpNet>),
    /// A peer with no field ferry knows: a newer CRD's peer whose field was dropped.
    /// The API says to fail closed: an Accept rule does not match it, a Deny or Pass
    /// rule matches every peer.
    Unrecognized,
}

/// A ClusterNetworkPolicy rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterRule {
    /// Its index in spec.ingress or spec.egress.
    pub index: usize,
    /// Its name; empty when it has none.
    pub name: String,
    /// What it does.
    pub action: Action,
    /// The peers, one or more: traffic from (ingress) or to (egress) any of them.
    pub peers: Vec<ClusterPeer>,
    /// The ports; `None` matches every port (and protocol).
    pub ports: Option<Vec<PolicyPort>>,
}

/// What ferry reads of a ClusterNetworkPolicy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNetworkPolicyFields {
    /// spec.tier.
    pub tier: Tier,
    /// spec.priority, 0-1000: lower is looked at first.
    pub priority: u16,
    /// spec.subject: the pods the policy applies to.
    pub subject: PodSet,
    /// spec.ingress, in precedence order (empty: the policy does not touch ingress).
    pub ingress: Vec<ClusterRule>,
    /// spec.egress, likewise.
    pub egress: Vec<ClusterRule>,
    /// What was read in a way to be told: peers with no known field
    /// ([`ClusterPeer::Unrecognized`]).
    pub warnings: Vec<FieldError>,
}

/// The CRD's limit on rules per direction, peers per rule, protocols per rule and
/// CIDRs per peer.
pub const MAX_CLUSTER_POLICY_ITEMS: usize = 25;
/// The CRD's limit on a rule's name.
pub const MAX_RULE_NAME: usize = 100;
/// The CRD's largest priority.
pub const MAX_PRIORITY: u16 = 1000;
/// The CRD's limit on a CIDR's length.
const MAX_CIDR_LEN: usize = 43;

impl ClusterNetworkPolicyFields {
    /// Reads and checks a ClusterNetworkPolicy as its CRD's schema does.
    pub fn parse(p: &ClusterNetworkPolicy) -> Result<ClusterNetworkPolicyFields, Vec<FieldError>> {
        let mut e = Errors::default();
        let Some(spec) = p.spec.as_ref() else {
            e.push("spec", "required");
            return Err(e.into_vec());
        };
        let tier = match spec.tier.as_deref() {
            Some("Admin") => Some(Tier::Admin),
            Some("Baseline") => Some(Tier::Baseline),
            None => {
                e.push("spec.tier", "required: Admin or Baseline");
                None
            }
            Some(o) => {
                e.push("spec.tier", format!("{o:?}: expected Admin or Baseline"));
                None
            }
        };
        let priority = match spec.priority {
            None => {
                e.push("spec.priority", format!("required: 0-{MAX_PRIORITY}"));
                None
            }
            Some(n) => match u16::try_from(n) {
                Ok(n) if n <= MAX_PRIORITY => Some(n),
                _ => {
                    e.push("spec.priority", format!("{n} is outside 0-{MAX_PRIORITY}"));
                    None
                }
            },
        };
        let subject = match &spec.subject {
            None => {
                e.push("spec.subject", "required: namespaces or pods");
                None
            }
            Some(s) => match (&s.namespaces, &s.pods) {
                (Some(n), None) => Some(PodSet {
                    namespaces: selector(n, "spec.subject.namespaces".into(), &mut e),
                    pods: Selector::everything(),
                }),
                (None, Some(p)) => pod_set(p, "spec.subject.pods", &mut e),
                _ => {
                    e.push("spec.subject", "exactly one of namespaces and pods");
                    None
                }
            },
        };
        let mut warnings = Vec::new();
        let ingress = spec.ingress.as_deref().unwrap_or_default();
        let egress = spec.egress.as_deref().unwrap_or_default();
        for (dir, n) in [("ingress", ingress.len()), ("egress", egress.len())] {
            if n > MAX_CLUSTER_POLICY_ITEMS {
                e.push(
                    format!("spec.{dir}"),
                    format!("{n} rules: at most {MAX_CLUSTER_POLICY_ITEMS}"),
                );
            }
        }
        let ingress: Vec<ClusterRule> = (ingress.iter().enumerate())
            .filter_map(|(i, r)| {
                let base = format!("spec.ingress[{i}]");
                let peers = r.from.as_ref().map(|from| {
                    (from.iter().enumerate())
                        .map(|(j, p)| {
                            let egress = ClusterNetworkPolicyEgressPeer {
                                namespaces: p.namespaces.clone(),
                                pods: p.pods.clone(),
                                ..Default::default()
                            };
                            cluster_peer(
                                &egress,
                                &format!("{base}.from[{j}]"),
                                &mut e,
                                &mut warnings,
                            )
                        })
                        .collect::<Vec<_>>()
                });
                cluster_rule(
                    i,
                    &base,
                    "from",
                    &r.name,
                    &r.action,
                    peers,
                    &r.protocols,
                    &mut e,
                )
            })
            .collect();
        let egress: Vec<ClusterRule> = (egress.iter().enumerate())
            .filter_map(|(i, r)| {
                let base = format!("spec.egress[{i}]");
                let peers = r.to.as_ref().map(|to| {
                    (to.iter().enumerate())
                        .map(|(j, p)| {
                            cluster_peer(p, &format!("{base}.to[{j}]"), &mut e, &mut warnings)
                        })
                        .collect::<Vec<_>>()
                });
                let rule = cluster_rule(
                    i,
                    &base,
                    "to",
                    &r.name,
                    &r.action,
                    peers,
                    &r.protocols,
                    &mut e,
                )?;
                let to_pods_only = rule.peers.iter().all(|p| matches!(p, ClusterPeer::Pods(_)));
                let named = rule
                    .ports
                    .iter()
                    .flatten()
                    .position(|p| matches!(p, PolicyPort::Named { .. }));
                if let (false, Some(k)) = (to_pods_only, named) {
                    e.push(
                        format!("{base}.protocols[{k}].destinationNamedPort"),
                        "a named port needs pod peers only: networks and nodes have no named ports",
                    );
                    return None;
                }
                Some(rule)
            })
            .collect();
        let (Some(tier), Some(priority), Some(subject)) = (tier, priority, subject) else {
            return Err(e.into_vec());
        };
        e.finish(ClusterNetworkPolicyFields {
            tier,
            priority,
            subject,
            ingress,
            egress,
            warnings,
        })
    }
}

fn pod_set(p: &NamespacedPod, field: &str, e: &mut Errors) -> Option<PodSet> {
    let namespaces = selector(
        &p.namespace_selector.clone().unwrap_or_default(),
        format!("{field}.namespaceSelector"),
        e,
    );
    match &p.pod_selector {
        Some(s) => Some(PodSet {
            namespaces,
            pods: selector(s, format!("{field}.podSelector"), e),
        }),
        None => {
            e.push(format!("{field}.podSelector"), "required");
            None
        }
    }
}

/// One peer (ingress peers come as egress peers with only their two fields).
fn cluster_peer(
    p: &ClusterNetworkPolicyEgressPeer,
    field: &str,
    e: &mut Errors,
    warnings: &mut Vec<FieldError>,
) -> Option<ClusterPeer> {
    let set = [
        p.namespaces.is_some(),
        p.pods.is_some(),
        p.nodes.is_some(),
        p.networks.is_some(),
        p.domain_names.is_some(),
    ]
    .into_iter()
    .filter(|s| *s)
    .count();
    if set > 1 {
        e.push(field, "exactly one field may be set");
        return None;
    }
    if let Some(n) = &p.namespaces {
        return Some(ClusterPeer::Pods(PodSet {
            namespaces: selector(n, format!("{field}.namespaces"), e),
            pods: Selector::everything(),
        }));
    }
    if let Some(pods) = &p.pods {
        return pod_set(pods, &format!("{field}.pods"), e).map(ClusterPeer::Pods);
    }
    if let Some(n) = &p.nodes {
        return Some(ClusterPeer::Nodes(selector(n, format!("{field}.nodes"), e)));
    }
    if let Some(nets) = &p.networks {
        let f = format!("{field}.networks");
        if nets.is_empty() || nets.len() > MAX_CLUSTER_POLICY_ITEMS {
            e.push(&f, format!("1 to {MAX_CLUSTER_POLICY_ITEMS} CIDRs"));
            return None;
        }
        let mut out = Vec::new();
        for (i, n) in nets.iter().enumerate() {
            let fi = format!("{f}[{i}]");
            if n.len() > MAX_CIDR_LEN {
                e.push(fi, format!("longer than {MAX_CIDR_LEN} characters"));
                continue;
            }
            out.extend(cidr(n, &fi, e));
        }
        return Some(ClusterPeer::Networks(out));
    }
    if p.domain_names.is_some() {
        e.push(
            format!("{field}.domainNames"),
            "not supported: ferry does not resolve domain names for policy",
        );
        return None;
    }
    warnings.push(FieldError::new(
        field,
        "no field ferry knows (a newer CRD's peer?): an Accept rule does not match it, a Deny or Pass rule matches every peer",
    ));
    Some(ClusterPeer::Unrecognized)
}

#[allow(clippy::too_many_arguments)]
fn cluster_rule(
    index: usize,
    base: &str,
    peer_list: &str,
    name: &Option<String>,
    action: &Option<String>,
    peers: Option<Vec<Option<ClusterPeer>>>,
    protocols: &Option<Vec<ClusterNetworkPolicyProtocol>>,
    e: &mut Errors,
) -> Option<ClusterRule> {
    let before = e.len();
    let name = name.clone().unwrap_or_default();
    if name.chars().count() > MAX_RULE_NAME {
        e.push(
            format!("{base}.name"),
            format!("longer than {MAX_RULE_NAME} characters"),
        );
    }
    let action = match action.as_deref() {
        Some("Accept") => Some(Action::Accept),
        Some("Deny") => Some(Action::Deny),
        Some("Pass") => Some(Action::Pass),
        None => {
            e.push(format!("{base}.action"), "required: Accept, Deny or Pass");
            None
        }
        Some(o) => {
            e.push(
                format!("{base}.action"),
                format!("{o:?}: expected Accept, Deny or Pass"),
            );
            None
        }
    };
    let peers = match peers {
        None => {
            e.push(format!("{base}.{peer_list}"), "required: at least one peer");
            Vec::new()
        }
        Some(p) if p.is_empty() || p.len() > MAX_CLUSTER_POLICY_ITEMS => {
            e.push(
                format!("{base}.{peer_list}"),
                format!("1 to {MAX_CLUSTER_POLICY_ITEMS} peers"),
            );
            Vec::new()
        }
        Some(p) => p.into_iter().flatten().collect(),
    };
    let ports = protocols.as_ref().map(|protocols| {
        if protocols.is_empty() || protocols.len() > MAX_CLUSTER_POLICY_ITEMS {
            e.push(
                format!("{base}.protocols"),
                format!("1 to {MAX_CLUSTER_POLICY_ITEMS} protocols"),
            );
        }
        (protocols.iter().enumerate())
            .filter_map(|(i, p)| cluster_port(p, &format!("{base}.protocols[{i}]"), e))
            .collect()
    });
    let action = action?;
    (e.len() == before).then_some(ClusterRule {
        index,
        name,
        action,
        peers,
        ports,
    })
}

fn cluster_port(
    p: &ClusterNetworkPolicyProtocol,
    field: &str,
    e: &mut Errors,
) -> Option<PolicyPort> {
    let given = [
        (Protocol::Tcp, "tcp", &p.tcp),
        (Protocol::Udp, "udp", &p.udp),
        (Protocol::Sctp, "sctp", &p.sctp),
    ];
    let set = given.iter().filter(|(_, _, g)| g.is_some()).count()
        + usize::from(p.destination_named_port.is_some());
    if set != 1 {
        e.push(
            field,
            "exactly one of tcp, udp, sctp and destinationNamedPort",
        );
        return None;
    }
    if let Some(name) = &p.destination_named_port {
        let name = e.take(port_name(name, format!("{field}.destinationNamedPort")))?;
        return Some(PolicyPort::Named {
            protocol: None,
            name,
        });
    }
    let (protocol, key, attrs) = given.into_iter().find(|(_, _, g)| g.is_some())?;
    let attrs: &ProtocolPort = attrs.as_ref()?;
    let f = format!("{field}.{key}.destinationPort");
    let Some(dp) = &attrs.destination_port else {
        e.push(f, "required");
        return None;
    };
    match (dp.number, &dp.range) {
        (Some(n), None) => {
            let n = e.take(parse_port(n, format!("{f}.number")))?;
            Some(PolicyPort::Range {
                protocol,
                first: n,
                last: n,
            })
        }
        (None, Some(r)) => {
            let bound = |v: Option<i32>, name: &str, e: &mut Errors| match v {
                None => {
                    e.push(format!("{f}.range.{name}"), "required");
                    None
                }
                Some(n) => e.take(parse_port(n, format!("{f}.range.{name}"))),
            };
            let start = bound(r.start, "start", e);
            let end = bound(r.end, "end", e);
            let (first, last) = (start?, end?);
            if first >= last {
                e.push(
                    format!("{f}.range"),
                    format!("start {first} must be less than end {last}"),
                );
                return None;
            }
            Some(PolicyPort::Range {
                protocol,
                first,
                last,
            })
        }
        _ => {
            e.push(f, "exactly one of number and range");
            None
        }
    }
}

#[cfg(test)]
mod tests;
