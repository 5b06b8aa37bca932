//! Service connections recovered from their endpoint's side (`recover`): a fresh
//! pipeline (an agent that lost its state) given an endpoint's segment first.

use super::test_support::*;
use super::*;

const CLIENT: &str = "192.168.60.7";
const NODE1: &str = "192.168.50.10";

/// A data segment of pod `last` of node `n` from its port 8080 to `to`:`dport`.
fn server_data(n: u8, last: u8, to: &str, dport: u16) -> Vec<u8> {
    build::tcp(
        ip(&format!("10.244.{n}.{last}")),
        ip(to),
        8080,
        dport,
        7000,
        1001,
        tcp_flags::ACK | tcp_flags::PSH,
        b"data",
        &from_pod(n, last),
    )
}

/// Node 1, whose pod 10.244.1.6 is web's one endpoint.
fn web_on_node1() -> Pipeline {
    node(
        1,
        ModeSpec::Always,
        vec![web(vec![be("10.244.1.6", 8080, 1)])],
    )
}

/// A segment of endpoint 10.244.2.5 (node 2) from its port 8080 to the client's port
/// 50000, acknowledging 101.
fn to_client(seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    build::tcp(
        ip("10.244.2.5"),
        ip(CLIENT),
        8080,
        50000,
        seq,
        101,
        flags,
        payload,
        &from_pod(2, 5),
    )
}

/// The client's segment to node 1's node port from its port 50000.
fn to_node_port(o: &IpOpts, seq: u32, ack: u32, flags: u8) -> Vec<u8> {
    tcp(CLIENT, NODE1, 50000, 30080)
        .seq(seq, ack)
        .flags(flags)
        .opts(o)
        .frame(&[])
}

/// Frame options of what the gateway sends to node `n`'s uplink.
fn from_gateway(n: u8) -> IpOpts {
    IpOpts {
        src_mac: GW_MAC,
        dst_mac: uplink_mac(n),
        ..IpOpts::default()
    }
}

/// A segment of pod 10.244.1.5 (node 1) from its port 40000.
fn client_seg(dst: &str, dport: u16, flags: u8) -> Vec<u8> {
    tcp("10.244.1.5", dst, 40000, dport)
        .seq(1001, 7004)
        .flags(flags)
        .opts(&from_pod(1, 5))
        .frame(&[])
}

fn source_of(out: &[(PortId, Packet)]) -> (IpAddr, u16) {
    let k = key_of(&out[0].1.data);
    (k.src.ip(), k.src_port)
}

#[test]
fn test_a_lost_cluster_ip_connection_is_translated_back_until_the_client_answers() {
    let mut a = web_on_node1();
    let (v, out, tr) = traced(&mut a, server_data(1, 6, "10.244.1.5", 40000), POD2, SEC);
    assert_eq!(v, Verdict::Forwarded, "{:?}", tr.events);
    assert_eq!(out[0].0, POD);
    assert_eq!(
        source_of(&out),
        (ip("10.96.0.10"), 80),
        "from the cluster IP"
    );
    assert_eq!(key_of(&out[0].1.data).dst, ip("10.244.1.5"));
    assert!(
        has_event(
            &tr,
            "service",
            "endpoint 10.244.1.6:8080 of default/web:http, no connection: taken as a reply through its cluster IP frontend 10.96.0.10:80 (candidate 1 of 4)"
        ),
        "{:?}",
        tr.events
    );
    assert_eq!(a.conntrack().len(), 0, "nothing committed");
    assert_eq!(a.stats().ct_recovered, 1);

    // The client answers the frontend it knows: its segment starts the connection (the
    // same endpoint chosen), and the endpoint's next segment follows it.
    let (v, out) = run(
        &mut a,
        client_seg("10.96.0.10", 80, tcp_flags::ACK),
        POD,
        SEC,
    );
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out[0].0, POD2);
    let k = key_of(&out[0].1.data);
    assert_eq!((k.dst.ip(), k.dst_port), (ip("10.244.1.6"), 8080));
    assert_eq!(a.conntrack().len(), 1);
    let (v, out) = run(&mut a, server_data(1, 6, "10.244.1.5", 40000), POD2, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(source_of(&out), (ip("10.96.0.10"), 80));
    assert_eq!(
        a.stats().ct_recovered,
        1,
        "translated by the connection now"
    );
    assert_eq!(a.stats().ct_recovery_refuted, 0);
}

