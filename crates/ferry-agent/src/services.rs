//! `ferry services`: the Services of the tables in force as the API shows them, with the
//! connections tracked for each.
//!
//! The tables hold one entry per Service port, named `namespace/name:port`; the answer
//! groups them by Service. Connections are counted in one scan of the connection table
//! (a worker job): every connection this node balanced (mark [`MARK_SERVICE`]) counts
//! for the Service port its original destination reaches and for the endpoint its reply
//! comes from.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use ferry_api::{EndpointInfo, FrontendInfo, ServiceInfo, ServicePortInfo};
use ferry_datapath::{BalanceMode, MARK_SERVICE, Services, Tables, maglev};
use ferry_linux::worker::Control;

/// How long the connection count may wait for the worker; without it the answer has no
/// counts.
pub const COUNT_TIMEOUT: Duration = Duration::from_secs(2);

/// Connections tracked per Service port and per endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Connections {
    /// By tables entry name (`namespace/name:port`).
    pub by_service: HashMap<String, u64>,
    /// By (IP protocol, endpoint address, port).
    pub by_endpoint: HashMap<(u8, IpAddr, u16), u64>,
}

/// Counts the balanced connections in the worker of `control`, with its tables.
pub fn count(control: &Control) -> Option<Connections> {
    control
        .run(COUNT_TIMEOUT, |w| {
            let services = &w.pipeline.tables().services;
            let ct = w.pipeline.conntrack();
            let timeouts = ct.config().timeouts;
            let mut c = Connections::default();
            for (_, e) in ct.dump(&Default::default()) {
                // Past its deadline an entry only waits for the expiry wheel.
                if e.mark & MARK_SERVICE == 0 || e.deadline_ns(&timeouts) <= w.now_ns {
                    continue;
                }
                let (o, r) = (e.original(), e.reply());
                *c.by_endpoint
                    .entry((o.proto, r.src.ip(), r.src_port))
                    .or_default() += 1;
                if let Some(f) = services.frontend(&o)
                    && let Some(s) = services.services.get(f.service as usize)
                {
                    *c.by_service.entry(s.name.clone()).or_default() += 1;
                }
            }
            c
        })
        .ok()
}

/// The Services of `tables`, by namespace and name, with the connection counts when
/// there are some.
pub fn list(tables: &Tables, conns: Option<&Connections>) -> Vec<ServiceInfo> {
    list_services(&tables.services, conns)
}

/// True when a set of `n` endpoints is chosen from by a Maglev table under `mode`.
fn uses_maglev(mode: BalanceMode, n: usize) -> bool {
    match mode {
        BalanceMode::Maglev => n > 0,
        BalanceMode::Consistent => n > ferry_datapath::rendezvous::MAX_ENDPOINTS,
        BalanceMode::Random => false,
    }
}

