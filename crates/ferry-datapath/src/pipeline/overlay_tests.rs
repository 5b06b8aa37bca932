use super::test_support::*;
use super::*;

#[test]
fn test_pod_to_remote_pod_is_vxlan_encapsulated_and_delivered_by_the_peer() {
    let (mut a, mut b) = nodes();
    learn(&mut a, 1, "192.168.50.20", uplink_mac(2));
    let payload = build::pattern(1000, 7);
    let (v, out) = run(
        &mut a,
        udp_from_pod("10.244.2.6", 40000, &payload),
        POD,
        SEC,
    );
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out.len(), 1);
    let (port, f) = &out[0];
    assert_eq!(*port, UPLINK);
    assert_eq!(
        &f.data[0..6],
        &uplink_mac(2),
        "outer destination: the peer's uplink"
    );
    assert_eq!(&f.data[6..12], &uplink_mac(1));
    let o = parse(&f.data, 0).unwrap();
    assert_eq!(o.l3, L3::Ipv4);
    assert!(!o.dont_fragment);
    assert_eq!(o.ttl, 64);
    assert_eq!(
        (o.key.src, o.key.dst, o.key.proto, o.key.dst_port),
        (
            ip("192.168.50.10").into(),
            ip("192.168.50.20").into(),
            proto::UDP,
            4789
        )
    );
    let sport = o.key.src_port;
    assert!(sport >= 49152);
    assert_eq!(
        &f.data[o.l4_off + 6..o.l4_off + 8],
        &[0, 0],
        "no UDP checksum over IPv4"
    );
    let vx = vxlan::Repr::parse(&f.data[o.l4_off + 8..]).unwrap();
    assert_eq!(vx.vni, 4096);
    let inner = &f.data[o.l4_off + 16..];
    let i = parse(inner, 0).unwrap();
    assert_eq!(
        (i.key.src, i.key.dst, i.ttl),
        (ip("10.244.1.5").into(), ip("10.244.2.6").into(), 63)
    );
    assert_eq!(&inner[0..6], &overlay::vtep_mac(ip("192.168.50.20")));
    assert_eq!(&inner[6..12], &overlay::vtep_mac(ip("192.168.50.10")));
    assert_eq!(
        &inner[i.l4_off + 8..i.ip_end],
        &payload[..],
        "inner frame intact"
    );
    assert_eq!(a.stats().encapsulated, 1);

    // The same flow keeps its source port; the outer identification is the next one:
    // each outer datagram has its own, in case the underlay fragments them.
    let (_, again) = run(
        &mut a,
        udp_from_pod("10.244.2.6", 40000, &payload),
        POD,
        SEC,
    );
    assert_eq!(parse(&again[0].1.data, 0).unwrap().key.src_port, sport);
    let id = |f: &[u8]| u16::from_be_bytes([f[18], f[19]]);
    assert_eq!(id(&again[0].1.data), id(&f.data).wrapping_add(1));

    // The peer decapsulates it and delivers it to the right pod.
    let mut t = Trace::enabled();
    let mut got = Vec::new();
    let v = b.process(Packet::new(f.data.clone(), UPLINK, SEC), &mut got, &mut t);
    assert_eq!(v, Verdict::Forwarded, "{:?}", t.events);
    assert_eq!(got.len(), 1);
    let (port, d) = &got[0];
    assert_eq!(*port, POD2);
    assert_eq!(&d.data[0..6], &pod_mac(2, 6));
    assert_eq!(&d.data[6..12], &[0xee, 0xee, 0xee, 0xee, 2, 6]);
    let dp = parse(&d.data, 0).unwrap();
    assert_eq!(
        (dp.key.src, dp.key.dst, dp.ttl),
        (ip("10.244.1.5").into(), ip("10.244.2.6").into(), 62)
    );
    assert_eq!(&d.data[dp.l4_off + 8..dp.ip_end], &payload[..]);
    let stages: Vec<&str> = t.events.iter().map(|e| e.stage().name()).collect();
    assert_eq!(
        stages,
        [
            "parse", "decap", "ct", "route", "mtu", "l2", "commit", "egress"
        ]
    );
    // Conntrack remembers the node the connection came through.
    let (id, _) = b.conntrack().lookup(&dp.key).unwrap();
    assert_eq!(
        b.conntrack().get(id).unwrap().tunnel_peer(),
        Some(ip("192.168.50.10"))
    );
}

#[test]
fn test_reply_returns_through_the_node_the_connection_came_from() {
    // Node 2 learns a connection from a client outside (192.168.60.7) that node 1
    // forwarded; the reply goes back to node 1 encapsulated, not to the gateway.
    let (_, mut b) = nodes();
    learn(&mut b, 2, "192.168.50.10", uplink_mac(1));
    let inner = tcp("192.168.60.7", "10.244.2.5", 5555, 80)
        .flags(tcp_flags::SYN)
        .frame(b"");
    let outer = overlay::encapsulate(&inner, &tunnel(1, 2, 9));
    assert_eq!(run(&mut b, outer, UPLINK, 0).0, Verdict::Forwarded);
    let reply = tcp("10.244.2.5", "192.168.60.7", 80, 5555)
        .seq(9, 2)
        .flags(tcp_flags::SYN | tcp_flags::ACK)
        .opts(&from_pod(2, 5))
        .frame(b"");
    let (v, out) = run(&mut b, reply, POD, 1);
    assert_eq!(v, Verdict::Forwarded);
    let o = parse(&out[0].1.data, 0).unwrap();
    assert_eq!(
        (o.key.dst, o.key.dst_port),
        (ip("192.168.50.10").into(), 4789)
    );
}

#[test]
fn test_source_check_drops_a_pod_sending_as_someone_else() {
    let (mut a, _) = nodes();
    let other_ip = pod_udp("10.244.1.99", "10.244.1.6", b"x");
    assert_eq!(
        run(&mut a, other_ip, POD, 0).0,
        Verdict::Dropped(DropReason::SourceSpoofed)
    );
    let other_mac = build::udp(
        ip("10.244.1.5"),
        ip("10.244.1.6"),
        1,
        2,
        b"x",
        &IpOpts {
            src_mac: [2, 1, 2, 3, 4, 5],
            ..from_pod(1, 5)
        },
    );
    assert_eq!(
        run(&mut a, other_mac, POD, 0).0,
        Verdict::Dropped(DropReason::SourceSpoofed)
    );
    let v6 = pod_udp("fd00:10:244:1::6", "fd00:10:244:1::5", b"x");
    assert_eq!(
        run(&mut a, v6, POD, 0).0,
        Verdict::Dropped(DropReason::SourceSpoofed)
    );
    // Its own addresses pass, to the pod next door.
    let (v, out) = run(&mut a, udp_from_pod("10.244.1.6", 1, b"x"), POD, 0);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out[0].0, POD2);
    assert_eq!(&out[0].1.data[0..6], &pod_mac(1, 6));
    assert_eq!(a.drops().get(DropReason::SourceSpoofed), 3);
}

