//! The wire layer: parsing, header emitters, checksums and header views. No I/O.
//!
//! Public for other crates: [`parse`] with what it returns, the frame builders
//! ([`build`]) and the checksum helpers ([`checksum`]); the header views and emitters
//! are the crate's own.

pub mod build;
pub mod checksum;
pub(crate) mod ethernet;
pub(crate) mod icmp;
pub(crate) mod icmp_error;
pub(crate) mod ipv4;
pub(crate) mod ipv6;
pub(crate) mod ipv6_ext;
pub(crate) mod parse;
pub(crate) mod rewrite;
pub mod sctp;
pub(crate) mod vxlan;

pub use parse::{Frag, L3, Parsed, parse};
