//! Building a Python project into a handler component with componentize-py.
//!
//! A Python project is a directory with a `pyproject.toml` that names, in a
//! `[tool.wakuwaku]` table, the Python module defining the component's
//! `Handler` (the Python SDK's `export(module)`), and optionally more
//! directories to import from:
//!
//! ```toml
//! [tool.wakuwaku]
//! module = "bank"                                 # bank.py defines Handler
//! python-path = ["../../guest-sdk-python/src"]    # relative to the project
//! ```
//!
//! The build runs `componentize-py -d <wit> -w module componentize -p <project>
//! -p <python-path>... <module> -o <out>` against the contract this host was
//! built with (0.5, with timers; components built for 0.4 still load) (written to a temporary directory, so a build never depends on
//! a `wit/` folder beside the project). Packages installed in the
//! environment of componentize-py (the Python SDK, say) are found as well.
//!
//! componentize-py is looked for in `WAKU_COMPONENTIZE_PY`, then in the
//! project's own virtual environment (`.venv/bin/componentize-py`), then on
//! `PATH`; when none runs, the error says how to install it. It comes from
//! PyPI; [`TESTED_COMPONENTIZE_PY`] is the version this host is tested
//! with, and another version builds with a warning.
//!
//! componentize-py's output differs from build to build of the same
//! sources (it snapshots a running interpreter), and a new file is a new
//! module version to the host, which cannot reuse its compiled copy. So a
//! build is skipped when nothing it reads has changed: a stamp beside the
//! component holds a digest of the contract, the componentize-py version
//! and every file under the project and its python-path directories (but
//! `target`, hidden directories, `__pycache__` and `*.wasm` components, so
//! a component written into the project is no input). Packages installed in
//! the environment are not in the digest: after upgrading one, delete the
//! component to rebuild.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde::Deserialize;

use super::BuildError;
use super::stamped::{Stamped, inputs_digest, io, output_tail, show_output};

/// The componentize-py version the host and the Python SDK are tested with.
pub const TESTED_COMPONENTIZE_PY: &str = "0.25.1";

/// The environment variable naming the componentize-py executable to use.
pub const COMPONENTIZE_PY_ENV: &str = "WAKU_COMPONENTIZE_PY";

/// The contract before timers (`wit/handler-0.4.wit`), which the host still
/// loads unchanged (Python components built before timers are 0.4 ones);
/// vendored for the Rust SDK's core, which reads its version.
pub const HANDLER_WIT: &str = include_str!("../../../../wit/handler-0.4.wit");

/// The contract this host implements (`wit/handler-0.5.wit`, with timers),
/// which Python components are built against (the Python SDK's `fire`
/// export fails unrecoverably for a module without a timer handler, which
/// sets no timer, so the host never calls it) and the Rust SDK builds for.
pub const HANDLER_WIT_0_5: &str = include_str!("../../../../wit/handler-0.5.wit");

/// The contract before `timed-relaxed` (`wit/handler-0.3.wit`), which the
/// host still loads; vendored for the Rust SDK's core, which reads its
/// version.
pub const HANDLER_WIT_0_3: &str = include_str!("../../../../wit/handler-0.3.wit");

/// The previous contract (`wit/handler.wit`, 0.2), which the host still
/// loads; vendored beside the current one for the Rust SDK's core, which
/// reads its version.
pub const HANDLER_WIT_0_2: &str = include_str!("../../../../wit/handler.wit");

/// The world components target.
const WORLD: &str = "module";

/// The `[tool.wakuwaku]` table of a project's `pyproject.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PythonProject {
    /// The Python module (importable from the project directory or the
    /// python path) that defines `Handler`.
    pub module: String,
    /// More directories to import from, relative to the project.
    #[serde(default)]
    pub python_path: Vec<PathBuf>,
}

#[derive(Deserialize)]
struct PyProject {
    tool: Option<Tools>,
}

#[derive(Deserialize)]
struct Tools {
    wakuwaku: Option<PythonProject>,
}

