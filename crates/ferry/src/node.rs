//! `ferry node`: one node's dataplane on real interfaces. The node tables say what the
//! ports are; `--attach` says which Linux device each one is; the worker loop moves
//! frames between them through the pipeline until SIGINT, SIGTERM, SIGHUP or SIGQUIT,
//! then removes every device, socket and filter it made.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use ferry_datapath::{Pipeline, PortKind, Tables};
use ferry_linux::link;
use ferry_linux::worker::{Control, NamedPort};
use ferry_linux::{AfPacketConfig, AfPacketPort, Port, TapPort};

use crate::replay::load_tables;

/// Arguments of `ferry node`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The node tables (YAML; see docs/tables.md).
    #[arg(long, value_name = "FILE")]
    pub tables: PathBuf,
    /// Attaches a port of the tables to Linux. `PORT=af-packet:IFNAME`: the node's NIC,
    /// read and written through an AF_PACKET ring, with the host kernel kept off it.
    /// `PORT=pod:NETNS`: a TAP moved into the pod's network namespace as eth0, with the
    /// port's pod addresses, MAC and MTU and default routes through 169.254.1.1 and
    /// fe80::1. `PORT=tap:NAME`: a TAP named NAME left in this namespace (e.g. a `kind: host` port
    /// for the node's own stack, see docs/node.md). Every port of
    /// the tables needs one.
    #[arg(long = "attach", value_name = "PORT=KIND:ARG", required = true)]
    pub attach: Vec<String>,
    /// Leave the host kernel processing what arrives on af-packet ports as well.
    #[arg(long)]
    pub share_uplink: bool,
    /// Worker threads, 1 to 64, or `auto` for one per core this process may run on
    /// (see docs/node.md): each af-packet port gets one socket per worker in a fanout
    /// group, and each pod's TAP one queue per worker.
    #[arg(long, default_value = "1", value_name = "N|auto", value_parser = parse_workers)]
    pub workers: u16,
    /// Pin worker i to the i-th CPU this process may run on (wrapping around).
    #[arg(long)]
    pub pin_workers: bool,
    /// After receiving, a worker polls without sleeping for this many microseconds
    /// (0 to 1000000) before it sleeps again: lower latency, for a core kept busy while
    /// traffic flows (see docs/node.md, "Busy polling"). 0: off.
    #[arg(long, default_value = "0", value_name = "MICROSECONDS", value_parser = parse_busy_poll)]
    pub busy_poll: u32,
}

/// The workers of `--workers N`, `--pin-workers` and `--busy-poll`: pinned to the CPUs
/// this process may run on, in order, when `pin`.
pub fn workers(count: u16, pin: bool, busy_poll_us: u32) -> Result<ferry_linux::worker::Workers> {
    let cpus = if pin {
        ferry_linux::cpu::allowed().context("--pin-workers: reading this process's CPUs")?
    } else {
        Vec::new()
    };
    Ok(ferry_linux::worker::Workers {
        count: usize::from(count),
        cpus,
        busy_poll: std::time::Duration::from_micros(u64::from(busy_poll_us)),
    })
}

/// `--busy-poll`: microseconds from 0 to [`ferry_linux::worker::MAX_BUSY_POLL`].
pub fn parse_busy_poll(s: &str) -> Result<u32, String> {
    let max = ferry_linux::worker::MAX_BUSY_POLL.as_micros();
    match s.parse::<u32>() {
        Ok(n) if u128::from(n) <= max => Ok(n),
        _ => Err(format!("{s:?}: expected microseconds from 0 to {max}")),
    }
}

/// `--workers`: a count from 1 to [`ferry_linux::worker::MAX_WORKERS`], or `auto` for
/// one per core this process may run on (at most the maximum).
pub fn parse_workers(s: &str) -> Result<u16, String> {
    let max = ferry_linux::worker::MAX_WORKERS;
    let n = match s {
        "auto" => std::thread::available_parallelism()
            .map_err(|e| format!("the number of cores is unknown ({e}): give a number"))?
            .get()
            .min(max),
        _ => s
            .parse::<usize>()
            .map_err(|_| format!("{s:?}: expected a number from 1 to {max}, or auto"))?,
    };
    if !(1..=max).contains(&n) {
        return Err(format!("{n}: expected a number from 1 to {max}, or auto"));
    }
    Ok(n as u16)
}

