//! The `log` capability: a module's diagnostics, written through the host's
//! `tracing` (target `waku::guest`) with the module's name and the key
//! being handled (in its text form) as fields.
//!
//! Rules (logging never fails a call):
//! - A line longer than
//!   [`PayloadLimits::max_log_line`](crate::sandbox::handler::PayloadLimits::max_log_line)
//!   is cut at a character boundary and marked `[…cut]`.
//! - Past
//!   [`PayloadLimits::max_log_lines_per_call`](crate::sandbox::handler::PayloadLimits::max_log_lines_per_call)
//!   lines in one call, further lines are dropped and counted; one closing
//!   warning (`log-lines-per-call: …`) says how many when the call ends.
//! - During `handle` the key scope's limits apply; in other calls
//!   (`describe`, `key`, `ordering`, `combine`) the sandbox's.
//!
//! [`LogUnit`] is public so that native modules (which run without a
//! sandbox) log under the same rules.

use wakuwaku_core::limits::LogTally;
use wakuwaku_core::terminal::printable;
use wasmtime::component::{HasSelf, Linker};

use super::StoreData;
use super::bindings::wakuwaku::handler::log;
use crate::key::Key;
use crate::sandbox::handler::{LogLevel, PayloadLimits};

/// Links the `log` interface.
pub(super) fn link(linker: &mut Linker<StoreData>) -> wasmtime::Result<()> {
    log::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |data| data)
}

impl log::Host for StoreData {
    fn log(&mut self, level: log::Level, message: String) {
        let level = match level {
            log::Level::Trace => LogLevel::Trace,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        };
        self.log.log(level, &message);
    }
}

/// One module's log lines, call by call.
#[derive(Debug)]
pub struct LogUnit {
    module: String,
    key: Option<Key>,
    limits: PayloadLimits,
    tally: LogTally,
}

impl LogUnit {
    /// The log of `module`, under `limits` until a call says otherwise.
    pub fn new(module: &str, limits: PayloadLimits) -> Self {
        Self { module: module.to_owned(), key: None, limits, tally: LogTally::default() }
    }

    /// Starts a call about `key` (none outside `handle`) under `limits`.
    pub fn begin(&mut self, key: Option<Key>, limits: PayloadLimits) {
        self.key = key;
        self.limits = limits;
        self.tally = LogTally::default();
    }

    /// Writes a line, cut to the limit, unless the call has logged its
    /// limit of lines.
    pub fn log(&mut self, level: LogLevel, message: &str) {
        if let Some(line) = self.tally.admit(&self.limits, message) {
            write(&self.module, self.key.as_ref(), level, &line);
        }
    }

    /// Ends a call: says how many lines were dropped, if any.
    pub fn finish(&mut self) {
        if let Some(closing) = self.tally.finish(&self.limits) {
            write(&self.module, self.key.as_ref(), LogLevel::Warn, &closing);
        }
    }
}

fn write(module: &str, key: Option<&Key>, level: LogLevel, line: &dyn std::fmt::Display) {
    // Both are the module's text: shown escaped, never raw.
    let key = key.map(|key| printable(&key.to_string()).into_owned());
    let key = key.as_deref().map(tracing::field::display);
    macro_rules! emit {
        ($level:ident) => {
            tracing::$level!(target: "waku::guest", module, key, "{}", printable(&line.to_string()))
        };
    }
    match level {
        LogLevel::Trace => emit!(trace),
        LogLevel::Debug => emit!(debug),
        LogLevel::Info => emit!(info),
        LogLevel::Warn => emit!(warn),
        LogLevel::Error => emit!(error),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What `tracing` writes while `f` runs on this thread.
    fn captured(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn lines_are_cut_counted_and_marked_with_module_and_key() {
        let limits = PayloadLimits { max_log_line: 10, max_log_lines_per_call: 2, ..PayloadLimits::default() };
        let mut unit = LogUnit::new("probe", PayloadLimits::default());
        let logs = captured(|| {
            unit.begin(Some(Key::parse_text(r#"[7,"eur"]"#).unwrap()), limits);
            unit.log(LogLevel::Info, "first");
            unit.log(LogLevel::Error, &"x".repeat(50));
            for _ in 0..5 {
                unit.log(LogLevel::Info, "dropped");
            }
            unit.finish();
            unit.begin(None, limits);
            unit.log(LogLevel::Debug, "outside");
            unit.finish();
        });
        let lines: Vec<&str> = logs.lines().collect();
        assert_eq!(lines.len(), 4, "{logs}");
        assert!(lines[0].contains("first") && lines[0].contains("module=\"probe\""), "{}", lines[0]);
        assert!(lines[0].contains(r#"key=[7,"eur"]"#), "{}", lines[0]);
        assert!(lines[1].contains(&format!("{} […cut]", "x".repeat(10))), "{}", lines[1]);
        assert!(!lines[1].contains(&"x".repeat(11)), "{}", lines[1]);
        assert!(!logs.contains(": dropped"), "{logs}");
        assert!(lines[2].contains("WARN") && lines[2].contains("log-lines-per-call: 5 more log lines"), "{}", lines[2]);
        assert!(lines[3].contains("outside") && !lines[3].contains("key="), "{}", lines[3]);
    }
}
