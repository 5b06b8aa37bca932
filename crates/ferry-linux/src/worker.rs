//! The worker loop: ports in, pipeline, ports out.
//!
//! One worker owns a set of ports and one [`Pipeline`]. Each round it polls the ports'
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
//! ([`Control::snapshot`]), for status and metrics.
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
//! support the advice is dropped.
//!
//! **Packet buffer memory.** Packets are heap buffers of up to 64 KiB, allocated and
//! freed at a high rate; the worker tells the C allocator to keep freed memory for reuse
//! ([`crate::memory::retain_freed_heap`]) instead of handing it back to the kernel and
//! faulting it in again.
//!
//! **Shutdown.** The worker returns once `stop` is set (within one poll timeout). It
//! borrows the ports: the caller drops them afterwards (after updates, the ports of the
//! latest tables, in their order), which closes TAP descriptors (the devices disappear),
//! closes and unmaps AF_PACKET sockets, and removes any ingress drop filter.
//!
//! **One worker per core (not done yet).** The pieces exist: [`crate::AfPacketConfig::fanout`]
//! puts one uplink socket per worker in a `PACKET_FANOUT` group (hash mode, the kernel's
//! symmetric flow hash), and [`crate::TapPort::create_queue`] opens one queue of a
//! multi-queue TAP per worker (`IFF_MULTI_QUEUE`; the tun driver picks the queue from
//! the flow hash). What is missing before several workers can run side by side:
//! - Conntrack and fragment state are per pipeline. Both directions of a connection must
//!   reach the same worker, but NAT changes the tuple, so the uplink's hash of a reply
//!   differs from the pod queue's hash of the request; and non-first IP fragments hash on
//!   addresses only. Either the pipelines share (sharded, locked) conntrack and
//!   reassembly state, or a worker hands packets to the owner of the connection.
//! - Per-worker pipelines over the same `Arc<Tables>` snapshot, with the snapshot swap
//!   reaching every worker (one [`Control`] per worker, or one that fans out), and
//!   counters summed across workers.
//! - Pinning: each worker thread on its core, and the NIC's queues/IRQs on the same.

mod control;
mod taps;
#[cfg(test)]
mod taps_tests;
#[cfg(test)]
mod tests;

pub use control::{
    Applied, Control, JobError, PortSnapshot, Snapshot, Update, UpdateError, WorkerView,
};
pub use taps::{Captured, Direction, MAX_TRACE_COUNT, Taps, TracedPacket};

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use ferry_datapath::gro;
use ferry_datapath::packet::{Packet, PortId, VnetHdr};
use ferry_datapath::pipeline::{Pipeline, SwapReport, Trace};
use ferry_datapath::tables::Tables;

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
    /// Frames received and run through the pipeline.
    pub rx_frames: u64,
    /// Failed receive calls.
    pub rx_errors: u64,
    /// Frames the ports took for sending.
    pub tx_frames: u64,
    /// Failed send calls.
    pub tx_errors: u64,
    /// Frames dropped because their port could not take them without blocking.
    pub tx_dropped: u64,
    /// TCP segments merged into the segment before them on the way out (each one a frame
    /// fewer to send).
    pub gro_merged: u64,
    /// Updates applied.
    pub updates: u64,
    /// Updates refused.
    pub updates_refused: u64,
}

/// Runs ports through `pipeline` until `stop` is set; `clock` gives the pipeline's time
/// in nanoseconds. `ports[i]` is the pipeline's port `i` (see the module docs); the
/// counts must be equal. Without live updates: see [`run_worker_with`].
pub fn run_worker(
    ports: &mut [Box<dyn Port>],
    pipeline: &mut Pipeline,
    stop: &AtomicBool,
    clock: impl Fn() -> u64,
) -> io::Result<WorkerStats> {
    let tables = std::sync::Arc::clone(pipeline.tables());
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
        .map(|(p, t)| (t.name.clone(), std::mem::replace(p, Box::new(Vacant))))
        .collect();
    let r = run_worker_with(&mut named, pipeline, stop, clock, &Control::new());
    for (slot, (_, p)) in ports.iter_mut().zip(named) {
        *slot = p;
    }
    r
}

/// Runs ports through `pipeline` until `stop` is set, taking updates through `control`
/// (see the module docs); `clock` gives the pipeline's time in nanoseconds. Each port
/// comes with the name of its port in the pipeline's tables, in any order: every port of
/// the tables needs exactly one. On return `ports` holds the ports of the tables in
/// force, in their order, for the caller to drop.
pub fn run_worker_with(
    ports: &mut Vec<NamedPort>,
    pipeline: &mut Pipeline,
    stop: &AtomicBool,
    clock: impl Fn() -> u64,
    control: &Control,
) -> io::Result<WorkerStats> {
    let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
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
    let mut stats = WorkerStats::default();
    let r = run_rounds(ports, pipeline, stop, &clock, control, &mut stats);
    publish(control, clock(), &stats, pipeline, ports);
    r.map(|()| stats)
}

