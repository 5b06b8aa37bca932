//! The state a pipeline hands over to the next agent's, and its bytes.
//!
//! A new agent takes over from the running one without breaking a connection (issue
//! 24): the old agent's worker pauses, saves its pipeline's per-flow and learnt state
//! ([`Pipeline::save_state`]) and [`encode`]s it; the new agent [`decode`]s it and
//! restores it into its own pipeline, built from its own tables
//! ([`Pipeline::restore_state`]). Passing the bytes and the ports is the agent's.
//!
//! # What is saved
//!
//! - **Connections** (section `CONN`): both tuples, protocol tracking (TCP state and both
//!   sides' windows, scales and flags), NAT status, mark, labels, tunnel peer, counts,
//!   and the times of the first and last packets. A connection's NAT port allocation is
//!   its reply tuple: restoring the connection reserves it again, so a new connection
//!   cannot take it. The policy verdict is the connection itself (a denied one is never
//!   tracked), with [`crate::policy::MARK_FROM_HOST`] in its mark.
//! - **Session affinity** (section `AFFN`): client, endpoint and time left, by the
//!   Service port's name.
//! - **The producer** (section `META`): the node's name (a state is restored on that
//!   node only) and the overlay's next outer IPv4 identification.
//! - **Neighbours** (section `NEIG`): MAC, state, times and probes, by port name, so
//!   that the first packets after the handover need no ARP or neighbour discovery.
//! - **Datagrams in reassembly** (section `FRAG`): the data of each fragment held, the
//!   first fragment's headers, the sizes and ECN seen and the time left, so that a
//!   datagram whose fragments straddle the handover still completes (at most
//!   `ipf.max_bytes`, 4 MiB by default, of fragments).
//!
//! Not saved, because a handover loses nothing by it: packets waiting for a neighbour
//! (in flight, as those on the wire), counters (the new agent counts from zero), the ICMP
//! and probe budgets, the audit log, the last SYN ignored per TCP connection (it only
//! resynchronises a stale connection), markers of failed fragment datagrams, and the
//! random hash keys (each table hashes with its own).
//!
//! # Time and tables
//!
//! A pipeline's clock is its agent's (nanoseconds since it started), so a record keeps
//! durations relative to the save: how long ago its packets came, how long it has left.
//! A restore re-bases them on the new clock; a time that would fall before the new
//! clock's start is taken as its start (the entry then lives at most that much longer
//! than it would have: a clock that starts at the system's monotonic time avoids it).
//! Whether a connection expired is judged by its durations, so that a young clock keeps
//! nothing that ran out.
//!
//! Nothing saved is an index into the producer's tables. Whatever depends on the tables
//! is resolved against the new pipeline's when restored, and what no longer resolves is
//! dropped as a table swap drops it (`pipeline/swap.rs`), and counted in [`Restored`]:
//! connections to a Service endpoint that is gone (UDP: no longer serving), plain UDP
//! flows to what is now a Service frontend, connections the new policy denies (with
//! `policy.reevaluate` on), affinity records of Service ports that are gone, neighbours
//! of ports that are gone (a port that moved keeps its neighbours: they follow its
//! name). What does not fit the new pipeline's limits is dropped and counted too.
//!
//! A restore is all or nothing: it refuses a pipeline that already holds state and a
//! state with an impossible record before changing anything, and a state in which two
//! connections share a tuple is undone whole. The agent logs the error and starts cold
//! (empty tables, TCP connections picked up mid-stream).
//!
//! The connections are a flat list, in no order of any table or shard, so that a
//! restore can hand each to the worker that owns it (issue 27).
//!
//! # Pre-copy
//!
//! Saving, encoding, decoding and restoring a full table takes about 0.2 s, too long to
//! hold forwarding for. So a handover moves most of the state while the old agent still
//! forwards, and pauses only for what changed meanwhile:
//!
//! 1. [`Pipeline::track_changes`]: from now on the connection table records which of
//!    its slots are written to (a connection's packet, its creation, a stage setting its
//!    mark) and the original tuple of every connection removed. Nothing else changes
//!    on the packet path.
//! 2. [`Pipeline::save_base_into`], a part of the table at a time, the worker forwarding
//!    between the parts: the base, the connections not written to since step 1, all as
//!    of step 1 (none of them had a packet since). Restored into the new pipeline with
//!    [`Pipeline::restore_state_with`], aged by the time since step 1, while the old one
//!    forwards.
//! 3. [`Pipeline::save_changes`], forwarding paused: the connections written to since
//!    step 1 (live ones as records, those already due by tuple), those removed since (by
//!    tuple, section `GONE`), and the rest of the state whole (affinity, neighbours,
//!    datagrams). Step 1's recording ends. [`Pipeline::apply_changes`] removes from the
//!    new pipeline every connection removed and the base's copy of every one changed,
//!    then restores the changed ones and the rest: the new pipeline then holds what a
//!    whole save at step 3 would have given it.
//!
//! The pause is the changes' save, encoding, sending, decoding and applying: about
//! 0.8 µs a changed connection (`docs/benchmarks.md`), so it grows with the connections
//! that had packets during the pre-copy, not with the table. A table in which more
//! connections were removed during the pre-copy than it holds gives up recording the
//! removals, and step 3 saves the whole state instead, which replaces the base.
//!
//! # Stale states (a checkpoint restored after a crash)
//!
//! An agent that is killed hands nothing over, so the agent writes a checkpoint of its
//! state (this format) every second, and the next agent restores the latest with
//! [`Pipeline::restore_state_with`] and [`RestoreOptions::checkpoint`]`(age_ns)`, the
//! wall-clock time since its save. Its connections went on meanwhile without either
//! agent, so the restore changes what time and their packets made untrue:
//!
//! - **Times** are aged by `age_ns` (connections, neighbours, affinity records):
//!   a connection idle for longer than its timeout, an affinity record whose time ran
//!   out, are dropped and counted as expired (`ct_expired`, `affinity_expired`). The
//!   restarted agent's clock is young, so most aged times fall before its start and are
//!   taken as its start, as above; expiry is judged by the durations all the same.
//! - **TCP windows** are forgotten: both sides sent and acknowledged more since the
//!   save (a download through a cluster IP moves megabytes a second), and their next
//!   segments, out of the saved windows, would be INVALID and dropped, and so would
//!   every retransmission of them, until the connection dies. Each
//!   connection starts as one picked up mid-stream does (`conntrack/tcp.rs`): each
//!   side's window is learnt from its next segment, and segments pass without window
//!   checks for the connection's lifetime. Its state, both tuples and so its NAT both
//!   ways, mark, labels, tunnel peer, counts, the window scales its SYNs agreed and its
//!   flags of unacknowledged data stay.
//! - **Datagrams in reassembly** are dropped (`frag_stale`): their other fragments came
//!   meanwhile to an agent that was gone.
//! - **Neighbours** stay, their times aged: one not confirmed for long is probed as
//!   usual. The overlay's outer identification is the saved one (the lost agent's next
//!   ones are not known).
//!
//! What the new tables do not resolve is dropped as in a handover. [`RestoreOptions`]
//! can also age a state without making it stale (`stale: false`): times aged, datagrams
//! kept with what is left of their time (`frag_expired` when none), windows as saved.
//! A checkpoint holds the worker for [`Pipeline::save_state`] (the encoding can be
//! done elsewhere); [`Pipeline::save_state_into`] saves into the last checkpoint's
//! state, given back once encoded, sparing the allocation and first touch of its pages
//! (half the save of a full table; figures in `docs/benchmarks.md`).
//!
//! # Bytes
//!
//! ```text
//! header   magic "FERRYHOS" (8 bytes), format version (u16 LE),
//!          producer: ferry's version (u8 length, UTF-8)
//! section  tag (4 ASCII bytes), payload length (u32 LE), payload
//! ...
//! end      tag "END.", length 0: what comes before it is whole
//! ```
//!
//! A payload is one postcard value (postcard 1's wire format, which its authors keep
//! stable) of the section's records ([`Meta`], a sequence of [`Connection`]s, ...): plain
//! serde structs of addresses, ports, state names, counts and durations, never a
//! table's memory layout. Each version has a fixed set of sections, written in one
//! order and all required.
//!
//! # Versions
//!
//! - Version 1: `META`, `CONN`, `AFFN`.
//! - Version 2: version 1's, and `NEIG`, `FRAG`. A version 1 state reads with no
//!   neighbours and no fragments.
//! - Version 3: version 2's, and `GONE`: whether the state is whole or a pre-copy's
//!   changes, and then the connections removed since its base. An older state reads as
//!   a whole one.
//!
//! The rules:
//!
//! - A format version's bytes never change: a new section, a field added, removed or
//!   changed in meaning, an enum variant added, all make a new version. The fixtures
//!   `tests/data/handover-v*.bin` hold each version's bytes and their tests fail when a
//!   version's reading changes.
//! - A build writes the newest version it knows ([`FORMAT`]) and reads every version
//!   from [`OLDEST_FORMAT`] on: an older state is read into the current [`SavedState`],
//!   what its version lacks left empty (so a newer agent takes over from the previous
//!   one). When a record changes, the old version's struct stays as it was, next to a
//!   conversion to the current one.
//! - A newer version is refused ([`StateError::NewerVersion`], naming both numbers):
//!   what an older build would skip is not known to be safe to skip. So going back to
//!   an older agent starts cold.
//! - The producer string is for the log line only.
//!
//! [`Pipeline::save_state`]: crate::Pipeline::save_state
//! [`Pipeline::save_state_into`]: crate::Pipeline::save_state_into
//! [`Pipeline::restore_state`]: crate::Pipeline::restore_state
//! [`Pipeline::restore_state_with`]: crate::Pipeline::restore_state_with
//! [`Pipeline::track_changes`]: crate::Pipeline::track_changes
//! [`Pipeline::save_base_into`]: crate::Pipeline::save_base_into
//! [`Pipeline::save_changes`]: crate::Pipeline::save_changes
//! [`Pipeline::apply_changes`]: crate::Pipeline::apply_changes