fn list_services(services: &Services, conns: Option<&Connections>) -> Vec<ServiceInfo> {
    let mut by_key: BTreeMap<(String, String), Vec<ServicePortInfo>> = BTreeMap::new();
    let balance = services.balance();
    let consistent = balance.mode != BalanceMode::Random;
    for s in services.services.iter().filter(|s| !s.name.is_empty()) {
        let (svc, port_name) = s.name.rsplit_once(':').unwrap_or((&s.name, ""));
        let (ns, name) = svc.split_once('/').unwrap_or(("", svc));
        let spec = &s.spec;
        let front = |kind: &str, address: Option<IpAddr>, port: u16, scope: &str| FrontendInfo {
            kind: kind.into(),
            address,
            port,
            proto: spec.proto.clone(),
            scope: scope.into(),
        };
        let mut frontends: Vec<FrontendInfo> = spec
            .cluster_ips
            .iter()
            .map(|a| front("cluster_ip", Some(*a), spec.port, "internal"))
            .collect();
        frontends.extend(
            spec.node_port
                .map(|p| front("node_port", None, p, "external")),
        );
        frontends.extend(
            spec.external_ips
                .iter()
                .map(|a| front("external_ip", Some(*a), spec.port, "external")),
        );
        frontends.extend(
            spec.load_balancer_ips
                .iter()
                .map(|a| front("load_balancer_ip", Some(*a), spec.port, "external")),
        );
        let endpoints = s
            .backends
            .iter()
            .map(|b| EndpointInfo {
                address: b.addr,
                port: b.port,
                node: b.node.clone(),
                local: b.local,
                ready: b.ready,
                serving: b.serving,
                terminating: b.terminating,
                connections: conns.map(|c| {
                    c.by_endpoint
                        .get(&(s.proto, b.addr, b.port))
                        .copied()
                        .unwrap_or(0)
                }),
            })
            .collect();
        by_key
            .entry((ns.to_string(), name.to_string()))
            .or_default()
            .push(ServicePortInfo {
                port_name: port_name.to_string(),
                proto: spec.proto.clone(),
                frontends,
                internal_policy: spec.internal_policy.name().into(),
                external_policy: spec.external_policy.name().into(),
                affinity_timeout_s: spec.affinity_timeout_s,
                source_ranges: spec.source_ranges.iter().map(|r| r.to_string()).collect(),
                external_snat: spec.external_snat,
                balance: match balance.mode {
                    BalanceMode::Consistent => "consistent",
                    BalanceMode::Maglev => "maglev",
                    BalanceMode::Random => "random",
                }
                .into(),
                seed: consistent.then_some(balance.seed),
                maglev_table: uses_maglev(balance.mode, s.backends.len())
                    .then(|| maglev::size_for(s.backends.len())),
                endpoints,
                connections: conns.map(|c| c.by_service.get(&s.name).copied().unwrap_or(0)),
            });
    }
    by_key
        .into_iter()
        .map(|((namespace, name), ports)| ServiceInfo {
            namespace,
            name,
            ports,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_datapath::{BackendSpec, ServiceSpec, TrafficPolicy};

    fn spec(name: &str, port: u16) -> ServiceSpec {
        ServiceSpec {
            name: name.into(),
            proto: "tcp".into(),
            port,
            cluster_ips: vec!["10.96.0.10".parse().unwrap()],
            node_port: Some(30080),
            load_balancer_ips: vec!["192.0.2.10".parse().unwrap()],
            external_policy: TrafficPolicy::Local,
            affinity_timeout_s: Some(60),
            backends: vec![
                BackendSpec {
                    addr: "10.244.2.5".parse().unwrap(),
                    port: 8080,
                    node: Some("node2".into()),
                    no_node: false,
                    ready: true,
                    serving: None,
                    terminating: false,
                    hints: Default::default(),
                },
                BackendSpec {
                    addr: "10.244.1.7".parse().unwrap(),
                    port: 8080,
                    node: Some("node1".into()),
                    no_node: false,
                    ready: false,
                    serving: Some(true),
                    terminating: true,
                    hints: Default::default(),
                },
            ],
            ..ServiceSpec::default()
        }
    }

    #[test]
    fn service_ports_group_by_service_with_frontends_and_endpoints() {
        let mut other = spec("kube-system/dns:53", 53);
        other.cluster_ips = vec!["10.96.0.53".parse().unwrap()];
        other.node_port = None;
        other.load_balancer_ips.clear();
        let s = Services::compile(
            &[spec("default/web:http", 80), other],
            "node1",
            ["192.168.77.1".parse().unwrap()],
        )
        .unwrap();
        let conns = Connections {
            by_service: [("default/web:http".to_string(), 3)].into(),
            by_endpoint: [((6, "10.244.2.5".parse().unwrap(), 8080), 2)].into(),
        };
        let l = list_services(&s, Some(&conns));
        let names: Vec<String> = l
            .iter()
            .map(|s| format!("{}/{}", s.namespace, s.name))
            .collect();
        assert_eq!(names, ["default/web", "kube-system/dns"]);
        let web = &l[0].ports[0];
        assert_eq!(web.port_name, "http");
        assert_eq!(web.connections, Some(3));
        let kinds: Vec<(&str, Option<IpAddr>, u16, &str)> = web
            .frontends
            .iter()
            .map(|f| (f.kind.as_str(), f.address, f.port, f.scope.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                (
                    "cluster_ip",
                    Some("10.96.0.10".parse().unwrap()),
                    80,
                    "internal"
                ),
                ("node_port", None, 30080, "external"),
                (
                    "load_balancer_ip",
                    Some("192.0.2.10".parse().unwrap()),
                    80,
                    "external"
                ),
            ]
        );
        assert_eq!(
            (web.internal_policy.as_str(), web.external_policy.as_str()),
            ("cluster", "local")
        );
        assert_eq!(web.affinity_timeout_s, Some(60));
        let (remote, local) = (&web.endpoints[0], &web.endpoints[1]);
        assert!(!remote.local && remote.ready && remote.serving);
        assert_eq!(remote.connections, Some(2));
        assert!(local.local && !local.ready && local.serving && local.terminating);
        assert_eq!(local.connections, Some(0));
        assert_eq!(l[1].ports[0].connections, Some(0));
        assert!(list_services(&s, None)[0].ports[0].connections.is_none());
        // Consistent by default, with its seed; two endpoints need no Maglev table.
        assert_eq!(web.balance, "consistent");
        assert_eq!(web.seed, Some(maglev::DEFAULT_SEED));
        assert_eq!(web.maglev_table, None);
    }

    #[test]
    fn the_balance_shown_is_the_tables_own() {
        let balance = ferry_datapath::BalanceSpec {
            mode: BalanceMode::Maglev,
            seed: 7,
        };
        let addrs = ["192.168.77.1".parse().unwrap()];
        let specs = [spec("default/web:http", 80)];
        let s = Services::compile_balanced(&specs, "node1", addrs, balance).unwrap();
        let p = &list_services(&s, None)[0].ports[0];
        assert_eq!((p.balance.as_str(), p.seed), ("maglev", Some(7)));
        assert_eq!(p.maglev_table, Some(maglev::size_for(1)));
        let random = ferry_datapath::BalanceSpec {
            mode: BalanceMode::Random,
            seed: 7,
        };
        let s = Services::compile_balanced(&specs, "node1", addrs, random).unwrap();
        let p = &list_services(&s, None)[0].ports[0];
        assert_eq!(p.balance, "random");
        assert_eq!((p.seed, p.maglev_table), (None, None));
    }
}
