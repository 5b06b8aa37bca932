//! The reassembly table.
//!
//! Each datagram gets one buffer laid out as the frame it will become: room for the L2
//! and IP headers of the first fragment, then the datagram data at its final offset. A
//! fragment's data is copied straight into place, so completing a datagram only fixes a
//! few header fields; the buffer becomes the output frame without another copy.
//!
//! The byte limit counts the fragments received (their whole IP length), not the
//! buffers: a buffer is sized by where its data lands, so a few bytes at offset 64000
//! take 64 KiB, and counting capacity would let a handful of tiny fragments fill the
//! table. Worst case memory is therefore bounded by the datagram limit instead: at most
//! `max_datagrams` buffers of at most 64 KiB of data plus headers each, and at most
//! `max_datagrams_per_source` of them for one source.
//!
//! Each source (zone and address) may have at most [`Config::max_datagrams_per_source`]
//! datagrams in the table, so that one sender cannot take all of it. Sources are counted
//! in [`SOURCE_BUCKETS`] buckets by a randomly seeded hash of the source, kept with each
//! datagram: no lookup when it leaves. Sources that share a bucket share its limit; a
//! sender cannot choose whose bucket it shares, since the seed is random.
//!
//! Datagrams live in a slab threaded by a doubly linked list in creation order. Since the
//! timeout is constant, creation order is deadline order: the list is the expiry FIFO,
//! and a datagram that completes leaves it in O(1), so the FIFO never holds stale entries.

use std::collections::HashMap;

use ahash::RandomState;

use super::ranges::{Fit, Range, Ranges};
use super::{Config, FamilyStats, Outcome, Stats};
use crate::drop::{DropCounters, DropReason};
use crate::flow::{Addr, proto};
use crate::packet::{Packet, VnetHdr};
use crate::wire::checksum::set_ipv4_header;
use crate::wire::ipv6_ext;
use crate::wire::{L3, Parsed, parse};

/// Datagrams in a handed-over state.
#[path = "saved.rs"]
mod saved;

/// The end of the list.
/// Buckets the sources are counted in for [`Config::max_datagrams_per_source`].
pub const SOURCE_BUCKETS: usize = 4096;

const NIL: u32 = u32::MAX;
/// The most data bytes an IP datagram can carry.
const MAX_DATA: usize = 65535;
/// Work done on the expiry FIFO each time a new datagram is created, so that memory held
/// by dead datagrams is reclaimed even between calls to [`Reassembler::expire`].
const EXPIRE_ON_INSERT: usize = 2;
/// The ECN field (RFC 3168): the low two bits of the IPv4 TOS and of the IPv6 traffic
/// class.
const ECN_MASK: u8 = 0b11;
/// Codepoints of the ECN field.
const ECN_NOT_ECT: u8 = 0b00;
const ECN_CE: u8 = 0b11;

/// What the ECN fields of a datagram's fragments make of the datagram's (RFC 3168
/// section 5.3, Linux's `ip_frag_ecn_table`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ecn {
    /// Leave the first fragment's field as it is.
    Keep,
    /// Set CE: a router marked at least one fragment.
    SetCe,
    /// Not-ECT mixed with ECT or CE: the datagram must be dropped.
    Invalid,
}

/// Combines `seen`, the OR of `1 << ecn` over the fragments.
fn combine_ecn(seen: u8) -> Ecn {
    let not_ect = seen & (1 << ECN_NOT_ECT) != 0;
    if not_ect && seen != 1 << ECN_NOT_ECT {
        Ecn::Invalid
    } else if seen & (1 << ECN_CE) != 0 {
        Ecn::SetCe
    } else {
        Ecn::Keep
    }
}

/// What identifies a datagram. IPv6 has no protocol in it (`proto` is 0), as in Linux:
/// RFC 8200 section 4.5 lets the fragment headers' next header differ between
/// fragments, and only the offset-zero fragment's is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    zone: u16,
    src: Addr,
    dst: Addr,
    proto: u8,
    id: u32,
}

