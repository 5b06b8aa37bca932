//! The `ferry` command.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod agent;
mod ask;
mod capture;
mod cleanup;
mod conntrack;
mod demo;
mod lab;
mod node;
mod output;
mod pcap;
mod policy;
mod replay;
mod serve;
mod services;
mod status;
mod tables;
mod trace;

/// ferry: a Kubernetes node network dataplane.
#[derive(Parser)]
#[command(name = "ferry", version, about, long_about = None)]
struct Cli {
    /// Log format on stderr: `text` (human-readable) or `json` (one object per line).
    /// The level is set with RUST_LOG (default info).
    #[arg(long, global = true, value_name = "FORMAT", default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => b.init(),
        LogFormat::Json => b.json().init(),
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run pcap input through one node's pipeline, offline; write pcap output per port and
    /// a JSON-lines verdict per input packet.
    Replay(replay::Args),
    /// Run one node's dataplane on real interfaces until SIGINT, SIGTERM, SIGHUP or SIGQUIT.
    Node(node::Args),
    /// Run one node of a cluster: its tables compiled from cluster state and swapped
    /// into the running dataplane as the cluster changes.
    Agent(Box<agent::Args>),
    /// A shell completion script for SHELL, on standard output (e.g. `ferry completions
    /// bash > /etc/bash_completion.d/ferry`).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Manual pages made from the command line's definition: ferry(1) on standard
    /// output, or with --dir ferry.1 and ferry-COMMAND.1 for every command written there.
    Man {
        /// Write every page into this directory (made if missing).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Remove what kube-proxy and flannel left on this node (iptables chains of both
    /// back ends, nftables tables, kube-ipvs0, flannel.N, cni0, flannel's CNI
    /// configuration), listing each; --dry-run only lists.
    Cleanup(cleanup::Args),
    /// The running agent's health and counters: datastore, table sync latency, errors,
    /// ports, drops by reason, conntrack, fragments, Services (asked over its local API
    /// socket).
    Status(status::Args),
    /// The running agent's connection table: list or delete connections, like
    /// `conntrack -L` / `conntrack -D`.
    Conntrack(conntrack::Args),
    /// The Services of the running agent's tables: frontends, traffic policies,
    /// affinity, endpoints, and connections tracked.
    Services(services::Args),
    /// What the running node does with a packet, stage by stage: a described packet or
    /// the frames of a pcap traced on a copy of the node's live state (nothing is sent),
    /// or, with --live, the next real packets that match a filter.
    Trace(trace::Args),
    /// The NetworkPolicies and ClusterNetworkPolicies the running agent enforces, and
    /// the rules that apply to one pod, resolved to addresses and ports.
    Policy(policy::Args),
    /// Write the frames of one port, as received and as ferry sent them, to a pcapng
    /// file.
    Capture(capture::Args),
    /// Test servers for lab pods, like agnhost netexec: HTTP /hostname, /clientip,
    /// /echo?msg=, /bytes?n= and UDP echo.
    Serve(serve::Args),
    /// A multi-node cluster in network namespaces: up, down, status, exec, check, demo.
    Lab(lab::Args),
    /// Compile one node's tables from a directory of Kubernetes manifests and print
    /// them (YAML) on stdout.
    Tables(tables::Args),
    /// This build: its version, the commit it was built from, its profile, target and
    /// compiler.
    Version,
    /// The built-in replay demo: fragments reassembled, forwarded and refragmented, a
    /// coalesced TCP packet segmented, path MTU discovery, refused attacks.
    Demo {
        /// Keep the demo's tables, input and output here instead of a temporary directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// `ferry version`'s lines.
fn version_text(b: &ferry_api::BuildInfo) -> String {
    format!(
        "ferry {}\ncommit {}{}\nbuild {}, {}, rustc {}\n",
        b.version,
        b.commit,
        if b.dirty {
            " (with uncommitted changes)"
        } else {
            ""
        },
        b.profile,
        b.target,
        b.rustc
    )
}

/// `ferry man`: ferry(1) on standard output, or every page into `dir`.
fn man(dir: Option<PathBuf>) -> anyhow::Result<()> {
    use anyhow::Context;
    let cmd = <Cli as clap::CommandFactory>::command();
    match dir {
        None => clap_mangen::Man::new(cmd)
            .render(&mut std::io::stdout())
            .context("writing the page"),
        Some(d) => {
            std::fs::create_dir_all(&d).with_context(|| format!("{}", d.display()))?;
            clap_mangen::generate_to(cmd, &d).with_context(|| format!("{}", d.display()))?;
            eprintln!("manual pages written to {}", d.display());
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(cli.log_format);
    let r = match cli.command {
        Command::Replay(args) => replay::run(&args).map(|s| {
            print!("{}", s.render());
        }),
        Command::Demo { dir } => demo::run(dir),
        Command::Version => {
            print!("{}", version_text(&ferry_agent::build::info()));
            Ok(())
        }
        Command::Node(args) => node::run(&args),
        Command::Agent(args) => agent::run(&args),
        Command::Cleanup(args) => cleanup::run(&args),
        Command::Completions { shell } => {
            use std::io::Write;
            let mut cmd = <Cli as clap::CommandFactory>::command();
            // Made whole first: written straight to a pipe closed early, it would panic.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "ferry", &mut script);
            std::io::stdout()
                .write_all(&script)
                .map_err(anyhow::Error::from)
        }
        Command::Man { dir } => man(dir),
        Command::Serve(args) => serve::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Trace(args) => trace::run(&args),
        Command::Capture(args) => capture::run(&args),
        Command::Conntrack(args) => conntrack::run(&args),
        Command::Services(args) => services::run(&args),
        Command::Policy(args) => policy::run(&args),
        Command::Tables(args) => tables::run(&args),
        Command::Lab(args) => lab::run(args),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_names_the_commit_and_says_when_the_tree_had_changes() {
        let mut b = ferry_api::BuildInfo {
            version: "1.2.3".into(),
            commit: "ab".repeat(20),
            dirty: false,
            profile: "release".into(),
            target: "x86_64-unknown-linux-gnu".into(),
            rustc: "1.95.0".into(),
        };
        assert_eq!(
            version_text(&b),
            format!(
                "ferry 1.2.3\ncommit {}\nbuild release, x86_64-unknown-linux-gnu, rustc 1.95.0\n",
                "ab".repeat(20)
            )
        );
        b.dirty = true;
        assert!(version_text(&b).contains(" (with uncommitted changes)\n"));
    }
}
