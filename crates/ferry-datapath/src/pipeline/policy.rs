//! The policy stage: NetworkPolicy and ClusterNetworkPolicy (see [`crate::policy`]). It
//! runs after the Service choice and conntrack, so that a new connection is judged on
//! the endpoint it was given (after DNAT) and on the source its pod will see (after
//! SNAT). Only a packet that starts a connection is decided: egress when it comes from
//! one of this node's pods, ingress when it goes to one. A denied connection is dropped
//! before it is committed, so the verdict is the connection itself: established packets
//! and replies pay nothing, and no connection outlives a denial.

use std::net::IpAddr;

use super::{Pipeline, Trace, TraceEvent};
use crate::conntrack::{CtResult, CtState};
use crate::drop::DropReason;
use crate::packet::{Packet, PortId};
use crate::policy::{DecidedBy, Decision, Direction, Policy, Query};
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

impl Pipeline {
    /// Decides a packet, as conntrack left it (`ct`), that starts a connection (or that
    /// conntrack found INVALID and lets through: it is decided on its own). `Err` drops
    /// it with `policy_denied`.
    #[inline(always)]
    pub(super) fn policy(
        &mut self,
        tables: &Tables,
        pkt: &Packet,
        parsed: &Parsed,
        tunnel_peer: Option<IpAddr>,
        ct: &CtResult,
        trace: &mut Trace,
    ) -> Result<(), DropReason> {
        let decided = ct.pending.is_some() || ct.state == CtState::Invalid;
        if !decided || tables.policy.is_empty() {
            return Ok(());
        }
        self.policy_slow(tables, pkt, parsed, tunnel_peer, trace)
    }

    fn policy_slow(
        &mut self,
        tables: &Tables,
        pkt: &Packet,
        parsed: &Parsed,
        tunnel_peer: Option<IpAddr>,
        trace: &mut Trace,
    ) -> Result<(), DropReason> {
        let policy = &*tables.policy;
        let key = &parsed.key;
        let in_port = pkt.meta.in_port;
        let in_kind = tables.ports[usize::from(in_port)].kind;
        if tunnel_peer.is_none() && in_kind == PortKind::Pod {
            let q = Query {
                peer: key.dst.ip(),
                proto: key.proto,
                port: key.dst_port,
            };
            let d = policy.decide(in_port, Direction::Egress, &q);
            self.count_policy(policy, in_port, Direction::Egress, d);
            note(tables, in_port, Direction::Egress, &q, d, trace);
            if !d.allowed {
                return Err(DropReason::PolicyDenied);
            }
        }
        if let Some(to) = local_pod(tables, key.dst.ip()) {
            let q = Query {
                peer: key.src.ip(),
                proto: key.proto,
                port: key.dst_port,
            };
            let d = if tunnel_peer.is_none() && in_kind == PortKind::Host && policy.host_to_pods() {
                Decision {
                    allowed: true,
                    by: DecidedBy::Host,
                }
            } else {
                policy.decide(to, Direction::Ingress, &q)
            };
            self.count_policy(policy, to, Direction::Ingress, d);
            note(tables, to, Direction::Ingress, &q, d, trace);
            if !d.allowed {
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
}

/// The trace's note of a decision.
fn note(tables: &Tables, port: PortId, d: Direction, q: &Query, v: Decision, trace: &mut Trace) {
    trace.note(|| {
        use super::events::PolicyBy;
        let policy = &*tables.policy;
        let by = match v.by {
            DecidedBy::Rule(tier, r) => PolicyBy::Rule {
                tier,
                rule: policy.rule_name(r).to_string(),
            },
            DecidedBy::Isolated => PolicyBy::Isolated {
                policies: policy
                    .isolating(port, d)
                    .into_iter()
                    .map(str::to_string)
                    .collect(),
            },
            DecidedBy::Default => PolicyBy::Default,
            DecidedBy::Host => PolicyBy::Host,
        };
        TraceEvent::Policy {
            direction: d,
            port: tables.ports[usize::from(port)].name.clone(),
            peer: q.peer,
            allowed: v.allowed,
            by,
        }
    });
}
