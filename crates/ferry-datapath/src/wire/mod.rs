//! The wire layer: parsing, checksums and header views. No I/O.

pub mod build;
pub mod checksum;
pub mod icmp_error;
pub mod parse;
pub mod rewrite;
pub mod vxlan;

pub use parse::{Frag, L3, Parsed, parse};
