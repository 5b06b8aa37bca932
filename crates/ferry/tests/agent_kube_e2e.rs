//! `ferry agent --datastore kubernetes:KUBECONFIG` on two nodes, against a fake API
//! server (`fake_apiserver.py`) that serves the lab's cluster: the agents list and
//! watch it through the real `kube` client and watcher over HTTP, and the test checks
//! the result with real traffic, then pushes watch events (an endpoint removed and
//! back, a Service the API server would refuse) and sees the nodes follow, and holds
//! each agent to its field selectors through the server's request log.
//!
//! Plain HTTP, no credentials: kube's connector takes an `http://` server URL as it is,
//! so no certificate is needed.
//!
//! The API server runs in a namespace of its own, `api`, reached from each node over a
//! management link of its own (10.255.N.2 on node N, the server at 10.255.N.1): the
//! agent needs the API before it has made the host port through which the node's kernel
//! otherwise reaches the fabric. The lab and the cluster are in `common/two_nodes.rs`.
//! Needs root, iproute2, curl and python3.

mod common;

use std::fs;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::two_nodes::{self, BAD_SERVICE, TwoNodes, WEB_ON_NODE2, slice};

const SERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake_apiserver.py");
const PORT: u16 = 8080;
/// The server's log of requests, in the lab's directory: a JSON line per request.
const REQUESTS: &str = "requests.jsonl";

/// The object of a YAML document, as JSON.
fn object(yaml: &str) -> Value {
    serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("{e}: {yaml}"))
}

struct KubeLab {
    c: TwoNodes,
}

impl KubeLab {
    /// Sends one watch event through the server: `type_` ADDED, MODIFIED or DELETED.
    fn push(&self, type_: &str, yaml: &str) {
        let file = self.c.dir.path().join("push.json");
        let event = json!({"type": type_, "object": object(yaml)});
        fs::write(&file, event.to_string()).unwrap();
        self.c.lab.run(
            "api",
            5,
            &[
                "curl",
                "-sS",
                "--fail-with-body",
                "--data-binary",
                &format!("@{}", file.display()),
                &format!("http://127.0.0.1:{PORT}/_push"),
            ],
        );
    }

    /// The requests the server saw from node `n`, in order: (path, decoded query).
    fn requests_from(&self, n: u8) -> Vec<(String, Value)> {
        let client = format!("10.255.{n}.2");
        fs::read_to_string(self.c.dir.path().join(REQUESTS))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| r["client"] == client.as_str())
            .map(|r| (r["path"].as_str().unwrap().to_string(), r["query"].clone()))
            .collect()
    }

    /// Requires every request of node `n` for `path` to carry `selector` (None: no field
    /// selector), and a list and a watch among them.
    fn assert_selector(&self, n: u8, path: &str, selector: Option<&str>) {
        let seen: Vec<Value> = self
            .requests_from(n)
            .into_iter()
            .filter(|(p, _)| p == path)
            .map(|(_, q)| q)
            .collect();
        let watches = seen.iter().filter(|q| q["watch"] == "true").count();
        assert!(
            watches > 0 && watches < seen.len(),
            "node{n} lists and watches {path}: {seen:?}"
        );
        for q in &seen {
            assert_eq!(
                q["fieldSelector"].as_str(),
                selector,
                "node{n}'s request for {path}: {q}"
            );
        }
    }
}

fn start(tag: &str) -> KubeLab {
    start_with(tag, &[])
}

/// [`start`], with `extra2` arguments for node 2's agent.
fn start_with(tag: &str, extra2: &[&str]) -> KubeLab {
    let mut c = TwoNodes::new(tag);
    c.lab.add_ns("api");
    for n in [1u8, 2] {
        let node = format!("n{n}");
        c.lab.veth(&node, "mgmt", "api", &node);
        c.lab.ip(
            &node,
            &["addr", "add", &format!("10.255.{n}.2/24"), "dev", "mgmt"],
        );
        c.lab.ip(
            "api",
            &["addr", "add", &format!("10.255.{n}.1/24"), "dev", &node],
        );
    }
    let objects: Vec<Value> = two_nodes::manifests()
        .iter()
        .flat_map(|(file, yaml)| {
            serde_saphyr::from_multiple::<Value>(yaml).unwrap_or_else(|e| panic!("{file}: {e}"))
        })
        .collect();
    let objects_file = c.dir.path().join("objects.json");
    fs::write(&objects_file, Value::from(objects).to_string()).unwrap();
    let (objects_file, log) = (
        objects_file.display().to_string(),
        c.dir.path().join(REQUESTS).display().to_string(),
    );
    c.lab.daemon(
        "api",
        "fake API server",
        &[
            "python3",
            SERVER,
            "--listen",
            &format!("0.0.0.0:{PORT}"),
            "--objects",
            &objects_file,
            "--log",
            &log,
            // Often enough that every watch sees some during the test.
            "--bookmark-interval",
            "0.5",
        ],
    );
    for n in [1u8, 2] {
        let (node, url) = (
            format!("n{n}"),
            format!("http://10.255.{n}.1:{PORT}/version"),
        );
        c.lab
            .wait_for(10, &format!("the API server from node{n}"), |l| {
                l.exec(&node, 2, &["curl", "-sf", &url]).status.success()
            });
        let config = c.dir.path().join(format!("kubeconfig{n}"));
        fs::write(
            &config,
            common::kubeconfig(&format!("http://10.255.{n}.1:{PORT}")),
        )
        .unwrap();
        let extra = if n == 2 { extra2 } else { &[] };
        c.start_agent_with(n, &format!("kubernetes:{}", config.display()), extra);
    }
    c.start_web();
    KubeLab { c }
}

