//! The policy audit log on two nodes, with real TCP clients: node 2's agent runs with
//! `--policy-audit-log`, and a NetworkPolicy isolates its web pod. Each denied
//! connection (from the client pod on node 1, and from outside through a node port of
//! node 2) is one JSON line naming its pods, ports, direction and policy, though curl
//! sends its SYN more than once; an allowed connection logs nothing; a ClusterNetworkPolicy
//! deny names its rule. `ferry status` shows the log's counters.
//!
//! The lab and the cluster are in `common/two_nodes.rs`.
//! Needs root, iproute2, curl and python3.

mod common;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use common::two_nodes::{ADMIN_DENY, TwoNodes, WEB_FROM_FRIENDS, pod};
use ferry_agent::api::call;
use ferry_api::{Request, Response};
use serde_json::Value;

/// The lines of the audit log so far, each parsed.
fn lines(log: &Path) -> Vec<Value> {
    let text = fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

/// True when `line` is of a connection from source port `sport`, before or after NAT.
fn from_port(line: &Value, sport: u16) -> bool {
    line["src"]["port"] == sport || line["original_src"]["port"] == sport
}

/// The lines of connections from source port `sport`, once there is one and 500 ms
/// have passed after it (time enough for a second line to come, were there one).
fn lines_of(log: &Path, sport: u16) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mine = || -> Vec<Value> {
        lines(log)
            .into_iter()
            .filter(|l| from_port(l, sport))
            .collect()
    };
    while mine().is_empty() {
        assert!(
            Instant::now() < deadline,
            "no audit line for source port {sport} within 5 s; the log:\n{}",
            fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    mine()
}

/// curl's exit status for `url` from namespace `from`, from source port `sport`.
fn curl_from(c: &TwoNodes, from: &str, sport: u16, url: &str) -> i32 {
    let port = sport.to_string();
    let out = c.lab.exec(
        from,
        10,
        &["curl", "-sS", "--max-time", "3", "--local-port", &port, url],
    );
    out.status.code().unwrap_or(-1)
}

fn counters(c: &TwoNodes, n: u8) -> ferry_api::Counters {
    match call(&c.socket(n), &Request::Counters).unwrap() {
        Response::Ok(a) => *a.counters.unwrap(),
        r => panic!("counters: {r:?}"),
    }
}

#[test]
fn denied_connections_are_logged_once_each_and_allowed_ones_not() {
    let mut c = TwoNodes::new("pa");
    let log = c.dir.path().join("audit.log");
    let log_arg = log.display().to_string();
    c.start_file_datastore(&[], &["--policy-audit-log", &log_arg], &[]);
    let dir = c.manifest_dir();
    let direct = "http://10.244.2.5:8080/hostname";

    // No policy: allowed, nothing logged.
    assert_eq!(curl_from(&c, "p1a", 40100, direct), 0);
    std::thread::sleep(Duration::from_millis(300));
    assert!(lines(&log).is_empty(), "{:?}", lines(&log));

    // In force: the client is denied at node 2, the destination's node.
    fs::write(dir.join("policy.yaml"), WEB_FROM_FRIENDS).unwrap();
    c.wait_curl(10, "p1a", direct, 28, "the policy in force");
    assert_eq!(curl_from(&c, "p1a", 40111, direct), 28);
    let got = lines_of(&log, 40111);
    assert_eq!(got.len(), 1, "one line for the connection: {got:#?}");
    let l = &got[0];
    assert_eq!(l["event"], "connection_denied");
    assert_eq!(l["node"], "node2");
    assert_eq!(l["direction"], "ingress");
    assert_eq!(l["protocol"], "tcp");
    assert_eq!(
        l["src"],
        serde_json::json!({ "address": "10.244.1.5", "port": 40111, "pod": "default/client" })
    );
    assert_eq!(
        l["dst"],
        serde_json::json!({ "address": "10.244.2.5", "port": 8080, "pod": "default/web" })
    );
    assert_eq!(
        l["isolated_by"],
        serde_json::json!(["NetworkPolicy default/web-from-friends"])
    );
    assert!(l.get("original_dst").is_none(), "{l}");
    assert!(l["time"].as_str().unwrap().ends_with('Z'), "{l}");
    let status = counters(&c, 2)
        .policy_audit
        .expect("the audit log's counters");
    assert!(
        status.repeated >= 1,
        "curl sent its SYN again within 3 s: {status:?}"
    );
    assert!(
        counters(&c, 1).policy_audit.is_none(),
        "node 1 logs nothing"
    );

    // From outside, through node 2's node port: decided on the endpoint after DNAT,
    // and the line says where the connection was going.
    assert_eq!(
        curl_from(&c, "ext", 40112, "http://192.168.77.2:30080/hostname"),
        28
    );
    let got = lines_of(&log, 40112);
    assert_eq!(got.len(), 1, "{got:#?}");
    let l = &got[0];
    assert_eq!(
        l["original_dst"],
        serde_json::json!({ "address": "192.168.77.2", "port": 30080 })
    );
    assert_eq!(l["dst"]["address"], "10.244.2.5");
    assert_eq!(l["dst"]["pod"], "default/web");
    assert!(l["src"].get("pod").is_none(), "not a pod: {l}");

    // The client becomes a friend: allowed, nothing logged.
    let friend = pod("client", 1, "10.244.1.5").replace(
        "labels: { app: client }",
        "labels: { app: client, role: friend }",
    );
    fs::write(
        dir.join("pods.yaml"),
        format!("{friend}---{}", pod("web", 2, "10.244.2.5")),
    )
    .unwrap();
    c.wait_curl(10, "p1a", direct, 0, "the client's label in force");
    assert_eq!(curl_from(&c, "p1a", 40113, direct), 0);
    std::thread::sleep(Duration::from_millis(500));
    let allowed: Vec<Value> = lines(&log)
        .into_iter()
        .filter(|l| from_port(l, 40113))
        .collect();
    assert!(allowed.is_empty(), "{allowed:#?}");

    // The Admin tier denies what the NetworkPolicy allows: its rule is named.
    fs::write(dir.join("admin.yaml"), ADMIN_DENY).unwrap();
    c.wait_curl(10, "p1a", direct, 28, "the Admin tier deny in force");
    assert_eq!(curl_from(&c, "p1a", 40114, direct), 28);
    let got = lines_of(&log, 40114);
    assert_eq!(got.len(), 1, "{got:#?}");
    let l = &got[0];
    assert_eq!(l["tier"], "admin");
    assert_eq!(l["policy"], "ClusterNetworkPolicy deny-to-web");
    assert_eq!(l["rule"], "ingress rule from-default");
    assert!(l.get("isolated_by").is_none(), "{l}");

    // Every line is a denial (the rate limit, 100 a second, refused none), and status
    // counts them.
    let all = lines(&log);
    assert!(
        all.iter().all(|l| l["event"] == "connection_denied"),
        "{all:#?}"
    );
    let a = counters(&c, 2).policy_audit.unwrap();
    assert_eq!(a.logged, all.len() as u64, "{a:?}");
    assert_eq!(
        (a.suppressed_rate, a.suppressed_overflow, a.write_errors),
        (0, 0, 0)
    );
    let socket = c.socket(2).display().to_string();
    let (out, _) = common::ferry_ok(&["status", "--api-socket", &socket]);
    assert!(
        out.contains(&format!("policy audit log: {} lines", a.logged)),
        "{out}"
    );
}
