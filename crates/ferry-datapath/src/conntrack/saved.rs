//! Connections as a handed-over state saves them ([`handover::Connection`]): every field
//! of an entry by meaning, times relative to the save, never the entry's layout.

use super::Conntrack;
use super::entry::{Entry, ProtoState, Status};
use super::sctp::SctpConn;
use super::tcp::{SideFlags, TcpConn};
use crate::flow::{Addr, FlowKey};
use crate::handover::{self, Connection, Removed, TcpSide, Tracking, Tuple};

fn tuple(k: &FlowKey) -> Tuple {
    Tuple {
        src: k.src.ip(),
        dst: k.dst.ip(),
        src_port: k.src_port,
        dst_port: k.dst_port,
    }
}

pub(crate) fn key(zone: u16, proto: u8, t: &Tuple) -> FlowKey {
    FlowKey {
        zone,
        src: Addr::from(t.src),
        dst: Addr::from(t.dst),
        proto,
        src_port: t.src_port,
        dst_port: t.dst_port,
    }
}

fn side(c: &TcpConn, dir: usize) -> TcpSide {
    let f = c.side_flags(dir);
    TcpSide {
        end: c.end[dir],
        max_end: c.maxend[dir],
        max_window: c.maxwin[dir],
        window_scale: c.scale[dir],
        sent_window_scale: f.window_scale,
        liberal: f.liberal,
        unacknowledged: f.unacknowledged,
    }
}

/// The record of entry `e` saved at `now_ns`. Inlined into the save's loop, so that the
/// record is written where it goes: returned, it was copied there (a third of the save
/// of a full table).
#[inline]
pub(crate) fn record(e: &Entry, now_ns: u64) -> Connection {
    let (o, r) = (e.original(), e.reply());
    let tracking = match &e.proto_state {
        ProtoState::Tcp(c) => Tracking::Tcp(handover::Tcp {
            state: c.state.into(),
            reset_kept: c.reset_kept(),
            original: side(c, 0),
            reply: side(c, 1),
        }),
        ProtoState::Udp => Tracking::Udp,
        ProtoState::Icmp => Tracking::Icmp,
        ProtoState::Sctp(c) => Tracking::Sctp(handover::Sctp {
            state: c.state.into(),
            vtag: c.vtag,
        }),
        ProtoState::Other => Tracking::Other,
    };
    Connection {
        zone: e.zone(),
        proto: o.proto,
        original: tuple(&o),
        reply: tuple(&r),
        tracking,
        seen_reply: e.status.has(Status::SEEN_REPLY),
        assured: e.status.has(Status::ASSURED),
        dnat: e.status.has(Status::DNAT),
        snat: e.status.has(Status::SNAT),
        mark: e.mark,
        labels: e.labels,
        tunnel_peer: e.tunnel_peer(),
        packets: e.packets(),
        bytes: e.bytes(),
        // An entry made due at once (a connection reset before any reply) has its last
        // time set back by a timeout, which may fall before its first packet: in the
        // record the first packet is no later than the last.
        first_seen_ago_ns: now_ns.saturating_sub(e.first_seen_ns.min(e.last_seen_ns)),
        last_seen_ago_ns: now_ns.saturating_sub(e.last_seen_ns),
    }
}

impl Conntrack {
    /// Appends the record of every connection live at `now_ns` to `out`: one pass over
    /// the table's slots, no filter, and no allocation when `out` has room (a checkpoint
    /// reuses the last one's).
    pub(crate) fn save_into(&self, now_ns: u64, out: &mut Vec<Connection>) {
        let t = &self.config.timeouts;
        out.reserve(self.table.len());
        out.extend(
            self.table
                .iter()
                // Due but not yet reaped: expired already.
                .filter(|(_, e)| e.deadline_ns(t) > now_ns)
                .map(|(_, e)| record(e, now_ns)),
        );
    }
}

impl Conntrack {
    /// Records from now on which entries change and which are removed, for a pre-copy
    /// ([`Conntrack::save_unchanged_into`], [`Conntrack::save_changed`]); forgets what an
    /// earlier tracking recorded. At most a full table's worth of removals is kept.
    pub(crate) fn track_changes(&mut self) {
        self.table.track(self.config.max_entries);
    }

    /// Stops recording changes.
    pub(crate) fn untrack(&mut self) {
        self.table.untrack();
    }

    /// True while changes are recorded.
    pub(crate) fn is_tracking(&self) -> bool {
        self.table.tracked().is_some()
    }

    /// Appends the record of every connection live at `now_ns` among slab slots
    /// `from..from + count` that did not change since [`Conntrack::track_changes`] (all
    /// of them when changes are not tracked); the slot to go on from, or None when
    /// there are no more. Saved a part at a time while the worker forwards between the
    /// parts: what changes meanwhile is saved by [`Conntrack::save_changed`].
    pub(crate) fn save_unchanged_into(
        &self,
        now_ns: u64,
        from: usize,
        count: usize,
        out: &mut Vec<Connection>,
    ) -> Option<usize> {
        let t = &self.config.timeouts;
        let tracked = self.table.tracked();
        let to = from.saturating_add(count);
        out.extend(
            self.table
                .iter_slots(from, to)
                .filter(|(id, e)| {
                    e.deadline_ns(t) > now_ns && !tracked.is_some_and(|c| c.written(*id))
                })
                .map(|(_, e)| record(e, now_ns)),
        );
        (to < self.table.slots_len()).then_some(to)
    }

