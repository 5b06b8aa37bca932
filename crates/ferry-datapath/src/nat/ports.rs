//! NAT decisions: the translated tuple of a new connection, and the port allocation that
//! keeps every reply tuple unique. Which tuples are free is the connection table's to
//! say ([`ReplyTuples`]); conntrack asks here when it creates a connection.
//!
//! A connection's reply tuple is the reverse of its translated original tuple, and it is
//! what identifies replies, so no two entries may share it. DNAT takes the address (and
//! port) it is given. SNAT keeps the source port (or ICMP echo identifier) when it is in
//! the range and the resulting reply tuple is free, so a NAT that changes nothing never
//! changes ports; otherwise it searches the range from a point that depends on the
//! connection (keyed hash), for at most [`MAX_ATTEMPTS`] ports.
//!
//! A connection without SNAT (DNAT only, or no NAT at all) keeps its tuple when its
//! reply tuple is free. When it is taken (the same client port to the same endpoint
//! through a second Service address, or directly as well as through a Service), the
//! source port is changed as SNAT would change it, the source address kept: Linux's null
//! binding. Only a protocol without ports to choose is refused as a clash.

use super::Nat;
use crate::flow::{Addr, FlowKey, proto};
use crate::wire::icmp::{v4, v6};

/// Status bit of a decision: the destination of the original direction is translated.
pub(crate) const DNAT: u8 = 4;
/// Status bit of a decision: its source is translated.
pub(crate) const SNAT: u8 = 8;

/// What the connection table knows of the tuples in use.
pub(crate) trait ReplyTuples {
    /// The hash of the reply tuple of a connection whose translated original tuple is
    /// `post`, if no connection has that reply tuple.
    fn free(&self, post: &FlowKey) -> Option<u64>;
}

/// Most ports tried for one new connection, so that allocation is bounded work even in a
/// large, nearly full range.
pub(crate) const MAX_ATTEMPTS: u32 = 512;

/// Why a NAT decision failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The reply tuple is taken and nothing may change it.
    Clash,
    /// No free port in the SNAT range.
    Exhausted,
    /// A NAT address of the other family.
    Family,
}

/// The fields of a key that SNAT may choose: TCP/UDP/SCTP source port, ICMP echo
/// identifier.
pub(crate) fn allocates(k: &FlowKey) -> bool {
    match k.proto {
        proto::TCP | proto::UDP | proto::SCTP => true,
        proto::ICMP | proto::ICMPV6 => matches!(
            (k.proto, (k.dst_port >> 8) as u8),
            (proto::ICMP, v4::ECHO_REQUEST) | (proto::ICMPV6, v6::ECHO_REQUEST)
        ),
        _ => false,
    }
}

/// The range searched when SNAT gives none, or for a connection without SNAT whose reply
/// tuple is taken: ICMP identifiers anywhere; ports of the same class as the original one
/// (privileged ports stay privileged, as Linux does).
fn default_range(k: &FlowKey) -> (u16, u16) {
    match k.proto {
        proto::ICMP | proto::ICMPV6 => (0, u16::MAX),
        _ if k.src_port < 1024 => SNAT_PRIVILEGED_PORTS,
        _ => SNAT_PORTS,
    }
}

/// The source ports SNAT chooses from when it is given no range, for an original source
/// port of 1024 or above.
pub const SNAT_PORTS: (u16, u16) = (1024, u16::MAX);
/// The same for an original source port below 1024.
pub const SNAT_PRIVILEGED_PORTS: (u16, u16) = (1, 1023);

/// The translated original-direction key of a new connection with key `key` (whose hash
/// is `hash`), the status bits (DNAT, SNAT) it gets, and the hash of its reply tuple,
/// `reverse(result)`.
pub(crate) fn decide(
    table: &impl ReplyTuples,
    key: &FlowKey,
    hash: u64,
    nat: Option<&Nat>,
) -> Result<(FlowKey, u8, u64), Refusal> {
    let mut post = *key;
    let mut status = 0;
    let Some(nat) = nat else {
        return unique(table, key, post, status, hash);
    };
    if let Some((addr, port)) = nat.dnat {
        post.dst = addr;
        same_family(key.dst, whole(&post.dst))?;
        if matches!(key.proto, proto::TCP | proto::UDP | proto::SCTP) {
            post.dst_port = port.unwrap_or(key.dst_port);
        }
        if post != *key {
            status |= DNAT;
        }
    }
    let Some((addr, range)) = nat.snat else {
        return unique(table, key, post, status, hash);
    };
    post.src = addr;
    same_family(key.src, whole(&post.src))?;
    if post.src != key.src {
        status |= SNAT;
    }
    if !allocates(key) {
        return match free(table, &post) {
            Some(h) => Ok((post, status, h)),
            None => Err(Refusal::Exhausted),
        };
    }
    let (lo, hi) = range.unwrap_or_else(|| default_range(key));
    let (lo, hi) = (lo.min(hi), lo.max(hi));
    if (lo..=hi).contains(&key.src_port)
        && let Some(h) = free(table, &post)
    {
        return Ok((post, status, h));
    }
    search(table, key, post, status, (lo, hi), hash)
}

/// A source port (or ICMP echo identifier) for `post` in `lo..=hi` whose reply tuple is
/// free, tried from a point that depends on the connection's `hash`, at most
/// [`MAX_ATTEMPTS`] of them; SNAT is added to `status` when it is not `key`'s.
fn search(
    table: &impl ReplyTuples,
    key: &FlowKey,
    mut post: FlowKey,
    mut status: u8,
    (lo, hi): (u16, u16),
    hash: u64,
) -> Result<(FlowKey, u8, u64), Refusal> {
    let size = u32::from(hi - lo) + 1;
    let start = (hash % u64::from(size)) as u32;
    for i in 0..size.min(MAX_ATTEMPTS) {
        post.src_port = lo + ((start + i) % size) as u16;
        if let Some(h) = free(table, &post) {
            if post.src_port != key.src_port {
                status |= SNAT;
            }
            return Ok((post, status, h));
        }
    }
    Err(Refusal::Exhausted)
}

/// The hash of the reply tuple of `post`, if that tuple is free.
#[inline]
fn free(table: &impl ReplyTuples, post: &FlowKey) -> Option<u64> {
    table.free(post)
}

/// `post`, of a connection without SNAT, if its reply tuple is free; else `post` with
/// another source port from the class of `key`'s ([`default_range`]), the address kept
/// (Linux's null binding). A clash when the protocol has no port to choose.
fn unique(
    table: &impl ReplyTuples,
    key: &FlowKey,
    post: FlowKey,
    status: u8,
    hash: u64,
) -> Result<(FlowKey, u8, u64), Refusal> {
    if let Some(h) = free(table, &post) {
        return Ok((post, status, h));
    }
    if !allocates(key) {
        return Err(Refusal::Clash);
    }
    search(table, key, post, status, default_range(key), hash)
}

/// An address just copied into a key, read back through a reference the compiler cannot
/// see through. Checked straight from the copy's source, the address would be loaded in
/// 8- and 4-byte parts for the check and stored in those parts, and the next 16-byte read
/// of the key waits for those stores to reach the cache; copied first and checked here,
/// it is copied in one 16-byte move.
#[inline(always)]
fn whole(a: &Addr) -> Addr {
    *std::hint::black_box(a)
}

fn same_family(a: Addr, b: Addr) -> Result<(), Refusal> {
    if a.is_ipv4() == b.is_ipv4() {
        Ok(())
    } else {
        Err(Refusal::Family)
    }
}
