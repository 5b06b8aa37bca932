//! Local answers: ARP and neighbour discovery, answered for the pods (the node is every
//! pod's only neighbour) and for the node's own addresses, learned from on the uplink and
//! host ports; never forwarded.

use std::net::IpAddr;
use std::sync::Arc;

use super::{Pipeline, Trace, TraceEvent, Verdict, mac_at};
use crate::drop::DropReason;
use crate::neigh::{self, arp, nd};
use crate::packet::{Packet, PortId};
use crate::tables::PortKind;
use crate::wire::Parsed;

impl Pipeline {
    /// ARP: answered on pod ports for any address (proxy ARP: the node is every pod's
    /// only neighbour) and on uplink/host ports for the node's own addresses; learned
    /// from on uplink/host ports; never forwarded.
    pub(super) fn arp(
        &mut self,
        pkt: &Packet,
        parsed: &Parsed,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        let tables = Arc::clone(&self.tables);
        let in_id = pkt.meta.in_port;
        let port = &tables.ports[usize::from(in_id)];
        if port.kind == PortKind::Plain {
            return self.drop(DropReason::ArpNotHandled, trace);
        }
        let a = match arp::Repr::parse(&pkt.data[parsed.l3_off..]) {
            Ok(a) => a,
            Err(r) => return self.drop(r, trace),
        };
        let now = pkt.meta.time_ns;
        let sender = IpAddr::V4(a.sender_ip);
        let target = IpAddr::V4(a.target_ip);
        let answer = if port.kind == PortKind::Pod {
            let pm = port.peer_mac;
            if pm != Some(mac_at(&pkt.data, 6))
                || pm != Some(a.sender_mac)
                || !(a.sender_ip.is_unspecified() || port.addresses.contains(&sender))
            {
                return self.drop(DropReason::SourceSpoofed, trace);
            }
            // Not for the pod's own address: that is a gratuitous ARP or a duplicate
            // address probe, and answering it would make the pod give up its address.
            a.op == arp::REQUEST && a.target_ip != a.sender_ip && !port.addresses.contains(&target)
        } else {
            let ours = port.addresses.contains(&target)
                || (tables.overlay.as_ref().is_some_and(|o| o.uplink == in_id)
                    && tables.node.addresses.contains(&target));
            if a.op != arp::REQUEST && a.op != arp::REPLY {
                trace.note(|| TraceEvent::ArpIgnored { op: a.op });
                return Verdict::Consumed;
            }
            if !a.sender_ip.is_unspecified() {
                // Create an entry only for a node that talks to us; refresh any. Only a
                // reply to this node's MAC (an answer to its probe) says the sender
                // answers: a request, or a broadcast or gratuitous reply, says where it
                // is, as Linux's `arp_process` has it.
                let request = ours && a.op == arp::REQUEST;
                let answer = a.op == arp::REPLY
                    && mac_at(&pkt.data, 0) == port.mac
                    && a.sender_ip != a.target_ip;
                let update = neigh::Update {
                    state: if answer {
                        neigh::State::Reachable
                    } else {
                        neigh::State::Stale
                    },
                    override_mac: true,
                    create: request,
                };
                self.learned(in_id, sender, Some(a.sender_mac), now, update, out, trace);
            }
            ours && a.op == arp::REQUEST
        };
        if !answer {
            trace.note(|| TraceEvent::ArpNotAnswered {
                op: a.op,
                sender: a.sender_ip,
                target: a.target_ip,
            });
            return Verdict::Consumed;
        }
        let reply = arp::Repr {
            op: arp::REPLY,
            sender_mac: port.mac,
            sender_ip: a.target_ip,
            target_mac: a.sender_mac,
            target_ip: a.sender_ip,
        }
        .frame(a.sender_mac, port.mac, parsed.vlan);
        self.stats.arp_answered += 1;
        trace.note(|| TraceEvent::ArpAnswered {
            target: a.target_ip,
            mac: port.mac,
            sender: a.sender_ip,
        });
        self.send(in_id, Packet::new(reply, in_id, now), out);
        Verdict::Consumed
    }

