//! A node port whose endpoint is on another node, reached from outside the cluster with
//! the client's address kept (the load balancer case of the Calico report in
//! `shared/reference`), meeting the overlay's smaller MTU (the case of the Antrea report):
//!
//! - TCP that reaches the node coalesced, larger than any MTU on the way (what a NIC's
//!   GRO or RSC hands the host; here the client's own TSO across veth and a bridge), is
//!   cut into segments that fit the overlay, never into IP fragments;
//! - a client's datagram with DF that does not fit the overlay is answered with
//!   "fragmentation needed" naming the client's own packet (the node port, not the
//!   endpoint it was translated to), so the client's path MTU discovery works;
//! - a router's "fragmentation needed" about the endpoint's reply, which the ingress
//!   node translated back, reaches the endpoint's pod on the other node, so the pod's
//!   path MTU discovery works too.
//!
//! Needs root, iproute2, tshark and python3.

mod common;

use std::fs;
use std::path::Path;

use common::Lab;

/// Node `n`'s tables: the uplink on the fabric, the other node as overlay peer, the
/// routes to the far client's subnet behind the router 192.168.77.100, and node ports
/// 30100 (TCP) and 30101 (UDP) to the pod 10.244.2.5 on node 2. Node 2 has the pod.
fn tables(n: u8) -> String {
    let peer = 3 - n;
    let pod = if n == 2 {
        r#"
  - name: pod-a
    kind: pod
    mac: "ee:ee:ee:ee:ee:ee"
    peer_mac: "0a:58:0a:f4:02:05"
    addresses: [10.244.2.5]
    gso: true"#
    } else {
        ""
    };
    format!(
        r#"
node: {{ name: node{n}, addresses: [192.168.77.{n}] }}
ports:
  - {{ name: uplink, kind: uplink, mac: "02:fe:00:00:00:0{n}", mtu: 1500, addresses: [192.168.77.{n}/24] }}{pod}
routes:
  - {{ prefix: 192.168.88.0/24, port: uplink, via: 192.168.77.100 }}
overlay: {{ vni: 4096, mode: always, uplink: uplink }}
nodes:
  - {{ name: node{peer}, address: 192.168.77.{peer}, pod_cidrs: [10.244.{peer}.0/24] }}
services:
  - name: default/sink:tcp
    proto: tcp
    port: 7100
    node_port: 30100
    backends:
      - {{ addr: 10.244.2.5, port: 7100, node: node2 }}
  - name: default/sink:udp
    proto: udp
    port: 7101
    node_port: 30101
    backends:
      - {{ addr: 10.244.2.5, port: 7101, node: node2 }}
"#
    )
}

/// The pod's UDP server, its datagrams sent with DF (path MTU discovery on): a datagram
/// `send N` is answered with N bytes, or with `emsgsize` when the pod's kernel already
/// knows that N bytes do not fit the path back; any other datagram is echoed.
const UDP_SERVER: &str = r#"
import errno, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO
s.bind(("0.0.0.0", 7101))
while True:
    data, peer = s.recvfrom(65535)
    try:
        if data.startswith(b"send "):
            s.sendto(bytes(int(data[5:])), peer)
        else:
            s.sendto(data, peer)
    except OSError as e:
        if e.errno != errno.EMSGSIZE:
            raise
        s.sendto(b"emsgsize", peer)
"#;

/// The client of the DF datagrams: with path MTU discovery on, sends 1472-byte datagrams
/// (they fit its own link) to HOST:PORT until its kernel refuses them (EMSGSIZE: an
/// ICMP "fragmentation needed" for its socket arrived), then prints the path MTU its
/// kernel learnt and the length of the echo of a 1422-byte datagram.
const DF_CLIENT: &str = r#"
import errno, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO
s.connect((sys.argv[1], int(sys.argv[2])))
s.settimeout(1)
refused = False
for _ in range(8):
    try:
        s.send(b"x" * 1472)
        s.recv(65535)
        print("a 1472-byte datagram came back whole")
        sys.exit(1)
    except socket.timeout:
        continue
    except OSError as e:
        if e.errno != errno.EMSGSIZE:
            raise
        refused = True
        break
if not refused:
    print("no fragmentation needed arrived")
    sys.exit(1)
mtu = s.getsockopt(socket.IPPROTO_IP, 14)  # IP_MTU
s.settimeout(3)
s.send(b"y" * 1422)
print(mtu, len(s.recv(65535)))
"#;

/// The far client, behind a link of MTU 1000: asks HOST:PORT for 1400-byte datagrams
/// until the answer is `emsgsize` (the server's kernel learnt the path MTU) and prints
/// it, or fails after 8 tries.
const FAR_CLIENT: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((sys.argv[1], int(sys.argv[2])))
s.settimeout(1)
for _ in range(8):
    s.send(b"send 1400")
    try:
        r = s.recv(65535)
    except socket.timeout:
        continue
    print(r.decode() if r == b"emsgsize" else f"{len(r)} bytes")
    sys.exit(0)
