//! NAT and RELATED tests: packets translated both ways, checksums right, port allocation,
//! hairpin, and ICMP errors translated outside and in.

use super::tests::{S, ip, ping, pkt_in, pong, run, tcp, udp};
use super::*;
use crate::flow::Addr;
use crate::icmp::{ErrorKind, build_error};
use crate::wire::build::tcp_flags::*;
use crate::wire::checksum::{add, checksum, finish, pseudo_v4, pseudo_v6};
use crate::wire::icmp_error::embedded;
use crate::wire::parse::v6_octets;
use crate::wire::{L3, parse};
use std::net::IpAddr;

/// Parses the frame again (IPv4 header checksum included) and checks the L4 checksum.
fn reparsed(p: &tests::Pkt) -> Parsed {
    let f = &p.pkt.data;
    let q = parse(f, p.parsed.key.zone).expect("frame still parses");
    let l4 = &f[q.l4_off..q.ip_end];
    let sum = match (q.l3, q.key.src.ip(), q.key.dst.ip()) {
        (L3::Ipv4, IpAddr::V4(s), IpAddr::V4(d)) if q.proto != proto::ICMP => finish(add(
            l4,
            pseudo_v4(s.octets(), d.octets(), q.proto, l4.len() as u16),
        )),
        (L3::Ipv4, _, _) => checksum(l4),
        _ => finish(add(
            l4,
            pseudo_v6(
                &v6_octets(q.key.src),
                &v6_octets(q.key.dst),
                q.proto,
                l4.len() as u32,
            ),
        )),
    };
    assert_eq!(sum, 0, "L4 checksum of {}", q.key);
    assert_eq!(q.key, p.parsed.key, "parsed.key follows the rewrite");
    q
}

fn dnat(addr: &str, port: Option<u16>) -> Nat {
    Nat {
        dnat: Some((ip(addr).into(), port)),
        snat: None,
    }
}

fn snat(addr: &str, range: Option<(u16, u16)>) -> Nat {
    Nat {
        dnat: None,
        snat: Some((ip(addr).into(), range)),
    }
}

fn key(p: &tests::Pkt) -> (IpAddr, u16, IpAddr, u16) {
    let k = p.parsed.key;
    (k.src.ip(), k.src_port, k.dst.ip(), k.dst_port)
}

#[test]
fn dnat_translates_original_direction_and_reverses_replies() {
    let mut ct = Conntrack::new(Config::default());
    let nat = dnat("10.244.1.5", Some(8080));
    let mut syn = tcp("10.0.0.1", 40000, "10.96.0.10", 80, 1000, 0, SYN, 0);
    let r = run(&mut ct, &mut syn, Some(&nat), 0);
    assert_eq!(r.state, CtState::New);
    assert_eq!(
        key(&syn),
        (ip("10.0.0.1"), 40000, ip("10.244.1.5"), 8080),
        "the first packet leaves translated"
    );
    reparsed(&syn);
    let e = ct.get(r.entry.unwrap()).unwrap();
    assert!(e.status.has(Status::DNAT) && !e.status.has(Status::SNAT));
    assert_eq!(
        (
            e.reply().src,
            e.reply().src_port,
            e.reply().dst,
            e.reply().dst_port
        ),
        (ip("10.244.1.5").into(), 8080, ip("10.0.0.1").into(), 40000)
    );
    let mut synack = tcp(
        "10.244.1.5",
        8080,
        "10.0.0.1",
        40000,
        5000,
        1001,
        SYN | ACK,
        0,
    );
    let r = run(&mut ct, &mut synack, None, 1);
    assert_eq!((r.state, r.reply), (CtState::Established, true));
    assert_eq!(key(&synack), (ip("10.96.0.10"), 80, ip("10.0.0.1"), 40000));
    reparsed(&synack);
    // Later packets of the original direction need no NAT argument.
    let mut ack = tcp("10.0.0.1", 40000, "10.96.0.10", 80, 1001, 5001, ACK, 20);
    let r = run(&mut ct, &mut ack, None, 2);
    assert_eq!(r.state, CtState::Established);
    assert_eq!(key(&ack), (ip("10.0.0.1"), 40000, ip("10.244.1.5"), 8080));
    reparsed(&ack);
}

