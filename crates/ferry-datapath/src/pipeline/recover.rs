//! Service connections recovered from their endpoint's side. After a crash that lost
//! the checkpoint (or took connections younger than it), the first packet the new agent
//! sees of a download through a Service is usually the server's: a TCP segment from the
//! endpoint to the client, in the reply direction of a connection it has no entry for.
//! Taken up as it stands (TCP pickup), it would be tracked untranslated and reach the
//! client from the endpoint's address, which the client's socket does not know: the
//! client answers with a reset and the connection is lost, although the client's own
//! next packet would have been balanced to the same endpoint (a consistent balance
//! chooses by the tuple alone).
//!
//! So such a segment, from an endpoint of some Service port to a client on this node (a
//! pod, the node's own stack) or outside the cluster, is matched against the frontends
//! whose choice for the client's tuple gives that endpoint with the client address kept
//! ([`Services::reached_through`]): the first candidate is taken, and the segment is
//! translated back as if from it and sent on, tracked as a reply and committing nothing.
//! The client, which knows that frontend, answers; its segment starts the connection in
//! the original direction (pickup, the same endpoint chosen) and every later packet
//! follows that entry. A client that does not know the frontend answers with a reset,
//! which is dropped (INVALID: no entry) and refutes that candidate; so does a candidate
//! the client leaves unanswered for a second (tried again only after the others). With
//! every candidate refuted, the segment is taken up untranslated, as before.
//!
//! What cannot be recovered this way: a connection whose source was translated (hairpin,
//! source NAT to the node: its reply is addressed to the node, which does not say to
//! which client), a client on another node (its node translates the replies, and takes
//! them up untranslated here, as before), a connection whose endpoint choice changed
//! since (endpoints changed, an affinity record gone), UDP (no reset refutes a wrong
//! guess), and a node-port connection at its endpoint's node when the endpoint's agent
//! lost its state: which node the client came through is not in the reply.
//!
//! The candidate is checked against policy as the connection it stands for (client to
//! endpoint); one policy would deny is not recovered.
//!
//! [`Services::reached_through`]: crate::lb::Services::reached_through

use std::collections::HashMap;
use std::net::IpAddr;

use ahash::RandomState;

use super::track::Opening;
use super::{Pipeline, Stats, Trace, TraceEvent, policy};
use crate::conntrack::{CtResult, CtState, translate};
use crate::drop::DropReason;
use crate::flow::{FlowKey, proto};
use crate::lb::{Candidate, Cluster, MAX_RECOVERY_CANDIDATES, Source};
use crate::packet::{Packet, PortId};
use crate::tables::{PortKind, Tables};
use crate::wire::Parsed;

/// Connections being recovered at most; a new one beyond finds no room (taken up as
/// before) until records expire (swept once a second).
pub const MAX_RECOVERING: usize = 4096;
/// A record unused this long is forgotten (10 s).
pub const RECOVERING_KEEP_NS: u64 = 10_000_000_000;
/// A candidate the client has not answered for this long gives way to the next (1 s).
pub const RECOVERING_UNANSWERED_NS: u64 = 1_000_000_000;

const TCP_RST: u8 = 0x04;

/// One connection being recovered, by the endpoint's tuple (endpoint -> client).
#[derive(Clone, Copy, Debug)]
struct Tentative {
    /// Candidates (by their index) the client refused with a reset.
    refused: u8,
    /// The candidate being tried.
    current: u8,
    /// The client's tuple for it (client -> frontend).
    client: FlowKey,
    /// When it was first tried.
    since_ns: u64,
    /// When a packet last needed it.
    last_ns: u64,
}

/// The connections being recovered, bounded by [`MAX_RECOVERING`].
#[derive(Clone, Debug, Default)]
pub(super) struct Recovering {
    flows: HashMap<FlowKey, Tentative, RandomState>,
    /// The client's tuple of each candidate being tried -> the endpoint's tuple.
    tried: HashMap<FlowKey, FlowKey, RandomState>,
}

impl Recovering {
    /// Connections being recovered.
    pub(super) fn len(&self) -> usize {
        self.flows.len()
    }

