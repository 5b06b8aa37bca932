//! The base tables of a node when the caller gives none: one uplink, from the Node
//! object and its `ferry.io/*` annotations.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ferry_datapath::{MacAddr, PortAddr, PortKind, PortSpec, RouteSpec, TablesSpec};
use ipnet::IpNet;

use crate::cluster::Cluster;
use crate::fields::{ANNOTATION_IPV4_ADDRESS, ANNOTATION_IPV6_ADDRESS, NodeFields};

use super::read;

/// The name of the uplink port of the default base.
pub const UPLINK_PORT: &str = "uplink";

/// The base tables of `node` derived from its Node object:
///
/// - one port `uplink` of kind uplink, MAC `02:fe` + the last four bytes of the first
///   InternalIP of IPv4 (else of a hash of the node name), addresses the InternalIPs,
///   each with the prefix length of the `ferry.io/ipv4-address` /
///   `ferry.io/ipv6-address` annotation when that names the same address, else `/32` or
///   `/128` (no subnet known to be on-link); `gso: true` (see docs/agent.md);
/// - a default route via `ferry.io/ipv4-gateway` / `ferry.io/ipv6-gateway`, when given.
///
/// Returns the tables and warnings (an annotation naming another address than the
/// InternalIPs is ignored, with a warning).
pub fn default_base(cluster: &Cluster, node: &str) -> Result<(TablesSpec, Vec<String>), String> {
    let n = cluster
        .node(node)
        .ok_or_else(|| format!("no Node named {node:?} in the cluster"))?;
    let f = read(NodeFields::parse(n), &format_args!("Node {node}"))?;
    let mut warnings = Vec::new();
    let mac = match f.internal_ips.iter().find_map(|a| match a {
        IpAddr::V4(v4) => Some(v4.octets()),
        IpAddr::V6(_) => None,
    }) {
        Some(o) => o,
        None => name_hash(node).to_be_bytes(),
    };
    let mut addresses = Vec::new();
    for a in &f.internal_ips {
        let given = if a.is_ipv6() {
            f.ipv6_address
        } else {
            f.ipv4_address
        };
        let prefix_len = match given {
            Some(n) if n.addr() == *a => n.prefix_len(),
            _ if a.is_ipv6() => 128,
            _ => 32,
        };
        addresses.push(PortAddr {
            addr: *a,
            prefix_len: Some(prefix_len),
        });
    }
    for (key, given) in [
        (ANNOTATION_IPV4_ADDRESS, f.ipv4_address),
        (ANNOTATION_IPV6_ADDRESS, f.ipv6_address),
    ] {
        if let Some(n) = given
            && !f.internal_ips.contains(&n.addr())
        {
            warnings.push(format!(
                "Node {node}: annotation {key} {n} is not one of the node's InternalIPs; ignored"
            ));
        }
    }
    let mut routes = Vec::new();
    for gw in [f.ipv4_gateway, f.ipv6_gateway].into_iter().flatten() {
        let unspecified = match gw {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        let prefix = IpNet::new(unspecified, 0).expect("a zero prefix length is valid");
        routes.push(RouteSpec {
            prefix,
            port: UPLINK_PORT.to_string(),
            next_hop_mac: None,
            via: Some(gw),
        });
    }
    let tables = TablesSpec {
        ports: vec![PortSpec {
            name: UPLINK_PORT.to_string(),
            kind: PortKind::Uplink,
            mac: MacAddr([0x02, 0xfe, mac[0], mac[1], mac[2], mac[3]]),
            addresses,
            // The agent's uplink is an AF_PACKET socket with virtio-net headers: the
            // kernel (or the NIC) segments what ferry hands it whole.
            gso: true,
            ..PortSpec::default()
        }],
        routes,
        ..TablesSpec::default()
    };
    Ok((tables, warnings))
}

/// FNV-1a of a name: the same on every node and every run.
pub(super) fn name_hash(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}
