//! Expiry without scans: a timing wheel with lazy re-filing.
//!
//! Every entry sits in exactly one slot of a wheel of [`SLOTS`] one-tick slots (a tick is
//! 2^30 ns, about 1.07 s), filed under the tick of its deadline when it was filed, or the
//! last slot before the wheel wraps for deadlines beyond the horizon (about 73 minutes).
//! A packet that extends an entry's life does nothing here: when the slot comes up and
//! the real deadline moved, the entry is simply filed again. A packet that shortens it (a
//! FIN, an RST) re-files it at once, an O(1) unlink and link. A TCP entry is filed no
//! later than `Timeouts::tcp_unacknowledged_ns` ahead (`Entry::file_ns`), so that data
//! waiting for its acknowledgment, which caps the deadline at that, never moves it. Slots
//! are intrusive doubly linked lists through [`Links`], so removing an entry is O(1) and
//! leaves nothing stale; the first entry of a slot keeps the slot's number in place of a
//! previous link, so an entry needs 8 bytes here and no record of the tick it is filed
//! under.

use super::table::{Links, NIL, Slot, links};

/// Slots in the wheel (a power of two).
pub(crate) const SLOTS: usize = 4096;
/// A tick is 2^TICK_SHIFT nanoseconds.
pub(crate) const TICK_SHIFT: u32 = 30;
/// In [`Links::prev`]: the entry is the first of its slot, whose number is in the low bits
/// (ids are below 2^31).
const HEAD: u32 = 1 << 31;

/// The tick of a time.
#[inline]
pub(crate) fn tick(ns: u64) -> u64 {
    ns >> TICK_SHIFT
}

/// The wheel: list heads and the next tick to process.
pub(crate) struct Wheel {
    heads: Box<[u32]>,
    /// Every tick before this one was processed.
    cursor: u64,
    started: bool,
}

impl Wheel {
    pub(crate) fn new() -> Wheel {
        Wheel {
            heads: vec![NIL; SLOTS].into_boxed_slice(),
            cursor: 0,
            started: false,
        }
    }

    /// Starts the clock at `now_ns` on first use.
    #[inline]
    pub(crate) fn start(&mut self, now_ns: u64) {
        if !self.started {
            self.started = true;
            self.cursor = tick(now_ns);
        }
    }

    /// The tick an entry with this deadline is filed under.
    #[inline]
    fn file_tick(&self, deadline_ns: u64) -> u64 {
        let max = self.cursor + SLOTS as u64 - 1;
        tick(deadline_ns).clamp(self.cursor, max)
    }

    /// Files `id` under its deadline.
    pub(crate) fn file(&mut self, slots: &mut [Slot], id: u32, deadline_ns: u64) {
        let slot = (self.file_tick(deadline_ns) % SLOTS as u64) as usize;
        let head = self.heads[slot];
        *links(slots, id) = Links {
            prev: HEAD | slot as u32,
            next: head,
        };
        if head != NIL {
            links(slots, head).prev = id;
        }
        self.heads[slot] = id;
    }

    /// Takes `id` out of its slot.
    pub(crate) fn unlink(&mut self, slots: &mut [Slot], id: u32) {
        let Links { prev, next } = *links(slots, id);
        if prev & HEAD != 0 {
            self.heads[(prev & !HEAD) as usize % SLOTS] = next;
        } else {
            links(slots, prev).next = next;
        }
        if next != NIL {
            links(slots, next).prev = prev;
        }
        *links(slots, id) = Links::default();
    }

    /// Files `id` again if its deadline moved from `before_ns` to an earlier tick. The
    /// tick it is filed under is never later than its deadline's (deadlines that grow
    /// leave it in place), so when the new deadline's tick is not before the old one's
    /// nothing needs to move; otherwise re-filing is at worst an early visit.
    #[inline]
    pub(crate) fn shorten(
        &mut self,
        slots: &mut [Slot],
        id: u32,
        before_ns: u64,
        deadline_ns: u64,
    ) {
        if self.file_tick(deadline_ns) < self.file_tick(before_ns) {
            self.unlink(slots, id);
            self.file(slots, id, deadline_ns);
        }
    }

    /// The next entry due at `now_ns`: from the slot of the earliest tick that is wholly
    /// past, skipping at most [`SLOTS`] empty slots. The entry is unlinked; the caller
    /// removes it or files it again.
    pub(crate) fn pop_due(&mut self, slots: &mut [Slot], now_ns: u64) -> Option<u32> {
        self.start(now_ns);
        let target = tick(now_ns);
        // After a long pause, visiting each slot once is enough.
        if target > self.cursor + SLOTS as u64 {
            self.cursor = target - SLOTS as u64;
        }
        while self.cursor < target {
            let head = self.heads[(self.cursor % SLOTS as u64) as usize];
            if head != NIL {
                self.unlink(slots, head);
                return Some(head);
            }
            self.cursor += 1;
        }
        None
    }

    /// The slot `id` is filed in, for tests.
    #[cfg(test)]
    pub(crate) fn slot_of(&self, slots: &[Slot], id: u32) -> Option<usize> {
        let mut slot = None;
        for (s, &h) in self.heads.iter().enumerate() {
            let mut i = h;
            while i != NIL {
                if i == id {
                    slot = Some(s);
                }
                i = match &slots[i as usize] {
                    Slot::Used(e) => e.links.next,
                    Slot::Free(_) => NIL,
                };
            }
        }
        slot
    }

    /// The ids in every slot, for consistency checks.
    #[cfg(test)]
    pub(crate) fn all(&self, slots: &[Slot]) -> Vec<u32> {
        let mut v = Vec::new();
        for (slot, &h) in self.heads.iter().enumerate() {
            let mut id = h;
            let mut prev = HEAD | slot as u32;
            while id != NIL {
                let l = match &slots[id as usize] {
                    Slot::Used(e) => e.links,
                    Slot::Free(_) => panic!("free slot {id} in wheel slot {slot}"),
                };
                assert_eq!(l.prev, prev, "wheel back link of {id}");
                v.push(id);
                prev = id;
                id = l.next;
            }
        }
        v
    }
}
