use super::*;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn q(peer: &str, proto: u8, port: u16) -> Query {
    Query {
        peer: ip(peer),
        proto,
        port,
    }
}

fn set(blocks: &[(&str, &[&str])]) -> SetSpec {
    SetSpec {
        name: String::new(),
        blocks: blocks
            .iter()
            .map(|(c, e)| BlockSpec {
                cidr: net(c),
                except: e.iter().map(|e| net(e)).collect(),
            })
            .collect(),
    }
}

fn tcp(port: u16) -> PortRangeSpec {
    PortRangeSpec {
        proto: "tcp".into(),
        port: Some(port),
        end: None,
    }
}

fn rule(
    name: &str,
    policy: u32,
    action: ActionSpec,
    peers: Option<Vec<u32>>,
    ports: Vec<PortRangeSpec>,
) -> RuleSpec {
    RuleSpec {
        name: name.into(),
        policy,
        action,
        matches: vec![MatchSpec { peers, ports }],
    }
}

/// Ports 0 (uplink) and 1, 2 (pods `a`, `b`).
const PORTS: [(&str, bool); 3] = [("up", false), ("a", true), ("b", true)];

fn pod(port: &str, ingress: DirectionSpec, egress: DirectionSpec) -> PodPolicySpec {
    PodPolicySpec {
        port: port.into(),
        ingress,
        egress,
    }
}

fn isolated(by: &[u32], allow: &[u32]) -> DirectionSpec {
    DirectionSpec {
        isolated_by: by.to_vec(),
        allow: allow.to_vec(),
        ..DirectionSpec::default()
    }
}

#[test]
fn except_blocks_are_left_out_of_their_cidr() {
    let s = compile_set(&set(&[("10.0.0.0/8", &["10.1.0.0/16", "10.2.3.0/24"])])).unwrap();
    let has = |a: &str| s.lookup.lookup(ip(a)).is_some();
    assert!(has("10.0.0.1") && has("10.2.4.1") && has("10.255.255.255"));
    assert!(!has("10.1.2.3") && !has("10.2.3.4") && !has("11.0.0.1"));
    // Disjoint prefixes: 8 of 10/8 less the /16, and 8 more around the /24.
    assert!(s.prefixes.len() <= 16, "{:?}", s.prefixes);
    let e = compile_set(&set(&[("10.0.0.0/16", &["10.1.0.0/24"])])).unwrap_err();
    assert!(e.contains("not inside"), "{e}");
    let e = compile_set(&set(&[("10.0.0.0/8", &["::/64"])])).unwrap_err();
    assert!(e.contains("not inside"), "{e}");
}

#[test]
fn a_union_of_blocks_keeps_what_another_block_excepts() {
    // One ipBlock leaves 10.1/16 out, another allows 10/8 whole: the union has it.
    let s = compile_set(&set(&[
        ("10.0.0.0/8", &["10.1.0.0/16"]),
        ("10.0.0.0/8", &[]),
    ]))
    .unwrap();
    assert!(s.lookup.lookup(ip("10.1.0.1")).is_some());
}

#[test]
fn a_pod_no_policy_selects_is_open_in_both_directions() {
    let p = PolicySpec::default().compile(&PORTS).unwrap();
    assert!(p.is_empty());
    let d = p.decide(1, Direction::Ingress, &q("10.0.0.9", proto::TCP, 80));
    assert_eq!(d, Decision::DEFAULT);
}

