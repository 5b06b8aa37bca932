//! The connection tracking settings as the tables file writes them.

use serde::{Deserialize, Serialize};

use super::Config;

/// Connection tracking settings; every field optional.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CtSpec {
    /// Most connections tracked at once (default 262144).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_entries: Option<usize>,
    /// Let packets that conntrack finds INVALID through instead of dropping them
    /// (default false, as kube-proxy's `ctstate INVALID -j DROP`).
    #[serde(default)]
    pub pass_invalid: bool,
    /// Pick up TCP connections mid-stream, e.g. after a restart (default true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_pickup: Option<bool>,
}

impl CtSpec {
    /// The conntrack configuration asked for, defaults where nothing is said.
    pub fn config(&self) -> Config {
        let d = Config::default();
        Config {
            max_entries: self.max_entries.unwrap_or(d.max_entries),
            tcp_pickup: self.tcp_pickup.unwrap_or(d.tcp_pickup),
            ..d
        }
    }

    /// Checks the settings; the error names the field.
    pub fn check(&self) -> Result<(), String> {
        if self.max_entries == Some(0) {
            return Err("ct: max_entries must be at least 1".into());
        }
        Ok(())
    }
}
