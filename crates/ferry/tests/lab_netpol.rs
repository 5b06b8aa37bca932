//! `ferry lab check --suite netpol` in CI: a lab up (three nodes in two zones), every
//! case of the suite (the Kubernetes e2e NetworkPolicy cases and the ClusterNetworkPolicy
//! ones) passing with real packets through the agents' policy tables, and the lab down
//! leaving no namespace, process or directory behind, also when a case fails. About
//! three minutes. Needs root, iproute2, nftables, curl, ping, tshark (as `ferry lab up`).

mod common;

use std::time::{Duration, Instant};

use common::lab::{Lab, text};

/// Whether `pid` runs: it exists and is no zombie.
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or_default()
            .trim_start()
            .starts_with('Z')
    })
}

/// The number of cases `--list` names, read from its closing line.
fn listed_cases(list: &str) -> usize {
    let last = list.lines().last().unwrap_or_default();
    last.strip_suffix(" cases")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no closing count in the listing:\n{list}"))
}

#[test]
fn every_netpol_case_passes_on_the_lab_and_down_leaves_nothing_behind() {
    common::require(&[
        ("ip", "iproute2"),
        ("nft", "nftables"),
        ("curl", "curl"),
        ("ping", "iputils-ping"),
        ("tshark", "tshark"),
    ]);
    let started = Instant::now();
    let mut lab = Lab::up("fn");
    let list = lab.run(&["check", "--suite", "netpol", "--list"]);
    assert!(list.status.success(), "{}", text(&list));
    let cases = listed_cases(&String::from_utf8_lossy(&list.stdout));
    assert!(cases > 50, "only {cases} cases listed");

    let out = lab.run(&["check", "--suite", "netpol"]);
    let report = text(&out);
    let pids = lab.pids();
    let left = lab.down();
    eprintln!(
        "{report}netpol suite and lab: {:.0} s",
        started.elapsed().as_secs_f64()
    );

    assert!(out.status.success(), "a netpol case failed:\n{report}");
    let passed = report.lines().filter(|l| l.starts_with("PASS  ")).count();
    assert_eq!(passed, cases, "{report}");
    assert!(
        report.contains(&format!("{cases} passed, 0 failed")),
        "{report}"
    );
    assert!(left.is_none(), "left behind: {}", left.unwrap_or_default());
    assert!(pids.len() > 10, "the state recorded only {pids:?}");
    // Ended: gone, or a zombie its new parent has not reaped yet. A process killed at
    // the end of down's wait may take a moment to go.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut alive: Vec<u32> = pids;
    while !alive.is_empty() && Instant::now() < deadline {
        alive.retain(|&p| running(p));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        alive.is_empty(),
        "processes still running after down: {alive:?}"
    );
}
