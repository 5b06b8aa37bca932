//! The fields of Kubernetes objects that ferry reads, parsed and checked in one place.
//!
//! Each `*Fields::parse` turns an API object into typed values (addresses, ports,
//! policies) or says which fields are wrong, with the field path the API uses
//! (`spec.ports[1].nodePort`). The datastores call them to refuse a bad object, so that
//! compilation and the datastores agree on what is valid. A Service's fields are parsed
//! once, by its datastore's checks, and kept with it in the cluster
//! ([`crate::Cluster::service_fields`]) for its claims and its tables; compilation reads
//! the other kinds' fields again.
//!
//! A few values the API server takes but ferry cannot use are skipped rather than
//! refused, so that one of them does not keep a whole object (and its older version in
//! force) out: an EndpointSlice port outside 1-65535 (kube-proxy skips it too), a Node
//! address that is not an IP address, a bad `ferry.io/external-snat` annotation (the
//! default applies). Each is named in the object's `warnings`, which compilation
//! reports.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use ferry_datapath::TrafficPolicy;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The Service label that hands the Service to the proxy it names: kube-proxy leaves
/// every Service that has it alone.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// The EndpointSlice label of a headless Service's slices, which kube-proxy does not
/// read.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

/// Node annotation: this node's IPv4 address with its prefix length, `ADDR/LEN` (as
/// Calico's `projectcalico.org/IPv4Address`), for the on-link subnet of the uplink.
pub const ANNOTATION_IPV4_ADDRESS: &str = "ferry.io/ipv4-address";
/// Node annotation: the IPv6 counterpart of [`ANNOTATION_IPV4_ADDRESS`].
pub const ANNOTATION_IPV6_ADDRESS: &str = "ferry.io/ipv6-address";
/// Node annotation: the node's IPv4 default gateway.
pub const ANNOTATION_IPV4_GATEWAY: &str = "ferry.io/ipv4-gateway";
/// Node annotation: the node's IPv6 default gateway.
pub const ANNOTATION_IPV6_GATEWAY: &str = "ferry.io/ipv6-gateway";
/// Service annotation: `"true"` or `"false"`, whether external traffic sent to another
/// node's endpoint takes this node's address as source.
pub const ANNOTATION_EXTERNAL_SNAT: &str = "ferry.io/external-snat";

/// A field that is wrong: its path in the object and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// The field's path, as the API writes it: `spec.ports[1].port`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl FieldError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> FieldError {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Joins an object's field errors into one line per error, each prefixed with `what`.
pub fn describe(what: &dyn fmt::Display, errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|e| format!("{what}: {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Collects field errors while values are parsed, so that one pass reports them all.
#[derive(Default)]
pub(crate) struct Errors(Vec<FieldError>);

impl Errors {
    pub(crate) fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError::new(field, message));
    }

    /// The value, or `None` with its error recorded.
    pub(crate) fn take<T>(&mut self, r: Result<T, FieldError>) -> Option<T> {
        r.map_err(|e| self.0.push(e)).ok()
    }

    /// How many errors so far: a part parsed without adding any is good.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The errors.
    pub(crate) fn into_vec(self) -> Vec<FieldError> {
        self.0
    }

    pub(crate) fn finish<T>(self, value: T) -> Result<T, Vec<FieldError>> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(self.0)
        }
    }
}

/// Parses an IP address.
pub fn parse_ip(s: &str, field: impl Into<String>) -> Result<IpAddr, FieldError> {
    s.parse()
        .map_err(|_| FieldError::new(field, format!("{s:?} is not an IP address")))
}

/// Parses a prefix (`10.244.1.0/24`).
pub fn parse_cidr(s: &str, field: impl Into<String>) -> Result<IpNet, FieldError> {
    s.parse()
        .map_err(|_| FieldError::new(field, format!("{s:?} is not a CIDR (ADDR/LEN)")))
}

/// Checks a port number (the API's int32) is 1-65535.
pub fn parse_port(n: i32, field: impl Into<String>) -> Result<u16, FieldError> {
    match u16::try_from(n) {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(FieldError::new(field, format!("{n} is outside 1-65535"))),
    }
}

fn parse_policy(s: Option<&str>, field: &str) -> Result<TrafficPolicy, FieldError> {
    match s {
        None | Some("Cluster") => Ok(TrafficPolicy::Cluster),
        Some("Local") => Ok(TrafficPolicy::Local),
        Some(o) => Err(FieldError::new(
            field,
            format!("{o:?}: expected Cluster or Local"),
        )),
    }
}

fn parse_bool(s: &str, field: impl Into<String>) -> Result<bool, FieldError> {
    match s {
        "true" => Ok(true),
        "false" => Ok(false),
        o => Err(FieldError::new(
            field,
            format!("{o:?}: expected \"true\" or \"false\""),
        )),
    }
}

