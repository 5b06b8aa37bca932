//! The worker loop: ports in, pipeline, ports out.
//!
//! A worker owns a set of ports and one [`Pipeline`] (with several workers, see "Several
//! workers" below). Each round it polls the ports'
//! descriptors (at most [`POLL_TIMEOUT_MS`], so that the pipeline's clock advances and a
//! stop request is noticed on an idle node), receives up to [`RX_BATCH`] frames per
//! readable port, runs them through the pipeline, and sends what came out grouped per
//! egress port, one `send_batch` per port per round. Before a port that takes offloads
//! ([`Port::offloads`]) and whose tables say `gso: true` is sent its packets, consecutive
//! TCP segments of one flow among them are merged into GSO super-packets
//! ([`gro::coalesce`]), as Linux's GRO would: a pod's TAP then takes one write per run
//! instead of one per segment. A port with `gso: false` gets plain packets only, as the
//! pipeline made them.
//!
//! **Port numbering.** Each port comes with the name of its port in the tables, and the
//! worker keeps them in table order: `ports[i]` is the pipeline's `PortId` `i`. A port
//! whose tables say `gso: true` must have [`Port::offloads`]: a port without offloads
//! cannot take GSO packets or partial checksums, and the pipeline only finishes them for
//! ports whose `gso` is false. The worker refuses ports that do not match the tables.
//!
//! **Live updates.** [`run_worker_with`] takes a [`Control`] through which the control
//! plane swaps tables and ports while the worker runs ([`Control::send`] with an
//! [`Update`]). The packet path takes no lock for it: the worker reads one atomic flag per
//! round, and when an update waits it applies it between two rounds, when nothing is
//! queued for sending (so no packet carries a `PortId` of the old tables). It keeps the
//! ports whose names the new tables still have, adds the update's new ports, lets go of
//! the others (handed back to the sender to close, so that closing a device never stalls
//! forwarding), puts the ports in the new table order, and hands the tables to the
//! pipeline ([`Pipeline::set_tables`]: connections survive, counters follow ports by
//! name). An update whose tables name a port that has no Linux port, or that does not
//! fit otherwise, is refused whole. The sender learns what the swap did and how long it
//! waited ([`Applied`]); an update waits for the end of the current round; an idle worker is woken at once
//! (an eventfd polled with the ports).
//! The worker also publishes its counters and the pipeline's every
//! [`STATS_INTERVAL_NS`] of pipeline time, after each update and when it returns
//! ([`Control::snapshot`]), for status and metrics, and with them the denials its
//! pipeline recorded for the audit log ([`Control::take_denials`]).
//!
//! **Taps.** A live trace or a capture ([`Taps`], turned on and off by control-plane
//! jobs) sends the packets of a batch through [`Taps`] on their way to the pipeline;
//! with both off, the loop checks one flag per batch and is as it would be without them.
//!
//! **Connection table memory.** Before its first round the worker allocates the
//! pipeline's connection table whole ([`ferry_datapath::conntrack::Conntrack::preallocate`]),
//! so that no packet waits for it to grow, and asks for transparent huge pages over it
//! ([`crate::advise_huge_pages`]): a table of a million connections spans some 200 MB,
//! and on 4 KiB pages its lookups miss the TLB (docs/benchmarks.md measures the
//! difference). Pages are still taken only as connections use them. Without huge page
//! support the advice is dropped. The table is given the processor's prefetch
//! instruction ([`crate::prefetch`]), and each receive batch goes to the pipeline whole
//! ([`Pipeline::process_batch`]): with a large table, the connections of the batch are
//! prefetched before its first packet is processed, so that their cache misses overlap.
//!
//! **Packet buffer memory.** Packets are heap buffers of up to 64 KiB, allocated and
//! freed at a high rate; the worker tells the C allocator to keep freed memory for reuse
//! ([`crate::memory::retain_freed_heap`]) instead of handing it back to the kernel and
//! faulting it in again.
//!
//! **Pods that go away.** When a pod's network namespace is deleted while its TAP is
//! open (a sandbox removed before, or without, the CNI DEL), the kernel unregisters the
//! device: poll reports `POLLERR` on the descriptor at every round and reads and writes
//! fail with `EBADFD`. A port the tables call a pod's (`kind: pod`) whose receive fails
//! that way (or with `ENODEV`, `ENXIO`, `EIO`, or whose descriptor hangs up) is taken
//! out of service: its descriptor is closed, a placeholder that is never polled and takes
//! nothing stands in for it (so `ports[i]` stays the tables' port `i`), the worker counts
//! it ([`WorkerStats::ports_gone`]) and reports it once on standard error (the port and
//! the error), and the packets the pipeline routes to it afterwards are dropped and
//! counted as [`WorkerStats::tx_dropped`]. [`PortSnapshot::gone`] says why. The other
//! ports go on. The port stays out of service until an update lets it go (its pod gone
//! from the tables) or gives a new port of that name. Any other port whose device goes
//! away (the uplink, the host's TAP) still stops the workers (see "Leaving" below): the
//! node cannot work without it, and its going is not a pod's ordinary end.
//!
//! **Shutdown.** The worker returns once `stop` is set (within one poll timeout). It
//! borrows the ports: the caller drops them afterwards (after updates, the ports of the
//! latest tables, in their order), which closes TAP descriptors (the devices disappear),
//! closes and unmaps AF_PACKET sockets, and removes any ingress drop filter.
//!
//! **Several workers** ([`run_workers`]; one per core is the intent). Each worker is a
//! thread running the loop above over its share of the receive queues; all of them
//! run one pipeline:
//! - *Receive queues.* A port that brings further queues ([`Port::take_queues`]: an
//!   AF_PACKET uplink opened with [`crate::AfPacketConfig::queues`], one socket per
//!   worker in a `PACKET_FANOUT` hash group; a multi-queue pod TAP from
//!   [`crate::TapPort::create_queues`]) has queue `q` received by worker `q % workers`:
//!   the kernel spreads the flows over the queues by hash. A port of one queue (a host
//!   TAP) is received by one worker, the ports dealt out in table order (port `i` to
//!   worker `i % workers`), as Open vSwitch deals single-queue ports out to its threads.
//! - *Sending.* Any worker sends to any port, through its own queue of that port when it
//!   has one and otherwise through the port's queue under that queue's lock.
//! - *One pipeline.* Connection tracking, fragment reassembly, neighbours, affinity and
//!   counters are the pipeline's, behind one lock that a worker holds while it runs a
//!   received batch through it (and the taps, which trace and capture whatever any
//!   worker receives). Both directions of a NAT'd connection, and every fragment of a
//!   datagram, meet the same state whichever worker took them in, so nothing depends on
//!   how the kernel spreads packets; what runs in parallel is the system calls, which
//!   is where a worker spends most of its time (docs/benchmarks.md), and the segment
//!   merging before sending.
//! - *Updates* are applied by worker 0 (the one that serves the [`Control`]) once every
//!   worker has finished its round: the ports sit behind a read-write lock that each
//!   worker reads for a round and worker 0 writes for an update. The other workers then
//!   poll the new ports' descriptors.
//! - *Counts.* [`Snapshot::worker`] is the sum over the workers, [`Snapshot::workers`]
//!   each one's; a port's Linux counters are the sum over its queues.
//! - *Leaving.* When one worker stops (a port broken: the device of a port other than a
//!   pod's gone, as poll's `POLLHUP` or the port's own error of kind `NotFound` says,
//!   [`MAX_FAILING_ROUNDS`] receive errors in a row; a panic), the others stop too, and
//!   [`run_workers`] returns the first error.
//!
//! - *Pinning.* With [`Workers::cpus`], each worker pins itself to its CPU before its
//!   first round; otherwise the kernel's scheduler places them.
//!
//! **Busy polling.** With [`Workers::busy_poll`], a worker that received frames in a
//! round polls its ports without sleeping (a zero poll timeout) until that long has
//! passed without any, as Linux's `SO_BUSY_POLL` does for a socket, yielding its core
//! between two empty polls. A frame that comes within the window is taken at once
//! instead of waking a sleeping thread, which is most of what a packet's trip through
//! ferry costs on an idle machine: latency drops, and the worker keeps its core busy
//! while traffic flows. Idle, it sleeps as before.

