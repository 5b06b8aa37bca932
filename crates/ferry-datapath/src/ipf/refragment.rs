//! Refragmentation: cutting a packet back into fragments for a smaller MTU.
//!
//! Used on output for datagrams that ipf reassembled (cut to min(MRU, MTU), so that the
//! receiver sees fragments no larger than the sender chose) and for IPv4 packets without
//! DF that are too big for the egress MTU. The caller decides whether a packet may be
//! fragmented at all (DF, IPv6 not from reassembly); this module only cuts.

use crate::drop::DropReason;
use crate::packet::{Meta, Packet};
use crate::wire::checksum::set_ipv4_header;
use crate::wire::ipv6_ext::{self, Fragment};
use crate::wire::parse::IPV6_LEN;
use crate::wire::{L3, Parsed};

/// Cuts a (reassembled, or never-fragmented IPv4 without DF) IP packet into fragments
/// whose whole IP packet length is <= `max_ip_len`, appending frames to `out`.
///
/// A packet that already fits is appended as it is (without Ethernet padding). Every
/// output frame keeps the L2 header (and 802.1Q tag) and the meta of `pkt`, except
/// `meta.mru` and `meta.frag_id`, which are zeroed: the output is no longer a reassembled
/// datagram. Non-final fragments carry a multiple of 8 data bytes.
///
/// IPv4 keeps the identification of the IP header; the first fragment keeps every option,
/// later ones only those with the copied flag (RFC 791); DF is kept as the packet has it
/// on every fragment (as Linux does: reassembly sets it only when the largest fragment
/// received had it, and the caller refuses a DF packet larger than the MTU) and MF is set
/// on all but the last fragment; header checksums are recomputed.
///
/// IPv6 inserts a fragment header after the unfragmentable part, which is the base header
/// through the last hop-by-hop or routing header (so destination options before a
/// routing header stay too, and those after it travel in the first fragment), as RFC 8200
/// section 4.5 says; the parser found it ([`Parsed::unfrag_end`]). The identification is `pkt.meta.frag_id` (set by reassembly); when
/// that is zero, one is derived from a hash of the IP packet, so that the same packet is
/// always cut the same way and replays stay reproducible. A packet that is itself a
/// fragment (or an atomic fragment) keeps its fragment header's identification and offset.
///
/// Returns `Err(DropReason::MtuTooSmall)` when `max_ip_len` cannot carry 8 bytes of data
/// after the headers; nothing is appended on error.
pub fn refragment(
    pkt: &Packet,
    parsed: &Parsed,
    max_ip_len: usize,
    out: &mut Vec<Packet>,
) -> Result<(), DropReason> {
    let l3 = parsed.l3_off;
    if parsed.ip_end > pkt.data.len() || l3 > parsed.ip_end {
        return Err(DropReason::IpLengthInvalid);
    }
    let mut meta = pkt.meta;
    meta.mru = 0;
    meta.frag_id = 0;
    if parsed.ip_len() <= max_ip_len {
        out.push(Packet {
            data: pkt.data[..parsed.ip_end].to_vec(),
            meta,
        });
        return Ok(());
    }
    match parsed.l3 {
        L3::Ipv4 => refragment_v4(pkt, parsed, max_ip_len, meta, out),
        L3::Ipv6 => refragment_v6(pkt, parsed, max_ip_len, meta, out),
        L3::Arp => Err(DropReason::UnsupportedEthertype),
    }
}

fn refragment_v4(
    pkt: &Packet,
    parsed: &Parsed,
    max_ip_len: usize,
    meta: Meta,
    out: &mut Vec<Packet>,
) -> Result<(), DropReason> {
    let b = &pkt.data[..parsed.ip_end];
    let l3 = parsed.l3_off;
    let ihl = parsed.l4_off.saturating_sub(l3);
    if !(20..=60).contains(&ihl) || l3 + ihl > b.len() {
        return Err(DropReason::Ipv4HeaderMalformed);
    }
    let first_hdr = &b[l3..l3 + ihl];
    let (later_hdr, later_len) = copied_options_header(first_hdr)?;
    let later_hdr = &later_hdr[..later_len];
    let data = &b[l3 + ihl..];
    let first_chunk = max_ip_len.saturating_sub(ihl) & !7;
    let later_chunk = max_ip_len.saturating_sub(later_len) & !7;
    if first_chunk < 8 || later_chunk < 8 {
        return Err(DropReason::MtuTooSmall);
    }
    let (base, more_after) = parsed
        .frag
        .map_or((0, false), |f| (usize::from(f.offset), f.more));
    let mut pos = 0;
    while pos < data.len() {
        let (hdr, chunk) = if pos == 0 {
            (first_hdr, first_chunk)
        } else {
            (later_hdr, later_chunk)
        };
        let n = chunk.min(data.len() - pos);
        let more = pos + n < data.len() || more_after;
        let mut f = Vec::with_capacity(l3 + hdr.len() + n);
        f.extend_from_slice(&b[..l3]);
        f.extend_from_slice(hdr);
        f.extend_from_slice(&data[pos..pos + n]);
        let h = &mut f[l3..l3 + hdr.len()];
        h[2..4].copy_from_slice(&((hdr.len() + n) as u16).to_be_bytes());
        // Offset in 8-byte units; the reserved bit and DF are kept, MF as computed.
        let word = ((base + pos) / 8) as u16 & 0x1fff | if more { 0x2000 } else { 0 };
        let [hi, lo] = word.to_be_bytes();
        h[6] = (h[6] & 0xc0) | hi;
        h[7] = lo;
        set_ipv4_header(h);
        out.push(Packet { data: f, meta });
        pos += n;
    }
    Ok(())
}

