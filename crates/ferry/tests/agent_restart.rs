//! An agent restart leaves the CNI plugin's pod interfaces in place: a pod attached
//! through the API keeps its eth0 when the agent stops, a new agent with the same
//! `--state-dir` adopts it and traffic flows again without a new ADD; DEL then removes
//! the interface and the record. Recorded attachments that cannot be adopted are
//! dropped, and a corrupt state file is moved aside. A DEL the CNI plugin queued while
//! no agent ran is carried out before the next agent adopts anything, and one queued
//! while an agent runs soon after. The connection state is checkpointed in the state
//! directory and the next agent restores it; a checkpoint that does not read is moved
//! aside. Needs root, iproute2 and ping.

mod common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::one_node::{Node, ok};
use ferry_agent::api::call;
use ferry_agent::state;
use ferry_api::{PodRef, Request};

/// The attachments recorded in the node's state directory.
fn records(node: &Node) -> Vec<state::Attachment> {
    match state::load(&node.state).unwrap() {
        state::Loaded::Attachments(a) => a,
        other => panic!("state in {}: {other:?}", node.state.display()),
    }
}

#[test]
fn a_restarted_agent_adopts_the_pods_interface() {
    adopts_across_a_restart("rst", &[], &[]);
}

#[test]
fn a_multi_queue_pod_interface_is_adopted_by_an_agent_of_one_worker() {
    // Two workers make the pod's TAP with two queues; one worker opens one of them.
    adopts_across_a_restart("rmq", &["--workers", "2"], &["--workers", "1"]);
}

#[test]
fn a_single_queue_pod_interface_is_adopted_by_an_agent_of_two_workers() {
    // Whether a TAP has queues is fixed when it is made: two workers take it as it is.
    adopts_across_a_restart("rsq", &["--workers", "1"], &["--workers", "2"]);
}

