//! The format: round trips, the fixture of each version, refused states.

use std::net::IpAddr;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn side(end: u32, scale: u8) -> TcpSide {
    TcpSide {
        end,
        max_end: end.wrapping_add(65535 << scale),
        max_window: 65535 << scale,
        window_scale: scale,
        sent_window_scale: scale > 0,
        liberal: false,
        unacknowledged: end % 2 == 1,
    }
}

/// A pod's TCP connection to a cluster IP, translated to its endpoint.
fn tcp_dnat() -> Connection {
    Connection {
        zone: 0,
        proto: 6,
        original: Tuple {
            src: ip("10.244.1.5"),
            dst: ip("10.96.0.10"),
            src_port: 40000,
            dst_port: 80,
        },
        reply: Tuple {
            src: ip("10.244.1.6"),
            dst: ip("10.244.1.5"),
            src_port: 8080,
            dst_port: 40000,
        },
        tracking: Tracking::Tcp(Tcp {
            state: TcpState::Established,
            reset_kept: false,
            original: side(1001, 7),
            reply: side(7001, 0),
        }),
        seen_reply: true,
        assured: true,
        dnat: true,
        snat: false,
        mark: 1,
        labels: 0,
        tunnel_peer: None,
        packets: [3, 2],
        bytes: [180, 120],
        first_seen_ago_ns: 4_000_000_000,
        last_seen_ago_ns: 3_000_000_000,
    }
}

/// The state of the fixtures' version 1 bytes: one record of every kind version 1 has,
/// each field away from its default where it can be.
fn state_v1() -> SavedState {
    let udp6 = Connection {
        zone: 3,
        proto: 17,
        original: Tuple {
            src: ip("fd00:10:244:1::5"),
            dst: ip("fd00:96::11"),
            src_port: 5353,
            dst_port: 53,
        },
        reply: Tuple {
            src: ip("fd00:10:244:2::5"),
            dst: ip("fd00:50::10"),
            src_port: 53,
            dst_port: 1024,
        },
        tracking: Tracking::Udp,
        seen_reply: true,
        assured: false,
        dnat: true,
        snat: true,
        mark: 3,
        labels: 0x1234_5678_9abc_def0_0fed_cba9_8765_4321,
        tunnel_peer: Some(ip("fd00:50::20")),
        packets: [1, 1],
        bytes: [60, 80],
        first_seen_ago_ns: 10,
        last_seen_ago_ns: 5,
    };
    let echo = Connection {
        zone: 0,
        proto: 1,
        original: Tuple {
            src: ip("10.244.1.5"),
            dst: ip("10.244.2.6"),
            src_port: 77,
            dst_port: 8 << 8,
        },
        reply: Tuple {
            src: ip("10.244.2.6"),
            dst: ip("10.244.1.5"),
            src_port: 77,
            dst_port: 0,
        },
        tracking: Tracking::Icmp,
        seen_reply: false,
        assured: false,
        dnat: false,
        snat: false,
        mark: 0,
        labels: 0,
        tunnel_peer: Some(ip("192.168.50.20")),
        packets: [1, 0],
        bytes: [84, 0],
        first_seen_ago_ns: 0,
        last_seen_ago_ns: 0,
    };
    let gre = Connection {
        proto: 47,
        original: Tuple {
            src: ip("10.244.1.5"),
            dst: ip("192.168.70.1"),
            src_port: 0,
            dst_port: 0,
        },
        reply: Tuple {
            src: ip("192.168.70.1"),
            dst: ip("192.168.50.10"),
            src_port: 0,
            dst_port: 0,
        },
        tracking: Tracking::Other,
        seen_reply: true,
        assured: true,
        snat: true,
        dnat: false,
        ..echo.clone()
    };
    let mut picked_up = tcp_dnat();
    if let Tracking::Tcp(t) = &mut picked_up.tracking {
        t.state = TcpState::FinWait;
        t.reset_kept = true;
        t.original.liberal = true;
        t.reply.liberal = true;
    }
    picked_up.original.src_port = 40001;
    picked_up.reply.dst_port = 40001;
    SavedState {
        format: 1,
        producer: "0.1.0".into(),
        meta: Meta {
            node: "node1".into(),
            outer_id: 4242,
        },
        connections: vec![tcp_dnat(), udp6, echo, gre, picked_up],
        affinity: vec![Affinity {
            service: "default/dns:dns".into(),
            client: ip("10.244.1.5"),
            endpoint: ip("10.244.2.5"),
            endpoint_port: 53,
            remaining_ns: 9_500_000_000,
        }],
        neighbours: vec![],
        datagrams: vec![],
        removed: None,
    }
}

