//! Two-node tables, frames and helpers shared by the pipeline's tests.

pub(super) use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::*;
pub(super) use crate::flow::FlowKey;
pub(super) use crate::lb::{BackendSpec, ServiceSpec};
pub(super) use crate::tables::{
    MacAddr, ModeSpec, NodeSpec, OverlaySpec, PeerSpec, PortSpec, RouteSpec, TablesSpec,
};
pub(super) use crate::test_frames::{Tcp, ip, tcp, udp, vxlan_inner};
pub(super) use crate::wire::build::{self, IpOpts, tcp_flags};

pub(super) const UPLINK: PortId = 0;
pub(super) const POD: PortId = 1;
pub(super) const POD2: PortId = 2;
pub(super) const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0xfe];
pub(super) const SEC: u64 = 1_000_000_000;

/// The fragments of `frame`, at most `max` bytes of IP each, identification `id`.
pub(super) fn frags(frame: Vec<u8>, id: u32, max: usize) -> Vec<Vec<u8>> {
    let parsed = parse(&frame, 0).unwrap();
    let mut pkt = Packet::new(frame, 0, 0);
    pkt.meta.frag_id = id;
    let mut out = Vec::new();
    ipf::refragment(&pkt, &parsed, max, &mut out).unwrap();
    out.into_iter().map(|p| p.data).collect()
}

/// Node `n` (1 or 2): uplink 192.168.50.n0/24 and fd00:50::n0/64, pods 10.244.n.5
/// and 10.244.n.6 (and fd00:10:244:n::5), default routes via the .1 gateways.
pub(super) fn node_spec(n: u8, mode: ModeSpec, peers: Vec<PeerSpec>) -> TablesSpec {
    let pod = |name: &str, last: u8| PortSpec {
        name: name.into(),
        kind: PortKind::Pod,
        mac: MacAddr([0xee, 0xee, 0xee, 0xee, n, last]),
        peer_mac: Some(MacAddr(pod_mac(n, last))),
        addresses: vec![
            format!("10.244.{n}.{last}").parse().unwrap(),
            format!("fd00:10:244:{n}::{last}").parse().unwrap(),
        ],
        ..PortSpec::default()
    };
    let via = |prefix: &str, gw: &str| RouteSpec {
        prefix: prefix.parse().unwrap(),
        port: "eth0".into(),
        next_hop_mac: None,
        via: Some(ip(gw)),
    };
    TablesSpec {
        ports: vec![
            PortSpec {
                name: "eth0".into(),
                kind: PortKind::Uplink,
                mac: MacAddr(uplink_mac(n)),
                addresses: vec![
                    format!("192.168.50.{}/24", n * 10).parse().unwrap(),
                    format!("fd00:50::{}/64", n * 10).parse().unwrap(),
                ],
                ..PortSpec::default()
            },
            pod("pod-a", 5),
            pod("pod-b", 6),
        ],
        routes: vec![via("0.0.0.0/0", "192.168.50.1"), via("::/0", "fd00:50::1")],
        node: NodeSpec {
            name: format!("node{n}"),
            addresses: vec![],
            pod_cidrs: vec![],
            zone: None,
        },
        overlay: Some(OverlaySpec {
            vni: 4096,
            port: 4789,
            mode,
            uplink: "eth0".into(),
            mac: None,
        }),
        nodes: peers,
        ..TablesSpec::default()
    }
}

/// Node 1's tables, encapsulating always, with node 2 as its peer.
pub(super) fn node1_spec() -> TablesSpec {
    node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")])
}

/// A pipeline with the tables of `spec`.
pub(super) fn compiled(spec: &TablesSpec) -> Pipeline {
    Pipeline::new(Arc::new(spec.compile().unwrap()))
}

pub(super) fn peer(n: u8, address: &str) -> PeerSpec {
    PeerSpec {
        name: format!("node{n}"),
        address: ip(address),
        pod_cidrs: vec![
            format!("10.244.{n}.0/24").parse().unwrap(),
            format!("fd00:10:244:{n}::/64").parse().unwrap(),
        ],
        mac: None,
    }
}

pub(super) fn pod_mac(n: u8, last: u8) -> [u8; 6] {
    [0x0a, 0x58, 0x0a, 0xf4, n, last]
}

pub(super) fn uplink_mac(n: u8) -> [u8; 6] {
    [2, 0xaa, 0, 0, 0, n]
}

/// The two nodes of the tests, encapsulating always.
pub(super) fn nodes() -> (Pipeline, Pipeline) {
    let a = node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")]);
    let b = node_spec(2, ModeSpec::Always, vec![peer(1, "192.168.50.10")]);
    (
        Pipeline::new(Arc::new(a.compile().unwrap())),
        Pipeline::new(Arc::new(b.compile().unwrap())),
    )
}

