//! IP fragment handling: reassembly before connection tracking, refragmentation on output.
//!
//! Conntrack, NAT and the service load balancer need the transport ports, which only the
//! first fragment of a datagram carries. So fragments are held per datagram, keyed by
//! (zone, source, destination, identification, and protocol for IPv4), until the
//! datagram is whole;
//! the whole datagram is then re-parsed so that its flow key is the real one whichever
//! fragment happened to arrive last. On output, [`refragment`] cuts such a datagram back
//! to the largest fragment size that was received (the MRU) or the egress MTU.
//!
//! The policy follows the fragment semantics Open vSwitch documents for `ct`, tightened:
//! any overlap fails the whole datagram (RFC 5722, applied to IPv4 as well), tiny and
//! malformed fragments are refused (RFC 1858, RFC 3128, RFC 7112), and the table is
//! bounded in datagrams, datagrams per source, fragment bytes and fragments per
//! datagram, with a constant timeout, so that expiry is a FIFO.
//!
//! Each datagram has one buffer laid out as the frame it will become, with its data at
//! its final offset, so completing it takes no copy. [`Config::max_bytes`] counts the
//! fragments held, not the buffers (a tiny fragment at offset 64000 has a 64 KiB
//! buffer): the buffers are bounded by [`Config::max_datagrams`], and one source's by
//! [`Config::max_datagrams_per_source`].
//!
//! Everything here is pure: time comes from `pkt.meta.time_ns` and the `now_ns` argument
//! of [`Reassembler::expire`].

mod ranges;
mod reassembly;
mod refragment;
mod spec;
#[cfg(test)]
mod tests;

pub use reassembly::Reassembler;
pub use refragment::refragment;
pub use spec::{IpfSpec, MIN_FRAGMENT};

use crate::drop::DropReason;
use crate::packet::Packet;
use crate::wire::Parsed;

/// Limits of the reassembler, with their defaults in one place.
#[derive(Clone, Debug)]
pub struct Config {
    /// How long an incomplete datagram is kept, from its first fragment. Default 30 s,
    /// Linux's `ipfrag_time`.
    pub timeout_ns: u64,
    /// Datagrams in flight (failed-datagram markers included). Default 1000.
    pub max_datagrams: usize,
    /// Datagrams in flight from one source (zone and source address, markers included),
    /// so that one sender cannot take the whole table: a new datagram past it is refused
    /// (`frag_source_limit`). Default 100, a tenth of the default table.
    pub max_datagrams_per_source: usize,
    /// Bytes of fragments held: the whole IP length of every fragment taken into an
    /// incomplete datagram, as Linux counts the fragments it queues. A fragment that would
    /// go over it is refused, unless it completes its datagram. Default 4 MiB, Linux's
    /// `ipfrag_high_thresh`. The buffers behind them are bounded by the datagram limits
    /// (see the module documentation).
    pub max_bytes: usize,
    /// Smallest non-final IPv4 fragment, as a whole IP packet length. Default 400, which
    /// no sane path MTU goes below and which bounds the fragments per datagram.
    pub min_fragment_v4: u16,
    /// Smallest non-final IPv6 fragment, as a whole IP packet length. Default 1280, the
    /// IPv6 minimum link MTU (RFC 8200 section 5).
    pub min_fragment_v6: u16,
}

impl Config {
    /// Default for [`Config::timeout_ns`].
    pub const DEFAULT_TIMEOUT_NS: u64 = 30_000_000_000;
    /// Default for [`Config::max_datagrams`].
    pub const DEFAULT_MAX_DATAGRAMS: usize = 1000;
    /// Default for [`Config::max_datagrams_per_source`].
    pub const DEFAULT_MAX_DATAGRAMS_PER_SOURCE: usize = 100;
    /// Default for [`Config::max_bytes`].
    pub const DEFAULT_MAX_BYTES: usize = 4 * 1024 * 1024;
    /// Default for [`Config::min_fragment_v4`].
    pub const DEFAULT_MIN_FRAGMENT_V4: u16 = 400;
    /// Default for [`Config::min_fragment_v6`].
    pub const DEFAULT_MIN_FRAGMENT_V6: u16 = 1280;
    /// Fragments held per datagram, fixed. Finding where a fragment fits is linear in the
    /// fragments held, so without a bound a datagram cut into thousands of 8-byte pieces
    /// would cost quadratic work. 128 covers a 64 KiB datagram over a 576-byte MTU (119
    /// fragments); the fragment past it fails the datagram (`frag_too_many`).
    pub const MAX_FRAGMENTS_PER_DATAGRAM: usize = 128;
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout_ns: Config::DEFAULT_TIMEOUT_NS,
            max_datagrams: Config::DEFAULT_MAX_DATAGRAMS,
            max_datagrams_per_source: Config::DEFAULT_MAX_DATAGRAMS_PER_SOURCE,
            max_bytes: Config::DEFAULT_MAX_BYTES,
            min_fragment_v4: Config::DEFAULT_MIN_FRAGMENT_V4,
            min_fragment_v6: Config::DEFAULT_MIN_FRAGMENT_V6,
        }
    }
}

/// What became of a fragment given to [`Reassembler::process`].
#[derive(Debug)]
pub enum Outcome {
    /// The fragment is kept until its datagram completes (or, for an exact duplicate of a
    /// fragment already held, absorbed without error).
    Held,
    /// This fragment completed a datagram: the whole datagram as one frame, and its re-parse.
    Complete(Packet, Parsed),
    /// This fragment was refused or its datagram failed. The caller counts this fragment;
    /// held fragments discarded with it were already counted by the reassembler.
    Dropped(DropReason),
}

/// Fragment counters for one address family, in the spirit of OVS `ipf`: one counter for
/// every way a fragment can end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FamilyStats {
    /// Fragments taken into a datagram (exact duplicates not included).
    pub accepted: u64,
    /// Datagrams completed and delivered.
    pub completed: u64,
    /// Held fragments discarded because their datagram timed out.
    pub expired: u64,
    /// Non-final fragments refused for being below the configured minimum.
    pub too_small: u64,
    /// Fragments refused or discarded because of an overlap (the offending one and every
    /// one held for that datagram).
    pub overlapped: u64,
    /// Exact duplicates absorbed.
    pub duplicates: u64,
    /// Fragments refused because the table was full (datagrams or bytes) or their source
    /// had its most datagrams in flight.
    pub table_full: u64,
    /// Fragments refused or discarded because their datagram had more than
    /// [`Config::MAX_FRAGMENTS_PER_DATAGRAM`] fragments (the offending one and every one
    /// held for that datagram).
    pub too_many: u64,
    /// Fragments refused or discarded for any other reason.
    pub invalid: u64,
}

/// Reassembler counters, per family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// IPv4 fragments.
    pub v4: FamilyStats,
    /// IPv6 fragments.
    pub v6: FamilyStats,
}