/// The state of the fixture's version 2 bytes: version 1's, and a neighbour and a
/// datagram of each family.
fn state_v2() -> SavedState {
    let v4 = Datagram {
        zone: 0,
        src: ip("10.244.1.5"),
        dst: ip("10.244.2.6"),
        proto: 17,
        id: 0x1234,
        remaining_ns: 26_000_000_000,
        first: Some(FirstHeaders {
            bytes: (0..34).collect(),
            ip_offset: 14,
            next_header: 0,
            next_header_at: 0,
        }),
        end: Some(3000),
        fragments: vec![
            Fragment {
                offset: 0,
                data: vec![7; 976],
            },
            Fragment {
                offset: 1952,
                data: vec![9; 1048],
            },
        ],
        bytes: 2064,
        mru: 996,
        max_df: 0,
        ecn_seen: 1,
    };
    let v6 = Datagram {
        zone: 2,
        src: ip("fd00:10:244:1::5"),
        dst: ip("fd00:10:244:2::6"),
        proto: 0,
        id: 0xdead_beef,
        remaining_ns: 1,
        first: None,
        end: None,
        fragments: vec![Fragment {
            offset: 1232,
            data: vec![3; 1232],
        }],
        bytes: 1280,
        mru: 1280,
        max_df: 0,
        ecn_seen: 4,
    };
    SavedState {
        format: 2,
        neighbours: vec![
            Neighbour {
                port: "eth0".into(),
                addr: ip("192.168.50.1"),
                mac: [2, 0, 0, 0, 0, 0xfe],
                state: NeighState::Reachable,
                updated_ago_ns: 5_000_000_000,
                used_ago_ns: 1_000,
                probed_ago_ns: Some(5_000_000_100),
                probes: 0,
            },
            Neighbour {
                port: "host".into(),
                addr: ip("fd00:50::1"),
                mac: [0; 6],
                state: NeighState::Incomplete,
                updated_ago_ns: 0,
                used_ago_ns: 0,
                probed_ago_ns: None,
                probes: 2,
            },
        ],
        datagrams: vec![v4, v6],
        ..state_v1()
    }
}

/// The state of the fixture's version 3 bytes: version 2's as the changes since a
/// pre-copy's base, with a removed connection of each family.
fn state_v3() -> SavedState {
    SavedState {
        format: 3,
        removed: Some(vec![
            Removed {
                zone: 0,
                proto: 6,
                original: Tuple {
                    src: ip("10.244.1.5"),
                    dst: ip("10.96.0.10"),
                    src_port: 40100,
                    dst_port: 80,
                },
            },
            Removed {
                zone: 1,
                proto: 17,
                original: Tuple {
                    src: ip("fd00:10::5"),
                    dst: ip("fd00:96::a"),
                    src_port: 5353,
                    dst_port: 53,
                },
            },
        ]),
        ..state_v2()
    }
}

/// Bytes of a state of `version` made of `sections`, as the format lays them out.
fn bytes_of(version: u16, sections: &[(Tag, Vec<u8>)]) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(&version.to_le_bytes());
    v.push(5);
    v.extend_from_slice(b"0.1.0");
    for (tag, payload) in sections {
        v.extend_from_slice(&tag.0);
        v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        v.extend_from_slice(payload);
    }
    v.extend_from_slice(&Tag::END.0);
    v.extend_from_slice(&[0; 4]);
    v
}

