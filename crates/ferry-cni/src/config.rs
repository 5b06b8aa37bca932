//! The network configuration on standard input: the plugin's object from the conflist,
//! as the runtime passes it (with `cniVersion`, `name`, and `prevResult`,
//! `runtimeConfig` or `cni.dev/valid-attachments` where the command has them).
//!
//! ferry's own keys:
//!
//! - `socket`: the agent's socket (default [`ferry_api::DEFAULT_SOCKET`]);
//! - `dataDir`: where address leases are kept, one directory per network (default
//!   [`DEFAULT_DATA_DIR`], host-local's).
//!
//! Keys the plugin does not know are ignored, as the specification allows: runtimes
//! and conventions add their own (`args`, `capabilities`, `runtimeConfig` for the
//! capabilities a conflist declares; ferry declares none). A known key with a value the
//! plugin cannot honour is refused: an `ipam` section asking for another IPAM plugin,
//! for instance, since ferry allocates addresses itself.

use std::path::PathBuf;

use ferry_api::Attachment;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, code};
use crate::version::Version;

/// Where leases are kept unless `dataDir` says otherwise (host-local's default).
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// The DNS settings of a network configuration, and of a result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers, in order of preference.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// The local domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Search domains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// A decoded, checked network configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConf {
    /// `cniVersion`: the version the request and its answer are in.
    pub version: Version,
    /// `name`: the network's name, also the lease directory's.
    pub name: String,
    /// `socket`: the agent's socket.
    pub socket: PathBuf,
    /// `dataDir`: the parent of the lease directory.
    pub data_dir: PathBuf,
    /// `dns`: copied into ADD's result.
    pub dns: Dns,
    /// `prevResult` (CHECK, DEL, and ADD when chained after another plugin).
    pub prev_result: Option<Map<String, Value>>,
    /// `cni.dev/valid-attachments` (GC).
    pub valid_attachments: Option<Vec<Attachment>>,
}

/// The keys the plugin reads, typed; everything else is ignored.
#[derive(Deserialize)]
struct Raw {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    socket: Option<String>,
    #[serde(default, rename = "dataDir")]
    data_dir: Option<String>,
    #[serde(default)]
    dns: Option<Dns>,
    #[serde(default)]
    ipam: Option<Map<String, Value>>,
    #[serde(default, rename = "prevResult")]
    prev_result: Option<Map<String, Value>>,
    #[serde(default, rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Vec<Attachment>>,
}

/// The `cniVersion` of a configuration, read before anything else so that a version
/// the plugin does not speak is reported as such, whatever else is wrong.
pub fn version_of(doc: &Map<String, Value>) -> Result<Version, Error> {
    let supported = || {
        let all: Vec<&str> = Version::ALL.iter().map(|v| v.as_str()).collect();
        format!("ferry-cni supports {}", all.join(", "))
    };
    match doc.get("cniVersion") {
        // The specification's first version had no cniVersion: its absence means 0.1.0.
        None => Err(Error::new(
            code::INCOMPATIBLE_VERSION,
            "the network configuration has no cniVersion, which means CNI 0.1.0",
            supported(),
        )),
        Some(Value::String(s)) => Version::parse(s).ok_or_else(|| {
            Error::new(
                code::INCOMPATIBLE_VERSION,
                format!("cniVersion {s:?} is not supported"),
                supported(),
            )
        }),
        Some(other) => Err(Error::new(
            code::DECODING_FAILURE,
            format!("cniVersion is {other}, not a string"),
            "",
        )),
    }
}

