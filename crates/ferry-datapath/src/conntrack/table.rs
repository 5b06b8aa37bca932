//! The connection table: a slab of entries, one hash index over both tuples of every
//! entry, the expiry wheel, and the FIFO of entries that never saw a reply (the eviction
//! order when the table is full).
//!
//! The index (see `index`) holds `slab id << 1 | direction` with a tag of the tuple's
//! hash, keyed through the entry itself, so a tuple is stored once. The hasher is a
//! randomly keyed `ahash`, so that packet fields cannot be chosen to collide.
//!
//! Memory per connection: a slab slot is one [`Entry`] of 176 bytes, which holds the
//! entry's wheel links (8 bytes) and, in the place of its reply packet count while no
//! reply was seen, its links in the unreplied FIFO; a free slot is a link in the free
//! list, in the same 176 bytes. The slab grows by doubling but stops at `max_entries`.
//! The index takes 2 tuples x 8 bytes at most 7/10 full, sized for `max_entries` at
//! most: 22.9 bytes per connection. So a full table takes about 199 bytes per connection (the
//! test `size_of_entry_and_memory_per_connection` fails above 200), against
//! nf_conntrack's ~300. [`Table::preallocate`] allocates both for `max_entries` at
//! once. IPv6 entries with more than three distinct addresses (original source and
//! destination, a translated reply source or destination, a tunnel peer) take 48 bytes
//! more for a second allocation. The expiry wheel is a fixed 16 KiB on top.

use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Weak};

use ahash::RandomState;

use super::Timeouts;
use super::entry::{Entry, Status};
use super::expiry::Wheel;
use super::index::Index;
use crate::flow::FlowKey;

/// The end of a list.
pub(crate) const NIL: u32 = u32::MAX;
/// Most entries a table can index (ids are shifted left by one in the index).
pub(crate) const MAX_ENTRIES: usize = 1 << 31;
/// Keys [`Table::prefetch`] loads the index slots of before it loads their entries: few
/// enough that the loads of one group are all in flight together.
pub(crate) const PREFETCH_BATCH: usize = 32;
/// Most keys whose hashes [`Table::prefetch_batch`] keeps for the lookups that follow (a
/// worker's receive batch).
pub(crate) const HINTS: usize = 64;
/// How far past the next expected key a lookup looks among the kept hashes, so that a
/// packet dropped before conntrack does not cost the rest of the batch its hashes.
const HINT_SKIP: usize = 3;
/// Issues a prefetch of each address and returns at once (see
/// [`super::Conntrack::set_prefetch`]).
pub type Prefetch = fn(&[*const u8]);
/// Offset in an entry of a byte in the last cache line that a packet of an IPv4 UDP
/// connection reads (the first byte of its protocol state): with the entry's first byte,
/// the two addresses to prefetch (see the layout in [`Entry`]).
const ENTRY_HOT_END: usize = std::mem::offset_of!(Entry, proto_state);
/// Offset in an entry of its expiry wheel links (its last cache line).
const ENTRY_LINKS: usize = std::mem::offset_of!(Entry, links);

/// Bytes one extra address allocation of an entry takes, allocator header included.
pub(crate) const MORE_BYTES: usize = 32 + 16;

/// Expiry wheel links of an entry (see `expiry`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Links {
    /// The previous entry in the wheel slot, or `HEAD | slot` for the first one.
    pub prev: u32,
    /// The next entry in the wheel slot.
    pub next: u32,
}

impl Default for Links {
    fn default() -> Self {
        Links {
            prev: NIL,
            next: NIL,
        }
    }
}

/// A slab slot: an entry, or a link in the list of free slots.
pub(crate) enum Slot {
    Used(Entry),
    Free(u32),
}

/// The wheel links of entry `id`, which must be live.
#[inline]
pub(crate) fn links(slots: &mut [Slot], id: u32) -> &mut Links {
    match &mut slots[id as usize] {
        Slot::Used(e) => &mut e.links,
        Slot::Free(_) => panic!("conntrack: wheel links of free slot {id}"),
    }
}

