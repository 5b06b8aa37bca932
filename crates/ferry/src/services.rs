//! `ferry services`: the Services of the running agent's tables, with their frontends,
//! policies, endpoints and connections, asked over its local API socket.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};
use ferry_api::{FrontendInfo, Request, Response, ServiceInfo};

/// Arguments of `ferry services`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The agent's local API socket.
    #[arg(long, value_name = "PATH", default_value = ferry_api::DEFAULT_SOCKET)]
    pub api_socket: PathBuf,
    #[command(flatten)]
    pub output: crate::output::Output,
}

/// Asks the agent and prints its Services.
pub fn run(args: &Args) -> Result<()> {
    let r = crate::ask::ask(&args.api_socket, &Request::Services)?;
    let services = match r {
        Response::Ok(a) => a
            .services
            .ok_or_else(|| anyhow!("the agent's answer has no Services"))?,
        Response::Error(e) => bail!("the agent refused: {} ({})", e.msg, e.details),
    };
    args.output.print(&services, || render(&services))
}

fn frontend(f: &FrontendInfo) -> String {
    let addr = match f.address {
        Some(std::net::IpAddr::V6(a)) => format!("[{a}]"),
        Some(a) => a.to_string(),
        None => "*".into(),
    };
    let kind = match f.kind.as_str() {
        "cluster_ip" => "ClusterIP",
        "node_port" => "NodePort",
        "external_ip" => "ExternalIP",
        "load_balancer_ip" => "LoadBalancer",
        k => k,
    };
    format!("{addr}:{}/{} {kind}", f.port, f.proto)
}

fn connections(n: Option<u64>) -> String {
    n.map_or_else(|| "?".into(), |n| n.to_string())
}

/// One block per Service port: its frontends, policies and endpoints.
fn render(services: &[ServiceInfo]) -> String {
    let mut s = String::new();
    if services.is_empty() {
        let _ = writeln!(s, "no Services");
    }
    for svc in services {
        for p in &svc.ports {
            let affinity = p
                .affinity_timeout_s
                .map_or_else(|| "none".into(), |t| format!("ClientIP {t}s"));
            let mut balance = p.balance.clone();
            if let Some(seed) = p.seed {
                let _ = write!(balance, " seed {seed:#x}");
            }
            match p.maglev_table {
                Some(m) => {
                    let _ = write!(balance, " table {m}");
                }
                None if p.balance == "consistent" => balance.push_str(" rendezvous"),
                None => {}
            }
            let _ = writeln!(
                s,
                "{}/{}:{}  {}  policy internal={} external={}{}  affinity {}  balance {}  \
                 connections {}",
                svc.namespace,
                svc.name,
                p.port_name,
                p.proto,
                p.internal_policy,
                p.external_policy,
                if p.external_snat { " (snat)" } else { "" },
                affinity,
                if balance.is_empty() { "?" } else { &balance },
                connections(p.connections),
            );
            for f in &p.frontends {
                let _ = writeln!(s, "  frontend  {}", frontend(f));
            }
            if !p.source_ranges.is_empty() {
                let _ = writeln!(s, "  load balancer sources  {}", p.source_ranges.join(", "));
            }
            if p.endpoints.is_empty() {
                let _ = writeln!(s, "  endpoint  none");
            }
            for e in &p.endpoints {
                let addr = match e.address {
                    std::net::IpAddr::V6(a) => format!("[{a}]:{}", e.port),
                    a => format!("{a}:{}", e.port),
                };
                let mut cond: Vec<&str> = Vec::new();
                if e.ready {
                    cond.push("ready");
                }
                if e.serving && !e.ready {
                    cond.push("serving");
                }
                if e.terminating {
                    cond.push("terminating");
                }
                if cond.is_empty() {
                    cond.push("not-ready");
                }
                let _ = writeln!(
                    s,
                    "  endpoint  {addr:<24} {:<6} node {:<16} {:<24} connections {}",
                    if e.local { "local" } else { "remote" },
                    e.node.as_deref().unwrap_or("-"),
                    cond.join(","),
                    connections(e.connections),
                );
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_api::{EndpointInfo, ServicePortInfo};

    #[test]
    fn each_service_port_shows_its_frontends_and_endpoints() {
        let svc = ServiceInfo {
            namespace: "default".into(),
            name: "web".into(),
            ports: vec![ServicePortInfo {
                port_name: "http".into(),
                proto: "tcp".into(),
                frontends: vec![
                    FrontendInfo {
                        kind: "cluster_ip".into(),
                        address: Some("10.96.0.10".parse().unwrap()),
                        port: 80,
                        proto: "tcp".into(),
                        scope: "internal".into(),
                    },
                    FrontendInfo {
                        kind: "node_port".into(),
                        address: None,
                        port: 30080,
                        proto: "tcp".into(),
                        scope: "external".into(),
                    },
                ],
                internal_policy: "cluster".into(),
                external_policy: "local".into(),
                endpoints: vec![EndpointInfo {
                    address: "10.244.2.5".parse().unwrap(),
                    port: 8080,
                    node: Some("node2".into()),
                    local: false,
                    ready: true,
                    serving: true,
                    terminating: false,
                    connections: Some(2),
                }],
                connections: Some(2),
                balance: "maglev".into(),
                seed: Some(0x2a),
                maglev_table: Some(251),
                ..ServicePortInfo::default()
            }],
        };
        let t = render(std::slice::from_ref(&svc));
        assert!(
            t.starts_with("default/web:http  tcp  policy internal=cluster external=local"),
            "{t}"
        );
        assert!(t.contains("frontend  10.96.0.10:80/tcp ClusterIP"), "{t}");
        assert!(t.contains("frontend  *:30080/tcp NodePort"), "{t}");
        assert!(
            t.contains("10.244.2.5:8080") && t.contains("node node2"),
            "{t}"
        );
        assert!(t.contains("ready") && t.contains("connections 2"), "{t}");
        assert!(t.contains("balance maglev seed 0x2a table 251"), "{t}");
        let mut random = svc;
        random.ports[0].balance = "random".into();
        let mut small = random.clone();
        random.ports[0].seed = None;
        random.ports[0].maglev_table = None;
        let t = render(&[random]);
        assert!(t.contains("  balance random  connections 2"), "{t}");
        small.ports[0].balance = "consistent".into();
        small.ports[0].maglev_table = None;
        let t = render(&[small]);
        assert!(t.contains("balance consistent seed 0x2a rendezvous"), "{t}");
        assert_eq!(render(&[]), "no Services\n");
    }
}
