//! The audit log: its limits, and its lines from denials a real pipeline recorded on
//! tables compiled from a cluster.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_datapath::wire::build::{self, IpOpts, tcp_flags};
use ferry_datapath::{Addr, FlowKey, Packet, Pipeline, Trace, proto};
use serde_json::{Value, json};

use super::limits::{Repeats, TokenBucket};
use super::*;
use crate::compile::{AttachedPod, CompileOptions, node_tables};
use crate::datastore::file::parse;

const SEC: u64 = 1_000_000_000;

#[test]
fn the_bucket_allows_a_burst_then_the_rate() {
    let mut b = TokenBucket::new(10, 3);
    let taken = (0..5).filter(|_| b.take(SEC)).count();
    assert_eq!(taken, 3, "the burst");
    // 10 a second: one more every 100 ms, never more than the burst saved up.
    assert!(!b.take(SEC + 99_000_000));
    assert!(b.take(SEC + 100_000_000));
    assert!(!b.take(SEC + 100_000_000));
    let later = (0..10).filter(|_| b.take(100 * SEC)).count();
    assert_eq!(later, 3, "an idle minute saves up the burst only");
    // A clock that goes back refills nothing.
    assert!(!b.take(50 * SEC));
}

fn key(sport: u16) -> FlowKey {
    FlowKey {
        src: Addr::from("10.244.1.5".parse::<std::net::IpAddr>().unwrap()),
        dst: Addr::from("10.244.2.5".parse::<std::net::IpAddr>().unwrap()),
        zone: 0,
        proto: proto::TCP,
        src_port: sport,
        dst_port: 8080,
    }
}

#[test]
fn a_connection_seen_within_the_window_of_its_last_denial_is_a_repeat() {
    let w = 30 * SEC;
    let mut r = Repeats::new(w, 8);
    assert!(!r.is_repeat(&key(1), 0), "never logged");
    r.logged(key(1), 0);
    assert!(r.is_repeat(&key(1), SEC));
    assert!(!r.is_repeat(&key(2), SEC), "another source port");
    // Each repeat moves the window: retransmissions 1, 2, 4, 8, 16, 29 s apart.
    let mut t = SEC;
    for gap in [2, 4, 8, 16, 29] {
        t += gap * SEC;
        assert!(r.is_repeat(&key(1), t), "at {t}");
    }
    assert!(!r.is_repeat(&key(1), t + w), "quiet for the whole window");
}

#[test]
fn the_connections_remembered_are_bounded() {
    let mut r = Repeats::new(30 * SEC, 4);
    for i in 0..4 {
        r.logged(key(i), u64::from(i));
    }
    assert_eq!(r.len(), 4);
    // Full, none past the window: the older half goes.
    r.logged(key(9), 10);
    assert!(r.len() <= 4, "{}", r.len());
    assert!(r.is_repeat(&key(9), 11));
    assert!(r.is_repeat(&key(3), 11), "the newest stay");
    assert!(!r.is_repeat(&key(0), 11), "the oldest went");
    // Past the window, all go first.
    for i in 100..104 {
        r.logged(key(i), 100 * SEC);
    }
    assert!(r.len() <= 4);
    assert!(r.is_repeat(&key(103), 100 * SEC));
}

#[test]
fn rates_parse_or_say_what_is_accepted() {
    assert_eq!(AuditConfig::check_rate("100"), Ok(100));
    assert_eq!(AuditConfig::check_rate("1"), Ok(1));
    for bad in ["0", "-1", "ten", "", "100001", "1.5"] {
        let e = AuditConfig::check_rate(bad).unwrap_err();
        assert!(e.contains("1 to 100000"), "{bad}: {e}");
    }
    assert_eq!(Target::parse("-"), Target::Stderr);
    assert_eq!(
        Target::parse("/var/log/x.log"),
        Target::File("/var/log/x.log".into())
    );
}

#[test]
fn times_are_rfc3339_utc_with_milliseconds() {
    let t = UNIX_EPOCH + Duration::from_millis(1_764_448_380_512);
    assert_eq!(line::rfc3339_ms(t), "2025-11-29T20:33:00.512Z");
    let t = UNIX_EPOCH + Duration::from_secs(1_764_448_380);
    assert_eq!(line::rfc3339_ms(t), "2025-11-29T20:33:00.000Z");
}

