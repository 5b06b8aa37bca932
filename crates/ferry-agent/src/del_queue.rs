//! DELs the CNI plugin queued while the agent was not running.
//!
//! A plugin that finds no agent at the socket writes the `del` it could not send to a
//! directory next to the socket ([`ferry_api::del_queue_dir`]), one JSON file per
//! attachment, and releases the pod's leases. The agent makes the directory when it
//! starts, carries the queued DELs out before it adopts the attachments it recorded
//! ([`crate::run::Agent::start`]) and then periodically while it runs
//! ([`crate::run::Agent::carry_out_queued_dels`]), and removes each file once its DEL is
//! done. A file that is not a queued DEL is removed with a warning.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use ferry_api::Request;

/// The largest queue file read: an entry is a few dozen bytes.
const MAX_ENTRY: u64 = 64 * 1024;

/// How old a plugin's temporary file (a name starting with `.`) must be before it is
/// taken for one left by a plugin killed while writing it, and removed.
pub const STALE_TEMPORARY: Duration = Duration::from_secs(600);

/// One queued DEL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its file, removed once the DEL is done ([`done`]).
    pub path: PathBuf,
    /// The attachment's container ID.
    pub container_id: String,
    /// Its interface name.
    pub ifname: String,
}

/// A file of the queue that is not a queued DEL, removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    pub path: PathBuf,
    /// Why it is not a queued DEL.
    pub reason: String,
    /// Removing it failed: it is reported again at the next scan.
    pub not_removed: Option<String>,
}

/// What [`scan`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// The queued DELs, by file name.
    pub entries: Vec<Entry>,
    /// The files removed for not being queued DELs.
    pub dropped: Vec<Dropped>,
}

/// Makes the queue directory `dir` (and its parents) if missing, mode 0700: only root
/// queues DELs, as only root uses the socket.
pub fn create(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{}: not a directory",
            dir.display()
        )));
    }
    if meta.permissions().mode() & 0o777 != 0o700 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Reads the queue in `dir`: the DELs queued, in the order of their file names, and