/// A pod's fragments are source-checked one by one, before reassembly: fragments that
/// claim the pod next door's address are dropped as spoofed, hold nothing, and do not
/// spoil that pod's own datagram of the same identification.
#[test]
fn test_a_pods_fragments_are_source_checked_before_reassembly() {
    let (mut a, _) = nodes();
    let datagram = |src: &str, mac_of: u8| {
        build::udp(
            ip(src),
            ip("10.244.1.5"),
            4000,
            5000,
            &build::pattern(3000, mac_of),
            &IpOpts {
                id: 0x77,
                ..from_pod(1, mac_of)
            },
        )
    };
    // Pod 5 sends the fragments of a datagram from pod 6's address (with its own MAC,
    // and with pod 6's).
    let spoofed = frags(datagram("10.244.1.6", 5), 0x77, 1000);
    let n = spoofed.len();
    for f in spoofed {
        assert_eq!(
            run(&mut a, f, POD, 0).0,
            Verdict::Dropped(DropReason::SourceSpoofed)
        );
    }
    let with_its_mac = frags(datagram("10.244.1.6", 6), 0x77, 1000);
    assert_eq!(
        run(&mut a, with_its_mac[0].clone(), POD, 0).0,
        Verdict::Dropped(DropReason::SourceSpoofed)
    );
    assert_eq!(a.drops().get(DropReason::SourceSpoofed), n as u64 + 1);
    assert_eq!(a.drops().get(DropReason::FragOverlap), 0);
    // Pod 6's own datagram with the same identification goes through whole.
    let (last, out) = run_each(&mut a, with_its_mac, POD2, 0);
    assert_eq!(last, Verdict::Forwarded, "{:?}", a.drops());
    assert_eq!(a.stats().reassembled, 1);
    assert!(!out.is_empty());
}

/// A pod's link is untagged: a VLAN-tagged frame from it, IP or ARP, is dropped, not
/// forwarded with its tag (onto another VLAN of the underlay) nor answered; so is one on
/// the uplink.
#[test]
fn test_vlan_tagged_frames_from_a_pod_or_on_the_uplink_are_dropped() {
    let (mut a, _) = nodes();
    let tag = |mut f: Vec<u8>| {
        f.splice(12..12, [0x81, 0x00, 0x00, 0x64]);
        f
    };
    let udp = tag(udp_from_pod("10.244.1.6", 1, b"x"));
    assert_eq!(parse(&udp, 0).unwrap().vlan, Some(100));
    assert_eq!(
        run(&mut a, udp, POD, 0).0,
        Verdict::Dropped(DropReason::VlanTagged)
    );
    let arp = tag(arp_request(pod_mac(1, 5), "10.244.1.5", "169.254.1.1"));
    let (v, out) = run(&mut a, arp, POD, 0);
    assert_eq!(v, Verdict::Dropped(DropReason::VlanTagged));
    assert!(out.is_empty());
    // Nor on the uplink: there a tagged frame is another VLAN's.
    let from_uplink = tag(build::udp(
        ip("192.168.60.7"),
        ip("10.244.1.5"),
        1,
        2,
        b"x",
        &IpOpts {
            src_mac: GW_MAC,
            dst_mac: uplink_mac(1),
            ..IpOpts::default()
        },
    ));
    assert_eq!(
        run(&mut a, from_uplink, UPLINK, 0).0,
        Verdict::Dropped(DropReason::VlanTagged)
    );
    assert_eq!(a.drops().get(DropReason::VlanTagged), 3);
    // Untagged, the same frame goes through.
    let (v, _) = run(&mut a, udp_from_pod("10.244.1.6", 1, b"x"), POD, 0);
    assert_eq!(v, Verdict::Forwarded);
}

/// What a router never forwards is dropped as not forwardable, from a pod and from the
/// uplink alike: link-local, multicast, loopback, 0/8 and class E destinations, and
/// loopback, multicast and class E sources; the next address over goes through.
#[test]
fn test_martian_and_link_local_addresses_are_not_forwarded() {
    let (mut a, _) = nodes();
    learn(&mut a, 1, "192.168.50.1", GW_MAC);
    let from_pod_to = |dst: &str| {
        let src = if dst.contains(':') {
            "fd00:10:244:1::5"
        } else {
            "10.244.1.5"
        };
        pod_udp(src, dst, b"x")
    };
    for dst in [
        "169.254.1.1",
        "224.0.0.5",
        "255.255.255.255",
        "127.0.0.1",
        "0.1.2.3",
        "240.0.0.1",
        "fe80::1",
        "ff02::1",
        "::1",
        "::",
    ] {
        assert_eq!(
            run(&mut a, from_pod_to(dst), POD, 0).0,
            Verdict::Dropped(DropReason::NotForwardable),
            "to {dst}"
        );
    }
    let from_uplink = |src: &str, dst: &str| {
        build::udp(
            ip(src),
            ip(dst),
            1,
            2,
            b"x",
            &IpOpts {
                src_mac: GW_MAC,
                dst_mac: uplink_mac(1),
                ..IpOpts::default()
            },
        )
    };
    for src in ["127.0.0.1", "224.0.0.5", "240.0.0.1", "169.254.3.4"] {
        assert_eq!(
            run(&mut a, from_uplink(src, "10.244.1.5"), UPLINK, 0).0,
            Verdict::Dropped(DropReason::NotForwardable),
            "from {src}"
        );
    }
    for src in ["::1", "ff02::1"] {
        assert_eq!(
            run(&mut a, from_uplink(src, "fd00:10:244:1::5"), UPLINK, 0).0,
            Verdict::Dropped(DropReason::NotForwardable),
            "from {src}"
        );
    }
    assert_eq!(a.drops().get(DropReason::NotForwardable), 16);
    // Forwarded (or, over IPv6, queued for the gateway's MAC).
    for dst in ["1.0.0.1", "223.255.255.255", "2001:db8::1"] {
        let (v, _) = run(&mut a, from_pod_to(dst), POD, 0);
        assert!(
            matches!(v, Verdict::Forwarded | Verdict::Queued),
            "to {dst}: {v:?}"
        );
    }
    let (v, _) = run(&mut a, from_uplink("192.168.60.7", "10.244.1.5"), UPLINK, 0);
    assert_eq!(v, Verdict::Forwarded);
}

