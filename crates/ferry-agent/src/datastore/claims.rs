//! What an object claims that no other object may: a Service's cluster IPs, its
//! frontends (each cluster, external and load balancer IP on each of its ports) and its
//! node ports; a Node's InternalIPs.
//!
//! Two objects claiming one of these make tables the datapath refuses (one frontend
//! or node port serves one Service; one underlay address is one peer), and the API
//! server lets most such pairs through: it allocates cluster IPs and node ports, but
//! takes any external IP, any load balancer status and any Node address. So both
//! datastores check every Service and Node against the claims of the others before it
//! enters the cluster: the file datastore refuses the directory, naming both objects;
//! the Kubernetes datastore refuses the object that came second and keeps what is in
//! force. [`Claims`] is the index of who holds what, kept up to date object by object,
//! so that checking one object costs the same however many there are.
//!
//! One object naming an address twice (an external IP that is also its own load
//! balancer IP) is not a clash: it is one Service.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::{Node, Service};

use crate::cluster::{Kind, Object, ObjectKey};
use crate::fields::{Protocol, ServiceFields, ServiceType};

/// One thing an object claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Claim {
    /// A Service's cluster IP: the API server gives each to one Service.
    ClusterIp(IpAddr),
    /// An address and port a Service answers on, by protocol.
    Frontend(Protocol, IpAddr, u16),
    /// A node port, by protocol.
    NodePort(Protocol, u16),
    /// A Node's InternalIP: the underlay address of one overlay peer.
    NodeAddress(IpAddr),
}

/// A claim and the field of the object that makes it (`spec.externalIPs[0]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Claimed {
    claim: Claim,
    field: String,
}

/// An object, by kind and key.
pub(crate) type Owner = (Kind, ObjectKey);

/// A claim of an object that another object holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Clash {
    /// The field of the object checked.
    pub field: String,
    /// The object that holds the claim.
    pub holder: Owner,
    /// What is claimed twice, naming the holder (and its field, where that helps).
    pub message: String,
}

/// The claims of `obj`: none for kinds that claim nothing, and none when its fields do
/// not parse (the field checks refuse it). Only what compilation turns into tables is
/// claimed: an ExternalName or headless Service and an SCTP port have no frontends.
pub(crate) fn of(obj: &Object) -> Vec<Claimed> {
    match obj {
        Object::Service(s) => of_service(s),
        Object::Node(n) => of_node(n),
        Object::Pod(_) | Object::EndpointSlice(_) | Object::ConfigMap(_) => Vec::new(),
    }
}

/// The claims of a Service (see [`of`]).
pub(crate) fn of_service(svc: &Service) -> Vec<Claimed> {
    let Ok(f) = ServiceFields::parse(svc) else {
        return Vec::new();
    };
    if f.type_ == ServiceType::ExternalName || f.headless {
        return Vec::new();
    }
    let ports: Vec<_> = f
        .ports
        .iter()
        .filter(|p| p.protocol != Protocol::Sctp)
        .collect();
    let mut out = Vec::new();
    let frontends = |out: &mut Vec<Claimed>, ip: IpAddr, field: String| {
        for p in &ports {
            out.push(Claimed {
                claim: Claim::Frontend(p.protocol, ip, p.port),
                field: field.clone(),
            });
        }
    };
    for (i, ip) in f.cluster_ips.iter().enumerate() {
        let field = format!("spec.clusterIPs[{i}]");
        out.push(Claimed {
            claim: Claim::ClusterIp(*ip),
            field: field.clone(),
        });
        frontends(&mut out, *ip, field);
    }
    for (i, ip) in f.external_ips.iter().enumerate() {
        frontends(&mut out, *ip, format!("spec.externalIPs[{i}]"));
    }
    for ip in &f.load_balancer_ips {
        frontends(&mut out, *ip, ingress_field(svc, *ip));
    }
    if matches!(f.type_, ServiceType::NodePort | ServiceType::LoadBalancer) {
        for p in &ports {
            if let Some(np) = p.node_port {
                out.push(Claimed {
                    claim: Claim::NodePort(p.protocol, np),
                    field: format!("spec.ports[{}].nodePort", p.index),
                });
            }
        }
    }
    out
}

/// The field of the load balancer ingress point that gives `ip`.
fn ingress_field(svc: &Service, ip: IpAddr) -> String {
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_deref())
        .unwrap_or_default();
    match ingress
        .iter()
        .position(|i| i.ip.as_deref().and_then(|s| s.parse().ok()) == Some(ip))
    {
        Some(i) => format!("status.loadBalancer.ingress[{i}].ip"),
        None => "status.loadBalancer.ingress".into(),
    }
}

