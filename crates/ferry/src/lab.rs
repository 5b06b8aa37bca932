//! `ferry lab`: the command line of `ferry-lab` (docs/lab.md).

use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ferry_lab::state::{DEFAULT_NAMESPACE, Served};
use ferry_lab::topology::NewPod;
use ferry_lab::{
    Binaries, DEFAULT_DIR, DEFAULT_PREFIX, Plan, check, download, lb, manifests, matrix, netpol,
    pods, probe, restart, topology,
};

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
    /// Run a command in a node (node1), a pod (web), client, client2, lb or fabric.
    Exec {
        /// Where.
        target: String,
        /// The command.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Run every scenario of a suite; exits non-zero when one fails.
    Check {
        /// `default`: the connectivity scenarios; `netpol`: the Kubernetes NetworkPolicy
        /// e2e cases (namespaces x, y, z with pods a, b, c); `services`: the scenarios of
        /// the Kubernetes e2e Service tests (namespace svc).
        #[arg(long, value_enum, default_value = "default")]
        suite: Suite,
        /// Only the cases whose name contains this (netpol, services).
        #[arg(long)]
        case: Option<String>,
        /// List the cases and what each checks, without running them (netpol, services;
        /// no lab needed).
        #[arg(long)]
        list: bool,
    },
    /// Pods on a running lab: add (through ferry-cni, with labels and served ports) or
    /// delete.
    Pod {
        #[command(subcommand)]
        command: PodSub,
    },
    /// Namespaces on a running lab, with labels.
    Ns {
        #[command(subcommand)]
        command: NsSub,
    },
    /// Copy a file of manifests into the lab's manifest directory (again: replace it).
    Apply {
        /// The file: YAML documents, Kubernetes objects.
        file: PathBuf,
    },
    /// Remove the manifests `apply FILE` copied.
    Delete {
        /// The file, as given to apply.
        file: PathBuf,
    },
    /// Restart a node's agent as an update does (the new agent takes the node over from
    /// the running one), or as a crash does (--kill), with the command `up` started it with; print the old and
    /// new pid and how long until the new agent forwarded.
    Restart {
        /// The node: node1, or 1.
        node: String,
        /// Kill the old agent (SIGKILL), as a crash would.
        #[arg(long)]
        kill: bool,
        /// With --kill: remove its checkpoint too, so that the new agent starts with no
        /// connection state (connections go on by TCP pickup and Maglev alone).
        #[arg(long, requires = "kill")]
        without_checkpoint: bool,
    },
    /// Up, check, down.
    Demo(Shape),
    /// The load balancer's health checker (started by `up` in the lb namespace).
    #[command(hide = true)]
    LbHealth,
    /// A TCP server that sends each client an out-of-window segment and counts the
    /// resets that come back, as JSON when it ends (the services suite's INVALID case).
    #[command(hide = true)]
    BoomServer {
        /// Its port.
        #[arg(long, default_value_t = 9000)]
        port: u16,
        /// How long it runs, in seconds.
        #[arg(long, default_value_t = 10)]
        secs: u64,
    },
    /// Probes of a matrix's row, run in the source pod's namespace.
    #[command(hide = true)]
    ProbeMatrix {
        /// A destination, NAME=ADDRESS (its servers answer NAME).
        #[arg(long = "target")]
        targets: Vec<String>,
        /// A port, tcp/80 or udp/81.
        #[arg(long = "port")]
        ports: Vec<Served>,
    },
    /// A paced download the restart checks run inside namespaces: `connected SERVER`,
    /// then what it got as JSON.
    #[command(hide = true)]
    ProbeDownload {
        /// Bytes to download.
        #[arg(long)]
        bytes: u64,
        /// Bytes per second.
        #[arg(long)]
        rate: u64,
        /// The server.
        to: SocketAddr,
    },
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
        /// Send this many numbered datagrams, one every --interval-ms, and print what
        /// came back as JSON.
        #[arg(long)]
        flow: Option<u32>,
        /// The interval of --flow, in ms.
        #[arg(long, default_value_t = 20)]
        interval_ms: u64,
        /// Ask `hostname` every this many ms until standard input closes; print
        /// `sending`, then the Unix time in microseconds of each answer.
        #[arg(long)]
        watch: Option<u64>,
        /// The server.
        to: SocketAddr,
    },
}

/// The suites of `ferry lab check`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Suite {
    /// The connectivity scenarios.
    Default,
    /// The Kubernetes NetworkPolicy e2e cases.
    Netpol,
    /// The Kubernetes e2e Service scenarios.
    Services,
}

#[derive(clap::Subcommand, Debug)]
enum PodSub {
    /// Make a pod through the CNI plugin, with its servers and its manifest.
    Add {
        /// Its node's number (1 for node1).
        #[arg(long)]
        node: u8,
        /// Its namespace (a Namespace manifest is written when it is new).
        #[arg(long, default_value = DEFAULT_NAMESPACE)]
        namespace: String,
        /// Its name.
        #[arg(long)]
        name: String,
        /// A label, KEY=VALUE (repeat for more).
        #[arg(long = "label")]
        labels: Vec<String>,
        /// A port its servers answer on, tcp/80 or udp/81 (repeat for more; none: HTTP
        /// on 8080 and UDP echo on 8081). Named serve-80-tcp in its manifest.
        #[arg(long = "serve")]
        serves: Vec<Served>,
    },
    /// Remove a pod: CNI DEL, its servers, its namespace, its manifest.
    Del {
        /// Its namespace.
        #[arg(long, default_value = DEFAULT_NAMESPACE)]
        namespace: String,
        /// Its name.
        #[arg(long)]
        name: String,
    },
}

