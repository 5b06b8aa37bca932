//! The agent's local API: the messages of its Unix socket.
//!
//! The agent listens on a Unix stream socket (default [`DEFAULT_SOCKET`], mode 0600:
//! root only). A client connects, writes one [`Request`] as a JSON object followed by a
//! newline, and reads one [`Response`] the same way; then the connection closes. The CNI
//! plugin asks for pods' interfaces with it; `ferry` subcommands will read state with it.
//!
//! Every request and answer is small and self-contained so that a client written in any
//! language (a shell with `socat`, for instance) can use it.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// Where the agent listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/ferry/ferry.sock";

/// A pod, by namespace and name (CNI_ARGS K8S_POD_NAMESPACE and K8S_POD_NAME).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PodRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// An IP address with the prefix length of its subnet, written `ADDR/LEN`.
pub type Cidr = String;

/// What a client asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// This node's name, pod CIDRs (where pod addresses come from) and pod MTU.
    Node,
    /// Creates the pod's interface: a TAP moved into `netns` as `ifname`, with
    /// `addresses` (chosen by the caller's IPAM from the node's pod CIDRs), the MTU of
    /// the node's pod ports, a MAC derived from the first address, and default routes
    /// through the link-local gateways; the pod gets its port in the node's tables.
    /// Adding the same `container_id` and `ifname` again answers as the first time did.
    Add {
        /// CNI_CONTAINERID.
        container_id: String,
        /// CNI_NETNS: a path, `/var/run/netns/NAME` or `/proc/PID/ns/net`.
        netns: String,
        /// CNI_IFNAME.
        ifname: String,
        /// The pod.
        pod: PodRef,
        /// Its addresses, `ADDR/LEN`.
        addresses: Vec<Cidr>,
    },
    /// Removes what `Add` made for `container_id` and `ifname`. Succeeds when there is
    /// nothing (DEL is idempotent).
    Del {
        /// CNI_CONTAINERID.
        container_id: String,
        /// CNI_IFNAME.
        ifname: String,
    },
    /// Checks that the attachment exists and its interface is as `Add` made it.
    Check {
        /// CNI_CONTAINERID.
        container_id: String,
        /// CNI_IFNAME.
        ifname: String,
        /// CNI_NETNS.
        netns: String,
    },
    /// Whether the agent is ready to add pods.
    Status,
    /// Removes every attachment not in `valid` (CNI GC).
    Gc {
        /// The attachments that must stay.
        valid: Vec<Attachment>,
    },
    /// The dataplane's counters (`ferry status`).
    Counters,
}

/// What the node's dataplane has counted (as of its last snapshot, at most 100 ms old).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Counters {
    /// The generation of the tables in force (1 at start, one more per change).
    pub generation: u64,
    /// Per port, in table order.
    pub ports: Vec<PortCounters>,
    /// Dropped packets by reason (stable snake_case names), reasons with none left out.
    pub drops: std::collections::BTreeMap<String, u64>,
    /// Connections tracked now.
    pub ct_entries: usize,
    /// Connections inserted since start.
    pub ct_inserted: u64,
    /// New connections refused because the table was full.
    pub ct_insert_failed: u64,
    /// Datagrams completed from fragments.
    pub reassembled: u64,
    /// New connections to a Service given an endpoint.
    pub service_balanced: u64,
    /// New connections to a Service refused at once.
    pub service_rejected: u64,
}

/// One port's packet counts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortCounters {
    /// The port's name in the tables.
    pub name: String,
    /// Packets received.
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
}

/// One attachment of a container (CNI's `cni.dev/valid-attachments` entry).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Attachment {
    /// The container.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Its interface.
    pub ifname: String,
}

/// What the agent answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Response {
    /// It went wrong: a CNI error code and messages, which the plugin passes on.
    Error(ApiError),
    /// It worked.
    Ok(Answer),
}

/// A failed request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// The CNI error code (see the CNI specification: 3 unknown container, 4 invalid
    /// environment variables, 5 I/O failure, 7 invalid network configuration, 11 try
    /// again later, 50 the plugin is not available; 100 and up are ferry's).
    pub code: u32,
    /// A short message.
    pub msg: String,
    /// What exactly went wrong.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

/// A successful answer; which fields are set depends on the request. Unknown fields are
/// refused, so that an error answer that does not decode as [`ApiError`] is not taken
/// for a success.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    /// Node: the node's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Node: its pod CIDRs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_cidrs: Vec<Cidr>,
    /// Node and Add: the pods' MTU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u16>,
    /// Add: the interface's MAC, `0a:58:...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Add: the pod's gateways (169.254.1.1, fe80::1), per family present.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<IpAddr>,
    /// Counters: the dataplane's counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<Counters>,
}

impl Response {
    /// An error answer.
    pub fn error(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Response {
        Response::Error(ApiError {
            code,
            msg: msg.into(),
            details: details.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_requests_are_tagged_json_objects() {
        let r = Request::Del {
            container_id: "c1".into(),
            ifname: "eth0".into(),
        };
        let j = serde_json::to_string(&r).unwrap();
        assert_eq!(j, r#"{"op":"del","container_id":"c1","ifname":"eth0"}"#);
        assert_eq!(serde_json::from_str::<Request>(&j).unwrap(), r);
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"status"}"#).unwrap(),
            Request::Status
        );
        assert!(serde_json::from_str::<Request>(r#"{"op":"launch"}"#).is_err());
    }

    #[test]
    fn test_an_error_and_an_answer_are_told_apart() {
        let e: Response = serde_json::from_str(r#"{"code":11,"msg":"busy"}"#).unwrap();
        assert_eq!(e, Response::error(11, "busy", ""));
        assert!(
            serde_json::from_str::<Response>(r#"{"code":"x","msg":"busy"}"#).is_err(),
            "a malformed error is no success"
        );
        let ok: Response = serde_json::from_str(r#"{"mtu":1450}"#).unwrap();
        assert_eq!(
            ok,
            Response::Ok(Answer {
                mtu: Some(1450),
                ..Answer::default()
            })
        );
    }
}
