//! The wire layer: parsing, header emitters, checksums and header views. No I/O.

pub mod build;
pub mod checksum;
pub mod ethernet;
pub mod icmp;
pub mod icmp_error;
pub mod ipv4;
pub mod ipv6;
pub mod ipv6_ext;
pub mod parse;
pub mod rewrite;
pub mod vxlan;

pub use parse::{Frag, L3, Parsed, parse};
