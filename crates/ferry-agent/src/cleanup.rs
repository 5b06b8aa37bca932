//! What kube-proxy and flannel leave on a node, found and removed: `ferry cleanup` and
//! the agent's `--cleanup-legacy`.
//!
//! A node migrated to ferry keeps the state of what ran before until something removes
//! it, and that state meets the node's own traffic: kube-proxy's `KUBE-*` chains
//! rewrite connections to cluster IPs and node ports, its `kube-ipvs0` device holds
//! every cluster IP as a local address, flannel's `flannel.1` device routes each node's
//! pod CIDR past ferry. [`find`] looks for each, [`remove`] removes what was found; a
//! second run finds nothing. What is looked at:
//!
//! - iptables rules, through both iptables back ends (`iptables-nft-save` and
//!   `iptables-legacy-save`, IPv4 and IPv6): every chain named `KUBE-*` (kube-proxy's;
//!   not kubelet's own `KUBE-KUBELET-CANARY` and `KUBE-IPTABLES-HINT`) or `FLANNEL-*`
//!   (flannel's), and the rules of other chains that jump to them; removed with
//!   `iptables-restore --noflush` (the jumps deleted, then the chains flushed and
//!   deleted, in one transaction per table);
//! - nftables tables: kube-proxy's `kube-proxy` (its nftables mode) and flannel's
//!   `flannel-ipv4` and `flannel-ipv6`;
//! - links: kube-proxy's IPVS dummy device `kube-ipvs0`, flannel's VXLAN devices
//!   `flannel.N` and `flannel-v6.N` and its bridge `cni0` (their addresses and routes go
//!   with them);
//! - CNI network configuration files of the plugin type `flannel`, in a directory given.
//!
//! The commands are the tools' own (iproute2, nftables, iptables): they read and write
//! these formats, and their errors say what went wrong. A tool that is not installed
//! is noted and its part skipped.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use ferry_linux::cmd::Cmd;
use serde_json::Value;

/// Chain names of kube-proxy and flannel, and whose they are.
const CHAIN_PREFIXES: [(&str, &str); 2] = [("KUBE-", "kube-proxy"), ("FLANNEL-", "flannel")];

/// kubelet's own chains, which it keeps making: not a leftover.
const KUBELET_CHAINS: [&str; 2] = ["KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"];

/// nftables tables of kube-proxy and flannel.
const NFT_TABLES: [(&str, &str); 3] = [
    ("kube-proxy", "kube-proxy"),
    ("flannel-ipv4", "flannel"),
    ("flannel-ipv6", "flannel"),
];

/// The iptables back ends: the save and restore commands, and how they are named.
const IPTABLES: [(&str, &str, &str); 4] = [
    ("iptables-nft-save", "iptables-nft-restore", "iptables-nft"),
    (
        "ip6tables-nft-save",
        "ip6tables-nft-restore",
        "ip6tables-nft",
    ),
    (
        "iptables-legacy-save",
        "iptables-legacy-restore",
        "iptables-legacy",
    ),
    (
        "ip6tables-legacy-save",
        "ip6tables-legacy-restore",
        "ip6tables-legacy",
    ),
];

/// One thing left by another dataplane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leftover {
    /// Whose it is: `kube-proxy` or `flannel`.
    pub owner: &'static str,
    /// What it is (`iptables-nft table nat: chains KUBE-SERVICES, KUBE-SVC-X and 1 rule
    /// jumping to them`).
    pub what: String,
    action: Action,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Action {
    /// `RESTORE --noflush` with this input.
    Restore {
        command: &'static str,
        input: String,
    },
    /// `nft delete table FAMILY NAME`.
    NftTable { family: String, name: String },
    /// `ip link del NAME`.
    Link(String),
    /// The file removed.
    File(PathBuf),
}

impl fmt::Display for Leftover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.what, self.owner)
    }
}

