//! ICMP and ICMPv6 as conntrack sees them: echo request/reply pairs tracked by
//! identifier, errors related to the connection they quote, the rest untracked.
//!
//! A key's `dst_port` holds `type << 8 | code` and `src_port` the echo identifier, so the
//! reply tuple of an echo request (A -> B, id, type 8) is (B -> A, id, type 0): the
//! identifier stays in `src_port` and the type changes, unlike ports which swap.

use crate::flow::{FlowKey, proto};

/// What an ICMP message is to conntrack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Echo request: may create a connection.
    Request,
    /// Echo reply: only ever the reply direction of a connection.
    Reply,
    /// An error quoting the packet it is about (RELATED).
    Error,
    /// Anything else (neighbour discovery, router advertisements, ...): not tracked.
    Untracked,
}

/// ICMP (IPv4) types.
mod v4 {
    pub const ECHO_REPLY: u8 = 0;
    pub const DEST_UNREACHABLE: u8 = 3;
    pub const SOURCE_QUENCH: u8 = 4;
    pub const REDIRECT: u8 = 5;
    pub const ECHO_REQUEST: u8 = 8;
    pub const TIME_EXCEEDED: u8 = 11;
    pub const PARAMETER_PROBLEM: u8 = 12;
}

/// ICMPv6 types.
mod v6 {
    pub const DEST_UNREACHABLE: u8 = 1;
    pub const PARAMETER_PROBLEM: u8 = 4;
    pub const ECHO_REQUEST: u8 = 128;
    pub const ECHO_REPLY: u8 = 129;
}

/// Classifies an ICMP/ICMPv6 message type.
pub(crate) fn kind(protocol: u8, ty: u8) -> Kind {
    if protocol == proto::ICMP {
        match ty {
            v4::ECHO_REQUEST => Kind::Request,
            v4::ECHO_REPLY => Kind::Reply,
            v4::DEST_UNREACHABLE
            | v4::SOURCE_QUENCH
            | v4::REDIRECT
            | v4::TIME_EXCEEDED
            | v4::PARAMETER_PROBLEM => Kind::Error,
            _ => Kind::Untracked,
        }
    } else {
        match ty {
            v6::ECHO_REQUEST => Kind::Request,
            v6::ECHO_REPLY => Kind::Reply,
            // RFC 4443: types 1 to 4 are the errors (unreachable, packet too big, time
            // exceeded, parameter problem).
            v6::DEST_UNREACHABLE..=v6::PARAMETER_PROBLEM => Kind::Error,
            _ => Kind::Untracked,
        }
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
    use std::net::IpAddr;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn echo_reply_tuple_keeps_identifier_and_swaps_type() {
        let req = FlowKey {
            zone: 3,
            src: ip("10.0.0.1"),
            dst: ip("10.0.0.2"),
            proto: proto::ICMP,
            src_port: 0x4242,
            dst_port: 8 << 8,
        };
        let rep = reverse(&req);
        assert_eq!(
            rep,
            FlowKey {
                zone: 3,
                src: ip("10.0.0.2"),
                dst: ip("10.0.0.1"),
                proto: proto::ICMP,
                src_port: 0x4242,
                dst_port: 0,
            }
        );
        assert_eq!(reverse(&rep), req);
        let req6 = FlowKey {
            src: ip("fd00::1"),
            dst: ip("fd00::2"),
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
            src: ip("10.0.0.1"),
            dst: ip("10.0.0.2"),
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
    }
}
