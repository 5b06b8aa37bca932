//! Neighbours: the ARP/ND wire formats and the neighbour table of the ports that resolve
//! next hops (uplink and host).
//!
//! The table maps (port, IP) to a MAC with a state and an age, like Linux's neighbour
//! cache reduced to what a router needs: INCOMPLETE (a probe went out, no answer yet),
//! REACHABLE (confirmed within [`Config::reachable_ns`]), STALE (a MAC not confirmed:
//! learned from a request, or confirmed long ago), and, as Linux has them, DELAY and
//! PROBE: a packet sent to a STALE neighbour makes it DELAY; one sent
//! [`Config::delay_ns`] later makes it PROBE, asked with [`Config::unicast_probes`]
//! probes to its MAC, [`Config::probe_interval_ns`] apart, while packets still go to that
//! MAC. A neighbour that answers none has failed: the next packet finds it INCOMPLETE
//! again, and asks everyone. The states move when packets look the entries up, not on
//! timers: an entry no packet uses needs no probe.
//!
//! It is bounded, and what is in use stays: entries are created by packets to send (with
//! a probe) and by requests addressed to the node, the latter only while there is room.
//! When a packet needs an entry and the table is full, an entry neither used nor updated
//! for [`Config::evict_after_ns`] goes (INCOMPLETE ones first, then the least recently
//! active); if there is none, the packet is refused (`neigh_table_full`), as Linux refuses
//! a new neighbour when its forced garbage collection finds nothing to remove ("neighbour
//! table overflow"). So neither a flood of requests from made-up senders nor a scan evicts
//! the gateway, or an entry that packets wait for. Probes are limited for the whole
//! table ([`Config::probes_per_second`]). Time is passed in.
//!
//! Packets for a neighbour that has no MAC yet wait in a [`Queue`] until it answers.

pub mod arp;
pub mod nd;
pub mod queue;
pub(crate) mod saved;

pub use queue::Queue;

use std::collections::HashMap;
use std::net::IpAddr;

use crate::drop::DropReason;
use crate::icmp::RateLimiter;
use crate::packet::PortId;
use crate::tables::Port;

/// The address of `port` to ask for `target` from: one in an on-link subnet of the port
/// that holds `target`, so that the neighbour can answer it, else the port's first of
/// the family (Linux's `inet_select_addr`).
pub fn probe_source(port: &Port, target: IpAddr) -> Option<IpAddr> {
    port.addresses
        .iter()
        .copied()
        .find(|a| {
            port.subnets
                .iter()
                .any(|n| n.contains(a) && n.contains(&target))
        })
        .or_else(|| port.own_addr(target.is_ipv6()))
}

/// State of a neighbour entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Probed, not answered yet: no MAC.
    Incomplete,
    /// Confirmed recently.
    Reachable,
    /// Not confirmed (learned from a request, or confirmed long ago): used; the next
    /// packet makes it DELAY.
    Stale,
    /// Used while STALE: packets go to its MAC; it is probed if not confirmed within
    /// [`Config::delay_ns`].
    Delay,
    /// Being probed at its MAC, which packets still use; INCOMPLETE again when it
    /// answers none of the probes.
    Probe,
}

impl State {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            State::Incomplete => "incomplete",
            State::Reachable => "reachable",
            State::Stale => "stale",
            State::Delay => "delay",
            State::Probe => "probe",
        }
    }
}

/// One neighbour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neighbour {
    /// Its MAC (zero while incomplete).
    pub mac: [u8; 6],
    /// Its state.
    pub state: State,
    /// When the entry was created, last changed state or MAC, or was last confirmed
    /// (Linux's `updated`).
    pub updated_ns: u64,
    /// When a packet to send last looked it up (Linux's `used`).
    pub used_ns: u64,
    /// When the last probe for it went out.
    pub probed_ns: Option<u64>,
    /// Probes to its MAC sent in PROBE.
    pub probes: u8,
}

