//! Prometheus metrics: `GET /metrics` on a configurable address, in the Prometheus text
//! format.
//!
//! The server keeps no state of its own: each scrape asks the agent for its counters over
//! the local API socket (the same `counters` request `ferry status` makes) and writes
//! them out, so a scrape never holds up the agent's loop for longer than answering that
//! request, and the metrics are exactly what `ferry status` shows.

use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use ferry_api::{Counters, Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::accept::Acceptor;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortLabel {
    port: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// `c` in the Prometheus text format: every metric named `ferry_*`, counters ending in
/// `_total`, per-port and per-reason values as labels.
pub fn render(c: &Counters) -> String {
    let mut reg = Registry::with_prefix("ferry");
    let family = |reg: &mut Registry, name: &str, help: &str| {
        let f = Family::<PortLabel, Counter>::default();
        reg.register(name, help, f.clone());
        f
    };
    let rx_packets = family(&mut reg, "port_rx_packets", "Packets received per port");
    let rx_bytes = family(&mut reg, "port_rx_bytes", "Bytes received per port");
    let tx_packets = family(&mut reg, "port_tx_packets", "Packets sent per port");
    let tx_bytes = family(&mut reg, "port_tx_bytes", "Bytes sent per port");
    for p in &c.ports {
        let l = PortLabel {
            port: p.name.clone(),
        };
        rx_packets.get_or_create(&l).inc_by(p.rx_packets);
        rx_bytes.get_or_create(&l).inc_by(p.rx_bytes);
        tx_packets.get_or_create(&l).inc_by(p.tx_packets);
        tx_bytes.get_or_create(&l).inc_by(p.tx_bytes);
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
        &mut reg,
        "conntrack_entries",
        "Connections tracked",
        c.ct_entries as i64,
    );
    counter(
        &mut reg,
        "conntrack_inserts",
        "Connections inserted",
        c.ct_inserted,
    );
    counter(
        &mut reg,
        "conntrack_insert_failures",
        "New connections refused because the table was full",
        c.ct_insert_failed,
    );
    counter(
        &mut reg,
        "reassembled_datagrams",
        "Datagrams completed from fragments",
        c.reassembled,
    );
    counter(
        &mut reg,
        "service_connections",
        "New connections to a Service given an endpoint",
        c.service_balanced,
    );
    counter(
        &mut reg,
        "service_rejects",
        "New connections to a Service refused without endpoints",
        c.service_rejected,
    );
    gauge(
        &mut reg,
        "tables_generation",
        "Generation of the tables in force",
        c.generation as i64,
    );
    let mut out = String::new();
    if encode(&mut out, &reg).is_err() {
        let _ = writeln!(out, "# encoding failed");
    }
    out
}

/// The metrics endpoint; dropping it stops the server.
pub struct MetricsServer {
    addr: SocketAddr,
    _acceptor: Acceptor,
}

impl MetricsServer {
    /// Serves `/metrics` on `addr`, asking the agent at `api_socket` at each scrape.
    pub fn bind(addr: SocketAddr, api_socket: PathBuf) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let acceptor = Acceptor::spawn(
            "ferry-metrics".into(),
            move || listener.accept().map(|(c, _)| c),
            move |conn| {
                let sock = api_socket.clone();
                let _ = thread::Builder::new()
                    .name("ferry-metrics-conn".into())
                    .spawn(move || serve(conn, &sock));
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

fn serve(conn: TcpStream, api_socket: &std::path::Path) -> io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(&conn);
    let mut first = String::new();
    reader.read_line(&mut first)?;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
    }
    let path = first.split_whitespace().nth(1).unwrap_or("/");
    let (status, ctype, body) = if path != "/metrics" {
        ("404 Not Found", "text/plain", "try /metrics\n".to_string())
    } else {
        match crate::api::call(api_socket, &Request::Counters) {
            Ok(Response::Ok(a)) => (
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                render(&a.counters.unwrap_or_default()),
            ),
            Ok(Response::Error(e)) => ("503 Service Unavailable", "text/plain", e.msg + "\n"),
            Err(e) => (
                "503 Service Unavailable",
                "text/plain",
                format!("the agent does not answer: {e}\n"),
            ),
        }
    };
    let mut w = &conn;
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
    fn counters_render_as_prometheus_text_with_labels() {
        let c = Counters {
            generation: 2,
            ports: vec![ferry_api::PortCounters {
                name: "uplink".into(),
                rx_packets: 7,
                ..Default::default()
            }],
            drops: [("ct_invalid".to_string(), 3)].into(),
            ct_entries: 5,
            ..Counters::default()
        };
        let t = render(&c);
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
    }
}
