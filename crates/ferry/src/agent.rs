//! `ferry agent`: one node's dataplane driven by cluster state. It watches the datastore,
//! compiles the node's tables on every change and swaps them into the running worker;
//! a bad change is reported (file, object, field) and the tables in force stay. A state
//! the agent could not put in force (a pod's namespace not there yet) is tried again,
//! with a growing delay, until it applies or a newer state replaces it; meanwhile its
//! changes of Services and EndpointSlices are put in force alone.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use ferry_agent::api::ApiServer;
use ferry_agent::compile::CompileOptions;
use ferry_agent::datastore::file::FileDatastore;
use ferry_agent::datastore::{Update, Watch};
use ferry_agent::metrics::MetricsServer;
use ferry_agent::run::{Agent, Applied, Options};
use ferry_agent::{Cluster, ObjectKey};
use ferry_agent::{KubeDatastore, KubeOptions};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::tables::read_tables_spec;

/// How often the manifest directory is looked at.
const POLL: Duration = Duration::from_millis(100);
/// Longest wait for a cluster change before API requests are looked at.
const API_POLL: Duration = Duration::from_millis(10);
/// How often the loop looks for DELs the CNI plugin queued ([`ferry_agent::del_queue`]).
const DEL_QUEUE_SCAN: Duration = Duration::from_secs(1);

/// The first delay before a state that was not applied is tried again; each failure of
/// the same state doubles it, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest delay between two tries of a state that was not applied.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The default `--state-dir`.
pub const DEFAULT_STATE_DIR: &str = "/run/ferry/state";

/// Arguments of `ferry agent`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// This node's name: the Node object whose tables to program.
    #[arg(long, value_name = "NAME")]
    pub node: String,
    /// Where cluster state comes from: `file:DIR`, a directory of Kubernetes manifests,
    /// watched (edits apply live); `kubernetes`, the API server of the in-cluster
    /// configuration or the usual kubeconfig; `kubernetes:KUBECONFIG`, with that
    /// kubeconfig file.
    #[arg(long, value_name = "file:DIR|kubernetes[:KUBECONFIG]")]
    pub datastore: String,
    /// Base tables: the ports, routes and settings the cluster does not say (default:
    /// one uplink derived from the Node object; see docs/agent.md).
    #[arg(long, value_name = "FILE")]
    pub base: Option<PathBuf>,
    /// The Linux interface of the uplink port (read and written through AF_PACKET).
    #[arg(long, value_name = "IFNAME")]
    pub uplink: Option<String>,
    /// The name of a TAP for the base's host port (the node's own stack).
    #[arg(long, value_name = "NAME")]
    pub host_tap: Option<String>,
    /// A pod attached to this node: NAMESPACE/NAME=NETNS puts its eth0 (a TAP with its
    /// addresses, MAC and MTU) into network namespace NETNS once the pod is in the
    /// cluster state; repeatable.
    #[arg(long = "pod", value_name = "NS/NAME=NETNS")]
    pub pods: Vec<String>,
    /// External traffic to another node's endpoint leaves with this node's address
    /// instead of keeping the client's (for Services that neither their
    /// ferry.io/external-snat annotation nor the ferry-config ConfigMap decide).
    #[arg(long)]
    pub external_snat: bool,
    /// Leave the host kernel processing what arrives on the uplink as well.
    #[arg(long)]
    pub share_uplink: bool,
    /// Worker threads, 1 to 64, or `auto` for one per core this process may run on (see
    /// docs/agent.md): the uplink gets one AF_PACKET socket per worker in a fanout group,
    /// and each pod's TAP one queue per worker.
    #[arg(long, default_value = "1", value_name = "N|auto", value_parser = crate::node::parse_workers)]
    pub workers: u16,
    /// Pin worker i to the i-th CPU this process may run on (wrapping around).
    #[arg(long)]
    pub pin_workers: bool,
    /// After receiving, a worker polls without sleeping for this many microseconds
    /// (0 to 1000000) before it sleeps again: lower latency, for a core kept busy while
    /// traffic flows (see docs/agent.md). 0: off.
    #[arg(long, default_value = "0", value_name = "MICROSECONDS", value_parser = crate::node::parse_busy_poll)]
    pub busy_poll: u32,
    /// The local API socket (root only), where the CNI plugin asks for pods'
    /// interfaces.
    #[arg(long, value_name = "PATH", default_value = ferry_api::DEFAULT_SOCKET)]
    pub api_socket: PathBuf,
    /// Where the pod interfaces the CNI plugin asked for are recorded, so that a
    /// restarted agent adopts them (see docs/agent.md, "Restarts").
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 0.0.0.0:9250).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Serve kube-proxy's health endpoints, GET /healthz and /livez, at ADDR, which
    /// cloud load balancers check (see docs/agent.md); `off` or empty: nowhere. The
    /// default, [::]:10256, takes IPv4 too (kube-proxy's 0.0.0.0:10256 and [::]:10256).
    #[arg(long, value_name = "ADDR|off", default_value = DEFAULT_HEALTHZ_ADDR)]
    pub healthz_addr: String,
}