impl Neighbour {
    /// When it was last used or updated: an entry active recently is not evicted.
    fn active_ns(&self) -> u64 {
        self.updated_ns.max(self.used_ns)
    }

    /// Moves it to `state` at `now_ns`, with no probe sent in that state yet.
    fn set(&mut self, state: State, now_ns: u64) {
        self.state = state;
        self.updated_ns = now_ns;
        self.probes = 0;
    }

    /// A REACHABLE entry not confirmed for `reachable_ns` is STALE at `now_ns`.
    fn age(&mut self, now_ns: u64, reachable_ns: u64) {
        if self.state == State::Reachable && now_ns.saturating_sub(self.updated_ns) >= reachable_ns
        {
            self.state = State::Stale;
        }
    }
}

/// Limits and timers, with Linux's defaults where it has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Most entries (Linux's `gc_thresh3` is 1024).
    pub max_entries: usize,
    /// An entry neither used nor updated for this long may be evicted to make room
    /// (Linux's forced garbage collection spares entries updated in the last 5 s). At
    /// least [`Config::unresolved_ns`]: packets wait for an entry no longer than that,
    /// and each used it when it was queued, so an entry that packets wait for stays.
    pub evict_after_ns: u64,
    /// A confirmation is trusted this long (Linux's `base_reachable_time`, 30 s).
    pub reachable_ns: u64,
    /// At most one probe per target this often (Linux's `retrans_time`, 1 s).
    pub probe_interval_ns: u64,
    /// A STALE entry that packets use is probed this long after the first of them, if
    /// nothing confirmed it meanwhile (Linux's `delay_first_probe_time`, 5 s).
    pub delay_ns: u64,
    /// Probes to the cached MAC before a neighbour in PROBE has failed (Linux's
    /// `ucast_solicit`, 3).
    pub unicast_probes: u8,
    /// Packets wait for their neighbour's MAC this long at most (Linux declares a
    /// neighbour FAILED after `mcast_solicit` = 3 unanswered probes `retrans_time` apart,
    /// 3 s, and drops what waited for it).
    pub unresolved_ns: u64,
    /// Probes (ARP requests, neighbour solicitations) per second for the whole table, so
    /// that traffic to many addresses (a scan of an on-link /64) does not make a probe of
    /// each packet. Linux has no such limit: it keeps its probes in check with a timer
    /// per neighbour, which ferry has not.
    pub probes_per_second: u32,
    /// Probes at once, at most, when the budget was not used for a while.
    pub probe_burst: u32,
    /// Packets waiting per neighbour (Linux's `unres_qlen`, 3).
    pub queue_per_neighbour: usize,
    /// Packets waiting for all neighbours together.
    pub queue_max_packets: usize,
    /// Bytes of the packets waiting for all neighbours together (IP length and link
    /// headers; a GSO packet counts whole).
    pub queue_max_bytes: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_entries: 1024,
            evict_after_ns: 5_000_000_000,
            reachable_ns: 30_000_000_000,
            probe_interval_ns: 1_000_000_000,
            delay_ns: 5_000_000_000,
            unicast_probes: 3,
            unresolved_ns: 3_000_000_000,
            probes_per_second: 100,
            probe_burst: 20,
            queue_per_neighbour: 3,
            queue_max_packets: 256,
            queue_max_bytes: 4 << 20,
        }
    }
}

/// What [`Neighbours::resolve`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolution {
    /// The MAC to send to, when known.
    pub mac: Option<[u8; 6]>,
    /// Send a probe (ARP request / neighbour solicitation) now.
    pub probe: Option<Probe>,
}

/// Where a probe goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// To everyone: an ARP broadcast, a solicitation to the target's solicited-node
    /// group.
    Broadcast,
    /// To the neighbour's cached MAC (and, for ND, its address): is it still there?
    Unicast([u8; 6]),
}

