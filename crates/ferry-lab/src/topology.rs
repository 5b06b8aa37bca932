//! Building and removing the lab.
//!
//! ```text
//!   client 10.20.0.2 ── lb (10.20.0.1 | 10.10.0.250, nftables DNAT)
//!                          │
//!   fabric: bridge z0 (10.10.0.254/24)   bridge z1 (10.10.1.254/24)   ...
//!             │        │                    │
//!           node1    node3                node2          (uplink "uplink", AF_PACKET)
//!           10.10.0.11 10.10.0.13         10.10.1.12
//!           pods      pods                pods           (eth0 TAPs from the agent)
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use ferry_linux::cmd::Cmd;

use crate::plan::{
    CLIENT_IP, CLIENT_IP6, CLIENT_SUBNET, CLIENT_SUBNET6, CLIENT2_IP, CLIENT2_SUBNET,
    LB_CLIENT_SIDE_IP, LB_CLIENT_SIDE_IP6, LB_CLIENT2_SIDE_IP, LB_FABRIC_IP, LB_FABRIC_IP6, Plan,
    VIP_ROUTED, VIP_SUITE,
};
use crate::state::{DEFAULT_NAMESPACE, Pod, Process, Proto, Served, State};
use crate::sys::{self, ip};
use crate::{Binaries, cluster, cni, node_agent};

/// The manifest directory the agents watch.
pub fn manifests(dir: &Path) -> std::path::PathBuf {
    dir.join("cluster")
}

fn add_ns(name: &str) -> Result<()> {
    sys::run(&["ip", "netns", "add", name])?;
    ip(name, &["link", "set", "lo", "up"])?;
    Ok(())
}

fn veth(a: &str, a_dev: &str, b: &str, b_dev: &str) -> Result<()> {
    sys::run(&[
        "ip", "link", "add", a_dev, "netns", a, "type", "veth", "peer", "name", b_dev, "netns", b,
    ])?;
    ip(a, &["link", "set", a_dev, "up"])?;
    ip(b, &["link", "set", b_dev, "up"])?;
    Ok(())
}

fn forwarding(ns: &str) -> Result<()> {
    sys::run_in(
        ns,
        5,
        &[
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
            "net.ipv6.conf.all.forwarding=1",
        ],
    )
    .map(drop)
}

/// `ferry lab up`: the namespaces, the agents, the pods, the load balancer. A lab
/// already in `dir` (or namespaces with the prefix) is an error: `down` first.
pub fn up(plan: &Plan, dir: &Path, bins: &Binaries) -> Result<()> {
    anyhow::ensure!(
        !State::path(dir).exists() && sys::namespaces_with_prefix(&plan.prefix).is_empty(),
        "a lab with prefix {} is up (or left over): ferry lab down --dir {} first",
        plan.prefix,
        dir.display()
    );
    fs::create_dir_all(manifests(dir))?;
    fs::create_dir_all(dir.join("logs"))?;
    let mut state = State {
        plan: plan.clone(),
        ferry: bins.ferry.clone(),
        cni: bins.cni.clone(),
        processes: Vec::new(),
        pods: Vec::new(),
        namespaces: BTreeMap::new(),
        agents: Vec::new(),
    };
    state.save(dir)?;
    network(plan)?;
    say("namespaces and links");
    sys::write_atomic(&manifests(dir).join("nodes.yaml"), &cluster::nodes(plan))?;
    sys::write_atomic(&manifests(dir).join("services.yaml"), &cluster::services())?;
    write_pods(dir, &state)?;
    for n in plan.node_numbers() {
        node_agent::start_first(dir, &mut state, n)?;
    }
    say("agents");
    for p in plan.pods() {
        add_pod(dir, &mut state, &p.name, p.node, p.app)?;
    }
    write_pods(dir, &state)?;
    say("pods (through ferry-cni) and their servers");
    let pid = sys::start_in(
        &plan.ns("lb"),
        &dir.join("logs/lb-health.log"),
        &[
            &bins.ferry.display().to_string(),
            "lab",
            "lb-health",
            "--dir",
            &dir.display().to_string(),
        ],
    )?;
    state.processes.push(Process {
        label: "load balancer health checks".into(),
        pid,
    });
    state.save(dir)?;
    let healthy = dir.join("lb-healthy.json");
    // The agents have applied the Pods and EndpointSlices once web's node passes its
    // health check and no other does: the lab is ready.
    let want = serde_json::to_string(&[plan.web_node()])?;
    sys::wait_for(
        15,
        "node health checks saying only web's node has it",
        || fs::read_to_string(&healthy).is_ok_and(|h| h == want),
    )?;
    say("load balancer");
    Ok(())
}