mod control;
#[cfg(test)]
mod multi_tests;
mod taps;
#[cfg(test)]
mod taps_tests;
#[cfg(test)]
mod tests;

pub use control::{
    Applied, Control, DENIAL_QUEUE, HandedPort, JobError, PortSnapshot, Snapshot, Update,
    UpdateError, WorkerView,
};
pub use taps::{Captured, Direction, MAX_TRACE_COUNT, Taps, TracedPacket};

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread;
use std::time::{Duration, Instant};

use ferry_datapath::{Packet, Pipeline, PortId, PortKind, SwapReport, Tables, Trace, VnetHdr, gro};

use crate::port::{Frame, Port, PortCounters};

/// Longest wait for traffic before the pipeline's clock is advanced and `stop` checked.
pub const POLL_TIMEOUT_MS: i32 = 10;
/// Receive errors in a row after which a port counts as broken and the worker returns
/// (an error state makes poll return at once, so this is reached quickly).
pub const MAX_FAILING_ROUNDS: u32 = 1000;
/// Frames received from one port per round.
pub const RX_BATCH: usize = 64;
/// How often, in pipeline time, the worker publishes its counters to its [`Control`].
pub const STATS_INTERVAL_NS: u64 = 100_000_000;

/// A port with the name of the tables' port it is.
pub type NamedPort = (String, Box<dyn Port>);

/// What a worker counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Rounds of the loop.
    pub rounds: u64,
    /// Rounds that polled without sleeping, busy polling ([`Workers::busy_poll`]).
    pub busy_rounds: u64,
    /// Frames received and run through the pipeline.
    pub rx_frames: u64,
    /// Failed receive calls.
    pub rx_errors: u64,
    /// Frames the ports took for sending.
    pub tx_frames: u64,
    /// Failed send calls.
    pub tx_errors: u64,
    /// Frames dropped because their port could not take them without blocking, or
    /// because it was taken out of service (a pod's device gone, see [`WorkerStats::ports_gone`]).
    pub tx_dropped: u64,
    /// TCP segments merged into the segment before them on the way out (each one a frame
    /// fewer to send).
    pub gro_merged: u64,
    /// Updates applied.
    pub updates: u64,
    /// Updates refused.
    pub updates_refused: u64,
    /// Pod ports taken out of service because their device went away (see "Pods that
    /// go away" in the module docs), each counted once, by the worker that found it.
    pub ports_gone: u64,
}

