//! The agent's local API: the messages of its Unix socket.
//!
//! The agent listens on a Unix stream socket (default [`DEFAULT_SOCKET`], mode 0600:
//! root only). A client connects, writes one [`Request`] as a JSON object followed by a
//! newline, and reads one [`Response`] the same way; then the connection closes. The CNI
//! plugin asks for pods' interfaces with it; `ferry status`, `ferry conntrack` and
//! `ferry services` read the node's state with it.
//!
//! Every request and answer is small and self-contained so that a client written in any
//! language (a shell with `socat`, for instance) can use it.
#![forbid(unsafe_code)]

use std::net::IpAddr;
use std::path::{Path, PathBuf};

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
    /// Lists the tracked connections that `filter` selects (`ferry conntrack list`), or
    /// deletes them (`ferry conntrack delete`).
    Conntrack {
        /// Which connections; every field left out matches all.
        #[serde(default)]
        filter: CtFilter,
        /// Delete the selected connections instead of listing them.
        #[serde(default)]
        delete: bool,
        /// Most entries listed (default [`DEFAULT_CT_LIMIT`]); the answer says when
        /// more matched. Not used when deleting.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<usize>,
    },
    /// Every Service port the node's tables hold, with frontends, policies and endpoints
    /// (`ferry services`).
    Services,
    /// The NetworkPolicies and ClusterNetworkPolicies in force (`ferry policy list`), or,
    /// with `pod`, the rules that apply to that pod after selectors, namespaces and named
    /// ports are resolved, in the order they are evaluated (`ferry policy explain`).
    /// Answers [`Answer::policy`].
    Policy {
        /// `NAMESPACE/NAME` of a pod of the cluster (on any node).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pod: Option<String>,
    },
    /// What putting the NetworkPolicies, ClusterNetworkPolicies and Namespaces of
    /// `manifests` in force (or, with `delete`, deleting them) would do to the tracked
    /// connections of this node: those the new policy would not allow
    /// (`ferry policy preview`). Nothing changes. Answers [`Answer::policy`] with
    /// [`PolicyAnswer::preview`].
    PolicyPreview {
        /// The manifests (YAML), as a file would hold them.
        manifests: String,
        /// Preview deleting these objects instead.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        delete: bool,
    },
    /// Traces one described packet, or a few frames, through the node's live tables and
    /// a copy of its live connection state, without sending anything or changing any
    /// state (`ferry trace`). Answers [`Answer::trace`].
    Trace {
        /// Where the packet comes in: a port name, or `pod NAMESPACE/NAME`.
        in_port: String,
        /// A described packet, such as `tcp 10.0.1.5:40000 -> 10.96.0.10:80 syn`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        packet: Option<String>,
        /// Ethernet frames, hex-encoded (from a pcap, say), traced in order.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        frames: Option<Vec<String>>,
        /// Trace the reply the other side would send as well.
        #[serde(default)]
        reply: bool,
    },
    /// Starts recording what the node does with the next `count` real packets that
    /// `filter` selects (`ferry trace --live`); replaces a live trace already running.
    /// Answers the session's id ([`Answer::session`]). Read with [`Request::TraceRead`];
    /// a live trace nobody reads for 30 s is stopped.
    TraceStart {
        /// Which packets, in ferry's packet filter syntax (docs/filter.md).
        filter: String,
        /// How many packets to record (at most 10000).
        count: usize,
    },
    /// The packets the live trace recorded since the last read ([`Answer::traced`]) and
    /// how many it still waits for ([`Answer::remaining`]). Refused with
    /// [`ERR_REPLACED`] when `session` is no longer the one running.
    TraceRead {
        /// The id [`Request::TraceStart`] answered; without it, the live trace running,
        /// whoever started it (clients older than session ids).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<u64>,
    },
    /// Stops the live trace; answers what it recorded and was not read yet. Refused with
    /// [`ERR_REPLACED`], stopping nothing, when `session` is no longer the one running.
    TraceStop {
        /// As for [`Request::TraceRead`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<u64>,
    },
    /// Starts capturing the frames of a port (`ferry capture`); replaces a capture
    /// already running. Answers the session's id ([`Answer::session`]). Read with
    /// [`Request::CaptureRead`]; a capture nobody reads for 30 s is stopped.
    CaptureStart {
        /// The port's name, or `pod NAMESPACE/NAME`.
        port: String,
        /// Which frames, in ferry's packet filter syntax; empty for all.
        filter: String,
    },
    /// The frames captured since the last read ([`Answer::captured`]) and how many were
    /// lost since ([`Answer::lost`]). Refused with [`ERR_REPLACED`] when `session` is no
    /// longer the one running.
    CaptureRead {
        /// The id [`Request::CaptureStart`] answered; without it, the capture running,
        /// whoever started it (clients older than session ids).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<u64>,
    },
    /// Stops the capture; answers what it captured and was not read yet. Refused with
    /// [`ERR_REPLACED`], stopping nothing, when `session` is no longer the one running.
    CaptureStop {
        /// As for [`Request::CaptureRead`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<u64>,
    },
    /// Asks the running agent to hand its ports, listeners and connection state over to
    /// the asking agent, a new `ferry agent` on the same node. No answer line follows:
    /// the connection carries the handover's own messages and descriptors from then on
    /// (see the agent's `handover` module); an agent that cannot hand over answers an
    /// error line as to any request.
    Handover {
        /// The asking agent's version, for the logs.
        version: String,
        /// Its process id, for the logs.
        pid: u32,
        /// It takes the state as a pre-copy: a base saved while the running agent
        /// forwards, then the changes since (absent: one state, as agents before the
        /// pre-copy ask).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        precopy: bool,
    },
}

