//! Pipeline tests: forwarding, fragments, GSO, conntrack and NAT, offload checks.

use super::test_support::{
    compiled, frags, gso_packet, ip, l4_sum_v4, masquerade, run, run_each, run_packet, tcp, udp,
};
use super::*;
use crate::tables::{MacAddr, PortSpec, RouteSpec, TablesSpec};
use crate::wire::build::{self, IpOpts, tcp_flags};
use crate::{DropCounters, ipf::Reassembler};

const UPLINK: PortId = 0;
const POD: PortId = 1;
const BIG: PortId = 2;
const POD_MAC: [u8; 6] = [0x0a, 0x58, 0, 0, 0, 5];

fn port(name: &str, last: u8, mtu: u16, addrs: &[&str], gro: bool, gso: bool) -> PortSpec {
    PortSpec {
        name: name.into(),
        mac: MacAddr([2, 0xfe, 0, 0, 0, last]),
        mtu: Some(mtu),
        addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        gro,
        gso,
        ..PortSpec::default()
    }
}

/// The uplink (1500, GRO, the node's addresses) and the pod port (1450).
fn uplink_and_pod() -> [PortSpec; 2] {
    [
        port(
            "uplink",
            1,
            1500,
            &["192.168.50.10", "fd00:50::10"],
            true,
            false,
        ),
        port("pod", 2, 1450, &["169.254.1.1"], false, false),
    ]
}

fn route(prefix: &str, port: &str, mac: [u8; 6]) -> RouteSpec {
    RouteSpec {
        prefix: prefix.parse().unwrap(),
        port: port.into(),
        next_hop_mac: Some(MacAddr(mac)),
        via: None,
    }
}

/// A broadcast ARP request from 10.0.0.1 for 10.0.0.2, written out byte by byte.
fn arp_request_for_10_0_0_2() -> Vec<u8> {
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2]);
    arp
}

/// uplink (1500, GRO, addresses), pod (1450), big (9000, GSO-capable).
fn pipeline() -> Pipeline {
    let spec = TablesSpec {
        ports: [
            &uplink_and_pod()[..],
            &[port("big", 3, 9000, &[], false, true)],
        ]
        .concat(),
        routes: vec![
            route("10.244.1.5/32", "pod", POD_MAC),
            route("fd00:10:244:1::5/128", "pod", POD_MAC),
            route("10.244.9.0/24", "big", [0x0a, 0x58, 0, 0, 0, 9]),
            route("0.0.0.0/0", "uplink", [2, 0, 0, 0, 0, 0xfe]),
            route("::/0", "uplink", [2, 0, 0, 0, 0, 0xfe]),
        ],
        ..TablesSpec::default()
    };
    compiled(&spec)
}

#[test]
fn test_forward_decrements_ttl_and_rewrites_macs() {
    let mut p = pipeline();
    let f = udp("192.168.50.1", "10.244.1.5", 1, 2, b"hi");
    let (v, out) = run(&mut p, f, UPLINK, 0);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out.len(), 1);
    let (port, pkt) = &out[0];
    assert_eq!(*port, POD);
    assert_eq!(&pkt.data[0..6], &POD_MAC);
    assert_eq!(&pkt.data[6..12], &[2, 0xfe, 0, 0, 0, 2]);
    let q = parse(&pkt.data, 0).expect("header checksum still valid after the TTL update");
    assert_eq!(q.ttl, 63);
    assert_eq!(p.port_stats()[usize::from(POD)].tx_packets, 1);
}

#[test]
fn test_unknown_port_no_route_and_arp_are_counted() {
    let mut p = pipeline();
    let f = udp("192.168.50.1", "10.244.1.5", 1, 2, b"");
    assert_eq!(
        run(&mut p, f, 9, 0).0,
        Verdict::Dropped(DropReason::UnknownPort)
    );
    let f = udp("fd00::1", "fd00::2", 1, 2, b"");
    let spec = TablesSpec {
        ports: vec![port("only", 1, 1500, &[], false, false)],
        routes: vec![],
        ..TablesSpec::default()
    };
    let mut q = compiled(&spec);
    assert_eq!(
        run(&mut q, f, 0, 0).0,
        Verdict::Dropped(DropReason::NoRoute)
    );
    assert_eq!(q.drops().get(DropReason::NoRoute), 1);
    let arp = arp_request_for_10_0_0_2();
    assert_eq!(
        run(&mut p, arp, UPLINK, 0).0,
        Verdict::Dropped(DropReason::ArpNotHandled)
    );
}

