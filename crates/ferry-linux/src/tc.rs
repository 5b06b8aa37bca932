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
//! The guard holds on to the device by its index, not its name: a renamed device still
//! loses ferry's filter at removal, and a device deleted and made again under the same
//! name is left alone. Removal failures in drop are logged.
//!
//! Only the filter ferry added is ever deleted (by preference, handle and kind), and
//! only once it was added; the `clsact` qdisc ferry created goes too when no filter of
//! another owner is left on it, on either hook.
//!
//! Either filter is ferry's by its identity: preference [`PREF`] and handle [`HANDLE`]
//! on the ingress hook, kind `matchall` or `bpf`. A filter with that identity found at
//! install is the leftover of a ferry that died without cleaning up (SIGKILL, a crash):
//! it is taken over, not treated as a conflict.
//!
//! It runs `tc` (package iproute2): installed once per uplink, never on the packet path.

use std::fs::File;
use std::io;

use serde_json::Value;

use crate::cmd;
use crate::netns;

/// The filter's preference (priority) on the ingress hook: 254, low enough to run before
/// the filters tools add without a preference (49152 and below), and a number kept for
/// ferry so that its filter is recognisable.
pub const PREF: u32 = 0xfe;

/// The filter's handle within [`PREF`]: `0xfe77`.
pub const HANDLE: u32 = 0xfe77;

/// A drop-everything filter on a device's ingress, removed on drop.
#[derive(Debug)]
pub struct IngressDrop {
    dev: String,
    ifindex: u32,
    ns: Option<File>,
    created_qdisc: bool,
    /// `matchall` or `bpf`.
    kind: String,
}

fn tc(args: &[&str]) -> io::Result<String> {
    Ok(cmd::run("tc", args)?)
}

/// The index of device `dev` in the calling thread's network namespace.
fn ifindex(dev: &str) -> io::Result<u32> {
    let cname = std::ffi::CString::new(dev)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in device name"))?;
    // SAFETY: `cname` is a valid NUL-terminated string that outlives the call.
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if index == 0 {
        return Err(io::Error::new(
            io::Error::last_os_error().kind(),
            format!("no device {dev}: {}", io::Error::last_os_error()),
        ));
    }
    Ok(index)
}

/// The name of the device with index `index` in the calling thread's network namespace,
/// or None when there is none.
fn ifname(index: u32) -> io::Result<Option<String>> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has room for IF_NAMESIZE bytes, the most `if_indextoname` writes
    // (name and NUL); it lives until the call returns.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
    if p.is_null() {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) | Some(libc::ENODEV) => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: on success `buf` holds a NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(Some(name.to_string_lossy().into_owned()))
}

/// The filters on `dev`'s `hook` (`ingress` or `egress`), as `tc -j filter show` lists
/// them.
fn filters(dev: &str, hook: &str) -> io::Result<Vec<Value>> {
    let out = tc(&["-j", "filter", "show", "dev", dev, hook])?;
    if out.trim().is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_str(&out)
        .map_err(|e| io::Error::other(format!("`tc -j filter show dev {dev} {hook}`: {e}")))
}

/// Deletes the `clsact` qdisc of `dev` if neither of its hooks has a filter left.
fn del_clsact_if_empty(dev: &str) -> io::Result<()> {
    if filters(dev, "ingress")?.is_empty() && filters(dev, "egress")?.is_empty() {
        tc(&["qdisc", "del", "dev", dev, "clsact"])?;
    } else {
        tracing::info!(
            dev,
            "leaving the clsact qdisc ferry added in place: other filters are on it"
        );
    }
    Ok(())
}

/// Deletes ferry's filter, of `kind`, from `dev`'s ingress, and nothing else.
fn del_own_filter(dev: &str, kind: &str) -> io::Result<()> {
    let pref = PREF.to_string();
    let handle = format!("{HANDLE:#x}");
    tc(&[
        "filter", "del", "dev", dev, "ingress", "pref", &pref, "handle", &handle, "protocol",
        "all", kind,
    ])
    .map(drop)
}

