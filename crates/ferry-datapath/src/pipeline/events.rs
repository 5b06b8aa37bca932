//! What a packet's trace records: one typed event per step of a stage, when tracing
//! is on.
//!
//! A [`TraceEvent`] holds the values a stage looked at (keys, addresses, ports, sizes,
//! names, reasons); its [`Display`](fmt::Display) is the one-line text `ferry trace`
//! prints and `verdicts.jsonl` records as `detail`, and its serde form (tagged by
//! `kind`) is the structured record next to it.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use crate::conntrack::CtState;
use crate::drop::DropReason;
use crate::flow::FlowKey;
use crate::icmp::ErrorKind;
use crate::lb::Scope;
use crate::packet::PortId;
use crate::policy::{Direction, Tier};
use crate::tables::MacAddr;

/// The stage of the pipeline an event belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The frame was parsed.
    Parse,
    /// TCP coalescing (GRO).
    Gro,
    /// Fragment reassembly.
    Ipf,
    /// VXLAN decapsulation.
    Decap,
    /// The source check of a pod's packet.
    Source,
    /// The Service (load balancer) choice.
    Service,
    /// A static NAT rule.
    Nat,
    /// Connection tracking.
    Ct,
    /// NetworkPolicy and ClusterNetworkPolicy.
    Policy,
    /// A new connection entered the table.
    Commit,
    /// The route lookup.
    Route,
    /// The MTU check.
    Mtu,
    /// The link-layer addresses chosen.
    L2,
    /// Neighbour resolution (probes, the queue).
    Neigh,
    /// VXLAN encapsulation.
    Encap,
    /// The packet left (whole, segmented or fragmented).
    Egress,
    /// ICMP errors.
    Icmp,
    /// ARP answers.
    Arp,
    /// Neighbour discovery answers.
    Nd,
    /// The packet was dropped.
    Drop,
}

impl Stage {
    /// The stage's name, as traces print it (`parse`, `ct`, `l2`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Stage::Parse => "parse",
            Stage::Gro => "gro",
            Stage::Ipf => "ipf",
            Stage::Decap => "decap",
            Stage::Source => "source",
            Stage::Service => "service",
            Stage::Nat => "nat",
            Stage::Ct => "ct",
            Stage::Policy => "policy",
            Stage::Commit => "commit",
            Stage::Route => "route",
            Stage::Mtu => "mtu",
            Stage::L2 => "l2",
            Stage::Neigh => "neigh",
            Stage::Encap => "encap",
            Stage::Egress => "egress",
            Stage::Icmp => "icmp",
            Stage::Arp => "arp",
            Stage::Nd => "nd",
            Stage::Drop => "drop",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A fragment's header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fragment {
    /// Identification.
    pub id: u32,
    /// Offset of its data in the datagram, in bytes.
    pub offset: u16,
    /// More fragments follow.
    pub more: bool,
}

/// How long a packet is, as the MTU check measured it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MtuLength {
    /// A GSO packet, measured by its segment size.
    Gso {
        /// Segment size.
        segment: u16,
    },
    /// A reassembled datagram and the largest fragment it came in.
    Reassembled {
        /// IP length.
        bytes: usize,
        /// Largest fragment received.
        mru: u16,
    },
    /// A plain packet.
    Plain {
        /// IP length.
        bytes: usize,
    },
}

/// What the MTU check concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MtuFit {
    /// It fits as it is.
    Fits,
    /// It is segmented or fragmented to fit.
    Cut,
    /// Too big, and may not be fragmented: an ICMP error answers.
    TooBig,
}

/// How the next hop's MAC was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum L2Hop {
    /// The route gives the MAC.
    RouteMac,
    /// Through a gateway.
    Gateway {
        /// The gateway's address.
        addr: IpAddr,
    },
    /// The destination is on the link.
    OnLink {
        /// The destination address.
        addr: IpAddr,
    },
}

/// What a queued packet's neighbour was asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Asked {
    /// A probe went out for it (or would, in a dry run).
    Probed {
        /// A dry run: nothing is sent.
        dry_run: bool,
    },
    /// A probe was out already.
    Already,
}

