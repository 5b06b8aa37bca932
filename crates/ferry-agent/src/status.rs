//! What the agent knows about its own health, for `ferry status` and the metrics: the
//! datastore's state, how long cluster changes take to be in force, and errors by kind.
//!
//! The agent's loop reports here as things happen ([`AgentStatus::datastore_applied`],
//! [`AgentStatus::datastore_refused`], [`AgentStatus::synced`], [`AgentStatus::count`]);
//! [`crate::run::Agent::counters`] copies it into its answer.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_api::{AgentErrors, DatastoreHealth, PolicyEnforcement, SyncLatency};

use crate::cluster::Cluster;
use crate::datastore::{Problem, Refused};
use crate::policy::enforcement::{self, Sources};

/// Upper bounds of the sync latency histogram's buckets, in microseconds (1 ms to 5 s;
/// above that, +Inf).
pub const SYNC_BUCKETS_US: [u64; 12] = [
    1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000,
];

/// Upper bounds of the network programming latency histogram's buckets, in
/// microseconds: kube-proxy's (0, 0.25 s and 0.5 s, each second to 59 s, every 5 s to
/// 115 s, every 30 s to 300 s; above that, +Inf). The trigger times it measures from
/// have whole seconds.
pub const PROGRAMMING_BUCKETS_US: [u64; 81] = programming_buckets();

const fn programming_buckets() -> [u64; 81] {
    let mut b = [0u64; 81];
    b[1] = 250_000;
    b[2] = 500_000;
    let mut i = 0;
    while i < 59 {
        b[3 + i] = (i as u64 + 1) * 1_000_000;
        i += 1;
    }
    i = 0;
    while i < 12 {
        b[62 + i] = (60 + 5 * i as u64) * 1_000_000;
        i += 1;
    }
    i = 0;
    while i < 7 {
        b[74 + i] = (120 + 30 * i as u64) * 1_000_000;
        i += 1;
    }
    b
}

/// Adds `latency` to the figures `s` and to the bucket of `bounds` (then +Inf) in
/// `buckets` it falls in.
fn observe(s: &mut SyncLatency, bounds: &[u64], buckets: &mut [u64], latency: Duration) {
    let us = latency.as_micros().min(u128::from(u64::MAX)) as u64;
    s.count += 1;
    s.sum_us = s.sum_us.saturating_add(us);
    s.last_us = us;
    s.max_us = s.max_us.max(us);
    let i = bounds.iter().position(|&b| us <= b).unwrap_or(bounds.len());
    buckets[i] += 1;
}

/// The kinds of errors the agent counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The datastore refused a state or reported a watch error.
    Datastore,
    /// A cluster state did not compile into tables.
    Compile,
    /// New tables were not put in force (the worker did not take them, a port did not
    /// open), a recorded pod attachment was not adopted at start (or its record was
    /// unreadable), a pod's port went out of service while its pod is in the cluster
    /// (its device gone: the pod's network namespace deleted), or the `/healthz` address
    /// or a health check node port could not be listened on (counted once until it
    /// can).
    Apply,
    /// An API request was answered with an error (a DEL the CNI plugin queued
    /// included), or a file in the CNI plugin's DEL queue is not a DEL.
    Api,
}

