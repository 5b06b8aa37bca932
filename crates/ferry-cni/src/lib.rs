//! ferry's CNI plugin.
//!
//! The container runtime runs `ferry-cni` for each pod, as the CNI specification
//! (versions 0.4.0, 1.0.0 and 1.1.0) says: the command and the attachment in `CNI_*`
//! environment variables ([`env`]), the network configuration on standard input
//! ([`config`]), the result or an error object on standard output ([`result`],
//! [`error`]). The plugin leases the pod's addresses itself, host-local style, from
//! the node's pod CIDRs ([`ipam`]), and asks the ferry agent over its local socket
//! ([`agent`], messages in [`ferry_api`]) to make the pod's interface. [`plugin`]
//! holds the commands; [`install`] puts the plugin and its configuration in place on a
//! node.
//!
//! `docs/cni.md` describes the plugin for its users.
#![forbid(unsafe_code)]

pub mod agent;
pub mod config;
pub mod env;
pub mod error;
pub mod install;
pub mod ipam;
pub mod plugin;
pub mod result;
pub mod version;

pub use error::Error;
pub use plugin::{Outcome, run};
pub use version::Version;
