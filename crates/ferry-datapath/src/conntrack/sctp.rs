//! SCTP: the association state machine and verification tags, in the spirit of
//! nf_conntrack's SCTP tracker.
//!
//! An association starts with an INIT (its verification tag zero) and is known from its
//! chunks: INIT, then INIT ACK from the other side (COOKIE_WAIT), COOKIE ECHO
//! (COOKIE_ECHOED), COOKIE ACK (ESTABLISHED); SHUTDOWN (SHUTDOWN_SENT), SHUTDOWN ACK
//! (SHUTDOWN_ACK_SENT), SHUTDOWN COMPLETE or an ABORT (CLOSED). Each direction's
//! verification tag is learnt from the Initiate Tag the other side announced (INIT's for
//! the reply direction, INIT ACK's for the original one), and every later packet must
//! carry its direction's tag (RFC 9260 section 8.5), except that an ABORT or SHUTDOWN
//! COMPLETE with the T bit carries the other direction's (8.5.1): a packet with another
//! tag is INVALID and changes nothing, so a blind sender cannot close or move an
//! association.
//!
//! Like Linux, an association seen first from a HEARTBEAT (one that started before this
//! tracker saw it: an agent restart without its checkpoint) is picked up in
//! HEARTBEAT_SENT with the HEARTBEAT's tag for its direction; the HEARTBEAT ACK of the
//! other side confirms it (ESTABLISHED) and gives the other tag. Its DATA in between is
//! let through, its tags learnt from the first packets of each direction. Any other
//! packet of no tracked association (DATA, an ABORT, a COOKIE ACK...) starts nothing and
//! is INVALID, as in Linux.
//!
//! An INIT on an association in any state but COOKIE_WAIT (an endpoint restarting, RFC
//! 9260 section 5.2.2) starts it again: COOKIE_WAIT, the reply tag the new one, the other
//! to learn. Simplifications against Linux: no SHUTDOWN_RECD state (a SHUTDOWN from
//! either side is SHUTDOWN_SENT), and the ESTABLISHED timeout holds in HEARTBEAT_SENT
//! once the association is confirmed both ways.

use serde::Serialize;

use crate::wire::sctp::{Packet, chunk};

/// An association's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SctpState {
    /// INIT seen, not yet its COOKIE ECHO.
    CookieWait,
    /// COOKIE ECHO seen, not yet its COOKIE ACK.
    CookieEchoed,
    /// Up.
    Established,
    /// A SHUTDOWN seen.
    ShutdownSent,
    /// A SHUTDOWN ACK seen.
    ShutdownAckSent,
    /// Picked up from a HEARTBEAT, not yet its ACK.
    HeartbeatSent,
    /// Ended (SHUTDOWN COMPLETE or ABORT).
    Closed,
}

impl SctpState {
    /// Its name, as conntrack listings show it.
    pub fn name(self) -> &'static str {
        match self {
            SctpState::CookieWait => "COOKIE_WAIT",
            SctpState::CookieEchoed => "COOKIE_ECHOED",
            SctpState::Established => "ESTABLISHED",
            SctpState::ShutdownSent => "SHUTDOWN_SENT",
            SctpState::ShutdownAckSent => "SHUTDOWN_ACK_SENT",
            SctpState::HeartbeatSent => "HEARTBEAT_SENT",
            SctpState::Closed => "CLOSED",
        }
    }
}

/// What tracking makes of a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// In the association: pass.
    Accept,
    /// Not of it (a tag that does not match, a chunk its state does not allow): drop,
    /// and change nothing.
    Invalid,
}

/// An SCTP association's tracking: its state and each direction's verification tag
/// (zero until learnt; a real tag is never zero, RFC 9260 section 5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SctpConn {
    /// Its state.
    pub state: SctpState,
    /// The tag packets of the original (0) and reply (1) directions carry.
    pub vtag: [u32; 2],
}