/// An IPv4 link-local address that a route names explicitly (a cloud's metadata service)
/// is forwarded both ways, with the masquerade of the rule that matches it; one only the
/// default route covers is not, nor, whatever the routes, the pods' gateway and the
/// link-local broadcast address.
#[test]
fn test_link_local_addresses_routed_explicitly_are_forwarded() {
    use crate::nat::MatchSpec;
    use crate::tables::RouteSpec;
    let mut s = node1_spec();
    s.routes.push(RouteSpec {
        prefix: "169.254.169.254/32".parse().unwrap(),
        port: "eth0".into(),
        next_hop_mac: None,
        via: Some(ip("192.168.50.1")),
    });
    s.nat = vec![masquerade(MatchSpec {
        src: Some("10.244.0.0/16".parse().unwrap()),
        dst: Some("169.254.0.0/16".parse().unwrap()),
        ..MatchSpec::default()
    })];
    let mut a = compiled(&s);
    learn(&mut a, 1, "192.168.50.1", GW_MAC);
    let to = |dst: &str| {
        let syn = build::tcp_flags::SYN;
        build::tcp(
            ip("10.244.1.5"),
            ip(dst),
            40000,
            80,
            1,
            0,
            syn,
            b"",
            &from_pod(1, 5),
        )
    };
    let (v, out) = run(&mut a, to("169.254.169.254"), POD, 0);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out.len(), 1);
    let (port, f) = &out[0];
    assert_eq!(*port, UPLINK);
    assert_eq!(&f.data[0..6], &GW_MAC, "through the route's gateway");
    let p = parse(&f.data, 0).unwrap();
    assert_eq!(p.key.src.ip(), ip("192.168.50.10"), "masqueraded");
    assert_eq!(p.key.dst.ip(), ip("169.254.169.254"));
    let sport = p.key.src_port;
    // The answer, from the link-local address, reaches the pod translated back.
    let answer = tcp("169.254.169.254", "192.168.50.10", 80, sport)
        .seq(7, 2)
        .flags(build::tcp_flags::SYN | build::tcp_flags::ACK)
        .opts(&IpOpts {
            src_mac: GW_MAC,
            dst_mac: uplink_mac(1),
            ..IpOpts::default()
        })
        .frame(b"");
    let (v, out) = run(&mut a, answer, UPLINK, 0);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out[0].0, POD);
    let p = parse(&out[0].1.data, 0).unwrap();
    assert_eq!(
        (p.key.src.ip(), p.key.dst.ip(), p.key.dst_port),
        (ip("169.254.169.254"), ip("10.244.1.5"), 40000)
    );

    // Only the default route covers 169.254.169.253; the pods' gateway and the broadcast
    // address are never forwarded, even with the whole of 169.254/16 routed.
    s.routes.push(RouteSpec {
        prefix: "169.254.0.0/17".parse().unwrap(),
        port: "eth0".into(),
        next_hop_mac: None,
        via: Some(ip("192.168.50.1")),
    });
    for (dst, routed) in [
        ("169.254.169.253", false),
        ("169.254.1.1", false),
        ("169.254.255.255", false),
        ("169.254.200.1", false),
        ("169.254.1.2", true),
    ] {
        let mut a = compiled(&s);
        learn(&mut a, 1, "192.168.50.1", GW_MAC);
        let (v, _) = run(&mut a, to(dst), POD, 0);
        let want = if routed {
            Verdict::Forwarded
        } else {
            Verdict::Dropped(DropReason::NotForwardable)
        };
        assert_eq!(v, want, "to {dst}");
    }
}

#[test]
fn test_pod_arp_is_answered_from_the_port_mac_for_any_address() {
    let (mut a, _) = nodes();
    let port_mac = [0xee, 0xee, 0xee, 0xee, 1, 5];
    for target in ["169.254.1.1", "10.244.1.6", "8.8.8.8"] {
        let (v, out) = run(
            &mut a,
            arp_request(pod_mac(1, 5), "10.244.1.5", target),
            POD,
            0,
        );
        assert_eq!(v, Verdict::Consumed);
        assert_eq!(out.len(), 1, "one answer, to the pod only");
        let (port, f) = &out[0];
        assert_eq!(*port, POD);
        assert_eq!(&f.data[0..6], &pod_mac(1, 5));
        assert_eq!(&f.data[6..12], &port_mac);
        let r = arp_of(&f.data);
        assert_eq!(r.op, arp::REPLY);
        assert_eq!(
            (r.sender_mac, IpAddr::V4(r.sender_ip)),
            (port_mac, ip(target))
        );
        assert_eq!(
            (r.target_mac, IpAddr::V4(r.target_ip)),
            (pod_mac(1, 5), ip("10.244.1.5"))
        );
    }
    // A duplicate address probe for the pod's own address gets no answer.
    let (v, out) = run(
        &mut a,
        arp_request(pod_mac(1, 5), "0.0.0.0", "10.244.1.5"),
        POD,
        0,
    );
    assert_eq!((v, out.len()), (Verdict::Consumed, 0));
    // Nor does a pod asking as another.
    let (v, out) = run(
        &mut a,
        arp_request(pod_mac(1, 5), "10.244.1.6", "169.254.1.1"),
        POD,
        0,
    );
    assert_eq!(
        (v, out.len()),
        (Verdict::Dropped(DropReason::SourceSpoofed), 0)
    );
    assert_eq!(a.stats().arp_answered, 3);
}

fn ns(src_mac: [u8; 6], src: Ipv6Addr, target: &str) -> Vec<u8> {
    let IpAddr::V6(t) = ip(target) else { panic!() };
    nd::solicit(src_mac, None, src, t)
}

#[test]
fn test_pod_neighbour_solicitation_is_answered_as_a_router() {
    let (mut a, _) = nodes();
    let port_mac = [0xee, 0xee, 0xee, 0xee, 1, 5];
    let ll = nd::link_local(pod_mac(1, 5));
    let (v, out) = run(&mut a, ns(pod_mac(1, 5), ll, "fe80::1"), POD, 0);
    assert_eq!(v, Verdict::Consumed);
    assert_eq!(out.len(), 1);
    let (port, f) = &out[0];
    assert_eq!(*port, POD);
    assert_eq!(
        (&f.data[0..6], &f.data[6..12]),
        (&pod_mac(1, 5)[..], &port_mac[..])
    );
    let p = parse(&f.data, 0).unwrap();
    assert_eq!(
        (p.key.src, p.key.dst, p.ttl),
        (ip("fe80::1").into(), IpAddr::V6(ll).into(), 255)
    );
    // nd::parse verifies the ICMPv6 checksum with the pseudo-header.
    assert_eq!(
        nd::parse(&f.data, &p),
        Ok(Some(nd::Message::Advert {
            target: "fe80::1".parse().unwrap(),
            flags: nd::FLAG_ROUTER | nd::FLAG_SOLICITED | nd::FLAG_OVERRIDE,
            tlla: Some(port_mac),
        }))
    );
    // Also from the pod's global address, for another pod's address.
    let IpAddr::V6(g) = ip("fd00:10:244:1::5") else {
        panic!()
    };
    let (_, out) = run(&mut a, ns(pod_mac(1, 5), g, "fd00:10:244:1::6"), POD, 0);
    assert_eq!(out.len(), 1);
    // Duplicate address detection (from ::) for its own address: silence.
    let (v, out) = run(
        &mut a,
        ns(pod_mac(1, 5), Ipv6Addr::UNSPECIFIED, "fd00:10:244:1::5"),
        POD,
        0,
    );
    assert_eq!((v, out.len()), (Verdict::Consumed, 0));
    // A solicitation that came through a router (hop limit not 255) is refused.
    let mut bad = ns(pod_mac(1, 5), ll, "fe80::1");
    bad[14 + 7] = 64;
    assert_eq!(
        run(&mut a, bad, POD, 0).0,
        Verdict::Dropped(DropReason::NdMalformed)
    );
    assert_eq!(a.stats().nd_answered, 2);
}