/// What reassembly needs from the first fragment to rebuild the headers.
#[derive(Clone, Copy, Debug)]
struct First {
    /// Offset of the IP header in the frame.
    l3_off: usize,
    /// IPv6: the next header of the fragment header, which becomes the next header of the
    /// header before it.
    frag_nh: u8,
    /// IPv6: offset in the frame of that header's next-header field.
    frag_nh_at: usize,
}

/// A datagram being reassembled.
#[derive(Debug)]
struct Datagram {
    /// The future frame: headers end at `head`, data offset 0 is at `head`.
    buf: Vec<u8>,
    /// Index in `buf` of data offset 0.
    head: usize,
    /// Index in `buf` where the frame starts, once the first fragment placed its headers.
    hdr_start: usize,
    first: Option<First>,
    /// Data length, once the final fragment was seen.
    end: Option<u32>,
    /// Highest data end seen so far.
    max_end: u32,
    /// Data bytes received; ranges never overlap, so the datagram is whole when this
    /// equals `end`.
    received: u32,
    /// Bytes counted against the byte limit: the whole IP length of every fragment held.
    bytes: usize,
    ranges: Ranges,
    /// Largest fragment received, as a whole IP packet length.
    mru: u16,
    /// IPv4: largest fragment received with DF set (Linux's `max_df_size`); the datagram
    /// gets DF when that is the largest fragment of all.
    max_df: u16,
    /// `1 << ecn` of every fragment taken, ORed (Linux's `inet_frag_queue::ecn`).
    ecn: u8,
}

impl Datagram {
    /// Takes the size of a fragment into the MRU and, with DF, into `max_df`.
    fn note_size(&mut self, f: &FragInfo) {
        let size = clamp_u16(f.ip_len);
        self.mru = self.mru.max(size);
        if f.df {
            self.max_df = self.max_df.max(size);
        }
    }
}

#[derive(Debug)]
enum State {
    Live(Datagram),
    /// The datagram failed: its later fragments are dropped until its deadline.
    Failed,
}

#[derive(Debug)]
struct Slot {
    key: Key,
    /// Its source's bucket in [`Reassembler::per_source`].
    source: u16,
    v6: bool,
    deadline: u64,
    prev: u32,
    next: u32,
    state: State,
}

/// What [`Reassembler::add`] made of a fragment.
enum Added {
    Held,
    Duplicate,
    Complete,
    /// The fragment alone is refused; the datagram goes on.
    Refused(DropReason),
    /// The datagram fails with this reason.
    Fail(DropReason),
}

/// Facts about one fragment, computed once.
struct FragInfo {
    v6: bool,
    offset: u32,
    end: u32,
    more: bool,
    /// Start of the fragment data in the frame.
    data_start: usize,
    /// Frame bytes that a first fragment contributes as headers: L2 and IPv4 header, or L2,
    /// IPv6 header and the extension headers before the fragment header.
    hdr_len: usize,
    /// Offset of the IP header in the frame.
    l3_off: usize,
    /// IPv6: offset of the next-header field that names the fragment header.
    frag_nh_at: usize,
    ip_len: usize,
    /// The ECN field (RFC 3168) of the fragment's IP header.
    ecn: u8,
    /// IPv4: DF is set.
    df: bool,
}

/// IP fragment reassembly, bounded in datagrams and bytes. See the module documentation.
#[derive(Debug)]
pub struct Reassembler {
    config: Config,
    map: HashMap<Key, u32, RandomState>,
    /// Datagrams in the table (markers included) per bucket of sources (zone and
    /// address), [`SOURCE_BUCKETS`] of them.
    per_source: Box<[u32]>,
    /// Seeds the hash of sources into [`Reassembler::per_source`]'s buckets.
    source_hash: RandomState,
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    /// Oldest datagram (first to expire).
    head: u32,
    /// Newest datagram.
    tail: u32,
    held_bytes: usize,
    /// Fragments held in incomplete datagrams.
    held_fragments: usize,
    stats: Stats,
}

