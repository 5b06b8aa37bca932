//! Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast and Reliable Software
//! Network Load Balancer", NSDI 2016, section 3.4): the endpoint of a new connection is
//! read from a lookup table indexed by a hash of the flow, a table every node fills the
//! same way from the same endpoints and seed.
//!
//! So the choice depends on nothing but the flow, the endpoints and the seed: a node
//! that lost its connection table (an agent that crashed) or another node that gets the
//! flow (a load balancer that moved it) picks the endpoint the first one picked, and a
//! connection picked up mid-stream keeps going to it. When the endpoints change, a flow
//! moves only when its slot changes owner: removing one of N endpoints moves about 1/N
//! of the flows, those it had, and adding one takes about 1/(N+1) to it.
//!
//! The table of a set of N endpoints has M slots, M the smallest prime of [`SIZES`] over
//! 100 N (at most the largest, 262139, so beyond 2621 endpoints M is less than 100 N):
//! each endpoint gets M/N slots give or take one, so
//! shares differ by under 1 % (the paper's measure: M well over 100 N). Each endpoint
//! walks its own permutation of the slots, from `offset` in steps of `skip` (both from a
//! hash of its address and port), and the endpoints take turns claiming the next free
//! slot of theirs, in the order of their addresses and ports, so that the table does not
//! depend on the order the endpoints came in. The price of that balance is a little
//! disruption beyond the minimum: removing an endpoint also moves 2-3 % of the other
//! endpoints' flows (the tests measure it; the paper reports the same).
//!
//! The hash is XXH3 (the `xxhash-rust` crate) with the seed: its output is fixed by its
//! specification, so agents of other versions and on other machines agree, which the
//! standard library's hasher does not promise.

use std::net::IpAddr;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::flow::FlowKey;

/// The table sizes: primes, each about twice the one before.
pub const SIZES: [u32; 11] = [
    251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071, 262139,
];

/// The largest table: that of every set of more than 1310 endpoints.
const MAX_SIZE: u32 = SIZES[SIZES.len() - 1];

/// The table size for `n` endpoints: the smallest of [`SIZES`] over 100 `n`, or the
/// largest.
pub fn size_for(n: usize) -> u32 {
    SIZES
        .iter()
        .copied()
        .find(|&m| m as usize > 100 * n)
        .unwrap_or(MAX_SIZE)
}

/// The default seed: any agent not told otherwise uses it, so nodes agree out of the box.
pub const DEFAULT_SEED: u64 = 0x6665_7272_795f_6d67;

/// A filled lookup table: slot -> index of the endpoint in the set it was made from,
/// a byte per slot for up to 256 endpoints (half the memory a lookup has to find in the
/// cache), else two.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    slots: Slots,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Slots {
    Narrow(Box<[u8]>),
    Wide(Box<[u16]>),
}

impl Table {
    /// Fills the table for `endpoints` (address and port of each; at most 65535, and
    /// none twice) with `seed`. Empty: a table of no slots, that [`Table::pick`] must not
    /// be asked.
    pub fn new(endpoints: &[(IpAddr, u16)], seed: u64) -> Table {
        let n = endpoints.len();
        if n == 0 {
            return Table {
                slots: Slots::Narrow(Box::new([])),
            };
        }
        let m = size_for(n);
        let m64 = u64::from(m);
        // Turns go in the order of the endpoints' addresses and ports.
        let mut order: Vec<u16> = (0..n as u16).collect();
        order.sort_unstable_by_key(|&i| endpoints[usize::from(i)]);
        // Each endpoint's place in its permutation, and its step.
        let mut at: Vec<u32> = Vec::with_capacity(n);
        let mut skip: Vec<u32> = Vec::with_capacity(n);
        for &i in &order {
            let id = endpoint_bytes(endpoints[usize::from(i)]);
            at.push((xxh3_64_with_seed(&id, seed) % m64) as u32);
            skip.push((xxh3_64_with_seed(&id, seed ^ SKIP_SALT) % (m64 - 1) + 1) as u32);
        }
        const FREE: u16 = u16::MAX;
        // u16::MAX is never an index: at most 65535 endpoints, indices below that.
        let mut slots = vec![FREE; m as usize].into_boxed_slice();
        let mut filled = 0u32;
        'fill: loop {
            for (turn, &i) in order.iter().enumerate() {
                let mut c = at[turn];
                while slots[c as usize] != FREE {
                    c = step(c, skip[turn], m);
                }
                slots[c as usize] = i;
                at[turn] = step(c, skip[turn], m);
                filled += 1;
                if filled == m {
                    break 'fill;
                }
            }
        }
        let slots = if n <= 256 {
            Slots::Narrow(slots.iter().map(|&i| i as u8).collect())
        } else {
            Slots::Wide(slots)
        };
        Table { slots }
    }

    /// Slots.
    pub fn len(&self) -> usize {
        match &self.slots {
            Slots::Narrow(s) => s.len(),
            Slots::Wide(s) => s.len(),
        }
    }

    /// True for the table of no endpoints.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slots of a table of at most 256 endpoints, a byte each (the index of the
    /// endpoint a flow hashing to the slot gets), for a copy kept elsewhere; None for a
    /// wider table.
    pub fn narrow_slots(&self) -> Option<&[u8]> {
        match &self.slots {
            Slots::Narrow(s) => Some(s),
            Slots::Wide(_) => None,
        }
    }

    /// The endpoint (an index into the set the table was made from) for the flow
    /// `key`, hashed with `seed`.
    #[inline]
    pub fn pick(&self, key: &FlowKey, seed: u64) -> usize {
        let h = flow_hash(key, seed);
        match &self.slots {
            Slots::Narrow(s) => usize::from(s[(h % s.len() as u64) as usize]),
            Slots::Wide(s) => usize::from(s[(h % s.len() as u64) as usize]),
        }
    }

    /// How many slots each endpoint has, by index.
    #[cfg(test)]
    fn shares(&self, n: usize) -> Vec<usize> {
        let mut c = vec![0; n];
        match &self.slots {
            Slots::Narrow(s) => s.iter().for_each(|&i| c[usize::from(i)] += 1),
            Slots::Wide(s) => s.iter().for_each(|&i| c[usize::from(i)] += 1),
        }
        c
    }
}