mod check;
mod format;
mod records;

#[cfg(test)]
mod tests;

use std::fmt;

pub(crate) use format::check_state;
pub use format::{FORMAT, MAGIC, OLDEST_FORMAT, Part, StateError, Tag, decode, encode};
pub use records::{
    Affinity, Connection, Datagram, FirstHeaders, Fragment, Meta, NeighState, Neighbour, Removed,
    Sctp, SctpState, Tcp, TcpSide, TcpState, Tracking, Tuple,
};

/// The ferry version that writes a state, as its header says.
pub const PRODUCER: &str = env!("CARGO_PKG_VERSION");

/// A pipeline's handed-over state, as saved or as read from any format version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedState {
    /// The format version it was read from ([`FORMAT`] when saved here); [`encode`]
    /// writes the current one whatever this says.
    pub format: u16,
    /// The ferry version that wrote it.
    pub producer: String,
    /// What the producing pipeline says of itself.
    pub meta: Meta,
    /// Tracked connections, in no particular order.
    pub connections: Vec<Connection>,
    /// Session affinity records.
    pub affinity: Vec<Affinity>,
    /// Neighbours (none in a version 1 state).
    pub neighbours: Vec<Neighbour>,
    /// Datagrams in reassembly, oldest first (none in a version 1 state).
    pub datagrams: Vec<Datagram>,
    /// None for a whole state. Some for the changes since a pre-copy's base
    /// ([`Pipeline::save_changes`]): the connections removed since, while `connections`
    /// holds only those changed or made since (always None before version 3).
    ///
    /// [`Pipeline::save_changes`]: crate::Pipeline::save_changes
    pub removed: Option<Vec<Removed>>,
}