/// The error code of a request the agent cannot serve as things are, for a reason of
/// its own (the pod already has an interface from another container; the Node object is
/// bad; CHECK: the pod has no port in the tables in force).
pub const ERR_AGENT: u32 = 100;
/// The error code of a request whose fields are bad (a filter that does not parse, a
/// pod address that is not ADDR/LEN).
pub const ERR_BAD_REQUEST: u32 = 102;
/// The error code of a request the dataplane's worker did not answer (stopped, or not
/// in time).
pub const ERR_WORKER: u32 = 103;
/// The error code of an `add` or `del` whose tables do not compile (an address of the
/// pod belongs to another pod): trying again does not help until the cluster changes.
pub const ERR_TABLES: u32 = 104;
/// The error code of an `add` or `del` whose pod interface could not be made or opened
/// (a TAP not created, not moved into the pod's namespace).
pub const ERR_INTERFACE: u32 = 105;
/// The error code of a live trace or capture read or stop whose session is no longer the
/// one running: another client started one since (one of each runs per node, the newest).
pub const ERR_REPLACED: u32 = 106;

/// The directory where a CNI plugin that finds no agent at `socket` queues its DELs:
/// the socket's path with [`DEL_QUEUE_SUFFIX`] appended (`/run/ferry/ferry.sock.del-queue` by
/// default), so that the plugin and the agent derive it from the one setting they share.
///
/// Each entry is one file holding the [`Request::Del`] the plugin could not send, as
/// JSON, named [`del_queue_name`]; the agent carries the entries out when it starts
/// (before it adopts its recorded attachments) and while it runs, then removes them.
/// Names starting with `.` are files being written.
pub fn del_queue_dir(socket: &Path) -> PathBuf {
    let mut dir = socket.as_os_str().to_os_string();
    dir.push(DEL_QUEUE_SUFFIX);
    PathBuf::from(dir)
}

/// What [`del_queue_dir`] appends to the socket's path.
pub const DEL_QUEUE_SUFFIX: &str = ".del-queue";

/// The name of the queue file of a DEL of `container_id` on `ifname`: one file per
/// attachment, so that a DEL queued twice is one entry. The CNI specification's
/// container IDs (letters, digits, `_`, `.`, `-`, starting with a letter or digit) and
/// interface names (no `/`, `:` or white space) make `ID:IFNAME.json` a file name of its
/// own for each attachment; an ID too long for a file name is cut short and a hash of
/// the whole of it appended.
pub fn del_queue_name(container_id: &str, ifname: &str) -> String {
    // 255 bytes in a name, less ":", the interface name (at most 15) and ".json".
    const MAX_ID: usize = 255 - 1 - 15 - 5;
    if container_id.len() <= MAX_ID {
        return format!("{container_id}:{ifname}.json");
    }
    // FNV-1a: stable across builds, which is all that is needed here.
    let hash = container_id
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    let mut cut = MAX_ID - 17;
    while !container_id.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{hash:016x}:{ifname}.json", &container_id[..cut])
}

/// How many connections a [`Request::Conntrack`] lists unless told otherwise.
pub const DEFAULT_CT_LIMIT: usize = 10_000;

/// Which tracked connections a [`Request::Conntrack`] selects: all the fields given must
/// match.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CtFilter {
    /// The conntrack zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<u16>,
    /// An address on either side of either tuple (a Service's address and its
    /// endpoint's both select a DNAT connection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<IpAddr>,
    /// A TCP or UDP port on either side of either tuple.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The protocol: `tcp`, `udp`, `icmp`, `icmpv6` or a protocol number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proto: Option<String>,
    /// The TCP state as `conntrack -L` prints it (`ESTABLISHED`, `TIME_WAIT`...; any
    /// case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The conntrack mark.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mark: Option<u32>,
}

impl CtFilter {
    /// True when no field is given (the filter selects every connection).
    pub fn is_empty(&self) -> bool {
        *self == CtFilter::default()
    }
}

/// New connections one policy decided, by direction and verdict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyCounters {
    /// New connections to its pods that a rule of it allowed.
    pub ingress_allowed: u64,
    /// New connections to its pods that it denied (a rule of it, or its isolation).
    pub ingress_denied: u64,
    /// New connections from its pods that a rule of it allowed.
    pub egress_allowed: u64,
    /// New connections from its pods that it denied.
    pub egress_denied: u64,
}

