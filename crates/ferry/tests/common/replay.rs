//! `ferry replay --cluster` on the example cluster (examples/cluster) with manifests
//! added: frames in, verdicts out. Needs nothing but the binary.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster")
}

/// The example cluster with `extra` as `extra.yaml`, in `dir/cluster`.
pub fn cluster(dir: &Path, extra: &str) -> PathBuf {
    let c = dir.join("cluster");
    fs::create_dir(&c).unwrap();
    for e in fs::read_dir(example()).unwrap() {
        let p = e.unwrap().path();
        fs::copy(&p, c.join(p.file_name().unwrap())).unwrap();
    }
    fs::write(c.join("extra.yaml"), extra).unwrap();
    c
}

/// Replays `frames`, received on `port` one a second, through node-a of the example
/// cluster with `extra`; the verdicts, in order.
pub fn replay(extra: &str, port: &str, frames: &[Vec<u8>]) -> Vec<serde_json::Value> {
    use pcap_file::pcap::{PcapPacket, PcapWriter};
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    let mut w = PcapWriter::new(fs::File::create(&input).unwrap()).unwrap();
    for (i, f) in frames.iter().enumerate() {
        let t = std::time::Duration::from_secs(1 + i as u64);
        w.write_packet(&PcapPacket::new(t, f.len() as u32, f))
            .unwrap();
    }
    drop(w);
    let out = dir.path().join("out");
    let c = cluster(dir.path(), extra);
    let run = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["replay", "--cluster"])
        .arg(&c)
        .args(["--node", "node-a", "--in"])
        .arg(format!("{port}={}", input.display()))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    fs::read_to_string(out.join("verdicts.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The details of the trace's events of `stage` in verdict `v`.
pub fn stage(v: &serde_json::Value, stage: &str) -> Vec<String> {
    v["trace"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["stage"] == stage)
        .map(|e| e["detail"].as_str().unwrap().to_string())
        .collect()
}
