//! The header rewriter: addresses and ports (or ICMP echo identifiers) changed in place,
//! every checksum that covers them fixed incrementally (RFC 1624). NAT is its user.
//!
//! Runs per packet of every translated connection, so it never allocates and never sums a
//! payload: each changed 16-bit word is taken out of and put into the checksums that
//! cover it. The old values are read from the frame, not from the parsed key, so that a
//! frame rewritten twice with the same (stale) [`Parsed`] still gets right checksums.

use std::net::IpAddr;

use crate::drop::DropReason;
use crate::flow::{FlowKey, proto};
use crate::wire::checksum;
use crate::wire::icmp_error::{Embedded, ICMP_HDR, QUOTED_L4_MIN, is_echo};
use crate::wire::parse::{L3, Parsed};

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
    fn check(self, a: IpAddr, b: IpAddr) -> Result<(), DropReason> {
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

/// An address as bytes in a fixed buffer (no allocation): the first 4 or 16 bytes.
fn octets(a: IpAddr) -> ([u8; 16], usize) {
    match a {
        IpAddr::V4(v) => {
            let mut b = [0; 16];
            b[..4].copy_from_slice(&v.octets());
            (b, 4)
        }
        IpAddr::V6(v) => (v.octets(), 16),
    }
}

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
        // A partial field is a plain sum: complementing around the RFC 1624 update turns
        // eqn. 3 into "sum + ~old + new".
        self.value = if self.partial {
            !checksum::update(!self.value, old, new)
        } else {
            checksum::update(self.value, old, new)
        };
    }
}

/// Writes `new` at `off` when the bytes there differ, returning the old bytes (the first
/// `new.len()` of the buffer) if they did. Out of range is an error, never a panic.
fn replace(frame: &mut [u8], off: usize, new: &[u8]) -> Result<Option<[u8; 16]>, DropReason> {
    let field = off
        .checked_add(new.len())
        .and_then(|end| frame.get_mut(off..end))
        .ok_or(DropReason::IpLengthInvalid)?;
    if field == new {
        return Ok(None);
    }
    let mut old = [0; 16];
    old[..new.len()].copy_from_slice(field);
    field.copy_from_slice(new);
    Ok(Some(old))
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
/// the IP addresses; there is no transport header). Protocols other than TCP, UDP and
/// ICMP/ICMPv6 get their addresses rewritten only.
///
/// `parsed.key` is not updated (the caller does that). Errors, without a panic on any
/// input: `DropReason::IpLengthInvalid` if `to` differs in family or protocol, for a
/// non-IP packet, or if `parsed` does not fit the frame. The frame is left unchanged on
/// every error but the last kind.
pub fn rewrite(
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
    let mut ip_csum = match fam {
        Family::V4 => Some(Csum::full(read16(frame, l3 + IPV4_CSUM)?)),
        Family::V6 => None,
    };
    let mut l4_csum = match l4 {
        Some(t) => t.csum(frame, fam, parsed.proto, csum_partial)?,
        None => None,
    };
    let pseudo = l4.is_some_and(|t| t.pseudo);

    for (off, addr) in fam.addr_offs().into_iter().zip([to.src, to.dst]) {
        let (buf, n) = octets(addr);
        let new = &buf[..n];
        if let Some(old) = replace(frame, l3 + off, new)? {
            let old = &old[..n];
            if let Some(c) = ip_csum.as_mut() {
                c.update(old, new);
            }
            if let Some(c) = l4_csum.as_mut().filter(|_| pseudo) {
                c.update(old, new);
            }
        }
    }

    if let Some(t) = l4 {
        let ids: &[(usize, u16)] = match t.ids {
            Ids::Ports => &[(0, to.src_port), (2, to.dst_port)],
            Ids::EchoId => &[(4, to.src_port)],
            Ids::None => &[],
        };
        for &(off, v) in ids {
            let new = v.to_be_bytes();
            if let Some(old) = replace(frame, t.off + off, &new)? {
                // A partial sum covers only the pseudo-header: identifiers are not in it.
                if let Some(c) = l4_csum.as_mut().filter(|c| !c.partial) {
                    c.update(&old[..2], &new);
                }
            }
        }
        if let (Some(c), Some(at)) = (l4_csum, t.csum_off) {
            store_l4(frame, at, parsed.proto, c)?;
        }
    }
    if let Some(c) = ip_csum {
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
/// UDP's and ICMP's but not TCP's); and the outer ICMP checksum, which covers every quoted
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
    outer_src: IpAddr,
    outer_dst: IpAddr,
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
        let (buf, n) = octets(addr);
        let new = &buf[..n];
        if let Some(old) = replace(frame, l3 + off, new)? {
            let old = &old[..n];
            if let Some(c) = ip_csum.as_mut() {
                c.update(old, new);
            }
            if fam == Family::V6 {
                icmp_csum.update(old, new);
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
        let (buf, n) = octets(addr);
        let new = &buf[..n];
        if let Some(old) = replace(frame, q + off, new)? {
            let old = &old[..n];
            icmp_csum.update(old, new);
            if let Some(c) = q_ip_csum.as_mut() {
                c.update(old, new);
            }
            if let Some(c) = q_l4_csum.as_mut().filter(|_| pseudo) {
                c.update(old, new);
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
            if let Some(old) = replace(frame, t.off + off, &new)? {
                icmp_csum.update(&old[..2], &new);
                if let Some(c) = q_l4_csum.as_mut() {
                    c.update(&old[..2], &new);
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
