//! Settings from the command line, the environment and a config file.
//!
//! Every setting of `waku run` (every flag but `--config` and
//! `--print-config`) can also come from an environment variable, named
//! `WAKU_` and the flag in capitals with `_` for `-` (`--batch-size` is
//! `WAKU_BATCH_SIZE`, `--iggy` is `WAKU_IGGY`), or from a key of the
//! config file named as the flag without its dashes (`batch-size = 512`).
//! An empty variable counts as unset.
//! The config file is the one `--config <FILE>` (or `WAKU_CONFIG`) names,
//! else `waku.toml` in the working directory if there is one.
//!
//! Rules it keeps:
//! - **Precedence**, highest first: a flag, the environment, the file, the
//!   default. So a credential (the Iggy URL with its password) never has to
//!   be on the command line, and a flag still overrides everything for one
//!   run.
//! - The settings that say where the data is (`data`, `iggy`, `stream`,
//!   `lossy-topics`, `state`), what it is (`projection`, `topic`,
//!   `modules`) and where the running host answers (`admin`: `run` serves
//!   on it, `status` and `state` ask it; the file of its token,
//!   `admin-token-file`: `run` asks for it, `status` and `state` send it)
//!   apply to every command that takes them; the others only to `run`
//!   (`--partitions` means something else elsewhere). `demo` takes only
//!   `iggy`: it makes its own fresh data.
//! - **A flag beats a setting it excludes.** A setting from the
//!   environment or the file that cannot go with a flag given on the
//!   command line is left out, as if unset (`waku rebuild --rollback` with
//!   `modules` in the file).
//! - A key of the file that is no setting of `run` is an error naming the
//!   key and the file; a value that does not parse is an error naming the
//!   setting and where it came from (`environment variable WAKU_WORKERS`,
//!   `file ./waku.toml`). Both exit with code 2, as a bad flag does.
//! - A value from the environment or the file goes through the flag's own
//!   parser, so it is checked exactly as the flag would be.
//!
//! How: the command line is parsed once leniently to learn the command and
//! which flags were given; each other setting of that command found in the
//! environment or the file is checked on its own, then appended as
//! `--<flag>=<value>`, and the whole is parsed again strictly.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::builder::Resettable;
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, CommandFactory, FromArgMatches};

use super::Cli;
use wakuwaku_core::terminal::printable;

/// The settings every command that takes them reads from the environment
/// and the file; the others are `run`'s alone.
const SHARED: [&str; 11] = [
    "data",
    "iggy",
    "stream",
    "lossy-topics",
    "state",
    "projection",
    "topic",
    "modules",
    "module-ref",
    "admin",
    "admin-token-file",
];

/// What `demo` takes from the environment and the file: the credential
/// only, as it makes its own fresh data (and stream).
const DEMO: [&str; 1] = ["iggy"];

/// Flags of `run` that are no settings.
const NOT_SETTINGS: [&str; 5] = ["help", "version", "config", "log-level", "print-config"];

/// Settings whose value is masked when shown.
const SECRETS: [&str; 2] = ["iggy", "state"];

/// The default config file, in the working directory.
pub(super) const DEFAULT_FILE: &str = "waku.toml";

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Source {
    /// Its default.
    Default,
    /// The config file.
    File(PathBuf),
    /// This environment variable.
    Env(String),
    /// Its flag.
    Flag,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Default => f.write_str("default"),
            Self::File(path) => write!(f, "file {}", path.display()),
            Self::Env(name) => write!(f, "environment variable {name}"),
            Self::Flag => f.write_str("flag"),
        }
    }
}

/// Why the settings could not be put together.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read the config file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The config file is no valid TOML.
    #[error("the config file {} is not valid TOML: {reason}", path.display())]
    Toml { path: PathBuf, reason: String },
    /// A key of the config file is no setting.
    #[error("unknown setting `{key}` in the config file {} (the settings are the flags of `waku run`, without their dashes)", path.display())]
    UnknownKey { key: String, path: PathBuf },
    /// A value does not parse.
    #[error("bad value `{value}` for setting `{setting}` from {source_}: {reason}")]
    BadValue { setting: String, value: String, source_: Source, reason: String },
}

