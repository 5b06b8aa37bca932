//! Pod addresses with host-local's semantics: one address per address family from the
//! node's pod CIDRs, leases in files named by the address, handed out round-robin
//! after the last one given, released by container ID and interface name.
//!
//! [`range`] says which addresses a subnet offers and in what order; [`store`] keeps
//! the leases on disk under a lock. The functions here combine them under one lock
//! each.

pub mod range;
pub mod store;

use std::io;
use std::net::IpAddr;

use ferry_api::Attachment;
use ipnet::IpNet;

use crate::error::{Error, code};
use range::RangeSet;
use store::{Leases, Store};

/// The addresses of one attachment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// One address per range set, with its subnet's prefix length, in the order of the
    /// sets.
    pub addresses: Vec<IpNet>,
    /// Those this allocation leased (the others were the attachment's already): what
    /// to release if the ADD fails after all.
    pub taken: Vec<IpAddr>,
}

/// Leases one address from each of `sets` to `who`.
///
/// An attachment that holds an address in a set already keeps it, so that an ADD
/// repeated for the same container and interface (a runtime retrying after the plugin
/// was killed, say) gets the addresses it had rather than a second pair. When a set
/// has no free address, nothing taken by this call stays taken.
pub fn allocate(store: &Store, sets: &[RangeSet], who: &Attachment) -> Result<Allocation, Error> {
    let leases = lock(store)?;
    let held = leases.held_by(who).map_err(|e| io_error(store, e))?;
    let mut alloc = Allocation {
        addresses: Vec::new(),
        taken: Vec::new(),
    };
    for (i, set) in sets.iter().enumerate() {
        if let Some((ip, range)) = held
            .iter()
            .find_map(|ip| set.range_for(*ip).map(|r| (*ip, r)))
        {
            alloc.addresses.push(range.address(ip));
            continue;
        }
        match take_one(&leases, set, i, who) {
            Ok(Some(address)) => {
                alloc.taken.push(address.addr());
                alloc.addresses.push(address);
            }
            Ok(None) => {
                undo(&leases, &alloc.taken);
                let subnets: Vec<String> = set
                    .ranges()
                    .iter()
                    .map(|r| r.subnet().to_string())
                    .collect();
                return Err(Error::new(
                    code::NO_FREE_ADDRESS,
                    format!("no free address in {}", subnets.join(", ")),
                    format!(
                        "every address of the node's pod CIDR is leased (leases in {})",
                        store.dir().display()
                    ),
                ));
            }
            Err(e) => {
                undo(&leases, &alloc.taken);
                return Err(io_error(store, e));
            }
        }
    }
    Ok(alloc)
}

/// The first free address of `set` in host-local's order, leased to `who`.
fn take_one(
    leases: &Leases<'_>,
    set: &RangeSet,
    index: usize,
    who: &Attachment,
) -> io::Result<Option<IpNet>> {
    for (ip, range) in set.candidates(leases.last_reserved(index)) {
        if leases.reserve(ip, who, index)? {
            return Ok(Some(range.address(ip)));
        }
    }
    Ok(None)
}

fn undo(leases: &Leases<'_>, taken: &[IpAddr]) {
    for ip in taken {
        // Best effort: the error being reported matters more than a second one.
        let _ = leases.release(*ip);
    }
}

/// Ends the leases in `addresses` (those an ADD took before failing).
pub fn release_addresses(store: &Store, addresses: &[IpAddr]) -> Result<(), Error> {
    let leases = lock(store)?;
    for ip in addresses {
        leases.release(*ip).map_err(|e| io_error(store, e))?;
    }
    Ok(())
}

/// Ends every lease of `who`; returns the addresses released (none is no error: DEL
/// may come twice).
pub fn release(store: &Store, who: &Attachment) -> Result<Vec<IpAddr>, Error> {
    let leases = lock(store)?;
    let held = leases.held_by(who).map_err(|e| io_error(store, e))?;
    for ip in &held {
        leases.release(*ip).map_err(|e| io_error(store, e))?;
    }
    Ok(held)
}

/// The addresses leased to `who`.
pub fn held_by(store: &Store, who: &Attachment) -> Result<Vec<IpAddr>, Error> {
    lock(store)?.held_by(who).map_err(|e| io_error(store, e))
}