#[test]
fn test_ttl_one_is_answered_with_time_exceeded() {
    let mut p = pipeline();
    let o = IpOpts {
        ttl: 1,
        ..IpOpts::default()
    };
    let f = build::udp(ip("192.168.50.1"), ip("10.244.1.5"), 1, 2, b"x", &o);
    let (v, out) = run(&mut p, f, UPLINK, 0);
    assert_eq!(v, Verdict::Dropped(DropReason::TtlExceeded));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, UPLINK);
    let q = parse(&out[0].1.data, 0).unwrap();
    assert_eq!(q.key.dst_port, 11 << 8, "ICMP time exceeded");
    assert_eq!(q.key.src, ip("192.168.50.10"));
}

#[test]
fn test_df_too_big_gets_fragmentation_needed_with_mtu() {
    let mut p = pipeline();
    let o = IpOpts {
        dont_fragment: true,
        ..IpOpts::default()
    };
    let f = build::udp(ip("192.168.50.1"), ip("10.244.1.5"), 1, 2, &[0; 1472], &o);
    let (v, out) = run(&mut p, f, UPLINK, 0);
    assert_eq!(v, Verdict::Dropped(DropReason::TooBig));
    assert_eq!(out.len(), 1);
    let icmp = &out[0].1.data;
    let q = parse(icmp, 0).unwrap();
    assert_eq!(q.key.dst_port, 3 << 8 | 4);
    assert_eq!(
        u16::from_be_bytes([icmp[q.l4_off + 6], icmp[q.l4_off + 7]]),
        1450
    );
    // IPv6 is never fragmented by a router: packet too big.
    let f = udp("fd00:50::1", "fd00:10:244:1::5", 1, 2, &[0; 1452]);
    let (v, out) = run(&mut p, f, UPLINK, 0);
    assert_eq!(v, Verdict::Dropped(DropReason::TooBig));
    let q = parse(&out[0].1.data, 0).unwrap();
    assert_eq!(q.key.dst_port, 2 << 8);
    assert_eq!(p.stats().icmp_sent, 2);
}

#[test]
fn test_ipv4_without_df_is_fragmented_to_mtu() {
    let mut p = pipeline();
    let f = udp("192.168.50.1", "10.244.1.5", 1, 2, &[7; 1472]);
    let (v, out) = run(&mut p, f, UPLINK, 0);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out.len(), 2);
    assert!(
        out.iter()
            .all(|(port, f)| *port == POD && f.data.len() - 14 <= 1450)
    );
}

#[test]
fn test_reassembled_datagram_is_refragmented_to_mru_not_mtu() {
    let mut p = pipeline();
    let whole = udp(
        "192.168.50.1",
        "10.244.9.7",
        40000,
        8080,
        &build::pattern(3000, 1),
    );
    let fs = frags(whole, 0x42, 1000);
    let n = fs.len();
    let mut last = (Verdict::Held, Vec::new());
    for (i, f) in fs.into_iter().rev().enumerate() {
        last = run(&mut p, f, UPLINK, i as u64);
        if i + 1 < n {
            assert_eq!(last.0, Verdict::Held);
        }
    }
    assert_eq!(last.0, Verdict::Forwarded);
    // Port "big" has MTU 9000 but the fragments were at most 1000 bytes: refragment to 1000.
    assert_eq!(last.1.len(), n);
    for (port, f) in &last.1 {
        assert_eq!(*port, BIG);
        assert!(f.data.len() - 14 <= 1000);
    }
    assert_eq!(p.stats().reassembled, 1);
}

#[test]
fn test_gro_super_packet_is_segmented_never_fragmented() {
    let mut p = pipeline();
    let o = IpOpts {
        dont_fragment: true,
        ..IpOpts::default()
    };
    let f = tcp("192.168.50.1", "10.244.1.5", 443, 5000)
        .seq(100, 1)
        .flags(tcp_flags::ACK)
        .opts(&o)
        .frame(&build::pattern(6000, 2));
    let (v, out) = run(&mut p, f, UPLINK, 0);
    assert_eq!(v, Verdict::Forwarded);
    assert!(out.len() >= 5);
    let mut seq = 100u32;
    for (port, s) in &out {
        assert_eq!(*port, POD);
        let q = parse(&s.data, 0).unwrap();
        assert!(q.frag.is_none());
        assert!(q.ip_len() <= 1450);
        let got = u32::from_be_bytes(s.data[q.l4_off + 4..q.l4_off + 8].try_into().unwrap());
        assert_eq!(got, seq);
        seq += (q.ip_end - q.l4_off - 20) as u32;
    }
    assert_eq!(seq, 6100);
    assert_eq!(p.stats().gro_marked, 1);
}

