//! The egress stage: the MTU check of a routed packet, then its delivery: next-hop
//! resolution, commit of its connection, TTL and link-layer rewrite, encapsulation, and
//! the egress MTU (a GSO packet handed on whole or segmented as TCP/UDP, never IP
//! fragments; a reassembled datagram refragmented to min(MRU, MTU); checksums
//! completed).

use std::net::IpAddr;

use super::resolve::{Egress, NoEgress};
use super::route::{Routed, Routing};
use super::{MtuFit, MtuLength, Pipeline, Trace, TraceEvent, Verdict};
use crate::conntrack::Pending;
use crate::drop::DropReason;
use crate::gso;
use crate::icmp::ErrorKind;
use crate::ipf;
use crate::overlay;
use crate::packet::{Meta, Packet, PortId, VnetHdr};
use crate::tables::{NextHop, Tables};
use crate::wire::checksum;
use crate::wire::rewrite;
use crate::wire::{L3, Parsed, parse};

impl Pipeline {
    /// The MTU that applies to a packet routed to `port` and `hop` (inside the tunnel
    /// when tunnelled), when the packet fits it or may be cut to fit. One that is too big
    /// and may not be fragmented is answered with ICMP "fragmentation needed" / "packet
    /// too big" and dropped: `Err` carries its verdict.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn fits(
        &mut self,
        tables: &Tables,
        pkt: &Packet,
        parsed: &Parsed,
        port: PortId,
        hop: NextHop,
        tunnel_peer: Option<IpAddr>,
        pending: &mut Option<Pending>,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Result<usize, Verdict> {
        let out_port = &tables.ports[usize::from(port)];
        // Encapsulated packets must fit the uplink with the outer headers: the MTU that
        // counts for them (and that ICMP reports) is the uplink's minus the overhead.
        let mtu = match (hop, &tables.overlay) {
            (NextHop::Tunnel(i), Some(ov)) => overlay::inner_mtu(
                out_port.mtu,
                ov.peers[usize::from(i)].address.is_ipv6(),
                parsed.l3_off,
            ),
            _ => usize::from(out_port.mtu),
        };
        let mru = usize::from(pkt.meta.mru);
        let gso = pkt.meta.vnet.is_gso();
        let uso = gso::is_uso(&pkt.meta.vnet);
        // Fragmenting in transit is allowed only for IPv4 without DF (RFC 8200 forbids it
        // for IPv6).
        let may_fragment = parsed.l3 == L3::Ipv4 && !parsed.dont_fragment;
        let too_big = if gso {
            // TCP segments shrink to fit; a USO datagram is one application message and
            // cannot be resized.
            uso && gso::largest_datagram(pkt, parsed) > mtu && !may_fragment
        } else if mru != 0 {
            // A reassembled datagram leaves as fragments no larger than those that came
            // in; if those do not fit the MTU, fragmenting them further is in transit.
            mru > mtu && !may_fragment
        } else {
            parsed.ip_len() > mtu && !may_fragment
        };
        trace.note(|| {
            let length = if gso {
                MtuLength::Gso {
                    segment: pkt.meta.vnet.gso_size,
                }
            } else if mru != 0 {
                MtuLength::Reassembled {
                    bytes: parsed.ip_len(),
                    mru: pkt.meta.mru,
                }
            } else {
                MtuLength::Plain {
                    bytes: parsed.ip_len(),
                }
            };
            let fit = if too_big {
                MtuFit::TooBig
            } else if gso || parsed.ip_len() <= mtu.min(if mru != 0 { mru } else { mtu }) {
                MtuFit::Fits
            } else {
                MtuFit::Cut
            };
            TraceEvent::Mtu {
                mtu,
                tunnel: matches!(hop, NextHop::Tunnel(_)),
                port: out_port.name.clone(),
                length,
                fit,
            }
        });
        if too_big {
            // The connection is kept although this packet is not sent, so that the error,
            // which quotes the translated packet, is translated back for the sender; the
            // sender retries smaller on the same connection.
            if let Err(r) = self.commit(pending, pkt.meta.time_ns, trace) {
                return Err(self.drop(r, trace));
            }
            let kind = ErrorKind::TooBig { mtu: mtu as u32 };
            self.icmp_error(pkt, parsed, kind, true, tunnel_peer, out, trace);
            return Err(self.drop(DropReason::TooBig, trace));
        }
        Ok(mtu)
    }