impl WorkerStats {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &WorkerStats) {
        self.rounds += o.rounds;
        self.busy_rounds += o.busy_rounds;
        self.rx_frames += o.rx_frames;
        self.rx_errors += o.rx_errors;
        self.tx_frames += o.tx_frames;
        self.tx_errors += o.tx_errors;
        self.tx_dropped += o.tx_dropped;
        self.gro_merged += o.gro_merged;
        self.updates += o.updates;
        self.updates_refused += o.updates_refused;
        self.ports_gone += o.ports_gone;
    }
}

/// Runs ports through `pipeline` until `stop` is set; `clock` gives the pipeline's time
/// in nanoseconds. `ports[i]` is the pipeline's port `i` (see the module docs); the
/// counts must be equal. Without live updates: see [`run_worker_with`].
pub fn run_worker(
    ports: &mut [Box<dyn Port>],
    pipeline: &mut Pipeline,
    stop: &AtomicBool,
    clock: impl Fn() -> u64 + Sync,
) -> io::Result<WorkerStats> {
    let tables = Arc::clone(pipeline.tables());
    if ports.len() != tables.ports.len() || ports.len() > usize::from(PortId::MAX) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} ports for a pipeline whose tables have {}",
                ports.len(),
                tables.ports.len()
            ),
        ));
    }
    // Moved out for the run and back after it: with a control of its own, nothing
    // changes the set or its order.
    let mut named: Vec<NamedPort> = ports
        .iter_mut()
        .zip(&tables.ports)
        .map(|(p, t)| {
            (
                t.name.clone(),
                std::mem::replace(p, Box::new(GonePort::vacant())),
            )
        })
        .collect();
    let r = run_worker_with(&mut named, pipeline, stop, clock, &Control::new());
    for (slot, (_, p)) in ports.iter_mut().zip(named) {
        *slot = p;
    }
    r
}

/// Runs ports through `pipeline` until `stop` is set, taking updates through `control`
/// (see the module docs); `clock` gives the pipeline's time in nanoseconds. One worker:
/// [`run_workers`] with 1.
pub fn run_worker_with(
    ports: &mut Vec<NamedPort>,
    pipeline: &mut Pipeline,
    stop: &AtomicBool,
    clock: impl Fn() -> u64 + Sync,
    control: &Control,
) -> io::Result<WorkerStats> {
    run_workers(1, ports, pipeline, stop, clock, control)
}

/// Runs ports through `pipeline` with `workers` worker threads (this one and
/// `workers - 1` more) until `stop` is set or one of them fails, taking updates through
/// `control` (see the module docs); `clock` gives the pipeline's time in nanoseconds.
/// Each port comes with the name of its port in the pipeline's tables, in any order:
/// every port of the tables needs exactly one. On return `ports` holds the ports of the
/// tables in force, in their order, for the caller to drop (their further queues are
/// closed already). The counts returned are the sum over the workers.
pub fn run_workers(
    workers: impl Into<Workers>,
    ports: &mut Vec<NamedPort>,
    pipeline: &mut Pipeline,
    stop: &AtomicBool,
    clock: impl Fn() -> u64 + Sync,
    control: &Control,
) -> io::Result<WorkerStats> {
    let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    let Workers {
        count: workers,
        cpus,
        busy_poll,
    } = workers.into();
    if !(1..=MAX_WORKERS).contains(&workers) {
        return Err(invalid(format!(
            "{workers} workers: between 1 and {MAX_WORKERS} are supported"
        )));
    }
    if busy_poll > MAX_BUSY_POLL {
        return Err(invalid(format!(
            "busy polling for {busy_poll:?}: at most {MAX_BUSY_POLL:?} is supported"
        )));
    }
    plan(&[], ports, pipeline.tables()).map_err(invalid)?;
    let given = std::mem::take(ports);
    (*ports, _) = arrange(Vec::new(), given, pipeline.tables());
    if !control.attach() {
        return Err(invalid(
            "the control is already attached to a running worker".into(),
        ));
    }
    let _attached = control::Attached(control);
    prepare_conntrack(pipeline);
    let tables = Arc::clone(pipeline.tables());
    let mut taps = Taps::default();
    taps.set_ports(ports.iter().map(|(n, _)| n.as_str()), &tables);
    let shared = Shared {
        workers,
        cpus,
        busy_poll,
        layout: RwLock::new(Layout::new(
            std::mem::take(ports),
            &mut HashMap::new(),
            &mut HashMap::new(),
            &tables,
        )),
        core: Mutex::new(Core {
            pipeline,
            taps,
            stats: vec![WorkerStats::default(); workers],
        }),
        leave: AtomicBool::new(false),
        error: Mutex::new(None),
    };
    thread::scope(|s| {
        for w in 1..workers {
            let (shared, clock) = (&shared, &clock);
            let spawned = thread::Builder::new()
                .name(format!("ferry-worker-{w}"))
                .spawn_scoped(s, move || work(shared, w, stop, clock, None));
            if let Err(e) = spawned {
                shared.fail(io::Error::new(
                    e.kind(),
                    format!("starting worker {w}: {e}"),
                ));
            }
        }
        work(&shared, 0, stop, &clock, Some(control));
    });
    let Shared {
        layout,
        core,
        error,
        ..
    } = shared;
    let layout = layout.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut core = core.into_inner().unwrap_or_else(|e| e.into_inner());
    publish(control, clock(), &layout, &mut core);
    let stats = core.total();
    *ports = layout.into_ports();
    match error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(stats),
    }
}

