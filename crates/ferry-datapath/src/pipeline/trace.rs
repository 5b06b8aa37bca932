//! Dry runs (`ferry trace`): packets run through a scratch copy of a pipeline, stage by
//! stage, and the reply the other side would send.
//!
//! The scratch pipeline ([`Pipeline::scratch_for`]) reads the same tables and starts
//! with copies of what the live one knows that matters to the packets traced: the
//! neighbour table, the session affinity records, and the connections the packets would
//! meet. Everything else (fragments, ICMP budget, counters) starts empty. Nothing a
//! trace does reaches the live pipeline, and nothing it emits is sent: the report only
//! describes it.
//!
//! A connection whose NAT is chosen in the scratch copy sees only the connections copied
//! into it, so a source NAT port it picks may be one the live table has in use.
//!
//! A packet whose next hop the copied neighbour table does not know is queued in the
//! scratch pipeline, as it would be in the live one: its verdict names the next hop and
//! says whether an ARP request / neighbour solicitation would be sent for it. Nothing
//! answers in a dry run, so it goes no further and no reply pass follows it.

use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Pipeline, SockAddr, Trace, TraceEvent, Verdict};
use crate::conntrack::{Conntrack, Entry, ORIGINAL, ProtoState, REPLY, TcpState, reverse};
use crate::describe::{self, Described, Transport};
use crate::flow::{FlowKey, proto};
use crate::ipf::Reassembler;
use crate::lb;
use crate::neigh::{arp, nd};
use crate::overlay;
use crate::packet::{Packet, PortId};
use crate::tables::{Overlay, Tables};
use crate::wire::build::tcp_flags;
use crate::wire::icmp_error;
use crate::wire::vxlan;
use crate::wire::{L3, Parsed, parse};

/// What a trace found: one pass per packet, and the way back.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceReport {
    /// The packets in order (`packet 1`, `packet 2`, ...), then the synthesized reply
    /// (`reply`) when one was asked for and could be built.
    pub passes: Vec<TracePass>,
    /// The way packets take back along the last packet's connection (through which node,
    /// and the NAT undone), when that connection exists.
    pub reverse: Option<String>,
}

/// One packet's way through the pipeline.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracePass {
    /// `packet N` or `reply`.
    pub label: String,
    /// The port it arrived on, by name.
    pub in_port: String,
    /// The packet as it arrived, on one line.
    pub summary: String,
    /// What each stage did, in order.
    pub stages: Vec<TraceStage>,
    /// `forwarded`, `held`, `consumed`, `queued: ...` (the next hop it waits for) or
    /// `dropped: REASON`.
    pub verdict: String,
    /// What conntrack made of it (see [`Trace::ct_name`]), when it got that far.
    pub ct: Option<String>,
    /// Every packet the pipeline emitted for it, after rewriting.
    pub out: Vec<TraceOut>,
}

/// One stage's note.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceStage {
    /// The stage (`parse`, `decap`, `service`, `ct`, `route`, `encap`, ...).
    pub stage: String,
    /// What it did, as text.
    pub detail: String,
    /// What it did, as fields (tagged by `kind`); absent from an older agent's report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<TraceEvent>,
}

/// A packet the pipeline emitted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceOut {
    /// The port it leaves by, by name.
    pub port: String,
    /// The packet on one line; for VXLAN, the outer headers and the inner packet.
    pub summary: String,
}

/// Initial sequence number of a synthesized SYN-ACK.
const REPLY_ISN: u32 = 7000;

impl Pipeline {
    /// A scratch pipeline for a dry run of `frames`: the same tables, copies of the
    /// neighbour table and the session affinity records, the same connection table
    /// settings, and copies of the connections that the frames (or, for VXLAN to this
    /// node on the overlay uplink, their inner frames; for ICMP errors, the packets they
    /// quote) would meet. Fragments, counters and the ICMP budget start afresh.
    pub fn scratch_for(&self, frames: &[(PortId, &[u8])]) -> Pipeline {
        let mut p = Pipeline::new(Arc::clone(&self.tables));
        p.dry_run = true;
        p.ipf = Reassembler::new(self.ipf.config().clone());
        p.ct = Conntrack::new(*self.ct.config());
        p.neigh = self.neigh.clone();
        p.affinity = self.affinity.clone();
        p.affinity_swept_ns = self.affinity_swept_ns;
        for (port, frame) in frames {
            for key in lookup_keys(&self.tables, *port, frame) {
                let Some(e) = self.ct.lookup(&key).and_then(|(id, _)| self.ct.get(id)) else {
                    continue;
                };
                if p.ct.lookup(&e.original()).is_none() {
                    // Refused only when the scratch table is full: the trace then shows
                    // the connection as new, which the report makes plain.
                    let _ = p.ct.adopt(e.clone(), e.last_seen_ns);
                }
            }
        }
        p
    }
}