#[test]
fn services_follow_the_api_server_watches() {
    let mut k = start("ak");
    let url = "http://10.96.0.10/hostname";

    // Cluster IP from a pod on node 1 to the endpoint on node 2.
    assert_eq!(k.c.curl("p1a", url), "web");
    assert_eq!(k.c.curl("p1a", "http://10.96.0.10/clientip"), "10.244.1.5");
    // The node port on node 1, whose endpoint is on node 2, keeps the client's address.
    assert_eq!(
        k.c.curl("ext", "http://192.168.77.1:30080/clientip"),
        "192.168.77.100"
    );

    // A Service the API server would refuse is refused alone: traffic goes on.
    k.push("ADDED", BAD_SERVICE);
    assert_eq!(k.c.curl("p1a", url), "web");

    // The endpoint goes away: new connections are refused at once (TCP reset).
    let t0 = Instant::now();
    k.push("MODIFIED", &slice("web", "[]"));
    k.c.wait_curl(3, "p1a", url, 7, "the endpoint removal applied");
    let removed = t0.elapsed();
    // And it comes back.
    k.push("MODIFIED", &slice("web", WEB_ON_NODE2));
    k.c.wait_curl(3, "p1a", url, 0, "the endpoint back");
    assert_eq!(
        k.c.curl("ext", "http://192.168.77.1:30080/clientip"),
        "192.168.77.100"
    );
    eprintln!("endpoint removal seen by a client after {removed:?}");

    // Each node asked for every pod (policies select peers on any node) and for
    // ferry-config alone; ClusterNetworkPolicies, which this server does not serve (a
    // cluster without the CRD), held nothing back.
    for n in [1u8, 2] {
        k.assert_selector(n, "/api/v1/pods", None);
        k.assert_selector(n, "/api/v1/namespaces", None);
        k.assert_selector(n, "/apis/networking.k8s.io/v1/networkpolicies", None);
        assert!(
            k.requests_from(n).iter().any(|(p, _)| p
                == "/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies"),
            "node{n} asked for ClusterNetworkPolicies"
        );
        k.assert_selector(
            n,
            "/api/v1/namespaces/kube-system/configmaps",
            Some("metadata.name=ferry-config"),
        );
    }
    // The datastore's health: the bad Service was refused alone, so the rest is in
    // force and the datastore synced.
    let c = match ferry_agent::api::call(&k.c.socket(1), &ferry_api::Request::Counters).unwrap() {
        ferry_api::Response::Ok(a) => a.counters.unwrap(),
        r => panic!("{r:?}"),
    };
    let d = &c.datastore;
    assert_eq!(d.kind, "kubernetes");
    assert!(
        d.source.starts_with(&format!("http://10.255.1.1:{PORT}")),
        "{d:?}"
    );
    assert!(d.synced, "{d:?}");
    assert!(d.errors_total >= 1, "{d:?}");
    assert!(
        d.last_error
            .as_deref()
            .is_some_and(|e| e.contains("Service default/broken")),
        "{d:?}"
    );
    assert!(
        c.sync.count >= 3,
        "start, endpoint gone, endpoint back: {:?}",
        c.sync
    );
    for n in [1u8, 2] {
        let log = k.c.lab.stop(&format!("ferry agent on node{n}"));
        assert!(
            log.contains("Service default/broken: spec.ports[0].port: 70000"),
            "node{n}'s refusal names the object and field: {log}"
        );
        // No watch failed (bookmarks and events parsed, no stream broken).
        assert!(!log.contains("retrying"), "node{n}: {log}");
    }
}

/// The NetworkPolicy `default/deny-web`: ingress to the web pod denied, its selector
/// with `operator` (`In`, or one the API server would refuse).
fn deny_web(operator: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{ name: deny-web, namespace: default }}\nspec:\n  podSelector: {{ matchExpressions: [{{ key: app, operator: {operator}, values: [web] }}] }}\n  policyTypes: [Ingress]\n"
    )
}

