//! Receive coalescing: consecutive TCP segments of one flow become one GSO super-packet.
//!
//! The inverse of [`crate::gso`]. A port that takes virtio-net headers (a pod's TAP) can be
//! handed one super-packet instead of a run of MSS-sized segments, which saves a write per
//! segment and the receiving kernel's per-packet work, as Linux's GRO does for a NIC.
//!
//! Only runs of *adjacent* packets in a batch are merged: a segment of another flow (or
//! anything else) between two segments ends the run, so the order of everything in the
//! batch is kept. The rules for a segment to join a run are those of Linux's TCP GRO:
//! - it is a plain packet: no GSO request, no partial checksum, not a fragment;
//! - same link header, same addresses and ports; IPv4 without options and with the same
//!   TOS, TTL and DF, its identification equal to the previous one's or one more (the same
//!   relation throughout the run); IPv6 without extension headers and with the same
//!   traffic class, flow label and hop limit;
//! - its sequence number follows the previous segment's payload; same acknowledgment
//!   number, window, urgent pointer and TCP options (bytes compared);
//! - flags exactly ACK, or ACK and PSH; a PSH segment is the last of its run;
//! - every segment but the last carries exactly the first's payload length (which becomes
//!   `gso_size`), the last at most that;
//! - the result stays within [`MAX_IP_LEN`] and [`MAX_SEGMENTS`].
//!
//! **Checksums.** The merged packet goes out with `NEEDS_CSUM`, which the receiving
//! kernel takes as "the sender will fill this in", not as something to verify, so a
//! corrupted segment folded into it would be delivered as good data. Each segment's TCP
//! checksum is therefore verified before it may join a run (one summing pass over bytes
//! that are copied anyway), unless it arrived with `DATA_VALID`. A segment that fails is
//! left alone, as a run of its own, for the receiver to drop and count as it would have
//! without coalescing.

use crate::flow::proto;
use crate::packet::{Meta, Packet, VnetHdr};
use crate::wire::build::tcp_flags;
use crate::wire::checksum;
use crate::wire::parse::{self, IPV6_LEN, L3, Parsed};

/// Largest IP packet a run may become (the IPv4 total length field's limit; IPv6 is held
/// to the same so that both families behave alike).
pub const MAX_IP_LEN: usize = 65_535;
/// Most segments merged into one packet. Full-sized segments reach [`MAX_IP_LEN`] first;
/// this bounds what a receiver that re-segments the packet (a pod that routes) must cut
/// from a flow of tiny segments.
pub const MAX_SEGMENTS: usize = 64;

/// IPv4 header length without options.
const IPV4_LEN: usize = 20;
/// TCP header length without options.
const TCP_MIN_LEN: usize = 20;
/// Offset of the checksum in the TCP header.
const TCP_CSUM: usize = 16;

/// Where a segment that may be coalesced keeps its headers and payload.
#[derive(Clone, Copy, Debug)]
struct Segment {
    l3: L3,
    l3_off: usize,
    l4_off: usize,
    /// End of the TCP header, where the payload starts.
    hdr_end: usize,
    ip_end: usize,
    seq: u32,
    flags: u8,
    /// IPv4 identification (zero for IPv6).
    id: u16,
}

impl Segment {
    /// The segment's layout if `pkt` may be coalesced at all (see the module docs).
    fn of(pkt: &Packet) -> Option<Segment> {
        let p = parse::parse(&pkt.data, pkt.meta.zone).ok()?;
        Segment::of_parsed(&pkt.data, &pkt.meta, &p)
    }

    /// [`Segment::of`] for frame `data` with metadata `meta`, parsed already as `p`.
    fn of_parsed(data: &[u8], meta: &Meta, p: &Parsed) -> Option<Segment> {
        let v = meta.vnet;
        if v.is_gso() || v.needs_csum() {
            return None;
        }
        if !p.is_ip()
            || p.proto != proto::TCP
            || p.frag.is_some()
            || p.frag_hdr_off != 0
            || !p.l4_complete
        {
            return None;
        }
        let plain_ip = match p.l3 {
            L3::Ipv4 => IPV4_LEN,
            _ => IPV6_LEN,
        };
        if p.l4_off - p.l3_off != plain_ip {
            return None;
        }
        let t = data.get(p.l4_off..p.ip_end)?;
        let tcp_len = usize::from(*t.get(12)? >> 4) * 4;
        if tcp_len < TCP_MIN_LEN || tcp_len >= t.len() {
            // No payload: a pure ACK is never coalesced.
            return None;
        }
        if p.tcp_flags & !tcp_flags::PSH != tcp_flags::ACK {
            return None;
        }
        if v.flags & VnetHdr::F_DATA_VALID == 0 {
            let pseudo = pseudo_header(data, p.l3, p.l3_off, t.len());
            if !checksum::verify(t, pseudo) {
                return None;
            }
        }
        let ip = &data[p.l3_off..];
        Some(Segment {
            l3: p.l3,
            l3_off: p.l3_off,
            l4_off: p.l4_off,
            hdr_end: p.l4_off + tcp_len,
            ip_end: p.ip_end,
            seq: u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
            flags: p.tcp_flags,
            id: match p.l3 {
                L3::Ipv4 => u16::from_be_bytes([ip[4], ip[5]]),
                _ => 0,
            },
        })
    }

