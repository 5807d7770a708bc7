//! Reading a component from disk: the one way the host reads a module's
//! bytes from a file (the module directory, the kept versions under the
//! data directory, a rebuild's new modules), so that a file planted there
//! can neither stall the host nor make it hold more than a component may
//! be.
//!
//! Rules (each broken one is an error naming it, wrapped in the
//! [`std::io::Error`] the callers already report with the file's path):
//! - `component-file-kind`: only a regular file is read (symlinks are
//!   followed). A FIFO, a device, a socket or a directory is refused. The
//!   file is opened without blocking and checked on the opened handle, so
//!   a FIFO swapped in after a directory listing cannot hold the reader
//!   (opening a FIFO for reading waits for a writer).
//! - `component-size`: a component has at most [`MAX_COMPONENT_BYTES`]
//!   bytes, checked before reading (a sparse file of terabytes costs
//!   nothing). A file is read up to the size it had when it was opened:
//!   one that grows is cut there (and will not parse), and a file of the
//!   kernel's (`/proc`, reached through a symlink) that says it is empty
//!   reads as empty. [`Sandbox::load`](super::Sandbox::load) keeps the
//!   same limit for bytes from anywhere.
//! - `component-header`: a component starts with the WebAssembly magic and
//!   the component version and layer, checked before compiling
//!   ([`check_code`]). The refusal says what the bytes are instead (a core
//!   module, another version, not WebAssembly) but never quotes them (the
//!   compiler's own message did): a symlink to a file outside the module
//!   directory shows nothing of what it holds.
//! - `component-functions`: the core modules of a component define at
//!   most [`MAX_COMPONENT_FUNCTIONS`] functions in all, counted before
//!   compiling ([`check_code`]). Compiling holds several kilobytes of
//!   host memory per function until it ends, and a function takes as
//!   little as 6 bytes of the file: a 6 MiB file of a million empty
//!   functions would make the host hold gigabytes (wasmparser allows a
//!   million per core module, and a component may hold many).
//! - `component-function-size`: one function's code is at most
//!   [`MAX_FUNCTION_BYTES`], checked before compiling ([`check_code`]).
//!   Compiling one function holds about 90 times its size in host memory
//!   until it ends, and its time grows with it: one function of 9 MiB
//!   took 8 s and 800 MB here, so one of 100 MiB would take gigabytes.
//! - `component-globals`: the core modules of a component define at most
//!   [`MAX_COMPONENT_GLOBALS`] globals in all, counted before compiling
//!   ([`check_code`]). Every instance of a core module holds 16 bytes of
//!   host memory per global, outside the memory limit, and a component
//!   may instantiate one core module up to the instance limit (100): a
//!   5 MB file of a million globals made one instance hold 1.6 GB.
//! - `module-dir-size`: the components of one module directory hold at
//!   most [`MAX_MODULE_DIR_BYTES`] in all ([`check_module_dir_size`]), so
//!   a directory full of large files cannot make the host hold them all.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// The largest component the host reads or loads, in bytes (128 MiB; a
/// Rust handler is well under 10 MiB, a Python one about 20 MiB).
pub const MAX_COMPONENT_BYTES: u64 = 128 << 20;

/// The most functions the core modules of one component may define (a
/// Python component with its interpreter defines about 13 000, a Rust
/// handler about 500).
pub const MAX_COMPONENT_FUNCTIONS: u64 = 100_000;

/// The most globals the core modules of one component may define (a
/// Python component defines about 900 and instantiates core modules 67 times, a Rust handler 40
/// and 20 times):
/// with the instance limit, at most 16 MB of host memory per instance.
pub const MAX_COMPONENT_GLOBALS: u64 = 10_000;

/// The most bytes of code one function of a component may have (4 MiB:
/// the largest function of a Python component, the interpreter's loop, has
/// about 420 KiB; of the bank handler, about 10 KiB).
pub const MAX_FUNCTION_BYTES: u64 = 4 << 20;

/// The most bytes the components of one module directory may hold in
/// all (1 GiB): the host reads them together at start-up and on reload.
pub const MAX_MODULE_DIR_BYTES: u64 = 1 << 30;

/// The most modules (`*.wasm` files) one module directory may hold: each
/// is compiled, instantiated per worker and partition, and has its series
/// in `/metrics` and its entry in `/modules`.
pub const MAX_MODULES: usize = 64;