/// `e` as a warning: what is done instead of refusing the object.
fn skipped(e: FieldError, instead: &str) -> FieldError {
    FieldError::new(e.field, format!("{}; {instead}", e.message))
}

fn annotation_field(key: &str) -> String {
    format!("metadata.annotations[{key}]")
}

/// An L4 protocol of a Service port, an EndpointSlice port, a container port or a
/// policy's port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP (the API's default).
    Tcp,
    /// UDP.
    Udp,
    /// SCTP: accepted in manifests, not carried by ferry yet.
    Sctp,
}

impl Protocol {
    /// The API's name: `TCP`, `UDP`, `SCTP`.
    pub fn api_name(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// The tables' name: `tcp`, `udp`, `sctp`.
    pub fn tables_name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// The protocol the API names (`None`: TCP, the default).
    pub(crate) fn parse(s: Option<&str>, field: impl Into<String>) -> Result<Protocol, FieldError> {
        match s {
            None | Some("TCP") => Ok(Protocol::Tcp),
            Some("UDP") => Ok(Protocol::Udp),
            Some("SCTP") => Ok(Protocol::Sctp),
            Some(o) => Err(FieldError::new(
                field,
                format!("{o:?}: expected TCP, UDP or SCTP"),
            )),
        }
    }
}

/// What ferry reads of a Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFields {
    /// status.addresses of type InternalIP, in order.
    pub internal_ips: Vec<IpAddr>,
    /// status.addresses of type ExternalIP, in order.
    pub external_ips: Vec<IpAddr>,
    /// spec.podCIDRs, or spec.podCIDR when that is all there is.
    pub pod_cidrs: Vec<IpNet>,
    /// The `ferry.io/ipv4-address` annotation.
    pub ipv4_address: Option<IpNet>,
    /// The `ferry.io/ipv6-address` annotation.
    pub ipv6_address: Option<IpNet>,
    /// The `ferry.io/ipv4-gateway` annotation.
    pub ipv4_gateway: Option<IpAddr>,
    /// The `ferry.io/ipv6-gateway` annotation.
    pub ipv6_gateway: Option<IpAddr>,
    /// What was skipped: InternalIP and ExternalIP addresses that are not IP addresses.
    pub warnings: Vec<FieldError>,
}

impl NodeFields {
    /// Reads and checks a Node.
    pub fn parse(node: &Node) -> Result<NodeFields, Vec<FieldError>> {
        let mut e = Errors::default();
        let mut f = NodeFields::default();
        let addresses = node.status.as_ref().and_then(|s| s.addresses.as_deref());
        for (i, a) in addresses.unwrap_or_default().iter().enumerate() {
            let list = match a.type_.as_str() {
                "InternalIP" => &mut f.internal_ips,
                "ExternalIP" => &mut f.external_ips,
                // Hostname and DNS names are names, not addresses.
                _ => continue,
            };
            // The API server takes any string here; one bad address must not keep the
            // Node (this node, or a peer) out.
            match parse_ip(&a.address, format!("status.addresses[{i}].address")) {
                Ok(ip) => list.push(ip),
                Err(w) => f.warnings.push(skipped(w, "skipped")),
            }
        }
        let spec = node.spec.as_ref();
        match spec.and_then(|s| s.pod_cidrs.as_deref()) {
            Some(cidrs) if !cidrs.is_empty() => {
                for (i, c) in cidrs.iter().enumerate() {
                    f.pod_cidrs
                        .extend(e.take(parse_cidr(c, format!("spec.podCIDRs[{i}]"))));
                }
            }
            _ => {
                if let Some(c) = spec.and_then(|s| s.pod_cidr.as_deref()) {
                    f.pod_cidrs.extend(e.take(parse_cidr(c, "spec.podCIDR")));
                }
            }
        }
        let ann = node.metadata.annotations.as_ref();
        let get = |k: &str| ann.and_then(|a| a.get(k)).map(String::as_str);
        for (key, v6, slot) in [
            (ANNOTATION_IPV4_ADDRESS, false, &mut f.ipv4_address),
            (ANNOTATION_IPV6_ADDRESS, true, &mut f.ipv6_address),
        ] {
            if let Some(s) = get(key) {
                let field = annotation_field(key);
                *slot = e
                    .take(parse_cidr(s, &field))
                    .and_then(|n| check_family(&mut e, n.addr(), v6, &field).then_some(n));
            }
        }
        for (key, v6, slot) in [
            (ANNOTATION_IPV4_GATEWAY, false, &mut f.ipv4_gateway),
            (ANNOTATION_IPV6_GATEWAY, true, &mut f.ipv6_gateway),
        ] {
            if let Some(s) = get(key) {
                let field = annotation_field(key);
                *slot = e
                    .take(parse_ip(s, &field))
                    .filter(|a| check_family(&mut e, *a, v6, &field));
            }
        }
        e.finish(f)
    }
}

