//! Handing a pipeline's state over to a new one, through real packets: connections
//! opened in the old pipeline, its state saved, encoded, decoded and restored into a new
//! one, then the next packets of each connection sent to both: the new pipeline must
//! forward and translate them exactly as the old one does.

use super::test_support::*;
use super::*;
use crate::handover::{Dropped, RestoreError, Restored, SavedState, decode, encode};

pub(super) const CLIENT: &str = "192.168.60.7";
pub(super) const NODE1: &str = "192.168.50.10";

/// The Service ports of node 1: a TCP Service with a local endpoint of each family, a
/// UDP one with session affinity and endpoints on both nodes, and a node port whose
/// endpoint is on node 2, reached from this node's address (SNAT).
pub(super) fn services(web_v4: bool) -> Vec<ServiceSpec> {
    let mut web = vec![be("fd00:10:244:1::6", 8080, 1)];
    if web_v4 {
        web.push(be("10.244.1.6", 8080, 1));
    }
    vec![
        ServiceSpec {
            name: "default/web:http".into(),
            proto: "tcp".into(),
            port: 80,
            cluster_ips: vec![ip("10.96.0.10"), ip("fd00:96::10")],
            backends: web,
            ..ServiceSpec::default()
        },
        ServiceSpec {
            name: "default/dns:dns".into(),
            proto: "udp".into(),
            port: 53,
            cluster_ips: vec![ip("10.96.0.11")],
            affinity_timeout_s: Some(10),
            backends: vec![be("10.244.1.6", 53, 1), be("10.244.2.5", 53, 2)],
            ..ServiceSpec::default()
        },
        ServiceSpec {
            name: "default/np:http".into(),
            proto: "tcp".into(),
            port: 81,
            cluster_ips: vec![ip("10.96.0.12")],
            node_port: Some(30081),
            external_snat: true,
            backends: vec![be("10.244.2.5", 8080, 2)],
            ..ServiceSpec::default()
        },
    ]
}

/// Node 1 with `services`, new: nothing learnt. When `reordered`, its ports are in
/// another order (the uplink last).
pub(super) fn fresh(services: Vec<ServiceSpec>, reordered: bool) -> Pipeline {
    let mut spec = node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")]);
    spec.services = services;
    if reordered {
        spec.ports.rotate_left(1);
    }
    compiled(&spec)
}

/// Node 1 with `services`, its gateway and node 2 learnt.
pub(super) fn node1(services: Vec<ServiceSpec>) -> Pipeline {
    let mut p = fresh(services, false);
    learn(&mut p, 1, "192.168.50.1", GW_MAC);
    learn(&mut p, 1, "192.168.50.20", uplink_mac(2));
    p
}

/// A frame sent to `port` (by name), and what came out: each packet with its port's
/// name.
pub(super) type Out = (Verdict, Vec<(String, Vec<u8>)>);

pub(super) fn send(p: &mut Pipeline, port: &str, frame: Vec<u8>, t: u64) -> Out {
    let id = p
        .tables()
        .ports
        .iter()
        .position(|x| x.name == port)
        .unwrap();
    let (v, out) = run(p, frame, id as PortId, t);
    let named = out
        .into_iter()
        .map(|(id, pkt)| (p.tables().ports[usize::from(id)].name.clone(), pkt.data))
        .collect();
    (v, named)
}

/// [`send`], which must forward.
pub(super) fn forward(p: &mut Pipeline, port: &str, frame: Vec<u8>) -> Out {
    let got = send(p, port, frame, SEC);
    assert_eq!(got.0, Verdict::Forwarded, "from {port}");
    assert!(!got.1.is_empty());
    got
}

pub(super) fn client() -> IpOpts {
    IpOpts {
        src_mac: GW_MAC,
        dst_mac: uplink_mac(1),
        ..IpOpts::default()
    }
}

/// The inner frame of VXLAN from node 2 (its MACs are ignored).
pub(super) fn from_node2() -> IpOpts {
    IpOpts {
        src_mac: [0x0e, 0xfe, 0, 0, 0, 2],
        dst_mac: [0x0e, 0xfe, 0, 0, 0, 1],
        ..IpOpts::default()
    }
}

