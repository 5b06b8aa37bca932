//! Table swap tests: what a running pipeline keeps, moves and drops when its tables are
//! replaced.

use super::*;
use crate::conntrack::{EntryId, Filter};
use crate::drop::DropReason;
use crate::lb::{BackendSpec, ServiceSpec};
use crate::nat::{MatchSpec, NatRuleSpec};
use crate::packet::{Packet, PortId};
use crate::pipeline::test_support::ip;
use crate::pipeline::{Trace, Verdict};
use crate::tables::{
    CtSpec, IcmpSpec, IpfSpec, MacAddr, PortKind, PortSpec, RouteSpec, TablesSpec,
};
use crate::wire::build::{self, IpOpts, tcp_flags};
use crate::wire::parse;

const CLIENT: &str = "192.168.50.1";
const VIP: &str = "10.96.0.10";
const NEXT_HOP: [u8; 6] = [2, 0, 0, 0, 0, 0xfe];

fn port(name: &str, last: u8, kind: PortKind, addresses: &[&str]) -> PortSpec {
    PortSpec {
        name: name.into(),
        kind,
        mac: MacAddr([2, 0xfe, 0, 0, 0, last]),
        addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
        ..PortSpec::default()
    }
}

fn plain(name: &str, last: u8) -> PortSpec {
    port(name, last, PortKind::Plain, &[])
}

fn route(prefix: &str, port: &str) -> RouteSpec {
    RouteSpec {
        prefix: prefix.parse().unwrap(),
        port: port.into(),
        next_hop_mac: Some(MacAddr(NEXT_HOP)),
        via: None,
    }
}

fn via(prefix: &str, port: &str, gw: &str) -> RouteSpec {
    RouteSpec {
        prefix: prefix.parse().unwrap(),
        port: port.into(),
        next_hop_mac: None,
        via: Some(ip(gw)),
    }
}

fn tables(spec: &TablesSpec) -> Arc<Tables> {
    Arc::new(spec.compile().unwrap())
}

fn udp(src: &str, sport: u16, dst: &str, dport: u16) -> Vec<u8> {
    build::udp(ip(src), ip(dst), sport, dport, b"data", &IpOpts::default())
}

fn tcp(src: &str, sport: u16, dst: &str, dport: u16, seq: u32, ack: u32, flags: u8) -> Vec<u8> {
    build::tcp(
        ip(src),
        ip(dst),
        sport,
        dport,
        seq,
        ack,
        flags,
        b"",
        &IpOpts::default(),
    )
}

/// Runs a frame in on `port`: the verdict, the conntrack state's name and what went out.
fn run(
    p: &mut Pipeline,
    frame: Vec<u8>,
    port: PortId,
    t: u64,
) -> (Verdict, Option<&'static str>, Vec<(PortId, Packet)>) {
    let mut out = Vec::new();
    let mut trace = Trace::disabled();
    let v = p.process(Packet::new(frame, port, t), &mut out, &mut trace);
    (v, trace.ct_name(), out)
}

/// The connection with `port` on some side of its tuples.
fn conn(p: &Pipeline, port: u16) -> Option<EntryId> {
    let f = Filter {
        port: Some(port),
        ..Filter::default()
    };
    p.conntrack().dump(&f).map(|(id, _)| id).next()
}

fn dnat_rule(proto: &str, src_port: Option<u16>, to: &str) -> NatRuleSpec {
    NatRuleSpec {
        matches: MatchSpec {
            proto: Some(proto.into()),
            dst: Some(format!("{VIP}/32").parse().unwrap()),
            dst_port: Some(53),
            src_port,
            ..MatchSpec::default()
        },
        dnat: Some(to.into()),
        snat: None,
        masquerade: false,
    }
}

fn backend(addr: &str) -> BackendSpec {
    BackendSpec {
        addr: ip(addr),
        port: 5353,
        node: None,
        no_node: false,
        ready: true,
        serving: None,
        terminating: false,
        hints: Default::default(),
    }
}

