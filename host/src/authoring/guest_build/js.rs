//! Building a TypeScript or JavaScript project into a handler component
//! with esbuild and componentize-js.
//!
//! A project is a directory with a `package.json` whose `wakuwaku` field
//! names the file whose default export is the module (the TypeScript
//! SDK's `Module`), and optionally more directories the build reads:
//!
//! ```json
//! "wakuwaku": { "main": "bank.ts", "sources": ["../../guest-sdk-js/src"] }
//! ```
//!
//! The build writes a one-line entry beside the component
//! (`export const handler = exportHandler(module)`, from
//! `wakuwaku-guest/component`), bundles it with esbuild into one ES module
//! (types stripped; `wakuwaku-guest` resolved through the `paths` of the
//! project's `tsconfig.json` or `jsconfig.json`; the WIT imports left to
//! the component), and hands the bundle to componentize-js against the
//! contract this host implements (written to a temporary directory), world
//! `module`, with its `http` and `fetch-event` features off (the host links
//! no `wasi:http`). Its ahead-of-time option is never used: it downloads a
//! binary. componentize-js runs under a small driver
//! (`host/templates/build/componentize.mjs`) that fixes one line of the
//! bindings it generates: up to 0.23 they abort the instance on every
//! negative `s64` argument of an import (a negative counter delta;
//! bytecodealliance/ComponentizeJS#343), and the driver lowers it as the
//! same 64 bits unsigned, which the engine accepts.
//!
//! Both tools come from npm and are looked for as node looks for packages:
//! in `node_modules/.bin` of the project and of each directory above it
//! (the repository's examples use the root's). When either is missing, the
//! error says how to install them. [`TESTED_COMPONENTIZE_JS`] is the
//! version this host is tested with; another builds with a warning.
//!
//! componentize-js's output differs from build to build of the same
//! sources (it snapshots a running engine), and a new file is a new module
//! version to the host. So a build is skipped when nothing it reads has
//! changed: a stamp beside the component holds a digest of the contract,
//! the driver, the componentize-js version, the project's settings and every file under
//! the project and its `sources` (but `target`, `node_modules`, hidden
//! directories and `*.wasm` components).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;

use super::BuildError;
use super::stamped::{Stamped, inputs_digest, io, output_tail, show_output};
// The contract this host implements, timers included: the TypeScript SDK's.
use super::python::HANDLER_WIT_0_5 as HANDLER_WIT;

/// The componentize-js version the host and the TypeScript SDK are tested
/// with (the root `package.json` pins it).
pub const TESTED_COMPONENTIZE_JS: &str = "0.23.0";

/// The esbuild version the TypeScript SDK is tested with.
pub const TESTED_ESBUILD: &str = "0.28.2";

/// The tsx version (TypeScript under node's test runner) the SDK is tested with.
pub const TESTED_TSX: &str = "4.23.15";

/// The TypeScript version the SDK is type-checked with.
pub const TESTED_TYPESCRIPT: &str = "5.9.3";

/// The version of node's types the SDK is type-checked with.
pub const TESTED_TYPES_NODE: &str = "20.19.43";

/// The world components target.
const WORLD: &str = "module";

/// The driver that runs componentize-js's command line with the `s64` fix
/// (see the module docs).
const DRIVER: &str = include_str!("../../../templates/build/componentize.mjs");

/// The `wakuwaku` field of a project's `package.json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsProject {
    /// The file, relative to the project, whose default export is the
    /// module (`.ts`, `.mts`, `.js` or `.mjs`).
    pub main: PathBuf,
    /// More directories the build reads (the SDK's sources, say), relative
    /// to the project: part of the digest that decides whether to rebuild.
    #[serde(default)]
    pub sources: Vec<PathBuf>,
}

#[derive(Deserialize)]
struct PackageJson {
    name: Option<String>,
    wakuwaku: Option<JsProject>,
}

