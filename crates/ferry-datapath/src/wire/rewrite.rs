//! The header rewriter: addresses and ports (or ICMP echo identifiers) changed in place,
//! every checksum that covers them fixed incrementally (RFC 1624). NAT is its user.
//!
//! Runs per packet of every translated connection, so it never allocates and never sums a
//! payload: each changed 16-bit word is taken out of and put into the checksums that
//! cover it. The old values are read from the frame, not from the parsed key, so that a
//! frame rewritten twice with the same (stale) [`Parsed`] still gets right checksums.

use crate::drop::DropReason;
use crate::flow::{Addr, FlowKey, proto};
use crate::wire::icmp::is_echo;
use crate::wire::icmp_error::{Embedded, ICMP_HDR, QUOTED_L4_MIN};
use crate::wire::parse::{L3, Parsed};
use crate::wire::{checksum, sctp};

/// Where an address family keeps its addresses, relative to the IP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    /// The family of a parsed IP packet.
    fn of(parsed: &Parsed) -> Result<Family, DropReason> {
        match parsed.l3 {
            L3::Ipv4 => Ok(Family::V4),
            L3::Ipv6 => Ok(Family::V6),
            L3::Arp => Err(DropReason::IpLengthInvalid),
        }
    }

    /// Checks that both addresses belong to this family.
    fn check(self, a: Addr, b: Addr) -> Result<(), DropReason> {
        let ok = match self {
            Family::V4 => a.is_ipv4() && b.is_ipv4(),
            Family::V6 => a.is_ipv6() && b.is_ipv6(),
        };
        ok.then_some(()).ok_or(DropReason::IpLengthInvalid)
    }

    /// Offsets of the source and destination addresses in the IP header.
    fn addr_offs(self) -> [usize; 2] {
        match self {
            Family::V4 => [12, 16],
            Family::V6 => [8, 24],
        }
    }

    /// The fixed IP header length.
    fn min_hdr(self) -> usize {
        match self {
            Family::V4 => 20,
            Family::V6 => 40,
        }
    }

    /// The ICMP protocol of this family.
    fn icmp(self) -> u8 {
        match self {
            Family::V4 => proto::ICMP,
            Family::V6 => proto::ICMPV6,
        }
    }
}

/// Offset of the IPv4 header checksum.
const IPV4_CSUM: usize = 10;

/// A checksum field being updated. `partial` marks a field that holds the folded
/// pseudo-header sum of a virtio-net NEEDS_CSUM packet (not complemented).
#[derive(Clone, Copy, Debug)]
struct Csum {
    value: u16,
    partial: bool,
}

impl Csum {
    fn full(value: u16) -> Csum {
        Csum {
            value,
            partial: false,
        }
    }

    /// Takes `old` out of the checksummed data and puts `new` in.
    fn update(&mut self, old: &[u8], new: &[u8]) {
        self.apply(checksum::delta(old, new));
    }

    /// Takes in the changes summed in `delta` (see [`checksum::delta`]).
    #[inline]
    fn apply(&mut self, delta: u64) {
        // A partial field is a plain sum: complementing around the RFC 1624 update turns
        // eqn. 3 into "sum + ~old + new".
        self.value = if self.partial {
            checksum::fold(u64::from(self.value) + delta)
        } else {
            checksum::apply(self.value, delta)
        };
    }
}

/// Writes `new` at `off` when the bytes there differ, returning the old bytes if they did.
/// Out of range is an error, never a panic. Of a fixed size, so that comparing and copying
/// them calls no memcmp or memcpy.
fn replace<const N: usize>(
    frame: &mut [u8],
    off: usize,
    new: [u8; N],
) -> Result<Option<[u8; N]>, DropReason> {
    let field: &mut [u8; N] = off
        .checked_add(N)
        .and_then(|end| frame.get_mut(off..end))
        .and_then(|f| f.try_into().ok())
        .ok_or(DropReason::IpLengthInvalid)?;
    if *field == new {
        return Ok(None);
    }
    Ok(Some(std::mem::replace(field, new)))
}

/// [`replace`] for an address: the change as [`checksum::delta`] sums it, if there was
/// one. Computed from the fixed-size old and new bytes, never from a copy of them
/// assembled piece by piece.
fn replace_addr(frame: &mut [u8], off: usize, addr: Addr) -> Result<Option<u64>, DropReason> {
    Ok(match addr.to_v4() {
        Some(a) => {
            let new = a.octets();
            replace(frame, off, new)?.map(|old| checksum::delta(&old, &new))
        }
        None => {
            let new = *addr.octets();
            replace(frame, off, new)?.map(|old| checksum::delta(&old, &new))
        }
    })
}

fn read16(frame: &[u8], off: usize) -> Result<u16, DropReason> {
    match frame.get(off..off.wrapping_add(2)) {
        Some(&[a, b]) => Ok(u16::from_be_bytes([a, b])),
        _ => Err(DropReason::IpLengthInvalid),
    }
}

fn write16(frame: &mut [u8], off: usize, v: u16) -> Result<(), DropReason> {
    frame
        .get_mut(off..off.wrapping_add(2))
        .ok_or(DropReason::IpLengthInvalid)?
        .copy_from_slice(&v.to_be_bytes());
    Ok(())
}

/// Which identifiers a transport header carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ids {
    /// Source and destination ports at offsets 0 and 2.
    Ports,
    /// An ICMP/ICMPv6 echo identifier at offset 4.
    EchoId,
    /// Nothing ferry rewrites.
    None,
}

/// The transport fields of one (possibly quoted, possibly truncated) transport header.
#[derive(Clone, Copy, Debug)]
struct L4 {
    /// Absolute offset of the transport header.
    off: usize,
    /// Absolute offset of its checksum field, when that field is present.
    csum_off: Option<usize>,
    /// The checksum covers a pseudo-header with the IP addresses.
    pseudo: bool,
    ids: Ids,
}

impl L4 {
    /// The layout of the transport header of protocol `p` at `off`, of which the bytes up
    /// to `end` are present (`ids_present` says whether its identifiers are).
    fn locate(
        frame: &[u8],
        fam: Family,
        p: u8,
        off: usize,
        end: usize,
        ids_present: bool,
    ) -> Option<L4> {
        let (csum_at, pseudo, ids) = match p {
            proto::TCP => (16, true, Ids::Ports),
            proto::UDP => (6, true, Ids::Ports),
            // No Internet checksum: its CRC32c covers the whole packet and no address
            // (the caller computes it again when the ports change).
            proto::SCTP => {
                return Some(L4 {
                    off,
                    csum_off: None,
                    pseudo: false,
                    ids: if ids_present { Ids::Ports } else { Ids::None },
                });
            }
            p if p == fam.icmp() => {
                let ty = *frame.get(off)?;
                let ids = if is_echo(p, ty) {
                    Ids::EchoId
                } else {
                    Ids::None
                };
                (2, fam == Family::V6, ids)
            }
            _ => return None,
        };
        let csum_off = off + csum_at;
        Some(L4 {
            off,
            csum_off: (csum_off + 2 <= end).then_some(csum_off),
            pseudo,
            ids: if ids_present { ids } else { Ids::None },
        })
    }

