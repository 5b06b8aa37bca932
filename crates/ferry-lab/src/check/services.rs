//! `ferry lab check --suite services`: the scenarios of the Kubernetes e2e tests that a
//! kube-proxy replacement must pass (test/e2e/network: service.go, conntrack.go,
//! loadbalancer.go, traffic_distribution.go), one row each, named after the upstream
//! test it follows and holding that test's expectation.
//!
//! The suite's pods live in namespace `svc`: two clients it keeps between runs
//! (`client-1` on node1, `client-2` on node2), and per case the servers the case
//! makes and removes. A case's Services and EndpointSlices are one file of the manifest
//! directory, replaced as the case goes and removed at its end. The lab runs no
//! controllers, so where upstream lets the EndpointSlice controller follow a pod (ready
//! or not yet, terminating but still serving, deleted) the case writes the slice the
//! controller would write, at the moment it would: what is checked is what the agents
//! make of it. Every server is `ferry serve` (HTTP `/hostname` and `/clientip` on 8080,
//! UDP echo on 8081, answering `hostname` with `svc/NAME`), as upstream's are agnhost's
//! netexec.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use ferry_linux::cmd::Cmd;

use super::Ctx;
use crate::plan::Plan;
use crate::state::{Pod, State};
use crate::topology::{NewPod, manifests};
use crate::{agents, pods, sys};

mod conntrack;
mod distribution;
mod loadbalancer;

/// The suite's namespace.
pub const NAMESPACE: &str = "svc";
/// The file of the manifest directory holding the current case's Services and slices.
pub const CASE_FILE: &str = "applied-services-case.yaml";
/// The clients the suite keeps: on node1, and on node2 (the other zone when the lab has
/// two).
const CLIENTS: [&str; 2] = ["client-1", "client-2"];

/// A case: the upstream test it follows, where that test is, what it checks here.
pub struct Case {
    /// The upstream test's name, as its `ginkgo.It` says.
    pub name: &'static str,
    /// Its file in test/e2e/network.
    pub file: &'static str,
    /// What the case does and expects, in a line.
    pub what: &'static str,
    run: fn(&mut Scene) -> Result<()>,
}