pub(super) fn tunnelled(inner: Vec<u8>) -> Vec<u8> {
    overlay::encapsulate(&inner, &tunnel(2, 1, 7))
}

/// The next packets of one connection: its name, then each packet's port and frame.
pub(super) type Next = Vec<(&'static str, &'static str, Vec<u8>)>;

pub(super) const ACK: u8 = tcp_flags::ACK;
const SYN: u8 = tcp_flags::SYN;
pub(super) const PSH: u8 = tcp_flags::PSH;

/// A TCP handshake from `a` (on port `pa`, with `oa`) to `b` (`pb`, `ob`; `b_to` is
/// where `b` answers to and `b_from` what it answers from), then the next packets: data
/// both ways.
#[allow(clippy::too_many_arguments)]
pub(super) fn handshake(
    p: &mut Pipeline,
    name: &'static str,
    (pa, a, sa, oa): (&'static str, &str, u16, IpOpts),
    (pb, b, sb, ob): (&'static str, &str, u16, IpOpts),
    (b_from, fb, b_to, tb): (&str, u16, &str, u16),
    wrap: [fn(Vec<u8>) -> Vec<u8>; 2],
    next: &mut Next,
) {
    let there = |seq, ack, flags, data: &[u8]| {
        wrap[0](
            tcp(a, b, sa, sb)
                .seq(seq, ack)
                .flags(flags)
                .opts(&oa)
                .frame(data),
        )
    };
    let back = |seq, ack, flags, data: &[u8]| {
        wrap[1](
            tcp(b_from, b_to, fb, tb)
                .seq(seq, ack)
                .flags(flags)
                .opts(&ob)
                .frame(data),
        )
    };
    forward(p, pa, there(1000, 0, SYN, &[]));
    forward(p, pb, back(7000, 1001, SYN | ACK, &[]));
    forward(p, pa, there(1001, 7001, ACK, &[]));
    next.push((name, pa, there(1001, 7001, ACK | PSH, b"GET /")));
    next.push((name, pb, back(7001, 1006, ACK | PSH, b"200 OK")));
}

pub(super) fn same(f: Vec<u8>) -> Vec<u8> {
    f
}

/// Opens the connections of the tests in `p` at 1 s: TCP to a cluster IP (IPv4 and
/// IPv6), the node port SNATed to node 2's endpoint, a connection node 2 forwarded
/// here (tunnel peer), UDP to the Service with affinity, ICMP echo to node 2's pod.
/// Returns the next packets of each.
fn open(p: &mut Pipeline) -> Next {
    let mut next = Next::new();
    let (pod_a, pod_b) = (from_pod(1, 5), from_pod(1, 6));
    handshake(
        p,
        "tcp4",
        ("pod-a", "10.244.1.5", 40000, pod_a),
        ("pod-b", "10.96.0.10", 80, pod_b),
        ("10.244.1.6", 8080, "10.244.1.5", 40000),
        [same as fn(Vec<u8>) -> Vec<u8>, same],
        &mut next,
    );
    handshake(
        p,
        "tcp6",
        ("pod-a", "fd00:10:244:1::5", 40000, pod_a),
        ("pod-b", "fd00:96::10", 80, pod_b),
        ("fd00:10:244:1::6", 8080, "fd00:10:244:1::5", 40000),
        [same as fn(Vec<u8>) -> Vec<u8>, same],
        &mut next,
    );
    // The node port: its translated source port is the node's choice.
    let syn = tcp(CLIENT, NODE1, 50000, 30081)
        .seq(100, 0)
        .flags(SYN)
        .opts(&client())
        .frame(&[]);
    let (_, out) = forward(p, "eth0", syn);
    let port = key_of(vxlan_inner(&out[0].1)).src_port;
    let endpoint = |seq, ack, flags, data: &[u8]| {
        tunnelled(
            tcp("10.244.2.5", NODE1, 8080, port)
                .seq(seq, ack)
                .flags(flags)
                .opts(&from_node2())
                .frame(data),
        )
    };
    let client_seg = |seq, ack, flags, data: &[u8]| {
        tcp(CLIENT, NODE1, 50000, 30081)
            .seq(seq, ack)
            .flags(flags)
            .opts(&client())
            .frame(data)
    };
    forward(p, "eth0", endpoint(7000, 101, SYN | ACK, &[]));
    forward(p, "eth0", client_seg(101, 7001, ACK, &[]));
    next.push((
        "node port",
        "eth0",
        client_seg(101, 7001, ACK | PSH, b"GET /"),
    ));
    next.push((
        "node port",
        "eth0",
        endpoint(7001, 106, ACK | PSH, b"200 OK"),
    ));
    handshake(
        p,
        "tunnel peer",
        ("eth0", CLIENT, 50001, from_node2()),
        ("pod-b", "10.244.1.6", 8080, pod_b),
        ("10.244.1.6", 8080, CLIENT, 50001),
        [tunnelled as fn(Vec<u8>) -> Vec<u8>, same],
        &mut next,
    );
    // UDP to whichever endpoint the Service gives.
    let query = || build::udp(ip("10.244.1.5"), ip("10.96.0.11"), 5000, 53, b"q", &pod_a);
    let (_, out) = forward(p, "pod-a", query());
    let answer = if out[0].0 == "pod-b" {
        (
            "pod-b",
            build::udp(ip("10.244.1.6"), ip("10.244.1.5"), 53, 5000, b"a", &pod_b),
        )
    } else {
        let inner = build::udp(
            ip("10.244.2.5"),
            ip("10.244.1.5"),
            53,
            5000,
            b"a",
            &from_node2(),
        );
        ("eth0", tunnelled(inner))
    };
    forward(p, answer.0, answer.1.clone());
    next.push(("udp", "pod-a", query()));
    next.push(("udp", answer.0, answer.1));
    let ping =
        |seq| build::echo_request(ip("10.244.1.5"), ip("10.244.2.6"), 77, seq, b"ping", &pod_a);
    let pong = |seq| {
        let inner = build::echo_reply(
            ip("10.244.2.6"),
            ip("10.244.1.5"),
            77,
            seq,
            b"ping",
            &from_node2(),
        );
        tunnelled(inner)
    };
    forward(p, "pod-a", ping(1));
    forward(p, "eth0", pong(1));
    next.push(("echo", "pod-a", ping(2)));
    next.push(("echo", "eth0", pong(2)));
    // A datagram whose first fragment came before the handover and its last after.
    let big = build::udp(
        ip("10.244.1.5"),
        ip("10.244.2.6"),
        6000,
        7000,
        &build::pattern(1400, 5),
        &pod_a,
    );
    let mut fr = frags(big, 99, 1000);
    assert_eq!(fr.len(), 2);
    assert_eq!(send(p, "pod-a", fr.remove(0), SEC).0, Verdict::Held);
    next.push(("fragments", "pod-a", fr.remove(0)));
    next
}

/// Node 1 with its connections open, and their next packets.
pub(super) fn opened() -> (Pipeline, Next) {
    let mut p = node1(services(true));
    let next = open(&mut p);
    (p, next)
}

/// The state saved at 5 s, through its bytes.
pub(super) fn handed_over(old: &Pipeline) -> SavedState {
    let saved = old.save_state(5 * SEC);
    let back = decode(&encode(&saved)).unwrap();
    assert_eq!(back, saved);
    back
}

/// The next packets sent to `old` (from 6 s on) and `new` (from 21 s on, its clock 15 s
/// ahead): the same verdicts and the same frames out of the same ports; then the same
/// state in both.
pub(super) fn continues(old: &mut Pipeline, new: &mut Pipeline, next: Next) {
    for (i, (conn, port, frame)) in next.into_iter().enumerate() {
        let t = i as u64 * 1000;
        let was = send(old, port, frame.clone(), 6 * SEC + t);
        let got = send(new, port, frame, 21 * SEC + t);
        assert_eq!(was.0, Verdict::Forwarded, "{conn}, packet {i}");
        assert_eq!(got, was, "{conn}, packet {i} from {port}");
    }
    assert_eq!(
        ordered(new.save_state(22 * SEC)),
        ordered(old.save_state(7 * SEC))
    );
}

/// `s` with its connections in the order of their original tuples (a table's order is
/// that of its free slots).
pub(super) fn ordered(mut s: SavedState) -> SavedState {
    s.connections.sort_by_key(|c| {
        let o = &c.original;
        (c.zone, c.proto, o.src, o.dst, o.src_port, o.dst_port)
    });
    s
}

#[test]
fn test_connections_continue_in_a_new_pipeline_exactly_as_in_the_old_one() {
    for reordered in [false, true] {
        let (mut old, next) = opened();
        let saved = handed_over(&old);
        let counts = |s: &SavedState| {
            (
                s.connections.len(),
                s.affinity.len(),
                s.neighbours.len(),
                s.datagrams.len(),
            )
        };
        assert_eq!(counts(&saved), (6, 1, 2, 1));
        let mut new = fresh(services(true), reordered);
        let r = new.restore_state(&saved, 20 * SEC).unwrap();
        assert_eq!(
            r,
            Restored {
                connections: 6,
                affinity: 1,
                neighbours: 2,
                datagrams: 1,
                dropped: Dropped::default()
            }
        );
        assert_eq!(new.save_state(20 * SEC), saved, "every record as it was");
        continues(&mut old, &mut new, next);
    }
}

#[test]
fn test_a_new_pipeline_without_the_state_does_not_continue_them() {
    // What the test above compares would not hold without the state.
    let (mut old, next) = opened();
    let mut cold = node1(services(true));
    let differs = next.into_iter().any(|(_, port, frame)| {
        send(&mut old, port, frame.clone(), 6 * SEC) != send(&mut cold, port, frame, 21 * SEC)
    });
    assert!(differs);
}

#[test]
fn test_connections_to_an_endpoint_gone_are_dropped_as_a_swap_drops_them() {
    let (mut old, next) = opened();
    let saved = handed_over(&old);
    let mut new = fresh(services(false), false);
    let r = new.restore_state(&saved, 20 * SEC).unwrap();
    assert_eq!((r.connections, r.dropped.ct_endpoint_gone), (5, 1), "{r}");
    assert!(
        r.to_string().contains("1 connections to an endpoint gone"),
        "{r}"
    );
    let tcp4 = FlowKey {
        zone: 0,
        src: ip("10.244.1.5").into(),
        dst: ip("10.96.0.10").into(),
        proto: crate::flow::proto::TCP,
        src_port: 40000,
        dst_port: 80,
    };
    assert!(new.conntrack().lookup(&tcp4).is_none());
    // The same swap on the old pipeline drops the same connection.
    let report = old.set_tables(new.tables().clone());
    assert_eq!(report.ct_removed, 1);
    assert!(old.conntrack().lookup(&tcp4).is_none());
    let rest = next.into_iter().filter(|(c, _, _)| *c != "tcp4").collect();
    continues(&mut old, &mut new, rest);
}

#[test]
fn test_restored_nat_ports_stay_taken_and_affinity_keeps_its_time() {
    let (old, _) = opened();
    let saved = handed_over(&old);
    let np = saved
        .connections
        .iter()
        .find(|c| c.original.dst_port == 30081)
        .unwrap();
    let port = np.reply.dst_port;
    let kept = saved.affinity[0].endpoint;
    let mut new = fresh(services(true), false);
    new.restore_state(&saved, 20 * SEC).unwrap();
    let mut cold = node1(services(true));
    // Another client from the same source port: the node keeps the port when it is free.
    let syn = || {
        tcp("192.168.60.8", NODE1, port, 30081)
            .flags(SYN)
            .opts(&client())
            .frame(&[])
    };
    let src_port = |out: &Out| key_of(vxlan_inner(&out.1[0].1)).src_port;
    assert_eq!(src_port(&send(&mut cold, "eth0", syn(), 21 * SEC)), port);
    assert_ne!(src_port(&send(&mut new, "eth0", syn(), 21 * SEC)), port);

    // The client keeps its endpoint: its record had 6 s left at the save.
    for sport in 6000..6010 {
        let q = build::udp(
            ip("10.244.1.5"),
            ip("10.96.0.11"),
            sport,
            53,
            b"q",
            &from_pod(1, 5),
        );
        let (_, out) = send(&mut new, "pod-a", q, 21 * SEC);
        let to = if out[0].0 == "pod-b" {
            key_of(&out[0].1).dst.ip()
        } else {
            key_of(vxlan_inner(&out[0].1)).dst.ip()
        };
        assert_eq!(to, kept);
    }
    // Without another connection from it, the record lapses 6 s after the restore.
    let mut idle = fresh(services(true), false);
    idle.restore_state(&saved, 20 * SEC).unwrap();
    idle.tick(25 * SEC, &mut Vec::new());
    assert_eq!(idle.affinity().len(), 1);
    idle.tick(27 * SEC, &mut Vec::new());
    assert_eq!(idle.affinity().len(), 0);
}

#[test]
fn test_a_refused_restore_leaves_the_pipeline_as_it_was() {
    let (old, _) = opened();
    let saved = handed_over(&old);
    let mut new = fresh(services(true), false);
    let before = *new.conntrack().stats();

    let mut other = saved.clone();
    other.meta.node = "node2".into();
    let e = new.restore_state(&other, 20 * SEC).unwrap_err();
    assert_eq!(
        e,
        RestoreError::OtherNode {
            saved: "node2".into(),
            here: "node1".into()
        }
    );

    let mut impossible = saved.clone();
    impossible.connections[5].reply.src = ip("fd00::1");
    let e = new.restore_state(&impossible, 20 * SEC).unwrap_err();
    assert!(matches!(e, RestoreError::Invalid(_)), "{e:?}");
    assert!(e.to_string().contains("record 5"), "{e}");

    let mut shared = saved.clone();
    shared.connections.push(shared.connections[2].clone());
    let e = new.restore_state(&shared, 20 * SEC).unwrap_err();
    assert_eq!(e, RestoreError::SharedTuple { index: 6 });

    assert!(new.conntrack().is_empty() && new.affinity().is_empty());
    assert!(new.neighbours().is_empty() && new.reassembler().held_datagrams() == 0);
    assert_eq!(*new.conntrack().stats(), before);
    assert_eq!(new.save_state(20 * SEC).connections, vec![]);

    // Still a new pipeline: the state goes in, once.
    assert_eq!(new.restore_state(&saved, 20 * SEC).unwrap().connections, 6);
    let e = new.restore_state(&saved, 20 * SEC).unwrap_err();
    assert_eq!(
        e,
        RestoreError::NotEmpty {
            connections: 6,
            affinity: 1,
            neighbours: 2,
            datagrams: 1
        }
    );
    assert_eq!(new.save_state(20 * SEC), saved);
}

#[test]
fn test_times_are_rebased_and_expired_connections_left_out() {
    let (old, _) = opened();
    let saved = handed_over(&old);
    // A new clock younger than the connections: their times start at its start.
    let mut young = fresh(services(true), false);
    assert_eq!(young.restore_state(&saved, SEC).unwrap().connections, 6);
    let c = &young.save_state(SEC).connections[0];
    assert_eq!((c.first_seen_ago_ns, c.last_seen_ago_ns), (SEC, SEC));
    // The 30 s of UDP and ICMP echo are over when they have not been seen for 31.
    let mut late = saved.clone();
    for c in &mut late.connections {
        c.first_seen_ago_ns += 27 * SEC;
        c.last_seen_ago_ns += 27 * SEC;
    }
    let mut new = fresh(services(true), false);
    let r = new.restore_state(&late, 100 * SEC).unwrap();
    assert_eq!((r.connections, r.dropped.ct_expired), (4, 2), "{r}");
}

/// A connection reset before any reply is due at once: its last time is set back by a
/// timeout, before its first packet when the clock is young. Its record must still be
/// one a restore takes (an agent that had just started after a crash refused every
/// handover while it held one).
#[test]
fn test_a_connection_reset_before_its_reply_on_a_young_clock_is_handed_over() {
    let mut old = node1(services(true));
    let pod_a = from_pod(1, 5);
    let syn = tcp("10.244.1.5", "10.96.0.10", 41000, 80)
        .seq(1000, 0)
        .flags(SYN)
        .opts(&pod_a)
        .frame(&[]);
    assert_eq!(send(&mut old, "pod-a", syn, SEC).0, Verdict::Forwarded);
    let rst = tcp("10.244.1.5", "10.96.0.10", 41000, 80)
        .seq(1001, 0)
        .flags(tcp_flags::RST)
        .opts(&pod_a)
        .frame(&[]);
    assert_eq!(send(&mut old, "pod-a", rst, 2 * SEC).0, Verdict::Forwarded);
    let saved = old.save_state(2 * SEC);
    assert_eq!(saved.connections.len(), 1, "due, not yet reaped");
    let c = &saved.connections[0];
    assert!(c.first_seen_ago_ns >= c.last_seen_ago_ns, "{c:?}");
    let bytes = encode(&saved);
    let mut new = fresh(services(true), false);
    let r = new
        .restore_state(&decode(&bytes).unwrap(), 2 * SEC)
        .unwrap();
    assert_eq!(r.connections + r.dropped.ct_expired, 1, "{r}");
}

/// Version skew: the previous format's state (the version 1 fixture) restores with what
/// it holds, and its connections go on.
#[test]
fn test_a_version_1_state_restores_what_it_holds() {
    let v1 = decode(include_bytes!("../../tests/data/handover-v1.bin")).unwrap();
    assert_eq!(v1.format, 1);
    let mut new = fresh(services(true), false);
    let r = new.restore_state(&v1, 20 * SEC).unwrap();
    // Its IPv6 UDP connection went to an endpoint these tables do not have.
    let want = Restored {
        connections: 4,
        affinity: 1,
        dropped: Dropped {
            ct_endpoint_gone: 1,
            ..Dropped::default()
        },
        ..Restored::default()
    };
    assert_eq!(r, want);
    // No neighbours in version 1: learnt again.
    learn(&mut new, 1, "192.168.50.1", GW_MAC);
    let seg = tcp("10.244.1.5", "10.96.0.10", 40000, 80)
        .seq(1001, 7001)
        .flags(ACK)
        .opts(&from_pod(1, 5))
        .frame(b"more");
    let (_, out) = forward(&mut new, "pod-a", seg);
    let k = key_of(&out[0].1);
    assert_eq!(out[0].0, "pod-b");
    assert_eq!((k.dst, k.dst_port), (ip("10.244.1.6").into(), 8080));
    let answer = tcp("10.244.1.6", "10.244.1.5", 8080, 40000)
        .seq(7001, 1005)
        .flags(ACK)
        .opts(&from_pod(1, 6))
        .frame(&[]);
    let (_, out) = forward(&mut new, "pod-b", answer);
    let k = key_of(&out[0].1);
    assert_eq!((k.src, k.src_port), (ip("10.96.0.10").into(), 80));
}

/// What the new tables' limits and policy do not allow is left out and counted.
#[test]
fn test_the_new_tables_limits_and_reevaluated_policy_leave_connections_out() {
    let (old, _) = opened();
    let saved = handed_over(&old);
    let spec = || {
        let mut s = node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")]);
        s.services = services(true);
        s
    };
    let mut small = spec();
    small.ct.max_entries = Some(4);
    small.ipf.max_bytes = Some(500);
    let mut new = compiled(&small);
    let r = new.restore_state(&saved, 20 * SEC).unwrap();
    assert_eq!((r.connections, r.dropped.ct_table_full), (4, 2), "{r}");
    assert_eq!((r.datagrams, r.dropped.frag_table_full), (0, 1), "{r}");
    assert!(
        r.to_string()
            .contains("2 connections over the table's size"),
        "{r}"
    );

    // Nothing may leave pod-a: its four connections go when the policy says to judge
    // tracked connections again (as a swap to it would), and stay otherwise.
    for reevaluate in [false, true] {
        let mut s = spec();
        s.policy = crate::policy::PolicySpec {
            reevaluate,
            ..super::policy_tests::no_egress_from_a()
        };
        let mut new = compiled(&s);
        let r = new.restore_state(&saved, 20 * SEC).unwrap();
        let denied = if reevaluate { 4 } else { 0 };
        assert_eq!(
            (r.connections, r.dropped.ct_policy_denied),
            (6 - denied, denied),
            "{r}"
        );
    }
}