impl JsProject {
    /// Reads the `wakuwaku` field of `package_json` (the file's path, for
    /// messages) from its text, and the package's name.
    pub fn parse(package_json: &Path, text: &str) -> Result<(Self, Option<String>), BuildError> {
        let invalid = |reason: String| BuildError::PackageJson { path: package_json.to_owned(), reason };
        let parsed: PackageJson = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let project = parsed.wakuwaku.ok_or_else(|| {
            invalid(
                "it has no `wakuwaku` field; add one naming the file whose default export is the module: \
                 \"wakuwaku\": {\"main\": \"handler.ts\"}"
                    .to_owned(),
            )
        })?;
        let script = project.main.extension().and_then(|ext| ext.to_str());
        if !matches!(script, Some("ts" | "mts" | "js" | "mjs")) || project.main.is_absolute() {
            return Err(invalid(format!(
                "wakuwaku.main `{}` is not a .ts, .mts, .js or .mjs file in the project",
                project.main.display()
            )));
        }
        Ok((project, parsed.name))
    }
}

/// The npm tools a build runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsTools {
    /// `node_modules/.bin/esbuild`.
    pub esbuild: PathBuf,
    /// componentize-js's command line (`src/cli.js` of its package), run
    /// with node through the driver.
    pub componentize_js: PathBuf,
    /// The componentize-js version (its package.json's), or `unknown`.
    pub version: String,
}

/// The npm tools for the project in `dir`: the first `node_modules` of it
/// or a directory above it that holds both, as node finds packages.
pub fn find_js_tools(dir: &Path) -> Result<JsTools, BuildError> {
    for at in dir.ancestors() {
        let modules = at.join("node_modules");
        let esbuild = modules.join(".bin").join("esbuild");
        let package = modules.join("@bytecodealliance").join("componentize-js");
        let componentize_js = package.join("src").join("cli.js");
        if esbuild.is_file() && componentize_js.is_file() {
            let manifest = package.join("package.json");
            let version = std::fs::read_to_string(manifest)
                .ok()
                .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
                .and_then(|value| value["version"].as_str().map(str::to_owned))
                .unwrap_or_else(|| "unknown".to_owned());
            return Ok(JsTools { esbuild, componentize_js, version });
        }
    }
    Err(BuildError::JsToolsMissing { dir: dir.to_owned() })
}

/// Builds the project in `dir` into `<out_dir>/<name>.wasm` (its package
/// name, else its main file's stem) and returns that path.
pub(super) fn build(dir: &Path, out_dir: &Path, quiet: bool) -> Result<PathBuf, BuildError> {
    let dir = &std::path::absolute(dir).map_err(|e| io("resolving", dir, e))?;
    let out_dir = &std::path::absolute(out_dir).map_err(|e| io("resolving", out_dir, e))?;
    let package_json = dir.join("package.json");
    let text = std::fs::read_to_string(&package_json)
        .map_err(|e| BuildError::PackageJson { path: package_json.clone(), reason: e.to_string() })?;
    let (project, name) = JsProject::parse(&package_json, &text)?;
    let tools = find_js_tools(dir)?;
    if tools.version != TESTED_COMPONENTIZE_JS && !quiet {
        eprintln!(
            "waku: warning: componentize-js {} is not the tested {TESTED_COMPONENTIZE_JS}; if the build or the \
             module fails, install that one (npm install --save-dev @bytecodealliance/componentize-js@{})",
            tools.version, TESTED_COMPONENTIZE_JS
        );
    }
    build_with(&tools, &project, &component_name(name.as_deref(), &project.main), dir, out_dir, quiet)
}

