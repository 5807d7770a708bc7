//! `waku dlq list|show|redrive`: a projection's dead letters.

use anyhow::{Result, bail};
use clap::{Args, Subcommand};

use serde::Serialize;

use super::args::{OutputArgs, ProjectionArgs, parse_key};
use crate::engine::routing::Routed;
use crate::event::EventAtomicOrdering;
use crate::operations::dead_letter::{self, DeadLetter, DeadLetterError, Selection, Shelf};
use wakuwaku_core::terminal::printable;

#[derive(Subcommand)]
pub(super) enum DlqCommand {
    /// List the dead letters of a projection, one per line, without their
    /// bodies (`waku dlq show` prints one): all of them, streamed a page at
    /// a time, or a page with --limit (the last line on standard error, or
    /// `next` in JSON, names the next page's --after).
    #[command(
        after_help = "Example:\n  waku dlq list --data waku-data --projection bank --topic accounts\n  waku dlq list \
                      --data waku-data --projection bank --topic accounts --after 0:999 --limit 1000"
    )]
    List(DlqListArgs),
    /// Print one dead letter in full: where it came from, why, its body
    /// (reading that record alone).
    #[command(
        after_help = "Example:\n  waku dlq show --data waku-data --projection bank --topic accounts --record 0:3"
    )]
    Show(DlqShowArgs),
    /// Send dead letters back through the normal path (after fixing the
    /// module): they join the retry topic, in dead-letter order per key, and
    /// the running `waku run` of the projection applies them at once (else
    /// the next one does). They go in slices (1 000 letters or
    /// 16 MiB of bodies), each committed on its own: if it stops half way,
    /// run it again and it re-drives the rest, none twice. Only the partitions this host's
    /// state store owns (those it holds a position for: the ones its `waku
    /// run` consumes) are re-driven; it says which, and which it left to
    /// other hosts. While `waku run` runs on the data directory, this runs
    /// through it.
    #[command(after_help = "Example:\n  waku dlq redrive --data waku-data --projection bank --topic accounts --key 42")]
    Redrive(DlqRedriveArgs),
}

impl DlqCommand {
    /// Where its data is.
    pub(super) fn data(&self) -> &super::args::DataArgs {
        match self {
            Self::List(args) => &args.dlq.data,
            Self::Show(args) => &args.dlq.data,
            Self::Redrive(args) => &args.dlq.data,
        }
    }
}

/// `--rebuilt`.
#[derive(Args)]
pub(super) struct ShelfArgs {
    /// The dead letters a promoted rebuild left (in `dlq_<topic>.rebuild`,
    /// tagged `<projection>.rebuild`) instead of the projection's own;
    /// re-driven, they join `retry_<topic>` as the projection's.
    #[arg(long)]
    pub(super) rebuilt: bool,
}

impl ShelfArgs {
    fn shelf(&self, topic: &str, projection: &str) -> Shelf {
        match self.rebuilt {
            true => Shelf::rebuilt(topic, projection),
            false => Shelf::shared(topic, projection),
        }
    }
}

#[derive(Args)]
pub(super) struct DlqListArgs {
    #[command(flatten)]
    pub(super) dlq: ProjectionArgs,
    #[command(flatten)]
    pub(super) shelf: ShelfArgs,
    /// List the dead letters after this one, as `<partition>:<offset>` (a
    /// page's next).
    #[arg(long, value_parser = parse_place)]
    pub(super) after: Option<(u32, u64)>,
    /// The most dead letters to list (default: all, read a page at a time).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_LIST_LIMIT))]
    pub(super) limit: Option<u64>,
    #[command(flatten)]
    pub(super) output: OutputArgs,
}

#[derive(Args)]
pub(super) struct DlqShowArgs {
    #[command(flatten)]
    pub(super) dlq: ProjectionArgs,
    #[command(flatten)]
    pub(super) shelf: ShelfArgs,
    /// The dead letter's partition.
    #[arg(long, required_unless_present = "record", requires = "offset")]
    pub(super) partition: Option<u32>,
    /// Its offset in the dead-letter topic.
    #[arg(long, required_unless_present = "record", requires = "partition")]
    pub(super) offset: Option<u64>,
    /// The dead letter as `waku dlq list` names it, `<partition>:<offset>`
    /// (instead of --partition and --offset).
    #[arg(long, value_parser = parse_place, conflicts_with_all = ["partition", "offset"])]
    pub(super) record: Option<(u32, u64)>,
    #[command(flatten)]
    pub(super) output: OutputArgs,
}

