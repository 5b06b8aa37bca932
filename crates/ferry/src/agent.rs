//! `ferry agent`: one node's dataplane driven by cluster state. The arguments become the
//! agent's settings; [`ferry_agent::control_loop`] runs it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use ferry_agent::ObjectKey;
use ferry_agent::compile::CompileOptions;
use ferry_agent::control_loop::{self, Error, Settings};
use ferry_agent::datastore::{OpenError, Source};
use ferry_agent::handover::{self, AfterHandover};
use ferry_agent::policy::audit::{AuditConfig, Target};
use ferry_agent::run::Options;

use crate::tables::read_tables_spec;

/// The default `--state-dir`.
pub const DEFAULT_STATE_DIR: &str = "/run/ferry/state";

/// Arguments of `ferry agent`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// This node's name: the Node object whose tables to program.
    #[arg(long, value_name = "NAME")]
    pub node: String,
    /// Where cluster state comes from: `file:DIR`, a directory of Kubernetes manifests,
    /// watched (edits apply live); `kubernetes`, the API server of the in-cluster
    /// configuration or the usual kubeconfig; `kubernetes:KUBECONFIG`, with that
    /// kubeconfig file.
    #[arg(long, value_name = "file:DIR|kubernetes[:KUBECONFIG]")]
    pub datastore: String,
    /// Base tables: the ports, routes and settings the cluster does not say (default:
    /// one uplink derived from the Node object; see docs/agent.md).
    #[arg(long, value_name = "FILE")]
    pub base: Option<PathBuf>,
    /// The Linux interface of the uplink port (read and written through AF_PACKET).
    /// Default: the first existing name of the ferry-config ConfigMap's `uplink`, else
    /// the interface that holds the Node's InternalIP, else the default route's.
    #[arg(long, value_name = "IFNAME")]
    pub uplink: Option<String>,
    /// The name of a TAP for the base's host port (the node's own stack); with
    /// --take-uplink, default ferry0.
    #[arg(long, value_name = "NAME")]
    pub host_tap: Option<String>,
    /// Move the node's own stack (its addresses, routes and permanent neighbours) from
    /// the uplink onto the host TAP once ferry forwards, so that kubelet, SSH and the
    /// node's established connections keep working, and give it back when the agent
    /// stops without handing over (see docs/agent.md, "Taking the uplink"). Default
    /// base only.
    #[arg(long)]
    pub take_uplink: bool,
    /// At start, remove what kube-proxy and flannel left on the node, as `ferry cleanup`
    /// does (but not CNI configuration files), logging each; off: the agent warns about
    /// the leftovers it sees, and removes nothing.
    #[arg(long)]
    pub cleanup_legacy: bool,
    /// A pod attached to this node: NAMESPACE/NAME=NETNS puts its eth0 (a TAP with its
    /// addresses, MAC and MTU) into network namespace NETNS once the pod is in the
    /// cluster state; repeatable.
    #[arg(long = "pod", value_name = "NS/NAME=NETNS")]
    pub pods: Vec<String>,
    /// External traffic to another node's endpoint leaves with this node's address
    /// instead of keeping the client's (for Services that neither their
    /// ferry.io/external-snat annotation nor the ferry-config ConfigMap decide).
    #[arg(long)]
    pub external_snat: bool,
    /// Leave the host kernel processing what arrives on the uplink as well.
    #[arg(long)]
    pub share_uplink: bool,
    /// Worker threads, 1 to 64, or `auto` for one per core this process may run on (see
    /// docs/agent.md): the uplink gets one AF_PACKET socket per worker in a fanout group,
    /// and each pod's TAP one queue per worker.
    #[arg(long, default_value = "1", value_name = "N|auto", value_parser = crate::node::parse_workers)]
    pub workers: u16,
    /// Pin worker i to the i-th CPU this process may run on (wrapping around).
    #[arg(long)]
    pub pin_workers: bool,
    /// After receiving, a worker polls without sleeping for this many microseconds
    /// (0 to 1000000) before it sleeps again: lower latency, for a core kept busy while
    /// traffic flows (see docs/agent.md). 0: off.
    #[arg(long, default_value = "0", value_name = "MICROSECONDS", value_parser = crate::node::parse_busy_poll)]
    pub busy_poll: u32,
    /// The local API socket (root only), where the CNI plugin asks for pods'
    /// interfaces.
    #[arg(long, value_name = "PATH", default_value = ferry_api::DEFAULT_SOCKET)]
    pub api_socket: PathBuf,
    /// Where the pod interfaces the CNI plugin asked for are recorded, so that a
    /// restarted agent adopts them (see docs/agent.md, "Restarts").
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 0.0.0.0:9250).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Serve kube-proxy's health endpoints, GET /healthz and /livez, at ADDR, which
    /// cloud load balancers check (see docs/agent.md); `off` or empty: nowhere. The
    /// default, [::]:10256, takes IPv4 too (kube-proxy's 0.0.0.0:10256 and [::]:10256).
    #[arg(long, value_name = "ADDR|off", default_value = DEFAULT_HEALTHZ_ADDR)]
    pub healthz_addr: String,
    /// Append a JSON line for each connection NetworkPolicy or ClusterNetworkPolicy
    /// denies on this node to PATH (`-`: standard error); see docs/policy.md. Off by
    /// default.
    #[arg(long, value_name = "PATH|-")]
    pub policy_audit_log: Option<String>,
    /// Lines a second the policy audit log writes at most (1 to 100000), with a burst
    /// of as many; what goes over is counted and summed up in a line.
    #[arg(long, value_name = "N", default_value_t = ferry_agent::policy::audit::DEFAULT_RATE.to_string())]
    pub policy_audit_rate: String,
    /// What this agent does once it has handed the node over to a new agent started
    /// with the same --api-socket (see docs/agent.md, "Restarts and upgrades"): `exit`
    /// at once, or `wait`, holding nothing, until it is stopped (a DaemonSet's old pod
    /// must not end on its own, or it is started again).
    #[arg(long, value_enum, default_value = "exit")]
    pub after_handover: AfterHandoverArg,
    /// How often, in seconds (0.1 to 3600), the connection state is written to the
    /// state directory, for an agent started after a crash to go on with (see
    /// docs/agent.md, "Restarts and upgrades"); `off`: never, and none is read at start.
    #[arg(long, value_name = "SECONDS|off", default_value = "1", value_parser = parse_checkpoint_interval)]
    pub checkpoint_interval: CheckpointInterval,
    /// How a Service spreads new connections over its endpoints (see docs/services.md,
    /// "Choosing an endpoint"): `consistent`, consistent hashing of the flow that every
    /// node and every restart agrees on (rendezvous hashing for up to 64 endpoints, a
    /// Maglev table for more), `maglev`, the same with a Maglev table for any number,
    /// or `random`, a hash keyed anew by each process.
    #[arg(long, value_enum, default_value = "consistent")]
    pub service_balance: ServiceBalanceArg,
    /// The seed of a consistent balance, the same on every node of the cluster: a
    /// number, decimal or 0x-prefixed hexadecimal (64 bits). Default: ferry's own.
    #[arg(long, alias = "maglev-seed", value_name = "N", value_parser = parse_balance_seed)]
    pub balance_seed: Option<u64>,
    /// Proxy only the Services whose `service.kubernetes.io/service-proxy-name` label is
    /// NAME, leaving the others to their proxies; without it, the Services without that
    /// label, as kube-proxy (see docs/services.md).
    #[arg(long, value_name = "NAME", value_parser = parse_service_proxy_name)]
    pub service_proxy_name: Option<String>,
}