/// The IPv4 header for fragments after the first: the fixed header and only the options
/// whose copied flag is set, padded with end-of-options to a multiple of 4 (RFC 791).
fn copied_options_header(hdr: &[u8]) -> Result<([u8; 60], usize), DropReason> {
    let mut out = [0u8; 60];
    out[..20].copy_from_slice(&hdr[..20]);
    let mut len = 20;
    let mut i = 20;
    while i < hdr.len() {
        match hdr[i] {
            0 => break,
            1 => i += 1,
            kind => {
                let opt_len = usize::from(*hdr.get(i + 1).ok_or(DropReason::Ipv4HeaderMalformed)?);
                if opt_len < 2 || i + opt_len > hdr.len() {
                    return Err(DropReason::Ipv4HeaderMalformed);
                }
                if kind & 0x80 != 0 {
                    out[len..len + opt_len].copy_from_slice(&hdr[i..i + opt_len]);
                    len += opt_len;
                }
                i += opt_len;
            }
        }
    }
    // Padding bytes are already zero (end of options).
    len = len.div_ceil(4) * 4;
    out[0] = 0x40 | (len / 4) as u8;
    Ok((out, len))
}

fn refragment_v6(
    pkt: &Packet,
    parsed: &Parsed,
    max_ip_len: usize,
    meta: Meta,
    out: &mut Vec<Packet>,
) -> Result<(), DropReason> {
    let b = &pkt.data[..parsed.ip_end];
    let l3 = parsed.l3_off;
    if l3 + IPV6_LEN > b.len() {
        return Err(DropReason::Ipv6HeaderMalformed);
    }
    let split = split_v6(b, l3, parsed)?;
    let unfrag = &b[l3..split.unfrag_end];
    let data = &b[split.data_start..];
    let chunk = max_ip_len.saturating_sub(unfrag.len() + 8) & !7;
    if chunk < 8 {
        return Err(DropReason::MtuTooSmall);
    }
    let id = match (split.existing, pkt.meta.frag_id) {
        (Some((id, _, _)), _) => id,
        (None, id) if id != 0 => id,
        (None, _) => derived_id(&b[l3..]),
    };
    let (base, more_after) = split
        .existing
        .map_or((0, false), |(_, off, more)| (usize::from(off), more));
    let nh_at = split.nh_at - l3;
    let mut pos = 0;
    while pos < data.len() {
        let n = chunk.min(data.len() - pos);
        let more = pos + n < data.len() || more_after;
        let mut f = Vec::with_capacity(l3 + unfrag.len() + 8 + n);
        f.extend_from_slice(&b[..l3]);
        f.extend_from_slice(unfrag);
        f[l3 + nh_at] = ipv6_ext::FRAGMENT;
        Fragment {
            next_header: split.frag_nh,
            offset: (base + pos) as u16,
            more,
            id,
        }
        .emit(&mut f);
        f.extend_from_slice(&data[pos..pos + n]);
        let payload = (unfrag.len() - IPV6_LEN + 8 + n) as u16;
        f[l3 + 4..l3 + 6].copy_from_slice(&payload.to_be_bytes());
        out.push(Packet { data: f, meta });
        pos += n;
    }
    Ok(())
}

/// Where an IPv6 packet splits into the part every fragment repeats and the part cut up.
struct SplitV6 {
    /// End of the unfragmentable part (frame offset).
    unfrag_end: usize,
    /// The next-header field that will name the fragment header (frame offset).
    nh_at: usize,
    /// Next header for the fragment header: the first header of the fragmentable part.
    frag_nh: u8,
    /// Start of the fragmentable part (frame offset).
    data_start: usize,
    /// For a packet that already has a fragment header: its id, offset and M flag.
    existing: Option<(u32, u16, bool)>,
}

/// The split as the parser recorded it, checked against the packet's bytes `b` so that
/// nothing indexes out of them whatever `parsed` says.
fn split_v6(b: &[u8], l3: usize, parsed: &Parsed) -> Result<SplitV6, DropReason> {
    let bad = DropReason::Ipv6ExtHeaderMalformed;
    let (unfrag_end, nh_at) = (parsed.unfrag_end, parsed.unfrag_nh);
    if nh_at < l3 + ipv6_ext::FIXED_NEXT_HEADER || nh_at >= unfrag_end || unfrag_end > b.len() {
        return Err(bad);
    }
    if parsed.frag_hdr_off != 0 {
        // Already has a fragment header: what precedes it is the unfragmentable part.
        let fh = parsed.frag_hdr_off;
        let frag = b
            .get(fh..)
            .and_then(Fragment::parse)
            .filter(|_| fh == unfrag_end)
            .ok_or(bad)?;
        return Ok(SplitV6 {
            unfrag_end,
            nh_at,
            frag_nh: frag.next_header,
            data_start: fh + ipv6_ext::FRAGMENT_LEN,
            existing: Some((frag.id, frag.offset, frag.more)),
        });
    }
    Ok(SplitV6 {
        unfrag_end,
        nh_at,
        frag_nh: b[nh_at],
        data_start: unfrag_end,
        existing: None,
    })
}

/// A fragment identification from the packet's bytes (FNV-1a), never zero: used only
/// when the packet did not come from reassembly and so has no identification of its own.
fn derived_id(ip: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &byte in ip {
        h ^= u32::from(byte);
        h = h.wrapping_mul(0x0100_0193);
    }
    h.max(1)
}
