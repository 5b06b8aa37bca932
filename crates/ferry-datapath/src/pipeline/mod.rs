//! One node's pipeline: parse (ARP answered here) -> defrag -> VXLAN decap -> source
//! check -> neighbour discovery -> TTL -> service load balancing and conntrack (with
//! NAT) -> route -> next-hop resolution -> L2 rewrite -> egress MTU -> encap.
//!
//! A packet whose next hop has no MAC yet waits, as routed (after NAT, before the TTL
//! and L2 rewrite), in the neighbour queue; when the neighbour answers it goes through
//! the same stages from next-hop resolution on (`Pipeline::deliver`).
//!
//! The service stage runs inside conntrack's decision for a new connection only
//! ([`Conntrack::process_with`]): packets of known connections follow their entry.
//! Policy will slot in after conntrack. The pipeline owns its
//! per-worker state (fragment buffers, connections, neighbours, ICMP budget, counters)
//! and reads the node tables through an `Arc` that the control plane swaps.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use crate::conntrack::{Conntrack, CtState, Nat, Pending};
use crate::drop::{DropCounters, DropReason};
use crate::fib::Fib;
use crate::flow::{FlowKey, proto};
use crate::gro;
use crate::gso;
use crate::icmp::{self, ErrorKind, RateLimiter};
use crate::ipf::{self, Reassembler};
use crate::lb::{self, Affinity, Frontend, Miss, Scope};
use crate::neigh::{self, Neighbours, arp, nd};
use crate::overlay;
use crate::packet::{Meta, Packet, PortId, VnetHdr};
use crate::tables::{GATEWAY_V4, MacAddr, NextHop, Port, PortKind, Route, Snat, Tables, Target};
use crate::wire::checksum;
use crate::wire::vxlan;
use crate::wire::{L3, Parsed, parse};

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

/// One stage's note in a packet's trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Stage name (`parse`, `ipf`, `route`, ...).
    pub stage: &'static str,
    /// What the stage did.
    pub detail: String,
}

/// A packet's trace: one event per stage, recorded only when enabled.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    enabled: bool,
    /// The events, in stage order.
    pub events: Vec<TraceEvent>,
    /// What conntrack made of the packet, and whether it went in the reply direction;
    /// recorded whether or not tracing is on.
    pub ct: Option<(CtState, bool)>,
    /// The packet's key as conntrack looked it up (after decapsulation and reassembly,
    /// before NAT); recorded only when tracing is on.
    pub key: Option<crate::flow::FlowKey>,
    /// The neighbour (port and address) the packet was queued for, when it was; recorded
    /// only when tracing is on.
    pub waiting_for: Option<(PortId, IpAddr)>,
}

impl Trace {
    /// A trace that records.
    pub fn enabled() -> Trace {
        Trace {
            enabled: true,
            events: Vec::new(),
            ct: None,
            key: None,
            waiting_for: None,
        }
    }

    /// A trace that records nothing (the fast path).
    pub fn disabled() -> Trace {
        Trace::default()
    }

    /// Records an event; `detail` is only evaluated when tracing is on.
    #[inline]
    pub fn note(&mut self, stage: &'static str, detail: impl FnOnce() -> String) {
        if self.enabled {
            self.events.push(TraceEvent {
                stage,
                detail: detail(),
            });
        }
    }

    /// Forgets the events and the conntrack state, keeping the setting.
    pub fn clear(&mut self) {
        self.events.clear();
        self.ct = None;
        self.key = None;
        self.waiting_for = None;
    }

    /// The conntrack state as verdict logs name it: `new`, `established`, `reply`,
    /// `related`, `invalid` or `untracked`; None when the packet never reached conntrack.
    pub fn ct_name(&self) -> Option<&'static str> {
        self.ct.map(|(state, reply)| match state {
            CtState::Established if reply => "reply",
            s => s.name(),
        })
    }
}

/// Per-port packet and byte counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Packets received.
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets received here that the pipeline dropped (by reason in
    /// [`Pipeline::port_drops`]). Fragments dropped later with their datagram (expired,
    /// overlapped) and queued packets dropped later (expired, pushed out, discarded at a
    /// table swap) are counted in [`Pipeline::drops`] only.
    pub drops: u64,
}

/// Pipeline-wide counters besides drops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Datagrams completed from fragments.
    pub reassembled: u64,
    /// Fragments sent by refragmentation or router fragmentation.
    pub fragments_out: u64,
    /// Received super-packets treated as coalesced TCP (port `gro`).
    pub gro_marked: u64,
    /// GSO packets segmented.
    pub segmented: u64,
    /// Segments sent from segmentation.
    pub segments_out: u64,
    /// ICMP errors sent.
    pub icmp_sent: u64,
    /// ICMP errors not sent: rate limited.
    pub icmp_rate_limited: u64,
    /// ICMP errors not sent: no node address on the port, or forbidden by RFC 1122.
    pub icmp_suppressed: u64,
    /// ARP requests answered.
    pub arp_answered: u64,
    /// Neighbour solicitations answered.
    pub nd_answered: u64,
    /// ARP requests / neighbour solicitations sent to resolve a next hop.
    pub neigh_probes: u64,
    /// Packets waiting for their next hop's MAC now.
    pub neigh_waiting: u64,
    /// Packets queued to wait for their next hop's MAC.
    pub neigh_queued: u64,
    /// Queued packets sent on when their neighbour answered.
    pub neigh_released: u64,
    /// Queued packets pushed out by newer ones (`neigh_queue_overflow`).
    pub neigh_queue_overflow: u64,
    /// Queued packets whose neighbour did not answer in time (`neigh_unresolved`).
    pub neigh_queue_expired: u64,
    /// Queued packets discarded at a table swap (`neigh_queue_port_gone`).
    pub neigh_queue_port_gone: u64,
    /// Packets sent VXLAN-encapsulated.
    pub encapsulated: u64,
    /// VXLAN packets decapsulated.
    pub decapsulated: u64,
    /// UDP GSO super-frames sent to the uplink, each several encapsulated datagrams for
    /// the kernel (or the NIC) to cut apart.
    pub encap_gso_frames: u64,
    /// UDP GSO super-frames received from the uplink and split into their VXLAN
    /// datagrams.
    pub decap_gso_frames: u64,
    /// TCP segments decapsulated from such super-frames and coalesced into a segment
    /// before them (the pipeline ran once for the merged packet).
    pub decap_coalesced: u64,
    /// New connections to a Service given an endpoint.
    pub service_balanced: u64,
    /// New connections to a Service refused at once (no endpoint: TCP reset or ICMP port
    /// unreachable sent).
    pub service_rejected: u64,
}

/// The backend choice for a new connection to a Service.
struct Balanced {
    nat: Nat,
    /// Conntrack mark bits (`lb::MARK_*`).
    mark: u32,
    /// Index into the Service's backends.
    backend: usize,
    /// The client is the endpoint itself.
    hairpin: bool,
}

/// Where a new connection to a Service came from, for the endpoint choice and its NAT.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    /// This node: one of its pods, or its own stack through the host port.
    Node,
    /// Another node, through the tunnel.
    Tunnel,
    /// The network (the uplink or a plain port).
    Network,
}

/// True when `a` is in the cluster as far as the tables know: an address of this node,
/// or a pod or address of another node.
fn in_cluster(tables: &Tables, a: IpAddr) -> bool {
    tables.services.is_local_addr(&a)
        || tables
            .overlay
            .as_ref()
            .is_some_and(|ov| ov.peer_for_endpoint(a).is_some())
}

/// Chooses the endpoint of a new connection to frontend `f` and the NAT that takes it
/// there: DNAT to the endpoint; SNAT to the frontend address when the client is the
/// endpoint itself (hairpin). When the endpoint is not on this node and the connection
/// is external traffic from elsewhere than this node, or cluster IP traffic from the
/// network whose source is outside the cluster (as kube-proxy masquerades those), the
/// replies must come back here: SNAT to this node with `external_snat` or when the
/// tunnel does not reach the endpoint (refused, `service_no_node_address`, when the node
/// has no address of the family), else the client address is kept and the connection
/// marked to go through the tunnel.
fn balance(
    tables: &Tables,
    f: Frontend,
    key: &crate::flow::FlowKey,
    source: Source,
    affinity: &Affinity,
    now: u64,
) -> Result<Balanced, DropReason> {
    let i = tables
        .services
        .choose(f, key, source == Source::Node, affinity, now)
        .map_err(|m| match m {
            Miss::NoEndpoints => DropReason::ServiceNoEndpoints,
            Miss::NoLocalEndpoints => DropReason::ServiceNoLocalEndpoints,
        })?;
    let svc = &tables.services.services[f.service as usize];
    let b = &svc.backends[i];
    let mut mark = lb::MARK_SERVICE;
    let hairpin = b.addr == key.src;
    let snat = if hairpin {
        Some((key.dst, None))
    } else if !b.local
        && match source {
            Source::Node => false,
            Source::Tunnel => f.scope == Scope::External,
            Source::Network => f.scope == Scope::External || !in_cluster(tables, key.src.ip()),
        }
    {
        // The client address is kept only when the tunnel reaches the endpoint's node,
        // which then returns the replies here; an endpoint outside the cluster (a
        // selectorless Service's) would answer the client directly.
        let tunnel = !svc.spec.external_snat
            && tables
                .overlay
                .as_ref()
                .is_some_and(|ov| ov.peer_for_endpoint(b.addr).is_some());
        if tunnel {
            mark |= lb::MARK_TUNNEL;
            None
        } else {
            // Without an address of the family, the connection cannot leave from this
            // node: sent with the client address, its replies would bypass it.
            let a = tables
                .node
                .addr(key.dst.is_ipv6())
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

/// `addr:port`, with brackets for IPv6.
struct SockAddr(IpAddr, u16);

impl std::fmt::Display for SockAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V4(a) => write!(f, "{a}:{}", self.1),
            IpAddr::V6(a) => write!(f, "[{a}]:{}", self.1),
        }
    }
}

/// Where one routed packet leaves, resolved: link-layer addresses, offloads, and the
/// outer headers when it goes through the overlay.
struct Egress {
    port: PortId,
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    gso: bool,
    /// Through the overlay, and the uplink takes UDP GSO (its tables say `gso: true`):
    /// the encapsulated segments of a GSO packet may leave as UDP GSO super-frames.
    uso: bool,
    tunnel: Option<overlay::Outer>,
}

