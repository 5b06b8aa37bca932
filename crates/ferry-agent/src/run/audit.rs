//! The running agent's audit log of denied connections ([`crate::policy::audit`]): the
//! denials the worker hands over, named with the state in force and written out.

use std::sync::{Arc, Weak};
use std::time::{Instant, SystemTime};

use ferry_datapath::Denial;
use ferry_linux::worker::Control;

use crate::cluster::Cluster;
use crate::policy::audit::{AuditConfig, AuditCounts, AuditLog, Names};

use super::apply::Last;

/// The log, and the names of the state it last named pods with.
pub(super) struct Audit {
    log: AuditLog,
    names: Names,
    /// The state and tables generation `names` are of.
    named: Option<(Weak<Cluster>, u64)>,
    denials: Vec<Denial>,
}

impl Audit {
    /// Opens the log of `cfg` for `node`.
    pub(super) fn open(cfg: &AuditConfig, node: &str) -> Result<Audit, String> {
        let log = cfg
            .open(node)
            .map_err(|e| format!("the policy audit log {}: {e}", cfg.target))?;
        Ok(Audit {
            log,
            names: Names::default(),
            named: None,
            denials: Vec::new(),
        })
    }

    /// Writes what the worker handed over: `last` is the state in force, of tables
    /// generation `generation`; `started` is where the pipeline's clock starts.
    pub(super) fn run(
        &mut self,
        control: &Control,
        last: Option<&Last>,
        generation: u64,
        started: Instant,
    ) {
        control.take_denials(&mut self.denials);
        let overflow = control.snapshot().pipeline.audit_overflow;
        if let Some(last) = last
            && !self.denials.is_empty()
        {
            let current = self
                .named
                .as_ref()
                .is_some_and(|(c, g)| *g == generation && c.ptr_eq(&Arc::downgrade(&last.cluster)));
            if !current {
                self.names = Names::of(&last.cluster, &last.pod_ports);
                self.named = Some((Arc::downgrade(&last.cluster), generation));
            }
        }
        let now_ns = started.elapsed().as_nanos() as u64;
        self.log.write(
            &self.denials,
            &self.names,
            overflow,
            now_ns,
            SystemTime::now(),
        );
        self.denials.clear();
    }

    /// What the log counted.
    pub(super) fn counts(&self) -> AuditCounts {
        self.log.counts()
    }
}
