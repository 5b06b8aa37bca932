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
//! **Port numbering.** `ports[i]` is the pipeline's `PortId` `i`: the order of `ports`
//! must be the order of `ports` in the tables the pipeline was built from. A port's
//! `gso` setting in the tables must match [`Port::offloads`]: a port without offloads
//! cannot take GSO packets or partial checksums, and the pipeline only finishes them for
//! ports whose `gso` is false.
//!
//! **Shutdown.** [`run_worker`] returns once `stop` is set (within one poll timeout). It
//! borrows the ports: the caller drops them afterwards, which closes TAP descriptors (the
//! devices disappear), closes and unmaps AF_PACKET sockets, and removes any ingress drop
//! filter.
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
//!   reaching every worker, and counters summed across workers.
//! - Pinning: each worker thread on its core, and the NIC's queues/IRQs on the same.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use ferry_datapath::gro;
use ferry_datapath::packet::{Packet, PortId, VnetHdr};
use ferry_datapath::pipeline::{Pipeline, Trace};

use crate::port::{Frame, Port};

/// Longest wait for traffic before the pipeline's clock is advanced and `stop` checked.
pub const POLL_TIMEOUT_MS: i32 = 10;
/// Receive errors in a row after which a port counts as broken and the worker returns
/// (an error state makes poll return at once, so this is reached quickly).
pub const MAX_FAILING_ROUNDS: u32 = 1000;
/// Frames received from one port per round.
pub const RX_BATCH: usize = 64;

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
}

/// Runs ports through `pipeline` until `stop` is set; `clock` gives the pipeline's time
/// in nanoseconds. `ports[i]` is the pipeline's port `i` (see the module docs); the
/// counts must be equal.
pub fn run_worker(
    ports: &mut [Box<dyn Port>],
    pipeline: &mut Pipeline,
    stop: &AtomicBool,
    clock: impl Fn() -> u64,
) -> io::Result<WorkerStats> {
    let tables = pipeline.tables().ports.len();
    if ports.len() != tables || ports.len() > usize::from(PortId::MAX) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} ports for a pipeline whose tables have {tables}",
                ports.len()
            ),
        ));
    }
    let mut pfds: Vec<libc::pollfd> = ports
        .iter()
        .map(|p| libc::pollfd {
            fd: p.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let mut stats = WorkerStats::default();
    let mut rx = Vec::with_capacity(RX_BATCH);
    let mut out: Vec<(PortId, Packet)> = Vec::new();
    let mut tx: Vec<Vec<Packet>> = (0..ports.len()).map(|_| Vec::new()).collect();
    let coalesce: Vec<bool> = ports
        .iter()
        .zip(&pipeline.tables().ports)
        .map(|(p, t)| p.offloads() && t.gso)
        .collect();
    let mut frames: Vec<Frame> = Vec::new();
    let mut trace = Trace::disabled();
    let mut failing = vec![0u32; ports.len()];
    while !stop.load(Ordering::Relaxed) {
        stats.rounds += 1;
        for p in &mut pfds {
            p.revents = 0;
        }
        // SAFETY: `pfds` is a live, exclusively borrowed array of `pfds.len()` pollfds;
        // the descriptors belong to `ports`, which outlive the call.
        let rc = unsafe {
            libc::poll(
                pfds.as_mut_ptr(),
                pfds.len() as libc::nfds_t,
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
        for (i, port) in ports.iter_mut().enumerate() {
            let revents = pfds[i].revents;
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
                    failing[i] = 0;
                }
                Err(e) => {
                    stats.rx_errors += 1;
                    failing[i] += 1;
                    if failing[i] >= MAX_FAILING_ROUNDS {
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
            for f in rx.drain(..) {
                let mut pkt = Packet::new(f.data, i as PortId, now);
                pkt.meta.vnet = if offloads { f.vnet } else { VnetHdr::default() };
                trace.clear();
                pipeline.process(pkt, &mut out, &mut trace);
            }
            for (egress, pkt) in out.drain(..) {
                // The pipeline only names ports of its tables, which are `ports`.
                tx[usize::from(egress)].push(pkt);
            }
        }
        for ((port, q), &merge) in ports.iter_mut().zip(&mut tx).zip(&coalesce) {
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
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_datapath::tables::{MacAddr, PortSpec, TablesSpec};
    use std::sync::Arc;

    #[test]
    fn test_port_count_must_match_the_tables() {
        let spec = TablesSpec {
            ports: vec![PortSpec {
                name: "pod".into(),
                mac: MacAddr([2, 0, 0, 0, 0, 1]),
                gso: true,
                ..PortSpec::default()
            }],
            ..TablesSpec::default()
        };
        let mut pipeline = Pipeline::new(Arc::new(spec.compile().unwrap()));
        let stop = AtomicBool::new(false);
        let e = run_worker(&mut [], &mut pipeline, &stop, || 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("0 ports"), "{e}");
    }
}
