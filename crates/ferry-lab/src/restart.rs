//! `ferry lab restart NODE [--kill]`: a node's agent replaced the way an update or a
//! crash replaces it, with the command `up` recorded for it, and the outage measured.
//!
//! Forwarding is defined by what a client sees: a watch ([`probe::watch`]) in the
//! external client's namespace asks `web`'s UDP node port on the node's address every
//! [`WATCH_EVERY`] before, during and after the restart, and stamps each answer. That
//! path enters through the node's uplink, is translated and forwarded by its agent
//! (across the overlay to `web`, or to `web` on the node itself) and back, so an answer
//! means the agent forwards. The new agent forwards from the first answer after both its
//! start and the old agent's exit; the outage is the silence before that answer.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, sleep};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ferry_linux::cmd::Cmd;

use crate::agents::now_us;
use crate::node_agent;
use crate::plan::node_port;
use crate::state::{AgentLaunch, State};
use crate::sys;

/// How an agent is replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// An update: the new agent starts while the old one runs and takes the node over
    /// from it (a handover); the old one exits.
    Update,
    /// A crash: the old agent is killed (SIGKILL), then the new one starts.
    Kill,
    /// A crash that also lost the checkpoint: the old agent is killed, its checkpoint
    /// removed (a state directory on a disk that went), then the new one starts with no
    /// connection state at all.
    Cold,
}

impl std::fmt::Display for How {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            How::Update => "update",
            How::Kill => "kill",
            How::Cold => "kill without checkpoint",
        })
    }
}

/// How often the watch asks.
pub const WATCH_EVERY: Duration = Duration::from_millis(5);
/// How long an old agent has to hand over and exit once the new one started.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the new agent has to forward.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(15);

/// What a restart did and how long its steps took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restarted {
    /// The node.
    pub node: u8,
    /// How.
    pub how: How,
    /// The old agent's pid, when one ran.
    pub old_pid: Option<u32>,
    /// From the signal (a kill) or the new agent's start (an update) to the old
    /// agent's exit.
    pub stopped: Option<Duration>,
    /// The new agent's pid.
    pub new_pid: u32,
    /// From the new agent's start (its process spawned) to its forwarding.
    pub forwarding: Duration,
    /// The silence of the watch before the new agent's first answer.
    pub outage: Duration,
}

impl std::fmt::Display for Restarted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.node;
        let signal = match self.how {
            How::Update => "handover",
            How::Kill => "SIGKILL",
            How::Cold => "SIGKILL, checkpoint removed",
        };
        match (self.old_pid, self.stopped) {
            (Some(pid), Some(t)) => write!(
                f,
                "node{n}: {} ({signal}): agent {pid} exited {} ms after it",
                self.how,
                t.as_millis()
            )?,
            _ => write!(f, "node{n}: {}: no agent was running", self.how)?,
        }
        write!(
            f,
            "; agent {} forwarding {} ms after its start; outage {} ms",
            self.new_pid,
            self.forwarding.as_millis(),
            self.outage.as_millis()
        )
    }
}

/// Replaces node `node`'s agent as `how` says, with the command `up` recorded, and
/// waits until the lab is as before: the new agent forwards, its node's kernel is on its
/// host TAP, its API answers and the load balancer's health checks see what they saw.
pub fn restart(dir: &Path, node: u8, how: How) -> Result<Restarted> {
    let mut state = State::load(dir)?;
    let launch = state.agent(node)?.clone();
    let old = state.agent_pid(node).filter(|&p| sys::alive(p));
    let healthy = || std::fs::read_to_string(dir.join("lb-healthy.json")).unwrap_or_default();
    let healthy_before = healthy();
    let to = format!("{}:{}", state.plan.node_ip(node), node_port::WEB_UDP);
    let watch = Watch::start(&state, &to)?;
    if old.is_some() {
        // Forwarding before, so that its silence is the restart's.
        watch
            .first_after(0, Duration::from_secs(3))
            .with_context(|| format!("node{node} does not forward before its restart"))?;
    }
    let t = replace(dir, &mut state, &launch, old, how)?;
    node_agent::host_tap_ready(&launch, t.new_pid)?;
    let since = t.started_us.max(t.exited_us.unwrap_or(0));
    let first = watch
        .first_after(since, FORWARD_TIMEOUT)
        .with_context(|| format!("the new agent of node{node} forwarding"))?;
    let before = watch.last_before(first).unwrap_or(t.signalled_us);
    node_agent::api_answers(&launch, t.new_pid)?;
    sys::wait_for(10, "the load balancer's health checks as before", || {
        healthy() == healthy_before
    })
    .with_context(|| format!("before: {healthy_before}, now: {}", healthy()))?;
    Ok(Restarted {
        node,
        how,
        old_pid: old,
        stopped: t.exited_us.map(|e| micros(e - t.signalled_us)),
        new_pid: t.new_pid,
        forwarding: micros(first.saturating_sub(t.started_us)),
        outage: micros(first.saturating_sub(before)),
    })
}

