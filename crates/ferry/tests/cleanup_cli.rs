//! `ferry cleanup` on a node with what kube-proxy and flannel leave, made by the real
//! tools: kube-proxy's chains through iptables-nft and iptables-legacy (IPv4 and IPv6)
//! with the jumps to them from the built-in chains, and its nftables table (not its IPVS
//! device `kube-ipvs0`: this kernel has no dummy devices; the unit tests find it by
//! name and kind); flannel's chains, its VXLAN device with a route, its bridge and its CNI
//! configuration. `--dry-run` lists each and removes nothing; the cleanup removes each
//! and leaves the rest (other rules, other devices, kubelet's own chain, another CNI
//! configuration); a second run finds nothing.
//!
//! Needs root, iproute2, iptables and nftables.

mod common;

use std::fs;
use std::process::Command;

use common::{Lab, require};

fn cleanup(lab: &Lab, args: &[&str]) -> (bool, String, String) {
    let ns = lab.ns("node");
    let mut all = vec![
        "netns",
        "exec",
        ns.as_str(),
        env!("CARGO_BIN_EXE_ferry"),
        "cleanup",
    ];
    all.extend_from_slice(args);
    let out = Command::new("ip").args(&all).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cleanup_lists_then_removes_kube_proxy_and_flannel_leftovers_and_nothing_else() {
    require(&[
        ("ip", "iproute2"),
        ("iptables-legacy", "iptables"),
        ("nft", "nftables"),
    ]);
    let mut lab = Lab::new("cl");
    lab.add_ns("node");
    let sh = |script: &str| lab.run("node", 10, &["sh", "-ec", script]);
    sh("iptables-nft -t nat -N KUBE-SERVICES
        iptables-nft -t nat -N KUBE-SVC-ABC
        iptables-nft -t nat -A KUBE-SERVICES -d 10.96.0.1/32 -p tcp --dport 443 -j KUBE-SVC-ABC
        iptables-nft -t nat -A PREROUTING -m comment --comment 'kubernetes service portals' -j KUBE-SERVICES
        iptables-nft -t nat -A OUTPUT -m comment --comment 'kubernetes service portals' -j KUBE-SERVICES
        iptables-nft -t nat -A OUTPUT -d 192.0.2.1/32 -j ACCEPT
        iptables-nft -t mangle -N KUBE-KUBELET-CANARY
        ip6tables-nft -t nat -N KUBE-SERVICES
        ip6tables-nft -t nat -A PREROUTING -j KUBE-SERVICES
        iptables-legacy -N FLANNEL-FWD
        iptables-legacy -A FORWARD -m comment --comment 'flanneld forward' -j FLANNEL-FWD
        iptables-legacy -t nat -N FLANNEL-POSTRTG
        iptables-legacy -t nat -A POSTROUTING -j FLANNEL-POSTRTG
        iptables-legacy -N KUBE-FORWARD
        iptables-legacy -A FORWARD -j KUBE-FORWARD
        nft add table ip kube-proxy
        nft add chain ip kube-proxy services
        nft add table inet keep
        ip link add eth0 type veth peer name eth1
        ip address add 192.168.50.2/24 dev eth0
        ip link set eth0 up
        ip link add flannel.1 type vxlan id 1 dstport 8472 local 192.168.50.2 dev eth0
        ip link set flannel.1 up
        ip route add 10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink
        ip link add cni0 type bridge
        ip address add 10.244.1.1/24 dev cni0");
    let conf = tempfile::tempdir().unwrap();
    let flannel = conf.path().join("10-flannel.conflist");
    fs::write(
        &flannel,
        r#"{"name": "cbr0", "cniVersion": "0.3.1", "plugins": [{"type": "flannel", "delegate": {"isDefaultGateway": true}}, {"type": "portmap"}]}"#,
    )
    .unwrap();
    let other = conf.path().join("20-other.conflist");
    fs::write(&other, r#"{"name": "x", "plugins": [{"type": "bridge"}]}"#).unwrap();
    let dir = conf.path().to_str().unwrap();

    let (ok, dry, err) = cleanup(&lab, &["--dry-run", "--cni-conf-dir", dir]);
    assert!(ok, "{dry}{err}");
    let expected = [
        "iptables-nft table nat: chains KUBE-SERVICES, KUBE-SVC-ABC and 2 rules jumping to them (kube-proxy)",
        "ip6tables-nft table nat: chain KUBE-SERVICES and 1 rule jumping to them (kube-proxy)",
        "iptables-legacy table nat: chain FLANNEL-POSTRTG and 1 rule jumping to them (flannel)",
        "iptables-legacy table filter: chain KUBE-FORWARD and 1 rule jumping to them (kube-proxy)",
        "iptables-legacy table filter: chain FLANNEL-FWD and 1 rule jumping to them (flannel)",
        "nftables table ip kube-proxy (kube-proxy)",
        "vxlan device flannel.1 (with its addresses and routes) (flannel)",
        "bridge device cni0 (with its addresses and routes) (flannel)",
    ];
    for e in expected {
        assert!(dry.contains(&format!("would remove: {e}\n")), "{e}:\n{dry}");
    }
    assert!(
        dry.contains(&format!(
            "would remove: CNI network configuration {}",
            flannel.display()
        )),
        "{dry}"
    );
    assert_eq!(dry.lines().count(), expected.len() + 1, "{dry}");
    // Nothing changed.
    assert!(
        lab.ip("node", &["link", "show", "flannel.1"])
            .contains("flannel.1")
    );
    assert!(flannel.exists());

    let (ok, out, err) = cleanup(&lab, &["--cni-conf-dir", dir]);
    assert!(ok, "{out}{err}");
    assert_eq!(out.replace("removed: ", "would remove: "), dry);

    // Gone, and what was not theirs stays.
    let nat = lab.run("node", 5, &["iptables-nft-save", "-t", "nat"]);
    assert!(
        !nat.contains("KUBE-") && nat.contains("-A OUTPUT -d 192.0.2.1/32 -j ACCEPT"),
        "{nat}"
    );
    let mangle = lab.run("node", 5, &["iptables-nft-save", "-t", "mangle"]);
    assert!(
        mangle.contains(":KUBE-KUBELET-CANARY"),
        "kubelet's chain stays: {mangle}"
    );
    let legacy = lab.run("node", 5, &["iptables-legacy-save"]);
    assert!(
        !legacy.contains("FLANNEL") && !legacy.contains("KUBE-"),
        "{legacy}"
    );
    let v6 = lab.run("node", 5, &["ip6tables-nft-save"]);
    assert!(!v6.contains("KUBE-"), "{v6}");
    let tables = lab.run("node", 5, &["nft", "list", "tables"]);
    assert!(
        !tables.contains("kube-proxy") && tables.contains("table inet keep"),
        "{tables}"
    );
    let links = lab.ip("node", &["-br", "link"]);
    for gone in ["flannel.1", "cni0"] {
        assert!(!links.contains(gone), "{gone}: {links}");
    }
    assert!(links.contains("eth0"), "{links}");
    assert!(!lab.ip("node", &["route"]).contains("10.244.2.0"));
    assert!(!flannel.exists() && other.exists());

    // Idempotent.
    let (ok, again, err) = cleanup(&lab, &["--cni-conf-dir", dir]);
    assert!(ok, "{again}{err}");
    assert_eq!(again, "nothing left by kube-proxy or flannel\n");
}