/// Node `node-a` runs `web` (10.244.1.5, isolated for ingress by `default/web-only`,
/// which lets in `app: friend` pods on 8080) and `client` (10.244.1.6); `remote`
/// (10.244.2.7) runs on node-b. The Service `web` (10.96.0.10:80) selects web.
const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata: { name: node-a, annotations: { ferry.io/ipv4-address: 192.168.10.2/24 } }
spec: { podCIDR: 10.244.1.0/24, podCIDRs: [10.244.1.0/24] }
status: { addresses: [{ type: InternalIP, address: 192.168.10.2 }] }
---
apiVersion: v1
kind: Node
metadata: { name: node-b, annotations: { ferry.io/ipv4-address: 192.168.10.3/24 } }
spec: { podCIDR: 10.244.2.0/24, podCIDRs: [10.244.2.0/24] }
status: { addresses: [{ type: InternalIP, address: 192.168.10.3 }] }
---
apiVersion: v1
kind: Pod
metadata: { name: web, namespace: default, labels: { app: web } }
spec: { nodeName: node-a, containers: [{ name: main, image: x }] }
status: { phase: Running, podIP: 10.244.1.5, podIPs: [{ ip: 10.244.1.5 }] }
---
apiVersion: v1
kind: Pod
metadata: { name: client, namespace: default, labels: { app: client } }
spec: { nodeName: node-a, containers: [{ name: main, image: x }] }
status: { phase: Running, podIP: 10.244.1.6, podIPs: [{ ip: 10.244.1.6 }] }
---
apiVersion: v1
kind: Pod
metadata: { name: remote, namespace: other, labels: { app: remote } }
spec: { nodeName: node-b, containers: [{ name: main, image: x }] }
status: { phase: Running, podIP: 10.244.2.7, podIPs: [{ ip: 10.244.2.7 }] }
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-only, namespace: default }
spec:
  podSelector: { matchLabels: { app: web } }
  policyTypes: [Ingress]
  ingress:
  - from: [{ podSelector: { matchLabels: { app: friend } } }]
    ports: [{ protocol: TCP, port: 8080 }]
---
apiVersion: v1
kind: Service
metadata: { name: web, namespace: default }
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  selector: { app: web }
  ports: [{ name: http, protocol: TCP, port: 80, targetPort: 8080 }]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: web-1, namespace: default, labels: { kubernetes.io/service-name: web } }
addressType: IPv4
ports: [{ name: http, protocol: TCP, port: 8080 }]
endpoints: [{ addresses: [10.244.1.5], conditions: { ready: true }, nodeName: node-a }]
"#;

/// Node-a's pipeline, auditing, and the names of its cluster.
fn node_a() -> (Pipeline, Names, Arc<ferry_datapath::Tables>) {
    let (cluster, _) = parse("cluster.yaml", CLUSTER).unwrap_or_else(|e| panic!("{e}"));
    let pods = [
        AttachedPod::new("default", "web"),
        AttachedPod::new("default", "client"),
    ];
    let compiled = node_tables(&cluster, "node-a", None, &pods, &CompileOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let names = Names::of(&cluster, &compiled.pod_ports);
    let mut p = Pipeline::new(Arc::clone(&compiled.compiled));
    p.audit_denials(64);
    (p, names, compiled.compiled)
}

/// A SYN from the client pod's port to `dst`:`dport` from source port `sport`, at `t`.
fn client_syn(
    p: &mut Pipeline,
    tables: &ferry_datapath::Tables,
    dst: &str,
    sport: u16,
    dport: u16,
    t: u64,
) {
    let port = tables
        .ports
        .iter()
        .position(|p| p.name == "pod.default.client")
        .expect("the client's port");
    let spec = &tables.ports[port];
    let o = IpOpts {
        src_mac: spec.peer_mac.expect("the pod's MAC"),
        dst_mac: spec.mac,
        ..IpOpts::default()
    };
    let f = build::tcp(
        "10.244.1.6".parse().unwrap(),
        dst.parse().unwrap(),
        sport,
        dport,
        1,
        0,
        tcp_flags::SYN,
        &[],
        &o,
    );
    let mut out = Vec::new();
    p.process(
        Packet::new(f, port as u16, t),
        &mut out,
        &mut Trace::disabled(),
    );
}

/// A writer the test reads back.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn take(&self) -> Vec<Value> {
        let bytes = std::mem::take(&mut *self.0.lock().unwrap());
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.is_empty() || text.ends_with('\n'), "{text:?}");
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect()
    }
}

