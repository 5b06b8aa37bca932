//! One node's pipeline: parse -> defrag -> TTL -> conntrack (with NAT) -> route -> L2
//! rewrite -> egress MTU.
//!
//! Later stages (decap, services, policy, encap) slot in around conntrack. The pipeline
//! owns its per-worker state (fragment buffers, connections, ICMP budget, counters) and
//! reads the node tables through an `Arc` that the control plane swaps.

use std::net::IpAddr;
use std::sync::Arc;

use crate::conntrack::{self, Conntrack, CtState, Nat, Pending};
use crate::drop::{DropCounters, DropReason};
use crate::flow::proto;
use crate::gso;
use crate::icmp::{self, ErrorKind, RateLimiter};
use crate::ipf::{self, Reassembler};
use crate::packet::{Packet, PortId, VnetHdr};
use crate::tables::{Port, Snat, Tables};
use crate::wire::checksum;
use crate::wire::{L3, Parsed, parse};

/// What became of one input packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Sent on (possibly as several packets, possibly with an ICMP error besides).
    Forwarded,
    /// Held for reassembly; it leaves as part of its datagram, or expires.
    Held,
    /// Dropped for this reason.
    Dropped(DropReason),
}

impl Verdict {
    /// `forwarded`, `held` or `dropped`.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Forwarded => "forwarded",
            Verdict::Held => "held",
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
}

/// Datagrams (and connections) expired per call of [`Pipeline::tick`] at most: bounded
/// work per batch.
pub const EXPIRE_BUDGET: usize = 64;

/// One node's packet pipeline.
pub struct Pipeline {
    tables: Arc<Tables>,
    ipf: Reassembler,
    ct: Conntrack,
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
    /// their egress port (an ICMP error goes out of the ingress port).
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
            return self.drop(DropReason::ArpNotHandled, trace);
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

        if let Err(r) = check_offload(&pkt, &parsed) {
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

        let (mut pkt, parsed) = if parsed.frag.is_some() {
            match self.ipf.process(pkt, &parsed, &mut self.drops) {
                ipf::Outcome::Held => {
                    trace.note("ipf", || {
                        format!(
                            "held for reassembly ({} datagrams, {} bytes in flight)",
                            self.ipf.held_datagrams(),
                            self.ipf.held_bytes()
                        )
                    });
                    return Verdict::Held;
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
                    (p, pp)
                }
                ipf::Outcome::Dropped(r) => {
                    trace.note("ipf", || format!("refused: {r}"));
                    return self.drop(r, trace);
                }
            }
        } else {
            (pkt, parsed)
        };

        if parsed.ttl <= 1 {
            // Quote the packet as it arrived, before any NAT.
            self.icmp_error(&pkt, &parsed, ErrorKind::TimeExceeded, false, out, trace);
            return self.drop(DropReason::TtlExceeded, trace);
        }

        let mut parsed = parsed;
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

        let Some(route) = tables.fib.lookup(parsed.key.dst).copied() else {
            return self.drop(DropReason::NoRoute, trace);
        };
        let out_port = &tables.ports[usize::from(route.port)];
        trace.note("route", || {
            format!("{} -> port {}", parsed.key.dst, out_port.name)
        });

        let mtu = usize::from(out_port.mtu);
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
            let kind = ErrorKind::TooBig {
                mtu: u32::from(out_port.mtu),
            };
            self.icmp_error(&pkt, &parsed, kind, true, out, trace);
            return self.drop(DropReason::TooBig, trace);
        }
        if let Err(r) = self.commit(&mut pending, now, trace) {
            return self.drop(r, trace);
        }

        decrement_ttl(&mut pkt.data, &parsed);
        pkt.data[0..6].copy_from_slice(&route.next_hop_mac);
        pkt.data[6..12].copy_from_slice(&out_port.mac);

        if gso {
            let headers = gso_headers(&pkt.data, &parsed);
            let fits = headers + usize::from(pkt.meta.vnet.gso_size) <= mtu;
            if out_port.gso && (fits || !uso) {
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
                self.send(route.port, pkt, out);
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
                    self.send(route.port, seg, out);
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
                    self.send(route.port, f, out);
                }
            }
            self.scratch = segs;
            return Verdict::Forwarded;
        }

        let limit = if mru != 0 { mtu.min(mru) } else { mtu };
        let fragment = parsed.ip_len() > limit;
        if pkt.meta.vnet.needs_csum() && (!out_port.gso || fragment) {
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
            self.send(route.port, pkt, out);
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
            self.send(route.port, f, out);
        }
        self.scratch = frags;
        Verdict::Forwarded
    }

    fn icmp_error(
        &mut self,
        pkt: &Packet,
        parsed: &Parsed,
        kind: ErrorKind,
        translate: bool,
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
            mtu,
            zone: 0,
            addresses: addrs.iter().map(|a| ip(a)).collect(),
            gro,
            gso,
        }
    }

    fn route(prefix: &str, port: &str, mac: [u8; 6]) -> RouteSpec {
        RouteSpec {
            prefix: prefix.parse().unwrap(),
            port: port.into(),
            next_hop_mac: MacAddr(mac),
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
