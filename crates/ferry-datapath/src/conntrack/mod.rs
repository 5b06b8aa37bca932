//! Connection tracking with zones and NAT.
//!
//! Every IP datagram (whole: ipf reassembles fragments first) goes through
//! [`Conntrack::process`], which finds its connection from either direction, advances the
//! protocol state (TCP state machine with sequence windows, UDP unreplied / replied /
//! assured, ICMP echo by identifier), and says whether the packet is NEW, ESTABLISHED,
//! RELATED (an ICMP error about a tracked connection) or INVALID. A NEW packet carries a
//! [`Pending`] connection that later stages may refuse (policy); [`Conntrack::commit`]
//! inserts it.
//!
//! The table is bounded ([`Config::max_entries`]): when full, the oldest entry that never
//! saw a reply is evicted, else the new connection is refused. Entries expire through a
//! timing wheel ([`Conntrack::expire`] does bounded work per call), with per-state
//! timeouts close to Linux's ([`Timeouts`]).
//!
//! NAT is decided once, when a connection is created ([`Nat`]): the reply tuple is the
//! reverse of the translated original tuple, unique in the table (another source port is
//! picked when needed, also for a connection without SNAT, as Linux's null binding).
//! Every packet of the connection is then translated, the original direction to the
//! translated tuple and the reply direction back; ICMP errors about it are translated
//! outside and in the quoted packet.
//!
//! Memory: a full table of the default [`Config::max_entries`] takes about 199 bytes per
//! connection (a 176-byte entry with its list links, 22.9 bytes of index), plus a fixed
//! 16 KiB expiry wheel; IPv6 connections with more than three distinct addresses take 48
//! bytes more. [`Conntrack::memory_bytes`] reports it; `table` explains the layout. The
//! last SYN ignored on a TCP connection, which Linux keeps in the connection, is kept
//! outside the entries, in a fixed 6 KiB table allocated when a SYN is first ignored
//! (`resync`).
//!
//! Everything here is pure: time comes in as `now_ns`.

mod dump;
mod entry;
mod expiry;
mod icmp;
mod index;
#[cfg(test)]
mod nat_tests;
#[cfg(test)]
mod proptests;
mod resync;
pub(crate) mod saved;
mod sctp;
mod spec;
mod table;
mod tcp;
#[cfg(test)]
mod tests;

pub use crate::nat::Nat;
pub use crate::nat::{SNAT_PORTS, SNAT_PRIVILEGED_PORTS};
pub use dump::Filter;
pub use entry::{Entry, Line, ORIGINAL, ProtoState, REPLY, Status};
pub(crate) use icmp::reverse;
pub use sctp::{SctpConn, SctpState};
pub use spec::CtSpec;
pub use tcp::{TcpConn, TcpState};

use self::icmp::Kind;
use self::resync::Resync;
use self::sctp::Verdict as SctpVerdict;
use self::table::Table;
use self::tcp::{Segment, Verdict};
use crate::drop::DropReason;
use crate::flow::{FlowKey, proto};
use crate::nat::ports as nat;
use crate::packet::Packet;
use crate::wire::Parsed;
use crate::wire::icmp_error;
use crate::wire::rewrite::{rewrite, rewrite_icmp_error};

/// Identifies an entry until it is removed (expired, deleted, evicted or replaced by a
/// reopened TCP connection); ids of removed entries are reused.
pub type EntryId = u32;

const SEC: u64 = 1_000_000_000;

/// A UDP connection seen both ways is a stream (assured, [`Timeouts::udp_assured_ns`])
/// once a packet comes more than this long after its first: 2 s, as Linux's
/// `stream_ts`. Before that it is taken for a request and its answers (a DNS lookup).
pub const UDP_STREAM_NS: u64 = 2 * SEC;

