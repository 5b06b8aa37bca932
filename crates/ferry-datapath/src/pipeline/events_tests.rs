//! Trace events: their text, and their fields as JSON.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::events::*;
use crate::conntrack::CtState;
use crate::drop::DropReason;
use crate::flow::{Addr, FlowKey, proto};
use crate::icmp::ErrorKind;
use crate::lb::Scope;

fn key() -> FlowKey {
    FlowKey {
        src: Addr::from(IpAddr::from([10, 244, 1, 5])),
        dst: Addr::from(IpAddr::from([10, 96, 0, 10])),
        zone: 0,
        proto: proto::TCP,
        src_port: 40000,
        dst_port: 80,
    }
}

const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const MAC2: [u8; 6] = [2, 0, 0, 0, 0, 2];

/// One event of every kind, with the text the stage wrote before events were typed.
fn every_event() -> Vec<(TraceEvent, String)> {
    let k = key();
    let v4 = |s: &str| s.parse::<Ipv4Addr>().unwrap();
    let v6 = |s: &str| s.parse::<Ipv6Addr>().unwrap();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let too_big = ErrorKind::TooBig { mtu: 1400 };
    use TraceEvent::*;
    vec![
        (
            Parse {
                key: k,
                bytes: 60,
                frag: None,
            },
            format!("{k}, 60 bytes"),
        ),
        (
            Parse {
                key: k,
                bytes: 1500,
                frag: Some(Fragment {
                    id: 7,
                    offset: 1480,
                    more: false,
                }),
            },
            format!("{k}, 1500 bytes fragment id 7 offset 1480 more false"),
        ),
        (
            GroMarked { segment: 1448 },
            "coalesced TCP super-packet, segment size 1448".into(),
        ),
        (
            GroCoalesced {
                segments: 4,
                packets: 1,
            },
            "4 TCP segments coalesced into 1 packets".into(),
        ),
        (
            IpfHeld {
                datagrams: 1,
                bytes: 1480,
            },
            "held for reassembly (1 datagrams, 1480 bytes in flight)".into(),
        ),
        (
            IpfReassembled {
                bytes: 3000,
                mru: 1500,
                key: k,
            },
            format!("reassembled 3000 bytes, mru 1500, key rebuilt: {k}"),
        ),
        (
            IpfRefused {
                reason: DropReason::FragOverlap,
            },
            format!("refused: {}", DropReason::FragOverlap.name()),
        ),
        (
            Decap {
                vni: 1,
                peer: ip("192.168.50.20"),
                inner: k,
            },
            format!("VXLAN vni 1 from node 192.168.50.20: {k}"),
        ),
        (
            DecapGso {
                peer: ip("192.168.50.20"),
                datagrams: 3,
                size: 1450,
            },
            "UDP GSO super-frame from node 192.168.50.20: 3 datagrams of 1450 bytes".into(),
        ),
        (SourceOk, "pod's own MAC and address".into()),
        (ServiceReset, "refused with a TCP reset".into()),
        (
            ServiceResetNoPath {
                reason: DropReason::NeighQueueOverflow,
                peer: "10.0.0.2".parse().unwrap(),
            },
            "no TCP reset sent: neigh_queue_overflow towards node 10.0.0.2".into(),
        ),
        (
            ServiceNoEndpoint {
                service: "default/web:http".into(),
                scope: Scope::Internal,
                key: k,
            },
            format!("default/web:http (Internal): no endpoint to send {k} to"),
        ),
        (
            ServiceNoNodeAddress {
                service: "default/web:http".into(),
                scope: Scope::External,
                key: k,
            },
            format!(
                "default/web:http (External): {k} must leave from this node's address, and it has none of the family"
            ),
        ),
        (
            ServiceSourceDenied {
                service: "default/web:http".into(),
                key: k,
            },
            format!(
                "default/web:http: {k}: its source is in none of the Service's loadBalancerSourceRanges"
            ),
        ),
        (
            ServiceRecovered {
                service: "default/web:http".into(),
                scope: Scope::Internal,
                frontend: ip("10.96.0.10"),
                frontend_port: 80,
                endpoint: ip("10.244.2.6"),
                endpoint_port: 8080,
                through: None,
                candidate: 1,
                candidates: 2,
            },
            "endpoint 10.244.2.6:8080 of default/web:http, no connection: taken as a reply through its cluster IP frontend 10.96.0.10:80 (candidate 1 of 2), until the client answers".into(),
        ),
        (
            ServiceBalanced {
                service: "default/web:http".into(),
                scope: Scope::Internal,
                frontend: ip("10.96.0.10"),
                frontend_port: 80,
                endpoint: ip("10.244.2.6"),
                endpoint_port: 8080,
                node: Some("node2".into()),
                path: ServicePath::Direct,
            },
            "default/web:http (cluster IP frontend 10.96.0.10:80) -> endpoint 10.244.2.6:8080 on node node2".into(),
        ),
        (
            ServiceBalanced {
                service: "default/dns:dns".into(),
                scope: Scope::External,
                frontend: ip("fd00:96::11"),
                frontend_port: 53,
                endpoint: ip("fd00:10:244:1::6"),
                endpoint_port: 53,
                node: None,
                path: ServicePath::Snat {
                    addr: ip("fd00:10:244:1::1"),
                    hairpin: true,
                },
            },
            "default/dns:dns (external frontend [fd00:96::11]:53) -> endpoint [fd00:10:244:1::6]:53, hairpin: source NAT to fd00:10:244:1::1".into(),
        ),
        (
            ServiceBalanced {
                service: "s".into(),
                scope: Scope::External,
                frontend: ip("192.168.50.10"),
                frontend_port: 30080,
                endpoint: ip("10.244.2.6"),
                endpoint_port: 80,
                node: None,
                path: ServicePath::Tunnel,
            },
            "s (external frontend 192.168.50.10:30080) -> endpoint 10.244.2.6:80, client address kept, through the tunnel so that replies return through this node".into(),
        ),
        (
            StaticNat {
                dnat: Some(ip("10.244.1.9")),
                dnat_port: Some(8080),
                snat: Some(ip("192.168.50.10")),
                snat_ports: Some((1024, 2047)),
            },
            "static rule: destination to 10.244.1.9:8080, source to 192.168.50.10 ports 1024-2047".into(),
        ),
        (
            StaticNat {
                dnat: None,
                dnat_port: None,
                snat: Some(ip("192.168.50.10")),
                snat_ports: None,
            },
            "static rule: source to 192.168.50.10".into(),
        ),
        (
            StaticNat {
                dnat: None,
                dnat_port: None,
                snat: None,
                snat_ports: None,
            },
            "static rule: no translation".into(),
        ),
        (
            Ct {
                state: CtState::New,
                reply: false,
                key: k,
                translated: true,
            },
            format!("new, translated to {k}"),
        ),
        (
            Ct {
                state: CtState::Established,
                reply: true,
                key: k,
                translated: false,
            },
            "established reply".into(),
        ),
        (Committed, "connection committed".into()),
        (
            RouteNoPod {
                dst: ip("10.244.1.77"),
            },
            "10.244.1.77 -> nowhere: in this node's pod CIDRs, and no pod has it".into(),
        ),
        (
            RouteTunnel {
                dst: ip("10.244.2.6"),
                node: "node2".into(),
            },
            "10.244.2.6 -> node node2 through the overlay".into(),
        ),
        (
            RoutePort {
                dst: ip("10.244.1.6"),
                port: "pod-b".into(),
            },
            "10.244.1.6 -> port pod-b".into(),
        ),
        (
            Mtu {
                mtu: 1450,
                tunnel: true,
                port: "eth0".into(),
                length: MtuLength::Plain { bytes: 60 },
                fit: MtuFit::Fits,
            },
            "mtu 1450 (inside the tunnel) on eth0: 60 bytes, fits".into(),
        ),
        (
            Mtu {
                mtu: 1400,
                tunnel: false,
                port: "pod-b".into(),
                length: MtuLength::Reassembled {
                    bytes: 3000,
                    mru: 1500,
                },
                fit: MtuFit::TooBig,
            },
            "mtu 1400 on pod-b: 3000 bytes reassembled, mru 1500, too big, and may not be fragmented".into(),
        ),
        (
            Mtu {
                mtu: 1500,
                tunnel: false,
                port: "eth0".into(),
                length: MtuLength::Gso { segment: 1448 },
                fit: MtuFit::Cut,
            },
            "mtu 1500 on eth0: GSO packet, segment size 1448, to be cut to fit".into(),
        ),
        (
            L2 {
                hop: L2Hop::RouteMac,
                dst_mac: MAC,
                src_mac: MAC2,
                port: "pod-a".into(),
            },
            "route's next hop MAC: to 02:00:00:00:00:01 from 02:00:00:00:00:02 on pod-a".into(),
        ),
        (
            L2 {
                hop: L2Hop::Gateway {
                    addr: ip("192.168.50.1"),
                },
                dst_mac: MAC,
                src_mac: MAC2,
                port: "eth0".into(),
            },
            "gateway 192.168.50.1: to 02:00:00:00:00:01 from 02:00:00:00:00:02 on eth0".into(),
        ),
        (
            L2 {
                hop: L2Hop::OnLink {
                    addr: ip("192.168.50.7"),
                },
                dst_mac: MAC,
                src_mac: MAC2,
                port: "eth0".into(),
            },
            "192.168.50.7 on-link: to 02:00:00:00:00:01 from 02:00:00:00:00:02 on eth0".into(),
        ),
        (
            L2Tunnel {
                inner_src: MAC,
                inner_dst: MAC2,
                outer_dst: MAC2,
                peer: ip("192.168.50.20"),
                outer_src: MAC,
                port: "eth0".into(),
            },
            "inner 02:00:00:00:00:01 -> 02:00:00:00:00:02; outer to 02:00:00:00:00:02 (192.168.50.20) from 02:00:00:00:00:01 on eth0".into(),
        ),
        (
            NeighProbe {
                ip: ip("192.168.50.1"),
                port: "eth0".into(),
                mac: MAC,
            },
            "192.168.50.1 not confirmed on eth0: probe sent to 02:00:00:00:00:01".into(),
        ),
        (
            NeighQueued {
                ip: ip("192.168.50.1"),
                port: "eth0".into(),
                asked: Asked::Probed { dry_run: false },
                waiting: 2,
                pushed_out: 1,
            },
            "queued: next hop 192.168.50.1 unresolved on eth0 (ARP request sent); 2 waiting for it, 1 older pushed out".into(),
        ),
        (
            NeighQueued {
                ip: ip("fd00::1"),
                port: "eth0".into(),
                asked: Asked::Probed { dry_run: true },
                waiting: 1,
                pushed_out: 0,
            },
            "queued: next hop fd00::1 unresolved on eth0 (a neighbour solicitation would be sent); 1 waiting for it".into(),
        ),
        (
            NeighQueued {
                ip: ip("fd00::1"),
                port: "eth0".into(),
                asked: Asked::Already,
                waiting: 3,
                pushed_out: 0,
            },
            "queued: next hop fd00::1 unresolved on eth0 (asked already); 3 waiting for it".into(),
        ),
        (
            NeighReleased {
                ip: ip("192.168.50.1"),
                mac: MAC,
                key: k,
            },
            format!("192.168.50.1 is at 02:00:00:00:00:01: sending {k} that waited for it"),
        ),
        (
            Encap {
                vni: 1,
                node: Some("node2".into()),
                src: ip("192.168.50.10"),
                dst: ip("192.168.50.20"),
                udp_src_port: 49152,
                mtu: 1450,
            },
            "VXLAN vni 1 to node node2: 192.168.50.10 -> 192.168.50.20, udp source port 49152, inner mtu 1450".into(),
        ),
        (
            EncapSuperFrames {
                datagrams: 10,
                frames: 2,
                super_frames: 1,
                port: "eth0".into(),
            },
            "10 datagrams in 2 frames, 1 of them UDP GSO super-frames for eth0 to cut".into(),
        ),
        (
            SentGso {
                port: "pod-b".into(),
                segment: 1448,
            },
            "GSO packet sent whole to pod-b, segment size 1448".into(),
        ),
        (
            Segmented {
                packets: 3,
                mtu: 1500,
                port: "eth0".into(),
            },
            "segmented into 3 packets for mtu 1500 on eth0".into(),
        ),
        (
            Sent {
                port: "pod-b".into(),
            },
            "sent to pod-b".into(),
        ),
        (
            Fragmented {
                mru: Some(1500),
                mtu: 1400,
                limit: 1400,
                fragments: 3,
                port: "eth0".into(),
            },
            "refragmented to min(mru 1500, mtu 1400) = 1400: 3 fragments to eth0".into(),
        ),
        (
            Fragmented {
                mru: None,
                mtu: 1400,
                limit: 1400,
                fragments: 2,
                port: "eth0".into(),
            },
            "fragmented to mtu 1400: 2 fragments to eth0".into(),
        ),
        (
            IcmpNoAddress {
                error: too_big,
                port: "pod-a".into(),
            },
            "no TooBig { mtu: 1400 } sent: port pod-a has no address of this family".into(),
        ),
        (
            IcmpNotAllowed {
                error: ErrorKind::TimeExceeded,
            },
            "no TimeExceeded sent: not allowed for this packet".into(),
        ),
        (
            IcmpRateLimited { error: too_big },
            "no TooBig { mtu: 1400 } sent: rate limited".into(),
        ),
        (
            IcmpUnrelated { error: too_big },
            "no TooBig { mtu: 1400 } sent: conntrack could not relate it".into(),
        ),
        (
            IcmpNoPath {
                error: too_big,
                reason: DropReason::NeighUnresolved,
                peer: ip("192.168.50.20"),
            },
            "no TooBig { mtu: 1400 } sent: neigh_unresolved towards node 192.168.50.20".into(),
        ),
        (
            IcmpSent {
                error: ErrorKind::Unreachable { code: 3 },
                src: ip("10.244.1.1"),
                dst: ip("10.244.1.5"),
                port: "pod-a".into(),
            },
            "Unreachable { code: 3 } sent from 10.244.1.1 to 10.244.1.5 via pod-a".into(),
        ),
        (ArpIgnored { op: 3 }, "op 3: not acted on".into()),
        (
            ArpNotAnswered {
                op: 1,
                sender: v4("10.244.1.5"),
                target: v4("10.244.1.5"),
            },
            "op 1 10.244.1.5 -> 10.244.1.5: not answered".into(),
        ),
        (
            ArpAnswered {
                target: v4("10.244.1.1"),
                mac: MAC,
                sender: v4("10.244.1.5"),
            },
            "10.244.1.1 is at 02:00:00:00:00:01 (answered to 10.244.1.5)".into(),
        ),
        (
            NdNotAnswered {
                target: v6("fd00::5"),
            },
            "solicitation for fd00::5: not answered".into(),
        ),
        (
            NdAdvert {
                target: v6("fd00::5"),
            },
            "advertisement of fd00::5".into(),
        ),
        (
            NdIgnored { icmp_type: 133 },
            "ICMPv6 type 133: not acted on".into(),
        ),
        (
            NdAnswered {
                target: v6("fe80::1"),
                mac: MAC,
                dst: v6("fe80::5"),
            },
            "fe80::1 is at 02:00:00:00:00:01 (answered to fe80::5)".into(),
        ),
        (
            Drop {
                reason: DropReason::NoRoute,
            },
            "no_route".into(),
        ),
    ]
}

