//! The agent's own health, as kube-proxy reports its: `GET /healthz` and `GET /livez` on
//! port 10256 ([`HealthzServer`]), which cloud load balancers probe for
//! `externalTrafficPolicy: Cluster` Services (GCE, Azure, AWS through cloud-provider-aws).
//!
//! The agent's loop reports what happens ([`ProxyHealth::queued`],
//! [`ProxyHealth::updated`], ...) and the servers' threads read it. The proxy is healthy
//! while the dataplane runs and no cluster change has waited longer than
//! [`PENDING_LIMIT`] to be put in force (kube-proxy: twice its sync period). `/livez`
//! says that alone, and so do the health check node ports ([`crate::health`], as
//! `serviceProxyHealthy`); `/healthz` also needs this node to be eligible for traffic: its Node
//! object neither being deleted nor tainted `ToBeDeletedByClusterAutoscaler`, so that a
//! load balancer drains a node before it goes.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;

use crate::accept::{self, Acceptor, Limiter};

/// kube-proxy's health port (its `--healthz-bind-address` default, `0.0.0.0:10256`).
pub const HEALTHZ_PORT: u16 = 10256;

/// How long a cluster change may wait to be put in force before the proxy counts as
/// unhealthy: kube-proxy's limit, twice its default sync period of 30 s.
pub const PENDING_LIMIT: Duration = Duration::from_secs(60);

/// The taint the cluster autoscaler puts on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// What the agent reports of its health, shared with the threads that answer for it.
#[derive(Debug, Default)]
pub struct ProxyHealth {
    state: Mutex<State>,
}

#[derive(Clone, Copy, Debug, Default)]
struct State {
    /// The dataplane's worker runs.
    running: bool,
    /// When a state of the datastore was last put in force (or found to change nothing).
    last_updated: Option<SystemTime>,
    /// Since when the oldest change not yet in force waits.
    pending_since: Option<Instant>,
    /// This node's Node object is being deleted, or the autoscaler is about to.
    node_leaving: bool,
}

/// The health at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// The dataplane runs, and no change has waited [`PENDING_LIMIT`] or longer.
    pub healthy: bool,
    /// This node may take traffic: its Node object is neither being deleted nor tainted
    /// [`TO_BE_DELETED_TAINT`].
    pub node_eligible: bool,
    /// When a state was last put in force.
    pub last_updated: Option<SystemTime>,
}

impl ProxyHealth {
    /// Nothing running, nothing in force yet.
    pub fn new() -> ProxyHealth {
        ProxyHealth::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The dataplane's worker started (`true`) or stopped.
    pub fn set_running(&self, running: bool) {
        self.state().running = running;
    }

    /// A cluster change was seen that is not in force yet; the oldest such change counts.
    pub fn queued(&self) {
        self.queued_at(Instant::now());
    }

    pub(crate) fn queued_at(&self, at: Instant) {
        self.state().pending_since.get_or_insert(at);
    }

    /// The datastore's last state is in force: nothing is pending.
    pub fn updated(&self) {
        let mut s = self.state();
        s.last_updated = Some(SystemTime::now());
        s.pending_since = None;
    }

    /// This node's Node object as last seen (None: not there).
    pub fn set_node(&self, node: Option<&Node>) {
        self.state().node_leaving = node.is_some_and(leaving);
    }

    /// The health now.
    pub fn status(&self) -> Status {
        self.status_at(Instant::now())
    }

    pub(crate) fn status_at(&self, now: Instant) -> Status {
        let s = *self.state();
        let late = s
            .pending_since
            .is_some_and(|t| now.saturating_duration_since(t) >= PENDING_LIMIT);
        Status {
            healthy: s.running && !late,
            node_eligible: !s.node_leaving,
            last_updated: s.last_updated,
        }
    }
}

/// Whether `node` is on its way out: being deleted, or tainted by the cluster autoscaler
/// that is about to delete it (as kube-proxy decides).
fn leaving(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_some()
        || node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT))
}

