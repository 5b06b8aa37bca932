//! Node ports for the node's own processes.
//!
//! A process on the node that connects to one of the node's addresses with a node port
//! never reaches ferry: the kernel owns that address (on the host port) and delivers the
//! connection locally, where nothing listens. kube-proxy catches these in the `OUTPUT`
//! chain; ferry does the same with one nftables table of its own, `ferry_host`, whose
//! output chain rewrites such connections to the Service's cluster IP, keeping the node
//! port. The kernel then routes them through the host port like any connection to a
//! cluster IP; ferry, seeing the node port at the cluster IP from the host port, balances
//! them as node port connections from this node (every node's endpoints, whatever the
//! traffic policies say, as kube-proxy does), and the kernel's own connection tracking
//! turns the replies back into the node address and node port the process used.
//!
//! The table is replaced whole in one `nft -f` transaction whenever the Services change,
//! and deleted when the agent stops. It is only made when the node has a host port.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io;
use std::net::IpAddr;

use ferry_datapath::Tables;
use ferry_linux::cmd::Cmd;

/// The nftables table ferry owns (one per family).
pub const TABLE: &str = "ferry_host";

/// One rewrite: `proto` to (node address, node port) goes to (cluster IP, port).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rule {
    /// `tcp` or `udp`.
    pub proto: &'static str,
    /// The node port.
    pub node_port: u16,
    /// The cluster IP of the same family as the node address.
    pub cluster_ip: IpAddr,
    /// The port to rewrite to: the node port, or the Service port when the cluster IP
    /// has a frontend of its own at the node port (then the connection is balanced as
    /// one to the cluster IP, with internalTrafficPolicy).
    pub port: u16,
}

/// The rewrites `tables` call for, and the node addresses they apply to.
pub fn rules(tables: &Tables) -> (Vec<IpAddr>, BTreeSet<Rule>) {
    let mut out = BTreeSet::new();
    for s in tables
        .services
        .services
        .iter()
        .filter(|s| !s.name.is_empty())
    {
        let Some(np) = s.spec.node_port else { continue };
        let proto = match s.proto {
            ferry_datapath::proto::TCP => "tcp",
            ferry_datapath::proto::UDP => "udp",
            _ => continue,
        };
        for ip in &s.spec.cluster_ips {
            let taken = tables.services.is_frontend(s.proto, *ip, np);
            out.insert(Rule {
                proto,
                node_port: np,
                cluster_ip: *ip,
                port: if taken { s.spec.port } else { np },
            });
        }
    }
    (tables.node.addresses.clone(), out)
}

/// The `nft -f` script that replaces ferry's tables with these rules.
pub fn script(node_addrs: &[IpAddr], rules: &BTreeSet<Rule>) -> String {
    let mut s = String::new();
    for (family, v6) in [("ip", false), ("ip6", true)] {
        // Creating then deleting makes the deletion valid when the table is absent; the
        // whole file is one transaction.
        let _ = writeln!(s, "table {family} {TABLE}");
        let _ = writeln!(s, "delete table {family} {TABLE}");
        let addrs: Vec<String> = node_addrs
            .iter()
            .filter(|a| a.is_ipv6() == v6)
            .map(ToString::to_string)
            .collect();
        let rs: Vec<&Rule> = rules
            .iter()
            .filter(|r| r.cluster_ip.is_ipv6() == v6)
            .collect();
        if addrs.is_empty() || rs.is_empty() {
            continue;
        }
        let _ = writeln!(s, "table {family} {TABLE} {{");
        let _ = writeln!(
            s,
            "  chain output {{ type nat hook output priority -100; policy accept;"
        );
        let set = addrs.join(", ");
        for r in rs {
            let to = match r.cluster_ip {
                IpAddr::V4(a) => format!("{a}:{}", r.port),
                IpAddr::V6(a) => format!("[{a}]:{}", r.port),
            };
            let _ = writeln!(
                s,
                "    {family} daddr {{ {set} }} {} dport {} dnat to {to}",
                r.proto, r.node_port
            );
        }
        let _ = writeln!(s, "  }}\n}}");
    }
    s
}

