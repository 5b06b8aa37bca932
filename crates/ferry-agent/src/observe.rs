//! Tracing and capturing packets on the running worker: the agent's side of `ferry
//! trace` and `ferry capture`.
//!
//! Everything here runs as a job on the worker ([`Control::run`]), which owns the
//! pipeline: a described or given packet is traced on a scratch copy of the live state
//! ([`ferry_datapath::pipeline::trace`]), so nothing is sent and no connection changes;
//! live traces and captures are turned on in the worker's taps and read back in pieces
//! by the client, which polls.
//!
//! A client that goes away without stopping its live trace or capture does not leave it
//! running: a session not read for [`ABANDONED_AFTER`] is stopped
//! ([`Sessions::expire`]).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_datapath::describe::Described;
use ferry_datapath::filter::Match;
use ferry_datapath::packet::PortId;
use ferry_datapath::pipeline::{self, TraceReport};
use ferry_datapath::tables::Tables;
use ferry_linux::worker::{Captured, Control, Direction, TracedPacket};

/// How long a request may wait for the worker.
pub const JOB_TIMEOUT: Duration = Duration::from_secs(5);
/// A live trace or capture not read for this long is stopped.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(30);
/// Captured frames the worker keeps between two reads at most; beyond that they are
/// counted as lost.
pub const CAPTURE_BUFFER: usize = 20_000;

/// The port a trace starts at: a port name of the tables, or a pod as `pod NS/NAME` (or
/// `NS/NAME`), whose port is `pod.NS.NAME`.
pub fn resolve_port(tables: &Tables, given: &str) -> Result<PortId, String> {
    let given = given.trim();
    if let Some(id) = tables.port_id(given) {
        return Ok(id);
    }
    let pod = given.strip_prefix("pod ").unwrap_or(given).trim();
    if let Some((ns, name)) = pod.split_once('/') {
        let port = crate::compile::pods::pod_port(ns, name);
        return tables
            .port_id(&port)
            .ok_or_else(|| format!("no pod {ns}/{name} on this node (no port {port})"));
    }
    let names: Vec<&str> = tables.ports.iter().map(|p| p.name.as_str()).collect();
    Err(format!(
        "no port {given:?} on this node; ports: {}",
        names.join(", ")
    ))
}

/// What to trace: a described packet or Ethernet frames, entering at a port.
#[derive(Clone, Debug)]
pub struct TraceInput {
    /// The port (see [`resolve_port`]).
    pub in_port: String,
    /// A described packet ([`Described::parse`]).
    pub packet: Option<String>,
    /// Ethernet frames, hex-encoded.
    pub frames: Vec<String>,
    /// Also trace the reply the other side would send.
    pub reply: bool,
}

/// Traces `input` on a scratch copy of the worker's live state.
pub fn trace(control: &Control, input: TraceInput) -> Result<TraceReport, String> {
    let described = match &input.packet {
        Some(p) => Some(Described::parse(p).map_err(|e| format!("packet: {e}"))?),
        None => None,
    };
    let mut frames = Vec::with_capacity(input.frames.len());
    for (i, f) in input.frames.iter().enumerate() {
        frames.push(hex::decode(f.trim()).map_err(|e| format!("frame {}: {e}", i + 1))?);
    }
    if described.is_some() != frames.is_empty() {
        return Err("give either a described packet or frames".into());
    }
    control
        .run(JOB_TIMEOUT, move |v| {
            let tables = Arc::clone(v.pipeline.tables());
            let port = resolve_port(&tables, &input.in_port)?;
            if let Some(d) = described {
                frames.push(d.frame(&tables, port)?);
            }
            let frames = frames.into_iter().map(|f| (port, f)).collect();
            Ok(pipeline::trace(v.pipeline, frames, v.now_ns, input.reply))
        })
        .map_err(|e| e.to_string())?
}

