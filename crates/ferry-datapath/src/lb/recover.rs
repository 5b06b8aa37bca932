//! The frontends a connection could have reached, found from a packet of its endpoint:
//! for a packet in the reply direction of a Service connection that conntrack no longer
//! has (a crash that lost the checkpoint, a connection younger than it, an entry
//! evicted), the frontends whose choice for the client's tuple gives exactly that
//! endpoint. The endpoint choice is a function of the tuple (a consistent balance's is the
//! same in every agent while the endpoints are), so the reply can be translated back without
//! the state that chose it, or sent back to the node that translated the connection
//! (see `pipeline::recover`).

use std::net::IpAddr;

use smallvec::SmallVec;

use super::{Affinity, BalanceMode, Cluster, Frontend, Policy, Scope, Services, Source, balance};
use crate::flow::{Addr, FlowKey};

/// Candidates kept for one packet at most; frontends looked at, at most four times that
/// (a flood of packets from an endpoint of many Services costs a bounded search each).
/// Also the most the recovery of one connection tries (a bit each for its refusals).
pub const MAX_RECOVERY_CANDIDATES: usize = 8;

/// A frontend that would have given the endpoint to the client's tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The frontend.
    pub frontend: Frontend,
    /// Its address.
    pub addr: Addr,
    /// Its port.
    pub port: u16,
    /// The other node whose node port it is: the reply goes back to it through the
    /// tunnel untranslated (that node translates it), rather than translated here.
    pub via: Option<IpAddr>,
}

