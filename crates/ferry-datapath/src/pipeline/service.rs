//! What the Service stage says and sends: the trace notes of an endpoint choice or a
//! refusal, and the immediate refusal of a new connection to a Service without
//! endpoints. The choice itself is [`crate::lb::balance`], called from `track`.

use super::events::SockAddr;
use super::{Pipeline, Trace};
use crate::conntrack::Nat;
use crate::drop::DropReason;
use crate::flow::{FlowKey, proto};
use crate::icmp::ErrorKind;
use crate::lb::{self, Balanced, Frontend, Scope};
use crate::packet::{Packet, PortId};
use crate::tables::Tables;
use crate::wire::{L3, Parsed};

impl Pipeline {
    /// Refuses a new connection to a Service without endpoints at once: a TCP reset, or
    /// an ICMP port unreachable for UDP, back out of the port it came in on.
    pub(super) fn reject(
        &mut self,
        pkt: &Packet,
        parsed: &Parsed,
        out: &mut Vec<(PortId, Packet)>,
        trace: &mut Trace,
    ) {
        let in_id = pkt.meta.in_port;
        match parsed.proto {
            proto::TCP => {
                let mac = self.tables.ports[usize::from(in_id)].mac;
                let Some(frame) = lb::reject::tcp_reset(&pkt.data, parsed, mac) else {
                    return;
                };
                self.stats.service_rejected += 1;
                trace.note("service", || "refused with a TCP reset".to_string());
                let rst = Packet::new(frame, in_id, pkt.meta.time_ns);
                self.send(in_id, rst, out);
            }
            proto::UDP => {
                let code = if parsed.l3 == L3::Ipv4 { 3 } else { 4 };
                let sent = self.stats.icmp_sent;
                let kind = ErrorKind::Unreachable { code };
                self.icmp_error(pkt, parsed, kind, false, None, out, trace);
                if self.stats.icmp_sent > sent {
                    self.stats.service_rejected += 1;
                }
            }
            _ => {}
        }
    }

    /// Notes why a new connection to frontend `f` was refused, when it was the Service's
    /// doing.
    pub(super) fn note_refused(
        tables: &Tables,
        f: Frontend,
        r: DropReason,
        before: &FlowKey,
        trace: &mut Trace,
    ) {
        let no_endpoint = matches!(
            r,
            DropReason::ServiceNoEndpoints | DropReason::ServiceNoLocalEndpoints
        );
        if no_endpoint {
            trace.note("service", || {
                let svc = &tables.services.services[f.service as usize];
                format!(
                    "{} ({:?}): no endpoint to send {} to",
                    svc.name, f.scope, before
                )
            });
        }
        if r == DropReason::ServiceNoNodeAddress {
            trace.note("service", || {
                let svc = &tables.services.services[f.service as usize];
                format!(
                    "{} ({:?}): {} must leave from this node's address, and it has none of the family",
                    svc.name, f.scope, before
                )
            });
        }
    }

    /// Notes the endpoint chosen for a new connection to frontend `f`, and how.
    pub(super) fn note_balanced(
        tables: &Tables,
        f: Frontend,
        b: &Balanced,
        before: &FlowKey,
        trace: &mut Trace,
    ) {
        trace.note("service", || {
            let svc = &tables.services.services[f.service as usize];
            let how = match (b.nat.snat, b.mark & lb::MARK_TUNNEL != 0) {
                (Some((a, _)), _) if b.hairpin => format!(", hairpin: source NAT to {a}"),
                (Some((a, _)), _) => format!(", source NAT to {a}"),
                (None, true) => ", client address kept, through the tunnel so that replies return through this node".to_string(),
                (None, false) => String::new(),
            };
            let be = &svc.backends[b.backend];
            let node = be.node.as_deref().map_or(String::new(), |n| format!(" on node {n}"));
            format!(
                "{} ({} frontend {}) -> endpoint {}{node}{how}",
                svc.name,
                match f.scope {
                    Scope::Internal => "cluster IP",
                    Scope::External => "external",
                },
                SockAddr(before.dst.ip(), before.dst_port),
                SockAddr(be.addr, be.port)
            )
        });
    }

    /// Notes the translation a static NAT rule gave a new connection.
    pub(super) fn note_static_nat(n: &Nat, trace: &mut Trace) {
        trace.note("nat", || {
            let mut v = Vec::new();
            if let Some((a, p)) = n.dnat {
                v.push(match p {
                    Some(p) => format!("destination to {}", SockAddr(a.ip(), p)),
                    None => format!("destination to {a}"),
                });
            }
            if let Some((a, r)) = n.snat {
                v.push(match r {
                    Some((lo, hi)) => format!("source to {a} ports {lo}-{hi}"),
                    None => format!("source to {a}"),
                });
            }
            if v.is_empty() {
                v.push("no translation".into());
            }
            format!("static rule: {}", v.join(", "))
        });
    }
}
