//! A new agent started on a node while the node's agent runs takes the node over: the
//! running agent hands over its ports, listeners and connection state and exits, and no
//! connection breaks on the way: a ping every 20 ms loses nothing, a paced TCP stream
//! through a Service's cluster IP arrives whole, the API socket answers the new agent.
//! A taker that goes away or refuses the state midway leaves the running agent
//! forwarding as before. Needs root, iproute2, ping, nc and python3.

mod common;

use std::fs;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use common::two_nodes::TwoNodes;
use ferry_agent::api::call;
use ferry_agent::handover::{GiverSays, TakerSays};
use ferry_api::{Request, Response};
use ferry_linux::fdpass;

/// A Service in front of the web pod's stream server on 9000.
const STREAM: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: stream, namespace: default }
spec:
  clusterIP: 10.96.0.20
  clusterIPs: [10.96.0.20]
  selector: { app: web }
  ports: [{ name: s, protocol: TCP, port: 90, targetPort: 9000 }]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: stream-abcde
  namespace: default
  labels: { kubernetes.io/service-name: stream }
addressType: IPv4
ports: [{ name: s, protocol: TCP, port: 9000 }]
endpoints: [{ addresses: [10.244.2.5], conditions: { ready: true }, nodeName: node2 }]
"#;

/// Reads a count N, then sends lines 1..=N, one every 20 ms, and closes.
const STREAM_SERVER: &str = r#"
import socket, threading, time
def serve(c):
    n = int(c.makefile().readline())
    for i in range(1, n + 1):
        c.sendall(b"%06d\n" % i)
        time.sleep(0.02)
    c.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 9000))
s.listen(16)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Two nodes (node 1's agent with two workers, so that multi-queue TAPs and an
/// AF_PACKET fanout group are handed over), the web pod's stream server and its
/// Service.
fn cluster(tag: &str, node1: &[&str]) -> TwoNodes {
    let mut c = TwoNodes::with_file_datastore(tag, node1);
    serve_stream(&mut c);
    c
}

/// The web pod's stream server and its Service, on a running cluster.
fn serve_stream(c: &mut TwoNodes) {
    common::require(&[("ping", "iputils-ping"), ("nc", "netcat-openbsd")]);
    fs::write(c.manifest_dir().join("stream.yaml"), STREAM).unwrap();
    let server = c.dir.path().join("stream.py");
    fs::write(&server, STREAM_SERVER).unwrap();
    let s = server.display().to_string();
    c.lab.daemon("p2a", "stream server", &["python3", &s]);
    c.lab.wait_for(20, "the stream Service", |l| {
        l.exec("p1a", 3, &["sh", "-c", "echo 1 | nc -N -w 2 10.96.0.20 90"])
            .stdout
            == b"000001\n"
    });
}

/// Starts, in the client pod, a ping of the web pod every 20 ms for `count` pings and a
/// stream of `lines` lines (20 ms apart) through the stream Service, each writing to a
/// file of `dir`.
fn start_traffic(c: &mut TwoNodes, count: u32, lines: u32) {
    let dir = c.dir.path().display().to_string();
    c.lab.spawn(
        "p1a",
        "ping",
        &[
            "sh",
            "-c",
            &format!("exec ping -i 0.02 -c {count} -W 1 10.244.2.5 > {dir}/ping.txt"),
        ],
    );
    fs::write(c.dir.path().join("lines.txt"), format!("{lines}\n")).unwrap();
    c.lab.spawn(
        "p1a",
        "stream",
        &[
            "sh",
            "-c",
            &format!("exec nc -N -w 3 10.96.0.20 90 < {dir}/lines.txt > {dir}/stream.txt"),
        ],
    );
}

/// Waits for the traffic of [`start_traffic`] to end and checks that no ping was lost
/// and every line of the stream arrived, in order.
fn traffic_intact(c: &mut TwoNodes, count: u32, lines: u32, during: &str) {
    let (status, err) = c.lab.wait_exit("ping", 60);
    let ping = fs::read_to_string(c.dir.path().join("ping.txt")).unwrap();
    assert!(status.success(), "ping {during}: {status} {err}\n{ping}");
    let want = format!("{count} packets transmitted, {count} received");
    assert!(
        ping.contains(&want),
        "pings lost {during}:\n{}",
        tail(&ping)
    );
    let (status, err) = c.lab.wait_exit("stream", 60);
    assert!(status.success(), "the stream {during}: {status} {err}");
    let got = fs::read_to_string(c.dir.path().join("stream.txt")).unwrap();
    let expected: String = (1..=lines).map(|i| format!("{i:06}\n")).collect();
    assert!(
        got == expected,
        "the stream {during}: {} of {lines} lines, last {:?}",
        got.lines().count(),
        got.lines().last()
    );
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(4)..].join("\n")
}

