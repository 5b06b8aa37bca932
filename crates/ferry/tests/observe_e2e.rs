//! What the running agent shows of itself: `ferry conntrack list|delete` after a real
//! connection to a ClusterIP Service, `ferry services`, the datastore's health in
//! `ferry status`, and the metrics, on the two-node lab of `agent_e2e`
//! (`common/two_nodes.rs`). Needs root, iproute2, curl and python3.

mod common;

use std::path::Path;

use common::two_nodes::TwoNodes;
use ferry_agent::api::call;
use ferry_api::{Counters, CtAnswer, CtFilter, Request, Response, ServiceInfo};

const SERVICE_IP: &str = "10.96.0.10";
const CLIENT_IP: &str = "10.244.1.5";
const WEB_IP: &str = "10.244.2.5";
const METRICS: &str = "127.0.0.1:9251";

/// `ARGS --api-socket SOCKET`.
fn with_socket<'a>(sock: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut v = args.to_vec();
    v.extend(["--api-socket", sock]);
    v
}

/// `ferry ARGS --api-socket SOCKET`: its exit status, stdout and stderr.
fn ferry(sock: &Path, args: &[&str]) -> (bool, String, String) {
    let s = sock.display().to_string();
    common::ferry(&with_socket(&s, args))
}

/// `ferry ARGS --api-socket SOCKET` must succeed; its stdout and stderr.
fn ok(sock: &Path, args: &[&str]) -> (String, String) {
    let s = sock.display().to_string();
    common::ferry_ok(&with_socket(&s, args))
}

/// The conntrack lines of the client's connections to the Service.
fn service_lines(sock: &Path) -> Vec<String> {
    let (out, err) = ok(sock, &["conntrack", "list", "--addr", SERVICE_IP]);
    let lines: Vec<String> = out.lines().map(str::to_string).collect();
    assert!(
        err.contains(&format!("{} flow entries have been shown", lines.len())),
        "{err}"
    );
    lines
}

