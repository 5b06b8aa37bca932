//! The agent's local socket: [`ferry_api`] requests in, answers out.
//!
//! [`ApiServer::bind`] listens on a Unix stream socket that only root may use (the file is
//! made mode 0600 in a directory of mode 0700 when ferry creates it). Each connection
//! carries one request line and gets one answer line. The server thread does no work of
//! its own: it hands each request to whoever owns the agent (the `ferry agent` loop) over
//! [`ApiServer::requests`] and writes back what comes in return, so requests and cluster
//! changes are applied one at a time, in order.
//!
//! A request the owner has not taken within [`ANSWER_TIMEOUT`] is answered with code 11
//! ("the agent did not answer in time") and is then never carried out: the owner gets
//! nothing from [`Pending::take`] for it. So the client can take that answer for a
//! refusal (the CNI plugin releases an ADD's leases on it). A request taken in time is
//! answered whenever the owner is done with it.

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::Duration;

use ferry_api::{Request, Response};

use crate::accept::Acceptor;

/// Longest request line read.
const MAX_REQUEST: u64 = 64 * 1024;
/// Longest answer line [`call`] reads: a conntrack listing of
/// [`ferry_api::DEFAULT_CT_LIMIT`] connections takes a few MiB.
const MAX_ANSWER: u64 = 64 * 1024 * 1024;
/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request may wait for the agent to take it (a pod's interface is made in
/// well under a second; the margin covers a full compilation of a large cluster). A
/// request not taken by then is answered with code 11 and never carried out. Clients
/// wait longer than this (the CNI plugin 60 s), so that they get this answer rather
/// than time out not knowing whether the request was carried out.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// [`Pending::claim`]: neither taken nor abandoned yet.
const WAITING: u8 = 0;
/// Taken by the owner: it is carried out and answered.
const TAKEN: u8 = 1;
/// Its client was told the agent did not answer in time: it must not be carried out.
const ABANDONED: u8 = 2;

/// A request and where its answer goes, from [`ApiServer::requests`]: [`Pending::take`]
/// it before carrying it out.
#[derive(Debug)]
pub struct Pending {
    request: Request,
    answer: Sender<Response>,
    /// [`WAITING`], [`TAKEN`] or [`ABANDONED`], shared with the connection's thread.
    claim: Arc<AtomicU8>,
    /// A handover's connection, which its owner carries on with ([`Pending::take_conversation`]).
    conn: Option<UnixStream>,
}

impl Pending {
    /// The request and where its answer goes, to carry it out and answer it; or, when
    /// its client was answered already that the agent did not answer in time, the
    /// request as `Err`, which must not be carried out. Once taken, the client waits for
    /// the answer however long it takes.
    pub fn take(self) -> Result<(Request, Sender<Response>), Box<Request>> {
        self.take_conversation().map(|(r, a, _)| (r, a))
    }

    /// [`Pending::take`], with the connection of a [`Request::Handover`]: its owner
    /// talks on it, and nothing is written on it for the answer sent.
    #[allow(clippy::type_complexity)]
    pub fn take_conversation(
        self,
    ) -> Result<(Request, Sender<Response>, Option<UnixStream>), Box<Request>> {
        match self
            .claim
            .compare_exchange(WAITING, TAKEN, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok((self.request, self.answer, self.conn)),
            Err(_) => Err(Box::new(self.request)),
        }
    }
}

/// The listening socket and its thread; dropping it stops both and removes the socket
/// file.
pub struct ApiServer {
    path: PathBuf,
    acceptor: Option<Acceptor>,
    requests: Receiver<Pending>,
    /// The listening socket (the acceptor's is the same one), for a next agent to take
    /// over ([`ApiServer::listener`]) and to accept again after a pause.
    listener: UnixListener,
    tx: Sender<Pending>,
    answer_timeout: Duration,
}

impl ApiServer {
    /// Listens on `path`. A socket file left by an agent that is gone is replaced; one
    /// that an agent still answers on is an error (two agents on one node).
    pub fn bind(path: &Path) -> io::Result<ApiServer> {
        ApiServer::bind_with(path, ANSWER_TIMEOUT)
    }

    /// [`ApiServer::bind`], requests waiting `answer_timeout` to be taken.
    fn bind_with(path: &Path, answer_timeout: Duration) -> io::Result<ApiServer> {
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
            && !dir.exists()
        {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{}: another agent answers there", path.display()),
                ));
            }
            fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
        ApiServer::serve_on(path, listener, answer_timeout)
    }

    /// Serves on `listener`, the socket at `path` another agent listened on and handed
    /// over (`crate::handover`): connections queued on it meanwhile are answered now.
    pub fn from_listener(path: &Path, listener: UnixListener) -> io::Result<ApiServer> {
        ApiServer::serve_on(path, listener, ANSWER_TIMEOUT)
    }

    fn serve_on(
        path: &Path,
        listener: UnixListener,
        answer_timeout: Duration,
    ) -> io::Result<ApiServer> {
        listener.set_nonblocking(true)?;
        let (tx, requests) = mpsc::channel::<Pending>();
        let mut server = ApiServer {
            path: path.to_path_buf(),
            acceptor: None,
            requests,
            listener,
            tx,
            answer_timeout,
        };
        server.accept()?;
        Ok(server)
    }

    /// Starts accepting connections (again).
    pub fn accept(&mut self) -> io::Result<()> {
        if self.acceptor.is_some() {
            return Ok(());
        }
        let listener = self.listener.try_clone()?;
        let (tx, answer_timeout) = (self.tx.clone(), self.answer_timeout);
        self.acceptor = Some(Acceptor::spawn(
            "ferry-api".into(),
            move || listener.accept().map(|(c, _)| c),
            move |conn| {
                let tx = tx.clone();
                // One thread per connection: a slow client does not hold up the others.
                let _ = thread::Builder::new()
                    .name("ferry-api-conn".into())
                    .spawn(move || serve(conn, &tx, answer_timeout));
            },
        )?);
        Ok(())
    }

    /// Stops accepting connections: they wait in the socket's backlog, for
    /// [`ApiServer::accept`] or the agent the socket is handed over to.
    pub fn pause(&mut self) {
        drop(self.acceptor.take());
    }

    /// The listening socket, to hand over.
    pub fn listener(&self) -> &UnixListener {
        &self.listener
    }

    /// The requests, in arrival order; answer each on its sender.
    pub fn requests(&self) -> &Receiver<Pending> {
        &self.requests
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        // The loop stops before the socket file goes.
        drop(self.acceptor.take());
        let _ = fs::remove_file(&self.path);
    }
}