/// What the audit log of denied connections counted (`ferry agent --policy-audit-log`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyAuditCounters {
    /// Lines written for denied connections.
    pub logged: u64,
    /// Denials not logged as repeats of a connection logged (its first packet
    /// retransmitted).
    pub repeated: u64,
    /// Denials not logged: over the rate limit.
    pub suppressed_rate: u64,
    /// Denials not logged: the dataplane's buffer of denials was full.
    pub suppressed_overflow: u64,
    /// Lines that could not be written.
    pub write_errors: u64,
}

/// What a ferry binary was built from and how.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildInfo {
    /// The release (the workspace's version).
    pub version: String,
    /// The commit built, 40 hexadecimal digits; `unknown` when the sources were not a
    /// git checkout.
    pub commit: String,
    /// The checkout had changes that no commit holds.
    pub dirty: bool,
    /// `release` or `debug` (debug assertions on).
    pub profile: String,
    /// The target triple.
    pub target: String,
    /// The compiler's version.
    pub rustc: String,
}

impl BuildInfo {
    /// One line: `ferry VERSION (commit C[, dirty], PROFILE, TARGET, rustc V)`.
    pub fn line(&self) -> String {
        format!(
            "ferry {} (commit {}{}, {}, {}, rustc {})",
            self.version,
            self.commit,
            if self.dirty { ", dirty" } else { "" },
            self.profile,
            self.target,
            self.rustc
        )
    }
}

/// What the node's dataplane has counted (as of its last snapshot, at most 100 ms old).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Counters {
    /// The agent's build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<BuildInfo>,
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
    /// New connections to a Service's load balancer IPs refused by its
    /// loadBalancerSourceRanges, by Service port (`namespace/name:port`), those that
    /// refused any.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub service_source_denied: std::collections::BTreeMap<String, u64>,
    /// Segments from a Service endpoint of no tracked connection translated back as
    /// replies through the frontend that chose the endpoint (connections recovered after
    /// their entries were lost).
    #[serde(default)]
    pub ct_recovered: u64,
    /// Frontends tried for those that the client refused or left unanswered.
    #[serde(default)]
    pub ct_recovery_refuted: u64,
    /// Packets waiting now for their next hop's MAC (sent once it answers).
    #[serde(default)]
    pub neigh_waiting: u64,
    /// Packets that waited for their next hop's MAC, since start.
    #[serde(default)]
    pub neigh_queued: u64,
    /// Datagrams whose fragments are held now, waiting for the rest (failed datagrams'
    /// markers included).
    #[serde(default)]
    pub fragments_held: u64,
    /// Bytes of fragments held now.
    #[serde(default)]
    pub fragment_bytes_held: u64,
    /// Held fragments discarded because their datagram timed out (IPv4 and IPv6).
    #[serde(default)]
    pub fragments_expired: u64,
    /// Fragments refused or discarded, by reason (`too_small`, `overlapped`,
    /// `table_full`, `too_many`, `invalid`; IPv4 and IPv6 together).
    #[serde(default)]
    pub fragments_refused: std::collections::BTreeMap<String, u64>,
    /// Source NAT ports (and ICMP identifiers) in use now.
    #[serde(default)]
    pub nat_ports_in_use: u64,
    /// Per worker thread, by worker number.
    #[serde(default)]
    pub workers: Vec<WorkerCounters>,
    /// Directions of new connections that a policy rule allowed.
    #[serde(default)]
    pub policy_allowed: u64,
    /// Directions of new connections that policy denied.
    #[serde(default)]
    pub policy_denied: u64,
    /// New connections decided per policy (`NetworkPolicy NS/NAME` or
    /// `ClusterNetworkPolicy NAME`), those of policies this node's pods have met.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub policies: std::collections::BTreeMap<String, PolicyCounters>,
    /// The audit log of denied connections, when it is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_audit: Option<PolicyAuditCounters>,
    /// Where the cluster state comes from, and whether it is in force.
    #[serde(default)]
    pub datastore: DatastoreHealth,
    /// How long cluster changes took to be in force in the worker.
    #[serde(default)]
    pub sync: SyncLatency,
    /// How long EndpointSlice changes took from the API server (their
    /// `endpoints.kubernetes.io/last-change-trigger-time`) to be in force in the worker.
    #[serde(default)]
    pub programming: SyncLatency,
    /// The agent's errors by kind.
    #[serde(default)]
    pub errors: AgentErrors,
    /// The policies in force, and those not enforced as written.
    #[serde(default)]
    pub enforcement: PolicyEnforcement,
}

/// The policies in force, and each one ferry does not enforce as its object says: never
/// failing open silently.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyEnforcement {
    /// NetworkPolicies in force.
    pub network_policies: u64,
    /// ClusterNetworkPolicies in force.
    pub cluster_network_policies: u64,
    /// The policies not enforced as written, by kind and name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unenforced: Vec<UnenforcedPolicy>,
    /// Why the policies in force may be older than the datastore's latest word, when
    /// they may (the file datastore refuses its directory, a state is not in force yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale: Option<String>,
}

