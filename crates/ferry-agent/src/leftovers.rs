//! Kernel routes that take the node's own traffic to cluster addresses away from ferry.
//!
//! With a host port, the node's kernel reaches pods and cluster IPs through ferry: its
//! default route goes to the host TAP. A more specific route to those addresses over
//! another device wins over it, and the node's own processes then reach them through that
//! device instead. A network plugin that ran before ferry leaves such routes behind: a
//! flannel VXLAN device with a route to each node's pod CIDR, a bridge for its own pods
//! (`cni0`), kube-proxy's IPVS dummy device holding every cluster IP as a local
//! address. Traffic that ferry reads from the uplink is not affected (the kernel is kept
//! off the uplink), only the node's own connections.
//!
//! The agent reads the kernel's routes (`ip -json route show table all`, both families)
//! at start and every 30 s after ([`crate::run::LEFTOVERS_EVERY`]) and warns once about
//! each route that covers a pod or a cluster IP of the tables in force and does not go
//! to the host TAP, naming the route and how to remove it. It removes nothing itself:
//! another component may still own the route.
//!
//! Netfilter rules are the other leftover that meets the node's own connections:
//! kube-proxy's rewrite connections to cluster IPs and node ports in the output chain,
//! flannel's masquerade what leaves the node. The agent lists nftables' chains
//! (`nft --json list chains`, which shows iptables-nft rules too) and warns once about
//! each table holding chains by the names those plugins give theirs ([`rule_leftovers`]).
//! Rules made with iptables-legacy are not seen.

use std::collections::BTreeSet;

use ferry_datapath::{PortKind, Tables};
use ferry_linux::cmd;
use ipnet::IpNet;
use serde::Deserialize;

use crate::takeover::{IpRoute, parse_dst};

/// A route that takes the node's traffic to cluster addresses past ferry.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stray {
    /// The route as `ip route` would take it back (`10.244.2.0/24 via 10.244.2.0 dev
    /// flannel.1 table main`).
    pub route: String,
    /// What of the tables it covers (`node2's pods 10.244.2.0/24`).
    pub covers: String,
}

/// The cluster addresses of `tables` the node's own traffic should reach through the
/// host port, each with what it is: other nodes' pod CIDRs, this node's pods, the
/// Services' cluster IPs.
pub fn cluster_prefixes(tables: &Tables) -> Vec<(IpNet, String)> {
    let mut out = Vec::new();
    if let Some(o) = &tables.overlay {
        for p in &o.peers {
            for c in &p.pod_cidrs {
                out.push((*c, format!("{}'s pods {c}", p.name)));
            }
        }
    }
    for p in tables.ports.iter().filter(|p| p.kind == PortKind::Pod) {
        for a in &p.addresses {
            out.push((
                IpNet::from(*a),
                format!("pod port {}'s address {a}", p.name),
            ));
        }
    }
    for s in &tables.services.services {
        for ip in &s.spec.cluster_ips {
            out.push((IpNet::from(*ip), format!("cluster IP {ip} of {}", s.name)));
        }
    }
    out
}

/// The routes of `json` (the output of `ip -json route show table all`) that cover one
/// of `prefixes` and do not go to `host_dev`. Default routes are left alone, and so are
/// broadcast, multicast and unreachable-style routes.
pub fn strays(
    json: &str,
    prefixes: &[(IpNet, String)],
    host_dev: &str,
) -> Result<Vec<Stray>, String> {
    let routes: Vec<IpRoute> =
        serde_json::from_str(json).map_err(|e| format!("reading `ip -json route`: {e}"))?;
    let mut out = BTreeSet::new();
    for r in routes {
        if r.dst == "default" || r.dev.as_deref() == Some(host_dev) {
            continue;
        }
        if !matches!(r.kind.as_deref(), None | Some("unicast" | "local")) {
            continue;
        }
        let Some(dst) = parse_dst(&r.dst, false) else {
            continue;
        };
        if dst.prefix_len() == 0 {
            continue;
        }
        let Some((_, what)) = prefixes
            .iter()
            .find(|(p, _)| dst.contains(&p.network()) || p.contains(&dst.network()))
        else {
            continue;
        };
        let mut route = String::new();
        if let Some(k) = r.kind.as_deref().filter(|k| *k != "unicast") {
            route.push_str(k);
            route.push(' ');
        }
        route.push_str(&r.dst);
        if let Some(g) = &r.gateway {
            route.push_str(&format!(" via {g}"));
        }
        if let Some(d) = &r.dev {
            route.push_str(&format!(" dev {d}"));
        }
        route.push_str(&format!(" table {}", r.table.as_deref().unwrap_or("main")));
        out.insert(Stray {
            route,
            covers: what.clone(),
        });
    }
    Ok(out.into_iter().collect())
}

