//! The node tables: ports and routes, in one documented format (see `docs/tables.md`).
//!
//! [`TablesSpec`] is what a file says (serde); [`Tables`] is the compiled, immutable form
//! the pipeline reads. Compilation checks everything a file can get wrong and names the
//! offending entry, so a bad file never half-applies.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::fib::Fib;

use crate::packet::PortId;

pub use crate::conntrack::CtSpec;
pub use crate::icmp::IcmpSpec;
pub use crate::ipf::IpfSpec;
pub use crate::nat::{NatRule, NatRuleSpec};
pub use crate::overlay::{ModeSpec, OverlaySpec, PeerSpec};
pub use crate::wire::ethernet::MacAddr;

/// The MTU of a port when the tables do not give one and no overlay derives it.
pub const DEFAULT_MTU: u16 = 1500;

/// What a port is attached to; decides which checks and answers apply to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PortKind {
    /// A pod's TAP: source check, ARP/ND answered for every address (proxy ARP), MTU
    /// derived from the overlay.
    Pod,
    /// The node's NIC: the neighbour table, ARP/ND for the node's addresses, VXLAN.
    Uplink,
    /// The node's own stack (a host TAP): neighbour table and ARP/ND like the uplink.
    Host,
    /// A port without link-layer services: frames go to the route's `next_hop_mac`, ARP
    /// is dropped (`arp_not_handled`), neighbour discovery is forwarded like any packet.
    #[default]
    Plain,
}

impl PortKind {
    /// Lower-case name, as the tables file writes it.
    pub fn name(self) -> &'static str {
        match self {
            PortKind::Pod => "pod",
            PortKind::Uplink => "uplink",
            PortKind::Host => "host",
            PortKind::Plain => "plain",
        }
    }

    /// True for ports that resolve next hops through the neighbour table.
    pub fn resolves(self) -> bool {
        matches!(self, PortKind::Uplink | PortKind::Host)
    }
}

/// An address in a port's `addresses`: `IP`, or `IP/LEN` to say the subnet that is
/// on-link through the port (neighbours resolved directly; the overlay's cross-subnet
/// test).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAddr {
    /// The address.
    pub addr: IpAddr,
    /// The prefix length of its on-link subnet, when given.
    pub prefix_len: Option<u8>,
}

impl From<IpAddr> for PortAddr {
    fn from(addr: IpAddr) -> PortAddr {
        PortAddr {
            addr,
            prefix_len: None,
        }
    }
}

impl FromStr for PortAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<PortAddr, String> {
        match s.split_once('/') {
            None => Ok(PortAddr::from(
                s.parse::<IpAddr>()
                    .map_err(|_| format!("{s:?}: not an IP address"))?,
            )),
            Some(_) => {
                let n: IpNet = s
                    .parse()
                    .map_err(|_| format!("{s:?}: not an IP address or ADDR/LEN"))?;
                Ok(PortAddr {
                    addr: n.addr(),
                    prefix_len: Some(n.prefix_len()),
                })
            }
        }
    }
}

impl fmt::Display for PortAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.prefix_len {
            Some(l) => write!(f, "{}/{l}", self.addr),
            None => write!(f, "{}", self.addr),
        }
    }
}

impl Serialize for PortAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PortAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PortAddr, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A port as the tables file describes it.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PortSpec {
    /// Unique name (also the replay file name: `DIR/NAME.pcap`).
    pub name: String,
    /// The port's own MAC: source of frames it sends.
    pub mac: MacAddr,
    /// What the port is attached to (default `plain`).
    #[serde(default)]
    pub kind: PortKind,
    /// Largest IP packet the port sends, in bytes. Default 1500, except a pod port when
    /// the overlay is configured: see `overlay::pod_mtu`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u16>,
    /// Conntrack / fragment zone of packets received here (default 0).
    #[serde(default)]
    pub zone: u16,
    /// For a pod port: the pod's addresses. For any other port: the node's addresses
    /// there (sources of ICMP errors, ARP/ND answered for them), `IP` or `IP/LEN`.
    #[serde(default)]
    pub addresses: Vec<PortAddr>,
    /// For a pod port: the pod's own MAC (its eth0), required.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_mac: Option<MacAddr>,
    /// Received TCP packets larger than the MTU are host-coalesced super-packets
    /// (GRO/RSC), to be segmented, never fragmented (default false).
    #[serde(default)]
    pub gro: bool,
    /// The port takes GSO super-packets and partial checksums whole, as a TAP with
    /// virtio-net headers does (default false: segment and complete checksums here).
    #[serde(default)]
    pub gso: bool,
}

impl Default for PortSpec {
    fn default() -> Self {
        PortSpec {
            name: String::new(),
            mac: MacAddr::default(),
            kind: PortKind::Plain,
            mtu: None,
            zone: 0,
            addresses: Vec::new(),
            peer_mac: None,
            gro: false,
            gso: false,
        }
    }
}