#[test]
fn nat_that_changes_nothing_never_changes_ports() {
    let mut ct = Conntrack::new(Config::default());
    let nat = snat("10.0.0.1", Some((30000, 40000)));
    let mut p = udp("10.0.0.1", 34567, "10.0.0.9", 53);
    let before = p.pkt.data.clone();
    let r = run(&mut ct, &mut p, Some(&nat), 0);
    assert_eq!(p.pkt.data, before, "not a byte changed");
    let e = ct.get(r.entry.unwrap()).unwrap();
    assert!(!e.status.nat());
    // SNAT to another address keeps the port when it is free.
    let nat = snat("192.168.1.1", Some((30000, 40000)));
    let mut p = udp("10.0.0.2", 34567, "10.0.0.9", 53);
    run(&mut ct, &mut p, Some(&nat), 0);
    assert_eq!(key(&p).0, ip("192.168.1.1"));
    assert_eq!(key(&p).1, 34567);
    reparsed(&p);
}

#[test]
fn snat_collision_gets_another_port_in_range() {
    let mut ct = Conntrack::new(Config::default());
    let nat = snat("192.168.1.1", Some((30000, 30010)));
    let mut a = udp("10.0.0.1", 30005, "8.8.8.8", 53);
    let mut b = udp("10.0.0.2", 30005, "8.8.8.8", 53);
    let ea = run(&mut ct, &mut a, Some(&nat), 0).entry.unwrap();
    let eb = run(&mut ct, &mut b, Some(&nat), 0).entry.unwrap();
    assert_eq!(key(&a).1, 30005);
    let pb = key(&b).1;
    assert_ne!(pb, 30005);
    assert!((30000..=30010).contains(&pb));
    reparsed(&b);
    assert_ne!(ct.get(ea).unwrap().reply(), ct.get(eb).unwrap().reply());
    // A port outside the range is moved into it.
    let mut c = udp("10.0.0.3", 5000, "8.8.8.8", 53);
    run(&mut ct, &mut c, Some(&nat), 0);
    assert!((30000..=30010).contains(&key(&c).1));
    // Replies reach the right clients.
    let mut rb = udp("8.8.8.8", 53, "192.168.1.1", pb);
    let r = run(&mut ct, &mut rb, None, 1);
    assert_eq!((r.state, r.entry), (CtState::Established, Some(eb)));
    assert_eq!(key(&rb), (ip("8.8.8.8"), 53, ip("10.0.0.2"), 30005));
    reparsed(&rb);
}

#[test]
fn nat_port_exhaustion_refuses_new_and_keeps_existing() {
    let mut ct = Conntrack::new(Config::default());
    let nat = snat("192.168.1.1", Some((30000, 30001)));
    let e1 = run(
        &mut ct,
        &mut udp("10.0.0.1", 1, "8.8.8.8", 53),
        Some(&nat),
        0,
    )
    .entry;
    let e2 = run(
        &mut ct,
        &mut udp("10.0.0.2", 1, "8.8.8.8", 53),
        Some(&nat),
        0,
    )
    .entry;
    let mut third = udp("10.0.0.3", 1, "8.8.8.8", 53);
    let before = third.pkt.data.clone();
    let r = ct.process(&mut third.pkt, &mut third.parsed, Some(&nat), 0);
    assert_eq!(r, Err(DropReason::NatPortExhausted));
    assert_eq!(ct.stats().nat_port_exhausted, 1);
    assert_eq!(third.pkt.data, before, "refused packet not rewritten");
    assert_eq!(ct.len(), 2);
    for (e, c) in [(e1, "10.0.0.1"), (e2, "10.0.0.2")] {
        let mut p = udp(c, 1, "8.8.8.8", 53);
        let r = run(&mut ct, &mut p, None, 1);
        assert_eq!((r.state, r.entry), (CtState::Established, e));
    }
}

