//! The tracking stage: Services and conntrack. Conntrack says whether a packet belongs
//! to a connection or starts one; for one that starts a connection the Service frontend
//! it reaches gives it an endpoint ([`lb::balance`]), or else the static NAT rules
//! translate it; conntrack records the NAT and translates the packet. Packets of known
//! connections follow their entry and pay neither the Service lookup nor the rules. A
//! Service endpoint's segment of a connection conntrack lost is translated back through
//! the frontend that chose the endpoint (`recover`).

use std::net::IpAddr;

use super::{Pipeline, Trace, TraceEvent, Verdict};
use crate::conntrack::{CtResult, CtState, Nat, Pending, Start};
use crate::drop::DropReason;
use crate::flow::FlowKey;
use crate::lb::{self, Balanced, Frontend, Source};
use crate::nat;
use crate::packet::{Packet, PortId};
use crate::tables::{PortKind, Tables};
use crate::wire::Parsed;

/// What was decided for a packet that starts a connection, for the stages after
/// conntrack (counting, affinity, trace notes).
#[derive(Default)]
pub(super) struct Opening {
    /// The Service frontend it reached.
    frontend: Option<Frontend>,
    /// Its endpoint, when one was chosen.
    balanced: Option<Balanced>,
    /// The static NAT rule's translation, when no frontend was reached.
    static_nat: Option<Nat>,
    /// A Service endpoint's segment of a connection conntrack lost, recovered as a reply
    /// of one another node translated: that node, which the segment returns through
    /// (`recover`).
    pub(super) recovered_via: Option<IpAddr>,
}

/// What routing needs to know of the packet's connection.
#[derive(Clone, Copy)]
pub(super) struct Conn {
    /// External traffic balanced to another node's endpoint with the client address
    /// kept: it must go through the tunnel (`lb::MARK_TUNNEL`).
    pub(super) force_tunnel: bool,
    /// For a reply: the node the connection's original direction came through, which
    /// the reply must return through.
    pub(super) reply_peer: Option<IpAddr>,
}