/// A route as the tables file describes it.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// Destination prefix, e.g. `10.244.1.0/24` or `fd00:10:244:1::/64`.
    pub prefix: IpNet,
    /// Name of the egress port.
    pub port: String,
    /// Destination MAC written on frames sent by this route (the next hop or the host).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_hop_mac: Option<MacAddr>,
    /// Next-hop address, resolved through the neighbour table (uplink and host ports).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<IpAddr>,
}

/// This node, as the tables file describes it.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// The node's name.
    #[serde(default)]
    pub name: String,
    /// Its underlay addresses: outer sources of VXLAN, and the addresses VXLAN is
    /// accepted on (default: the overlay uplink's addresses).
    #[serde(default)]
    pub addresses: Vec<IpAddr>,
    /// Its own pods' prefixes. An address in them that no pod has and no more specific
    /// route takes is no such pod: dropped (`no_such_pod`) and answered with ICMP
    /// unreachable, never sent along a shorter route (default none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_cidrs: Vec<IpNet>,
    /// Its zone (the Node's `topology.kubernetes.io/zone` label): the zone that
    /// endpoints' zone hints name (default none: zone hints are not used here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// The whole tables file.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TablesSpec {
    /// Ports, in order; a port's index is its `PortId`.
    pub ports: Vec<PortSpec>,
    /// Routes, longest prefix wins.
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    /// Fragment limits.
    #[serde(default)]
    pub ipf: IpfSpec,
    /// ICMP error rate limit.
    #[serde(default)]
    pub icmp: IcmpSpec,
    /// Connection tracking settings.
    #[serde(default)]
    pub ct: CtSpec,
    /// Static NAT rules, first match wins; applied when a connection starts.
    #[serde(default)]
    pub nat: Vec<NatRuleSpec>,
    /// This node.
    #[serde(default)]
    pub node: NodeSpec,
    /// The VXLAN overlay, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlay: Option<OverlaySpec>,
    /// The other nodes (needs `overlay`).
    #[serde(default)]
    pub nodes: Vec<PeerSpec>,
    /// How Service ports spread new connections over their endpoints.
    #[serde(default, skip_serializing_if = "crate::lb::BalanceSpec::is_default")]
    pub balance: crate::lb::BalanceSpec,
    /// Service ports and their endpoints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<crate::lb::ServiceSpec>,
    /// NetworkPolicy and ClusterNetworkPolicy for this node's pods.
    #[serde(default, skip_serializing_if = "crate::policy::PolicySpec::is_default")]
    pub policy: crate::policy::PolicySpec,
}

/// Connected routes: an `IP/LEN` address of a non-pod port puts its subnet on-link
/// there, unless a route for that very prefix says otherwise; and this node's pod CIDRs:
/// what no pod and no more specific route takes is no such pod (a route given for that
/// very prefix wins).
fn connect(ports: &[Port], node: &Node, fib: &mut Fib<Target>) {
    for (i, p) in ports.iter().enumerate() {
        if p.kind == PortKind::Pod {
            continue;
        }
        for n in &p.subnets {
            let n = n.trunc();
            if fib.get_exact(n).is_none() {
                fib.insert(
                    n,
                    Target::Route(Route {
                        port: i as PortId,
                        next_hop: NextHop::Direct,
                    }),
                );
            }
        }
    }
    for c in &node.pod_cidrs {
        if fib.get_exact(*c).is_none() {
            fib.insert(*c, Target::NoSuchPod);
        }
    }
}

/// True when the two prefixes share an address.
fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(b) || b.contains(a)
}

/// A compiled port.
#[derive(Clone, Debug)]
pub struct Port {
    /// Name.
    pub name: String,
    /// What the port is attached to.
    pub kind: PortKind,
    /// Own MAC.
    pub mac: [u8; 6],
    /// MTU (largest IP packet sent).
    pub mtu: u16,
    /// Zone of received packets.
    pub zone: u16,
    /// The source of ICMP errors sent here, IPv4: the port's first IPv4 address; for a
    /// pod port the node's (else the gateway 169.254.1.1).
    pub addr_v4: Option<IpAddr>,
    /// The same for IPv6 (a pod port's fallback is fe80::1).
    pub addr_v6: Option<IpAddr>,
    /// Pod port: the pod's addresses. Other ports: the node's addresses there.
    pub addresses: Vec<IpAddr>,
    /// On-link subnets (from `IP/LEN` addresses).
    pub subnets: Vec<IpNet>,
    /// Pod port: the pod's MAC.
    pub peer_mac: Option<[u8; 6]>,
    /// Oversized received TCP is a coalesced super-packet.
    pub gro: bool,
    /// Takes GSO packets and partial checksums whole.
    pub gso: bool,
}

impl Port {
    /// True when `a` is in one of the port's on-link subnets.
    pub fn on_link(&self, a: IpAddr) -> bool {
        self.subnets.iter().any(|n| n.contains(&a))
    }

    /// The node's address of `a`'s family on this port, for probes and answers.
    pub fn own_addr(&self, v6: bool) -> Option<IpAddr> {
        self.addresses.iter().copied().find(|a| a.is_ipv6() == v6)
    }
}

