//! One accept loop for the agent's small servers (the API socket, health check node
//! ports, metrics): a thread that polls a non-blocking listener and hands each
//! connection on, until the [`Acceptor`] is dropped.

use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ferry_linux::tcp;

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

/// Listens on `addr` for an HTTP server of the agent: an IPv6 address takes IPv4 too,
/// whatever the host's default ([`ferry_linux::tcp::listen`]); the IPv6 wildcard falls
/// back to the IPv4 one on a host without IPv6 (the error is the IPv6 one when both
/// fail). A listener for `addr` that the previous agent handed over ([`inherit`]) is
/// taken instead of a new one. The listener is known to [`live_listeners`] while it
/// lives, to be handed over in turn.
pub(crate) fn listen(addr: SocketAddr) -> io::Result<Arc<TcpListener>> {
    let inherited = {
        let mut held = lock(&INHERITED);
        let i = held.iter().position(|(a, _)| *a == addr);
        i.map(|i| held.swap_remove(i).1)
    };
    let listener = match inherited {
        Some(l) => l,
        None => tcp::listen(addr).or_else(|e| match addr.ip() {
            IpAddr::V6(ip) if ip.is_unspecified() => {
                tcp::listen(SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()))).map_err(|_| e)
            }
            _ => Err(e),
        })?,
    };
    let listener = Arc::new(listener);
    if addr.port() != 0 {
        let mut live = lock(&LIVE);
        live.retain(|(_, l)| l.strong_count() > 0);
        live.push((addr, Arc::downgrade(&listener)));
    }
    Ok(listener)
}

/// The listeners [`listen`] made that are still open, by the address asked for (those
/// of port 0 left out: a next agent picks a port of its own for those).
static LIVE: Mutex<Vec<(SocketAddr, Weak<TcpListener>)>> = Mutex::new(Vec::new());

/// Listeners handed over by the previous agent, until [`listen`] takes them.
static INHERITED: Mutex<Vec<(SocketAddr, TcpListener)>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The listeners open now, by the address each was asked for, to hand over.
pub(crate) fn live_listeners() -> Vec<(SocketAddr, Arc<TcpListener>)> {
    lock(&LIVE)
        .iter()
        .filter_map(|(a, l)| Some((*a, l.upgrade()?)))
        .collect()
}

/// Listeners the previous agent handed over, for [`listen`] to take; those still here
/// after the agent started are closed by [`drop_inherited`].
pub(crate) fn inherit(listeners: Vec<(SocketAddr, TcpListener)>) {
    lock(&INHERITED).extend(listeners);
}

/// Closes the handed-over listeners no server took (the port is not served any more).
pub(crate) fn drop_inherited() -> Vec<SocketAddr> {
    lock(&INHERITED).drain(..).map(|(a, _)| a).collect()
}

/// Connections an HTTP server of the agent (a health check node port, metrics) serves at
/// once, each on a thread of its own ([`Limiter`]).
pub(crate) const MAX_CONNECTIONS: usize = 16;

/// Threads an HTTP server runs at most: its [`MAX_CONNECTIONS`] places, and the threads of
/// connections it cut off that have not ended yet (each ends as soon as its read sees
/// the shutdown).
const MAX_THREADS: usize = 2 * MAX_CONNECTIONS;

/// How long an HTTP client has to send its whole request head, however slowly it
/// sends it.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest request head read; the rest is not read.
pub(crate) const MAX_HEAD: usize = 8192;

/// The connections one HTTP server serves, at most [`MAX_CONNECTIONS`] at once, each on a
/// thread of its own that is waited for by no one: it ends when its connection is
/// answered, which the timeouts of [`read_head`] and [`write_timeout`] bound, so that
/// stopping a server never waits on a client.
///
/// A connection that finds every place taken does not simply lose: the oldest connection
/// still sending its request head, of the source holding the most places, is shut down
/// unanswered and gives its place. So idle or slow clients, however many, cannot keep a
/// load balancer's probe from its answer: only connections being answered keep their
/// places, and a health check's answer is written at once (each write bounded by
/// [`write_timeout`]). Taking places from the source holding the most first keeps one
/// client from cutting off the others' probes.
#[derive(Default)]
pub(crate) struct Limiter {
    places: Arc<Mutex<Places>>,
}