#[derive(Args)]
pub(super) struct DlqRedriveArgs {
    #[command(flatten)]
    pub(super) dlq: ProjectionArgs,
    #[command(flatten)]
    pub(super) shelf: ShelfArgs,
    /// Only these partitions (comma-separated); each must be one this
    /// state store owns.
    #[arg(long, value_delimiter = ',')]
    pub(super) partition: Vec<u32>,
    /// Only these records, as `<partition>:<offset>` (comma-separated); each
    /// must be in a partition this state store owns.
    #[arg(long, value_delimiter = ',', value_parser = parse_place)]
    pub(super) record: Vec<(u32, u64)>,
    /// Only this key, as `waku dlq list` prints it (JSON: `42`, `'"ann"'`).
    #[arg(long)]
    pub(super) key: Option<String>,
    /// Every dead letter of the projection not re-driven yet, in the
    /// partitions this state store owns.
    #[arg(long, conflicts_with_all = ["partition", "record", "key"])]
    pub(super) all: bool,
}

pub(super) async fn dlq(command: DlqCommand) -> Result<()> {
    let (args, shelf) = match &command {
        DlqCommand::List(list) => (&list.dlq, &list.shelf),
        DlqCommand::Show(show) => (&show.dlq, &show.shelf),
        DlqCommand::Redrive(redrive) => (&redrive.dlq, &redrive.shelf),
    };
    let hint = "is `waku run` using it? stop it first";
    let (log, store) = args.existing(hint).await?;
    let names = crate::engine::projection::type_names(&store);
    let open = Opened {
        shelf: shelf.shelf(args.topic(), &args.projection),
        topic: args.topic(),
        projection: &args.projection,
        log,
        store,
        names,
    };
    match &command {
        DlqCommand::List(list) => list_letters(&open, list).await,
        DlqCommand::Show(show) => show_letter(&open, show).await,
        DlqCommand::Redrive(redrive) => redrive_letters(&open, redrive).await,
    }
}

/// What every `waku dlq` command reads from.
struct Opened<'a> {
    log: crate::storage::log::AnyLog,
    store: crate::storage::state::StateStore,
    topic: &'a str,
    projection: &'a str,
    shelf: Shelf,
    /// Event type names by tag, as the projection recorded them.
    names: std::collections::BTreeMap<u32, String>,
}

/// `waku dlq list`: every dead letter, or a page, streamed.
async fn list_letters(open: &Opened<'_>, list: &DlqListArgs) -> Result<()> {
    let Opened { log, store, topic, projection, shelf, names } = open;
    let (topic, projection) = (*topic, *projection);
    let json = list.output.json();
    if json {
        // The document is written a letter at a time: its head, each
        // letter, its tail.
        let (projection, topic) = (super::json_text(&projection, false)?, super::json_text(&topic, false)?);
        out!("{{\"projection\":{projection},\"topic\":{topic},\"dead_letters\":[")?;
    }
    let mut tally = Tally::default();
    let mut after = list.after;
    let mut left = list.limit.map(|limit| usize::try_from(limit).unwrap_or(usize::MAX));
    let next = loop {
        let want = left.map_or(LIST_PAGE, |left| left.min(LIST_PAGE));
        let page = dead_letter::list_page_on(log, topic, shelf, store, after, want).await?;
        for letter in &page.letters {
            if json {
                let separator = if tally.letters == 0 { "" } else { "," };
                out!("{separator}{}", super::json_text(&DeadLetterView::new(letter, None, names), false)?)?;
            } else {
                outln!("{}", dead_letter_line(letter, names))?;
            }
            tally.count(letter);
        }
        if let Some(left) = &mut left {
            *left -= page.letters.len();
        }
        match page.next {
            Some(next) if left == Some(0) => break Some(next),
            Some(next) => after = Some(next),
            None => break None,
        }
    };
    let next_place = next.map(|(partition, offset)| format!("{partition}:{offset}"));
    tally.owed = dead_letter::owed(store, shelf)?;
    if json {
        match (&next_place, list.limit) {
            (_, None) => outln!("],\"in_outbox\":{}}}", tally.owed)?,
            (next, Some(_)) => outln!("],\"in_outbox\":{},\"next\":{}}}", tally.owed, super::json_text(next, false)?)?,
        }
    }
    errln!("{}", tally.summary(projection, next_place.as_deref()));
    Ok(())
}