impl KubeLab {
    /// Waits up to 10 s until what node `n`'s agent says of its policies satisfies
    /// `ok`; `what` names the change awaited.
    fn wait_enforcement(
        &self,
        n: u8,
        what: &str,
        ok: impl Fn(&ferry_api::PolicyEnforcement) -> bool,
    ) -> ferry_api::PolicyEnforcement {
        let t0 = Instant::now();
        loop {
            let r = ferry_agent::api::call(&self.c.socket(n), &ferry_api::Request::Counters);
            let e = match r {
                Ok(ferry_api::Response::Ok(a)) => a.counters.unwrap().enforcement,
                r => panic!("node{n}'s counters: {r:?}"),
            };
            if ok(&e) {
                return e;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "node{n} did not report {what} within 10 s; it reports {e:#?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What `ferry ARGS --api-socket` (node `n`'s) prints; fails the test if it fails.
    fn ferry(&self, n: u8, args: &[&str]) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(args)
            .arg("--api-socket")
            .arg(self.c.socket(n))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "ferry {args:?}: {out:?}");
        text
    }

    /// Node 2's metrics (its agent serves them at 127.0.0.1:9250 in its namespace).
    fn metrics(&self) -> String {
        self.c
            .lab
            .run("n2", 5, &["curl", "-sS", "http://127.0.0.1:9250/metrics"])
    }
}

#[test]
fn a_policy_ferry_refuses_is_reported_as_not_enforced_until_it_is_fixed_or_deleted() {
    let mut k = start_with("au", &["--metrics-addr", "127.0.0.1:9250"]);
    let url = "http://10.96.0.10/hostname";
    assert_eq!(k.c.curl("p1a", url), "web");
    let unenforced =
        r#"ferry_policies_unenforced{kind="NetworkPolicy",policy="default/deny-web",state="#;

    // Its first version is refused: nothing of it is in force, and every node says so.
    k.push("ADDED", &deny_web("Bogus"));
    for n in [1u8, 2] {
        let e = k.wait_enforcement(n, "deny-web not enforced", |e| !e.unenforced.is_empty());
        let u = &e.unenforced[0];
        assert_eq!(
            (u.kind.as_str(), u.policy.as_str(), u.state),
            (
                "NetworkPolicy",
                "default/deny-web",
                ferry_api::Enforcement::NotEnforced
            ),
            "node{n}: {e:?}"
        );
        assert!(
            u.reasons[0].starts_with("refused: spec.podSelector.matchExpressions[0].operator"),
            "node{n}: {u:?}"
        );
        assert!(
            u.latest_version
                .as_deref()
                .is_some_and(|v| v.starts_with("resourceVersion ")),
            "{u:?}"
        );
    }
    assert_eq!(k.c.curl("p1a", url), "web", "nothing of it is in force");
    let status = k.ferry(2, &["status"]);
    assert!(
        status.contains("1 NOT enforced as written:\n  NetworkPolicy default/deny-web: NOT enforced (latest: resourceVersion ")
            && status.contains("    refused: spec.podSelector.matchExpressions[0].operator: "),
        "{status}"
    );
    let m = k.metrics();
    assert!(
        m.contains(&format!("{unenforced}\"not_enforced\"}} 1")),
        "{m}"
    );

    // Fixed: in force, and nothing left to report.
    k.push("MODIFIED", &deny_web("In"));
    let e = k.wait_enforcement(2, "deny-web in force", |e| {
        e.unenforced.is_empty() && e.network_policies == 1
    });
    assert_eq!(e.stale, None);
    k.c.wait_curl(5, "p1a", url, 28, "deny-web in force on node2");
    let m = k.metrics();
    assert!(!m.contains(unenforced), "{m}");
    assert!(
        m.contains("ferry_policies{kind=\"NetworkPolicy\"} 1"),
        "{m}"
    );

    // A bad update: the good version stays in force, and which one is said.
    k.push("MODIFIED", &deny_web("Bogus"));
    let e = k.wait_enforcement(2, "an older deny-web enforced", |e| {
        !e.unenforced.is_empty()
    });
    let u = &e.unenforced[0];
    assert_eq!(u.state, ferry_api::Enforcement::OlderVersion, "{e:?}");
    assert!(
        u.enforced_version.is_some()
            && u.latest_version.is_some()
            && u.enforced_version != u.latest_version,
        "{u:?}"
    );
    let (code, out) = k.c.try_curl("p1a", url);
    assert_eq!(code, 28, "the older version still denies: {out}");
    let list = k.ferry(2, &["policy", "list"]);
    assert!(
        list.contains("NetworkPolicy default/deny-web (isolates ingress): 0 rules\n  pods of this node: default/web\n  NOT AS WRITTEN: an older version enforced (in force: resourceVersion "),
        "{list}"
    );
    assert!(
        k.metrics()
            .contains(&format!("{unenforced}\"older_version\"}} 1")),
        "the metric follows"
    );

    // Deleted: nothing in force, nothing to report, the web pod open again.
    k.push("DELETED", &deny_web("Bogus"));
    k.wait_enforcement(2, "deny-web gone", |e| {
        e.unenforced.is_empty() && e.network_policies == 0
    });
    k.c.wait_curl(5, "p1a", url, 0, "deny-web deleted");
    assert!(!k.metrics().contains(unenforced));
    for n in [1u8, 2] {
        let log = k.c.lab.stop(&format!("ferry agent on node{n}"));
        assert!(
            log.contains(
                "NetworkPolicy default/deny-web: spec.podSelector.matchExpressions[0].operator"
            ),
            "node{n}'s log names the refusal: {log}"
        );
    }
}
