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
//! [`Pipeline::restore_state`]: crate::Pipeline::restore_state

mod check;
mod format;
mod records;

#[cfg(test)]
mod tests;

use std::fmt;

pub(crate) use format::check_state;
pub use format::{FORMAT, MAGIC, OLDEST_FORMAT, Part, StateError, Tag, decode, encode};
pub use records::{
    Affinity, Connection, Datagram, FirstHeaders, Fragment, Meta, NeighState, Neighbour, Tcp,
    TcpSide, TcpState, Tracking, Tuple,
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
}

impl Dropped {
    /// Every record dropped.
    pub fn total(&self) -> usize {
        self.ct_expired
            + self.ct_endpoint_gone
            + self.ct_now_frontend
            + self.ct_policy_denied
            + self.ct_table_full
            + self.affinity_service_gone
            + self.affinity_table_full
            + self.neigh_port_gone
            + self.neigh_table_full
            + self.frag_table_full
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
        }
    }
}

impl std::error::Error for RestoreError {}
