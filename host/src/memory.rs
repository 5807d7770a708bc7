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
