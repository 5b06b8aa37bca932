//! The running agent: cluster state in, the node's ports and tables out.
//!
//! [`Agent::start`] compiles the node's tables from the cluster, opens a Linux port for
//! each port of them (the uplink through AF_PACKET, a host TAP, a TAP per attached pod
//! moved into the pod's namespace as eth0) and starts the worker thread.
//! [`Agent::apply`] takes each new cluster state: it compiles the tables again, opens the
//! ports of pods that appeared, and hands the new tables and ports to the worker, which
//! switches between two rounds of its loop (no packet sees half of a change); ports whose
//! pods went away come back closed. Health check node ports follow the tables.
//!
//! A cluster state that does not compile changes nothing: the tables in force stay, and
//! the error names the object and field.
//!
//! The interfaces the CNI plugin asks for are persistent TAPs, recorded in the state
//! directory ([`crate::state`]): they outlive the agent, and [`Agent::start`] adopts them
//! again (opens each TAP anew in its pod's namespace), so that a restart leaves the pods'
//! interfaces in place. Pods of [`Options::pods`] are not recorded; their interfaces go
//! when the agent stops. DELs the plugin queued while no agent ran ([`crate::del_queue`])
//! are carried out first, so that a pod deleted meanwhile is not adopted.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ferry_api::{
    Answer, ApiError, ERR_AGENT, ERR_BAD_REQUEST, ERR_INTERFACE, ERR_TABLES, PodRef, Request,
    Response,
};
use ferry_datapath::pipeline::Pipeline;
use ferry_datapath::tables::{MacAddr, PortKind, Tables, TablesSpec};
use ferry_linux::link;
use ferry_linux::worker::{Control, NamedPort, Snapshot, Update, WorkerStats, Workers};
use ferry_linux::{AfPacketConfig, AfPacketPort, Port, TapPort};
use ipnet::IpNet;

use crate::cluster::{Cluster, Kind, ObjectKey};
use crate::compile::{
    AttachedPod, CompileOptions, Compiled, HealthCheck, node_tables, service_tables,
};
use crate::del_queue;
use crate::fields::{NodeFields, describe};
use crate::health::HealthServers;
use crate::host_nat;
use crate::leftovers;
use crate::observe;
use crate::proxy_health::{HealthzServer, ProxyHealth};
use crate::state;
use crate::status::{AgentStatus, ErrorKind};

/// How long [`Agent::apply`] waits for the worker to take an update.
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long [`Agent::counters`] waits for the worker's figures of fragments held.
pub const HELD_TIMEOUT: Duration = Duration::from_millis(500);

/// What the agent runs with besides the cluster state.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// This node's name (its Node object).
    pub node: String,
    /// The node-local tables the cluster does not know (uplink, routes, limits); None
    /// derives them from the Node object (see `docs/agent.md`).
    pub base: Option<TablesSpec>,
    /// The Linux interface of the tables' uplink port, read and written through
    /// AF_PACKET.
    pub uplink: Option<String>,
    /// The name of a TAP for the tables' host port (the node's own stack).
    pub host_tap: Option<String>,
    /// Attached pods and their network namespaces (`ip netns` names).
    pub pods: BTreeMap<ObjectKey, String>,
    /// Leave the host kernel processing what arrives on the uplink as well.
    pub share_uplink: bool,
    /// Worker threads (a count of 0 is taken as 1) and the CPUs they are pinned to: the
    /// uplink gets one AF_PACKET socket per worker in a fanout group, and each pod's TAP
    /// one queue per worker ([`ferry_linux::worker::run_workers`]).
    pub workers: Workers,
    /// Compilation settings.
    pub compile: CompileOptions,
    /// Where the CNI plugin's attachments are recorded ([`crate::state`]) and adopted
    /// from at start; None records nothing (and adopts nothing).
    pub state_dir: Option<PathBuf>,
    /// Where the CNI plugin queues the DELs it could not send while the agent was not
    /// running ([`ferry_api::del_queue_dir`] of the API socket, see
    /// [`crate::del_queue`]): made at start, and its DELs carried out before the recorded
    /// attachments are adopted, then by [`Agent::carry_out_queued_dels`]. None: no queue.
    pub del_queue: Option<PathBuf>,
    /// Where to serve kube-proxy's `/healthz` and `/livez` ([`crate::proxy_health`]);
    /// None: nowhere.
    pub healthz: Option<SocketAddr>,
}

/// What one applied cluster state did.
#[derive(Debug)]
pub struct Applied {
    /// The tables' generation, counting from 1 at start.
    pub generation: u64,
    /// Compiling the cluster into tables.
    pub compile: Duration,
    /// From handing the tables to the worker to the worker using them.
    pub swap: Duration,
    /// Pod ports opened.
    pub opened: Vec<String>,
    /// Ports closed.
    pub closed: Vec<String>,
    /// Connections removed at the swap (see `ferry_datapath::pipeline::SwapReport`):
    /// their endpoint went away, or a UDP flow's destination became a frontend.
    pub ct_removed: usize,
    /// Only the changed Services were compiled (an EndpointSlice or Service change).
    pub incremental: bool,
    /// Things left out of the tables, each naming its object.
    pub warnings: Vec<String>,
}

/// A running node: the worker thread and what feeds it.
pub struct Agent {
    opts: Options,
    control: Arc<Control>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<std::io::Result<WorkerStats>>>,
    health: HealthServers,
    /// Port names the worker has.
    open: BTreeSet<String>,
    /// Counts TAP names handed out.
    taps: u64,
    generation: u64,
    started: Instant,
    /// The first worker error, once the worker stopped.
    failed: Arc<Mutex<Option<String>>>,
    /// What is in force, for changes that only concern Services.
    last: Option<Last>,
    /// Pod interfaces the CNI plugin asked for, by container ID and interface name.
    cni: BTreeMap<(String, String), CniPod>,
    /// The node-port rewrites for the node's own processes in force ([`host_nat`]).
    host_nat: Option<(Vec<std::net::IpAddr>, BTreeSet<host_nat::Rule>)>,
    /// The kernel routes past ferry found last ([`leftovers`]), each warned about once.
    strays: BTreeSet<leftovers::Stray>,
    /// Other dataplanes' netfilter chains found last, by table, each warned about once.
    rule_leftovers: BTreeSet<String>,
    /// When [`Agent::housekeeping`] looks for leftovers next ([`LEFTOVERS_EVERY`]).
    leftovers_due: Instant,
    /// Datastore health, sync latency and errors ([`crate::status`]).
    status: AgentStatus,
    /// Live traces and captures turned on for API clients.
    sessions: observe::Sessions,
    /// TAPs of recorded attachments opened again at start, until their ports open.
    adopted: BTreeMap<ObjectKey, TapPort>,
    /// Persistent pod TAPs made by the [`Agent::apply`] under way, deleted again when it
    /// fails.
    made: Vec<(String, String)>,
    /// The DEL queue could not be read last time (reported once until it can).
    del_queue_failing: bool,
    /// Pod ports the worker took out of service (their device gone), each reported once
    /// while the tables still have it.
    gone_ports: BTreeSet<String>,
    /// The agent's own health, as `/healthz` and the health check node ports report it.
    proxy: Arc<ProxyHealth>,
    /// The `/healthz` server, once [`Options::healthz`] could be listened on.
    healthz: Option<HealthzServer>,
    /// Listening on [`Options::healthz`] failed (reported once until it works).
    healthz_failing: bool,
    /// When [`Agent::housekeeping`] tries again to listen on [`Options::healthz`]
    /// ([`LISTEN_RETRY`]).
    healthz_due: Instant,
    /// Health check node ports that could not be opened, each reported once until it
    /// opens.
    health_failing: BTreeSet<u16>,
    /// When [`Agent::housekeeping`] tries them again ([`LISTEN_RETRY`]).
    health_due: Instant,
}

/// A pod interface the CNI plugin asked for.
#[derive(Clone, Debug)]
struct CniPod {
    pod: ObjectKey,
    /// The `ip netns` name of its namespace.
    netns: String,
    /// The name was made by the agent (`ip netns attach`) and goes with the pod.
    named_here: bool,
    ifname: String,
    addresses: Vec<IpNet>,
}

/// The state in force.
struct Last {
    cluster: Arc<Cluster>,
    tables: Arc<Tables>,
    /// The tables entries of each Service.
    service_ports: BTreeMap<ObjectKey, Vec<String>>,
    /// Health check node ports by Service (`namespace/name`).
    health: BTreeMap<String, HealthCheck>,
}

impl Last {
    fn new(cluster: Arc<Cluster>, tables: Arc<Tables>, compiled: &Compiled) -> Last {
        let mut service_ports: BTreeMap<ObjectKey, Vec<String>> = BTreeMap::new();
        for s in &compiled.tables.services {
            if let Some(key) = service_key(&s.name) {
                service_ports.entry(key).or_default().push(s.name.clone());
            }
        }
        Last {
            cluster,
            tables,
            service_ports,
            health: compiled
                .health_checks
                .iter()
                .map(|h| (h.service.clone(), h.clone()))
                .collect(),
        }
    }
}

