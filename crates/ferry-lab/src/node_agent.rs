//! Each node's `ferry agent`: its command made once by `up` and kept in the lab's state
//! ([`AgentLaunch`]), started from that record (again by [`crate::restart`]), and the
//! node kernel's side of the host TAP the agent makes.
//!
//! The host TAP is not persistent: it goes with the agent's last descriptor, when the
//! agent exits or is killed, and the node kernel's address and routes on it go too. The
//! next agent makes a new TAP of the same name, and [`host_tap_ready`] puts the kernel's
//! side back; it changes nothing on a TAP that kept it (one handed over, or the same
//! device found again).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::cluster;
use crate::state::{AgentLaunch, HostTap, State};
use crate::sys::{self, ip};
use crate::topology::manifests;

/// How long an agent has to make its host TAP and answer on its API socket.
pub const START_TIMEOUT: Duration = Duration::from_secs(15);

/// Node `n`'s agent as `up` starts it: its command, log, socket and host TAP. Writes the
/// node's base tables file the command names.
pub fn launch(dir: &Path, state: &State, n: u8) -> Result<AgentLaunch> {
    let plan = &state.plan;
    let base = dir.join(format!("base{n}.yaml"));
    fs::write(&base, cluster::base(plan, n))?;
    let tap = format!("{}h{n}", plan.prefix);
    let socket = dir.join(format!("node{n}.sock"));
    // Node 2 runs two worker threads, the others one: the checks go through both.
    let workers = if n == 2 { "2" } else { "1" };
    let path = |p: &Path| p.display().to_string();
    let command = [
        &path(&state.ferry),
        "agent",
        "--workers",
        workers,
        "--node",
        &format!("node{n}"),
        "--datastore",
        &format!("file:{}", manifests(dir).display()),
        "--base",
        &path(&base),
        "--uplink",
        "uplink",
        "--host-tap",
        &tap,
        "--api-socket",
        &path(&socket),
        "--state-dir",
        &path(&state_dir(dir, n)),
    ]
    .map(str::to_string)
    .to_vec();
    Ok(AgentLaunch {
        node: n,
        netns: plan.ns(&format!("node{n}")),
        command,
        log: dir.join(format!("logs/agent-node{n}.log")),
        socket,
        host_tap: HostTap {
            name: tap,
            mac: cluster::host_tap_mac(n),
            addr: plan.node_ip(n),
        },
    })
}

/// Starts node `n`'s first agent (at `up`), records how, and waits until the node's
/// kernel is on its host TAP and its API answers.
pub fn start_first(dir: &Path, state: &mut State, n: u8) -> Result<()> {
    let launch = launch(dir, state, n)?;
    state.agents.retain(|a| a.node != n);
    state.agents.push(launch.clone());
    let pid = start(dir, state, &launch, false)?;
    host_tap_ready(&launch, pid)?;
    api_answers(&launch, pid)
}

/// Starts the agent of `launch` in its node's namespace, its output to its log (after
/// what the agents before it wrote there, when `append`), and records its pid in the
/// state (saved) in place of the one before.
pub fn start(dir: &Path, state: &mut State, launch: &AgentLaunch, append: bool) -> Result<u32> {
    let cmd: Vec<&str> = launch.command.iter().map(String::as_str).collect();
    let pid = if append {
        sys::start_in_appending(&launch.netns, &launch.log, &cmd)?
    } else {
        sys::start_in(&launch.netns, &launch.log, &cmd)?
    };
    state.set_agent_pid(launch.node, pid);
    state.save(dir)?;
    Ok(pid)
}

/// The agent's log, for errors.
fn log_of(launch: &AgentLaunch) -> String {
    fs::read_to_string(&launch.log).unwrap_or_default()
}

/// Waits until agent `pid` has made its host TAP, then puts the node's kernel on it.
pub fn host_tap_ready(launch: &AgentLaunch, pid: u32) -> Result<()> {
    let (ns, tap) = (&launch.netns, &launch.host_tap);
    let n = launch.node;
    sys::wait_for(
        START_TIMEOUT.as_secs(),
        &format!("the host TAP {} on node{n}", tap.name),
        || sys::alive(pid) && ip(ns, &["link", "show", &tap.name]).is_ok(),
    )
    .with_context(|| format!("ferry agent on node{n}: {}", log_of(launch)))?;
    node_kernel_on_host_tap(ns, &tap.name, &tap.mac, &tap.addr)
}

/// Waits until agent `pid` answers on its API socket (a stale socket file of a killed
/// agent does not count).
pub fn api_answers(launch: &AgentLaunch, pid: u32) -> Result<()> {
    sys::wait_for(
        START_TIMEOUT.as_secs(),
        &format!("node{}'s API socket answering", launch.node),
        || sys::alive(pid) && crate::agents::counters(&launch.socket).is_ok(),
    )
    .with_context(|| log_of(launch))
}

/// Gives a node's kernel (namespace `ns`) its address `addr` on the agent's host TAP
/// `tap`, with MAC `mac` (the base's `next_hop_mac` for the node's address), and routes
/// everything else through ferry's gateway 169.254.1.1 there (as `docs/node.md`
/// describes). The agent must have made the TAP. Again on a TAP that has them already,
/// it changes nothing.
pub fn node_kernel_on_host_tap(ns: &str, tap: &str, mac: &str, addr: &str) -> Result<()> {
    ip(ns, &["link", "set", tap, "address", mac, "up"])?;
    ip(ns, &["addr", "replace", &format!("{addr}/32"), "dev", tap])?;
    ip(
        ns,
        &[
            "route",
            "replace",
            "169.254.1.1",
            "dev",
            tap,
            "scope",
            "link",
        ],
    )?;
    ip(ns, &["route", "replace", "default", "via", "169.254.1.1"])?;
    Ok(())
}

/// Node `n`'s `--state-dir` in lab `dir`.
fn state_dir(dir: &Path, n: u8) -> PathBuf {
    dir.join(format!("state/node{n}"))
}

/// The checkpoint node `n`'s agent writes in its state directory (the agent's
/// `checkpoint::FILE`; the lab does not link the agent).
pub fn checkpoint(dir: &Path, n: u8) -> PathBuf {
    state_dir(dir, n).join("datapath.state")
}