#[test]
fn conntrack_services_status_and_metrics_of_a_running_agent() {
    let c = TwoNodes::with_file_datastore("ob", &["--metrics-addr", METRICS]);
    let dir = c.manifest_dir();
    let sock = c.socket(1);

    assert_eq!(
        c.curl("p1a", &format!("http://{SERVICE_IP}/hostname")),
        "web"
    );

    // The connection, with the reply tuple after DNAT to the endpoint on node 2.
    let lines = service_lines(&sock);
    let line = lines
        .iter()
        .find(|l| {
            l.starts_with("tcp 6 ")
                && l.contains(&format!("src={CLIENT_IP} dst={SERVICE_IP} sport="))
                && l.contains(&format!("src={WEB_IP} dst={CLIENT_IP} sport=8080 dport="))
        })
        .unwrap_or_else(|| panic!("no DNATed connection to {SERVICE_IP}: {lines:?}"));
    assert!(line.contains("dport=80 "), "{line}");

    let (json, _) = ok(
        &sock,
        &["conntrack", "list", "--addr", SERVICE_IP, "--json"],
    );
    let a: CtAnswer = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(a.matched, a.entries.len());
    assert!(!a.truncated);
    let e = a
        .entries
        .iter()
        .find(|e| e.line == *line)
        .unwrap_or_else(|| panic!("{line} not in {json}"));
    assert_eq!(e.proto, "tcp");
    assert_eq!(e.original.src.to_string(), CLIENT_IP);
    assert_eq!(e.original.dport, Some(80));
    assert_eq!(e.reply.src.to_string(), WEB_IP);
    assert_eq!(e.reply.sport, Some(8080));
    assert_eq!(e.reply.dport, e.original.sport);
    assert!(e.status.iter().any(|s| s == "dnat"), "{json}");
    assert!(e.mark & 1 == 1, "balanced to a Service endpoint: {json}");
    assert!(e.packets_original > 0 && e.packets_reply > 0, "{json}");
    assert!(e.tcp_state.is_some() && !e.unreplied, "{json}");

    // The Service, its endpoint, and the connection counted for both.
    let (svc, _) = ok(&sock, &["services"]);
    assert!(svc.contains("default/web:http"), "{svc}");
    assert!(
        svc.contains(&format!("frontend  {SERVICE_IP}:80/tcp ClusterIP")),
        "{svc}"
    );
    assert!(svc.contains("frontend  *:30080/tcp NodePort"), "{svc}");
    assert!(
        svc.contains(&format!("{WEB_IP}:8080")) && svc.contains("node node2"),
        "{svc}"
    );
    let (json, _) = ok(&sock, &["services", "--json"]);
    let services: Vec<ServiceInfo> = serde_json::from_str(&json).unwrap();
    let web = services
        .iter()
        .find(|s| s.namespace == "default" && s.name == "web")
        .unwrap_or_else(|| panic!("{json}"));
    let port = &web.ports[0];
    assert!(port.connections.is_some_and(|n| n >= 1), "{json}");
    let ep = &port.endpoints[0];
    assert_eq!(ep.address.to_string(), WEB_IP);
    assert!(
        !ep.local && ep.ready && ep.connections.is_some_and(|n| n >= 1),
        "{json}"
    );

    // Bad filters fail before anything is asked, and change nothing.
    let (ok_, _, err) = ferry(&sock, &["conntrack", "list", "--proto", "bogus"]);
    assert!(!ok_);
    assert!(
        err.contains("--proto \"bogus\"") && err.contains("tcp, udp"),
        "{err}"
    );
    let (ok_, _, err) = ferry(&sock, &["conntrack", "delete"]);
    assert!(!ok_);
    assert!(err.contains("--all"), "{err}");
    let (ok_, _, err) = ferry(&sock, &["conntrack", "delete", "--state", "OPEN"]);
    assert!(!ok_);
    assert!(err.contains("ESTABLISHED"), "{err}");
    assert!(
        service_lines(&sock).contains(line),
        "a refused delete deleted something"
    );
    // The agent refuses a bad filter too (and counts the error).
    match call(
        &sock,
        &Request::Conntrack {
            filter: CtFilter {
                proto: Some("bogus".into()),
                ..CtFilter::default()
            },
            delete: true,
            limit: None,
        },
    )
    .unwrap()
    {
        Response::Error(e) => assert_eq!(e.code, ferry_api::ERR_BAD_REQUEST, "{e:?}"),
        r => panic!("{r:?}"),
    }
    // Reading a capture that was never started is refused.
    match call(&sock, &Request::CaptureRead { session: None }).unwrap() {
        Response::Error(e) => {
            assert_eq!(e.code, ferry_api::ERR_BAD_REQUEST, "{e:?}");
            assert!(e.details.contains("no capture is running"), "{e:?}");
        }
        r => panic!("{r:?}"),
    }

    // Deleting by the client's address removes the connection.
    let (out, _) = ok(&sock, &["conntrack", "delete", "--addr", CLIENT_IP]);
    let n: usize = out
        .strip_suffix(" flow entries have been deleted.\n")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(n >= 1, "{out}");
    assert_eq!(service_lines(&sock), Vec::<String>::new());

    // The datastore's health.
    let (json, _) = ok(&sock, &["status", "--json"]);
    let st: Counters = serde_json::from_str(&json).unwrap();
    assert_eq!(st.datastore.kind, "file");
    assert_eq!(st.datastore.source, dir.display().to_string());
    assert!(st.datastore.synced, "{json}");
    assert!(st.datastore.last_sync_unix_ms.is_some(), "{json}");
    assert!(
        st.sync.count >= 1 && st.sync.max_us >= st.sync.last_us,
        "{json}"
    );
    assert_eq!(st.errors.api, 2, "the two refused requests: {json}");
    let (human, _) = ok(&sock, &["status"]);
    assert!(
        human.contains(&format!("datastore file {}: synced", dir.display())),
        "{human}"
    );

    // The metrics: the text format, strictly, with the new names.
    let m = c.lab.run(
        "n1",
        5,
        &[
            "curl",
            "-sS",
            "--max-time",
            "3",
            &format!("http://{METRICS}/metrics"),
        ],
    );
    let samples = ferry_agent::metrics::parse(&m).unwrap_or_else(|e| panic!("{e}\n{m}"));
    let value = |name: &str, label: Option<(&str, &str)>| {
        samples
            .iter()
            .find(|s| {
                s.name == name
                    && label.is_none_or(|(k, v)| s.labels.iter().any(|(a, b)| a == k && b == v))
            })
            .map(|s| s.value)
            .unwrap_or_else(|| panic!("no {name} {label:?} in\n{m}"))
    };
    assert_eq!(value("ferry_datastore_synced", None), 1.0);
    assert_eq!(value("ferry_datastore_errors_total", None), 0.0);
    assert!(value("ferry_table_sync_duration_seconds_count", None) >= 1.0);
    assert!(
        value(
            "ferry_table_sync_duration_seconds_bucket",
            Some(("le", "+Inf"))
        ) >= 1.0
    );
    assert_eq!(
        value("kubeproxy_sync_proxy_rules_duration_seconds_count", None),
        value("ferry_table_sync_duration_seconds_count", None)
    );
    // The agent process's own figures.
    assert!(value("process_resident_memory_bytes", None) > 1e6);
    assert!(value("process_cpu_seconds_total", None) > 0.0);
    assert!(value("process_open_fds", None) >= 3.0);
    assert!(value("process_start_time_seconds", None) > 1.7e9);
    assert_eq!(
        value("ferry_agent_errors_total", Some(("kind", "api"))),
        2.0
    );
    assert_eq!(
        value("ferry_agent_errors_total", Some(("kind", "compile"))),
        0.0
    );
    for name in [
        "ferry_fragment_held_datagrams",
        "ferry_fragment_held_bytes",
        "ferry_fragments_expired_total",
        "ferry_nat_ports_in_use",
        "ferry_table_sync_max_duration_seconds",
    ] {
        value(name, None);
    }
    value(
        "ferry_fragments_refused_total",
        Some(("reason", "overlapped")),
    );
}
