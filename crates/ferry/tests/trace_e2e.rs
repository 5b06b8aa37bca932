//! `ferry trace` and `ferry capture` against running agents on two nodes: a traced
//! NodePort packet whose endpoint is on the other node names the tunnel peer and the
//! way back, and changes nothing; a live trace records a real connection's first packet;
//! a capture at the uplink is read by tshark, with frames before and after rewriting.
//!
//! The lab and the cluster are in `common/two_nodes.rs`.
//! Needs root, iproute2, curl, python3 and tshark.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::two_nodes::TwoNodes;

fn start(tag: &str) -> TwoNodes {
    common::require(&[("tshark", "tshark")]);
    TwoNodes::with_file_datastore(tag, &[])
}

fn socket(c: &TwoNodes, n: u8) -> String {
    c.socket(n).display().to_string()
}

/// `ferry ARGS` must succeed; its stdout.
fn ferry(args: &[&str]) -> String {
    common::ferry_ok(args).0
}

/// Connections node `n` inserted so far, from `ferry status --json`.
fn inserted(c: &TwoNodes, n: u8) -> u64 {
    let s = ferry(&["status", "--json", "--api-socket", &socket(c, n)]);
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    v["ct_inserted"].as_u64().unwrap()
}

#[test]
fn trace_names_the_tunnel_peer_and_the_way_back_and_changes_nothing() {
    let c = start("tr");
    let s1 = socket(&c, 1);
    // Real connections first, so that the node has state to copy (its neighbours:
    // without the client's MAC the traced reply would be queued at neighbour resolution,
    // and go no further in a dry run).
    assert_eq!(c.curl("p1a", "http://10.96.0.10/hostname"), "web");
    assert_eq!(
        c.curl("ext", "http://192.168.77.1:30080/clientip"),
        "192.168.77.100"
    );
    std::thread::sleep(Duration::from_millis(300));
    let before = inserted(&c, 1);

    let packet = "tcp 192.168.77.100:40000 -> 192.168.77.1:30080 syn";
    let mut args = vec!["trace", "--api-socket", &s1, "--in", "uplink"];
    args.extend(packet.split(' '));
    let text = ferry(&args);
    // The forward pass: the Service and its endpoint on node 2, the client address kept,
    // the packet encapsulated to node 2.
    let (fwd, rest) = text.split_once("\nreply:").expect(&text);
    assert!(fwd.contains("default/web"), "the Service is named: {text}");
    assert!(fwd.contains("10.244.2.5:8080"), "the endpoint: {text}");
    assert!(fwd.contains("node2"), "the endpoint's node: {text}");
    assert!(
        fwd.contains("encap") && fwd.contains("192.168.77.2"),
        "the tunnel to node 2: {text}"
    );
    assert!(fwd.contains("=> forwarded: out uplink"), "{text}");
    // The reply arrives from node 2 through the tunnel, is matched as the reply and
    // translated back to the node port, and leaves to the client.
    assert!(
        rest.contains("decap") && rest.contains("192.168.77.2"),
        "{text}"
    );
    assert!(rest.contains("reply"), "{text}");
    assert!(
        rest.contains("192.168.77.1:30080") && rest.contains("192.168.77.100:40000"),
        "translated back to the node port: {text}"
    );
    assert!(rest.contains("=> forwarded: out uplink"), "{text}");
    let reverse = rest
        .lines()
        .find(|l| l.starts_with("reverse path:"))
        .expect(&text);
    assert!(
        reverse.contains("node2") && reverse.contains("192.168.77.2"),
        "the way back names the tunnel peer: {reverse}"
    );

    // The same as JSON.
    args.insert(1, "--json");
    let json: serde_json::Value = serde_json::from_str(&ferry(&args)).unwrap();
    assert_eq!(json["passes"].as_array().unwrap().len(), 2, "{json}");
    assert_eq!(json["passes"][1]["ct"], "reply", "{json}");
    let stages = json["passes"][0]["stages"].as_array().unwrap();
    assert!(
        stages.iter().all(|s| s["event"]["kind"].is_string()),
        "every stage has its fields: {json}"
    );

    // Nothing was sent or tracked: the node's connection count did not move.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(inserted(&c, 1), before, "a trace creates no connection");

    // A pod's packet, by pod name, and a drop with its reason.
    let text = ferry(&[
        "trace",
        "--api-socket",
        &s1,
        "--in",
        "pod",
        "default/client",
        "tcp",
        "10.244.1.5:40001",
        "->",
        "10.96.0.10:80",
        "syn",
    ]);
    assert!(
        text.contains("pod.default.client") && text.contains("10.244.2.5:8080"),
        "{text}"
    );
    let text = ferry(&[
        "trace",
        "--api-socket",
        &s1,
        "--in",
        "pod",
        "default/client",
        "udp",
        "10.244.1.99:5000",
        "->",
        "10.244.2.5:53",
    ]);
    assert!(text.contains("dropped: source_spoofed"), "{text}");

    // Bad input: a clear error, exit status non-zero.
    let (ok, _, err) = common::ferry(&[
        "trace",
        "--api-socket",
        &s1,
        "--in",
        "uplink",
        "tcp",
        "1.2.3.4",
        "->",
    ]);
    assert!(!ok);
    assert!(err.contains("packet"), "{err}");
    let (ok, _, err) = common::ferry(&[
        "trace",
        "--api-socket",
        &s1,
        "--in",
        "eth7",
        "udp",
        "1.2.3.4:1",
        "->",
        "5.6.7.8:2",
    ]);
    assert!(!ok);
    assert!(
        err.contains("no port \"eth7\"") && err.contains("uplink"),
        "{err}"
    );
}