/// `--service-balance`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ServiceBalanceArg {
    /// Consistent hashing: rendezvous for small sets, Maglev for large ones.
    Consistent,
    /// Maglev consistent hashing.
    Maglev,
    /// A hash keyed by each process.
    Random,
}

/// `--balance-seed`: a 64-bit number, decimal or 0x-prefixed hexadecimal.
fn parse_balance_seed(s: &str) -> Result<u64, String> {
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed
        .map_err(|_| format!("{s:?}: expected a 64-bit number, decimal or 0x-prefixed hexadecimal"))
}

/// `--service-proxy-name`: a label value, as the API allows one (at most 63
/// characters, alphanumeric at both ends, `-`, `_` and `.` between); not empty, since a
/// Service with an empty value is for no proxy by name.
fn parse_service_proxy_name(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?}: expected a label value: 1 to 63 letters, digits, '-', '_' or '.', a letter or digit at both ends"
        ))
    }
}

/// The tables' `balance` of `--service-balance` and `--balance-seed`; a seed with
/// `random` is an error, as it would change nothing.
fn balance(mode: ServiceBalanceArg, seed: Option<u64>) -> Result<ferry_datapath::BalanceSpec> {
    let mode = match mode {
        ServiceBalanceArg::Consistent => ferry_datapath::BalanceMode::Consistent,
        ServiceBalanceArg::Maglev => ferry_datapath::BalanceMode::Maglev,
        ServiceBalanceArg::Random => {
            if seed.is_some() {
                bail!("--balance-seed: not with --service-balance random, which has no seed");
            }
            ferry_datapath::BalanceMode::Random
        }
    };
    Ok(ferry_datapath::BalanceSpec {
        mode,
        seed: seed.unwrap_or(ferry_datapath::BalanceSpec::default().seed),
    })
}

