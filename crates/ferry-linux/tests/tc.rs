//! The uplink's ingress drop filter ([`IngressDrop`]) against what else may be on the
//! device: a leftover of a ferry that died, other owners' filters, renamed and recreated
//! devices. Needs root, `ip` and `tc`.

mod common;

use common::{Netns, require_root_and_ip};
use ferry_linux::tc::{HANDLE, IngressDrop, PREF};
use serde_json::Value;

/// A namespace with a veth pair `tc0`/`tc1` in it.
fn lab(tag: &str) -> Netns {
    require_root_and_ip();
    let ns = Netns::new(tag);
    ns.ip(&["link", "add", "tc0", "type", "veth", "peer", "name", "tc1"]);
    ns
}

fn tc(ns: &Netns, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("tc")
        .args(["-n", &ns.name])
        .args(args)
        .output()
        .expect("cannot run tc (install package iproute2)");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// (pref, handle, kind) of every filter on `dev`'s ingress that has a handle.
fn filters(ns: &Netns, dev: &str) -> Vec<(u64, String, String)> {
    let out = tc(ns, &["-j", "filter", "show", "dev", dev, "ingress"]).unwrap();
    if out.trim().is_empty() {
        return Vec::new();
    }
    let v: Vec<Value> = serde_json::from_str(&out).unwrap();
    v.iter()
        .filter_map(|f| {
            Some((
                f["pref"].as_u64()?,
                f.get("options")?.get("handle")?.as_str()?.to_string(),
                f["kind"].as_str()?.to_string(),
            ))
        })
        .collect()
}

fn has_clsact(ns: &Netns, dev: &str) -> bool {
    tc(ns, &["qdisc", "show", "dev", dev])
        .unwrap()
        .contains("clsact")
}

fn ours(f: &[(u64, String, String)]) -> usize {
    let handle = format!("{HANDLE:#x}");
    f.iter()
        .filter(|(p, h, _)| *p == u64::from(PREF) && *h == handle)
        .count()
}

#[test]
fn a_leftover_of_a_dead_ferry_is_taken_over() {
    let ns = lab("tcl");
    let first = ns.run(|| IngressDrop::install("tc0")).unwrap();
    // A ferry killed with SIGKILL never runs its cleanup.
    std::mem::forget(first);
    assert_eq!(ours(&filters(&ns, "tc0")), 1);

    let second = ns
        .run(|| IngressDrop::install("tc0"))
        .expect("a restarted ferry installs over its own leftover");
    assert_eq!(ours(&filters(&ns, "tc0")), 1, "{:?}", filters(&ns, "tc0"));
    second.remove().unwrap();
    assert_eq!(ours(&filters(&ns, "tc0")), 0, "{:?}", filters(&ns, "tc0"));
}

/// Adds another owner's `bpf` filter (passing everything) at `pref`, handle 1.
fn add_foreign(ns: &Netns, pref: u32, protocol: &str) {
    let pref = pref.to_string();
    tc(
        ns,
        &[
            "filter",
            "add",
            "dev",
            "tc0",
            "ingress",
            "pref",
            &pref,
            "handle",
            "1",
            "protocol",
            protocol,
            "bpf",
            "da",
            "bytecode",
            "1,6 0 0 0",
        ],
    )
    .unwrap();
}

#[test]
fn a_failed_install_leaves_another_owners_filter_alone() {
    let ns = lab("tcf");
    tc(&ns, &["qdisc", "add", "dev", "tc0", "clsact"]).unwrap();
    // Another owner's filter at ferry's preference, for IPv4 only: ferry's filter (all
    // protocols) cannot join it.
    add_foreign(&ns, PREF, "ip");
    let before = filters(&ns, "tc0");
    ns.run(|| IngressDrop::install("tc0"))
        .expect_err("ferry's filter cannot share a preference across protocols");
    assert_eq!(filters(&ns, "tc0"), before);
}

#[test]
fn a_stop_leaves_another_owners_filter_at_the_same_preference() {
    let ns = lab("tcs");
    tc(&ns, &["qdisc", "add", "dev", "tc0", "clsact"]).unwrap();
    add_foreign(&ns, PREF, "all");
    let before = filters(&ns, "tc0");
    let Ok(drop) = ns.run(|| IngressDrop::install("tc0")) else {
        // A kernel with matchall: ferry's matchall cannot share the preference, and the
        // failed install leaves the other owner's filter as it was.
        assert_eq!(filters(&ns, "tc0"), before);
        return;
    };
    assert_eq!(ours(&filters(&ns, "tc0")), 1);
    drop.remove().unwrap();
    assert_eq!(filters(&ns, "tc0"), before);
}

#[test]
fn the_clsact_ferry_made_stays_while_others_use_it() {
    let ns = lab("tcq");
    let drop = ns.run(|| IngressDrop::install("tc0")).unwrap();
    add_foreign(&ns, 100, "all");
    drop.remove().unwrap();
    assert_eq!(filters(&ns, "tc0").len(), 1, "{:?}", filters(&ns, "tc0"));
    assert!(has_clsact(&ns, "tc0"));

    // Alone on it, the qdisc goes with ferry's filter.
    tc(
        &ns,
        &["filter", "del", "dev", "tc0", "ingress", "pref", "100"],
    )
    .unwrap();
    tc(&ns, &["qdisc", "del", "dev", "tc0", "clsact"]).unwrap();
    let drop = ns.run(|| IngressDrop::install("tc0")).unwrap();
    assert!(has_clsact(&ns, "tc0"));
    drop.remove().unwrap();
    assert!(!has_clsact(&ns, "tc0"));
}

#[test]
fn a_renamed_device_loses_the_filter_at_stop() {
    let ns = lab("tcr");
    let drop = ns.run(|| IngressDrop::install("tc0")).unwrap();
    ns.ip(&["link", "set", "dev", "tc0", "name", "tc9"]);
    drop.remove().unwrap();
    assert_eq!(filters(&ns, "tc9"), vec![]);
    assert!(!has_clsact(&ns, "tc9"));
}

#[test]
fn a_device_made_again_under_the_same_name_is_left_alone() {
    let ns = lab("tcn");
    let drop = ns.run(|| IngressDrop::install("tc0")).unwrap();
    ns.ip(&["link", "del", "dev", "tc0"]);
    ns.ip(&["link", "add", "tc0", "type", "veth", "peer", "name", "tc1"]);
    tc(&ns, &["qdisc", "add", "dev", "tc0", "clsact"]).unwrap();
    drop.remove().unwrap();
    assert!(has_clsact(&ns, "tc0"), "the new tc0's qdisc was deleted");
}
