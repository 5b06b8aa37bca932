use super::*;
use crate::flow::proto;
use crate::tables::{MacAddr, PortSpec, TablesSpec};
use crate::wire::checksum;
use crate::wire::parse;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn parse_ok(s: &str) -> Described {
    Described::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn parse_err(s: &str) -> String {
    match Described::parse(s) {
        Ok(d) => panic!("{s}: parsed as {d:?}"),
        Err(e) => e,
    }
}

#[test]
fn test_parse_tcp_defaults_and_flags() {
    let d = parse_ok("tcp 10.0.1.5:40000 -> 10.96.0.10:80");
    assert_eq!(
        d,
        Described {
            src: ip("10.0.1.5"),
            dst: ip("10.96.0.10"),
            src_port: 40000,
            dst_port: 80,
            transport: Transport::Tcp {
                flags: tcp_flags::SYN,
                seq: DEFAULT_SEQ,
                ack: 0
            },
            len: 0,
            ttl: 64,
            dont_fragment: false,
        }
    );
    let d = parse_ok("tcp 10.0.1.5:40000->10.96.0.10:80 syn+ack seq 5 ack 9 len 100 ttl 3 df");
    assert_eq!(
        d.transport,
        Transport::Tcp {
            flags: tcp_flags::SYN | tcp_flags::ACK,
            seq: 5,
            ack: 9
        }
    );
    assert_eq!((d.len, d.ttl, d.dont_fragment), (100, 3, true));
    let d = parse_ok("tcp 10.0.1.5:1 -> 10.0.0.1:2 psh,ack fin");
    assert_eq!(
        d.transport,
        Transport::Tcp {
            flags: tcp_flags::PSH | tcp_flags::ACK | tcp_flags::FIN,
            seq: DEFAULT_SEQ,
            ack: 0
        }
    );
    // An acknowledgement number without flags means an ACK segment.
    let d = parse_ok("tcp 10.0.1.5:1 -> 10.0.0.1:2 ack 77");
    assert_eq!(
        d.transport,
        Transport::Tcp {
            flags: tcp_flags::ACK,
            seq: DEFAULT_SEQ,
            ack: 77
        }
    );
}

#[test]
fn test_parse_udp_and_icmp_in_both_families() {
    let d = parse_ok("udp [fd00:10::5]:5353 -> [fd00:96::a]:53");
    assert_eq!(
        (d.src, d.src_port, d.dst, d.dst_port, d.transport, d.len),
        (
            ip("fd00:10::5"),
            5353,
            ip("fd00:96::a"),
            53,
            Transport::Udp,
            DEFAULT_UDP_LEN
        )
    );
    let d = parse_ok("icmp 10.0.1.5 -> 10.0.2.7 id 7");
    assert_eq!(
        d.transport,
        Transport::Echo {
            id: 7,
            seq: 1,
            reply: false
        }
    );
    assert_eq!(d.len, DEFAULT_ICMP_LEN);
    let d = parse_ok("icmpv6 fd00::1 -> [fd00::2] reply seq 3");
    assert_eq!(
        d.transport,
        Transport::Echo {
            id: 1,
            seq: 3,
            reply: true
        }
    );
}

#[test]
fn test_to_reads_as_the_arrow() {
    assert_eq!(
        parse_ok("tcp 10.0.1.5:40000 to 10.96.0.10:80 syn"),
        parse_ok("tcp 10.0.1.5:40000 -> 10.96.0.10:80 syn")
    );
    assert_eq!(
        parse_ok("icmpv6 fd00::1 to fd00::2"),
        parse_ok("icmpv6 fd00::1->fd00::2")
    );
}

#[test]
fn test_parse_errors_name_the_bad_word() {
    for (s, word) in [
        ("", "empty"),
        ("sctp 1.1.1.1:1 -> 2.2.2.2:2", "\"sctp\""),
        ("tcp 10.0.1.5 -> 10.0.0.1:80", "\"10.0.1.5\""),
        ("tcp 10.0.1.5:70000 -> 10.0.0.1:80", "\"70000\""),
        ("tcp 10.0.1.5:0 -> 10.0.0.1:80", "\"0\""),
        ("tcp fd00::1:80 -> [fd00::2]:80", "[ADDR]:PORT"),
        ("tcp 10.0.1.5:1 10.0.0.1:80", "\"10.0.0.1:80\""),
        ("tcp 10.0.1.5:1 ->", "missing destination"),
        ("tcp 10.0.1.5:1", "quote the packet"),
        (
            "tcp 10.0.1.5:1 -> [fd00::1]:80",
            "different address families",
        ),
        ("tcp 10.0.1.5:1 -> 10.0.0.1:2 syn+urg", "\"syn+urg\""),
        ("tcp 10.0.1.5:1 -> 10.0.0.1:2 seq", "seq: missing number"),
        ("tcp 10.0.1.5:1 -> 10.0.0.1:2 seq x", "\"x\""),
        ("tcp 10.0.1.5:1 -> 10.0.0.1:2 id 3", "\"id\""),
        ("udp 10.0.1.5:1 -> 10.0.0.1:2 syn", "\"syn\""),
        ("udp 10.0.1.5:1 -> 10.0.0.1:2 seq 1", "\"seq\""),
        ("udp 10.0.1.5:1 -> 10.0.0.1:2 ttl 300", "\"300\""),
        ("udp 10.0.1.5:1 -> 10.0.0.1:2 len 70000", "len 70000"),
        ("udp [fd00::1]:1 -> [fd00::2]:2 df", "\"df\""),
        ("icmp fd00::1 -> fd00::2", "icmpv6"),
        ("icmpv6 10.0.0.1 -> 10.0.0.2", "use icmp"),
        ("icmp 10.0.0.1:5 -> 10.0.0.2", "\"10.0.0.1:5\""),
    ] {
        let e = parse_err(s);
        assert!(e.contains(word), "{s:?}: {e:?} does not name {word:?}");
    }
}

#[test]
fn test_display_reads_back() {
    for s in [
        "tcp 10.0.1.5:40000 -> 10.96.0.10:80 syn",
        "tcp [fd00::1]:1 -> [fd00::2]:2 fin+ack seq 3 ack 4 len 10 ttl 2",
        "udp 10.0.1.5:1 -> 10.0.0.1:2 len 0 df",
        "icmp 10.0.1.5 -> 10.0.2.7 id 9 reply",
        "icmpv6 fd00::1 -> fd00::2 len 1000",
    ] {
        let d = parse_ok(s);
        assert_eq!(parse_ok(&d.to_string()), d, "{s} -> {d}");
    }
    assert_eq!(
        parse_ok("tcp 10.0.1.5:40000 -> 10.96.0.10:80").to_string(),
        "tcp 10.0.1.5:40000 -> 10.96.0.10:80 syn seq 1000"
    );
}

fn tables() -> Tables {
    TablesSpec {
        ports: vec![
            PortSpec {
                name: "eth0".into(),
                kind: PortKind::Uplink,
                mac: MacAddr([2, 0xaa, 0, 0, 0, 1]),
                addresses: vec!["192.168.50.10/24".parse().unwrap()],
                ..PortSpec::default()
            },
            PortSpec {
                name: "pod-a".into(),
                kind: PortKind::Pod,
                mac: MacAddr([0xee; 6]),
                peer_mac: Some(MacAddr([0x0a, 0x58, 0, 0, 0, 5])),
                addresses: vec!["10.244.1.5".parse().unwrap()],
                ..PortSpec::default()
            },
        ],
        ..TablesSpec::default()
    }
    .compile()
    .unwrap()
}

/// The transport checksum of a frame verifies.
fn l4_checksum_ok(frame: &[u8]) -> bool {
    let p = parse::parse(frame, 0).unwrap();
    let l4 = &frame[p.l4_off..p.ip_end];
    let pseudo = match (p.key.src.ip(), p.key.dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) if p.proto != proto::ICMP => {
            checksum::pseudo_v4(s.octets(), d.octets(), p.proto, l4.len() as u16)
        }
        (IpAddr::V4(_), _) => 0,
        (s, d) => checksum::pseudo_v6(
            &parse::v6_octets(s),
            &parse::v6_octets(d),
            p.proto,
            l4.len() as u32,
        ),
    };
    checksum::fold(checksum::add(l4, pseudo)) == 0xffff
}