/// How long an entry lives after the last packet that refreshed it, per protocol state.
/// Defaults follow Linux's `nf_conntrack_*_timeout*` sysctls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP SYN_SENT: 120 s (Linux `tcp_timeout_syn_sent`).
    pub tcp_syn_sent_ns: u64,
    /// TCP SYN_RECV: 60 s (`tcp_timeout_syn_recv`).
    pub tcp_syn_recv_ns: u64,
    /// TCP ESTABLISHED: 5 days (`tcp_timeout_established`).
    pub tcp_established_ns: u64,
    /// TCP FIN_WAIT: 120 s (`tcp_timeout_fin_wait`).
    pub tcp_fin_wait_ns: u64,
    /// TCP CLOSE_WAIT: 60 s (`tcp_timeout_close_wait`).
    pub tcp_close_wait_ns: u64,
    /// TCP LAST_ACK: 30 s (`tcp_timeout_last_ack`).
    pub tcp_last_ack_ns: u64,
    /// TCP TIME_WAIT: 120 s (`tcp_timeout_time_wait`).
    pub tcp_time_wait_ns: u64,
    /// TCP CLOSE: 10 s (`tcp_timeout_close`).
    pub tcp_close_ns: u64,
    /// Cap for a TCP connection not (yet) assured, e.g. picked up mid-stream and never
    /// answered: 300 s (Linux caps it with `tcp_timeout_unacknowledged`; a setting of
    /// its own here).
    pub tcp_unassured_ns: u64,
    /// Cap for a TCP connection while either side has data the other has not
    /// acknowledged (a peer that vanished with data in flight): 300 s
    /// (`tcp_timeout_unacknowledged`). Also how far ahead the expiry wheel files a TCP
    /// entry at most, so that an idle one is visited this often.
    pub tcp_unacknowledged_ns: u64,
    /// UDP, no reply seen: 30 s (`udp_timeout`).
    pub udp_unreplied_ns: u64,
    /// UDP, reply seen, not (yet) a stream (a DNS exchange): 30 s (`udp_timeout`).
    pub udp_replied_ns: u64,
    /// UDP seen both ways and active more than [`UDP_STREAM_NS`] after its first packet
    /// (a stream), then assured: 120 s (`udp_timeout_stream`).
    pub udp_assured_ns: u64,
    /// ICMP/ICMPv6 echo: 30 s (`icmp_timeout`, `icmpv6_timeout`).
    pub icmp_ns: u64,
    /// Any other protocol: 600 s (`generic_timeout`).
    pub other_ns: u64,
    /// SCTP COOKIE_WAIT and COOKIE_ECHOED: 3 s (`sctp_timeout_cookie_wait`,
    /// `sctp_timeout_cookie_echoed`).
    pub sctp_cookie_ns: u64,
    /// SCTP ESTABLISHED: 210 s (`sctp_timeout_established`; heartbeats every 30 s by
    /// default keep an idle association in it).
    pub sctp_established_ns: u64,
    /// SCTP SHUTDOWN_SENT and SHUTDOWN_ACK_SENT: 3 s (`sctp_timeout_shutdown_sent`,
    /// `sctp_timeout_shutdown_ack_sent`).
    pub sctp_shutdown_ns: u64,
    /// SCTP HEARTBEAT_SENT: 30 s (`sctp_timeout_heartbeat_sent`).
    pub sctp_heartbeat_ns: u64,
    /// SCTP CLOSED: 10 s (`sctp_timeout_closed`).
    pub sctp_closed_ns: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            tcp_syn_sent_ns: 120 * SEC,
            tcp_syn_recv_ns: 60 * SEC,
            tcp_established_ns: 5 * 24 * 3600 * SEC,
            tcp_fin_wait_ns: 120 * SEC,
            tcp_close_wait_ns: 60 * SEC,
            tcp_last_ack_ns: 30 * SEC,
            tcp_time_wait_ns: 120 * SEC,
            tcp_close_ns: 10 * SEC,
            tcp_unassured_ns: 300 * SEC,
            tcp_unacknowledged_ns: 300 * SEC,
            udp_unreplied_ns: 30 * SEC,
            udp_replied_ns: 30 * SEC,
            udp_assured_ns: 120 * SEC,
            icmp_ns: 30 * SEC,
            other_ns: 600 * SEC,
            sctp_cookie_ns: 3 * SEC,
            sctp_established_ns: 210 * SEC,
            sctp_shutdown_ns: 3 * SEC,
            sctp_heartbeat_ns: 30 * SEC,
            sctp_closed_ns: 10 * SEC,
        }
    }
}

impl Timeouts {
    /// The timeout of a TCP state.
    pub fn tcp(&self, s: TcpState) -> u64 {
        match s {
            TcpState::SynSent => self.tcp_syn_sent_ns,
            TcpState::SynRecv => self.tcp_syn_recv_ns,
            TcpState::Established => self.tcp_established_ns,
            TcpState::FinWait => self.tcp_fin_wait_ns,
            TcpState::CloseWait => self.tcp_close_wait_ns,
            TcpState::LastAck => self.tcp_last_ack_ns,
            TcpState::TimeWait => self.tcp_time_wait_ns,
            TcpState::Close => self.tcp_close_ns,
        }
    }

    /// The timeout of an SCTP state.
    pub fn sctp(&self, s: SctpState) -> u64 {
        match s {
            SctpState::CookieWait | SctpState::CookieEchoed => self.sctp_cookie_ns,
            SctpState::Established => self.sctp_established_ns,
            SctpState::ShutdownSent | SctpState::ShutdownAckSent => self.sctp_shutdown_ns,
            SctpState::HeartbeatSent => self.sctp_heartbeat_ns,
            SctpState::Closed => self.sctp_closed_ns,
        }
    }
}

/// Conntrack configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Most connections tracked. Default 262144 (Linux's `nf_conntrack_max` on a host with
    /// a few GiB of memory); at most 2^31.
    pub max_entries: usize,
    /// Timeouts per protocol state.
    pub timeouts: Timeouts,
    /// Pick up TCP connections mid-stream (a first packet that is not a SYN creates an
    /// ESTABLISHED entry whose windows are not enforced, for its lifetime), so connections
    /// survive a dataplane restart. Default on, like Linux's `tcp_loose`.
    pub tcp_pickup: bool,
}