#[test]
fn concurrent_first_udp_packets_to_a_service_get_distinct_reply_tuples() {
    // Two clients behind the same masquerade address, same source port, same service:
    // the second one's reply tuple would collide, so it gets another port.
    let mut ct = Conntrack::new(Config::default());
    let nat = Nat {
        dnat: Some((Addr::from(ip("10.244.1.5")), Some(5353))),
        snat: Some((Addr::from(ip("10.0.0.100")), None)),
    };
    let mut a = udp("10.1.0.1", 40000, "10.96.0.10", 53);
    let mut b = udp("10.1.0.2", 40000, "10.96.0.10", 53);
    let ra = ct
        .process(&mut a.pkt, &mut a.parsed, Some(&nat), 0)
        .unwrap();
    let ia = ct.commit(ra.pending.unwrap(), 0).unwrap();
    let rb = ct
        .process(&mut b.pkt, &mut b.parsed, Some(&nat), 0)
        .unwrap();
    let ib = ct.commit(rb.pending.unwrap(), 0).unwrap();
    ct.check();
    let (ea, eb) = (ct.get(ia).unwrap(), ct.get(ib).unwrap());
    assert_ne!(ea.reply(), eb.reply());
    assert_eq!(key(&a), (ip("10.0.0.100"), 40000, ip("10.244.1.5"), 5353));
    assert_eq!(key(&b).0, ip("10.0.0.100"));
    assert!(key(&b).1 >= 1024 && key(&b).1 != 40000);
    // Without SNAT, different clients have distinct reply tuples by themselves.
    let mut ct = Conntrack::new(Config::default());
    let nat = dnat("10.244.1.5", Some(5353));
    let ia = run(
        &mut ct,
        &mut udp("10.1.0.1", 40000, "10.96.0.10", 53),
        Some(&nat),
        0,
    );
    let ib = run(
        &mut ct,
        &mut udp("10.1.0.2", 40000, "10.96.0.10", 53),
        Some(&nat),
        0,
    );
    assert_eq!((ia.state, ib.state), (CtState::New, CtState::New));
    assert_eq!(ct.len(), 2);
}

/// A pod's connection to a Service address, translated to endpoint 10.244.2.5:8080,
/// from `sport`: its reply tuple is 10.244.2.5:8080 -> 10.244.1.7:`sport`.
fn via_service(ct: &mut Conntrack, sport: u16) -> EntryId {
    let mut p = tcp("10.244.1.7", sport, "10.96.0.10", 80, 1000, 0, SYN, 0);
    let r = run(ct, &mut p, Some(&dnat("10.244.2.5", Some(8080))), 0);
    assert_eq!(r.state, CtState::New);
    assert_eq!(key(&p), (ip("10.244.1.7"), sport, ip("10.244.2.5"), 8080));
    r.entry.unwrap()
}

/// The same client port to the same endpoint again, through a second Service address
/// or directly: the reply tuple is taken, so the new connection gets another source
/// port (Linux's null binding) instead of being refused, and both connections work.
#[test]
fn reply_clash_without_snat_gets_another_source_port() {
    for second in [Some(dnat("10.244.2.5", Some(8080))), None] {
        let mut ct = Conntrack::new(Config::default());
        let first = via_service(&mut ct, 40000);
        let dst = if second.is_some() {
            "10.96.0.11"
        } else {
            "10.244.2.5"
        };
        let dport = if second.is_some() { 80 } else { 8080 };
        let mut syn = tcp("10.244.1.7", 40000, dst, dport, 7000, 0, SYN, 0);
        let r = run(&mut ct, &mut syn, second.as_ref(), 1);
        assert_eq!(r.state, CtState::New, "{second:?}");
        let id = r.entry.unwrap();
        let (src, port, to, to_port) = key(&syn);
        assert_eq!(
            (src, to, to_port),
            (ip("10.244.1.7"), ip("10.244.2.5"), 8080)
        );
        assert!(port >= 1024 && port != 40000, "{port}");
        reparsed(&syn);
        let e = ct.get(id).unwrap();
        assert!(e.status.has(Status::SNAT));
        assert_eq!(e.status.has(Status::DNAT), second.is_some());
        assert_eq!(ct.nat_in_use(), 1, "the new port is held");
        assert_eq!(ct.stats().clash, 0);

        // The endpoint answers the new port; the client gets it on its own port, from
        // where it sent to.
        let mut synack = tcp(
            "10.244.2.5",
            8080,
            "10.244.1.7",
            port,
            9000,
            7001,
            SYN | ACK,
            0,
        );
        let r = run(&mut ct, &mut synack, None, 2);
        assert_eq!(
            (r.state, r.reply, r.entry),
            (CtState::Established, true, Some(id))
        );
        assert_eq!(key(&synack), (ip(dst), dport, ip("10.244.1.7"), 40000));
        reparsed(&synack);
        let mut ack = tcp("10.244.1.7", 40000, dst, dport, 7001, 9001, ACK, 0);
        let r = run(&mut ct, &mut ack, None, 3);
        assert_eq!((r.state, r.entry), (CtState::Established, Some(id)));
        assert_eq!(key(&ack).1, port);
        reparsed(&ack);

        // The first connection's replies still go to it, untranslated port.
        let mut old = tcp(
            "10.244.2.5",
            8080,
            "10.244.1.7",
            40000,
            5000,
            1001,
            SYN | ACK,
            0,
        );
        let r = run(&mut ct, &mut old, None, 4);
        assert_eq!((r.state, r.entry), (CtState::Established, Some(first)));
        assert_eq!(key(&old), (ip("10.96.0.10"), 80, ip("10.244.1.7"), 40000));
        ct.check();
    }
}