/// Most worker threads [`run_workers`] runs.
pub const MAX_WORKERS: usize = 64;

/// How many workers [`run_workers`] runs, and where.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Workers {
    /// Worker threads, 1 to [`MAX_WORKERS`].
    pub count: usize,
    /// CPUs to pin the workers to: worker `w` runs on `cpus[w % cpus.len()]` only
    /// ([`crate::cpu::pin_current_thread`]; worker 0 is the calling thread). Empty: the
    /// workers are not pinned.
    pub cpus: Vec<usize>,
    /// How long a worker goes on polling without sleeping after the last round in which
    /// it received frames (see "Busy polling" in the module docs), at most
    /// [`MAX_BUSY_POLL`]. Zero: a worker sleeps in `poll` whenever nothing is ready.
    pub busy_poll: Duration,
}

/// Longest [`Workers::busy_poll`].
pub const MAX_BUSY_POLL: Duration = Duration::from_secs(1);

impl From<usize> for Workers {
    fn from(count: usize) -> Workers {
        Workers {
            count,
            ..Workers::default()
        }
    }
}

/// Allocates the connection table whole and advises huge pages over it (see the module
/// docs). Best effort: a kernel without transparent huge pages refuses the advice, and
/// the table works the same on small pages. The workers do this as they start; a
/// pipeline that is to be filled before (a handover's state, a checkpoint) is better
/// prepared before it is filled, so that the start neither moves the slab nor indexes
/// its entries again, and their pages come huge. Done twice, the second does nothing.
pub fn prepare_conntrack(pipeline: &mut Pipeline) {
    crate::memory::retain_freed_heap();
    let ct = pipeline.conntrack_mut();
    ct.preallocate();
    ct.set_prefetch(Some(crate::prefetch));
    for (ptr, len) in ct.memory_regions() {
        let _ = crate::advise_huge_pages(ptr, len);
    }
}

/// Locks `m`, going on after a panic elsewhere (the workers are leaving then anyway).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// What the workers share (see the module docs, "Several workers"). Locks are taken in
/// the order `layout`, `core`, a port queue.
struct Shared<'p> {
    workers: usize,
    /// CPUs to pin the workers to (see [`Workers::cpus`]).
    cpus: Vec<usize>,
    /// See [`Workers::busy_poll`].
    busy_poll: Duration,
    /// The ports; read-locked by a worker for each round, write-locked to change them.
    layout: RwLock<Layout>,
    core: Mutex<Core<'p>>,
    /// Set when any worker leaves: the others follow.
    leave: AtomicBool,
    /// The first error a worker met.
    error: Mutex<Option<io::Error>>,
}

impl Shared<'_> {
    fn fail(&self, e: io::Error) {
        lock(&self.error).get_or_insert(e);
        self.leave.store(true, Ordering::Relaxed);
    }
}

/// The pipeline and what goes with it: one worker at a time.
struct Core<'p> {
    pipeline: &'p mut Pipeline,
    taps: Taps,
    /// Each worker's counts, as of its last round.
    stats: Vec<WorkerStats>,
}

impl Core<'_> {
    fn total(&self) -> WorkerStats {
        let mut t = WorkerStats::default();
        for s in &self.stats {
            t.add(s);
        }
        t
    }
}

/// Further queues of ports, by port name.
type Queues = HashMap<String, Vec<Box<dyn Port>>>;

/// Why ports were taken out of service, by port name.
type Gone = HashMap<String, String>;

/// The ports in table order, each with its queues.
struct Layout {
    /// Changes with every update that is applied.
    version: u64,
    slots: Vec<Slot>,
}

/// One port of the tables: queue 0 is the port given, the others its
/// [`Port::take_queues`].
struct Slot {
    name: String,
    queues: Vec<Mutex<Box<dyn Port>>>,
    offloads: bool,
    /// Whether to merge TCP segments before sending.
    coalesce: bool,
    /// A pod's port (the tables say `kind: pod`): its device going away takes it out
    /// of service instead of stopping the workers.
    pod: bool,
    /// Set once the port is out of service: why (its device went away).
    gone: OnceLock<String>,
}

impl Slot {
    /// The worker that receives from queue `q` of port `i`: worker `q` (modulo the
    /// workers) for a port of several queues; ports of one queue are dealt out to the
    /// workers in turn.
    fn owner(&self, i: usize, q: usize, workers: usize) -> usize {
        (if self.queues.len() > 1 { q } else { i }) % workers
    }

    /// The queue worker `w` sends through: its own when it has one.
    fn tx_queue(&self, w: usize) -> usize {
        w % self.queues.len()
    }
}

impl Layout {
    /// Ports in table order (as [`arrange`] gives them), with the further queues they
    /// bring or, for ports that had them before, those in `queues`.
    /// Ports out of service in `gone` stay so.
    fn new(ports: Vec<NamedPort>, queues: &mut Queues, gone: &mut Gone, tables: &Tables) -> Layout {
        let slots = ports
            .into_iter()
            .zip(&tables.ports)
            .map(|((name, mut port), t)| {
                let mut more = port.take_queues();
                more.extend(queues.remove(&name).unwrap_or_default());
                let offloads = port.offloads();
                let out = OnceLock::new();
                if let Some(why) = gone.remove(&name) {
                    let _ = out.set(why);
                }
                Slot {
                    queues: std::iter::once(port).chain(more).map(Mutex::new).collect(),
                    offloads,
                    coalesce: offloads && t.gso,
                    pod: t.kind == PortKind::Pod,
                    gone: out,
                    name,
                }
            })
            .collect();
        Layout { version: 0, slots }
    }

