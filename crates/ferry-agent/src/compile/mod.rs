//! From the cluster to one node's tables: the node and its peers, the overlay, the pods
//! attached to this node, and every Service port with its endpoints. See `docs/agent.md`
//! for the mapping, field by field.

mod base;
pub(crate) mod pods;
mod services;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use ferry_datapath::tables::{OverlaySpec, PeerSpec, PortKind, TablesSpec};

use crate::cluster::{Cluster, ObjectKey};
use crate::config::FerryConfig;
use crate::fields::{FieldError, NodeFields, describe};

pub use base::{UPLINK_PORT, default_base};
pub use pods::{POD_GATEWAY_MAC, pod_mac};

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
    pub uplink_mac: Option<ferry_datapath::tables::MacAddr>,
    /// The file a given base was read from, named when the tables do not compile on it
    /// (the fault may be in the base as well as in the cluster).
    pub base_file: Option<String>,
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
    pub compiled: std::sync::Arc<ferry_datapath::tables::Tables>,
    /// The health check node ports to serve, by Service name.
    pub health_checks: Vec<HealthCheck>,
    /// Things left out, each naming its object (e.g. an SCTP Service port).
    pub warnings: Vec<String>,
    /// The port name given to each attached pod.
    pub pod_ports: BTreeMap<ObjectKey, String>,
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
    let mut warnings = Vec::new();
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
            b
        }
    };
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
    if tables.node.addresses.is_empty() {
        warnings.push(format!(
            "Node {node}: no InternalIP or ExternalIP in status.addresses: no underlay address, so no other node is reachable"
        ));
    }

    let pod_ports = pods::add_ports(cluster, node, attached, &mut tables)?;
    add_peers(cluster, node, &config, &mut tables, &mut warnings)?;
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
    })
}

/// The Services part of a node's tables for the Services `keys` only (those still in
/// the cluster; a key without a Service gives nothing): what an EndpointSlice or Service
/// change needs, without compiling every other Service. The tables entries of a Service
/// are named `namespace/name:port`.
#[derive(Clone, Debug, Default)]
pub struct ServiceTables {
    /// Tables entries, one per Service port.
    pub specs: Vec<ferry_datapath::lb::ServiceSpec>,
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
fn add_peers(
    cluster: &Cluster,
    node: &str,
    config: &FerryConfig,
    tables: &mut TablesSpec,
    warnings: &mut Vec<String>,
) -> Result<(), String> {
    let has = |v6: bool| tables.node.addresses.iter().any(|a| a.is_ipv6() == v6);
    let mut peers = Vec::new();
    for (key, n) in &cluster.nodes {
        if key.name == node || tables.nodes.iter().any(|p| p.name == key.name) {
            continue;
        }
        let f = read(NodeFields::parse(n), &format_args!("Node {key}"))?;
        let Some(address) = f.internal_ips.iter().copied().find(|a| has(a.is_ipv6())) else {
            warnings.push(format!(
                "Node {key}: no InternalIP of a family node {node} has ({}): not reachable through the overlay",
                families(&tables.node.addresses)
            ));
            continue;
        };
        peers.push(PeerSpec {
            name: key.name.clone(),
            address,
            pod_cidrs: f.pod_cidrs,
            mac: None,
        });
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
