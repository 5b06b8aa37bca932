//! The policy stage in the pipeline: which packets are decided, on which addresses and
//! ports, and what a denial leaves behind.

use super::test_support::*;
use super::*;
use crate::policy::{
    ActionSpec, BlockSpec, DirectionSpec, MatchSpec, PodPolicySpec, PolicySpec, PortRangeSpec,
    RuleSpec, SetSpec,
};
use crate::tables::PortKind;

pub(super) const POD_A: &str = "10.244.1.5";
pub(super) const POD_B: &str = "10.244.1.6";

pub(super) fn block(cidr: &str) -> SetSpec {
    SetSpec {
        name: cidr.into(),
        blocks: vec![BlockSpec {
            cidr: cidr.parse().unwrap(),
            except: vec![],
        }],
    }
}

/// NetworkPolicy `x/b` isolating pod-b (port 2 of node `n`) for ingress and allowing
/// TCP `port` from `from` (a CIDR), or nothing when `port` is None.
pub(super) fn ingress_to_b(from: &str, port: Option<u16>) -> PolicySpec {
    PolicySpec {
        policies: vec!["NetworkPolicy x/b".into()],
        sets: vec![block(from)],
        rules: port
            .map(|p| RuleSpec {
                name: "ingress[0]".into(),
                policy: 0,
                action: ActionSpec::Accept,
                matches: vec![MatchSpec {
                    peers: Some(vec![0]),
                    ports: vec![PortRangeSpec {
                        proto: "tcp".into(),
                        port: Some(p),
                        end: None,
                    }],
                }],
            })
            .into_iter()
            .collect(),
        pods: vec![PodPolicySpec {
            port: "pod-b".into(),
            ingress: DirectionSpec {
                isolated_by: vec![0],
                allow: if port.is_some() { vec![0] } else { vec![] },
                ..DirectionSpec::default()
            },
            egress: DirectionSpec::default(),
        }],
        ..PolicySpec::default()
    }
}

/// NetworkPolicy `x/a` isolating pod-a for egress with no rule: nothing leaves it.
pub(super) fn no_egress_from_a() -> PolicySpec {
    PolicySpec {
        policies: vec!["NetworkPolicy x/a".into()],
        pods: vec![PodPolicySpec {
            port: "pod-a".into(),
            ingress: DirectionSpec::default(),
            egress: DirectionSpec {
                isolated_by: vec![0],
                ..DirectionSpec::default()
            },
        }],
        ..PolicySpec::default()
    }
}

/// Node `n` with `services` and `policy`, its gateway and its peer's uplink learnt.
pub(super) fn node_with(n: u8, services: Vec<ServiceSpec>, policy: PolicySpec) -> Pipeline {
    let other = 3 - n;
    let mut spec = node_spec(
        n,
        ModeSpec::Always,
        vec![peer(other, &format!("192.168.50.{}", other * 10))],
    );
    spec.services = services;
    spec.policy = policy;
    let mut p = Pipeline::new(Arc::new(spec.compile().unwrap()));
    learn(&mut p, n, "192.168.50.1", GW_MAC);
    learn(
        &mut p,
        n,
        &format!("192.168.50.{}", other * 10),
        uplink_mac(other),
    );
    p
}

pub(super) fn syn(n: u8, src_last: u8, dst: &str, dport: u16) -> Vec<u8> {
    build::tcp(
        ip(&format!("10.244.{n}.{src_last}")),
        ip(dst),
        40000,
        dport,
        1000,
        0,
        tcp_flags::SYN,
        &[],
        &from_pod(n, src_last),
    )
}

fn traced(p: &mut Pipeline, frame: Vec<u8>, port: PortId) -> (Verdict, Vec<String>) {
    let mut out = Vec::new();
    let mut t = Trace::enabled();
    let v = p.process(Packet::new(frame, port, SEC), &mut out, &mut t);
    let notes = t
        .events
        .iter()
        .filter(|e| e.stage() == Stage::Policy)
        .map(|e| e.to_string())
        .collect();
    (v, notes)
}

