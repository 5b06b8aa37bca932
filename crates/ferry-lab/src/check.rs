//! `ferry lab check`: one row per scenario (name, pass or fail, time, what went wrong or
//! what it measured), real tools (ping, curl, tshark) for some traffic and `ferry
//! serve` / `ferry lab probe-udp` for the rest. Every expectation looks at what arrived: the server's
//! answer, the client address it saw, bytes compared, fragments counted.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use ferry_linux::cmd::Cmd;

use crate::plan::{
    CLIENT_IP, CLIENT_IP6, CLIENT2_IP, Plan, VIP_CROSS_ZONE, VIP_ROUTED, cluster_ip, lb_port,
    node_port,
};
use crate::state::State;
use crate::sys;

mod restart;
pub mod services;

/// What a scenario sees of the lab.
pub struct Ctx<'a> {
    /// The lab's directory.
    pub dir: &'a Path,
    /// Its state, re-read by scenarios that change it.
    pub state: State,
    /// What a scenario measured, for its row also when it passes (taken by the row).
    pub note: Option<String>,
}

type Scenario = fn(&mut Ctx) -> Result<()>;

/// A scenario the lab's shape does not allow (reported as SKIP with the reason, not as a
/// failure: it is the shape asked for, not something missing).
#[derive(Debug)]
pub struct NotApplicable(pub &'static str);

impl std::fmt::Display for NotApplicable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for NotApplicable {}

/// The scenarios, in order.
pub const SCENARIOS: &[(&str, Scenario)] = &[
    ("pod to pod, same node (ping, HTTP)", same_node),
    (
        "pod to pod, across nodes (VXLAN between zones)",
        across_zones,
    ),
    ("pod to pod, other node in the zone (routed)", within_zone),
    (
        "IPv6: pod to pod (three ways), pod to ClusterIP",
        ipv6_pod_to_pod,
    ),
    ("pod to ClusterIP, TCP", cluster_ip_tcp),
    ("pod to ClusterIP, UDP", cluster_ip_udp),
    (
        "NodePort Cluster from outside, every node",
        node_port_cluster,
    ),
    (
        "NodePort Cluster from outside over IPv6, every node",
        node_port_cluster_ipv6,
    ),
    (
        "NodePort Local from outside, only the endpoint's node",
        node_port_local,
    ),
    (
        "LB cross-zone on, Cluster: every connection",
        lb_cross_zone_cluster,
    ),
    (
        "LB cross-zone off, Cluster: every zone's listener",
        lb_zonal_cluster,
    ),
    ("LB health checks steer Local", lb_local),
    (
        "LB source ranges: the client in, a second client out",
        lb_source_ranges,
    ),
    (
        "fragmented UDP pod to pod (4000-16000 B)",
        fragmented_udp_pod,
    ),
    (
        "fragmented UDP from outside to a NodePort",
        fragmented_udp_node_port,
    ),
    (
        "fragmented ICMP pod to pod and from outside",
        fragmented_icmp,
    ),
    (
        "large TCP across nodes, MTU 9000 pod vs 1450 path",
        large_tcp_no_fragments,
    ),
    (
        "trafficDistribution: PreferSameZone, PreferSameNode",
        traffic_distribution,
    ),
    ("session affinity ClientIP", session_affinity),
    ("Service without endpoints refused at once", no_endpoints),
    ("hairpin: a pod through its own Service", hairpin),
    (
        "UDP Service answers while its pod is replaced",
        udp_pod_replaced,
    ),
    // Last: a connection a restart breaks is not mended for the rows after it. The
    // updates first, as a rolling update of the DaemonSet would.
    (
        "restart node1 (update) under traffic",
        restart::update_ingress,
    ),
    (
        "restart web's node (update) under traffic",
        restart::update_endpoint,
    ),
    ("restart node1 (kill) under traffic", restart::kill_ingress),
    (
        "restart web's node (kill) under traffic",
        restart::kill_endpoint,
    ),
    (
        "restart node1 (kill, checkpoint lost) under traffic",
        restart::cold_ingress,
    ),
    (
        "restart web's node (kill, checkpoint lost) under traffic",
        restart::cold_endpoint,
    ),
];

/// curl's exit code and output (body, or error) for `url` from namespace `ns`, given
/// `max_secs`.
fn curl_in(ns: &str, url: &str, max_secs: u32) -> Result<(i32, String)> {
    let m = max_secs.to_string();
    let out = sys::exec_in(ns, max_secs + 2, &["curl", "-sS", "--max-time", &m, url])?;
    Ok((
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    ))
}

/// Runs every scenario, writing a row each and a summary; true when all passed.
pub fn run(dir: &Path, out: &mut dyn Write) -> Result<bool> {
    let mut ctx = Ctx {
        dir,
        state: State::load(dir)?,
        note: None,
    };
    let mut rows = Rows::new(55);
    writeln!(out, "{:<4}  {:<55}  {:>6}  detail", "", "scenario", "time")?;
    for (name, f) in SCENARIOS {
        let start = Instant::now();
        let r = f(&mut ctx);
        let note = ctx.note.take();
        rows.row(out, name, start.elapsed(), r, note)?;
    }
    rows.summary(out)
}

/// The rows of a suite's run: `PASS`, `SKIP` (the scenario does not apply to this lab)
/// or `FAIL`, the name, the time and the detail; then the summary.
pub(crate) struct Rows {
    /// The width of the name column.
    width: usize,
    passed: usize,
    failed: usize,
    skipped: usize,
}

impl Rows {
    pub(crate) fn new(width: usize) -> Rows {
        Rows {
            width,
            passed: 0,
            failed: 0,
            skipped: 0,
        }
    }

    /// The row of scenario `name`, which took `took` and ended in `r` (with `note` to
    /// add when it passed).
    pub(crate) fn row(
        &mut self,
        out: &mut dyn Write,
        name: &str,
        took: std::time::Duration,
        r: Result<()>,
        note: Option<String>,
    ) -> Result<()> {
        let t = format!("{:.2}s", took.as_secs_f64());
        let w = self.width;
        let (word, detail) = match r {
            Ok(()) => {
                self.passed += 1;
                ("PASS", note)
            }
            Err(e) if e.downcast_ref::<NotApplicable>().is_some() => {
                self.skipped += 1;
                ("SKIP", Some(e.to_string()))
            }
            Err(e) => {
                self.failed += 1;
                ("FAIL", Some(format!("{e:#}").replace('\n', " ")))
            }
        };
        match detail {
            Some(d) => writeln!(out, "{word}  {name:<w$}  {t:>6}  {d}")?,
            None => writeln!(out, "{word}  {name:<w$}  {t:>6}")?,
        }
        out.flush()?;
        Ok(())
    }

    /// The summary line; true when none failed.
    pub(crate) fn summary(&self, out: &mut dyn Write) -> Result<bool> {
        writeln!(
            out,
            "{} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        )?;
        Ok(self.failed == 0)
    }
}

impl Ctx<'_> {
    fn ns(&self, target: &str) -> Result<String> {
        Ok(match self.state.pods.iter().find(|p| p.is(target)) {
            Some(p) => p.netns.clone(),
            None => self.state.plan.ns(target),
        })
    }

    fn plan(&self) -> &Plan {
        &self.state.plan
    }

    /// curl's exit code and output (body, or error).
    fn curl_code(&self, from: &str, url: &str, max_secs: u32) -> Result<(i32, String)> {
        curl_in(&self.ns(from)?, url, max_secs)
    }

    /// What `url` answers from `from`.
    fn curl(&self, from: &str, url: &str) -> Result<String> {
        match self.curl_code(from, url, 3)? {
            (0, body) => Ok(body),
            (code, err) => bail!("curl {url} from {from}: exit {code}: {err}"),
        }
    }

    /// Requires `url` to answer `want` from `from`, retrying for up to 5 s (a first
    /// packet may wait for neighbours, or the agents for a manifest change).
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

    /// `ferry lab probe-udp ARGS` in `from`'s namespace.
    fn probe(&self, from: &str, args: &[&str]) -> Result<String> {
        let ferry = self.state.ferry.display().to_string();
        let mut cmd = vec![ferry.as_str(), "lab", "probe-udp"];
        cmd.extend_from_slice(args);
        sys::run_in(&self.ns(from)?, 30, &cmd)
    }

    fn ping(&self, from: &str, to: &str, size: usize) -> Result<()> {
        let ns = self.ns(from)?;
        let s = size.to_string();
        sys::wait_for(5, &format!("a ping answer from {to}"), || {
            sys::exec_in(&ns, 2, &["ping", "-c", "1", "-W", "1", "-s", &s, to])
                .is_ok_and(|o| o.status.success())
        })?;
        let out = sys::run_in(
            &ns,
            10,
            &["ping", "-c", "3", "-i", "0.2", "-W", "2", "-s", &s, to],
        )?;
        ensure!(
            out.contains("3 received"),
            "ping -s {size} {to} from {from}: {out}"
        );
        Ok(())
    }

    fn pod_ip(&self, name: &str) -> Result<String> {
        self.state.pod_ip(name)
    }
}

fn same_node(c: &mut Ctx) -> Result<()> {
    let (a, b) = (c.pod_ip("a")?, c.pod_ip("b")?);
    c.ping("a", &b, 56)?;
    c.expect("a", &format!("http://{b}:8080/clientip"), &a)
}

fn across_zones(c: &mut Ctx) -> Result<()> {
    let (a, web) = (c.pod_ip("a")?, c.pod_ip("web")?);
    c.ping("a", &web, 56)?;
    c.expect("a", &format!("http://{web}:8080/clientip"), &a)
}

fn within_zone(c: &mut Ctx) -> Result<()> {
    let other = c.state.pod("multi-2")?.node;
    if other == 1 || c.plan().zone_of(other) != c.plan().zone_of(1) {
        return Err(NotApplicable("node1 is alone in its zone").into());
    }
    let (a, m) = (c.pod_ip("a")?, c.pod_ip("multi-2")?);
    c.expect("a", &format!("http://{m}:8080/clientip"), &a)
}

fn ipv6_pod_to_pod(c: &mut Ctx) -> Result<()> {
    let a = c.state.pod_ip6("a")?;
    for pod in ["b", "web", "multi-2"] {
        let to = c.state.pod_ip6(pod)?;
        c.ping("a", &to, 56)?;
        c.expect("a", &format!("http://[{to}]:8080/clientip"), &a)?;
        // Fragmented both ways: ICMPv6 and UDP.
        c.ping("a", &to, 8000)?;
        c.probe("a", &["--sizes", FRAGMENTED, &format!("[{to}]:8081")])?;
    }
    // web's IPv6 cluster IP, TCP and UDP.
    let svc = cluster_ip::WEB6;
    c.expect("a", &format!("http://[{svc}]/clientip"), &a)?;
    let name = c.probe("a", &["--ask", "hostname", &format!("[{svc}]:81")])?;
    ensure!(name.trim() == "web", "hostname over UDP/IPv6: {name:?}");
    Ok(())
}

fn cluster_ip_tcp(c: &mut Ctx) -> Result<()> {
    let a = c.pod_ip("a")?;
    c.expect("a", &format!("http://{}/hostname", cluster_ip::WEB), "web")?;
    c.expect("a", &format!("http://{}/clientip", cluster_ip::WEB), &a)
}

fn cluster_ip_udp(c: &mut Ctx) -> Result<()> {
    let a = c.pod_ip("a")?;
    let to = format!("{}:81", cluster_ip::WEB);
    let name = c.probe("a", &["--ask", "hostname", &to])?;
    ensure!(name.trim() == "web", "hostname over UDP: {name:?}");
    let ip = c.probe("a", &["--ask", "clientip", &to])?;
    ensure!(ip.trim() == a, "clientip over UDP: {ip:?}, not {a}");
    Ok(())
}

fn node_port_cluster(c: &mut Ctx) -> Result<()> {
    for n in c.plan().node_numbers() {
        let url = format!(
            "http://{}:{}/clientip",
            c.plan().node_ip(n),
            node_port::WEB_HTTP
        );
        c.expect("client", &url, CLIENT_IP)?;
    }
    Ok(())
}

fn node_port_cluster_ipv6(c: &mut Ctx) -> Result<()> {
    for n in c.plan().node_numbers() {
        let url = format!(
            "http://[{}]:{}/clientip",
            c.plan().node_ip6(n),
            node_port::WEB_HTTP
        );
        c.expect("client", &url, CLIENT_IP6)?;
    }
    Ok(())
}

fn node_port_local(c: &mut Ctx) -> Result<()> {
    let web = c.plan().web_node();
    for n in c.plan().node_numbers() {
        let url = format!(
            "http://{}:{}/clientip",
            c.plan().node_ip(n),
            node_port::WEB_LOCAL_HTTP
        );
        if n == web {
            c.expect("client", &url, CLIENT_IP)?;
        } else {
            let (code, out) = c.curl_code("client", &url, 1)?;
            ensure!(
                code != 0,
                "node{n} has no local endpoint, yet answered {out:?}"
            );
        }
    }
    Ok(())
}

/// `count` connections to `vip:port` from the client: how many answered the client's
/// address, and the first other outcome.
fn through_lb(c: &Ctx, vip: &str, port: u16, count: usize) -> Result<(usize, String)> {
    let url = format!("http://{vip}:{port}/clientip");
    let mut ok = 0;
    let mut other = String::new();
    for _ in 0..count {
        match c.curl_code("client", &url, 2)? {
            (0, body) if body == CLIENT_IP => ok += 1,
            (code, out) if other.is_empty() => other = format!("exit {code}: {out:?}"),
            _ => {}
        }
    }
    Ok((ok, other))
}

/// Connections the load balancer has sent to each node's `port`, by node.
fn lb_counts(c: &Ctx, port: u16) -> Result<Vec<(u8, u64)>> {
    let listing = sys::run_in(
        &c.ns("lb")?,
        5,
        &[
            "nft",
            "list",
            "chain",
            "ip",
            crate::lb::TABLE,
            crate::lb::COUNTERS,
        ],
    )?;
    Ok(crate::lb::connections_to(&listing, port))
}

/// `through_lb`, requiring every connection answered and the nodes that got
/// connections to be exactly `nodes`.
fn spread_over(c: &Ctx, vip: &str, port: u16, nodes: &[u8]) -> Result<()> {
    let target = if port == lb_port::CLUSTER {
        node_port::WEB_HTTP
    } else {
        node_port::WEB_LOCAL_HTTP
    };
    let before = lb_counts(c, target)?;
    // Three rounds over the targets (the load balancer takes them in turn).
    let count = 3 * nodes.len();
    let (ok, other) = through_lb(c, vip, port, count)?;
    ensure!(
        ok == count,
        "{vip}:{port}: {ok}/{count} connections answered; {other}"
    );
    let after = lb_counts(c, target)?;
    let reached: Vec<u8> = after
        .iter()
        .filter(|(n, a)| before.iter().any(|(m, b)| m == n && a > b))
        .map(|(n, _)| *n)
        .collect();
    ensure!(
        reached == nodes,
        "{vip}:{port} sent connections to nodes {reached:?}, not {nodes:?}"
    );
    Ok(())
}

fn lb_cross_zone_cluster(c: &mut Ctx) -> Result<()> {
    let all: Vec<u8> = c.plan().node_numbers().collect();
    spread_over(c, VIP_CROSS_ZONE, lb_port::CLUSTER, &all)
}

fn lb_zonal_cluster(c: &mut Ctx) -> Result<()> {
    for z in 0..c.plan().zones {
        let nodes = c.plan().nodes_in_zone(z);
        spread_over(c, &Plan::vip_of_zone(z), lb_port::CLUSTER, &nodes)
            .with_context(|| format!("{}'s listener", Plan::zone_name(z)))?;
    }
    Ok(())
}

fn lb_local(c: &mut Ctx) -> Result<()> {
    let web = c.plan().web_node();
    let file = c.dir.join("lb-healthy.json");
    let healthy = || -> Vec<u8> {
        std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default()
    };
    sys::wait_for(
        5,
        &format!("the load balancer seeing only node{web} healthy"),
        || healthy() == [web],
    )
    .with_context(|| format!("healthy: {:?}", healthy()))?;
    spread_over(c, VIP_CROSS_ZONE, lb_port::LOCAL, &[web])?;
    for z in 0..c.plan().zones {
        let vip = Plan::vip_of_zone(z);
        if c.plan().zone_of(web) == z {
            spread_over(c, &vip, lb_port::LOCAL, &[web])?;
        } else {
            // No healthy node in the zone: refused at the load balancer.
            let url = format!("http://{vip}:{}/clientip", lb_port::LOCAL);
            let (code, out) = c.curl_code("client", &url, 2)?;
            ensure!(
                code == 7,
                "{}: no healthy target, yet exit {code}: {out:?}",
                Plan::zone_name(z)
            );
        }
    }
    Ok(())
}

const FRAGMENTED: &str = "4000,9000,16000";

/// `web-ranged`'s load balancer IP, which the load balancer routes to node1 as it is;
/// its loadBalancerSourceRanges hold the first client only (kube-proxy's firewall of
/// load balancer IPs). The client gets through, its address kept (the endpoint is on
/// web's node); the second client's SYNs get no answer at all (curl times out, it is
/// not refused) and node1 counts them for the Service port; its node port, which no
/// range restricts, answers the second client.
fn lb_source_ranges(c: &mut Ctx) -> Result<()> {
    let url = format!("http://{VIP_ROUTED}/clientip");
    c.expect("client", &url, CLIENT_IP)?;
    let before = source_denied(c)?;
    let (code, out) = c.curl_code("client2", &url, 2)?;
    ensure!(
        code == 28,
        "the second client is outside the ranges: wanted curl to time out (exit 28), got exit {code}: {out:?}"
    );
    let mut after = before;
    sys::wait_for(
        5,
        "node1 counting the second client's SYNs for default/web-ranged:http",
        || {
            after = source_denied(c).unwrap_or(before);
            after > before
        },
    )?;
    let node_port = format!(
        "http://{}:{}/clientip",
        c.plan().node_ip(1),
        node_port::WEB_RANGED_HTTP
    );
    c.expect("client2", &node_port, CLIENT2_IP)?;
    c.note = Some(format!(
        "node1 dropped {} SYNs of the second client",
        after - before
    ));
    Ok(())
}

/// New connections node1 refused by `web-ranged`'s source ranges.
fn source_denied(c: &Ctx) -> Result<u64> {
    let counters = crate::agents::counters(&c.dir.join("node1.sock"))?;
    Ok(counters
        .service_source_denied
        .get("default/web-ranged:http")
        .copied()
        .unwrap_or(0))
}

/// The pods that answer 24 connections from `from` to `ip`'s `/hostname`, sorted.
fn answering(c: &Ctx, from: &str, ip: &str) -> Result<Vec<String>> {
    let url = format!("http://{ip}/hostname");
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..24 {
        seen.insert(c.curl(from, &url)?);
    }
    Ok(seen.into_iter().collect())
}

/// `zonal` (PreferSameZone) and `nodal` (PreferSameNode) over web (node2) and the
/// multi pods (node1 and multi-2's node), their slices hinted as the EndpointSlice
/// controller hints them: from `a` on node1, zonal answers only from node1's zone
/// and nodal only from node1; from web (node2, the other zone) both answer only from
/// web itself, through the hairpin.
fn traffic_distribution(c: &mut Ctx) -> Result<()> {
    let plan = c.plan().clone();
    let web = plan.web_node();
    if plan.zone_of(web) == plan.zone_of(1) {
        return Err(NotApplicable("web's node is in node1's zone: one zone only").into());
    }
    let near: Vec<String> = ["multi-1", "multi-2"]
        .into_iter()
        .filter(|p| {
            c.state
                .pods
                .iter()
                .any(|q| q.name == *p && plan.zone_of(q.node) == plan.zone_of(1))
        })
        .map(str::to_string)
        .collect();
    let zonal = answering(c, "a", cluster_ip::ZONAL)?;
    ensure!(
        zonal.iter().all(|p| near.contains(p)) && zonal.contains(&"multi-1".to_string()),
        "zonal from a (node1's zone): answered by {zonal:?}, wanted only {near:?}"
    );
    let nodal = answering(c, "a", cluster_ip::NODAL)?;
    ensure!(
        nodal == ["multi-1"],
        "nodal from a (node1): answered by {nodal:?}, wanted only multi-1"
    );
    for ip in [cluster_ip::ZONAL, cluster_ip::NODAL] {
        let got = answering(c, "web", ip)?;
        ensure!(
            got == ["web"],
            "{ip} from web: answered by {got:?}, wanted only web"
        );
    }
    c.note = Some(format!("zonal from a: {}", zonal.join(", ")));
    Ok(())
}

fn fragmented_udp_pod(c: &mut Ctx) -> Result<()> {
    let web = c.pod_ip("web")?;
    let b = c.pod_ip("b")?;
    c.probe("a", &["--sizes", FRAGMENTED, &format!("{web}:8081")])?;
    c.probe("a", &["--sizes", FRAGMENTED, &format!("{b}:8081")])?;
    c.probe(
        "a",
        &["--sizes", FRAGMENTED, &format!("{}:81", cluster_ip::WEB)],
    )
    .map(drop)
}

fn fragmented_udp_node_port(c: &mut Ctx) -> Result<()> {
    for n in c.plan().node_numbers() {
        let to = format!("{}:{}", c.plan().node_ip(n), node_port::WEB_UDP);
        c.probe("client", &["--sizes", FRAGMENTED, &to])?;
    }
    Ok(())
}

fn fragmented_icmp(c: &mut Ctx) -> Result<()> {
    let web = c.pod_ip("web")?;
    c.ping("a", &web, 8000)?;
    for n in c.plan().node_numbers() {
        c.ping("client", &c.plan().node_ip(n), 8000)?;
    }
    Ok(())
}

fn large_tcp_no_fragments(c: &mut Ctx) -> Result<()> {
    let web = c.pod_ip("web")?;
    let web_ns = c.ns("web")?;
    let shown = sys::ip(&web_ns, &["-o", "link", "show", "eth0"])?;
    let mtu = shown
        .split_whitespace()
        .skip_while(|w| *w != "mtu")
        .nth(1)
        .context("eth0's MTU")?
        .to_string();
    // The pod's kernel believes in jumbo frames; the path through the overlay is 1450.
    sys::ip(&web_ns, &["link", "set", "eth0", "mtu", "9000"])?;
    let r = (|| -> Result<()> {
        // The fabric's end of the node's uplink: ferry's own transmissions bypass the
        // node side's packet taps (PACKET_QDISC_BYPASS).
        let fabric = c.ns("fabric")?;
        let port = format!("n{}", c.state.pod("web")?.node);
        let pcap = c.dir.join("large-tcp.pcap");
        let _ = std::fs::remove_file(&pcap);
        let p = pcap.display().to_string();
        let mut tshark = Cmd::new("tshark")
            .args(["-q", "-i", &port, "-w", &p])
            .netns(&fabric)
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("tshark (apt-get install tshark)")?;
        let started = sys::wait_for(5, "tshark capturing", || {
            std::fs::metadata(&pcap).is_ok_and(|m| m.len() > 0)
        });
        std::thread::sleep(Duration::from_millis(300));
        let n: usize = 20_000_000;
        let url = format!("http://{web}:8080/bytes?n={n}");
        let out = started.and_then(|()| {
            sys::run_in(
                &c.ns("a")?,
                30,
                &[
                    "curl",
                    "-sS",
                    "--max-time",
                    "20",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{size_download}",
                    &url,
                ],
            )
        });
        std::thread::sleep(Duration::from_millis(800));
        sys::signal(tshark.id(), "INT");
        let _ = tshark.wait();
        let got = out?;
        ensure!(got.trim() == n.to_string(), "downloaded {got} of {n} bytes");
        let count = |filter: &str| -> Result<usize> {
            let o = sys::run(&["tshark", "-r", &p, "-Y", filter])?;
            Ok(o.lines().count())
        };
        let frags = count("ip.flags.mf == 1 || ip.frag_offset > 0")?;
        // web's packets, encapsulated (another zone) or routed (the same): ip.src
        // matches the inner header too.
        let from_web = count(&format!("tcp && ip.src == {web}"))?;
        ensure!(
            from_web > 1000,
            "only {from_web} of web's packets captured on its node's uplink"
        );
        let zone = |pod: &str| -> Result<u8> { Ok(c.plan().zone_of(c.state.pod(pod)?.node)) };
        if zone("web")? != zone("a")? {
            let vxlan = count("vxlan")?;
            ensure!(vxlan > 1000, "between zones, only {vxlan} VXLAN packets");
        }
        ensure!(frags == 0, "{frags} IP fragments on the uplink");
        Ok(())
    })();
    let _ = sys::ip(&web_ns, &["link", "set", "eth0", "mtu", &mtu]);
    r
}

fn session_affinity(c: &mut Ctx) -> Result<()> {
    let url = format!("http://{}/hostname", cluster_ip::MULTI_STICKY);
    let first = c.curl("a", &url)?;
    for _ in 0..9 {
        let again = c.curl("a", &url)?;
        ensure!(again == first, "affinity broken: {first} then {again}");
    }
    // Without affinity both pods answer: the sticky one is not sticky by chance.
    let url = format!("http://{}/hostname", cluster_ip::MULTI);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..20 {
        seen.insert(c.curl("a", &url)?);
    }
    ensure!(
        seen.len() == 2,
        "the Service without affinity reached only {seen:?}"
    );
    Ok(())
}

fn no_endpoints(c: &mut Ctx) -> Result<()> {
    let start = Instant::now();
    let (code, out) = c.curl_code("a", &format!("http://{}/", cluster_ip::EMPTY), 3)?;
    let t = start.elapsed();
    ensure!(code == 7, "curl exit {code} (7: refused): {out}");
    ensure!(t < Duration::from_secs(1), "refused only after {t:?}");
    Ok(())
}

fn hairpin(c: &mut Ctx) -> Result<()> {
    c.expect(
        "web",
        &format!("http://{}/hostname", cluster_ip::WEB),
        "web",
    )
}

fn udp_pod_replaced(c: &mut Ctx) -> Result<()> {
    let old = c
        .state
        .pods
        .iter()
        .find(|p| p.app == "echo")
        .context("no echo pod")?
        .clone();
    let n: u32 = old.name.trim_start_matches("echo-").parse().unwrap_or(1);
    let new = format!("echo-{}", n + 1);
    let node = if old.node == 1 { c.plan().nodes } else { 1 };
    let ferry = c.state.ferry.display().to_string();
    let to = format!("{}:53", cluster_ip::ECHO);
    let stream = Cmd::new(&ferry)
        .args(["lab", "probe-udp", "--stream", "8", &to])
        .netns(c.ns("a")?)
        .command()
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    std::thread::sleep(Duration::from_secs(1));
    let dir = c.dir;
    let replaced = (|| -> Result<()> {
        crate::topology::add_pod(dir, &mut c.state, &new, node, "echo")?;
        crate::topology::write_pods(dir, &c.state)?;
        std::thread::sleep(Duration::from_millis(1000));
        crate::topology::remove_pod(dir, &mut c.state, &old.name)
    })();
    let out = stream.wait_with_output()?;
    replaced?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "probe: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The probe prints the answers in order, then the longest silence in ms.
    let mut lines: Vec<&str> = text.lines().collect();
    let gap: u64 = lines.pop().and_then(|l| l.parse().ok()).unwrap_or(u64::MAX);
    ensure!(
        lines.last() == Some(&new.as_str()),
        "answers {lines:?}: the new pod {new} never answered"
    );
    ensure!(gap < 2000, "answers {lines:?}; silent for {gap} ms");
    Ok(())
}