/// Why a state was not put in force: the step that failed, and the error.
#[derive(Clone, Debug)]
struct NotApplied {
    step: Step,
    error: String,
}

/// A step of putting a state in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Compiling the tables: they stay refused until the cluster changes.
    Compile,
    /// Opening a port: a TAP not made, not moved into its pod's namespace.
    Port,
    /// Handing the tables to the worker: it is slow or stopped.
    Worker,
}

impl Step {
    /// The error code of a CNI request (`add`, `del`, `gc`) that failed at this step
    /// (docs/cni.md): only a busy worker is worth trying again later (a stopped one goes
    /// with the agent, which its DaemonSet starts again).
    fn cni_code(self) -> u32 {
        match self {
            Step::Compile => ERR_TABLES,
            Step::Port => ERR_INTERFACE,
            Step::Worker => 11,
        }
    }
}

/// `r`'s error as a [`NotApplied`] at `step`.
fn at<T>(step: Step, r: Result<T, String>) -> Result<T, NotApplied> {
    r.map_err(|error| NotApplied { step, error })
}

/// The Service of a tables entry named `namespace/name:port`.
fn service_key(entry: &str) -> Option<ObjectKey> {
    let (svc, _) = entry.rsplit_once(':')?;
    let (ns, name) = svc.split_once('/')?;
    Some(ObjectKey::new(ns, name))
}

/// How often the agent looks for kernel routes and netfilter rules left by another
/// dataplane ([`leftovers`]), after it did at start.
pub const LEFTOVERS_EVERY: Duration = Duration::from_secs(30);

/// How often the agent tries again to listen on an address it could not (another
/// process holds the port: kube-proxy, still running while ferry replaces it), as
/// kube-proxy does with its own health server.
pub const LISTEN_RETRY: Duration = Duration::from_secs(5);

impl Agent {
    /// Compiles the tables of `cluster`, opens every port, and starts the worker.
    pub fn start(opts: Options, cluster: Arc<Cluster>) -> Result<(Agent, Applied), String> {
        let t0 = Instant::now();
        let proxy = Arc::new(ProxyHealth::new());
        let mut agent = Agent {
            opts,
            control: Arc::new(Control::new()),
            stop: Arc::new(AtomicBool::new(false)),
            worker: None,
            health: HealthServers::new(Arc::clone(&proxy)),
            open: BTreeSet::new(),
            taps: 0,
            generation: 1,
            started: Instant::now(),
            failed: Arc::new(Mutex::new(None)),
            last: None,
            cni: BTreeMap::new(),
            host_nat: None,
            strays: BTreeSet::new(),
            rule_leftovers: BTreeSet::new(),
            leftovers_due: Instant::now(),
            status: AgentStatus::new(),
            sessions: observe::Sessions::default(),
            adopted: BTreeMap::new(),
            made: Vec::new(),
            del_queue_failing: false,
            gone_ports: BTreeSet::new(),
            proxy,
            healthz: None,
            healthz_failing: false,
            healthz_due: Instant::now(),
            health_failing: BTreeSet::new(),
            health_due: Instant::now(),
        };
        agent.adopt_recorded();
        let compiled = agent.compile(&cluster)?;
        let tables = Arc::clone(&compiled.compiled);
        let compile = t0.elapsed();
        let mut ports: Vec<NamedPort> = Vec::with_capacity(tables.ports.len());
        for p in &tables.ports {
            let port = agent.open_port(p.name.as_str(), &tables, &compiled)?;
            ports.push((p.name.clone(), port));
        }
        agent.open = ports.iter().map(|(n, _)| n.clone()).collect();
        // An adopted TAP whose pod got no port (its Pod object says it finished) is kept
        // for the port a later state may give it, as its attachment is.
        for key in agent.adopted.keys() {
            tracing::warn!(pod = %key, "adopted pod interface has no port in the tables");
        }
        let opened = agent.open.iter().cloned().collect();
        let mut pipeline = Pipeline::new(Arc::clone(&tables));
        let (control, stop, failed) = (
            Arc::clone(&agent.control),
            Arc::clone(&agent.stop),
            Arc::clone(&agent.failed),
        );
        let started = agent.started;
        let proxy = Arc::clone(&agent.proxy);
        // Before the worker runs, so that it is the last to say so when it stops at once.
        proxy.set_running(true);
        let workers = Workers {
            count: agent.opts.workers.count.max(1),
            ..agent.opts.workers.clone()
        };
        let worker = thread::Builder::new()
            .name("ferry-worker".into())
            .spawn(move || {
                let r = ferry_linux::worker::run_workers(
                    workers,
                    &mut ports,
                    &mut pipeline,
                    &stop,
                    || started.elapsed().as_nanos() as u64,
                    &control,
                );
                if let Err(e) = &r {
                    *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                }
                proxy.set_running(false);
                // Dropping the ports here closes them: AF_PACKET sockets and ingress
                // filters go, and so do the TAPs of `--pod` pods; the CNI plugin's pod
                // TAPs are persistent and stay for the next agent to adopt.
                drop(ports);
                r
            })
            .map_err(|e| format!("starting the worker: {e}"))?;
        agent.worker = Some(worker);
        agent.set_health(&compiled.health_checks);
        agent.set_host_nat(&tables);
        agent.check_leftovers(&tables);
        agent.proxy.set_node(cluster.node(&agent.opts.node));
        agent.proxy.updated();
        agent.serve_healthz();
        agent.last = Some(Last::new(cluster, tables, &compiled));
        Ok((
            agent,
            Applied {
                generation: 1,
                compile,
                swap: Duration::ZERO,
                opened,
                closed: Vec::new(),
                ct_removed: 0,
                incremental: false,
                warnings: compiled.warnings,
            },
        ))
    }

    /// Switches the node to the tables of `cluster`, of which `changed` lists the
    /// objects that differ from the state in force ([`Cluster::diff`]). When only
    /// Services and EndpointSlices changed, only the Services concerned are compiled and
    /// patched into the tables in force; otherwise the whole node is compiled again. On
    /// an error nothing changed, and the change stays pending for the agent's health
    /// ([`crate::proxy_health`]) until a state is put in force.
    pub fn apply_changes(
        &mut self,
        cluster: Arc<Cluster>,
        changed: &[(Kind, ObjectKey)],
    ) -> Result<Applied, String> {
        self.proxy.queued();
        // The node's eligibility follows the newest state, in force or not.
        self.proxy.set_node(cluster.node(&self.opts.node));
        let r = self.apply_changed(cluster, changed);
        if r.is_ok() {
            self.proxy.updated();
        }
        r
    }

    /// Puts in force, alone, the Service and EndpointSlice changes among `changed` (the
    /// objects of `cluster` that differ from the state in force), after `cluster` as a
    /// whole could not be ([`Agent::apply_changes`] failed): the state in force with those
    /// objects as `cluster` has them, patched into the tables in force as a change of
    /// Services only is. So a change the agent cannot put in force (a pod whose namespace
    /// is not there yet, a Node that does not compile) does not hold back every later
    /// endpoint change. The rest stays pending ([`crate::proxy_health`]).
    ///
    /// Returns that state (now the one in force) and what was done; None when `changed`
    /// holds no such change, or nothing else.
    pub fn apply_services_alone(
        &mut self,
        cluster: &Cluster,
        changed: &[(Kind, ObjectKey)],
    ) -> Option<Result<(Arc<Cluster>, Applied), String>> {
        let services: Vec<(Kind, ObjectKey)> = changed
            .iter()
            .filter(|(k, _)| matches!(k, Kind::Service | Kind::EndpointSlice))
            .cloned()
            .collect();
        if services.is_empty() || services.len() == changed.len() {
            return None;
        }
        let part = Arc::new(
            self.last
                .as_ref()?
                .cluster
                .with_changes_of(cluster, &services),
        );
        Some(
            self.apply_changed(Arc::clone(&part), &services)
                .map(|a| (part, a)),
        )
    }

    /// The datastore's last state is the one in force (it changed nothing, or its
    /// changes were undone): no change is pending.
    pub fn up_to_date(&self) {
        self.proxy.updated();
    }

    fn apply_changed(
        &mut self,
        cluster: Arc<Cluster>,
        changed: &[(Kind, ObjectKey)],
    ) -> Result<Applied, String> {
        let services_only = changed
            .iter()
            .all(|(k, _)| matches!(k, Kind::Service | Kind::EndpointSlice));
        match &self.last {
            Some(last) if services_only => {
                let mut keys = BTreeSet::new();
                for (kind, key) in changed {
                    match kind {
                        Kind::Service => {
                            keys.insert(key.clone());
                        }
                        _ => keys.extend(
                            [&last.cluster, &cluster]
                                .into_iter()
                                .filter_map(|c| c.service_of_slice(key)),
                        ),
                    }
                }
                self.apply_services(cluster, &keys)
            }
            _ => self.apply(cluster),
        }
    }