/// How a Service's new connection reaches its endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServicePath {
    /// Straight, the client's address kept.
    Direct,
    /// Source NAT to this node's address.
    Snat {
        /// The address.
        addr: IpAddr,
        /// The client is its own endpoint.
        hairpin: bool,
    },
    /// The client's address kept, through the tunnel so that replies return here.
    Tunnel,
}

/// What decided a direction of a new connection (see [`crate::policy::DecidedBy`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PolicyBy {
    /// A rule.
    Rule {
        /// Its tier.
        tier: Tier,
        /// Its policy's name and its own.
        rule: String,
    },
    /// These NetworkPolicies isolate the pod, and no rule of theirs matched.
    Isolated {
        /// Their names.
        policies: Vec<String>,
    },
    /// No policy applies.
    Default,
    /// From the node's own stack, allowed to its pods.
    Host,
}

/// One step of a stage, with the values it was made of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TraceEvent {
    /// The frame parsed.
    Parse {
        /// Its key.
        #[serde(with = "forms::FlowKeyDef")]
        key: FlowKey,
        /// IP length.
        bytes: usize,
        /// When it is a fragment.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        frag: Option<Fragment>,
    },
    /// A TCP packet above the port's MTU was marked as coalesced (GRO).
    GroMarked {
        /// The segment size given.
        segment: u16,
    },
    /// Decapsulated TCP segments were coalesced.
    GroCoalesced {
        /// Segments in.
        segments: usize,
        /// Packets out.
        packets: usize,
    },
    /// A fragment was held for reassembly.
    IpfHeld {
        /// Datagrams being reassembled.
        datagrams: usize,
        /// Bytes held.
        bytes: usize,
    },
    /// A datagram was reassembled.
    IpfReassembled {
        /// IP length.
        bytes: usize,
        /// Largest fragment received.
        mru: u16,
        /// The datagram's key.
        #[serde(with = "forms::FlowKeyDef")]
        key: FlowKey,
    },
    /// Reassembly refused a fragment.
    IpfRefused {
        /// Why.
        #[serde(with = "forms::reason")]
        reason: DropReason,
    },
    /// A VXLAN packet was decapsulated.
    Decap {
        /// Its VNI.
        vni: u32,
        /// The node it came from.
        peer: IpAddr,
        /// The inner packet's key.
        #[serde(with = "forms::FlowKeyDef")]
        inner: FlowKey,
    },
    /// A UDP GSO super-frame of VXLAN datagrams arrived.
    DecapGso {
        /// The node it came from.
        peer: IpAddr,
        /// Datagrams in it.
        datagrams: usize,
        /// Their size.
        size: usize,
    },
    /// A pod's packet has the pod's own MAC and address.
    SourceOk,
    /// A Service without endpoints refused a TCP connection with a reset.
    ServiceReset,
    /// The reset refusing a TCP connection could not go back through the overlay.
    ServiceResetNoPath {
        /// Why.
        #[serde(with = "forms::reason")]
        reason: DropReason,
        /// The node it was for.
        peer: IpAddr,
    },
    /// A Service has no endpoint for a new connection.
    ServiceNoEndpoint {
        /// The Service.
        service: String,
        /// Where its frontend is reached from.
        #[serde(with = "forms::ScopeDef")]
        scope: Scope,
        /// The packet's key.
        #[serde(with = "forms::FlowKeyDef")]
        key: FlowKey,
    },
    /// A Service's connection must leave from a node address of a family it lacks.
    ServiceNoNodeAddress {
        /// The Service.
        service: String,
        /// Where its frontend is reached from.
        #[serde(with = "forms::ScopeDef")]
        scope: Scope,
        /// The packet's key.
        #[serde(with = "forms::FlowKeyDef")]
        key: FlowKey,
    },
    /// A new connection to a Service's load balancer IP from outside its source ranges.
    ServiceSourceDenied {
        /// The Service.
        service: String,
        /// The packet's key.
        #[serde(with = "forms::FlowKeyDef")]
        key: FlowKey,
    },
    /// A Service chose an endpoint for a new connection.
    ServiceBalanced {
        /// The Service.
        service: String,
        /// Where its frontend is reached from.
        #[serde(with = "forms::ScopeDef")]
        scope: Scope,
        /// The frontend's address.
        frontend: IpAddr,
        /// The frontend's port.
        frontend_port: u16,
        /// The endpoint's address.
        endpoint: IpAddr,
        /// The endpoint's port.
        endpoint_port: u16,
        /// The node the endpoint is on, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        /// How the connection reaches it.
        path: ServicePath,
    },
    /// A Service endpoint's segment of no tracked connection, taken as the reply of a
    /// connection through this frontend (which would choose that endpoint for its
    /// client) and translated back, committing nothing: the client's answer starts the
    /// connection.
    ServiceRecovered {
        /// The Service.
        service: String,
        /// Where its frontend is reached from.
        #[serde(with = "forms::ScopeDef")]
        scope: Scope,
        /// The frontend's address.
        frontend: IpAddr,
        /// The frontend's port.
        frontend_port: u16,
        /// The endpoint's address.
        endpoint: IpAddr,
        /// The endpoint's port.
        endpoint_port: u16,
        /// The other node whose node port the frontend is: the segment goes back to it
        /// through the tunnel, untranslated.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        through: Option<IpAddr>,
        /// Which candidate frontend this is, from 1.
        candidate: u8,
        /// Candidate frontends.
        candidates: u8,
    },
    /// A static NAT rule gave a new connection its translation.
    StaticNat {
        /// New destination address.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dnat: Option<IpAddr>,
        /// New destination port.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dnat_port: Option<u16>,
        /// New source address.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        snat: Option<IpAddr>,
        /// The source ports to choose from, inclusive.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        snat_ports: Option<(u16, u16)>,
    },
    /// What conntrack made of the packet.
    Ct {
        /// Its state.
        #[serde(with = "forms::CtStateDef")]
        state: CtState,
        /// It goes in the reply direction.
        reply: bool,
        /// Its key after conntrack (and NAT).
        #[serde(with = "forms::FlowKeyDef")]
        key: FlowKey,
        /// NAT changed the key.
        translated: bool,
    },
    /// A direction of a new connection decided by policy.
    Policy {
        /// Ingress (to the pod) or egress (from it).
        direction: Direction,
        /// The pod's port.
        port: String,
        /// The other end, as the policy saw it.
        peer: IpAddr,
        /// The connection may go on.
        allowed: bool,
        /// What decided.
        by: PolicyBy,
    },
    /// A new connection entered the table.
    Committed,
    /// A packet to this node's pod CIDRs for which no pod exists.
    RouteNoPod {
        /// Its destination.
        dst: IpAddr,
    },
    /// Routed through the overlay.
    RouteTunnel {
        /// Destination address.
        dst: IpAddr,
        /// The node it goes to.
        node: String,
    },
    /// Routed to a port.
    RoutePort {
        /// Destination address.
        dst: IpAddr,
        /// The port.
        port: String,
    },
    /// The MTU check.
    Mtu {
        /// The MTU that applies.
        mtu: usize,
        /// It is the tunnel's inner MTU.
        tunnel: bool,
        /// The port it leaves by.
        port: String,
        /// What was measured.
        length: MtuLength,
        /// What was concluded.
        fit: MtuFit,
    },
    /// The MACs for a packet that leaves by a port.
    L2 {
        /// How the next hop's MAC was found.
        hop: L2Hop,
        /// Destination MAC.
        #[serde(with = "forms::mac")]
        dst_mac: [u8; 6],
        /// Source MAC.
        #[serde(with = "forms::mac")]
        src_mac: [u8; 6],
        /// The port.
        port: String,
    },
    /// The MACs for a packet that goes through the overlay.
    L2Tunnel {
        /// Inner source MAC (this node's VTEP).
        #[serde(with = "forms::mac")]
        inner_src: [u8; 6],
        /// Inner destination MAC (the peer's VTEP).
        #[serde(with = "forms::mac")]
        inner_dst: [u8; 6],
        /// Outer destination MAC.
        #[serde(with = "forms::mac")]
        outer_dst: [u8; 6],
        /// The peer node's address.
        peer: IpAddr,
        /// Outer source MAC.
        #[serde(with = "forms::mac")]
        outer_src: [u8; 6],
        /// The uplink.
        port: String,
    },
    /// A neighbour that is not confirmed was probed.
    NeighProbe {
        /// The neighbour.
        ip: IpAddr,
        /// The port.
        port: String,
        /// Where the probe went.
        #[serde(with = "forms::mac")]
        mac: [u8; 6],
    },
    /// The packet was queued for an unresolved next hop.
    NeighQueued {
        /// The next hop.
        ip: IpAddr,
        /// The port.
        port: String,
        /// What was asked of it.
        asked: Asked,
        /// Packets waiting for it.
        waiting: usize,
        /// Older packets pushed out of the queue.
        pushed_out: u64,
    },
    /// A packet that waited for a neighbour is sent.
    NeighReleased {
        /// The neighbour.
        ip: IpAddr,
        /// Its MAC.
        #[serde(with = "forms::mac")]
        mac: [u8; 6],
        /// The packet's key.
        #[serde(with = "forms::FlowKeyDef")]
        key: FlowKey,
    },
    /// A packet was encapsulated in VXLAN.
    Encap {
        /// The VNI.
        vni: u32,
        /// The node it goes to, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        /// Outer source address.
        src: IpAddr,
        /// Outer destination address.
        dst: IpAddr,
        /// Outer UDP source port.
        udp_src_port: u16,
        /// The tunnel's inner MTU.
        mtu: usize,
    },
    /// Segments were encapsulated into frames, some of them UDP GSO super-frames.
    EncapSuperFrames {
        /// Datagrams.
        datagrams: usize,
        /// Frames.
        frames: usize,
        /// Super-frames among them.
        super_frames: usize,
        /// The port that cuts them.
        port: String,
    },
    /// A GSO packet left whole.
    SentGso {
        /// The port.
        port: String,
        /// Its segment size.
        segment: u16,
    },
    /// A GSO packet was segmented.
    Segmented {
        /// Packets out.
        packets: usize,
        /// The MTU.
        mtu: usize,
        /// The port.
        port: String,
    },
    /// The packet left as it is.
    Sent {
        /// The port.
        port: String,
    },
    /// The packet was fragmented (or a reassembled one refragmented).
    Fragmented {
        /// The largest fragment received, for a reassembled datagram.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mru: Option<u16>,
        /// The MTU.
        mtu: usize,
        /// The fragment size limit applied.
        limit: usize,
        /// Fragments out.
        fragments: usize,
        /// The port.
        port: String,
    },
    /// No ICMP error: the port has no address of the packet's family.
    IcmpNoAddress {
        /// The error.
        #[serde(with = "forms::ErrorKindDef")]
        error: ErrorKind,
        /// The port.
        port: String,
    },
    /// No ICMP error: not allowed for this packet.
    IcmpNotAllowed {
        /// The error.
        #[serde(with = "forms::ErrorKindDef")]
        error: ErrorKind,
    },
    /// No ICMP error: rate limited.
    IcmpRateLimited {
        /// The error.
        #[serde(with = "forms::ErrorKindDef")]
        error: ErrorKind,
    },
    /// No ICMP error: conntrack could not relate it to the connection.
    IcmpUnrelated {
        /// The error.
        #[serde(with = "forms::ErrorKindDef")]
        error: ErrorKind,
    },
    /// No ICMP error: it could not go back through the overlay.
    IcmpNoPath {
        /// The error.
        #[serde(with = "forms::ErrorKindDef")]
        error: ErrorKind,
        /// Why.
        #[serde(with = "forms::reason")]
        reason: DropReason,
        /// The node it was for.
        peer: IpAddr,
    },
    /// An ICMP error was sent.
    IcmpSent {
        /// The error.
        #[serde(with = "forms::ErrorKindDef")]
        error: ErrorKind,
        /// Its source.
        src: IpAddr,
        /// Its destination (the packet's sender).
        dst: IpAddr,
        /// The port.
        port: String,
    },
    /// An ARP operation other than request and reply.
    ArpIgnored {
        /// The operation.
        op: u16,
    },
    /// An ARP message not answered.
    ArpNotAnswered {
        /// The operation.
        op: u16,
        /// Sender address.
        sender: Ipv4Addr,
        /// Target address.
        target: Ipv4Addr,
    },
    /// An ARP request answered.
    ArpAnswered {
        /// The address asked for.
        target: Ipv4Addr,
        /// The MAC given.
        #[serde(with = "forms::mac")]
        mac: [u8; 6],
        /// Who asked.
        sender: Ipv4Addr,
    },
    /// A neighbour solicitation not answered.
    NdNotAnswered {
        /// The address asked for.
        target: Ipv6Addr,
    },
    /// A neighbour advertisement.
    NdAdvert {
        /// The address advertised.
        target: Ipv6Addr,
    },
    /// Another ICMPv6 message on a port that answers ND.
    NdIgnored {
        /// Its type.
        icmp_type: u8,
    },
    /// A neighbour solicitation answered.
    NdAnswered {
        /// The address asked for.
        target: Ipv6Addr,
        /// The MAC given.
        #[serde(with = "forms::mac")]
        mac: [u8; 6],
        /// Where the advertisement went.
        dst: Ipv6Addr,
    },
    /// The packet was dropped.
    Drop {
        /// Why.
        #[serde(with = "forms::reason")]
        reason: DropReason,
    },
}