pub(super) fn run(
    p: &mut Pipeline,
    frame: Vec<u8>,
    port: PortId,
    t: u64,
) -> (Verdict, Vec<(PortId, Packet)>) {
    run_packet(p, Packet::new(frame, port, t))
}

/// [`run`], with a trace.
pub(super) fn traced(
    p: &mut Pipeline,
    frame: Vec<u8>,
    port: PortId,
    t: u64,
) -> (Verdict, Vec<(PortId, Packet)>, Trace) {
    let mut out = Vec::new();
    let mut tr = Trace::enabled();
    let v = p.process(Packet::new(frame, port, t), &mut out, &mut tr);
    (v, out, tr)
}

/// Whether the trace has an event of `stage` whose text contains `text`.
pub(super) fn has_event(tr: &Trace, stage: &str, text: &str) -> bool {
    tr.events
        .iter()
        .any(|e| e.stage().name() == stage && e.to_string().contains(text))
}

/// A static rule masquerading what `matches`.
pub(super) fn masquerade(matches: crate::nat::MatchSpec) -> crate::nat::NatRuleSpec {
    crate::nat::NatRuleSpec {
        matches,
        dnat: None,
        snat: None,
        masquerade: true,
    }
}

/// The flow key of a frame.
pub(super) fn key_of(frame: &[u8]) -> FlowKey {
    parse(frame, 0).unwrap().key
}

/// Runs `frames` (the fragments of a datagram, say) through `p` one after another: the
/// last one's verdict and output.
pub(super) fn run_each(
    p: &mut Pipeline,
    frames: impl IntoIterator<Item = Vec<u8>>,
    port: PortId,
    t: u64,
) -> (Verdict, Vec<(PortId, Packet)>) {
    let mut last = (Verdict::Held, Vec::new());
    for f in frames {
        last = run(p, f, port, t);
    }
    last
}

/// Runs a packet that carries more than its frame (an offload request) through `p`.
pub(super) fn run_packet(p: &mut Pipeline, pkt: Packet) -> (Verdict, Vec<(PortId, Packet)>) {
    let mut out = Vec::new();
    let v = p.process(pkt, &mut out, &mut Trace::disabled());
    (v, out)
}

/// `frame` arriving on `port` at time 0 with a GSO request of `gso_type` and `gso_size`.
pub(super) fn gso_packet(frame: Vec<u8>, port: PortId, gso_type: u8, gso_size: u16) -> Packet {
    let mut pkt = Packet::new(frame, port, 0);
    pkt.meta.vnet.gso_type = gso_type;
    pkt.meta.vnet.gso_size = gso_size;
    pkt
}

/// The sum of a transport segment `l4` with its IPv4 pseudo-header, folded: 0xffff when
/// its checksum is right.
pub(super) fn l4_sum_v4(l4: &[u8], src: [u8; 4], dst: [u8; 4], proto: u8) -> u16 {
    checksum::fold(checksum::add(
        l4,
        checksum::pseudo_v4(src, dst, proto, l4.len() as u16),
    ))
}

/// Options for a frame sent by pod `last` of node `n` to its gateway.
pub(super) fn from_pod(n: u8, last: u8) -> IpOpts {
    IpOpts {
        src_mac: pod_mac(n, last),
        dst_mac: [0xee, 0xee, 0xee, 0xee, n, last],
        ..IpOpts::default()
    }
}

/// A TCP GSO super-packet of `payload` bytes (segment size 1460) from pod 10.244.1.5 of
/// node 1 to 10.244.2.6 on node 2.
pub(super) fn gso_from_pod(payload: usize) -> Packet {
    let f = tcp("10.244.1.5", "10.244.2.6", 33000, 80)
        .seq(1, 1)
        .flags(tcp_flags::ACK)
        .opts(&from_pod(1, 5))
        .frame(&build::pattern(payload, 1));
    gso_packet(f, POD, VnetHdr::GSO_TCPV4, 1460)
}

/// A UDP datagram from port 1 to port 2 that pod 10.244.1.5 of node 1 sends (through
/// its link, so with its MACs) with `src` as its source address, of either family.
pub(super) fn pod_udp(src: &str, dst: &str, payload: &[u8]) -> Vec<u8> {
    build::udp(ip(src), ip(dst), 1, 2, payload, &from_pod(1, 5))
}

pub(super) fn udp_from_pod(dst: &str, sport: u16, payload: &[u8]) -> Vec<u8> {
    build::udp(
        ip("10.244.1.5"),
        ip(dst),
        sport,
        7000,
        payload,
        &from_pod(1, 5),
    )
}

/// An ARP reply from `ip` at `mac` to node `n`'s uplink.
pub(super) fn arp_reply(n: u8, from: &str, mac: [u8; 6]) -> Vec<u8> {
    let IpAddr::V4(from) = ip(from) else { panic!() };
    arp::Repr {
        op: arp::REPLY,
        sender_mac: mac,
        sender_ip: from,
        target_mac: uplink_mac(n),
        target_ip: Ipv4Addr::new(192, 168, 50, n * 10),
    }
    .frame(uplink_mac(n), mac, None)
}

