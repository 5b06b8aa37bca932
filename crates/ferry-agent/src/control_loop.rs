//! The agent's control loop: one node's dataplane driven by cluster state. It watches the
//! datastore, compiles the node's tables on every change and swaps them into the running
//! worker ([`Agent`]); a bad change is reported (file, object, field) and the tables in
//! force stay. A state the agent could not put in force (a pod's namespace not there
//! yet) is tried again, with a growing delay, until it applies or a newer state replaces
//! it; meanwhile its changes of Services and EndpointSlices are put in force alone.
//! Between changes it answers the local API ([`ApiServer`]), carries out the DELs the CNI
//! plugin queued ([`crate::del_queue`]) and does the agent's housekeeping.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use std::os::unix::net::UnixStream;

use ferry_api::{Request, Response};
use k8s_openapi::jiff::Timestamp;

use crate::api::{ANSWER_TIMEOUT, ApiServer};
use crate::cluster::{Cluster, Kind, ObjectKey};
use crate::datastore::{OpenError, Source, Update};
use crate::handover::{self, AfterHandover};
use crate::metrics::MetricsServer;
use crate::run::{Agent, Applied, Options};

/// How often the manifest directory is looked at.
const POLL: Duration = Duration::from_millis(100);
/// Longest wait for a cluster change before API requests are looked at.
const API_POLL: Duration = Duration::from_millis(10);
/// How often the loop looks for DELs the CNI plugin queued ([`crate::del_queue`]).
const DEL_QUEUE_SCAN: Duration = Duration::from_secs(1);

/// The first delay before a state that was not applied is tried again; each failure of
/// the same state doubles it, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest delay between two tries of a state that was not applied.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// What the loop runs with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The agent's own options.
    pub agent: Options,
    /// Where the cluster state comes from.
    pub datastore: Source,
    /// The local API socket, where the CNI plugin and the `ferry` tools ask.
    pub api_socket: PathBuf,
    /// Where to serve Prometheus metrics; None: nowhere.
    pub metrics_addr: Option<SocketAddr>,
    /// What this agent does once it handed the node over to a new one.
    pub after_handover: AfterHandover,
}

/// Why [`run`] stopped before it was told to.
#[derive(Debug)]
pub enum Error {
    /// The datastore could not be opened.
    Datastore(OpenError),
    /// The node could not start (its first state does not compile, a port did not
    /// open).
    Start(String),
    /// The API socket could not be listened on.
    ApiSocket(io::Error),
    /// The metrics address could not be listened on.
    Metrics(SocketAddr, io::Error),
    /// The worker stopped on its own, with this error.
    WorkerStopped(String),
    /// The worker did not stop cleanly.
    Stop(String),
    /// The agent running on the node did not hand over (it forwards on).
    Handover(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Datastore(e) => write!(f, "{e}"),
            Error::Start(e) | Error::Stop(e) => f.write_str(e),
            Error::Handover(e) => write!(f, "handover: {e}"),
            Error::ApiSocket(e) => write!(f, "{e}"),
            Error::Metrics(addr, e) => write!(f, "{addr}: {e}"),
            Error::WorkerStopped(e) => write!(f, "the worker stopped: {e}"),
        }
    }
}

impl std::error::Error for Error {}

