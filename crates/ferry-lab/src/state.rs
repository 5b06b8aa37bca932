//! What a running lab has made, kept in `DIR/state.json` and rewritten after every
//! step of `up`, so that `down` finds it after a crash half-way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::plan::Plan;

/// A process the lab started.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Process {
    /// What it is ("ferry agent on node1").
    pub label: String,
    /// Its pid.
    pub pid: u32,
}

/// How a node's agent was started: `ferry lab restart` starts the next one from this
/// record, exactly so, rather than deriving the arguments again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentLaunch {
    /// The node's number.
    pub node: u8,
    /// The node's network namespace (full name).
    pub netns: String,
    /// The command, program first.
    pub command: Vec<String>,
    /// Its log.
    pub log: PathBuf,
    /// Its API socket (`--api-socket`).
    pub socket: PathBuf,
    /// The host TAP it makes (`--host-tap`), and what the node's kernel has there.
    pub host_tap: HostTap,
}

/// The node kernel's side of an agent's host TAP (as `docs/node.md` describes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostTap {
    /// The TAP's name.
    pub name: String,
    /// Its MAC: the base's `next_hop_mac` for the node's address.
    pub mac: String,
    /// The node's address, put on the TAP as a /32.
    pub addr: String,
}

/// The label of node `n`'s agent among the processes.
pub fn agent_label(n: u8) -> String {
    format!("ferry agent on node{n}")
}

/// The namespace of the lab's own pods, and of a pod named without one.
pub const DEFAULT_NAMESPACE: &str = "default";

fn default_namespace() -> String {
    DEFAULT_NAMESPACE.to_string()
}

/// A port a pod serves: `tcp/80`, `udp/81`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Served {
    /// The protocol.
    pub proto: Proto,
    /// The port.
    pub port: u16,
}

/// A transport protocol a lab pod serves and the probes speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// TCP: a connection, then `GET /hostname`.
    Tcp,
    /// UDP: `hostname` asked, the pod's name answered.
    Udp,
}

impl Proto {
    /// `tcp` or `udp`.
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }

    /// `TCP` or `UDP`, as Kubernetes writes it.
    pub fn kube(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
        }
    }
}

impl std::fmt::Display for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.proto.as_str(), self.port)
    }
}

impl std::str::FromStr for Served {
    type Err = anyhow::Error;

    /// `tcp/80`, `udp/81` (case does not matter).
    fn from_str(s: &str) -> Result<Served> {
        let (proto, port) = s
            .split_once('/')
            .with_context(|| format!("{s:?}: a port is PROTO/PORT, like tcp/80 or udp/81"))?;
        let proto = match proto.to_ascii_lowercase().as_str() {
            "tcp" => Proto::Tcp,
            "udp" => Proto::Udp,
            other => anyhow::bail!("{s:?}: protocol {other:?} is not tcp or udp"),
        };
        let port: u16 = port
            .parse()
            .ok()
            .filter(|&p| p != 0)
            .with_context(|| format!("{s:?}: port {port:?} is not 1-65535"))?;
        Ok(Served { proto, port })
    }
}

impl Served {
    /// The container port's name, as the Kubernetes NetworkPolicy e2e tests name theirs
    /// (`serve-80-tcp`), so that named-port rules can use it.
    pub fn port_name(&self) -> String {
        format!("serve-{}-{}", self.port, self.proto.as_str())
    }
}

/// A pod made through the CNI plugin.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Pod {
    /// Its name.
    pub name: String,
    /// Its namespace.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Its labels; empty for the lab's own pods, whose only label is `app`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The ports its servers answer on; empty for the lab's own pods (HTTP on 8080, UDP
    /// echo on 8081).
    #[serde(default)]
    pub serves: Vec<Served>,
    /// Its node's number.
    pub node: u8,
    /// Its `app` label.
    pub app: String,
    /// Its network namespace's name.
    pub netns: String,
    /// The container ID given to the plugin.
    pub container_id: String,
    /// Its addresses, from the plugin's result.
    pub ips: Vec<String>,
    /// Whether its server runs: a pod being replaced is left out of EndpointSlices.
    pub ready: bool,
}

/// A lab's state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct State {
    /// Its shape.
    pub plan: Plan,
    /// The `ferry` binary the processes run.
    pub ferry: PathBuf,
    /// The CNI plugin.
    pub cni: PathBuf,
    /// Processes started, in order.
    pub processes: Vec<Process>,
    /// Pods, in order of creation.
    pub pods: Vec<Pod>,
    /// Namespaces the lab has written, with their labels (`kubernetes.io/metadata.name`
    /// included); `default` is written whether or not it is here.
    #[serde(default)]
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// How each node's agent was started.
    #[serde(default)]
    pub agents: Vec<AgentLaunch>,
}

