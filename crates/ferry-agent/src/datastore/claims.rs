//! What an object claims: a Service's cluster IPs, its frontends (each cluster,
//! external and load balancer IP on each of its ports) and its node ports; a Node's
//! InternalIPs.
//!
//! Two objects claiming one of these make tables the datapath refuses (one frontend
//! or node port serves one Service; one underlay address is one peer), and the API
//! server lets some such pairs through: it allocates cluster IPs and node ports, but
//! takes any external IP, any load balancer status and any Node address.
//!
//! A cluster IP, a node port and a Node's InternalIP are held by one object: the
//! Kubernetes datastore holds back the object that comes second until the holder
//! changes or goes (the API server's allocators keep Services apart; two Nodes with one
//! address are a replacement VM registering early), the file datastore refuses the
//! directory, naming both objects.
//!
//! A frontend is contested instead: of the Services that claim it, one wins, the same
//! on every node whatever order they came in, and the others leave that frontend out
//! (and only that one: their cluster IPs and other frontends stay in force). A frontend
//! of a cluster IP, which the API server allocated, wins over an external or load
//! balancer IP, which any user can set; so a Service cannot take another's traffic by
//! naming its cluster IP (CVE-2020-8554). Between two of the same standing the older
//! Service (`metadata.creationTimestamp`) wins, then the one whose namespace and name
//! sort first.
//!
//! [`Claims`] is the index of who holds what, kept up to date object by object, so
//! that checking one object costs the same however many there are. One object naming
//! an address twice (an external IP that is also its own load balancer IP) is not a
//! clash: it is one Service.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::cluster::{Frontend, Kind, Object, ObjectKey};
use crate::fields::{Protocol, ServiceFields, ServiceType};

/// One thing an object claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Claim {
    /// A Service's cluster IP: the API server gives each to one Service.
    ClusterIp(IpAddr),
    /// An address and port a Service answers on, by protocol: contested (see
    /// [`Rank`]).
    Frontend(Frontend),
    /// A node port, by protocol.
    NodePort(Protocol, u16),
    /// A Node's InternalIP: the underlay address of one overlay peer.
    NodeAddress(IpAddr),
}

/// How a claim of a frontend ranks against the other claims of it: the least wins
/// (with the owner's key last, so that two never tie).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Rank {
    /// An external or load balancer IP (anyone may set one), not a cluster IP (the
    /// API server allocated it).
    user_set: bool,
    /// The object has no `metadata.creationTimestamp` (the API server always sets one;
    /// a manifest may lack it): it counts as newer than any that has one.
    undated: bool,
    /// `metadata.creationTimestamp`.
    created: Option<Time>,
}

/// A claim and the field of the object that makes it (`spec.externalIPs[0]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Claimed {
    claim: Claim,
    field: String,
    rank: Rank,
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

/// A frontend of a Service that another Service wins: left out of the first one's
/// tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeftOut {
    /// The frontend.
    pub frontend: Frontend,
    /// The field of the Service that loses it.
    pub field: String,
    /// Why, naming the winner and its field.
    pub message: String,
}

/// The claims of `obj`, a Service with its `fields` as the checks parsed them: none for
/// kinds that claim nothing, and none for a Service whose fields do not parse (the field
/// checks refuse it). Only what compilation turns into tables is claimed: an
/// ExternalName or headless Service and an SCTP port have no frontends.
pub(crate) fn of(obj: &Object, fields: Option<&ServiceFields>) -> Vec<Claimed> {
    match obj {
        Object::Service(s) => fields.map_or_else(Vec::new, |f| of_service(s, f)),
        Object::Node(n) => of_node(n),
        Object::Pod(_)
        | Object::EndpointSlice(_)
        | Object::ConfigMap(_)
        | Object::Namespace(_)
        | Object::NetworkPolicy(_)
        | Object::ClusterNetworkPolicy(_) => Vec::new(),
    }
}

