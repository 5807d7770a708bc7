//! `waku new`: a handler project, in Rust, Python, TypeScript or
//! JavaScript, in a directory of its own, anywhere.
//!
//! Rules it keeps:
//! - **Builds anywhere.** The project holds a copy of the guest SDK and of
//!   the WIT contract, embedded in this binary when it was built (Rust:
//!   `vendor/wakuwaku/{core,guest-sdk,wit}`, path dependencies of the
//!   crate; Python: `vendor/wakuwaku_guest`, on the python path of
//!   `waku build` and pytest; TypeScript and JavaScript:
//!   `vendor/wakuwaku-guest`, the `wakuwaku-guest` of the project's
//!   `tsconfig.json` paths). Nothing refers to where the repository was
//!   cloned; a Rust project needs only crates.io, a Python one
//!   componentize-py and pytest from PyPI, a TypeScript or JavaScript one
//!   the npm packages its `package.json` pins (`npm install`). The copy is the SDK this host
//!   was built with, so what the project builds is what this host runs.
//! - **Ready at once.** One event type with its handler, a unit test,
//!   sample events (`events.jsonl`) and a three-line README: `cargo test`
//!   (or pytest, or `npm test`) and `waku build` pass in it as written.
//! - **Never overwrites.** A target directory that exists and is not empty
//!   is refused; a name that cannot name a crate, a Python module or a
//!   module file is refused, saying why. When writing fails half-way, a
//!   directory this call created is removed again.

use std::path::{Path, PathBuf};

use crate::authoring::guest_build::js;
use crate::authoring::guest_build::python::{
    HANDLER_WIT, HANDLER_WIT_0_2, HANDLER_WIT_0_3, HANDLER_WIT_0_5, TESTED_COMPONENTIZE_PY,
};

/// The language of a new project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Lang {
    /// A Rust crate (`cargo`, `wasm32-wasip2`).
    #[default]
    Rust,
    /// A Python project (componentize-py, pytest).
    Python,
    /// A TypeScript project (componentize-js, esbuild, node's test runner).
    #[value(name = "ts", alias = "typescript")]
    Ts,
    /// A JavaScript project (componentize-js, esbuild, node's test runner).
    #[value(name = "js", alias = "javascript")]
    Js,
}

/// Why a project could not be created (a directory the call created is
/// removed again).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScaffoldError {
    /// The name cannot name the project.
    #[error("`{name}` cannot name a handler project: {reason}")]
    BadName {
        /// The name given.
        name: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// The target directory holds something already.
    #[error("{} exists and is not empty; pick a new or empty directory", .0.display())]
    NotEmpty(PathBuf),
    /// A file or directory could not be written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
}

/// A project `waku new` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    /// Its directory.
    pub dir: PathBuf,
    /// The files written, relative to it, in order.
    pub files: Vec<PathBuf>,
}