    /// The checksum field's value, unless absent or (UDP over IPv4, complete checksum) zero,
    /// which means "no checksum" and must stay zero.
    fn csum(
        &self,
        frame: &[u8],
        fam: Family,
        p: u8,
        partial: bool,
    ) -> Result<Option<Csum>, DropReason> {
        let Some(at) = self.csum_off else {
            return Ok(None);
        };
        let value = read16(frame, at)?;
        if fam == Family::V4 && p == proto::UDP && !partial && value == 0 {
            return Ok(None);
        }
        Ok(Some(Csum { value, partial }))
    }
}

/// Stores an updated transport checksum. A complete UDP checksum that came out as zero is
/// sent as 0xffff (zero would mean "no checksum"); a partial sum is stored as it is.
fn store_l4(frame: &mut [u8], at: usize, p: u8, c: Csum) -> Result<(), DropReason> {
    let v = if p == proto::UDP && !c.partial && c.value == 0 {
        0xffff
    } else {
        c.value
    };
    write16(frame, at, v)
}

/// Rewrites a packet's addresses and ports (or ICMP echo identifier) to those of `to`
/// (same family and protocol as `parsed.key`; only fields that differ are touched), fixing
/// every checksum incrementally (RFC 1624): the IPv4 header checksum; the TCP/UDP checksum
/// (pseudo-header addresses and ports); the ICMP echo checksum when the identifier changes
/// (`to.src_port` is the new identifier for ICMP/ICMPv6 echo request and reply;
/// `to.dst_port`, type and code, is never written); the ICMPv6 checksum for address changes
/// (pseudo-header). UDP over IPv4 with checksum 0 keeps 0. A computed UDP checksum of 0
/// becomes 0xffff.
///
/// `csum_partial`: the L4 checksum field holds only the folded pseudo-header sum
/// (virtio-net NEEDS_CSUM, not complemented): address changes update that partial sum and
/// port/identifier changes leave it alone.
///
/// Works on a first fragment (the transport header is present and its checksum covers the
/// whole datagram, which an incremental update keeps right) and on a later fragment (only
/// the IP addresses; there is no transport header). SCTP gets its ports rewritten and
/// its CRC32c computed again over the packet (an SCTP first fragment whose ports would
/// change is refused: its checksum covers bytes it does not hold). Other protocols get
/// their addresses rewritten only.
///
/// `parsed.key` is not updated (the caller does that). Errors, without a panic on any
/// input: `DropReason::IpLengthInvalid` if `to` differs in family or protocol, for a
/// non-IP packet, or if `parsed` does not fit the frame. Only a `parsed` that does not
/// describe this frame can fail after some fields were written.
pub fn rewrite(
    frame: &mut [u8],
    parsed: &Parsed,
    csum_partial: bool,
    to: &FlowKey,
) -> Result<(), DropReason> {
    if let (Some(src), Some(dst)) = (to.src.to_v4(), to.dst.to_v4())
        && rewrite_v4_ports(
            frame,
            parsed,
            csum_partial,
            [src.octets(), dst.octets()],
            to,
        )
    {
        return Ok(());
    }
    rewrite_any(frame, parsed, csum_partial, to)
}

/// [`rewrite`] for what most translated packets are: a whole IPv4 TCP or UDP header, in
/// the frame. Returns false, having touched nothing, for anything else, which
/// [`rewrite_any`] handles (its errors included). The same result as `rewrite_any` in
/// fewer steps: the fields sit at fixed offsets, read and written as arrays of their
/// size.
#[inline]
fn rewrite_v4_ports(
    frame: &mut [u8],
    parsed: &Parsed,
    csum_partial: bool,
    addrs: [[u8; 4]; 2],
    to: &FlowKey,
) -> bool {
    let csum_at = match parsed.proto {
        proto::TCP => 16,
        proto::UDP => 6,
        _ => return false,
    };
    let (l3, l4, end) = (parsed.l3_off, parsed.l4_off, parsed.ip_end);
    if parsed.l3 != L3::Ipv4
        || to.proto != parsed.key.proto
        || parsed.is_later_fragment()
        || !parsed.l4_complete
        || end > frame.len()
        || l3.checked_add(20).is_none_or(|h| h > l4)
        || l4.checked_add(csum_at + 2).is_none_or(|e| e > end)
    {
        return false;
    }
    let get2 = |f: &[u8], at: usize| -> [u8; 2] { [f[at], f[at + 1]] };
    let mut addr_delta = 0;
    for (at, new) in [(l3 + 12, addrs[0]), (l3 + 16, addrs[1])] {
        let old = [frame[at], frame[at + 1], frame[at + 2], frame[at + 3]];
        if old != new {
            addr_delta += checksum::delta(&old, &new);
            frame[at..at + 4].copy_from_slice(&new);
        }
    }
    let mut port_delta = 0;
    for (at, new) in [(l4, to.src_port), (l4 + 2, to.dst_port)] {
        let (old, new) = (get2(frame, at), new.to_be_bytes());
        if old != new {
            port_delta += checksum::delta(&old, &new);
            frame[at..at + 2].copy_from_slice(&new);
        }
    }
    let at = l4 + csum_at;
    let value = u16::from_be_bytes(get2(frame, at));
    // A complete UDP checksum of zero means "none" and stays zero.
    if !(parsed.proto == proto::UDP && !csum_partial && value == 0) {
        let mut c = Csum {
            value,
            partial: csum_partial,
        };
        // A partial sum covers only the pseudo-header: ports are not in it.
        c.apply(addr_delta + if csum_partial { 0 } else { port_delta });
        // In bounds: checked above.
        let stored = store_l4(frame, at, parsed.proto, c);
        debug_assert!(stored.is_ok());
    }
    let at = l3 + IPV4_CSUM;
    let mut ip = Csum::full(u16::from_be_bytes(get2(frame, at)));
    ip.apply(addr_delta);
    frame[at..at + 2].copy_from_slice(&ip.value.to_be_bytes());
    true
}