#[derive(Default)]
struct Places {
    /// The id of the next connection (ids grow with age).
    next: u64,
    /// The connections holding places, oldest first.
    held: Vec<Place>,
    /// Threads running, including those of connections shut down.
    threads: usize,
}

struct Place {
    id: u64,
    source: IpAddr,
    /// Its request head is read: it is being answered, and keeps its place.
    answering: bool,
    /// The connection, to shut it down while its head is still coming.
    conn: TcpStream,
}

impl Places {
    /// Marks connection `id` as being answered; false when it lost its place meanwhile.
    fn answering(&mut self, id: u64) -> bool {
        match self.held.iter_mut().find(|p| p.id == id) {
            Some(p) => {
                p.answering = true;
                true
            }
            None => false,
        }
    }
}

/// Which of the connections `held` (their source, and whether they are being answered;
/// oldest first) gives its place to a new one: the oldest not being answered of the
/// source holding the most places; None when all are being answered.
fn victim(held: &[(IpAddr, bool)]) -> Option<usize> {
    let places_of = |src: IpAddr| held.iter().filter(|(s, _)| *s == src).count();
    held.iter()
        .enumerate()
        .filter(|(_, (_, answering))| !answering)
        // The first of the largest: max_by_key keeps the last of equals, hence the
        // reversed index.
        .max_by_key(|&(i, &(src, _))| (places_of(src), std::cmp::Reverse(i)))
        .map(|(i, _)| i)
}

impl Limiter {
    /// No connections yet.
    pub(crate) fn new() -> Limiter {
        Limiter::default()
    }

