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
//! - A module version loaded by a sandbox also keeps its lines in its
//!   module's [`LogBook`], which the console pages through: the last
//!   [`KEPT_LINES`] lines of the module (all its versions), each with its
//!   level, version, key (its text, cut at [`KEPT_KEY_BYTES`]) and time,
//!   the line cut again at [`KEPT_LINE_BYTES`] (marked `[…cut]`), so a book
//!   holds at most some 400 KiB whatever the module writes. Keeping a line
//!   takes the book's lock for a push (a line, not a call, costs it); the
//!   text is kept as the module wrote it, and made printable by whoever
//!   shows it.
//!
//! [`LogUnit`] is public so that native modules (which run without a
//! sandbox) log under the same rules.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use wakuwaku_core::limits::LogTally;
use wakuwaku_core::terminal::printable;
use wasmtime::component::{HasSelf, Linker};

use super::StoreData;
use super::bindings::wakuwaku::handler::log;
use super::usage::VersionUsage;
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

/// The most lines a module's [`LogBook`] keeps.
pub const KEPT_LINES: usize = 300;

/// A kept line is cut at this many bytes (at a character boundary, marked
/// `[…cut]`).
pub const KEPT_LINE_BYTES: usize = 1024;

/// A kept line's key is its text form cut at this many bytes (marked `…`).
pub const KEPT_KEY_BYTES: usize = 256;

/// One module's log lines, call by call.
#[derive(Debug)]
pub struct LogUnit {
    module: String,
    key: Option<Key>,
    limits: PayloadLimits,
    tally: LogTally,
    /// The version whose module's book keeps the lines, if any.
    kept: Option<Arc<VersionUsage>>,
}

impl LogUnit {
    /// The log of `module`, under `limits` until a call says otherwise.
    pub fn new(module: &str, limits: PayloadLimits) -> Self {
        Self { module: module.to_owned(), key: None, limits, tally: LogTally::default(), kept: None }
    }

    /// The same log, keeping its lines in the book of `version`'s module
    /// too.
    pub(crate) fn kept_for(mut self, version: Arc<VersionUsage>) -> Self {
        self.kept = Some(version);
        self
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
            self.keep(level, &line);
        }
    }

    /// Ends a call: says how many lines were dropped, if any.
    pub fn finish(&mut self) {
        if let Some(closing) = self.tally.finish(&self.limits) {
            write(&self.module, self.key.as_ref(), LogLevel::Warn, &closing);
            self.keep(LogLevel::Warn, &closing);
        }
    }

    fn keep(&self, level: LogLevel, line: &dyn std::fmt::Display) {
        if let Some(version) = &self.kept {
            version.book().keep(level, version.version(), self.key.as_ref(), line);
        }
    }
}

/// A line a [`LogBook`] keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeptLine {
    /// Its number in the module's book, from 0.
    pub seq: u64,
    /// When it was written (ms since the Unix epoch).
    pub at_ms: u64,
    /// `trace`, `debug`, `info`, `warn` or `error`.
    pub level: &'static str,
    /// The module version that wrote it.
    pub version: String,
    /// The key being handled, in its text form (cut at
    /// [`KEPT_KEY_BYTES`]); none outside `handle` and `fire`.
    pub key: Option<String>,
    /// The line as the module wrote it, cut at [`KEPT_LINE_BYTES`].
    pub text: String,
}

/// A page of a book's lines, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogPage {
    /// The lines.
    pub lines: Vec<KeptLine>,
    /// Where the next (older) page starts (`before`), if the book keeps
    /// older lines.
    pub next: Option<u64>,
    /// Lines the module wrote since the host started (kept or not).
    pub written: u64,
}

/// The last [`KEPT_LINES`] log lines of one module, all its versions.
#[derive(Debug)]
pub struct LogBook {
    module: String,
    /// The lines, oldest first, and how many were ever written.
    lines: Mutex<(VecDeque<KeptLine>, u64)>,
}