/// `waku dlq show`: one dead letter with its body.
async fn show_letter(open: &Opened<'_>, show: &DlqShowArgs) -> Result<()> {
    let Opened { log, store, topic, shelf, names, .. } = open;
    let (partition, offset) = match (show.record, show.partition, show.offset) {
        (Some(place), _, _) => place,
        (None, Some(partition), Some(offset)) => (partition, offset),
        _ => bail!("say which dead letter: --record <partition>:<offset>"),
    };
    let shown = dead_letter::show_on(log, topic, shelf, store, partition, offset).await?;
    match show.output.json() {
        true => outln!("{}", super::json_text(&DeadLetterView::new(&shown.letter, Some(&shown.body), names), false)?)?,
        false => outln!("{}", dead_letter_details(&shown.letter, &shown.body, names))?,
    }
    Ok(())
}

/// `waku dlq redrive`: the selected dead letters into the retry topic.
async fn redrive_letters(open: &Opened<'_>, redrive: &DlqRedriveArgs) -> Result<()> {
    let Opened { log, store, topic, projection, shelf, .. } = open;
    let (topic, projection) = (*topic, *projection);
    let selection = Selection {
        partitions: redrive.partition.clone(),
        records: redrive.record.clone(),
        key: redrive.key.as_deref().map(parse_key).transpose()?,
    };
    if !redrive.all && selection == Selection::default() {
        bail!("say which dead letters to re-drive: --partition, --record, --key, or --all");
    }
    let done = match dead_letter::redrive_on(log, topic, projection, shelf, store, &selection).await {
        Err(error @ (DeadLetterError::NothingOwned { .. } | DeadLetterError::NotOwned { .. })) => {
            let state = store.location();
            return Err(anyhow::Error::new(error).context(format!("nothing re-driven with the state {state}")));
        }
        Err(error @ (DeadLetterError::Log(_) | DeadLetterError::State(_) | DeadLetterError::Publish(_))) => {
            return Err(anyhow::Error::new(error).context(
                "re-drive stopped: the slices it committed stay re-driven (`waku dlq list` marks them); run \
                 it again to re-drive the rest, none twice",
            ));
        }
        done => done?,
    };
    let applies = match super::local_host::runs_projection(&redrive.dlq.data.data, projection) {
        true => "the running `waku run` applies them now",
        false => "the next `waku run` applies them",
    };
    outln!(
        "re-drove {} ({}) of `{projection}` from {} into `retry_{topic}`{}; {applies}",
        counted(done.records, "dead letter", "dead letters"),
        counted(done.events, "event", "events"),
        partition_list(&done.partitions),
        if done.already > 0 { format!(" ({} re-driven before, left alone)", done.already) } else { String::new() }
    )?;
    if done.left > 0 {
        outln!(
            "left {} in {} to the hosts that own them (this state store holds no position there)",
            counted(done.left, "dead letter", "dead letters"),
            partition_list(&done.others)
        )?;
    }
    Ok(())
}

/// The most dead letters one `--limit` asks for.
const MAX_LIST_LIMIT: u64 = 1_000_000;

/// The dead letters `waku dlq list` holds at a time.
const LIST_PAGE: usize = 1_000;

/// What `waku dlq list` listed, for its summary line.
#[derive(Default)]
struct Tally {
    letters: u64,
    /// Owned and not re-driven.
    waiting: u64,
    /// In partitions this state store does not own.
    elsewhere: u64,
    /// Those partitions, in order.
    others: Vec<u32>,
    /// Committed but not yet appended to the dead-letter topic
    /// ([`dead_letter::owed`]).
    owed: u64,
}