fn family_name(v6: bool) -> &'static str {
    if v6 { "IPv6" } else { "IPv4" }
}

/// True when `a` is of the family; records an error otherwise.
fn check_family(e: &mut Errors, a: IpAddr, v6: bool, field: &str) -> bool {
    if a.is_ipv6() == v6 {
        return true;
    }
    e.push(field, format!("{a} is not an {} address", family_name(v6)));
    false
}

/// What ferry reads of a Pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFields {
    /// spec.nodeName.
    pub node: Option<String>,
    /// spec.hostNetwork: the pod uses its node's network, no port of its own.
    pub host_network: bool,
    /// status.phase is Succeeded or Failed: its containers are gone for good.
    pub finished: bool,
    /// status.podIPs (or status.podIP), in order.
    pub ips: Vec<IpAddr>,
    /// The named container ports (of spec.containers, and of the init containers that
    /// run alongside them: `restartPolicy: Always`), name -> protocol and number: what a
    /// policy's named port means on this pod.
    pub named_ports: BTreeMap<String, (Protocol, u16)>,
}

impl PodFields {
    /// Reads and checks a Pod.
    pub fn parse(pod: &Pod) -> Result<PodFields, Vec<FieldError>> {
        let mut e = Errors::default();
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        let mut f = PodFields {
            node: spec
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty()),
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            finished: matches!(
                status.and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            ),
            ips: Vec::new(),
            named_ports: BTreeMap::new(),
        };
        if let Some(spec) = spec {
            named_ports(spec, &mut e, &mut f.named_ports);
        }
        match status.and_then(|s| s.pod_ips.as_deref()) {
            Some(ips) if !ips.is_empty() => {
                for (i, ip) in ips.iter().enumerate() {
                    f.ips
                        .extend(e.take(parse_ip(&ip.ip, format!("status.podIPs[{i}].ip"))));
                }
            }
            _ => {
                if let Some(ip) = status.and_then(|s| s.pod_ip.as_deref()) {
                    f.ips.extend(e.take(parse_ip(ip, "status.podIP")));
                }
            }
        }
        e.finish(f)
    }
}

/// The container ports of `spec` into `named`: each port's number and protocol must be
/// valid, and a name an IANA service name, used once in its container (as the API
/// server checks them). Sidecars (init containers with `restartPolicy: Always`) serve
/// too.
fn named_ports(spec: &PodSpec, e: &mut Errors, named: &mut BTreeMap<String, (Protocol, u16)>) {
    let sidecars = spec.init_containers.iter().flatten().enumerate();
    let sidecars = sidecars
        .filter(|(_, c)| c.restart_policy.as_deref() == Some("Always"))
        .map(|(i, c)| (format!("spec.initContainers[{i}]"), c));
    let containers = (spec.containers.iter().enumerate())
        .map(|(i, c)| (format!("spec.containers[{i}]"), c))
        .chain(sidecars);
    for (base, c) in containers {
        // The API server checks names per container; two containers may share one.
        let mut names = std::collections::BTreeSet::new();
        for (j, p) in c.ports.iter().flatten().enumerate() {
            let field = format!("{base}.ports[{j}]");
            let protocol = e.take(Protocol::parse(
                p.protocol.as_deref(),
                format!("{field}.protocol"),
            ));
            let number = e.take(parse_port(
                p.container_port,
                format!("{field}.containerPort"),
            ));
            let Some(name) = p.name.as_deref() else {
                continue;
            };
            let Some(name) = e.take(crate::policy::fields::port_name(
                name,
                format!("{field}.name"),
            )) else {
                continue;
            };
            if !names.insert(name.clone()) {
                e.push(
                    format!("{field}.name"),
                    format!("duplicate port name {name:?} in the container"),
                );
                continue;
            }
            if let (Some(protocol), Some(number)) = (protocol, number) {
                // As Kubernetes resolves a name (FindPort): the first container's.
                named.entry(name).or_insert((protocol, number));
            }
        }
    }
}

/// A Service's type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ServiceType {
    /// ClusterIP (the default).
    #[default]
    ClusterIp,
    /// NodePort.
    NodePort,
    /// LoadBalancer.
    LoadBalancer,
    /// ExternalName: a DNS alias, nothing for a dataplane.
    ExternalName,
}

/// One port of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePortFields {
    /// Its index in spec.ports.
    pub index: usize,
    /// Its name; empty when unnamed.
    pub name: String,
    /// Its protocol.
    pub protocol: Protocol,
    /// The Service port.
    pub port: u16,
    /// The node port, when one is set.
    pub node_port: Option<u16>,
}

