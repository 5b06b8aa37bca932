//! Services: one tables entry per Service port, its endpoints from the Service's
//! EndpointSlices; and the health check node ports.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use ferry_datapath::{BackendSpec, HintsSpec, ServiceSpec, TrafficPolicy};
use ipnet::IpNet;

use crate::cluster::{Cluster, ObjectKey};
use crate::config::FerryConfig;
use crate::fields::{
    HEADLESS_LABEL, NodeFields, Protocol, SERVICE_NAME_LABEL, SERVICE_PROXY_NAME_LABEL,
    ServicePortFields, ServiceType, SliceFields, describe,
};

use super::{CompileOptions, HealthCheck, read};

/// The Services' part of a node's tables.
pub(super) struct Out {
    pub specs: Vec<ServiceSpec>,
    pub health_checks: Vec<HealthCheck>,
    pub warnings: Vec<String>,
}

pub(super) fn compile(
    cluster: &Cluster,
    node: &str,
    config: &FerryConfig,
    opts: &CompileOptions,
) -> Result<Out, String> {
    let mut out = Out {
        specs: Vec::new(),
        health_checks: Vec::new(),
        warnings: Vec::new(),
    };
    // Each slice once, grouped by its Service (namespace, kubernetes.io/service-name).
    let mut by_service: HashMap<(&str, &str), Vec<SliceFields>> = HashMap::new();
    for (key, s) in &cluster.endpoint_slices {
        let labels = s.metadata.labels.as_ref();
        let Some(service) = labels.and_then(|l| l.get(SERVICE_NAME_LABEL)) else {
            continue;
        };
        // A headless Service's slices: kube-proxy does not read them.
        if labels.is_some_and(|l| l.contains_key(HEADLESS_LABEL)) {
            continue;
        }
        let f = read(SliceFields::parse(s), &format_args!("EndpointSlice {key}"))?;
        out.warnings.extend(
            f.warnings
                .iter()
                .map(|w| format!("EndpointSlice {key}: {w}")),
        );
        by_service
            .entry((key.namespace.as_str(), service.as_str()))
            .or_default()
            .push(f);
    }
    let here = node_ips(cluster, node);
    for key in cluster.services.keys() {
        let slices = by_service
            .get(&(key.namespace.as_str(), key.name.as_str()))
            .map_or(&[][..], Vec::as_slice);
        one(cluster, key, slices, node, here, config, opts, &mut out)?;
    }
    Ok(out)
}

/// Compiles only the Services `keys` (those of them still in the cluster): what an
/// EndpointSlice or Service change needs, without reading every other Service.
pub(super) fn compile_some(
    cluster: &Cluster,
    node: &str,
    config: &FerryConfig,
    opts: &CompileOptions,
    keys: &BTreeSet<ObjectKey>,
) -> Result<Out, String> {
    let mut out = Out {
        specs: Vec::new(),
        health_checks: Vec::new(),
        warnings: Vec::new(),
    };
    let here = node_ips(cluster, node);
    for key in keys {
        if !cluster.services.contains_key(key) {
            continue;
        }
        let mut slices = Vec::new();
        for s in cluster.endpoint_slices_of(&key.namespace, &key.name) {
            if s.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(HEADLESS_LABEL))
            {
                continue;
            }
            let what = format!(
                "EndpointSlice {}/{}",
                key.namespace,
                s.metadata.name.as_deref().unwrap_or_default()
            );
            let f = read(SliceFields::parse(s), &what)?;
            out.warnings
                .extend(f.warnings.iter().map(|w| format!("{what}: {w}")));
            slices.push(f);
        }
        one(cluster, key, &slices, node, here, config, opts, &mut out)?;
    }
    Ok(out)
}

