//! UDP clients the checks run inside the lab's namespaces (`ferry lab probe-udp`):
//! datagrams of given sizes echoed back byte for byte, a question (`hostname`,
//! `clientip`) answered, or a steady stream counted while a server is replaced.

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