/// the files that are not queued DELs, which are removed. A plugin's temporary file
/// (a name starting with `.`) is left alone unless older than [`STALE_TEMPORARY`]. A
/// queue directory that is missing holds nothing.
pub fn scan(dir: &Path) -> io::Result<Scan> {
    let listing = match fs::read_dir(dir) {
        Ok(l) => l,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Scan::default()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for e in listing {
        names.push(e?.file_name());
    }
    names.sort();
    let mut scan = Scan::default();
    for name in names {
        let path = dir.join(&name);
        let temporary = name.as_encoded_bytes().starts_with(b".");
        let reason = if temporary {
            if !stale(&path) {
                continue;
            }
            "a temporary file left by a plugin that did not finish writing it".to_string()
        } else {
            match read_entry(&path) {
                Ok((container_id, ifname)) => {
                    scan.entries.push(Entry {
                        path,
                        container_id,
                        ifname,
                    });
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => e.to_string(),
            }
        };
        let not_removed = remove(&path).err().map(|e| e.to_string());
        scan.dropped.push(Dropped {
            path,
            reason,
            not_removed,
        });
    }
    Ok(scan)
}

/// Removes the file of a DEL carried out.
pub fn done(entry: &Entry) -> io::Result<()> {
    match fs::remove_file(&entry.path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The container ID and interface name of the queued DEL in `path`.
fn read_entry(path: &Path) -> io::Result<(String, String)> {
    let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
    let meta = fs::symlink_metadata(path)?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    let mut text = Vec::new();
    fs::File::open(path)?
        .take(MAX_ENTRY + 1)
        .read_to_end(&mut text)?;
    if text.len() as u64 > MAX_ENTRY {
        return Err(bad(format!("larger than {MAX_ENTRY} bytes")));
    }
    match serde_json::from_slice::<Request>(&text) {
        Ok(Request::Del {
            container_id,
            ifname,
        }) if !container_id.is_empty() && !ifname.is_empty() => Ok((container_id, ifname)),
        Ok(Request::Del { .. }) => Err(bad("a del without container_id or ifname".into())),
        Ok(other) => Err(bad(format!("not a del: {other:?}"))),
        Err(e) => Err(bad(format!("not a request: {e}"))),
    }
}

fn stale(path: &Path) -> bool {
    fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|age| age >= STALE_TEMPORARY)
}

fn remove(path: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if meta.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(dir: &Path, container_id: &str, ifname: &str) -> PathBuf {
        let path = dir.join(ferry_api::del_queue_name(container_id, ifname));
        let del = Request::Del {
            container_id: container_id.into(),
            ifname: ifname.into(),
        };
        fs::write(&path, serde_json::to_vec(&del).unwrap()).unwrap();
        path
    }

    #[test]
    fn the_queue_is_made_root_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run/ferry.sock.del-queue");
        create(&dir).unwrap();
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // One made by someone else with looser permissions is tightened.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        create(&dir).unwrap();
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let file = tmp.path().join("file");
        fs::write(&file, "").unwrap();
        assert!(create(&file).is_err());
    }

    #[test]
    fn queued_dels_are_read_and_done_removes_them() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert_eq!(scan(&dir.join("missing")).unwrap(), Scan::default());
        let a = queue(dir, "c2", "eth0");
        let b = queue(dir, "c1", "net1");
        let scan = scan(dir).unwrap();
        assert_eq!(scan.dropped, []);
        assert_eq!(
            scan.entries,
            [
                Entry {
                    path: b,
                    container_id: "c1".into(),
                    ifname: "net1".into()
                },
                Entry {
                    path: a.clone(),
                    container_id: "c2".into(),
                    ifname: "eth0".into()
                }
            ]
        );
        for e in &scan.entries {
            done(e).unwrap();
        }
        assert!(!a.exists());
        assert_eq!(fs::read_dir(dir).unwrap().count(), 0);
        // Done twice is no error.
        done(&scan.entries[0]).unwrap();
    }

    #[test]
    fn files_that_are_not_queued_dels_are_removed_and_say_why() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let good = queue(dir, "c1", "eth0");
        fs::write(dir.join("garbage.json"), "{ not json").unwrap();
        fs::write(dir.join("status.json"), r#"{"op":"status"}"#).unwrap();
        fs::write(
            dir.join("empty.json"),
            r#"{"op":"del","container_id":"","ifname":"eth0"}"#,
        )
        .unwrap();
        fs::write(dir.join("big.json"), vec![b' '; MAX_ENTRY as usize + 1]).unwrap();
        fs::create_dir(dir.join("sub")).unwrap();
        std::os::unix::fs::symlink(&good, dir.join("link.json")).unwrap();
        // A plugin writing its entry now: left alone.
        fs::write(dir.join(".c9:eth0.json.42.tmp"), "{\"op\":").unwrap();
        let found = scan(dir).unwrap();
        assert_eq!(found.entries.len(), 1, "{found:?}");
        assert_eq!(found.entries[0].path, good);
        let mut dropped: Vec<(String, String)> = found
            .dropped
            .iter()
            .map(|d| {
                assert_eq!(d.not_removed, None, "{d:?}");
                let name = d.path.file_name().unwrap().to_string_lossy().into_owned();
                (name, d.reason.clone())
            })
            .collect();
        dropped.sort();
        let names: Vec<&str> = dropped.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "big.json",
                "empty.json",
                "garbage.json",
                "link.json",
                "status.json",
                "sub"
            ]
        );
        for (name, reason) in &dropped {
            let want = match name.as_str() {
                "big.json" => "larger than",
                "empty.json" => "without container_id",
                "garbage.json" => "not a request",
                "status.json" => "not a del",
                _ => "not a regular file",
            };
            assert!(reason.contains(want), "{name}: {reason}");
        }
        let mut left: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, [".c9:eth0.json.42.tmp", "c1:eth0.json"]);
        assert!(good.exists(), "the link's target stays");
    }
}