/// Runs the agent until `stop` is set (by a signal handler).
pub fn run(settings: Settings, stop: &AtomicBool) -> Result<(), Error> {
    let Settings {
        agent: opts,
        datastore,
        api_socket,
        metrics_addr,
        after_handover,
    } = settings;
    let node = opts.node.clone();
    tracing::info!(node = %node, pid = std::process::id(), version = env!("CARGO_PKG_VERSION"),
        "ferry agent starting");
    let watch = datastore.open(&node, POLL).map_err(Error::Datastore)?;
    // The first good state starts the node (the Kubernetes datastore gives it once every
    // kind is listed).
    let mut early = Vec::new();
    let (mut in_force, first_read): (Arc<Cluster>, u64) = loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        match watch.next_update(POLL) {
            Some(Update::Applied {
                cluster,
                notes,
                read_unix_ms,
            }) => {
                for n in &notes {
                    tracing::warn!("{n}");
                }
                break (cluster, read_unix_ms);
            }
            Some(Update::Refused(r)) => {
                tracing::error!("{datastore}: waiting for a good state:\n{r}");
                // Counted once the agent runs; a datastore that stays unreachable for
                // long is counted up to this many times.
                if early.len() < 1000 {
                    early.push(r);
                }
            }
            None => {}
        }
    };
    // An agent running on the socket hands the node over (`crate::handover`); one that
    // does not want to is left alone, and this one does not start.
    let taking = handover::ask(&api_socket).map_err(Error::Handover)?;
    let t0 = Instant::now();
    // Trigger times before this are of changes made before the agent ran: their wait is
    // not counted (a restart would count every change made while no agent ran).
    let started = Timestamp::now();
    let (mut agent, applied, api_listener) = match taking {
        None => {
            let (agent, applied) =
                Agent::start(opts, Arc::clone(&in_force)).map_err(Error::Start)?;
            (agent, applied, None)
        }
        Some((mut taking, inherited)) => {
            let listener = taking.api_listener();
            match Agent::prepare(opts, Arc::clone(&in_force), inherited) {
                Err(e) => {
                    taking.abort(&e);
                    return Err(Error::Start(e));
                }
                Ok(starting) => {
                    let (agent, applied) = taking.finish(starting).map_err(Error::Handover)?;
                    (agent, applied, listener)
                }
            }
        }
    };
    let source = match &datastore {
        Source::File(dir) => dir.display().to_string(),
        Source::Kubernetes { .. } => watch
            .source()
            .map(str::to_string)
            .unwrap_or_else(|| datastore.to_string()),
    };
    let status = agent.status_mut();
    status.set_datastore(datastore.kind(), &source);
    for r in &early {
        status.datastore_refused(r);
    }
    status.synced(t0.elapsed());
    status.datastore_applied(first_read);
    status.datastore_state(Arc::clone(&in_force));
    let mut api = match api_listener {
        Some(l) => ApiServer::from_listener(&api_socket, l),
        None => ApiServer::bind(&api_socket),
    }
    .map_err(Error::ApiSocket)?;
    let _metrics = match metrics_addr {
        Some(addr) => Some(
            MetricsServer::bind(addr, api_socket.clone()).map_err(|e| Error::Metrics(addr, e))?,
        ),
        None => None,
    };
    for addr in crate::accept::drop_inherited() {
        tracing::info!(%addr, "a listener handed over is not served any more: closed");
    }
    report(&applied);
    if let Some(t) = agent.taken() {
        let ips = in_force
            .node(&node)
            .and_then(|n| crate::fields::NodeFields::parse(n).ok())
            .map(|f| f.internal_ips)
            .unwrap_or_default();
        let annotations = crate::takeover::annotations(t, &ips);
        if !watch.annotate_node(annotations.clone()) {
            tracing::info!(annotations = ?annotations,
                "the file datastore is not written: the Node's manifest keeps its own annotations");
        }
    }
    tracing::info!(
        node = %node,
        ports = applied.opened.len(),
        health_ports = ?agent.health_ports(),
        healthz = ?agent.healthz_addr(),
        "ferry agent running; stop with SIGINT, SIGTERM, SIGHUP or SIGQUIT"
    );
    let mut retry = Retry::default();
    // DELs the CNI plugin queued after the agent read its queue at start (it found no
    // socket yet) are carried out before the first request, then every second.
    let mut queue_due = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if !agent.is_running() {
            return Err(Error::WorkerStopped(
                agent.worker_error().unwrap_or_default(),
            ));
        }
        agent.housekeeping();
        if Instant::now() >= queue_due {
            agent.carry_out_queued_dels(&in_force);
            queue_due = Instant::now() + DEL_QUEUE_SCAN;
        }
        if let Some(asked) = answer_requests(&mut agent, &api, &in_force) {
            match agent.give_over(asked.conn, &mut api, asked.taker, asked.precopy) {
                handover::Given::Done => handover::leave(after_handover),
                handover::Given::Failed(_) => {}
            }
        }
        match watch.next_update(API_POLL) {
            None => {}
            Some(Update::Refused(r)) => {
                agent.status_mut().datastore_refused(&r);
                tracing::error!("{datastore}: change refused, the tables in force stay:\n{r}");
            }
            Some(Update::Applied {
                cluster,
                notes,
                read_unix_ms,
            }) => {
                for n in &notes {
                    tracing::warn!("{n}");
                }
                agent.status_mut().datastore_state(Arc::clone(&cluster));
                // A newer state replaces one waiting to be tried again.
                retry.clear();
                let read = Read {
                    cluster,
                    read_unix_ms,
                };
                put_in_force(&mut agent, &mut in_force, read, &mut retry, started);
            }
        }
        if let Some(read) = retry.due(Instant::now()) {
            put_in_force(&mut agent, &mut in_force, read, &mut retry, started);
        }
    }
    // The CNI plugin's pod interfaces stay (persistent TAPs, recorded in the state
    // directory) for the next agent; `--pod` pods' interfaces go with the agent, and the
    // connection state is written for the next agent.
    agent.checkpoint();
    let stats = agent.stop().map_err(Error::Stop)?;
    tracing::info!(
        rx = stats.rx_frames,
        tx = stats.tx_frames,
        updates = stats.updates,
        "ferry agent stopped"
    );
    Ok(())
}

