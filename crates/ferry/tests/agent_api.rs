//! The agent's local API as the CNI plugin uses it: a pod's interface made on request
//! (before its Pod object says its address), traffic through it, the same ADD again,
//! CHECK, DEL (twice) and the interface gone. Needs root, iproute2 and ping.

mod common;

use std::path::Path;

use common::one_node::{Node, ok};
use ferry_agent::api::call;
use ferry_api::{PodRef, Request, Response};

#[test]
fn the_cni_plugins_requests_make_and_remove_a_pods_interface() {
    common::require(&[("curl", "curl")]);
    let mut one = Node::new("api");
    // Two worker threads, busy polling for 1 ms after receiving: the pod's TAP, added
    // while they run, gets a queue for each.
    one.start(
        "ferry agent",
        &[
            "--metrics-addr",
            "127.0.0.1:9250",
            "--workers",
            "2",
            "--busy-poll",
            "1000",
        ],
    );
    let Node { lab, sock, .. } = &mut one;
    let sock = sock.clone();
    let s = sock.display().to_string();

    let node = ok(call(&sock, &Request::Node).unwrap());
    assert_eq!(node.node.as_deref(), Some("node1"));
    assert_eq!(node.pod_cidrs, ["10.244.1.0/24"]);
    assert_eq!(node.mtu, Some(1500), "no overlay: the uplink's MTU");

    let netns = format!("/var/run/netns/{}", lab.ns("p1"));
    let add = Request::Add {
        container_id: "c0ffee".into(),
        netns: netns.clone(),
        ifname: "eth0".into(),
        pod: PodRef {
            namespace: "default".into(),
            name: "web".into(),
        },
        addresses: vec!["10.244.1.5/24".into()],
    };
    let a = ok(call(&sock, &add).unwrap());
    assert_eq!(a.mac.as_deref(), Some("0a:58:0a:f4:01:05"));
    assert_eq!(
        a.gateways,
        ["169.254.1.1".parse::<std::net::IpAddr>().unwrap()]
    );
    let link = lab.run("p1", 5, &["ip", "-o", "link", "show", "eth0"]);
    assert!(link.contains("0a:58:0a:f4:01:05"), "{link}");
    lab.ping("p1", "192.168.77.100", 56, 2);
    assert_eq!(
        ok(call(&sock, &add).unwrap()),
        a,
        "ADD again: the same answer"
    );

    // A packet from an address that is not the pod's is dropped, and counted against
    // the pod's port.
    lab.ip("p1", &["addr", "add", "10.244.1.99/32", "dev", "eth0"]);
    let spoofed = lab.exec(
        "p1",
        5,
        &[
            "ping",
            "-c",
            "1",
            "-W",
            "1",
            "-I",
            "10.244.1.99",
            "192.168.77.100",
        ],
    );
    assert!(!spoofed.status.success(), "a spoofed source goes nowhere");

    // The pod's traffic shows in the counters, through the API and `ferry status`.
    let sp = sock.clone();
    lab.wait_for(5, "the pod's packets and its drop counted", move |_| {
        ok(call(&sp, &Request::Counters).unwrap())
            .counters
            .is_some_and(|c| {
                c.ports.iter().any(|p| {
                    p.name == "pod.default.web"
                        && p.rx_packets >= 3
                        && p.drops.get("source_spoofed").is_some_and(|&n| n >= 1)
                }) && c.workers.len() == 2
                    && c.workers.iter().map(|w| w.rx_frames).sum::<u64>() >= 3
            })
    });
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["status", "--api-socket", &s])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&st.stdout);
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    assert!(
        text.contains("pod.default.web") && text.contains("uplink") && text.contains("drops"),
        "{text}"
    );
    assert!(text.contains("workers (frames): 0: "), "{text}");
    // The agent says what it is: the build of this test's binary.
    let version = std::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
        .arg("version")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    let commit = version
        .lines()
        .find_map(|l| l.strip_prefix("commit "))
        .and_then(|l| l.split(' ').next())
        .unwrap_or_else(|| panic!("no commit in {version:?}"))
        .to_string();
    assert!(
        text.starts_with(&format!(
            "agent ferry {} (commit {commit}",
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );
    // The workers busy polled after receiving.
    assert!(text.contains("rounds busy polling"), "{text}");
    // The same counters as JSON and as YAML: one document, the same values.
    let as_format = |format: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["status", "-o", format, "--api-socket", &s])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let json: serde_json::Value = serde_json::from_str(&as_format("json")).unwrap();
    let yaml: serde_json::Value = serde_saphyr::from_str(&as_format("yaml")).unwrap();
    for v in [&json, &yaml] {
        assert_eq!(v["workers"].as_array().map(Vec::len), Some(2), "{v}");
        assert!(
            v["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "pod.default.web")
        );
    }

    // The same counters as Prometheus metrics, on the node's loopback.
    let m = lab.run(
        "n1",
        5,
        &[
            "curl",
            "-sS",
            "--max-time",
            "3",
            "http://127.0.0.1:9250/metrics",
        ],
    );
    assert!(
        m.contains("ferry_port_rx_packets_total{port=\"pod.default.web\"}"),
        "{m}"
    );
    assert!(
        m.contains(&format!(
            "ferry_build_info{{version=\"{}\",commit=\"{commit}\"",
            env!("CARGO_PKG_VERSION")
        )),
        "{m}"
    );
    assert!(
        m.contains("ferry_port_drops_total{port=\"pod.default.web\",reason=\"source_spoofed\"}"),
        "{m}"
    );
    assert!(
        m.contains("ferry_worker_rx_frames_total{worker=\"1\"}"),
        "{m}"
    );
    assert!(
        m.contains("ferry_worker_busy_rounds_total{worker=\"0\"}"),
        "{m}"
    );
    // Every line is Prometheus text, read strictly.
    ferry_agent::metrics::parse(&m).unwrap_or_else(|e| panic!("{e}\n{m}"));

    let check = Request::Check {
        container_id: "c0ffee".into(),
        ifname: "eth0".into(),
        netns,
    };
    ok(call(&sock, &check).unwrap());

    let del = Request::Del {
        container_id: "c0ffee".into(),
        ifname: "eth0".into(),
    };
    ok(call(&sock, &del).unwrap());
    assert!(
        !lab.exec("p1", 5, &["ip", "link", "show", "eth0"])
            .status
            .success(),
        "eth0 goes with the attachment"
    );
    ok(call(&sock, &del).unwrap());
    match call(&sock, &check).unwrap() {
        Response::Error(e) => assert_eq!(e.code, 3, "{e:?}"),
        r => panic!("{r:?}"),
    }
    let bad = Request::Add {
        container_id: "c2".into(),
        netns: "/tmp/elsewhere".into(),
        ifname: "eth0".into(),
        pod: PodRef {
            namespace: "default".into(),
            name: "web".into(),
        },
        addresses: vec!["10.244.1.6/24".into()],
    };
    match call(&sock, &bad).unwrap() {
        Response::Error(e) => assert_eq!(e.code, 4, "a bad CNI_NETNS: {e:?}"),
        r => panic!("{r:?}"),
    }
    let log = lab.stop("ferry agent");
    assert!(
        !Path::new(&sock).exists(),
        "the socket goes with the agent: {log}"
    );
}