/// What a received ARP or ND message says of its neighbour, for [`Neighbours::learn`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Update {
    /// REACHABLE for an answer to the node's probe (an ARP reply to the node's MAC, a
    /// solicited advertisement); STALE for anything else, which says where the neighbour
    /// is, not that it answers (a request, a broadcast or gratuitous ARP reply, an
    /// unsolicited advertisement).
    pub state: State,
    /// The MAC given may replace another: any ARP, a solicitation, an advertisement
    /// with the override flag.
    pub override_mac: bool,
    /// A missing entry is created (when the table has room): the message was addressed
    /// to the node, or packets wait for the neighbour.
    pub create: bool,
}

/// Neighbour table counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Entries created or confirmed from received ARP/ND.
    pub learned: u64,
    /// Probes asked for.
    pub probes: u64,
    /// Probes not sent for want of budget ([`Config::probes_per_second`]); for a next hop
    /// without an entry, the packet is refused (`neigh_probe_limited`).
    pub probes_limited: u64,
    /// Entries evicted to make room.
    pub evicted: u64,
    /// New entries refused because the table was full of entries in use (for a packet:
    /// `neigh_table_full`; for a request: not learned from).
    pub refused: u64,
}

/// The neighbour table.
#[derive(Clone, Debug)]
pub struct Neighbours {
    config: Config,
    map: HashMap<(PortId, IpAddr), Neighbour, ahash::RandomState>,
    /// A full table found no entry to evict: none can be before this time (entries only
    /// grow more active), so none is looked for.
    no_victim_until_ns: u64,
    /// The budget of probes.
    probe_limit: RateLimiter,
    stats: Stats,
}

impl Neighbours {
    /// An empty table.
    pub fn new(config: Config) -> Neighbours {
        Neighbours {
            config,
            map: HashMap::default(),
            no_victim_until_ns: 0,
            probe_limit: RateLimiter::new(config.probes_per_second, config.probe_burst),
            stats: Stats::default(),
        }
    }

    /// The MAC of `ip` on `port` for a packet about to be sent at `now_ns`, and whether
    /// to probe. An unknown neighbour gets an INCOMPLETE entry and a probe; or, when the
    /// table is full of entries in use, `neigh_table_full`; or, when the probe budget is
    /// spent, `neigh_probe_limited`.
    pub fn resolve(
        &mut self,
        port: PortId,
        ip: IpAddr,
        now_ns: u64,
    ) -> Result<Resolution, DropReason> {
        let cfg = self.config;
        let r = match self.map.get_mut(&(port, ip)) {
            Some(n) => {
                n.used_ns = now_ns;
                n.age(now_ns, cfg.reachable_ns);
                let due = n
                    .probed_ns
                    .is_none_or(|t| now_ns.saturating_sub(t) >= cfg.probe_interval_ns);
                let mut want = None;
                match n.state {
                    State::Reachable => {}
                    State::Stale => n.set(State::Delay, now_ns),
                    State::Delay if now_ns.saturating_sub(n.updated_ns) < cfg.delay_ns => {}
                    State::Delay => {
                        n.set(State::Probe, now_ns);
                        want = Some(Probe::Unicast(n.mac));
                    }
                    State::Probe if !due => {}
                    State::Probe if n.probes < cfg.unicast_probes => {
                        want = Some(Probe::Unicast(n.mac));
                    }
                    State::Probe => {
                        // It answered none: failed, and asked for anew.
                        n.mac = [0; 6];
                        n.set(State::Incomplete, now_ns);
                        want = Some(Probe::Broadcast);
                    }
                    State::Incomplete if due => want = Some(Probe::Broadcast),
                    State::Incomplete => {}
                }
                let mut probe = want;
                if probe.is_some() && !self.probe_limit.allow(now_ns) {
                    // Asked again by the next packet once there is budget.
                    self.stats.probes_limited += 1;
                    probe = None;
                }
                if let Some(p) = probe {
                    n.probed_ns = Some(now_ns);
                    if let Probe::Unicast(_) = p {
                        n.probes += 1;
                    }
                }
                let mac = (n.state != State::Incomplete).then_some(n.mac);
                Resolution { mac, probe }
            }
            None => {
                let full = self.map.len() >= cfg.max_entries.max(1);
                if full && now_ns < self.no_victim_until_ns {
                    self.stats.refused += 1;
                    return Err(DropReason::NeighTableFull);
                }
                // No entry without a probe: one would only hold packets that nothing asks
                // for, and a scan would fill the table.
                if !self.probe_limit.allow(now_ns) {
                    self.stats.probes_limited += 1;
                    return Err(DropReason::NeighProbeLimited);
                }
                if !self.make_room(now_ns) {
                    self.stats.refused += 1;
                    return Err(DropReason::NeighTableFull);
                }
                self.map.insert(
                    (port, ip),
                    Neighbour {
                        mac: [0; 6],
                        state: State::Incomplete,
                        updated_ns: now_ns,
                        used_ns: now_ns,
                        probed_ns: Some(now_ns),
                        probes: 0,
                    },
                );
                Resolution {
                    mac: None,
                    probe: Some(Probe::Broadcast),
                }
            }
        };
        if r.probe.is_some() {
            self.stats.probes += 1;
        }
        Ok(r)
    }