impl Reassembler {
    /// A reassembler with these limits. The hash table is keyed with a random seed so that
    /// remote senders cannot aim fragments at one bucket.
    pub fn new(config: Config) -> Reassembler {
        Reassembler {
            config,
            map: HashMap::with_hasher(RandomState::new()),
            per_source: vec![0; SOURCE_BUCKETS].into_boxed_slice(),
            source_hash: RandomState::new(),
            slots: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            held_bytes: 0,
            held_fragments: 0,
            stats: Stats::default(),
        }
    }

    /// Takes one fragment. Called by the pipeline only for packets whose
    /// `parsed.frag.is_some()`; anything else is returned as `Complete`, unchanged.
    ///
    /// Fragments that were held and are discarded because of this call (the datagram
    /// failed on an overlap, or timed out) are counted into `drops` with their reason. The
    /// fragment given here is not: when the outcome is `Dropped`, the caller counts it.
    pub fn process(&mut self, pkt: Packet, parsed: &Parsed, drops: &mut DropCounters) -> Outcome {
        let Some(frag) = parsed.frag else {
            return Outcome::Complete(pkt, *parsed);
        };
        let info = match fragment_info(&pkt, parsed) {
            Ok(i) => i,
            Err(r) => {
                let v6 = parsed.l3 == L3::Ipv6;
                self.count(v6, r, 1);
                return Outcome::Dropped(r);
            }
        };
        if let Err(r) = self.check(&info, parsed) {
            self.count(info.v6, r, 1);
            return Outcome::Dropped(r);
        }
        let key_proto = if info.v6 { 0 } else { parsed.proto };
        let key = Key {
            zone: parsed.key.zone,
            src: parsed.key.src,
            dst: parsed.key.dst,
            proto: key_proto,
            id: frag.id,
        };
        let now = pkt.meta.time_ns;

        let idx = match self.map.get(&key).copied() {
            Some(idx) if self.slot(idx).is_some_and(|s| s.deadline <= now) => {
                // Timed out but not yet reaped: reap it now, this fragment starts afresh.
                self.expire_slot(idx, drops);
                None
            }
            other => other,
        };
        let idx = match idx {
            Some(idx) => idx,
            None => match self.create(key, &info, now, drops) {
                Ok(idx) => idx,
                Err(r) => {
                    self.count(info.v6, r, 1);
                    return Outcome::Dropped(r);
                }
            },
        };

        match self.add(idx, &pkt, &info) {
            Added::Held => {
                self.family(info.v6).accepted += 1;
                Outcome::Held
            }
            Added::Duplicate => {
                self.family(info.v6).duplicates += 1;
                Outcome::Held
            }
            Added::Refused(r) => {
                self.count(info.v6, r, 1);
                if r == DropReason::FragDatagramFailed {
                    return Outcome::Dropped(r);
                }
                // A datagram created for this very fragment would otherwise sit empty
                // until it expires.
                if self.slot(idx).is_some_and(|s| match &s.state {
                    State::Live(d) => d.ranges.len() == 0,
                    State::Failed => false,
                }) {
                    self.remove(idx);
                }
                Outcome::Dropped(r)
            }
            Added::Fail(r) => {
                self.count(info.v6, r, 1);
                self.fail(idx, r, drops);
                Outcome::Dropped(r)
            }
            Added::Complete => {
                self.family(info.v6).accepted += 1;
                self.complete(idx, pkt, parsed.key.zone, drops)
            }
        }
    }

    /// Expires incomplete datagrams whose deadline is <= `now_ns`, doing at most `budget`
    /// datagrams of work: the oldest datagrams are at the front of a FIFO, so this never
    /// scans the table. Held fragments of expired datagrams are counted into `drops` as
    /// `FragExpired`. Returns the number of incomplete datagrams expired (markers of
    /// failed datagrams are reaped too, using budget, but not counted).
    pub fn expire(&mut self, now_ns: u64, budget: usize, drops: &mut DropCounters) -> usize {
        let mut expired = 0;
        for _ in 0..budget {
            let idx = self.head;
            match self.slot(idx) {
                Some(s) if s.deadline <= now_ns => {}
                _ => break,
            }
            if self.expire_slot(idx, drops) {
                expired += 1;
            }
        }
        expired
    }

