//! The control plane's handle on a running worker: table and port updates in, counters
//! out.
//!
//! The worker looks at one atomic flag per round and takes the lock only when an update
//! is waiting, so the packet path never takes a lock. Counters go the other way as an
//! `Arc` snapshot that the worker replaces every [`super::STATS_INTERVAL_NS`] (and after
//! an update, and when it stops): a reader clones the `Arc` and never holds up the worker
//! for longer than that clone. With the counters go the denials the pipeline recorded
//! for the audit log ([`Control::take_denials`]), into a bounded queue.

use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferry_datapath::{
    Denial, DropCounters, Pipeline, PipelineStats, PortStats, SwapReport, Tables, conntrack, ipf,
};

use super::{NamedPort, Taps, WorkerStats};
use crate::port::PortCounters;

/// New tables for a running worker, and the Linux ports of the tables' new ports.
pub struct Update {
    /// The tables to switch to.
    pub tables: Arc<Tables>,
    /// Ports to add, each with the name of its port in `tables`. A name the worker
    /// already has replaces that port (the old one is handed back in
    /// [`Applied::closed`]). Every port of `tables` must be here or already in the
    /// worker.
    pub new_ports: Vec<NamedPort>,
}

impl fmt::Debug for Update {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Update")
            .field("tables_ports", &self.tables.ports.len())
            .field(
                "new_ports",
                &self.new_ports.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// What an applied update did.
pub struct Applied {
    /// What the pipeline kept and dropped.
    pub report: SwapReport,
    /// From [`Control::send`] to the update in force: the rest of the worker's current
    /// round (an idle worker is woken at once) plus `paused`.
    pub waited: Duration,
    /// How long the worker stopped forwarding to apply it.
    pub paused: Duration,
    /// Ports the worker let go: those whose names the new tables dropped, and those
    /// replaced by a new port of the same name. Dropping them closes them (a pod's TAP
    /// disappears); that is left to the caller so that the worker never waits for it.
    pub closed: Vec<NamedPort>,
}

impl fmt::Debug for Applied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Applied")
            .field("report", &self.report)
            .field("waited", &self.waited)
            .field("paused", &self.paused)
            .field(
                "closed",
                &self.closed.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Why an update did not happen. In every case the worker changed nothing, and the
/// update (with its ports) is handed back, except after [`UpdateError::Aborted`].
#[derive(Debug)]
pub enum UpdateError {
    /// The update does not fit the worker: a port of the tables has no Linux port, a new
    /// port is not in the tables or is given twice, a port cannot take what the tables
    /// say it takes, or there are too many ports.
    Refused {
        /// What is wrong, naming the ports.
        reason: String,
        /// The update.
        update: Update,
    },
    /// No worker took the update within the timeout; it was withdrawn.
    TimedOut(Update),
    /// The worker stopped before it took the update.
    Stopped(Update),
    /// The worker stopped while applying the update (it panicked): its state is unknown.
    Aborted,
}

impl UpdateError {
    /// The update, to retry or drop, when there is one.
    pub fn into_update(self) -> Option<Update> {
        match self {
            UpdateError::Refused { update, .. }
            | UpdateError::TimedOut(update)
            | UpdateError::Stopped(update) => Some(update),
            UpdateError::Aborted => None,
        }
    }
}

impl fmt::Display for UpdateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpdateError::Refused { reason, .. } => write!(f, "update refused: {reason}"),
            UpdateError::TimedOut(_) => write!(f, "no worker took the update in time"),
            UpdateError::Stopped(_) => write!(f, "the worker is not running"),
            UpdateError::Aborted => write!(f, "the worker stopped while applying the update"),
        }
    }
}

impl std::error::Error for UpdateError {}

/// One port's counters in a [`Snapshot`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortSnapshot {
    /// The port's name in the tables.
    pub name: String,
    /// What the pipeline counted for it.
    pub pipeline: PortStats,
    /// What the Linux port counted.
    pub linux: PortCounters,
    /// Packets received on the port that the pipeline dropped, by reason.
    pub drops: DropCounters,
    /// Set when the port is out of service because its device went away (a pod's
    /// namespace deleted): why, as the worker found it.
    pub gone: Option<String>,
}

/// What a running worker and its pipeline had counted at `time_ns`.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The pipeline's clock when it was taken.
    pub time_ns: u64,
    /// The workers' counts, summed.
    pub worker: WorkerStats,
    /// Each worker's counts, by worker number (one entry per worker thread).
    pub workers: Vec<WorkerStats>,
    /// Pipeline counters.
    pub pipeline: PipelineStats,
    /// Drops per reason.
    pub drops: DropCounters,
    /// Conntrack counters.
    pub conntrack: conntrack::Stats,
    /// Connections tracked.
    pub ct_entries: usize,
    /// Fragment reassembly counters.
    pub reassembly: ipf::Stats,
    /// Per port, in table order.
    pub ports: Vec<PortSnapshot>,
    /// New connections decided per policy, by policy name.
    pub policies: Vec<(String, ferry_datapath::PolicyCount)>,
    /// New connections refused by a Service port's source ranges, by its name.
    pub source_denied: Vec<(String, u64)>,
}

