//! The example in docs/tables.md is a valid tables file: the documentation cannot drift
//! from the format.

use ferry_datapath::{NextHop, PortKind, TablesSpec, Target};

#[test]
fn docs_tables_example_compiles() {
    let doc = include_str!("../../../docs/tables.md");
    let start = doc.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let end = start + doc[start..].find("```").expect("the block ends");
    let spec: TablesSpec = serde_saphyr::from_str(&doc[start..end]).expect("the example parses");
    let t = spec.compile().expect("the example compiles");
    let pod_a = &t.ports[usize::from(t.port_id("pod-a").unwrap())];
    assert_eq!((pod_a.kind, pod_a.mtu), (PortKind::Pod, 1450));
    assert_eq!(t.ports[usize::from(t.port_id("pod-b").unwrap())].mtu, 1400);
    let target = |a: &str| *t.fib.lookup(a.parse().unwrap()).unwrap();
    let route = |a: &str| target(a).route().unwrap();
    // cross-subnet: node2 shares the uplink's subnet, node3 does not.
    assert!(matches!(route("10.244.2.1").next_hop, NextHop::Via(_)));
    assert_eq!(route("10.244.3.1").next_hop, NextHop::Tunnel(1));
    assert_eq!(route("192.168.70.9").next_hop, NextHop::Direct);
    // This node's pod CIDRs: the pods, and nothing else.
    assert_eq!(route("10.244.1.5").port, t.port_id("pod-a").unwrap());
    assert_eq!(target("10.244.1.77"), Target::NoSuchPod);
    assert_eq!(target("fd00:10:244:1::77"), Target::NoSuchPod);
}

#[test]
fn unknown_keys_are_refused() {
    let yaml = "ports:\n  - { name: a, mac: \"02:00:00:00:00:01\", knd: pod }\n";
    assert!(serde_saphyr::from_str::<TablesSpec>(yaml).is_err());
}
