//! `waku topic create|list|describe|consume`: the log's topics, on the
//! embedded log or on Iggy alike (everything goes through [`EventLog`]).
//!
//! Rules kept here:
//! - `list`, `describe` and `consume` create nothing: an embedded log must
//!   exist, a topic must be one of the log's ([`super::existing`]).
//! - What a publisher or a module wrote (header values, bodies) reaches the
//!   terminal only through [`printable`], and JSON only through
//!   [`super::json_text`]: a record can neither drive the terminal nor
//!   break its line. A value that is not UTF-8 is shown as hex.
//! - The host's own headers are shown decoded (key, type tag, ordering,
//!   algebra), the others as `name=value`. A type is named only by the
//!   modules of a projection that reads the topic (`--modules`): the names
//!   of modules that emit to it are not its.
//! - `consume` reads a page at a time ([`PAGE`]), whatever the topic
//!   holds; `--follow` asks again for what was appended, every
//!   [`FOLLOW_EVERY`], until a signal.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use serde::Serialize;

use super::args::{DataArgs, OutputArgs};
use super::dlq::counted;
use super::signals::ShutdownSignals;
use crate::event::{EventHeaders, Header};
use crate::sandbox::handler::HandlerModule;
use crate::sandbox::runtime::component_file::{check_module_dir_size, module_paths};
use crate::sandbox::runtime::read_component;
use crate::storage::log::{AnyLog, EventLog, StoredRecord};
use wakuwaku_core::terminal::printable;

#[derive(Subcommand)]
pub(super) enum TopicCommand {
    /// Create a topic with a number of partitions (nothing happens when it
    /// exists with that many).
    #[command(after_help = "Example:\n  waku topic create --data waku-data --topic orders --partitions 4")]
    Create(TopicCreateArgs),
    /// List the log's topics: partitions and messages of each (the host's
    /// own `retry_…` and `dlq_…` among them).
    #[command(after_help = "Example:\n  waku topic list --data waku-data")]
    List(TopicListArgs),
    /// Each partition of a topic: its first offset, its end, its messages.
    #[command(after_help = "Example:\n  waku topic describe --data waku-data --topic orders --output json")]
    Describe(TopicDescribeArgs),
    /// Print a topic's messages: offset, headers (as text) and body, from
    /// an offset, the start or the end; with --follow, then what is
    /// appended, until Ctrl-C.
    #[command(after_help = "Example:\n  waku topic consume --data waku-data --topic orders --from 0 --limit 10\n  \
                            waku topic consume --iggy iggy://iggy:iggy@127.0.0.1:8090 --topic orders --from end \
                            --follow --output json")]
    Consume(TopicConsumeArgs),
}

impl TopicCommand {
    /// Where its data is.
    pub(super) fn data(&self) -> &DataArgs {
        match self {
            Self::Create(args) => &args.data,
            Self::List(args) => &args.data,
            Self::Describe(args) => &args.data,
            Self::Consume(args) => &args.data,
        }
    }
}

#[derive(Args)]
pub(super) struct TopicCreateArgs {
    #[command(flatten)]
    pub(super) data: DataArgs,
    /// The topic.
    #[arg(long)]
    pub(super) topic: String,
    /// Its partitions.
    #[arg(long)]
    pub(super) partitions: u32,
}

#[derive(Args)]
pub(super) struct TopicListArgs {
    #[command(flatten)]
    pub(super) data: DataArgs,
    #[command(flatten)]
    pub(super) output: OutputArgs,
}

#[derive(Args)]
pub(super) struct TopicDescribeArgs {
    #[command(flatten)]
    pub(super) data: DataArgs,
    /// The topic.
    #[arg(long)]
    pub(super) topic: String,
    #[command(flatten)]
    pub(super) output: OutputArgs,
}

#[derive(Args)]
pub(super) struct TopicConsumeArgs {
    #[command(flatten)]
    pub(super) data: DataArgs,
    /// The topic.
    #[arg(long)]
    pub(super) topic: String,
    /// Only these partitions (comma-separated; default: all).
    #[arg(long, value_delimiter = ',')]
    pub(super) partition: Vec<u32>,
    /// Where to start in each partition: an offset, `start` (the first
    /// message the log holds) or `end` (only what is appended from now
    /// on, with --follow).
    #[arg(long, default_value = "start", value_parser = parse_from)]
    pub(super) from: From,
    /// The most messages to print, in all.
    #[arg(long)]
    pub(super) limit: Option<u64>,
    /// Keep printing what is appended, until Ctrl-C.
    #[arg(long)]
    pub(super) follow: bool,
    /// The module directory of a projection that reads the topic (as
    /// `waku run --modules`; also `modules` in waku.toml, WAKU_MODULES):
    /// each event type is shown by the name its modules give it.
    #[arg(long)]
    pub(super) modules: Option<PathBuf>,
    /// How to print each message: `table`, one line each; `json`, one JSON
    /// document a line.
    #[command(flatten)]
    pub(super) output: OutputArgs,
}