/// Starts `ferry ARGS` in the background.
fn spawn(args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` at most `secs`, killing it if it takes longer; its output.
fn wait(mut child: std::process::Child, secs: u64) -> (bool, String, String) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn live_trace_and_capture_see_real_packets() {
    let c = start("lt");
    let s1 = socket(&c, 1);
    // Neighbours resolved first: the first packet to an unresolved next hop waits in the
    // neighbour queue while it is resolved (verdict `queued`), and the live trace records
    // exactly one packet, which is to be forwarded at once.
    assert_eq!(
        c.curl("ext", "http://192.168.77.1:30080/clientip"),
        "192.168.77.100"
    );
    // The packets that waited were sent, not dropped.
    std::thread::sleep(Duration::from_millis(300));
    for n in [1, 2] {
        let s = ferry(&["status", "--json", "--api-socket", &socket(&c, n)]);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        for r in ["neigh_unresolved", "neigh_queue_overflow"] {
            assert!(v["drops"].get(r).is_none(), "node {n}: {s}");
        }
    }

    // The next packet to the node port, traced as it goes through node 1.
    let live = spawn(&[
        "trace",
        "--api-socket",
        &s1,
        "--live",
        "--match",
        "tcp dst port 30080",
        "--count",
        "1",
        "--timeout",
        "20",
    ]);
    // A capture of the same traffic at node 1's uplink.
    let pcap = c.dir.path().join("uplink.pcapng");
    let p = pcap.display().to_string();
    let capture = spawn(&[
        "capture",
        "--api-socket",
        &s1,
        "--port",
        "uplink",
        "--match",
        "port 30080",
        "-w",
        &p,
        "--duration",
        "4",
    ]);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        c.curl("ext", "http://192.168.77.1:30080/clientip"),
        "192.168.77.100"
    );
    let (ok, out, err) = wait(live, 25);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("192.168.77.100") && out.contains("in uplink"),
        "{out}"
    );
    assert!(
        out.contains("service") && out.contains("10.244.2.5:8080"),
        "{out}"
    );
    assert!(out.contains("=> forwarded: out uplink"), "{out}");

    let (ok, out, err) = wait(capture, 15);
    assert!(ok, "{out}{err}");
    assert!(err.contains("frames written"), "{err}");
    // tshark reads the file: frames received from the client (before rewriting) and
    // the same packets as ferry sent them on, encapsulated to node 2.
    let t = Command::new("tshark")
        .args([
            "-r",
            &p,
            "-T",
            "fields",
            "-e",
            "frame.interface_name",
            "-e",
            "frame.comment",
            "-e",
            "ip.src",
            "-e",
            "vxlan.vni",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&t.stdout);
    assert!(
        t.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&t.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("received on uplink") && l.contains("192.168.77.100")),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("after ferry") && l.contains("192.168.77.1,192.168.77.100")),
        "encapsulated from node 1, the client's address kept inside: {text}"
    );

    // To standard output, piped into tshark as into Wireshark: the frames arrive while
    // the capture runs.
    let pipe = format!(
        "{} capture --api-socket {s1} --port uplink --match 'port 30080' -w - --duration 4 \
         | tshark -l -r - -T fields -e frame.interface_name -e frame.comment",
        env!("CARGO_BIN_EXE_ferry")
    );
    let piped = Command::new("sh")
        .args(["-c", &pipe])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        c.curl("ext", "http://192.168.77.1:30080/clientip"),
        "192.168.77.100"
    );
    let (ok, out, err) = wait(piped, 15);
    assert!(ok, "{out}{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("uplink\t") && l.contains("received on uplink")),
        "{out}{err}"
    );
    assert!(err.contains("frames written to -"), "{err}");

    // A reader that closes the pipe ends the capture, and the command with success.
    let closing = format!(
        "{} capture --api-socket {s1} --port uplink -w - --duration 10 | head -c 1 >/dev/null; \
         echo \"ferry exit ${{PIPESTATUS[0]}}\"",
        env!("CARGO_BIN_EXE_ferry")
    );
    let piped = Command::new("bash")
        .args(["-c", &closing])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    for _ in 0..3 {
        c.curl("ext", "http://192.168.77.1:30080/clientip");
    }
    let (ok, out, err) = wait(piped, 15);
    assert!(ok && out.contains("ferry exit 0"), "{out}{err}");
    assert!(
        err.contains("the reader of standard output closed it"),
        "{err}"
    );
}
