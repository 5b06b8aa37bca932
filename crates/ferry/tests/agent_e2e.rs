//! `ferry agent` on two nodes, from a directory of Kubernetes manifests: Services with
//! real TCP clients, the NodePort path across nodes with the client address kept,
//! live edits (an endpoint removed, a bad manifest, a node port connection held across
//! table swaps), health check node ports, node ports
//! from the nodes' own processes, and the reply path across nodes seen on the wire.
//!
//! The lab and the cluster are in `common/two_nodes.rs`.
//! Needs root, iproute2, curl, python3 and tshark.

mod common;

use std::fs;
use std::path::Path;

use common::two_nodes::{BAD_SERVICE, TwoNodes, WEB_ON_NODE2, node, pod, slice};
use ferry_agent::api::call;
use ferry_api::{Request, Response};

fn write_slices(dir: &Path, web: &str) {
    let slices = format!(
        "{}---{}",
        slice("web", web),
        slice("web-local", WEB_ON_NODE2)
    );
    fs::write(dir.join("slices.yaml"), slices).unwrap();
}

#[test]
fn services_and_the_node_port_path_across_nodes() {
    let mut c = TwoNodes::with_file_datastore("ag", &[]);
    services_and_node_ports(&c);
    replies_return_through_the_node_the_request_came_in_on(&mut c);
    a_node_port_connection_lives_through_table_swaps(&mut c);

    // An address of node 2's pod CIDR that no pod has: node 2 answers host unreachable
    // at once, through the tunnel, instead of sending it on by another route.
    let out = c
        .lab
        .exec("p1a", 10, &["ping", "-c", "1", "-W", "3", "10.244.2.77"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success()
            && text.contains("From 192.168.77.2")
            && text.contains("Destination Host Unreachable"),
        "ping of a pod that does not exist: {text}"
    );

    // A bad manifest changes nothing: the error names the file, and traffic goes on.
    let bad = c.manifest_dir().join("zz-bad.yaml");
    fs::write(&bad, BAD_SERVICE).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(600));
    assert_eq!(c.curl("p1a", "http://10.96.0.10/hostname"), "web");
    fs::remove_file(&bad).unwrap();

    // The endpoint goes away: new connections are refused at once (TCP reset), not
    // left to time out.
    let url = "http://10.96.0.10/hostname";
    write_slices(&c.manifest_dir(), "[]");
    c.wait_curl(10, "p1a", url, 7, "the endpoint removal applied");
    // And it comes back.
    write_slices(&c.manifest_dir(), WEB_ON_NODE2);
    c.wait_curl(10, "p1a", url, 0, "the endpoint back");

    // The cluster autoscaler marks node 1 for deletion: its /healthz says 503 (not
    // eligible), so that load balancers drain it; /livez and node 2 stay healthy.
    let nodes = |taint: &str| {
        let n1 = node(1).replace("spec:\n", &format!("spec:\n  taints: [{taint}]\n"));
        format!("{n1}---{}", node(2))
    };
    let taint =
        "{ key: ToBeDeletedByClusterAutoscaler, value: \"1700000000\", effect: NoSchedule }";
    fs::write(c.manifest_dir().join("nodes.yaml"), nodes(taint)).unwrap();
    c.lab.wait_for(10, "node 1's /healthz to say 503", |l| {
        healthz(l, 1, "/healthz").ends_with(" 503")
    });
    let h1 = healthz(&c.lab, 1, "/healthz");
    assert!(h1.contains("\"nodeEligible\": false"), "{h1}");
    let l1 = healthz(&c.lab, 1, "/livez");
    assert!(l1.ends_with(" 200"), "{l1}");
    let h2 = healthz(&c.lab, 2, "/healthz");
    assert!(h2.ends_with(" 200"), "{h2}");
    fs::write(c.manifest_dir().join("nodes.yaml"), nodes("")).unwrap();
    c.lab
        .wait_for(10, "node 1's /healthz to say 200 again", |l| {
            healthz(l, 1, "/healthz").ends_with(" 200")
        });
    let log = c.lab.stop("ferry agent on node1");
    assert!(
        log.contains("zz-bad.yaml") && log.contains("spec.ports[0].port"),
        "the refusal names the file and field: {log}"
    );
}

