//! Neighbours as a handed-over state saves them ([`handover::Neighbour`]): by port name,
//! times relative to the save.

use std::net::IpAddr;

use super::{Neighbour, State};
use crate::handover::{self, NeighState};

fn state_record(s: State) -> NeighState {
    match s {
        State::Incomplete => NeighState::Incomplete,
        State::Reachable => NeighState::Reachable,
        State::Stale => NeighState::Stale,
        State::Delay => NeighState::Delay,
        State::Probe => NeighState::Probe,
    }
}

fn state(s: NeighState) -> State {
    match s {
        NeighState::Incomplete => State::Incomplete,
        NeighState::Reachable => State::Reachable,
        NeighState::Stale => State::Stale,
        NeighState::Delay => State::Delay,
        NeighState::Probe => State::Probe,
    }
}

/// The record of the neighbour `addr` on the port named `port`, saved at `now_ns`.
pub(crate) fn record(port: &str, addr: IpAddr, n: &Neighbour, now_ns: u64) -> handover::Neighbour {
    let mut r = handover::Neighbour {
        port: String::new(),
        addr,
        mac: [0; 6],
        state: NeighState::Incomplete,
        updated_ago_ns: 0,
        used_ago_ns: 0,
        probed_ago_ns: None,
        probes: 0,
    };
    record_into(&mut r, port, addr, n, now_ns);
    r
}

/// [`record`] written over `r`, reusing its port name's memory.
pub(crate) fn record_into(
    r: &mut handover::Neighbour,
    port: &str,
    addr: IpAddr,
    n: &Neighbour,
    now_ns: u64,
) {
    r.port.clear();
    r.port.push_str(port);
    r.addr = addr;
    r.mac = n.mac;
    r.state = state_record(n.state);
    r.updated_ago_ns = now_ns.saturating_sub(n.updated_ns);
    r.used_ago_ns = now_ns.saturating_sub(n.used_ns);
    r.probed_ago_ns = n.probed_ns.map(|t| now_ns.saturating_sub(t));
    r.probes = n.probes;
}

/// The neighbour of a record saved `age_ns` before its restore at `now_ns` (times
/// before the clock's start taken as its start).
pub(crate) fn neighbour(r: &handover::Neighbour, now_ns: u64, age_ns: u64) -> Neighbour {
    let at = |ago: u64| now_ns.saturating_sub(ago.saturating_add(age_ns));
    Neighbour {
        mac: r.mac,
        state: state(r.state),
        updated_ns: at(r.updated_ago_ns),
        used_ns: at(r.used_ago_ns),
        probed_ns: r.probed_ago_ns.map(at),
        probes: r.probes,
    }
}