/// The audit log of `--policy-audit-log` and `--policy-audit-rate`, checked: a rate
/// that is no number of lines a second, or a file that cannot be appended to, is an
/// error now rather than once the agent runs.
fn parse_audit(log: Option<&str>, rate: &str) -> Result<Option<AuditConfig>> {
    let rate = AuditConfig::check_rate(rate).map_err(|e| anyhow!("--policy-audit-rate {e}"))?;
    let Some(log) = log else {
        return Ok(None);
    };
    if log.is_empty() {
        bail!("--policy-audit-log: expected a file's path, or - for standard error");
    }
    let target = Target::parse(log);
    if let Target::File(path) = &target {
        ferry_agent::policy::audit::append(path)
            .map_err(|e| anyhow!("--policy-audit-log {}: {e}", path.display()))?;
    }
    Ok(Some(AuditConfig { target, rate }))
}

/// `--checkpoint-interval`: None for `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointInterval(pub Option<std::time::Duration>);

/// `--checkpoint-interval`: seconds between 0.1 and 3600, or `off`.
fn parse_checkpoint_interval(s: &str) -> Result<CheckpointInterval, String> {
    if s == "off" {
        return Ok(CheckpointInterval(None));
    }
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?}: expected seconds (0.1 to 3600) or off"))?;
    if !(0.1..=3600.0).contains(&secs) {
        return Err(format!("{s}: between 0.1 and 3600 seconds, or off"));
    }
    Ok(CheckpointInterval(Some(
        std::time::Duration::from_secs_f64(secs),
    )))
}

/// `--after-handover`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AfterHandoverArg {
    /// Exit at once.
    Exit,
    /// Hold nothing and wait to be stopped.
    Wait,
}

/// The default `--healthz-addr`: kube-proxy's health port on every address.
pub const DEFAULT_HEALTHZ_ADDR: &str = "[::]:10256";

/// The address of `--healthz-addr SPEC`; None for `off` or empty.
fn parse_healthz_addr(spec: &str) -> Result<Option<std::net::SocketAddr>> {
    match spec {
        "" | "off" => Ok(None),
        _ => spec.parse().map(Some).map_err(|_| {
            anyhow!(
                "--healthz-addr {spec:?}: expected ADDR:PORT ([::]:10256, 0.0.0.0:10256) or off"
            )
        }),
    }
}

fn parse_pod(spec: &str) -> Result<(ObjectKey, String)> {
    let bad = || anyhow!("--pod {spec:?}: expected NAMESPACE/NAME=NETNS");
    let (pod, netns) = spec.split_once('=').ok_or_else(bad)?;
    let (ns, name) = pod.split_once('/').ok_or_else(bad)?;
    if ns.is_empty() || name.is_empty() || netns.is_empty() || name.contains('/') {
        return Err(bad());
    }
    Ok((ObjectKey::new(ns, name), netns.to_string()))
}