/// The agent's health figures.
#[derive(Clone, Debug, Default)]
pub struct AgentStatus {
    datastore: DatastoreHealth,
    sync: SyncLatency,
    /// Per bucket of [`SYNC_BUCKETS_US`], then +Inf.
    buckets: [u64; SYNC_BUCKETS_US.len() + 1],
    programming: SyncLatency,
    /// Per bucket of [`PROGRAMMING_BUCKETS_US`], then +Inf.
    programming_buckets: Vec<u64>,
    errors: AgentErrors,
    /// The datastore's latest state, in force or not: its refusals of policies.
    latest: Option<Arc<Cluster>>,
    /// Why the latest state is not in force, while it is not.
    not_applied: Option<String>,
    /// The problems of the file datastore's refusal of its directory, while it stands.
    file_refused: Option<Vec<Problem>>,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl AgentStatus {
    /// Nothing known yet.
    pub fn new() -> AgentStatus {
        AgentStatus::default()
    }

    /// Names the datastore: `file` or `kubernetes`, and its directory or server.
    pub fn set_datastore(&mut self, kind: &str, source: &str) {
        self.datastore.kind = kind.to_string();
        self.datastore.source = source.to_string();
    }

    /// A state from the datastore, read at `read_unix_ms` (Unix time, ms), is in force
    /// now.
    pub fn datastore_applied(&mut self, read_unix_ms: u64) {
        self.datastore.synced = true;
        self.datastore.last_sync_unix_ms = Some(unix_ms());
        self.datastore.last_read_unix_ms = Some(read_unix_ms);
        self.not_applied = None;
        self.file_refused = None;
    }

    /// The datastore sent `cluster`, its latest state (to be put in force, or in force):
    /// what it refused of the policies is read from it.
    pub fn datastore_state(&mut self, cluster: Arc<Cluster>) {
        self.latest = Some(cluster);
    }

    /// The datastore refused a state or reported an error. The file datastore refuses
    /// whole states, and a problem of the Kubernetes datastore that names no object (a
    /// watch error, which may hide any change; the state held back for a bad
    /// ferry-config) concerns the whole state: these leave the datastore out of sync
    /// until its next good state. A single bad object from the Kubernetes datastore
    /// leaves the rest in force, so it counts and is kept as the last error without
    /// more.
    pub fn datastore_refused(&mut self, r: &Refused) {
        self.count(ErrorKind::Datastore);
        self.datastore.errors_total += 1;
        self.datastore.last_error = Some(r.to_string());
        if self.datastore.kind != "kubernetes" || r.problems.iter().any(|p| p.object.is_none()) {
            self.datastore.synced = false;
        }
        if self.datastore.kind == "file" {
            self.file_refused = Some(r.problems.clone());
        }
    }

    /// A state from the datastore could not be put in force (`error` says why; the
    /// agent counted it by kind where it happened); the tables in force stay.
    pub fn not_applied(&mut self, error: &str) {
        self.datastore.synced = false;
        self.datastore.last_error = Some(error.to_string());
        self.not_applied = Some(error.to_string());
    }

    /// The policies of `in_force` (the state whose tables are in force, with this node's
    /// pods `local`), and those not enforced as written
    /// ([`crate::policy::enforcement`]).
    pub fn enforcement(&self, in_force: &Cluster) -> PolicyEnforcement {
        enforcement::report(
            in_force,
            Sources {
                latest: self.latest.as_deref(),
                not_applied: self.not_applied.as_deref(),
                file_refused: self.file_refused.as_deref(),
            },
        )
    }

    /// A cluster change was in force in the worker `latency` after the agent saw it.
    pub fn synced(&mut self, latency: Duration) {
        observe(&mut self.sync, &SYNC_BUCKETS_US, &mut self.buckets, latency);
    }

    /// An EndpointSlice change was in force in the worker `latency` after its trigger
    /// time in the API server.
    pub fn programmed(&mut self, latency: Duration) {
        if self.programming_buckets.is_empty() {
            self.programming_buckets = vec![0; PROGRAMMING_BUCKETS_US.len() + 1];
        }
        observe(
            &mut self.programming,
            &PROGRAMMING_BUCKETS_US,
            &mut self.programming_buckets,
            latency,
        );
    }

    /// The network programming latency figures, with the histogram's buckets.
    pub fn programming(&self) -> SyncLatency {
        SyncLatency {
            buckets: PROGRAMMING_BUCKETS_US
                .iter()
                .copied()
                .chain([u64::MAX])
                .zip(
                    self.programming_buckets
                        .iter()
                        .copied()
                        .chain(std::iter::repeat(0)),
                )
                .collect(),
            ..self.programming.clone()
        }
    }

    /// Counts one error of `kind`.
    pub fn count(&mut self, kind: ErrorKind) {
        let e = &mut self.errors;
        match kind {
            ErrorKind::Datastore => e.datastore += 1,
            ErrorKind::Compile => e.compile += 1,
            ErrorKind::Apply => e.apply += 1,
            ErrorKind::Api => e.api += 1,
        }
    }

    /// The datastore's health.
    pub fn datastore(&self) -> DatastoreHealth {
        self.datastore.clone()
    }

    /// The sync latency figures, with the histogram's buckets.
    pub fn sync(&self) -> SyncLatency {
        SyncLatency {
            buckets: SYNC_BUCKETS_US
                .iter()
                .copied()
                .chain([u64::MAX])
                .zip(self.buckets)
                .collect(),
            ..self.sync.clone()
        }
    }

    /// The errors by kind.
    pub fn errors(&self) -> AgentErrors {
        self.errors.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datastore::Problem;

    fn problem(object: Option<&str>) -> Refused {
        Refused {
            problems: vec![Problem {
                file: "kubernetes".into(),
                line: None,
                object: object.map(str::to_string),
                field: None,
                message: "bad".into(),
            }],
        }
    }

    #[test]
    fn a_file_refusal_or_a_state_not_applied_marks_the_policies_until_a_state_applies() {
        let mut s = AgentStatus::new();
        s.set_datastore("file", "/etc/ferry/cluster");
        s.datastore_applied(1);
        let c = Cluster::default();
        assert_eq!(s.enforcement(&c).stale, None);
        let mut r = problem(Some("NetworkPolicy default/deny"));
        r.problems[0].file = "np.yaml".into();
        s.datastore_refused(&r);
        let e = s.enforcement(&c);
        assert!(e.stale.is_some(), "{e:?}");
        assert_eq!(e.unenforced[0].policy, "default/deny");
        assert_eq!(e.unenforced[0].reasons, ["refused: np.yaml: bad"]);
        s.datastore_applied(1);
        let e = s.enforcement(&c);
        assert_eq!((e.stale, e.unenforced.len()), (None, 0));
        s.not_applied("the worker is slow");
        assert!((s.enforcement(&c).stale).is_some_and(|x| x.ends_with("the worker is slow")));
        s.datastore_applied(1);
        assert_eq!(s.enforcement(&c).stale, None);
    }

    #[test]
    fn sync_latencies_fall_into_buckets() {
        let mut s = AgentStatus::new();
        s.synced(Duration::from_micros(800));
        s.synced(Duration::from_millis(3));
        s.synced(Duration::from_secs(60));
        let l = s.sync();
        assert_eq!((l.count, l.last_us, l.max_us), (3, 60_000_000, 60_000_000));
        assert_eq!(l.sum_us, 800 + 3_000 + 60_000_000);
        assert_eq!(l.buckets.len(), SYNC_BUCKETS_US.len() + 1);
        assert_eq!(l.buckets[0], (1_000, 1));
        assert_eq!(l.buckets[2], (5_000, 1), "3 ms: at most 5 ms");
        assert_eq!(*l.buckets.last().unwrap(), (u64::MAX, 1));
    }

    #[test]
    fn programming_latencies_fall_into_kube_proxys_buckets() {
        let mut s = AgentStatus::new();
        let l = s.programming();
        assert_eq!((l.count, l.buckets.len()), (0, 82));
        assert!(l.buckets.iter().all(|&(_, n)| n == 0));
        s.programmed(Duration::ZERO);
        s.programmed(Duration::from_millis(200));
        s.programmed(Duration::from_millis(1_500));
        s.programmed(Duration::from_secs(62));
        s.programmed(Duration::from_secs(400));
        let l = s.programming();
        assert_eq!(l.count, 5);
        let n = |le: u64| l.buckets.iter().find(|b| b.0 == le).unwrap().1;
        assert_eq!(n(0), 1, "a clock ahead: the 0 bucket");
        assert_eq!(n(250_000), 1);
        assert_eq!(n(2_000_000), 1, "1.5 s: at most 2 s");
        assert_eq!(n(65_000_000), 1, "62 s: at most 65 s");
        assert_eq!(n(u64::MAX), 1);
        let bounds: Vec<u64> = l.buckets.iter().map(|b| b.0).collect();
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{bounds:?}");
        assert_eq!(bounds[bounds.len() - 2], 300_000_000);
    }

    #[test]
    fn a_refusal_unsyncs_unless_it_is_one_kubernetes_object() {
        let mut s = AgentStatus::new();
        s.set_datastore("kubernetes", "https://10.0.0.1:6443");
        s.datastore_applied(1);
        s.datastore_refused(&problem(Some("Service default/broken")));
        let d = s.datastore();
        assert!(d.synced, "the rest of the state is in force");
        assert_eq!(d.errors_total, 1);
        assert!(d.last_error.unwrap().contains("Service default/broken"));
        s.datastore_refused(&problem(None));
        assert!(!s.datastore().synced, "a watch error");
        s.datastore_applied(1);
        assert!(s.datastore().synced);
        assert_eq!(s.errors().datastore, 2);

        let mut f = AgentStatus::new();
        f.set_datastore("file", "/etc/ferry/cluster");
        f.datastore_applied(1);
        f.datastore_refused(&problem(Some("Service default/broken")));
        assert!(
            !f.datastore().synced,
            "the file datastore refuses whole states"
        );
        f.datastore_applied(1);
        f.count(ErrorKind::Compile);
        f.not_applied("Service default/x: no port");
        assert!(!f.datastore().synced);
        assert_eq!(f.errors().compile, 1);
    }
}