impl Pipeline {
    /// The NAT of a packet that can start a connection: from the Service frontend it
    /// reaches (the endpoint choice), else from the first static rule that matches (a
    /// pod egress masquerade rule must not turn Services off); then conntrack decides the
    /// connection with it. What was decided is left in `opening`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn open(
        &mut self,
        tables: &Tables,
        start: Start,
        pkt: &mut Packet,
        parsed: &mut Parsed,
        tunnel_peer: Option<IpAddr>,
        opening: &mut Opening,
        trace: &mut Trace,
    ) -> Result<CtResult, DropReason> {
        let in_id = pkt.meta.in_port;
        let kind = tables.ports[usize::from(in_id)].kind;
        let now = pkt.meta.time_ns;
        let key = &parsed.key;
        // From this node's pods or its own stack: external traffic from here ignores
        // externalTrafficPolicy (kube-proxy's short-circuit of pod and local sources).
        let from_host = tunnel_peer.is_none() && kind == PortKind::Host;
        let f = tables.services.frontend(key).or_else(|| {
            from_host
                .then(|| tables.services.host_node_port(key))
                .flatten()
        });
        let nat = match f {
            None => {
                // A Service endpoint's segment of a connection conntrack lost: the reply
                // of a Service connection, translated back (before the static rules: a
                // pod's egress masquerade would take it as the pod's own connection).
                if start.mid_stream()
                    && let Some(r) = self.recover(tables, pkt, parsed, opening, trace)
                {
                    return r;
                }
                let key = &parsed.key;
                opening.static_nat = Self::nat_for(tables, in_id, key);
                opening.static_nat
            }
            Some(f) => {
                opening.frontend = Some(f);
                let source = if from_host || (tunnel_peer.is_none() && kind == PortKind::Pod) {
                    Source::Node
                } else if tunnel_peer.is_some() {
                    Source::Tunnel
                } else {
                    Source::Network
                };
                let b = lb::balance(
                    &tables.services,
                    tables,
                    f,
                    key,
                    source,
                    &self.affinity,
                    now,
                )?;
                opening.balanced = Some(b);
                Some(b.nat)
            }
        };
        self.ct.start(start, pkt, parsed, nat.as_ref(), now)
    }

    /// A packet refused while it was tracked (no endpoint, a NAT that could not be
    /// made...): noted, a Service without endpoints answers at once, and dropped.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn refused(
        &mut self,
        tables: &Tables,
        r: DropReason,
        opening: &Opening,
        before: &FlowKey,
        pkt: &Packet,
        parsed: &Parsed,
        tunnel_peer: Option<IpAddr>,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        if let Some(f) = opening.frontend {
            Self::note_refused(tables, f, r, before, trace);
            if r == DropReason::ServiceSourceDenied {
                self.count_source_denied(&tables.services.services[f.service as usize].name);
            }
        }
        if r == DropReason::ServiceNoEndpoints {
            self.reject(tables, pkt, parsed, tunnel_peer, out, trace);
        }
        self.drop(r, trace)
    }

    /// What conntrack said, acted on: a Service connection counted and its client's
    /// affinity remembered (only once conntrack has a connection for it: a NAT refusal,
    /// say a clash, leaves none), trace notes, INVALID refused (unless let through), the
    /// pending connection marked, the tunnel peer remembered so that replies return
    /// through the node the original direction came through (which undoes its NAT).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn tracked(
        &mut self,
        tables: &Tables,
        ct: &mut CtResult,
        opening: &Opening,
        before: &FlowKey,
        parsed: &Parsed,
        tunnel_peer: Option<IpAddr>,
        now: u64,
        trace: &mut Trace,
    ) -> Result<Conn, DropReason> {
        let balanced = opening.balanced.filter(|_| ct.pending.is_some());
        if let (Some(b), Some(f)) = (&balanced, opening.frontend) {
            self.stats.service_balanced += 1;
            tables
                .services
                .remember(f, before, b.backend, &mut self.affinity, now);
            Self::note_balanced(tables, f, b, before, trace);
        }
        trace.ct = Some((ct.state, ct.reply));
        if trace.enabled {
            trace.key = Some(*before);
        }
        if let (Some(n), Some(_)) = (&opening.static_nat, &ct.pending) {
            Self::note_static_nat(n, trace);
        }
        trace.note(|| TraceEvent::Ct {
            state: ct.state,
            reply: ct.reply,
            key: parsed.key,
            translated: *before != parsed.key,
        });
        if ct.state == CtState::Invalid {
            if ct.entry.is_none() {
                self.refute_recovery(parsed);
            }
            if !tables.ct.pass_invalid {
                return Err(DropReason::CtInvalid);
            }
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
                .or(opening.recovered_via)
        } else {
            None
        };
        Ok(Conn {
            force_tunnel,
            reply_peer,
        })
    }

    /// Inserts the connection a NEW packet started, if any.
    pub(super) fn commit(
        &mut self,
        pending: &mut Option<Pending>,
        now: u64,
        trace: &mut Trace,
    ) -> Result<(), DropReason> {
        if let Some(p) = pending.take() {
            self.ct.commit(p, now)?;
            trace.note(|| TraceEvent::Committed);
        }
        Ok(())
    }

    /// The NAT of the first static rule matching a packet with `key` that starts a
    /// connection to no Service frontend ([`nat::first_match`]): masquerade takes the
    /// address the egress port has for the packet's family (after DNAT).
    fn nat_for(tables: &Tables, in_port: PortId, key: &FlowKey) -> Option<Nat> {
        nat::first_match(&tables.nat, in_port, key, |dst| {
            let route = tables.fib.lookup(dst.ip())?.route()?;
            let port = &tables.ports[usize::from(route.port)];
            Some(if dst.is_ipv4() {
                port.addr_v4
            } else {
                port.addr_v6
            })
        })
    }
}
