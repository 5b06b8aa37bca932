//! Packets that wait for their next hop's MAC: queued when it is unknown, sent when the
//! neighbour answers, dropped when it does not, pushed out by newer ones, or discarded at
//! a table swap. And the neighbour table under what others on the segment send.

use super::test_support::*;
use super::*;

const GW: &str = "192.168.50.1";
const NODE2: &str = "192.168.50.20";

fn udp_to(dst: &str, payload: &[u8]) -> Vec<u8> {
    udp_from_pod(dst, 40000, payload)
}

/// Node 2's ARP reply to node 1.
fn node2_arp_reply() -> Vec<u8> {
    arp_reply(1, NODE2, uplink_mac(2))
}

/// The UDP payload of a frame (inside the VXLAN packet when `tunnelled`).
fn payload(frame: &[u8], tunnelled: bool) -> Vec<u8> {
    let p = parse(frame, 0).unwrap();
    if !tunnelled {
        return frame[p.l4_off + 8..p.ip_end].to_vec();
    }
    let inner = &frame[p.l4_off + 8 + vxlan::LEN..p.ip_end];
    payload(inner, false)
}

fn payloads(out: &[(PortId, Packet)], tunnelled: bool) -> Vec<Vec<u8>> {
    out.iter()
        .map(|(_, f)| payload(&f.data, tunnelled))
        .collect()
}

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

/// A neighbour discovery message in `frame`.
fn nd_of(frame: &[u8]) -> nd::Message {
    nd::parse(frame, &parse(frame, 0).unwrap())
        .unwrap()
        .unwrap()
}

/// A pipeline of node 1 whose neighbour table holds `max_entries`.
fn small_table(max_entries: usize) -> Pipeline {
    let (mut a, _) = nodes();
    a.neigh = Neighbours::new(neigh::Config {
        max_entries,
        ..neigh::Config::default()
    });
    a
}

#[test]
fn test_packets_to_an_unresolved_node_wait_and_leave_encapsulated_in_order() {
    let (mut a, _) = nodes();
    let first = udp_to("10.244.2.6", b"1");
    let key = parse(&first, 0).unwrap().key;
    let (v, out) = run(&mut a, first, POD, 0);
    assert_eq!(v, Verdict::Queued);
    assert_eq!(out.len(), 1, "the ARP request, nothing else");
    let r = arp_of(&out[0].1.data);
    assert_eq!(
        (out[0].0, r.op, IpAddr::V4(r.target_ip)),
        (UPLINK, arp::REQUEST, ip(NODE2))
    );
    assert!(
        a.conntrack().lookup(&key).is_some(),
        "committed while it waits, so that the reply finds it"
    );
    for (i, p) in [b"2", b"3"].into_iter().enumerate() {
        let (v, out) = run(&mut a, udp_to("10.244.2.6", p), POD, (i as u64 + 1) * 1000);
        assert_eq!((v, out.len()), (Verdict::Queued, 0), "asked already");
    }
    assert_eq!((a.stats().neigh_waiting, a.stats().neigh_queued), (3, 3));

    let (v, out) = run(&mut a, node2_arp_reply(), UPLINK, SEC / 100);
    assert_eq!(v, Verdict::Consumed);
    assert_eq!(payloads(&out, true), [b"1", b"2", b"3"], "in order");
    for (port, f) in &out {
        assert_eq!(*port, UPLINK);
        assert_eq!(&f.data[0..6], &uplink_mac(2), "to the MAC just learned");
        assert_eq!(&f.data[6..12], &uplink_mac(1));
        let o = parse(&f.data, 0).unwrap();
        assert_eq!((o.key.dst, o.key.dst_port), (ip(NODE2).into(), 4789));
        let inner = &f.data[o.l4_off + 8 + vxlan::LEN..];
        assert_eq!(&inner[0..6], &overlay::vtep_mac(ip(NODE2)));
        assert_eq!(parse(inner, 0).unwrap().ttl, 63, "TTL decremented once");
    }
    let s = a.stats();
    assert_eq!(
        (s.neigh_waiting, s.neigh_released, s.encapsulated),
        (0, 3, 3)
    );
    assert_eq!(a.port_stats()[usize::from(UPLINK)].tx_packets, 4);
    assert_eq!(a.drops().total(), 0);
    // The neighbour is known now: the next packet goes at once.
    let (v, out) = run(&mut a, udp_to("10.244.2.6", b"4"), POD, SEC / 50);
    assert_eq!(
        (v, payloads(&out, true)),
        (Verdict::Forwarded, vec![b"4".to_vec()])
    );
}