#[test]
fn test_gso_packet_goes_whole_to_a_gso_port() {
    let mut p = pipeline();
    let f = tcp("192.168.50.1", "10.244.9.7", 443, 5000)
        .seq(1, 1)
        .flags(tcp_flags::ACK)
        .frame(&build::pattern(20000, 2));
    let (v, out) = run_packet(&mut p, gso_packet(f, UPLINK, VnetHdr::GSO_TCPV4, 1448));
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].1.meta.vnet.gso_size, 1448);
}

#[test]
fn test_partial_checksum_is_completed_for_a_plain_port() {
    let mut p = pipeline();
    let mut f = udp("192.168.50.1", "10.244.1.5", 1, 2, b"payload");
    let want = f.clone();
    let l4 = 34;
    let pseudo = checksum::fold(checksum::pseudo_v4(
        [192, 168, 50, 1],
        [10, 244, 1, 5],
        17,
        15,
    ));
    f[l4 + 6..l4 + 8].copy_from_slice(&pseudo.to_be_bytes());
    let mut pkt = Packet::new(f, UPLINK, 0);
    pkt.meta.vnet.flags = VnetHdr::F_NEEDS_CSUM;
    pkt.meta.vnet.csum_start = l4 as u16;
    pkt.meta.vnet.csum_offset = 6;
    let mut out = Vec::new();
    assert_eq!(
        p.process(pkt, &mut out, &mut Trace::disabled()),
        Verdict::Forwarded
    );
    assert_eq!(&out[0].1.data[l4 + 6..l4 + 8], &want[l4 + 6..l4 + 8]);
    assert!(!out[0].1.meta.vnet.needs_csum());
}

#[test]
fn test_incomplete_datagram_expires_on_tick() {
    let mut p = pipeline();
    let whole = udp("192.168.50.1", "10.244.1.5", 1, 2, &[1; 3000]);
    let first = frags(whole, 9, 1500).remove(0);
    assert_eq!(run(&mut p, first, UPLINK, 0).0, Verdict::Held);
    assert_eq!(p.reassembler().held_datagrams(), 1);
    p.tick(29 * 1_000_000_000, &mut Vec::new());
    assert_eq!(p.reassembler().held_datagrams(), 1);
    p.tick(31 * 1_000_000_000, &mut Vec::new());
    assert_eq!(p.reassembler().held_datagrams(), 0);
    assert_eq!(p.reassembler().held_bytes(), 0);
    assert_eq!(p.drops().get(DropReason::FragExpired), 1);
}

#[test]
fn test_trace_records_each_stage() {
    let mut p = pipeline();
    let f = udp("192.168.50.1", "10.244.1.5", 1, 2, b"hi");
    let mut t = Trace::enabled();
    let mut out = Vec::new();
    p.process(Packet::new(f, UPLINK, 0), &mut out, &mut t);
    let stages: Vec<&str> = t.events.iter().map(|e| e.stage().name()).collect();
    assert_eq!(
        stages,
        ["parse", "ct", "route", "mtu", "l2", "commit", "egress"]
    );
    assert_eq!(t.ct_name(), Some("new"));
}

/// The test node with a NAT rule: TCP/UDP to the VIP 10.96.0.10 port 53 goes to the pod
/// 10.244.1.5 port 5353; traffic from the pod to 192.168.60.0/24 is masqueraded.
fn nat_pipeline(pass_invalid: bool) -> Pipeline {
    use crate::nat::{MatchSpec, NatRuleSpec};
    use crate::tables::CtSpec;
    let mut spec = TablesSpec {
        ports: uplink_and_pod().to_vec(),
        routes: vec![
            route("10.244.1.5/32", "pod", POD_MAC),
            route("0.0.0.0/0", "uplink", [2, 0, 0, 0, 0, 0xfe]),
        ],
        ..TablesSpec::default()
    };
    for proto in ["udp", "tcp"] {
        spec.nat.push(NatRuleSpec {
            matches: MatchSpec {
                proto: Some(proto.into()),
                dst: Some("10.96.0.10/32".parse().unwrap()),
                dst_port: Some(53),
                ..MatchSpec::default()
            },
            dnat: Some("10.244.1.5:5353".into()),
            snat: None,
            masquerade: false,
        });
    }
    spec.nat.push(masquerade(MatchSpec {
        in_port: Some("pod".into()),
        dst: Some("192.168.60.0/24".parse().unwrap()),
        ..MatchSpec::default()
    }));
    spec.ct = CtSpec {
        pass_invalid,
        ..CtSpec::default()
    };
    compiled(&spec)
}

