//! Saving the pipeline's per-flow and learnt state for the next agent, and restoring it
//! into a new pipeline (see [`crate::handover`] for what is saved and how it is read).

use std::sync::Arc;

use super::Pipeline;
use super::policy::allows;
use super::swap::{Removal, removal};
use crate::conntrack::{Filter, saved};
use crate::drop::DropReason;
use crate::handover::{self, Dropped, Meta, RestoreError, Restored, SavedState};
use crate::neigh::saved as neigh_saved;
use crate::packet::PortId;

impl Pipeline {
    /// The state to hand over at `now_ns`: every live connection and affinity record,
    /// the neighbours, the datagrams in reassembly, and what the pipeline says of
    /// itself. One pass over each table and no change to any; the worker calls it while
    /// forwarding is paused, so its time is part of the handover's gap
    /// (`docs/benchmarks.md` has figures).
    pub fn save_state(&self, now_ns: u64) -> SavedState {
        let t = &self.ct.config().timeouts;
        let all = Filter::default();
        let mut connections = Vec::with_capacity(self.ct.len());
        connections.extend(
            self.ct
                .dump(&all)
                // Due but not yet reaped: expired already.
                .filter(|(_, e)| e.deadline_ns(t) > now_ns)
                .map(|(_, e)| saved::record(e, now_ns)),
        );
        let mut neighbours: Vec<_> = self
            .neigh
            .iter()
            .filter_map(|(port, addr, n)| {
                let name = &self.tables.ports.get(usize::from(port))?.name;
                Some(neigh_saved::record(name, addr, n, now_ns))
            })
            .collect();
        // In a stable order (the table's is its hasher's): at most a thousand or so.
        neighbours.sort_unstable_by(|a, b| (&a.port, a.addr).cmp(&(&b.port, b.addr)));
        SavedState {
            meta: Meta {
                node: self.tables.node.name.clone(),
                outer_id: self.outer_id,
            },
            connections,
            affinity: self.affinity.saved(&self.tables.services, now_ns),
            neighbours,
            datagrams: self.ipf.saved(now_ns),
            ..SavedState::default()
        }
    }

    /// Loads `state` into this new pipeline at `now_ns`, resolving what depends on the
    /// tables against this pipeline's: what no longer resolves, or does not fit, is
    /// left out and counted, as [`crate::handover`] says. All or nothing: an `Err`
    /// changed nothing (the pipeline holds state already, the state is another node's,
    /// a record is impossible, or two connections share a tuple).
    pub fn restore_state(
        &mut self,
        state: &SavedState,
        now_ns: u64,
    ) -> Result<Restored, RestoreError> {
        let held = (
            self.ct.len(),
            self.affinity.len(),
            self.neigh.len(),
            self.ipf.held_datagrams(),
        );
        if held != (0, 0, 0, 0) {
            return Err(RestoreError::NotEmpty {
                connections: held.0,
                affinity: held.1,
                neighbours: held.2,
                datagrams: held.3,
            });
        }
        let tables = Arc::clone(&self.tables);
        if state.meta.node != tables.node.name {
            return Err(RestoreError::OtherNode {
                saved: state.meta.node.clone(),
                here: tables.node.name.clone(),
            });
        }
        handover::check_state(state).map_err(RestoreError::Invalid)?;

        let mut r = Restored::default();
        let mut dropped = Dropped::default();
        let d = &mut dropped;
        let reevaluate = tables.policy.reevaluate() && !tables.policy.is_empty();
        let timeouts = self.ct.config().timeouts;
        self.ct.reserve(state.connections.len());
        for (index, c) in state.connections.iter().enumerate() {
            let e = saved::entry(c, now_ns);
            if e.deadline_ns(&timeouts) <= now_ns {
                d.ct_expired += 1;
                continue;
            }
            match removal(&tables.services, &e) {
                Some(Removal::EndpointGone) => {
                    d.ct_endpoint_gone += 1;
                    continue;
                }
                Some(Removal::NowFrontend) => {
                    d.ct_now_frontend += 1;
                    continue;
                }
                None => {}
            }
            if reevaluate && !allows(&tables, &e) {
                d.ct_policy_denied += 1;
                continue;
            }
            match self.ct.adopt(e, now_ns) {
                Ok(_) => r.connections += 1,
                Err(DropReason::CtTableFull) => d.ct_table_full += 1,
                Err(_) => {
                    // Tuples are unique in any table a pipeline saved: undone whole.
                    self.ct.forget_all();
                    return Err(RestoreError::SharedTuple { index });
                }
            }
        }
        let (kept, gone, full) = self
            .affinity
            .restore(&tables.services, &state.affinity, now_ns);
        r.affinity = kept;
        d.affinity_service_gone = gone;
        d.affinity_table_full = full;
        for n in &state.neighbours {
            // Neighbours follow their port by name, wherever it is now.
            let Some(port) = tables.ports.iter().position(|p| p.name == n.port) else {
                d.neigh_port_gone += 1;
                continue;
            };
            if self
                .neigh
                .adopt(port as PortId, n.addr, neigh_saved::neighbour(n, now_ns))
            {
                r.neighbours += 1;
            } else {
                d.neigh_table_full += 1;
            }
        }
        let (kept, full) = self.ipf.restore(&state.datagrams, now_ns);
        r.datagrams = kept;
        d.frag_table_full = full;
        r.dropped = dropped;
        self.affinity_swept_ns = now_ns;
        self.outer_id = state.meta.outer_id;
        Ok(r)
    }
}
