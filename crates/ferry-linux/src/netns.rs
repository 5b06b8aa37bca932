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
/// Longest namespace name: one file name (`NAME_MAX`).
pub const MAX_NAME_LEN: usize = 255;

/// The path of the named network namespace.
///
/// `InvalidInput` unless `name` is one file name in [`NETNS_RUN_DIR`]: not empty, at
/// most [`MAX_NAME_LEN`] bytes, no `/` or NUL, and not `.` or `..`. Without that check a
/// name like `../../proc/1/ns/net` would open another file than a named namespace.
pub fn path(name: &str) -> io::Result<PathBuf> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.contains('/')
        && !name.contains('\0')
        && name != "."
        && name != "..";
    if !valid {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid network namespace name {name:?}"),
        ));
    }
    Ok(PathBuf::from(NETNS_RUN_DIR).join(name))
}

/// Spawns a thread that enters network namespace `name` and then runs `f`.
///
/// `Err` at once for a name that [`path`] refuses or a namespace that cannot be opened.
/// The thread's result is `Err` when the namespace cannot be entered (the process lacks
/// CAP_SYS_ADMIN); `f` does not run then. The namespace descriptor is closed as soon as
/// the thread has entered it, so it is not held while `f` runs.
pub fn spawn_in<F, T>(name: &str, f: F) -> io::Result<JoinHandle<io::Result<T>>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let ns = File::open(path(name)?)
        .map_err(|e| io::Error::new(e.kind(), format!("network namespace {name}: {e}")))?;
    spawn_entering(ns, format!("netns-{name}"), f)
}

/// The thread of [`spawn_in`], for a namespace already open as `ns`.
fn spawn_entering<F, T>(
    ns: File,
    thread_name: String,
    f: F,
) -> io::Result<JoinHandle<io::Result<T>>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    thread::Builder::new().name(thread_name).spawn(move || {
        let entered = enter_this_thread(&ns);
        // Entered or not, the descriptor has served: `f` may run for the life of the
        // process and must not keep the namespace file open.
        drop(ns);
        entered?;
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
    fn test_path_accepts_plain_names() {
        assert_eq!(path("pod-a").unwrap(), PathBuf::from("/run/netns/pod-a"));
        assert_eq!(path("..x").unwrap(), PathBuf::from("/run/netns/..x"));
        let longest = "n".repeat(MAX_NAME_LEN);
        assert!(path(&longest).is_ok());
    }

    #[test]
    fn test_path_refuses_names_that_are_not_one_file_name() {
        let long = "n".repeat(MAX_NAME_LEN + 1);
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "/run/netns/x",
            "x/",
            "a\0b",
            &long,
        ] {
            let e = path(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
        // spawn_in refuses before opening anything.
        let e = spawn_in("../../proc/self/ns/net", || ()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn test_spawn_in_missing_namespace_fails() {
        let e = spawn_in("ferry-no-such-namespace", || ()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("ferry-no-such-namespace"));
    }

    #[test]
    fn test_spawn_in_own_namespace_runs_the_closure_with_the_fd_closed() {
        // Our own namespace through /proc: the path differs but setns works the same. No
        // other test opens a namespace file, so the descriptor number cannot be reused by
        // one while the closure looks at it.
        let me = File::open("/proc/self/ns/net").unwrap();
        let fd = me.as_raw_fd();
        let h = spawn_entering(me, "netns-test".into(), move || {
            let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok();
            (7, link)
        })
        .unwrap();
        let (v, link) = h.join().unwrap().unwrap();
        assert_eq!(v, 7);
        assert!(
            link.as_ref()
                .is_none_or(|l| !l.to_string_lossy().starts_with("net:")),
            "namespace descriptor still open in the closure: {link:?}"
        );
    }
}