/// The kind (`matchall` or `bpf`) of the filter with ferry's identity among `filters`.
fn own_filter(filters: &[Value]) -> Option<String> {
    filters.iter().find_map(|f| {
        let kind = f.get("kind")?.as_str()?;
        let handle = f.get("options")?.get("handle")?.as_str()?;
        let handle = u32::from_str_radix(handle.strip_prefix("0x")?, 16).ok()?;
        (f.get("pref")?.as_u64()? == u64::from(PREF)
            && handle == HANDLE
            && matches!(kind, "matchall" | "bpf"))
        .then(|| kind.to_string())
    })
}

impl IngressDrop {
    /// Installs the filter on `dev` in the calling thread's network namespace, or takes
    /// over one with ferry's identity already there (left by a ferry that died). Fails if
    /// another owner's filter sits at [`PREF`] in a way that excludes ferry's.
    pub fn install(dev: &str) -> io::Result<IngressDrop> {
        let ns = netns::current()?;
        let ifindex = ifindex(dev)?;
        // An existing clsact (e.g. of another dataplane) is shared, not replaced.
        let created_qdisc = tc(&["qdisc", "add", "dev", dev, "clsact"]).is_ok();
        let guard = |kind: &str| IngressDrop {
            dev: dev.to_string(),
            ifindex,
            ns: Some(ns),
            created_qdisc,
            kind: kind.to_string(),
        };
        if !created_qdisc && let Some(kind) = own_filter(&filters(dev, "ingress")?) {
            tracing::info!(
                dev,
                kind,
                pref = PREF,
                handle = format_args!("{HANDLE:#x}"),
                "taking over the ingress drop filter a previous ferry left on the device"
            );
            return Ok(guard(&kind));
        }
        let pref = PREF.to_string();
        let handle = format!("{HANDLE:#x}");
        let base = [
            "filter", "add", "dev", dev, "ingress", "pref", &pref, "handle", &handle, "protocol",
            "all",
        ];
        let matchall = [&base[..], &["matchall", "action", "drop"]].concat();
        let bpf = [&base[..], &["bpf", "da", "bytecode", "1,6 0 0 2"]].concat();
        let kind = match tc(&matchall) {
            Ok(_) => "matchall",
            Err(first) => match tc(&bpf) {
                Ok(_) => "bpf",
                Err(e) => {
                    // Nothing of ferry's was added: only the qdisc, if it made it.
                    if created_qdisc && let Err(e) = del_clsact_if_empty(dev) {
                        tracing::warn!(dev, "removing the clsact qdisc ferry added: {e}");
                    }
                    return Err(io::Error::other(format!(
                        "ingress drop filter on {dev}: {first}; fallback: {e}"
                    )));
                }
            },
        };
        Ok(guard(kind))
    }

    /// The device's name at install.
    pub fn dev(&self) -> &str {
        &self.dev
    }

    /// The device's index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Removes the filter (and the clsact qdisc if this guard added it and no other
    /// filter is on it).
    pub fn remove(mut self) -> io::Result<()> {
        self.remove_now()
    }

    fn remove_now(&mut self) -> io::Result<()> {
        let Some(ns) = self.ns.take() else {
            return Ok(());
        };
        let installed_on = self.dev.clone();
        let index = self.ifindex;
        let created_qdisc = self.created_qdisc;
        let kind = self.kind.clone();
        // `tc` inherits the namespace of the thread that runs it: use one that is in the
        // namespace where the filter was installed.
        netns::spawn_in_file(ns, move || {
            // The device by its index: renamed since, or gone (and its filter with it, even
            // if another device now has its name).
            let Some(dev) = ifname(index)? else {
                tracing::info!(
                    dev = installed_on,
                    ifindex = index,
                    "the device is gone, and ferry's ingress filter with it"
                );
                return Ok(());
            };
            if dev != installed_on {
                tracing::info!(
                    dev,
                    ifindex = index,
                    was = installed_on,
                    "removing ferry's ingress filter from the renamed device"
                );
            }
            del_own_filter(&dev, &kind)?;
            if created_qdisc {
                del_clsact_if_empty(&dev)?;
            }
            Ok(())
        })?
        .join()
        .map_err(|_| io::Error::other("tc thread panicked"))??
    }
}

impl Drop for IngressDrop {
    fn drop(&mut self) {
        if let Err(e) = self.remove_now() {
            tracing::warn!(
                dev = self.dev,
                ifindex = self.ifindex,
                "removing ferry's ingress drop filter: {e}"
            );
        }
    }
}