#[test]
fn test_a_candidate_the_client_refuses_or_leaves_unanswered_gives_way_to_the_next() {
    let mut a = web_on_node1();
    let seg = || server_data(1, 6, "10.244.1.5", 40000);
    let (_, out) = run(&mut a, seg(), POD2, SEC);
    assert_eq!(source_of(&out), (ip("10.96.0.10"), 80));
    // A reset from the client to that frontend: no connection has it, so it is dropped,
    // and it refutes the candidate.
    let (v, _) = run(
        &mut a,
        client_seg("10.96.0.10", 80, tcp_flags::RST),
        POD,
        SEC,
    );
    assert_eq!(v, Verdict::Dropped(DropReason::CtInvalid));
    assert_eq!(a.stats().ct_recovery_refuted, 1);
    let (_, out) = run(&mut a, seg(), POD2, SEC);
    assert_eq!(
        source_of(&out),
        (ip("192.168.70.9"), 80),
        "the next candidate"
    );
    // Left unanswered for a second: the one after.
    let (_, out) = run(&mut a, seg(), POD2, 2 * SEC);
    assert_eq!(source_of(&out), (ip("192.168.70.10"), 80));
    assert_eq!(a.stats().ct_recovery_refuted, 2);
    // A reset for a frontend not being tried refutes nothing.
    let reset = |a: &mut Pipeline, to: &str, port: u16| {
        run(a, client_seg(to, port, tcp_flags::RST), POD, 2 * SEC);
    };
    reset(&mut a, "192.168.70.9", 80);
    assert_eq!(a.stats().ct_recovery_refuted, 2);
    reset(&mut a, "192.168.70.10", 80);
    let (_, out) = run(&mut a, seg(), POD2, 2 * SEC);
    assert_eq!(source_of(&out), (ip(NODE1), 30080), "the node port, last");
    reset(&mut a, NODE1, 30080);
    assert_eq!(a.stats().ct_recovery_refuted, 4);
    // Only the one left unanswered remains: tried again.
    let (_, out) = run(&mut a, seg(), POD2, 2 * SEC);
    assert_eq!(source_of(&out), (ip("192.168.70.9"), 80));
    reset(&mut a, "192.168.70.9", 80);
    // Every candidate refused: taken up as it stands, as before.
    let recovered = a.stats().ct_recovered;
    let (v, out) = run(&mut a, seg(), POD2, 2 * SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(source_of(&out), (ip("10.244.1.6"), 8080), "untranslated");
    assert_eq!(a.stats().ct_recovered, recovered);
    assert_eq!(a.conntrack().len(), 1, "tracked as its own connection");
}

#[test]
fn test_only_the_frontends_whose_choice_gives_the_endpoint_are_candidates() {
    let svc = || {
        let mut s = web(vec![be("10.244.1.6", 8080, 1), be("10.244.2.5", 8080, 2)]);
        s.external_ips.clear();
        s.load_balancer_ips.clear();
        s.node_port = None;
        s
    };
    let (mut here, mut there) = (0, 0);
    for port in 40000..40032u16 {
        // Where a fresh agent sends the client's connection...
        let mut chooser = node(1, ModeSpec::Always, vec![svc()]);
        let syn = tcp("10.244.1.5", "10.96.0.10", port, 80)
            .seq(1000, 0)
            .flags(tcp_flags::SYN)
            .opts(&from_pod(1, 5))
            .frame(&[]);
        let (_, out) = run(&mut chooser, syn, POD, SEC);
        let local = out[0].0 == POD2;
        // ...decides whether the local endpoint's segment is one of its replies.
        let mut a = node(1, ModeSpec::Always, vec![svc()]);
        let (v, out) = run(&mut a, server_data(1, 6, "10.244.1.5", port), POD2, SEC);
        assert_eq!(v, Verdict::Forwarded);
        if local {
            here += 1;
            assert_eq!(source_of(&out), (ip("10.96.0.10"), 80), "port {port}");
        } else {
            there += 1;
            assert_eq!(source_of(&out), (ip("10.244.1.6"), 8080), "port {port}");
            assert_eq!(a.stats().ct_recovered, 0);
        }
    }
    assert!(here > 0 && there > 0, "{here} here, {there} there");
}

#[test]
fn test_a_lost_node_port_connection_is_recovered_at_the_ingress_node() {
    let svc = || web(vec![be("10.244.2.5", 8080, 2)]);
    let mut a = node(1, ModeSpec::CrossSubnet, vec![svc()]);
    let mut b = node(2, ModeSpec::CrossSubnet, vec![svc()]);
    let client = from_gateway(1);
    let syn = to_node_port(&client, 100, 0, tcp_flags::SYN);
    let (_, out) = run(&mut a, syn, UPLINK, SEC);
    let (v, _) = run(&mut b, out[0].1.data.clone(), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded);
    // Node 1's agent starts again with nothing: the endpoint's data, which node 2
    // returns through the tunnel, goes to the client from the node port.
    let mut a = node(1, ModeSpec::CrossSubnet, vec![svc()]);
    let synack = to_client(7000, tcp_flags::SYN | tcp_flags::ACK, &[]);
    run(&mut b, synack, POD, SEC);
    let data = to_client(7001, tcp_flags::ACK | tcp_flags::PSH, b"data");
    let (_, back) = run(&mut b, data, POD, SEC);
    assert_eq!(key_of(&back[0].1.data).dst, ip(NODE1), "through the tunnel");
    let (v, out, tr) = traced(&mut a, back[0].1.data.clone(), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded, "{:?}", tr.events);
    assert_eq!(out[0].0, UPLINK);
    let k = key_of(&out[0].1.data);
    assert_eq!(
        (k.src.ip(), k.src_port, k.dst.ip()),
        (ip(NODE1), 30080, ip(CLIENT))
    );
    // The client's answer takes the connection to the same endpoint, its address kept,
    // through the tunnel.
    let ack = to_node_port(&client, 101, 7005, tcp_flags::ACK);
    let (v, out) = run(&mut a, ack, UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(key_of(&out[0].1.data).dst, ip("192.168.50.20"));
    let inner = key_of(vxlan_inner(&out[0].1.data));
    assert_eq!(
        (inner.src.ip(), inner.dst.ip(), inner.dst_port),
        (ip(CLIENT), ip("10.244.2.5"), 8080)
    );
}

#[test]
fn test_a_client_on_another_node_is_not_recovered_here() {
    let mut a = web_on_node1();
    // Its node translated the connection: the reply leaves untranslated, as before.
    let (v, out) = run(&mut a, server_data(1, 6, "10.244.2.9", 40000), POD2, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out[0].0, UPLINK);
    let inner = key_of(vxlan_inner(&out[0].1.data));
    assert_eq!((inner.src.ip(), inner.src_port), (ip("10.244.1.6"), 8080));
    assert_eq!(a.stats().ct_recovered, 0);
}

#[test]
fn test_without_tcp_pickup_nothing_is_recovered() {
    let mut spec = node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")]);
    spec.services = vec![web(vec![be("10.244.1.6", 8080, 1)])];
    spec.ct.tcp_pickup = Some(false);
    let mut a = compiled(&spec);
    learn(&mut a, 1, "192.168.50.1", GW_MAC);
    let (v, _) = run(&mut a, server_data(1, 6, "10.244.1.5", 40000), POD2, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::CtInvalid));
    assert_eq!(a.stats().ct_recovered, 0);
}

#[test]
fn test_a_lost_node_port_connection_returns_through_its_ingress_node_from_the_endpoints() {
    let svc = || web(vec![be("10.244.2.5", 8080, 2)]);
    let mut a = node(1, ModeSpec::Always, vec![svc()]);
    let client = from_gateway(1);
    let syn = to_node_port(&client, 100, 0, tcp_flags::SYN);
    // The handshake, through node 1 and node 2.
    let mut b = node(2, ModeSpec::Always, vec![svc()]);
    let (_, fwd) = run(&mut a, syn, UPLINK, SEC);
    run(&mut b, fwd[0].1.data.clone(), UPLINK, SEC);
    let synack = to_client(7000, tcp_flags::SYN | tcp_flags::ACK, &[]);
    let (_, back) = run(&mut b, synack, POD, SEC);
    let (v, _) = run(&mut a, back[0].1.data.clone(), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded);
    let ack = || to_node_port(&client, 101, 7001, tcp_flags::ACK);
    let (_, fwd) = run(&mut a, ack(), UPLINK, SEC);
    run(&mut b, fwd[0].1.data.clone(), UPLINK, SEC);
    // Node 2's agent starts again with nothing; node 1 kept the connection.
    let mut b = node(2, ModeSpec::Always, vec![svc()]);
    let data = || to_client(7001, tcp_flags::ACK | tcp_flags::PSH, b"data");
    // First this node's own node port: the client, which does not know it, resets.
    let (_, out) = run(&mut b, data(), POD, SEC);
    let k = key_of(&out[0].1.data);
    assert_eq!((k.src.ip(), k.src_port), (ip("192.168.50.20"), 30080));
    let o = from_gateway(2);
    let rst = tcp(CLIENT, "192.168.50.20", 50000, 30080)
        .seq(101, 0)
        .flags(tcp_flags::RST)
        .opts(&o)
        .frame(&[]);
    let (v, _) = run(&mut b, rst, UPLINK, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::CtInvalid));
    // Then node 1's node port, whose choice gives this endpoint: back to node 1 through
    // the tunnel, untranslated, and node 1 translates it for the client.
    let (v, out, tr) = traced(&mut b, data(), POD, SEC);
    assert_eq!(v, Verdict::Forwarded, "{:?}", tr.events);
    assert!(
        has_event(&tr, "service", "back through node 192.168.50.10"),
        "{:?}",
        tr.events
    );
    assert_eq!(key_of(&out[0].1.data).dst, ip(NODE1), "through the tunnel");
    let inner = key_of(vxlan_inner(&out[0].1.data));
    assert_eq!((inner.src.ip(), inner.src_port), (ip("10.244.2.5"), 8080));
    let (v, to_client) = run(&mut a, out[0].1.data.clone(), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded);
    let k = key_of(&to_client[0].1.data);
    assert_eq!(
        (k.src.ip(), k.src_port, k.dst.ip()),
        (ip(NODE1), 30080, ip(CLIENT))
    );
    // The client's answer reaches node 2 through node 1 and starts the connection there,
    // which returns the endpoint's next segment through node 1 by itself.
    let (_, fwd) = run(&mut a, ack(), UPLINK, SEC);
    let (v, _) = run(&mut b, fwd[0].1.data.clone(), UPLINK, SEC);
    assert_eq!(v, Verdict::Forwarded);
    let recovered = b.stats().ct_recovered;
    let (_, out) = run(&mut b, data(), POD, SEC);
    assert_eq!(key_of(&out[0].1.data).dst, ip(NODE1));
    assert_eq!(b.stats().ct_recovered, recovered, "by the connection now");
}