/// Runs `frames` (each with the port it arrives on) through a scratch copy of `live` at
/// `now_ns`, recording every stage. With `reply`, when the last packet was forwarded on a
/// connection that exists in the scratch table afterwards, the packet the other side
/// would send back is built and traced too: for TCP the next segment in window (a
/// SYN-ACK to a SYN), for UDP a datagram, for ICMP an echo reply; arriving VXLAN-
/// encapsulated from the node the last packet was tunnelled to, or else plain on the
/// port the last packet left by (MACs as [`Described::frame`] gives them).
pub fn trace(
    live: &Pipeline,
    frames: Vec<(PortId, Vec<u8>)>,
    now_ns: u64,
    reply: bool,
) -> TraceReport {
    let tables = Arc::clone(live.tables());
    let refs: Vec<(PortId, &[u8])> = frames.iter().map(|(p, f)| (*p, f.as_slice())).collect();
    let mut scratch = live.scratch_for(&refs);
    let mut report = TraceReport::default();
    let mut last = None;
    for (i, (port, frame)) in frames.into_iter().enumerate() {
        let label = format!("packet {}", i + 1);
        let (pass, run) = run_pass(&mut scratch, &tables, label, port, frame, now_ns);
        report.passes.push(pass);
        last = Some(run);
    }
    let Some(last) = last else {
        return report;
    };
    let Some((entry, dir)) =
        last.trace
            .key
            .and_then(|k| scratch.ct.lookup(&k))
            .and_then(|(id, r)| {
                Some((
                    scratch.ct.get(id)?.clone(),
                    if r { REPLY } else { ORIGINAL },
                ))
            })
    else {
        return report;
    };
    let left = left_by(&tables, &entry, dir, &last.out);
    report.reverse = Some(reverse_path(&tables, &entry, dir, left.as_ref()));
    if reply
        && last.verdict == Verdict::Forwarded
        && let Some(left) = &left
        && let Some((port, frame)) = reply_frame(&tables, &entry, dir, left)
    {
        let (pass, _) = run_pass(&mut scratch, &tables, "reply".into(), port, frame, now_ns);
        report.passes.push(pass);
    }
    report
}

/// What a pass left behind for the reply.
struct Run {
    verdict: Verdict,
    trace: Trace,
    out: Vec<(PortId, Packet)>,
}

fn run_pass(
    p: &mut Pipeline,
    tables: &Tables,
    label: String,
    port: PortId,
    frame: Vec<u8>,
    now_ns: u64,
) -> (TracePass, Run) {
    let summary = summarize(tables, port, &frame);
    let mut trace = Trace::enabled();
    let mut out = Vec::new();
    let verdict = p.process(Packet::new(frame, port, now_ns), &mut out, &mut trace);
    let pass = TracePass {
        label,
        in_port: port_name(tables, port),
        summary,
        stages: trace
            .events
            .iter()
            .map(|e| TraceStage {
                stage: e.stage().name().to_string(),
                detail: e.to_string(),
                event: Some(e.clone()),
            })
            .collect(),
        verdict: match verdict {
            Verdict::Dropped(r) => format!("dropped: {}", r.name()),
            Verdict::Queued => queued(tables, &trace, &out),
            v => v.name().to_string(),
        },
        ct: trace.ct_name().map(String::from),
        out: out
            .iter()
            .map(|(port, pkt)| TraceOut {
                port: port_name(tables, *port),
                summary: summarize(tables, *port, &pkt.data),
            })
            .collect(),
    };
    (
        pass,
        Run {
            verdict,
            trace,
            out,
        },
    )
}

