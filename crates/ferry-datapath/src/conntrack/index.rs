//! The index over both tuples of every entry: open addressing with linear probing in one
//! array of 8-byte slots.
//!
//! A slot holds a value (`slab id << 1 | direction`) in its high half and a 32-bit tag in
//! its low half: the top bits of the tuple's keyed hash. The tag alone decides the slot a
//! value belongs at (its home, `tag * slots >> 32`), so growing the array and deleting
//! (backward shift, no tombstones) move values without hashing a tuple again, and a
//! lookup compares tags before it reads an entry. A lookup reads one cache line of the
//! index in most cases, then the entry.
//!
//! The array holds at most [`LOAD_NUM`]/[`LOAD_DEN`] live values: at 7/10, about 2.86
//! slots of 8 bytes per connection, 22.9 bytes, with a successful lookup probing about 2
//! slots and a miss about 6 (at 4/5, 20 bytes, 3 and 13: a new connection's lookups, which
//! miss, and a removal's backward shift walked twice as far, one more cache line at
//! times; `docs/benchmarks.md` has the figures). It grows by doubling from
//! [`MIN_SLOTS`], but never past the size for the table's most entries.

/// An empty slot. No live slot equals it: tags start at 1. Zero, so that a new array comes
/// from the allocator zeroed, untouched until used.
const EMPTY: u64 = 0;
/// Slots of a new index.
const MIN_SLOTS: usize = 32;
/// Most values per slot: `LOAD_NUM / LOAD_DEN`.
const LOAD_NUM: usize = 7;
const LOAD_DEN: usize = 10;

/// The tag of a hash: its top 32 bits, never 0.
#[inline]
fn tag_of(hash: u64) -> u32 {
    ((hash >> 32) as u32).max(1)
}

/// Slots needed to hold `values` within the load limit.
fn slots_for(values: usize) -> usize {
    values
        .saturating_mul(LOAD_DEN)
        .div_ceil(LOAD_NUM)
        .max(MIN_SLOTS)
}

/// The index.
pub(crate) struct Index {
    slots: Box<[u64]>,
    len: usize,
    /// The array never grows past this many slots (enough for the table's most entries).
    max_slots: usize,
}

impl Index {
    /// An empty index that will hold at most `max_values` values.
    pub(crate) fn new(max_values: usize) -> Index {
        let max_slots = slots_for(max_values);
        Index {
            slots: vec![EMPTY; MIN_SLOTS.min(max_slots)].into_boxed_slice(),
            len: 0,
            max_slots,
        }
    }

    /// Values held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes of the slot array.
    pub(crate) fn allocation_size(&self) -> usize {
        std::mem::size_of_val(&*self.slots)
    }

    /// The slot array, as an address and a length in bytes.
    pub(crate) fn region(&self) -> (*const u8, usize) {
        (self.slots.as_ptr().cast(), self.allocation_size())
    }

    /// The home slot of a tag.
    #[inline]
    fn home(&self, tag: u32) -> usize {
        ((u128::from(tag) * self.slots.len() as u128) >> 32) as usize
    }

