//! Next-hop resolution: the link-layer addresses a routed packet leaves with (the
//! route's MAC, the neighbour table's, or the overlay's outer headers), probing unknown
//! neighbours; a packet whose neighbour has no MAC yet waits in the queue, and is sent on
//! when the neighbour answers.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use super::route::Routed;
use super::{Asked, L2Hop, Pipeline, Trace, TraceEvent, Verdict};
use crate::drop::DropReason;
use crate::neigh::{self, arp, nd};
use crate::overlay;
use crate::packet::{Packet, PortId};
use crate::tables::{NextHop, Tables};
use crate::wire::Parsed;

/// Where one routed packet leaves, resolved: link-layer addresses, offloads, and the
/// outer headers when it goes through the overlay.
pub(super) struct Egress {
    pub(super) port: PortId,
    pub(super) dst_mac: [u8; 6],
    pub(super) src_mac: [u8; 6],
    pub(super) gso: bool,
    /// Through the overlay, and the uplink takes UDP GSO (its tables say `gso: true`):
    /// the encapsulated segments of a GSO packet may leave as UDP GSO super-frames.
    pub(super) uso: bool,
    pub(super) tunnel: Option<overlay::Outer>,
}

/// Why a routed packet has no link-layer addresses.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NoEgress {
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
    pub(super) fn reason(&self) -> DropReason {
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

impl Pipeline {
    /// Where the frame goes at the link layer: the next hop's MAC (from the route, the
    /// neighbour table, or, for the overlay, the peer's VTEP with the outer headers to
    /// add). An unknown neighbour is probed (rate limited) and named in the error.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn resolve(
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
        let l2 = |hop: L2Hop, m: [u8; 6]| {
            move || TraceEvent::L2 {
                hop,
                dst_mac: m,
                src_mac: p.mac,
                port: p.name.clone(),
            }
        };
        match hop {
            NextHop::Mac(m) => {
                trace.note(l2(L2Hop::RouteMac, m));
                Ok(plain(m))
            }
            NextHop::Via(a) => {
                let m = self.neighbour(port, a, now, out, trace)?;
                trace.note(l2(L2Hop::Gateway { addr: a }, m));
                Ok(plain(m))
            }
            NextHop::Direct => {
                let m = self.neighbour(port, parsed.key.dst.ip(), now, out, trace)?;
                let addr = parsed.key.dst.ip();
                trace.note(l2(L2Hop::OnLink { addr }, m));
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
                trace.note(|| TraceEvent::L2Tunnel {
                    inner_src: ov.vtep_mac,
                    inner_dst: peer.vtep_mac,
                    outer_dst: outer_mac,
                    peer: peer.address,
                    outer_src: tables.ports[usize::from(up)].mac,
                    port: tables.ports[usize::from(up)].name.clone(),
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
    pub(super) fn neighbour(
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
                trace.note(|| TraceEvent::NeighProbe {
                    ip,
                    port: p.name.clone(),
                    mac: m,
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
    pub(super) fn park(
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
        trace.note(|| TraceEvent::NeighQueued {
            ip,
            port: self.tables.ports[usize::from(port)].name.clone(),
            asked: if probed {
                Asked::Probed {
                    dry_run: self.dry_run,
                }
            } else {
                Asked::Already
            },
            waiting: self.parked.waiting_for(port, ip),
            pushed_out,
        });
        Verdict::Queued
    }

    /// Records what ARP or ND says of a neighbour (see [`Neighbours::learn`]; an entry
    /// that packets wait for is asked for, so created if missing and there is room) and,
    /// once the entry has a MAC, sends the packets that waited for it, oldest first.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn learned(
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
            trace.note(|| TraceEvent::NeighReleased {
                ip,
                mac,
                key: routed.parsed.key,
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
}
