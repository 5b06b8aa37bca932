use std::net::IpAddr;
use std::sync::Arc;

use ferry_datapath::{
    BackendSpec, MacAddr, ModeSpec, OverlaySpec, PortAddr, PortKind, PortSpec, RouteSpec,
    ServiceSpec, TablesSpec, Target, TrafficPolicy,
};

use super::*;
use crate::datastore::file::parse;

fn cluster(yaml: &str) -> Cluster {
    parse("test.yaml", yaml)
        .unwrap_or_else(|e| panic!("test manifests are good:\n{e}"))
        .0
}

fn every_pod(c: &Cluster) -> Vec<AttachedPod> {
    c.pods
        .keys()
        .map(|k| AttachedPod::new(&k.namespace, &k.name))
        .collect()
}

/// Compiles with every pod attached; checks the tables compile, also after a trip
/// through YAML (what `ferry tables` prints must load back).
fn compile_with(
    c: &Cluster,
    node: &str,
    base: Option<&TablesSpec>,
    opts: &CompileOptions,
) -> Compiled {
    let out = node_tables(c, node, base, &every_pod(c), opts).unwrap_or_else(|e| panic!("{e}"));
    out.tables.compile().expect("the tables compile");
    let yaml = serde_saphyr::to_string(&out.tables).unwrap();
    let back: TablesSpec = serde_saphyr::from_str(&yaml).expect("printed tables parse");
    back.compile().expect("printed tables compile");
    out
}

fn compile(c: &Cluster, node: &str) -> Compiled {
    compile_with(c, node, None, &CompileOptions::default())
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A Node as the API prints it.
fn node(
    name: &str,
    addresses: &[(&str, &str)],
    cidrs: &[&str],
    annotations: &[(&str, &str)],
) -> String {
    let mut s = format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  uid: 5d1c9a3e-6f0b-4c52-9a7e-{:012}\n  resourceVersion: \"48211\"\n  labels:\n    kubernetes.io/hostname: {name}\n",
        name.len()
    );
    if !annotations.is_empty() {
        s += "  annotations:\n";
        for (k, v) in annotations {
            s += &format!("    {k}: \"{v}\"\n");
        }
    }
    s += "spec:\n";
    if let Some(first) = cidrs.first() {
        s += &format!("  podCIDR: {first}\n  podCIDRs:\n");
        for c in cidrs {
            s += &format!("  - \"{c}\"\n");
        }
    }
    s += "status:\n  addresses:\n";
    for (t, a) in addresses {
        s += &format!("  - address: \"{a}\"\n    type: {t}\n");
    }
    s += &format!("  - address: {name}\n    type: Hostname\n---\n");
    s
}

/// A running Pod on `node` as the API prints it; `extra` goes under spec.
fn pod(ns: &str, name: &str, node: &str, ips: &[&str], phase: &str, extra: &str) -> String {
    let mut s = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  uid: 3f6a0c2e-8b1d-4e7f-9a2c-5d0e1f2a3b41\n  labels: {{app: web}}\nspec:\n  containers:\n  - name: app\n    image: nginx:1.27\n    resources: {{requests: {{cpu: 100m}}}}\n  nodeName: {node}\n{extra}status:\n  phase: {phase}\n  hostIP: 192.168.10.2\n"
    );
    if let Some(first) = ips.first() {
        s += &format!("  podIP: \"{first}\"\n  podIPs:\n");
        for a in ips {
            s += &format!("  - ip: \"{a}\"\n");
        }
    }
    s += "---\n";
    s
}

fn two_nodes() -> String {
    node(
        "node-a",
        &[("InternalIP", "192.168.10.2")],
        &["10.244.1.0/24", "fd00:10:244:1::/64"],
        &[
            ("ferry.io/ipv4-address", "192.168.10.2/24"),
            ("ferry.io/ipv4-gateway", "192.168.10.1"),
        ],
    ) + &node(
        "node-b",
        &[("InternalIP", "192.168.20.2")],
        &["10.244.2.0/24", "fd00:10:244:2::/64"],
        &[
            ("ferry.io/ipv4-address", "192.168.20.2/24"),
            ("ferry.io/ipv4-gateway", "192.168.20.1"),
        ],
    )
}

fn one_node() -> String {
    node(
        "node-a",
        &[("InternalIP", "192.168.10.2")],
        &["10.244.1.0/24"],
        &[],
    )
}

// ---- the node ----

#[test]
fn a_missing_node_is_an_error() {
    let c = cluster(&one_node());
    let e = node_tables(&c, "node-z", None, &[], &CompileOptions::default()).unwrap_err();
    assert_eq!(e, "no Node named \"node-z\" in the cluster");
}

#[test]
fn node_addresses_are_internal_ips_then_external_ips() {
    let c = cluster(&node(
        "node-a",
        &[
            ("ExternalIP", "203.0.113.5"),
            ("InternalIP", "192.168.10.2"),
            ("InternalIP", "fd00:50::2"),
        ],
        &[],
        &[],
    ));
    let t = compile(&c, "node-a").tables;
    assert_eq!(t.node.name, "node-a");
    assert_eq!(
        t.node.addresses,
        [ip("192.168.10.2"), ip("fd00:50::2"), ip("203.0.113.5")]
    );
}

#[test]
fn base_node_addresses_win_over_the_node_object() {
    let c = cluster(&one_node());
    let (mut base, _) = default_base(&c, "node-a").unwrap();
    base.node.addresses = vec![ip("192.168.10.2")];
    base.ports[0]
        .addresses
        .push(PortAddr::from(ip("192.168.10.3")));
    let c2 = cluster(&node(
        "node-a",
        &[
            ("InternalIP", "192.168.10.2"),
            ("ExternalIP", "203.0.113.5"),
        ],
        &[],
        &[],
    ));
    let t = compile_with(&c2, "node-a", Some(&base), &CompileOptions::default()).tables;
    assert_eq!(t.node.addresses, [ip("192.168.10.2")]);
}

// ---- the default base ----

#[test]
fn default_base_is_an_uplink_from_the_node_and_its_annotations() {
    let c = cluster(&node(
        "node-a",
        &[("InternalIP", "192.168.10.2"), ("InternalIP", "fd00:50::2")],
        &[],
        &[
            ("ferry.io/ipv4-address", "192.168.10.2/24"),
            ("ferry.io/ipv4-gateway", "192.168.10.1"),
            ("ferry.io/ipv6-gateway", "fd00:50::1"),
        ],
    ));
    let (base, warnings) = default_base(&c, "node-a").unwrap();
    assert!(warnings.is_empty());
    let up = &base.ports[0];
    assert_eq!(base.ports.len(), 1);
    assert_eq!((up.name.as_str(), up.kind), ("uplink", PortKind::Uplink));
    assert_eq!(up.mac.to_string(), "02:fe:c0:a8:0a:02");
    let addrs: Vec<String> = up.addresses.iter().map(ToString::to_string).collect();
    // The IPv6 address has no annotation: only itself is on-link.
    assert_eq!(addrs, ["192.168.10.2/24", "fd00:50::2/128"]);
    let routes: Vec<String> = base
        .routes
        .iter()
        .map(|r| format!("{} {} {:?}", r.prefix, r.port, r.via))
        .collect();
    assert_eq!(
        routes,
        [
            "0.0.0.0/0 uplink Some(192.168.10.1)",
            "::/0 uplink Some(fd00:50::1)"
        ]
    );
}