#[test]
fn test_a_gso_packet_that_waited_is_segmented_when_it_leaves() {
    let (mut a, _) = nodes();
    let pkt = gso_from_pod(20000);
    let mut out = Vec::new();
    let v = a.process(pkt, &mut out, &mut Trace::disabled());
    assert_eq!((v, out.len()), (Verdict::Queued, 1));

    let (v, out) = run(&mut a, node2_arp_reply(), UPLINK, SEC / 100);
    assert_eq!(v, Verdict::Consumed);
    assert!(out.len() >= 14, "{}", out.len());
    let mut seq = 1u32;
    for (port, f) in &out {
        assert_eq!(*port, UPLINK);
        assert_eq!(&f.data[0..6], &uplink_mac(2));
        let o = parse(&f.data, 0).unwrap();
        assert!(o.ip_len() <= 1500 && o.frag.is_none());
        let inner = &f.data[o.l4_off + 8 + vxlan::LEN..];
        let i = parse(inner, 0).unwrap();
        assert!(i.ip_len() <= 1450 && i.frag.is_none());
        let got = u32::from_be_bytes(inner[i.l4_off + 4..i.l4_off + 8].try_into().unwrap());
        assert_eq!(got, seq, "segments in order");
        seq += (i.ip_end - i.l4_off - 20) as u32;
    }
    assert_eq!(seq, 20001);
    assert_eq!(a.stats().segmented, 1);
}

#[test]
fn test_a_fourth_packet_for_a_neighbour_pushes_out_the_oldest() {
    let (mut a, _) = nodes();
    for (i, p) in [b"1", b"2", b"3", b"4"].into_iter().enumerate() {
        let (v, _) = run(&mut a, udp_to("8.8.8.8", p), POD, i as u64);
        assert_eq!(v, Verdict::Queued);
    }
    assert_eq!(a.drops().get(DropReason::NeighQueueOverflow), 1);
    let s = a.stats();
    assert_eq!(
        (s.neigh_queued, s.neigh_queue_overflow, s.neigh_waiting),
        (4, 1, 3)
    );
    let (_, out) = run(&mut a, arp_reply(1, GW, GW_MAC), UPLINK, 10);
    assert_eq!(payloads(&out, false), [b"2", b"3", b"4"]);
    assert!(out.iter().all(|(_, f)| f.data[0..6] == GW_MAC));
}

/// The ICMP error in `frame` (inside the VXLAN packet when `tunnelled`): its parse (the
/// key's destination port is type << 8 | code), and the destination address and port of
/// the packet it quotes.
fn icmp_error(frame: &[u8], tunnelled: bool) -> (Parsed, IpAddr, u16) {
    let mut pe = parse(frame, 0).unwrap();
    let mut f = frame;
    if tunnelled {
        f = &frame[pe.l4_off + 8 + vxlan::LEN..pe.ip_end];
        pe = parse(f, 0).unwrap();
    }
    let (dst, port) = quoted(f, &pe);
    (pe, dst, port)
}

#[test]
fn test_packets_whose_neighbour_does_not_answer_expire_and_their_senders_are_told() {
    let (mut a, _) = nodes();
    assert_eq!(
        run(&mut a, udp_to("8.8.8.8", b"1"), POD, 0).0,
        Verdict::Queued
    );
    assert_eq!(
        run(&mut a, udp_to("8.8.8.8", b"2"), POD, SEC).0,
        Verdict::Queued
    );
    let timeout = neigh::Config::default().unresolved_ns;
    let mut out = Vec::new();
    a.tick(timeout - 1, &mut out);
    assert_eq!(a.stats().neigh_waiting, 2);
    assert!(out.is_empty());
    a.tick(timeout, &mut out);
    assert_eq!(a.stats().neigh_waiting, 1, "the first waited long enough");
    a.tick(timeout + SEC, &mut out);
    let s = a.stats();
    assert_eq!((s.neigh_waiting, s.neigh_queue_expired), (0, 2));
    assert_eq!(a.drops().get(DropReason::NeighUnresolved), 2);
    // Each is answered with a host unreachable, back to the pod.
    assert_eq!(out.len(), 2);
    for (port, f) in &out {
        assert_eq!(*port, POD);
        assert_eq!(&f.data[0..6], &pod_mac(1, 5));
        let (pe, dst, dport) = icmp_error(&f.data, false);
        assert_eq!(pe.key.proto, proto::ICMP);
        assert_eq!(pe.key.dst_port, 3 << 8 | 1, "host unreachable");
        assert_eq!(pe.key.dst.ip(), ip("10.244.1.5"));
        assert_eq!((dst, dport), (ip("8.8.8.8"), 7000));
    }
    assert_eq!(a.stats().icmp_sent, 2);
    // An answer after that sends nothing.
    let (v, out) = run(&mut a, arp_reply(1, GW, GW_MAC), UPLINK, 5 * SEC);
    assert_eq!((v, out.len()), (Verdict::Consumed, 0));
}