/// Teaches node `n` where `addr` is, the way it learns it: its probe, then a reply.
pub(super) fn learn(p: &mut Pipeline, n: u8, addr: &str, mac: [u8; 6]) {
    let mut out = Vec::new();
    p.neighbour(UPLINK, ip(addr), 0, &mut out, &mut Trace::disabled())
        .unwrap_err();
    assert_eq!(
        run(p, arp_reply(n, addr, mac), UPLINK, 0).0,
        Verdict::Consumed
    );
}

pub(super) fn arp_of(frame: &[u8]) -> arp::Repr {
    let p = parse(frame, 0).unwrap();
    assert_eq!(p.l3, L3::Arp);
    arp::Repr::parse(&frame[p.l3_off..]).unwrap()
}

/// An endpoint on node `node`, ready.
pub(super) fn be(addr: &str, port: u16, node: u8) -> BackendSpec {
    BackendSpec {
        addr: ip(addr),
        port,
        node: Some(format!("node{node}")),
        no_node: false,
        ready: true,
        serving: None,
        terminating: false,
        hints: Default::default(),
    }
}

/// Tables of node `n` of the two nodes with `services` (for [`node`], or a swap).
pub(super) fn node_tables(n: u8, mode: ModeSpec, services: Vec<ServiceSpec>) -> Arc<Tables> {
    let other = 3 - n;
    let mut spec = node_spec(
        n,
        mode,
        vec![peer(other, &format!("192.168.50.{}", other * 10))],
    );
    spec.services = services;
    Arc::new(spec.compile().unwrap())
}

/// Node `n` of the two-node tables with `services`; node 2 is on the uplink subnet, so
/// cross-subnet mode routes to its pods without encapsulation.
pub(super) fn node(n: u8, mode: ModeSpec, services: Vec<ServiceSpec>) -> Pipeline {
    let other = 3 - n;
    let mut p = Pipeline::new(node_tables(n, mode, services));
    learn(&mut p, n, "192.168.50.1", GW_MAC);
    learn(
        &mut p,
        n,
        &format!("192.168.50.{}", other * 10),
        uplink_mac(other),
    );
    p
}

/// A broadcast ARP request from `sender` at `mac` for `target`.
pub(super) fn arp_request(mac: [u8; 6], sender: &str, target: &str) -> Vec<u8> {
    let (IpAddr::V4(s), IpAddr::V4(t)) = (ip(sender), ip(target)) else {
        panic!()
    };
    arp::Repr {
        op: arp::REQUEST,
        sender_mac: mac,
        sender_ip: s,
        target_mac: [0; 6],
        target_ip: t,
    }
    .frame([0xff; 6], mac, None)
}

/// The outer headers of a VXLAN packet from node `from`'s uplink to node `to`'s (1 or
/// 2), with the tests' VNI and port, flow hash `hash` and identification 0.
pub(super) fn tunnel(from: u8, to: u8, hash: u32) -> overlay::Outer {
    overlay::Outer {
        src_mac: uplink_mac(from),
        dst_mac: uplink_mac(to),
        src: ip(&format!("192.168.50.{}", from * 10)),
        dst: ip(&format!("192.168.50.{}", to * 10)),
        vni: 4096,
        port: 4789,
        hash,
        id: 0,
    }
}

/// What the ICMP error `frame` (parsed as `pe`) quotes: the destination address and
/// port of the packet it is about.
pub(super) fn quoted(frame: &[u8], pe: &Parsed) -> (IpAddr, u16) {
    let q = &frame[pe.l4_off + 8..];
    let (dst, l4) = if pe.l3 == L3::Ipv4 {
        let d: [u8; 4] = q[16..20].try_into().unwrap();
        (IpAddr::from(d), usize::from(q[0] & 15) * 4)
    } else {
        let d: [u8; 16] = q[24..40].try_into().unwrap();
        (IpAddr::from(d), 40)
    };
    (dst, u16::from_be_bytes([q[l4 + 2], q[l4 + 3]]))
}

/// Service `default/web:http`: TCP port 80 at a cluster IP of each family, node port
/// 30080, an external IP and a load-balancer IP.
pub(super) fn web(backends: Vec<BackendSpec>) -> ServiceSpec {
    ServiceSpec {
        name: "default/web:http".into(),
        proto: "tcp".into(),
        port: 80,
        cluster_ips: vec![ip("10.96.0.10"), ip("fd00:96::10")],
        node_port: Some(30080),
        external_ips: vec![ip("192.168.70.9")],
        load_balancer_ips: vec![ip("192.168.70.10")],
        backends,
        ..ServiceSpec::default()
    }
}