/// Where a route's frames go at the link layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextHop {
    /// To this MAC.
    Mac([u8; 6]),
    /// To this address's MAC, from the neighbour table.
    Via(IpAddr),
    /// The destination is on-link: to its own MAC, from the neighbour table.
    Direct,
    /// VXLAN-encapsulated to the overlay node with this index.
    Tunnel(u16),
}

/// A compiled route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Egress port.
    pub port: PortId,
    /// Link-layer next hop.
    pub next_hop: NextHop,
}

/// What a prefix of the FIB leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Forwarded by this route.
    Route(Route),
    /// One of this node's pod CIDRs (`node.pod_cidrs`): an address that no pod and no
    /// more specific route takes belongs to no pod, and goes nowhere.
    NoSuchPod,
}

impl Target {
    /// The route, unless the prefix is a pod CIDR of this node.
    pub fn route(&self) -> Option<Route> {
        match *self {
            Target::Route(r) => Some(r),
            Target::NoSuchPod => None,
        }
    }
}

/// This node, compiled.
#[derive(Clone, Debug, Default)]
pub struct Node {
    /// Name.
    pub name: String,
    /// Underlay addresses.
    pub addresses: Vec<IpAddr>,
    /// Its own pods' prefixes (host bits cleared).
    pub pod_cidrs: Vec<IpNet>,
}

impl Node {
    /// The first address of the family.
    pub fn addr(&self, v6: bool) -> Option<IpAddr> {
        self.addresses.iter().copied().find(|a| a.is_ipv6() == v6)
    }
}

/// Another node, compiled.
#[derive(Clone, Debug)]
pub struct Peer {
    /// Name.
    pub name: String,
    /// Underlay address.
    pub address: IpAddr,
    /// Its pods' prefixes.
    pub pod_cidrs: Vec<IpNet>,
    /// Its VTEP MAC (inner destination).
    pub vtep_mac: [u8; 6],
    /// How its address is reached on the uplink: `Mac`, `Via` (a gateway) or `Direct`.
    pub underlay: NextHop,
    /// Traffic to its pods is encapsulated (per the mode).
    pub encap: bool,
}

/// The overlay, compiled.
#[derive(Clone, Debug)]
pub struct Overlay {
    /// VNI.
    pub vni: u32,
    /// UDP port.
    pub port: u16,
    /// Mode.
    pub mode: crate::overlay::Mode,
    /// The uplink port.
    pub uplink: PortId,
    /// This node's VTEP MAC (inner source).
    pub vtep_mac: [u8; 6],
    /// The other nodes, by index.
    pub peers: Vec<Peer>,
    by_addr: HashMap<IpAddr, u16, ahash::RandomState>,
}

impl Overlay {
    /// The index of the node whose underlay address is `a`.
    pub fn peer_index(&self, a: IpAddr) -> Option<u16> {
        self.by_addr.get(&a).copied()
    }

    /// The index of the node whose pod CIDRs hold `a` (a pod address).
    pub fn peer_for_pod(&self, a: IpAddr) -> Option<u16> {
        self.peers
            .iter()
            .position(|p| p.pod_cidrs.iter().any(|c| c.contains(&a)))
            .map(|i| i as u16)
    }

    /// The index of the node a Service endpoint at `a` is on, when the tunnel reaches
    /// it: a pod of that node, or the node itself (a host-network pod).
    pub fn peer_for_endpoint(&self, a: IpAddr) -> Option<u16> {
        self.peer_for_pod(a).or_else(|| self.peer_index(a))
    }
}

/// The Service choice asks the tables what the node and its overlay reach.
impl crate::lb::Cluster for Tables {
    #[inline]
    fn tunnel_reaches(&self, a: IpAddr) -> bool {
        self.overlay
            .as_ref()
            .is_some_and(|ov| ov.peer_for_endpoint(a).is_some())
    }

    #[inline]
    fn node_addr(&self, v6: bool) -> Option<IpAddr> {
        self.node.addr(v6)
    }
}

/// The compiled, immutable tables the pipeline reads.
#[derive(Clone, Debug)]
pub struct Tables {
    /// Ports by `PortId`.
    pub ports: Vec<Port>,
    /// Routes, and this node's pod CIDRs.
    pub fib: Fib<Target>,
    /// Fragment limits as given (unset fields take the defaults).
    pub ipf: IpfSpec,
    /// ICMP rate limit as given.
    pub icmp: IcmpSpec,
    /// Connection tracking settings as given.
    pub ct: CtSpec,
    /// NAT rules in order.
    pub nat: Vec<NatRule>,
    /// This node.
    pub node: Node,
    /// The overlay, when configured.
    pub overlay: Option<Overlay>,
    /// Services.
    pub services: crate::lb::Services,
    /// NetworkPolicy for this node's pods.
    pub policy: Arc<crate::policy::Policy>,
    /// The MTU of a pod port that the tables give none: with the overlay, the uplink's
    /// less the encapsulation's overhead (`overlay::pod_mtu`; none in mode
    /// `never`), else [`DEFAULT_MTU`]. What a pod's interface is given when it is made.
    pub pod_mtu: u16,
}

