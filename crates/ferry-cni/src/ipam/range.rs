//! Address ranges, as host-local derives them from a subnet, and the order it tries
//! their addresses in.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// The addresses of one subnet that may be handed out: from the one after the network
/// address to the last (the one before the broadcast address for IPv4), without the
/// gateway, which host-local takes to be the first after the network address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    subnet: IpNet,
    start: u128,
    end: u128,
    gateway: u128,
}

/// Why a subnet gives no range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TooSmall(pub IpNet);

impl Range {
    /// The range of `subnet` (host bits ignored). Like host-local, refuses subnets with
    /// fewer than four addresses: an IPv4 /31 or /32, an IPv6 /127 or /128.
    pub fn new(subnet: IpNet) -> Result<Range, TooSmall> {
        let subnet = subnet.trunc();
        if subnet.prefix_len() + 2 > subnet.max_prefix_len() {
            return Err(TooSmall(subnet));
        }
        let network = to_u128(subnet.network());
        let last = to_u128(subnet.broadcast());
        let end = match subnet {
            IpNet::V4(_) => last - 1,
            IpNet::V6(_) => last,
        };
        Ok(Range {
            subnet,
            start: network + 1,
            end,
            gateway: network + 1,
        })
    }

    /// The subnet.
    pub fn subnet(&self) -> IpNet {
        self.subnet
    }

    /// `ip` with the subnet's prefix length: how a pod's address is written.
    pub fn address(&self, ip: IpAddr) -> IpNet {
        IpNet::new(ip, self.subnet.prefix_len()).expect("the prefix length is the subnet's")
    }

    /// Whether `ip` is one of the range's addresses (the gateway included).
    pub fn contains(&self, ip: IpAddr) -> bool {
        same_family(self.subnet, ip) && (self.start..=self.end).contains(&to_u128(ip))
    }

    fn ip(&self, n: u128) -> IpAddr {
        match self.subnet {
            IpNet::V4(_) => IpAddr::V4(Ipv4Addr::from(n as u32)),
            IpNet::V6(_) => IpAddr::V6(Ipv6Addr::from(n)),
        }
    }

    /// How many addresses the range spans, the gateway included.
    fn len(&self) -> u128 {
        self.end - self.start + 1
    }
}

/// The ranges of one address family, of which a pod gets one address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeSet {
    ranges: Vec<Range>,
}

impl RangeSet {
    /// The sets of `subnets`: one per address family, in the order the families first
    /// appear, each holding that family's subnets in order.
    pub fn by_family(subnets: &[IpNet]) -> Result<Vec<RangeSet>, TooSmall> {
        let mut sets: Vec<RangeSet> = Vec::new();
        for subnet in subnets {
            let range = Range::new(*subnet)?;
            match sets
                .iter_mut()
                .find(|s| s.ranges[0].subnet.max_prefix_len() == subnet.max_prefix_len())
            {
                Some(set) => set.ranges.push(range),
                None => sets.push(RangeSet {
                    ranges: vec![range],
                }),
            }
        }
        Ok(sets)
    }

    /// Its ranges.
    pub fn ranges(&self) -> &[Range] {
        &self.ranges
    }

    /// The range holding `ip`.
    pub fn range_for(&self, ip: IpAddr) -> Option<&Range> {
        self.ranges.iter().find(|r| r.contains(ip))
    }

    /// The addresses to try, in host-local's order: from the one after `last_reserved`
    /// (the address last handed out from this set) round to `last_reserved` itself, or
    /// from the start of the first range when `last_reserved` is not in the set. Each
    /// address comes once, gateways never.
    pub fn candidates(
        &self,
        last_reserved: Option<IpAddr>,
    ) -> impl Iterator<Item = (IpAddr, &Range)> + '_ {
        let resume = last_reserved.and_then(|ip| {
            let i = self.ranges.iter().position(|r| r.contains(ip))?;
            Some((i, to_u128(ip)))
        });
        let (mut idx, mut cur) = match resume {
            Some((i, n)) => (i, Some(n)),
            None => (0, None),
        };
        let mut left = self
            .ranges
            .iter()
            .fold(0u128, |n, r| n.saturating_add(r.len()));
        std::iter::from_fn(move || {
            while left > 0 {
                left -= 1;
                let range = &self.ranges[idx];
                let n = match cur {
                    None => range.start,
                    Some(n) if n < range.end => n + 1,
                    Some(_) => {
                        idx = (idx + 1) % self.ranges.len();
                        self.ranges[idx].start
                    }
                };
                cur = Some(n);
                let range = &self.ranges[idx];
                if n != range.gateway {
                    return Some((range.ip(n), range));
                }
            }
            None
        })
    }
}