#[test]
fn test_dnat_rule_translates_both_directions() {
    let mut p = nat_pipeline(false);
    let q = udp("192.168.50.1", "10.96.0.10", 40000, 53, b"query");
    let mut t = Trace::enabled();
    let mut out = Vec::new();
    assert_eq!(
        p.process(Packet::new(q, UPLINK, 0), &mut out, &mut t),
        Verdict::Forwarded
    );
    assert_eq!(t.ct_name(), Some("new"));
    let (port, fwd) = &out[0];
    assert_eq!(*port, POD);
    let k = parse(&fwd.data, 0).unwrap().key;
    assert_eq!(
        (k.dst, k.dst_port, k.src, k.src_port),
        (
            ip("10.244.1.5").into(),
            5353,
            ip("192.168.50.1").into(),
            40000
        )
    );
    // The answer leaves with the VIP as its source.
    let a = udp("10.244.1.5", "192.168.50.1", 5353, 40000, b"answer");
    let mut t = Trace::enabled();
    out.clear();
    assert_eq!(
        p.process(Packet::new(a, POD, 1), &mut out, &mut t),
        Verdict::Forwarded
    );
    assert_eq!(t.ct_name(), Some("reply"));
    let k = parse(&out[0].1.data, 0).unwrap().key;
    assert_eq!((k.src, k.src_port), (ip("10.96.0.10").into(), 53));
    assert_eq!(p.conntrack().len(), 1);
}

#[test]
fn test_fragments_to_a_dnat_vip_are_reassembled_translated_and_refragmented() {
    // The Antrea/OVS case: the connection is found for fragments whichever comes last.
    let mut p = nat_pipeline(false);
    let q = udp(
        "192.168.50.1",
        "10.96.0.10",
        40000,
        53,
        &build::pattern(4000, 3),
    );
    let first = udp("192.168.50.1", "10.96.0.10", 40000, 53, b"x");
    assert_eq!(run(&mut p, first, UPLINK, 0).0, Verdict::Forwarded);
    let fs = frags(q.clone(), 0, 1500);
    let n = fs.len();
    let mut last = None;
    for (i, f) in fs.into_iter().rev().enumerate() {
        let mut t = Trace::enabled();
        let mut out = Vec::new();
        let v = p.process(Packet::new(f, UPLINK, 10 + i as u64), &mut out, &mut t);
        if i + 1 < n {
            assert_eq!(v, Verdict::Held);
        } else {
            assert_eq!(v, Verdict::Forwarded);
            assert_eq!(
                t.ct_name(),
                Some("established"),
                "the reassembled datagram finds its connection"
            );
            last = Some(out);
        }
    }
    let out = last.unwrap();
    let mut r = Reassembler::new(ipf::Config::default());
    let mut d = DropCounters::default();
    let mut whole = None;
    for (port, f) in out {
        assert_eq!(port, POD);
        assert!(f.data.len() - 14 <= 1450);
        let pf = parse(&f.data, 0).unwrap();
        if let ipf::Outcome::Complete(w, pw) = r.process(f, &pf, &mut d) {
            whole = Some((w, pw));
        }
    }
    let (w, pw) = whole.expect("the pod receives the whole datagram");
    assert_eq!(
        (pw.key.dst, pw.key.dst_port),
        (ip("10.244.1.5").into(), 5353)
    );
    assert_eq!(&w.data[pw.l4_off + 8..], &build::pattern(4000, 3)[..]);
    let l4 = &w.data[pw.l4_off..pw.ip_end];
    assert_eq!(
        l4_sum_v4(l4, [192, 168, 50, 1], [10, 244, 1, 5], 17),
        0xffff,
        "UDP checksum of the translated datagram verifies"
    );
}

