//! `ferry lab boom-server`: the server of the e2e test "should drop INVALID conntrack
//! entries" (kubernetes#74839). It accepts TCP connections and, once each is
//! established, sends its client a segment far outside the receive window, from its own
//! address, as a spurious retransmission would arrive. A proxy whose connection
//! tracking lets such a segment through without undoing the connection's NAT hands the
//! client a segment of a connection it does not know, and the client answers with a
//! reset, which this server sees and counts. Passing means no reset: the segment was
//! dropped as invalid, or translated like the rest of the connection (the client then
//! only acknowledges it again).
//!
//! The segment is written by hand on a raw socket (no crate sends one crafted TCP
//! segment; the header and its checksum are a few lines).

use std::collections::HashMap;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// What a run saw.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// Connections established (the client's handshake ACK seen).
    pub established: u32,
    /// Out-of-window segments sent, one per connection.
    pub injected: u32,
    /// Resets from clients to the server's port.
    pub resets: u32,
}

/// The payload of the segment sent.
const PAYLOAD: &[u8] = b"boom!!!";
/// How far before the client's acknowledged sequence number the segment starts: far
/// outside any window.
const BEHIND: u32 = 100_000;

/// Serves on `port` for `secs` seconds (connections held 10 s each, as upstream's are)
/// and returns what it saw.
pub fn serve(port: u16, secs: u64) -> Result<Report> {
    let listener = TcpListener::bind(("0.0.0.0", port)).with_context(|| format!("TCP {port}"))?;
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut conn = conn;
                let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                let mut buf = [0u8; 256];
                let end = Instant::now() + Duration::from_secs(10);
                while Instant::now() < end {
                    match conn.read(&mut buf) {
                        Ok(0) => break,
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
            });
        }
    });
    let raw = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::TCP)).context("a raw socket")?;
    raw.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut report = Report::default();
    // Clients in their handshake, by address and port: their SYN's sequence number + 1.
    let mut opening: HashMap<SocketAddrV4, u32> = HashMap::new();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut buf = [0u8; 2048];
    while Instant::now() < end {
        let Ok(n) = (&raw).read(&mut buf) else {
            continue;
        };
        let Some(seg) = Segment::parse(&buf[..n]) else {
            continue;
        };
        if seg.dport != port {
            continue;
        }
        let from = SocketAddrV4::new(seg.src, seg.sport);
        if seg.flags & RST != 0 {
            report.resets += 1;
            eprintln!("ERROR: RST received from {from}");
        } else if seg.flags & SYN != 0 && seg.flags & ACK == 0 {
            opening.insert(from, seg.seq.wrapping_add(1));
        } else if seg.flags & ACK != 0 && opening.get(&from) == Some(&seg.seq) {
            opening.remove(&from);
            report.established += 1;
            eprintln!("connection established from {from}");
            let bad = segment(
                seg.dst,
                seg.src,
                port,
                seg.sport,
                seg.ack.wrapping_sub(BEHIND),
                seg.seq,
                PUSH | ACK,
                PAYLOAD,
            );
            let to = SockAddr::from(SocketAddr::V4(from));
            if raw.send_to(&bad, &to).is_ok() {
                report.injected += 1;
            }
        }
    }
    Ok(report)
}

const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const PUSH: u8 = 0x08;
const ACK: u8 = 0x10;

/// The parts of a received IPv4 TCP segment the server looks at.
struct Segment {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
}

impl Segment {
    /// An IPv4 packet (a raw socket's read: header included) holding a TCP segment.
    fn parse(p: &[u8]) -> Option<Segment> {
        let ihl = usize::from(*p.first()? & 0x0f) * 4;
        if *p.first()? >> 4 != 4 || p.get(9) != Some(&6) || ihl < 20 {
            return None;
        }
        let t = p.get(ihl..ihl + 20)?;
        let u32_at = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        Some(Segment {
            src: Ipv4Addr::new(p[12], p[13], p[14], p[15]),
            dst: Ipv4Addr::new(p[16], p[17], p[18], p[19]),
            sport: u16::from_be_bytes([t[0], t[1]]),
            dport: u16::from_be_bytes([t[2], t[3]]),
            seq: u32_at(&t[4..8]),
            ack: u32_at(&t[8..12]),
            flags: t[13],
        })
    }
}

/// A TCP segment (header without options, and `payload`) from `src`:`sport` to
/// `dst`:`dport`, its checksum over the IPv4 pseudo-header.
#[allow(clippy::too_many_arguments)]
fn segment(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut t = Vec::with_capacity(20 + payload.len());
    t.extend_from_slice(&sport.to_be_bytes());
    t.extend_from_slice(&dport.to_be_bytes());
    t.extend_from_slice(&seq.to_be_bytes());
    t.extend_from_slice(&ack.to_be_bytes());
    t.extend_from_slice(&[5 << 4, flags]);
    t.extend_from_slice(&64240u16.to_be_bytes());
    t.extend_from_slice(&[0, 0, 0, 0]);
    t.extend_from_slice(payload);
    let mut pseudo = Vec::with_capacity(12 + t.len());
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&(t.len() as u16).to_be_bytes());
    pseudo.extend_from_slice(&t);
    let sum = checksum(&pseudo);
    t[16..18].copy_from_slice(&sum.to_be_bytes());
    t
}

/// The Internet checksum of `data`.
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_sums_to_zero_with_its_pseudo_header_and_parses_back() {
        let (src, dst) = (Ipv4Addr::new(10, 244, 2, 5), Ipv4Addr::new(10, 244, 1, 7));
        let t = segment(src, dst, 9000, 40000, 5, 77, PUSH | ACK, PAYLOAD);
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&src.octets());
        pseudo.extend_from_slice(&dst.octets());
        pseudo.extend_from_slice(&[0, 6, 0, t.len() as u8]);
        pseudo.extend_from_slice(&t);
        assert_eq!(checksum(&pseudo), 0);
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 6, 0, 0];
        ip.extend_from_slice(&src.octets());
        ip.extend_from_slice(&dst.octets());
        ip.extend_from_slice(&t);
        let s = Segment::parse(&ip).unwrap();
        assert_eq!(
            (s.src, s.dst, s.sport, s.dport, s.seq, s.ack, s.flags),
            (src, dst, 9000, 40000, 5, 77, PUSH | ACK)
        );
        assert!(Segment::parse(&ip[..30]).is_none(), "a short segment");
    }
}