/// What routing decided for a packet, for the stages after it (`Pipeline::deliver`).
#[derive(Clone, Copy, Debug)]
struct Routing {
    /// The egress port (the overlay's uplink when tunnelled) and the next hop on it.
    port: PortId,
    hop: NextHop,
    /// The MTU that applies to the packet (inside the tunnel when tunnelled); it was
    /// found not too big for it.
    mtu: usize,
    /// The node the packet came from through the overlay, if it did: an ICMP error
    /// about it goes back there.
    tunnel_peer: Option<IpAddr>,
}

/// A routed packet waiting in the neighbour queue: after NAT, TTL and MACs not
/// rewritten yet.
struct Routed {
    pkt: Packet,
    parsed: Parsed,
    routing: Routing,
}

/// Why a routed packet has no link-layer addresses.
#[derive(Debug, PartialEq, Eq)]
enum NoEgress {
    /// It cannot be sent.
    Drop(DropReason),
    /// The neighbour `ip` on `port` has no MAC yet; `probed` when a probe went out now.
    Unresolved {
        port: PortId,
        ip: IpAddr,
        probed: bool,
    },
}

impl NoEgress {
    /// The reason to count when the packet is not queued.
    fn reason(&self) -> DropReason {
        match self {
            NoEgress::Drop(r) => *r,
            NoEgress::Unresolved { .. } => DropReason::NeighUnresolved,
        }
    }
}

