//! The service stage: frontends, endpoint choice, policies, affinity, reject, hairpin,
//! and the cross-node NodePort path whose replies return through the ingress node.

use super::test_support::*;
use super::*;
use crate::flow::Addr;
use crate::lb::{BackendSpec, Policy, ServiceSpec};

const CLIENT: &str = "192.168.60.7";
const NODE1: &str = "192.168.50.10";
const GW: &str = "192.168.50.1";

/// A TCP segment from pod 10.244.1.5, sequence 1000.
fn tcp_from_pod(dst: &str, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    tcp("10.244.1.5", dst, sport, dport)
        .seq(1000, 0)
        .flags(flags)
        .opts(&from_pod(1, 5))
        .frame(&[])
}

/// The SYN of pod 10.244.1.5.
fn pod_syn(dst: &str, sport: u16, dport: u16) -> Vec<u8> {
    tcp_from_pod(dst, sport, dport, tcp_flags::SYN)
}

/// A TCP segment from the client outside, arriving on node 1's uplink.
fn from_client(dst: &str, sport: u16, dport: u16) -> Tcp<'_> {
    let o = IpOpts {
        src_mac: GW_MAC,
        dst_mac: uplink_mac(1),
        ..IpOpts::default()
    };
    tcp(CLIENT, dst, sport, dport).opts(&o)
}

/// The client's SYN, with sequence number `seq`.
fn client_syn(dst: &str, sport: u16, dport: u16, seq: u32) -> Vec<u8> {
    from_client(dst, sport, dport)
        .seq(seq, 0)
        .flags(tcp_flags::SYN)
        .frame(&[])
}

/// Checks that the first frame of `out` goes from node 1 through the tunnel to node 2,
/// with the client's address kept, to `dst`:`port`.
fn client_tunnelled_to_node2(out: &[(PortId, Packet)], dst: &str, port: u16) {
    let outer = key_of(&out[0].1.data);
    assert_eq!(
        (outer.src, outer.dst),
        (ip(NODE1).into(), ip("192.168.50.20").into()),
        "through the tunnel"
    );
    let k = key_of(vxlan_inner(&out[0].1.data));
    assert_eq!(
        (k.src, k.dst, k.dst_port),
        (ip(CLIENT).into(), ip(dst).into(), port),
        "client address kept"
    );
}

/// Node 1 of the two-node tables, encapsulating always, with `services`.
fn node1(services: Vec<ServiceSpec>) -> Pipeline {
    node(1, ModeSpec::Always, services)
}

/// What the trace's event of `stage` says (the first, when there are more).
fn event(tr: &Trace, stage: &str) -> String {
    tr.events
        .iter()
        .find(|e| e.stage().name() == stage)
        .unwrap_or_else(|| panic!("a {stage} event"))
        .to_string()
}

/// Pod `last` of node `n` answering a SYN: from its port `sport` to `to`:`dport`,
/// acknowledging `ack`.
fn synack(n: u8, last: u8, to: &str, sport: u16, dport: u16, ack: u32) -> Vec<u8> {
    build::tcp(
        ip(&format!("10.244.{n}.{last}")),
        ip(to),
        sport,
        dport,
        7000,
        ack,
        tcp_flags::SYN | tcp_flags::ACK,
        &[],
        &from_pod(n, last),
    )
}

/// Where the first packet out goes: the inner destination when it went through the
/// tunnel.
fn delivered_to(out: &[(PortId, Packet)]) -> IpAddr {
    let f = &out[0].1.data;
    if out[0].0 == UPLINK {
        key_of(vxlan_inner(f)).dst.ip()
    } else {
        key_of(f).dst.ip()
    }
}

#[test]
fn test_cluster_ip_is_translated_to_an_endpoint_and_replies_back() {
    let mut a = node1(vec![web(vec![be("10.244.1.6", 8080, 1)])]);
    let (v, out, tr) = traced(&mut a, pod_syn("10.96.0.10", 40000, 80), POD, SEC);
    assert_eq!(v, Verdict::Forwarded, "{:?}", tr.events);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, POD2);
    let k = key_of(&out[0].1.data);
    assert_eq!(
        (k.src, k.src_port, k.dst, k.dst_port),
        (
            ip("10.244.1.5").into(),
            40000,
            ip("10.244.1.6").into(),
            8080
        )
    );
    let note = event(&tr, "service");
    assert!(
        note.contains("default/web:http") && note.contains("10.244.1.6:8080"),
        "{}",
        note
    );
    let original = FlowKey {
        dst: Addr::from(ip("10.96.0.10")),
        dst_port: 80,
        ..k
    };
    let (id, _) = a.conntrack().lookup(&original).unwrap();
    assert_ne!(a.conntrack().get(id).unwrap().mark & lb::MARK_SERVICE, 0);
    assert_eq!(a.stats().service_balanced, 1);

    let reply = synack(1, 6, "10.244.1.5", 8080, 40000, 1001);
    let (v, out) = run(&mut a, reply, POD2, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out[0].0, POD);
    let k = key_of(&out[0].1.data);
    assert_eq!(
        (k.src, k.src_port, k.dst, k.dst_port),
        (ip("10.96.0.10").into(), 80, ip("10.244.1.5").into(), 40000)
    );
    assert_eq!(
        a.stats().service_balanced,
        1,
        "replies are not balanced again"
    );
}

#[test]
fn test_connections_spread_over_endpoints_and_each_stays_on_its_own() {
    let backends = vec![
        be("10.244.1.6", 8080, 1),
        be("10.244.2.5", 8080, 2),
        be("10.244.2.6", 8080, 2),
    ];
    let mut a = node1(vec![dns(backends)]);
    let mut seen: HashMap<IpAddr, u32> = HashMap::new();
    for sport in 30000..30300u16 {
        let (_, out) = run(&mut a, udp_to_service(sport), POD, SEC);
        assert_eq!(out.len(), 1);
        let dst = delivered_to(&out);
        *seen.entry(dst).or_default() += 1;
        // The next packet of the same flow goes to the same endpoint.
        let (_, again) = run(&mut a, udp_to_service(sport), POD, SEC);
        let dst2 = delivered_to(&again);
        assert_eq!(dst, dst2);
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen.values().all(|&n| n >= 50), "uneven: {seen:?}");
}

fn udp_to_service(sport: u16) -> Vec<u8> {
    build::udp(
        ip("10.244.1.5"),
        ip("10.96.0.11"),
        sport,
        53,
        b"q",
        &from_pod(1, 5),
    )
}

fn dns(backends: Vec<BackendSpec>) -> ServiceSpec {
    ServiceSpec {
        name: "kube-system/dns:dns".into(),
        proto: "udp".into(),
        port: 53,
        cluster_ips: vec![ip("10.96.0.11"), ip("fd00:96::11")],
        backends,
        ..ServiceSpec::default()
    }
}

#[test]
fn test_service_without_endpoints_refuses_tcp_with_a_reset_at_once() {
    let mut a = node1(vec![web(vec![])]);
    let (v, out, tr) = traced(&mut a, pod_syn("10.96.0.10", 40000, 80), POD, SEC);
    assert_eq!(
        v,
        Verdict::Dropped(DropReason::ServiceNoEndpoints),
        "{:?}",
        tr.events
    );
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, POD);
    let f = &out[0].1.data;
    assert_eq!(&f[0..6], &pod_mac(1, 5));
    let p = parse(f, 0).unwrap();
    assert_eq!(
        (p.key.src, p.key.src_port, p.key.dst, p.key.dst_port),
        (ip("10.96.0.10").into(), 80, ip("10.244.1.5").into(), 40000)
    );
    let t = &f[p.l4_off..p.ip_end];
    assert_eq!(t[13], tcp_flags::RST | tcp_flags::ACK);
    assert_eq!(
        u32::from_be_bytes([t[8], t[9], t[10], t[11]]),
        1001,
        "acknowledges the SYN"
    );
    // A correct checksum sums to zero with the pseudo-header.
    let IpAddr::V4(s) = p.key.src.ip() else {
        panic!()
    };
    let IpAddr::V4(d) = p.key.dst.ip() else {
        panic!()
    };
    assert_eq!(l4_sum_v4(t, s.octets(), d.octets(), proto::TCP), 0xffff);
    assert_eq!(a.stats().service_rejected, 1);
    assert!(
        a.conntrack().is_empty(),
        "nothing is tracked for a refused connection"
    );
}

