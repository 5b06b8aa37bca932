//! TCP: the connection state machine and sequence-window tracking, in the spirit of
//! nf_conntrack's TCP tracker.
//!
//! Each direction keeps the highest sequence number sent (`end`), the highest sequence
//! number the other side allowed it to send (`maxend`) and its largest window seen
//! (`maxwin`), with the window scale from its SYN. A segment is in window when (RFC 793
//! and "Real Stateful TCP Packet Filtering in IP Filter", as nf_conntrack applies them):
//!
//! 1. it does not start beyond what the receiver allowed: `seq <= sender.maxend`;
//! 2. it does not end before the receiver's window could still reach back:
//!    `end > sender.end - receiver.maxwin`;
//! 3. it does not acknowledge data the receiver never sent: `ack <= receiver.end`;
//! 4. it does not acknowledge too far back: `ack > receiver.end - max(sender.maxwin, 66000)`.
//!
//! An out-of-window segment is INVALID and leaves the connection unchanged, except on a
//! connection picked up mid-stream: its history is unknown (a duplicate ACK may
//! acknowledge data sent before the restart), so, as Linux's `IP_CT_TCP_FLAG_BE_LIBERAL`
//! on such a connection, it is let through for the connection's lifetime (windows are
//! still tracked from the segments in window). SACK blocks are not read: acknowledgement
//! numbers alone bound the windows, which is stricter.
//!
//! Each direction also knows whether it has data the other side has not acknowledged
//! (Linux's `IP_CT_TCP_FLAG_DATA_UNACKNOWLEDGED`): set when a segment in window moves its
//! `end` forward, cleared when a segment in window from the other side acknowledges
//! exactly that `end`. While either direction has it, the connection's timeout is at most
//! `Timeouts::tcp_unacknowledged_ns`, so that a connection whose peer vanished with data
//! in flight goes after minutes rather than days. Unlike Linux, a SYN counts as
//! unacknowledged data too (the handshake acknowledges it, so an ESTABLISHED connection
//! starts with neither flag, as in Linux): on a connection seen from its SYN, the flag
//! clear then always means that the other side acknowledged exactly everything seen from
//! this one (the RST rules below rely on it). As in Linux, the segment a connection is
//! picked up from, and the first one seen from the other side after it, leave the flag as
//! it is (they may be pure ACKs that nothing will ever acknowledge).
//!
//! An RST in window closes the connection only at the sequence number its receiver
//! expects: off it, the receiver answers with a challenge ACK instead of closing (RFC
//! 5961 section 3, against blind attackers), and, as in Linux's conntrack, the connection
//! is kept here too. Linux compares the RST's sequence number with the highest
//! acknowledgement its receiver sent (`td_maxack`). That number is not kept here (it
//! would grow the entry); the RST sender's `end` is used instead: its next sequence
//! number as far as the segments seen tell, which is where a live endpoint's RST starts,
//! and equal to `td_maxack` whenever the sender has nothing unacknowledged. So an RST
//! from a side seen before:
//!
//! 1. at the sender's `end` closes the connection (this includes Linux's "train", an RST
//!    right after the sender's last data);
//! 2. before it, when the receiver acknowledged all of it, is INVALID and changes nothing
//!    (Linux: before `td_maxack`);
//! 3. otherwise, in ESTABLISHED, is let through and the connection keeps its state
//!    ([`Verdict::ResetKept`]): its windows do not move, and its timeout is CLOSE's until
//!    the next segment, as Linux times the packet of any RST. The challenge ACK of a live
//!    receiver brings the state's timeout back; an endpoint that really went away answers
//!    it with an RST at the exact number, which closes the connection. In the other
//!    states it closes the connection, as in Linux.
//!
//! The differences from Linux come from the missing `td_maxack`, when the sender has data
//! unacknowledged: an RST exactly at the receiver's last acknowledgement (a restarted
//! endpoint answering a segment of the old connection) is kept rather than closing, and
//! one below it is kept rather than INVALID; and an RST at the sender's `end` closes even
//! when the receiver's segment came last. An RST that is the first segment from its
//! sender, as one answering a SYN, closes the connection, as in Linux. On a connection
//! picked up mid-stream none of this applies and any RST closes it, as before: segments
//! sent before the restart were not seen, so the sender's `end` may lag behind the number
//! its RST carries.

use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

use crate::flow::proto;
use crate::packet::{Packet, VnetHdr};
use crate::wire::build::tcp_flags::{ACK, CWR, ECE, FIN, PSH, RST, SYN, URG};
use crate::wire::checksum;
use crate::wire::{L3, Parsed};

/// TCP connection states (nf_conntrack's, without SYN_SENT2: a simultaneous open is let
/// through without changing state).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TcpState {
    /// SYN seen from the originator.
    SynSent,
    /// SYN-ACK seen from the responder.
    SynRecv,
    /// Handshake completed (or connection picked up mid-stream).
    Established,
    /// A FIN was seen.
    FinWait,
    /// The first FIN was acknowledged.
    CloseWait,
    /// Both sides sent a FIN.
    LastAck,
    /// The last FIN was acknowledged.
    TimeWait,
    /// Reset, or fully closed.
    Close,
}

impl TcpState {
    /// Every state, in order.
    pub const ALL: [TcpState; 8] = [
        TcpState::SynSent,
        TcpState::SynRecv,
        TcpState::Established,
        TcpState::FinWait,
        TcpState::CloseWait,
        TcpState::LastAck,
        TcpState::TimeWait,
        TcpState::Close,
    ];

    /// The name `conntrack -L` shows.
    pub fn name(self) -> &'static str {
        match self {
            TcpState::SynSent => "SYN_SENT",
            TcpState::SynRecv => "SYN_RECV",
            TcpState::Established => "ESTABLISHED",
            TcpState::FinWait => "FIN_WAIT",
            TcpState::CloseWait => "CLOSE_WAIT",
            TcpState::LastAck => "LAST_ACK",
            TcpState::TimeWait => "TIME_WAIT",
            TcpState::Close => "CLOSE",
        }
    }
}

