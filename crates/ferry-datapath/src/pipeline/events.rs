//! What a packet's trace records: one event per stage, when tracing is on.

use std::net::IpAddr;

use crate::conntrack::CtState;
use crate::flow::FlowKey;
use crate::packet::PortId;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Stage name (`parse`, `ipf`, `route`, ...).
    pub stage: &'static str,
    /// What the stage did.
    pub detail: String,
}

/// A packet's trace: one event per stage, recorded only when enabled.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub(super) enabled: bool,
    /// The events, in stage order.
    pub events: Vec<TraceEvent>,
    /// What conntrack made of the packet, and whether it went in the reply direction;
    /// recorded whether or not tracing is on.
    pub ct: Option<(CtState, bool)>,
    /// The packet's key as conntrack looked it up (after decapsulation and reassembly,
    /// before NAT); recorded only when tracing is on.
    pub key: Option<FlowKey>,
    /// The neighbour (port and address) the packet was queued for, when it was; recorded
    /// only when tracing is on.
    pub waiting_for: Option<(PortId, IpAddr)>,
}

impl Trace {
    /// A trace that records.
    pub fn enabled() -> Trace {
        Trace {
            enabled: true,
            events: Vec::new(),
            ct: None,
            key: None,
            waiting_for: None,
        }
    }

    /// A trace that records nothing (the fast path).
    pub fn disabled() -> Trace {
        Trace::default()
    }

    /// Records an event; `detail` is only evaluated when tracing is on.
    #[inline]
    pub fn note(&mut self, stage: &'static str, detail: impl FnOnce() -> String) {
        if self.enabled {
            self.events.push(TraceEvent {
                stage,
                detail: detail(),
            });
        }
    }

    /// Forgets the events and the conntrack state, keeping the setting.
    pub fn clear(&mut self) {
        self.events.clear();
        self.ct = None;
        self.key = None;
        self.waiting_for = None;
    }

    /// The conntrack state as verdict logs name it: `new`, `established`, `reply`,
    /// `related`, `invalid` or `untracked`; None when the packet never reached conntrack.
    pub fn ct_name(&self) -> Option<&'static str> {
        self.ct.map(|(state, reply)| match state {
            CtState::Established if reply => "reply",
            s => s.name(),
        })
    }
}

/// `addr:port`, with brackets for IPv6.
pub(super) struct SockAddr(pub(super) IpAddr, pub(super) u16);

impl std::fmt::Display for SockAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V4(a) => write!(f, "{a}:{}", self.1),
            IpAddr::V6(a) => write!(f, "[{a}]:{}", self.1),
        }
    }
}
