//! Selecting entries to list or delete (`ferry conntrack list|delete`).

use std::net::IpAddr;

use super::entry::Entry;
use super::tcp::TcpState;
use crate::flow::proto;

/// Which entries to list or delete. Every field left `None` matches everything, so
/// `Filter::default()` matches all entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// The zone.
    pub zone: Option<u16>,
    /// An address on either side of either tuple (so both the service address and the
    /// backend address of a DNAT entry select it).
    pub addr: Option<IpAddr>,
    /// A TCP or UDP port on either side of either tuple.
    pub port: Option<u16>,
    /// The IP protocol.
    pub proto: Option<u8>,
    /// The TCP state (other protocols never match a state).
    pub state: Option<TcpState>,
    /// The mark set by other stages.
    pub mark: Option<u32>,
}

impl Filter {
    /// True when `e` is selected.
    pub fn matches(&self, e: &Entry) -> bool {
        let (o, r) = (e.original(), e.reply());
        self.zone.is_none_or(|z| e.zone() == z)
            && self.proto.is_none_or(|p| o.proto == p)
            && self
                .addr
                .is_none_or(|a| o.src == a || o.dst == a || r.src == a || r.dst == a)
            && self.port.is_none_or(|p| {
                matches!(o.proto, proto::TCP | proto::UDP)
                    && (o.src_port == p || o.dst_port == p || r.src_port == p || r.dst_port == p)
            })
            && self.state.is_none_or(|s| e.tcp_state() == Some(s))
            && self.mark.is_none_or(|m| e.mark == m)
    }
}