/// [`rewrite`] for any IP packet.
fn rewrite_any(
    frame: &mut [u8],
    parsed: &Parsed,
    csum_partial: bool,
    to: &FlowKey,
) -> Result<(), DropReason> {
    let fam = Family::of(parsed)?;
    fam.check(to.src, to.dst)?;
    if to.proto != parsed.key.proto {
        return Err(DropReason::IpLengthInvalid);
    }
    let l3 = parsed.l3_off;
    let end = parsed.ip_end;
    if end > frame.len() || l3.checked_add(fam.min_hdr()).is_none_or(|h| h > end) {
        return Err(DropReason::IpLengthInvalid);
    }
    let l4 = if parsed.is_later_fragment() || parsed.l4_off > end {
        None
    } else {
        L4::locate(
            frame,
            fam,
            parsed.proto,
            parsed.l4_off,
            end,
            parsed.l4_complete,
        )
    };
    let ip_csum = match fam {
        Family::V4 => Some(Csum::full(read16(frame, l3 + IPV4_CSUM)?)),
        Family::V6 => None,
    };
    let l4_csum = match l4 {
        Some(t) => t.csum(frame, fam, parsed.proto, csum_partial)?,
        None => None,
    };
    let pseudo = l4.is_some_and(|t| t.pseudo);

    // The changes are summed first, and each checksum takes in their sum once.
    let mut addrs = 0;
    for (off, addr) in fam.addr_offs().into_iter().zip([to.src, to.dst]) {
        if let Some(d) = replace_addr(frame, l3 + off, addr)? {
            addrs += d;
        }
    }
    if let Some(t) = l4 {
        let ids: &[(usize, u16)] = match t.ids {
            Ids::Ports => &[(0, to.src_port), (2, to.dst_port)],
            Ids::EchoId => &[(4, to.src_port)],
            Ids::None => &[],
        };
        // SCTP's CRC32c covers the whole packet, which a first fragment does not hold:
        // its ports cannot change (the pipeline reassembles before it translates).
        let sctp = parsed.proto == proto::SCTP;
        let ports_change = ids
            .iter()
            .any(|&(off, v)| frame.get(t.off + off..t.off + off + 2) != Some(&v.to_be_bytes()[..]));
        if sctp && ports_change && (parsed.frag.is_some() || !parsed.l4_complete) {
            return Err(DropReason::IpLengthInvalid);
        }
        let mut idents = 0;
        for &(off, v) in ids {
            let new = v.to_be_bytes();
            if let Some(old) = replace(frame, t.off + off, new)? {
                idents += checksum::delta(&old, &new);
            }
        }
        if sctp && ports_change {
            sctp::set_crc(&mut frame[t.off..end]);
        }
        if let (Some(mut c), Some(at)) = (l4_csum, t.csum_off) {
            // A partial sum covers only the pseudo-header: identifiers are not in it.
            let pseudo_part = if pseudo { addrs } else { 0 };
            let ident_part = if c.partial { 0 } else { idents };
            c.apply(pseudo_part + ident_part);
            store_l4(frame, at, parsed.proto, c)?;
        }
    }
    if let Some(mut c) = ip_csum {
        c.apply(addrs);
        write16(frame, l3 + IPV4_CSUM, c.value)?;
    }
    Ok(())
}

/// Translates an ICMP/ICMPv6 error (see [`super::icmp_error::embedded`]): the outer source
/// and destination become `outer_src`/`outer_dst`, and the quoted packet's addresses and
/// ports/identifier become those of `inner` (which is in the quoted packet's orientation).
///
/// Fixes, incrementally: the outer IPv4 header checksum; the quoted IPv4 header checksum;
/// the quoted TCP/UDP checksum (pseudo-header and ports) or quoted ICMP/ICMPv6 echo
/// checksum, when the quote holds that field (a quote of only 8 transport bytes holds
/// UDP's and ICMP's but not TCP's; a field cut in half by the quote's end is left alone,
/// as its new value cannot be derived from half of the old one); and the outer ICMP checksum, which covers every quoted
/// byte changed above (and, for ICMPv6, the outer pseudo-header). A quoted UDP-over-IPv4
/// checksum of zero stays zero.
///
/// `parsed.key` is not updated. Errors: `DropReason::IpLengthInvalid` when an address is
/// of the other family or `inner.proto` differs from the quoted protocol;
/// `DropReason::IcmpMalformed` when `parsed` is not ICMP of its family or `emb` does not
/// describe a quote inside this frame.
pub fn rewrite_icmp_error(
    frame: &mut [u8],
    parsed: &Parsed,
    emb: &Embedded,
    outer_src: Addr,
    outer_dst: Addr,
    inner: &FlowKey,
) -> Result<(), DropReason> {
    let fam = Family::of(parsed)?;
    fam.check(outer_src, outer_dst)?;
    fam.check(inner.src, inner.dst)?;
    if inner.proto != emb.key.proto {
        return Err(DropReason::IpLengthInvalid);
    }
    let l3 = parsed.l3_off;
    let icmp = parsed.l4_off;
    let q = emb.l3_off;
    let q_end = q.checked_add(emb.len).ok_or(DropReason::IcmpMalformed)?;
    let consistent = parsed.proto == fam.icmp()
        && !parsed.is_later_fragment()
        && parsed.ip_end <= frame.len()
        && l3.checked_add(fam.min_hdr()).is_some_and(|h| h <= icmp)
        && icmp.checked_add(ICMP_HDR) == Some(q)
        && q_end <= parsed.ip_end
        && emb.l4_off >= q + fam.min_hdr()
        && (emb.l4_off - q).is_multiple_of(2)
        && emb
            .l4_off
            .checked_add(QUOTED_L4_MIN)
            .is_some_and(|e| e <= q_end);
    if !consistent {
        return Err(DropReason::IcmpMalformed);
    }

    let mut ip_csum = match fam {
        Family::V4 => Some(Csum::full(read16(frame, l3 + IPV4_CSUM)?)),
        Family::V6 => None,
    };
    let mut icmp_csum = Csum::full(read16(frame, icmp + 2)?);
    for (off, addr) in fam.addr_offs().into_iter().zip([outer_src, outer_dst]) {
        if let Some(d) = replace_addr(frame, l3 + off, addr)? {
            if let Some(c) = ip_csum.as_mut() {
                c.apply(d);
            }
            if fam == Family::V6 {
                icmp_csum.apply(d);
            }
        }
    }

    // The quote: every byte changed in it is also taken out of / put into the outer ICMP
    // checksum. All its fields sit at even offsets from the ICMP header, as RFC 1624 needs.
    let mut q_ip_csum = match fam {
        Family::V4 => Some(Csum::full(read16(frame, q + IPV4_CSUM)?)),
        Family::V6 => None,
    };
    let t = L4::locate(frame, fam, emb.key.proto, emb.l4_off, q_end, true);
    let mut q_l4_csum = match t {
        Some(t) => t.csum(frame, fam, emb.key.proto, false)?,
        None => None,
    };
    let pseudo = t.is_some_and(|t| t.pseudo);
    for (off, addr) in fam.addr_offs().into_iter().zip([inner.src, inner.dst]) {
        if let Some(d) = replace_addr(frame, q + off, addr)? {
            icmp_csum.apply(d);
            if let Some(c) = q_ip_csum.as_mut() {
                c.apply(d);
            }
            if let Some(c) = q_l4_csum.as_mut().filter(|_| pseudo) {
                c.apply(d);
            }
        }
    }
    if let Some(t) = t {
        let ids: &[(usize, u16)] = match t.ids {
            Ids::Ports => &[(0, inner.src_port), (2, inner.dst_port)],
            Ids::EchoId => &[(4, inner.src_port)],
            Ids::None => &[],
        };
        for &(off, v) in ids {
            let new = v.to_be_bytes();
            if let Some(old) = replace(frame, t.off + off, new)? {
                icmp_csum.update(&old, &new);
                if let Some(c) = q_l4_csum.as_mut() {
                    c.update(&old, &new);
                }
            }
        }
        if let (Some(c), Some(at)) = (q_l4_csum, t.csum_off) {
            let old = read16(frame, at)?;
            store_l4(frame, at, emb.key.proto, c)?;
            let new = read16(frame, at)?;
            icmp_csum.update(&old.to_be_bytes(), &new.to_be_bytes());
        }
    }
    if let Some(c) = q_ip_csum {
        let old = read16(frame, q + IPV4_CSUM)?;
        write16(frame, q + IPV4_CSUM, c.value)?;
        icmp_csum.update(&old.to_be_bytes(), &c.value.to_be_bytes());
    }
    write16(frame, icmp + 2, icmp_csum.value)?;
    if let Some(c) = ip_csum {
        write16(frame, l3 + IPV4_CSUM, c.value)?;
    }
    Ok(())
}