#[test]
fn test_invalid_is_dropped_unless_configured_to_pass() {
    // An ICMP error about a connection nobody made.
    let bogus = udp("10.244.1.5", "192.168.50.1", 1, 2, b"x");
    let pb = parse(&bogus, 0).unwrap();
    let err = crate::icmp::build_error(
        &bogus,
        &pb,
        ErrorKind::Unreachable { code: 3 },
        ip("192.168.50.1"),
        [2; 6],
    )
    .unwrap();
    let mut p = nat_pipeline(false);
    assert_eq!(
        run(&mut p, err.clone(), UPLINK, 0).0,
        Verdict::Dropped(DropReason::CtInvalid)
    );
    let mut p = nat_pipeline(true);
    assert_eq!(run(&mut p, err, UPLINK, 0).0, Verdict::Forwarded);
}

#[test]
fn test_too_big_error_for_a_translated_packet_is_translated_back() {
    let mut p = nat_pipeline(false);
    let o = IpOpts {
        dont_fragment: true,
        ..IpOpts::default()
    };
    let q = build::udp(
        ip("192.168.50.1"),
        ip("10.96.0.10"),
        40000,
        53,
        &[0; 1472],
        &o,
    );
    let (v, out) = run(&mut p, q, UPLINK, 0);
    assert_eq!(v, Verdict::Dropped(DropReason::TooBig));
    assert_eq!(out.len(), 1, "an ICMP error goes back");
    let (port, e) = &out[0];
    assert_eq!(*port, UPLINK);
    let pe = parse(&e.data, 0).unwrap();
    assert_eq!(pe.key.dst, ip("192.168.50.1"));
    let emb = crate::wire::icmp_error::embedded(&e.data, &pe)
        .unwrap()
        .unwrap();
    assert_eq!(
        (emb.key.dst, emb.key.dst_port),
        (ip("10.96.0.10").into(), 53),
        "the client sees its own packet quoted"
    );
    let icmp = &e.data[pe.l4_off..pe.ip_end];
    assert_eq!(
        checksum::checksum(icmp),
        0,
        "ICMP checksum verifies after translation"
    );
}

#[test]
fn test_masquerade_uses_the_egress_port_address() {
    let mut p = nat_pipeline(false);
    let f = tcp("10.244.1.5", "192.168.60.7", 33000, 443)
        .flags(tcp_flags::SYN)
        .frame(b"");
    let (v, out) = run(&mut p, f, POD, 0);
    assert_eq!(v, Verdict::Forwarded);
    let k = parse(&out[0].1.data, 0).unwrap().key;
    assert_eq!(k.src, ip("192.168.50.10"));
    let back = build::tcp(
        ip("192.168.60.7"),
        k.src.ip(),
        443,
        k.src_port,
        9,
        2,
        tcp_flags::SYN | tcp_flags::ACK,
        b"",
        &IpOpts::default(),
    );
    let (v, out) = run(&mut p, back, UPLINK, 1);
    assert_eq!(v, Verdict::Forwarded);
    let k = parse(&out[0].1.data, 0).unwrap().key;
    assert_eq!((k.dst, k.dst_port), (ip("10.244.1.5").into(), 33000));
}

#[test]
fn test_partial_checksum_must_name_the_transport_checksum() {
    // A sender must not choose where completing its checksum writes: here, into the
    // IPv6 source address.
    let mut p = pipeline();
    let f = udp("fd00:50::1", "fd00:10:244:1::5", 1, 2, b"payload");
    let mut pkt = Packet::new(f, UPLINK, 0);
    pkt.meta.vnet.flags = VnetHdr::F_NEEDS_CSUM;
    pkt.meta.vnet.csum_start = 22;
    pkt.meta.vnet.csum_offset = 0;
    let mut out = Vec::new();
    let v = p.process(pkt, &mut out, &mut Trace::disabled());
    assert_eq!(v, Verdict::Dropped(DropReason::CsumOffloadInvalid));
    assert!(out.is_empty());
}

#[test]
fn test_gro_packet_sent_whole_carries_a_partial_checksum() {
    let mut spec_p = pipeline();
    let f = tcp("192.168.50.1", "10.244.9.7", 443, 5000)
        .seq(1, 1)
        .flags(tcp_flags::ACK)
        .frame(&build::pattern(6000, 4));
    let (v, out) = run(&mut spec_p, f, UPLINK, 0);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out.len(), 1, "whole to the GSO port");
    let mut pkt = out.into_iter().next().unwrap().1;
    let vnet = pkt.meta.vnet;
    assert!(vnet.needs_csum() && vnet.is_gso());
    assert_eq!(vnet.gso_size, 1460);
    checksum::complete_partial(
        &mut pkt.data,
        usize::from(vnet.csum_start),
        usize::from(vnet.csum_offset),
    )
    .unwrap();
    let q = parse(&pkt.data, 0).unwrap();
    let l4 = &pkt.data[q.l4_off..q.ip_end];
    assert_eq!(
        l4_sum_v4(l4, [192, 168, 50, 1], [10, 244, 9, 7], 6),
        0xffff,
        "the completed checksum verifies"
    );
}