/// The cases, in order.
pub const CASES: &[Case] = &[
    Case {
        name: "should be able to preserve UDP traffic when server pod cycles for a NodePort service",
        file: "conntrack.go",
        what: "a client on node1 asks node2's node port over one UDP socket; server-1 (node2) is replaced by server-2: the answers move to server-2",
        run: conntrack::udp_cycle_node_port,
    },
    Case {
        name: "should be able to preserve UDP traffic when server pod cycles for a ClusterIP service",
        file: "conntrack.go",
        what: "the same through the cluster IP, the servers on node2",
        run: conntrack::udp_cycle_cluster_ip,
    },
    Case {
        name: "should be able to preserve UDP traffic when server pod cycles for a ClusterIP service and client is hostNetwork",
        file: "conntrack.go",
        what: "the same from node1's own stack",
        run: conntrack::udp_cycle_host_network,
    },
    Case {
        name: "should be able to preserve UDP traffic when server pod cycles for a ClusterIP service with InternalTrafficPolicy set to Local",
        file: "conntrack.go",
        what: "internalTrafficPolicy Local, server-1 on node1 (the client's) and server-2 on node2: the client gets server-1; server-1 deleted, 5 s without a local endpoint, server-3 on node1: the client gets server-3",
        run: conntrack::udp_cycle_local,
    },
    Case {
        name: "should be able to preserve UDP traffic when initial unready endpoints get ready",
        file: "conntrack.go",
        what: "the client asks the cluster IP while its one endpoint is not ready, then it is: the answers come",
        run: conntrack::udp_unready_gets_ready,
    },
    Case {
        name: "should drop INVALID conntrack entries [Privileged]",
        file: "conntrack.go",
        what: "a client on node1 opens a connection through the cluster IP every second to a server on node2 that answers each with a segment far outside the window: no reset comes back",
        run: conntrack::invalid_dropped,
    },
    Case {
        name: "should be rejected when no endpoints exist",
        file: "service.go",
        what: "TCP to a cluster IP and to a node port of a Service without endpoints: refused at once (curl exit 7), not left to time out",
        run: rejected_without_endpoints,
    },
    Case {
        name: "should serve endpoints on same port and different protocols",
        file: "service.go",
        what: "port 53 on TCP and on UDP, two Service ports: both reach the server; the Service on TCP alone: UDP stops answering; on UDP alone: TCP stops",
        run: same_port_two_protocols,
    },
    Case {
        name: "should fallback to terminating endpoints when there are no ready endpoints with internalTrafficPolicy=Cluster",
        file: "service.go",
        what: "the only endpoint terminating but serving (node2): clients on both nodes reach it through the cluster IP",
        run: terminating_cluster_internal,
    },
    Case {
        name: "should fallback to terminating endpoints when there are no ready endpoints with externallTrafficPolicy=Cluster",
        file: "service.go",
        what: "the only endpoint terminating on node1: pods on both nodes reach it through node1's node port",
        run: terminating_cluster_external,
    },
    Case {
        name: "should fallback to local terminating endpoints when there are no ready endpoints with internalTrafficPolicy=Local",
        file: "service.go",
        what: "the only endpoint terminating on node1: node1's client reaches it, the other node's client is refused",
        run: terminating_local_internal,
    },
    Case {
        name: "should fallback to local terminating endpoints when there are no ready endpoints with externalTrafficPolicy=Local",
        file: "service.go",
        what: "the only endpoint terminating on node1: both pods reach it through node1's node port; node1's pod through the other node's node port does not",
        run: terminating_local_external,
    },
    Case {
        name: "should be able to connect to terminating and unready endpoints if PublishNotReadyAddresses is true",
        file: "service.go",
        what: "publishNotReadyAddresses, the only endpoint (node1) terminating and unready: the other node's pod reaches it through the cluster IP and both nodes' node ports",
        run: published_not_ready,
    },
    Case {
        name: "should not be able to connect to terminating and unready endpoints if PublishNotReadyAddresses is false",
        file: "service.go",
        what: "the same without publishNotReadyAddresses: the cluster IP and both node ports fail",
        run: unpublished_not_ready,
    },
    Case {
        name: "should preserve source pod IP for traffic thru service cluster IP [LinuxOnly]",
        file: "service.go",
        what: "a pod on each node through the cluster IP to a server on node2: the server sees each pod's own address",
        run: source_pod_ip_preserved,
    },
    Case {
        name: "should implement service.kubernetes.io/service-proxy-name",
        file: "service.go",
        what: "a Service labelled with another proxy's name gets no frontend; labelling the other Service takes its frontend away, unlabelling gives it back",
        run: service_proxy_name,
    },
    Case {
        name: "should implement service.kubernetes.io/headless",
        file: "service.go",
        what: "the same with the headless label on the Service and its slices",
        run: headless_label,
    },
    Case {
        name: "should respect internalTrafficPolicy=Local Pod to Pod",
        file: "service.go",
        what: "internalTrafficPolicy Local, the endpoint on node1: node1's pod reaches it, the other node's pod does not",
        run: internal_local_pod_to_pod,
    },
    Case {
        name: "should respect internalTrafficPolicy=Local Pod (hostNetwork: true) to Pod",
        file: "service.go",
        what: "the same from the nodes' own stacks",
        run: internal_local_host_to_pod,
    },
    Case {
        name: "should route traffic to an endpoint in the same zone when using PreferSameZone",
        file: "traffic_distribution.go",
        what: "endpoints in both zones hinted for their zone: each zone's client is answered only from its zone",
        run: distribution::prefer_same_zone,
    },
    Case {
        name: "should route traffic to an endpoint on the same node or fall back to same zone when using PreferSameNode",
        file: "traffic_distribution.go",
        what: "a server and a client on node1 and node3 (one zone), hinted for their node: each client answered by its node's server; a client in the zone without a server (node2's) by every server",
        run: distribution::prefer_same_node,
    },
    Case {
        name: "should route traffic to an endpoint on the same node when using PreferSameNode and fall back when the endpoint becomes unavailable",
        file: "traffic_distribution.go",
        what: "a server and a client on node1 and node2: each client answered by its node's; node1's server deleted: both by node2's; a new server on node1: each by its own again",
        run: distribution::prefer_same_node_fallback,
    },
    Case {
        name: "should only allow access from service loadbalancer source ranges [Slow]",
        file: "loadbalancer.go",
        what: "no ranges: the accepting pod, the dropping pod, the outside client and node1's stack all reach the load balancer IP; ranges of the accepting pod and its node: only those two; allow-all ranges: all; deny-all: none; ranges removed: all",
        run: loadbalancer::lb_source_ranges,
    },
];