fn serve(conn: UnixStream, tx: &Sender<Pending>, answer_timeout: Duration) {
    let answer = match read_request(&conn).map_err(|e| *e) {
        Ok(request) => {
            let (answer, arx) = mpsc::channel();
            let claim = Arc::new(AtomicU8::new(WAITING));
            let handover = matches!(request, Request::Handover { .. });
            let pending = Pending {
                request,
                answer,
                claim: Arc::clone(&claim),
                conn: handover.then(|| conn.try_clone().ok()).flatten(),
            };
            if tx.send(pending).is_err() {
                Response::error(50, "the agent is stopping", "")
            } else {
                let r = wait_for_answer(&arx, &claim, answer_timeout);
                if handover && claim.load(Ordering::Acquire) == TAKEN {
                    // The conversation had the connection; nothing more goes on it.
                    return;
                }
                r
            }
        }
        Err(r) => r,
    };
    let mut w = &conn;
    if let Ok(mut line) = serde_json::to_string(&answer) {
        if line.len() as u64 >= MAX_ANSWER {
            // A client would read it cut off; it gets told instead.
            line = serde_json::to_string(&too_large(line.len())).unwrap_or_default();
        }
        line.push('\n');
        let _ = w.write_all(line.as_bytes());
        let _ = w.flush();
    }
}

/// The owner's answer to a request whose claim is `claim`; code 11 when the owner did
/// not take it within `timeout`, and then it never will ([`Pending::take`]).
fn wait_for_answer(arx: &Receiver<Response>, claim: &AtomicU8, timeout: Duration) -> Response {
    let stopped = || Response::error(11, "the agent stopped before answering", "");
    match arx.recv_timeout(timeout) {
        Ok(answer) => answer,
        Err(RecvTimeoutError::Disconnected) => stopped(),
        Err(RecvTimeoutError::Timeout) => {
            match claim.compare_exchange(WAITING, ABANDONED, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => Response::error(
                    11,
                    "the agent did not answer in time",
                    format!("not taken within {timeout:?}: the request is not carried out"),
                ),
                // Taken just in time: it is being carried out, its answer comes.
                Err(_) => arx.recv().unwrap_or_else(|_| stopped()),
            }
        }
    }
}

/// The answer in place of one of `len` bytes, more than [`call`] reads.
fn too_large(len: usize) -> Response {
    Response::error(
        5,
        "the answer is too large",
        format!(
            "{len} bytes, more than the {} MiB a client reads: ask for less (`ferry conntrack list --limit`, a narrower filter)",
            MAX_ANSWER >> 20
        ),
    )
}

fn read_request(conn: &UnixStream) -> Result<Request, Box<Response>> {
    let fail = |code, msg: &str, e: String| Box::new(Response::error(code, msg, e));
    conn.set_nonblocking(false)
        .and_then(|()| conn.set_read_timeout(Some(READ_TIMEOUT)))
        .map_err(|e| fail(5, "cannot read the request", e.to_string()))?;
    let mut line = String::new();
    BufReader::new(conn.take(MAX_REQUEST))
        .read_line(&mut line)
        .map_err(|e| fail(5, "cannot read the request", e.to_string()))?;
    if !line.ends_with('\n') && line.len() as u64 == MAX_REQUEST {
        return Err(fail(
            6,
            "the request is too large",
            format!("more than the {} KiB the agent reads", MAX_REQUEST >> 10),
        ));
    }
    serde_json::from_str(line.trim_end())
        .map_err(|e| fail(6, "cannot decode the request", e.to_string()))
}