/// Per-direction flag: this side sent the window scale option in its SYN.
const F_WSCALE: u8 = 1;
/// Per-direction flag: accept this side's segments without window checks (picked up
/// mid-stream; never cleared, as in Linux).
const F_LIBERAL: u8 = 2;
/// Per-direction flag: this side's `end` moved forward since the other side last
/// acknowledged exactly all of it (Linux's `IP_CT_TCP_FLAG_DATA_UNACKNOWLEDGED`).
const F_UNACK: u8 = 4;
/// Bits per direction in [`TcpConn`]'s flags: direction `d`'s flags are `F_*` shifted
/// by `FLAG_BITS * d`.
const FLAG_BITS: usize = 3;
/// Connection flag, after both directions' flags: the last segment tracked was an RST
/// let through without closing the connection ([`Verdict::ResetKept`]); its timeout is
/// CLOSE's until the next segment.
const RST_KEPT: u8 = 1 << (2 * FLAG_BITS);

/// A per-direction flag set for both directions.
const fn both(f: u8) -> u8 {
    f | f << FLAG_BITS
}

/// Largest window scale shift (RFC 7323 section 2.3).
const MAX_WSCALE: u8 = 14;
/// Smallest acknowledgement window nf_conntrack allows for check 4.
const MIN_ACK_WINDOW: u32 = 66000;

/// TCP state of a connection. Arrays are indexed by direction (original, reply).
///
/// Laid out with the state first, so that an entry's protocol state starts with the byte
/// every packet reads (which also tells UDP from TCP) next to the fields a packet updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct TcpConn {
    /// Connection state.
    pub state: TcpState,
    /// Window scale shift.
    pub scale: [u8; 2],
    /// Per-direction flags, three bits each (`F_*` shifted by `FLAG_BITS * direction`),
    /// then the connection flag `RST_KEPT`; one byte so that the whole state packs into
    /// 28 bytes.
    flags: u8,
    /// Highest sequence number sent plus one (`td_end`).
    pub end: [u32; 2],
    /// Highest sequence number the other side allowed (`td_maxend`).
    pub maxend: [u32; 2],
    /// Largest (scaled) window advertised (`td_maxwin`); zero until the side is seen.
    pub maxwin: [u32; 2],
}

/// The fields in the order they always had (the flags are internal).
impl Serialize for TcpConn {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("TcpConn", 5)?;
        st.serialize_field("state", &self.state)?;
        st.serialize_field("end", &self.end)?;
        st.serialize_field("maxend", &self.maxend)?;
        st.serialize_field("maxwin", &self.maxwin)?;
        st.serialize_field("scale", &self.scale)?;
        st.end()
    }
}

/// The flags of one direction of a TCP connection, by meaning (see
/// [`TcpConn::side_flags`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SideFlags {
    /// The window scale option was in this side's SYN.
    pub window_scale: bool,
    /// This side's segments pass without window checks (picked up mid-stream).
    pub liberal: bool,
    /// This side has data the other has not acknowledged.
    pub unacknowledged: bool,
}

/// The fields of a TCP segment that tracking needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pub seq: u32,
    pub ack: u32,
    pub win: u16,
    pub flags: u8,
    /// Sequence space used: payload bytes, plus one for SYN and one for FIN.
    pub len: u32,
    /// Window scale option (SYN only).
    pub wscale: Option<u8>,
}

impl Segment {
    /// Reads the segment of `pkt` at `parsed.l4_off`; `None` when the header does not
    /// fit, or when the segment can change the connection's state (SYN, FIN or RST set)
    /// and its checksum is wrong (see [`checksum_ok`]): such a segment is INVALID and
    /// changes nothing, as Linux's conntrack treats a bad checksum. Other segments are
    /// not verified, for speed (they are most of the bytes); the receiver drops them if
    /// corrupted. Inlined so that the segment is built where its caller keeps it:
    /// returned through memory, it was copied in 16-byte moves that waited for its
    /// narrower stores.
    #[inline]
    pub(crate) fn read(pkt: &Packet, parsed: &Parsed) -> Option<Segment> {
        let l4 = pkt.data.get(parsed.l4_off..parsed.ip_end)?;
        if l4.len() < 20 {
            return None;
        }
        let doff = usize::from(l4[12] >> 4) * 4;
        if doff < 20 || doff > l4.len() {
            return None;
        }
        let flags = l4[13];
        let payload = (l4.len() - doff) as u32;
        let len = payload + u32::from(flags & SYN != 0) + u32::from(flags & FIN != 0);
        // One test on the flags for both the checksum and the window scale, so that a
        // segment with none of them (an ACK, data) pays nothing for either.
        let wscale = if flags & (SYN | FIN | RST) != 0 {
            if !checksum_ok(pkt, parsed, l4) {
                return None;
            }
            if flags & SYN != 0 {
                window_scale(&l4[20..doff])
            } else {
                None
            }
        } else {
            None
        };
        Some(Segment {
            seq: u32::from_be_bytes([l4[4], l4[5], l4[6], l4[7]]),
            ack: u32::from_be_bytes([l4[8], l4[9], l4[10], l4[11]]),
            win: u16::from_be_bytes([l4[14], l4[15]]),
            flags,
            len,
            wscale,
        })
    }
}

/// True when the checksum of the TCP segment `l4` of `pkt` is right, or need not be
/// verified: when the packet's virtio-net header says it is partial (`NEEDS_CSUM`: a
/// local sender left it to offload, and nobody verifies it, as Linux exempts
/// `CHECKSUM_PARTIAL`) or already verified (`DATA_VALID`).
#[cold]
fn checksum_ok(pkt: &Packet, parsed: &Parsed, l4: &[u8]) -> bool {
    let v = pkt.meta.vnet;
    if v.flags & (VnetHdr::F_NEEDS_CSUM | VnetHdr::F_DATA_VALID) != 0 {
        return true;
    }
    let ip = &pkt.data[parsed.l3_off..];
    let pseudo = checksum::pseudo_header(ip, parsed.l3 == L3::Ipv6, proto::TCP, l4.len());
    checksum::verify(l4, pseudo)
}

/// The window scale option among TCP options, clamped to 14 (RFC 7323).
fn window_scale(mut opts: &[u8]) -> Option<u8> {
    while let [kind, rest @ ..] = opts {
        match kind {
            0 => return None,
            1 => opts = rest,
            _ => {
                let len = usize::from(*rest.first()?);
                if len < 2 || len > opts.len() {
                    return None;
                }
                if *kind == 3 && len == 3 {
                    return Some(opts[2].min(MAX_WSCALE));
                }
                opts = &opts[len..];
            }
        }
    }
    None
}

