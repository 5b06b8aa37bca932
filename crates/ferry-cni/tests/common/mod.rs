//! Runs the built `ferry-cni` as a container runtime does (a clean environment of
//! `CNI_*` variables, the configuration on standard input) against a fake agent: a
//! Unix socket served from a thread, answering `ferry_api` requests and recording
//! them. Everything lives in a temporary directory of the test's own.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use ferry_api::{Answer, Request, Response};
use serde_json::{Value, json};

/// What the fake agent does with a request.
#[expect(
    clippy::large_enum_variant,
    reason = "a handful per test: the size does not matter"
)]
pub enum Reply {
    /// Answers this.
    Answer(Response),
    /// Writes this line as it is (an answer that is no `Response`).
    Raw(String),
    /// Closes the connection without answering.
    HangUp,
}

type Script = dyn Fn(&Request) -> Reply + Send + Sync;

/// A fake agent on a Unix socket.
pub struct FakeAgent {
    socket: PathBuf,
    requests: Arc<Mutex<Vec<Request>>>,
    script: Arc<Mutex<Arc<Script>>>,
    stop: Arc<AtomicBool>,
    server: Option<thread::JoinHandle<()>>,
}

/// The node the fake agent serves: dual-stack, MTU 1450.
pub const POD_CIDRS: [&str; 2] = ["10.244.1.0/24", "fd00:10:244:1::/64"];

/// What a well-behaved agent answers, for a node with `pod_cidrs`.
pub fn good_agent(pod_cidrs: &[&str], request: &Request) -> Reply {
    Reply::Answer(Response::Ok(match request {
        Request::Node => Answer {
            node: Some("node-1".into()),
            pod_cidrs: pod_cidrs.iter().map(|c| c.to_string()).collect(),
            mtu: Some(1450),
            ..Answer::default()
        },
        Request::Add { addresses, .. } => {
            let v4 = addresses.iter().any(|a| !a.contains(':'));
            let v6 = addresses.iter().any(|a| a.contains(':'));
            let mut gateways = Vec::new();
            if v4 {
                gateways.push("169.254.1.1".parse().unwrap());
            }
            if v6 {
                gateways.push("fe80::1".parse().unwrap());
            }
            Answer {
                mac: Some("0a:58:0a:f4:01:02".into()),
                mtu: Some(1450),
                gateways,
                ..Answer::default()
            }
        }
        // DEL, CHECK, STATUS, GC and what the plugin never asks.
        _ => Answer::default(),
    }))
}

impl FakeAgent {
    /// An agent at `socket` answering as [`good_agent`] does for [`POD_CIDRS`].
    pub fn start(socket: &Path) -> FakeAgent {
        let listener = UnixListener::bind(socket).expect("bind the fake agent's socket");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let default: Arc<Script> = Arc::new(|r: &Request| good_agent(&POD_CIDRS, r));
        let script = Arc::new(Mutex::new(default));
        let stop = Arc::new(AtomicBool::new(false));
        let server = {
            let (requests, script, stop) = (requests.clone(), script.clone(), stop.clone());
            thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (requests, script) = (requests.clone(), script.clone());
                    // One thread per connection: concurrent plugins are served at once.
                    thread::spawn(move || serve(conn, &requests, &script));
                }
            })
        };
        FakeAgent {
            socket: socket.to_path_buf(),
            requests,
            script,
            stop,
            server: Some(server),
        }
    }

    /// Answers from now on with `script`.
    pub fn script(&self, script: impl Fn(&Request) -> Reply + Send + Sync + 'static) {
        *self.script.lock().unwrap() = Arc::new(script);
    }

    /// The requests received so far, in order, forgetting them.
    pub fn take_requests(&self) -> Vec<Request> {
        std::mem::take(&mut *self.requests.lock().unwrap())
    }
}

