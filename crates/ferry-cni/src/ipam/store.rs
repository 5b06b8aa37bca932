//! Leases on disk, in host-local's layout, so that either can read the other's
//! directory:
//!
//! ```text
//! DATA_DIR/NETWORK/
//!   lock                  flock(2)ed while the directory is read or changed
//!   10.244.1.2            a lease: "CONTAINER_ID\r\nIFNAME"
//!   fd00:10:244:1::2
//!   last_reserved_ip.0    the address last handed out from range set 0
//!   last_reserved_ip.1
//! ```
//!
//! A lease is taken by creating its file with `O_EXCL`, so even without the lock two
//! processes could not both take one address; the lock makes the whole allocation
//! (reading `last_reserved_ip`, trying addresses, writing it back) one step, so that
//! concurrent ADDs hand addresses out in order.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ferry_api::Attachment;

const LOCK: &str = "lock";
const LAST_RESERVED: &str = "last_reserved_ip.";
/// host-local's line break between the container ID and the interface name.
const LINE_BREAK: &str = "\r\n";

/// One network's lease directory.
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

/// One leased address and whom it is leased to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The address (the file's name).
    pub ip: IpAddr,
    /// The attachment holding it; `None` when the file does not say (left half written
    /// by a crash, or written by something else).
    pub owner: Option<Attachment>,
}

impl Store {
    /// The directory of `network` under `data_dir`, created if missing.
    pub fn open(data_dir: &Path, network: &str) -> io::Result<Store> {
        let dir = data_dir.join(network);
        fs::create_dir_all(&dir)?;
        Ok(Store { dir })
    }