/// Flag combinations a well-behaved stack sends (PSH, ECE and CWR aside); others are
/// INVALID whatever the state.
fn valid_flags(flags: u8) -> bool {
    const VALID: [u8; 9] = [
        SYN,
        SYN | URG,
        SYN | ACK,
        RST,
        RST | ACK,
        FIN | ACK,
        FIN | ACK | URG,
        ACK,
        ACK | URG,
    ];
    VALID.contains(&(flags & !(PSH | ECE | CWR)))
}

/// The segment class that indexes the state table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Syn,
    SynAck,
    Fin,
    Ack,
    Rst,
}

fn class(flags: u8) -> Class {
    if flags & RST != 0 {
        Class::Rst
    } else if flags & SYN != 0 {
        if flags & ACK != 0 {
            Class::SynAck
        } else {
            Class::Syn
        }
    } else if flags & FIN != 0 {
        Class::Fin
    } else {
        Class::Ack
    }
}

/// What the state table says about a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    To(TcpState),
    /// Let through without touching the connection (retransmitted SYN-ACK, a SYN on an
    /// established connection whose challenge ACK must get through).
    Ignore,
    Invalid,
    /// A SYN on a closed or TIME_WAIT connection: the old one ends, a new one starts.
    Reopen,
}

/// The state table, per direction, segment class and current state.
fn next(dir: usize, c: Class, s: TcpState) -> Next {
    use Next::{Ignore as Ig, Invalid as Iv, Reopen, To};
    use TcpState::*;
    match (c, s) {
        (Class::Rst, _) => To(Close),
        (Class::Syn, SynSent) if dir == 0 => To(SynSent),
        (Class::Syn, SynSent) => Ig, // simultaneous open
        (Class::Syn, TimeWait) => Reopen,
        (Class::Syn, Close) if dir == 0 => Reopen,
        (Class::Syn, _) if dir == 0 => Ig,
        (Class::Syn, _) => Iv,
        (Class::SynAck, SynSent) if dir == 1 => To(SynRecv),
        (Class::SynAck, SynRecv) if dir == 0 => To(SynRecv),
        (Class::SynAck, SynSent) => Iv,
        (Class::SynAck, _) if dir == 1 => Ig,
        (Class::SynAck, _) => Iv,
        (Class::Fin, SynSent) => Iv,
        (Class::Fin, SynRecv | Established) => To(FinWait),
        (Class::Fin, FinWait | CloseWait | LastAck) => To(LastAck),
        (Class::Fin, TimeWait) => To(TimeWait),
        (Class::Fin, Close) => To(Close),
        (Class::Ack, SynSent) if dir == 0 => Iv,
        (Class::Ack, SynSent) => Ig,
        (Class::Ack, SynRecv) if dir == 0 => To(Established),
        (Class::Ack, SynRecv) => To(SynRecv),
        (Class::Ack, Established) => To(Established),
        (Class::Ack, FinWait | CloseWait) => To(CloseWait),
        (Class::Ack, LastAck | TimeWait) => To(TimeWait),
        (Class::Ack, Close) => To(Close),
    }
}

/// What an RST does to a connection, before its window check (see the module
/// documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rst {
    /// It closes the connection.
    Close,
    /// It is let through, and the connection keeps its state.
    Keep,
    /// It is INVALID.
    Invalid,
}

/// `a` comes before `b` in sequence space.
#[inline]
fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// `a` comes after `b` in sequence space.
#[inline]
fn after(a: u32, b: u32) -> bool {
    before(b, a)
}

/// A SYN let through without tracking ([`Verdict::Ignore`]: a SYN on a live connection),
/// what Linux keeps of it (`last_dir`, `last_end`, `last_win`, `last_wscale`) so that the
/// SYN-ACK answering it can resynchronise the connection ([`TcpConn::resync`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IgnoredSyn {
    /// Its direction.
    dir: u8,
    /// Its window scale option.
    wscale: Option<u8>,
    /// Its window (never scaled in a SYN).
    win: u16,
    /// Its sequence number plus its length: what a SYN-ACK answering it acknowledges.
    end: u32,
}

impl IgnoredSyn {
    /// What an ignored segment in direction `dir` leaves to remember: `Some` for a SYN.
    /// Any other ignored segment replaces the memory with nothing, as in Linux.
    pub(crate) fn of(dir: usize, seg: &Segment) -> Option<IgnoredSyn> {
        (class(seg.flags) == Class::Syn).then_some(IgnoredSyn {
            dir: dir as u8,
            wscale: seg.wscale,
            win: seg.win,
            end: seg.seq.wrapping_add(seg.len),
        })
    }
}

/// What tracking says about a segment of a known connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Accepted; the connection was updated (its state may have changed).
    Accept,
    /// Accepted: the originator's SYN again in SYN_SENT. Linux does not renew the
    /// timeout for it before a reply was seen.
    SynAgain,
    /// Accepted: an RST (the connection is CLOSE). Linux removes the connection at once
    /// when no reply was seen before it.
    Reset,
    /// Accepted: an RST in window but off the exact sequence number, on an ESTABLISHED
    /// connection (see the module documentation). It goes through, so that its receiver
    /// can answer with a challenge ACK (RFC 5961); the connection keeps its state and
    /// windows, and has CLOSE's timeout until its next segment.
    ResetKept,
    /// Let through untracked: nothing was updated, and nothing in the entry (status,
    /// timeout, counters) is.
    Ignore,
    /// Invalid; nothing was updated.
    Invalid,
    /// The segment starts a new connection in place of this closed one.
    Reopen,
}

impl TcpConn {
    /// The connection a first segment creates: SYN_SENT for a SYN, ESTABLISHED with
    /// liberal windows for a mid-stream segment when `pickup` allows it, else `None`
    /// (INVALID: a SYN-ACK, FIN or RST without a connection, or pickup off).
    pub(crate) fn new(seg: &Segment, pickup: bool) -> Option<TcpConn> {
        if !valid_flags(seg.flags) {
            return None;
        }
        let end = seg.seq.wrapping_add(seg.len);
        let win = u32::from(seg.win).max(1);
        match class(seg.flags) {
            Class::Syn => Some(TcpConn::opened(0, end, win, seg.wscale)),
            Class::Ack if pickup => {
                // The scales were in SYNs we never saw: assume the largest, so that real
                // windows fit, while sequence numbers far off the stream still fail.
                let maxwin = (win << MAX_WSCALE).max(1);
                Some(TcpConn {
                    state: TcpState::Established,
                    end: [end, 0],
                    maxend: [end.wrapping_add(maxwin), 0],
                    maxwin: [maxwin, 0],
                    scale: [MAX_WSCALE; 2],
                    flags: both(F_LIBERAL | F_WSCALE),
                })
            }
            _ => None,
        }
    }