    /// Compiles the Services `keys` of `cluster` and patches them into the tables in
    /// force.
    fn apply_services(
        &mut self,
        cluster: Arc<Cluster>,
        keys: &BTreeSet<ObjectKey>,
    ) -> Result<Applied, String> {
        if let Some(e) = self.worker_error() {
            return Err(format!("the worker stopped: {e}"));
        }
        let t0 = Instant::now();
        let last = self.last.as_ref().ok_or("nothing in force yet")?;
        let st = service_tables(&cluster, &self.opts.node, keys, &self.opts.compile)
            .inspect_err(|_| self.status.count(ErrorKind::Compile))?;
        let removed: Vec<&str> = keys
            .iter()
            .filter_map(|k| last.service_ports.get(k))
            .flatten()
            .map(String::as_str)
            .collect();
        let tables = Arc::new(
            last.tables
                .with_services(&removed, &st.specs)
                .inspect_err(|_| self.status.count(ErrorKind::Compile))?,
        );
        let compile = t0.elapsed();
        let t1 = Instant::now();
        let applied = self
            .control
            .send(
                Update {
                    tables: Arc::clone(&tables),
                    new_ports: Vec::new(),
                },
                APPLY_TIMEOUT,
            )
            .map_err(|e| {
                self.status.count(ErrorKind::Apply);
                format!("the worker did not take the new tables: {e}")
            })?;
        let swap = t1.elapsed();
        let closed: Vec<String> = applied.closed.iter().map(|(n, _)| n.clone()).collect();
        drop(applied.closed);
        let Some(last) = self.last.as_mut() else {
            return Err("nothing in force yet".into());
        };
        for k in keys {
            last.service_ports.remove(k);
            last.health.remove(&k.to_string());
        }
        for s in &st.specs {
            if let Some(key) = service_key(&s.name) {
                last.service_ports
                    .entry(key)
                    .or_default()
                    .push(s.name.clone());
            }
        }
        for h in st.health_checks {
            last.health.insert(h.service.clone(), h);
        }
        last.cluster = cluster;
        last.tables = Arc::clone(&tables);
        let checks: Vec<HealthCheck> = last.health.values().cloned().collect();
        self.generation += 1;
        self.set_health(&checks);
        self.set_host_nat(&tables);
        Ok(Applied {
            generation: self.generation,
            compile,
            swap,
            opened: Vec::new(),
            closed,
            ct_removed: applied.report.ct_removed,
            incremental: true,
            warnings: st.warnings,
        })
    }

    /// Switches the node to the tables of `cluster`, compiled whole. On an error nothing
    /// changed.
    pub fn apply(&mut self, cluster: Arc<Cluster>) -> Result<Applied, String> {
        self.apply_steps(cluster).map_err(|e| e.error)
    }

    /// [`Agent::apply`], saying which step failed.
    fn apply_steps(&mut self, cluster: Arc<Cluster>) -> Result<Applied, NotApplied> {
        self.made.clear();
        let r = self.apply_whole(cluster);
        let made = std::mem::take(&mut self.made);
        if r.is_err() {
            // The ports were dropped, but persistent TAPs stay unless deleted.
            for (netns, ifname) in made {
                if let Err(e) = link::delete_in_netns(&netns, &ifname) {
                    tracing::warn!(%netns, %ifname, error = %e, "pod interface not deleted");
                }
            }
        }
        r
    }

    fn apply_whole(&mut self, cluster: Arc<Cluster>) -> Result<Applied, NotApplied> {
        if let Some(e) = self.worker_error() {
            return at(Step::Worker, Err(format!("the worker stopped: {e}")));
        }
        let t0 = Instant::now();
        let compiled = at(
            Step::Compile,
            self.compile(&cluster)
                .inspect_err(|_| self.status.count(ErrorKind::Compile)),
        )?;
        let tables = Arc::clone(&compiled.compiled);
        let compile = t0.elapsed();
        let mut new_ports = Vec::new();
        for p in &tables.ports {
            if self.open.contains(&p.name) {
                continue;
            }
            let port = at(
                Step::Port,
                self.open_port(&p.name, &tables, &compiled)
                    .inspect_err(|_| self.status.count(ErrorKind::Apply)),
            )?;
            new_ports.push((p.name.clone(), port));
        }
        let opened: Vec<String> = new_ports.iter().map(|(n, _)| n.clone()).collect();
        let update = Update {
            tables: Arc::clone(&tables),
            new_ports,
        };
        let t1 = Instant::now();
        let applied = self.control.send(update, APPLY_TIMEOUT).map_err(|e| {
            self.status.count(ErrorKind::Apply);
            NotApplied {
                step: Step::Worker,
                error: format!("the worker did not take the new tables: {e}"),
            }
        })?;
        let swap = t1.elapsed();
        let closed: Vec<String> = applied.closed.iter().map(|(n, _)| n.clone()).collect();
        // Closing a pod's TAP removes its eth0; done here, off the worker's thread.
        drop(applied.closed);
        self.open = tables.ports.iter().map(|p| p.name.clone()).collect();
        self.generation += 1;
        self.set_health(&compiled.health_checks);
        self.set_host_nat(&tables);
        self.last = Some(Last::new(cluster, tables, &compiled));
        Ok(Applied {
            generation: self.generation,
            compile,
            swap,
            opened,
            closed,
            ct_removed: applied.report.ct_removed,
            incremental: false,
            warnings: compiled.warnings,
        })
    }

    /// Answers a request of the local API ([`ferry_api`]); `cluster` is the state in
    /// force, compiled again when pods come or go. Error answers are counted
    /// ([`ErrorKind::Api`]).
    pub fn handle(&mut self, cluster: Arc<Cluster>, req: Request) -> Response {
        let r = self.answer(cluster, req);
        if matches!(r, Response::Error(_)) {
            self.status.count(ErrorKind::Api);
        }
        r
    }