#[test]
fn test_a_packet_from_the_overlay_whose_neighbour_does_not_answer_is_answered_through_it() {
    let (mut a, _) = nodes();
    learn(&mut a, 1, NODE2, uplink_mac(2));
    let inner = udp("fd00:10:244:2::5", "fd00:50::33", 1, 2, b"x");
    let o = tunnel(2, 1, 1);
    let (v, _) = run(&mut a, overlay::encapsulate(&inner, &o), UPLINK, 0);
    assert_eq!(v, Verdict::Queued);
    let mut out = Vec::new();
    a.tick(neigh::Config::default().unresolved_ns, &mut out);
    assert_eq!(out.len(), 1);
    let (port, f) = &out[0];
    assert_eq!((*port, &f.data[0..6]), (UPLINK, &uplink_mac(2)[..]));
    let (pe, dst, dport) = icmp_error(&f.data, true);
    assert_eq!(pe.key.dst_port, 1 << 8 | 3, "address unreachable");
    assert_eq!(pe.key.dst.ip(), ip("fd00:10:244:2::5"));
    assert_eq!((dst, dport), (ip("fd00:50::33"), 2));
}

#[test]
fn test_ipv6_packets_wait_for_a_neighbour_advertisement() {
    let (mut a, _) = nodes();
    let f = pod_udp("fd00:10:244:1::5", "2001:db8::1", b"v6");
    let (v, out) = run(&mut a, f, POD, 0);
    assert_eq!(v, Verdict::Queued);
    let p = parse(&out[0].1.data, 0).unwrap();
    assert!(matches!(
        nd::parse(&out[0].1.data, &p),
        Ok(Some(nd::Message::Solicit { .. }))
    ));
    let IpAddr::V6(gw) = ip("fd00:50::1") else {
        panic!()
    };
    let IpAddr::V6(me) = ip("fd00:50::10") else {
        panic!()
    };
    let na = nd::advert(
        uplink_mac(1),
        GW_MAC,
        None,
        gw,
        me,
        gw,
        nd::FLAG_SOLICITED | nd::FLAG_OVERRIDE,
        Some(GW_MAC),
    );
    let (v, out) = run(&mut a, na, UPLINK, SEC / 100);
    assert_eq!((v, out.len()), (Verdict::Consumed, 1));
    let (port, f) = &out[0];
    assert_eq!(*port, UPLINK);
    assert_eq!(
        (&f.data[0..6], &f.data[6..12]),
        (&GW_MAC[..], &uplink_mac(1)[..])
    );
    let q = parse(&f.data, 0).unwrap();
    assert_eq!((q.key.dst, q.ttl), (ip("2001:db8::1").into(), 63));
    assert_eq!(payload(&f.data, false), b"v6");
}

#[test]
fn test_a_full_table_refuses_a_new_next_hop_rather_than_evict_one_packets_wait_for() {
    let mut a = small_table(1);
    assert_eq!(
        run(&mut a, udp_to("8.8.8.8", b"1"), POD, 0).0,
        Verdict::Queued
    );
    let (v, out) = run(&mut a, udp_to("10.244.2.6", b"2"), POD, 1);
    assert_eq!(
        (v, out.len()),
        (Verdict::Dropped(DropReason::NeighTableFull), 0)
    );
    assert_eq!(a.neighbours().stats().refused, 1);
    let (_, out) = run(&mut a, arp_reply(1, GW, GW_MAC), UPLINK, 2);
    assert_eq!(payloads(&out, false), [b"1"]);
    // Once the gateway has been idle long enough, a new next hop takes its place.
    let idle = neigh::Config::default().evict_after_ns;
    let (v, out) = run(&mut a, udp_to("10.244.2.6", b"3"), POD, 2 + idle);
    assert_eq!((v, out.len()), (Verdict::Queued, 1));
    assert!(a.neighbours().get(UPLINK, ip(GW)).is_none());
}

#[test]
fn test_requests_from_made_up_senders_evict_neither_the_gateway_nor_a_pending_entry() {
    let mut a = small_table(4);
    learn(&mut a, 1, GW, GW_MAC);
    let (v, _) = run(&mut a, udp_to("8.8.8.8", b"1"), POD, SEC);
    assert_eq!(v, Verdict::Forwarded);
    let (v, _) = run(&mut a, udp_to("10.244.2.6", b"2"), POD, SEC);
    assert_eq!(v, Verdict::Queued);
    // A flood of requests for the node's address, each from a sender never seen: each
    // is answered, and teaches the table only while it has room.
    for i in 0..50u8 {
        let sender = format!("192.168.50.{}", 100 + i);
        let (v, out) = run(
            &mut a,
            arp_request([2, 0xbb, 0, 0, 0, i], &sender, "192.168.50.10"),
            UPLINK,
            SEC + u64::from(i),
        );
        assert_eq!((v, out.len()), (Verdict::Consumed, 1));
        assert_eq!(arp_of(&out[0].1.data).op, arp::REPLY);
    }
    assert_eq!(a.neighbours().len(), 4);
    let learned: Vec<_> = a
        .neighbours()
        .iter()
        .filter(|(_, addr, _)| *addr != ip(GW) && *addr != ip(NODE2))
        .map(|(_, _, n)| n.state)
        .collect();
    assert_eq!(
        learned,
        [neigh::State::Stale; 2],
        "a request does not say its sender answers"
    );
    // The gateway is still known: the next packet goes at once, with no ARP request.
    let (v, out) = run(&mut a, udp_to("8.8.8.8", b"3"), POD, 2 * SEC);
    assert_eq!(
        (v, payloads(&out, false)),
        (Verdict::Forwarded, vec![b"3".to_vec()])
    );
    assert_eq!(&out[0].1.data[0..6], &GW_MAC);
    // The entry still being resolved is there too, and its answer sends what waited.
    let (_, out) = run(&mut a, node2_arp_reply(), UPLINK, 2 * SEC);
    assert_eq!(payloads(&out, true), [b"2"]);
    assert_eq!(a.neighbours().stats().evicted, 0);
}