/// The claims of a Node (see [`of`]).
pub(crate) fn of_node(node: &Node) -> Vec<Claimed> {
    let addresses = node.status.as_ref().and_then(|s| s.addresses.as_deref());
    addresses
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter(|(_, a)| a.type_ == "InternalIP")
        .filter_map(|(i, a)| {
            Some(Claimed {
                claim: Claim::NodeAddress(a.address.parse().ok()?),
                field: format!("status.addresses[{i}].address"),
            })
        })
        .collect()
}

/// Who holds what: every claim of the objects in force, and each object's claims.
#[derive(Debug, Default)]
pub(crate) struct Claims {
    held: HashMap<Claim, (Owner, String)>,
    by_owner: HashMap<Owner, Vec<Claimed>>,
}

impl Claims {
    /// The claims of `owner` that another object holds: at most one per field (a
    /// cluster IP held by another Service is one clash, not one per port as well).
    pub(crate) fn clashes(&self, owner: &Owner, claims: &[Claimed]) -> Vec<Clash> {
        let mut out: Vec<Clash> = Vec::new();
        for c in claims {
            let Some((holder, their_field)) = self.held.get(&c.claim) else {
                continue;
            };
            if holder == owner || out.iter().any(|o| o.field == c.field) {
                continue;
            }
            out.push(Clash {
                field: c.field.clone(),
                holder: holder.clone(),
                message: describe(c.claim, holder, their_field),
            });
        }
        out
    }

    /// Puts `claims` in force as `owner`'s, in place of its earlier ones (which the
    /// caller checked with [`Claims::clashes`]). True when they differ from the earlier
    /// ones: what `owner` frees may let another object in.
    pub(crate) fn set(&mut self, owner: Owner, claims: Vec<Claimed>) -> bool {
        if self
            .by_owner
            .get(&owner)
            .map_or(claims.is_empty(), |old| *old == claims)
        {
            return false;
        }
        self.remove(&owner);
        for c in &claims {
            self.held.insert(c.claim, (owner.clone(), c.field.clone()));
        }
        if !claims.is_empty() {
            self.by_owner.insert(owner, claims);
        }
        true
    }

    /// Takes `owner`'s claims out; true when it had any.
    pub(crate) fn remove(&mut self, owner: &Owner) -> bool {
        let Some(old) = self.by_owner.remove(owner) else {
            return false;
        };
        for c in old {
            if self.held.get(&c.claim).is_some_and(|(h, _)| h == owner) {
                self.held.remove(&c.claim);
            }
        }
        true
    }
}

/// `10.96.0.10 is also the cluster IP of Service default/web`, and the like.
fn describe(claim: Claim, holder: &Owner, their_field: &str) -> String {
    let other = Named(holder);
    match claim {
        Claim::ClusterIp(ip) => format!("{ip} is also the cluster IP of {other}"),
        Claim::Frontend(proto, ip, port) => format!(
            "{} {} is also a frontend of {other} (its {their_field})",
            proto.api_name(),
            SocketAddr::new(ip, port)
        ),
        Claim::NodePort(proto, np) => {
            format!("{} {np} is also a node port of {other}", proto.api_name())
        }
        Claim::NodeAddress(ip) => format!("{ip} is also an InternalIP of {other}"),
    }
}