/// `NS/NAME`, or `NAME` in namespace `default`: the namespace and the name.
pub fn pod_ref(s: &str) -> (&str, &str) {
    s.split_once('/').unwrap_or((DEFAULT_NAMESPACE, s))
}

impl Pod {
    /// `NAME` in namespace `default`, `NS/NAME` in any other: how the lab names it (in
    /// `status`, `exec`, the probe matrices) and what its servers answer to `hostname`.
    pub fn id(&self) -> String {
        if self.namespace == DEFAULT_NAMESPACE {
            self.name.clone()
        } else {
            format!("{}/{}", self.namespace, self.name)
        }
    }

    /// Whether it is `NS/NAME` (or `NAME` in `default`).
    pub fn is(&self, reference: &str) -> bool {
        let (ns, name) = pod_ref(reference);
        self.namespace == ns && self.name == name
    }

    /// Its first IPv4 address.
    pub fn ip4(&self) -> Option<&str> {
        self.ips
            .iter()
            .find(|a| !a.contains(':'))
            .map(String::as_str)
    }
}

impl State {
    /// The state file of the lab in `dir`.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join("state.json")
    }

    /// Reads the state of the lab in `dir`.
    pub fn load(dir: &Path) -> Result<State> {
        let p = State::path(dir);
        let text = std::fs::read_to_string(&p)
            .with_context(|| format!("no lab in {} (ferry lab up makes one)", dir.display()))?;
        serde_json::from_str(&text).with_context(|| format!("reading {}", p.display()))
    }

    /// Writes it.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        crate::sys::write_atomic(&State::path(dir), &text)
    }

    /// How node `n`'s agent was started.
    pub fn agent(&self, n: u8) -> Result<&AgentLaunch> {
        self.agents.iter().find(|a| a.node == n).with_context(|| {
            format!(
                "node{n}: the lab has node1..node{} and records how each agent started",
                self.plan.nodes
            )
        })
    }

    /// The pid of node `n`'s agent, as last recorded.
    pub fn agent_pid(&self, n: u8) -> Option<u32> {
        let label = agent_label(n);
        self.processes
            .iter()
            .rev()
            .find(|p| p.label == label)
            .map(|p| p.pid)
    }

    /// Records `pid` as node `n`'s agent, in place of the one before.
    pub fn set_agent_pid(&mut self, n: u8, pid: u32) {
        let label = agent_label(n);
        match self.processes.iter_mut().find(|p| p.label == label) {
            Some(p) => p.pid = pid,
            None => self.processes.push(Process { label, pid }),
        }
    }

    /// The pod `NS/NAME`, or `NAME` in namespace `default`.
    pub fn pod(&self, name: &str) -> Result<&Pod> {
        self.pods
            .iter()
            .find(|p| p.is(name))
            .with_context(|| format!("no pod {name} in the lab"))
    }

    /// The first IPv6 address of pod `name`.
    pub fn pod_ip6(&self, name: &str) -> Result<String> {
        let p = self.pod(name)?;
        p.ips
            .iter()
            .find(|a| a.contains(':'))
            .cloned()
            .with_context(|| format!("pod {name} has no IPv6 address"))
    }

    /// The first IPv4 address of pod `name`.
    pub fn pod_ip(&self, name: &str) -> Result<String> {
        let p = self.pod(name)?;
        p.ips
            .iter()
            .find(|a| !a.contains(':'))
            .cloned()
            .with_context(|| format!("pod {name} has no IPv4 address"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        State {
            plan: Plan::new("t", 2, 1).unwrap(),
            ferry: "ferry".into(),
            cni: "ferry-cni".into(),
            processes: vec![
                Process {
                    label: agent_label(1),
                    pid: 10,
                },
                Process {
                    label: agent_label(2),
                    pid: 20,
                },
            ],
            pods: Vec::new(),
            namespaces: BTreeMap::new(),
            agents: Vec::new(),
        }
    }

    #[test]
    fn test_a_restarted_agents_pid_replaces_the_old_one() {
        let mut s = state();
        s.set_agent_pid(1, 11);
        assert_eq!(s.agent_pid(1), Some(11));
        assert_eq!(s.agent_pid(2), Some(20));
        assert_eq!(s.processes.len(), 2, "replaced, not added");
        s.set_agent_pid(3, 30);
        assert_eq!(s.agent_pid(3), Some(30));
    }

    #[test]
    fn test_a_state_without_agent_records_reads_and_restart_says_why_not() {
        let mut text = serde_json::to_value(state()).unwrap();
        text.as_object_mut().unwrap().remove("agents");
        let s: State = serde_json::from_value(text).unwrap();
        assert!(s.agents.is_empty());
        let e = s.agent(1).unwrap_err().to_string();
        assert!(e.contains("records how each agent started"), "{e}");
    }
}