/// A policy that is not enforced as its object says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnenforcedPolicy {
    /// `NetworkPolicy` or `ClusterNetworkPolicy`.
    pub kind: String,
    /// `NS/NAME` (a NetworkPolicy) or `NAME`.
    pub policy: String,
    /// What is enforced of it.
    pub state: Enforcement,
    /// The version enforced, when one is (`resourceVersion 41, generation 2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforced_version: Option<String>,
    /// The version not enforced, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_version: Option<String>,
    /// Why, one line each (a refused field: `spec.podSelector...: what is wrong`).
    pub reasons: Vec<String>,
}

/// What is enforced of a policy that is not enforced as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    /// Nothing: no version of it is in force (its first version was refused).
    NotEnforced,
    /// An older version of it (its latest was refused, or is not in force yet).
    OlderVersion,
    /// It was deleted, and is still in force (the state without it is not in force yet).
    StillEnforced,
    /// It is in force, and enforced otherwise than it says in part (a peer ferry does
    /// not know, failing closed).
    Deviation,
}

impl Enforcement {
    /// The stable name (`not_enforced`, `older_version`, `still_enforced`,
    /// `deviation`), as JSON and the metrics write it.
    pub fn name(self) -> &'static str {
        match self {
            Enforcement::NotEnforced => "not_enforced",
            Enforcement::OlderVersion => "older_version",
            Enforcement::StillEnforced => "still_enforced",
            Enforcement::Deviation => "deviation",
        }
    }
}

impl std::fmt::Display for Enforcement {
    /// As `ferry status` says it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Enforcement::NotEnforced => "NOT enforced",
            Enforcement::OlderVersion => "an older version enforced",
            Enforcement::StillEnforced => "deleted, still enforced",
            Enforcement::Deviation => "enforced with a deviation",
        })
    }
}

/// The datastore's health as the agent sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatastoreHealth {
    /// `file` or `kubernetes`.
    pub kind: String,
    /// The manifest directory, or the API server's URL (the kubeconfig's path when the
    /// URL is not known).
    pub source: String,
    /// The datastore's last word was a good state, and it is in force.
    pub synced: bool,
    /// When a state from the datastore was last put in force (Unix time, ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_unix_ms: Option<u64>,
    /// When the datastore read the state in force (Unix time, ms): every change made
    /// before then is in force. The file datastore's time is that of the directory scan
    /// that found the manifests steady.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_read_unix_ms: Option<u64>,
    /// The last refusal or watch error, kept after the datastore recovers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Refusals and watch errors since start.
    pub errors_total: u64,
}

/// Table sync latency: from a cluster change reaching the agent to the worker using the
/// tables made from it (compilation plus the wait for the worker).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncLatency {
    /// Changes put in force since start.
    pub count: u64,
    /// Their latencies added up, in microseconds.
    pub sum_us: u64,
    /// The last one, in microseconds.
    pub last_us: u64,
    /// The largest one, in microseconds.
    pub max_us: u64,
    /// A histogram: (upper bound in microseconds, changes in this bucket and not in a
    /// lower one), bounds rising, the last one `u64::MAX` (+Inf).
    #[serde(default)]
    pub buckets: Vec<(u64, u64)>,
}

/// The agent's errors since start, by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentErrors {
    /// The datastore refused a state or reported a watch error.
    pub datastore: u64,
    /// A cluster state did not compile into tables (the tables in force stayed).
    pub compile: u64,
    /// The worker did not take new tables, or a port could not be opened.
    pub apply: u64,
    /// API requests answered with an error.
    pub api: u64,
}