impl PythonProject {
    /// Reads the `[tool.wakuwaku]` table of `pyproject` (the file's path,
    /// for messages) from its text.
    pub fn parse(pyproject: &Path, text: &str) -> Result<Self, BuildError> {
        let invalid = |reason: String| BuildError::PyProject { path: pyproject.to_owned(), reason };
        let parsed: PyProject = toml::from_str(text).map_err(|e| invalid(e.message().to_owned()))?;
        let project = parsed.tool.and_then(|tool| tool.wakuwaku).ok_or_else(|| {
            invalid(
                "it has no [tool.wakuwaku] table; add one naming the Python module that defines `Handler`: \
                 module = \"<module>\""
                    .to_owned(),
            )
        })?;
        let valid = !project.module.is_empty()
            && project
                .module
                .split('.')
                .all(|part| !part.is_empty() && part.chars().all(|c| c.is_alphanumeric() || c == '_'));
        if !valid {
            return Err(invalid(format!("`{}` is not a Python module name (tool.wakuwaku.module)", project.module)));
        }
        if project.module.split('.').next() == Some("wit_world") {
            return Err(invalid("`wit_world` is the bindings' own module; name the handler module otherwise".into()));
        }
        Ok(project)
    }
}

/// Builds the Python project in `dir` into `<out_dir>/<module>.wasm` and
/// returns that path. componentize-py's output is shown when it is done
/// (`quiet`: only when it fails, in the error).
pub(super) fn build(dir: &Path, out_dir: &Path, quiet: bool) -> Result<PathBuf, BuildError> {
    // componentize-py gets absolute paths: what it reads and writes never
    // depends on its working directory.
    let dir = &std::path::absolute(dir).map_err(|e| io("resolving", dir, e))?;
    let out_dir = &std::path::absolute(out_dir).map_err(|e| io("resolving", out_dir, e))?;
    let pyproject = dir.join("pyproject.toml");
    let text = std::fs::read_to_string(&pyproject)
        .map_err(|e| BuildError::PyProject { path: pyproject.clone(), reason: e.to_string() })?;
    let project = PythonProject::parse(&pyproject, &text)?;
    let tool = find_componentize_py(dir, std::env::var_os(COMPONENTIZE_PY_ENV))?;
    let version = tool_version(&tool);
    if version != TESTED_COMPONENTIZE_PY && !quiet {
        eprintln!(
            "waku: warning: componentize-py {version} is not the tested {TESTED_COMPONENTIZE_PY}; if the build or \
             the module fails, install that one (pip install componentize-py=={TESTED_COMPONENTIZE_PY})"
        );
    }
    build_with(&tool, &version, &project, dir, out_dir, quiet)
}

/// Builds `project` (in `dir`) with the componentize-py `tool` of
/// `version`, unless the component there was built from the same inputs.
fn build_with(
    tool: &OsStr,
    version: &str,
    project: &PythonProject,
    dir: &Path,
    out_dir: &Path,
    quiet: bool,
) -> Result<PathBuf, BuildError> {
    if let Some(missing) = project.python_path.iter().find(|path| !dir.join(path).is_dir()) {
        return Err(BuildError::PyProject {
            path: dir.join("pyproject.toml"),
            reason: format!(
                "tool.wakuwaku.python-path names `{}`, which is not a directory (paths are relative to the project)",
                missing.display()
            ),
        });
    }
    let fields = [HANDLER_WIT_0_5.as_bytes(), version.as_bytes(), project.module.as_bytes()];
    let roots = std::iter::once(dir.to_owned()).chain(project.python_path.iter().map(|path| dir.join(path)));
    let build = Stamped::new(out_dir, &project.module, inputs_digest(&fields, roots, "__pycache__")?);
    if build.is_current() {
        return Ok(build.out);
    }
    let wit_dir = tempfile::tempdir().map_err(|e| io("creating a directory for", Path::new("the WIT"), e))?;
    let wit = wit_dir.path().join("handler.wit");
    std::fs::write(&wit, HANDLER_WIT_0_5).map_err(|e| io("writing", &wit, e))?;
    std::fs::create_dir_all(out_dir).map_err(|e| io("creating", out_dir, e))?;

    let mut command = Command::new(tool);
    command.arg("-d").arg(&wit).args(["-w", WORLD]);
    if quiet {
        command.arg("--quiet");
    }
    command.arg("componentize").arg("-p").arg(dir);
    for path in &project.python_path {
        command.arg("-p").arg(dir.join(path));
    }
    // componentize-py finds installed packages (the SDK) through
    // VIRTUAL_ENV, else through whatever `python` is on PATH: run from a
    // virtual environment, it gets that environment, as if activated.
    if let Some(venv) = virtual_env_of(tool) {
        command.env("VIRTUAL_ENV", venv);
    }
    // Its own backtraces only bury the Python error that matters.
    command
        .arg(&project.module)
        .arg("-o")
        .arg(&build.partial)
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0");
    let output = command.stdin(Stdio::null()).output().map_err(|e| io("running", Path::new(tool), e))?;
    if !output.status.success() {
        let _ = std::fs::remove_file(&build.partial);
        return Err(BuildError::Componentize { dir: dir.to_owned(), output: failure_report(&output) });
    }
    show_output(&output, quiet);
    build.finish()
}

