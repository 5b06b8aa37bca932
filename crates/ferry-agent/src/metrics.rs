//! Prometheus metrics: `GET /metrics` on a configurable address, in the Prometheus text
//! format.
//!
//! The server keeps no state of its own: each scrape asks the agent for its counters over
//! the local API socket (the same `counters` request `ferry status` makes) and writes
//! them out, so a scrape never holds up the agent's loop for longer than answering that
//! request, and the metrics are exactly what `ferry status` shows.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;

use ferry_api::{Counters, Request, Response};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use crate::accept::{self, Acceptor, Limiter};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortLabel {
    port: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortReasonLabel {
    port: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: String,
    direction: &'static str,
    verdict: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabel {
    service: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabel {
    worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

/// A histogram whose buckets were counted elsewhere (the agent keeps the sync latency
/// histogram; a scrape only writes it out): bounds in seconds, per-bucket counts.
#[derive(Debug)]
struct Counted {
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl TypedMetric for Counted {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Counted {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

fn us_to_s(us: u64) -> f64 {
    us as f64 / 1e6
}

/// `c` in the Prometheus text format: every metric named `ferry_*`, counters ending in
/// `_total`, per-port and per-reason values as labels; and kube-proxy's
/// `kubeproxy_sync_proxy_rules_duration_seconds` (see [`render_agent`]).
pub fn render(c: &Counters) -> String {
    render_with(c, None)
}

/// [`render`], with the standard `process_*` metrics of `process` (the agent's own
/// figures, [`ferry_linux::process`]) when given.
pub fn render_with(c: &Counters, process: Option<&ferry_linux::process::ProcessStats>) -> String {
    let mut root = Registry::default();
    if let Some(p) = process {
        render_process(&mut root, p);
    }
    render_kube_proxy(&mut root, c);
    let reg = root.sub_registry_with_prefix("ferry");
    let family = |reg: &mut Registry, name: &str, help: &str| {
        let f = Family::<PortLabel, Counter>::default();
        reg.register(name, help, f.clone());
        f
    };
    let rx_packets = family(reg, "port_rx_packets", "Packets received per port");
    let rx_bytes = family(reg, "port_rx_bytes", "Bytes received per port");
    let tx_packets = family(reg, "port_tx_packets", "Packets sent per port");
    let tx_bytes = family(reg, "port_tx_bytes", "Bytes sent per port");
    for p in &c.ports {
        let l = PortLabel {
            port: p.name.clone(),
        };
        rx_packets.get_or_create(&l).inc_by(p.rx_packets);
        rx_bytes.get_or_create(&l).inc_by(p.rx_bytes);
        tx_packets.get_or_create(&l).inc_by(p.tx_packets);
        tx_bytes.get_or_create(&l).inc_by(p.tx_bytes);
    }
    let port_drops = Family::<PortReasonLabel, Counter>::default();
    reg.register(
        "port_drops",
        "Packets received on a port and dropped, by port and reason",
        port_drops.clone(),
    );
    for p in &c.ports {
        for (reason, n) in &p.drops {
            port_drops
                .get_or_create(&PortReasonLabel {
                    port: p.name.clone(),
                    reason: reason.clone(),
                })
                .inc_by(*n);
        }
    }
    if let Some(b) = &c.build {
        let labels: Vec<(String, String)> = [
            ("version", b.version.as_str()),
            ("commit", b.commit.as_str()),
            ("dirty", if b.dirty { "true" } else { "false" }),
            ("profile", b.profile.as_str()),
            ("target", b.target.as_str()),
            ("rustc", b.rustc.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        reg.register("build", "The agent's build", Info::new(labels));
    }
    let drops = Family::<ReasonLabel, Counter>::default();
    reg.register("drops", "Packets dropped, by reason", drops.clone());
    for (reason, n) in &c.drops {
        drops
            .get_or_create(&ReasonLabel {
                reason: reason.clone(),
            })
            .inc_by(*n);
    }
    let gauge = |reg: &mut Registry, name: &str, help: &str, v: i64| {
        let g = Gauge::<i64>::default();
        g.set(v);
        reg.register(name, help, g);
    };
    let counter = |reg: &mut Registry, name: &str, help: &str, v: u64| {
        let c = Counter::<u64>::default();
        c.inc_by(v);
        reg.register(name, help, c);
    };
    gauge(
        reg,
        "conntrack_entries",
        "Connections tracked",
        c.ct_entries as i64,
    );
    counter(
        reg,
        "conntrack_inserts",
        "Connections inserted",
        c.ct_inserted,
    );
    counter(
        reg,
        "conntrack_insert_failures",
        "New connections refused because the table was full",
        c.ct_insert_failed,
    );
    counter(
        reg,
        "reassembled_datagrams",
        "Datagrams completed from fragments",
        c.reassembled,
    );
    counter(
        reg,
        "service_connections",
        "New connections to a Service given an endpoint",
        c.service_balanced,
    );
    counter(
        reg,
        "service_rejects",
        "New connections to a Service refused without endpoints",
        c.service_rejected,
    );
    counter(
        reg,
        "conntrack_recovered_packets",
        "Segments of a Service endpoint whose connection was lost, translated back through the frontend that chose it",
        c.ct_recovered,
    );
    counter(
        reg,
        "conntrack_recovery_refuted",
        "Frontends tried for such segments that the client refused or left unanswered",
        c.ct_recovery_refuted,
    );
    gauge(
        reg,
        "neighbour_waiting_packets",
        "Packets waiting for their next hop's MAC",
        c.neigh_waiting as i64,
    );
    counter(
        reg,
        "neighbour_queued_packets",
        "Packets that waited for their next hop's MAC",
        c.neigh_queued,
    );
    gauge(
        reg,
        "tables_generation",
        "Generation of the tables in force",
        c.generation as i64,
    );
    let family = Family::<ServiceLabel, Counter>::default();
    reg.register(
        "service_source_denied",
        "New connections to a Service's load balancer IPs refused by its loadBalancerSourceRanges, per Service port",
        family.clone(),
    );
    for (service, n) in &c.service_source_denied {
        let l = ServiceLabel {
            service: service.clone(),
        };
        family.get_or_create(&l).inc_by(*n);
    }
    render_fragments(reg, c);
    render_policies(reg, c);
    render_policy_audit(reg, c);
    render_enforcement(reg, c);
    gauge(
        reg,
        "nat_ports_in_use",
        "Source NAT ports and ICMP identifiers in use",
        c.nat_ports_in_use as i64,
    );
    render_workers(reg, c);
    render_agent(reg, c);
    let mut out = String::new();
    if encode(&mut out, &root).is_err() {
        let _ = writeln!(out, "# encoding failed");
    }
    out
}

/// Each worker thread's counts, one family per count, labelled by worker.
fn render_workers(reg: &mut Registry, c: &Counters) {
    type Count = fn(&ferry_api::WorkerCounters) -> u64;
    let counts: [(&str, &str, Count); 6] = [
        (
            "worker_rx_frames",
            "Frames received per worker thread",
            |w| w.rx_frames,
        ),
        (
            "worker_tx_frames",
            "Frames handed to ports for sending per worker thread",
            |w| w.tx_frames,
        ),
        (
            "worker_rounds",
            "Rounds of each worker thread's loop",
            |w| w.rounds,
        ),
        (
            "worker_busy_rounds",
            "Rounds of each worker thread that polled without sleeping (busy polling)",
            |w| w.busy_rounds,
        ),
        (
            "worker_tx_dropped",
            "Frames each worker thread dropped on the way out (port full or out of service)",
            |w| w.tx_dropped,
        ),
        (
            "worker_ports_gone",
            "Pod ports each worker thread took out of service because their device went away",
            |w| w.ports_gone,
        ),
    ];
    for (name, help, count) in counts {
        let family = Family::<WorkerLabel, Counter>::default();
        reg.register(name, help, family.clone());
        for (i, w) in c.workers.iter().enumerate() {
            let l = WorkerLabel {
                worker: i.to_string(),
            };
            family.get_or_create(&l).inc_by(count(w));
        }
    }
}

/// Policy decisions: totals, and per policy, direction and verdict.
fn render_policies(reg: &mut Registry, c: &Counters) {
    for (name, help, v) in [
        (
            "policy_allowed_connections",
            "Directions of new connections a policy rule allowed",
            c.policy_allowed,
        ),
        (
            "policy_denied_connections",
            "Directions of new connections policy denied",
            c.policy_denied,
        ),
    ] {
        let n = Counter::<u64>::default();
        n.inc_by(v);
        reg.register(name, help, n);
    }
    let family = Family::<PolicyLabel, Counter>::default();
    reg.register(
        "policy_connections",
        "New connections decided per policy, by direction and verdict",
        family.clone(),
    );
    for (policy, p) in &c.policies {
        for (direction, verdict, n) in [
            ("ingress", "allowed", p.ingress_allowed),
            ("ingress", "denied", p.ingress_denied),
            ("egress", "allowed", p.egress_allowed),
            ("egress", "denied", p.egress_denied),
        ] {
            let l = PolicyLabel {
                policy: policy.clone(),
                direction,
                verdict,
            };
            family.get_or_create(&l).inc_by(n);
        }
    }
}

/// The audit log of denied connections, when it is on.
fn render_policy_audit(reg: &mut Registry, c: &Counters) {
    let Some(a) = &c.policy_audit else { return };
    for (name, help, v) in [
        (
            "policy_audit_logged",
            "Lines the policy audit log wrote for denied connections",
            a.logged,
        ),
        (
            "policy_audit_repeated",
            "Denials not logged as repeats of a connection logged (retransmissions)",
            a.repeated,
        ),
        (
            "policy_audit_write_errors",
            "Lines the policy audit log could not write",
            a.write_errors,
        ),
    ] {
        let n = Counter::<u64>::default();
        n.inc_by(v);
        reg.register(name, help, n);
    }
    let family = Family::<ReasonLabel, Counter>::default();
    reg.register(
        "policy_audit_suppressed",
        "Denials the policy audit log did not log, by reason (rate, overflow)",
        family.clone(),
    );
    for (reason, n) in [
        ("rate", a.suppressed_rate),
        ("overflow", a.suppressed_overflow),
    ] {
        family
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc_by(n);
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UnenforcedLabel {
    kind: String,
    policy: String,
    state: &'static str,
}

/// The policies in force by kind, and each one not enforced as written (1, labelled by
/// what is enforced of it).
fn render_enforcement(reg: &mut Registry, c: &Counters) {
    let e = &c.enforcement;
    let in_force = Family::<KindLabel, Gauge>::default();
    reg.register("policies", "Policies in force, by kind", in_force.clone());
    for (kind, n) in [
        ("NetworkPolicy", e.network_policies),
        ("ClusterNetworkPolicy", e.cluster_network_policies),
    ] {
        in_force
            .get_or_create(&KindLabel { kind: kind.into() })
            .set(n as i64);
    }
    let unenforced = Family::<UnenforcedLabel, Gauge>::default();
    reg.register(
        "policies_unenforced",
        "Policies not enforced as written (1 each): not_enforced, older_version, still_enforced or deviation",
        unenforced.clone(),
    );
    for u in &e.unenforced {
        let l = UnenforcedLabel {
            kind: u.kind.clone(),
            policy: u.policy.clone(),
            state: u.state.name(),
        };
        unenforced.get_or_create(&l).set(1);
    }
}

fn render_fragments(reg: &mut Registry, c: &Counters) {
    let g = Gauge::<i64>::default();
    g.set(c.fragments_held as i64);
    reg.register(
        "fragment_held_datagrams",
        "Datagrams whose fragments are held waiting for the rest",
        g,
    );
    let g = Gauge::<i64>::default();
    g.set(c.fragment_bytes_held as i64);
    reg.register("fragment_held_bytes", "Bytes of fragments held", g);
    let e = Counter::<u64>::default();
    e.inc_by(c.fragments_expired);
    reg.register(
        "fragments_expired",
        "Held fragments discarded because their datagram timed out",
        e,
    );
    let refused = Family::<ReasonLabel, Counter>::default();
    reg.register(
        "fragments_refused",
        "Fragments refused or discarded, by reason",
        refused.clone(),
    );
    for (reason, n) in &c.fragments_refused {
        refused
            .get_or_create(&ReasonLabel {
                reason: reason.clone(),
            })
            .inc_by(*n);
    }
}

/// The table sync histogram of `c`.
fn sync_histogram(c: &Counters) -> Counted {
    histogram(&c.sync)
}

/// The histogram of the figures `s`.
fn histogram(s: &ferry_api::SyncLatency) -> Counted {
    Counted {
        sum: us_to_s(s.sum_us),
        count: s.count,
        buckets: s
            .buckets
            .iter()
            .map(|&(le, n)| {
                let le = if le == u64::MAX {
                    f64::INFINITY
                } else {
                    us_to_s(le)
                };
                (le, n)
            })
            .collect(),
    }
}

/// kube-proxy's metric of what ferry does in its place, for the dashboards and alerts
/// written for kube-proxy: `kubeproxy_sync_proxy_rules_duration_seconds`, the time from
/// changes reaching the proxy to its rules (ferry's tables) in force, which is
/// `ferry_table_sync_duration_seconds` under kube-proxy's name; and
/// `kubeproxy_network_programming_duration_seconds`, from each EndpointSlice change's
/// trigger time in the API server to its tables in force.
fn render_kube_proxy(root: &mut Registry, c: &Counters) {
    root.register(
        "kubeproxy_sync_proxy_rules_duration_seconds",
        "From changes reaching the proxy to its rules in force (ferry_table_sync_duration_seconds)",
        sync_histogram(c),
    );
    root.register(
        "kubeproxy_network_programming_duration_seconds",
        "From an EndpointSlice's change in the API server (its last-change-trigger-time) to the proxy's rules with it in force",
        histogram(&c.programming),
    );
}

/// The standard process metrics, as the Go and Python clients name them.
fn render_process(root: &mut Registry, p: &ferry_linux::process::ProcessStats) {
    let f = |v: f64| {
        let g = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        g.set(v);
        g
    };
    let cpu = Counter::<f64, std::sync::atomic::AtomicU64>::default();
    cpu.inc_by(p.cpu_seconds);
    root.register(
        "process_cpu_seconds",
        "Total user and system CPU time spent in seconds",
        cpu,
    );
    for (name, help, v) in [
        (
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            p.resident_bytes as f64,
        ),
        (
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            p.virtual_bytes as f64,
        ),
        (
            "process_open_fds",
            "Number of open file descriptors",
            p.open_fds as f64,
        ),
        (
            "process_max_fds",
            "Maximum number of open file descriptors",
            p.max_fds as f64,
        ),
        (
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            p.start_time_seconds,
        ),
    ] {
        root.register(name, help, f(v));
    }
}

fn render_agent(reg: &mut Registry, c: &Counters) {
    let s = &c.sync;
    reg.register(
        "table_sync_duration_seconds",
        "From a cluster change reaching the agent to the worker using the tables made from it",
        sync_histogram(c),
    );
    let max = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    max.set(us_to_s(s.max_us));
    reg.register(
        "table_sync_max_duration_seconds",
        "The longest table sync since start",
        max,
    );
    let errors = Family::<KindLabel, Counter>::default();
    reg.register(
        "agent_errors",
        "The agent's errors by kind: datastore, compile, apply, api",
        errors.clone(),
    );
    let e = &c.errors;
    for (kind, n) in [
        ("datastore", e.datastore),
        ("compile", e.compile),
        ("apply", e.apply),
        ("api", e.api),
    ] {
        errors
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc_by(n);
    }
    let d = &c.datastore;
    let synced = Gauge::<i64>::default();
    synced.set(i64::from(d.synced));
    reg.register(
        "datastore_synced",
        "1 when the datastore's last state is in force, else 0",
        synced,
    );
    let errs = Counter::<u64>::default();
    errs.inc_by(d.errors_total);
    reg.register(
        "datastore_errors",
        "States refused and watch errors of the datastore",
        errs,
    );
    let last = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    last.set(d.last_sync_unix_ms.map_or(0.0, |ms| ms as f64 / 1e3));
    reg.register(
        "datastore_last_sync_timestamp_seconds",
        "When a state from the datastore was last put in force (Unix time; 0: never)",
        last,
    );
}

/// One sample of the text format: `name{labels} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The sample's name (with `_total`, `_bucket`, `_sum` or `_count` where its type
    /// adds one).
    pub name: String,
    /// Its labels, in order.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
}

/// Reads the text `render` writes, strictly: every line is `# HELP NAME TEXT`,
/// `# TYPE NAME TYPE`, a sample `NAME{LABELS} VALUE` of the family declared just before,
/// or the final `# EOF`. Names and label names are snake_case `[a-z_][a-z0-9_]*`; the
/// error names the line.
pub fn parse(text: &str) -> Result<Vec<Sample>, String> {
    fn is_name(s: &str) -> bool {
        s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    }
    let mut samples = Vec::new();
    let mut family: Option<(String, String)> = None;
    let mut eof = false;
    for (i, line) in text.lines().enumerate() {
        let bad = |why: &str| format!("line {}: {why}: {line:?}", i + 1);
        if eof {
            return Err(bad("after # EOF"));
        }
        if line == "# EOF" {
            eof = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default();
            if !is_name(name) || rest.len() <= name.len() + 1 {
                return Err(bad("a HELP line needs a name and a text"));
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').ok_or_else(|| bad("TYPE NAME TYPE"))?;
            let known = [
                "counter",
                "gauge",
                "histogram",
                "summary",
                "info",
                "stateset",
                "unknown",
            ];
            if !is_name(name) || !known.contains(&ty) {
                return Err(bad("a TYPE line needs a name and a known type"));
            }
            family = Some((name.to_string(), ty.to_string()));
            continue;
        }
        let (head, value) = line.rsplit_once(' ').ok_or_else(|| bad("NAME VALUE"))?;
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| bad("the value is not a number"))?,
        };
        let (name, labels) = match head.split_once('{') {
            None => (head, Vec::new()),
            Some((name, l)) => {
                let l = l
                    .strip_suffix('}')
                    .ok_or_else(|| bad("labels end with }"))?;
                let mut labels = Vec::new();
                for pair in l.split(',').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').ok_or_else(|| bad("label=\"value\""))?;
                    let v = v
                        .strip_prefix('"')
                        .and_then(|v| v.strip_suffix('"'))
                        .ok_or_else(|| bad("label values are quoted"))?;
                    if !is_name(k) {
                        return Err(bad("label names are snake_case"));
                    }
                    labels.push((k.to_string(), v.to_string()));
                }
                (name, labels)
            }
        };
        let (fam, ty) = family
            .as_ref()
            .ok_or_else(|| bad("a sample before any TYPE line"))?;
        let suffixes: &[&str] = match ty.as_str() {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            "info" => &["_info"],
            _ => &[""],
        };
        if !suffixes.iter().any(|s| name == format!("{fam}{s}")) {
            return Err(bad(&format!("not a sample of the {ty} {fam}")));
        }
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    if !eof {
        return Err("no # EOF at the end".into());
    }
    Ok(samples)
}

/// The metrics endpoint; dropping it stops the server.
pub struct MetricsServer {
    addr: SocketAddr,
    _acceptor: Acceptor,
}

impl MetricsServer {
    /// Serves `/metrics` on `addr`, asking the agent at `api_socket` at each scrape.
    pub fn bind(addr: SocketAddr, api_socket: PathBuf) -> io::Result<MetricsServer> {
        let listener = accept::listen(addr)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        // Scrapes on threads of their own, a few at once, each bounded in time.
        let limiter = Limiter::new();
        let acceptor = Acceptor::spawn(
            "ferry-metrics".into(),
            move || listener.accept().map(|(c, _)| c),
            move |conn| {
                let sock = api_socket.clone();
                limiter.serve(conn, "ferry-metrics-conn", move |conn, head| {
                    respond(conn, head, &sock)
                });
            },
        )?;
        Ok(MetricsServer {
            addr,
            _acceptor: acceptor,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Answers the request whose head is `head`.
fn respond(conn: &TcpStream, head: &[u8], api_socket: &std::path::Path) -> io::Result<()> {
    let head = String::from_utf8_lossy(head);
    let first = head.lines().next().unwrap_or_default();
    let path = first.split_whitespace().nth(1).unwrap_or("/");
    let (status, ctype, body) = if path != "/metrics" {
        ("404 Not Found", "text/plain", "try /metrics\n".to_string())
    } else {
        match crate::api::call(api_socket, &Request::Counters) {
            Ok(Response::Ok(a)) => (
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                render_with(
                    &a.counters.unwrap_or_default(),
                    ferry_linux::process::stats().ok().as_ref(),
                ),
            ),
            Ok(Response::Error(e)) => ("503 Service Unavailable", "text/plain", e.msg + "\n"),
            Err(e) => (
                "503 Service Unavailable",
                "text/plain",
                format!("the agent does not answer: {e}\n"),
            ),
        }
    };
    let mut w = conn;
    write!(
        w,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_metrics_and_kube_proxys_sync_histogram_are_there() {
        let c = Counters {
            sync: ferry_api::SyncLatency {
                count: 2,
                sum_us: 3_000,
                buckets: vec![(1_000, 1), (5_000, 2), (u64::MAX, 2)],
                ..Default::default()
            },
            programming: ferry_api::SyncLatency {
                count: 1,
                sum_us: 1_500_000,
                buckets: vec![(1_000_000, 0), (2_000_000, 1), (u64::MAX, 0)],
                ..Default::default()
            },
            ..Counters::default()
        };
        let p = ferry_linux::process::ProcessStats {
            cpu_seconds: 1.5,
            resident_bytes: 1 << 20,
            virtual_bytes: 1 << 30,
            open_fds: 12,
            max_fds: 1024,
            start_time_seconds: 1_700_000_000.0,
        };
        let samples = parse(&render_with(&c, Some(&p))).unwrap();
        let value = |name: &str| {
            samples
                .iter()
                .find(|s| s.name == name)
                .map(|s| s.value)
                .unwrap_or_else(|| panic!("no {name}"))
        };
        assert_eq!(value("process_cpu_seconds_total"), 1.5);
        assert_eq!(value("process_resident_memory_bytes"), 1_048_576.0);
        assert_eq!(value("process_open_fds"), 12.0);
        assert_eq!(value("process_max_fds"), 1024.0);
        assert_eq!(value("process_start_time_seconds"), 1_700_000_000.0);
        assert_eq!(
            value("kubeproxy_sync_proxy_rules_duration_seconds_count"),
            2.0
        );
        assert_eq!(
            value("kubeproxy_sync_proxy_rules_duration_seconds_sum"),
            value("ferry_table_sync_duration_seconds_sum")
        );
        assert_eq!(
            value("kubeproxy_network_programming_duration_seconds_count"),
            1.0
        );
        assert_eq!(
            value("kubeproxy_network_programming_duration_seconds_sum"),
            1.5
        );
        let bucket = |le: &str| {
            samples
                .iter()
                .find(|s| {
                    s.name == "kubeproxy_network_programming_duration_seconds_bucket"
                        && s.labels.iter().any(|(k, v)| k == "le" && v == le)
                })
                .map(|s| s.value)
                .unwrap_or_else(|| panic!("no bucket {le}"))
        };
        assert_eq!(bucket("1.0"), 0.0);
        assert_eq!(bucket("2.0"), 1.0);
        // Without the process's figures, no process metrics.
        assert!(!render(&c).contains("process_"));
    }
    use std::time::Duration;

    #[test]
    fn counters_render_as_prometheus_text_with_labels() {
        let c = Counters {
            generation: 2,
            ports: vec![ferry_api::PortCounters {
                name: "uplink".into(),
                rx_packets: 7,
                drops: [("ct_invalid".to_string(), 3)].into(),
                ..Default::default()
            }],
            drops: [("ct_invalid".to_string(), 3)].into(),
            ct_entries: 5,
            service_source_denied: [("default/lb:http".to_string(), 4)].into(),
            ..Counters::default()
        };
        let t = render(&c);
        assert!(
            t.contains("ferry_service_source_denied_total{service=\"default/lb:http\"} 4"),
            "{t}"
        );
        assert!(
            t.contains("ferry_port_drops_total{port=\"uplink\",reason=\"ct_invalid\"} 3"),
            "{t}"
        );
        assert!(
            t.contains("ferry_port_rx_packets_total{port=\"uplink\"} 7"),
            "{t}"
        );
        assert!(
            t.contains("ferry_drops_total{reason=\"ct_invalid\"} 3"),
            "{t}"
        );
        assert!(t.contains("ferry_conntrack_entries 5"), "{t}");
        assert!(t.contains("# TYPE ferry_conntrack_inserts counter"), "{t}");
        assert!(t.trim_end().ends_with("# EOF"), "{t}");
        assert!(!t.contains("ferry_build_info"), "no build known: {t}");
        let built = Counters {
            build: Some(crate::build::info()),
            ..c
        };
        let t = render(&built);
        let b = crate::build::info();
        let line = format!(
            "ferry_build_info{{version=\"{}\",commit=\"{}\",dirty=\"{}\",profile=\"{}\",target=\"{}\",rustc=\"{}\"}} 1",
            b.version, b.commit, b.dirty, b.profile, b.target, b.rustc
        );
        assert!(t.contains(&line), "{line} in {t}");
        assert!(t.contains("# TYPE ferry_build info"), "{t}");
        parse(&t).unwrap_or_else(|e| panic!("{e}\n{t}"));
    }

    #[test]
    fn the_policy_audit_counters_render_only_when_it_is_on() {
        let off = render(&Counters::default());
        assert!(!off.contains("policy_audit"), "{off}");
        let c = Counters {
            policy_audit: Some(ferry_api::PolicyAuditCounters {
                logged: 4,
                repeated: 9,
                suppressed_rate: 2,
                suppressed_overflow: 1,
                write_errors: 3,
            }),
            ..Counters::default()
        };
        let t = render(&c);
        parse(&t).unwrap_or_else(|e| panic!("{e}\n{t}"));
        for line in [
            "ferry_policy_audit_logged_total 4",
            "ferry_policy_audit_repeated_total 9",
            "ferry_policy_audit_write_errors_total 3",
            "ferry_policy_audit_suppressed_total{reason=\"rate\"} 2",
            "ferry_policy_audit_suppressed_total{reason=\"overflow\"} 1",
        ] {
            assert!(t.lines().any(|l| l == line), "no {line} in\n{t}");
        }
    }

    #[test]
    fn policies_in_force_and_each_one_not_enforced_as_written_are_gauges() {
        let c = Counters {
            enforcement: ferry_api::PolicyEnforcement {
                network_policies: 3,
                cluster_network_policies: 1,
                unenforced: vec![ferry_api::UnenforcedPolicy {
                    kind: "NetworkPolicy".into(),
                    policy: "default/deny".into(),
                    state: ferry_api::Enforcement::OlderVersion,
                    enforced_version: None,
                    latest_version: None,
                    reasons: vec!["refused: spec.podSelector: bad".into()],
                }],
                stale: None,
            },
            ..Counters::default()
        };
        let t = render(&c);
        let samples = parse(&t).unwrap_or_else(|e| panic!("{e}\n{t}"));
        // A family's samples come in no set order: sorted by labels.
        let get = |name: &str| -> Vec<(Vec<(String, String)>, f64)> {
            let mut v: Vec<_> = (samples.iter())
                .filter(|s| s.name == name)
                .map(|s| (s.labels.clone(), s.value))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        let l = |kv: &[(&str, &str)]| -> Vec<(String, String)> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            get("ferry_policies"),
            [
                (l(&[("kind", "ClusterNetworkPolicy")]), 1.0),
                (l(&[("kind", "NetworkPolicy")]), 3.0)
            ]
        );
        assert_eq!(
            get("ferry_policies_unenforced"),
            [(
                l(&[
                    ("kind", "NetworkPolicy"),
                    ("policy", "default/deny"),
                    ("state", "older_version")
                ]),
                1.0
            )]
        );
        assert!(t.contains("# TYPE ferry_policies_unenforced gauge"), "{t}");
        let none = render(&Counters::default());
        assert!(!none.contains("ferry_policies_unenforced{"), "{none}");
    }

    #[test]
    fn every_line_is_help_type_a_sample_or_eof() {
        let mut status = crate::status::AgentStatus::new();
        status.set_datastore("file", "/etc/ferry/cluster");
        status.datastore_applied(1);
        status.synced(Duration::from_millis(3));
        status.synced(Duration::from_secs(9));
        status.count(crate::status::ErrorKind::Api);
        let c = Counters {
            ports: vec![ferry_api::PortCounters {
                name: "pod.default.web".into(),
                ..Default::default()
            }],
            drops: [("ct_invalid".to_string(), 3)].into(),
            fragments_held: 2,
            fragments_expired: 4,
            fragments_refused: [("overlapped".to_string(), 5), ("too_small".to_string(), 0)].into(),
            datastore: status.datastore(),
            sync: status.sync(),
            errors: status.errors(),
            ..Counters::default()
        };
        let t = render(&c);
        let samples = parse(&t).unwrap_or_else(|e| panic!("{e}\n{t}"));
        let value = |name: &str, labels: &[(&str, &str)]| {
            samples
                .iter()
                .find(|s| {
                    s.name == name
                        && s.labels.len() == labels.len()
                        && labels
                            .iter()
                            .all(|(k, v)| s.labels.iter().any(|(a, b)| a == k && b == v))
                })
                .map(|s| s.value)
                .unwrap_or_else(|| panic!("no {name} {labels:?} in\n{t}"))
        };
        assert_eq!(value("ferry_table_sync_duration_seconds_count", &[]), 2.0);
        assert_eq!(value("ferry_table_sync_duration_seconds_sum", &[]), 9.003);
        assert_eq!(
            value(
                "ferry_table_sync_duration_seconds_bucket",
                &[("le", "0.005")]
            ),
            1.0
        );
        assert_eq!(
            value(
                "ferry_table_sync_duration_seconds_bucket",
                &[("le", "+Inf")]
            ),
            2.0,
            "buckets are cumulative"
        );
        assert_eq!(value("ferry_table_sync_max_duration_seconds", &[]), 9.0);
        assert_eq!(value("ferry_agent_errors_total", &[("kind", "api")]), 1.0);
        assert_eq!(
            value("ferry_agent_errors_total", &[("kind", "compile")]),
            0.0
        );
        assert_eq!(value("ferry_datastore_synced", &[]), 1.0);
        assert_eq!(value("ferry_datastore_errors_total", &[]), 0.0);
        assert!(value("ferry_datastore_last_sync_timestamp_seconds", &[]) > 1.7e9);
        assert_eq!(value("ferry_fragment_held_datagrams", &[]), 2.0);
        assert_eq!(value("ferry_fragment_held_bytes", &[]), 0.0);
        assert_eq!(value("ferry_fragments_expired_total", &[]), 4.0);
        assert_eq!(
            value("ferry_fragments_refused_total", &[("reason", "overlapped")]),
            5.0
        );
        assert_eq!(value("ferry_nat_ports_in_use", &[]), 0.0);
        assert_eq!(
            value(
                "ferry_port_rx_packets_total",
                &[("port", "pod.default.web")]
            ),
            0.0
        );
    }

    #[test]
    fn the_parser_refuses_what_is_not_the_format() {
        let ok = "# HELP ferry_x X.\n# TYPE ferry_x gauge\nferry_x 1\n# EOF\n";
        assert_eq!(parse(ok).unwrap().len(), 1);
        for bad in [
            "# TYPE ferry_x gauge\nferry_x 1\n",
            "ferry_x 1\n# EOF\n",
            "# TYPE ferry_x gauge\nferry_x one\n# EOF\n",
            "# TYPE ferry_x gauge\nferry_y 1\n# EOF\n",
            "# TYPE ferry_x counter\nferry_x 1\n# EOF\n",
            "# TYPE ferry_x gauge\nferry_x{Port=\"a\"} 1\n# EOF\n",
            "# TYPE ferry_x gauge\nferry_x{port=a} 1\n# EOF\n",
            "# TYPE ferry_x gauge\n# EOF\nferry_x 1\n",
            "# TYPE ferry_x sometimes\n# EOF\n",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