/// The version of the SDK copied into projects: this host's.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The Rust guest SDK and what it is built from, as `(path in the
/// project, text)`. `vendored_sources_are_the_repositorys` checks that
/// every source file of `core/` and `guest-sdk/` is here.
const RUST_SDK: &[(&str, &str)] = &[
    ("vendor/wakuwaku/wit/handler.wit", HANDLER_WIT_0_2),
    ("vendor/wakuwaku/wit/handler-0.3.wit", HANDLER_WIT_0_3),
    ("vendor/wakuwaku/wit/handler-0.4.wit", HANDLER_WIT),
    ("vendor/wakuwaku/wit/handler-0.5.wit", HANDLER_WIT_0_5),
    ("vendor/wakuwaku/core/src/lib.rs", include_str!("../../../core/src/lib.rs")),
    ("vendor/wakuwaku/core/src/event.rs", include_str!("../../../core/src/event.rs")),
    ("vendor/wakuwaku/core/src/key.rs", include_str!("../../../core/src/key.rs")),
    ("vendor/wakuwaku/core/src/key_serde.rs", include_str!("../../../core/src/key_serde.rs")),
    ("vendor/wakuwaku/core/src/limits.rs", include_str!("../../../core/src/limits.rs")),
    ("vendor/wakuwaku/core/src/names.rs", include_str!("../../../core/src/names.rs")),
    ("vendor/wakuwaku/core/src/plan.rs", include_str!("../../../core/src/plan.rs")),
    ("vendor/wakuwaku/core/src/reduce.rs", include_str!("../../../core/src/reduce.rs")),
    ("vendor/wakuwaku/core/src/release.rs", include_str!("../../../core/src/release.rs")),
    ("vendor/wakuwaku/core/src/terminal.rs", include_str!("../../../core/src/terminal.rs")),
    ("vendor/wakuwaku/core/src/time_order.rs", include_str!("../../../core/src/time_order.rs")),
    ("vendor/wakuwaku/core/src/timers.rs", include_str!("../../../core/src/timers.rs")),
    ("vendor/wakuwaku/guest-sdk/src/lib.rs", include_str!("../../../guest-sdk/src/lib.rs")),
    ("vendor/wakuwaku/guest-sdk/src/context.rs", include_str!("../../../guest-sdk/src/context.rs")),
    ("vendor/wakuwaku/guest-sdk/src/event.rs", include_str!("../../../guest-sdk/src/event.rs")),
    ("vendor/wakuwaku/guest-sdk/src/module.rs", include_str!("../../../guest-sdk/src/module.rs")),
    ("vendor/wakuwaku/guest-sdk/src/testing.rs", include_str!("../../../guest-sdk/src/testing.rs")),
    ("vendor/wakuwaku/guest-sdk/src/types.rs", include_str!("../../../guest-sdk/src/types.rs")),
    ("vendor/wakuwaku/guest-sdk/src/wasm.rs", include_str!("../../../guest-sdk/src/wasm.rs")),
    ("vendor/wakuwaku/guest-sdk/src/windows.rs", include_str!("../../../guest-sdk/src/windows.rs")),
];

/// The vendored crates' manifests (templates: the repository's use
/// workspace inheritance, which a copy cannot).
const RUST_SDK_MANIFESTS: &[(&str, &str)] = &[
    ("vendor/wakuwaku/core/Cargo.toml", include_str!("../../templates/vendor/core.Cargo.toml")),
    ("vendor/wakuwaku/guest-sdk/Cargo.toml", include_str!("../../templates/vendor/guest-sdk.Cargo.toml")),
];

/// The Rust project's own files.
const RUST_PROJECT: &[(&str, &str)] = &[
    ("Cargo.toml", include_str!("../../templates/rust/Cargo.toml")),
    ("README.md", include_str!("../../templates/rust/README.md")),
    (".gitignore", include_str!("../../templates/rust/gitignore")),
    ("events.jsonl", include_str!("../../templates/rust/events.jsonl")),
    ("src/lib.rs", include_str!("../../templates/rust/lib.rs")),
];