/// One worker thread's counts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerCounters {
    /// Frames the worker received from its ports' queues.
    pub rx_frames: u64,
    /// Frames the worker handed to ports for sending.
    pub tx_frames: u64,
    /// Rounds of the worker's loop.
    #[serde(default)]
    pub rounds: u64,
    /// Rounds that polled without sleeping (busy polling, `--busy-poll`).
    #[serde(default)]
    pub busy_rounds: u64,
    /// Frames dropped on the way out: their port could not take them without blocking,
    /// or was out of service.
    #[serde(default)]
    pub tx_dropped: u64,
    /// Pod ports the worker took out of service because their device went away.
    #[serde(default)]
    pub ports_gone: u64,
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
    /// Packets received on this port that were dropped, by reason (reasons with none
    /// left out).
    #[serde(default)]
    pub drops: std::collections::BTreeMap<String, u64>,
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
#[expect(
    clippy::large_enum_variant,
    reason = "one answer per API connection: its size does not matter"
)]
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
    /// environment variables (a bad network namespace), 11 try again later (only for
    /// what passes by itself), 50 the plugin is not available; 100 and up are ferry's,
    /// [`ERR_AGENT`] to [`ERR_INTERFACE`]). `docs/cni.md` lists which answer gets which.
    pub code: u32,
    /// A short message.
    pub msg: String,
    /// What exactly went wrong.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl ApiError {
    /// An error with `code`, a short message and what exactly went wrong.
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> ApiError {
        ApiError {
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }
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
    /// Counters: the dataplane's counters (boxed: the largest answer, kept out of the
    /// others' way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<Box<Counters>>,
    /// Conntrack: the connections listed, or how many were deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conntrack: Option<CtAnswer>,
    /// Services: every Service of the tables in force, by namespace and name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<Vec<ServiceInfo>>,
    /// Policy: the policies in force, or a pod's rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyAnswer>,
    /// Trace: the report, one pass per packet then the reply, and the way back (the
    /// `TraceReport` of ferry's datapath, docs/observability.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<serde_json::Value>,
    /// TraceRead and TraceStop: the packets recorded since the last read, each with its
    /// stages, verdict and what was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traced: Option<Vec<serde_json::Value>>,
    /// TraceStart and CaptureStart: the session's id, for its reads and stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<u64>,
    /// TraceRead: how many packets the live trace still waits for (0: done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining: Option<usize>,
    /// CaptureRead and CaptureStop: the frames captured since the last read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub captured: Option<Vec<CapturedFrame>>,
    /// CaptureRead and CaptureStop: frames lost since the last read because the agent's
    /// buffer was full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<u64>,
}

/// One captured frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapturedFrame {
    /// When it was received (or, sent, when the frame it was made from was received),
    /// in nanoseconds since the epoch.
    pub time_unix_ns: u64,
    /// `in` (received by ferry) or `out` (sent by ferry).
    pub dir: String,
    /// The port it was received on or sent to.
    pub port: String,
    /// Where it was seen: `received on PORT` (before any rewriting), `after ferry: to
    /// PORT (received on PORT)`, or `sent on PORT`.
    pub note: String,
    /// The Ethernet frame, hex-encoded.
    pub data: String,
}

/// What a [`Request::Conntrack`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CtAnswer {
    /// The connections listed, in table order (none when deleting).
    #[serde(default)]
    pub entries: Vec<CtEntry>,
    /// How many connections matched (listed or not).
    pub matched: usize,
    /// More matched than the limit: `entries` holds the first `limit`.
    #[serde(default)]
    pub truncated: bool,
    /// How many were deleted (0 when listing).
    #[serde(default)]
    pub deleted: usize,
}

/// One tracked connection.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CtEntry {
    /// The protocol's name (`tcp`, `udp`, `icmp`, `icmpv6`, or `ip` for others).
    pub proto: String,
    /// The IP protocol number.
    pub proto_num: u8,
    /// The conntrack zone.
    pub zone: u16,
    /// The tuple of the first packet, as it arrived.
    pub original: CtTuple,
    /// The tuple replies carry as they arrive: the reverse of the original after NAT
    /// (after DNAT to a Service's endpoint its source is the endpoint).
    pub reply: CtTuple,
    /// The TCP state (`ESTABLISHED`, ...), for TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_state: Option<String>,
    /// Status flags: `seen_reply`, `assured`, `dnat`, `snat`.
    #[serde(default)]
    pub status: Vec<String>,
    /// Seen both ways enough to be kept (never evicted to make room).
    pub assured: bool,
    /// No reply seen yet.
    pub unreplied: bool,
    /// Seconds until the entry expires unless a packet refreshes it.
    pub secs_left: u64,
    /// The conntrack mark (bit 0: load balanced to a Service endpoint; bit 1: sent
    /// through the tunnel with the client's address kept).
    pub mark: u32,
    /// The node the original direction came from through the overlay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel_peer: Option<IpAddr>,
    /// Packets in the original direction.
    pub packets_original: u64,
    /// Packets in the reply direction.
    pub packets_reply: u64,
    /// Bytes (whole IP packets) in the original direction.
    pub bytes_original: u64,
    /// Bytes in the reply direction.
    pub bytes_reply: u64,
    /// The connection as one `conntrack -L` style line.
    pub line: String,
}

/// One direction's tuple of a tracked connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CtTuple {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port (TCP and UDP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sport: Option<u16>,
    /// Destination port (TCP and UDP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dport: Option<u16>,
    /// ICMP type (ICMP and ICMPv6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp_type: Option<u8>,
    /// ICMP code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp_code: Option<u8>,
    /// ICMP echo identifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp_id: Option<u16>,
}

impl Default for CtTuple {
    fn default() -> CtTuple {
        let any = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
        CtTuple {
            src: any,
            dst: any,
            sport: None,
            dport: None,
            icmp_type: None,
            icmp_code: None,
            icmp_id: None,
        }
    }
}

/// What [`Request::Policy`] answers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyAnswer {
    /// The policies in force, ClusterNetworkPolicies first (by tier, priority and
    /// name), then NetworkPolicies by namespace and name.
    #[serde(default)]
    pub policies: Vec<PolicyInfo>,
    /// With `pod`: its rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodPolicyInfo>,
    /// A preview's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<PolicyPreview>,
    /// The list's: what `ferry status` says of the policies in force and of those not
    /// enforced as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforcement: Option<PolicyEnforcement>,
}