    /// Serves `conn` on a thread of its own named `name`: reads its request head
    /// ([`read_head`]) and hands it to `answer` with the connection, whose writes
    /// [`write_timeout`] bounds. When every place is taken, a connection still sending
    /// its head gives its place (see [`Limiter`]); when all are being answered, or
    /// [`MAX_THREADS`] threads still run, `conn` is closed unanswered and the result is
    /// false.
    pub(crate) fn serve(
        &self,
        conn: TcpStream,
        name: &str,
        answer: impl FnOnce(&TcpStream, &[u8]) -> io::Result<()> + Send + 'static,
    ) -> bool {
        let Ok(source) = conn.peer_addr().map(|a| a.ip().to_canonical()) else {
            return false;
        };
        let Ok(handle) = conn.try_clone() else {
            return false;
        };
        let id = {
            let mut p = self.places.lock().unwrap_or_else(PoisonError::into_inner);
            if p.threads >= MAX_THREADS {
                return false;
            }
            if p.held.len() >= MAX_CONNECTIONS {
                let held: Vec<(IpAddr, bool)> =
                    p.held.iter().map(|h| (h.source, h.answering)).collect();
                let Some(i) = victim(&held) else {
                    return false;
                };
                // Its read returns at once; its thread ends without answering.
                let _ = p.held.remove(i).conn.shutdown(Shutdown::Both);
            }
            let id = p.next;
            p.next += 1;
            p.held.push(Place {
                id,
                source,
                answering: false,
                conn: handle,
            });
            p.threads += 1;
            id
        };
        /// Gives the place (when still held) and the thread back, also when the thread
        /// did not start or panicked.
        struct Release(Arc<Mutex<Places>>, u64);
        impl Drop for Release {
            fn drop(&mut self) {
                let mut p = self.0.lock().unwrap_or_else(PoisonError::into_inner);
                p.held.retain(|h| h.id != self.1);
                p.threads -= 1;
            }
        }
        let release = Release(Arc::clone(&self.places), id);
        thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let Ok(head) = read_head(&conn) else {
                    return;
                };
                let places = Arc::clone(&release.0);
                if !places
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .answering(id)
                {
                    return;
                }
                let _ = write_timeout(&conn).and_then(|()| answer(&conn, &head));
                drop(release);
            })
            .is_ok()
    }

    /// The connections holding places now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.places
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .held
            .len()
    }
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

    /// A server on 127.0.0.1 answering `ok` to every head, through a [`Limiter`]; the
    /// handler waits for `gate` before it answers, when there is one.
    fn server(gate: Option<Arc<std::sync::Barrier>>) -> (Acceptor, Arc<Limiter>, u16) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        l.set_nonblocking(true).unwrap();
        let limiter = Arc::new(Limiter::new());
        let lim = Arc::clone(&limiter);
        let acceptor = Acceptor::spawn(
            "t".into(),
            move || l.accept().map(|(c, _)| c),
            move |conn| {
                let gate = gate.clone();
                lim.serve(conn, "t-conn", move |mut c, _| {
                    if let Some(g) = gate {
                        g.wait();
                    }
                    c.write_all(b"ok")
                });
            },
        )
        .unwrap();
        (acceptor, limiter, port)
    }

    fn wait_held(limiter: &Limiter, n: usize) {
        let t0 = Instant::now();
        while limiter.held() != n {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "{} connections held, not {n}",
                limiter.held()
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// What the server sent on `c` until it closed, or the error.
    fn answer(mut c: TcpStream) -> io::Result<String> {
        c.set_read_timeout(Some(Duration::from_secs(3)))?;
        let mut s = String::new();
        c.read_to_string(&mut s)?;
        Ok(s)
    }

    #[test]
    fn idle_connections_give_their_places_oldest_first() {
        let (_server, limiter, port) = server(None);
        let idle: Vec<TcpStream> = (0..MAX_CONNECTIONS)
            .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
            .collect();
        wait_held(&limiter, MAX_CONNECTIONS);
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let t0 = Instant::now();
        assert_eq!(answer(c).unwrap(), "ok");
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        // The oldest idle one was closed unanswered; the next one still has its place
        // and is answered once it sends its head.
        let mut idle = idle.into_iter();
        assert_eq!(answer(idle.next().unwrap()).unwrap(), "");
        let mut next = idle.next().unwrap();
        next.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(answer(next).unwrap(), "ok");
    }

    #[test]
    fn connections_being_answered_keep_their_places() {
        let gate = Arc::new(std::sync::Barrier::new(MAX_CONNECTIONS + 1));
        let (_server, limiter, port) = server(Some(Arc::clone(&gate)));
        let busy: Vec<TcpStream> = (0..MAX_CONNECTIONS)
            .map(|_| {
                let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
                c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
                c
            })
            .collect();
        wait_held(&limiter, MAX_CONNECTIONS);
        // Every place is being answered: one more is closed at once, unanswered.
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _ = c.write_all(b"GET / HTTP/1.1\r\n\r\n");
        assert!(answer(c).unwrap_or_default().is_empty());
        gate.wait();
        for c in busy {
            assert_eq!(answer(c).unwrap(), "ok");
        }
        wait_held(&limiter, 0);
    }

    #[test]
    fn the_source_holding_most_places_gives_one_first() {
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        // The oldest is a's, but b holds more.
        assert_eq!(victim(&[(a, false), (b, false), (b, false)]), Some(1));
        // Of equal holders, the oldest.
        assert_eq!(victim(&[(b, false), (a, false)]), Some(0));
        // Connections being answered keep theirs, whoever holds them.
        assert_eq!(victim(&[(a, false), (b, true), (b, true)]), Some(0));
        assert_eq!(victim(&[(a, true), (b, true)]), None);
        assert_eq!(victim(&[]), None);
    }
}
