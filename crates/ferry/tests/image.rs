//! A node taken over end to end: ferry's image, built the way `scripts/image.sh` builds
//! it (a Debian base made by mmdebstrap and imported into podman,
//! `deploy/image/Containerfile`, the binaries stripped), run privileged in the network
//! namespace of a node set up as a cloud VM is, with the agent's command and arguments
//! read from `deploy/ferry.yaml` and against a fake API server. The node has what
//! kube-proxy and flannel left (chains in iptables-nft and iptables-legacy, an nftables
//! `kube-proxy` table, `flannel.1` with a route, the `cni0` bridge, flannel's CNI
//! configuration), and a TCP session from outside runs from before the agent starts
//! until after it stops. The agent takes the node's uplink (the session goes on, the
//! node answers new connections on its address), writes its Node's annotations and
//! answers `ferry status` on the socket the manifest's mount gives; `ferry cleanup` run
//! in the container lists the leftovers and removes them; pods made through the CNI
//! plugin reach each other, the node reaches them and a NodePort answers from outside;
//! and when the container stops, the node's uplink is given back as it was.
//!
//! Podman runs with runc, `default_ulimits = []` and storage of the test's own (vfs, in a
//! temporary directory): nothing outside the test is changed or left behind.
//!
//! Needs root, podman, runc, mmdebstrap (and Debian's mirror), binutils, iproute2,
//! iptables, nftables, python3 and curl.

mod common;

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::podman::Podman;
use common::{Lab, manifest_agent, require};
use serde_json::Value;

const SERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake_apiserver.py");

/// The running container, removed on drop.
struct Container<'a> {
    podman: &'a Podman,
    name: String,
    child: Option<Child>,
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = self
            .podman
            .command("podman")
            .args(["rm", "-f", "-t", "0", &self.name])
            .output();
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// kube-proxy's and flannel's state on a node they ran on: chains in both iptables, an
/// nftables table, flannel's VXLAN device with a route through it, and its bridge
/// holding the pod CIDR's gateway address.
const LEFTOVERS: &str = "
iptables-nft -t nat -N KUBE-SERVICES
iptables-nft -t nat -A PREROUTING -j KUBE-SERVICES
iptables-nft -N FLANNEL-FWD
iptables-nft -A FORWARD -j FLANNEL-FWD
iptables-legacy -N KUBE-FIREWALL
iptables-legacy -A INPUT -j KUBE-FIREWALL
nft add table ip kube-proxy
nft add chain ip kube-proxy services
ip link add flannel.1 type vxlan id 1 dstport 8472 dev eth0
ip link set flannel.1 up
ip route add 10.244.9.0/24 via 10.244.9.0 dev flannel.1 onlink
ip link add cni0 type bridge
ip address add 10.244.5.1/24 dev cni0
ip link set cni0 up
";

/// Whether every one of [`LEFTOVERS`] (and flannel's configuration in `net_d`) is gone.
fn leftovers_gone(lab: &Lab, net_d: &Path) -> bool {
    let text = |cmd: &[&str]| String::from_utf8_lossy(&lab.exec("vm", 5, cmd).stdout).into_owned();
    let nat = text(&["iptables-nft", "-t", "nat", "-S"]) + &text(&["iptables-nft", "-S"]);
    let legacy = text(&["iptables-legacy", "-S"]);
    let links = text(&["ip", "-o", "link", "show"]);
    !nat.contains("KUBE-")
        && !nat.contains("FLANNEL")
        && !legacy.contains("KUBE-")
        && !text(&["nft", "list", "tables"]).contains("kube-proxy")
        && !links.contains("flannel.1")
        && !links.contains("cni0")
        && !text(&["ip", "route", "show", "table", "all"]).contains("10.244.9.0")
        && !net_d.join("10-flannel.conflist").exists()
}

/// The uplink's global addresses and the routes through it, sorted (its link-local
/// address's aside).
fn uplink(lab: &Lab) -> (Vec<String>, Vec<String>) {
    let mut a: Vec<String> = lab
        .ip(
            "vm",
            &["-o", "address", "show", "dev", "eth0", "scope", "global"],
        )
        .lines()
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    a.sort();
    let mut r: Vec<String> = lab
        .ip("vm", &["route", "show", "table", "all", "dev", "eth0"])
        .lines()
        // The uplink's own link-local address, which is not moved, may still be
        // tentative at the first look.
        .filter(|r| !r.starts_with("local fe80::"))
        .map(str::to_string)
        .collect();
    r.sort();
    (a, r)
}