/// uplink (0) and pod (1); static DNAT rules send the VIP to 10.244.1.5 or .6 by client
/// port; a UDP Service (on a cluster IP the tests never address, so that the Service
/// stage leaves these packets to the rules) has the endpoints `backends`.
fn service_spec(backends: &[&str]) -> TablesSpec {
    TablesSpec {
        ports: vec![plain("uplink", 1), plain("pod", 2)],
        routes: vec![route("10.244.1.0/24", "pod"), route("0.0.0.0/0", "uplink")],
        nat: vec![
            dnat_rule("udp", Some(1001), "10.244.1.5:5353"),
            dnat_rule("udp", Some(1002), "10.244.1.6:5353"),
            dnat_rule("udp", Some(1005), "10.244.1.6:5353"),
            dnat_rule("tcp", None, "10.244.1.5:5353"),
        ],
        services: vec![ServiceSpec {
            name: "default/dns:53".into(),
            proto: "udp".into(),
            port: 53,
            cluster_ips: vec![ip("10.96.0.99")],
            backends: backends.iter().map(|a| backend(a)).collect(),
            ..ServiceSpec::default()
        }],
        ..TablesSpec::default()
    }
}

#[test]
fn test_port_counters_follow_ports_by_name() {
    let old = TablesSpec {
        ports: vec![plain("uplink", 1), plain("a", 2), plain("b", 3)],
        routes: vec![
            route("10.0.1.0/24", "a"),
            route("10.0.2.0/24", "b"),
            route("0.0.0.0/0", "uplink"),
        ],
        ..TablesSpec::default()
    };
    let mut p = Pipeline::new(tables(&old));
    for (dst, sport) in [("10.0.1.5", 1), ("10.0.2.5", 2), ("10.0.2.5", 3)] {
        assert_eq!(
            run(&mut p, udp(CLIENT, sport, dst, 7), 0, 0).0,
            Verdict::Forwarded
        );
    }
    // A runt on the uplink: dropped, counted against the uplink.
    let mut out = Vec::new();
    let v = p.process(
        Packet::new(vec![0; 5], 0, 0),
        &mut out,
        &mut Trace::disabled(),
    );
    assert_eq!(v, Verdict::Dropped(DropReason::FrameTooShort));
    let before = p.port_stats().to_vec();
    assert_eq!((before[0].rx_packets, before[2].tx_packets), (4, 2));
    assert_eq!((before[0].drops, before[1].drops), (1, 0));
    assert_eq!(p.port_drops()[0].get(DropReason::FrameTooShort), 1);

    // b first, uplink second, c new, a gone.
    let new = TablesSpec {
        ports: vec![plain("b", 3), plain("uplink", 1), plain("c", 4)],
        routes: vec![
            route("10.0.2.0/24", "b"),
            route("10.0.3.0/24", "c"),
            route("0.0.0.0/0", "uplink"),
        ],
        ..TablesSpec::default()
    };
    let r = p.set_tables(tables(&new));
    assert_eq!(r.ports_added, ["c"]);
    assert_eq!(r.ports_removed, ["a"]);
    assert_eq!(r.ports_moved, ["b", "uplink"]);
    assert_eq!(
        p.port_stats(),
        [before[2], before[0], PortStats::default()],
        "b and uplink keep their counters at their new index; c starts at zero"
    );

    // The new numbering is in force.
    let (v, _, out) = run(&mut p, udp(CLIENT, 4, "10.0.2.5", 7), 1, 1);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out[0].0, 0, "b is port 0 now");
    assert_eq!(p.port_stats()[0].tx_packets, 3);
    assert_eq!(p.port_stats()[1].rx_packets, 5);
    assert_eq!(p.port_drops().len(), 3);
    assert_eq!(p.port_drops()[1].get(DropReason::FrameTooShort), 1);
    assert_eq!(p.port_drops()[2].total(), 0);
}

