//! ICMP (RFC 792) and ICMPv6 (RFC 4443) message types: the numbers ferry names, and which
//! messages are errors and which are echoes.

use crate::flow::proto;

/// Length of the ICMP/ICMPv6 header: type, code, checksum and four type-specific bytes.
pub const HEADER_LEN: usize = 8;

/// ICMP (IPv4) message types and codes.
pub mod v4 {
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 0;
    /// Destination unreachable.
    pub const DEST_UNREACHABLE: u8 = 3;
    /// Source quench (deprecated, still an error).
    pub const SOURCE_QUENCH: u8 = 4;
    /// Redirect.
    pub const REDIRECT: u8 = 5;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 8;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 11;
    /// Parameter problem.
    pub const PARAMETER_PROBLEM: u8 = 12;
    /// Code of [`DEST_UNREACHABLE`]: fragmentation needed and DF set.
    pub const CODE_FRAG_NEEDED: u8 = 4;
}

/// ICMPv6 message types.
pub mod v6 {
    /// Destination unreachable.
    pub const DEST_UNREACHABLE: u8 = 1;
    /// Packet too big.
    pub const PACKET_TOO_BIG: u8 = 2;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 3;
    /// Parameter problem.
    pub const PARAMETER_PROBLEM: u8 = 4;
    /// Echo request; types below it are errors (RFC 4443 section 2.1).
    pub const ECHO_REQUEST: u8 = 128;
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 129;
}

/// True when an ICMP (`icmp_proto` = [`proto::ICMP`]) or ICMPv6 ([`proto::ICMPV6`])
/// message of type `t` is an error: the one definition the datapath uses, so that no
/// error is answered with an error, and conntrack relates errors rather than tracking them.
///
/// ICMP: destination unreachable, source quench, redirect, time exceeded and parameter
/// problem (3, 4, 5, 11, 12). ICMPv6: every type from 0 to 127 (RFC 4443 section 2.1),
/// including those not assigned yet; only types 1 to 4 are read by
/// [`super::icmp_error::embedded`].
pub fn is_error(icmp_proto: u8, t: u8) -> bool {
    match icmp_proto {
        proto::ICMP => matches!(
            t,
            v4::DEST_UNREACHABLE
                | v4::SOURCE_QUENCH
                | v4::REDIRECT
                | v4::TIME_EXCEEDED
                | v4::PARAMETER_PROBLEM
        ),
        proto::ICMPV6 => t < v6::ECHO_REQUEST,
        _ => false,
    }
}

/// True for an ICMP/ICMPv6 echo request or reply, whose identifier is part of the key.
#[inline]
pub fn is_echo(icmp_proto: u8, t: u8) -> bool {
    match icmp_proto {
        proto::ICMP => matches!(t, v4::ECHO_REPLY | v4::ECHO_REQUEST),
        proto::ICMPV6 => matches!(t, v6::ECHO_REQUEST | v6::ECHO_REPLY),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_error_and_echo_types_per_rfc() {
        for t in 0..=255u8 {
            assert_eq!(
                is_error(proto::ICMP, t),
                [3, 4, 5, 11, 12].contains(&t),
                "v4 {t}"
            );
            assert_eq!(is_error(proto::ICMPV6, t), t < 128, "v6 {t}");
            assert_eq!(is_echo(proto::ICMP, t), t == 0 || t == 8, "v4 {t}");
            assert_eq!(is_echo(proto::ICMPV6, t), t == 128 || t == 129, "v6 {t}");
            assert!(!is_error(proto::UDP, t) && !is_echo(proto::TCP, t));
        }
    }
}