impl Default for SavedState {
    fn default() -> Self {
        SavedState {
            format: FORMAT,
            producer: PRODUCER.to_string(),
            meta: Meta::default(),
            connections: Vec::new(),
            affinity: Vec::new(),
            neighbours: Vec::new(),
            datagrams: Vec::new(),
            removed: None,
        }
    }
}

/// How a restore takes a state: as it was saved (a handover, [`RestoreOptions::default`])
/// or as a checkpoint saved a while ago ([`RestoreOptions::checkpoint`]; see the module
/// documentation, "Stale states").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreOptions {
    /// The connections went on without this pipeline since the save (a checkpoint
    /// restored after a crash): TCP windows are learnt again as on a connection picked
    /// up mid-stream, and datagrams in reassembly are dropped.
    pub stale: bool,
    /// Time between the save and the restore, in nanoseconds (wall-clock, as the agent
    /// measures it: the pipelines' clocks are their agents'): every record's times are
    /// aged by it, and what ran out of time meanwhile is dropped as expired.
    pub age_ns: u64,
}

impl RestoreOptions {
    /// A checkpoint saved `age_ns` ago: stale, and aged by that much.
    pub fn checkpoint(age_ns: u64) -> Self {
        RestoreOptions {
            stale: true,
            age_ns,
        }
    }
}

/// Records left out of a restore, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Connections whose timeout passed by the time of the restore.
    pub ct_expired: usize,
    /// Service connections whose endpoint the new tables do not have (a UDP one: not
    /// serving), as a table swap deletes them.
    pub ct_endpoint_gone: usize,
    /// Plain UDP flows whose destination is a Service frontend of the new tables, as a
    /// table swap deletes them (their next packet is load balanced).
    pub ct_now_frontend: usize,
    /// Connections the new tables' policy denies (with `policy.reevaluate` on).
    pub ct_policy_denied: usize,
    /// Connections over the new table's `ct.max_entries`.
    pub ct_table_full: usize,
    /// Affinity records whose time ran out by the restore (aged by
    /// [`RestoreOptions::age_ns`]).
    pub affinity_expired: usize,
    /// Affinity records of Service ports the new tables do not have.
    pub affinity_service_gone: usize,
    /// Affinity records over the table's bound.
    pub affinity_table_full: usize,
    /// Neighbours of ports the new tables do not have.
    pub neigh_port_gone: usize,
    /// Neighbours over the table's bound.
    pub neigh_table_full: usize,
    /// Datagrams over the reassembler's limits.
    pub frag_table_full: usize,
    /// Datagrams whose time ran out by the restore (aged by [`RestoreOptions::age_ns`]).
    pub frag_expired: usize,
    /// Datagrams of a stale state ([`RestoreOptions::stale`]): their other fragments
    /// came meanwhile to no one.
    pub frag_stale: usize,
}

