//! The `ferry` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod demo;
mod node;
mod pcap;
mod replay;
mod tables;

/// ferry: a Kubernetes node network dataplane.
#[derive(Parser)]
#[command(name = "ferry", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run pcap input through one node's pipeline, offline; write pcap output per port and
    /// a JSON-lines verdict per input packet.
    Replay(replay::Args),
    /// Run one node's dataplane on real interfaces until SIGINT or SIGTERM.
    Node(node::Args),
    /// Compile one node's tables from a directory of Kubernetes manifests and print
    /// them (YAML) on stdout.
    Tables(tables::Args),
    /// The built-in replay demo: fragments reassembled, forwarded and refragmented, a
    /// coalesced TCP packet segmented, path MTU discovery, refused attacks.
    Demo {
        /// Keep the demo's tables, input and output here instead of a temporary directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Replay(args) => replay::run(&args).map(|s| {
            print!("{}", s.render());
        }),
        Command::Demo { dir } => demo::run(dir),
        Command::Node(args) => node::run(&args),
        Command::Tables(args) => tables::run(&args),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry: {e:#}");
            ExitCode::FAILURE
        }
    }
}
