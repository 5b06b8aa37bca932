//! `ferry lab restart NODE [--kill]`: a node's agent replaced with the command `up`
//! recorded, as a crash and as an update would, the new pid recorded in place of the
//! old, the node kernel's host TAP set up again, and the lab forwarding as before; every
//! node, before and after its agent was replaced, choosing the same endpoint for a new
//! connection to a Service (consistent hashing). (The restart rows of `ferry lab check`,
//! which run traffic through it, are in `lab.rs`.)
//! Needs root, iproute2, nftables, curl, ping.

mod common;

use common::lab::{Lab, text};

/// The pid the lab's state records for node `n`'s agent.
fn agent_pid(lab: &Lab, n: u8) -> u32 {
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lab.dir.join("state.json")).unwrap())
            .unwrap();
    let label = format!("ferry agent on node{n}");
    let found: Vec<u64> = state["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["label"] == label.as_str())
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(found.len(), 1, "one record of {label}: {found:?}");
    found[0] as u32
}

/// The number after `before` in `line`.
fn number_after(line: &str, before: &str) -> u64 {
    let rest = line
        .split_once(before)
        .unwrap_or_else(|| panic!("no {before:?} in {line:?}"))
        .1;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number after {before:?} in {line:?}"))
}

/// `ferry lab restart ARGS`, its line, checked: the old pid was the agent's, the new one
/// is recorded, runs, and the old one is gone.
fn restart(lab: &Lab, n: u8, args: &[&str], how: &str) -> String {
    let old = agent_pid(lab, n);
    let out = lab.run(args);
    let line = text(&out);
    assert!(out.status.success(), "ferry lab {args:?}: {line}");
    assert!(line.starts_with(&format!("node{n}: {how}")), "{line}");
    assert_eq!(number_after(&line, "): agent "), u64::from(old), "{line}");
    let new = agent_pid(lab, n);
    assert_ne!(new, old);
    assert_eq!(number_after(&line, "; agent "), u64::from(new), "{line}");
    let forwarding = number_after(&line, " forwarding ");
    assert!(forwarding < 15_000, "{line}");
    assert!(
        std::path::Path::new(&format!("/proc/{new}")).exists(),
        "the new agent {new} runs"
    );
    let stat = std::fs::read_to_string(format!("/proc/{old}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty()
            || stat
                .rsplit(')')
                .next()
                .unwrap()
                .trim_start()
                .starts_with('Z'),
        "the old agent {old} is gone: {stat}"
    );
    line
}

/// The endpoint node `n`'s agent chooses for each of 16 new connections from the
/// external client to `multi`'s cluster IP (two endpoints, on node1 and node3), as
/// `ferry trace` says on a copy of its live state.
fn chosen(lab: &Lab, n: u8) -> Vec<String> {
    let sock = lab.dir.join(format!("node{n}.sock"));
    (40001..=40016)
        .map(|port| {
            let packet = format!("tcp 10.20.0.2:{port} -> 10.96.0.13:80 syn");
            let out = std::process::Command::new(common::lab::FERRY)
                .args(["trace", "--no-reply", "--in", "uplink", "--api-socket"])
                .arg(&sock)
                .arg(&packet)
                .output()
                .unwrap();
            let t = text(&out);
            assert!(out.status.success(), "node{n}: {packet}: {t}");
            let endpoint = t
                .lines()
                .find_map(|l| l.trim_start().strip_prefix("service "))
                .and_then(|l| l.split_once("-> endpoint "))
                .and_then(|(_, e)| e.split_whitespace().next())
                .unwrap_or_else(|| panic!("node{n}: no endpoint in the trace of {packet}: {t}"));
            endpoint.to_string()
        })
        .collect()
}

#[test]
fn a_restarted_agent_forwards_with_its_recorded_command_and_host_tap() {
    common::require(&[
        ("ip", "iproute2"),
        ("nft", "nftables"),
        ("curl", "curl"),
        ("ping", "iputils-ping"),
    ]);
    let mut lab = Lab::up("frs");
    // Maglev: every node, and every agent of a node, chooses the endpoint of a new
    // connection alike (with both endpoints among the choices).
    let before = chosen(&lab, 1);
    assert!(
        before.contains(&"10.244.1.4:8080".to_string())
            && before.contains(&"10.244.3.2:8080".to_string()),
        "{before:?}"
    );
    assert_eq!(chosen(&lab, 2), before, "node2 and node1");
    assert_eq!(chosen(&lab, 3), before, "node3 and node1");
    // node2 has web; node1 is where the client's node-port connection enters.
    let crash = restart(&lab, 2, &["restart", "node2", "--kill"], "kill (SIGKILL)");
    let update = restart(&lab, 1, &["restart", "1"], "update (handover)");
    let crash1 = restart(&lab, 1, &["restart", "1", "--kill"], "kill (SIGKILL)");
    assert_eq!(chosen(&lab, 1), before, "node1 after {update} and {crash1}");
    // A crash that loses the checkpoint too: the new agent starts with no state at all,
    // and still chooses the same endpoints.
    let log = lab.dir.join("logs/agent-node1.log");
    let restores = || {
        std::fs::read_to_string(&log)
            .unwrap()
            .matches("the previous agent's checkpoint")
            .count()
    };
    let restored = restores();
    assert!(restored >= 1, "the kill restored node1's checkpoint");
    let cold = restart(
        &lab,
        1,
        &["restart", "1", "--kill", "--without-checkpoint"],
        "kill without checkpoint (SIGKILL, checkpoint removed)",
    );
    assert_eq!(restores(), restored, "no checkpoint restored after {cold}");
    assert_eq!(chosen(&lab, 1), before, "node1 after {cold}");
    let out = lab.run(&["restart", "1", "--without-checkpoint"]);
    assert!(!out.status.success(), "--without-checkpoint without --kill");
    assert_eq!(chosen(&lab, 2), before, "node2 after {crash}");
    for n in [1, 2] {
        let tap = format!("{}h{n}", lab.prefix);
        let out = lab.run(&[
            "exec",
            &format!("node{n}"),
            "--",
            "ip",
            "-o",
            "addr",
            "show",
            &tap,
        ]);
        let addr = format!("10.10.{}.1{n}/32", n - 1);
        assert!(
            text(&out).contains(&addr),
            "node{n}'s kernel on {tap}: {}",
            text(&out)
        );
    }
    // Through node1's node port to web on node2, and from pod a on node1 to web.
    let url = "http://10.10.0.11:30080/clientip";
    let out = lab.run(&[
        "exec",
        "client",
        "--",
        "curl",
        "-sS",
        "--max-time",
        "3",
        url,
    ]);
    assert_eq!(text(&out), "10.20.0.2", "after {crash} and {update}");
    let out = lab.run(&[
        "exec",
        "a",
        "--",
        "ping",
        "-c",
        "2",
        "-W",
        "2",
        "10.244.2.2",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let status = text(&lab.run(&["status"]));
    assert!(!status.contains("EXITED"), "{status}");

    let out = lab.run(&["restart", "node7"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("node7: not a node of the lab (node1..node3)"),
        "{}",
        text(&out)
    );
    if let Some(left) = lab.down() {
        panic!("left behind: {left}");
    }
}