/// The Python SDK, as `(path in the project, text)`;
/// `vendored_sources_are_the_repositorys` checks it is all here.
const PYTHON_SDK: &[(&str, &str)] = &[
    ("vendor/wakuwaku_guest/__init__.py", include_str!("../../../guest-sdk-python/src/wakuwaku_guest/__init__.py")),
    ("vendor/wakuwaku_guest/codec.py", include_str!("../../../guest-sdk-python/src/wakuwaku_guest/codec.py")),
    ("vendor/wakuwaku_guest/component.py", include_str!("../../../guest-sdk-python/src/wakuwaku_guest/component.py")),
    ("vendor/wakuwaku_guest/context.py", include_str!("../../../guest-sdk-python/src/wakuwaku_guest/context.py")),
    ("vendor/wakuwaku_guest/event.py", include_str!("../../../guest-sdk-python/src/wakuwaku_guest/event.py")),
    ("vendor/wakuwaku_guest/key.py", include_str!("../../../guest-sdk-python/src/wakuwaku_guest/key.py")),
    ("vendor/wakuwaku_guest/limits.py", include_str!("../../../guest-sdk-python/src/wakuwaku_guest/limits.py")),
    ("vendor/wakuwaku_guest/module.py", include_str!("../../../guest-sdk-python/src/wakuwaku_guest/module.py")),
    ("vendor/wakuwaku_guest/reduce.py", include_str!("../../../guest-sdk-python/src/wakuwaku_guest/reduce.py")),
    ("vendor/wakuwaku_guest/testing.py", include_str!("../../../guest-sdk-python/src/wakuwaku_guest/testing.py")),
    ("vendor/wakuwaku_guest/types.py", include_str!("../../../guest-sdk-python/src/wakuwaku_guest/types.py")),
    ("vendor/wakuwaku_guest/windows.py", include_str!("../../../guest-sdk-python/src/wakuwaku_guest/windows.py")),
];

/// The Python project's own files; `{{module}}` in a path is the module.
const PYTHON_PROJECT: &[(&str, &str)] = &[
    ("pyproject.toml", include_str!("../../templates/python/pyproject.toml")),
    ("README.md", include_str!("../../templates/python/README.md")),
    (".gitignore", include_str!("../../templates/python/gitignore")),
    ("events.jsonl", include_str!("../../templates/python/events.jsonl")),
    ("{{module}}.py", include_str!("../../templates/python/handler.py")),
    ("tests/test_{{module}}.py", include_str!("../../templates/python/test_handler.py")),
];