/// The parsed command line and where each setting of its command came
/// from.
pub(super) struct Layered {
    /// The command line, with the environment and the file applied.
    pub(super) cli: Cli,
    /// Each setting of the command, in the order of its flags.
    pub(super) settings: Vec<Setting>,
    /// The command line with the settings of the environment and the file
    /// appended as flags: what was parsed.
    pub(super) argv: Vec<OsString>,
}

/// One setting's effective value and its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Setting {
    /// The flag without its dashes, as in the config file.
    pub(super) name: String,
    /// Its values as given (none: not set); several for a list.
    pub(super) values: Vec<String>,
    /// Whether it takes a list (`--partitions 0,2`).
    pub(super) list: bool,
    /// Where it came from.
    pub(super) source: Source,
}

impl Setting {
    /// The setting `name`, given as a flag (its values in the command line).
    pub(super) fn flag(name: String) -> Self {
        Self { name, values: Vec::new(), list: false, source: Source::Flag }
    }
}

/// A parse failure: clap's own (usage, `--help`, `--version`), or a
/// setting from the environment or the file.
pub(super) enum Failure {
    Clap(clap::Error),
    Config(ConfigError),
}

/// Parses `args` with the settings of `env` (a lookup of environment
/// variables) and of the config file (`--config`, `WAKU_CONFIG`, else
/// `default_file` if it exists) applied, flag > env > file > default.
pub(super) fn parse(
    args: Vec<OsString>,
    env: &dyn Fn(&str) -> Option<OsString>,
    default_file: &Path,
) -> Result<Layered, Failure> {
    let command = Cli::command();
    let lenient = command.clone().ignore_errors(true).try_get_matches_from(&args).map_err(Failure::Clap)?;
    let (path, leaf_matches) = leaf(&lenient);
    let Some(leaf_command) = find(&command, &path) else {
        // No command: the strict parse says what is wrong.
        let strict = command.try_get_matches_from(&args).map_err(Failure::Clap)?;
        let cli = Cli::from_arg_matches(&strict).map_err(Failure::Clap)?;
        return Ok(Layered { cli, settings: Vec::new(), argv: args });
    };
    let explicit_file = match leaf_matches.get_one::<PathBuf>("config") {
        Some(path) => Some(path.clone()),
        None => env("WAKU_CONFIG").filter(|path| !path.is_empty()).map(PathBuf::from),
    };
    let file = read_file(explicit_file.as_deref(), default_file).map_err(Failure::Config)?;
    let run = find(&command, &["run".to_owned()]).expect("waku has a run command");
    let known: Vec<String> = settings_of(run).map(|arg| long(arg).to_owned()).collect();
    if let Some((path, table)) = &file
        && let Some(key) = table.keys().find(|key| !known.contains(key))
    {
        // The file is anyone's: what it holds is shown escaped.
        let key = printable(key).into_owned();
        return Err(Failure::Config(ConfigError::UnknownKey { key, path: path.clone() }));
    }

    let applies = |name: &str| layered_for(&path[0], name);
    let on_command_line =
        |arg: &clap::Arg| leaf_matches.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine);
    let flags: Vec<&clap::Arg> = leaf_command.get_arguments().filter(|arg| on_command_line(arg)).collect();
    let mut sources = BTreeMap::new();
    let mut extra: Vec<OsString> = Vec::new();
    for arg in settings_of(leaf_command).filter(|arg| applies(long(arg))) {
        let (source, given) = match on_command_line(arg) {
            true => (Source::Flag, Vec::new()),
            false if conflicts_with_any(leaf_command, arg, &flags) => (Source::Default, Vec::new()),
            false => layered(arg, env, file.as_ref()).map_err(Failure::Config)?,
        };
        extra.extend(given);
        sources.insert(long(arg).to_owned(), source);
    }

    let argv: Vec<OsString> = args.into_iter().chain(extra).collect();
    let strict = command.clone().try_get_matches_from(&argv).map_err(Failure::Clap)?;
    let cli = Cli::from_arg_matches(&strict).map_err(Failure::Clap)?;
    let (_, leaf_matches) = leaf(&strict);
    let settings = settings_of(leaf_command)
        .filter_map(|arg| Some(effective(arg, leaf_matches, sources.get(long(arg))?.clone())))
        .collect();
    Ok(Layered { cli, settings, argv })
}

/// Whether the setting `name` of the command `command` (the first word
/// after `waku`) may come from the environment or the file.
fn layered_for(command: &str, name: &str) -> bool {
    match command {
        "run" => true,
        "demo" => DEMO.contains(&name),
        _ => SHARED.contains(&name),
    }
}

