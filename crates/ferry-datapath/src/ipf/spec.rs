//! The fragment limits as the tables file writes them.

use serde::{Deserialize, Serialize};

use super::Config;

/// The smallest `ipf.min_fragment_*` accepted: IPv4's minimum MTU (RFC 791).
pub const MIN_FRAGMENT: u16 = 68;

/// Fragment-handling limits; every field optional, defaults documented in `ipf`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IpfSpec {
    /// Incomplete datagrams are dropped after this many milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Most datagrams being reassembled at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_datagrams: Option<usize>,
    /// Most datagrams being reassembled at once from one source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_datagrams_per_source: Option<usize>,
    /// Most bytes held for reassembly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<usize>,
    /// Smallest non-final IPv4 fragment accepted (whole IP packet, bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_fragment_v4: Option<u16>,
    /// Smallest non-final IPv6 fragment accepted (whole IP packet, bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_fragment_v6: Option<u16>,
}

impl IpfSpec {
    /// The reassembler limits asked for, defaults where nothing is said.
    pub fn config(&self) -> Config {
        let d = Config::default();
        Config {
            timeout_ns: self
                .timeout_ms
                .map_or(d.timeout_ns, |ms| ms.saturating_mul(1_000_000)),
            max_datagrams: self.max_datagrams.unwrap_or(d.max_datagrams),
            max_datagrams_per_source: self
                .max_datagrams_per_source
                .unwrap_or(d.max_datagrams_per_source),
            max_bytes: self.max_bytes.unwrap_or(d.max_bytes),
            min_fragment_v4: self.min_fragment_v4.unwrap_or(d.min_fragment_v4),
            min_fragment_v6: self.min_fragment_v6.unwrap_or(d.min_fragment_v6),
        }
    }

    /// Checks the limits; the error names the field.
    pub fn check(&self) -> Result<(), String> {
        // Smaller fragments would let a datagram be cut into thousands of pieces.
        if self.min_fragment_v4.is_some_and(|v| v < MIN_FRAGMENT)
            || self.min_fragment_v6.is_some_and(|v| v < MIN_FRAGMENT)
        {
            return Err(format!(
                "ipf: min_fragment_v4 and min_fragment_v6 must be at least {MIN_FRAGMENT}"
            ));
        }
        if self.max_datagrams == Some(0)
            || self.max_datagrams_per_source == Some(0)
            || self.max_bytes == Some(0)
            || self.timeout_ms == Some(0)
        {
            return Err(
                "ipf: max_datagrams, max_datagrams_per_source, max_bytes and timeout_ms must be positive"
                    .into(),
            );
        }
        Ok(())
    }
}
