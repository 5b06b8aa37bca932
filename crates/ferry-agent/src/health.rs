//! Health check node ports: what an external load balancer asks a node before sending it
//! traffic for a Service with `externalTrafficPolicy: Local`.
//!
//! As kube-proxy: for each such Service with `spec.healthCheckNodePort`, an HTTP server
//! on that port of every node address answers any GET with 200 when this node has local
//! endpoints of the Service and the proxy is healthy ([`crate::proxy_health`]: no cluster
//! change waited too long to be put in force), else 503, with a JSON body naming the
//! Service, the count and the proxy's health (`serviceProxyHealthy`), and the count in
//! `X-Load-Balancing-Endpoint-Weight`.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, PoisonError};

use crate::accept::{self, Acceptor, Limiter};
use crate::compile::HealthCheck;
use crate::proxy_health::ProxyHealth;

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
    proxy: Arc<ProxyHealth>,
}

impl HealthServers {
    /// No servers yet; those to come answer for the Services and, as
    /// `serviceProxyHealthy`, for `proxy`.
    pub fn new(proxy: Arc<ProxyHealth>) -> HealthServers {
        HealthServers {
            answers: Arc::new(Mutex::new(BTreeMap::new())),
            listeners: BTreeMap::new(),
            proxy,
        }
    }

    /// The ports served.
    pub fn ports(&self) -> Vec<u16> {
        self.listeners.keys().copied().collect()
    }

    /// Serves exactly `checks`: new ports start listening, gone ones stop, counts change
    /// in place. Returns the ports that could not be opened, with the error;
    /// [`HealthServers::open_missing`] tries them again.
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
        *self.answers.lock().unwrap_or_else(PoisonError::into_inner) = answers;
        self.open_missing()
    }

    /// Opens the ports of the checks served that have no listener yet (they could not
    /// be opened before: another process held the port). Returns those that still
    /// cannot be, with the error.
    pub fn open_missing(&mut self) -> Vec<(u16, io::Error)> {
        let ports: Vec<u16> = self
            .answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .copied()
            .filter(|p| !self.listeners.contains_key(p))
            .collect();
        let mut failed = Vec::new();
        for port in ports {
            match listen(port, Arc::clone(&self.answers), Arc::clone(&self.proxy)) {
                Ok(l) => {
                    self.listeners.insert(port, l);
                }
                Err(e) => failed.push((port, e)),
            }
        }
        failed
    }
}

fn listen(
    port: u16,
    answers: Arc<Mutex<BTreeMap<u16, Answer>>>,
    proxy: Arc<ProxyHealth>,
) -> io::Result<Acceptor> {
    // The IPv6 wildcard, which takes IPv4 too (also where the host makes IPv6 sockets
    // IPv6-only by default); IPv4 only on a host without IPv6.
    let sock = accept::listen(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)))?;
    sock.set_nonblocking(true)?;
    // Each connection on a thread of its own, a few at once, each bounded in time: a
    // slow or idle client neither keeps the load balancer's probes from their answer
    // nor, when the port goes, delays the agent that stops the server.
    let limiter = Limiter::new();
    Acceptor::spawn(
        format!("health-{port}"),
        move || sock.accept().map(|(c, _)| c),
        move |conn| {
            let answers = Arc::clone(&answers);
            let proxy = Arc::clone(&proxy);
            limiter.serve(conn, &format!("health-{port}-conn"), move |conn, _| {
                let answer = answers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&port)
                    .cloned();
                match answer {
                    Some(a) => respond(conn, &a, proxy.status().healthy),
                    None => Ok(()),
                }
            });
        },
    )
}

