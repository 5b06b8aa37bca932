//! Saving the pipeline's per-flow and learnt state for the next agent, and restoring it
//! into a new pipeline (see [`crate::handover`] for what is saved and how it is read).

use std::borrow::Cow;
use std::sync::Arc;

use super::Pipeline;
use super::policy::allows;
use super::swap::{Removal, removal};
use crate::conntrack::saved;
use crate::drop::DropReason;
use crate::handover::{
    self, Affinity, Connection, RestoreError, RestoreOptions, Restored, SavedState,
};
use crate::neigh::saved as neigh_saved;
use crate::packet::PortId;
use crate::tables::Tables;

impl Pipeline {
    /// The state to hand over at `now_ns`: every live connection and affinity record,
    /// the neighbours, the datagrams in reassembly, and what the pipeline says of
    /// itself. One pass over each table and no change to any; the worker calls it while
    /// forwarding is paused, so its time is part of the handover's gap
    /// (`docs/benchmarks.md` has figures).
    pub fn save_state(&self, now_ns: u64) -> SavedState {
        let mut state = SavedState::default();
        self.save_state_into(now_ns, &mut state);
        state
    }

    /// [`Pipeline::save_state`] into `state`, replacing what it held and reusing its
    /// memory: for a checkpoint every second, whose worker pauses for the save, a state
    /// given back after encoding spares the allocation and the first touch of its
    /// pages (half the save of a full table: `docs/benchmarks.md`).
    pub fn save_state_into(&self, now_ns: u64, state: &mut SavedState) {
        state.format = handover::FORMAT;
        if state.producer != handover::PRODUCER {
            state.producer = handover::PRODUCER.to_string();
        }
        state.removed = None;
        state.connections.clear();
        self.ct.save_into(now_ns, &mut state.connections);
        self.save_rest_into(now_ns, state);
    }

    /// What [`Pipeline::save_state_into`] saves besides the connections, into `state`.
    fn save_rest_into(&self, now_ns: u64, state: &mut SavedState) {
        state.meta.node.clone_from(&self.tables.node.name);
        state.meta.outer_id = self.outer_id;
        let ports = &self.tables.ports;
        let live = self.neigh.iter().filter_map(|(port, addr, n)| {
            let name = &ports.get(usize::from(port))?.name;
            Some((name, addr, n))
        });
        let mut kept = 0;
        for (name, addr, n) in live {
            // Written over the last save's records, so that their port names are too.
            match state.neighbours.get_mut(kept) {
                Some(r) => neigh_saved::record_into(r, name, addr, n, now_ns),
                None => state
                    .neighbours
                    .push(neigh_saved::record(name, addr, n, now_ns)),
            }
            kept += 1;
        }
        state.neighbours.truncate(kept);
        // In a stable order (the table's is its hasher's): at most a thousand or so.
        state
            .neighbours
            .sort_unstable_by(|a, b| (&a.port, a.addr).cmp(&(&b.port, b.addr)));
        state.affinity = self.affinity.saved(&self.tables.services, now_ns);
        state.datagrams = self.ipf.saved(now_ns);
    }

    /// Loads `state` into this new pipeline at `now_ns`, resolving what depends on the
    /// tables against this pipeline's: what no longer resolves, or does not fit, is
    /// left out and counted, as [`crate::handover`] says. All or nothing: an `Err`
    /// changed nothing (the pipeline holds state already, the state is another node's,
    /// a record is impossible, or two connections share a tuple). For a handover: the
    /// state as it was saved, just now ([`RestoreOptions::default`]).
    pub fn restore_state(
        &mut self,
        state: &SavedState,
        now_ns: u64,
    ) -> Result<Restored, RestoreError> {
        self.restore_state_with(state, now_ns, RestoreOptions::default())
    }

    /// [`Pipeline::restore_state`], taking the state as `options` say: for a checkpoint
    /// saved a while ago ([`RestoreOptions::checkpoint`]), times aged by its age and TCP
    /// windows learnt again (see [`crate::handover`], "Stale states").
    pub fn restore_state_with(
        &mut self,
        state: &SavedState,
        now_ns: u64,
        options: RestoreOptions,
    ) -> Result<Restored, RestoreError> {
        self.refuse_held(true)?;
        let tables = self.refuse_other_node(state)?;
        if state.removed.is_some() {
            return Err(RestoreError::OnlyChanges);
        }
        handover::check_state(state).map_err(RestoreError::Invalid)?;

        let mut r = Restored::default();
        self.restore_connections(&tables, &state.connections, now_ns, options, &mut r)?;
        self.restore_rest(&tables, state, now_ns, options, &mut r);
        Ok(r)
    }

