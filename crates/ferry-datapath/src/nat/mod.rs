//! NAT: the translation a connection is created with ([`Nat`]), the static rules that
//! give it to connections that reach no Service (`rules`), and the choice of the
//! translated tuple with the ports that keep every reply tuple unique (`ports`, which
//! asks the connection table which tuples are free). A Service's translation comes from
//! the Service choice (`lb::balance`). Conntrack decides a connection's tuple here when
//! it creates it, and translates every packet of the connection both ways
//! ([`crate::wire::rewrite`]).

pub(crate) mod ports;
mod rules;

pub use ports::{SNAT_PORTS, SNAT_PRIVILEGED_PORTS};
pub use rules::{MatchSpec, NatRule, NatRuleSpec, first_match};
// Only tests name a rule's source NAT; the pipeline reads it through `NatRule`.
#[cfg(test)]
pub(crate) use rules::Snat;

use crate::flow::Addr;

/// NAT to apply when a connection is created (a Service's backend, masquerade...).
///
/// Its addresses are [`Addr`]s, for the reason given there: a NAT is copied on the way
/// to the connection it creates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nat {
    /// Destination address, and port (TCP/UDP) when it changes.
    pub dnat: Option<(Addr, Option<u16>)>,
    /// Source address, and the range of ports (TCP/UDP) or ICMP echo identifiers to
    /// choose from, inclusive. Without a range the source port is kept when free, else
    /// one of the same class is chosen (conntrack's `SNAT_PORTS`, or `SNAT_PRIVILEGED_PORTS` for
    /// a port below 1024; any identifier).
    pub snat: Option<(Addr, Option<(u16, u16)>)>,
}