print("no answer")
sys.exit(1)
"#;

/// The fabric bridge with both nodes, a client (192.168.77.50) and a router
/// (192.168.77.100) on it; behind the router, on a link of MTU 1000, the far client
/// 192.168.88.100. ferry runs on both nodes, the pod on node 2 serves TCP 7100 and UDP
/// 7101 (the TCP server logs to `DIR/server.log`).
fn topology(tag: &str, dir: &Path) -> Lab {
    common::require(&[
        ("ip", "iproute2"),
        ("ss", "iproute2"),
        ("tshark", "tshark"),
        ("python3", "python3"),
    ]);
    let mut lab = Lab::new(tag);
    for ns in ["fab", "n1", "n2", "p2a", "cl", "rt", "far"] {
        lab.add_ns(ns);
    }
    lab.fabric(
        "fab",
        &[
            ("n1", "up1", "f1"),
            ("n2", "up2", "f2"),
            ("cl", "eth0", "fc"),
            ("rt", "r1", "fr"),
        ],
    );
    for n in [1, 2] {
        let mac = format!("02:fe:00:00:00:0{n}");
        lab.ip(
            &format!("n{n}"),
            &["link", "set", &format!("up{n}"), "address", &mac],
        );
    }
    lab.ip("cl", &["addr", "add", "192.168.77.50/24", "dev", "eth0"]);
    lab.ip("rt", &["addr", "add", "192.168.77.100/24", "dev", "r1"]);
    lab.veth("far", "eth0", "rt", "r0");
    for (ns, dev) in [("far", "eth0"), ("rt", "r0")] {
        lab.ip(ns, &["link", "set", dev, "mtu", "1000"]);
    }
    lab.ip("rt", &["addr", "add", "192.168.88.1/24", "dev", "r0"]);
    lab.run("rt", 5, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    lab.ip("far", &["addr", "add", "192.168.88.100/24", "dev", "eth0"]);
    lab.ip("far", &["route", "add", "default", "via", "192.168.88.1"]);

    lab.ferry_node("n1", dir, &tables(1), &["uplink=af-packet:up1".to_string()]);
    let pod = lab.ns("p2a");
    let attach = [
        "uplink=af-packet:up2".to_string(),
        format!("pod-a=pod:{pod}"),
    ];
    lab.ferry_node("n2", dir, &tables(2), &attach);
    lab.wait_pod("p2a");

    let (tcp, udp) = (dir.join("tcp_server.py"), dir.join("udp_server.py"));
    fs::write(&tcp, common::TCP_SINK).unwrap();
    fs::write(&udp, UDP_SERVER).unwrap();
    let log = dir.join("server.log");
    let tcp_cmd = [
        "python3",
        tcp.to_str().unwrap(),
        "7100",
        log.to_str().unwrap(),
    ];
    lab.daemon("p2a", "tcp server", &tcp_cmd);
    lab.daemon("p2a", "udp server", &["python3", udp.to_str().unwrap()]);
    lab.wait_for(5, "the servers listening on 7100 and 7101", |l| {
        let ss = String::from_utf8_lossy(&l.exec("p2a", 2, &["ss", "-Hlntu"]).stdout).into_owned();
        ss.contains(":7101 ") && ss.contains(":7100 ")
    });
    lab
}

/// Runs `script` with `args` in namespace `ns` and returns what it printed.
fn python(lab: &Lab, dir: &Path, ns: &str, script: (&str, &str), args: &[&str]) -> String {
    let path = dir.join(script.0);
    fs::write(&path, script.1).unwrap();
    let mut cmd = vec!["python3", path.to_str().unwrap()];
    cmd.extend_from_slice(args);
    lab.run(ns, 40, &cmd).trim().to_string()
}

/// The client's TCP reaches node 1 coalesced (frames far larger than the fabric's MTU:
/// veth and the bridge carry the client's TSO super-packets whole, as a NIC with GRO
/// would hand them to the host), through the node port to the pod on node 2: every
/// byte and the FIN arrive, the pod sees the client's address, the overlay carries only
/// segments that fit its MTU (1450) and no IP fragment, and nothing was INVALID.
#[test]
fn coalesced_tcp_through_a_node_port_crosses_the_overlay_as_segments() {
    let dir = tempfile::tempdir().unwrap();
    let mut lab = topology("nm", dir.path());
    let (into_n1, wire) = (dir.path().join("f1.pcap"), dir.path().join("f2.pcap"));
    lab.capture("fab", "tshark towards node 1", "f1", &into_n1);
    lab.capture("fab", "tshark towards node 2", "f2", &wire);

    let out = python(
        &lab,
        dir.path(),
        "cl",
        ("tcp_client.py", common::TCP_SEND),
        &["192.168.77.1", "30100", "8000000"],
    );
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words.len(), 4, "the client's output: {out}");
    assert_eq!(
        (words[2], words[3]),
        (words[0], words[1]),
        "what the pod received through the node port, against what was sent"
    );
    let logged = fs::read_to_string(dir.path().join("server.log")).unwrap();
    assert!(
        logged.starts_with("192.168.77.50 8000000 "),
        "the pod saw the client's address: {logged}"
    );
    lab.stop_capture("tshark towards node 1", &into_n1);
    lab.stop_capture("tshark towards node 2", &wire);

    // The precondition: node 1 was handed coalesced frames.
    let coalesced = common::tshark_fields(
        &into_n1,
        "ip.dst == 192.168.77.1 && tcp.dstport == 30100 && frame.len > 1514",
        "frame.len",
    );
    assert!(
        coalesced.len() > 20,
        "coalesced TCP frames handed to node 1: {}",
        coalesced.len()
    );
    // On node 2's side of the fabric: VXLAN carrying the stream, each inner packet
    // within the overlay's MTU, nothing fragmented, inside or out.
    let inner = common::tshark_fields(&wire, "vxlan && tcp.dstport == 7100", "ip.len");
    assert!(inner.len() > 1000, "segments in VXLAN: {}", inner.len());
    let too_big: Vec<&String> = inner
        .iter()
        .filter(|l| {
            let len = l
                .rsplit(',')
                .next()
                .and_then(|v| v.trim().parse::<u32>().ok());
            len.is_none_or(|v| v > 1450)
        })
        .collect();
    assert!(
        too_big.is_empty(),
        "inner packets larger than the overlay's MTU (outer,inner): {:?}",
        &too_big[..too_big.len().min(5)]
    );
    eprintln!(
        "{} coalesced frames into node 1, {} segments in VXLAN",
        coalesced.len(),
        inner.len()
    );
    let fragments = common::tshark_fields(
        &wire,
        "ip.flags.mf == 1 || ip.frag_offset > 0",
        "frame.number",
    );
    assert!(
        fragments.is_empty(),
        "IP fragments on the wire: {fragments:?}"
    );
    for node in ["n1", "n2"] {
        let (_, line) = lab.stop_ferry(node);
        assert!(!line.contains("ct_invalid"), "{node}: {line}");
    }
}

