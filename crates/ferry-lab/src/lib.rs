//! `ferry lab`: a multi-node cluster in network namespaces on one machine, with an
//! external client and an external L4 load balancer, and the connectivity checks that
//! prove ferry's dataplane on it. `docs/lab.md` describes it for its users.
//!
//! - [`plan`]: names and addresses; [`cluster`]: the manifests the agents read;
//! - [`up`] builds it, [`down`] removes it (also what a crashed run left, by prefix);
//! - [`cni`]: pods made through the CNI plugin as a kubelet would;
//! - [`lb`]: the load balancer and its health checks; [`check`]: the scenarios;
//! - [`probe`]: small UDP clients the checks run inside the namespaces;
//! - [`pods`]: pods and namespaces added to a running lab; [`manifests`]: files of
//!   manifests applied to it and deleted; [`agents`]: waiting for the agents to put a
//!   change in force;
//! - [`matrix`]: probe matrices between pods; [`netpol`]: the NetworkPolicy suite, the
//!   Kubernetes e2e cases on them;
//! - [`node_agent`]: each node's agent, started from the command recorded for it;
//!   [`restart`]: it replaced as an update or a crash would, the outage measured;
//!   [`traffic`]: the traffic a restart must not break, and [`download`], its paced
//!   downloads.
#![forbid(unsafe_code)]

pub mod agents;
pub mod boom;
pub mod check;
pub mod cluster;
pub mod cni;
pub mod download;
pub mod lb;
pub mod manifests;
pub mod matrix;
pub mod netpol;
pub mod node_agent;
pub mod plan;
pub mod pods;
pub mod probe;
pub mod restart;
pub mod state;
pub mod sys;
pub mod topology;
pub mod traffic;

use std::path::{Path, PathBuf};

pub use plan::Plan;
pub use state::State;

/// The default lab directory: state, manifests, logs, sockets.
pub const DEFAULT_DIR: &str = "/run/ferry-lab";
/// The default prefix of the lab's namespace names.
pub const DEFAULT_PREFIX: &str = "flab";

/// Where the binaries are: `ferry` itself, and the CNI plugin (by default next to it,
/// as cargo builds them).
#[derive(Clone, Debug)]
pub struct Binaries {
    /// The `ferry` binary.
    pub ferry: PathBuf,
    /// The `ferry-cni` binary.
    pub cni: PathBuf,
}

impl Binaries {
    /// The running `ferry`, and `ferry-cni` next to it unless `cni` is given.
    pub fn current(cni: Option<PathBuf>) -> anyhow::Result<Binaries> {
        let ferry = std::env::current_exe()?;
        let cni = cni.unwrap_or_else(|| ferry.with_file_name("ferry-cni"));
        anyhow::ensure!(
            cni.exists(),
            "the CNI plugin {} is missing: cargo build -p ferry-cni (or give --cni-bin)",
            cni.display()
        );
        Ok(Binaries { ferry, cni })
    }
}

pub use topology::{down, exec, status, up};

/// `ferry lab demo`: up, check, down (down also when up or check fails).
pub fn demo(plan: &Plan, dir: &Path, bins: &Binaries) -> anyhow::Result<bool> {
    let r = up(plan, dir, bins).and_then(|()| check::run(dir, &mut std::io::stdout()));
    let d = down(dir, &plan.prefix);
    let ok = r?;
    d?;
    Ok(ok)
}