#[test]
fn a_taken_uplink_gives_the_default_base_its_addresses_routes_and_a_host_port() {
    use crate::takeover::{Address, HOST_TAP_MAC, Neighbour, RECORD_VERSION, Route, Taken};
    let c = cluster(&node(
        "node-a",
        &[
            ("InternalIP", "192.168.10.2"),
            ("InternalIP", "192.168.99.9"),
        ],
        &[],
        &[("ferry.io/ipv4-gateway", "192.168.10.254")],
    ));
    let route = |dst: &str, gw: Option<&str>, metric: Option<u32>| Route {
        dst: dst.parse().unwrap(),
        gateway: gw.map(|g| g.parse().unwrap()),
        table: None,
        metric,
        protocol: None,
        scope: None,
        prefsrc: None,
        onlink: false,
    };
    let taken = Taken {
        version: RECORD_VERSION,
        uplink: "eth0".into(),
        tap: "ferry0".into(),
        tap_mac: HOST_TAP_MAC,
        mtu: 9001,
        addresses: vec![Address {
            addr: "192.168.10.2/24".parse().unwrap(),
            broadcast: None,
            noprefixroute: false,
        }],
        routes: vec![
            route("0.0.0.0/0", Some("192.168.10.1"), Some(100)),
            // A second default route of a higher metric loses, as in the kernel.
            route("0.0.0.0/0", Some("192.168.10.3"), Some(200)),
            Route {
                protocol: Some("kernel".into()),
                ..route("192.168.10.0/24", None, None)
            },
            route("10.50.0.0/16", None, None),
            Route {
                table: Some("100".into()),
                ..route("172.16.0.0/12", Some("192.168.10.1"), None)
            },
        ],
        neighbours: vec![Neighbour {
            addr: "192.168.10.77".parse().unwrap(),
            mac: "02:00:00:00:00:77".parse().unwrap(),
        }],
    };
    let opts = CompileOptions {
        taken: Some(std::sync::Arc::new(taken)),
        ..CompileOptions::default()
    };
    let out = compile_with(&c, "node-a", None, &opts);
    let t = &out.tables;
    let names: Vec<&str> = t.ports.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["uplink", "host"]);
    let up = &t.ports[0];
    assert_eq!(up.addresses.len(), 1);
    assert_eq!(up.addresses[0].to_string(), "192.168.10.2/24");
    assert_eq!(up.mtu, Some(9001));
    let host = &t.ports[1];
    assert_eq!(host.kind, PortKind::Host);
    assert_eq!(host.addresses[0].addr, ip("169.254.1.1"));
    let routes: Vec<String> = t
        .routes
        .iter()
        .map(|r| {
            format!(
                "{} {} {:?} {:?}",
                r.prefix,
                r.port,
                r.via,
                r.next_hop_mac.map(|m| m.to_string())
            )
        })
        .collect();
    assert_eq!(
        routes,
        [
            "0.0.0.0/0 uplink Some(192.168.10.1) None",
            "10.50.0.0/16 uplink None None",
            "192.168.10.77/32 uplink None Some(\"02:00:00:00:00:77\")",
            "192.168.10.2/32 host None Some(\"02:fe:00:00:00:01\")",
        ]
    );
    let warned = |what: &str| out.warnings.iter().any(|w| w.contains(what));
    assert!(
        warned("InternalIP 192.168.99.9 is not on the uplink"),
        "{:?}",
        out.warnings
    );
    assert!(
        warned("stands in place of the gateway annotation"),
        "{:?}",
        out.warnings
    );
    assert!(warned("172.16.0.0/12 of table 100"), "{:?}", out.warnings);
}

#[test]
fn default_base_mac_comes_from_the_name_without_an_ipv4_address() {
    let c = cluster(&node("node-6", &[("InternalIP", "fd00:50::6")], &[], &[]));
    let (base, _) = default_base(&c, "node-6").unwrap();
    let h = base::name_hash("node-6").to_be_bytes();
    assert_eq!(
        base.ports[0].mac,
        MacAddr([0x02, 0xfe, h[0], h[1], h[2], h[3]])
    );
}

#[test]
fn an_address_annotation_for_another_address_is_ignored_with_a_warning() {
    let c = cluster(&node(
        "node-a",
        &[("InternalIP", "192.168.10.2")],
        &[],
        &[("ferry.io/ipv4-address", "192.168.99.9/24")],
    ));
    let out = compile(&c, "node-a");
    assert_eq!(
        out.tables.ports[0].addresses[0].to_string(),
        "192.168.10.2/32"
    );
    assert_eq!(
        out.warnings,
        [
            "Node node-a: annotation ferry.io/ipv4-address 192.168.99.9/24 is not one of the node's InternalIPs; ignored"
        ]
    );
}

// ---- peers and the overlay ----

#[test]
fn other_nodes_become_peers_with_their_pod_cidrs_and_an_overlay() {
    let c = cluster(&two_nodes());
    let t = compile(&c, "node-a").tables;
    assert_eq!(t.nodes.len(), 1);
    let b = &t.nodes[0];
    assert_eq!((b.name.as_str(), b.address), ("node-b", ip("192.168.20.2")));
    let cidrs: Vec<String> = b.pod_cidrs.iter().map(ToString::to_string).collect();
    assert_eq!(cidrs, ["10.244.2.0/24", "fd00:10:244:2::/64"]);
    let o = t.overlay.as_ref().unwrap();
    assert_eq!(
        (o.vni, o.port, o.mode, o.uplink.as_str()),
        (4096, 4789, ModeSpec::CrossSubnet, "uplink")
    );
    // And the compiled tables tunnel to node-b: it is in another subnet.
    let tables = t.compile().unwrap();
    let r = tables
        .fib
        .lookup(ip("10.244.2.9"))
        .unwrap()
        .route()
        .unwrap();
    assert_eq!(r.next_hop, ferry_datapath::NextHop::Tunnel(0));
}

#[test]
fn this_nodes_pod_cidrs_route_to_its_pods_and_nowhere_else() {
    let text = two_nodes() + &pod("default", "web", "node-a", &["10.244.1.5"], "Running", "");
    let c = cluster(&text);
    let out = compile(&c, "node-a");
    let cidrs: Vec<String> = out
        .tables
        .node
        .pod_cidrs
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(cidrs, ["10.244.1.0/24", "fd00:10:244:1::/64"]);
    let fib = &out.compiled.fib;
    let web = fib.lookup(ip("10.244.1.5")).unwrap().route().unwrap();
    assert_eq!(
        out.compiled.ports[usize::from(web.port)].name,
        "pod.default.web"
    );
    assert_eq!(fib.lookup(ip("10.244.1.77")), Some(&Target::NoSuchPod));
    assert_eq!(
        fib.lookup(ip("fd00:10:244:1::77")),
        Some(&Target::NoSuchPod)
    );
    // Not another node's: those go through the overlay.
    assert!(fib.lookup(ip("10.244.2.9")).unwrap().route().is_some());

    // A base that gives them keeps its own.
    let (mut base, _) = default_base(&c, "node-a").unwrap();
    base.node.pod_cidrs = vec!["10.244.1.0/25".parse().unwrap()];
    let t = compile_with(&c, "node-a", Some(&base), &CompileOptions::default()).tables;
    assert_eq!(t.node.pod_cidrs, base.node.pod_cidrs);
}

#[test]
fn a_node_with_only_pod_cidr_gives_that_one() {
    let text = two_nodes().replace(
        "  podCIDRs:\n  - \"10.244.2.0/24\"\n  - \"fd00:10:244:2::/64\"\n",
        "",
    );
    let c = cluster(&text);
    let t = compile(&c, "node-a").tables;
    let cidrs: Vec<String> = t.nodes[0]
        .pod_cidrs
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(cidrs, ["10.244.2.0/24"]);
}

#[test]
fn a_node_address_that_is_not_an_ip_is_skipped_with_a_warning() {
    let text = two_nodes()
        .replace(
            "  - address: \"192.168.10.2\"\n",
            "  - address: \"node-a.internal\"\n    type: InternalIP\n  - address: \"192.168.10.2\"\n",
        )
        .replace(
            "  - address: \"192.168.20.2\"\n",
            "  - address: \"192.168.20.x\"\n    type: ExternalIP\n  - address: \"192.168.20.2\"\n",
        );
    let out = compile(&cluster(&text), "node-a");
    assert_eq!(out.tables.node.addresses, [ip("192.168.10.2")]);
    assert_eq!(out.tables.nodes[0].address, ip("192.168.20.2"));
    assert_eq!(
        out.warnings,
        [
            "Node node-a: status.addresses[0].address: \"node-a.internal\" is not an IP address; skipped",
            "Node node-b: status.addresses[0].address: \"192.168.20.x\" is not an IP address; skipped",
        ]
    );
}