/// Longest session affinity timeout the API accepts (one day).
pub const MAX_AFFINITY_TIMEOUT_S: u32 = 86_400;
/// The API's default session affinity timeout (three hours).
pub const DEFAULT_AFFINITY_TIMEOUT_S: u32 = 10_800;

/// What ferry reads of a Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceFields {
    /// spec.type.
    pub type_: ServiceType,
    /// spec.clusterIP is `None`: a headless Service, only DNS.
    pub headless: bool,
    /// spec.clusterIPs (or spec.clusterIP).
    pub cluster_ips: Vec<IpAddr>,
    /// spec.externalIPs.
    pub external_ips: Vec<IpAddr>,
    /// status.loadBalancer.ingress[].ip, for type LoadBalancer, except ingress points
    /// with `ipMode: Proxy` (the load balancer proxies and sends to the node, so the IP
    /// is not to be answered on the node: kube-proxy leaves those out too).
    pub load_balancer_ips: Vec<IpAddr>,
    /// spec.ports.
    pub ports: Vec<ServicePortFields>,
    /// spec.externalTrafficPolicy.
    pub external_policy: TrafficPolicy,
    /// spec.internalTrafficPolicy.
    pub internal_policy: TrafficPolicy,
    /// spec.sessionAffinity ClientIP: its timeout.
    pub affinity_timeout_s: Option<u32>,
    /// spec.healthCheckNodePort.
    pub health_check_node_port: Option<u16>,
    /// spec.publishNotReadyAddresses.
    pub publish_not_ready: bool,
    /// The `ferry.io/external-snat` annotation.
    pub external_snat: Option<bool>,
    /// spec.loadBalancerSourceRanges, their host bits cleared.
    pub source_ranges: Vec<IpNet>,
    /// What was skipped: a bad `ferry.io/external-snat` annotation.
    pub warnings: Vec<FieldError>,
}

impl ServiceFields {
    /// Reads and checks a Service.
    pub fn parse(svc: &Service) -> Result<ServiceFields, Vec<FieldError>> {
        let mut e = Errors::default();
        let mut f = ServiceFields::default();
        let Some(spec) = svc.spec.as_ref() else {
            return e.finish(f);
        };
        f.type_ = match spec.type_.as_deref() {
            None | Some("ClusterIP") => ServiceType::ClusterIp,
            Some("NodePort") => ServiceType::NodePort,
            Some("LoadBalancer") => ServiceType::LoadBalancer,
            Some("ExternalName") => ServiceType::ExternalName,
            Some(o) => {
                e.push(
                    "spec.type",
                    format!("{o:?}: expected ClusterIP, NodePort, LoadBalancer or ExternalName"),
                );
                ServiceType::ClusterIp
            }
        };
        cluster_ips(spec, &mut e, &mut f);
        source_ranges(spec, f.type_, &mut e, &mut f);
        for (i, s) in spec.external_ips.iter().flatten().enumerate() {
            f.external_ips
                .extend(e.take(parse_ip(s, format!("spec.externalIPs[{i}]"))));
        }
        ports(spec, &mut e, &mut f);
        f.external_policy = e
            .take(parse_policy(
                spec.external_traffic_policy.as_deref(),
                "spec.externalTrafficPolicy",
            ))
            .unwrap_or_default();
        f.internal_policy = e
            .take(parse_policy(
                spec.internal_traffic_policy.as_deref(),
                "spec.internalTrafficPolicy",
            ))
            .unwrap_or_default();
        f.affinity_timeout_s = affinity(spec, &mut e);
        if let Some(n) = spec.health_check_node_port {
            f.health_check_node_port = e.take(parse_port(n, "spec.healthCheckNodePort"));
            if f.type_ != ServiceType::LoadBalancer || f.external_policy != TrafficPolicy::Local {
                e.push(
                    "spec.healthCheckNodePort",
                    "only for type LoadBalancer with externalTrafficPolicy Local",
                );
            }
        }
        f.publish_not_ready = spec.publish_not_ready_addresses.unwrap_or(false);
        load_balancer_ips(svc, &mut e, &mut f);
        if let Some(s) = svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_EXTERNAL_SNAT))
        {
            // Not the Service's fault as the API sees it: the default applies.
            match parse_bool(s, annotation_field(ANNOTATION_EXTERNAL_SNAT)) {
                Ok(b) => f.external_snat = Some(b),
                Err(w) => f.warnings.push(skipped(w, "ignored, the default applies")),
            }
        }
        e.finish(f)
    }
}