/// Decrements the TTL (IPv4, with an incremental header checksum update) or hop limit
/// of a parsed packet whose TTL is above 1 (the caller checked).
#[inline]
pub fn decrement_ttl(data: &mut [u8], parsed: &Parsed) {
    let o = parsed.l3_off;
    match parsed.l3 {
        L3::Ipv4 => {
            let old = u16::from_be_bytes([data[o + 8], data[o + 9]]);
            data[o + 8] -= 1;
            let new = u16::from_be_bytes([data[o + 8], data[o + 9]]);
            let c = u16::from_be_bytes([data[o + 10], data[o + 11]]);
            data[o + 10..o + 12].copy_from_slice(&checksum::update16(c, old, new).to_be_bytes());
        }
        L3::Ipv6 => data[o + 7] -= 1,
        L3::Arp => {}
    }
}

/// Sets a frame's Ethernet destination and source (the frame is at least a header).
#[inline]
pub fn set_macs(frame: &mut [u8], dst: [u8; 6], src: [u8; 6]) {
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drop::DropCounters;
    use crate::icmp::{ErrorKind, build_error};
    use crate::ipf::{self, Outcome, Reassembler};
    use crate::packet::Packet;
    use crate::wire::build::{self, IpOpts, tcp_flags};
    use crate::wire::checksum::{
        add, complete_partial, finish, fold, pseudo_v4, pseudo_v6, set_ipv4_header,
    };
    use crate::wire::icmp_error::embedded;
    use crate::wire::icmp_error::tests::truncate;
    use crate::wire::parse::{parse, v4_octets, v6_octets};
    use proptest::prelude::*;
    use std::net::IpAddr;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn icmp_of(a: IpAddr) -> u8 {
        if a.is_ipv4() {
            proto::ICMP
        } else {
            proto::ICMPV6
        }
    }

    /// Offset of the checksum in a transport header.
    fn csum_at(p: u8) -> usize {
        match p {
            proto::TCP => 16,
            proto::UDP => 6,
            _ => 2,
        }
    }

    /// Length of the transport header before the payload, as the builders make it.
    fn l4_hdr(p: u8) -> usize {
        if p == proto::TCP { 20 } else { 8 }
    }

    fn stored(f: &[u8], off: usize) -> u16 {
        u16::from_be_bytes([f[off], f[off + 1]])
    }

    /// The pseudo-header sum of a transport segment of `len` bytes (zero for ICMP).
    fn pseudo(src: IpAddr, dst: IpAddr, p: u8, len: usize) -> u64 {
        match (p, src) {
            (proto::ICMP, _) => 0,
            (_, IpAddr::V4(_)) => pseudo_v4(v4_octets(src), v4_octets(dst), p, len as u16),
            (_, IpAddr::V6(_)) => pseudo_v6(&v6_octets(src), &v6_octets(dst), p, len as u32),
        }
    }

    /// The transport checksum of `seg` computed from scratch (its own field taken as zero).
    fn full_l4(seg: &[u8], src: IpAddr, dst: IpAddr, p: u8) -> u16 {
        let at = csum_at(p);
        let mut s = seg.to_vec();
        s[at..at + 2].fill(0);
        let c = finish(add(&s, pseudo(src, dst, p, seg.len())));
        if p == proto::UDP && c == 0 { 0xffff } else { c }
    }

    /// Recomputes every checksum of `frame` from scratch and asserts that the stored ones
    /// are those values; returns the parse.
    fn assert_checksums(frame: &[u8]) -> Parsed {
        let p = parse(frame, 0).expect("rewritten frame parses");
        if p.l3 == L3::Ipv4 {
            let mut h = frame[p.l3_off..p.l4_off].to_vec();
            set_ipv4_header(&mut h);
            assert_eq!(stored(&h, 10), stored(frame, p.l3_off + 10), "IPv4 header");
        }
        let l4 = matches!(p.proto, proto::TCP | proto::UDP) || p.proto == icmp_of(p.key.src.ip());
        if p.frag.is_none() && l4 {
            let seg = &frame[p.l4_off..p.ip_end];
            let got = stored(seg, csum_at(p.proto));
            let udp4_none = p.l3 == L3::Ipv4 && p.proto == proto::UDP && got == 0;
            if !udp4_none {
                let want = full_l4(seg, p.key.src.ip(), p.key.dst.ip(), p.proto);
                // A checksum computed as zero may be stored as its ones' complement twin
                // 0xffff, which every protocol accepts: `complete_partial` does so.
                let twin = want == 0 && got == 0xffff;
                assert!(
                    got == want || twin,
                    "transport checksum of {}: {got:#06x}, want {want:#06x}",
                    p.key
                );
            }
        }
        p
    }

    /// SCTP NAT: the ports rewritten and the CRC32c computed again; addresses alone
    /// leave it as it was (it covers no address); an SCTP first fragment's ports are
    /// not rewritten.
    #[test]
    fn test_sctp_ports_are_rewritten_with_the_crc32c_fixed() {
        use crate::wire::sctp::{self, chunk};
        for (a, b) in [("10.0.0.1", "10.0.0.2"), ("fd00::1", "fd00::2")] {
            let pkt = sctp::build(40000, 80, 0x1234, &[(chunk::DATA, 3, b"payload")]);
            let orig = build::sctp(ip(a), ip(b), &pkt, &IpOpts::default());
            let p = parse(&orig, 0).unwrap();
            let mut to = p.key;
            to.dst = ip(if a.contains(':') {
                "fd00::9"
            } else {
                "10.0.0.9"
            })
            .into();
            to.dst_port = 8080;
            to.src_port = 41000;
            let mut f = orig.clone();
            rewrite(&mut f, &p, false, &to).unwrap();
            let q = assert_checksums(&f);
            assert_eq!(q.key, to);
            let seg = &f[q.l4_off..q.ip_end];
            assert!(sctp::crc_ok(seg), "CRC32c after the port change");
            assert_eq!(&seg[4..8], &0x1234u32.to_be_bytes(), "tag kept");

            let mut only_addr = p.key;
            only_addr.src = to.dst;
            let mut g = orig.clone();
            rewrite(&mut g, &p, false, &only_addr).unwrap();
            let q = assert_checksums(&g);
            assert_eq!(&g[q.l4_off..q.ip_end], &orig[p.l4_off..p.ip_end]);
        }
        let pkt = sctp::build(40000, 80, 7, &[(chunk::DATA, 3, &build::pattern(3000, 1))]);
        let whole = build::sctp(ip("10.0.0.1"), ip("10.0.0.2"), &pkt, &IpOpts::default());
        let first = fragments(&whole, 1400).remove(0).data;
        let p = parse(&first, 0).unwrap();
        assert!(p.frag.is_some());
        let mut to = p.key;
        to.dst_port = 8080;
        let mut f = first.clone();
        assert_eq!(
            rewrite(&mut f, &p, false, &to),
            Err(DropReason::IpLengthInvalid)
        );
    }

    fn frame(p: u8, src: IpAddr, dst: IpAddr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let o = IpOpts::default();
        match p {
            proto::TCP => build::tcp(src, dst, sport, dport, 1, 2, tcp_flags::ACK, payload, &o),
            proto::UDP => build::udp(src, dst, sport, dport, payload, &o),
            _ => build::echo_request(src, dst, sport, 1, payload, &o),
        }
    }

    /// Rewrites `orig` to `to` and checks the result from scratch: key, every checksum,
    /// and the payload untouched.
    fn check_rewrite(orig: &[u8], to: FlowKey, what: &str) -> Vec<u8> {
        let p = parse(orig, 0).unwrap();
        let mut f = orig.to_vec();
        rewrite(&mut f, &p, false, &to).unwrap();
        let q = assert_checksums(&f);
        let mut want = to;
        if p.proto == icmp_of(p.key.src.ip()) {
            want.dst_port = p.key.dst_port; // type and code are never written
        }
        assert_eq!(q.key, want, "{what}");
        let body = p.l4_off + l4_hdr(p.proto);
        assert_eq!(f[body..], orig[body..], "{what}: payload");
        f
    }

    const FAMILIES: [[&str; 4]; 2] = [
        ["10.0.0.1", "10.0.0.2", "192.168.7.9", "172.16.0.3"],
        ["fd00::1", "fd00::2", "2001:db8::77", "fd12:3456::9"],
    ];

    #[test]
    fn test_rewrite_src_dst_both_ports_and_addresses_keep_checksums_exact() {
        for [a, b, c, d] in FAMILIES {
            for p in [proto::TCP, proto::UDP, icmp_of(ip(a))] {
                for len in [0, 1, 101] {
                    let orig = frame(p, ip(a), ip(b), 4000, 80, &build::pattern(len, 3));
                    let k = parse(&orig, 0).unwrap().key;
                    let cases = [
                        (
                            "src",
                            FlowKey {
                                src: ip(c).into(),
                                ..k
                            },
                        ),
                        (
                            "dst",
                            FlowKey {
                                dst: ip(d).into(),
                                ..k
                            },
                        ),
                        (
                            "both",
                            FlowKey {
                                src: ip(c).into(),
                                dst: ip(d).into(),
                                src_port: 5555,
                                dst_port: 8080,
                                ..k
                            },
                        ),
                        (
                            "ports only",
                            FlowKey {
                                src_port: 5555,
                                dst_port: 8080,
                                ..k
                            },
                        ),
                        (
                            "addresses only",
                            FlowKey {
                                src: ip(c).into(),
                                dst: ip(d).into(),
                                ..k
                            },
                        ),
                        ("nothing", k),
                    ];
                    for (what, to) in cases {
                        check_rewrite(&orig, to, what);
                    }
                }
            }
        }
    }

    #[test]
    fn test_rewrite_unchanged_key_touches_nothing() {
        for [a, b, ..] in FAMILIES {
            let orig = frame(proto::TCP, ip(a), ip(b), 1, 2, b"data");
            let p = parse(&orig, 0).unwrap();
            let mut f = orig.clone();
            rewrite(&mut f, &p, false, &p.key).unwrap();
            assert_eq!(f, orig);
        }
    }

    #[test]
    fn test_udp_v4_zero_checksum_stays_zero() {
        let mut orig = frame(proto::UDP, ip("10.0.0.1"), ip("10.0.0.2"), 1, 2, b"abc");
        orig[40..42].fill(0);
        let k = parse(&orig, 0).unwrap().key;
        let to = FlowKey {
            src: Addr::from(ip("192.168.0.1")),
            dst: Addr::from(ip("192.168.0.2")),
            src_port: 9,
            dst_port: 10,
            ..k
        };
        let f = check_rewrite(&orig, to, "udp zero");
        assert_eq!(stored(&f, 40), 0);
    }

    #[test]
    fn test_udp_checksum_computed_as_zero_is_sent_as_ffff() {
        for [a, b, ..] in FAMILIES {
            let orig = frame(proto::UDP, ip(a), ip(b), 0, 53, b"abcd");
            let p = parse(&orig, 0).unwrap();
            // The checksum is !fold(rest + sport): pick the source port that makes it zero.
            let mut seg = orig[p.l4_off..].to_vec();
            seg[6..8].fill(0);
            let rest = fold(add(
                &seg,
                pseudo(p.key.src.ip(), p.key.dst.ip(), proto::UDP, seg.len()),
            ));
            let sport = 0xffff - rest;
            let to = FlowKey {
                src_port: sport,
                ..p.key
            };
            let f = check_rewrite(&orig, to, "udp to zero");
            assert_eq!(stored(&f, p.l4_off + 6), 0xffff);
        }
    }

    #[test]
    fn test_icmp_echo_request_and_reply_identifier_rewrite() {
        for [a, b, c, _] in FAMILIES {
            let req = frame(icmp_of(ip(a)), ip(a), ip(b), 0x77, 0, b"ping payload");
            let mut reply = req.clone();
            let p = parse(&req, 0).unwrap();
            reply[p.l4_off] = if ip(a).is_ipv4() { 0 } else { 129 };
            reply[p.l4_off + 2..p.l4_off + 4].fill(0);
            let c_full = full_l4(&reply[p.l4_off..], ip(a), ip(b), p.proto);
            reply[p.l4_off + 2..p.l4_off + 4].copy_from_slice(&c_full.to_be_bytes());
            for orig in [&req, &reply] {
                let k = parse(orig, 0).unwrap().key;
                for to in [
                    FlowKey {
                        src_port: 0x9001,
                        ..k
                    },
                    FlowKey {
                        src: ip(c).into(),
                        src_port: 0x9002,
                        ..k
                    },
                ] {
                    let f = check_rewrite(orig, to, "echo id");
                    assert_eq!(stored(&f, p.l4_off + 4), to.src_port);
                }
            }
        }
    }

    #[test]
    fn test_partial_checksum_rewrite_then_complete_partial() {
        for [a, b, c, d] in FAMILIES {
            for p in [proto::TCP, proto::UDP, icmp_of(ip(a))] {
                let orig = frame(p, ip(a), ip(b), 4000, 80, &build::pattern(77, 1));
                let pr = parse(&orig, 0).unwrap();
                let len = pr.ip_end - pr.l4_off;
                let at = pr.l4_off + csum_at(p);
                let mut f = orig.clone();
                let partial = fold(pseudo(ip(a), ip(b), p, len));
                f[at..at + 2].copy_from_slice(&partial.to_be_bytes());
                let to = FlowKey {
                    src: ip(c).into(),
                    dst: ip(d).into(),
                    src_port: 5555,
                    dst_port: 8080,
                    ..pr.key
                };
                rewrite(&mut f, &pr, true, &to).unwrap();
                assert_eq!(stored(&f, at), fold(pseudo(ip(c), ip(d), p, len)));
                complete_partial(&mut f, pr.l4_off, csum_at(p)).unwrap();
                let q = assert_checksums(&f);
                assert_eq!(
                    (q.key.src, q.key.dst, q.key.src_port),
                    (to.src, to.dst, 5555)
                );
            }
        }
    }

    /// Cuts `whole` into fragments of at most `mtu` bytes of IP packet.
    fn fragments(whole: &[u8], mtu: usize) -> Vec<Packet> {
        let p = parse(whole, 0).unwrap();
        let mut out = Vec::new();
        ipf::refragment(&Packet::new(whole.to_vec(), 1, 0), &p, mtu, &mut out).unwrap();
        assert!(out.len() > 2);
        out
    }

    #[test]
    fn test_first_fragment_rewrite_reassembles_to_a_valid_l4_checksum() {
        for [a, b, c, d] in FAMILIES {
            for p in [proto::TCP, proto::UDP] {
                let whole = frame(p, ip(a), ip(b), 4000, 80, &build::pattern(3000, 9));
                let wp = parse(&whole, 0).unwrap();
                let to = FlowKey {
                    src: ip(c).into(),
                    dst: ip(d).into(),
                    src_port: 5555,
                    dst_port: 8080,
                    ..wp.key
                };
                let mut r = Reassembler::new(ipf::Config::default());
                let mut drops = DropCounters::default();
                let mut done = None;
                for (i, mut frag) in fragments(&whole, 1280).into_iter().enumerate() {
                    let fp = parse(&frag.data, 0).unwrap();
                    assert_eq!(fp.is_later_fragment(), i > 0);
                    rewrite(&mut frag.data, &fp, false, &to).unwrap();
                    let fp = assert_checksums(&frag.data);
                    assert_eq!((fp.key.src, fp.key.dst), (to.src, to.dst));
                    match r.process(frag, &fp, &mut drops) {
                        Outcome::Held => {}
                        Outcome::Complete(pkt, _) => done = Some(pkt),
                        Outcome::Dropped(why) => panic!("fragment {i} dropped: {why}"),
                    }
                }
                let done = done.expect("datagram completes");
                let q = assert_checksums(&done.data);
                assert_eq!(q.key, to);
                // The same bytes as rewriting the datagram whole.
                let mut direct = whole.clone();
                rewrite(&mut direct, &wp, false, &to).unwrap();
                assert_eq!(done.data[q.l4_off..q.ip_end], direct[wp.l4_off..]);
            }
        }
    }

    #[test]
    fn test_later_fragment_changes_only_addresses() {
        for [a, b, c, d] in FAMILIES {
            let whole = frame(proto::UDP, ip(a), ip(b), 4000, 80, &build::pattern(3000, 2));
            let later = fragments(&whole, 1280).swap_remove(1).data;
            let p = parse(&later, 0).unwrap();
            assert!(p.is_later_fragment());
            let to = FlowKey {
                src: ip(c).into(),
                dst: ip(d).into(),
                src_port: 5555,
                dst_port: 8080,
                ..p.key
            };
            let mut f = later.clone();
            rewrite(&mut f, &p, false, &to).unwrap();
            let q = assert_checksums(&f);
            assert_eq!(
                q.key,
                FlowKey {
                    src_port: 0,
                    dst_port: 0,
                    ..to
                }
            );
            // Only the addresses (and the IPv4 header checksum) differ.
            let [s, e] = if p.l3 == L3::Ipv4 {
                [14 + 10, 14 + 20]
            } else {
                [14 + 8, 14 + 40]
            };
            assert_eq!(f[..s], later[..s]);
            assert_eq!(f[e..], later[e..]);
        }
    }

    #[test]
    fn test_rewrite_refuses_other_family_or_protocol() {
        let orig = frame(proto::UDP, ip("10.0.0.1"), ip("10.0.0.2"), 1, 2, b"x");
        let p = parse(&orig, 0).unwrap();
        let mut f = orig.clone();
        let bad = [
            FlowKey {
                src: Addr::from(ip("fd00::1")),
                ..p.key
            },
            FlowKey {
                dst: Addr::from(ip("fd00::1")),
                ..p.key
            },
            FlowKey {
                proto: proto::TCP,
                ..p.key
            },
        ];
        for to in bad {
            assert_eq!(
                rewrite(&mut f, &p, false, &to),
                Err(DropReason::IpLengthInvalid)
            );
        }
        let v6 = frame(proto::UDP, ip("fd00::1"), ip("fd00::2"), 1, 2, b"x");
        let p6 = parse(&v6, 0).unwrap();
        assert_eq!(
            rewrite(&mut f, &p6, false, &p.key),
            Err(DropReason::IpLengthInvalid)
        );
        // A parse that does not fit the frame.
        assert_eq!(
            rewrite(&mut f[..30], &p, false, &p.key),
            Err(DropReason::IpLengthInvalid)
        );
        assert_eq!(f, orig);
    }

    // --- ICMP errors

    /// A pod behind source NAT, as the outside sees it, and the router that answers.
    const POD4: &str = "10.244.1.5";
    const NODE4: &str = "192.168.1.10";
    const SERVER4: &str = "203.0.113.7";
    const ROUTER4: &str = "198.51.100.1";
    const POD6: &str = "fd00:244:1::5";
    const NODE6: &str = "2001:db8:1::10";
    const SERVER6: &str = "2001:db8:ff::7";
    const ROUTER6: &str = "2001:db8:aa::1";

    /// Builds the error `kind` a router sends about `orig` (as it left the node after
    /// SNAT), cut to `cut` quoted bytes, un-NATs it towards the pod, and checks every
    /// checksum from scratch. The translated quote must be the start of `orig` rewritten
    /// to the pod's key by [`rewrite`]: so its transport checksum is right where present.
    fn check_error_translation(orig: &[u8], kind: ErrorKind, cut: Option<usize>, pod_port: u16) {
        let op = parse(orig, 0).unwrap();
        let (pod, router) = if op.l3 == L3::Ipv4 {
            (ip(POD4), ip(ROUTER4))
        } else {
            (ip(POD6), ip(ROUTER6))
        };
        let e = build_error(orig, &op, kind, router, build::MAC_DST).unwrap();
        let e = cut.map_or(e.clone(), |n| truncate(&e, n));
        let ep = assert_checksums(&e);
        let emb = embedded(&e, &ep).unwrap().unwrap();
        assert_eq!(emb.key, op.key);
        let inner = FlowKey {
            src: pod.into(),
            src_port: pod_port,
            ..emb.key
        };
        let mut f = e.clone();
        rewrite_icmp_error(&mut f, &ep, &emb, ep.key.src, pod.into(), &inner).unwrap();
        let fp = assert_checksums(&f);
        assert_eq!(
            fp.key,
            FlowKey {
                dst: pod.into(),
                ..ep.key
            }
        );
        let got = embedded(&f, &fp).unwrap().unwrap();
        assert_eq!(got.key, inner);
        assert_eq!(
            (got.l3_off, got.l4_off, got.len),
            (emb.l3_off, emb.l4_off, emb.len)
        );
        if op.l3 == L3::Ipv4 {
            let mut h = f[got.l3_off..got.l4_off].to_vec();
            set_ipv4_header(&mut h);
            assert_eq!(
                stored(&h, 10),
                stored(&f, got.l3_off + 10),
                "quoted IPv4 header"
            );
        }
        let mut o2 = orig.to_vec();
        rewrite(&mut o2, &op, false, &inner).unwrap();
        assert_checksums(&o2);
        // A transport checksum cut in half by the quote's end keeps its old half: the new
        // value cannot be derived from half of the old one.
        let q_end = got.l3_off + got.len;
        let n = if got.l4_off + csum_at(inner.proto) + 1 == q_end {
            got.len - 1
        } else {
            got.len
        };
        assert_eq!(
            f[got.l3_off..got.l3_off + n],
            o2[op.l3_off..op.l3_off + n],
            "quote of {} cut at {cut:?}",
            inner
        );
        // The ICMP header and the bytes after the quote's changed fields are untouched.
        assert_eq!(f[fp.l4_off..fp.l4_off + 2], e[ep.l4_off..ep.l4_off + 2]);
        assert_eq!(f[fp.l4_off + 4..got.l3_off], e[ep.l4_off + 4..emb.l3_off]);
    }

    fn wire_packets(v6: bool) -> [(Vec<u8>, ErrorKind, u16); 4] {
        let (node, server, unreach) = if v6 {
            (ip(NODE6), ip(SERVER6), 4)
        } else {
            (ip(NODE4), ip(SERVER4), 3)
        };
        let icmp = icmp_of(node);
        let mut udp_none = frame(proto::UDP, node, server, 50000, 53, b"query");
        if !v6 {
            udp_none[40..42].fill(0); // UDP over IPv4 without a checksum
        }
        [
            (
                frame(proto::UDP, node, server, 50000, 53, &build::pattern(60, 5)),
                ErrorKind::Unreachable { code: unreach },
                4000,
            ),
            (
                frame(
                    proto::TCP,
                    node,
                    server,
                    50001,
                    443,
                    &build::pattern(1400, 6),
                ),
                ErrorKind::TooBig { mtu: 1280 },
                40000,
            ),
            (
                frame(icmp, node, server, 0x9000, 0, b"ping"),
                ErrorKind::TimeExceeded,
                0x77,
            ),
            (udp_none, ErrorKind::TimeExceeded, 4001),
        ]
    }

    #[test]
    fn test_icmp_error_translation_whole_quote() {
        for v6 in [false, true] {
            for (orig, kind, port) in wire_packets(v6) {
                check_error_translation(&orig, kind, None, port);
            }
        }
    }

    #[test]
    fn test_icmp_error_translation_truncated_quotes() {
        for v6 in [false, true] {
            let hdr = if v6 { 40 } else { 20 };
            for (orig, kind, port) in wire_packets(v6) {
                let whole = orig.len() - 14;
                for l4 in [8, 12, 17, 18, 20, 27] {
                    if hdr + l4 <= whole {
                        check_error_translation(&orig, kind, Some(hdr + l4), port);
                    }
                }
            }
        }
    }

    #[test]
    fn test_icmp_error_translation_refuses_mismatches() {
        let [(orig, kind, _), ..] = wire_packets(false);
        let op = parse(&orig, 0).unwrap();
        let e = build_error(&orig, &op, kind, ip(ROUTER4), build::MAC_DST).unwrap();
        let ep = parse(&e, 0).unwrap();
        let emb = embedded(&e, &ep).unwrap().unwrap();
        let mut f = e.clone();
        let (r, p) = (ip(ROUTER4), ip(POD4));
        let v6 = ip(POD6);
        let tcp = FlowKey {
            proto: proto::TCP,
            ..emb.key
        };
        let fam = FlowKey {
            src: v6.into(),
            ..emb.key
        };
        let e_ = Err(DropReason::IpLengthInvalid);
        assert_eq!(
            rewrite_icmp_error(&mut f, &ep, &emb, r.into(), v6.into(), &emb.key),
            e_
        );
        assert_eq!(
            rewrite_icmp_error(&mut f, &ep, &emb, r.into(), p.into(), &fam),
            e_
        );
        assert_eq!(
            rewrite_icmp_error(&mut f, &ep, &emb, r.into(), p.into(), &tcp),
            e_
        );
        let m = Err(DropReason::IcmpMalformed);
        let shifted = Embedded {
            l3_off: emb.l3_off + 1,
            ..emb
        };
        assert_eq!(
            rewrite_icmp_error(&mut f, &ep, &shifted, r.into(), p.into(), &emb.key),
            m
        );
        let long = Embedded {
            len: emb.len + 1,
            ..emb
        };
        assert_eq!(
            rewrite_icmp_error(&mut f, &ep, &long, r.into(), p.into(), &emb.key),
            m
        );
        assert_eq!(
            rewrite_icmp_error(&mut f, &op, &emb, r.into(), p.into(), &emb.key),
            m
        );
        assert_eq!(f, e);
    }

    // --- properties

    fn addr(v6: bool, b: [u8; 16]) -> IpAddr {
        if v6 {
            IpAddr::from(b)
        } else {
            IpAddr::from([b[0], b[1], b[2], b[3]])
        }
    }

    /// `k` with the fields that the bits of `change` name replaced: 1 the source, 2 the
    /// destination, 4 the source port, 8 the destination port.
    fn changed(k: FlowKey, change: u8, src: IpAddr, dst: IpAddr, ports: [u16; 2]) -> FlowKey {
        FlowKey {
            src: if change & 1 != 0 { src.into() } else { k.src },
            dst: if change & 2 != 0 { dst.into() } else { k.dst },
            src_port: if change & 4 != 0 {
                ports[0]
            } else {
                k.src_port
            },
            dst_port: if change & 8 != 0 {
                ports[1]
            } else {
                k.dst_port
            },
            ..k
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn prop_incremental_equals_full_recomputation(
            v6 in any::<bool>(),
            kind in 0usize..3,
            a in any::<[u8; 16]>(),
            b in any::<[u8; 16]>(),
            c in any::<[u8; 16]>(),
            d in any::<[u8; 16]>(),
            ports in any::<[u16; 4]>(),
            change in 0u8..16,
            partial in any::<bool>(),
            payload in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let (src, dst) = (addr(v6, a), addr(v6, b));
            let p = [proto::TCP, proto::UDP, icmp_of(src)][kind];
            let orig = frame(p, src, dst, ports[0], ports[1], &payload);
            let pr = parse(&orig, 0).unwrap();
            let to = changed(pr.key, change, addr(v6, c), addr(v6, d), [ports[2], ports[3]]);
            if partial {
                let at = pr.l4_off + csum_at(p);
                let len = pr.ip_end - pr.l4_off;
                let mut f = orig.clone();
                f[at..at + 2].copy_from_slice(&fold(pseudo(src, dst, p, len)).to_be_bytes());
                rewrite(&mut f, &pr, true, &to).unwrap();
                prop_assert_eq!(stored(&f, at), fold(pseudo(to.src.ip(), to.dst.ip(), p, len)));
                complete_partial(&mut f, pr.l4_off, csum_at(p)).unwrap();
                assert_checksums(&f);
            } else {
                check_rewrite(&orig, to, "random");
            }
        }

        /// The IPv4 TCP/UDP shortcut writes exactly what the general rewrite writes,
        /// partial checksums and UDP without a checksum included.
        #[test]
        fn prop_v4_shortcut_equals_general_rewrite(
            udp in any::<bool>(),
            a in any::<[u8; 16]>(),
            b in any::<[u8; 16]>(),
            c in any::<[u8; 16]>(),
            ports in any::<[u16; 4]>(),
            change in 0u8..16,
            partial in any::<bool>(),
            no_udp_csum in any::<bool>(),
            payload in proptest::collection::vec(any::<u8>(), 0..100),
        ) {
            let (src, dst) = (addr(false, a), addr(false, b));
            let p = if udp { proto::UDP } else { proto::TCP };
            let mut orig = frame(p, src, dst, ports[0], ports[1], &payload);
            let pr = parse(&orig, 0).unwrap();
            if udp && no_udp_csum {
                orig[pr.l4_off + 6..pr.l4_off + 8].copy_from_slice(&[0, 0]);
            }
            // A new destination is the original source: a hairpin.
            let to = changed(pr.key, change, addr(false, c), src, [ports[2], ports[3]]);
            let (mut short, mut general) = (orig.clone(), orig.clone());
            let r = rewrite(&mut short, &pr, partial, &to);
            let g = rewrite_any(&mut general, &pr, partial, &to);
            prop_assert_eq!(r, g);
            prop_assert_eq!(short, general);
        }

        #[test]
        fn prop_error_translation_equals_rewrite_of_the_quoted_packet(
            v6 in any::<bool>(),
            kind in 0usize..3,
            ports in any::<[u16; 3]>(),
            payload in proptest::collection::vec(any::<u8>(), 0..200),
            cut in any::<prop::sample::Index>(),
        ) {
            let (node, server) = if v6 { (ip(NODE6), ip(SERVER6)) } else { (ip(NODE4), ip(SERVER4)) };
            let p = [proto::TCP, proto::UDP, icmp_of(node)][kind];
            let orig = frame(p, node, server, ports[0], ports[1], &payload);
            let hdr = if v6 { 40 } else { 20 };
            let whole = orig.len() - 14;
            let n = hdr + 8 + cut.index(whole - hdr - 7);
            check_error_translation(&orig, ErrorKind::TimeExceeded, Some(n), ports[2]);
        }

        #[test]
        fn prop_random_quotes_never_panic_and_outer_checksums_hold(
            v6 in any::<bool>(),
            quote in proptest::collection::vec(any::<u8>(), 0..120),
            version_ok in any::<bool>(),
            inner_a in any::<[u8; 16]>(),
            inner_ports in any::<[u16; 2]>(),
        ) {
            let (node, server, router) = if v6 {
                (ip(NODE6), ip(SERVER6), ip(ROUTER6))
            } else {
                (ip(NODE4), ip(SERVER4), ip(ROUTER4))
            };
            let orig = frame(proto::UDP, node, server, 1, 2, &[0; 120]);
            let op = parse(&orig, 0).unwrap();
            let mut e = build_error(&orig, &op, ErrorKind::TimeExceeded, router, build::MAC_DST).unwrap();
            let q = parse(&e, 0).unwrap().l4_off + 8;
            e[q..q + quote.len()].copy_from_slice(&quote);
            if version_ok {
                e[q] = if v6 { 0x60 } else { 0x45 };
            }
            let e = truncate(&e, quote.len());
            let ep = parse(&e, 0).unwrap();
            if let Ok(Some(emb)) = embedded(&e, &ep) {
                let inner = FlowKey {
                    src: Addr::from(addr(v6, inner_a)),
                    src_port: inner_ports[0],
                    dst_port: inner_ports[1],
                    ..emb.key
                };
                let mut f = e.clone();
                rewrite_icmp_error(&mut f, &ep, &emb, router.into(), Addr::from(addr(v6, inner_a)), &inner).unwrap();
                let fp = assert_checksums(&f);
                prop_assert_eq!(embedded(&f, &fp).unwrap().unwrap().key.src, inner.src);
            }
        }

        #[test]
        fn prop_random_bytes_never_panic(
            v6 in any::<bool>(),
            bytes in proptest::collection::vec(any::<u8>(), 0..160),
            offs in any::<[u16; 4]>(),
            a in any::<[u8; 16]>(),
            ports in any::<[u16; 2]>(),
            partial in any::<bool>(),
        ) {
            let mut f = vec![0u8; 12];
            f.extend_from_slice(if v6 { &[0x86, 0xdd] } else { &[0x08, 0x00] });
            f.extend_from_slice(&bytes);
            let mut parsed = parse(&f, 0).ok();
            if parsed.is_none() {
                // Also take a well-formed packet and give the rewriter a parse that lies.
                let good = frame(proto::TCP, addr(v6, a), addr(v6, a), 1, 2, &bytes);
                let mut p = parse(&good, 0).unwrap();
                p.l3_off = usize::from(offs[0]) % 80;
                p.l4_off = usize::from(offs[1]) % 200;
                p.ip_end = usize::from(offs[2]) % 250;
                f = good;
                parsed = Some(p);
            }
            let p = parsed.unwrap();
            let to = FlowKey { src: Addr::from(addr(v6, a)), src_port: ports[0], dst_port: ports[1], ..p.key };
            let _ = rewrite(&mut f, &p, partial, &to);
            if let Ok(Some(emb)) = embedded(&f, &p) {
                let inner = FlowKey { src: Addr::from(addr(v6, a)), ..emb.key };
                let _ = rewrite_icmp_error(&mut f, &p, &emb, to.src, to.dst, &inner);
            }
            let emb = Embedded {
                key: p.key,
                l3_off: usize::from(offs[3]) % 300,
                l4_off: usize::from(offs[0]) % 300,
                len: usize::from(offs[1]),
            };
            let _ = rewrite_icmp_error(&mut f, &p, &emb, to.src, to.dst, &to);
        }
    }
}