    /// Refuses a restore into this pipeline while it holds affinity records,
    /// neighbours or datagrams in reassembly, or, when `connections`, connections.
    fn refuse_held(&self, connections: bool) -> Result<(), RestoreError> {
        let held = (
            self.ct.len(),
            self.affinity.len(),
            self.neigh.len(),
            self.ipf.held_datagrams(),
        );
        if (connections && held.0 > 0) || (held.1, held.2, held.3) != (0, 0, 0) {
            return Err(RestoreError::NotEmpty {
                connections: held.0,
                affinity: held.1,
                neighbours: held.2,
                datagrams: held.3,
            });
        }
        Ok(())
    }

    /// The tables in force, unless `state` is another node's.
    fn refuse_other_node(&self, state: &SavedState) -> Result<Arc<Tables>, RestoreError> {
        if state.meta.node != self.tables.node.name {
            return Err(RestoreError::OtherNode {
                saved: state.meta.node.clone(),
                here: self.tables.node.name.clone(),
            });
        }
        Ok(Arc::clone(&self.tables))
    }

    /// Tracks `connections` again, each checked as [`Pipeline::restore_state_with`]
    /// says; counted in `r`. A tuple taken already undoes every connection of the
    /// pipeline.
    fn restore_connections(
        &mut self,
        tables: &Tables,
        connections: &[Connection],
        now_ns: u64,
        options: RestoreOptions,
        r: &mut Restored,
    ) -> Result<(), RestoreError> {
        let age = options.age_ns;
        let d = &mut r.dropped;
        let reevaluate = tables.policy.reevaluate() && !tables.policy.is_empty();
        let timeouts = self.ct.config().timeouts;
        self.ct.reserve(self.ct.len() + connections.len());
        for (index, c) in connections.iter().enumerate() {
            let mut e = saved::entry(c, now_ns, age);
            // By durations, not by the new clock's times: those of a clock younger than
            // the record are taken as its start.
            if saved::idle_ns(c, age) >= e.timeout_ns(&timeouts) {
                d.ct_expired += 1;
                continue;
            }
            if options.stale {
                saved::forget_windows(&mut e);
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
            if reevaluate && !allows(tables, &e) {
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
        Ok(())
    }

    /// Restores what `state` holds besides its connections: affinity records,
    /// neighbours, datagrams in reassembly and the overlay's next identification.
    fn restore_rest(
        &mut self,
        tables: &Tables,
        state: &SavedState,
        now_ns: u64,
        options: RestoreOptions,
        r: &mut Restored,
    ) {
        let age = options.age_ns;
        let d = &mut r.dropped;
        let affinity = aged_affinity(&state.affinity, age);
        d.affinity_expired = state.affinity.len() - affinity.len();
        let (kept, gone, full) = self.affinity.restore(&tables.services, &affinity, now_ns);
        r.affinity = kept;
        d.affinity_service_gone = gone;
        d.affinity_table_full = full;
        for n in &state.neighbours {
            // Neighbours follow their port by name, wherever it is now.
            let Some(port) = tables.ports.iter().position(|p| p.name == n.port) else {
                d.neigh_port_gone += 1;
                continue;
            };
            if self.neigh.adopt(
                port as PortId,
                n.addr,
                neigh_saved::neighbour(n, now_ns, age),
            ) {
                r.neighbours += 1;
            } else {
                d.neigh_table_full += 1;
            }
        }
        if options.stale {
            // Their other fragments went to the agent that is gone, or nowhere.
            d.frag_stale = state.datagrams.len();
        } else {
            let (kept, full, expired) = self.ipf.restore(&state.datagrams, now_ns, age);
            r.datagrams = kept;
            d.frag_table_full = full;
            d.frag_expired = expired;
        }
        self.affinity_swept_ns = now_ns;
        self.outer_id = state.meta.outer_id;
    }

    /// Begins a pre-copy (see [`crate::handover`], "Pre-copy"): from now on the
    /// pipeline records which connections change and which are removed, so that a
    /// base saved a part at a time while forwarding ([`Pipeline::save_base_into`])
    /// and the changes saved at the end ([`Pipeline::save_changes`]) make the state of
    /// that end. Forgets what an earlier pre-copy recorded; costs the packet path a
    /// bit set per connection written to until [`Pipeline::save_changes`] or
    /// [`Pipeline::stop_tracking`].
    pub fn track_changes(&mut self) {
        self.ct.track_changes();
    }

    /// Ends a pre-copy without saving its changes (a handover that failed).
    pub fn stop_tracking(&mut self) {
        self.ct.untrack();
    }

    /// True while a pre-copy records changes.
    pub fn is_tracking(&self) -> bool {
        self.ct.is_tracking()
    }

    /// A part of a pre-copy's base at `now_ns`: appends to `state` the connections of
    /// slab slots `from..from + slots` that did not change since
    /// [`Pipeline::track_changes`], and, for the first part (`from` 0), what the
    /// pipeline says of itself. Returns where the next part starts, or None after the
    /// last. The base holds connections only, each as it was when its part was saved:
    /// the base itself is restored with [`Pipeline::restore_state`], and what changed
    /// meanwhile comes with [`Pipeline::save_changes`].
    pub fn save_base_into(
        &self,
        now_ns: u64,
        from: usize,
        slots: usize,
        state: &mut SavedState,
    ) -> Option<usize> {
        if from == 0 {
            state.format = handover::FORMAT;
            state.producer = handover::PRODUCER.to_string();
            state.meta.node.clone_from(&self.tables.node.name);
            state.meta.outer_id = self.outer_id;
            state.connections.clear();
            state.affinity.clear();
            state.neighbours.clear();
            state.datagrams.clear();
            state.removed = None;
        }
        self.ct
            .save_unchanged_into(now_ns, from, slots.max(1), &mut state.connections)
    }

    /// Ends a pre-copy at `now_ns` and saves what changed since
    /// [`Pipeline::track_changes`]: the connections changed or made since, those
    /// removed since (by tuple), and all the rest of the state as
    /// [`Pipeline::save_state`] saves it (affinity records, neighbours, datagrams in
    /// reassembly, what the pipeline says of itself). Applied over the base with
    /// [`Pipeline::apply_changes`]. When changes were not tracked, or more were removed
    /// than a full table holds, the whole state instead (its `removed` None), which
    /// [`Pipeline::apply_changes`] puts in the base's place. The worker calls it
    /// paused: its time is part of the handover's gap.
    pub fn save_changes(&mut self, now_ns: u64) -> SavedState {
        let mut state = SavedState::default();
        match self.ct.save_changed(now_ns, &mut state.connections) {
            Some(removed) => {
                self.save_rest_into(now_ns, &mut state);
                state.removed = Some(removed);
            }
            None => self.save_state_into(now_ns, &mut state),
        }
        state
    }

    /// Applies the changes of a pre-copy ([`Pipeline::save_changes`]) at `now_ns` over
    /// its base, restored into this pipeline: removes the connections removed since and
    /// the base's record of each changed one, then restores the changed ones and the
    /// rest of the state, as [`Pipeline::restore_state`] restores them. A whole state
    /// (`removed` None) replaces the base. An `Err` changes nothing (the state is
    /// another node's, a record is impossible, the pipeline holds affinity records,
    /// neighbours or datagrams already), except when the changes do not fit the base
    /// (a tuple shared): then the pipeline is left with no connections.
    pub fn apply_changes(
        &mut self,
        state: &SavedState,
        now_ns: u64,
    ) -> Result<Restored, RestoreError> {
        let Some(removed) = &state.removed else {
            self.ct.forget_all();
            return self.restore_state(state, now_ns);
        };
        self.refuse_held(false)?;
        let tables = self.refuse_other_node(state)?;
        handover::check_state(state).map_err(RestoreError::Invalid)?;
        for g in removed {
            self.ct.forget(&saved::key(g.zone, g.proto, &g.original));
        }
        // The base's record of a connection that changed since is older than the one
        // here; whatever else holds one of its tuples was removed or changed since.
        for c in &state.connections {
            self.ct
                .forget_any(&saved::key(c.zone, c.proto, &c.original));
            self.ct.forget_any(&saved::key(c.zone, c.proto, &c.reply));
        }
        let mut r = Restored::default();
        let options = RestoreOptions::default();
        self.restore_connections(&tables, &state.connections, now_ns, options, &mut r)?;
        self.restore_rest(&tables, state, now_ns, options, &mut r);
        Ok(r)
    }
}

/// The affinity records with time left `age_ns` after their save, with that much less
/// (the records themselves when no time passed).
fn aged_affinity(records: &[Affinity], age_ns: u64) -> Cow<'_, [Affinity]> {
    if age_ns == 0 {
        return Cow::Borrowed(records);
    }
    Cow::Owned(
        records
            .iter()
            .filter(|a| a.remaining_ns > age_ns)
            .map(|a| Affinity {
                remaining_ns: a.remaining_ns - age_ns,
                ..a.clone()
            })
            .collect(),
    )
}
