//! Running code inside a named network namespace (`ip netns` names, `/run/netns/<name>`).
//!
//! `setns` changes the namespace of the calling thread only. So that no shared thread ever
//! ends up in the wrong namespace, the only way offered here is a dedicated thread that
//! enters the namespace before it runs anything else: sockets it creates belong there.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::thread::{self, JoinHandle};

/// Where `ip netns add` mounts named namespaces.
pub const NETNS_RUN_DIR: &str = "/run/netns";

/// The path of the named network namespace.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from(NETNS_RUN_DIR).join(name)
}

/// Spawns a thread that enters network namespace `name` and then runs `f`.
///
/// The thread's result is `Err` when the namespace cannot be entered (it does not exist,
/// or the process lacks CAP_SYS_ADMIN); `f` does not run then.
pub fn spawn_in<F, T>(name: &str, f: F) -> io::Result<JoinHandle<io::Result<T>>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let ns = File::open(path(name))
        .map_err(|e| io::Error::new(e.kind(), format!("network namespace {name}: {e}")))?;
    thread::Builder::new()
        .name(format!("netns-{name}"))
        .spawn(move || {
            enter_this_thread(&ns)?;
            Ok(f())
        })
}

/// The calling thread's network namespace, open (so that it can be entered later from
/// another thread with [`spawn_in_file`]).
pub fn current() -> io::Result<File> {
    File::open("/proc/thread-self/ns/net")
}

/// Spawns a thread that enters the network namespace open as `ns` and then runs `f`.
pub fn spawn_in_file<F, T>(ns: File, f: F) -> io::Result<JoinHandle<io::Result<T>>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    thread::Builder::new().name("netns".into()).spawn(move || {
        enter_this_thread(&ns)?;
        Ok(f())
    })
}

/// Moves the calling thread into the network namespace open as `ns`. Private: callers
/// get a fresh thread from [`spawn_in`] instead.
fn enter_this_thread(ns: &File) -> io::Result<()> {
    // SAFETY: setns only reads the descriptor, which `ns` keeps open during the call; with
    // CLONE_NEWNET it changes the network namespace of this thread alone, which Rust's
    // runtime and memory model do not depend on.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_spawn_in_missing_namespace_fails() {
        let e = spawn_in("ferry-no-such-namespace", || ()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("ferry-no-such-namespace"));
    }

    #[test]
    fn test_spawn_in_own_namespace_runs_the_closure() {
        // Our own namespace through /proc: the path differs but setns works the same.
        let me = File::open("/proc/self/ns/net").unwrap();
        let h = thread::spawn(move || enter_this_thread(&me).map(|()| 7));
        assert_eq!(h.join().unwrap().unwrap(), 7);
    }
}