#[test]
fn test_a_scan_of_an_on_link_subnet_makes_no_more_probes_than_the_budget() {
    let (mut a, _) = nodes();
    learn(&mut a, 1, GW, GW_MAC);
    let mut probes = 0;
    for i in 0..200u16 {
        let dst = format!("fd00:50::1:{i:x}");
        let f = pod_udp("fd00:10:244:1::5", &dst, b"s");
        let (v, out) = run(&mut a, f, POD, 0);
        assert!(
            matches!(
                v,
                Verdict::Queued | Verdict::Dropped(DropReason::NeighProbeLimited)
            ),
            "{v:?}"
        );
        probes += out.len();
    }
    let burst = neigh::Config::default().probe_burst as usize;
    assert_eq!(probes, burst - 1, "one went to the gateway");
    assert_eq!(a.stats().neigh_probes, burst as u64);
    assert_eq!(
        a.drops().get(DropReason::NeighProbeLimited),
        (200 - probes) as u64
    );
    assert_eq!(a.neighbours().len(), burst);
    // A neighbour that is known is not affected.
    let (v, out) = run(&mut a, udp_to("8.8.8.8", b"1"), POD, 0);
    assert_eq!(
        (v, payloads(&out, false)),
        (Verdict::Forwarded, vec![b"1".to_vec()])
    );
    // The budget comes back: 100 a second.
    let (v, out) = run(&mut a, udp_to("192.168.50.33", b"2"), POD, SEC / 100);
    assert_eq!((v, out.len()), (Verdict::Queued, 1));
}

/// Node 1 of `spec` with one packet to 8.8.8.8 queued for the gateway's MAC.
fn waiting_for_the_gateway(spec: &TablesSpec) -> Pipeline {
    let mut a = compiled(spec);
    assert_eq!(
        run(&mut a, udp_to("8.8.8.8", b"1"), POD, 0).0,
        Verdict::Queued
    );
    a
}

#[test]
fn test_a_table_swap_drops_what_waits_on_a_port_that_moved_and_keeps_the_rest() {
    let spec = node1_spec();
    let mut a = waiting_for_the_gateway(&spec);

    // The same tables again: nothing moved, the packet still waits.
    let r = a.set_tables(Arc::new(spec.compile().unwrap()));
    assert_eq!(r.neigh_queue_removed, 0);
    assert_eq!(a.stats().neigh_waiting, 1);

    // The uplink moves to index 1: what waited for its neighbours goes.
    let mut moved = spec.clone();
    moved.ports.swap(0, 1);
    let r = a.set_tables(Arc::new(moved.compile().unwrap()));
    assert_eq!(r.neigh_queue_removed, 1);
    assert_eq!(a.drops().get(DropReason::NeighQueuePortGone), 1);
    let s = a.stats();
    assert_eq!((s.neigh_waiting, s.neigh_queue_port_gone), (0, 1));
    // The answer, on the uplink's new index, finds nothing to send to a wrong port.
    let (v, out) = run(&mut a, arp_reply(1, GW, GW_MAC), 1, SEC / 100);
    assert_eq!((v, out.len()), (Verdict::Consumed, 0));
}

#[test]
fn test_a_table_swap_drops_what_waits_from_a_pod_that_went() {
    let spec = node1_spec();
    let mut a = waiting_for_the_gateway(&spec);
    let mut gone = spec.clone();
    gone.ports.truncate(1);
    let r = a.set_tables(Arc::new(gone.compile().unwrap()));
    assert_eq!((r.neigh_queue_removed, r.neigh_removed), (1, 0));
    let (_, out) = run(&mut a, arp_reply(1, GW, GW_MAC), UPLINK, SEC / 100);
    assert!(out.is_empty());
}