/// The table. Ids are slab indexes, reused after removal (last freed first).
pub(crate) struct Table {
    slots: Vec<Slot>,
    /// Head of the free slot list.
    free: u32,
    /// The slab never grows beyond this many slots.
    max: usize,
    index: Index,
    hasher: RandomState,
    live: usize,
    /// Live entries that hold a source NAT port (see [`holds_nat_port`]).
    nat_ports: usize,
    unreplied_head: u32,
    unreplied_tail: u32,
    wheel: Wheel,
    /// Keys of the current batch with their hashes (see [`Table::prefetch_batch`]), and
    /// the next one expected.
    hints: Vec<Hint>,
    next_hint: usize,
    /// The processor's prefetch, when given.
    prefetch: Option<Prefetch>,
    /// Tells this table from every other in the process, so that hashes computed by one
    /// are not used in another (see `Pending`).
    stamp: Arc<Stamp>,
    /// Insertions and removals so far: while it stays the same, a tuple found free stays
    /// free (see `Pending`).
    changes: u64,
    /// What changed since [`Table::track`], while tracked (a handover's pre-copy).
    tracked: Option<Box<Tracked>>,
}

/// What changed in a table since [`Table::track`]: the slots written to (an entry
/// inserted, or handed out for a change by [`Table::get_mut`]), and the original tuples
/// of the entries removed, up to a bound. A handover's pre-copy saves the entries
/// unchanged meanwhile while the worker forwards, then, paused, only these
/// (`handover`).
pub(crate) struct Tracked {
    /// A bit per slot id.
    written: Vec<u64>,
    /// The original tuples of the entries removed, in order.
    removed: Vec<FlowKey>,
    /// Most tuples `removed` keeps; past it, `overflowed` is set and no more are kept.
    bound: usize,
    overflowed: bool,
}

impl Tracked {
    #[inline(always)]
    fn write(&mut self, id: u32) {
        let w = id as usize / 64;
        if w >= self.written.len() {
            self.written.resize(w + 1, 0);
        }
        self.written[w] |= 1 << (id % 64);
    }

    /// True when slot `id` was written to since tracking began.
    #[inline]
    pub(crate) fn written(&self, id: u32) -> bool {
        self.written
            .get(id as usize / 64)
            .is_some_and(|w| w & (1 << (id % 64)) != 0)
    }

    /// The slot ids written to, in order.
    pub(crate) fn written_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.written.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                (w != 0).then(|| {
                    let b = w.trailing_zeros();
                    w &= w - 1;
                    (i * 64) as u32 + b
                })
            })
        })
    }

    /// The original tuples of the entries removed, or None when there were more than
    /// the bound.
    pub(crate) fn removed(&self) -> Option<&[FlowKey]> {
        (!self.overflowed).then_some(&self.removed[..])
    }
}

/// A key of the batch (see [`Table::prefetch_batch`]): its hash, and the first index value
/// with the hash's tag when it was prefetched, most likely its entry.
#[derive(Clone, Copy)]
struct Hint {
    key: FlowKey,
    hash: u64,
    first: u32,
}

/// The identity of a table: the allocation itself, which a pending connection's [`Weak`]
/// to it keeps from being reused by a newer table, so that no process-wide counter is
/// needed to tell tables apart.
#[derive(Debug)]
pub(crate) struct Stamp;

/// True for an entry whose source NAT took a port (or ICMP echo identifier) of its
/// translated address: SNAT of a protocol with ports (also a connection without SNAT that
/// was given another source port for a reply clash). Status and protocol never change
/// while an entry is in the table, so counting at insert and removal stays exact.
#[inline]
fn holds_nat_port(e: &Entry) -> bool {
    e.status.has(Status::SNAT) && crate::nat::ports::allocates(&e.original())
}

#[inline]
fn entry_of(slots: &[Slot], v: u32) -> Option<&Entry> {
    match slots.get((v >> 1) as usize) {
        Some(Slot::Used(e)) => Some(e),
        _ => None,
    }
}

#[cfg(test)]
fn tuple_of(slots: &[Slot], v: u32) -> Option<FlowKey> {
    entry_of(slots, v).map(|e| e.tuple((v & 1) as usize))
}

