//! Live tracing and capture of the packets a worker forwards.
//!
//! Both are off unless a control-plane job turns them on ([`super::Control::run`]); off,
//! they cost the worker one branch per received batch. On, the worker hands each packet
//! of a batch to [`Taps::process`] instead of to the pipeline directly.
//!
//! - A **live trace** runs the packets that match its filter (as received) through the
//!   pipeline with tracing on and records what became of them ([`TracedPacket`]), until
//!   it has recorded as many as asked; then it turns itself off.
//! - A **capture** copies the frames of one port, by name so that it survives table
//!   swaps ([`Captured`]): those received there that match its filter, as received; the
//!   packets the pipeline made of them, as sent (after NAT, encapsulation, TTL and MAC
//!   rewriting); and the packets the pipeline sent to that port for frames received
//!   elsewhere, when they match. Frames not taken yet are bounded: beyond the bound they
//!   are counted as lost. Packets are copied as the pipeline made them, before the
//!   worker merges TCP segments for a port with offloads.

use serde::{Deserialize, Serialize};

use ferry_datapath::{
    CaptureFilter, Packet, Pipeline, PortId, Stage, Tables, Trace, TraceEvent, Verdict, summarize,
};

/// Most packets one live trace records ([`Taps::start_trace`] asks for fewer).
pub const MAX_TRACE_COUNT: usize = 10_000;

/// What became of one traced packet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracedPacket {
    /// The pipeline's clock when the packet was received.
    pub time_ns: u64,
    /// The port it was received on.
    pub in_port: String,
    /// One line: flow key and length ([`summary`]).
    pub summary: String,
    /// `(stage, detail)` for each stage the packet went through, in order.
    pub stages: Vec<(String, String)>,
    /// The same stages as typed events, with their fields (`kind`-tagged in JSON); empty
    /// in a record of an agent that had none.
    #[serde(default)]
    pub events: Vec<TraceEvent>,
    /// `forwarded`, `held`, `consumed` or `dropped: REASON` (the drop reason's name).
    pub verdict: String,
    /// What conntrack made of it (`new`, `established`, `reply`, ...), if it got there.
    pub ct: Option<String>,
    /// The packets the pipeline sent for it: egress port and [`summary`], as sent.
    pub out: Vec<(String, String)>,
}

/// Whether a captured frame came in or went out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Received by the worker.
    In,
    /// Sent by the worker.
    Out,
}

/// One captured frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Captured {
    /// The pipeline's clock when the frame (or the one it was made from) was received.
    pub time_ns: u64,
    /// In or out.
    pub dir: Direction,
    /// The port it was received on (`In`) or sent to (`Out`).
    pub port: String,
    /// `received on PORT`, `after ferry: to EGRESS (received on PORT)` or
    /// `sent on PORT`.
    pub note: String,
    /// The Ethernet frame.
    pub data: Vec<u8>,
}

/// A live trace in progress.
#[derive(Debug)]
struct LiveTrace {
    filter: CaptureFilter,
    remaining: usize,
}

/// A capture in progress.
#[derive(Debug)]
struct Capture {
    port: String,
    /// The port's index in the current tables; None while the tables do not have it.
    id: Option<PortId>,
    filter: CaptureFilter,
    max_buffered: usize,
    /// The most bytes of frames kept not taken yet.
    max_bytes: usize,
}

/// The worker's live taps.
#[derive(Debug, Default)]
pub struct Taps {
    /// A trace or a capture is on: the worker's one check per batch.
    active: bool,
    trace: Option<LiveTrace>,
    traced: Vec<TracedPacket>,
    capture: Option<Capture>,
    captured: Vec<Captured>,
    /// The bytes of the frames in `captured`.
    captured_bytes: usize,
    lost: u64,
    /// The worker's port names, in table order.
    ports: Vec<String>,
    /// The VXLAN port of the tables' overlay, for summaries (0: none).
    vxlan_port: u16,
    /// Reused for the packets a live trace records (enabled when a trace starts).
    recording: Trace,
    /// Reused for the other packets.
    silent: Trace,
}

