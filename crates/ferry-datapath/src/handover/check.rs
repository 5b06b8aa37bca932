//! What no pipeline could have saved: records refused whole, at decode and again at
//! restore (a state built in memory is checked too), so that a restore never meets them.

use std::net::IpAddr;

use super::records::{Affinity, Connection, Tracking, Tuple};
use crate::conntrack::saved::reversed;
use crate::flow::proto;

/// Largest TCP window scale shift (RFC 7323 section 2.3).
const MAX_WINDOW_SCALE: u8 = 14;

fn family(a: &IpAddr) -> &'static str {
    if a.is_ipv4() { "IPv4" } else { "IPv6" }
}

fn one_family(t: &Tuple) -> bool {
    t.src.is_ipv4() == t.dst.is_ipv4()
}

/// Why a connection record is impossible, if it is.
pub(crate) fn connection(c: &Connection) -> Result<(), String> {
    let (o, r) = (&c.original, &c.reply);
    if !one_family(o) {
        return Err(format!(
            "original tuple from {} to {}",
            family(&o.src),
            family(&o.dst)
        ));
    }
    if !one_family(r) || o.src.is_ipv4() != r.src.is_ipv4() {
        return Err(format!(
            "{} original tuple with an {} reply tuple",
            family(&o.src),
            if one_family(r) {
                family(&r.src)
            } else {
                "IPv4 and IPv6"
            }
        ));
    }
    if let Some(p) = c.tunnel_peer
        && p.is_unspecified()
    {
        return Err("unspecified tunnel peer".into());
    }
    let v6 = o.src.is_ipv6();
    match (&c.tracking, c.proto) {
        (Tracking::Tcp(t), proto::TCP) => {
            for s in [&t.original, &t.reply] {
                if s.window_scale > MAX_WINDOW_SCALE {
                    return Err(format!("TCP window scale {} above 14", s.window_scale));
                }
            }
        }
        (Tracking::Udp, proto::UDP) => {}
        (Tracking::Icmp, proto::ICMP) if !v6 => {}
        (Tracking::Icmp, proto::ICMPV6) if v6 => {}
        (Tracking::Icmp, p @ (proto::ICMP | proto::ICMPV6)) => {
            return Err(format!("ICMP protocol {p} over {}", family(&o.src)));
        }
        (Tracking::Other, p)
            if !matches!(p, proto::TCP | proto::UDP | proto::ICMP | proto::ICMPV6) => {}
        (t, p) => {
            let name = match t {
                Tracking::Tcp(_) => "TCP",
                Tracking::Udp => "UDP",
                Tracking::Icmp => "ICMP echo",
                Tracking::Other => "address-only",
            };
            return Err(format!("{name} tracking of protocol {p}"));
        }
    }
    if !c.seen_reply && (c.packets[1] != 0 || c.bytes[1] != 0) {
        return Err("replies counted on a connection that saw none".into());
    }
    if c.assured && !c.seen_reply {
        return Err("assured without a reply".into());
    }
    if c.first_seen_ago_ns < c.last_seen_ago_ns {
        return Err("last packet before the first".into());
    }
    // Without a translation of a side, replies carry that side as it was: the entry
    // would translate the other packets wrongly, or not at all.
    let back = reversed(c.zone, c.proto, r);
    if !c.snat && (back.src, back.src_port) != (o.src, o.src_port) {
        return Err("reply tuple changes the source without SNAT".into());
    }
    if !c.dnat && (back.dst, back.dst_port) != (o.dst, o.dst_port) {
        return Err("reply tuple changes the destination without DNAT".into());
    }
    Ok(())
}

/// Why an affinity record is impossible, if it is.
pub(crate) fn affinity(a: &Affinity) -> Result<(), String> {
    if a.service.is_empty() {
        return Err("no Service port name".into());
    }
    if a.client.is_ipv4() != a.endpoint.is_ipv4() {
        return Err(format!(
            "{} client kept on an {} endpoint",
            family(&a.client),
            family(&a.endpoint)
        ));
    }
    if a.endpoint_port == 0 {
        return Err("endpoint port 0".into());
    }
    if a.remaining_ns == 0 {
        return Err("lapsed before the save".into());
    }
    Ok(())
}
