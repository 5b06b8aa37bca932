//! Longest-prefix-match routing table.
//!
//! One hash map per prefix length present, probed from the longest length down: lookups
//! cost one probe per distinct length in use, whatever the number of routes.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// A longest-prefix-match table from IP prefixes to values.
#[derive(Clone, Debug)]
pub struct Fib<T> {
    v4: Family<u32, T>,
    v6: Family<u128, T>,
}

#[derive(Clone, Debug)]
struct Family<A, T> {
    /// (prefix length, network address -> value), longest length first.
    by_len: Vec<(u8, HashMap<A, T, ahash::RandomState>)>,
}

impl<A: std::hash::Hash + Eq + Copy, T> Family<A, T> {
    fn insert(&mut self, len: u8, net: A, value: T) -> Option<T> {
        let i = match self.by_len.binary_search_by(|(l, _)| len.cmp(l)) {
            Ok(i) => i,
            Err(i) => {
                self.by_len.insert(i, (len, HashMap::default()));
                i
            }
        };
        self.by_len[i].1.insert(net, value)
    }
}

impl<T> Default for Fib<T> {
    fn default() -> Self {
        Fib {
            v4: Family { by_len: Vec::new() },
            v6: Family { by_len: Vec::new() },
        }
    }
}

fn mask4(a: u32, len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        a & (u32::MAX << (32 - u32::from(len)))
    }
}

fn mask6(a: u128, len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        a & (u128::MAX << (128 - u32::from(len)))
    }
}

impl<T> Fib<T> {
    /// An empty table.
    pub fn new() -> Fib<T> {
        Fib::default()
    }

    /// Adds a route; returns the value it replaced for the same prefix.
    pub fn insert(&mut self, prefix: IpNet, value: T) -> Option<T> {
        let len = prefix.prefix_len();
        match prefix {
            IpNet::V4(n) => self.v4.insert(len, mask4(u32::from(n.addr()), len), value),
            IpNet::V6(n) => self.v6.insert(len, mask6(u128::from(n.addr()), len), value),
        }
    }

    /// The value stored for exactly this prefix, if any.
    pub fn get_exact(&self, prefix: IpNet) -> Option<&T> {
        let len = prefix.prefix_len();
        match prefix {
            IpNet::V4(n) => {
                let a = mask4(u32::from(n.addr()), len);
                self.v4
                    .by_len
                    .iter()
                    .find(|(l, _)| *l == len)
                    .and_then(|(_, m)| m.get(&a))
            }
            IpNet::V6(n) => {
                let a = mask6(u128::from(n.addr()), len);
                self.v6
                    .by_len
                    .iter()
                    .find(|(l, _)| *l == len)
                    .and_then(|(_, m)| m.get(&a))
            }
        }
    }

    /// The value of the longest prefix containing `addr`.
    #[inline]
    pub fn lookup(&self, addr: IpAddr) -> Option<&T> {
        self.longest_match(addr).map(|(_, v)| v)
    }

    /// The length of the longest prefix containing `addr`, if any.
    pub fn longest_match_len(&self, addr: IpAddr) -> Option<u8> {
        self.longest_match(addr).map(|(len, _)| len)
    }

    /// The longest prefix containing `addr`: its length and value. One probe per
    /// distinct length in use, longest first.
    #[inline]
    fn longest_match(&self, addr: IpAddr) -> Option<(u8, &T)> {
        match addr {
            IpAddr::V4(a) => {
                let a = u32::from(a);
                self.v4
                    .by_len
                    .iter()
                    .find_map(|(len, m)| m.get(&mask4(a, *len)).map(|v| (*len, v)))
            }
            IpAddr::V6(a) => {
                let a = u128::from(a);
                self.v6
                    .by_len
                    .iter()
                    .find_map(|(len, m)| m.get(&mask6(a, *len)).map(|v| (*len, v)))
            }
        }
    }

    /// Number of routes.
    pub fn len(&self) -> usize {
        self.v4.by_len.iter().map(|(_, m)| m.len()).sum::<usize>()
            + self.v6.by_len.iter().map(|(_, m)| m.len()).sum::<usize>()
    }

