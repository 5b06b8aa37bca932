//! The agent's record of pod attachments on disk, so that a restarted agent adopts the
//! pods' interfaces instead of losing them.
//!
//! One JSON file, [`FILE_NAME`] in the state directory (`--state-dir`), lists every
//! interface the CNI plugin asked for. It is written whole on every change, to a
//! temporary file renamed over the old one, so that a crash leaves either the old or the
//! new list, never half of one. A file that does not parse is moved aside
//! ([`BAD_SUFFIX`]) and the agent starts with no attachments.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// The state file's name in the state directory.
pub const FILE_NAME: &str = "attachments.json";
/// What a state file that does not parse is renamed to (appended to its name).
pub const BAD_SUFFIX: &str = ".bad";
/// The format written; a file of another version is refused as corrupt.
pub const VERSION: u32 = 1;

/// One pod interface the CNI plugin asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attachment {
    /// The container ID of the ADD.
    pub container_id: String,
    /// The interface's name in the pod (`eth0`).
    pub ifname: String,
    /// The pod's namespace.
    pub pod_namespace: String,
    /// The pod's name.
    pub pod_name: String,
    /// The `ip netns` name of the pod's network namespace.
    pub netns: String,
    /// The name was made by the agent (`ip netns attach`) and goes with the pod.
    pub named_here: bool,
    /// The pod's addresses with prefix lengths.
    pub addresses: Vec<IpNet>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    version: u32,
    attachments: Vec<Attachment>,
}

/// What [`load`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Loaded {
    /// No state file: a first start.
    Missing,
    /// The attachments recorded.
    Attachments(Vec<Attachment>),
    /// The file did not parse; it was moved to `moved_to` (None when that failed too).
    Corrupt {
        error: String,
        moved_to: Option<PathBuf>,
    },
}

/// The state file of directory `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// Reads the attachments recorded in `dir`. A file that does not parse is moved aside
/// (to `attachments.json.bad`) so that the next write starts afresh; an error reading
/// it at all (permissions) is returned.
pub fn load(dir: &Path) -> io::Result<Loaded> {
    let file = path(dir);
    let text = match fs::read(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Loaded::Missing),
        Err(e) => return Err(e),
    };
    match parse(&text) {
        Ok(a) => Ok(Loaded::Attachments(a)),
        Err(error) => {
            let mut bad = file.clone().into_os_string();
            bad.push(BAD_SUFFIX);
            let bad = PathBuf::from(bad);
            let moved_to = fs::rename(&file, &bad).ok().map(|()| bad);
            Ok(Loaded::Corrupt { error, moved_to })
        }
    }
}

/// Parses a state file's contents.
pub fn parse(text: &[u8]) -> Result<Vec<Attachment>, String> {
    let f: File = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    if f.version != VERSION {
        return Err(format!(
            "version {} (this agent reads version {VERSION})",
            f.version
        ));
    }
    Ok(f.attachments)
}

/// Writes `attachments` as the state of `dir` (created if missing): to a temporary file
/// in `dir`, flushed to disk, then renamed over the state file.
pub fn save(dir: &Path, attachments: &[Attachment]) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let text = serde_json::to_vec_pretty(&File {
        version: VERSION,
        attachments: attachments.to_vec(),
    })
    .map_err(io::Error::other)?;
    let tmp = dir.join(format!(".{FILE_NAME}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&text)?;
        f.sync_all()
    })();
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path(dir))) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn web() -> Attachment {
        Attachment {
            container_id: "c0ffee".into(),
            ifname: "eth0".into(),
            pod_namespace: "default".into(),
            pod_name: "web".into(),
            netns: "cni-1234".into(),
            named_here: false,
            addresses: vec![
                "10.244.1.5/24".parse().unwrap(),
                "fd00::5/64".parse().unwrap(),
            ],
        }
    }

    #[test]
    fn test_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), Loaded::Missing);
        let db = Attachment {
            container_id: "d00d".into(),
            pod_name: "db".into(),
            netns: "ferry-d00d".into(),
            named_here: true,
            ..web()
        };
        save(dir.path(), &[web(), db.clone()]).unwrap();
        assert_eq!(
            load(dir.path()).unwrap(),
            Loaded::Attachments(vec![web(), db])
        );
        save(dir.path(), &[]).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Loaded::Attachments(vec![]));
    }

    #[test]
    fn test_save_replaces_the_file_whole_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("state");
        save(&sub, &[web()]).unwrap();
        let before = fs::metadata(path(&sub)).unwrap();
        save(&sub, &[]).unwrap();
        let names: Vec<String> = fs::read_dir(&sub)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, [FILE_NAME], "only the state file remains");
        // Renamed over, not rewritten in place: a new inode.
        use std::os::unix::fs::MetadataExt;
        assert_ne!(before.ino(), fs::metadata(path(&sub)).unwrap().ino());
    }

    #[test]
    fn test_corrupt_file_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(path(dir.path()), b"{\"version\": 1, \"attachments\": [{").unwrap();
        match load(dir.path()).unwrap() {
            Loaded::Corrupt { error, moved_to } => {
                assert!(error.contains("EOF"), "{error}");
                let bad = moved_to.expect("moved");
                assert_eq!(bad, dir.path().join("attachments.json.bad"));
                assert!(bad.exists());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(load(dir.path()).unwrap(), Loaded::Missing);
    }

    #[test]
    fn test_parse_refuses_other_versions_and_bad_fields() {
        assert!(parse(br#"{"version": 2, "attachments": []}"#).is_err());
        assert!(parse(br#"{"version": 1}"#).is_err());
        let bad_addr = br#"{"version": 1, "attachments": [{"container_id": "c",
            "ifname": "eth0", "pod_namespace": "d", "pod_name": "w", "netns": "n",
            "named_here": false, "addresses": ["10.0.0.1"]}]}"#;
        assert!(parse(bad_addr).is_err());
        assert_eq!(parse(br#"{"version": 1, "attachments": []}"#), Ok(vec![]));
    }
}
