//! `ferry conntrack list|delete`: the API's connection filter in the datapath's terms,
//! and tracked connections as the API shows them.
//!
//! The connection table lives in the worker, so listing and deleting run there as a job
//! ([`ferry_linux::worker::Control::run`]): the job copies at most `limit` matching
//! entries (or deletes them) and everything else, formatting included, happens on the
//! agent's side so that forwarding stops only for the scan.

use ferry_api::{CtAnswer, CtEntry, CtFilter, CtTuple, ERR_BAD_REQUEST, ERR_WORKER, Response};
use ferry_datapath::conntrack::{Entry, Filter, ORIGINAL, REPLY, Status, TcpState, Timeouts};
use ferry_datapath::{FlowKey, proto, proto_name};
use ferry_linux::worker::{Control, JobError};

use crate::observe::JOB_TIMEOUT;

/// The datapath's filter for `f`; the error names the field and what it takes.
pub fn filter(f: &CtFilter) -> Result<Filter, String> {
    let proto = f.proto.as_deref().map(parse_proto).transpose()?;
    let state = f.state.as_deref().map(parse_state).transpose()?;
    if state.is_some() && proto.is_some_and(|p| p != proto::TCP) {
        return Err("state: only TCP connections have a state (give --proto tcp or none)".into());
    }
    Ok(Filter {
        zone: f.zone,
        addr: f.addr,
        port: f.port,
        proto,
        state,
        mark: f.mark,
    })
}

/// `tcp`, `udp`, `icmp`, `icmpv6` (any case) or a protocol number.
fn parse_proto(s: &str) -> Result<u8, String> {
    match s.to_ascii_lowercase().as_str() {
        "tcp" => Ok(proto::TCP),
        "udp" => Ok(proto::UDP),
        "icmp" => Ok(proto::ICMP),
        "icmpv6" | "ipv6-icmp" => Ok(proto::ICMPV6),
        n => n.parse::<u8>().map_err(|_| {
            format!("proto {s:?}: expected tcp, udp, icmp, icmpv6 or a protocol number (0-255)")
        }),
    }
}

/// A TCP state as `conntrack -L` prints it, in any case.
fn parse_state(s: &str) -> Result<TcpState, String> {
    let want = s.to_ascii_uppercase();
    TcpState::ALL
        .into_iter()
        .find(|t| t.name() == want)
        .ok_or_else(|| {
            let names: Vec<&str> = TcpState::ALL.iter().map(|t| t.name()).collect();
            format!("state {s:?}: expected one of {}", names.join(", "))
        })
}

fn tuple(k: &FlowKey) -> CtTuple {
    let icmp = matches!(k.proto, proto::ICMP | proto::ICMPV6);
    let ports = matches!(k.proto, proto::TCP | proto::UDP);
    CtTuple {
        src: k.src.ip(),
        dst: k.dst.ip(),
        sport: ports.then_some(k.src_port),
        dport: ports.then_some(k.dst_port),
        icmp_type: icmp.then_some((k.dst_port >> 8) as u8),
        icmp_code: icmp.then_some((k.dst_port & 0xff) as u8),
        icmp_id: icmp.then_some(k.src_port),
    }
}

/// `e` as the API shows it, with the seconds left at `now_ns` under `timeouts`.
pub fn entry(e: &Entry, timeouts: &Timeouts, now_ns: u64) -> CtEntry {
    let o = e.original();
    let (packets, bytes) = (e.packets(), e.bytes());
    let status = [
        (Status::SEEN_REPLY, "seen_reply"),
        (Status::ASSURED, "assured"),
        (Status::DNAT, "dnat"),
        (Status::SNAT, "snat"),
    ]
    .into_iter()
    .filter(|(b, _)| e.status.has(*b))
    .map(|(_, n)| n.to_string())
    .collect();
    CtEntry {
        proto: proto_name(o.proto).to_string(),
        proto_num: o.proto,
        zone: e.zone(),
        original: tuple(&o),
        reply: tuple(&e.reply()),
        tcp_state: e.tcp_state().map(|s| s.name().to_string()),
        status,
        assured: e.status.has(Status::ASSURED),
        unreplied: !e.status.has(Status::SEEN_REPLY),
        secs_left: e.deadline_ns(timeouts).saturating_sub(now_ns) / 1_000_000_000,
        mark: e.mark,
        tunnel_peer: e.tunnel_peer(),
        packets_original: packets[ORIGINAL],
        packets_reply: packets[REPLY],
        bytes_original: bytes[ORIGINAL],
        bytes_reply: bytes[REPLY],
        line: e.line(timeouts, now_ns).to_string(),
    }
}