/// What a policy change would do to the tracked connections of the node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyPreview {
    /// The objects the change puts in force (or deletes), `Kind NS/NAME`.
    pub objects: Vec<String>,
    /// Whether the node ends such connections when the change comes
    /// (`policy-on-change: reevaluate`) or keeps them (`keep`, the default).
    pub reevaluate: bool,
    /// The tracked connections the changed policy would not allow.
    pub cut: Vec<PolicyCutInfo>,
}

/// A tracked connection a policy change would not allow.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyCutInfo {
    /// Its original tuple (`tcp 10.244.1.5:40000 -> 10.96.0.10:80`).
    pub original: String,
    /// Its reply tuple.
    pub reply: String,
    /// The denial, as `ferry trace` prints it.
    pub denial: String,
}

/// A policy in force.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyInfo {
    /// `NetworkPolicy NS/NAME` or `ClusterNetworkPolicy NAME`.
    pub name: String,
    /// ClusterNetworkPolicy: `admin` or `baseline`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// ClusterNetworkPolicy: its priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u16>,
    /// NetworkPolicy: the directions it isolates (`ingress`, `egress`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub isolates: Vec<String>,
    /// Its rules, ingress then egress.
    pub rules: usize,
    /// The pods of this node it applies to, `NS/NAME`.
    #[serde(default)]
    pub local_pods: Vec<String>,
    /// What of it ferry does not enforce as written (a peer of a field unknown to
    /// ferry, failing closed), one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// The rules that apply to one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodPolicyInfo {
    /// `NS/NAME`.
    pub pod: String,
    /// Its node, when the Pod says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Its addresses.
    #[serde(default)]
    pub addresses: Vec<std::net::IpAddr>,
    /// Ingress, then egress.
    pub directions: Vec<DirectionInfo>,
    /// What else decides its traffic (a host-network pod, the node's own stack), one
    /// line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// One direction of a pod's rules, in evaluation order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectionInfo {
    /// `ingress` or `egress`.
    pub direction: String,
    /// The NetworkPolicies isolating the pod in this direction: with any, what no rule
    /// of the NetworkPolicy tier allows is denied (and the Baseline tier is not asked).
    #[serde(default)]
    pub isolated_by: Vec<String>,
    /// The rules: the Admin tier's, the NetworkPolicy tier's, the Baseline tier's.
    #[serde(default)]
    pub rules: Vec<RuleInfo>,
}

/// One rule as the datapath holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleInfo {
    /// `admin`, `network_policy` or `baseline`.
    pub tier: String,
    /// Its policy's name.
    pub policy: String,
    /// The rule's own name (`ingress[0]`, `ingress rule NAME`).
    pub rule: String,
    /// `accept`, `deny` or `pass`.
    pub action: String,
    /// Its matches: each peers (address blocks; absent: every peer) on ports (empty:
    /// every port and protocol). None at all: the rule matches nothing.
    #[serde(default)]
    pub matches: Vec<MatchInfo>,
}

/// Peers and ports of a rule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatchInfo {
    /// Address blocks (`10.0.0.0/8 except 10.1.0.0/16`, a pod's `/32`); absent: every
    /// peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers: Option<Vec<String>>,
    /// `tcp/80`, `udp/1000-2000`, `sctp` (every port); empty: every port and protocol.
    #[serde(default)]
    pub ports: Vec<String>,
}

/// A Service as the node's tables hold it: its ports, each compiled on its own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceInfo {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its ports, in tables order.
    pub ports: Vec<ServicePortInfo>,
}

/// One port of a Service: where it is reached, how endpoints are chosen, and the
/// endpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicePortInfo {
    /// The port's name, or its number when unnamed (the part after `:` of the tables
    /// entry `namespace/name:port`).
    pub port_name: String,
    /// `tcp` or `udp`.
    pub proto: String,
    /// Where it is reached.
    pub frontends: Vec<FrontendInfo>,
    /// internalTrafficPolicy: `cluster` or `local` (cluster IP traffic).
    pub internal_policy: String,
    /// externalTrafficPolicy: `cluster` or `local` (node port, external and load
    /// balancer traffic).
    pub external_policy: String,
    /// ClientIP session affinity: its timeout in seconds, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_timeout_s: Option<u32>,
    /// The only sources of new connections to its load balancer IPs
    /// (loadBalancerSourceRanges, with the load balancer IPs the node may reach them
    /// from); a family without any accepts every source.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_ranges: Vec<String>,
    /// External traffic to another node's endpoint leaves with this node's address.
    #[serde(default)]
    pub external_snat: bool,
    /// How new connections choose their endpoint: `consistent` or `maglev` (consistent
    /// hashing, the same choice on every node with the same seed) or `random`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub balance: String,
    /// The seed of a consistent balance (`consistent` or `maglev`).
    #[serde(
        default,
        alias = "maglev_seed",
        skip_serializing_if = "Option::is_none"
    )]
    pub seed: Option<u64>,
    /// When the set of all its endpoints is chosen from by a Maglev table (`maglev`, or
    /// `consistent` past the endpoints rendezvous hashing serves): the table's size (a
    /// prime over 100 times their number; the tables of the endpoints one address family
    /// or traffic policy may choose are no larger).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maglev_table: Option<u32>,
    /// The endpoints.
    pub endpoints: Vec<EndpointInfo>,
    /// Connections tracked now that this node balanced to this Service port; None when
    /// the worker did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<u64>,
}