/// The kernel's routes of both families, as `ip -json route show table all` prints
/// them (one JSON array each).
pub fn kernel_routes() -> Result<Vec<String>, String> {
    ["-4", "-6"]
        .iter()
        .map(|family| {
            cmd::run("ip", &[family, "-json", "route", "show", "table", "all"])
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// Chain name prefixes of other dataplanes' iptables rules, with whose they are.
const CHAIN_PREFIXES: [(&str, &str); 4] = [
    ("KUBE-", "kube-proxy"),
    ("FLANNEL-", "flannel"),
    ("cali-", "Calico"),
    ("CILIUM_", "Cilium"),
];

/// The nftables tables of `json` (the output of `nft --json list chains`) that hold
/// another dataplane's chains: kube-proxy's own table (its nftables mode), or chains
/// named as kube-proxy, flannel, Calico or Cilium name theirs (their iptables modes).
/// One line per table: `table ip nat: kube-proxy's chains KUBE-SERVICES, KUBE-NODEPORTS`.
pub fn rule_leftovers(json: &str) -> Result<Vec<String>, String> {
    #[derive(Deserialize)]
    struct Listing {
        nftables: Vec<serde_json::Value>,
    }
    #[derive(Deserialize)]
    struct Chain {
        family: String,
        table: String,
        name: String,
    }
    let listing: Listing =
        serde_json::from_str(json).map_err(|e| format!("reading `nft --json list chains`: {e}"))?;
    let mut found: std::collections::BTreeMap<(String, String, &str), Vec<String>> =
        std::collections::BTreeMap::new();
    for item in listing.nftables {
        let Some(chain) = item.get("chain") else {
            continue;
        };
        let c: Chain = serde_json::from_value(chain.clone())
            .map_err(|e| format!("reading `nft --json list chains`: {e}"))?;
        let whose = if c.table == "kube-proxy" {
            Some("kube-proxy")
        } else {
            CHAIN_PREFIXES
                .iter()
                .find(|(p, _)| c.name.starts_with(p))
                .map(|(_, w)| *w)
        };
        if let Some(w) = whose {
            found
                .entry((c.family, c.table, w))
                .or_default()
                .push(c.name);
        }
    }
    Ok(found
        .into_iter()
        .map(|((family, table, whose), chains)| {
            format!(
                "table {family} {table}: {whose}'s chains {}",
                chains.join(", ")
            )
        })
        .collect())
}

/// nftables' chains, as `nft --json list chains` prints them.
pub fn kernel_chains() -> Result<String, String> {
    cmd::run("nft", &["--json", "list", "chains"]).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefixes() -> Vec<(IpNet, String)> {
        vec![
            ("10.244.2.0/24".parse().unwrap(), "node2's pods".into()),
            ("10.244.1.5/32".parse().unwrap(), "pod port p".into()),
            ("10.96.0.10/32".parse().unwrap(), "cluster IP".into()),
        ]
    }

    #[test]
    fn routes_over_other_devices_to_cluster_addresses_are_strays() {
        let json = r#"[
            {"dst":"default","via":"169.254.1.1","dev":"ferry0","flags":[]},
            {"dst":"10.244.2.0/24","gateway":"10.244.2.0","dev":"flannel.1","flags":["onlink"]},
            {"dst":"10.244.1.0/24","dev":"cni0","protocol":"kernel","scope":"link","flags":[]},
            {"type":"local","dst":"10.96.0.10","dev":"kube-ipvs0","table":"local","flags":[]},
            {"dst":"10.244.2.0/24","dev":"ferry0","flags":[]},
            {"dst":"192.168.77.0/24","dev":"eth0","flags":[]},
            {"type":"broadcast","dst":"10.244.1.255","dev":"cni0","table":"local","flags":[]},
            {"dst":"10.0.0.0/8","dev":"eth9","flags":[]}
        ]"#;
        let s = strays(json, &prefixes(), "ferry0").unwrap();
        let routes: Vec<&str> = s.iter().map(|s| s.route.as_str()).collect();
        assert_eq!(
            routes,
            [
                "10.0.0.0/8 dev eth9 table main",
                "10.244.1.0/24 dev cni0 table main",
                "10.244.2.0/24 via 10.244.2.0 dev flannel.1 table main",
                "local 10.96.0.10 dev kube-ipvs0 table local",
            ]
        );
        assert_eq!(s[0].covers, "node2's pods", "the first prefix it covers");
        assert_eq!(s[1].covers, "pod port p");
        assert_eq!(s[3].covers, "cluster IP");
    }

    #[test]
    fn routes_through_the_host_tap_or_elsewhere_are_not() {
        let json = r#"[{"dst":"10.244.0.0/16","dev":"ferry0","flags":[]},
                       {"dst":"fd00::/64","dev":"eth0","flags":[]},
                       {"dst":"default","dev":"eth0","flags":[]}]"#;
        assert_eq!(strays(json, &prefixes(), "ferry0").unwrap(), []);
        assert!(strays("[]", &prefixes(), "ferry0").unwrap().is_empty());
        assert!(strays("not json", &prefixes(), "ferry0").is_err());
    }

    #[test]
    fn other_dataplanes_chains_are_named_by_table() {
        let json = r#"{"nftables": [
            {"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
            {"chain": {"family": "ip", "table": "kube-proxy", "name": "nat-output", "handle": 1,
                       "type": "nat", "hook": "output", "prio": -100, "policy": "accept"}},
            {"chain": {"family": "ip", "table": "kube-proxy", "name": "services", "handle": 2}},
            {"chain": {"family": "ip", "table": "nat", "name": "KUBE-SERVICES", "handle": 1}},
            {"chain": {"family": "ip", "table": "nat", "name": "OUTPUT", "handle": 2}},
            {"chain": {"family": "ip", "table": "nat", "name": "FLANNEL-POSTRTG", "handle": 3}},
            {"chain": {"family": "ip", "table": "nat", "name": "KUBE-NODEPORTS", "handle": 4}},
            {"chain": {"family": "ip6", "table": "filter", "name": "cali-FORWARD", "handle": 1}},
            {"chain": {"family": "ip", "table": "ferry_host", "name": "output", "handle": 1}}
        ]}"#;
        assert_eq!(
            rule_leftovers(json).unwrap(),
            [
                "table ip kube-proxy: kube-proxy's chains nat-output, services",
                "table ip nat: flannel's chains FLANNEL-POSTRTG",
                "table ip nat: kube-proxy's chains KUBE-SERVICES, KUBE-NODEPORTS",
                "table ip6 filter: Calico's chains cali-FORWARD",
            ]
        );
        assert!(rule_leftovers(r#"{"nftables": []}"#).unwrap().is_empty());
        assert!(rule_leftovers("[]").is_err());
    }
}