/// The TypeScript SDK (its sources and the WIT types generated for it), as
/// `(path in the project, text)`; `vendored_sources_are_the_repositorys`
/// checks it is all here.
const JS_SDK: &[(&str, &str)] = &[
    ("vendor/wakuwaku-guest/component.ts", include_str!("../../../guest-sdk-js/src/component.ts")),
    ("vendor/wakuwaku-guest/context.ts", include_str!("../../../guest-sdk-js/src/context.ts")),
    ("vendor/wakuwaku-guest/event.ts", include_str!("../../../guest-sdk-js/src/event.ts")),
    ("vendor/wakuwaku-guest/index.ts", include_str!("../../../guest-sdk-js/src/index.ts")),
    ("vendor/wakuwaku-guest/json.ts", include_str!("../../../guest-sdk-js/src/json.ts")),
    ("vendor/wakuwaku-guest/key.ts", include_str!("../../../guest-sdk-js/src/key.ts")),
    ("vendor/wakuwaku-guest/limits.ts", include_str!("../../../guest-sdk-js/src/limits.ts")),
    ("vendor/wakuwaku-guest/module.ts", include_str!("../../../guest-sdk-js/src/module.ts")),
    ("vendor/wakuwaku-guest/reduce.ts", include_str!("../../../guest-sdk-js/src/reduce.ts")),
    ("vendor/wakuwaku-guest/schema.ts", include_str!("../../../guest-sdk-js/src/schema.ts")),
    ("vendor/wakuwaku-guest/testing.ts", include_str!("../../../guest-sdk-js/src/testing.ts")),
    ("vendor/wakuwaku-guest/types.ts", include_str!("../../../guest-sdk-js/src/types.ts")),
    ("vendor/wakuwaku-guest/windows.ts", include_str!("../../../guest-sdk-js/src/windows.ts")),
    (
        "vendor/wakuwaku-guest/wit/handler-0.5/interfaces/wakuwaku-handler-emit.d.ts",
        include_str!("../../../guest-sdk-js/src/wit/handler-0.5/interfaces/wakuwaku-handler-emit.d.ts"),
    ),
    (
        "vendor/wakuwaku-guest/wit/handler-0.5/interfaces/wakuwaku-handler-handler.d.ts",
        include_str!("../../../guest-sdk-js/src/wit/handler-0.5/interfaces/wakuwaku-handler-handler.d.ts"),
    ),
    (
        "vendor/wakuwaku-guest/wit/handler-0.5/interfaces/wakuwaku-handler-log.d.ts",
        include_str!("../../../guest-sdk-js/src/wit/handler-0.5/interfaces/wakuwaku-handler-log.d.ts"),
    ),
    (
        "vendor/wakuwaku-guest/wit/handler-0.5/interfaces/wakuwaku-handler-state.d.ts",
        include_str!("../../../guest-sdk-js/src/wit/handler-0.5/interfaces/wakuwaku-handler-state.d.ts"),
    ),
    (
        "vendor/wakuwaku-guest/wit/handler-0.5/interfaces/wakuwaku-handler-timers.d.ts",
        include_str!("../../../guest-sdk-js/src/wit/handler-0.5/interfaces/wakuwaku-handler-timers.d.ts"),
    ),
    (
        "vendor/wakuwaku-guest/wit/handler-0.5/interfaces/wakuwaku-handler-types.d.ts",
        include_str!("../../../guest-sdk-js/src/wit/handler-0.5/interfaces/wakuwaku-handler-types.d.ts"),
    ),
    (
        "vendor/wakuwaku-guest/wit/handler-0.5/module.d.ts",
        include_str!("../../../guest-sdk-js/src/wit/handler-0.5/module.d.ts"),
    ),
    (
        "vendor/wakuwaku-guest/wit/handler-0.4/interfaces/wakuwaku-handler-emit.d.ts",
        include_str!("../../../guest-sdk-js/src/wit/handler-0.4/interfaces/wakuwaku-handler-emit.d.ts"),
    ),
    (
        "vendor/wakuwaku-guest/wit/handler-0.4/interfaces/wakuwaku-handler-handler.d.ts",
        include_str!("../../../guest-sdk-js/src/wit/handler-0.4/interfaces/wakuwaku-handler-handler.d.ts"),
    ),
    (
        "vendor/wakuwaku-guest/wit/handler-0.4/interfaces/wakuwaku-handler-log.d.ts",
        include_str!("../../../guest-sdk-js/src/wit/handler-0.4/interfaces/wakuwaku-handler-log.d.ts"),
    ),
    (
        "vendor/wakuwaku-guest/wit/handler-0.4/interfaces/wakuwaku-handler-state.d.ts",
        include_str!("../../../guest-sdk-js/src/wit/handler-0.4/interfaces/wakuwaku-handler-state.d.ts"),
    ),
    (
        "vendor/wakuwaku-guest/wit/handler-0.4/interfaces/wakuwaku-handler-types.d.ts",
        include_str!("../../../guest-sdk-js/src/wit/handler-0.4/interfaces/wakuwaku-handler-types.d.ts"),
    ),
    (
        "vendor/wakuwaku-guest/wit/handler-0.4/module.d.ts",
        include_str!("../../../guest-sdk-js/src/wit/handler-0.4/module.d.ts"),
    ),
];

/// The TypeScript project's own files; `{{module}}` in a path is the module.
const TS_PROJECT: &[(&str, &str)] = &[
    ("package.json", include_str!("../../templates/ts/package.json")),
    ("tsconfig.json", include_str!("../../templates/ts/tsconfig.json")),
    ("README.md", include_str!("../../templates/ts/README.md")),
    (".gitignore", include_str!("../../templates/ts/gitignore")),
    ("events.jsonl", include_str!("../../templates/ts/events.jsonl")),
    ("{{module}}.ts", include_str!("../../templates/ts/handler.ts")),
    ("test/{{module}}.test.ts", include_str!("../../templates/ts/handler.test.ts")),
];

