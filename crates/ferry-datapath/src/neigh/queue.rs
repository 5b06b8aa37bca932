//! Packets waiting for a neighbour: Linux's unresolved queue (`unres_qlen`).
//!
//! A packet whose next hop has no MAC yet waits here, keyed like the neighbour table by
//! (port, address), until the neighbour answers ([`Queue::take`]) or the wait is too
//! long ([`Queue::expire`]). Bounded three ways: [`Config::queue_per_neighbour`] packets
//! per neighbour, and [`Config::queue_max_packets`] packets and
//! [`Config::queue_max_bytes`] bytes in all. A packet over its neighbour's limit pushes
//! out that neighbour's oldest; over a limit of the whole queue, it pushes out the oldest
//! packet of the neighbour with the most waiting (the oldest of those, when several have
//! as many), so that many packets for one neighbour, or for many (a scan), take no other
//! neighbour's last packet while one has more. The queue holds any item: the pipeline
//! parks a packet with what it needs to finish it.
//!
//! Every packet also has a ticket in one arrival-ordered list, which expiry and the
//! global limits walk from the front. A packet that leaves otherwise (its neighbour
//! answered, it was pushed out) leaves its ticket behind; such tickets are skipped when
//! met, and the list is compacted when they outnumber the packets, so it never grows
//! beyond a small multiple of the packet limit.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use super::Config;
use crate::packet::PortId;

type Key = (PortId, IpAddr);

/// One waiting packet.
#[derive(Debug)]
struct Waiting<T> {
    seq: u64,
    bytes: usize,
    item: T,
}

/// A waiting packet's place in arrival order.
#[derive(Clone, Copy, Debug)]
struct Ticket {
    seq: u64,
    key: Key,
    queued_ns: u64,
}

/// Packets waiting for their neighbours. See the module documentation.
#[derive(Debug)]
pub struct Queue<T> {
    per_neighbour: usize,
    max_packets: usize,
    max_bytes: usize,
    timeout_ns: u64,
    waiting: HashMap<Key, VecDeque<Waiting<T>>, ahash::RandomState>,
    tickets: VecDeque<Ticket>,
    next_seq: u64,
    packets: usize,
    bytes: usize,
}

impl<T> Queue<T> {
    /// An empty queue with the limits of `config`.
    pub fn new(config: &Config) -> Queue<T> {
        Queue {
            per_neighbour: config.queue_per_neighbour,
            max_packets: config.queue_max_packets,
            max_bytes: config.queue_max_bytes,
            timeout_ns: config.unresolved_ns,
            waiting: HashMap::default(),
            tickets: VecDeque::new(),
            next_seq: 0,
            packets: 0,
            bytes: 0,
        }
    }

    /// Queues `item` (a packet of `bytes`, queued at `now_ns`) for the neighbour `ip` on
    /// `port`. Returns how many older packets were pushed out to make room, or the item
    /// back when it can never fit (a limit of zero, or larger than the byte limit).
    pub fn push(
        &mut self,
        port: PortId,
        ip: IpAddr,
        item: T,
        bytes: usize,
        now_ns: u64,
    ) -> Result<usize, T> {
        if self.per_neighbour == 0 || self.max_packets == 0 || bytes > self.max_bytes {
            return Err(item);
        }
        let key = (port, ip);
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut pushed_out = 0;
        let q = self.waiting.entry(key).or_default();
        if q.len() >= self.per_neighbour {
            let old = q.pop_front().expect("a full queue is not empty");
            self.packets -= 1;
            self.bytes -= old.bytes;
            pushed_out += 1;
        }
        q.push_back(Waiting { seq, bytes, item });
        self.packets += 1;
        self.bytes += bytes;
        self.tickets.push_back(Ticket {
            seq,
            key,
            queued_ns: now_ns,
        });
        // The packet just queued is the newest of its neighbour and fits alone.
        while self.packets > self.max_packets || self.bytes > self.max_bytes {
            if self.pop_from_longest().is_none() {
                break;
            }
            pushed_out += 1;
        }
        if self.tickets.len() > 2 * self.max_packets.max(16) {
            self.compact();
        }
        Ok(pushed_out)
    }

    /// True when packets wait for `ip` on `port`.
    pub fn contains(&self, port: PortId, ip: IpAddr) -> bool {
        !self.waiting.is_empty() && self.waiting.contains_key(&(port, ip))
    }

    /// How many packets wait for `ip` on `port`.
    pub fn waiting_for(&self, port: PortId, ip: IpAddr) -> usize {
        self.waiting.get(&(port, ip)).map_or(0, VecDeque::len)
    }

    /// Removes the packets waiting for `ip` on `port`, oldest first.
    pub fn take(&mut self, port: PortId, ip: IpAddr) -> impl Iterator<Item = T> + use<T> {
        let q = self.waiting.remove(&(port, ip)).unwrap_or_default();
        self.packets -= q.len();
        self.bytes -= q.iter().map(|w| w.bytes).sum::<usize>();
        q.into_iter().map(|w| w.item)
    }

