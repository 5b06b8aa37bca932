//! ICMP errors the pipeline sends (time exceeded, unreachable, too big), with the checks
//! that forbid some (RFC 1122), the rate limit, and the translation back through
//! conntrack ([`crate::icmp`] builds them).

use std::net::IpAddr;
use std::sync::Arc;

use super::{Pipeline, Stats, Trace, TraceEvent};
use crate::conntrack::CtState;
use crate::icmp::{self, ErrorKind};
use crate::packet::{Packet, PortId};
use crate::tables::NextHop;
use crate::wire::rewrite;
use crate::wire::{L3, Parsed, parse};

impl Pipeline {
    /// Sends an ICMP error of `kind` about `pkt` back to its sender, out of the port it
    /// came in on (or back through the node it came from through the overlay), within
    /// the rate limit. With `translate` the error quotes the packet as conntrack
    /// translated it, and conntrack translates it back for the sender (RELATED).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn icmp_error(
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
            trace.note(|| TraceEvent::IcmpNoAddress {
                error: kind,
                port: in_port.name.clone(),
            });
            return;
        };
        // Cheap checks and the rate limit first: a flood of packets that each deserve an
        // error must not cost an error's construction each.
        if !icmp::eligible(&pkt.data, parsed, kind, src) {
            self.stats.icmp_suppressed += 1;
            trace.note(|| TraceEvent::IcmpNotAllowed { error: kind });
            return;
        }
        let now = pkt.meta.time_ns;
        if !self.icmp.allow(now) {
            self.stats.icmp_rate_limited += 1;
            trace.note(|| TraceEvent::IcmpRateLimited { error: kind });
            return;
        }
        let Some(frame) = icmp::build_error(&pkt.data, parsed, kind, src, in_port.mac) else {
            self.stats.icmp_suppressed += 1;
            trace.note(|| TraceEvent::IcmpNotAllowed { error: kind });
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
                trace.note(|| TraceEvent::IcmpUnrelated { error: kind });
                return;
            }
        }
        let sent = |stats: &mut Stats, trace: &mut Trace| {
            stats.icmp_sent += 1;
            trace.note(|| TraceEvent::IcmpSent {
                error: kind,
                src,
                dst: parsed.key.src.ip(),
                port: in_port.name.clone(),
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
                    rewrite::set_macs(&mut err.data, e.dst_mac, e.src_mac);
                    self.emit(&e, err, out);
                }
                // Errors are not queued: the sender retries, and the error comes again.
                // Not a drop: the packet the error is about is counted as dropped already.
                Err(e) => {
                    self.stats.icmp_suppressed += 1;
                    trace.note(|| TraceEvent::IcmpNoPath {
                        error: kind,
                        reason: e.reason(),
                        peer,
                    });
                }
            }
            return;
        }
        sent(&mut self.stats, trace);
        self.send(in_id, err, out);
    }
}
