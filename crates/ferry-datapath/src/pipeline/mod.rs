//! One node's pipeline, composed of its stages, one file each:
//!
//! ```text
//! ingress   parse checks, ARP, GRO marking       (ingress.rs; ARP/ND answers: local.rs)
//! defrag    reassembly, key rebuilt               (defrag.rs)
//! decap     VXLAN from a known node               (decap.rs)
//! forward   admission: source check, ND, martians, TTL; then the stages below (forward.rs)
//! track     Service choice and conntrack with NAT (track.rs, service.rs; replies of
//!           Service connections conntrack lost: recover.rs)
//! policy    NetworkPolicy and ClusterNetworkPolicy (policy.rs; denials audited: audit.rs)
//! route     egress port and next hop              (route.rs)
//! egress    MTU check, next-hop resolution, rewrite, encap, segmentation and
//!           fragmentation                         (egress.rs, resolve.rs)
//! icmp      errors sent back                      (icmp.rs)
//! ```
//!
//! A packet whose next hop has no MAC yet waits, as routed (after NAT, before the TTL
//! and L2 rewrite), in the neighbour queue; when the neighbour answers it goes through
//! the same stages from next-hop resolution on (`Pipeline::deliver`).
//!
//! Conntrack decides first whether a packet belongs to a connection or starts one; only
//! for one that starts a connection does the forward stage ask the Services for an
//! endpoint (or the static NAT rules), and conntrack records the NAT
//! ([`Conntrack::begin`], [`Conntrack::start`]). The pipeline owns its per-worker state
//! (fragment buffers, connections, neighbours, ICMP budget, counters) and reads the node
//! tables through an `Arc` that the control plane swaps (`swap.rs`).

use std::sync::Arc;

use crate::conntrack::Conntrack;
use crate::drop::{DropCounters, DropReason};
use crate::flow::{FlowKey, proto};
use crate::icmp::{ErrorKind, RateLimiter};
use crate::ipf::Reassembler;
use crate::lb::Affinity;
use crate::neigh::{self, Neighbours};
use crate::packet::{Packet, PortId};
use crate::tables::Tables;
use crate::wire::{L3, Parsed, parse};

mod audit;
mod decap;
mod defrag;
mod egress;
mod events;
mod forward;
mod handover;
mod icmp;
mod ingress;
mod local;
mod policy;
mod recover;
mod resolve;
mod route;
mod service;
mod stats;
mod track;

pub use audit::{DEFAULT_AUDIT_BUFFER, Denial, DeniedBy};
pub use events::{
    Asked, Fragment, L2Hop, MtuFit, MtuLength, PolicyBy, ServicePath, Stage, Trace, TraceEvent,
};
pub use policy::{PolicyCount, PolicyCut};
pub use stats::{PortStats, Stats};

use events::SockAddr;
use route::Routed;

/// What became of one input packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Sent on (possibly as several packets, possibly with an ICMP error besides).
    Forwarded,
    /// Held for reassembly; it leaves as part of its datagram, or expires.
    Held,
    /// Taken by the node itself: ARP or neighbour discovery, answered, learned from, or
    /// ignored as not addressed to it; never forwarded.
    Consumed,
    /// Routed, waiting for its next hop's MAC (an ARP request / neighbour solicitation
    /// went out): it is sent when the neighbour answers, or dropped when the wait times
    /// out or newer packets push it out of the queue. Its connection is committed.
    Queued,
    /// Dropped for this reason.
    Dropped(DropReason),
}

impl Verdict {
    /// `forwarded`, `held`, `consumed`, `queued` or `dropped`.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Forwarded => "forwarded",
            Verdict::Held => "held",
            Verdict::Consumed => "consumed",
            Verdict::Queued => "queued",
            Verdict::Dropped(_) => "dropped",
        }
    }
}

/// [`Pipeline::process_batch`] prefetches the connection table for its packets from
/// this many tracked connections on: a table of 16 Ki connections (some 3 MiB) no longer
/// stays in a core's second-level cache, and below that the misses a prefetch would
/// hide are few.
pub const PREFETCH_MIN_CONNECTIONS: usize = 16 * 1024;