#[test]
fn an_allowed_connection_is_committed_and_its_replies_pass_undecided() {
    let mut p = node_with(1, vec![], ingress_to_b("10.244.1.5/32", Some(80)));
    let (v, notes) = traced(&mut p, syn(1, 5, POD_B, 80), POD);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(
        notes,
        [
            "egress from pod-a (peer 10.244.1.6): allowed: no policy applies",
            "ingress to pod-b (peer 10.244.1.5): allowed by NetworkPolicy x/b ingress[0]"
        ]
    );
    assert_eq!(p.conntrack().len(), 1);
    // The SYN-ACK of pod-b is a reply: not decided (pod-a's egress is open anyway, but
    // pod-b's egress would be asked if it were decided).
    let synack = build::tcp(
        ip(POD_B),
        ip(POD_A),
        80,
        40000,
        5000,
        1001,
        tcp_flags::SYN | tcp_flags::ACK,
        &[],
        &from_pod(1, 6),
    );
    let (v, notes) = traced(&mut p, synack, POD2);
    assert_eq!(v, Verdict::Forwarded);
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(p.stats().policy_allowed, 1);
    let counts: Vec<_> = p.policy_counts().collect();
    assert_eq!(counts.len(), 1);
    assert_eq!(
        (counts[0].0, counts[0].1.ingress_allowed),
        ("NetworkPolicy x/b", 1)
    );
}

#[test]
fn a_denied_connection_is_dropped_and_never_tracked() {
    let mut p = node_with(1, vec![], ingress_to_b("10.244.1.5/32", Some(80)));
    let (v, notes) = traced(&mut p, syn(1, 5, POD_B, 81), POD);
    assert_eq!(v, Verdict::Dropped(DropReason::PolicyDenied));
    assert_eq!(
        notes,
        [
            "egress from pod-a (peer 10.244.1.6): allowed: no policy applies",
            "ingress to pod-b (peer 10.244.1.5): denied: isolated by NetworkPolicy x/b, and no rule of theirs matched"
        ]
    );
    assert_eq!(p.conntrack().len(), 0);
    assert_eq!(p.drops().get(DropReason::PolicyDenied), 1);
    assert_eq!(p.policy_counts().next().unwrap().1.ingress_denied, 1);
    // An unsolicited "reply" from pod-b on that denied connection finds no connection:
    // pod-b's egress is open, so it starts one of its own, as any packet would.
    assert_eq!(
        run(&mut p, syn(1, 6, POD_A, 40000), POD2, SEC).0,
        Verdict::Forwarded
    );
}

#[test]
fn egress_is_decided_at_the_source_pod_for_every_protocol() {
    let mut p = node_with(1, vec![], no_egress_from_a());
    // To a pod of the other node, and a ping anywhere.
    let (v, notes) = traced(&mut p, syn(1, 5, "10.244.2.6", 80), POD);
    assert_eq!(v, Verdict::Dropped(DropReason::PolicyDenied));
    assert_eq!(
        notes,
        [
            "egress from pod-a (peer 10.244.2.6): denied: isolated by NetworkPolicy x/a, and no rule of theirs matched"
        ]
    );
    let ping = build::echo_request(ip(POD_A), ip("8.8.8.8"), 1, 1, &[0; 8], &from_pod(1, 5));
    assert_eq!(
        run(&mut p, ping, POD, SEC).0,
        Verdict::Dropped(DropReason::PolicyDenied)
    );
    // pod-b is not isolated.
    assert_eq!(
        run(&mut p, syn(1, 6, "10.244.2.6", 80), POD2, SEC).0,
        Verdict::Forwarded
    );
    assert_eq!(p.stats().policy_denied, 2);
}

#[test]
fn service_traffic_is_decided_on_the_endpoint_after_dnat() {
    let svc = ServiceSpec {
        name: "x/web:http".into(),
        proto: "tcp".into(),
        port: 80,
        cluster_ips: vec![ip("10.96.0.10")],
        backends: vec![be(POD_B, 8080, 1)],
        ..ServiceSpec::default()
    };
    // The policy allows the endpoint's port, 8080: the cluster IP's port 80 is not what
    // it is judged on.
    let mut p = node_with(
        1,
        vec![svc.clone()],
        ingress_to_b("10.244.1.5/32", Some(8080)),
    );
    let (v, notes) = traced(&mut p, syn(1, 5, "10.96.0.10", 80), POD);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(
        notes,
        [
            "egress from pod-a (peer 10.244.1.6): allowed: no policy applies",
            "ingress to pod-b (peer 10.244.1.5): allowed by NetworkPolicy x/b ingress[0]"
        ]
    );
    let mut p = node_with(1, vec![svc], ingress_to_b("10.244.1.5/32", Some(80)));
    assert_eq!(
        run(&mut p, syn(1, 5, "10.96.0.10", 80), POD, SEC).0,
        Verdict::Dropped(DropReason::PolicyDenied)
    );
    assert_eq!(
        p.conntrack().len(),
        0,
        "the denied Service connection is not kept"
    );
}