    /// Records what an ARP or ND message says of `ip` on `port`: that it is at `mac`
    /// (None: an advertisement without the option, which only confirms a MAC known
    /// already), in the state and with the authority `update` gives. As Linux's
    /// `neigh_update` does (RFC 4861 section 7.2.5):
    ///
    /// - an entry without a MAC takes the one given, in `update.state`;
    /// - the MAC it has already: REACHABLE confirms it; STALE leaves the entry as it is;
    /// - another MAC replaces it with `update.override_mac`; without, a REACHABLE entry
    ///   goes STALE and keeps its MAC, any other is left as it is.
    ///
    /// A missing entry is created only when `update.create` and the table has room:
    /// nothing is evicted for a message.
    pub fn learn(
        &mut self,
        port: PortId,
        ip: IpAddr,
        mac: Option<[u8; 6]>,
        now_ns: u64,
        update: Update,
    ) {
        let room = self.map.len() < self.config.max_entries.max(1);
        let Some(n) = self.map.get_mut(&(port, ip)) else {
            let Some(mac) = mac else {
                return;
            };
            if !update.create {
                return;
            }
            if !room {
                self.stats.refused += 1;
                return;
            }
            let n = Neighbour {
                mac,
                state: update.state,
                updated_ns: now_ns,
                used_ns: 0,
                probed_ns: None,
                probes: 0,
            };
            self.map.insert((port, ip), n);
            self.stats.learned += 1;
            return;
        };
        n.age(now_ns, self.config.reachable_ns);
        let (mac, state) = if n.state == State::Incomplete {
            match mac {
                Some(m) => (m, update.state),
                None => return,
            }
        } else {
            match mac.filter(|m| *m != n.mac) {
                Some(m) if update.override_mac => (m, update.state),
                Some(_) if n.state == State::Reachable => (n.mac, State::Stale),
                Some(_) => return,
                None if update.state == State::Reachable => (n.mac, State::Reachable),
                None => return,
            }
        };
        n.mac = mac;
        n.set(state, now_ns);
        n.probed_ns = None;
        self.stats.learned += 1;
    }

    /// Makes room for one more entry at `now_ns`, evicting one if the table is full;
    /// false when every entry is in use.
    fn make_room(&mut self, now_ns: u64) -> bool {
        if self.map.len() < self.config.max_entries.max(1) {
            return true;
        }
        if now_ns < self.no_victim_until_ns {
            return false;
        }
        let age = self.config.evict_after_ns.max(self.config.unresolved_ns);
        // A scan, but only when full, over a table bounded to a small size, and not again
        // before an entry can have become evictable.
        let victim = self
            .map
            .iter()
            .filter(|(_, n)| now_ns.saturating_sub(n.active_ns()) >= age)
            .min_by_key(|(_, n)| (n.state != State::Incomplete, n.active_ns()))
            .map(|(k, _)| *k);
        match victim {
            Some(k) => {
                self.map.remove(&k);
                self.stats.evicted += 1;
                true
            }
            None => {
                let first = self.map.values().map(Neighbour::active_ns).min();
                self.no_victim_until_ns = first.map_or(0, |t| t.saturating_add(age));
                false
            }
        }
    }

