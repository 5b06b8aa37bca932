//! `ferry lab`: the command line of `ferry-lab` (docs/lab.md).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Result, bail};
use ferry_lab::{Binaries, DEFAULT_DIR, DEFAULT_PREFIX, Plan, check, lb, probe, topology};

/// Arguments of `ferry lab`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The lab's directory: its state, manifests, logs and sockets.
    #[arg(long, global = true, default_value = DEFAULT_DIR)]
    dir: PathBuf,
    #[command(subcommand)]
    command: Sub,
}

/// The shape of a new lab.
#[derive(clap::Args, Debug)]
struct Shape {
    /// Nodes (2-9).
    #[arg(long, default_value_t = 3)]
    nodes: u8,
    /// Zones, each its own subnet (1-4, no more than nodes).
    #[arg(long, default_value_t = 2)]
    zones: u8,
    /// The prefix of every namespace's name.
    #[arg(long, default_value = DEFAULT_PREFIX)]
    prefix: String,
    /// The CNI plugin (default: ferry-cni next to ferry).
    #[arg(long)]
    cni_bin: Option<PathBuf>,
}

#[derive(clap::Subcommand, Debug)]
enum Sub {
    /// Build the lab: fabric, nodes with agents, pods through ferry-cni, client, load
    /// balancer.
    Up(Shape),
    /// Remove everything the lab made, also after a crash.
    Down {
        /// The prefix to clean up when the state is lost.
        #[arg(long, default_value = DEFAULT_PREFIX)]
        prefix: String,
    },
    /// Nodes, pods, processes, the load balancer's healthy nodes.
    Status,
    /// Run a command in a node (node1), a pod (web), client, lb or fabric.
    Exec {
        /// Where.
        target: String,
        /// The command.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Run every scenario; exits non-zero when one fails.
    Check,
    /// Up, check, down.
    Demo(Shape),
    /// The load balancer's health checker (started by `up` in the lb namespace).
    #[command(hide = true)]
    LbHealth,
    /// UDP probes the checks run inside namespaces.
    #[command(hide = true)]
    ProbeUdp {
        /// Datagram sizes to have echoed, comma-separated.
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<usize>,
        /// A question to ask (hostname, clientip).
        #[arg(long)]
        ask: Option<String>,
        /// Ask `hostname` for this many seconds; print each new answer, then the longest
        /// silence in ms.
        #[arg(long)]
        stream: Option<u64>,
        /// The server.
        to: SocketAddr,
    },
}

fn plan(s: &Shape) -> Result<(Plan, Binaries)> {
    Ok((
        Plan::new(&s.prefix, s.nodes, s.zones)?,
        Binaries::current(s.cni_bin.clone())?,
    ))
}

/// Runs `ferry lab`.
pub fn run(args: Args) -> Result<()> {
    let dir = &args.dir;
    match args.command {
        Sub::Up(s) => {
            let (p, b) = plan(&s)?;
            if let Err(e) = topology::up(&p, dir, &b) {
                eprintln!("ferry lab: up failed, removing what it made");
                let _ = topology::down(dir, &p.prefix);
                return Err(e);
            }
            print!("{}", topology::status(dir)?);
        }
        Sub::Down { prefix } => topology::down(dir, &prefix)?,
        Sub::Status => print!("{}", topology::status(dir)?),
        Sub::Exec { target, cmd } => {
            let code = topology::exec(dir, &target, &cmd)?;
            if code != 0 {
                std::process::exit(code);
            }
        }
        Sub::Check => {
            if !check::run(dir, &mut std::io::stdout())? {
                bail!("some scenarios failed");
            }
        }
        Sub::Demo(s) => {
            let (p, b) = plan(&s)?;
            if !ferry_lab::demo(&p, dir, &b)? {
                bail!("some scenarios failed");
            }
        }
        Sub::LbHealth => {
            let state = ferry_lab::State::load(dir)?;
            lb::health_loop(&state.plan, dir)?;
        }
        Sub::ProbeUdp {
            sizes,
            ask,
            stream,
            to,
        } => {
            if let Some(q) = ask {
                println!("{}", probe::ask(to, &q)?);
            } else if let Some(secs) = stream {
                let (answers, gap) = probe::stream(to, secs)?;
                for a in answers {
                    println!("{a}");
                }
                println!("{}", gap.as_millis());
            } else {
                probe::echo(to, &sizes)?;
            }
        }
    }
    Ok(())
}