/// What a job sees of the worker: its pipeline (tables, connections, counters), the
/// taps that trace and capture live packets, and the names of its ports in table order.
pub struct WorkerView<'a> {
    /// The pipeline.
    pub pipeline: &'a mut Pipeline,
    /// Live tracing and capture.
    pub taps: &'a mut Taps,
    /// The ports' names, in table order (index = `PortId`).
    pub ports: Vec<&'a str>,
    /// The pipeline's clock now.
    pub now_ns: u64,
    /// The ports with their queues, in table order.
    pub(super) slots: &'a [super::Slot],
    /// The other workers are held between two rounds ([`Control::run_exclusive`]).
    pub(super) exclusive: bool,
}

impl WorkerView<'_> {
    /// Copies of the descriptors of every port that can be handed over to another
    /// process ([`crate::handover`]), with what each is: per port of the tables in
    /// service whose first queue can be handed over, its name and its queues in order.
    /// Only in a job run with [`Control::run_exclusive`], where no other worker reads
    /// a port meanwhile; else an error.
    pub fn handover_ports(&self) -> std::io::Result<Vec<HandedPort>> {
        if !self.exclusive {
            return Err(std::io::Error::other(
                "ports are handed over only while the workers are held",
            ));
        }
        let mut out = Vec::new();
        for s in self.slots {
            if s.gone.get().is_some() {
                continue;
            }
            let mut queues = Vec::with_capacity(s.queues.len());
            for q in &s.queues {
                let port = lock(q);
                let Some((h, fd)) = port.handover() else {
                    break;
                };
                queues.push((h, fd.try_clone_to_owned()?));
            }
            if queues.len() == s.queues.len() {
                out.push(HandedPort {
                    name: s.name.clone(),
                    queues,
                });
            }
        }
        Ok(out)
    }
}

/// A port of the tables handed over: its name and its queues' descriptors, in order
/// ([`WorkerView::handover_ports`]; [`crate::handover::adopt`] makes it again).
#[derive(Debug)]
pub struct HandedPort {
    /// The tables' name of the port.
    pub name: String,
    /// Each queue: what it is, and a descriptor of this process for it.
    pub queues: Vec<(crate::handover::Handed, OwnedFd)>,
}

/// Work for the worker to run between two rounds on its own state.
type Job = Box<dyn FnOnce(&mut WorkerView<'_>) + Send>;

/// Why a job did not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobError {
    /// No worker is running.
    Stopped,
    /// The worker did not get to it in time; it may still run later (its result is then
    /// dropped).
    TimedOut,
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobError::Stopped => f.write_str("the worker is not running"),
            JobError::TimedOut => f.write_str("the worker did not answer in time"),
        }
    }
}

impl std::error::Error for JobError {}

/// An update on its way to the worker and the answer on its way back.
#[derive(Default)]
struct State {
    /// A worker is attached.
    running: bool,
    /// The last attached worker returned (nothing will take updates until another
    /// attaches).
    stopped: bool,
    /// The update waiting for the worker, and when it was sent.
    queued: Option<(Update, Instant)>,
    /// The worker is applying the update.
    taken: bool,
    /// The worker's answer.
    done: Option<Result<Applied, UpdateError>>,
}

/// Shared between a running worker and the control plane (in an `Arc`): see the module
/// documentation.
pub struct Control {
    /// An update is queued: the only thing the worker reads each round.
    pending: AtomicBool,
    state: Mutex<State>,
    changed: Condvar,
    /// One update at a time.
    senders: Mutex<()>,
    snapshot: Mutex<Arc<Snapshot>>,
    /// Jobs are queued: the worker's other per-round check.
    jobs_waiting: AtomicBool,
    jobs: Mutex<Vec<Job>>,
    /// Jobs that hold the other workers while they run ([`Control::run_exclusive`]),
    /// queued with the others (`jobs_waiting` says so for both).
    exclusive: Mutex<Vec<Job>>,
    /// Denials taken from the pipeline for the audit log, at most [`DENIAL_QUEUE`].
    denials: Mutex<Vec<Denial>>,
    /// An eventfd the worker polls with its ports, so that an update wakes an idle
    /// worker at once instead of after its poll timeout (None if the kernel refused one:
    /// then the timeout bounds the wait).
    wake: Option<OwnedFd>,
}

impl Default for Control {
    fn default() -> Self {
        Control::new()
    }
}