#[test]
fn reply_clash_without_snat_keeps_a_privileged_port_privileged() {
    let mut ct = Conntrack::new(Config::default());
    via_service(&mut ct, 700);
    let mut p = tcp("10.244.1.7", 700, "10.244.2.5", 8080, 1, 0, SYN, 0);
    let r = run(&mut ct, &mut p, None, 1);
    assert_eq!(r.state, CtState::New);
    assert!((1..1024).contains(&key(&p).1) && key(&p).1 != 700);
    reparsed(&p);
}

#[test]
fn reply_clash_without_snat_moves_an_echo_identifier() {
    let mut ct = Conntrack::new(Config::default());
    run(
        &mut ct,
        &mut ping("10.244.1.7", "10.96.0.10", 9),
        Some(&dnat("10.244.2.5", None)),
        0,
    );
    let mut p = ping("10.244.1.7", "10.244.2.5", 9);
    let id = run(&mut ct, &mut p, None, 1).entry.unwrap();
    let moved = key(&p).1;
    assert_ne!(moved, 9);
    reparsed(&p);
    let mut reply = pong("10.244.2.5", "10.244.1.7", moved);
    let r = run(&mut ct, &mut reply, None, 2);
    assert_eq!((r.state, r.entry), (CtState::Established, Some(id)));
    assert_eq!(key(&reply).1, 9, "identifier translated back");
    assert_eq!(key(&reply).0, ip("10.244.2.5"));
    reparsed(&reply);
}

/// No free port in the class: refused and counted as SNAT exhaustion is.
#[test]
fn reply_clash_without_snat_and_no_free_port_is_exhaustion() {
    let mut ct = Conntrack::new(Config::default());
    for port in 1..1024 {
        let mut p = tcp("10.244.1.7", port, "10.244.2.5", 8080, 1, 0, SYN, 0);
        run(&mut ct, &mut p, None, 0);
    }
    assert_eq!((ct.len(), ct.nat_in_use()), (1023, 0));
    let mut p = tcp("10.244.1.7", 700, "10.96.0.10", 80, 1, 0, SYN, 0);
    let before = p.pkt.data.clone();
    let r = ct.process(
        &mut p.pkt,
        &mut p.parsed,
        Some(&dnat("10.244.2.5", Some(8080))),
        1,
    );
    assert_eq!(r, Err(DropReason::NatPortExhausted));
    assert_eq!(ct.stats().nat_port_exhausted, 1);
    assert_eq!(p.pkt.data, before, "refused packet not rewritten");
    assert_eq!(ct.len(), 1023);
}

/// A protocol without ports has nothing to change: a clash is refused.
#[test]
fn reply_clash_without_ports_is_refused() {
    let gre = |src: &str, dst: &str| {
        let mut p = udp(src, 1, dst, 2);
        let ip_hdr = p.parsed.l3_off;
        let f = &mut p.pkt.data;
        f[ip_hdr + 9] = 47;
        f[ip_hdr + 10..ip_hdr + 12].fill(0);
        let sum = checksum(&f[ip_hdr..ip_hdr + 20]);
        f[ip_hdr + 10..ip_hdr + 12].copy_from_slice(&sum.to_be_bytes());
        pkt_in(p.pkt.data, 0)
    };
    let mut ct = Conntrack::new(Config::default());
    let mut p = gre("10.244.1.7", "10.96.0.10");
    let r = run(&mut ct, &mut p, Some(&dnat("10.244.2.5", None)), 0);
    assert_eq!(r.state, CtState::New);
    let mut p = gre("10.244.1.7", "10.244.2.5");
    let r = run(&mut ct, &mut p, None, 1);
    assert_eq!(r.state, CtState::Invalid);
    assert_eq!((ct.stats().clash, ct.len()), (1, 1));
}