    /// The candidate to try for the endpoint's tuple `reply` among `client_keys` (each
    /// candidate's client -> frontend tuple): the one being tried unless it went
    /// unanswered too long, else the next not refused. None when every candidate was
    /// refused, or when there is no room for a new record.
    fn choose(
        &mut self,
        reply: &FlowKey,
        client_keys: &[FlowKey],
        now_ns: u64,
        stats: &mut Stats,
    ) -> Option<usize> {
        let n = client_keys.len().min(MAX_RECOVERY_CANDIDATES);
        if n == 0 {
            return None;
        }
        let Some(t) = self.flows.get_mut(reply) else {
            // Full: no room until the once-a-second sweep (`Pipeline::tick`) makes some,
            // so that a flood of such segments costs no pass over the records each.
            if self.flows.len() >= MAX_RECOVERING {
                return None;
            }
            let t = Tentative {
                refused: 0,
                current: 0,
                client: client_keys[0],
                since_ns: now_ns,
                last_ns: now_ns,
            };
            self.tried.insert(t.client, *reply);
            self.flows.insert(*reply, t);
            return Some(0);
        };
        t.last_ns = now_ns;
        let unanswered = now_ns.saturating_sub(t.since_ns) >= RECOVERING_UNANSWERED_NS;
        // The candidate by its tuple: a table swap may have moved it in the list, or
        // taken it out (then the refusals, by index, no longer apply).
        let pos = client_keys[..n].iter().position(|k| *k == t.client);
        if pos.is_none() {
            t.refused = 0;
        }
        let refused = t.refused;
        let open = |j: usize| refused & (1 << j) == 0;
        let from = match pos {
            Some(i) if open(i) && !unanswered => {
                // Its place in a list a table swap reordered: a reset refuses this one.
                t.current = i as u8;
                return Some(i);
            }
            Some(i) => i,
            None => n - 1,
        };
        // The next candidate not refused; the one left unanswered comes last (it may yet
        // be right).
        let next = (1..=n).map(|d| (from + d) % n).find(|&j| open(j))?;
        if pos == Some(next) {
            t.since_ns = now_ns;
            return Some(next);
        }
        if unanswered && pos.is_some_and(open) {
            stats.ct_recovery_refuted += 1;
        }
        self.tried.remove(&t.client);
        t.current = next as u8;
        t.client = client_keys[next];
        t.since_ns = now_ns;
        self.tried.insert(t.client, *reply);
        Some(next)
    }

    /// A reset from a client with the tuple `client` (client -> frontend) that no
    /// connection has: when it answers a candidate being tried, that candidate is
    /// refused. True when it did.
    fn refute(&mut self, client: &FlowKey) -> bool {
        let Some(reply) = self.tried.remove(client) else {
            return false;
        };
        match self.flows.get_mut(&reply) {
            Some(t) if t.client == *client => {
                t.refused |= 1 << t.current;
                true
            }
            _ => false,
        }
    }

    /// Forgets the records unused for [`RECOVERING_KEEP_NS`].
    pub(super) fn expire(&mut self, now_ns: u64) {
        let tried = &mut self.tried;
        self.flows.retain(|_, t| {
            let keep = now_ns.saturating_sub(t.last_ns) < RECOVERING_KEEP_NS;
            if !keep {
                tried.remove(&t.client);
            }
            keep
        });
    }
}

/// Where the client of a reply to `client` is, as a connection from it would have come:
/// the source class of the endpoint choice, its pod port on this node, and whether it
/// is the node's own stack. None for a client on another node (its node translated the
/// connection) or one no route reaches.
fn client_side(tables: &Tables, client: IpAddr) -> Option<(Source, Option<PortId>, bool)> {
    let route = tables.fib.lookup(client)?.route()?;
    match tables.ports[usize::from(route.port)].kind {
        PortKind::Pod => Some((Source::Node, Some(route.port), false)),
        PortKind::Host => Some((Source::Node, None, true)),
        _ if tables.tunnel_reaches(client) => None,
        _ => Some((Source::Network, None, false)),
    }
}