    /// Keeps only the entries of ports for which `keep` is true (the others are for a
    /// port that is gone or now has another `PortId`); returns how many were removed.
    pub fn retain_ports(&mut self, mut keep: impl FnMut(PortId) -> bool) -> usize {
        let before = self.map.len();
        self.map.retain(|(port, _), _| keep(*port));
        before - self.map.len()
    }

    /// Puts a handed-over neighbour in (`handover`); false when the table is full.
    pub(crate) fn adopt(&mut self, port: PortId, ip: IpAddr, n: Neighbour) -> bool {
        if self.map.len() >= self.config.max_entries.max(1) && !self.map.contains_key(&(port, ip)) {
            return false;
        }
        self.map.insert((port, ip), n);
        true
    }

    /// The entry for `ip` on `port`.
    pub fn get(&self, port: PortId, ip: IpAddr) -> Option<&Neighbour> {
        self.map.get(&(port, ip))
    }

    /// Every entry.
    pub fn iter(&self) -> impl Iterator<Item = (PortId, IpAddr, &Neighbour)> {
        self.map.iter().map(|((p, a), n)| (*p, *a, n))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Limits and timers.
    pub fn config(&self) -> &Config {
        &self.config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// An answer to the node's probe: an ARP reply, a solicited advertisement that
    /// overrides.
    const ANSWER: Update = Update {
        state: State::Reachable,
        override_mac: true,
        create: false,
    };
    /// A request addressed to the node.
    const REQUEST: Update = Update {
        state: State::Stale,
        override_mac: true,
        create: true,
    };

    #[test]
    fn test_unknown_neighbour_is_probed_once_per_interval() {
        let mut t = Neighbours::new(Config::default());
        let a = ip("192.168.50.1");
        assert_eq!(
            t.resolve(0, a, 0),
            Ok(Resolution {
                mac: None,
                probe: Some(Probe::Broadcast)
            })
        );
        assert_eq!(
            t.resolve(0, a, SEC / 2).unwrap().probe,
            None,
            "rate limited"
        );
        assert!(t.resolve(0, a, SEC).unwrap().probe.is_some());
        assert_eq!(t.get(0, a).unwrap().state, State::Incomplete);
    }

    #[test]
    fn test_a_neighbour_not_confirmed_is_probed_at_its_mac_and_fails_when_it_does_not_answer() {
        let mut t = Neighbours::new(Config::default());
        let a = ip("fd00::1");
        let m = [2; 6];
        t.learn(0, a, Some(m), 0, ANSWER);
        assert!(t.is_empty(), "unsolicited messages create nothing");
        let create = Update {
            create: true,
            ..ANSWER
        };
        t.learn(0, a, Some(m), 0, create);
        let r = |mac, probe| Ok(Resolution { mac, probe });
        let state = |t: &Neighbours| t.get(0, a).unwrap().state;
        assert_eq!(t.resolve(0, a, SEC), r(Some(m), None));
        // 30 s on, no longer confirmed: used as it is, and probed only 5 s later.
        assert_eq!(t.resolve(0, a, 31 * SEC), r(Some(m), None));
        assert_eq!(state(&t), State::Delay);
        assert_eq!(t.resolve(0, a, 35 * SEC), r(Some(m), None));
        let unicast = Some(Probe::Unicast(m));
        assert_eq!(t.resolve(0, a, 36 * SEC), r(Some(m), unicast));
        assert_eq!(state(&t), State::Probe);
        assert_eq!(t.resolve(0, a, 36 * SEC + 1), r(Some(m), None));
        assert_eq!(t.resolve(0, a, 37 * SEC), r(Some(m), unicast));
        assert_eq!(t.resolve(0, a, 38 * SEC), r(Some(m), unicast));
        // Three unanswered: failed, and everyone is asked.
        assert_eq!(t.resolve(0, a, 39 * SEC), r(None, Some(Probe::Broadcast)));
        assert_eq!(state(&t), State::Incomplete);

        // An answer while in PROBE confirms it.
        t.learn(0, a, Some(m), 40 * SEC, ANSWER);
        t.resolve(0, a, 70 * SEC).unwrap();
        assert_eq!(t.resolve(0, a, 75 * SEC), r(Some(m), unicast));
        t.learn(0, a, Some(m), 75 * SEC, REQUEST);
        assert_eq!(state(&t), State::Probe, "a request confirms nothing");
        t.learn(0, a, Some(m), 75 * SEC, ANSWER);
        assert_eq!(state(&t), State::Reachable);
        assert_eq!(t.resolve(0, a, 76 * SEC), r(Some(m), None));
    }

    #[test]
    fn test_a_request_teaches_a_stale_entry_and_does_not_undo_a_confirmation() {
        let mut t = Neighbours::new(Config::default());
        let a = ip("10.0.0.1");
        t.learn(0, a, Some([1; 6]), 0, REQUEST);
        let n = *t.get(0, a).unwrap();
        assert_eq!((n.mac, n.state), ([1; 6], State::Stale));
        t.learn(0, a, Some([1; 6]), SEC, ANSWER);
        t.learn(0, a, Some([1; 6]), 2 * SEC, REQUEST);
        let n = *t.get(0, a).unwrap();
        assert_eq!(
            (n.state, n.updated_ns),
            (State::Reachable, SEC),
            "the same MAC again says nothing new"
        );
        t.learn(0, a, Some([2; 6]), 3 * SEC, REQUEST);
        let n = *t.get(0, a).unwrap();
        assert_eq!((n.mac, n.state), ([2; 6], State::Stale));
    }

    #[test]
    fn test_probes_have_a_budget_for_the_whole_table() {
        let mut t = Neighbours::new(Config::default());
        let addr = |i: u16| IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 1, i));
        for i in 0..20 {
            assert!(t.resolve(0, addr(i), 0).unwrap().probe.is_some());
        }
        assert_eq!(
            t.resolve(0, addr(20), 0),
            Err(DropReason::NeighProbeLimited)
        );
        assert!(t.get(0, addr(20)).is_none(), "no entry without a probe");
        assert_eq!(t.len(), 20);
        assert!(
            t.resolve(0, addr(20), SEC / 100).unwrap().probe.is_some(),
            "100 a second"
        );

        // An entry due for another probe is asked again once there is budget.
        let mut t = Neighbours::new(Config {
            probe_burst: 2,
            ..Config::default()
        });
        assert!(t.resolve(0, addr(0), 0).unwrap().probe.is_some());
        assert!(t.resolve(0, addr(1), SEC).unwrap().probe.is_some());
        assert!(t.resolve(0, addr(2), SEC).unwrap().probe.is_some());
        assert_eq!(
            t.resolve(0, addr(0), SEC),
            Ok(Resolution {
                mac: None,
                probe: None
            })
        );
        assert!(
            t.resolve(0, addr(0), SEC + SEC / 100)
                .unwrap()
                .probe
                .is_some()
        );
        let s = t.stats();
        assert_eq!((s.probes, s.probes_limited), (4, 1));
    }

