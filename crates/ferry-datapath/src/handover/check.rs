//! What no pipeline could have saved: records refused whole, at decode and again at
//! restore (a state built in memory is checked too), so that a restore never meets them.

use std::net::IpAddr;

use super::records::{
    Affinity, Connection, Datagram, NeighState, Neighbour, Removed, Tracking, Tuple,
};
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

/// Why a removed connection's record is impossible, if it is.
pub(crate) fn removed(r: &Removed) -> Result<(), String> {
    let o = &r.original;
    if !one_family(o) {
        return Err(format!(
            "original tuple from {} to {}",
            family(&o.src),
            family(&o.dst)
        ));
    }
    Ok(())
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
        // SCTP tracked by addresses only is a state of before version 4.
        (Tracking::Sctp(_), proto::SCTP) => {}
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
                Tracking::Sctp(_) => "SCTP",
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

/// Why a neighbour record is impossible, if it is.
pub(crate) fn neighbour(n: &Neighbour) -> Result<(), String> {
    if n.port.is_empty() {
        return Err("no port name".into());
    }
    if n.state == NeighState::Incomplete && n.mac != [0; 6] {
        return Err("incomplete with a MAC".into());
    }
    Ok(())
}

/// Most fragments a datagram holds (`ipf::Config::MAX_FRAGMENTS_PER_DATAGRAM`).
const MAX_FRAGMENTS: usize = crate::ipf::Config::MAX_FRAGMENTS_PER_DATAGRAM;
/// Most data bytes an IP datagram carries.
const MAX_DATA: u32 = 65535;

/// Why a datagram record is impossible, if it is.
pub(crate) fn datagram(d: &Datagram) -> Result<(), String> {
    if d.src.is_ipv4() != d.dst.is_ipv4() {
        return Err(format!("from {} to {}", family(&d.src), family(&d.dst)));
    }
    if d.src.is_ipv6() && d.proto != 0 {
        return Err("an IPv6 datagram keyed by protocol".into());
    }
    if d.fragments.is_empty() || d.fragments.len() > MAX_FRAGMENTS {
        return Err(format!("{} fragments", d.fragments.len()));
    }
    let mut ranges: Vec<(u32, u32)> = Vec::with_capacity(d.fragments.len());
    for f in &d.fragments {
        let end = f.offset.saturating_add(f.data.len() as u32);
        if f.data.is_empty() || end > MAX_DATA || end > d.end.unwrap_or(MAX_DATA) {
            return Err(format!(
                "a fragment at {} of {} bytes",
                f.offset,
                f.data.len()
            ));
        }
        if ranges.iter().any(|&(a, b)| a < end && f.offset < b) {
            return Err(format!("fragments overlap at {}", f.offset));
        }
        ranges.push((f.offset, end));
    }
    let has_first = ranges.iter().any(|&(a, _)| a == 0);
    match &d.first {
        Some(h) => {
            let n = h.bytes.len();
            if !has_first || usize::from(h.ip_offset) >= n || usize::from(h.next_header_at) >= n {
                return Err("first fragment's headers do not fit".into());
            }
        }
        None if has_first => return Err("data at offset 0 without headers".into()),
        None => {}
    }
    let received: u32 = d.fragments.iter().map(|f| f.data.len() as u32).sum();
    if d.first.is_some() && d.end == Some(received) {
        return Err("complete, yet in reassembly".into());
    }
    if d.bytes < received {
        return Err("fewer bytes counted than held".into());
    }
    if d.remaining_ns == 0 {
        return Err("expired before the save".into());
    }
    Ok(())
}