/// The cases whose name contains `only` (all when None); an error when none does.
pub fn selected(only: Option<&str>) -> Result<Vec<&'static Case>> {
    let cases: Vec<&Case> = CASES
        .iter()
        .filter(|c| only.is_none_or(|o| c.name.contains(o)))
        .collect();
    if cases.is_empty() {
        bail!(
            "no services case has {:?} in its name (ferry lab check --suite services --list shows them)",
            only.unwrap_or("")
        );
    }
    Ok(cases)
}

/// `ferry lab check --suite services --list`.
pub fn list(only: Option<&str>, out: &mut dyn Write) -> Result<()> {
    let cases = selected(only)?;
    for c in &cases {
        writeln!(out, "{} ({})\n    {}", c.name, c.file, c.what)?;
    }
    writeln!(out, "{} cases", cases.len())?;
    Ok(())
}

/// Runs the cases whose name contains `only`: a row each, a summary; true when all
/// passed.
pub fn run(dir: &Path, only: Option<&str>, out: &mut dyn Write) -> Result<bool> {
    let cases = selected(only)?;
    let t = Instant::now();
    setup(dir)?;
    writeln!(
        out,
        "namespace {NAMESPACE} with its clients up in {:.1}s",
        t.elapsed().as_secs_f64()
    )?;
    let mut rows = super::Rows::new(130);
    for case in &cases {
        let start = Instant::now();
        let mut ctx = Ctx {
            dir,
            state: State::load(dir)?,
            note: None,
        };
        let mut scene = Scene {
            c: &mut ctx,
            made: Vec::new(),
        };
        let r = (case.run)(&mut scene);
        let cleaned = scene.clean();
        let note = ctx.note.take();
        let name = format!("{} ({})", case.name, case.file);
        rows.row(out, &name, start.elapsed(), r.and(cleaned), note)?;
    }
    rows.summary(out)
}

/// The clients, made when missing; no case's file or servers (a run cut short left
/// them).
fn setup(dir: &Path) -> Result<()> {
    let state = State::load(dir)?;
    let nodes = state.plan.nodes;
    ensure!(
        nodes >= 2,
        "the services suite needs two nodes at least (the lab has {nodes})"
    );
    let clients = [(CLIENTS[0], 1), (CLIENTS[1], 2)];
    for p in state.pods.iter().filter(|p| p.namespace == NAMESPACE) {
        if !clients.contains(&(p.name.as_str(), p.node)) {
            pods::pod_del(dir, &p.id())?;
        }
    }
    remove_case_file(dir)?;
    for (name, node) in clients {
        let state = State::load(dir)?;
        if state
            .pods
            .iter()
            .any(|p| p.namespace == NAMESPACE && p.name == name)
        {
            continue;
        }
        pods::pod_add(dir, &new_pod(name, node, "client"))?;
    }
    Ok(())
}

fn remove_case_file(dir: &Path) -> Result<bool> {
    let file = manifests(dir).join(CASE_FILE);
    match std::fs::remove_file(&file) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("removing {}", file.display())),
    }
}

fn new_pod(name: &str, node: u8, app: &str) -> NewPod {
    NewPod {
        namespace: NAMESPACE.to_string(),
        name: name.to_string(),
        node,
        labels: BTreeMap::from([("app".to_string(), app.to_string())]),
        serves: Vec::new(),
    }
}

/// A case as it runs: the lab, and the servers it made.
pub struct Scene<'c, 'd> {
    c: &'c mut Ctx<'d>,
    made: Vec<String>,
}

/// An endpoint's conditions, as the EndpointSlice controller writes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    /// Ready (and serving).
    Ready,
    /// Running, its readiness probe not passed yet.
    Unready,
    /// Being deleted, still passing its readiness probe.
    TerminatingServing,
    /// Being deleted, failing its readiness probe.
    TerminatingUnready,
    /// The same, of a Service with `publishNotReadyAddresses` (the controller writes it
    /// ready).
    TerminatingPublished,
}

