//! From the cluster to one node's tables: the node and its peers, the overlay, the pods
//! attached to this node, and every Service port with its endpoints. See `docs/agent.md`
//! for the mapping, field by field.

mod base;
pub(crate) mod pods;
pub mod policy;
mod services;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;

use ferry_datapath::{ModeSpec, OverlaySpec, PeerSpec, PortKind, PortSpec, TablesSpec};
use ipnet::IpNet;

use crate::cluster::{Cluster, ObjectKey};
use crate::config::FerryConfig;
use crate::fields::{
    ANNOTATION_IPV4_ADDRESS, ANNOTATION_IPV4_GATEWAY, ANNOTATION_IPV6_ADDRESS,
    ANNOTATION_IPV6_GATEWAY, FieldError, NodeFields, describe,
};

pub use base::{HOST_PORT, HOST_PORT_MAC, UPLINK_PORT, carry_taken, default_base};

/// The Node label that names its zone (`topologyModeFromHints` reads it).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub use pods::{POD_GATEWAY_MAC, pod_mac, pod_port};

/// A pod whose interface exists on this node (the CNI plugin made it): only these get a
/// port, so that the tables never name a device that is not there.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AttachedPod {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The addresses the CNI plugin gave it; empty: those of its Pod object.
    pub addresses: Vec<IpAddr>,
}

impl AttachedPod {
    /// The pod `namespace/name`, with the addresses of its Pod object.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> AttachedPod {
        AttachedPod {
            namespace: namespace.into(),
            name: name.into(),
            addresses: Vec::new(),
        }
    }
}

/// Settings of the compilation that do not come from the cluster.
#[derive(Clone, Debug, Default)]
pub struct CompileOptions {
    /// `external_snat` of Services that neither their annotation nor the ferry-config
    /// ConfigMap decide (default false: keep the client's address).
    pub external_snat: bool,
    /// The MAC of the default base's uplink port (the interface's own, when the agent
    /// knows it); derived from the node's address when None. A given base is kept as is.
    pub uplink_mac: Option<ferry_datapath::MacAddr>,
    /// The file a given base was read from, named when the tables do not compile on it
    /// (the fault may be in the base as well as in the cluster).
    pub base_file: Option<String>,
    /// How Service ports spread new connections (`--service-balance`, `--balance-seed`);
    /// the default leaves a given base's `balance` as it says.
    pub balance: ferry_datapath::BalanceSpec,
    /// `--service-proxy-name`: the Services this node proxies are those whose
    /// `service.kubernetes.io/service-proxy-name` label has this value; `None` (the
    /// default): those without the label, as kube-proxy. The others are left to the
    /// proxy their label names.
    pub service_proxy_name: Option<String>,
    /// The node's own stack the agent moved from the uplink onto the host TAP
    /// (`--take-uplink`, [`crate::takeover`]): the default base carries it
    /// ([`base::carry_taken`]). A given base is kept as is.
    pub taken: Option<std::sync::Arc<crate::takeover::Taken>>,
}

/// A health check node port this node must serve: kube-proxy's for a LoadBalancer
/// Service with `externalTrafficPolicy: Local`, so that the load balancer sends only to
/// nodes with local endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    /// The Service, `namespace/name`.
    pub service: String,
    /// spec.healthCheckNodePort.
    pub port: u16,
    /// The Service's ready endpoints on this node, counted by address over all its
    /// ports (an endpoint serving two ports counts once, as kube-proxy counts).
    pub local_endpoints: usize,
}

/// What [`node_tables`] makes.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The node's tables (they pass [`TablesSpec::compile`]).
    pub tables: TablesSpec,
    /// The same, compiled.
    pub compiled: std::sync::Arc<ferry_datapath::Tables>,
    /// The health check node ports to serve, by Service name.
    pub health_checks: Vec<HealthCheck>,
    /// Things left out, each naming its object (e.g. an SCTP Service port).
    pub warnings: Vec<String>,
    /// The port name given to each attached pod.
    pub pod_ports: BTreeMap<ObjectKey, String>,
    /// The addresses of each attached pod's port, which policy knows it by.
    pub pod_addresses: BTreeMap<ObjectKey, Vec<std::net::IpAddr>>,
    /// What compiling the policy section leaves for the next time: a change that only
    /// policy reads compiles again only what it touched.
    pub policy_cache: policy::PolicyCache,
}