    fn payload_len(&self) -> usize {
        self.ip_end - self.hdr_end
    }
}

/// True when `b` belongs to the same flow as `a` with the same headers, apart from the
/// fields that differ between consecutive segments (lengths, IPv4 identification and
/// header checksum, sequence number, flags, TCP checksum).
fn same_headers(a: &[u8], sa: &Segment, b: &[u8], sb: &Segment) -> bool {
    if sa.l3 != sb.l3 || sa.l3_off != sb.l3_off || sa.hdr_end != sb.hdr_end {
        return false;
    }
    let (l3, l4, end) = (sa.l3_off, sa.l4_off, sa.hdr_end);
    let same = |r: std::ops::Range<usize>| a[r.clone()] == b[r];
    let ip_same = match sa.l3 {
        // Version/IHL/TOS; flags, fragment offset, TTL, protocol; addresses.
        L3::Ipv4 => same(l3..l3 + 2) && same(l3 + 6..l3 + 10) && same(l3 + 12..l3 + 20),
        // Version, traffic class, flow label; next header, hop limit, addresses.
        _ => same(l3..l3 + 4) && same(l3 + 6..l3 + IPV6_LEN),
    };
    // Link header; TCP ports; acknowledgment number and data offset; window; urgent
    // pointer and options.
    same(0..l3)
        && ip_same
        && same(l4..l4 + 4)
        && same(l4 + 8..l4 + 13)
        && same(l4 + 14..l4 + 16)
        && same(l4 + 18..end)
}

/// The pseudo-header sum of the TCP segment of `l4_len` bytes in `data`.
fn pseudo_header(data: &[u8], l3: L3, l3_off: usize, l4_len: usize) -> u64 {
    checksum::pseudo_header(&data[l3_off..], l3 == L3::Ipv6, proto::TCP, l4_len)
}

/// A run being built: the first packet, whose buffer grows with the others' payloads.
#[derive(Debug)]
struct Run {
    pkt: Packet,
    first: Segment,
    last: Segment,
    segments: usize,
    /// The step of the IPv4 identification within the run (0 or 1), once known.
    id_step: Option<u16>,
    /// Payload bytes so far.
    payload: usize,
}

impl Run {
    fn start(pkt: Packet, seg: Segment) -> Run {
        Run {
            pkt,
            first: seg,
            last: seg,
            segments: 1,
            id_step: None,
            payload: seg.payload_len(),
        }
    }

    /// Appends the segment in frame `data` to the run if it may join; false otherwise.
    fn push(&mut self, data: &[u8], seg: Segment) -> bool {
        let mss = self.first.payload_len();
        let last = &self.last;
        let joins = last.flags & tcp_flags::PSH == 0
            && last.payload_len() == mss
            && seg.payload_len() <= mss
            && self.segments < MAX_SEGMENTS
            && self.first.hdr_end - self.first.l3_off + self.payload + seg.payload_len()
                <= MAX_IP_LEN
            && seg.seq == last.seq.wrapping_add(last.payload_len() as u32)
            && self
                .id_step
                .is_none_or(|s| seg.id == last.id.wrapping_add(s))
            && (self.first.l3 != L3::Ipv4 || matches!(seg.id.wrapping_sub(last.id), 0 | 1))
            && same_headers(&self.pkt.data, &self.first, data, &seg);
        if !joins {
            return false;
        }
        if self.segments == 1 {
            // Drop any link padding after the first IP packet before appending to it,
            // and make room for the largest run at once: growing step by step would
            // copy the run each time.
            self.pkt.data.truncate(self.first.ip_end);
            let room = self.first.l3_off + MAX_IP_LEN;
            self.pkt
                .data
                .reserve(room.saturating_sub(self.first.ip_end));
            if self.first.l3 == L3::Ipv4 {
                self.id_step = Some(seg.id.wrapping_sub(last.id));
            }
        }
        self.pkt
            .data
            .extend_from_slice(&data[seg.hdr_end..seg.ip_end]);
        self.payload += seg.payload_len();
        self.segments += 1;
        self.last = seg;
        true
    }

    /// The run as one packet: unchanged if it is a single segment, a GSO packet otherwise.
    fn finish(self) -> Packet {
        let mut pkt = self.pkt;
        if self.segments == 1 {
            return pkt;
        }
        let f = self.first;
        let data = &mut pkt.data;
        let ip_len = data.len() - f.l3_off;
        let l4_len = data.len() - f.l4_off;
        let gso_type = match f.l3 {
            L3::Ipv4 => {
                let ip = &mut data[f.l3_off..f.l4_off];
                ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
                checksum::set_ipv4_header(ip);
                VnetHdr::GSO_TCPV4
            }
            _ => {
                let len = (ip_len - IPV6_LEN) as u16;
                data[f.l3_off + 4..f.l3_off + 6].copy_from_slice(&len.to_be_bytes());
                VnetHdr::GSO_TCPV6
            }
        };
        data[f.l4_off + 13] |= self.last.flags & tcp_flags::PSH;
        let pseudo = checksum::fold(pseudo_header(data, f.l3, f.l3_off, l4_len));
        data[f.l4_off + TCP_CSUM..f.l4_off + TCP_CSUM + 2].copy_from_slice(&pseudo.to_be_bytes());
        pkt.meta.vnet = VnetHdr {
            flags: VnetHdr::F_NEEDS_CSUM,
            gso_type,
            hdr_len: f.hdr_end as u16,
            gso_size: f.payload_len() as u16,
            csum_start: f.l4_off as u16,
            csum_offset: TCP_CSUM as u16,
        };
        pkt
    }
}

