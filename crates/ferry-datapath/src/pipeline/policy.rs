//! The policy stage: NetworkPolicy and ClusterNetworkPolicy (see [`crate::policy`]). It
//! runs after the Service choice and conntrack, so that a new connection is judged on
//! the endpoint it was given (after DNAT) and on the source its pod will see (after
//! SNAT). Only a packet that starts a connection is decided: egress when it comes from
//! one of this node's pods, ingress when it goes to one. A denied connection is dropped
//! before it is committed, so the verdict is the connection itself: established packets
//! and replies pay nothing, and no connection outlives a denial.

use std::net::IpAddr;
use std::sync::Arc;

use super::{Pipeline, Trace, TraceEvent};
use crate::conntrack::{CtResult, CtState, Entry};
use crate::drop::DropReason;
use crate::flow::FlowKey;
use crate::packet::{Packet, PortId};
use crate::policy::{DecidedBy, Decision, Direction, MARK_FROM_HOST, Policy, Query};
use crate::tables::{PortKind, Tables};
use crate::wire::Parsed;

/// Connections decided for one policy, by direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyCount {
    /// New connections to its pods that a rule of it allowed.
    pub ingress_allowed: u64,
    /// New connections to its pods that it denied (a rule, or its isolation).
    pub ingress_denied: u64,
    /// New connections from its pods that a rule of it allowed.
    pub egress_allowed: u64,
    /// New connections from its pods that it denied.
    pub egress_denied: u64,
}

impl PolicyCount {
    fn add(&mut self, d: Direction, allowed: bool) {
        let c = match (d, allowed) {
            (Direction::Ingress, true) => &mut self.ingress_allowed,
            (Direction::Ingress, false) => &mut self.ingress_denied,
            (Direction::Egress, true) => &mut self.egress_allowed,
            (Direction::Egress, false) => &mut self.egress_denied,
        };
        *c += 1;
    }
}

/// The pod port a packet goes to on this node, if it does.
pub(super) fn local_pod(tables: &Tables, dst: IpAddr) -> Option<PortId> {
    let route = tables.fib.lookup(dst)?.route()?;
    (tables.ports[usize::from(route.port)].kind == PortKind::Pod).then_some(route.port)
}

/// One direction of a new connection decided: the pod's port, what was asked, the
/// decision.
#[derive(Clone, Copy, Debug)]
struct Decided {
    direction: Direction,
    port: PortId,
    query: Query,
    decision: Decision,
}

/// The decisions on a connection with `key` (after NAT) that comes from the pod port
/// `from` of this node (if it does) or from the node's own stack (`from_host`): egress
/// of the source pod, then ingress of the destination pod if it is one of this node's.
/// A denied egress is not followed by an ingress decision.
fn judge(
    tables: &Tables,
    from: Option<PortId>,
    key: &FlowKey,
    from_host: bool,
) -> [Option<Decided>; 2] {
    let policy = &*tables.policy;
    let mut out = [None, None];
    if let Some(from) = from {
        let query = Query {
            peer: key.dst.ip(),
            proto: key.proto,
            port: key.dst_port,
        };
        let decision = policy.decide(from, Direction::Egress, &query);
        out[0] = Some(Decided {
            direction: Direction::Egress,
            port: from,
            query,
            decision,
        });
        if !decision.allowed {
            return out;
        }
    }
    if let Some(to) = local_pod(tables, key.dst.ip()) {
        let query = Query {
            peer: key.src.ip(),
            proto: key.proto,
            port: key.dst_port,
        };
        let decision = if from_host && policy.host_to_pods() {
            Decision {
                allowed: true,
                by: DecidedBy::Host,
            }
        } else {
            policy.decide(to, Direction::Ingress, &query)
        };
        out[1] = Some(Decided {
            direction: Direction::Ingress,
            port: to,
            query,
            decision,
        });
    }
    out
}

/// True when policy allows both directions it decides of a connection with `key`
/// (after NAT) from the pod port `from` of this node or from its own stack
/// (`from_host`), as [`judge`] decides them.
pub(super) fn allows_key(
    tables: &Tables,
    from: Option<PortId>,
    key: &FlowKey,
    from_host: bool,
) -> bool {
    judge(tables, from, key, from_host)
        .into_iter()
        .flatten()
        .all(|d| d.decision.allowed)
}

/// A tracked connection that a policy would not allow (see [`Pipeline::policy_cuts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyCut {
    /// Its original tuple, as the first packet arrived.
    pub original: FlowKey,
    /// Its reply tuple.
    pub reply: FlowKey,
    /// The denial, as a trace notes it.
    pub denial: TraceEvent,
}

/// The key of a connection's first packet after NAT, from its entry: the reply tuple
/// turned around.
fn translated(e: &Entry) -> FlowKey {
    let r = e.reply();
    FlowKey {
        src: r.dst,
        dst: r.src,
        src_port: r.dst_port,
        dst_port: r.src_port,
        ..r
    }
}

/// The decisions on a tracked connection, as if it started now.
fn judge_entry(tables: &Tables, e: &Entry) -> [Option<Decided>; 2] {
    let from = if e.tunnel_peer().is_none() {
        local_pod(tables, e.original().src.ip())
    } else {
        None
    };
    judge(tables, from, &translated(e), e.mark & MARK_FROM_HOST != 0)
}

