//! The connection table: a slab of entries, one hash index over both tuples of every
//! entry, the expiry wheel, and the FIFO of entries that never saw a reply (the eviction
//! order when the table is full).
//!
//! The index is a `HashTable<u32>` holding `slab id << 1 | direction`: 4 bytes and one
//! control byte per tuple, keyed through the entry itself, so a tuple is stored once. The
//! hasher is a randomly keyed `ahash`, so that packet fields cannot be chosen to collide.
//!
//! Memory per connection: an `Entry` is 208 bytes (its two tuples alone are 84), its list
//! links 20, and the index 10 bytes of slots per connection at most 7/8 full: 248 bytes
//! per connection in a full table of the default 262144 entries (measured by the test
//! `size_of_entry_and_memory_per_connection`), against nf_conntrack's ~300.

use ahash::RandomState;
use hashbrown::HashTable;

use super::Timeouts;
use super::entry::{Entry, Status};
use super::expiry::Wheel;
use crate::flow::FlowKey;

/// The end of a list.
pub(crate) const NIL: u32 = u32::MAX;
/// Most entries a table can index (ids are shifted left by one in the index).
pub(crate) const MAX_ENTRIES: usize = 1 << 31;

/// List links of a slab slot (kept apart from the entries so that list surgery never
/// needs an entry to be present).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Links {
    pub wprev: u32,
    pub wnext: u32,
    /// The tick the entry is filed under in the wheel, truncated to 32 bits.
    pub wtick: u32,
    /// Unreplied FIFO, oldest at the head.
    pub uprev: u32,
    pub unext: u32,
}

impl Default for Links {
    fn default() -> Self {
        Links {
            wprev: NIL,
            wnext: NIL,
            wtick: 0,
            uprev: NIL,
            unext: NIL,
        }
    }
}

/// The table. Ids are slab indexes, reused after removal.
pub(crate) struct Table {
    entries: Vec<Option<Entry>>,
    links: Vec<Links>,
    free: Vec<u32>,
    index: HashTable<u32>,
    hasher: RandomState,
    live: usize,
    unreplied_head: u32,
    unreplied_tail: u32,
    wheel: Wheel,
}

#[inline]
fn tuple_of(entries: &[Option<Entry>], v: u32) -> Option<&FlowKey> {
    entries
        .get((v >> 1) as usize)?
        .as_ref()
        .map(|e| e.tuple((v & 1) as usize))
}

impl Table {
    pub(crate) fn new() -> Table {
        Table {
            entries: Vec::new(),
            links: Vec::new(),
            free: Vec::new(),
            index: HashTable::new(),
            hasher: RandomState::new(),
            live: 0,
            unreplied_head: NIL,
            unreplied_tail: NIL,
            wheel: Wheel::new(),
        }
    }

    #[inline]
    fn hash(&self, k: &FlowKey) -> u64 {
        self.hasher.hash_one(k)
    }

    /// The keyed hash of a tuple (also a per-connection seed for port allocation).
    #[inline]
    pub(crate) fn hash_key(&self, k: &FlowKey) -> u64 {
        self.hash(k)
    }

    /// Live entries.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// The entry and direction whose tuple is `key`.
    #[inline]
    pub(crate) fn lookup(&self, key: &FlowKey) -> Option<(u32, usize)> {
        let entries = &self.entries;
        self.index
            .find(self.hash(key), |&v| tuple_of(entries, v) == Some(key))
            .map(|&v| (v >> 1, (v & 1) as usize))
    }

    /// True when `key` is a tuple of some entry.
    #[inline]
    pub(crate) fn contains(&self, key: &FlowKey) -> bool {
        self.lookup(key).is_some()
    }

    #[inline]
    pub(crate) fn get(&self, id: u32) -> Option<&Entry> {
        self.entries.get(id as usize)?.as_ref()
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, id: u32) -> Option<&mut Entry> {
        self.entries.get_mut(id as usize)?.as_mut()
    }