    #[test]
    fn test_an_advertisement_changes_a_mac_only_when_it_overrides() {
        let mut t = Neighbours::new(Config::default());
        let a = ip("fd00::1");
        let (gw, other) = ([1; 6], [2; 6]);
        t.resolve(0, a, 0).unwrap();
        let unsolicited = Update {
            state: State::Stale,
            override_mac: false,
            create: false,
        };
        let solicited = Update {
            state: State::Reachable,
            ..unsolicited
        };
        let state = |t: &Neighbours| {
            let n = t.get(0, a).unwrap();
            (n.mac, n.state)
        };
        // No MAC in it: nothing to complete an entry with.
        t.learn(0, a, None, 1, ANSWER);
        assert_eq!(state(&t), ([0; 6], State::Incomplete));
        t.learn(0, a, Some(gw), 2, solicited);
        assert_eq!(state(&t), (gw, State::Reachable));
        // Another MAC without the override flag: kept, but no longer trusted.
        t.learn(0, a, Some(other), 3, unsolicited);
        assert_eq!(state(&t), (gw, State::Stale));
        t.learn(0, a, Some(other), 4, solicited);
        assert_eq!(state(&t), (gw, State::Stale), "ignored when not REACHABLE");
        // Solicited without the option: confirms the MAC known.
        t.learn(0, a, None, 5, solicited);
        assert_eq!(state(&t), (gw, State::Reachable));
        // Unsolicited, overriding: the new MAC, not confirmed.
        let moved = Update {
            override_mac: true,
            ..unsolicited
        };
        t.learn(0, a, Some(other), 6, moved);
        assert_eq!(state(&t), (other, State::Stale));
        t.learn(0, a, None, 7, unsolicited);
        assert_eq!(state(&t), (other, State::Stale));
        assert!(t.get(0, ip("fd00::2")).is_none());
        t.learn(0, ip("fd00::2"), None, 8, REQUEST);
        assert!(
            t.get(0, ip("fd00::2")).is_none(),
            "nothing to create it with"
        );
    }

