//! ferry's datapath: the packet pipeline and its tables.
//!
//! Pure by design: no syscalls, no threads, no clock reads (time is passed in with each
//! packet), so every behaviour can be unit-tested and replayed from pcap files.
//!
//! # Surface
//!
//! Most modules are private; what other crates use is re-exported here, so a module can
//! be split or moved without touching them. Most names live at the crate root:
//!
//! - packets and flows: [`Packet`], [`VnetHdr`], [`PortId`], [`FlowKey`], [`DropReason`],
//!   [`Described`];
//! - the pipeline: [`Pipeline`], [`Verdict`], [`SwapReport`], [`PipelineStats`], and
//!   tracing ([`Trace`], [`TraceEvent`], [`trace`], [`summarize`]);
//! - the tables and every spec a [`TablesSpec`] holds ([`PortSpec`], [`RouteSpec`],
//!   [`OverlaySpec`], [`CtSpec`], ...), with the compiled [`Tables`];
//! - Services ([`Services`], [`ServiceSpec`], [`TrafficPolicy`]), the overlay's defaults
//!   and the capture filter ([`CaptureFilter`]);
//! - ICMP errors as the pipeline builds them ([`build_icmp_error`], [`IcmpError`]).
//!
//! A few modules stay public as groups, because their names only read well with the
//! module's name in front (`conntrack::Entry`, `ipf::Stats`, `gso::segment`):
//!
//! - [`conntrack`]: the connection table and its vocabulary (entries, dump filters,
//!   timeouts, statistics), for the agent's listing, the worker's counters and benches;
//! - [`handover`]: the state a pipeline hands over to the next agent's
//!   ([`handover::SavedState`] from [`Pipeline::save_state`], its bytes by
//!   [`handover::encode`] and [`handover::decode`], [`Pipeline::restore_state`]'s
//!   report and errors), for the agent's handover, and its checkpoints restored after
//!   a crash ([`Pipeline::restore_state_with`]);
//! - [`ipf`]: fragment reassembly and refragmentation, with their settings and counters;
//! - [`gso`] and [`gro`]: segmentation and coalescing of super-packets, which the port
//!   worker calls around the pipeline;
//! - [`policy`]: NetworkPolicy and ClusterNetworkPolicy as the tables give them
//!   ([`policy::PolicySpec`]) and their decisions (`policy::Direction`, `policy::Tier`);
//!   the pipeline's counts and previews of them are at the root ([`PolicyCount`],
//!   [`PolicyCut`]);
//! - [`wire`]: parsing frames, building them ([`wire::build`], for tests, benches and the
//!   demo) and their checksums ([`wire::checksum`]).
#![forbid(unsafe_code)]

pub mod conntrack;
mod describe;
mod drop;
mod fib;
mod filter;
mod flow;
pub mod gro;
pub mod gso;
pub mod handover;
mod icmp;
pub mod ipf;
mod lb;
mod nat;
mod neigh;
mod overlay;
mod packet;
mod pipeline;
pub mod policy;
mod tables;
#[cfg(test)]
mod test_frames;
pub mod wire;

pub use describe::{Described, Transport};
pub use drop::{DropCounters, DropReason};
pub use fib::Fib;
pub use filter::Match as CaptureFilter;
pub use flow::{Addr, FlowKey, proto, proto_name};
pub use lb::{
    BackendSpec, BalanceMode, BalanceSpec, HintsSpec, MARK_SERVICE, Policy as TrafficPolicy,
    ServiceSpec, Services,
};
pub use lb::{maglev, rendezvous};
pub use overlay::{DEFAULT_PORT as DEFAULT_VXLAN_PORT, DEFAULT_VNI, MAX_VNI};
pub use packet::{Meta, Packet, PortId, VnetHdr};
pub use pipeline::{
    DEFAULT_AUDIT_BUFFER, Denial, DeniedBy, PREFETCH_MIN_CONNECTIONS, Pipeline, PolicyBy,
    PolicyCount, PolicyCut, PortStats, Stage, Stats as PipelineStats, SwapReport, Trace,
    TraceEvent, TraceOut, TracePass, TraceReport, TraceStage, Verdict, summarize, trace,
};
pub use tables::{
    DEFAULT_MTU, GATEWAY_V4, GATEWAY_V6, MIN_MTU, NextHop, NodeSpec, Port, PortAddr, PortKind,
    PortSpec, RouteSpec, Tables, TablesSpec, Target,
};
// The specs a `TablesSpec` holds, from the modules that own them.
pub use conntrack::CtSpec;
pub use icmp::IcmpSpec;
// ICMP errors as the pipeline builds them, for the fuzz targets that quote connections.
pub use icmp::{ErrorKind as IcmpError, build_error as build_icmp_error};
pub use ipf::IpfSpec;
pub use nat::{MatchSpec, NatRuleSpec};
pub use overlay::{ModeSpec, OverlaySpec, PeerSpec};
pub use wire::ethernet::MacAddr;
