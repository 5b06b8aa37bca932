//! The last SYN ignored on each TCP connection, kept for resynchronisation.
//!
//! Linux keeps what it needs of the last segment it let through untracked in the
//! connection itself (`last_dir`, `last_end`, `last_win`, `last_wscale`), so that a
//! SYN-ACK acknowledging an ignored SYN can restart a stale connection
//! ([`TcpConn::resync`]). An entry has no room for it: the 28 bytes of [`TcpConn`] are all
//! in use, and the 3 bytes of padding in [`super::Entry`] are too few. So the SYNs are
//! kept here, by entry, in a small table of [`SLOTS`] slots that is allocated when the
//! first SYN is ignored. Only an ignored segment reads or writes it, and an ignored SYN
//! waits one round trip for its answer: an entry whose slot another one took since then
//! is not resynchronised, and stays as stale as it was.
//!
//! Linux also forgets the SYN when a segment it tracks comes in between; here it stays,
//! so that tracking a segment costs nothing more: a SYN-ACK must still acknowledge
//! exactly its end.

use super::EntryId;
use super::tcp::{IgnoredSyn, Segment, TcpConn, Verdict};

/// Slots of the table: ignored SYNs waiting for their answer at the same time (a slot is
/// chosen by entry id, so fewer than this without a collision). 24 bytes each: 6 KiB.
pub(crate) const SLOTS: usize = 256;

/// An ignored SYN and the entry it was ignored on, which is known by its id and the time
/// of its first packet (an id is reused after its entry is removed).
#[derive(Clone, Copy, Debug)]
struct Slot {
    id: EntryId,
    first_seen_ns: u64,
    syn: IgnoredSyn,
}

/// The last SYN ignored on each connection (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct Resync {
    /// Empty until a SYN is ignored, then [`SLOTS`] long.
    slots: Vec<Option<Slot>>,
}

impl Resync {
    /// A segment that the TCP state machine said to ignore on the connection `c` of entry
    /// `id` (first seen at `first_seen_ns`), in direction `dir`. True when it answers the
    /// entry's last ignored SYN: the connection was resynchronised and the segment is
    /// accepted. Otherwise it is remembered in place of that SYN (only a SYN is kept),
    /// the connection unchanged.
    pub(crate) fn resynced(
        &mut self,
        id: EntryId,
        first_seen_ns: u64,
        c: &mut TcpConn,
        dir: usize,
        seg: &Segment,
    ) -> bool {
        let i = id as usize % SLOTS;
        let last = self
            .slots
            .get_mut(i)
            .and_then(|s| s.take_if(|s| s.id == id && s.first_seen_ns == first_seen_ns));
        if let Some(last) = last
            && c.resync(dir, seg, &last.syn) == Verdict::Accept
        {
            return true;
        }
        if let Some(syn) = IgnoredSyn::of(dir, seg) {
            if self.slots.is_empty() {
                self.slots.resize(SLOTS, None);
            }
            self.slots[i] = Some(Slot {
                id,
                first_seen_ns,
                syn,
            });
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conntrack::TcpState;
    use crate::wire::build::tcp_flags::{ACK, SYN};

    fn seg(seq: u32, ack: u32, flags: u8) -> Segment {
        Segment {
            seq,
            ack,
            win: 65535,
            flags,
            len: u32::from(flags & SYN != 0),
            wscale: None,
        }
    }

    /// A connection picked up mid-stream, to be met by a new SYN.
    fn stale() -> TcpConn {
        TcpConn::new(&seg(1000, 5000, ACK), true).unwrap()
    }

    const SYN_SEG: (u32, u32, u8) = (77_000_000, 0, SYN);
    const ANSWER: (u32, u32, u8) = (9_000_000, 77_000_001, SYN | ACK);

    fn ignore(
        r: &mut Resync,
        id: EntryId,
        t: u64,
        c: &mut TcpConn,
        dir: usize,
        s: (u32, u32, u8),
    ) -> bool {
        r.resynced(id, t, c, dir, &seg(s.0, s.1, s.2))
    }

    #[test]
    fn answer_resyncs_its_own_entry_only() {
        let mut r = Resync::default();
        let mut c = stale();
        assert!(!ignore(&mut r, 3, 10, &mut c, 0, SYN_SEG));
        assert_eq!(r.slots.len(), SLOTS, "allocated with the first SYN");
        assert_eq!(std::mem::size_of::<Option<Slot>>(), 24);
        // Another entry that had the same id (removed since), or another id.
        for (id, t) in [(3, 11), (4, 10)] {
            assert!(!ignore(&mut r, id, t, &mut c, 1, ANSWER));
            assert_eq!(c, stale());
        }
        assert!(ignore(&mut r, 3, 10, &mut c, 1, ANSWER));
        assert_eq!(c.state, TcpState::SynRecv);
        // Used up: a copy of the SYN-ACK is ignored like any other.
        let mut c = stale();
        assert!(!ignore(&mut r, 3, 10, &mut c, 1, ANSWER));
    }

    #[test]
    fn a_later_ignored_segment_or_a_colliding_entry_replaces_the_syn() {
        let mut r = Resync::default();
        let mut c = stale();
        // The entry's next ignored segment is not a SYN: nothing is remembered.
        ignore(&mut r, 3, 10, &mut c, 0, SYN_SEG);
        ignore(&mut r, 3, 10, &mut c, 1, (5000, 1000, SYN | ACK));
        assert!(!ignore(&mut r, 3, 10, &mut c, 1, ANSWER));
        // Another entry's SYN in the same slot.
        ignore(&mut r, 3, 10, &mut c, 0, SYN_SEG);
        ignore(&mut r, 3 + SLOTS as EntryId, 20, &mut stale(), 0, SYN_SEG);
        assert!(!ignore(&mut r, 3, 10, &mut c, 1, ANSWER));
        assert_eq!(c, stale());
        assert!(ignore(&mut r, 3 + SLOTS as EntryId, 20, &mut c, 1, ANSWER));
    }
}