/// A change node 1's agent cannot put in force (a pod attached to a network namespace
/// that is not there) does not hold back the endpoint changes that come with it and
/// after it: those are put in force alone while the pod's change waits.
#[test]
fn endpoint_changes_apply_while_a_pod_cannot() {
    let mut c = TwoNodes::new("ap");
    let absent = format!("{}-absent", c.lab.prefix);
    let late = format!("default/late={absent}");
    c.start_file_datastore(&["--pod", &late], &[], &[]);
    let url = "http://10.96.0.10/hostname";
    assert_eq!(c.curl("p1a", url), "web");
    let pods = format!(
        "{}---{}---{}",
        pod("client", 1, "10.244.1.5"),
        pod("web", 2, "10.244.2.5"),
        pod("late", 1, "10.244.1.7")
    );
    fs::write(c.manifest_dir().join("pods.yaml"), pods).unwrap();
    write_slices(&c.manifest_dir(), "[]");
    c.wait_curl(10, "p1a", url, 7, "the endpoint removal on node 1");
    write_slices(&c.manifest_dir(), WEB_ON_NODE2);
    c.wait_curl(10, "p1a", url, 0, "the endpoint back on node 1");
    let log = c.lab.stop("ferry agent on node1");
    assert!(
        log.contains(&absent) && log.contains("put in force alone"),
        "the pod's change fails, the Services' apply alone: {log}"
    );
}

/// What a previous dataplane leaves on node `n` (flannel's VXLAN device on ferry's port
/// and VNI with its route and forwarding entry to the other node, kube-proxy's nftables
/// rules for the node port and a forward chain that drops), as a node migrated to ferry
/// without being rebuilt may still have.
fn leave_a_previous_dataplane_on(c: &TwoNodes, n: u8) {
    let (node, peer) = (format!("n{n}"), 3 - n);
    let lab = &c.lab;
    let (local, remote) = (format!("192.168.77.{n}"), format!("192.168.77.{peer}"));
    let vxlan = [
        "link",
        "add",
        "flannel.1",
        "type",
        "vxlan",
        "id",
        "4096",
        "local",
        &local,
        "dev",
    ];
    let up = format!("up{n}");
    let mut args = vxlan.to_vec();
    args.extend([up.as_str(), "dstport", "4789", "nolearning"]);
    lab.ip(&node, &args);
    lab.ip(&node, &["link", "set", "flannel.1", "up"]);
    lab.ip(
        &node,
        &[
            "addr",
            "add",
            &format!("10.244.{n}.0/32"),
            "dev",
            "flannel.1",
        ],
    );
    let (cidr, via) = (format!("10.244.{peer}.0/24"), format!("10.244.{peer}.0"));
    let route = [
        "route",
        "add",
        &cidr,
        "via",
        &via,
        "dev",
        "flannel.1",
        "onlink",
    ];
    lab.ip(&node, &route);
    let fdb = [
        "bridge",
        "fdb",
        "append",
        "00:00:00:00:00:00",
        "dev",
        "flannel.1",
        "dst",
        &remote,
    ];
    lab.run(&node, 5, &fdb);
    let rules = dir_file(c, &format!("kube-proxy{n}.nft"));
    fs::write(
        &rules,
        "table ip kube-proxy {
    chain nat-prerouting {
        type nat hook prerouting priority dstnat; policy accept;
        tcp dport 30080 dnat to 10.244.9.9:8080
        ip daddr 10.96.0.10 tcp dport 80 dnat to 10.244.9.9:8080
    }
    chain filter-forward {
        type filter hook forward priority filter; policy drop;
    }
}
",
    )
    .unwrap();
    lab.run(&node, 5, &["nft", "-f", rules.to_str().unwrap()]);
}

/// A file in the lab's directory.
fn dir_file(c: &TwoNodes, name: &str) -> std::path::PathBuf {
    c.dir.path().join(name)
}