#[test]
fn a_new_agent_takes_the_node_over_without_losing_a_packet() {
    // The old agent stays, as a DaemonSet's old pod does until it is deleted.
    let node1 = ["--workers", "2", "--after-handover", "wait"];
    let mut c = cluster("hov", &node1);
    let sock = c.socket(1).display().to_string();
    let pids = || common::sh(&["pgrep", "-f", &format!("ferry agent .*{sock}")]);
    let old_pid = pids().trim().to_string();
    start_traffic(&mut c, 300, 250);
    std::thread::sleep(Duration::from_millis(1500));
    let args = c.agent_args(1, &datastore(&c), &node1);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    c.lab.daemon("n1", "new agent on node1", &args);
    // Handed over, the old agent holds no socket, TAP or event descriptor.
    let fds = format!("/proc/{old_pid}/fd");
    let held = || -> Vec<String> {
        fs::read_dir(&fds)
            .map(|d| {
                d.filter_map(|e| fs::read_link(e.ok()?.path()).ok())
                    .map(|l| l.display().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    // (What its parent passed it at start, the test's pipes, it keeps.)
    let ours = |l: &String| {
        l.starts_with("socket:") || l.starts_with("anon_inode:") || l.contains("/dev/net/tun")
    };
    for _ in 0..300 {
        let h = held();
        if !h.is_empty() && !h.iter().any(ours) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let h = held();
    assert!(
        !h.is_empty() && !h.iter().any(ours),
        "the old agent holds {h:?}"
    );
    traffic_intact(&mut c, 300, 250, "through the handover");
    // The new agent answers on the API socket it was handed, and forwards: the node's
    // kernel reaches the web pod through the host TAP, the external client the node
    // port.
    let status = call(&c.socket(1), &Request::Status).unwrap();
    assert!(matches!(status, Response::Ok(_)), "{status:?}");
    assert_eq!(
        c.curl("ext", "http://192.168.77.1:30080/hostname"),
        "web",
        "a new connection through the node port after the handover"
    );
    c.lab.check_alive();
    let old = c.lab.stop("ferry agent on node1");
    assert!(old.contains("handed over to the new agent"), "{old}");
    assert!(
        old.contains("holds nothing and waits to be stopped"),
        "{old}"
    );
    let new = c.lab.stop("new agent on node1");
    assert!(new.contains("took over from the running agent"), "{new}");
    // The stream's connection came over with its NAT (it would not survive without),
    // in the pre-copy's base, saved while the old agent forwarded.
    let base = new
        .lines()
        .find(|l| l.contains("the pre-copy's base is loaded"))
        .unwrap_or_else(|| panic!("no pre-copy: {new}"));
    assert!(
        base.contains("restored ") && !base.contains("restored 0 connections"),
        "{base}"
    );
    assert!(new.contains("changes since the base: restored"), "{new}");
    assert!(
        !new.contains("pod interface adopted") || new.contains("handed_over=true"),
        "the pod's interface was opened anew instead of taken over: {new}"
    );
}

/// Connections a near-full table holds in the test below (the default table: 262 144).
const MANY: u32 = 200_000;

/// A checkpoint of node 1 tracking [`MANY`] established TCP connections from clients
/// outside the cluster to the client pod's port 8080 (no NAT: they are kept whatever
/// the Services).
fn many_connections() -> Vec<u8> {
    use ferry_datapath::handover::{
        Connection, Meta, SavedState, Tcp, TcpSide, TcpState, Tracking, Tuple, encode,
    };
    let side = TcpSide {
        end: 1000,
        max_end: 1000 + 65535,
        max_window: 65535,
        window_scale: 0,
        sent_window_scale: false,
        liberal: false,
        unacknowledged: false,
    };
    let pod: std::net::IpAddr = "10.244.1.5".parse().unwrap();
    let connections = (0..MANY)
        .map(|i| {
            let [_, a, b, c] = i.to_be_bytes();
            let client = std::net::IpAddr::from([10, 100 + a, b, c]);
            let port = 20_000 + (i % 40_000) as u16;
            Connection {
                zone: 0,
                proto: 6,
                original: Tuple {
                    src: client,
                    dst: pod,
                    src_port: port,
                    dst_port: 8080,
                },
                reply: Tuple {
                    src: pod,
                    dst: client,
                    src_port: 8080,
                    dst_port: port,
                },
                tracking: Tracking::Tcp(Tcp {
                    state: TcpState::Established,
                    reset_kept: false,
                    original: side,
                    reply: side,
                }),
                seen_reply: true,
                assured: true,
                dnat: false,
                snat: false,
                mark: 0,
                labels: 0,
                tunnel_peer: None,
                packets: [10, 10],
                bytes: [1000, 1000],
                first_seen_ago_ns: 60_000_000_000,
                last_seen_ago_ns: 1_000_000_000,
            }
        })
        .collect();
    encode(&SavedState {
        meta: Meta {
            node: "node1".into(),
            outer_id: 0,
        },
        connections,
        ..SavedState::default()
    })
}

/// The number after `key` in a JSON log line.
fn number_after(line: &str, key: &str) -> f64 {
    let rest = line
        .split_once(key)
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        .1;
    let n: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    n.parse()
        .unwrap_or_else(|_| panic!("no number after {key} in {line}"))
}

/// A node tracking 200 000 connections hands over with a pause of the workers far
/// under 50 ms: the pre-copy moves the table while the old agent forwards, and the
/// pause carries only the few connections that had packets meanwhile. (Without it the
/// pause was the whole table's save and restore, about 0.2 s in a release build and
/// seconds in this debug one.)
#[test]
fn a_near_full_table_is_handed_over_with_a_short_pause() {
    // No checkpoint while the test runs (one of the table would hold the workers too),
    // and the log as JSON, to read the pause from.
    let node1 = [
        "--checkpoint-interval",
        "3600",
        "--log-format",
        "json",
        "--after-handover",
        "wait",
    ];
    let mut c = TwoNodes::new("hfull");
    let state = c.dir.path().join("state1");
    fs::create_dir_all(&state).unwrap();
    fs::write(state.join("datapath.state"), many_connections()).unwrap();
    c.start_file_datastore(&node1, &[], &[]);
    serve_stream(&mut c);
    start_traffic(&mut c, 300, 250);
    std::thread::sleep(Duration::from_millis(1500));
    let args = c.agent_args(1, &datastore(&c), &node1);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    c.lab.daemon("n1", "new agent on node1", &args);
    traffic_intact(
        &mut c,
        300,
        250,
        "through the handover of a near-full table",
    );
    c.lab.check_alive();
    let old = c.lab.stop("ferry agent on node1");
    let restored = format!("restored {MANY} connections");
    assert!(
        old.lines()
            .any(|l| l.contains("the previous agent's checkpoint") && l.contains(&restored)),
        "the old agent did not start with the table: {}",
        tail(&old)
    );
    let base = old
        .lines()
        .find(|l| l.contains("pre-copy: the base is saved"))
        .unwrap_or_else(|| panic!("no pre-copy: {}", tail(&old)));
    assert!(
        number_after(base, "\"connections\":") >= f64::from(MANY) - 100.0,
        "{base}"
    );
    assert!(number_after(base, "\"parts\":") >= 12.0, "{base}");
    let handed = old
        .lines()
        .find(|l| l.contains("handed over to the new agent"))
        .unwrap_or_else(|| panic!("not handed over: {}", tail(&old)));
    let held = number_after(handed, "\"held_ms\":");
    assert!(held < 50.0, "the workers were held {held} ms: {handed}");
    let new = c.lab.stop("new agent on node1");
    let loaded = new
        .lines()
        .find(|l| l.contains("the pre-copy's base is loaded"))
        .unwrap_or_else(|| panic!("no base loaded: {}", tail(&new)));
    assert!(
        number_after(loaded, "restored ") >= f64::from(MANY) - 100.0,
        "{loaded}"
    );
    eprintln!("the handover of a near-full table:\n{base}\n{loaded}\n{handed}");
}

fn datastore(c: &TwoNodes) -> String {
    format!("file:{}", c.manifest_dir().display())
}

/// A fake new agent: asks the agent at `sock` to hand over (as a pre-copy when
/// `precopy`, as an agent before the pre-copy asks otherwise) and reads its offer and
/// descriptors; returns the connection and how many ports were offered.
fn ask(sock: &Path, precopy: bool) -> (UnixStream, usize) {
    let mut conn = UnixStream::connect(sock).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut line = serde_json::to_string(&Request::Handover {
        version: "test".into(),
        pid: std::process::id(),
        precopy,
    })
    .unwrap();
    line.push('\n');
    std::io::Write::write_all(&mut conn, line.as_bytes()).unwrap();
    let offer = fdpass::recv(&conn).unwrap();
    let GiverSays::Offer(offer) = serde_json::from_slice(&offer).unwrap() else {
        panic!("no offer first");
    };
    assert_eq!(offer.precopy, precopy, "a pre-copy as asked");
    let fds = fdpass::recv_fds(&conn, offer.descriptors()).unwrap();
    assert_eq!(fds.len(), offer.descriptors());
    (conn, offer.ports.len())
}

fn say(conn: &UnixStream, what: &TakerSays) {
    fdpass::send(conn, &serde_json::to_vec(what).unwrap()).unwrap();
}

/// The fake new agent refuses what it got, for `reason`: the giver must say nothing
/// more (no go, no changes) and forward on.
fn refuse(conn: UnixStream, reason: &str) {
    say(
        &conn,
        &TakerSays::Refused {
            reason: reason.into(),
        },
    );
    assert!(fdpass::recv(&conn).is_err(), "a message after a refusal");
}

#[test]
fn a_handover_that_fails_midway_leaves_the_agent_forwarding() {
    let mut c = cluster("hof", &["--workers", "2"]);
    start_traffic(&mut c, 400, 350);
    let sock = c.socket(1);
    // The taker goes away after the offer.
    let (conn, ports) = ask(&sock, false);
    assert!(ports >= 3, "uplink, host and pod ports offered: {ports}");
    drop(conn);
    // The taker goes away with the state.
    let (conn, _) = ask(&sock, false);
    say(&conn, &TakerSays::Ready);
    fdpass::recv(&conn).expect("the state");
    drop(conn);
    // The taker refuses the state.
    let (conn, _) = ask(&sock, false);
    say(&conn, &TakerSays::Ready);
    fdpass::recv(&conn).expect("the state");
    refuse(conn, "a test");
    // The taker gives up before the state.
    let (conn, _) = ask(&sock, false);
    say(
        &conn,
        &TakerSays::Abort {
            reason: "a test".into(),
        },
    );
    drop(conn);
    // A pre-copy: the taker goes away with the base.
    let base = |conn: &UnixStream| {
        let said = fdpass::recv(conn).expect("the base's age");
        let GiverSays::Base { .. } = serde_json::from_slice(&said).unwrap() else {
            panic!("no base announced: {}", String::from_utf8_lossy(&said));
        };
        let bytes = fdpass::recv(conn).expect("the base");
        let base = ferry_datapath::handover::decode(&bytes).expect("a state");
        assert!(base.removed.is_none() && base.affinity.is_empty());
        base
    };
    let (conn, _) = ask(&sock, true);
    say(&conn, &TakerSays::Ready);
    let b = base(&conn);
    assert!(
        !b.connections.is_empty(),
        "the downloads' connections in the base"
    );
    drop(conn);
    // It refuses the base.
    let (conn, _) = ask(&sock, true);
    say(&conn, &TakerSays::Ready);
    base(&conn);
    refuse(conn, "a base test");
    // It loads the base and refuses the changes.
    let (conn, _) = ask(&sock, true);
    say(&conn, &TakerSays::Ready);
    base(&conn);
    say(
        &conn,
        &TakerSays::BaseLoaded {
            summary: "a test".into(),
        },
    );
    let changes = fdpass::recv(&conn).expect("the changes");
    let changes = ferry_datapath::handover::decode(&changes).expect("a state");
    assert!(changes.removed.is_some(), "changes, not a whole state");
    refuse(conn, "a changes test");
    // Each time, the agent forwards on and answers again.
    c.lab.wait_for(10, "the API socket answering again", |_| {
        matches!(call(&sock, &Request::Status), Ok(Response::Ok(_)))
    });
    traffic_intact(&mut c, 400, 350, "through seven failed handovers");
    c.lab.check_alive();
    let log = c.lab.stop("ferry agent on node1");
    for why in [
        "the new agent went away",
        "the new agent refused the state: a test",
        "the new agent gave up: a test",
        "the new agent refused the state: a base test",
        "the new agent refused the state: a changes test",
    ] {
        assert!(log.contains(why), "{why:?} not in the log:\n{log}");
    }
    assert_eq!(
        log.matches("handover failed, forwarding goes on here")
            .count(),
        7,
        "{log}"
    );
}