/// The sections of `s` as version 1 writes them.
fn sections_v1(s: &SavedState) -> Vec<(Tag, Vec<u8>)> {
    vec![
        (Tag::META, postcard::to_stdvec(&s.meta).unwrap()),
        (Tag::CONN, postcard::to_stdvec(&s.connections).unwrap()),
        (Tag::AFFN, postcard::to_stdvec(&s.affinity).unwrap()),
    ]
}

/// The sections of `s` as version 2 writes them.
fn sections_v2(s: &SavedState) -> Vec<(Tag, Vec<u8>)> {
    let mut v = sections_v1(s);
    v.push((Tag::NEIG, postcard::to_stdvec(&s.neighbours).unwrap()));
    v.push((Tag::FRAG, postcard::to_stdvec(&s.datagrams).unwrap()));
    v
}

/// The sections of `s` as version 3 writes them.
fn sections_v3(s: &SavedState) -> Vec<(Tag, Vec<u8>)> {
    let mut v = sections_v2(s);
    v.push((Tag::GONE, postcard::to_stdvec(&s.removed).unwrap()));
    v
}

/// The state of the fixture's version 4 bytes: version 3's, and an SCTP association
/// through a cluster IP.
fn state_v4() -> SavedState {
    let mut v = state_v3();
    let mut sctp = tcp_dnat();
    sctp.proto = 132;
    sctp.original.src_port = 40200;
    sctp.reply.dst_port = 40200;
    sctp.tracking = Tracking::Sctp(Sctp {
        state: SctpState::Established,
        vtag: [0x0102_0304, 0xa0b0_c0d0],
    });
    v.connections.push(sctp);
    SavedState { format: 4, ..v }
}

/// The sections of `s` as version 4 writes them: version 3's.
fn sections_v4(s: &SavedState) -> Vec<(Tag, Vec<u8>)> {
    sections_v3(s)
}

const FIXTURE_V1: &[u8] = include_bytes!("../../tests/data/handover-v1.bin");
const FIXTURE_V2: &[u8] = include_bytes!("../../tests/data/handover-v2.bin");
const FIXTURE_V3: &[u8] = include_bytes!("../../tests/data/handover-v3.bin");
const FIXTURE_V4: &[u8] = include_bytes!("../../tests/data/handover-v4.bin");

/// Writes the current version's fixture instead of checking it, when asked
/// (`FERRY_WRITE_FIXTURES=1`, after a deliberate format change with a new version).
// The test writes the fixture it is asked to make; the datapath itself does no I/O.
#[allow(clippy::disallowed_methods)]
fn fixture(version: u16, state: &SavedState, bytes: &[u8]) -> Vec<u8> {
    if version == FORMAT && std::env::var_os("FERRY_WRITE_FIXTURES").is_some() {
        let path = format!(
            "{}/tests/data/handover-v{version}.bin",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::write(path, encode(state)).unwrap();
    }
    bytes.to_vec()
}

#[test]
fn test_a_state_round_trips_through_its_bytes() {
    let s = SavedState {
        format: FORMAT,
        ..state_v4()
    };
    let bytes = encode(&s);
    assert_eq!(&bytes[..8], b"FERRYHOS");
    assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), FORMAT);
    assert_eq!(decode(&bytes), Ok(s));
    let empty = SavedState::default();
    assert_eq!(decode(&encode(&empty)), Ok(empty));
}

#[test]
fn test_the_version_1_fixture_decodes_to_the_state_it_holds() {
    let bytes = fixture(1, &state_v1(), FIXTURE_V1);
    assert_eq!(decode(&bytes), Ok(state_v1()));
    assert_eq!(
        bytes,
        bytes_of(1, &sections_v1(&state_v1())),
        "laid out as documented"
    );
}