impl From<DropReason> for NoEgress {
    fn from(r: DropReason) -> Self {
        NoEgress::Drop(r)
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
    /// The IPv4 identification of the next outer datagram through the overlay (see
    /// [`overlay::Outer::id`]).
    outer_id: u16,
}

/// How often session affinity records are swept for expiry.
const AFFINITY_SWEEP_NS: u64 = 1_000_000_000;

impl Pipeline {
    /// A pipeline over `tables`, with fragment and ICMP limits from them.
    pub fn new(tables: Arc<Tables>) -> Pipeline {
        let cfg = swap::ipf_config(&tables.ipf);
        let (per_second, burst) = swap::icmp_limits(&tables.icmp);
        let icmp = RateLimiter::new(per_second, burst);
        let ct = swap::ct_config(&tables.ct);
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
            drops: DropCounters::default(),
            stats: Stats::default(),
            scratch: Vec::new(),
            batch: Vec::new(),
            batch_keys: Vec::new(),
            dry_run: false,
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
        trace.note("drop", || reason.name().to_string());
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

    /// [`Pipeline::process`] after the packet was parsed.
    fn process_parsed(
        &mut self,
        tables: &Tables,
        mut pkt: Packet,
        parsed: Result<Parsed, DropReason>,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let in_id = pkt.meta.in_port;
        self.rx_port = usize::from(in_id);
        let Some(in_port) = tables.ports.get(usize::from(in_id)) else {
            return self.drop(DropReason::UnknownPort, trace);
        };
        let rx = &mut self.ports[usize::from(in_id)];
        rx.rx_packets += 1;
        rx.rx_bytes += pkt.data.len() as u64;
        pkt.meta.zone = in_port.zone;

        let parsed = match parsed {
            Ok(p) => p,
            Err(r) => return self.drop(r, trace),
        };
        // Pod, uplink and host ports carry one untagged network each; a plain port passes
        // tags through.
        if in_port.kind != PortKind::Plain && parsed.vlan.is_some() {
            return self.drop(DropReason::VlanTagged, trace);
        }
        // A unicast frame for another host's MAC (a switch flooding a destination it has
        // not learned, seen because the uplink listens promiscuously) is not the node's:
        // Linux drops such frames (PACKET_OTHERHOST) before ARP and IP see them.
        if matches!(in_port.kind, PortKind::Uplink | PortKind::Host)
            && pkt.data[0] & 1 == 0
            && pkt.data[0..6] != in_port.mac
        {
            return self.drop(DropReason::OtherHost, trace);
        }
        if parsed.l3 == L3::Arp {
            return self.arp(&pkt, &parsed, out, trace);
        }
        // Ethernet padding is not part of the packet and must not reach checksums.
        pkt.data.truncate(parsed.ip_end);
        trace.note("parse", || {
            let frag = match parsed.frag {
                Some(f) => format!(" fragment id {} offset {} more {}", f.id, f.offset, f.more),
                None => String::new(),
            };
            format!("{}, {} bytes{frag}", parsed.key, parsed.ip_len())
        });
        // A pod's fragment is checked on its own, before it meets others in reassembly
        // (whose key has no port): a pod must not plant fragments of another's
        // datagrams. The reassembled datagram is checked again, as any packet.
        if in_port.kind == PortKind::Pod
            && parsed.frag.is_some()
            && !source_is_pods(in_port, &pkt, &parsed)
        {
            return self.drop(DropReason::SourceSpoofed, trace);
        }

        // A kernel VXLAN peer behind a veth hands over frames whose inner checksum is
        // still partial: that state is checked on the inner packet after decapsulation,
        // and such a frame that is not decapsulated is refused.
        let inner_csum = inner_partial_checksum(&pkt, &parsed);
        if !inner_csum && let Err(r) = check_offload(&pkt.data, &pkt.meta.vnet, &parsed) {
            return self.drop(r, trace);
        }

        if in_port.gro
            && parsed.proto == proto::TCP
            && parsed.frag.is_none()
            && parsed.l4_complete
            && !pkt.meta.vnet.is_gso()
            && parsed.ip_len() > usize::from(in_port.mtu)
        {
            mark_coalesced(&mut pkt, &parsed, in_port);
            self.stats.gro_marked += 1;
            trace.note("gro", || {
                format!(
                    "coalesced TCP super-packet, segment size {}",
                    pkt.meta.vnet.gso_size
                )
            });
        }

        // A whole packet, nearly every one, stays where it is instead of going through
        // defrag and back.
        let (mut pkt, mut parsed) = if parsed.frag.is_none() {
            (pkt, parsed)
        } else {
            match self.defrag(pkt, parsed, trace) {
                Ok(p) => p,
                Err(v) => return v,
            }
        };

        // Decap: VXLAN to this node arrives on the overlay's uplink; the inner frame goes
        // on as if received from a tunnel port in the uplink's zone.
        let mut tunnel_peer = None;
        if let Some(ov) = &tables.overlay
            && in_id == ov.uplink
            && parsed.proto == proto::UDP
            && parsed.l4_complete
            && parsed.key.dst_port == ov.port
            && tables.node.addresses.contains(&parsed.key.dst.ip())
        {
            if pkt.meta.vnet.is_gso() {
                return self.decap_gso(tables, pkt, &parsed, ov, out, trace);
            }
            let peer = parsed.key.src;
            let (inner, inner_parsed) = match self.decap(&pkt, &parsed, parsed.l4_off + 8, ov) {
                Ok(i) => i,
                Err(r) => return self.drop(r, trace),
            };
            self.stats.decapsulated += 1;
            trace.note("decap", || {
                format!(
                    "VXLAN vni {} from node {peer}: {}",
                    ov.vni, inner_parsed.key
                )
            });
            if let Err(r) = check_offload(&inner.data, &inner.meta.vnet, &inner_parsed) {
                return self.drop(r, trace);
            }
            (pkt, parsed) = if inner_parsed.frag.is_none() {
                (inner, inner_parsed)
            } else {
                match self.defrag(inner, inner_parsed, trace) {
                    Ok(p) => p,
                    Err(v) => return v,
                }
            };
            tunnel_peer = Some(peer);
        } else if inner_csum {
            return self.drop(DropReason::CsumOffloadInvalid, trace);
        }
        self.forward(tables, pkt, parsed, tunnel_peer.map(|p| p.ip()), out, trace)
    }

    /// A UDP GSO super-frame of VXLAN datagrams from a peer node (one that segmented
    /// its encapsulated packets as a super-frame, see [`overlay::encapsulate_run`]):
    /// its UDP payload is cut at `gso_size` into the datagrams' payloads, and each is
    /// decapsulated as if it had come alone (the outer UDP checksum is not verified, as
    /// for a single datagram). The inner TCP segments of one flow among them are then
    /// coalesced straight out of the super-frame ([`gro::Coalescer`], as Linux's GRO does
    /// behind a vxlan device: one copy of each) and go
    /// through the rest of the pipeline as one GSO packet: one conntrack lookup and one
    /// write to a pod's TAP per run instead of per segment. Anything else (fragments,
    /// other protocols) goes on alone, in order. The verdict is `Forwarded` when any
    /// inner packet was, else the last one's.
    fn decap_gso(
        &mut self,
        tables: &Tables,
        mut pkt: Packet,
        parsed: &Parsed,
        ov: &crate::tables::Overlay,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let v = pkt.meta.vnet;
        let size = usize::from(v.gso_size);
        let payload = parsed.l4_off + 8;
        let datagrams = (parsed.ip_end - payload).div_ceil(size.max(1));
        if v.gso_type != VnetHdr::GSO_UDP_L4
            || size <= vxlan::LEN
            || datagrams > gso::MAX_SEGMENTS_UDP
        {
            return self.drop(DropReason::GsoMalformed, trace);
        }
        self.stats.decap_gso_frames += 1;
        let peer = parsed.key.src;
        trace.note("decap", || {
            format!("UDP GSO super-frame from node {peer}: {datagrams} datagrams of {size} bytes")
        });
        let mut verdict = Verdict::Dropped(DropReason::GsoMalformed);
        // The datagrams share the outer headers: the peer is checked once, each datagram
        // counted as a drop when it is unknown.
        if ov.peer_index(peer.ip()).is_none() {
            for _ in 0..datagrams {
                combine(&mut verdict, self.drop(DropReason::VxlanUnknownPeer, trace));
            }
            return verdict;
        }
        // TCP segments go to the coalescer straight from the super-frame; `segments`
        // counts those offered since it was last emptied.
        let mut run = gro::Coalescer::default();
        let mut segments = 0;
        // The outer header, and so its ECN field and UDP checksum, is every datagram's.
        let outer_ecn = overlay::ecn_of(&pkt.data[parsed.l3_off..]);
        let outer_csum = outer_udp_checksum(&pkt, parsed);
        for start in (payload..parsed.ip_end).step_by(size) {
            let end = (start + size).min(parsed.ip_end);
            let decapped =
                self.decap_inner(&pkt, start, end, outer_csum, ov)
                    .and_then(|(at, ip, m)| {
                        let l3 = at + ip.l3_off;
                        decap_ecn(outer_ecn, &mut pkt.data[l3..at + ip.ip_end])?;
                        Ok((at, ip, m))
                    });
            let (at, inner_parsed, meta) = match decapped {
                Ok(i) => i,
                Err(r) => {
                    combine(&mut verdict, self.drop(r, trace));
                    continue;
                }
            };
            self.stats.decapsulated += 1;
            let frame = &pkt.data[at..at + inner_parsed.ip_end];
            if let Err(r) = check_offload(frame, &meta.vnet, &inner_parsed) {
                combine(&mut verdict, self.drop(r, trace));
                continue;
            }
            if inner_parsed.proto == proto::TCP && inner_parsed.frag.is_none() {
                run.push_frame(frame, &inner_parsed, &meta);
                segments += 1;
                continue;
            }
            if segments > 0 {
                let v = self.forward_run(
                    tables,
                    std::mem::take(&mut run),
                    segments,
                    peer.ip(),
                    out,
                    trace,
                );
                combine(&mut verdict, v);
                segments = 0;
            }
            let inner = Packet {
                data: frame.to_vec(),
                meta,
            };
            let v = if inner_parsed.frag.is_none() {
                self.forward(tables, inner, inner_parsed, Some(peer.ip()), out, trace)
            } else {
                match self.defrag(inner, inner_parsed, trace) {
                    Ok((p, pp)) => self.forward(tables, p, pp, Some(peer.ip()), out, trace),
                    Err(v) => v,
                }
            };
            combine(&mut verdict, v);
        }
        if segments > 0 {
            let v = self.forward_run(tables, run, segments, peer.ip(), out, trace);
            combine(&mut verdict, v);
        }
        verdict
    }

    /// Forwards what the coalescer `run` made of `segments` decapsulated TCP segments;
    /// the verdict is `Forwarded` when any was.
    fn forward_run(
        &mut self,
        tables: &Tables,
        run: gro::Coalescer,
        segments: usize,
        peer: IpAddr,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let merged = run.finish();
        self.stats.decap_coalesced += (segments - merged.len()) as u64;
        trace.note("gro", || {
            format!(
                "{segments} TCP segments coalesced into {} packets",
                merged.len()
            )
        });
        let mut verdict = Verdict::Dropped(DropReason::GsoMalformed);
        for p in merged {
            let v = match parse(&p.data, p.meta.zone) {
                Ok(pp) => self.forward(tables, p, pp, Some(peer), out, trace),
                Err(r) => self.drop(r, trace),
            };
            combine(&mut verdict, v);
        }
        verdict
    }

    /// The stages after decapsulation: source checks, neighbour discovery, TTL,
    /// conntrack with NAT and Services, routing, MTU, then [`Pipeline::deliver`].
    fn forward(
        &mut self,
        tables: &Tables,
        mut pkt: Packet,
        mut parsed: Parsed,
        tunnel_peer: Option<IpAddr>,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let in_id = pkt.meta.in_port;
        let in_port = &tables.ports[usize::from(in_id)];
        if tunnel_peer.is_none() && in_port.kind == PortKind::Pod {
            if !source_is_pods(in_port, &pkt, &parsed) {
                return self.drop(DropReason::SourceSpoofed, trace);
            }
            trace.note("source", || "pod's own MAC and address".to_string());
        }
        if tunnel_peer.is_none() && in_port.kind != PortKind::Plain {
            match nd::parse(&pkt.data, &parsed) {
                Err(r) => return self.drop(r, trace),
                Ok(Some(m)) => return self.nd(&pkt, &parsed, m, out, trace),
                Ok(None) => {}
            }
        }
        if in_port.kind != PortKind::Plain && !forwardable(&parsed, &tables.fib) {
            return self.drop(DropReason::NotForwardable, trace);
        }

        if parsed.ttl <= 1 {
            // Quote the packet as it arrived, before any NAT.
            self.icmp_error(
                &pkt,
                &parsed,
                ErrorKind::TimeExceeded,
                false,
                tunnel_peer,
                out,
                trace,
            );
            return self.drop(DropReason::TtlExceeded, trace);
        }

        // From this node's pods or its own stack: external traffic from here ignores
        // externalTrafficPolicy (kube-proxy's short-circuit of pod and local sources).
        let from_host = tunnel_peer.is_none() && in_port.kind == PortKind::Host;
        let source = if from_host || (tunnel_peer.is_none() && in_port.kind == PortKind::Pod) {
            Source::Node
        } else if tunnel_peer.is_some() {
            Source::Tunnel
        } else {
            Source::Network
        };
        let before = parsed.key;
        let now = pkt.meta.time_ns;
        // A packet that starts a connection to a Service frontend is load balanced;
        // static NAT rules apply to one that starts any other connection (a pod egress
        // masquerade rule must not turn Services off). Both are decided only for a
        // packet that starts a connection: packets of known connections follow their
        // entry and pay neither the Service lookup nor the rules.
        let mut frontend: Option<Frontend> = None;
        let mut balanced: Option<Balanced> = None;
        let mut static_nat: Option<Nat> = None;
        let affinity = &self.affinity;
        let mut result = self.ct.process_with(&mut pkt, &mut parsed, now, |key, to| {
            let f = tables.services.frontend(key).or_else(|| {
                from_host
                    .then(|| tables.services.host_node_port(key))
                    .flatten()
            });
            let Some(f) = f else {
                static_nat = Self::nat_for(tables, in_id, key);
                *to = static_nat;
                return Ok(());
            };
            frontend = Some(f);
            let b = balance(tables, f, key, source, affinity, now)?;
            *to = Some(b.nat);
            balanced = Some(b);
            Ok(())
        });
        // The result is read where `process_with` wrote it, by reference: moved out, it
        // would be copied whole, pending connection included (also when it holds none), in
        // moves that wait for `process_with`'s narrower stores to reach the cache.
        let ct = match &mut result {
            Ok(r) => r,
            Err(r) => {
                let r = *r;
                let no_endpoint = matches!(
                    r,
                    DropReason::ServiceNoEndpoints | DropReason::ServiceNoLocalEndpoints
                );
                if let Some(f) = frontend.filter(|_| no_endpoint) {
                    trace.note("service", || {
                        let svc = &tables.services.services[f.service as usize];
                        format!(
                            "{} ({:?}): no endpoint to send {} to",
                            svc.name, f.scope, before
                        )
                    });
                }
                if let Some(f) = frontend.filter(|_| r == DropReason::ServiceNoNodeAddress) {
                    trace.note("service", || {
                        let svc = &tables.services.services[f.service as usize];
                        format!(
                            "{} ({:?}): {} must leave from this node's address, and it has none of the family",
                            svc.name, f.scope, before
                        )
                    });
                }
                if r == DropReason::ServiceNoEndpoints {
                    self.reject(&pkt, &parsed, out, trace);
                }
                return self.drop(r, trace);
            }
        };
        // A Service connection counts, and its client's affinity record is written, only
        // once conntrack has a connection for it (a NAT refusal, say a clash, leaves none).
        if ct.pending.is_none() {
            balanced = None;
        }
        if let (Some(b), Some(f)) = (&balanced, frontend) {
            self.stats.service_balanced += 1;
            tables
                .services
                .remember(f, &before, b.backend, &mut self.affinity, now);
            trace.note("service", || {
                let svc = &tables.services.services[f.service as usize];
                let how = match (b.nat.snat, b.mark & lb::MARK_TUNNEL != 0) {
                    (Some((a, _)), _) if b.hairpin => format!(", hairpin: source NAT to {a}"),
                    (Some((a, _)), _) => format!(", source NAT to {a}"),
                    (None, true) => ", client address kept, through the tunnel so that replies return through this node".to_string(),
                    (None, false) => String::new(),
                };
                let be = &svc.backends[b.backend];
                let node = be.node.as_deref().map_or(String::new(), |n| format!(" on node {n}"));
                format!(
                    "{} ({} frontend {}) -> endpoint {}{node}{how}",
                    svc.name,
                    match f.scope {
                        Scope::Internal => "cluster IP",
                        Scope::External => "external",
                    },
                    SockAddr(before.dst.ip(), before.dst_port),
                    SockAddr(be.addr, be.port)
                )
            });
        }
        trace.ct = Some((ct.state, ct.reply));
        if trace.enabled {
            trace.key = Some(before);
        }
        if let (Some(n), Some(_)) = (&static_nat, &ct.pending) {
            trace.note("nat", || {
                let mut v = Vec::new();
                if let Some((a, p)) = n.dnat {
                    v.push(match p {
                        Some(p) => format!("destination to {}", SockAddr(a.ip(), p)),
                        None => format!("destination to {a}"),
                    });
                }
                if let Some((a, r)) = n.snat {
                    v.push(match r {
                        Some((lo, hi)) => format!("source to {a} ports {lo}-{hi}"),
                        None => format!("source to {a}"),
                    });
                }
                if v.is_empty() {
                    v.push("no translation".into());
                }
                format!("static rule: {}", v.join(", "))
            });
        }
        trace.note("ct", || {
            let dir = if ct.reply { " reply" } else { "" };
            let nat = if before != parsed.key {
                format!(", translated to {}", parsed.key)
            } else {
                String::new()
            };
            format!("{}{dir}{nat}", ct.state.name())
        });
        if ct.state == CtState::Invalid && !tables.ct.pass_invalid {
            return self.drop(DropReason::CtInvalid, trace);
        }
        let pending = &mut ct.pending;
        if let (Some(b), Some(p)) = (&balanced, pending.as_mut()) {
            p.entry_mut().mark |= b.mark;
        }
        // External traffic balanced to another node's endpoint with the client address
        // kept must reach that node through the tunnel, whatever the overlay mode, so that
        // its replies come back here to be translated.
        let force_tunnel = match (&*pending, ct.entry) {
            (Some(p), _) => p.entry().mark & lb::MARK_TUNNEL != 0,
            (None, Some(id)) if !ct.reply => self
                .ct
                .get(id)
                .is_some_and(|e| e.mark & lb::MARK_TUNNEL != 0),
            _ => false,
        };
        // The connection remembers the node its original direction came through, so
        // that replies return through that node (which undoes its NAT).
        if let Some(peer) = tunnel_peer {
            if let Some(p) = pending.as_mut() {
                p.entry_mut().set_tunnel_peer(Some(peer));
            } else if !ct.reply
                && let Some(e) = ct.entry.and_then(|id| self.ct.get_mut(id))
            {
                e.set_tunnel_peer(Some(peer));
            }
        }
        let reply_peer = if ct.reply {
            ct.entry
                .and_then(|id| self.ct.get(id))
                .and_then(|e| e.tunnel_peer())
        } else {
            None
        };

        let Some(target) = tables.fib.lookup(parsed.key.dst.ip()).copied() else {
            return self.drop(DropReason::NoRoute, trace);
        };
        // None: an address of this node's pod CIDRs that no pod has.
        let mut route = target.route();
        if force_tunnel
            && !route.is_some_and(|r| matches!(r.next_hop, NextHop::Tunnel(_)))
            && let Some(ov) = &tables.overlay
            && let Some(i) = ov.peer_for_endpoint(parsed.key.dst.ip())
        {
            route = Some(Route {
                port: ov.uplink,
                next_hop: NextHop::Tunnel(i),
            });
        }
        // Also when the reply's destination is one of this node's pods: a pod that
        // reached another node's node port was translated there, and only that node can
        // undo it. A reply that came from that node itself is not sent back to it (it
        // lost the connection, and would return it here).
        if let (Some(peer), Some(ov)) = (reply_peer, &tables.overlay)
            && tunnel_peer != Some(peer)
            && let Some(i) = ov.peer_index(peer)
        {
            route = Some(Route {
                port: ov.uplink,
                next_hop: NextHop::Tunnel(i),
            });
        }
        let Some(Route {
            port: out_id,
            next_hop,
        }) = route
        else {
            trace.note("route", || {
                format!(
                    "{} -> nowhere: in this node's pod CIDRs, and no pod has it",
                    parsed.key.dst.ip()
                )
            });
            // As for "too big": a connection translated on its way here is kept, so that
            // the error, quoting the translated packet, is translated back for the
            // sender. Nothing is kept for one that was not translated (a scan of the pod
            // CIDRs must not fill the connection table).
            let translated = parsed.key != before;
            if translated && let Err(r) = self.commit(pending, now, trace) {
                return self.drop(r, trace);
            }
            // IPv4 host unreachable, ICMPv6 address unreachable.
            let code = if parsed.l3 == L3::Ipv4 { 1 } else { 3 };
            let kind = ErrorKind::Unreachable { code };
            self.icmp_error(&pkt, &parsed, kind, translated, tunnel_peer, out, trace);
            return self.drop(DropReason::NoSuchPod, trace);
        };
        let out_port = &tables.ports[usize::from(out_id)];
        trace.note("route", || match next_hop {
            NextHop::Tunnel(i) => format!(
                "{} -> node {} through the overlay",
                parsed.key.dst,
                tables
                    .overlay
                    .as_ref()
                    .map_or("?", |o| &o.peers[usize::from(i)].name)
            ),
            _ => format!("{} -> port {}", parsed.key.dst, out_port.name),
        });

        // Encapsulated packets must fit the uplink with the outer headers: the MTU that
        // counts for them (and that ICMP reports) is the uplink's minus the overhead.
        let mtu = match (next_hop, &tables.overlay) {
            (NextHop::Tunnel(i), Some(ov)) => overlay::inner_mtu(
                out_port.mtu,
                ov.peers[usize::from(i)].address.is_ipv6(),
                parsed.l3_off,
            ),
            _ => usize::from(out_port.mtu),
        };
        let mru = usize::from(pkt.meta.mru);
        let gso = pkt.meta.vnet.is_gso();
        let uso = pkt.meta.vnet.gso_type & !VnetHdr::GSO_ECN == VnetHdr::GSO_UDP_L4;
        // Fragmenting in transit is allowed only for IPv4 without DF (RFC 8200 forbids it
        // for IPv6).
        let may_fragment = parsed.l3 == L3::Ipv4 && !parsed.dont_fragment;
        let too_big = if gso {
            // TCP segments shrink to fit; a USO datagram is one application message and
            // cannot be resized.
            uso && largest_datagram(&pkt, &parsed) > mtu && !may_fragment
        } else if mru != 0 {
            // A reassembled datagram leaves as fragments no larger than those that came
            // in; if those do not fit the MTU, fragmenting them further is in transit.
            mru > mtu && !may_fragment
        } else {
            parsed.ip_len() > mtu && !may_fragment
        };
        trace.note("mtu", || {
            let len = if gso {
                format!("GSO packet, segment size {}", pkt.meta.vnet.gso_size)
            } else if mru != 0 {
                format!("{} bytes reassembled, mru {mru}", parsed.ip_len())
            } else {
                format!("{} bytes", parsed.ip_len())
            };
            let what = if too_big {
                "too big, and may not be fragmented"
            } else if gso || parsed.ip_len() <= mtu.min(if mru != 0 { mru } else { mtu }) {
                "fits"
            } else {
                "to be cut to fit"
            };
            let inner = if matches!(next_hop, NextHop::Tunnel(_)) {
                " (inside the tunnel)"
            } else {
                ""
            };
            format!("mtu {mtu}{inner} on {}: {len}, {what}", out_port.name)
        });
        if too_big {
            // The connection is kept although this packet is not sent, so that the error,
            // which quotes the translated packet, is translated back for the sender; the
            // sender retries smaller on the same connection.
            if let Err(r) = self.commit(pending, now, trace) {
                return self.drop(r, trace);
            }
            let kind = ErrorKind::TooBig { mtu: mtu as u32 };
            self.icmp_error(&pkt, &parsed, kind, true, tunnel_peer, out, trace);
            return self.drop(DropReason::TooBig, trace);
        }

        let routing = Routing {
            port: out_id,
            hop: next_hop,
            mtu,
            tunnel_peer,
        };
        self.deliver(tables, pkt, &parsed, routing, pending, now, out, trace)
    }

    /// The stages after routing, for a packet routed just now (with the connection it
    /// starts, if any) and for one that waited for its neighbour: next-hop resolution
    /// (the packet is queued when its neighbour has no MAC yet), commit, TTL, L2 rewrite,
    /// encap, egress MTU (segmentation, checksum completion, fragmentation).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn deliver(
        &mut self,
        tables: &Tables,
        mut pkt: Packet,
        parsed: &Parsed,
        routing: Routing,
        pending: &mut Option<Pending>,
        now: u64,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let Routing {
            port: out_id,
            hop,
            mtu,
            ..
        } = routing;
        // Read where `resolve` wrote it: moved out, it would be copied in 16-byte moves
        // that wait for its narrower stores to reach the cache.
        let resolved = self.resolve(tables, out_id, hop, parsed, now, out, trace);
        let egress = match &resolved {
            Ok(e) => e,
            Err(NoEgress::Drop(r)) => return self.drop(*r, trace),
            Err(NoEgress::Unresolved { port, ip, probed }) => {
                let (port, ip, probed) = (*port, *ip, *probed);
                // Committed now, as if sent: a reply that overtakes the queued packet
                // (or the next packet of the connection) finds it.
                if let Err(r) = self.commit(pending, now, trace) {
                    return self.drop(r, trace);
                }
                let routed = Routed {
                    pkt,
                    parsed: *parsed,
                    routing,
                };
                return self.park(port, ip, probed, routed, now, trace);
            }
        };
        if let Err(r) = self.commit(pending, now, trace) {
            return self.drop(r, trace);
        }
        // For trace notes only: not looked up otherwise.
        let out_name = || tables.ports[usize::from(out_id)].name.as_str();
        let mru = usize::from(pkt.meta.mru);
        let gso = pkt.meta.vnet.is_gso();
        let uso = pkt.meta.vnet.gso_type & !VnetHdr::GSO_ECN == VnetHdr::GSO_UDP_L4;

        decrement_ttl(&mut pkt.data, parsed);
        pkt.data[0..6].copy_from_slice(&egress.dst_mac);
        pkt.data[6..12].copy_from_slice(&egress.src_mac);
        if let Some(o) = &egress.tunnel {
            trace.note("encap", || {
                let node = tables
                    .overlay
                    .as_ref()
                    .and_then(|ov| ov.peer_index(o.dst).map(|i| &ov.peers[usize::from(i)]))
                    .map_or(String::new(), |p| format!(" to node {}", p.name));
                format!(
                    "VXLAN vni {}{node}: {} -> {}, udp source port {}, inner mtu {mtu}",
                    o.vni,
                    o.src,
                    o.dst,
                    overlay::source_port(o.hash)
                )
            });
        }

        if gso {
            let headers = gso_headers(&pkt.data, parsed);
            let fits = if uso {
                largest_datagram(&pkt, parsed) <= mtu
            } else {
                headers + usize::from(pkt.meta.vnet.gso_size) <= mtu
            };
            if egress.gso && (fits || !uso) {
                // The receiving kernel segments at gso_size: never above the MTU, and
                // into no more segments than ferry would cut.
                if !fits {
                    let max = mtu - headers.min(mtu);
                    let payload = parsed.ip_end - parsed.l3_off - headers;
                    if max == 0 || payload.div_ceil(max) > gso::MAX_SEGMENTS_TCP {
                        return self.drop(DropReason::MtuTooSmall, trace);
                    }
                    pkt.meta.vnet.gso_size = max as u16;
                }
                trace.note("egress", || {
                    format!(
                        "GSO packet sent whole to {}, segment size {}",
                        out_name(),
                        pkt.meta.vnet.gso_size
                    )
                });
                self.emit(egress, pkt, out);
                return Verdict::Forwarded;
            }
            if egress.tunnel.is_some() && egress.uso {
                let cut = match gso::Segmenter::new(&pkt, parsed, mtu) {
                    Ok(c) => c,
                    Err(r) => return self.drop(r, trace),
                };
                // The first segment is the longest; a UDP datagram longer than the MTU
                // is fragmented below instead.
                if cut.len(0) - cut.l3_off() <= mtu {
                    return self.emit_super_frames(
                        egress,
                        &cut,
                        pkt.meta,
                        mtu,
                        out_name(),
                        out,
                        trace,
                    );
                }
            }
            let mut segs = std::mem::take(&mut self.scratch);
            segs.clear();
            if let Err(r) = gso::segment(&pkt, parsed, mtu, &mut segs) {
                self.scratch = segs;
                return self.drop(r, trace);
            }
            self.stats.segmented += 1;
            self.stats.segments_out += segs.len() as u64;
            trace.note("egress", || {
                format!(
                    "segmented into {} packets for mtu {mtu} on {}",
                    segs.len(),
                    out_name()
                )
            });
            let mut frags = Vec::new();
            for seg in segs.drain(..) {
                if seg.data.len() - parsed.l3_off <= mtu {
                    self.emit(egress, seg, out);
                    continue;
                }
                // A USO datagram larger than the MTU, IPv4 without DF: fragment it.
                frags.clear();
                let fragmented = parse(&seg.data, pkt.meta.zone)
                    .and_then(|sp| ipf::refragment(&seg, &sp, mtu, &mut frags));
                if let Err(r) = fragmented {
                    // One datagram of the packet lost, counted as any drop (against the
                    // ingress port too); the others go on, and the verdict is theirs.
                    let _ = self.drop(r, trace);
                    continue;
                }
                self.stats.fragments_out += frags.len() as u64;
                for f in frags.drain(..) {
                    self.emit(egress, f, out);
                }
            }
            self.scratch = segs;
            return Verdict::Forwarded;
        }

        let limit = if mru != 0 { mtu.min(mru) } else { mtu };
        let fragment = parsed.ip_len() > limit;
        if pkt.meta.vnet.needs_csum() && (!egress.gso || fragment) {
            let v = pkt.meta.vnet;
            if let Err(r) = checksum::complete_partial(
                &mut pkt.data,
                usize::from(v.csum_start),
                usize::from(v.csum_offset),
            ) {
                return self.drop(r, trace);
            }
            pkt.meta.vnet = VnetHdr::default();
        }

        if !fragment {
            trace.note("egress", || format!("sent to {}", out_name()));
            self.emit(egress, pkt, out);
            return Verdict::Forwarded;
        }

        let mut frags = std::mem::take(&mut self.scratch);
        frags.clear();
        if let Err(r) = ipf::refragment(&pkt, parsed, limit, &mut frags) {
            self.scratch = frags;
            return self.drop(r, trace);
        }
        self.stats.fragments_out += frags.len() as u64;
        trace.note("egress", || {
            let why = if mru != 0 {
                format!("refragmented to min(mru {mru}, mtu {mtu}) = {limit}")
            } else {
                format!("fragmented to mtu {mtu}")
            };
            format!("{why}: {} fragments to {}", frags.len(), out_name())
        });
        for f in frags.drain(..) {
            self.emit(egress, f, out);
        }
        self.scratch = frags;
        Verdict::Forwarded
    }