/// Reads an object's fields; an error names the object and every bad field.
fn read<T>(r: Result<T, Vec<FieldError>>, what: &dyn fmt::Display) -> Result<T, String> {
    r.map_err(|e| describe(what, &e))
}

/// Compiles the tables of the node named `node`.
///
/// `base` gives what the cluster does not know (the uplink port, routes, limits); without
/// one, [`default_base`] derives it from the Node object. `attached` lists the pods whose
/// interface is on this node. The error names the object and the field at fault, or the
/// entry of the compiled tables that does not compile.
pub fn node_tables(
    cluster: &Cluster,
    node: &str,
    base: Option<&TablesSpec>,
    attached: &[AttachedPod],
    opts: &CompileOptions,
) -> Result<Compiled, String> {
    let this = cluster
        .node(node)
        .ok_or_else(|| format!("no Node named {node:?} in the cluster"))?;
    let this_fields = read(NodeFields::parse(this), &format_args!("Node {node}"))?;
    let mut warnings: Vec<String> = this_fields
        .warnings
        .iter()
        .map(|w| format!("Node {node}: {w}"))
        .collect();
    let mut tables = match base {
        Some(b) => b.clone(),
        None => {
            let (mut b, w) = default_base(cluster, node)?;
            warnings.extend(w);
            if let Some(mac) = opts.uplink_mac
                && let Some(p) = b.ports.iter_mut().find(|p| p.name == UPLINK_PORT)
            {
                p.mac = mac;
            }
            if let Some(t) = &opts.taken {
                base::carry_taken(&mut b, node, &this_fields.internal_ips, t, &mut warnings);
            }
            b
        }
    };
    if base.is_none() || !opts.balance.is_default() {
        tables.balance = opts.balance;
    }
    let config = FerryConfig::of(cluster)?;

    tables.node.name = node.to_string();
    if tables.node.addresses.is_empty() {
        // Internal addresses first: the first of a family is the overlay's outer source.
        for a in this_fields
            .internal_ips
            .iter()
            .chain(&this_fields.external_ips)
        {
            if !tables.node.addresses.contains(a) {
                tables.node.addresses.push(*a);
            }
        }
    }
    if tables.node.pod_cidrs.is_empty() {
        // Its pods' addresses come from these: the rest of them routes nowhere.
        tables.node.pod_cidrs = this_fields.pod_cidrs.clone();
    }
    if tables.node.zone.is_none() {
        // The zone that endpoints' zone hints name, as kube-proxy reads it.
        tables.node.zone = this
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ZONE_LABEL))
            .filter(|z| !z.is_empty())
            .cloned();
    }
    if tables.node.addresses.is_empty() {
        warnings.push(format!(
            "Node {node}: no InternalIP or ExternalIP in status.addresses: no underlay address, so no other node is reachable"
        ));
    }

    let pod_ports = pods::add_ports(cluster, node, attached, &mut tables)?;
    add_peers(
        cluster,
        node,
        &config,
        &mut tables,
        base.is_none(),
        &mut warnings,
    )?;
    let pod_addresses = pod_addresses(&pod_ports, &tables);
    let held = policy::Held::of(cluster).with_ports(pod_addresses.clone());
    let mut policy_cache = policy::PolicyCache::new();
    tables.policy = policy_cache.compile(
        &policy::inputs(cluster, &held),
        &pod_ports,
        policy::PolicyOptions::of(&config),
        policy::Changes::All,
    );
    let svc = services::compile(cluster, node, &config, opts)?;
    tables.services.extend(svc.specs);
    warnings.extend(svc.warnings);

    // A datastore must never hand the datapath tables it would refuse: find out here,
    // where the error can still name the node.
    let compiled = tables.compile().map_err(|e| {
        let on = match (base, &opts.base_file) {
            (None, _) => String::new(),
            (Some(_), Some(f)) => format!(" on the base tables {f}"),
            (Some(_), None) => " on the base tables given".into(),
        };
        format!("the tables of node {node}{on} do not compile: {e}")
    })?;
    Ok(Compiled {
        compiled: std::sync::Arc::new(compiled),
        tables,
        health_checks: svc.health_checks,
        warnings,
        pod_ports,
        pod_addresses,
        policy_cache,
    })
}