    /// A connection in SYN_SENT after a SYN from direction `dir` that ends at `end` with
    /// window `win` (at least 1) and the window scale option `wscale`; the other side not
    /// seen yet.
    fn opened(dir: usize, end: u32, win: u32, wscale: Option<u8>) -> TcpConn {
        let mut c = TcpConn {
            state: TcpState::SynSent,
            end: [0; 2],
            maxend: [0; 2],
            maxwin: [0; 2],
            scale: [0; 2],
            flags: 0,
        };
        c.end[dir] = end;
        c.maxend[dir] = end;
        c.maxwin[dir] = win;
        c.set_flag(dir, F_UNACK);
        if let Some(s) = wscale {
            c.scale[dir] = s;
            c.set_flag(dir, F_WSCALE);
        }
        c
    }

    /// Tracks a segment in direction `dir` (0 original, 1 reply). On any verdict other
    /// than `Accept` the connection is unchanged.
    pub(crate) fn packet(&mut self, dir: usize, seg: &Segment) -> Verdict {
        if !valid_flags(seg.flags) {
            return Verdict::Invalid;
        }
        let cl = class(seg.flags);
        let new_state = match next(dir, cl, self.state) {
            Next::Invalid => return Verdict::Invalid,
            Next::Ignore => return Verdict::Ignore,
            Next::Reopen => return Verdict::Reopen,
            Next::To(s) => s,
        };
        let keep = if cl == Class::Rst {
            match self.reset(dir, seg.seq) {
                Rst::Invalid => return Verdict::Invalid,
                Rst::Keep => true,
                Rst::Close => false,
            }
        } else {
            false
        };
        let mut c = *self;
        if !c.in_window(dir, seg) {
            return Verdict::Invalid;
        }
        if keep {
            // The windows stay as they were: an RST carries no data, and one off the
            // exact number may come from anyone who guessed the window.
            self.flags |= RST_KEPT;
            return Verdict::ResetKept;
        }
        let old_state = self.state;
        c.state = new_state;
        c.flags &= !RST_KEPT;
        *self = c;
        match cl {
            Class::Rst => Verdict::Reset,
            Class::Syn if old_state == TcpState::SynSent => Verdict::SynAgain,
            _ => Verdict::Accept,
        }
    }

    /// What an RST from direction `dir` with sequence number `seq` does, before its
    /// window check: the rules of the module documentation, with the sender's `end` as
    /// the exact number.
    fn reset(&self, dir: usize, seq: u32) -> Rst {
        let s = dir;
        if self.maxwin[s] == 0 || self.flag(s, F_LIBERAL) || seq == self.end[s] {
            // Nothing seen from the sender to compare with, a view of the stream that may
            // lag behind, or the exact number.
            return Rst::Close;
        }
        if before(seq, self.end[s]) && !self.flag(s, F_UNACK) {
            // Behind what the receiver acknowledged: no endpoint of this connection.
            return Rst::Invalid;
        }
        // ESTABLISHED on a connection seen from its SYN: the handshake was seen both
        // ways, so the entry is assured (Linux keeps the state only then).
        if self.state == TcpState::Established {
            Rst::Keep
        } else {
            Rst::Close
        }
    }

    /// A segment in direction `dir` that [`TcpConn::packet`] said to ignore, given the
    /// last segment ignored before it, `syn`: when that was a SYN from the other direction
    /// and this is a SYN-ACK acknowledging exactly its end, both ends agree on a new
    /// connection that this one missed (a client restarted and reused the tuple of a stale
    /// ESTABLISHED connection, and the server had no socket left for it). As Linux does,
    /// the connection starts again from that SYN, as if seen in SYN_SENT, and the SYN-ACK
    /// takes it to SYN_RECV; it is then tracked as a connection seen from its SYN (no
    /// longer liberal). `Accept` when it did; otherwise `Ignore`, the connection unchanged
    /// (a server that still has the old connection answers the SYN with a challenge ACK,
    /// and the old connection goes on).
    pub(crate) fn resync(&mut self, dir: usize, seg: &Segment, syn: &IgnoredSyn) -> Verdict {
        let from = usize::from(syn.dir);
        if class(seg.flags) != Class::SynAck || from == dir || seg.ack != syn.end {
            return Verdict::Ignore;
        }
        let win = u32::from(syn.win).max(1);
        let mut c = TcpConn::opened(from, syn.end, win, syn.wscale);
        // In window by construction (the other side is new, and the SYN-ACK acknowledges
        // exactly the SYN's end); checked all the same, for the windows it sets.
        if !c.in_window(dir, seg) {
            return Verdict::Ignore;
        }
        c.state = TcpState::SynRecv;
        *self = c;
        Verdict::Accept
    }