/// The reference report's last finding: a node that a previous dataplane left its
/// devices, routes and rules on still carries the node port path across nodes, and
/// every other Service path, as a fresh node does. ferry reads the uplink ahead of the
/// kernel and keeps the kernel off it, so none of that state sees the traffic. Only the
/// node's own connections to the pods behind the leftover route go astray: the agent
/// warns about that route (and about kube-proxy's rules), and once the route is removed
/// as the warning says, they arrive.
#[test]
fn a_previous_dataplanes_leftovers_do_not_touch_the_services() {
    common::require(&[("nft", "nftables"), ("bridge", "iproute2")]);
    let mut c = TwoNodes::new("al");
    for n in [1, 2] {
        leave_a_previous_dataplane_on(&c, n);
    }
    c.start_file_datastore(&[], &[], &[]);
    services_and_node_ports(&c);
    replies_return_through_the_node_the_request_came_in_on(&mut c);
    // ferry neither needed nor touched the leftovers.
    for n in ["n1", "n2"] {
        let routes = c.lab.ip(n, &["route", "show", "dev", "flannel.1"]);
        assert!(routes.contains("10.244."), "{n}: {routes}");
        let tables = c.lab.run(n, 5, &["nft", "list", "tables"]);
        assert!(tables.contains("kube-proxy"), "{n}: {tables}");
    }
    // Node 1's own connection to node 2's pod follows the leftover route into flannel's
    // device, and is lost; without the route it goes through ferry.
    let pod = "http://10.244.2.5:8080/hostname";
    let (code, out) = c.try_curl("n1", pod);
    assert_eq!(code, 28, "through the leftover route: {out}");
    c.lab
        .ip("n1", &["route", "del", "10.244.2.0/24", "dev", "flannel.1"]);
    assert_eq!(c.curl("n1", pod), "web");
    let log = c.lab.stop("ferry agent on node1");
    let warning = log
        .lines()
        .find(|l| l.contains("past ferry"))
        .unwrap_or_else(|| panic!("no warning about the leftover route: {log}"));
    assert!(
        warning.contains("10.244.2.0/24 via 10.244.2.0 dev flannel.1 table main")
            && warning.contains("node2's pods 10.244.2.0/24"),
        "{warning}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("netfilter rules are in place")
                && l.contains(
                    "table ip kube-proxy: kube-proxy's chains nat-prerouting, filter-forward"
                )),
        "no warning about kube-proxy's table: {log}"
    );
}

#[test]
fn services_and_the_node_port_path_with_two_workers_per_node() {
    let workers = ["--workers", "2"];
    let c = TwoNodes::with_file_datastore_args("aw", &workers, &workers);
    // A connection's request and its reply may come in on different sockets of a
    // node's uplink fanout group, read by different workers, which share the pipeline
    // and so the connection.
    services_and_node_ports(&c);
    for _ in 0..20 {
        assert_eq!(
            c.curl("ext", "http://192.168.77.1:30080/clientip"),
            "192.168.77.100"
        );
    }
    // Node 1's two workers both took frames in: the kernel spread the connections
    // over the uplink's two sockets.
    let Ok(Response::Ok(a)) = call(&c.socket(1), &Request::Counters) else {
        panic!("node 1's counters");
    };
    let workers = a.counters.expect("counters").workers;
    assert_eq!(workers.len(), 2);
    assert!(workers.iter().all(|w| w.rx_frames > 0), "{workers:?}");
}

/// The same with every packet between the nodes encapsulated (`always`), and with
/// nothing encapsulated but what a node port forwards with the client address kept
/// (`never`): the node port's path across nodes does not depend on the mode.
#[test]
fn services_and_the_node_port_path_in_every_encapsulation_mode() {
    for (tag, mode) in [("ea", "always"), ("en", "never")] {
        let c = TwoNodes::with_file_datastore_config(tag, &[], &[], &[("encapsulation", mode)]);
        services_and_node_ports(&c);
        // The mode is in force: a pod's packet to the other node's pod goes through the
        // overlay in mode always, straight over the wire in mode never.
        let trace = Request::Trace {
            in_port: "pod default/client".into(),
            packet: Some("tcp 10.244.1.5:40000 -> 10.244.2.5:8080 syn".into()),
            frames: None,
            reply: false,
        };
        let Ok(Response::Ok(a)) = call(&c.socket(1), &trace) else {
            panic!("node 1's trace");
        };
        let report = serde_json::to_string(&a.trace).unwrap();
        assert_eq!(
            report.contains("through the overlay"),
            mode == "always",
            "mode {mode}: {report}"
        );
    }
}