    /// Defrag: a fragment is held, or completes its datagram (re-parsed, key rebuilt).
    /// Its callers only call it for a fragment: moving a whole packet and its parse in
    /// and out again cost a tenth of a small packet's time through the pipeline.
    fn defrag(
        &mut self,
        pkt: Packet,
        parsed: Parsed,
        trace: &mut Trace,
    ) -> Result<(Packet, Parsed), Verdict> {
        if parsed.frag.is_none() {
            return Ok((pkt, parsed));
        }
        match self.ipf.process(pkt, &parsed, &mut self.drops) {
            ipf::Outcome::Held => {
                trace.note("ipf", || {
                    format!(
                        "held for reassembly ({} datagrams, {} bytes in flight)",
                        self.ipf.held_datagrams(),
                        self.ipf.held_bytes()
                    )
                });
                Err(Verdict::Held)
            }
            ipf::Outcome::Complete(p, pp) => {
                self.stats.reassembled += 1;
                trace.note("ipf", || {
                    format!(
                        "reassembled {} bytes, mru {}, key rebuilt: {}",
                        pp.ip_len(),
                        p.meta.mru,
                        pp.key
                    )
                });
                Ok((p, pp))
            }
            ipf::Outcome::Dropped(r) => {
                trace.note("ipf", || format!("refused: {r}"));
                Err(self.drop(r, trace))
            }
        }
    }