/// spec.clusterIP and spec.clusterIPs of a Service into `f` (`None`: headless).
fn cluster_ips(spec: &ServiceSpec, e: &mut Errors, f: &mut ServiceFields) {
    let cluster_ip = spec.cluster_ip.as_deref().filter(|s| !s.is_empty());
    let cluster_ips = spec.cluster_ips.as_deref().unwrap_or_default();
    if let (Some(ip), Some(first)) = (cluster_ip, cluster_ips.first())
        && ip != first
    {
        e.push(
            "spec.clusterIPs[0]",
            format!("{first:?} differs from spec.clusterIP {ip:?}"),
        );
    }
    let (list, base): (Vec<&str>, &str) = if cluster_ips.is_empty() {
        (cluster_ip.into_iter().collect(), "spec.clusterIP")
    } else {
        (
            cluster_ips.iter().map(String::as_str).collect(),
            "spec.clusterIPs",
        )
    };
    for (i, s) in list.iter().enumerate() {
        let field = if cluster_ips.is_empty() {
            base.to_string()
        } else {
            format!("{base}[{i}]")
        };
        if *s == "None" {
            if i > 0 {
                e.push(field, "\"None\" is only valid as the only cluster IP");
            }
            f.headless = true;
        } else {
            f.cluster_ips.extend(e.take(parse_ip(s, field)));
        }
    }
}

/// spec.loadBalancerSourceRanges of a Service into `f`, as the API validates them:
/// only for type LoadBalancer, each a CIDR once the spaces around it are trimmed (a
/// leftover of the annotation they replaced); host bits are cleared, as kube-proxy
/// parses them.
fn source_ranges(spec: &ServiceSpec, type_: ServiceType, e: &mut Errors, f: &mut ServiceFields) {
    let ranges = spec
        .load_balancer_source_ranges
        .as_deref()
        .unwrap_or_default();
    if !ranges.is_empty() && type_ != ServiceType::LoadBalancer {
        e.push(
            "spec.loadBalancerSourceRanges",
            "only for type LoadBalancer",
        );
        return;
    }
    for (i, r) in ranges.iter().enumerate() {
        let field = format!("spec.loadBalancerSourceRanges[{i}]");
        f.source_ranges
            .extend(e.take(parse_cidr(r.trim(), field)).map(|n| n.trunc()));
    }
}

/// spec.ports of a Service into `f`, after its type.
fn ports(spec: &ServiceSpec, e: &mut Errors, f: &mut ServiceFields) {
    let ports = spec.ports.as_deref().unwrap_or_default();
    for (i, p) in ports.iter().enumerate() {
        let name = p.name.clone().unwrap_or_default();
        if ports.len() > 1 && name.is_empty() {
            e.push(
                format!("spec.ports[{i}].name"),
                "required when a Service has more than one port",
            );
        }
        if !name.is_empty() && ports[..i].iter().any(|q| q.name.as_ref() == Some(&name)) {
            e.push(
                format!("spec.ports[{i}].name"),
                format!("duplicate port name {name:?}"),
            );
        }
        let protocol = e.take(Protocol::parse(
            p.protocol.as_deref(),
            format!("spec.ports[{i}].protocol"),
        ));
        let port = e.take(parse_port(p.port, format!("spec.ports[{i}].port")));
        let node_port = match p.node_port {
            None => None,
            // As the API refuses it: a node port would be silently ignored.
            Some(_) if matches!(f.type_, ServiceType::ClusterIp | ServiceType::ExternalName) => {
                e.push(
                    format!("spec.ports[{i}].nodePort"),
                    "only for type NodePort or LoadBalancer",
                );
                None
            }
            Some(n) => e.take(parse_port(n, format!("spec.ports[{i}].nodePort"))),
        };
        let (Some(protocol), Some(port)) = (protocol, port) else {
            continue;
        };
        if f.ports
            .iter()
            .any(|q| q.port == port && q.protocol == protocol)
        {
            e.push(
                format!("spec.ports[{i}]"),
                format!("duplicate port {} {port}", protocol.api_name()),
            );
        }
        f.ports.push(ServicePortFields {
            index: i,
            name,
            protocol,
            port,
            node_port,
        });
    }
}

/// spec.sessionAffinity ClientIP: its timeout.
fn affinity(spec: &ServiceSpec, e: &mut Errors) -> Option<u32> {
    match spec.session_affinity.as_deref() {
        None | Some("None") => None,
        Some("ClientIP") => {
            let t = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            match t {
                None => Some(DEFAULT_AFFINITY_TIMEOUT_S),
                Some(t) => match u32::try_from(t) {
                    Ok(t) if (1..=MAX_AFFINITY_TIMEOUT_S).contains(&t) => Some(t),
                    _ => {
                        e.push(
                            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                            format!("{t} is outside 1-{MAX_AFFINITY_TIMEOUT_S}"),
                        );
                        None
                    }
                },
            }
        }
        Some(o) => {
            e.push(
                "spec.sessionAffinity",
                format!("{o:?}: expected None or ClientIP"),
            );
            None
        }
    }
}

