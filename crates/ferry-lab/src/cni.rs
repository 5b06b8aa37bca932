//! Pods through the CNI plugin, invoked as a kubelet's container runtime does: the
//! command and attachment in `CNI_*` variables, the network configuration on stdin.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The network configuration for node `n`'s plugin: its agent's socket, leases in
/// the lab directory.
pub fn netconf(dir: &Path, n: u8) -> String {
    serde_json::json!({
        "cniVersion": "1.1.0",
        "name": "ferry-lab",
        "type": "ferry-cni",
        "socket": dir.join(format!("node{n}.sock")),
        "dataDir": dir.join("cni").join(format!("node{n}")),
    })
    .to_string()
}

/// Runs the plugin once; returns its standard output (the result).
fn invoke(
    plugin: &Path,
    command: &str,
    conf: &str,
    container_id: &str,
    netns: &str,
    (namespace, pod): (&str, &str),
) -> Result<String> {
    let dir = plugin.parent().unwrap_or(Path::new("/"));
    let mut child = Command::new(plugin)
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", container_id)
        .env("CNI_NETNS", format!("/var/run/netns/{netns}"))
        .env("CNI_IFNAME", "eth0")
        .env(
            "CNI_ARGS",
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod}"),
        )
        .env("CNI_PATH", dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running the CNI plugin {}", plugin.display()))?;
    child
        .stdin
        .take()
        .context("the plugin's stdin")?
        .write_all(conf.as_bytes())?;
    let out = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "ferry-cni {command} for pod {namespace}/{pod} failed ({}): {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

/// CNI ADD for pod `(namespace, name)`: returns its addresses (without prefix length)
/// from the result.
pub fn add(
    plugin: &Path,
    conf: &str,
    container_id: &str,
    netns: &str,
    pod: (&str, &str),
) -> Result<Vec<String>> {
    let out = invoke(plugin, "ADD", conf, container_id, netns, pod)?;
    let result: serde_json::Value =
        serde_json::from_str(&out).with_context(|| format!("the ADD result {out:?}"))?;
    let ips: Vec<String> = result["ips"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|ip| ip["address"].as_str())
                .map(|a| a.split('/').next().unwrap_or(a).to_string())
                .collect()
        })
        .unwrap_or_default();
    anyhow::ensure!(!ips.is_empty(), "the ADD result has no ips: {out}");
    Ok(ips)
}

/// CNI DEL for pod `(namespace, name)`.
pub fn del(
    plugin: &Path,
    conf: &str,
    container_id: &str,
    netns: &str,
    pod: (&str, &str),
) -> Result<()> {
    invoke(plugin, "DEL", conf, container_id, netns, pod).map(drop)
}