    #[inline]
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() { 0 } else { i + 1 }
    }

    /// Slots from `a` forward to `b`.
    #[inline]
    fn distance(&self, a: usize, b: usize) -> usize {
        if b >= a {
            b - a
        } else {
            b + self.slots.len() - a
        }
    }

    /// The first value with this hash for which `eq` holds.
    #[inline(always)]
    pub(crate) fn find(&self, hash: u64, mut eq: impl FnMut(u32) -> bool) -> Option<u32> {
        let tag = tag_of(hash);
        let mut i = self.home(tag);
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if s as u32 == tag && eq((s >> 32) as u32) {
                return Some((s >> 32) as u32);
            }
            i = self.next(i);
        }
    }

    /// The home slot of this hash, read without looking at it (see `Table::prefetch`).
    #[inline]
    pub(crate) fn home_slot(&self, hash: u64) -> u64 {
        self.slots[self.home(tag_of(hash))]
    }

    /// The address of the home slot of this hash (see `Table::prefetch`).
    #[inline]
    pub(crate) fn home_addr(&self, hash: u64) -> *const u8 {
        std::ptr::from_ref(&self.slots[self.home(tag_of(hash))]).cast()
    }

    /// The first value with the tag of this hash, without checking it further: what a
    /// lookup would look at first.
    #[inline]
    pub(crate) fn first(&self, hash: u64) -> Option<u32> {
        let tag = tag_of(hash);
        let mut i = self.home(tag);
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if s as u32 == tag {
                return Some((s >> 32) as u32);
            }
            i = self.next(i);
        }
    }

    /// Adds a value under `hash` (the caller knows it is not there yet).
    pub(crate) fn insert(&mut self, hash: u64, value: u32) {
        if (self.len + 1) * LOAD_DEN > self.slots.len() * LOAD_NUM {
            self.grow();
        }
        let tag = tag_of(hash);
        self.put(u64::from(value) << 32 | u64::from(tag));
        self.len += 1;
    }

    /// Writes a slot at the first empty place from its home.
    #[inline]
    fn put(&mut self, slot: u64) {
        let mut i = self.home(slot as u32);
        while self.slots[i] != EMPTY {
            i = self.next(i);
        }
        self.slots[i] = slot;
    }

    /// Replaces the array with one of `n` slots holding the same values. They are put in
    /// the order of their runs, each run from its start (after an empty slot), so that
    /// values with one tag keep their order, also those of a run that wraps around the
    /// end of the array: an entry whose two tuples are equal needs its original
    /// direction found first.
    fn resize(&mut self, n: usize) {
        let old = std::mem::replace(&mut self.slots, vec![EMPTY; n].into_boxed_slice());
        // At most 7/10 full, so some slot is empty.
        let start = old.iter().position(|&s| s == EMPTY).unwrap_or(0);
        let (head, tail) = old.split_at(start);
        for &s in tail.iter().chain(head).filter(|&&s| s != EMPTY) {
            self.put(s);
        }
    }

    /// Doubles the array, up to the most slots needed (beyond only if more values came).
    fn grow(&mut self) {
        let n = self.slots.len();
        let want = (n * 2).min(self.max_slots).max(slots_for(self.len + 1));
        self.resize(want);
    }

    /// Grows the array at once to its most slots, so that no insertion has to.
    pub(crate) fn reserve_all(&mut self) {
        if self.slots.len() < self.max_slots {
            self.resize(self.max_slots);
        }
    }

    /// Grows the array at once to hold `values` values (within its most slots), so that
    /// inserting that many grows it no more.
    pub(crate) fn reserve(&mut self, values: usize) {
        let want = slots_for(values).min(self.max_slots);
        if self.slots.len() < want {
            self.resize(want);
        }
    }

    /// Removes `value` filed under `hash`; false when it is not there.
    pub(crate) fn remove(&mut self, hash: u64, value: u32) -> bool {
        let want = u64::from(value) << 32 | u64::from(tag_of(hash));
        let mut i = self.home(want as u32);
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return false;
            }
            if s == want {
                break;
            }
            i = self.next(i);
        }
        // Backward shift: pull later values of the run into the hole when the hole lies
        // between their home and where they sit.
        let mut hole = i;
        let mut j = self.next(i);
        loop {
            let s = self.slots[j];
            if s == EMPTY {
                break;
            }
            let home = self.home(s as u32);
            // Distances going forward from home to j, and from the hole to j.
            if self.distance(home, j) >= self.distance(hole, j) {
                self.slots[hole] = s;
                hole = j;
            }
            j = self.next(j);
        }
        self.slots[hole] = EMPTY;
        self.len -= 1;
        true
    }

    /// Every value held.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots
            .iter()
            .filter(|&&s| s != EMPTY)
            .map(|&s| (s >> 32) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hashes that pile up on few homes, to exercise runs and wrap-around.
    fn crowded(i: u32) -> u64 {
        u64::from(u32::MAX - (i % 7) * 3) << 32 | u64::from(i)
    }

    #[test]
    fn test_insert_find_remove_with_collisions_and_growth() {
        let mut ix = Index::new(1000);
        let mut live = std::collections::BTreeSet::new();
        for i in 0..600u32 {
            ix.insert(crowded(i), i);
            live.insert(i);
            if i % 3 == 0 {
                let gone = i / 2;
                if live.remove(&gone) {
                    assert!(ix.remove(crowded(gone), gone));
                }
            }
            for &v in &live {
                assert_eq!(ix.find(crowded(v), |x| x == v), Some(v), "{v} after {i}");
            }
        }
        assert_eq!(ix.len(), live.len());
        assert!(!ix.remove(crowded(1), 1));
        let mut all: Vec<u32> = ix.iter().collect();
        all.sort_unstable();
        assert_eq!(all, live.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn test_values_of_one_tag_keep_their_order_across_growth_and_wrap_around() {
        // Tags at the top of the range: their homes are the last slots, and their run
        // wraps around to the start of the array, at every size the index grows through.
        let top = |i: u32| u64::from(u32::MAX - (i % 3)) << 32;
        let mut ix = Index::new(1000);
        // Values 0, 1, 2, ...: those with one tag come in increasing order.
        for v in 0..400u32 {
            ix.insert(top(v), v);
        }
        assert!(ix.slots[0] != EMPTY, "the run wraps around");
        for t in 0..3u32 {
            // The first value with a tag is the oldest; once it is removed, the next one.
            let expect: Vec<u32> = (0..400).filter(|v| v % 3 == t).collect();
            for &first in &expect {
                assert_eq!(ix.first(top(t)), Some(first), "tag {t}");
                assert_eq!(ix.find(top(t), |_| true), Some(first), "tag {t}");
                assert!(ix.remove(top(t), first));
            }
            assert_eq!(ix.first(top(t)), None);
        }
        assert_eq!(ix.len(), 0);
    }

    #[test]
    fn test_sizes() {
        let mut ix = Index::new(2 * 262_144);
        assert_eq!(ix.allocation_size(), MIN_SLOTS * 8);
        ix.reserve_all();
        // 10/7 slots of 8 bytes per tuple, two tuples per connection: about 22.9 bytes.
        assert_eq!(ix.allocation_size(), 748_983 * 8);
        let small = Index::new(2);
        assert_eq!(small.allocation_size(), MIN_SLOTS * 8);
    }
}