#[test]
fn icmp_echo_identifier_is_the_snat_port() {
    let mut ct = Conntrack::new(Config::default());
    let nat = snat("192.168.1.1", Some((100, 101)));
    let mut a = ping("10.0.0.1", "8.8.8.8", 100);
    let mut b = ping("10.0.0.2", "8.8.8.8", 100);
    run(&mut ct, &mut a, Some(&nat), 0);
    let eb = run(&mut ct, &mut b, Some(&nat), 0).entry.unwrap();
    assert_eq!((key(&a).0, key(&a).1), (ip("192.168.1.1"), 100));
    assert_eq!((key(&b).0, key(&b).1), (ip("192.168.1.1"), 101));
    reparsed(&a);
    reparsed(&b);
    let mut reply = pong("8.8.8.8", "192.168.1.1", 101);
    let r = run(&mut ct, &mut reply, None, 1);
    assert_eq!(
        (r.state, r.reply, r.entry),
        (CtState::Established, true, Some(eb))
    );
    assert_eq!(
        (key(&reply).2, key(&reply).0),
        (ip("10.0.0.2"), ip("8.8.8.8"))
    );
    assert_eq!(key(&reply).1, 100, "identifier translated back");
    reparsed(&reply);
    // IPv6 as well.
    let nat6 = snat("fd00::100", None);
    let mut p = ping("fd00::1", "fd00::9", 7);
    run(&mut ct, &mut p, Some(&nat6), 0);
    assert_eq!(key(&p).0, ip("fd00::100"));
    reparsed(&p);
}

#[test]
fn hairpin_to_self_works_with_snat_both_directions() {
    // Client C calls a service VIP whose backend is C itself; SNAT to the node address
    // makes the connection's two tuples distinct and the reply come back through us.
    let mut ct = Conntrack::new(Config::default());
    let nat = Nat {
        dnat: Some((Addr::from(ip("10.244.1.5")), Some(8080))),
        snat: Some((Addr::from(ip("10.244.1.1")), None)),
    };
    let mut syn = tcp("10.244.1.5", 40000, "10.96.0.10", 80, 1000, 0, SYN, 0);
    let r = run(&mut ct, &mut syn, Some(&nat), 0);
    assert_eq!(r.state, CtState::New);
    let id = r.entry.unwrap();
    assert_eq!(key(&syn), (ip("10.244.1.1"), 40000, ip("10.244.1.5"), 8080));
    reparsed(&syn);
    // C, as the server, answers the node address.
    let mut synack = tcp(
        "10.244.1.5",
        8080,
        "10.244.1.1",
        40000,
        5000,
        1001,
        SYN | ACK,
        0,
    );
    let r = run(&mut ct, &mut synack, None, 1);
    assert_eq!(
        (r.state, r.reply, r.entry),
        (CtState::Established, true, Some(id))
    );
    // C, as the client, sees the service answer.
    assert_eq!(
        key(&synack),
        (ip("10.96.0.10"), 80, ip("10.244.1.5"), 40000)
    );
    reparsed(&synack);
    let mut ack = tcp("10.244.1.5", 40000, "10.96.0.10", 80, 1001, 5001, ACK, 0);
    let r = run(&mut ct, &mut ack, None, 2);
    assert_eq!((r.state, r.reply), (CtState::Established, false));
    assert_eq!(key(&ack), (ip("10.244.1.1"), 40000, ip("10.244.1.5"), 8080));
    assert_eq!(ct.get(id).unwrap().tcp_state(), Some(TcpState::Established));
}

/// An ICMP error about the frame in `p`, sent by `from`.
fn error_about(p: &tests::Pkt, from: &str, kind: ErrorKind) -> tests::Pkt {
    let f = build_error(&p.pkt.data, &p.parsed, kind, ip(from), [2, 0, 0, 0, 0, 9]).unwrap();
    pkt_in(f, p.parsed.key.zone)
}

/// Runs the ICMP error `err` through conntrack at 1 ns, which must find it RELATED to the
/// connection `id`, in the reply direction.
fn assert_related(ct: &mut Conntrack, err: &mut tests::Pkt, id: EntryId) {
    let r = run(ct, err, None, 1);
    assert_eq!(
        (r.state, r.reply, r.entry),
        (CtState::Related, true, Some(id))
    );
}

fn quoted_key(p: &tests::Pkt) -> FlowKey {
    embedded(&p.pkt.data, &p.parsed).unwrap().unwrap().key
}