/// Allocates the connection table whole and advises huge pages over it (see the module
/// docs). Best effort: a kernel without transparent huge pages refuses the advice, and
/// the table works the same on small pages.
fn prepare_conntrack(pipeline: &mut Pipeline) {
    crate::memory::retain_freed_heap();
    let ct = pipeline.conntrack_mut();
    ct.preallocate();
    for (ptr, len) in ct.memory_regions() {
        let _ = crate::advise_huge_pages(ptr, len);
    }
}

/// Per-port state of the loop, rebuilt when the ports change.
struct Rings {
    pfds: Vec<libc::pollfd>,
    /// Packets to send, per egress port.
    tx: Vec<Vec<Packet>>,
    /// Whether to merge TCP segments before sending, per port.
    coalesce: Vec<bool>,
    /// Receive errors in a row, per port.
    failing: Vec<u32>,
}

impl Rings {
    /// The pollfds are the ports' in order, then the control's wake descriptor.
    fn new(ports: &[NamedPort], tables: &Tables, control: &Control) -> Rings {
        Rings {
            pfds: ports
                .iter()
                .map(|(_, p)| p.raw_fd())
                .chain(control.wake_fd())
                .map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect(),
            tx: ports.iter().map(|_| Vec::new()).collect(),
            coalesce: ports
                .iter()
                .zip(&tables.ports)
                .map(|((_, p), t)| p.offloads() && t.gso)
                .collect(),
            failing: vec![0; ports.len()],
        }
    }
}

