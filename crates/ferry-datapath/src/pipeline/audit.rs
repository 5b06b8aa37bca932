//! The audit of denials: with it on ([`Pipeline::audit_denials`]), each new connection
//! that policy denies leaves one record ([`Denial`]) in a bounded buffer of the pipeline,
//! for the control plane to take ([`Pipeline::take_denials`]) and write to its audit log.
//!
//! Off (the default), the packet path pays one branch on the denial path only: allowed
//! and established packets never reach it. On, a denial costs a copy of its record into
//! the buffer (reserved whole when auditing is turned on, so nothing is allocated per
//! packet) and one reference to the tables that decided it, against which the record's
//! port and policy names resolve later, whatever tables are in force by then. A denial
//! that finds the buffer full is counted ([`Stats::audit_overflow`]) and not recorded;
//! nothing waits. The record carries the pipeline's own time: the datapath has no clock.
//!
//! A denied connection is never tracked, so each retransmission of its first packet is
//! decided, denied and recorded again: telling those apart is the log writer's concern.

use std::sync::Arc;

use super::{Pipeline, Stats};
use crate::flow::FlowKey;
use crate::packet::PortId;
use crate::policy::{DecidedBy, Direction, Tier};
use crate::tables::Tables;

/// The denials a pipeline holds at most between two takes, by default: some 40 000
/// denials a second when they are taken every 100 ms, as the worker does.
pub const DEFAULT_AUDIT_BUFFER: usize = 4096;

/// One direction of a new connection that policy denied.
#[derive(Clone, Debug)]
pub struct Denial {
    /// The pipeline's time of the packet (nanoseconds of the clock the pipeline is given).
    pub time_ns: u64,
    /// The port the packet came in on.
    pub in_port: PortId,
    /// The direction denied.
    pub direction: Direction,
    /// The pod port it was decided for: the source's for egress, the destination's for
    /// ingress.
    pub port: PortId,
    /// The packet's key as policy judged it: after NAT (a Service's endpoint, a source
    /// the pod would see).
    pub key: FlowKey,
    /// The packet's key as it arrived, before NAT (equal to `key` when nothing was
    /// translated).
    pub original: FlowKey,
    /// What denied it: a rule, or the isolation of the pod.
    pub by: DecidedBy,
    /// The tables that decided, for the names.
    tables: Arc<Tables>,
}

/// What denied a connection, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeniedBy<'a> {
    /// A rule of a ClusterNetworkPolicy tier (a NetworkPolicy rule only allows).
    Rule {
        /// Its tier.
        tier: Tier,
        /// Its policy (`ClusterNetworkPolicy NAME`).
        policy: &'a str,
        /// The rule within it (`ingress rule NAME`, `egress[1]`).
        rule: &'a str,
    },
    /// The pod is isolated by these NetworkPolicies (`NetworkPolicy NS/NAME`), and none
    /// of their rules allowed the connection.
    Isolated(Vec<&'a str>),
}

impl Denial {
    /// The name of the port it came in on.
    pub fn in_port_name(&self) -> &str {
        self.port_name_of(self.in_port)
    }

    /// The name of the pod port it was decided for (`pod.NAMESPACE.NAME`).
    pub fn port_name(&self) -> &str {
        self.port_name_of(self.port)
    }

    fn port_name_of(&self, p: PortId) -> &str {
        self.tables
            .ports
            .get(usize::from(p))
            .map_or("", |p| p.name.as_str())
    }

    /// What denied it, by the names of the tables that decided.
    pub fn denied_by(&self) -> DeniedBy<'_> {
        let policy = &*self.tables.policy;
        match self.by {
            DecidedBy::Rule(tier, r) => {
                let name = &*policy.policies()[policy.rule_policy(r) as usize];
                let full = policy.rule_name(r);
                DeniedBy::Rule {
                    tier,
                    policy: name,
                    rule: full
                        .strip_prefix(name)
                        .map_or(full, |rest| rest.trim_start()),
                }
            }
            // Only a rule or an isolation denies (the default and the host allow).
            DecidedBy::Isolated | DecidedBy::Default | DecidedBy::Host => {
                DeniedBy::Isolated(policy.isolating(self.port, self.direction))
            }
        }
    }
}

/// The buffer of denials (empty and of capacity 0 while auditing is off).
#[derive(Debug, Default)]
pub(super) struct Audit {
    records: Vec<Denial>,
    capacity: usize,
}

impl Audit {
    /// True while denials are recorded: the denial path's one check.
    #[inline]
    pub(super) fn is_on(&self) -> bool {
        self.capacity != 0
    }

    /// Records `d`, or counts it in `stats` when the buffer is full.
    pub(super) fn record(&mut self, d: Denial, stats: &mut Stats) {
        if self.records.len() < self.capacity {
            self.records.push(d);
        } else {
            stats.audit_overflow += 1;
        }
    }
}

impl Pipeline {
    /// Turns the audit of denials on, holding at most `capacity` records between two
    /// takes (reserved now), or off with 0 (records not taken yet are dropped).
    pub fn audit_denials(&mut self, capacity: usize) {
        self.audit.capacity = capacity;
        if capacity == 0 {
            self.audit.records = Vec::new();
        } else {
            self.audit.records.truncate(capacity);
            self.audit
                .records
                .reserve_exact(capacity - self.audit.records.len());
        }
    }

    /// True when the audit of denials is on.
    pub fn audits_denials(&self) -> bool {
        self.audit.is_on()
    }

    /// Moves at most `max` of the denials recorded, oldest first, to the end of `out`;
    /// the rest stay for the next take.
    pub fn take_denials(&mut self, max: usize, out: &mut Vec<Denial>) {
        let n = max.min(self.audit.records.len());
        out.extend(self.audit.records.drain(..n));
    }

    /// Records the denial of `direction` of a connection for the pod port `port`, by
    /// `by`, of a packet with `key` after NAT and `original` as it came.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn audit_denial(
        &mut self,
        time_ns: u64,
        in_port: PortId,
        direction: Direction,
        port: PortId,
        key: &FlowKey,
        original: &FlowKey,
        by: DecidedBy,
    ) {
        let d = Denial {
            time_ns,
            in_port,
            direction,
            port,
            key: *key,
            original: *original,
            by,
            tables: Arc::clone(&self.tables),
        };
        self.audit.record(d, &mut self.stats);
    }
}