#[test]
fn test_service_without_endpoints_refuses_udp_with_port_unreachable_in_both_families() {
    let mut a = node1(vec![dns(vec![])]);
    let (v, out) = run(&mut a, udp_to_service(30000), POD, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceNoEndpoints));
    let p = parse(&out[0].1.data, 0).unwrap();
    assert_eq!(p.key.proto, proto::ICMP);
    assert_eq!(p.key.dst_port, 3 << 8 | 3, "type 3 code 3");
    assert_eq!(p.key.dst, ip("10.244.1.5"));

    let q = build::udp(
        ip("fd00:10:244:1::5"),
        ip("fd00:96::11"),
        30000,
        53,
        b"q",
        &from_pod(1, 5),
    );
    let (v, out) = run(&mut a, q, POD, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceNoEndpoints));
    let p = parse(&out[0].1.data, 0).unwrap();
    assert_eq!(p.key.proto, proto::ICMPV6);
    assert_eq!(p.key.dst_port, 1 << 8 | 4, "type 1 code 4");
}

/// A pod of node 2 that asks node 1's node port reaches it through the underlay's
/// routers (its packet is not tunnelled: node 1's address is no pod's), which know no
/// pod address: node 1's refusal goes back to node 2 through the tunnel, not to them.
#[test]
fn test_a_refusal_for_another_nodes_pod_goes_back_through_the_tunnel() {
    let udp_np = ServiceSpec {
        name: "default/echo:udp".into(),
        proto: "udp".into(),
        port: 81,
        cluster_ips: vec![ip("10.96.0.12")],
        node_port: Some(30081),
        ..ServiceSpec::default()
    };
    let mut a = node1(vec![web(vec![]), udp_np]);
    let routed = IpOpts {
        src_mac: GW_MAC,
        dst_mac: uplink_mac(1),
        ..IpOpts::default()
    };
    let syn = tcp("10.244.2.6", NODE1, 40000, 30080)
        .seq(1000, 0)
        .flags(tcp_flags::SYN)
        .opts(&routed)
        .frame(&[]);
    let (v, out, tr) = traced(&mut a, syn, UPLINK, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceNoEndpoints));
    assert_eq!(out.len(), 1, "{:?}", tr.events);
    let outer = key_of(&out[0].1.data);
    assert_eq!(
        (out[0].0, outer.dst, outer.dst_port),
        (UPLINK, ip("192.168.50.20").into(), 4789),
        "to node 2, through the tunnel"
    );
    let inner = vxlan_inner(&out[0].1.data);
    let p = parse(inner, 0).unwrap();
    assert_eq!(
        (p.key.src, p.key.src_port, p.key.dst, p.key.dst_port),
        (ip(NODE1).into(), 30080, ip("10.244.2.6").into(), 40000)
    );
    assert_eq!(inner[p.l4_off + 13], tcp_flags::RST | tcp_flags::ACK);
    assert_eq!(a.stats().service_rejected, 1);

    let q = build::udp(ip("10.244.2.6"), ip(NODE1), 40001, 30081, b"q", &routed);
    let (v, out, tr) = traced(&mut a, q, UPLINK, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceNoEndpoints));
    assert_eq!(out.len(), 1, "{:?}", tr.events);
    assert_eq!(key_of(&out[0].1.data).dst, ip("192.168.50.20"));
    let p = parse(vxlan_inner(&out[0].1.data), 0).unwrap();
    assert_eq!(
        (p.key.proto, p.key.dst_port, p.key.dst),
        (proto::ICMP, 3 << 8 | 3, ip("10.244.2.6").into())
    );

    // A client the overlay does not reach is answered back where it came from.
    let (v, out) = run(&mut a, client_syn(NODE1, 40002, 30080, 7), UPLINK, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceNoEndpoints));
    assert_eq!(&out[0].1.data[0..6], &GW_MAC);
    assert_eq!(key_of(&out[0].1.data).dst, ip(CLIENT));
}

#[test]
fn test_a_frontend_goes_only_to_endpoints_of_its_family() {
    let backends = vec![be("10.244.1.6", 53, 1), be("fd00:10:244:1::6", 53, 1)];
    let mut a = node1(vec![dns(backends)]);
    for sport in 30000..30040u16 {
        let q = build::udp(
            ip("fd00:10:244:1::5"),
            ip("fd00:96::11"),
            sport,
            53,
            b"q",
            &from_pod(1, 5),
        );
        let (_, out) = run(&mut a, q, POD, SEC);
        assert_eq!(key_of(&out[0].1.data).dst, ip("fd00:10:244:1::6"));
        let (_, out) = run(&mut a, udp_to_service(sport), POD, SEC);
        assert_eq!(key_of(&out[0].1.data).dst, ip("10.244.1.6"));
    }
    // A trace names the IPv6 frontend and endpoint with their ports apart.
    let q = build::udp(
        ip("fd00:10:244:1::5"),
        ip("fd00:96::11"),
        31000,
        53,
        b"q",
        &from_pod(1, 5),
    );
    let mut t = Trace::enabled();
    a.process(Packet::new(q, POD, SEC), &mut Vec::new(), &mut t);
    let note = event(&t, "service");
    assert!(
        note.contains("frontend [fd00:96::11]:53)")
            && note.contains("endpoint [fd00:10:244:1::6]:53"),
        "{}",
        note
    );
}

#[test]
fn test_terminating_endpoints_serve_only_when_no_endpoint_is_ready() {
    let term = |addr: &str, serving: bool| BackendSpec {
        ready: false,
        serving: Some(serving),
        terminating: true,
        ..be(addr, 53, 2)
    };
    let mut a = node1(vec![dns(vec![
        be("10.244.2.5", 53, 2),
        term("10.244.2.6", true),
    ])]);
    for sport in 30000..30040u16 {
        let (_, out) = run(&mut a, udp_to_service(sport), POD, SEC);
        assert_eq!(key_of(vxlan_inner(&out[0].1.data)).dst, ip("10.244.2.5"));
    }
    let mut a = node1(vec![dns(vec![
        term("10.244.2.6", true),
        term("10.244.2.5", false),
    ])]);
    for sport in 30000..30040u16 {
        let (_, out) = run(&mut a, udp_to_service(sport), POD, SEC);
        assert_eq!(
            key_of(vxlan_inner(&out[0].1.data)).dst,
            ip("10.244.2.6"),
            "serving, not the other"
        );
    }
    let mut a = node1(vec![dns(vec![term("10.244.2.5", false)])]);
    let (v, _) = run(&mut a, udp_to_service(30000), POD, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceNoEndpoints));
}

#[test]
fn test_internal_policy_local_uses_this_nodes_endpoints_or_drops_silently() {
    let svc = |b| ServiceSpec {
        internal_policy: Policy::Local,
        ..dns(b)
    };
    let mut a = node1(vec![svc(vec![
        be("10.244.1.6", 53, 1),
        be("10.244.2.5", 53, 2),
    ])]);
    for sport in 30000..30040u16 {
        let (_, out) = run(&mut a, udp_to_service(sport), POD, SEC);
        assert_eq!(key_of(&out[0].1.data).dst, ip("10.244.1.6"));
    }
    let mut a = node1(vec![svc(vec![be("10.244.2.5", 53, 2)])]);
    let (v, out) = run(&mut a, udp_to_service(30000), POD, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceNoLocalEndpoints));
    assert!(
        out.is_empty(),
        "no ICMP: kube-proxy drops, it does not reject"
    );
}