/// Whether the command `args` names takes any setting from the
/// environment or the file (`waku test` takes none): a usage error of one
/// that does may be fixed there too.
pub(super) fn takes_settings(args: &[OsString]) -> bool {
    let command = Cli::command();
    let Ok(lenient) = command.clone().ignore_errors(true).try_get_matches_from(args) else {
        return false;
    };
    let (path, _) = leaf(&lenient);
    find(&command, &path)
        .is_some_and(|leaf_command| settings_of(leaf_command).any(|arg| layered_for(&path[0], long(arg))))
}

/// Where a setting not given as a flag comes from, and the arguments that
/// give it: its environment variable, else its key in `file`, else its
/// default (no arguments).
fn layered(
    arg: &clap::Arg,
    env: &dyn Fn(&str) -> Option<OsString>,
    file: Option<&(PathBuf, toml::Table)>,
) -> Result<(Source, Vec<OsString>), ConfigError> {
    let name = long(arg);
    let variable = env_name(name);
    let (source, text) = if let Some(value) = env(&variable).filter(|value| !value.is_empty()) {
        let source = Source::Env(variable);
        let text = value.into_string().map_err(|value| {
            bad(name, value.to_string_lossy().into_owned(), source.clone(), "not valid UTF-8".into())
        })?;
        (source, text)
    } else if let Some((path, value)) = file.and_then(|(path, table)| Some((path, table.get(name)?))) {
        let source = Source::File(path.clone());
        let text = toml_text(arg, value).map_err(|reason| bad(name, value.to_string(), source.clone(), reason))?;
        (source, text)
    } else {
        return Ok((Source::Default, Vec::new()));
    };
    let given = checked(arg, &text, &source)?;
    Ok((source, given))
}

/// Whether `arg` cannot go with one of `flags` (either says so): a flag
/// given for this command beats a setting of the environment or the file
/// it excludes (`rebuild --rollback` with `modules` in `waku.toml`).
fn conflicts_with_any(command: &clap::Command, arg: &clap::Arg, flags: &[&clap::Arg]) -> bool {
    let excluded = command.get_arg_conflicts_with(arg);
    flags.iter().any(|flag| {
        excluded.iter().any(|other| other.get_id() == flag.get_id())
            || command.get_arg_conflicts_with(flag).iter().any(|other| other.get_id() == arg.get_id())
    })
}

/// A setting's effective values in the final `matches`.
fn effective(arg: &clap::Arg, matches: &ArgMatches, source: Source) -> Setting {
    let mut values: Vec<String> = match matches.get_raw(arg.get_id().as_str()) {
        Some(raw) => raw.map(|value| value.to_string_lossy().into_owned()).collect(),
        None => Vec::new(),
    };
    if values.is_empty() && is_switch(arg) {
        values.push("false".into());
    }
    Setting { name: long(arg).to_owned(), values, list: arg.get_value_delimiter().is_some(), source }
}

/// Whether the setting `name` was given as a flag (not from the
/// environment, the file or its default).
pub(super) fn from_flag(settings: &[Setting], name: &str) -> bool {
    settings.iter().any(|setting| setting.name == name && setting.source == Source::Flag)
}

/// The environment variable of a setting: `batch-size` → `WAKU_BATCH_SIZE`.
pub(super) fn env_name(setting: &str) -> String {
    format!("WAKU_{}", setting.to_uppercase().replace('-', "_"))
}

/// The subcommand path and the innermost matches.
fn leaf(matches: &ArgMatches) -> (Vec<String>, &ArgMatches) {
    let mut path = Vec::new();
    let mut current = matches;
    while let Some((name, sub)) = current.subcommand() {
        path.push(name.to_owned());
        current = sub;
    }
    (path, current)
}

fn find<'a>(command: &'a clap::Command, path: &[String]) -> Option<&'a clap::Command> {
    if path.is_empty() {
        return None;
    }
    path.iter().try_fold(command, |command, name| command.find_subcommand(name))
}

/// The flags of `command` that are settings.
fn settings_of(command: &clap::Command) -> impl Iterator<Item = &clap::Arg> {
    command.get_arguments().filter(|arg| arg.get_long().is_some_and(|long| !NOT_SETTINGS.contains(&long)))
}

fn long(arg: &clap::Arg) -> &str {
    arg.get_long().unwrap_or_default()
}