impl Cond {
    fn yaml(self) -> &'static str {
        match self {
            Cond::Ready => "{ ready: true, serving: true, terminating: false }",
            Cond::Unready => "{ ready: false, serving: false, terminating: false }",
            Cond::TerminatingServing => "{ ready: false, serving: true, terminating: true }",
            Cond::TerminatingUnready => "{ ready: false, serving: false, terminating: true }",
            Cond::TerminatingPublished => "{ ready: true, serving: false, terminating: true }",
        }
    }
}

impl Scene<'_, '_> {
    fn plan(&self) -> &Plan {
        &self.c.state.plan
    }

    /// node2, client-2's: the other end of every two-node case.
    fn far(&self) -> u8 {
        2
    }

    /// Makes server `svc/NAME` on node `node`.
    fn server(&mut self, name: &str, node: u8) -> Result<Pod> {
        let id = format!("{NAMESPACE}/{name}");
        self.made.push(id.clone());
        pods::pod_add(self.c.dir, &new_pod(name, node, "server"))?;
        self.c.state = State::load(self.c.dir)?;
        Ok(self.c.state.pod(&id)?.clone())
    }

    /// Deletes server `svc/NAME`.
    fn delete(&mut self, name: &str) -> Result<()> {
        let id = format!("{NAMESPACE}/{name}");
        self.made.retain(|m| *m != id);
        pods::pod_del(self.c.dir, &id)?;
        self.c.state = State::load(self.c.dir)?;
        Ok(())
    }

    /// The case's Services and slices are now `objects`; waits until every agent has
    /// them in force.
    fn apply(&mut self, objects: &str) -> Result<()> {
        sys::write_atomic(&manifests(self.c.dir).join(CASE_FILE), objects)?;
        let mark = agents::changed();
        agents::wait_in_force(self.c.dir, &self.c.state, mark, agents::IN_FORCE_TIMEOUT)
    }

    /// The servers gone, the case's file removed and the agents past it.
    fn clean(&mut self) -> Result<()> {
        let mut first = None;
        for id in std::mem::take(&mut self.made) {
            if let Err(e) = pods::pod_del(self.c.dir, &id) {
                first.get_or_insert(e);
            }
        }
        if remove_case_file(self.c.dir)? {
            let mark = agents::changed();
            let state = State::load(self.c.dir)?;
            agents::wait_in_force(self.c.dir, &state, mark, agents::IN_FORCE_TIMEOUT)?;
        }
        first.map_or(Ok(()), Err)
    }

    /// The namespace of a client (`client-1`), of a node's stack (`node1`), or of a
    /// server.
    fn ns(&self, who: &str) -> Result<String> {
        match who.starts_with("node") || who == "client" {
            true => self.c.ns(who),
            false => self.c.ns(&format!("{NAMESPACE}/{who}")),
        }
    }

    fn pod_ip(&self, name: &str) -> Result<String> {
        self.c.pod_ip(&format!("{NAMESPACE}/{name}"))
    }

    /// curl's exit code and output from `from`.
    fn curl_code(&self, from: &str, url: &str, secs: u32) -> Result<(i32, String)> {
        super::curl_in(&self.ns(from)?, url, secs)
    }