/// Lists (at most `limit`) or deletes the connections `f` selects, in the worker of
/// `control`.
pub fn request(control: &Control, f: &CtFilter, delete: bool, limit: Option<usize>) -> Response {
    let filter = match filter(f) {
        Ok(f) => f,
        Err(e) => return Response::error(ERR_BAD_REQUEST, "bad conntrack filter", e),
    };
    let answer = if delete {
        control.run(JOB_TIMEOUT, move |w| {
            // Entries past their deadline, which a listing leaves out, are reaped first
            // (as expired), so that a deletion counts what a listing shows.
            let ct = w.pipeline.conntrack_mut();
            ct.expire(w.now_ns, usize::MAX);
            let n = ct.delete(&filter);
            CtAnswer {
                matched: n,
                deleted: n,
                ..CtAnswer::default()
            }
        })
    } else {
        let limit = limit.unwrap_or(ferry_api::DEFAULT_CT_LIMIT);
        control
            .run(JOB_TIMEOUT, move |w| {
                let ct = w.pipeline.conntrack();
                let timeouts = ct.config().timeouts;
                let mut copied: Vec<Entry> = Vec::new();
                let mut matched = 0;
                // Entries past their deadline wait for the expiry wheel: gone already.
                let live = ct
                    .dump(&filter)
                    .filter(|(_, e)| e.deadline_ns(&timeouts) > w.now_ns);
                for (_, e) in live {
                    matched += 1;
                    if copied.len() < limit {
                        copied.push(e.clone());
                    }
                }
                (copied, matched, timeouts, w.now_ns)
            })
            .map(|(copied, matched, timeouts, now_ns)| CtAnswer {
                entries: copied.iter().map(|e| entry(e, &timeouts, now_ns)).collect(),
                matched,
                truncated: matched > copied.len(),
                deleted: 0,
            })
    };
    match answer {
        Ok(a) => Response::Ok(ferry_api::Answer {
            conntrack: Some(a),
            ..ferry_api::Answer::default()
        }),
        Err(e) => {
            let mut details = e.to_string();
            if delete && e == JobError::TimedOut {
                details.push_str("; the deletion may still happen");
            }
            Response::error(ERR_WORKER, "the dataplane's worker did not answer", details)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_or_name_the_field() {
        let f = filter(&CtFilter {
            proto: Some("TCP".into()),
            state: Some("time_wait".into()),
            addr: Some("10.96.0.10".parse().unwrap()),
            ..CtFilter::default()
        })
        .unwrap();
        assert_eq!(f.proto, Some(proto::TCP));
        assert_eq!(f.state, Some(TcpState::TimeWait));
        assert_eq!(f.addr, Some("10.96.0.10".parse().unwrap()));
        assert_eq!(
            filter(&CtFilter {
                proto: Some("47".into()),
                ..CtFilter::default()
            })
            .unwrap()
            .proto,
            Some(47)
        );
        assert_eq!(filter(&CtFilter::default()).unwrap(), Filter::default());
        let e = filter(&CtFilter {
            proto: Some("bogus".into()),
            ..CtFilter::default()
        })
        .unwrap_err();
        assert!(
            e.starts_with("proto \"bogus\"") && e.contains("tcp, udp"),
            "{e}"
        );
        let e = filter(&CtFilter {
            state: Some("OPEN".into()),
            ..CtFilter::default()
        })
        .unwrap_err();
        assert!(e.contains("ESTABLISHED"), "{e}");
        let e = filter(&CtFilter {
            proto: Some("udp".into()),
            state: Some("ESTABLISHED".into()),
            ..CtFilter::default()
        })
        .unwrap_err();
        assert!(e.contains("only TCP"), "{e}");
    }

    #[test]
    fn icmp_tuples_have_type_code_and_id() {
        let k = FlowKey {
            zone: 0,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            proto: proto::ICMP,
            src_port: 7,
            dst_port: 8 << 8,
        };
        let t = tuple(&k);
        assert_eq!(
            (t.icmp_type, t.icmp_code, t.icmp_id, t.sport),
            (Some(8), Some(0), Some(7), None)
        );
        let t = tuple(&FlowKey {
            proto: proto::UDP,
            src_port: 5353,
            dst_port: 53,
            ..k
        });
        assert_eq!(
            (t.sport, t.dport, t.icmp_type),
            (Some(5353), Some(53), None)
        );
    }
}