    fn answer(&mut self, cluster: Arc<Cluster>, req: Request) -> Response {
        match req {
            // 51, as CNI's STATUS means it: no ADD, and the pods already here have no
            // forwarding either.
            Request::Status => match self.worker_error() {
                None if self.is_running() => Response::Ok(Answer::default()),
                e => Response::error(
                    51,
                    "the agent's dataplane is not running",
                    e.unwrap_or_default(),
                ),
            },
            Request::Node => self.node_info(&cluster),
            Request::Counters => Response::Ok(Answer {
                counters: Some(Box::new(self.counters())),
                ..Answer::default()
            }),
            Request::Conntrack {
                filter,
                delete,
                limit,
            } => crate::conntrack::request(&self.control, &filter, delete, limit),
            Request::Services => {
                let Some(last) = self.last.as_ref() else {
                    return Response::error(11, "no tables in force yet", "");
                };
                let conns = crate::services::count(&self.control);
                Response::Ok(Answer {
                    services: Some(crate::services::list(&last.tables, conns.as_ref())),
                    ..Answer::default()
                })
            }
            Request::Trace {
                in_port,
                packet,
                frames,
                reply,
            } => {
                let input = observe::TraceInput {
                    in_port,
                    packet,
                    frames: frames.unwrap_or_default(),
                    reply,
                };
                match observe::trace(&self.control, input) {
                    Ok(report) => Response::Ok(Answer {
                        trace: serde_json::to_value(report).ok(),
                        ..Answer::default()
                    }),
                    Err(e) => Response::error(ferry_api::ERR_BAD_REQUEST, "trace refused", e),
                }
            }
            Request::TraceStart { filter, count } => {
                match self.sessions.trace_start(&self.control, &filter, count) {
                    Ok(id) => Response::Ok(Answer {
                        session: Some(id),
                        ..Answer::default()
                    }),
                    Err(e) => Response::error(ferry_api::ERR_BAD_REQUEST, "live trace refused", e),
                }
            }
            Request::TraceRead { session } => {
                match self.sessions.trace_read(&self.control, session) {
                    Ok((traced, remaining)) => Response::Ok(Answer {
                        traced: Some(traced_json(traced)),
                        remaining: Some(remaining),
                        ..Answer::default()
                    }),
                    Err(e) => refused("live trace", &e),
                }
            }
            Request::TraceStop { session } => {
                match self.sessions.trace_stop(&self.control, session) {
                    Ok(traced) => Response::Ok(Answer {
                        traced: Some(traced_json(traced)),
                        ..Answer::default()
                    }),
                    Err(e) => refused("live trace", &e),
                }
            }
            Request::CaptureStart { port, filter } => {
                match self.sessions.capture_start(&self.control, &port, &filter) {
                    Ok(id) => Response::Ok(Answer {
                        session: Some(id),
                        ..Answer::default()
                    }),
                    Err(e) => Response::error(ferry_api::ERR_BAD_REQUEST, "capture refused", e),
                }
            }
            Request::CaptureRead { session } => {
                match self.sessions.capture_read(&self.control, session) {
                    Ok((frames, lost)) => captured_answer(frames, lost),
                    Err(e) => refused("capture", &e),
                }
            }
            Request::CaptureStop { session } => {
                match self.sessions.capture_stop(&self.control, session) {
                    Ok((frames, lost)) => captured_answer(frames, lost),
                    Err(e) => refused("capture", &e),
                }
            }
            Request::Add {
                container_id,
                netns,
                ifname,
                pod,
                addresses,
            } => self.cni_add(cluster, container_id, &netns, ifname, pod, &addresses),
            Request::Del {
                container_id,
                ifname,
            } => {
                let Some(gone) = self.cni.remove(&(container_id, ifname)) else {
                    return Response::Ok(Answer::default());
                };
                self.cni_release(cluster, vec![gone])
            }
            Request::Check {
                container_id,
                ifname,
                netns,
            } => match self.cni.get(&(container_id.clone(), ifname.clone())) {
                None => {
                    Response::error(3, "no such attachment", format!("{container_id} {ifname}"))
                }
                Some(c)
                    if matches!(netns_name(&netns), Ok(Netns::Named(n)) if n != c.netns)
                        && !c.named_here =>
                {
                    Response::error(
                        4,
                        "CNI_NETNS: the attachment is in another network namespace",
                        netns,
                    )
                }
                Some(c) => match self.last.as_ref().and_then(|l| {
                    let port = l.tables.ports.iter().find(|p| {
                        p.addresses.first() == c.addresses.first().map(IpNet::addr).as_ref()
                    })?;
                    Some(port.name.clone())
                }) {
                    Some(port) if self.port_gone(&port) => Response::error(
                        ERR_AGENT,
                        "the pod's port is out of service: its device is gone",
                        c.pod.to_string(),
                    ),
                    Some(port) if self.open.contains(&port) => Response::Ok(Answer::default()),
                    _ => Response::error(
                        ERR_AGENT,
                        "the pod has no port in the tables in force",
                        c.pod.to_string(),
                    ),
                },
            },
            Request::Gc { valid } => {
                let keep: BTreeSet<(String, String)> = valid
                    .into_iter()
                    .map(|a| (a.container_id, a.ifname))
                    .collect();
                let gone: Vec<(String, String)> = self
                    .cni
                    .keys()
                    .filter(|k| !keep.contains(*k))
                    .cloned()
                    .collect();
                if gone.is_empty() {
                    return Response::Ok(Answer::default());
                }
                let gone = gone.iter().filter_map(|k| self.cni.remove(k)).collect();
                self.cni_release(cluster, gone)
            }
        }
    }

    /// The dataplane's counters, from the worker's latest snapshot, with the agent's own
    /// health figures. What the snapshot lacks (fragments held now, NAT ports in use) is
    /// asked of the worker; when it does not answer within [`HELD_TIMEOUT`] those figures
    /// are 0 (docs/observability.md says so).
    pub fn counters(&self) -> ferry_api::Counters {
        let snap = self.snapshot();
        let held = self
            .control
            .run(HELD_TIMEOUT, |w| {
                let r = w.pipeline.reassembler();
                (
                    r.held_datagrams() as u64,
                    r.held_bytes() as u64,
                    w.pipeline.conntrack().nat_in_use() as u64,
                )
            })
            .unwrap_or_default();
        let (v4, v6) = (&snap.reassembly.v4, &snap.reassembly.v6);
        let refused = [
            ("too_small", v4.too_small + v6.too_small),
            ("overlapped", v4.overlapped + v6.overlapped),
            ("table_full", v4.table_full + v6.table_full),
            ("too_many", v4.too_many + v6.too_many),
            ("invalid", v4.invalid + v6.invalid),
        ];
        ferry_api::Counters {
            generation: self.generation,
            ports: snap
                .ports
                .iter()
                .map(|p| ferry_api::PortCounters {
                    name: p.name.clone(),
                    rx_packets: p.pipeline.rx_packets,
                    rx_bytes: p.pipeline.rx_bytes,
                    tx_packets: p.pipeline.tx_packets,
                    tx_bytes: p.pipeline.tx_bytes,
                    drops: p
                        .drops
                        .nonzero()
                        .map(|(r, n)| (r.name().to_string(), n))
                        .collect(),
                })
                .collect(),
            drops: snap
                .drops
                .nonzero()
                .map(|(r, n)| (r.name().to_string(), n))
                .collect(),
            ct_entries: snap.ct_entries,
            ct_inserted: snap.conntrack.inserted,
            ct_insert_failed: snap.conntrack.insert_failed,
            reassembled: snap.pipeline.reassembled,
            service_balanced: snap.pipeline.service_balanced,
            service_rejected: snap.pipeline.service_rejected,
            neigh_waiting: snap.pipeline.neigh_waiting,
            neigh_queued: snap.pipeline.neigh_queued,
            fragments_held: held.0,
            fragment_bytes_held: held.1,
            fragments_expired: v4.expired + v6.expired,
            fragments_refused: refused
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            nat_ports_in_use: held.2,
            workers: snap
                .workers
                .iter()
                .map(|w| ferry_api::WorkerCounters {
                    rx_frames: w.rx_frames,
                    tx_frames: w.tx_frames,
                    rounds: w.rounds,
                    busy_rounds: w.busy_rounds,
                    tx_dropped: w.tx_dropped,
                    ports_gone: w.ports_gone,
                })
                .collect(),
            datastore: self.status.datastore(),
            sync: self.status.sync(),
            errors: self.status.errors(),
        }
    }

    /// The agent's health figures, for the loop that feeds it to report datastore
    /// updates and sync latencies.
    pub fn status_mut(&mut self) -> &mut AgentStatus {
        &mut self.status
    }

    fn node_info(&self, cluster: &Cluster) -> Response {
        let Some(node) = cluster.node(&self.opts.node) else {
            return Response::error(
                11,
                "this node is not in the cluster state yet",
                self.opts.node.clone(),
            );
        };
        let fields = match NodeFields::parse(node) {
            Ok(f) => f,
            Err(e) => {
                return Response::error(
                    ERR_AGENT,
                    "the Node object is bad",
                    describe(&format_args!("Node {}", self.opts.node), &e),
                );
            }
        };
        Response::Ok(Answer {
            node: Some(self.opts.node.clone()),
            pod_cidrs: fields.pod_cidrs.iter().map(ToString::to_string).collect(),
            mtu: Some(self.pod_mtu()),
            ..Answer::default()
        })
    }

    /// The MTU pod ports get: the overlay's, from the uplink's.
    fn pod_mtu(&self) -> u16 {
        self.last
            .as_ref()
            .map_or(ferry_datapath::tables::DEFAULT_MTU, |l| l.tables.pod_mtu)
    }

    fn cni_add(
        &mut self,
        cluster: Arc<Cluster>,
        container_id: String,
        netns: &str,
        ifname: String,
        pod: PodRef,
        addresses: &[String],
    ) -> Response {
        let id = (container_id.clone(), ifname.clone());
        if let Some(c) = self.cni.get(&id) {
            // The same ADD again: the same answer.
            return self.add_answer(&c.addresses.clone());
        }
        let (addrs, netns) = match check_add(&container_id, &ifname, netns, addresses) {
            Ok(checked) => checked,
            Err(e) => return Response::Error(e),
        };
        let key = ObjectKey::new(&pod.namespace, &pod.name);
        if self.cni.values().any(|c| c.pod == key) {
            return Response::error(
                ERR_AGENT,
                "the pod already has an interface from another container",
                key.to_string(),
            );
        }
        let (netns, named_here) = match netns {
            Netns::Named(n) => (n, false),
            Netns::OfProcess(pid) => {
                let name = format!("ferry-{}", &container_id[..container_id.len().min(24)]);
                if let Err(e) = link::ip(&["netns", "attach", &name, &pid.to_string()]) {
                    return Response::error(
                        4,
                        "CNI_NETNS: the network namespace cannot be used",
                        format!("/proc/{pid}/ns/net: {e}"),
                    );
                }
                (name, true)
            }
        };
        self.cni.insert(
            id.clone(),
            CniPod {
                pod: key,
                netns,
                named_here,
                ifname,
                addresses: addrs.clone(),
            },
        );
        match self.apply_steps(cluster) {
            Ok(a) => {
                tracing::info!(container = %container_id, opened = ?a.opened, "pod attached");
                self.save_state();
                self.add_answer(&addrs)
            }
            Err(e) => {
                if let Some(c) = self.cni.remove(&id)
                    && c.named_here
                {
                    let _ = link::ip(&["netns", "delete", &c.netns]);
                }
                Response::error(
                    e.step.cni_code(),
                    "the pod's interface could not be made",
                    e.error,
                )
            }
        }
    }