#[test]
fn a_node_without_an_address_of_this_nodes_family_is_left_out() {
    let text = two_nodes()
        + &node(
            "node-v6",
            &[("InternalIP", "fd00:50::7")],
            &["fd00:10:244:7::/64"],
            &[],
        );
    let c = cluster(&text);
    let out = compile(&c, "node-a");
    let names: Vec<&str> = out.tables.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node-b"]);
    assert_eq!(
        out.warnings,
        [
            "Node node-v6: no InternalIP of a family node node-a has (IPv4): not reachable through the overlay"
        ]
    );
}

#[test]
fn the_overlay_takes_the_ferry_config_settings() {
    let text = two_nodes()
        + "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ferry-config, namespace: kube-system}\ndata:\n  vxlan-vni: \"77\"\n  vxlan-port: \"8472\"\n  encapsulation: always\n";
    let c = cluster(&text);
    let o = compile(&c, "node-a").tables.overlay.unwrap();
    assert_eq!((o.vni, o.port, o.mode), (77, 8472, ModeSpec::Always));
}

#[test]
fn a_base_overlay_and_base_peers_are_kept() {
    let c = cluster(&two_nodes());
    let (mut base, _) = default_base(&c, "node-a").unwrap();
    base.overlay = Some(OverlaySpec {
        vni: 9,
        port: 4789,
        mode: ModeSpec::Always,
        uplink: "uplink".into(),
        mac: None,
    });
    base.nodes.push(ferry_datapath::PeerSpec {
        name: "node-b".into(),
        address: ip("192.168.20.2"),
        pod_cidrs: vec!["10.244.99.0/24".parse().unwrap()],
        mac: Some(MacAddr([0x6a, 1, 2, 3, 4, 5])),
    });
    let t = compile_with(&c, "node-a", Some(&base), &CompileOptions::default()).tables;
    assert_eq!(t.overlay.unwrap().vni, 9);
    assert_eq!(t.nodes.len(), 1);
    assert_eq!(t.nodes[0].pod_cidrs[0].to_string(), "10.244.99.0/24");
}

#[test]
fn peers_without_an_uplink_in_the_base_are_an_error() {
    let c = cluster(&two_nodes());
    let base = TablesSpec {
        ports: vec![PortSpec {
            name: "lab".into(),
            mac: MacAddr([2, 0, 0, 0, 0, 1]),
            ..PortSpec::default()
        }],
        ..TablesSpec::default()
    };
    let e = node_tables(&c, "node-a", Some(&base), &[], &CompileOptions::default()).unwrap_err();
    assert_eq!(
        e,
        "1 other nodes need the overlay, and the base tables have no port of kind uplink to carry it"
    );
}

#[test]
fn peers_the_tables_would_refuse_are_left_out_and_the_first_by_name_stays() {
    let text = two_nodes().replace(
        "  - address: \"192.168.10.2\"\n    type: InternalIP\n",
        "  - address: \"192.168.10.2\"\n    type: InternalIP\n  - address: \"203.0.113.5\"\n    type: ExternalIP\n",
    ) + &node(
        "node-c",
        &[("InternalIP", "192.168.20.3")],
        &["10.244.2.0/24"],
        &[],
    ) + &node(
        "node-d",
        &[("InternalIP", "192.168.20.4")],
        &["10.244.1.128/25"],
        &[],
    ) + &node(
        "node-e",
        &[("InternalIP", "203.0.113.5")],
        &["10.244.5.0/24"],
        &[],
    ) + &node(
        "node-f",
        &[("InternalIP", "192.168.20.6")],
        &["10.244.0.0/16"],
        &[],
    ) + &node(
        "node-g",
        &[("InternalIP", "10.244.2.7")],
        &["10.244.7.0/24"],
        &[],
    ) + &node(
        "node-h",
        &[("InternalIP", "192.168.20.8")],
        &["10.244.8.0/24", "fd00:10:244:2::/80"],
        &[],
    ) + &node(
        "node-i",
        &[("InternalIP", "192.168.20.9")],
        &["10.244.9.0/24"],
        &[],
    );
    let c = cluster(&text);
    let out = compile(&c, "node-a");
    let names: Vec<&str> = out.tables.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node-b", "node-i"], "{:#?}", out.warnings);
    assert_eq!(
        out.warnings,
        [
            "Node node-c: pod CIDR 10.244.2.0/24 overlaps pod CIDR 10.244.2.0/24 of Node node-b: left out of the overlay",
            "Node node-d: pod CIDR 10.244.1.128/25 overlaps pod CIDR 10.244.1.0/24 of node node-a: left out of the overlay",
            "Node node-e: InternalIP 203.0.113.5 is an address of node node-a: left out of the overlay",
            "Node node-f: pod CIDR 10.244.0.0/16 overlaps pod CIDR 10.244.1.0/24 of node node-a: left out of the overlay",
            "Node node-g: InternalIP 10.244.2.7 is in pod CIDR 10.244.2.0/24 of Node node-b: left out of the overlay",
            "Node node-h: pod CIDR fd00:10:244:2::/80 overlaps pod CIDR fd00:10:244:2::/64 of Node node-b: left out of the overlay",
        ]
    );
    // And node-b, which every Node after it clashes with, still compiles.
    compile(&c, "node-b");
}

#[test]
fn a_peer_the_uplink_has_no_route_to_is_left_out_with_a_warning() {
    // node-b is in another subnet, and without a gateway node-a has no way there.
    let text = two_nodes().replace("    ferry.io/ipv4-gateway: \"192.168.10.1\"\n", "")
        + &node(
            "node-c",
            &[("InternalIP", "192.168.10.3")],
            &["10.244.3.0/24"],
            &[],
        );
    let c = cluster(&text);
    let out = compile(&c, "node-a");
    let names: Vec<&str> = out.tables.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node-c"], "on the uplink's subnet");
    assert_eq!(
        out.warnings,
        [
            "Node node-b: no route to its InternalIP 192.168.20.2 through the uplink \"uplink\" (annotate node node-a with ferry.io/ipv4-gateway, or ferry.io/ipv4-address as ADDR/LEN): left out of the overlay"
        ]
    );

    // A given base is where the route is missing.
    let c = cluster(&two_nodes());
    let (mut base, _) = default_base(&c, "node-a").unwrap();
    base.routes.clear();
    let out = compile_with(&c, "node-a", Some(&base), &CompileOptions::default());
    assert!(out.tables.nodes.is_empty());
    assert_eq!(
        out.warnings,
        [
            "Node node-b: no route to its InternalIP 192.168.20.2 through the uplink \"uplink\" (add a route to the base tables, or give the uplink address as ADDR/LEN): left out of the overlay"
        ]
    );
}

#[test]
fn a_peer_clashing_with_a_base_route_or_a_base_peer_is_left_out() {
    let c = cluster(&two_nodes());
    let (mut base, _) = default_base(&c, "node-a").unwrap();
    base.routes.push(RouteSpec {
        prefix: "10.244.2.0/24".parse().unwrap(),
        port: "uplink".into(),
        next_hop_mac: None,
        via: Some(ip("192.168.10.1")),
    });
    let out = compile_with(&c, "node-a", Some(&base), &CompileOptions::default());
    assert!(out.tables.nodes.is_empty());
    assert_eq!(
        out.warnings,
        [
            "Node node-b: pod CIDR 10.244.2.0/24 is also a route of the base tables: left out of the overlay"
        ]
    );

    let (mut base, _) = default_base(&c, "node-a").unwrap();
    base.overlay = Some(OverlaySpec {
        vni: 9,
        port: 4789,
        mode: ModeSpec::Always,
        uplink: "uplink".into(),
        mac: None,
    });
    base.nodes.push(ferry_datapath::PeerSpec {
        name: "gateway".into(),
        address: ip("192.168.20.2"),
        pod_cidrs: Vec::new(),
        mac: None,
    });
    let out = compile_with(&c, "node-a", Some(&base), &CompileOptions::default());
    let names: Vec<&str> = out.tables.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["gateway"]);
    assert_eq!(
        out.warnings,
        [
            "Node node-b: InternalIP 192.168.20.2 is also the address of peer gateway of the base tables: left out of the overlay"
        ]
    );
}