/// What [`find`] found, and the notes of what it could not look at.
#[derive(Debug, Default)]
pub struct Found {
    /// The leftovers, in the order they are removed.
    pub leftovers: Vec<Leftover>,
    /// What was not looked at, and why (a tool not installed).
    pub notes: Vec<String>,
}

/// Whose chain `name` is, when it is a leftover.
fn chain_owner(name: &str) -> Option<&'static str> {
    if KUBELET_CHAINS.contains(&name) {
        return None;
    }
    CHAIN_PREFIXES
        .iter()
        .find(|(p, _)| name.starts_with(p))
        .map(|(_, o)| *o)
}

/// The target of an iptables rule (`-j X` or `-g X`).
fn target(rule: &str) -> Option<&str> {
    let mut words = rule.split_whitespace();
    while let Some(w) = words.next() {
        if w == "-j" || w == "-g" || w == "--jump" || w == "--goto" {
            return words.next();
        }
    }
    None
}

/// The leftovers of `iptables-save` output `save`, made by back end `tool` and removed
/// by `restore`: per table and owner, the leftover chains and the rules of other chains
/// that jump to them.
pub fn iptables_leftovers(save: &str, tool: &str, restore: &'static str) -> Vec<Leftover> {
    let mut out = Vec::new();
    let mut table: Option<String> = None;
    let mut chains: Vec<String> = Vec::new();
    let mut rules: Vec<(String, String)> = Vec::new();
    let mut finish = |table: &str, chains: &[String], rules: &[(String, String)]| {
        for (_, owner) in CHAIN_PREFIXES {
            let mine: Vec<&String> = chains
                .iter()
                .filter(|c| chain_owner(c) == Some(owner))
                .collect();
            if mine.is_empty() {
                continue;
            }
            let jumps: Vec<&(String, String)> = rules
                .iter()
                .filter(|(chain, rule)| {
                    chain_owner(chain).is_none()
                        && target(rule).is_some_and(|t| chain_owner(t) == Some(owner))
                })
                .collect();
            let mut input = format!("*{table}\n");
            for (chain, rule) in &jumps {
                input.push_str(&format!("-D {chain} {rule}\n"));
            }
            for c in &mine {
                input.push_str(&format!("-F {c}\n"));
            }
            for c in &mine {
                input.push_str(&format!("-X {c}\n"));
            }
            input.push_str("COMMIT\n");
            let names: Vec<&str> = mine.iter().map(|c| c.as_str()).collect();
            let what = format!(
                "{tool} table {table}: chain{} {}{}",
                if names.len() == 1 { "" } else { "s" },
                names.join(", "),
                match jumps.len() {
                    0 => String::new(),
                    1 => " and 1 rule jumping to them".into(),
                    n => format!(" and {n} rules jumping to them"),
                }
            );
            out.push(Leftover {
                owner,
                what,
                action: Action::Restore {
                    command: restore,
                    input,
                },
            });
        }
    };
    for line in save.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = Some(t.trim().to_string());
            chains.clear();
            rules.clear();
        } else if let Some(decl) = line.strip_prefix(':') {
            if let Some(name) = decl.split_whitespace().next() {
                chains.push(name.to_string());
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            if let Some((chain, rest)) = rule.split_once(' ') {
                rules.push((chain.to_string(), rest.to_string()));
            }
        } else if line.trim() == "COMMIT"
            && let Some(t) = table.take()
        {
            finish(&t, &chains, &rules);
        }
    }
    out
}

/// The leftover nftables tables of `nft -j list tables` output `json`.
pub fn nft_leftovers(json: &str) -> Result<Vec<Leftover>, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("`nft -j list tables`: {e}"))?;
    let mut out = Vec::new();
    for item in v["nftables"].as_array().into_iter().flatten() {
        let t = &item["table"];
        let (Some(family), Some(name)) = (t["family"].as_str(), t["name"].as_str()) else {
            continue;
        };
        if let Some((_, owner)) = NFT_TABLES.iter().find(|(n, _)| *n == name) {
            out.push(Leftover {
                owner,
                what: format!("nftables table {family} {name}"),
                action: Action::NftTable {
                    family: family.into(),
                    name: name.into(),
                },
            });
        }
    }
    Ok(out)
}