/// status.loadBalancer.ingress[].ip of a Service into `f`, after its type.
fn load_balancer_ips(svc: &Service, e: &mut Errors, f: &mut ServiceFields) {
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_deref())
        .unwrap_or_default();
    for (i, ing) in ingress.iter().enumerate() {
        let Some(ip) = ing.ip.as_deref() else {
            continue;
        };
        let ip = e.take(parse_ip(ip, format!("status.loadBalancer.ingress[{i}].ip")));
        if f.type_ == ServiceType::LoadBalancer && ing.ip_mode.as_deref() != Some("Proxy") {
            f.load_balancer_ips.extend(ip);
        }
    }
}

/// One port of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicePortFields {
    /// Its name; empty when unnamed.
    pub name: String,
    /// Its protocol.
    pub protocol: Protocol,
    /// Its number; `None` (unset, or outside 1-65535) means the port is not usable
    /// (kube-proxy skips it too).
    pub port: Option<u16>,
}

/// One endpoint of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointFields {
    /// Its addresses.
    pub addresses: Vec<IpAddr>,
    /// nodeName.
    pub node: Option<String>,
    /// conditions.ready; absent means ready (an unknown state is taken as ready, as
    /// the API documents).
    pub ready: bool,
    /// conditions.serving; absent means true, whatever `ready` says, as kube-proxy
    /// reads it (the EndpointSlice controller always sets it; other writers may not).
    pub serving: bool,
    /// conditions.terminating; absent means false.
    pub terminating: bool,
    /// hints.forZones[].name.
    pub hint_zones: Vec<String>,
    /// hints.forNodes[].name.
    pub hint_nodes: Vec<String>,
}

/// What ferry reads of an EndpointSlice.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SliceFields {
    /// The `kubernetes.io/service-name` label: the Service it belongs to.
    pub service: Option<String>,
    /// addressType is IPv6 (false: IPv4). `None` for FQDN slices, which hold names.
    pub v6: Option<bool>,
    /// Its ports.
    pub ports: Vec<SlicePortFields>,
    /// Its endpoints (empty for FQDN slices).
    pub endpoints: Vec<EndpointFields>,
    /// What was skipped: ports outside 1-65535.
    pub warnings: Vec<FieldError>,
}