/// Ends every lease whose owner is not in `valid`, and those whose file names no owner
/// (left by a crash halfway through writing one); returns the addresses released. A
/// lease that cannot be removed does not stop the others: the first such error is
/// returned once all were tried.
pub fn gc(store: &Store, valid: &[Attachment]) -> Result<Vec<IpAddr>, Error> {
    let leases = lock(store)?;
    let mut released = Vec::new();
    let mut first_error = None;
    for lease in leases.list().map_err(|e| io_error(store, e))? {
        if lease.owner.as_ref().is_some_and(|o| valid.contains(o)) {
            continue;
        }
        match leases.release(lease.ip) {
            Ok(_) => released.push(lease.ip),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        None => Ok(released),
        Some(e) => Err(io_error(store, e)),
    }
}

fn lock(store: &Store) -> Result<Leases<'_>, Error> {
    store.lock().map_err(|e| io_error(store, e))
}

/// An I/O error of the lease directory.
pub fn io_error(store: &Store, e: io::Error) -> Error {
    Error::new(
        code::IO_FAILURE,
        format!("lease directory {}", store.dir().display()),
        e.to_string(),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::fs;
    use std::sync::{Arc, Barrier};

    use super::*;

    fn who(id: &str) -> Attachment {
        Attachment {
            container_id: id.into(),
            ifname: "eth0".into(),
        }
    }

    fn sets(cidrs: &[&str]) -> Vec<RangeSet> {
        let nets: Vec<IpNet> = cidrs.iter().map(|c| c.parse().unwrap()).collect();
        RangeSet::by_family(&nets).unwrap()
    }

    fn addrs(a: &Allocation) -> Vec<String> {
        a.addresses.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn test_allocation_goes_in_order_one_address_per_family() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), "ferry").unwrap();
        let sets = sets(&["10.244.1.0/24", "fd00:10:244:1::/64"]);
        let a = allocate(&store, &sets, &who("c1")).unwrap();
        assert_eq!(addrs(&a), ["10.244.1.2/24", "fd00:10:244:1::2/64"]);
        assert_eq!(a.taken.len(), 2);
        let b = allocate(&store, &sets, &who("c2")).unwrap();
        assert_eq!(addrs(&b), ["10.244.1.3/24", "fd00:10:244:1::3/64"]);
        let dir = tmp.path().join("ferry");
        assert_eq!(
            fs::read_to_string(dir.join("last_reserved_ip.0")).unwrap(),
            "10.244.1.3"
        );
        assert_eq!(
            fs::read_to_string(dir.join("last_reserved_ip.1")).unwrap(),
            "fd00:10:244:1::3"
        );
    }

    #[test]
    fn test_an_attachment_keeps_its_addresses_when_added_again() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), "ferry").unwrap();
        let sets = sets(&["10.244.1.0/24"]);
        let first = allocate(&store, &sets, &who("c1")).unwrap();
        let again = allocate(&store, &sets, &who("c1")).unwrap();
        assert_eq!(again.addresses, first.addresses);
        assert!(again.taken.is_empty());
        // Another interface of the same container is another attachment.
        let other = Attachment {
            container_id: "c1".into(),
            ifname: "net1".into(),
        };
        assert_eq!(
            addrs(&allocate(&store, &sets, &other).unwrap()),
            ["10.244.1.3/24"]
        );
    }

    #[test]
    fn test_released_addresses_are_reused_only_after_the_rest() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), "ferry").unwrap();
        let sets = sets(&["10.0.0.0/29"]);
        for c in ["c1", "c2", "c3"] {
            allocate(&store, &sets, &who(c)).unwrap();
        }
        assert_eq!(
            release(&store, &who("c1")).unwrap(),
            ["10.0.0.2".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(release(&store, &who("c1")).unwrap(), Vec::<IpAddr>::new());
        // Round-robin: .5 and .6 come before the released .2.
        let next: Vec<String> = ["c4", "c5", "c6"]
            .iter()
            .map(|c| addrs(&allocate(&store, &sets, &who(c)).unwrap())[0].clone())
            .collect();
        assert_eq!(next, ["10.0.0.5/29", "10.0.0.6/29", "10.0.0.2/29"]);
    }

    #[test]
    fn test_exhaustion_is_an_error_that_leaves_nothing_taken() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), "ferry").unwrap();
        // One IPv4 address (a /30 offers .2 only), plenty of IPv6 ones.
        let sets = sets(&["10.0.0.0/30", "fd00::/64"]);
        allocate(&store, &sets, &who("c1")).unwrap();
        let e = allocate(&store, &sets, &who("c2")).unwrap_err();
        assert_eq!(e.code, code::NO_FREE_ADDRESS);
        assert_eq!(e.msg, "no free address in 10.0.0.0/30");
        assert_eq!(held_by(&store, &who("c2")).unwrap(), Vec::<IpAddr>::new());
        // With the IPv6 set first, its lease is taken, then given back.
        let v6_first = self::sets(&["fd00::/64", "10.0.0.0/30"]);
        let e = allocate(&store, &v6_first, &who("c3")).unwrap_err();
        assert_eq!(e.code, code::NO_FREE_ADDRESS);
        assert_eq!(held_by(&store, &who("c3")).unwrap(), Vec::<IpAddr>::new());
    }

    #[test]
    fn test_a_restart_resumes_after_last_reserved_ip() {
        let tmp = tempfile::tempdir().unwrap();
        let sets = sets(&["10.0.0.0/24"]);
        {
            let store = Store::open(tmp.path(), "ferry").unwrap();
            allocate(&store, &sets, &who("c1")).unwrap();
            allocate(&store, &sets, &who("c2")).unwrap();
            release(&store, &who("c1")).unwrap();
            release(&store, &who("c2")).unwrap();
        }
        // A new process (a new Store) with no lease left: .4, not .2 again.
        let store = Store::open(tmp.path(), "ferry").unwrap();
        assert_eq!(
            addrs(&allocate(&store, &sets, &who("c3")).unwrap()),
            ["10.0.0.4/24"]
        );
        // A last_reserved_ip written by host-local is followed the same way.
        fs::write(tmp.path().join("ferry/last_reserved_ip.0"), "10.0.0.100").unwrap();
        assert_eq!(
            addrs(&allocate(&store, &sets, &who("c4")).unwrap()),
            ["10.0.0.101/24"]
        );
    }

    #[test]
    fn test_gc_releases_what_no_valid_attachment_holds() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), "ferry").unwrap();
        let sets = sets(&["10.0.0.0/24", "fd00::/64"]);
        for c in ["keep", "stale"] {
            allocate(&store, &sets, &who(c)).unwrap();
        }
        // A lease whose file names nobody.
        fs::write(tmp.path().join("ferry/10.0.0.77"), "").unwrap();
        let mut released: Vec<String> = gc(&store, &[who("keep"), who("gone-already")])
            .unwrap()
            .iter()
            .map(IpAddr::to_string)
            .collect();
        released.sort();
        assert_eq!(released, ["10.0.0.3", "10.0.0.77", "fd00::3"]);
        assert_eq!(held_by(&store, &who("keep")).unwrap().len(), 2);
        assert_eq!(
            held_by(&store, &who("stale")).unwrap(),
            Vec::<IpAddr>::new()
        );
        // Nothing valid: everything goes.
        assert_eq!(gc(&store, &[]).unwrap().len(), 2);
    }

    #[test]
    fn test_concurrent_allocations_from_threads_never_collide() {
        let tmp = tempfile::tempdir().unwrap();
        let sets = Arc::new(sets(&["10.0.0.0/26", "fd00::/120"]));
        let threads = 16;
        let per_thread = 3;
        let barrier = Arc::new(Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let dir = tmp.path().to_path_buf();
                let sets = Arc::clone(&sets);
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    // Each thread its own Store and lock file, as separate plugin
                    // processes have.
                    let store = Store::open(&dir, "ferry").unwrap();
                    barrier.wait();
                    (0..per_thread)
                        .map(|i| allocate(&store, &sets, &who(&format!("t{t}-{i}"))).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut seen = BTreeSet::new();
        for h in handles {
            for a in h.join().unwrap() {
                for addr in a.addresses {
                    assert!(seen.insert(addr), "{addr} handed out twice");
                }
            }
        }
        assert_eq!(seen.len(), threads * per_thread * 2);
        // Round-robin under the lock: the IPv4 addresses are exactly the first 48.
        let v4: BTreeSet<String> = seen
            .iter()
            .filter(|a| a.addr().is_ipv4())
            .map(|a| a.addr().to_string())
            .collect();
        let expected: BTreeSet<String> = (2..50).map(|i| format!("10.0.0.{i}")).collect();
        assert_eq!(v4, expected);
    }
}
