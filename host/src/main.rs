//! The `waku` command; everything lives in [`wakuwaku::cli`].

// The host allocates many small buffers per event (bodies, headers, state
// values) across worker threads; mimalloc handles that pattern far better
// than the system allocator (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    wakuwaku::platform::memory::prefer_small_pages();
    wakuwaku::cli::main()
}