impl Table {
    /// An empty table that will hold at most `max` entries.
    pub(crate) fn new(max: usize) -> Table {
        Table {
            slots: Vec::new(),
            free: NIL,
            max: max.clamp(1, MAX_ENTRIES),
            index: Index::new(2 * max.clamp(1, MAX_ENTRIES)),
            hasher: RandomState::new(),
            live: 0,
            nat_ports: 0,
            unreplied_head: NIL,
            unreplied_tail: NIL,
            wheel: Wheel::new(),
            hints: Vec::new(),
            next_hint: 0,
            prefetch: None,
            stamp: Arc::new(Stamp),
            changes: 0,
            tracked: None,
        }
    }

    /// Records from now on what changes (see [`Tracked`]), forgetting what an earlier
    /// tracking recorded; at most `bound` removals are kept.
    pub(crate) fn track(&mut self, bound: usize) {
        self.tracked = Some(Box::new(Tracked {
            written: vec![0; self.slots.len().div_ceil(64)],
            removed: Vec::new(),
            bound,
            overflowed: false,
        }));
    }

    /// What changed since [`Table::track`], while tracked.
    pub(crate) fn tracked(&self) -> Option<&Tracked> {
        self.tracked.as_deref()
    }

    /// Stops tracking; returns what was recorded.
    pub(crate) fn untrack(&mut self) -> Option<Box<Tracked>> {
        self.tracked.take()
    }

