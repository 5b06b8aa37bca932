//! The agent's local socket: [`ferry_api`] requests in, answers out.
//!
//! [`ApiServer::bind`] listens on a Unix stream socket that only root may use (the file is
//! made mode 0600 in a directory of mode 0700 when ferry creates it). Each connection
//! carries one request line and gets one answer line. The server thread does no work of
//! its own: it hands each request to whoever owns the agent (the `ferry agent` loop) over
//! [`ApiServer::requests`] and writes back what comes in return, so requests and cluster
//! changes are applied one at a time, in order.

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
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
/// How long a request may wait for the agent's answer (a pod's interface is made in
/// well under a second; the margin covers a full compilation of a large cluster).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// A request and where its answer goes.
pub type Pending = (Request, Sender<Response>);

/// The listening socket and its thread; dropping it stops both and removes the socket
/// file.
pub struct ApiServer {
    path: PathBuf,
    acceptor: Option<Acceptor>,
    requests: Receiver<Pending>,
}

impl ApiServer {
    /// Listens on `path`. A socket file left by an agent that is gone is replaced; one
    /// that an agent still answers on is an error (two agents on one node).
    pub fn bind(path: &Path) -> io::Result<ApiServer> {
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
        listener.set_nonblocking(true)?;
        let (tx, requests) = mpsc::channel::<Pending>();
        let acceptor = Acceptor::spawn(
            "ferry-api".into(),
            move || listener.accept().map(|(c, _)| c),
            move |conn| {
                let tx = tx.clone();
                // One thread per connection: a slow client does not hold up the others.
                let _ = thread::Builder::new()
                    .name("ferry-api-conn".into())
                    .spawn(move || serve(conn, &tx));
            },
        )?;
        Ok(ApiServer {
            path: path.to_path_buf(),
            acceptor: Some(acceptor),
            requests,
        })
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

fn serve(conn: UnixStream, tx: &Sender<Pending>) {
    let answer = match read_request(&conn).map_err(|e| *e) {
        Ok(req) => {
            let (atx, arx) = mpsc::channel();
            if tx.send((req, atx)).is_err() {
                Response::error(50, "the agent is stopping", "")
            } else {
                arx.recv_timeout(ANSWER_TIMEOUT)
                    .unwrap_or_else(|_| Response::error(11, "the agent did not answer in time", ""))
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
    conn.set_read_timeout(Some(ANSWER_TIMEOUT + READ_TIMEOUT))?;
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
            let (req, tx) = server.requests().recv().unwrap();
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
