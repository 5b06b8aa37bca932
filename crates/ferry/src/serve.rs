//! `ferry serve`: the test servers lab pods run, in the spirit of Kubernetes' agnhost
//! netexec. HTTP on TCP: `/hostname` (the name given), `/clientip` (the peer's
//! address, as the pod sees it), `/echo?msg=TEXT` (TEXT back), `/bytes?n=N` (N bytes of
//! a fixed pattern: large responses; `&rate=R`: paced at R bytes per second, a download
//! that lasts), `/healthz`; anything else 404. `/bytes` names the server in an
//! `X-Served-By` header. UDP echo on the
//! UDP port: each datagram comes back as it arrived (up to 65507 bytes, so fragmented
//! datagrams too), or, when it is `hostname` or `clientip`, that answer. Both listen on
//! every address, IPv4 and IPv6.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// Largest `/bytes` answer.
const MAX_BYTES: usize = 1 << 30;

/// Arguments of `ferry serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The name `/hostname` answers (the pod's name).
    #[arg(long)]
    pub name: String,
    /// TCP port of the HTTP server.
    #[arg(long, default_value_t = 8080)]
    pub http_port: u16,
    /// UDP port of the echo server (0: none).
    #[arg(long, default_value_t = 8081)]
    pub udp_port: u16,
}

/// Serves until killed.
pub fn run(args: &Args) -> Result<()> {
    let tcp = TcpListener::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, args.http_port)))
        .with_context(|| format!("listening on TCP port {}", args.http_port))?;
    if args.udp_port != 0 {
        let udp = UdpSocket::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, args.udp_port)))
            .with_context(|| format!("listening on UDP port {}", args.udp_port))?;
        let name = args.name.clone();
        thread::Builder::new()
            .name("udp-echo".into())
            .spawn(move || udp_echo(&udp, &name))?;
    }
    tracing::info!(http = args.http_port, udp = args.udp_port, "serving");
    for conn in tcp.incoming() {
        let Ok(conn) = conn else { continue };
        let name = args.name.clone();
        thread::spawn(move || {
            let _ = http(conn, &name);
        });
    }
    Ok(())
}

/// The address as the peer is seen, without the IPv4-mapped prefix.
fn peer_ip(a: SocketAddr) -> String {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => v6.ip().to_string(),
        },
        SocketAddr::V4(v4) => v4.ip().to_string(),
    }
}

fn udp_echo(sock: &UdpSocket, name: &str) {
    let mut buf = vec![0u8; 65536];
    loop {
        let Ok((n, peer)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let answer: Vec<u8> = match &buf[..n] {
            b"hostname" => name.as_bytes().to_vec(),
            b"clientip" => peer_ip(peer).into_bytes(),
            d => d.to_vec(),
        };
        let _ = sock.send_to(&answer, peer);
    }
}

fn http(conn: TcpStream, name: &str) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let peer = conn.peer_addr()?;
    let mut reader = BufReader::new(&conn);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    // Skip the headers.
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
    }
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let param = |k: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
            .map(str::to_string)
    };
    let mut w = &conn;
    let (status, body): (&str, Vec<u8>) = match path {
        "/hostname" => ("200 OK", name.as_bytes().to_vec()),
        "/clientip" => ("200 OK", peer_ip(peer).into_bytes()),
        "/healthz" => ("200 OK", b"ok".to_vec()),
        "/echo" => (
            "200 OK",
            decode(&param("msg").unwrap_or_default()).into_bytes(),
        ),
        "/bytes" => match (bytes_asked(&param("n")), rate_asked(&param("rate"))) {
            (Some(n), Some(rate)) => {
                write!(
                    w,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {n}\r\nX-Served-By: {name}\r\nConnection: close\r\n\r\n"
                )?;
                return send_pattern(&mut w, n, rate);
            }
            _ => (
                "400 Bad Request",
                b"n must be a byte count up to 1 GiB, rate (if given) bytes per second from 1"
                    .to_vec(),
            ),
        },
        _ => ("404 Not Found", b"not found".to_vec()),
    };
    write!(
        w,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    w.write_all(&body)?;
    w.flush()
}

/// `/bytes`'s `n`: a count up to [`MAX_BYTES`].
fn bytes_asked(n: &Option<String>) -> Option<usize> {
    n.as_deref()
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|&n| n <= MAX_BYTES)
}

/// `/bytes`'s `rate`: bytes per second from 1 (Some(None): unpaced when not given).
fn rate_asked(rate: &Option<String>) -> Option<Option<u64>> {
    match rate {
        None => Some(None),
        Some(r) => r.parse::<u64>().ok().filter(|&r| r > 0).map(Some),
    }
}

/// How often a paced `/bytes` writes: small slices keep its packets steady, as a
/// stream's are, so that a gap in them shows an outage of the path.
const PACE: Duration = Duration::from_millis(10);

/// Writes `n` bytes of the pattern (byte `i` is `i % 65536 % 251`), at `rate` bytes per
/// second when given.
fn send_pattern(w: &mut impl Write, n: usize, rate: Option<u64>) -> io::Result<()> {
    let chunk: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    let start = Instant::now();
    let mut sent = 0;
    while sent < n {
        let mut k = (n - sent).min(chunk.len() - sent % chunk.len());
        if let Some(rate) = rate {
            // The bytes due by now, at least one slice's worth: the pace holds on
            // average whatever the sleeps' lateness.
            let slice = (rate as u128 * PACE.as_micros() / 1_000_000).max(1) as usize;
            let due = (rate as u128 * start.elapsed().as_micros() / 1_000_000) as usize;
            k = k.min(slice.max(due.saturating_sub(sent)));
        }
        let off = sent % chunk.len();
        w.write_all(&chunk[off..off + k])?;
        sent += k;
        if rate.is_some() && sent < n {
            thread::sleep(PACE);
        }
    }
    w.flush()
}

/// `%XX` and `+` of a query value.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_decoded() {
        assert_eq!(decode("hello+world%21"), "hello world!");
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz"), "%zz");
    }

    #[test]
    fn mapped_ipv4_peers_read_as_ipv4() {
        let a: SocketAddr = "[::ffff:10.0.0.1]:5".parse().unwrap();
        assert_eq!(peer_ip(a), "10.0.0.1");
        let b: SocketAddr = "[fd00::1]:5".parse().unwrap();
        assert_eq!(peer_ip(b), "fd00::1");
    }
}
