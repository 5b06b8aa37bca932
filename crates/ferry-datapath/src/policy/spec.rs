//! The policy section of the tables file: what the agent resolved from NetworkPolicies
//! and ClusterNetworkPolicies for this node's pods. Everything that needs the cluster
//! (selectors, namespaces, named ports) is resolved before it gets here: the datapath
//! sees address blocks, port ranges and, per pod port, the rules in evaluation order.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// Policy for this node's pods.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// The policies rules come from, by the name traces and counters give them (for
    /// example `NetworkPolicy x/allow-a`); rules and pods refer to them by index.
    #[serde(default)]
    pub policies: Vec<String>,
    /// Peer sets: address blocks a rule's peers are, referred to by index.
    #[serde(default)]
    pub sets: Vec<SetSpec>,
    /// Rules, referred to by index.
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
    /// The pod ports that some policy applies to; a pod port not listed is isolated in
    /// neither direction and in no tier.
    #[serde(default)]
    pub pods: Vec<PodPolicySpec>,
    /// The node's own stack (packets from the host port: kubelet probes, hostNetwork
    /// pods) reaches its pods whatever their ingress policy. Default true.
    #[serde(default = "yes")]
    pub host_to_pods: bool,
    /// When the tables change, tracked connections that the new policy would not allow
    /// are ended (as Cilium does). Default false: they are kept until they end (as
    /// Calico and Antrea do), and only new connections meet the new policy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reevaluate: bool,
}

fn yes() -> bool {
    true
}

impl Default for PolicySpec {
    fn default() -> PolicySpec {
        PolicySpec {
            policies: Vec::new(),
            sets: Vec::new(),
            rules: Vec::new(),
            pods: Vec::new(),
            host_to_pods: true,
            reevaluate: false,
        }
    }
}

impl PolicySpec {
    /// True when it says nothing a default does not (the tables file leaves it out).
    pub fn is_default(&self) -> bool {
        *self == PolicySpec::default()
    }
}

/// A set of peer addresses: the union of its blocks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetSpec {
    /// What the set stands for, for explanations (for example `pods app=a in x`).
    #[serde(default)]
    pub name: String,
    /// Its blocks.
    pub blocks: Vec<BlockSpec>,
}

/// A block of addresses: `cidr` less the `except` blocks inside it (a pod's address is
/// a /32 or /128 block).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockSpec {
    /// The block.
    pub cidr: IpNet,
    /// Parts of it left out; each must lie inside `cidr`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub except: Vec<IpNet>,
}

/// What a rule does with a connection it matches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionSpec {
    /// Allowed (a NetworkPolicy rule; ClusterNetworkPolicy's `Accept`).
    #[default]
    Accept,
    /// Denied.
    Deny,
    /// The Admin tier says nothing more: NetworkPolicy decides (then the Baseline tier).
    Pass,
}

/// A rule: it matches a connection when one of its matches does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// The rule's name, as traces show it after its policy's (for example `ingress[0]`).
    pub name: String,
    /// The policy it belongs to (index in `policies`).
    pub policy: u32,
    /// What it does. NetworkPolicy rules only accept.
    #[serde(default)]
    pub action: ActionSpec,
    /// Its matches; none matches nothing (a rule whose peers selected no pod).
    #[serde(default)]
    pub matches: Vec<MatchSpec>,
}

/// Peers and ports together: a connection matches when its peer is in one of the sets
/// and its protocol and destination port in one of the ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchSpec {
    /// Peer sets (indexes in `sets`); absent: every peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers: Option<Vec<u32>>,
    /// Protocols and destination ports; empty: every protocol and port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortRangeSpec>,
}

/// A protocol and destination ports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortRangeSpec {
    /// `tcp`, `udp` or `sctp`.
    pub proto: String,
    /// The first port; absent: every port of the protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The last port (at least `port`); absent: `port` alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<u16>,
}

/// The rules that apply to one pod port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodPolicySpec {
    /// The pod's port (a port of kind pod).
    pub port: String,
    /// Connections to the pod.
    #[serde(default)]
    pub ingress: DirectionSpec,
    /// Connections from the pod.
    #[serde(default)]
    pub egress: DirectionSpec,
}

/// The rules of one direction, in evaluation order (see the [module](super)).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectionSpec {
    /// ClusterNetworkPolicy Admin tier rules, in priority order (indexes in `rules`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admin: Vec<u32>,
    /// The NetworkPolicies selecting the pod for this direction (indexes in
    /// `policies`): any isolates it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub isolated_by: Vec<u32>,
    /// Their rules (indexes in `rules`, all `accept`): allowed is what any allows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<u32>,
    /// Baseline tier rules, in priority order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub baseline: Vec<u32>,
}
