//! The forward stage: a whole packet after decapsulation, through the stages that decide
//! where it goes. It only composes them: admission (source check, neighbour discovery,
//! martians, TTL), tracking (Services and conntrack with NAT, `track`), policy, routing,
//! the MTU check, then delivery (`egress`).

use std::net::IpAddr;

use super::route::Routing;
use super::track::Opening;
use super::{Pipeline, Trace, TraceEvent, Verdict};
use crate::conntrack::Begin;
use crate::drop::DropReason;
use crate::icmp::ErrorKind;
use crate::neigh::nd;
use crate::packet::{Packet, PortId};
use crate::tables::{GATEWAY_V4, PortKind, Tables};
use crate::wire::Parsed;

impl Pipeline {
    /// The stages after decapsulation: admission, Services and conntrack with NAT,
    /// policy, routing, MTU, then [`Pipeline::deliver`]. `tunnel_peer` is the node the
    /// packet came from through the overlay, if it did.
    #[inline]
    pub(super) fn forward(
        &mut self,
        tables: &Tables,
        mut pkt: Packet,
        mut parsed: Parsed,
        tunnel_peer: Option<IpAddr>,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        if let Err(v) = self.admit(tables, &pkt, &parsed, tunnel_peer, out, trace) {
            return v;
        }
        let before = parsed.key;
        let now = pkt.meta.time_ns;
        // Conntrack first decides whether the packet starts a connection; only then is
        // its NAT asked of the Services (or the static rules), and conntrack records it.
        // Both results are read where they were returned, by reference (see
        // `Conntrack::begin`).
        let mut opening = Opening::default();
        let mut begun = self.ct.begin(&mut pkt, &mut parsed, now);
        let mut started;
        let ct = match &mut begun {
            Ok(Begin::Tracked(r)) => r,
            Ok(Begin::Starts(s)) => {
                let s = *s;
                started = self.open(
                    tables,
                    s,
                    &mut pkt,
                    &mut parsed,
                    tunnel_peer,
                    &mut opening,
                    trace,
                );
                match &mut started {
                    Ok(r) => r,
                    Err(r) => {
                        let r = *r;
                        return self.refused(
                            tables,
                            r,
                            &opening,
                            &before,
                            &pkt,
                            &parsed,
                            tunnel_peer,
                            out,
                            trace,
                        );
                    }
                }
            }
            Err(r) => {
                let r = *r;
                return self.refused(
                    tables,
                    r,
                    &opening,
                    &before,
                    &pkt,
                    &parsed,
                    tunnel_peer,
                    out,
                    trace,
                );
            }
        };
        let conn = match self.tracked(
            tables,
            ct,
            &opening,
            &before,
            &parsed,
            tunnel_peer,
            now,
            trace,
        ) {
            Ok(c) => c,
            Err(r) => return self.drop(r, trace),
        };
        if let Err(r) = self.policy(tables, &pkt, &parsed, &before, tunnel_peer, ct, trace) {
            return self.drop(r, trace);
        }
        let pending = &mut ct.pending;
        let (port, hop) = match self.route(
            tables,
            &pkt,
            &parsed,
            &before,
            conn,
            tunnel_peer,
            pending,
            out,
            trace,
        ) {
            Ok(r) => r,
            Err(v) => return v,
        };
        let mtu = match self.fits(
            tables,
            &pkt,
            &parsed,
            port,
            hop,
            tunnel_peer,
            pending,
            out,
            trace,
        ) {
            Ok(mtu) => mtu,
            Err(v) => return v,
        };
        let routing = Routing {
            port,
            hop,
            mtu,
            tunnel_peer,
        };
        self.deliver(tables, pkt, &parsed, routing, pending, now, out, trace)
    }

    /// Admission: what a packet must pass before it is tracked. A pod's packet must come
    /// from the pod's own MAC and address; neighbour discovery is answered here (never
    /// forwarded); martians are dropped; a packet whose TTL runs out is answered with an
    /// ICMP time exceeded. `Err` carries the verdict of a packet that goes no further.
    #[inline]
    fn admit(
        &mut self,
        tables: &Tables,
        pkt: &Packet,
        parsed: &Parsed,
        tunnel_peer: Option<IpAddr>,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Result<(), Verdict> {
        let in_port = &tables.ports[usize::from(pkt.meta.in_port)];
        if tunnel_peer.is_none() && in_port.kind == PortKind::Pod {
            if !super::ingress::source_is_pods(in_port, pkt, parsed) {
                return Err(self.drop(DropReason::SourceSpoofed, trace));
            }
            trace.note(|| TraceEvent::SourceOk);
        }
        if tunnel_peer.is_none() && in_port.kind != PortKind::Plain {
            match nd::parse(&pkt.data, parsed) {
                Err(r) => return Err(self.drop(r, trace)),
                Ok(Some(m)) => return Err(self.nd(pkt, parsed, m, out, trace)),
                Ok(None) => {}
            }
        }
        if in_port.kind != PortKind::Plain
            && !tables
                .fib
                .forwardable(parsed.key.src.ip(), parsed.key.dst.ip(), GATEWAY_V4)
        {
            return Err(self.drop(DropReason::NotForwardable, trace));
        }
        if parsed.ttl <= 1 {
            // Quote the packet as it arrived, before any NAT.
            let kind = ErrorKind::TimeExceeded;
            self.icmp_error(pkt, parsed, kind, false, tunnel_peer, out, trace);
            return Err(self.drop(DropReason::TtlExceeded, trace));
        }
        Ok(())
    }
}