/// How one port meets Linux.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Attach {
    AfPacket(String),
    Pod(String),
    Tap(String),
}

fn parse_attach(spec: &str) -> Result<(String, Attach)> {
    let (port, what) = spec
        .split_once('=')
        .with_context(|| format!("--attach {spec:?}: expected PORT=KIND:ARG"))?;
    let (kind, arg) = what
        .split_once(':')
        .with_context(|| format!("--attach {spec:?}: expected KIND:ARG after '=' (af-packet:IFNAME, pod:NETNS or tap:NAME)"))?;
    if arg.is_empty() {
        bail!("--attach {spec:?}: {kind} needs a name after ':'");
    }
    let a = match kind {
        "af-packet" => Attach::AfPacket(arg.to_string()),
        "pod" => Attach::Pod(arg.to_string()),
        "tap" => Attach::Tap(arg.to_string()),
        other => bail!("--attach {spec:?}: unknown kind {other:?} (af-packet, pod or tap)"),
    };
    Ok((port.to_string(), a))
}

/// A TAP name for a pod port: unique to this process, at most 15 bytes.
fn pod_tap_name(index: usize) -> String {
    format!("fy{}p{index}", std::process::id() % 1_000_000)
}

fn open_ports(
    tables: &Tables,
    attach: &[(String, Attach)],
    share_uplink: bool,
    workers: u16,
) -> Result<Vec<NamedPort>> {
    for (name, _) in attach {
        if tables.port_id(name).is_none() {
            bail!("--attach: no port {name:?} in the tables");
        }
    }
    let mut ports: Vec<NamedPort> = Vec::with_capacity(tables.ports.len());
    for (i, p) in tables.ports.iter().enumerate() {
        let mut found = attach.iter().filter(|(n, _)| *n == p.name);
        let (_, how) = found
            .next()
            .with_context(|| format!("port {:?} of the tables has no --attach", p.name))?;
        if found.next().is_some() {
            bail!("--attach: port {:?} is attached twice", p.name);
        }
        let port: Box<dyn Port> = match how {
            Attach::AfPacket(dev) => {
                let cfg = AfPacketConfig {
                    drop_kernel_ingress: !share_uplink,
                    queues: workers,
                    ..AfPacketConfig::default()
                };
                Box::new(
                    AfPacketPort::open(dev, &cfg)
                        .with_context(|| format!("port {:?}: af-packet on {dev}", p.name))?,
                )
            }
            Attach::Tap(dev) => Box::new(
                TapPort::create(dev).with_context(|| format!("port {:?}: tap {dev}", p.name))?,
            ),
            Attach::Pod(netns) => {
                if p.kind != PortKind::Pod {
                    bail!(
                        "--attach {}=pod:{netns}: the tables do not say port {:?} is a pod (kind: pod)",
                        p.name,
                        p.name
                    );
                }
                let dev = pod_tap_name(i);
                let tap = link::pod_tap(&dev, netns, "eth0", p, workers)
                    .with_context(|| format!("port {:?}: eth0 in {netns} (tap {dev})", p.name))?;
                Box::new(tap)
            }
        };
        if p.gso && !port.offloads() {
            bail!(
                "port {:?}: the tables say gso: true but this port does not pass GSO packets",
                p.name
            );
        }
        ports.push((p.name.clone(), port));
    }
    Ok(ports)
}