fn say(what: &str) {
    let _ = writeln!(std::io::stderr(), "ferry lab: {what} up");
}

/// The namespaces and links (docs/lab.md has the picture).
fn network(plan: &Plan) -> Result<()> {
    let fabric = plan.ns("fabric");
    let (lb, client, client2) = (plan.ns("lb"), plan.ns("client"), plan.ns("client2"));
    for ns in [&fabric, &lb, &client, &client2] {
        add_ns(ns)?;
    }
    forwarding(&fabric)?;
    forwarding(&lb)?;
    for z in 0..plan.zones {
        let br = format!("z{z}");
        ip(&fabric, &["link", "add", &br, "type", "bridge"])?;
        ip(&fabric, &["link", "set", &br, "up"])?;
        ip(
            &fabric,
            &[
                "addr",
                "add",
                &format!("{}/24", Plan::gateway(z)),
                "dev",
                &br,
            ],
        )?;
        let gw6 = format!("{}/64", Plan::gateway6(z));
        ip(&fabric, &["addr", "add", &gw6, "dev", &br, "nodad"])?;
    }
    for n in plan.node_numbers() {
        let node = plan.ns(&format!("node{n}"));
        add_ns(&node)?;
        let port = format!("n{n}");
        veth(&node, "uplink", &fabric, &port)?;
        ip(
            &node,
            &["link", "set", "uplink", "address", &cluster::uplink_mac(n)],
        )?;
        ip(
            &fabric,
            &[
                "link",
                "set",
                &port,
                "master",
                &format!("z{}", plan.zone_of(n)),
            ],
        )?;
    }
    // The load balancer: the client's gateway, on the first zone's subnet.
    veth(&lb, "fab", &fabric, "lb")?;
    ip(&fabric, &["link", "set", "lb", "master", "z0"])?;
    ip(
        &lb,
        &["addr", "add", &format!("{LB_FABRIC_IP}/24"), "dev", "fab"],
    )?;
    ip(
        &lb,
        &["route", "add", "10.10.0.0/16", "via", &Plan::gateway(0)],
    )?;
    ip(
        &fabric,
        &["route", "add", CLIENT_SUBNET, "via", LB_FABRIC_IP],
    )?;
    veth(&client, "eth0", &lb, "cli")?;
    ip(
        &lb,
        &[
            "addr",
            "add",
            &format!("{LB_CLIENT_SIDE_IP}/24"),
            "dev",
            "cli",
        ],
    )?;
    ip(
        &client,
        &["addr", "add", &format!("{CLIENT_IP}/24"), "dev", "eth0"],
    )?;
    ip(
        &client,
        &["route", "add", "default", "via", LB_CLIENT_SIDE_IP],
    )?;
    // The second client, on a subnet of its own behind the load balancer.
    veth(&client2, "eth0", &lb, "cli2")?;
    ip(
        &lb,
        &[
            "addr",
            "add",
            &format!("{LB_CLIENT2_SIDE_IP}/24"),
            "dev",
            "cli2",
        ],
    )?;
    ip(
        &client2,
        &["addr", "add", &format!("{CLIENT2_IP}/24"), "dev", "eth0"],
    )?;
    ip(
        &client2,
        &["route", "add", "default", "via", LB_CLIENT2_SIDE_IP],
    )?;
    ip(
        &fabric,
        &["route", "add", CLIENT2_SUBNET, "via", LB_FABRIC_IP],
    )?;
    // web-ranged's VIP, routed to node1 as it is.
    ip(&lb, &["route", "add", VIP_ROUTED, "via", &plan.node_ip(1)])?;
    ip(&lb, &["route", "add", VIP_SUITE, "via", &plan.node_ip(1)])?;
    // IPv6 from the client to the nodes: routed through the load balancer, no listener.
    let nodad =
        |ns: &str, addr: String, dev: &str| ip(ns, &["addr", "add", &addr, "dev", dev, "nodad"]);
    nodad(&lb, format!("{LB_FABRIC_IP6}/64"), "fab")?;
    nodad(&lb, format!("{LB_CLIENT_SIDE_IP6}/64"), "cli")?;
    nodad(&client, format!("{CLIENT_IP6}/64"), "eth0")?;
    ip(
        &lb,
        &["route", "add", "fd00:10::/32", "via", &Plan::gateway6(0)],
    )?;
    ip(
        &fabric,
        &["route", "add", CLIENT_SUBNET6, "via", LB_FABRIC_IP6],
    )?;
    ip(
        &client,
        &["-6", "route", "add", "default", "via", LB_CLIENT_SIDE_IP6],
    )?;
    // The load balancer starts with its Cluster listeners and no Local target.
    let rules = crate::lb::ruleset(plan, &[]);
    Cmd::new("nft")
        .args(["-f", "-"])
        .stdin(rules)
        .netns(&lb)
        .run()
        .context("the load balancer's rules (nft: apt-get install nftables)")?;
    Ok(())
}

