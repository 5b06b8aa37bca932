//! Datagrams in reassembly as a handed-over state saves them ([`handover::Datagram`]):
//! each fragment's data at its offset, the first fragment's headers, the sizes and ECN
//! seen, and the time left. Markers of failed datagrams are not saved: their later
//! fragments start a datagram that cannot complete, and expire.

use super::{Datagram, First, Key, NIL, Range, Ranges, Reassembler, SOURCE_BUCKETS, Slot, State};
use crate::flow::Addr;
use crate::handover::{self, FirstHeaders, Fragment};

/// Room left for the headers of a datagram whose first fragment has not come: the
/// first fragment moves the data when its headers are longer.
const HEAD_GUESS: usize = 64;

fn record(s: &Slot, dg: &Datagram, now_ns: u64) -> handover::Datagram {
    let first = dg.first.map(|f| FirstHeaders {
        bytes: dg.buf[dg.hdr_start..dg.head].to_vec(),
        ip_offset: f.l3_off as u16,
        next_header: f.frag_nh,
        next_header_at: f.frag_nh_at as u16,
    });
    let data = |r: &Range| dg.buf[dg.head + r.start as usize..dg.head + r.end as usize].to_vec();
    handover::Datagram {
        zone: s.key.zone,
        src: s.key.src.ip(),
        dst: s.key.dst.ip(),
        proto: s.key.proto,
        id: s.key.id,
        remaining_ns: s.deadline - now_ns,
        first,
        end: dg.end,
        fragments: dg
            .ranges
            .as_slice()
            .iter()
            .map(|r| Fragment {
                offset: r.start,
                data: data(r),
            })
            .collect(),
        bytes: dg.bytes as u32,
        mru: dg.mru,
        max_df: dg.max_df,
        ecn_seen: dg.ecn,
    }
}

impl Reassembler {
    /// The datagrams being reassembled at `now_ns`, oldest first: one walk of the expiry
    /// list.
    pub(crate) fn saved(&self, now_ns: u64) -> Vec<handover::Datagram> {
        let mut out = Vec::new();
        let mut idx = self.head;
        while let Some(s) = self.slot(idx) {
            if let State::Live(dg) = &s.state
                && s.deadline > now_ns
            {
                out.push(record(s, dg, now_ns));
            }
            idx = s.next;
        }
        out
    }

    /// Puts datagrams saved `age_ns` before `now_ns` back, in their order, each with the
    /// time it had left less that age (records checked by `handover`). Returns how many
    /// were put back, how many the limits left out, and how many ran out of time.
    pub(crate) fn restore(
        &mut self,
        records: &[handover::Datagram],
        now_ns: u64,
        age_ns: u64,
    ) -> (usize, usize, usize) {
        let (mut kept, mut full, mut expired) = (0, 0, 0);
        for r in records {
            if r.remaining_ns <= age_ns {
                expired += 1;
                continue;
            }
            let key = Key {
                zone: r.zone,
                src: Addr::from(r.src),
                dst: Addr::from(r.dst),
                proto: r.proto,
                id: r.id,
            };
            let source = (self.source_hash.hash_one((key.zone, key.src)) as usize) % SOURCE_BUCKETS;
            let bytes = r.bytes as usize;
            if self.map.len() >= self.config.max_datagrams
                || self.map.contains_key(&key)
                || self.held_bytes + bytes > self.config.max_bytes
                || self.per_source[source] as usize >= self.config.max_datagrams_per_source
            {
                full += 1;
                continue;
            }
            self.per_source[source] += 1;
            let dg = datagram(r);
            self.held_bytes += bytes;
            self.held_fragments += dg.ranges.len();
            let slot = Slot {
                key,
                source: source as u16,
                v6: r.src.is_ipv6(),
                deadline: now_ns.saturating_add(r.remaining_ns - age_ns),
                prev: NIL,
                next: NIL,
                state: State::Live(dg),
            };
            let idx = match self.free.pop() {
                Some(i) => {
                    self.slots[i as usize] = Some(slot);
                    i
                }
                None => {
                    self.slots.push(Some(slot));
                    (self.slots.len() - 1) as u32
                }
            };
            self.link_tail(idx);
            self.map.insert(key, idx);
            kept += 1;
        }
        (kept, full, expired)
    }
}

/// The buffer and bookkeeping of a saved datagram, laid out as reassembly lays them.
fn datagram(r: &handover::Datagram) -> Datagram {
    let head = r.first.as_ref().map_or(HEAD_GUESS, |f| f.bytes.len());
    let data_len = r
        .fragments
        .iter()
        .map(|f| f.offset as usize + f.data.len())
        .max()
        .unwrap_or(0);
    let mut buf = vec![0; head + data_len];
    let mut ranges = Ranges::default();
    let mut received = 0;
    for f in &r.fragments {
        let at = head + f.offset as usize;
        buf[at..at + f.data.len()].copy_from_slice(&f.data);
        ranges.push(Range {
            start: f.offset,
            end: f.offset + f.data.len() as u32,
        });
        received += f.data.len() as u32;
    }
    let first = r.first.as_ref().map(|f| {
        buf[..head].copy_from_slice(&f.bytes);
        First {
            l3_off: usize::from(f.ip_offset),
            frag_nh: f.next_header,
            frag_nh_at: usize::from(f.next_header_at),
        }
    });
    Datagram {
        buf,
        head,
        hdr_start: 0,
        first,
        end: r.end,
        max_end: data_len as u32,
        received,
        bytes: r.bytes as usize,
        ranges,
        mru: r.mru,
        max_df: r.max_df,
        ecn: r.ecn_seen,
    }
}