/// A pod attached through the API to an agent started with `first` keeps its interface
/// when the agent stops, and the next agent, started with `second`, adopts it.
fn adopts_across_a_restart(tag: &str, first: &[&str], second: &[&str]) {
    let mut node = Node::new(tag);
    node.start("ferry agent 1", first);
    let netns = format!("/var/run/netns/{}", node.lab.ns("p1"));
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
    ok(call(&node.sock, &add).unwrap());
    node.lab.ping("p1", "192.168.77.100", 56, 2);
    let recorded = records(&node);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0].container_id, "c0ffee");
    assert_eq!(recorded[0].netns, node.lab.ns("p1"));

    let log = node.lab.stop("ferry agent 1");
    assert!(
        node.has_eth0(),
        "the pod's eth0 is gone with the agent: {log}"
    );
    assert_eq!(records(&node), recorded, "the record stays");
    // No agent: nothing forwards.
    assert!(
        !node
            .lab
            .exec("p1", 5, &["ping", "-c", "1", "-W", "1", "192.168.77.100"])
            .status
            .success(),
        "a reply without an agent"
    );
    // The TAP has no carrier now; the pod's kernel still knows its gateway, so its
    // first packet to an agent that starts goes out at once.
    let gateway = |node: &Node| {
        let out = node
            .lab
            .exec("p1", 5, &["ip", "neigh", "show", "dev", "eth0"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let kept = gateway(&node);
    assert!(
        kept.lines().any(|l| l.starts_with("169.254.1.1 ")
            && l.contains("ee:ee:ee:ee:ee:ee")
            && l.contains("PERMANENT")),
        "the gateway's neighbour entry without an agent: {kept}"
    );
    // An interface made without the entry (by an earlier agent) gets it at adoption.
    node.lab.exec(
        "p1",
        5,
        &["ip", "neigh", "del", "169.254.1.1", "dev", "eth0"],
    );
    assert!(
        !gateway(&node).contains("169.254.1.1 "),
        "{}",
        gateway(&node)
    );

    node.start("ferry agent 2", second);
    let pinned = gateway(&node);
    assert!(
        pinned
            .lines()
            .any(|l| l.starts_with("169.254.1.1 ") && l.contains("PERMANENT")),
        "the gateway's neighbour entry after adoption: {pinned}"
    );
    node.lab.ping("p1", "192.168.77.100", 56, 2);
    let check = Request::Check {
        container_id: "c0ffee".into(),
        ifname: "eth0".into(),
        netns,
    };
    ok(call(&node.sock, &check).unwrap());
    let a = ok(call(&node.sock, &add).unwrap());
    assert_eq!(
        a.mac.as_deref(),
        Some("0a:58:0a:f4:01:05"),
        "ADD again: the adopted attachment's answer"
    );

    let del = Request::Del {
        container_id: "c0ffee".into(),
        ifname: "eth0".into(),
    };
    ok(call(&node.sock, &del).unwrap());
    assert!(!node.has_eth0(), "eth0 goes with the attachment");
    assert_eq!(records(&node), [], "the record goes with the attachment");
    let log = node.lab.stop("ferry agent 2");
    assert!(log.contains("pod interface adopted"), "{log}");
}

#[test]
fn recorded_attachments_that_cannot_be_adopted_are_dropped() {
    let mut node = Node::new("rsg");
    let gone = state::Attachment {
        container_id: "dead".into(),
        ifname: "eth0".into(),
        pod_namespace: "default".into(),
        pod_name: "gone".into(),
        netns: node.lab.ns("gone"),
        named_here: false,
        addresses: vec!["10.244.1.9/24".parse().unwrap()],
    };
    // The namespace is there but has no eth0.
    let no_if = state::Attachment {
        container_id: "empty".into(),
        pod_name: "empty".into(),
        netns: node.lab.ns("p1"),
        addresses: vec!["10.244.1.10/24".parse().unwrap()],
        ..gone.clone()
    };
    state::save(&node.state, &[gone, no_if]).unwrap();
    node.start("ferry agent", &[]);
    assert_eq!(records(&node), [], "both dropped from the record");
    let counters = ok(call(&node.sock, &Request::Counters).unwrap())
        .counters
        .expect("counters");
    assert_eq!(counters.errors.apply, 2, "{:?}", counters.errors);
    assert!(!node.has_eth0(), "no interface made for a dropped record");
    let log = node.lab.stop("ferry agent");
    assert_eq!(
        log.matches("recorded pod attachment dropped").count(),
        2,
        "{log}"
    );
}

#[test]
fn a_corrupt_state_file_is_moved_aside() {
    let mut node = Node::new("rsc");
    fs::create_dir_all(&node.state).unwrap();
    let file = state::path(&node.state);
    fs::write(&file, "{ not json").unwrap();
    node.start("ferry agent", &[]);
    let bad = Path::new(&format!("{}.bad", file.display())).to_path_buf();
    let counters = ok(call(&node.sock, &Request::Counters).unwrap())
        .counters
        .expect("counters");
    assert_eq!(counters.errors.apply, 1, "{:?}", counters.errors);
    assert_eq!(fs::read_to_string(&bad).unwrap(), "{ not json");
    // The agent works on: an ADD is recorded in a new file.
    let add = Request::Add {
        container_id: "c1".into(),
        netns: format!("/var/run/netns/{}", node.lab.ns("p1")),
        ifname: "eth0".into(),
        pod: PodRef {
            namespace: "default".into(),
            name: "web".into(),
        },
        addresses: vec!["10.244.1.5/24".into()],
    };
    ok(call(&node.sock, &add).unwrap());
    assert_eq!(records(&node).len(), 1);
    let log = node.lab.stop("ferry agent");
    assert!(log.contains("the state file is corrupt"), "{log}");
}

/// The CNI plugin next to ferry, built if this test runs before it was (cargo builds a
/// workspace's binaries for `cargo test --workspace`, not for `-p ferry`).
fn cni_plugin() -> PathBuf {
    let cni = PathBuf::from(env!("CARGO_BIN_EXE_ferry")).with_file_name("ferry-cni");
    if !cni.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", "ferry-cni"])
            .status()
            .expect("cargo");
        assert!(status.success(), "building ferry-cni");
    }
    cni
}

/// Runs the CNI plugin as a runtime does, with the node's socket and leases in its
/// directory; returns whether it succeeded, its standard output and standard error.
fn cni(node: &Node, command: &str, id: &str, netns: &str, pod: &str) -> (bool, String, String) {
    let conf = serde_json::json!({
        "cniVersion": "1.1.0",
        "name": "ferry",
        "type": "ferry-cni",
        "socket": node.sock,
        "dataDir": node.dir.path().join("leases"),
    });
    let mut child = Command::new(cni_plugin())
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env(
            "CNI_ARGS",
            format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod}"),
        )
        .env("CNI_PATH", "/opt/cni/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ferry-cni");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The leased addresses in the node's lease directory.
fn leases(node: &Node) -> Vec<String> {
    let Ok(dir) = fs::read_dir(node.dir.path().join("leases/ferry")) else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let name = e.unwrap().file_name().into_string().unwrap();
        name.parse::<std::net::IpAddr>().ok().map(|_| name)
    })
    .collect()
}