/// Whether a new TCP connection from outside (namespace `gw`) reaches the node's echo
/// server.
fn connects(lab: &Lab) -> bool {
    lab.exec(
        "gw",
        3,
        &[
            "python3",
            "-c",
            "import socket; socket.create_connection(('10.0.0.5', 2222), 2)",
        ],
    )
    .status
    .success()
}

/// What `curl URL` in namespace `ns` gets (empty when it fails).
fn fetch(lab: &Lab, ns: &str, url: &str) -> String {
    let out = lab.exec(ns, 3, &["curl", "-sf", "--max-time", "2", url]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Pods `a` and `b` and the NodePort Service `web` (node port 30080) whose endpoint is b
/// at `b_ip`, as the fake API server takes them.
fn web_service(b_ip: &str) -> Value {
    let pod = |name: &str, labels: Value, ip: Option<&str>| {
        serde_json::json!({
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"nodeName": "vm", "containers": [{"name": "c", "image": "x"}]},
            "status": match ip {
                Some(ip) => serde_json::json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}),
                None => serde_json::json!({"phase": "Running"}),
            },
        })
    };
    serde_json::json!([
        {"object": pod("a", serde_json::json!({}), None)},
        {"object": pod("b", serde_json::json!({"app": "web"}), Some(b_ip))},
        {"object": {
            "kind": "Service", "apiVersion": "v1",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {
                "type": "NodePort", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                "selector": {"app": "web"},
                "ports": [{"port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"}],
            },
        }},
        {"object": {
            "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
            "metadata": {
                "name": "web-1", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "web"},
            },
            "addressType": "IPv4",
            "ports": [{"port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [b_ip], "nodeName": "vm", "conditions": {"ready": true}}],
        }},
    ])
}