/// The reply path itself, on the wire: a client outside reaches node 1's node port,
/// whose endpoint is on node 2, and keeps its address. Node 2 must send the replies back
/// through node 1 in the tunnel (node 1 undoes its NAT), never straight to the client:
/// the client only ever sees node 1 (its MAC, its address and the node port), and node
/// 2's link to the fabric carries the replies only inside VXLAN.
fn replies_return_through_the_node_the_request_came_in_on(c: &mut TwoNodes) {
    common::require(&[("tshark", "tshark")]);
    let dir = tempfile::tempdir().unwrap();
    let (client, node2) = (dir.path().join("fe.pcap"), dir.path().join("f2.pcap"));
    c.lab
        .capture("fab", "tshark on the client's port", "fe", &client);
    c.lab
        .capture("fab", "tshark on node 2's port", "f2", &node2);
    for _ in 0..3 {
        assert_eq!(
            c.curl("ext", "http://192.168.77.1:30080/clientip"),
            "192.168.77.100"
        );
    }
    c.lab.stop_capture("tshark on the client's port", &client);
    c.lab.stop_capture("tshark on node 2's port", &node2);
    let at_client = common::tshark_fields(
        &client,
        "ip.dst == 192.168.77.100 && tcp.srcport == 30080",
        "eth.src",
    );
    assert!(
        at_client.len() >= 3,
        "replies from the node port at the client: {at_client:?}"
    );
    assert!(
        at_client.iter().all(|m| m.trim() == "02:fe:00:00:00:01"),
        "replies at the client that node 1 did not send: {at_client:?}"
    );
    let from_endpoint = common::tshark_fields(&client, "ip.src == 10.244.2.5", "frame.number");
    assert!(
        from_endpoint.is_empty(),
        "frames from the endpoint's own address reached the client: {from_endpoint:?}"
    );
    let direct = common::tshark_fields(
        &node2,
        "ip.dst == 192.168.77.100 && !(udp.port == 4789)",
        "frame.number",
    );
    assert!(
        direct.is_empty(),
        "node 2 sent frames straight to the client: {direct:?}"
    );
    let tunnelled = common::tshark_fields(
        &node2,
        "udp.dstport == 4789 && ip.src == 10.244.2.5 && tcp.srcport == 8080",
        "frame.number",
    );
    assert!(
        tunnelled.len() >= 3,
        "node 2's replies inside the tunnel to node 1: {tunnelled:?}"
    );
}

/// The client: connects to HOST:PORT and sends the first line of a request, writes
/// `connected` to the file OUT, waits until the file GO exists, then ends the request
/// and writes the answer's body to OUT.
const HELD_CLIENT: &str = r#"
import os, socket, sys, time
host, port, out, go = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
s = socket.create_connection((host, port), timeout=5)
s.sendall(b"GET /clientip HTTP/1.0\r\n")
open(out, "w").write("connected")
while not os.path.exists(go):
    time.sleep(0.05)
s.sendall(b"Host: web\r\n\r\n")
answer = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    answer += b
open(out, "w").write(answer.split(b"\r\n\r\n", 1)[-1].decode())
"#;

/// A connection through node 1's node port to the endpoint on node 2 stays up while
/// both nodes swap their tables twice: the same endpoint leaves another Service (so
/// the endpoint node cleans up that Service's connections to it), and comes back. The
/// connection is open across both swaps and its request is answered after them.
fn a_node_port_connection_lives_through_table_swaps(c: &mut TwoNodes) {
    let dir = c.dir.path().to_path_buf();
    let (script, out, go) = (
        dir.join("held_client.py"),
        dir.join("held.out"),
        dir.join("held.go"),
    );
    fs::write(&script, HELD_CLIENT).unwrap();
    let args = [
        "python3",
        script.to_str().unwrap(),
        "192.168.77.1",
        "30080",
        out.to_str().unwrap(),
        go.to_str().unwrap(),
    ];
    c.lab.spawn("ext", "held client", &args);
    let o = out.clone();
    c.lab.wait_for(10, "the held connection open", |_| {
        fs::read_to_string(&o).is_ok_and(|t| t == "connected")
    });

    // Each node's entry of the connection (the client's earlier ones are closed), by the
    // client's source port and packets. An entry the
    // swaps removed would not come back before the connection's next packet.
    let held = |c: &TwoNodes, n: u8, port: &str| -> Vec<(u16, u64)> {
        let sock = c.socket(n);
        let args = [
            "conntrack",
            "list",
            "--addr",
            "192.168.77.100",
            "--port",
            port,
            "--proto",
            "tcp",
            "--state",
            "ESTABLISHED",
            "--json",
            "--api-socket",
            sock.to_str().unwrap(),
        ];
        let json = common::ferry_ok(&args).0;
        let a: ferry_api::CtAnswer =
            serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
        a.entries
            .iter()
            .map(|e| (e.original.sport.unwrap_or(0), e.packets_original))
            .collect()
    };
    let before = (held(c, 1, "30080"), held(c, 2, "8080"));
    assert!(
        before.0.len() == 1 && before.1.len() == 1 && before.0[0].0 == before.1[0].0,
        "the held connection on node 1 (node port) and node 2 (endpoint): {before:?}"
    );

    // The endpoint leaves the other Service (web-local, node port 30081 on node 2,
    // refused once it has no endpoint), then comes back.
    let slices = |web_local: &str| {
        format!(
            "{}---{}",
            slice("web", WEB_ON_NODE2),
            slice("web-local", web_local)
        )
    };
    let local = "http://192.168.77.2:30081/clientip";
    fs::write(c.manifest_dir().join("slices.yaml"), slices("[]")).unwrap();
    c.wait_curl(10, "ext", local, 7, "web-local without endpoints");
    fs::write(c.manifest_dir().join("slices.yaml"), slices(WEB_ON_NODE2)).unwrap();
    c.wait_curl(10, "ext", local, 0, "web-local's endpoint back");

    let after = (held(c, 1, "30080"), held(c, 2, "8080"));
    assert_eq!(
        after, before,
        "the held connection's entries after the swaps"
    );

    fs::write(&go, "").unwrap();
    let o = out.clone();
    c.lab.wait_for(10, "the held connection's answer", |_| {
        fs::read_to_string(&o).is_ok_and(|t| t != "connected")
    });
    assert_eq!(
        fs::read_to_string(&out).unwrap(),
        "192.168.77.100",
        "the answer on the connection held across the swaps"
    );
}

