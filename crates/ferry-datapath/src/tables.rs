//! The node tables: ports and routes, in one documented format (see `docs/tables.md`).
//!
//! [`TablesSpec`] is what a file says (serde); [`Tables`] is the compiled, immutable form
//! the pipeline reads. Compilation checks everything a file can get wrong and names the
//! offending entry, so a bad file never half-applies.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer};

use crate::fib::Fib;
use crate::packet::PortId;

/// An Ethernet address, written `02:00:00:00:00:01`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl FromStr for MacAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<MacAddr, String> {
        let mut m = [0u8; 6];
        let mut parts = s.split(':');
        for b in m.iter_mut() {
            let p = parts
                .next()
                .ok_or_else(|| format!("MAC address {s:?} has fewer than 6 octets"))?;
            if p.is_empty() || p.len() > 2 {
                return Err(format!("MAC address {s:?}: bad octet {p:?}"));
            }
            *b = u8::from_str_radix(p, 16)
                .map_err(|_| format!("MAC address {s:?}: bad octet {p:?}"))?;
        }
        if parts.next().is_some() {
            return Err(format!("MAC address {s:?} has more than 6 octets"));
        }
        Ok(MacAddr(m))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<MacAddr, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

fn default_mtu() -> u16 {
    1500
}

/// A port as the tables file describes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortSpec {
    /// Unique name (also the replay file name: `DIR/NAME.pcap`).
    pub name: String,
    /// The port's own MAC: source of frames it sends.
    pub mac: MacAddr,
    /// Largest IP packet the port sends, in bytes (default 1500).
    #[serde(default = "default_mtu")]
    pub mtu: u16,
    /// Conntrack / fragment zone of packets received here (default 0).
    #[serde(default)]
    pub zone: u16,
    /// The node's addresses on this port: sources of ICMP errors it sends.
    #[serde(default)]
    pub addresses: Vec<IpAddr>,
    /// Received TCP packets larger than the MTU are host-coalesced super-packets
    /// (GRO/RSC), to be segmented, never fragmented (default false).
    #[serde(default)]
    pub gro: bool,
    /// The port takes GSO super-packets and partial checksums whole, as a TAP with
    /// virtio-net headers does (default false: segment and complete checksums here).
    #[serde(default)]
    pub gso: bool,
}

/// A route as the tables file describes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// Destination prefix, e.g. `10.244.1.0/24` or `fd00:10:244:1::/64`.
    pub prefix: IpNet,
    /// Name of the egress port.
    pub port: String,
    /// Destination MAC written on frames sent by this route (the next hop or the host).
    pub next_hop_mac: MacAddr,
}

/// Fragment-handling limits; every field optional, defaults documented in `ipf`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpfSpec {
    /// Incomplete datagrams are dropped after this many milliseconds.
    pub timeout_ms: Option<u64>,
    /// Most datagrams being reassembled at once.
    pub max_datagrams: Option<usize>,
    /// Most bytes held for reassembly.
    pub max_bytes: Option<usize>,
    /// Smallest non-final IPv4 fragment accepted (whole IP packet, bytes).
    pub min_fragment_v4: Option<u16>,
    /// Smallest non-final IPv6 fragment accepted (whole IP packet, bytes).
    pub min_fragment_v6: Option<u16>,
}

/// ICMP error rate limit (node-wide token bucket).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IcmpSpec {
    /// Errors per second (default 1000).
    pub per_second: Option<u32>,
    /// Burst size (default 50).
    pub burst: Option<u32>,
}

/// The whole tables file.
#[derive(Clone, Debug, Deserialize)]
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
}

/// A compiled port.
#[derive(Clone, Debug)]
pub struct Port {
    /// Name.
    pub name: String,
    /// Own MAC.
    pub mac: [u8; 6],
    /// MTU (largest IP packet sent).
    pub mtu: u16,
    /// Zone of received packets.
    pub zone: u16,
    /// An IPv4 address of the node on this port, if any.
    pub addr_v4: Option<IpAddr>,
    /// An IPv6 address of the node on this port, if any.
    pub addr_v6: Option<IpAddr>,
    /// Oversized received TCP is a coalesced super-packet.
    pub gro: bool,
    /// Takes GSO packets and partial checksums whole.
    pub gso: bool,
}