#[test]
fn test_neighbours_are_kept_only_for_ports_at_the_same_index() {
    let spec = |ports: Vec<PortSpec>| TablesSpec {
        ports,
        routes: vec![
            via("10.1.0.0/16", "uplink", "192.168.50.1"),
            via("10.2.0.0/16", "host", "192.168.60.1"),
        ],
        ..TablesSpec::default()
    };
    let uplink = port("uplink", 1, PortKind::Uplink, &["192.168.50.10/24"]);
    let host = port("host", 2, PortKind::Host, &["192.168.60.10/24"]);
    let mut p = Pipeline::new(tables(&spec(vec![
        plain("in", 9),
        uplink.clone(),
        host.clone(),
    ])));
    // Each packet makes its port probe its next hop: an entry per port.
    run(&mut p, udp("10.9.0.1", 1, "10.1.0.5", 7), 0, 0);
    run(&mut p, udp("10.9.0.1", 1, "10.2.0.5", 7), 0, 0);
    assert!(p.neighbours().get(1, ip("192.168.50.1")).is_some());
    assert!(p.neighbours().get(2, ip("192.168.60.1")).is_some());

    // uplink stays port 1; host moves from 2 to 3.
    let r = p.set_tables(tables(&spec(vec![
        plain("in", 9),
        uplink,
        plain("extra", 3),
        host,
    ])));
    assert_eq!(r.neigh_removed, 1);
    assert!(p.neighbours().get(1, ip("192.168.50.1")).is_some());
    assert!(p.neighbours().get(2, ip("192.168.60.1")).is_none());
    assert!(p.neighbours().get(3, ip("192.168.60.1")).is_none());
    assert_eq!(p.neighbours().len(), 1);
}

#[test]
fn test_service_connections_to_removed_endpoints_go_and_others_stay() {
    let mut p = Pipeline::new(tables(&service_spec(&["10.244.1.5", "10.244.1.6"])));
    let mark = |p: &mut Pipeline, port: u16| {
        let id = conn(p, port).unwrap();
        p.conntrack_mut().get_mut(id).unwrap().mark |= MARK_SERVICE;
    };
    // 1001: UDP to endpoint .5, load balanced here.
    run(&mut p, udp(CLIENT, 1001, VIP, 53), 0, 0);
    mark(&mut p, 1001);
    // 1002: UDP to endpoint .6, load balanced here.
    run(&mut p, udp(CLIENT, 1002, VIP, 53), 0, 0);
    mark(&mut p, 1002);
    // 1003: TCP to .5:5353, which is an endpoint for UDP only.
    let syn = tcp(CLIENT, 1003, VIP, 53, 100, 0, tcp_flags::SYN);
    run(&mut p, syn, 0, 0);
    mark(&mut p, 1003);
    // 1004: a node port connection another node balanced to .6 and sent through the
    // tunnel: no NAT here, only the peer.
    run(&mut p, udp(CLIENT, 1004, "10.244.1.6", 5353), 0, 0);
    let id = conn(&p, 1004).unwrap();
    let e = p.conntrack_mut().get_mut(id).unwrap();
    e.set_tunnel_peer(Some(ip("192.168.50.20")));
    e.mark |= crate::lb::MARK_TUNNEL;
    // 1005: a static DNAT rule's connection to .6, not a Service's.
    run(&mut p, udp(CLIENT, 1005, VIP, 53), 0, 0);
    assert_eq!(p.conntrack().len(), 5);

    let r = p.set_tables(tables(&service_spec(&["10.244.1.5"])));
    assert_eq!(r.ct_removed, 2);
    assert_eq!(p.conntrack().len(), 3);
    assert!(conn(&p, 1002).is_none(), "endpoint .6 is gone");
    assert!(conn(&p, 1003).is_none(), "no Service has TCP .5:5353");
    for kept in [1001, 1004, 1005] {
        assert!(conn(&p, kept).is_some(), "connection from port {kept}");
    }
    assert_eq!(p.conntrack().stats().deleted, 2);

    // The client of the deleted connection starts a new one at its next packet.
    let (v, ct, _) = run(&mut p, udp(CLIENT, 1002, VIP, 53), 0, 1);
    assert_eq!((v, ct), (Verdict::Forwarded, Some("new")));
    // The others go on as before.
    let (_, ct, _) = run(&mut p, udp(CLIENT, 1001, VIP, 53), 0, 1);
    assert_eq!(ct, Some("established"));
}