#[test]
fn tables_that_do_not_compile_are_an_error_naming_the_node() {
    // Two pods of node-a with one address: the cluster is at fault.
    let text = two_nodes()
        + &pod("default", "web-1", "node-a", &["10.244.1.5"], "Running", "")
        + &pod("default", "web-2", "node-a", &["10.244.1.5"], "Running", "");
    let c = cluster(&text);
    let e = node_tables(
        &c,
        "node-a",
        None,
        &every_pod(&c),
        &CompileOptions::default(),
    )
    .unwrap_err();
    assert!(
        e.starts_with("the tables of node node-a do not compile: ports[2] (\"pod.default.web-2\"): address 10.244.1.5 belongs to another pod"),
        "{e}"
    );
}

#[test]
fn tables_that_do_not_compile_on_a_given_base_name_its_file() {
    // The base's limits are wrong: the base is where to look.
    let c = cluster(&two_nodes());
    let (mut base, _) = default_base(&c, "node-a").unwrap();
    base.ct.max_entries = Some(0);
    let opts = CompileOptions {
        base_file: Some("/etc/ferry/base.yaml".into()),
        ..CompileOptions::default()
    };
    let e = node_tables(&c, "node-a", Some(&base), &[], &opts).unwrap_err();
    assert!(
        e.starts_with("the tables of node node-a on the base tables /etc/ferry/base.yaml do not compile: ct: max_entries"),
        "{e}"
    );
    let e = node_tables(&c, "node-a", Some(&base), &[], &CompileOptions::default()).unwrap_err();
    assert!(
        e.starts_with("the tables of node node-a on the base tables given do not compile:"),
        "{e}"
    );
}

// ---- pods ----

#[test]
fn a_cni_attachment_of_a_pod_whose_cached_object_finished_gets_its_port() {
    // The pod came back under the same name (a StatefulSet's), and the watch still has
    // the old, failed object: the plugin's addresses make the port all the same. Without
    // them (a pod attached by name), a finished pod gets none.
    let text = two_nodes() + &pod("default", "web-0", "node-a", &["10.244.1.9"], "Failed", "");
    let c = cluster(&text);
    let att = AttachedPod {
        namespace: "default".into(),
        name: "web-0".into(),
        addresses: vec!["10.244.1.5".parse().unwrap()],
    };
    let out = node_tables(&c, "node-a", None, &[att], &CompileOptions::default()).unwrap();
    let port = out
        .tables
        .ports
        .iter()
        .find(|p| p.name == "pod.default.web-0")
        .expect("a port for the attachment");
    let addrs: Vec<String> = port.addresses.iter().map(ToString::to_string).collect();
    assert_eq!(addrs, ["10.244.1.5"]);
    let by_name = [AttachedPod::new("default", "web-0")];
    let out = node_tables(&c, "node-a", None, &by_name, &CompileOptions::default()).unwrap();
    assert!(
        out.tables
            .ports
            .iter()
            .all(|p| p.name != "pod.default.web-0")
    );
}

#[test]
fn a_cni_attachment_whose_pod_object_has_no_address_yet_meets_its_policy() {
    // The plugin gave web-0 its address; the Pod object does not say it yet (kubelet's
    // status update has not come) or says the pod finished (a new sandbox of its
    // name). Either way the policy isolating it applies from the first packet.
    let deny = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: default}\nspec: {podSelector: {matchLabels: {app: web}}, policyTypes: [Ingress]}\n---\n";
    for (ips, phase) in [(&[][..], "Pending"), (&["10.244.1.9"][..], "Failed")] {
        let text = two_nodes() + deny + &pod("default", "web-0", "node-a", ips, phase, "");
        let c = cluster(&text);
        let att = AttachedPod {
            namespace: "default".into(),
            name: "web-0".into(),
            addresses: vec!["10.244.1.5".parse().unwrap()],
        };
        let out = node_tables(&c, "node-a", None, &[att], &CompileOptions::default()).unwrap();
        let pods: Vec<(&str, &[u32])> = (out.tables.policy.pods.iter())
            .map(|p| (p.port.as_str(), p.ingress.isolated_by.as_slice()))
            .collect();
        assert_eq!(pods, [("pod.default.web-0", &[0][..])], "{phase}");
        assert_eq!(
            out.pod_addresses[&ObjectKey::new("default", "web-0")],
            [ip("10.244.1.5")]
        );
    }
}

#[test]
fn pods_of_this_node_that_run_with_addresses_and_are_attached_get_ports() {
    let text = two_nodes()
        + &pod(
            "default",
            "web-1",
            "node-a",
            &["10.244.1.5", "fd00:10:244:1::5"],
            "Running",
            "",
        )
        + &pod("default", "web-2", "node-b", &["10.244.2.5"], "Running", "")
        + &pod("default", "pending", "node-a", &[], "Pending", "")
        + &pod(
            "default",
            "done",
            "node-a",
            &["10.244.1.9"],
            "Succeeded",
            "",
        )
        + &pod(
            "default",
            "failed",
            "node-a",
            &["10.244.1.10"],
            "Failed",
            "",
        )
        + &pod(
            "kube-system",
            "exporter",
            "node-a",
            &["192.168.10.2"],
            "Running",
            "  hostNetwork: true\n",
        )
        + &pod("apps", "api", "node-a", &["10.244.1.6"], "Running", "")
        + &pod(
            "apps",
            "not-attached",
            "node-a",
            &["10.244.1.7"],
            "Running",
            "",
        );
    let c = cluster(&text);
    let mut attached = every_pod(&c);
    attached.retain(|p| p.name != "not-attached");
    let out = node_tables(&c, "node-a", None, &attached, &CompileOptions::default()).unwrap();
    let names: Vec<&str> = out.tables.ports.iter().map(|p| p.name.as_str()).collect();
    // Base ports first, then pods by namespace and name.
    assert_eq!(names, ["uplink", "pod.apps.api", "pod.default.web-1"]);
    let web = &out.tables.ports[2];
    assert_eq!(web.kind, PortKind::Pod);
    assert_eq!(web.mac.to_string(), "ee:ee:ee:ee:ee:ee");
    assert_eq!(web.peer_mac.unwrap().to_string(), "0a:58:0a:f4:01:05");
    let addrs: Vec<String> = web.addresses.iter().map(ToString::to_string).collect();
    assert_eq!(addrs, ["10.244.1.5", "fd00:10:244:1::5"]);
    assert!(web.gso);
    assert_eq!(web.mtu, None, "derived from the overlay");
    assert_eq!(
        out.pod_ports[&ObjectKey::new("default", "web-1")],
        "pod.default.web-1"
    );
    // The pod MTU is the uplink's minus the VXLAN overhead.
    let t = out.tables.compile().unwrap();
    assert_eq!(t.ports[2].mtu, 1450);
}

#[test]
fn a_pod_port_name_taken_by_the_base_gets_a_suffix() {
    let c =
        cluster(&(one_node() + &pod("default", "web", "node-a", &["10.244.1.5"], "Running", "")));
    let (mut base, _) = default_base(&c, "node-a").unwrap();
    base.ports.push(PortSpec {
        name: "pod.default.web".into(),
        mac: MacAddr([2, 0, 0, 0, 0, 9]),
        ..PortSpec::default()
    });
    let out = compile_with(&c, "node-a", Some(&base), &CompileOptions::default());
    assert_eq!(out.tables.ports[2].name, "pod.default.web.2");
}

#[test]
fn a_bad_pod_address_names_the_pod_and_field() {
    let c =
        cluster(&(one_node() + &pod("default", "web", "node-a", &["10.244.1.5"], "Running", "")));
    let mut c2 = c.clone();
    let p = Arc::make_mut(c2.pods.get_mut(&ObjectKey::new("default", "web")).unwrap());
    p.status.as_mut().unwrap().pod_ips.as_mut().unwrap()[0].ip = "10.244.1.x".into();
    let e = node_tables(
        &c2,
        "node-a",
        None,
        &every_pod(&c2),
        &CompileOptions::default(),
    )
    .unwrap_err();
    assert_eq!(
        e,
        "Pod default/web: status.podIPs[0].ip: \"10.244.1.x\" is not an IP address"
    );
}

