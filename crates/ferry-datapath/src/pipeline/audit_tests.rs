//! The audit of denials: what a denial records, that nothing else does, and the bounds.

use super::policy_tests::{
    POD_A, POD_B, block, ingress_to_b, no_egress_from_a, node_with, syn, tables_with,
};
use super::test_support::*;
use super::*;
use crate::policy::{
    ActionSpec, DecidedBy, Direction, DirectionSpec, MatchSpec, PodPolicySpec, PolicySpec,
    RuleSpec, Tier,
};

fn taken(p: &mut Pipeline) -> Vec<Denial> {
    let mut out = Vec::new();
    p.take_denials(usize::MAX, &mut out);
    out
}

fn key(src: &str, sport: u16, dst: &str, dport: u16) -> FlowKey {
    FlowKey {
        src: ip(src).into(),
        dst: ip(dst).into(),
        zone: 0,
        proto: proto::TCP,
        src_port: sport,
        dst_port: dport,
    }
}

#[test]
fn nothing_is_recorded_while_the_audit_is_off() {
    let mut p = node_with(1, vec![], ingress_to_b("10.244.1.5/32", Some(80)));
    assert!(!p.audits_denials());
    assert_eq!(
        run(&mut p, syn(1, 5, POD_B, 81), POD, SEC).0,
        Verdict::Dropped(DropReason::PolicyDenied)
    );
    assert!(taken(&mut p).is_empty());
    assert_eq!(p.stats().audit_overflow, 0);
    // Turned on, then off again: what was recorded goes, nothing more comes.
    p.audit_denials(8);
    run(&mut p, syn(1, 5, POD_B, 81), POD, SEC);
    p.audit_denials(0);
    run(&mut p, syn(1, 5, POD_B, 81), POD, SEC);
    assert!(taken(&mut p).is_empty());
}

#[test]
fn a_denied_syn_is_recorded_with_its_ports_key_and_the_isolating_policy() {
    let mut p = node_with(1, vec![], ingress_to_b("10.244.1.5/32", Some(80)));
    p.audit_denials(8);
    assert!(p.audits_denials());
    run(&mut p, syn(1, 5, POD_B, 81), POD, SEC);
    // The retransmitted SYN is decided again (never tracked), and recorded again.
    run(&mut p, syn(1, 5, POD_B, 81), POD, 2 * SEC);
    let d = taken(&mut p);
    assert_eq!(d.len(), 2, "{d:?}");
    assert_eq!(d[0].time_ns, SEC);
    assert_eq!(d[1].time_ns, 2 * SEC);
    assert_eq!(d[0].in_port, POD);
    assert_eq!(d[0].in_port_name(), "pod-a");
    assert_eq!(d[0].direction, Direction::Ingress);
    assert_eq!(d[0].port, POD2);
    assert_eq!(d[0].port_name(), "pod-b");
    assert_eq!(d[0].key, key(POD_A, 40000, POD_B, 81));
    assert_eq!(d[0].original, d[0].key, "nothing translated");
    assert_eq!(d[0].by, DecidedBy::Isolated);
    assert_eq!(
        d[0].denied_by(),
        DeniedBy::Isolated(vec!["NetworkPolicy x/b"])
    );
    assert!(taken(&mut p).is_empty(), "taken once");
}

#[test]
fn an_allowed_connection_and_its_packets_record_nothing() {
    let mut p = node_with(1, vec![], ingress_to_b("10.244.1.5/32", Some(80)));
    p.audit_denials(8);
    assert_eq!(
        run(&mut p, syn(1, 5, POD_B, 80), POD, SEC).0,
        Verdict::Forwarded
    );
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
    assert_eq!(run(&mut p, synack, POD2, SEC).0, Verdict::Forwarded);
    // A pod no policy applies to: allowed by default.
    assert_eq!(
        run(&mut p, syn(1, 6, POD_A, 80), POD2, SEC).0,
        Verdict::Forwarded
    );
    assert!(taken(&mut p).is_empty());
}