/// Merges each run of consecutive TCP segments of one flow in `pkts` into one GSO
/// super-packet (`NEEDS_CSUM`, `GSO_TCPV4`/`GSO_TCPV6`, `gso_size` the first segment's
/// payload), following the rules in the module docs. The merged packet keeps the first
/// segment's headers and metadata, with the IP length (and IPv4 header checksum) fixed,
/// PSH taken from the last segment and the TCP checksum field holding the folded
/// pseudo-header sum. Everything else stays as it was, in order.
pub fn coalesce(pkts: &mut Vec<Packet>) {
    if pkts.len() < 2 {
        return;
    }
    let input = std::mem::take(pkts);
    let mut c = Coalescer::new(std::mem::replace(pkts, Vec::with_capacity(input.len())));
    for pkt in input {
        c.push(pkt);
    }
    *pkts = c.finish();
}

/// [`coalesce`] one packet at a time: the packets made go to a vector, in order. A
/// segment offered as a slice of a larger buffer ([`Coalescer::push_frame`]) is copied
/// once, into the run it joins or into a packet of its own.
#[derive(Debug, Default)]
pub(crate) struct Coalescer {
    run: Option<Run>,
    out: Vec<Packet>,
}

impl Coalescer {
    /// A coalescer that appends what it makes to `out`.
    pub fn new(out: Vec<Packet>) -> Coalescer {
        Coalescer { run: None, out }
    }

    /// Offers `pkt`.
    pub fn push(&mut self, pkt: Packet) {
        let Some(seg) = Segment::of(&pkt) else {
            self.end_run();
            self.out.push(pkt);
            return;
        };
        if let Some(r) = &mut self.run
            && r.push(&pkt.data, seg)
        {
            return;
        }
        self.start(pkt, seg);
    }

    /// Offers the frame `data`, parsed as `parsed`, with metadata `meta`: copied into the
    /// run it joins, or else into a packet of its own.
    pub fn push_frame(&mut self, data: &[u8], parsed: &Parsed, meta: &Meta) {
        let Some(seg) = Segment::of_parsed(data, meta, parsed) else {
            self.end_run();
            self.out.push(Packet {
                data: data.to_vec(),
                meta: *meta,
            });
            return;
        };
        if let Some(r) = &mut self.run
            && r.push(data, seg)
        {
            return;
        }
        let pkt = Packet {
            data: data.to_vec(),
            meta: *meta,
        };
        self.start(pkt, seg);
    }

    /// Ends the run being built, if any, so that what comes next follows it.
    fn end_run(&mut self) {
        if let Some(r) = self.run.take() {
            self.out.push(r.finish());
        }
    }

    /// What was made, in order.
    pub fn finish(mut self) -> Vec<Packet> {
        self.end_run();
        self.out
    }

    fn start(&mut self, pkt: Packet, seg: Segment) {
        if let Some(r) = self.run.replace(Run::start(pkt, seg)) {
            self.out.push(r.finish());
        }
    }
}

/// Marks an oversized TCP packet from a GRO port, whose MTU is `mtu`, as the
/// super-packet it is, the way the kernel hands one over: the segment size is what the
/// MTU carries with these headers, and the checksum is left partial (pseudo-header sum,
/// NEEDS_CSUM) for whoever segments it or receives it whole.
pub(crate) fn mark_coalesced(pkt: &mut Packet, parsed: &Parsed, mtu: u16) {
    let headers = crate::gso::headers_len(&pkt.data, parsed);
    let mss = usize::from(mtu).saturating_sub(headers).max(8);
    let l4_len = parsed.ip_end - parsed.l4_off;
    let pseudo = checksum::pseudo(parsed.key.src.ip(), parsed.key.dst.ip(), proto::TCP, l4_len);
    let field = parsed.l4_off + 16;
    pkt.data[field..field + 2].copy_from_slice(&checksum::fold(pseudo).to_be_bytes());
    let v = &mut pkt.meta.vnet;
    v.gso_type = if parsed.l3 == L3::Ipv4 {
        VnetHdr::GSO_TCPV4
    } else {
        VnetHdr::GSO_TCPV6
    };
    v.gso_size = mss as u16;
    v.hdr_len = (parsed.l3_off + headers) as u16;
    v.flags |= VnetHdr::F_NEEDS_CSUM;
    v.csum_start = parsed.l4_off as u16;
    v.csum_offset = 16;
}

#[cfg(test)]
mod tests;