fn is_switch(arg: &clap::Arg) -> bool {
    matches!(arg.get_action(), ArgAction::SetTrue)
}

/// A bad value; the value, from the environment or a file, is shown
/// escaped.
fn bad(setting: &str, value: String, source: Source, reason: String) -> ConfigError {
    let value = printable(&value).into_owned();
    ConfigError::BadValue {
        setting: setting.to_owned(),
        value,
        source_: source,
        reason: printable(&reason).into_owned(),
    }
}

/// The config file `explicit` names (which must exist), else `default` if
/// it exists, as a table.
fn read_file(explicit: Option<&Path>, default: &Path) -> Result<Option<(PathBuf, toml::Table)>, ConfigError> {
    let path = match explicit {
        Some(path) => path.to_owned(),
        None if default.is_file() => default.to_owned(),
        None => return Ok(None),
    };
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read { path: path.clone(), source })?;
    let table = text
        .parse::<toml::Table>()
        .map_err(|error| ConfigError::Toml { path: path.clone(), reason: error.message().to_owned() })?;
    Ok(Some((path, table)))
}

/// A file value as the text its flag would take: a scalar as written, a
/// list (for a flag that takes one) joined with commas.
fn toml_text(arg: &clap::Arg, value: &toml::Value) -> Result<String, String> {
    let scalar = |value: &toml::Value| match value {
        toml::Value::String(text) => Ok(text.clone()),
        toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_) => Ok(value.to_string()),
        _ => Err(format!("expected {}", if is_switch(arg) { "true or false" } else { "a value" })),
    };
    match (value, arg.get_value_delimiter()) {
        (toml::Value::Array(items), Some(delimiter)) => {
            Ok(items.iter().map(scalar).collect::<Result<Vec<_>, _>>()?.join(&delimiter.to_string()))
        }
        (toml::Value::Array(_), None) => Err("expected one value, not a list".into()),
        (value, _) => scalar(value),
    }
}

/// Checks `text` with the flag's own parser and returns the arguments that
/// give it: `--<flag>=<text>`, or for a switch `--<flag>` when true.
fn checked(arg: &clap::Arg, text: &str, source: &Source) -> Result<Vec<OsString>, ConfigError> {
    let name = long(arg);
    if is_switch(arg) {
        return match text.to_ascii_lowercase().as_str() {
            "true" | "1" => Ok(vec![format!("--{name}").into()]),
            "false" | "0" => Ok(Vec::new()),
            _ => Err(bad(name, text.to_owned(), source.clone(), "expected true or false".into())),
        };
    }
    let given = format!("--{name}={text}");
    // The flag alone, without the ties to other flags, parses the value.
    let alone = arg.clone().required(false).requires(Resettable::Reset).conflicts_with(Resettable::Reset).global(false);
    let check = clap::Command::new("waku").no_binary_name(true).disable_help_flag(true).arg(alone);
    check.try_get_matches_from([&given]).map_err(|error| {
        let reason = std::error::Error::source(&error).map_or_else(|| error.kind().to_string(), ToString::to_string);
        bad(name, text.to_owned(), source.clone(), reason)
    })?;
    Ok(vec![given.into()])
}

/// A warning for each secret given as a flag: a password (or an Iggy
/// token) in `--state` or `--iggy` is shown by `ps` to every user of the
/// machine, for as long as the command runs.
pub(super) fn secrets_on_the_command_line(settings: &[Setting]) -> Vec<String> {
    settings
        .iter()
        .filter(|setting| setting.source == Source::Flag && SECRETS.contains(&setting.name.as_str()))
        .filter(|setting| setting.values.iter().any(|value| holds_a_secret(value)))
        .map(|setting| {
            format!(
                "warning: the password in --{} is shown by `ps` to every user of this machine; give the URL in {} \
                 or `{}` in waku.toml instead",
                setting.name,
                env_name(&setting.name),
                setting.name
            )
        })
        .collect()
}

/// Whether a connection string holds a secret: a password in a URL's user
/// part (`user:password@`), an Iggy token (`iggy://token@`), or a
/// `password=` option in its query.
fn holds_a_secret(value: &str) -> bool {
    if value.contains("password=") {
        return true;
    }
    let (Some(scheme), Some(at)) = (value.find("://"), value.rfind('@')) else { return false };
    let credentials = if scheme < at { &value[scheme + 3..at] } else { return false };
    match credentials.split_once(':') {
        Some((_, password)) => !password.is_empty(),
        None => value.starts_with("iggy") && !credentials.is_empty(),
    }
}