#[test]
fn test_connections_keep_their_nat_across_a_swap() {
    let mut p = Pipeline::new(tables(&service_spec(&[])));
    let (_, ct, out) = run(&mut p, udp(CLIENT, 1001, VIP, 53), 0, 0);
    assert_eq!(ct, Some("new"));
    let k = parse(&out[0].1.data, 0).unwrap().key;
    assert_eq!((k.dst, k.dst_port), (ip("10.244.1.5").into(), 5353));

    // The new tables have no NAT rule at all.
    let mut spec = service_spec(&[]);
    spec.nat.clear();
    let r = p.set_tables(tables(&spec));
    assert_eq!(r, SwapReport::default(), "nothing to report");

    let (v, ct, out) = run(&mut p, udp("10.244.1.5", 5353, CLIENT, 1001), 1, 1);
    assert_eq!((v, ct), (Verdict::Forwarded, Some("reply")));
    let k = parse(&out[0].1.data, 0).unwrap().key;
    assert_eq!(
        (k.src, k.src_port),
        (ip(VIP).into(), 53),
        "the reply is translated back"
    );
    let (_, ct, out) = run(&mut p, udp(CLIENT, 1001, VIP, 53), 0, 2);
    assert_eq!(ct, Some("established"));
    let k = parse(&out[0].1.data, 0).unwrap().key;
    assert_eq!(
        k.dst,
        ip("10.244.1.5"),
        "later packets still go to the endpoint"
    );
}

fn with_settings() -> TablesSpec {
    TablesSpec {
        ipf: IpfSpec {
            timeout_ms: Some(5000),
            max_datagrams: Some(7),
            max_datagrams_per_source: Some(6),
            max_bytes: Some(70_000),
            min_fragment_v4: Some(500),
            min_fragment_v6: Some(1300),
        },
        icmp: IcmpSpec {
            per_second: Some(5),
            burst: Some(3),
        },
        ct: CtSpec {
            max_entries: Some(10),
            pass_invalid: true,
            tcp_pickup: Some(false),
        },
        ..service_spec(&[])
    }
}

/// The settings a pipeline runs with, comparable.
fn settings(p: &Pipeline) -> (u64, usize, usize, u16, u16, (u32, u32), bool, usize) {
    let i = p.reassembler().config();
    (
        i.timeout_ns,
        i.max_datagrams,
        i.max_bytes,
        i.min_fragment_v4,
        i.min_fragment_v6,
        p.icmp.limits(),
        p.conntrack().config().tcp_pickup,
        p.conntrack().config().max_entries,
    )
}

#[test]
fn test_settings_apply_at_the_swap_except_ct_max_entries() {
    let mut p = Pipeline::new(tables(&service_spec(&[])));
    let r = p.set_tables(tables(&with_settings()));
    assert_eq!(r.not_applied, ["ct.max_entries"]);
    let fresh = Pipeline::new(tables(&with_settings()));
    let (mut got, want) = (settings(&p), settings(&fresh));
    assert_eq!(got.7, crate::conntrack::Config::DEFAULT_MAX_ENTRIES);
    got.7 = want.7;
    assert_eq!(
        got, want,
        "as a pipeline created with these tables, but for ct.max_entries"
    );
    // Swapping back restores every default, and nothing is left pending.
    let r = p.set_tables(tables(&service_spec(&[])));
    assert!(r.not_applied.is_empty());
    assert_eq!(
        settings(&p),
        settings(&Pipeline::new(tables(&service_spec(&[]))))
    );
}

#[test]
fn test_tcp_pickup_turned_off_by_a_swap_refuses_mid_stream_connections() {
    let mut p = Pipeline::new(tables(&service_spec(&[])));
    let ack = || tcp(CLIENT, 2000, "10.244.1.5", 80, 1, 1, tcp_flags::ACK);
    assert_eq!(run(&mut p, ack(), 0, 0).1, Some("new"));
    p.conntrack_mut().delete(&Filter::default());
    let mut spec = service_spec(&[]);
    spec.ct.tcp_pickup = Some(false);
    p.set_tables(tables(&spec));
    let (v, ct, _) = run(&mut p, ack(), 0, 1);
    assert_eq!(ct, Some("invalid"));
    assert!(matches!(v, Verdict::Dropped(_)), "{v:?}");
}
