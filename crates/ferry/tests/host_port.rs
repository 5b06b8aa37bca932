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

#[test]
fn host_processes_reach_pods_and_are_reached_from_outside() {
    common::require(&[
        ("ip", "iproute2"),
        ("ping", "iputils-ping"),
        ("nc", "netcat-openbsd"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let mut lab = Lab::new("hp");
    for ns in ["n1", "ext", "p1a"] {
        lab.add_ns(ns);
    }
    lab.veth("n1", "up1", "ext", "eth0");
    lab.ip(
        "n1",
        &["link", "set", "up1", "address", "02:fe:00:00:00:01"],
    );
    lab.ip("ext", &["addr", "add", "192.168.77.100/24", "dev", "eth0"]);
    lab.ip(
        "ext",
        &["route", "add", "10.244.1.0/24", "via", "192.168.77.1"],
    );

    let tap = format!("{}h", lab.prefix);
    let host_mac = "02:aa:00:00:00:01";
    let pod = lab.ns("p1a");
    let attach = [
        "uplink=af-packet:up1".to_string(),
        format!("pod-a=pod:{pod}"),
        format!("host=tap:{tap}"),
    ];
    lab.ferry_node("n1", dir.path(), &tables(host_mac), &attach);
    let tap_c = tap.clone();
    lab.wait_for(10, "the host TAP", |l| {
        l.exec("n1", 2, &["ip", "link", "show", &tap_c])
            .status
            .success()
    });
    // The node's kernel: its address on the host TAP, everything else through ferry.
    lab.ip("n1", &["link", "set", &tap, "address", host_mac, "up"]);
    lab.ip("n1", &["addr", "add", "192.168.77.1/32", "dev", &tap]);
    lab.ip(
        "n1",
        &["route", "add", "169.254.1.1", "dev", &tap, "scope", "link"],
    );
    lab.ip(
        "n1",
        &["route", "add", "default", "via", "169.254.1.1", "dev", &tap],
    );

    // Host to pod, pod to host, outside to host.
    lab.ping("n1", "10.244.1.5", 56, 3);
    lab.ping("p1a", "192.168.77.1", 56, 3);
    lab.ping("ext", "192.168.77.1", 1400, 3);
    let data = common::pattern(200_000, 7);
    lab.tcp_transfer(dir.path(), ("n1", "192.168.77.1"), "ext", 7001, &data);
    lab.tcp_transfer(dir.path(), ("p1a", "10.244.1.5"), "n1", 7002, &data);
}