fn serve(conn: UnixStream, requests: &Mutex<Vec<Request>>, script: &Mutex<Arc<Script>>) {
    let mut line = String::new();
    let mut reader = BufReader::new(&conn);
    if reader.read_line(&mut line).is_err() || line.is_empty() {
        return;
    }
    let request: Request = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("the plugin sent {line:?}, not a Request: {e}"));
    assert!(line.ends_with('\n'), "a request ends with a newline");
    requests.lock().unwrap().push(request.clone());
    let script = script.lock().unwrap().clone();
    let text = match script(&request) {
        Reply::Answer(r) => serde_json::to_string(&r).unwrap(),
        Reply::Raw(text) => text,
        Reply::HangUp => return,
    };
    let mut conn = &conn;
    let _ = conn.write_all(format!("{text}\n").as_bytes());
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag; if the socket is gone
        // already, the thread is left blocked rather than the test.
        if UnixStream::connect(&self.socket).is_ok()
            && let Some(server) = self.server.take()
        {
            let _ = server.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// One run of the plugin.
#[derive(Debug)]
pub struct Run {
    /// Exit status.
    pub code: i32,
    /// Standard output, decoded (Null when empty).
    pub stdout: Value,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    /// Fails unless the run succeeded.
    pub fn ok(self) -> Run {
        assert_eq!(self.code, 0, "ferry-cni failed: {self:?}");
        self
    }

    /// The CNI error code, failing unless the run failed with an error object.
    pub fn error_code(&self) -> u64 {
        assert_ne!(self.code, 0, "ferry-cni succeeded: {self:?}");
        self.stdout["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("no error object: {self:?}"))
    }
}

/// A test's directory, fake agent and plugin runs.
pub struct Cni {
    /// Declared first so that it stops before its socket's directory goes.
    pub agent: Option<FakeAgent>,
    pub dir: tempfile::TempDir,
}

impl Cni {
    /// A directory with a fake agent listening in it.
    pub fn new() -> Cni {
        let dir = tempfile::tempdir().unwrap();
        let agent = FakeAgent::start(&dir.path().join("ferry.sock"));
        Cni {
            dir,
            agent: Some(agent),
        }
    }

    /// A directory with no agent listening.
    pub fn without_agent() -> Cni {
        Cni {
            dir: tempfile::tempdir().unwrap(),
            agent: None,
        }
    }

    /// The fake agent.
    pub fn agent(&self) -> &FakeAgent {
        self.agent.as_ref().expect("this test has an agent")
    }

    /// The network configuration in `version`, the socket and leases in the test's
    /// directory.
    pub fn conf(&self, version: &str) -> Value {
        json!({
            "cniVersion": version,
            "name": "ferry",
            "type": "ferry-cni",
            "socket": self.dir.path().join("ferry.sock"),
            "dataDir": self.dir.path().join("leases"),
        })
    }

    /// The lease directory.
    pub fn leases(&self) -> PathBuf {
        self.dir.path().join("leases/ferry")
    }

    /// The leased addresses and their files' contents, sorted.
    pub fn lease_files(&self) -> Vec<(String, String)> {
        let Ok(dir) = std::fs::read_dir(self.leases()) else {
            return Vec::new();
        };
        let mut out: Vec<(String, String)> = dir
            .map(|e| e.unwrap())
            .filter_map(|e| {
                let name = e.file_name().into_string().unwrap();
                name.parse::<std::net::IpAddr>().ok()?;
                Some((name, std::fs::read_to_string(e.path()).unwrap()))
            })
            .collect();
        out.sort();
        out
    }
}

/// Environment variables, in the order given.
pub type Env = Vec<(String, String)>;

/// The environment of an ADD of container `id` on eth0, for pod default/`pod`.
pub fn add_env(id: &str, pod: &str) -> Env {
    attach_env("ADD", id, pod)
}

/// The environment kubelet's runtime gives `command` for container `id` on eth0.
pub fn attach_env(command: &str, id: &str, pod: &str) -> Env {
    [
        ("CNI_COMMAND", command.to_string()),
        ("CNI_CONTAINERID", id.to_string()),
        ("CNI_NETNS", format!("/var/run/netns/cni-{id}")),
        ("CNI_IFNAME", "eth0".to_string()),
        (
            "CNI_ARGS",
            format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};\
                 K8S_POD_INFRA_CONTAINER_ID={id};K8S_POD_UID=0f1e2d3c"
            ),
        ),
        ("CNI_PATH", "/opt/cni/bin".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// `env` with `name` set to `value` (removed when `None`).
pub fn with(mut env: Env, name: &str, value: Option<&str>) -> Env {
    env.retain(|(k, _)| k != name);
    if let Some(v) = value {
        env.push((name.to_string(), v.to_string()));
    }
    env
}

/// Starts the plugin with exactly `env` and `stdin`, as a runtime would.
pub fn spawn(env: &[(String, String)], stdin: &[u8]) -> std::process::Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry-cni"))
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ferry-cni");
    let mut input = child.stdin.take().unwrap();
    // A plugin that refuses its environment exits without reading its input.
    if let Err(e) = input.write_all(stdin) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    drop(input);
    child
}

/// Waits for a plugin started by [`spawn`].
pub fn finish(child: std::process::Child) -> Run {
    let out = child.wait_with_output().unwrap();
    let stdout = if out.stdout.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "ferry-cni printed something that is not JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    };
    Run {
        code: out.status.code().expect("exited, not killed"),
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs the plugin with `env`, the configuration `conf` on standard input.
pub fn run(env: &[(String, String)], conf: &Value) -> Run {
    finish(spawn(env, conf.to_string().as_bytes()))
}

/// Runs the plugin with `env` and raw standard input.
pub fn run_raw(env: &[(String, String)], stdin: &[u8]) -> Run {
    finish(spawn(env, stdin))
}