#[test]
fn test_node_port_to_a_local_endpoint_keeps_the_client_address() {
    let mut a = node1(vec![web(vec![be("10.244.1.6", 8080, 1)])]);
    let (v, out) = run(&mut a, client_syn(NODE1, 50000, 30080, 1), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out[0].0, POD2);
    let k = key_of(&out[0].1.data);
    assert_eq!(
        (k.src, k.dst, k.dst_port),
        (ip(CLIENT).into(), ip("10.244.1.6").into(), 8080)
    );
    let reply = synack(1, 6, CLIENT, 8080, 50000, 2);
    let (_, out) = run(&mut a, reply, POD2, SEC);
    assert_eq!(out[0].0, UPLINK);
    assert_eq!(&out[0].1.data[0..6], &GW_MAC);
    let k = key_of(&out[0].1.data);
    assert_eq!(
        (k.src, k.src_port, k.dst),
        (ip(NODE1).into(), 30080, ip(CLIENT).into())
    );
}

#[test]
fn test_load_balancer_and_external_ips_are_frontends_too() {
    let mut a = node1(vec![web(vec![be("10.244.1.6", 8080, 1)])]);
    for (i, dst) in ["192.168.70.9", "192.168.70.10"].into_iter().enumerate() {
        let (v, out) = run(
            &mut a,
            client_syn(dst, 50000 + i as u16, 80, 1),
            UPLINK,
            SEC,
        );
        assert_eq!(v, Verdict::Forwarded, "{dst}");
        assert_eq!(key_of(&out[0].1.data).dst, ip("10.244.1.6"));
    }
    // The node port is only on the node's addresses; the external IP only with port 80:
    // this one is routed on untranslated.
    let (_, out) = run(
        &mut a,
        client_syn("192.168.70.9", 50003, 30080, 1),
        UPLINK,
        SEC,
    );
    assert_eq!(key_of(&out[0].1.data).dst, ip("192.168.70.9"));
}

#[test]
fn test_external_policy_local_drops_without_a_local_endpoint_but_not_for_local_pods() {
    let svc = ServiceSpec {
        external_policy: Policy::Local,
        ..web(vec![be("10.244.2.5", 8080, 2)])
    };
    let mut a = node1(vec![svc]);
    let (v, out) = run(&mut a, client_syn(NODE1, 50000, 30080, 1), UPLINK, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceNoLocalEndpoints));
    assert!(out.is_empty());
    // A pod of this node reaching the node port uses every node's endpoints.
    let (v, out) = run(&mut a, pod_syn(NODE1, 40000, 30080), POD, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(key_of(vxlan_inner(&out[0].1.data)).dst, ip("10.244.2.5"));
}

/// Node 1 with a host port (port 3) for its own stack, which has the node's address.
fn node_with_host_port(services: Vec<ServiceSpec>) -> Pipeline {
    let mut spec = node1_spec();
    spec.ports.push(PortSpec {
        name: "host".into(),
        kind: PortKind::Host,
        mac: MacAddr(HOST_PORT_MAC),
        addresses: vec![ip("169.254.1.1").into()],
        ..PortSpec::default()
    });
    spec.services = services;
    let mut p = compiled(&spec);
    learn(&mut p, 1, GW, GW_MAC);
    learn(&mut p, 1, "192.168.50.20", uplink_mac(2));
    p
}

const HOST: PortId = 3;
const HOST_PORT_MAC: [u8; 6] = [2, 0xfe, 0, 0, 0, 0xfe];

/// A TCP SYN from node 1's own stack, through the host port.
fn tcp_from_host(dst: &str, sport: u16, dport: u16) -> Vec<u8> {
    let o = IpOpts {
        src_mac: [2, 0xaa, 0, 0, 0, 0x01],
        dst_mac: HOST_PORT_MAC,
        ..IpOpts::default()
    };
    build::tcp(
        ip(NODE1),
        ip(dst),
        sport,
        dport,
        1,
        0,
        tcp_flags::SYN,
        &[],
        &o,
    )
}

/// kube-proxy sends traffic from the node itself (`--src-type LOCAL`) to an external
/// frontend to every node's endpoints; so does ferry for what enters through the host
/// port. Cluster IP traffic from the host still follows internalTrafficPolicy.
#[test]
fn test_external_policy_local_does_not_apply_to_the_nodes_own_stack() {
    let svc = ServiceSpec {
        external_policy: Policy::Local,
        internal_policy: Policy::Local,
        ..web(vec![be("10.244.2.5", 8080, 2)])
    };
    let mut a = node_with_host_port(vec![svc]);
    for (i, dst) in ["192.168.70.9", "192.168.70.10"].into_iter().enumerate() {
        let (v, out, tr) = traced(&mut a, tcp_from_host(dst, 40000 + i as u16, 80), HOST, SEC);
        assert_eq!(v, Verdict::Forwarded, "{dst}: {:?}", tr.events);
        assert_eq!(out[0].0, UPLINK);
        let k = key_of(vxlan_inner(&out[0].1.data));
        assert_eq!(
            (k.src, k.dst, k.dst_port),
            (ip(NODE1).into(), ip("10.244.2.5").into(), 8080),
            "{dst}: the node's address is kept; replies come back to it by routing"
        );
    }
    let (v, out) = run(&mut a, tcp_from_host("10.96.0.10", 40010, 80), HOST, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceNoLocalEndpoints));
    assert!(out.is_empty());
    // From outside, the Local policy still applies.
    let (v, _) = run(
        &mut a,
        client_syn("192.168.70.10", 50000, 80, 1),
        UPLINK,
        SEC,
    );
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceNoLocalEndpoints));
}

