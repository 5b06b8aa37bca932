//! The decap stage: VXLAN from a known node, one datagram or a UDP GSO super-frame of
//! them, becomes the inner packet, which goes on as if received from a tunnel port in
//! the uplink's zone; the node it came from is remembered for the reply path.

use std::net::IpAddr;

use super::{Pipeline, Trace, TraceEvent, Verdict, combine};
use crate::drop::DropReason;
use crate::flow::proto;
use crate::gro;
use crate::gso;
use crate::overlay;
use crate::packet::{Meta, Packet, PortId, VnetHdr};
use crate::tables::{Overlay, Tables};
use crate::wire::vxlan;
use crate::wire::{L3, Parsed, parse};

impl Pipeline {
    /// A UDP GSO super-frame of VXLAN datagrams from a peer node (one that segmented
    /// its encapsulated packets as a super-frame, see [`overlay::encapsulate_run`]):
    /// its UDP payload is cut at `gso_size` into the datagrams' payloads, and each is
    /// decapsulated as if it had come alone (the outer UDP checksum is not verified, as
    /// for a single datagram). The inner TCP segments of one flow among them are then
    /// coalesced straight out of the super-frame ([`gro::Coalescer`], as Linux's GRO does
    /// behind a vxlan device: one copy of each) and go
    /// through the rest of the pipeline as one GSO packet: one conntrack lookup and one
    /// write to a pod's TAP per run instead of per segment. Anything else (fragments,
    /// other protocols) goes on alone, in order. The verdict is `Forwarded` when any
    /// inner packet was, else the last one's.
    pub(super) fn decap_gso(
        &mut self,
        tables: &Tables,
        mut pkt: Packet,
        parsed: &Parsed,
        ov: &Overlay,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let v = pkt.meta.vnet;
        let size = usize::from(v.gso_size);
        let payload = parsed.l4_off + 8;
        let datagrams = (parsed.ip_end - payload).div_ceil(size.max(1));
        if v.gso_type != VnetHdr::GSO_UDP_L4
            || size <= vxlan::LEN
            || datagrams > gso::MAX_SEGMENTS_UDP
        {
            return self.drop(DropReason::GsoMalformed, trace);
        }
        self.stats.decap_gso_frames += 1;
        let peer = parsed.key.src;
        trace.note(|| TraceEvent::DecapGso {
            peer: peer.ip(),
            datagrams,
            size,
        });
        let mut verdict = Verdict::Dropped(DropReason::GsoMalformed);
        // The datagrams share the outer headers: the peer is checked once, each datagram
        // counted as a drop when it is unknown.
        if ov.peer_index(peer.ip()).is_none() {
            for _ in 0..datagrams {
                combine(&mut verdict, self.drop(DropReason::VxlanUnknownPeer, trace));
            }
            return verdict;
        }
        // TCP segments go to the coalescer straight from the super-frame; `segments`
        // counts those offered since it was last emptied.
        let mut run = gro::Coalescer::default();
        let mut segments = 0;
        // The outer header, and so its ECN field and UDP checksum, is every datagram's.
        let outer_ecn = overlay::ecn_of(&pkt.data[parsed.l3_off..]);
        let outer_csum = outer_udp_checksum(&pkt, parsed);
        for start in (payload..parsed.ip_end).step_by(size) {
            let end = (start + size).min(parsed.ip_end);
            let decapped =
                self.decap_inner(&pkt, start, end, outer_csum, ov)
                    .and_then(|(at, ip, m)| {
                        let l3 = at + ip.l3_off;
                        overlay::decap_ecn(outer_ecn, &mut pkt.data[l3..at + ip.ip_end])?;
                        Ok((at, ip, m))
                    });
            let (at, inner_parsed, meta) = match decapped {
                Ok(i) => i,
                Err(r) => {
                    combine(&mut verdict, self.drop(r, trace));
                    continue;
                }
            };
            self.stats.decapsulated += 1;
            let frame = &pkt.data[at..at + inner_parsed.ip_end];
            if let Err(r) = gso::check_offload(frame, &meta.vnet, &inner_parsed) {
                combine(&mut verdict, self.drop(r, trace));
                continue;
            }
            if inner_parsed.proto == proto::TCP && inner_parsed.frag.is_none() {
                run.push_frame(frame, &inner_parsed, &meta);
                segments += 1;
                continue;
            }
            if segments > 0 {
                let v = self.forward_run(
                    tables,
                    std::mem::take(&mut run),
                    segments,
                    peer.ip(),
                    out,
                    trace,
                );
                combine(&mut verdict, v);
                segments = 0;
            }
            let inner = Packet {
                data: frame.to_vec(),
                meta,
            };
            let v = if inner_parsed.frag.is_none() {
                self.forward(tables, inner, inner_parsed, Some(peer.ip()), out, trace)
            } else {
                match self.defrag(inner, inner_parsed, trace) {
                    Ok((p, pp)) => self.forward(tables, p, pp, Some(peer.ip()), out, trace),
                    Err(v) => v,
                }
            };
            combine(&mut verdict, v);
        }
        if segments > 0 {
            let v = self.forward_run(tables, run, segments, peer.ip(), out, trace);
            combine(&mut verdict, v);
        }
        verdict
    }