impl Config {
    /// Default for [`Config::max_entries`].
    pub const DEFAULT_MAX_ENTRIES: usize = 262_144;
    /// Largest [`Config::max_entries`]; a larger value is taken as this.
    pub const MAX_ENTRIES: usize = table::MAX_ENTRIES;
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_entries: Config::DEFAULT_MAX_ENTRIES,
            timeouts: Timeouts::default(),
            tcp_pickup: true,
        }
    }
}

/// The state of a packet as conntrack sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CtState {
    /// The packet starts a connection (see [`CtResult::pending`]).
    New,
    /// The packet belongs to a tracked connection.
    Established,
    /// An ICMP error about a tracked connection.
    Related,
    /// Out of window, an unsolicited reply, an ICMP error about no known connection, a
    /// clash with another connection's tuple...: dropped by default.
    Invalid,
    /// Not subject to tracking: ICMP messages other than echo and errors (neighbour
    /// discovery, router advertisements, ...) and non-IP frames.
    Untracked,
}

impl CtState {
    /// Lower-case name, as verdict logs show it.
    pub fn name(self) -> &'static str {
        match self {
            CtState::New => "new",
            CtState::Established => "established",
            CtState::Related => "related",
            CtState::Invalid => "invalid",
            CtState::Untracked => "untracked",
        }
    }
}

/// A connection decided by [`Conntrack::process`] (NAT chosen, packet already
/// translated), inserted only by [`Conntrack::commit`].
#[derive(Clone, Debug)]
#[repr(C)]
pub struct Pending {
    /// The hashes of the entry's two tuples, computed by `process`, so that commit does
    /// not hash them again: valid in the table whose stamp is `stamp`.
    hashes: [u64; 2],
    stamp: std::sync::Weak<table::Stamp>,
    /// The table's count of insertions and removals when `process` found both tuples
    /// free: while it is unchanged they still are, and commit need not look them up again.
    changes: u64,
    entry: Entry,
}

/// Two pending connections are equal when they would insert equal entries (which table
/// hashed their tuples does not matter).
impl PartialEq for Pending {
    fn eq(&self, o: &Pending) -> bool {
        self.entry == o.entry
    }
}

impl Eq for Pending {}

impl Pending {
    /// The entry that commit will insert.
    pub fn entry(&self) -> &Entry {
        &self.entry
    }

    /// The entry, for stages that set its mark, labels or tunnel peer before commit.
    pub fn entry_mut(&mut self) -> &mut Entry {
        &mut self.entry
    }
}

/// What [`Conntrack::process`] says about a packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtResult {
    /// The packet's state.
    pub state: CtState,
    /// The packet goes in the reply direction of its connection.
    pub reply: bool,
    /// The connection, when tracked.
    pub entry: Option<EntryId>,
    /// For a NEW packet: the connection to commit.
    pub pending: Option<Pending>,
}

impl CtResult {
    fn plain(state: CtState) -> CtResult {
        CtResult {
            state,
            reply: false,
            entry: None,
            pending: None,
        }
    }
}

/// What the first half of tracking ([`Conntrack::begin`]) made of a packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begin {
    /// Decided: a packet of a tracked connection (translated), RELATED, INVALID or
    /// untracked.
    Tracked(CtResult),
    /// The packet can start a connection: its NAT is to be decided, then given to
    /// [`Conntrack::start`].
    Starts(Start),
}

/// A packet that can start a connection, between [`Conntrack::begin`] and
/// [`Conntrack::start`]: its protocol state and the hash of its key. The hash is the
/// table's, so it is handed to `start` of the tracker that gave it, with no other call
/// on that tracker in between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Start {
    state: ProtoState,
    hash: u64,
}

impl Start {
    /// The packet is a TCP segment other than a SYN, taken up mid-stream
    /// ([`Config::tcp_pickup`]): its connection began before this tracker saw it.
    pub fn mid_stream(&self) -> bool {
        matches!(&self.state, ProtoState::Tcp(c) if c.state == TcpState::Established)
    }
}

/// Conntrack counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets of tracked connections.
    pub found: u64,
    /// Packets that started a connection (pending).
    pub new: u64,
    /// Packets found INVALID.
    pub invalid: u64,
    /// Packets not tracked (see [`CtState::Untracked`]).
    pub untracked: u64,
    /// ICMP errors RELATED to a tracked connection.
    pub related: u64,
    /// Connections inserted by commit.
    pub inserted: u64,
    /// Connections refused because the table was full and nothing could be evicted.
    pub insert_failed: u64,
    /// New connections whose reply tuple was already taken and that have no source port
    /// to change (a protocol other than TCP, UDP and ICMP echo).
    pub clash: u64,
    /// Unreplied entries evicted to make room.
    pub evicted: u64,
    /// Entries removed because their timeout passed.
    pub expired: u64,
    /// Entries removed by [`Conntrack::delete`] or replaced by a reopened connection.
    pub deleted: u64,
    /// New connections refused because no NAT port was free (in the SNAT range, or for a
    /// connection without SNAT whose reply tuple was taken, in its port's class).
    pub nat_port_exhausted: u64,
}

/// The connection table and its trackers.
pub struct Conntrack {
    config: Config,
    table: Table,
    stats: Stats,
    /// The last SYN ignored on each TCP connection (see `resync`).
    resync: Resync,
}

