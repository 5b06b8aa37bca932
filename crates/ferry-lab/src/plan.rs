//! The lab's address and name plan: which zone each node is in, its subnet and
//! addresses, the pods and Services. Everything else derives its names from here.

use serde::{Deserialize, Serialize};

/// The pod CIDR's third octet and the uplink's host part are derived from the node's
/// number, so it stays below this.
pub const MAX_NODES: u8 = 9;
/// Zones are `zone-a`, `zone-b`...
pub const MAX_ZONES: u8 = 4;

/// The external client's address; its gateway is the load balancer.
pub const CLIENT_IP: &str = "10.20.0.2";
/// The external client's IPv6 address; its gateway is the load balancer's.
pub const CLIENT_IP6: &str = "fd00:20::2";
/// The load balancer's IPv6 address on the client's subnet.
pub const LB_CLIENT_SIDE_IP6: &str = "fd00:20::1";
/// The client's IPv6 subnet, routed back to the load balancer by the fabric.
pub const CLIENT_SUBNET6: &str = "fd00:20::/64";
/// The load balancer's IPv6 address on the fabric, in the first zone's subnet.
pub const LB_FABRIC_IP6: &str = "fd00:10:0::fa";
/// The load balancer's address on the client's subnet.
pub const LB_CLIENT_SIDE_IP: &str = "10.20.0.1";
/// The client's subnet, routed back to the load balancer by the fabric.
pub const CLIENT_SUBNET: &str = "10.20.0.0/24";
/// The load balancer's address on the fabric, in the first zone's subnet.
pub const LB_FABRIC_IP: &str = "10.10.0.250";
/// The load balancer's listener when it balances across zones.
pub const VIP_CROSS_ZONE: &str = "10.30.100.1";
/// A second external client, on a subnet of its own behind the load balancer: outside
/// `web-ranged`'s source ranges.
pub const CLIENT2_IP: &str = "10.20.1.2";
/// The load balancer's address on the second client's subnet.
pub const LB_CLIENT2_SIDE_IP: &str = "10.20.1.1";
/// The second client's subnet, routed back to the load balancer by the fabric.
pub const CLIENT2_SUBNET: &str = "10.20.1.0/24";
/// `web-ranged`'s load balancer IP: the load balancer routes it to node1 unchanged, as
/// a load balancer that keeps the VIP as the destination does (MetalLB, a cloud NLB
/// with IP targets), so node1 sees traffic to a load balancer IP and checks its
/// source ranges (a NAT load balancer's traffic to node ports is never checked).
pub const VIP_ROUTED: &str = "10.31.0.1";
/// The load balancer IP of `ferry lab check --suite services`' source ranges case,
/// routed to node1 unchanged as [`VIP_ROUTED`] is.
pub const VIP_SUITE: &str = "10.31.1.1";

/// The cluster IPs of the lab's Services.
pub mod cluster_ip {
    /// `web`: NodePort, externalTrafficPolicy Cluster, HTTP and UDP.
    pub const WEB: &str = "10.96.0.10";
    /// `web`'s IPv6 cluster IP (the Service is dual-stack).
    pub const WEB6: &str = "fd00:96::10";
    /// `web-local`: LoadBalancer, externalTrafficPolicy Local.
    pub const WEB_LOCAL: &str = "10.96.0.11";
    /// `multi-sticky`: the two `multi` pods with ClientIP session affinity.
    pub const MULTI_STICKY: &str = "10.96.0.12";
    /// `multi`: the same pods without affinity.
    pub const MULTI: &str = "10.96.0.13";
    /// `empty`: no endpoints.
    pub const EMPTY: &str = "10.96.0.14";
    /// `echo`: UDP only, its pod replaced during a check.
    pub const ECHO: &str = "10.96.0.15";
    /// `web-ranged`: LoadBalancer at [`super::VIP_ROUTED`], only the first client in its
    /// loadBalancerSourceRanges.
    pub const WEB_RANGED: &str = "10.96.0.16";
    /// `zonal`: `web` and the `multi` pods, trafficDistribution PreferSameZone.
    pub const ZONAL: &str = "10.96.0.17";
    /// `nodal`: the same pods, trafficDistribution PreferSameNode.
    pub const NODAL: &str = "10.96.0.18";
}

/// Node ports of the lab's Services.
pub mod node_port {
    /// `web` HTTP.
    pub const WEB_HTTP: u16 = 30080;
    /// `web` UDP echo.
    pub const WEB_UDP: u16 = 30081;
    /// `web-local` HTTP.
    pub const WEB_LOCAL_HTTP: u16 = 30082;
    /// `web-local`'s health check node port.
    pub const WEB_LOCAL_HEALTH: u16 = 32000;
    /// `web-ranged` HTTP (not restricted by its source ranges).
    pub const WEB_RANGED_HTTP: u16 = 30083;
}

/// The load balancer's ports: one per Service it fronts.
pub mod lb_port {
    /// To `web`'s HTTP node port (externalTrafficPolicy Cluster).
    pub const CLUSTER: u16 = 80;
    /// To `web-local`'s node port (externalTrafficPolicy Local).
    pub const LOCAL: u16 = 81;
}