/// The agent rewrites the node's own connections to its node ports to the cluster IP
/// with the node port; from the host port, that is the node port frontend, balanced over
/// every node's endpoints whatever the traffic policies say (kube-proxy's cluster chain
/// for local sources). From a pod it is no frontend.
#[test]
fn test_the_node_port_at_the_cluster_ip_from_the_host_is_the_node_port() {
    let svc = ServiceSpec {
        external_policy: Policy::Local,
        internal_policy: Policy::Local,
        ..web(vec![be("10.244.2.5", 8080, 2)])
    };
    let mut a = node_with_host_port(vec![svc]);
    for (i, dst) in ["10.96.0.10", "fd00:96::10"].into_iter().enumerate() {
        if dst.contains(':') {
            // No IPv6 endpoint: the IPv6 node port has none to offer.
            let o = IpOpts {
                src_mac: [2, 0xaa, 0, 0, 0, 0x01],
                dst_mac: HOST_PORT_MAC,
                ..IpOpts::default()
            };
            let f = build::tcp(
                ip("fd00:50::10"),
                ip(dst),
                40020,
                30080,
                1,
                0,
                tcp_flags::SYN,
                &[],
                &o,
            );
            let (v, _) = run(&mut a, f, HOST, SEC);
            assert_eq!(v, Verdict::Dropped(DropReason::ServiceNoEndpoints));
            continue;
        }
        let (v, out, tr) = traced(
            &mut a,
            tcp_from_host(dst, 40000 + i as u16, 30080),
            HOST,
            SEC,
        );
        assert_eq!(v, Verdict::Forwarded, "{:?}", tr.events);
        let k = key_of(vxlan_inner(&out[0].1.data));
        assert_eq!(
            (k.src, k.dst, k.dst_port),
            (ip(NODE1).into(), ip("10.244.2.5").into(), 8080)
        );
    }
    let (v, out) = run(&mut a, pod_syn("10.96.0.10", 40030, 30080), POD, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(
        key_of(&out[0].1.data).dst,
        ip("10.96.0.10"),
        "not translated"
    );
}

/// A client outside the cluster reaching a cluster IP (the Service CIDR routed to the
/// nodes): with the endpoint on node 2, which cross-subnet mode reaches without the
/// tunnel, the endpoint would answer the client directly. As for a node port, the
/// connection goes through the tunnel with the client address kept, or from node 1's
/// address in SNAT mode. Sources in the cluster and local endpoints are left alone.
#[test]
fn test_cluster_ip_traffic_from_outside_the_cluster_returns_through_the_ingress_node() {
    let svc = |snat: bool| ServiceSpec {
        external_snat: snat,
        ..web(vec![be("10.244.2.5", 8080, 2)])
    };
    let mut a = node(1, ModeSpec::CrossSubnet, vec![svc(false)]);
    let (v, out, tr) = traced(&mut a, client_syn("10.96.0.10", 50000, 80, 1), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded, "{:?}", tr.events);
    let k = key_of(vxlan_inner(&out[0].1.data));
    assert_eq!(
        (k.src, k.dst, k.dst_port),
        (ip(CLIENT).into(), ip("10.244.2.5").into(), 8080),
        "client address kept, through the tunnel"
    );

    let mut s = node(1, ModeSpec::CrossSubnet, vec![svc(true)]);
    let (v, out) = run(&mut s, client_syn("10.96.0.10", 50000, 80, 1), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded);
    let k = key_of(&out[0].1.data);
    assert_eq!(
        (k.src, k.dst),
        (ip(NODE1).into(), ip("10.244.2.5").into()),
        "SNAT mode: from node 1, routed directly"
    );

    // Node 2's address is in the cluster: routed directly, untranslated.
    let o = IpOpts {
        src_mac: uplink_mac(2),
        dst_mac: uplink_mac(1),
        ..IpOpts::default()
    };
    let f = tcp("192.168.50.20", "10.96.0.10", 50001, 80)
        .flags(tcp_flags::SYN)
        .opts(&o)
        .frame(&[]);
    let (v, out) = run(&mut a, f, UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded);
    let k = key_of(&out[0].1.data);
    assert_eq!(
        (k.src, k.dst),
        (ip("192.168.50.20").into(), ip("10.244.2.5").into())
    );

    // A local endpoint answers through this node anyway: nothing to add.
    let mut l = node(
        1,
        ModeSpec::CrossSubnet,
        vec![web(vec![be("10.244.1.6", 8080, 1)])],
    );
    let (v, out) = run(&mut l, client_syn("10.96.0.10", 50002, 80, 1), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out[0].0, POD2);
    assert_eq!(key_of(&out[0].1.data).src, ip(CLIENT));
}

/// The case of `calico-ebpf-nlb-nodeport.txt`: a client-IP-preserving load balancer
/// sends NodePort traffic to node 1, whose endpoint is on node 2, which is on the same
/// subnet (cross-subnet mode would route to it directly). The request goes through the
/// tunnel with the client address kept; node 2 remembers node 1 as the tunnel peer and
/// sends the reply back to it; node 1 undoes its NAT and answers the client.
#[test]
fn test_node_port_to_another_nodes_endpoint_returns_through_the_ingress_node() {
    let svc = || web(vec![be("10.244.2.5", 8080, 2)]);
    let mut a = node(1, ModeSpec::CrossSubnet, vec![svc()]);
    let mut b = node(2, ModeSpec::CrossSubnet, vec![svc()]);

    let (v, out, tr) = traced(&mut a, client_syn(NODE1, 50000, 30080, 100), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded, "{:?}", tr.events);
    assert_eq!(out[0].0, UPLINK);
    client_tunnelled_to_node2(&out, "10.244.2.5", 8080);
    let note = event(&tr, "service");
    assert!(
        note.contains("node2") && note.contains("tunnel"),
        "{}",
        note
    );

    let (v, got) = run(&mut b, out[0].1.data.clone(), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(got[0].0, POD);
    assert_eq!(key_of(&got[0].1.data).src, ip(CLIENT));

    let synack = synack(2, 5, CLIENT, 8080, 50000, 101);
    let (v, back) = run(&mut b, synack, POD, SEC);
    assert_eq!(v, Verdict::Forwarded);
    let outer = key_of(&back[0].1.data);
    assert_eq!(
        outer.dst,
        ip(NODE1),
        "the reply goes back to the ingress node, not to the client"
    );

    let (v, to_client, tr) = traced(&mut a, back[0].1.data.clone(), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded, "{:?}", tr.events);
    assert_eq!(to_client[0].0, UPLINK);
    assert_eq!(&to_client[0].1.data[0..6], &GW_MAC);
    let k = key_of(&to_client[0].1.data);
    assert_eq!(
        (k.src, k.src_port, k.dst, k.dst_port),
        (ip(NODE1).into(), 30080, ip(CLIENT).into(), 50000)
    );

    // The client's next segment follows the connection through the tunnel again.
    let (_, out) = run(
        &mut a,
        from_client(NODE1, 50000, 30080)
            .seq(101, 7001)
            .flags(tcp_flags::ACK)
            .frame(&[]),
        UPLINK,
        SEC,
    );
    assert_eq!(key_of(&out[0].1.data).dst, ip("192.168.50.20"));
    assert_eq!(key_of(vxlan_inner(&out[0].1.data)).src, ip(CLIENT));
}

/// The conformance test "functioning NodePort service": a pod on node 2 reaches node
/// 1's node port, whose endpoint is back on node 2. Node 1 keeps the pod's address and
/// tunnels the connection to node 2; the endpoint's reply, although addressed to a pod
/// of node 2, must go back through node 1, the only node that can undo the DNAT.
#[test]
fn test_a_pod_reaching_another_nodes_node_port_gets_replies_through_that_node() {
    for mode in [ModeSpec::Always, ModeSpec::CrossSubnet] {
        let svc = || web(vec![be("10.244.2.5", 8080, 2)]);
        let mut a = node(1, mode, vec![svc()]);
        let mut b = node(2, mode, vec![svc()]);
        let syn = tcp("10.244.2.6", NODE1, 40000, 30080)
            .seq(1000, 0)
            .flags(tcp_flags::SYN)
            .opts(&from_pod(2, 6))
            .frame(&[]);
        let (v, out) = run(&mut b, syn, POD2, SEC);
        assert_eq!(v, Verdict::Forwarded);
        assert_eq!(
            (out[0].0, key_of(&out[0].1.data).dst),
            (UPLINK, ip(NODE1).into()),
            "{mode:?}: to node 1's address, not a Service here"
        );

        let (v, out, tr) = traced(&mut a, out[0].1.data.clone(), UPLINK, SEC);
        assert_eq!(v, Verdict::Forwarded, "{:?}", tr.events);
        let k = key_of(vxlan_inner(&out[0].1.data));
        assert_eq!(
            (k.src, k.dst, k.dst_port),
            (ip("10.244.2.6").into(), ip("10.244.2.5").into(), 8080),
            "{mode:?}: client address kept, through the tunnel"
        );

        let (v, got) = run(&mut b, out[0].1.data.clone(), UPLINK, SEC);
        assert_eq!(v, Verdict::Forwarded);
        assert_eq!(got[0].0, POD);

        let (v, back, tr) = traced(
            &mut b,
            synack(2, 5, "10.244.2.6", 8080, 40000, 1001),
            POD,
            SEC,
        );
        assert_eq!(v, Verdict::Forwarded, "{:?}", tr.events);
        assert_eq!(
            back[0].0, UPLINK,
            "{mode:?}: not straight to the client pod"
        );
        assert_eq!(
            key_of(&back[0].1.data).dst,
            ip(NODE1),
            "{mode:?}: back through node 1"
        );

        let (v, to_client, tr) = traced(&mut a, back[0].1.data.clone(), UPLINK, SEC);
        assert_eq!(v, Verdict::Forwarded, "{:?}", tr.events);
        let (v, got, tr) = traced(&mut b, to_client[0].1.data.clone(), UPLINK, SEC);
        assert_eq!(v, Verdict::Forwarded, "{:?}", tr.events);
        assert_eq!(got[0].0, POD2);
        let k = key_of(&got[0].1.data);
        assert_eq!(
            (k.src, k.src_port, k.dst, k.dst_port),
            (ip(NODE1).into(), 30080, ip("10.244.2.6").into(), 40000),
            "{mode:?}: the client pod sees node 1's node port answer"
        );
    }
}

/// A reply that the ingress node cannot translate (it lost the connection) and routes
/// back to the endpoint's node is delivered there, not returned to the ingress node
/// again and again.
#[test]
fn test_a_reply_the_ingress_node_returns_is_not_sent_back_to_it() {
    let svc = || web(vec![be("10.244.2.5", 8080, 2)]);
    let mut a = node1(vec![svc()]);
    let mut b = node(2, ModeSpec::Always, vec![svc()]);
    let syn = tcp("10.244.2.6", NODE1, 40000, 30080)
        .seq(1000, 0)
        .flags(tcp_flags::SYN)
        .opts(&from_pod(2, 6))
        .frame(&[]);
    let (_, out) = run(&mut b, syn, POD2, SEC);
    let (_, out) = run(&mut a, out[0].1.data.clone(), UPLINK, SEC);
    run(&mut b, out[0].1.data.clone(), UPLINK, SEC);
    // Node 1 restarts: a segment of the endpoint is taken up as a new connection there
    // and routed to its destination, a pod of node 2.
    let mut a = node1(vec![svc()]);
    let ack = tcp("10.244.2.5", "10.244.2.6", 8080, 40000)
        .seq(7001, 1001)
        .flags(tcp_flags::ACK)
        .opts(&from_pod(2, 5))
        .frame(&[]);
    let (_, back) = run(&mut b, ack, POD, SEC);
    assert_eq!(key_of(&back[0].1.data).dst, ip(NODE1));
    let (v, again) = run(&mut a, back[0].1.data.clone(), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(key_of(&again[0].1.data).dst, ip("192.168.50.20"));
    let (v, got) = run(&mut b, again[0].1.data.clone(), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(got[0].0, POD2);
}

/// An endpoint at another node's own address (a host-network pod) is reached through
/// the tunnel to that node like a pod of it, so that its replies come back here.
#[test]
fn test_node_port_to_a_host_network_endpoint_on_another_node_goes_through_the_tunnel() {
    let mut a = node(
        1,
        ModeSpec::CrossSubnet,
        vec![web(vec![be("192.168.50.20", 8443, 2)])],
    );
    let (v, out, tr) = traced(&mut a, client_syn(NODE1, 50000, 30080, 100), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded, "{:?}", tr.events);
    client_tunnelled_to_node2(&out, "192.168.50.20", 8443);
    let route = event(&tr, "route");
    assert!(route.contains("node2"), "{}", route);
}

/// An endpoint the tunnel does not reach (on no node this one knows: a machine outside
/// the cluster behind a selectorless Service) gets external traffic from this node's
/// address, as kube-proxy masquerades it: it would answer a kept client address directly.
#[test]
fn test_node_port_to_an_endpoint_the_tunnel_does_not_reach_is_source_translated() {
    let mut a = node1(vec![web(vec![be("192.168.30.50", 80, 3)])]);
    let (v, out, tr) = traced(&mut a, client_syn(NODE1, 50000, 30080, 100), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded, "{:?}", tr.events);
    assert_eq!(&out[0].1.data[0..6], &GW_MAC, "routed, not tunnelled");
    let k = key_of(&out[0].1.data);
    assert_eq!(
        (k.src, k.dst, k.dst_port),
        (ip(NODE1).into(), ip("192.168.30.50").into(), 80)
    );
    let note = event(&tr, "service");
    assert!(
        note.contains("source NAT") && !note.contains("tunnel"),
        "{}",
        note
    );
    reply_reaches_the_client(&mut a, ("192.168.30.50", 80), GW_MAC, k.src_port);
}

/// A selectorless Service's endpoint on no node (the agent's `no_node` for an endpoint
/// without nodeName): external traffic is source translated under the Cluster policy,
/// and dropped under Local, since no node has it.
#[test]
fn test_node_port_to_an_endpoint_on_no_node_is_translated_or_has_no_local_endpoint() {
    let vm = || {
        web(vec![BackendSpec {
            node: None,
            no_node: true,
            ..be("192.168.30.50", 80, 1)
        }])
    };
    let mut a = node1(vec![vm()]);
    let (v, out) = run(&mut a, client_syn(NODE1, 50000, 30080, 100), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded);
    let k = key_of(&out[0].1.data);
    assert_eq!(
        (k.src, k.dst, k.dst_port),
        (ip(NODE1).into(), ip("192.168.30.50").into(), 80)
    );

    let local = ServiceSpec {
        external_policy: Policy::Local,
        ..vm()
    };
    let mut a = node1(vec![local]);
    let (v, out) = run(&mut a, client_syn(NODE1, 50000, 30080, 100), UPLINK, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceNoLocalEndpoints));
    assert!(out.is_empty());
}

#[test]
fn test_external_snat_mode_sends_from_this_node_instead() {
    let svc = || ServiceSpec {
        external_snat: true,
        ..web(vec![be("10.244.2.5", 8080, 2)])
    };
    let mut a = node(1, ModeSpec::CrossSubnet, vec![svc()]);
    let (v, out) = run(&mut a, client_syn(NODE1, 50000, 30080, 100), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(
        &out[0].1.data[0..6],
        &uplink_mac(2),
        "routed directly, same subnet"
    );
    let k = key_of(&out[0].1.data);
    assert_eq!(
        (k.src, k.dst, k.dst_port),
        (ip(NODE1).into(), ip("10.244.2.5").into(), 8080)
    );
    // The reply comes back to the node address and is translated for the client.
    reply_reaches_the_client(&mut a, ("10.244.2.5", 8080), uplink_mac(2), k.src_port);
}

/// The endpoint `from` (behind `from_mac` on the uplink) answers a SYN that node 1
/// source translated to port `port` of its address: the SYN-ACK goes back to the
/// client 50000 from node 1's node port 30080.
fn reply_reaches_the_client(
    a: &mut Pipeline,
    (from, from_port): (&str, u16),
    from_mac: [u8; 6],
    port: u16,
) {
    let o = IpOpts {
        src_mac: from_mac,
        dst_mac: uplink_mac(1),
        ..IpOpts::default()
    };
    let synack = build::tcp(
        ip(from),
        ip(NODE1),
        from_port,
        port,
        7000,
        101,
        tcp_flags::SYN | tcp_flags::ACK,
        &[],
        &o,
    );
    let (_, back) = run(a, synack, UPLINK, SEC);
    let k = key_of(&back[0].1.data);
    assert_eq!(
        (k.src, k.src_port, k.dst, k.dst_port),
        (ip(NODE1).into(), 30080, ip(CLIENT).into(), 50000)
    );
}

#[test]
fn test_session_affinity_keeps_a_client_on_its_endpoint_until_the_timeout() {
    let backends = vec![
        be("10.244.1.6", 53, 1),
        be("10.244.2.5", 53, 2),
        be("10.244.2.6", 53, 2),
    ];
    let svc = ServiceSpec {
        affinity_timeout_s: Some(10),
        ..dns(backends.clone())
    };
    let mut a = node1(vec![svc]);
    let (_, out) = run(&mut a, udp_to_service(30000), POD, SEC);
    let first = delivered_to(&out);
    for (i, sport) in (30001..30060u16).enumerate() {
        // New connections within the timeout of the last one keep the endpoint.
        let (_, out) = run(
            &mut a,
            udp_to_service(sport),
            POD,
            SEC + i as u64 * SEC / 10,
        );
        assert_eq!(delivered_to(&out), first);
    }
    assert_eq!(a.affinity().len(), 1);
    a.tick(30 * SEC, &mut Vec::new());
    assert!(a.affinity().is_empty(), "expired records are swept");

    // Without affinity, the same client's connections spread.
    let mut b = node1(vec![dns(backends)]);
    let spread: HashSet<IpAddr> = (30000..30060u16)
        .map(|sport| delivered_to(&run(&mut b, udp_to_service(sport), POD, SEC).1))
        .collect();
    assert!(spread.len() > 1);
}

#[test]
fn test_hairpin_is_source_translated_to_the_service_address() {
    let mut a = node1(vec![web(vec![be("10.244.1.5", 8080, 1)])]);
    let (v, out) = run(&mut a, pod_syn("10.96.0.10", 40000, 80), POD, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out[0].0, POD, "back to the pod itself");
    let k = key_of(&out[0].1.data);
    assert_eq!(
        (k.src, k.dst, k.dst_port),
        (ip("10.96.0.10").into(), ip("10.244.1.5").into(), 8080)
    );
    let reply = synack(1, 5, "10.96.0.10", 8080, k.src_port, 1001);
    let (v, out) = run(&mut a, reply, POD, SEC);
    assert_eq!(v, Verdict::Forwarded);
    let k = key_of(&out[0].1.data);
    assert_eq!(
        (k.src, k.src_port, k.dst, k.dst_port),
        (ip("10.96.0.10").into(), 80, ip("10.244.1.5").into(), 40000)
    );
}

use std::collections::{HashMap, HashSet};

#[test]
fn test_a_removed_endpoints_connections_are_deleted_and_udp_clients_move_on() {
    let both = vec![be("10.244.1.6", 53, 1), be("10.244.2.5", 53, 2)];
    let mut a = node1(vec![dns(both)]);
    let mut on_removed = 0;
    for sport in 30000..30040u16 {
        let (_, out) = run(&mut a, udp_to_service(sport), POD, SEC);
        if delivered_to(&out) == ip("10.244.1.6") {
            on_removed += 1;
        }
    }
    assert!(on_removed > 0);
    let report = a.set_tables(node_tables(
        1,
        ModeSpec::Always,
        vec![dns(vec![be("10.244.2.5", 53, 2)])],
    ));
    assert_eq!(report.ct_removed, on_removed);
    assert_eq!(a.conntrack().len(), 40 - on_removed);
    for sport in 30000..30040u16 {
        let (_, out) = run(&mut a, udp_to_service(sport), POD, 2 * SEC);
        assert_eq!(
            delivered_to(&out),
            ip("10.244.2.5"),
            "every client on the endpoint left"
        );
    }
}

/// An endpoint whose readiness probe fails stays in the slice, ready and serving
/// false: UDP clients leave it (kube-proxy clears their entries), TCP connections stay.
#[test]
fn test_udp_clients_leave_an_endpoint_that_stops_serving_and_tcp_stays() {
    let both = vec![be("10.244.1.6", 53, 1), be("10.244.2.5", 53, 2)];
    let web_both = vec![be("10.244.1.6", 8080, 1)];
    let mut a = node1(vec![dns(both), web(web_both)]);
    let mut on_failing = 0;
    for sport in 30000..30040u16 {
        let (_, out) = run(&mut a, udp_to_service(sport), POD, SEC);
        if delivered_to(&out) == ip("10.244.1.6") {
            on_failing += 1;
        }
    }
    assert!(on_failing > 0);
    run(&mut a, pod_syn("10.96.0.10", 40000, 80), POD, SEC);
    let failing = |port| BackendSpec {
        ready: false,
        serving: Some(false),
        ..be("10.244.1.6", port, 1)
    };
    let report = a.set_tables(node_tables(
        1,
        ModeSpec::Always,
        vec![
            dns(vec![failing(53), be("10.244.2.5", 53, 2)]),
            web(vec![failing(8080)]),
        ],
    ));
    assert_eq!(report.ct_removed, on_failing, "the UDP entries only");
    assert_eq!(a.conntrack().len(), 40 - on_failing + 1);
    for sport in 30000..30040u16 {
        let (_, out) = run(&mut a, udp_to_service(sport), POD, 2 * SEC);
        assert_eq!(delivered_to(&out), ip("10.244.2.5"));
    }
}

#[test]
fn test_a_node_port_connection_forwarded_from_another_node_survives_endpoint_changes() {
    let svc = || web(vec![be("10.244.2.5", 8080, 2)]);
    let mut a = node1(vec![svc()]);
    let mut b = node(2, ModeSpec::Always, vec![svc()]);
    let (_, out) = run(&mut a, client_syn(NODE1, 50000, 30080, 100), UPLINK, SEC);
    run(&mut b, out[0].1.data.clone(), UPLINK, SEC);
    assert_eq!(b.conntrack().len(), 1);
    // Node 2 loses every Service (its own view of the endpoints changed): the
    // connection node 1 forwarded is not one node 2 balanced, and stays.
    let report = b.set_tables(node_tables(2, ModeSpec::Always, vec![]));
    assert_eq!(report.ct_removed, 0);
    let synack = synack(2, 5, CLIENT, 8080, 50000, 101);
    let (v, back) = run(&mut b, synack, POD, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(key_of(&back[0].1.data).dst, ip(NODE1));
}

/// One pod behind two UDP Services, serving in one and not ready in the other: an
/// update of the other leaves the first one's clients on it.
#[test]
fn test_updating_a_service_leaves_another_services_udp_clients_on_a_shared_endpoint() {
    let other = |ready| ServiceSpec {
        name: "default/other:dns".into(),
        cluster_ips: vec![ip("10.96.0.12")],
        ..dns(vec![BackendSpec {
            ready,
            ..be("10.244.1.6", 53, 1)
        }])
    };
    let mut a = node1(vec![dns(vec![be("10.244.1.6", 53, 1)]), other(false)]);
    let (_, out) = run(&mut a, udp_to_service(30000), POD, SEC);
    assert_eq!(delivered_to(&out), ip("10.244.1.6"));
    let updated = a.tables().with_services(&[], &[other(false)]).unwrap();
    let report = a.set_tables(Arc::new(updated));
    assert_eq!(report.ct_removed, 0);
    assert_eq!(a.conntrack().len(), 1);
    let (_, out) = run(&mut a, udp_to_service(30000), POD, 2 * SEC);
    assert_eq!(delivered_to(&out), ip("10.244.1.6"));
    assert_eq!(a.stats().service_balanced, 1, "the same connection");
}

/// A segment that cannot start a TCP connection (an RST or a SYN-ACK nobody asked for)
/// to a frontend is not load balanced: no endpoint chosen, no affinity record. It is
/// invalid, and with `pass_invalid` leaves as it came.
#[test]
fn test_a_segment_that_cannot_start_a_connection_is_not_balanced() {
    for pass_invalid in [false, true] {
        let svc = ServiceSpec {
            affinity_timeout_s: Some(10),
            ..web(vec![be("10.244.1.6", 8080, 1)])
        };
        let mut spec = node1_spec();
        spec.services = vec![svc];
        spec.ct.pass_invalid = pass_invalid;
        let mut a = compiled(&spec);
        learn(&mut a, 1, GW, GW_MAC);
        for flags in [tcp_flags::RST, tcp_flags::SYN | tcp_flags::ACK] {
            let (v, out) = run(
                &mut a,
                tcp_from_pod("10.96.0.10", 40000, 80, flags),
                POD,
                SEC,
            );
            if pass_invalid {
                assert_eq!(v, Verdict::Forwarded);
                assert_eq!(key_of(&out[0].1.data).dst.ip(), ip("10.96.0.10"));
            } else {
                assert_eq!(v, Verdict::Dropped(DropReason::CtInvalid));
            }
            assert_eq!(a.stats().service_balanced, 0, "flags {flags:#x}");
            assert!(a.affinity().is_empty(), "flags {flags:#x}");
            assert_eq!(a.conntrack().len(), 0);
        }
        let (v, out) = run(&mut a, pod_syn("10.96.0.10", 40000, 80), POD, SEC);
        assert_eq!(v, Verdict::Forwarded);
        assert_eq!(key_of(&out[0].1.data).dst.ip(), ip("10.244.1.6"));
        assert_eq!(a.stats().service_balanced, 1);
        assert_eq!(a.affinity().len(), 1);
    }
}

/// A UDP flow to an address and port that becomes a Service frontend later (the client
/// started before the Service existed) is load balanced from the swap on: its plain
/// entry is deleted, as kube-proxy clears UDP entries to a new Service's addresses,
/// whether the new tables were compiled afresh or updated.
#[test]
fn test_a_udp_flow_to_an_address_that_becomes_a_frontend_is_balanced_after_the_swap() {
    for updated in [false, true] {
        let mut a = node1(vec![]);
        let (v, out) = run(&mut a, udp_to_service(30000), POD, SEC);
        assert_eq!(v, Verdict::Forwarded);
        assert_eq!(out[0].0, UPLINK, "default route");
        assert_eq!(key_of(&out[0].1.data).dst.ip(), ip("10.96.0.11"));
        // Another plain UDP flow, and a TCP one to the new frontend's address, stay.
        run(&mut a, udp_from_pod("192.168.60.7", 30001, b"q"), POD, SEC);
        run(&mut a, pod_syn("10.96.0.11", 30002, 53), POD, SEC);
        assert_eq!(a.conntrack().len(), 3);
        let svc = dns(vec![be("10.244.1.6", 53, 1)]);
        let new = if updated {
            Arc::new(a.tables().with_services(&[], &[svc]).unwrap())
        } else {
            node_tables(1, ModeSpec::Always, vec![svc])
        };
        let report = a.set_tables(new);
        assert_eq!(report.ct_removed, 1, "updated: {updated}");
        assert_eq!(a.conntrack().len(), 2);
        let (v, out) = run(&mut a, udp_to_service(30000), POD, 2 * SEC);
        assert_eq!(v, Verdict::Forwarded);
        assert_eq!(delivered_to(&out), ip("10.244.1.6"));
        assert_eq!(a.stats().service_balanced, 1);
        // An update that adds no frontend visits no connection.
        let same = a
            .tables()
            .with_services(&[], &[dns(vec![be("10.244.1.6", 53, 1)])])
            .unwrap();
        assert_eq!(a.set_tables(Arc::new(same)).ct_removed, 0);
    }
}

/// The same for a node port: a UDP flow to this node's address at a port that becomes
/// a node port.
#[test]
fn test_a_udp_flow_to_a_port_that_becomes_a_node_port_is_balanced_after_the_swap() {
    let mut a = node1(vec![]);
    let o = IpOpts {
        src_mac: GW_MAC,
        dst_mac: uplink_mac(1),
        ..IpOpts::default()
    };
    let from_outside = || build::udp(ip(CLIENT), ip(NODE1), 40000, 30053, b"q", &o);
    run(&mut a, from_outside(), UPLINK, SEC);
    assert_eq!(a.conntrack().len(), 1);
    let svc = ServiceSpec {
        node_port: Some(30053),
        ..dns(vec![be("10.244.1.6", 53, 1)])
    };
    let new = a.tables().with_services(&[], &[svc]).unwrap();
    assert_eq!(a.set_tables(Arc::new(new)).ct_removed, 1);
    let (v, out) = run(&mut a, from_outside(), UPLINK, 2 * SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(delivered_to(&out), ip("10.244.1.6"));
}

/// A static NAT rule that matches a pod's traffic (egress masquerade of the pod CIDR)
/// does not turn Services off for it: a connection to a frontend is load balanced, and
/// the rule applies to the pod's other connections.
#[test]
fn test_a_service_frontend_takes_precedence_over_a_matching_static_nat_rule() {
    use crate::nat::MatchSpec;
    let mut spec = node1_spec();
    spec.services = vec![web(vec![be("10.244.1.6", 8080, 1)])];
    spec.nat = vec![masquerade(MatchSpec {
        src: Some("10.244.0.0/16".parse().unwrap()),
        ..MatchSpec::default()
    })];
    let mut a = compiled(&spec);
    learn(&mut a, 1, GW, GW_MAC);
    let (v, out, tr) = traced(&mut a, pod_syn("10.96.0.10", 40000, 80), POD, SEC);
    assert_eq!(v, Verdict::Forwarded, "{:?}", tr.events);
    assert_eq!(out[0].0, POD2);
    let k = key_of(&out[0].1.data);
    assert_eq!(
        (k.src, k.dst, k.dst_port),
        (ip("10.244.1.5").into(), ip("10.244.1.6").into(), 8080)
    );
    assert_eq!(a.stats().service_balanced, 1);
    assert!(
        tr.events.iter().all(|e| e.stage().name() != "nat"),
        "no static rule applied: {:?}",
        tr.events
    );
    // Elsewhere, the rule applies.
    let (v, out) = run(&mut a, pod_syn(CLIENT, 40001, 80), POD, SEC);
    assert_eq!(v, Verdict::Forwarded);
    let k = key_of(&out[0].1.data);
    assert_eq!((k.src, k.dst), (ip(NODE1).into(), ip(CLIENT).into()));
}

/// External traffic that must leave from this node's address (here in SNAT mode) on a
/// node without an address of its family is refused, not sent on with the client
/// address, whose replies would not come back through this node to be translated.
#[test]
fn test_a_connection_needing_the_node_address_of_a_family_the_node_lacks_is_dropped() {
    let svc = ServiceSpec {
        external_snat: true,
        external_ips: vec![ip("192.168.70.9"), ip("fd00:70::9")],
        ..web(vec![
            be("10.244.2.5", 8080, 2),
            be("fd00:10:244:2::5", 8080, 2),
        ])
    };
    let mut spec = node1_spec();
    spec.ports[0].addresses.retain(|a| a.addr.is_ipv4());
    spec.routes.retain(|r| r.prefix.addr().is_ipv4());
    spec.services = vec![svc];
    let mut a = compiled(&spec);
    learn(&mut a, 1, GW, GW_MAC);
    learn(&mut a, 1, "192.168.50.20", uplink_mac(2));
    let o = IpOpts {
        src_mac: GW_MAC,
        dst_mac: uplink_mac(1),
        ..IpOpts::default()
    };
    let syn = |src: &str, dst: &str| {
        build::tcp(ip(src), ip(dst), 50000, 80, 100, 0, tcp_flags::SYN, &[], &o)
    };
    let (v, out, tr) = traced(&mut a, syn("fd00:60::7", "fd00:70::9"), UPLINK, SEC);
    assert_eq!(
        v,
        Verdict::Dropped(DropReason::ServiceNoNodeAddress),
        "{:?}",
        tr.events
    );
    assert!(out.is_empty());
    assert!(
        has_event(&tr, "service", "none of the family"),
        "{:?}",
        tr.events
    );
    assert_eq!(a.drops().get(DropReason::ServiceNoNodeAddress), 1);
    assert_eq!(a.stats().service_balanced, 0);
    assert_eq!(a.conntrack().len(), 0);
    // IPv4, which the node has, is translated.
    let (v, out) = run(&mut a, syn(CLIENT, "192.168.70.9"), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(key_of(vxlan_inner(&out[0].1.data)).src.ip(), ip(NODE1));
}

/// The client's SYN from `src` (on the uplink, as `from_client`'s).
fn syn_from(src: &str, dst: &str, sport: u16, dport: u16) -> Vec<u8> {
    let o = IpOpts {
        src_mac: GW_MAC,
        dst_mac: uplink_mac(1),
        ..IpOpts::default()
    };
    tcp(src, dst, sport, dport)
        .seq(1, 0)
        .flags(tcp_flags::SYN)
        .opts(&o)
        .frame(&[])
}

/// `web` whose load balancer IPs only `ranges` may reach.
fn ranged_web(ranges: &[&str], backends: Vec<BackendSpec>) -> ServiceSpec {
    ServiceSpec {
        source_ranges: ranges.iter().map(|r| r.parse().unwrap()).collect(),
        ..web(backends)
    }
}

/// kube-proxy's firewall of load balancer IPs: a new connection to one from a source
/// outside the ranges is dropped silently (no reset, even without endpoints), counted
/// per Service port and named in the trace; the ranges' sources get through, and the
/// other frontends of the Service (external IP, node port, cluster IP) do not look.
#[test]
fn test_load_balancer_source_ranges_drop_other_sources_of_load_balancer_ips_only() {
    // The host bits of a range are ignored, as kube-proxy parses ranges.
    let svc = ranged_web(
        &["192.168.60.0/29", "203.0.113.9/24"],
        vec![be("10.244.1.6", 8080, 1)],
    );
    let mut a = node1(vec![svc]);
    let lb = "192.168.70.10";
    for (i, src) in [CLIENT, "203.0.113.200"].into_iter().enumerate() {
        let (v, out) = run(&mut a, syn_from(src, lb, 50000 + i as u16, 80), UPLINK, SEC);
        assert_eq!(v, Verdict::Forwarded, "{src} is in a range");
        assert_eq!(key_of(&out[0].1.data).dst, ip("10.244.1.6"));
    }
    let outside = "192.168.60.8";
    let (v, out, tr) = traced(&mut a, syn_from(outside, lb, 50010, 80), UPLINK, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceSourceDenied));
    assert!(
        out.is_empty(),
        "nothing answers a source outside the ranges"
    );
    let note = event(&tr, "service");
    assert!(
        note.contains("default/web:http") && note.contains("loadBalancerSourceRanges"),
        "{note}"
    );
    assert_eq!(a.conntrack().len(), 2, "no connection for the refused one");
    // A retransmitted SYN is refused again, and counted again.
    let (v, _) = run(&mut a, syn_from(outside, lb, 50010, 80), UPLINK, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceSourceDenied));
    let counts: Vec<_> = a.source_denied_counts().collect();
    assert_eq!(counts, [("default/web:http", 2)]);
    assert_eq!(a.drops().get(DropReason::ServiceSourceDenied), 2);
    // The same source reaches the external IP and the node port; a pod of this node
    // outside the ranges does not reach the load balancer IP, but its cluster IP.
    for (i, (dst, port)) in [("192.168.70.9", 80), (NODE1, 30080)]
        .into_iter()
        .enumerate()
    {
        let (v, _) = run(
            &mut a,
            syn_from(outside, dst, 50020 + i as u16, port),
            UPLINK,
            SEC,
        );
        assert_eq!(v, Verdict::Forwarded, "{dst}:{port} is not checked");
    }
    let (v, _) = run(&mut a, pod_syn(lb, 40000, 80), POD, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceSourceDenied));
    let (v, _) = run(&mut a, pod_syn("10.96.0.10", 40001, 80), POD, SEC);
    assert_eq!(v, Verdict::Forwarded);

    // Without endpoints, the ranges' sources get a reset, the others nothing.
    let mut b = node1(vec![ranged_web(&["192.168.60.0/29"], vec![])]);
    let (v, out) = run(&mut b, syn_from(CLIENT, lb, 50000, 80), UPLINK, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceNoEndpoints));
    assert_eq!(out.len(), 1, "a reset");
    let (v, out) = run(&mut b, syn_from(outside, lb, 50001, 80), UPLINK, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceSourceDenied));
    assert!(out.is_empty());
}

/// Ranges are read per family, as kube-proxy reads them: an IPv6 load balancer IP of a
/// Service with only IPv4 ranges accepts every source, one with an IPv6 range checks
/// IPv6 sources. An address that is both an external IP and a load balancer IP of the
/// Service is checked.
#[test]
fn test_source_ranges_apply_per_family_and_to_an_external_ip_that_is_also_the_lbs() {
    let v6_lb = "fd00:70::10";
    let v6_syn = |src: &str, sport: u16| {
        let o = IpOpts {
            src_mac: GW_MAC,
            dst_mac: uplink_mac(1),
            ..IpOpts::default()
        };
        tcp(src, v6_lb, sport, 80)
            .seq(1, 0)
            .flags(tcp_flags::SYN)
            .opts(&o)
            .frame(&[])
    };
    let two = |ranges: &[&str]| ServiceSpec {
        load_balancer_ips: vec![ip("192.168.70.10"), ip(v6_lb)],
        external_ips: vec![ip("192.168.70.10")],
        ..ranged_web(
            ranges,
            vec![be("10.244.1.6", 8080, 1), be("fd00:10:244:1::6", 8080, 1)],
        )
    };
    let mut a = node1(vec![two(&["192.168.60.0/29"])]);
    let (v, _) = run(&mut a, v6_syn("fd00:60::99", 50000), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded, "no IPv6 range: every IPv6 source");
    let (v, _) = run(
        &mut a,
        syn_from("192.168.60.99", "192.168.70.10", 50001, 80),
        UPLINK,
        SEC,
    );
    assert_eq!(
        v,
        Verdict::Dropped(DropReason::ServiceSourceDenied),
        "an external IP that is the load balancer's too is checked"
    );
    let mut b = node1(vec![two(&["192.168.60.0/29", "fd00:60::/120"])]);
    let (v, _) = run(&mut b, v6_syn("fd00:60::99", 50000), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded, "in the IPv6 range");
    let (v, _) = run(&mut b, v6_syn("fd00:61::99", 50001), UPLINK, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::ServiceSourceDenied));
}

/// The per-Service count follows the Service port through a swap and goes with it.
#[test]
fn test_source_denied_counts_follow_their_service_port_through_swaps() {
    let svc = || ranged_web(&["192.168.60.0/29"], vec![be("10.244.1.6", 8080, 1)]);
    let mut a = node1(vec![svc()]);
    run(
        &mut a,
        syn_from("192.168.60.99", "192.168.70.10", 50000, 80),
        UPLINK,
        SEC,
    );
    a.set_tables(node_tables(1, ModeSpec::Always, vec![svc()]));
    assert_eq!(
        a.source_denied_counts().collect::<Vec<_>>(),
        [("default/web:http", 1)]
    );
    // Ranges that now hold the source let it in.
    a.set_tables(node_tables(
        1,
        ModeSpec::Always,
        vec![ranged_web(
            &["192.168.60.0/24"],
            vec![be("10.244.1.6", 8080, 1)],
        )],
    ));
    let (v, _) = run(
        &mut a,
        syn_from("192.168.60.99", "192.168.70.10", 50001, 80),
        UPLINK,
        SEC,
    );
    assert_eq!(v, Verdict::Forwarded);
    a.set_tables(node_tables(1, ModeSpec::Always, vec![]));
    assert_eq!(a.source_denied_counts().count(), 0);
}