/// The last lines of a failed build's output, and a hint when the SDK was
/// not found.
fn failure_report(output: &Output) -> String {
    let mut report = output_tail(output);
    let missing = "No module named 'wakuwaku_guest'";
    if [&output.stderr, &output.stdout].iter().any(|text| String::from_utf8_lossy(text).contains(missing)) {
        report.push_str(
            "\nthe Python SDK (wakuwaku_guest) is not importable: pip install it (the repository's \
             guest-sdk-python directory) into componentize-py's environment, or add its src directory to \
             tool.wakuwaku.python-path",
        );
    }
    report
}

/// The componentize-py to run for the project in `dir`: `named` (the value
/// of `WAKU_COMPONENTIZE_PY`) when given, else the project's `.venv`, else
/// `componentize-py` on `PATH`, whichever runs first.
pub fn find_componentize_py(dir: &Path, named: Option<OsString>) -> Result<OsString, BuildError> {
    if let Some(tool) = named {
        return match runs(&tool) {
            true => Ok(tool),
            false => Err(BuildError::ComponentizePyMissing {
                dir: dir.to_owned(),
                looked: format!("{COMPONENTIZE_PY_ENV}={}", tool.to_string_lossy()),
            }),
        };
    }
    let in_venv = dir.join(".venv").join("bin").join("componentize-py");
    for tool in [in_venv.into_os_string(), OsString::from("componentize-py")] {
        if runs(&tool) {
            return Ok(tool);
        }
    }
    Err(BuildError::ComponentizePyMissing {
        dir: dir.to_owned(),
        looked: format!("{COMPONENTIZE_PY_ENV}, {}/.venv/bin and PATH", dir.display()),
    })
}

/// Whether `tool --version` runs and succeeds.
fn runs(tool: &OsStr) -> bool {
    Command::new(tool).arg("--version").stdin(Stdio::null()).output().is_ok_and(|output| output.status.success())
}

/// The virtual environment `tool` is installed in (`<venv>/bin/<tool>`,
/// with a `pyvenv.cfg` in `<venv>`), looked up on `PATH` when `tool` is a
/// bare name.
fn virtual_env_of(tool: &OsStr) -> Option<PathBuf> {
    let tool = Path::new(tool);
    let path = if tool.components().count() > 1 {
        tool.to_owned()
    } else {
        std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(tool)).find(|path| path.is_file())?
    };
    let venv = std::path::absolute(path).ok()?.parent()?.parent()?.to_owned();
    venv.join("pyvenv.cfg").is_file().then_some(venv)
}

