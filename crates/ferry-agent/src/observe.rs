//! Tracing and capturing packets on the running worker: the agent's side of `ferry
//! trace` and `ferry capture`.
//!
//! Everything here runs as a job on the worker ([`Control::run`]), which owns the
//! pipeline: a described or given packet is traced on a scratch copy of the live state
//! ([`ferry_datapath::trace`]), so nothing is sent and no connection changes;
//! live traces and captures are turned on in the worker's taps and read back in pieces
//! by the client, which polls.
//!
//! A client that goes away without stopping its live trace or capture does not leave it
//! running: a session not read for [`ABANDONED_AFTER`] is stopped
//! ([`Sessions::expire`]).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_datapath::{CaptureFilter, Described, PortId, Tables, TraceReport};
use ferry_linux::worker::{Captured, Control, Direction, TracedPacket};

/// How long a request may wait for the worker.
pub const JOB_TIMEOUT: Duration = Duration::from_secs(5);
/// A live trace or capture not read for this long is stopped.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(30);
/// Captured frames the worker keeps between two reads at most; beyond that they are
/// counted as lost.
pub const CAPTURE_BUFFER: usize = 20_000;
/// Bytes of captured frames the worker keeps between two reads at most (GSO frames are
/// up to 64 KiB each); beyond that they are counted as lost. Hex-encoded in one answer
/// they stay well within the API's answer limit.
pub const CAPTURE_BUFFER_BYTES: usize = 16 << 20;

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
            Ok(ferry_datapath::trace(
                v.pipeline,
                frames,
                v.now_ns,
                input.reply,
            ))
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

/// Why a live trace or capture read or stop was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The caller's session is no longer the one running: another client started one
    /// since (`what` is `live trace` or `capture`).
    Replaced(&'static str),
    /// None is running.
    NotRunning(&'static str),
    /// The worker did not answer.
    Worker(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Replaced(what) => write!(
                f,
                "replaced by another client's {what} (one runs per node at a time: the newest)"
            ),
            Refusal::NotRunning(what) => write!(f, "no {what} is running"),
            Refusal::Worker(e) => f.write_str(e),
        }
    }
}

/// One kind of session, live trace or capture: at most one runs per node, and a start
/// replaces it.
#[derive(Debug)]
struct Slot {
    /// `live trace` or `capture`, for messages.
    what: &'static str,
    /// The running session's id and when it was last started or read.
    running: Option<(u64, Instant)>,
    /// The id of the last session started, running or not (0: none yet).
    last_started: u64,
}

impl Slot {
    fn new(what: &'static str) -> Slot {
        Slot {
            what,
            running: None,
            last_started: 0,
        }
    }

    fn start(&mut self, id: u64, now: Instant) {
        self.running = Some((id, now));
        self.last_started = id;
    }

    /// Whether a request for `session` may act on the running session. None (a client
    /// older than session ids) acts on whichever runs. A session that is not running
    /// was replaced when another started after it; otherwise it ended (stopped, or not
    /// read for [`ABANDONED_AFTER`]).
    fn check(&self, session: Option<u64>) -> Result<(), Refusal> {
        match (session, self.running) {
            (None, Some(_)) => Ok(()),
            (Some(id), Some((running, _))) if id == running => Ok(()),
            (Some(_), Some(_)) => Err(Refusal::Replaced(self.what)),
            (Some(id), None) if id < self.last_started => Err(Refusal::Replaced(self.what)),
            (_, None) => Err(Refusal::NotRunning(self.what)),
        }
    }

    /// Checks `session` for a read and marks the session read at `now`.
    fn read(&mut self, session: Option<u64>, now: Instant) -> Result<(), Refusal> {
        self.check(session)?;
        if let Some((_, last)) = &mut self.running {
            *last = now;
        }
        Ok(())
    }