/// The smallest MTU a port may have: IPv6's minimum link MTU.
pub const MIN_MTU: u16 = 1280;
/// The pods' IPv4 default gateway (link-local, as Calico).
pub const GATEWAY_V4: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(169, 254, 1, 1));
/// The pods' IPv6 default gateway.
pub const GATEWAY_V6: IpAddr = IpAddr::V6(std::net::Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1));

impl Tables {
    /// These tables with the Service ports named in `removed` taken out and `added` put
    /// in (see [`crate::lb::Services::update`]); everything else is shared or copied as
    /// is, so an endpoint change costs a copy of the Service lookup tables, not a
    /// compilation.
    pub fn with_services(
        &self,
        removed: &[&str],
        added: &[crate::lb::ServiceSpec],
    ) -> Result<Tables, String> {
        Ok(Tables {
            services: self.services.update(removed, added)?,
            ports: self.ports.clone(),
            fib: self.fib.clone(),
            ipf: self.ipf.clone(),
            icmp: self.icmp.clone(),
            ct: self.ct.clone(),
            nat: self.nat.clone(),
            node: self.node.clone(),
            overlay: self.overlay.clone(),
            policy: self.policy.clone(),
            pod_mtu: self.pod_mtu,
        })
    }
}

impl Tables {
    /// These tables with the policy section `policy` in place of theirs; everything
    /// else is shared or copied as is, so a policy change costs the policy's
    /// compilation alone, and of that only what differs from the policy in force (its
    /// sets and indexes that mean the same are taken over,
    /// [`PolicySpec::compile_after`](crate::policy::PolicySpec::compile_after)). The
    /// error names the rule or pod entry at fault.
    pub fn with_policy(&self, policy: &crate::policy::PolicySpec) -> Result<Tables, String> {
        let names: Vec<(&str, bool)> = (self.ports.iter())
            .map(|p| (p.name.as_str(), p.kind == PortKind::Pod))
            .collect();
        Ok(Tables {
            policy: Arc::new(policy.compile_after(&names, Some(&self.policy))?),
            services: self.services.clone(),
            ports: self.ports.clone(),
            fib: self.fib.clone(),
            ipf: self.ipf.clone(),
            icmp: self.icmp.clone(),
            ct: self.ct.clone(),
            nat: self.nat.clone(),
            node: self.node.clone(),
            overlay: self.overlay.clone(),
            pod_mtu: self.pod_mtu,
        })
    }
}

impl TablesSpec {
    /// Checks the spec and compiles it. The error names the entry and the problem.
    pub fn compile(&self) -> Result<Tables, String> {
        if self.ports.is_empty() {
            return Err("ports: at least one port is needed".into());
        }
        if self.ports.len() > usize::from(PortId::MAX) {
            return Err(format!("ports: at most {} ports", PortId::MAX));
        }
        let port_id = |n: &str| self.ports.iter().position(|p| p.name == n);
        let uplink = self.overlay_uplink()?;
        let node = Node {
            name: self.node.name.clone(),
            addresses: match (self.node.addresses.is_empty(), uplink) {
                (true, Some(u)) => self.ports[u].addresses.iter().map(|a| a.addr).collect(),
                _ => self.node.addresses.clone(),
            },
            pod_cidrs: self.node.pod_cidrs.iter().map(IpNet::trunc).collect(),
        };
        // The overlay's underlay is IPv6 when a peer is reached over IPv6, or when this
        // node has IPv6 addresses only (an IPv6 underlay whose peers are still to come):
        // pods keep the MTU they were given when peers join.
        let underlay_v6 = self.nodes.iter().any(|n| n.address.is_ipv6())
            || (node.addresses.iter().any(IpAddr::is_ipv6)
                && !node.addresses.iter().any(IpAddr::is_ipv4));
        let pod_mtu = match (&self.overlay, uplink) {
            (Some(o), Some(u)) => {
                let up = self.ports[u].mtu.unwrap_or(DEFAULT_MTU);
                if o.mode == ModeSpec::Never {
                    // Nothing is encapsulated.
                    up
                } else {
                    crate::overlay::pod_mtu(up, underlay_v6)
                }
            }
            _ => DEFAULT_MTU,
        };
        let mut ports = Vec::with_capacity(self.ports.len());
        for (i, p) in self.ports.iter().enumerate() {
            ports.push(self.compile_port(i, p, pod_mtu, &node)?);
        }
        let mut fib = self.compile_routes(&ports)?;
        let overlay = match (&self.overlay, uplink) {
            (Some(o), Some(u)) => Some(self.compile_overlay(o, u, &node, &ports, &mut fib)?),
            _ => None,
        };
        connect(&ports, &node, &mut fib);
        let mut nat = Vec::with_capacity(self.nat.len());
        for (i, r) in self.nat.iter().enumerate() {
            let port = |n: &str| port_id(n).map(|i| i as PortId);
            nat.push(r.compile(port).map_err(|e| format!("nat[{i}]: {e}"))?);
        }
        self.ipf.check()?;
        self.ct.check()?;
        let local_addrs = node.addresses.iter().copied().chain(
            ports
                .iter()
                .filter(|p| matches!(p.kind, PortKind::Uplink | PortKind::Host))
                .flat_map(|p| p.addresses.iter().copied())
                .filter(|a| *a != GATEWAY_V4 && *a != GATEWAY_V6),
        );
        let services = crate::lb::Services::compile_on(
            &self.services,
            &node.name,
            self.node.zone.as_deref(),
            local_addrs,
            self.balance,
        )?;
        let names: Vec<(&str, bool)> = ports
            .iter()
            .map(|p| (p.name.as_str(), p.kind == PortKind::Pod))
            .collect();
        let policy = Arc::new(self.policy.compile(&names)?);
        Ok(Tables {
            ports,
            fib,
            ipf: self.ipf.clone(),
            icmp: self.icmp.clone(),
            ct: self.ct.clone(),
            nat,
            node,
            overlay,
            services,
            policy,
            pod_mtu,
        })
    }

