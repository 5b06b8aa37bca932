//! A paced download the restart checks run inside a namespace (`ferry lab
//! probe-download`): `GET /bytes?n=N&rate=R` from a lab server (`ferry serve`), every
//! byte compared with the server's pattern, the longest wait between two reads timed.
//! It always reports (a [`Download`]); a connection that broke says how in `error`.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// What a download got.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Download {
    /// The server's name (its `X-Served-By`), once its headers came.
    pub served_by: Option<String>,
    /// Body bytes received, all of them as the pattern has them.
    pub bytes: u64,
    /// The bytes asked for.
    pub want: u64,
    /// The longest wait between two reads of the body, in milliseconds.
    pub longest_gap_ms: u64,
    /// Why it ended before all the bytes, if it did.
    pub error: Option<String>,
}

impl Download {
    /// Whether every byte came, as sent.
    pub fn complete(&self) -> bool {
        self.error.is_none() && self.bytes == self.want
    }
}

/// How long a download waits for a read before it calls the connection broken: longer
/// than any outage the checks allow, so that a stall is told from a break.
pub const STALL_LIMIT: Duration = Duration::from_secs(10);

/// Byte `i` of `ferry serve`'s `/bytes` pattern.
fn pattern_byte(i: u64) -> u8 {
    (i % 65536 % 251) as u8
}

/// Downloads `n` bytes at `rate` bytes per second from `to`'s `/bytes`, writing a line
/// `connected SERVER` to `progress` once the headers came (how the caller knows the
/// connection was established before whatever it does next).
pub fn download(to: SocketAddr, n: u64, rate: u64, progress: &mut dyn Write) -> Download {
    let mut got = Download {
        want: n,
        ..Download::default()
    };
    if let Err(e) = fetch(to, rate, &mut got, progress) {
        got.error = Some(e);
    }
    got
}

fn fetch(
    to: SocketAddr,
    rate: u64,
    got: &mut Download,
    progress: &mut dyn Write,
) -> Result<(), String> {
    let conn = TcpStream::connect_timeout(&to, Duration::from_secs(3))
        .map_err(|e| format!("connecting to {to}: {e}"))?;
    conn.set_read_timeout(Some(STALL_LIMIT))
        .map_err(|e| e.to_string())?;
    write!(
        &conn,
        "GET /bytes?n={}&rate={rate} HTTP/1.1\r\nHost: {to}\r\nConnection: close\r\n\r\n",
        got.want
    )
    .map_err(|e| format!("sending the request: {e}"))?;
    let mut r = BufReader::new(&conn);
    let mut status = String::new();
    r.read_line(&mut status)
        .map_err(|e| format!("reading the status line: {e}"))?;
    if !status.starts_with("HTTP/1.1 200") {
        return Err(format!("answered {:?}", status.trim_end()));
    }
    loop {
        let mut h = String::new();
        match r.read_line(&mut h) {
            Ok(0) => return Err("the headers did not end".into()),
            Ok(_) if h == "\r\n" => break,
            Ok(_) => {
                if let Some((k, v)) = h.split_once(':')
                    && k.eq_ignore_ascii_case("x-served-by")
                {
                    got.served_by = Some(v.trim().to_string());
                }
            }
            Err(e) => return Err(format!("reading the headers: {e}")),
        }
    }
    let by = got.served_by.as_deref().unwrap_or("?");
    let _ = writeln!(progress, "connected {by}");
    let _ = progress.flush();
    let mut buf = vec![0u8; 65536];
    let mut last = Instant::now();
    loop {
        let k = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => k,
            Err(e) => {
                got.longest_gap_ms = got.longest_gap_ms.max(last.elapsed().as_millis() as u64);
                if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
                    return Err(format!(
                        "stalled after {} bytes for {} s",
                        got.bytes,
                        STALL_LIMIT.as_secs()
                    ));
                }
                return Err(format!("after {} bytes: {e}", got.bytes));
            }
        };
        got.longest_gap_ms = got.longest_gap_ms.max(last.elapsed().as_millis() as u64);
        last = Instant::now();
        if let Some(i) = (0..k).find(|&i| buf[i] != pattern_byte(got.bytes + i as u64)) {
            return Err(format!(
                "byte {} differs from the pattern",
                got.bytes + i as u64
            ));
        }
        got.bytes += k as u64;
    }
    if got.bytes != got.want {
        return Err(format!("closed after {} of {} bytes", got.bytes, got.want));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server that answers one request with `body` under headers `head`.
    fn serve_once(head: &'static str, body: Vec<u8>) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            // The whole request: a server that closes with some of it unread resets the
            // connection, and the client may lose the end of the body to that.
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            c.write_all(head.as_bytes()).unwrap();
            c.write_all(&body).unwrap();
        });
        addr
    }

    fn pattern(n: u64) -> Vec<u8> {
        (0..n).map(pattern_byte).collect()
    }

    #[test]
    fn test_a_whole_download_is_complete_and_names_its_server() {
        let head = "HTTP/1.1 200 OK\r\nX-Served-By: multi-1\r\n\r\n";
        let to = serve_once(head, pattern(200_000));
        let mut progress = Vec::new();
        let d = download(to, 200_000, 1, &mut progress);
        assert!(d.complete(), "{d:?}");
        assert_eq!(d.served_by.as_deref(), Some("multi-1"));
        assert_eq!(String::from_utf8(progress).unwrap(), "connected multi-1\n");
    }

    #[test]
    fn test_a_short_or_wrong_body_is_not_complete() {
        let head = "HTTP/1.1 200 OK\r\n\r\n";
        let d = download(serve_once(head, pattern(1000)), 2000, 1, &mut Vec::new());
        assert_eq!(d.bytes, 1000);
        assert_eq!(d.error.as_deref(), Some("closed after 1000 of 2000 bytes"));
        assert!(!d.complete());
        let mut body = pattern(1000);
        body[700] ^= 1;
        let d = download(serve_once(head, body), 1000, 1, &mut Vec::new());
        assert_eq!(
            d.error.as_deref(),
            Some("byte 700 differs from the pattern")
        );
    }

    #[test]
    fn test_a_refusal_is_an_error() {
        let head = "HTTP/1.1 400 Bad Request\r\n\r\n";
        let d = download(serve_once(head, Vec::new()), 10, 1, &mut Vec::new());
        assert!(d.error.unwrap().contains("400"));
    }
}