/// The JavaScript project's own files; `{{module}}` in a path is the module.
const JS_PROJECT: &[(&str, &str)] = &[
    ("package.json", include_str!("../../templates/js/package.json")),
    ("tsconfig.json", include_str!("../../templates/js/tsconfig.json")),
    ("README.md", include_str!("../../templates/js/README.md")),
    (".gitignore", include_str!("../../templates/js/gitignore")),
    ("events.jsonl", include_str!("../../templates/js/events.jsonl")),
    ("{{module}}.js", include_str!("../../templates/js/handler.js")),
    ("test/{{module}}.test.js", include_str!("../../templates/js/handler.test.js")),
];

/// The names a project's parts get from the name given.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Names {
    /// As given: the package and the component file (`my-handler`).
    name: String,
    /// Rust: the module type (`MyHandler`); Python, TypeScript and
    /// JavaScript: the module and its file (`my_handler`).
    module: String,
}

impl Names {
    fn new(name: &str, lang: Lang) -> Result<Self, ScaffoldError> {
        let bad = |reason| ScaffoldError::BadName { name: name.to_owned(), reason };
        if name.is_empty() || name.len() > 64 {
            return Err(bad("it must have 1 to 64 characters"));
        }
        if !name.chars().next().is_some_and(|c| c.is_ascii_alphabetic()) {
            return Err(bad("it must start with an ASCII letter"));
        }
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(bad("it may hold only ASCII letters, digits, `-` and `_`"));
        }
        let snake = name.replace('-', "_").to_ascii_lowercase();
        if RESERVED.contains(&snake.as_str()) {
            return Err(bad("it is a keyword or the name of a crate or module it depends on"));
        }
        if lang == Lang::Python && PYTHON_STDLIB.split_whitespace().any(|module| module == snake) {
            return Err(bad("the handler module would shadow Python's standard module of that name"));
        }
        let module = match lang {
            Lang::Rust => snake
                .split('_')
                .filter(|part| !part.is_empty())
                .map(|part| part[..1].to_ascii_uppercase() + &part[1..])
                .collect(),
            Lang::Python | Lang::Ts | Lang::Js => snake,
        };
        Ok(Self { name: name.to_owned(), module })
    }

    /// `text` with its placeholders filled in.
    fn fill(&self, text: &str) -> String {
        text.replace("{{name}}", &self.name)
            .replace("{{module}}", &self.module)
            .replace("{{version}}", VERSION)
            .replace("{{componentize_py}}", TESTED_COMPONENTIZE_PY)
            .replace("{{componentize_js}}", js::TESTED_COMPONENTIZE_JS)
            .replace("{{esbuild}}", js::TESTED_ESBUILD)
            .replace("{{tsx}}", js::TESTED_TSX)
            .replace("{{typescript}}", js::TESTED_TYPESCRIPT)
            .replace("{{types_node}}", js::TESTED_TYPES_NODE)
    }
}

/// Names a project cannot take: Rust and Python keywords, and the crates
/// and modules the project uses (its own name would shadow them).
const RESERVED: &[&str] = &[
    "std",
    "core",
    "alloc",
    "test",
    "proc_macro",
    "self",
    "super",
    "crate",
    "serde",
    "serde_json",
    "wit_bindgen",
    "wakuwaku",
    "wakuwaku_guest",
    "wakuwaku_core",
    "wit_world",
    "componentize_py",
    "tests",
    "vendor",
    "as",
    "async",
    "await",
    "break",
    "const",
    "continue",
    "dyn",
    "else",
    "enum",
    "extern",
    "false",
    "fn",
    "for",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "match",
    "mod",
    "move",
    "mut",
    "pub",
    "ref",
    "return",
    "static",
    "struct",
    "trait",
    "true",
    "type",
    "unsafe",
    "use",
    "where",
    "while",
    "and",
    "assert",
    "class",
    "def",
    "del",
    "elif",
    "except",
    "finally",
    "from",
    "global",
    "import",
    "is",
    "lambda",
    "none",
    "nonlocal",
    "not",
    "or",
    "pass",
    "raise",
    "try",
    "with",
    "yield",
    "pytest",
];

