//! The runtime that drives a store's connections ([`Bridge`]), and how a
//! blocking call waits for the work it sends there ([`wait`]).
//!
//! tokio-postgres is async and the [`StateBackend`](super::super::StateBackend)
//! trait is not: each call spawns its queries on the store's own runtime
//! (two threads) and blocks its thread on a channel until they answer.
//!
//! Rules kept here:
//! - **Any thread may call**, a runtime's included: the work runs on the
//!   bridge's runtime, never on the caller's, so runtimes never nest.
//! - **Work that ends without an answer is an error**, naming the store,
//!   never a hang or a panic in the caller.
//! - **Dropping the bridge never panics**, even on an async thread: the
//!   runtime shuts down in the background.

use std::future::Future;

use super::super::StateError;

/// The runtime that drives the connections of one store.
pub(super) struct Bridge {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Bridge {
    pub(super) fn new() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("waku-postgres")
            .enable_all()
            .build()?;
        Ok(Self { runtime: Some(runtime) })
    }

    pub(super) fn handle(&self) -> tokio::runtime::Handle {
        // Only `drop` takes the runtime.
        self.runtime.as_ref().map(|runtime| runtime.handle().clone()).expect("a runtime")
    }

    pub(super) fn run<T: Send + 'static>(
        &self,
        location: &str,
        work: impl Future<Output = Result<T, StateError>> + Send + 'static,
    ) -> Result<T, StateError> {
        wait(location, &self.handle(), work)
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // A runtime dropped on an async thread would panic; this does not.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Spawns `work` on `runtime` and blocks this thread until it answers.
pub(super) fn wait<T: Send + 'static>(
    location: &str,
    runtime: &tokio::runtime::Handle,
    work: impl Future<Output = Result<T, StateError>> + Send + 'static,
) -> Result<T, StateError> {
    let (answer, answered) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = answer.send(work.await);
    });
    answered.recv().unwrap_or_else(|_| {
        Err(StateError::Storage {
            store: location.to_owned(),
            source: "the database task ended without an answer".into(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_gets_its_answer_from_a_plain_thread_and_from_inside_another_runtime() {
        let bridge = Bridge::new().unwrap();
        let on_bridge = bridge.run("here", async { Ok(std::thread::current().name().map(str::to_owned)) }).unwrap();
        assert_eq!(on_bridge.as_deref(), Some("waku-postgres"), "the work runs on the bridge's threads");
        let caller = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let answer = caller.block_on(async { bridge.run("here", async { Ok(6 * 7) }) });
        assert_eq!(answer.unwrap(), 42);
        let error = bridge.run::<()>("here", async { Err(StateError::InUse { store: "there".into() }) }).unwrap_err();
        assert!(matches!(error, StateError::InUse { store } if store == "there"), "the work's own error comes back");
    }

    #[test]
    fn work_that_ends_without_answering_is_an_error_naming_the_store() {
        let bridge = Bridge::new().unwrap();
        let dies = true;
        let error = bridge
            .run("postgres `h:5432/db` projection `bank`", async move {
                assert!(!dies, "the task dies without answering (as this test expects)");
                Ok(())
            })
            .unwrap_err();
        let StateError::Storage { store, source } = &error else { panic!("not a storage error: {error}") };
        assert_eq!(store, "postgres `h:5432/db` projection `bank`");
        assert_eq!(source.to_string(), "the database task ended without an answer");
    }

    #[test]
    fn a_bridge_dropped_on_an_async_thread_does_not_panic() {
        let bridge = Bridge::new().unwrap();
        let outer = tokio::runtime::Builder::new_current_thread().build().unwrap();
        outer.block_on(async move { drop(bridge) });
    }
}