    fn add_answer(&self, addrs: &[IpNet]) -> Response {
        let mut gateways = Vec::new();
        if addrs.iter().any(|a| a.addr().is_ipv4()) {
            gateways.push(ferry_datapath::tables::GATEWAY_V4);
        }
        if addrs.iter().any(|a| a.addr().is_ipv6()) {
            gateways.push(ferry_datapath::tables::GATEWAY_V6);
        }
        Response::Ok(Answer {
            mtu: Some(self.pod_mtu()),
            mac: addrs
                .first()
                .map(|a| crate::compile::pod_mac(a.addr()).to_string()),
            gateways,
            ..Answer::default()
        })
    }

    /// Compiles again without the pods `gone` (their ports close, their persistent
    /// interfaces are deleted) and records the attachments left.
    fn cni_release(&mut self, cluster: Arc<Cluster>, gone: Vec<CniPod>) -> Response {
        let r = match self.apply_steps(cluster) {
            Ok(a) => {
                tracing::info!(closed = ?a.closed, "pods detached");
                Response::Ok(Answer::default())
            }
            Err(e) => Response::error(
                e.step.cni_code(),
                "the tables without the pod could not be applied",
                e.error,
            ),
        };
        for c in &gone {
            remove_interface(&c.netns, &c.ifname, c.named_here);
        }
        self.save_state();
        r
    }

    /// Carries out the DELs the CNI plugin queued while the agent was not running (or
    /// while it started, before its socket was there), each as the `del` request it
    /// stands for, and removes them from the queue once done; a queue file that is not
    /// a DEL is removed with a warning and counted ([`ErrorKind::Api`]). `cluster` is
    /// the state in force. Cheap when the queue is empty (one directory read): the
    /// agent's loop calls it every second.
    pub fn carry_out_queued_dels(&mut self, cluster: &Arc<Cluster>) {
        for entry in self.queued_dels() {
            let request = Request::Del {
                container_id: entry.container_id.clone(),
                ifname: entry.ifname.clone(),
            };
            match self.handle(Arc::clone(cluster), request) {
                Response::Ok(_) => tracing::info!(container = %entry.container_id,
                    ifname = %entry.ifname, "queued CNI DEL carried out"),
                // The attachment is gone all the same (as for a `del` the plugin sends):
                // the tables without it follow with the next change.
                Response::Error(e) => tracing::warn!(container = %entry.container_id,
                    ifname = %entry.ifname, code = e.code,
                    "queued CNI DEL carried out, but {}: {}", e.msg, e.details),
            }
            self.dequeue(&entry);
        }
    }

    /// The DELs queued now; the files that are not queued DELs are removed, logged and
    /// counted.
    fn queued_dels(&mut self) -> Vec<del_queue::Entry> {
        let Some(dir) = self.opts.del_queue.clone() else {
            return Vec::new();
        };
        let scan = match del_queue::scan(&dir) {
            Ok(scan) => scan,
            Err(e) => {
                // Reported once until it can be read again.
                if !self.del_queue_failing {
                    tracing::error!(dir = %dir.display(), error = %e,
                        "the CNI plugin's queued DELs cannot be read");
                    self.status.count(ErrorKind::Api);
                }
                self.del_queue_failing = true;
                return Vec::new();
            }
        };
        self.del_queue_failing = false;
        for d in &scan.dropped {
            tracing::warn!(file = %d.path.display(), reason = %d.reason,
                not_removed = ?d.not_removed, "queued CNI DEL dropped: not a DEL");
            self.status.count(ErrorKind::Api);
        }
        scan.entries
    }

    /// Removes the queue file of a DEL carried out.
    fn dequeue(&self, entry: &del_queue::Entry) {
        if let Err(e) = del_queue::done(entry) {
            tracing::error!(file = %entry.path.display(), error = %e,
                "the queued CNI DEL carried out was not removed from the queue");
        }
    }

    /// Reads the attachments recorded in the state directory and opens their TAPs again.
    /// One whose namespace or interface is gone (or is not ours) is dropped from the
    /// record, with a warning, and counted ([`ErrorKind::Apply`]: a port that did not
    /// open). A state file that does not parse is moved aside; the agent starts without
    /// attachments then.
    ///
    /// The DELs the CNI plugin queued while no agent ran go first: the attachment each
    /// names (by container ID and interface name, as a `del` finds it) is not adopted,
    /// its interface and the namespace name the agent made for it are deleted (what a
    /// `del` undoes), and it is dropped from the record before the queue file goes.
    fn adopt_recorded(&mut self) {
        if let Some(queue) = &self.opts.del_queue
            && let Err(e) = del_queue::create(queue)
        {
            tracing::error!(dir = %queue.display(), error = %e,
                "the queue of the CNI plugin's DELs cannot be made");
            self.status.count(ErrorKind::Api);
        }
        let queued = self.queued_dels();
        self.adopt_recorded_but(&queued);
        for entry in &queued {
            self.dequeue(entry);
        }
    }

    /// [`Agent::adopt_recorded`], with the DELs `queued`.
    fn adopt_recorded_but(&mut self, queued: &[del_queue::Entry]) {
        let Some(dir) = self.opts.state_dir.clone() else {
            return;
        };
        let mut recorded = match state::load(&dir) {
            Ok(state::Loaded::Missing) => return,
            Ok(state::Loaded::Attachments(a)) => a,
            Ok(state::Loaded::Corrupt { error, moved_to }) => {
                tracing::error!(
                    file = %state::path(&dir).display(),
                    moved_to = ?moved_to,
                    "the state file is corrupt ({error}): starting with no pod attachments"
                );
                self.status.count(ErrorKind::Apply);
                return;
            }
            Err(e) => {
                tracing::error!(
                    file = %state::path(&dir).display(),
                    "the state file cannot be read ({e}): starting with no pod attachments"
                );
                self.status.count(ErrorKind::Apply);
                return;
            }
        };
        let n = recorded.len();
        recorded.retain(|a| {
            let deleted = queued
                .iter()
                .any(|q| q.container_id == a.container_id && q.ifname == a.ifname);
            if deleted {
                tracing::info!(container = %a.container_id, pod = %format!("{}/{}",
                    a.pod_namespace, a.pod_name), netns = %a.netns, ifname = %a.ifname,
                    "recorded pod attachment deleted: the CNI plugin queued its DEL");
                remove_interface(&a.netns, &a.ifname, a.named_here);
            }
            !deleted
        });
        for a in recorded {
            let pod = ObjectKey::new(&a.pod_namespace, &a.pod_name);
            match adopt(&a, self.queues()) {
                Ok(tap) => {
                    tracing::info!(container = %a.container_id, %pod, netns = %a.netns,
                        ifname = %a.ifname, "pod interface adopted");
                    self.adopted.insert(pod.clone(), tap);
                    self.cni.insert(
                        (a.container_id, a.ifname.clone()),
                        CniPod {
                            pod,
                            netns: a.netns,
                            named_here: a.named_here,
                            ifname: a.ifname,
                            addresses: a.addresses,
                        },
                    );
                }
                Err(e) => {
                    tracing::warn!(container = %a.container_id, %pod, netns = %a.netns,
                        ifname = %a.ifname, "recorded pod attachment dropped: {e}");
                    self.status.count(ErrorKind::Apply);
                }
            }
        }
        if self.cni.len() != n {
            self.save_state();
        }
    }

    /// Records the attachments in force in the state directory; a failure is logged
    /// (the attachments work on, but a restart would not find them).
    fn save_state(&self) {
        let Some(dir) = &self.opts.state_dir else {
            return;
        };
        let all: Vec<state::Attachment> = self
            .cni
            .iter()
            .map(|((container_id, _), c)| state::Attachment {
                container_id: container_id.clone(),
                ifname: c.ifname.clone(),
                pod_namespace: c.pod.namespace.clone(),
                pod_name: c.pod.name.clone(),
                netns: c.netns.clone(),
                named_here: c.named_here,
                addresses: c.addresses.clone(),
            })
            .collect();
        if let Err(e) = state::save(dir, &all) {
            tracing::error!(
                "the pod attachments were not recorded in {}: {e}",
                dir.display()
            );
        }
    }

