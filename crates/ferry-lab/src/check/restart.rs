//! The restart rows of `ferry lab check`: a node's agent replaced under traffic
//! ([`crate::traffic`]), as an update and as a crash, on the node the node-port
//! connection enters by (node1) and on the node of its endpoint (`web`'s). They come
//! last: each leaves the lab forwarding as before ([`crate::restart::restart`] waits
//! for it), but a connection they break is not mended for what follows.

use anyhow::{Result, bail};

use super::{Ctx, NotApplicable};
use crate::restart::{self, How, Restarted};
use crate::state::State;
use crate::traffic::{self, INGRESS, Kind, Report, Traffic};

/// What the kill rows allow the gap of a flow of datagrams beyond the measured outage:
/// its interval (20 ms: the first request after the path is back may leave up to that
/// late) and the watch's (5 ms), then 75 ms for the scheduling of processes on a shared
/// two-core machine.
pub const DATAGRAM_MARGIN_MS: u64 = 100;
/// What they allow a TCP connection beyond twice the outage: the kernel's minimum
/// retransmission timeout (200 ms) and 100 ms of scheduling. A segment lost in an outage
/// of T is sent again after 200 ms, then after waits that double, so the first one sent
/// after the path is back leaves up to about T after it.
pub const TCP_MARGIN_MS: u64 = 300;

pub(super) fn update_ingress(c: &mut Ctx) -> Result<()> {
    under_traffic(c, INGRESS, How::Update)
}

pub(super) fn update_endpoint(c: &mut Ctx) -> Result<()> {
    let n = endpoint_node(c)?;
    under_traffic(c, n, How::Update)
}

pub(super) fn kill_ingress(c: &mut Ctx) -> Result<()> {
    under_traffic(c, INGRESS, How::Kill)
}

pub(super) fn kill_endpoint(c: &mut Ctx) -> Result<()> {
    let n = endpoint_node(c)?;
    under_traffic(c, n, How::Kill)
}

pub(super) fn cold_ingress(c: &mut Ctx) -> Result<()> {
    under_traffic(c, INGRESS, How::Cold)
}

pub(super) fn cold_endpoint(c: &mut Ctx) -> Result<()> {
    let n = endpoint_node(c)?;
    under_traffic(c, n, How::Cold)
}

/// `web`'s node, which must not be the ingress node.
fn endpoint_node(c: &Ctx) -> Result<u8> {
    let n = c.state.pod("web")?.node;
    if n == INGRESS {
        return Err(NotApplicable("web is on the ingress node").into());
    }
    Ok(n)
}

/// Starts the traffic, restarts node `n`'s agent, waits for the traffic's end, and
/// judges what it saw; the row's note says it all, whether it passes or not.
fn under_traffic(c: &mut Ctx, n: u8, how: How) -> Result<()> {
    let running = Traffic::start(c.dir, &c.state)?;
    let restarted = restart::restart(c.dir, n, how);
    let done_at = running.elapsed();
    let report = running.finish();
    // The new agent's pid, for the rows after.
    c.state = State::load(c.dir)?;
    let (restarted, report) = (restarted?, report?);
    c.note = Some(format!("{restarted}; {report}"));
    if done_at + std::time::Duration::from_secs(1) > traffic::LASTS {
        bail!(
            "the restart ended {:.1} s into traffic of {} s: too late to see traffic after it",
            done_at.as_secs_f64(),
            traffic::LASTS.as_secs()
        );
    }
    let wrong = verdict(how, &restarted, &report);
    if !wrong.is_empty() {
        bail!(
            "{}: {}",
            wrong.join("; "),
            c.note.take().unwrap_or_default()
        );
    }
    Ok(())
}

/// What is wrong with `report` after `restarted`: every connection must survive; an
/// update must lose no ping; a crash may cost only the outage, the margins above added.
pub fn verdict(how: How, restarted: &Restarted, report: &Report) -> Vec<String> {
    let mut wrong = Vec::new();
    let outage = restarted.outage.as_millis() as u64;
    for o in &report.0 {
        if o.survived < o.started {
            wrong.push(format!(
                "{} of {} {:?} broke",
                o.started - o.survived,
                o.started,
                o.kind
            ));
        }
        match how {
            How::Update if o.kind == Kind::Ping && o.lost > 0 => {
                wrong.push(format!("{} of {} pings lost", o.lost, o.sent));
            }
            How::Kill | How::Cold => {
                let allowed = if o.kind.datagrams() {
                    outage + DATAGRAM_MARGIN_MS
                } else {
                    2 * outage + TCP_MARGIN_MS
                };
                if o.longest_gap_ms > allowed {
                    wrong.push(format!(
                        "{:?} gap {} ms > {allowed} ms allowed (outage {outage} ms)",
                        o.kind, o.longest_gap_ms
                    ));
                }
            }
            How::Update => {}
        }
    }
    wrong
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::traffic::Outcome;

    fn restarted(how: How, outage_ms: u64) -> Restarted {
        Restarted {
            node: 1,
            how,
            old_pid: Some(10),
            stopped: Some(Duration::from_millis(5)),
            new_pid: 11,
            forwarding: Duration::from_millis(outage_ms),
            outage: Duration::from_millis(outage_ms),
        }
    }

    fn outcome(kind: Kind, survived: usize, lost: u64, gap: u64) -> Outcome {
        Outcome {
            kind,
            started: if kind == Kind::Downloads { 4 } else { 1 },
            survived,
            lost,
            sent: 500,
            longest_gap_ms: gap,
            notes: Vec::new(),
        }
    }

    #[test]
    fn test_an_update_passes_only_with_every_connection_and_every_ping() {
        let good = Report(vec![
            outcome(Kind::Downloads, 4, 3, 2000),
            outcome(Kind::Ping, 1, 0, 40),
        ]);
        assert!(verdict(How::Update, &restarted(How::Update, 0), &good).is_empty());
        let broke = Report(vec![
            outcome(Kind::Downloads, 2, 0, 30),
            outcome(Kind::Ping, 1, 26, 2100),
        ]);
        let wrong = verdict(How::Update, &restarted(How::Update, 2000), &broke);
        assert_eq!(wrong, ["2 of 4 Downloads broke", "26 of 500 pings lost"]);
    }

    #[test]
    fn test_a_crash_may_cost_the_outage_and_its_margin_only() {
        let r = restarted(How::Kill, 400);
        let within = Report(vec![
            outcome(Kind::Ping, 1, 20, 400 + DATAGRAM_MARGIN_MS),
            outcome(Kind::NodePort, 1, 5, 800 + TCP_MARGIN_MS),
        ]);
        assert!(verdict(How::Kill, &r, &within).is_empty());
        let beyond = Report(vec![
            outcome(Kind::Udp, 1, 20, 401 + DATAGRAM_MARGIN_MS),
            outcome(Kind::Downloads, 3, 0, 30),
        ]);
        assert_eq!(verdict(How::Kill, &r, &beyond).len(), 2);
    }
}