/// A captured frame with a wall-clock time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Nanoseconds since the epoch.
    pub time_unix_ns: u64,
    /// Received (true) or sent.
    pub inbound: bool,
    /// The port it was received on or sent to.
    pub port: String,
    /// Where it was seen: before or after ferry rewrote it.
    pub note: String,
    /// The Ethernet frame.
    pub data: Vec<u8>,
}

fn unix_ns(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The live trace and capture sessions the agent turned on, for stopping abandoned ones.
#[derive(Debug, Default)]
pub struct Sessions {
    trace: Option<Instant>,
    capture: Option<Instant>,
}

impl Sessions {
    /// Starts a live trace of the next `count` packets that match `filter`.
    pub fn trace_start(
        &mut self,
        control: &Control,
        filter: &str,
        count: usize,
    ) -> Result<(), String> {
        let m = Match::parse(filter).map_err(|e| format!("filter: {e}"))?;
        if count == 0 {
            return Err("count must be at least 1".into());
        }
        control
            .run(JOB_TIMEOUT, move |v| v.taps.start_trace(m, count))
            .map_err(|e| e.to_string())?;
        self.trace = Some(Instant::now());
        Ok(())
    }

    /// The packets traced since the last read, and how many more the trace waits for.
    pub fn trace_read(&mut self, control: &Control) -> Result<(Vec<TracedPacket>, usize), String> {
        if self.trace.is_none() {
            return Err("no live trace is running".into());
        }
        self.trace = Some(Instant::now());
        control
            .run(JOB_TIMEOUT, |v| {
                (v.taps.take_traced(), v.taps.trace_remaining())
            })
            .map_err(|e| e.to_string())
    }

    /// Stops the live trace; returns what it recorded and was not read yet.
    pub fn trace_stop(&mut self, control: &Control) -> Result<Vec<TracedPacket>, String> {
        self.trace = None;
        control
            .run(JOB_TIMEOUT, |v| {
                v.taps.stop_trace();
                v.taps.take_traced()
            })
            .map_err(|e| e.to_string())
    }

    /// Starts capturing at `port` (see [`resolve_port`]) the frames that match `filter`.
    pub fn capture_start(
        &mut self,
        control: &Control,
        port: &str,
        filter: &str,
    ) -> Result<(), String> {
        let m = Match::parse(filter).map_err(|e| format!("filter: {e}"))?;
        let port = port.to_string();
        control
            .run(JOB_TIMEOUT, move |v| {
                let tables = Arc::clone(v.pipeline.tables());
                let id = resolve_port(&tables, &port)?;
                let name = tables.ports[usize::from(id)].name.clone();
                v.taps.start_capture(name, m, CAPTURE_BUFFER);
                Ok::<(), String>(())
            })
            .map_err(|e| e.to_string())??;
        self.capture = Some(Instant::now());
        Ok(())
    }

    /// The frames captured since the last read, and how many were lost because the
    /// buffer was full.
    pub fn capture_read(&mut self, control: &Control) -> Result<(Vec<Frame>, u64), String> {
        if self.capture.is_none() {
            return Err("no capture is running".into());
        }
        self.capture = Some(Instant::now());
        let (frames, lost, now_ns) = control
            .run(JOB_TIMEOUT, |v| {
                let (f, lost) = v.taps.take_captured();
                (f, lost, v.now_ns)
            })
            .map_err(|e| e.to_string())?;
        Ok((wall_clock(frames, now_ns, SystemTime::now()), lost))
    }

    /// Stops the capture; returns what it recorded and was not read yet.
    pub fn capture_stop(&mut self, control: &Control) -> Result<(Vec<Frame>, u64), String> {
        self.capture = None;
        let (frames, lost, now_ns) = control
            .run(JOB_TIMEOUT, |v| {
                v.taps.stop_capture();
                let (f, lost) = v.taps.take_captured();
                (f, lost, v.now_ns)
            })
            .map_err(|e| e.to_string())?;
        Ok((wall_clock(frames, now_ns, SystemTime::now()), lost))
    }

    /// Stops a live trace or capture that no client read for [`ABANDONED_AFTER`];
    /// returns what was stopped, for the log.
    pub fn expire(&mut self, control: &Control, now: Instant) -> Vec<&'static str> {
        let mut stopped = Vec::new();
        if self
            .trace
            .is_some_and(|t| now.duration_since(t) >= ABANDONED_AFTER)
        {
            let _ = self.trace_stop(control);
            stopped.push("live trace");
        }
        if self
            .capture
            .is_some_and(|t| now.duration_since(t) >= ABANDONED_AFTER)
        {
            let _ = self.capture_stop(control);
            stopped.push("capture");
        }
        stopped
    }
}