#[test]
fn an_isolated_pod_takes_the_union_of_its_rules() {
    let spec = PolicySpec {
        policies: vec!["NetworkPolicy x/web".into(), "NetworkPolicy x/ssh".into()],
        sets: vec![set(&[("10.0.1.0/24", &[])]), set(&[("10.0.2.5/32", &[])])],
        rules: vec![
            rule(
                "ingress[0]",
                0,
                ActionSpec::Accept,
                Some(vec![0]),
                vec![tcp(80)],
            ),
            rule(
                "ingress[0]",
                1,
                ActionSpec::Accept,
                Some(vec![1]),
                vec![tcp(22)],
            ),
        ],
        pods: vec![pod(
            "a",
            isolated(&[0, 1], &[0, 1]),
            DirectionSpec::default(),
        )],
        ..PolicySpec::default()
    };
    let p = spec.compile(&PORTS).unwrap();
    let ing = |peer, proto, port| p.decide(1, Direction::Ingress, &q(peer, proto, port));
    assert_eq!(
        ing("10.0.1.7", proto::TCP, 80),
        Decision {
            allowed: true,
            by: DecidedBy::Rule(Tier::NetworkPolicy, 0)
        }
    );
    assert_eq!(
        ing("10.0.2.5", proto::TCP, 22).by,
        DecidedBy::Rule(Tier::NetworkPolicy, 1)
    );
    for (peer, proto, port) in [
        ("10.0.1.7", proto::TCP, 22),
        ("10.0.2.5", proto::TCP, 80),
        ("10.0.1.7", proto::UDP, 80),
        ("10.0.1.7", proto::ICMP, 80 << 8),
        ("10.9.9.9", proto::TCP, 80),
    ] {
        assert_eq!(
            ing(peer, proto, port),
            Decision {
                allowed: false,
                by: DecidedBy::Isolated
            },
            "{peer} {proto} {port}"
        );
    }
    // Egress is not isolated; pod b has no policy.
    assert!(
        p.decide(1, Direction::Egress, &q("10.9.9.9", proto::UDP, 53))
            .allowed
    );
    assert!(
        p.decide(2, Direction::Ingress, &q("10.9.9.9", proto::TCP, 1))
            .allowed
    );
    assert_eq!(
        p.isolating(1, Direction::Ingress),
        ["NetworkPolicy x/web", "NetworkPolicy x/ssh"]
    );
    assert_eq!(p.rule_name(1), "NetworkPolicy x/ssh ingress[0]");
    assert_eq!(
        p.allowing(1, Direction::Ingress, &q("10.0.1.7", proto::TCP, 80)),
        [0]
    );
}

#[test]
fn a_policy_without_rules_denies_everything_and_one_without_ports_every_protocol() {
    let spec = PolicySpec {
        policies: vec!["NetworkPolicy x/deny".into(), "NetworkPolicy x/any".into()],
        sets: vec![set(&[("fd00::/64", &["fd00::5/128"])])],
        rules: vec![rule(
            "egress[0]",
            1,
            ActionSpec::Accept,
            Some(vec![0]),
            vec![],
        )],
        pods: vec![
            pod("a", isolated(&[0], &[]), DirectionSpec::default()),
            pod("b", DirectionSpec::default(), isolated(&[0, 1], &[0])),
        ],
        ..PolicySpec::default()
    };
    let p = spec.compile(&PORTS).unwrap();
    assert!(
        !p.decide(1, Direction::Ingress, &q("10.0.0.1", proto::TCP, 80))
            .allowed
    );
    let eg = |peer, proto, port| {
        p.decide(2, Direction::Egress, &q(peer, proto, port))
            .allowed
    };
    assert!(eg("fd00::1", proto::ICMPV6, 128 << 8));
    assert!(eg("fd00::1", proto::SCTP, 9));
    assert!(!eg("fd00::5", proto::TCP, 80), "excepted");
    assert!(!eg("fd01::1", proto::TCP, 80));
}

#[test]
fn whole_protocols_and_port_ranges_match_their_ports_only() {
    let ports = vec![
        PortRangeSpec {
            proto: "udp".into(),
            port: None,
            end: None,
        },
        PortRangeSpec {
            proto: "sctp".into(),
            port: Some(1000),
            end: Some(2000),
        },
    ];
    let spec = PolicySpec {
        policies: vec!["NetworkPolicy x/p".into()],
        rules: vec![rule("ingress[0]", 0, ActionSpec::Accept, None, ports)],
        pods: vec![pod("a", isolated(&[0], &[0]), DirectionSpec::default())],
        ..PolicySpec::default()
    };
    let p = spec.compile(&PORTS).unwrap();
    let ing = |proto, port| {
        p.decide(1, Direction::Ingress, &q("1.2.3.4", proto, port))
            .allowed
    };
    assert!(ing(proto::UDP, 1) && ing(proto::UDP, 65535));
    assert!(ing(proto::SCTP, 1000) && ing(proto::SCTP, 1500) && ing(proto::SCTP, 2000));
    assert!(!ing(proto::SCTP, 999) && !ing(proto::SCTP, 2001));
    assert!(!ing(proto::TCP, 1500) && !ing(proto::ICMP, 0));
}

