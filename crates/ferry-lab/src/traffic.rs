//! Traffic through the lab that an agent's restart must not break, started before the
//! restart and counted after it: paced TCP downloads from pod `a` through `multi`'s
//! cluster IP (two endpoints, on two nodes), a UDP flow from `a` through `web`'s
//! cluster IP, a paced download from the external client through node1's node port to
//! `web` on another node (`calico-ebpf-nlb-nodeport.txt`'s path), and a ping every
//! 20 ms from `a` to `web`. Each kind reports the connections that survived, what was
//! lost and the longest gap ([`Report`]). Every process it starts ends with it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ferry_linux::cmd::Cmd;

use crate::download::{Download, STALL_LIMIT};
use crate::plan::{cluster_ip, node_port};
use crate::probe::{FlowReport, TAIL};
use crate::state::State;
use crate::sys;

/// How long the traffic lasts: through a restart and well after it.
pub const LASTS: Duration = Duration::from_secs(10);
/// How fast each download goes (bytes per second).
pub const RATE: u64 = 250_000;
/// The downloads through `multi`.
pub const DOWNLOADS: usize = 4;
/// The interval of the UDP flow and of the ping.
pub const EVERY: Duration = Duration::from_millis(20);
/// The node the node-port download enters by.
pub const INGRESS: u8 = 1;
/// How long the traffic runs before [`Traffic::start`] returns.
const WARM_UP: Duration = Duration::from_secs(1);

/// A kind of traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// TCP downloads through a cluster IP.
    Downloads,
    /// A UDP flow through a cluster IP.
    Udp,
    /// A TCP download from outside through a node port.
    NodePort,
    /// Pings from a pod to a pod on another node.
    Ping,
}

impl Kind {
    /// Whether it is a flow of datagrams every [`EVERY`] (else TCP, whose gaps after a
    /// loss follow its retransmission timer).
    pub fn datagrams(self) -> bool {
        matches!(self, Kind::Udp | Kind::Ping)
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Downloads => "downloads",
            Kind::Udp => "UDP",
            Kind::NodePort => "NodePort",
            Kind::Ping => "ping",
        }
    }
}

/// What one kind of traffic went through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The kind.
    pub kind: Kind,
    /// Connections started (a flow or a ping counts as one).
    pub started: usize,
    /// Of them, those that kept going to their end.
    pub survived: usize,
    /// Datagrams lost of those sent; for TCP, segments the servers retransmitted.
    pub lost: u64,
    /// Datagrams sent (0 for TCP).
    pub sent: u64,
    /// The longest time between two answers, or two reads of a download, in ms.
    pub longest_gap_ms: u64,
    /// What else there is to say (the servers, why a connection broke).
    pub notes: Vec<String>,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}/{} kept",
            self.kind.name(),
            self.survived,
            self.started
        )?;
        if self.kind.datagrams() {
            write!(f, ", {}/{} lost", self.lost, self.sent)?;
        } else {
            write!(f, ", {} retransmitted", self.lost)?;
        }
        write!(f, ", gap {} ms", self.longest_gap_ms)?;
        if !self.notes.is_empty() {
            write!(f, " ({})", self.notes.join(", "))?;
        }
        Ok(())
    }
}

/// The outcomes of every kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report(pub Vec<Outcome>);

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(Outcome::to_string).collect();
        f.write_str(&parts.join("; "))
    }
}

struct Flow {
    kind: Kind,
    child: Child,
    log: PathBuf,
}

/// The traffic, running; stopped (every process killed) when dropped unfinished.
pub struct Traffic {
    flows: Vec<Flow>,
    started: Instant,
    /// The namespaces of the TCP servers, by kind, with their retransmissions before.
    servers: Vec<(Kind, String, u64)>,
}