    /// The overlay's uplink port, checked with the overlay's settings; None without an
    /// overlay (then there may be no other nodes).
    fn overlay_uplink(&self) -> Result<Option<usize>, String> {
        let port_id = |n: &str| self.ports.iter().position(|p| p.name == n);
        Ok(match &self.overlay {
            Some(o) => {
                let u = port_id(&o.uplink)
                    .ok_or_else(|| format!("overlay: uplink: no port named {:?}", o.uplink))?;
                if self.ports[u].kind != PortKind::Uplink {
                    return Err(format!(
                        "overlay: uplink: port {:?} is not of kind uplink",
                        o.uplink
                    ));
                }
                if o.vni > crate::overlay::MAX_VNI {
                    return Err(format!("overlay: vni {} does not fit 24 bits", o.vni));
                }
                if o.port == 0 {
                    return Err("overlay: port must be 1-65535".into());
                }
                Some(u)
            }
            None if !self.nodes.is_empty() => {
                return Err("nodes: other nodes need an overlay section".into());
            }
            None => None,
        })
    }

    /// Port `i`, `p`, compiled: a pod port without an MTU takes `pod_mtu`; a pod port's
    /// addresses for ICMP errors are the node's (else the pods' gateways).
    fn compile_port(
        &self,
        i: usize,
        p: &PortSpec,
        pod_mtu: u16,
        node: &Node,
    ) -> Result<Port, String> {
        let what = || format!("ports[{i}] ({:?})", p.name);
        if p.name.is_empty()
            || !p
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(format!(
                "{}: name must be non-empty letters, digits, '-', '_' or '.'",
                what()
            ));
        }
        if self.ports[..i].iter().any(|q| q.name == p.name) {
            return Err(format!("{}: duplicate port name", what()));
        }
        let mtu = match p.mtu {
            Some(m) => m,
            None if p.kind == PortKind::Pod => pod_mtu,
            None => DEFAULT_MTU,
        };
        if mtu < MIN_MTU {
            return Err(format!(
                "{}: mtu {mtu} is below the minimum {MIN_MTU}{}",
                what(),
                if p.mtu.is_none() {
                    " (derived from the uplink MTU and the overlay overhead)"
                } else {
                    ""
                }
            ));
        }
        let pod = p.kind == PortKind::Pod;
        if pod && p.peer_mac.is_none() {
            return Err(format!("{}: a pod port needs peer_mac", what()));
        }
        if !pod && p.peer_mac.is_some() {
            return Err(format!("{}: peer_mac is only for pod ports", what()));
        }
        let addresses: Vec<IpAddr> = p.addresses.iter().map(|a| a.addr).collect();
        let mut subnets = Vec::new();
        for a in &p.addresses {
            if let Some(len) = a.prefix_len {
                subnets.push(
                    IpNet::new(a.addr, len)
                        .map_err(|_| format!("{}: bad prefix length", what()))?
                        .trunc(),
                );
            }
        }
        let (addr_v4, addr_v6) = if pod {
            (
                Some(node.addr(false).unwrap_or(GATEWAY_V4)),
                Some(node.addr(true).unwrap_or(GATEWAY_V6)),
            )
        } else {
            (
                addresses.iter().copied().find(IpAddr::is_ipv4),
                addresses.iter().copied().find(IpAddr::is_ipv6),
            )
        };
        Ok(Port {
            name: p.name.clone(),
            kind: p.kind,
            mac: p.mac.0,
            mtu,
            zone: p.zone,
            addr_v4,
            addr_v6,
            addresses,
            subnets,
            peer_mac: p.peer_mac.map(|m| m.0),
            gro: p.gro,
            gso: p.gso,
        })
    }

    /// The routes of the tables file, and each pod's own addresses to it unless a route
    /// says otherwise.
    fn compile_routes(&self, ports: &[Port]) -> Result<Fib<Target>, String> {
        let port_id = |n: &str| self.ports.iter().position(|p| p.name == n);
        let mut fib = Fib::new();
        for (i, r) in self.routes.iter().enumerate() {
            let what = || format!("routes[{i}] ({})", r.prefix);
            let port = port_id(&r.port)
                .ok_or_else(|| format!("{}: no port named {:?}", what(), r.port))?;
            let p = &ports[port];
            let next_hop = match (r.next_hop_mac, r.via) {
                (Some(_), Some(_)) => {
                    return Err(format!(
                        "{}: next_hop_mac and via exclude each other",
                        what()
                    ));
                }
                (Some(m), None) => NextHop::Mac(m.0),
                (None, via) if p.kind == PortKind::Pod => {
                    if via.is_some() {
                        return Err(format!(
                            "{}: a pod port has no via: its pod is the next hop",
                            what()
                        ));
                    }
                    NextHop::Mac(p.peer_mac.expect("checked above"))
                }
                (None, _) if !p.kind.resolves() => {
                    return Err(format!(
                        "{}: port {:?} is {}: give next_hop_mac (via and direct routes need an uplink or host port)",
                        what(),
                        r.port,
                        p.kind.name()
                    ));
                }
                (None, Some(v)) => {
                    if v.is_ipv4() != r.prefix.addr().is_ipv4() {
                        return Err(format!("{}: via {v} is not of the prefix's family", what()));
                    }
                    NextHop::Via(v)
                }
                (None, None) => NextHop::Direct,
            };
            let route = Route {
                port: port as PortId,
                next_hop,
            };
            if fib.insert(r.prefix.trunc(), Target::Route(route)).is_some() {
                return Err(format!("{}: duplicate prefix", what()));
            }
        }
        // Each pod's own addresses route to it, unless a route says otherwise.
        for (i, p) in ports.iter().enumerate() {
            if p.kind != PortKind::Pod {
                continue;
            }
            for a in &p.addresses {
                let host = IpNet::from(*a);
                if !self.routes.iter().any(|r| r.prefix.trunc() == host) {
                    let route = Route {
                        port: i as PortId,
                        next_hop: NextHop::Mac(p.peer_mac.expect("pod")),
                    };
                    if fib.insert(host, Target::Route(route)).is_some() {
                        return Err(format!(
                            "ports[{i}] ({:?}): address {a} belongs to another pod",
                            p.name
                        ));
                    }
                }
            }
        }
        Ok(fib)
    }

    /// Compiles the overlay and adds the routes to the other nodes' pods.
    fn compile_overlay(
        &self,
        o: &OverlaySpec,
        uplink: usize,
        node: &Node,
        ports: &[Port],
        fib: &mut Fib<Target>,
    ) -> Result<Overlay, String> {
        use crate::overlay::Mode;
        let mode = match o.mode {
            ModeSpec::Always => Mode::Always,
            ModeSpec::CrossSubnet => Mode::CrossSubnet,
            ModeSpec::Never => Mode::Never,
        };
        let up = &ports[uplink];
        let vtep_mac = match (o.mac, node.addresses.first()) {
            (Some(m), _) => m.0,
            (None, Some(a)) => crate::overlay::vtep_mac(*a),
            (None, None) => up.mac,
        };
        let mut peers = Vec::with_capacity(self.nodes.len());
        let mut by_addr = HashMap::default();
        for (i, n) in self.nodes.iter().enumerate() {
            let what = || format!("nodes[{i}] ({:?})", n.name);
            if n.name.is_empty() {
                return Err(format!("{}: a node needs a name", what()));
            }
            if self.nodes[..i].iter().any(|m| m.name == n.name) {
                return Err(format!("{}: duplicate node name", what()));
            }
            if node.addresses.contains(&n.address) {
                return Err(format!("{}: address {} is this node's", what(), n.address));
            }
            if by_addr.insert(n.address, i as u16).is_some() {
                return Err(format!("{}: duplicate address {}", what(), n.address));
            }
            if node.addr(n.address.is_ipv6()).is_none() {
                return Err(format!(
                    "{}: this node has no {} underlay address to reach {}",
                    what(),
                    if n.address.is_ipv6() { "IPv6" } else { "IPv4" },
                    n.address
                ));
            }
            let underlay = if up.on_link(n.address) {
                NextHop::Direct
            } else {
                match fib.lookup(n.address).and_then(Target::route) {
                    Some(r) if usize::from(r.port) == uplink => match r.next_hop {
                        NextHop::Tunnel(_) => {
                            return Err(format!(
                                "{}: its address is routed through the overlay",
                                what()
                            ));
                        }
                        h => h,
                    },
                    _ => {
                        return Err(format!(
                            "{}: no route to {} through the uplink {:?} (give the uplink address as IP/LEN or add a route)",
                            what(),
                            n.address,
                            up.name
                        ));
                    }
                }
            };
            let encap = match mode {
                Mode::Always => true,
                Mode::Never => false,
                Mode::CrossSubnet => !up.on_link(n.address),
            };
            let next_hop = match (encap, underlay) {
                (true, _) => NextHop::Tunnel(i as u16),
                (false, NextHop::Direct) => NextHop::Via(n.address),
                (false, h) => h,
            };
            for c in &n.pod_cidrs {
                let route = Route {
                    port: uplink as PortId,
                    next_hop,
                };
                if let Some(own) = node.pod_cidrs.iter().find(|o| overlap(o, c)) {
                    return Err(format!(
                        "{}: pod_cidr {c} overlaps this node's pod_cidr {own}",
                        what()
                    ));
                }
                if fib.insert(c.trunc(), Target::Route(route)).is_some() {
                    return Err(format!("{}: pod_cidr {c} duplicates a route", what()));
                }
            }
            peers.push(Peer {
                name: n.name.clone(),
                address: n.address,
                pod_cidrs: n.pod_cidrs.iter().map(IpNet::trunc).collect(),
                vtep_mac: n
                    .mac
                    .map_or_else(|| crate::overlay::vtep_mac(n.address), |m| m.0),
                underlay,
                encap,
            });
        }
        Ok(Overlay {
            vni: o.vni,
            port: o.port,
            mode,
            uplink: uplink as PortId,
            vtep_mac,
            peers,
            by_addr,
        })
    }
}

