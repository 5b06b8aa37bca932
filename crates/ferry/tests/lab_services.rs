//! `ferry lab check --suite services` in CI: a lab up (three nodes in two zones), every
//! case of the suite (the scenarios of the Kubernetes e2e Service tests) passing with
//! real packets, a second run on the same lab too (the suite keeps its clients and
//! cleans up after each case), and the lab down leaving nothing behind. About two
//! minutes. Needs root, iproute2, nftables, curl, ping, tshark (as `ferry lab up`).

mod common;

use common::lab::{Lab, text};

/// The number of cases a `--list` names, from its closing line.
fn listed(listing: &str) -> usize {
    listing
        .lines()
        .last()
        .and_then(|l| l.strip_suffix(" cases"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no closing count:\n{listing}"))
}

#[test]
fn every_services_case_passes_on_the_lab_twice() {
    common::require(&[
        ("ip", "iproute2"),
        ("nft", "nftables"),
        ("curl", "curl"),
        ("ping", "iputils-ping"),
        ("tshark", "tshark"),
    ]);
    let mut lab = Lab::up("fs");
    let list = lab.run(&["check", "--suite", "services", "--list"]);
    assert!(list.status.success(), "{}", text(&list));
    let listing = String::from_utf8_lossy(&list.stdout).to_string();
    let cases = listed(&listing);
    assert!(cases >= 23, "only {cases} cases:\n{listing}");

    let first = lab.run(&["check", "--suite", "services"]);
    let report = text(&first);
    // Again, only the cycling cases: what the first run left must not get in the way.
    let cycling = lab.run(&[
        "check",
        "--suite",
        "services",
        "--list",
        "--case",
        "server pod cycles",
    ]);
    let cycling = listed(&String::from_utf8_lossy(&cycling.stdout));
    assert!(cycling >= 3, "{cycling} cycling cases");
    let again = lab.run(&[
        "check",
        "--suite",
        "services",
        "--case",
        "server pod cycles",
    ]);
    let second = text(&again);
    let left = lab.down();
    eprintln!("{report}{second}");

    assert!(first.status.success(), "a services case failed:\n{report}");
    let passed = report.lines().filter(|l| l.starts_with("PASS  ")).count();
    assert_eq!(passed, cases, "{report}");
    assert!(
        report.contains(&format!("{cases} passed, 0 failed, 0 skipped")),
        "{report}"
    );
    assert!(again.status.success(), "the second run failed:\n{second}");
    assert!(
        second.contains(&format!("{cycling} passed, 0 failed")),
        "{second}"
    );
    assert!(left.is_none(), "left behind: {}", left.unwrap_or_default());
}
