//! The audit log of denied connections (`ferry agent --policy-audit-log PATH`): one JSON
//! object per line for each new connection that NetworkPolicy or ClusterNetworkPolicy
//! denied on this node (see docs/policy.md, "Audit log").
//!
//! The datapath records each denial ([`ferry_datapath::Denial`]) and the worker hands
//! the records over with its counters ([`ferry_linux::worker::Control::take_denials`]);
//! the agent's loop gives them to [`AuditLog::write`], which names the pods (this node's
//! by port, the others by address) and the policies, and writes the lines. Two things
//! keep the log small:
//!
//! - a denied connection is never tracked, so its client's retransmissions of the first
//!   packet are denied again: a denial of a connection (its key as it came, before NAT)
//!   logged or seen within [`REPEAT_WINDOW`] of the last is a repeat and is not logged
//!   (counted as such), for [`REMEMBERED`] connections at most;
//! - a token bucket allows `rate` lines a second, with a burst of as many; what it
//!   refuses is counted, and so is what the datapath's buffer could not hold; at most
//!   once every [`SUMMARY_EVERY`], a line says how many went unlogged and why.
//!
//! Times are the pipeline's (the agent's clock since start) for the limits, and the
//! wall clock for the lines (RFC 3339 in UTC, milliseconds, through `jiff`, which the
//! Kubernetes types bring). A line that cannot be written is counted, and the error
//! reported on the agent's log once every [`WRITE_ERROR_REPORT_EVERY`]; forwarding never
//! waits for the log.

mod limits;
mod line;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use ferry_datapath::Denial;

use crate::cluster::{Cluster, ObjectKey};

pub use line::{Names, Suppressed};

use limits::{Repeats, TokenBucket};

/// Lines a second of `--policy-audit-rate` by default.
pub const DEFAULT_RATE: u32 = 100;
/// The highest `--policy-audit-rate`.
pub const MAX_RATE: u32 = 100_000;
/// A denial of a connection within this long of the last one seen is a repeat: the gaps
/// between Linux's retransmissions of a SYN (1, 2, 4, 8, 16 s) are all shorter.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(30);
/// Connections remembered for repeats at most.
pub const REMEMBERED: usize = 4096;
/// How often at most a line says how many denials went unlogged, per reason.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(1);
/// How often at most a write error is reported on the agent's log.
pub const WRITE_ERROR_REPORT_EVERY: Duration = Duration::from_secs(10);

/// Where the lines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The agent's standard error (`-`).
    Stderr,
    /// A file, appended to (made if missing).
    File(PathBuf),
}

impl Target {
    /// `-` or a path.
    pub fn parse(s: &str) -> Target {
        match s {
            "-" => Target::Stderr,
            path => Target::File(path.into()),
        }
    }

    fn open(&self) -> io::Result<Box<dyn Write + Send>> {
        Ok(match self {
            Target::Stderr => Box::new(io::stderr()),
            Target::File(p) => Box::new(append(p)?),
        })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Stderr => f.write_str("standard error"),
            Target::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// Opens `path` for appending, making it (mode 0640) if missing. Each line is one
/// `write` on it: with `O_APPEND`, lines stay whole when the file is rotated by
/// truncation (logrotate's `copytruncate`).
pub fn append(path: &std::path::Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .open(path)
}

impl Names {
    /// The names of `cluster`'s pods, this node's by their ports (`pod_ports`).
    pub fn of(cluster: &Cluster, pod_ports: &BTreeMap<ObjectKey, String>) -> Names {
        let by_port = pod_ports
            .iter()
            .map(|(k, port)| (port.clone(), k.to_string()))
            .collect();
        let mut by_address = std::collections::HashMap::new();
        for (k, f) in cluster.all_pod_fields() {
            let Ok(f) = f else { continue };
            if f.host_network || f.finished {
                continue;
            }
            for ip in &f.ips {
                by_address.insert(*ip, k.to_string());
            }
        }
        Names {
            by_port,
            by_address,
        }
    }
}

/// The audit log's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditConfig {
    /// Where the lines go.
    pub target: Target,
    /// Lines a second at most (1 to [`MAX_RATE`]), with a burst of as many.
    pub rate: u32,
}

impl AuditConfig {
    /// Reads a rate of lines a second, 1 to [`MAX_RATE`].
    pub fn check_rate(rate: &str) -> Result<u32, String> {
        match rate.parse::<u32>() {
            Ok(r) if (1..=MAX_RATE).contains(&r) => Ok(r),
            _ => Err(format!(
                "{rate:?}: expected a number of lines a second, 1 to {MAX_RATE}"
            )),
        }
    }

