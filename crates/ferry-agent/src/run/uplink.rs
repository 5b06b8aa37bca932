//! The uplink's interface, found when `--uplink` does not name it, and with
//! `--take-uplink` the node's own stack on it, moved onto the host TAP once ferry
//! forwards and given back when the agent stops ([`crate::takeover`]).

use std::sync::Arc;

use crate::cluster::Cluster;
use crate::config::FerryConfig;
use crate::fields::NodeFields;
use crate::takeover::{self, Taken};

use super::Agent;

impl Agent {
    /// Finds the uplink's interface when none was given and the tables have an uplink
    /// (the default base always has one): the first existing name of the ferry-config
    /// ConfigMap's `uplink`, else the interface holding the Node's InternalIP, else the
    /// default route's. With `--take-uplink`, reads what is to move: the record of an
    /// agent that took the uplink before (handed over, or crashed), else what the kernel
    /// has on the uplink now, recorded in the state directory before anything changes.
    pub(super) fn resolve_uplink(&mut self, cluster: &Cluster) -> Result<(), String> {
        let take = self.opts.take_uplink;
        if take && self.opts.base.is_some() {
            return Err(
                "--take-uplink: works on the default base, not with --base (give the base a host port and routes instead, docs/node.md)"
                    .into(),
            );
        }
        if take && self.opts.host_tap.is_none() {
            self.opts.host_tap = Some(takeover::DEFAULT_HOST_TAP.to_string());
        }
        let tap = self.opts.host_tap.clone().unwrap_or_default();
        let dir = self.opts.state_dir.clone();
        // The stack an agent before moved, without --take-uplink now: taking the uplink
        // without taking the stack up would leave the node without its addresses.
        if !take
            && let Some(d) = &dir
            && let Ok(Some(r)) = takeover::load(d)
        {
            return Err(format!(
                "{}: an agent before this one moved the node's stack off {} onto {}; start with --take-uplink to take it up (the agent gives it back when it stops)",
                takeover::record_path(d).display(),
                r.uplink,
                r.tap
            ));
        }
        let record = match (&dir, take) {
            (Some(d), true) => takeover::load(d)
                .map_err(|e| format!("--take-uplink: the record of the node's stack: {e}"))?,
            (None, true) => return Err("--take-uplink: needs a state directory".into()),
            _ => None,
        };
        if let Some(r) = &record {
            if let Some(u) = self.opts.uplink.as_deref().filter(|u| *u != r.uplink) {
                return Err(format!(
                    "--uplink {u}: the node's stack was taken from {} (recorded in {}); give that, or give the stack back first",
                    r.uplink,
                    takeover::record_path(dir.as_deref().unwrap_or(std::path::Path::new("")))
                        .display()
                ));
            }
            if r.tap != tap {
                return Err(format!(
                    "--host-tap {tap}: the node's stack was moved to {} by an agent before; give that",
                    r.tap
                ));
            }
            tracing::info!(uplink = %r.uplink, tap = %r.tap,
                "taking up the node's stack an agent before this one moved off the uplink");
            self.opts.uplink = Some(r.uplink.clone());
        }
        let wants_uplink = self.opts.base.as_ref().is_none_or(|b| {
            b.ports
                .iter()
                .any(|p| p.kind == ferry_datapath::PortKind::Uplink)
        });
        if self.opts.uplink.is_none() && wants_uplink {
            let configured = FerryConfig::of(cluster)?.uplink;
            let ips = cluster
                .node(&self.opts.node)
                .map(|n| {
                    NodeFields::parse(n)
                        .map(|f| f.internal_ips)
                        .unwrap_or_default()
                })
                .unwrap_or_default();
            let skip: Vec<&str> = self.opts.host_tap.as_deref().into_iter().collect();
            let (dev, found) = takeover::detect(&configured, &ips, &skip)?;
            tracing::info!(uplink = %dev, "the uplink is {dev}: {found}");
            self.opts.uplink = Some(dev);
        }
        let record = match (record, take) {
            (Some(r), _) => Some(r),
            (None, true) => {
                let uplink = self.opts.uplink.clone().unwrap_or_default();
                let t = takeover::read(&uplink, &tap)
                    .map_err(|e| format!("--take-uplink: reading {uplink}: {e}"))?;
                if t.addresses.is_empty() {
                    tracing::warn!(uplink = %uplink, "the uplink holds no address: the node's stack has nothing to move");
                }
                let d = dir.as_deref().unwrap_or(std::path::Path::new(""));
                takeover::save(d, &t).map_err(|e| {
                    format!(
                        "--take-uplink: recording the node's stack in {}: {e}",
                        takeover::record_path(d).display()
                    )
                })?;
                Some(t)
            }
            (None, false) => None,
        };
        let record = record.map(Arc::new);
        self.opts.compile.taken = record.clone();
        self.pending_take = record;
        Ok(())
    }

    /// Moves the node's stack onto the host TAP, now that the worker forwards (the
    /// kernel side of a TAP handed over may have it already: nothing changes then).
    pub(super) fn take_uplink(&mut self) -> Result<(), String> {
        let Some(t) = self.pending_take.take() else {
            return Ok(());
        };
        takeover::take(&t)?;
        tracing::info!(uplink = %t.uplink, tap = %t.tap,
            addresses = ?takeover::addresses(&t),
            routes = t.routes.len(),
            "the node's own stack is on the host TAP; the agent gives it back to the uplink when it stops without handing over");
        self.taken = Some(t);
        Ok(())
    }

    /// Gives the node's stack back to the uplink, when this agent moved it, and forgets
    /// the record (kept when something could not be given back, for the next agent to
    /// try again).
    pub(super) fn give_back_uplink(&mut self) {
        let Some(t) = self.taken.take() else {
            return;
        };
        match takeover::give_back(&t) {
            Ok(()) => {
                if let Some(d) = &self.opts.state_dir
                    && let Err(e) = takeover::forget(d)
                {
                    tracing::warn!(error = %e, "the record of the node's stack was not removed");
                }
                tracing::info!(uplink = %t.uplink, "the node's own stack is back on the uplink");
            }
            Err(e) => tracing::error!(error = %e, "the node's stack was not all given back"),
        }
    }

    /// The node's stack this agent moved, while it holds it.
    pub fn taken(&self) -> Option<&Taken> {
        self.taken.as_deref()
    }
}