// ---- services ----

const SLICE_HEAD: &str = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n";

fn slice(name: &str, service: &str, family: &str, ports: &str, endpoints: &str) -> String {
    format!(
        "{SLICE_HEAD}metadata:\n  name: {name}\n  namespace: default\n  generateName: {service}-\n  labels:\n    kubernetes.io/service-name: {service}\n    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io\n  resourceVersion: \"51102\"\naddressType: {family}\nports:\n{ports}endpoints:\n{endpoints}---\n"
    )
}

fn endpoint(addr: &str, node: &str, conditions: &str) -> String {
    format!(
        "- addresses: [\"{addr}\"]\n  nodeName: {node}\n  conditions: {{{conditions}}}\n  targetRef: {{kind: Pod, name: x, namespace: default}}\n"
    )
}

fn service(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\n  uid: 7a3c5e9b-1d2f-4b6a-8c0e-2f4a6b8c0d71\n  resourceVersion: \"50871\"\nspec:\n{spec}---\n"
    )
}

fn services(extra: &str) -> Vec<ServiceSpec> {
    compile(&cluster(&(two_nodes() + extra)), "node-a")
        .tables
        .services
}

fn by_name<'a>(specs: &'a [ServiceSpec], name: &str) -> &'a ServiceSpec {
    specs.iter().find(|s| s.name == name).unwrap_or_else(|| {
        panic!(
            "no service {name} in {:?}",
            specs.iter().map(|s| &s.name).collect::<Vec<_>>()
        )
    })
}

#[test]
fn a_cluster_ip_service_port_becomes_one_entry() {
    let s = services(
        &(service(
            "web",
            "  type: ClusterIP\n  clusterIP: 10.96.0.10\n  clusterIPs: [10.96.0.10, \"fd00:10:96::10\"]\n  ipFamilies: [IPv4, IPv6]\n  ports:\n  - {name: http, port: 80, protocol: TCP, targetPort: 8080}\n  - {name: dns, port: 53, protocol: UDP, targetPort: 5353}\n  selector: {app: web}\n  sessionAffinity: None\n",
        ) + &slice(
            "web-abc",
            "web",
            "IPv4",
            "- {name: http, port: 8080, protocol: TCP}\n- {name: dns, port: 5353, protocol: UDP}\n",
            &endpoint("10.244.1.5", "node-a", "ready: true"),
        )),
    );
    assert_eq!(s.len(), 2);
    let http = by_name(&s, "default/web:http");
    assert_eq!((http.proto.as_str(), http.port), ("tcp", 80));
    assert_eq!(http.cluster_ips, [ip("10.96.0.10"), ip("fd00:10:96::10")]);
    assert_eq!(http.node_port, None);
    assert_eq!(http.affinity_timeout_s, None);
    assert!(!http.external_snat);
    assert_eq!(
        http.backends,
        [BackendSpec {
            addr: ip("10.244.1.5"),
            port: 8080,
            node: Some("node-a".into()),
            no_node: false,
            ready: true,
            serving: None,
            terminating: false,
            hints: Default::default(),
        }]
    );
    let dns = by_name(&s, "default/web:dns");
    assert_eq!((dns.proto.as_str(), dns.port), ("udp", 53));
    assert_eq!(dns.backends[0].port, 5353);
}

#[test]
fn an_unnamed_port_is_named_by_its_number_and_matches_an_unnamed_slice_port() {
    let s = services(
        &(service(
            "single",
            "  clusterIP: 10.96.0.20\n  ports:\n  - {port: 8080, targetPort: 80}\n",
        ) + &slice(
            "single-1",
            "single",
            "IPv4",
            "- {port: 80, protocol: TCP}\n",
            &endpoint("10.244.1.5", "node-a", ""),
        )),
    );
    let p = by_name(&s, "default/single:8080");
    assert_eq!(p.proto, "tcp");
    assert_eq!(p.backends.len(), 1);
    assert_eq!(p.backends[0].port, 80);
}

#[test]
fn slice_ports_match_by_name_and_protocol_only() {
    let s = services(
        &(service(
            "web",
            "  clusterIP: 10.96.0.10\n  ports:\n  - {name: http, port: 80}\n  - {name: metrics, port: 9090}\n",
        ) + &slice(
            "web-1",
            "web",
            "IPv4",
            "- {name: http, port: 8080, protocol: UDP}\n- {name: metric, port: 9100}\n- {name: http, port: 8081}\n",
            &endpoint("10.244.1.5", "node-a", ""),
        )),
    );
    assert_eq!(by_name(&s, "default/web:http").backends[0].port, 8081);
    assert!(by_name(&s, "default/web:metrics").backends.is_empty());
}

/// A selectorless Service's hand-made endpoint without nodeName is on no node, as
/// kube-proxy takes it: not local to this node (a tables file's absent `node` would be).
#[test]
fn an_endpoint_without_a_node_name_is_on_no_node() {
    let s = services(
        &(service(
            "legacy",
            "  type: NodePort
  clusterIP: 10.96.0.40
  ports:
  - {name: http, port: 80, nodePort: 30040}
",
        ) + &slice(
            "legacy-1",
            "legacy",
            "IPv4",
            "- {name: http, port: 80}\n",
            "- addresses: [\"192.168.30.50\"]\n  conditions: {ready: true}\n",
        )),
    );
    let b = &by_name(&s, "default/legacy:http").backends;
    assert_eq!(b.len(), 1);
    assert_eq!((b[0].node.as_deref(), b[0].no_node), (None, true));
    let compiled = ferry_datapath::Services::compile(&s, "node-a", []).unwrap();
    let svc = compiled.get("default/legacy:http").unwrap();
    assert!(!svc.backends[0].local);
}

#[test]
fn sctp_ports_are_skipped_with_a_warning_and_the_rest_kept() {
    let c = cluster(
        &(two_nodes()
            + &service(
                "sig",
                "  clusterIP: 10.96.0.30\n  ports:\n  - {name: tcp, port: 80}\n  - {name: sctp, port: 3868, protocol: SCTP}\n",
            )),
    );
    let out = compile(&c, "node-a");
    let names: Vec<&str> = out
        .tables
        .services
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(names, ["default/sig:tcp"]);
    assert_eq!(
        out.warnings,
        ["Service default/sig: spec.ports[1] (sctp): SCTP is not supported yet; port skipped"]
    );
}

/// kube-proxy's firewall of load balancer IPs: the ranges, plus the load balancer IPs
/// of a family whose ranges hold this node's address (node-a is 192.168.10.2); a family
/// of load balancer IPs without a range is open, with a warning.
#[test]
fn load_balancer_source_ranges_go_to_the_tables_with_the_nodes_allowance() {
    let lb = |name: &str, ranges: &str| {
        service(
            name,
            &format!(
                "  type: LoadBalancer\n  ipFamilyPolicy: PreferDualStack\n  clusterIPs: [10.96.0.31, \"fd00:96::31\"]\n  ports:\n  - {{port: 80, nodePort: 30031}}\n  loadBalancerSourceRanges: {ranges}\nstatus:\n  loadBalancer:\n    ingress:\n    - {{ip: 203.0.113.10}}\n    - {{ip: \"2001:db8::10\"}}\n"
            ),
        )
    };
    let c = cluster(
        &(two_nodes()
            + &lb("lb", "[198.51.100.0/24, \" 192.168.10.0/24 \"]")
            + &lb("lb6", "[\"2001:db8:1::/48\"]")
                .replace("96::31", "96::32")
                .replace("0.31", "0.32")
                .replace("30031", "30032")),
    );
    let out = compile(&c, "node-a");
    let ranges = |name: &str| -> Vec<String> {
        let s = out
            .tables
            .services
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("{name} in {:?}", out.tables.services));
        s.source_ranges.iter().map(|r| r.to_string()).collect()
    };
    assert_eq!(
        ranges("default/lb:80"),
        ["198.51.100.0/24", "192.168.10.0/24", "203.0.113.10/32"],
        "the node's address is in a range: the IPv4 load balancer IP may reach itself"
    );
    assert_eq!(ranges("default/lb6:80"), ["2001:db8:1::/48"]);
    assert_eq!(
        out.warnings,
        [
            "Service default/lb: spec.loadBalancerSourceRanges has no IPv6 range: its IPv6 load balancer IPs accept every source, as kube-proxy reads the ranges per family",
            "Service default/lb6: spec.loadBalancerSourceRanges has no IPv4 range: its IPv4 load balancer IPs accept every source, as kube-proxy reads the ranges per family",
        ]
    );
    // On node-b (192.168.20.2) the allowance does not apply.
    let out = compile(&c, "node-b");
    let lb = out
        .tables
        .services
        .iter()
        .find(|s| s.name == "default/lb:80")
        .unwrap();
    assert_eq!(lb.source_ranges.len(), 2);
}