impl Tally {
    fn count(&mut self, letter: &DeadLetter) {
        self.letters += 1;
        match letter.owned {
            true => self.waiting += u64::from(!letter.redriven),
            false => {
                self.elsewhere += 1;
                if self.others.last() != Some(&letter.partition) {
                    self.others.push(letter.partition);
                }
            }
        }
    }

    /// `3 dead letters of `bank` (2 not re-driven)`, naming the next page's
    /// `--after` when there is one.
    fn summary(&self, projection: &str, next: Option<&str>) -> String {
        let elsewhere = match self.elsewhere {
            0 => String::new(),
            count => format!("; {count} in {}, which this state store does not own", partition_list(&self.others)),
        };
        let more = next.map_or(String::new(), |next| format!("; more follow: --after {next}"));
        let owed = match self.owed {
            0 => String::new(),
            owed => format!(
                "; {} more in the outbox, not yet in `dlq_…` (the next `waku run` or `waku dlq redrive` appends \
                 them, then they are listed)",
                counted(owed, "dead letter", "dead letters")
            ),
        };
        format!(
            "{} of `{projection}` ({} not re-driven{elsewhere}){more}{owed}",
            counted(self.letters, "dead letter", "dead letters"),
            self.waiting
        )
    }
}

/// `1 dead letter`, `2 dead letters`: the count with the word that fits.
pub(super) fn counted(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

/// `partition 0`, `partitions 0, 2`, or `no partition`.
pub(super) fn partition_list(partitions: &[u32]) -> String {
    let numbers: Vec<String> = partitions.iter().map(u32::to_string).collect();
    match partitions.len() {
        0 => "no partition".to_owned(),
        1 => format!("partition {}", numbers[0]),
        _ => format!("partitions {}", numbers.join(", ")),
    }
}

/// `partition:offset`.
pub(super) fn parse_place(text: &str) -> Result<(u32, u64), String> {
    let (partition, offset) = text.split_once(':').ok_or_else(|| format!("`{text}` is not <partition>:<offset>"))?;
    let partition = partition.parse().map_err(|_| format!("`{partition}` is not a partition number"))?;
    let offset = offset.parse().map_err(|_| format!("`{offset}` is not an offset"))?;
    Ok((partition, offset))
}

pub(super) fn failed_at(ms: u64) -> String {
    crate::engine::routing::context::rfc3339(ms)
}

/// One line per dead letter, for `waku dlq list`. What a module or a
/// publisher wrote (keys, messages) is shown escaped
/// ([`wakuwaku_core::terminal::printable`]): it never drives the terminal or
/// breaks the line.
pub(super) fn dead_letter_line(letter: &DeadLetter, names: &TypeNames) -> String {
    let routed = &letter.routed;
    let failure = routed.failure.as_ref();
    let event = match &letter.envelope {
        Ok(envelope) => printable(&format!("key {} {}", envelope.key, type_of(envelope.tag, names))).into_owned(),
        Err(_) => "unreadable headers".to_owned(),
    };
    format!(
        "{}:{}\t{}\t{event}\tfrom {}:{} ({})\tattempts {}\t{}\t{}{}",
        letter.partition,
        letter.offset,
        failure.map_or("-", |f| f.class.name()),
        routed.origin_partition,
        routed.origin_offset,
        counted(routed.events, "event", "events"),
        routed.attempts,
        failed_at(routed.failed_at_ms),
        failure.map_or(String::new(), |f| printable(&f.message).into_owned()),
        match (letter.owned, letter.redriven) {
            (false, _) => "\t[not this host's]",
            (true, true) => "\t[re-driven]",
            (true, false) => "",
        },
    )
}

/// The event types' names by tag, as the projection recorded them
/// ([`crate::engine::projection::type_names`]).
pub(super) type TypeNames = std::collections::BTreeMap<u32, String>;

/// An event type as people know it: `type Deposited (tag 2)`, or `tag 2`
/// when no module of the projection named it.
pub(super) fn type_of(tag: crate::event::EventTypeTag, names: &TypeNames) -> String {
    match names.get(&tag.get()) {
        Some(name) => format!("type {name} (tag {tag})"),
        None => format!("tag {tag}"),
    }
}

/// Everything about one dead letter, for `waku dlq show`, each line and the
/// body's lines escaped as in [`dead_letter_line`].
/// A letter's ordering on its topic, from its context, else its record's
/// own, and whether that one is known to be rewritten: a record an older
/// version retried (more than one attempt) carries the ordering its retry
/// gave it.
fn ordering_of(routed: &Routed, record: EventAtomicOrdering) -> (EventAtomicOrdering, bool) {
    match routed.ordering {
        Some(original) => (original, false),
        None => (record, routed.attempts > 1),
    }
}

pub(super) fn dead_letter_details(letter: &DeadLetter, body: &[u8], names: &TypeNames) -> String {
    let routed = &letter.routed;
    let mut lines = vec![
        format!("dead letter:  partition {}, offset {}", letter.partition, letter.offset),
        format!("projection:   {}", routed.projection),
        format!(
            "origin:       partition {}, offset {} ({} events)",
            routed.origin_partition, routed.origin_offset, routed.events
        ),
        format!("attempts:     {}", routed.attempts),
    ];
    if !routed.topic.is_empty() {
        lines.insert(2, format!("topic:        {}", routed.topic));
    }
    if let Some(first) = routed.first_failed_at_ms {
        lines.push(format!("first failed: {}", failed_at(first)));
    }
    lines.push(format!("failed at:    {}", failed_at(routed.failed_at_ms)));
    if !routed.event_type.is_empty() {
        lines.push(format!("event type:   {}", routed.event_type));
    }
    if let Some(failure) = &routed.failure {
        lines.push(format!("class:        {}", failure.class));
        lines.push(format!("message:      {}", failure.message));
        if !failure.module.is_empty() {
            lines.push(format!("module:       {}@{}", failure.module, failure.version));
        }
    }
    match &letter.envelope {
        Ok(e) => {
            let (ordering, rewritten) = ordering_of(routed, e.ordering);
            let rewritten = if rewritten { " (rewritten for a retry; the original was not recorded)" } else { "" };
            lines.push(format!(
                "event:        key {}, {}, {ordering}{rewritten}, {}",
                e.key,
                type_of(e.tag, names),
                e.algebra
            ))
        }
        Err(error) => lines.push(format!("event:        headers unreadable: {error}")),
    }
    lines.push(format!(
        "re-driven:    {}",
        match (letter.owned, letter.redriven) {
            (false, _) => "unknown here: this state store does not own the partition",
            (true, true) => "yes",
            (true, false) => "no",
        }
    ));
    let mut lines: Vec<String> = lines.iter().map(|line| printable(line).into_owned()).collect();
    match std::str::from_utf8(body) {
        Ok(text) => {
            lines.push(format!("body ({} bytes):", body.len()));
            lines.extend(text.split('\n').map(|line| printable(line).into_owned()));
        }
        Err(_) => lines.push(format!(
            "body ({} bytes, hex):\n{}",
            body.len(),
            body.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )),
    }
    lines.join("\n")
}

/// One dead letter, for `waku dlq list|show --output json`.
#[derive(Serialize)]
struct DeadLetterView<'a> {
    partition: u32,
    offset: u64,
    projection: &'a str,
    /// Null on a letter an older version wrote.
    topic: Option<&'a str>,
    origin: Place,
    events: u64,
    attempts: u32,
    /// Null before any failure, and on a letter an older version wrote.
    first_failed_at: Option<String>,
    failed_at: String,
    failed_at_ms: u64,
    /// Null when the host did not know it, or an older version wrote it.
    event_type: Option<&'a str>,
    /// The failure's class, message, module and version; all null for an
    /// event diverted behind its key.
    class: Option<&'static str>,
    message: Option<&'a str>,
    module: Option<&'a str>,
    version: Option<&'a str>,
    /// Null when the headers are unreadable (then `headers_error` says why).
    event: Option<EventView>,
    headers_error: Option<String>,
    /// Whether this state store owns the partition.
    owned: bool,
    /// Null when not owned: only the owner knows.
    redriven: Option<bool>,
    /// `dlq show` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<BodyView>,
}

