//! The plugin's errors: a CNI error code, a message and details, printed as the
//! specification's error object.

use std::fmt;

use serde_json::{Value, json};

/// The error codes the plugin answers with.
///
/// 0–99 are the CNI specification's; 100 and up are free for plugins. ferry's agent
/// answers with codes of its own from 100 (they pass through the plugin unchanged), so
/// the plugin's own start at 200.
pub mod code {
    /// The network configuration's `cniVersion` is one the plugin does not support, or
    /// too old for the command.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// A field of the network configuration the plugin does not support; the message
    /// names the key and its value.
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// The container is unknown: nothing to clean up for it.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// A missing or invalid `CNI_*` environment variable; the message names it.
    pub const INVALID_ENVIRONMENT: u32 = 4;
    /// Reading or writing failed (standard input, the lease directory, the agent's
    /// socket).
    pub const IO_FAILURE: u32 = 5;
    /// Content that does not decode: the network configuration, a `prevResult`, the
    /// agent's answer.
    pub const DECODING_FAILURE: u32 = 6;
    /// A network configuration that decodes but is not valid.
    pub const INVALID_NETWORK_CONFIG: u32 = 7;
    /// A transient condition (the agent not running, the node without pod CIDRs yet):
    /// try again later.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin cannot serve ADD (the node has no pod CIDR yet, or is not in
    /// the agent's cluster state yet).
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    /// STATUS: the plugin cannot serve ADD, and the pods already on the node have
    /// limited connectivity: the agent, whose process carries their traffic, is not
    /// running or its dataplane is not.
    pub const LIMITED_CONNECTIVITY: u32 = 51;
    /// ferry-cni: a pod CIDR has no free address left.
    pub const NO_FREE_ADDRESS: u32 = 200;
    /// ferry-cni: CHECK found the attachment other than `prevResult` says.
    pub const CHECK_FAILED: u32 = 201;
}

/// A failed CNI command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// The CNI error code ([`code`]).
    pub code: u32,
    /// A short message.
    pub msg: String,
    /// What exactly went wrong (may be empty).
    pub details: String,
}

impl Error {
    /// An error with its code, message and details.
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Error {
        Error {
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// The specification's error object, for `cni_version`.
    pub fn to_json(&self, cni_version: &str) -> Value {
        let mut v = json!({
            "cniVersion": cni_version,
            "code": self.code,
            "msg": self.msg,
        });
        if !self.details.is_empty() {
            v["details"] = json!(self.details);
        }
        v
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.msg, self.code)?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

impl From<ferry_api::ApiError> for Error {
    /// The agent's errors carry CNI codes already: they pass through as they are.
    fn from(e: ferry_api::ApiError) -> Error {
        Error::new(e.code, e.msg, e.details)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_error_object_has_the_spec_fields() {
        let e = Error::new(code::INVALID_NETWORK_CONFIG, "bad", "why");
        assert_eq!(
            e.to_json("1.1.0"),
            json!({"cniVersion": "1.1.0", "code": 7, "msg": "bad", "details": "why"})
        );
        let e = Error::new(code::TRY_AGAIN_LATER, "busy", "");
        assert_eq!(
            e.to_json("1.0.0"),
            json!({"cniVersion": "1.0.0", "code": 11, "msg": "busy"})
        );
    }

    #[test]
    fn test_agent_errors_pass_through_unchanged() {
        let api = ferry_api::ApiError {
            code: 104,
            msg: "no such netns".into(),
            details: "/proc/1/ns/net".into(),
        };
        assert_eq!(
            Error::from(api),
            Error::new(104, "no such netns", "/proc/1/ns/net")
        );
    }
}