#[test]
fn test_gso_to_a_gso_port_never_exceeds_its_mtu() {
    let spec = TablesSpec {
        ports: vec![
            port("a", 1, 9000, &[], false, false),
            port("small", 2, 1280, &[], false, true),
        ],
        routes: vec![route("10.0.0.0/8", "small", POD_MAC)],
        ..TablesSpec::default()
    };
    let mut p = compiled(&spec);
    let f = tcp("192.168.0.1", "10.0.0.1", 1, 2)
        .seq(1, 1)
        .flags(tcp_flags::ACK)
        .frame(&[1; 20000]);
    let (v, out) = run_packet(&mut p, gso_packet(f, 0, VnetHdr::GSO_TCPV4, 8948));
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out[0].1.meta.vnet.gso_size, 1280 - 40);
}

#[test]
fn test_fragments_larger_than_the_mtu_are_not_fragmented_in_transit() {
    // IPv6 fragments of 1500 bytes towards a 1450 port: packet too big, as Linux does.
    let mut p = pipeline();
    let whole = udp(
        "fd00:50::1",
        "fd00:10:244:1::5",
        1,
        2,
        &build::pattern(3000, 5),
    );
    let (last, out) = run_each(&mut p, frags(whole, 77, 1500), UPLINK, 0);
    assert_eq!(last, Verdict::Dropped(DropReason::TooBig));
    assert_eq!(out.len(), 1);
    let q = parse(&out[0].1.data, 0).unwrap();
    assert_eq!(q.key.dst_port, 2 << 8, "ICMPv6 packet too big");
    // IPv4 without DF may be fragmented further.
    let whole = udp("192.168.50.1", "10.244.1.5", 1, 2, &build::pattern(3000, 5));
    let (last, out) = run_each(&mut p, frags(whole, 78, 1500), UPLINK, 0);
    assert_eq!(last, Verdict::Forwarded);
    assert!(
        out.iter()
            .all(|(port, f)| *port == POD && f.data.len() - 14 <= 1450)
    );
}

#[test]
fn test_uso_datagrams_over_the_mtu_are_fragmented_or_refused() {
    // Four 1400-byte datagrams in one USO packet towards the 1450 pod port: each
    // datagram (1428 bytes of IP) fits and leaves whole.
    let uso = |src: &str, dst: &str, o: &IpOpts| {
        let f = build::udp(ip(src), ip(dst), 1, 2, &build::pattern(4 * 1400, 6), o);
        gso_packet(f, UPLINK, VnetHdr::GSO_UDP_L4, 1400)
    };
    let mut p = pipeline();
    let (v, out) = run_packet(
        &mut p,
        uso("192.168.50.1", "10.244.1.5", &IpOpts::default()),
    );
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out.len(), 4);
    // 1440-byte datagrams do not fit 1450: IPv4 without DF is fragmented per datagram,
    // IPv4 with DF and IPv6 get "too big" with the MTU.
    let big = |src: &str, dst: &str, o: &IpOpts| {
        let mut pkt = uso(src, dst, o);
        pkt.meta.vnet.gso_size = 1440;
        pkt
    };
    let (v, out) = run_packet(
        &mut p,
        big("192.168.50.1", "10.244.1.5", &IpOpts::default()),
    );
    assert_eq!(v, Verdict::Forwarded);
    assert!(
        out.len() > 4 && out.iter().all(|(_, f)| f.data.len() - 14 <= 1450),
        "fragmented per datagram"
    );
    let df = IpOpts {
        dont_fragment: true,
        ..IpOpts::default()
    };
    let (v, _) = run_packet(&mut p, big("192.168.50.1", "10.244.1.5", &df));
    assert_eq!(v, Verdict::Dropped(DropReason::TooBig));
    let (v, out) = run_packet(
        &mut p,
        big("fd00:50::1", "fd00:10:244:1::5", &IpOpts::default()),
    );
    assert_eq!(v, Verdict::Dropped(DropReason::TooBig));
    assert_eq!(out.len(), 1, "packet too big goes back");
}

