//! The defrag stage: a fragment is held for reassembly, or completes its datagram,
//! whose key is rebuilt from the whole ([`crate::ipf`]).

use super::{Pipeline, Trace, TraceEvent, Verdict};
use crate::ipf;
use crate::packet::Packet;
use crate::wire::Parsed;

impl Pipeline {
    /// Defrag: a fragment is held, or completes its datagram (re-parsed, key rebuilt).
    /// Its callers only call it for a fragment: moving a whole packet and its parse in
    /// and out again cost a tenth of a small packet's time through the pipeline.
    pub(super) fn defrag(
        &mut self,
        pkt: Packet,
        parsed: Parsed,
        trace: &mut Trace,
    ) -> Result<(Packet, Parsed), Verdict> {
        if parsed.frag.is_none() {
            return Ok((pkt, parsed));
        }
        match self.ipf.process(pkt, &parsed, &mut self.drops) {
            ipf::Outcome::Held => {
                trace.note(|| TraceEvent::IpfHeld {
                    datagrams: self.ipf.held_datagrams(),
                    bytes: self.ipf.held_bytes(),
                });
                Err(Verdict::Held)
            }
            ipf::Outcome::Complete(p, pp) => {
                self.stats.reassembled += 1;
                trace.note(|| TraceEvent::IpfReassembled {
                    bytes: pp.ip_len(),
                    mru: p.meta.mru,
                    key: pp.key,
                });
                Ok((p, pp))
            }
            ipf::Outcome::Dropped(r) => {
                trace.note(|| TraceEvent::IpfRefused { reason: r });
                Err(self.drop(r, trace))
            }
        }
    }
}
