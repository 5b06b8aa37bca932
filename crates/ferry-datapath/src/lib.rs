//! ferry's datapath: the packet pipeline and its tables.
//!
//! Pure by design: no syscalls, no threads, no clock reads (time is passed in with each
//! packet), so every behaviour can be unit-tested and replayed from pcap files.
#![forbid(unsafe_code)]

pub mod conntrack;
pub mod describe;
pub mod drop;
pub mod fib;
pub mod filter;
pub mod flow;
pub mod gro;
pub mod gso;
pub mod icmp;
pub mod ipf;
pub mod lb;
pub mod nat;
pub mod neigh;
pub mod overlay;
pub mod packet;
pub mod pipeline;
pub mod tables;
pub mod wire;

pub use drop::{DropCounters, DropReason};
pub use flow::FlowKey;
pub use packet::{Meta, Packet, PortId, VnetHdr};