/// Locks `m`, going on after a panic elsewhere: the state stays consistent because
/// every holder leaves it so before anything can panic.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Control {
    /// A control for a worker that is not running yet.
    pub fn new() -> Control {
        Control {
            pending: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            senders: Mutex::new(()),
            snapshot: Mutex::new(Arc::new(Snapshot::default())),
            jobs_waiting: AtomicBool::new(false),
            jobs: Mutex::new(Vec::new()),
            exclusive: Mutex::new(Vec::new()),
            denials: Mutex::new(Vec::new()),
            wake: new_eventfd(),
        }
    }

    /// The descriptor that becomes readable when an update is queued.
    pub(super) fn wake_fd(&self) -> Option<RawFd> {
        self.wake.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Resets the wake descriptor (after poll said it was readable).
    pub(super) fn clear_wake(&self) {
        if let Some(fd) = &self.wake {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into a live u64 from an eventfd this Control owns;
            // non-blocking, so an already cleared counter returns EAGAIN, which is fine.
            unsafe {
                libc::read(fd.as_raw_fd(), (&raw mut v).cast(), 8);
            }
        }
    }

    fn ring_wake(&self) {
        if let Some(fd) = &self.wake {
            let v = 1u64;
            // SAFETY: writes 8 bytes from a live u64 to an eventfd this Control owns.
            unsafe {
                libc::write(fd.as_raw_fd(), (&raw const v).cast(), 8);
            }
        }
    }

    /// Hands `update` to the worker and waits until it is in force, refused, or not
    /// taken within `timeout` (then withdrawn). Once the worker has taken an update it
    /// always answers (applying is bounded work), so the wait can outlast `timeout` by
    /// the time the worker takes to apply it. Concurrent calls go one at a time.
    pub fn send(&self, update: Update, timeout: Duration) -> Result<Applied, UpdateError> {
        let _one = lock(&self.senders);
        // A timeout too large for the clock is as good as a day.
        let deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
        let mut st = lock(&self.state);
        if st.stopped {
            return Err(UpdateError::Stopped(update));
        }
        st.done = None;
        st.queued = Some((update, Instant::now()));
        self.pending.store(true, Ordering::Release);
        self.ring_wake();
        loop {
            if let Some(r) = st.done.take() {
                return r;
            }
            if st.taken {
                if st.stopped {
                    st.taken = false;
                    return Err(UpdateError::Aborted);
                }
                st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let now = Instant::now();
            if st.stopped || now >= deadline {
                self.pending.store(false, Ordering::Relaxed);
                let stopped = st.stopped;
                let Some((u, _)) = st.queued.take() else {
                    // Unreachable: only the worker takes it, and then sets `taken`.
                    return Err(UpdateError::Aborted);
                };
                return Err(if stopped {
                    UpdateError::Stopped(u)
                } else {
                    UpdateError::TimedOut(u)
                });
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Runs `f` in the worker thread between two rounds, on the worker's own state (the
    /// connection table lives there), and returns what it returns. Jobs are control-plane
    /// work: they hold up forwarding while they run, so they should be bounded (a scan of
    /// the connection table is the most they should do). An idle worker is woken at
    /// once; a busy one takes the job at the end of its current round.
    pub fn run<R: Send + 'static>(
        &self,
        timeout: Duration,
        f: impl FnOnce(&mut WorkerView<'_>) -> R + Send + 'static,
    ) -> Result<R, JobError> {
        self.queue_job(timeout, false, f)
    }

    /// [`Control::run`], holding every worker between two rounds while `f` runs: no
    /// port is read and no packet is in a worker's hands meanwhile, as for an update.
    /// What the pipeline holds when `f` starts is all the workers have; what arrives
    /// meanwhile waits in the ports' kernel queues. A job may wait there (to hold
    /// forwarding while another process takes over), but only for a bounded time.
    pub fn run_exclusive<R: Send + 'static>(
        &self,
        timeout: Duration,
        f: impl FnOnce(&mut WorkerView<'_>) -> R + Send + 'static,
    ) -> Result<R, JobError> {
        self.queue_job(timeout, true, f)
    }

    fn queue_job<R: Send + 'static>(
        &self,
        timeout: Duration,
        exclusive: bool,
        f: impl FnOnce(&mut WorkerView<'_>) -> R + Send + 'static,
    ) -> Result<R, JobError> {
        let (tx, rx) = mpsc::sync_channel(1);
        {
            // Checked under the jobs lock, which detach() also takes: a job queued here
            // is either run or dropped (closing its channel) by the worker's way out.
            let mut jobs = lock(&self.jobs);
            if !lock(&self.state).running {
                return Err(JobError::Stopped);
            }
            let job: Job = Box::new(move |w: &mut WorkerView<'_>| {
                let _ = tx.send(f(w));
            });
            if exclusive {
                lock(&self.exclusive).push(job);
            } else {
                jobs.push(job);
            }
            self.jobs_waiting.store(true, Ordering::Release);
        }
        self.ring_wake();
        match rx.recv_timeout(timeout) {
            Ok(r) => Ok(r),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(JobError::TimedOut),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(JobError::Stopped),
        }
    }

    /// True when jobs wait: one atomic load, the worker's per-round check.
    #[inline]
    pub(super) fn jobs_waiting(&self) -> bool {
        self.jobs_waiting.load(Ordering::Acquire)
    }

    /// True when a queued job must hold the other workers ([`Control::run_exclusive`]).
    pub(super) fn exclusive_waiting(&self) -> bool {
        !lock(&self.exclusive).is_empty()
    }

    /// Runs the queued jobs on `view`: all of them when the view holds the other
    /// workers, else those that do not need to (the others stay queued).
    pub(super) fn run_jobs(&self, view: &mut WorkerView<'_>) {
        let (jobs, exclusive) = {
            let mut q = lock(&self.jobs);
            let mut x = lock(&self.exclusive);
            let exclusive = if view.exclusive {
                std::mem::take(&mut *x)
            } else {
                Vec::new()
            };
            self.jobs_waiting.store(!x.is_empty(), Ordering::Relaxed);
            (std::mem::take(&mut *q), exclusive)
        };
        for job in jobs.into_iter().chain(exclusive) {
            job(view);
        }
    }

    /// The latest counters the worker published.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        Arc::clone(&lock(&self.snapshot))
    }

    /// True while a worker runs with this control.
    pub fn is_running(&self) -> bool {
        lock(&self.state).running
    }

    /// Marks a worker as attached; false when one already is.
    pub(super) fn attach(&self) -> bool {
        let mut st = lock(&self.state);
        if st.running {
            return false;
        }
        st.running = true;
        st.stopped = false;
        true
    }

    /// Marks the worker as gone: a queued update is answered, a sender waiting for one
    /// being applied is woken. Runs on the worker's way out, panics included.
    pub(super) fn detach(&self) {
        // Jobs nobody will run: dropping them tells their callers the worker stopped.
        let mut jobs = lock(&self.jobs);
        jobs.clear();
        lock(&self.exclusive).clear();
        self.jobs_waiting.store(false, Ordering::Relaxed);
        let mut st = lock(&self.state);
        st.running = false;
        st.stopped = true;
        if let Some((u, _)) = st.queued.take() {
            st.done = Some(Err(UpdateError::Stopped(u)));
        }
        self.pending.store(false, Ordering::Relaxed);
        self.changed.notify_all();
    }

    /// True when an update waits: one atomic load, the worker's per-round check.
    #[inline]
    pub(super) fn pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Takes the queued update, if any, and when it was sent.
    pub(super) fn take(&self) -> Option<(Update, Instant)> {
        let mut st = lock(&self.state);
        self.pending.store(false, Ordering::Relaxed);
        let q = st.queued.take();
        st.taken = q.is_some();
        q
    }

    /// Answers the update taken last.
    pub(super) fn answer(&self, r: Result<Applied, UpdateError>) {
        let mut st = lock(&self.state);
        st.taken = false;
        st.done = Some(r);
        self.changed.notify_all();
    }

    /// Replaces the published counters.
    pub(super) fn publish(&self, s: Snapshot) {
        *lock(&self.snapshot) = Arc::new(s);
    }

    /// Moves the denials the pipeline recorded for the audit log into the queue, as
    /// many as it has room for: the rest wait in the pipeline, whose buffer counts what
    /// it cannot hold ([`PipelineStats::audit_overflow`]).
    pub(super) fn hand_denials(&self, pipeline: &mut Pipeline) {
        if !pipeline.audits_denials() {
            return;
        }
        let mut q = lock(&self.denials);
        let room = DENIAL_QUEUE.saturating_sub(q.len());
        pipeline.take_denials(room, &mut q);
    }

    /// Moves the denials the worker handed over (with its counters, every
    /// [`super::STATS_INTERVAL_NS`]), oldest first, to the end of `out`. Only a pipeline
    /// with the audit on records them ([`Pipeline::audit_denials`]).
    pub fn take_denials(&self, out: &mut Vec<Denial>) {
        out.append(&mut lock(&self.denials));
    }
}

/// The denials a [`Control`] holds at most for the audit log between two
/// [`Control::take_denials`].
pub const DENIAL_QUEUE: usize = ferry_datapath::DEFAULT_AUDIT_BUFFER;

/// Detaches the worker from its control when dropped, also on a panic.
pub(super) struct Attached<'a>(pub(super) &'a Control);

impl Drop for Attached<'_> {
    fn drop(&mut self) {
        self.0.detach();
    }
}

fn new_eventfd() -> Option<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a negative result is an error, handled.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    // SAFETY: a non-negative fd just returned by eventfd is ours alone.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}