/// Datagrams (and connections, and queued packets) expired per call of
/// [`Pipeline::tick`] at most: bounded work per batch.
pub const EXPIRE_BUDGET: usize = 64;

/// One node's packet pipeline.
pub struct Pipeline {
    tables: Arc<Tables>,
    ipf: Reassembler,
    ct: Conntrack,
    neigh: Neighbours,
    /// Packets waiting for their next hop's MAC.
    parked: neigh::Queue<Routed>,
    icmp: RateLimiter,
    affinity: Affinity,
    affinity_swept_ns: u64,
    /// Service connections being recovered from their endpoint's side (`recover`).
    recovering: recover::Recovering,
    drops: DropCounters,
    stats: Stats,
    ports: Vec<PortStats>,
    /// Drops by reason of the packets received on each port, indexed like `ports`.
    port_drops: Vec<DropCounters>,
    /// The port of the packet being processed, for [`Pipeline::drop`].
    rx_port: usize,
    scratch: Vec<Packet>,
    /// A receive batch in [`Pipeline::process_batch`], each packet with its parse.
    batch: Vec<(Packet, Result<Parsed, DropReason>)>,
    /// The conntrack keys of that batch.
    batch_keys: Vec<FlowKey>,
    /// A scratch pipeline of a dry run ([`trace`]): what it emits is never sent, and
    /// its notes say so.
    dry_run: bool,
    /// Connections decided per policy, indexed like the tables' policies.
    policy_counts: Vec<PolicyCount>,
    /// New connections refused by a Service port's source ranges, by its name (those
    /// that refused any; kept while the Service port is).
    source_denied: std::collections::BTreeMap<String, u64>,
    /// Denials recorded for the audit log, when it is on.
    audit: audit::Audit,
    /// The IPv4 identification of the next outer datagram through the overlay (see
    /// [`overlay::Outer::id`]).
    outer_id: u16,
}

/// How often session affinity records are swept for expiry.
const AFFINITY_SWEEP_NS: u64 = 1_000_000_000;

impl Pipeline {
    /// A pipeline over `tables`, with fragment and ICMP limits from them.
    pub fn new(tables: Arc<Tables>) -> Pipeline {
        let cfg = tables.ipf.config();
        let (per_second, burst) = tables.icmp.limits();
        let icmp = RateLimiter::new(per_second, burst);
        let ct = tables.ct.config();
        let neigh = neigh::Config::default();
        Pipeline {
            ports: vec![PortStats::default(); tables.ports.len()],
            port_drops: vec![DropCounters::default(); tables.ports.len()],
            rx_port: 0,
            tables,
            ipf: Reassembler::new(cfg),
            ct: Conntrack::new(ct),
            parked: neigh::Queue::new(&neigh),
            neigh: Neighbours::new(neigh),
            icmp,
            affinity: Affinity::default(),
            affinity_swept_ns: 0,
            recovering: recover::Recovering::default(),
            drops: DropCounters::default(),
            stats: Stats::default(),
            scratch: Vec::new(),
            batch: Vec::new(),
            batch_keys: Vec::new(),
            dry_run: false,
            policy_counts: Vec::new(),
            source_denied: std::collections::BTreeMap::new(),
            audit: audit::Audit::default(),
            outer_id: 0,
        }
    }

    /// The tables in use.
    pub fn tables(&self) -> &Arc<Tables> {
        &self.tables
    }

    /// Drop counters per reason.
    pub fn drops(&self) -> &DropCounters {
        &self.drops
    }

    /// Pipeline counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Per-port counters, indexed by `PortId`.
    pub fn port_stats(&self) -> &[PortStats] {
        &self.ports
    }

    /// Drops by reason of the packets received on each port, indexed by `PortId` (their
    /// totals are [`PortStats::drops`]).
    pub fn port_drops(&self) -> &[DropCounters] {
        &self.port_drops
    }

    /// The fragment reassembler (for its counters and usage).
    pub fn reassembler(&self) -> &Reassembler {
        &self.ipf
    }

    /// The connection table.
    pub fn conntrack(&self) -> &Conntrack {
        &self.ct
    }

    /// The connection table, for deleting entries or setting marks.
    pub fn conntrack_mut(&mut self) -> &mut Conntrack {
        &mut self.ct
    }