fn denials(p: &mut Pipeline) -> Vec<ferry_datapath::Denial> {
    let mut d = Vec::new();
    p.take_denials(usize::MAX, &mut d);
    d
}

/// The wall time of the tests' pipeline time 0.
fn wall(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_764_448_380) + Duration::from_nanos(ns)
}

#[test]
fn a_denied_connection_is_one_line_with_its_pods_ports_direction_and_policy() {
    let (mut p, names, tables) = node_a();
    let lines = Lines::default();
    let mut log = AuditLog::new(Box::new(lines.clone()), "node-a", 100);
    // Through the Service, its SYN sent three times; then straight to the pod.
    for t in [1, 2, 4] {
        client_syn(&mut p, &tables, "10.96.0.10", 40000, 80, t * SEC);
    }
    client_syn(
        &mut p,
        &tables,
        "10.244.1.5",
        40001,
        8080,
        5 * SEC + 512_000_000,
    );
    let d = denials(&mut p);
    assert_eq!(d.len(), 4, "every SYN denied and recorded");
    log.write(&d, &names, 0, 6 * SEC, wall(6 * SEC));
    let got = lines.take();
    assert_eq!(got.len(), 2, "one line per connection: {got:#?}");
    assert_eq!(
        got[0],
        json!({
            "time": "2025-11-29T20:33:01.000Z",
            "node": "node-a",
            "event": "connection_denied",
            "direction": "ingress",
            "protocol": "tcp",
            "src": { "address": "10.244.1.6", "port": 40000, "pod": "default/client" },
            "dst": { "address": "10.244.1.5", "port": 8080, "pod": "default/web" },
            "original_dst": { "address": "10.96.0.10", "port": 80 },
            "isolated_by": ["NetworkPolicy default/web-only"],
        })
    );
    let second = &got[1];
    assert_eq!(second["time"], "2025-11-29T20:33:05.512Z");
    assert_eq!(second["src"]["port"], 40001);
    assert!(second.get("original_dst").is_none(), "not translated");
    assert_eq!(
        log.counts(),
        AuditCounts {
            logged: 2,
            repeated: 2,
            ..AuditCounts::default()
        }
    );
}