    /// Neighbour discovery: like ARP. A pod port answers every solicitation (router
    /// flag set) except for the pod's own addresses and duplicate address detection;
    /// uplink and host ports answer for the node's addresses (a duplicate address probe
    /// for one to all nodes) and learn. A message that came in fragments is dropped.
    pub(super) fn nd(
        &mut self,
        pkt: &Packet,
        parsed: &Parsed,
        msg: nd::Message,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) -> Verdict {
        // Reassembled (no node fragments ND): fragments are how a message slips past
        // filters that look at the first fragment only (RFC 6980 section 5).
        if pkt.meta.mru != 0 {
            return self.drop(DropReason::NdFragmented, trace);
        }
        let tables = Arc::clone(&self.tables);
        let in_id = pkt.meta.in_port;
        let port = &tables.ports[usize::from(in_id)];
        let now = pkt.meta.time_ns;
        let Some(src) = nd::v6(parsed.key.src.ip()) else {
            return Verdict::Consumed;
        };
        let src_mac = mac_at(&pkt.data, 6);
        let pod = port.kind == PortKind::Pod;
        let (target, flags, dst) = match msg {
            nd::Message::Solicit { target, slla } => {
                let t = IpAddr::V6(target);
                let ours = if pod {
                    !port.addresses.contains(&t)
                } else {
                    port.addresses.contains(&t)
                        || (tables.overlay.as_ref().is_some_and(|o| o.uplink == in_id)
                            && tables.node.addresses.contains(&t))
                };
                if !pod
                    && !src.is_unspecified()
                    && let Some(m) = slla
                {
                    let update = neigh::Update {
                        state: neigh::State::Stale,
                        override_mac: true,
                        create: ours,
                    };
                    self.learned(in_id, IpAddr::V6(src), Some(m), now, update, out, trace);
                }
                if !ours || (pod && src.is_unspecified()) {
                    trace.note(|| TraceEvent::NdNotAnswered { target });
                    return Verdict::Consumed;
                }
                if src.is_unspecified() {
                    // Another host probes for the node's address (duplicate address
                    // detection): told to everyone, unsolicited, that it is taken (RFC
                    // 4861 section 7.2.4, Linux's `ndisc_recv_ns`).
                    (target, nd::FLAG_OVERRIDE, nd::ALL_NODES)
                } else {
                    let router = if pod { nd::FLAG_ROUTER } else { 0 };
                    let flags = router | nd::FLAG_SOLICITED | nd::FLAG_OVERRIDE;
                    (target, flags, src)
                }
            }
            nd::Message::Advert {
                target,
                flags,
                tlla,
            } => {
                if !pod {
                    // Only a solicited advertisement answers the node's probe; only one
                    // with the override flag replaces a MAC (RFC 4861 section 7.2.5).
                    let update = neigh::Update {
                        state: if flags & nd::FLAG_SOLICITED != 0 {
                            neigh::State::Reachable
                        } else {
                            neigh::State::Stale
                        },
                        override_mac: flags & nd::FLAG_OVERRIDE != 0,
                        create: false,
                    };
                    let t = IpAddr::V6(target);
                    self.learned(in_id, t, tlla, now, update, out, trace);
                }
                trace.note(|| TraceEvent::NdAdvert { target });
                return Verdict::Consumed;
            }
            nd::Message::Other(ty) => {
                trace.note(|| TraceEvent::NdIgnored { icmp_type: ty });
                return Verdict::Consumed;
            }
        };
        let dst_mac = if dst.is_multicast() {
            nd::multicast_mac(dst)
        } else {
            src_mac
        };
        let na = nd::advert(
            dst_mac,
            port.mac,
            parsed.vlan,
            target,
            dst,
            target,
            flags,
            Some(port.mac),
        );
        self.stats.nd_answered += 1;
        trace.note(|| TraceEvent::NdAnswered {
            target,
            mac: port.mac,
            dst,
        });
        self.send(in_id, Packet::new(na, in_id, now), out);
        Verdict::Consumed
    }
}
