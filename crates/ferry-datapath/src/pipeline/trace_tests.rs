//! Dry runs: what a trace reports, and that the live pipeline never sees it.

use super::test_support::*;
use super::*;
use crate::describe::Described;

const GW: &str = "192.168.50.1";

fn described(p: &Pipeline, s: &str, port: PortId) -> Vec<u8> {
    Described::parse(s)
        .unwrap()
        .frame(p.tables(), port)
        .unwrap()
}

fn stage<'a>(pass: &'a TracePass, name: &str) -> &'a str {
    &pass
        .stages
        .iter()
        .find(|s| s.stage == name)
        .unwrap_or_else(|| panic!("no {name} stage in {:#?}", pass.stages))
        .detail
}

/// Everything of a pipeline that a trace must leave alone.
fn snapshot(p: &Pipeline) -> String {
    let mut neigh: Vec<String> = p
        .neighbours()
        .iter()
        .map(|(port, a, n)| format!("{port} {a} {n:?}"))
        .collect();
    neigh.sort();
    let entries: Vec<String> = p
        .conntrack()
        .dump(&crate::conntrack::Filter::default())
        .map(|(id, e)| format!("{id} {e:?}"))
        .collect();
    format!(
        "{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{}\n{} {} {}\n{neigh:?}\n{entries:?}",
        p.stats(),
        p.drops().nonzero().collect::<Vec<_>>(),
        p.port_stats(),
        p.conntrack().stats(),
        p.reassembler().stats(),
        p.neighbours().stats(),
        p.conntrack().len(),
        p.reassembler().held_datagrams(),
        p.affinity().len(),
        p.affinity().refused(),
    )
}

/// The case of `test_node_port_to_another_nodes_endpoint_returns_through_the_ingress_node`
/// as `ferry trace` shows it on node 1.
#[test]
fn test_node_port_to_a_remote_endpoint_shows_the_tunnel_both_ways() {
    let a = node(
        1,
        ModeSpec::CrossSubnet,
        vec![web(vec![be("10.244.2.5", 8080, 2)])],
    );
    let syn = described(
        &a,
        "tcp 192.168.60.7:50000 -> 192.168.50.10:30080 syn seq 100",
        UPLINK,
    );
    let r = trace(&a, vec![(UPLINK, syn)], SEC, true);
    assert_eq!(r.passes.len(), 2, "{r:#?}");

    let fwd = &r.passes[0];
    assert_eq!(
        (fwd.label.as_str(), fwd.in_port.as_str()),
        ("packet 1", "eth0")
    );
    assert!(
        fwd.summary
            .contains("192.168.60.7:50000 -> 192.168.50.10:30080")
    );
    assert!(fwd.summary.contains("syn seq 100"), "{}", fwd.summary);
    assert_eq!(fwd.verdict, "forwarded");
    assert_eq!(fwd.ct.as_deref(), Some("new"));
    let svc = stage(fwd, "service");
    assert!(
        svc.contains("default/web:http") && svc.contains("10.244.2.5:8080 on node node2"),
        "{svc}"
    );
    let encap = stage(fwd, "encap");
    assert!(
        encap.contains("node node2") && encap.contains("-> 192.168.50.20"),
        "{encap}"
    );
    for s in ["parse", "ct", "route", "mtu", "l2", "commit", "egress"] {
        stage(fwd, s);
    }
    assert_eq!(fwd.out.len(), 1);
    assert_eq!(fwd.out[0].port, "eth0");
    let out = &fwd.out[0].summary;
    assert!(
        out.starts_with("vxlan vni 4096 192.168.50.10 -> 192.168.50.20: ")
            && out.contains("192.168.60.7:50000 -> 10.244.2.5:8080"),
        "{out}"
    );

    let back = &r.passes[1];
    assert_eq!(
        (back.label.as_str(), back.in_port.as_str()),
        ("reply", "eth0")
    );
    assert!(
        back.summary
            .starts_with("vxlan vni 4096 192.168.50.20 -> 192.168.50.10: ")
            && back
                .summary
                .contains("10.244.2.5:8080 -> 192.168.60.7:50000")
            && back.summary.contains("syn+ack seq 7000 ack 101"),
        "{}",
        back.summary
    );
    assert!(stage(back, "decap").contains("from node 192.168.50.20"));
    assert_eq!(back.ct.as_deref(), Some("reply"));
    assert!(
        stage(back, "ct")
            .contains("translated to zone 0 tcp 192.168.50.10:30080 -> 192.168.60.7:50000"),
        "{:#?}",
        back.stages
    );
    assert_eq!(back.verdict, "forwarded", "{:#?}", back.stages);
    assert_eq!(back.out.len(), 1);
    assert_eq!(back.out[0].port, "eth0");
    assert!(
        back.out[0]
            .summary
            .contains("192.168.50.10:30080 -> 192.168.60.7:50000"),
        "{}",
        back.out[0].summary
    );
    assert!(stage(back, "l2").contains("gateway 192.168.50.1"));

    let rev = r.reverse.as_deref().unwrap();
    assert!(
        rev.contains("replies from 10.244.2.5:8080 to 192.168.60.7:50000")
            && rev.contains("through the tunnel from node node2 (192.168.50.20)")
            && rev.contains("translated back to 192.168.50.10:30080 -> 192.168.60.7:50000")
            && rev.contains("destination NAT of 192.168.50.10:30080 to 10.244.2.5:8080"),
        "{rev}"
    );
}