#[test]
fn test_gso_request_that_does_not_match_its_packet_is_dropped_even_towards_a_gso_port() {
    // Towards "big" (gso: true) a GSO packet would be handed on whole; a request that
    // does not fit the packet is refused here, not left to the receiving kernel.
    let mut p = pipeline();
    let udp = udp("192.168.0.1", "10.244.9.7", 1, 2, &[1; 3000]);
    let tcp = tcp("192.168.0.1", "10.244.9.7", 1, 2)
        .seq(1, 1)
        .flags(tcp_flags::ACK)
        .frame(&[1; 3000]);
    let cases = [
        (udp.clone(), VnetHdr::GSO_TCPV4, 1000),
        (tcp.clone(), VnetHdr::GSO_TCPV6, 1000),
        (tcp.clone(), VnetHdr::GSO_TCPV4, 0),
        (tcp.clone(), VnetHdr::GSO_UDP, 1000),
        // The ECN bit without a GSO type: Linux refuses such a header.
        (tcp.clone(), VnetHdr::GSO_ECN, 0),
        // 3000 segments of one byte: more than ferry would cut, so not handed on either.
        (tcp.clone(), VnetHdr::GSO_TCPV4, 1),
    ];
    for (frame, gso_type, gso_size) in cases {
        let (v, out) = run_packet(&mut p, gso_packet(frame, UPLINK, gso_type, gso_size));
        assert!(
            matches!(
                v,
                Verdict::Dropped(DropReason::GsoMalformed | DropReason::GsoUnsupported)
            ),
            "{gso_type} {gso_size}: {v:?}"
        );
        assert!(out.is_empty());
    }
    // The same TCP packet with a request that fits it goes through whole.
    let (v, out) = run_packet(&mut p, gso_packet(tcp, UPLINK, VnetHdr::GSO_TCPV4, 1000));
    assert_eq!(v, Verdict::Forwarded);
    assert!(out[0].1.meta.vnet.is_gso());
}

/// A receive batch does what its packets do one at a time, also when the connection
/// table is large enough for the batch to be prefetched: the same packets out, in the
/// same order, and the same counters.
#[test]
fn test_a_batch_does_what_its_packets_do_one_at_a_time() {
    let flow = |i: u32, payload: &[u8]| {
        build::udp(
            ip(&format!("192.168.{}.{}", 51 + i / 8000, 1 + i % 200)),
            ip("10.244.1.5"),
            1024 + (i % 8000) as u16,
            53,
            payload,
            &IpOpts::default(),
        )
    };
    let arp = arp_request_for_10_0_0_2();
    let big = udp("192.168.50.1", "10.244.1.5", 7, 7, &build::pattern(3000, 1));
    let mut truncated = flow(3, b"x");
    truncated.truncate(30);
    let n = PREFETCH_MIN_CONNECTIONS as u32 + 500;
    // Round 1 creates the connections (the later batches of it prefetch, as the table
    // passes the threshold); round 2 carries packets of them, in an order spread over the
    // table, mixed with packets conntrack does not see or refuses.
    let mut frames: Vec<(Vec<u8>, PortId)> = (0..n).map(|i| (flow(i, b"q"), UPLINK)).collect();
    for k in 0..n {
        let i = k.wrapping_mul(2_654_435_761) % n;
        frames.push((flow(i, b"again"), UPLINK));
        match k % 1000 {
            1 => frames.push((arp.clone(), UPLINK)),
            2 => frames.extend(frags(big.clone(), k, 1500).into_iter().map(|f| (f, UPLINK))),
            3 => frames.push((truncated.clone(), UPLINK)),
            4 => frames.push((flow(i, b"unknown port"), 9)),
            _ => {}
        }
    }
    let mut one = pipeline();
    let mut batched = pipeline();
    let mut trace = Trace::disabled();
    let mut prefetched = false;
    for (b, chunk) in frames.chunks(32).enumerate() {
        let now = b as u64 * 1000;
        let mut want = Vec::new();
        for (f, port) in chunk {
            one.process(Packet::new(f.clone(), *port, now), &mut want, &mut trace);
        }
        prefetched |= batched.conntrack().len() >= PREFETCH_MIN_CONNECTIONS;
        let mut got = Vec::new();
        let pkts = chunk
            .iter()
            .map(|(f, port)| Packet::new(f.clone(), *port, now));
        batched.process_batch(pkts, &mut got, &mut trace);
        assert_eq!(got.len(), want.len(), "batch {b}");
        for ((gp, g), (wp, w)) in got.iter().zip(&want) {
            assert_eq!((gp, &g.data), (wp, &w.data), "batch {b}");
        }
    }
    assert!(prefetched, "the table grew past the prefetch threshold");
    // The flows, and the one of the reassembled datagrams.
    assert_eq!(batched.conntrack().len(), n as usize + 1);
    assert_eq!(batched.conntrack().stats(), one.conntrack().stats());
    assert_eq!(batched.stats(), one.stats());
    assert_eq!(batched.drops(), one.drops());
    assert_eq!(batched.port_stats(), one.port_stats());
    assert!(batched.drops().get(DropReason::UnknownPort) > 0);
    assert!(batched.drops().get(DropReason::ArpNotHandled) > 0);
    assert!(batched.stats().reassembled > 0);
}