impl Pipeline {
    /// Decides a packet, as conntrack left it (`ct`), that starts a connection (or that
    /// conntrack found INVALID and lets through: it is decided on its own); `original`
    /// is its key as it came, before NAT (for the audit of a denial). `Err` drops it
    /// with `policy_denied`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn policy(
        &mut self,
        tables: &Tables,
        pkt: &Packet,
        parsed: &Parsed,
        original: &FlowKey,
        tunnel_peer: Option<IpAddr>,
        ct: &mut CtResult,
        trace: &mut Trace,
    ) -> Result<(), DropReason> {
        let decided = ct.pending.is_some() || ct.state == CtState::Invalid;
        if !decided {
            return Ok(());
        }
        // A connection of the node's own stack says so, whatever the policy now: a
        // later policy re-evaluating it must know.
        let in_kind = tables.ports[usize::from(pkt.meta.in_port)].kind;
        if tunnel_peer.is_none()
            && in_kind == PortKind::Host
            && let Some(p) = ct.pending.as_mut()
        {
            p.entry_mut().mark |= MARK_FROM_HOST;
        }
        if tables.policy.is_empty() {
            return Ok(());
        }
        self.policy_slow(tables, pkt, parsed, original, tunnel_peer, trace)
    }

    fn policy_slow(
        &mut self,
        tables: &Tables,
        pkt: &Packet,
        parsed: &Parsed,
        original: &FlowKey,
        tunnel_peer: Option<IpAddr>,
        trace: &mut Trace,
    ) -> Result<(), DropReason> {
        let in_port = pkt.meta.in_port;
        let in_kind = tables.ports[usize::from(in_port)].kind;
        let from = (tunnel_peer.is_none() && in_kind == PortKind::Pod).then_some(in_port);
        let from_host = tunnel_peer.is_none() && in_kind == PortKind::Host;
        for d in judge(tables, from, &parsed.key, from_host)
            .into_iter()
            .flatten()
        {
            self.count_policy(&tables.policy, d.port, d.direction, d.decision);
            note(tables, &d, trace);
            if !d.decision.allowed {
                if self.audit.is_on() {
                    self.audit_denial(
                        pkt.meta.time_ns,
                        in_port,
                        d.direction,
                        d.port,
                        &parsed.key,
                        original,
                        d.decision.by,
                    );
                }
                return Err(DropReason::PolicyDenied);
            }
        }
        Ok(())
    }

    fn count_policy(&mut self, policy: &Policy, port: PortId, dir: Direction, d: Decision) {
        match (d.allowed, d.by) {
            (false, _) => self.stats.policy_denied += 1,
            (true, DecidedBy::Rule(..)) => self.stats.policy_allowed += 1,
            (true, _) => {}
        }
        let counts = &mut self.policy_counts;
        if counts.len() < policy.policies().len() {
            counts.resize(policy.policies().len(), PolicyCount::default());
        }
        match d.by {
            DecidedBy::Rule(_, r) => counts[policy.rule_policy(r) as usize].add(dir, d.allowed),
            DecidedBy::Isolated => {
                for p in policy.isolating_ids(port, dir) {
                    counts[*p as usize].add(dir, false);
                }
            }
            DecidedBy::Default | DecidedBy::Host => {}
        }
    }

    /// Connections decided per policy, by the policies' names (a policy that no pod of
    /// this node has met yet may be missing).
    pub fn policy_counts(&self) -> impl Iterator<Item = (&str, PolicyCount)> {
        self.tables
            .policy
            .policies()
            .iter()
            .zip(self.policy_counts.iter())
            .map(|(n, c)| (&**n, *c))
    }

    /// The tracked connections that the policy of `tables` would not allow if they
    /// started now: what a change to those tables would cut with
    /// [`PolicySpec::reevaluate`](crate::policy::PolicySpec::reevaluate) on. `tables`
    /// must have the ports of the tables in force (a preview compiles the proposed
    /// policy into a copy of them).
    pub fn policy_cuts(&self, tables: &Tables) -> Vec<PolicyCut> {
        let all = crate::conntrack::Filter::default();
        self.ct
            .dump(&all)
            .filter_map(|(_, e)| {
                let denied = judge_entry(tables, e)
                    .into_iter()
                    .flatten()
                    .find(|d| !d.decision.allowed)?;
                Some(PolicyCut {
                    original: e.original(),
                    reply: e.reply(),
                    denial: event(tables, &denied),
                })
            })
            .collect()
    }

    /// Ends the tracked connections the policy in force does not allow (see
    /// [`Pipeline::policy_cuts`]); returns how many.
    pub(super) fn cut_denied(&mut self) -> usize {
        let tables = Arc::clone(&self.tables);
        self.ct.retain(|e| allows(&tables, e))
    }
}

/// True when the policy of `tables` allows the tracked connection `e`, judged as if it
/// started now.
pub(super) fn allows(tables: &Tables, e: &Entry) -> bool {
    judge_entry(tables, e)
        .into_iter()
        .flatten()
        .all(|d| d.decision.allowed)
}

/// The trace's note of a decision.
fn note(tables: &Tables, d: &Decided, trace: &mut Trace) {
    trace.note(|| event(tables, d));
}

/// The trace event of a decision.
fn event(tables: &Tables, d: &Decided) -> TraceEvent {
    use super::events::PolicyBy;
    let policy = &*tables.policy;
    let by = match d.decision.by {
        DecidedBy::Rule(tier, r) => PolicyBy::Rule {
            tier,
            rule: policy.rule_name(r).to_string(),
        },
        DecidedBy::Isolated => PolicyBy::Isolated {
            policies: policy
                .isolating(d.port, d.direction)
                .into_iter()
                .map(str::to_string)
                .collect(),
        },
        DecidedBy::Default => PolicyBy::Default,
        DecidedBy::Host => PolicyBy::Host,
    };
    TraceEvent::Policy {
        direction: d.direction,
        port: tables.ports[usize::from(d.port)].name.clone(),
        peer: d.query.peer,
        allowed: d.decision.allowed,
        by,
    }
}