#[test]
fn external_name_and_headless_services_are_left_alone() {
    let s = services(
        &(service(
            "ext",
            "  type: ExternalName\n  externalName: db.example.com\n  ports:\n  - {port: 5432}\n",
        ) + &service(
            "headless",
            "  clusterIP: None\n  clusterIPs: [None]\n  ports:\n  - {port: 80}\n",
        )),
    );
    assert!(s.is_empty());
}

#[test]
fn node_ports_only_for_node_port_and_load_balancer_services() {
    let s = services(
        &(service(
            "np",
            "  type: NodePort\n  clusterIP: 10.96.0.11\n  externalTrafficPolicy: Cluster\n  ports:\n  - {name: http, port: 80, nodePort: 30080}\n",
        ) + &service(
            "lb",
            "  type: LoadBalancer\n  clusterIP: 10.96.0.12\n  allocateLoadBalancerNodePorts: false\n  externalTrafficPolicy: Local\n  ports:\n  - {name: http, port: 80}\n",
        )),
    );
    let np = by_name(&s, "default/np:http");
    assert_eq!(np.node_port, Some(30080));
    assert_eq!(np.external_policy, TrafficPolicy::Cluster);
    let lb = by_name(&s, "default/lb:http");
    assert_eq!(lb.node_port, None, "allocateLoadBalancerNodePorts: false");
    assert_eq!(lb.external_policy, TrafficPolicy::Local);
}

#[test]
fn external_and_load_balancer_ips_and_policies() {
    let s = services(
        &(service(
            "lb",
            "  type: LoadBalancer\n  clusterIP: 10.96.0.12\n  externalIPs: [198.51.100.7]\n  externalTrafficPolicy: Local\n  internalTrafficPolicy: Local\n  healthCheckNodePort: 32100\n  ports:\n  - {name: http, port: 80, nodePort: 30081}\nstatus:\n  loadBalancer:\n    ingress:\n    - {ip: 203.0.113.10, ipMode: VIP}\n    - {ip: 203.0.113.11, ipMode: Proxy}\n",
        ) + &service(
            "plain",
            "  clusterIP: 10.96.0.13\n  externalTrafficPolicy: Local\n  ports:\n  - {port: 80}\n",
        )),
    );
    let lb = by_name(&s, "default/lb:http");
    assert_eq!(lb.external_ips, [ip("198.51.100.7")]);
    assert_eq!(lb.load_balancer_ips, [ip("203.0.113.10")]);
    assert_eq!(
        (lb.external_policy, lb.internal_policy),
        (TrafficPolicy::Local, TrafficPolicy::Local)
    );
    // No node port, external or load balancer IP: no external traffic to have a policy.
    let plain = by_name(&s, "default/plain:80");
    assert_eq!(plain.external_policy, TrafficPolicy::Cluster);
}

#[test]
fn client_ip_affinity_takes_its_timeout_or_the_default() {
    let s = services(
        &(service(
            "a",
            "  clusterIP: 10.96.0.21\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}\n  ports:\n  - {port: 80}\n",
        ) + &service(
            "b",
            "  clusterIP: 10.96.0.22\n  sessionAffinity: ClientIP\n  ports:\n  - {port: 80}\n",
        )),
    );
    assert_eq!(by_name(&s, "default/a:80").affinity_timeout_s, Some(600));
    assert_eq!(by_name(&s, "default/b:80").affinity_timeout_s, Some(10800));
}

#[test]
fn external_snat_annotation_then_config_map_then_option() {
    let svcs = service(
        "plain",
        "  clusterIP: 10.96.0.21\n  ports:\n  - {port: 80}\n",
    ) + &service(
        "snat-on",
        "  clusterIP: 10.96.0.22\n  ports:\n  - {port: 80}\n",
    )
    .replace(
        "  namespace: default\n",
        "  namespace: default\n  annotations: {ferry.io/external-snat: \"true\"}\n",
    ) + &service(
        "snat-off",
        "  clusterIP: 10.96.0.23\n  ports:\n  - {port: 80}\n",
    )
    .replace(
        "  namespace: default\n",
        "  namespace: default\n  annotations: {ferry.io/external-snat: \"false\"}\n",
    );
    let snat = |extra: &str, opt: bool| -> Vec<bool> {
        let c = cluster(&(two_nodes() + &svcs + extra));
        let t = compile_with(
            &c,
            "node-a",
            None,
            &CompileOptions {
                external_snat: opt,
                ..CompileOptions::default()
            },
        )
        .tables;
        [
            "default/plain:80",
            "default/snat-off:80",
            "default/snat-on:80",
        ]
        .iter()
        .map(|n| by_name(&t.services, n).external_snat)
        .collect()
    };
    assert_eq!(snat("", false), [false, false, true]);
    assert_eq!(snat("", true), [true, false, true]);
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ferry-config, namespace: kube-system}\ndata: {external-snat: \"false\"}\n";
    assert_eq!(snat(cm, true), [false, false, true]);
}

#[test]
fn a_bad_external_snat_annotation_falls_back_to_the_config_map_with_a_warning() {
    let svc = service("web", "  clusterIP: 10.96.0.10\n  ports:\n  - {port: 80}\n").replace(
        "  namespace: default\n",
        "  namespace: default\n  annotations: {ferry.io/external-snat: \"yes\"}\n",
    );
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ferry-config, namespace: kube-system}\ndata: {external-snat: \"true\"}\n";
    let out = compile(&cluster(&(two_nodes() + &svc + cm)), "node-a");
    assert!(by_name(&out.tables.services, "default/web:80").external_snat);
    assert_eq!(
        out.warnings,
        [
            "Service default/web: metadata.annotations[ferry.io/external-snat]: \"yes\": expected \"true\" or \"false\"; ignored, the default applies"
        ]
    );
}

#[test]
fn a_slice_port_outside_1_65535_is_left_out_with_a_warning_and_the_rest_kept() {
    let svc = service(
        "web",
        "  clusterIP: 10.96.0.10\n  ports:\n  - {name: http, port: 80}\n  - {name: dns, port: 53, protocol: UDP}\n  - {name: admin, port: 81}\n",
    );
    let ports = "- {name: http, port: 8080}\n- {name: dns, port: 0, protocol: UDP}\n- {name: admin, port: 70000}\n";
    let eps = endpoint("10.244.1.5", "node-a", "ready: true");
    let out = compile(
        &cluster(&(two_nodes() + &svc + &slice("web-1", "web", "IPv4", ports, &eps))),
        "node-a",
    );
    let s = &out.tables.services;
    assert_eq!(by_name(s, "default/web:http").backends.len(), 1);
    assert!(by_name(s, "default/web:dns").backends.is_empty());
    assert!(by_name(s, "default/web:admin").backends.is_empty());
    assert_eq!(
        out.warnings,
        [
            "EndpointSlice default/web-1: ports[1].port: 0 is outside 1-65535; the port is left out",
            "EndpointSlice default/web-1: ports[2].port: 70000 is outside 1-65535; the port is left out",
        ]
    );
}