    /// Removes the packets that have waited [`Config::unresolved_ns`] or longer at
    /// `now_ns`, looking at no more than `budget` tickets; returns them, oldest first.
    pub fn expire(&mut self, now_ns: u64, budget: usize) -> Vec<T> {
        let mut expired = Vec::new();
        for _ in 0..budget {
            let Some(t) = self.tickets.front().copied() else {
                break;
            };
            let live = self.is_live(&t);
            if live && now_ns.saturating_sub(t.queued_ns) < self.timeout_ns {
                break;
            }
            self.tickets.pop_front();
            if live {
                expired.extend(self.remove(&t));
            }
        }
        expired
    }

    /// Keeps only the packets for which `keep` (given the neighbour's port and address
    /// and the item, which it may change) is true; returns how many were removed.
    pub fn retain(&mut self, mut keep: impl FnMut(PortId, IpAddr, &mut T) -> bool) -> usize {
        let before = self.packets;
        let (mut packets, mut bytes) = (0, 0);
        self.waiting.retain(|&(port, ip), q| {
            q.retain_mut(|w| keep(port, ip, &mut w.item));
            packets += q.len();
            bytes += q.iter().map(|w| w.bytes).sum::<usize>();
            !q.is_empty()
        });
        self.packets = packets;
        self.bytes = bytes;
        before - packets
    }

    /// Packets waiting.
    pub fn len(&self) -> usize {
        self.packets
    }