#[test]
fn tiers_decide_in_order_and_pass_hands_over_to_network_policy() {
    let spec = PolicySpec {
        policies: vec![
            "ClusterNetworkPolicy admin".into(),
            "NetworkPolicy x/web".into(),
            "ClusterNetworkPolicy baseline".into(),
        ],
        sets: vec![
            set(&[("10.0.1.0/24", &[])]),
            set(&[("10.0.2.0/24", &[])]),
            set(&[("10.0.3.0/24", &[])]),
        ],
        rules: vec![
            // Admin: pass 10.0.1/24, deny 10.0.2/24.
            rule(
                "ingress rule pass",
                0,
                ActionSpec::Pass,
                Some(vec![0]),
                vec![],
            ),
            rule(
                "ingress rule deny",
                0,
                ActionSpec::Deny,
                Some(vec![1]),
                vec![],
            ),
            // NetworkPolicy: 10.0.1/24 and 10.0.2/24 on 80.
            rule(
                "ingress[0]",
                1,
                ActionSpec::Accept,
                Some(vec![0, 1]),
                vec![tcp(80)],
            ),
            // Baseline: deny 10.0.3/24.
            rule("ingress rule b", 2, ActionSpec::Deny, Some(vec![2]), vec![]),
        ],
        pods: vec![
            pod(
                "a",
                DirectionSpec {
                    admin: vec![0, 1],
                    isolated_by: vec![1],
                    allow: vec![2],
                    baseline: vec![3],
                },
                DirectionSpec::default(),
            ),
            pod(
                "b",
                DirectionSpec {
                    admin: vec![0, 1],
                    baseline: vec![3],
                    ..DirectionSpec::default()
                },
                DirectionSpec::default(),
            ),
        ],
        ..PolicySpec::default()
    };
    let p = spec.compile(&PORTS).unwrap();
    let a = |peer| p.decide(1, Direction::Ingress, &q(peer, proto::TCP, 80));
    assert_eq!(
        a("10.0.1.1").by,
        DecidedBy::Rule(Tier::NetworkPolicy, 2),
        "passed"
    );
    assert_eq!(
        a("10.0.2.1"),
        Decision {
            allowed: false,
            by: DecidedBy::Rule(Tier::Admin, 1)
        },
        "admin deny wins over the NetworkPolicy allow"
    );
    assert_eq!(
        a("10.0.3.1").by,
        DecidedBy::Isolated,
        "isolated: baseline not asked"
    );
    let b = |peer| p.decide(2, Direction::Ingress, &q(peer, proto::TCP, 80));
    assert_eq!(
        b("10.0.1.1"),
        Decision::DEFAULT,
        "passed, nothing else matched"
    );
    assert_eq!(b("10.0.3.1").by, DecidedBy::Rule(Tier::Baseline, 3));
    assert!(!b("10.0.3.1").allowed);
    // A baseline Pass leaves the decision to the default.
    let mut spec = spec;
    spec.rules[3].action = ActionSpec::Pass;
    let p = spec.compile(&PORTS).unwrap();
    let d = p.decide(2, Direction::Ingress, &q("10.0.3.1", proto::TCP, 80));
    assert_eq!(
        (d.allowed, d.by),
        (true, DecidedBy::Rule(Tier::Baseline, 3))
    );
}

#[test]
fn bad_specs_are_refused_with_the_entry_named() {
    let base = PolicySpec {
        policies: vec!["NetworkPolicy x/p".into()],
        sets: vec![set(&[("10.0.0.0/8", &[])])],
        rules: vec![rule(
            "ingress[0]",
            0,
            ActionSpec::Accept,
            Some(vec![0]),
            vec![tcp(80)],
        )],
        pods: vec![pod("a", isolated(&[0], &[0]), DirectionSpec::default())],
        ..PolicySpec::default()
    };
    base.compile(&PORTS).unwrap();
    let refused = |f: &dyn Fn(&mut PolicySpec), want: &str| {
        let mut s = base.clone();
        f(&mut s);
        let e = s.compile(&PORTS).unwrap_err();
        assert!(e.contains(want), "{e:?} lacks {want:?}");
    };
    refused(
        &|s| s.pods[0].port = "up".into(),
        "policy.pods[0] (up): not a pod port",
    );
    refused(&|s| s.pods[0].port = "zz".into(), "no port of that name");
    refused(&|s| s.pods.push(s.pods[0].clone()), "listed twice");
    refused(
        &|s| s.rules[0].matches[0].peers = Some(vec![7]),
        "peers: no set 7",
    );
    refused(&|s| s.rules[0].policy = 3, "no policy 3");
    refused(
        &|s| s.rules[0].matches[0].ports[0].proto = "icmp".into(),
        "expected tcp, udp or sctp",
    );
    refused(
        &|s| s.rules[0].matches[0].ports[0].end = Some(79),
        "end 79 is below port 80",
    );
    refused(&|s| s.rules[0].action = ActionSpec::Deny, "cannot be Deny");
    refused(
        &|s| s.pods[0].ingress.isolated_by.clear(),
        "without a policy isolating",
    );
    refused(
        &|s| s.pods[0].ingress.allow = vec![4],
        "allow[0]: no rule 4",
    );
    refused(
        &|s| {
            s.rules[0].action = ActionSpec::Pass;
        },
        "cannot be Pass",
    );
}