impl SliceFields {
    /// Reads and checks an EndpointSlice.
    pub fn parse(slice: &EndpointSlice) -> Result<SliceFields, Vec<FieldError>> {
        let mut e = Errors::default();
        let mut f = SliceFields {
            service: slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
                .cloned(),
            ..SliceFields::default()
        };
        f.v6 = match slice.address_type.as_str() {
            "IPv4" => Some(false),
            "IPv6" => Some(true),
            "FQDN" => None,
            o => {
                e.push("addressType", format!("{o:?}: expected IPv4, IPv6 or FQDN"));
                None
            }
        };
        for (i, p) in slice.ports.iter().flatten().enumerate() {
            let protocol = e.take(Protocol::parse(
                p.protocol.as_deref(),
                format!("ports[{i}].protocol"),
            ));
            // kube-proxy skips such a port and keeps the rest of the slice.
            let port = match p.port.map(|n| parse_port(n, format!("ports[{i}].port"))) {
                None => None,
                Some(Ok(n)) => Some(n),
                Some(Err(w)) => {
                    f.warnings.push(skipped(w, "the port is left out"));
                    None
                }
            };
            if let Some(protocol) = protocol {
                f.ports.push(SlicePortFields {
                    name: p.name.clone().unwrap_or_default(),
                    protocol,
                    port,
                });
            }
        }
        let Some(v6) = f.v6 else {
            return e.finish(f);
        };
        for (i, ep) in slice.endpoints.iter().flatten().enumerate() {
            let mut addresses = Vec::with_capacity(ep.addresses.len());
            for (j, a) in ep.addresses.iter().enumerate() {
                let field = format!("endpoints[{i}].addresses[{j}]");
                if let Some(ip) = e.take(parse_ip(a, &field)) {
                    if ip.is_ipv6() != v6 {
                        e.push(
                            field,
                            format!("{ip} is not an {} address (addressType)", family_name(v6)),
                        );
                    } else {
                        addresses.push(ip);
                    }
                }
            }
            let c = ep.conditions.as_ref();
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            f.endpoints.push(EndpointFields {
                addresses,
                node: ep.node_name.clone().filter(|n| !n.is_empty()),
                ready,
                serving: c.and_then(|c| c.serving).unwrap_or(true),
                terminating: c.and_then(|c| c.terminating).unwrap_or(false),
                hint_zones: ep
                    .hints
                    .iter()
                    .flat_map(|h| h.for_zones.iter().flatten())
                    .map(|z| z.name.clone())
                    .collect(),
                hint_nodes: ep
                    .hints
                    .iter()
                    .flat_map(|h| h.for_nodes.iter().flatten())
                    .map(|n| n.name.clone())
                    .collect(),
            });
        }
        e.finish(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(yaml: &str) -> Service {
        serde_saphyr::from_str(yaml).expect("test Service parses")
    }

    fn fields_of(errors: Vec<FieldError>) -> Vec<String> {
        errors.into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn service_errors_name_every_bad_field() {
        let svc = service(
            r#"
apiVersion: v1
kind: Service
metadata: {name: web, annotations: {ferry.io/external-snat: "true"}}
spec:
  type: NodePort
  clusterIP: 10.96.0.300
  externalIPs: [203.0.113.1, nope]
  ports:
  - {name: http, port: 80, nodePort: 70000}
  - {port: 0, protocol: ICMP}
  - {name: http, port: 81}
  externalTrafficPolicy: local
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 0}}
"#,
        );
        let errs = fields_of(ServiceFields::parse(&svc).unwrap_err());
        assert_eq!(
            errs,
            [
                "spec.clusterIP",
                "spec.externalIPs[1]",
                "spec.ports[0].nodePort",
                "spec.ports[1].name",
                "spec.ports[1].protocol",
                "spec.ports[1].port",
                "spec.ports[2].name",
                "spec.externalTrafficPolicy",
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            ]
        );
    }

    #[test]
    fn values_the_api_server_takes_are_skipped_with_a_warning_not_refused() {
        let svc = service(
            "apiVersion: v1\nkind: Service\nmetadata: {name: web, annotations: {ferry.io/external-snat: \"yes\"}}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n",
        );
        let f = ServiceFields::parse(&svc).unwrap();
        assert_eq!(f.external_snat, None);
        assert_eq!(
            fields_of(f.warnings),
            ["metadata.annotations[ferry.io/external-snat]"]
        );

        let slice: EndpointSlice = serde_saphyr::from_str(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s}\naddressType: IPv4\nports: [{name: a, port: 0}, {name: b, port: 8080}, {name: c, port: 65536}]\n",
        )
        .unwrap();
        let f = SliceFields::parse(&slice).unwrap();
        let ports: Vec<_> = f.ports.iter().map(|p| (p.name.as_str(), p.port)).collect();
        assert_eq!(ports, [("a", None), ("b", Some(8080)), ("c", None)]);
        assert_eq!(fields_of(f.warnings), ["ports[0].port", "ports[2].port"]);

        let node: Node = serde_saphyr::from_str(
            "apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus:\n  addresses:\n  - {type: InternalIP, address: n.internal}\n  - {type: InternalIP, address: 192.168.1.10}\n  - {type: ExternalIP, address: \"\"}\n",
        )
        .unwrap();
        let f = NodeFields::parse(&node).unwrap();
        assert_eq!(f.internal_ips, ["192.168.1.10".parse::<IpAddr>().unwrap()]);
        assert!(f.external_ips.is_empty());
        assert_eq!(
            fields_of(f.warnings),
            ["status.addresses[0].address", "status.addresses[2].address"]
        );
    }

    #[test]
    fn duplicate_service_port_and_protocol_is_refused_but_tcp_and_udp_may_share() {
        let svc = service(
            r#"
apiVersion: v1
kind: Service
metadata: {name: dns}
spec:
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
  - {name: again, port: 53, protocol: UDP}
"#,
        );
        let errs = ServiceFields::parse(&svc).unwrap_err();
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec.ports[2]");
        assert!(errs[0].message.contains("duplicate port UDP 53"));
    }

    #[test]
    fn node_ports_and_health_check_ports_only_where_the_type_has_them() {
        let svc = service(
            "apiVersion: v1\nkind: Service\nmetadata: {name: c}\nspec: {clusterIP: 10.96.0.9, healthCheckNodePort: 32000, ports: [{port: 80, nodePort: 30080}]}\n",
        );
        let errs = fields_of(ServiceFields::parse(&svc).unwrap_err());
        assert_eq!(errs, ["spec.ports[0].nodePort", "spec.healthCheckNodePort"]);
    }

    #[test]
    fn headless_service_has_no_cluster_ips() {
        let svc = service(
            "apiVersion: v1\nkind: Service\nmetadata: {name: h}\nspec: {clusterIP: None, clusterIPs: [None], ports: [{port: 80}]}\n",
        );
        let f = ServiceFields::parse(&svc).unwrap();
        assert!(f.headless);
        assert!(f.cluster_ips.is_empty());
    }