    /// The neighbour table (uplink and host ports).
    pub fn neighbours(&self) -> &Neighbours {
        &self.neigh
    }

    /// Session affinity records.
    pub fn affinity(&self) -> &Affinity {
        &self.affinity
    }

    /// Advances the pipeline's clock: expires fragments, connections and packets that
    /// waited too long for their neighbour, with bounded work. Each of the latter is
    /// answered with an ICMP host unreachable (ICMPv6 address unreachable, RFC 4861
    /// section 7.2.2), within the ICMP rate limit, appended to `out` with its port, so
    /// that its sender learns at once that the next hop does not answer.
    pub fn tick(&mut self, now_ns: u64, out: &mut Vec<(PortId, Packet)>) {
        self.ipf.expire(now_ns, EXPIRE_BUDGET, &mut self.drops);
        self.ct.expire(now_ns, EXPIRE_BUDGET);
        let expired = self.parked.expire(now_ns, EXPIRE_BUDGET);
        if !expired.is_empty() {
            let n = expired.len() as u64;
            self.drops.add(DropReason::NeighUnresolved, n);
            self.stats.neigh_queue_expired += n;
            self.stats.neigh_waiting = self.parked.len() as u64;
        }
        for mut routed in expired {
            // Now, for the rate limit: the packet was received a while ago.
            routed.pkt.meta.time_ns = now_ns;
            let code = if routed.parsed.l3 == L3::Ipv4 { 1 } else { 3 };
            // It may have been translated: its connection, committed when it was
            // queued, translates the error back for its sender.
            self.icmp_error(
                &routed.pkt,
                &routed.parsed,
                ErrorKind::Unreachable { code },
                true,
                routed.routing.tunnel_peer,
                out,
                &mut Trace::disabled(),
            );
        }
        if now_ns.saturating_sub(self.affinity_swept_ns) >= AFFINITY_SWEEP_NS {
            self.affinity_swept_ns = now_ns;
            self.affinity.expire(now_ns, usize::MAX);
            self.recovering.expire(now_ns);
        }
    }

    fn drop(&mut self, reason: DropReason, trace: &mut Trace) -> Verdict {
        self.drops.count(reason);
        if let (Some(s), Some(d)) = (
            self.ports.get_mut(self.rx_port),
            self.port_drops.get_mut(self.rx_port),
        ) {
            s.drops += 1;
            d.count(reason);
        }
        trace.note(|| TraceEvent::Drop { reason });
        Verdict::Dropped(reason)
    }

    fn send(&mut self, port: PortId, pkt: Packet, out: &mut Vec<(PortId, Packet)>) {
        let s = &mut self.ports[usize::from(port)];
        s.tx_packets += 1;
        s.tx_bytes += pkt.data.len() as u64;
        out.push((port, pkt));
    }

    /// Runs one packet through the pipeline. Packets to send are appended to `out` with
    /// their egress port (an ICMP error goes out of the ingress port; an ARP request or
    /// neighbour solicitation out of the port whose next hop is being resolved; the
    /// packets that waited for a neighbour when an ARP or ND packet teaches its MAC).
    pub fn process(
        &mut self,
        pkt: Packet,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let tables = Arc::clone(&self.tables);
        let parsed = self.parse_ingress(&pkt);
        self.process_parsed(&tables, pkt, parsed, out, trace)
    }

