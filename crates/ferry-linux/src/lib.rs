//! ferry's Linux side: the ports that move frames between the kernel and the datapath,
//! the namespace helpers that end-to-end tests and the lab use, and the TCP listeners of
//! the agent's HTTP servers.
//!
//! Every `unsafe` block of ferry lives in this crate, next to a `// SAFETY:` comment that
//! says why it is sound; the types exported here are safe to use.

pub mod af_packet;
pub mod cmd;
pub mod cpu;
pub mod fdpass;
pub mod handover;
pub mod link;
pub mod memory;
pub mod netns;
pub mod port;
pub mod process;
pub mod signal;
pub mod tap;
pub mod tc;
pub mod tcp;
pub mod worker;

pub use af_packet::{AfPacketConfig, AfPacketPort};
pub use memory::{advise_huge_pages, prefetch};
pub use port::{Frame, Port, PortCounters};
pub use tap::{Tap, TapPort};
pub use worker::{
    Applied, Control, JobError, NamedPort, PortSnapshot, Snapshot, Taps, Update, UpdateError,
    WorkerStats, WorkerView, run_worker, run_worker_with,
};
