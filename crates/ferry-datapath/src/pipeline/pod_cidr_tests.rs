use super::test_support::*;
use super::*;
use crate::nat::{MatchSpec, NatRuleSpec};

/// Node 1 of the tests, its pod CIDRs given: 10.244.1.0/24 and fd00:10:244:1::/64.
fn spec() -> TablesSpec {
    let mut s = node1_spec();
    s.node.pod_cidrs = vec![
        "10.244.1.0/24".parse().unwrap(),
        "fd00:10:244:1::/64".parse().unwrap(),
    ];
    s
}

fn pipeline(s: &TablesSpec) -> Pipeline {
    compiled(s)
}

/// A frame from the gateway to node 1's uplink.
/// A UDP datagram arriving on node 1's uplink from the gateway.
fn udp_from_gw(src: &str, dst: &str, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let o = IpOpts {
        src_mac: GW_MAC,
        dst_mac: uplink_mac(1),
        ..IpOpts::default()
    };
    build::udp(ip(src), ip(dst), sport, dport, payload, &o)
}

/// The ICMP error in `out` (the only frame, sent on `port`): its parse and the IP
/// header and first 4 transport bytes it quotes, as (destination, destination port).
fn icmp_error(out: &[(PortId, Packet)], port: PortId) -> (Parsed, IpAddr, u16) {
    assert_eq!(out.len(), 1, "one frame");
    assert_eq!(out[0].0, port, "sent on port {port}");
    let f = &out[0].1.data;
    let pe = parse(f, 0).unwrap();
    let (dst, port) = quoted(f, &pe);
    (pe, dst, port)
}

#[test]
fn test_an_address_of_the_pod_cidr_that_no_pod_has_is_dropped_and_answered() {
    let mut a = pipeline(&spec());
    let f = udp_from_gw("192.168.60.7", "10.244.1.77", 4000, 53, b"q");
    let mut t = Trace::enabled();
    let mut out = Vec::new();
    let v = a.process(Packet::new(f.clone(), UPLINK, 0), &mut out, &mut t);
    assert_eq!(v, Verdict::Dropped(DropReason::NoSuchPod), "{:?}", t.events);
    // Host unreachable back out of the uplink, to the gateway it came from: not
    // forwarded along the default route, which leads to the same gateway.
    let (pe, dst, port) = icmp_error(&out, UPLINK);
    assert_eq!(pe.key.dst_port, 3 << 8 | 1, "host unreachable");
    assert_eq!(
        (pe.key.src.ip(), pe.key.dst.ip()),
        (ip("192.168.50.10"), ip("192.168.60.7"))
    );
    assert_eq!(&out[0].1.data[0..6], &GW_MAC);
    assert_eq!((dst, port), (ip("10.244.1.77"), 53));
    assert_eq!(a.drops().get(DropReason::NoSuchPod), 1);
    assert_eq!(a.stats().icmp_sent, 1);
    assert!(has_event(&t, "route", "pod CIDRs"), "{:?}", t.events);
    // Nothing is kept of it.
    assert!(a.conntrack().lookup(&parse(&f, 0).unwrap().key).is_none());
    assert_eq!(a.conntrack().len(), 0);

    // A pod's address in the range still reaches the pod.
    let f = udp_from_gw("192.168.60.7", "10.244.1.5", 4000, 53, b"q");
    let (v, out) = run(&mut a, f, UPLINK, 0);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out[0].0, POD);

    // From a pod too: the error goes back to the pod, from the node's address.
    let f = tcp("10.244.1.5", "10.244.1.200", 33000, 80)
        .flags(tcp_flags::SYN)
        .opts(&from_pod(1, 5))
        .frame(b"");
    let (v, out) = run(&mut a, f, POD, 0);
    assert_eq!(v, Verdict::Dropped(DropReason::NoSuchPod));
    let (pe, dst, port) = icmp_error(&out, POD);
    assert_eq!(
        (pe.key.src.ip(), pe.key.dst.ip()),
        (ip("192.168.50.10"), ip("10.244.1.5"))
    );
    assert_eq!((dst, port), (ip("10.244.1.200"), 80));
}

