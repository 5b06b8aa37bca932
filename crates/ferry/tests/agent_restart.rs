//! An agent restart leaves the CNI plugin's pod interfaces in place: a pod attached
//! through the API keeps its eth0 when the agent stops, a new agent with the same
//! `--state-dir` adopts it and traffic flows again without a new ADD; DEL then removes
//! the interface and the record. Recorded attachments that cannot be adopted are
//! dropped, and a corrupt state file is moved aside. Needs root, iproute2 and ping.

mod common;

use std::fs;
use std::path::Path;

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

    node.start("ferry agent 2", second);
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
