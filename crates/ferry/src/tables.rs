//! `ferry tables`: one node's tables, compiled from a directory of Kubernetes manifests.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use ferry_agent::compile::{AttachedPod, CompileOptions, Compiled, node_tables};
use ferry_agent::datastore::file;
use ferry_agent::{Cluster, Problem};
use ferry_datapath::TablesSpec;

/// Arguments of `ferry tables`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The cluster: a directory of Kubernetes manifests (see docs/agent.md).
    #[arg(long, value_name = "DIR")]
    pub cluster: PathBuf,
    /// The node whose tables to compile (a Node of the cluster).
    #[arg(long, value_name = "NAME")]
    pub node: String,
    /// Base tables: the ports, routes and settings the cluster does not say (default:
    /// one uplink derived from the Node object).
    #[arg(long, value_name = "FILE")]
    pub base: Option<PathBuf>,
    /// A pod whose interface exists on the node, NAMESPACE/NAME; repeatable. Without
    /// any, every pod of the node counts as attached.
    #[arg(long = "pod", value_name = "NS/NAME")]
    pub pods: Vec<String>,
}

/// Compiles and prints the tables as YAML on stdout; warnings go to stderr.
pub fn run(args: &Args) -> Result<()> {
    let pods = args
        .pods
        .iter()
        .map(|p| match p.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(AttachedPod::new(ns, name))
            }
            _ => Err(anyhow!("--pod {p:?}: expected NAMESPACE/NAME")),
        })
        .collect::<Result<Vec<_>>>()?;
    let pods = (!pods.is_empty()).then_some(pods);
    let compiled = compile_cluster(
        &args.cluster,
        &args.node,
        args.base.as_deref(),
        pods.as_deref(),
    )?;
    let yaml = serde_saphyr::to_string(&compiled.tables)
        .map_err(|e| anyhow!("cannot write the tables as YAML: {e}"))?;
    print!("{yaml}");
    Ok(())
}

/// Reads a tables file without compiling it; errors name the file.
pub fn read_tables_spec(path: &Path) -> Result<TablesSpec> {
    let text =
        fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
    serde_saphyr::from_str(&text).map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// Reads the cluster in `dir` and compiles the tables of `node`, on `base` (a tables
/// file) when given. `pods`: the pods attached to the node; `None` attaches every pod
/// of the node. Notes and warnings are written to stderr; a refused cluster is an
/// error listing every problem.
pub fn compile_cluster(
    dir: &Path,
    node: &str,
    base: Option<&Path>,
    pods: Option<&[AttachedPod]>,
) -> Result<Compiled> {
    let (cluster, notes) = file::load(dir).map_err(|r| {
        let mut s = format!("{}: the cluster's manifests are refused:", dir.display());
        for p in &r.problems {
            let _ = write!(s, "\n  {}", in_dir(dir, p));
        }
        anyhow!(s)
    })?;
    for n in &notes {
        eprintln!("ferry: note: {}", in_dir(dir, n));
    }
    let base_path = base;
    let base = base.map(read_tables_spec).transpose()?;
    let all;
    let attached = match pods {
        Some(p) => p,
        None => {
            all = pods_of(&cluster, node);
            &all
        }
    };
    let opts = CompileOptions {
        base_file: base_path.map(|p| p.display().to_string()),
        ..CompileOptions::default()
    };
    let compiled = node_tables(&cluster, node, base.as_ref(), attached, &opts)
        .map_err(|e| anyhow!("{}: {e}", dir.display()))?;
    for w in &compiled.warnings {
        eprintln!("ferry: warning: {w}");
    }
    Ok(compiled)
}

/// A problem with its file given as a path through `dir`, so that editors and
/// terminals can open it.
fn in_dir(dir: &Path, p: &Problem) -> Problem {
    let mut p = p.clone();
    let path = dir.join(&p.file);
    if path.is_file() {
        p.file = path.display().to_string();
    }
    p
}

/// Every pod scheduled on `node`.
fn pods_of(cluster: &Cluster, node: &str) -> Vec<AttachedPod> {
    cluster
        .pods
        .iter()
        .filter(|(_, p)| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .map(|(k, _)| AttachedPod::new(&k.namespace, &k.name))
        .collect()
}