/// Whose leftover link `name` of kind `kind` is.
fn link_owner(name: &str, kind: &str) -> Option<&'static str> {
    let numbered = |prefix: &str| {
        name.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    match kind {
        "dummy" if name == "kube-ipvs0" => Some("kube-proxy"),
        "vxlan" if numbered("flannel.") || numbered("flannel-v6.") => Some("flannel"),
        "bridge" if name == "cni0" => Some("flannel"),
        _ => None,
    }
}

/// The leftover links of `ip -json -details link show` output `json`.
pub fn link_leftovers(json: &str) -> Result<Vec<Leftover>, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("`ip -json link`: {e}"))?;
    let mut out = Vec::new();
    for l in v.as_array().into_iter().flatten() {
        let name = l["ifname"].as_str().unwrap_or_default();
        let kind = l["linkinfo"]["info_kind"].as_str().unwrap_or_default();
        if let Some(owner) = link_owner(name, kind) {
            out.push(Leftover {
                owner,
                what: format!("{kind} device {name} (with its addresses and routes)"),
                action: Action::Link(name.into()),
            });
        }
    }
    Ok(out)
}

/// The CNI network configuration files of plugin type `flannel` in `dir`.
pub fn cni_leftovers(dir: &Path) -> Result<Vec<Leftover>, String> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|x| x == "conf" || x == "conflist" || x == "json")
        })
        .collect();
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let Ok(text) = fs::read(&path) else { continue };
        let Ok(v) = serde_json::from_slice::<Value>(&text) else {
            continue;
        };
        let flannel = |p: &Value| p["type"] == "flannel";
        if flannel(&v)
            || v["plugins"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(flannel))
        {
            out.push(Leftover {
                owner: "flannel",
                what: format!("CNI network configuration {}", path.display()),
                action: Action::File(path),
            });
        }
    }
    Ok(out)
}