fn micros(us: u64) -> Duration {
    Duration::from_micros(us)
}

/// When the steps of a replacement happened (Unix microseconds).
struct Timeline {
    signalled_us: u64,
    exited_us: Option<u64>,
    started_us: u64,
    new_pid: u32,
}

/// Replaces the old agent as `how` says: the one place that knows how agents take over
/// from each other. An update starts the new agent while the old one runs: the new one
/// asks the old one over the API socket for its ports and state (a handover), and the
/// old one exits once the new one forwards. A kill stops the old agent with SIGKILL
/// and then starts the new one (a crash). The new agent's pid is recorded in the state
/// at once.
fn replace(
    dir: &Path,
    state: &mut State,
    launch: &AgentLaunch,
    old: Option<u32>,
    how: How,
) -> Result<Timeline> {
    let signalled_us = now_us();
    let mut exited_us = None;
    if let (Some(pid), How::Kill | How::Cold) = (old, how) {
        sys::signal(pid, "KILL");
        exited_us = Some(exit_of(pid, Duration::from_secs(3))?);
    }
    if how == How::Cold {
        let file = node_agent::checkpoint(dir, launch.node);
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => bail!("removing {}: {e}", file.display()),
        }
    }
    let started_us = now_us();
    let new_pid = node_agent::start(dir, state, launch, true)?;
    if let (Some(pid), How::Update) = (old, how) {
        exited_us = Some(exit_of(pid, EXIT_TIMEOUT).with_context(|| {
            format!(
                "the handover from agent {pid} to agent {new_pid}: {}",
                std::fs::read_to_string(&launch.log).unwrap_or_default()
            )
        })?);
    }
    Ok(Timeline {
        signalled_us,
        exited_us,
        started_us,
        new_pid,
    })
}

/// Waits up to `timeout` for process `pid` to be gone, every thread of it (a new agent
/// cannot open a TAP the old one still holds); when it went (Unix µs).
fn exit_of(pid: u32, timeout: Duration) -> Result<u64> {
    let deadline = Instant::now() + timeout;
    while !sys::exited(pid) {
        if Instant::now() > deadline {
            bail!("agent {pid} did not exit within {} s", timeout.as_secs());
        }
        sleep(Duration::from_millis(2));
    }
    Ok(now_us())
}

/// A [`crate::probe::watch`] running in the client's namespace: the arrival times of its
/// answers, as they come. It stops when dropped.
struct Watch {
    child: Child,
    stdin: Option<ChildStdin>,
    answers: Arc<Mutex<Vec<u64>>>,
    reader: Option<JoinHandle<()>>,
}

impl Watch {
    /// Starts asking `to` from the client and waits until it has sent its first request.
    fn start(state: &State, to: &str) -> Result<Watch> {
        let every = WATCH_EVERY.as_millis().to_string();
        let mut child = Cmd::new(state.ferry.display().to_string())
            .args(["lab", "probe-udp", "--watch", &every, to])
            .netns(state.plan.ns("client"))
            .command()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the forwarding watch in the client")?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("the watch's output")?;
        let answers = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let seen = Arc::clone(&answers);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                match line.parse::<u64>() {
                    Ok(t) => seen.lock().unwrap_or_else(|e| e.into_inner()).push(t),
                    Err(_) => drop(tx.send(())),
                }
            }
        });
        let mut w = Watch {
            child,
            stdin,
            answers,
            reader: Some(reader),
        };
        if rx.recv_timeout(Duration::from_secs(5)).is_err() {
            w.stop();
            bail!("the forwarding watch from the client to {to} did not start");
        }
        Ok(w)
    }

    /// The first answer after `since` (Unix µs), waiting up to `timeout` for it.
    fn first_after(&self, since: u64, timeout: Duration) -> Result<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.answers.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(&t) = got.iter().find(|&&t| t > since) {
                return Ok(t);
            }
            drop(got);
            if Instant::now() > deadline {
                bail!("no answer within {} s", timeout.as_secs());
            }
            sleep(Duration::from_millis(2));
        }
    }

    /// The last answer before `t`.
    fn last_before(&self, t: u64) -> Option<u64> {
        let got = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        got.iter().rev().find(|&&a| a < t).copied()
    }

    fn stop(&mut self) {
        // Its standard input closed, the watch ends; killed if it does not.
        self.stdin.take();
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `node1` or `1`: the node's number, checked against the lab's nodes.
pub fn parse_node(state: &State, s: &str) -> Result<u8> {
    let n = s
        .strip_prefix("node")
        .unwrap_or(s)
        .parse::<u8>()
        .ok()
        .filter(|n| (1..=state.plan.nodes).contains(n));
    n.with_context(|| {
        format!(
            "{s}: not a node of the lab (node1..node{})",
            state.plan.nodes
        )
    })
}
