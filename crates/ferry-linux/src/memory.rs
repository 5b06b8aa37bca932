//! Memory advice for the datapath's big tables.

use std::io;

/// Asks the kernel to back `len` bytes at `ptr` with transparent huge pages
/// (`madvise(MADV_HUGEPAGE)`), over the whole pages inside the range; a range smaller
/// than a page is left alone. Pages already touched stay as they are until the kernel
/// collapses them, so advise right after allocating. With transparent huge pages in
/// `madvise` mode this is what makes a large table use them; in `never` mode the call
/// succeeds and changes nothing.
///
/// The range must be memory this process allocated (a heap allocation it keeps): the
/// advice changes how pages are backed, never their contents.
pub fn advise_huge_pages(ptr: *const u8, len: usize) -> io::Result<()> {
    let page = page_size();
    let start = (ptr as usize).next_multiple_of(page);
    let end = (ptr as usize).saturating_add(len) / page * page;
    if end <= start {
        return Ok(());
    }
    // SAFETY: madvise with MADV_HUGEPAGE only changes how the kernel backs the range
    // (and fails on addresses that are not mapped); it never reads, writes or unmaps it,
    // so no Rust object is affected. The range lies inside [ptr, ptr + len).
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Bytes of freed heap the allocator keeps for reuse instead of giving back to the kernel.
pub const RETAINED_HEAP: usize = 64 << 20;

/// Tells the C allocator (glibc's malloc, which Rust's allocator calls) to keep up to
/// [`RETAINED_HEAP`] of freed memory per arena rather than return it to the kernel, and
/// to serve allocations of up to 1 MiB from its heaps rather than with `mmap`. A worker
/// allocates and frees packet buffers of up to 64 KiB (super-packets) many thousand
/// times a second; with glibc's defaults, freeing them often shrinks the arena
/// (`madvise(MADV_DONTNEED)` in a thread's arena), so the next allocation faults its
/// pages in again, zeroed: in the two-node benchmark page faults took about a sixth of
/// the worker's time. Process-wide, idempotent; a no-op on other C libraries.
pub fn retain_freed_heap() {
    #[cfg(target_env = "gnu")]
    {
        let retained = RETAINED_HEAP as libc::c_int;
        // SAFETY: mallopt only changes malloc's tuning parameters; it touches no memory
        // of ours and is safe to call at any time from any thread.
        unsafe {
            libc::mallopt(libc::M_TRIM_THRESHOLD, retained);
            libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        }
    }
}

/// Asks the processor to load the cache line of each address (`prefetcht0` on x86_64,
/// nothing elsewhere), without waiting for it: the datapath's tables give this to
/// conntrack (`Conntrack::set_prefetch`) so that the cache misses of a batch of packets
/// overlap with each other and with work, where a plain read would hold up every
/// instruction after it until it returns.
///
/// Any address will do: a prefetch never faults and never changes memory.
pub fn prefetch(addrs: &[*const u8]) {
    for &a in addrs {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `prefetcht0` (SSE, part of every x86_64 processor) is a hint: it reads
        // nothing the program sees, writes nothing, and is ignored for an address that is
        // not mapped, so it is sound on any pointer.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(a.cast());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = a;
    }
}

/// The size of a page.
fn page_size() -> usize {
    // SAFETY: sysconf reads a system constant and touches no memory of ours.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_advise_huge_pages_over_a_heap_allocation() {
        let v: Vec<u64> = vec![0; 4 << 20];
        let bytes = v.len() * 8;
        advise_huge_pages(v.as_ptr().cast(), bytes).unwrap();
        // Smaller than a page, or empty: nothing to advise.
        advise_huge_pages(v.as_ptr().cast(), 100).unwrap();
        advise_huge_pages(std::ptr::null(), 0).unwrap();
        assert!(v.iter().all(|&x| x == 0), "contents untouched");
    }

    #[test]
    fn test_prefetch_any_address() {
        let v = vec![7u8; 4096];
        prefetch(&[v.as_ptr(), v.as_ptr().wrapping_add(4095)]);
        // Unmapped or null: ignored.
        prefetch(&[std::ptr::null(), usize::MAX as *const u8, 0x10 as *const u8]);
        prefetch(&[]);
        assert!(v.iter().all(|&x| x == 7), "contents untouched");
    }
}
