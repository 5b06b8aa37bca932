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
//! The segment goes out on a raw socket; etherparse writes its header and checksum and
//! reads the segments the raw socket receives.

use std::collections::HashMap;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use etherparse::{IpNumber, Ipv4Slice, TcpHeader, TcpHeaderSlice};
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
        if seg.rst {
            report.resets += 1;
            eprintln!("ERROR: RST received from {from}");
        } else if seg.syn && !seg.ack_flag {
            opening.insert(from, seg.seq.wrapping_add(1));
        } else if seg.ack_flag && opening.get(&from) == Some(&seg.seq) {
            opening.remove(&from);
            report.established += 1;
            eprintln!("connection established from {from}");
            let bad = segment(
                (seg.dst, port),
                (seg.src, seg.sport),
                seg.ack.wrapping_sub(BEHIND),
                seg.seq,
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

/// The parts of a received IPv4 TCP segment the server looks at.
struct Segment {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    syn: bool,
    ack_flag: bool,
    rst: bool,
}

impl Segment {
    /// An IPv4 packet (a raw socket's read: header included) holding a TCP segment.
    fn parse(p: &[u8]) -> Option<Segment> {
        let ip = Ipv4Slice::from_slice(p).ok()?;
        if ip.header().protocol() != IpNumber::TCP {
            return None;
        }
        let t = TcpHeaderSlice::from_slice(ip.payload().payload).ok()?;
        Some(Segment {
            src: ip.header().source_addr(),
            dst: ip.header().destination_addr(),
            sport: t.source_port(),
            dport: t.destination_port(),
            seq: t.sequence_number(),
            ack: t.acknowledgment_number(),
            syn: t.syn(),
            ack_flag: t.ack(),
            rst: t.rst(),
        })
    }
}

/// A TCP segment with PSH and ACK (header without options, and `payload`) from
/// `src`:`sport` to `dst`:`dport`, its checksum over the IPv4 pseudo-header.
fn segment(
    (src, sport): (Ipv4Addr, u16),
    (dst, dport): (Ipv4Addr, u16),
    seq: u32,
    ack: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut t = TcpHeader::new(sport, dport, seq, 64240);
    t.acknowledgment_number = ack;
    t.psh = true;
    t.ack = true;
    t.checksum = t
        .calc_checksum_ipv4_raw(src.octets(), dst.octets(), payload)
        .expect("a segment of a few bytes");
    let mut v = t.to_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;

    #[test]
    fn a_segment_has_its_checksum_right_and_parses_back() {
        let (src, dst) = (Ipv4Addr::new(10, 244, 2, 5), Ipv4Addr::new(10, 244, 1, 7));
        let t = segment((src, 9000), (dst, 40000), 5, 77, PAYLOAD);
        let h = TcpHeaderSlice::from_slice(&t).unwrap().to_header();
        assert_eq!(
            h.checksum,
            h.calc_checksum_ipv4_raw(src.octets(), dst.octets(), PAYLOAD)
                .unwrap()
        );
        assert_ne!(h.checksum, 0);
        assert!(h.psh && h.ack && !h.syn && !h.rst);
        assert_eq!(&t[20..], PAYLOAD);
        // As the raw socket reads a packet: the IPv4 header first.
        let mut ip = Vec::new();
        PacketBuilder::ipv4(src.octets(), dst.octets(), 64)
            .tcp(9000, 40000, 5, 1000)
            .syn()
            .write(&mut ip, &[])
            .unwrap();
        let s = Segment::parse(&ip).unwrap();
        assert_eq!(
            (
                s.src, s.dst, s.sport, s.dport, s.seq, s.syn, s.ack_flag, s.rst
            ),
            (src, dst, 9000, 40000, 5, true, false, false)
        );
        assert!(Segment::parse(&ip[..30]).is_none(), "a short segment");
        let mut udp = Vec::new();
        PacketBuilder::ipv4(src.octets(), dst.octets(), 64)
            .udp(9000, 40000)
            .write(&mut udp, &[0; 20])
            .unwrap();
        assert!(Segment::parse(&udp).is_none(), "not TCP");
    }
}