    /// Strips the outer headers of a VXLAN packet addressed to this node: only from a
    /// known node, only with the overlay's VNI. The outer UDP checksum is not verified
    /// (the inner packet has its own), as Linux's vxlan does not either.
    fn decap(
        &mut self,
        pkt: &Packet,
        parsed: &Parsed,
        vx_off: usize,
        ov: &crate::tables::Overlay,
    ) -> Result<(Packet, Parsed), DropReason> {
        let (at, inner, meta) = self.decap_view(pkt, parsed, vx_off, ov)?;
        let mut data = pkt.data[at..at + inner.ip_end].to_vec();
        let outer_ecn = overlay::ecn_of(&pkt.data[parsed.l3_off..]);
        decap_ecn(outer_ecn, &mut data[inner.l3_off..])?;
        Ok((Packet { data, meta }, inner))
    }

    /// [`Pipeline::decap`] without the copy: where in `pkt.data` the inner frame starts,
    /// its parse (offsets from that start) and its metadata.
    fn decap_view(
        &self,
        pkt: &Packet,
        parsed: &Parsed,
        vx_off: usize,
        ov: &crate::tables::Overlay,
    ) -> Result<(usize, Parsed, Meta), DropReason> {
        if ov.peer_index(parsed.key.src.ip()).is_none() {
            return Err(DropReason::VxlanUnknownPeer);
        }
        self.decap_inner(
            pkt,
            vx_off,
            parsed.ip_end,
            outer_udp_checksum(pkt, parsed),
            ov,
        )
    }

    /// [`Pipeline::decap_view`] once the outer source is known to be a peer: the VXLAN
    /// datagram whose header starts at `vx_off` and which ends at `ip_end`, its outer
    /// UDP checksum field `outer_csum`.
    fn decap_inner(
        &self,
        pkt: &Packet,
        vx_off: usize,
        ip_end: usize,
        outer_csum: u16,
        ov: &crate::tables::Overlay,
    ) -> Result<(usize, Parsed, Meta), DropReason> {
        let vx = vxlan::Repr::parse(pkt.data.get(vx_off..ip_end).unwrap_or(&[]))?;
        if vx.vni != ov.vni {
            return Err(DropReason::VxlanBadVni);
        }
        let start = vx_off + vxlan::LEN;
        let inner = parse(&pkt.data[start..ip_end], pkt.meta.zone)?;
        if inner.l3 == L3::Arp {
            return Err(DropReason::ArpNotHandled);
        }
        // A partial checksum of the inner packet moves with it (checked by the caller).
        // A partial outer checksum says the frame never left this host's memory (a
        // sender on the same host, through a veth): as Linux does for such a frame, its
        // contents count as verified, so coalescing does not sum the inner segments again.
        // Not when the outer UDP checksum is 0: the host's UDP GRO also leaves datagrams
        // it received from the wire and merged partial, and with no outer checksum
        // nothing verified what they carry.
        let v = pkt.meta.vnet;
        let vnet = if v.needs_csum() && usize::from(v.csum_start) >= start {
            VnetHdr {
                flags: VnetHdr::F_NEEDS_CSUM,
                csum_start: v.csum_start - start as u16,
                csum_offset: v.csum_offset,
                ..VnetHdr::default()
            }
        } else if v.needs_csum() && outer_csum != 0 {
            VnetHdr {
                flags: VnetHdr::F_DATA_VALID,
                ..VnetHdr::default()
            }
        } else {
            VnetHdr::default()
        };
        let meta = Meta {
            vnet,
            mru: 0,
            frag_id: 0,
            ..pkt.meta
        };
        Ok((start, inner, meta))
    }