    /// The ports (queue 0 of each), their further queues by name, and why those out of
    /// service are.
    fn split(self) -> (Vec<NamedPort>, Queues, Gone) {
        let mut ports = Vec::with_capacity(self.slots.len());
        let mut queues = HashMap::new();
        let mut gone = HashMap::new();
        for mut s in self.slots {
            if let Some(why) = s.gone.take() {
                gone.insert(s.name.clone(), why);
            }
            let mut q = s
                .queues
                .into_iter()
                .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()));
            if let Some(first) = q.next() {
                ports.push((s.name.clone(), first));
            }
            let rest: Vec<_> = q.collect();
            if !rest.is_empty() {
                queues.insert(s.name, rest);
            }
        }
        (ports, queues, gone)
    }

    /// The ports, without their further queues (which are closed).
    fn into_ports(self) -> Vec<NamedPort> {
        self.split().0
    }

    fn names(&self) -> Vec<&str> {
        self.slots.iter().map(|s| s.name.as_str()).collect()
    }
}

/// A worker's own state, rebuilt when the ports change.
struct Local {
    /// The [`Layout::version`] it was built for.
    version: u64,
    /// The descriptors this worker receives from, then (worker 0) the control's wake
    /// descriptor.
    pfds: Vec<libc::pollfd>,
    /// Port and queue of each descriptor in `pfds` (but the wake one).
    polled: Vec<(usize, usize)>,
    /// Receive errors in a row, per polled queue.
    failing: Vec<u32>,
    /// Packets to send, per egress port.
    tx: Vec<Vec<Packet>>,
}

impl Local {
    fn new(layout: &Layout, w: usize, workers: usize, control: Option<&Control>) -> Local {
        let mut polled = Vec::new();
        for (i, s) in layout.slots.iter().enumerate() {
            for q in 0..s.queues.len() {
                if s.owner(i, q, workers) == w {
                    polled.push((i, q));
                }
            }
        }
        let fds: Vec<RawFd> = polled
            .iter()
            .map(|&(i, q)| lock(&layout.slots[i].queues[q]).raw_fd())
            .chain(control.and_then(Control::wake_fd))
            .collect();
        Local {
            version: layout.version,
            pfds: fds
                .into_iter()
                .map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect(),
            failing: vec![0; polled.len()],
            polled,
            tx: layout.slots.iter().map(|_| Vec::new()).collect(),
        }
    }
}

/// Marks the workers as leaving when one leaves, also on a panic.
struct Leave<'a>(&'a AtomicBool);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Buffers a worker reuses from round to round.
#[derive(Default)]
struct Buffers {
    rx: Vec<Frame>,
    received: Vec<(usize, Frame)>,
    out: Vec<(PortId, Packet)>,
    frames: Vec<Frame>,
}

/// Worker `w`'s loop; worker 0 also serves `control` between its rounds.
fn work(
    sh: &Shared<'_>,
    w: usize,
    stop: &AtomicBool,
    clock: &(impl Fn() -> u64 + Sync),
    control: Option<&Control>,
) {
    let _leave = Leave(&sh.leave);
    if let Some(&cpu) = sh.cpus.get(w % sh.cpus.len().max(1))
        && let Err(e) = crate::cpu::pin_current_thread(cpu)
    {
        sh.fail(io::Error::new(
            e.kind(),
            format!("pinning worker {w} to CPU {cpu}: {e}"),
        ));
        return;
    }
    let mut local = Local::new(&read(&sh.layout), w, sh.workers, control);
    let mut bufs = Buffers::default();
    let mut trace = Trace::disabled();
    let mut stats = WorkerStats::default();
    let mut published = clock();
    if let Some(c) = control {
        publish(c, published, &read(&sh.layout), &mut lock(&sh.core));
    }
    // Busy polling: polls without sleeping until then.
    let mut busy_until: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) && !sh.leave.load(Ordering::Relaxed) {
        stats.rounds += 1;
        for p in &mut local.pfds {
            p.revents = 0;
        }
        let timeout = match busy_until {
            Some(t) if Instant::now() < t => {
                stats.busy_rounds += 1;
                0
            }
            _ => POLL_TIMEOUT_MS,
        };
        // SAFETY: `local.pfds` is a live, exclusively borrowed array of `pfds.len()`
        // pollfds. A descriptor closed meanwhile (its port let go by an update) is
        // reported as POLLNVAL, and the round then sees the new layout version.
        let rc = unsafe {
            libc::poll(
                local.pfds.as_mut_ptr(),
                local.pfds.len() as libc::nfds_t,
                timeout,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                sh.fail(e);
                break;
            }
        }
        if rc == 0 && timeout == 0 {
            // Busy polling, and nothing came: let whatever else waits for this core run
            // (a pod's thread this worker's next frame may depend on), then poll again.
            thread::yield_now();
            continue;
        }
        if let Some(c) = control
            && local
                .pfds
                .get(local.polled.len())
                .is_some_and(|p| p.revents != 0)
        {
            c.clear_wake();
        }
        {
            let layout = read(&sh.layout);
            if layout.version != local.version {
                // The ports changed while this worker polled the old ones.
                local = Local::new(&layout, w, sh.workers, control);
                continue;
            }
            let received = stats.rx_frames;
            if let Err(e) = round(
                sh, &layout, &mut local, w, clock, &mut bufs, &mut trace, &mut stats,
            ) {
                sh.fail(e);
                break;
            }
            if !sh.busy_poll.is_zero() && stats.rx_frames != received {
                busy_until = Some(Instant::now() + sh.busy_poll);
            }
        }
        if let Some(c) = control {
            serve(sh, c, clock, &mut stats, &mut published);
            let layout = read(&sh.layout);
            if layout.version != local.version {
                local = Local::new(&layout, w, sh.workers, control);
            }
        }
    }
    lock(&sh.core).stats[w] = stats;
}