/// Version skew: a newer build reads the previous version's bytes, what that version
/// lacks left empty.
#[test]
fn test_the_version_2_fixture_decodes_to_the_state_it_holds_and_version_1_still_reads() {
    let bytes = fixture(2, &state_v2(), FIXTURE_V2);
    assert_eq!(decode(&bytes), Ok(state_v2()));
    assert_eq!(bytes, bytes_of(2, &sections_v2(&state_v2())));
    let v1 = decode(FIXTURE_V1).unwrap();
    assert_eq!(v1.format, 1);
    assert!(v1.neighbours.is_empty() && v1.datagrams.is_empty());
    assert_eq!(
        encode(&v1),
        encode(&SavedState {
            format: 2,
            ..state_v1()
        }),
        "written as the current version"
    );
    // Version 1 has no neighbours.
    let mut sections = sections_v1(&state_v1());
    sections.push((
        Tag::NEIG,
        postcard::to_stdvec(&state_v2().neighbours).unwrap(),
    ));
    assert_eq!(
        decode(&bytes_of(1, &sections)),
        Err(StateError::UnknownSection {
            tag: Tag::NEIG,
            version: 1
        })
    );
    // Version 2 requires them.
    assert_eq!(
        decode(&bytes_of(2, &sections)),
        Err(StateError::MissingSection(Tag::FRAG))
    );
}

/// Version skew again: version 3 adds the removed connections of a pre-copy's changes;
/// a version 2 state reads as a whole state.
#[test]
fn test_the_version_3_fixture_decodes_to_the_state_it_holds_and_version_2_still_reads() {
    let bytes = fixture(3, &state_v3(), FIXTURE_V3);
    assert_eq!(decode(&bytes), Ok(state_v3()));
    assert_eq!(bytes, bytes_of(3, &sections_v3(&state_v3())));
    let v2 = decode(FIXTURE_V2).unwrap();
    assert_eq!(v2.format, 2);
    assert_eq!(v2.removed, None, "a version 2 state is whole");
    // Version 2 has no removed connections; version 3 requires the section.
    assert_eq!(
        decode(&bytes_of(2, &sections_v3(&state_v3()))),
        Err(StateError::UnknownSection {
            tag: Tag::GONE,
            version: 2
        })
    );
    assert_eq!(
        decode(&bytes_of(3, &sections_v2(&state_v2()))),
        Err(StateError::MissingSection(Tag::GONE))
    );
    // A removed connection of two families is no record.
    let mut bad = state_v3();
    bad.removed.as_mut().unwrap()[1].original.dst = ip("10.96.0.10");
    let e = decode(&encode(&bad)).unwrap_err();
    assert!(
        e.to_string()
            .contains("section GONE (removed connections) record 1"),
        "{e}"
    );
}

/// Version 4 adds SCTP's tracking to the connection record; a version 3 state reads as
/// it was.
#[test]
fn test_the_version_4_fixture_decodes_to_the_state_it_holds_and_version_3_still_reads() {
    let bytes = fixture(4, &state_v4(), FIXTURE_V4);
    assert_eq!(decode(&bytes), Ok(state_v4()));
    assert_eq!(bytes, bytes_of(4, &sections_v4(&state_v4())));
    let v3 = decode(FIXTURE_V3).unwrap();
    assert_eq!(v3.format, 3);
    assert_eq!(v3.connections, state_v3().connections);
}

#[test]
fn test_bytes_of_something_else_are_not_a_state() {
    for junk in [
        &b"hello, world, this is not it"[..],
        &[0xff; 64],
        b"FERRYHOX\x01\x00",
    ] {
        let e = decode(junk).unwrap_err();
        assert_eq!(e, StateError::NotFerryState);
        assert!(e.to_string().contains("not a ferry handover state"), "{e}");
    }
}