impl LogBook {
    /// An empty book for `module`.
    pub(crate) fn new(module: &str) -> Self {
        Self { module: module.to_owned(), lines: Mutex::default() }
    }

    /// The module whose lines it keeps.
    pub fn module(&self) -> &str {
        &self.module
    }

    /// Keeps a line of `version` about `key`, cut to the book's bounds;
    /// the oldest goes past [`KEPT_LINES`].
    fn keep(&self, level: LogLevel, version: &str, key: Option<&Key>, line: &dyn std::fmt::Display) {
        let cut = |text: String, most: usize, mark: &str| match wakuwaku_core::limits::cut(&text, most) {
            (kept, true) => format!("{kept}{mark}"),
            (_, false) => text,
        };
        let text = cut(line.to_string(), KEPT_LINE_BYTES, " […cut]");
        let key = key.map(|key| cut(key.to_string(), KEPT_KEY_BYTES, "…"));
        let level = match level {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        };
        let at_ms = crate::platform::clock::now_ms();
        let mut book = self.lines.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (lines, written) = &mut *book;
        lines.push_back(KeptLine { seq: *written, at_ms, level, version: version.to_owned(), key, text });
        *written += 1;
        if lines.len() > KEPT_LINES {
            lines.pop_front();
        }
    }

    /// At most `limit` lines older than line `before` (all: the newest),
    /// newest first.
    pub fn page(&self, before: Option<u64>, limit: usize) -> LogPage {
        let book = self.lines.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (lines, written) = &*book;
        let page: Vec<KeptLine> = lines
            .iter()
            .rev()
            .filter(|line| before.is_none_or(|before| line.seq < before))
            .take(limit)
            .cloned()
            .collect();
        let oldest = lines.front().map(|line| line.seq);
        let next = page.last().filter(|last| Some(last.seq) > oldest).map(|last| last.seq);
        LogPage { lines: page, next, written: *written }
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

    #[test]
    fn a_book_keeps_the_last_lines_cut_to_its_bounds_and_pages_them_newest_first() {
        let version = Arc::new(VersionUsage::for_tests());
        let limits = PayloadLimits { max_log_lines_per_call: 1000, ..PayloadLimits::default() };
        let mut unit = LogUnit::new("m", limits).kept_for(version.clone());
        let long_key = Key::of(&crate::key::KeyValue::Str("k".repeat(1000))).unwrap();
        captured(|| {
            unit.begin(Some(Key::int(7u64)), limits);
            unit.log(LogLevel::Error, "<script>alert(1)</script>\u{202e}");
            unit.log(LogLevel::Info, &"é".repeat(1000));
            unit.begin(Some(long_key), limits);
            for n in 0..KEPT_LINES - 1 {
                unit.log(LogLevel::Debug, &format!("line {n}"));
            }
        });
        let book = version.book();
        let newest = book.page(None, 3);
        assert_eq!(newest.written, KEPT_LINES as u64 + 1);
        let seqs: Vec<u64> = newest.lines.iter().map(|line| line.seq).collect();
        assert_eq!(seqs, [300, 299, 298]);
        assert_eq!((newest.lines[0].text.as_str(), newest.lines[0].level), ("line 298", "debug"));
        assert_eq!(newest.lines[0].version, "v");
        let key = newest.lines[0].key.as_deref().unwrap();
        assert!(key.len() <= KEPT_KEY_BYTES + "…".len() && key.ends_with('…'), "{key}");
        // Paged back to the oldest kept: the first line went, the second stays, cut.
        let mut before = newest.next;
        let mut oldest = None;
        while let Some(at) = before {
            let page = book.page(Some(at), 100);
            oldest = page.lines.last().cloned();
            before = page.next;
        }
        let oldest = oldest.unwrap();
        assert_eq!((oldest.seq, oldest.level, oldest.key.as_deref()), (1, "info", Some("7")));
        assert!(oldest.text.ends_with(" […cut]") && oldest.text.len() <= KEPT_LINE_BYTES + " […cut]".len());
        assert!(oldest.text.starts_with("éé"), "cut at a character boundary");
    }
}