    /// The worker's latest counters.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.control.snapshot()
    }

    /// The health check node ports served.
    pub fn health_ports(&self) -> Vec<u16> {
        self.health.ports()
    }

    /// The address `/healthz` is served on, once it is.
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        self.healthz.as_ref().map(HealthzServer::addr)
    }

    /// Listens on [`Options::healthz`] unless done already; a failure is logged, counted
    /// ([`ErrorKind::Apply`]) the first time, and tried again every [`LISTEN_RETRY`].
    fn serve_healthz(&mut self) {
        let Some(addr) = self.opts.healthz else {
            return;
        };
        if self.healthz.is_some() || Instant::now() < self.healthz_due {
            return;
        }
        self.healthz_due = Instant::now() + LISTEN_RETRY;
        match HealthzServer::bind(addr, Arc::clone(&self.proxy)) {
            Ok(s) => {
                if self.healthz_failing {
                    tracing::info!(%addr, "/healthz served after all");
                }
                self.healthz_failing = false;
                self.healthz = Some(s);
            }
            Err(e) if !self.healthz_failing => {
                tracing::warn!(%addr, error = %e,
                    "/healthz not served; trying again every {LISTEN_RETRY:?}");
                self.status.count(ErrorKind::Apply);
                self.healthz_failing = true;
            }
            Err(e) => tracing::debug!(%addr, error = %e, "/healthz still not served"),
        }
    }

    /// Why the worker stopped, when it stopped on an error.
    pub fn worker_error(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// True while the worker runs.
    pub fn is_running(&self) -> bool {
        self.worker.as_ref().is_some_and(|w| !w.is_finished())
    }

    /// Periodic upkeep, called from the agent's loop: stops the live trace or capture of
    /// a client that stopped reading it, reports pod ports gone, tries again to listen
    /// where it could not (`/healthz`, health check node ports) and looks for leftovers
    /// of other dataplanes.
    pub fn housekeeping(&mut self) {
        for what in self.sessions.expire(&self.control, Instant::now()) {
            tracing::info!(
                "{what} stopped: no client read it for {:?}",
                observe::ABANDONED_AFTER
            );
        }
        self.report_gone_ports();
        self.serve_healthz();
        self.retry_health();
        if Instant::now() >= self.leftovers_due
            && let Some(tables) = self.last.as_ref().map(|l| Arc::clone(&l.tables))
        {
            self.check_leftovers(&tables);
        }
    }

    /// Whether the worker took port `name` out of service (its device gone).
    fn port_gone(&self, name: &str) -> bool {
        self.control
            .snapshot()
            .ports
            .iter()
            .any(|p| p.name == name && p.gone.is_some())
    }

    /// Reports, once each, the pod ports the worker took out of service because their
    /// device went away (the pod's network namespace deleted before, or without, its
    /// CNI DEL), as long as the tables in force still have them, which means the pod is
    /// still in the cluster: a warning, and an `apply` error. The port drops what is
    /// routed to it until the tables let it go (the sandbox's CNI DEL, or the Pod
    /// object deleted); a later attachment of the pod gets a new port.
    fn report_gone_ports(&mut self) {
        let snap = self.control.snapshot();
        let mut now = BTreeSet::new();
        for p in &snap.ports {
            let Some(why) = &p.gone else { continue };
            if !self.gone_ports.contains(&p.name) {
                tracing::warn!(
                    port = %p.name,
                    error = %why,
                    "pod port out of service: its device is gone (pod network namespace \
                     deleted?); traffic to the pod is dropped until its CNI DEL or the \
                     deletion of its Pod object"
                );
                self.status.count(ErrorKind::Apply);
            }
            now.insert(p.name.clone());
        }
        self.gone_ports = now;
    }

    /// Stops the worker and closes every port.
    pub fn stop(mut self) -> Result<WorkerStats, String> {
        self.stop.store(true, Ordering::Relaxed);
        self.remove_host_nat();
        let w = self.worker.take().ok_or("no worker")?;
        match w.join() {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("the worker panicked".into()),
        }
    }

    fn compile(&self, cluster: &Cluster) -> Result<Compiled, String> {
        let mut attached: Vec<AttachedPod> = self
            .opts
            .pods
            .keys()
            .map(|k| AttachedPod::new(&k.namespace, &k.name))
            .collect();
        attached.extend(self.cni.values().map(|c| AttachedPod {
            addresses: c.addresses.iter().map(IpNet::addr).collect(),
            ..AttachedPod::new(&c.pod.namespace, &c.pod.name)
        }));
        let mut opts = self.opts.compile.clone();
        // The derived uplink takes the interface's own MAC, so that the node answers ARP
        // and sends with the address its neighbours know.
        if self.opts.base.is_none()
            && let Some(dev) = &self.opts.uplink
        {
            let mac = link::mac_address(None, dev).map_err(|e| format!("uplink {dev}: {e}"))?;
            opts.uplink_mac = Some(MacAddr(mac));
        }
        node_tables(
            cluster,
            &self.opts.node,
            self.opts.base.as_ref(),
            &attached,
            &opts,
        )
    }

    /// Keeps the node's own processes' node port rewrites in step with `tables` (only
    /// with a host port: without one, the node's processes do not reach ferry).
    fn set_host_nat(&mut self, tables: &Tables) {
        if self.opts.host_tap.is_none() {
            return;
        }
        let want = host_nat::rules(tables);
        if self.host_nat.as_ref() == Some(&want) {
            return;
        }
        match host_nat::apply(&host_nat::script(&want.0, &want.1)) {
            Ok(()) => self.host_nat = Some(want),
            Err(e) => tracing::warn!(
                error = %e,
                "node ports are not rewritten for the node's own processes"
            ),
        }
    }

    /// Warns once about each kernel route that takes the node's own traffic to the
    /// cluster addresses of `tables` past the host port, and about each table of
    /// another dataplane's netfilter chains (only with a host port).
    fn check_leftovers(&mut self, tables: &Tables) {
        // Two commands run: at start, then every LEFTOVERS_EVERY, not at every change.
        self.leftovers_due = Instant::now() + LEFTOVERS_EVERY;
        let Some(host) = self.opts.host_tap.as_deref() else {
            return;
        };
        let prefixes = leftovers::cluster_prefixes(tables);
        let found = leftovers::kernel_routes().and_then(|families| {
            let mut all = BTreeSet::new();
            for json in families {
                all.extend(leftovers::strays(&json, &prefixes, host)?);
            }
            Ok(all)
        });
        match found {
            Ok(found) => {
                for s in found.difference(&self.strays) {
                    tracing::warn!(
                        route = %s.route,
                        covers = %s.covers,
                        "a kernel route takes the node's own traffic to cluster addresses past \
                         ferry (left by a previous network plugin?); remove it with `ip route \
                         del {}`",
                        s.route
                    );
                }
                self.strays = found;
            }
            Err(e) => tracing::warn!(error = %e, "the kernel's routes were not checked"),
        }
        match leftovers::kernel_chains().and_then(|json| leftovers::rule_leftovers(&json)) {
            Ok(found) => {
                let found: BTreeSet<String> = found.into_iter().collect();
                for t in found.difference(&self.rule_leftovers) {
                    tracing::warn!(
                        rules = %t,
                        "another dataplane's netfilter rules are in place: they see the \
                         node's own connections (not what ferry forwards) and may rewrite \
                         or drop them; remove them (kube-proxy's: `kube-proxy --cleanup`)"
                    );
                }
                self.rule_leftovers = found;
            }
            Err(e) => tracing::warn!(error = %e, "the netfilter rules were not checked"),
        }
    }

    fn set_health(&mut self, checks: &[HealthCheck]) {
        let failed = self.health.set(checks);
        self.health_opened(failed);
    }

    /// Tries again, every [`LISTEN_RETRY`], the health check node ports that could not
    /// be opened: in a quiet cluster no change would.
    fn retry_health(&mut self) {
        if self.health_failing.is_empty() || Instant::now() < self.health_due {
            return;
        }
        self.health_due = Instant::now() + LISTEN_RETRY;
        let failed = self.health.open_missing();
        self.health_opened(failed);
    }

    /// Reports the health check node ports that could not be opened (`failed`): a
    /// warning and an [`ErrorKind::Apply`] error the first time, and a note when one
    /// that failed opens.
    fn health_opened(&mut self, failed: Vec<(u16, std::io::Error)>) {
        let now: BTreeSet<u16> = failed.iter().map(|(p, _)| *p).collect();
        for (port, e) in &failed {
            if self.health_failing.contains(port) {
                tracing::debug!(port, error = %e, "health check node port still not served");
            } else {
                tracing::warn!(port, error = %e,
                    "health check node port not served; trying again every {LISTEN_RETRY:?}");
                self.status.count(ErrorKind::Apply);
            }
        }
        if self.health_failing.is_empty() && !now.is_empty() {
            self.health_due = Instant::now() + LISTEN_RETRY;
        }
        let served = self.health.ports();
        for port in self.health_failing.difference(&now) {
            if served.contains(port) {
                tracing::info!(port, "health check node port served after all");
            }
        }
        self.health_failing = now;
    }

    /// Queues per port: one per worker.
    fn queues(&self) -> u16 {
        self.opts.workers.count.clamp(1, usize::from(u16::MAX)) as u16
    }

    /// Opens the Linux port of tables port `name`.
    fn open_port(
        &mut self,
        name: &str,
        tables: &Tables,
        compiled: &Compiled,
    ) -> Result<Box<dyn Port>, String> {
        let id = tables
            .port_id(name)
            .ok_or_else(|| format!("no port {name:?}"))?;
        let p = &tables.ports[usize::from(id)];
        let port: Box<dyn Port> = match p.kind {
            PortKind::Uplink => {
                let dev = self.opts.uplink.as_deref().ok_or_else(|| {
                    format!("port {name:?} is the uplink: give its interface (--uplink IFNAME)")
                })?;
                let cfg = AfPacketConfig {
                    drop_kernel_ingress: !self.opts.share_uplink,
                    queues: self.queues(),
                    ..AfPacketConfig::default()
                };
                Box::new(
                    AfPacketPort::open(dev, &cfg)
                        .map_err(|e| format!("port {name:?}: af-packet on {dev}: {e}"))?,
                )
            }
            PortKind::Host => {
                let dev = self.opts.host_tap.as_deref().ok_or_else(|| {
                    format!("port {name:?} is a host port: give its TAP name (--host-tap NAME)")
                })?;
                Box::new(
                    TapPort::create(dev).map_err(|e| format!("port {name:?}: tap {dev}: {e}"))?,
                )
            }
            PortKind::Pod => {
                let key = compiled
                    .pod_ports
                    .iter()
                    .find(|(_, n)| n.as_str() == name)
                    .map(|(k, _)| k.clone())
                    .ok_or_else(|| format!("port {name:?}: no pod"))?;
                let (netns, ifname) = match self.cni.values().find(|c| c.pod == key) {
                    Some(c) => (c.netns.clone(), c.ifname.clone()),
                    None => (
                        self.opts
                            .pods
                            .get(&key)
                            .ok_or_else(|| format!("port {name:?}: pod {key} is not attached"))?
                            .clone(),
                        "eth0".to_string(),
                    ),
                };
                if let Some(tap) = self.adopted.remove(&key) {
                    return Ok(Box::new(tap));
                }
                let cni = self.cni.values().any(|c| c.pod == key);
                self.taps += 1;
                let dev = format!("fy{}t{}", std::process::id() % 100_000, self.taps);
                let tap = link::pod_tap(&dev, &netns, &ifname, p, self.queues())
                    .map_err(|e| format!("port {name:?}: {ifname} of pod {key} in {netns}: {e}"))?;
                if cni {
                    // The CNI plugin's pods keep their interface across agent restarts.
                    tap.set_persist(true).map_err(|e| {
                        format!("port {name:?}: {ifname} of pod {key}: making it persistent: {e}")
                    })?;
                    self.made.push((netns, ifname));
                }
                Box::new(tap)
            }
            PortKind::Plain => {
                return Err(format!(
                    "port {name:?}: a plain port cannot be attached by the agent"
                ));
            }
        };
        if p.gso && !port.offloads() {
            return Err(format!(
                "port {name:?}: the tables say gso: true but this port does not pass GSO packets"
            ));
        }
        Ok(port)
    }
}