/// The verdict of a packet queued for its next hop: which one, and whether this pass
/// would ask for it.
fn queued(tables: &Tables, trace: &Trace, out: &[(PortId, Packet)]) -> String {
    let Some((port, ip)) = trace.waiting_for else {
        return Verdict::Queued.name().to_string();
    };
    let asks = out
        .iter()
        .any(|(p, pkt)| *p == port && probe_target(&pkt.data) == Some(ip));
    let ask = match (asks, ip) {
        (true, IpAddr::V4(_)) => "an ARP request would be sent",
        (true, IpAddr::V6(_)) => "a neighbour solicitation would be sent",
        (false, _) => "already asked",
    };
    format!(
        "queued: next hop {ip} on {} unresolved, {ask}",
        port_name(tables, port)
    )
}

/// The address an ARP request or neighbour solicitation asks for.
fn probe_target(frame: &[u8]) -> Option<IpAddr> {
    let p = parse(frame, 0).ok()?;
    if p.l3 == L3::Arp {
        let a = arp::Repr::parse(&frame[p.l3_off..]).ok()?;
        return (a.op == arp::REQUEST).then_some(IpAddr::V4(a.target_ip));
    }
    match nd::parse(frame, &p) {
        Ok(Some(nd::Message::Solicit { target, .. })) => Some(IpAddr::V6(target)),
        _ => None,
    }
}

fn port_name(tables: &Tables, port: PortId) -> String {
    tables
        .ports
        .get(usize::from(port))
        .map_or_else(|| format!("port {port}"), |p| p.name.clone())
}

/// The overlay when `port` is its uplink and `parsed` is VXLAN on its UDP port.
fn vxlan_on<'a>(tables: &'a Tables, port: PortId, parsed: &Parsed) -> Option<&'a Overlay> {
    tables.overlay.as_ref().filter(|ov| {
        ov.uplink == port
            && parsed.proto == proto::UDP
            && parsed.l4_complete
            && parsed.frag.is_none()
            && parsed.key.dst_port == ov.port
    })
}

/// The keys under which the pipeline would look up a frame's connection.
fn lookup_keys(tables: &Tables, port: PortId, frame: &[u8]) -> Vec<FlowKey> {
    let Some(zone) = tables.ports.get(usize::from(port)).map(|p| p.zone) else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    let Ok(parsed) = parse(frame, zone) else {
        return keys;
    };
    let mut add = |frame: &[u8], parsed: &Parsed| {
        if !parsed.is_ip() {
            return;
        }
        keys.push(parsed.key);
        if let Ok(Some(emb)) = icmp_error::embedded(frame, parsed) {
            keys.push(reverse(&emb.key));
        }
    };
    add(frame, &parsed);
    if vxlan_on(tables, port, &parsed).is_some()
        && tables.node.addresses.contains(&parsed.key.dst.ip())
        && let Some((inner, _)) = vxlan::inner(frame, &parsed)
        && let Ok(ip) = parse(inner, zone)
    {
        add(inner, &ip);
    }
    keys
}

/// One line about a frame seen at `port`: its key, length, TTL and flags (and fragment,
/// DF); for ARP what it asks or tells; for VXLAN on the overlay uplink, the outer
/// addresses and VNI, then the inner packet; for a frame that does not parse, why.
pub fn summarize(tables: &Tables, port: PortId, frame: &[u8]) -> String {
    let zone = tables.ports.get(usize::from(port)).map_or(0, |p| p.zone);
    let parsed = match parse(frame, zone) {
        Ok(p) => p,
        Err(r) => return format!("unreadable frame of {} bytes: {r}", frame.len()),
    };
    if parsed.l3 == L3::Arp {
        return match arp::Repr::parse(&frame[parsed.l3_off..]) {
            Ok(a) if a.op == arp::REQUEST => {
                format!("arp who-has {} tell {}", a.target_ip, a.sender_ip)
            }
            Ok(a) => format!(
                "arp {} is-at {}",
                a.sender_ip,
                crate::tables::MacAddr(a.sender_mac)
            ),
            Err(r) => format!("arp, unreadable: {r}"),
        };
    }
    if vxlan_on(tables, port, &parsed).is_some()
        && let Some((inner, vni)) = vxlan::inner(frame, &parsed)
    {
        let inner = match parse(inner, zone) {
            Ok(ip) if ip.is_ip() => ip_line(inner, &ip),
            Ok(_) => "arp".into(),
            Err(r) => format!("unreadable inner frame: {r}"),
        };
        return format!(
            "vxlan vni {vni} {} -> {}: {inner}",
            parsed.key.src, parsed.key.dst
        );
    }
    ip_line(frame, &parsed)
}