/// Sends `req` to the agent listening on `path` and returns its answer. Only a failure
/// to connect has the connection's error kind (`NotFound`, `ConnectionRefused`,
/// `PermissionDenied`): a request too large for the agent is `InvalidInput`, an answer
/// that cannot be read `InvalidData`, each saying so.
pub fn call(path: &Path, req: &Request) -> io::Result<Response> {
    let mut line = serde_json::to_string(req).map_err(io::Error::other)?;
    line.push('\n');
    if line.len() as u64 > MAX_REQUEST {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the request takes {} bytes, more than the {} KiB the agent reads (fewer frames in a --pcap?)",
                line.len(),
                MAX_REQUEST >> 10
            ),
        ));
    }
    let mut conn = UnixStream::connect(path)?;
    // Longer than a request waits to be taken, so that a busy agent's answer arrives.
    conn.set_read_timeout(Some(ANSWER_TIMEOUT * 2))?;
    let talk = |e: io::Error| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("talking to the agent: {e}"),
        )
    };
    conn.write_all(line.as_bytes()).map_err(talk)?;
    let mut back = String::new();
    BufReader::new(conn.take(MAX_ANSWER))
        .read_line(&mut back)
        .map_err(talk)?;
    serde_json::from_str(back.trim_end()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the agent's answer cannot be read: {e}"),
        )
    })
}

/// True when `e`, from [`call`], means that nothing answers at the socket.
pub fn no_agent(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_api::Answer;

    /// Only a socket nobody listens on is "no agent"; a request larger than the agent
    /// reads is refused before anything is sent, and an answer larger than a client
    /// reads becomes an error that says so.
    #[test]
    fn failures_say_what_failed() {
        let dir = tempfile::tempdir().unwrap();
        let nobody = dir.path().join("nobody.sock");
        let e = call(&nobody, &Request::Status).unwrap_err();
        assert!(no_agent(&e), "{e}");
        let big = Request::Trace {
            in_port: "uplink".into(),
            packet: None,
            frames: Some(vec!["00".repeat(40_000)]),
            reply: false,
        };
        let e = call(&nobody, &big).unwrap_err();
        assert!(!no_agent(&e), "{e}");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("more than the 64 KiB"), "{e}");
        let Response::Error(t) = too_large(70 << 20) else {
            panic!("an error");
        };
        assert!(
            t.msg.contains("too large") && t.details.contains("--limit"),
            "{t:?}"
        );
    }

    #[test]
    fn requests_reach_the_owner_and_answers_the_client() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/ferry.sock");
        let server = ApiServer::bind(&path).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "root only");
        let owner = thread::spawn(move || {
            let (req, tx) = server.requests().recv().unwrap().take().unwrap();
            assert_eq!(req, Request::Status);
            tx.send(Response::Ok(Answer::default())).unwrap();
            server
        });
        assert_eq!(
            call(&path, &Request::Status).unwrap(),
            Response::Ok(Answer::default())
        );
        let server = owner.join().unwrap();
        // A second agent on the same socket is refused while the first one answers.
        let e = ApiServer::bind(&path).err().expect("refused");
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        drop(server);
        assert!(!path.exists(), "the socket file goes with the server");
    }

    /// A request the owner does not take in time is answered with code 11 and never
    /// handed over for carrying out; one taken in time is answered however long it
    /// takes.
    #[test]
    fn a_request_not_taken_in_time_is_refused_and_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ferry.sock");
        let server = ApiServer::bind_with(&path, Duration::from_millis(200)).unwrap();
        let del = Request::Del {
            container_id: "c1".into(),
            ifname: "eth0".into(),
        };
        match call(&path, &del).unwrap() {
            Response::Error(e) => {
                assert_eq!(e.code, 11, "{e:?}");
                assert!(e.details.contains("not carried out"), "{e:?}");
            }
            other => panic!("{other:?}"),
        }
        // The owner, busy until now, finds the request abandoned.
        let pending = server.requests().recv().unwrap();
        assert_eq!(*pending.take().unwrap_err(), del);

        // Taken in time, answered late: the client gets the answer.
        let client = {
            let path = path.clone();
            thread::spawn(move || call(&path, &Request::Status).unwrap())
        };
        let (req, tx) = server.requests().recv().unwrap().take().unwrap();
        assert_eq!(req, Request::Status);
        thread::sleep(Duration::from_millis(400));
        tx.send(Response::Ok(Answer::default())).unwrap();
        assert_eq!(client.join().unwrap(), Response::Ok(Answer::default()));
    }

    #[test]
    fn a_request_that_is_not_json_gets_a_decode_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ferry.sock");
        let _server = ApiServer::bind(&path).unwrap();
        let mut c = UnixStream::connect(&path).unwrap();
        c.write_all(b"{\"op\": \"launch\"}\n").unwrap();
        let mut back = String::new();
        BufReader::new(c).read_line(&mut back).unwrap();
        let r: Response = serde_json::from_str(&back).unwrap();
        match r {
            Response::Error(e) => assert_eq!(e.code, 6, "{e:?}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_stale_socket_file_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ferry.sock");
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let _server = ApiServer::bind(&path).unwrap();
    }
}