    /// Stops recording changes, and saves them at `now_ns`: the record of every live
    /// connection that changed or was made since [`Conntrack::track_changes`] appended
    /// to `out`, and the original tuples of those removed since (and of those changed
    /// that are due, expired already). None, and nothing appended, when changes were not
    /// tracked or more were removed than a full table holds: then only a whole state
    /// will do.
    pub(crate) fn save_changed(
        &mut self,
        now_ns: u64,
        out: &mut Vec<Connection>,
    ) -> Option<Vec<Removed>> {
        let tracked = self.table.untrack()?;
        let gone = tracked.removed()?;
        let removed_record = |k: &FlowKey| Removed {
            zone: k.zone,
            proto: k.proto,
            original: tuple(k),
        };
        let mut removed: Vec<Removed> = gone.iter().map(removed_record).collect();
        let t = &self.config.timeouts;
        for id in tracked.written_ids() {
            let Some(e) = self.table.get(id) else {
                continue;
            };
            if e.deadline_ns(t) > now_ns {
                out.push(record(e, now_ns));
            } else {
                removed.push(removed_record(&e.original()));
            }
        }
        Some(removed)
    }

    /// Removes the entry whose original tuple is `key` (not its reply tuple), without
    /// counting it deleted; true when there was one. For changes applied over a
    /// pre-copy's base (`handover`).
    pub(crate) fn forget(&mut self, key: &FlowKey) -> bool {
        match self.table.lookup(key) {
            Some((id, 0)) => self.table.remove(id).is_some(),
            _ => false,
        }
    }

    /// Removes whatever entry has the tuple `key`, in either direction, without
    /// counting it deleted; true when there was one.
    pub(crate) fn forget_any(&mut self, key: &FlowKey) -> bool {
        match self.table.lookup(key) {
            Some((id, _)) => self.table.remove(id).is_some(),
            None => false,
        }
    }
}

/// The entry of a record saved `age_ns` before its restore at `now_ns`, on a clock of
/// its own: times before the clock's start are taken as its start. The record must have
/// passed `handover::check_connection` (tuples of one family).
pub(crate) fn entry(c: &Connection, now_ns: u64, age_ns: u64) -> Entry {
    let ps = match &c.tracking {
        Tracking::Tcp(t) => {
            let sides = [&t.original, &t.reply];
            let flags = sides.map(|s| SideFlags {
                window_scale: s.sent_window_scale,
                liberal: s.liberal,
                unacknowledged: s.unacknowledged,
            });
            ProtoState::Tcp(TcpConn::restored(
                t.state.into(),
                sides.map(|s| s.window_scale),
                sides.map(|s| s.end),
                sides.map(|s| s.max_end),
                sides.map(|s| s.max_window),
                flags,
                t.reset_kept,
            ))
        }
        Tracking::Udp => ProtoState::Udp,
        Tracking::Icmp => ProtoState::Icmp,
        Tracking::Sctp(s) => ProtoState::Sctp(SctpConn::restored(s.state.into(), s.vtag)),
        Tracking::Other => ProtoState::Other,
    };
    let mut status = Status::default();
    for (on, bit) in [
        (c.seen_reply, Status::SEEN_REPLY),
        (c.assured, Status::ASSURED),
        (c.dnat, Status::DNAT),
        (c.snat, Status::SNAT),
    ] {
        if on {
            status.set(bit);
        }
    }
    let mut e = Entry::restored(
        key(c.zone, c.proto, &c.original),
        key(c.zone, c.proto, &c.reply),
        ps,
        status,
        c.packets,
        c.bytes,
        now_ns.saturating_sub(c.first_seen_ago_ns.saturating_add(age_ns)),
        now_ns.saturating_sub(idle_ns(c, age_ns)),
    );
    e.mark = c.mark;
    e.labels = c.labels;
    e.set_tunnel_peer(c.tunnel_peer);
    e
}

/// How long before a restore `age_ns` after the save the record's last refreshing
/// packet came: what its expiry is judged by, whatever the new clock's age.
pub(crate) fn idle_ns(c: &Connection, age_ns: u64) -> u64 {
    c.last_seen_ago_ns.saturating_add(age_ns)
}

/// Makes a restored entry of a stale state go on although its sequence numbers moved on
/// meanwhile: a TCP connection's windows are forgotten, to be learnt again as a
/// connection picked up mid-stream learns them; anything else is as it was.
pub(crate) fn forget_windows(e: &mut Entry) {
    if let ProtoState::Tcp(c) = &mut e.proto_state {
        c.forget_windows();
    }
}

/// The reverse of a record's tuple as conntrack reverses keys (ICMP echo: the type
/// answered, the identifier kept), for checking its NAT.
pub(crate) fn reversed(zone: u16, proto: u8, t: &Tuple) -> Tuple {
    tuple(&super::reverse(&key(zone, proto, t)))
}
