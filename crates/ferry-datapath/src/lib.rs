//! ferry's datapath: the packet pipeline and its tables.
//!
//! Pure by design: no syscalls, no threads, no clock reads (time is passed in with each
//! packet), so every behaviour can be unit-tested and replayed from pcap files.
#![forbid(unsafe_code)]

// Modules whose types other crates name (the tables file, Services, connection
// tracking, fragments, the wire format and its builders, segmentation, capture filters)
// are public; the rest are private, and what of them other crates use is re-exported
// below.
pub mod conntrack;
mod describe;
mod drop;
mod fib;
pub mod filter;
mod flow;
pub mod gro;
pub mod gso;
pub mod icmp;
pub mod ipf;
pub mod lb;
mod nat;
mod neigh;
pub mod overlay;
mod packet;
pub mod pipeline;
pub mod policy;
pub mod tables;
#[cfg(test)]
mod test_frames;
pub mod wire;

pub use describe::{Described, Transport};
pub use drop::{DropCounters, DropReason};
pub use fib::Fib;
pub use flow::{Addr, FlowKey, proto, proto_name};
pub use packet::{Meta, Packet, PortId, VnetHdr};