/// The addresses of each pod port of `tables`, by pod.
fn pod_addresses(
    pod_ports: &BTreeMap<ObjectKey, String>,
    tables: &TablesSpec,
) -> BTreeMap<ObjectKey, Vec<std::net::IpAddr>> {
    let by_name: BTreeMap<&str, &ferry_datapath::PortSpec> =
        tables.ports.iter().map(|p| (p.name.as_str(), p)).collect();
    (pod_ports.iter())
        .filter_map(|(k, name)| {
            let p = by_name.get(name.as_str())?;
            Some((k.clone(), p.addresses.iter().map(|a| a.addr).collect()))
        })
        .collect()
}

/// The Services part of a node's tables for the Services `keys` only (those still in
/// the cluster; a key without a Service gives nothing): what an EndpointSlice or Service
/// change needs, without compiling every other Service. The tables entries of a Service
/// are named `namespace/name:port`.
#[derive(Clone, Debug, Default)]
pub struct ServiceTables {
    /// Tables entries, one per Service port.
    pub specs: Vec<ferry_datapath::ServiceSpec>,
    /// Health check node ports of these Services.
    pub health_checks: Vec<HealthCheck>,
    /// Things left out.
    pub warnings: Vec<String>,
}

/// Compiles the Services `keys` of `cluster` for node `node` (see [`ServiceTables`]).
pub fn service_tables(
    cluster: &Cluster,
    node: &str,
    keys: &std::collections::BTreeSet<ObjectKey>,
    opts: &CompileOptions,
) -> Result<ServiceTables, String> {
    let config = FerryConfig::of(cluster)?;
    let out = services::compile_some(cluster, node, &config, opts, keys)?;
    Ok(ServiceTables {
        specs: out.specs,
        health_checks: out.health_checks,
        warnings: out.warnings,
    })
}

/// Adds every other Node reachable on an underlay family this node has as an overlay
/// peer, and the overlay itself when the base has none.
///
/// A Node the tables would refuse as a peer (see [`Peers::refusal`]) is left out with a
/// warning, so that one bad Node does not stop this node's tables from compiling (and
/// every later change with them). Nodes come in name order, after the base's peers: of
/// two that clash, the one whose name sorts first stays, on every node alike.
fn add_peers(
    cluster: &Cluster,
    node: &str,
    config: &FerryConfig,
    tables: &mut TablesSpec,
    default_base: bool,
    warnings: &mut Vec<String>,
) -> Result<(), String> {
    let has = |v6: bool| tables.node.addresses.iter().any(|a| a.is_ipv6() == v6);
    let mode = tables
        .overlay
        .as_ref()
        .map_or(config.encapsulation, |o| o.mode);
    let mut taken = Peers::new(tables, mode, default_base);
    let mut peers = Vec::new();
    for (key, n) in &cluster.nodes {
        if key.name == node || tables.nodes.iter().any(|p| p.name == key.name) {
            continue;
        }
        let f = read(NodeFields::parse(n), &format_args!("Node {key}"))?;
        warnings.extend(f.warnings.iter().map(|w| format!("Node {key}: {w}")));
        let Some(address) = f.internal_ips.iter().copied().find(|a| has(a.is_ipv6())) else {
            warnings.push(format!(
                "Node {key}: no InternalIP of a family node {node} has ({}): not reachable through the overlay",
                families(&tables.node.addresses)
            ));
            continue;
        };
        let peer = PeerSpec {
            name: key.name.clone(),
            address,
            pod_cidrs: f.pod_cidrs,
            mac: None,
        };
        if let Some(why) = taken.refusal(&peer) {
            warnings.push(format!("Node {key}: {why}: left out of the overlay"));
            continue;
        }
        taken.take(&peer, format!("Node {key}"));
        peers.push(peer);
    }
    if !peers.is_empty() && tables.overlay.is_none() {
        let uplink = tables
            .ports
            .iter()
            .find(|p| p.kind == PortKind::Uplink)
            .ok_or_else(|| {
                format!(
                    "{} other nodes need the overlay, and the base tables have no port of kind uplink to carry it",
                    peers.len()
                )
            })?;
        tables.overlay = Some(OverlaySpec {
            vni: config.vxlan_vni,
            port: config.vxlan_port,
            mode: config.encapsulation,
            uplink: uplink.name.clone(),
            mac: None,
        });
    }
    tables.nodes.extend(peers);
    Ok(())
}

