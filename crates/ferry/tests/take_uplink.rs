//! `ferry agent --take-uplink` on a node set up the way a cloud VM is: its address and
//! routes on its uplink `eth0`, a default route through a gateway, and a TCP session from
//! outside standing in for SSH and kubelet's connection to the API server, IPv6's
//! default route through the router's link-local address. The agent,
//! given no `--uplink`, finds the uplink by the Node's InternalIP, moves the node's
//! stack onto its host TAP, and the session carries data all along: through the
//! takeover, a crash of the agent and its successor taking the stack up again, a
//! handover to a third agent, and the stop that gives the node back exactly as it was.
//!
//! Pods made through the CNI plugin reach each other, the node reaches them, and a
//! NodePort of one answers from outside on the node's address, through each of those
//! steps. The agent runs with `--cleanup-legacy`, and removes the kube-proxy chain and
//! flannel device left on the node.
//!
//! Needs root, iproute2, iptables, python3 and curl.

mod common;

use std::fs;
use std::time::Duration;

use common::{ECHO_SERVER, Lab, SESSION_CLIENT, require};
use serde_json::Value;

const NODE: &str = r#"
apiVersion: v1
kind: Node
metadata: { name: vm }
spec: { podCIDR: 10.244.5.0/24, podCIDRs: [10.244.5.0/24] }
status:
  addresses:
  - { type: InternalIP, address: 10.0.0.5 }
  - { type: InternalIP, address: "2001:db8::5" }
"#;