    /// Where the frame goes at the link layer: the next hop's MAC (from the route, the
    /// neighbour table, or, for the overlay, the peer's VTEP with the outer headers to
    /// add). An unknown neighbour is probed (rate limited) and named in the error.
    #[allow(clippy::too_many_arguments)]
    fn resolve(
        &mut self,
        tables: &Tables,
        port: PortId,
        hop: NextHop,
        parsed: &Parsed,
        now: u64,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Result<Egress, NoEgress> {
        let p = &tables.ports[usize::from(port)];
        let plain = |dst_mac| Egress {
            port,
            dst_mac,
            src_mac: p.mac,
            gso: p.gso,
            uso: false,
            tunnel: None,
        };
        let l2 = |how: String, m: [u8; 6]| {
            move || {
                format!(
                    "{how}: to {} from {} on {}",
                    MacAddr(m),
                    MacAddr(p.mac),
                    p.name
                )
            }
        };
        match hop {
            NextHop::Mac(m) => {
                trace.note("l2", l2("route's next hop MAC".into(), m));
                Ok(plain(m))
            }
            NextHop::Via(a) => {
                let m = self.neighbour(port, a, now, out, trace)?;
                trace.note("l2", l2(format!("gateway {a}"), m));
                Ok(plain(m))
            }
            NextHop::Direct => {
                let m = self.neighbour(port, parsed.key.dst.ip(), now, out, trace)?;
                trace.note("l2", l2(format!("{} on-link", parsed.key.dst), m));
                Ok(plain(m))
            }
            NextHop::Tunnel(i) => {
                let ov = tables.overlay.as_ref().ok_or(DropReason::NoRoute)?;
                let peer = &ov.peers[usize::from(i)];
                let up = ov.uplink;
                let outer_mac = match peer.underlay {
                    NextHop::Mac(m) => m,
                    NextHop::Via(g) => self.neighbour(up, g, now, out, trace)?,
                    _ => self.neighbour(up, peer.address, now, out, trace)?,
                };
                let src = tables
                    .node
                    .addr(peer.address.is_ipv6())
                    .ok_or(DropReason::NoRoute)?;
                trace.note("l2", || {
                    format!(
                        "inner {} -> {}; outer to {} ({}) from {} on {}",
                        MacAddr(ov.vtep_mac),
                        MacAddr(peer.vtep_mac),
                        MacAddr(outer_mac),
                        peer.address,
                        MacAddr(tables.ports[usize::from(up)].mac),
                        tables.ports[usize::from(up)].name
                    )
                });
                Ok(Egress {
                    port: up,
                    dst_mac: peer.vtep_mac,
                    src_mac: ov.vtep_mac,
                    gso: false,
                    uso: tables.ports[usize::from(up)].gso,
                    tunnel: Some(overlay::Outer {
                        src_mac: tables.ports[usize::from(up)].mac,
                        dst_mac: outer_mac,
                        src,
                        dst: peer.address,
                        vni: ov.vni,
                        port: ov.port,
                        hash: overlay::flow_hash(&parsed.key),
                        // Given when the packet is encapsulated: `Pipeline::outer_ids`.
                        id: 0,
                    }),
                })
            }
        }
    }

    /// The MAC of `ip` on `port` from the neighbour table; probes when it says so.
    fn neighbour(
        &mut self,
        port: PortId,
        ip: IpAddr,
        now: u64,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Result<[u8; 6], NoEgress> {
        let r = self.neigh.resolve(port, ip, now)?;
        if let Some(probe) = r.probe {
            let tables = Arc::clone(&self.tables);
            let p = &tables.ports[usize::from(port)];
            let to = match probe {
                neigh::Probe::Broadcast => None,
                neigh::Probe::Unicast(m) => Some(m),
            };
            let source = neigh::probe_source(p, ip);
            let frame = match ip {
                IpAddr::V4(target) => arp::Repr {
                    op: arp::REQUEST,
                    sender_mac: p.mac,
                    sender_ip: match source {
                        Some(IpAddr::V4(a)) => a,
                        _ => Ipv4Addr::UNSPECIFIED,
                    },
                    target_mac: [0; 6],
                    target_ip: target,
                }
                .frame(to.unwrap_or([0xff; 6]), p.mac, None),
                IpAddr::V6(target) => {
                    let src = source
                        .and_then(nd::v6)
                        .unwrap_or_else(|| nd::link_local(p.mac));
                    match to {
                        Some(m) => nd::solicit_unicast(m, p.mac, None, src, target),
                        None => nd::solicit(p.mac, None, src, target),
                    }
                }
            };
            self.stats.neigh_probes += 1;
            if let Some(m) = to {
                // Unknown ones are noted with the packet queued for them.
                trace.note("neigh", || {
                    format!(
                        "{ip} not confirmed on {}: probe sent to {}",
                        p.name,
                        MacAddr(m)
                    )
                });
            }
            self.send(port, Packet::new(frame, port, now), out);
        }
        match r.mac {
            Some(m) => Ok(m),
            None => Err(NoEgress::Unresolved {
                port,
                ip,
                probed: r.probe.is_some(),
            }),
        }
    }

    /// Queues a routed packet until the neighbour `ip` on `port` answers (see
    /// [`neigh::Queue`]); older ones may be pushed out.
    fn park(
        &mut self,
        port: PortId,
        ip: IpAddr,
        probed: bool,
        routed: Routed,
        now: u64,
        trace: &mut Trace,
    ) -> Verdict {
        let bytes = routed.pkt.data.len();
        let pushed_out = match self.parked.push(port, ip, routed, bytes, now) {
            Ok(n) => n as u64,
            Err(_) => return self.drop(DropReason::NeighQueueOverflow, trace),
        };
        self.drops.add(DropReason::NeighQueueOverflow, pushed_out);
        self.stats.neigh_queue_overflow += pushed_out;
        self.stats.neigh_queued += 1;
        self.stats.neigh_waiting = self.parked.len() as u64;
        if trace.enabled {
            trace.waiting_for = Some((port, ip));
        }
        trace.note("neigh", || {
            let asked = match (probed, ip) {
                (true, IpAddr::V4(_)) if self.dry_run => "an ARP request would be sent",
                (true, IpAddr::V6(_)) if self.dry_run => "a neighbour solicitation would be sent",
                (true, IpAddr::V4(_)) => "ARP request sent",
                (true, IpAddr::V6(_)) => "neighbour solicitation sent",
                (false, _) => "asked already",
            };
            let pushed = if pushed_out > 0 {
                format!(", {pushed_out} older pushed out")
            } else {
                String::new()
            };
            format!(
                "queued: next hop {ip} unresolved on {} ({asked}); {} waiting for it{pushed}",
                self.tables.ports[usize::from(port)].name,
                self.parked.waiting_for(port, ip)
            )
        });
        Verdict::Queued
    }

    /// Records what ARP or ND says of a neighbour (see [`Neighbours::learn`]; an entry
    /// that packets wait for is asked for, so created if missing and there is room) and,
    /// once the entry has a MAC, sends the packets that waited for it, oldest first.
    #[allow(clippy::too_many_arguments)]
    fn learned(
        &mut self,
        port: PortId,
        ip: IpAddr,
        mac: Option<[u8; 6]>,
        now: u64,
        update: neigh::Update,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) {
        let waiting = self.parked.contains(port, ip);
        let update = neigh::Update {
            create: update.create || waiting,
            ..update
        };
        self.neigh.learn(port, ip, mac, now, update);
        // Not released without an entry that has a MAC (an advertisement without one, a
        // full table): they would only be queued again.
        let Some(mac) = self
            .neigh
            .get(port, ip)
            .filter(|n| n.state != neigh::State::Incomplete)
            .map(|n| n.mac)
        else {
            return;
        };
        if !waiting {
            return;
        }
        let tables = Arc::clone(&self.tables);
        let rx_port = self.rx_port;
        let released = self.parked.take(port, ip);
        self.stats.neigh_waiting = self.parked.len() as u64;
        for routed in released {
            self.stats.neigh_released += 1;
            // Drops on the way are the packet's, counted against the port it came in on.
            self.rx_port = usize::from(routed.pkt.meta.in_port);
            trace.note("neigh", || {
                format!(
                    "{ip} is at {}: sending {} that waited for it",
                    MacAddr(mac),
                    routed.parsed.key
                )
            });
            let Routed {
                pkt,
                parsed,
                routing,
            } = routed;
            self.deliver(&tables, pkt, &parsed, routing, &mut None, now, out, trace);
        }
        self.rx_port = rx_port;
    }

    /// The segments of a GSO packet through the overlay, for an uplink that takes UDP
    /// GSO: written straight into as few UDP GSO super-frames as hold them
    /// ([`overlay::encapsulate_run`]), which the kernel (or the NIC) cuts into the
    /// VXLAN datagrams.
    #[allow(clippy::too_many_arguments)]
    fn emit_super_frames(
        &mut self,
        egress: &Egress,
        cut: &gso::Segmenter<'_>,
        meta: Meta,
        mtu: usize,
        out_name: &str,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let Some(o) = &egress.tunnel else {
            return self.drop(DropReason::NoRoute, trace);
        };
        let n = cut.count();
        self.stats.segmented += 1;
        self.stats.segments_out += n as u64;
        trace.note("egress", || {
            format!("segmented into {n} packets for mtu {mtu} on {out_name}")
        });
        let mut frames = Vec::new();
        let o = overlay::Outer {
            id: self.outer_ids(n),
            ..*o
        };
        overlay::encapsulate_run(cut, &o, &mut frames);
        self.stats.encapsulated += n as u64;
        let supers = frames.iter().filter(|(_, v)| v.is_gso()).count();
        self.stats.encap_gso_frames += supers as u64;
        trace.note("encap", || {
            format!(
                "{n} datagrams in {} frames, {supers} of them UDP GSO super-frames for {out_name} to cut",
                frames.len()
            )
        });
        let meta = Meta {
            vnet: VnetHdr::default(),
            mru: 0,
            frag_id: 0,
            ..meta
        };
        for (data, vnet) in frames {
            let pkt = Packet {
                data,
                meta: Meta { vnet, ..meta },
            };
            self.send(egress.port, pkt, out);
        }
        Verdict::Forwarded
    }

    /// The first of `n` outer IPv4 identifications, taken from the pipeline's counter.
    fn outer_ids(&mut self, n: usize) -> u16 {
        let id = self.outer_id;
        self.outer_id = id.wrapping_add(n as u16);
        id
    }

    /// Sends a packet as the egress says: encapsulated when it goes through the overlay.
    fn emit(&mut self, egress: &Egress, mut pkt: Packet, out: &mut Vec<(PortId, Packet)>) {
        if let Some(o) = &egress.tunnel {
            let o = overlay::Outer {
                id: self.outer_ids(1),
                ..*o
            };
            pkt.data = overlay::encapsulate(&pkt.data, &o);
            pkt.meta.vnet = VnetHdr::default();
            pkt.meta.mru = 0;
            pkt.meta.frag_id = 0;
            self.stats.encapsulated += 1;
        }
        self.send(egress.port, pkt, out);
    }

    /// ARP: answered on pod ports for any address (proxy ARP: the node is every pod's
    /// only neighbour) and on uplink/host ports for the node's own addresses; learned
    /// from on uplink/host ports; never forwarded.
    fn arp(
        &mut self,
        pkt: &Packet,
        parsed: &Parsed,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let tables = Arc::clone(&self.tables);
        let in_id = pkt.meta.in_port;
        let port = &tables.ports[usize::from(in_id)];
        if port.kind == PortKind::Plain {
            return self.drop(DropReason::ArpNotHandled, trace);
        }
        let a = match arp::Repr::parse(&pkt.data[parsed.l3_off..]) {
            Ok(a) => a,
            Err(r) => return self.drop(r, trace),
        };
        let now = pkt.meta.time_ns;
        let sender = IpAddr::V4(a.sender_ip);
        let target = IpAddr::V4(a.target_ip);
        let answer = if port.kind == PortKind::Pod {
            let pm = port.peer_mac;
            if pm != Some(mac_at(&pkt.data, 6))
                || pm != Some(a.sender_mac)
                || !(a.sender_ip.is_unspecified() || port.addresses.contains(&sender))
            {
                return self.drop(DropReason::SourceSpoofed, trace);
            }
            // Not for the pod's own address: that is a gratuitous ARP or a duplicate
            // address probe, and answering it would make the pod give up its address.
            a.op == arp::REQUEST && a.target_ip != a.sender_ip && !port.addresses.contains(&target)
        } else {
            let ours = port.addresses.contains(&target)
                || (tables.overlay.as_ref().is_some_and(|o| o.uplink == in_id)
                    && tables.node.addresses.contains(&target));
            if a.op != arp::REQUEST && a.op != arp::REPLY {
                trace.note("arp", || format!("op {}: not acted on", a.op));
                return Verdict::Consumed;
            }
            if !a.sender_ip.is_unspecified() {
                // Create an entry only for a node that talks to us; refresh any. Only a
                // reply to this node's MAC (an answer to its probe) says the sender
                // answers: a request, or a broadcast or gratuitous reply, says where it
                // is, as Linux's `arp_process` has it.
                let request = ours && a.op == arp::REQUEST;
                let answer = a.op == arp::REPLY
                    && mac_at(&pkt.data, 0) == port.mac
                    && a.sender_ip != a.target_ip;
                let update = neigh::Update {
                    state: if answer {
                        neigh::State::Reachable
                    } else {
                        neigh::State::Stale
                    },
                    override_mac: true,
                    create: request,
                };
                self.learned(in_id, sender, Some(a.sender_mac), now, update, out, trace);
            }
            ours && a.op == arp::REQUEST
        };
        if !answer {
            trace.note("arp", || {
                format!(
                    "op {} {} -> {}: not answered",
                    a.op, a.sender_ip, a.target_ip
                )
            });
            return Verdict::Consumed;
        }
        let reply = arp::Repr {
            op: arp::REPLY,
            sender_mac: port.mac,
            sender_ip: a.target_ip,
            target_mac: a.sender_mac,
            target_ip: a.sender_ip,
        }
        .frame(a.sender_mac, port.mac, parsed.vlan);
        self.stats.arp_answered += 1;
        trace.note("arp", || {
            format!(
                "{} is at {} (answered to {})",
                a.target_ip,
                MacAddr(port.mac),
                a.sender_ip
            )
        });
        self.send(in_id, Packet::new(reply, in_id, now), out);
        Verdict::Consumed
    }

    /// Neighbour discovery: like ARP. A pod port answers every solicitation (router
    /// flag set) except for the pod's own addresses and duplicate address detection;
    /// uplink and host ports answer for the node's addresses (a duplicate address probe
    /// for one to all nodes) and learn. A message that came in fragments is dropped.
    fn nd(
        &mut self,
        pkt: &Packet,
        parsed: &Parsed,
        msg: nd::Message,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        // Reassembled (no node fragments ND): fragments are how a message slips past
        // filters that look at the first fragment only (RFC 6980 section 5).
        if pkt.meta.mru != 0 {
            return self.drop(DropReason::NdFragmented, trace);
        }
        let tables = Arc::clone(&self.tables);
        let in_id = pkt.meta.in_port;
        let port = &tables.ports[usize::from(in_id)];
        let now = pkt.meta.time_ns;
        let Some(src) = nd::v6(parsed.key.src.ip()) else {
            return Verdict::Consumed;
        };
        let src_mac = mac_at(&pkt.data, 6);
        let pod = port.kind == PortKind::Pod;
        let (target, flags, dst) = match msg {
            nd::Message::Solicit { target, slla } => {
                let t = IpAddr::V6(target);
                let ours = if pod {
                    !port.addresses.contains(&t)
                } else {
                    port.addresses.contains(&t)
                        || (tables.overlay.as_ref().is_some_and(|o| o.uplink == in_id)
                            && tables.node.addresses.contains(&t))
                };
                if !pod
                    && !src.is_unspecified()
                    && let Some(m) = slla
                {
                    let update = neigh::Update {
                        state: neigh::State::Stale,
                        override_mac: true,
                        create: ours,
                    };
                    self.learned(in_id, IpAddr::V6(src), Some(m), now, update, out, trace);
                }
                if !ours || (pod && src.is_unspecified()) {
                    trace.note("nd", || format!("solicitation for {target}: not answered"));
                    return Verdict::Consumed;
                }
                if src.is_unspecified() {
                    // Another host probes for the node's address (duplicate address
                    // detection): told to everyone, unsolicited, that it is taken (RFC
                    // 4861 section 7.2.4, Linux's `ndisc_recv_ns`).
                    (target, nd::FLAG_OVERRIDE, nd::ALL_NODES)
                } else {
                    let router = if pod { nd::FLAG_ROUTER } else { 0 };
                    let flags = router | nd::FLAG_SOLICITED | nd::FLAG_OVERRIDE;
                    (target, flags, src)
                }
            }
            nd::Message::Advert {
                target,
                flags,
                tlla,
            } => {
                if !pod {
                    // Only a solicited advertisement answers the node's probe; only one
                    // with the override flag replaces a MAC (RFC 4861 section 7.2.5).
                    let update = neigh::Update {
                        state: if flags & nd::FLAG_SOLICITED != 0 {
                            neigh::State::Reachable
                        } else {
                            neigh::State::Stale
                        },
                        override_mac: flags & nd::FLAG_OVERRIDE != 0,
                        create: false,
                    };
                    let t = IpAddr::V6(target);
                    self.learned(in_id, t, tlla, now, update, out, trace);
                }
                trace.note("nd", || format!("advertisement of {target}"));
                return Verdict::Consumed;
            }
            nd::Message::Other(ty) => {
                trace.note("nd", || format!("ICMPv6 type {ty}: not acted on"));
                return Verdict::Consumed;
            }
        };
        let dst_mac = if dst.is_multicast() {
            nd::multicast_mac(dst)
        } else {
            src_mac
        };
        let na = nd::advert(
            dst_mac,
            port.mac,
            parsed.vlan,
            target,
            dst,
            target,
            flags,
            Some(port.mac),
        );
        self.stats.nd_answered += 1;
        trace.note("nd", || {
            format!("{target} is at {} (answered to {dst})", MacAddr(port.mac))
        });
        self.send(in_id, Packet::new(na, in_id, now), out);
        Verdict::Consumed
    }

    #[allow(clippy::too_many_arguments)]
    fn icmp_error(
        &mut self,
        pkt: &Packet,
        parsed: &Parsed,
        kind: ErrorKind,
        translate: bool,
        tunnel_peer: Option<IpAddr>,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) {
        let tables = Arc::clone(&self.tables);
        let in_port = &tables.ports[usize::from(pkt.meta.in_port)];
        let src = if parsed.l3 == L3::Ipv4 {
            in_port.addr_v4
        } else {
            in_port.addr_v6
        };
        let Some(src) = src else {
            self.stats.icmp_suppressed += 1;
            trace.note("icmp", || {
                format!(
                    "no {kind:?} sent: port {} has no address of this family",
                    in_port.name
                )
            });
            return;
        };
        // Cheap checks and the rate limit first: a flood of packets that each deserve an
        // error must not cost an error's construction each.
        if !icmp::eligible(&pkt.data, parsed, kind, src) {
            self.stats.icmp_suppressed += 1;
            trace.note("icmp", || {
                format!("no {kind:?} sent: not allowed for this packet")
            });
            return;
        }
        let now = pkt.meta.time_ns;
        if !self.icmp.allow(now) {
            self.stats.icmp_rate_limited += 1;
            trace.note("icmp", || format!("no {kind:?} sent: rate limited"));
            return;
        }
        let Some(frame) = icmp::build_error(&pkt.data, parsed, kind, src, in_port.mac) else {
            self.stats.icmp_suppressed += 1;
            trace.note("icmp", || {
                format!("no {kind:?} sent: not allowed for this packet")
            });
            return;
        };
        let in_id = pkt.meta.in_port;
        let mut err = Packet::new(frame, in_id, now);
        if translate {
            // The error quotes the packet as conntrack left it; conntrack finds it RELATED
            // and translates it back, outside and inside, for the original sender.
            let related = parse(&err.data, in_port.zone).ok().and_then(|mut p| {
                let r = self.ct.process(&mut err, &mut p, None, now).ok()?;
                (r.state == CtState::Related).then_some(())
            });
            if related.is_none() {
                self.stats.icmp_suppressed += 1;
                trace.note("icmp", || {
                    format!("no {kind:?} sent: conntrack could not relate it")
                });
                return;
            }
        }
        let sent = |stats: &mut Stats, trace: &mut Trace| {
            stats.icmp_sent += 1;
            trace.note("icmp", || {
                format!(
                    "{kind:?} sent from {src} to {} via {}",
                    parsed.key.src, in_port.name
                )
            });
        };
        // About a packet that came through the overlay: back through the same node.
        if let Some(peer) = tunnel_peer
            && let Some(i) = tables.overlay.as_ref().and_then(|o| o.peer_index(peer))
        {
            let Ok(pe) = parse(&err.data, in_port.zone) else {
                return;
            };
            match self.resolve(&tables, in_id, NextHop::Tunnel(i), &pe, now, out, trace) {
                Ok(e) => {
                    sent(&mut self.stats, trace);
                    err.data[0..6].copy_from_slice(&e.dst_mac);
                    err.data[6..12].copy_from_slice(&e.src_mac);
                    self.emit(&e, err, out);
                }
                // Errors are not queued: the sender retries, and the error comes again.
                // Not a drop: the packet the error is about is counted as dropped already.
                Err(e) => {
                    self.stats.icmp_suppressed += 1;
                    trace.note("icmp", || {
                        format!("no {kind:?} sent: {} towards node {peer}", e.reason())
                    });
                }
            }
            return;
        }
        sent(&mut self.stats, trace);
        self.send(in_id, err, out);
    }

    /// Refuses a new connection to a Service without endpoints at once: a TCP reset, or
    /// an ICMP port unreachable for UDP, back out of the port it came in on.
    fn reject(
        &mut self,
        pkt: &Packet,
        parsed: &Parsed,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) {
        let in_id = pkt.meta.in_port;
        match parsed.proto {
            proto::TCP => {
                let mac = self.tables.ports[usize::from(in_id)].mac;
                let Some(frame) = lb::reject::tcp_reset(&pkt.data, parsed, mac) else {
                    return;
                };
                self.stats.service_rejected += 1;
                trace.note("service", || "refused with a TCP reset".to_string());
                let rst = Packet::new(frame, in_id, pkt.meta.time_ns);
                self.send(in_id, rst, out);
            }
            proto::UDP => {
                let code = if parsed.l3 == L3::Ipv4 { 3 } else { 4 };
                let sent = self.stats.icmp_sent;
                let kind = ErrorKind::Unreachable { code };
                self.icmp_error(pkt, parsed, kind, false, None, out, trace);
                if self.stats.icmp_sent > sent {
                    self.stats.service_rejected += 1;
                }
            }
            _ => {}
        }
    }

    /// Inserts the connection a NEW packet started, if any.
    fn commit(
        &mut self,
        pending: &mut Option<Pending>,
        now: u64,
        trace: &mut Trace,
    ) -> Result<(), DropReason> {
        if let Some(p) = pending.take() {
            self.ct.commit(p, now)?;
            trace.note("commit", || "connection committed".to_string());
        }
        Ok(())
    }

    /// The NAT of the first static rule matching a packet with `key` that starts a
    /// connection to no Service frontend. Masquerade takes the address the egress port
    /// has for the packet's family (after DNAT); without one, no source NAT.
    fn nat_for(tables: &Tables, in_port: PortId, key: &FlowKey) -> Option<Nat> {
        let rule = tables.nat.iter().find(|r| r.matches(in_port, key))?;
        let snat = match rule.snat {
            Snat::None => None,
            Snat::To(addr, range) => Some((addr.into(), range)),
            Snat::Masquerade => {
                let dst = rule.dnat.map_or(key.dst, |d| d.0.into());
                let route = tables.fib.lookup(dst.ip())?.route()?;
                let port = &tables.ports[usize::from(route.port)];
                let addr = if dst.is_ipv4() {
                    port.addr_v4
                } else {
                    port.addr_v6
                };
                addr.map(|a| (a.into(), None))
            }
        };
        Some(Nat {
            dnat: rule.dnat.map(|(a, p)| (a.into(), p)),
            snat,
        })
    }
}

/// Checks the offload state a port reported against the packet: a partial checksum must
/// start at the transport header and name its checksum field, so that completing it can
/// never write elsewhere (after routing and other checks); a GSO request must match the
/// packet ([`gso::check_request`]: family, protocol, headers, a segment size; never a
/// fragment), whether it is cut here later or handed on whole to a port that takes GSO.
fn check_offload(data: &[u8], v: &VnetHdr, parsed: &Parsed) -> Result<(), DropReason> {
    if v.needs_csum() {
        let field = match parsed.proto {
            proto::TCP => 16,
            proto::UDP => 6,
            proto::ICMP | proto::ICMPV6 => 2,
            _ => return Err(DropReason::CsumOffloadInvalid),
        };
        if parsed.frag.is_some()
            || !parsed.l4_complete
            || usize::from(v.csum_start) != parsed.l4_off
            || usize::from(v.csum_offset) != field
            || parsed.l4_off + field + 2 > parsed.ip_end
        {
            return Err(DropReason::CsumOffloadInvalid);
        }
    }
    if v.is_gso() {
        // Checked here, whether the packet is cut later or handed on whole.
        gso::check_request(data, parsed, v)?;
    } else if v.gso_type != VnetHdr::GSO_NONE {
        // The ECN bit alone: no GSO type to go with it, which Linux refuses
        // (`virtio_net_hdr_to_skb`), so that no port would take the packet.
        return Err(DropReason::GsoUnsupported);
    }
    Ok(())
}

/// The verdict of several inner packets of one frame: `Forwarded` once any was, else
/// the latest.
fn combine(acc: &mut Verdict, v: Verdict) {
    if v == Verdict::Forwarded || *acc != Verdict::Forwarded {
        *acc = v;
    }
}

/// True for a UDP frame whose partial checksum starts past its UDP and VXLAN headers:
/// the inner packet's, as a kernel VXLAN device leaves it (not GSO, not a fragment).
fn inner_partial_checksum(pkt: &Packet, parsed: &Parsed) -> bool {
    let v = pkt.meta.vnet;
    v.needs_csum()
        && !v.is_gso()
        && parsed.proto == proto::UDP
        && parsed.frag.is_none()
        && parsed.l4_complete
        && usize::from(v.csum_start) >= parsed.l4_off + 8 + vxlan::LEN
        && usize::from(v.csum_start) < parsed.ip_end
}

/// The UDP checksum field of a VXLAN frame's outer header (0: none).
fn outer_udp_checksum(pkt: &Packet, parsed: &Parsed) -> u16 {
    let at = parsed.l4_off + 6;
    u16::from_be_bytes([pkt.data[at], pkt.data[at + 1]])
}

/// The ECN field of a decapsulated packet (RFC 6040 section 4.2, as Linux's
/// `INET_ECN_decapsulate`): an outer CE marks an ECN-capable inner packet CE, and drops
/// one that is not ECN-capable (`vxlan_ce_not_ect`); any other outer field changes
/// nothing. `ip` is the inner IP header onwards, parsed whole.
fn decap_ecn(outer: u8, ip: &mut [u8]) -> Result<(), DropReason> {
    use overlay::ecn;
    if outer != ecn::CE {
        return Ok(());
    }
    match overlay::ecn_of(ip) {
        ecn::NOT_ECT => Err(DropReason::VxlanCeNotEct),
        ecn::CE => Ok(()),
        _ => {
            overlay::set_ecn(ip, ecn::CE);
            Ok(())
        }
    }
}

/// The MAC at `off` in a frame (the caller knows the frame is long enough).
fn mac_at(data: &[u8], off: usize) -> [u8; 6] {
    data[off..off + 6].try_into().expect("6 bytes")
}

/// The source check of a pod port: the pod's own MAC, and one of its addresses; IPv6
/// link-local (from its MAC) and, for ICMPv6 (duplicate address detection), the
/// unspecified address are allowed for neighbour discovery: such packets go no further.
fn source_is_pods(port: &Port, pkt: &Packet, parsed: &Parsed) -> bool {
    if port.peer_mac != Some(mac_at(&pkt.data, 6)) {
        return false;
    }
    let src = parsed.key.src;
    port.addresses.contains(&src.ip())
        || match src.ip() {
            IpAddr::V6(a) => {
                nd::is_link_local(&a) || (a.is_unspecified() && parsed.proto == proto::ICMPV6)
            }
            IpAddr::V4(_) => false,
        }
}

/// False for what a router never forwards: link-local and multicast destinations,
/// link-local and unspecified sources, IPv4 broadcast; and the martians Linux drops
/// (RFC 1812 section 5.3.7, RFC 4291): loopback addresses either way, multicast and
/// broadcast sources, 0/8 destinations, IPv4 class E (240/4) either way, the IPv6
/// unspecified destination. An IPv4 link-local address that `fib` routes explicitly
/// ([`routed_link_local`]) is forwarded either way.
fn forwardable(parsed: &Parsed, fib: &Fib<Target>) -> bool {
    match (parsed.key.src.ip(), parsed.key.dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let class_e = |a: Ipv4Addr| a.octets()[0] >= 240;
            let link_local = |a: Ipv4Addr| a.is_link_local() && !routed_link_local(fib, a);
            !(link_local(s)
                || s.is_unspecified()
                || s.is_loopback()
                || s.is_multicast()
                || class_e(s)
                || link_local(d)
                || d.is_multicast()
                || d.is_loopback()
                || d.octets()[0] == 0
                || class_e(d))
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            !(nd::is_link_local(&s)
                || s.is_unspecified()
                || s.is_loopback()
                || s.is_multicast()
                || nd::is_link_local(&d)
                || d.is_multicast()
                || d.is_loopback()
                || d.is_unspecified())
        }
        _ => false,
    }
}

/// The IPv4 link-local broadcast address, never forwarded.
const LINK_LOCAL_BROADCAST: Ipv4Addr = Ipv4Addr::new(169, 254, 255, 255);

/// True for an IPv4 link-local address (169.254/16) that a route of the tables names
/// explicitly: its longest match is a prefix of 16 bits or more, one within 169.254/16
/// (a cloud's metadata service through the uplink's gateway, a node-local DNS cache
/// through the host port). The default route and other short prefixes never carry
/// link-local traffic (RFC 3927 section 7); the pods' gateway and the link-local
/// broadcast address are never forwarded.
fn routed_link_local(fib: &Fib<Target>, a: Ipv4Addr) -> bool {
    IpAddr::V4(a) != GATEWAY_V4
        && a != LINK_LOCAL_BROADCAST
        && fib
            .longest_match_len(IpAddr::V4(a))
            .is_some_and(|len| len >= 16)
}

/// The bytes of IP and transport headers copied into every segment of a GSO packet.
fn gso_headers(data: &[u8], parsed: &Parsed) -> usize {
    let l4 = if parsed.proto == proto::TCP {
        data.get(parsed.l4_off + 12)
            .map_or(20, |b| usize::from(b >> 4) * 4)
    } else {
        8
    };
    parsed.l4_off - parsed.l3_off + l4
}

/// The IP length of the largest datagram a USO packet becomes: its headers and at most
/// `gso_size` bytes of payload. A packet whose payload is no longer than `gso_size` is a
/// single datagram of its own length, as Linux takes it ("too small packets are not
/// really GSO ones", `virtio_net_hdr_to_skb`).
fn largest_datagram(pkt: &Packet, parsed: &Parsed) -> usize {
    let headers = gso_headers(&pkt.data, parsed);
    let payload = (parsed.ip_end - parsed.l3_off).saturating_sub(headers);
    headers + payload.min(usize::from(pkt.meta.vnet.gso_size))
}

/// Marks an oversized TCP packet from a GRO port as the super-packet it is, the way the
/// kernel hands one over: the segment size is what the port's MTU carries with these
/// headers, and the checksum is left partial (pseudo-header sum, NEEDS_CSUM) for
/// whoever segments it or receives it whole.
fn mark_coalesced(pkt: &mut Packet, parsed: &Parsed, port: &Port) {
    let headers = gso_headers(&pkt.data, parsed);
    let mss = usize::from(port.mtu).saturating_sub(headers).max(8);
    let l4_len = parsed.ip_end - parsed.l4_off;
    let pseudo = match (parsed.key.src.ip(), parsed.key.dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            checksum::pseudo_v4(s.octets(), d.octets(), proto::TCP, l4_len as u16)
        }
        (s, d) => checksum::pseudo_v6(
            &crate::wire::parse::v6_octets(s),
            &crate::wire::parse::v6_octets(d),
            proto::TCP,
            l4_len as u32,
        ),
    };
    let field = parsed.l4_off + 16;
    pkt.data[field..field + 2].copy_from_slice(&checksum::fold(pseudo).to_be_bytes());
    let v = &mut pkt.meta.vnet;
    v.gso_type = if parsed.l3 == L3::Ipv4 {
        VnetHdr::GSO_TCPV4
    } else {
        VnetHdr::GSO_TCPV6
    };
    v.gso_size = mss as u16;
    v.hdr_len = (parsed.l3_off + headers) as u16;
    v.flags |= VnetHdr::F_NEEDS_CSUM;
    v.csum_start = parsed.l4_off as u16;
    v.csum_offset = 16;
}

/// Decrements the TTL (IPv4, with an incremental header checksum update) or hop limit.
fn decrement_ttl(data: &mut [u8], parsed: &Parsed) {
    let o = parsed.l3_off;
    match parsed.l3 {
        L3::Ipv4 => {
            let old = u16::from_be_bytes([data[o + 8], data[o + 9]]);
            data[o + 8] -= 1;
            let new = u16::from_be_bytes([data[o + 8], data[o + 9]]);
            let c = u16::from_be_bytes([data[o + 10], data[o + 11]]);
            data[o + 10..o + 12].copy_from_slice(&checksum::update16(c, old, new).to_be_bytes());
        }
        L3::Ipv6 => data[o + 7] -= 1,
        L3::Arp => {}
    }
}

mod swap;
pub use swap::SwapReport;

mod trace;
pub use trace::{TraceOut, TracePass, TraceReport, TraceStage, summarize, trace};

#[cfg(test)]
mod trace_tests;

#[cfg(test)]
mod tests;

/// Two nodes on one underlay subnet, each with two pods, through the overlay.
#[cfg(test)]
mod overlay_tests;

#[cfg(test)]
mod service_tests;

/// Addresses of this node's pod CIDRs that no pod has.
#[cfg(test)]
mod pod_cidr_tests;

/// Packets waiting for their next hop's MAC.
#[cfg(test)]
mod neigh_tests;

#[cfg(test)]
mod test_support;