#[test]
fn test_the_report_crosses_json_with_the_agreed_field_names() {
    let a = node(1, ModeSpec::Always, vec![]);
    let f = described(&a, "udp 10.244.1.5:5000 -> 10.244.2.6:53", POD);
    let r = trace(&a, vec![(POD, f)], SEC, true);
    let v: serde_json::Value = serde_json::to_value(&r).unwrap();
    let pass = &v["passes"][0];
    for k in [
        "label", "in_port", "summary", "stages", "verdict", "ct", "out",
    ] {
        assert!(pass.get(k).is_some(), "no {k} in {pass}");
    }
    assert!(pass["stages"][0].get("stage").is_some() && pass["stages"][0].get("detail").is_some());
    // Each stage carries its event's fields too, tagged by kind.
    let ct = pass["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == "ct")
        .unwrap();
    assert_eq!(ct["event"]["kind"], "ct", "{ct}");
    assert_eq!(ct["event"]["state"], "new", "{ct}");
    assert_eq!(ct["event"]["reply"], false, "{ct}");
    assert_eq!(ct["event"]["key"]["dst"], "10.244.2.6", "{ct}");
    assert_eq!(ct["event"]["key"]["dst_port"], 53, "{ct}");
    assert!(pass["out"][0].get("port").is_some() && pass["out"][0].get("summary").is_some());
    assert!(v.get("reverse").is_some());
    let back: TraceReport = serde_json::from_value(v).unwrap();
    assert_eq!(back, r);
    // A report from an agent whose stages have no fields still reads.
    let old: TraceStage = serde_json::from_str(r#"{"stage":"ct","detail":"new"}"#).unwrap();
    assert_eq!(old.event, None);
    // Pod to a pod of another node: the reply comes back through the tunnel.
    assert_eq!(r.passes.len(), 2);
    assert_eq!(r.passes[1].ct.as_deref(), Some("reply"));
    assert_eq!(r.passes[1].out[0].port, "pod-a");
    let rev = r.reverse.unwrap();
    assert!(rev.contains("from node node2 (192.168.50.20)"), "{rev}");
    assert!(rev.contains("no translation"), "{rev}");
}

#[test]
fn test_a_trace_leaves_the_live_pipeline_untouched() {
    let mut a = node(
        1,
        ModeSpec::Always,
        vec![web(vec![
            be("10.244.1.6", 8080, 1),
            be("10.244.2.5", 8080, 2),
        ])],
    );
    // Some live state: a connection, a held fragment, a drop.
    let syn = described(&a, "tcp 10.244.1.5:40000 -> 10.96.0.10:80 syn", POD);
    assert_eq!(run(&mut a, syn.clone(), POD, SEC).0, Verdict::Forwarded);
    let spoofed = described(&a, "udp 10.244.1.99:1 -> 10.244.1.6:2", POD);
    run(&mut a, spoofed, POD, SEC);
    let before = snapshot(&a);

    let frames = vec![
        (POD, syn),
        (
            POD,
            described(&a, "tcp 10.244.1.5:40001 -> 10.96.0.10:80 syn", POD),
        ),
        (
            UPLINK,
            described(&a, "udp 192.168.60.7:1 -> 10.244.1.5:2", UPLINK),
        ),
        (POD, described(&a, "udp 10.244.1.99:1 -> 10.244.1.6:2", POD)),
        (
            UPLINK,
            described(&a, "udp 192.168.60.7:1 -> 10.244.1.5:2 ttl 1", UPLINK),
        ),
    ];
    let r = trace(&a, frames, 2 * SEC, true);
    assert_eq!(r.passes.len(), 5, "a dropped last packet gets no reply");
    assert_eq!(r.passes[4].verdict, "dropped: ttl_exceeded");
    assert_eq!(
        r.passes[4].out.len(),
        1,
        "the ICMP error, in the report only"
    );
    assert_eq!(snapshot(&a), before);
}

#[test]
fn test_an_established_live_connection_is_followed_with_its_nat() {
    let mut a = node(
        1,
        ModeSpec::Always,
        vec![web(vec![be("10.244.1.6", 8080, 1)])],
    );
    let syn = described(
        &a,
        "tcp 10.244.1.5:40000 -> 10.96.0.10:80 syn seq 1000",
        POD,
    );
    assert_eq!(run(&mut a, syn, POD, SEC).0, Verdict::Forwarded);
    let synack = described(
        &a,
        "tcp 10.244.1.6:8080 -> 10.244.1.5:40000 syn+ack seq 7000 ack 1001",
        POD2,
    );
    assert_eq!(run(&mut a, synack, POD2, SEC).0, Verdict::Forwarded);
    let ack = "tcp 10.244.1.5:40000 -> 10.96.0.10:80 ack seq 1001 ack 7001";
    let f = described(&a, ack, POD);
    assert_eq!(run(&mut a, f, POD, SEC).0, Verdict::Forwarded);
    let balanced = a.stats().service_balanced;

    let r = trace(&a, vec![(POD, described(&a, ack, POD))], 2 * SEC, true);
    let p = &r.passes[0];
    assert_eq!(p.ct.as_deref(), Some("established"), "{p:#?}");
    assert!(
        stage(p, "ct").contains("translated to zone 0 tcp 10.244.1.5:40000 -> 10.244.1.6:8080"),
        "{:#?}",
        p.stages
    );
    assert!(
        p.stages.iter().all(|s| s.stage != "service"),
        "a known connection is not balanced again"
    );
    assert_eq!(p.verdict, "forwarded");
    assert_eq!(p.out[0].port, "pod-b");

    let back = &r.passes[1];
    assert_eq!(back.in_port, "pod-b");
    assert!(
        back.summary.contains("ack seq 7001 ack 1001"),
        "{}",
        back.summary
    );
    assert_eq!(back.ct.as_deref(), Some("reply"));
    assert_eq!(back.verdict, "forwarded", "{:#?}", back.stages);
    assert!(
        back.out[0]
            .summary
            .contains("10.96.0.10:80 -> 10.244.1.5:40000"),
        "{}",
        back.out[0].summary
    );
    let rev = r.reverse.unwrap();
    assert!(
        rev.contains("arrive on pod-b")
            && rev.contains("translated back to 10.96.0.10:80 -> 10.244.1.5:40000"),
        "{rev}"
    );
    assert_eq!(a.stats().service_balanced, balanced);
}

#[test]
fn test_drops_are_reported_with_their_reason() {
    let a = node(1, ModeSpec::Always, vec![web(vec![])]);
    let spoofed = described(&a, "udp 10.244.1.99:1 -> 10.244.2.5:2", POD);
    let r = trace(&a, vec![(POD, spoofed)], SEC, true);
    assert_eq!(r.passes.len(), 1);
    assert_eq!(r.passes[0].verdict, "dropped: source_spoofed");
    assert_eq!(stage(&r.passes[0], "drop"), "source_spoofed");
    assert_eq!(
        (r.passes[0].ct.as_deref(), r.reverse.as_deref()),
        (None, None)
    );

    let syn = described(&a, "tcp 10.244.1.5:40000 -> 10.96.0.10:80", POD);
    let r = trace(&a, vec![(POD, syn)], SEC, true);
    let p = &r.passes[0];
    assert_eq!(p.verdict, "dropped: service_no_endpoints");
    assert!(stage(p, "service").contains("no endpoint"));
    assert_eq!(p.out.len(), 1, "the reset sent back");
    assert_eq!(p.out[0].port, "pod-a");
    assert!(p.out[0].summary.contains("rst+ack"), "{}", p.out[0].summary);
    assert_eq!(r.passes.len(), 1);
    assert!(r.reverse.is_none());
}

#[test]
fn test_two_fragments_reassemble_in_the_second_pass() {
    let a = node(1, ModeSpec::Always, vec![]);
    let whole = Described::parse("udp 192.168.60.7:4000 -> 10.244.1.5:53 len 2000")
        .unwrap()
        .frame(a.tables(), UPLINK)
        .unwrap();
    let parsed = parse(&whole, 0).unwrap();
    let mut frags = Vec::new();
    ipf::refragment(&Packet::new(whole, UPLINK, 0), &parsed, 1500, &mut frags).unwrap();
    assert_eq!(frags.len(), 2);
    let frames = frags.into_iter().map(|f| (UPLINK, f.data)).collect();
    let r = trace(&a, frames, SEC, false);
    assert_eq!(r.passes[0].verdict, "held");
    assert!(
        r.passes[0].summary.contains("fragment id"),
        "{}",
        r.passes[0].summary
    );
    assert!(stage(&r.passes[0], "ipf").contains("held"));
    let second = &r.passes[1];
    assert!(
        stage(second, "ipf").contains("reassembled 2028 bytes"),
        "{:#?}",
        second.stages
    );
    assert_eq!(second.verdict, "forwarded");
    assert_eq!(second.ct.as_deref(), Some("new"));
    assert!(stage(second, "mtu").contains("to be cut to fit"));
    assert_eq!(second.out.len(), 2, "refragmented for the pod's MTU");
    assert_eq!(a.reassembler().held_datagrams(), 0);
    assert!(
        r.reverse
            .unwrap()
            .contains("replies from 10.244.1.5:53 to 192.168.60.7:4000")
    );
}

#[test]
fn test_a_static_nat_rule_is_named_and_undone_on_the_way_back() {
    use crate::nat::{MatchSpec, NatRuleSpec};
    let mut spec = node_spec(1, ModeSpec::Always, vec![peer(2, "192.168.50.20")]);
    spec.nat.push(NatRuleSpec {
        matches: MatchSpec {
            in_port: Some("pod-a".into()),
            dst: Some("192.168.60.0/24".parse().unwrap()),
            ..MatchSpec::default()
        },
        dnat: None,
        snat: None,
        masquerade: true,
    });
    let mut a = Pipeline::new(Arc::new(spec.compile().unwrap()));
    learn(&mut a, 1, GW, GW_MAC);
    let f = described(&a, "udp 10.244.1.5:5000 -> 192.168.60.7:53", POD);
    let r = trace(&a, vec![(POD, f)], SEC, true);
    let p = &r.passes[0];
    assert_eq!(stage(p, "nat"), "static rule: source to 192.168.50.10");
    assert!(stage(p, "l2").contains("gateway 192.168.50.1"));
    let back = &r.passes[1];
    assert_eq!(back.in_port, "eth0");
    assert_eq!(back.ct.as_deref(), Some("reply"));
    assert_eq!(back.out[0].port, "pod-a");
    let rev = r.reverse.unwrap();
    assert!(
        rev.contains("arrive on eth0")
            && rev.contains("source NAT of 10.244.1.5:5000 to 192.168.50.10:5000"),
        "{rev}"
    );
}

/// On the endpoint's node, a connection another node tunnelled here is sent back to it.
#[test]
fn test_the_endpoint_node_sends_replies_back_to_the_ingress_node() {
    let svc = || web(vec![be("10.244.2.5", 8080, 2)]);
    let mut a = node(1, ModeSpec::Always, vec![svc()]);
    let b = node(2, ModeSpec::Always, vec![svc()]);
    let syn = described(
        &a,
        "tcp 192.168.60.7:50000 -> 192.168.50.10:30080 syn",
        UPLINK,
    );
    let (_, out) = run(&mut a, syn, UPLINK, SEC);
    let r = trace(&b, vec![(UPLINK, out[0].1.data.clone())], SEC, true);
    let fwd = &r.passes[0];
    assert!(stage(fwd, "decap").contains("from node 192.168.50.10"));
    assert_eq!(fwd.out[0].port, "pod-a");
    let back = &r.passes[1];
    assert_eq!(back.in_port, "pod-a");
    assert!(stage(back, "encap").contains("to node node1"));
    let rev = r.reverse.unwrap();
    assert!(
        rev.contains("sent back through the tunnel to node node1 (192.168.50.10)")
            && rev.contains("no translation"),
        "{rev}"
    );
}

#[test]
fn test_a_packet_to_an_unresolved_next_hop_is_reported_queued() {
    let (a, _) = nodes();
    let before = snapshot(&a);
    let f = described(&a, "udp 10.244.1.5:1000 -> 8.8.8.8:53", POD);
    let r = trace(&a, vec![(POD, f.clone()), (POD, f)], SEC, true);
    assert_eq!(r.passes.len(), 2, "no reply pass: nothing left");
    let first = &r.passes[0];
    assert_eq!(
        first.verdict,
        "queued: next hop 192.168.50.1 on eth0 unresolved, an ARP request would be sent"
    );
    assert_eq!(
        stage(first, "neigh"),
        "queued: next hop 192.168.50.1 unresolved on eth0 (an ARP request would be sent); \
         1 waiting for it",
        "a dry run sends nothing"
    );
    assert_eq!(first.out.len(), 1);
    assert_eq!(
        first.out[0].summary,
        "arp who-has 192.168.50.1 tell 192.168.50.10"
    );
    assert_eq!(
        r.passes[1].verdict,
        "queued: next hop 192.168.50.1 on eth0 unresolved, already asked"
    );
    assert!(r.passes[1].out.is_empty());

    let f = described(&a, "udp [fd00:10:244:1::5]:1000 -> [2001:db8::1]:53", POD);
    let r = trace(&a, vec![(POD, f)], SEC, true);
    assert_eq!(
        r.passes[0].verdict,
        "queued: next hop fd00:50::1 on eth0 unresolved, a neighbour solicitation would be sent"
    );
    assert_eq!(snapshot(&a), before, "the live pipeline queued nothing");
}
