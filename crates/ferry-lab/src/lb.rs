//! The external L4 load balancer: nftables DNAT in the `lb` namespace, in the manner of
//! IPVS in NAT mode (or a cloud NLB with client IP preservation). The client's packets
//! to a listener are sent to one node's NodePort, chosen in turn; the client's address
//! is kept, and since the load balancer is the client's gateway and the fabric routes the
//! client's subnet back to it, the nodes' replies pass through it and are un-NATed.
//!
//! Listeners: `VIP_CROSS_ZONE` spreads over every node; `vip_of_zone(z)` only over zone
//! `z`'s nodes (cross-zone balancing off). Port [`lb_port::CLUSTER`] goes to `web`'s node
//! port (externalTrafficPolicy Cluster: every node is a target), [`lb_port::LOCAL`] to
//! `web-local`'s (Local: only nodes whose health check node port answers 200, which
//! [`health_loop`] keeps current). A listener without targets resets connections.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use ferry_linux::cmd::Cmd;

use crate::plan::{Plan, VIP_CROSS_ZONE, lb_port, node_port};

/// The nftables table the load balancer owns in its namespace.
pub const TABLE: &str = "ferrylb";

/// The chain counting connections to each node port.
pub const COUNTERS: &str = "targets";

/// Connections (SYNs) the load balancer has sent to each node at node port `port`, by
/// node number, read from `nft list chain` output.
pub fn connections_to(listing: &str, port: u16) -> Vec<(u8, u64)> {
    listing
        .lines()
        .filter_map(|l| {
            let comment = l.split("comment \"").nth(1)?.trim_end_matches('"');
            let (node, p) = comment.split_once(':')?;
            if p.parse::<u16>().ok()? != port {
                return None;
            }
            let n = node.strip_prefix("node")?.parse().ok()?;
            let packets = l.split("packets ").nth(1)?.split_whitespace().next()?;
            Some((n, packets.parse().ok()?))
        })
        .collect()
}

/// One listener: address, port, and the node addresses and port it sends to.
struct Listener {
    vip: String,
    port: u16,
    targets: Vec<String>,
    target_port: u16,
}

fn listeners(plan: &Plan, healthy: &[u8]) -> Vec<Listener> {
    let mut out = Vec::new();
    let mut add = |vip: String, nodes: Vec<u8>| {
        out.push(Listener {
            vip: vip.clone(),
            port: lb_port::CLUSTER,
            targets: nodes.iter().map(|&n| plan.node_ip(n)).collect(),
            target_port: node_port::WEB_HTTP,
        });
        out.push(Listener {
            vip,
            port: lb_port::LOCAL,
            targets: nodes
                .iter()
                .filter(|n| healthy.contains(n))
                .map(|&n| plan.node_ip(n))
                .collect(),
            target_port: node_port::WEB_LOCAL_HTTP,
        });
    };
    add(VIP_CROSS_ZONE.to_string(), plan.node_numbers().collect());
    for z in 0..plan.zones {
        add(Plan::vip_of_zone(z), plan.nodes_in_zone(z));
    }
    out
}

/// The whole ruleset for the nodes in `healthy`, replacing the previous one in one
/// transaction (`nft -f` applies a file atomically).
pub fn ruleset(plan: &Plan, healthy: &[u8]) -> String {
    let mut dnat = String::new();
    for l in listeners(plan, healthy) {
        if l.targets.is_empty() {
            continue;
        }
        let map: Vec<String> = l
            .targets
            .iter()
            .enumerate()
            .map(|(i, t)| format!("{i} : {t} . {}", l.target_port))
            .collect();
        dnat.push_str(&format!(
            "    ip daddr {} tcp dport {} dnat ip to numgen inc mod {} map {{ {} }}\n",
            l.vip,
            l.port,
            l.targets.len(),
            map.join(", ")
        ));
    }
    // A counter of connections (SYNs) forwarded to each node port, which the checks
    // read to see that the load balancer spread them as it should.
    let mut counters = String::new();
    for n in plan.node_numbers() {
        for port in [node_port::WEB_HTTP, node_port::WEB_LOCAL_HTTP] {
            counters.push_str(&format!(
                "    ip daddr {} tcp dport {port} tcp flags & (syn | ack) == syn counter \
                 comment \"node{n}:{port}\"\n",
                plan.node_ip(n)
            ));
        }
    }
    format!(
        "add table ip {TABLE}\ndelete table ip {TABLE}\ntable ip {TABLE} {{\n  \
         chain listeners {{\n    type nat hook prerouting priority dstnat;\n{dnat}  }}\n  \
         chain no_target {{\n    type filter hook prerouting priority 0;\n    \
         ip daddr 10.30.0.0/16 meta l4proto tcp reject with tcp reset\n    \
         ip daddr 10.30.0.0/16 drop\n  }}\n  \
         chain {COUNTERS} {{\n    type filter hook forward priority 0;\n{counters}  }}\n}}\n"
    )
}