pub use crate::node_agent::node_kernel_on_host_tap;

/// Makes pod `name` (namespace `default`) on node `node` through the CNI plugin and
/// starts its server; it is not in EndpointSlices until [`write_pods`].
pub fn add_pod(dir: &Path, state: &mut State, name: &str, node: u8, app: &str) -> Result<()> {
    let spec = NewPod {
        namespace: DEFAULT_NAMESPACE.to_string(),
        name: name.to_string(),
        node,
        labels: BTreeMap::new(),
        serves: Vec::new(),
    };
    make_pod(dir, state, &spec, app)
}

/// A pod to make: where, its labels and the ports its servers answer on (none: the lab's
/// own HTTP on 8080 and UDP echo on 8081).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewPod {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its node's number.
    pub node: u8,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// The ports it serves.
    pub serves: Vec<Served>,
}

/// The network namespace and container ID of pod `ns/name`: the lab's own pods (in
/// `default`) keep their short names.
fn pod_names(prefix: &str, ns: &str, name: &str) -> (String, String) {
    let short = if ns == DEFAULT_NAMESPACE {
        name.to_string()
    } else {
        format!("{ns}-{name}")
    };
    (format!("{prefix}-pod-{short}"), format!("{prefix}-{short}"))
}

/// Makes pod `spec` through the CNI plugin and starts its servers, waiting until each
/// answers; it is not in the manifests until [`write_pods`].
pub fn make_pod(dir: &Path, state: &mut State, spec: &NewPod, app: &str) -> Result<()> {
    let id = format!("{}/{}", spec.namespace, spec.name);
    anyhow::ensure!(
        !state
            .pods
            .iter()
            .any(|p| p.namespace == spec.namespace && p.name == spec.name),
        "pod {id} is in the lab already (ferry lab pod del {id} first)"
    );
    anyhow::ensure!(
        (1..=state.plan.nodes).contains(&spec.node),
        "node{}: the lab has node1..node{}",
        spec.node,
        state.plan.nodes
    );
    let (netns, container_id) = pod_names(&state.plan.prefix, &spec.namespace, &spec.name);
    add_ns(&netns)?;
    state.pods.push(Pod {
        name: spec.name.clone(),
        namespace: spec.namespace.clone(),
        labels: spec.labels.clone(),
        serves: spec.serves.clone(),
        node: spec.node,
        app: app.to_string(),
        netns: netns.clone(),
        container_id: container_id.clone(),
        ips: Vec::new(),
        ready: false,
    });
    state.save(dir)?;
    let conf = cni::netconf(dir, spec.node);
    let ips = cni::add(
        &state.cni,
        &conf,
        &container_id,
        &netns,
        (&spec.namespace, &spec.name),
    )?;
    let pod = state.pods.last_mut().context("the pod just added")?;
    pod.ips = ips;
    let pod = pod.clone();
    start_servers(dir, state, &pod)?;
    if let Some(p) = state
        .pods
        .iter_mut()
        .find(|p| p.container_id == container_id)
    {
        p.ready = true;
    }
    state.save(dir)
}