/// Answers a request (whatever it asks); `proxy_healthy` is the agent's own health.
fn respond(conn: &TcpStream, a: &Answer, proxy_healthy: bool) -> io::Result<()> {
    let body = format!(
        "{{\"service\": {{\"namespace\": {}, \"name\": {}}}, \"localEndpoints\": {}, \"serviceProxyHealthy\": {proxy_healthy}}}\n",
        json_string(&a.namespace),
        json_string(&a.name),
        a.local_endpoints
    );
    let status = if a.local_endpoints > 0 && proxy_healthy {
        "200 OK"
    } else {
        "503 Service Unavailable"
    };
    let mut w = conn;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy_health::PENDING_LIMIT;
    use std::io::Read;
    use std::net::TcpListener;
    use std::time::{Duration, Instant};

    /// A port nothing listens on now.
    fn free_port() -> u16 {
        TcpListener::bind("[::]:0")
            .or_else(|_| TcpListener::bind("0.0.0.0:0"))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// A proxy that runs with its state in force.
    fn healthy() -> Arc<ProxyHealth> {
        let p = Arc::new(ProxyHealth::new());
        p.set_running(true);
        p.updated();
        p
    }

    fn check(port: u16, local_endpoints: usize) -> HealthCheck {
        HealthCheck {
            service: "default/web".into(),
            port,
            local_endpoints,
        }
    }

    /// The whole answer to a GET of `port` on 127.0.0.1, or what went wrong.
    fn get(port: u16) -> io::Result<String> {
        get_at("127.0.0.1", port)
    }

    /// The whole answer to a GET of `port` at `addr`, or what went wrong.
    fn get_at(addr: &str, port: u16) -> io::Result<String> {
        let mut c = TcpStream::connect((addr, port))?;
        c.set_read_timeout(Some(Duration::from_secs(3)))?;
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n")?;
        let mut answer = String::new();
        c.read_to_string(&mut answer)?;
        Ok(answer)
    }

    /// Idle connections, as many as the port serves at once, do not keep a probe from
    /// its answer: the oldest of them that has not sent its request yet gives way.
    #[test]
    fn idle_connections_do_not_starve_a_probe() {
        let port = free_port();
        let mut servers = HealthServers::new(healthy());
        assert!(servers.set(&[check(port, 2)]).is_empty());
        let idle: Vec<TcpStream> = (0..crate::accept::MAX_CONNECTIONS)
            .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
            .collect();
        // Each idle one is accepted and holds its place before the probe comes.
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        let answer = get(port).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer:?}");
        assert!(answer.contains("\"localEndpoints\": 2"), "{answer}");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        drop(idle);
    }

    /// While a cluster change waits too long to be put in force, every port answers 503
    /// and says the proxy is not healthy, local endpoints or not, as kube-proxy does: the
    /// load balancer must not trust counts the dataplane may not follow.
    #[test]
    fn a_change_pending_too_long_fails_every_port() {
        let port = free_port();
        let proxy = healthy();
        let mut servers = HealthServers::new(Arc::clone(&proxy));
        assert!(servers.set(&[check(port, 2)]).is_empty());
        let a = get(port).unwrap();
        assert!(a.starts_with("HTTP/1.1 200 OK\r\n"), "{a}");
        assert!(a.contains("\"serviceProxyHealthy\": true"), "{a}");
        let past = Instant::now().checked_sub(PENDING_LIMIT).unwrap();
        proxy.queued_at(past);
        let a = get(port).unwrap();
        assert!(a.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{a}");
        assert!(a.contains("\"localEndpoints\": 2"), "{a}");
        assert!(a.contains("\"serviceProxyHealthy\": false"), "{a}");
        assert!(a.contains("X-Load-Balancing-Endpoint-Weight: 2\r\n"), "{a}");
        // Put in force at last.
        proxy.updated();
        assert!(get(port).unwrap().starts_with("HTTP/1.1 200 OK\r\n"));
    }

    /// Where the host makes IPv6 sockets IPv6-only by default (`net.ipv6.bindv6only=1`,
    /// a setting of each network namespace), a port still answers probes over IPv4, as
    /// over IPv6. Needs root and iproute2.
    #[test]
    fn ipv4_probes_are_answered_where_ipv6_sockets_are_ipv6_only_by_default() {
        let answers = crate::testing::in_netns("hc6", || -> io::Result<[String; 2]> {
            // This thread's namespace is the test's own.
            std::fs::write("/proc/sys/net/ipv6/bindv6only", "1")?;
            let port = 10256;
            let mut servers = HealthServers::new(healthy());
            if let Some((_, e)) = servers.set(&[check(port, 1)]).pop() {
                return Err(e);
            }
            Ok([get_at("127.0.0.1", port)?, get_at("::1", port)?])
        })
        .unwrap();
        for a in answers {
            assert!(a.starts_with("HTTP/1.1 200 OK\r\n"), "{a:?}");
        }
    }
}