#[test]
fn test_a_state_cut_short_at_any_byte_is_truncated() {
    let mut small = state_v2();
    small.connections.truncate(1);
    small.datagrams[0].fragments.truncate(1);
    small.datagrams[0].fragments[0].data.truncate(8);
    small.datagrams[0]
        .first
        .as_mut()
        .unwrap()
        .bytes
        .truncate(20);
    small.datagrams.truncate(1);
    let bytes = encode(&small);
    for n in 0..bytes.len() {
        match decode(&bytes[..n]) {
            Err(StateError::Truncated { needed, left, .. }) => assert!(needed > left, "at {n}"),
            other => panic!("cut at {n} of {}: {other:?}", bytes.len()),
        }
    }
    let e = decode(&bytes[..bytes.len() - 20]).unwrap_err();
    assert!(e.to_string().contains("section FRAG (fragments)"), "{e}");
}

#[test]
fn test_a_newer_version_is_refused_naming_both_versions() {
    let mut bytes = encode(&state_v1());
    bytes[8..10].copy_from_slice(&(FORMAT + 1).to_le_bytes());
    let e = decode(&bytes).unwrap_err();
    assert_eq!(
        e,
        StateError::NewerVersion {
            found: FORMAT + 1,
            newest: FORMAT
        }
    );
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("version {}", FORMAT + 1)) && msg.contains(&format!("to {FORMAT}")),
        "{msg}"
    );
    bytes[8..10].copy_from_slice(&0u16.to_le_bytes());
    assert_eq!(decode(&bytes), Err(StateError::UnknownVersion(0)));
}

#[test]
fn test_a_section_that_does_not_parse_is_named() {
    let s = state_v1();
    let mut sections = sections_v1(&s);
    // A sequence of records whose first record ends inside its first address.
    sections[1].1 = vec![1, 0, 6, 0, 10];
    let e = decode(&bytes_of(1, &sections)).unwrap_err();
    assert!(
        matches!(&e, StateError::Section { tag: Tag::CONN, .. }),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("section CONN (connections) does not parse"),
        "{e}"
    );

    // A whole value with bytes after it.
    let mut sections = sections_v1(&s);
    sections[0].1.push(0);
    let e = decode(&bytes_of(1, &sections)).unwrap_err();
    assert!(
        matches!(e, StateError::Section { tag: Tag::META, .. }),
        "{e:?}"
    );

    // A boolean that is neither: `seen_reply` is the first byte that tells a
    // connection that saw a reply from one that saw none.
    let mut sections = sections_v1(&s);
    let one = postcard::to_stdvec(&vec![tcp_dnat()]).unwrap();
    let unreplied = Connection {
        seen_reply: false,
        ..tcp_dnat()
    };
    let other = postcard::to_stdvec(&vec![unreplied]).unwrap();
    let at = (0..one.len()).find(|&i| one[i] != other[i]).unwrap();
    let mut bad = one;
    bad[at] = 2;
    sections[1].1 = bad;
    let e = decode(&bytes_of(1, &sections)).unwrap_err();
    assert!(
        matches!(e, StateError::Section { tag: Tag::CONN, .. }),
        "{e:?}"
    );
}

/// Makes a record impossible.
type Spoil = fn(&mut Connection);