impl Traffic {
    /// Starts every kind, and returns once every download is connected and the traffic
    /// has run for a second.
    pub fn start(dir: &Path, state: &State) -> Result<Traffic> {
        let web = state.pod("web")?;
        anyhow::ensure!(
            web.node != INGRESS,
            "web is on node{INGRESS}: no node-port path across nodes"
        );
        let a = state.pod("a")?.netns.clone();
        let client = state.plan.ns("client");
        let mut servers = Vec::new();
        for (kind, pod) in [
            (Kind::Downloads, "multi-1"),
            (Kind::Downloads, "multi-2"),
            (Kind::NodePort, "web"),
        ] {
            let ns = state.pod(pod)?.netns.clone();
            let before = retransmitted(&ns)?;
            servers.push((kind, ns, before));
        }
        let mut t = Traffic {
            flows: Vec::new(),
            started: Instant::now(),
            servers,
        };
        let ferry = state.ferry.display().to_string();
        let bytes = (RATE * LASTS.as_secs()).to_string();
        let rate = RATE.to_string();
        let download = |to: &str| {
            let args = [
                "lab",
                "probe-download",
                "--bytes",
                &bytes,
                "--rate",
                &rate,
                to,
            ];
            args.map(str::to_string).to_vec()
        };
        let multi = format!("{}:80", cluster_ip::MULTI);
        for i in 0..DOWNLOADS {
            t.spawn(dir, Kind::Downloads, i, &a, &ferry, &download(&multi))?;
        }
        let port = format!("{}:{}", state.plan.node_ip(INGRESS), node_port::WEB_HTTP);
        t.spawn(dir, Kind::NodePort, 0, &client, &ferry, &download(&port))?;
        let count = (LASTS.as_millis() / EVERY.as_millis()).to_string();
        let every = EVERY.as_millis().to_string();
        let udp = format!("{}:81", cluster_ip::WEB);
        let flow = [
            "lab",
            "probe-udp",
            "--flow",
            &count,
            "--interval-ms",
            &every,
            &udp,
        ];
        t.spawn(dir, Kind::Udp, 0, &a, &ferry, &flow.map(str::to_string))?;
        let interval = format!("{:.3}", EVERY.as_secs_f64());
        let to = state.pod_ip("web")?;
        let ping = ["-D", "-n", "-c", &count, "-i", &interval, "-W", "1", &to];
        t.spawn(dir, Kind::Ping, 0, &a, "ping", &ping.map(str::to_string))?;
        for f in t.flows.iter().filter(|f| !f.kind.datagrams()) {
            let log = &f.log;
            let what = format!("a {} download connected", f.kind.name());
            sys::wait_for(5, &what, || {
                fs::read_to_string(log).is_ok_and(|l| l.starts_with("connected"))
            })
            .with_context(|| {
                let text = fs::read_to_string(log).unwrap_or_default();
                match last_json::<Download>(&text) {
                    Ok(d) => d.error.unwrap_or(text),
                    Err(_) => text,
                }
            })?;
        }
        sleep(WARM_UP.saturating_sub(t.started.elapsed()));
        Ok(t)
    }

    fn spawn(
        &mut self,
        dir: &Path,
        kind: Kind,
        i: usize,
        ns: &str,
        program: &str,
        args: &[String],
    ) -> Result<()> {
        let log = dir.join(format!(
            "logs/traffic-{}-{i}.log",
            kind.name().to_lowercase()
        ));
        let out = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Cmd::new(program)
            .args(args)
            .netns(ns)
            .command()
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {program} {args:?} in {ns}"))?;
        self.flows.push(Flow { kind, child, log });
        Ok(())
    }

    /// How long the traffic has run.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Waits for every flow to end (a download that stalls ends after
    /// [`STALL_LIMIT`]), and reports.
    pub fn finish(mut self) -> Result<Report> {
        let deadline = self.started + LASTS + STALL_LIMIT + Duration::from_secs(10);
        for f in &mut self.flows {
            while f.child.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    bail!("{} still runs after {deadline:?}", f.log.display());
                }
                sleep(Duration::from_millis(20));
            }
        }
        let mut out = Vec::new();
        for kind in [Kind::Downloads, Kind::Udp, Kind::NodePort, Kind::Ping] {
            let logs: Vec<String> = self
                .flows
                .iter()
                .filter(|f| f.kind == kind)
                .map(|f| fs::read_to_string(&f.log).unwrap_or_default())
                .collect();
            let mut o = match kind {
                Kind::Downloads | Kind::NodePort => downloads(kind, &logs)?,
                Kind::Udp => udp(&logs)?,
                Kind::Ping => ping(&logs.concat())?,
            };
            for (_, ns, before) in self.servers.iter().filter(|s| s.0 == kind) {
                o.lost += retransmitted(ns)?.saturating_sub(*before);
            }
            out.push(o);
        }
        Ok(Report(out))
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        for f in &mut self.flows {
            if matches!(f.child.try_wait(), Ok(None)) {
                let _ = f.child.kill();
            }
            let _ = f.child.wait();
        }
    }
}

/// The TCP segments retransmitted in namespace `ns` so far (`RetransSegs`).
fn retransmitted(ns: &str) -> Result<u64> {
    let snmp = sys::run_in(ns, 5, &["cat", "/proc/net/snmp"])?;
    retrans_segs(&snmp).with_context(|| format!("no RetransSegs in {ns}'s /proc/net/snmp"))
}

/// `RetransSegs` of a `/proc/net/snmp` text: its `Tcp:` lines, names then values.
fn retrans_segs(snmp: &str) -> Option<u64> {
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next()?, tcp.next()?);
    let i = names.split_whitespace().position(|n| n == "RetransSegs")?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// The last line of a probe's log: its report, as JSON.
fn last_json<T: serde::de::DeserializeOwned>(log: &str) -> Result<T> {
    let line = log.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("a probe's report: {log:?}"))
}