fn ip_line(frame: &[u8], p: &Parsed) -> String {
    let mut s = format!("{}, {} bytes, ttl {}", p.key, p.ip_len(), p.ttl);
    if p.proto == proto::TCP
        && p.l4_complete
        && let Some(t) = frame.get(p.l4_off..p.l4_off + 14)
    {
        let seq = u32::from_be_bytes([t[4], t[5], t[6], t[7]]);
        let ack = u32::from_be_bytes([t[8], t[9], t[10], t[11]]);
        s += &format!(", {} seq {seq}", describe::flag_words(t[13]));
        if t[13] & tcp_flags::ACK != 0 {
            s += &format!(" ack {ack}");
        }
    }
    if let Some(f) = p.frag {
        s += &format!(
            ", fragment id {} offset {}{}",
            f.id,
            f.offset,
            if f.more { " more" } else { "" }
        );
    }
    if p.dont_fragment {
        s += ", df";
    }
    s
}

/// Where the last packet left: its port, and the overlay peer when it was tunnelled,
/// with the MAC it was sent to and this node's outer address.
struct Left {
    port: PortId,
    tunnel: Option<(u16, [u8; 6], IpAddr)>,
}

/// The emitted packet that carries the connection on (its key, inner when tunnelled, is
/// the translated tuple of the last packet's direction), else the first IP packet out.
fn left_by(tables: &Tables, e: &Entry, dir: usize, out: &[(PortId, Packet)]) -> Option<Left> {
    let want = reverse(&e.tuple(1 - dir));
    let same = |k: &FlowKey| {
        (k.src, k.dst, k.proto, k.src_port, k.dst_port)
            == (want.src, want.dst, want.proto, want.src_port, want.dst_port)
    };
    let mut first = None;
    for (port, pkt) in out {
        let Ok(p) = parse(&pkt.data, 0) else { continue };
        // Neither ARP nor a neighbour solicitation for a queued packet says where it
        // leaves.
        if !p.is_ip() || probe_target(&pkt.data).is_some() {
            continue;
        }
        let tunnel = vxlan_on(tables, *port, &p).and_then(|ov| {
            let i = ov.peer_index(p.key.dst.ip())?;
            let (inner, _) = vxlan::inner(&pkt.data, &p)?;
            let ip = parse(inner, 0).ok()?;
            let mac = pkt.data[0..6].try_into().ok()?;
            Some(((i, mac, p.key.src.ip()), ip.key))
        });
        let key = tunnel.map_or(p.key, |(_, k)| k);
        let left = Left {
            port: *port,
            tunnel: tunnel.map(|(t, _)| t),
        };
        if same(&key) {
            return Some(left);
        }
        first.get_or_insert(left);
    }
    first
}

/// The packet the other side sends back on connection `e`, whose last packet went in
/// direction `dir`, and where it arrives.
fn reply_frame(tables: &Tables, e: &Entry, dir: usize, left: &Left) -> Option<(PortId, Vec<u8>)> {
    let rd = 1 - dir;
    let k = e.tuple(rd);
    let (transport, len) = match &e.proto_state {
        ProtoState::Tcp(c) => {
            // A reset closed it: nothing answers.
            if c.state == TcpState::Close {
                return None;
            }
            let handshake = c.state == TcpState::SynSent && rd == REPLY;
            let seq = if c.maxwin[rd] == 0 {
                REPLY_ISN
            } else {
                c.end[rd]
            };
            let flags = if handshake {
                tcp_flags::SYN | tcp_flags::ACK
            } else {
                tcp_flags::ACK
            };
            let t = Transport::Tcp {
                flags,
                seq,
                ack: c.end[dir],
            };
            (t, 0)
        }
        ProtoState::Udp => (Transport::Udp, describe::DEFAULT_UDP_LEN),
        ProtoState::Icmp => {
            let ty = (k.dst_port >> 8) as u8;
            let t = Transport::Echo {
                id: k.src_port,
                seq: 1,
                reply: ty == 0 || ty == 129,
            };
            (t, describe::DEFAULT_ICMP_LEN)
        }
        ProtoState::Sctp(_) | ProtoState::Other => return None,
    };
    let d = Described {
        src: k.src.ip(),
        dst: k.dst.ip(),
        src_port: k.src_port,
        dst_port: k.dst_port,
        transport,
        len,
        ttl: describe::DEFAULT_TTL,
        dont_fragment: false,
    };
    match (left.tunnel, &tables.overlay) {
        (Some((i, peer_mac, here)), Some(ov)) => {
            let peer = &ov.peers[usize::from(i)];
            let inner = d.build(peer.vtep_mac, ov.vtep_mac);
            let uplink = tables.ports.get(usize::from(ov.uplink))?;
            let outer = overlay::Outer {
                src_mac: peer_mac,
                dst_mac: uplink.mac,
                src: peer.address,
                dst: here,
                vni: ov.vni,
                port: ov.port,
                hash: overlay::flow_hash(&k),
                id: 0,
            };
            Some((ov.uplink, overlay::encapsulate(&inner, &outer)))
        }
        _ => Some((left.port, d.frame(tables, left.port).ok()?)),
    }
}