#[test]
fn test_what_waits_for_the_overlay_follows_its_node_across_a_table_swap() {
    let spec = node1_spec();
    let mut a = compiled(&spec);
    assert_eq!(
        run(&mut a, udp_to("10.244.2.6", b"1"), POD, 0).0,
        Verdict::Queued
    );
    // A node is added before node 2: node 2's index changes, not its address.
    let mut more = spec.clone();
    more.nodes.insert(0, peer(3, "192.168.50.30"));
    let r = a.set_tables(Arc::new(more.compile().unwrap()));
    assert_eq!(r.neigh_queue_removed, 0);
    let (_, out) = run(&mut a, node2_arp_reply(), UPLINK, SEC / 100);
    assert_eq!(out.len(), 1);
    let o = parse(&out[0].1.data, 0).unwrap();
    assert_eq!(
        o.key.dst,
        ip(NODE2),
        "to node 2, not to whichever node has its index"
    );
    let inner = &out[0].1.data[o.l4_off + 8 + vxlan::LEN..];
    assert_eq!(&inner[0..6], &overlay::vtep_mac(ip(NODE2)));

    // Node 2 goes: what waits for it goes too.
    assert_eq!(
        run(&mut a, udp_to("10.244.2.6", b"2"), POD, SEC).0,
        Verdict::Forwarded
    );
    a.neigh = Neighbours::new(neigh::Config::default());
    assert_eq!(
        run(&mut a, udp_to("10.244.2.6", b"3"), POD, 2 * SEC).0,
        Verdict::Queued
    );
    let mut fewer = more.clone();
    fewer.nodes.truncate(1);
    let r = a.set_tables(Arc::new(fewer.compile().unwrap()));
    assert_eq!(r.neigh_queue_removed, 1);
}

#[test]
fn test_the_trace_says_what_a_packet_waits_for_and_when_it_leaves() {
    let (mut a, _) = nodes();
    let mut t = Trace::enabled();
    let mut out = Vec::new();
    let pkt = Packet::new(udp_to("8.8.8.8", b"1"), POD, 0);
    assert_eq!(a.process(pkt, &mut out, &mut t), Verdict::Queued);
    assert_eq!(t.waiting_for, Some((UPLINK, ip(GW))));
    let neigh = t
        .events
        .iter()
        .find(|e| e.stage().name() == "neigh")
        .unwrap();
    assert_eq!(
        neigh.to_string(),
        "queued: next hop 192.168.50.1 unresolved on eth0 (ARP request sent); 1 waiting for it"
    );
    assert!(t.events.iter().any(|e| e.stage().name() == "commit"));
    assert!(!t.events.iter().any(|e| e.stage().name() == "egress"));

    let mut t = Trace::enabled();
    out.clear();
    let reply = Packet::new(arp_reply(1, GW, GW_MAC), UPLINK, 1);
    assert_eq!(a.process(reply, &mut out, &mut t), Verdict::Consumed);
    let stages: Vec<&str> = t.events.iter().map(|e| e.stage().name()).collect();
    assert_eq!(stages, ["neigh", "l2", "egress", "arp"], "{:?}", t.events);
    assert!(
        t.events[0]
            .to_string()
            .starts_with("192.168.50.1 is at 02:00:00:00:00:fe: sending"),
        "{}",
        t.events[0].to_string()
    );
}

#[test]
fn test_a_duplicate_address_probe_for_the_nodes_address_is_told_it_is_taken() {
    let (mut a, _) = nodes();
    let other = [2, 0xbb, 0, 0, 0, 1];
    let me = v6("fd00:50::10");
    let dad = nd::solicit(other, None, Ipv6Addr::UNSPECIFIED, me);
    let (v, out) = run(&mut a, dad, UPLINK, 0);
    assert_eq!((v, out.len()), (Verdict::Consumed, 1));
    let (port, f) = &out[0];
    assert_eq!(*port, UPLINK);
    assert_eq!(
        (&f.data[0..6], &f.data[6..12]),
        (&[0x33, 0x33, 0, 0, 0, 1][..], &uplink_mac(1)[..]),
        "to all nodes"
    );
    let p = parse(&f.data, 0).unwrap();
    assert_eq!(
        (p.key.src.ip(), p.key.dst.ip()),
        (ip("fd00:50::10"), ip("ff02::1"))
    );
    assert_eq!(
        nd_of(&f.data),
        nd::Message::Advert {
            target: me,
            flags: nd::FLAG_OVERRIDE,
            tlla: Some(uplink_mac(1)),
        },
        "unsolicited, overriding"
    );
    assert!(a.neighbours().is_empty(), "a probe teaches nothing");
    // Not the node's address: nothing to say.
    let dad = nd::solicit(other, None, Ipv6Addr::UNSPECIFIED, v6("fd00:50::33"));
    let (v, out) = run(&mut a, dad, UPLINK, 0);
    assert_eq!((v, out.len()), (Verdict::Consumed, 0));
    // A pod probing for its own address is left to have it.
    let pod = v6("fd00:10:244:1::5");
    let dad = nd::solicit(pod_mac(1, 5), None, Ipv6Addr::UNSPECIFIED, pod);
    let (v, out) = run(&mut a, dad, POD, 0);
    assert_eq!((v, out.len()), (Verdict::Consumed, 0));
}

/// A neighbour advertisement of `target` at `mac` (None: without the option) with
/// `flags`, from `from` to node 1's uplink address.
fn na(target: &str, flags: u8, mac: Option<[u8; 6]>, from: [u8; 6]) -> Vec<u8> {
    let t = v6(target);
    let me = v6("fd00:50::10");
    nd::advert(uplink_mac(1), from, None, t, me, t, flags, mac)
}