#[test]
fn backends_come_from_every_ip_slice_of_the_service_deduplicated_and_sorted() {
    let port = "- {name: http, port: 8080, protocol: TCP}\n";
    let s = services(
        &(service(
            "web",
            "  clusterIP: 10.96.0.10\n  ports:\n  - {name: http, port: 80}\n",
        ) + &slice(
            "web-b",
            "web",
            "IPv4",
            port,
            &(endpoint("10.244.2.5", "node-b", "ready: true")
                + &endpoint("10.244.1.5", "node-a", "ready: false")),
        ) + &slice(
            "web-a",
            "web",
            "IPv4",
            port,
            // 10.244.1.5 again: the slice that sorts first (web-a) wins.
            &endpoint("10.244.1.5", "node-a", "ready: true"),
        ) + &slice(
            "web-v6",
            "web",
            "IPv6",
            port,
            "- addresses: [\"fd00:10:244:1::5\", \"fd00:10:244:1::55\"]\n  nodeName: node-a\n",
        ) + &slice(
            "web-fqdn",
            "web",
            "FQDN",
            port,
            "- addresses: [web.example.com]\n",
        ) + &slice(
            "other-1",
            "other",
            "IPv4",
            port,
            &endpoint("10.244.1.99", "node-a", ""),
        ) + &slice(
            "web-x",
            "web",
            "IPv4",
            port,
            &endpoint("10.244.1.98", "node-a", ""),
        )
        .replace("namespace: default", "namespace: elsewhere")),
    );
    let b: Vec<String> = by_name(&s, "default/web:http")
        .backends
        .iter()
        .map(|b| format!("{}:{} {}", b.addr, b.port, b.ready))
        .collect();
    assert_eq!(
        b,
        [
            "10.244.1.5:8080 true",
            "10.244.2.5:8080 true",
            "fd00:10:244:1::5:8080 true",
            "fd00:10:244:1::55:8080 true",
        ]
    );
}

#[test]
fn endpoint_conditions_map_to_backend_state() {
    let port = "- {name: http, port: 8080}\n";
    let eps = endpoint("10.244.1.1", "node-a", "")
        + &endpoint("10.244.1.2", "node-a", "ready: false")
        + &endpoint(
            "10.244.1.3",
            "node-a",
            "ready: false, serving: true, terminating: true",
        )
        + &endpoint(
            "10.244.1.4",
            "node-a",
            "ready: true, serving: true, terminating: false",
        )
        + &endpoint("10.244.1.5", "node-a", "ready: false, terminating: true")
        + &endpoint(
            "10.244.1.6",
            "node-a",
            "ready: false, serving: false, terminating: true",
        );
    let spec = "  clusterIP: 10.96.0.10\n  ports:\n  - {name: http, port: 80}\n";
    let out = compile(
        &cluster(
            &(two_nodes() + &service("web", spec) + &slice("web-1", "web", "IPv4", port, &eps)),
        ),
        "node-a",
    );
    let b: Vec<(bool, Option<bool>, bool)> = by_name(&out.tables.services, "default/web:http")
        .backends
        .iter()
        .map(|b| (b.ready, b.serving, b.terminating))
        .collect();
    // Absent serving is true, whatever ready says, as kube-proxy reads it; the tables
    // say it only where it differs from ready.
    assert_eq!(
        b,
        [
            (true, None, false),
            (false, Some(true), false),
            (false, Some(true), true),
            (true, None, false),
            (false, Some(true), true),
            (false, None, true),
        ]
    );
    let serving = |a: &str| {
        let tcp = ferry_datapath::proto::TCP;
        out.compiled.services.has_serving_backend(tcp, ip(a), 8080)
    };
    assert!(serving("10.244.1.5"), "terminating, serving unset");
    assert!(!serving("10.244.1.6"), "terminating, not serving");
    // publishNotReadyAddresses: every endpoint counts as ready.
    let spec = format!("{spec}  publishNotReadyAddresses: true\n");
    let s = services(&(service("web", &spec) + &slice("web-1", "web", "IPv4", port, &eps)));
    assert!(
        by_name(&s, "default/web:http")
            .backends
            .iter()
            .all(|b| b.ready)
    );
}

#[test]
fn a_service_that_nothing_reaches_is_warned_about() {
    let c = cluster(&(two_nodes() + &service("noip", "  ports:\n  - {port: 80}\n")));
    let out = compile(&c, "node-a");
    assert_eq!(
        out.warnings,
        [
            "Service default/noip: no cluster IP, node port, external or load balancer IP: nothing reaches it"
        ]
    );
}

// ---- health checks ----

#[test]
fn health_checks_count_ready_local_endpoints_by_address_over_all_ports() {
    let ports = "- {name: http, port: 8080}\n- {name: https, port: 8443}\n";
    let eps = endpoint("10.244.1.5", "node-a", "ready: true")
        + &endpoint("10.244.1.6", "node-a", "ready: true")
        + &endpoint(
            "10.244.1.7",
            "node-a",
            "ready: false, serving: true, terminating: true",
        )
        + &endpoint("10.244.2.5", "node-b", "ready: true");
    let lb = |name: &str, etp: &str, ip: &str| {
        service(
            name,
            &format!(
                "  type: LoadBalancer\n  clusterIP: {ip}\n  externalTrafficPolicy: {etp}\n{hc}  ports:\n  - {{name: http, port: 80, nodePort: 3{}0}}\n  - {{name: https, port: 443, nodePort: 3{}1}}\n",
                &ip[8..],
                &ip[8..],
                // The API keeps a health check node port for Local only.
                hc = if etp == "Local" {
                    "  healthCheckNodePort: 32100\n"
                } else {
                    ""
                },
            ),
        )
    };
    let text = two_nodes()
        + &lb("local", "Local", "10.96.0.12")
        + &slice("local-1", "local", "IPv4", ports, &eps)
        + &lb("cluster", "Cluster", "10.96.0.13")
        + &slice("cluster-1", "cluster", "IPv4", ports, &eps);
    let c = cluster(&text);
    let a = compile(&c, "node-a").health_checks;
    assert_eq!(
        a,
        [HealthCheck {
            service: "default/local".into(),
            port: 32100,
            local_endpoints: 2
        }]
    );
    let b = compile(&c, "node-b").health_checks;
    assert_eq!(b[0].local_endpoints, 1);
}

// ---- the example cluster ----

#[test]
fn example_cluster_compiles_for_both_nodes() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster");
    let (c, _) = crate::datastore::file::load(&dir).unwrap_or_else(|e| panic!("{e}"));
    for (node, pods, local) in [("node-a", 3, 2), ("node-b", 2, 1)] {
        let out = compile(&c, node);
        assert!(out.warnings.is_empty(), "{:?}", out.warnings);
        let pod_ports = out
            .tables
            .ports
            .iter()
            .filter(|p| p.kind == PortKind::Pod)
            .count();
        assert_eq!(pod_ports, pods, "{node}");
        assert_eq!(out.tables.services.len(), 6);
        assert_eq!(out.health_checks.len(), 1);
        assert_eq!(out.health_checks[0].local_endpoints, local, "{node}");
    }
}

#[test]
fn services_compiled_alone_match_the_whole_node_and_patch_its_tables() {
    let c = crate::datastore::file::load(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/cluster"
    )))
    .unwrap()
    .0;
    let whole = compile(&c, "node-a");
    let keys: std::collections::BTreeSet<ObjectKey> = c.services.keys().cloned().collect();
    let alone = service_tables(&c, "node-a", &keys, &CompileOptions::default()).unwrap();
    let names = |v: &[ServiceSpec]| {
        let mut n: Vec<String> = v
            .iter()
            .map(|s| serde_json::to_string(s).unwrap())
            .collect();
        n.sort();
        n
    };
    assert!(!alone.specs.is_empty());
    assert_eq!(names(&alone.specs), names(&whole.tables.services));
    assert_eq!(alone.health_checks, whole.health_checks);

    // One Service's entries patched into the compiled tables give what compiling the
    // changed cluster whole gives.
    let mut changed = c.clone();
    let key = ObjectKey::new("default", "web");
    let slice = changed
        .endpoint_slices
        .iter()
        .find(|(k, _)| changed_service(&c, k) == Some(key.clone()))
        .map(|(k, _)| k.clone())
        .expect("a slice of default/web");
    let s = Arc::make_mut(changed.endpoint_slices.get_mut(&slice).unwrap());
    let eps = s.endpoints.as_mut().expect("endpoints");
    assert!(eps.len() > 1);
    eps.truncate(1);
    let patch = service_tables(
        &changed,
        "node-a",
        &[key.clone()].into(),
        &CompileOptions::default(),
    )
    .unwrap();
    let before: Vec<&str> = whole
        .tables
        .services
        .iter()
        .filter(|s| s.name.starts_with("default/web:"))
        .map(|s| s.name.as_str())
        .collect();
    let patched = whole
        .tables
        .compile()
        .unwrap()
        .with_services(&before, &patch.specs)
        .unwrap();
    let fresh = compile(&changed, "node-a").tables.compile().unwrap();
    for s in &compile(&changed, "node-a").tables.services {
        let (a, b) = (patched.services.get(&s.name), fresh.services.get(&s.name));
        assert_eq!(
            a.map(|x| serde_json::to_string(&x.to_spec()).unwrap()),
            b.map(|x| serde_json::to_string(&x.to_spec()).unwrap()),
            "{}",
            s.name
        );
    }
    assert_eq!(patched.services.len(), fresh.services.len());
}

