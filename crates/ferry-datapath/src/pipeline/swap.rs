//! Replacing a running pipeline's tables (see [`Pipeline::set_tables`]).
//!
//! The control plane compiles a new [`Tables`] snapshot and the worker hands it to its
//! pipeline between two batches, so no packet ever sees two snapshots. What the pipeline
//! owns outlives the swap, adjusted to the new tables:
//!
//! - **Connections** stay: a swap is not a restart. The exception is a connection this
//!   node load balanced to a Service endpoint ([`MARK_SERVICE`]) whose endpoint (the
//!   reply tuple's source address and port, with the protocol) no Service of the new
//!   tables has any more: it is deleted, as kube-proxy runs `conntrack -D` for removed
//!   endpoints, so that the next packet of a UDP flow starts a new connection to a live
//!   endpoint instead of following the entry to a dead one until it times out. A UDP
//!   entry is also deleted when its endpoint stays but no longer serves (neither ready
//!   nor serving), as kube-proxy clears UDP entries of endpoints that stop serving.
//!   Connections without the mark (a node port connection another node forwarded here
//!   has no NAT here, only its tunnel peer) are kept, except UDP ones whose original
//!   destination is a frontend of the new tables: a flow that started before the
//!   Service (or its port) existed would otherwise follow its plain entry for as long as
//!   the client keeps sending, never load balanced; it is deleted, as kube-proxy clears
//!   UDP entries to a new Service's addresses and node ports. The connection table is
//!   visited only when an endpoint may have gone or a UDP frontend may have come
//!   ([`Services::endpoints_gone_since`], [`Services::udp_frontends_added_since`]).
//! - **Connections and policy**: a policy change meets new connections only, unless the
//!   new tables' `policy.reevaluate` is on: then every tracked connection is judged as if
//!   it started now (on its translated tuple; one the node's own stack started is still
//!   from the host) and those the new policy denies are deleted
//!   ([`SwapReport::policy_cut`]).
//! - **Per-port counters** (drops by reason included) follow ports by name: a port that keeps its name keeps its
//!   counters at its new index; new ports start at zero; removed ports' counters go.
//! - **Neighbours** are kept for ports whose name is at the same index in both tables
//!   (entries are keyed by `PortId`); those of ports that moved or went are dropped and
//!   learned again on demand.
//! - **Packets waiting for a neighbour** stay when their ingress port and the port they
//!   leave by both keep their index (the rule for neighbours: a `PortId` must not change
//!   meaning under a parked packet), and, when they go through the overlay, their node
//!   is still there on the same uplink (its index is looked up again by address). The
//!   others are dropped (`neigh_queue_port_gone`), never sent to whatever port has the
//!   old index now. A kept packet keeps the MTU it was routed with.
//! - **Fragments** being reassembled are keyed by zone, not port: they stay.
//! - **Drop and pipeline counters** go on counting.
//!
//! Settings: the fragment limits (`ipf`), the ICMP error rate limit (`icmp`) and
//! `ct.tcp_pickup` take effect at the swap (see [`Reassembler::set_config`] and
//! [`RateLimiter::set_limits`] for how held state meets new limits); `ct.pass_invalid` is
//! read from the tables for every packet. `ct.max_entries` sizes the connection table
//! when the pipeline is created and is not changed by a swap: a new value is listed in
//! [`SwapReport::not_applied`] and takes effect when the agent restarts.
//!
//! [`Reassembler::set_config`]: crate::ipf::Reassembler::set_config
//! [`Services::endpoints_gone_since`]: crate::lb::Services::endpoints_gone_since
//! [`Services::udp_frontends_added_since`]: crate::lb::Services::udp_frontends_added_since

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{Pipeline, PortStats};
use crate::conntrack;
use crate::drop::{DropCounters, DropReason};
use crate::flow::proto;
use crate::lb::{MARK_SERVICE, Services};
use crate::packet::PortId;
use crate::tables::{NextHop, Tables};

#[cfg(test)]
#[path = "swap_tests.rs"]
mod swap_tests;

/// What a table swap changed, for the agent's log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwapReport {
    /// Service connections deleted because their endpoint is gone (or, for UDP, no
    /// longer serves), and plain UDP flows deleted because their destination became a
    /// Service frontend.
    pub ct_removed: usize,
    /// Neighbour entries dropped because their port moved or went.
    pub neigh_removed: usize,
    /// Packets waiting for a neighbour dropped because a port of theirs moved or went
    /// (or their overlay node).
    pub neigh_queue_removed: usize,
    /// Ports of the new tables that the old ones did not have, by name.
    pub ports_added: Vec<String>,
    /// Ports of the old tables that the new ones do not have, by name.
    pub ports_removed: Vec<String>,
    /// Ports in both tables at a different index, by name.
    pub ports_moved: Vec<String>,
    /// Tracked connections ended because the new tables' policy does not allow them
    /// (with `policy.reevaluate` on).
    pub policy_cut: usize,
    /// Settings that differ from those in force but only apply when a pipeline is
    /// created (`ct.max_entries`).
    pub not_applied: Vec<&'static str>,
}

