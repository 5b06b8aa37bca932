//! Expiry without scans: a timing wheel with lazy re-filing.
//!
//! Every entry sits in exactly one slot of a wheel of [`SLOTS`] one-tick slots (a tick is
//! 2^30 ns, about 1.07 s), filed under the tick of its deadline when it was filed, or the
//! last slot before the wheel wraps for deadlines beyond the horizon (about 73 minutes).
//! A packet that extends an entry's life does nothing here: when the slot comes up and the
//! real deadline moved, the entry is simply filed again. A packet that shortens it (a
//! FIN, an RST) re-files it at once, an O(1) unlink and link. Slots are intrusive doubly
//! linked lists through [`Links`], so removing an entry is O(1) and leaves nothing stale.

use super::table::{Links, NIL};

/// Slots in the wheel (a power of two that divides 2^32, so that a tick truncated to
/// 32 bits still names its slot).
pub(crate) const SLOTS: usize = 4096;
/// A tick is 2^TICK_SHIFT nanoseconds.
pub(crate) const TICK_SHIFT: u32 = 30;

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
    pub(crate) fn file(&mut self, links: &mut [Links], id: u32, deadline_ns: u64) {
        let t = self.file_tick(deadline_ns);
        let slot = (t % SLOTS as u64) as usize;
        let head = self.heads[slot];
        let l = &mut links[id as usize];
        l.wprev = NIL;
        l.wnext = head;
        l.wtick = t as u32;
        if head != NIL {
            links[head as usize].wprev = id;
        }
        self.heads[slot] = id;
    }

    /// Takes `id` out of its slot.
    pub(crate) fn unlink(&mut self, links: &mut [Links], id: u32) {
        let Links {
            wprev,
            wnext,
            wtick,
            ..
        } = links[id as usize];
        if wprev == NIL {
            self.heads[wtick as usize % SLOTS] = wnext;
        } else {
            links[wprev as usize].wnext = wnext;
        }
        if wnext != NIL {
            links[wnext as usize].wprev = wprev;
        }
        let l = &mut links[id as usize];
        l.wprev = NIL;
        l.wnext = NIL;
    }

    /// Files `id` again if its new deadline comes before the tick it is filed under.
    #[inline]
    pub(crate) fn shorten(&mut self, links: &mut [Links], id: u32, deadline_ns: u64) {
        let t = self.file_tick(deadline_ns) as u32;
        if (t.wrapping_sub(links[id as usize].wtick) as i32) < 0 {
            self.unlink(links, id);
            self.file(links, id, deadline_ns);
        }
    }

    /// The next entry due at `now_ns`: from the slot of the earliest tick that is wholly
    /// past, skipping at most [`SLOTS`] empty slots. The entry is unlinked; the caller
    /// removes it or files it again.
    pub(crate) fn pop_due(&mut self, links: &mut [Links], now_ns: u64) -> Option<u32> {
        self.start(now_ns);
        let target = tick(now_ns);
        // After a long pause, visiting each slot once is enough.
        if target > self.cursor + SLOTS as u64 {
            self.cursor = target - SLOTS as u64;
        }
        while self.cursor < target {
            let head = self.heads[(self.cursor % SLOTS as u64) as usize];
            if head != NIL {
                self.unlink(links, head);
                return Some(head);
            }
            self.cursor += 1;
        }
        None
    }

    /// The ids in every slot, for consistency checks.
    #[cfg(test)]
    pub(crate) fn all(&self, links: &[Links]) -> Vec<u32> {
        let mut v = Vec::new();
        for (slot, &h) in self.heads.iter().enumerate() {
            let mut id = h;
            let mut prev = NIL;
            while id != NIL {
                let l = links[id as usize];
                assert_eq!(l.wprev, prev, "wheel back link of {id}");
                assert_eq!(l.wtick as usize % SLOTS, slot, "wheel slot of {id}");
                v.push(id);
                prev = id;
                id = l.wnext;
            }
        }
        v
    }
}