/// Runs the agent until SIGINT, SIGTERM, SIGHUP or SIGQUIT.
pub fn run(args: &Args) -> Result<()> {
    if std::env::var_os(handover::HANDED_OVER_ENV).is_some() {
        let stop = ferry_linux::signal::stop_on_signals().context("installing signal handlers")?;
        handover::wait_handed_over(stop);
    }
    tracing::info!(build = %ferry_agent::build::info().line(), "agent starting");
    if args.cleanup_legacy {
        crate::cleanup::at_agent_start();
    }
    let mut pods = BTreeMap::new();
    for p in &args.pods {
        let (k, netns) = parse_pod(p)?;
        if pods.insert(k.clone(), netns).is_some() {
            bail!("--pod: {k} is given twice");
        }
    }
    let base = args.base.as_deref().map(read_tables_spec).transpose()?;
    let agent = Options {
        node: args.node.clone(),
        base,
        uplink: args.uplink.clone(),
        host_tap: args.host_tap.clone(),
        take_uplink: args.take_uplink,
        pods,
        share_uplink: args.share_uplink,
        workers: crate::node::workers(args.workers, args.pin_workers, args.busy_poll)?,
        compile: CompileOptions {
            external_snat: args.external_snat,
            base_file: args.base.as_ref().map(|b| b.display().to_string()),
            balance: balance(args.service_balance, args.balance_seed)?,
            service_proxy_name: args.service_proxy_name.clone(),
            ..CompileOptions::default()
        },
        state_dir: Some(args.state_dir.clone()),
        del_queue: Some(ferry_api::del_queue_dir(&args.api_socket)),
        healthz: parse_healthz_addr(&args.healthz_addr)?,
        audit: parse_audit(args.policy_audit_log.as_deref(), &args.policy_audit_rate)?,
        checkpoint_every: args.checkpoint_interval.0,
    };
    let stop = ferry_linux::signal::stop_on_signals().context("installing signal handlers")?;
    let datastore = Source::parse(&args.datastore)
        .map_err(|e| anyhow!("--datastore {:?}: {e}", args.datastore))?;
    let settings = Settings {
        agent,
        datastore,
        api_socket: args.api_socket.clone(),
        metrics_addr: args.metrics_addr,
        after_handover: match args.after_handover {
            AfterHandoverArg::Exit => AfterHandover::Exit,
            AfterHandoverArg::Wait => AfterHandover::Wait,
        },
    };
    control_loop::run(settings, stop).map_err(|e| match e {
        Error::Datastore(OpenError::Kube(e)) => anyhow!("--datastore {}: {e}", args.datastore),
        Error::ApiSocket(e) => anyhow!("--api-socket {}: {e}", args.api_socket.display()),
        Error::Metrics(addr, e) => anyhow!("--metrics-addr {addr}: {e}"),
        e => anyhow!("{e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_intervals_parse_or_say_what_is_wrong() {
        use std::time::Duration;
        assert_eq!(
            parse_checkpoint_interval("0.25").unwrap().0,
            Some(Duration::from_millis(250))
        );
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            agent: Args,
        }
        let parse = |extra: &[&str]| {
            let mut argv = vec!["ferry", "--node", "n", "--datastore", "file:/nowhere"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv)
                .unwrap()
                .agent
                .checkpoint_interval
                .0
        };
        assert_eq!(parse(&[]), Some(Duration::from_secs(1)), "the default");
        assert_eq!(parse(&["--checkpoint-interval", "off"]), None);
        assert_eq!(
            parse(&["--checkpoint-interval", "2"]),
            Some(Duration::from_secs(2))
        );
        for bad in ["0", "0.01", "7200", "-1", "soon", "NaN", ""] {
            let e = parse_checkpoint_interval(bad).unwrap_err();
            assert!(e.contains("off"), "{bad}: {e}");
        }
    }

    #[test]
    fn service_proxy_name_is_a_label_value() {
        for good in ["ferry", "a", "my-proxy.v2_x", &"x".repeat(63)] {
            assert_eq!(parse_service_proxy_name(good).as_deref(), Ok(good));
        }
        for bad in ["", "-ferry", "ferry.", "two words", "a/b", &"x".repeat(64)] {
            let e = parse_service_proxy_name(bad).unwrap_err();
            assert!(e.contains("label value"), "{bad}: {e}");
        }
    }

    #[test]
    fn service_balance_and_balance_seed_parse_or_say_what_is_wrong() {
        use ferry_datapath::{BalanceMode, BalanceSpec};
        assert_eq!(parse_balance_seed("42"), Ok(42));
        assert_eq!(parse_balance_seed("0x2a"), Ok(42));
        assert_eq!(parse_balance_seed("0XFFFFFFFFFFFFFFFF"), Ok(u64::MAX));
        for bad in ["", "-1", "0x", "0x1ffffffffffffffff", "seed", "1e3"] {
            let e = parse_balance_seed(bad).unwrap_err();
            assert!(e.contains("64-bit number"), "{bad}: {e}");
        }
        assert_eq!(
            balance(ServiceBalanceArg::Consistent, None).unwrap(),
            BalanceSpec::default()
        );
        let b = balance(ServiceBalanceArg::Maglev, Some(7)).unwrap();
        assert_eq!((b.mode, b.seed), (BalanceMode::Maglev, 7));
        assert_eq!(
            balance(ServiceBalanceArg::Random, None).unwrap().mode,
            BalanceMode::Random
        );
        let e = balance(ServiceBalanceArg::Random, Some(7)).unwrap_err();
        assert!(e.to_string().contains("--balance-seed"), "{e}");
        // The flag's old name still parses.
        let cli = <crate::Cli as clap::Parser>::try_parse_from([
            "ferry",
            "agent",
            "--node",
            "node1",
            "--datastore",
            "file:/nonexistent",
            "--maglev-seed",
            "0x2a",
        ]);
        match cli.map(|c| c.command) {
            Ok(crate::Command::Agent(a)) => assert_eq!(a.balance_seed, Some(42)),
            Ok(_) => panic!("not the agent's arguments"),
            Err(e) => panic!("{e}"),
        }
    }

    /// The agent's command line in deploy/ferry.yaml is one this build takes.
    #[test]
    fn the_manifests_agent_arguments_parse() {
        let text = include_str!("../../../deploy/ferry.yaml");
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(text).unwrap();
        let ds = docs
            .iter()
            .find(|d| d["kind"] == "DaemonSet")
            .expect("a DaemonSet");
        let agent = &ds["spec"]["template"]["spec"]["containers"][0];
        let argv: Vec<String> = agent["command"]
            .as_array()
            .unwrap()
            .iter()
            .chain(agent["args"].as_array().unwrap())
            .map(|a| a.as_str().unwrap().replace("$(NODE_NAME)", "node1"))
            .collect();
        assert_eq!(argv[0], "ferry");
        let cli =
            <crate::Cli as clap::Parser>::try_parse_from(&argv).unwrap_or_else(|e| panic!("{e}"));
        let crate::Command::Agent(a) = cli.command else {
            panic!("not the agent's arguments: {argv:?}");
        };
        assert!(a.take_uplink && a.uplink.is_none());
        assert_eq!(a.after_handover, AfterHandoverArg::Wait);
        assert_eq!(a.metrics_addr.map(|m| m.port()), Some(9250));
        assert_eq!(
            parse_healthz_addr(&a.healthz_addr)
                .unwrap()
                .map(|h| h.port()),
            Some(10256)
        );
    }

    #[test]
    fn pod_attachments_parse_or_say_what_is_wrong() {
        assert_eq!(
            parse_pod("default/web-1=pod1").unwrap(),
            (ObjectKey::new("default", "web-1"), "pod1".into())
        );
        for bad in [
            "web-1=pod1",
            "default/web-1",
            "/web=x",
            "default/=x",
            "a/b/c=x",
            "a/b=",
        ] {
            let e = parse_pod(bad).unwrap_err().to_string();
            assert!(e.contains("NAMESPACE/NAME=NETNS"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_audit_log_flags_are_checked_before_the_agent_starts() {
        assert_eq!(parse_audit(None, "100").unwrap(), None);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let cfg = parse_audit(Some(path.to_str().unwrap()), "5")
            .unwrap()
            .unwrap();
        assert_eq!(cfg.target, Target::File(path.clone()));
        assert_eq!(cfg.rate, 5);
        assert!(path.exists(), "made, to be appended to");
        assert_eq!(
            parse_audit(Some("-"), "100").unwrap().unwrap().target,
            Target::Stderr
        );
        for rate in ["0", "lots", "-3"] {
            let e = parse_audit(Some("-"), rate).unwrap_err().to_string();
            assert!(e.starts_with("--policy-audit-rate"), "{rate}: {e}");
            assert!(e.contains("1 to 100000"), "{rate}: {e}");
        }
        let e = parse_audit(None, "0").unwrap_err().to_string();
        assert!(
            e.contains("--policy-audit-rate"),
            "checked when off too: {e}"
        );
        let missing = dir.path().join("no/such/dir/audit.log");
        let e = parse_audit(Some(missing.to_str().unwrap()), "100")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--policy-audit-log"), "{e}");
        assert!(e.contains("No such file or directory"), "{e}");
        assert!(parse_audit(Some(""), "100").is_err());
    }

    #[test]
    fn the_healthz_address_is_an_address_and_port_or_off() {
        assert_eq!(
            parse_healthz_addr(DEFAULT_HEALTHZ_ADDR).unwrap(),
            Some("[::]:10256".parse().unwrap())
        );
        assert_eq!(
            parse_healthz_addr("0.0.0.0:10256").unwrap(),
            Some("0.0.0.0:10256".parse().unwrap())
        );
        assert_eq!(parse_healthz_addr("off").unwrap(), None);
        assert_eq!(parse_healthz_addr("").unwrap(), None);
        for bad in ["10256", "0.0.0.0", "localhost:10256", "on"] {
            let e = parse_healthz_addr(bad).unwrap_err().to_string();
            assert!(e.contains("--healthz-addr"), "{bad}: {e}");
        }
    }
}