/// Where `consume` starts in each partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum From {
    /// The first message the log holds.
    Start,
    /// The end at the time `consume` started.
    End,
    /// This offset.
    Offset(u64),
}

fn parse_from(text: &str) -> Result<From, String> {
    match text {
        "start" | "earliest" => Ok(From::Start),
        "end" | "latest" => Ok(From::End),
        number => number
            .parse()
            .map(From::Offset)
            .map_err(|_| format!("`{number}` is no place to start: give an offset (`0`, `1200`), `start` or `end`")),
    }
}

/// The most messages `consume` reads from a partition at a time.
const PAGE: usize = 500;

/// How often `consume --follow` asks for what was appended.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);

pub(super) async fn topic(command: TopicCommand) -> Result<()> {
    match command {
        TopicCommand::Create(args) => {
            crate::authoring::publish::check_topic(&args.topic)?;
            let log = args.data.log().await?;
            log.create_topic(&args.topic, args.partitions).await?;
            outln!("topic `{}` has {}", args.topic, counted(args.partitions.into(), "partition", "partitions"))?;
        }
        TopicCommand::List(args) => list(&args).await?,
        TopicCommand::Describe(args) => describe(&args).await?,
        TopicCommand::Consume(args) => consume(&args).await?,
    }
    Ok(())
}

/// The log of a command that reads a topic: it must exist already.
async fn existing_log(data: &DataArgs, topic: Option<&str>) -> Result<AnyLog> {
    let log = data.existing_log("is `waku run` using it? stop it first").await?;
    if let Some(topic) = topic {
        super::existing::topic(&log, topic).await?;
    }
    Ok(log)
}

/// One topic in `topic list --output json`.
#[derive(Serialize)]
struct TopicView {
    topic: String,
    partitions: u32,
    /// Messages the log holds (ends minus first offsets).
    messages: u64,
}

async fn list(args: &TopicListArgs) -> Result<()> {
    let log = existing_log(&args.data, None).await?;
    let mut topics = Vec::new();
    for (topic, partitions) in log.topics().await? {
        let mut messages = 0;
        for partition in 0..partitions {
            let (first, end) = log.extent(&topic, partition).await?;
            messages += end.saturating_sub(first);
        }
        topics.push(TopicView { topic, partitions, messages });
    }
    if args.output.json() {
        outln!("{}", super::json_text(&serde_json::json!({ "topics": topics }), false)?)?;
        return Ok(());
    }
    if topics.is_empty() {
        outln!("the log holds no topic yet (`waku topic create` or `waku publish --partitions N` makes one)")?;
    }
    for view in &topics {
        outln!(
            "{}\t{}\t{}",
            view.topic,
            counted(view.partitions.into(), "partition", "partitions"),
            counted(view.messages, "message", "messages")
        )?;
    }
    Ok(())
}

/// One partition in `topic describe`.
#[derive(Serialize)]
struct PartitionView {
    partition: u32,
    /// The first offset the log still holds.
    first: u64,
    /// The offset the next message gets.
    end: u64,
    messages: u64,
}

async fn describe(args: &TopicDescribeArgs) -> Result<()> {
    let log = existing_log(&args.data, Some(&args.topic)).await?;
    let mut partitions = Vec::new();
    for partition in 0..log.partitions(&args.topic).await? {
        let (first, end) = log.extent(&args.topic, partition).await?;
        partitions.push(PartitionView { partition, first, end, messages: end.saturating_sub(first) });
    }
    let durability = match log.durability(&args.topic).await? {
        crate::storage::log::loss::Durability::Durable => "durable".to_owned(),
        crate::storage::log::loss::Durability::Lossy { setting } => format!("lossy ({setting})"),
        crate::storage::log::loss::Durability::Unknown { reason } => format!("unknown ({reason})"),
    };
    if args.output.json() {
        let view = serde_json::json!({ "topic": args.topic, "durability": durability, "partitions": partitions });
        outln!("{}", super::json_text(&view, false)?)?;
        return Ok(());
    }
    let messages: u64 = partitions.iter().map(|p| p.messages).sum();
    outln!(
        "topic `{}`: {}, {}; {}",
        args.topic,
        counted(partitions.len() as u64, "partition", "partitions"),
        counted(messages, "message", "messages"),
        printable(&durability)
    )?;
    outln!("partition\tfirst\tend\tmessages")?;
    for p in &partitions {
        outln!("{}\t{}\t{}\t{}", p.partition, p.first, p.end, p.messages)?;
    }
    Ok(())
}