/// The frames of `out` that are not ARP or ND.
fn sent(out: &[(PortId, Packet)]) -> Vec<&Packet> {
    out.iter()
        .map(|(_, p)| p)
        .filter(|p| {
            let q = parse(&p.data, 0).unwrap();
            q.l3 != L3::Arp && !matches!(nd::parse(&p.data, &q), Ok(Some(_)))
        })
        .collect()
}

#[test]
fn test_an_advertisement_moves_a_neighbour_only_with_the_override_flag() {
    let (mut a, _) = nodes();
    let gw = "fd00:50::1";
    let (s, o) = (nd::FLAG_SOLICITED, nd::FLAG_OVERRIDE);
    let other = [2, 0xee, 0, 0, 0, 1];
    let to_gw = |n: u8| pod_udp("fd00:10:244:1::5", "2001:db8::1", &[n]);
    let state = |a: &Pipeline| {
        let n = a.neighbours().get(UPLINK, ip(gw)).unwrap();
        (n.mac, n.state)
    };
    assert_eq!(run(&mut a, to_gw(1), POD, 0).0, Verdict::Queued);
    // Without the target's MAC an advertisement completes nothing.
    let (v, out) = run(&mut a, na(gw, s | o, None, GW_MAC), UPLINK, 1);
    assert_eq!((v, out.len()), (Verdict::Consumed, 0));
    assert_eq!(state(&a), ([0; 6], neigh::State::Incomplete));
    let (_, out) = run(&mut a, na(gw, s | o, Some(GW_MAC), GW_MAC), UPLINK, 2);
    assert_eq!(sent(&out).len(), 1, "what waited leaves");
    assert_eq!(state(&a), (GW_MAC, neigh::State::Reachable));

    // Unsolicited, not overriding, another MAC: the gateway stays where it is, and is
    // asked again before it is trusted.
    let (v, out) = run(&mut a, na(gw, 0, Some(other), other), UPLINK, 3);
    assert_eq!((v, out.len()), (Verdict::Consumed, 0));
    assert_eq!(state(&a), (GW_MAC, neigh::State::Stale));
    let (v, out) = run(&mut a, to_gw(2), POD, 4);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(&sent(&out)[0].data[0..6], &GW_MAC);
    assert_eq!(
        state(&a),
        (GW_MAC, neigh::State::Delay),
        "used: probed soon"
    );
    // Solicited now, still not overriding: no answer to the node moves it either.
    run(&mut a, na(gw, s, Some(other), other), UPLINK, 5);
    assert_eq!(state(&a), (GW_MAC, neigh::State::Delay));
    // A solicited advertisement to all nodes is malformed.
    let t = v6(gw);
    let group = nd::advert(
        nd::multicast_mac(nd::ALL_NODES),
        other,
        None,
        t,
        nd::ALL_NODES,
        t,
        s | o,
        Some(other),
    );
    let (v, _) = run(&mut a, group, UPLINK, 6);
    assert_eq!(v, Verdict::Dropped(DropReason::NdMalformed));
    assert_eq!(state(&a), (GW_MAC, neigh::State::Delay));
    // Solicited without the option: confirms the MAC known.
    run(&mut a, na(gw, s, None, GW_MAC), UPLINK, 7);
    assert_eq!(state(&a), (GW_MAC, neigh::State::Reachable));
    // Overriding: the neighbour moved, as it says, but that is not an answer.
    run(&mut a, na(gw, o, Some(other), other), UPLINK, 8);
    assert_eq!(state(&a), (other, neigh::State::Stale));
}