impl Agent {
    fn remove_host_nat(&mut self) {
        if self.host_nat.take().is_some()
            && let Err(e) = host_nat::remove()
        {
            tracing::warn!(error = %e, "ferry's nftables tables were not removed");
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.remove_host_nat();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// Deletes a CNI attachment's persistent interface `ifname` in namespace `netns`, and
/// the namespace's `ip netns` name when the agent made it (`named_here`): what a `del`
/// undoes besides the tables. A failure is logged (a namespace deleted already took
/// the interface with it).
fn remove_interface(netns: &str, ifname: &str, named_here: bool) {
    if let Err(e) = link::delete_in_netns(netns, ifname) {
        tracing::warn!(%netns, %ifname, error = %e, "pod interface not deleted");
    }
    if named_here {
        let _ = link::ip(&["netns", "delete", netns]);
    }
}

/// Opens the TAP of recorded attachment `a` again, after checking its namespace is
/// still there.
fn adopt(a: &state::Attachment, queues: u16) -> Result<TapPort, String> {
    let ns = ferry_linux::netns::path(&a.netns).map_err(|e| e.to_string())?;
    if !ns.exists() {
        return Err(format!("network namespace {} is gone", a.netns));
    }
    let first = a.addresses.first().ok_or("no address recorded")?;
    let mac = crate::compile::pod_mac(first.addr());
    link::reopen_pod_tap(&a.netns, &a.ifname, mac.0, queues).map_err(|e| e.to_string())
}

/// The `ip netns` name of a CNI_NETNS path: `/var/run/netns/NAME` or `/run/netns/NAME`
/// give NAME; `/proc/PID/ns/net` gives no name yet but the PID to attach one to.
/// A pod's network namespace as an `add` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Netns {
    /// `/var/run/netns/NAME` or `/run/netns/NAME`: its `ip netns` name.
    Named(String),
    /// `/proc/PID/ns/net`: the process's, which the agent names to use it.
    OfProcess(u32),
}

fn netns_name(path: &str) -> Result<Netns, String> {
    for dir in ["/var/run/netns/", "/run/netns/"] {
        if let Some(n) = path.strip_prefix(dir)
            && !n.is_empty()
            && !n.contains('/')
        {
            return Ok(Netns::Named(n.to_string()));
        }
    }
    if let Some(pid) = path
        .strip_prefix("/proc/")
        .and_then(|r| r.strip_suffix("/ns/net"))
        .and_then(|p| p.parse::<u32>().ok())
    {
        return Ok(Netns::OfProcess(pid));
    }
    Err(format!(
        "{path:?}: expected /var/run/netns/NAME, /run/netns/NAME or /proc/PID/ns/net"
    ))
}

/// Checks what an `add` asks for before anything is made: the container ID and
/// interface name, the addresses (ADDR/LEN, at least one) and the namespace (a path
/// the agent can use, there now). An error is the answer's, with the code docs/cni.md
/// gives: 4 for what comes from the runtime's `CNI_*` variables, [`ERR_BAD_REQUEST`]
/// for the plugin's addresses.
fn check_add(
    container_id: &str,
    ifname: &str,
    netns: &str,
    addresses: &[String],
) -> Result<(Vec<IpNet>, Netns), ApiError> {
    if container_id.is_empty() || ifname.is_empty() || ifname.len() > 15 {
        return Err(api_error(
            4,
            "CNI_CONTAINERID and CNI_IFNAME (at most 15 bytes) are required",
            format!("{container_id:?} {ifname:?}"),
        ));
    }
    let mut addrs = Vec::new();
    for a in addresses {
        match a.parse::<IpNet>() {
            Ok(n) => addrs.push(n),
            Err(_) => {
                return Err(api_error(
                    ERR_BAD_REQUEST,
                    "a pod address is not ADDR/LEN",
                    a.clone(),
                ));
            }
        }
    }
    if addrs.is_empty() {
        return Err(api_error(
            ERR_BAD_REQUEST,
            "the pod has no address",
            container_id.to_string(),
        ));
    }
    let ns = netns_name(netns)
        .map_err(|e| api_error(4, "CNI_NETNS: the network namespace cannot be used", e))?;
    if !std::path::Path::new(netns).exists() {
        return Err(api_error(
            4,
            "CNI_NETNS: the network namespace does not exist",
            netns.to_string(),
        ));
    }
    Ok((addrs, ns))
}

/// Live-traced packets as the API carries them.
fn traced_json(traced: Vec<ferry_linux::worker::TracedPacket>) -> Vec<serde_json::Value> {
    traced
        .into_iter()
        .filter_map(|t| serde_json::to_value(t).ok())
        .collect()
}

/// The error answer to a refused live trace or capture read or stop (`what`): a replaced
/// session has a code of its own, so that its client can tell it from a failure.
fn refused(what: &str, e: &observe::Refusal) -> Response {
    let code = match e {
        observe::Refusal::Replaced(_) => ferry_api::ERR_REPLACED,
        observe::Refusal::NotRunning(_) => ferry_api::ERR_BAD_REQUEST,
        observe::Refusal::Worker(_) => ferry_api::ERR_WORKER,
    };
    Response::error(code, what, e.to_string())
}

/// Captured frames as the API carries them.
fn captured_answer(frames: Vec<observe::Frame>, lost: u64) -> Response {
    Response::Ok(Answer {
        captured: Some(
            frames
                .into_iter()
                .map(|f| ferry_api::CapturedFrame {
                    time_unix_ns: f.time_unix_ns,
                    dir: if f.inbound { "in" } else { "out" }.to_string(),
                    port: f.port,
                    note: f.note,
                    data: hex::encode(&f.data),
                })
                .collect(),
        ),
        lost: Some(lost),
        ..Answer::default()
    })
}

/// An error answer's contents.
fn api_error(code: u32, msg: impl Into<String>, details: impl Into<String>) -> ApiError {
    ApiError {
        code,
        msg: msg.into(),
        details: details.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE0: &str = "
apiVersion: v1
kind: Node
metadata: { name: node0 }
spec: { podCIDR: 10.244.0.0/24, podCIDRs: [10.244.0.0/24] }
status: { addresses: [{ type: InternalIP, address: 192.168.77.1 }] }
";

    /// A LoadBalancer Service with externalTrafficPolicy Local (health check node port
    /// 32000), and its EndpointSlice with `endpoints` (a YAML flow sequence).
    fn local_service(endpoints: &str) -> String {
        format!(
            "
apiVersion: v1
kind: Service
metadata: {{ name: web, namespace: default }}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.11
  clusterIPs: [10.96.0.11]
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  ports: [{{ name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30081 }}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abcde
  namespace: default
  labels: {{ kubernetes.io/service-name: web }}
addressType: IPv4
ports: [{{ name: http, protocol: TCP, port: 8080 }}]
endpoints: {endpoints}
"
        )
    }

    /// The cluster of node `node0` and the objects of `yaml`.
    fn cluster(yaml: &str) -> Arc<Cluster> {
        let all = format!("{NODE0}---{yaml}");
        let (c, _) =
            crate::datastore::file::parse("test.yaml", &all).unwrap_or_else(|r| panic!("{r}"));
        Arc::new(c)
    }

    /// An agent of node0 with a host port only (a TAP in the test's namespace).
    fn options() -> Options {
        let base = "ports:\n  - { name: host, kind: host, mac: \"02:fe:00:00:01:01\", addresses: [169.254.1.1] }\n";
        Options {
            node: "node0".into(),
            base: Some(serde_saphyr::from_str(base).unwrap()),
            host_tap: Some("fyhost".into()),
            ..Options::default()
        }
    }

    /// A running pod of node0 that the tests attach to a namespace that is not there.
    const LATE_POD: &str = "
apiVersion: v1
kind: Pod
metadata: { name: late, namespace: default }
spec: { nodeName: node0, containers: [{ name: main, image: x }] }
status: { phase: Running, podIP: 10.244.0.7, podIPs: [{ ip: 10.244.0.7 }] }
";

    /// The whole answer of health check node port 32000 on 127.0.0.1.
    fn health_check() -> String {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", 32000)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        answer
    }

    /// A change the agent cannot put in force (a pod whose namespace is not there) does
    /// not hold back the endpoint changes that come with it (or after it): those are put
    /// in force alone, and the rest stays pending. Needs root and iproute2.
    #[test]
    fn endpoint_changes_go_in_force_while_another_change_cannot() {
        crate::testing::in_netns("sva", || {
            let mut opts = options();
            let absent = format!("ferry-absent-{}", std::process::id());
            opts.pods.insert(ObjectKey::new("default", "late"), absent);
            let remote =
                "[{ addresses: [10.244.9.5], conditions: { ready: true }, nodeName: node9 }]";
            let local =
                "[{ addresses: [10.244.0.5], conditions: { ready: true }, nodeName: node0 }]";
            let in_force = cluster(&local_service(remote));
            let (mut agent, _) = Agent::start(opts, Arc::clone(&in_force)).unwrap();
            let a = health_check();
            assert!(a.contains("\"localEndpoints\": 0"), "{a}");

            let newer = cluster(&format!("{}---{LATE_POD}", local_service(local)));
            let changed = in_force.diff(&newer);
            assert_eq!(changed.len(), 2, "{changed:?}");
            let e = agent
                .apply_changes(Arc::clone(&newer), &changed)
                .unwrap_err();
            assert!(e.contains("late"), "{e}");
            let (part, applied) = agent
                .apply_services_alone(&newer, &changed)
                .expect("an endpoint change to put in force alone")
                .unwrap();
            assert!(applied.incremental);
            let a = health_check();
            assert!(
                a.starts_with("HTTP/1.1 200 OK\r\n") && a.contains("\"localEndpoints\": 1"),
                "{a}"
            );
            // The pod is what is left, still pending.
            let left = part.diff(&newer);
            assert_eq!(left, [(Kind::Pod, ObjectKey::new("default", "late"))]);
            assert!(agent.apply_services_alone(&newer, &left).is_none());
            let later = Instant::now() + crate::proxy_health::PENDING_LIMIT;
            assert!(!agent.proxy.status_at(later).healthy);
            agent.stop().unwrap();
        });
    }

    /// A health check node port that could not be opened (another process held it) is
    /// opened by the agent's housekeeping once it can be, with no change of the cluster
    /// to set it off; the failure is counted once. Needs root and iproute2.
    #[test]
    fn a_health_check_port_not_opened_is_tried_again_until_it_opens() {
        crate::testing::in_netns("hcr", || {
            let blocker = ferry_linux::tcp::listen("[::]:32000".parse().unwrap()).unwrap();
            let local =
                "[{ addresses: [10.244.0.5], conditions: { ready: true }, nodeName: node0 }]";
            let (mut agent, _) = Agent::start(options(), cluster(&local_service(local))).unwrap();
            assert!(agent.health_ports().is_empty());
            assert_eq!(agent.counters().errors.apply, 1);
            drop(blocker);
            let t0 = Instant::now();
            while agent.health_ports().is_empty() {
                assert!(
                    t0.elapsed() < 2 * LISTEN_RETRY,
                    "port 32000 still not served after {:?}",
                    t0.elapsed()
                );
                agent.housekeeping();
                thread::sleep(Duration::from_millis(50));
            }
            assert_eq!(agent.health_ports(), [32000]);
            assert_eq!(agent.counters().errors.apply, 1);
            agent.stop().unwrap();
        });
    }

    #[test]
    fn netns_paths_give_a_name_or_a_pid() {
        assert_eq!(
            netns_name("/var/run/netns/cni-1").unwrap(),
            Netns::Named("cni-1".into())
        );
        assert_eq!(
            netns_name("/run/netns/x").unwrap(),
            Netns::Named("x".into())
        );
        assert_eq!(netns_name("/proc/42/ns/net").unwrap(), Netns::OfProcess(42));
        for bad in [
            "",
            "/var/run/netns/",
            "/tmp/ns",
            "/proc/x/ns/net",
            "/var/run/netns/a/b",
        ] {
            assert!(netns_name(bad).is_err(), "{bad}");
        }
    }

    fn code(r: Result<(Vec<IpNet>, Netns), ApiError>) -> u32 {
        match r {
            Err(e) => e.code,
            r => panic!("expected an error answer, got {r:?}"),
        }
    }

    #[test]
    fn add_requests_are_checked_with_the_cni_codes_of_their_faults() {
        let addrs = ["10.244.1.5/24".to_string()];
        // This process's namespace: a path that is there.
        let here = format!("/proc/{}/ns/net", std::process::id());
        let (a, ns) = check_add("c1", "eth0", &here, &addrs).unwrap();
        assert_eq!(a, ["10.244.1.5/24".parse::<IpNet>().unwrap()]);
        assert_eq!(ns, Netns::OfProcess(std::process::id()));
        // What the runtime gives (CNI_NETNS, CNI_CONTAINERID, CNI_IFNAME): 4.
        assert_eq!(code(check_add("c1", "eth0", "/tmp/elsewhere", &addrs)), 4);
        let gone = "/var/run/netns/ferry-test-no-such-namespace";
        assert_eq!(code(check_add("c1", "eth0", gone, &addrs)), 4);
        assert_eq!(code(check_add("c1", "eth0", "/proc/0/ns/net", &addrs)), 4);
        assert_eq!(code(check_add("", "eth0", &here, &addrs)), 4);
        assert_eq!(
            code(check_add("c1", "eth0-is-far-too-long", &here, &addrs)),
            4
        );
        // What the plugin gives: a bad request.
        let bad = ["10.244.1.5".to_string()];
        assert_eq!(code(check_add("c1", "eth0", &here, &bad)), ERR_BAD_REQUEST);
        assert_eq!(code(check_add("c1", "eth0", &here, &[])), ERR_BAD_REQUEST);
    }

    #[test]
    fn only_a_busy_worker_makes_a_cni_request_worth_trying_again_later() {
        assert_eq!(Step::Worker.cni_code(), 11);
        // An address of the pod that belongs to another pod stays so until the cluster
        // changes.
        assert_eq!(Step::Compile.cni_code(), ERR_TABLES);
        assert_eq!(Step::Port.cni_code(), ERR_INTERFACE);
    }

    #[test]
    fn service_keys_come_from_tables_entry_names() {
        assert_eq!(
            service_key("default/web:http"),
            Some(ObjectKey::new("default", "web"))
        );
        assert_eq!(
            service_key("kube-system/dns:53"),
            Some(ObjectKey::new("kube-system", "dns"))
        );
        assert_eq!(service_key("nonsense"), None);
    }
}