    /// Live entries with their ids among slots `from..to`.
    pub(crate) fn iter_slots(
        &self,
        from: usize,
        to: usize,
    ) -> impl Iterator<Item = (u32, &Entry)> + '_ {
        let to = to.min(self.slots.len());
        let from = from.min(to);
        self.slots[from..to]
            .iter()
            .enumerate()
            .filter_map(move |(i, s)| match s {
                Slot::Used(e) => Some(((from + i) as u32, e)),
                Slot::Free(_) => None,
            })
    }

    /// Slab slots in use or free (ids below it have been handed out).
    pub(crate) fn slots_len(&self) -> usize {
        self.slots.len()
    }

    /// The keyed hash of a tuple, fed to the hasher in as few words as possible: an IPv4
    /// tuple is one 128-bit word (one multiplication), an IPv6 tuple three words.
    #[inline(always)]
    fn hash(&self, k: &FlowKey) -> u64 {
        let mut h = self.hasher.build_hasher();
        let rest = u64::from(k.zone) << 48
            | u64::from(k.proto) << 32
            | u64::from(k.src_port) << 16
            | u64::from(k.dst_port);
        if k.src.is_ipv4() && k.dst.is_ipv4() {
            let addrs = u64::from(k.src.v4_bits()) << 32 | u64::from(k.dst.v4_bits());
            h.write_u128(u128::from(rest) << 64 | u128::from(addrs));
        } else {
            h.write_u128(u128::from_be_bytes(*k.src.octets()));
            h.write_u128(u128::from_be_bytes(*k.dst.octets()));
            h.write_u64(rest);
        }
        h.finish()
    }

    /// The keyed hash of a tuple (also a per-connection seed for port allocation).
    #[inline]
    pub(crate) fn hash_key(&self, k: &FlowKey) -> u64 {
        self.hash(k)
    }

    /// This table's stamp, for a pending connection to carry: unique among the tables
    /// alive while it is held.
    #[inline]
    pub(crate) fn stamp(&self) -> Weak<Stamp> {
        Arc::downgrade(&self.stamp)
    }

    /// True when `stamp` is this table's.
    #[inline]
    pub(crate) fn has_stamp(&self, stamp: &Weak<Stamp>) -> bool {
        // The address of the allocation a held Weak points to is not reused.
        std::ptr::eq(stamp.as_ptr(), Arc::as_ptr(&self.stamp))
    }

    /// Insertions and removals so far (wrapping): equal counts mean the same entries.
    #[inline]
    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }

    /// Live entries.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Live entries that hold a source NAT port.
    #[inline]
    pub(crate) fn nat_ports(&self) -> usize {
        self.nat_ports
    }

    /// The entry and direction whose tuple is `key`.
    #[inline(always)]
    pub(crate) fn lookup(&self, key: &FlowKey) -> Option<(u32, usize)> {
        self.lookup_hashed(key, self.hash(key))
    }

    /// [`Table::lookup`] with the key's hash already at hand.
    #[inline(always)]
    pub(crate) fn lookup_hashed(&self, key: &FlowKey, hash: u64) -> Option<(u32, usize)> {
        let slots = &self.slots;
        self.index
            .find(hash, |v| {
                entry_of(slots, v).is_some_and(|e| e.tuple_is((v & 1) as usize, key))
            })
            .map(|v| (v >> 1, (v & 1) as usize))
    }

    /// The hash of `key`, and an index value to try first ([`NIL`] for none): what
    /// [`Table::prefetch_batch`] found when `key` is the next key of the batch (or one of
    /// the few after it), else the hash computed now.
    #[inline]
    pub(crate) fn hash_of_next(&mut self, key: &FlowKey) -> (u64, u32) {
        let n = self.next_hint;
        if n < self.hints.len() {
            let end = self.hints.len().min(n + 1 + HINT_SKIP);
            for i in n..end {
                let h = &self.hints[i];
                if h.key == *key {
                    let found = (h.hash, h.first);
                    self.next_hint = i + 1;
                    return found;
                }
            }
        }
        (self.hash(key), NIL)
    }

    /// [`Table::lookup_hashed`], trying the index value `first` before the index: it is
    /// the answer when its entry is live and has the tuple `key` in its direction (tuples
    /// are unique), unless the entry's two tuples may be equal, when the index decides
    /// which direction comes first.
    #[inline(always)]
    pub(crate) fn lookup_first(
        &self,
        key: &FlowKey,
        hash: u64,
        first: u32,
    ) -> Option<(u32, usize)> {
        if let Some(e) = entry_of(&self.slots, first) {
            let dir = (first & 1) as usize;
            if e.tuple_is(dir, key) && !e.maybe_symmetric() {
                return Some((first >> 1, dir));
            }
        }
        self.lookup_hashed(key, hash)
    }

    /// Loads what the lookups of `keys` will read and throws it away: first the index
    /// slot of every key, then the entry each one names. Plain reads, which wait for
    /// nothing: the misses of a batch are in flight together instead of one after the
    /// other. Keys are taken [`PREFETCH_BATCH`] at a time.
    pub(crate) fn prefetch<'a>(&self, keys: impl IntoIterator<Item = &'a FlowKey>) {
        let mut hashes = [0u64; PREFETCH_BATCH];
        let mut firsts = [NIL; PREFETCH_BATCH];
        let mut n = 0;
        for k in keys {
            hashes[n] = self.hash(k);
            n += 1;
            if n == PREFETCH_BATCH {
                self.prefetch_hashed(&hashes, &mut firsts);
                n = 0;
            }
        }
        self.prefetch_hashed(&hashes[..n], &mut firsts);
    }

    /// As [`Table::prefetch`], and keeps the first [`HINTS`] keys with their hashes for
    /// [`Table::hash_of_next`], replacing those of the previous batch.
    ///
    /// Everything is loaded (or prefetched) here, group by group: nothing is left to do
    /// per packet but compare its key with the next kept one. (Prefetching each entry a
    /// few packets ahead of the one being processed instead cost more per packet than it
    /// overlapped: see `docs/benchmarks.md`.)
    pub(crate) fn prefetch_batch<'a>(&mut self, keys: impl IntoIterator<Item = &'a FlowKey>) {
        let mut hints = std::mem::take(&mut self.hints);
        hints.clear();
        hints.reserve_exact(HINTS);
        let mut hashes = [0u64; PREFETCH_BATCH];
        let mut firsts = [NIL; PREFETCH_BATCH];
        // Keys seen before the current group, and in it.
        let (mut base, mut n) = (0, 0);
        let keep = |hints: &mut Vec<Hint>, base: usize, firsts: &[u32]| {
            for (h, &f) in hints.iter_mut().skip(base).zip(firsts) {
                h.first = f;
            }
        };
        for k in keys {
            let h = self.hash(k);
            if hints.len() < HINTS {
                hints.push(Hint {
                    key: *k,
                    hash: h,
                    first: NIL,
                });
            }
            hashes[n] = h;
            n += 1;
            if n == PREFETCH_BATCH {
                self.prefetch_hashed(&hashes, &mut firsts);
                keep(&mut hints, base, &firsts);
                base += n;
                n = 0;
            }
        }
        self.prefetch_hashed(&hashes[..n], &mut firsts);
        keep(&mut hints, base, &firsts[..n]);
        self.hints = hints;
        self.next_hint = 0;
    }

    /// Forgets the hashes kept by [`Table::prefetch_batch`].
    pub(crate) fn clear_hints(&mut self) {
        self.hints.clear();
        self.next_hint = 0;
    }

    /// Sets the prefetch that [`Table::prefetch`] uses instead of plain reads.
    pub(crate) fn set_prefetch(&mut self, prefetch: Option<Prefetch>) {
        self.prefetch = prefetch;
    }

    /// The loads of [`Table::prefetch`] for hashes computed beforehand: the home index
    /// slots, then the entries they name. With a prefetch instruction, issued for the
    /// whole group at once and not waited for; else as plain reads, in loops that do
    /// little besides loading, so that the loads of the group are issued before the first
    /// one returns.
    /// Writes the first index value of each hash to `firsts` ([`NIL`] for none).
    fn prefetch_hashed(&self, hashes: &[u64], firsts: &mut [u32; PREFETCH_BATCH]) {
        if let Some(prefetch) = self.prefetch {
            let mut addrs = [std::ptr::null::<u8>(); 2 * PREFETCH_BATCH];
            for (a, &h) in addrs.iter_mut().zip(hashes) {
                *a = self.index.home_addr(h);
            }
            prefetch(&addrs[..hashes.len()]);
            let mut n = 0;
            for (f, &h) in firsts.iter_mut().zip(hashes) {
                *f = NIL;
                if let Some(v) = self.index.first(h) {
                    *f = v;
                    let e = self.slots.as_ptr().wrapping_add((v >> 1) as usize);
                    let e: *const u8 = e.cast();
                    addrs[n] = e;
                    addrs[n + 1] = e.wrapping_add(ENTRY_HOT_END);
                    n += 2;
                }
            }
            prefetch(&addrs[..n]);
            return;
        }
        let mut acc = 0u64;
        for &h in hashes {
            acc ^= self.index.home_slot(h);
        }
        std::hint::black_box(acc);
        for (f, &h) in firsts.iter_mut().zip(hashes) {
            *f = self.index.first(h).unwrap_or(NIL);
        }
        let mut acc = 0u64;
        for &v in &firsts[..hashes.len()] {
            if let Some(e) = entry_of(&self.slots, v) {
                acc ^= e.touch();
            }
        }
        std::hint::black_box(acc);
    }

    #[inline]
    pub(crate) fn get(&self, id: u32) -> Option<&Entry> {
        match self.slots.get(id as usize)? {
            Slot::Used(e) => Some(e),
            Slot::Free(_) => None,
        }
    }

    /// The entry `id`, to change: while tracked, its slot is recorded as written.
    #[inline]
    pub(crate) fn get_mut(&mut self, id: u32) -> Option<&mut Entry> {
        if let Some(t) = self.tracked.as_deref_mut() {
            t.write(id);
        }
        self.entry_mut(id)
    }

    /// The entry `id`, for the table's own links (not recorded as a change).
    #[inline]
    fn entry_mut(&mut self, id: u32) -> Option<&mut Entry> {
        match self.slots.get_mut(id as usize)? {
            Slot::Used(e) => Some(e),
            Slot::Free(_) => None,
        }
    }

    /// Live entries with their ids.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &Entry)> + '_ {
        self.slots.iter().enumerate().filter_map(|(i, s)| match s {
            Slot::Used(e) => Some((i as u32, e)),
            Slot::Free(_) => None,
        })
    }

    /// A slot for `entry`: the last freed one, else a new one. The slab grows by doubling
    /// from 16 slots but never past `max`, so a full table holds no unused slot.
    #[inline]
    fn alloc(&mut self, entry: Entry) -> u32 {
        if self.free != NIL {
            let id = self.free;
            let slot = &mut self.slots[id as usize];
            self.free = match slot {
                Slot::Free(next) => *next,
                Slot::Used(_) => NIL,
            };
            // Written in place: a `mem::replace` built the slot aside and copied it in.
            *slot = Slot::Used(entry);
            return id;
        }
        let len = self.slots.len();
        if len == self.slots.capacity() {
            let want = (len * 2).max(16).min(self.max).max(len + 1);
            self.slots.reserve_exact(want - len);
        }
        self.slots.push(Slot::Used(entry));
        len as u32
    }

    /// Allocates the slab and the index for the most entries at once, so that no insertion
    /// grows them. The memory comes from the allocator untouched: pages are taken when
    /// entries first use them.
    pub(crate) fn preallocate(&mut self) {
        self.slots.reserve_exact(self.max - self.slots.len());
        self.index.reserve_all();
    }

    /// Allocates the slab and the index for `n` entries in all (at most `max`), so that
    /// inserting that many grows neither.
    pub(crate) fn reserve(&mut self, n: usize) {
        let n = n.min(self.max);
        self.slots.reserve_exact(n.saturating_sub(self.slots.len()));
        self.index.reserve(2 * n);
    }

    /// The big allocations, as addresses and lengths in bytes: the slab and the index.
    pub(crate) fn regions(&self) -> [(*const u8, usize); 2] {
        let slab = (
            self.slots.as_ptr().cast(),
            self.slots.capacity() * std::mem::size_of::<Slot>(),
        );
        [slab, self.index.region()]
    }

    /// The hashes of an entry's two tuples, computed once for [`Table::taken`] and
    /// [`Table::insert`].
    #[inline]
    pub(crate) fn hashes(&self, e: &Entry) -> [u64; 2] {
        [self.hash(&e.original()), self.hash(&e.reply())]
    }

    /// True when a tuple of `e` is already some entry's; `hashes` from [`Table::hashes`].
    #[inline]
    pub(crate) fn taken(&self, e: &Entry, hashes: [u64; 2]) -> bool {
        self.lookup_hashed(&e.original(), hashes[0]).is_some()
            || self.lookup_hashed(&e.reply(), hashes[1]).is_some()
    }

    /// Inserts an entry whose tuples are not taken: into the slab, both tuples into the
    /// index, the wheel, and the unreplied FIFO unless it already saw a reply. `hashes`
    /// from [`Table::hashes`].
    #[inline]
    pub(crate) fn insert(
        &mut self,
        entry: Entry,
        hashes: [u64; 2],
        t: &Timeouts,
        now_ns: u64,
    ) -> u32 {
        debug_assert_eq!(hashes, self.hashes(&entry));
        let deadline = entry.file_ns(t, now_ns);
        let replied = entry.status.has(Status::SEEN_REPLY);
        self.nat_ports += usize::from(holds_nat_port(&entry));
        let id = self.alloc(entry);
        if let Some(t) = self.tracked.as_deref_mut() {
            t.write(id);
        }
        for (dir, h) in hashes.into_iter().enumerate() {
            self.index.insert(h, id << 1 | dir as u32);
        }
        self.wheel.start(now_ns);
        self.wheel.file(&mut self.slots, id, deadline);
        if !replied {
            self.unreplied_push(id);
        }
        self.live += 1;
        self.changes = self.changes.wrapping_add(1);
        id
    }

    /// Removes an entry from everywhere; returns it.
    pub(crate) fn remove(&mut self, id: u32) -> Option<Entry> {
        let e = self.get(id)?;
        let keys = [e.original(), e.reply()];
        let replied = e.status.has(Status::SEEN_REPLY);
        self.nat_ports -= usize::from(holds_nat_port(e));
        for (dir, k) in keys.iter().enumerate() {
            self.index.remove(self.hash(k), id << 1 | dir as u32);
        }
        if let Some(t) = self.tracked.as_deref_mut() {
            if t.removed.len() < t.bound {
                t.removed.push(keys[0]);
            } else {
                t.overflowed = true;
            }
        }
        self.wheel.unlink(&mut self.slots, id);
        if !replied {
            self.unreplied_unlink(id);
        }
        self.live -= 1;
        self.changes = self.changes.wrapping_add(1);
        let slot = std::mem::replace(&mut self.slots[id as usize], Slot::Free(self.free));
        self.free = id;
        match slot {
            Slot::Used(e) => Some(e),
            Slot::Free(_) => None,
        }
    }

    /// Removes every entry for which `keep` is false, in one pass over the slab and
    /// without allocating; returns how many were removed. Removing an entry only frees
    /// its own slot and relinks its list neighbours, so walking the slab by index while
    /// removing visits every entry that was live once.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Entry) -> bool) -> usize {
        let mut removed = 0;
        for id in 0..self.slots.len() as u32 {
            if self.get(id).is_some_and(|e| !keep(e)) {
                self.remove(id);
                removed += 1;
            }
        }
        removed
    }

    /// Removes every entry, the highest id first, so that the slots are handed out again
    /// from id 0 up, as in a new table.
    pub(crate) fn clear(&mut self) {
        for id in (0..self.slots.len() as u32).rev() {
            self.remove(id);
        }
    }

    /// Marks an entry as having seen a reply: it leaves the eviction FIFO.
    pub(crate) fn set_replied(&mut self, id: u32) {
        let Some(e) = self.get(id) else { return };
        if e.status.has(Status::SEEN_REPLY) {
            return;
        }
        self.unreplied_unlink(id);
        if let Some(e) = self.get_mut(id) {
            e.mark_replied();
        }
    }

    /// Re-files an entry in the wheel if its deadline moved from `before_ns` to an earlier
    /// `after_ns`. `before_ns` may be any time the entry is known to be filed no later
    /// than (see `Entry::file_ns`).
    #[inline]
    pub(crate) fn shorten(&mut self, id: u32, before_ns: u64, after_ns: u64) {
        if after_ns < before_ns {
            self.wheel.shorten(&mut self.slots, id, before_ns, after_ns);
        }
    }

    /// Expires due entries, at most `budget` entries examined. Returns the number removed.
    pub(crate) fn expire(&mut self, t: &Timeouts, now_ns: u64, budget: usize) -> usize {
        let mut removed = 0;
        for _ in 0..budget {
            let Some(id) = self.wheel.pop_due(&mut self.slots, now_ns) else {
                break;
            };
            match self
                .get(id)
                .map(|e| (e.deadline_ns(t), e.file_ns(t, now_ns)))
            {
                Some((d, _)) if d <= now_ns => {
                    // Re-link so that remove() finds it where it expects it.
                    self.wheel.file(&mut self.slots, id, d);
                    self.remove(id);
                    removed += 1;
                }
                Some((_, f)) => self.wheel.file(&mut self.slots, id, f),
                None => {}
            }
        }
        removed
    }

    /// With a prefetch instruction, prefetches what evicting the oldest entry that never
    /// saw a reply will touch (see `Conntrack::commit`): the index slots of its two
    /// tuples, the wheel links of its neighbours, and the entry that will be the oldest
    /// after it, so that the next eviction finds that one in cache too. Reads the oldest
    /// entry itself, prefetched by the call before. Changes nothing.
    pub(crate) fn prefetch_eviction(&self) {
        let Some(prefetch) = self.prefetch else {
            return;
        };
        let Some(e) = self.get(self.unreplied_head) else {
            return;
        };
        let slot = |id: u32| -> *const u8 { self.slots.as_ptr().wrapping_add(id as usize).cast() };
        let mut addrs = [std::ptr::null::<u8>(); 7];
        addrs[0] = self.index.home_addr(self.hash(&e.original()));
        addrs[1] = self.index.home_addr(self.hash(&e.reply()));
        let mut n = 2;
        for id in [e.links.prev, e.links.next] {
            // Neither the end of a list nor, for `prev`, the mark of a list's first entry
            // (both above every slot id).
            if (id as usize) < self.slots.len() {
                addrs[n] = slot(id).wrapping_add(ENTRY_LINKS);
                n += 1;
            }
        }
        let (_, next) = e.unreplied_links();
        if (next as usize) < self.slots.len() {
            let s = slot(next);
            addrs[n] = s;
            addrs[n + 1] = s.wrapping_add(ENTRY_HOT_END);
            addrs[n + 2] = s.wrapping_add(ENTRY_LINKS);
            n += 3;
        }
        prefetch(&addrs[..n]);
    }

    /// The oldest entry that never saw a reply.
    #[inline]
    pub(crate) fn oldest_unreplied(&self) -> Option<u32> {
        (self.unreplied_head != NIL).then_some(self.unreplied_head)
    }

    /// Unreplied list links (previous, next) of entry `id`.
    fn ulinks(&self, id: u32) -> (u32, u32) {
        self.get(id).map_or((NIL, NIL), |e| e.unreplied_links())
    }

    fn set_ulinks(&mut self, id: u32, prev: Option<u32>, next: Option<u32>) {
        if let Some(e) = self.entry_mut(id) {
            let (p, n) = e.unreplied_links();
            e.set_unreplied_links(prev.unwrap_or(p), next.unwrap_or(n));
        }
    }

    fn unreplied_push(&mut self, id: u32) {
        let tail = self.unreplied_tail;
        self.set_ulinks(id, Some(tail), Some(NIL));
        if tail == NIL {
            self.unreplied_head = id;
        } else {
            self.set_ulinks(tail, None, Some(id));
        }
        self.unreplied_tail = id;
    }

    fn unreplied_unlink(&mut self, id: u32) {
        let (uprev, unext) = self.ulinks(id);
        if uprev == NIL {
            self.unreplied_head = unext;
        } else {
            self.set_ulinks(uprev, None, Some(unext));
        }
        if unext == NIL {
            self.unreplied_tail = uprev;
        } else {
            self.set_ulinks(unext, Some(uprev), None);
        }
        self.set_ulinks(id, Some(NIL), Some(NIL));
    }

    /// Bytes of memory held: slab slots (live or free), the index, and the extra address
    /// allocations of entries that need one (counted by a scan). Not the wheel's fixed
    /// [`super::expiry::SLOTS`] heads.
    pub(crate) fn memory_bytes(&self) -> usize {
        let more = self.iter().filter(|(_, e)| e.has_more()).count();
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.index.allocation_size()
            + more * MORE_BYTES
    }

    /// The wheel slot entry `id` is filed in. For tests.
    #[cfg(test)]
    pub(crate) fn wheel_slot(&self, id: u32) -> Option<usize> {
        self.wheel.slot_of(&self.slots, id)
    }

    /// Slab slots allocated (live or free).
    #[cfg(test)]
    pub(crate) fn slab_capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// Checks every invariant linking the slab, the index, the wheel and the FIFO; panics
    /// with a description on the first violation. For tests.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let live: Vec<u32> = self.iter().map(|(id, _)| id).collect();
        assert_eq!(live.len(), self.live, "live count");
        let nat = self.iter().filter(|(_, e)| holds_nat_port(e)).count();
        assert_eq!(nat, self.nat_ports, "entries holding a NAT port");
        assert_eq!(self.index.len(), 2 * self.live, "two index slots per entry");
        for v in self.index.iter() {
            assert!(
                tuple_of(&self.slots, v).is_some(),
                "index slot {v:#x} points to a removed entry"
            );
        }
        for (id, e) in self.iter() {
            for dir in 0..2 {
                let found = self.lookup(&e.tuple(dir));
                let ok = found == Some((id, dir))
                    || (e.original() == e.reply() && found.is_some_and(|(i, _)| i == id));
                assert!(ok, "entry {id} not found by its tuple {dir}: {found:?}");
            }
        }
        let mut in_wheel = self.wheel.all(&self.slots);
        in_wheel.sort_unstable();
        assert_eq!(in_wheel, live, "each live entry exactly once in the wheel");
        let mut fifo = Vec::new();
        let mut id = self.unreplied_head;
        let mut prev = NIL;
        while id != NIL {
            let (uprev, unext) = self.ulinks(id);
            assert_eq!(uprev, prev, "fifo back link");
            fifo.push(id);
            prev = id;
            id = unext;
        }
        assert_eq!(self.unreplied_tail, prev, "fifo tail");
        fifo.sort_unstable();
        let unreplied: Vec<u32> = self
            .iter()
            .filter(|(_, e)| !e.status.has(Status::SEEN_REPLY))
            .map(|(id, _)| id)
            .collect();
        assert_eq!(fifo, unreplied, "fifo holds exactly the unreplied entries");
    }
}

/// The NAT decision asks the table which reply tuples are free.
impl crate::nat::ports::ReplyTuples for Table {
    #[inline]
    fn free(&self, post: &FlowKey) -> Option<u64> {
        let reply = super::icmp::reverse(post);
        let h = self.hash_key(&reply);
        self.lookup_hashed(&reply, h).is_none().then_some(h)
    }
}