/// `iggy://user:password@host` (or `postgres://...`) with the password masked.
pub(super) fn masked(setting: &str, value: &str) -> String {
    if !SECRETS.contains(&setting) {
        return value.to_owned();
    }
    crate::storage::log::masked_password(value).unwrap_or_else(|| "****".to_owned())
}

/// One line saying how many settings came from the environment and from
/// the file, when any did: `settings: 3 from file waku.toml, 1 from the
/// environment (WAKU_IGGY)`.
pub(super) fn summary(settings: &[Setting]) -> Option<String> {
    let mut parts = Vec::new();
    let files: Vec<&PathBuf> = settings
        .iter()
        .filter_map(|s| match &s.source {
            Source::File(path) => Some(path),
            _ => None,
        })
        .collect();
    if let Some(path) = files.first() {
        parts.push(format!("{} from file {}", files.len(), path.display()));
    }
    let variables: Vec<&str> = settings
        .iter()
        .filter_map(|s| match &s.source {
            Source::Env(name) => Some(name.as_str()),
            _ => None,
        })
        .collect();
    if !variables.is_empty() {
        parts.push(format!("{} from the environment ({})", variables.len(), variables.join(", ")));
    }
    (!parts.is_empty()).then(|| format!("settings: {} (`waku run --print-config` shows them all)", parts.join(", ")))
}