/// Decodes standard input into a JSON object.
pub fn parse_object(stdin: &[u8]) -> Result<Map<String, Value>, Error> {
    match serde_json::from_slice::<Value>(stdin) {
        Ok(Value::Object(doc)) => Ok(doc),
        Ok(other) => Err(Error::new(
            code::DECODING_FAILURE,
            "the network configuration is not a JSON object",
            format!("standard input holds {}", kind(&other)),
        )),
        Err(e) => Err(Error::new(
            code::DECODING_FAILURE,
            "the network configuration is not JSON",
            e.to_string(),
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl NetConf {
    /// Decodes and checks standard input.
    pub fn parse(stdin: &[u8]) -> Result<NetConf, Error> {
        NetConf::from_object(parse_object(stdin)?)
    }

    /// Checks a decoded configuration.
    pub fn from_object(doc: Map<String, Value>) -> Result<NetConf, Error> {
        let version = version_of(&doc)?;
        let raw: Raw = serde_path_to_error::deserialize(Value::Object(doc)).map_err(|e| {
            Error::new(
                code::DECODING_FAILURE,
                format!("the network configuration's {} does not decode", e.path()),
                e.inner().to_string(),
            )
        })?;
        let name = raw.name.unwrap_or_default();
        check_network_name(&name)?;
        let socket = absolute_path(
            "socket",
            raw.socket.as_deref().unwrap_or(ferry_api::DEFAULT_SOCKET),
        )?;
        let data_dir = absolute_path(
            "dataDir",
            raw.data_dir.as_deref().unwrap_or(DEFAULT_DATA_DIR),
        )?;
        if let Some((key, value)) = raw.ipam.iter().flatten().next() {
            return Err(Error::new(
                code::UNSUPPORTED_FIELD,
                format!("unsupported field ipam.{key}={value}"),
                "ferry-cni allocates pod addresses itself, from the node's pod CIDRs: \
                 leave ipam out",
            ));
        }
        Ok(NetConf {
            version,
            name,
            socket,
            data_dir,
            dns: raw.dns.unwrap_or_default(),
            prev_result: raw.prev_result,
            valid_attachments: raw.valid_attachments,
        })
    }
}

/// The specification's network name, which also names the lease directory: an
/// alphanumeric first character, then alphanumerics, `_`, `.` and `-`.
fn check_network_name(name: &str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::new(
            code::INVALID_NETWORK_CONFIG,
            "the network configuration has no name",
            "",
        ));
    }
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        return Ok(());
    }
    Err(Error::new(
        code::INVALID_NETWORK_CONFIG,
        format!("network name {name:?} is not valid"),
        "a network name starts with a letter or digit, followed by letters, digits, '_', '.' \
         or '-'",
    ))
}

/// The plugin runs with the runtime's working directory: a relative path would mean
/// something different from one runtime to the next.
fn absolute_path(key: &str, value: &str) -> Result<PathBuf, Error> {
    if value.starts_with('/') {
        return Ok(PathBuf::from(value));
    }
    Err(Error::new(
        code::INVALID_NETWORK_CONFIG,
        format!("{key} {value:?} is not an absolute path"),
        "",
    ))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use super::*;

    fn parse(v: Value) -> Result<NetConf, Error> {
        NetConf::parse(v.to_string().as_bytes())
    }

    #[test]
    fn test_defaults_are_the_agent_socket_and_host_local_data_dir() {
        let c =
            parse(json!({"cniVersion": "1.1.0", "name": "ferry", "type": "ferry-cni"})).unwrap();
        assert_eq!(c.version, Version::V1_1_0);
        assert_eq!(c.name, "ferry");
        assert_eq!(c.socket, Path::new(ferry_api::DEFAULT_SOCKET));
        assert_eq!(c.data_dir, Path::new("/var/lib/cni/networks"));
        assert_eq!(c.dns, Dns::default());
        assert_eq!(c.prev_result, None);
        assert_eq!(c.valid_attachments, None);
    }

    #[test]
    fn test_runtime_keys_are_read_and_unknown_keys_ignored() {
        let c = parse(json!({
            "cniVersion": "1.0.0",
            "name": "ferry",
            "type": "ferry-cni",
            "socket": "/tmp/a.sock",
            "dataDir": "/tmp/leases",
            "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]},
            "prevResult": {"cniVersion": "1.0.0", "ips": []},
            "cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "eth0"}],
            "runtimeConfig": {"portMappings": []},
            "capabilities": {},
            "args": {"cni": {"labels": []}},
            "somethingElse": 42,
            "ipam": {}
        }))
        .unwrap();
        assert_eq!(c.version, Version::V1_0_0);
        assert_eq!(c.socket, Path::new("/tmp/a.sock"));
        assert_eq!(c.data_dir, Path::new("/tmp/leases"));
        assert_eq!(c.dns.nameservers, ["10.96.0.10"]);
        assert_eq!(c.dns.search, ["svc.cluster.local"]);
        assert_eq!(c.prev_result.unwrap()["cniVersion"], "1.0.0");
        assert_eq!(
            c.valid_attachments.unwrap(),
            [Attachment {
                container_id: "c1".into(),
                ifname: "eth0".into()
            }]
        );
    }

    #[test]
    fn test_input_that_is_not_a_json_object_is_code_6() {
        for input in [
            &b""[..],
            b"{",
            b"not json",
            b"[1, 2]",
            b"\"ferry\"",
            b"null",
        ] {
            let e = NetConf::parse(input).unwrap_err();
            assert_eq!(e.code, code::DECODING_FAILURE, "{input:?}");
        }
    }

    #[test]
    fn test_unsupported_or_missing_version_is_code_1() {
        for v in [
            json!({"name": "ferry"}),
            json!({"cniVersion": "0.3.1", "name": "ferry"}),
            json!({"cniVersion": "2.0.0", "name": "ferry"}),
            json!({"cniVersion": "", "name": "ferry"}),
        ] {
            let e = parse(v.clone()).unwrap_err();
            assert_eq!(e.code, code::INCOMPATIBLE_VERSION, "{v}");
            assert_eq!(e.details, "ferry-cni supports 0.4.0, 1.0.0, 1.1.0");
        }
        let e = parse(json!({"cniVersion": 1.1, "name": "ferry"})).unwrap_err();
        assert_eq!(e.code, code::DECODING_FAILURE);
    }

    #[test]
    fn test_version_is_judged_before_the_rest() {
        // A wrong version wins over a missing name or a wrong type.
        let e = parse(json!({"cniVersion": "0.2.0", "dataDir": 5})).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
    }

    #[test]
    fn test_known_key_of_the_wrong_type_is_code_6_naming_the_key() {
        for (v, path) in [
            (json!({"socket": 5}), "socket"),
            (json!({"dataDir": ["/a"]}), "dataDir"),
            (
                json!({"dns": {"nameservers": "1.1.1.1"}}),
                "dns.nameservers",
            ),
            (json!({"prevResult": []}), "prevResult"),
            (
                json!({"cni.dev/valid-attachments": [{"containerID": "a"}]}),
                "cni.dev/valid-attachments[0]",
            ),
        ] {
            let mut v = v;
            v["cniVersion"] = json!("1.1.0");
            v["name"] = json!("ferry");
            let e = parse(v.clone()).unwrap_err();
            assert_eq!(e.code, code::DECODING_FAILURE, "{v}");
            assert!(e.msg.contains(path), "{v}: {e}");
        }
    }

    #[test]
    fn test_missing_or_bad_name_is_code_7() {
        for name in [
            json!(null),
            json!(""),
            json!("../etc"),
            json!("a/b"),
            json!("-x"),
        ] {
            let mut v = json!({"cniVersion": "1.1.0", "name": name.clone()});
            if name.is_null() {
                v.as_object_mut().unwrap().remove("name");
            }
            let e = parse(v).unwrap_err();
            assert_eq!(e.code, code::INVALID_NETWORK_CONFIG, "{name}");
        }
        for good in ["ferry", "k8s-pod-network", "net_1.v2"] {
            assert!(parse(json!({"cniVersion": "1.1.0", "name": good})).is_ok());
        }
    }

    #[test]
    fn test_relative_paths_are_code_7() {
        for key in ["socket", "dataDir"] {
            let mut v = json!({"cniVersion": "1.1.0", "name": "ferry"});
            v[key] = json!("run/ferry.sock");
            let e = parse(v).unwrap_err();
            assert_eq!(e.code, code::INVALID_NETWORK_CONFIG);
            assert!(e.msg.starts_with(key), "{e}");
        }
    }

    #[test]
    fn test_an_ipam_section_is_an_unsupported_field_code_2() {
        let e = parse(json!({
            "cniVersion": "1.1.0",
            "name": "ferry",
            "ipam": {"type": "host-local"}
        }))
        .unwrap_err();
        assert_eq!(e.code, code::UNSUPPORTED_FIELD);
        // The specification wants the key and its value in the message.
        assert_eq!(e.msg, "unsupported field ipam.type=\"host-local\"");
    }
}
