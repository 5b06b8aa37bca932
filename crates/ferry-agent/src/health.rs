//! Health check node ports: what an external load balancer asks a node before sending it
//! traffic for a Service with `externalTrafficPolicy: Local`.
//!
//! As kube-proxy: for each such Service with `spec.healthCheckNodePort`, an HTTP server
//! on that port of every node address answers any GET with 200 when this node has local
//! endpoints of the Service and 503 when it has none, with a JSON body naming the
//! Service and the count, and the count in `X-Load-Balancing-Endpoint-Weight`.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, PoisonError};

use crate::accept::{self, Acceptor};
use crate::compile::HealthCheck;

/// What one port answers.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Answer {
    namespace: String,
    name: String,
    local_endpoints: usize,
}

/// The health check servers of a node, one listener per port, changed with
/// [`HealthServers::set`].
pub struct HealthServers {
    answers: Arc<Mutex<BTreeMap<u16, Answer>>>,
    listeners: BTreeMap<u16, Acceptor>,
}

impl Default for HealthServers {
    fn default() -> Self {
        HealthServers::new()
    }
}

impl HealthServers {
    /// No servers yet.
    pub fn new() -> HealthServers {
        HealthServers {
            answers: Arc::new(Mutex::new(BTreeMap::new())),
            listeners: BTreeMap::new(),
        }
    }

    /// The ports served.
    pub fn ports(&self) -> Vec<u16> {
        self.listeners.keys().copied().collect()
    }

    /// Serves exactly `checks`: new ports start listening, gone ones stop, counts change
    /// in place. Returns the ports that could not be opened, with the error.
    pub fn set(&mut self, checks: &[HealthCheck]) -> Vec<(u16, io::Error)> {
        let mut answers = BTreeMap::new();
        for c in checks {
            let (namespace, name) = c.service.split_once('/').unwrap_or(("", &c.service));
            answers.insert(
                c.port,
                Answer {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    local_endpoints: c.local_endpoints,
                },
            );
        }
        self.listeners.retain(|p, _| answers.contains_key(p));
        let mut failed = Vec::new();
        for &port in answers.keys() {
            if self.listeners.contains_key(&port) {
                continue;
            }
            match listen(port, Arc::clone(&self.answers)) {
                Ok(l) => {
                    self.listeners.insert(port, l);
                }
                Err(e) => failed.push((port, e)),
            }
        }
        *self.answers.lock().unwrap_or_else(PoisonError::into_inner) = answers;
        failed
    }
}

fn listen(port: u16, answers: Arc<Mutex<BTreeMap<u16, Answer>>>) -> io::Result<Acceptor> {
    // The IPv6 wildcard takes IPv4 too (unless the host forbids dual-stack sockets, then
    // IPv4 only).
    let sock = TcpListener::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)))
        .or_else(|_| TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port))))?;
    sock.set_nonblocking(true)?;
    // Each connection on a thread of its own, a few at once, each bounded in time: a
    // slow client neither delays the load balancer's probes nor, when the port goes,
    // the agent that stops the server.
    let busy = Arc::new(AtomicUsize::new(0));
    Acceptor::spawn(
        format!("health-{port}"),
        move || sock.accept().map(|(c, _)| c),
        move |conn| {
            let answers = Arc::clone(&answers);
            accept::serve_limited(&busy, &format!("health-{port}-conn"), move || {
                let answer = answers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&port)
                    .cloned();
                if let Some(a) = answer {
                    let _ = serve(conn, &a);
                }
            });
        },
    )
}

/// Reads the request head (whatever it asks) and answers.
fn serve(conn: TcpStream, a: &Answer) -> io::Result<()> {
    accept::read_head(&conn)?;
    accept::write_timeout(&conn)?;
    let body = format!(
        "{{\"service\": {{\"namespace\": {}, \"name\": {}}}, \"localEndpoints\": {}, \"serviceProxyHealthy\": true}}\n",
        json_string(&a.namespace),
        json_string(&a.name),
        a.local_endpoints
    );
    let status = if a.local_endpoints > 0 {
        "200 OK"
    } else {
        "503 Service Unavailable"
    };
    let mut w = &conn;
    write!(
        w,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\nX-Load-Balancing-Endpoint-Weight: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        a.local_endpoints,
        body.len()
    )?;
    w.flush()
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}