fn changed_service(c: &Cluster, slice: &ObjectKey) -> Option<ObjectKey> {
    c.service_of_slice(slice)
}

// ---- service-proxy-name, headless slices, topology hints, one port two protocols ----

/// kube-proxy leaves a Service with `service.kubernetes.io/service-proxy-name` to the
/// proxy it names; `--service-proxy-name NAME` takes those labelled NAME instead, and
/// leaves the unlabelled ones.
#[test]
fn a_service_for_another_proxy_is_left_to_it() {
    let labelled = |name: &str, label: &str, ip: &str| {
        service(name, &format!("  clusterIP: {ip}\n  ports:\n  - {{port: 80}}\n")).replace(
            &format!("  name: {name}\n"),
            &format!(
                "  name: {name}\n  labels: {{service.kubernetes.io/service-proxy-name: \"{label}\"}}\n"
            ),
        )
    };
    let c = cluster(
        &(two_nodes()
            + &service(
                "plain",
                "  clusterIP: 10.96.0.50\n  ports:\n  - {port: 80}\n",
            )
            + &labelled("other", "other-proxy", "10.96.0.51")
            + &labelled("ours", "ferry", "10.96.0.52")
            + &labelled("empty", "", "10.96.0.53")),
    );
    let names = |opts: &CompileOptions| -> Vec<String> {
        compile_with(&c, "node-a", None, opts)
            .tables
            .services
            .iter()
            .map(|s| s.name.clone())
            .collect()
    };
    assert_eq!(names(&CompileOptions::default()), ["default/plain:80"]);
    let named = CompileOptions {
        service_proxy_name: Some("ferry".into()),
        ..CompileOptions::default()
    };
    assert_eq!(names(&named), ["default/ours:80"]);
}

/// A Service labelled `service.kubernetes.io/headless` gets no frontend (kube-proxy's
/// informers leave it out), whatever its cluster IP.
#[test]
fn a_service_labelled_headless_is_left_alone() {
    let s = services(
        &(service(
            "plain",
            "  clusterIP: 10.96.0.50\n  ports:\n  - {port: 80}\n",
        ) + &service(
            "labelled",
            "  clusterIP: 10.96.0.51\n  ports:\n  - {port: 80}\n",
        )
        .replace(
            "  name: labelled\n",
            "  name: labelled\n  labels: {service.kubernetes.io/headless: \"\"}\n",
        )),
    );
    let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["default/plain:80"]);
}

/// The slices the EndpointSlice controller labels `service.kubernetes.io/headless` are
/// not read, as kube-proxy does not read them.
#[test]
fn slices_labelled_headless_are_not_read() {
    let s = services(
        &(service(
            "web",
            "  clusterIP: 10.96.0.10\n  ports:\n  - {name: http, port: 80}\n",
        ) + &slice(
            "web-1",
            "web",
            "IPv4",
            "- {name: http, port: 8080, protocol: TCP}\n",
            &endpoint("10.244.1.5", "node-a", "ready: true"),
        ) + &slice(
            "web-2",
            "web",
            "IPv4",
            "- {name: http, port: 8080, protocol: TCP}\n",
            &endpoint("10.244.1.6", "node-a", "ready: true"),
        )
        .replace(
            "    kubernetes.io/service-name: web\n",
            "    kubernetes.io/service-name: web\n    service.kubernetes.io/headless: \"\"\n",
        )),
    );
    let web = by_name(&s, "default/web:http");
    assert_eq!(web.backends.len(), 1);
    assert_eq!(web.backends[0].addr, ip("10.244.1.5"));
}

/// An endpoint's hints go to its backend, and the Node's zone label to the tables'
/// node, where the datapath reads them.
#[test]
fn topology_hints_and_the_nodes_zone_reach_the_tables() {
    let zoned = |n: &str, zone: &str| -> String {
        two_nodes().replace(
            &format!("    kubernetes.io/hostname: {n}\n"),
            &format!("    kubernetes.io/hostname: {n}\n    topology.kubernetes.io/zone: {zone}\n"),
        )
    };
    let nodes = zoned("node-a", "zone-a");
    let hinted = "- addresses: [\"10.244.1.5\"]\n  nodeName: node-a\n  zone: zone-a\n  conditions: {ready: true}\n  hints:\n    forZones: [{name: zone-a}]\n    forNodes: [{name: node-a}]\n";
    let c = cluster(
        &(nodes
            + &service(
                "web",
                "  clusterIP: 10.96.0.10\n  ports:\n  - {name: http, port: 80}\n  trafficDistribution: PreferSameNode\n",
            )
            + &slice(
                "web-1",
                "web",
                "IPv4",
                "- {name: http, port: 8080, protocol: TCP}\n",
                &(hinted.to_string() + &endpoint("10.244.2.5", "node-b", "ready: true")),
            )),
    );
    let out = compile(&c, "node-a");
    assert_eq!(out.tables.node.zone.as_deref(), Some("zone-a"));
    let web = by_name(&out.tables.services, "default/web:http");
    assert_eq!(web.backends[0].hints.zones, ["zone-a"]);
    assert_eq!(web.backends[0].hints.nodes, ["node-a"]);
    assert!(web.backends[1].hints.is_empty());
    assert_eq!(
        compile(&c, "node-b").tables.node.zone,
        None,
        "node-b has no zone label"
    );
}

/// One Service port number with two protocols (DNS on TCP and UDP 53) is two tables
/// entries, two frontends on the same address and port.
#[test]
fn one_port_number_with_two_protocols_is_two_frontends() {
    let c = cluster(
        &(two_nodes()
            + &service(
                "dns",
                "  clusterIP: 10.96.0.53\n  type: NodePort\n  ports:\n  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 5353, nodePort: 30053}\n  - {name: dns, port: 53, protocol: UDP, targetPort: 5353, nodePort: 30053}\n",
            )
            + &slice(
                "dns-1",
                "dns",
                "IPv4",
                "- {name: dns-tcp, port: 5353, protocol: TCP}\n- {name: dns, port: 5353, protocol: UDP}\n",
                &endpoint("10.244.1.5", "node-a", "ready: true"),
            )),
    );
    let out = compile(&c, "node-a");
    let s = &out.tables.services;
    let tcp = by_name(s, "default/dns:dns-tcp");
    let udp = by_name(s, "default/dns:dns");
    assert_eq!(
        (tcp.proto.as_str(), tcp.port, tcp.node_port),
        ("tcp", 53, Some(30053))
    );
    assert_eq!(
        (udp.proto.as_str(), udp.port, udp.node_port),
        ("udp", 53, Some(30053))
    );
    assert_eq!(tcp.backends.len(), 1);
    assert_eq!(udp.backends.len(), 1);
    let t = &out.compiled.services;
    assert!(t.is_frontend(ferry_datapath::proto::TCP, ip("10.96.0.53"), 53));
    assert!(t.is_frontend(ferry_datapath::proto::UDP, ip("10.96.0.53"), 53));
}