#[derive(Serialize)]
struct Place {
    partition: u32,
    offset: u64,
}

#[derive(Serialize)]
struct EventView {
    key: serde_json::Value,
    tag: u32,
    /// The type's name, when a module of the projection named it.
    #[serde(rename = "type")]
    type_name: Option<String>,
    /// Its ordering on its topic; the record's own, when an older version
    /// did not record that.
    ordering: String,
    /// Whether `ordering` is known to be the one a retry rewrote.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ordering_rewritten: bool,
    algebra: String,
}

/// The body: its size, and its text when it is UTF-8, else its hex.
#[derive(Serialize)]
struct BodyView {
    bytes: usize,
    text: Option<String>,
    hex: Option<String>,
}

impl<'a> DeadLetterView<'a> {
    /// `body`: for `dlq show`.
    fn new(letter: &'a DeadLetter, body: Option<&[u8]>, names: &TypeNames) -> Self {
        let routed = &letter.routed;
        let failure = routed.failure.as_ref();
        Self {
            partition: letter.partition,
            offset: letter.offset,
            projection: &routed.projection,
            topic: Some(routed.topic.as_str()).filter(|topic| !topic.is_empty()),
            origin: Place { partition: routed.origin_partition, offset: routed.origin_offset },
            events: routed.events,
            attempts: routed.attempts,
            first_failed_at: routed.first_failed_at_ms.map(failed_at),
            failed_at: failed_at(routed.failed_at_ms),
            failed_at_ms: routed.failed_at_ms,
            event_type: Some(routed.event_type.as_str()).filter(|name| !name.is_empty()),
            class: failure.map(|f| f.class.name()),
            message: failure.map(|f| f.message.as_str()),
            module: failure.filter(|f| !f.module.is_empty()).map(|f| f.module.as_str()),
            version: failure.filter(|f| !f.version.is_empty()).map(|f| f.version.as_str()),
            event: letter.envelope.as_ref().ok().map(|e| EventView {
                key: e.key.value().to_json(),
                tag: e.tag.get(),
                type_name: names.get(&e.tag.get()).cloned(),
                ordering: ordering_of(routed, e.ordering).0.to_string(),
                ordering_rewritten: ordering_of(routed, e.ordering).1,
                algebra: e.algebra.to_string(),
            }),
            headers_error: letter.envelope.as_ref().err().map(ToString::to_string),
            owned: letter.owned,
            redriven: letter.owned.then_some(letter.redriven),
            body: body.map(|body| {
                let text = std::str::from_utf8(body).ok().map(str::to_owned);
                BodyView {
                    bytes: body.len(),
                    hex: text.is_none().then(|| body.iter().map(|b| format!("{b:02x}")).collect()),
                    text,
                }
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::routing::{Failure, FailureClass};

    #[test]
    fn a_letter_shows_its_ordering_on_its_topic_and_marks_a_rewritten_one() {
        let routed = |attempts, ordering| Routed {
            projection: "p".into(),
            topic: "t".into(),
            event_type: String::new(),
            origin_partition: 0,
            origin_offset: 0,
            events: 1,
            attempts,
            failed_at_ms: 0,
            first_failed_at_ms: None,
            failure: Some(Failure {
                class: FailureClass::Trap,
                message: "m".into(),
                module: "m".into(),
                version: "v".into(),
            }),
            ahead_of: None,
            ordering,
        };
        let (relaxed, acquire) = (EventAtomicOrdering::Relaxed, EventAtomicOrdering::Acquire);
        // Recorded: the original, whatever the record's own says.
        assert_eq!(ordering_of(&routed(3, Some(relaxed)), acquire), (relaxed, false));
        // An older version's record: its own, rewritten once it was retried.
        assert_eq!(ordering_of(&routed(1, None), acquire), (acquire, false));
        assert_eq!(ordering_of(&routed(2, None), acquire), (acquire, true));
    }
}
