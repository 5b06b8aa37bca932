//! `ferry cleanup`: removes what kube-proxy and flannel left on this node
//! ([`ferry_agent::cleanup`]), or with `--dry-run` lists it.

use std::path::PathBuf;

use anyhow::{Result, bail};
use ferry_agent::cleanup;

/// The default `--cni-conf-dir`: where container runtimes read CNI configuration.
pub const DEFAULT_CNI_CONF_DIR: &str = "/etc/cni/net.d";

/// Arguments of `ferry cleanup`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// List what would be removed, and remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Where flannel's CNI network configuration is looked for (`off`: nowhere).
    #[arg(long, value_name = "DIR|off", default_value = DEFAULT_CNI_CONF_DIR)]
    pub cni_conf_dir: String,
}

/// Runs `ferry cleanup`: a line per leftover on standard output, `would remove:`,
/// `removed:` or `not removed:` with the error; a note per part not looked at on
/// standard error. Fails when something was not removed.
pub fn run(args: &Args) -> Result<()> {
    let dir = (args.cni_conf_dir != "off").then(|| PathBuf::from(&args.cni_conf_dir));
    let found = cleanup::find(dir.as_deref()).map_err(anyhow::Error::msg)?;
    for n in &found.notes {
        eprintln!("ferry cleanup: {n}");
    }
    if found.leftovers.is_empty() {
        println!("nothing left by kube-proxy or flannel");
        return Ok(());
    }
    let mut failed = 0;
    for l in &found.leftovers {
        if args.dry_run {
            println!("would remove: {l}");
            continue;
        }
        match cleanup::remove(l) {
            Ok(()) => println!("removed: {l}"),
            Err(e) => {
                failed += 1;
                println!("not removed: {l}: {e}");
            }
        }
    }
    if failed > 0 {
        bail!(
            "{failed} of {} leftovers not removed",
            found.leftovers.len()
        );
    }
    Ok(())
}

/// The agent's `--cleanup-legacy`: the same at start, logged; what cannot be removed is
/// a warning, and the agent starts all the same.
pub fn at_agent_start() {
    let found = match cleanup::find(None) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(error = %e, "--cleanup-legacy: could not look for leftovers");
            return;
        }
    };
    for n in &found.notes {
        tracing::info!("--cleanup-legacy: {n}");
    }
    for l in &found.leftovers {
        match cleanup::remove(l) {
            Ok(()) => tracing::info!(leftover = %l, "--cleanup-legacy: removed"),
            Err(e) => tracing::warn!(leftover = %l, error = %e, "--cleanup-legacy: not removed"),
        }
    }
}