impl Pipeline {
    /// Replaces the tables, keeping connections, counters and neighbours as the module
    /// documentation says. Call it between packets: a `PortId` handed out before the
    /// swap (a packet still queued for sending) means the old tables' port.
    pub fn set_tables(&mut self, tables: Arc<Tables>) -> SwapReport {
        let old = std::mem::replace(&mut self.tables, tables);
        let new = Arc::clone(&self.tables);
        let mut report = SwapReport::default();

        let old_ids: HashMap<&str, usize> = old
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.as_str(), i))
            .collect();
        let mut ports = Vec::with_capacity(new.ports.len());
        let mut port_drops = Vec::with_capacity(new.ports.len());
        for (i, p) in new.ports.iter().enumerate() {
            match old_ids.get(p.name.as_str()) {
                Some(&j) => {
                    ports.push(self.ports.get(j).copied().unwrap_or_default());
                    port_drops.push(self.port_drops.get(j).cloned().unwrap_or_default());
                    if j != i {
                        report.ports_moved.push(p.name.clone());
                    }
                }
                None => {
                    ports.push(PortStats::default());
                    port_drops.push(DropCounters::default());
                    report.ports_added.push(p.name.clone());
                }
            }
        }
        self.ports = ports;
        self.port_drops = port_drops;
        // Policy counters follow policies by name, as port counters follow ports.
        let old_policies: HashMap<&str, usize> = old
            .policy
            .policies()
            .iter()
            .enumerate()
            .map(|(i, p)| (&**p, i))
            .collect();
        self.policy_counts = new
            .policy
            .policies()
            .iter()
            .map(|p| {
                old_policies
                    .get(&**p)
                    .and_then(|i| self.policy_counts.get(*i))
                    .copied()
                    .unwrap_or_default()
            })
            .collect();
        // As do the counts of Service ports' source ranges.
        self.source_denied
            .retain(|name, _| new.services.get(name).is_some());
        let new_names: HashSet<&str> = new.ports.iter().map(|p| p.name.as_str()).collect();
        report.ports_removed = old
            .ports
            .iter()
            .filter(|p| !new_names.contains(p.name.as_str()))
            .map(|p| p.name.clone())
            .collect();

        let same = |id: PortId| {
            let i = usize::from(id);
            matches!((old.ports.get(i), new.ports.get(i)), (Some(a), Some(b)) if a.name == b.name)
        };
        report.neigh_removed = self.neigh.retain_ports(same);
        report.neigh_queue_removed = self.parked.retain(|port, _, r| {
            if !(same(port) && same(r.routing.port) && same(r.pkt.meta.in_port)) {
                return false;
            }
            let NextHop::Tunnel(i) = r.routing.hop else {
                return true;
            };
            // Overlay nodes are numbered in table order: follow the node by address.
            let peer = old
                .overlay
                .as_ref()
                .and_then(|o| o.peers.get(usize::from(i)));
            let index = new
                .overlay
                .as_ref()
                .filter(|o| o.uplink == r.routing.port)
                .zip(peer)
                .and_then(|(o, p)| o.peer_index(p.address));
            match index {
                Some(j) => {
                    r.routing.hop = NextHop::Tunnel(j);
                    true
                }
                None => false,
            }
        });
        let gone = report.neigh_queue_removed as u64;
        self.drops.add(DropReason::NeighQueuePortGone, gone);
        self.stats.neigh_queue_port_gone += gone;
        self.stats.neigh_waiting = self.parked.len() as u64;

        let services = &new.services;
        // Visit the connections only when an endpoint may have gone or a UDP frontend
        // may have come: an update that only added or changed endpoints leaves them be.
        let sweep = services
            .endpoints_gone_since(&old.services)
            .zip(services.udp_frontends_added_since(&old.services))
            .is_none_or(|(gone, added)| !gone.is_empty() || added);
        report.ct_removed = if !sweep {
            0
        } else {
            self.ct.retain(|e| removal(services, e).is_none())
        };

        self.ipf.set_config(new.ipf.config());
        let (per_second, burst) = new.icmp.limits();
        self.icmp.set_limits(per_second, burst);
        let ct = new.ct.config();
        self.ct.set_tcp_pickup(ct.tcp_pickup);
        if ct.max_entries.min(conntrack::Config::MAX_ENTRIES) != self.ct.config().max_entries {
            report.not_applied.push("ct.max_entries");
        }
        if new.policy.reevaluate() && !Arc::ptr_eq(&old.policy, &new.policy) {
            report.policy_cut = self.cut_denied();
        }
        report
    }
}

/// Why a table swap to `services` deletes a connection, if it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Removal {
    /// Load balanced to an endpoint no Service has (a UDP one: none has it serving).
    EndpointGone,
    /// A plain UDP flow to what is now a Service frontend.
    NowFrontend,
}

/// Whether (and why) a swap to `services` deletes `e`; a restore drops the same.
pub(super) fn removal(services: &Services, e: &conntrack::Entry) -> Option<Removal> {
    if e.mark & MARK_SERVICE == 0 {
        // A UDP flow that started before its destination was a frontend would follow
        // its plain entry for as long as the client keeps sending: deleted, so that its
        // next packet is load balanced.
        let o = e.original();
        return (o.proto == proto::UDP && services.is_frontend_of(&o))
            .then_some(Removal::NowFrontend);
    }
    // After DNAT the reply comes from the endpoint. A UDP client (whose flow never
    // ends) also leaves an endpoint that stops serving, as kube-proxy clears those; a
    // TCP connection stays until its endpoint goes.
    let r = e.reply();
    let kept = if r.proto == proto::UDP {
        services.has_serving_backend(r.proto, r.src.ip(), r.src_port)
    } else {
        services.has_backend(r.proto, r.src.ip(), r.src_port)
    };
    (!kept).then_some(Removal::EndpointGone)
}