/// One place a Service port is reached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrontendInfo {
    /// `cluster_ip`, `node_port`, `external_ip` or `load_balancer_ip`.
    pub kind: String,
    /// The address; none for a node port (reached on every address of the node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<IpAddr>,
    /// The port.
    pub port: u16,
    /// `tcp` or `udp`.
    pub proto: String,
    /// Which traffic policy applies: `internal` (cluster IPs) or `external`.
    pub scope: String,
}

/// One endpoint of a Service port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointInfo {
    /// Its address.
    pub address: IpAddr,
    /// Its port.
    pub port: u16,
    /// Its node, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// On this node.
    pub local: bool,
    /// conditions.ready.
    pub ready: bool,
    /// conditions.serving.
    pub serving: bool,
    /// conditions.terminating.
    pub terminating: bool,
    /// Connections tracked now that this node balanced to it (any Service port); None
    /// when the worker did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<u64>,
}

impl Response {
    /// An error answer.
    pub fn error(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Response {
        Response::Error(ApiError::new(code, msg, details))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_del_queue_is_next_to_the_socket_one_file_per_attachment() {
        assert_eq!(
            del_queue_dir(Path::new(DEFAULT_SOCKET)),
            Path::new("/run/ferry/ferry.sock.del-queue")
        );
        assert_eq!(del_queue_name("c0ffee", "eth0"), "c0ffee:eth0.json");
        assert_ne!(del_queue_name("a", "b.c"), del_queue_name("a.b", "c"));
        let long = "x".repeat(300);
        let name = del_queue_name(&long, "eth0");
        assert!(name.len() <= 255, "{}", name.len());
        assert!(name.ends_with(":eth0.json"), "{name}");
        let mut other = long.clone();
        other.push('y');
        assert_ne!(name, del_queue_name(&other, "eth0"));
        assert_eq!(
            del_queue_name(&long, "eth0"),
            name,
            "the same name each time"
        );
        assert!(del_queue_name(&long, "fifteen-bytes-x").len() <= 255);
    }

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

    fn round_trip(r: &Request, json: &str) {
        assert_eq!(serde_json::to_string(r).unwrap(), json);
        assert_eq!(&serde_json::from_str::<Request>(json).unwrap(), r);
    }

    #[test]
    fn test_conntrack_requests() {
        round_trip(
            &Request::Conntrack {
                filter: CtFilter {
                    addr: Some("10.96.0.10".parse().unwrap()),
                    proto: Some("tcp".into()),
                    state: Some("ESTABLISHED".into()),
                    ..CtFilter::default()
                },
                delete: false,
                limit: Some(5),
            },
            r#"{"op":"conntrack","filter":{"addr":"10.96.0.10","proto":"tcp","state":"ESTABLISHED"},"delete":false,"limit":5}"#,
        );
        // Everything but the op may be left out: list every connection.
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"conntrack"}"#).unwrap(),
            Request::Conntrack {
                filter: CtFilter::default(),
                delete: false,
                limit: None
            }
        );
        assert!(
            serde_json::from_str::<Request>(r#"{"op":"conntrack","filter":{"adress":"1.2.3.4"}}"#)
                .is_err(),
            "a misspelt filter field is no empty filter"
        );
        assert!(CtFilter::default().is_empty());
        round_trip(&Request::Services, r#"{"op":"services"}"#);
        round_trip(&Request::Policy { pod: None }, r#"{"op":"policy"}"#);
        round_trip(
            &Request::Policy {
                pod: Some("x/a".into()),
            },
            r#"{"op":"policy","pod":"x/a"}"#,
        );
        round_trip(
            &Request::PolicyPreview {
                manifests: "kind: NetworkPolicy".into(),
                delete: true,
            },
            r#"{"op":"policy_preview","manifests":"kind: NetworkPolicy","delete":true}"#,
        );
    }

    #[test]
    fn test_trace_and_capture_requests() {
        round_trip(
            &Request::Trace {
                in_port: "pod default/client".into(),
                packet: Some("tcp 10.0.1.5:40000 -> 10.96.0.10:80 syn".into()),
                frames: None,
                reply: true,
            },
            r#"{"op":"trace","in_port":"pod default/client","packet":"tcp 10.0.1.5:40000 -> 10.96.0.10:80 syn","reply":true}"#,
        );
        round_trip(
            &Request::Trace {
                in_port: "uplink".into(),
                packet: None,
                frames: Some(vec!["ffffffffffff".into()]),
                reply: false,
            },
            r#"{"op":"trace","in_port":"uplink","frames":["ffffffffffff"],"reply":false}"#,
        );
        round_trip(
            &Request::TraceStart {
                filter: "tcp port 80".into(),
                count: 3,
            },
            r#"{"op":"trace_start","filter":"tcp port 80","count":3}"#,
        );
        round_trip(
            &Request::TraceRead { session: Some(7) },
            r#"{"op":"trace_read","session":7}"#,
        );
        round_trip(
            &Request::TraceStop { session: Some(7) },
            r#"{"op":"trace_stop","session":7}"#,
        );
        // Clients older than session ids send none.
        round_trip(
            &Request::TraceRead { session: None },
            r#"{"op":"trace_read"}"#,
        );
        round_trip(
            &Request::TraceStop { session: None },
            r#"{"op":"trace_stop"}"#,
        );
        round_trip(
            &Request::CaptureStart {
                port: "uplink".into(),
                filter: "udp".into(),
            },
            r#"{"op":"capture_start","port":"uplink","filter":"udp"}"#,
        );
        round_trip(
            &Request::CaptureRead { session: Some(8) },
            r#"{"op":"capture_read","session":8}"#,
        );
        round_trip(
            &Request::CaptureStop { session: None },
            r#"{"op":"capture_stop"}"#,
        );
        let a: Response = serde_json::from_str(r#"{"session":9}"#).unwrap();
        assert_eq!(
            a,
            Response::Ok(Answer {
                session: Some(9),
                ..Answer::default()
            })
        );
    }

    #[test]
    fn test_answers_with_connections_and_services() {
        let a = Answer {
            conntrack: Some(CtAnswer {
                entries: vec![CtEntry {
                    proto: "tcp".into(),
                    proto_num: 6,
                    original: CtTuple {
                        src: "10.244.1.5".parse().unwrap(),
                        dst: "10.96.0.10".parse().unwrap(),
                        sport: Some(40000),
                        dport: Some(80),
                        ..CtTuple::default()
                    },
                    tcp_state: Some("ESTABLISHED".into()),
                    line: "tcp 6 10 ESTABLISHED ...".into(),
                    ..CtEntry::default()
                }],
                matched: 3,
                truncated: true,
                deleted: 0,
            }),
            services: Some(vec![ServiceInfo {
                namespace: "default".into(),
                name: "web".into(),
                ports: vec![ServicePortInfo {
                    port_name: "http".into(),
                    proto: "tcp".into(),
                    frontends: vec![FrontendInfo {
                        kind: "node_port".into(),
                        address: None,
                        port: 30080,
                        proto: "tcp".into(),
                        scope: "external".into(),
                    }],
                    ..ServicePortInfo::default()
                }],
            }]),
            ..Answer::default()
        };
        let j = serde_json::to_string(&a).unwrap();
        assert!(
            j.contains(r#""sport":40000"#) && !j.contains("icmp_type"),
            "{j}"
        );
        assert!(j.contains(r#""kind":"node_port","port":30080"#), "{j}");
        assert_eq!(
            serde_json::from_str::<Response>(&j).unwrap(),
            Response::Ok(a)
        );
    }

    #[test]
    fn test_counters_of_an_older_agent_still_decode() {
        let c: Counters = serde_json::from_str(
            r#"{"generation":1,"ports":[],"drops":{},"ct_entries":0,"ct_inserted":0,
                "ct_insert_failed":0,"reassembled":0,"service_balanced":0,"service_rejected":0}"#,
        )
        .unwrap();
        assert_eq!(
            c,
            Counters {
                generation: 1,
                ..Counters::default()
            }
        );
        let full = Counters {
            datastore: DatastoreHealth {
                kind: "file".into(),
                source: "/etc/ferry/cluster".into(),
                synced: true,
                last_sync_unix_ms: Some(1),
                last_read_unix_ms: Some(1),
                last_error: None,
                errors_total: 0,
            },
            sync: SyncLatency {
                count: 1,
                sum_us: 900,
                last_us: 900,
                max_us: 900,
                buckets: vec![(1000, 1), (u64::MAX, 0)],
            },
            enforcement: PolicyEnforcement {
                network_policies: 1,
                cluster_network_policies: 0,
                unenforced: vec![UnenforcedPolicy {
                    kind: "NetworkPolicy".into(),
                    policy: "default/deny".into(),
                    state: Enforcement::OlderVersion,
                    enforced_version: Some("resourceVersion 10".into()),
                    latest_version: None,
                    reasons: vec!["refused: spec.podSelector: bad".into()],
                }],
                stale: None,
            },
            ..Counters::default()
        };
        let j = serde_json::to_string(&full).unwrap();
        assert!(j.contains(r#""state":"older_version""#), "{j}");
        assert_eq!(serde_json::from_str::<Counters>(&j).unwrap(), full);
    }
}
