//! `ferry lab` for end-to-end tests: a lab brought up under a prefix unique to the test
//! run, and a guard that brings it down (every namespace, link and process it made) when
//! dropped, so a failed assertion or a panic still cleans up.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const FERRY: &str = env!("CARGO_BIN_EXE_ferry");

/// The CNI plugin next to ferry, built if this test runs before it was (cargo builds a
/// workspace's binaries for `cargo test --workspace`, not for `-p ferry`).
pub fn cni_plugin() -> PathBuf {
    let cni = PathBuf::from(FERRY).with_file_name("ferry-cni");
    if !cni.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", "ferry-cni"])
            .status()
            .expect("cargo");
        assert!(status.success(), "building ferry-cni");
    }
    cni
}

/// The network namespaces named `PREFIX-...`.
pub fn namespaces(prefix: &str) -> Vec<String> {
    let list = super::sh(&["ip", "netns", "list"]);
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .map(str::to_string)
        .collect()
}

/// `ferry lab --dir DIR ARGS`.
pub fn ferry_lab(dir: &Path, args: &[&str]) -> Output {
    Command::new(FERRY)
        .arg("lab")
        .arg("--dir")
        .arg(dir)
        .args(args)
        .output()
        .expect("running ferry lab")
}

/// stdout and stderr of `out`, as text.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A lab that is up; brought down by [`Lab::down`] or, failing that, on drop.
pub struct Lab {
    /// The lab's directory (in a temporary directory of its own).
    pub dir: PathBuf,
    /// The prefix of its namespaces.
    pub prefix: String,
    _tmp: tempfile::TempDir,
    up: bool,
}

impl Lab {
    /// `ferry lab up` with the default shape (three nodes, two zones), its namespaces
    /// named `TAG<pid>-...`.
    pub fn up(tag: &str) -> Lab {
        let cni = cni_plugin();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("lab");
        let prefix = format!("{tag}{}", std::process::id() % 1_000_000);
        let mut lab = Lab {
            dir,
            prefix,
            _tmp: tmp,
            up: true,
        };
        let out = ferry_lab(
            &lab.dir,
            &[
                "up",
                "--prefix",
                &lab.prefix,
                "--cni-bin",
                cni.to_str().unwrap(),
            ],
        );
        if !out.status.success() {
            let why = text(&out);
            lab.down();
            panic!("ferry lab up failed:\n{why}");
        }
        lab
    }

    /// `ferry lab ARGS` on this lab.
    pub fn run(&self, args: &[&str]) -> Output {
        ferry_lab(&self.dir, args)
    }

    /// The pids of the processes the lab's state records (agents, pods' servers, the
    /// load balancer's health checks).
    pub fn pids(&self) -> Vec<u32> {
        let text = std::fs::read_to_string(self.dir.join("state.json")).expect("the lab's state");
        let state: serde_json::Value = serde_json::from_str(&text).expect("the lab's state");
        state["processes"]
            .as_array()
            .expect("processes in the lab's state")
            .iter()
            .map(|p| p["pid"].as_u64().expect("a pid") as u32)
            .collect()
    }

    /// `ferry lab down`; what it left behind (namespaces, the directory), as text, or
    /// None when nothing.
    pub fn down(&mut self) -> Option<String> {
        self.up = false;
        let out = ferry_lab(&self.dir, &["down", "--prefix", &self.prefix]);
        let mut left = Vec::new();
        if !out.status.success() {
            left.push(format!("ferry lab down failed: {}", text(&out)));
        }
        let ns = namespaces(&self.prefix);
        if !ns.is_empty() {
            left.push(format!("namespaces {ns:?}"));
        }
        if self.dir.exists() {
            left.push(format!("the directory {}", self.dir.display()));
        }
        (!left.is_empty()).then(|| left.join("; "))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.up
            && let Some(left) = self.down()
        {
            eprintln!("after the lab of {}: {left}", self.prefix);
        }
    }
}