impl SctpConn {
    /// The association packet `p`, seen first, starts (in the original direction); None
    /// when it starts none (INVALID).
    pub fn new(p: &Packet) -> Option<SctpConn> {
        if p.has(chunk::INIT) {
            // An INIT carries tag zero, and announces the tag the reply direction uses.
            let tag = p.initiate_tag.filter(|&t| t != 0)?;
            return (p.vtag == 0).then_some(SctpConn {
                state: SctpState::CookieWait,
                vtag: [0, tag],
            });
        }
        (p.has(chunk::HEARTBEAT) && p.vtag != 0).then_some(SctpConn {
            state: SctpState::HeartbeatSent,
            vtag: [p.vtag, 0],
        })
    }

    /// A restored association.
    pub fn restored(state: SctpState, vtag: [u32; 2]) -> SctpConn {
        SctpConn { state, vtag }
    }

    /// Tracks packet `p` of direction `dir` (0 original, 1 reply).
    pub fn packet(&mut self, dir: usize, p: &Packet) -> Verdict {
        let other = 1 - dir;
        if p.has(chunk::INIT) {
            let Some(tag) = p.initiate_tag.filter(|&t| t != 0) else {
                return Verdict::Invalid;
            };
            if p.vtag != 0 {
                return Verdict::Invalid;
            }
            // A retransmitted INIT, or the peer's own (an INIT collision), while the
            // handshake is under way: the tag it announces is the one its peer uses.
            // In any other state an INIT restarts the association.
            if self.state != SctpState::CookieWait {
                self.state = SctpState::CookieWait;
                self.vtag = [0, 0];
            }
            self.vtag[other] = tag;
            return Verdict::Accept;
        }
        // The tag this packet must carry: its direction's, or with the T bit set on an
        // ABORT or SHUTDOWN COMPLETE, the other direction's.
        let reflected = p.t_bit && (p.has(chunk::ABORT) || p.has(chunk::SHUTDOWN_COMPLETE));
        let want = if reflected { other } else { dir };
        match self.vtag[want] {
            0 if !reflected => self.vtag[want] = p.vtag,
            t if t != p.vtag => return Verdict::Invalid,
            _ => {}
        }
        if p.has(chunk::INIT_ACK) {
            // Only in answer to an INIT: its Initiate Tag is the tag the INIT's sender
            // uses from now on.
            let Some(tag) = p.initiate_tag.filter(|&t| t != 0) else {
                return Verdict::Invalid;
            };
            if self.state != SctpState::CookieWait {
                return Verdict::Invalid;
            }
            self.vtag[other] = tag;
            return Verdict::Accept;
        }
        if p.has(chunk::ABORT) {
            self.state = SctpState::Closed;
            return Verdict::Accept;
        }
        if p.has(chunk::SHUTDOWN_COMPLETE) {
            if self.state != SctpState::ShutdownAckSent {
                return Verdict::Invalid;
            }
            self.state = SctpState::Closed;
            return Verdict::Accept;
        }
        if self.state == SctpState::Closed {
            // Only a new INIT brings a closed association back.
            return Verdict::Invalid;
        }
        if p.has(chunk::COOKIE_ECHO) && self.state == SctpState::CookieWait {
            self.state = SctpState::CookieEchoed;
        }
        if p.has(chunk::COOKIE_ACK) {
            match self.state {
                SctpState::CookieEchoed => self.state = SctpState::Established,
                SctpState::Established => {}
                _ => return Verdict::Invalid,
            }
        }
        if p.has(chunk::HEARTBEAT_ACK) && self.state == SctpState::HeartbeatSent {
            self.state = SctpState::Established;
        }
        if p.has(chunk::SHUTDOWN)
            && matches!(
                self.state,
                SctpState::Established | SctpState::HeartbeatSent | SctpState::CookieEchoed
            )
        {
            self.state = SctpState::ShutdownSent;
        }
        if p.has(chunk::SHUTDOWN_ACK) {
            match self.state {
                SctpState::ShutdownSent | SctpState::Established | SctpState::ShutdownAckSent => {
                    self.state = SctpState::ShutdownAckSent;
                }
                _ => return Verdict::Invalid,
            }
        }
        Verdict::Accept
    }
}