/// What the node's kernel has: the uplink's addresses, and the routes of both families
/// in every table, sorted, without what changes by itself (lifetimes, preferences).
fn node_stack(lab: &Lab) -> (Vec<String>, Vec<String>) {
    let addrs: Value =
        serde_json::from_str(&lab.ip("vm", &["-j", "address", "show", "dev", "eth0"])).unwrap();
    let mut a: Vec<String> = addrs[0]["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["scope"] == "global")
        .map(|a| format!("{}/{} brd {}", a["local"], a["prefixlen"], a["broadcast"]))
        .collect();
    a.sort();
    let mut r = Vec::new();
    for family in ["-4", "-6"] {
        let routes: Value =
            serde_json::from_str(&lab.ip("vm", &["-j", family, "route", "show", "table", "all"]))
                .unwrap();
        for mut route in routes.as_array().unwrap().iter().cloned() {
            // The uplink's own link-local address, which is not moved, may still be
            // tentative when the first look is taken.
            if route["dst"]
                .as_str()
                .is_some_and(|d| d.starts_with("fe80::"))
                && route["table"] == "local"
            {
                continue;
            }
            for volatile in ["expires", "pref"] {
                route.as_object_mut().unwrap().remove(volatile);
            }
            r.push(route.to_string());
        }
    }
    r.sort();
    (a, r)
}

/// What `curl URL` in namespace `ns` gets (empty when it fails).
fn fetch(lab: &Lab, ns: &str, url: &str) -> String {
    let out = lab.exec(ns, 3, &["curl", "-sf", "--max-time", "2", url]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Pods `a` and `b` on the node, and the NodePort Service `web` (node port 30080) whose
/// endpoint is b at `b_ip`.
fn service(b_ip: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{ name: a, namespace: default }}
spec: {{ nodeName: vm, containers: [{{ name: c, image: x }}] }}
status: {{ phase: Running }}
---
apiVersion: v1
kind: Pod
metadata: {{ name: b, namespace: default, labels: {{ app: web }} }}
spec: {{ nodeName: vm, containers: [{{ name: c, image: x }}] }}
status: {{ phase: Running, podIP: {b_ip}, podIPs: [{{ ip: {b_ip} }}] }}
---
apiVersion: v1
kind: Service
metadata: {{ name: web, namespace: default }}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  selector: {{ app: web }}
  ports: [{{ port: 80, targetPort: 8080, nodePort: 30080 }}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {{ kubernetes.io/service-name: web }}
addressType: IPv4
ports: [{{ port: 8080 }}]
endpoints: [{{ addresses: ["{b_ip}"], nodeName: vm, conditions: {{ ready: true }} }}]
"#
    )
}

/// True when `cmd` succeeds in namespace `ns` within 3 s.
fn ok(lab: &Lab, ns: &str, cmd: &[&str]) -> bool {
    lab.exec(ns, 3, cmd).status.success()
}

#[test]
fn the_node_keeps_its_network_through_the_takeover_a_crash_and_the_give_back() {
    require(&[
        ("ip", "iproute2"),
        ("iptables-nft", "iptables"),
        ("python3", "python3"),
        ("curl", "curl"),
    ]);
    let mut lab = Lab::new("tu");
    for ns in ["vm", "gw", "ext", "pa", "pb"] {
        lab.add_ns(ns);
    }
    lab.veth("vm", "eth0", "gw", "gw0");
    lab.veth("ext", "eth0", "gw", "gw1");
    lab.run("gw", 5, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    lab.run(
        "gw",
        5,
        &["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"],
    );
    for (ns, args) in [
        ("gw", vec!["address", "add", "10.0.0.1/24", "dev", "gw0"]),
        (
            "gw",
            vec!["address", "add", "2001:db8::1/64", "dev", "gw0", "nodad"],
        ),
        (
            "gw",
            vec!["address", "add", "192.168.100.1/24", "dev", "gw1"],
        ),
        (
            "gw",
            vec![
                "address",
                "add",
                "2001:db8:100::1/64",
                "dev",
                "gw1",
                "nodad",
            ],
        ),
        (
            "ext",
            vec!["address", "add", "192.168.100.2/24", "dev", "eth0"],
        ),
        (
            "ext",
            vec![
                "address",
                "add",
                "2001:db8:100::2/64",
                "dev",
                "eth0",
                "nodad",
            ],
        ),
        (
            "ext",
            vec!["route", "add", "default", "via", "192.168.100.1"],
        ),
        (
            "ext",
            vec!["route", "add", "default", "via", "2001:db8:100::1"],
        ),
        // The VM: an address with its broadcast, a default route as DHCP would give
        // it, a route of another table, a static route and a permanent neighbour.
        (
            "vm",
            vec!["address", "add", "10.0.0.5/24", "brd", "+", "dev", "eth0"],
        ),
        (
            "vm",
            vec!["address", "add", "2001:db8::5/64", "dev", "eth0", "nodad"],
        ),
        (
            "vm",
            vec![
                "route", "add", "default", "via", "10.0.0.1", "proto", "dhcp", "metric", "100",
            ],
        ),
        (
            "vm",
            vec![
                "route",
                "add",
                "172.16.0.0/12",
                "via",
                "10.0.0.1",
                "table",
                "100",
            ],
        ),
        (
            "vm",
            vec![
                "route",
                "add",
                "198.51.100.0/24",
                "via",
                "10.0.0.1",
                "proto",
                "static",
            ],
        ),
        (
            "vm",
            vec![
                "neigh",
                "add",
                "10.0.0.77",
                "lladdr",
                "02:00:00:00:00:77",
                "dev",
                "eth0",
                "nud",
                "permanent",
            ],
        ),
    ] {
        lab.ip(ns, &args);
    }
    // IPv6's default route through the router's link-local address, as a router
    // advertisement gives it.
    let mut router = String::new();
    lab.wait_for(10, "the gateway's link-local address", |l| {
        let a = l.ip(
            "gw",
            &[
                "-6", "-br", "address", "show", "dev", "gw0", "scope", "link",
            ],
        );
        if a.contains("tentative") {
            return false;
        }
        router = a
            .split_whitespace()
            .nth(2)
            .unwrap_or("")
            .trim_end_matches("/64")
            .to_string();
        router.starts_with("fe80::")
    });
    lab.ip(
        "vm",
        &[
            "route", "add", "default", "via", &router, "dev", "eth0", "metric", "1024",
        ],
    );
    lab.daemon("vm", "echo server", &["python3", "-c", ECHO_SERVER]);
    lab.daemon(
        "vm",
        "web server",
        &["python3", "-m", "http.server", "-b", "::", "8080"],
    );
    lab.wait_for(10, "the node's servers", |l| {
        ok(
            l,
            "ext",
            &["curl", "-sf", "-o", "/dev/null", "http://10.0.0.5:8080/"],
        ) && ok(
            l,
            "ext",
            &[
                "python3",
                "-c",
                "import socket; socket.create_connection(('10.0.0.5', 2222), 2)",
            ],
        )
    });
    let before = node_stack(&lab);
    // What kube-proxy and flannel left, for --cleanup-legacy to remove.
    lab.run(
        "vm",
        5,
        &[
            "sh",
            "-ec",
            "iptables-nft -t nat -N KUBE-SERVICES
             iptables-nft -t nat -A OUTPUT -j KUBE-SERVICES
             ip link add flannel.1 type vxlan id 1 dstport 8472 dev eth0",
        ],
    );

    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("cluster");
    fs::create_dir(&manifests).unwrap();
    fs::write(manifests.join("node.yaml"), NODE).unwrap();
    let state = dir.path().join("state");
    let (datastore, socket) = (
        format!("file:{}", manifests.display()),
        dir.path().join("ferry.sock").display().to_string(),
    );
    let agent: Vec<&str> = vec![
        env!("CARGO_BIN_EXE_ferry"),
        "agent",
        "--node",
        "vm",
        "--datastore",
        &datastore,
        "--take-uplink",
        "--cleanup-legacy",
        "--state-dir",
        state.to_str().unwrap(),
        "--api-socket",
        &socket,
        "--healthz-addr",
        "off",
    ];
    // The session runs across everything below, and must not break (a daemon: the waits
    // below fail at once if it ends).
    let stop_file = dir.path().join("session.stop");
    lab.daemon(
        "ext",
        "session",
        &[
            "python3",
            "-c",
            SESSION_CLIENT,
            "10.0.0.5",
            "2222",
            stop_file.to_str().unwrap(),
        ],
    );
    std::thread::sleep(Duration::from_secs(1));

    lab.daemon("vm", "agent", &agent);
    let on_tap = |l: &Lab| {
        let a = l.exec("vm", 2, &["ip", "-br", "address", "show", "dev", "ferry0"]);
        String::from_utf8_lossy(&a.stdout).contains("10.0.0.5/24")
    };
    lab.wait_for(15, "the node's address on ferry0", on_tap);
    let nat = lab.run("vm", 5, &["iptables-nft-save", "-t", "nat"]);
    assert!(!nat.contains("KUBE-SERVICES"), "{nat}");
    assert!(!lab.ip("vm", &["-br", "link"]).contains("flannel.1"));
    let eth0 = lab.ip("vm", &["-br", "address", "show", "dev", "eth0"]);
    assert!(
        !eth0.contains("10.0.0.5") && !eth0.contains("2001:db8::5"),
        "{eth0}"
    );
    let record: Value =
        serde_json::from_slice(&fs::read(state.join("uplink.json")).unwrap()).unwrap();
    assert_eq!(record["uplink"], "eth0", "{record}");
    let routes = lab.ip("vm", &["route", "show"]);
    assert!(
        routes.contains("default via 169.254.1.1 dev ferry0 proto dhcp metric 100")
            && routes.contains("198.51.100.0/24 via 169.254.1.1 dev ferry0 proto static"),
        "{routes}"
    );
    let table100 = lab.ip("vm", &["route", "show", "table", "100"]);
    assert!(
        table100.contains("172.16.0.0/12 via 169.254.1.1 dev ferry0"),
        "{table100}"
    );

    // New connections, both ways and both families, through ferry.
    let new_connections = |l: &Lab| {
        ["http://10.0.0.5:8080/", "http://[2001:db8::5]:8080/"]
            .iter()
            .all(|url| ok(l, "ext", &["curl", "-sf", "-o", "/dev/null", url]))
            && ["192.168.100.2", "2001:db8:100::2"]
                .iter()
                .all(|to| ok(l, "vm", &["ping", "-c", "1", "-W", "2", to]))
    };
    lab.wait_for(
        10,
        "new connections to and from the taken node",
        new_connections,
    );

    // Pods made through the CNI plugin, as a container runtime makes them, and a
    // NodePort Service to one of them: pod to pod, the node to a pod, and from outside
    // through the node's own address, which ferry now holds.
    let b = common::cni_pods(&lab, &socket, &dir.path().join("cni"))[1].clone();
    fs::write(manifests.join("service.yaml"), service(&b)).unwrap();
    lab.daemon(
        "pb",
        "pod b's server",
        &[
            env!("CARGO_BIN_EXE_ferry"),
            "serve",
            "--name",
            "b",
            "--udp-port",
            "0",
        ],
    );
    let pods_reached = |l: &Lab| {
        let url = format!("http://{b}:8080/hostname");
        fetch(l, "pa", &url) == "b"
            && fetch(l, "vm", &url) == "b"
            && fetch(l, "ext", "http://10.0.0.5:30080/hostname") == "b"
    };
    lab.wait_for(15, "the pods, and the NodePort from outside", pods_reached);

    // A crash: the host TAP goes with the agent, and the node's stack with it; the next
    // agent takes the stack up again from the record.
    let log = lab.kill("agent");
    assert!(
        log.contains("the node's own stack is on the host TAP")
            && log.contains("--cleanup-legacy: removed")
            && log.contains("vxlan device flannel.1"),
        "{log}"
    );
    // What the annotations would say; the file datastore is not written.
    assert!(
        log.contains("the file datastore is not written")
            && log.contains("\"ferry.io/ipv4-gateway\": \"10.0.0.1\""),
        "{log}"
    );
    // An agent that would not take the stack up is refused: the record says where the
    // node's addresses were.
    let plain: Vec<&str> = agent
        .iter()
        .copied()
        .filter(|a| *a != "--take-uplink")
        .collect();
    lab.spawn("vm", "plain agent", &plain);
    let (status, log) = lab.wait_exit("plain agent", 10);
    assert!(
        !status.success() && log.contains("start with --take-uplink to take it up"),
        "{log}"
    );
    lab.daemon("vm", "agent", &agent);
    lab.wait_for(15, "the node's address on ferry0 again", on_tap);
    lab.wait_for(10, "new connections after the crash", new_connections);
    lab.wait_for(10, "the pods after the crash", pods_reached);

    // An update: a new agent on the same socket takes the node over, the host TAP with
    // it; the old one exits without giving the stack back.
    lab.spawn("vm", "new agent", &agent);
    let (status, log) = lab.wait_exit("agent", 20);
    assert!(status.success(), "{log}");
    assert!(!log.contains("back on the uplink"), "{log}");
    assert!(
        on_tap(&lab),
        "the stack stays on the TAP through the handover"
    );
    lab.wait_for(10, "new connections after the handover", new_connections);
    lab.wait_for(10, "the pods after the handover", pods_reached);

    // The stop gives the node back as it was.
    let log = lab.stop("new agent");
    assert!(
        log.contains("taking up the node's stack") && log.contains("back on the uplink"),
        "{log}"
    );
    assert_eq!(node_stack(&lab), before, "the node's stack given back");
    assert!(!state.join("uplink.json").exists());
    assert!(new_connections(&lab), "the node without ferry");

    let (lines, gap) = common::end_session(&mut lab, "session", &stop_file);
    assert!(lines >= 20, "{lines} lines echoed");
    eprintln!("the session: {lines} lines echoed, longest gap {gap} ms");
}