    /// Forwards what the coalescer `run` made of `segments` decapsulated TCP segments;
    /// the verdict is `Forwarded` when any was.
    pub(super) fn forward_run(
        &mut self,
        tables: &Tables,
        run: gro::Coalescer,
        segments: usize,
        peer: IpAddr,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let merged = run.finish();
        self.stats.decap_coalesced += (segments - merged.len()) as u64;
        trace.note(|| TraceEvent::GroCoalesced {
            segments,
            packets: merged.len(),
        });
        let mut verdict = Verdict::Dropped(DropReason::GsoMalformed);
        for p in merged {
            let v = match parse(&p.data, p.meta.zone) {
                Ok(pp) => self.forward(tables, p, pp, Some(peer), out, trace),
                Err(r) => self.drop(r, trace),
            };
            combine(&mut verdict, v);
        }
        verdict
    }

    /// Strips the outer headers of a VXLAN packet addressed to this node: only from a
    /// known node, only with the overlay's VNI. The outer UDP checksum is not verified
    /// (the inner packet has its own), as Linux's vxlan does not either.
    pub(super) fn decap(
        &mut self,
        pkt: &Packet,
        parsed: &Parsed,
        vx_off: usize,
        ov: &Overlay,
    ) -> Result<(Packet, Parsed), DropReason> {
        let (at, inner, meta) = self.decap_view(pkt, parsed, vx_off, ov)?;
        let mut data = pkt.data[at..at + inner.ip_end].to_vec();
        let outer_ecn = overlay::ecn_of(&pkt.data[parsed.l3_off..]);
        overlay::decap_ecn(outer_ecn, &mut data[inner.l3_off..])?;
        Ok((Packet { data, meta }, inner))
    }

    /// [`Pipeline::decap`] without the copy: where in `pkt.data` the inner frame starts,
    /// its parse (offsets from that start) and its metadata.
    pub(super) fn decap_view(
        &self,
        pkt: &Packet,
        parsed: &Parsed,
        vx_off: usize,
        ov: &Overlay,
    ) -> Result<(usize, Parsed, Meta), DropReason> {
        if ov.peer_index(parsed.key.src.ip()).is_none() {
            return Err(DropReason::VxlanUnknownPeer);
        }
        self.decap_inner(
            pkt,
            vx_off,
            parsed.ip_end,
            outer_udp_checksum(pkt, parsed),
            ov,
        )
    }

    /// [`Pipeline::decap_view`] once the outer source is known to be a peer: the VXLAN
    /// datagram whose header starts at `vx_off` and which ends at `ip_end`, its outer
    /// UDP checksum field `outer_csum`.
    pub(super) fn decap_inner(
        &self,
        pkt: &Packet,
        vx_off: usize,
        ip_end: usize,
        outer_csum: u16,
        ov: &Overlay,
    ) -> Result<(usize, Parsed, Meta), DropReason> {
        let vx = vxlan::Repr::parse(pkt.data.get(vx_off..ip_end).unwrap_or(&[]))?;
        if vx.vni != ov.vni {
            return Err(DropReason::VxlanBadVni);
        }
        let start = vx_off + vxlan::LEN;
        let inner = parse(&pkt.data[start..ip_end], pkt.meta.zone)?;
        if inner.l3 == L3::Arp {
            return Err(DropReason::ArpNotHandled);
        }
        // A partial checksum of the inner packet moves with it (checked by the caller).
        // A partial outer checksum says the frame never left this host's memory (a
        // sender on the same host, through a veth): as Linux does for such a frame, its
        // contents count as verified, so coalescing does not sum the inner segments again.
        // Not when the outer UDP checksum is 0: the host's UDP GRO also leaves datagrams
        // it received from the wire and merged partial, and with no outer checksum
        // nothing verified what they carry.
        let v = pkt.meta.vnet;
        let vnet = if v.needs_csum() && usize::from(v.csum_start) >= start {
            VnetHdr {
                flags: VnetHdr::F_NEEDS_CSUM,
                csum_start: v.csum_start - start as u16,
                csum_offset: v.csum_offset,
                ..VnetHdr::default()
            }
        } else if v.needs_csum() && outer_csum != 0 {
            VnetHdr {
                flags: VnetHdr::F_DATA_VALID,
                ..VnetHdr::default()
            }
        } else {
            VnetHdr::default()
        };
        let meta = Meta {
            vnet,
            mru: 0,
            frag_id: 0,
            ..pkt.meta
        };
        Ok((start, inner, meta))
    }
}

/// True for a UDP frame whose partial checksum starts past its UDP and VXLAN headers:
/// the inner packet's, as a kernel VXLAN device leaves it (not GSO, not a fragment).
pub(super) fn inner_partial_checksum(pkt: &Packet, parsed: &Parsed) -> bool {
    let v = pkt.meta.vnet;
    v.needs_csum()
        && !v.is_gso()
        && parsed.proto == proto::UDP
        && parsed.frag.is_none()
        && parsed.l4_complete
        && usize::from(v.csum_start) >= parsed.l4_off + 8 + vxlan::LEN
        && usize::from(v.csum_start) < parsed.ip_end
}

/// The UDP checksum field of a VXLAN frame's outer header (0: none).
fn outer_udp_checksum(pkt: &Packet, parsed: &Parsed) -> u16 {
    let at = parsed.l4_off + 6;
    u16::from_be_bytes([pkt.data[at], pkt.data[at + 1]])
}