#[test]
fn test_uplink_answers_for_the_node_addresses_and_learns_the_asker() {
    let (mut a, _) = nodes();
    let gw = [2, 0, 0, 0, 0, 1];
    let (v, out) = run(
        &mut a,
        arp_request(gw, "192.168.50.1", "192.168.50.10"),
        UPLINK,
        0,
    );
    assert_eq!(v, Verdict::Consumed);
    let r = arp_of(&out[0].1.data);
    assert_eq!(
        (r.op, r.sender_mac, r.target_mac),
        (arp::REPLY, uplink_mac(1), gw)
    );
    assert_eq!(
        a.neighbours().get(UPLINK, ip("192.168.50.1")).unwrap().mac,
        gw,
        "learned from a request addressed to the node"
    );
    // Not for this node: no answer, nothing learned.
    let (v, out) = run(
        &mut a,
        arp_request([2, 0, 0, 0, 0, 9], "192.168.50.9", "192.168.50.33"),
        UPLINK,
        0,
    );
    assert_eq!((v, out.len()), (Verdict::Consumed, 0));
    assert!(a.neighbours().get(UPLINK, ip("192.168.50.9")).is_none());
    // IPv6.
    let IpAddr::V6(s) = ip("fd00:50::1") else {
        panic!()
    };
    let (v, out) = run(&mut a, ns(gw, s, "fd00:50::10"), UPLINK, 0);
    assert_eq!(v, Verdict::Consumed);
    let p = parse(&out[0].1.data, 0).unwrap();
    assert_eq!(
        nd::parse(&out[0].1.data, &p),
        Ok(Some(nd::Message::Advert {
            target: "fd00:50::10".parse().unwrap(),
            flags: nd::FLAG_SOLICITED | nd::FLAG_OVERRIDE,
            tlla: Some(uplink_mac(1)),
        }))
    );
    assert!(a.neighbours().get(UPLINK, ip("fd00:50::1")).is_some());
}

#[test]
fn test_unknown_next_hop_is_probed_and_traffic_flows_once_it_answers() {
    let (mut a, _) = nodes();
    let (v, out) = run(&mut a, udp_from_pod("8.8.8.8", 1, b"q"), POD, 0);
    assert_eq!(v, Verdict::Queued);
    assert_eq!(out.len(), 1, "only the probe leaves");
    let (port, f) = &out[0];
    assert_eq!(*port, UPLINK);
    assert_eq!(&f.data[0..6], &[0xff; 6]);
    let r = arp_of(&f.data);
    assert_eq!(
        (
            r.op,
            r.sender_mac,
            IpAddr::V4(r.sender_ip),
            IpAddr::V4(r.target_ip)
        ),
        (
            arp::REQUEST,
            uplink_mac(1),
            ip("192.168.50.10"),
            ip("192.168.50.1")
        )
    );
    // Probes are rate limited per target.
    let (v, out) = run(&mut a, udp_from_pod("8.8.8.8", 1, b"q"), POD, SEC / 10);
    assert_eq!(v, Verdict::Queued);
    assert!(out.is_empty());
    // The gateway answers: the two packets that waited leave; then traffic flows.
    let (v, out) = run(
        &mut a,
        arp_reply(1, "192.168.50.1", GW_MAC),
        UPLINK,
        SEC / 5,
    );
    assert_eq!((v, out.len()), (Verdict::Consumed, 2));
    for (port, f) in &out {
        assert_eq!(*port, UPLINK);
        assert_eq!(&f.data[0..6], &GW_MAC);
    }
    let (v, out) = run(&mut a, udp_from_pod("8.8.8.8", 1, b"q"), POD, SEC / 4);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(&out[0].1.data[0..6], &GW_MAC);
    assert_eq!(&out[0].1.data[6..12], &uplink_mac(1));

    // IPv6: a neighbour solicitation to the solicited-node group.
    let f = pod_udp("fd00:10:244:1::5", "2001:db8::1", b"q");
    let (v, out) = run(&mut a, f, POD, 0);
    assert_eq!(v, Verdict::Queued);
    let p = parse(&out[0].1.data, 0).unwrap();
    assert_eq!(p.key.dst, ip("ff02::1:ff00:1"));
    assert_eq!(
        nd::parse(&out[0].1.data, &p),
        Ok(Some(nd::Message::Solicit {
            target: "fd00:50::1".parse().unwrap(),
            slla: Some(uplink_mac(1)),
        }))
    );
    assert_eq!(a.stats().neigh_probes, 2);
    assert_eq!(a.stats().neigh_queued, 3);
    assert_eq!(a.drops().total(), 0);
}

fn vxlan_from(src: &str, vni: u32) -> Vec<u8> {
    let inner = udp("10.244.9.9", "10.244.1.5", 1, 2, b"x");
    overlay::encapsulate(
        &inner,
        &overlay::Outer {
            src_mac: [2, 9, 9, 9, 9, 9],
            src: ip(src),
            vni,
            ..tunnel(2, 1, 1)
        },
    )
}

/// An ICMP error about a packet that came through the overlay goes back through the
/// node it came from; while that node's MAC is not known the error is not sent (not
/// queued either), which counts as a suppressed error, not as a second drop.
#[test]
fn test_icmp_error_towards_an_unresolved_node_is_suppressed_not_dropped() {
    let (mut a, _) = nodes();
    let inner = build::udp(
        ip("10.244.2.5"),
        ip("10.244.1.5"),
        1,
        2,
        b"x",
        &IpOpts {
            ttl: 1,
            ..IpOpts::default()
        },
    );
    let o = tunnel(2, 1, 1);
    let mut t = Trace::enabled();
    let mut out = Vec::new();
    let v = a.process(
        Packet::new(overlay::encapsulate(&inner, &o), UPLINK, SEC),
        &mut out,
        &mut t,
    );
    assert_eq!(
        v,
        Verdict::Dropped(DropReason::TtlExceeded),
        "{:?}",
        t.events
    );
    assert_eq!(a.drops().total(), 1, "{:?}", a.drops());
    assert_eq!(a.stats().icmp_suppressed, 1);
    assert_eq!(a.stats().icmp_sent, 0);
    assert!(has_event(&t, "icmp", "neigh_unresolved"), "{:?}", t.events);
}

#[test]
fn test_vxlan_from_an_unknown_node_or_with_another_vni_is_dropped() {
    let (mut a, _) = nodes();
    assert_eq!(
        run(&mut a, vxlan_from("192.168.50.99", 4096), UPLINK, 0).0,
        Verdict::Dropped(DropReason::VxlanUnknownPeer)
    );
    assert_eq!(
        run(&mut a, vxlan_from("192.168.50.20", 77), UPLINK, 0).0,
        Verdict::Dropped(DropReason::VxlanBadVni)
    );
    let (v, out) = run(&mut a, vxlan_from("192.168.50.20", 4096), UPLINK, 0);
    assert_eq!((v, out[0].0), (Verdict::Forwarded, POD));
}