/// Python standard modules a handler module must not shadow (those the
/// SDK, componentize-py's bindings and common handlers import), separated
/// by spaces.
const PYTHON_STDLIB: &str = "abc array ast asyncio base64 binascii bisect builtins codecs collections contextlib \
    copy csv dataclasses datetime decimal dis email enum errno fractions functools gc glob hashlib heapq http \
    inspect io itertools json keyword linecache logging marshal math numbers operator os pathlib pickle platform \
    queue random re secrets select shutil signal site socket sqlite3 string struct sys tempfile textwrap threading \
    time token tokenize traceback types typing unittest uuid warnings weakref zipfile";

/// Writes a new `lang` project called `name` into `dir` (created if
/// missing; refused if not empty).
pub fn create(name: &str, lang: Lang, dir: &Path) -> Result<Created, ScaffoldError> {
    let names = Names::new(name, lang)?;
    let io = |what, path: &Path| {
        let path = path.to_owned();
        move |source| ScaffoldError::Io { what, path, source }
    };
    let existed = dir.exists();
    if existed && std::fs::read_dir(dir).map_err(io("reading", dir))?.next().is_some() {
        return Err(ScaffoldError::NotEmpty(dir.to_owned()));
    }
    let files: Vec<(String, String)> = match lang {
        Lang::Rust => RUST_PROJECT
            .iter()
            .chain(RUST_SDK_MANIFESTS)
            .map(|(path, text)| (path.to_string(), names.fill(text)))
            .chain(RUST_SDK.iter().map(|(path, text)| (path.to_string(), text.to_string())))
            .collect(),
        Lang::Python => PYTHON_PROJECT
            .iter()
            .map(|(path, text)| (names.fill(path), names.fill(text)))
            .chain(PYTHON_SDK.iter().map(|(path, text)| (path.to_string(), text.to_string())))
            .collect(),
        Lang::Ts | Lang::Js => (if lang == Lang::Ts { TS_PROJECT } else { JS_PROJECT })
            .iter()
            .map(|(path, text)| (names.fill(path), names.fill(text)))
            .chain(JS_SDK.iter().map(|(path, text)| (path.to_string(), text.to_string())))
            .collect(),
    };
    let written = files.iter().try_for_each(|(relative, text)| {
        let path = dir.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
        }
        std::fs::write(&path, text).map_err(io("writing", &path))
    });
    if let Err(error) = written {
        if !existed {
            let _ = std::fs::remove_dir_all(dir);
        }
        return Err(error);
    }
    Ok(Created { dir: dir.to_owned(), files: files.into_iter().map(|(path, _)| PathBuf::from(path)).collect() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_a_package_a_type_and_a_module() {
        assert_eq!(Names::new("my-handler", Lang::Rust).unwrap().module, "MyHandler");
        assert_eq!(Names::new("visits_2", Lang::Rust).unwrap().module, "Visits2");
        assert_eq!(Names::new("a--b", Lang::Rust).unwrap().module, "AB");
        assert_eq!(Names::new("My-Handler", Lang::Python).unwrap().module, "my_handler");
    }

    #[test]
    fn bad_names_are_refused_saying_why() {
        for (name, reason) in [
            ("", "1 to 64"),
            (&"x".repeat(65), "1 to 64"),
            ("9lives", "start with an ASCII letter"),
            ("-x", "start with an ASCII letter"),
            ("my handler", "only ASCII letters"),
            ("../escape", "start with an ASCII letter"),
            ("a/b", "only ASCII letters"),
            ("héllo", "only ASCII letters"),
            ("test", "keyword"),
            ("wakuwaku-guest", "keyword"),
            ("class", "keyword"),
        ] {
            let error = Names::new(name, Lang::Rust).unwrap_err().to_string();
            assert!(error.contains(reason), "{name}: {error}");
            assert!(error.starts_with(&format!("`{name}` cannot name a handler project")), "{error}");
        }
        let error = Names::new("json", Lang::Python).unwrap_err().to_string();
        assert!(error.contains("would shadow Python's standard module"), "{error}");
        assert_eq!(Names::new("json", Lang::Rust).unwrap().module, "Json");
    }

    #[test]
    fn a_non_empty_directory_is_refused_and_kept_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("mine.txt"), "keep").unwrap();
        let error = create("visits", Lang::Rust, dir.path()).unwrap_err();
        assert!(matches!(error, ScaffoldError::NotEmpty(_)), "{error}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert_eq!(std::fs::read_to_string(dir.path().join("mine.txt")).unwrap(), "keep");
    }

    #[test]
    fn a_project_is_written_with_its_names_and_the_sdk() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let created = create("my-handler", Lang::Rust, &empty).unwrap();
        let read = |path: &str| std::fs::read_to_string(empty.join(path)).unwrap();
        assert!(read("Cargo.toml").contains("name = \"my-handler\""));
        assert!(read("src/lib.rs").contains("export_module!(MyHandler: Visited)"));
        assert_eq!(read("README.md").lines().count(), 3);
        assert_eq!(read("vendor/wakuwaku/wit/handler.wit"), HANDLER_WIT_0_2);
        assert_eq!(read("vendor/wakuwaku/wit/handler-0.4.wit"), HANDLER_WIT);
        assert_eq!(read("vendor/wakuwaku/wit/handler-0.5.wit"), HANDLER_WIT_0_5);
        assert_eq!(read("vendor/wakuwaku/wit/handler-0.3.wit"), HANDLER_WIT_0_3);
        assert!(read("vendor/wakuwaku/guest-sdk/Cargo.toml").contains(&format!("version = \"{VERSION}\"")));
        let no_placeholder = |path: &PathBuf| !std::fs::read_to_string(empty.join(path)).unwrap().contains("{{");
        assert!(created.files.iter().filter(|p| !p.starts_with("vendor/wakuwaku/core")).all(no_placeholder));

        let python = dir.path().join("py");
        let created = create("my-handler", Lang::Python, &python).unwrap();
        assert!(created.files.contains(&PathBuf::from("my_handler.py")));
        assert!(created.files.contains(&PathBuf::from("tests/test_my_handler.py")));
        let pyproject = std::fs::read_to_string(python.join("pyproject.toml")).unwrap();
        let project =
            crate::authoring::guest_build::python::PythonProject::parse(&python.join("pyproject.toml"), &pyproject);
        assert_eq!(project.unwrap().module, "my_handler");
        assert!(python.join("vendor/wakuwaku_guest/__init__.py").is_file());

        for (lang, main) in [(Lang::Ts, "my_handler.ts"), (Lang::Js, "my_handler.js")] {
            let project_dir = dir.path().join(main);
            let created = create("my-handler", lang, &project_dir).unwrap();
            assert!(created.files.contains(&PathBuf::from(main)), "{lang:?}");
            let package_json = std::fs::read_to_string(project_dir.join("package.json")).unwrap();
            let (project, name) =
                crate::authoring::guest_build::js::JsProject::parse(&project_dir.join("package.json"), &package_json)
                    .unwrap();
            assert_eq!((project.main, name.as_deref()), (PathBuf::from(main), Some("my-handler")));
            assert!(package_json.contains(&format!("\"esbuild\": \"{}\"", js::TESTED_ESBUILD)), "{package_json}");
            assert!(
                project_dir
                    .join("vendor/wakuwaku-guest/wit/handler-0.5/interfaces/wakuwaku-handler-timers.d.ts")
                    .is_file()
            );
            let no_placeholder =
                |path: &PathBuf| !std::fs::read_to_string(project_dir.join(path)).unwrap().contains("{{");
            assert!(created.files.iter().filter(|p| !p.starts_with("vendor")).all(no_placeholder), "{lang:?}");
        }
    }

    /// Every source file of the SDKs (and nothing else) is copied; a file
    /// added to `core/src`, `guest-sdk/src` or the Python package must be
    /// added to the lists above.
    #[test]
    fn vendored_sources_are_the_repositorys() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let listed = |files: &[(&str, &str)], prefix: &str| -> Vec<String> {
            let mut names: Vec<String> =
                files.iter().filter_map(|(path, _)| path.strip_prefix(prefix)).map(str::to_owned).collect();
            names.sort();
            names
        };
        let on_disk = |dir: &str| -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(repo.join(dir))
                .unwrap()
                .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|name| name.ends_with(".rs") || name.ends_with(".py"))
                .collect();
            names.sort();
            names
        };
        assert_eq!(listed(RUST_SDK, "vendor/wakuwaku/core/src/"), on_disk("core/src"));
        assert_eq!(listed(RUST_SDK, "vendor/wakuwaku/guest-sdk/src/"), on_disk("guest-sdk/src"));
        assert_eq!(listed(PYTHON_SDK, "vendor/wakuwaku_guest/"), on_disk("guest-sdk-python/src/wakuwaku_guest"));
        let sdk = repo.join("guest-sdk-js/src");
        let mut js_files: Vec<String> = walkdir::WalkDir::new(&sdk)
            .into_iter()
            .map(Result::unwrap)
            .filter(|entry| entry.file_type().is_file())
            .map(|entry| entry.path().strip_prefix(&sdk).unwrap().to_string_lossy().into_owned())
            .collect();
        js_files.sort();
        assert_eq!(listed(JS_SDK, "vendor/wakuwaku-guest/"), js_files);
    }

    /// The versions `waku new` pins in a TypeScript or JavaScript project are
    /// the ones the repository's root package.json pins (and tests with).
    #[test]
    fn pinned_npm_versions_are_the_repositorys() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let text = std::fs::read_to_string(repo.join("package.json")).unwrap();
        let root: serde_json::Value = serde_json::from_str(&text).unwrap();
        let pins = &root["devDependencies"];
        assert_eq!(pins["@bytecodealliance/componentize-js"], js::TESTED_COMPONENTIZE_JS);
        assert_eq!(pins["esbuild"], js::TESTED_ESBUILD);
        assert_eq!(pins["tsx"], js::TESTED_TSX);
        assert_eq!(pins["typescript"], js::TESTED_TYPESCRIPT);
        assert_eq!(pins["@types/node"], js::TESTED_TYPES_NODE);
    }

    /// The vendored manifests ask for the dependencies the repository's
    /// crates have, at the workspace's versions.
    #[test]
    fn vendored_manifests_match_the_workspace() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let toml_of = |path: &Path| -> toml::Table { std::fs::read_to_string(path).unwrap().parse().unwrap() };
        let workspace = toml_of(&repo.join("Cargo.toml"));
        let versions = workspace["workspace"]["dependencies"].as_table().unwrap();
        for (crate_dir, (_, template)) in ["core", "guest-sdk"].iter().zip(RUST_SDK_MANIFESTS) {
            let ours = toml_of(&repo.join(crate_dir).join("Cargo.toml"));
            let copy: toml::Table = template.parse().unwrap();
            let ours = ours["dependencies"].as_table().unwrap();
            let copy = copy["dependencies"].as_table().unwrap();
            assert_eq!(ours.keys().collect::<Vec<_>>(), copy.keys().collect::<Vec<_>>(), "{crate_dir}");
            for (name, spec) in copy {
                if name.starts_with("wakuwaku") {
                    continue; // a path within the copy
                }
                let expected = &versions[name];
                let normalised = |value: &toml::Value| match value {
                    toml::Value::String(version) => toml::Value::Table(toml::Table::from_iter([(
                        "version".to_owned(),
                        toml::Value::String(version.clone()),
                    )])),
                    other => other.clone(),
                };
                assert_eq!(normalised(spec), normalised(expected), "{crate_dir}: {name}");
            }
        }
    }
}