    /// Runs a receive batch through the pipeline: each packet in order, with what
    /// [`Pipeline::process`] would do and emit for it, the trace cleared before each.
    /// When the connection table holds at least [`PREFETCH_MIN_CONNECTIONS`], every
    /// packet is parsed first and the connections of the batch are prefetched
    /// ([`Conntrack::prefetch_batch`], with the prefetch instruction given by
    /// [`Conntrack::set_prefetch`]), so that their cache misses overlap instead of
    /// coming one packet after the other; below that, each packet goes through alone.
    /// The prefetched key of a packet is its own tuple as parsed; for a VXLAN datagram
    /// to this node, whose inner connection is known only after decapsulation, and for
    /// fragments, nothing is prefetched.
    pub fn process_batch(
        &mut self,
        pkts: impl IntoIterator<Item = Packet>,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) {
        // One reference for the batch: taking one per packet is an atomic
        // read-modify-write, which waits for the stores before it, those to lines that
        // missed the cache too.
        let tables = Arc::clone(&self.tables);
        if self.ct.len() < PREFETCH_MIN_CONNECTIONS {
            // A small table stays in cache: nothing to prefetch, so no packet is held
            // back and moved once more.
            for pkt in pkts {
                trace.clear();
                let parsed = self.parse_ingress(&pkt);
                self.process_parsed(&tables, pkt, parsed, out, trace);
            }
            return;
        }
        let mut batch = std::mem::take(&mut self.batch);
        batch.extend(pkts.into_iter().map(|pkt| {
            let parsed = self.parse_ingress(&pkt);
            (pkt, parsed)
        }));
        let mut keys = std::mem::take(&mut self.batch_keys);
        keys.clear();
        keys.extend(batch.iter().filter_map(|(pkt, parsed)| {
            let p = parsed.as_ref().ok()?;
            self.tracked_key(pkt, p)
        }));
        self.ct.prefetch_batch(&keys);
        self.batch_keys = keys;
        for (pkt, parsed) in batch.drain(..) {
            trace.clear();
            self.process_parsed(&tables, pkt, parsed, out, trace);
        }
        self.ct.end_batch();
        self.batch = batch;
    }

    /// The packet parsed in its ingress port's zone.
    fn parse_ingress(&self, pkt: &Packet) -> Result<Parsed, DropReason> {
        let port = self.tables.ports.get(usize::from(pkt.meta.in_port));
        parse(&pkt.data, port.ok_or(DropReason::UnknownPort)?.zone)
    }

    /// The key conntrack will look this packet up by, when it is the one parsed: not for
    /// ARP, fragments (tracked once reassembled) and VXLAN to this node (its inner
    /// packet is tracked).
    fn tracked_key<'a>(&self, pkt: &Packet, parsed: &'a Parsed) -> Option<&'a FlowKey> {
        if parsed.l3 == L3::Arp || parsed.frag.is_some() {
            return None;
        }
        if let Some(ov) = &self.tables.overlay
            && pkt.meta.in_port == ov.uplink
            && parsed.proto == proto::UDP
            && parsed.key.dst_port == ov.port
        {
            return None;
        }
        Some(&parsed.key)
    }
}

/// The verdict of several inner packets of one frame: `Forwarded` once any was, else
/// the latest.
pub(super) fn combine(acc: &mut Verdict, v: Verdict) {
    if v == Verdict::Forwarded || *acc != Verdict::Forwarded {
        *acc = v;
    }
}

/// The MAC at `off` in a frame (the caller knows the frame is long enough).
pub(super) fn mac_at(data: &[u8], off: usize) -> [u8; 6] {
    data[off..off + 6].try_into().expect("6 bytes")
}

/// What the test modules name through `use super::*`.
#[cfg(test)]
use crate::{
    gso, ipf, lb,
    neigh::{arp, nd},
    overlay,
    packet::VnetHdr,
    tables::PortKind,
    wire::{checksum, vxlan},
};

mod swap;
pub use swap::SwapReport;

mod trace;
pub use trace::{TraceOut, TracePass, TraceReport, TraceStage, summarize, trace};

#[cfg(test)]
mod trace_tests;

#[cfg(test)]
mod events_tests;

#[cfg(test)]
mod tests;

/// Two nodes on one underlay subnet, each with two pods, through the overlay.
#[cfg(test)]
mod overlay_tests;

#[cfg(test)]
mod service_tests;

#[cfg(test)]
mod recover_tests;

#[cfg(test)]
mod policy_tests;

/// The audit of denials.
#[cfg(test)]
mod audit_tests;

/// Addresses of this node's pod CIDRs that no pod has.
#[cfg(test)]
mod pod_cidr_tests;

/// Packets waiting for their next hop's MAC.
#[cfg(test)]
mod neigh_tests;

/// The state handed over to a new pipeline.
#[cfg(test)]
mod handover_tests;

/// A checkpoint of the state restored after a crash.
#[cfg(test)]
mod checkpoint_tests;

/// A handover's pre-copy: a base saved while forwarding, then the changes.
#[cfg(test)]
mod precopy_tests;

#[cfg(test)]
mod test_support;