/// The claims of a Service with its fields `f` (see [`of`]).
pub(crate) fn of_service(svc: &Service, f: &ServiceFields) -> Vec<Claimed> {
    if f.type_ == ServiceType::ExternalName || f.headless {
        return Vec::new();
    }
    let ports: Vec<_> = f
        .ports
        .iter()
        .filter(|p| p.protocol != Protocol::Sctp)
        .collect();
    let created = svc.metadata.creation_timestamp.clone();
    let rank = |user_set| Rank {
        user_set,
        undated: created.is_none(),
        created: created.clone(),
    };
    let mut out = Vec::new();
    let frontends = |out: &mut Vec<Claimed>, ip: IpAddr, field: String, user_set: bool| {
        for p in &ports {
            out.push(Claimed {
                claim: Claim::Frontend((p.protocol, ip, p.port)),
                field: field.clone(),
                rank: rank(user_set),
            });
        }
    };
    for (i, ip) in f.cluster_ips.iter().enumerate() {
        let field = format!("spec.clusterIPs[{i}]");
        out.push(Claimed {
            claim: Claim::ClusterIp(*ip),
            field: field.clone(),
            rank: Rank::default(),
        });
        frontends(&mut out, *ip, field, false);
    }
    for (i, ip) in f.external_ips.iter().enumerate() {
        frontends(&mut out, *ip, format!("spec.externalIPs[{i}]"), true);
    }
    for ip in &f.load_balancer_ips {
        frontends(&mut out, *ip, ingress_field(svc, *ip), true);
    }
    if matches!(f.type_, ServiceType::NodePort | ServiceType::LoadBalancer) {
        for p in &ports {
            if let Some(np) = p.node_port {
                out.push(Claimed {
                    claim: Claim::NodePort(p.protocol, np),
                    field: format!("spec.ports[{}].nodePort", p.index),
                    rank: Rank::default(),
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
                rank: Rank::default(),
            })
        })
        .collect()
}

/// Who holds what: every claim of the objects in force, and each object's claims.
#[derive(Debug, Default)]
pub(crate) struct Claims {
    /// Claims held by one object: cluster IPs, node ports, Node addresses.
    held: HashMap<Claim, (Owner, String)>,
    /// Each frontend's claims, best first: the first one wins it.
    frontends: HashMap<Frontend, BTreeSet<(Rank, Owner, String)>>,
    by_owner: HashMap<Owner, Vec<Claimed>>,
}

impl Claims {
    /// The claims of `owner` that another object holds, among those only one object
    /// may hold (frontends are contested instead: see [`Claims::left_out`]): at most
    /// one per field.
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
    /// ones: what `owner` frees may let another object in, and the frontends it claims
    /// or gives up may change hands ([`Claims::rivals`]).
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
            match c.claim {
                Claim::Frontend(fe) => {
                    let key = (c.rank.clone(), owner.clone(), c.field.clone());
                    self.frontends.entry(fe).or_default().insert(key);
                }
                claim => {
                    self.held.insert(claim, (owner.clone(), c.field.clone()));
                }
            }
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
            match c.claim {
                Claim::Frontend(fe) => {
                    if let Some(claims) = self.frontends.get_mut(&fe) {
                        claims.retain(|(_, o, _)| o != owner);
                        if claims.is_empty() {
                            self.frontends.remove(&fe);
                        }
                    }
                }
                claim => {
                    if self.held.get(&claim).is_some_and(|(h, _)| h == owner) {
                        self.held.remove(&claim);
                    }
                }
            }
        }
        true
    }

    /// The other objects that claim a frontend `owner` claims: whose frontends may
    /// change hands when `owner`'s claims change.
    pub(crate) fn rivals(&self, owner: &Owner) -> BTreeSet<Owner> {
        let mut out = BTreeSet::new();
        for c in self.by_owner.get(owner).into_iter().flatten() {
            let Claim::Frontend(fe) = c.claim else {
                continue;
            };
            out.extend(
                self.frontends[&fe]
                    .iter()
                    .map(|(_, o, _)| o)
                    .filter(|o| *o != owner)
                    .cloned(),
            );
        }
        out
    }

    /// The frontends `owner` claims that another object wins, each with the field that
    /// claims it, in the order of its claims.
    pub(crate) fn left_out(&self, owner: &Owner) -> Vec<LeftOut> {
        let mut out = Vec::new();
        for c in self.by_owner.get(owner).into_iter().flatten() {
            let Claim::Frontend(fe) = c.claim else {
                continue;
            };
            let Some((_, winner, their_field)) = self.frontends[&fe].first() else {
                continue;
            };
            if winner == owner {
                continue;
            }
            out.push(LeftOut {
                frontend: fe,
                field: c.field.clone(),
                message: format!(
                    "{} {} is a frontend of {} (its {their_field}); left out",
                    fe.0.api_name(),
                    SocketAddr::new(fe.1, fe.2),
                    Named(winner)
                ),
            });
        }
        out
    }
}

