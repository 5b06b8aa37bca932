//! The CNI specification versions the plugin speaks, and what each allows.
//!
//! 0.4.0 is the oldest supported: it is the first with CHECK, which the plugin serves
//! for every version it speaks. Older configurations are refused rather than half
//! served. STATUS and GC exist from 1.1.0 only, as the specification says.

use crate::env::Command;

/// A supported version of the CNI specification.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    /// 0.4.0: IP configurations carry `"version": "4" | "6"`.
    V0_4_0,
    /// 1.0.0: IP configurations lose their `version`.
    V1_0_0,
    /// 1.1.0: STATUS and GC; interfaces may carry their `mtu`.
    V1_1_0,
}

impl Version {
    /// Every supported version, oldest first (VERSION's `supportedVersions`).
    pub const ALL: [Version; 3] = [Version::V0_4_0, Version::V1_0_0, Version::V1_1_0];

    /// The newest: what VERSION answers in, and what errors use before the request's
    /// version is known.
    pub const LATEST: Version = Version::V1_1_0;

    /// The version named `s`, if supported.
    pub fn parse(s: &str) -> Option<Version> {
        Version::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// Its name, `MAJOR.MINOR.PATCH`.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V0_4_0 => "0.4.0",
            Version::V1_0_0 => "1.0.0",
            Version::V1_1_0 => "1.1.0",
        }
    }

    /// Whether a configuration of this version may carry `command`.
    pub fn allows(self, command: Command) -> bool {
        match command {
            Command::Status | Command::Gc => self >= Version::V1_1_0,
            Command::Add | Command::Del | Command::Check | Command::Version => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_knows_exactly_the_supported_versions() {
        for v in Version::ALL {
            assert_eq!(Version::parse(v.as_str()), Some(v));
        }
        for s in [
            "0.3.1", "0.3.0", "0.2.0", "0.1.0", "1.2.0", "1.1", "", "v1.1.0",
        ] {
            assert_eq!(Version::parse(s), None, "{s}");
        }
        assert_eq!(Version::LATEST, *Version::ALL.last().unwrap());
    }

    #[test]
    fn test_status_and_gc_need_1_1_0() {
        for command in [Command::Status, Command::Gc] {
            assert!(!Version::V0_4_0.allows(command));
            assert!(!Version::V1_0_0.allows(command));
            assert!(Version::V1_1_0.allows(command));
        }
        for v in Version::ALL {
            for command in [Command::Add, Command::Del, Command::Check] {
                assert!(v.allows(command));
            }
        }
    }
}
