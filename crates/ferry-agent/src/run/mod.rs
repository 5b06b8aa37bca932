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
//!
//! The agent's concerns live in files of their own: `apply` puts states
//! in force, `cni` answers the CNI plugin's requests and keeps its attachments, `ports`
//! opens the Linux ports, `requests` answers the local API, `health` serves the health
//! checks and `host` keeps the host's NAT in step and looks for leftovers.

mod apply;
mod audit;
mod checkpoint;
mod cni;
mod health;
mod host;
mod ports;
mod requests;
#[cfg(test)]
mod tests;
mod uplink;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ferry_datapath::{MacAddr, Pipeline, Tables, TablesSpec};
use ferry_linux::Port;
use ferry_linux::link;
use ferry_linux::worker::{Control, NamedPort, Snapshot, WorkerStats, Workers};
use ipnet::IpNet;

use crate::cluster::{Cluster, ObjectKey};
use crate::compile::{AttachedPod, CompileOptions, Compiled, node_tables};
use crate::observe;
use crate::status::AgentStatus;

use self::apply::Last;
use self::cni::Attachments;
use self::health::Health;
use self::host::Host;

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
    /// Move the node's own stack (addresses, routes, permanent neighbours) from the
    /// uplink onto the host TAP once ferry forwards, and give it back when the agent
    /// stops without handing over ([`crate::takeover`]); the default base only.
    pub take_uplink: bool,
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
    /// The audit log of denied connections ([`crate::policy::audit`]); None: off.
    pub audit: Option<crate::policy::audit::AuditConfig>,
    /// How often the connection state is written to the state directory for the next
    /// agent ([`crate::checkpoint`]); None (or no state directory): never, and no
    /// checkpoint is read at start.
    pub checkpoint_every: Option<Duration>,
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
    /// Connections removed at the swap (see `ferry_datapath::SwapReport`):
    /// their endpoint went away, or a UDP flow's destination became a frontend.
    pub ct_removed: usize,
    /// Tracked connections a policy change ended (`policy-on-change: reevaluate`).
    pub policy_cut: usize,
    /// Only part of the tables was compiled: the changed Services (an EndpointSlice or
    /// Service change), or the policy section (a change only policy reads).
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
    /// The pod interfaces the CNI plugin asked for, and what goes with them.
    cni: Attachments,
    /// Health check node ports and `/healthz`.
    health: Health,
    /// The host's NAT for node ports, and the leftovers found there.
    host: Host,
    /// Datastore health, sync latency and errors ([`crate::status`]).
    status: AgentStatus,
    /// Live traces and captures turned on for API clients.
    sessions: observe::Sessions,
    /// Pod ports the worker took out of service (their device gone), each reported once
    /// while the tables still have it.
    gone_ports: BTreeSet<String>,
    /// The audit log of denied connections, when on.
    audit: Option<self::audit::Audit>,
    /// When the next checkpoint is due, and whether the last one failed.
    checkpoint: (Instant, bool),
    /// The last checkpoint's state, saved into again by the next.
    checkpoint_state: Option<Box<ferry_datapath::handover::SavedState>>,
    /// The node's stack to move onto the host TAP once the worker runs.
    pending_take: Option<Arc<crate::takeover::Taken>>,
    /// The node's stack this agent moved onto the host TAP, to give back at its stop.
    taken: Option<Arc<crate::takeover::Taken>>,
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
    /// A checkpoint its predecessor left in the state directory is restored first
    /// ([`crate::checkpoint`]).
    pub fn start(opts: Options, cluster: Arc<Cluster>) -> Result<(Agent, Applied), String> {
        let mut starting = Agent::prepare(opts, cluster, Inherited::default())?;
        starting.load_checkpoint();
        starting.run()
    }

    /// Everything [`Agent::start`] does but starting the worker: compiles the tables of
    /// `cluster` and opens every port, taking the ports of `inherited` (handed over by
    /// the agent that ran before, [`crate::handover`]) where they are the same. The
    /// pipeline is made but nothing forwards until [`Starting::run`].
    pub fn prepare(
        opts: Options,
        cluster: Arc<Cluster>,
        inherited: Inherited,
    ) -> Result<Starting, String> {
        let t0 = Instant::now();
        let health = Health::new(opts.healthz);
        let audit = (opts.audit.as_ref())
            .map(|cfg| self::audit::Audit::open(cfg, &opts.node))
            .transpose()?;
        let Inherited {
            ports: handed,
            pods,
        } = inherited;
        let mut agent = Agent {
            opts,
            control: Arc::new(Control::new()),
            stop: Arc::new(AtomicBool::new(false)),
            worker: None,
            open: BTreeSet::new(),
            taps: 0,
            generation: 1,
            started: Instant::now(),
            failed: Arc::new(Mutex::new(None)),
            last: None,
            cni: Attachments::default(),
            health,
            host: Host::new(),
            status: AgentStatus::new(),
            sessions: observe::Sessions::default(),
            gone_ports: BTreeSet::new(),
            audit,
            checkpoint: (Instant::now(), false),
            checkpoint_state: None,
            pending_take: None,
            taken: None,
        };
        agent.resolve_uplink(&cluster)?;
        agent.cni.adopted.extend(pods);
        agent.adopt_recorded();
        let mut compiled = agent.compile(&cluster)?;
        let tables = Arc::clone(&compiled.compiled);
        let compile = t0.elapsed();
        let mut handed = handed;
        let mut ports: Vec<NamedPort> = Vec::with_capacity(tables.ports.len());
        for p in &tables.ports {
            let port = match handed.remove(p.name.as_str()) {
                Some(port) => port,
                None => agent.open_port(p.name.as_str(), &tables, &compiled)?,
            };
            ports.push((p.name.clone(), port));
        }
        agent.open = ports.iter().map(|(n, _)| n.clone()).collect();
        // An adopted TAP whose pod got no port (its Pod object says it finished) is kept
        // for the port a later state may give it, as its attachment is.
        for key in agent.cni.adopted.keys() {
            tracing::warn!(pod = %key, "adopted pod interface has no port in the tables");
        }
        for name in handed.keys() {
            tracing::info!(port = %name, "a port handed over has no place in the tables: closed");
        }
        let mut pipeline = Pipeline::new(Arc::clone(&tables));
        // Before a handover's state or a checkpoint fills it: the workers' start would
        // otherwise move the filled slab into the whole one, forwarding held.
        ferry_linux::worker::prepare_conntrack(&mut pipeline);
        if agent.audit.is_some() {
            pipeline.audit_denials(ferry_datapath::DEFAULT_AUDIT_BUFFER);
        }
        let warnings = std::mem::take(&mut compiled.warnings);
        Ok(Starting {
            agent,
            ports,
            pipeline,
            cluster,
            tables,
            compiled,
            compile,
            warnings,
        })
    }

    /// Starts the worker thread on `ports` with `pipeline`.
    fn spawn_worker(
        &mut self,
        mut ports: Vec<NamedPort>,
        mut pipeline: Pipeline,
    ) -> Result<(), String> {
        let (control, stop, failed) = (
            Arc::clone(&self.control),
            Arc::clone(&self.stop),
            Arc::clone(&self.failed),
        );
        let started = self.started;
        let proxy = Arc::clone(&self.health.proxy);
        // Before the worker runs, so that it is the last to say so when it stops at once.
        proxy.set_running(true);
        let workers = Workers {
            count: self.opts.workers.count.max(1),
            ..self.opts.workers.clone()
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
        self.worker = Some(worker);
        Ok(())
    }

    /// The agent's health figures, for the loop that feeds it to report datastore
    /// updates and sync latencies.
    pub fn status_mut(&mut self) -> &mut AgentStatus {
        &mut self.status
    }

    /// The worker's latest counters.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.control.snapshot()
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

    /// Periodic upkeep, called from the agent's loop: writes the audit log of the
    /// denials the worker handed over, stops the live trace or capture of a client that
    /// stopped reading it, reports pod ports gone, tries again to listen where it could
    /// not (`/healthz`, health check node ports) and looks for leftovers of other
    /// dataplanes.
    pub fn housekeeping(&mut self) {
        self.write_audit();
        if let Some(every) = self.opts.checkpoint_every
            && Instant::now() >= self.checkpoint.0
        {
            self.checkpoint.0 = Instant::now() + every;
            self.checkpoint();
        }
        for what in self.sessions.expire(&self.control, Instant::now()) {
            tracing::info!(
                "{what} stopped: no client read it for {:?}",
                observe::ABANDONED_AFTER
            );
        }
        self.report_gone_ports();
        self.health.serve_healthz(&mut self.status);
        self.health.retry(&mut self.status);
        if self.host.leftovers_due(Instant::now())
            && let Some(last) = &self.last
        {
            self.host
                .check_leftovers(self.opts.host_tap.as_deref(), &last.tables);
        }
    }

    /// Writes the audit log of the denials the worker handed over, when it is on.
    fn write_audit(&mut self) {
        if let Some(a) = &mut self.audit {
            a.run(
                &self.control,
                self.last.as_ref(),
                self.generation,
                self.started,
            );
        }
    }

    /// The worker's control, for the handover ([`crate::handover`]).
    pub(crate) fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// The pod whose port the tables in force name `port`.
    pub(crate) fn pod_of_port(&self, port: &str) -> Option<ObjectKey> {
        let last = self.last.as_ref()?;
        last.pod_ports
            .iter()
            .find(|(_, n)| n.as_str() == port)
            .map(|(k, _)| k.clone())
    }

    /// Writes the audit log of the denials handed over so far (before a handover, after
    /// which this process writes nothing more).
    pub(crate) fn write_audit_now(&mut self) {
        self.write_audit();
    }

    /// Gives the node's stack back to the uplink (when the agent took it), stops the
    /// worker and closes every port.
    pub fn stop(mut self) -> Result<WorkerStats, String> {
        // While ferry still forwards: the kernel is back on the uplink before the
        // ingress filter goes with the worker's ports.
        self.give_back_uplink();
        self.stop.store(true, Ordering::Relaxed);
        self.host.remove_nat();
        let w = self.worker.take().ok_or("no worker")?;
        let r = match w.join() {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("the worker panicked".into()),
        };
        // The denials of the worker's last round, handed over as it returned.
        self.write_audit();
        r
    }

    /// Compiles the tables of `cluster` with the pods attached now.
    fn compile(&self, cluster: &Cluster) -> Result<Compiled, String> {
        let mut attached: Vec<AttachedPod> = self
            .opts
            .pods
            .keys()
            .map(|k| AttachedPod::new(&k.namespace, &k.name))
            .collect();
        attached.extend(self.cni.pods.values().map(|c| AttachedPod {
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

    /// The health check node ports served.
    pub fn health_ports(&self) -> Vec<u16> {
        self.health.ports()
    }

    /// The address `/healthz` is served on, once it is.
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        self.health.healthz_addr()
    }

    /// Queues per port: one per worker.
    fn queues(&self) -> u16 {
        self.opts.workers.count.clamp(1, usize::from(u16::MAX)) as u16
    }
}

/// Ports handed over by the agent that ran before ([`crate::handover`]), for
/// [`Agent::prepare`] to take instead of opening its own.
#[derive(Default)]
pub struct Inherited {
    /// By the tables' port name: the uplink, the host port.
    pub ports: BTreeMap<String, Box<dyn Port>>,
    /// Pods' ports, by pod.
    pub pods: BTreeMap<ObjectKey, Box<dyn Port>>,
}

/// An agent whose ports are open and whose pipeline is made, not forwarding yet
/// ([`Agent::prepare`]).
pub struct Starting {
    agent: Agent,
    ports: Vec<NamedPort>,
    pipeline: Pipeline,
    cluster: Arc<Cluster>,
    tables: Arc<Tables>,
    compiled: Compiled,
    compile: Duration,
    warnings: Vec<String>,
}

impl Starting {
    /// The pipeline the worker will run, to load a handed-over state into.
    pub fn pipeline_mut(&mut self) -> &mut Pipeline {
        &mut self.pipeline
    }

    /// The pipeline's clock now (the agent's own: nanoseconds since it began).
    pub fn now_ns(&self) -> u64 {
        self.agent.started.elapsed().as_nanos() as u64
    }

    /// Starts the worker: from here on the agent forwards. Then serves its health
    /// checks and sets the host's NAT.
    pub fn run(self) -> Result<(Agent, Applied), String> {
        let Starting {
            mut agent,
            ports,
            pipeline,
            cluster,
            tables,
            compiled,
            compile,
            warnings,
        } = self;
        let opened = agent.open.iter().cloned().collect();
        agent.spawn_worker(ports, pipeline)?;
        agent.take_uplink()?;
        agent.health.set(&compiled.health_checks, &mut agent.status);
        let host_tap = agent.opts.host_tap.as_deref();
        agent.host.set_nat(host_tap, &tables);
        agent.host.check_leftovers(host_tap, &tables);
        agent.health.proxy.set_node(cluster.node(&agent.opts.node));
        agent.health.proxy.updated();
        agent.health.serve_healthz(&mut agent.status);
        agent.last = Some(Last::new(cluster, tables, compiled));
        Ok((
            agent,
            Applied {
                generation: 1,
                compile,
                swap: Duration::ZERO,
                opened,
                closed: Vec::new(),
                ct_removed: 0,
                policy_cut: 0,
                incremental: false,
                warnings,
            },
        ))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // An agent that ends on an error (its worker failed) gives the node back too; one
        // that handed over never gets here (its process exits), nor one that crashed.
        self.give_back_uplink();
        self.stop.store(true, Ordering::Relaxed);
        self.host.remove_nat();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}