fn run_rounds(
    ports: &mut Vec<NamedPort>,
    pipeline: &mut Pipeline,
    stop: &AtomicBool,
    clock: &impl Fn() -> u64,
    control: &Control,
    stats: &mut WorkerStats,
) -> io::Result<()> {
    let mut rings = Rings::new(ports, pipeline.tables(), control);
    let mut rx = Vec::with_capacity(RX_BATCH);
    let mut out: Vec<(PortId, Packet)> = Vec::new();
    let mut frames: Vec<Frame> = Vec::new();
    let mut trace = Trace::disabled();
    let mut taps = Taps::default();
    taps.set_ports(ports.iter().map(|(n, _)| n.as_str()), pipeline.tables());
    let mut published = clock();
    publish(control, published, stats, pipeline, ports);
    while !stop.load(Ordering::Relaxed) {
        stats.rounds += 1;
        for p in &mut rings.pfds {
            p.revents = 0;
        }
        // SAFETY: `rings.pfds` is a live, exclusively borrowed array of `pfds.len()`
        // pollfds; the descriptors belong to `ports`, which outlive the call.
        let rc = unsafe {
            libc::poll(
                rings.pfds.as_mut_ptr(),
                rings.pfds.len() as libc::nfds_t,
                POLL_TIMEOUT_MS,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        let now = clock();
        if let Some(w) = rings.pfds.get(ports.len())
            && w.revents != 0
        {
            control.clear_wake();
        }
        for (i, (_, port)) in ports.iter_mut().enumerate() {
            let revents = rings.pfds[i].revents;
            if revents == 0 {
                continue;
            }
            // A device that went away (its namespace deleted, the TAP closed) makes poll
            // return at once forever: stop instead of spinning.
            if revents & (libc::POLLHUP | libc::POLLNVAL) != 0 {
                return Err(io::Error::other(format!(
                    "port {}: the device is gone",
                    port.name()
                )));
            }
            rx.clear();
            match port.recv_batch(&mut rx, RX_BATCH) {
                Ok(n) => {
                    stats.rx_frames += n as u64;
                    rings.failing[i] = 0;
                }
                Err(e) => {
                    stats.rx_errors += 1;
                    rings.failing[i] += 1;
                    if rings.failing[i] >= MAX_FAILING_ROUNDS {
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
            let offloads = port.offloads();
            if taps.active() {
                for f in rx.drain(..) {
                    let mut pkt = Packet::new(f.data, i as PortId, now);
                    pkt.meta.vnet = if offloads { f.vnet } else { VnetHdr::default() };
                    taps.process(pipeline, pkt, &mut out, now);
                }
            } else {
                for f in rx.drain(..) {
                    let mut pkt = Packet::new(f.data, i as PortId, now);
                    pkt.meta.vnet = if offloads { f.vnet } else { VnetHdr::default() };
                    trace.clear();
                    pipeline.process(pkt, &mut out, &mut trace);
                }
            }
            for (egress, pkt) in out.drain(..) {
                // The pipeline only names ports of its tables, which are `ports`.
                rings.tx[usize::from(egress)].push(pkt);
            }
        }
        for (((_, port), q), &merge) in ports.iter_mut().zip(&mut rings.tx).zip(&rings.coalesce) {
            if q.is_empty() {
                continue;
            }
            if merge {
                let before = q.len();
                gro::coalesce(q);
                stats.gro_merged += (before - q.len()) as u64;
            }
            frames.clear();
            frames.extend(q.drain(..).map(|pkt| Frame {
                data: pkt.data,
                vnet: pkt.meta.vnet,
            }));
            match port.send_batch(&mut frames) {
                Ok(n) => stats.tx_frames += n as u64,
                Err(_) => stats.tx_errors += 1,
            }
            stats.tx_dropped += frames.len() as u64;
        }
        pipeline.tick(now);
        // Every send queue is empty here: no packet holds a PortId of the old tables.
        if control.pending()
            && let Some((update, sent)) = control.take()
        {
            let begun = Instant::now();
            let r = apply(ports, pipeline, update);
            if r.is_ok() {
                rings = Rings::new(ports, pipeline.tables(), control);
                taps.set_ports(ports.iter().map(|(n, _)| n.as_str()), pipeline.tables());
                stats.updates += 1;
                publish(control, now, stats, pipeline, ports);
                published = now;
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
        if control.jobs_waiting() {
            let mut view = WorkerView {
                pipeline: &mut *pipeline,
                taps: &mut taps,
                ports: ports.iter().map(|(n, _)| n.as_str()).collect(),
                now_ns: now,
            };
            control.run_jobs(&mut view);
        }
        if now.wrapping_sub(published) >= STATS_INTERVAL_NS {
            publish(control, now, stats, pipeline, ports);
            published = now;
        }
    }
    Ok(())
}

/// Applies an update, or refuses it having changed nothing. Returns the pipeline's report
/// and the ports let go.
fn apply(
    ports: &mut Vec<NamedPort>,
    pipeline: &mut Pipeline,
    update: Update,
) -> Result<(SwapReport, Vec<NamedPort>), UpdateError> {
    if let Err(reason) = plan(ports, &update.new_ports, &update.tables) {
        return Err(UpdateError::Refused { reason, update });
    }
    let existing = std::mem::take(ports);
    let closed;
    (*ports, closed) = arrange(existing, update.new_ports, &update.tables);
    let report = pipeline.set_tables(update.tables);
    Ok((report, closed))
}

/// Checks that `existing` ports (already named after the tables') with `new` ones (which
/// replace existing ones of the same name) give every port of `tables` exactly one Linux
/// port that can take what the tables say; the error names what is wrong.
fn plan(existing: &[NamedPort], new: &[NamedPort], tables: &Tables) -> Result<(), String> {
    if tables.ports.len() > usize::from(PortId::MAX) {
        return Err(format!(
            "the tables have {} ports, at most {} are supported",
            tables.ports.len(),
            PortId::MAX
        ));
    }
    let mut by_name: HashMap<&str, &dyn Port> = existing
        .iter()
        .map(|(n, p)| (n.as_str(), p.as_ref()))
        .collect();
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

/// Publishes the counters of the worker, its pipeline and its ports.
fn publish(
    control: &Control,
    now: u64,
    stats: &WorkerStats,
    pipeline: &Pipeline,
    ports: &[NamedPort],
) {
    control.publish(Snapshot {
        time_ns: now,
        worker: *stats,
        pipeline: *pipeline.stats(),
        drops: pipeline.drops().clone(),
        conntrack: *pipeline.conntrack().stats(),
        ct_entries: pipeline.conntrack().len(),
        reassembly: *pipeline.reassembler().stats(),
        ports: ports
            .iter()
            .zip(pipeline.port_stats())
            .zip(pipeline.port_drops())
            .map(|(((name, p), s), d)| PortSnapshot {
                name: name.clone(),
                pipeline: *s,
                linux: p.counters(),
                drops: d.clone(),
            })
            .collect(),
    });
}

/// Stands in for a port that [`run_worker`] moved out of its caller's slice for the run.
struct Vacant;

impl Port for Vacant {
    fn name(&self) -> &str {
        ""
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
        false
    }
    fn counters(&self) -> PortCounters {
        PortCounters::default()
    }
}