/// A compiled route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Egress port.
    pub port: PortId,
    /// Destination MAC.
    pub next_hop_mac: [u8; 6],
}

/// The compiled, immutable tables the pipeline reads.
#[derive(Clone, Debug)]
pub struct Tables {
    /// Ports by `PortId`.
    pub ports: Vec<Port>,
    /// Routes.
    pub fib: Fib<Route>,
    /// Fragment limits as given (unset fields take the defaults).
    pub ipf: IpfSpec,
    /// ICMP rate limit as given.
    pub icmp: IcmpSpec,
}

/// The smallest MTU a port may have: IPv6's minimum link MTU.
pub const MIN_MTU: u16 = 1280;
/// The largest MTU a port may have.
pub const MAX_MTU: u16 = 65535;

impl TablesSpec {
    /// Checks the spec and compiles it. The error names the entry and the problem.
    pub fn compile(&self) -> Result<Tables, String> {
        if self.ports.is_empty() {
            return Err("ports: at least one port is needed".into());
        }
        if self.ports.len() > usize::from(PortId::MAX) {
            return Err(format!("ports: at most {} ports", PortId::MAX));
        }
        let mut ports = Vec::with_capacity(self.ports.len());
        for (i, p) in self.ports.iter().enumerate() {
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
            if p.mtu < MIN_MTU {
                return Err(format!(
                    "{}: mtu {} is below the minimum {MIN_MTU}",
                    what(),
                    p.mtu
                ));
            }
            ports.push(Port {
                name: p.name.clone(),
                mac: p.mac.0,
                mtu: p.mtu,
                zone: p.zone,
                addr_v4: p.addresses.iter().copied().find(IpAddr::is_ipv4),
                addr_v6: p.addresses.iter().copied().find(IpAddr::is_ipv6),
                gro: p.gro,
                gso: p.gso,
            });
        }
        let mut fib = Fib::new();
        for (i, r) in self.routes.iter().enumerate() {
            let port = self
                .ports
                .iter()
                .position(|p| p.name == r.port)
                .ok_or_else(|| format!("routes[{i}] ({}): no port named {:?}", r.prefix, r.port))?;
            let route = Route {
                port: port as PortId,
                next_hop_mac: r.next_hop_mac.0,
            };
            if fib.insert(r.prefix.trunc(), route).is_some() {
                return Err(format!("routes[{i}] ({}): duplicate prefix", r.prefix));
            }
        }
        Ok(Tables {
            ports,
            fib,
            ipf: self.ipf.clone(),
            icmp: self.icmp.clone(),
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

    fn spec(ports: &[(&str, u16)], routes: &[(&str, &str)]) -> TablesSpec {
        TablesSpec {
            ports: ports
                .iter()
                .map(|(n, mtu)| PortSpec {
                    name: n.to_string(),
                    mac: MacAddr([2, 0, 0, 0, 0, 1]),
                    mtu: *mtu,
                    zone: 0,
                    addresses: vec![],
                    gro: false,
                    gso: false,
                })
                .collect(),
            routes: routes
                .iter()
                .map(|(p, port)| RouteSpec {
                    prefix: p.parse().unwrap(),
                    port: port.to_string(),
                    next_hop_mac: MacAddr([2, 0, 0, 0, 0, 2]),
                })
                .collect(),
            ipf: IpfSpec::default(),
            icmp: IcmpSpec::default(),
        }
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
        assert_eq!(t.fib.lookup("10.244.1.5".parse().unwrap()).unwrap().port, 1);
        assert_eq!(t.fib.lookup("8.8.8.8".parse().unwrap()).unwrap().port, 0);
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
    }
}