impl Services {
    /// The frontends that a connection from the client `reply.dst` (port
    /// `reply.dst_port`), coming from `source`, would have been balanced through to the
    /// endpoint `reply.src` (port `reply.src_port`) with the client address kept: a
    /// cluster, external or load balancer IP of a Service port holding the endpoint, or
    /// its node port at one of this node's addresses, of the client's family, whose
    /// choice ([`balance`], affinity records included) for the tuple client -> frontend
    /// is that endpoint, with no source NAT. A source-NATed connection (hairpin, SNAT to
    /// the node) is never a candidate: its reply is addressed to the translated source,
    /// not to the client.
    ///
    /// For a client from the network and an endpoint on this node, also the node ports
    /// of the other nodes (`peers`, their addresses) whose choice would give that
    /// endpoint, when the Service's external traffic policy is `Cluster` and the client
    /// address is kept: such a node sent the connection here through the tunnel, and
    /// the reply must return through it ([`Candidate::via`]). The choice is the same on
    /// every node while the endpoints are (a consistent balance), but another node's affinity records
    /// are not known here.
    ///
    /// In a stable order, the likeliest first: for a client on this node cluster IPs,
    /// then external and load balancer IPs, then node ports; for one from the network
    /// this node's node ports, then the other nodes', then external and load balancer
    /// IPs, then cluster IPs; then the Service ports as they came in, then by address
    /// and port. At most [`MAX_RECOVERY_CANDIDATES`], found among at most four times as
    /// many frontends. None with the `random` balance, whose choice is made anew in
    /// every process.
    pub fn reached_through(
        &self,
        cluster: &impl Cluster,
        reply: &FlowKey,
        source: Source,
        peers: &[IpAddr],
        affinity: &Affinity,
        now_ns: u64,
    ) -> SmallVec<[Candidate; MAX_RECOVERY_CANDIDATES]> {
        let mut out = SmallVec::<[Candidate; MAX_RECOVERY_CANDIDATES]>::new();
        // A random choice is made anew in every process: nothing to find it by.
        if self.balance.mode == BalanceMode::Random {
            return out;
        }
        let (endpoint, endpoint_port) = (reply.src.ip(), reply.src_port);
        let v6 = reply.dst.ip().is_ipv6();
        let mut budget = 4 * MAX_RECOVERY_CANDIDATES;
        // (rank, holder, address, port) of each, for the order.
        let mut order = SmallVec::<[(u8, usize, IpAddr, u16); MAX_RECOVERY_CANDIDATES]>::new();
        'holders: for (h, &s) in self
            .holders(reply.proto, endpoint, endpoint_port)
            .iter()
            .enumerate()
        {
            let svc = &self.services[s as usize];
            let spec = &svc.spec;
            let is_endpoint = |i: usize| {
                let be = &svc.backends[i];
                be.addr == endpoint && be.port == endpoint_port
            };
            // Another node's node port sent the connection here only when its choice
            // may give this node's endpoint with the client address kept.
            let here = svc
                .backends
                .iter()
                .any(|b| b.local && b.addr == endpoint && b.port == endpoint_port);
            let through_peers = source == Source::Network
                && here
                && spec.external_policy == Policy::Cluster
                && !spec.external_snat;
            let peer_ports = spec
                .node_port
                .filter(|_| through_peers)
                .into_iter()
                .flat_map(|np| peers.iter().map(move |a| (*a, np, Kind::PeerNodePort)));
            let addrs = spec
                .cluster_ips
                .iter()
                .map(|a| (*a, spec.port, Kind::ClusterIp))
                .chain(
                    spec.external_ips
                        .iter()
                        .chain(&spec.load_balancer_ips)
                        .map(|a| (*a, spec.port, Kind::ExternalIp)),
                )
                .chain(spec.node_port.into_iter().flat_map(|np| {
                    self.local_addrs
                        .iter()
                        .map(move |a| (*a, np, Kind::NodePort))
                }))
                .chain(peer_ports)
                .filter(|(a, _, _)| a.is_ipv6() == v6);
            for (a, port, kind) in addrs {
                if budget == 0 || out.len() == MAX_RECOVERY_CANDIDATES {
                    break 'holders;
                }
                budget -= 1;
                let scope = if kind == Kind::ClusterIp {
                    Scope::Internal
                } else {
                    Scope::External
                };
                let mut frontend = Frontend {
                    service: s,
                    scope,
                    source_checked: false,
                };
                let forward = FlowKey {
                    src: reply.dst,
                    dst: a.into(),
                    src_port: reply.dst_port,
                    dst_port: port,
                    ..*reply
                };
                let chosen = if kind == Kind::PeerNodePort {
                    // That node's choice: its node port, unless an address and port of
                    // a frontend takes it first; every node's endpoints eligible.
                    !self.frontends.contains_key(&(reply.proto, a, port))
                        && self
                            .choose(frontend, &forward, false, affinity, now_ns)
                            .is_ok_and(is_endpoint)
                } else {
                    // What a packet to it reaches: not this Service port when another
                    // one's frontend takes the address and port first.
                    match self.frontend(&forward) {
                        Some(f) if f.service == s && f.scope == scope => {
                            frontend = f;
                            balance(self, cluster, f, &forward, source, affinity, now_ns)
                                .is_ok_and(|b| b.nat.snat.is_none() && is_endpoint(b.backend))
                        }
                        _ => false,
                    }
                };
                if !chosen {
                    continue;
                }
                out.push(Candidate {
                    frontend,
                    addr: a.into(),
                    port,
                    via: (kind == Kind::PeerNodePort).then_some(a),
                });
                // A client on this node reaches cluster IPs first, then external
                // addresses, then node ports; one outside, node ports first (a load
                // balancer keeping the client address sends to them), this node's
                // before the others', then external addresses, then cluster IPs.
                let rank = match (source, kind) {
                    (Source::Network, Kind::NodePort) => 0,
                    (Source::Network, Kind::PeerNodePort) => 1,
                    (Source::Network, Kind::ExternalIp) => 2,
                    (Source::Network, Kind::ClusterIp) => 3,
                    (_, Kind::ClusterIp) => 0,
                    (_, Kind::ExternalIp) => 1,
                    (_, _) => 2,
                };
                order.push((rank, h, a, port));
            }
        }
        // The node's addresses are a set: its order is not one to rely on.
        let mut idx: SmallVec<[usize; MAX_RECOVERY_CANDIDATES]> = (0..out.len()).collect();
        idx.sort_by_key(|&i| order[i]);
        idx.into_iter().map(|i| out[i]).collect()
    }
}

/// What kind of frontend a candidate is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    ClusterIp,
    ExternalIp,
    NodePort,
    PeerNodePort,
}