/// One round of worker `w` after poll: receives from its ready queues, runs the frames
/// through the pipeline, sends what came out.
#[allow(clippy::too_many_arguments)]
fn round(
    sh: &Shared<'_>,
    layout: &Layout,
    local: &mut Local,
    w: usize,
    clock: &(impl Fn() -> u64 + Sync),
    bufs: &mut Buffers,
    trace: &mut Trace,
    stats: &mut WorkerStats,
) -> io::Result<()> {
    for (j, &(i, q)) in local.polled.iter().enumerate() {
        let revents = local.pfds[j].revents;
        if revents == 0 {
            continue;
        }
        let slot = &layout.slots[i];
        let mut port = lock(&slot.queues[q]);
        // A device that went away (its namespace deleted, the TAP closed) makes poll
        // return at once forever: a pod's port is taken out of service (below), any
        // other stops the workers instead of spinning.
        let hangup = revents & libc::POLLHUP != 0;
        if revents & libc::POLLNVAL != 0 || (hangup && !slot.pod) {
            return Err(io::Error::other(format!(
                "port {}: the device is gone",
                port.name()
            )));
        }
        let r = if hangup {
            Err(io::Error::other("the device hung up"))
        } else {
            port.recv_batch(&mut bufs.rx, RX_BATCH)
        };
        match r {
            Ok(n) => {
                stats.rx_frames += n as u64;
                local.failing[j] = 0;
            }
            Err(e) if slot.pod && (hangup || device_gone(&e)) => {
                stats.rx_errors += 1;
                take_out_of_service(slot, &mut port, &e, stats);
                // Poll ignores a negative descriptor; the one polled is closed.
                local.pfds[j].fd = -1;
                local.failing[j] = 0;
            }
            // Another port that found its device deleted says so for good (`NotFound`).
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // It names its device and says it is gone.
                return Err(e);
            }
            Err(e) => {
                stats.rx_errors += 1;
                local.failing[j] += 1;
                if local.failing[j] >= MAX_FAILING_ROUNDS {
                    return Err(io::Error::new(
                        e.kind(),
                        format!(
                            "port {}: {MAX_FAILING_ROUNDS} receive errors in a row, last: {e}",
                            port.name()
                        ),
                    ));
                }
            }
        }
        drop(port);
        bufs.received.extend(bufs.rx.drain(..).map(|f| (i, f)));
    }
    {
        let mut core = lock(&sh.core);
        let now = clock();
        let Core { pipeline, taps, .. } = &mut *core;
        let pkts = bufs.received.drain(..).map(|(i, f)| {
            let mut pkt = Packet::new(f.data, i as PortId, now);
            pkt.meta.vnet = if layout.slots[i].offloads {
                f.vnet
            } else {
                VnetHdr::default()
            };
            pkt
        });
        if taps.active() {
            for pkt in pkts {
                taps.process(pipeline, pkt, &mut bufs.out, now);
            }
        } else {
            pipeline.process_batch(pkts, &mut bufs.out, trace);
        }
        pipeline.tick(now, &mut bufs.out);
        core.stats[w] = *stats;
    }
    for (egress, pkt) in bufs.out.drain(..) {
        // The pipeline only names ports of its tables, which are the layout's.
        local.tx[usize::from(egress)].push(pkt);
    }
    for (slot, q) in layout.slots.iter().zip(&mut local.tx) {
        if q.is_empty() {
            continue;
        }
        if slot.gone.get().is_some() {
            // Out of service: what the pipeline routed to it goes nowhere.
            stats.tx_dropped += q.len() as u64;
            q.clear();
            continue;
        }
        if slot.coalesce {
            let before = q.len();
            gro::coalesce(q);
            stats.gro_merged += (before - q.len()) as u64;
        }
        bufs.frames.clear();
        bufs.frames.extend(q.drain(..).map(|pkt| Frame {
            data: pkt.data,
            vnet: pkt.meta.vnet,
        }));
        let mut port = lock(&slot.queues[slot.tx_queue(w)]);
        match port.send_batch(&mut bufs.frames) {
            Ok(n) => stats.tx_frames += n as u64,
            // A port that found its device deleted, as on receiving: nothing would wake
            // its receive side again.
            Err(e) if e.kind() == io::ErrorKind::NotFound && !slot.pod => {
                // It names its device and says it is gone.
                return Err(e);
            }
            Err(_) => stats.tx_errors += 1,
        }
        stats.tx_dropped += bufs.frames.len() as u64;
    }
    Ok(())
}