/// Path MTU discovery through the node port, both ways. The client's DF datagram to
/// node 1's node port does not fit the overlay to node 2: node 1 answers "fragmentation
/// needed" with the overlay's MTU about the client's own datagram (to the node port),
/// and the client's kernel takes it. A router between node 1 and a far client has a
/// smaller MTU than the pod's reply: its "fragmentation needed", sent to the node port
/// address the reply came from, reaches the pod on node 2 translated back, and the
/// pod's kernel takes it.
#[test]
fn fragmentation_needed_through_a_node_port_reaches_both_ends() {
    let dir = tempfile::tempdir().unwrap();
    let mut lab = topology("nf", dir.path());
    let at_client = dir.path().join("fc.pcap");
    lab.capture("fab", "tshark towards the client", "fc", &at_client);

    let out = python(
        &lab,
        dir.path(),
        "cl",
        ("df_client.py", DF_CLIENT),
        &["192.168.77.1", "30101"],
    );
    assert_eq!(out, "1450 1422", "the client's path MTU and its echo");
    lab.stop_capture("tshark towards the client", &at_client);
    let icmp = common::tshark_fields(
        &at_client,
        "icmp.type == 3 && icmp.code == 4 && ip.src == 192.168.77.1",
        "udp.dstport",
    );
    assert!(
        !icmp.is_empty(),
        "no fragmentation needed from node 1 reached the client"
    );
    assert!(
        icmp.iter().all(|p| p.trim() == "30101"),
        "the errors must name the client's datagram to the node port: {icmp:?}"
    );
    let mtus = common::tshark_fields(&at_client, "icmp.type == 3 && icmp.code == 4", "icmp.mtu");
    assert!(mtus.iter().all(|m| m.trim() == "1450"), "{mtus:?}");

    let out = python(
        &lab,
        dir.path(),
        "far",
        ("far_client.py", FAR_CLIENT),
        &["192.168.77.1", "30101"],
    );
    assert_eq!(
        out, "emsgsize",
        "the pod's answer once its kernel knew the path MTU"
    );
    let route = lab.ip("p2a", &["route", "get", "192.168.88.100"]);
    assert!(
        route.contains("mtu 1000"),
        "the pod's path MTU to the far client: {route}"
    );
    for node in ["n1", "n2"] {
        let (_, line) = lab.stop_ferry(node);
        assert!(!line.contains("ct_invalid"), "{node}: {line}");
    }
}