    /// Opens the log for node `node`.
    pub fn open(&self, node: &str) -> io::Result<AuditLog> {
        Ok(AuditLog::new(self.target.open()?, node, self.rate))
    }
}

/// What the audit log counted since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuditCounts {
    /// Lines written for denied connections.
    pub logged: u64,
    /// Denials not logged as repeats of a connection logged (retransmissions).
    pub repeated: u64,
    /// Denials not logged: over the rate limit.
    pub suppressed_rate: u64,
    /// Denials not logged: the datapath's buffer was full.
    pub suppressed_overflow: u64,
    /// Lines that could not be written.
    pub write_errors: u64,
}

/// Denials unlogged for one reason, for the next summary line.
#[derive(Clone, Copy, Debug, Default)]
struct Pending {
    count: u64,
    last_summary_ns: Option<u64>,
}

/// The audit log: see the module documentation.
pub struct AuditLog {
    out: Box<dyn Write + Send>,
    node: String,
    limit: TokenBucket,
    repeats: Repeats,
    counts: AuditCounts,
    /// The datapath's overflow counter when last looked at.
    overflow_seen: u64,
    rate: Pending,
    overflow: Pending,
    last_error_report_ns: Option<u64>,
}

impl AuditLog {
    /// A log writing to `out` for node `node`, `rate` lines a second at most.
    pub fn new(out: Box<dyn Write + Send>, node: &str, rate: u32) -> AuditLog {
        AuditLog {
            out,
            node: node.to_string(),
            limit: TokenBucket::new(rate, rate),
            repeats: Repeats::new(REPEAT_WINDOW.as_nanos() as u64, REMEMBERED),
            counts: AuditCounts::default(),
            overflow_seen: 0,
            rate: Pending::default(),
            overflow: Pending::default(),
            last_error_report_ns: None,
        }
    }

    /// What it counted.
    pub fn counts(&self) -> AuditCounts {
        self.counts
    }

    /// Writes the lines of `denials` (oldest first), of summaries due, at pipeline time
    /// `now_ns` and wall time `wall_now`; `overflow_total` is the datapath's count of
    /// denials its buffer could not hold
    /// ([`ferry_datapath::PipelineStats::audit_overflow`]).
    pub fn write(
        &mut self,
        denials: &[Denial],
        names: &Names,
        overflow_total: u64,
        now_ns: u64,
        wall_now: SystemTime,
    ) {
        let lost = overflow_total.saturating_sub(self.overflow_seen);
        self.overflow_seen = self.overflow_seen.max(overflow_total);
        self.counts.suppressed_overflow += lost;
        self.overflow.count += lost;
        for d in denials {
            if self.repeats.is_repeat(&d.original, d.time_ns) {
                self.counts.repeated += 1;
                continue;
            }
            if !self.limit.take(d.time_ns) {
                self.counts.suppressed_rate += 1;
                self.rate.count += 1;
                continue;
            }
            self.repeats.logged(d.original, d.time_ns);
            let ago = Duration::from_nanos(now_ns.saturating_sub(d.time_ns));
            let at = wall_now.checked_sub(ago).unwrap_or(wall_now);
            let line = line::denied(d, at, &self.node, names);
            if self.emit(line, now_ns) {
                self.counts.logged += 1;
            }
        }
        for why in [Suppressed::Rate, Suppressed::Overflow] {
            let p = match why {
                Suppressed::Rate => &mut self.rate,
                Suppressed::Overflow => &mut self.overflow,
            };
            let due = p
                .last_summary_ns
                .is_none_or(|t| now_ns.saturating_sub(t) >= SUMMARY_EVERY.as_nanos() as u64);
            if p.count == 0 || !due {
                continue;
            }
            let count = std::mem::take(&mut p.count);
            p.last_summary_ns = Some(now_ns);
            let line = line::not_logged(wall_now, &self.node, why, count);
            self.emit(line, now_ns);
        }
    }

    /// Writes `line` and its newline in one write; false (counted, reported now and
    /// then) when it cannot.
    fn emit(&mut self, mut line: String, now_ns: u64) -> bool {
        line.push('\n');
        match self.out.write_all(line.as_bytes()) {
            Ok(()) => true,
            Err(e) => {
                self.counts.write_errors += 1;
                let every = WRITE_ERROR_REPORT_EVERY.as_nanos() as u64;
                if self
                    .last_error_report_ns
                    .is_none_or(|t| now_ns.saturating_sub(t) >= every)
                {
                    self.last_error_report_ns = Some(now_ns);
                    tracing::warn!(
                        errors = self.counts.write_errors,
                        "policy audit log: a line could not be written: {e}"
                    );
                }
                false
            }
        }
    }
}