    /// Requires `url` to answer `want` from `from` (a first packet may wait for
    /// neighbours: a few tries).
    fn expect(&self, from: &str, url: &str, want: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let got = self.curl_code(from, url, 2)?;
            if got.0 == 0 && got.1 == want {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{url} from {from}: wanted {want:?}, got exit {}: {:?}",
                    got.0,
                    got.1
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Requires `url` not to answer from `from`: curl's exit code (7 refused, 28 timed
    /// out) must be one of `codes`.
    fn expect_fail(&self, from: &str, url: &str, codes: &[i32]) -> Result<i32> {
        let (code, out) = self.curl_code(from, url, 2)?;
        ensure!(
            codes.contains(&code),
            "{url} from {from}: wanted curl to fail with exit {codes:?}, got exit {code}: {out:?}"
        );
        Ok(code)
    }

    /// What `hostname` over UDP gets from `from`.
    fn ask_udp(&self, from: &str, to: &str) -> Result<String> {
        let ferry = self.c.state.ferry.display().to_string();
        sys::run_in(
            &self.ns(from)?,
            10,
            &[&ferry, "lab", "probe-udp", "--ask", "hostname", to],
        )
        .map(|s| s.trim().to_string())
    }

    /// The servers answering 16 connections from `from` to `url`, sorted.
    fn answering(&self, from: &str, url: &str) -> Result<Vec<String>> {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..16 {
            match self.curl_code(from, url, 2)? {
                (0, body) => seen.insert(body),
                (code, err) => bail!("{url} from {from}: exit {code}: {err}"),
            };
        }
        Ok(seen.into_iter().collect())
    }

    /// Asks `hostname` from `from` to `to` over one UDP socket for `secs` seconds while
    /// `change` runs (it starts a second in); the answers in order and the longest
    /// silence in ms.
    fn udp_stream_while(
        &mut self,
        from: &str,
        to: &str,
        secs: u64,
        change: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<(Vec<String>, u64)> {
        let ferry = self.c.state.ferry.display().to_string();
        let s = secs.to_string();
        let stream = Cmd::new(&ferry)
            .args(["lab", "probe-udp", "--stream", &s, to])
            .netns(self.ns(from)?)
            .command()
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        std::thread::sleep(Duration::from_secs(1));
        let changed = change(self);
        let out = stream.wait_with_output()?;
        changed?;
        let text = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success(),
            "probe: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The probe prints the answers in order, then the longest silence in ms.
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let gap = lines.pop().and_then(|l| l.parse().ok()).unwrap_or(u64::MAX);
        Ok((lines, gap))
    }
}

/// Service `name` in the suite's namespace: `spec` (YAML lines, indented by two, the
/// ports included), and `labels`.
fn service(name: &str, labels: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{ name: {name}, namespace: {NAMESPACE}, labels: {{ {labels} }} }}\nspec:\n{spec}"
    )
}

/// The IPv4 EndpointSlice of Service `service`: `ports` (YAML flow), `endpoints` (from
/// [`endpoint`]), and the Service's `labels` (the controller copies them).
fn slice(service: &str, labels: &str, ports: &str, endpoints: &[String]) -> String {
    let sep = if labels.is_empty() { "" } else { ", " };
    format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {service}-1\n  namespace: {NAMESPACE}\n  labels: {{ kubernetes.io/service-name: {service}{sep}{labels} }}\naddressType: IPv4\nports: {ports}\nendpoints: [{}]\n",
        endpoints.join(", ")
    )
}

/// Pod `p` as an endpoint with conditions `cond`, on its node and in its zone, with
/// `hints` (YAML flow, or empty).
fn endpoint(plan: &Plan, p: &Pod, cond: Cond, hints: &str) -> String {
    let mut e = format!(
        "{{ addresses: [{}], conditions: {}, nodeName: node{}, zone: {}",
        p.ip4().unwrap_or_default(),
        cond.yaml(),
        p.node,
        Plan::zone_name(plan.zone_of(p.node)),
    );
    if !hints.is_empty() {
        let _ = write!(e, ", hints: {hints}");
    }
    e.push_str(" }");
    e
}

/// The slice ports of a Service serving HTTP.
const HTTP_PORT: &str = "[{ name: http, protocol: TCP, port: 8080 }]";
/// The same, UDP echo.
const UDP_PORT: &str = "[{ name: udp, protocol: UDP, port: 8081 }]";

/// The cluster IP of the suite's `n`th Service (one per case, so that no connection of
/// an earlier case meets a later one).
fn cluster_ip(n: u8) -> String {
    format!("10.96.1.{n}")
}

/// The node port of the suite's `n`th Service.
fn node_port(n: u8) -> u16 {
    30100 + u16::from(n)
}

/// The load balancer IP of the suite's source ranges case (the lab's load balancer
/// routes it to node1 unchanged).
const LB_IP: &str = crate::plan::VIP_SUITE;

fn rejected_without_endpoints(s: &mut Scene) -> Result<()> {
    let ip = cluster_ip(5);
    let np = node_port(5);
    s.apply(&(service(
        "no-endpoints",
        "",
        &format!(
            "  type: NodePort\n  clusterIP: {ip}\n  clusterIPs: [{ip}]\n  selector: {{ app: nothing }}\n  ports: [{{ name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: {np} }}]\n"
        ),
    ) + &slice("no-endpoints", "", HTTP_PORT, &[])))?;
    let node = s.plan().node_ip(s.far());
    for url in [format!("http://{ip}/"), format!("http://{node}:{np}/")] {
        let start = Instant::now();
        s.expect_fail("client-1", &url, &[7])?;
        let t = start.elapsed();
        ensure!(
            t < Duration::from_secs(1),
            "{url}: refused only after {t:?}"
        );
    }
    Ok(())
}