    /// Checks `session` for a stop and forgets the session. Stopping when none runs is
    /// no error (the client may stop after the session ended by itself), but a stale
    /// session must not stop its replacement.
    fn stop(&mut self, session: Option<u64>) -> Result<(), Refusal> {
        match self.check(session) {
            Ok(()) | Err(Refusal::NotRunning(_)) => {
                self.running = None;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// True when the running session was not read for [`ABANDONED_AFTER`] at `now`.
    fn abandoned(&self, now: Instant) -> bool {
        self.running
            .is_some_and(|(_, t)| now.duration_since(t) >= ABANDONED_AFTER)
    }
}

/// The live trace and capture sessions the agent turned on: which client's runs, and
/// when it was last read, for stopping abandoned ones.
#[derive(Debug)]
pub struct Sessions {
    trace: Slot,
    capture: Slot,
    /// The last session id given out, for either kind.
    last_id: u64,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions {
            trace: Slot::new("live trace"),
            capture: Slot::new("capture"),
            last_id: 0,
        }
    }
}

impl Sessions {
    /// A new session id. The first is taken from the wall clock, so that a client of an
    /// earlier agent run does not hold an id this run gives out again.
    fn next_id(&mut self) -> u64 {
        if self.last_id == 0 {
            self.last_id = unix_ns(SystemTime::now());
        }
        self.last_id = self.last_id.wrapping_add(1).max(1);
        self.last_id
    }

    /// Starts a live trace of the next `count` packets that match `filter`, replacing
    /// the one running; returns the session's id.
    pub fn trace_start(
        &mut self,
        control: &Control,
        filter: &str,
        count: usize,
    ) -> Result<u64, String> {
        let m = CaptureFilter::parse(filter).map_err(|e| format!("filter: {e}"))?;
        if count == 0 {
            return Err("count must be at least 1".into());
        }
        control
            .run(JOB_TIMEOUT, move |v| v.taps.start_trace(m, count))
            .map_err(|e| e.to_string())?;
        let id = self.next_id();
        self.trace.start(id, Instant::now());
        Ok(id)
    }

    /// The packets traced since the last read of `session`, and how many more the trace
    /// waits for.
    pub fn trace_read(
        &mut self,
        control: &Control,
        session: Option<u64>,
    ) -> Result<(Vec<TracedPacket>, usize), Refusal> {
        self.trace.read(session, Instant::now())?;
        control
            .run(JOB_TIMEOUT, |v| {
                (v.taps.take_traced(), v.taps.trace_remaining())
            })
            .map_err(|e| Refusal::Worker(e.to_string()))
    }

    /// Stops the live trace of `session`; returns what it recorded and was not read yet.
    pub fn trace_stop(
        &mut self,
        control: &Control,
        session: Option<u64>,
    ) -> Result<Vec<TracedPacket>, Refusal> {
        self.trace.stop(session)?;
        control
            .run(JOB_TIMEOUT, |v| {
                v.taps.stop_trace();
                v.taps.take_traced()
            })
            .map_err(|e| Refusal::Worker(e.to_string()))
    }

    /// Starts capturing at `port` (see [`resolve_port`]) the frames that match `filter`,
    /// replacing the capture running; returns the session's id.
    pub fn capture_start(
        &mut self,
        control: &Control,
        port: &str,
        filter: &str,
    ) -> Result<u64, String> {
        let m = CaptureFilter::parse(filter).map_err(|e| format!("filter: {e}"))?;
        let port = port.to_string();
        control
            .run(JOB_TIMEOUT, move |v| {
                let tables = Arc::clone(v.pipeline.tables());
                let id = resolve_port(&tables, &port)?;
                let name = tables.ports[usize::from(id)].name.clone();
                v.taps
                    .start_capture(name, m, CAPTURE_BUFFER, CAPTURE_BUFFER_BYTES);
                Ok::<(), String>(())
            })
            .map_err(|e| e.to_string())??;
        let id = self.next_id();
        self.capture.start(id, Instant::now());
        Ok(id)
    }

    /// The frames captured for `session` since its last read, and how many were lost
    /// because the buffer was full.
    pub fn capture_read(
        &mut self,
        control: &Control,
        session: Option<u64>,
    ) -> Result<(Vec<Frame>, u64), Refusal> {
        self.capture.read(session, Instant::now())?;
        let (frames, lost, now_ns) = control
            .run(JOB_TIMEOUT, |v| {
                let (f, lost) = v.taps.take_captured();
                (f, lost, v.now_ns)
            })
            .map_err(|e| Refusal::Worker(e.to_string()))?;
        Ok((wall_clock(frames, now_ns, SystemTime::now()), lost))
    }

    /// Stops the capture of `session`; returns what it recorded and was not read yet.
    pub fn capture_stop(
        &mut self,
        control: &Control,
        session: Option<u64>,
    ) -> Result<(Vec<Frame>, u64), Refusal> {
        self.capture.stop(session)?;
        let (frames, lost, now_ns) = control
            .run(JOB_TIMEOUT, |v| {
                v.taps.stop_capture();
                let (f, lost) = v.taps.take_captured();
                (f, lost, v.now_ns)
            })
            .map_err(|e| Refusal::Worker(e.to_string()))?;
        Ok((wall_clock(frames, now_ns, SystemTime::now()), lost))
    }

    /// Stops a live trace or capture that no client read for [`ABANDONED_AFTER`];
    /// returns what was stopped, for the log.
    pub fn expire(&mut self, control: &Control, now: Instant) -> Vec<&'static str> {
        let mut stopped = Vec::new();
        if self.trace.abandoned(now) {
            let _ = self.trace_stop(control, None);
            stopped.push("live trace");
        }
        if self.capture.abandoned(now) {
            let _ = self.capture_stop(control, None);
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
    use ferry_datapath::{MacAddr, PortKind, PortSpec, TablesSpec};

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

    /// Sessions as if the worker had started a live trace and a capture for `clients`
    /// clients in turn: the ids they were given.
    fn started(s: &mut Sessions, clients: usize, now: Instant) -> Vec<u64> {
        (0..clients)
            .map(|_| {
                let id = s.next_id();
                s.trace.start(id, now);
                s.capture.start(id, now);
                id
            })
            .collect()
    }

    #[test]
    fn test_a_new_session_replaces_the_running_one() {
        let mut s = Sessions::default();
        let ids = started(&mut s, 2, Instant::now());
        assert_ne!(ids[0], ids[1]);
        assert_eq!(s.trace.running.map(|r| r.0), Some(ids[1]));
        assert_eq!(s.trace.check(Some(ids[1])), Ok(()));
        assert_eq!(
            s.trace.check(Some(ids[0])),
            Err(Refusal::Replaced("live trace"))
        );
        // A client older than session ids reads whichever runs.
        assert_eq!(s.trace.check(None), Ok(()));
    }

    #[test]
    fn test_a_replaced_client_cannot_read_the_new_session() {
        let c = Control::new();
        let mut s = Sessions::default();
        let ids = started(&mut s, 2, Instant::now());
        let e = s.trace_read(&c, Some(ids[0])).unwrap_err();
        assert_eq!(e, Refusal::Replaced("live trace"));
        assert!(e.to_string().contains("replaced by another client"), "{e}");
        assert_eq!(
            s.capture_read(&c, Some(ids[0])).unwrap_err(),
            Refusal::Replaced("capture")
        );
        // The running session's own client gets as far as the worker (none here).
        assert!(matches!(
            s.trace_read(&c, Some(ids[1])),
            Err(Refusal::Worker(_))
        ));
    }

    #[test]
    fn test_a_replaced_client_cannot_stop_the_new_session() {
        let c = Control::new();
        let mut s = Sessions::default();
        let ids = started(&mut s, 2, Instant::now());
        assert_eq!(
            s.trace_stop(&c, Some(ids[0])).unwrap_err(),
            Refusal::Replaced("live trace")
        );
        assert_eq!(
            s.capture_stop(&c, Some(ids[0])).unwrap_err(),
            Refusal::Replaced("capture")
        );
        assert_eq!(s.trace.running.map(|r| r.0), Some(ids[1]));
        assert_eq!(s.capture.running.map(|r| r.0), Some(ids[1]));
        // Its own client stops it; a stop after that is no error.
        assert!(matches!(
            s.trace_stop(&c, Some(ids[1])),
            Err(Refusal::Worker(_))
        ));
        assert!(s.trace.running.is_none());
        assert_eq!(s.trace.stop(Some(ids[1])), Ok(()));
        // The replaced client is still told so once nothing runs.
        assert_eq!(
            s.trace.check(Some(ids[0])),
            Err(Refusal::Replaced("live trace"))
        );
    }

    #[test]
    fn test_unread_sessions_are_stopped() {
        let c = Control::new();
        let mut s = Sessions::default();
        let t0 = Instant::now();
        let ids = started(&mut s, 1, t0);
        s.trace.read(Some(ids[0]), t0 + ABANDONED_AFTER).unwrap();
        assert_eq!(
            s.expire(&c, t0 + ABANDONED_AFTER + Duration::from_secs(1)),
            vec!["capture"]
        );
        assert!(s.capture.running.is_none());
        assert_eq!(
            s.capture.check(Some(ids[0])),
            Err(Refusal::NotRunning("capture"))
        );
        assert_eq!(s.expire(&c, t0 + 2 * ABANDONED_AFTER), vec!["live trace"]);
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
        assert_eq!(
            s.trace_read(&c, None).unwrap_err(),
            Refusal::NotRunning("live trace")
        );
        assert!(
            s.capture_start(&c, "uplink", "bogus words")
                .unwrap_err()
                .starts_with("filter:")
        );
        assert_eq!(
            s.capture_read(&c, Some(3)).unwrap_err().to_string(),
            "no capture is running"
        );
        let input = TraceInput {
            in_port: "uplink".into(),
            packet: Some("tcp 1.2.3.4:1 -> 5.6.7.8:80".into()),
            frames: vec!["00".into()],
            reply: false,
        };
        assert!(trace(&c, input).unwrap_err().contains("either"));
    }
}