impl Taps {
    /// True when any tap is on: the worker then takes the slow path for its packets.
    #[inline]
    pub fn active(&self) -> bool {
        self.active
    }

    fn update_active(&mut self) {
        self.active = self.trace.is_some() || self.capture.is_some();
    }

    /// Starts a live trace of the next `count` packets (at most [`MAX_TRACE_COUNT`])
    /// that match `filter` as received, replacing a trace in progress. Packets recorded
    /// earlier and not taken are forgotten.
    pub fn start_trace(&mut self, filter: CaptureFilter, count: usize) {
        self.traced.clear();
        self.recording = Trace::enabled();
        let filter = self.for_overlay(filter);
        self.trace = (count > 0).then(|| LiveTrace {
            filter,
            remaining: count.min(MAX_TRACE_COUNT),
        });
        self.update_active();
    }

    /// The packets recorded since the last call (they remain to be taken after the trace
    /// stopped).
    pub fn take_traced(&mut self) -> Vec<TracedPacket> {
        std::mem::take(&mut self.traced)
    }

    /// How many packets the live trace still records; 0 when it is off.
    pub fn trace_remaining(&self) -> usize {
        self.trace.as_ref().map_or(0, |t| t.remaining)
    }

    /// Stops the live trace; what it recorded stays to be taken.
    pub fn stop_trace(&mut self) {
        self.trace = None;
        self.update_active();
    }

    /// Starts capturing on the port named `port` in the tables (see the module docs),
    /// keeping at most `max_buffered` frames and `max_bytes` bytes of frames not taken
    /// yet. Replaces a capture in progress; frames captured earlier and not taken are
    /// forgotten.
    pub fn start_capture(
        &mut self,
        port: String,
        filter: CaptureFilter,
        max_buffered: usize,
        max_bytes: usize,
    ) {
        self.captured.clear();
        self.captured_bytes = 0;
        self.lost = 0;
        let id = self.port_id(&port);
        let filter = self.for_overlay(filter);
        self.capture = Some(Capture {
            port,
            id,
            filter,
            max_buffered,
            max_bytes,
        });
        self.update_active();
    }

    /// The frames captured since the last call, and how many were lost meanwhile
    /// because the buffer was full.
    pub fn take_captured(&mut self) -> (Vec<Captured>, u64) {
        self.captured_bytes = 0;
        (
            std::mem::take(&mut self.captured),
            std::mem::take(&mut self.lost),
        )
    }

    /// True while a capture is on.
    pub fn capturing(&self) -> bool {
        self.capture.is_some()
    }

    /// Stops capturing; what was captured stays to be taken.
    pub fn stop_capture(&mut self) {
        self.capture = None;
        self.update_active();
    }

    /// With an overlay, filters look into the VXLAN frames of its port.
    fn for_overlay(&self, filter: CaptureFilter) -> CaptureFilter {
        match self.vxlan_port {
            0 => filter,
            p => filter.with_vxlan_port(p),
        }
    }

    fn port_id(&self, name: &str) -> Option<PortId> {
        self.ports
            .iter()
            .position(|p| p == name)
            .and_then(|i| PortId::try_from(i).ok())
    }