/// Why a component file was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ComponentFileError {
    /// Not a regular file.
    #[error("component-file-kind: a module file must be a regular file; this one is a {kind}")]
    NotAFile {
        /// What it is.
        kind: &'static str,
    },
    /// Over [`MAX_COMPONENT_BYTES`].
    #[error("component-size: a component has at most {MAX_COMPONENT_BYTES} bytes; this one has {size}")]
    TooLarge {
        /// Its size (at least; a growing file is not read to its end).
        size: u64,
    },
    /// The core modules define more than [`MAX_COMPONENT_FUNCTIONS`].
    #[error(
        "component-functions: the core modules of a component define at most {MAX_COMPONENT_FUNCTIONS} functions \
         in all; this one defines {functions} or more"
    )]
    TooManyFunctions {
        /// What was counted before the limit was passed.
        functions: u64,
    },
    /// The core modules define more than [`MAX_COMPONENT_GLOBALS`].
    #[error(
        "component-globals: the core modules of a component define at most {MAX_COMPONENT_GLOBALS} globals \
         in all; this one defines {globals} or more"
    )]
    TooManyGlobals {
        /// What was counted before the limit was passed.
        globals: u64,
    },
    /// A function has more than [`MAX_FUNCTION_BYTES`] of code.
    #[error(
        "component-function-size: a function of a component has at most {MAX_FUNCTION_BYTES} bytes of code; \
         function {index} of a core module has {size}"
    )]
    FunctionTooLarge {
        /// Its index among its core module's defined functions.
        index: u64,
        /// Its size in bytes.
        size: u64,
    },
    /// The components of a module directory hold over
    /// [`MAX_MODULE_DIR_BYTES`].
    #[error(
        "module-dir-size: the components of a module directory hold at most {MAX_MODULE_DIR_BYTES} bytes in all; \
         these hold {total} or more"
    )]
    DirTooLarge {
        /// What was read before the limit was passed.
        total: u64,
    },
    /// The bytes do not start as a component's do.
    #[error("component-header: {what}; a component starts with `\\0asm` and the component version and layer")]
    NotAComponent {
        /// What the bytes are instead.
        what: &'static str,
    },
    /// Over [`MAX_MODULES`] modules in one directory.
    #[error(
        "module-count: a module directory holds at most {MAX_MODULES} modules (`*.wasm` files); this one holds more"
    )]
    TooManyModules,
}

impl From<ComponentFileError> for io::Error {
    fn from(error: ComponentFileError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, error)
    }
}

/// The bytes of the component file at `path`, under the rules above.
pub fn read_component(path: &Path) -> io::Result<Vec<u8>> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Opening a FIFO for reading waits for a writer; without blocking
        // it returns at once and the kind check below refuses it. Reads
        // of a regular file ignore the flag.
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(ComponentFileError::NotAFile { kind: kind(&metadata.file_type()) }.into());
    }
    check_size(metadata.len())?;
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    file.take(metadata.len()).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The first bytes of a component: the magic `\0asm`, version 13, layer 1.
const COMPONENT_HEADER: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

/// Refuses bytes that do not start with [`COMPONENT_HEADER`], saying what
/// they are without quoting them.
fn check_header(bytes: &[u8]) -> Result<(), ComponentFileError> {
    let what = match bytes.get(..COMPONENT_HEADER.len()) {
        Some(header) if header == COMPONENT_HEADER => return Ok(()),
        _ if bytes.is_empty() => "the file is empty",
        Some([0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00]) => {
            "this is a core WebAssembly module, not a component (build the guest for `wasm32-wasip2`)"
        }
        Some([0x00, 0x61, 0x73, 0x6d, ..]) => "this is WebAssembly of another version or layer than a component's",
        _ => "this is not a WebAssembly component",
    };
    Err(ComponentFileError::NotAComponent { what })
}

/// Refuses a component of `size` bytes over [`MAX_COMPONENT_BYTES`].
pub(super) fn check_size(size: u64) -> Result<(), ComponentFileError> {
    match size > MAX_COMPONENT_BYTES {
        true => Err(ComponentFileError::TooLarge { size }),
        false => Ok(()),
    }
}

/// Checks the code of component `bytes` before it is compiled: its
/// header ([`COMPONENT_HEADER`]), at most
/// [`MAX_COMPONENT_FUNCTIONS`] functions in all its core modules, none
/// over [`MAX_FUNCTION_BYTES`], and at most [`MAX_COMPONENT_GLOBALS`]
/// globals; returns how many functions it defines.
/// Bytes that do not parse are left to the compiler, which says what is
/// wrong with them.
pub fn check_code(bytes: &[u8]) -> Result<u64, ComponentFileError> {
    use wasmtime::wasmparser::{Parser, Payload};
    check_header(bytes)?;
    let (mut functions, mut in_module, mut globals) = (0, 0, 0);
    for payload in Parser::new(0).parse_all(bytes) {
        match payload {
            Ok(Payload::GlobalSection(section)) => {
                globals += u64::from(section.count());
                if globals > MAX_COMPONENT_GLOBALS {
                    return Err(ComponentFileError::TooManyGlobals { globals });
                }
            }
            Ok(Payload::CodeSectionStart { count, .. }) => {
                functions += u64::from(count);
                in_module = 0;
                if functions > MAX_COMPONENT_FUNCTIONS {
                    return Err(ComponentFileError::TooManyFunctions { functions });
                }
            }
            Ok(Payload::CodeSectionEntry(body)) => {
                let size = body.range().len() as u64;
                if size > MAX_FUNCTION_BYTES {
                    return Err(ComponentFileError::FunctionTooLarge { index: in_module, size });
                }
                in_module += 1;
            }
            Ok(_) => continue,
            Err(_) => break,
        }
    }
    Ok(functions)
}