    /// Checks a segment against the windows and, when in window, updates them.
    fn in_window(&mut self, dir: usize, seg: &Segment) -> bool {
        let (s, r) = (dir, 1 - dir);
        let mut seq = seg.seq;
        let mut end = seg.seq.wrapping_add(seg.len);
        let syn = seg.flags & SYN != 0;
        let has_ack = seg.flags & ACK != 0;
        let rst = seg.flags & RST != 0;
        let mut win = u32::from(seg.win);

        if self.maxwin[s] == 0 {
            // First segment from this side.
            if syn {
                self.end[s] = end;
                self.maxwin[s] = win.max(1);
                self.maxend[s] = end.wrapping_add(self.maxwin[s]);
                self.set_flag(s, F_UNACK);
                if let Some(sc) = seg.wscale {
                    self.scale[s] = sc;
                    self.set_flag(s, F_WSCALE);
                }
                // RFC 7323: scaling applies only when both SYNs carried the option.
                if !(self.flag(s, F_WSCALE) && self.flag(r, F_WSCALE)) {
                    self.scale = [0; 2];
                }
                if !has_ack {
                    return true;
                }
            } else {
                self.end[s] = end;
                let swin = (win << self.scale[s]).max(1);
                self.maxwin[s] = swin;
                self.maxend[s] = end.wrapping_add(swin);
                if self.maxwin[r] == 0 {
                    self.end[r] = seg.ack;
                    self.maxend[r] = seg.ack;
                } else if seg.ack == self.end[r].wrapping_add(1) {
                    // Likely the answer to a keepalive probe.
                    self.end[r] = self.end[r].wrapping_add(1);
                }
            }
        } else if syn
            && after(end, self.end[s])
            && ((self.state == TcpState::SynSent && dir == 0)
                || (self.state == TcpState::SynRecv && dir == 1))
        {
            // A retransmitted SYN (or SYN-ACK) with a new initial sequence number.
            self.end[s] = end;
            self.maxend[s] = end;
            self.maxwin[s] = win.max(1);
            self.set_flag(s, F_UNACK);
            if let Some(sc) = seg.wscale {
                self.scale[s] = sc;
                self.set_flag(s, F_WSCALE);
            }
        }

        let mut ack = seg.ack;
        if !has_ack || (rst && ack == 0) {
            // No acknowledgement (or a broken stack's RST with ACK and zero ack): treat
            // as acknowledging everything.
            ack = self.end[r];
        }
        if rst && seq == 0 && self.state == TcpState::SynSent {
            // An RST answering a SYN.
            seq = self.end[s];
            end = seq;
        }

        let max_ack_win = self.maxwin[s].max(MIN_ACK_WINDOW);
        let ok = before(seq, self.maxend[s].wrapping_add(1))
            && after(
                end,
                self.end[s].wrapping_sub(self.maxwin[r]).wrapping_sub(1),
            )
            && before(ack, self.end[r].wrapping_add(1))
            && after(ack, self.end[r].wrapping_sub(max_ack_win).wrapping_sub(1));

        if ok {
            if !syn {
                win <<= self.scale[s];
            }
            self.maxwin[s] = self.maxwin[s].max(win);
            if after(end, self.end[s]) {
                self.end[s] = end;
                self.set_flag(s, F_UNACK);
            }
            if self.maxwin[r] != 0 && after(end, self.maxend[s]) {
                self.maxwin[r] = self.maxwin[r].wrapping_add(end.wrapping_sub(self.maxend[s]));
            }
            let edge = ack.wrapping_add(win);
            if after(edge, self.maxend[r].wrapping_sub(1)) {
                self.maxend[r] = if win == 0 { edge.wrapping_add(1) } else { edge };
            }
            if ack == self.end[r] {
                self.clear_flag(r, F_UNACK);
            }
            true
        } else {
            self.flag(s, F_LIBERAL)
        }
    }

    /// True when direction `dir` has the per-direction flag `f`.
    #[inline]
    fn flag(&self, dir: usize, f: u8) -> bool {
        self.flags & (f << (FLAG_BITS * dir)) != 0
    }

    /// Sets the per-direction flag `f` of direction `dir`.
    #[inline]
    fn set_flag(&mut self, dir: usize, f: u8) {
        self.flags |= f << (FLAG_BITS * dir);
    }

    /// Clears the per-direction flag `f` of direction `dir`.
    #[inline]
    fn clear_flag(&mut self, dir: usize, f: u8) {
        self.flags &= !(f << (FLAG_BITS * dir));
    }

    /// True when out-of-window segments are let through: the connection was picked up
    /// mid-stream.
    pub fn liberal(&self) -> bool {
        self.flag(0, F_LIBERAL)
    }

    /// True when either side sent data (or a SYN or FIN) that the other side has not
    /// acknowledged yet, as far as the segments seen tell: the connection's timeout is
    /// then at most `Timeouts::tcp_unacknowledged_ns`.
    #[inline]
    pub fn unacknowledged(&self) -> bool {
        self.flags & both(F_UNACK) != 0
    }

    /// True when the last segment tracked was an RST let through without closing the
    /// connection: the connection's timeout is then at most `Timeouts::tcp_close_ns`.
    #[inline]
    pub fn reset_kept(&self) -> bool {
        self.flags & RST_KEPT != 0
    }

    /// The flags of direction `dir`, by meaning: the window scale option was in its
    /// SYN, its segments pass without window checks (picked up mid-stream), it has data
    /// the other side has not acknowledged. For a saved state (`handover`).
    pub(crate) fn side_flags(&self, dir: usize) -> SideFlags {
        SideFlags {
            window_scale: self.flag(dir, F_WSCALE),
            liberal: self.flag(dir, F_LIBERAL),
            unacknowledged: self.flag(dir, F_UNACK),
        }
    }

    /// A connection's TCP state as a saved state gives it (`handover`): every field, the
    /// flags of each direction by meaning.
    pub(crate) fn restored(
        state: TcpState,
        scale: [u8; 2],
        end: [u32; 2],
        maxend: [u32; 2],
        maxwin: [u32; 2],
        sides: [SideFlags; 2],
        reset_kept: bool,
    ) -> TcpConn {
        let mut c = TcpConn {
            state,
            scale,
            flags: if reset_kept { RST_KEPT } else { 0 },
            end,
            maxend,
            maxwin,
        };
        for (dir, f) in sides.iter().enumerate() {
            for (on, bit) in [
                (f.window_scale, F_WSCALE),
                (f.liberal, F_LIBERAL),
                (f.unacknowledged, F_UNACK),
            ] {
                if on {
                    c.set_flag(dir, bit);
                }
            }
        }
        c
    }