/// Applies a ruleset in the current namespace.
fn apply(rules: &str) -> Result<()> {
    Cmd::new("nft")
        .args(["-f", "-"])
        .stdin(rules)
        .run()
        .with_context(|| format!("nft refused:\n{rules}"))?;
    Ok(())
}

/// Whether node `n`'s health check node port answers 200 within a second.
pub fn healthy(plan: &Plan, n: u8) -> bool {
    let addr: SocketAddr =
        match format!("{}:{}", plan.node_ip(n), node_port::WEB_LOCAL_HEALTH).parse() {
            Ok(a) => a,
            Err(_) => return false,
        };
    let t = Duration::from_secs(1);
    let Ok(mut s) = TcpStream::connect_timeout(&addr, t) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(t));
    let _ = s.set_write_timeout(Some(t));
    if s.write_all(b"GET /healthz HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    // The status line may come in pieces: read until its end (or the connection's).
    let mut head = Vec::new();
    let mut buf = [0u8; 256];
    while !head.windows(2).any(|w| w == b"\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(got) => head.extend_from_slice(&buf[..got]),
        }
    }
    head.starts_with(b"HTTP/1.1 200 ")
}

/// Consecutive failed checks before a healthy node is taken out, as a cloud load
/// balancer's unhealthy threshold: one slow answer on a busy machine is not an outage.
pub const UNHEALTHY_THRESHOLD: u32 = 3;

/// The health checker, run in the load balancer's namespace until killed: polls every
/// node's health check node port, steers the Local listeners to the nodes that pass,
/// and records them in `DIR/lb-healthy.json` for `ferry lab status`. A node is added at
/// its first passing check and removed after [`UNHEALTHY_THRESHOLD`] failed ones.
pub fn health_loop(plan: &Plan, dir: &Path) -> Result<()> {
    let mut last: Option<Vec<u8>> = None;
    let mut failures = vec![UNHEALTHY_THRESHOLD; usize::from(plan.nodes) + 1];
    loop {
        for n in plan.node_numbers() {
            let f = &mut failures[usize::from(n)];
            *f = if healthy(plan, n) {
                0
            } else {
                f.saturating_add(1)
            };
        }
        let now: Vec<u8> = plan
            .node_numbers()
            .filter(|&n| failures[usize::from(n)] < UNHEALTHY_THRESHOLD)
            .collect();
        if last.as_ref() != Some(&now) {
            apply(&ruleset(plan, &now))?;
            crate::sys::write_atomic(&dir.join("lb-healthy.json"), &serde_json::to_string(&now)?)?;
            last = Some(now);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_listeners_send_only_to_healthy_nodes_and_zonal_ones_stay_in_their_zone() {
        let plan = Plan::new("flab", 3, 2).unwrap();
        let r = ruleset(&plan, &[2]);
        assert!(r.contains(
            "ip daddr 10.30.100.1 tcp dport 80 dnat ip to numgen inc mod 3 map \
             { 0 : 10.10.0.11 . 30080, 1 : 10.10.1.12 . 30080, 2 : 10.10.0.13 . 30080 }"
        ));
        assert!(r.contains(
            "ip daddr 10.30.100.1 tcp dport 81 dnat ip to numgen inc mod 1 map { 0 : 10.10.1.12 . 30082 }"
        ));
        assert!(r.contains(
            "ip daddr 10.30.0.1 tcp dport 80 dnat ip to numgen inc mod 2 map \
             { 0 : 10.10.0.11 . 30080, 1 : 10.10.0.13 . 30080 }"
        ));
        // Zone a has no healthy node for Local: no rule, so the reset rule answers.
        assert!(!r.contains("10.30.0.1 tcp dport 81"));
    }

    #[test]
    fn connection_counts_are_read_per_node_and_port() {
        let listing = r#"table ip ferrylb {
	chain targets {
		type filter hook forward priority filter; policy accept;
		ip daddr 10.10.0.11 tcp dport 30080 tcp flags & (syn | ack) == syn counter packets 3 bytes 180 comment "node1:30080"
		ip daddr 10.10.0.11 tcp dport 30082 tcp flags & (syn | ack) == syn counter packets 0 bytes 0 comment "node1:30082"
		ip daddr 10.10.1.12 tcp dport 30080 tcp flags & (syn | ack) == syn counter packets 4 bytes 240 comment "node2:30080"
	}
}"#;
        assert_eq!(connections_to(listing, 30080), [(1, 3), (2, 4)]);
        assert_eq!(connections_to(listing, 30082), [(1, 0)]);
    }
}