#[test]
fn a_denial_by_a_rule_names_the_policy_tier_and_rule() {
    let (_, names, _) = node_a();
    // Another cluster: an Admin tier deny of egress from the client to node-b's pods.
    let admin = format!(
        "{CLUSTER}---\n{}",
        r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: { name: no-other }
spec:
  tier: Admin
  priority: 5
  subject: { pods: { namespaceSelector: {}, podSelector: { matchLabels: { app: client } } } }
  egress:
  - { name: to-other, action: Deny, to: [{ namespaces: { matchLabels: { kubernetes.io/metadata.name: other } } }] }
"#
    );
    let (cluster, _) = parse("cluster.yaml", &admin).unwrap_or_else(|e| panic!("{e}"));
    let pods = [
        AttachedPod::new("default", "web"),
        AttachedPod::new("default", "client"),
    ];
    let compiled = node_tables(&cluster, "node-a", None, &pods, &CompileOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut p = Pipeline::new(Arc::clone(&compiled.compiled));
    p.audit_denials(8);
    client_syn(&mut p, &compiled.compiled, "10.244.2.7", 40002, 5432, SEC);
    let lines = Lines::default();
    let mut log = AuditLog::new(Box::new(lines.clone()), "node-a", 100);
    log.write(&denials(&mut p), &names, 0, SEC, wall(SEC));
    let got = lines.take();
    assert_eq!(got.len(), 1, "{got:#?}");
    let l = &got[0];
    assert_eq!(l["direction"], "egress");
    assert_eq!(
        l["src"],
        json!({ "address": "10.244.1.6", "port": 40002, "pod": "default/client" })
    );
    assert_eq!(
        l["dst"],
        json!({ "address": "10.244.2.7", "port": 5432, "pod": "other/remote" }),
        "another node's pod, by its address"
    );
    assert_eq!(l["tier"], "admin");
    assert_eq!(l["policy"], "ClusterNetworkPolicy no-other");
    assert_eq!(l["rule"], "egress rule to-other");
    assert!(l.get("isolated_by").is_none());
}

#[test]
fn an_allowed_connection_logs_nothing() {
    let (mut p, names, tables) = node_a();
    let lines = Lines::default();
    let mut log = AuditLog::new(Box::new(lines.clone()), "node-a", 100);
    // The client's egress is open, and nothing isolates it: to node-b's pod, allowed.
    client_syn(&mut p, &tables, "10.244.2.7", 40003, 80, SEC);
    log.write(&denials(&mut p), &names, 0, SEC, wall(SEC));
    assert!(lines.take().is_empty());
    assert_eq!(log.counts(), AuditCounts::default());
}

#[test]
fn what_the_rate_limit_refuses_is_counted_and_summed_up_in_one_line_later() {
    let (mut p, names, tables) = node_a();
    let lines = Lines::default();
    let mut log = AuditLog::new(Box::new(lines.clone()), "node-a", 2);
    // Five connections in one instant: the burst of 2 is logged, 3 are not.
    for sport in 41000..41005 {
        client_syn(&mut p, &tables, "10.244.1.5", sport, 8080, SEC);
    }
    log.write(&denials(&mut p), &names, 0, SEC, wall(SEC));
    let got = lines.take();
    let events: Vec<&str> = got.iter().map(|l| l["event"].as_str().unwrap()).collect();
    assert_eq!(
        events,
        [
            "connection_denied",
            "connection_denied",
            "denials_not_logged"
        ]
    );
    assert_eq!(got[2]["reason"], "rate");
    assert_eq!(got[2]["count"], 3);
    assert_eq!(got[2]["message"], "3 denials not logged: rate limit");
    // More refused within the second: summed up once a second has passed.
    for sport in 41005..41010 {
        client_syn(&mut p, &tables, "10.244.1.5", sport, 8080, SEC + 1);
    }
    log.write(&denials(&mut p), &names, 0, SEC + 2, wall(SEC));
    assert!(lines.take().is_empty(), "no token, no summary yet");
    log.write(&[], &names, 0, 2 * SEC + 2, wall(2 * SEC));
    let got = lines.take();
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!(got[0]["count"], 5);
    // The datapath's overflow, from its counter.
    log.write(&[], &names, 7, 4 * SEC, wall(4 * SEC));
    let got = lines.take();
    assert_eq!(got[0]["reason"], "overflow");
    assert_eq!(got[0]["count"], 7);
    assert_eq!(
        log.counts(),
        AuditCounts {
            logged: 2,
            suppressed_rate: 8,
            suppressed_overflow: 7,
            ..AuditCounts::default()
        }
    );
}

/// A writer that fails.
struct Broken;

impl std::io::Write for Broken {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::Error::other("disk full"))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_line_that_cannot_be_written_is_counted() {
    let (mut p, names, tables) = node_a();
    let mut log = AuditLog::new(Box::new(Broken), "node-a", 100);
    client_syn(&mut p, &tables, "10.244.1.5", 42000, 8080, SEC);
    client_syn(&mut p, &tables, "10.244.1.5", 42001, 8080, SEC);
    log.write(&denials(&mut p), &names, 0, SEC, wall(SEC));
    assert_eq!(log.counts().write_errors, 2);
    assert_eq!(log.counts().logged, 0);
}

#[test]
fn a_file_target_is_appended_to() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.log");
    std::fs::write(&path, "earlier\n").unwrap();
    let cfg = AuditConfig {
        target: Target::File(path.clone()),
        rate: 10,
    };
    let mut log = cfg.open("node-a").unwrap();
    log.write(&[], &Names::default(), 3, SEC, wall(SEC));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("earlier\n{"), "{text}");
    assert!(text.contains("\"count\":3"), "{text}");
    let bad = AuditConfig {
        target: Target::File(dir.path().join("no/such/dir/audit.log")),
        rate: 10,
    };
    assert!(bad.open("node-a").is_err());
}
