//! The connection state written to the state directory now and then, so that an agent
//! started after a crash (SIGKILL, OOM, a panic) or a plain stop goes on with the
//! connections its predecessor tracked.
//!
//! A running agent writes its pipeline's state ([`ferry_datapath::handover`]'s format,
//! the one a handover carries) to [`FILE`] in its `--state-dir` every
//! `--checkpoint-interval` (default [`DEFAULT_EVERY`]) and when it stops; a new file is
//! written beside the old one and renamed over it, so a crash while writing leaves the
//! previous checkpoint whole. A starting agent that takes over from no running agent
//! reads the checkpoint, ages it by the time since it was written (the file's
//! modification time), and restores it as a stale state: what expired meanwhile goes,
//! and TCP connections learn their windows again, as a connection picked up mid-stream
//! does, keeping their NAT, marks and tunnel peer. So a NATed connection survives a
//! crash even when the first packet after it is a reply, which no pickup could
//! translate. Connections younger than the last checkpoint are picked up as without one
//! (and endpoints chosen again by consistent hashing).
//!
//! A checkpoint that cannot be read or restored is moved aside (`.refused`), with a log
//! line saying why, and the agent starts cold; one of another node is refused too.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The checkpoint's file name in the state directory.
pub const FILE: &str = "datapath.state";

/// How often a running agent writes its checkpoint unless told otherwise.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(1);

/// The checkpoint file of state directory `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// Writes `bytes` as the checkpoint of `dir`, whole or not at all.
pub fn write(dir: &Path, bytes: &[u8]) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{FILE}.new"));
    fs::write(&tmp, bytes)?;
    fs::rename(&tmp, path(dir))
}

/// A checkpoint read back: its bytes and how long ago it was written.
#[derive(Debug)]
pub struct Read {
    /// The state's bytes.
    pub bytes: Vec<u8>,
    /// Since it was written (zero for a file from the future: a clock set back).
    pub age: Duration,
}

/// The checkpoint of `dir`, if there is one.
pub fn read(dir: &Path) -> io::Result<Option<Read>> {
    let p = path(dir);
    let bytes = match fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let written = fs::metadata(&p)?.modified()?;
    let age = SystemTime::now()
        .duration_since(written)
        .unwrap_or(Duration::ZERO);
    Ok(Some(Read { bytes, age }))
}

/// Moves a checkpoint that was refused aside, where it stays for a look; returns where.
pub fn move_aside(dir: &Path) -> io::Result<PathBuf> {
    let to = dir.join(format!("{FILE}.refused"));
    fs::rename(path(dir), &to)?;
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_written_whole_read_back_with_its_age_and_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("state");
        assert!(read(&d).unwrap().is_none(), "no checkpoint yet");
        write(&d, b"first").unwrap();
        write(&d, b"second").unwrap();
        let r = read(&d).unwrap().unwrap();
        assert_eq!(r.bytes, b"second");
        assert!(r.age < Duration::from_secs(5), "{:?}", r.age);
        assert!(
            !d.join(format!("{FILE}.new")).exists(),
            "the new file was renamed"
        );
        let aside = move_aside(&d).unwrap();
        assert_eq!(fs::read(aside).unwrap(), b"second");
        assert!(read(&d).unwrap().is_none());
    }
}