#[test]
fn ingress_is_decided_where_the_destination_pod_lives() {
    // Node 1 has no policy: its pod's SYN leaves through the tunnel. Node 2 isolates
    // its pod-b and allows only node 1's pod-b: the SYN from pod-a is denied there.
    let mut one = node_with(1, vec![], PolicySpec::default());
    let (v, out) = run(&mut one, syn(1, 5, "10.244.2.6", 80), POD, SEC);
    assert_eq!(v, Verdict::Forwarded);
    assert_eq!(out[0].0, UPLINK);
    let mut two = node_with(2, vec![], ingress_to_b("10.244.1.6/32", Some(80)));
    let (v, notes) = traced(&mut two, out[0].1.data.clone(), UPLINK);
    assert_eq!(v, Verdict::Dropped(DropReason::PolicyDenied));
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].starts_with("ingress to pod-b (peer 10.244.1.5): denied"),
        "{notes:?}"
    );
    // From node 1's pod-b it is allowed.
    let (_, out) = run(&mut one, syn(1, 6, "10.244.2.6", 80), POD2, SEC);
    assert_eq!(
        run(&mut two, out[0].1.data.clone(), UPLINK, SEC).0,
        Verdict::Forwarded
    );
}

#[test]
fn the_nodes_own_stack_reaches_its_pods_unless_told_otherwise() {
    let host_port = |p: &mut TablesSpec| {
        p.ports.push(PortSpec {
            name: "host".into(),
            kind: PortKind::Host,
            mac: MacAddr([2, 0xfe, 0, 0, 0, 0xfe]),
            addresses: vec![ip("169.254.1.1").into()],
            ..PortSpec::default()
        })
    };
    let probe = || {
        let o = IpOpts {
            src_mac: [2, 0xaa, 0, 0, 0, 1],
            dst_mac: [2, 0xfe, 0, 0, 0, 0xfe],
            ..IpOpts::default()
        };
        build::tcp(
            ip("192.168.50.10"),
            ip(POD_B),
            50000,
            8080,
            1,
            0,
            tcp_flags::SYN,
            &[],
            &o,
        )
    };
    for host_to_pods in [true, false] {
        let mut spec = node_spec(1, ModeSpec::Always, vec![]);
        host_port(&mut spec);
        spec.policy = ingress_to_b("10.244.1.5/32", Some(80));
        spec.policy.host_to_pods = host_to_pods;
        let mut p = Pipeline::new(Arc::new(spec.compile().unwrap()));
        let (v, notes) = traced(&mut p, probe(), 3);
        if host_to_pods {
            assert_eq!(v, Verdict::Forwarded);
            assert_eq!(
                notes,
                ["ingress to pod-b (peer 192.168.50.10): allowed from the node's own stack"]
            );
        } else {
            assert_eq!(v, Verdict::Dropped(DropReason::PolicyDenied));
        }
    }
}

#[test]
fn counters_follow_policies_by_name_across_a_swap() {
    let mut p = node_with(1, vec![], ingress_to_b("10.244.1.5/32", None));
    run(&mut p, syn(1, 5, POD_B, 80), POD, SEC);
    let mut spec = node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")]);
    let mut policy = no_egress_from_a();
    policy.policies.push("NetworkPolicy x/b".into());
    policy.pods.push(PodPolicySpec {
        port: "pod-b".into(),
        ingress: DirectionSpec {
            isolated_by: vec![1],
            ..DirectionSpec::default()
        },
        egress: DirectionSpec::default(),
    });
    spec.policy = policy;
    p.set_tables(Arc::new(spec.compile().unwrap()));
    let counts: Vec<_> = p.policy_counts().map(|(n, c)| (n.to_string(), c)).collect();
    assert_eq!(counts[0].0, "NetworkPolicy x/a");
    assert_eq!(counts[0].1.ingress_denied, 0);
    assert_eq!(counts[1].0, "NetworkPolicy x/b");
    assert_eq!(counts[1].1.ingress_denied, 1);
}

