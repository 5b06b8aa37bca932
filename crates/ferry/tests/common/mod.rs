//! A small lab for end-to-end tests: network namespaces, veth links and processes, all
//! named with a prefix unique to the test run and removed by `Drop`, also when a test
//! fails. Traffic stays inside the namespaces made here.

#![allow(dead_code)]

use std::process::{Child, Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

pub mod lab;
pub mod one_node;
pub mod podman;
pub mod replay;
pub mod two_nodes;

/// Runs `ferry ARGS` (the binary under test, on the test's side); its exit status,
/// stdout and stderr.
pub fn ferry(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `ferry ARGS`, failing the test with its output unless it succeeds; its stdout
/// and stderr.
pub fn ferry_ok(args: &[&str]) -> (String, String) {
    let (ok, out, err) = ferry(args);
    assert!(ok, "ferry {args:?} failed: {out}{err}");
    (out, err)
}

/// Fails the test, saying what is needed, unless root with the given commands available.
pub fn require(commands: &[(&str, &str)]) {
    let uid = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("Uid:")
                .and_then(|r| r.split_whitespace().nth(1))
                .map(str::to_string)
        })
        .unwrap_or_default();
    assert_eq!(
        uid, "0",
        "this test must run as root: it creates network namespaces"
    );
    for (cmd, package) in commands {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {cmd}")])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(found, "this test needs `{cmd}`: apt-get install {package}");
    }
}

/// Runs a command, failing the test with its output when it fails.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The namespaces, links and processes of one test.
pub struct Lab {
    /// Prefix of every name: `f<tag><pid>`.
    pub prefix: String,
    namespaces: Vec<String>,
    /// Spawned processes: label, process, and whether it must stay up (a daemon).
    children: Vec<(String, Child, bool)>,
}

impl Lab {
    /// A lab whose names start with `f<tag><pid>` (tag: a few letters).
    pub fn new(tag: &str) -> Lab {
        Lab {
            prefix: format!("f{tag}{}", std::process::id()),
            namespaces: Vec::new(),
            children: Vec::new(),
        }
    }

    /// The full name of namespace `short`.
    pub fn ns(&self, short: &str) -> String {
        format!("{}-{short}", self.prefix)
    }

    /// Creates namespace `short` with its loopback up; returns its full name.
    pub fn add_ns(&mut self, short: &str) -> String {
        let name = self.ns(short);
        sh(&["ip", "netns", "add", &name]);
        self.namespaces.push(name.clone());
        sh(&["ip", "-n", &name, "link", "set", "lo", "up"]);
        name
    }

    /// Deletes namespace `short` now (a pod's sandbox going away).
    pub fn del_ns(&mut self, short: &str) {
        let name = self.ns(short);
        sh(&["ip", "netns", "del", &name]);
        self.namespaces.retain(|n| *n != name);
    }

    /// Runs `ip -n NS args...`.
    pub fn ip(&self, short: &str, args: &[&str]) -> String {
        let ns = self.ns(short);
        let mut all = vec!["ip", "-n", ns.as_str()];
        all.extend_from_slice(args);
        sh(&all)
    }

    /// A veth pair: `a_dev` in `a`, `b_dev` in `b`, both up.
    pub fn veth(&self, a: &str, a_dev: &str, b: &str, b_dev: &str) {
        let (na, nb) = (self.ns(a), self.ns(b));
        sh(&[
            "ip", "link", "add", a_dev, "netns", &na, "type", "veth", "peer", "name", b_dev,
            "netns", &nb,
        ]);
        self.ip(a, &["link", "set", a_dev, "up"]);
        self.ip(b, &["link", "set", b_dev, "up"]);
    }

    /// A Linux bridge `br0` in namespace `fabric` (the wire between nodes; it does not
    /// pass its frames through the host's firewall), with a veth from each of `members`
    /// (namespace, device there, the bridge's port) joined to it.
    pub fn fabric(&self, fabric: &str, members: &[(&str, &str, &str)]) {
        self.ip(
            fabric,
            &[
                "link",
                "add",
                "br0",
                "type",
                "bridge",
                "nf_call_iptables",
                "0",
                "nf_call_ip6tables",
                "0",
            ],
        );
        self.ip(fabric, &["link", "set", "br0", "up"]);
        for (ns, dev, port) in members {
            self.veth(ns, dev, fabric, port);
            self.ip(fabric, &["link", "set", port, "master", "br0"]);
        }
    }