/// `/healthz` and `/livez` on one address; dropping it stops the server.
pub struct HealthzServer {
    addr: SocketAddr,
    _acceptor: Acceptor,
}

impl HealthzServer {
    /// Serves `health` on `addr` (an IPv6 address takes IPv4 too; the IPv6 wildcard falls
    /// back to the IPv4 one on a host without IPv6), with the limits of every HTTP server
    /// of the agent ([`Limiter`]).
    pub fn bind(addr: SocketAddr, health: Arc<ProxyHealth>) -> io::Result<HealthzServer> {
        let listener = accept::listen(addr)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let limiter = Limiter::new();
        let acceptor = Acceptor::spawn(
            "ferry-healthz".into(),
            move || listener.accept().map(|(c, _)| c),
            move |conn| {
                let health = Arc::clone(&health);
                limiter.serve(conn, "ferry-healthz-conn", move |conn, head| {
                    let (status, body) = answer(head, &health.status(), SystemTime::now());
                    respond(conn, status, &body)
                });
            },
        )?;
        Ok(HealthzServer {
            addr,
            _acceptor: acceptor,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// The status line and body answering the request whose head is `head`, as kube-proxy
/// answers: `/healthz` 200 when healthy and the node eligible, `/livez` 200 when
/// healthy, else 503; any other path 404.
fn answer(head: &[u8], s: &Status, now: SystemTime) -> (&'static str, String) {
    let head = String::from_utf8_lossy(head);
    let target = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("/");
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    let times = format!(
        "\"lastUpdated\": {}, \"currentTime\": {}",
        time_json(s.last_updated),
        time_json(Some(now))
    );
    let status = |ok: bool| {
        if ok {
            "200 OK"
        } else {
            "503 Service Unavailable"
        }
    };
    match path {
        "/healthz" => (
            status(s.healthy && s.node_eligible),
            format!("{{{times}, \"nodeEligible\": {}}}\n", s.node_eligible),
        ),
        "/livez" => (status(s.healthy), format!("{{{times}}}\n")),
        _ => ("404 Not Found", "try /healthz or /livez\n".to_string()),
    }
}

/// `t` as a JSON string in RFC 3339 (UTC), or null.
fn time_json(t: Option<SystemTime>) -> String {
    t.and_then(|t| Timestamp::try_from(t).ok())
        .map_or_else(|| "null".to_string(), |t| format!("\"{t}\""))
}

fn respond(conn: &TcpStream, status: &str, body: &str) -> io::Result<()> {
    let ctype = if status.starts_with("404") {
        "text/plain"
    } else {
        "application/json"
    };
    let mut w = conn;
    write!(
        w,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nX-Content-Type-Options: nosniff\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::io::Read;

    fn running() -> ProxyHealth {
        let h = ProxyHealth::new();
        h.set_running(true);
        h.updated();
        h
    }

    #[test]
    fn a_change_pending_past_the_limit_makes_the_proxy_unhealthy() {
        let h = running();
        let t0 = Instant::now();
        assert!(h.status_at(t0).healthy);
        h.queued_at(t0);
        // A later change does not start the wait again.
        h.queued_at(t0 + Duration::from_secs(30));
        assert!(
            h.status_at(t0 + PENDING_LIMIT - Duration::from_millis(1))
                .healthy
        );
        assert!(!h.status_at(t0 + PENDING_LIMIT).healthy);
        // Put in force: healthy again.
        h.updated();
        assert!(h.status_at(t0 + PENDING_LIMIT * 10).healthy);
        assert!(h.status().last_updated.is_some());
    }

    #[test]
    fn a_stopped_dataplane_is_unhealthy() {
        let h = running();
        h.set_running(false);
        assert!(!h.status().healthy);
        assert!(!ProxyHealth::new().status().healthy, "never started");
    }

    #[test]
    fn a_node_being_deleted_or_tainted_by_the_autoscaler_is_not_eligible() {
        let h = running();
        let mut node = Node::default();
        h.set_node(Some(&node));
        assert!(h.status().node_eligible);
        node.spec = Some(NodeSpec {
            taints: Some(vec![Taint {
                key: "node.kubernetes.io/unschedulable".into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            }]),
            ..NodeSpec::default()
        });
        h.set_node(Some(&node));
        assert!(h.status().node_eligible, "another taint");
        let mut tainted = node.clone();
        tainted
            .spec
            .as_mut()
            .unwrap()
            .taints
            .as_mut()
            .unwrap()
            .push(Taint {
                key: TO_BE_DELETED_TAINT.into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            });
        h.set_node(Some(&tainted));
        assert!(!h.status().node_eligible);
        let mut deleted = node;
        deleted.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        h.set_node(Some(&deleted));
        assert!(!h.status().node_eligible);
        // Its health is its own.
        assert!(h.status().healthy);
        h.set_node(None);
        assert!(h.status().node_eligible);
    }

    fn get(path: &str, s: Status) -> (&'static str, serde_json::Value) {
        let head = format!("GET {path} HTTP/1.1\r\nHost: node\r\n\r\n");
        let (status, body) = answer(head.as_bytes(), &s, SystemTime::UNIX_EPOCH);
        let json = serde_json::from_str(&body).unwrap_or(serde_json::Value::Null);
        (status, json)
    }

    #[test]
    fn healthz_needs_health_and_an_eligible_node_livez_health_alone() {
        let updated = SystemTime::UNIX_EPOCH + Duration::from_millis(1_500);
        let ok = Status {
            healthy: true,
            node_eligible: true,
            last_updated: Some(updated),
        };
        let (status, body) = get("/healthz", ok);
        assert_eq!(status, "200 OK");
        assert_eq!(
            body,
            serde_json::json!({
                "lastUpdated": "1970-01-01T00:00:01.5Z",
                "currentTime": "1970-01-01T00:00:00Z",
                "nodeEligible": true,
            })
        );
        let (status, body) = get("/livez?verbose", ok);
        assert_eq!(status, "200 OK");
        assert_eq!(
            body,
            serde_json::json!({
                "lastUpdated": "1970-01-01T00:00:01.5Z",
                "currentTime": "1970-01-01T00:00:00Z",
            })
        );

        let leaving = Status {
            node_eligible: false,
            ..ok
        };
        let (status, body) = get("/healthz", leaving);
        assert_eq!(status, "503 Service Unavailable");
        assert_eq!(body["nodeEligible"], false);
        assert_eq!(get("/livez", leaving).0, "200 OK");

        let unhealthy = Status {
            healthy: false,
            last_updated: None,
            ..ok
        };
        let (status, body) = get("/healthz", unhealthy);
        assert_eq!(status, "503 Service Unavailable");
        assert_eq!(body["nodeEligible"], true);
        assert_eq!(body["lastUpdated"], serde_json::Value::Null);
        assert_eq!(get("/livez", unhealthy).0, "503 Service Unavailable");

        assert_eq!(get("/metrics", ok).0, "404 Not Found");
    }

    #[test]
    fn the_server_answers_over_http() {
        let health = Arc::new(running());
        let server =
            HealthzServer::bind("127.0.0.1:0".parse().unwrap(), Arc::clone(&health)).unwrap();
        let get = |path: &str| {
            let mut c = TcpStream::connect(server.addr()).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            write!(c, "GET {path} HTTP/1.1\r\nHost: node\r\n\r\n").unwrap();
            let mut answer = String::new();
            c.read_to_string(&mut answer).unwrap();
            answer
        };
        let a = get("/healthz");
        assert!(a.starts_with("HTTP/1.1 200 OK\r\n"), "{a}");
        assert!(a.contains("Content-Type: application/json\r\n"), "{a}");
        assert!(a.ends_with("\"nodeEligible\": true}\n"), "{a}");
        health.set_running(false);
        let a = get("/livez");
        assert!(a.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{a}");
    }
}