/// Upstream: TCP and UDP on one port both answer; then the Service keeps only TCP (UDP
/// must stop answering), then only UDP (TCP must stop).
fn same_port_two_protocols(s: &mut Scene) -> Result<()> {
    let plan = s.plan().clone();
    let one = s.server("server-1", s.far())?;
    let ip = cluster_ip(6);
    let objects = |tcp: bool, udp: bool| {
        let mut ports = Vec::new();
        let mut slice_ports = Vec::new();
        if tcp {
            ports.push("  - { name: tcp, protocol: TCP, port: 53, targetPort: 8080 }\n");
            slice_ports.push("{ name: tcp, protocol: TCP, port: 8080 }");
        }
        if udp {
            ports.push("  - { name: udp, protocol: UDP, port: 53, targetPort: 8081 }\n");
            slice_ports.push("{ name: udp, protocol: UDP, port: 8081 }");
        }
        service(
            "dns",
            "",
            &format!(
                "  clusterIP: {ip}\n  clusterIPs: [{ip}]\n  ports:\n{}",
                ports.concat()
            ),
        ) + &slice(
            "dns",
            "",
            &format!("[{}]", slice_ports.join(", ")),
            &[endpoint(&plan, &one, Cond::Ready, "")],
        )
    };
    let (url, to) = (format!("http://{ip}:53/hostname"), format!("{ip}:53"));
    s.apply(&objects(true, true))?;
    s.expect("client-1", &url, &one.id())?;
    let udp = s.ask_udp("client-1", &to)?;
    ensure!(udp == one.id(), "UDP {to} answered {udp:?}");
    s.apply(&objects(true, false))?;
    s.expect("client-1", &url, &one.id())?;
    if let Ok(a) = s.ask_udp("client-1", &to) {
        bail!("UDP {to} answered {a:?} with the Service on TCP alone");
    }
    s.apply(&objects(false, true))?;
    let udp = s.ask_udp("client-1", &to)?;
    ensure!(udp == one.id(), "UDP {to} answered {udp:?}");
    s.expect_fail("client-1", &url, &[7, 28])?;
    Ok(())
}

/// A Service `term` at cluster IP `n` and node port `n`, with the traffic policy lines
/// `policy`, its one endpoint `ep`.
fn terminating_service(n: u8, policy: &str, ep: &str) -> String {
    let ip = cluster_ip(n);
    let np = node_port(n);
    service(
        "term",
        "",
        &format!(
            "  type: NodePort\n  clusterIP: {ip}\n  clusterIPs: [{ip}]\n{policy}  ports: [{{ name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: {np} }}]\n"
        ),
    ) + &slice("term", "", HTTP_PORT, &[ep.to_string()])
}

/// Upstream: the Service's one pod is deleted while its preStop hook keeps it serving;
/// with no ready endpoint left, the terminating one is used.
fn terminating(s: &mut Scene, n: u8, policy: &str, node: u8) -> Result<Pod> {
    let plan = s.plan().clone();
    let one = s.server("server-1", node)?;
    s.apply(&terminating_service(
        n,
        policy,
        &endpoint(&plan, &one, Cond::Ready, ""),
    ))?;
    s.apply(&terminating_service(
        n,
        policy,
        &endpoint(&plan, &one, Cond::TerminatingServing, ""),
    ))?;
    Ok(one)
}

fn terminating_cluster_internal(s: &mut Scene) -> Result<()> {
    let one = terminating(s, 7, "", s.far())?;
    let url = format!("http://{}/hostname", cluster_ip(7));
    for client in CLIENTS {
        s.expect(client, &url, &one.id())?;
    }
    Ok(())
}

fn terminating_cluster_external(s: &mut Scene) -> Result<()> {
    let one = terminating(s, 8, "  externalTrafficPolicy: Cluster\n", 1)?;
    let url = format!("http://{}:{}/hostname", s.plan().node_ip(1), node_port(8));
    for client in CLIENTS {
        s.expect(client, &url, &one.id())?;
    }
    Ok(())
}