/// The effective settings as a config file would hold them, each with its
/// source in a comment; secrets masked, unset settings commented out.
pub(super) fn render(settings: &[Setting]) -> String {
    let mut lines = vec![
        "# effective settings of `waku run`; precedence: flag > environment (WAKU_*) > config file > default"
            .to_owned(),
    ];
    let toml_value = |setting: &Setting, value: &str| {
        let value = masked(&setting.name, value);
        if value.parse::<i64>().is_ok() || value == "true" || value == "false" {
            value
        } else {
            toml::Value::String(value).to_string()
        }
    };
    for setting in settings {
        let line = match (setting.values.as_slice(), setting.list) {
            ([], _) => format!("# {} is not set", setting.name),
            (values, true) => {
                let items: Vec<String> = values.iter().map(|v| toml_value(setting, v)).collect();
                format!("{} = [{}]", setting.name, items.join(", "))
            }
            ([value, ..], false) => format!("{} = {}", setting.name, toml_value(setting, value)),
        };
        lines.push(format!("{line:<48} # {}", setting.source));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Command;

    fn parse_with(args: &[&str], env: &[(&str, &str)], file: Option<&str>) -> Result<Layered, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("waku.toml");
        if let Some(text) = file {
            std::fs::write(&path, text).unwrap();
        }
        let env: BTreeMap<String, OsString> = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).into())).collect();
        let args = std::iter::once("waku").chain(args.iter().copied()).map(OsString::from).collect();
        parse(args, &|name| env.get(name).cloned(), &path).map_err(|failure| match failure {
            Failure::Clap(error) => error.to_string(),
            Failure::Config(error) => error.to_string().replace(&path.display().to_string(), "<file>"),
        })
    }

    fn source<'a>(layered: &'a Layered, name: &str) -> &'a Setting {
        layered.settings.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no setting {name}"))
    }

    const BASE: [&str; 7] = ["run", "--projection", "p", "--topic", "t", "--modules", "m"];

    #[test]
    fn a_flag_beats_the_environment_which_beats_the_file_which_beats_the_default() {
        let file = "batch-size = 11\nworkers = 3\nmax-attempts = 4\ndata = \"from-file\"\n";
        let env = [("WAKU_BATCH_SIZE", "22"), ("WAKU_WORKERS", "5"), ("WAKU_MAX_ATTEMPTS", "")];
        let layered = parse_with(&[&BASE[..], &["--batch-size", "33"]].concat(), &env, Some(file)).unwrap();
        assert_eq!(summary(&parse_with(&BASE, &[], None).unwrap().settings), None, "flags and defaults only");
        let Command::Run(args) = &layered.cli.command else { panic!("not run") };
        assert_eq!(args.consume.batch_size, 33, "the flag wins");
        assert_eq!(args.consume.workers, Some(5), "the environment beats the file");
        assert_eq!(args.consume.retry.max_attempts, 4, "the file beats the default (an empty variable is unset)");
        assert_eq!(args.data.data, PathBuf::from("from-file"));
        assert_eq!(args.consume.retry.transient_retries, 3, "the default stands");
        assert_eq!(source(&layered, "batch-size").source, Source::Flag);
        assert_eq!(source(&layered, "workers").source, Source::Env("WAKU_WORKERS".into()));
        assert!(matches!(source(&layered, "max-attempts").source, Source::File(_)));
        assert_eq!(source(&layered, "transient-retries").source, Source::Default);
        assert_eq!(source(&layered, "transient-retries").values, ["3"]);
    }

    #[test]
    fn several_topics_come_from_repeated_flags_a_list_or_the_file() {
        let topics = |layered: Layered| match layered.cli.command {
            Command::Run(args) => args.topics.topics,
            _ => panic!("not run"),
        };
        let expected = ["a".to_owned(), "b".to_owned()];
        let base = ["run", "--projection", "p", "--modules", "m"];
        let repeated = parse_with(&[&base[..], &["--topic", "a", "--topic", "b"]].concat(), &[], None).unwrap();
        assert_eq!(topics(repeated), expected);
        let listed = parse_with(&[&base[..], &["--topic", "a,b"]].concat(), &[], None).unwrap();
        assert_eq!(topics(listed), expected);
        let filed = parse_with(&base, &[], Some("topic = [\"a\", \"b\"]\n")).unwrap();
        assert_eq!(topics(filed), expected);
    }

    #[test]
    fn required_settings_switches_and_lists_come_from_the_environment_and_the_file() {
        let file = "projection = \"bank\"\ntopic = \"accounts\"\nmodules = \"mods\"\npartitions = [0, 2]\n\
                    until-caught-up = true\nretry-delays = [\"1s\", \"2m\"]\n";
        let env = [("WAKU_NO_WATCH", "true"), ("WAKU_IGGY", "iggy://u:secret@host:8090")];
        let layered = parse_with(&["run"], &env, Some(file)).unwrap();
        let Command::Run(args) = &layered.cli.command else { panic!("not run") };
        assert_eq!((args.projection.as_str(), args.topic()), ("bank", "accounts"));
        assert_eq!(args.partitions, Some(vec![0, 2]));
        assert!(args.until_caught_up && args.no_watch && !args.adopt_modules);
        assert_eq!(args.data.iggy.as_deref(), Some("iggy://u:secret@host:8090"));
        let delays = args.consume.retry.retry_delays.clone();
        assert_eq!(delays, [std::time::Duration::from_secs(1), std::time::Duration::from_secs(120)]);
        let said = summary(&layered.settings).unwrap();
        assert!(said.starts_with("settings: 6 from file "), "{said}");
        assert!(
            said.ends_with(
                ", 2 from the environment (WAKU_IGGY, WAKU_NO_WATCH) (`waku run --print-config` shows them all)"
            ),
            "{said}"
        );
        let shown = render(&layered.settings);
        assert!(shown.contains("iggy = \"iggy://u:****@host:8090\""), "{shown}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("partitions = [0, 2]"), "{shown}");
        assert!(shown.contains("# workers is not set"), "{shown}");
        // Every shown line that is not a comment is a valid config file line.
        let file_again: String =
            shown.lines().map(|l| l.split(" #").next().unwrap().trim()).collect::<Vec<_>>().join("\n");
        file_again.parse::<toml::Table>().expect("print-config shows TOML");
    }

    #[test]
    fn where_settings_apply_to_every_command_the_others_only_to_run() {
        let file =
            "data = \"d\"\nprojection = \"bank\"\ntopic = \"accounts\"\npartitions = [1]\nadmin = \"127.0.0.1:9\"\n";
        let layered =
            parse_with(&["status"], &[("WAKU_STREAM", "s"), ("WAKU_IGGY", "iggy://x@y")], Some(file)).unwrap();
        let Command::Status(args) = &layered.cli.command else { panic!("not status") };
        assert_eq!(args.target.data.data, PathBuf::from("d"));
        assert_eq!(args.target.data.stream, "s");
        assert_eq!(args.target.projection, "bank");
        assert_eq!(args.admin.as_deref(), Some("http://127.0.0.1:9"), "the address run serves on, status asks");
        let layered = parse_with(&["status"], &[("WAKU_ADMIN_TOKEN_FILE", "t")], Some(file)).unwrap();
        let Command::Status(args) = &layered.cli.command else { panic!("not status") };
        assert_eq!(
            args.admin_access.admin_token_file,
            Some(PathBuf::from("t")),
            "the token run asks for, status sends"
        );
        let layered = parse_with(&["demo"], &[("WAKU_IGGY", "iggy://x@y")], Some(file)).unwrap();
        let Command::Demo(args) = &layered.cli.command else { panic!("not demo") };
        assert_eq!((&args.data, args.partitions), (&None, 4), "the demo makes its own data");
        assert_eq!(args.iggy.as_deref(), Some("iggy://x@y"), "the demo takes the credential");
    }

    #[test]
    fn a_flag_leaves_out_a_setting_of_the_file_it_excludes() {
        let file = "projection = \"bank\"\ntopic = \"accounts\"\nmodules = \"new-modules\"\n";
        let layered = parse_with(&["rebuild", "--rollback"], &[], Some(file)).unwrap();
        let Command::Rebuild(args) = &layered.cli.command else { panic!("not rebuild") };
        assert!(args.rollback && args.modules.is_none(), "--rollback excludes modules");
        assert_eq!(source(&layered, "modules").source, Source::Default);
        let layered = parse_with(&["rebuild"], &[], Some(file)).unwrap();
        let Command::Rebuild(args) = &layered.cli.command else { panic!("not rebuild") };
        assert_eq!(args.modules, Some(PathBuf::from("new-modules")), "modules from the file");
        assert!(!from_flag(&layered.settings, "modules"));
        let layered = parse_with(&["modules", "list"], &[], Some(file)).unwrap();
        let Command::Modules(crate::cli::ModulesCommand::List(args)) = &layered.cli.command else { panic!("not list") };
        assert_eq!(args.modules, Some(PathBuf::from("new-modules")));
    }

    #[test]
    fn an_unknown_key_names_the_key_and_the_file() {
        let error = parse_with(&BASE, &[], Some("batch_size = 3\n")).err().unwrap();
        assert!(error.starts_with("unknown setting `batch_size` in the config file <file>"), "{error}");
        let error = parse_with(&BASE, &[], Some("print-config = true\n")).err().unwrap();
        assert!(error.starts_with("unknown setting `print-config`"), "{error}");
    }

    /// The event-time bounds of `run` (`max-event-time-ahead`,
    /// `allowed-lateness`): flag > environment > file > default, and a
    /// negative, unparsable or too large span refused naming the setting,
    /// its source and what is wanted.
    #[test]
    fn the_event_time_spans_come_from_every_source_and_bad_ones_are_refused() {
        let spans = |layered: Layered| match layered.cli.command {
            Command::Run(args) => (args.max_event_time_ahead, args.allowed_lateness),
            _ => panic!("not run"),
        };
        let (secs, defaults) = (std::time::Duration::from_secs, parse_with(&BASE, &[], None).unwrap());
        assert_eq!(spans(defaults), (secs(3600), secs(0)));
        let file = "max-event-time-ahead = \"2h\"\nallowed-lateness = \"5s\"\n";
        assert_eq!(spans(parse_with(&BASE, &[], Some(file)).unwrap()), (secs(7200), secs(5)));
        let env = [("WAKU_ALLOWED_LATENESS", "3s"), ("WAKU_MAX_EVENT_TIME_AHEAD", "10m")];
        assert_eq!(spans(parse_with(&BASE, &env, Some(file)).unwrap()), (secs(600), secs(3)));
        let flags = [&BASE[..], &["--allowed-lateness", "1s", "--max-event-time-ahead", "90s"]].concat();
        assert_eq!(spans(parse_with(&flags, &env, Some(file)).unwrap()), (secs(90), secs(1)));

        let error = parse_with(&BASE, &[("WAKU_ALLOWED_LATENESS", "-5s")], None).err().unwrap();
        assert!(
            error.starts_with("bad value `-5s` for setting `allowed-lateness` from environment variable")
                && error.contains("is negative"),
            "{error}"
        );
        let error = parse_with(&BASE, &[], Some("max-event-time-ahead = \"soonish\"\n")).err().unwrap();
        assert!(
            error.starts_with("bad value `soonish` for setting `max-event-time-ahead` from file <file>: ")
                && error.contains("such as `90s`"),
            "{error}"
        );
        let error = parse_with(&[&BASE[..], &["--max-event-time-ahead", "200years"]].concat(), &[], None);
        let error = error.err().unwrap();
        assert!(error.contains("`200years` is over the most allowed, 100years"), "{error}");
        let error = parse_with(&[&BASE[..], &["--allowed-lateness", "-1s"]].concat(), &[], None).err().unwrap();
        assert!(error.contains("allowed-lateness") && error.contains("is negative"), "{error}");
    }

    #[test]
    fn a_bad_value_names_the_setting_and_its_source() {
        let error = parse_with(&BASE, &[("WAKU_WORKERS", "many")], None).err().unwrap();
        assert!(
            error.starts_with("bad value `many` for setting `workers` from environment variable WAKU_WORKERS: "),
            "{error}"
        );
        let error = parse_with(&BASE, &[], Some("retry-delays = [\"soon\"]\n")).err().unwrap();
        assert!(error.starts_with("bad value `soon` for setting `retry-delays` from file <file>: "), "{error}");
        let error = parse_with(&BASE, &[], Some("until-caught-up = \"yes\"\n")).err().unwrap();
        assert!(error.contains("setting `until-caught-up` from file <file>: expected true or false"), "{error}");
        let error = parse_with(&BASE, &[], Some("memory-mib = [1, 2]\n")).err().unwrap();
        assert!(error.contains("`memory-mib` from file <file>: expected one value, not a list"), "{error}");
        let error = parse_with(&BASE, &[("WAKU_WORKERS", "\u{1b}[31m")], None).err().unwrap();
        assert!(!error.contains('\u{1b}'), "shown escaped: {error:?}");
        let error = parse_with(&BASE, &[], Some("\"\\u001b[2J\" = 1\n")).err().unwrap();
        assert!(error.starts_with("unknown setting `") && !error.contains('\u{1b}'), "shown escaped: {error:?}");
        let error = parse_with(&BASE, &[], Some("workers = \n")).err().unwrap();
        assert!(error.starts_with("the config file <file> is not valid TOML"), "{error}");
        // A bad value in a file a flag overrides is never read.
        parse_with(&[&BASE[..], &["--workers", "2"]].concat(), &[], Some("workers = \"many\"\n")).unwrap();
    }

    #[test]
    fn a_secret_given_as_a_flag_is_warned_of_and_one_from_the_environment_is_not() {
        let with = |args: &[&str], env: &[(&str, &str)]| {
            let mut all = BASE.to_vec();
            all.extend_from_slice(args);
            secrets_on_the_command_line(&parse_with(&all, env, None).unwrap().settings)
        };
        let warned = with(&["--state", "postgres://waku:secret@db:5432/waku"], &[]);
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(warned[0].contains("--state") && warned[0].contains("WAKU_STATE") && !warned[0].contains("secret@"));
        assert_eq!(with(&["--iggy", "iggy://token@127.0.0.1:8090"], &[]).len(), 1, "an Iggy token is a secret");
        assert_eq!(with(&["--state", "postgres://waku@db/waku?password=secret"], &[]).len(), 1);
        assert!(with(&["--state", "postgres://waku@db:5432/waku"], &[]).is_empty(), "no password, no warning");
        assert!(with(&[], &[("WAKU_STATE", "postgres://waku:secret@db/waku")]).is_empty(), "the environment is fine");
    }

    #[test]
    fn a_named_config_file_must_exist() {
        let error =
            parse_with(&[&BASE[..], &["--config", "/nonexistent/waku.toml"]].concat(), &[], None).err().unwrap();
        assert!(error.starts_with("cannot read the config file /nonexistent/waku.toml"), "{error}");
    }

    #[test]
    fn every_setting_of_run_has_a_variable_and_a_key() {
        let command = Cli::command();
        let run = find(&command, &["run".to_owned()]).unwrap();
        let names: Vec<&str> = settings_of(run).map(long).collect();
        assert!(names.len() > 30, "{names:?}");
        for name in [
            "iggy",
            "batch-size",
            "memory-mib",
            "retry-delays",
            "until-caught-up",
            "admin",
            "admin-token-file",
            "admin-read-token-file",
            "admin-insecure",
        ] {
            assert!(names.contains(&name), "{name} is no setting");
        }
        assert_eq!(env_name("max-emit-kib-per-call"), "WAKU_MAX_EMIT_KIB_PER_CALL");
    }
}
