//! CPU affinity: which cores a thread may run on, and pinning a worker to one.

use std::io;
use std::mem::{size_of, zeroed};

/// The CPUs the calling thread may run on (its affinity mask, which a cgroup's cpuset or
/// `taskset` narrows), in increasing order.
pub fn allowed() -> io::Result<Vec<usize>> {
    // SAFETY: an all-zero cpu_set_t is a valid, empty set.
    let mut set: libc::cpu_set_t = unsafe { zeroed() };
    // SAFETY: sched_getaffinity writes at most `size_of::<cpu_set_t>()` bytes into the
    // live, exclusively borrowed set; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let max = 8 * size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads bit `c` of the set, and `c` is below its size in bits.
    Ok((0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Pins the calling thread to CPU `cpu`: from now on it runs there only. A CPU that does
/// not exist or that the thread may not use (outside its cpuset) is refused.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    let max = 8 * size_of::<libc::cpu_set_t>();
    if cpu >= max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {cpu}: at most {max} CPUs are supported"),
        ));
    }
    // SAFETY: an all-zero cpu_set_t is a valid, empty set.
    let mut set: libc::cpu_set_t = unsafe { zeroed() };
    // SAFETY: CPU_SET sets bit `cpu` of the live set, and `cpu` is below its size in bits
    // (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: sched_setaffinity reads `size_of::<cpu_set_t>()` bytes of the live set;
    // pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_thread_pinned_runs_on_that_cpu_only() {
        let cpus = allowed().unwrap();
        assert!(!cpus.is_empty());
        let last = *cpus.last().unwrap();
        let seen = std::thread::spawn(move || {
            pin_current_thread(last).unwrap();
            allowed().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(seen, [last]);
        assert_eq!(allowed().unwrap(), cpus, "other threads keep their mask");
    }

    #[test]
    fn test_a_cpu_out_of_range_is_refused() {
        let e = std::thread::spawn(|| pin_current_thread(1 << 20).unwrap_err())
            .join()
            .unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }
}