    /// Live entries with their ids.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &Entry)> + '_ {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|e| (i as u32, e)))
    }

    /// Inserts an entry: into the slab, both tuples into the index, the wheel, and the
    /// unreplied FIFO unless it already saw a reply.
    pub(crate) fn insert(&mut self, entry: Entry, t: &Timeouts, now_ns: u64) -> u32 {
        let hashes = [self.hash(&entry.original), self.hash(&entry.reply)];
        let deadline = entry.deadline_ns(t);
        let replied = entry.status.has(Status::SEEN_REPLY);
        let id = match self.free.pop() {
            Some(id) => {
                self.entries[id as usize] = Some(entry);
                self.links[id as usize] = Links::default();
                id
            }
            None => {
                self.entries.push(Some(entry));
                self.links.push(Links::default());
                (self.entries.len() - 1) as u32
            }
        };
        let (entries, hasher) = (&self.entries, &self.hasher);
        let rehash = |v: &u32| tuple_of(entries, *v).map_or(0, |k| hasher.hash_one(k));
        for (dir, h) in hashes.into_iter().enumerate() {
            self.index.insert_unique(h, id << 1 | dir as u32, rehash);
        }
        self.wheel.start(now_ns);
        self.wheel.file(&mut self.links, id, deadline);
        if !replied {
            self.unreplied_push(id);
        }
        self.live += 1;
        id
    }

    /// Removes an entry from everywhere; returns it.
    pub(crate) fn remove(&mut self, id: u32) -> Option<Entry> {
        let e = self.entries.get(id as usize)?.as_ref()?;
        let keys = [e.original, e.reply];
        let replied = e.status.has(Status::SEEN_REPLY);
        for (dir, k) in keys.iter().enumerate() {
            let v = id << 1 | dir as u32;
            if let Ok(slot) = self.index.find_entry(self.hasher.hash_one(k), |&x| x == v) {
                slot.remove();
            }
        }
        self.wheel.unlink(&mut self.links, id);
        if !replied {
            self.unreplied_unlink(id);
        }
        self.live -= 1;
        self.free.push(id);
        self.entries[id as usize].take()
    }

    /// Marks an entry as having seen a reply: it leaves the eviction FIFO.
    pub(crate) fn set_replied(&mut self, id: u32) {
        let Some(e) = self.get_mut(id) else { return };
        if e.status.has(Status::SEEN_REPLY) {
            return;
        }
        e.status.set(Status::SEEN_REPLY);
        self.unreplied_unlink(id);
    }

    /// Re-files an entry in the wheel if its deadline moved earlier.
    #[inline]
    pub(crate) fn refresh(&mut self, id: u32, t: &Timeouts) {
        if let Some(e) = self.entries.get(id as usize).and_then(|e| e.as_ref()) {
            let d = e.deadline_ns(t);
            self.wheel.shorten(&mut self.links, id, d);
        }
    }

    /// Expires due entries, at most `budget` entries examined. Returns the number removed.
    pub(crate) fn expire(&mut self, t: &Timeouts, now_ns: u64, budget: usize) -> usize {
        let mut removed = 0;
        for _ in 0..budget {
            let Some(id) = self.wheel.pop_due(&mut self.links, now_ns) else {
                break;
            };
            match self.get(id).map(|e| e.deadline_ns(t)) {
                Some(d) if d <= now_ns => {
                    // Re-link so that remove() finds it where it expects it.
                    self.wheel.file(&mut self.links, id, d);
                    self.remove(id);
                    removed += 1;
                }
                Some(d) => self.wheel.file(&mut self.links, id, d),
                None => {}
            }
        }
        removed
    }

    /// The oldest entry that never saw a reply.
    #[inline]
    pub(crate) fn oldest_unreplied(&self) -> Option<u32> {
        (self.unreplied_head != NIL).then_some(self.unreplied_head)
    }

    fn unreplied_push(&mut self, id: u32) {
        let tail = self.unreplied_tail;
        let l = &mut self.links[id as usize];
        l.uprev = tail;
        l.unext = NIL;
        if tail == NIL {
            self.unreplied_head = id;
        } else {
            self.links[tail as usize].unext = id;
        }
        self.unreplied_tail = id;
    }

    fn unreplied_unlink(&mut self, id: u32) {
        let Links { uprev, unext, .. } = self.links[id as usize];
        if uprev == NIL {
            self.unreplied_head = unext;
        } else {
            self.links[uprev as usize].unext = unext;
        }
        if unext == NIL {
            self.unreplied_tail = uprev;
        } else {
            self.links[unext as usize].uprev = uprev;
        }
        let l = &mut self.links[id as usize];
        l.uprev = NIL;
        l.unext = NIL;
    }

    /// Bytes allocated by the index (for memory measurements).
    pub(crate) fn index_bytes(&self) -> usize {
        self.index.allocation_size()
    }

    /// Slab slots allocated (live or free).
    pub(crate) fn slab_capacity(&self) -> usize {
        self.entries.capacity()
    }

    /// Checks every invariant linking the slab, the index, the wheel and the FIFO; panics
    /// with a description on the first violation. For tests.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let live: Vec<u32> = self.iter().map(|(id, _)| id).collect();
        assert_eq!(live.len(), self.live, "live count");
        assert_eq!(self.index.len(), 2 * self.live, "two index slots per entry");
        for &v in self.index.iter() {
            assert!(
                tuple_of(&self.entries, v).is_some(),
                "index slot {v:#x} points to a removed entry"
            );
        }
        for (id, e) in self.iter() {
            for dir in 0..2 {
                let found = self.lookup(e.tuple(dir));
                let ok = found == Some((id, dir))
                    || (e.original == e.reply && found.is_some_and(|(i, _)| i == id));
                assert!(ok, "entry {id} not found by its tuple {dir}: {found:?}");
            }
        }
        let mut in_wheel = self.wheel.all(&self.links);
        in_wheel.sort_unstable();
        assert_eq!(in_wheel, live, "each live entry exactly once in the wheel");
        let mut fifo = Vec::new();
        let mut id = self.unreplied_head;
        let mut prev = NIL;
        while id != NIL {
            assert_eq!(self.links[id as usize].uprev, prev, "fifo back link");
            fifo.push(id);
            prev = id;
            id = self.links[id as usize].unext;
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
