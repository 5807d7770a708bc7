//! `waku new`: a handler project, Rust, Python, TypeScript or JavaScript,
//! that builds anywhere.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::authoring::guest_build::python::TESTED_COMPONENTIZE_PY;
use crate::authoring::scaffold::{self, Lang};

#[derive(Args)]
pub(super) struct NewArgs {
    /// The project's name: the crate or Python package, and the component
    /// file (ASCII letters, digits, `-`, `_`; starts with a letter).
    name: String,
    /// The handler's language.
    #[arg(long, value_enum, default_value_t = Lang::Rust)]
    lang: Lang,
    /// Where to create it (default: ./<name>); must be new or empty.
    #[arg(long)]
    path: Option<PathBuf>,
}

pub(super) fn new_project(args: NewArgs) -> Result<()> {
    let dir = args.path.unwrap_or_else(|| PathBuf::from(&args.name));
    let created = scaffold::create(&args.name, args.lang, &dir)?;
    outln!("created {} ({} files)", created.dir.display(), created.files.len())?;
    let (dir, name) = (dir.display(), &args.name);
    let next = match args.lang {
        Lang::Rust => format!("cd {dir} && cargo test && waku build . --out {name}.wasm"),
        Lang::Python => format!(
            "cd {dir} && python3 -m venv .venv && .venv/bin/pip install componentize-py=={TESTED_COMPONENTIZE_PY} \
             pytest && .venv/bin/python -m pytest && waku build . --out {name}.wasm"
        ),
        Lang::Ts | Lang::Js => format!("cd {dir} && npm install && npm test && waku build . --out {name}.wasm"),
    };
    errln!("next: {next}; then `waku test {name}.wasm events.jsonl`");
    Ok(())
}