fn terminating_local_internal(s: &mut Scene) -> Result<()> {
    let one = terminating(s, 9, "  internalTrafficPolicy: Local\n", 1)?;
    let url = format!("http://{}/hostname", cluster_ip(9));
    s.expect("client-1", &url, &one.id())?;
    // No endpoint on the other node, terminating or not: upstream wants the connection
    // to fail (kube-proxy drops it, so does ferry).
    s.expect_fail("client-2", &url, &[7, 28])?;
    Ok(())
}

fn terminating_local_external(s: &mut Scene) -> Result<()> {
    let one = terminating(s, 10, "  externalTrafficPolicy: Local\n", 1)?;
    let far = s.far();
    let url = |n: u8| format!("http://{}:{}/hostname", s.plan().node_ip(n), node_port(10));
    // node1's node port: from its own pod (kube-proxy's short-circuit of local pods)
    // and from the other node's.
    for client in CLIENTS {
        s.expect(client, &url(1), &one.id())?;
    }
    // A pod asking the other node's node port is external traffic there, and that node
    // has no local endpoint: upstream wants a failure (kube-proxy drops it; so does
    // ferry). The other node's pod asking its own node is not checked, as upstream.
    s.expect_fail("client-1", &url(far), &[7, 28])?;
    Ok(())
}

/// A NodePort Service `pub` at cluster IP `n` over the webserver, published or not.
fn not_ready_service(n: u8, published: bool, ep: &str) -> String {
    let ip = cluster_ip(n);
    let np = node_port(n);
    service(
        "pub",
        "",
        &format!(
            "  type: NodePort\n  clusterIP: {ip}\n  clusterIPs: [{ip}]\n  publishNotReadyAddresses: {published}\n  ports: [{{ name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: {np} }}]\n"
        ),
    ) + &slice("pub", "", HTTP_PORT, &[ep.to_string()])
}

/// Upstream: the webserver on node1, the client on node2; the webserver deleted, and
/// failing its readiness probe while it shuts down. The URLs then: the cluster IP, and
/// node1's and node2's node ports.
fn not_ready(s: &mut Scene, n: u8, published: bool) -> Result<(Pod, [String; 3])> {
    let plan = s.plan().clone();
    let web = s.server("webserver-pod", 1)?;
    let cond = match published {
        true => Cond::TerminatingPublished,
        false => Cond::TerminatingUnready,
    };
    s.apply(&not_ready_service(
        n,
        published,
        &endpoint(&plan, &web, Cond::Ready, ""),
    ))?;
    s.apply(&not_ready_service(
        n,
        published,
        &endpoint(&plan, &web, cond, ""),
    ))?;
    let np = node_port(n);
    let urls = [
        format!("http://{}/hostname", cluster_ip(n)),
        format!("http://{}:{np}/hostname", plan.node_ip(1)),
        format!("http://{}:{np}/hostname", plan.node_ip(s.far())),
    ];
    Ok((web, urls))
}

fn published_not_ready(s: &mut Scene) -> Result<()> {
    let (web, urls) = not_ready(s, 23, true)?;
    for url in &urls {
        s.expect("client-2", url, &web.id())?;
    }
    Ok(())
}

fn unpublished_not_ready(s: &mut Scene) -> Result<()> {
    let (_, urls) = not_ready(s, 24, false)?;
    for url in &urls {
        s.expect_fail("client-2", url, &[7, 28])?;
    }
    Ok(())
}

fn source_pod_ip_preserved(s: &mut Scene) -> Result<()> {
    let plan = s.plan().clone();
    let one = s.server("server-1", s.far())?;
    let ip = cluster_ip(11);
    s.apply(&(service(
        "source-ip",
        "",
        &format!(
            "  clusterIP: {ip}\n  clusterIPs: [{ip}]\n  ports: [{{ name: http, protocol: TCP, port: 8080, targetPort: 8080 }}]\n"
        ),
    ) + &slice("source-ip", "", HTTP_PORT, &[endpoint(&plan, &one, Cond::Ready, "")])))?;
    for client in CLIENTS {
        let own = s.pod_ip(client)?;
        s.expect(client, &format!("http://{ip}:8080/clientip"), &own)?;
    }
    Ok(())
}

