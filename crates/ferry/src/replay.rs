//! `ferry replay`: pcap files through one node's pipeline, offline and deterministic.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use ferry_datapath::conntrack::Filter;
use ferry_datapath::{DropReason, Tables};
use ferry_datapath::{
    Packet, Pipeline, PipelineStats, PortId, PortStats, Trace, TraceEvent, Verdict,
};
use serde::Serialize;

use crate::pcap;
use crate::tables::{compile_cluster, read_tables_spec};

/// Arguments of `ferry replay`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The node tables (YAML; see docs/tables.md). With --cluster: the base tables the
    /// cluster's are compiled on (optional).
    #[arg(long, value_name = "FILE", required_unless_present = "cluster")]
    pub tables: Option<PathBuf>,
    /// Compile the tables from this directory of Kubernetes manifests (see
    /// docs/agent.md), every pod of the node attached; needs --node.
    #[arg(long, value_name = "DIR", requires = "node")]
    pub cluster: Option<PathBuf>,
    /// The node of the cluster whose tables to use.
    #[arg(long, value_name = "NAME", requires = "cluster")]
    pub node: Option<String>,
    /// Input: a port name and a pcap/pcapng file of frames received on it. Repeatable.
    #[arg(long = "in", value_name = "PORT=FILE", required = true)]
    pub inputs: Vec<String>,
    /// Output directory: PORT.pcap for each port that sends, and verdicts.jsonl.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// Reads and compiles a tables file; errors name the file and the problem.
pub fn load_tables(path: &Path) -> Result<Tables> {
    read_tables_spec(path)?
        .compile()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The tables `args` name: a tables file, or a node of a cluster compiled on it.
/// Returns them with a description of where they came from, for messages.
fn tables_of(args: &Args) -> Result<(Tables, String)> {
    match (&args.cluster, &args.node) {
        (Some(dir), Some(node)) => {
            let c = compile_cluster(dir, node, args.tables.as_deref(), None)?;
            let t = c
                .tables
                .compile()
                .map_err(|e| anyhow::anyhow!("{}: node {node}: {e}", dir.display()))?;
            Ok((t, format!("node {node} of {}", dir.display())))
        }
        _ => {
            let Some(path) = &args.tables else {
                bail!("give --tables FILE, or --cluster DIR and --node NAME");
            };
            Ok((load_tables(path)?, path.display().to_string()))
        }
    }
}

#[derive(Serialize)]
struct Output<'a> {
    port: &'a str,
    packets: usize,
}

/// A trace event: its stage and text as before, and its fields (tagged by `kind`).
#[derive(Serialize)]
struct Event<'a> {
    stage: &'static str,
    detail: String,
    event: &'a TraceEvent,
}

#[derive(Serialize)]
struct VerdictLine<'a> {
    port: &'a str,
    index: usize,
    time_ns: u64,
    verdict: &'static str,
    drop_reason: Option<&'static str>,
    ct: Option<&'static str>,
    outputs: Vec<Output<'a>>,
    trace: Vec<Event<'a>>,
}

/// What a replay did, for the summary.
pub struct Summary {
    /// Output directory.
    pub out: PathBuf,
    /// Port names by id.
    pub ports: Vec<String>,
    /// Input packets.
    pub packets: usize,
    /// Verdict counts by name.
    pub verdicts: BTreeMap<&'static str, usize>,
    /// Drops by reason.
    pub drops: Vec<(DropReason, u64)>,
    /// Pipeline counters.
    pub stats: PipelineStats,
    /// Per-port counters.
    pub port_stats: Vec<PortStats>,
    /// Datagrams still incomplete when input ended.
    pub held_datagrams: usize,
    /// Conntrack counters.
    pub ct: ferry_datapath::conntrack::Stats,
    /// Connections tracked when input ended.
    pub connections: usize,
}

impl Summary {
    /// A human-readable summary.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "replayed {} packets into {}",
            self.packets,
            self.out.display()
        );
        let v: Vec<String> = self
            .verdicts
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = writeln!(s, "  verdicts: {}", v.join(", "));
        let st = &self.stats;
        let _ = writeln!(
            s,
            "  reassembled {} datagrams; sent {} fragments; segmented {} super-packets into {} segments; ICMP errors sent {}, rate-limited {}",
            st.reassembled,
            st.fragments_out,
            st.segmented,
            st.segments_out,
            st.icmp_sent,
            st.icmp_rate_limited
        );
        let ct = &self.ct;
        let _ = writeln!(
            s,
            "  conntrack: {} connections at the end; {} new, {} packets of known connections, {} related, {} invalid, {} refused (table full), {} NAT ports exhausted",
            self.connections,
            ct.inserted,
            ct.found,
            ct.related,
            ct.invalid,
            ct.insert_failed,
            ct.nat_port_exhausted
        );
        if self.held_datagrams > 0 {
            let _ = writeln!(
                s,
                "  {} datagrams were still incomplete when the input ended",
                self.held_datagrams
            );
        }
        if st.neigh_waiting > 0 {
            let _ = writeln!(
                s,
                "  {} packets were still waiting for their next hop's MAC when the input ended",
                st.neigh_waiting
            );
        }
        for (r, n) in &self.drops {
            let _ = writeln!(s, "  dropped {n:>6}  {r}");
        }
        for (name, p) in self.ports.iter().zip(&self.port_stats) {
            let _ = writeln!(
                s,
                "  port {name:<12} rx {:>5} pkts {:>8} B   tx {:>5} pkts {:>8} B",
                p.rx_packets, p.rx_bytes, p.tx_packets, p.tx_bytes
            );
        }
        s
    }
}