#[test]
fn icmp_error_from_backend_is_related_and_translated_outside_and_inside() {
    let mut ct = Conntrack::new(Config::default());
    let nat = dnat("10.244.1.5", Some(8080));
    let mut p = udp("10.0.0.1", 40000, "10.96.0.10", 80);
    let id = run(&mut ct, &mut p, Some(&nat), 0).entry.unwrap();
    // The backend answers "port unreachable" about the translated packet.
    let mut err = error_about(&p, "10.244.1.5", ErrorKind::Unreachable { code: 3 });
    assert_related(&mut ct, &mut err, id);
    // The client sees the error come from the service, about its own packet.
    assert_eq!(
        (err.parsed.key.src, err.parsed.key.dst),
        (ip("10.96.0.10").into(), ip("10.0.0.1").into())
    );
    reparsed(&err);
    let q = quoted_key(&err);
    assert_eq!(
        (q.src, q.src_port, q.dst, q.dst_port),
        (ip("10.0.0.1").into(), 40000, ip("10.96.0.10").into(), 80)
    );
    assert_eq!(ct.stats().related, 1);
    // Related errors do not touch the connection.
    assert_eq!(ct.get(id).unwrap().packets(), [1, 0]);
}

#[test]
fn icmp_error_from_a_router_is_related_and_keeps_the_router_address() {
    let mut ct = Conntrack::new(Config::default());
    let nat = snat("192.168.1.1", None);
    let mut p = tcp("10.0.0.1", 40000, "8.8.8.8", 443, 1000, 0, SYN, 0);
    let id = run(&mut ct, &mut p, Some(&nat), 0).entry.unwrap();
    let mut err = error_about(&p, "172.16.0.1", ErrorKind::TooBig { mtu: 1400 });
    assert_related(&mut ct, &mut err, id);
    assert_eq!(
        (err.parsed.key.src, err.parsed.key.dst),
        (ip("172.16.0.1").into(), ip("10.0.0.1").into())
    );
    reparsed(&err);
    let q = quoted_key(&err);
    assert_eq!(
        (q.src, q.src_port, q.dst),
        (ip("10.0.0.1").into(), 40000, ip("8.8.8.8").into())
    );
    // Untranslated connections: related, bytes untouched; IPv6 packet too big.
    let mut p6 = tcp("fd00::1", 40000, "fd00::9", 443, 1000, 0, SYN, 0);
    let id6 = run(&mut ct, &mut p6, None, 0).entry.unwrap();
    let mut err6 = error_about(&p6, "fd00::fe", ErrorKind::TooBig { mtu: 1280 });
    let before = err6.pkt.data.clone();
    assert_related(&mut ct, &mut err6, id6);
    assert_eq!(err6.pkt.data, before);
}

#[test]
fn icmp_error_about_a_timed_out_connection_is_invalid() {
    let mut ct = Conntrack::new(Config::default());
    let mut p = udp("10.0.0.1", 40000, "10.0.0.2", 53);
    run(&mut ct, &mut p, None, 0);
    let mut err = error_about(&p, "10.0.0.2", ErrorKind::Unreachable { code: 3 });
    let r = run(&mut ct, &mut err, None, 31 * S);
    assert_eq!(r.state, CtState::Invalid, "unreplied UDP lasts 30 s");
}

#[test]
fn icmp_error_about_no_known_connection_is_invalid() {
    let mut ct = Conntrack::new(Config::default());
    let p = udp("10.0.0.1", 40000, "10.0.0.2", 53);
    let mut err = error_about(&p, "10.0.0.2", ErrorKind::Unreachable { code: 3 });
    let r = run(&mut ct, &mut err, None, 0);
    assert_eq!(r.state, CtState::Invalid);
    // Nor does an error about a tracked connection addressed to someone else relate.
    let mut q = udp("10.0.0.1", 40000, "10.0.0.2", 53);
    run(&mut ct, &mut q, None, 0);
    let mut err = error_about(&q, "10.0.0.2", ErrorKind::Unreachable { code: 3 });
    // Re-address the error to a third host (fixing the IPv4 header checksum).
    let l3 = err.parsed.l3_off;
    err.pkt.data[l3 + 16..l3 + 20].copy_from_slice(&[10, 0, 0, 77]);
    crate::wire::checksum::set_ipv4_header(&mut err.pkt.data[l3..l3 + 20]);
    let mut err = pkt_in(err.pkt.data, 0);
    let r = run(&mut ct, &mut err, None, 0);
    assert_eq!(r.state, CtState::Invalid);
    assert_eq!(ct.stats().related, 0);
}