/// Runs `nft -f -` with `script`.
pub fn apply(script: &str) -> io::Result<()> {
    Cmd::new("nft").args(["-f", "-"]).stdin(script).run()?;
    Ok(())
}

/// Deletes ferry's tables.
pub fn remove() -> io::Result<()> {
    apply(&script(&[], &BTreeSet::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Node ports go to the cluster IP with the node port, where ferry takes them for
    /// the node port; a cluster IP with a frontend of its own at that port gets the
    /// Service port instead.
    #[test]
    fn node_ports_go_to_the_cluster_ip_with_the_node_port_unless_it_is_taken() {
        use ferry_datapath::{NodeSpec, PortKind, PortSpec, ServiceSpec, TablesSpec};
        let svc = |name: &str, port: u16, node_port: Option<u16>| ServiceSpec {
            name: name.into(),
            proto: "tcp".into(),
            port,
            cluster_ips: vec!["10.96.0.10".parse().unwrap()],
            node_port,
            ..ServiceSpec::default()
        };
        let rules_of = |services: Vec<ServiceSpec>| {
            let spec = TablesSpec {
                ports: vec![PortSpec {
                    name: "host".into(),
                    kind: PortKind::Host,
                    ..PortSpec::default()
                }],
                node: NodeSpec {
                    name: "node1".into(),
                    addresses: vec!["192.168.77.1".parse().unwrap()],
                    ..NodeSpec::default()
                },
                services,
                ..TablesSpec::default()
            };
            rules(&spec.compile().unwrap()).1
        };
        let to = |port| Rule {
            proto: "tcp",
            node_port: 30080,
            cluster_ip: "10.96.0.10".parse().unwrap(),
            port,
        };
        let got = rules_of(vec![svc("default/web:http", 80, Some(30080))]);
        assert_eq!(got, BTreeSet::from([to(30080)]));
        let got = rules_of(vec![
            svc("default/web:http", 80, Some(30080)),
            svc("default/web:other", 30080, None),
        ]);
        assert_eq!(got, BTreeSet::from([to(80)]));
    }

    #[test]
    fn the_script_rewrites_node_ports_on_node_addresses_per_family() {
        let rules = BTreeSet::from([
            Rule {
                proto: "tcp",
                node_port: 30080,
                cluster_ip: "10.96.0.10".parse().unwrap(),
                port: 80,
            },
            Rule {
                proto: "udp",
                node_port: 30053,
                cluster_ip: "fd00:96::a".parse().unwrap(),
                port: 53,
            },
        ]);
        let addrs: Vec<IpAddr> = vec!["192.168.77.1".parse().unwrap()];
        let s = script(&addrs, &rules);
        assert!(
            s.contains("ip daddr { 192.168.77.1 } tcp dport 30080 dnat to 10.96.0.10:80"),
            "{s}"
        );
        // No IPv6 node address: no IPv6 rules, but the old table still goes.
        assert!(!s.contains("dport 30053"), "{s}");
        assert!(s.contains("delete table ip6 ferry_host"), "{s}");
        let none = script(&addrs, &BTreeSet::new());
        assert!(!none.contains("chain"), "{none}");
    }

    /// nft itself accepts what [`script`] writes (`-c`: checked, not applied). Needs root
    /// and nftables, which the test suite installs.
    #[test]
    fn nft_accepts_the_script() {
        let rules = BTreeSet::from([Rule {
            proto: "tcp",
            node_port: 30080,
            cluster_ip: "fd00:96::a".parse().unwrap(),
            port: 80,
        }]);
        let addrs: Vec<IpAddr> = vec![
            "fd00:77::1".parse().unwrap(),
            "192.168.77.1".parse().unwrap(),
        ];
        if let Err(e) = Cmd::new("nft")
            .args(["-c", "-f", "-"])
            .stdin(script(&addrs, &rules))
            .run()
        {
            panic!("nft (nftables, which the test suite installs) refused the script: {e}");
        }
    }
}
