//! Podman with a test's own configuration and storage: runc, `default_ulimits = []`
//! (RLIMIT_NOFILE cannot be raised on these machines) and vfs storage in the test's
//! temporary directory, so that nothing outside the test is changed or left behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Podman with the test's own configuration and storage.
pub struct Podman {
    conf: PathBuf,
    storage: PathBuf,
}

impl Podman {
    pub fn new(dir: &Path) -> Podman {
        let conf = dir.join("containers.conf");
        fs::write(
            &conf,
            "[containers]\ndefault_ulimits = []\n[engine]\nruntime = \"runc\"\n",
        )
        .unwrap();
        let storage = dir.join("storage.conf");
        fs::write(
            &storage,
            format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                dir.join("graph").display(),
                dir.join("run").display()
            ),
        )
        .unwrap();
        Podman { conf, storage }
    }

    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("CONTAINERS_CONF", &self.conf)
            .env("CONTAINERS_STORAGE_CONF", &self.storage);
        c
    }

    pub fn podman(&self, args: &[&str]) -> String {
        let out = self.command("podman").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "podman {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}