/// A new agent that asked for the node.
struct Asked {
    conn: UnixStream,
    taker: u32,
    precopy: bool,
}

/// Answers the local API's requests waiting now; `in_force` is the state in force. A
/// handover request ends the round: its connection, the asking agent's pid and whether
/// it takes a pre-copy are returned, for the loop to carry it out.
fn answer_requests(agent: &mut Agent, api: &ApiServer, in_force: &Arc<Cluster>) -> Option<Asked> {
    while let Ok(pending) = api.requests().try_recv() {
        match pending.take_conversation() {
            Ok((
                Request::Handover {
                    version,
                    pid,
                    precopy,
                },
                answer,
                Some(conn),
            )) => {
                tracing::info!(taker = pid, %version, precopy, "a new agent asks for the node");
                // Its connection thread waits for this, and then writes nothing.
                let _ = answer.send(Response::Ok(Default::default()));
                return Some(Asked {
                    conn,
                    taker: pid,
                    precopy,
                });
            }
            Ok((req, answer, _)) => {
                tracing::debug!(?req, "api request");
                let _ = answer.send(agent.handle(Arc::clone(in_force), req));
            }
            // Its client was told the agent did not answer in time, and may have
            // acted on that (the CNI plugin released an ADD's addresses).
            Err(req) => tracing::warn!(
                ?req,
                "api request dropped: not taken within {ANSWER_TIMEOUT:?}, its client was told so"
            ),
        }
    }
    None
}

fn report(a: &Applied) {
    tracing::info!(
        generation = a.generation,
        compile_ms = a.compile.as_secs_f64() * 1e3,
        swap_ms = a.swap.as_secs_f64() * 1e3,
        opened = ?a.opened,
        closed = ?a.closed,
        ct_removed = a.ct_removed,
        policy_cut = a.policy_cut,
        incremental = a.incremental,
        "tables applied"
    );
    for w in &a.warnings {
        tracing::warn!("{w}");
    }
}

/// A cluster state the agent could not put in force (a `--pod` namespace not made yet,
/// the worker slow to take the tables): the file datastore says a state once, so the
/// agent tries it again itself, after [`RETRY_FIRST`], doubling up to [`RETRY_MAX`],
/// until it applies or the datastore sends a newer one (which is tried at once).
#[derive(Debug, Default)]
struct Retry {
    pending: Option<Pending>,
    /// When the first try that failed began, of the states not put in force since (a
    /// newer state that replaces a failing one carries its change too): where the sync
    /// latency of the state finally put in force starts.
    since: Option<Instant>,
}

/// A state from the datastore and when it was read ([`Update::Applied`]).
#[derive(Debug)]
struct Read {
    cluster: Arc<Cluster>,
    read_unix_ms: u64,
}

#[derive(Debug)]
struct Pending {
    cluster: Arc<Cluster>,
    read_unix_ms: u64,
    /// Tries of this state that failed.
    failures: u32,
    /// When to try it again.
    at: Instant,
}

impl Retry {
    /// `cluster` was not applied at `now`, in a try that began at `began`: it is tried
    /// again later. Returns the number of failures of this state so far and the delay
    /// before the next try.
    fn failed(
        &mut self,
        cluster: &Arc<Cluster>,
        read_unix_ms: u64,
        began: Instant,
        now: Instant,
    ) -> (u32, Duration) {
        self.since.get_or_insert(began);
        let failures = match &self.pending {
            Some(p) if Arc::ptr_eq(&p.cluster, cluster) => p.failures + 1,
            _ => 1,
        };
        let delay = RETRY_FIRST
            .saturating_mul(1 << (failures - 1).min(16))
            .min(RETRY_MAX);
        self.pending = Some(Pending {
            cluster: Arc::clone(cluster),
            read_unix_ms,
            failures,
            at: now + delay,
        });
        (failures, delay)
    }