/// Salt of the second hash of an endpoint (its skip).
const SKIP_SALT: u64 = 0x9e37_79b9_7f4a_7c15;

/// The next slot of a permutation: `c + skip` modulo `m` (both below `m`).
#[inline]
fn step(c: u32, skip: u32, m: u32) -> u32 {
    let n = c + skip;
    if n >= m { n - m } else { n }
}

/// An endpoint as hashed: its address in 16 bytes (IPv4 mapped) and its port.
pub(super) fn endpoint_bytes((addr, port): (IpAddr, u16)) -> [u8; 18] {
    let mut b = [0u8; 18];
    b[..16].copy_from_slice(&v6_bytes(addr));
    b[16..].copy_from_slice(&port.to_be_bytes());
    b
}

fn v6_bytes(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The hash of a flow: its protocol, addresses and ports (not its zone, which is this
/// node's own), as every node sees them before any NAT.
#[inline]
pub fn flow_hash(key: &FlowKey, seed: u64) -> u64 {
    let mut b = [0u8; 37];
    b[..16].copy_from_slice(key.src.octets());
    b[16..32].copy_from_slice(key.dst.octets());
    b[32..34].copy_from_slice(&key.src_port.to_be_bytes());
    b[34..36].copy_from_slice(&key.dst_port.to_be_bytes());
    b[36] = key.proto;
    xxh3_64_with_seed(&b, seed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::{Addr, proto};
    use std::net::Ipv4Addr;

    fn endpoints(n: u16) -> Vec<(IpAddr, u16)> {
        (0..n)
            .map(|i| {
                let ip = Ipv4Addr::new(10, 244, (i / 250) as u8, (i % 250 + 1) as u8);
                (IpAddr::V4(ip), 8080)
            })
            .collect()
    }

    /// `count` distinct TCP flows to a cluster IP from many clients and ports.
    fn flows(count: u32) -> impl Iterator<Item = FlowKey> {
        (0..count).map(|i| FlowKey {
            src: Addr::from(IpAddr::V4(Ipv4Addr::from(0x0af4_0000 + (i / 50_000)))),
            dst: Addr::from(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10))),
            zone: 0,
            proto: proto::TCP,
            src_port: 10_000 + (i % 50_000) as u16,
            dst_port: 80,
        })
    }

    #[test]
    fn sizes_are_primes_over_a_hundred_per_endpoint() {
        for m in SIZES {
            assert!((2..m).take_while(|d| d * d <= m).all(|d| m % d != 0), "{m}");
        }
        assert_eq!(size_for(1), 251);
        assert_eq!(size_for(2), 251);
        assert_eq!(size_for(3), 509);
        assert_eq!(size_for(100), 16381);
        assert_eq!(size_for(5000), MAX_SIZE);
        for n in [1, 2, 7, 50, 300, 2000] {
            assert!(size_for(n) as usize > 100 * n, "{n}");
        }
    }

    #[test]
    fn every_endpoint_gets_its_share_of_slots_and_of_flows() {
        for n in [2u16, 3, 10, 64] {
            let eps = endpoints(n);
            let t = Table::new(&eps, DEFAULT_SEED);
            let m = t.len();
            let shares = t.shares(eps.len());
            let (lo, hi) = (m / usize::from(n), m.div_ceil(usize::from(n)));
            for (i, &s) in shares.iter().enumerate() {
                // The paper's bound: M/N slots, give or take one per endpoint.
                assert!(s + 1 >= lo && s <= hi + 1, "n {n} endpoint {i}: {s} of {m}");
            }
            let total = 200_000;
            let mut got = vec![0u32; eps.len()];
            for k in flows(total) {
                got[t.pick(&k, DEFAULT_SEED)] += 1;
            }
            let fair = f64::from(total) / f64::from(n);
            for (i, &g) in got.iter().enumerate() {
                let off = (f64::from(g) - fair).abs() / fair;
                assert!(off < 0.05, "n {n} endpoint {i}: {g} flows, {fair} fair");
            }
        }
    }

    #[test]
    fn removing_one_of_n_endpoints_moves_only_its_flows() {
        for n in [2u16, 5, 10, 40] {
            let eps = endpoints(n);
            let before = Table::new(&eps, DEFAULT_SEED);
            let gone = eps[usize::from(n) / 2];
            let rest: Vec<_> = eps.iter().copied().filter(|&e| e != gone).collect();
            let after = Table::new(&rest, DEFAULT_SEED);
            let total = 100_000u32;
            let (mut moved, mut had_gone) = (0u32, 0u32);
            for k in flows(total) {
                let a = eps[before.pick(&k, DEFAULT_SEED)];
                let b = rest[after.pick(&k, DEFAULT_SEED)];
                if a == gone {
                    had_gone += 1;
                } else if a != b {
                    moved += 1;
                }
            }
            // The gone endpoint's flows move, and of the others a few percent (the
            // paper measures as much with M over 100 N): 1/N of all and a few percent.
            let share = f64::from(had_gone) / f64::from(total);
            let fair = 1.0 / f64::from(n);
            assert!((share - fair).abs() < 0.03, "n {n}: {share}");
            let others = f64::from(moved) / f64::from(total - had_gone);
            assert!(others < 0.05, "n {n}: {others} of the other flows moved");
            let all = f64::from(moved + had_gone) / f64::from(total);
            assert!(
                all - fair < 0.04,
                "n {n}: {all} of the flows moved, 1/N is {fair}"
            );
        }
    }

    #[test]
    fn adding_an_endpoint_takes_about_its_share() {
        let eps = endpoints(9);
        let before = Table::new(&eps, DEFAULT_SEED);
        let mut more = eps.clone();
        more.push((IpAddr::V4(Ipv4Addr::new(10, 244, 9, 9)), 8080));
        let after = Table::new(&more, DEFAULT_SEED);
        let total = 100_000u32;
        let moved = flows(total)
            .filter(|k| eps[before.pick(k, DEFAULT_SEED)] != more[after.pick(k, DEFAULT_SEED)])
            .count();
        let f = moved as f64 / f64::from(total);
        assert!(
            (0.07..0.13).contains(&f),
            "{f} of the flows moved, about 1/10 expected"
        );
    }

    #[test]
    fn the_table_depends_on_the_endpoints_and_the_seed_only() {
        let eps = endpoints(7);
        let mut shuffled = eps.clone();
        shuffled.reverse();
        shuffled.swap(1, 4);
        let a = Table::new(&eps, DEFAULT_SEED);
        let b = Table::new(&shuffled, DEFAULT_SEED);
        for k in flows(10_000) {
            assert_eq!(
                eps[a.pick(&k, DEFAULT_SEED)],
                shuffled[b.pick(&k, DEFAULT_SEED)]
            );
        }
        assert_eq!(a, Table::new(&eps, DEFAULT_SEED), "filled again: the same");
        let other = Table::new(&eps, 42);
        let differ = flows(10_000)
            .filter(|k| a.pick(k, DEFAULT_SEED) != other.pick(k, 42))
            .count();
        assert!(differ > 5_000, "another seed, another table: {differ}");
    }

    #[test]
    fn the_hash_is_fixed() {
        // XXH3's output is specified: a change here would make agents of two versions
        // disagree about every flow.
        let k = FlowKey {
            src: Addr::from(IpAddr::V4(Ipv4Addr::new(10, 244, 1, 5))),
            dst: Addr::from(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10))),
            zone: 3,
            proto: proto::TCP,
            src_port: 40000,
            dst_port: 80,
        };
        let h = flow_hash(&k, DEFAULT_SEED);
        assert_eq!(
            h,
            flow_hash(&FlowKey { zone: 0, ..k }, DEFAULT_SEED),
            "the zone is not hashed"
        );
        assert_eq!(h, FIXED_HASH, "{h:#x}");
        let t = Table::new(&endpoints(3), DEFAULT_SEED);
        assert_eq!(t.pick(&k, DEFAULT_SEED), FIXED_PICK);
    }

    // What XXH3 gives for the key above, and the endpoint the table of three picks.
    const FIXED_HASH: u64 = 0x6cb2_4f81_d2cd_1695;
    const FIXED_PICK: usize = 2;
}
