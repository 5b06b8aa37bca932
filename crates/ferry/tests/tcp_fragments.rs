//! TCP whose segments arrive as IP fragments, the case of the Antrea report in
//! `shared/reference`: a router with a smaller MTU in front of the node fragments a
//! client's segments (the client does not set DF), so ferry sees the segments of an
//! established connection, and of its data, only as fragments. They must be reassembled
//! before conntrack, match the connection (also through a node port's DNAT), arrive
//! whole, and the FIN after them must get through: the server sees the end of the
//! stream and answers. Needs root, iproute2, tshark and python3.

mod common;

use std::fs;
use std::path::Path;

use common::Lab;

/// Node 1: the uplink on the fabric, the client's subnet behind the router
/// 192.168.77.100, one pod, a node port 30100 to the pod's server, and an overlay peer
/// (never reached) that gives the pod the overlay MTU 1450.
const TABLES: &str = r#"
node: { name: node1, addresses: [192.168.77.1] }
ports:
  - { name: uplink, kind: uplink, mac: "02:fe:00:00:00:01", mtu: 1500, addresses: [192.168.77.1/24] }
  - name: pod-a
    kind: pod
    mac: "ee:ee:ee:ee:ee:ee"
    peer_mac: "0a:58:0a:f4:01:05"
    addresses: [10.244.1.5]
    gso: true
routes:
  - { prefix: 192.168.88.0/24, port: uplink, via: 192.168.77.100 }
overlay: { vni: 4096, mode: always, uplink: uplink }
nodes:
  - { name: node2, address: 192.168.77.2, pod_cidrs: [10.244.2.0/24] }
services:
  - name: default/sink:tcp
    proto: tcp
    port: 7100
    node_port: 30100
    backends:
      - { addr: 10.244.1.5, port: 7100 }
"#;

/// The fabric bridge with node 1 and the router on it, the router's second link to the
/// client, ferry on node 1 with its pod, and the pod's server on port 7100.
fn topology(tag: &str, dir: &Path) -> Lab {
    common::require(&[
        ("ip", "iproute2"),
        ("ss", "iproute2"),
        ("tshark", "tshark"),
        ("python3", "python3"),
    ]);
    let mut lab = Lab::new(tag);
    for ns in ["fab", "n1", "p1a", "rt", "ext"] {
        lab.add_ns(ns);
    }
    lab.fabric("fab", &[("n1", "up1", "f1"), ("rt", "r1", "fr")]);
    lab.ip(
        "n1",
        &["link", "set", "up1", "address", "02:fe:00:00:00:01"],
    );
    // The router: MTU 1000 towards the node, 1500 towards the client.
    for (ns, dev) in [("rt", "r1"), ("fab", "fr")] {
        lab.ip(ns, &["link", "set", dev, "mtu", "1000"]);
    }
    lab.ip("rt", &["addr", "add", "192.168.77.100/24", "dev", "r1"]);
    lab.veth("ext", "eth0", "rt", "r0");
    lab.ip("rt", &["addr", "add", "192.168.88.1/24", "dev", "r0"]);
    lab.run("rt", 5, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    lab.ip(
        "rt",
        &["route", "add", "10.244.1.0/24", "via", "192.168.77.1"],
    );
    lab.ip("ext", &["addr", "add", "192.168.88.100/24", "dev", "eth0"]);
    lab.ip("ext", &["route", "add", "default", "via", "192.168.88.1"]);

    let pod = lab.ns("p1a");
    let attach = [
        "uplink=af-packet:up1".to_string(),
        format!("pod-a=pod:{pod}"),
    ];
    lab.ferry_node("n1", dir, TABLES, &attach);
    lab.wait_pod("p1a");

    let script = dir.join("server.py");
    fs::write(&script, common::TCP_SINK).unwrap();
    let log = dir.join("server.log");
    lab.daemon(
        "p1a",
        "tcp server",
        &[
            "python3",
            script.to_str().unwrap(),
            "7100",
            log.to_str().unwrap(),
        ],
    );
    lab.wait_for(5, "the server listening on TCP 7100", |l| {
        String::from_utf8_lossy(&l.exec("p1a", 2, &["ss", "-Hltn"]).stdout).contains(":7100 ")
    });
    lab
}

/// Sends `size` bytes from the client to `addr:port`; requires the server's answer to
/// name exactly what was sent (so every byte and the FIN arrived), and returns the line
/// the server logged for it.
fn transfer(lab: &Lab, dir: &Path, addr: &str, port: u16, size: usize) -> String {
    let script = dir.join("client.py");
    fs::write(&script, common::TCP_SEND).unwrap();
    let log = dir.join("server.log");
    let before = fs::read_to_string(&log).unwrap_or_default().lines().count();
    let (p, n) = (port.to_string(), size.to_string());
    let out = lab.run(
        "ext",
        40,
        // Path MTU discovery off: the router may fragment the client's segments.
        &["python3", script.to_str().unwrap(), addr, &p, &n, "no-df"],
    );
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(
        words.len(),
        4,
        "the client's output (size, SHA-256, the server's length and SHA-256): {out}"
    );
    assert_eq!(
        (words[2], words[3]),
        (words[0], words[1]),
        "the server's count of what arrived through {addr}:{port}, against what was sent"
    );
    let logged = fs::read_to_string(&log).unwrap();
    logged
        .lines()
        .nth(before)
        .unwrap_or_else(|| panic!("the server logged nothing new: {logged}"))
        .to_string()
}

/// TCP data that reaches the node only as fragments, to the pod directly and through a
/// node port (DNAT in conntrack, on the reassembled segments): every byte and the FIN
/// arrive, the pod sees the client's own address, and ferry found no packet INVALID.
#[test]
fn tcp_segments_arriving_as_fragments_are_tracked_and_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let mut lab = topology("tf", dir.path());
    let wire = dir.path().join("router.pcap");
    lab.capture("rt", "tshark on the router", "r1", &wire);

    let direct = transfer(&lab, dir.path(), "10.244.1.5", 7100, 2_000_000);
    assert!(
        direct.starts_with("192.168.88.100 2000000 "),
        "at the pod: {direct}"
    );
    let node_port = transfer(&lab, dir.path(), "192.168.77.1", 30100, 2_000_000);
    assert!(
        node_port.starts_with("192.168.88.100 2000000 "),
        "at the pod, through the node port: {node_port}"
    );

    lab.stop_capture("tshark on the router", &wire);
    // The precondition, so that the test cannot pass without fragments: the client's
    // TCP segments reached the node as fragments, to both destinations.
    for dst in ["10.244.1.5", "192.168.77.1"] {
        let filter = format!(
            "ip.src == 192.168.88.100 && ip.dst == {dst} && ip.proto == 6 && ip.flags.mf == 1"
        );
        let first_fragments = common::tshark_fields(&wire, &filter, "ip.id").len();
        assert!(
            first_fragments > 500,
            "TCP segments to {dst} that the router fragmented: {first_fragments}"
        );
    }
    let (_, line) = lab.stop_ferry("n1");
    assert!(
        !line.contains("ct_invalid"),
        "ferry found packets of the connections INVALID: {line}"
    );
}