    #[test]
    fn test_retain_ports_removes_only_the_other_ports_entries() {
        let mut t = Neighbours::new(Config::default());
        t.learn(0, ip("10.0.0.1"), Some([1; 6]), 0, REQUEST);
        t.learn(1, ip("10.0.0.1"), Some([2; 6]), 0, REQUEST);
        t.resolve(2, ip("10.0.0.2"), 0).unwrap();
        assert_eq!(t.retain_ports(|p| p != 1), 1);
        assert_eq!(t.len(), 2);
        assert!(t.get(1, ip("10.0.0.1")).is_none());
        assert_eq!(t.get(0, ip("10.0.0.1")).unwrap().mac, [1; 6]);
        assert!(t.get(2, ip("10.0.0.2")).is_some());
    }

    #[test]
    fn test_full_table_evicts_only_what_is_idle_incomplete_first() {
        let mut t = Neighbours::new(Config {
            max_entries: 2,
            ..Config::default()
        });
        let (a, b, c, d) = (
            ip("10.0.0.1"),
            ip("10.0.0.2"),
            ip("10.0.0.3"),
            ip("10.0.0.4"),
        );
        t.learn(0, a, Some([1; 6]), 0, REQUEST);
        t.resolve(0, b, 5).unwrap();
        assert_eq!(
            t.resolve(0, c, 6),
            Err(DropReason::NeighTableFull),
            "both in use"
        );
        assert_eq!(t.stats().refused, 1);
        // Requests teach nothing to a full table.
        t.learn(0, d, Some([4; 6]), 7, REQUEST);
        assert!(t.get(0, d).is_none());
        // `a` is used: it stays, and the idle INCOMPLETE `b` goes.
        t.resolve(0, a, 4 * SEC).unwrap();
        assert_eq!(
            t.resolve(0, c, 5 * SEC + 5),
            Ok(Resolution {
                mac: None,
                probe: Some(Probe::Broadcast)
            })
        );
        assert!(t.get(0, a).is_some());
        assert!(t.get(0, b).is_none());
        assert_eq!(t.stats().evicted, 1);
        // Nothing idle again until `a` is: refused without a look before then.
        assert_eq!(t.resolve(0, d, 6 * SEC), Err(DropReason::NeighTableFull));
        assert_eq!(t.no_victim_until_ns, 9 * SEC);
        assert!(t.resolve(0, d, 9 * SEC).is_ok());
        assert!(t.get(0, a).is_none());
        assert!(t.get(0, c).is_some());
    }
}