/// `addr:port` for TCP and UDP, the address alone otherwise.
fn endpoint(k: &FlowKey, src: bool) -> String {
    let (a, p) = if src {
        (k.src, k.src_port)
    } else {
        (k.dst, k.dst_port)
    };
    match k.proto {
        proto::TCP | proto::UDP => SockAddr(a.ip(), p).to_string(),
        _ => a.to_string(),
    }
}

fn node(ov: &Overlay, i: u16) -> String {
    let p = &ov.peers[usize::from(i)];
    format!("node {} ({})", p.name, p.address)
}

/// One line on the way back along `e` for packets going against direction `dir`: where
/// they come from, through which node, and the NAT undone.
fn reverse_path(tables: &Tables, e: &Entry, dir: usize, left: Option<&Left>) -> String {
    let rd = 1 - dir;
    let back = e.tuple(rd);
    let what = if rd == REPLY {
        "replies"
    } else {
        "packets in the original direction"
    };
    let mut s = format!(
        "{what} from {} to {}",
        endpoint(&back, true),
        endpoint(&back, false)
    );
    let ov = tables.overlay.as_ref();
    let tunnel_from = left.and_then(|l| l.tunnel).map(|(i, _, _)| i);
    let marked = e.mark & lb::MARK_TUNNEL != 0;
    let via = match (ov, e.tunnel_peer()) {
        (Some(ov), Some(peer)) if rd == REPLY => Some(match ov.peer_index(peer) {
            Some(i) => format!(
                " are sent back through the tunnel to {}, which the connection came from",
                node(ov, i)
            ),
            None => format!(" are sent back through the tunnel to {peer}"),
        }),
        (Some(ov), _) => tunnel_from
            .or_else(|| {
                (marked && rd == REPLY)
                    .then(|| ov.peer_for_pod(back.src.ip()))
                    .flatten()
            })
            .map(|i| format!(" return through the tunnel from {}", node(ov, i))),
        _ => None,
    };
    match via {
        Some(v) => s += &v,
        None => {
            let port = left.map(|l| port_name(tables, l.port));
            match port {
                Some(p) => s += &format!(" arrive on {p}"),
                None => s += " arrive",
            }
        }
    }
    if !e.status.nat() {
        s += ", with no translation to undo";
        return s;
    }
    // Packets against `dir` leave as the reverse of `dir`'s tuple as it arrived.
    let to = reverse(&e.tuple(dir));
    let (o, r) = (e.original(), e.reply());
    let mut undone = Vec::new();
    let dnat = (o.dst, o.dst_port) != (r.src, r.src_port);
    let snat = (o.src, o.src_port) != (r.dst, r.dst_port);
    if dnat {
        undone.push(format!(
            "the destination NAT of {} to {}",
            endpoint(&o, false),
            endpoint(&r, true)
        ));
    }
    if snat {
        undone.push(format!(
            "the source NAT of {} to {}",
            endpoint(&o, true),
            endpoint(&r, false)
        ));
    }
    let verb = if rd == REPLY {
        "are translated back"
    } else {
        "are translated"
    };
    s += &format!(
        " and {verb} to {} -> {} ({})",
        endpoint(&to, true),
        endpoint(&to, false),
        undone.join(" and ")
    );
    s
}