/// Whether a port's receive error says that its device is gone: what a TAP returns once
/// its network namespace is deleted (`EBADFD`; poll reports `POLLERR`), or once the
/// device is unregistered (`ENODEV`, `ENXIO`, `EIO`), or a port's own error of kind
/// `NotFound` (an AF_PACKET port whose device was deleted).
fn device_gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || matches!(
            e.raw_os_error(),
            Some(libc::EBADFD | libc::ENODEV | libc::ENXIO | libc::EIO)
        )
}

/// Takes a pod's port out of service because its device is gone (`why`): the queue
/// `port` (locked) is closed, a [`GonePort`] takes its place, and the first queue of the
/// port to go counts and reports it. The port's other queues go the same way when their
/// workers find them gone; until then nothing is sent through them.
fn take_out_of_service(
    slot: &Slot,
    port: &mut Box<dyn Port>,
    why: &io::Error,
    stats: &mut WorkerStats,
) {
    let gone = Box::new(GonePort {
        name: port.name().to_string(),
        offloads: port.offloads(),
        counters: port.counters(),
    });
    // Dropping the old port closes its descriptor; the device is gone already, so this
    // does not wait on anything.
    drop(std::mem::replace(port, gone));
    if slot.gone.set(why.to_string()).is_ok() {
        stats.ports_gone += 1;
        eprintln!(
            "ferry: worker: port {} ({}): the device is gone ({why}); port taken out of \
             service, the packets routed to it are dropped",
            slot.name,
            port.name()
        );
    }
}

/// Worker 0's work for `control` between two rounds: updates, jobs, counters.
fn serve(
    sh: &Shared<'_>,
    control: &Control,
    clock: &(impl Fn() -> u64 + Sync),
    stats: &mut WorkerStats,
    published: &mut u64,
) {
    if control.pending() {
        // Waits for the other workers' rounds to end: then no packet holds a PortId of
        // the old tables.
        let mut layout = write(&sh.layout);
        if let Some((update, sent)) = control.take() {
            let begun = Instant::now();
            let mut core = lock(&sh.core);
            let r = apply(&mut layout, &mut core, update);
            let now = clock();
            if r.is_ok() {
                let Core { pipeline, taps, .. } = &mut *core;
                taps.set_ports(layout.names().into_iter(), pipeline.tables());
                stats.updates += 1;
                core.stats[0] = *stats;
                publish(control, now, &layout, &mut core);
                *published = now;
            } else {
                stats.updates_refused += 1;
            }
            let done = Instant::now();
            control.answer(r.map(|(report, closed)| Applied {
                report,
                waited: done - sent,
                paused: done - begun,
                closed,
            }));
        }
    }
    if control.jobs_waiting() {
        // An exclusive job waits, as an update does, for the other workers' rounds to
        // end, and holds them at the start of their next.
        let exclusive = control.exclusive_waiting();
        let (shared, held);
        let layout: &Layout = if exclusive {
            held = write(&sh.layout);
            &held
        } else {
            shared = read(&sh.layout);
            &shared
        };
        let mut core = lock(&sh.core);
        let Core { pipeline, taps, .. } = &mut *core;
        let mut view = WorkerView {
            pipeline,
            taps,
            ports: layout.names(),
            now_ns: clock(),
            slots: &layout.slots,
            exclusive,
        };
        control.run_jobs(&mut view);
    }
    let now = clock();
    if now.wrapping_sub(*published) >= STATS_INTERVAL_NS {
        let layout = read(&sh.layout);
        let mut core = lock(&sh.core);
        core.stats[0] = *stats;
        publish(control, now, &layout, &mut core);
        *published = now;
    }
}

/// Applies an update, or refuses it having changed nothing. Returns the pipeline's report
/// and the ports let go (their further queues are closed).
fn apply(
    layout: &mut Layout,
    core: &mut Core<'_>,
    mut update: Update,
) -> Result<(SwapReport, Vec<NamedPort>), UpdateError> {
    let existing: Vec<(&str, &dyn Port)> = layout
        .slots
        .iter_mut()
        .filter_map(|s| {
            let p = s.queues.first_mut()?;
            Some((
                s.name.as_str(),
                &**p.get_mut().unwrap_or_else(|e| e.into_inner()),
            ))
        })
        .collect();
    if let Err(reason) = plan(&existing, &update.new_ports, &update.tables) {
        return Err(UpdateError::Refused { reason, update });
    }
    let version = layout.version;
    let (ports, mut queues, mut gone) = std::mem::replace(
        layout,
        Layout {
            version,
            slots: Vec::new(),
        },
    )
    .split();
    // A port given anew brings its own queues, and is in service; the old one's queues
    // go with it.
    for (name, _) in &update.new_ports {
        queues.remove(name);
        gone.remove(name);
    }
    let (ports, closed) = arrange(ports, std::mem::take(&mut update.new_ports), &update.tables);
    *layout = Layout::new(ports, &mut queues, &mut gone, &update.tables);
    layout.version = version.wrapping_add(1);
    let report = core.pipeline.set_tables(update.tables);
    Ok((report, closed))
}

