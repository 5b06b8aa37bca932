//! ferry's image, built the way `scripts/image.sh` builds it (a Debian base made by
//! mmdebstrap and imported into podman, `deploy/image/Containerfile`, the binaries
//! stripped), then run privileged in a node's network namespace with the agent's command
//! and arguments read from `deploy/ferry.yaml`: against a fake API server it takes the
//! node's uplink (the node still answers on its address), writes its Node's annotations,
//! answers `ferry status` on the socket the manifest's mount gives, and when the
//! container stops gives the node's stack back.
//!
//! Podman runs with runc, `default_ulimits = []` and storage of the test's own (vfs, in a
//! temporary directory): nothing outside the test is changed or left behind.
//!
//! Needs root, podman, runc, mmdebstrap (and Debian's mirror), binutils, iproute2,
//! python3 and curl.

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

#[test]
fn the_image_runs_the_manifests_agent_in_a_node_namespace() {
    require(&[
        ("podman", "podman"),
        ("runc", "runc"),
        ("mmdebstrap", "mmdebstrap"),
        ("objcopy", "binutils"),
        ("ip", "iproute2"),
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

    // Stopped as a pod is deleted: SIGTERM, and the node's stack back on eth0.
    podman.podman(&["stop", "-t", "10", &name]);
    let out = container.child.take().unwrap().wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("back on the uplink"), "{err}");
    let eth0 = lab.ip("vm", &["-br", "address", "show", "dev", "eth0"]);
    assert!(eth0.contains("10.0.0.5/24"), "{eth0}");
    lab.run("gw", 5, &["ping", "-c", "1", "-W", "2", "10.0.0.5"]);
    drop(container);
    podman.podman(&["rmi", "-a", "-f"]);
}
