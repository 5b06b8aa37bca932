//! The policy stage: where NetworkPolicy and ClusterNetworkPolicy will be decided. It
//! runs after the Service choice and conntrack, so that a new connection is judged on
//! the endpoint it was given (after DNAT) and with the source it will be seen from; the
//! verdict will be stored in the connection, so that established packets pay nothing.
//!
//! Nothing is enforced yet: every packet passes.

use super::{Pipeline, Trace};
use crate::conntrack::CtResult;
use crate::drop::DropReason;
use crate::packet::Packet;
use crate::tables::Tables;
use crate::wire::Parsed;

impl Pipeline {
    /// Decides whether the packet, as conntrack left it (`ct`: its state, and for a new
    /// connection the pending entry), may go on. `Err` drops it with that reason.
    #[inline(always)]
    pub(super) fn policy(
        &mut self,
        _tables: &Tables,
        _pkt: &Packet,
        _parsed: &Parsed,
        _ct: &mut CtResult,
        _trace: &mut Trace,
    ) -> Result<(), DropReason> {
        Ok(())
    }
}