struct Input {
    port: PortId,
    index: usize,
    frame: pcap::Frame,
}

/// Runs a replay as `args` say.
pub fn run(args: &Args) -> Result<Summary> {
    let (tables, source) = tables_of(args)?;
    let tables = Arc::new(tables);
    let mut inputs = Vec::new();
    for spec in &args.inputs {
        let Some((name, file)) = spec.split_once('=') else {
            bail!("--in {spec:?}: expected PORT=FILE");
        };
        let Some(port) = tables.port_id(name) else {
            let known: Vec<&str> = tables.ports.iter().map(|p| p.name.as_str()).collect();
            bail!(
                "--in {spec:?}: no port {name:?} in {source} (ports: {})",
                known.join(", ")
            );
        };
        for (index, frame) in pcap::read_all(Path::new(file))?.into_iter().enumerate() {
            inputs.push(Input { port, index, frame });
        }
    }
    // pcap time is the pipeline's clock; ties keep argument and file order.
    inputs.sort_by_key(|i| i.frame.time_ns);

    fs::create_dir_all(&args.out)
        .with_context(|| format!("{}: cannot create directory", args.out.display()))?;
    let vpath = args.out.join("verdicts.jsonl");
    let mut verdicts = BufWriter::new(
        File::create(&vpath).with_context(|| format!("{}: cannot create", vpath.display()))?,
    );
    let mut writers: Vec<Option<pcap::Writer>> = (0..tables.ports.len()).map(|_| None).collect();
    // Stale outputs of an earlier run would mislead: remove those of ports that stay silent.
    for p in &tables.ports {
        let f = args.out.join(format!("{}.pcap", p.name));
        if f.exists() {
            fs::remove_file(&f)
                .with_context(|| format!("{}: cannot remove stale output", f.display()))?;
        }
    }

    let mut pipeline = Pipeline::new(Arc::clone(&tables));
    let mut out = Vec::new();
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    let packets = inputs.len();
    for input in inputs {
        let now = input.frame.time_ns;
        out.clear();
        // What the clock sends (ICMP errors for packets whose neighbour did not answer)
        // is written with this packet's time, and not counted as its output.
        pipeline.tick(now, &mut out);
        let ticked = out.len();
        let mut trace = Trace::enabled();
        let verdict = pipeline.process(
            Packet::new(input.frame.data, input.port, now),
            &mut out,
            &mut trace,
        );
        *counts.entry(verdict.name()).or_default() += 1;
        let mut per_port: Vec<(PortId, usize)> = Vec::new();
        for (i, (port, pkt)) in out.iter().enumerate() {
            if i >= ticked {
                match per_port.iter_mut().find(|(p, _)| p == port) {
                    Some((_, n)) => *n += 1,
                    None => per_port.push((*port, 1)),
                }
            }
            let w = &mut writers[usize::from(*port)];
            if w.is_none() {
                *w = Some(pcap::Writer::create(
                    &args
                        .out
                        .join(format!("{}.pcap", tables.ports[usize::from(*port)].name)),
                )?);
            }
            if let Some(w) = w {
                w.write(now, &pkt.data)?;
            }
        }
        let line = VerdictLine {
            port: &tables.ports[usize::from(input.port)].name,
            index: input.index,
            time_ns: now,
            verdict: verdict.name(),
            drop_reason: match verdict {
                Verdict::Dropped(r) => Some(r.name()),
                _ => None,
            },
            ct: trace.ct_name(),
            outputs: per_port
                .iter()
                .map(|(p, n)| Output {
                    port: &tables.ports[usize::from(*p)].name,
                    packets: *n,
                })
                .collect(),
            trace: trace
                .events
                .iter()
                .map(|e| Event {
                    stage: e.stage().name(),
                    detail: e.to_string(),
                    event: e,
                })
                .collect(),
        };
        serde_json::to_writer(&mut verdicts, &line)?;
        verdicts.write_all(b"\n")?;
    }
    verdicts
        .flush()
        .with_context(|| format!("{}: cannot write", vpath.display()))?;
    write_conntrack(&args.out.join("conntrack.jsonl"), &pipeline)?;
    for w in writers.into_iter().flatten() {
        w.finish()?;
    }
    Ok(Summary {
        out: args.out.clone(),
        ports: tables.ports.iter().map(|p| p.name.clone()).collect(),
        packets,
        verdicts: counts,
        drops: pipeline.drops().nonzero().collect(),
        stats: *pipeline.stats(),
        port_stats: pipeline.port_stats().to_vec(),
        held_datagrams: pipeline.reassembler().held_datagrams(),
        ct: *pipeline.conntrack().stats(),
        connections: pipeline.conntrack().len(),
    })
}

/// The connections tracked when the input ended, one JSON object per line.
fn write_conntrack(path: &Path, pipeline: &Pipeline) -> Result<()> {
    let mut w = BufWriter::new(
        File::create(path).with_context(|| format!("{}: cannot create", path.display()))?,
    );
    let all = Filter::default();
    for (_, e) in pipeline.conntrack().dump(&all) {
        serde_json::to_writer(&mut w, e)?;
        w.write_all(b"\n")?;
    }
    w.flush()
        .with_context(|| format!("{}: cannot write", path.display()))
}
