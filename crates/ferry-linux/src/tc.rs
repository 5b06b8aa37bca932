//! Keeping the host kernel from processing what ferry takes off an uplink.
//!
//! ferry reads the uplink through an AF_PACKET socket, which sees a frame as the device
//! receives it, before traffic control's ingress hook. An [`IngressDrop`] adds a `clsact`
//! qdisc with a drop-everything filter on the device's ingress, so the kernel's own
//! stack (IP, ARP, bridges, netfilter) never sees those frames while ferry still does.
//!
//! The filter is `matchall action drop` where the kernel has the matchall classifier and
//! the gact action; kernels built without them (small VM kernels) often still have the
//! BPF classifier, so the fallback is `bpf da bytecode "1,6 0 0 2"`: a one-instruction
//! classic BPF program in direct-action mode returning `TC_ACT_SHOT` (2).
//! What ferry sends with `PACKET_QDISC_BYPASS` goes straight to the driver and is not
//! affected. Dropping the guard removes the filter again, in the namespace where it was
//! installed, whichever thread drops it.
//!
//! It runs `tc` (package iproute2): installed once per uplink, never on the packet path.

use std::fs::File;
use std::io;

use crate::link::run;
use crate::netns;

/// The filter's priority on the ingress hook: first, ahead of anything else there.
pub const PREF: &str = "1";

/// A drop-everything filter on a device's ingress, removed on drop.
#[derive(Debug)]
pub struct IngressDrop {
    dev: String,
    ns: Option<File>,
    created_qdisc: bool,
}

fn tc(args: &[&str]) -> io::Result<String> {
    run("tc", "iproute2", args)
}

impl IngressDrop {
    /// Installs the filter on `dev` in the calling thread's network namespace. Fails if
    /// a filter already sits at [`PREF`] (someone else's, or a leftover of a crashed run;
    /// `tc filter del dev DEV ingress pref 1` removes it).
    pub fn install(dev: &str) -> io::Result<IngressDrop> {
        let ns = netns::current()?;
        // An existing clsact (e.g. of another dataplane) is shared, not replaced.
        let created_qdisc = tc(&["qdisc", "add", "dev", dev, "clsact"]).is_ok();
        let guard = IngressDrop {
            dev: dev.to_string(),
            ns: Some(ns),
            created_qdisc,
        };
        let base = ["filter", "add", "dev", dev, "ingress", "pref", PREF];
        let matchall = [&base[..], &["matchall", "action", "drop"]].concat();
        let bpf = [
            &base[..],
            &["protocol", "all", "bpf", "da", "bytecode", "1,6 0 0 2"],
        ]
        .concat();
        if let Err(first) = tc(&matchall) {
            tc(&bpf).map_err(|e| {
                io::Error::other(format!(
                    "ingress drop filter on {dev}: {first}; fallback: {e}"
                ))
            })?;
        }
        Ok(guard)
    }

    /// The device.
    pub fn dev(&self) -> &str {
        &self.dev
    }

    /// Removes the filter (and the clsact qdisc if this guard added it).
    pub fn remove(mut self) -> io::Result<()> {
        self.remove_now()
    }

    fn remove_now(&mut self) -> io::Result<()> {
        let Some(ns) = self.ns.take() else {
            return Ok(());
        };
        let dev = self.dev.clone();
        let created_qdisc = self.created_qdisc;
        // `tc` inherits the namespace of the thread that runs it: use one that is in the
        // namespace where the filter was installed.
        netns::spawn_in_file(ns, move || {
            if created_qdisc {
                tc(&["qdisc", "del", "dev", &dev, "clsact"]).map(drop)
            } else {
                tc(&["filter", "del", "dev", &dev, "ingress", "pref", PREF]).map(drop)
            }
        })?
        .join()
        .map_err(|_| io::Error::other("tc thread panicked"))??
    }
}

impl Drop for IngressDrop {
    fn drop(&mut self) {
        // The device may be gone already (its namespace deleted): nothing left to undo.
        let _ = self.remove_now();
    }
}