    /// True when no packet waits.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.packets == 0
    }

    /// Bytes of the packets waiting.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// True when the ticket's packet still waits.
    fn is_live(&self, t: &Ticket) -> bool {
        self.waiting
            .get(&t.key)
            .is_some_and(|q| q.iter().any(|w| w.seq == t.seq))
    }

    /// Removes the ticket's packet (the oldest of its neighbour: tickets are met in
    /// arrival order) and returns it.
    fn remove(&mut self, t: &Ticket) -> Option<T> {
        let q = self.waiting.get_mut(&t.key)?;
        let item = q.iter().position(|w| w.seq == t.seq).map(|i| {
            let w = q.remove(i).expect("the position is in range");
            self.packets -= 1;
            self.bytes -= w.bytes;
            w.item
        });
        if q.is_empty() {
            self.waiting.remove(&t.key);
        }
        item
    }

    /// Drops the oldest packet of a neighbour with the most waiting, of the oldest such
    /// packets the oldest; None when none waits. Two scans of at most the packet limit
    /// (a few hundred), and only when the queue is full.
    fn pop_from_longest(&mut self) -> Option<()> {
        let most = self.waiting.values().map(VecDeque::len).max()?;
        let waiting = &self.waiting;
        // A neighbour's first live ticket is its oldest packet; its ticket stays behind.
        let t = *self.tickets.iter().find(|t| {
            waiting
                .get(&t.key)
                .is_some_and(|q| q.len() == most && q.front().is_some_and(|w| w.seq == t.seq))
        })?;
        self.remove(&t);
        Some(())
    }

    /// Forgets the tickets of packets that no longer wait.
    fn compact(&mut self) {
        let waiting = &self.waiting;
        self.tickets.retain(|t| {
            waiting
                .get(&t.key)
                .is_some_and(|q| q.iter().any(|w| w.seq == t.seq))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn queue(per_neighbour: usize, max_packets: usize, max_bytes: usize) -> Queue<u32> {
        Queue::new(&Config {
            queue_per_neighbour: per_neighbour,
            queue_max_packets: max_packets,
            queue_max_bytes: max_bytes,
            ..Config::default()
        })
    }

    #[test]
    fn test_packets_leave_in_order_when_their_neighbour_answers() {
        let mut q = queue(3, 256, 1 << 20);
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        assert_eq!(q.push(0, a, 1, 100, 0), Ok(0));
        assert_eq!(q.push(0, b, 2, 100, 0), Ok(0));
        assert_eq!(q.push(0, a, 3, 100, 0), Ok(0));
        assert!(q.contains(0, a) && !q.contains(1, a));
        assert_eq!((q.waiting_for(0, a), q.waiting_for(0, b)), (2, 1));
        assert_eq!((q.len(), q.bytes()), (3, 300));
        assert_eq!(q.take(0, a).collect::<Vec<_>>(), [1, 3]);
        assert!(!q.contains(0, a));
        assert_eq!((q.len(), q.bytes()), (1, 100));
        assert_eq!(q.take(0, a).count(), 0);
    }

    #[test]
    fn test_a_fourth_packet_pushes_out_its_neighbours_oldest() {
        let mut q = queue(3, 256, 1 << 20);
        let a = ip("fd00::1");
        for i in 0..3 {
            assert_eq!(q.push(0, a, i, 10, 0), Ok(0));
        }
        assert_eq!(q.push(0, a, 3, 10, 0), Ok(1));
        assert_eq!(q.len(), 3);
        assert_eq!(q.take(0, a).collect::<Vec<_>>(), [1, 2, 3]);
    }

    #[test]
    fn test_global_limits_push_out_the_oldest_of_any_neighbour() {
        let mut q = queue(3, 2, 1 << 20);
        q.push(0, ip("10.0.0.1"), 1, 10, 0).unwrap();
        q.push(0, ip("10.0.0.2"), 2, 10, 0).unwrap();
        assert_eq!(q.push(0, ip("10.0.0.3"), 3, 10, 0), Ok(1));
        assert!(!q.contains(0, ip("10.0.0.1")));
        assert_eq!(q.len(), 2);

        let mut q = queue(3, 256, 250);
        q.push(0, ip("10.0.0.1"), 1, 100, 0).unwrap();
        q.push(0, ip("10.0.0.2"), 2, 100, 0).unwrap();
        assert_eq!(q.push(0, ip("10.0.0.3"), 3, 100, 0), Ok(1));
        assert_eq!(q.bytes(), 200);
        assert_eq!(q.push(0, ip("10.0.0.3"), 4, 251, 0), Err(4), "never fits");
    }

    #[test]
    fn test_a_full_queue_pushes_out_a_packet_of_the_neighbour_with_the_most_waiting() {
        let mut q = queue(3, 5, 1 << 20);
        let (gw, busy) = (ip("10.0.0.1"), ip("10.0.0.2"));
        q.push(0, gw, 1, 10, 0).unwrap();
        for i in 2..5 {
            q.push(0, busy, i, 10, 0).unwrap();
        }
        q.push(0, ip("10.0.0.3"), 5, 10, 0).unwrap();
        // A scan: each new address pushes out one of `busy`'s, oldest first, not the
        // gateway's only packet, which is the oldest of all.
        assert_eq!(q.push(0, ip("10.0.1.1"), 6, 10, 0), Ok(1));
        assert_eq!(q.push(0, ip("10.0.1.2"), 7, 10, 0), Ok(1));
        assert_eq!(q.waiting_for(0, busy), 1);
        assert_eq!(q.take(0, busy).collect::<Vec<_>>(), [4]);
        q.push(0, busy, 8, 10, 0).unwrap();
        // One packet each: the oldest goes.
        assert_eq!(q.push(0, ip("10.0.1.3"), 9, 10, 0), Ok(1));
        assert!(!q.contains(0, gw));
        assert_eq!(q.len(), 5);
        // The byte limit the same way.
        let mut q = queue(3, 256, 40);
        q.push(0, gw, 1, 10, 0).unwrap();
        q.push(0, busy, 2, 10, 0).unwrap();
        q.push(0, busy, 3, 10, 0).unwrap();
        assert_eq!(q.push(0, ip("10.0.1.1"), 4, 20, 0), Ok(1));
        assert_eq!(q.take(0, busy).collect::<Vec<_>>(), [3]);
        assert_eq!(q.take(0, gw).collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn test_packets_expire_after_the_resolution_timeout_with_bounded_work() {
        let mut q = queue(3, 256, 1 << 20);
        let timeout = Config::default().unresolved_ns;
        for i in 0..5 {
            q.push(0, ip("10.0.0.1"), i, 10, u64::from(i) * SEC / 10)
                .unwrap();
        }
        assert_eq!(q.len(), 3, "two pushed out, their tickets left behind");
        assert!(q.expire(timeout - 1, 64).is_empty());
        // Two stale tickets, then one live packet, within a budget of 3.
        assert_eq!(q.expire(timeout + SEC / 5, 3), [2]);
        assert!(
            q.expire(timeout + SEC / 5, 64).is_empty(),
            "the next is not due"
        );
        assert_eq!(q.expire(10 * timeout, 1), [3]);
        assert_eq!(q.expire(10 * timeout, 64), [4]);
        assert!(q.is_empty());
        assert_eq!(q.tickets.len(), 0);
    }

    #[test]
    fn test_tickets_of_packets_gone_are_compacted() {
        let mut q = queue(3, 4, 1 << 20);
        let a = ip("10.0.0.1");
        for i in 0..1000 {
            q.push(0, a, i, 10, 0).unwrap();
            if i % 2 == 0 {
                q.take(0, a).count();
            }
        }
        assert!(q.tickets.len() <= 32, "{}", q.tickets.len());
    }

    #[test]
    fn test_retain_keeps_and_changes_what_it_is_told() {
        let mut q = queue(3, 256, 1 << 20);
        q.push(0, ip("10.0.0.1"), 1, 10, 0).unwrap();
        q.push(1, ip("10.0.0.1"), 2, 10, 0).unwrap();
        q.push(1, ip("10.0.0.1"), 3, 10, 0).unwrap();
        let removed = q.retain(|port, _, item| {
            *item *= 10;
            port == 1
        });
        assert_eq!((removed, q.len(), q.bytes()), (1, 2, 20));
        assert_eq!(q.take(1, ip("10.0.0.1")).collect::<Vec<_>>(), [20, 30]);
        // Tickets of removed packets are skipped by expiry.
        assert!(q.expire(u64::MAX, 64).is_empty());
    }
}