#[test]
fn a_pod_deleted_while_the_agent_is_down_is_not_adopted_again() {
    let mut node = Node::new("rdq");
    node.start("ferry agent 1", &[]);
    let netns = format!("/var/run/netns/{}", node.lab.ns("p1"));
    let (ok, out, err) = cni(&node, "ADD", "dead0", &netns, "web");
    assert!(ok, "ADD: {out}{err}");
    assert_eq!(records(&node).len(), 1);
    node.lab.ping("p1", "192.168.77.100", 56, 1);

    node.lab.stop("ferry agent 1");
    // The runtime deletes the pod while no agent runs, and its namespace only later:
    // it is still there when the next agent starts.
    let (ok, out, err) = cni(&node, "DEL", "dead0", "", "web");
    assert!(ok, "DEL with the agent down: {out}{err}");
    assert!(err.contains("queued"), "{err}");
    assert_eq!(
        leases(&node),
        Vec::<String>::new(),
        "the leases are released"
    );
    let queue = ferry_api::del_queue_dir(&node.sock);
    assert_eq!(fs::read_dir(&queue).unwrap().count(), 1);
    assert!(node.has_eth0(), "nothing deleted the interface yet");

    node.start("ferry agent 2", &[]);
    assert_eq!(records(&node), [], "the deleted pod's record is dropped");
    assert!(!node.has_eth0(), "the deleted pod's interface is deleted");
    assert_eq!(
        fs::read_dir(&queue).unwrap().count(),
        0,
        "the queue is done"
    );
    // The same pod again, from a new sandbox: the agent takes it, with the address
    // the first one had or another.
    let (ok, out, err) = cni(&node, "ADD", "live1", &netns, "web");
    assert!(ok, "ADD of the same pod again: {out}{err}");
    node.lab.ping("p1", "192.168.77.100", 56, 1);
    let (ok, out, err) = cni(&node, "DEL", "live1", &netns, "web");
    assert!(ok, "DEL: {out}{err}");
    assert!(!node.has_eth0());
    let log = node.lab.stop("ferry agent 2");
    assert!(!log.contains("pod interface adopted"), "{log}");
    assert!(log.contains("recorded pod attachment deleted"), "{log}");
}

#[test]
fn a_del_queued_while_the_agent_runs_is_carried_out() {
    let mut node = Node::new("rdl");
    node.start("ferry agent", &[]);
    let add = Request::Add {
        container_id: "late1".into(),
        netns: format!("/var/run/netns/{}", node.lab.ns("p1")),
        ifname: "eth0".into(),
        pod: PodRef {
            namespace: "default".into(),
            name: "web".into(),
        },
        addresses: vec!["10.244.1.5/24".into()],
    };
    ok(call(&node.sock, &add).unwrap());
    assert!(node.has_eth0());
    // What a plugin that found no socket yet (the agent starting) queued, and a file
    // that is no DEL.
    let queue = ferry_api::del_queue_dir(&node.sock);
    let del = Request::Del {
        container_id: "late1".into(),
        ifname: "eth0".into(),
    };
    fs::write(
        queue.join(ferry_api::del_queue_name("late1", "eth0")),
        serde_json::to_vec(&del).unwrap(),
    )
    .unwrap();
    fs::write(queue.join("junk.json"), "{").unwrap();
    let q = queue.clone();
    node.lab
        .wait_for(5, "the queued DEL carried out", move |_| {
            fs::read_dir(&q).unwrap().count() == 0
        });
    assert_eq!(records(&node), []);
    assert!(!node.has_eth0());
    let counters = ok(call(&node.sock, &Request::Counters).unwrap())
        .counters
        .expect("counters");
    assert_eq!(counters.errors.api, 1, "the junk: {:?}", counters.errors);
    let log = node.lab.stop("ferry agent");
    assert!(log.contains("queued CNI DEL carried out"), "{log}");
    assert!(log.contains("queued CNI DEL dropped"), "{log}");
}

#[test]
fn the_connection_state_is_checkpointed_restored_and_a_bad_checkpoint_refused() {
    let mut node = Node::new("rck");
    node.start("ferry agent 1", &["--checkpoint-interval", "0.2"]);
    let add = Request::Add {
        container_id: "ck".into(),
        netns: format!("/var/run/netns/{}", node.lab.ns("p1")),
        ifname: "eth0".into(),
        pod: PodRef {
            namespace: "default".into(),
            name: "web".into(),
        },
        addresses: vec!["10.244.1.5/24".into()],
    };
    ok(call(&node.sock, &add).unwrap());
    node.lab.ping("p1", "192.168.77.100", 56, 2);
    // Written while the agent runs, in the handover's format, with the ping's connection.
    let file = ferry_agent::checkpoint::path(&node.state);
    let tracked = |f: &Path| {
        fs::read(f)
            .ok()
            .and_then(|b| ferry_datapath::handover::decode(&b).ok())
            .map_or(0, |s| s.connections.len())
    };
    node.lab
        .wait_for(5, "a checkpoint with the ping", |_| tracked(&file) >= 1);
    let log = node.lab.stop("ferry agent 1");
    assert!(tracked(&file) >= 1, "no checkpoint after the stop: {log}");
    // The next agent goes on with it.
    node.start("ferry agent 2", &[]);
    let log = node.lab.stop("ferry agent 2");
    assert!(
        log.contains("the previous agent's checkpoint: restored ")
            && !log.contains("restored 0 connections"),
        "{log}"
    );
    // A checkpoint that does not read is moved aside; the agent starts cold.
    fs::write(&file, b"not a state").unwrap();
    node.start("ferry agent 3", &[]);
    node.lab.ping("p1", "192.168.77.100", 56, 1);
    let log = node.lab.stop("ferry agent 3");
    assert!(log.contains("the checkpoint is refused"), "{log}");
    let aside = file.with_file_name("datapath.state.refused");
    assert_eq!(fs::read(aside).unwrap(), b"not a state");
    assert!(
        ferry_datapath::handover::decode(&fs::read(&file).unwrap()).is_ok(),
        "the agent's own checkpoint replaces it"
    );
}