/// Plain ports of MTU 1280 and 1500 with GSO, for IPv6 traffic from the uplink.
fn pipeline_with_small_gso_port() -> Pipeline {
    let spec = TablesSpec {
        ports: vec![
            port("uplink", 1, 1500, &["fd00:50::10"], true, false),
            port("small", 2, 1280, &[], false, true),
            port("pod", 3, 1450, &[], false, true),
        ],
        routes: vec![
            route("fd00:99::/64", "small", [0x0a, 0x58, 0, 0, 0, 9]),
            route("10.244.1.0/24", "pod", POD_MAC),
        ],
        ..TablesSpec::default()
    };
    compiled(&spec)
}

/// A GSO packet handed on whole gets a segment size that fits the port's MTU; when its
/// headers alone take the whole MTU there is none (Linux refuses `gso_size` 0), and the
/// packet is dropped as `mtu_too_small`, as when ferry would cut it itself.
#[test]
fn test_gso_packet_whose_headers_fill_the_mtu_is_not_handed_on_with_segment_size_0() {
    let mut p = pipeline_with_small_gso_port();
    let tcp = tcp("fd00:50::1", "fd00:99::9", 1, 2)
        .seq(1, 1)
        .flags(tcp_flags::ACK)
        .frame(&[7; 4000]);
    // The same packet with a 1224-byte Destination Options header (skippable unknown
    // options) in front of TCP: 40 + 1224 + 20 bytes of headers, more than 1280.
    let mut opts = vec![6u8, 152];
    while opts.len() < 1224 {
        let n = (1224 - opts.len() - 2).min(255);
        opts.extend_from_slice(&[0x1e, n as u8]);
        opts.extend(std::iter::repeat_n(0, n));
    }
    let mut big_hdrs = tcp[..54].to_vec();
    big_hdrs.extend_from_slice(&opts);
    big_hdrs.extend_from_slice(&tcp[54..]);
    let plen = u16::from_be_bytes([tcp[18], tcp[19]]) + 1224;
    big_hdrs[18..20].copy_from_slice(&plen.to_be_bytes());
    big_hdrs[20] = 60;
    for (frame, want) in [
        (tcp, Verdict::Forwarded),
        (big_hdrs, Verdict::Dropped(DropReason::MtuTooSmall)),
    ] {
        let (v, out) = run_packet(&mut p, gso_packet(frame, UPLINK, VnetHdr::GSO_TCPV6, 1400));
        assert_eq!(v, want);
        if want == Verdict::Forwarded {
            // Sent whole, its segment size cut to what 1280 carries.
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].1.meta.vnet.gso_size, 1280 - 40 - 20);
        } else {
            assert!(out.is_empty(), "{:?}", out[0].1.meta.vnet);
        }
    }
}

/// A USO packet whose payload is no longer than its segment size is one datagram of its
/// own length: with DF it goes through a smaller MTU that holds it, where a datagram of
/// `gso_size` would not fit.
#[test]
fn test_a_uso_packet_of_one_short_datagram_is_not_too_big() {
    let mut p = pipeline_with_small_gso_port();
    let udp = build::udp(
        ip("192.168.50.1"),
        ip("10.244.1.5"),
        1,
        2,
        &[3; 100],
        &IpOpts {
            dont_fragment: true,
            ..IpOpts::default()
        },
    );
    let (v, out) = run_packet(&mut p, gso_packet(udp, UPLINK, VnetHdr::GSO_UDP_L4, 1472));
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, 2);
    // Left as one GSO packet, its segment size is cut to what the port's MTU holds:
    // 20 bytes of IPv4 and 8 of UDP under 1450.
    let vnet = &out[0].1.meta.vnet;
    assert!(crate::gso::is_uso(vnet));
    assert_eq!(vnet.gso_size, 1450 - 28);
    assert_eq!(out[0].1.data.len(), 14 + 128);
}