#[test]
fn test_ipv6_gets_address_unreachable() {
    let mut a = pipeline(&spec());
    let f = udp_from_gw("fd00:60::7", "fd00:10:244:1::77", 4000, 53, b"q");
    let (v, out) = run(&mut a, f, UPLINK, 0);
    assert_eq!(v, Verdict::Dropped(DropReason::NoSuchPod));
    let (pe, dst, port) = icmp_error(&out, UPLINK);
    assert_eq!(pe.key.proto, proto::ICMPV6);
    assert_eq!(pe.key.dst_port, 1 << 8 | 3, "address unreachable");
    assert_eq!(
        (pe.key.src.ip(), pe.key.dst.ip()),
        (ip("fd00:50::10"), ip("fd00:60::7"))
    );
    assert_eq!((dst, port), (ip("fd00:10:244:1::77"), 53));
    // The pod's IPv6 address still reaches it.
    let f = udp_from_gw("fd00:60::7", "fd00:10:244:1::6", 4000, 53, b"q");
    let (v, out) = run(&mut a, f, UPLINK, 0);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out[0].0, POD2);
}

#[test]
fn test_a_more_specific_route_wins_a_shorter_one_does_not() {
    let mut s = spec();
    let route = |prefix: &str| RouteSpec {
        prefix: prefix.parse().unwrap(),
        port: "eth0".into(),
        next_hop_mac: Some(MacAddr(GW_MAC)),
        via: None,
    };
    s.routes.push(route("10.244.1.128/25"));
    s.routes.push(route("10.244.0.0/16"));
    let mut a = pipeline(&s);
    let to = |dst: &str| udp_from_pod(dst, 40000, b"x");
    let (v, out) = run(&mut a, to("10.244.1.200"), POD, 0);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out[0].0, UPLINK);
    assert_eq!(&out[0].1.data[0..6], &GW_MAC);
    let (v, _) = run(&mut a, to("10.244.1.77"), POD, 0);
    assert_eq!(v, Verdict::Dropped(DropReason::NoSuchPod));
    let (v, out) = run(&mut a, to("10.244.7.7"), POD, 0);
    assert_eq!((v, out[0].0), (Verdict::Forwarded, UPLINK));

    // A route given for the pod CIDR itself wins too.
    let mut s = spec();
    s.routes.push(route("10.244.1.0/24"));
    let t = s.compile().unwrap();
    let r = t.fib.lookup(ip("10.244.1.77")).unwrap();
    assert_eq!(r.route().map(|r| r.port), Some(UPLINK));
    assert_eq!(
        t.fib.lookup(ip("fd00:10:244:1::77")).copied(),
        Some(crate::tables::Target::NoSuchPod)
    );
}

#[test]
fn test_no_error_about_an_error_to_a_pod_that_went() {
    let mut s = spec();
    let mut a = pipeline(&s);
    learn(&mut a, 1, "192.168.50.1", GW_MAC);
    // Pod b (10.244.1.6) talks to the outside.
    let f = build::udp(
        ip("10.244.1.6"),
        ip("192.168.60.7"),
        4000,
        53,
        b"q",
        &from_pod(1, 6),
    );
    let (v, out) = run(&mut a, f, POD2, 0);
    assert_eq!((v, out[0].0), (Verdict::Forwarded, UPLINK));
    let sent = out[0].1.data.clone();
    // It is deleted.
    s.ports.pop();
    a.set_tables(Arc::new(s.compile().unwrap()));
    // The answer to it: host unreachable back to the server.
    let f = udp_from_gw("192.168.60.7", "10.244.1.6", 53, 4000, b"a");
    let (v, out) = run(&mut a, f, UPLINK, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::NoSuchPod));
    let (pe, dst, port) = icmp_error(&out, UPLINK);
    assert_eq!(pe.key.dst.ip(), ip("192.168.60.7"));
    assert_eq!((dst, port), (ip("10.244.1.6"), 4000));
    // An ICMP error about what it sent: related, dropped the same way, and no error
    // about an error.
    let ps = parse(&sent, 0).unwrap();
    let kind = ErrorKind::Unreachable { code: 3 };
    let err = crate::icmp::build_error(&sent, &ps, kind, ip("192.168.60.7"), GW_MAC).unwrap();
    let (sent_before, suppressed) = (a.stats().icmp_sent, a.stats().icmp_suppressed);
    let (v, out) = run(&mut a, err, UPLINK, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::NoSuchPod));
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(a.stats().icmp_sent, sent_before);
    assert_eq!(a.stats().icmp_suppressed, suppressed + 1);
}

