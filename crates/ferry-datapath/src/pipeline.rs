//! One node's pipeline: parse (ARP answered here) -> defrag -> VXLAN decap -> source
//! check -> neighbour discovery -> TTL -> conntrack (with NAT) -> route -> next-hop
//! resolution -> L2 rewrite -> egress MTU -> encap.
//!
//! Later stages (services, policy) slot in around conntrack. The pipeline owns its
//! per-worker state (fragment buffers, connections, neighbours, ICMP budget, counters)
//! and reads the node tables through an `Arc` that the control plane swaps.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use crate::conntrack::{self, Conntrack, CtState, Nat, Pending};
use crate::drop::{DropCounters, DropReason};
use crate::flow::proto;
use crate::gso;
use crate::icmp::{self, ErrorKind, RateLimiter};
use crate::ipf::{self, Reassembler};
use crate::neigh::{self, Neighbours, arp, nd};
use crate::overlay;
use crate::packet::{Meta, Packet, PortId, VnetHdr};
use crate::tables::{MacAddr, NextHop, Port, PortKind, Snat, Tables};
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
    /// Dropped for this reason.
    Dropped(DropReason),
}

impl Verdict {
    /// `forwarded`, `held` or `dropped`.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Forwarded => "forwarded",
            Verdict::Held => "held",
            Verdict::Consumed => "consumed",
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
}