/// Two Services over one server each: `toggled` and `disabled` (labelled `label` from
/// the start); then `toggled` labelled too, then not again.
fn label_toggles(s: &mut Scene, n: u8, label: &str) -> Result<()> {
    let plan = s.plan().clone();
    let one = s.server("server-1", s.far())?;
    let two = s.server("server-2", s.far())?;
    let (toggled, disabled) = (cluster_ip(n), cluster_ip(n + 1));
    let objects = |toggled_label: &str| {
        let svc = |name: &str, ip: &str, labels: &str, p: &Pod| {
            service(
                name,
                labels,
                &format!(
                    "  clusterIP: {ip}\n  clusterIPs: [{ip}]\n  ports: [{{ name: http, protocol: TCP, port: 80, targetPort: 8080 }}]\n"
                ),
            ) + &slice(
                name,
                labels,
                HTTP_PORT,
                &[endpoint(&plan, p, Cond::Ready, "")],
            )
        };
        svc("toggled", &toggled, toggled_label, &one) + &svc("disabled", &disabled, label, &two)
    };
    let up = format!("http://{toggled}/hostname");
    let down = format!("http://{disabled}/hostname");
    s.apply(&objects(""))?;
    s.expect("client-1", &up, &one.id())?;
    s.expect_fail("client-1", &down, &[7, 28])?;
    s.apply(&objects(label))?;
    s.expect_fail("client-1", &up, &[7, 28])?;
    s.apply(&objects(""))?;
    s.expect("client-1", &up, &one.id())?;
    s.expect_fail("client-1", &down, &[7, 28])?;
    Ok(())
}

fn service_proxy_name(s: &mut Scene) -> Result<()> {
    label_toggles(s, 12, "service.kubernetes.io/service-proxy-name: foo-bar")
}

fn headless_label(s: &mut Scene) -> Result<()> {
    label_toggles(s, 14, "service.kubernetes.io/headless: \"\"")
}

/// A Service at cluster IP `n` with internalTrafficPolicy Local over server-1 on node1.
fn internal_local(s: &mut Scene, n: u8) -> Result<(String, Pod)> {
    let plan = s.plan().clone();
    let one = s.server("server-1", 1)?;
    let ip = cluster_ip(n);
    s.apply(&(service(
        "local",
        "",
        &format!(
            "  clusterIP: {ip}\n  clusterIPs: [{ip}]\n  internalTrafficPolicy: Local\n  ports: [{{ name: http, protocol: TCP, port: 80, targetPort: 8080 }}]\n"
        ),
    ) + &slice("local", "", HTTP_PORT, &[endpoint(&plan, &one, Cond::Ready, "")])))?;
    Ok((format!("http://{ip}/hostname"), one))
}

fn internal_local_pod_to_pod(s: &mut Scene) -> Result<()> {
    let (url, one) = internal_local(s, 16)?;
    s.expect("client-1", &url, &one.id())?;
    s.expect_fail("client-2", &url, &[7, 28])?;
    Ok(())
}

fn internal_local_host_to_pod(s: &mut Scene) -> Result<()> {
    let (url, one) = internal_local(s, 17)?;
    let far = format!("node{}", s.far());
    s.expect("node1", &url, &one.id())?;
    s.expect_fail(&far, &url, &[7, 28])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_is_named_once_after_an_upstream_file() {
        let mut names = std::collections::BTreeSet::new();
        for c in CASES {
            assert!(names.insert(c.name), "{} twice", c.name);
            assert!(
                [
                    "service.go",
                    "conntrack.go",
                    "loadbalancer.go",
                    "traffic_distribution.go"
                ]
                .contains(&c.file),
                "{}: {}",
                c.name,
                c.file
            );
        }
    }

    #[test]
    fn a_selection_matching_no_case_is_an_error_naming_it() {
        let e = selected(Some("no such case")).err().unwrap();
        assert!(format!("{e}").contains("no such case"), "{e}");
        assert_eq!(selected(Some("PreferSameNode")).unwrap().len(), 2);
        assert_eq!(
            selected(Some("fall back to same zone when using PreferSameNode"))
                .unwrap()
                .len(),
            1
        );
    }
}