#[test]
fn test_outer_fragments_are_reassembled_before_decap() {
    let (mut a, _) = nodes();
    let inner = udp("10.244.2.9", "10.244.1.5", 1, 2, &build::pattern(1400, 3));
    let outer = overlay::encapsulate(&inner, &tunnel(2, 1, 1));
    let parsed = parse(&outer, 0).unwrap();
    let mut fr = Vec::new();
    ipf::refragment(&Packet::new(outer, 0, 0), &parsed, 1000, &mut fr).unwrap();
    assert_eq!(fr.len(), 2);
    let (last, out) = run_each(&mut a, fr.into_iter().map(|f| f.data), UPLINK, 0);
    assert_eq!(last, Verdict::Forwarded);
    let d = parse(&out[0].1.data, 0).unwrap();
    assert_eq!(
        &out[0].1.data[d.l4_off + 8..d.ip_end],
        &build::pattern(1400, 3)[..]
    );
}

#[test]
fn test_df_too_big_across_the_overlay_gets_icmp_with_the_inner_mtu() {
    let (mut a, _) = nodes();
    learn(&mut a, 1, "192.168.50.20", uplink_mac(2));
    let o = IpOpts {
        dont_fragment: true,
        ..from_pod(1, 5)
    };
    let f = build::udp(ip("10.244.1.5"), ip("10.244.2.6"), 1, 2, &[0; 1472], &o);
    let (v, out) = run(&mut a, f, POD, 0);
    assert_eq!(v, Verdict::Dropped(DropReason::TooBig));
    assert_eq!(out.len(), 1);
    let (port, e) = &out[0];
    assert_eq!(*port, POD);
    let pe = parse(&e.data, 0).unwrap();
    assert_eq!(pe.key.dst_port, 3 << 8 | 4, "fragmentation needed");
    let mtu = u16::from_be_bytes([e.data[pe.l4_off + 6], e.data[pe.l4_off + 7]]);
    assert_eq!(mtu, 1500 - 50);
    // 1450 bytes fit.
    let f = build::udp(ip("10.244.1.5"), ip("10.244.2.6"), 1, 2, &[0; 1422], &o);
    let (v, out) = run(&mut a, f, POD, 0);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out[0].1.data.len(), 14 + 1500);
    // IPv6: packet too big with the same MTU (the underlay is IPv4).
    let f = pod_udp("fd00:10:244:1::5", "fd00:10:244:2::6", &[0; 1452]);
    let (v, out) = run(&mut a, f, POD, 0);
    assert_eq!(v, Verdict::Dropped(DropReason::TooBig));
    let pe = parse(&out[0].1.data, 0).unwrap();
    assert_eq!(pe.key.dst_port, 2 << 8);
    let d = &out[0].1.data[pe.l4_off + 4..pe.l4_off + 8];
    assert_eq!(u32::from_be_bytes(d.try_into().unwrap()), 1450);
}

#[test]
fn test_gso_packet_to_a_remote_pod_is_segmented_to_fit_before_encapsulation() {
    let (mut a, _) = nodes();
    learn(&mut a, 1, "192.168.50.20", uplink_mac(2));
    let pkt = gso_from_pod(20000);
    let (v, out) = run_packet(&mut a, pkt);
    assert_eq!(v, Verdict::Forwarded);
    let mut total = 0;
    let mut sports = std::collections::HashSet::new();
    for (port, f) in &out {
        assert_eq!(*port, UPLINK);
        let o = parse(&f.data, 0).unwrap();
        assert!(o.ip_len() <= 1500 && o.frag.is_none(), "never IP fragments");
        sports.insert(o.key.src_port);
        let i = parse(&f.data[o.l4_off + 16..], 0).unwrap();
        assert!(i.ip_len() <= 1450 && i.frag.is_none());
        total += i.ip_end - i.l4_off - 20;
    }
    assert_eq!(total, 20000);
    assert_eq!(sports.len(), 1, "one flow, one outer source port");
    assert!(out.len() >= 14);
}

#[test]
fn test_reassembled_datagram_is_refragmented_to_the_inner_mtu_before_encapsulation() {
    // 1500-byte fragments from outside to a pod on node 2: their MRU exceeds the
    // overlay's 1450, so they are cut again (IPv4 without DF), then encapsulated.
    let (mut a, _) = nodes();
    learn(&mut a, 1, "192.168.50.20", uplink_mac(2));
    let whole = build::udp(
        ip("192.168.60.7"),
        ip("10.244.2.6"),
        1,
        2,
        &build::pattern(4000, 2),
        &IpOpts {
            dst_mac: uplink_mac(1),
            ..IpOpts::default()
        },
    );
    let parsed = parse(&whole, 0).unwrap();
    let mut fr = Vec::new();
    ipf::refragment(&Packet::new(whole, 0, 0), &parsed, 1500, &mut fr).unwrap();
    let (last, out) = run_each(&mut a, fr.into_iter().map(|f| f.data), UPLINK, 0);
    assert_eq!(last, Verdict::Forwarded);
    assert!(out.len() >= 3);
    let mut r = ipf::Reassembler::new(ipf::Config::default());
    let mut d = DropCounters::default();
    let mut done = None;
    for (port, f) in out {
        assert_eq!(port, UPLINK);
        let o = parse(&f.data, 0).unwrap();
        assert!(
            o.ip_len() <= 1500 && o.frag.is_none(),
            "outer never fragmented"
        );
        let inner = Packet::new(f.data[o.l4_off + 16..].to_vec(), 0, 0);
        let i = parse(&inner.data, 0).unwrap();
        assert!(i.ip_len() <= 1450 && i.frag.is_some());
        if let ipf::Outcome::Complete(w, pw) = r.process(inner, &i, &mut d) {
            done = Some(w.data[pw.l4_off + 8..pw.ip_end].to_vec());
        }
    }
    assert_eq!(done.unwrap(), build::pattern(4000, 2));
}

#[test]
fn test_cross_subnet_encapsulates_only_peers_outside_the_uplink_subnet() {
    let spec = node_spec(
        1,
        ModeSpec::CrossSubnet,
        vec![peer(2, "192.168.50.20"), peer(3, "10.9.0.30")],
    );
    let t = spec.compile().unwrap();
    assert!(!t.overlay.as_ref().unwrap().peers[0].encap);
    assert!(t.overlay.as_ref().unwrap().peers[1].encap);
    let mut a = Pipeline::new(Arc::new(t));
    learn(&mut a, 1, "192.168.50.20", uplink_mac(2));
    learn(&mut a, 1, "192.168.50.1", GW_MAC);
    // Same subnet: routed directly to the peer's MAC.
    let (v, out) = run(&mut a, udp_from_pod("10.244.2.6", 1, b"x"), POD, 0);
    assert_eq!(v, Verdict::Forwarded);
    let p = parse(&out[0].1.data, 0).unwrap();
    assert_eq!(p.key.dst, ip("10.244.2.6"));
    assert_eq!(&out[0].1.data[0..6], &uplink_mac(2));
    // Another subnet: encapsulated, the outer frame to the gateway.
    let (v, out) = run(&mut a, udp_from_pod("10.244.3.6", 1, b"x"), POD, 0);
    assert_eq!(v, Verdict::Forwarded);
    let p = parse(&out[0].1.data, 0).unwrap();
    assert_eq!((p.key.dst, p.key.dst_port), (ip("10.9.0.30").into(), 4789));
    assert_eq!(&out[0].1.data[0..6], &GW_MAC);
}

