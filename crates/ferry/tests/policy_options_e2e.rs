//! The two policy settings of `kube-system/ferry-config`, with real TCP on two nodes:
//!
//! - `policy-on-change`: a connection open when a policy that denies it comes in is
//!   kept by default (`keep`) and ended with `reevaluate`; a new one is denied either
//!   way;
//! - `policy-host-to-pods`: the node's own stack reaches its pod whatever the pod's
//!   ingress policy by default (`allow`), and meets the policy with `policy`.
//!
//! The lab and the cluster are in `common/two_nodes.rs`; a line-echo server on the web
//! pod (TCP 9000) and a client on node 1's pod that sends a line every 100 ms and says
//! whether each came back. Needs root, iproute2, curl and python3.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::two_nodes::{TwoNodes, WEB_FROM_FRIENDS};

/// Echoes each line it reads, per connection.
const ECHO: &str = r#"
import socket, sys, threading
def serve(c):
    f = c.makefile("rwb", buffering=0)
    for line in f:
        f.write(line)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Connects, then sends a line every 100 ms; appends `ok` to the file for each line
/// echoed within 1 s, and `stalled` (then exits) for the first that is not.
const CLIENT: &str = r#"
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
s.settimeout(1)
out = open(sys.argv[3], "a", buffering=1)
while True:
    try:
        s.sendall(b"x\n")
        if s.recv(16) != b"x\n":
            raise OSError("short echo")
        out.write("ok\n")
    except OSError:
        out.write("stalled\n")
        break
    time.sleep(0.1)
"#;

struct Echo {
    c: TwoNodes,
    client: PathBuf,
}

impl Echo {
    /// The lab with `config` in ferry-config and the echo server on the web pod.
    fn new(tag: &str, config: &[(&str, &str)]) -> Echo {
        let mut c = TwoNodes::with_file_datastore_config(tag, &[], &[], config);
        let echo = c.dir.path().join("echo.py");
        fs::write(&echo, ECHO).unwrap();
        let client = c.dir.path().join("client.py");
        fs::write(&client, CLIENT).unwrap();
        let e = echo.display().to_string();
        c.lab.daemon("p2a", "echo server", &["python3", &e, "9000"]);
        c.lab.wait_for(10, "the echo server", |l| {
            l.exec(
                "p2a",
                2,
                &["sh", "-c", "echo x | nc -q0 -w1 127.0.0.1 9000"],
            )
            .status
            .success()
        });
        Echo { c, client }
    }

    /// Starts a client connection from the client pod; its lines go to `out`.
    fn connect(&mut self, label: &str, out: &Path) {
        let client = self.client.display().to_string();
        let out = out.display().to_string();
        self.c.lab.spawn(
            "p1a",
            label,
            &["python3", &client, "10.244.2.5", "9000", &out],
        );
    }

    fn apply(&self, name: &str, yaml: &str) {
        fs::write(self.c.manifest_dir().join(name), yaml).unwrap();
    }

    /// True when a new connection to the echo server gets its line back.
    fn new_connection_passes(&self) -> bool {
        self.c
            .lab
            .exec(
                "p1a",
                5,
                &[
                    "sh",
                    "-c",
                    "echo x | nc -q1 -w2 10.244.2.5 9000 | grep -q x",
                ],
            )
            .status
            .success()
    }

    /// Waits until new connections are denied (the policy in force at both nodes).
    fn wait_denied(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.new_connection_passes() {
            assert!(Instant::now() < deadline, "the policy did not take effect");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn lines(out: &Path) -> Vec<String> {
    fs::read_to_string(out)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits until the client has echoed `n` lines in all.
fn wait_ok(out: &Path, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while lines(out).iter().filter(|l| *l == "ok").count() < n {
        assert!(Instant::now() < deadline, "{:?}", lines(out));
        assert!(!lines(out).contains(&"stalled".into()), "{:?}", lines(out));
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_policy_change_keeps_open_connections_unless_told_to_reevaluate() {
    // keep (the default): the connection goes on, a new one is denied.
    let mut e = Echo::new("pkeep", &[]);
    let out = e.c.dir.path().join("kept.txt");
    e.connect("kept client", &out);
    wait_ok(&out, 5);
    e.apply("policy.yaml", WEB_FROM_FRIENDS);
    e.wait_denied();
    let before = lines(&out).len();
    wait_ok(&out, before + 10);
    assert!(
        !lines(&out).contains(&"stalled".into()),
        "kept: {:?}",
        lines(&out)
    );
    drop(e);

    // reevaluate: the open connection is ended when the policy comes in.
    let mut e = Echo::new(
        "preval",
        &[
            ("encapsulation", "cross-subnet"),
            ("policy-on-change", "reevaluate"),
        ],
    );
    let out = e.c.dir.path().join("cut.txt");
    e.connect("cut client", &out);
    wait_ok(&out, 5);
    e.apply("policy.yaml", WEB_FROM_FRIENDS);
    e.wait_denied();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !lines(&out).contains(&"stalled".into()) {
        assert!(
            Instant::now() < deadline,
            "reevaluate: the connection still passes: {:?}",
            lines(&out)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Once the policy allows it again, new connections pass.
    e.apply("policy.yaml", "");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !e.new_connection_passes() {
        assert!(Instant::now() < deadline, "the policy did not go");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_node_reaches_its_pods_unless_told_to_meet_their_policy() {
    let node = |e: &Echo| e.c.try_curl("n2", "http://10.244.2.5:8080/hostname");
    // allow (the default): node 2's own stack reaches its pod through the policy.
    let mut e = Echo::new("phost", &[]);
    e.apply("policy.yaml", WEB_FROM_FRIENDS);
    e.wait_denied();
    assert_eq!(node(&e), (0, "web".to_string()), "allow: the node passes");
    drop(e);

    // policy: the node's stack is a peer like any other, and not a friend.
    let config = [
        ("encapsulation", "cross-subnet"),
        ("policy-host-to-pods", "policy"),
    ];
    let mut e = Echo::new("phostp", &config);
    assert_eq!(node(&e).0, 0, "no policy yet: the node passes");
    e.apply("policy.yaml", WEB_FROM_FRIENDS);
    e.wait_denied();
    assert_eq!(node(&e).0, 28, "policy: the node is denied");
}
