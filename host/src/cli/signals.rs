//! Catching SIGINT and SIGTERM for `waku run`: the first stops it after the
//! batch in flight, a second aborts (exit code 130).

use anyhow::{Context, Result};

/// SIGINT and SIGTERM, caught from the moment [`ShutdownSignals::install`]
/// returns: a signal that arrives while modules are still loading is not
/// lost to the default action (which kills the process), it stops the
/// consumer as soon as it starts.
pub(super) struct ShutdownSignals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    pub(super) fn install() -> Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                interrupt: signal(SignalKind::interrupt()).context("catching SIGINT")?,
                terminate: signal(SignalKind::terminate()).context("catching SIGTERM")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// Waits for the next signal.
    pub(super) async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }

    /// Resolves on the first signal, after saying so. A second signal
    /// aborts the process at once (exit code 130), as a crash would:
    /// nothing committed is lost, the batch in flight is consumed again.
    pub(super) async fn first(mut self) {
        self.next().await;
        errln!("waku: stopping after the batch in flight (signal again to abort)");
        tokio::spawn(async move {
            self.next().await;
            errln!("waku: aborted; the batch in flight was not committed");
            std::process::exit(130);
        });
    }
}