    #[test]
    fn load_balancer_ips_skip_proxy_mode_and_other_types() {
        let lb = r#"
apiVersion: v1
kind: Service
metadata: {name: lb}
spec: {type: TYPE, ports: [{port: 80}]}
status:
  loadBalancer:
    ingress:
    - {ip: 203.0.113.10}
    - {ip: 203.0.113.11, ipMode: Proxy}
    - {hostname: lb.example.com}
    - {ip: "2001:db8::10", ipMode: VIP}
"#;
        let f = ServiceFields::parse(&service(&lb.replace("TYPE", "LoadBalancer"))).unwrap();
        assert_eq!(
            f.load_balancer_ips,
            [
                "203.0.113.10".parse::<IpAddr>().unwrap(),
                "2001:db8::10".parse().unwrap()
            ]
        );
        let f = ServiceFields::parse(&service(&lb.replace("TYPE", "ClusterIP"))).unwrap();
        assert!(f.load_balancer_ips.is_empty());
    }

    #[test]
    fn source_ranges_are_trimmed_and_truncated_and_refused_when_bad_or_not_for_a_load_balancer() {
        let svc = |ty: &str, ranges: &str| {
            service(&format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: lb}}\nspec: {{type: {ty}, ports: [{{port: 80}}], loadBalancerSourceRanges: {ranges}}}\n"
            ))
        };
        let f = ServiceFields::parse(&svc(
            "LoadBalancer",
            r#"[" 203.0.113.9/24 ", "2001:db8::1/64"]"#,
        ))
        .unwrap();
        assert_eq!(
            f.source_ranges,
            [
                "203.0.113.0/24".parse::<IpNet>().unwrap(),
                "2001:db8::/64".parse().unwrap()
            ]
        );
        let e = ServiceFields::parse(&svc("LoadBalancer", r#"["10.0.0.0/8", "10.1.2.3"]"#))
            .unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].field, "spec.loadBalancerSourceRanges[1]");
        assert!(e[0].message.contains("\"10.1.2.3\" is not a CIDR"), "{e:?}");
        let e = ServiceFields::parse(&svc("NodePort", r#"["10.0.0.0/8"]"#)).unwrap_err();
        assert_eq!(e[0].field, "spec.loadBalancerSourceRanges");
        assert!(e[0].message.contains("only for type LoadBalancer"), "{e:?}");
    }

    #[test]
    fn node_annotations_must_be_of_their_family() {
        let node: Node = serde_saphyr::from_str(
            r#"
apiVersion: v1
kind: Node
metadata:
  name: n
  annotations:
    ferry.io/ipv4-address: "fd00::1/64"
    ferry.io/ipv6-gateway: "192.168.1.1"
    ferry.io/ipv4-gateway: "192.168.1.1"
spec: {podCIDR: 10.244.0.0/24, podCIDRs: [10.244.0.0/24, "fd00:10:244::/64"]}
status:
  addresses:
  - {type: Hostname, address: n}
  - {type: InternalIP, address: 192.168.1.10}
  - {type: ExternalIP, address: 203.0.113.5}
"#,
        )
        .unwrap();
        let errs = fields_of(NodeFields::parse(&node).unwrap_err());
        assert_eq!(
            errs,
            [
                "metadata.annotations[ferry.io/ipv4-address]",
                "metadata.annotations[ferry.io/ipv6-gateway]"
            ]
        );
    }

    #[test]
    fn slice_addresses_must_match_address_type() {
        let slice: EndpointSlice = serde_saphyr::from_str(
            r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
endpoints:
- addresses: ["fd00::1"]
- addresses: [10.0.0.1]
  conditions: {ready: false}
ports: [{port: 8080}]
"#,
        )
        .unwrap();
        let errs = fields_of(SliceFields::parse(&slice).unwrap_err());
        assert_eq!(errs, ["endpoints[1].addresses[0]"]);
    }

    #[test]
    fn endpoint_conditions_default_ready_serving_and_not_terminating() {
        let slice: EndpointSlice = serde_saphyr::from_str(
            r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s}
addressType: IPv4
endpoints:
- addresses: [10.0.0.1]
- addresses: [10.0.0.2]
  conditions: {ready: false, serving: true, terminating: true}
- addresses: [10.0.0.3]
  conditions: {ready: false}
"#,
        )
        .unwrap();
        let f = SliceFields::parse(&slice).unwrap();
        let conditions: Vec<_> = (f.endpoints.iter())
            .map(|e| (e.ready, e.serving, e.terminating))
            .collect();
        assert_eq!(
            conditions,
            [
                (true, true, false),
                (false, true, true),
                (false, true, false)
            ]
        );
    }
}