/// The `ferry serve` processes of a pod serving `serves`: each a TCP and a UDP port,
/// paired in order (port 0: none of that protocol; a TCP listener on 0 takes a free
/// port no probe asks).
fn server_ports(serves: &[Served]) -> Vec<(u16, u16)> {
    let tcp: Vec<u16> = serves
        .iter()
        .filter(|s| s.proto == Proto::Tcp)
        .map(|s| s.port)
        .collect();
    let udp: Vec<u16> = serves
        .iter()
        .filter(|s| s.proto == Proto::Udp)
        .map(|s| s.port)
        .collect();
    (0..tcp.len().max(udp.len()))
        .map(|i| {
            (
                tcp.get(i).copied().unwrap_or(0),
                udp.get(i).copied().unwrap_or(0),
            )
        })
        .collect()
}

/// Starts pod `pod`'s servers in its namespace and waits until they answer there.
fn start_servers(dir: &Path, state: &mut State, pod: &Pod) -> Result<()> {
    let id = pod.id();
    let pairs = if pod.serves.is_empty() {
        vec![(8080, 8081)]
    } else {
        server_ports(&pod.serves)
    };
    let ferry = state.ferry.display().to_string();
    let log_name = id.replace('/', "-");
    for (i, (tcp, udp)) in pairs.iter().enumerate() {
        let (t, u) = (tcp.to_string(), udp.to_string());
        let log = dir.join(format!("logs/pod-{log_name}-{i}.log"));
        let pid = sys::start_in(
            &pod.netns,
            &log,
            &[
                &ferry,
                "serve",
                "--name",
                &id,
                "--http-port",
                &t,
                "--udp-port",
                &u,
            ],
        )?;
        state.processes.push(Process {
            label: format!("ferry serve in pod {id} (tcp {tcp}, udp {udp})"),
            pid,
        });
        state.save(dir)?;
    }
    if pod.serves.is_empty() {
        return sys::wait_for(10, &format!("the server in pod {id}"), || {
            sys::exec_in(
                &pod.netns,
                2,
                &["curl", "-s", "http://127.0.0.1:8080/healthz"],
            )
            .is_ok_and(|o| o.status.success())
        });
    }
    let mut args = vec![
        ferry.clone(),
        "lab".into(),
        "probe-matrix".into(),
        "--target".into(),
        format!("{id}=127.0.0.1"),
    ];
    for s in &pod.serves {
        args.extend(["--port".into(), s.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut last = String::new();
    sys::wait_for(
        10,
        &format!("the servers in pod {id} answering"),
        || match sys::run_in(&pod.netns, 5, &args) {
            Ok(out) => {
                last = out.clone();
                crate::matrix::parse_answers(&out)
                    .is_ok_and(|a| a.len() == pod.serves.len() && a.iter().all(|r| r.2))
            }
            Err(e) => {
                last = format!("{e:#}");
                false
            }
        },
    )
    .with_context(|| format!("the last probe: {last}"))
}

/// Removes pod `name` (`NS/NAME`, or `NAME` in `default`): CNI DEL, its servers, its
/// namespace; its manifest goes at once.
pub fn remove_pod(dir: &Path, state: &mut State, name: &str) -> Result<()> {
    let pod = state.pod(name)?.clone();
    state.pods.retain(|p| p.container_id != pod.container_id);
    write_pods(dir, state)?;
    let conf = cni::netconf(dir, pod.node);
    cni::del(
        &state.cni,
        &conf,
        &pod.container_id,
        &pod.netns,
        (&pod.namespace, &pod.name),
    )?;
    let pids = sys::pids_in(&pod.netns);
    sys::stop(&pids);
    state.processes.retain(|p| !pids.contains(&p.pid));
    let _ = sys::run(&["ip", "netns", "del", &pod.netns]);
    state.save(dir)
}

/// Writes the Namespaces, the Pod objects and the EndpointSlices for the pods in `state`.
pub fn write_pods(dir: &Path, state: &State) -> Result<()> {
    let ready = State {
        pods: state
            .pods
            .iter()
            .filter(|p| !p.ips.is_empty())
            .cloned()
            .collect(),
        ..state.clone()
    };
    sys::write_atomic(
        &manifests(dir).join("namespaces.yaml"),
        &cluster::namespaces(state),
    )?;
    sys::write_atomic(&manifests(dir).join("pods.yaml"), &cluster::pods(&ready))?;
    sys::write_atomic(
        &manifests(dir).join("slices.yaml"),
        &cluster::slices(&ready),
    )
}

/// `ferry lab down`: CNI DEL for every pod the state knows (while the agents still
/// run), every process stopped, every namespace named `PREFIX-...` deleted (with
/// whatever runs in it, also after a crash that lost the state), the directory removed.
pub fn down(dir: &Path, prefix: &str) -> Result<()> {
    let state = State::load(dir).ok();
    let prefix = state
        .as_ref()
        .map_or(prefix, |s| s.plan.prefix.as_str())
        .to_string();
    if let Some(s) = &state {
        for p in s.pods.iter().filter(|p| !p.ips.is_empty()) {
            let conf = cni::netconf(dir, p.node);
            let pod = (p.namespace.as_str(), p.name.as_str());
            if let Err(e) = cni::del(&s.cni, &conf, &p.container_id, &p.netns, pod) {
                eprintln!("ferry lab: {e:#}");
            }
        }
        let pids: Vec<u32> = s.processes.iter().map(|p| p.pid).collect();
        sys::stop(&pids);
    }
    let namespaces = sys::namespaces_with_prefix(&prefix);
    let pids: Vec<u32> = namespaces.iter().flat_map(|ns| sys::pids_in(ns)).collect();
    sys::stop(&pids);
    for ns in &namespaces {
        // Deleting a namespace deletes its links (pods' persistent TAPs of a crashed
        // agent included), nftables state and everything the lab put in it.
        sys::run(&["ip", "netns", "del", ns])?;
    }
    if dir.exists() && (state.is_some() || manifests(dir).exists()) {
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}

/// `ferry lab status`: nodes, pods, processes, the load balancer's healthy nodes.
pub fn status(dir: &Path) -> Result<String> {
    let s = State::load(dir)?;
    let plan = &s.plan;
    let mut out = format!(
        "lab {} ({} nodes, {} zones) in {}\n",
        plan.prefix,
        plan.nodes,
        plan.zones,
        dir.display()
    );
    for n in plan.node_numbers() {
        out += &format!(
            "node{n}  {}  {}  pods {}\n",
            Plan::zone_name(plan.zone_of(n)),
            plan.node_ip(n),
            Plan::pod_cidr(n)
        );
    }
    for p in &s.pods {
        out += &format!("pod {:<8} node{}  {}\n", p.id(), p.node, p.ips.join(", "));
    }
    for p in &s.processes {
        let up = if sys::alive(p.pid) {
            "running"
        } else {
            "EXITED"
        };
        out += &format!("{:<7} {:>7}  {}\n", up, p.pid, p.label);
    }
    let healthy = fs::read_to_string(dir.join("lb-healthy.json")).unwrap_or_default();
    out += &format!("load balancer: nodes passing web-local's health check: {healthy}\n");
    Ok(out)
}

/// `ferry lab exec TARGET -- CMD...`: runs CMD in a node (`node1`), a pod (`web`, `x/a`), or
/// `client`, `client2`, `lb`, `fabric`; returns its exit code.
pub fn exec(dir: &Path, target: &str, cmd: &[String]) -> Result<i32> {
    let s = State::load(dir)?;
    let ns = match s.pods.iter().find(|p| p.is(target)) {
        Some(p) => p.netns.clone(),
        None => {
            let known = ["client", "client2", "lb", "fabric"].contains(&target)
                || target
                    .strip_prefix("node")
                    .and_then(|n| n.parse::<u8>().ok())
                    .is_some_and(|n| (1..=s.plan.nodes).contains(&n));
            anyhow::ensure!(
                known,
                "{target}: not a node (node1..node{}), pod, client, client2, lb or fabric",
                s.plan.nodes
            );
            s.plan.ns(target)
        }
    };
    let (program, args) = cmd.split_first().context("no command to run")?;
    let status = Cmd::new(program)
        .args(args)
        .netns(&ns)
        .command()
        .status()
        .with_context(|| format!("running {cmd:?} in {ns}"))?;
    Ok(status.code().unwrap_or(1))
}
