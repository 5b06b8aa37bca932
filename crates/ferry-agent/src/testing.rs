//! Helpers of the unit tests that need a network namespace of their own (root and
//! iproute2).

use std::panic;

/// A network namespace made for one test (named after `tag` and the process), with its
/// loopback up; deleted when dropped, also when the test fails.
pub(crate) struct Netns(pub(crate) String);

impl Netns {
    pub(crate) fn new(tag: &str) -> Netns {
        let name = format!("ferry-{tag}-{}", std::process::id());
        ferry_linux::link::ip(&["netns", "add", &name])
            .unwrap_or_else(|e| panic!("making network namespace {name} (needs root): {e}"));
        let ns = Netns(name);
        ferry_linux::link::ip(&["-n", &ns.0, "link", "set", "lo", "up"]).unwrap();
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ferry_linux::link::ip(&["netns", "delete", &self.0]);
    }
}

/// Runs `f` on a thread inside a new network namespace, which is deleted afterwards; a
/// panic of `f` is the caller's.
pub(crate) fn in_netns<T: Send + 'static>(tag: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = Netns::new(tag);
    let r = ferry_linux::netns::spawn_in(&ns.0, f)
        .unwrap()
        .join()
        .map(|entered| entered.unwrap_or_else(|e| panic!("entering {}: {e}", ns.0)));
    drop(ns);
    r.unwrap_or_else(|p| panic::resume_unwind(p))
}