/// A lab's shape: how many nodes, in how many zones, and its names' prefix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Every namespace's name starts with `PREFIX-`.
    pub prefix: String,
    /// Nodes `node1`..`nodeN`.
    pub nodes: u8,
    /// Zones; node i is in zone (i-1) mod zones.
    pub zones: u8,
}

/// A pod of the lab: its name, node, and `app` label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSpec {
    /// The pod's name (namespace `default`).
    pub name: String,
    /// Its node's number.
    pub node: u8,
    /// Its `app` label, which Services select.
    pub app: &'static str,
}

impl Plan {
    /// Checks the numbers.
    pub fn new(prefix: &str, nodes: u8, zones: u8) -> anyhow::Result<Plan> {
        anyhow::ensure!(
            (2..=MAX_NODES).contains(&nodes),
            "--nodes {nodes}: the lab has 2 to {MAX_NODES} nodes"
        );
        anyhow::ensure!(
            (1..=MAX_ZONES).contains(&zones) && zones <= nodes,
            "--zones {zones}: 1 to {MAX_ZONES}, and no more than nodes"
        );
        anyhow::ensure!(
            !prefix.is_empty()
                && prefix.len() <= 8
                && prefix.chars().all(|c| c.is_ascii_alphanumeric()),
            "prefix {prefix:?}: 1 to 8 letters or digits"
        );
        Ok(Plan {
            prefix: prefix.to_string(),
            nodes,
            zones,
        })
    }

    /// The full name of namespace `short`.
    pub fn ns(&self, short: &str) -> String {
        format!("{}-{short}", self.prefix)
    }

    /// Node numbers, 1-based.
    pub fn node_numbers(&self) -> impl Iterator<Item = u8> + use<> {
        1..=self.nodes
    }

    /// The zone index (0-based) of node `n`.
    pub fn zone_of(&self, n: u8) -> u8 {
        (n - 1) % self.zones
    }

    /// Zone `z`'s name, as the `topology.kubernetes.io/zone` label says.
    pub fn zone_name(z: u8) -> String {
        format!("zone-{}", (b'a' + z) as char)
    }

    /// Node `n`'s address on its zone's subnet.
    pub fn node_ip(&self, n: u8) -> String {
        format!("10.10.{}.{}", self.zone_of(n), 10 + n)
    }

    /// Node `n`'s IPv6 address on its zone's subnet (`/64`).
    pub fn node_ip6(&self, n: u8) -> String {
        format!("fd00:10:{}::{}", self.zone_of(n), 10 + n)
    }

    /// Zone `z`'s IPv6 router on the fabric.
    pub fn gateway6(z: u8) -> String {
        format!("fd00:10:{z}::fe")
    }

    /// Node `n`'s IPv6 pod CIDR.
    pub fn pod_cidr6(n: u8) -> String {
        format!("fd00:244:{n}::/64")
    }

    /// Zone `z`'s router on the fabric.
    pub fn gateway(z: u8) -> String {
        format!("10.10.{z}.254")
    }

    /// Node `n`'s pod CIDR.
    pub fn pod_cidr(n: u8) -> String {
        format!("10.244.{n}.0/24")
    }

    /// The load balancer's listener in zone `z` when it does not balance across zones:
    /// it sends only to that zone's nodes.
    pub fn vip_of_zone(z: u8) -> String {
        format!("10.30.{z}.1")
    }

    /// Nodes of zone `z`.
    pub fn nodes_in_zone(&self, z: u8) -> Vec<u8> {
        self.node_numbers()
            .filter(|&n| self.zone_of(n) == z)
            .collect()
    }

    /// The node hosting `web`: the second, in another zone than the first when there
    /// are two zones or more (the case of `calico-ebpf-nlb-nodeport.txt`: the load
    /// balancer's zone has no endpoint).
    pub fn web_node(&self) -> u8 {
        2
    }

    /// The node of `multi-2`: another node of node1's zone when there is one (pod to
    /// pod routed without the overlay), else the last node.
    pub fn multi_2_node(&self) -> u8 {
        self.nodes_in_zone(0)
            .into_iter()
            .find(|&n| n != 1)
            .unwrap_or(self.nodes)
    }

    /// The pods the lab creates at `up`.
    pub fn pods(&self) -> Vec<PodSpec> {
        let p = |name: &str, node: u8, app| PodSpec {
            name: name.to_string(),
            node,
            app,
        };
        vec![
            p("a", 1, "client"),
            p("b", 1, "peer"),
            p("web", self.web_node(), "web"),
            p("multi-1", 1, "multi"),
            p("multi-2", self.multi_2_node(), "multi"),
            p("echo-1", 1, "echo"),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_alternate_zones_and_get_their_zones_subnet() {
        let p = Plan::new("flab", 3, 2).unwrap();
        assert_eq!(p.zone_of(1), 0);
        assert_eq!(p.zone_of(2), 1);
        assert_eq!(p.zone_of(3), 0);
        assert_eq!(p.node_ip(2), "10.10.1.12");
        assert_eq!(p.nodes_in_zone(0), [1, 3]);
        assert_eq!(Plan::zone_name(1), "zone-b");
    }

    #[test]
    fn numbers_outside_the_plan_are_refused() {
        assert!(Plan::new("flab", 1, 1).is_err());
        assert!(Plan::new("flab", 3, 4).is_err());
        assert!(Plan::new("bad-prefix", 3, 2).is_err());
    }
}
