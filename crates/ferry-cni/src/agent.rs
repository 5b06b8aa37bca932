//! The client side of the agent's socket ([`ferry_api`]): one request per connection,
//! a JSON object and a newline each way.

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ferry_api::{Request, Response};

/// How long the agent may take to answer. Creating an interface takes milliseconds;
/// this only bounds a hung agent, well within the runtime's own timeouts (kubelet
/// gives a sandbox four minutes). It is longer than the agent's own 30 s
/// (`ferry_agent::api::ANSWER_TIMEOUT`), after which the agent answers code 11 for a
/// request it has not taken and never carries that request out: so a busy agent's
/// answer arrives, and is a refusal, and only a hung agent leaves the plugin not
/// knowing whether the request was carried out.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The largest answer read: answers are a few hundred bytes, so anything near this is
/// not an answer.
const MAX_ANSWER: u64 = 1 << 20;

/// The agent, at its socket.
#[derive(Clone, Debug)]
pub struct Agent {
    socket: PathBuf,
    timeout: Duration,
}

/// Why a request got no answer.
#[derive(Debug)]
pub enum CallError {
    /// Nothing listens on the socket (it is missing, or connecting is refused): the
    /// agent is not running. The request was not sent.
    NotRunning(io::Error),
    /// Connecting failed otherwise (permissions, say). The request was not sent.
    Connect(io::Error),
    /// The connection failed or timed out after connecting: the agent may or may not
    /// have acted on the request.
    Io(io::Error),
    /// The answer is not a [`Response`]: the agent may or may not have acted.
    BadAnswer(String),
}

impl CallError {
    /// Whether the agent may have acted on the request.
    pub fn maybe_done(&self) -> bool {
        matches!(self, CallError::Io(_) | CallError::BadAnswer(_))
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::NotRunning(e) => write!(f, "the agent is not running: {e}"),
            CallError::Connect(e) => write!(f, "cannot connect to the agent: {e}"),
            CallError::Io(e) if is_timeout(e) => {
                write!(f, "the agent did not answer within {TIMEOUT:?}: {e}")
            }
            CallError::Io(e) => write!(f, "talking to the agent failed: {e}"),
            CallError::BadAnswer(why) => write!(f, "the agent's answer is not understood: {why}"),
        }
    }
}

/// Whether `e` is a socket timeout (a blocking read past its deadline).
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

impl Agent {
    /// The agent listening on `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Agent {
        Agent {
            socket: socket.into(),
            timeout: TIMEOUT,
        }
    }

    /// Its socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The directory where DELs are queued for the agent while it is not running
    /// ([`ferry_api::del_queue_dir`]).
    pub fn del_queue(&self) -> PathBuf {
        ferry_api::del_queue_dir(&self.socket)
    }

    /// Records the DEL of `container_id` on `ifname` in the agent's queue, for the agent
    /// to carry out when it runs again: the [`Request::Del`] as JSON, written to a
    /// temporary file in the queue directory, flushed to disk and renamed into place, so
    /// that the agent never reads half of one. The directory (mode 0700, as the socket's)
    /// is made if missing, but only next to the socket: when the socket's directory is
    /// missing, no agent ran since the node booted (it lives in `/run`), nothing of the
    /// container can be left with one, and nothing is queued (`Ok(None)`). Returns the
    /// queue file.
    pub fn queue_del(&self, container_id: &str, ifname: &str) -> io::Result<Option<PathBuf>> {
        let dir = self.del_queue();
        match self.socket.parent() {
            Some(parent) if parent.as_os_str().is_empty() || parent.is_dir() => {}
            _ => return Ok(None),
        }
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(e) => return Err(e),
        }
        let request = Request::Del {
            container_id: container_id.to_string(),
            ifname: ifname.to_string(),
        };
        let mut text = serde_json::to_vec(&request).expect("requests serialize");
        text.push(b'\n');
        let name = ferry_api::del_queue_name(container_id, ifname);
        let file = dir.join(&name);
        // The name is at most 255 bytes; the temporary one must fit as well.
        let mut tmp_name = format!(".{}.tmp", std::process::id());
        tmp_name.insert_str(1, &name[..name.len().min(255 - tmp_name.len())]);
        let tmp = dir.join(tmp_name);
        let written = (|| {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&text)?;
            f.sync_all()?;
            fs::rename(&tmp, &file)?;
            fs::File::open(&dir)?.sync_all()
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written.map(|()| Some(file))
    }

    /// Sends `request` and reads the answer.
    pub fn call(&self, request: &Request) -> Result<Response, CallError> {
        let mut stream = UnixStream::connect(&self.socket).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => CallError::NotRunning(e),
            _ => CallError::Connect(e),
        })?;
        stream
            .set_read_timeout(Some(self.timeout))
            .and_then(|()| stream.set_write_timeout(Some(self.timeout)))
            .map_err(CallError::Io)?;
        let mut line = serde_json::to_vec(request).expect("requests serialize");
        line.push(b'\n');
        stream.write_all(&line).map_err(CallError::Io)?;

        let mut answer = Vec::new();
        BufReader::new(stream.take(MAX_ANSWER))
            .read_until(b'\n', &mut answer)
            .map_err(CallError::Io)?;
        if answer.last() != Some(&b'\n') {
            return Err(if answer.is_empty() {
                CallError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the agent closed the connection without answering",
                ))
            } else {
                CallError::BadAnswer(format!("{} bytes without a newline", answer.len()))
            });
        }
        serde_json::from_slice(&answer).map_err(|e| {
            CallError::BadAnswer(format!(
                "{e}: {}",
                String::from_utf8_lossy(&answer).trim_end()
            ))
        })
    }
}