/// The component's file stem: the package name (its scope dropped, any
/// character but letters, digits, `-` and `_` made `_`), else the main
/// file's stem.
fn component_name(package: Option<&str>, main: &Path) -> String {
    let name = package.map(|name| name.rsplit('/').next().unwrap_or(name)).filter(|name| !name.is_empty());
    let name = name.map(str::to_owned).unwrap_or_else(|| {
        main.file_stem().map(|stem| stem.to_string_lossy().into_owned()).unwrap_or_else(|| "module".to_owned())
    });
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

/// Builds `project` (in `dir`) with `tools`, unless the component there was
/// built from the same inputs.
fn build_with(
    tools: &JsTools,
    project: &JsProject,
    name: &str,
    dir: &Path,
    out_dir: &Path,
    quiet: bool,
) -> Result<PathBuf, BuildError> {
    let package_json = dir.join("package.json");
    if !dir.join(&project.main).is_file() {
        return Err(BuildError::PackageJson {
            path: package_json,
            reason: format!("wakuwaku.main names `{}`, which is not a file in the project", project.main.display()),
        });
    }
    if let Some(missing) = project.sources.iter().find(|path| !dir.join(path).is_dir()) {
        return Err(BuildError::PackageJson {
            path: package_json,
            reason: format!(
                "wakuwaku.sources names `{}`, which is not a directory (paths are relative to the project)",
                missing.display()
            ),
        });
    }
    let fields = [
        HANDLER_WIT.as_bytes(),
        DRIVER.as_bytes(),
        tools.version.as_bytes(),
        project.main.as_os_str().as_encoded_bytes(),
    ];
    let roots = std::iter::once(dir.to_owned()).chain(project.sources.iter().map(|path| dir.join(path)));
    let build = Stamped::new(out_dir, name, inputs_digest(&fields, roots, "node_modules")?);
    if build.is_current() {
        return Ok(build.out);
    }
    std::fs::create_dir_all(out_dir).map_err(|e| io("creating", out_dir, e))?;
    let scratch = tempfile::tempdir().map_err(|e| io("creating a directory for", Path::new("the build"), e))?;
    let wit = scratch.path().join("handler.wit");
    std::fs::write(&wit, HANDLER_WIT).map_err(|e| io("writing", &wit, e))?;
    let entry = scratch.path().join("entry.js");
    let main = serde_json::to_string(&dir.join(&project.main).to_string_lossy()).unwrap_or_default();
    let entry_text = format!(
        "import module from {main};\nimport {{ exportHandler }} from \"wakuwaku-guest/component\";\n\
         export const handler = exportHandler(module);\n"
    );
    std::fs::write(&entry, entry_text).map_err(|e| io("writing", &entry, e))?;
    let bundle = scratch.path().join("bundle.js");

    let mut esbuild = Command::new(&tools.esbuild);
    esbuild
        .arg(&entry)
        .args(["--bundle", "--format=esm", "--platform=neutral", "--target=es2022", "--log-level=warning"])
        .arg("--external:wakuwaku:*")
        .arg(format!("--outfile={}", bundle.display()))
        .current_dir(dir);
    if let Some(config) = ["tsconfig.json", "jsconfig.json"].iter().map(|name| dir.join(name)).find(|p| p.is_file()) {
        esbuild.arg(format!("--tsconfig={}", config.display()));
    }
    run(&mut esbuild, "esbuild", dir, quiet)?;

    let driver = scratch.path().join("componentize.mjs");
    std::fs::write(&driver, DRIVER).map_err(|e| io("writing", &driver, e))?;
    let mut componentize = Command::new("node");
    componentize
        .arg(&driver)
        .arg(&tools.componentize_js)
        .arg(&bundle)
        .arg("--wit")
        .arg(&wit)
        .args(["--world-name", WORLD, "--disable", "http", "fetch-event", "--out"])
        .arg(&build.partial)
        .current_dir(dir);
    if let Err(error) = run(&mut componentize, "componentize-js", dir, quiet) {
        let _ = std::fs::remove_file(&build.partial);
        return Err(error);
    }
    build.finish()
}

/// Runs one build tool; its output is shown when it succeeds (unless
/// `quiet`) and ends the error when it fails.
fn run(command: &mut Command, tool: &'static str, dir: &Path, quiet: bool) -> Result<(), BuildError> {
    let program = PathBuf::from(command.get_program());
    let output = command.stdin(Stdio::null()).output().map_err(|e| io("running", &program, e))?;
    if !output.status.success() {
        return Err(BuildError::JsBuild { tool, dir: dir.to_owned(), output: output_tail(&output) });
    }
    show_output(&output, quiet);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<(JsProject, Option<String>), String> {
        JsProject::parse(Path::new("p/package.json"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn reads_the_main_file_and_sources() {
        let (project, name) =
            parse(r#"{"name":"bank-ts","wakuwaku":{"main":"bank.ts","sources":["../sdk"]},"scripts":{}}"#).unwrap();
        assert_eq!(project, JsProject { main: "bank.ts".into(), sources: vec!["../sdk".into()] });
        assert_eq!(name.as_deref(), Some("bank-ts"));
        assert_eq!(parse(r#"{"wakuwaku":{"main":"h.js"}}"#).unwrap().0.sources, Vec::<PathBuf>::new());
    }

    #[test]
    fn a_missing_or_wrong_field_says_what_to_write() {
        let error = parse(r#"{"name":"x"}"#).unwrap_err();
        assert!(error.contains("p/package.json") && error.contains(r#""wakuwaku": {"main": "handler.ts"}"#), "{error}");
        assert!(parse(r#"{"wakuwaku":{"mian":"a.ts"}}"#).unwrap_err().contains("unknown field `mian`"));
        for bad in ["bank.py", "bank", "/abs/bank.ts"] {
            let error = parse(&format!(r#"{{"wakuwaku":{{"main":"{bad}"}}}}"#)).unwrap_err();
            assert!(error.contains("is not a .ts, .mts, .js or .mjs file"), "{bad}: {error}");
        }
        assert!(parse("not json").unwrap_err().contains("p/package.json"));
    }

    #[test]
    fn components_are_named_by_the_package() {
        assert_eq!(component_name(Some("bank-ts"), Path::new("bank.ts")), "bank-ts");
        assert_eq!(component_name(Some("@acme/shop.v2"), Path::new("h.ts")), "shop_v2");
        assert_eq!(component_name(None, Path::new("src/visits.ts")), "visits");
    }

    /// Stand-in tools: esbuild a shell script, componentize-js a node
    /// script; each records its arguments and writes the file it is asked
    /// for (`--outfile=`, `--out`), or fails when asked to.
    #[cfg(unix)]
    fn fake_tools(dir: &Path, fails: bool) -> JsTools {
        use std::os::unix::fs::PermissionsExt;
        let modules = dir.join("node_modules");
        let cli = modules.join("@bytecodealliance/componentize-js/src/cli.js");
        std::fs::create_dir_all(modules.join(".bin")).unwrap();
        std::fs::create_dir_all(cli.parent().unwrap()).unwrap();
        let log = dir.join("calls");
        let esbuild = if fails {
            "echo 'error: Could not resolve \"wakuwaku-guest\"' >&2; exit 1".to_owned()
        } else {
            "for a in \"$@\"; do case \"$a\" in --outfile=*) echo bundle > \"${a#--outfile=}\";; esac; done".to_owned()
        };
        let script = modules.join(".bin/esbuild");
        std::fs::write(&script, format!("#!/bin/sh\necho esbuild \"$@\" >> {}\n{esbuild}\n", log.display())).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let node = format!(
            "import {{ appendFileSync, writeFileSync }} from 'node:fs';\n\
             const args = process.argv.slice(2);\n\
             appendFileSync({log:?}, 'componentize-js ' + args.join(' ') + '\\n');\n\
             writeFileSync(args[args.indexOf('--out') + 1], 'component\\n');\n",
            log = log.display().to_string()
        );
        std::fs::write(&cli, node).unwrap();
        let manifest = modules.join("@bytecodealliance/componentize-js/package.json");
        std::fs::write(manifest, r#"{"type": "module", "version": "0.23.0"}"#).unwrap();
        find_js_tools(&dir.join("project")).unwrap()
    }

    #[test]
    #[cfg(unix)]
    fn builds_with_the_hosts_contract_and_skips_an_unchanged_project() {
        let dir = tempfile::tempdir().unwrap();
        let project_dir = dir.path().join("project");
        std::fs::create_dir_all(project_dir.join("node_modules/x")).unwrap();
        std::fs::write(project_dir.join("bank.ts"), "v1").unwrap();
        std::fs::write(project_dir.join("tsconfig.json"), "{}").unwrap();
        let tools = fake_tools(dir.path(), false);
        assert_eq!(tools.version, "0.23.0", "found in the directory above the project");
        let project = JsProject { main: "bank.ts".into(), sources: Vec::new() };
        let out_dir = project_dir.join("target/js");
        let calls = dir.path().join("calls");
        let build = || {
            let _ = std::fs::remove_file(&calls);
            let out = build_with(&tools, &project, "bank-ts", &project_dir, &out_dir, true).unwrap();
            assert_eq!(out, out_dir.join("bank-ts.wasm"));
            std::fs::read_to_string(&calls).unwrap_or_default()
        };
        let first = build();
        assert!(first.contains("--external:wakuwaku:*") && first.contains("/tsconfig.json"), "{first}");
        assert!(first.contains("--world-name module --disable http fetch-event --out"), "{first}");
        assert!(!first.contains("--aot"), "{first}");
        assert_eq!(std::fs::read_to_string(out_dir.join("bank-ts.wasm")).unwrap(), "component\n");
        assert_eq!(build(), "", "nothing changed");
        std::fs::write(project_dir.join("node_modules/x/y.js"), "tools").unwrap();
        std::fs::write(project_dir.join("bank-ts.wasm"), "a copy").unwrap();
        assert_eq!(build(), "", "node_modules and components are no input");
        std::fs::write(project_dir.join("bank.ts"), "v2").unwrap();
        assert!(!build().is_empty(), "a changed source builds again");
    }

    #[test]
    #[cfg(unix)]
    fn a_failed_build_shows_the_end_of_its_output_and_keeps_the_last_component() {
        let dir = tempfile::tempdir().unwrap();
        let project_dir = dir.path().join("project");
        std::fs::create_dir_all(&project_dir).unwrap();
        std::fs::write(project_dir.join("bank.ts"), "v1").unwrap();
        let out_dir = dir.path().join("out");
        std::fs::create_dir_all(&out_dir).unwrap();
        std::fs::write(out_dir.join("bank.wasm"), "last good").unwrap();
        let tools = fake_tools(dir.path(), true);
        let project = JsProject { main: "bank.ts".into(), sources: Vec::new() };
        let error = build_with(&tools, &project, "bank", &project_dir, &out_dir, true).unwrap_err().to_string();
        assert!(error.starts_with("esbuild could not build"), "{error}");
        assert!(error.ends_with("error: Could not resolve \"wakuwaku-guest\""), "{error}");
        assert_eq!(std::fs::read_to_string(out_dir.join("bank.wasm")).unwrap(), "last good");
        let missing = JsProject { main: "nope.ts".into(), sources: Vec::new() };
        let error = build_with(&tools, &missing, "bank", &project_dir, &out_dir, true).unwrap_err().to_string();
        assert!(error.contains("wakuwaku.main names `nope.ts`, which is not a file"), "{error}");
    }

    #[test]
    fn missing_tools_say_how_to_install_them() {
        let dir = tempfile::tempdir().unwrap();
        let message = find_js_tools(dir.path()).unwrap_err().to_string();
        assert!(message.contains("npm install --save-dev @bytecodealliance/componentize-js@0.23.0"), "{message}");
        assert!(message.contains("esbuild@0.28.2"), "{message}");
    }
}
