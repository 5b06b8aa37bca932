//! `ferry lab demo` as CI runs it: the lab up (three nodes in two zones, agents, pods
//! through ferry-cni, the external client and load balancer), every scenario of
//! `ferry lab check` passing, and down leaving no namespace behind. Also `down` after a
//! crash that lost the lab's state. Needs root, iproute2, nftables, curl, ping, tshark.

mod common;

use std::process::Command;

use common::lab::{cni_plugin, ferry_lab, namespaces};

#[test]
fn the_lab_demo_passes_every_scenario_and_leaves_nothing_behind() {
    common::require(&[
        ("ip", "iproute2"),
        ("nft", "nftables"),
        ("curl", "curl"),
        ("ping", "iputils-ping"),
        ("tshark", "tshark"),
    ]);
    let cni = cni_plugin();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lab");
    let prefix = format!("fl{}", std::process::id() % 1_000_000);
    let out = ferry_lab(
        &dir,
        &[
            "demo",
            "--prefix",
            &prefix,
            "--cni-bin",
            cni.to_str().unwrap(),
        ],
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let left = namespaces(&prefix);
    if !left.is_empty() {
        let _ = ferry_lab(&dir, &["down", "--prefix", &prefix]);
    }
    assert!(out.status.success(), "ferry lab demo failed:\n{text}");
    assert!(text.contains(" 0 failed"), "{text}");
    assert!(!text.contains("FAIL"), "{text}");
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(!dir.exists(), "the lab directory is left behind");
}

#[test]
fn down_removes_a_crashed_lab_by_its_prefix() {
    common::require(&[("ip", "iproute2")]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lab");
    let prefix = format!("fc{}", std::process::id() % 1_000_000);
    // What a crash half-way through `up` leaves: namespaces with a process in them, a
    // manifest directory, no state file.
    std::fs::create_dir_all(dir.join("cluster")).unwrap();
    let ns = format!("{prefix}-node1");
    common::sh(&["ip", "netns", "add", &ns]);
    let mut sleeper = Command::new("ip")
        .args(["netns", "exec", &ns, "sleep", "600"])
        .spawn()
        .unwrap();
    common::sh(&["ip", "netns", "add", &format!("{prefix}-fabric")]);
    let out = ferry_lab(&dir, &["down", "--prefix", &prefix]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = sleeper.wait().unwrap();
    assert!(
        !status.success(),
        "the process in the namespace was stopped"
    );
    assert!(namespaces(&prefix).is_empty());
    assert!(!dir.exists());
}
