//! `ferry lab check --suite netpol`.

use std::io::Write;
use std::path::Path;

use anyhow::Result;

/// Runs the suite (the cases whose name contains `only`, when given).
pub fn run(_dir: &Path, _only: Option<&str>, _out: &mut dyn Write) -> Result<bool> {
    anyhow::bail!("not yet")
}