    /// Learns the worker's ports (names in table order) and the overlay's VXLAN port:
    /// at the start and after every update.
    pub(super) fn set_ports<'a>(&mut self, names: impl Iterator<Item = &'a str>, tables: &Tables) {
        self.ports.clear();
        self.ports.extend(names.map(str::to_string));
        self.vxlan_port = tables.overlay.as_ref().map_or(0, |o| o.port);
        if let Some(c) = &self.capture {
            let id = self.port_id(&c.port);
            if let Some(c) = &mut self.capture {
                c.id = id;
            }
        }
    }

    fn name(&self, id: PortId) -> &str {
        self.ports.get(usize::from(id)).map_or("?", String::as_str)
    }

    /// Runs one received packet through `pipeline` as the worker would, recording what
    /// the taps ask for. What the pipeline sends is appended to `out`, as without taps.
    pub(super) fn process(
        &mut self,
        pipeline: &mut Pipeline,
        pkt: Packet,
        out: &mut Vec<(PortId, Packet)>,
        now: u64,
    ) {
        let in_id = pkt.meta.in_port;
        let traced = self
            .trace
            .as_ref()
            .is_some_and(|t| t.filter.matches(&pkt.data));
        let captured_in = match &self.capture {
            Some(c) if c.id == Some(in_id) && c.filter.matches(&pkt.data) => {
                Some((c.max_buffered, c.max_bytes))
            }
            _ => None,
        };
        // Where the received frame's record is, to add to its comment why it was
        // dropped, if it is.
        let mut in_record = None;
        if let Some(max) = captured_in {
            let port = self.name(in_id).to_string();
            let note = format!("received on {port}");
            let before = self.captured.len();
            self.record(max, now, Direction::In, port, note, &pkt.data);
            in_record = (self.captured.len() > before).then_some(before);
        }
        let captured_in = captured_in.is_some();
        let in_summary = traced.then(|| summarize(pipeline.tables(), in_id, &pkt.data));
        let first = out.len();
        // A captured frame is traced too (quietly), so that a drop can say why.
        let trace = if traced || in_record.is_some() {
            &mut self.recording
        } else {
            &mut self.silent
        };
        trace.clear();
        let verdict = pipeline.process(pkt, out, trace);
        let sent = &out[first..];
        if let (Some(i), Verdict::Dropped(r)) = (in_record, verdict) {
            let note = &mut self.captured[i].note;
            note.push_str(&format!("; dropped: {}", r.name()));
            // A policy denial names what denied it.
            if let Some(e) = trace
                .events
                .iter()
                .rev()
                .find(|e| e.stage() == Stage::Policy)
            {
                note.push_str(&format!(" ({e})"));
            }
        }

        if let Some(summary) = in_summary {
            let t = &self.recording;
            let record = TracedPacket {
                time_ns: now,
                in_port: self.name(in_id).to_string(),
                summary,
                stages: t
                    .events
                    .iter()
                    .map(|e| (e.stage().name().to_string(), e.to_string()))
                    .collect(),
                events: t.events.clone(),
                verdict: match verdict {
                    Verdict::Dropped(r) => format!("dropped: {}", r.name()),
                    v => v.name().to_string(),
                },
                ct: t.ct_name().map(str::to_string),
                out: sent
                    .iter()
                    .map(|(id, p)| {
                        (
                            self.name(*id).to_string(),
                            summarize(pipeline.tables(), *id, &p.data),
                        )
                    })
                    .collect(),
            };
            self.traced.push(record);
            if let Some(t) = &mut self.trace {
                t.remaining -= 1;
                if t.remaining == 0 {
                    self.stop_trace();
                }
            }
        }

        let Some(c) = self.capture.take() else {
            return;
        };
        if let Some(cap_id) = c.id {
            for (id, p) in sent {
                let note = if captured_in {
                    format!(
                        "after ferry: to {} (received on {})",
                        self.name(*id),
                        self.name(in_id)
                    )
                } else if *id == cap_id && c.filter.matches(&p.data) {
                    format!("sent on {}", self.name(*id))
                } else {
                    continue;
                };
                let port = self.name(*id).to_string();
                let max = (c.max_buffered, c.max_bytes);
                self.record(max, now, Direction::Out, port, note, &p.data);
            }
        }
        self.capture = Some(c);
    }

    /// Keeps a copy of a frame, or counts it lost when `max` frames, or with it more
    /// than `max` bytes, would wait to be taken.
    fn record(
        &mut self,
        (max_frames, max_bytes): (usize, usize),
        now: u64,
        dir: Direction,
        port: String,
        note: String,
        data: &[u8],
    ) {
        if self.captured.len() >= max_frames || self.captured_bytes + data.len() > max_bytes {
            self.lost += 1;
            return;
        }
        self.captured_bytes += data.len();
        self.captured.push(Captured {
            time_ns: now,
            dir,
            port,
            note,
            data: data.to_vec(),
        });
    }
}