    /// True when the table has no routes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The IPv4 link-local broadcast address, never forwarded.
const LINK_LOCAL_BROADCAST: Ipv4Addr = Ipv4Addr::new(169, 254, 255, 255);

impl<T> Fib<T> {
    /// False for what a router never forwards: link-local and multicast destinations,
    /// link-local and unspecified sources, IPv4 broadcast; and the martians Linux drops
    /// (RFC 1812 section 5.3.7, RFC 4291): loopback addresses either way, multicast and
    /// broadcast sources, 0/8 destinations, IPv4 class E (240/4) either way, the IPv6
    /// unspecified destination. An IPv4 link-local address that the table routes
    /// explicitly ([`Fib::routes_link_local`]) is forwarded either way, unless it is
    /// `gateway` (the pods' link-local gateway).
    #[inline]
    pub fn forwardable(&self, src: IpAddr, dst: IpAddr, gateway: IpAddr) -> bool {
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let class_e = |a: Ipv4Addr| a.octets()[0] >= 240;
                let link_local = |a: Ipv4Addr| {
                    a.is_link_local() && !(IpAddr::V4(a) != gateway && self.routes_link_local(a))
                };
                !(link_local(s)
                    || s.is_unspecified()
                    || s.is_loopback()
                    || s.is_multicast()
                    || class_e(s)
                    || link_local(d)
                    || d.is_multicast()
                    || d.is_loopback()
                    || d.octets()[0] == 0
                    || class_e(d))
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let link_local = |a: Ipv6Addr| a.segments()[0] & 0xffc0 == 0xfe80;
                !(link_local(s)
                    || s.is_unspecified()
                    || s.is_loopback()
                    || s.is_multicast()
                    || link_local(d)
                    || d.is_multicast()
                    || d.is_loopback()
                    || d.is_unspecified())
            }
            _ => false,
        }
    }

    /// True for an IPv4 link-local address (169.254/16) that a route names explicitly:
    /// its longest match is a prefix of 16 bits or more, one within 169.254/16 (a
    /// cloud's metadata service through the uplink's gateway, a node-local DNS cache
    /// through the host port). The default route and other short prefixes never carry
    /// link-local traffic (RFC 3927 section 7); the link-local broadcast address is
    /// never forwarded.
    pub fn routes_link_local(&self, a: Ipv4Addr) -> bool {
        a != LINK_LOCAL_BROADCAST
            && self
                .longest_match_len(IpAddr::V4(a))
                .is_some_and(|len| len >= 16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn test_longest_prefix_wins() {
        let mut f = Fib::new();
        f.insert("0.0.0.0/0".parse().unwrap(), "default");
        f.insert("10.244.0.0/16".parse().unwrap(), "cluster");
        f.insert("10.244.1.0/24".parse().unwrap(), "node1");
        f.insert("10.244.1.5/32".parse().unwrap(), "pod");
        f.insert("fd00::/8".parse().unwrap(), "v6");
        assert_eq!(f.lookup(ip("10.244.1.5")), Some(&"pod"));
        assert_eq!(f.lookup(ip("10.244.1.6")), Some(&"node1"));
        assert_eq!(f.lookup(ip("10.244.2.1")), Some(&"cluster"));
        assert_eq!(f.lookup(ip("192.0.2.1")), Some(&"default"));
        assert_eq!(f.lookup(ip("fd12::1")), Some(&"v6"));
        assert_eq!(f.lookup(ip("2001:db8::1")), None);
        assert_eq!(f.longest_match_len(ip("10.244.1.5")), Some(32));
        assert_eq!(f.longest_match_len(ip("10.244.2.1")), Some(16));
        assert_eq!(f.longest_match_len(ip("192.0.2.1")), Some(0));
        assert_eq!(f.longest_match_len(ip("2001:db8::1")), None);
        assert_eq!(f.len(), 5);
        assert_eq!(
            f.get_exact("10.244.1.0/24".parse().unwrap()),
            Some(&"node1")
        );
        assert_eq!(f.get_exact("10.244.1.0/25".parse().unwrap()), None);
    }

    #[test]
    fn test_host_bits_in_prefix_are_ignored() {
        let mut f = Fib::new();
        f.insert("10.1.2.3/8".parse().unwrap(), 1);
        assert_eq!(f.lookup(ip("10.200.0.1")), Some(&1));
        assert_eq!(f.insert("10.0.0.0/8".parse().unwrap(), 2), Some(1));
    }
}