#[test]
fn nat_in_use_follows_every_insertion_and_removal() {
    let mut ct = Conntrack::new(Config::default());
    let nat = snat("192.168.1.1", None);
    for (i, c) in ["10.0.0.1", "10.0.0.2", "10.0.0.3"].into_iter().enumerate() {
        run(
            &mut ct,
            &mut udp(c, 5000, "8.8.8.8", 53),
            Some(&nat),
            i as u64,
        );
    }
    // DNAT only, and no NAT at all, hold no source port (their reply tuples are free).
    run(
        &mut ct,
        &mut udp("10.0.0.4", 5000, "10.96.0.10", 53),
        Some(&dnat("10.244.1.5", Some(5353))),
        0,
    );
    run(&mut ct, &mut udp("10.0.0.5", 5000, "8.8.8.8", 53), None, 0);
    assert_eq!((ct.len(), ct.nat_in_use()), (5, 3));
    ct.check();

    let one = Filter {
        addr: Some(ip("10.0.0.1")),
        ..Filter::default()
    };
    assert_eq!(ct.delete(&one), 1);
    assert_eq!(ct.nat_in_use(), 2);
    ct.retain(|e| e.original().src != ip("10.0.0.2"));
    assert_eq!(ct.nat_in_use(), 1);
    // Expiry: the last one seen at 2 s goes with the rest after the UDP timeout.
    ct.expire(100 * S, usize::MAX);
    assert_eq!((ct.len(), ct.nat_in_use()), (0, 0));
    ct.check();
}

#[test]
fn nat_in_use_counts_an_evicted_entry_out() {
    let mut ct = Conntrack::new(Config {
        max_entries: 1,
        ..Config::default()
    });
    let nat = snat("192.168.1.1", None);
    run(
        &mut ct,
        &mut udp("10.0.0.1", 5000, "8.8.8.8", 53),
        Some(&nat),
        0,
    );
    assert_eq!(ct.nat_in_use(), 1);
    // The unreplied entry makes room for a connection without NAT.
    run(&mut ct, &mut udp("10.0.0.2", 5000, "8.8.8.8", 53), None, 1);
    assert_eq!((ct.len(), ct.stats().evicted, ct.nat_in_use()), (1, 1, 0));
    ct.check();
}

#[test]
fn adopt_copies_an_entry_with_its_nat_and_state() {
    let mut live = Conntrack::new(Config::default());
    let nat = snat("192.168.1.1", Some((30000, 30010)));
    let mut p = udp("10.0.0.1", 5000, "8.8.8.8", 53);
    let id = run(&mut live, &mut p, Some(&nat), S).entry.unwrap();
    live.get_mut(id).unwrap().mark = 7;
    live.get_mut(id)
        .unwrap()
        .set_tunnel_peer(Some(ip("192.168.50.20")));
    let e = live.get(id).unwrap().clone();

    let mut copy = Conntrack::new(*live.config());
    let cid = copy.adopt(e.clone(), S).unwrap();
    assert_eq!(copy.get(cid), Some(&e));
    assert_eq!((copy.len(), copy.nat_in_use()), (1, 1));
    assert_eq!(copy.stats().inserted, 0, "not a new connection");
    assert_eq!(copy.adopt(e, S), Err(DropReason::CtInvalid), "tuple taken");
    copy.check();
    // The copy translates the next packets as the live table would.
    let mut again = udp("10.0.0.1", 5000, "8.8.8.8", 53);
    let r = run(&mut copy, &mut again, None, 2 * S);
    assert_eq!((r.state, r.entry), (CtState::Established, Some(cid)));
    assert_eq!(key(&again).0, ip("192.168.1.1"));
    assert_eq!(
        live.get(id).unwrap().packets()[0],
        1,
        "live entry untouched"
    );
}

/// An SCTP packet from `src`:`sport` to `dst`:`dport` with tag `vtag` and one chunk.
fn sctp_pkt(src: &str, sport: u16, dst: &str, dport: u16, vtag: u32, c: (u8, &[u8])) -> tests::Pkt {
    use crate::wire::{build, sctp};
    let s = sctp::build(sport, dport, vtag, &[(c.0, 0, c.1)]);
    pkt_in(
        build::sctp(ip(src), ip(dst), &s, &build::IpOpts::default()),
        0,
    )
}

/// The CRC32c of the SCTP packet in `p` is right.
fn sctp_crc_ok(p: &tests::Pkt) -> bool {
    let q = parse(&p.pkt.data, 0).unwrap();
    crate::wire::sctp::crc_ok(&p.pkt.data[q.l4_off..q.ip_end])
}

