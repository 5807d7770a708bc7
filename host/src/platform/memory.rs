//! How the host process takes memory from the kernel.
//!
//! A batch allocates and frees many small buffers (records, bodies, state
//! values) across threads. With transparent huge pages allowed (the kernel
//! setting `madvise`, which mimalloc opts into), every first touch of a
//! fresh 2 MiB region made the kernel zero all of it: a profile of
//! `waku run` over the demo's log spent about 10 % of its samples in the
//! kernel's `clear_page`, and the peak resident set was 300 MB. With
//! 4 KiB pages the same run took about 40 % less memory and half the
//! system time (BENCHMARKS.md, "Where the host's time goes").
//!
//! [`prefer_small_pages`] is called first thing by the `waku` command and
//! by the benchmarks, so their figures match.
//!
//! Memory a thread frees stays with mimalloc, for that thread to reuse,
//! until the allocator gets round to returning it. After a burst that ends
//! for good (the integrity check of opening a redb file reads all of it)
//! [`release_freed`] returns it at once, so the consumer's threads do not
//! pile their memory on top of it.

/// Turns transparent huge pages off for this process (Linux; elsewhere it
/// does nothing). Applies to memory touched from then on, so call it
/// before the work starts. A kernel that refuses leaves the process as it
/// was: only speed and memory use depend on it.
pub fn prefer_small_pages() {
    #[cfg(target_os = "linux")]
    if let Err(error) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::debug!("transparent huge pages stay on: {error}");
    }
}

/// Returns the memory this thread freed, and mimalloc holds for reuse, to
/// the kernel now. After opening the demo's 140 MB log with its integrity
/// check, the peak resident set of `waku run` over it was about 40 MB
/// higher without this (BENCHMARKS.md). Does nothing when mimalloc holds
/// nothing (another global allocator).
pub fn release_freed() {
    // SAFETY: `mi_collect` takes no pointers and only walks mimalloc's own
    // heaps, which it keeps consistent across threads.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the page holding `address` is in memory (an unmapped page
    /// is not).
    fn resident(address: usize) -> bool {
        let page = address & !4095;
        let mut state = 0u8;
        // SAFETY: `mincore` only reads the page tables of this one page and
        // writes one byte into `state`.
        let result = unsafe { libc::mincore(page as *mut libc::c_void, 4096, &mut state) };
        result == 0 && state & 1 == 1
    }

    #[test]
    fn memory_this_thread_freed_leaves_memory_at_once() {
        const BLOCKS: usize = 16 * 1024;
        const BLOCK: usize = 4096;
        // The test binary's global allocator is the system's, so this
        // allocates from mimalloc directly: 64 MiB in pages, as the
        // integrity check reads a file, written, then freed.
        // SAFETY: each block is written within its size and freed once.
        let blocks: Vec<usize> = (0..BLOCKS)
            .map(|_| unsafe {
                let block = libmimalloc_sys::mi_malloc(BLOCK);
                block.cast::<u8>().write_bytes(1, BLOCK);
                block as usize
            })
            .collect();
        blocks.iter().for_each(|&block| unsafe { libmimalloc_sys::mi_free(block as *mut libc::c_void) });
        let in_memory = || blocks.iter().filter(|&&block| resident(block)).count();
        assert!(in_memory() > BLOCKS / 2, "freed blocks stay in memory until released");
        release_freed();
        let left = in_memory();
        assert!(left < BLOCKS / 8, "{left} of {BLOCKS} freed blocks still in memory");
    }
}