/// Runs `cmd`; None when its program is not installed (noted in `notes`).
fn run_tool(cmd: Cmd, program: &str, notes: &mut Vec<String>) -> Result<Option<String>, String> {
    match cmd.run() {
        Ok(out) => Ok(Some(out)),
        Err(e) if e.is_not_found() => {
            notes.push(format!("{program} is not installed: not looked at"));
            Ok(None)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Looks for what kube-proxy and flannel leave, in this network namespace, and for
/// flannel's CNI configuration in `cni_conf_dir` when given.
pub fn find(cni_conf_dir: Option<&Path>) -> Result<Found, String> {
    let mut found = Found::default();
    for (save, restore, tool) in IPTABLES {
        if let Some(out) = run_tool(Cmd::new(save), save, &mut found.notes)? {
            found
                .leftovers
                .extend(iptables_leftovers(&out, tool, restore));
        }
    }
    if let Some(out) = run_tool(
        Cmd::new("nft").args(["-j", "list", "tables"]),
        "nft",
        &mut found.notes,
    )? {
        found.leftovers.extend(nft_leftovers(&out)?);
    }
    let links = Cmd::new("ip")
        .args(["-json", "-details", "link", "show"])
        .run()
        .map_err(|e| e.to_string())?;
    found.leftovers.extend(link_leftovers(&links)?);
    if let Some(dir) = cni_conf_dir {
        found.leftovers.extend(cni_leftovers(dir)?);
    }
    Ok(found)
}

/// Removes one leftover.
pub fn remove(l: &Leftover) -> Result<(), String> {
    let run = |c: Cmd| c.run().map(drop).map_err(|e| e.to_string());
    match &l.action {
        Action::Restore { command, input } => run(Cmd::new(*command)
            .arg("--noflush")
            .stdin(input.as_bytes().to_vec())),
        Action::NftTable { family, name } => {
            run(Cmd::new("nft").args(["delete", "table", family, name]))
        }
        Action::Link(name) => run(Cmd::new("ip").args(["link", "del", name])),
        Action::File(path) => fs::remove_file(path).map_err(|e| format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVE: &str = r#"# Generated by iptables-nft-save v1.8.9 (nf_tables)
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-X - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:FLANNEL-POSTRTG - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "flanneld masq" -j FLANNEL-POSTRTG
-A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-X
COMMIT
*filter
:INPUT ACCEPT [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
"#;

    #[test]
    fn iptables_leftovers_are_the_chains_of_each_owner_and_the_jumps_to_them() {
        let l = iptables_leftovers(SAVE, "iptables-nft", "iptables-nft-restore");
        let what: Vec<String> = l.iter().map(ToString::to_string).collect();
        assert_eq!(
            what,
            [
                "iptables-nft table nat: chains KUBE-SERVICES, KUBE-SVC-X and 1 rule jumping to them (kube-proxy)",
                "iptables-nft table nat: chain FLANNEL-POSTRTG and 1 rule jumping to them (flannel)",
            ]
        );
        assert_eq!(
            l[0].action,
            Action::Restore {
                command: "iptables-nft-restore",
                input: "*nat\n\
                        -D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
                        -F KUBE-SERVICES\n-F KUBE-SVC-X\n-X KUBE-SERVICES\n-X KUBE-SVC-X\nCOMMIT\n"
                    .into(),
            }
        );
        // kubelet's own chains are not a leftover.
        assert!(
            iptables_leftovers("*filter\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n", "t", "r")
                .is_empty()
        );
    }

    #[test]
    fn nft_tables_and_links_are_found_by_name_and_kind() {
        let tables = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
            {"table": {"family": "ip", "name": "kube-proxy", "handle": 1}},
            {"table": {"family": "ip", "name": "nat", "handle": 2}},
            {"table": {"family": "inet", "name": "flannel-ipv4", "handle": 3}}]}"#;
        let what: Vec<String> = nft_leftovers(tables)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            what,
            [
                "nftables table ip kube-proxy (kube-proxy)",
                "nftables table inet flannel-ipv4 (flannel)"
            ]
        );
        let links = r#"[
            {"ifname": "eth0", "linkinfo": {"info_kind": "veth"}},
            {"ifname": "flannel.1", "linkinfo": {"info_kind": "vxlan"}},
            {"ifname": "flannel.x", "linkinfo": {"info_kind": "vxlan"}},
            {"ifname": "cni0", "linkinfo": {"info_kind": "bridge"}},
            {"ifname": "kube-ipvs0", "linkinfo": {"info_kind": "dummy"}},
            {"ifname": "lo"}]"#;
        let names: Vec<String> = link_leftovers(links)
            .unwrap()
            .into_iter()
            .map(|l| match l.action {
                Action::Link(n) => format!("{n} {}", l.owner),
                a => panic!("{a:?}"),
            })
            .collect();
        assert_eq!(
            names,
            ["flannel.1 flannel", "cni0 flannel", "kube-ipvs0 kube-proxy"]
        );
    }

    #[test]
    fn flannels_cni_configuration_is_found_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let flannel = r#"{"cniVersion": "0.3.1", "name": "cbr0", "plugins": [{"type": "flannel"}, {"type": "portmap"}]}"#;
        fs::write(dir.path().join("10-flannel.conflist"), flannel).unwrap();
        fs::write(
            dir.path().join("10-ferry.conflist"),
            r#"{"plugins": [{"type": "ferry-cni"}]}"#,
        )
        .unwrap();
        fs::write(dir.path().join("notes.txt"), "{").unwrap();
        let found = cni_leftovers(dir.path()).unwrap();
        assert_eq!(found.len(), 1);
        remove(&found[0]).unwrap();
        assert!(cni_leftovers(dir.path()).unwrap().is_empty());
        assert!(dir.path().join("10-ferry.conflist").exists());
        assert!(cni_leftovers(&dir.path().join("none")).unwrap().is_empty());
    }
}
