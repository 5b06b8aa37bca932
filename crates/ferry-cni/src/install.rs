//! `ferry-cni install`: the plugin binary into the runtime's plugin directory and the
//! network configuration into its configuration directory, as a DaemonSet's init
//! container does on each node.
//!
//! Each file is written under a temporary name in its directory, synced, then renamed
//! over the old one, so that the runtime never executes or reads half a file; the
//! rename also leaves a running `ferry-cni` process its old binary.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::version::Version;

/// The network's name in the configuration (and its lease directory's).
pub const NETWORK_NAME: &str = "ferry";

/// The plugin's `type`: the binary's name in the plugin directory.
pub const PLUGIN_TYPE: &str = "ferry-cni";

/// The configuration file's name: `10-` so that it sorts before most others (runtimes
/// take the first file in the directory).
pub const CONFLIST_NAME: &str = "10-ferry.conflist";

/// The network configuration list for an agent at `socket`: CNI 1.0.0 for runtimes
/// whose libcni predates spec 1.1.0 (they read `cniVersion` only), and every version
/// from 1.0.0 on in `cniVersions`, from which newer ones take the highest they support
/// (1.1.0, with STATUS and GC).
pub fn conflist(socket: &Path) -> Value {
    let versions: Vec<&str> = Version::ALL
        .iter()
        .filter(|v| **v >= Version::V1_0_0)
        .map(|v| v.as_str())
        .collect();
    json!({
        "cniVersion": Version::V1_0_0.as_str(),
        "cniVersions": versions,
        "name": NETWORK_NAME,
        "plugins": [{
            "type": PLUGIN_TYPE,
            "socket": socket,
        }]
    })
}

/// Where to install.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Install {
    /// The runtime's plugin directory (`/opt/cni/bin`).
    pub bin_dir: PathBuf,
    /// The runtime's configuration directory (`/etc/cni/net.d`).
    pub conf_dir: PathBuf,
    /// The agent's socket, written into the configuration.
    pub socket: PathBuf,
}

impl Install {
    /// Copies `binary` (this program) to `bin_dir/ferry-cni` and writes the
    /// configuration to `conf_dir/10-ferry.conflist`, creating the directories if
    /// needed. Returns the two paths written.
    pub fn run(&self, binary: &Path) -> io::Result<[PathBuf; 2]> {
        if !self.socket.is_absolute() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the socket {} is not an absolute path",
                    self.socket.display()
                ),
            ));
        }
        fs::create_dir_all(&self.bin_dir)?;
        fs::create_dir_all(&self.conf_dir)?;
        let plugin = write_atomically(&self.bin_dir, PLUGIN_TYPE, 0o755, |out| {
            io::copy(&mut File::open(binary)?, out).map(drop)
        })?;
        let mut text =
            serde_json::to_string_pretty(&conflist(&self.socket)).expect("JSON values serialize");
        text.push('\n');
        let conf = write_atomically(&self.conf_dir, CONFLIST_NAME, 0o644, |out| {
            out.write_all(text.as_bytes())
        })?;
        Ok([plugin, conf])
    }
}

/// Writes `dir/name` through a temporary file in `dir` renamed over it.
fn write_atomically(
    dir: &Path,
    name: &str,
    mode: u32,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<PathBuf> {
    let target = dir.join(name);
    // Ends in .tmp: a runtime loads only *.conf, *.conflist and *.json from the
    // configuration directory, so it never picks the file up half written.
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&temp)?;
        fill(&mut file)?;
        // The mode given at creation is cut by the umask; the runtime needs exactly it.
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        file.sync_all()?;
        fs::rename(&temp, &target)?;
        // The rename itself survives a crash only once the directory is synced.
        File::open(dir)?.sync_all()
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&temp);
        return Err(io::Error::new(
            e.kind(),
            format!("writing {}: {e}", target.display()),
        ));
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn test_conflist_offers_cni_1_0_0_and_1_1_0_for_ferry_cni_with_the_socket() {
        assert_eq!(
            conflist(Path::new("/run/ferry/ferry.sock")),
            json!({
                "cniVersion": "1.0.0",
                "cniVersions": ["1.0.0", "1.1.0"],
                "name": "ferry",
                "plugins": [{"type": "ferry-cni", "socket": "/run/ferry/ferry.sock"}]
            })
        );
    }

    #[test]
    fn test_install_copies_the_binary_and_writes_the_conflist() {
        let tmp = tempfile::tempdir().unwrap();
        let binary = tmp.path().join("built-ferry-cni");
        fs::write(&binary, b"\x7fELF pretend").unwrap();
        let install = Install {
            bin_dir: tmp.path().join("opt/cni/bin"),
            conf_dir: tmp.path().join("etc/cni/net.d"),
            socket: "/run/ferry/ferry.sock".into(),
        };
        let [plugin, conf] = install.run(&binary).unwrap();
        assert_eq!(plugin, install.bin_dir.join("ferry-cni"));
        assert_eq!(conf, install.conf_dir.join("10-ferry.conflist"));
        assert_eq!(fs::read(&plugin).unwrap(), b"\x7fELF pretend");
        let mode = fs::metadata(&plugin).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755);
        let written: Value = serde_json::from_slice(&fs::read(&conf).unwrap()).unwrap();
        assert_eq!(written, conflist(Path::new("/run/ferry/ferry.sock")));
        // Nothing else was left behind.
        assert_eq!(fs::read_dir(&install.bin_dir).unwrap().count(), 1);
        assert_eq!(fs::read_dir(&install.conf_dir).unwrap().count(), 1);

        // Installing again replaces both.
        fs::write(&binary, b"\x7fELF newer").unwrap();
        let again = Install {
            socket: "/var/run/ferry.sock".into(),
            ..install.clone()
        };
        again.run(&binary).unwrap();
        assert_eq!(fs::read(&plugin).unwrap(), b"\x7fELF newer");
        let written: Value = serde_json::from_slice(&fs::read(&conf).unwrap()).unwrap();
        assert_eq!(written["plugins"][0]["socket"], "/var/run/ferry.sock");
    }

    #[test]
    fn test_install_refuses_a_relative_socket_and_a_missing_binary() {
        let tmp = tempfile::tempdir().unwrap();
        let install = Install {
            bin_dir: tmp.path().join("bin"),
            conf_dir: tmp.path().join("conf"),
            socket: "ferry.sock".into(),
        };
        let e = install.run(Path::new("/bin/sh")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(!install.bin_dir.exists());

        let install = Install {
            socket: "/run/ferry/ferry.sock".into(),
            ..install
        };
        let e = install.run(&tmp.path().join("missing")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert_eq!(fs::read_dir(&install.bin_dir).unwrap().count(), 0);
        assert!(!install.conf_dir.join(CONFLIST_NAME).exists());
    }
}