    /// Counters, per family.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Datagrams in the table, markers of failed datagrams included (they count against
    /// `max_datagrams` so that a flood of overlaps cannot grow the table).
    pub fn held_datagrams(&self) -> usize {
        self.map.len()
    }

    /// Bytes of fragments held: the whole IP length of every fragment taken into a
    /// datagram that is still incomplete. This is what [`Config::max_bytes`] limits; the
    /// buffers behind it are bounded by [`Config::max_datagrams`] (see the module
    /// documentation).
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Fragments held in datagrams that are still incomplete (exact duplicates, which are
    /// absorbed, not counted); kept as fragments come and go, not counted by a scan.
    pub fn held_fragments(&self) -> usize {
        self.held_fragments
    }

    /// True when a fragment of `ip_len` bytes can be held within the byte limit.
    fn has_room(&self, ip_len: usize) -> bool {
        self.held_bytes + ip_len <= self.config.max_bytes
    }

    /// The limits in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Changes the limits for the fragments that arrive from now on. Datagrams already
    /// held stay, even above a lowered limit, until they complete or expire (new ones are
    /// refused meanwhile). A new timeout applies to datagrams started from now on; since
    /// expiry goes in creation order, after a shortened timeout new datagrams can wait
    /// behind older ones, so it fully applies once those are gone (at most the old
    /// timeout later).
    pub fn set_config(&mut self, config: Config) {
        self.config = config;
    }

    /// Refusals that depend on the fragment alone.
    fn check(&self, f: &FragInfo, parsed: &Parsed) -> Result<(), DropReason> {
        // The attack-specific reasons first: they say more than "too small".
        if f.offset == 0 {
            if !parsed.chain_complete {
                return Err(DropReason::FragIncompleteHeaderChain);
            }
            let has_l4_header = matches!(
                parsed.proto,
                proto::TCP | proto::UDP | proto::ICMP | proto::ICMPV6
            );
            if has_l4_header && !parsed.l4_complete {
                return Err(DropReason::FragFirstTooShort);
            }
        }
        if f.offset == 8 && parsed.proto == proto::TCP {
            return Err(DropReason::FragTcpOffsetOne);
        }
        let len = f.end - f.offset;
        if f.more {
            if !len.is_multiple_of(8) {
                return Err(DropReason::FragLengthNotMultipleOf8);
            }
            let min = if f.v6 {
                self.config.min_fragment_v6
            } else {
                self.config.min_fragment_v4
            };
            if len == 0 || f.ip_len < usize::from(min) {
                return Err(DropReason::FragTooSmall);
            }
        }
        // Header bytes that count against the 65535 limit: the IPv4 header, or the IPv6
        // extension headers that stay once the fragment header is removed.
        let fixed = if f.v6 {
            f.hdr_len - parsed.l3_off - crate::wire::parse::IPV6_LEN
        } else {
            f.hdr_len - parsed.l3_off
        };
        if fixed + f.end as usize > MAX_DATA {
            return Err(DropReason::FragDatagramTooBig);
        }
        Ok(())
    }

    /// Creates the datagram for the first fragment seen of it.
    fn create(
        &mut self,
        key: Key,
        f: &FragInfo,
        now: u64,
        drops: &mut DropCounters,
    ) -> Result<u32, DropReason> {
        self.expire(now, EXPIRE_ON_INSERT, drops);
        // The headers of this fragment are the best guess for those of the first one.
        let head = f.hdr_len;
        let end = f.end as usize;
        // One allocation for the common datagram of up to three fragments; the final
        // fragment tells the exact size. Larger datagrams grow by doubling. Never more
        // than the headers and MAX_DATA: `check` refused data ending past it.
        let guess = if f.more {
            (f.offset as usize + 3 * (end - f.offset as usize)).min(MAX_DATA)
        } else {
            end
        };
        if self.map.len() >= self.config.max_datagrams || !self.has_room(f.ip_len) {
            return Err(DropReason::FragTableFull);
        }
        // Counted here: nothing below fails.
        let source = (self.source_hash.hash_one((key.zone, key.src)) as usize) % SOURCE_BUCKETS;
        let of_source = &mut self.per_source[source];
        if *of_source as usize >= self.config.max_datagrams_per_source {
            return Err(DropReason::FragSourceLimit);
        }
        *of_source += 1;
        let mut buf = Vec::with_capacity(head + guess);
        buf.resize(head, 0);
        let slot = Slot {
            key,
            source: source as u16,
            v6: f.v6,
            deadline: now.saturating_add(self.config.timeout_ns),
            prev: NIL,
            next: NIL,
            state: State::Live(Datagram {
                buf,
                head,
                hdr_start: 0,
                first: None,
                end: None,
                max_end: 0,
                received: 0,
                bytes: 0,
                ranges: Ranges::default(),
                mru: 0,
                max_df: 0,
                ecn: 0,
            }),
        };
        let idx = match self.free.pop() {
            Some(i) => {
                if let Some(s) = self.slots.get_mut(i as usize) {
                    *s = Some(slot);
                }
                i
            }
            None => {
                self.slots.push(Some(slot));
                (self.slots.len() - 1) as u32
            }
        };
        self.link_tail(idx);
        self.map.insert(key, idx);
        Ok(idx)
    }

    /// Adds a fragment to a datagram in the table.
    fn add(&mut self, idx: u32, pkt: &Packet, f: &FragInfo) -> Added {
        let room = self.config.max_bytes.saturating_sub(self.held_bytes);
        let Some(slot) = self.slots.get_mut(idx as usize).and_then(Option::as_mut) else {
            return Added::Refused(DropReason::FragDatagramFailed);
        };
        let dg = match &mut slot.state {
            State::Live(d) => d,
            State::Failed => return Added::Refused(DropReason::FragDatagramFailed),
        };
        let data = &pkt.data[f.data_start..f.data_start + (f.end - f.offset) as usize];

        // Where the datagram ends must be agreed by every fragment.
        if !f.more {
            if dg.end.is_some_and(|e| e != f.end) || f.end < dg.max_end {
                return Added::Fail(DropReason::FragInconsistentEnd);
            }
            if data.is_empty() && dg.end == Some(f.end) {
                return Added::Duplicate;
            }
        } else if dg.end.is_some_and(|e| f.end > e) {
            return Added::Fail(DropReason::FragInconsistentEnd);
        }

        let range = Range {
            start: f.offset,
            end: f.end,
        };
        match dg.ranges.fit(range) {
            Fit::Free => {}
            Fit::Same => {
                let at = dg.head + f.offset as usize;
                return if dg.buf.get(at..at + data.len()) == Some(data) {
                    dg.note_size(f);
                    Added::Duplicate
                } else {
                    Added::Fail(DropReason::FragOverlap)
                };
            }
            Fit::Overlap => return Added::Fail(DropReason::FragOverlap),
        }
        if dg.ranges.len() >= Config::MAX_FRAGMENTS_PER_DATAGRAM {
            return Added::Fail(DropReason::FragTooMany);
        }

        let is_first = f.offset == 0;
        let len = f.end - f.offset;
        let end = if f.more { dg.end } else { Some(f.end) };
        let completes = end == Some(dg.received + len) && (is_first || dg.first.is_some());
        // The fragment that completes a datagram is never held, so it needs no room: a
        // datagram in flight can always finish.
        if !completes && f.ip_len > room {
            return Added::Refused(DropReason::FragTableFull);
        }

        // Make room: for the data, and for headers longer than the room guessed for them.
        let new_head = if is_first {
            dg.head.max(f.hdr_len)
        } else {
            dg.head
        };
        let data_len = (dg.buf.len() - dg.head).max(f.end as usize);
        let need = new_head + data_len;
        let spec = match (f.more, dg.end) {
            (true, None) => (dg.buf.capacity() * 2).min(new_head + MAX_DATA),
            (false, _) => new_head + f.end as usize,
            (true, Some(e)) => new_head + e as usize,
        };
        if need > dg.buf.capacity() {
            dg.buf.reserve_exact(spec.max(need) - dg.buf.len());
        }

        if is_first {
            if f.hdr_len > dg.head {
                // Rare: the first fragment has longer headers than the fragment that
                // created the datagram (IPv4 options that are not copied). Move the data.
                let shift = f.hdr_len - dg.head;
                let old = dg.buf.len();
                dg.buf.resize(old + shift, 0);
                dg.buf.copy_within(0..old, shift);
                dg.head = f.hdr_len;
            }
            dg.hdr_start = dg.head - f.hdr_len;
            dg.buf[dg.hdr_start..dg.head].copy_from_slice(&pkt.data[..f.hdr_len]);
            let frag_nh = if f.v6 {
                pkt.data.get(f.hdr_len).copied().unwrap_or(0)
            } else {
                0
            };
            dg.first = Some(First {
                l3_off: f.l3_off,
                frag_nh,
                frag_nh_at: f.frag_nh_at,
            });
        }

        let at = dg.head + f.offset as usize;
        if at == dg.buf.len() {
            dg.buf.extend_from_slice(data);
        } else {
            if at + data.len() > dg.buf.len() {
                dg.buf.resize(at + data.len(), 0);
            }
            dg.buf[at..at + data.len()].copy_from_slice(data);
        }
        dg.ranges.push(range);
        dg.received += len;
        dg.bytes += f.ip_len;
        self.held_bytes += f.ip_len;
        self.held_fragments += 1;
        dg.max_end = dg.max_end.max(f.end);
        if !f.more {
            dg.end = Some(f.end);
        }
        dg.note_size(f);
        dg.ecn |= 1 << f.ecn;
        match dg.end {
            Some(e) if dg.received == e && dg.first.is_some() => Added::Complete,
            _ => Added::Held,
        }
    }

    /// Removes a whole datagram from the table and turns it into the output frame.
    fn complete(&mut self, idx: u32, pkt: Packet, zone: u16, drops: &mut DropCounters) -> Outcome {
        let Some(slot) = self.remove(idx) else {
            return Outcome::Dropped(DropReason::FragDatagramFailed);
        };
        let State::Live(dg) = slot.state else {
            return Outcome::Dropped(DropReason::FragDatagramFailed);
        };
        let held = dg.ranges.len().saturating_sub(1) as u64;
        let id = slot.key.id;
        let mru = dg.mru;
        let result = build_frame(dg, slot.v6).and_then(|frame| {
            let parsed = parse(&frame, zone)?;
            // A second fragment header inside the datagram: not something to deliver.
            if parsed.frag.is_some() {
                return Err(DropReason::Ipv6ExtHeaderMalformed);
            }
            Ok((frame, parsed))
        });
        match result {
            Ok((frame, parsed)) => {
                self.family(slot.v6).completed += 1;
                let mut meta = pkt.meta;
                meta.mru = mru;
                meta.frag_id = id;
                // The completing fragment's offload state describes that fragment, not the
                // datagram: a partial checksum or GSO request would be applied to the wrong
                // bytes.
                meta.vnet = VnetHdr::default();
                Outcome::Complete(Packet { data: frame, meta }, parsed)
            }
            Err(r) => {
                // The completing fragment was counted as accepted; it is dropped after all.
                self.count(slot.v6, r, 1 + held);
                drops.add(r, held);
                Outcome::Dropped(r)
            }
        }
    }

    /// Fails a datagram: its buffer goes, a marker stays until the deadline so that its
    /// later fragments are refused too.
    fn fail(&mut self, idx: u32, reason: DropReason, drops: &mut DropCounters) {
        let Some(slot) = self.slots.get_mut(idx as usize).and_then(Option::as_mut) else {
            return;
        };
        let old = std::mem::replace(&mut slot.state, State::Failed);
        let v6 = slot.v6;
        if let State::Live(dg) = old {
            self.held_bytes = self.held_bytes.saturating_sub(dg.bytes);
            self.held_fragments = self.held_fragments.saturating_sub(dg.ranges.len());
            let held = dg.ranges.len() as u64;
            drops.add(reason, held);
            self.count(v6, reason, held);
        }
    }

    /// Removes a datagram whose time is up; true when it was still live (not a marker).
    fn expire_slot(&mut self, idx: u32, drops: &mut DropCounters) -> bool {
        let Some(slot) = self.remove(idx) else {
            return false;
        };
        match slot.state {
            State::Live(dg) => {
                let held = dg.ranges.len() as u64;
                drops.add(DropReason::FragExpired, held);
                self.count(slot.v6, DropReason::FragExpired, held);
                true
            }
            State::Failed => false,
        }
    }

    /// Takes a slot out of the table, the FIFO and the byte count.
    fn remove(&mut self, idx: u32) -> Option<Slot> {
        self.unlink(idx);
        let slot = self.slots.get_mut(idx as usize)?.take()?;
        self.free.push(idx);
        self.map.remove(&slot.key);
        let of_source = &mut self.per_source[usize::from(slot.source)];
        *of_source = of_source.saturating_sub(1);
        if let State::Live(dg) = &slot.state {
            self.held_bytes = self.held_bytes.saturating_sub(dg.bytes);
            self.held_fragments = self.held_fragments.saturating_sub(dg.ranges.len());
        }
        Some(slot)
    }

    fn slot(&self, idx: u32) -> Option<&Slot> {
        self.slots.get(idx as usize)?.as_ref()
    }

    fn slot_mut(&mut self, idx: u32) -> Option<&mut Slot> {
        self.slots.get_mut(idx as usize)?.as_mut()
    }

    fn link_tail(&mut self, idx: u32) {
        let tail = self.tail;
        if let Some(s) = self.slot_mut(idx) {
            s.prev = tail;
            s.next = NIL;
        }
        match self.slot_mut(tail) {
            Some(t) => t.next = idx,
            None => self.head = idx,
        }
        self.tail = idx;
    }

    fn unlink(&mut self, idx: u32) {
        let Some((prev, next)) = self.slot(idx).map(|s| (s.prev, s.next)) else {
            return;
        };
        match self.slot_mut(prev) {
            Some(p) => p.next = next,
            None => self.head = next,
        }
        match self.slot_mut(next) {
            Some(n) => n.prev = prev,
            None => self.tail = prev,
        }
    }

    fn family(&mut self, v6: bool) -> &mut FamilyStats {
        if v6 {
            &mut self.stats.v6
        } else {
            &mut self.stats.v4
        }
    }

    /// Counts `n` fragments that ended with `reason` in the family counters.
    fn count(&mut self, v6: bool, reason: DropReason, n: u64) {
        let s = self.family(v6);
        let c = match reason {
            DropReason::FragTooSmall => &mut s.too_small,
            DropReason::FragOverlap => &mut s.overlapped,
            DropReason::FragTableFull | DropReason::FragSourceLimit => &mut s.table_full,
            DropReason::FragExpired => &mut s.expired,
            DropReason::FragTooMany => &mut s.too_many,
            _ => &mut s.invalid,
        };
        *c += n;
    }
}

/// Where the fragment's pieces are, checked against the frame so that nothing later can
/// index out of it whatever `parsed` says.
fn fragment_info(pkt: &Packet, parsed: &Parsed) -> Result<FragInfo, DropReason> {
    let frag = parsed.frag.ok_or(DropReason::FragDatagramFailed)?;
    let (v6, data_start, hdr_len) = match parsed.l3 {
        L3::Ipv4 => (false, parsed.l4_off, parsed.l4_off),
        L3::Ipv6 => {
            // The header before the fragment header names it (the parser recorded where).
            let nh = parsed.unfrag_nh;
            if parsed.frag_hdr_off == 0
                || nh < parsed.l3_off + ipv6_ext::FIXED_NEXT_HEADER
                || nh >= parsed.frag_hdr_off
            {
                return Err(DropReason::Ipv6ExtHeaderMalformed);
            }
            (true, parsed.frag_hdr_off + 8, parsed.frag_hdr_off)
        }
        L3::Arp => return Err(DropReason::UnsupportedEthertype),
    };
    let min_hdr = parsed.l3_off + if v6 { crate::wire::parse::IPV6_LEN } else { 20 };
    if hdr_len < min_hdr || data_start > parsed.ip_end || parsed.ip_end > pkt.data.len() {
        return Err(DropReason::IpLengthInvalid);
    }
    let offset = u32::from(frag.offset);
    // The header is whole (checked above), so its second byte is there.
    let tos = pkt.data[parsed.l3_off + 1];
    let ecn = if v6 {
        (tos >> 4) & ECN_MASK
    } else {
        tos & ECN_MASK
    };
    let df = !v6 && pkt.data[parsed.l3_off + 6] & 0x40 != 0;
    Ok(FragInfo {
        v6,
        offset,
        end: offset + (parsed.ip_end - data_start) as u32,
        more: frag.more,
        data_start,
        hdr_len,
        l3_off: parsed.l3_off,
        frag_nh_at: parsed.unfrag_nh,
        ip_len: parsed.ip_len(),
        ecn,
        df,
    })
}

/// Turns a whole datagram's buffer into its frame: IPv4 length, flags and checksum fixed;
/// IPv6 fragment header gone (it never entered the buffer), next header and payload
/// length fixed; CE set when any fragment had it. Fails when the fragments' ECN fields
/// cannot be combined.
fn build_frame(dg: Datagram, v6: bool) -> Result<Vec<u8>, DropReason> {
    let (Some(first), Some(end)) = (dg.first, dg.end) else {
        return Err(DropReason::FragDatagramFailed);
    };
    let ecn = combine_ecn(dg.ecn);
    let df = dg.max_df != 0 && dg.max_df == dg.mru;
    if ecn == Ecn::Invalid {
        return Err(DropReason::FragEcnMismatch);
    }
    let mut buf = dg.buf;
    buf.truncate(dg.head + end as usize);
    if dg.hdr_start > 0 {
        buf.drain(..dg.hdr_start);
    }
    let hdr_len = dg.head - dg.hdr_start;
    let l3 = first.l3_off;
    if v6 {
        let ext_len = hdr_len - l3 - crate::wire::parse::IPV6_LEN;
        let payload = ext_len + end as usize;
        if payload > MAX_DATA {
            return Err(DropReason::FragDatagramTooBig);
        }
        // The header that named the fragment header now names what followed it.
        buf[first.frag_nh_at] = first.frag_nh;
        buf[l3 + 4..l3 + 6].copy_from_slice(&(payload as u16).to_be_bytes());
        if ecn == Ecn::SetCe {
            buf[l3 + 1] |= ECN_CE << 4;
        }
    } else {
        let ihl = hdr_len - l3;
        let total = ihl + end as usize;
        if total > MAX_DATA {
            return Err(DropReason::FragDatagramTooBig);
        }
        buf[l3 + 2..l3 + 4].copy_from_slice(&(total as u16).to_be_bytes());
        // Clear MF and the offset; keep the reserved bit as the first fragment had it. DF
        // only when the largest fragment had it, as Linux does: refragmenting then keeps
        // DF on every piece, and a path that needed fragments without DF still may.
        buf[l3 + 6] &= 0x80;
        if df {
            buf[l3 + 6] |= 0x40;
        }
        buf[l3 + 7] = 0;
        if ecn == Ecn::SetCe {
            buf[l3 + 1] |= ECN_CE;
        }
        set_ipv4_header(&mut buf[l3..l3 + ihl]);
    }
    Ok(buf)
}

fn clamp_u16(v: usize) -> u16 {
    u16::try_from(v).unwrap_or(u16::MAX)
}
