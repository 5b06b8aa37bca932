//! The route stage: the egress port and next hop of a tracked packet, from the routing
//! table, except that a connection that must go through the tunnel does, and a reply
//! returns through the node its connection came through.

use std::net::IpAddr;

use super::track::Conn;
use super::{Pipeline, Trace, TraceEvent, Verdict};
use crate::conntrack::Pending;
use crate::drop::DropReason;
use crate::flow::FlowKey;
use crate::icmp::ErrorKind;
use crate::packet::{Packet, PortId};
use crate::tables::{NextHop, Route, Tables};
use crate::wire::{L3, Parsed};

/// What routing decided for a packet, for the stages after it (`Pipeline::deliver`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Routing {
    /// The egress port (the overlay's uplink when tunnelled) and the next hop on it.
    pub(super) port: PortId,
    pub(super) hop: NextHop,
    /// The MTU that applies to the packet (inside the tunnel when tunnelled); it was
    /// found not too big for it.
    pub(super) mtu: usize,
    /// The node the packet came from through the overlay, if it did: an ICMP error
    /// about it goes back there.
    pub(super) tunnel_peer: Option<IpAddr>,
}

/// A routed packet waiting in the neighbour queue: after NAT, TTL and MACs not
/// rewritten yet.
pub(super) struct Routed {
    pub(super) pkt: Packet,
    pub(super) parsed: Parsed,
    pub(super) routing: Routing,
}

impl Pipeline {
    /// The egress port and next hop of a packet as conntrack left it (`before` is its key
    /// before NAT). An address of this node's pod CIDRs that no pod has is answered with
    /// an ICMP host (address) unreachable; `Err` carries the verdict of a packet that
    /// goes no further.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn route(
        &mut self,
        tables: &Tables,
        pkt: &Packet,
        parsed: &Parsed,
        before: &FlowKey,
        conn: Conn,
        tunnel_peer: Option<IpAddr>,
        pending: &mut Option<Pending>,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Result<(PortId, NextHop), Verdict> {
        let Some(target) = tables.fib.lookup(parsed.key.dst.ip()).copied() else {
            return Err(self.drop(DropReason::NoRoute, trace));
        };
        // None: an address of this node's pod CIDRs that no pod has.
        let mut route = target.route();
        if conn.force_tunnel
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
        if let (Some(peer), Some(ov)) = (conn.reply_peer, &tables.overlay)
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
            trace.note(|| TraceEvent::RouteNoPod {
                dst: parsed.key.dst.ip(),
            });
            // As for "too big": a connection translated on its way here is kept, so that
            // the error, quoting the translated packet, is translated back for the
            // sender. Nothing is kept for one that was not translated (a scan of the pod
            // CIDRs must not fill the connection table).
            let translated = parsed.key != *before;
            if translated && let Err(r) = self.commit(pending, pkt.meta.time_ns, trace) {
                return Err(self.drop(r, trace));
            }
            // IPv4 host unreachable, ICMPv6 address unreachable.
            let code = if parsed.l3 == L3::Ipv4 { 1 } else { 3 };
            let kind = ErrorKind::Unreachable { code };
            self.icmp_error(pkt, parsed, kind, translated, tunnel_peer, out, trace);
            return Err(self.drop(DropReason::NoSuchPod, trace));
        };
        trace.note(|| match next_hop {
            NextHop::Tunnel(i) => TraceEvent::RouteTunnel {
                dst: parsed.key.dst.ip(),
                node: tables
                    .overlay
                    .as_ref()
                    .map_or("?", |o| &o.peers[usize::from(i)].name)
                    .to_string(),
            },
            _ => TraceEvent::RoutePort {
                dst: parsed.key.dst.ip(),
                port: tables.ports[usize::from(out_id)].name.clone(),
            },
        });
        Ok((out_id, next_hop))
    }
}