    /// The directory of `network` under `data_dir` if it exists: commands that only
    /// release or read leases have nothing to do without it, and need not make it.
    pub fn existing(data_dir: &Path, network: &str) -> io::Result<Option<Store>> {
        let dir = data_dir.join(network);
        match fs::metadata(&dir) {
            Ok(m) if m.is_dir() => Ok(Some(Store { dir })),
            Ok(_) => Err(io::Error::other(format!(
                "{} is not a directory",
                dir.display()
            ))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Waits for the directory's lock; it is held until the returned value drops.
    pub fn lock(&self) -> io::Result<Leases<'_>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(self.dir.join(LOCK))?;
        // flock(2): held by this open file, so threads of one process exclude each
        // other as separate processes do; closing the file releases it.
        file.lock()?;
        Ok(Leases {
            dir: &self.dir,
            _lock: file,
        })
    }
}

/// The lease directory, locked.
#[derive(Debug)]
pub struct Leases<'a> {
    dir: &'a Path,
    _lock: File,
}

impl Leases<'_> {
    /// Every lease, in no particular order.
    pub fn list(&self) -> io::Result<Vec<Lease>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(self.dir)? {
            let entry = entry?;
            let Some(ip) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<IpAddr>().ok())
            else {
                continue;
            };
            let owner = match fs::read_to_string(entry.path()) {
                Ok(text) => parse_owner(&text),
                // Released between read_dir and here: only by someone not taking the
                // lock, but not ours to fail on.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            out.push(Lease { ip, owner });
        }
        Ok(out)
    }

    /// The addresses leased to `who`.
    pub fn held_by(&self, who: &Attachment) -> io::Result<Vec<IpAddr>> {
        Ok(self
            .list()?
            .into_iter()
            .filter(|l| l.owner.as_ref() == Some(who))
            .map(|l| l.ip)
            .collect())
    }

    /// Leases `ip` to `who` unless it is leased already (then `false`), and records it
    /// as the last address handed out from range set `set`.
    pub fn reserve(&self, ip: IpAddr, who: &Attachment, set: usize) -> io::Result<bool> {
        let path = self.dir.join(ip.to_string());
        let mut file = match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(e),
        };
        let written = file
            .write_all(format!("{}{LINE_BREAK}{}", who.container_id, who.ifname).as_bytes())
            .and_then(|()| file.sync_all());
        if let Err(e) = written {
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        // Only a hint for the next allocation's starting point: host-local goes on
        // without it too.
        let _ = fs::write(
            self.dir.join(format!("{LAST_RESERVED}{set}")),
            ip.to_string(),
        );
        Ok(true)
    }

    /// Ends the lease of `ip`; `false` if there was none.
    pub fn release(&self, ip: IpAddr) -> io::Result<bool> {
        match fs::remove_file(self.dir.join(ip.to_string())) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The address last handed out from range set `set`, if recorded and readable.
    pub fn last_reserved(&self, set: usize) -> Option<IpAddr> {
        fs::read_to_string(self.dir.join(format!("{LAST_RESERVED}{set}")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

/// `CONTAINER_ID\r\nIFNAME`, as host-local writes it (a bare `\n` is taken too).
fn parse_owner(text: &str) -> Option<Attachment> {
    let mut lines = text.lines().map(str::trim);
    let container_id = lines.next().filter(|l| !l.is_empty())?;
    let ifname = lines.next().filter(|l| !l.is_empty())?;
    if lines.any(|l| !l.is_empty()) {
        return None;
    }
    Some(Attachment {
        container_id: container_id.to_string(),
        ifname: ifname.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(id: &str, ifname: &str) -> Attachment {
        Attachment {
            container_id: id.into(),
            ifname: ifname.into(),
        }
    }

    #[test]
    fn test_lease_files_are_written_as_host_local_writes_them() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), "ferry").unwrap();
        let leases = store.lock().unwrap();
        let ip: IpAddr = "fd00::2".parse().unwrap();
        assert!(leases.reserve(ip, &who("c1", "eth0"), 1).unwrap());
        let dir = tmp.path().join("ferry");
        assert_eq!(
            fs::read_to_string(dir.join("fd00::2")).unwrap(),
            "c1\r\neth0"
        );
        assert_eq!(
            fs::read_to_string(dir.join("last_reserved_ip.1")).unwrap(),
            "fd00::2"
        );
        assert!(dir.join("lock").exists());
    }

    #[test]
    fn test_an_address_is_leased_once() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), "ferry").unwrap();
        let leases = store.lock().unwrap();
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        assert!(leases.reserve(ip, &who("c1", "eth0"), 0).unwrap());
        assert!(!leases.reserve(ip, &who("c2", "eth0"), 0).unwrap());
        assert_eq!(leases.held_by(&who("c1", "eth0")).unwrap(), [ip]);
        assert_eq!(
            leases.held_by(&who("c2", "eth0")).unwrap(),
            Vec::<IpAddr>::new()
        );
        assert!(leases.release(ip).unwrap());
        assert!(!leases.release(ip).unwrap());
        assert!(leases.reserve(ip, &who("c2", "eth0"), 0).unwrap());
    }

    #[test]
    fn test_listing_reads_owners_and_skips_other_files() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), "ferry").unwrap();
        let dir = store.dir().to_path_buf();
        fs::write(dir.join("10.0.0.2"), "c1\r\neth0").unwrap();
        fs::write(dir.join("10.0.0.3"), "c2\neth1\n").unwrap();
        fs::write(dir.join("10.0.0.4"), "").unwrap();
        fs::write(dir.join("10.0.0.5"), "only-an-id").unwrap();
        fs::write(dir.join("last_reserved_ip.0"), "10.0.0.5").unwrap();
        fs::write(dir.join("notes.txt"), "c1\r\neth0").unwrap();
        let leases = store.lock().unwrap();
        let mut list = leases.list().unwrap();
        list.sort_by_key(|l| l.ip);
        assert_eq!(
            list,
            [
                Lease {
                    ip: "10.0.0.2".parse().unwrap(),
                    owner: Some(who("c1", "eth0"))
                },
                Lease {
                    ip: "10.0.0.3".parse().unwrap(),
                    owner: Some(who("c2", "eth1"))
                },
                Lease {
                    ip: "10.0.0.4".parse().unwrap(),
                    owner: None
                },
                Lease {
                    ip: "10.0.0.5".parse().unwrap(),
                    owner: None
                },
            ]
        );
        assert_eq!(leases.last_reserved(0), Some("10.0.0.5".parse().unwrap()));
        assert_eq!(leases.last_reserved(1), None);
    }

    #[test]
    fn test_garbled_last_reserved_is_no_hint() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), "ferry").unwrap();
        fs::write(store.dir().join("last_reserved_ip.0"), "10.0.0").unwrap();
        assert_eq!(store.lock().unwrap().last_reserved(0), None);
    }
}