impl Trace {
    /// A trace that records.
    pub fn enabled() -> Trace {
        Trace {
            enabled: true,
            events: Vec::new(),
            ct: None,
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
    /// Packets sent VXLAN-encapsulated.
    pub encapsulated: u64,
    /// VXLAN packets decapsulated.
    pub decapsulated: u64,
}

/// Where one routed packet leaves, resolved: link-layer addresses, offloads, and the
/// outer headers when it goes through the overlay.
struct Egress {
    port: PortId,
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    gso: bool,
    tunnel: Option<overlay::Outer>,
}

/// Datagrams (and connections) expired per call of [`Pipeline::tick`] at most: bounded
/// work per batch.
pub const EXPIRE_BUDGET: usize = 64;

/// One node's packet pipeline.
pub struct Pipeline {
    tables: Arc<Tables>,
    ipf: Reassembler,
    ct: Conntrack,
    neigh: Neighbours,
    icmp: RateLimiter,
    drops: DropCounters,
    stats: Stats,
    ports: Vec<PortStats>,
    scratch: Vec<Packet>,
}

impl Pipeline {
    /// A pipeline over `tables`, with fragment and ICMP limits from them.
    pub fn new(tables: Arc<Tables>) -> Pipeline {
        let mut cfg = ipf::Config::default();
        let s = &tables.ipf;
        if let Some(ms) = s.timeout_ms {
            cfg.timeout_ns = ms.saturating_mul(1_000_000);
        }
        if let Some(v) = s.max_datagrams {
            cfg.max_datagrams = v;
        }
        if let Some(v) = s.max_bytes {
            cfg.max_bytes = v;
        }
        if let Some(v) = s.min_fragment_v4 {
            cfg.min_fragment_v4 = v;
        }
        if let Some(v) = s.min_fragment_v6 {
            cfg.min_fragment_v6 = v;
        }
        let icmp = RateLimiter::new(
            tables
                .icmp
                .per_second
                .unwrap_or(RateLimiter::DEFAULT_PER_SECOND),
            tables.icmp.burst.unwrap_or(RateLimiter::DEFAULT_BURST),
        );
        let mut ct = conntrack::Config::default();
        if let Some(n) = tables.ct.max_entries {
            ct.max_entries = n;
        }
        if let Some(p) = tables.ct.tcp_pickup {
            ct.tcp_pickup = p;
        }
        Pipeline {
            ports: vec![PortStats::default(); tables.ports.len()],
            tables,
            ipf: Reassembler::new(cfg),
            ct: Conntrack::new(ct),
            neigh: Neighbours::new(neigh::Config::default()),
            icmp,
            drops: DropCounters::default(),
            stats: Stats::default(),
            scratch: Vec::new(),
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

    /// Advances the pipeline's clock: expires fragments and connections, with bounded
    /// work.
    pub fn tick(&mut self, now_ns: u64) {
        self.ipf.expire(now_ns, EXPIRE_BUDGET, &mut self.drops);
        self.ct.expire(now_ns, EXPIRE_BUDGET);
    }

    fn drop(&mut self, reason: DropReason, trace: &mut Trace) -> Verdict {
        self.drops.count(reason);
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
    /// neighbour solicitation out of the port whose next hop is being resolved).
    pub fn process(
        &mut self,
        mut pkt: Packet,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let tables = Arc::clone(&self.tables);
        let in_id = pkt.meta.in_port;
        let Some(in_port) = tables.ports.get(usize::from(in_id)) else {
            return self.drop(DropReason::UnknownPort, trace);
        };
        let rx = &mut self.ports[usize::from(in_id)];
        rx.rx_packets += 1;
        rx.rx_bytes += pkt.data.len() as u64;
        pkt.meta.zone = in_port.zone;

        let parsed = match parse(&pkt.data, in_port.zone) {
            Ok(p) => p,
            Err(r) => return self.drop(r, trace),
        };
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

        // A kernel VXLAN peer behind a veth hands over frames whose inner checksum is
        // still partial: that state is checked on the inner packet after decapsulation,
        // and such a frame that is not decapsulated is refused.
        let inner_csum = inner_partial_checksum(&pkt, &parsed);
        if !inner_csum && let Err(r) = check_offload(&pkt, &parsed) {
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

        let (mut pkt, mut parsed) = match self.defrag(pkt, parsed, trace) {
            Ok(p) => p,
            Err(v) => return v,
        };

        // Decap: VXLAN to this node arrives on the overlay's uplink; the inner frame goes
        // on as if received from a tunnel port in the uplink's zone.
        let mut tunnel_peer = None;
        if let Some(ov) = &tables.overlay
            && in_id == ov.uplink
            && parsed.proto == proto::UDP
            && parsed.l4_complete
            && parsed.key.dst_port == ov.port
            && tables.node.addresses.contains(&parsed.key.dst)
        {
            let peer = parsed.key.src;
            let (inner, inner_parsed) = match self.decap(&pkt, &parsed, ov) {
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
            if let Err(r) = check_offload(&inner, &inner_parsed) {
                return self.drop(r, trace);
            }
            (pkt, parsed) = match self.defrag(inner, inner_parsed, trace) {
                Ok(p) => p,
                Err(v) => return v,
            };
            tunnel_peer = Some(peer);
        } else if inner_csum {
            return self.drop(DropReason::CsumOffloadInvalid, trace);
        }

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
        if in_port.kind != PortKind::Plain && !forwardable(&parsed) {
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

        let nat = self.nat_for(&tables, in_id, &parsed);
        let before = parsed.key;
        let now = pkt.meta.time_ns;
        let ct = match self.ct.process(&mut pkt, &mut parsed, nat.as_ref(), now) {
            Ok(r) => r,
            Err(r) => return self.drop(r, trace),
        };
        trace.ct = Some((ct.state, ct.reply));
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
        let mut pending = ct.pending;
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

        let Some(route) = tables.fib.lookup(parsed.key.dst).copied() else {
            return self.drop(DropReason::NoRoute, trace);
        };
        let (mut out_id, mut next_hop) = (route.port, route.next_hop);
        if let (Some(peer), Some(ov)) = (reply_peer, &tables.overlay)
            && tables.ports[usize::from(out_id)].kind != PortKind::Pod
            && let Some(i) = ov.peer_index(peer)
        {
            (out_id, next_hop) = (ov.uplink, NextHop::Tunnel(i));
        }
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
            uso && gso_headers(&pkt.data, &parsed) + usize::from(pkt.meta.vnet.gso_size) > mtu
                && !may_fragment
        } else if mru != 0 {
            // A reassembled datagram leaves as fragments no larger than those that came
            // in; if those do not fit the MTU, fragmenting them further is in transit.
            mru > mtu && !may_fragment
        } else {
            parsed.ip_len() > mtu && !may_fragment
        };
        if too_big {
            // The connection is kept although this packet is not sent, so that the error,
            // which quotes the translated packet, is translated back for the sender; the
            // sender retries smaller on the same connection.
            if let Err(r) = self.commit(&mut pending, now, trace) {
                return self.drop(r, trace);
            }
            let kind = ErrorKind::TooBig { mtu: mtu as u32 };
            self.icmp_error(&pkt, &parsed, kind, true, tunnel_peer, out, trace);
            return self.drop(DropReason::TooBig, trace);
        }

        let egress = match self.resolve(out_id, next_hop, &parsed, now, out, trace) {
            Ok(e) => e,
            Err(r) => return self.drop(r, trace),
        };
        if let Err(r) = self.commit(&mut pending, now, trace) {
            return self.drop(r, trace);
        }

        decrement_ttl(&mut pkt.data, &parsed);
        pkt.data[0..6].copy_from_slice(&egress.dst_mac);
        pkt.data[6..12].copy_from_slice(&egress.src_mac);
        if let Some(o) = &egress.tunnel {
            trace.note("encap", || {
                format!(
                    "VXLAN vni {} {} -> {}, udp source port {}, inner mtu {mtu}",
                    o.vni,
                    o.src,
                    o.dst,
                    overlay::source_port(o.hash)
                )
            });
        }

        if gso {
            let headers = gso_headers(&pkt.data, &parsed);
            let fits = headers + usize::from(pkt.meta.vnet.gso_size) <= mtu;
            if egress.gso && (fits || !uso) {
                // The receiving kernel segments at gso_size: never above the MTU.
                let max = (mtu - headers.min(mtu)) as u16;
                if !fits {
                    pkt.meta.vnet.gso_size = max;
                }
                trace.note("egress", || {
                    format!(
                        "GSO packet sent whole to {}, segment size {}",
                        out_port.name, pkt.meta.vnet.gso_size
                    )
                });
                self.emit(&egress, pkt, out);
                return Verdict::Forwarded;
            }
            let mut segs = std::mem::take(&mut self.scratch);
            segs.clear();
            if let Err(r) = gso::segment(&pkt, &parsed, mtu, &mut segs) {
                self.scratch = segs;
                return self.drop(r, trace);
            }
            self.stats.segmented += 1;
            self.stats.segments_out += segs.len() as u64;
            trace.note("egress", || {
                format!(
                    "segmented into {} packets for mtu {mtu} on {}",
                    segs.len(),
                    out_port.name
                )
            });
            let mut frags = Vec::new();
            for seg in segs.drain(..) {
                if seg.data.len() - parsed.l3_off <= mtu {
                    self.emit(&egress, seg, out);
                    continue;
                }
                // A USO datagram larger than the MTU, IPv4 without DF: fragment it.
                frags.clear();
                let fragmented = parse(&seg.data, pkt.meta.zone)
                    .and_then(|sp| ipf::refragment(&seg, &sp, mtu, &mut frags));
                if let Err(r) = fragmented {
                    self.drops.count(r);
                    continue;
                }
                self.stats.fragments_out += frags.len() as u64;
                for f in frags.drain(..) {
                    self.emit(&egress, f, out);
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
            trace.note("egress", || format!("sent to {}", out_port.name));
            self.emit(&egress, pkt, out);
            return Verdict::Forwarded;
        }

        let mut frags = std::mem::take(&mut self.scratch);
        frags.clear();
        if let Err(r) = ipf::refragment(&pkt, &parsed, limit, &mut frags) {
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
            format!("{why}: {} fragments to {}", frags.len(), out_port.name)
        });
        for f in frags.drain(..) {
            self.emit(&egress, f, out);
        }
        self.scratch = frags;
        Verdict::Forwarded
    }

    /// Defrag: a fragment is held, or completes its datagram (re-parsed, key rebuilt).
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
        ov: &crate::tables::Overlay,
    ) -> Result<(Packet, Parsed), DropReason> {
        if ov.peer_index(parsed.key.src).is_none() {
            return Err(DropReason::VxlanUnknownPeer);
        }
        let vx_off = parsed.l4_off + 8;
        let vx = vxlan::Repr::parse(pkt.data.get(vx_off..parsed.ip_end).unwrap_or(&[]))?;
        if vx.vni != ov.vni {
            return Err(DropReason::VxlanBadVni);
        }
        let start = vx_off + vxlan::LEN;
        let data = pkt.data[start..parsed.ip_end].to_vec();
        let inner = parse(&data, pkt.meta.zone)?;
        if inner.l3 == L3::Arp {
            return Err(DropReason::ArpNotHandled);
        }
        // A partial checksum of the inner packet moves with it (checked by the caller).
        let v = pkt.meta.vnet;
        let vnet = if v.needs_csum() && usize::from(v.csum_start) >= start {
            VnetHdr {
                flags: VnetHdr::F_NEEDS_CSUM,
                csum_start: v.csum_start - start as u16,
                csum_offset: v.csum_offset,
                ..VnetHdr::default()
            }
        } else {
            VnetHdr::default()
        };
        let mut p = Packet {
            data,
            meta: Meta {
                vnet,
                mru: 0,
                frag_id: 0,
                ..pkt.meta
            },
        };
        p.data.truncate(inner.ip_end);
        Ok((p, inner))
    }

    /// Where the frame goes at the link layer: the next hop's MAC (from the route, the
    /// neighbour table, or, for the overlay, the peer's VTEP with the outer headers to
    /// add). An unknown neighbour is probed (rate limited) and the packet dropped.
    fn resolve(
        &mut self,
        port: PortId,
        hop: NextHop,
        parsed: &Parsed,
        now: u64,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Result<Egress, DropReason> {
        let tables = Arc::clone(&self.tables);
        let p = &tables.ports[usize::from(port)];
        let plain = |dst_mac| Egress {
            port,
            dst_mac,
            src_mac: p.mac,
            gso: p.gso,
            tunnel: None,
        };
        match hop {
            NextHop::Mac(m) => Ok(plain(m)),
            NextHop::Via(a) => self.neighbour(port, a, now, out, trace).map(plain),
            NextHop::Direct => self
                .neighbour(port, parsed.key.dst, now, out, trace)
                .map(plain),
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
                Ok(Egress {
                    port: up,
                    dst_mac: peer.vtep_mac,
                    src_mac: ov.vtep_mac,
                    gso: false,
                    tunnel: Some(overlay::Outer {
                        src_mac: tables.ports[usize::from(up)].mac,
                        dst_mac: outer_mac,
                        src,
                        dst: peer.address,
                        vni: ov.vni,
                        port: ov.port,
                        hash: overlay::flow_hash(&parsed.key),
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
    ) -> Result<[u8; 6], DropReason> {
        let r = self.neigh.resolve(port, ip, now);
        if r.probe {
            let tables = Arc::clone(&self.tables);
            let p = &tables.ports[usize::from(port)];
            let frame = match ip {
                IpAddr::V4(target) => arp::Repr {
                    op: arp::REQUEST,
                    sender_mac: p.mac,
                    sender_ip: match p.own_addr(false) {
                        Some(IpAddr::V4(a)) => a,
                        _ => Ipv4Addr::UNSPECIFIED,
                    },
                    target_mac: [0; 6],
                    target_ip: target,
                }
                .frame([0xff; 6], p.mac, None),
                IpAddr::V6(target) => {
                    let src = p
                        .own_addr(true)
                        .and_then(nd::v6)
                        .unwrap_or_else(|| nd::link_local(p.mac));
                    nd::solicit(p.mac, None, src, target)
                }
            };
            self.stats.neigh_probes += 1;
            trace.note("neigh", || {
                format!("{ip} unknown on {}: probe sent", p.name)
            });
            self.send(port, Packet::new(frame, port, now), out);
        }
        r.mac.ok_or(DropReason::NeighUnresolved)
    }

    /// Sends a packet as the egress says: encapsulated when it goes through the overlay.
    fn emit(&mut self, egress: &Egress, mut pkt: Packet, out: &mut Vec<(PortId, Packet)>) {
        if let Some(o) = &egress.tunnel {
            pkt.data = overlay::encapsulate(&pkt.data, o);
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
            if !a.sender_ip.is_unspecified() {
                // Create an entry only for a node that talks to us; refresh any.
                let create = ours && a.op == arp::REQUEST;
                self.neigh.learn(in_id, sender, a.sender_mac, now, create);
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
    /// uplink and host ports answer for the node's addresses and learn.
    fn nd(
        &mut self,
        pkt: &Packet,
        parsed: &Parsed,
        msg: nd::Message,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let tables = Arc::clone(&self.tables);
        let in_id = pkt.meta.in_port;
        let port = &tables.ports[usize::from(in_id)];
        let now = pkt.meta.time_ns;
        let Some(src) = nd::v6(parsed.key.src) else {
            return Verdict::Consumed;
        };
        let src_mac = mac_at(&pkt.data, 6);
        let pod = port.kind == PortKind::Pod;
        let (target, flags) = match msg {
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
                    self.neigh.learn(in_id, IpAddr::V6(src), m, now, ours);
                }
                if !ours || src.is_unspecified() {
                    trace.note("nd", || format!("solicitation for {target}: not answered"));
                    return Verdict::Consumed;
                }
                let router = if pod { nd::FLAG_ROUTER } else { 0 };
                (target, router | nd::FLAG_SOLICITED | nd::FLAG_OVERRIDE)
            }
            nd::Message::Advert { target, tlla, .. } => {
                if !pod {
                    let mac = tlla.unwrap_or(src_mac);
                    self.neigh.learn(in_id, IpAddr::V6(target), mac, now, false);
                }
                trace.note("nd", || format!("advertisement of {target}"));
                return Verdict::Consumed;
            }
            nd::Message::Other(ty) => {
                trace.note("nd", || format!("ICMPv6 type {ty}: not acted on"));
                return Verdict::Consumed;
            }
        };
        let na = nd::advert(
            src_mac,
            port.mac,
            parsed.vlan,
            target,
            src,
            target,
            flags,
            port.mac,
        );
        self.stats.nd_answered += 1;
        trace.note("nd", || {
            format!("{target} is at {} (answered to {src})", MacAddr(port.mac))
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
        self.stats.icmp_sent += 1;
        trace.note("icmp", || {
            format!(
                "{kind:?} sent from {src} to {} via {}",
                parsed.key.src, in_port.name
            )
        });
        // About a packet that came through the overlay: back through the same node.
        if let Some(peer) = tunnel_peer
            && let Some(i) = tables.overlay.as_ref().and_then(|o| o.peer_index(peer))
        {
            let Ok(pe) = parse(&err.data, in_port.zone) else {
                return;
            };
            match self.resolve(in_id, NextHop::Tunnel(i), &pe, now, out, trace) {
                Ok(e) => {
                    err.data[0..6].copy_from_slice(&e.dst_mac);
                    err.data[6..12].copy_from_slice(&e.src_mac);
                    self.emit(&e, err, out);
                }
                Err(r) => self.drops.count(r),
            }
            return;
        }
        self.send(in_id, err, out);
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

    /// The NAT of the first static rule matching a packet, for conntrack to apply if the
    /// packet starts a connection. Masquerade takes the address the egress port has for
    /// the packet's family (after DNAT); without one, no source NAT.
    fn nat_for(&self, tables: &Tables, in_port: PortId, parsed: &Parsed) -> Option<Nat> {
        let rule = tables
            .nat
            .iter()
            .find(|r| r.matches(in_port, &parsed.key))?;
        let snat = match rule.snat {
            Snat::None => None,
            Snat::To(addr, range) => Some((addr, range)),
            Snat::Masquerade => {
                let dst = rule.dnat.map_or(parsed.key.dst, |d| d.0);
                let port = &tables.ports[usize::from(tables.fib.lookup(dst)?.port)];
                let addr = if dst.is_ipv4() {
                    port.addr_v4
                } else {
                    port.addr_v6
                };
                addr.map(|a| (a, None))
            }
        };
        Some(Nat {
            dnat: rule.dnat,
            snat,
        })
    }
}

/// Checks the offload state a port reported against the packet: a partial checksum must
/// start at the transport header and name its checksum field, so that completing it can
/// never write elsewhere (after routing and other checks); a fragment carries neither
/// partial checksums nor GSO requests.
fn check_offload(pkt: &Packet, parsed: &Parsed) -> Result<(), DropReason> {
    let v = pkt.meta.vnet;
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
    if v.is_gso() && parsed.frag.is_some() {
        return Err(DropReason::GsoMalformed);
    }
    Ok(())
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
    port.addresses.contains(&src)
        || match src {
            IpAddr::V6(a) => {
                nd::is_link_local(&a) || (a.is_unspecified() && parsed.proto == proto::ICMPV6)
            }
            IpAddr::V4(_) => false,
        }
}

/// False for what a router never forwards: link-local and multicast destinations,
/// link-local and unspecified sources, IPv4 broadcast.
fn forwardable(parsed: &Parsed) -> bool {
    match (parsed.key.src, parsed.key.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            !(s.is_link_local()
                || s.is_unspecified()
                || d.is_link_local()
                || d.is_multicast()
                || d.is_broadcast())
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            !(nd::is_link_local(&s)
                || s.is_unspecified()
                || nd::is_link_local(&d)
                || d.is_multicast())
        }
        _ => false,
    }
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

/// Marks an oversized TCP packet from a GRO port as the super-packet it is, the way the
/// kernel hands one over: the segment size is what the port's MTU carries with these
/// headers, and the checksum is left partial (pseudo-header sum, NEEDS_CSUM) for
/// whoever segments it or receives it whole.
fn mark_coalesced(pkt: &mut Packet, parsed: &Parsed, port: &Port) {
    let headers = gso_headers(&pkt.data, parsed);
    let mss = usize::from(port.mtu).saturating_sub(headers).max(8);
    let l4_len = parsed.ip_end - parsed.l4_off;
    let pseudo = match (parsed.key.src, parsed.key.dst) {
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

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::tables::{MacAddr, PortSpec, RouteSpec, TablesSpec};
    use crate::wire::build::{self, IpOpts, tcp_flags};
    use crate::{DropCounters, ipf::Reassembler};

    const UPLINK: PortId = 0;
    const POD: PortId = 1;
    const BIG: PortId = 2;
    const POD_MAC: [u8; 6] = [0x0a, 0x58, 0, 0, 0, 5];

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn port(name: &str, last: u8, mtu: u16, addrs: &[&str], gro: bool, gso: bool) -> PortSpec {
        PortSpec {
            name: name.into(),
            mac: MacAddr([2, 0xfe, 0, 0, 0, last]),
            mtu: Some(mtu),
            addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            gro,
            gso,
            ..PortSpec::default()
        }
    }

    fn route(prefix: &str, port: &str, mac: [u8; 6]) -> RouteSpec {
        RouteSpec {
            prefix: prefix.parse().unwrap(),
            port: port.into(),
            next_hop_mac: Some(MacAddr(mac)),
            via: None,
        }
    }

    /// uplink (1500, GRO, addresses), pod (1450), big (9000, GSO-capable).
    fn pipeline() -> Pipeline {
        let spec = TablesSpec {
            ports: vec![
                port(
                    "uplink",
                    1,
                    1500,
                    &["192.168.50.10", "fd00:50::10"],
                    true,
                    false,
                ),
                port("pod", 2, 1450, &["169.254.1.1"], false, false),
                port("big", 3, 9000, &[], false, true),
            ],
            routes: vec![
                route("10.244.1.5/32", "pod", POD_MAC),
                route("fd00:10:244:1::5/128", "pod", POD_MAC),
                route("10.244.9.0/24", "big", [0x0a, 0x58, 0, 0, 0, 9]),
                route("0.0.0.0/0", "uplink", [2, 0, 0, 0, 0, 0xfe]),
                route("::/0", "uplink", [2, 0, 0, 0, 0, 0xfe]),
            ],
            ..TablesSpec::default()
        };
        Pipeline::new(Arc::new(spec.compile().unwrap()))
    }

    fn run(
        p: &mut Pipeline,
        frame: Vec<u8>,
        port: PortId,
        t: u64,
    ) -> (Verdict, Vec<(PortId, Packet)>) {
        let mut out = Vec::new();
        let v = p.process(
            Packet::new(frame, port, t),
            &mut out,
            &mut Trace::disabled(),
        );
        (v, out)
    }

    fn frags(frame: Vec<u8>, id: u32, max: usize) -> Vec<Vec<u8>> {
        let parsed = parse(&frame, 0).unwrap();
        let mut pkt = Packet::new(frame, 0, 0);
        pkt.meta.frag_id = id;
        let mut out = Vec::new();
        ipf::refragment(&pkt, &parsed, max, &mut out).unwrap();
        out.into_iter().map(|p| p.data).collect()
    }

    #[test]
    fn test_forward_decrements_ttl_and_rewrites_macs() {
        let mut p = pipeline();
        let f = build::udp(
            ip("192.168.50.1"),
            ip("10.244.1.5"),
            1,
            2,
            b"hi",
            &IpOpts::default(),
        );
        let (v, out) = run(&mut p, f, UPLINK, 0);
        assert_eq!(v, Verdict::Forwarded);
        assert_eq!(out.len(), 1);
        let (port, pkt) = &out[0];
        assert_eq!(*port, POD);
        assert_eq!(&pkt.data[0..6], &POD_MAC);
        assert_eq!(&pkt.data[6..12], &[2, 0xfe, 0, 0, 0, 2]);
        let q = parse(&pkt.data, 0).expect("header checksum still valid after the TTL update");
        assert_eq!(q.ttl, 63);
        assert_eq!(p.port_stats()[usize::from(POD)].tx_packets, 1);
    }

    #[test]
    fn test_unknown_port_no_route_and_arp_are_counted() {
        let mut p = pipeline();
        let f = build::udp(
            ip("192.168.50.1"),
            ip("10.244.1.5"),
            1,
            2,
            b"",
            &IpOpts::default(),
        );
        assert_eq!(
            run(&mut p, f, 9, 0).0,
            Verdict::Dropped(DropReason::UnknownPort)
        );
        let f = build::udp(ip("fd00::1"), ip("fd00::2"), 1, 2, b"", &IpOpts::default());
        let spec = TablesSpec {
            ports: vec![port("only", 1, 1500, &[], false, false)],
            routes: vec![],
            ..TablesSpec::default()
        };
        let mut q = Pipeline::new(Arc::new(spec.compile().unwrap()));
        assert_eq!(
            run(&mut q, f, 0, 0).0,
            Verdict::Dropped(DropReason::NoRoute)
        );
        assert_eq!(q.drops().get(DropReason::NoRoute), 1);
        let mut arp = vec![0xff; 6];
        arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
        arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2]);
        assert_eq!(
            run(&mut p, arp, UPLINK, 0).0,
            Verdict::Dropped(DropReason::ArpNotHandled)
        );
    }

    #[test]
    fn test_ttl_one_is_answered_with_time_exceeded() {
        let mut p = pipeline();
        let o = IpOpts {
            ttl: 1,
            ..IpOpts::default()
        };
        let f = build::udp(ip("192.168.50.1"), ip("10.244.1.5"), 1, 2, b"x", &o);
        let (v, out) = run(&mut p, f, UPLINK, 0);
        assert_eq!(v, Verdict::Dropped(DropReason::TtlExceeded));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, UPLINK);
        let q = parse(&out[0].1.data, 0).unwrap();
        assert_eq!(q.key.dst_port, 11 << 8, "ICMP time exceeded");
        assert_eq!(q.key.src, ip("192.168.50.10"));
    }

    #[test]
    fn test_df_too_big_gets_fragmentation_needed_with_mtu() {
        let mut p = pipeline();
        let o = IpOpts {
            dont_fragment: true,
            ..IpOpts::default()
        };
        let f = build::udp(ip("192.168.50.1"), ip("10.244.1.5"), 1, 2, &[0; 1472], &o);
        let (v, out) = run(&mut p, f, UPLINK, 0);
        assert_eq!(v, Verdict::Dropped(DropReason::TooBig));
        assert_eq!(out.len(), 1);
        let icmp = &out[0].1.data;
        let q = parse(icmp, 0).unwrap();
        assert_eq!(q.key.dst_port, 3 << 8 | 4);
        assert_eq!(
            u16::from_be_bytes([icmp[q.l4_off + 6], icmp[q.l4_off + 7]]),
            1450
        );
        // IPv6 is never fragmented by a router: packet too big.
        let f = build::udp(
            ip("fd00:50::1"),
            ip("fd00:10:244:1::5"),
            1,
            2,
            &[0; 1452],
            &IpOpts::default(),
        );
        let (v, out) = run(&mut p, f, UPLINK, 0);
        assert_eq!(v, Verdict::Dropped(DropReason::TooBig));
        let q = parse(&out[0].1.data, 0).unwrap();
        assert_eq!(q.key.dst_port, 2 << 8);
        assert_eq!(p.stats().icmp_sent, 2);
    }

    #[test]
    fn test_ipv4_without_df_is_fragmented_to_mtu() {
        let mut p = pipeline();
        let f = build::udp(
            ip("192.168.50.1"),
            ip("10.244.1.5"),
            1,
            2,
            &[7; 1472],
            &IpOpts::default(),
        );
        let (v, out) = run(&mut p, f, UPLINK, 0);
        assert_eq!(v, Verdict::Forwarded);
        assert_eq!(out.len(), 2);
        assert!(
            out.iter()
                .all(|(port, f)| *port == POD && f.data.len() - 14 <= 1450)
        );
    }

    #[test]
    fn test_reassembled_datagram_is_refragmented_to_mru_not_mtu() {
        let mut p = pipeline();
        let whole = build::udp(
            ip("192.168.50.1"),
            ip("10.244.9.7"),
            40000,
            8080,
            &build::pattern(3000, 1),
            &IpOpts::default(),
        );
        let fs = frags(whole, 0x42, 1000);
        let n = fs.len();
        let mut last = (Verdict::Held, Vec::new());
        for (i, f) in fs.into_iter().rev().enumerate() {
            last = run(&mut p, f, UPLINK, i as u64);
            if i + 1 < n {
                assert_eq!(last.0, Verdict::Held);
            }
        }
        assert_eq!(last.0, Verdict::Forwarded);
        // Port "big" has MTU 9000 but the fragments were at most 1000 bytes: refragment to 1000.
        assert_eq!(last.1.len(), n);
        for (port, f) in &last.1 {
            assert_eq!(*port, BIG);
            assert!(f.data.len() - 14 <= 1000);
        }
        assert_eq!(p.stats().reassembled, 1);
    }

    #[test]
    fn test_gro_super_packet_is_segmented_never_fragmented() {
        let mut p = pipeline();
        let o = IpOpts {
            dont_fragment: true,
            ..IpOpts::default()
        };
        let f = build::tcp(
            ip("192.168.50.1"),
            ip("10.244.1.5"),
            443,
            5000,
            100,
            1,
            tcp_flags::ACK,
            &build::pattern(6000, 2),
            &o,
        );
        let (v, out) = run(&mut p, f, UPLINK, 0);
        assert_eq!(v, Verdict::Forwarded);
        assert!(out.len() >= 5);
        let mut seq = 100u32;
        for (port, s) in &out {
            assert_eq!(*port, POD);
            let q = parse(&s.data, 0).unwrap();
            assert!(q.frag.is_none());
            assert!(q.ip_len() <= 1450);
            let got = u32::from_be_bytes(s.data[q.l4_off + 4..q.l4_off + 8].try_into().unwrap());
            assert_eq!(got, seq);
            seq += (q.ip_end - q.l4_off - 20) as u32;
        }
        assert_eq!(seq, 6100);
        assert_eq!(p.stats().gro_marked, 1);
    }

    #[test]
    fn test_gso_packet_goes_whole_to_a_gso_port() {
        let mut p = pipeline();
        let f = build::tcp(
            ip("192.168.50.1"),
            ip("10.244.9.7"),
            443,
            5000,
            1,
            1,
            tcp_flags::ACK,
            &build::pattern(20000, 2),
            &IpOpts::default(),
        );
        let mut pkt = Packet::new(f, UPLINK, 0);
        pkt.meta.vnet.gso_type = VnetHdr::GSO_TCPV4;
        pkt.meta.vnet.gso_size = 1448;
        let mut out = Vec::new();
        assert_eq!(
            p.process(pkt, &mut out, &mut Trace::disabled()),
            Verdict::Forwarded
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1.meta.vnet.gso_size, 1448);
    }

    #[test]
    fn test_partial_checksum_is_completed_for_a_plain_port() {
        let mut p = pipeline();
        let mut f = build::udp(
            ip("192.168.50.1"),
            ip("10.244.1.5"),
            1,
            2,
            b"payload",
            &IpOpts::default(),
        );
        let want = f.clone();
        let l4 = 34;
        let pseudo = checksum::fold(checksum::pseudo_v4(
            [192, 168, 50, 1],
            [10, 244, 1, 5],
            17,
            15,
        ));
        f[l4 + 6..l4 + 8].copy_from_slice(&pseudo.to_be_bytes());
        let mut pkt = Packet::new(f, UPLINK, 0);
        pkt.meta.vnet.flags = VnetHdr::F_NEEDS_CSUM;
        pkt.meta.vnet.csum_start = l4 as u16;
        pkt.meta.vnet.csum_offset = 6;
        let mut out = Vec::new();
        assert_eq!(
            p.process(pkt, &mut out, &mut Trace::disabled()),
            Verdict::Forwarded
        );
        assert_eq!(&out[0].1.data[l4 + 6..l4 + 8], &want[l4 + 6..l4 + 8]);
        assert!(!out[0].1.meta.vnet.needs_csum());
    }

    #[test]
    fn test_incomplete_datagram_expires_on_tick() {
        let mut p = pipeline();
        let whole = build::udp(
            ip("192.168.50.1"),
            ip("10.244.1.5"),
            1,
            2,
            &[1; 3000],
            &IpOpts::default(),
        );
        let first = frags(whole, 9, 1500).remove(0);
        assert_eq!(run(&mut p, first, UPLINK, 0).0, Verdict::Held);
        assert_eq!(p.reassembler().held_datagrams(), 1);
        p.tick(29 * 1_000_000_000);
        assert_eq!(p.reassembler().held_datagrams(), 1);
        p.tick(31 * 1_000_000_000);
        assert_eq!(p.reassembler().held_datagrams(), 0);
        assert_eq!(p.reassembler().held_bytes(), 0);
        assert_eq!(p.drops().get(DropReason::FragExpired), 1);
    }

    #[test]
    fn test_trace_records_each_stage() {
        let mut p = pipeline();
        let f = build::udp(
            ip("192.168.50.1"),
            ip("10.244.1.5"),
            1,
            2,
            b"hi",
            &IpOpts::default(),
        );
        let mut t = Trace::enabled();
        let mut out = Vec::new();
        p.process(Packet::new(f, UPLINK, 0), &mut out, &mut t);
        let stages: Vec<&str> = t.events.iter().map(|e| e.stage).collect();
        assert_eq!(stages, ["parse", "ct", "route", "commit", "egress"]);
        assert_eq!(t.ct_name(), Some("new"));
    }

    /// The test node with a NAT rule: TCP/UDP to the VIP 10.96.0.10 port 53 goes to the pod
    /// 10.244.1.5 port 5353; traffic from the pod to 192.168.60.0/24 is masqueraded.
    fn nat_pipeline(pass_invalid: bool) -> Pipeline {
        use crate::tables::{CtSpec, MatchSpec, NatRuleSpec};
        let mut spec = TablesSpec {
            ports: vec![
                port(
                    "uplink",
                    1,
                    1500,
                    &["192.168.50.10", "fd00:50::10"],
                    true,
                    false,
                ),
                port("pod", 2, 1450, &["169.254.1.1"], false, false),
            ],
            routes: vec![
                route("10.244.1.5/32", "pod", POD_MAC),
                route("0.0.0.0/0", "uplink", [2, 0, 0, 0, 0, 0xfe]),
            ],
            ..TablesSpec::default()
        };
        for proto in ["udp", "tcp"] {
            spec.nat.push(NatRuleSpec {
                matches: MatchSpec {
                    proto: Some(proto.into()),
                    dst: Some("10.96.0.10/32".parse().unwrap()),
                    dst_port: Some(53),
                    ..MatchSpec::default()
                },
                dnat: Some("10.244.1.5:5353".into()),
                snat: None,
                masquerade: false,
            });
        }
        spec.nat.push(NatRuleSpec {
            matches: MatchSpec {
                in_port: Some("pod".into()),
                dst: Some("192.168.60.0/24".parse().unwrap()),
                ..MatchSpec::default()
            },
            dnat: None,
            snat: None,
            masquerade: true,
        });
        spec.ct = CtSpec {
            pass_invalid,
            ..CtSpec::default()
        };
        Pipeline::new(Arc::new(spec.compile().unwrap()))
    }

    #[test]
    fn test_dnat_rule_translates_both_directions() {
        let mut p = nat_pipeline(false);
        let q = build::udp(
            ip("192.168.50.1"),
            ip("10.96.0.10"),
            40000,
            53,
            b"query",
            &IpOpts::default(),
        );
        let mut t = Trace::enabled();
        let mut out = Vec::new();
        assert_eq!(
            p.process(Packet::new(q, UPLINK, 0), &mut out, &mut t),
            Verdict::Forwarded
        );
        assert_eq!(t.ct_name(), Some("new"));
        let (port, fwd) = &out[0];
        assert_eq!(*port, POD);
        let k = parse(&fwd.data, 0).unwrap().key;
        assert_eq!(
            (k.dst, k.dst_port, k.src, k.src_port),
            (ip("10.244.1.5"), 5353, ip("192.168.50.1"), 40000)
        );
        // The answer leaves with the VIP as its source.
        let a = build::udp(
            ip("10.244.1.5"),
            ip("192.168.50.1"),
            5353,
            40000,
            b"answer",
            &IpOpts::default(),
        );
        let mut t = Trace::enabled();
        out.clear();
        assert_eq!(
            p.process(Packet::new(a, POD, 1), &mut out, &mut t),
            Verdict::Forwarded
        );
        assert_eq!(t.ct_name(), Some("reply"));
        let k = parse(&out[0].1.data, 0).unwrap().key;
        assert_eq!((k.src, k.src_port), (ip("10.96.0.10"), 53));
        assert_eq!(p.conntrack().len(), 1);
    }

    #[test]
    fn test_fragments_to_a_dnat_vip_are_reassembled_translated_and_refragmented() {
        // The Antrea/OVS case: the connection is found for fragments whichever comes last.
        let mut p = nat_pipeline(false);
        let q = build::udp(
            ip("192.168.50.1"),
            ip("10.96.0.10"),
            40000,
            53,
            &build::pattern(4000, 3),
            &IpOpts::default(),
        );
        let first = build::udp(
            ip("192.168.50.1"),
            ip("10.96.0.10"),
            40000,
            53,
            b"x",
            &IpOpts::default(),
        );
        assert_eq!(run(&mut p, first, UPLINK, 0).0, Verdict::Forwarded);
        let fs = frags(q.clone(), 0, 1500);
        let n = fs.len();
        let mut last = None;
        for (i, f) in fs.into_iter().rev().enumerate() {
            let mut t = Trace::enabled();
            let mut out = Vec::new();
            let v = p.process(Packet::new(f, UPLINK, 10 + i as u64), &mut out, &mut t);
            if i + 1 < n {
                assert_eq!(v, Verdict::Held);
            } else {
                assert_eq!(v, Verdict::Forwarded);
                assert_eq!(
                    t.ct_name(),
                    Some("established"),
                    "the reassembled datagram finds its connection"
                );
                last = Some(out);
            }
        }
        let out = last.unwrap();
        let mut r = Reassembler::new(ipf::Config::default());
        let mut d = DropCounters::default();
        let mut whole = None;
        for (port, f) in out {
            assert_eq!(port, POD);
            assert!(f.data.len() - 14 <= 1450);
            let pf = parse(&f.data, 0).unwrap();
            if let ipf::Outcome::Complete(w, pw) = r.process(f, &pf, &mut d) {
                whole = Some((w, pw));
            }
        }
        let (w, pw) = whole.expect("the pod receives the whole datagram");
        assert_eq!((pw.key.dst, pw.key.dst_port), (ip("10.244.1.5"), 5353));
        assert_eq!(&w.data[pw.l4_off + 8..], &build::pattern(4000, 3)[..]);
        let l4 = &w.data[pw.l4_off..pw.ip_end];
        let sum = checksum::add(
            l4,
            checksum::pseudo_v4([192, 168, 50, 1], [10, 244, 1, 5], 17, l4.len() as u16),
        );
        assert_eq!(
            checksum::fold(sum),
            0xffff,
            "UDP checksum of the translated datagram verifies"
        );
    }

    #[test]
    fn test_invalid_is_dropped_unless_configured_to_pass() {
        // An ICMP error about a connection nobody made.
        let bogus = build::udp(
            ip("10.244.1.5"),
            ip("192.168.50.1"),
            1,
            2,
            b"x",
            &IpOpts::default(),
        );
        let pb = parse(&bogus, 0).unwrap();
        let err = icmp::build_error(
            &bogus,
            &pb,
            ErrorKind::Unreachable { code: 3 },
            ip("192.168.50.1"),
            [2; 6],
        )
        .unwrap();
        let mut p = nat_pipeline(false);
        assert_eq!(
            run(&mut p, err.clone(), UPLINK, 0).0,
            Verdict::Dropped(DropReason::CtInvalid)
        );
        let mut p = nat_pipeline(true);
        assert_eq!(run(&mut p, err, UPLINK, 0).0, Verdict::Forwarded);
    }

    #[test]
    fn test_too_big_error_for_a_translated_packet_is_translated_back() {
        let mut p = nat_pipeline(false);
        let o = IpOpts {
            dont_fragment: true,
            ..IpOpts::default()
        };
        let q = build::udp(
            ip("192.168.50.1"),
            ip("10.96.0.10"),
            40000,
            53,
            &[0; 1472],
            &o,
        );
        let (v, out) = run(&mut p, q, UPLINK, 0);
        assert_eq!(v, Verdict::Dropped(DropReason::TooBig));
        assert_eq!(out.len(), 1, "an ICMP error goes back");
        let (port, e) = &out[0];
        assert_eq!(*port, UPLINK);
        let pe = parse(&e.data, 0).unwrap();
        assert_eq!(pe.key.dst, ip("192.168.50.1"));
        let emb = crate::wire::icmp_error::embedded(&e.data, &pe)
            .unwrap()
            .unwrap();
        assert_eq!(
            (emb.key.dst, emb.key.dst_port),
            (ip("10.96.0.10"), 53),
            "the client sees its own packet quoted"
        );
        let icmp = &e.data[pe.l4_off..pe.ip_end];
        assert_eq!(
            checksum::checksum(icmp),
            0,
            "ICMP checksum verifies after translation"
        );
    }

    #[test]
    fn test_masquerade_uses_the_egress_port_address() {
        let mut p = nat_pipeline(false);
        let f = build::tcp(
            ip("10.244.1.5"),
            ip("192.168.60.7"),
            33000,
            443,
            1,
            0,
            tcp_flags::SYN,
            b"",
            &IpOpts::default(),
        );
        let (v, out) = run(&mut p, f, POD, 0);
        assert_eq!(v, Verdict::Forwarded);
        let k = parse(&out[0].1.data, 0).unwrap().key;
        assert_eq!(k.src, ip("192.168.50.10"));
        let back = build::tcp(
            ip("192.168.60.7"),
            k.src,
            443,
            k.src_port,
            9,
            2,
            tcp_flags::SYN | tcp_flags::ACK,
            b"",
            &IpOpts::default(),
        );
        let (v, out) = run(&mut p, back, UPLINK, 1);
        assert_eq!(v, Verdict::Forwarded);
        let k = parse(&out[0].1.data, 0).unwrap().key;
        assert_eq!((k.dst, k.dst_port), (ip("10.244.1.5"), 33000));
    }

    #[test]
    fn test_partial_checksum_must_name_the_transport_checksum() {
        // A sender must not choose where completing its checksum writes: here, into the
        // IPv6 source address.
        let mut p = pipeline();
        let f = build::udp(
            ip("fd00:50::1"),
            ip("fd00:10:244:1::5"),
            1,
            2,
            b"payload",
            &IpOpts::default(),
        );
        let mut pkt = Packet::new(f, UPLINK, 0);
        pkt.meta.vnet.flags = VnetHdr::F_NEEDS_CSUM;
        pkt.meta.vnet.csum_start = 22;
        pkt.meta.vnet.csum_offset = 0;
        let mut out = Vec::new();
        let v = p.process(pkt, &mut out, &mut Trace::disabled());
        assert_eq!(v, Verdict::Dropped(DropReason::CsumOffloadInvalid));
        assert!(out.is_empty());
    }

    #[test]
    fn test_gro_packet_sent_whole_carries_a_partial_checksum() {
        let mut spec_p = pipeline();
        let f = build::tcp(
            ip("192.168.50.1"),
            ip("10.244.9.7"),
            443,
            5000,
            1,
            1,
            tcp_flags::ACK,
            &build::pattern(6000, 4),
            &IpOpts::default(),
        );
        let (v, out) = run(&mut spec_p, f, UPLINK, 0);
        assert_eq!(v, Verdict::Forwarded);
        assert_eq!(out.len(), 1, "whole to the GSO port");
        let mut pkt = out.into_iter().next().unwrap().1;
        let vnet = pkt.meta.vnet;
        assert!(vnet.needs_csum() && vnet.is_gso());
        assert_eq!(vnet.gso_size, 1460);
        checksum::complete_partial(
            &mut pkt.data,
            usize::from(vnet.csum_start),
            usize::from(vnet.csum_offset),
        )
        .unwrap();
        let q = parse(&pkt.data, 0).unwrap();
        let l4 = &pkt.data[q.l4_off..q.ip_end];
        let sum = checksum::add(
            l4,
            checksum::pseudo_v4([192, 168, 50, 1], [10, 244, 9, 7], 6, l4.len() as u16),
        );
        assert_eq!(
            checksum::fold(sum),
            0xffff,
            "the completed checksum verifies"
        );
    }

    #[test]
    fn test_gso_to_a_gso_port_never_exceeds_its_mtu() {
        let spec = TablesSpec {
            ports: vec![
                port("a", 1, 9000, &[], false, false),
                port("small", 2, 1280, &[], false, true),
            ],
            routes: vec![route("10.0.0.0/8", "small", POD_MAC)],
            ..TablesSpec::default()
        };
        let mut p = Pipeline::new(Arc::new(spec.compile().unwrap()));
        let f = build::tcp(
            ip("192.168.0.1"),
            ip("10.0.0.1"),
            1,
            2,
            1,
            1,
            tcp_flags::ACK,
            &[1; 20000],
            &IpOpts::default(),
        );
        let mut pkt = Packet::new(f, 0, 0);
        pkt.meta.vnet.gso_type = VnetHdr::GSO_TCPV4;
        pkt.meta.vnet.gso_size = 8948;
        let mut out = Vec::new();
        assert_eq!(
            p.process(pkt, &mut out, &mut Trace::disabled()),
            Verdict::Forwarded
        );
        assert_eq!(out[0].1.meta.vnet.gso_size, 1280 - 40);
    }

    #[test]
    fn test_fragments_larger_than_the_mtu_are_not_fragmented_in_transit() {
        // IPv6 fragments of 1500 bytes towards a 1450 port: packet too big, as Linux does.
        let mut p = pipeline();
        let whole = build::udp(
            ip("fd00:50::1"),
            ip("fd00:10:244:1::5"),
            1,
            2,
            &build::pattern(3000, 5),
            &IpOpts::default(),
        );
        let mut out = Vec::new();
        let mut last = Verdict::Held;
        for f in frags(whole, 77, 1500) {
            out.clear();
            last = p.process(Packet::new(f, UPLINK, 0), &mut out, &mut Trace::disabled());
        }
        assert_eq!(last, Verdict::Dropped(DropReason::TooBig));
        assert_eq!(out.len(), 1);
        let q = parse(&out[0].1.data, 0).unwrap();
        assert_eq!(q.key.dst_port, 2 << 8, "ICMPv6 packet too big");
        // IPv4 without DF may be fragmented further.
        let whole = build::udp(
            ip("192.168.50.1"),
            ip("10.244.1.5"),
            1,
            2,
            &build::pattern(3000, 5),
            &IpOpts::default(),
        );
        for f in frags(whole, 78, 1500) {
            out.clear();
            last = p.process(Packet::new(f, UPLINK, 0), &mut out, &mut Trace::disabled());
        }
        assert_eq!(last, Verdict::Forwarded);
        assert!(
            out.iter()
                .all(|(port, f)| *port == POD && f.data.len() - 14 <= 1450)
        );
    }

    #[test]
    fn test_uso_datagrams_over_the_mtu_are_fragmented_or_refused() {
        // Four 1400-byte datagrams in one USO packet towards the 1450 pod port: each
        // datagram (1428 bytes of IP) fits and leaves whole.
        let uso = |src: &str, dst: &str, o: &IpOpts| {
            let f = build::udp(ip(src), ip(dst), 1, 2, &build::pattern(4 * 1400, 6), o);
            let mut pkt = Packet::new(f, UPLINK, 0);
            pkt.meta.vnet.gso_type = VnetHdr::GSO_UDP_L4;
            pkt.meta.vnet.gso_size = 1400;
            pkt
        };
        let mut p = pipeline();
        let mut out = Vec::new();
        let v = p.process(
            uso("192.168.50.1", "10.244.1.5", &IpOpts::default()),
            &mut out,
            &mut Trace::disabled(),
        );
        assert_eq!(v, Verdict::Forwarded);
        assert_eq!(out.len(), 4);
        // 1440-byte datagrams do not fit 1450: IPv4 without DF is fragmented per datagram,
        // IPv4 with DF and IPv6 get "too big" with the MTU.
        let big = |src: &str, dst: &str, o: &IpOpts| {
            let mut pkt = uso(src, dst, o);
            pkt.meta.vnet.gso_size = 1440;
            pkt
        };
        out.clear();
        let v = p.process(
            big("192.168.50.1", "10.244.1.5", &IpOpts::default()),
            &mut out,
            &mut Trace::disabled(),
        );
        assert_eq!(v, Verdict::Forwarded);
        assert!(
            out.len() > 4 && out.iter().all(|(_, f)| f.data.len() - 14 <= 1450),
            "fragmented per datagram"
        );
        out.clear();
        let df = IpOpts {
            dont_fragment: true,
            ..IpOpts::default()
        };
        let v = p.process(
            big("192.168.50.1", "10.244.1.5", &df),
            &mut out,
            &mut Trace::disabled(),
        );
        assert_eq!(v, Verdict::Dropped(DropReason::TooBig));
        out.clear();
        let v = p.process(
            big("fd00:50::1", "fd00:10:244:1::5", &IpOpts::default()),
            &mut out,
            &mut Trace::disabled(),
        );
        assert_eq!(v, Verdict::Dropped(DropReason::TooBig));
        assert_eq!(out.len(), 1, "packet too big goes back");
    }
}

/// Two nodes on one underlay subnet, each with two pods, through the overlay.
#[cfg(test)]
mod overlay_tests {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use super::*;
    use crate::tables::{
        MacAddr, ModeSpec, NodeSpec, OverlaySpec, PeerSpec, PortSpec, RouteSpec, TablesSpec,
    };
    use crate::wire::build::{self, IpOpts, tcp_flags};

    const UPLINK: PortId = 0;
    const POD: PortId = 1;
    const POD2: PortId = 2;
    const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0xfe];
    const SEC: u64 = 1_000_000_000;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Node `n` (1 or 2): uplink 192.168.50.n0/24 and fd00:50::n0/64, pods 10.244.n.5
    /// and 10.244.n.6 (and fd00:10:244:n::5), default routes via the .1 gateways.
    fn node_spec(n: u8, mode: ModeSpec, peers: Vec<PeerSpec>) -> TablesSpec {
        let pod = |name: &str, last: u8| PortSpec {
            name: name.into(),
            kind: PortKind::Pod,
            mac: MacAddr([0xee, 0xee, 0xee, 0xee, n, last]),
            peer_mac: Some(MacAddr(pod_mac(n, last))),
            addresses: vec![
                format!("10.244.{n}.{last}").parse().unwrap(),
                format!("fd00:10:244:{n}::{last}").parse().unwrap(),
            ],
            ..PortSpec::default()
        };
        let via = |prefix: &str, gw: &str| RouteSpec {
            prefix: prefix.parse().unwrap(),
            port: "eth0".into(),
            next_hop_mac: None,
            via: Some(ip(gw)),
        };
        TablesSpec {
            ports: vec![
                PortSpec {
                    name: "eth0".into(),
                    kind: PortKind::Uplink,
                    mac: MacAddr(uplink_mac(n)),
                    addresses: vec![
                        format!("192.168.50.{}/24", n * 10).parse().unwrap(),
                        format!("fd00:50::{}/64", n * 10).parse().unwrap(),
                    ],
                    ..PortSpec::default()
                },
                pod("pod-a", 5),
                pod("pod-b", 6),
            ],
            routes: vec![via("0.0.0.0/0", "192.168.50.1"), via("::/0", "fd00:50::1")],
            node: NodeSpec {
                name: format!("node{n}"),
                addresses: vec![],
            },
            overlay: Some(OverlaySpec {
                vni: 4096,
                port: 4789,
                mode,
                uplink: "eth0".into(),
                mac: None,
            }),
            nodes: peers,
            ..TablesSpec::default()
        }
    }

    fn peer(n: u8, address: &str) -> PeerSpec {
        PeerSpec {
            name: format!("node{n}"),
            address: ip(address),
            pod_cidrs: vec![
                format!("10.244.{n}.0/24").parse().unwrap(),
                format!("fd00:10:244:{n}::/64").parse().unwrap(),
            ],
            mac: None,
        }
    }

    fn pod_mac(n: u8, last: u8) -> [u8; 6] {
        [0x0a, 0x58, 0x0a, 0xf4, n, last]
    }

    fn uplink_mac(n: u8) -> [u8; 6] {
        [2, 0xaa, 0, 0, 0, n]
    }

    /// The two nodes of the tests, encapsulating always.
    fn nodes() -> (Pipeline, Pipeline) {
        let a = node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")]);
        let b = node_spec(2, ModeSpec::Always, vec![peer(1, "192.168.50.10")]);
        (
            Pipeline::new(Arc::new(a.compile().unwrap())),
            Pipeline::new(Arc::new(b.compile().unwrap())),
        )
    }

    fn run(
        p: &mut Pipeline,
        frame: Vec<u8>,
        port: PortId,
        t: u64,
    ) -> (Verdict, Vec<(PortId, Packet)>) {
        let mut out = Vec::new();
        let v = p.process(
            Packet::new(frame, port, t),
            &mut out,
            &mut Trace::disabled(),
        );
        (v, out)
    }

    /// Options for a frame sent by pod `last` of node `n` to its gateway.
    fn from_pod(n: u8, last: u8) -> IpOpts {
        IpOpts {
            src_mac: pod_mac(n, last),
            dst_mac: [0xee, 0xee, 0xee, 0xee, n, last],
            ..IpOpts::default()
        }
    }

    fn udp_from_pod(dst: &str, sport: u16, payload: &[u8]) -> Vec<u8> {
        build::udp(
            ip("10.244.1.5"),
            ip(dst),
            sport,
            7000,
            payload,
            &from_pod(1, 5),
        )
    }

    /// An ARP reply from `ip` at `mac` to node `n`'s uplink.
    fn arp_reply(n: u8, from: &str, mac: [u8; 6]) -> Vec<u8> {
        let IpAddr::V4(from) = ip(from) else { panic!() };
        arp::Repr {
            op: arp::REPLY,
            sender_mac: mac,
            sender_ip: from,
            target_mac: uplink_mac(n),
            target_ip: Ipv4Addr::new(192, 168, 50, n * 10),
        }
        .frame(uplink_mac(n), mac, None)
    }

    /// Teaches node `n` where `addr` is, the way it learns it: its probe, then a reply.
    fn learn(p: &mut Pipeline, n: u8, addr: &str, mac: [u8; 6]) {
        let mut out = Vec::new();
        p.neighbour(UPLINK, ip(addr), 0, &mut out, &mut Trace::disabled())
            .unwrap_err();
        assert_eq!(
            run(p, arp_reply(n, addr, mac), UPLINK, 0).0,
            Verdict::Consumed
        );
    }

    fn arp_of(frame: &[u8]) -> arp::Repr {
        let p = parse(frame, 0).unwrap();
        assert_eq!(p.l3, L3::Arp);
        arp::Repr::parse(&frame[p.l3_off..]).unwrap()
    }

    #[test]
    fn test_pod_to_remote_pod_is_vxlan_encapsulated_and_delivered_by_the_peer() {
        let (mut a, mut b) = nodes();
        learn(&mut a, 1, "192.168.50.20", uplink_mac(2));
        let payload = build::pattern(1000, 7);
        let (v, out) = run(
            &mut a,
            udp_from_pod("10.244.2.6", 40000, &payload),
            POD,
            SEC,
        );
        assert_eq!(v, Verdict::Forwarded);
        assert_eq!(out.len(), 1);
        let (port, f) = &out[0];
        assert_eq!(*port, UPLINK);
        assert_eq!(
            &f.data[0..6],
            &uplink_mac(2),
            "outer destination: the peer's uplink"
        );
        assert_eq!(&f.data[6..12], &uplink_mac(1));
        let o = parse(&f.data, 0).unwrap();
        assert_eq!(o.l3, L3::Ipv4);
        assert!(!o.dont_fragment);
        assert_eq!(o.ttl, 64);
        assert_eq!(
            (o.key.src, o.key.dst, o.key.proto, o.key.dst_port),
            (ip("192.168.50.10"), ip("192.168.50.20"), proto::UDP, 4789)
        );
        let sport = o.key.src_port;
        assert!(sport >= 49152);
        assert_eq!(
            &f.data[o.l4_off + 6..o.l4_off + 8],
            &[0, 0],
            "no UDP checksum over IPv4"
        );
        let vx = vxlan::Repr::parse(&f.data[o.l4_off + 8..]).unwrap();
        assert_eq!(vx.vni, 4096);
        let inner = &f.data[o.l4_off + 16..];
        let i = parse(inner, 0).unwrap();
        assert_eq!(
            (i.key.src, i.key.dst, i.ttl),
            (ip("10.244.1.5"), ip("10.244.2.6"), 63)
        );
        assert_eq!(&inner[0..6], &overlay::vtep_mac(ip("192.168.50.20")));
        assert_eq!(&inner[6..12], &overlay::vtep_mac(ip("192.168.50.10")));
        assert_eq!(
            &inner[i.l4_off + 8..i.ip_end],
            &payload[..],
            "inner frame intact"
        );
        assert_eq!(a.stats().encapsulated, 1);

        // The same flow keeps its source port; the frame is the same but for the TTL.
        let (_, again) = run(
            &mut a,
            udp_from_pod("10.244.2.6", 40000, &payload),
            POD,
            SEC,
        );
        assert_eq!(parse(&again[0].1.data, 0).unwrap().key.src_port, sport);

        // The peer decapsulates it and delivers it to the right pod.
        let mut t = Trace::enabled();
        let mut got = Vec::new();
        let v = b.process(Packet::new(f.data.clone(), UPLINK, SEC), &mut got, &mut t);
        assert_eq!(v, Verdict::Forwarded, "{:?}", t.events);
        assert_eq!(got.len(), 1);
        let (port, d) = &got[0];
        assert_eq!(*port, POD2);
        assert_eq!(&d.data[0..6], &pod_mac(2, 6));
        assert_eq!(&d.data[6..12], &[0xee, 0xee, 0xee, 0xee, 2, 6]);
        let dp = parse(&d.data, 0).unwrap();
        assert_eq!(
            (dp.key.src, dp.key.dst, dp.ttl),
            (ip("10.244.1.5"), ip("10.244.2.6"), 62)
        );
        assert_eq!(&d.data[dp.l4_off + 8..dp.ip_end], &payload[..]);
        let stages: Vec<&str> = t.events.iter().map(|e| e.stage).collect();
        assert_eq!(
            stages,
            ["parse", "decap", "ct", "route", "commit", "egress"]
        );
        // Conntrack remembers the node the connection came through.
        let (id, _) = b.conntrack().lookup(&dp.key).unwrap();
        assert_eq!(
            b.conntrack().get(id).unwrap().tunnel_peer(),
            Some(ip("192.168.50.10"))
        );
    }

    #[test]
    fn test_reply_returns_through_the_node_the_connection_came_from() {
        // Node 2 learns a connection from a client outside (192.168.60.7) that node 1
        // forwarded; the reply goes back to node 1 encapsulated, not to the gateway.
        let (_, mut b) = nodes();
        learn(&mut b, 2, "192.168.50.10", uplink_mac(1));
        let inner = build::tcp(
            ip("192.168.60.7"),
            ip("10.244.2.5"),
            5555,
            80,
            1,
            0,
            tcp_flags::SYN,
            b"",
            &IpOpts::default(),
        );
        let outer = overlay::encapsulate(
            &inner,
            &overlay::Outer {
                src_mac: uplink_mac(1),
                dst_mac: uplink_mac(2),
                src: ip("192.168.50.10"),
                dst: ip("192.168.50.20"),
                vni: 4096,
                port: 4789,
                hash: 9,
            },
        );
        assert_eq!(run(&mut b, outer, UPLINK, 0).0, Verdict::Forwarded);
        let reply = build::tcp(
            ip("10.244.2.5"),
            ip("192.168.60.7"),
            80,
            5555,
            9,
            2,
            tcp_flags::SYN | tcp_flags::ACK,
            b"",
            &from_pod(2, 5),
        );
        let (v, out) = run(&mut b, reply, POD, 1);
        assert_eq!(v, Verdict::Forwarded);
        let o = parse(&out[0].1.data, 0).unwrap();
        assert_eq!((o.key.dst, o.key.dst_port), (ip("192.168.50.10"), 4789));
    }

    #[test]
    fn test_source_check_drops_a_pod_sending_as_someone_else() {
        let (mut a, _) = nodes();
        let other_ip = build::udp(
            ip("10.244.1.99"),
            ip("10.244.1.6"),
            1,
            2,
            b"x",
            &from_pod(1, 5),
        );
        assert_eq!(
            run(&mut a, other_ip, POD, 0).0,
            Verdict::Dropped(DropReason::SourceSpoofed)
        );
        let other_mac = build::udp(
            ip("10.244.1.5"),
            ip("10.244.1.6"),
            1,
            2,
            b"x",
            &IpOpts {
                src_mac: [2, 1, 2, 3, 4, 5],
                ..from_pod(1, 5)
            },
        );
        assert_eq!(
            run(&mut a, other_mac, POD, 0).0,
            Verdict::Dropped(DropReason::SourceSpoofed)
        );
        let v6 = build::udp(
            ip("fd00:10:244:1::6"),
            ip("fd00:10:244:1::5"),
            1,
            2,
            b"x",
            &from_pod(1, 5),
        );
        assert_eq!(
            run(&mut a, v6, POD, 0).0,
            Verdict::Dropped(DropReason::SourceSpoofed)
        );
        // Its own addresses pass, to the pod next door.
        let (v, out) = run(&mut a, udp_from_pod("10.244.1.6", 1, b"x"), POD, 0);
        assert_eq!(v, Verdict::Forwarded);
        assert_eq!(out[0].0, POD2);
        assert_eq!(&out[0].1.data[0..6], &pod_mac(1, 6));
        assert_eq!(a.drops().get(DropReason::SourceSpoofed), 3);
    }

    fn arp_request(sender_mac: [u8; 6], sender: &str, target: &str) -> Vec<u8> {
        let (IpAddr::V4(s), IpAddr::V4(t)) = (ip(sender), ip(target)) else {
            panic!()
        };
        arp::Repr {
            op: arp::REQUEST,
            sender_mac,
            sender_ip: s,
            target_mac: [0; 6],
            target_ip: t,
        }
        .frame([0xff; 6], sender_mac, None)
    }

    #[test]
    fn test_pod_arp_is_answered_from_the_port_mac_for_any_address() {
        let (mut a, _) = nodes();
        let port_mac = [0xee, 0xee, 0xee, 0xee, 1, 5];
        for target in ["169.254.1.1", "10.244.1.6", "8.8.8.8"] {
            let (v, out) = run(
                &mut a,
                arp_request(pod_mac(1, 5), "10.244.1.5", target),
                POD,
                0,
            );
            assert_eq!(v, Verdict::Consumed);
            assert_eq!(out.len(), 1, "one answer, to the pod only");
            let (port, f) = &out[0];
            assert_eq!(*port, POD);
            assert_eq!(&f.data[0..6], &pod_mac(1, 5));
            assert_eq!(&f.data[6..12], &port_mac);
            let r = arp_of(&f.data);
            assert_eq!(r.op, arp::REPLY);
            assert_eq!(
                (r.sender_mac, IpAddr::V4(r.sender_ip)),
                (port_mac, ip(target))
            );
            assert_eq!(
                (r.target_mac, IpAddr::V4(r.target_ip)),
                (pod_mac(1, 5), ip("10.244.1.5"))
            );
        }
        // A duplicate address probe for the pod's own address gets no answer.
        let (v, out) = run(
            &mut a,
            arp_request(pod_mac(1, 5), "0.0.0.0", "10.244.1.5"),
            POD,
            0,
        );
        assert_eq!((v, out.len()), (Verdict::Consumed, 0));
        // Nor does a pod asking as another.
        let (v, out) = run(
            &mut a,
            arp_request(pod_mac(1, 5), "10.244.1.6", "169.254.1.1"),
            POD,
            0,
        );
        assert_eq!(
            (v, out.len()),
            (Verdict::Dropped(DropReason::SourceSpoofed), 0)
        );
        assert_eq!(a.stats().arp_answered, 3);
    }

    fn ns(src_mac: [u8; 6], src: Ipv6Addr, target: &str) -> Vec<u8> {
        let IpAddr::V6(t) = ip(target) else { panic!() };
        nd::solicit(src_mac, None, src, t)
    }

    #[test]
    fn test_pod_neighbour_solicitation_is_answered_as_a_router() {
        let (mut a, _) = nodes();
        let port_mac = [0xee, 0xee, 0xee, 0xee, 1, 5];
        let ll = nd::link_local(pod_mac(1, 5));
        let (v, out) = run(&mut a, ns(pod_mac(1, 5), ll, "fe80::1"), POD, 0);
        assert_eq!(v, Verdict::Consumed);
        assert_eq!(out.len(), 1);
        let (port, f) = &out[0];
        assert_eq!(*port, POD);
        assert_eq!(
            (&f.data[0..6], &f.data[6..12]),
            (&pod_mac(1, 5)[..], &port_mac[..])
        );
        let p = parse(&f.data, 0).unwrap();
        assert_eq!(
            (p.key.src, p.key.dst, p.ttl),
            (ip("fe80::1"), IpAddr::V6(ll), 255)
        );
        // nd::parse verifies the ICMPv6 checksum with the pseudo-header.
        assert_eq!(
            nd::parse(&f.data, &p),
            Ok(Some(nd::Message::Advert {
                target: "fe80::1".parse().unwrap(),
                flags: nd::FLAG_ROUTER | nd::FLAG_SOLICITED | nd::FLAG_OVERRIDE,
                tlla: Some(port_mac),
            }))
        );
        // Also from the pod's global address, for another pod's address.
        let IpAddr::V6(g) = ip("fd00:10:244:1::5") else {
            panic!()
        };
        let (_, out) = run(&mut a, ns(pod_mac(1, 5), g, "fd00:10:244:1::6"), POD, 0);
        assert_eq!(out.len(), 1);
        // Duplicate address detection (from ::) for its own address: silence.
        let (v, out) = run(
            &mut a,
            ns(pod_mac(1, 5), Ipv6Addr::UNSPECIFIED, "fd00:10:244:1::5"),
            POD,
            0,
        );
        assert_eq!((v, out.len()), (Verdict::Consumed, 0));
        // A solicitation that came through a router (hop limit not 255) is refused.
        let mut bad = ns(pod_mac(1, 5), ll, "fe80::1");
        bad[14 + 7] = 64;
        assert_eq!(
            run(&mut a, bad, POD, 0).0,
            Verdict::Dropped(DropReason::NdMalformed)
        );
        assert_eq!(a.stats().nd_answered, 2);
    }

    #[test]
    fn test_uplink_answers_for_the_node_addresses_and_learns_the_asker() {
        let (mut a, _) = nodes();
        let gw = [2, 0, 0, 0, 0, 1];
        let (v, out) = run(
            &mut a,
            arp_request(gw, "192.168.50.1", "192.168.50.10"),
            UPLINK,
            0,
        );
        assert_eq!(v, Verdict::Consumed);
        let r = arp_of(&out[0].1.data);
        assert_eq!(
            (r.op, r.sender_mac, r.target_mac),
            (arp::REPLY, uplink_mac(1), gw)
        );
        assert_eq!(
            a.neighbours().get(UPLINK, ip("192.168.50.1")).unwrap().mac,
            gw,
            "learned from a request addressed to the node"
        );
        // Not for this node: no answer, nothing learned.
        let (v, out) = run(
            &mut a,
            arp_request([2, 0, 0, 0, 0, 9], "192.168.50.9", "192.168.50.33"),
            UPLINK,
            0,
        );
        assert_eq!((v, out.len()), (Verdict::Consumed, 0));
        assert!(a.neighbours().get(UPLINK, ip("192.168.50.9")).is_none());
        // IPv6.
        let IpAddr::V6(s) = ip("fd00:50::1") else {
            panic!()
        };
        let (v, out) = run(&mut a, ns(gw, s, "fd00:50::10"), UPLINK, 0);
        assert_eq!(v, Verdict::Consumed);
        let p = parse(&out[0].1.data, 0).unwrap();
        assert_eq!(
            nd::parse(&out[0].1.data, &p),
            Ok(Some(nd::Message::Advert {
                target: "fd00:50::10".parse().unwrap(),
                flags: nd::FLAG_SOLICITED | nd::FLAG_OVERRIDE,
                tlla: Some(uplink_mac(1)),
            }))
        );
        assert!(a.neighbours().get(UPLINK, ip("fd00:50::1")).is_some());
    }

    #[test]
    fn test_unknown_next_hop_is_probed_and_traffic_flows_once_it_answers() {
        let (mut a, _) = nodes();
        let (v, out) = run(&mut a, udp_from_pod("8.8.8.8", 1, b"q"), POD, 0);
        assert_eq!(v, Verdict::Dropped(DropReason::NeighUnresolved));
        assert_eq!(out.len(), 1);
        let (port, f) = &out[0];
        assert_eq!(*port, UPLINK);
        assert_eq!(&f.data[0..6], &[0xff; 6]);
        let r = arp_of(&f.data);
        assert_eq!(
            (
                r.op,
                r.sender_mac,
                IpAddr::V4(r.sender_ip),
                IpAddr::V4(r.target_ip)
            ),
            (
                arp::REQUEST,
                uplink_mac(1),
                ip("192.168.50.10"),
                ip("192.168.50.1")
            )
        );
        // Probes are rate limited per target.
        let (_, out) = run(&mut a, udp_from_pod("8.8.8.8", 1, b"q"), POD, SEC / 10);
        assert!(out.is_empty());
        // The gateway answers; traffic flows.
        assert_eq!(
            run(
                &mut a,
                arp_reply(1, "192.168.50.1", GW_MAC),
                UPLINK,
                SEC / 5
            )
            .0,
            Verdict::Consumed
        );
        let (v, out) = run(&mut a, udp_from_pod("8.8.8.8", 1, b"q"), POD, SEC / 4);
        assert_eq!(v, Verdict::Forwarded);
        assert_eq!(&out[0].1.data[0..6], &GW_MAC);
        assert_eq!(&out[0].1.data[6..12], &uplink_mac(1));

        // IPv6: a neighbour solicitation to the solicited-node group.
        let f = build::udp(
            ip("fd00:10:244:1::5"),
            ip("2001:db8::1"),
            1,
            2,
            b"q",
            &from_pod(1, 5),
        );
        let (v, out) = run(&mut a, f, POD, 0);
        assert_eq!(v, Verdict::Dropped(DropReason::NeighUnresolved));
        let p = parse(&out[0].1.data, 0).unwrap();
        assert_eq!(p.key.dst, ip("ff02::1:ff00:1"));
        assert_eq!(
            nd::parse(&out[0].1.data, &p),
            Ok(Some(nd::Message::Solicit {
                target: "fd00:50::1".parse().unwrap(),
                slla: Some(uplink_mac(1)),
            }))
        );
        assert_eq!(a.stats().neigh_probes, 2);
    }

    fn vxlan_from(src: &str, vni: u32) -> Vec<u8> {
        let inner = build::udp(
            ip("10.244.9.9"),
            ip("10.244.1.5"),
            1,
            2,
            b"x",
            &IpOpts::default(),
        );
        overlay::encapsulate(
            &inner,
            &overlay::Outer {
                src_mac: [2, 9, 9, 9, 9, 9],
                dst_mac: uplink_mac(1),
                src: ip(src),
                dst: ip("192.168.50.10"),
                vni,
                port: 4789,
                hash: 1,
            },
        )
    }

    #[test]
    fn test_vxlan_from_an_unknown_node_or_with_another_vni_is_dropped() {
        let (mut a, _) = nodes();
        assert_eq!(
            run(&mut a, vxlan_from("192.168.50.99", 4096), UPLINK, 0).0,
            Verdict::Dropped(DropReason::VxlanUnknownPeer)
        );
        assert_eq!(
            run(&mut a, vxlan_from("192.168.50.20", 77), UPLINK, 0).0,
            Verdict::Dropped(DropReason::VxlanBadVni)
        );
        let (v, out) = run(&mut a, vxlan_from("192.168.50.20", 4096), UPLINK, 0);
        assert_eq!((v, out[0].0), (Verdict::Forwarded, POD));
    }

    #[test]
    fn test_outer_fragments_are_reassembled_before_decap() {
        let (mut a, _) = nodes();
        let inner = build::udp(
            ip("10.244.2.9"),
            ip("10.244.1.5"),
            1,
            2,
            &build::pattern(1400, 3),
            &IpOpts::default(),
        );
        let outer = overlay::encapsulate(
            &inner,
            &overlay::Outer {
                src_mac: uplink_mac(2),
                dst_mac: uplink_mac(1),
                src: ip("192.168.50.20"),
                dst: ip("192.168.50.10"),
                vni: 4096,
                port: 4789,
                hash: 1,
            },
        );
        let parsed = parse(&outer, 0).unwrap();
        let mut fr = Vec::new();
        ipf::refragment(&Packet::new(outer, 0, 0), &parsed, 1000, &mut fr).unwrap();
        assert_eq!(fr.len(), 2);
        let mut last = Verdict::Held;
        let mut out = Vec::new();
        for f in fr {
            out.clear();
            last = a.process(
                Packet::new(f.data, UPLINK, 0),
                &mut out,
                &mut Trace::disabled(),
            );
        }
        assert_eq!(last, Verdict::Forwarded);
        let d = parse(&out[0].1.data, 0).unwrap();
        assert_eq!(
            &out[0].1.data[d.l4_off + 8..d.ip_end],
            &build::pattern(1400, 3)[..]
        );
    }

    #[test]
    fn test_df_too_big_across_the_overlay_gets_icmp_with_the_inner_mtu() {
        let (mut a, _) = nodes();
        learn(&mut a, 1, "192.168.50.20", uplink_mac(2));
        let o = IpOpts {
            dont_fragment: true,
            ..from_pod(1, 5)
        };
        let f = build::udp(ip("10.244.1.5"), ip("10.244.2.6"), 1, 2, &[0; 1472], &o);
        let (v, out) = run(&mut a, f, POD, 0);
        assert_eq!(v, Verdict::Dropped(DropReason::TooBig));
        assert_eq!(out.len(), 1);
        let (port, e) = &out[0];
        assert_eq!(*port, POD);
        let pe = parse(&e.data, 0).unwrap();
        assert_eq!(pe.key.dst_port, 3 << 8 | 4, "fragmentation needed");
        let mtu = u16::from_be_bytes([e.data[pe.l4_off + 6], e.data[pe.l4_off + 7]]);
        assert_eq!(mtu, 1500 - 50);
        // 1450 bytes fit.
        let f = build::udp(ip("10.244.1.5"), ip("10.244.2.6"), 1, 2, &[0; 1422], &o);
        let (v, out) = run(&mut a, f, POD, 0);
        assert_eq!(v, Verdict::Forwarded);
        assert_eq!(out[0].1.data.len(), 14 + 1500);
        // IPv6: packet too big with the same MTU (the underlay is IPv4).
        let f = build::udp(
            ip("fd00:10:244:1::5"),
            ip("fd00:10:244:2::6"),
            1,
            2,
            &[0; 1452],
            &from_pod(1, 5),
        );
        let (v, out) = run(&mut a, f, POD, 0);
        assert_eq!(v, Verdict::Dropped(DropReason::TooBig));
        let pe = parse(&out[0].1.data, 0).unwrap();
        assert_eq!(pe.key.dst_port, 2 << 8);
        let d = &out[0].1.data[pe.l4_off + 4..pe.l4_off + 8];
        assert_eq!(u32::from_be_bytes(d.try_into().unwrap()), 1450);
    }

    #[test]
    fn test_gso_packet_to_a_remote_pod_is_segmented_to_fit_before_encapsulation() {
        let (mut a, _) = nodes();
        learn(&mut a, 1, "192.168.50.20", uplink_mac(2));
        let f = build::tcp(
            ip("10.244.1.5"),
            ip("10.244.2.6"),
            33000,
            80,
            1,
            1,
            tcp_flags::ACK,
            &build::pattern(20000, 1),
            &from_pod(1, 5),
        );
        let mut pkt = Packet::new(f, POD, 0);
        pkt.meta.vnet.gso_type = VnetHdr::GSO_TCPV4;
        pkt.meta.vnet.gso_size = 1460;
        let mut out = Vec::new();
        assert_eq!(
            a.process(pkt, &mut out, &mut Trace::disabled()),
            Verdict::Forwarded
        );
        let mut total = 0;
        let mut sports = std::collections::HashSet::new();
        for (port, f) in &out {
            assert_eq!(*port, UPLINK);
            let o = parse(&f.data, 0).unwrap();
            assert!(o.ip_len() <= 1500 && o.frag.is_none(), "never IP fragments");
            sports.insert(o.key.src_port);
            let i = parse(&f.data[o.l4_off + 16..], 0).unwrap();
            assert!(i.ip_len() <= 1450 && i.frag.is_none());
            total += i.ip_end - i.l4_off - 20;
        }
        assert_eq!(total, 20000);
        assert_eq!(sports.len(), 1, "one flow, one outer source port");
        assert!(out.len() >= 14);
    }

    #[test]
    fn test_reassembled_datagram_is_refragmented_to_the_inner_mtu_before_encapsulation() {
        // 1500-byte fragments from outside to a pod on node 2: their MRU exceeds the
        // overlay's 1450, so they are cut again (IPv4 without DF), then encapsulated.
        let (mut a, _) = nodes();
        learn(&mut a, 1, "192.168.50.20", uplink_mac(2));
        let whole = build::udp(
            ip("192.168.60.7"),
            ip("10.244.2.6"),
            1,
            2,
            &build::pattern(4000, 2),
            &IpOpts::default(),
        );
        let parsed = parse(&whole, 0).unwrap();
        let mut fr = Vec::new();
        ipf::refragment(&Packet::new(whole, 0, 0), &parsed, 1500, &mut fr).unwrap();
        let mut out = Vec::new();
        let mut last = Verdict::Held;
        for f in fr {
            out.clear();
            last = a.process(
                Packet::new(f.data, UPLINK, 0),
                &mut out,
                &mut Trace::disabled(),
            );
        }
        assert_eq!(last, Verdict::Forwarded);
        assert!(out.len() >= 3);
        let mut r = ipf::Reassembler::new(ipf::Config::default());
        let mut d = DropCounters::default();
        let mut done = None;
        for (port, f) in out {
            assert_eq!(port, UPLINK);
            let o = parse(&f.data, 0).unwrap();
            assert!(
                o.ip_len() <= 1500 && o.frag.is_none(),
                "outer never fragmented"
            );
            let inner = Packet::new(f.data[o.l4_off + 16..].to_vec(), 0, 0);
            let i = parse(&inner.data, 0).unwrap();
            assert!(i.ip_len() <= 1450 && i.frag.is_some());
            if let ipf::Outcome::Complete(w, pw) = r.process(inner, &i, &mut d) {
                done = Some(w.data[pw.l4_off + 8..pw.ip_end].to_vec());
            }
        }
        assert_eq!(done.unwrap(), build::pattern(4000, 2));
    }

    #[test]
    fn test_cross_subnet_encapsulates_only_peers_outside_the_uplink_subnet() {
        let spec = node_spec(
            1,
            ModeSpec::CrossSubnet,
            vec![peer(2, "192.168.50.20"), peer(3, "10.9.0.30")],
        );
        let t = spec.compile().unwrap();
        assert!(!t.overlay.as_ref().unwrap().peers[0].encap);
        assert!(t.overlay.as_ref().unwrap().peers[1].encap);
        let mut a = Pipeline::new(Arc::new(t));
        learn(&mut a, 1, "192.168.50.20", uplink_mac(2));
        learn(&mut a, 1, "192.168.50.1", GW_MAC);
        // Same subnet: routed directly to the peer's MAC.
        let (v, out) = run(&mut a, udp_from_pod("10.244.2.6", 1, b"x"), POD, 0);
        assert_eq!(v, Verdict::Forwarded);
        let p = parse(&out[0].1.data, 0).unwrap();
        assert_eq!(p.key.dst, ip("10.244.2.6"));
        assert_eq!(&out[0].1.data[0..6], &uplink_mac(2));
        // Another subnet: encapsulated, the outer frame to the gateway.
        let (v, out) = run(&mut a, udp_from_pod("10.244.3.6", 1, b"x"), POD, 0);
        assert_eq!(v, Verdict::Forwarded);
        let p = parse(&out[0].1.data, 0).unwrap();
        assert_eq!((p.key.dst, p.key.dst_port), (ip("10.9.0.30"), 4789));
        assert_eq!(&out[0].1.data[0..6], &GW_MAC);
    }

    #[test]
    fn test_pod_mtu_is_derived_from_the_uplink_unless_given() {
        let t = node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")])
            .compile()
            .unwrap();
        assert_eq!(t.ports[usize::from(POD)].mtu, 1450);
        assert_eq!(t.ports[usize::from(UPLINK)].mtu, 1500);
        let mut s = node_spec(1, ModeSpec::Always, vec![peer(2, "fd00:50::20")]);
        assert_eq!(s.compile().unwrap().ports[usize::from(POD)].mtu, 1430);
        s.ports[1].mtu = Some(1400);
        assert_eq!(s.compile().unwrap().ports[usize::from(POD)].mtu, 1400);
    }

    #[test]
    fn test_overlay_tables_errors_name_the_entry() {
        let mut s = node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")]);
        s.ports[1].peer_mac = None;
        let e = s.compile().unwrap_err();
        assert!(e.contains("ports[1]") && e.contains("peer_mac"), "{e}");
        let mut s = node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")]);
        s.overlay.as_mut().unwrap().uplink = "pod-a".into();
        assert!(s.compile().unwrap_err().contains("not of kind uplink"));
        let mut s = node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")]);
        s.overlay = None;
        assert!(s.compile().unwrap_err().contains("nodes"));
        let mut s = node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")]);
        s.nodes[0].pod_cidrs.push("10.244.1.5/32".parse().unwrap());
        let e = s.compile().unwrap_err();
        assert!(
            e.contains("nodes[0] (\"node2\")") && e.contains("duplicates"),
            "{e}"
        );
        let mut s = node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")]);
        s.routes.clear();
        s.nodes[0].address = ip("10.1.1.1");
        assert!(s.compile().unwrap_err().contains("no route to 10.1.1.1"));
    }
}