    /// Runs a command in namespace `short` with a time limit; returns its output.
    pub fn exec(&self, short: &str, secs: u32, cmd: &[&str]) -> Output {
        let ns = self.ns(short);
        let limit = secs.to_string();
        let mut all = vec!["netns", "exec", ns.as_str(), "timeout", limit.as_str()];
        all.extend_from_slice(cmd);
        Command::new("ip")
            .args(&all)
            .output()
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
    }

    /// Like [`Lab::exec`], failing the test with the command's output when it fails.
    pub fn run(&self, short: &str, secs: u32, cmd: &[&str]) -> String {
        let out = self.exec(short, secs, cmd);
        assert!(
            out.status.success(),
            "in {short}: {cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts a daemon in namespace `short`: it must stay up ([`Lab::check_alive`]) and is
    /// stopped on drop.
    pub fn daemon(&mut self, short: &str, label: &str, cmd: &[&str]) {
        self.start(short, label, cmd, true);
    }

    /// Starts a command in namespace `short` that may end by itself; it is killed on drop
    /// if still running.
    pub fn spawn(&mut self, short: &str, label: &str, cmd: &[&str]) {
        self.start(short, label, cmd, false);
    }

    fn start(&mut self, short: &str, label: &str, cmd: &[&str], daemon: bool) {
        let ns = self.ns(short);
        let mut all = vec!["netns", "exec", ns.as_str()];
        all.extend_from_slice(cmd);
        let child = Command::new("ip")
            .args(&all)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        self.children.push((label.to_string(), child, daemon));
    }

    /// Fails the test if a daemon has exited, with its output.
    pub fn check_alive(&mut self) {
        for (label, c, _) in self.children.iter_mut().filter(|c| c.2) {
            if let Ok(Some(status)) = c.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = c.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                panic!("{label} exited ({status}): {err}");
            }
        }
    }

    /// The spawned process `label`, no longer the lab's to watch or stop.
    fn take(&mut self, label: &str) -> Child {
        let i = self
            .children
            .iter()
            .position(|(l, _, _)| l == label)
            .expect("a spawned process");
        self.children.remove(i).1
    }

    /// Stops a spawned process with SIGTERM and returns its standard error.
    pub fn stop(&mut self, label: &str) -> String {
        let mut c = self.take(label);
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                break;
            }
            sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let out = c.wait_with_output().expect("wait");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Kills a spawned process with SIGKILL (a crash) and returns its standard error.
    #[allow(dead_code)] // not every test binary crashes its processes
    pub fn kill(&mut self, label: &str) -> String {
        let mut c = self.take(label);
        // `ip netns exec` execs the command: the child is the process itself.
        let _ = c.kill();
        let out = c.wait_with_output().expect("wait");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Waits up to `secs` for a spawned process to end by itself (it is no daemon from
    /// now on) and returns how it ended and its standard error; one still running then
    /// is killed and fails the test.
    #[allow(dead_code)] // not every test binary waits for its processes
    pub fn wait_exit(&mut self, label: &str, secs: u64) -> (std::process::ExitStatus, String) {
        let mut c = self.take(label);
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                let out = c.wait_with_output().expect("wait");
                return (
                    out.status,
                    String::from_utf8_lossy(&out.stderr).into_owned(),
                );
            }
            sleep(Duration::from_millis(20));
        }
        // Killed; its pipes are not read: a process it started may hold them open.
        let _ = c.kill();
        let _ = c.wait();
        panic!("{label} did not end within {secs} s");
    }

    /// Waits until `f` is true or fails with `what`.
    pub fn wait_for(&mut self, secs: u64, what: &str, mut f: impl FnMut(&Lab) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            self.check_alive();
            if f(self) {
                return;
            }
            sleep(Duration::from_millis(50));
        }
        panic!("{what} did not happen within {secs} s");
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for (_, c, _) in &mut self.children {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for (_, c, _) in &mut self.children {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in self.namespaces.iter().rev() {
            // What the children started in turn (a shell's `nc`, say) is not their child
            // any more once they are gone: every process still in the namespace ends
            // with it, as deleting a namespace does not end them.
            if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
                let pids = String::from_utf8_lossy(&out.stdout);
                let pids: Vec<&str> = pids.split_whitespace().collect();
                if !pids.is_empty() {
                    let _ = Command::new("kill").arg("-KILL").args(&pids).status();
                }
            }
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

impl Lab {
    /// Pings until one answer comes (the first packets may resolve neighbours), then
    /// requires `count` answers out of `count`.
    pub fn ping(&mut self, from: &str, to: &str, size: usize, count: u32) {
        let s = size.to_string();
        let (from_s, to_s) = (from.to_string(), to.to_string());
        self.wait_for(
            10,
            &format!("a {size}-byte ping answer from {to} to {from}"),
            |l| {
                l.exec(&from_s, 3, &["ping", "-c", "1", "-W", "1", "-s", &s, &to_s])
                    .status
                    .success()
            },
        );
        let c = count.to_string();
        let out = self.run(
            from,
            20,
            &["ping", "-c", &c, "-i", "0.2", "-W", "2", "-s", &s, to],
        );
        assert!(
            out.contains(&format!("{count} received")),
            "ping {to} -s {size} from {from}: {out}"
        );
    }

    /// Starts tshark writing what `iface` in namespace `short` carries to `pcap`, and
    /// waits until it captures (the file has its header). Stop it with [`Lab::stop`].
    pub fn capture(&mut self, short: &str, label: &str, iface: &str, pcap: &std::path::Path) {
        let file = pcap.to_str().expect("a UTF-8 path").to_string();
        self.spawn(short, label, &["tshark", "-q", "-i", iface, "-w", &file]);
        let p = pcap.to_path_buf();
        self.wait_for(
            10,
            &format!("tshark capturing on {iface} in {short}"),
            |_| std::fs::metadata(&p).is_ok_and(|m| m.len() > 0),
        );
        // The header is written as the capture starts; give the ring a moment.
        sleep(Duration::from_millis(300));
    }

    /// Sends `data` over TCP with nc from namespace `client` to `addr:port`, where an
    /// nc in namespace `server` listens, and requires it to arrive byte-identical.
    /// `dir` holds the files.
    pub fn tcp_transfer(
        &mut self,
        dir: &std::path::Path,
        (server, addr): (&str, &str),
        client: &str,
        port: u16,
        data: &[u8],
    ) {
        let family = if addr.contains(':') { "-6" } else { "-4" };
        let tag = format!("{server}-{port}");
        let (src, dst) = (dir.join(format!("tx-{tag}")), dir.join(format!("rx-{tag}")));
        std::fs::write(&src, data).unwrap();
        let label = format!("nc server in {server} on {port}");
        self.spawn(
            server,
            &label,
            &[
                "sh",
                "-c",
                &format!("exec nc {family} -l {port} > {}", dst.display()),
            ],
        );
        let (srv, p) = (server.to_string(), format!(":{port} "));
        self.wait_for(
            5,
            &format!("nc listening on port {port} in {server}"),
            |l| String::from_utf8_lossy(&l.exec(&srv, 2, &["ss", "-Hltn"]).stdout).contains(&p),
        );
        self.run(
            client,
            30,
            &[
                "sh",
                "-c",
                &format!("nc -N -w 5 {addr} {port} < {}", src.display()),
            ],
        );
        let (d, len) = (dst.clone(), data.len() as u64);
        self.wait_for(
            10,
            &format!("all {len} bytes from {client} at {addr}:{port}"),
            |_| std::fs::metadata(&d).is_ok_and(|m| m.len() >= len),
        );
        let got = std::fs::read(&dst).unwrap();
        assert!(
            got == data,
            "TCP from {client} to {addr}:{port}: {} bytes arrived changed (sent {len})",
            got.len()
        );
        self.stop(&label);
    }
}

/// tshark's `field` values (one line per frame) of the frames of `pcap` that match the
/// display filter `filter`.
#[allow(dead_code)] // not every test binary reads captures
pub fn tshark_fields(pcap: &std::path::Path, filter: &str, field: &str) -> Vec<String> {
    sh(&[
        "tshark",
        "-r",
        pcap.to_str().expect("a UTF-8 path"),
        "-Y",
        filter,
        "-T",
        "fields",
        "-e",
        field,
    ])
    .lines()
    .map(str::to_string)
    .collect()
}

/// `len` bytes of a pattern that does not repeat at short periods (the lab's).
#[allow(unused_imports)] // not every test binary sends patterns
pub use ferry_lab::probe::pattern;

impl Lab {
    /// Stops a capture started with [`Lab::capture`] once its file has stopped growing
    /// (tshark writes what it captured in batches), at most after 5 s.
    pub fn stop_capture(&mut self, label: &str, pcap: &std::path::Path) {
        let size = || std::fs::metadata(pcap).map_or(0, |m| m.len());
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut last = size();
        loop {
            sleep(Duration::from_millis(600));
            let now = size();
            if now == last || Instant::now() > deadline {
                break;
            }
            last = now;
        }
        self.stop(label);
    }
}

impl Lab {
    /// Writes `tables` to `dir/NODE.yaml` and starts `ferry node` on it in namespace
    /// `node`, with one `--attach` per entry, as a daemon labelled "ferry on NODE".
    pub fn ferry_node(
        &mut self,
        node: &str,
        dir: &std::path::Path,
        tables: &str,
        attach: &[String],
    ) {
        self.ferry_node_with(node, dir, tables, attach, &[]);
    }

    /// [`Lab::ferry_node`] with further arguments of `ferry node`.
    pub fn ferry_node_with(
        &mut self,
        node: &str,
        dir: &std::path::Path,
        tables: &str,
        attach: &[String],
        more: &[&str],
    ) {
        let t = dir.join(format!("{node}.yaml"));
        std::fs::write(&t, tables).unwrap();
        let mut cmd = vec![
            env!("CARGO_BIN_EXE_ferry").to_string(),
            "node".into(),
            "--tables".into(),
        ];
        cmd.push(t.to_str().expect("a UTF-8 path").to_string());
        for a in attach {
            cmd.push("--attach".into());
            cmd.push(a.clone());
        }
        cmd.extend(more.iter().map(|m| m.to_string()));
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        self.daemon(node, &format!("ferry on {node}"), &args);
    }

    /// Waits until ferry has set up the pod in namespace `pod` (eth0 with an IPv4 address).
    pub fn wait_pod(&mut self, pod: &str) {
        let p = pod.to_string();
        self.wait_for(10, &format!("eth0 up in {pod}"), |l| {
            l.exec(&p, 2, &["ip", "-4", "addr", "show", "dev", "eth0"])
                .status
                .success()
        });
    }
}

impl Lab {
    /// Stops `ferry node` on `node` (labelled "ferry on NODE") and returns what it said
    /// and the line it printed on the way out.
    #[allow(dead_code)] // not every test binary runs `ferry node`
    pub fn stop_ferry(&mut self, node: &str) -> (String, String) {
        let log = self.stop(&format!("ferry on {node}"));
        let line = log
            .lines()
            .find(|l| l.contains("stopped after"))
            .unwrap_or_else(|| panic!("ferry on {node} said: {log}"))
            .to_string();
        (log, line)
    }
}

/// A TCP sink (python3 SCRIPT PORT LOG): for each connection, reads to the end of the
/// stream (the client's FIN), logs `SOURCE LENGTH SHA256` to LOG, answers `LENGTH
/// SHA256` and closes.
#[allow(dead_code)] // not every test binary sends TCP streams
pub const TCP_SINK: &str = r#"
import hashlib, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(4)
log = open(sys.argv[2], "a", buffering=1)
while True:
    c, peer = s.accept()
    h, n = hashlib.sha256(), 0
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        h.update(b)
        n += len(b)
    log.write(f"{peer[0]} {n} {h.hexdigest()}\n")
    c.sendall(f"{n} {h.hexdigest()}\n".encode())
    c.close()
"#;

/// The client of [`TCP_SINK`] (python3 SCRIPT HOST PORT SIZE [no-df]): sends SIZE bytes,
/// ends its stream, and prints `SIZE SHA256` and the sink's answer. With `no-df`, path
/// MTU discovery is off (DF clear), so that a router on the way may fragment.
#[allow(dead_code)] // not every test binary sends TCP streams
pub const TCP_SEND: &str = r#"
import hashlib, socket, sys
host, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
if sys.argv[4:] == ["no-df"]:
    s.setsockopt(socket.IPPROTO_IP, 10, 0)  # IP_MTU_DISCOVER = IP_PMTUDISC_DONT
s.settimeout(20)
s.connect((host, port))
data = bytes((i * 7 + i // 251) % 256 for i in range(size))
s.sendall(data)
s.shutdown(socket.SHUT_WR)
answer = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    answer += b
print(size, hashlib.sha256(data).hexdigest(), answer.decode().strip())
"#;

/// A kubeconfig for the API server at `server`: plain HTTP, no credentials.
pub fn kubeconfig(server: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster: {{ server: "{server}" }}
users:
- name: ferry
  user: {{}}
contexts:
- name: fake
  context: {{ cluster: fake, user: ferry }}
current-context: fake
"#
    )
}

/// The agent's container of deploy/ferry.yaml: its command and arguments (the node's
/// name put in for `$(NODE_NAME)`) and its image.
pub fn manifest_agent(node: &str) -> (Vec<String>, String) {
    let text = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/ferry.yaml"
    ));
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(text).unwrap();
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let argv = c["command"]
        .as_array()
        .unwrap()
        .iter()
        .chain(c["args"].as_array().unwrap())
        .map(|a| a.as_str().unwrap().replace("$(NODE_NAME)", node))
        .collect();
    (argv, c["image"].as_str().unwrap().to_string())
}

/// The TCP session's client: a line every 50 ms until file `stop` exists (120 s at
/// most), each echoed; prints (on standard error) the lines echoed and the longest wait
/// for one in milliseconds, and fails on any error (a reset, a 10 s silence).
pub const SESSION_CLIENT: &str = r#"
import os, socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
s.settimeout(10)
end = time.time() + 120
n, last, gap = 0, time.time(), 0.0
while time.time() < end and not os.path.exists(sys.argv[3]):
    s.sendall(b"x" * 100 + b"\n")
    buf = b""
    while not buf.endswith(b"\n"):
        d = s.recv(4096)
        if not d:
            sys.exit("the server closed the session")
        buf += d
    now = time.time()
    gap, last, n = max(gap, now - last), now, n + 1
    time.sleep(0.05)
print(n, int(gap * 1000), file=sys.stderr)
"#;

/// The echo server of the session, on port 2222.
pub const ECHO_SERVER: &str = r#"
import socketserver
class Echo(socketserver.StreamRequestHandler):
    def handle(self):
        for line in self.rfile:
            self.wfile.write(line)
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(("0.0.0.0", 2222), Echo).serve_forever()
"#;

/// Ends the session client `label` (started with [`SESSION_CLIENT`] and stop file
/// `stop`): the lines it echoed and its longest wait for one, in ms; fails the test if
/// the session broke.
pub fn end_session(lab: &mut Lab, label: &str, stop: &std::path::Path) -> (u64, u64) {
    std::fs::write(stop, "").unwrap();
    let (status, err) = lab.wait_exit(label, 10);
    assert!(status.success(), "the session broke: {err}");
    let figures: Vec<u64> = err
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(figures.len(), 2, "lines echoed, longest gap: {err}");
    (figures[0], figures[1])
}

/// Pods `default/a` and `default/b` in namespaces `pa` and `pb` of `lab`, made through
/// the CNI plugin on the agent's socket `socket` (leases in `data_dir`) as a container
/// runtime makes them; the first address of each.
pub fn cni_pods(
    lab: &Lab,
    socket: impl AsRef<std::path::Path>,
    data_dir: &std::path::Path,
) -> Vec<String> {
    let conf = serde_json::json!({
        "cniVersion": "1.0.0", "name": "ferry", "type": "ferry-cni",
        "socket": socket.as_ref(), "dataDir": data_dir,
    })
    .to_string();
    let plugin = lab::cni_plugin();
    [("a", "pa"), ("b", "pb")]
        .into_iter()
        .map(|(pod, ns)| {
            ferry_lab::cni::add(
                &plugin,
                &conf,
                &format!("sandbox-{pod}"),
                &lab.ns(ns),
                ("default", pod),
            )
            .unwrap()[0]
                .clone()
        })
        .collect()
}
