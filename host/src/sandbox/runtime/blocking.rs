//! Module code runs where blocking is allowed, whoever calls it.
//!
//! The sandbox links WASI with wasmtime-wasi's synchronous bindings, which
//! run each WASI call (a write to standard error, say) by blocking on a
//! tokio runtime. Blocking a thread that is driving async tasks (a tokio
//! worker, or the thread inside `Runtime::block_on`) panics: "Cannot
//! start a runtime from within a runtime". `waku run` calls modules from
//! `spawn_blocking` threads, where blocking is allowed; the other commands
//! (`publish`, `test`, `state get --event`, the demo's check) and library
//! users call them from wherever they are. So every entry into a module's
//! code (instantiation and each export call, see [`super::WasmInstance`])
//! goes through [`off_async_runtime`], which makes any caller safe:
//!
//! - outside a tokio runtime, the work runs in place;
//! - inside a multi-threaded runtime, through `block_in_place`, which hands
//!   the worker's tasks to another thread first (and costs nothing on a
//!   `spawn_blocking` thread, which drives none);
//! - inside a current-thread runtime, where `block_in_place` is not
//!   allowed, on a thread of its own for the call. That costs a thread per
//!   call (tens of microseconds) even on that runtime's `spawn_blocking`
//!   threads, which tokio does not tell apart: a library user who runs the
//!   consumer on a current-thread runtime pays it; `waku` runs a
//!   multi-threaded one.

use tokio::runtime::{Handle, RuntimeFlavor};

/// Runs `work` on the calling thread, or beside it, so that it may block
/// on a tokio runtime; a panic in `work` reaches the caller as its own.
pub fn off_async_runtime<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    match Handle::try_current().map(|handle| handle.runtime_flavor()) {
        Err(_) => work(),
        Ok(RuntimeFlavor::CurrentThread) => std::thread::scope(|scope| {
            scope.spawn(work).join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        }),
        Ok(_) => tokio::task::block_in_place(work),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What wasmtime-wasi's synchronous bindings do: block on the runtime
    /// of the thread's context if it has one (which panics on a thread
    /// that drives async tasks), else on one of their own.
    fn blocks_on_the_runtime() -> u32 {
        match Handle::try_current() {
            Ok(handle) => handle.block_on(async { 7 }),
            Err(_) => 7,
        }
    }

    #[tokio::test(flavor = "current_thread")]
    #[should_panic(expected = "Cannot start a runtime from within a runtime")]
    async fn the_work_would_panic_on_the_runtimes_own_thread() {
        blocks_on_the_runtime();
    }

    #[test]
    fn outside_a_runtime_the_work_runs_in_place() {
        assert_eq!(off_async_runtime(|| 7), 7);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn inside_a_current_thread_runtime_the_work_may_block() {
        assert_eq!(off_async_runtime(blocks_on_the_runtime), 7);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inside_a_multi_threaded_runtime_the_work_may_block() {
        assert_eq!(off_async_runtime(blocks_on_the_runtime), 7);
        let on_a_worker = tokio::spawn(async { off_async_runtime(blocks_on_the_runtime) });
        assert_eq!(on_a_worker.await.unwrap(), 7);
    }

    #[test]
    fn inside_runtime_block_on_the_work_may_block() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
        assert_eq!(runtime.block_on(async { off_async_runtime(blocks_on_the_runtime) }), 7);
    }

    #[test]
    #[should_panic(expected = "the work's own panic")]
    fn a_panic_in_the_work_is_the_callers() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async { off_async_runtime(|| panic!("the work's own panic")) })
    }
}