#[test]
fn test_only_an_arp_reply_to_the_node_confirms_a_neighbour() {
    let (mut a, _) = nodes();
    learn(&mut a, 1, GW, GW_MAC);
    let state = |a: &Pipeline| {
        let n = a.neighbours().get(UPLINK, ip(GW)).unwrap();
        (n.mac, n.state)
    };
    assert_eq!(state(&a), (GW_MAC, neigh::State::Reachable));
    let IpAddr::V4(gw) = ip(GW) else { panic!() };
    let message = |op, mac, target_ip| arp::Repr {
        op,
        sender_mac: mac,
        sender_ip: gw,
        target_mac: [0xff; 6],
        target_ip,
    };
    // A broadcast gratuitous reply: where it is, not that it answers. It confirms
    // nothing (the entry is no longer confirmed 30 s on), and moves the entry, STALE.
    let garp = |mac| message(arp::REPLY, mac, gw).frame([0xff; 6], mac, None);
    run(&mut a, garp(GW_MAC), UPLINK, 31 * SEC);
    assert_eq!(state(&a), (GW_MAC, neigh::State::Stale));
    let moved = [2, 0, 0, 0, 0, 0xfd];
    run(&mut a, garp(moved), UPLINK, 31 * SEC);
    assert_eq!(state(&a), (moved, neigh::State::Stale));
    run(&mut a, arp_reply(1, GW, GW_MAC), UPLINK, 32 * SEC);
    assert_eq!(state(&a), (GW_MAC, neigh::State::Reachable));
    // A request from it says nothing new of a MAC known.
    let req = arp_request(GW_MAC, GW, "192.168.50.10");
    assert_eq!(run(&mut a, req, UPLINK, 33 * SEC).1.len(), 1, "answered");
    assert_eq!(state(&a), (GW_MAC, neigh::State::Reachable));
    // Another operation (a RARP request, say) is not acted on.
    let other = [2, 0xee, 0, 0, 0, 1];
    let rarp = message(3, other, gw).frame(uplink_mac(1), other, None);
    let (v, out) = run(&mut a, rarp, UPLINK, 34 * SEC);
    assert_eq!((v, out.len()), (Verdict::Consumed, 0));
    assert_eq!(state(&a), (GW_MAC, neigh::State::Reachable));
    // A request from a neighbour being resolved completes it, STALE.
    assert_eq!(
        run(&mut a, udp_to("10.244.2.6", b"1"), POD, 35 * SEC).0,
        Verdict::Queued
    );
    let req = arp_request(uplink_mac(2), NODE2, "192.168.50.10");
    let (_, out) = run(&mut a, req, UPLINK, 36 * SEC);
    let left = sent(&out);
    assert_eq!(left.len(), 1);
    assert_eq!(payload(&left[0].data, true), b"1");
    // STALE, and used at once by what waited: DELAY.
    let n = a.neighbours().get(UPLINK, ip(NODE2)).unwrap();
    assert_eq!((n.mac, n.state), (uplink_mac(2), neigh::State::Delay));
}

#[test]
fn test_a_gateway_that_stops_answering_is_probed_at_its_mac_then_asked_for_anew() {
    let (mut a, _) = nodes();
    learn(&mut a, 1, GW, GW_MAC);
    let send = |a: &mut Pipeline, t: u64| {
        let (v, out) = run(a, udp_to("8.8.8.8", b"x"), POD, t);
        let probes: Vec<_> = out
            .iter()
            .filter(|(_, p)| parse(&p.data, 0).unwrap().l3 == L3::Arp)
            .map(|(_, p)| (<[u8; 6]>::try_from(&p.data[0..6]).unwrap(), arp_of(&p.data)))
            .collect();
        let to: Vec<_> = sent(&out).iter().map(|p| p.data[0..6].to_vec()).collect();
        (v, probes, to)
    };
    // No longer confirmed 30 s on: still used, and not asked at once.
    let (v, probes, to) = send(&mut a, 31 * SEC);
    assert_eq!(
        (v, probes.len(), to),
        (Verdict::Forwarded, 0, vec![GW_MAC.to_vec()])
    );
    assert_eq!(send(&mut a, 33 * SEC).1.len(), 0);
    // 5 s after it was first used so: asked at its own MAC, three times a second apart,
    // while packets still go to it.
    for t in [36, 37, 38] {
        let (v, probes, to) = send(&mut a, t * SEC);
        assert_eq!(
            (v, to),
            (Verdict::Forwarded, vec![GW_MAC.to_vec()]),
            "at {t} s"
        );
        assert_eq!(probes.len(), 1, "at {t} s");
        let (dst, r) = probes[0];
        assert_eq!(dst, GW_MAC, "unicast");
        assert_eq!((r.op, IpAddr::V4(r.target_ip)), (arp::REQUEST, ip(GW)));
        assert_eq!(
            a.neighbours().get(UPLINK, ip(GW)).unwrap().state,
            neigh::State::Probe
        );
    }
    // No answer: failed. The next packet waits, and everyone is asked.
    let (v, probes, to) = send(&mut a, 39 * SEC);
    assert_eq!((v, to.len()), (Verdict::Queued, 0));
    assert_eq!(probes.len(), 1);
    assert_eq!(probes[0].0, [0xff; 6], "broadcast");
    assert_eq!(
        a.neighbours().get(UPLINK, ip(GW)).unwrap().state,
        neigh::State::Incomplete
    );
    // A gateway that answers its probe stays REACHABLE, and is not asked again.
    let (mut b, _) = nodes();
    learn(&mut b, 1, GW, GW_MAC);
    send(&mut b, 31 * SEC);
    assert_eq!(send(&mut b, 36 * SEC).1.len(), 1);
    run(&mut b, arp_reply(1, GW, GW_MAC), UPLINK, 36 * SEC);
    let (v, probes, _) = send(&mut b, 37 * SEC);
    assert_eq!((v, probes.len()), (Verdict::Forwarded, 0));
    assert_eq!(
        b.neighbours().get(UPLINK, ip(GW)).unwrap().state,
        neigh::State::Reachable
    );
}

