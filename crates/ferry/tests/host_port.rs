//! The host port: a TAP that gives the node's own kernel stack its address through ferry,
//! so that host-networked processes reach pods and are reached from outside the node.

mod common;

use common::Lab;

/// Node 1 owns the wire (uplink) and 192.168.77.1; its kernel gets that address on the
/// host TAP and reaches everything through ferry, whose host port answers for the
/// link-local gateway.
fn tables(host_tap_mac: &str) -> String {
    format!(
        r#"
node: {{ name: node1, addresses: [192.168.77.1] }}
ports:
  - {{ name: uplink, kind: uplink, mac: "02:fe:00:00:00:01", addresses: [192.168.77.1/24] }}
  - name: pod-a
    kind: pod
    mac: "ee:ee:ee:ee:ee:ee"
    peer_mac: "0a:58:0a:f4:01:05"
    addresses: [10.244.1.5]
    gso: true
  - {{ name: host, kind: host, mac: "02:fe:00:00:00:fe", addresses: [169.254.1.1] }}
routes:
  - {{ prefix: 192.168.77.1/32, port: host, next_hop_mac: "{host_tap_mac}" }}
"#
    )
}

/// A lab tagged `tag`: node 1, the outside `ext` on a veth wire from node 1's uplink
/// (up1, with the uplink port's MAC), and pod a's namespace.
fn wired(tag: &str) -> (Lab, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut lab = Lab::new(tag);
    for ns in ["n1", "ext", "p1a"] {
        lab.add_ns(ns);
    }
    lab.veth("n1", "up1", "ext", "eth0");
    lab.ip(
        "n1",
        &["link", "set", "up1", "address", "02:fe:00:00:00:01"],
    );
    (lab, dir)
}

/// The MAC of node 1's host TAP, as its kernel has it.
const HOST_MAC: &str = "02:aa:00:00:00:01";

/// Starts ferry on node 1 with `tables` (the uplink on up1, pod-a in p1a, the host port
/// on a TAP) and gives the node's kernel its address on the host TAP, everything else
/// through ferry.
fn start_node1(lab: &mut Lab, dir: &std::path::Path, tables: &str) {
    let tap = format!("{}h", lab.prefix);
    let pod = lab.ns("p1a");
    let attach = [
        "uplink=af-packet:up1".to_string(),
        format!("pod-a=pod:{pod}"),
        format!("host=tap:{tap}"),
    ];
    lab.ferry_node("n1", dir, tables, &attach);
    let tap_c = tap.clone();
    lab.wait_for(10, "the host TAP", |l| {
        l.exec("n1", 2, &["ip", "link", "show", &tap_c])
            .status
            .success()
    });
    lab.ip("n1", &["link", "set", &tap, "address", HOST_MAC, "up"]);
    lab.ip("n1", &["addr", "add", "192.168.77.1/32", "dev", &tap]);
    lab.ip(
        "n1",
        &["route", "add", "169.254.1.1", "dev", &tap, "scope", "link"],
    );
    lab.ip(
        "n1",
        &["route", "add", "default", "via", "169.254.1.1", "dev", &tap],
    );
}

#[test]
fn host_processes_reach_pods_and_are_reached_from_outside() {
    common::require(&[
        ("ip", "iproute2"),
        ("ping", "iputils-ping"),
        ("nc", "netcat-openbsd"),
    ]);
    let (mut lab, dir) = wired("hp");
    lab.ip("ext", &["addr", "add", "192.168.77.100/24", "dev", "eth0"]);
    lab.ip(
        "ext",
        &["route", "add", "10.244.1.0/24", "via", "192.168.77.1"],
    );

    start_node1(&mut lab, dir.path(), &tables(HOST_MAC));

    // Host to pod, pod to host, outside to host.
    lab.ping("n1", "10.244.1.5", 56, 3);
    lab.ping("p1a", "192.168.77.1", 56, 3);
    lab.ping("ext", "192.168.77.1", 1400, 3);
    let data = common::pattern(200_000, 7);
    lab.tcp_transfer(dir.path(), ("n1", "192.168.77.1"), "ext", 7001, &data);
    lab.tcp_transfer(dir.path(), ("p1a", "10.244.1.5"), "n1", 7002, &data);
}