fn downloads(kind: Kind, logs: &[String]) -> Result<Outcome> {
    let got: Vec<Download> = logs.iter().map(|l| last_json(l)).collect::<Result<_>>()?;
    let mut by: std::collections::BTreeMap<&str, usize> = Default::default();
    for d in &got {
        *by.entry(d.served_by.as_deref().unwrap_or("?")).or_default() += 1;
    }
    let mut notes: Vec<String> = by.iter().map(|(s, n)| format!("{s} {n}")).collect();
    notes.extend(got.iter().filter_map(|d| d.error.clone()));
    Ok(Outcome {
        kind,
        started: got.len(),
        survived: got.iter().filter(|d| d.complete()).count(),
        lost: 0,
        sent: 0,
        longest_gap_ms: got.iter().map(|d| d.longest_gap_ms).max().unwrap_or(0),
        notes,
    })
}

fn udp(logs: &[String]) -> Result<Outcome> {
    let r: FlowReport = last_json(logs.concat().as_str())?;
    Ok(Outcome {
        kind: Kind::Udp,
        started: 1,
        survived: usize::from(r.answered_at_end > 0),
        lost: u64::from(r.sent - r.answered),
        sent: u64::from(r.sent),
        longest_gap_ms: r.longest_gap_ms,
        notes: Vec::new(),
    })
}

/// `ping -D` output: `[UNIX.TIME] 64 bytes from ...: icmp_seq=N ...` for each reply,
/// then `N packets transmitted, M received, ...`.
fn ping(out: &str) -> Result<Outcome> {
    let mut replies: Vec<(f64, u64)> = Vec::new();
    let mut sent = None;
    for l in out.lines() {
        if let Some(rest) = l.strip_prefix('[')
            && !l.contains("DUP!")
            && let Some((ts, after)) = rest.split_once(']')
            && let Some(seq) = after
                .split_whitespace()
                .find_map(|w| w.strip_prefix("icmp_seq="))
            && let (Ok(ts), Ok(seq)) = (ts.parse::<f64>(), seq.parse::<u64>())
        {
            replies.push((ts, seq));
        }
        if let Some((n, _)) = l.split_once(" packets transmitted") {
            sent = n.trim().parse::<u64>().ok();
        }
    }
    let sent = sent.with_context(|| format!("no summary in ping's output: {out:?}"))?;
    let gap = replies
        .windows(2)
        .map(|w| ((w[1].0 - w[0].0) * 1000.0).round() as u64)
        .max()
        .unwrap_or(0);
    let tail = sent.saturating_sub(u64::from(TAIL));
    Ok(Outcome {
        kind: Kind::Ping,
        started: 1,
        survived: usize::from(replies.iter().any(|&(_, s)| s > tail)),
        lost: sent.saturating_sub(replies.len() as u64),
        sent,
        longest_gap_ms: gap,
        notes: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_ping_output_gives_loss_gap_and_whether_it_kept_going() {
        let out = "PING 10.244.2.2 (10.244.2.2) 56(84) bytes of data.\n\
            [1000.000] 64 bytes from 10.244.2.2: icmp_seq=1 ttl=62 time=0.4 ms\n\
            [1000.020] 64 bytes from 10.244.2.2: icmp_seq=2 ttl=62 time=0.4 ms\n\
            [1000.020] 64 bytes from 10.244.2.2: icmp_seq=2 ttl=62 time=0.4 ms (DUP!)\n\
            [1000.540] 64 bytes from 10.244.2.2: icmp_seq=28 ttl=62 time=0.4 ms\n\
            \n--- 10.244.2.2 ping statistics ---\n\
            30 packets transmitted, 3 received, 90% packet loss, time 600ms\n";
        let o = ping(out).unwrap();
        assert_eq!((o.sent, o.lost, o.longest_gap_ms), (30, 27, 520));
        assert_eq!(o.survived, 1, "seq 28 is among the last {TAIL}");
        let cut = out.replace("icmp_seq=28", "icmp_seq=3");
        assert_eq!(ping(&cut).unwrap().survived, 0);
        assert!(ping("PING x\n").is_err(), "no summary: an error");
    }

    #[test]
    fn test_retransmissions_are_read_from_the_tcp_lines() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
            Tcp: RtoAlgorithm RtoMin RetransSegs InErrs\nTcp: 1 200 17 0\n\
            Udp: InDatagrams\nUdp: 5\n";
        assert_eq!(retrans_segs(snmp), Some(17));
        assert_eq!(retrans_segs("Tcp: RtoMin\nTcp: 200\n"), None);
    }

    #[test]
    fn test_downloads_count_the_complete_and_name_the_servers() {
        let ok = Download {
            served_by: Some("multi-1".into()),
            bytes: 10,
            want: 10,
            longest_gap_ms: 30,
            error: None,
        };
        let broken = Download {
            served_by: Some("multi-2".into()),
            bytes: 4,
            longest_gap_ms: 900,
            error: Some("after 4 bytes: reset".into()),
            ..ok.clone()
        };
        let log = |d: &Download| format!("connected x\n{}\n", serde_json::to_string(d).unwrap());
        let o = downloads(Kind::Downloads, &[log(&ok), log(&broken), log(&ok)]).unwrap();
        assert_eq!((o.started, o.survived, o.longest_gap_ms), (3, 2, 900));
        assert_eq!(o.notes, ["multi-1 2", "multi-2 1", "after 4 bytes: reset"]);
    }
}