    /// The stages after routing, for a packet routed just now (with the connection it
    /// starts, if any) and for one that waited for its neighbour: next-hop resolution
    /// (the packet is queued when its neighbour has no MAC yet), commit, TTL, L2 rewrite,
    /// encap, egress MTU (segmentation, checksum completion, fragmentation).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn deliver(
        &mut self,
        tables: &Tables,
        mut pkt: Packet,
        parsed: &Parsed,
        routing: Routing,
        pending: &mut Option<Pending>,
        now: u64,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let Routing {
            port: out_id,
            hop,
            mtu,
            ..
        } = routing;
        // Read where `resolve` wrote it: moved out, it would be copied in 16-byte moves
        // that wait for its narrower stores to reach the cache.
        let resolved = self.resolve(tables, out_id, hop, parsed, now, out, trace);
        let egress = match &resolved {
            Ok(e) => e,
            Err(NoEgress::Drop(r)) => return self.drop(*r, trace),
            Err(NoEgress::Unresolved { port, ip, probed }) => {
                let (port, ip, probed) = (*port, *ip, *probed);
                // Committed now, as if sent: a reply that overtakes the queued packet
                // (or the next packet of the connection) finds it.
                if let Err(r) = self.commit(pending, now, trace) {
                    return self.drop(r, trace);
                }
                let routed = Routed {
                    pkt,
                    parsed: *parsed,
                    routing,
                };
                return self.park(port, ip, probed, routed, now, trace);
            }
        };
        if let Err(r) = self.commit(pending, now, trace) {
            return self.drop(r, trace);
        }
        rewrite::decrement_ttl(&mut pkt.data, parsed);
        rewrite::set_macs(&mut pkt.data, egress.dst_mac, egress.src_mac);
        if let Some(o) = &egress.tunnel {
            trace.note(|| TraceEvent::Encap {
                vni: o.vni,
                node: tables
                    .overlay
                    .as_ref()
                    .and_then(|ov| ov.peer_index(o.dst).map(|i| &ov.peers[usize::from(i)]))
                    .map(|p| p.name.clone()),
                src: o.src,
                dst: o.dst,
                udp_src_port: overlay::source_port(o.hash),
                mtu,
            });
        }
        // For trace notes only: not looked up otherwise.
        let out_name = || tables.ports[usize::from(out_id)].name.as_str();
        if pkt.meta.vnet.is_gso() {
            return self.send_gso(egress, pkt, parsed, mtu, out_name, out, trace);
        }
        self.send_whole(egress, pkt, parsed, mtu, out_name, out, trace)
    }

    /// A GSO packet leaves whole to a port that takes GSO (its segment size cut to the
    /// MTU), as UDP GSO super-frames of its encapsulated segments to an uplink that takes
    /// them, or segmented here (a USO datagram above the MTU, IPv4 without DF, is then
    /// fragmented).
    #[allow(clippy::too_many_arguments)]
    fn send_gso<'t>(
        &mut self,
        egress: &Egress,
        mut pkt: Packet,
        parsed: &Parsed,
        mtu: usize,
        out_name: impl Fn() -> &'t str,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let uso = gso::is_uso(&pkt.meta.vnet);
        let headers = gso::headers_len(&pkt.data, parsed);
        let fits = if uso {
            gso::largest_datagram(&pkt, parsed) <= mtu
        } else {
            headers + usize::from(pkt.meta.vnet.gso_size) <= mtu
        };
        if egress.gso && (fits || !uso) {
            // The receiving kernel segments at gso_size: never above the MTU, and into no
            // more segments than ferry would cut. (A USO packet that fits holds one
            // datagram shorter than its gso_size: cut too, the datagram is unchanged.)
            let max = mtu - headers.min(mtu);
            if usize::from(pkt.meta.vnet.gso_size) > max {
                let payload = parsed.ip_end - parsed.l3_off - headers;
                if !fits && (max == 0 || payload.div_ceil(max) > gso::MAX_SEGMENTS_TCP) {
                    return self.drop(DropReason::MtuTooSmall, trace);
                }
                pkt.meta.vnet.gso_size = max as u16;
            }
            trace.note(|| TraceEvent::SentGso {
                port: out_name().to_string(),
                segment: pkt.meta.vnet.gso_size,
            });
            self.emit(egress, pkt, out);
            return Verdict::Forwarded;
        }
        if egress.tunnel.is_some() && egress.uso {
            let cut = match gso::Segmenter::new(&pkt, parsed, mtu) {
                Ok(c) => c,
                Err(r) => return self.drop(r, trace),
            };
            // The first segment is the longest; a UDP datagram longer than the MTU is
            // fragmented below instead.
            if cut.len(0) - cut.l3_off() <= mtu {
                return self.emit_super_frames(egress, &cut, pkt.meta, mtu, out_name(), out, trace);
            }
        }
        let mut segs = std::mem::take(&mut self.scratch);
        segs.clear();
        if let Err(r) = gso::segment(&pkt, parsed, mtu, &mut segs) {
            self.scratch = segs;
            return self.drop(r, trace);
        }
        self.stats.segmented += 1;
        self.stats.segments_out += segs.len() as u64;
        trace.note(|| TraceEvent::Segmented {
            packets: segs.len(),
            mtu,
            port: out_name().to_string(),
        });
        let mut frags = Vec::new();
        for seg in segs.drain(..) {
            if seg.data.len() - parsed.l3_off <= mtu {
                self.emit(egress, seg, out);
                continue;
            }
            // A USO datagram larger than the MTU, IPv4 without DF: fragment it.
            frags.clear();
            let fragmented = parse(&seg.data, pkt.meta.zone)
                .and_then(|sp| ipf::refragment(&seg, &sp, mtu, &mut frags));
            if let Err(r) = fragmented {
                // One datagram of the packet lost, counted as any drop (against the
                // ingress port too); the others go on, and the verdict is theirs.
                let _ = self.drop(r, trace);
                continue;
            }
            self.stats.fragments_out += frags.len() as u64;
            for f in frags.drain(..) {
                self.emit(egress, f, out);
            }
        }
        self.scratch = segs;
        Verdict::Forwarded
    }

    /// A packet that is not GSO leaves whole, or refragmented to min(MRU, MTU) when it
    /// was reassembled (fragmented to the MTU when it may be), its partial checksum
    /// completed unless the port takes it as it is.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn send_whole<'t>(
        &mut self,
        egress: &Egress,
        mut pkt: Packet,
        parsed: &Parsed,
        mtu: usize,
        out_name: impl Fn() -> &'t str,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let mru = usize::from(pkt.meta.mru);
        let limit = if mru != 0 { mtu.min(mru) } else { mtu };
        let fragment = parsed.ip_len() > limit;
        if pkt.meta.vnet.needs_csum() && (!egress.gso || fragment) {
            let v = pkt.meta.vnet;
            if let Err(r) = checksum::complete_partial(
                &mut pkt.data,
                usize::from(v.csum_start),
                usize::from(v.csum_offset),
            ) {
                return self.drop(r, trace);
            }
            pkt.meta.vnet = VnetHdr::default();
        }

        if !fragment {
            trace.note(|| TraceEvent::Sent {
                port: out_name().to_string(),
            });
            self.emit(egress, pkt, out);
            return Verdict::Forwarded;
        }

        let mut frags = std::mem::take(&mut self.scratch);
        frags.clear();
        if let Err(r) = ipf::refragment(&pkt, parsed, limit, &mut frags) {
            self.scratch = frags;
            return self.drop(r, trace);
        }
        self.stats.fragments_out += frags.len() as u64;
        trace.note(|| TraceEvent::Fragmented {
            mru: (mru != 0).then_some(pkt.meta.mru),
            mtu,
            limit,
            fragments: frags.len(),
            port: out_name().to_string(),
        });
        for f in frags.drain(..) {
            self.emit(egress, f, out);
        }
        self.scratch = frags;
        Verdict::Forwarded
    }

    /// The segments of a GSO packet through the overlay, for an uplink that takes UDP
    /// GSO: written straight into as few UDP GSO super-frames as hold them
    /// ([`overlay::encapsulate_run`]), which the kernel (or the NIC) cuts into the
    /// VXLAN datagrams.
    #[allow(clippy::too_many_arguments)]
    fn emit_super_frames(
        &mut self,
        egress: &Egress,
        cut: &gso::Segmenter<'_>,
        meta: Meta,
        mtu: usize,
        out_name: &str,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let Some(o) = &egress.tunnel else {
            return self.drop(DropReason::NoRoute, trace);
        };
        let n = cut.count();
        self.stats.segmented += 1;
        self.stats.segments_out += n as u64;
        trace.note(|| TraceEvent::Segmented {
            packets: n,
            mtu,
            port: out_name.to_string(),
        });
        let mut frames = Vec::new();
        let o = overlay::Outer {
            id: self.outer_ids(n),
            ..*o
        };
        overlay::encapsulate_run(cut, &o, &mut frames);
        self.stats.encapsulated += n as u64;
        let supers = frames.iter().filter(|(_, v)| v.is_gso()).count();
        self.stats.encap_gso_frames += supers as u64;
        trace.note(|| TraceEvent::EncapSuperFrames {
            datagrams: n,
            frames: frames.len(),
            super_frames: supers,
            port: out_name.to_string(),
        });
        let meta = Meta {
            vnet: VnetHdr::default(),
            mru: 0,
            frag_id: 0,
            ..meta
        };
        for (data, vnet) in frames {
            let pkt = Packet {
                data,
                meta: Meta { vnet, ..meta },
            };
            self.send(egress.port, pkt, out);
        }
        Verdict::Forwarded
    }

    /// The first of `n` outer IPv4 identifications, taken from the pipeline's counter.
    fn outer_ids(&mut self, n: usize) -> u16 {
        let id = self.outer_id;
        self.outer_id = id.wrapping_add(n as u16);
        id
    }

    /// Sends a packet as the egress says: encapsulated when it goes through the overlay.
    #[inline]
    pub(super) fn emit(
        &mut self,
        egress: &Egress,
        mut pkt: Packet,
        out: &mut Vec<(PortId, Packet)>,
    ) {
        if let Some(o) = &egress.tunnel {
            let o = overlay::Outer {
                id: self.outer_ids(1),
                ..*o
            };
            pkt.data = overlay::encapsulate(&pkt.data, &o);
            pkt.meta.vnet = VnetHdr::default();
            pkt.meta.mru = 0;
            pkt.meta.frag_id = 0;
            self.stats.encapsulated += 1;
        }
        self.send(egress.port, pkt, out);
    }
}