/// The default `--healthz-addr`: kube-proxy's health port on every address.
pub const DEFAULT_HEALTHZ_ADDR: &str = "[::]:10256";

/// The address of `--healthz-addr SPEC`; None for `off` or empty.
fn parse_healthz_addr(spec: &str) -> Result<Option<std::net::SocketAddr>> {
    match spec {
        "" | "off" => Ok(None),
        _ => spec.parse().map(Some).map_err(|_| {
            anyhow!(
                "--healthz-addr {spec:?}: expected ADDR:PORT ([::]:10256, 0.0.0.0:10256) or off"
            )
        }),
    }
}

fn parse_pod(spec: &str) -> Result<(ObjectKey, String)> {
    let bad = || anyhow!("--pod {spec:?}: expected NAMESPACE/NAME=NETNS");
    let (pod, netns) = spec.split_once('=').ok_or_else(bad)?;
    let (ns, name) = pod.split_once('/').ok_or_else(bad)?;
    if ns.is_empty() || name.is_empty() || netns.is_empty() || name.contains('/') {
        return Err(bad());
    }
    Ok((ObjectKey::new(ns, name), netns.to_string()))
}

fn report(a: &Applied) {
    tracing::info!(
        generation = a.generation,
        compile_ms = a.compile.as_secs_f64() * 1e3,
        swap_ms = a.swap.as_secs_f64() * 1e3,
        opened = ?a.opened,
        closed = ?a.closed,
        ct_removed = a.ct_removed,
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

#[derive(Debug)]
struct Pending {
    cluster: Arc<Cluster>,
    /// Tries of this state that failed.
    failures: u32,
    /// When to try it again.
    at: Instant,
}

impl Retry {
    /// `cluster` was not applied at `now`, in a try that began at `began`: it is tried
    /// again later. Returns the number of failures of this state so far and the delay
    /// before the next try.
    fn failed(&mut self, cluster: &Arc<Cluster>, began: Instant, now: Instant) -> (u32, Duration) {
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
            failures,
            at: now + delay,
        });
        (failures, delay)
    }

    /// The state to try again, once its time has come.
    fn due(&self, now: Instant) -> Option<Arc<Cluster>> {
        let p = self.pending.as_ref()?;
        (now >= p.at).then(|| Arc::clone(&p.cluster))
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

/// Puts `cluster` in force in `agent` (compiling what differs from `in_force`) and
/// reports it; on an error, `retry` schedules it again, and its changes of Services and
/// EndpointSlices alone are put in force (`in_force` becomes the state in force with
/// them), so that a change the agent cannot put in force holds back no endpoint change.
fn put_in_force(
    agent: &mut Agent,
    in_force: &mut Arc<Cluster>,
    cluster: Arc<Cluster>,
    retry: &mut Retry,
) {
    let t0 = Instant::now();
    let changed = in_force.diff(&cluster);
    let diffed = t0.elapsed();
    if changed.is_empty() {
        retry.clear();
        retry.since = None;
        agent.up_to_date();
        agent.status_mut().datastore_applied();
        return;
    }
    match agent.apply_changes(Arc::clone(&cluster), &changed) {
        Ok(a) => {
            let failures = retry.pending.as_ref().map_or(0, |p| p.failures);
            let latency = retry.in_force(t0, diffed + a.compile + a.swap, Instant::now());
            let status = agent.status_mut();
            status.synced(latency);
            status.datastore_applied();
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
            let (failures, delay) = retry.failed(&cluster, t0, Instant::now());
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

/// Opens the datastore `spec` names.
fn open_datastore(spec: &str, node: &str) -> Result<Watch> {
    if let Some(dir) = spec.strip_prefix("file:") {
        if dir.is_empty() {
            bail!("--datastore {spec:?}: the directory is missing: expected file:DIR");
        }
        return FileDatastore::watch(dir, POLL)
            .map_err(|r| anyhow!("{dir}: the cluster state is refused:\n{r}"));
    }
    let kubeconfig = match spec {
        "kubernetes" => None,
        _ => match spec.strip_prefix("kubernetes:") {
            Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
            _ => bail!(
                "--datastore {spec:?}: expected file:DIR, kubernetes or kubernetes:KUBECONFIG"
            ),
        },
    };
    KubeDatastore::watch(KubeOptions {
        node: node.to_string(),
        kubeconfig,
    })
    .map_err(|e| anyhow!("--datastore {spec}: {e}"))
}

/// Runs the agent until SIGINT, SIGTERM, SIGHUP or SIGQUIT.
pub fn run(args: &Args) -> Result<()> {
    let mut pods = BTreeMap::new();
    for p in &args.pods {
        let (k, netns) = parse_pod(p)?;
        if pods.insert(k.clone(), netns).is_some() {
            bail!("--pod: {k} is given twice");
        }
    }
    let base = args.base.as_deref().map(read_tables_spec).transpose()?;
    let opts = Options {
        node: args.node.clone(),
        base,
        uplink: args.uplink.clone(),
        host_tap: args.host_tap.clone(),
        pods,
        share_uplink: args.share_uplink,
        workers: crate::node::workers(args.workers, args.pin_workers, args.busy_poll)?,
        compile: CompileOptions {
            external_snat: args.external_snat,
            base_file: args.base.as_ref().map(|b| b.display().to_string()),
            ..CompileOptions::default()
        },
        state_dir: Some(args.state_dir.clone()),
        del_queue: Some(ferry_api::del_queue_dir(&args.api_socket)),
        healthz: parse_healthz_addr(&args.healthz_addr)?,
    };
    let stop = ferry_linux::signal::stop_on_signals().context("installing signal handlers")?;
    let watch = open_datastore(&args.datastore, &args.node)?;
    // The first good state starts the node (the Kubernetes datastore gives it once every
    // kind is listed).
    let mut early = Vec::new();
    let mut in_force: Arc<Cluster> = loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        match watch.next_update(POLL) {
            Some(Update::Applied { cluster, notes }) => {
                for n in &notes {
                    tracing::warn!("{n}");
                }
                break cluster;
            }
            Some(Update::Refused(r)) => {
                tracing::error!("{}: waiting for a good state:\n{r}", args.datastore);
                // Counted once the agent runs; a datastore that stays unreachable for
                // long is counted up to this many times.
                if early.len() < 1000 {
                    early.push(r);
                }
            }
            None => {}
        }
    };
    let t0 = Instant::now();
    let (mut agent, applied) =
        Agent::start(opts, Arc::clone(&in_force)).map_err(|e| anyhow!("{e}"))?;
    let (kind, source) = match args.datastore.strip_prefix("file:") {
        Some(dir) => ("file", dir.to_string()),
        None => (
            "kubernetes",
            watch
                .source()
                .map(str::to_string)
                .unwrap_or_else(|| args.datastore.clone()),
        ),
    };
    let status = agent.status_mut();
    status.set_datastore(kind, &source);
    for r in &early {
        status.datastore_refused(r);
    }
    status.synced(t0.elapsed());
    status.datastore_applied();
    let api = ApiServer::bind(&args.api_socket)
        .with_context(|| format!("--api-socket {}", args.api_socket.display()))?;
    let _metrics = match args.metrics_addr {
        Some(addr) => Some(
            MetricsServer::bind(addr, args.api_socket.clone())
                .with_context(|| format!("--metrics-addr {addr}"))?,
        ),
        None => None,
    };
    report(&applied);
    tracing::info!(
        node = %args.node,
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
            bail!(
                "the worker stopped: {}",
                agent.worker_error().unwrap_or_default()
            );
        }
        agent.housekeeping();
        if Instant::now() >= queue_due {
            agent.carry_out_queued_dels(&in_force);
            queue_due = Instant::now() + DEL_QUEUE_SCAN;
        }
        while let Ok(pending) = api.requests().try_recv() {
            match pending.take() {
                Ok((req, answer)) => {
                    tracing::debug!(?req, "api request");
                    let _ = answer.send(agent.handle(Arc::clone(&in_force), req));
                }
                // Its client was told the agent did not answer in time, and may have
                // acted on that (the CNI plugin released an ADD's addresses).
                Err(req) => tracing::warn!(
                    ?req,
                    "api request dropped: not taken within {:?}, its client was told so",
                    ferry_agent::api::ANSWER_TIMEOUT
                ),
            }
        }
        match watch.next_update(API_POLL) {
            None => {}
            Some(Update::Refused(r)) => {
                agent.status_mut().datastore_refused(&r);
                tracing::error!(
                    "{}: change refused, the tables in force stay:\n{r}",
                    args.datastore
                );
            }
            Some(Update::Applied { cluster, notes }) => {
                for n in &notes {
                    tracing::warn!("{n}");
                }
                // A newer state replaces one waiting to be tried again.
                retry.clear();
                put_in_force(&mut agent, &mut in_force, cluster, &mut retry);
            }
        }
        if let Some(cluster) = retry.due(Instant::now()) {
            put_in_force(&mut agent, &mut in_force, cluster, &mut retry);
        }
    }
    // The CNI plugin's pod interfaces stay (persistent TAPs, recorded in --state-dir)
    // for the next agent; `--pod` pods' interfaces go with the agent.
    let stats = agent.stop().map_err(|e| anyhow!("{e}"))?;
    tracing::info!(
        rx = stats.rx_frames,
        tx = stats.tx_frames,
        updates = stats.updates,
        "ferry agent stopped"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_attachments_parse_or_say_what_is_wrong() {
        assert_eq!(
            parse_pod("default/web-1=pod1").unwrap(),
            (ObjectKey::new("default", "web-1"), "pod1".into())
        );
        for bad in [
            "web-1=pod1",
            "default/web-1",
            "/web=x",
            "default/=x",
            "a/b/c=x",
            "a/b=",
        ] {
            let e = parse_pod(bad).unwrap_err().to_string();
            assert!(e.contains("NAMESPACE/NAME=NETNS"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_healthz_address_is_an_address_and_port_or_off() {
        assert_eq!(
            parse_healthz_addr(DEFAULT_HEALTHZ_ADDR).unwrap(),
            Some("[::]:10256".parse().unwrap())
        );
        assert_eq!(
            parse_healthz_addr("0.0.0.0:10256").unwrap(),
            Some("0.0.0.0:10256".parse().unwrap())
        );
        assert_eq!(parse_healthz_addr("off").unwrap(), None);
        assert_eq!(parse_healthz_addr("").unwrap(), None);
        for bad in ["10256", "0.0.0.0", "localhost:10256", "on"] {
            let e = parse_healthz_addr(bad).unwrap_err().to_string();
            assert!(e.contains("--healthz-addr"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_state_not_applied_is_tried_again_after_a_doubling_delay() {
        let mut r = Retry::default();
        let t0 = Instant::now();
        assert!(r.due(t0).is_none(), "nothing failed yet");
        let state = Arc::new(Cluster::default());
        assert_eq!(r.failed(&state, t0, t0), (1, Duration::from_secs(1)));
        assert!(r.due(t0 + Duration::from_millis(999)).is_none());
        let due = r.due(t0 + Duration::from_secs(1)).expect("due after 1 s");
        assert!(Arc::ptr_eq(&due, &state));
        // The same state failing again waits twice as long each time, up to 30 s.
        let mut now = t0;
        let delays: Vec<u64> = (0..7)
            .map(|_| {
                now += Duration::from_secs(1);
                r.failed(&state, now, now).1.as_secs()
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
        r.failed(&old, t0, t0);
        r.failed(&old, t0, t0);
        assert_eq!(r.failed(&old, t0, t0).1, Duration::from_secs(4));
        // A newer state (another Arc, even with the same objects) that fails too.
        let newer = Arc::new(Cluster::default());
        assert_eq!(r.failed(&newer, t0, t0), (1, Duration::from_secs(1)));
        let due = r.due(t0 + Duration::from_secs(1)).unwrap();
        assert!(
            Arc::ptr_eq(&due, &newer),
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
        r.failed(&old, t0, t0 + ms(2));
        r.failed(&old, t0 + ms(1000), t0 + ms(1002));
        r.clear();
        let newer = Arc::new(Cluster::default());
        r.failed(&newer, t0 + ms(5000), t0 + ms(5002));
        let done = t0 + ms(40_000);
        assert_eq!(r.in_force(done - ms(4), ms(4), done), ms(40_000));
        // And the next state starts afresh.
        assert_eq!(r.in_force(done + ms(10), ms(2), done + ms(12)), ms(2));
        assert!(r.due(done + ms(3_600_000)).is_none());
    }
}