/// Compiles the Service `key` of `cluster`: its ports' tables entries (without the
/// frontends another Service wins, [`Cluster::left_out`]), and its health check node
/// port.
#[allow(clippy::too_many_arguments)]
fn one(
    cluster: &Cluster,
    key: &ObjectKey,
    slices: &[SliceFields],
    node: &str,
    node_ips: [Option<IpAddr>; 2],
    config: &FerryConfig,
    opts: &CompileOptions,
    out: &mut Out,
) -> Result<(), String> {
    // Parsed as the Service came in; refused by its datastore unless it parses.
    let Some(f) = cluster.service_fields(key) else {
        return Ok(());
    };
    // A Service for another proxy (service.kubernetes.io/service-proxy-name) is left to
    // it, as kube-proxy leaves it; so is one labelled service.kubernetes.io/headless,
    // which kube-proxy's informers do not even list (the label selector they share with
    // the slices').
    let labels = cluster
        .services
        .get(key)
        .and_then(|s| s.metadata.labels.as_ref());
    let proxy = labels.and_then(|l| l.get(SERVICE_PROXY_NAME_LABEL));
    if proxy.map(String::as_str) != opts.service_proxy_name.as_deref()
        || labels.is_some_and(|l| l.contains_key(HEADLESS_LABEL))
    {
        return Ok(());
    }
    let f = f.map_err(|e| describe(&format_args!("Service {key}"), e))?;
    let left_out = cluster.left_out(key);
    out.warnings
        .extend(f.warnings.iter().map(|w| format!("Service {key}: {w}")));
    // kube-proxy leaves both alone: an ExternalName Service is a DNS alias, a
    // headless one only gives its endpoints' addresses through DNS.
    if f.type_ == ServiceType::ExternalName || f.headless {
        return Ok(());
    }
    let source_ranges = source_ranges(&f.source_ranges, &f.load_balancer_ips, node_ips);
    for v6 in [false, true] {
        let family = |ip: &IpAddr| ip.is_ipv6() == v6;
        if !f.source_ranges.is_empty()
            && !f.source_ranges.iter().any(|r| family(&r.addr()))
            && f.load_balancer_ips.iter().any(family)
        {
            out.warnings.push(format!(
                "Service {key}: spec.loadBalancerSourceRanges has no IPv{} range: its IPv{} load balancer IPs accept every source, as kube-proxy reads the ranges per family",
                if v6 { 6 } else { 4 },
                if v6 { 6 } else { 4 },
            ));
        }
    }
    let node_ports = matches!(f.type_, ServiceType::NodePort | ServiceType::LoadBalancer);
    // The external policy only concerns traffic from outside: node ports, external
    // and load balancer IPs. A ClusterIP Service without them has none.
    let external = node_ports || !f.external_ips.is_empty();
    let external_snat = f
        .external_snat
        .or(config.external_snat)
        .unwrap_or(opts.external_snat);
    let mut local_ips = BTreeSet::new();
    let mut any_frontend = false;
    for p in &f.ports {
        let port_name = if p.name.is_empty() {
            p.port.to_string()
        } else {
            p.name.clone()
        };
        if p.protocol == Protocol::Sctp {
            out.warnings.push(format!(
                "Service {key}: spec.ports[{}] ({port_name}): SCTP is not supported yet; port skipped",
                p.index
            ));
            continue;
        }
        let backends = backends(slices, p, f.publish_not_ready);
        local_ips.extend(
            backends
                .iter()
                .filter(|b| b.ready && b.node.as_deref() == Some(node))
                .map(|b| b.addr),
        );
        let kept = |ips: &[IpAddr]| -> Vec<IpAddr> {
            ips.iter()
                .filter(|ip| !left_out.is_some_and(|l| l.contains(&(p.protocol, **ip, p.port))))
                .copied()
                .collect()
        };
        let spec = ServiceSpec {
            name: format!("{key}:{port_name}"),
            proto: p.protocol.tables_name().to_string(),
            port: p.port,
            cluster_ips: f.cluster_ips.clone(),
            node_port: p.node_port.filter(|_| node_ports),
            external_ips: kept(&f.external_ips),
            load_balancer_ips: kept(&f.load_balancer_ips),
            source_ranges: source_ranges.clone(),
            external_policy: if external {
                f.external_policy
            } else {
                TrafficPolicy::Cluster
            },
            internal_policy: f.internal_policy,
            affinity_timeout_s: f.affinity_timeout_s,
            external_snat,
            backends,
        };
        any_frontend |= !spec.cluster_ips.is_empty()
            || spec.node_port.is_some()
            || !spec.external_ips.is_empty()
            || !spec.load_balancer_ips.is_empty();
        out.specs.push(spec);
    }
    if !f.ports.is_empty() && !any_frontend {
        out.warnings.push(format!(
            "Service {key}: no cluster IP, node port, external or load balancer IP: nothing reaches it"
        ));
    }
    if f.type_ == ServiceType::LoadBalancer
        && f.external_policy == TrafficPolicy::Local
        && let Some(port) = f.health_check_node_port
    {
        out.health_checks.push(HealthCheck {
            service: key.to_string(),
            port,
            local_endpoints: local_ips.len(),
        });
    }
    Ok(())
}