    /// Forgets the windows, as a connection of a stale state needs (a checkpoint restored
    /// after a crash, `handover`: both sides sent and acknowledged more since, unseen).
    /// The connection then starts as one picked up mid-stream: each side's window is
    /// learnt again from its next segment, and its segments pass without window checks
    /// for the connection's lifetime. What still holds stays: the state, the window
    /// scales the SYNs agreed, and the flags of unacknowledged data and of a kept RST
    /// (they bound the timeout; the next segments each way set them right).
    pub(crate) fn forget_windows(&mut self) {
        self.end = [0; 2];
        self.maxend = [0; 2];
        self.maxwin = [0; 2];
        self.flags |= both(F_LIBERAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(seq: u32, ack: u32, flags: u8, payload: u32) -> Segment {
        let len = payload + u32::from(flags & SYN != 0) + u32::from(flags & FIN != 0);
        Segment {
            seq,
            ack,
            win: 65535,
            flags,
            len,
            wscale: None,
        }
    }

    #[test]
    fn window_scale_option_is_found_among_others() {
        // MSS 1460, NOP, window scale 7, SACK permitted, end.
        let opts = [2, 4, 5, 0xb4, 1, 3, 3, 7, 4, 2, 0, 0];
        assert_eq!(window_scale(&opts), Some(7));
        assert_eq!(window_scale(&[3, 3, 20]), Some(14));
        assert_eq!(
            window_scale(&[2, 0]),
            None,
            "a zero option length ends parsing"
        );
        assert_eq!(window_scale(&[2, 40, 0]), None);
        assert_eq!(window_scale(&[]), None);
    }

    #[test]
    fn handshake_data_and_close_walk_the_states() {
        let mut c = TcpConn::new(&seg(1000, 0, SYN, 0), false).unwrap();
        assert_eq!(c.state, TcpState::SynSent);
        assert_eq!(c.packet(1, &seg(5000, 1001, SYN | ACK, 0)), Verdict::Accept);
        assert_eq!(c.state, TcpState::SynRecv);
        assert_eq!(c.packet(0, &seg(1001, 5001, ACK, 0)), Verdict::Accept);
        assert_eq!(c.state, TcpState::Established);
        assert!(!c.liberal(), "seen from its SYN: windows checked");
        assert_eq!(
            c.packet(0, &seg(1001, 5001, ACK | PSH, 100)),
            Verdict::Accept
        );
        assert_eq!(c.packet(1, &seg(5001, 1101, ACK, 0)), Verdict::Accept);
        assert_eq!(c.packet(0, &seg(1101, 5001, FIN | ACK, 0)), Verdict::Accept);
        assert_eq!(c.state, TcpState::FinWait);
        assert_eq!(c.packet(1, &seg(5001, 1102, ACK, 0)), Verdict::Accept);
        assert_eq!(c.state, TcpState::CloseWait);
        assert_eq!(c.packet(1, &seg(5001, 1102, FIN | ACK, 0)), Verdict::Accept);
        assert_eq!(c.state, TcpState::LastAck);
        assert_eq!(c.packet(0, &seg(1102, 5002, ACK, 0)), Verdict::Accept);
        assert_eq!(c.state, TcpState::TimeWait);
        assert_eq!(c.packet(0, &seg(9000, 0, SYN, 0)), Verdict::Reopen);
    }

    #[test]
    fn syn_again_and_rst_are_told_apart() {
        let mut c = TcpConn::new(&seg(1000, 0, SYN, 0), false).unwrap();
        assert_eq!(c.packet(0, &seg(1000, 0, SYN, 0)), Verdict::SynAgain);
        assert_eq!(c.state, TcpState::SynSent);
        assert_eq!(c.packet(1, &seg(0, 1001, RST | ACK, 0)), Verdict::Reset);
        assert_eq!(c.state, TcpState::Close);
        // A SYN on an established connection is only let through.
        let mut c = TcpConn::new(&seg(1000, 0, SYN, 0), false).unwrap();
        c.packet(1, &seg(5000, 1001, SYN | ACK, 0));
        c.packet(0, &seg(1001, 5001, ACK, 0));
        assert_eq!(c.packet(0, &seg(1001, 0, SYN, 0)), Verdict::Ignore);
        assert_eq!(c.packet(0, &seg(1001, 5001, RST, 0)), Verdict::Reset);
    }

    /// Client ISN 1000, server ISN 5000, handshake done: ESTABLISHED with both ends at
    /// their SYN plus one and nothing unacknowledged.
    fn established() -> TcpConn {
        let mut c = TcpConn::new(&seg(1000, 0, SYN, 0), false).unwrap();
        assert_eq!(c.packet(1, &seg(5000, 1001, SYN | ACK, 0)), Verdict::Accept);
        assert_eq!(c.packet(0, &seg(1001, 5001, ACK, 0)), Verdict::Accept);
        assert_eq!(c.state, TcpState::Established);
        c
    }

    /// RFC 5961 as in Linux: an RST in window off the exact number is let through for
    /// the receiver's challenge ACK and closes nothing; the sender, if really gone,
    /// answers the challenge ACK with an RST at the exact number, which closes.
    #[test]
    fn rst_in_window_but_off_the_exact_sequence_keeps_the_connection() {
        let mut c = established();
        let before = c;
        // In the server's window (the client allowed up to 5001 + 65535), past its end.
        assert_eq!(c.packet(1, &seg(6001, 0, RST, 0)), Verdict::ResetKept);
        assert_eq!(c.state, TcpState::Established);
        assert!(c.reset_kept());
        assert_eq!(
            (c.end, c.maxend, c.maxwin, c.unacknowledged()),
            (before.end, before.maxend, before.maxwin, false),
            "windows untouched"
        );
        assert_eq!(
            c.packet(1, &seg(6001, 1001, RST | ACK, 0)),
            Verdict::ResetKept
        );
        // The challenge ACK.
        assert_eq!(c.packet(0, &seg(1001, 5001, ACK, 0)), Verdict::Accept);
        assert!(!c.reset_kept());
        assert_eq!(c, before);
        assert_eq!(c.packet(1, &seg(5001, 0, RST, 0)), Verdict::Reset);
        assert_eq!(c.state, TcpState::Close);
        assert!(!c.reset_kept());
    }

    /// An RST behind what its receiver acknowledged comes from no endpoint of the
    /// connection (Linux: before `td_maxack`); one out of window is INVALID as before.
    #[test]
    fn rst_before_what_its_receiver_acknowledged_is_invalid() {
        let mut c = established();
        assert_eq!(
            c.packet(1, &seg(5001, 1001, ACK | PSH, 100)),
            Verdict::Accept
        );
        assert_eq!(c.packet(0, &seg(1001, 5101, ACK, 0)), Verdict::Accept);
        let before = c;
        for s in [
            seg(5051, 0, RST, 0),
            seg(5100, 1001, RST | ACK, 0),
            seg(5101 + 2_000_000_000, 0, RST, 0),
        ] {
            assert_eq!(c.packet(1, &s), Verdict::Invalid, "{s:?}");
            assert_eq!(c, before, "{s:?}");
        }
        assert_eq!(c.packet(1, &seg(5101, 0, RST, 0)), Verdict::Reset);
    }

    /// Data then an RST at its end (Linux's "train": an abort after a write) closes
    /// before the receiver acknowledged the data; an RST inside that data, which Linux
    /// may find at the receiver's last acknowledgement, is kept.
    #[test]
    fn rst_right_after_data_closes_and_inside_it_is_kept() {
        let mut c = established();
        assert_eq!(
            c.packet(1, &seg(5001, 1001, ACK | PSH, 100)),
            Verdict::Accept
        );
        assert!(c.unacknowledged());
        let mut kept = c;
        assert_eq!(kept.packet(1, &seg(5051, 0, RST, 0)), Verdict::ResetKept);
        assert_eq!(kept.state, TcpState::Established);
        assert_eq!(c.packet(1, &seg(5101, 1001, RST | ACK, 0)), Verdict::Reset);
        assert_eq!(c.state, TcpState::Close);
    }

    /// Linux keeps the state only in ESTABLISHED: elsewhere an RST closes unless it is
    /// INVALID, and one that is the first segment from its sender (the answer to a SYN)
    /// closes.
    #[test]
    fn rst_outside_established_closes_unless_invalid() {
        let mut c = TcpConn::new(&seg(1000, 0, SYN, 0), false).unwrap();
        assert_eq!(c.packet(1, &seg(0, 1001, RST | ACK, 0)), Verdict::Reset);
        // SYN_RECV: the server's SYN-ACK acknowledged the client's SYN.
        let mut c = TcpConn::new(&seg(1000, 0, SYN, 0), false).unwrap();
        assert_eq!(c.packet(1, &seg(5000, 1001, SYN | ACK, 0)), Verdict::Accept);
        let syn_recv = c;
        assert_eq!(c.packet(0, &seg(1000, 0, RST, 0)), Verdict::Invalid);
        assert_eq!(c.packet(0, &seg(1500, 0, RST, 0)), Verdict::Reset);
        // Nothing from the client acknowledged the SYN-ACK yet.
        let mut c = syn_recv;
        assert_eq!(c.packet(1, &seg(4990, 0, RST, 0)), Verdict::Reset);
        // FIN_WAIT, the FIN not yet acknowledged.
        let mut c = established();
        assert_eq!(c.packet(0, &seg(1001, 5001, FIN | ACK, 0)), Verdict::Accept);
        assert_eq!(c.state, TcpState::FinWait);
        let fin_wait = c;
        assert_eq!(c.packet(1, &seg(4000, 0, RST, 0)), Verdict::Invalid);
        assert_eq!(c.packet(1, &seg(6001, 0, RST, 0)), Verdict::Reset);
        let mut c = fin_wait;
        assert_eq!(c.packet(0, &seg(1001, 0, RST, 0)), Verdict::Reset);
    }

    /// A connection picked up mid-stream missed what was sent before the restart, so the
    /// sender's end it knows may lag behind the number a real RST carries: any RST closes
    /// it, as before.
    #[test]
    fn picked_up_connection_closes_on_any_rst() {
        let mut c = TcpConn::new(&seg(1000, 5000, ACK | PSH, 10), true).unwrap();
        assert_eq!(c.packet(1, &seg(5000, 1010, ACK, 0)), Verdict::Accept);
        let picked = c;
        for (dir, s) in [
            (0, seg(90_000, 5000, RST | ACK, 0)),
            (0, seg(900, 0, RST, 0)),
            (1, seg(7000, 0, RST, 0)),
        ] {
            let mut c = picked;
            assert_eq!(c.packet(dir, &s), Verdict::Reset, "{s:?}");
            assert_eq!(c.state, TcpState::Close);
        }
    }

    /// Linux's DATA_UNACKNOWLEDGED: a side has unacknowledged data from the segment that
    /// moves its end forward until the other side acknowledges exactly that end.
    #[test]
    fn data_is_unacknowledged_until_the_other_side_acknowledges_all_of_it() {
        let mut c = TcpConn::new(&seg(1000, 0, SYN, 0), false).unwrap();
        assert!(c.flag(0, F_UNACK), "the SYN, until the SYN-ACK");
        assert_eq!(c.packet(1, &seg(5000, 1001, SYN | ACK, 0)), Verdict::Accept);
        assert!(!c.flag(0, F_UNACK) && c.flag(1, F_UNACK));
        assert_eq!(c.packet(0, &seg(1001, 5001, ACK, 0)), Verdict::Accept);
        assert!(!c.unacknowledged(), "the handshake acknowledged both SYNs");
        assert_eq!(
            c.packet(0, &seg(1001, 5001, ACK | PSH, 100)),
            Verdict::Accept
        );
        assert!(c.flag(0, F_UNACK) && !c.flag(1, F_UNACK));
        assert_eq!(c.packet(1, &seg(5001, 1051, ACK, 0)), Verdict::Accept);
        assert!(c.unacknowledged(), "half of it acknowledged");
        assert_eq!(
            c.packet(0, &seg(1051, 5001, ACK | PSH, 50)),
            Verdict::Accept
        );
        assert_eq!(c.packet(1, &seg(5001, 1101, ACK, 0)), Verdict::Accept);
        assert!(!c.unacknowledged(), "all of it acknowledged");
        // A keepalive probe (one sequence number back) moves nothing forward.
        assert_eq!(c.packet(0, &seg(1100, 5001, ACK, 0)), Verdict::Accept);
        assert!(!c.unacknowledged());
        // Nor does a segment out of window.
        let before = c;
        assert_eq!(
            c.packet(0, &seg(1101 + 3_000_000, 5001, ACK, 10)),
            Verdict::Invalid
        );
        assert_eq!(c, before);
        // A FIN is acknowledged like data.
        assert_eq!(c.packet(1, &seg(5001, 1101, FIN | ACK, 0)), Verdict::Accept);
        assert!(c.flag(1, F_UNACK));
        assert_eq!(c.packet(0, &seg(1101, 5002, ACK, 0)), Verdict::Accept);
        assert!(!c.unacknowledged());
    }

    /// As in Linux, the segment a connection is picked up from and the first one from the
    /// other side leave the flags clear (either may be a pure ACK nothing acknowledges);
    /// data after them is tracked as on any connection.
    #[test]
    fn picked_up_connection_tracks_unacknowledged_data_after_its_first_segments() {
        let mut c = TcpConn::new(&seg(1000, 5000, ACK | PSH, 10), true).unwrap();
        assert!(!c.unacknowledged());
        assert_eq!(c.packet(1, &seg(5000, 1010, ACK, 0)), Verdict::Accept);
        assert!(!c.unacknowledged());
        assert_eq!(
            c.packet(1, &seg(5000, 1010, ACK | PSH, 20)),
            Verdict::Accept
        );
        assert!(c.flag(1, F_UNACK) && !c.flag(0, F_UNACK));
        assert_eq!(c.packet(0, &seg(1010, 5020, ACK, 0)), Verdict::Accept);
        assert!(!c.unacknowledged());
        // A duplicate ACK beyond what was seen (data sent before the restart) is let
        // through, liberal, and neither sets nor clears anything.
        assert_eq!(
            c.packet(0, &seg(1010, 5020, ACK | PSH, 10)),
            Verdict::Accept
        );
        assert!(c.flag(0, F_UNACK));
        assert_eq!(c.packet(1, &seg(5020, 900_000, ACK, 0)), Verdict::Accept);
        assert!(c.flag(0, F_UNACK));
    }

    /// Linux's resynchronisation: a stale connection (here picked up mid-stream) meets a
    /// new one on its tuple; the SYN-ACK that acknowledges the ignored SYN restarts it.
    #[test]
    fn syn_ack_answering_the_ignored_syn_resyncs() {
        let mut c = TcpConn::new(&seg(1000, 5000, ACK, 10), true).unwrap();
        let syn = Segment {
            wscale: Some(7),
            win: 1000,
            ..seg(77_000_000, 0, SYN, 0)
        };
        assert_eq!(c.packet(0, &syn), Verdict::Ignore);
        let last = IgnoredSyn::of(0, &syn).unwrap();
        let stale = c;
        // Not the answer: another ack, the same direction as the SYN, not a SYN-ACK.
        for (dir, s) in [
            (1, seg(5000, 1010, SYN | ACK, 0)),
            (0, seg(9_000_000, 77_000_001, SYN | ACK, 0)),
            (1, seg(5000, 77_000_001, ACK, 0)),
        ] {
            assert_eq!(c.resync(dir, &s, &last), Verdict::Ignore, "{s:?}");
            assert_eq!(c, stale);
        }
        let synack = Segment {
            wscale: Some(8),
            ..seg(9_000_000, 77_000_001, SYN | ACK, 0)
        };
        assert_eq!(c.packet(1, &synack), Verdict::Ignore);
        assert_eq!(IgnoredSyn::of(1, &synack), None, "only a SYN is remembered");
        assert_eq!(c.resync(1, &synack, &last), Verdict::Accept);
        assert_eq!(c.state, TcpState::SynRecv);
        assert_eq!(c.end, [77_000_001, 9_000_001]);
        assert_eq!(c.scale, [7, 8]);
        assert!(!c.liberal(), "seen from its SYN now");
        assert_eq!(
            c.packet(0, &seg(77_000_001, 9_000_001, ACK, 0)),
            Verdict::Accept
        );
        assert_eq!(c.state, TcpState::Established);
        assert_eq!(
            c.packet(0, &seg(1010, 5000, ACK, 10)),
            Verdict::Invalid,
            "the stale connection's sequence numbers are out of window now"
        );
    }

    /// A connection whose windows were forgotten (a stale state) takes both sides'
    /// next segments, far past what it saw, and learns its windows from them as a
    /// picked-up connection does; its state, scales and unacknowledged data stay.
    #[test]
    fn forgotten_windows_are_learnt_again_from_the_next_segments() {
        let mut c = established();
        c.scale = [7, 7];
        c.set_flag(0, F_WSCALE);
        c.set_flag(1, F_WSCALE);
        assert_eq!(
            c.packet(0, &seg(1001, 5001, ACK | PSH, 100)),
            Verdict::Accept
        );
        let (far0, far1) = (1101 + 1_000_000, 5001 + 1_000_000);
        let next = [
            (0, seg(far0, far1, ACK | PSH, 1000)),
            (1, seg(far1, far0 + 1000, ACK | PSH, 500)),
            (0, seg(far0 + 1000, far1 + 500, ACK, 0)),
        ];
        let mut kept = c;
        assert_eq!(kept.packet(next[0].0, &next[0].1), Verdict::Invalid);
        c.forget_windows();
        assert!(c.liberal());
        assert_eq!(
            (c.state, c.scale, c.unacknowledged()),
            (TcpState::Established, [7, 7], true)
        );
        for (dir, s) in next {
            assert_eq!(c.packet(dir, &s), Verdict::Accept, "{s:?}");
        }
        assert_eq!(c.end, [far0 + 1000, far1 + 500]);
        assert_eq!(
            c.maxwin,
            [65535 << 7; 2],
            "windows scaled as the SYNs agreed"
        );
        assert!(
            !c.unacknowledged(),
            "each side acknowledged all of the other"
        );
        assert_eq!(c.state, TcpState::Established);
        assert_eq!(c.packet(1, &seg(far1 + 77, 0, RST, 0)), Verdict::Reset);
    }

    /// Handshake with the given window scale options; the server then advertises a
    /// window of 1000 (unscaled value) and the client sends 10 bytes 100000 bytes ahead.
    fn far_segment_after_handshake(client: Option<u8>, server: Option<u8>) -> Verdict {
        let syn = Segment {
            wscale: client,
            ..seg(1000, 0, SYN, 0)
        };
        let mut c = TcpConn::new(&syn, false).unwrap();
        let synack = Segment {
            wscale: server,
            win: 1000,
            ..seg(5000, 1001, SYN | ACK, 0)
        };
        assert_eq!(c.packet(1, &synack), Verdict::Accept);
        assert_eq!(c.packet(0, &seg(1001, 5001, ACK, 0)), Verdict::Accept);
        let ack = Segment {
            win: 1000,
            ..seg(5001, 1001, ACK, 0)
        };
        assert_eq!(c.packet(1, &ack), Verdict::Accept);
        c.packet(0, &seg(1001 + 100_000, 5001, ACK, 10))
    }

    #[test]
    fn window_scale_from_both_syns_widens_the_window() {
        // 1000 << 7 = 128000 bytes allowed.
        assert_eq!(
            far_segment_after_handshake(Some(7), Some(7)),
            Verdict::Accept
        );
        // One side without the option: no scaling either way (RFC 7323).
        assert_eq!(far_segment_after_handshake(Some(7), None), Verdict::Invalid);
        assert_eq!(far_segment_after_handshake(None, None), Verdict::Invalid);
    }

    #[test]
    fn bad_flag_combinations_are_invalid() {
        assert!(valid_flags(SYN));
        assert!(valid_flags(SYN | ACK | ECE | CWR));
        assert!(valid_flags(FIN | ACK | PSH));
        assert!(!valid_flags(SYN | FIN));
        assert!(!valid_flags(SYN | RST));
        assert!(!valid_flags(FIN));
        assert!(!valid_flags(0));
        assert!(TcpConn::new(&seg(1, 0, SYN | FIN, 0), true).is_none());
    }

    #[test]
    fn sequence_comparisons_wrap() {
        assert!(before(u32::MAX, 0));
        assert!(after(5, u32::MAX - 5));
        assert!(!before(7, 7));
    }
}