#[test]
fn test_pod_mtu_is_derived_from_the_uplink_unless_given() {
    let t = node1_spec().compile().unwrap();
    assert_eq!(t.ports[usize::from(POD)].mtu, 1450);
    assert_eq!(t.ports[usize::from(UPLINK)].mtu, 1500);
    let mut s = node_spec(1, ModeSpec::Always, vec![peer(2, "fd00:50::20")]);
    assert_eq!(s.compile().unwrap().ports[usize::from(POD)].mtu, 1430);
    s.ports[1].mtu = Some(1400);
    assert_eq!(s.compile().unwrap().ports[usize::from(POD)].mtu, 1400);
    // A node on an IPv6 underlay before its first peer: the IPv6 overhead already, so
    // that pods keep their MTU when peers join.
    let mut s = node_spec(1, ModeSpec::Always, vec![]);
    s.ports[0].addresses.retain(|a| a.addr.is_ipv6());
    let t = s.compile().unwrap();
    assert_eq!((t.ports[usize::from(POD)].mtu, t.pod_mtu), (1430, 1430));
    // A dual-stack node without peers, an IPv4 one: the IPv4 overhead.
    let t = node_spec(1, ModeSpec::Always, vec![]).compile().unwrap();
    assert_eq!(t.pod_mtu, 1450);
    // Mode never encapsulates nothing: the uplink's MTU.
    let t = node_spec(1, ModeSpec::Never, vec![peer(2, "192.168.50.20")])
        .compile()
        .unwrap();
    assert_eq!((t.ports[usize::from(POD)].mtu, t.pod_mtu), (1500, 1500));
}

#[test]
fn test_overlay_tables_errors_name_the_entry() {
    let mut s = node1_spec();
    s.ports[1].peer_mac = None;
    let e = s.compile().unwrap_err();
    assert!(e.contains("ports[1]") && e.contains("peer_mac"), "{e}");
    let mut s = node1_spec();
    s.overlay.as_mut().unwrap().uplink = "pod-a".into();
    assert!(s.compile().unwrap_err().contains("not of kind uplink"));
    let mut s = node1_spec();
    s.overlay = None;
    assert!(s.compile().unwrap_err().contains("nodes"));
    let mut s = node1_spec();
    s.nodes[0].pod_cidrs.push("10.244.1.5/32".parse().unwrap());
    let e = s.compile().unwrap_err();
    assert!(
        e.contains("nodes[0] (\"node2\")") && e.contains("duplicates"),
        "{e}"
    );
    let mut s = node1_spec();
    s.routes.clear();
    s.nodes[0].address = ip("10.1.1.1");
    assert!(s.compile().unwrap_err().contains("no route to 10.1.1.1"));
}

/// The two nodes of the tests, their uplinks taking GSO.
fn nodes_with_uplink_gso() -> (Pipeline, Pipeline) {
    let spec = |n: u8, peer_n: u8, peer_addr: &str| {
        let mut s = node_spec(n, ModeSpec::Always, vec![peer(peer_n, peer_addr)]);
        s.ports[0].gso = true;
        compiled(&s)
    };
    (spec(1, 2, "192.168.50.20"), spec(2, 1, "192.168.50.10"))
}

/// The inner TCP segments (sequence number, payload) that node 2 delivers to its pod.
fn delivered(out: &[(PortId, Packet)]) -> Vec<(u32, Vec<u8>)> {
    out.iter()
        .map(|(port, d)| {
            assert_eq!(*port, POD2);
            let p = parse(&d.data, 0).unwrap();
            let t = &d.data[p.l4_off..p.ip_end];
            let seq = u32::from_be_bytes(t[4..8].try_into().unwrap());
            (seq, t[usize::from(t[12] >> 4) * 4..].to_vec())
        })
        .collect()
}

#[test]
fn test_gso_packet_to_a_remote_pod_leaves_as_udp_gso_super_frames_when_the_uplink_takes_gso() {
    let (mut plain_a, mut plain_b) = nodes();
    let (mut a, mut b) = nodes_with_uplink_gso();
    for p in [&mut plain_a, &mut a] {
        learn(p, 1, "192.168.50.20", uplink_mac(2));
    }
    // Without GSO on the uplink: one VXLAN datagram per segment.
    let mut plain = Vec::new();
    plain_a.process(gso_from_pod(65000), &mut plain, &mut Trace::disabled());
    assert!(plain.iter().all(|(_, f)| !f.meta.vnet.is_gso()));
    let segments = plain.len();
    assert!(segments >= 43, "{segments}");

    let mut t = Trace::enabled();
    let mut out = Vec::new();
    assert_eq!(
        a.process(gso_from_pod(65000), &mut out, &mut t),
        Verdict::Forwarded
    );
    assert!(has_event(&t, "encap", "super-frames"), "{:?}", t.events);
    // 65 000 bytes in 1410-byte segments do not fit one 64 KiB super-frame.
    assert_eq!(out.len(), 2);
    assert_eq!(a.stats().encap_gso_frames, 2);
    assert_eq!(a.stats().encapsulated, segments as u64);
    let mut cut = Vec::new();
    for (port, f) in &out {
        assert_eq!(*port, UPLINK);
        let v = f.meta.vnet;
        assert_eq!((v.gso_type, v.needs_csum()), (VnetHdr::GSO_UDP_L4, true));
        let o = parse(&f.data, 0).unwrap();
        assert_eq!(usize::from(v.csum_start), o.l4_off);
        assert!(o.ip_len() <= 65535);
        // What the kernel makes of it: datagrams that fit the uplink.
        let mut pieces = Vec::new();
        gso::segment(f, &o, 1500, &mut pieces).unwrap();
        for d in &pieces {
            assert!(parse(&d.data, 0).unwrap().ip_len() <= 1500);
        }
        cut.extend(pieces);
    }
    assert_eq!(cut.len(), segments);

    // The peer delivers the same segments from the super-frames, from the datagrams
    // they are cut into, and from the plain datagrams.
    let deliver = |b: &mut Pipeline, frames: Vec<Packet>| {
        let mut got = Vec::new();
        for mut f in frames {
            f.meta.in_port = UPLINK;
            assert_eq!(
                b.process(f, &mut got, &mut Trace::disabled()),
                Verdict::Forwarded
            );
        }
        delivered(&got)
    };
    let expect = deliver(&mut plain_b, plain.into_iter().map(|(_, f)| f).collect());
    assert_eq!(expect.len(), segments);
    assert_eq!(expect.iter().map(|(_, d)| d.len()).sum::<usize>(), 65000);
    let from_super = deliver(&mut b, out.into_iter().map(|(_, f)| f).collect());
    assert_eq!(from_super, expect);
    assert_eq!(b.stats().decap_gso_frames, 2);
    // Each super-frame's segments were coalesced and went through the pipeline as one
    // packet (cut again here for a pod port without gso).
    assert_eq!(b.stats().decap_coalesced, segments as u64 - 2);
    assert_eq!(b.stats().decapsulated, segments as u64);
    let (_, mut b2) = nodes_with_uplink_gso();
    assert_eq!(deliver(&mut b2, cut), expect);
}

