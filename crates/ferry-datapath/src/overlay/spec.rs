//! The overlay and the other nodes as the tables file writes them.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::wire::ethernet::MacAddr;

/// Overlay mode as written: `always`, `cross-subnet` or `never`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModeSpec {
    /// Encapsulate all traffic to other nodes' pods.
    #[default]
    Always,
    /// Only to nodes outside the uplink's subnet.
    CrossSubnet,
    /// Never.
    Never,
}

fn default_vni() -> u32 {
    super::DEFAULT_VNI
}

fn default_vxlan_port() -> u16 {
    super::DEFAULT_PORT
}

/// The VXLAN overlay, as the tables file describes it.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OverlaySpec {
    /// VXLAN network identifier (default 4096, as Calico).
    #[serde(default = "default_vni")]
    pub vni: u32,
    /// UDP port (default 4789).
    #[serde(default = "default_vxlan_port")]
    pub port: u16,
    /// When to encapsulate (default `always`).
    #[serde(default)]
    pub mode: ModeSpec,
    /// The port the underlay is reached through.
    pub uplink: String,
    /// This node's VTEP MAC: inner source MAC (default derived from the node's first
    /// address, see `overlay::vtep_mac`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<MacAddr>,
}

/// Another node, as the tables file describes it.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PeerSpec {
    /// Its name.
    pub name: String,
    /// Its underlay address.
    pub address: IpAddr,
    /// Its pods' prefixes: routed to it.
    #[serde(default)]
    pub pod_cidrs: Vec<IpNet>,
    /// Its VTEP MAC: inner destination MAC (default derived from `address`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<MacAddr>,
}