    /// The state to try again, once its time has come.
    fn due(&self, now: Instant) -> Option<Read> {
        let p = self.pending.as_ref()?;
        (now >= p.at).then(|| Read {
            cluster: Arc::clone(&p.cluster),
            read_unix_ms: p.read_unix_ms,
        })
    }

    /// Nothing to try again: a state was applied, or a newer one came. Returns the
    /// failures of the state dropped (0 when there was none).
    fn clear(&mut self) -> u32 {
        self.pending.take().map_or(0, |p| p.failures)
    }

    /// A state was put in force at `now`, after a try that took `took` and began at
    /// `began`: its sync latency, from the first try that failed since the last state
    /// put in force (the change waited from then), else of this try alone.
    fn in_force(&mut self, began: Instant, took: Duration, now: Instant) -> Duration {
        self.clear();
        match self.since.take() {
            Some(s) if s < began => now.saturating_duration_since(s),
            _ => took,
        }
    }
}

/// The annotation on an EndpointSlice of the time of the change it records, in the API
/// server (set by the EndpointSlice controller, in whole seconds).
const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// kube-proxy's network programming latencies of a state `cluster` put in force at
/// `now` in place of `before`: for each EndpointSlice of `changed` whose endpoints or
/// ports differ from `before`'s (a change of its metadata alone is none; a deleted slice
/// has none), that is a Service's (labelled `kubernetes.io/service-name`, not of
/// `addressType` FQDN) and whose trigger time is after `started`, from that time to
/// `now` (0 when the API server's clock is ahead of the node's). A slice changed several
/// times before the state was put in force counts once, with its latest trigger time; a
/// trigger time that does not parse is left out.
fn programming_latencies(
    before: &Cluster,
    cluster: &Cluster,
    changed: &[(Kind, ObjectKey)],
    started: Timestamp,
    now: Timestamp,
) -> Vec<Duration> {
    changed
        .iter()
        .filter(|(kind, _)| *kind == Kind::EndpointSlice)
        .filter_map(|(_, key)| {
            let slice = cluster.endpoint_slices.get(key)?;
            let moved = before
                .endpoint_slices
                .get(key)
                .is_none_or(|old| old.endpoints != slice.endpoints || old.ports != slice.ports);
            let a_services = slice.address_type != "FQDN"
                && slice
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(crate::fields::SERVICE_NAME_LABEL));
            (moved && a_services).then_some(slice)
        })
        .filter_map(|slice| {
            let t: Timestamp = slice
                .metadata
                .annotations
                .as_ref()?
                .get(TRIGGER_TIME)?
                .parse()
                .ok()?;
            (t > started)
                .then(|| Duration::try_from(now.duration_since(t)).unwrap_or(Duration::ZERO))
        })
        .collect()
}