/// `Service default/web`.
struct Named<'a>(&'a Owner);

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.0.0, self.0.1)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, NodeAddress, NodeStatus, ServicePort, ServiceSpec,
        ServiceStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn service(name: &str, type_: &str, cluster_ip: &str, ports: &[(i32, Option<i32>)]) -> Object {
        Object::Service(Service {
            metadata: ObjectMeta {
                namespace: Some("default".into()),
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                cluster_ip: Some(cluster_ip.into()),
                ports: Some(
                    ports
                        .iter()
                        .enumerate()
                        .map(|(i, (port, node_port))| ServicePort {
                            name: Some(format!("p{i}")),
                            port: *port,
                            node_port: *node_port,
                            ..ServicePort::default()
                        })
                        .collect(),
                ),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        })
    }

    fn with_external_ip(mut obj: Object, ip: &str) -> Object {
        if let Object::Service(s) = &mut obj {
            s.spec.as_mut().unwrap().external_ips = Some(vec![ip.into()]);
        }
        obj
    }

    fn with_lb_ip(mut obj: Object, ip: &str) -> Object {
        if let Object::Service(s) = &mut obj {
            s.status = Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(vec![LoadBalancerIngress {
                        ip: Some(ip.into()),
                        ..LoadBalancerIngress::default()
                    }]),
                }),
                ..ServiceStatus::default()
            });
        }
        obj
    }

    fn node(name: &str, internal_ip: &str) -> Object {
        Object::Node(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                addresses: Some(vec![
                    NodeAddress {
                        address: name.into(),
                        type_: "Hostname".into(),
                    },
                    NodeAddress {
                        address: internal_ip.into(),
                        type_: "InternalIP".into(),
                    },
                ]),
                ..NodeStatus::default()
            }),
            ..Node::default()
        })
    }

    fn owner(obj: &Object) -> Owner {
        (obj.kind(), obj.key().unwrap())
    }

    /// `obj` checked against `claims`, then put in force when nothing clashes: the
    /// clashes as `field: message`.
    fn check(claims: &mut Claims, obj: &Object) -> Vec<String> {
        let mine = of(obj);
        let clashes = claims.clashes(&owner(obj), &mine);
        if clashes.is_empty() {
            claims.set(owner(obj), mine);
        }
        clashes
            .into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn an_external_or_load_balancer_ip_on_another_services_frontend_clashes() {
        let mut claims = Claims::default();
        let web = with_external_ip(
            service("web", "ClusterIP", "10.96.0.10", &[(80, None)]),
            "192.0.2.10",
        );
        assert!(check(&mut claims, &web).is_empty());
        let by_cluster_ip = with_external_ip(
            service("a", "ClusterIP", "10.96.0.11", &[(80, None)]),
            "10.96.0.10",
        );
        assert_eq!(
            check(&mut claims, &by_cluster_ip),
            [
                "spec.externalIPs[0]: TCP 10.96.0.10:80 is also a frontend of Service default/web (its spec.clusterIPs[0])"
            ]
        );
        let by_external_ip = with_lb_ip(
            service("b", "LoadBalancer", "10.96.0.12", &[(80, Some(30080))]),
            "192.0.2.10",
        );
        assert_eq!(
            check(&mut claims, &by_external_ip),
            [
                "status.loadBalancer.ingress[0].ip: TCP 192.0.2.10:80 is also a frontend of Service default/web (its spec.externalIPs[0])"
            ]
        );
        // The same address on another port, or another protocol, is another frontend.
        let other_port = with_external_ip(
            service("c", "ClusterIP", "10.96.0.13", &[(443, None)]),
            "10.96.0.10",
        );
        assert!(check(&mut claims, &other_port).is_empty());
    }

    #[test]
    fn one_service_naming_an_address_twice_does_not_clash_with_itself() {
        let mut claims = Claims::default();
        let svc = with_lb_ip(
            with_external_ip(
                service("web", "LoadBalancer", "10.96.0.10", &[(80, Some(30080))]),
                "192.0.2.10",
            ),
            "192.0.2.10",
        );
        assert!(check(&mut claims, &svc).is_empty());
        // Checked again (a new version of it), it still holds only its own.
        assert!(check(&mut claims, &svc).is_empty());
    }

    #[test]
    fn a_shared_cluster_ip_is_one_clash_and_node_ports_clash_by_protocol() {
        let mut claims = Claims::default();
        let web = service("web", "NodePort", "10.96.0.10", &[(80, Some(30080))]);
        assert!(check(&mut claims, &web).is_empty());
        let twin = service("twin", "NodePort", "10.96.0.10", &[(8080, Some(30080))]);
        assert_eq!(
            check(&mut claims, &twin),
            [
                "spec.clusterIPs[0]: 10.96.0.10 is also the cluster IP of Service default/web",
                "spec.ports[0].nodePort: TCP 30080 is also a node port of Service default/web",
            ]
        );
    }

    #[test]
    fn nodes_clash_on_an_internal_ip_and_a_freed_claim_can_be_taken() {
        let mut claims = Claims::default();
        let old = node("node-a", "192.168.10.2");
        let new = node("node-a2", "192.168.10.2");
        assert!(check(&mut claims, &old).is_empty());
        assert_eq!(
            check(&mut claims, &new),
            ["status.addresses[1].address: 192.168.10.2 is also an InternalIP of Node node-a"]
        );
        assert!(claims.remove(&owner(&old)));
        assert!(!claims.remove(&owner(&old)), "removed once");
        assert!(check(&mut claims, &new).is_empty());
    }

    #[test]
    fn set_says_whether_the_claims_changed() {
        let mut claims = Claims::default();
        let web = service("web", "ClusterIP", "10.96.0.10", &[(80, None)]);
        assert!(claims.set(owner(&web), of(&web)));
        assert!(!claims.set(owner(&web), of(&web)));
        let moved = service("web", "ClusterIP", "10.96.0.20", &[(80, None)]);
        assert!(claims.set(owner(&moved), of(&moved)));
        // The old address is free again.
        let next = service("next", "ClusterIP", "10.96.0.10", &[(80, None)]);
        assert!(check(&mut claims, &next).is_empty());
        // A headless Service claims nothing.
        let headless = service("dns", "ClusterIP", "None", &[(53, None)]);
        assert!(of(&headless).is_empty());
        assert!(!claims.set(owner(&headless), of(&headless)));
    }
}