#[test]
fn test_an_impossible_record_is_refused_naming_it() {
    let mut s = state_v1();
    s.connections[3].reply.src = ip("fd00::1");
    s.connections[3].reply.dst = ip("fd00::2");
    let e = decode(&encode(&s)).unwrap_err();
    assert_eq!(
        e,
        StateError::Invalid {
            tag: Tag::CONN,
            index: 3,
            problem: "IPv4 original tuple with an IPv6 reply tuple".into()
        }
    );
    assert!(
        e.to_string()
            .contains("section CONN (connections) record 3"),
        "{e}"
    );

    let cases: [(Spoil, &str); 6] = [
        (|c| c.tracking = Tracking::Udp, "UDP tracking of protocol 6"),
        (|c| c.seen_reply = false, "replies counted"),
        (
            |c| c.last_seen_ago_ns = c.first_seen_ago_ns + 1,
            "last packet before the first",
        ),
        (|c| c.dnat = false, "destination without DNAT"),
        (|c| c.reply.dst_port += 1, "source without SNAT"),
        (
            |c| {
                if let Tracking::Tcp(t) = &mut c.tracking {
                    t.reply.window_scale = 15;
                }
            },
            "window scale 15",
        ),
    ];
    for (spoil, what) in cases {
        let mut s = state_v1();
        spoil(&mut s.connections[0]);
        match decode(&encode(&s)) {
            Err(StateError::Invalid {
                tag: Tag::CONN,
                index: 0,
                problem,
            }) => assert!(problem.contains(what), "{problem} for {what}"),
            other => panic!("{what}: {other:?}"),
        }
    }
    let mut s = state_v1();
    s.affinity[0].endpoint = ip("fd00:10:244:2::5");
    let e = decode(&encode(&s)).unwrap_err();
    assert!(
        matches!(
            e,
            StateError::Invalid {
                tag: Tag::AFFN,
                index: 0,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn test_sections_must_be_those_of_the_version_once_each() {
    let s = state_v1();
    let mut sections = sections_v1(&s);
    sections.remove(2);
    assert_eq!(
        decode(&bytes_of(1, &sections)),
        Err(StateError::MissingSection(Tag::AFFN))
    );
    let mut sections = sections_v1(&s);
    sections.push(sections[1].clone());
    assert_eq!(
        decode(&bytes_of(1, &sections)),
        Err(StateError::DuplicateSection(Tag::CONN))
    );
    let mut sections = sections_v1(&s);
    sections.push((Tag(*b"XTRA"), vec![0]));
    let e = decode(&bytes_of(1, &sections)).unwrap_err();
    assert_eq!(
        e,
        StateError::UnknownSection {
            tag: Tag(*b"XTRA"),
            version: 1
        }
    );
    let mut bytes = bytes_of(1, &sections_v1(&s));
    bytes.push(0);
    assert_eq!(decode(&bytes), Err(StateError::TrailingBytes(1)));
}

/// Makes a datagram record impossible.
type SpoilDatagram = fn(&mut Datagram);

#[test]
fn test_impossible_neighbours_and_datagrams_are_refused() {
    let mut s = state_v2();
    s.neighbours[1].mac = [1; 6];
    let e = decode(&encode(&s)).unwrap_err();
    assert_eq!(
        e,
        StateError::Invalid {
            tag: Tag::NEIG,
            index: 1,
            problem: "incomplete with a MAC".into()
        }
    );
    let cases: [(SpoilDatagram, &str); 6] = [
        (|d| d.dst = ip("fd00::1"), "from IPv4 to IPv6"),
        (|d| d.fragments[1].offset = 900, "fragments overlap"),
        (|d| d.end = Some(2000), "a fragment at 1952"),
        (|d| d.first = None, "offset 0 without headers"),
        (|d| d.bytes = 100, "fewer bytes counted"),
        (
            |d| {
                d.fragments[1].offset = 976;
                d.end = Some(2024);
            },
            "complete",
        ),
    ];
    for (spoil, what) in cases {
        let mut s = state_v2();
        spoil(&mut s.datagrams[0]);
        match decode(&encode(&s)) {
            Err(StateError::Invalid {
                tag: Tag::FRAG,
                index: 0,
                problem,
            }) => assert!(problem.contains(what), "{problem} for {what}"),
            other => panic!("{what}: {other:?}"),
        }
    }
}

/// A record read into a conntrack entry and saved again is the same record: every field
/// the entry's compact layout stores (an IPv6 connection with five distinct addresses
/// among them, TCP flags of both sides).
#[test]
fn test_a_connection_record_survives_its_entry() {
    use crate::conntrack::saved::{entry, record};
    let now = 50_000_000_000;
    for c in state_v2().connections {
        let e = entry(&c, now, 0);
        assert_eq!(record(&e, now), c);
        let later = record(&e, now + 7);
        assert_eq!(later.last_seen_ago_ns, c.last_seen_ago_ns + 7);
    }
}