impl Conntrack {
    /// An empty table.
    pub fn new(mut config: Config) -> Conntrack {
        config.max_entries = config.max_entries.min(table::MAX_ENTRIES);
        Conntrack {
            config,
            table: Table::new(config.max_entries),
            stats: Stats::default(),
            resync: Resync::default(),
        }
    }

    /// Allocates the whole table for [`Config::max_entries`] now, so that no packet ever
    /// waits for it to grow: the worker does this for its live table. The allocator hands
    /// the memory out untouched, so it is taken page by page as connections use it; until
    /// then [`Conntrack::memory_bytes`] counts it anyway (it is allocated).
    pub fn preallocate(&mut self) {
        self.table.preallocate();
    }

    /// The table's big allocations (slab and index) as addresses and lengths in bytes, for
    /// the caller to ask the kernel for huge pages over them after
    /// [`Conntrack::preallocate`] (fewer TLB misses in a large table). Valid until the
    /// table grows, which a preallocated table never does.
    pub fn memory_regions(&self) -> impl Iterator<Item = (*const u8, usize)> + use<> {
        self.table.regions().into_iter()
    }

    /// Loads the index and entry memory that tracking packets with these keys will read,
    /// and changes nothing. For a batch: prefetching every packet's key before processing
    /// the first lets their cache and TLB misses overlap instead of coming one after the
    /// other. Costs a hash and a few reads per key.
    pub fn prefetch<'a>(&self, keys: impl IntoIterator<Item = &'a FlowKey>) {
        self.table.prefetch(keys);
    }

    /// Prefetches a batch of packets, as [`Conntrack::prefetch`], and keeps each key's
    /// hash (the first 64 keys), replacing those of the batch before: when the packets are
    /// then processed in the same order ([`Conntrack::process`],
    /// [`Conntrack::begin`]), each finds its hash ready instead of hashing its key
    /// again. Only a hint: a packet whose key is not the next one kept (or one of the three
    /// after it, as when a packet of the batch was dropped before conntrack) hashes its
    /// key as usual, and results are the same as without the call.
    ///
    /// For a worker's receive batch: the keys of the packets as conntrack will see them
    /// (after decapsulation and reassembly; a key that differs only costs its prefetch).
    pub fn prefetch_batch<'a>(&mut self, keys: impl IntoIterator<Item = &'a FlowKey>) {
        self.table.prefetch_batch(keys);
    }

    /// Gives [`Conntrack::prefetch`] and [`Conntrack::prefetch_batch`] the processor's
    /// prefetch instruction (`ferry_linux::prefetch`; this crate has no unsafe code to
    /// issue it itself), to use instead of plain reads: a prefetch does not hold up the
    /// instructions after it until its line arrives, so the cache misses of a whole batch
    /// overlap with each other and with the work on the packets. `None` goes back to
    /// plain reads.
    pub fn set_prefetch(&mut self, prefetch: Option<fn(&[*const u8])>) {
        self.table.set_prefetch(prefetch);
    }

    /// Forgets the hashes kept by [`Conntrack::prefetch_batch`] (not needed for
    /// correctness: a stale hash is never used for another key).
    pub fn end_batch(&mut self) {
        self.table.clear_hints();
    }

    /// Tracks one packet: a whole datagram (never a fragment), with `nat` applied if it
    /// starts a connection ([`Conntrack::begin`] and [`Conntrack::start`] in one). See
    /// the module documentation.
    #[inline]
    pub fn process(
        &mut self,
        pkt: &mut Packet,
        parsed: &mut Parsed,
        nat: Option<&Nat>,
        now_ns: u64,
    ) -> Result<CtResult, DropReason> {
        match self.begin(pkt, parsed, now_ns)? {
            Begin::Tracked(r) => Ok(r),
            Begin::Starts(s) => self.start(s, pkt, parsed, nat, now_ns),
        }
    }

    /// The first half of tracking a packet: it belongs to a tracked connection (or is
    /// RELATED, INVALID or untracked), and is translated as its connection says; or it
    /// can start a connection, whose NAT the caller then decides (a Service's endpoint
    /// choice, a static rule) and hands to [`Conntrack::start`]. A packet that cannot
    /// start one (a TCP RST or SYN-ACK of no connection, an echo reply) is INVALID here,
    /// so that no Service endpoint is ever chosen for it.
    ///
    /// Callers read the result where it was returned, by reference: moved out, it would
    /// be copied whole (its pending connection's room included), in moves that wait for
    /// this function's narrower stores to reach the cache.
    #[inline]
    pub fn begin(
        &mut self,
        pkt: &mut Packet,
        parsed: &mut Parsed,
        now_ns: u64,
    ) -> Result<Begin, DropReason> {
        if !parsed.is_ip() {
            self.stats.untracked += 1;
            return Ok(Begin::Tracked(CtResult::plain(CtState::Untracked)));
        }
        if parsed.frag.is_some() || !parsed.l4_complete || parsed.ip_end > pkt.data.len() {
            self.stats.invalid += 1;
            return Ok(Begin::Tracked(CtResult::plain(CtState::Invalid)));
        }
        let key = &parsed.key;
        if matches!(key.proto, proto::ICMP | proto::ICMPV6) {
            match icmp::kind(key.proto, (key.dst_port >> 8) as u8) {
                Kind::Untracked => {
                    self.stats.untracked += 1;
                    return Ok(Begin::Tracked(CtResult::plain(CtState::Untracked)));
                }
                Kind::Error => return self.related(pkt, parsed, now_ns).map(Begin::Tracked),
                Kind::Request | Kind::Reply => {}
            }
        }
        let (hash, first) = self.table.hash_of_next(key);
        if let Some((id, dir)) = self.table.lookup_first(key, hash, first) {
            let deadline_ns = self
                .table
                .get(id)
                .map_or(0, |e| e.deadline_ns(&self.config.timeouts));
            if deadline_ns > now_ns {
                return self.update(id, dir, deadline_ns, hash, pkt, parsed, now_ns);
            }
            // Expired but not yet reaped: gone for this packet.
            self.table.remove(id);
            self.stats.expired += 1;
        }
        Ok(self.starts(pkt, parsed, hash))
    }

    /// The second half of tracking a packet that can start a connection
    /// ([`Begin::Starts`]): decides the connection with `nat` (a free reply tuple, a
    /// NAT port) and translates the packet; the connection is inserted only by
    /// [`Conntrack::commit`]. `parsed` must be the packet's as `begin` left it.
    #[inline]
    pub fn start(
        &mut self,
        start: Start,
        pkt: &mut Packet,
        parsed: &mut Parsed,
        nat: Option<&Nat>,
        now_ns: u64,
    ) -> Result<CtResult, DropReason> {
        self.create(pkt, parsed, start.state, nat, start.hash, now_ns)
    }

    /// Whether a packet of no tracked connection can start one ([`Begin::Starts`]), or
    /// is INVALID. `hash` is the hash of its key.
    fn starts(&mut self, pkt: &Packet, parsed: &Parsed, hash: u64) -> Begin {
        match self.first_state(pkt, parsed) {
            Some(state) => Begin::Starts(Start { state, hash }),
            None => Begin::Tracked(self.invalid()),
        }
    }

    /// A packet of a tracked connection, whose deadline is `before_ns`; `hash` is the
    /// hash of the packet's key.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn update(
        &mut self,
        id: EntryId,
        dir: usize,
        before_ns: u64,
        hash: u64,
        pkt: &mut Packet,
        parsed: &mut Parsed,
        now_ns: u64,
    ) -> Result<Begin, DropReason> {
        let reply = dir == REPLY;
        let invalid = CtResult {
            state: CtState::Invalid,
            reply,
            entry: Some(id),
            pending: None,
        };
        let Some(e) = self.table.get_mut(id) else {
            self.stats.invalid += 1;
            return Ok(Begin::Tracked(CtResult::plain(CtState::Invalid)));
        };
        let mut refresh = true;
        let tcp = matches!(e.proto_state, ProtoState::Tcp(_));
        if let ProtoState::Tcp(c) = &mut e.proto_state {
            let Some(seg) = Segment::read(pkt, parsed) else {
                self.stats.invalid += 1;
                return Ok(Begin::Tracked(invalid));
            };
            match c.packet(dir, &seg) {
                // An RST off the exact sequence number keeps the connection as it was,
                // its timeout cut to CLOSE's (`Entry::timeout_ns`).
                Verdict::Accept | Verdict::ResetKept => {}
                // The SYN-ACK answering a SYN ignored before: the connection restarted
                // from that SYN, and this packet is tracked as accepted.
                Verdict::Ignore if self.resync.resynced(id, e.first_seen_ns, c, dir, &seg) => {}
                Verdict::Ignore => {
                    // Let through and nothing more: no state, no refresh, not counted
                    // (as in Linux), and no status bit, so that an ignored SYN-ACK does
                    // not make a stale entry replied, hence unevictable, nor assured
                    // (Linux marks it replied, never assured).
                    let to = e.status.nat().then(|| reverse(&e.tuple(1 - dir)));
                    self.stats.found += 1;
                    if let Some(to) = to {
                        translate(pkt, parsed, &to)?;
                    }
                    return Ok(Begin::Tracked(CtResult {
                        state: CtState::Established,
                        reply,
                        entry: Some(id),
                        pending: None,
                    }));
                }
                // Not before a reply (as Linux): a client or NAT reusing the port would
                // keep the entry, and its NAT, alive for ever.
                Verdict::SynAgain => refresh = e.status.has(Status::SEEN_REPLY),
                Verdict::Reset if !e.status.has(Status::SEEN_REPLY) => {
                    // Nobody answered but with an RST (or the originator gave up): Linux
                    // removes the connection at once. The entry stays for the stages
                    // after conntrack to read for this packet (its tunnel peer routes the
                    // RST), due now, so that the next packet of the tuple finds nothing
                    // and the next expiry pass reaps it. (With `now_ns` below the CLOSE
                    // timeout, in a clock's first seconds, it is due when CLOSE ends.)
                    refresh = false;
                    e.last_seen_ns = now_ns.saturating_sub(e.timeout_ns(&self.config.timeouts));
                }
                Verdict::Reset => {}
                Verdict::Invalid => {
                    self.stats.invalid += 1;
                    return Ok(Begin::Tracked(invalid));
                }
                Verdict::Reopen => {
                    self.table.remove(id);
                    self.stats.deleted += 1;
                    return Ok(self.starts(pkt, parsed, hash));
                }
            }
        }
        if let ProtoState::Sctp(c) = &mut e.proto_state {
            let ok =
                sctp_packet(pkt, parsed).is_some_and(|p| c.packet(dir, &p) == SctpVerdict::Accept);
            if !ok {
                self.stats.invalid += 1;
                return Ok(Begin::Tracked(invalid));
            }
        }
        let status_before = e.status;
        let replied_before = status_before.has(Status::SEEN_REPLY);
        let e = if reply && !replied_before {
            // The first reply: out of the unreplied FIFO, whose links it held.
            self.table.set_replied(id);
            match self.table.get_mut(id) {
                Some(e) => e,
                None => return Ok(Begin::Tracked(invalid)),
            }
        } else {
            e
        };
        e.count(dir, parsed.ip_len() as u64);
        if refresh {
            e.last_seen_ns = e.last_seen_ns.max(now_ns);
        }
        let assured = match &e.proto_state {
            ProtoState::Tcp(c) => c.state == TcpState::Established && (replied_before || reply),
            ProtoState::Sctp(c) => c.state == SctpState::Established && (replied_before || reply),
            // Replied and still active after 2 s: a stream. The first time is read only
            // until the entry is assured.
            ProtoState::Udp => {
                replied_before
                    && !status_before.has(Status::ASSURED)
                    && now_ns.saturating_sub(e.first_seen_ns) > UDP_STREAM_NS
            }
            _ => replied_before,
        };
        if assured {
            e.status.set(Status::ASSURED);
        }
        // The deadline can only come earlier when the timeout changed, that is with the
        // status or the TCP state (its state or flags: data unacknowledged); otherwise the
        // refresh moved it later, if at all.
        let after_ns =
            (tcp || e.status != status_before).then(|| e.deadline_ns(&self.config.timeouts));
        // A TCP entry is filed no later than the unacknowledged-data cap from now
        // (`Entry::file_ns`): a deadline that comes down no lower moves nothing.
        let before_ns = if tcp {
            before_ns.min(now_ns.saturating_add(self.config.timeouts.tcp_unacknowledged_ns))
        } else {
            before_ns
        };
        // Original direction: to the translated tuple; reply direction: back.
        let to = e.status.nat().then(|| reverse(&e.tuple(1 - dir)));
        if let Some(after_ns) = after_ns {
            self.table.shorten(id, before_ns, after_ns);
        }
        self.stats.found += 1;
        if let Some(to) = to {
            translate(pkt, parsed, &to)?;
        }
        Ok(Begin::Tracked(CtResult {
            state: CtState::Established,
            reply,
            entry: Some(id),
            pending: None,
        }))
    }

    /// The protocol state of the connection a packet of no tracked connection would
    /// start, or None when it cannot start one (a TCP segment other than a SYN, or a
    /// mid-stream one with pickup off; an ICMP echo reply): INVALID.
    fn first_state(&self, pkt: &Packet, parsed: &Parsed) -> Option<ProtoState> {
        let key = &parsed.key;
        match key.proto {
            proto::TCP => Segment::read(pkt, parsed)
                .and_then(|seg| TcpConn::new(&seg, self.config.tcp_pickup))
                .map(ProtoState::Tcp),
            proto::UDP => Some(ProtoState::Udp),
            proto::SCTP => sctp_packet(pkt, parsed)
                .and_then(|p| SctpConn::new(&p))
                .map(ProtoState::Sctp),
            // An echo reply nobody asked for starts nothing.
            proto::ICMP | proto::ICMPV6 => (icmp::kind(key.proto, (key.dst_port >> 8) as u8)
                == Kind::Request)
                .then_some(ProtoState::Icmp),
            _ => Some(ProtoState::Other),
        }
    }

    /// A packet of no tracked connection that can start one, with `ps` its protocol
    /// state ([`Conntrack::first_state`]): decides the connection it would start. `hash`
    /// is the hash of the packet's key.
    fn create(
        &mut self,
        pkt: &mut Packet,
        parsed: &mut Parsed,
        ps: ProtoState,
        nat: Option<&Nat>,
        hash: u64,
        now_ns: u64,
    ) -> Result<CtResult, DropReason> {
        let key = parsed.key;
        if self.table.len() >= self.config.max_entries {
            // Commit will evict the oldest unreplied entry: its cache misses start now,
            // to overlap with those of the NAT decision.
            self.table.prefetch_eviction();
        }
        let (post, nat_status, reply_hash) = match nat::decide(&self.table, &key, hash, nat) {
            Ok(d) => d,
            Err(nat::Refusal::Exhausted) => {
                self.stats.nat_port_exhausted += 1;
                return Err(DropReason::NatPortExhausted);
            }
            Err(nat::Refusal::Clash) => {
                self.stats.clash += 1;
                return Ok(self.invalid());
            }
            Err(nat::Refusal::Family) => return Ok(self.invalid()),
        };
        let reply = reverse(&post);
        if post != key {
            translate(pkt, parsed, &post)?;
        }
        self.stats.new += 1;
        Ok(CtResult {
            state: CtState::New,
            reply: false,
            entry: None,
            pending: Some(Pending {
                hashes: [hash, reply_hash],
                stamp: self.table.stamp(),
                changes: self.table.changes(),
                entry: Entry::first(
                    key,
                    reply,
                    ps,
                    Status(nat_status),
                    parsed.ip_len() as u64,
                    now_ns,
                ),
            }),
        })
    }

    /// An ICMP error: RELATED to the connection its quoted packet belongs to, whoever sent
    /// it (the peer or a router on the way).
    ///
    /// The quote is the packet as its sender sent it, so its reverse is the tuple of the
    /// direction the error travels in. The error must be addressed to that direction's
    /// destination. For a translated connection the error is translated like a packet of
    /// that direction: outer destination, outer source when it is the peer itself (a
    /// router's address is kept), and the quote into the tuple its sender knows.
    fn related(
        &mut self,
        pkt: &mut Packet,
        parsed: &mut Parsed,
        now_ns: u64,
    ) -> Result<CtResult, DropReason> {
        let Some(emb) = icmp_error::embedded(&pkt.data, parsed)? else {
            return Ok(self.invalid());
        };
        let Some((id, dir)) = self.table.lookup(&reverse(&emb.key)) else {
            return Ok(self.invalid());
        };
        let Some(e) = self
            .table
            .get(id)
            .filter(|e| e.deadline_ns(&self.config.timeouts) > now_ns)
        else {
            // Gone, or timed out and not yet reaped.
            return Ok(self.invalid());
        };
        let (here, other) = (e.tuple(dir), e.tuple(1 - dir));
        if here.dst != parsed.key.dst {
            // Quotes a connection that the error is not addressed to.
            return Ok(self.invalid());
        }
        if e.status.nat() {
            let outer_dst = other.src;
            let outer_src = if parsed.key.src == here.src {
                other.dst
            } else {
                parsed.key.src
            };
            rewrite_icmp_error(&mut pkt.data, parsed, &emb, outer_src, outer_dst, &other)?;
            parsed.key.src = outer_src;
            parsed.key.dst = outer_dst;
        }
        self.stats.related += 1;
        Ok(CtResult {
            state: CtState::Related,
            reply: dir == REPLY,
            entry: Some(id),
            pending: None,
        })
    }

    fn invalid(&mut self) -> CtResult {
        self.stats.invalid += 1;
        CtResult::plain(CtState::Invalid)
    }

    /// Inserts a pending connection. When the table is full the oldest entry that never
    /// saw a reply is evicted; when there is none, `Err(CtTableFull)`.
    pub fn commit(&mut self, pending: Pending, now_ns: u64) -> Result<EntryId, DropReason> {
        // The entry is read where it lies and moved once, into the table: taken apart
        // into locals it would be copied first.
        let same_table = self.table.has_stamp(&pending.stamp);
        let hashes = if same_table {
            pending.hashes
        } else {
            self.table.hashes(&pending.entry)
        };
        let unchanged = same_table && pending.changes == self.table.changes();
        if !unchanged && self.table.taken(&pending.entry, hashes) {
            // Only when the table changed since process(), which the contract rules out.
            self.stats.clash += 1;
            return Err(DropReason::CtInvalid);
        }
        while self.table.len() >= self.config.max_entries {
            let Some(old) = self.table.oldest_unreplied() else {
                self.stats.insert_failed += 1;
                return Err(DropReason::CtTableFull);
            };
            let due = self
                .table
                .get(old)
                .is_some_and(|o| o.deadline_ns(&self.config.timeouts) <= now_ns);
            self.table.remove(old);
            if due {
                self.stats.expired += 1;
            } else {
                self.stats.evicted += 1;
            }
        }
        let id = self
            .table
            .insert(pending.entry, hashes, &self.config.timeouts, now_ns);
        self.stats.inserted += 1;
        Ok(id)
    }

    /// Inserts a copy of an entry from another table as it stands: tuples, protocol
    /// state, NAT status, mark, labels, tunnel peer, packet counts and times. This is how
    /// a scratch table for a dry run starts with the live connections a packet would
    /// meet. Refused when a tuple is taken (`CtInvalid`) or the table is full
    /// (`CtTableFull`): nothing is evicted, and no counter but the table's size moves.
    pub fn adopt(&mut self, entry: Entry, now_ns: u64) -> Result<EntryId, DropReason> {
        let hashes = self.table.hashes(&entry);
        if self.table.taken(&entry, hashes) {
            return Err(DropReason::CtInvalid);
        }
        if self.table.len() >= self.config.max_entries {
            return Err(DropReason::CtTableFull);
        }
        Ok(self
            .table
            .insert(entry, hashes, &self.config.timeouts, now_ns))
    }

    /// Removes entries whose timeout passed, examining at most `budget` entries (plus at
    /// most one turn of empty wheel slots). Returns how many were removed.
    pub fn expire(&mut self, now_ns: u64, budget: usize) -> usize {
        let n = self.table.expire(&self.config.timeouts, now_ns, budget);
        self.stats.expired += n as u64;
        n
    }

    /// The entry `id`.
    pub fn get(&self, id: EntryId) -> Option<&Entry> {
        self.table.get(id)
    }

    /// The entry `id`, for the mark, labels and tunnel peer that other stages set. Its
    /// tuples and status must not be changed.
    pub fn get_mut(&mut self, id: EntryId) -> Option<&mut Entry> {
        self.table.get_mut(id)
    }

    /// The entry with the tuple `key`, and whether `key` is its reply tuple.
    pub fn lookup(&self, key: &FlowKey) -> Option<(EntryId, bool)> {
        self.table.lookup(key).map(|(id, dir)| (id, dir == REPLY))
    }

    /// The entries that `filter` selects.
    pub fn dump<'a>(
        &'a self,
        filter: &'a Filter,
    ) -> impl Iterator<Item = (EntryId, &'a Entry)> + 'a {
        self.table.iter().filter(|(_, e)| filter.matches(e))
    }

    /// Removes the entries that `filter` selects (a control-plane operation: it scans the
    /// table). Returns how many were removed.
    pub fn delete(&mut self, filter: &Filter) -> usize {
        self.retain(|e| !filter.matches(e))
    }

    /// Keeps only the entries for which `keep` is true: the others are removed from the
    /// table, its index, the expiry wheel and the eviction FIFO, and counted as deleted.
    /// One pass over the table without allocating (a control-plane operation, e.g. when
    /// a table swap removes Service endpoints). Returns how many were removed.
    pub fn retain(&mut self, keep: impl FnMut(&Entry) -> bool) -> usize {
        let n = self.table.retain(keep);
        self.stats.deleted += n as u64;
        n
    }

    /// Allocates room for `n` entries at once (within [`Config::max_entries`]): a restore
    /// of `n` handed-over connections (`handover`) then never waits for the table to grow.
    pub(crate) fn reserve(&mut self, n: usize) {
        self.table.reserve(n);
    }

    /// Removes every entry without counting it deleted: undoes a restore that was
    /// refused halfway (`handover`), leaving the counters as they were.
    pub(crate) fn forget_all(&mut self) {
        self.table.clear();
    }

    /// Turns mid-stream TCP pickup ([`Config::tcp_pickup`]) on or off for connections
    /// created from now on.
    pub fn set_tcp_pickup(&mut self, on: bool) {
        self.config.tcp_pickup = on;
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Live entries whose source NAT holds a port (or ICMP echo identifier) of its
    /// translated address, including connections without SNAT given another source port
    /// because their reply tuple was taken: how much of the port space is in use. Kept up
    /// to date on every insertion and removal, never counted by a scan. When no range is
    /// given, SNAT chooses from [`SNAT_PORTS`] (or [`SNAT_PRIVILEGED_PORTS`]) per
    /// translated address, protocol and destination.
    pub fn nat_in_use(&self) -> usize {
        self.table.nat_ports()
    }

    /// True when no connection is tracked.
    pub fn is_empty(&self) -> bool {
        self.table.len() == 0
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Bytes of memory held by the table: slab (entries with their list links), index,
    /// and the extra allocations of IPv6 entries with more than three distinct addresses;
    /// not the expiry wheel's fixed 16 KiB. Scans the table (for metrics, not per packet).
    pub fn memory_bytes(&self) -> usize {
        self.table.memory_bytes()
    }

    /// Checks the table's internal invariants (tests).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        self.table.check();
    }
}

/// Rewrites a packet to the tuple `to` and makes `to` its key.
/// The SCTP packet of `pkt` as conntrack reads it, or None when it is malformed or, for a
/// packet with a chunk that can change an association's state (anything but DATA,
/// SACK and heartbeats), its CRC32c is wrong: the endpoint would drop it, and so a
/// corrupted ABORT must not close the tracked association. The checksum is not checked
/// on the packets of data (most of them), which cannot change the state, nor when the
/// sender left it to an offload (virtio-net NEEDS_CSUM).
fn sctp_packet(pkt: &Packet, parsed: &Parsed) -> Option<crate::wire::sctp::Packet> {
    use crate::wire::sctp::{self, chunk};
    let b = pkt.data.get(parsed.l4_off..parsed.ip_end)?;
    let p = sctp::Packet::read(b)?;
    let data_only = [
        chunk::DATA,
        chunk::SACK,
        chunk::HEARTBEAT,
        chunk::HEARTBEAT_ACK,
    ]
    .iter()
    .fold(p.types, |t, &c| t & !(1 << c))
        == 0;
    (data_only || pkt.meta.vnet.needs_csum() || sctp::crc_ok(b)).then_some(p)
}

pub(crate) fn translate(
    pkt: &mut Packet,
    parsed: &mut Parsed,
    to: &FlowKey,
) -> Result<(), DropReason> {
    if *to != parsed.key {
        rewrite(&mut pkt.data, parsed, pkt.meta.vnet.needs_csum(), to)?;
        parsed.key = *to;
    }
    Ok(())
}