#[test]
fn the_spec_reads_and_writes_the_tables_file_form() {
    let json = r#"{
        "policies": ["NetworkPolicy x/p"],
        "sets": [{"name": "pods app=a in x", "blocks": [{"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}]}],
        "rules": [{"name": "ingress[0]", "policy": 0, "matches": [{"peers": [0], "ports": [{"proto": "tcp", "port": 80}]}]}],
        "pods": [{"port": "a", "ingress": {"isolated_by": [0], "allow": [0]}}]
    }"#;
    let spec: PolicySpec = serde_json::from_str(json).unwrap();
    assert!(spec.host_to_pods);
    assert_eq!(spec.rules[0].action, ActionSpec::Accept);
    let back: PolicySpec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
    assert_eq!(back, spec);
    let p = spec.compile(&PORTS).unwrap();
    assert!(
        p.decide(1, Direction::Ingress, &q("10.0.0.1", proto::TCP, 80))
            .allowed
    );
    assert!(
        !p.decide(1, Direction::Ingress, &q("10.1.0.1", proto::TCP, 80))
            .allowed
    );
    let e = serde_json::from_str::<PolicySpec>(r#"{"pod": []}"#).unwrap_err();
    assert!(e.to_string().contains("unknown field"), "{e}");
}

mod index {
    use super::*;
    use proptest::prelude::*;

    /// A prefix of 10.0.0.0/16 at length 16, 24, 28 or 32.
    fn prefix() -> impl Strategy<Value = String> {
        (
            prop_oneof![Just(16u8), Just(24), Just(28), Just(32)],
            0u8..4,
            0u8..32,
        )
            .prop_map(|(len, c, d)| format!("10.0.{c}.{}/{len}", d * 8))
    }

    fn ports() -> impl Strategy<Value = Vec<PortRangeSpec>> {
        let one = prop_oneof![
            Just(("tcp", Some(80u16), None)),
            Just(("tcp", Some(70), Some(90))),
            Just(("udp", None, None)),
            Just(("sctp", Some(80), None)),
        ]
        .prop_map(|(p, port, end)| PortRangeSpec {
            proto: p.into(),
            port,
            end,
        });
        prop::collection::vec(one, 0..3)
    }

    fn matches() -> impl Strategy<Value = MatchSpec> {
        (
            prop::option::of(prop::collection::vec(0u32..6, 0..3)),
            ports(),
        )
            .prop_map(|(peers, ports)| MatchSpec { peers, ports })
    }

    proptest! {
        /// The index finds the first rule of the list in order that matches, as a walk
        /// through the rules one by one does.
        #[test]
        fn the_index_finds_the_first_matching_rule(
            sets in prop::collection::vec(prop::collection::vec((prefix(), prop::option::of(prefix())), 1..3), 6),
            rules in prop::collection::vec(prop::collection::vec(matches(), 1..3), 1..12),
            queries in prop::collection::vec((0u8..4, 0u8..=255, prop_oneof![Just(proto::TCP), Just(proto::UDP), Just(proto::SCTP), Just(proto::ICMP)], 60u16..100), 32),
        ) {
            let spec = PolicySpec {
                policies: vec!["p".into()],
                sets: sets
                    .iter()
                    .map(|blocks| SetSpec {
                        name: String::new(),
                        blocks: blocks
                            .iter()
                            .map(|(c, e)| {
                                let cidr = net(c);
                                let except = e.iter().map(|e| net(e)).filter(|e| cidr.trunc().contains(e) && *e != cidr.trunc()).collect();
                                BlockSpec { cidr, except }
                            })
                            .collect(),
                    })
                    .collect(),
                rules: rules
                    .into_iter()
                    .enumerate()
                    .map(|(i, matches)| RuleSpec {
                        name: format!("r{i}"),
                        policy: 0,
                        action: ActionSpec::Deny,
                        matches,
                    })
                    .collect(),
                ..PolicySpec::default()
            };
            let list: Vec<u32> = (0..spec.rules.len() as u32).rev().collect();
            let mut spec = spec;
            spec.pods = vec![pod("a", DirectionSpec { admin: list.clone(), ..DirectionSpec::default() }, DirectionSpec::default())];
            let p = spec.compile(&PORTS).unwrap();
            for (c, d, proto, port) in queries {
                let q = Query { peer: IpAddr::V4(std::net::Ipv4Addr::new(10, 0, c, d)), proto, port };
                let walked = list.iter().copied().find(|r| p.matches(*r, &q));
                let got = match p.decide(1, Direction::Ingress, &q).by {
                    DecidedBy::Rule(Tier::Admin, r) => Some(r),
                    _ => None,
                };
                prop_assert_eq!(got, walked, "{:?}", q);
            }
        }
    }
}

#[test]
fn a_compilation_after_another_takes_what_means_the_same_and_decides_alike() {
    // Pod a: one rule from 10.0.1/24 on 80; pod b: one from 10.0.2/24 on 22.
    let spec = |b_port: u16, b_set: &str| PolicySpec {
        policies: vec!["NetworkPolicy x/a".into(), "NetworkPolicy x/b".into()],
        sets: vec![set(&[("10.0.1.0/24", &[])]), set(&[(b_set, &[])])],
        rules: vec![
            rule(
                "ingress[0]",
                0,
                ActionSpec::Accept,
                Some(vec![0]),
                vec![tcp(80)],
            ),
            rule(
                "ingress[0]",
                1,
                ActionSpec::Accept,
                Some(vec![1]),
                vec![tcp(b_port)],
            ),
        ],
        pods: vec![
            pod("a", isolated(&[0], &[0]), DirectionSpec::default()),
            pod("b", isolated(&[1], &[1]), DirectionSpec::default()),
        ],
        ..PolicySpec::default()
    };
    let before = spec(22, "10.0.2.0/24").compile(&PORTS).unwrap();
    let index =
        |p: &Policy, port: u16| Arc::clone(&p.dir(port, Direction::Ingress).unwrap().allow.index);
    // b's port changes: a's index and both sets are taken over, b's index is new.
    let after = spec(2222, "10.0.2.0/24")
        .compile_after(&PORTS, Some(&before))
        .unwrap();
    assert!(Arc::ptr_eq(&index(&before, 1), &index(&after, 1)));
    assert!(!Arc::ptr_eq(&index(&before, 2), &index(&after, 2)));
    assert!(Arc::ptr_eq(&before.sets[0], &after.sets[0]));
    assert!(Arc::ptr_eq(&before.sets[1], &after.sets[1]));
    // b's set changes: its set and index are new.
    let moved = spec(2222, "10.0.3.0/24")
        .compile_after(&PORTS, Some(&after))
        .unwrap();
    assert!(!Arc::ptr_eq(&after.sets[1], &moved.sets[1]));
    assert!(!Arc::ptr_eq(&index(&after, 2), &index(&moved, 2)));
    // Each decides as the same spec compiled from nothing.
    let fresh = spec(2222, "10.0.3.0/24").compile(&PORTS).unwrap();
    for (port, peer, dport) in [
        (1, "10.0.1.9", 80),
        (1, "10.0.2.9", 80),
        (2, "10.0.2.9", 2222),
        (2, "10.0.3.9", 2222),
        (2, "10.0.3.9", 22),
    ] {
        let query = q(peer, proto::TCP, dport);
        assert_eq!(
            moved.decide(port, Direction::Ingress, &query),
            fresh.decide(port, Direction::Ingress, &query),
            "port {port} from {peer} to {dport}"
        );
    }
    assert!(
        !moved
            .decide(2, Direction::Ingress, &q("10.0.2.9", proto::TCP, 2222))
            .allowed
    );
    assert!(
        moved
            .decide(2, Direction::Ingress, &q("10.0.3.9", proto::TCP, 2222))
            .allowed
    );
}