#[test]
fn test_frame_from_a_pod_uses_its_macs_and_elsewhere_the_ports() {
    let t = tables();
    let d = parse_ok("tcp 10.244.1.5:40000 -> 10.96.0.10:80 len 20");
    let f = d.frame(&t, 1).unwrap();
    assert_eq!(&f[0..6], &[0xee; 6], "to the gateway MAC");
    assert_eq!(&f[6..12], &[0x0a, 0x58, 0, 0, 0, 5], "from the pod's own");
    let p = parse::parse(&f, 0).unwrap();
    assert_eq!(p.key.src_port, 40000);
    assert_eq!(p.ip_len(), 20 + 20 + 20);
    assert_eq!(p.tcp_flags, tcp_flags::SYN);
    assert!(l4_checksum_ok(&f));

    let f = parse_ok("udp 192.0.2.1:5 -> 192.168.50.10:53")
        .frame(&t, 0)
        .unwrap();
    assert_eq!(&f[0..6], &[2, 0xaa, 0, 0, 0, 1]);
    assert_eq!(&f[6..12], &PEER_MAC);
    assert!(l4_checksum_ok(&f));

    for s in [
        "icmp 192.0.2.1 -> 10.244.1.5",
        "icmpv6 fd00::1 -> fd00::2 reply",
    ] {
        let f = parse_ok(s).frame(&t, 0).unwrap();
        assert!(l4_checksum_ok(&f), "{s}");
    }
}

#[test]
fn test_frame_refuses_an_unknown_port_and_a_pod_without_the_family() {
    let t = tables();
    let d = parse_ok("udp [fd00::5]:1 -> [fd00::1]:2");
    assert!(d.frame(&t, 1).unwrap_err().contains("no IPv6 address"));
    assert!(d.frame(&t, 9).unwrap_err().contains("no port 9"));
}