impl Pipeline {
    /// A TCP segment taken up mid-stream that reaches no frontend and no static rule:
    /// when it comes from a Service endpoint and a frontend would have given that
    /// endpoint to its destination's tuple, translated back as from that frontend and
    /// tracked as a reply, committing nothing (see the module documentation). None
    /// when it is not recovered.
    pub(super) fn recover(
        &mut self,
        tables: &Tables,
        pkt: &mut Packet,
        parsed: &mut Parsed,
        opening: &mut Opening,
        trace: &mut Trace,
    ) -> Option<Result<CtResult, DropReason>> {
        let key = parsed.key;
        if key.proto != proto::TCP
            || tables
                .services
                .holders(key.proto, key.src.ip(), key.src_port)
                .is_empty()
        {
            return None;
        }
        let (source, pod, host) = client_side(tables, key.dst.ip())?;
        let now = pkt.meta.time_ns;
        let v6 = key.dst.ip().is_ipv6();
        let peers: smallvec::SmallVec<[IpAddr; 16]> = match (&tables.overlay, source) {
            (Some(ov), Source::Network) => ov
                .peers
                .iter()
                .map(|p| p.address)
                .filter(|a| a.is_ipv6() == v6)
                // No more than the candidates could be found among, whatever the cluster's
                // size: a segment's cost stays bounded.
                .take(4 * MAX_RECOVERY_CANDIDATES)
                .collect(),
            _ => smallvec::SmallVec::new(),
        };
        let candidates =
            tables
                .services
                .reached_through(tables, &key, source, &peers, &self.affinity, now);
        if candidates.is_empty() {
            return None;
        }
        // The connection it stands for, client to endpoint (no source NAT), must be one
        // policy allows now.
        let conn = FlowKey {
            src: key.dst,
            dst: key.src,
            src_port: key.dst_port,
            dst_port: key.src_port,
            ..key
        };
        if !tables.policy.is_empty() && !policy::allows_key(tables, pod, &conn, host) {
            return None;
        }
        let client_keys: smallvec::SmallVec<[FlowKey; MAX_RECOVERY_CANDIDATES]> = candidates
            .iter()
            .map(|c| FlowKey {
                dst: c.addr,
                dst_port: c.port,
                ..conn
            })
            .collect();
        let i = self
            .recovering
            .choose(&key, &client_keys, now, &mut self.stats)?;
        let c: Candidate = candidates[i];
        match c.via {
            // Another node's connection: back to it untranslated, as its entry here
            // would have sent it.
            Some(node) => opening.recovered_via = Some(node),
            None => {
                let to = FlowKey {
                    src: c.addr,
                    src_port: c.port,
                    ..key
                };
                if let Err(r) = translate(pkt, parsed, &to) {
                    return Some(Err(r));
                }
            }
        }
        self.stats.ct_recovered += 1;
        trace.note(|| {
            let svc = &tables.services.services[c.frontend.service as usize];
            TraceEvent::ServiceRecovered {
                service: svc.name.clone(),
                scope: c.frontend.scope,
                frontend: c.addr.ip(),
                frontend_port: c.port,
                endpoint: key.src.ip(),
                endpoint_port: key.src_port,
                through: c.via,
                candidate: i as u8 + 1,
                candidates: candidates.len() as u8,
            }
        });
        Some(Ok(CtResult {
            state: CtState::Established,
            reply: true,
            entry: None,
            pending: None,
        }))
    }

    /// A TCP segment conntrack found INVALID without a connection: a client's reset
    /// refusing a recovery candidate refutes it.
    pub(super) fn refute_recovery(&mut self, parsed: &Parsed) {
        if parsed.key.proto == proto::TCP
            && parsed.tcp_flags & TCP_RST != 0
            && self.recovering.len() > 0
            && self.recovering.refute(&parsed.key)
        {
            self.stats.ct_recovery_refuted += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    /// The client's tuple for a candidate: the client to frontend `n`.
    fn candidate(n: u8) -> FlowKey {
        FlowKey {
            src: Ipv4Addr::new(192, 0, 2, 1).into(),
            dst: Ipv4Addr::new(10, 96, 0, n).into(),
            zone: 0,
            proto: proto::TCP,
            src_port: 40000,
            dst_port: 80,
        }
    }

    #[test]
    fn a_reset_refuses_the_candidate_tried_after_a_swap_moved_it_in_the_list() {
        let mut r = Recovering::default();
        let mut stats = Stats::default();
        let reply = FlowKey {
            src: Ipv4Addr::new(10, 244, 2, 5).into(),
            dst: Ipv4Addr::new(192, 0, 2, 1).into(),
            zone: 0,
            proto: proto::TCP,
            src_port: 8080,
            dst_port: 40000,
        };
        let (k0, k1, k2) = (candidate(1), candidate(2), candidate(3));
        assert_eq!(r.choose(&reply, &[k0, k1, k2], 0, &mut stats), Some(0));
        // A table swap puts the candidate being tried second.
        assert_eq!(r.choose(&reply, &[k1, k0, k2], 1, &mut stats), Some(1));
        // The client resets it: that candidate, not the one now first, is refused.
        assert!(r.refute(&k0));
        assert_eq!(
            r.choose(&reply, &[k1, k0, k2], 2, &mut stats),
            Some(2),
            "the next after the refused one"
        );
        assert!(r.refute(&k2));
        assert_eq!(r.choose(&reply, &[k1, k0, k2], 3, &mut stats), Some(0));
        assert!(r.refute(&k1));
        assert_eq!(
            r.choose(&reply, &[k1, k0, k2], 4, &mut stats),
            None,
            "every candidate refused"
        );
    }
}
