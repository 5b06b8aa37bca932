//! ICMP and ICMPv6 as conntrack sees them: echo request/reply pairs tracked by
//! identifier, errors related to the connection they quote, the rest untracked.
//!
//! A key's `dst_port` holds `type << 8 | code` and `src_port` the echo identifier, so the
//! reply tuple of an echo request (A -> B, id, type 8) is (B -> A, id, type 0): the
//! identifier stays in `src_port` and the type changes, unlike ports which swap.

use crate::flow::{FlowKey, proto};
use crate::wire::icmp as wire_icmp;

/// What an ICMP message is to conntrack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Echo request: may create a connection.
    Request,
    /// Echo reply: only ever the reply direction of a connection.
    Reply,
    /// An error quoting the packet it is about (RELATED), or INVALID when it relates to no
    /// connection, including ICMPv6 error types whose quote is not read (see
    /// [`crate::wire::icmp_error::embedded`]).
    Error,
    /// Anything else (neighbour discovery, router advertisements, ...): not tracked.
    Untracked,
}

/// ICMP (IPv4) echo types.
mod v4 {
    pub const ECHO_REPLY: u8 = 0;
    pub const ECHO_REQUEST: u8 = 8;
}

/// ICMPv6 echo types.
mod v6 {
    pub const ECHO_REQUEST: u8 = 128;
    pub const ECHO_REPLY: u8 = 129;
}

/// Classifies an ICMP/ICMPv6 message type. Errors are what [`crate::wire::icmp::is_error`] says,
/// so every ICMPv6 type below 128 is one (RFC 4443 section 2.1) and never starts a
/// connection.
pub(crate) fn kind(protocol: u8, ty: u8) -> Kind {
    match (protocol, ty) {
        (proto::ICMP, v4::ECHO_REQUEST) | (proto::ICMPV6, v6::ECHO_REQUEST) => Kind::Request,
        (proto::ICMP, v4::ECHO_REPLY) | (proto::ICMPV6, v6::ECHO_REPLY) => Kind::Reply,
        _ if wire_icmp::is_error(protocol, ty) => Kind::Error,
        _ => Kind::Untracked,
    }
}

/// The type that answers `ty` (echo request <-> echo reply), keeping other types.
fn answer_type(protocol: u8, ty: u8) -> u8 {
    match (protocol, ty) {
        (proto::ICMP, v4::ECHO_REQUEST) => v4::ECHO_REPLY,
        (proto::ICMP, v4::ECHO_REPLY) => v4::ECHO_REQUEST,
        (proto::ICMPV6, v6::ECHO_REQUEST) => v6::ECHO_REPLY,
        (proto::ICMPV6, v6::ECHO_REPLY) => v6::ECHO_REQUEST,
        _ => ty,
    }
}

/// The tuple of a packet going the other way: addresses swapped and, for TCP/UDP, ports
/// swapped; for ICMP echo the identifier stays and request and reply types swap.
pub fn reverse(k: &FlowKey) -> FlowKey {
    match k.proto {
        proto::ICMP | proto::ICMPV6 => {
            let ty = answer_type(k.proto, (k.dst_port >> 8) as u8);
            FlowKey {
                src: k.dst,
                dst: k.src,
                dst_port: u16::from(ty) << 8 | (k.dst_port & 0xff),
                ..*k
            }
        }
        _ => FlowKey {
            src: k.dst,
            dst: k.src,
            src_port: k.dst_port,
            dst_port: k.src_port,
            ..*k
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::Addr;
    use std::net::IpAddr;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn echo_reply_tuple_keeps_identifier_and_swaps_type() {
        let req = FlowKey {
            zone: 3,
            src: Addr::from(ip("10.0.0.1")),
            dst: Addr::from(ip("10.0.0.2")),
            proto: proto::ICMP,
            src_port: 0x4242,
            dst_port: 8 << 8,
        };
        let rep = reverse(&req);
        assert_eq!(
            rep,
            FlowKey {
                zone: 3,
                src: Addr::from(ip("10.0.0.2")),
                dst: Addr::from(ip("10.0.0.1")),
                proto: proto::ICMP,
                src_port: 0x4242,
                dst_port: 0,
            }
        );
        assert_eq!(reverse(&rep), req);
        let req6 = FlowKey {
            src: Addr::from(ip("fd00::1")),
            dst: Addr::from(ip("fd00::2")),
            proto: proto::ICMPV6,
            dst_port: 128 << 8,
            ..req
        };
        assert_eq!(reverse(&req6).dst_port, 129 << 8);
        assert_eq!(reverse(&req6).src_port, 0x4242);
    }

    #[test]
    fn reverse_swaps_ports_for_tcp_and_udp() {
        let k = FlowKey {
            zone: 0,
            src: Addr::from(ip("10.0.0.1")),
            dst: Addr::from(ip("10.0.0.2")),
            proto: proto::UDP,
            src_port: 4000,
            dst_port: 53,
        };
        let r = reverse(&k);
        assert_eq!(
            (r.src, r.dst, r.src_port, r.dst_port),
            (k.dst, k.src, 53, 4000)
        );
    }

    #[test]
    fn errors_and_echo_are_classified_per_family() {
        assert_eq!(kind(proto::ICMP, 3), Kind::Error);
        assert_eq!(kind(proto::ICMP, 11), Kind::Error);
        assert_eq!(kind(proto::ICMP, 8), Kind::Request);
        assert_eq!(kind(proto::ICMP, 13), Kind::Untracked);
        assert_eq!(kind(proto::ICMPV6, 2), Kind::Error);
        assert_eq!(kind(proto::ICMPV6, 129), Kind::Reply);
        assert_eq!(kind(proto::ICMPV6, 135), Kind::Untracked);
        // Unassigned ICMPv6 types below 128 are errors too, never requests.
        assert_eq!(kind(proto::ICMPV6, 0), Kind::Error);
        assert_eq!(kind(proto::ICMPV6, 100), Kind::Error);
        assert_eq!(kind(proto::ICMPV6, 127), Kind::Error);
    }

    #[test]
    fn unknown_icmpv6_error_types_are_invalid_even_about_a_known_connection() {
        use crate::conntrack::tests::{pkt_in, run, udp};
        use crate::conntrack::{Config, Conntrack, CtState};
        use crate::icmp::{ErrorKind, build_error};
        use crate::wire::build::MAC_DST;

        let mut ct = Conntrack::new(Config::default());
        let mut out = udp("fd00::1", 4000, "fd00::2", 53);
        assert_eq!(run(&mut ct, &mut out, None, 0).state, CtState::New);
        let back = udp("fd00::2", 53, "fd00::1", 4000);
        let router = "fd00::fe".parse().unwrap();
        let e = build_error(
            &back.pkt.data,
            &back.parsed,
            ErrorKind::Unreachable { code: 4 },
            router,
            MAC_DST,
        )
        .unwrap();
        let mut known = pkt_in(e.clone(), 0);
        assert_eq!(run(&mut ct, &mut known, None, 1).state, CtState::Related);
        for t in [0u8, 5, 100, 127] {
            let mut f = e.clone();
            let at = known.parsed.l4_off;
            f[at] = t;
            let mut p = pkt_in(f, 0);
            let r = run(&mut ct, &mut p, None, 1);
            assert_eq!(r.state, CtState::Invalid, "type {t}");
            assert!(r.pending.is_none() && r.entry.is_none());
        }
        assert_eq!(ct.len(), 1);
    }
}