/// Frames stamped with the pipeline's clock, stamped with the wall clock instead: the
/// pipeline's clock read `now_ns` at `wall`.
fn wall_clock(frames: Vec<Captured>, now_ns: u64, wall: SystemTime) -> Vec<Frame> {
    let wall = unix_ns(wall);
    frames
        .into_iter()
        .map(|c| Frame {
            time_unix_ns: wall.saturating_sub(now_ns.saturating_sub(c.time_ns)),
            inbound: c.dir == Direction::In,
            port: c.port,
            note: c.note,
            data: c.data,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_datapath::tables::{MacAddr, PortKind, PortSpec, TablesSpec};

    fn tables() -> Tables {
        TablesSpec {
            ports: vec![
                PortSpec {
                    name: "uplink".into(),
                    kind: PortKind::Uplink,
                    mac: MacAddr([2, 0, 0, 0, 0, 1]),
                    ..PortSpec::default()
                },
                PortSpec {
                    name: "pod.default.web-1".into(),
                    kind: PortKind::Pod,
                    mac: MacAddr([2, 0, 0, 0, 0, 2]),
                    peer_mac: Some(MacAddr([2, 0, 0, 0, 0, 3])),
                    ..PortSpec::default()
                },
            ],
            ..TablesSpec::default()
        }
        .compile()
        .unwrap()
    }

    #[test]
    fn test_ports_resolve_by_name_or_pod() {
        let t = tables();
        assert_eq!(resolve_port(&t, "uplink"), Ok(0));
        assert_eq!(resolve_port(&t, "pod default/web-1"), Ok(1));
        assert_eq!(resolve_port(&t, "default/web-1"), Ok(1));
        assert_eq!(resolve_port(&t, "pod.default.web-1"), Ok(1));
        let e = resolve_port(&t, "pod default/web-2").unwrap_err();
        assert!(e.contains("no pod default/web-2"), "{e}");
        let e = resolve_port(&t, "eth9").unwrap_err();
        assert!(e.contains("uplink, pod.default.web-1"), "{e}");
    }

    #[test]
    fn test_capture_times_move_to_the_wall_clock() {
        let wall = UNIX_EPOCH + Duration::from_secs(1_000);
        let frames = vec![Captured {
            time_ns: 7_000,
            dir: Direction::Out,
            port: "uplink".into(),
            note: "sent on uplink".into(),
            data: vec![1, 2, 3],
        }];
        let f = wall_clock(frames, 10_000, wall);
        assert_eq!(f[0].time_unix_ns, 1_000_000_000_000 - 3_000);
        assert!(!f[0].inbound);
    }

    #[test]
    fn test_nothing_runs_without_a_worker() {
        let c = Control::new();
        let mut s = Sessions::default();
        assert!(
            s.trace_start(&c, "tcp", 1)
                .unwrap_err()
                .contains("not running")
        );
        assert!(s.trace_read(&c).unwrap_err().contains("no live trace"));
        assert!(
            s.capture_start(&c, "uplink", "bogus words")
                .unwrap_err()
                .starts_with("filter:")
        );
        assert!(s.capture_read(&c).unwrap_err().contains("no capture"));
        let input = TraceInput {
            in_port: "uplink".into(),
            packet: Some("tcp 1.2.3.4:1 -> 5.6.7.8:80".into()),
            frames: vec!["00".into()],
            reply: false,
        };
        assert!(trace(&c, input).unwrap_err().contains("either"));
    }
}
