//! Rendezvous (highest random weight) hashing (Thaler and Ravishankar, "Using
//! Name-Based Mappings to Increase Hit Rates", IEEE/ACM ToN 1998): the endpoint of a new
//! connection is the one whose weight for the flow, a hash of the flow's hash and the
//! endpoint's, is highest.
//!
//! It promises what Maglev does (the choice depends on nothing but the flow, the
//! endpoints and the seed, so every node and every restart agree) with the least
//! disruption there can be: removing an endpoint moves only the flows it had, adding one
//! takes only those it now wins, and the others stay put. It needs no table, so the
//! choice reads a hash per endpoint (eight bytes, next to one another) instead of a
//! slot of a table of 100 times as many entries, which the cache does not keep when new
//! connections spread over thousands of Service ports; but it computes a weight per
//! endpoint, so it serves only small sets ([`MAX_ENDPOINTS`]), Maglev the others.
//!
//! Written here because it is a dozen lines over the flow hash that Maglev already
//! uses, and every agent, of any version, must compute it alike: the crates for it hash
//! through `std::hash::Hasher` implementations whose output is not fixed across
//! releases.

use std::net::IpAddr;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::maglev::endpoint_bytes;

/// The largest set chosen from by rendezvous hashing under the `consistent` balance;
/// larger sets use Maglev. At 64 the weights of a choice still cost less than Maglev's
/// slot read when it misses the cache (docs/benchmarks.md: 76 ns against 179 over
/// 10 000 Service ports of 64 endpoints).
pub const MAX_ENDPOINTS: usize = 64;

/// Salt of an endpoint's hash (so that it differs from its Maglev offset).
const SALT: u64 = 0x7265_6e64_657a_766f;

/// The endpoints' hashes, in their own order (lowest first), each with its index in the
/// set they were made from: of two endpoints that tie for a flow, the lower hash wins,
/// whatever the order of the set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Weights {
    hashes: Box<[u64]>,
    index: Box<[u16]>,
}

impl Weights {
    /// The hashes of `endpoints` (address and port of each; at most 65536) with `seed`.
    pub fn new(endpoints: &[(IpAddr, u16)], seed: u64) -> Weights {
        let mut w: Box<[(u64, u16)]> = endpoints
            .iter()
            .enumerate()
            .map(|(i, &e)| (xxh3_64_with_seed(&endpoint_bytes(e), seed ^ SALT), i as u16))
            .collect();
        w.sort_unstable();
        Weights {
            hashes: w.iter().map(|&(h, _)| h).collect(),
            index: w.iter().map(|&(_, i)| i).collect(),
        }
    }

    /// Endpoints.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// True for no endpoints.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// The endpoint (an index into the set) whose weight for the flow hash `h` is the
    /// highest. The set must not be empty.
    #[inline]
    pub fn pick(&self, h: u64) -> usize {
        let mut best = (0u64, 0usize);
        for (j, &e) in self.hashes.iter().enumerate() {
            let w = mix(h ^ e);
            if w > best.0 {
                best = (w, j);
            }
        }
        usize::from(self.index[best.1])
    }
}

/// A weight: the 128-bit product of `x` and an odd constant, its halves folded together
/// (wyhash's mixing step): every bit of `x` moves the high half, so that the weights of
/// one flow for different endpoints are all but independent, in one multiplication.
#[inline]
fn mix(x: u64) -> u64 {
    let m = u128::from(x) * 0x9e37_79b9_7f4a_7c15;
    (m >> 64) as u64 ^ m as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::{Addr, FlowKey, proto};
    use crate::lb::maglev::{DEFAULT_SEED, flow_hash};
    use std::net::Ipv4Addr;

    fn endpoints(n: u16) -> Vec<(IpAddr, u16)> {
        (0..n)
            .map(|i| {
                (
                    IpAddr::V4(Ipv4Addr::new(10, 244, (i / 250) as u8, (i % 250 + 1) as u8)),
                    8080,
                )
            })
            .collect()
    }

    fn hashes(count: u32) -> impl Iterator<Item = u64> {
        (0..count).map(|i| {
            let k = FlowKey {
                src: Addr::from(Ipv4Addr::from(0xc0a8_0000 + (i >> 6))),
                dst: Addr::from(Ipv4Addr::new(10, 96, 0, 10)),
                zone: 0,
                proto: proto::TCP,
                src_port: 1024 + (i & 63) as u16,
                dst_port: 80,
            };
            flow_hash(&k, DEFAULT_SEED)
        })
    }

    fn picks(eps: &[(IpAddr, u16)], count: u32) -> Vec<(IpAddr, u16)> {
        let w = Weights::new(eps, DEFAULT_SEED);
        hashes(count).map(|h| eps[w.pick(h)]).collect()
    }

    #[test]
    fn test_every_endpoint_gets_its_share() {
        for n in [2u16, 3, 10, 64] {
            let eps = endpoints(n);
            let flows = 4000 * u32::from(n);
            let mut got = std::collections::HashMap::new();
            for e in picks(&eps, flows) {
                *got.entry(e).or_insert(0u32) += 1;
            }
            assert_eq!(got.len(), usize::from(n));
            for (e, c) in got {
                // 4000 flows expected each: within 8 % (over 5 standard deviations).
                assert!(c.abs_diff(4000) < 320, "{n} endpoints: {e:?} got {c}");
            }
        }
    }

    #[test]
    fn test_a_removed_endpoint_moves_only_its_flows_and_an_added_one_takes_only_its_own() {
        let eps = endpoints(10);
        let before = picks(&eps, 20_000);
        let mut fewer = eps.clone();
        let gone = fewer.remove(3);
        let after = picks(&fewer, 20_000);
        let mut moved = 0;
        for (b, a) in before.iter().zip(&after) {
            if *b == gone {
                moved += 1;
            } else {
                assert_eq!(a, b, "a flow of a kept endpoint moved");
            }
        }
        // About a tenth of the flows were the removed endpoint's.
        assert!((1700..2300).contains(&moved), "{moved}");
        // Added back: exactly the flows it had come back, no others move.
        assert_eq!(picks(&eps, 20_000), before);
    }

    #[test]
    fn test_the_order_of_the_set_and_the_seed_decide_as_they_should() {
        let eps = endpoints(10);
        let mut reversed = eps.clone();
        reversed.reverse();
        assert_eq!(picks(&eps, 5000), picks(&reversed, 5000));
        let w = Weights::new(&eps, DEFAULT_SEED);
        let other = Weights::new(&eps, DEFAULT_SEED ^ 1);
        let differ = hashes(5000).filter(|&h| w.pick(h) != other.pick(h)).count();
        assert!(differ > 4000, "another seed, another choice: {differ}");
        assert_eq!(Weights::new(&eps[..1], DEFAULT_SEED).pick(7), 0);
    }
}