#[test]
fn test_every_event_reads_as_its_stage_wrote_it() {
    for (e, text) in every_event() {
        assert_eq!(e.to_string(), text, "{e:?}");
    }
}

#[test]
fn test_every_event_round_trips_through_json_tagged_by_kind() {
    for (e, _) in every_event() {
        let v = serde_json::to_value(&e).unwrap();
        assert!(v["kind"].is_string(), "{v}");
        let back: TraceEvent = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(back, e, "{v}");
    }
}

#[test]
fn test_structured_fields_are_plain_json() {
    let e = TraceEvent::Ct {
        state: CtState::New,
        reply: false,
        key: key(),
        translated: false,
    };
    assert_eq!(e.stage(), Stage::Ct);
    assert_eq!(e.stage().name(), "ct");
    let v = serde_json::to_value(&e).unwrap();
    assert_eq!(v["kind"], "ct");
    assert_eq!(v["state"], "new");
    assert_eq!(v["key"]["src"], "10.244.1.5");
    assert_eq!(v["key"]["dst_port"], 80);
    let l2 = TraceEvent::L2 {
        hop: L2Hop::Gateway {
            addr: IpAddr::from([192, 168, 50, 1]),
        },
        dst_mac: MAC,
        src_mac: MAC2,
        port: "eth0".into(),
    };
    let v = serde_json::to_value(&l2).unwrap();
    assert_eq!(v["dst_mac"], "02:00:00:00:00:01");
    assert_eq!(v["hop"]["type"], "gateway");
    let d = serde_json::to_value(TraceEvent::Drop {
        reason: DropReason::NoRoute,
    })
    .unwrap();
    assert_eq!(d, serde_json::json!({"kind": "drop", "reason": "no_route"}));
}

#[test]
fn test_a_disabled_trace_records_nothing_and_builds_nothing() {
    let mut t = Trace::disabled();
    t.note(|| unreachable!("built with tracing off"));
    assert!(t.events.is_empty());
    let mut t = Trace::enabled();
    t.note(|| TraceEvent::Committed);
    assert_eq!(t.events, [TraceEvent::Committed]);
}
