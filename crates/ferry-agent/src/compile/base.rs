//! The base tables of a node when the caller gives none: one uplink, from the Node
//! object and its `ferry.io/*` annotations.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ferry_datapath::{MacAddr, PortAddr, PortKind, PortSpec, RouteSpec, TablesSpec};
use ipnet::IpNet;

use crate::cluster::Cluster;
use crate::fields::{ANNOTATION_IPV4_ADDRESS, ANNOTATION_IPV6_ADDRESS, NodeFields};
use crate::takeover::{Route as TakenRoute, Taken};

use super::read;

/// The name of the uplink port of the default base.
pub const UPLINK_PORT: &str = "uplink";

/// The name of the host port of the default base of a taken uplink.
pub const HOST_PORT: &str = "host";

/// The MAC of that host port: ferry's side of the host TAP, where the kernel finds its
/// gateway 169.254.1.1 (fe80::1).
pub const HOST_PORT_MAC: MacAddr = MacAddr([0x02, 0xfe, 0x00, 0x00, 0x00, 0xfe]);

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

/// Makes default base `b` carry the node's own stack that the agent moved from the
/// uplink onto the host TAP ([`crate::takeover`]):
///
/// - the uplink port gets the uplink's addresses with their prefixes (in place of the
///   InternalIPs' and the annotations'), and its MTU;
/// - its main-table routes become the base's routes through the uplink (the lowest
///   metric of each destination; a default route replaces the annotations' gateway),
///   and its permanent neighbours host routes to their MACs;
/// - a host port `host` answers as 169.254.1.1 (and fe80::1 with IPv6), and each node
///   address is routed to the kernel's MAC on the TAP.
///
/// Warnings: an InternalIP the uplink does not hold, an annotation's gateway that the
/// uplink's own default route overrides, routes of other tables (the kernel keeps them,
/// ferry's tables have one).
pub fn carry_taken(
    b: &mut TablesSpec,
    node: &str,
    internal_ips: &[IpAddr],
    t: &Taken,
    warnings: &mut Vec<String>,
) {
    let Some(up) = b.ports.iter_mut().find(|p| p.name == UPLINK_PORT) else {
        return;
    };
    up.addresses = t
        .addresses
        .iter()
        .map(|a| PortAddr {
            addr: a.addr.addr(),
            prefix_len: Some(a.addr.prefix_len()),
        })
        .collect();
    up.mtu = Some(t.mtu);
    for ip in internal_ips {
        if !t.addresses.iter().any(|a| a.addr.addr() == *ip) {
            warnings.push(format!(
                "Node {node}: InternalIP {ip} is not on the uplink {}; ferry does not answer for it there",
                t.uplink
            ));
        }
    }
    let mut best: Vec<&TakenRoute> = Vec::new();
    for r in t.routes.iter().filter(|r| !r.connected()) {
        if !r.main() {
            warnings.push(format!(
                "uplink {}: route {} of table {} moved to {} for the node's own traffic; ferry's tables have only the main table's routes",
                t.uplink,
                r.dst,
                r.table.as_deref().unwrap_or("main"),
                t.tap
            ));
            continue;
        }
        match best.iter_mut().find(|o| o.dst == r.dst) {
            Some(o) if o.metric.unwrap_or(0) > r.metric.unwrap_or(0) => *o = r,
            Some(_) => {}
            None => best.push(r),
        }
    }
    for r in best {
        if r.dst.prefix_len() == 0 {
            let before = b.routes.len();
            b.routes.retain(|o| {
                o.prefix.prefix_len() != 0 || o.prefix.addr().is_ipv4() != r.dst.addr().is_ipv4()
            });
            if b.routes.len() != before && r.gateway.is_some() {
                warnings.push(format!(
                    "Node {node}: the uplink's default route via {} stands in place of the gateway annotation",
                    r.gateway.map(|g| g.to_string()).unwrap_or_default()
                ));
            }
        }
        b.routes.push(RouteSpec {
            prefix: r.dst,
            port: UPLINK_PORT.to_string(),
            next_hop_mac: None,
            via: r.gateway,
        });
    }
    for n in &t.neighbours {
        b.routes.push(RouteSpec {
            prefix: IpNet::from(n.addr),
            port: UPLINK_PORT.to_string(),
            next_hop_mac: Some(n.mac),
            via: None,
        });
    }
    let v6 = t.addresses.iter().any(|a| a.addr.addr().is_ipv6());
    let mut gateways = vec![PortAddr {
        addr: ferry_datapath::GATEWAY_V4,
        prefix_len: None,
    }];
    if v6 {
        gateways.push(PortAddr {
            addr: ferry_datapath::GATEWAY_V6,
            prefix_len: None,
        });
    }
    b.ports.push(PortSpec {
        name: HOST_PORT.to_string(),
        kind: PortKind::Host,
        mac: HOST_PORT_MAC,
        mtu: Some(t.mtu),
        addresses: gateways,
        ..PortSpec::default()
    });
    for a in &t.addresses {
        b.routes.push(RouteSpec {
            prefix: IpNet::from(a.addr.addr()),
            port: HOST_PORT.to_string(),
            next_hop_mac: Some(t.tap_mac),
            via: None,
        });
    }
}

/// FNV-1a of a name: the same on every node and every run.
pub(super) fn name_hash(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}