/// The peers taken so far, indexed for [`Peers::refusal`]: checking one more costs a few
/// lookups however many there are.
struct Peers<'t> {
    tables: &'t TablesSpec,
    mode: ModeSpec,
    /// The base is [`default_base`], made from this node's annotations.
    default_base: bool,
    /// The port the overlay will use: the base overlay's uplink, else the first port of
    /// kind uplink (without one there is no overlay, an error of its own).
    uplink: Option<&'t PortSpec>,
    /// The pods' own addresses the tables route to their ports (those no base route
    /// names), with the port's name.
    pods: HashMap<IpAddr, &'t str>,
    /// The peers' addresses, with the peer's name for messages.
    addresses: HashMap<IpAddr, String>,
    /// The peers' pod CIDRs by family and first address: the last address, the CIDR, the
    /// peer's name. They do not overlap (an overlapping one is refused).
    cidrs: BTreeMap<(bool, u128), (u128, IpNet, String)>,
}

impl<'t> Peers<'t> {
    /// The base's peers of `tables`, and what to check newcomers against.
    fn new(tables: &'t TablesSpec, mode: ModeSpec, default_base: bool) -> Peers<'t> {
        let uplink_name = match &tables.overlay {
            Some(o) => Some(o.uplink.as_str()),
            None => tables
                .ports
                .iter()
                .find(|p| p.kind == PortKind::Uplink)
                .map(|p| p.name.as_str()),
        };
        let pods = tables
            .ports
            .iter()
            .filter(|p| p.kind == PortKind::Pod)
            .flat_map(|p| p.addresses.iter().map(move |a| (a.addr, p.name.as_str())))
            .filter(|(a, _)| {
                let host = IpNet::from(*a);
                !tables.routes.iter().any(|r| r.prefix.trunc() == host)
            })
            .collect();
        let mut peers = Peers {
            tables,
            mode,
            default_base,
            uplink: tables
                .ports
                .iter()
                .find(|p| Some(p.name.as_str()) == uplink_name),
            pods,
            addresses: HashMap::new(),
            cidrs: BTreeMap::new(),
        };
        for p in &tables.nodes {
            peers.take(p, format!("peer {} of the base tables", p.name));
        }
        peers
    }

    /// Takes `p`, called `name` in messages about those that clash with it.
    fn take(&mut self, p: &PeerSpec, name: String) {
        self.addresses.insert(p.address, name.clone());
        for c in &p.pod_cidrs {
            let (v6, first, last) = span(c);
            self.cidrs.insert((v6, first), (last, *c, name.clone()));
        }
    }

    /// The pod CIDR taken that overlaps `c`, and its peer's name.
    fn overlapping(&self, c: &IpNet) -> Option<(&IpNet, &str)> {
        let (v6, first, last) = span(c);
        let before = self.cidrs.range(..=(v6, first)).next_back();
        let after = self.cidrs.range((v6, first)..).next();
        before
            .filter(|((f, _), (end, ..))| *f == v6 && *end >= first)
            .or(after.filter(|((f, start), _)| *f == v6 && *start <= last))
            .map(|(_, (_, net, name))| (net, name.as_str()))
    }

    /// Why [`TablesSpec::compile`] would refuse `p` after the peers taken, if it would:
    /// the checks it makes of each of `nodes`, against this node, the peers before and
    /// the routes of the base.
    fn refusal(&self, p: &PeerSpec) -> Option<String> {
        let this = &self.tables.node;
        if this.addresses.contains(&p.address) {
            return Some(format!(
                "InternalIP {} is an address of node {}",
                p.address, this.name
            ));
        }
        if let Some(other) = self.addresses.get(&p.address) {
            return Some(format!(
                "InternalIP {} is also the address of {other}",
                p.address
            ));
        }
        for c in &p.pod_cidrs {
            if let Some(own) = this
                .pod_cidrs
                .iter()
                .find(|o| o.contains(c) || c.contains(*o))
            {
                return Some(format!(
                    "pod CIDR {c} overlaps pod CIDR {own} of node {}",
                    this.name
                ));
            }
            if let Some((theirs, other)) = self.overlapping(c) {
                return Some(format!(
                    "pod CIDR {c} overlaps pod CIDR {theirs} of {other}"
                ));
            }
            if self
                .tables
                .routes
                .iter()
                .any(|r| r.prefix.trunc() == c.trunc())
            {
                return Some(format!("pod CIDR {c} is also a route of the base tables"));
            }
            if c.prefix_len() == c.max_prefix_len()
                && let Some(port) = self.pods.get(&c.addr())
            {
                return Some(format!("pod CIDR {c} is the address of port {port}"));
            }
        }
        let uplink = self.uplink?;
        let on_link = uplink.addresses.iter().any(|a| {
            a.prefix_len
                .and_then(|l| IpNet::new(a.addr, l).ok())
                .is_some_and(|n| n.contains(&p.address))
        });
        if on_link {
            return None;
        }
        // The longest prefix that covers the address among the routes the tables hold
        // when they come to this peer: the base's, the pods' own addresses, the peers'
        // before it. Of two of one length, the first one in stays, as in the tables.
        let mut best: Option<(u8, Hop)> = None;
        let mut consider = |len: u8, hop| {
            if best.as_ref().is_none_or(|(l, _)| len > *l) {
                best = Some((len, hop));
            }
        };
        for r in &self.tables.routes {
            if r.prefix.contains(&p.address) {
                consider(r.prefix.prefix_len(), Hop::Port(&r.port));
            }
        }
        if let Some(port) = self.pods.get(&p.address) {
            consider(IpNet::from(p.address).prefix_len(), Hop::Port(port));
        }
        if let Some((net, other)) = self.overlapping(&IpNet::from(p.address)) {
            consider(net.prefix_len(), Hop::Peer(net, other));
        }
        match best.map(|(_, hop)| hop) {
            Some(Hop::Port(port)) if port == uplink.name => None,
            // Without encapsulation the other peer is a plain next hop.
            Some(Hop::Peer(..)) if self.mode == ModeSpec::Never => None,
            Some(Hop::Peer(net, other)) => Some(format!(
                "InternalIP {} is in pod CIDR {net} of {other}",
                p.address
            )),
            Some(Hop::Port(_)) | None => Some(format!(
                "no route to its InternalIP {} through the uplink {:?} ({})",
                p.address,
                uplink.name,
                self.no_route_hint(p.address.is_ipv6())
            )),
        }
    }

    /// What gives this node a route to a peer of the family.
    fn no_route_hint(&self, v6: bool) -> String {
        let (gateway, address) = if v6 {
            (ANNOTATION_IPV6_GATEWAY, ANNOTATION_IPV6_ADDRESS)
        } else {
            (ANNOTATION_IPV4_GATEWAY, ANNOTATION_IPV4_ADDRESS)
        };
        if self.default_base {
            format!(
                "annotate node {} with {gateway}, or {address} as ADDR/LEN",
                self.tables.node.name
            )
        } else {
            "add a route to the base tables, or give the uplink address as ADDR/LEN".into()
        }
    }
}

/// Where a route of the tables leads: out of a port, or to a peer (by its pod CIDR).
enum Hop<'a> {
    Port(&'a str),
    Peer(&'a IpNet, &'a str),
}

/// A prefix's family and its first and last addresses.
fn span(n: &IpNet) -> (bool, u128, u128) {
    match n {
        IpNet::V4(n) => (
            false,
            u128::from(n.network().to_bits()),
            u128::from(n.broadcast().to_bits()),
        ),
        IpNet::V6(n) => (true, n.network().to_bits(), n.broadcast().to_bits()),
    }
}

fn families(addrs: &[IpAddr]) -> &'static str {
    match (
        addrs.iter().any(IpAddr::is_ipv4),
        addrs.iter().any(IpAddr::is_ipv6),
    ) {
        (true, true) => "IPv4, IPv6",
        (true, false) => "IPv4",
        (false, true) => "IPv6",
        (false, false) => "none",
    }
}
