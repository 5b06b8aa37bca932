//! What the Service stage says and sends: the trace notes of an endpoint choice or a
//! refusal, and the immediate refusal of a new connection to a Service without
//! endpoints. The choice itself is [`crate::lb::balance`], called from `track`.

use std::net::IpAddr;

use super::{Pipeline, ServicePath, Trace, TraceEvent};
use crate::conntrack::Nat;
use crate::drop::DropReason;
use crate::flow::{FlowKey, proto};
use crate::icmp::ErrorKind;
use crate::lb::{self, Balanced, Frontend};
use crate::packet::{Packet, PortId};
use crate::tables::{NextHop, Tables};
use crate::wire::{L3, Parsed, parse, rewrite};

impl Pipeline {
    /// Refuses a new connection to a Service without endpoints at once: a TCP reset, or
    /// an ICMP port unreachable for UDP, back the way the client is reached. That is
    /// out of the port the packet came in on, except through the overlay when the
    /// packet came through it or when its source is a pod the overlay reaches: a pod of
    /// another node that asked this node's node port came through the underlay's
    /// routers, which know no pod address, so a refusal sent back to them is lost.
    pub(super) fn reject(
        &mut self,
        tables: &Tables,
        pkt: &Packet,
        parsed: &Parsed,
        tunnel_peer: Option<IpAddr>,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) {
        let in_id = pkt.meta.in_port;
        let back = tunnel_peer.or_else(|| {
            let ov = tables.overlay.as_ref()?;
            let route = tables.fib.lookup(parsed.key.src.ip())?.route()?;
            match route.next_hop {
                NextHop::Tunnel(i) => Some(ov.peers[usize::from(i)].address),
                _ => None,
            }
        });
        match parsed.proto {
            proto::TCP => {
                let mac = self.tables.ports[usize::from(in_id)].mac;
                let Some(frame) = lb::reject::tcp_reset(&pkt.data, parsed, mac) else {
                    return;
                };
                let mut rst = Packet::new(frame, in_id, pkt.meta.time_ns);
                let peer = back.and_then(|a| {
                    let ov = tables.overlay.as_ref()?;
                    Some((a, ov.peer_index(a)?, ov.uplink))
                });
                let Some((peer, i, uplink)) = peer else {
                    self.stats.service_rejected += 1;
                    trace.note(|| TraceEvent::ServiceReset);
                    self.send(in_id, rst, out);
                    return;
                };
                let Ok(pr) = parse(&rst.data, tables.ports[usize::from(in_id)].zone) else {
                    return;
                };
                let now = pkt.meta.time_ns;
                match self.resolve(tables, uplink, NextHop::Tunnel(i), &pr, now, out, trace) {
                    Ok(e) => {
                        self.stats.service_rejected += 1;
                        trace.note(|| TraceEvent::ServiceReset);
                        rewrite::set_macs(&mut rst.data, e.dst_mac, e.src_mac);
                        self.emit(&e, rst, out);
                    }
                    // Not queued, as an ICMP error is not: the client retries.
                    Err(e) => trace.note(|| TraceEvent::ServiceResetNoPath {
                        reason: e.reason(),
                        peer,
                    }),
                }
            }
            proto::UDP => {
                let code = if parsed.l3 == L3::Ipv4 { 3 } else { 4 };
                let sent = self.stats.icmp_sent;
                let kind = ErrorKind::Unreachable { code };
                self.icmp_error(pkt, parsed, kind, false, back, out, trace);
                if self.stats.icmp_sent > sent {
                    self.stats.service_rejected += 1;
                }
            }
            _ => {}
        }
    }

    /// Counts a new connection the source ranges of Service port `name` refused.
    pub(super) fn count_source_denied(&mut self, name: &str) {
        match self.source_denied.get_mut(name) {
            Some(n) => *n += 1,
            None => {
                self.source_denied.insert(name.to_string(), 1);
            }
        }
    }

    /// New connections refused by a Service port's `loadBalancerSourceRanges`, by the
    /// Service port's name (`namespace/name:port`), those of Service ports in force that
    /// refused any.
    pub fn source_denied_counts(&self) -> impl Iterator<Item = (&str, u64)> {
        self.source_denied.iter().map(|(n, c)| (n.as_str(), *c))
    }

    /// Notes why a new connection to frontend `f` was refused, when it was the Service's
    /// doing.
    pub(super) fn note_refused(
        tables: &Tables,
        f: Frontend,
        r: DropReason,
        before: &FlowKey,
        trace: &mut Trace,
    ) {
        let no_endpoint = matches!(
            r,
            DropReason::ServiceNoEndpoints | DropReason::ServiceNoLocalEndpoints
        );
        if no_endpoint {
            trace.note(|| TraceEvent::ServiceNoEndpoint {
                service: tables.services.services[f.service as usize].name.clone(),
                scope: f.scope,
                key: *before,
            });
        }
        if r == DropReason::ServiceSourceDenied {
            trace.note(|| TraceEvent::ServiceSourceDenied {
                service: tables.services.services[f.service as usize].name.clone(),
                key: *before,
            });
        }
        if r == DropReason::ServiceNoNodeAddress {
            trace.note(|| TraceEvent::ServiceNoNodeAddress {
                service: tables.services.services[f.service as usize].name.clone(),
                scope: f.scope,
                key: *before,
            });
        }
    }

    /// Notes the endpoint chosen for a new connection to frontend `f`, and how.
    pub(super) fn note_balanced(
        tables: &Tables,
        f: Frontend,
        b: &Balanced,
        before: &FlowKey,
        trace: &mut Trace,
    ) {
        trace.note(|| {
            let svc = &tables.services.services[f.service as usize];
            let path = match (b.nat.snat, b.mark & lb::MARK_TUNNEL != 0) {
                (Some((a, _)), _) => ServicePath::Snat {
                    addr: a.ip(),
                    hairpin: b.hairpin,
                },
                (None, true) => ServicePath::Tunnel,
                (None, false) => ServicePath::Direct,
            };
            let be = &svc.backends[b.backend];
            TraceEvent::ServiceBalanced {
                service: svc.name.clone(),
                scope: f.scope,
                frontend: before.dst.ip(),
                frontend_port: before.dst_port,
                endpoint: be.addr,
                endpoint_port: be.port,
                node: be.node.clone(),
                path,
            }
        });
    }

    /// Notes the translation a static NAT rule gave a new connection.
    pub(super) fn note_static_nat(n: &Nat, trace: &mut Trace) {
        trace.note(|| TraceEvent::StaticNat {
            dnat: n.dnat.map(|(a, _)| a.ip()),
            dnat_port: n.dnat.and_then(|(_, p)| p),
            snat: n.snat.map(|(a, _)| a.ip()),
            snat_ports: n.snat.and_then(|(_, r)| r),
        });
    }
}