/// `10.96.0.10 is also the cluster IP of Service default/web`, and the like.
fn describe(claim: Claim, holder: &Owner, their_field: &str) -> String {
    let other = Named(holder);
    match claim {
        Claim::ClusterIp(ip) => format!("{ip} is also the cluster IP of {other}"),
        Claim::Frontend((proto, ip, port)) => format!(
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

    /// The claims of `obj`, its fields parsed as the checks do.
    fn claims_of(obj: &Object) -> Vec<Claimed> {
        let fields = match obj {
            Object::Service(s) => ServiceFields::parse(s).ok(),
            _ => None,
        };
        of(obj, fields.as_ref())
    }

    fn owner(obj: &Object) -> Owner {
        (obj.kind(), obj.key().unwrap())
    }

    /// `obj` checked against `claims`, then put in force when nothing clashes: the
    /// clashes as `field: message`.
    fn check(claims: &mut Claims, obj: &Object) -> Vec<String> {
        let mine = claims_of(obj);
        let clashes = claims.clashes(&owner(obj), &mine);
        if clashes.is_empty() {
            claims.set(owner(obj), mine);
        }
        clashes
            .into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    fn created(mut obj: Object, at: &str) -> Object {
        obj.metadata_mut().creation_timestamp = Some(Time(at.parse().unwrap()));
        obj
    }

    /// Puts `obj`'s claims in force (it clashes with nothing held alone).
    fn put(claims: &mut Claims, obj: &Object) {
        assert!(claims.clashes(&owner(obj), &claims_of(obj)).is_empty());
        claims.set(owner(obj), claims_of(obj));
    }

    /// The frontends of `obj` that another object wins, as `field: message`.
    fn left_out(claims: &Claims, obj: &Object) -> Vec<String> {
        (claims.left_out(&owner(obj)).into_iter())
            .map(|l| format!("{}: {}", l.field, l.message))
            .collect()
    }

    #[test]
    fn a_cluster_ip_wins_its_frontend_over_an_external_or_load_balancer_ip_in_any_order() {
        let web = created(
            service("web", "ClusterIP", "10.96.0.10", &[(80, None)]),
            "2026-02-01T00:00:00Z",
        );
        // Older than web, and first in: it still loses web's frontend, and only that.
        let evil = created(
            with_external_ip(
                service(
                    "evil",
                    "ClusterIP",
                    "10.96.0.11",
                    &[(80, None), (443, None)],
                ),
                "10.96.0.10",
            ),
            "2026-01-01T00:00:00Z",
        );
        let lb = with_lb_ip(
            service("lb", "LoadBalancer", "10.96.0.12", &[(80, Some(30080))]),
            "10.96.0.10",
        );
        for order in [[&evil, &lb, &web], [&web, &lb, &evil]] {
            let mut claims = Claims::default();
            for obj in order {
                put(&mut claims, obj);
            }
            assert!(left_out(&claims, &web).is_empty());
            assert_eq!(
                left_out(&claims, &evil),
                [
                    "spec.externalIPs[0]: TCP 10.96.0.10:80 is a frontend of Service default/web (its spec.clusterIPs[0]); left out"
                ]
            );
            assert_eq!(
                left_out(&claims, &lb),
                [
                    "status.loadBalancer.ingress[0].ip: TCP 10.96.0.10:80 is a frontend of Service default/web (its spec.clusterIPs[0]); left out"
                ]
            );
            assert_eq!(
                claims.rivals(&owner(&web)),
                BTreeSet::from([owner(&evil), owner(&lb)])
            );
        }
    }

    #[test]
    fn the_older_of_two_external_or_load_balancer_ips_wins_and_a_freed_frontend_returns() {
        let old = created(
            with_external_ip(
                service("old", "ClusterIP", "10.96.0.10", &[(80, None)]),
                "192.0.2.10",
            ),
            "2026-01-01T00:00:00Z",
        );
        let new = created(
            with_lb_ip(
                service("a-new", "LoadBalancer", "10.96.0.11", &[(80, Some(30080))]),
                "192.0.2.10",
            ),
            "2026-02-01T00:00:00Z",
        );
        for order in [[&old, &new], [&new, &old]] {
            let mut claims = Claims::default();
            for obj in order {
                put(&mut claims, obj);
            }
            assert!(left_out(&claims, &old).is_empty());
            assert_eq!(
                left_out(&claims, &new),
                [
                    "status.loadBalancer.ingress[0].ip: TCP 192.0.2.10:80 is a frontend of Service default/old (its spec.externalIPs[0]); left out"
                ]
            );
            // The winner goes: the frontend is the other's again.
            assert!(claims.remove(&owner(&old)));
            assert!(left_out(&claims, &new).is_empty());
        }
        // Of the same age (or none), the namespace and name that sort first win.
        let undated = |obj: &Object| {
            let mut obj = obj.clone();
            obj.metadata_mut().creation_timestamp = None;
            obj
        };
        let mut claims = Claims::default();
        put(&mut claims, &undated(&old));
        put(&mut claims, &undated(&new));
        assert_eq!(left_out(&claims, &undated(&old)).len(), 1);
        assert!(left_out(&claims, &undated(&new)).is_empty());
        // One with a creation time is older than one without.
        let mut claims = Claims::default();
        put(&mut claims, &undated(&new));
        put(&mut claims, &old);
        assert!(left_out(&claims, &old).is_empty());
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
        assert!(claims.set(owner(&web), claims_of(&web)));
        assert!(!claims.set(owner(&web), claims_of(&web)));
        let moved = service("web", "ClusterIP", "10.96.0.20", &[(80, None)]);
        assert!(claims.set(owner(&moved), claims_of(&moved)));
        // The old address is free again.
        let next = service("next", "ClusterIP", "10.96.0.10", &[(80, None)]);
        assert!(check(&mut claims, &next).is_empty());
        // A headless Service claims nothing.
        let headless = service("dns", "ClusterIP", "None", &[(53, None)]);
        assert!(claims_of(&headless).is_empty());
        assert!(!claims.set(owner(&headless), claims_of(&headless)));
    }
}