#[test]
fn test_the_random_balance_recovers_nothing() {
    let mut spec = node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")]);
    spec.services = vec![web(vec![be("10.244.1.6", 8080, 1)])];
    spec.balance.mode = crate::lb::BalanceMode::Random;
    let mut a = compiled(&spec);
    learn(&mut a, 1, "192.168.50.1", GW_MAC);
    let (v, out) = run(&mut a, server_data(1, 6, "10.244.1.5", 40000), POD2, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(source_of(&out), (ip("10.244.1.6"), 8080), "untranslated");
    assert_eq!(a.stats().ct_recovered, 0);
}

#[test]
fn test_a_connection_policy_would_deny_now_is_not_recovered() {
    use super::policy_tests::{ingress_to_b, node_with};
    let svc = || web(vec![be("10.244.1.6", 8080, 1)]);
    // Pod b (the endpoint) takes port 8080 from 10.244.9.0/24 only: not from pod a.
    let mut a = node_with(1, vec![svc()], ingress_to_b("10.244.9.0/24", Some(8080)));
    let (_, out) = run(&mut a, server_data(1, 6, "10.244.1.5", 40000), POD2, SEC);
    assert_ne!(source_of(&out), (ip("10.96.0.10"), 80));
    assert_eq!(a.stats().ct_recovered, 0);
    // From pod a allowed: recovered.
    let mut a = node_with(1, vec![svc()], ingress_to_b("10.244.1.0/24", Some(8080)));
    let (_, out) = run(&mut a, server_data(1, 6, "10.244.1.5", 40000), POD2, SEC);
    assert_eq!(source_of(&out), (ip("10.96.0.10"), 80));
    assert_eq!(a.stats().ct_recovered, 1);
}

#[test]
fn test_connections_being_recovered_are_bounded_and_swept() {
    let mut a = web_on_node1();
    for i in 0..recover::MAX_RECOVERING {
        let port = 1024 + i as u16;
        run(&mut a, server_data(1, 6, "10.244.1.5", port), POD2, SEC);
    }
    assert_eq!(a.stats().ct_recovered, recover::MAX_RECOVERING as u64);
    // Full: the next is taken up as before.
    let (_, out) = run(&mut a, server_data(1, 6, "10.244.1.5", 60000), POD2, SEC);
    assert_eq!(source_of(&out), (ip("10.244.1.6"), 8080));
    // Once the records' time has passed, the sweep makes room again.
    let later = SEC + recover::RECOVERING_KEEP_NS;
    a.tick(later, &mut Vec::new());
    let (_, out) = run(&mut a, server_data(1, 6, "10.244.1.5", 60001), POD2, later);
    assert_eq!(source_of(&out), (ip("10.96.0.10"), 80));
}