impl From<SctpState> for crate::handover::SctpState {
    fn from(s: SctpState) -> Self {
        use crate::handover::SctpState as H;
        match s {
            SctpState::CookieWait => H::CookieWait,
            SctpState::CookieEchoed => H::CookieEchoed,
            SctpState::Established => H::Established,
            SctpState::ShutdownSent => H::ShutdownSent,
            SctpState::ShutdownAckSent => H::ShutdownAckSent,
            SctpState::HeartbeatSent => H::HeartbeatSent,
            SctpState::Closed => H::Closed,
        }
    }
}

impl From<crate::handover::SctpState> for SctpState {
    fn from(s: crate::handover::SctpState) -> Self {
        use crate::handover::SctpState as H;
        match s {
            H::CookieWait => SctpState::CookieWait,
            H::CookieEchoed => SctpState::CookieEchoed,
            H::Established => SctpState::Established,
            H::ShutdownSent => SctpState::ShutdownSent,
            H::ShutdownAckSent => SctpState::ShutdownAckSent,
            H::HeartbeatSent => SctpState::HeartbeatSent,
            H::Closed => SctpState::Closed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::sctp::{self, FLAG_T, init_value};

    fn pkt(vtag: u32, chunks: &[(u8, u8, &[u8])]) -> Packet {
        Packet::read(&sctp::build(1, 2, vtag, chunks)).unwrap()
    }

    /// The four-way handshake, data, the three-way shutdown.
    fn handshake() -> SctpConn {
        let mut c = SctpConn::new(&pkt(0, &[(chunk::INIT, 0, &init_value(0xa))])).unwrap();
        assert_eq!((c.state, c.vtag), (SctpState::CookieWait, [0, 0xa]));
        let ack = pkt(0xa, &[(chunk::INIT_ACK, 0, &init_value(0xb))]);
        assert_eq!(c.packet(1, &ack), Verdict::Accept);
        assert_eq!(c.vtag, [0xb, 0xa]);
        let echo = pkt(0xb, &[(chunk::COOKIE_ECHO, 0, b"cookie")]);
        assert_eq!(c.packet(0, &echo), Verdict::Accept);
        assert_eq!(c.state, SctpState::CookieEchoed);
        assert_eq!(
            c.packet(1, &pkt(0xa, &[(chunk::COOKIE_ACK, 0, &[])])),
            Verdict::Accept
        );
        assert_eq!(c.state, SctpState::Established);
        c
    }

    #[test]
    fn test_an_association_goes_from_init_to_shutdown_complete() {
        let mut c = handshake();
        assert_eq!(
            c.packet(0, &pkt(0xb, &[(chunk::DATA, 3, b"x")])),
            Verdict::Accept
        );
        assert_eq!(
            c.packet(1, &pkt(0xa, &[(chunk::SACK, 0, &[0; 12])])),
            Verdict::Accept
        );
        assert_eq!(
            c.packet(0, &pkt(0xb, &[(chunk::SHUTDOWN, 0, &[0; 4])])),
            Verdict::Accept
        );
        assert_eq!(c.state, SctpState::ShutdownSent);
        assert_eq!(
            c.packet(1, &pkt(0xa, &[(chunk::SHUTDOWN_ACK, 0, &[])])),
            Verdict::Accept
        );
        assert_eq!(c.state, SctpState::ShutdownAckSent);
        let complete = pkt(0xa, &[(chunk::SHUTDOWN_COMPLETE, 0, &[])]);
        assert_eq!(
            c.packet(0, &complete),
            Verdict::Invalid,
            "the other direction's tag"
        );
        let complete = pkt(0xb, &[(chunk::SHUTDOWN_COMPLETE, 0, &[])]);
        assert_eq!(c.packet(0, &complete), Verdict::Accept);
        assert_eq!(c.state, SctpState::Closed);
        assert_eq!(
            c.packet(0, &pkt(0xb, &[(chunk::DATA, 3, b"x")])),
            Verdict::Invalid
        );
        // A new INIT on the closed association starts it again.
        assert_eq!(
            c.packet(0, &pkt(0, &[(chunk::INIT, 0, &init_value(0xc))])),
            Verdict::Accept
        );
        assert_eq!((c.state, c.vtag), (SctpState::CookieWait, [0, 0xc]));
    }

    #[test]
    fn test_a_wrong_tag_is_invalid_and_changes_nothing() {
        let mut c = handshake();
        let before = c;
        for p in [
            pkt(0xdead, &[(chunk::DATA, 3, b"x")]),
            pkt(0xdead, &[(chunk::ABORT, 0, &[])]),
            pkt(0xa, &[(chunk::ABORT, 0, &[])]),
            pkt(0xdead, &[(chunk::SHUTDOWN, 0, &[0; 4])]),
            pkt(0xb, &[(chunk::SHUTDOWN_COMPLETE, 0, &[])]),
            pkt(0xb, &[(chunk::INIT_ACK, 0, &init_value(7))]),
            pkt(5, &[(chunk::INIT, 0, &init_value(7))]),
            pkt(0, &[(chunk::INIT, 0, &init_value(0))]),
        ] {
            assert_eq!(c.packet(0, &p), Verdict::Invalid, "{p:?}");
            assert_eq!(c, before);
        }
        // An ABORT with the T bit carries the other direction's tag.
        assert_eq!(
            c.packet(0, &pkt(0xb, &[(chunk::ABORT, FLAG_T, &[])])),
            Verdict::Invalid
        );
        assert_eq!(
            c.packet(0, &pkt(0xa, &[(chunk::ABORT, FLAG_T, &[])])),
            Verdict::Accept
        );
        assert_eq!(c.state, SctpState::Closed);
    }

    #[test]
    fn test_only_an_init_or_a_heartbeat_starts_an_association() {
        assert_eq!(
            SctpConn::new(&pkt(5, &[(chunk::INIT, 0, &init_value(6))])),
            None,
            "tag"
        );
        for ty in [
            chunk::DATA,
            chunk::ABORT,
            chunk::COOKIE_ACK,
            chunk::SHUTDOWN,
        ] {
            assert_eq!(SctpConn::new(&pkt(5, &[(ty, 0, &[0; 4])])), None, "{ty}");
        }
        // Picked up from a heartbeat, confirmed by its acknowledgement.
        let mut c = SctpConn::new(&pkt(0x11, &[(chunk::HEARTBEAT, 0, &[0; 8])])).unwrap();
        assert_eq!((c.state, c.vtag), (SctpState::HeartbeatSent, [0x11, 0]));
        assert_eq!(
            c.packet(0, &pkt(0x11, &[(chunk::DATA, 3, b"x")])),
            Verdict::Accept
        );
        let hb_ack = pkt(0x22, &[(chunk::HEARTBEAT_ACK, 0, &[0; 8])]);
        assert_eq!(c.packet(1, &hb_ack), Verdict::Accept);
        assert_eq!((c.state, c.vtag), (SctpState::Established, [0x11, 0x22]));
        assert_eq!(
            c.packet(1, &pkt(0x23, &[(chunk::DATA, 3, b"x")])),
            Verdict::Invalid
        );
    }

    #[test]
    fn test_an_init_restarts_an_established_association() {
        let mut c = handshake();
        assert_eq!(
            c.packet(1, &pkt(0, &[(chunk::INIT, 0, &init_value(0xe))])),
            Verdict::Accept
        );
        assert_eq!((c.state, c.vtag), (SctpState::CookieWait, [0xe, 0]));
        // A COOKIE ACK before any COOKIE ECHO is not of the handshake.
        assert_eq!(
            c.packet(0, &pkt(0xe, &[(chunk::COOKIE_ACK, 0, &[])])),
            Verdict::Invalid
        );
    }
}