/// Puts `cluster` in force in `agent` (compiling what differs from `in_force`) and
/// reports it; on an error, `retry` schedules it again, and its changes of Services and
/// EndpointSlices alone are put in force (`in_force` becomes the state in force with
/// them), so that a change the agent cannot put in force holds back no endpoint change.
fn put_in_force(
    agent: &mut Agent,
    in_force: &mut Arc<Cluster>,
    read: Read,
    retry: &mut Retry,
    started: Timestamp,
) {
    let Read {
        cluster,
        read_unix_ms,
    } = read;
    let t0 = Instant::now();
    let changed = in_force.diff(&cluster);
    let diffed = t0.elapsed();
    if changed.is_empty() {
        retry.clear();
        retry.since = None;
        agent.up_to_date();
        agent.status_mut().datastore_applied(read_unix_ms);
        return;
    }
    match agent.apply_changes(Arc::clone(&cluster), &changed) {
        Ok(a) => {
            let failures = retry.pending.as_ref().map_or(0, |p| p.failures);
            let latency = retry.in_force(t0, diffed + a.compile + a.swap, Instant::now());
            let status = agent.status_mut();
            status.synced(latency);
            for l in programming_latencies(in_force, &cluster, &changed, started, Timestamp::now())
            {
                status.programmed(l);
            }
            status.datastore_applied(read_unix_ms);
            if failures > 0 {
                tracing::info!(failures, "cluster state applied on another try");
            }
            report(&a);
            tracing::debug!(
                changed = changed.len(),
                diff_ms = diffed.as_secs_f64() * 1e3,
                total_ms = t0.elapsed().as_secs_f64() * 1e3
            );
            *in_force = cluster;
        }
        Err(e) => {
            agent.status_mut().not_applied(&e);
            let (failures, delay) = retry.failed(&cluster, read_unix_ms, t0, Instant::now());
            // The first failure is news; the same again is not worth an error each time.
            if failures == 1 {
                tracing::error!(
                    "cluster state not applied, the tables in force stay; trying again in {delay:?}: {e}"
                );
            } else {
                tracing::warn!(
                    failures,
                    "cluster state still not applied; trying again in {delay:?}: {e}"
                );
            }
            // Its Services' and EndpointSlices' changes need not wait for the rest.
            match agent.apply_services_alone(&cluster, &changed) {
                Some(Ok((part, a))) => {
                    tracing::info!(
                        "the Services' changes of that state put in force alone; the rest waits"
                    );
                    report(&a);
                    *in_force = part;
                }
                Some(Err(e)) => {
                    tracing::warn!(
                        "the Services' changes of that state not put in force either: {e}"
                    )
                }
                None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use k8s_openapi::api::discovery::v1::EndpointSlice;

    fn slice(name: &str, trigger: Option<&str>) -> (ObjectKey, Arc<EndpointSlice>) {
        let mut s = EndpointSlice {
            address_type: "IPv4".into(),
            ..EndpointSlice::default()
        };
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("default".into());
        s.metadata.labels = Some(
            [(
                crate::fields::SERVICE_NAME_LABEL.to_string(),
                "web".to_string(),
            )]
            .into(),
        );
        s.metadata.annotations =
            trigger.map(|t| [(TRIGGER_TIME.to_string(), t.to_string())].into());
        (ObjectKey::new("default", name), Arc::new(s))
    }

    #[test]
    fn programming_latencies_count_from_the_trigger_times_of_the_changed_slices() {
        let mut cluster = Cluster::default();
        for (k, s) in [
            slice("a", Some("2026-11-20T10:02:14Z")),
            slice("old", Some("2026-11-20T09:00:00Z")),
            slice("none", None),
            slice("bad", Some("yesterday")),
            slice("ahead", Some("2026-11-20T10:02:20Z")),
            slice("unchanged", Some("2026-11-20T10:02:15Z")),
            slice("labels", Some("2026-11-20T10:02:15Z")),
            slice("fqdn", Some("2026-11-20T10:02:15Z")),
            slice("unowned", Some("2026-11-20T10:02:15Z")),
        ] {
            cluster.endpoint_slices.insert(k, s);
        }
        // Before: `labels` with the same endpoints and ports, other labels.
        let mut before = Cluster::default();
        let mut old = (*cluster.endpoint_slices[&ObjectKey::new("default", "labels")]).clone();
        old.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "a".into());
        before
            .endpoint_slices
            .insert(ObjectKey::new("default", "labels"), Arc::new(old));
        let k = |n: &str| ObjectKey::new("default", n);
        Arc::make_mut(cluster.endpoint_slices.get_mut(&k("fqdn")).unwrap()).address_type =
            "FQDN".into();
        Arc::make_mut(cluster.endpoint_slices.get_mut(&k("unowned")).unwrap())
            .metadata
            .labels = None;
        let started: Timestamp = "2026-11-20T10:00:00Z".parse().unwrap();
        let now: Timestamp = "2026-11-20T10:02:16.5Z".parse().unwrap();
        let key = |n: &str| (Kind::EndpointSlice, ObjectKey::new("default", n));
        let changed = vec![
            key("a"),
            key("old"),
            key("none"),
            key("bad"),
            key("ahead"),
            // Deleted: no longer in the state.
            key("gone"),
            // Another kind of the same name.
            (Kind::Service, ObjectKey::new("default", "unchanged")),
            key("labels"),
            key("fqdn"),
            key("unowned"),
        ];
        assert_eq!(
            programming_latencies(&before, &cluster, &changed, started, now),
            // a: 2.5 s; old: before the agent started; none, bad: no trigger time;
            // ahead: the API server's clock ahead, 0; unchanged: not changed; labels:
            // its metadata alone changed; fqdn, unowned: no Service's slice.
            vec![Duration::from_millis(2_500), Duration::ZERO]
        );
    }

    #[test]
    fn a_state_not_applied_is_tried_again_after_a_doubling_delay() {
        let mut r = Retry::default();
        let t0 = Instant::now();
        assert!(r.due(t0).is_none(), "nothing failed yet");
        let state = Arc::new(Cluster::default());
        assert_eq!(r.failed(&state, 7, t0, t0), (1, Duration::from_secs(1)));
        assert!(r.due(t0 + Duration::from_millis(999)).is_none());
        let due = r.due(t0 + Duration::from_secs(1)).expect("due after 1 s");
        assert!(Arc::ptr_eq(&due.cluster, &state));
        assert_eq!(due.read_unix_ms, 7, "tried again as read");
        // The same state failing again waits twice as long each time, up to 30 s.
        let mut now = t0;
        let delays: Vec<u64> = (0..7)
            .map(|_| {
                now += Duration::from_secs(1);
                r.failed(&state, 7, now, now).1.as_secs()
            })
            .collect();
        assert_eq!(delays, [2, 4, 8, 16, 30, 30, 30]);
        assert!(r.due(now + Duration::from_secs(29)).is_none());
        assert!(r.due(now + Duration::from_secs(30)).is_some());
        // Still due until it applies or a newer state replaces it.
        assert!(r.due(now + Duration::from_secs(300)).is_some());
    }

    #[test]
    fn a_newer_state_starts_the_delay_again_and_an_applied_one_ends_the_retries() {
        let mut r = Retry::default();
        let t0 = Instant::now();
        let old = Arc::new(Cluster::default());
        r.failed(&old, 7, t0, t0);
        r.failed(&old, 7, t0, t0);
        assert_eq!(r.failed(&old, 7, t0, t0).1, Duration::from_secs(4));
        // A newer state (another Arc, even with the same objects) that fails too.
        let newer = Arc::new(Cluster::default());
        assert_eq!(r.failed(&newer, 7, t0, t0), (1, Duration::from_secs(1)));
        let due = r.due(t0 + Duration::from_secs(1)).unwrap();
        assert!(
            Arc::ptr_eq(&due.cluster, &newer),
            "the newer state is the one tried"
        );
        assert_eq!(r.clear(), 1);
        assert!(r.due(t0 + Duration::from_secs(3600)).is_none());
        assert_eq!(r.clear(), 0);
    }

    #[test]
    fn the_sync_latency_of_a_state_put_in_force_after_failures_counts_from_the_first() {
        let mut r = Retry::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // Put in force at the first try: that try's time.
        assert_eq!(r.in_force(t0, ms(3), t0 + ms(3)), ms(3));
        // A state failing at t0 and again, replaced by a newer one that applies 40 s on:
        // the change waited from t0.
        let old = Arc::new(Cluster::default());
        r.failed(&old, 7, t0, t0 + ms(2));
        r.failed(&old, 7, t0 + ms(1000), t0 + ms(1002));
        r.clear();
        let newer = Arc::new(Cluster::default());
        r.failed(&newer, 7, t0 + ms(5000), t0 + ms(5002));
        let done = t0 + ms(40_000);
        assert_eq!(r.in_force(done - ms(4), ms(4), done), ms(40_000));
        // And the next state starts afresh.
        assert_eq!(r.in_force(done + ms(10), ms(2), done + ms(12)), ms(2));
        assert!(r.due(done + ms(3_600_000)).is_none());
    }

    #[test]
    fn datastore_sources_parse_or_say_what_was_expected() {
        assert_eq!(
            Source::parse("file:/etc/ferry").unwrap(),
            Source::File("/etc/ferry".into())
        );
        assert_eq!(
            Source::parse("kubernetes").unwrap(),
            Source::Kubernetes { kubeconfig: None }
        );
        assert_eq!(
            Source::parse("kubernetes:/k/config").unwrap(),
            Source::Kubernetes {
                kubeconfig: Some("/k/config".into())
            }
        );
        for spec in ["file:/etc/ferry", "kubernetes", "kubernetes:/k/config"] {
            assert_eq!(Source::parse(spec).unwrap().to_string(), spec);
        }
        assert_eq!(
            Source::parse("file:").unwrap_err(),
            "the directory is missing: expected file:DIR"
        );
        for bad in ["etcd:x", "kubernetes:", "file", ""] {
            let e = Source::parse(bad).unwrap_err();
            assert!(
                e.contains("expected file:DIR, kubernetes or kubernetes:KUBECONFIG"),
                "{bad}: {e}"
            );
        }
    }
}