#[test]
fn the_image_takes_a_node_over_from_kube_proxy_and_flannel_with_the_manifests_arguments() {
    require(&[
        ("podman", "podman"),
        ("runc", "runc"),
        ("mmdebstrap", "mmdebstrap"),
        ("objcopy", "binutils"),
        ("ip", "iproute2"),
        ("iptables-nft", "iptables"),
        ("iptables-legacy", "iptables"),
        ("nft", "nftables"),
        ("python3", "python3"),
        ("curl", "curl"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let podman = Podman::new(dir.path());
    let (argv, image) = manifest_agent("vm");
    let tag = format!("localhost/{image}");
    assert_eq!(image, concat!("ferry:", env!("CARGO_PKG_VERSION")));

    // The image, from this test's binaries.
    common::lab::cni_plugin();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_ferry")).parent().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/image.sh");
    let debug = dir.path().join("debug");
    let out = podman
        .command("bash")
        .args([script, "--binaries"])
        .arg(bin_dir)
        .args(["--tag", &tag, "--debug-dir"])
        .arg(&debug)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/image.sh: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let labels: Value = serde_json::from_str(&podman.podman(&[
        "image",
        "inspect",
        "--format",
        "{{json .Labels}}",
        &tag,
    ]))
    .unwrap();
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    // Stripped: the debug information is beside the image, not in it.
    assert!(debug.join("ferry.debug").exists() && debug.join("ferry-cni.debug").exists());
    let sizes = podman.podman(&[
        "run", "--rm", "--network", "none", &tag, "sh", "-c",
        "command -v ip nft iptables-legacy ferry ferry-cni >/dev/null && ferry version && stat -c %s /usr/local/bin/ferry",
    ]);
    assert!(
        sizes.starts_with(concat!("ferry ", env!("CARGO_PKG_VERSION"))),
        "{sizes}"
    );
    let in_image: u64 = sizes.lines().last().unwrap().trim().parse().unwrap();
    let built = fs::metadata(env!("CARGO_BIN_EXE_ferry")).unwrap().len();
    assert!(
        in_image < built / 2,
        "{in_image} of {built} bytes: not stripped"
    );

    // A node as a cloud VM is, and an API server that knows it.
    let mut lab = Lab::new("im");
    lab.add_ns("vm");
    lab.add_ns("gw");
    lab.veth("vm", "eth0", "gw", "gw0");
    lab.ip("gw", &["address", "add", "10.0.0.1/24", "dev", "gw0"]);
    lab.ip("vm", &["address", "add", "10.0.0.5/24", "dev", "eth0"]);
    lab.ip("vm", &["route", "add", "default", "via", "10.0.0.1"]);
    let node = serde_json::json!([{
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": "vm"},
        "spec": {"podCIDR": "10.244.5.0/24", "podCIDRs": ["10.244.5.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.5"}]}
    }]);
    let objects = dir.path().join("objects.json");
    fs::write(&objects, node.to_string()).unwrap();
    let log = dir.path().join("requests.jsonl");
    lab.daemon(
        "vm",
        "fake API server",
        &[
            "python3",
            SERVER,
            "--listen",
            "127.0.0.1:18080",
            "--objects",
            objects.to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
        ],
    );
    lab.wait_for(10, "the API server", |l| {
        l.exec("vm", 2, &["curl", "-sf", "http://127.0.0.1:18080/version"])
            .status
            .success()
    });
    let kubeconfig = dir.path().join("kubeconfig");
    fs::write(&kubeconfig, common::kubeconfig("http://127.0.0.1:18080")).unwrap();

    // What kube-proxy and flannel left on the node, made with the real tools, and
    // flannel's CNI configuration in the directory the manifest mounts.
    lab.run("vm", 10, &["sh", "-ec", LEFTOVERS]);
    let net_d = dir.path().join("net.d");
    fs::create_dir(&net_d).unwrap();
    fs::write(
        net_d.join("10-flannel.conflist"),
        r#"{"name":"cbr0","cniVersion":"0.3.1","plugins":[{"type":"flannel","delegate":{"hairpinMode":true,"isDefaultGateway":true}},{"type":"portmap","capabilities":{"portMappings":true}}]}"#,
    )
    .unwrap();
    let uplink_before = uplink(&lab);

    // A session from outside to the node (SSH, or kubelet's connection seen from the
    // API server), carrying data from before the agent starts until after it stops.
    lab.daemon("vm", "echo server", &["python3", "-c", common::ECHO_SERVER]);
    lab.wait_for(10, "the echo server", connects);
    let stop_file = dir.path().join("session.stop");
    lab.daemon(
        "gw",
        "session",
        &[
            "python3",
            "-c",
            common::SESSION_CLIENT,
            "10.0.0.5",
            "2222",
            stop_file.to_str().unwrap(),
        ],
    );

    // The manifest's agent, privileged in the node's namespace, /run/ferry mounted as
    // the DaemonSet mounts it.
    let run_ferry = dir.path().join("run-ferry");
    fs::create_dir(&run_ferry).unwrap();
    let name = format!("ferry-image-test-{}", std::process::id());
    let netns = format!("ns:/run/netns/{}", lab.ns("vm"));
    let mut run: Vec<String> = [
        "run",
        "--rm",
        "--name",
        &name,
        "--privileged",
        "--network",
        &netns,
        "-e",
        "NODE_NAME=vm",
        "-e",
        "KUBECONFIG=/etc/ferry/kubeconfig",
        "-v",
    ]
    .map(str::to_string)
    .to_vec();
    run.push(format!("{}:/etc/ferry/kubeconfig:ro", kubeconfig.display()));
    run.push("-v".into());
    run.push(format!("{}:/run/ferry", run_ferry.display()));
    run.push("-v".into());
    run.push(format!("{}:/etc/cni/net.d", net_d.display()));
    // The manifest's `netns` volume: the pods' namespaces, where the agent makes their
    // interfaces (Bidirectional there, rshared here).
    run.push("-v".into());
    run.push("/var/run/netns:/var/run/netns:rshared".into());
    run.push(tag.clone());
    run.extend(argv);
    let child = podman
        .command("podman")
        .args(&run)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut container = Container {
        podman: &podman,
        name: name.clone(),
        child: Some(child),
    };
    let socket = run_ferry.join("ferry.sock");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let tap = lab.ip("vm", &["-br", "address"]);
        if tap.contains("ferry0") && tap.contains("10.0.0.5/24") && socket.exists() {
            break;
        }
        if let Some(c) = container.child.as_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            let out = container.child.take().unwrap().wait_with_output().unwrap();
            panic!(
                "the container exited ({status}): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not take the uplink: {tap}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    lab.run("gw", 5, &["ping", "-c", "1", "-W", "2", "10.0.0.5"]);
    lab.wait_for(10, "new connections to the taken node", connects);
    let status = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["status", "-o", "json", "--api-socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let s: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(s["datastore"]["kind"], "kubernetes", "{s}");
    lab.wait_for(15, "the Node's annotations written", |l| {
        let node = l.exec(
            "vm",
            3,
            &["curl", "-sf", "http://127.0.0.1:18080/api/v1/nodes"],
        );
        String::from_utf8_lossy(&node.stdout).contains("\"ferry.io/ipv4-address\": \"10.0.0.5/24\"")
    });

    // `ferry cleanup`, from the image, as docs/install.md migrates a node (the CNI
    // configuration directory mounted into the container for it): a dry run
    // lists every leftover and removes nothing; the run removes them; a second finds none.
    let cleanup = |args: &[&str]| {
        let mut c = vec!["exec", name.as_str(), "ferry", "cleanup"];
        c.extend_from_slice(args);
        podman.podman(&c)
    };
    let listed = cleanup(&["--dry-run"]);
    for item in [
        "KUBE-SERVICES",
        "KUBE-FIREWALL",
        "FLANNEL-FWD",
        "kube-proxy",
        "flannel.1",
        "cni0",
        "10-flannel.conflist",
    ] {
        assert!(
            listed.contains(item),
            "the dry run does not list {item}: {listed}"
        );
    }
    assert!(
        !leftovers_gone(&lab, &net_d),
        "the dry run removed something"
    );
    cleanup(&[]);
    assert!(leftovers_gone(&lab, &net_d), "ferry cleanup left something");
    let again = cleanup(&["--dry-run"]);
    assert_eq!(again.trim(), "nothing left by kube-proxy or flannel");

    // Pods made through the CNI plugin on the agent's socket, and a NodePort Service to
    // one of them, as the API server would tell it: pod to pod, the node to a pod, and
    // from outside through the node's own address.
    lab.add_ns("pa");
    lab.add_ns("pb");
    let b = common::cni_pods(&lab, &socket, &dir.path().join("cni"))[1].clone();
    let push = web_service(&b).to_string();
    lab.run(
        "vm",
        5,
        &[
            "curl",
            "-sf",
            "-X",
            "POST",
            "--data-binary",
            &push,
            "http://127.0.0.1:18080/_push",
        ],
    );
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
    lab.wait_for(20, "the pods, and the NodePort from outside", |l| {
        let url = format!("http://{b}:8080/hostname");
        fetch(l, "pa", &url) == "b"
            && fetch(l, "vm", &url) == "b"
            && fetch(l, "gw", "http://10.0.0.5:30080/hostname") == "b"
    });

    // Stopped as a pod is deleted: SIGTERM, and the node's stack back on eth0.
    podman.podman(&["stop", "-t", "10", &name]);
    let out = container.child.take().unwrap().wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("back on the uplink"), "{err}");
    let eth0 = lab.ip("vm", &["-br", "address", "show", "dev", "eth0"]);
    assert!(eth0.contains("10.0.0.5/24"), "{eth0}");
    lab.run("gw", 5, &["ping", "-c", "1", "-W", "2", "10.0.0.5"]);
    assert_eq!(
        uplink(&lab),
        uplink_before,
        "the uplink given back as it was"
    );
    assert!(connects(&lab), "new connections to the node without ferry");
    let (lines, gap) = common::end_session(&mut lab, "session", &stop_file);
    assert!(lines >= 20, "{lines} lines echoed");
    eprintln!("the session: {lines} lines echoed, longest gap {gap} ms");
    drop(container);
    podman.podman(&["rmi", "-a", "-f"]);
}
