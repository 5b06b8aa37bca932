//! The endpoint choice for a new connection to a Service frontend, and the NAT that
//! takes it there (kube-proxy's DNAT, masquerade and hairpin rules).

use std::net::IpAddr;

use super::{Affinity, Frontend, MARK_SERVICE, MARK_TUNNEL, Miss, Scope, Services};
use crate::drop::DropReason;
use crate::flow::FlowKey;
use crate::nat::Nat;

/// Where a new connection to a Service came from, for the endpoint choice and its NAT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// This node: one of its pods, or its own stack through the host port.
    Node,
    /// Another node, through the tunnel.
    Tunnel,
    /// The network (the uplink or a plain port).
    Network,
}

/// What the choice needs to know of the node beyond its Services.
pub trait Cluster {
    /// True when the overlay reaches the node of `a` (another node's address or pod).
    fn tunnel_reaches(&self, a: IpAddr) -> bool;
    /// This node's address of the family, if it has one.
    fn node_addr(&self, v6: bool) -> Option<IpAddr>;
}

/// The backend choice for a new connection to a Service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Balanced {
    /// The NAT that takes the connection to its endpoint.
    pub nat: Nat,
    /// Conntrack mark bits (`MARK_*`).
    pub mark: u32,
    /// Index into the Service's backends.
    pub backend: usize,
    /// The client is the endpoint itself.
    pub hairpin: bool,
}

/// Chooses the endpoint of a new connection to frontend `f` and the NAT that takes it
/// there (refused, `service_source_denied`, when `f` is a load balancer IP and the source
/// is outside the Service's source ranges): DNAT to the endpoint; SNAT to the frontend address when the client is the
/// endpoint itself (hairpin). When the endpoint is not on this node and the connection
/// is external traffic from elsewhere than this node, or cluster IP traffic from the
/// network whose source is outside the cluster (as kube-proxy masquerades those), the
/// replies must come back here: SNAT to this node with `external_snat` or when the
/// tunnel does not reach the endpoint (refused, `service_no_node_address`, when the node
/// has no address of the family), else the client address is kept and the connection
/// marked to go through the tunnel.
#[inline]
pub fn balance(
    services: &Services,
    cluster: &impl Cluster,
    f: Frontend,
    key: &FlowKey,
    source: Source,
    affinity: &Affinity,
    now: u64,
) -> Result<Balanced, DropReason> {
    // loadBalancerSourceRanges, before anything else: a source outside them learns
    // nothing of the Service, not even that it has no endpoint.
    if f.source_checked && !services.services[f.service as usize].source_allowed(key.src.ip()) {
        return Err(DropReason::ServiceSourceDenied);
    }
    let i = services
        .choose(f, key, source == Source::Node, affinity, now)
        .map_err(|m| match m {
            Miss::NoEndpoints => DropReason::ServiceNoEndpoints,
            Miss::NoLocalEndpoints => DropReason::ServiceNoLocalEndpoints,
        })?;
    let svc = &services.services[f.service as usize];
    let b = &svc.backends[i];
    let mut mark = MARK_SERVICE;
    let hairpin = b.addr == key.src;
    // In the cluster as far as the tables know: an address of this node, or a pod or
    // address of another node.
    let in_cluster = |a: IpAddr| services.is_local_addr(&a) || cluster.tunnel_reaches(a);
    let snat = if hairpin {
        Some((key.dst, None))
    } else if !b.local
        && match source {
            Source::Node => false,
            Source::Tunnel => f.scope == Scope::External,
            Source::Network => f.scope == Scope::External || !in_cluster(key.src.ip()),
        }
    {
        // The client address is kept only when the tunnel reaches the endpoint's node,
        // which then returns the replies here; an endpoint outside the cluster (a
        // selectorless Service's) would answer the client directly.
        if !svc.spec.external_snat && cluster.tunnel_reaches(b.addr) {
            mark |= MARK_TUNNEL;
            None
        } else {
            // Without an address of the family, the connection cannot leave from this
            // node: sent with the client address, its replies would bypass it.
            let a = cluster
                .node_addr(key.dst.is_ipv6())
                .ok_or(DropReason::ServiceNoNodeAddress)?;
            Some((a.into(), None))
        }
    } else {
        None
    };
    Ok(Balanced {
        nat: Nat {
            dnat: Some((b.addr.into(), Some(b.port))),
            snat,
        },
        mark,
        backend: i,
        hairpin,
    })
}
