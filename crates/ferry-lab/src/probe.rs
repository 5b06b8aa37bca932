//! UDP clients the checks run inside the lab's namespaces (`ferry lab probe-udp`):
//! datagrams of given sizes echoed back byte for byte, a question (`hostname`,
//! `clientip`) answered, a steady stream counted while a server is replaced, a flow of
//! numbered requests counted while an agent restarts, and a watch that stamps each
//! answer (when a restarted node forwards again).

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// `len` bytes that do not repeat at short periods, so a misplaced fragment shows.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| ((i ^ seed).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

fn socket(to: SocketAddr, timeout: Duration) -> Result<UdpSocket> {
    let any: SocketAddr = if to.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let s = UdpSocket::bind(any)?;
    s.connect(to)?;
    s.set_read_timeout(Some(timeout))?;
    Ok(s)
}

/// Sends one datagram of each size and requires each back unchanged (three tries each:
/// the first may wait for neighbour resolution).
pub fn echo(to: SocketAddr, sizes: &[usize]) -> Result<()> {
    let s = socket(to, Duration::from_millis(700))?;
    let mut buf = vec![0u8; 65536];
    for (i, &size) in sizes.iter().enumerate() {
        let data = pattern(size, i as u32 + 1);
        let mut ok = false;
        for _ in 0..3 {
            s.send(&data)?;
            // A stale answer from an earlier try is skipped by comparing.
            while let Ok(n) = s.recv(&mut buf) {
                if buf[..n] == data[..] {
                    ok = true;
                    break;
                }
            }
            if ok {
                break;
            }
        }
        if !ok {
            bail!("no intact echo of a {size}-byte datagram from {to}");
        }
    }
    Ok(())
}

/// Sends `question` and returns the answer.
pub fn ask(to: SocketAddr, question: &str) -> Result<String> {
    let s = socket(to, Duration::from_millis(700))?;
    let mut buf = [0u8; 2048];
    for _ in 0..3 {
        s.send(question.as_bytes())?;
        if let Ok(n) = s.recv(&mut buf) {
            return Ok(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    bail!("no answer to {question:?} from {to}")
}

/// Asks `hostname` every 50 ms for `secs` seconds from one socket (one connection for
/// the dataplane); prints and returns the answers in order, with the longest silence.
pub fn stream(to: SocketAddr, secs: u64) -> Result<(Vec<String>, Duration)> {
    let s = socket(to, Duration::from_millis(50))?;
    let start = Instant::now();
    let mut last = Instant::now();
    let mut longest = Duration::ZERO;
    let mut answers: Vec<String> = Vec::new();
    let mut buf = [0u8; 2048];
    while start.elapsed() < Duration::from_secs(secs) {
        s.send(b"hostname").context("sending")?;
        let sent = Instant::now();
        while sent.elapsed() < Duration::from_millis(50) {
            if let Ok(n) = s.recv(&mut buf) {
                let a = String::from_utf8_lossy(&buf[..n]).into_owned();
                if answers.last() != Some(&a) {
                    answers.push(a);
                }
                longest = longest.max(last.elapsed());
                last = Instant::now();
            }
        }
    }
    longest = longest.max(last.elapsed());
    Ok((answers, longest))
}

/// Sends `hostname` every `every` until `stop` says so (at most [`WATCH_LIMIT`]),
/// writing to `out` a line `sending` once the first is sent, then for each answer the
/// Unix time of its arrival in microseconds: how [`crate::restart`] sees when a node
/// forwards again.
pub fn watch(
    to: SocketAddr,
    every: Duration,
    out: &mut dyn std::io::Write,
    stop: &dyn Fn() -> bool,
) -> Result<()> {
    let s = socket(to, every)?;
    let start = Instant::now();
    let mut buf = [0u8; 2048];
    let mut said = false;
    while !stop() && start.elapsed() < WATCH_LIMIT {
        // Refused (an ICMP error while nothing forwards) is no answer: go on.
        let _ = s.send(b"hostname");
        if !said {
            writeln!(out, "sending")?;
            said = true;
        }
        let sent = Instant::now();
        while sent.elapsed() < every {
            if s.recv(&mut buf).is_ok() {
                writeln!(out, "{}", crate::agents::now_us())?;
            }
        }
    }
    Ok(())
}

/// The longest a [`watch`] runs.
pub const WATCH_LIMIT: Duration = Duration::from_secs(60);

/// What a [`flow`] saw.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FlowReport {
    /// Requests sent.
    pub sent: u32,
    /// Of them, answered.
    pub answered: u32,
    /// Of the last [`TAIL`] sent, answered: the flow still goes at its end.
    pub answered_at_end: u32,
    /// The longest time between two answers, in milliseconds.
    pub longest_gap_ms: u64,
}

/// The requests at a flow's end that say whether it still goes.
pub const TAIL: u32 = 25;

/// How long a [`flow`] waits for late answers after its last request.
const LINGER: Duration = Duration::from_millis(500);

/// Sends `count` numbered datagrams to the echo server `to`, one every `every`, from
/// one socket (one connection for the dataplane), and counts those echoed back.
pub fn flow(to: SocketAddr, count: u32, every: Duration) -> Result<FlowReport> {
    let s = socket(to, Duration::from_millis(2))?;
    let mut answered = vec![false; count as usize];
    let mut buf = [0u8; 64];
    let start = Instant::now();
    let (mut last, mut longest) = (None::<Instant>, Duration::ZERO);
    let mut note = |buf: &[u8], answered: &mut [bool]| {
        let seq = std::str::from_utf8(buf)
            .ok()
            .and_then(|t| t.strip_prefix("flow "))
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(seq) = seq.filter(|&q| q < answered.len() && !answered[q]) {
            answered[seq] = true;
            let now = Instant::now();
            if let Some(l) = last {
                longest = longest.max(now - l);
            }
            last = Some(now);
        }
    };
    for seq in 0..count {
        let _ = s.send(format!("flow {seq}").as_bytes());
        let next = start + every * (seq + 1);
        while Instant::now() < next {
            if let Ok(n) = s.recv(&mut buf) {
                note(&buf[..n], &mut answered);
            }
        }
    }
    let end = Instant::now() + LINGER;
    while Instant::now() < end {
        if let Ok(n) = s.recv(&mut buf) {
            note(&buf[..n], &mut answered);
        }
    }
    let tail = count.saturating_sub(TAIL) as usize;
    Ok(FlowReport {
        sent: count,
        answered: answered.iter().filter(|&&a| a).count() as u32,
        answered_at_end: answered[tail..].iter().filter(|&&a| a).count() as u32,
        longest_gap_ms: longest.as_millis() as u64,
    })
}