/// An SCTP association through a DNAT: its handshake tracked from INIT to ESTABLISHED,
/// every packet translated with its CRC32c right, a packet with a wrong tag or a bad
/// checksum INVALID, the state's timeout applied.
#[test]
fn sctp_association_is_tracked_and_translated_with_its_crc32c() {
    use crate::wire::sctp::{chunk, init_value};
    let mut ct = Conntrack::new(Config::default());
    let nat = dnat("10.244.1.5", Some(8080));
    let (c, svc, ep) = ("10.0.0.1", "10.96.0.10", "10.244.1.5");
    let mut init = sctp_pkt(c, 40000, svc, 80, 0, (chunk::INIT, &init_value(0xa)));
    let r = run(&mut ct, &mut init, Some(&nat), 0);
    assert_eq!(r.state, CtState::New);
    assert_eq!(key(&init), (ip(c), 40000, ip(ep), 8080));
    assert!(sctp_crc_ok(&init), "CRC32c after the DNAT");
    let id = r.entry.unwrap();
    let line = ct.get(id).unwrap().to_string();
    assert!(line.starts_with("sctp 132 3 COOKIE_WAIT "), "{line}");

    let mut ack = sctp_pkt(ep, 8080, c, 40000, 0xa, (chunk::INIT_ACK, &init_value(0xb)));
    let r = run(&mut ct, &mut ack, None, S);
    assert_eq!((r.state, r.reply), (CtState::Established, true));
    assert_eq!(key(&ack), (ip(svc), 80, ip(c), 40000), "the reply reversed");
    assert!(sctp_crc_ok(&ack));

    // A cookie echo with the wrong tag, or with a bad checksum, is not of it.
    let mut wrong = sctp_pkt(c, 40000, svc, 80, 0xdead, (chunk::COOKIE_ECHO, b"cookie"));
    assert_eq!(run(&mut ct, &mut wrong, None, S).state, CtState::Invalid);
    let mut bad = sctp_pkt(c, 40000, svc, 80, 0xb, (chunk::COOKIE_ECHO, b"cookie"));
    let at = bad.parsed.l4_off + 8;
    bad.pkt.data[at] ^= 0xff;
    assert_eq!(run(&mut ct, &mut bad, None, S).state, CtState::Invalid);
    assert!(ct.get(id).unwrap().to_string().contains(" COOKIE_WAIT "));

    let mut echo = sctp_pkt(c, 40000, svc, 80, 0xb, (chunk::COOKIE_ECHO, b"cookie"));
    assert_eq!(
        run(&mut ct, &mut echo, None, 2 * S).state,
        CtState::Established
    );
    let mut cack = sctp_pkt(ep, 8080, c, 40000, 0xa, (chunk::COOKIE_ACK, &[]));
    run(&mut ct, &mut cack, None, 2 * S);
    let e = ct.get(id).unwrap();
    let line = e.line(&Timeouts::default(), 2 * S).to_string();
    assert!(line.starts_with("sctp 132 210 ESTABLISHED "), "{line}");
    assert!(e.status.has(Status::ASSURED));

    // Data both ways, translated; an ABORT with the T bit closes it.
    let mut data = sctp_pkt(c, 40000, svc, 80, 0xb, (chunk::DATA, b"payload"));
    assert_eq!(
        run(&mut ct, &mut data, None, 3 * S).state,
        CtState::Established
    );
    assert_eq!(key(&data), (ip(c), 40000, ip(ep), 8080));
    assert!(sctp_crc_ok(&data));
    let abort = crate::wire::sctp::build(8080, 40000, 0xb, &[(chunk::ABORT, 1, &[])]);
    let mut abort = pkt_in(
        crate::wire::build::sctp(
            ip(ep),
            ip(c),
            &abort,
            &crate::wire::build::IpOpts::default(),
        ),
        0,
    );
    assert_eq!(
        run(&mut ct, &mut abort, None, 3 * S).state,
        CtState::Established
    );
    let line = ct
        .get(id)
        .unwrap()
        .line(&Timeouts::default(), 3 * S)
        .to_string();
    assert!(line.starts_with("sctp 132 10 CLOSED "), "{line}");

    // A DATA chunk of no association starts none.
    let mut stray = sctp_pkt(c, 40001, svc, 80, 0x77, (chunk::DATA, b"x"));
    assert_eq!(
        run(&mut ct, &mut stray, Some(&nat), 4 * S).state,
        CtState::Invalid
    );
}