impl Tables {
    /// The port with this name.
    pub fn port_id(&self, name: &str) -> Option<PortId> {
        self.ports
            .iter()
            .position(|p| p.name == name)
            .map(|i| i as PortId)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::{FlowKey, proto};
    use crate::nat::{MatchSpec, Snat};

    fn spec(ports: &[(&str, u16)], routes: &[(&str, &str)]) -> TablesSpec {
        TablesSpec {
            ports: ports
                .iter()
                .map(|(n, mtu)| PortSpec {
                    name: n.to_string(),
                    mac: MacAddr([2, 0, 0, 0, 0, 1]),
                    mtu: Some(*mtu),
                    ..PortSpec::default()
                })
                .collect(),
            routes: routes
                .iter()
                .map(|(p, port)| RouteSpec {
                    prefix: p.parse().unwrap(),
                    port: port.to_string(),
                    next_hop_mac: Some(MacAddr([2, 0, 0, 0, 0, 2])),
                    via: None,
                })
                .collect(),
            ..TablesSpec::default()
        }
    }

    fn route(t: &Tables, a: &str) -> Route {
        t.fib.lookup(a.parse().unwrap()).unwrap().route().unwrap()
    }

    #[test]
    fn test_mac_parse_and_display() {
        let m: MacAddr = "02:0a:FF:00:00:01".parse().unwrap();
        assert_eq!(m.0, [2, 10, 255, 0, 0, 1]);
        assert_eq!(m.to_string(), "02:0a:ff:00:00:01");
        assert!("02:00:00:00:00".parse::<MacAddr>().is_err());
        assert!("02:00:00:00:00:00:00".parse::<MacAddr>().is_err());
        assert!("02:00:00:00:00:zz".parse::<MacAddr>().is_err());
        assert!("02:00:00:00:00:100".parse::<MacAddr>().is_err());
    }

    #[test]
    fn test_compile_resolves_routes() {
        let t = spec(
            &[("uplink", 1500), ("pod1", 1450)],
            &[("10.244.1.5/32", "pod1"), ("0.0.0.0/0", "uplink")],
        )
        .compile()
        .unwrap();
        assert_eq!(t.port_id("pod1"), Some(1));
        assert_eq!(route(&t, "10.244.1.5").port, 1);
        assert_eq!(route(&t, "8.8.8.8").port, 0);
    }

    #[test]
    fn test_an_address_with_a_prefix_makes_a_connected_route() {
        let mut t = spec(
            &[("uplink", 1500), ("lab", 1500)],
            &[("10.9.0.0/16", "lab")],
        );
        t.ports[0].kind = PortKind::Uplink;
        t.ports[0].addresses = vec![
            "192.168.77.1/24".parse().unwrap(),
            "10.9.0.1/16".parse().unwrap(),
        ];
        let c = t.compile().unwrap();
        let r = route(&c, "192.168.77.9");
        assert_eq!((r.port, r.next_hop), (0, NextHop::Direct));
        // A route given for the same prefix wins.
        assert_eq!(route(&c, "10.9.3.3").port, 1);
    }

    #[test]
    fn test_compile_errors_name_the_entry() {
        let e = spec(&[("a", 1500)], &[("10.0.0.0/8", "nope")])
            .compile()
            .unwrap_err();
        assert!(e.contains("routes[0]") && e.contains("nope"), "{e}");
        let e = spec(&[("a", 1500), ("a", 1500)], &[])
            .compile()
            .unwrap_err();
        assert!(e.contains("ports[1]") && e.contains("duplicate"), "{e}");
        let e = spec(&[("a", 1000)], &[]).compile().unwrap_err();
        assert!(e.contains("mtu 1000"), "{e}");
        let e = spec(&[("a b", 1500)], &[]).compile().unwrap_err();
        assert!(e.contains("name"), "{e}");
        let e = spec(&[("a", 1500)], &[("10.0.0.0/8", "a"), ("10.1.0.0/8", "a")])
            .compile()
            .unwrap_err();
        assert!(e.contains("duplicate prefix"), "{e}");
        assert!(spec(&[], &[]).compile().is_err());
        let mut t = spec(&[("a", 1500)], &[]);
        t.ipf.min_fragment_v4 = Some(8);
        assert!(t.compile().unwrap_err().contains("min_fragment"));
        let mut t = spec(&[("a", 1500)], &[]);
        t.ipf.max_datagrams = Some(0);
        assert!(t.compile().unwrap_err().contains("positive"));
    }

    fn nat_rule(
        m: MatchSpec,
        dnat: Option<&str>,
        snat: Option<&str>,
        masquerade: bool,
    ) -> Result<NatRule, String> {
        let mut t = spec(&[("uplink", 1500), ("pod", 1500)], &[]);
        t.nat = vec![NatRuleSpec {
            matches: m,
            dnat: dnat.map(str::to_string),
            snat: snat.map(str::to_string),
            masquerade,
        }];
        t.compile().map(|c| c.nat[0].clone())
    }

    fn tcp_to(dst: &str, port: u16) -> MatchSpec {
        MatchSpec {
            proto: Some("tcp".into()),
            dst: Some(dst.parse().unwrap()),
            dst_port: Some(port),
            ..MatchSpec::default()
        }
    }

    #[test]
    fn test_nat_rules_compile_and_match() {
        let r = nat_rule(
            tcp_to("10.96.0.10/32", 80),
            Some("10.244.1.5:8080"),
            None,
            false,
        )
        .unwrap();
        assert_eq!(r.dnat, Some(("10.244.1.5".parse().unwrap(), Some(8080))));
        assert_eq!(r.snat, Snat::None);
        let key = |dst: &str, port: u16, proto: u8| FlowKey {
            zone: 0,
            src: "10.0.0.1".parse().unwrap(),
            dst: dst.parse().unwrap(),
            proto,
            src_port: 40000,
            dst_port: port,
        };
        assert!(r.matches(0, &key("10.96.0.10", 80, proto::TCP)));
        assert!(!r.matches(0, &key("10.96.0.10", 81, proto::TCP)));
        assert!(!r.matches(0, &key("10.96.0.10", 80, proto::UDP)));
        assert!(!r.matches(0, &key("10.96.0.11", 80, proto::TCP)));

        let r = nat_rule(
            MatchSpec::default(),
            None,
            Some("[fd00::1]:30000-30010"),
            false,
        )
        .unwrap();
        assert_eq!(
            r.snat,
            Snat::To("fd00::1".parse().unwrap(), Some((30000, 30010)))
        );
        let r = nat_rule(MatchSpec::default(), None, Some("192.168.0.1"), false).unwrap();
        assert_eq!(r.snat, Snat::To("192.168.0.1".parse().unwrap(), None));
        let r = nat_rule(
            MatchSpec {
                in_port: Some("pod".into()),
                ..MatchSpec::default()
            },
            None,
            None,
            true,
        )
        .unwrap();
        assert_eq!((r.in_port, r.snat), (Some(1), Snat::Masquerade));
        assert!(!r.matches(0, &key("1.1.1.1", 1, proto::UDP)));
        // Hairpin: DNAT and SNAT in one rule.
        let r = nat_rule(
            tcp_to("10.96.0.10/32", 80),
            Some("10.244.1.5:8080"),
            Some("10.244.1.1"),
            false,
        )
        .unwrap();
        assert!(r.dnat.is_some() && r.snat != Snat::None);
    }

    #[test]
    fn test_nat_rule_errors_are_clear() {
        let err = |m, d, s, masq| nat_rule(m, d, s, masq).unwrap_err();
        assert!(
            err(MatchSpec::default(), None, None, false).contains("needs dnat, snat or masquerade")
        );
        assert!(err(MatchSpec::default(), None, Some("1.1.1.1"), true).contains("exclude"));
        assert!(
            err(MatchSpec::default(), Some("10.0.0.1:80"), None, false)
                .contains("needs match.proto")
        );
        assert!(
            err(tcp_to("10.96.0.10/32", 80), Some("10.0.0.1:0"), None, false).contains("bad port")
        );
        assert!(
            err(tcp_to("10.96.0.10/32", 80), Some("fd00::1"), None, false)
                .contains("IPv4 or all IPv6")
        );
        assert!(
            err(tcp_to("10.96.0.10/32", 80), Some("nonsense"), None, false)
                .contains("not an address")
        );
        assert!(
            err(MatchSpec::default(), None, Some("1.1.1.1:20-10"), false)
                .contains("empty port range")
        );
        let e = err(
            MatchSpec {
                in_port: Some("nope".into()),
                ..MatchSpec::default()
            },
            None,
            None,
            true,
        );
        assert!(
            e.starts_with("nat[0]: match.in_port") && e.contains("nope"),
            "{e}"
        );
        let e = err(
            MatchSpec {
                proto: Some("sctp".into()),
                ..MatchSpec::default()
            },
            None,
            None,
            true,
        );
        assert!(e.contains("proto \"sctp\""), "{e}");
    }
}