async fn consume(args: &TopicConsumeArgs) -> Result<()> {
    let log = existing_log(&args.data, Some(&args.topic)).await?;
    let count = log.partitions(&args.topic).await?;
    let partitions: Vec<u32> = match args.partition.is_empty() {
        true => (0..count).collect(),
        false => args.partition.clone(),
    };
    if let Some(&missing) = partitions.iter().find(|&&p| p >= count) {
        bail!(
            "topic `{}` has no partition {missing} (it has {})",
            args.topic,
            counted(count.into(), "partition", "partitions")
        );
    }
    let mut next = Vec::with_capacity(partitions.len());
    for &partition in &partitions {
        let (first, end) = log.extent(&args.topic, partition).await?;
        next.push(match args.from {
            From::Start => first,
            From::End => end,
            From::Offset(offset) => offset.max(first),
        });
    }
    let mut types = match &args.modules {
        Some(dir) => type_names(dir, &args.topic).await?,
        None => Types::Tags(Some(format!(
            "waku: event types are shown by tag; give the module directory of a projection that reads `{}` \
             (--modules, or `modules` in waku.toml) to see their names",
            args.topic
        ))),
    };
    let mut left = args.limit.unwrap_or(u64::MAX);
    let mut signals = args.follow.then(ShutdownSignals::install).transpose()?;
    loop {
        let mut read_any = false;
        for (index, &partition) in partitions.iter().enumerate() {
            while left > 0 {
                let want = PAGE.min(usize::try_from(left).unwrap_or(usize::MAX));
                let records = log.read(&args.topic, partition, next[index], want).await?;
                let Some(last) = records.last() else { break };
                next[index] = last.offset + 1;
                read_any = true;
                for stored in records.iter().take(usize::try_from(left).unwrap_or(usize::MAX)) {
                    print_record(&args.topic, partition, stored, args.output.json(), &mut types)?;
                    left -= 1;
                }
            }
        }
        let Some(signals) = signals.as_mut().filter(|_| left > 0) else { break };
        if !read_any {
            tokio::select! {
                () = signals.next() => break,
                () = tokio::time::sleep(FOLLOW_EVERY) => {}
            }
        }
    }
    Ok(())
}

/// How `consume` shows an event's type.
enum Types {
    /// By name (and tag), as the modules that read the topic name them.
    Named(BTreeMap<u32, String>),
    /// By tag; the hint, said once before the first event shown in a
    /// table, says how to see names.
    Tags(Option<String>),
}

/// The event types' names by tag, as the modules of `dir` declare them;
/// tags alone, saying why, when a module there emits to `topic` (its tags
/// are the emitter's choice, not the names these modules read). A file that
/// does not load is said in a warning and passed over.
async fn type_names(dir: &Path, topic: &str) -> Result<Types> {
    // The rules of a module directory, as a host keeps them
    // (`module-count`, `module-dir-size`).
    let paths = module_paths(dir).with_context(|| format!("reading {}", dir.display()))?;
    let topic = topic.to_owned();
    let dir = dir.to_owned();
    tokio::task::spawn_blocking(move || {
        let sandbox = crate::sandbox::runtime::Sandbox::new(crate::sandbox::runtime::SandboxLimits::default())?;
        let (mut names, mut total) = (BTreeMap::new(), 0);
        for path in &paths {
            let bytes = read_component(path);
            if let Ok(bytes) = &bytes {
                total += bytes.len() as u64;
                check_module_dir_size(total).with_context(|| format!("reading {}", dir.display()))?;
            }
            let name = path.file_stem().map_or_else(|| "module".into(), |stem| stem.to_string_lossy());
            let module = match bytes.map_err(anyhow::Error::from).and_then(|bytes| Ok(sandbox.load(&name, &bytes)?)) {
                Ok(module) => module,
                Err(error) => {
                    errln!("waku: warning: {} gives no type names: {error:#}", path.display());
                    continue;
                }
            };
            if module.emits().contains(&topic) {
                return Ok(Types::Tags(Some(format!(
                    "waku: event types are shown by tag: module `{}` of {} emits to `{topic}`, so its names are not \
                     this topic's; give the module directory of a projection that reads `{topic}` to see them",
                    module.name(),
                    dir.display()
                ))));
            }
            names.extend(module.event_types().iter().map(|t| (t.tag.get(), t.name.clone())));
        }
        Ok(Types::Named(names))
    })
    .await
    .context("reading the modules")?
}