/// Checks that `existing` ports (already named after the tables') with `new` ones (which
/// replace existing ones of the same name) give every port of `tables` exactly one Linux
/// port that can take what the tables say; the error names what is wrong.
fn plan(existing: &[(&str, &dyn Port)], new: &[NamedPort], tables: &Tables) -> Result<(), String> {
    if tables.ports.len() > usize::from(PortId::MAX) {
        return Err(format!(
            "the tables have {} ports, at most {} are supported",
            tables.ports.len(),
            PortId::MAX
        ));
    }
    let mut by_name: HashMap<&str, &dyn Port> = existing.iter().copied().collect();
    let mut given = HashSet::new();
    for (name, p) in new {
        if !given.insert(name.as_str()) {
            return Err(format!("port {name:?} is given twice"));
        }
        if tables.port_id(name).is_none() {
            return Err(format!("port {name:?} is not in the tables"));
        }
        by_name.insert(name, p.as_ref());
    }
    let mut missing = Vec::new();
    for t in &tables.ports {
        match by_name.get(t.name.as_str()) {
            None => missing.push(format!("{:?}", t.name)),
            Some(p) if t.gso && !p.offloads() => {
                return Err(format!(
                    "port {:?}: the tables say gso: true but {} does not pass GSO packets",
                    t.name,
                    p.name()
                ));
            }
            Some(_) => {}
        }
    }
    if !missing.is_empty() {
        return Err(format!(
            "the tables name ports that have no Linux port: {}",
            missing.join(", ")
        ));
    }
    Ok(())
}

/// Puts the ports in table order (after [`plan`] accepted them): a new port wins over an
/// existing one of the same name. Returns the ports and those let go.
fn arrange(
    existing: Vec<NamedPort>,
    new: Vec<NamedPort>,
    tables: &Tables,
) -> (Vec<NamedPort>, Vec<NamedPort>) {
    let mut old: Vec<Option<NamedPort>> = existing.into_iter().map(Some).collect();
    let old_ids: HashMap<String, usize> = old
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.as_ref().map(|(n, _)| (n.clone(), i)))
        .collect();
    let mut new: HashMap<String, Box<dyn Port>> = new.into_iter().collect();
    let mut closed = Vec::new();
    let mut ports = Vec::with_capacity(tables.ports.len());
    for t in &tables.ports {
        let prev = old_ids.get(&t.name).and_then(|&i| old[i].take());
        let port = match (new.remove(&t.name), prev) {
            (Some(p), prev) => {
                closed.extend(prev);
                p
            }
            (None, Some((_, p))) => p,
            // Ruled out by plan().
            (None, None) => continue,
        };
        ports.push((t.name.clone(), port));
    }
    // Ports gone from the tables, in their former order, then the replaced ones.
    let mut rest: Vec<NamedPort> = old.into_iter().flatten().collect();
    rest.extend(closed);
    (ports, rest)
}

/// Publishes the counters of the workers, the pipeline and the ports (each summed over
/// its queues), and hands over the denials recorded for the audit log.
fn publish(control: &Control, now: u64, layout: &Layout, core: &mut Core<'_>) {
    control.hand_denials(core.pipeline);
    let pipeline = &*core.pipeline;
    control.publish(Snapshot {
        time_ns: now,
        worker: core.total(),
        workers: core.stats.clone(),
        pipeline: *pipeline.stats(),
        drops: pipeline.drops().clone(),
        conntrack: *pipeline.conntrack().stats(),
        ct_entries: pipeline.conntrack().len(),
        reassembly: *pipeline.reassembler().stats(),
        policies: pipeline
            .policy_counts()
            .map(|(n, c)| (n.to_string(), c))
            .collect(),
        source_denied: pipeline
            .source_denied_counts()
            .map(|(n, c)| (n.to_string(), c))
            .collect(),
        ports: layout
            .slots
            .iter()
            .zip(pipeline.port_stats())
            .zip(pipeline.port_drops())
            .map(|((slot, s), d)| {
                let mut linux = PortCounters::default();
                for q in &slot.queues {
                    linux.add(&lock(q).counters());
                }
                PortSnapshot {
                    name: slot.name.clone(),
                    pipeline: *s,
                    linux,
                    drops: d.clone(),
                    gone: slot.gone.get().cloned(),
                }
            })
            .collect(),
    });
}

/// Stands in for a pod's port taken out of service (its device gone): polled never,
/// receives nothing, takes nothing. It keeps the port's name, its offloads (so that
/// updates that keep the port still fit it) and its counts.
struct GonePort {
    name: String,
    offloads: bool,
    counters: PortCounters,
}

impl GonePort {
    /// Stands in for a port that [`run_worker`] moved out of its caller's slice for the
    /// run: no name, no counts.
    fn vacant() -> GonePort {
        GonePort {
            name: String::new(),
            offloads: false,
            counters: PortCounters::default(),
        }
    }
}

impl Port for GonePort {
    fn name(&self) -> &str {
        &self.name
    }
    fn raw_fd(&self) -> RawFd {
        -1
    }
    fn recv_batch(&mut self, _: &mut Vec<Frame>, _: usize) -> io::Result<usize> {
        Ok(0)
    }
    fn send_batch(&mut self, _: &mut Vec<Frame>) -> io::Result<usize> {
        Ok(0)
    }
    fn offloads(&self) -> bool {
        self.offloads
    }
    fn counters(&self) -> PortCounters {
        self.counters
    }
}