/// Link-local services (docs/datapath.md, "Link-local services"): a cloud's metadata
/// service at 169.254.169.254 behind the uplink's gateway, and a node-local DNS cache at
/// 169.254.20.10 on the node's own stack, each reached because a route names it; a
/// link-local address that only the default route covers is not.
#[test]
fn link_local_services_are_reached_through_the_routes_that_name_them() {
    common::require(&[
        ("ip", "iproute2"),
        ("ping", "iputils-ping"),
        ("nc", "netcat-openbsd"),
        ("python3", "python3"),
    ]);
    let (mut lab, dir) = wired("ll");
    // The gateway, which also serves the metadata address and holds another link-local
    // address that no route of node 1 names. No route back to the pods: their
    // connections must come masqueraded.
    for a in [
        "192.168.77.100/24",
        "169.254.169.254/32",
        "169.254.169.253/32",
    ] {
        lab.ip("ext", &["addr", "add", a, "dev", "eth0"]);
    }

    let tables = format!(
        r#"{}
  - {{ prefix: 0.0.0.0/0, port: uplink, via: 192.168.77.100 }}
  - {{ prefix: 169.254.169.254/32, port: uplink, via: 192.168.77.100 }}
  - {{ prefix: 169.254.20.10/32, port: host, next_hop_mac: "{HOST_MAC}" }}
nat:
  - match: {{ src: 10.244.1.0/24, dst: 169.254.169.254/32 }}
    masquerade: true
"#,
        tables(HOST_MAC).trim_end()
    );
    start_node1(&mut lab, dir.path(), &tables);
    // The node-local cache's address, on the node's own stack (a dummy device on a
    // real node).
    lab.ip("n1", &["link", "set", "lo", "up"]);
    lab.ip("n1", &["addr", "add", "169.254.20.10/32", "dev", "lo"]);
    lab.wait_pod("p1a");

    // The metadata service, from the pod (masqueraded) and from the node's own stack.
    let (sink, send) = (dir.path().join("sink.py"), dir.path().join("send.py"));
    std::fs::write(&sink, common::TCP_SINK).unwrap();
    std::fs::write(&send, common::TCP_SEND).unwrap();
    let log = dir.path().join("metadata.log");
    lab.daemon(
        "ext",
        "metadata service",
        &[
            "python3",
            sink.to_str().unwrap(),
            "80",
            log.to_str().unwrap(),
        ],
    );
    lab.wait_for(5, "the metadata service listening", |l| {
        String::from_utf8_lossy(&l.exec("ext", 2, &["ss", "-Hltn"]).stdout).contains(":80 ")
    });
    for from in ["p1a", "n1"] {
        let out = lab.run(
            from,
            30,
            &[
                "python3",
                send.to_str().unwrap(),
                "169.254.169.254",
                "80",
                "100000",
            ],
        );
        let words: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(words.len(), 4, "from {from}: {out}");
        assert_eq!((words[2], words[3]), (words[0], words[1]), "from {from}");
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    let peers: Vec<&str> = logged.lines().filter_map(|l| l.split(' ').next()).collect();
    assert_eq!(
        peers,
        ["192.168.77.1", "192.168.77.1"],
        "the pod's connection masqueraded, the node's from its own address: {logged}"
    );
    lab.ping("p1a", "169.254.169.254", 56, 2);

    // The node-local cache on the node's own stack, from the pod.
    lab.ping("p1a", "169.254.20.10", 56, 2);
    let data = common::pattern(50_000, 3);
    lab.tcp_transfer(dir.path(), ("n1", "169.254.20.10"), "p1a", 7053, &data);

    // 169.254.169.253 answers on the wire, but only the default route covers it.
    lab.ping("ext", "169.254.169.253", 56, 1);
    for from in ["p1a", "n1"] {
        let out = lab.exec(from, 5, &["ping", "-c", "2", "-W", "1", "169.254.169.253"]);
        assert!(
            !out.status.success(),
            "from {from}, 169.254.169.253 answered: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // Two pings from each: at least four drops (the kernels' multicast listener
    // reports count there too).
    let (_, line) = lab.stop_ferry("n1");
    let dropped = line
        .split("not_forwardable ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(dropped.is_some_and(|n| n >= 4), "{line}");
}