/// What the external client gets from node `n`'s kube-proxy health port (10256) at
/// `path`: the body and the status code after a space.
fn healthz(lab: &common::Lab, n: u8, path: &str) -> String {
    let url = format!("http://192.168.77.{n}:10256{path}");
    lab.run(
        "ext",
        10,
        &["curl", "-s", "--max-time", "3", "-w", " %{http_code}", &url],
    )
}

/// Cluster IPs and node ports, with and without a local endpoint, from pods, from
/// outside and from the nodes themselves.
fn services_and_node_ports(c: &TwoNodes) {
    // Cluster IP from a pod on node 1 to the endpoint on node 2.
    assert_eq!(c.curl("p1a", "http://10.96.0.10/hostname"), "web");
    assert_eq!(c.curl("p1a", "http://10.96.0.10/clientip"), "10.244.1.5");

    // The node port on node 1, whose endpoint is on node 2: the pod sees the client's
    // address, and the reply returns through node 1 (the client would refuse one from
    // node 2's pod address).
    for _ in 0..5 {
        assert_eq!(
            c.curl("ext", "http://192.168.77.1:30080/clientip"),
            "192.168.77.100"
        );
    }
    // And on node 2 itself.
    assert_eq!(
        c.curl("ext", "http://192.168.77.2:30080/clientip"),
        "192.168.77.100"
    );

    // The node's own processes reach the node port on the node's own address (the
    // kernel would otherwise deliver it locally): on node 2, whose endpoint is local,
    // and on node 1, whose endpoint is on node 2.
    assert_eq!(
        c.curl("n2", "http://192.168.77.2:30080/clientip"),
        "192.168.77.2"
    );
    assert_eq!(
        c.curl("n1", "http://192.168.77.1:30080/clientip"),
        "192.168.77.1"
    );

    // externalTrafficPolicy Local: node 2 serves it, node 1 has no local endpoint and
    // drops; the health check node port says which is which, from each node's kernel
    // through the host port.
    assert_eq!(
        c.curl("ext", "http://192.168.77.2:30081/clientip"),
        "192.168.77.100"
    );
    let (code, _) = c.try_curl("ext", "http://192.168.77.1:30081/clientip");
    assert_eq!(
        code, 28,
        "node 1 has no local endpoint: the connection times out"
    );
    let hc = |c: &TwoNodes, n: u8| {
        c.lab.run(
            "ext",
            10,
            &[
                "curl",
                "-s",
                "--max-time",
                "3",
                "-w",
                " %{http_code}",
                &format!("http://192.168.77.{n}:32000/healthz"),
            ],
        )
    };
    let h2 = hc(c, 2);
    assert!(
        h2.ends_with(" 200") && h2.contains("\"localEndpoints\": 1"),
        "{h2}"
    );
    let h1 = hc(c, 1);
    assert!(
        h1.ends_with(" 503") && h1.contains("\"localEndpoints\": 0"),
        "{h1}"
    );

    // kube-proxy's own health port, which load balancers of externalTrafficPolicy
    // Cluster Services check: both nodes run, with their state in force.
    for n in [1, 2] {
        let h = healthz(&c.lab, n, "/healthz");
        assert!(
            h.ends_with(" 200") && h.contains("\"nodeEligible\": true"),
            "node {n}: {h}"
        );
        let l = healthz(&c.lab, n, "/livez");
        assert!(
            l.ends_with(" 200") && l.contains("\"lastUpdated\": \"20"),
            "node {n}: {l}"
        );
    }
}