/// The `*.wasm` entries of the module directory `dir`, sorted; refused
/// when there are over [`MAX_MODULES`] of them (`module-count`), without
/// listing further. Whether each is a file that loads is the reader's to
/// find out.
pub fn module_paths(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "wasm") {
            if paths.len() == MAX_MODULES {
                return Err(ComponentFileError::TooManyModules.into());
            }
            paths.push(path);
        }
    }
    paths.sort();
    Ok(paths)
}

/// Refuses a module directory whose components read so far hold `total`
/// bytes, when that is over [`MAX_MODULE_DIR_BYTES`].
pub fn check_module_dir_size(total: u64) -> Result<(), ComponentFileError> {
    match total > MAX_MODULE_DIR_BYTES {
        true => Err(ComponentFileError::DirTooLarge { total }),
        false => Ok(()),
    }
}

/// What a file that is not a regular file is, for the error.
fn kind(file_type: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "FIFO";
        }
        if file_type.is_char_device() || file_type.is_block_device() {
            return "device";
        }
        if file_type.is_socket() {
            return "socket";
        }
    }
    if file_type.is_dir() { "directory" } else { "special file" }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(path: &Path) -> ComponentFileError {
        let error = read_component(path).expect_err("refused");
        error.into_inner().and_then(|inner| inner.downcast().ok()).map(|inner| *inner).expect("a rule")
    }

    #[test]
    fn a_regular_file_is_read_whole_up_to_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.wasm");
        std::fs::write(&path, COMPONENT_HEADER).unwrap();
        assert_eq!(read_component(&path).unwrap(), COMPONENT_HEADER);
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(MAX_COMPONENT_BYTES).unwrap();
        assert_eq!(read_component(&path).unwrap().len() as u64, MAX_COMPONENT_BYTES);
    }

    #[test]
    fn bytes_that_are_no_component_are_refused_saying_what_they_are_without_quoting_them() {
        let cases: [(&[u8], &str); 5] = [
            (b"", "the file is empty"),
            (b"WAKU_SECRET=hunter2", "not a WebAssembly component"),
            (b"\0asm", "not a WebAssembly component"),
            (b"\0asm\x01\0\0\0\x01\x04", "core WebAssembly module, not a component"),
            (b"\0asm\x0e\0\x01\0", "another version or layer"),
        ];
        for (bytes, what) in cases {
            let message = check_code(bytes).unwrap_err().to_string();
            assert!(message.starts_with("component-header: ") && message.contains(what), "{message}");
            assert!(!message.contains("WAKU") && !message.contains("0x"), "the bytes are quoted: {message}");
        }
    }

    /// A symlink to a kernel file that says it is empty (as every `/proc`
    /// file does) reads as empty, whatever reading it would give.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_link_to_a_proc_file_reads_nothing_of_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("env.wasm");
        std::os::unix::fs::symlink("/proc/self/environ", &path).unwrap();
        assert_eq!(read_component(&path).unwrap(), b"");
    }

    #[test]
    fn a_sparse_file_of_a_terabyte_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.wasm");
        let file = std::fs::File::create(&path).unwrap();
        for size in [MAX_COMPONENT_BYTES + 1, 1 << 40] {
            file.set_len(size).unwrap();
            assert_eq!(refusal(&path), ComponentFileError::TooLarge { size });
        }
        let message = read_component(&path).unwrap_err().to_string();
        assert!(message.starts_with("component-size: a component has at most 134217728 bytes"), "{message}");
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_is_refused_at_once_not_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.wasm");
        let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: `c_path` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let (done, finished) = std::sync::mpsc::channel();
        // Without a writer, a blocking open would never return: the test
        // fails by timing out instead of hanging.
        std::thread::spawn(move || done.send(refusal(&path)).unwrap());
        let refused = finished.recv_timeout(std::time::Duration::from_secs(10)).expect("reading a FIFO blocked");
        assert_eq!(refused, ComponentFileError::NotAFile { kind: "FIFO" });
    }

    #[test]
    fn a_directory_is_refused_naming_what_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.wasm");
        std::fs::create_dir(&path).unwrap();
        assert_eq!(refusal(&path), ComponentFileError::NotAFile { kind: "directory" });
    }
}