fn same_family(net: IpNet, ip: IpAddr) -> bool {
    matches!(
        (net, ip),
        (IpNet::V4(_), IpAddr::V4(_)) | (IpNet::V6(_), IpAddr::V6(_))
    )
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a).into(),
        IpAddr::V6(a) => a.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn first(set: &RangeSet, last: Option<&str>, n: usize) -> Vec<String> {
        set.candidates(last.map(ip))
            .take(n)
            .map(|(a, _)| a.to_string())
            .collect()
    }

    #[test]
    fn test_ipv4_range_skips_network_gateway_and_broadcast() {
        let sets = RangeSet::by_family(&[net("10.244.1.0/29")]).unwrap();
        let all: Vec<String> = first(&sets[0], None, 100);
        assert_eq!(
            all,
            [
                "10.244.1.2",
                "10.244.1.3",
                "10.244.1.4",
                "10.244.1.5",
                "10.244.1.6"
            ]
        );
    }

    #[test]
    fn test_ipv6_range_skips_network_and_gateway_and_keeps_the_last() {
        let sets = RangeSet::by_family(&[net("fd00:10:244:1::/125")]).unwrap();
        let all = first(&sets[0], None, 100);
        assert_eq!(
            all,
            [
                "fd00:10:244:1::2",
                "fd00:10:244:1::3",
                "fd00:10:244:1::4",
                "fd00:10:244:1::5",
                "fd00:10:244:1::6",
                "fd00:10:244:1::7"
            ]
        );
    }

    #[test]
    fn test_host_bits_are_ignored() {
        let r = Range::new(net("10.244.1.77/24")).unwrap();
        assert_eq!(r.subnet(), net("10.244.1.0/24"));
        assert_eq!(r.address(ip("10.244.1.9")).to_string(), "10.244.1.9/24");
    }

    #[test]
    fn test_subnets_under_four_addresses_are_too_small() {
        for s in ["10.0.0.0/31", "10.0.0.1/32", "fd00::/127", "fd00::/128"] {
            assert_eq!(Range::new(net(s)), Err(TooSmall(net(s).trunc())), "{s}");
        }
        assert!(Range::new(net("10.0.0.0/30")).is_ok());
        assert!(Range::new(net("fd00::/126")).is_ok());
    }

    #[test]
    fn test_candidates_resume_after_the_last_reserved_and_wrap() {
        let sets = RangeSet::by_family(&[net("10.0.0.0/29")]).unwrap();
        assert_eq!(
            first(&sets[0], Some("10.0.0.4"), 100),
            ["10.0.0.5", "10.0.0.6", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
        );
        // The last address: wrap at once.
        assert_eq!(first(&sets[0], Some("10.0.0.6"), 1), ["10.0.0.2"]);
        // Outside the set (the pod CIDR changed): from the start.
        assert_eq!(first(&sets[0], Some("10.9.9.9"), 1), ["10.0.0.2"]);
        assert_eq!(first(&sets[0], Some("fd00::5"), 1), ["10.0.0.2"]);
    }

    #[test]
    fn test_families_make_separate_sets_and_ranges_chain_within_one() {
        let sets =
            RangeSet::by_family(&[net("fd00::/125"), net("10.0.0.0/30"), net("10.0.1.0/30")])
                .unwrap();
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[0].ranges().len(), 1);
        assert_eq!(first(&sets[1], None, 100), ["10.0.0.2", "10.0.1.2"]);
        assert_eq!(
            first(&sets[1], Some("10.0.0.2"), 100),
            ["10.0.1.2", "10.0.0.2"]
        );
        assert!(sets[1].range_for(ip("10.0.1.2")).is_some());
        assert!(sets[1].range_for(ip("10.0.1.3")).is_none());
    }

    #[test]
    fn test_a_large_ipv6_range_yields_lazily() {
        let sets = RangeSet::by_family(&[net("fd00::/64")]).unwrap();
        assert_eq!(
            first(&sets[0], Some("fd00::ffff:ffff:ffff:fffe"), 2),
            ["fd00::ffff:ffff:ffff:ffff", "fd00::2"]
        );
    }
}
