//! Tests of the running agent as a whole (they need root and iproute2).

use std::thread;
use std::time::{Duration, Instant};

use super::*;
use crate::cluster::Kind;

const NODE0: &str = "
apiVersion: v1
kind: Node
metadata: { name: node0 }
spec: { podCIDR: 10.244.0.0/24, podCIDRs: [10.244.0.0/24] }
status: { addresses: [{ type: InternalIP, address: 192.168.77.1 }] }
";

/// A LoadBalancer Service with externalTrafficPolicy Local (health check node port
/// 32000), and its EndpointSlice with `endpoints` (a YAML flow sequence).
fn local_service(endpoints: &str) -> String {
    format!(
        "
apiVersion: v1
kind: Service
metadata: {{ name: web, namespace: default }}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.11
  clusterIPs: [10.96.0.11]
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  ports: [{{ name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30081 }}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abcde
  namespace: default
  labels: {{ kubernetes.io/service-name: web }}
addressType: IPv4
ports: [{{ name: http, protocol: TCP, port: 8080 }}]
endpoints: {endpoints}
"
    )
}

/// The cluster of node `node0` and the objects of `yaml`.
fn cluster(yaml: &str) -> Arc<Cluster> {
    let all = format!("{NODE0}---{yaml}");
    let (c, _) = crate::datastore::file::parse("test.yaml", &all).unwrap_or_else(|r| panic!("{r}"));
    Arc::new(c)
}

/// An agent of node0 with a host port only (a TAP in the test's namespace).
fn options() -> Options {
    let base = "ports:\n  - { name: host, kind: host, mac: \"02:fe:00:00:01:01\", addresses: [169.254.1.1] }\n";
    Options {
        node: "node0".into(),
        base: Some(serde_saphyr::from_str(base).unwrap()),
        host_tap: Some("fyhost".into()),
        ..Options::default()
    }
}

/// A running pod of node0 that the tests attach to a namespace that is not there.
const LATE_POD: &str = "
apiVersion: v1
kind: Pod
metadata: { name: late, namespace: default }
spec: { nodeName: node0, containers: [{ name: main, image: x }] }
status: { phase: Running, podIP: 10.244.0.7, podIPs: [{ ip: 10.244.0.7 }] }
";

/// The whole answer of health check node port 32000 on 127.0.0.1.
fn health_check() -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", 32000)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).unwrap();
    answer
}

/// A change the agent cannot put in force (a pod whose namespace is not there) does
/// not hold back the endpoint changes that come with it (or after it): those are put
/// in force alone, and the rest stays pending. Needs root and iproute2.
#[test]
fn endpoint_changes_go_in_force_while_another_change_cannot() {
    crate::testing::in_netns("sva", || {
        let mut opts = options();
        let absent = format!("ferry-absent-{}", std::process::id());
        opts.pods.insert(ObjectKey::new("default", "late"), absent);
        let remote = "[{ addresses: [10.244.9.5], conditions: { ready: true }, nodeName: node9 }]";
        let local = "[{ addresses: [10.244.0.5], conditions: { ready: true }, nodeName: node0 }]";
        let in_force = cluster(&local_service(remote));
        let (mut agent, _) = Agent::start(opts, Arc::clone(&in_force)).unwrap();
        let a = health_check();
        assert!(a.contains("\"localEndpoints\": 0"), "{a}");

        let newer = cluster(&format!("{}---{LATE_POD}", local_service(local)));
        let changed = in_force.diff(&newer);
        assert_eq!(changed.len(), 2, "{changed:?}");
        let e = agent
            .apply_changes(Arc::clone(&newer), &changed)
            .unwrap_err();
        assert!(e.contains("late"), "{e}");
        let (part, applied) = agent
            .apply_services_alone(&newer, &changed)
            .expect("an endpoint change to put in force alone")
            .unwrap();
        assert!(applied.incremental);
        let a = health_check();
        assert!(
            a.starts_with("HTTP/1.1 200 OK\r\n") && a.contains("\"localEndpoints\": 1"),
            "{a}"
        );
        // The pod is what is left, still pending.
        let left = part.diff(&newer);
        assert_eq!(left, [(Kind::Pod, ObjectKey::new("default", "late"))]);
        assert!(agent.apply_services_alone(&newer, &left).is_none());
        let later = Instant::now() + crate::proxy_health::PENDING_LIMIT;
        assert!(!agent.health.proxy.status_at(later).healthy);
        agent.stop().unwrap();
    });
}