/// Runs the node until SIGINT, SIGTERM, SIGHUP or SIGQUIT.
pub fn run(args: &Args) -> Result<()> {
    let tables = Arc::new(load_tables(&args.tables)?);
    let attach: Vec<(String, Attach)> = args
        .attach
        .iter()
        .map(|a| parse_attach(a))
        .collect::<Result<_>>()?;
    let stop = ferry_linux::signal::stop_on_signals().context("installing signal handlers")?;
    let mut ports = open_ports(&tables, &attach, args.share_uplink, args.workers)?;
    let mut pipeline = Pipeline::new(Arc::clone(&tables));
    let start = Instant::now();
    eprintln!(
        "ferry node: {} ports up, {} worker{}; stop with SIGINT, SIGTERM, SIGHUP or SIGQUIT",
        ports.len(),
        args.workers,
        if args.workers == 1 { "" } else { "s" }
    );
    let control = Control::new();
    let stats = ferry_linux::worker::run_workers(
        workers(args.workers, args.pin_workers, args.busy_poll)?,
        &mut ports,
        &mut pipeline,
        stop,
        || start.elapsed().as_nanos() as u64,
        &control,
    )
    .context("worker")?;
    let per_worker: Vec<String> = control
        .snapshot()
        .workers
        .iter()
        .enumerate()
        .map(|(w, s)| format!("{} by worker {w}", s.rx_frames))
        .collect();
    drop(ports);
    let drops: Vec<String> = pipeline
        .drops()
        .nonzero()
        .map(|(r, n)| format!("{r} {n}"))
        .collect();
    let ps = pipeline.stats();
    let busy = if args.busy_poll > 0 {
        format!(
            "; {} rounds busy polling, of {}",
            stats.busy_rounds, stats.rounds
        )
    } else {
        String::new()
    };
    let busy = if stats.ports_gone > 0 {
        format!(
            "{busy}; {} pod ports taken out of service, their device gone; {} frames \
             dropped on the way out",
            stats.ports_gone, stats.tx_dropped
        )
    } else {
        busy
    };
    eprintln!(
        "ferry node: stopped after {} frames in ({}), {} out ({} segments coalesced{busy}; UDP \
         GSO through the overlay: {} super-frames sent, {} received); drops: {}",
        stats.rx_frames,
        per_worker.join(", "),
        stats.tx_frames,
        stats.gro_merged,
        ps.encap_gso_frames,
        ps.decap_gso_frames,
        if drops.is_empty() {
            "none".to_string()
        } else {
            drops.join(", ")
        }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_specs_parse_or_say_what_is_wrong() {
        assert_eq!(
            parse_attach("uplink=af-packet:eth0").unwrap(),
            ("uplink".into(), Attach::AfPacket("eth0".into()))
        );
        assert_eq!(
            parse_attach("pod-a=pod:ns1").unwrap(),
            ("pod-a".into(), Attach::Pod("ns1".into()))
        );
        assert_eq!(
            parse_attach("h=tap:ferry0").unwrap(),
            ("h".into(), Attach::Tap("ferry0".into()))
        );
        for (bad, want) in [
            ("uplink", "expected PORT=KIND:ARG"),
            ("uplink=eth0", "expected KIND:ARG"),
            ("uplink=af-packet:", "needs a name"),
            ("uplink=xdp:eth0", "unknown kind \"xdp\""),
        ] {
            let e = parse_attach(bad).unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
        assert!(pod_tap_name(12).len() <= 15);
    }

    #[test]
    fn busy_poll_is_microseconds_up_to_a_second() {
        assert_eq!(parse_busy_poll("0"), Ok(0));
        assert_eq!(parse_busy_poll("50"), Ok(50));
        assert_eq!(parse_busy_poll("1000000"), Ok(1_000_000));
        for bad in ["1000001", "-1", "50us", ""] {
            let e = parse_busy_poll(bad).unwrap_err();
            assert!(e.contains("microseconds from 0 to 1000000"), "{bad}: {e}");
        }
        let w = workers(2, false, 50).unwrap();
        assert_eq!(w.busy_poll, std::time::Duration::from_micros(50));
    }

    #[test]
    fn workers_are_a_count_or_auto() {
        assert_eq!(parse_workers("1"), Ok(1));
        assert_eq!(parse_workers("64"), Ok(64));
        let cores = std::thread::available_parallelism().unwrap().get().min(64);
        assert_eq!(parse_workers("auto"), Ok(cores as u16));
        for bad in ["0", "65", "-1", "two", ""] {
            let e = parse_workers(bad).unwrap_err();
            assert!(
                e.contains("expected a number from 1 to 64, or auto"),
                "{bad}: {e}"
            );
        }
    }
}