/// A GSO packet of small segments (a peer that advertised an MSS of 536) would be more
/// than a hundred datagrams in one super-frame, more than Linux takes: each super-frame
/// holds at most `overlay::MAX_RUN_DATAGRAMS`, and the peer delivers every segment.
#[test]
fn test_small_segments_leave_in_super_frames_the_kernel_takes() {
    let (mut a, mut b) = nodes_with_uplink_gso();
    learn(&mut a, 1, "192.168.50.20", uplink_mac(2));
    let mut pkt = gso_from_pod(60000);
    pkt.meta.vnet.gso_size = 536;
    let (v, out) = run_packet(&mut a, pkt);
    assert_eq!(v, Verdict::Forwarded);
    let segments = 60000usize.div_ceil(536);
    assert_eq!(a.stats().encapsulated, segments as u64);
    let mut datagrams = 0;
    let mut ids = Vec::new();
    for (_, f) in &out {
        let o = parse(&f.data, 0).unwrap();
        let mut pieces = Vec::new();
        gso::segment(f, &o, 1500, &mut pieces).unwrap();
        assert!(
            pieces.len() <= overlay::MAX_RUN_DATAGRAMS,
            "{}",
            pieces.len()
        );
        datagrams += pieces.len();
        ids.extend(
            pieces
                .iter()
                .map(|d| u16::from_be_bytes([d.data[18], d.data[19]])),
        );
    }
    assert_eq!(datagrams, segments);
    assert!(out.len() >= segments.div_ceil(overlay::MAX_RUN_DATAGRAMS));
    // Every outer datagram has an identification of its own.
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), segments);
    let mut got = Vec::new();
    for (_, mut f) in out {
        f.meta.in_port = UPLINK;
        assert_eq!(
            b.process(f, &mut got, &mut Trace::disabled()),
            Verdict::Forwarded
        );
    }
    let delivered = delivered(&got);
    assert_eq!(delivered.iter().map(|(_, d)| d.len()).sum::<usize>(), 60000);
    assert_eq!(b.stats().decapsulated, segments as u64);
}

/// A UDP GSO super-frame from node 1 to node 2 holding two VXLAN datagrams, each a
/// 100-byte UDP datagram to pod 10.244.2.6, with its virtio-net header.
fn udp_super_frame() -> (Vec<u8>, VnetHdr) {
    udp_super_frame_from("192.168.50.10")
}

/// [`udp_super_frame`] with the outer source address `src`.
fn udp_super_frame_from(src: &str) -> (Vec<u8>, VnetHdr) {
    let inner = udp("10.244.1.5", "10.244.2.6", 1, 2, &build::pattern(100, 3));
    let o = overlay::Outer {
        src: ip(src),
        ..tunnel(1, 2, 9)
    };
    let mut frames = Vec::new();
    overlay::encapsulate_run(&[&inner, &inner][..], &o, &mut frames);
    assert_eq!(frames.len(), 1);
    frames.pop().unwrap()
}

#[test]
fn test_malformed_udp_gso_super_frame_is_dropped_whole_or_per_datagram() {
    let (_, mut b) = nodes_with_uplink_gso();
    let (frame, vnet) = udp_super_frame();
    assert!(vnet.is_gso());
    // A segment size that cannot hold a VXLAN header.
    let mut pkt = Packet::new(frame.clone(), UPLINK, 0);
    pkt.meta.vnet = VnetHdr {
        gso_size: 4,
        ..vnet
    };
    let mut out = Vec::new();
    assert_eq!(
        b.process(pkt, &mut out, &mut Trace::disabled()),
        Verdict::Dropped(DropReason::GsoMalformed)
    );
    // A segment size that cuts the datagrams in the wrong places: each piece is refused
    // on its own (here: no VXLAN header where one should be), nothing is delivered.
    let mut pkt = Packet::new(frame, UPLINK, 0);
    pkt.meta.vnet = VnetHdr {
        gso_size: vnet.gso_size - 20,
        ..vnet
    };
    let v = b.process(pkt, &mut out, &mut Trace::disabled());
    assert!(matches!(v, Verdict::Dropped(_)), "{v:?}");
    assert!(out.is_empty());
    assert_eq!(b.stats().decapsulated, 0);
}

#[test]
fn test_udp_gso_super_frame_from_an_unknown_node_is_dropped_datagram_by_datagram() {
    let (_, mut b) = nodes_with_uplink_gso();
    let (frame, vnet) = udp_super_frame_from("192.168.50.99");
    let mut pkt = Packet::new(frame, UPLINK, 0);
    pkt.meta.vnet = vnet;
    let (v, out) = run_packet(&mut b, pkt);
    assert_eq!(v, Verdict::Dropped(DropReason::VxlanUnknownPeer));
    assert!(out.is_empty());
    assert_eq!(
        b.drops().get(DropReason::VxlanUnknownPeer),
        2,
        "both datagrams"
    );
    assert_eq!(b.stats().decapsulated, 0);
}

#[test]
fn test_inner_packets_of_a_frame_with_a_partial_outer_checksum_count_as_verified() {
    // A partial outer checksum: the frame comes from this host's memory (a veth from a
    // local sender), so the inner packet is marked valid for what follows (coalescing,
    // the pod's kernel); a frame with a complete checksum gives no such mark.
    let (_, mut b) = nodes_with_uplink_gso();
    let (frame, vnet) = udp_super_frame();
    for (partial, valid) in [(true, true), (false, false)] {
        let mut pkt = Packet::new(frame.clone(), UPLINK, 0);
        pkt.meta.vnet = vnet;
        if !partial {
            pkt.meta.vnet.flags = 0;
        }
        let (v, out) = run_packet(&mut b, pkt);
        assert_eq!(v, Verdict::Forwarded);
        assert_eq!(out.len(), 2);
        for (port, p) in &out {
            assert_eq!(*port, POD2);
            assert_eq!(p.meta.vnet.flags & VnetHdr::F_DATA_VALID != 0, valid);
        }
    }
}

/// Sets the ECN field of the IPv4 header of an Ethernet frame at `l3` (checksum fixed).
fn with_ecn(mut f: Vec<u8>, l3: usize, e: u8) -> Vec<u8> {
    f[l3 + 1] = (f[l3 + 1] & !3) | e;
    checksum::set_ipv4_header(&mut f[l3..l3 + 20]);
    f
}