#[test]
fn test_an_ipv6_neighbour_not_confirmed_is_solicited_at_its_address() {
    let (mut a, _) = nodes();
    let gw = "fd00:50::1";
    let to_gw = || pod_udp("fd00:10:244:1::5", "2001:db8::1", b"v6");
    run(&mut a, to_gw(), POD, 0);
    let (s, o) = (nd::FLAG_SOLICITED, nd::FLAG_OVERRIDE);
    run(&mut a, na(gw, s | o, Some(GW_MAC), GW_MAC), UPLINK, 0);
    run(&mut a, to_gw(), POD, 31 * SEC);
    let (v, out) = run(&mut a, to_gw(), POD, 36 * SEC);
    assert_eq!((v, out.len()), (Verdict::Forwarded, 2));
    let (_, f) = &out[0];
    assert_eq!(&f.data[0..6], &GW_MAC);
    let p = parse(&f.data, 0).unwrap();
    assert_eq!(p.key.dst.ip(), ip(gw), "to its address, not its group");
    assert_eq!(
        nd_of(&f.data),
        nd::Message::Solicit {
            target: v6(gw),
            slla: Some(uplink_mac(1))
        }
    );
}

/// A neighbour solicitation from `src` at `mac` for `target`, with an unknown option
/// that pads it to `len` bytes of IPv6 payload (a receiver ignores such options).
fn padded_solicit(mac: [u8; 6], src: &str, target: &str, len: usize) -> Vec<u8> {
    let (src, target) = (v6(src), v6(target));
    let dst = nd::solicited_node(target);
    let mut body = vec![nd::nd_type::NS, 0, 0, 0, 0, 0, 0, 0];
    body.extend_from_slice(&target.octets());
    body.extend_from_slice(&[1, 1]);
    body.extend_from_slice(&mac);
    let pad = len - body.len();
    body.extend_from_slice(&[0xfe, (pad / 8) as u8]);
    body.resize(len, 0);
    let sum = crate::wire::checksum::add(
        &body,
        crate::wire::checksum::pseudo_v6(&src.octets(), &dst.octets(), proto::ICMPV6, len as u32),
    );
    body[2..4].copy_from_slice(&crate::wire::checksum::finish(sum).to_be_bytes());
    let mut f = Vec::new();
    let ipv6 = crate::wire::ethernet::ethertype::IPV6;
    crate::wire::ethernet::Repr {
        dst: nd::multicast_mac(dst),
        src: mac,
        tag: None,
        ethertype: ipv6,
    }
    .emit(&mut f);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(len as u16).to_be_bytes());
    f.extend_from_slice(&[proto::ICMPV6, 255]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&body);
    f
}

#[test]
fn test_neighbour_discovery_that_came_in_fragments_is_ignored() {
    let (mut a, _) = nodes();
    let ns = padded_solicit(GW_MAC, "fd00:50::1", "fd00:50::10", 1400);
    // Whole, it is a solicitation like any.
    let (v, out) = run(&mut a, ns.clone(), UPLINK, 0);
    assert_eq!((v, out.len()), (Verdict::Consumed, 1));
    let (mut a, _) = nodes();
    let pieces = frags(ns, 7, 1280);
    assert_eq!(pieces.len(), 2);
    assert_eq!(run(&mut a, pieces[0].clone(), UPLINK, 0).0, Verdict::Held);
    let (v, out) = run(&mut a, pieces[1].clone(), UPLINK, 0);
    assert_eq!(
        (v, out.len()),
        (Verdict::Dropped(DropReason::NdFragmented), 0)
    );
    assert!(a.neighbours().is_empty(), "nothing learned");
}

#[test]
fn test_a_probe_is_sent_from_the_address_in_the_targets_subnet() {
    let mut spec = node1_spec();
    for a in ["192.168.70.10/24", "fd00:70::10/64"] {
        spec.ports[0].addresses.push(a.parse().unwrap());
    }
    let mut a = compiled(&spec);
    let (v, out) = run(&mut a, udp_to("192.168.70.33", b"1"), POD, 0);
    assert_eq!((v, out.len()), (Verdict::Queued, 1));
    let r = arp_of(&out[0].1.data);
    assert_eq!(
        (r.sender_ip, r.target_ip),
        (
            "192.168.70.10".parse().unwrap(),
            "192.168.70.33".parse().unwrap()
        )
    );
    // Off every subnet (the gateway is on the first): the first address.
    let (_, out) = run(&mut a, udp_to("8.8.8.8", b"2"), POD, 0);
    assert_eq!(
        arp_of(&out[0].1.data).sender_ip,
        Ipv4Addr::new(192, 168, 50, 10)
    );
    let f = pod_udp("fd00:10:244:1::5", "fd00:70::33", b"3");
    let (v, out) = run(&mut a, f, POD, 0);
    assert_eq!((v, out.len()), (Verdict::Queued, 1));
    let p = parse(&out[0].1.data, 0).unwrap();
    assert_eq!(p.key.src.ip(), ip("fd00:70::10"));
    assert_eq!(
        nd_of(&out[0].1.data),
        nd::Message::Solicit {
            target: v6("fd00:70::33"),
            slla: Some(uplink_mac(1))
        }
    );
}