impl TraceEvent {
    /// The stage the event belongs to.
    pub fn stage(&self) -> Stage {
        use TraceEvent::*;
        match self {
            Parse { .. } => Stage::Parse,
            GroMarked { .. } | GroCoalesced { .. } => Stage::Gro,
            IpfHeld { .. } | IpfReassembled { .. } | IpfRefused { .. } => Stage::Ipf,
            Decap { .. } | DecapGso { .. } => Stage::Decap,
            SourceOk => Stage::Source,
            ServiceReset
            | ServiceResetNoPath { .. }
            | ServiceNoEndpoint { .. }
            | ServiceNoNodeAddress { .. }
            | ServiceSourceDenied { .. }
            | ServiceBalanced { .. }
            | ServiceRecovered { .. } => Stage::Service,
            StaticNat { .. } => Stage::Nat,
            Ct { .. } => Stage::Ct,
            Policy { .. } => Stage::Policy,
            Committed => Stage::Commit,
            RouteNoPod { .. } | RouteTunnel { .. } | RoutePort { .. } => Stage::Route,
            Mtu { .. } => Stage::Mtu,
            L2 { .. } | L2Tunnel { .. } => Stage::L2,
            NeighProbe { .. } | NeighQueued { .. } | NeighReleased { .. } => Stage::Neigh,
            Encap { .. } | EncapSuperFrames { .. } => Stage::Encap,
            SentGso { .. } | Segmented { .. } | Sent { .. } | Fragmented { .. } => Stage::Egress,
            IcmpNoAddress { .. }
            | IcmpNotAllowed { .. }
            | IcmpRateLimited { .. }
            | IcmpUnrelated { .. }
            | IcmpNoPath { .. }
            | IcmpSent { .. } => Stage::Icmp,
            ArpIgnored { .. } | ArpNotAnswered { .. } | ArpAnswered { .. } => Stage::Arp,
            NdNotAnswered { .. } | NdAdvert { .. } | NdIgnored { .. } | NdAnswered { .. } => {
                Stage::Nd
            }
            Drop { .. } => Stage::Drop,
        }
    }
}

/// A packet's trace: one event per step, recorded only when enabled.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub(super) enabled: bool,
    /// The events, in stage order.
    pub events: Vec<TraceEvent>,
    /// What conntrack made of the packet, and whether it went in the reply direction;
    /// recorded whether or not tracing is on.
    pub ct: Option<(CtState, bool)>,
    /// The packet's key as conntrack looked it up (after decapsulation and reassembly,
    /// before NAT); recorded only when tracing is on.
    pub key: Option<FlowKey>,
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

    /// Records an event; `event` is only called when tracing is on.
    #[inline]
    pub fn note(&mut self, event: impl FnOnce() -> TraceEvent) {
        if self.enabled {
            self.events.push(event());
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

pub(super) use text::SockAddr;

mod forms;
mod text;