/// Congestion marks cross the overlay (RFC 6040): the outer header carries the inner
/// packet's ECN field (CE as ECT(0)); an outer CE marks an ECN-capable inner packet CE
/// and drops one that is not ECN-capable; another outer field changes nothing.
#[test]
fn test_ecn_crosses_the_overlay_both_ways() {
    let (mut a, mut b) = nodes();
    learn(&mut a, 1, "192.168.50.20", uplink_mac(2));
    let mut outer_of = Vec::new();
    for (inner, outer) in [(0, 0), (1, 1), (2, 2), (3, 2)] {
        let f = with_ecn(udp_from_pod("10.244.2.6", 40000, b"x"), 14, inner);
        let (v, out) = run(&mut a, f, POD, SEC);
        assert_eq!(v, Verdict::Forwarded);
        let d = &out[0].1.data;
        let o = parse(d, 0).expect("a valid outer header");
        assert_eq!(d[o.l3_off + 1], outer, "outer TOS for inner ECN {inner}");
        assert_eq!(
            d[o.l4_off + 16 + 15] & 3,
            inner,
            "the inner packet keeps its own"
        );
        outer_of.push(d.clone());
    }
    // The underlay marks the datagrams CE.
    let marked = |i: usize, e: u8| with_ecn(outer_of[i].clone(), 14, e);
    let inner_ecn = |out: &[(PortId, Packet)]| {
        assert_eq!(out[0].0, POD2);
        let p = parse(&out[0].1.data, 0).expect("a valid inner header");
        out[0].1.data[p.l3_off + 1] & 3
    };
    for (i, want) in [(1, 3), (2, 3), (3, 3)] {
        let (v, out) = run(&mut b, marked(i, 3), UPLINK, SEC);
        assert_eq!(v, Verdict::Forwarded);
        assert_eq!(inner_ecn(&out), want, "inner ECN {i} under an outer CE");
    }
    let (v, _) = run(&mut b, marked(0, 3), UPLINK, SEC);
    assert_eq!(v, Verdict::Dropped(DropReason::VxlanCeNotEct));
    assert_eq!(b.drops().get(DropReason::VxlanCeNotEct), 1);
    // An outer ECT around a Not-ECT inner packet is passed on unchanged.
    let (v, out) = run(&mut b, marked(0, 2), UPLINK, SEC);
    assert_eq!((v, inner_ecn(&out)), (Verdict::Forwarded, 0));
}

/// The same through UDP GSO super-frames: the outer header, and its mark, is every
/// datagram's.
#[test]
fn test_ecn_of_a_udp_gso_super_frame_marks_each_datagram() {
    let (_, mut b) = nodes_with_uplink_gso();
    let inner = |e: u8| {
        let f = udp("10.244.1.5", "10.244.2.6", 1, 2, &build::pattern(100, 3));
        with_ecn(f, 14, e)
    };
    let o = tunnel(1, 2, 9);
    for (e, want) in [(1, Some(3)), (0, None)] {
        let mut frames = Vec::new();
        overlay::encapsulate_run(&[inner(e), inner(e)][..], &o, &mut frames);
        let (frame, vnet) = frames.pop().unwrap();
        assert!(vnet.is_gso());
        assert_eq!(frame[15], e, "the outer header carries the inner field");
        let mut pkt = Packet::new(with_ecn(frame, 14, 3), UPLINK, SEC);
        pkt.meta.vnet = vnet;
        let (v, out) = run_packet(&mut b, pkt);
        match want {
            Some(w) => {
                assert_eq!(v, Verdict::Forwarded);
                assert_eq!(out.len(), 2);
                for (_, d) in &out {
                    let p = parse(&d.data, 0).expect("a valid inner header");
                    assert_eq!(d.data[p.l3_off + 1] & 3, w);
                }
            }
            None => {
                assert_eq!(v, Verdict::Dropped(DropReason::VxlanCeNotEct));
                assert!(out.is_empty());
                assert_eq!(b.drops().get(DropReason::VxlanCeNotEct), 2);
            }
        }
    }
}

/// A unicast frame on the uplink for another host's MAC (flooded by a switch to the
/// promiscuous uplink) is neither answered nor forwarded; broadcast and the uplink's
/// own MAC are taken as before.
#[test]
fn test_frames_for_another_hosts_mac_are_not_the_nodes() {
    let (mut a, _) = nodes();
    let to = |dst_mac: [u8; 6]| {
        build::udp(
            ip("192.168.60.7"),
            ip("10.244.1.5"),
            1,
            2,
            b"x",
            &IpOpts {
                src_mac: GW_MAC,
                dst_mac,
                ..IpOpts::default()
            },
        )
    };
    let other = [2, 0xaa, 0, 0, 0, 9];
    let (v, out) = run(&mut a, to(other), UPLINK, 0);
    assert_eq!(v, Verdict::Dropped(DropReason::OtherHost));
    assert!(out.is_empty());
    let (v, out) = run(&mut a, to(uplink_mac(1)), UPLINK, 0);
    assert_eq!((v, out[0].0), (Verdict::Forwarded, POD));
    // An ARP request for the node's address, unicast to another host: not answered.
    let mut req = arp_request(GW_MAC, "192.168.50.1", "192.168.50.10");
    req[0..6].copy_from_slice(&other);
    let (v, out) = run(&mut a, req.clone(), UPLINK, 0);
    assert_eq!(v, Verdict::Dropped(DropReason::OtherHost));
    assert!(out.is_empty());
    req[0..6].copy_from_slice(&[0xff; 6]);
    let (v, out) = run(&mut a, req, UPLINK, 0);
    assert_eq!((v, out.len()), (Verdict::Consumed, 1));
    assert_eq!(a.drops().get(DropReason::OtherHost), 2);
}

/// Whether the TCP checksum of an IPv4 frame verifies.
fn tcp4_checksum_ok(data: &[u8]) -> bool {
    let p = parse(data, 0).unwrap();
    let ip = &data[p.l3_off..];
    let t = &data[p.l4_off..p.ip_end];
    let pseudo = checksum::pseudo_v4(
        ip[12..16].try_into().unwrap(),
        ip[16..20].try_into().unwrap(),
        proto::TCP,
        t.len() as u16,
    );
    checksum::verify(t, pseudo)
}

/// A UDP GSO super-frame whose outer checksum is partial counts as never having left the
/// host's memory, so its inner segments are coalesced without being summed again. Not
/// when its outer UDP checksum is 0: the host's UDP GRO leaves datagrams merged from the
/// wire partial too, and nothing verified them. A segment corrupted on the wire then is
/// not coalesced into a packet whose checksum would be made anew, which would hide it:
/// it reaches the pod as it came, and its kernel drops it.
#[test]
fn test_a_super_frame_without_outer_checksum_has_its_segments_verified() {
    let (mut a, _) = nodes_with_uplink_gso();
    learn(&mut a, 1, "192.168.50.20", uplink_mac(2));
    let mut out = Vec::new();
    a.process(gso_from_pod(20000), &mut out, &mut Trace::disabled());
    let (_, mut frame) = out.swap_remove(0);
    assert!(frame.meta.vnet.needs_csum() && frame.meta.vnet.is_gso());
    let o = parse(&frame.data, 0).unwrap();
    // The third datagram's inner TCP payload has one byte changed.
    let size = usize::from(frame.meta.vnet.gso_size);
    let third = o.l4_off + 8 + 2 * size;
    frame.data[third + 200] ^= 0x55;
    for (zero_outer_csum, bad_delivered) in [(false, 0), (true, 1)] {
        let mut f = frame.clone();
        if zero_outer_csum {
            f.data[o.l4_off + 6..o.l4_off + 8].copy_from_slice(&[0, 0]);
        }
        f.meta.in_port = UPLINK;
        let (_, mut b) = nodes_with_uplink_gso();
        let mut got = Vec::new();
        b.process(f, &mut got, &mut Trace::disabled());
        assert!(!got.is_empty());
        let bad = got
            .iter()
            .filter(|(port, d)| *port == POD2 && !tcp4_checksum_ok(&d.data))
            .count();
        assert_eq!(bad, bad_delivered, "outer checksum 0: {zero_outer_csum}");
    }
}
