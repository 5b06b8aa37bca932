//! Services as the tables file describes them: one entry per Service port.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// Which endpoints a traffic policy allows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Endpoints on every node.
    #[default]
    Cluster,
    /// Endpoints on this node only.
    Local,
}

impl Policy {
    /// Lower-case name, as the tables file writes it.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Cluster => "cluster",
            Policy::Local => "local",
        }
    }
}

/// How new connections are spread over a Service port's eligible endpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BalanceMode {
    /// Consistent hashing of the flow with the seed: the same endpoint on every node
    /// and after a restart, while the endpoints are the same. Rendezvous hashing for a
    /// set of at most [`super::rendezvous::MAX_ENDPOINTS`] endpoints (no table; only the
    /// flows of an endpoint that goes move), a Maglev table for a larger one.
    #[default]
    Consistent,
    /// The same with a Maglev table for every set, as Cilium and Calico choose.
    Maglev,
    /// A hash of the flow keyed anew by every process: another agent (a restart, another
    /// node) may choose another endpoint for the same flow.
    Random,
}

/// The tables' `balance`: how every Service port spreads new connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BalanceSpec {
    /// `consistent` (default), `maglev` or `random`.
    #[serde(default)]
    pub mode: BalanceMode,
    /// The seed of a consistent balance: every node of a cluster must have the same (default
    /// [`super::maglev::DEFAULT_SEED`]).
    #[serde(default = "default_seed")]
    pub seed: u64,
}

fn default_seed() -> u64 {
    super::maglev::DEFAULT_SEED
}

impl Default for BalanceSpec {
    fn default() -> BalanceSpec {
        BalanceSpec {
            mode: BalanceMode::Consistent,
            seed: default_seed(),
        }
    }
}

impl BalanceSpec {
    /// True for the default (left out of a written tables file).
    pub fn is_default(&self) -> bool {
        *self == BalanceSpec::default()
    }
}

/// One port of a Kubernetes Service, with its frontends and endpoints (both address
/// families may appear; a frontend only ever goes to endpoints of its own family).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// `namespace/name:port` (the port's name, or its number when unnamed): shown in
    /// traces and counters, and the key session affinity is kept under.
    pub name: String,
    /// `tcp` or `udp` (SCTP is refused).
    pub proto: String,
    /// The Service port: the port of cluster IPs, external IPs and load balancer IPs.
    pub port: u16,
    /// Cluster IPs (spec.clusterIPs), reached with `port`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_ips: Vec<IpAddr>,
    /// The node port, reached on every address of this node (`node.addresses`, and the
    /// addresses of uplink and host ports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_port: Option<u16>,
    /// spec.externalIPs, reached with `port`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external_ips: Vec<IpAddr>,
    /// status.loadBalancer.ingress[].ip, reached with `port`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load_balancer_ips: Vec<IpAddr>,
    /// spec.loadBalancerSourceRanges: the only sources a new connection to one of
    /// `load_balancer_ips` may come from, read per family as kube-proxy reads them: the
    /// load balancer IPs of a family without any range accept every source. Cluster IPs,
    /// external IPs and the node port are not checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_ranges: Vec<IpNet>,
    /// externalTrafficPolicy: endpoints for node port, external and load balancer
    /// traffic (default cluster).
    #[serde(default)]
    pub external_policy: Policy,
    /// internalTrafficPolicy: endpoints for cluster IP traffic (default cluster).
    #[serde(default)]
    pub internal_policy: Policy,
    /// sessionAffinity ClientIP: a client keeps its endpoint for this many seconds after
    /// its last new connection (absent: no affinity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_timeout_s: Option<u32>,
    /// External traffic to an endpoint on another node leaves with this node's address
    /// as source (instead of the client's address kept and replies returning through
    /// this node).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub external_snat: bool,
    /// The endpoints.
    #[serde(default)]
    pub backends: Vec<BackendSpec>,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// One endpoint of a Service port.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSpec {
    /// The endpoint's address.
    pub addr: IpAddr,
    /// The endpoint's port (the Service's target port, resolved).
    pub port: u16,
    /// The node the endpoint runs on; this node's name (or absent, without `no_node`)
    /// makes it local.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The endpoint is on no node (an EndpointSlice endpoint without nodeName, such as
    /// a machine outside the cluster): local on none, as kube-proxy takes it. Only
    /// without `node`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_node: bool,
    /// conditions.ready (default true).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub ready: bool,
    /// conditions.serving (default: as `ready`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<bool>,
    /// conditions.terminating (default false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub terminating: bool,
    /// The EndpointSlice's topology hints for the endpoint (default none).
    #[serde(default, skip_serializing_if = "HintsSpec::is_empty")]
    pub hints: HintsSpec,
}

/// An endpoint's topology hints (EndpointSlice `hints`), which the EndpointSlice
/// controller writes for a Service's `trafficDistribution`: the zones and nodes whose
/// traffic it is meant for. When every ready endpoint of a Service port's family has
/// node hints and one names this node, only those endpoints serve this node's
/// cluster-wide traffic; else the same with zone hints and this node's zone; else
/// hints are not used (kube-proxy's rule).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HintsSpec {
    /// hints.forZones[].name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
    /// hints.forNodes[].name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
}

impl HintsSpec {
    /// True without any hint.
    pub fn is_empty(&self) -> bool {
        self.zones.is_empty() && self.nodes.is_empty()
    }
}
