//! The agent's local API as the CNI plugin uses it: a pod's interface made on request
//! (before its Pod object says its address), traffic through it, the same ADD again,
//! CHECK, DEL (twice) and the interface gone. Needs root, iproute2 and ping.

mod common;

use std::fs;
use std::path::Path;

use common::Lab;
use ferry_agent::api::call;
use ferry_api::{Answer, PodRef, Request, Response};

const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: node1
  annotations: { ferry.io/ipv4-address: 192.168.77.1/24 }
spec:
  podCIDR: 10.244.1.0/24
  podCIDRs: [10.244.1.0/24]
status:
  addresses: [{ type: InternalIP, address: 192.168.77.1 }]
"#;

fn ok(r: Response) -> Answer {
    match r {
        Response::Ok(a) => a,
        Response::Error(e) => panic!("{e:?}"),
    }
}

#[test]
fn the_cni_plugins_requests_make_and_remove_a_pods_interface() {
    common::require(&[
        ("ip", "iproute2"),
        ("ping", "iputils-ping"),
        ("curl", "curl"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("cluster");
    fs::create_dir(&manifests).unwrap();
    fs::write(manifests.join("node.yaml"), CLUSTER).unwrap();
    let mut lab = Lab::new("api");
    for ns in ["n1", "p1", "ext"] {
        lab.add_ns(ns);
    }
    lab.veth("n1", "up1", "ext", "eth0");
    lab.ip("ext", &["addr", "add", "192.168.77.100/24", "dev", "eth0"]);
    lab.ip(
        "ext",
        &["route", "add", "10.244.1.0/24", "via", "192.168.77.1"],
    );
    let sock = dir.path().join("ferry.sock");
    let ds = format!("file:{}", manifests.display());
    let s = sock.display().to_string();
    let state = dir.path().join("state").display().to_string();
    lab.daemon(
        "n1",
        "ferry agent",
        &[
            env!("CARGO_BIN_EXE_ferry"),
            "agent",
            "--node",
            "node1",
            "--datastore",
            &ds,
            "--uplink",
            "up1",
            "--api-socket",
            &s,
            "--state-dir",
            &state,
            "--metrics-addr",
            "127.0.0.1:9250",
        ],
    );
    let sp = sock.clone();
    lab.wait_for(10, "the API socket", move |_| {
        call(&sp, &Request::Status).is_ok_and(|r| matches!(r, Response::Ok(_)))
    });

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

    // The pod's traffic shows in the counters, through the API and `ferry status`.
    let sp = sock.clone();
    lab.wait_for(5, "the pod's packets counted", move |_| {
        ok(call(&sp, &Request::Counters).unwrap())
            .counters
            .is_some_and(|c| {
                c.ports
                    .iter()
                    .any(|p| p.name == "pod.default.web" && p.rx_packets >= 2)
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
    for line in m.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        // NAME{LABELS} VALUE, the value a number.
        let (name, value) = line.rsplit_once(' ').expect("a sample line");
        assert!(value.parse::<f64>().is_ok(), "{line}");
        let name = name.split('{').next().unwrap();
        assert!(
            name.starts_with("ferry_")
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line}"
        );
    }

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
        Response::Error(e) => assert_eq!(e.code, 7, "{e:?}"),
        r => panic!("{r:?}"),
    }
    let log = lab.stop("ferry agent");
    assert!(
        !Path::new(&sock).exists(),
        "the socket goes with the agent: {log}"
    );
}
