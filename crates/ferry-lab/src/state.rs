//! What a running lab has made, kept in `DIR/state.json` and rewritten after every
//! step of `up`, so that `down` finds it after a crash half-way.

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

/// A pod made through the CNI plugin.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Pod {
    /// Its name (namespace `default`).
    pub name: String,
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

    /// The pod named `name`.
    pub fn pod(&self, name: &str) -> Result<&Pod> {
        self.pods
            .iter()
            .find(|p| p.name == name)
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
