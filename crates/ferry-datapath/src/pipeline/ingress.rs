//! The ingress stage: a parsed packet as its port received it. Counted, checked
//! (VLAN tags, frames for other hosts, a pod's fragments, offload state), handed to ARP,
//! marked as a coalesced super-packet on a GRO port, reassembled, decapsulated when it is
//! VXLAN to this node, then forwarded.

use std::net::IpAddr;

use super::{Fragment, Pipeline, Trace, TraceEvent, Verdict, decap, mac_at};
use crate::drop::DropReason;
use crate::flow::proto;
use crate::gro;
use crate::gso;
use crate::neigh::nd;
use crate::packet::{Packet, PortId};
use crate::tables::{Port, PortKind, Tables};
use crate::wire::{L3, Parsed};

impl Pipeline {
    /// [`Pipeline::process`] after the packet was parsed.
    #[inline]
    pub(super) fn process_parsed(
        &mut self,
        tables: &Tables,
        mut pkt: Packet,
        parsed: Result<Parsed, DropReason>,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let in_id = pkt.meta.in_port;
        self.rx_port = usize::from(in_id);
        let Some(in_port) = tables.ports.get(usize::from(in_id)) else {
            return self.drop(DropReason::UnknownPort, trace);
        };
        let rx = &mut self.ports[usize::from(in_id)];
        rx.rx_packets += 1;
        rx.rx_bytes += pkt.data.len() as u64;
        pkt.meta.zone = in_port.zone;

        let parsed = match parsed {
            Ok(p) => p,
            Err(r) => return self.drop(r, trace),
        };
        // Pod, uplink and host ports carry one untagged network each; a plain port passes
        // tags through.
        if in_port.kind != PortKind::Plain && parsed.vlan.is_some() {
            return self.drop(DropReason::VlanTagged, trace);
        }
        // A unicast frame for another host's MAC (a switch flooding a destination it has
        // not learned, seen because the uplink listens promiscuously) is not the node's:
        // Linux drops such frames (PACKET_OTHERHOST) before ARP and IP see them.
        if matches!(in_port.kind, PortKind::Uplink | PortKind::Host)
            && pkt.data[0] & 1 == 0
            && pkt.data[0..6] != in_port.mac
        {
            return self.drop(DropReason::OtherHost, trace);
        }
        if parsed.l3 == L3::Arp {
            return self.arp(&pkt, &parsed, out, trace);
        }
        // Ethernet padding is not part of the packet and must not reach checksums.
        pkt.data.truncate(parsed.ip_end);
        trace.note(|| TraceEvent::Parse {
            key: parsed.key,
            bytes: parsed.ip_len(),
            frag: parsed.frag.map(|f| Fragment {
                id: f.id,
                offset: f.offset,
                more: f.more,
            }),
        });
        // A pod's fragment is checked on its own, before it meets others in reassembly
        // (whose key has no port): a pod must not plant fragments of another's
        // datagrams. The reassembled datagram is checked again, as any packet.
        if in_port.kind == PortKind::Pod
            && parsed.frag.is_some()
            && !source_is_pods(in_port, &pkt, &parsed)
        {
            return self.drop(DropReason::SourceSpoofed, trace);
        }

        // A kernel VXLAN peer behind a veth hands over frames whose inner checksum is
        // still partial: that state is checked on the inner packet after decapsulation,
        // and such a frame that is not decapsulated is refused.
        let inner_csum = decap::inner_partial_checksum(&pkt, &parsed);
        if !inner_csum && let Err(r) = gso::check_offload(&pkt.data, &pkt.meta.vnet, &parsed) {
            return self.drop(r, trace);
        }

        if in_port.gro
            && parsed.proto == proto::TCP
            && parsed.frag.is_none()
            && parsed.l4_complete
            && !pkt.meta.vnet.is_gso()
            && parsed.ip_len() > usize::from(in_port.mtu)
        {
            gro::mark_coalesced(&mut pkt, &parsed, in_port.mtu);
            self.stats.gro_marked += 1;
            trace.note(|| TraceEvent::GroMarked {
                segment: pkt.meta.vnet.gso_size,
            });
        }

        // A whole packet, nearly every one, stays where it is instead of going through
        // defrag and back.
        let (mut pkt, mut parsed) = if parsed.frag.is_none() {
            (pkt, parsed)
        } else {
            match self.defrag(pkt, parsed, trace) {
                Ok(p) => p,
                Err(v) => return v,
            }
        };

        // Decap: VXLAN to this node arrives on the overlay's uplink; the inner frame goes
        // on as if received from a tunnel port in the uplink's zone.
        let mut tunnel_peer = None;
        if let Some(ov) = &tables.overlay
            && in_id == ov.uplink
            && parsed.proto == proto::UDP
            && parsed.l4_complete
            && parsed.key.dst_port == ov.port
            && tables.node.addresses.contains(&parsed.key.dst.ip())
        {
            if pkt.meta.vnet.is_gso() {
                return self.decap_gso(tables, pkt, &parsed, ov, out, trace);
            }
            let peer = parsed.key.src;
            let (inner, inner_parsed) = match self.decap(&pkt, &parsed, parsed.l4_off + 8, ov) {
                Ok(i) => i,
                Err(r) => return self.drop(r, trace),
            };
            self.stats.decapsulated += 1;
            trace.note(|| TraceEvent::Decap {
                vni: ov.vni,
                peer: peer.ip(),
                inner: inner_parsed.key,
            });
            if let Err(r) = gso::check_offload(&inner.data, &inner.meta.vnet, &inner_parsed) {
                return self.drop(r, trace);
            }
            (pkt, parsed) = if inner_parsed.frag.is_none() {
                (inner, inner_parsed)
            } else {
                match self.defrag(inner, inner_parsed, trace) {
                    Ok(p) => p,
                    Err(v) => return v,
                }
            };
            tunnel_peer = Some(peer);
        } else if inner_csum {
            return self.drop(DropReason::CsumOffloadInvalid, trace);
        }
        self.forward(tables, pkt, parsed, tunnel_peer.map(|p| p.ip()), out, trace)
    }
}

/// The source check of a pod port: the pod's own MAC, and one of its addresses; IPv6
/// link-local (from its MAC) and, for ICMPv6 (duplicate address detection), the
/// unspecified address are allowed for neighbour discovery: such packets go no further.
pub(super) fn source_is_pods(port: &Port, pkt: &Packet, parsed: &Parsed) -> bool {
    if port.peer_mac != Some(mac_at(&pkt.data, 6)) {
        return false;
    }
    let src = parsed.key.src;
    port.addresses.contains(&src.ip())
        || match src.ip() {
            IpAddr::V6(a) => {
                nd::is_link_local(&a) || (a.is_unspecified() && parsed.proto == proto::ICMPV6)
            }
            IpAddr::V4(_) => false,
        }
}
