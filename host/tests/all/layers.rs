//! The layers of `host/src` are its folders, top to bottom as `LAYERS`
//! lists them: a module imports from its own layer and the layers below,
//! never above. Read from the sources: every `crate::` path (plain or in a
//! `use crate::{…}` group) and every `super::` chain that climbs to the
//! crate root names the layer it reaches. Comments are not read.

use std::path::{Path, PathBuf};

/// The layers, top to bottom.
const LAYERS: [&str; 7] = ["cli", "authoring", "operations", "engine", "sandbox", "storage", "platform"];

fn rank(layer: &str) -> Option<usize> {
    LAYERS.iter().position(|known| *known == layer)
}

/// The code of `source`, line comments removed.
fn code(source: &str) -> String {
    source.lines().map(|line| line.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

fn ident_at(text: &str) -> &str {
    let end = text.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(text.len());
    &text[..end]
}

/// The layers `source` reaches from the module at `module` (its path from
/// the crate root, the file's folders and name).
fn reached(module: &[&str], source: &str) -> Vec<String> {
    let code = code(source);
    let mut layers = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        if at > 0 && code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue; // `wakuwaku_crate::`, not this crate.
        }
        let rest = &code[at + "crate::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => layers.extend(group_heads(group)),
            None => layers.push(ident_at(rest).to_owned()),
        }
    }
    for (at, _) in code.match_indices("super::") {
        if code[..at].ends_with("super::") {
            continue; // inside a chain, counted from its start
        }
        let mut rest = &code[at..];
        let mut climbs = 0;
        while let Some(after) = rest.strip_prefix("super::") {
            climbs += 1;
            rest = after;
        }
        if climbs == module.len() {
            layers.push(ident_at(rest).to_owned());
        }
    }
    layers
}

/// The first names of the items of a `{…}` group.
fn group_heads(group: &str) -> Vec<String> {
    let (mut depth, mut heads, mut start) = (0usize, Vec::new(), true);
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => start = true,
            c if start && depth == 0 && (c.is_alphanumeric() || c == '_') => {
                heads.push(ident_at(&group[at..]).to_owned());
                start = false;
            }
            _ => {}
        }
    }
    heads
}

/// Every import in `source` of the module at `module` that points up.
fn upward(module: &[&str], source: &str) -> Vec<String> {
    let Some(own) = module.first().and_then(|layer| rank(layer)) else { return Vec::new() };
    reached(module, source).into_iter().filter(|layer| rank(layer).is_some_and(|reached| reached < own)).collect()
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn layers_import_only_downwards() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap().with_extension("");
        let mut module: Vec<&str> = relative.iter().map(|part| part.to_str().unwrap()).collect();
        if module.last() == Some(&"mod") {
            module.pop();
        }
        for layer in upward(&module, &std::fs::read_to_string(file).unwrap()) {
            found.push(format!("{} ({}) imports from `{layer}`", relative.display(), module[0]));
        }
    }
    assert!(files.len() > 100, "read the sources: {}", files.len());
    assert!(found.is_empty(), "imports that point up a layer (top to bottom: {LAYERS:?}):\n{}", found.join("\n"));
}

#[test]
fn the_check_sees_an_upward_import_however_it_is_written() {
    let storage = ["storage", "log", "loss"];
    assert_eq!(upward(&storage, "use crate::engine::consumer::ConsumerError;"), ["engine"]);
    assert_eq!(upward(&storage, "use crate::{platform::clock, engine::{routing, outbox}};"), ["engine"]);
    assert_eq!(upward(&storage, "fn f() -> crate::operations::host::Host { todo!() }"), ["operations"]);
    assert_eq!(upward(&storage, "use super::super::super::sandbox::runtime;"), ["sandbox"]);
    assert!(upward(&storage, "use super::super::state::StateStore; use crate::platform::clock::now_ms;").is_empty());
    assert!(upward(&storage, "// see crate::engine::consumer\nuse crate::event::Header;").is_empty());
    assert!(upward(&["engine", "consumer"], "use crate::storage::log::EventLog;").is_empty(), "down is fine");
}

/// Every folder of `dir` (itself included) that is a module (`mod.rs`).
fn module_folders(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
    if dir.join("mod.rs").is_file() {
        found.push(dir.to_owned());
    }
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|entry| entry.unwrap().path()).collect();
    entries.sort();
    for entry in entries.into_iter().filter(|entry| entry.is_dir()) {
        module_folders(&entry, found);
    }
}

#[test]
fn every_folder_names_its_files_first() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut folders = Vec::new();
    module_folders(&src, &mut folders);
    for layer in LAYERS {
        assert!(folders.contains(&src.join(layer)), "{layer} is a folder with a mod.rs");
    }
    for folder in folders {
        let name = folder.strip_prefix(&src).unwrap().display().to_string();
        let text = std::fs::read_to_string(folder.join("mod.rs")).unwrap();
        let docs: String = text.lines().take_while(|line| line.starts_with("//!")).collect::<Vec<_>>().join("\n");
        let declared: Vec<&str> = text
            .lines()
            .map(|line| {
                line.trim_start_matches("pub(crate) ").trim_start_matches("pub(super) ").trim_start_matches("pub ")
            })
            .filter_map(|line| line.strip_prefix("mod ")?.strip_suffix(';'))
            .collect();
        assert!(!declared.is_empty(), "{name}/mod.rs declares its modules");
        for module in declared {
            assert!(docs.contains(&format!("`{module}`")), "{name}/mod.rs's opening names `{module}`");
        }
    }
}