/// ClusterNetworkPolicy `deny-to-b` (Admin tier): its rule `from-a` denies pod-b's
/// ingress from pod-a.
fn admin_deny_to_b() -> PolicySpec {
    PolicySpec {
        policies: vec!["ClusterNetworkPolicy deny-to-b".into()],
        sets: vec![block("10.244.1.5/32")],
        rules: vec![RuleSpec {
            name: "ingress rule from-a".into(),
            policy: 0,
            action: ActionSpec::Deny,
            matches: vec![MatchSpec {
                peers: Some(vec![0]),
                ports: vec![],
            }],
        }],
        pods: vec![PodPolicySpec {
            port: "pod-b".into(),
            ingress: DirectionSpec {
                admin: vec![0],
                ..DirectionSpec::default()
            },
            egress: DirectionSpec::default(),
        }],
        ..PolicySpec::default()
    }
}

#[test]
fn a_denial_by_a_rule_names_it_and_a_service_connection_keeps_its_original_destination() {
    let svc = ServiceSpec {
        name: "x/web:http".into(),
        proto: "tcp".into(),
        port: 80,
        cluster_ips: vec![ip("10.96.0.10")],
        backends: vec![be(POD_B, 8080, 1)],
        ..ServiceSpec::default()
    };
    let mut p = node_with(1, vec![svc], admin_deny_to_b());
    p.audit_denials(8);
    assert_eq!(
        run(&mut p, syn(1, 5, "10.96.0.10", 80), POD, SEC).0,
        Verdict::Dropped(DropReason::PolicyDenied)
    );
    let d = taken(&mut p);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(
        d[0].key,
        key(POD_A, 40000, POD_B, 8080),
        "decided after DNAT"
    );
    assert_eq!(d[0].original, key(POD_A, 40000, "10.96.0.10", 80));
    assert_eq!(
        d[0].denied_by(),
        DeniedBy::Rule {
            tier: Tier::Admin,
            policy: "ClusterNetworkPolicy deny-to-b",
            rule: "ingress rule from-a",
        }
    );
}

#[test]
fn an_egress_denial_is_recorded_for_the_source_pod() {
    let mut p = node_with(1, vec![], no_egress_from_a());
    p.audit_denials(8);
    run(&mut p, syn(1, 5, "10.244.2.6", 443), POD, SEC);
    let d = taken(&mut p);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].direction, Direction::Egress);
    assert_eq!(d[0].port_name(), "pod-a");
    assert_eq!(d[0].key, key(POD_A, 40000, "10.244.2.6", 443));
    assert_eq!(
        d[0].denied_by(),
        DeniedBy::Isolated(vec!["NetworkPolicy x/a"])
    );
}

#[test]
fn a_full_buffer_counts_what_it_cannot_hold_and_a_take_makes_room() {
    let mut p = node_with(1, vec![], ingress_to_b("10.244.1.5/32", None));
    p.audit_denials(2);
    for t in 1..=3 {
        run(&mut p, syn(1, 5, POD_B, 80), POD, t * SEC);
    }
    assert_eq!(p.stats().audit_overflow, 1);
    let mut out = Vec::new();
    p.take_denials(1, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].time_ns, SEC, "oldest first");
    run(&mut p, syn(1, 5, POD_B, 80), POD, 4 * SEC);
    assert_eq!(p.stats().audit_overflow, 1, "room for one more");
    p.take_denials(usize::MAX, &mut out);
    let times: Vec<u64> = out.iter().map(|d| d.time_ns / SEC).collect();
    assert_eq!(times, [1, 2, 4]);
}

#[test]
fn names_resolve_against_the_tables_that_decided() {
    let mut p = node_with(1, vec![], ingress_to_b("10.244.1.5/32", None));
    p.audit_denials(8);
    run(&mut p, syn(1, 5, POD_B, 80), POD, SEC);
    // Other policies by the time the record is taken.
    p.set_tables(tables_with(no_egress_from_a()));
    let d = taken(&mut p);
    assert_eq!(d[0].port_name(), "pod-b");
    assert_eq!(
        d[0].denied_by(),
        DeniedBy::Isolated(vec!["NetworkPolicy x/b"])
    );
    assert!(p.audits_denials(), "the audit survives a swap");
}