/// A header value: text when it is UTF-8, else hex.
#[derive(Serialize)]
struct ValueView {
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hex: Option<String>,
}

impl ValueView {
    fn new(bytes: &[u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) => Self { text: Some(text.to_owned()), hex: None },
            Err(_) => Self { text: None, hex: Some(bytes.iter().map(|b| format!("{b:02x}")).collect()) },
        }
    }

    /// For a line of text: the text escaped, or `0x` and the hex.
    fn shown(&self) -> String {
        match (&self.text, &self.hex) {
            (Some(text), _) => printable(text).into_owned(),
            (None, Some(hex)) => format!("0x{hex}"),
            (None, None) => String::new(),
        }
    }
}

/// One message in `topic consume --output json`.
#[derive(Serialize)]
struct RecordView<'a> {
    topic: &'a str,
    partition: u32,
    offset: u64,
    /// The host's headers decoded; null when the message carries none
    /// that can be read (then `headers` holds them raw).
    event: Option<serde_json::Value>,
    /// The other headers, by name.
    headers: Vec<(String, ValueView)>,
    body: ValueView,
}

/// Whether `header` is one the envelope decodes.
fn is_envelope(header: &Header) -> bool {
    use crate::event::header_name as names;
    [names::VERSION, names::TAG, names::KEY, names::ORDERING, names::ALGEBRA, names::EVENT_TIME]
        .contains(&header.name.as_str())
}

fn print_record(topic: &str, partition: u32, stored: &StoredRecord, json: bool, types: &mut Types) -> Result<()> {
    let headers = &stored.record.headers;
    let envelope = EventHeaders::parse_stored(headers).ok();
    let others: Vec<(String, ValueView)> = headers
        .iter()
        .filter(|header| envelope.is_none() || !is_envelope(header))
        .map(|header| (header.name.clone(), ValueView::new(&header.value)))
        .collect();
    let body = ValueView::new(&stored.record.body);
    let no_names = BTreeMap::new();
    let names = match types {
        Types::Named(names) => &*names,
        Types::Tags(_) => &no_names,
    };
    if json {
        let event = envelope.as_ref().map(|e| {
            serde_json::json!({
                "key": e.key.value().to_json(),
                "tag": e.tag.get(),
                "type_name": names.get(&e.tag.get()),
                "ordering": e.ordering.to_string(),
                "algebra": e.algebra.to_string(),
                "event_time_ms": e.event_time,
            })
        });
        let view = RecordView { topic, partition, offset: stored.offset, event, headers: others, body };
        outln!("{}", super::json_text(&view, false)?)?;
        return Ok(());
    }
    let event = match &envelope {
        Some(e) => format!("key {} {} {}", e.key, super::dlq::type_of(e.tag, names), e.ordering),
        None => "no event headers".to_owned(),
    };
    if let (Some(_), Types::Tags(hint)) = (&envelope, types)
        && let Some(hint) = hint.take()
    {
        errln!("{hint}");
    }
    let others: Vec<String> =
        others.iter().map(|(name, value)| format!("{}={}", printable(name), value.shown())).collect();
    outln!(
        "{partition}:{}\t{}\t{}\t{}",
        stored.offset,
        printable(&event),
        if others.is_empty() { "-".to_owned() } else { others.join(" ") },
        body.shown()
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_takes_an_offset_start_or_end() {
        assert_eq!(parse_from("start"), Ok(From::Start));
        assert_eq!(parse_from("end"), Ok(From::End));
        assert_eq!(parse_from("1200"), Ok(From::Offset(1200)));
        assert!(parse_from("soon").unwrap_err().contains("give an offset"));
    }

    #[test]
    fn a_value_is_text_escaped_or_hex() {
        assert_eq!(ValueView::new(b"plain").shown(), "plain");
        assert_eq!(ValueView::new(b"\x1b[2Jx").shown(), "\\u{1b}[2Jx");
        assert_eq!(ValueView::new(&[0xff, 0x00]).shown(), "0xff00");
    }
}