impl Dropped {
    /// Every record dropped.
    pub fn total(&self) -> usize {
        self.ct_expired
            + self.ct_endpoint_gone
            + self.ct_now_frontend
            + self.ct_policy_denied
            + self.ct_table_full
            + self.affinity_expired
            + self.affinity_service_gone
            + self.affinity_table_full
            + self.neigh_port_gone
            + self.neigh_table_full
            + self.frag_table_full
            + self.frag_expired
            + self.frag_stale
    }
}

/// What a restore loaded and what it left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Connections tracked again.
    pub connections: usize,
    /// Affinity records held again.
    pub affinity: usize,
    /// Neighbours known again.
    pub neighbours: usize,
    /// Datagrams in reassembly again.
    pub datagrams: usize,
    /// What was left out, and why.
    pub dropped: Dropped,
}

/// One line for the agent's log.
impl fmt::Display for Restored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.dropped;
        write!(
            f,
            "restored {} connections, {} affinity records, {} neighbours, {} datagrams in \
             reassembly; dropped {}",
            self.connections,
            self.affinity,
            self.neighbours,
            self.datagrams,
            d.total()
        )?;
        let reasons = [
            ("connections expired", d.ct_expired),
            ("connections to an endpoint gone", d.ct_endpoint_gone),
            ("UDP flows to a new frontend", d.ct_now_frontend),
            ("connections denied by policy", d.ct_policy_denied),
            ("connections over the table's size", d.ct_table_full),
            ("affinity records expired", d.affinity_expired),
            (
                "affinity records of a Service gone",
                d.affinity_service_gone,
            ),
            (
                "affinity records over the table's size",
                d.affinity_table_full,
            ),
            ("neighbours of a port gone", d.neigh_port_gone),
            ("neighbours over the table's size", d.neigh_table_full),
            ("datagrams over the reassembler's limits", d.frag_table_full),
            ("datagrams expired", d.frag_expired),
            ("datagrams of a stale state", d.frag_stale),
        ];
        let mut first = true;
        for (what, n) in reasons.into_iter().filter(|(_, n)| *n > 0) {
            f.write_str(if first { " (" } else { ", " })?;
            write!(f, "{n} {what}")?;
            first = false;
        }
        if !first {
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// Why a restore changed nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreError {
    /// The pipeline already holds state: a restore only fills a new one.
    NotEmpty {
        /// Connections it tracks.
        connections: usize,
        /// Affinity records it holds.
        affinity: usize,
        /// Neighbours it knows.
        neighbours: usize,
        /// Datagrams it is reassembling.
        datagrams: usize,
    },
    /// The state is another node's.
    OtherNode {
        /// The node that saved it.
        saved: String,
        /// This pipeline's node.
        here: String,
    },
    /// A record no pipeline could have saved.
    Invalid(StateError),
    /// Two connections share a tuple; record `index` is the second.
    SharedTuple {
        /// Its index among the connections.
        index: usize,
    },
    /// The state holds only the changes since a pre-copy's base, and is no state on its
    /// own ([`crate::Pipeline::apply_changes`] applies it over its base).
    OnlyChanges,
}

impl fmt::Display for RestoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RestoreError::NotEmpty {
                connections,
                affinity,
                neighbours,
                datagrams,
            } => write!(
                f,
                "handover state not restored: the pipeline already holds state \
                 ({connections} connections, {affinity} affinity records, {neighbours} \
                 neighbours, {datagrams} datagrams in reassembly)"
            ),
            RestoreError::OtherNode { saved, here } => write!(
                f,
                "handover state not restored: it is node {saved:?}'s, this is {here:?}"
            ),
            RestoreError::Invalid(e) => write!(f, "handover state not restored: {e}"),
            RestoreError::SharedTuple { index } => write!(
                f,
                "handover state not restored: connection {index} has a tuple of an \
                 earlier one"
            ),
            RestoreError::OnlyChanges => f.write_str(
                "handover state not restored: it holds only the changes since a \
                 pre-copy's base",
            ),
        }
    }
}

impl std::error::Error for RestoreError {}