/// The version `tool --version` reports (`componentize-py 0.25.1`), or
/// `unknown`.
fn tool_version(tool: &OsStr) -> String {
    let output = Command::new(tool).arg("--version").stdin(Stdio::null()).output();
    let text = output.map(|output| String::from_utf8_lossy(&output.stdout).into_owned()).unwrap_or_default();
    text.split_whitespace().nth(1).unwrap_or("unknown").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PythonProject, String> {
        PythonProject::parse(Path::new("p/pyproject.toml"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn reads_the_module_and_python_path() {
        let project = parse(
            "[project]\nname = \"bank-py\"\n[tool.wakuwaku]\nmodule = \"bank\"\npython-path = [\"../sdk\"]\n\
             [tool.pytest.ini_options]\nx = 1\n",
        )
        .unwrap();
        assert_eq!(project, PythonProject { module: "bank".into(), python_path: vec!["../sdk".into()] });
        assert_eq!(parse("[tool.wakuwaku]\nmodule = \"app.main\"\n").unwrap().python_path, Vec::<PathBuf>::new());
    }

    #[test]
    fn a_missing_or_wrong_table_says_what_to_write() {
        let error = parse("[project]\nname = \"x\"\n").unwrap_err();
        assert!(error.contains("p/pyproject.toml") && error.contains("module = \"<module>\""), "{error}");
        let error = parse("[tool.wakuwaku]\nmodul = \"bank\"\n").unwrap_err();
        assert!(error.contains("unknown field `modul`"), "{error}");
        for bad in ["", "bank-py", "a..b", "bank.py/x"] {
            let error = parse(&format!("[tool.wakuwaku]\nmodule = \"{bad}\"\n")).unwrap_err();
            assert!(error.contains("is not a Python module name"), "{bad}: {error}");
        }
        assert!(parse("[tool.wakuwaku]\nmodule = \"wit_world\"\n").unwrap_err().contains("bindings' own module"));
        assert!(parse("not toml [").unwrap_err().contains("p/pyproject.toml"));
    }

    /// A stand-in componentize-py: records its arguments and writes the
    /// file named by `-o`, or fails like a broken app when asked to.
    #[cfg(unix)]
    fn fake_tool(dir: &Path, fails_with: Option<&str>) -> OsString {
        use std::os::unix::fs::PermissionsExt;
        let script = dir.join("componentize-py");
        let body = match fails_with {
            Some(error) => format!("echo 'Traceback (most recent call last):' >&2; echo \"{error}\" >&2; exit 1"),
            None => "while [ $# -gt 0 ]; do [ \"$1\" = -o ] && echo component > \"$2\"; shift; done".to_owned(),
        };
        let text = format!(
            "#!/bin/sh\n[ \"$1\" = --version ] && {{ echo 'componentize-py 0.25.1'; exit 0; }}\necho \"$@\" > {}\n\
             echo \"$VIRTUAL_ENV\" > {}\n{body}\n",
            dir.join("args").display(),
            dir.join("virtual-env").display()
        );
        std::fs::write(&script, text).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        script.into_os_string()
    }

    #[test]
    #[cfg(unix)]
    fn builds_with_the_hosts_contract_and_every_import_path() {
        let dir = tempfile::tempdir().unwrap();
        let tool = fake_tool(dir.path(), None);
        let project_dir = dir.path().join("project");
        std::fs::create_dir_all(&project_dir).unwrap();
        let project = PythonProject { module: "bank".into(), python_path: vec!["../sdk".into()] };
        let error = build_with(&tool, "0.25.1", &project, &project_dir, &dir.path().join("out"), true).unwrap_err();
        assert!(error.to_string().contains("python-path names `../sdk`, which is not a directory"), "{error}");
        std::fs::create_dir_all(dir.path().join("sdk")).unwrap();
        let out = build_with(&tool, "0.25.1", &project, &project_dir, &dir.path().join("out"), true).unwrap();
        assert_eq!(out, dir.path().join("out/bank.wasm"));
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "component\n");
        let args = std::fs::read_to_string(dir.path().join("args")).unwrap();
        let args: Vec<&str> = args.split_whitespace().collect();
        assert_eq!(args[0], "-d");
        assert!(args[1].ends_with("handler.wit"));
        let expected_tail = [
            "-w".to_owned(),
            "module".into(),
            "--quiet".into(),
            "componentize".into(),
            "-p".into(),
            project_dir.display().to_string(),
            "-p".into(),
            project_dir.join("../sdk").display().to_string(),
            "bank".into(),
            "-o".into(),
            dir.path().join("out/.bank.wasm.partial").display().to_string(),
        ];
        assert_eq!(args[2..], expected_tail);
    }

    #[test]
    #[cfg(unix)]
    fn an_unchanged_project_is_not_built_again() {
        let dir = tempfile::tempdir().unwrap();
        let project_dir = dir.path().join("project");
        std::fs::create_dir_all(project_dir.join("__pycache__")).unwrap();
        std::fs::write(project_dir.join("bank.py"), "v1").unwrap();
        let tool = fake_tool(dir.path(), None);
        let project = PythonProject { module: "bank".into(), python_path: Vec::new() };
        let out_dir = project_dir.join("target/python");
        let build = |version: &str| {
            let _ = std::fs::remove_file(dir.path().join("args"));
            build_with(&tool, version, &project, &project_dir, &out_dir, true).unwrap();
            dir.path().join("args").exists()
        };
        assert!(build("0.25.1"), "the first build runs");
        assert!(!build("0.25.1"), "nothing changed");
        std::fs::write(project_dir.join("__pycache__/bank.pyc"), "cache").unwrap();
        assert!(!build("0.25.1"), "caches and the output do not count");
        // A component written into the project (`waku build . --out bank.wasm`).
        std::fs::write(project_dir.join("bank.wasm"), "a build of it").unwrap();
        assert!(!build("0.25.1"), "a component in the project is no input");
        std::fs::write(project_dir.join("bank.py"), "v2").unwrap();
        assert!(build("0.25.1"), "a changed source builds again");
        assert!(build("0.26.0"), "another componentize-py builds again");
        std::fs::remove_file(out_dir.join("bank.wasm")).unwrap();
        assert!(build("0.26.0"), "a deleted component builds again");
    }

    #[test]
    #[cfg(unix)]
    fn a_failed_build_shows_the_end_of_its_output_and_keeps_the_last_component() {
        let dir = tempfile::tempdir().unwrap();
        let out_dir = dir.path().join("out");
        std::fs::create_dir_all(&out_dir).unwrap();
        std::fs::write(out_dir.join("bank.wasm"), "last good").unwrap();
        let tool = fake_tool(dir.path(), Some("NameError: name x is not defined"));
        let project = PythonProject { module: "bank".into(), python_path: Vec::new() };
        let error = build_with(&tool, "0.25.1", &project, dir.path(), &out_dir, true).unwrap_err().to_string();
        assert!(error.starts_with("componentize-py could not build"), "{error}");
        assert!(error.ends_with("NameError: name x is not defined"), "{error}");
        assert_eq!(std::fs::read_to_string(out_dir.join("bank.wasm")).unwrap(), "last good");
        assert!(!out_dir.join(".bank.wasm.partial").exists());
        let tool = fake_tool(dir.path(), Some("ModuleNotFoundError: No module named 'wakuwaku_guest'"));
        let error = build_with(&tool, "0.25.1", &project, dir.path(), &out_dir, true).unwrap_err().to_string();
        assert!(error.ends_with("or add its src directory to tool.wakuwaku.python-path"), "{error}");
    }

    #[test]
    #[cfg(unix)]
    fn a_missing_componentize_py_says_how_to_install_it() {
        let dir = tempfile::tempdir().unwrap();
        let error = find_componentize_py(dir.path(), Some("/nonexistent/componentize-py".into())).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("WAKU_COMPONENTIZE_PY=/nonexistent/componentize-py"), "{message}");
        assert!(message.contains("/.venv/bin/pip install componentize-py==0.25.1"), "{message}");
        let fake = fake_tool(dir.path(), None);
        assert_eq!(find_componentize_py(dir.path(), Some(fake.clone())).unwrap(), fake);
        // The project's own .venv comes before PATH.
        let venv_bin = dir.path().join(".venv/bin");
        std::fs::create_dir_all(&venv_bin).unwrap();
        std::fs::copy(&fake, venv_bin.join("componentize-py")).unwrap();
        assert_eq!(find_componentize_py(dir.path(), None).unwrap(), venv_bin.join("componentize-py").into_os_string());
    }

    #[test]
    #[cfg(unix)]
    fn componentize_py_in_a_virtual_environment_runs_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let venv = dir.path().join("venv");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        let tool = fake_tool(&venv.join("bin"), None);
        let project = PythonProject { module: "bank".into(), python_path: Vec::new() };
        let virtual_env = || std::fs::read_to_string(venv.join("bin/virtual-env")).unwrap().trim().to_owned();
        build_with(&tool, "0.25.1", &project, dir.path(), &dir.path().join("out"), true).unwrap();
        assert_eq!(virtual_env(), std::env::var("VIRTUAL_ENV").unwrap_or_default(), "no pyvenv.cfg: no venv");
        std::fs::write(venv.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        std::fs::write(dir.path().join("app.py"), "changed").unwrap();
        build_with(&tool, "0.25.1", &project, dir.path(), &dir.path().join("out"), true).unwrap();
        assert_eq!(virtual_env(), venv.display().to_string());
    }

    #[test]
    fn the_embedded_contract_is_the_repositorys() {
        assert!(HANDLER_WIT.contains(&format!("package {};", wakuwaku_core::limits::CONTRACT_0_4)));
        assert!(HANDLER_WIT_0_5.contains(&format!("package {};", wakuwaku_core::limits::CONTRACT)));
        assert!(HANDLER_WIT.contains("world module {"));
        assert!(HANDLER_WIT_0_5.contains("world module {") && HANDLER_WIT_0_5.contains("import timers;"));
    }
}