/// Node 1's tables with `policy`, no peers.
pub(super) fn tables_with(policy: PolicySpec) -> Arc<Tables> {
    let mut spec = node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")]);
    spec.policy = policy;
    Arc::new(spec.compile().unwrap())
}

#[test]
fn a_policy_change_keeps_tracked_connections_unless_told_to_reevaluate() {
    for reevaluate in [false, true] {
        // Allowed from pod-a on 80 at first; then nothing is allowed to pod-b.
        let mut p = node_with(1, vec![], ingress_to_b("10.244.1.5/32", Some(80)));
        assert_eq!(
            run(&mut p, syn(1, 5, POD_B, 80), POD, SEC).0,
            Verdict::Forwarded
        );
        assert_eq!(p.conntrack().len(), 1);
        let mut stricter = ingress_to_b("10.244.1.5/32", None);
        stricter.reevaluate = reevaluate;
        let new = tables_with(stricter);
        // The preview names the connection either way, with the denial.
        let cuts = p.policy_cuts(&new);
        assert_eq!(cuts.len(), 1);
        assert_eq!(cuts[0].original.dst_port, 80);
        assert!(
            cuts[0]
                .denial
                .to_string()
                .starts_with("ingress to pod-b (peer 10.244.1.5): denied"),
            "{}",
            cuts[0].denial
        );
        let report = p.set_tables(new);
        assert_eq!(report.policy_cut, usize::from(reevaluate));
        assert_eq!(p.conntrack().len(), usize::from(!reevaluate));
    }
}

#[test]
fn reevaluation_judges_the_translated_connection_and_spares_the_nodes_own() {
    let svc = ServiceSpec {
        name: "x/web:http".into(),
        proto: "tcp".into(),
        port: 80,
        cluster_ips: vec![ip("10.96.0.10")],
        backends: vec![be(POD_B, 8080, 1)],
        ..ServiceSpec::default()
    };
    let mut spec = node_spec(1, ModeSpec::Always, vec![]);
    spec.ports.push(PortSpec {
        name: "host".into(),
        kind: PortKind::Host,
        mac: MacAddr([2, 0xfe, 0, 0, 0, 0xfe]),
        addresses: vec![ip("169.254.1.1").into()],
        ..PortSpec::default()
    });
    spec.services = vec![svc];
    let mut p = Pipeline::new(Arc::new(spec.clone().compile().unwrap()));
    // Through the cluster IP from pod-a, and a probe from the node's stack.
    assert_eq!(
        run(&mut p, syn(1, 5, "10.96.0.10", 80), POD, SEC).0,
        Verdict::Forwarded
    );
    let o = IpOpts {
        src_mac: [2, 0xaa, 0, 0, 0, 1],
        dst_mac: [2, 0xfe, 0, 0, 0, 0xfe],
        ..IpOpts::default()
    };
    let probe = build::tcp(
        ip("192.168.50.10"),
        ip(POD_B),
        50000,
        8080,
        1,
        0,
        tcp_flags::SYN,
        &[],
        &o,
    );
    assert_eq!(run(&mut p, probe, 3, SEC).0, Verdict::Forwarded);
    assert_eq!(p.conntrack().len(), 2);
    // Only 8080 from pod-a: the Service connection (80 to the cluster IP, 8080 to the
    // endpoint) stays; the node's probe stays too (from the host).
    spec.policy = ingress_to_b("10.244.1.5/32", Some(8080));
    spec.policy.reevaluate = true;
    let report = p.set_tables(Arc::new(spec.clone().compile().unwrap()));
    assert_eq!(report.policy_cut, 0);
    // Only 80: the Service connection goes, the probe stays.
    spec.policy = ingress_to_b("10.244.1.5/32", Some(80));
    spec.policy.reevaluate = true;
    let report = p.set_tables(Arc::new(spec.compile().unwrap()));
    assert_eq!(report.policy_cut, 1);
    assert_eq!(p.conntrack().len(), 1);
}
