//! One accept loop for the agent's small servers (the API socket, health check node
//! ports, metrics): a thread that polls a non-blocking listener and hands each
//! connection on, until the [`Acceptor`] is dropped.

use std::io::{self, Read};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long the loop waits when no connection is pending (bounds the time a drop
/// waits for the thread).
const IDLE: Duration = Duration::from_millis(20);

/// A running accept loop; dropping it stops the thread and waits for it.
pub(crate) struct Acceptor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Acceptor {
    /// Runs `accept` (a non-blocking listener's accept) on a thread named `name`; each
    /// connection goes to `handle`, on the same thread (a handler that may be slow
    /// spawns its own).
    pub(crate) fn spawn<C>(
        name: String,
        mut accept: impl FnMut() -> io::Result<C> + Send + 'static,
        mut handle: impl FnMut(C) + Send + 'static,
    ) -> io::Result<Acceptor> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = thread::Builder::new().name(name).spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match accept() {
                    Ok(conn) => handle(conn),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(IDLE),
                    Err(_) => thread::sleep(5 * IDLE),
                }
            }
        })?;
        Ok(Acceptor {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connections an HTTP server of the agent (a health check node port, metrics) serves at
/// once; more are closed at once, so that slow or idle clients cannot pile up threads.
pub(crate) const MAX_CONNECTIONS: usize = 16;

/// How long an HTTP client has to send its whole request head, however slowly it
/// sends it.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest request head read; the rest is not read.
pub(crate) const MAX_HEAD: usize = 8192;

/// Runs `serve` on a thread of its own, named `name`, unless `busy` already counts
/// [`MAX_CONNECTIONS`] running ones: then `serve` is dropped unrun (with the connection
/// it holds, which closes) and the answer is false. The thread is not waited for by
/// anyone: it ends when `serve` does, which the timeouts of [`read_head`] and
/// [`write_timeout`] bound, so that stopping a server never waits on a client.
pub(crate) fn serve_limited(
    busy: &Arc<AtomicUsize>,
    name: &str,
    serve: impl FnOnce() + Send + 'static,
) -> bool {
    if busy.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
        busy.fetch_sub(1, Ordering::AcqRel);
        return false;
    }
    struct Release(Arc<AtomicUsize>);
    impl Drop for Release {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::AcqRel);
        }
    }
    let release = Release(Arc::clone(busy));
    thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let _release = release;
            serve();
        })
        .is_ok()
}

/// Reads an HTTP request head from `conn`: up to the blank line that ends it, at most
/// [`MAX_HEAD`] bytes, within [`HEAD_TIMEOUT`] in all (a client sending a byte now and
/// then does not reset it). What came in time is returned, also when the client stopped
/// or the head was cut; a client that sent nothing in time is an error.
pub(crate) fn read_head(conn: &TcpStream) -> io::Result<Vec<u8>> {
    read_head_within(conn, HEAD_TIMEOUT)
}

fn read_head_within(conn: &TcpStream, timeout: Duration) -> io::Result<Vec<u8>> {
    conn.set_nonblocking(false)?;
    let deadline = Instant::now() + timeout;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while head.len() < MAX_HEAD && !ends_head(&head) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        conn.set_read_timeout(Some(left))?;
        let n = match (&*conn).read(&mut buf[..(MAX_HEAD - head.len()).min(1024)]) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                break;
            }
            Err(e) => return Err(e),
        };
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    if head.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no request within the time allowed",
        ));
    }
    Ok(head)
}

/// True when `head` holds the blank line that ends an HTTP request head.
fn ends_head(head: &[u8]) -> bool {
    head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n")
}

/// Bounds how long an answer may take to write: a client that does not read holds its
/// thread no longer than this.
pub(crate) fn write_timeout(conn: &TcpStream) -> io::Result<()> {
    conn.set_write_timeout(Some(HEAD_TIMEOUT))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        (client, server)
    }

    #[test]
    fn a_head_is_read_to_its_blank_line() {
        let (mut c, s) = pair();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let head = read_head(&s).unwrap();
        assert_eq!(head, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    }

    /// A client that sends a byte now and then, never ending its head, is cut off when
    /// the time for the whole head is up, not a read timeout after its last byte.
    #[test]
    fn a_trickling_client_gets_the_whole_head_time_not_more() {
        let (mut c, s) = pair();
        let sender = thread::spawn(move || {
            for _ in 0..30 {
                if c.write_all(b"G").is_err() {
                    break;
                }
                thread::sleep(Duration::from_millis(50));
            }
        });
        let t0 = Instant::now();
        let head = read_head_within(&s, Duration::from_millis(400)).unwrap();
        let took = t0.elapsed();
        assert!(took < Duration::from_millis(1000), "{took:?}");
        assert!(!head.is_empty() && head.len() < 30, "{}", head.len());
        drop(s);
        sender.join().unwrap();
    }

    #[test]
    fn a_head_without_end_is_cut_at_the_limit() {
        let (mut c, s) = pair();
        let sender = thread::spawn(move || {
            let _ = c.write_all(&vec![b'a'; 3 * MAX_HEAD]);
        });
        let head = read_head(&s).unwrap();
        assert_eq!(head.len(), MAX_HEAD);
        drop(s);
        sender.join().unwrap();
    }

    #[test]
    fn at_most_max_connections_are_served_at_once() {
        let busy = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(std::sync::Barrier::new(MAX_CONNECTIONS + 1));
        for _ in 0..MAX_CONNECTIONS {
            let g = Arc::clone(&gate);
            assert!(serve_limited(&busy, "t", move || {
                g.wait();
            }));
        }
        assert!(!serve_limited(&busy, "t", || panic!("not run")));
        gate.wait();
        // The threads end and give their places back.
        let t0 = Instant::now();
        while busy.load(Ordering::Acquire) != 0 {
            assert!(t0.elapsed() < Duration::from_secs(5));
            thread::sleep(Duration::from_millis(5));
        }
        assert!(serve_limited(&busy, "t", || {}));
    }
}