#[derive(clap::Subcommand, Debug)]
enum NsSub {
    /// Write a Namespace with labels (again: its labels replaced).
    Add {
        /// Its name.
        name: String,
        /// A label, KEY=VALUE (repeat for more); kubernetes.io/metadata.name is set.
        #[arg(long = "label")]
        labels: Vec<String>,
    },
}

fn plan(s: &Shape) -> Result<(Plan, Binaries)> {
    Ok((
        Plan::new(&s.prefix, s.nodes, s.zones)?,
        Binaries::current(s.cni_bin.clone())?,
    ))
}

/// `probe-udp --watch`: until its standard input closes (the lab's end of it dropped,
/// or the lab gone).
fn watch_until_stdin_closes(to: SocketAddr, every: Duration) -> Result<()> {
    let closed = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&closed);
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while std::io::stdin().read(&mut buf).is_ok_and(|n| n > 0) {}
        flag.store(true, Ordering::Relaxed);
    });
    probe::watch(to, every, &mut std::io::stdout(), &|| {
        closed.load(Ordering::Relaxed)
    })
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
        Sub::Check { suite, case, list } => {
            let out = &mut std::io::stdout();
            if matches!(suite, Suite::Default) && (case.is_some() || list) {
                bail!(
                    "--case and --list are for --suite netpol and services; the default suite runs whole"
                );
            }
            let only = case.as_deref();
            if list {
                match suite {
                    Suite::Services => check::services::list(only, out)?,
                    _ => netpol::list(only, out)?,
                }
                return Ok(());
            }
            let ok = match suite {
                Suite::Default => check::run(dir, out)?,
                Suite::Netpol => netpol::run(dir, only, out)?,
                Suite::Services => check::services::run(dir, only, out)?,
            };
            if !ok {
                bail!("some scenarios failed");
            }
        }
        Sub::Pod { command } => match command {
            PodSub::Add {
                node,
                namespace,
                name,
                labels,
                serves,
            } => {
                let spec = NewPod {
                    namespace,
                    name,
                    node,
                    labels: pods::parse_labels(&labels)?,
                    serves,
                };
                pods::pod_add(dir, &spec)?;
                let state = ferry_lab::State::load(dir)?;
                let p = state.pod(&format!("{}/{}", spec.namespace, spec.name))?;
                println!("pod {} node{}  {}", p.id(), p.node, p.ips.join(", "));
            }
            PodSub::Del { namespace, name } => {
                pods::pod_del(dir, &format!("{namespace}/{name}"))?;
            }
        },
        Sub::Ns {
            command: NsSub::Add { name, labels },
        } => pods::ns_add(dir, &name, pods::parse_labels(&labels)?)?,
        Sub::Apply { file } => {
            for o in manifests::apply(dir, &file)? {
                println!("{o} applied");
            }
        }
        Sub::Delete { file } => manifests::delete(dir, &file)?,
        Sub::ProbeMatrix { targets, ports } => {
            let targets = targets
                .iter()
                .map(|t| {
                    let (name, ip) = t.split_once('=').context("a target is NAME=ADDRESS")?;
                    let ip: IpAddr = ip.parse().with_context(|| format!("target {t}"))?;
                    Ok((name.to_string(), ip))
                })
                .collect::<Result<Vec<_>>>()?;
            print!(
                "{}",
                matrix::print_answers(&matrix::probe_here(&targets, &ports))
            );
        }
        Sub::Restart {
            node,
            kill,
            without_checkpoint,
        } => {
            let state = ferry_lab::State::load(dir)?;
            let n = restart::parse_node(&state, &node)?;
            let how = match (kill, without_checkpoint) {
                (true, true) => restart::How::Cold,
                (true, false) => restart::How::Kill,
                (false, _) => restart::How::Update,
            };
            println!("{}", restart::restart(dir, n, how)?);
        }
        Sub::ProbeDownload { bytes, rate, to } => {
            let got = download::download(to, bytes, rate, &mut std::io::stdout());
            println!("{}", serde_json::to_string(&got)?);
        }
        Sub::Demo(s) => {
            let (p, b) = plan(&s)?;
            if !ferry_lab::demo(&p, dir, &b)? {
                bail!("some scenarios failed");
            }
        }
        Sub::BoomServer { port, secs } => {
            println!(
                "{}",
                serde_json::to_string(&ferry_lab::boom::serve(port, secs)?)?
            );
        }
        Sub::LbHealth => {
            let state = ferry_lab::State::load(dir)?;
            lb::health_loop(&state.plan, dir)?;
        }
        Sub::ProbeUdp {
            sizes,
            ask,
            stream,
            flow,
            interval_ms,
            watch,
            to,
        } => {
            let every = Duration::from_millis(interval_ms.max(1));
            if let Some(q) = ask {
                println!("{}", probe::ask(to, &q)?);
            } else if let Some(count) = flow {
                println!(
                    "{}",
                    serde_json::to_string(&probe::flow(to, count, every)?)?
                );
            } else if let Some(ms) = watch {
                watch_until_stdin_closes(to, Duration::from_millis(ms.max(1)))?;
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