/// A pod of node0 at 10.244.0.5 labelled `app: web`, and one of node9 labelled
/// `app: client` (its labels given).
fn pods(client_labels: &str) -> String {
    format!(
        "
apiVersion: v1
kind: Pod
metadata: {{ name: web, namespace: default, labels: {{ app: web }} }}
spec: {{ nodeName: node0, containers: [{{ name: main, image: x }}] }}
status: {{ phase: Running, podIP: 10.244.0.5, podIPs: [{{ ip: 10.244.0.5 }}] }}
---
apiVersion: v1
kind: Pod
metadata: {{ name: client, namespace: default, labels: {client_labels} }}
spec: {{ nodeName: node9, containers: [{{ name: main, image: x }}] }}
status: {{ phase: Running, podIP: 10.244.9.7, podIPs: [{{ ip: 10.244.9.7 }}] }}
"
    )
}

/// Ingress to `app: web` from `app: client` pods only.
const WEB_FROM_CLIENTS: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-from-clients, namespace: default }
spec:
  podSelector: { matchLabels: { app: web } }
  ingress: [{ from: [{ podSelector: { matchLabels: { app: client } } }] }]
";

/// A policy edit, a Namespace and a pod of another node changing are put in force as a
/// policy section patched into the tables (no whole compile, no port touched), and the
/// tables in force then hold the new peers; a pod of this node changing is compiled
/// whole. Needs root and iproute2.
#[test]
fn a_change_only_policy_reads_patches_the_policy_section() {
    crate::testing::in_netns("pol", || {
        let pod_ns = crate::testing::Netns::new("polpod");
        let mut opts = options();
        opts.pods
            .insert(ObjectKey::new("default", "web"), pod_ns.0.clone());
        let in_force = cluster(&pods("{ app: client }"));
        let (mut agent, _) = Agent::start(opts, Arc::clone(&in_force)).unwrap();
        let peers = |agent: &Agent| -> Vec<String> {
            let last = agent.last.as_ref().unwrap();
            let port = last.pod_ports[&ObjectKey::new("default", "web")].clone();
            let id = last.tables.port_id(&port).unwrap();
            let q = |peer: &str| ferry_datapath::policy::Query {
                peer: peer.parse().unwrap(),
                proto: ferry_datapath::proto::TCP,
                port: 80,
            };
            ["10.244.9.7", "10.244.9.8"]
                .into_iter()
                .filter(|p| {
                    (last.tables.policy)
                        .decide(id, ferry_datapath::policy::Direction::Ingress, &q(p))
                        .allowed
                })
                .map(String::from)
                .collect()
        };
        assert_eq!(peers(&agent), ["10.244.9.7", "10.244.9.8"], "no policy yet");

        let mut state = in_force;
        let mut step = |agent: &mut Agent, yaml: String, incremental: bool| {
            let next = cluster(&yaml);
            let changed = state.diff(&next);
            let a = agent.apply_changes(Arc::clone(&next), &changed).unwrap();
            assert_eq!(a.incremental, incremental, "{changed:?}");
            assert!(a.opened.is_empty() && a.closed.is_empty(), "{a:?}");
            state = next;
        };
        // The policy comes: only the client is allowed in.
        step(
            &mut agent,
            format!("{}---{WEB_FROM_CLIENTS}", pods("{ app: client }")),
            true,
        );
        assert_eq!(peers(&agent), ["10.244.9.7"]);
        // The client, on node9, loses its label: nobody is allowed in.
        step(
            &mut agent,
            format!("{}---{WEB_FROM_CLIENTS}", pods("{ app: other }")),
            true,
        );
        assert!(peers(&agent).is_empty());
        // The policy goes.
        step(&mut agent, pods("{ app: other }"), true);
        assert_eq!(peers(&agent), ["10.244.9.7", "10.244.9.8"]);
        // The pod of this node changes: compiled whole.
        step(
            &mut agent,
            pods("{ app: other }").replacen("app: web }", "app: web, v: \"2\" }", 1),
            false,
        );
        agent.stop().unwrap();
        drop(pod_ns);
    });
}

/// A health check node port that could not be opened (another process held it) is
/// opened by the agent's housekeeping once it can be, with no change of the cluster
/// to set it off; the failure is counted once. Needs root and iproute2.
#[test]
fn a_health_check_port_not_opened_is_tried_again_until_it_opens() {
    crate::testing::in_netns("hcr", || {
        let blocker = ferry_linux::tcp::listen("[::]:32000".parse().unwrap()).unwrap();
        let local = "[{ addresses: [10.244.0.5], conditions: { ready: true }, nodeName: node0 }]";
        let (mut agent, _) = Agent::start(options(), cluster(&local_service(local))).unwrap();
        assert!(agent.health_ports().is_empty());
        assert_eq!(agent.counters().errors.apply, 1);
        drop(blocker);
        let t0 = Instant::now();
        while agent.health_ports().is_empty() {
            assert!(
                t0.elapsed() < 2 * LISTEN_RETRY,
                "port 32000 still not served after {:?}",
                t0.elapsed()
            );
            agent.housekeeping();
            thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(agent.health_ports(), [32000]);
        assert_eq!(agent.counters().errors.apply, 1);
        agent.stop().unwrap();
    });
}