/// This node's address of each family (IPv4, IPv6) as kube-proxy's node IP: its first
/// InternalIP of the family, else its first ExternalIP.
fn node_ips(cluster: &Cluster, node: &str) -> [Option<IpAddr>; 2] {
    let Some(Ok(f)) = cluster.node(node).map(NodeFields::parse) else {
        return [None, None];
    };
    let first = |v6: bool| {
        f.internal_ips
            .iter()
            .chain(&f.external_ips)
            .find(|a| a.is_ipv6() == v6)
            .copied()
    };
    [first(false), first(true)]
}

/// The source ranges of a Service's load balancer IPs, as kube-proxy makes its
/// firewall: the ranges, and when a range of a family holds this node's address of it,
/// the load balancer IPs of that family too (a VIP the node holds, reached from the
/// node, arrives with the VIP as its source).
fn source_ranges(ranges: &[IpNet], lb_ips: &[IpAddr], node_ips: [Option<IpAddr>; 2]) -> Vec<IpNet> {
    let mut out = ranges.to_vec();
    for node_ip in node_ips.into_iter().flatten() {
        if ranges.iter().any(|r| r.contains(&node_ip)) {
            out.extend(
                lb_ips
                    .iter()
                    .filter(|a| a.is_ipv6() == node_ip.is_ipv6())
                    .map(|a| IpNet::from(*a)),
            );
        }
    }
    out
}

/// The endpoints of Service port `p`: from each IPv4/IPv6 slice, the slice port of the
/// same name (both unnamed counts as the same) and protocol, one backend per endpoint
/// address. An address:port in two slices (while the controller moves endpoints between
/// them) is kept once, from the slice that sorts first. Sorted by address and port.
fn backends(
    slices: &[SliceFields],
    p: &ServicePortFields,
    publish_not_ready: bool,
) -> Vec<BackendSpec> {
    let mut seen: HashSet<(IpAddr, u16)> = HashSet::new();
    let mut out = Vec::new();
    for s in slices {
        if s.v6.is_none() {
            continue;
        }
        let Some(port) = s
            .ports
            .iter()
            .find(|sp| sp.name == p.name && sp.protocol == p.protocol)
            .and_then(|sp| sp.port)
        else {
            continue;
        };
        for ep in &s.endpoints {
            for a in &ep.addresses {
                if !seen.insert((*a, port)) {
                    continue;
                }
                // The Service asks for its endpoints to be used whatever their
                // readiness (e.g. peers of a StatefulSet finding each other).
                let ready = ep.ready || publish_not_ready;
                out.push(BackendSpec {
                    addr: *a,
                    port,
                    node: ep.node.clone(),
                    // kube-proxy takes an endpoint without nodeName as on no node, not
                    // as on this one (which a tables file's absent `node` means).
                    no_node: ep.node.is_none(),
                    ready,
                    // The tables' absent means "as ready": say it only when it differs.
                    serving: Some(ep.serving).filter(|s| *s != ready),
                    terminating: ep.terminating,
                    hints: HintsSpec {
                        zones: ep.hint_zones.clone(),
                        nodes: ep.hint_nodes.clone(),
                    },
                });
            }
        }
    }
    out.sort_by_key(|b| (b.addr, b.port));
    out
}