#[test]
fn test_a_connection_translated_to_an_endpoint_that_went_gets_the_error_translated_back() {
    let mut s = spec();
    s.nat = vec![NatRuleSpec {
        matches: MatchSpec {
            proto: Some("udp".into()),
            dst: Some("10.96.0.10/32".parse().unwrap()),
            dst_port: Some(53),
            ..MatchSpec::default()
        },
        dnat: Some("10.244.1.6:5353".into()),
        snat: None,
        masquerade: false,
    }];
    let mut a = pipeline(&s);
    let query = |sport: u16| udp_from_gw("192.168.60.7", "10.96.0.10", sport, 53, b"q");
    let (v, out) = run(&mut a, query(4000), UPLINK, 0);
    assert_eq!((v, out[0].0), (Verdict::Forwarded, POD2));
    // The endpoint's pod is deleted; the rule still sends there.
    s.ports.pop();
    a.set_tables(Arc::new(s.compile().unwrap()));
    for sport in [4000, 4001] {
        // The connection it had, and a new one.
        let (v, out) = run(&mut a, query(sport), UPLINK, SEC);
        assert_eq!(v, Verdict::Dropped(DropReason::NoSuchPod), "port {sport}");
        let (pe, dst, port) = icmp_error(&out, UPLINK);
        assert_eq!(pe.key.dst_port, 3 << 8 | 1);
        assert_eq!(pe.key.dst.ip(), ip("192.168.60.7"));
        assert_eq!(
            (dst, port),
            (ip("10.96.0.10"), 53),
            "the client's own packet is quoted"
        );
    }
    assert_eq!(a.stats().icmp_sent, 2);
}

#[test]
fn test_through_the_overlay_the_error_goes_back_through_the_node() {
    let mut a = pipeline(&spec());
    learn(&mut a, 1, "192.168.50.20", uplink_mac(2));
    let inner = udp("10.244.2.5", "10.244.1.77", 1, 2, b"x");
    let o = tunnel(2, 1, 1);
    let (v, out) = run(&mut a, overlay::encapsulate(&inner, &o), UPLINK, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::NoSuchPod));
    assert_eq!(out.len(), 1);
    let f = &out[0].1.data;
    let po = parse(f, 0).unwrap();
    assert_eq!(
        (po.key.dst.ip(), po.key.dst_port),
        (ip("192.168.50.20"), 4789)
    );
    let pi = parse(&f[po.l4_off + 16..], 0).unwrap();
    assert_eq!(pi.key.dst.ip(), ip("10.244.2.5"));
    assert_eq!(pi.key.dst_port, 3 << 8 | 1);
}

#[test]
fn test_a_pod_cidr_overlapping_another_nodes_is_an_error() {
    let mut s = spec();
    s.node.pod_cidrs.push("10.244.2.128/25".parse().unwrap());
    let e = s.compile().unwrap_err();
    assert!(
        e.contains("nodes[0] (\"node2\")")
            && e.contains("pod_cidr 10.244.2.0/24 overlaps this node's pod_cidr 10.244.2.128/25"),
        "{e}"
    );
    let mut s = spec();
    s.node.pod_cidrs = vec!["10.244.0.0/16".parse().unwrap()];
    assert!(s.compile().unwrap_err().contains("overlaps"));
    // Without them, as before: the default route.
    let mut s = spec();
    s.node.pod_cidrs.clear();
    let t = s.compile().unwrap();
    let r = t.fib.lookup(ip("10.244.1.77")).unwrap();
    assert_eq!(r.route().map(|r| r.port), Some(UPLINK));
}
