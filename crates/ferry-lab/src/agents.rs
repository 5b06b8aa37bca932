//! Asking the lab's agents over their API sockets: whether a change of the manifests is
//! in force on every node, without a fixed sleep.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use ferry_api::{Counters, Request, Response};

use crate::state::State;

/// The counters of the agent answering on `socket`.
pub fn counters(socket: &Path) -> Result<Counters> {
    let mut conn = UnixStream::connect(socket)
        .with_context(|| format!("no agent answers on {}", socket.display()))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = serde_json::to_string(&Request::Counters)?;
    line.push('\n');
    conn.write_all(line.as_bytes())?;
    let mut back = String::new();
    BufReader::new(conn).read_line(&mut back)?;
    match serde_json::from_str(back.trim_end())
        .with_context(|| format!("the answer of {}", socket.display()))?
    {
        Response::Ok(a) => Ok(*a.counters.unwrap_or_default()),
        Response::Error(e) => bail!("{}: {} ({})", socket.display(), e.msg, e.details),
    }
}

/// Now, in milliseconds since the Unix epoch, as the agents stamp their syncs.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Now, in microseconds since the Unix epoch: the clock that processes in different
/// namespaces share.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A mark to take once the manifests are changed, for [`wait_in_force`]: the next
/// millisecond, which a datastore read that has the change begins in or after.
pub fn changed() -> u64 {
    now_ms() + 1
}

/// How long [`wait_in_force`] waits by default. The file datastore looks every 100 ms
/// and reads a change once it has seen it twice, so a change is in force within a few
/// hundred milliseconds on an idle machine; the rest is for a loaded one.
pub const IN_FORCE_TIMEOUT: Duration = Duration::from_secs(10);

/// Waits up to `timeout` until every node's agent has put in force a state of the
/// manifests read after the change: a state whose datastore read began at or after
/// `since` (a [`changed`] mark taken after the change). The file datastore reads a
/// directory only when two of its scans, 100 ms apart, agree, so a read that has the
/// change begins at least a scan after it and one that missed it began before it: the
/// millisecond of the read tells them apart. (A state merely synced after a mark taken
/// before the change could have been read before it: a pod's manifest read as the case
/// file was written.) Only for a change the agents read (every kind they read, labels
/// included): a state equal to the one in force brings no read, and the wait then ends
/// in its timeout. A state refused since (a datastore error counted) is an error with
/// the agent's message.
pub fn wait_in_force(dir: &Path, state: &State, since: u64, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    let mut errors = Vec::new();
    for n in state.plan.node_numbers() {
        let sock = dir.join(format!("node{n}.sock"));
        errors.push(counters(&sock)?.datastore.errors_total);
    }
    let mut waiting: Vec<u8> = state.plan.node_numbers().collect();
    loop {
        let mut still = Vec::new();
        for &n in &waiting {
            let sock = dir.join(format!("node{n}.sock"));
            let c = counters(&sock)?;
            let d = &c.datastore;
            if d.errors_total > errors[usize::from(n) - 1] && !d.synced {
                bail!(
                    "node{n}'s agent refused the manifests: {}",
                    d.last_error.as_deref().unwrap_or("(no message)")
                );
            }
            if !(d.synced && d.last_read_unix_ms.is_some_and(|t| t >= since)) {
                still.push(n);
            }
        }
        if still.is_empty() {
            return Ok(());
        }
        if start.elapsed() > timeout {
            let nodes: Vec<String> = still.iter().map(|n| format!("node{n}")).collect();
            bail!(
                "the agents of {} did not put the change of the manifests in force within {:.1} s",
                nodes.join(", "),
                timeout.as_secs_f64()
            );
        }
        waiting = still;
        sleep(Duration::from_millis(25));
    }
}
