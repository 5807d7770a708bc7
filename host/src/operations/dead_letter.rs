//! Dead letters: reading a topic's dead-letter topic, and re-driving its
//! records back through the normal path once the module is fixed.
//!
//! Rules kept here:
//! - **A dead letter is never removed.** The dead-letter topic is a log;
//!   re-driving a record marks it done in the projection's state (the
//!   `done` table, [`crate::storage::state::BatchCommit::done`]) in the same
//!   transaction that queues its copy, so it is re-driven once.
//! - **Re-driven records take the retry path.** They are appended to the
//!   projection's retry topic (same partition) with no attempts made, so the
//!   consumer picks them up at once, behind any work of their key already
//!   waiting, and only the projection that dead-lettered them applies them
//!   again: a shared topic's other projections never see them.
//! - **Per-key order among re-driven records is the dead-letter order.**
//!   Each re-driven record acquires ([`routing::rewrite_orderings`] with one
//!   stage per record), so planning them again runs them one after another.
//! - **Nothing is half done.** The copies go through the projection's
//!   outbox: committed with the marks, then appended exactly once.
//! - **Nothing owed is invisible.** A dead letter is committed to the
//!   outbox before it reaches `dlq_<topic>`; [`owed`] counts those not
//!   appended yet, for a listing to say so, and [`redrive`] appends them
//!   before it reads, so one pass re-drives every letter a listing counts.
//! - **A host re-drives only the partitions it owns.** Hosts that spread a
//!   topic over disjoint partitions share its dead-letter topic but each
//!   keeps its own state store, and so its own marks. A host owns the
//!   partitions its store consumes: those it holds a position for. A dead
//!   letter is written in the commit that moves its partition's position,
//!   so every dead letter of a partition was written by a store that owns
//!   it. Re-driving another host's letter would queue a copy that host
//!   applies while only this store marks it, and the owner's own re-drive
//!   would apply it again; so [`redrive`] leaves other partitions alone and
//!   says which they are, refuses a partition or record it does not own,
//!   and refuses to act at all for a store that owns nothing. Running it
//!   twice, on one host or on each, applies every letter at most once.
//! - **A reset settles what came before.** `waku reset --to earliest`
//!   moves the projection's position in the dead-letter topic to its end
//!   ([`crate::operations::reset`]): the events of the letters below it are replayed
//!   from the topic, so those letters count as re-driven and stay readable.
//! - **Only events are re-driven.** A message with unreadable headers needs
//!   a corrected message; a message a module emitted that could not be
//!   delivered (class `undeliverable`, 0 events, see [`crate::engine::outbox`]) is
//!   not an event of the topic and is listed, never re-driven.
//! - **Memory does not grow with the dead-letter topic.** A module that
//!   dead-letters everything makes the dead-letter topic as large as its
//!   topic, so nothing here holds the topic: listings read it in pages of
//!   at most [`PAGE_RECORDS`] records and [`PAGE_BYTES`] bytes (plus one
//!   record) and keep each letter without its body ([`DeadLetter::body_bytes`]
//!   says how large it is); [`list_page_on`] hands them out a page at a
//!   time; [`show`] reads the one record asked for; and [`redrive`] works in
//!   slices ([`Slice`]), each read, queued and marked re-driven in a commit
//!   of its own and appended before the next is read. A crash between
//!   slices leaves the committed ones marked and queued (the outbox appends
//!   them), the rest unmarked: a second run re-drives exactly the rest.
//!   [`list`] and [`list_on`] still return every letter, for tests and small
//!   topics; they hold the letters' routing headers, never their bodies.

use crate::engine::outbox::{self, OutboxError};
use crate::engine::routing::{self, FailureClass, Routed, RoutedTopics, dlq_topic, retry_topic};
use crate::event::Header;
use crate::event::{EventHeaders, HeaderError};
use crate::key::Key;
use crate::storage::log::{EventLog, LogError, PolledBatch, RecordView};
use crate::storage::state::{BatchCommit, OutboxEntry, StateError, StateStore};
use crate::storage::stats::Stat;

/// One record of a dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Its partition in the dead-letter topic (the partition it came from).
    pub partition: u32,
    /// Its offset in the dead-letter topic.
    pub offset: u64,
    /// Where it came from and why it failed.
    pub routed: Routed,
    /// Its event envelope, or why that cannot be read (a malformed message).
    pub envelope: Result<EventHeaders, HeaderError>,
    /// The size of its body in bytes. A letter is listed without its body
    /// (see the [module documentation](self)); [`show`] reads it.
    pub body_bytes: usize,
    /// Whether it was re-driven already (by this state store).
    pub redriven: bool,
    /// Whether its partition is owned by this state store (see the
    /// [module documentation](self)): only then may it be re-driven here,
    /// and only then does [`DeadLetter::redriven`] tell.
    pub owned: bool,
}

/// One dead letter with its body, as [`show`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownLetter {
    /// The letter.
    pub letter: DeadLetter,
    /// Its body as stored.
    pub body: Vec<u8>,
}

/// One page of a listing ([`list_page_on`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LetterPage {
    /// The page's letters, in partition and offset order.
    pub letters: Vec<DeadLetter>,
    /// The place (`partition`, `offset`) of the page's last letter when
    /// more follow: pass it as the next page's `after`. `None` at the end.
    pub next: Option<(u32, u64)>,
}

/// The most records one read of a dead-letter topic takes.
pub const PAGE_RECORDS: usize = 256;

/// The bytes after which one read of a dead-letter topic stops (it always
/// takes one record, however large the log lets it be).
pub const PAGE_BYTES: usize = 4 << 20;

/// How much one re-drive commit takes: it is cut once it holds this many
/// records or bodies of this many bytes (always at least one record). Each
/// slice is one state commit and one outbox publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    /// The most records of one slice.
    pub records: usize,
    /// The body bytes after which a slice is cut.
    pub bytes: usize,
}

impl Default for Slice {
    /// 1 000 records or 16 MiB of bodies.
    fn default() -> Self {
        Self { records: 1_000, bytes: 16 << 20 }
    }
}

/// Which dead letters to act on. Empty fields select everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Only these partitions.
    pub partitions: Vec<u32>,
    /// Only these (partition, offset) records.
    pub records: Vec<(u32, u64)>,
    /// Only this key.
    pub key: Option<Key>,
}

impl Selection {
    fn picks(&self, letter: &DeadLetter) -> bool {
        self.covers(letter.partition)
            && (self.records.is_empty() || self.records.contains(&(letter.partition, letter.offset)))
            && self.key.as_ref().is_none_or(|key| letter.envelope.as_ref().is_ok_and(|e| e.key == *key))
    }

    /// Whether letters of `partition` may be selected.
    fn covers(&self, partition: u32) -> bool {
        (self.partitions.is_empty() || self.partitions.contains(&partition))
            && (self.records.is_empty() || self.records.iter().any(|&(p, _)| p == partition))
    }
}

/// What a re-drive did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redriven {
    /// The partitions it re-drove from: those this state store owns, as far
    /// as the selection reaches, in order.
    pub partitions: Vec<u32>,
    /// Records queued for another attempt.
    pub records: u64,
    /// Events they account for.
    pub events: u64,
    /// Selected records skipped because they were re-driven before.
    pub already: u64,
    /// Partitions holding selected dead letters that this state store does
    /// not own, left to the hosts that run them, in order.
    pub others: Vec<u32>,
    /// The selected dead letters in those partitions.
    pub left: u64,
}

/// Why reading or re-driving dead letters failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeadLetterError {
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The projection's state failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// Publishing the re-driven records failed after they were committed;
    /// they are published when the projection next runs.
    #[error("the re-driven records are committed but not yet appended (the next `waku run` appends them)")]
    Publish(#[source] OutboxError),
    /// A record of the dead-letter topic has unreadable routing headers.
    #[error("record {offset} of `{topic}` partition {partition} is not a dead letter: {error}")]
    NotADeadLetter {
        /// The dead-letter topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// The offset.
        offset: u64,
        /// What is wrong with it.
        error: HeaderError,
    },
    /// No dead letter of the projection is at that place.
    #[error("projection `{projection}` has no dead letter at partition {partition}, offset {offset}")]
    NotFound {
        /// The projection.
        projection: String,
        /// The partition asked for.
        partition: u32,
        /// The offset asked for.
        offset: u64,
    },
    /// This state store owns no partition of the topic: it never consumed
    /// it, so none of its dead letters is this store's to re-drive.
    #[error(
        "this state store of projection `{projection}` holds no position in topic `{topic}`: it owns no partition, \
         so no dead letter is its to re-drive"
    )]
    NothingOwned {
        /// The projection.
        projection: String,
        /// The topic.
        topic: String,
    },
    /// A partition or record named for re-drive is in a partition this
    /// state store does not own.
    #[error(
        "partition {partition} of topic `{topic}` is not this state store's (it holds no position there); re-drive \
         it on the host that runs it"
    )]
    NotOwned {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
    },
    /// The selected record cannot go back through the normal path.
    #[error("dead letter at partition {partition}, offset {offset} cannot be re-driven: {reason}")]
    CannotRedrive {
        /// The partition.
        partition: u32,
        /// The offset.
        offset: u64,
        /// Why.
        reason: String,
    },
}

/// Where a projection's dead letters are read: a dead-letter topic and the
/// projection name its records carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shelf {
    dlq: String,
    tag: String,
    /// Only a store holding a position in `dlq` owns its letters: the
    /// promoted shadow's store does (set when it started), the live store
    /// before a promotion does not.
    marked_only: bool,
}

impl Shelf {
    /// `projection`'s own, in the topic's shared `dlq_<topic>`.
    pub fn shared(topic: &str, projection: &str) -> Self {
        Self { dlq: dlq_topic(topic), tag: projection.to_owned(), marked_only: false }
    }

    /// Those a rebuild of `projection` left, in its own
    /// `dlq_<topic>.rebuild` ([`RoutedTopics::shadow`]), tagged with the
    /// shadow's name: after a promotion they are the projection's.
    pub fn rebuilt(topic: &str, projection: &str) -> Self {
        let dlq = RoutedTopics::shadow(topic).dlq().to_owned();
        Self { dlq, tag: crate::operations::rebuild::shadow_name(projection), marked_only: true }
    }

    /// Whether `store` owns the letters of `partition` on this shelf: it
    /// owns the partition of `topic` ([`owns`]), and for a rebuild's
    /// letters it is the store the rebuild built.
    fn owned_by(&self, store: &StateStore, topic: &str, partition: u32) -> Result<bool, StateError> {
        Ok(owns(store, topic, partition)? && (!self.marked_only || store.position(&self.dlq, partition)?.is_some()))
    }
}

/// What a state store knows of one partition of a shelf: whether it owns
/// it, and which of its letters count as re-driven.
struct Marks {
    owned: bool,
    /// The offsets marked re-driven, in order.
    done: Vec<u64>,
    /// A reset to the earliest offset settles every dead letter before it
    /// (its event is replayed from the topic): they count as re-driven.
    settled_below: u64,
}

impl Marks {
    fn read(shelf: &Shelf, store: &StateStore, topic: &str, partition: u32) -> Result<Self, StateError> {
        Ok(Self {
            owned: shelf.owned_by(store, topic, partition)?,
            done: store.done(&shelf.dlq, partition)?,
            settled_below: store.position(&shelf.dlq, partition)?.unwrap_or(0),
        })
    }

    fn redriven(&self, offset: u64) -> bool {
        offset < self.settled_below || self.done.binary_search(&offset).is_ok()
    }
}

/// The dead letter at `offset` of `partition` on `shelf`, from its headers,
/// without its body; `None` when it is another projection's.
fn letter_at(
    shelf: &Shelf,
    marks: &Marks,
    partition: u32,
    offset: u64,
    headers: &[Header],
    body_bytes: usize,
) -> Result<Option<DeadLetter>, DeadLetterError> {
    let routed = Routed::parse(headers).map_err(|error| DeadLetterError::NotADeadLetter {
        topic: shelf.dlq.clone(),
        partition,
        offset,
        error,
    })?;
    if routed.projection != shelf.tag {
        return Ok(None);
    }
    Ok(Some(DeadLetter {
        partition,
        offset,
        routed,
        envelope: EventHeaders::parse_stored(headers),
        body_bytes,
        redriven: marks.redriven(offset),
        owned: marks.owned,
    }))
}

/// [`letter_at`] for a record of a page.
fn letter_of(
    shelf: &Shelf,
    marks: &Marks,
    partition: u32,
    view: RecordView<'_>,
) -> Result<Option<DeadLetter>, DeadLetterError> {
    letter_at(shelf, marks, partition, view.offset(), &view.owned_headers(), view.body().len())
}

/// A partition of a dead-letter topic read page by page, up to the end it
/// had when the reading started: at most [`PAGE_RECORDS`] records and
/// [`PAGE_BYTES`] bytes (plus one record) held at a time.
struct Pages<'a, L> {
    log: &'a L,
    dlq: &'a str,
    partition: u32,
    next: u64,
    end: u64,
    batch: PolledBatch,
}

impl<'a, L: EventLog> Pages<'a, L> {
    async fn new(log: &'a L, dlq: &'a str, partition: u32, from: u64) -> Result<Self, LogError> {
        let end = log.end_offset(dlq, partition).await?;
        Ok(Self { log, dlq, partition, next: from, end, batch: PolledBatch::with_byte_budget(PAGE_BYTES) })
    }

    /// The next page, or `None` past the end.
    async fn next_page(&mut self) -> Result<Option<&PolledBatch>, LogError> {
        if self.next >= self.end {
            return Ok(None);
        }
        let max = PAGE_RECORDS.min(usize::try_from(self.end - self.next).unwrap_or(PAGE_RECORDS));
        let batch = std::mem::take(&mut self.batch);
        self.batch = self.log.poll(self.dlq, self.partition, self.next, max, batch).await?;
        let Some(last) = self.batch.last().map(|view| view.offset()) else {
            self.next = self.end;
            return Ok(None);
        };
        self.next = last + 1;
        Ok(Some(&self.batch))
    }
}

/// The dead letters of `projection` on `topic`, in partition and offset
/// order, marked when they were re-driven already, without their bodies.
///
/// Every letter at once: for a bounded listing, see [`list_page_on`].
pub async fn list<L: EventLog>(
    log: &L,
    topic: &str,
    projection: &str,
    store: &StateStore,
) -> Result<Vec<DeadLetter>, DeadLetterError> {
    list_on(log, topic, &Shelf::shared(topic, projection), store).await
}

/// The dead letters on `shelf` of a projection of `topic`, as [`list`].
pub async fn list_on<L: EventLog>(
    log: &L,
    topic: &str,
    shelf: &Shelf,
    store: &StateStore,
) -> Result<Vec<DeadLetter>, DeadLetterError> {
    let mut letters = Vec::new();
    let mut after = None;
    loop {
        let page = list_page_on(log, topic, shelf, store, after, 4096).await?;
        letters.extend(page.letters);
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(letters),
        }
    }
}

/// Up to `limit` dead letters on `shelf` of a projection of `topic`, as
/// [`list`], from the one after place `after` (`partition`, `offset`; from
/// the first when `None`). Reads the dead-letter topic a page at a time
/// (see the [module documentation](self)) and keeps no body, so it holds
/// at most `limit` letters whatever the topic holds.
pub async fn list_page_on<L: EventLog>(
    log: &L,
    topic: &str,
    shelf: &Shelf,
    store: &StateStore,
    after: Option<(u32, u64)>,
    limit: usize,
) -> Result<LetterPage, DeadLetterError> {
    let dlq = shelf.dlq.as_str();
    let mut page = LetterPage::default();
    let first = after.map_or(0, |(partition, _)| partition);
    let partitions = match log.partitions(dlq).await {
        Ok(partitions) => partitions,
        // No dead-letter topic yet (a host creates it when it starts): nothing was dead-lettered.
        Err(LogError::TopicNotFound { .. }) => return Ok(page),
        Err(error) => return Err(error.into()),
    };
    for partition in first..partitions {
        let marks = Marks::read(shelf, store, topic, partition)?;
        let from = match after {
            Some((after_partition, offset)) if after_partition == partition => offset.saturating_add(1),
            _ => 0,
        };
        let mut pages = Pages::new(log, dlq, partition, from).await?;
        while let Some(batch) = pages.next_page().await? {
            for view in batch.iter() {
                let Some(letter) = letter_of(shelf, &marks, partition, view)? else { continue };
                if page.letters.len() == limit {
                    // One more follows: the page ends at its last letter.
                    page.next = page.letters.last().map(|last| (last.partition, last.offset));
                    return Ok(page);
                }
                page.letters.push(letter);
            }
        }
    }
    Ok(page)
}

/// The dead letters on `shelf` that `store` committed but has not appended
/// to the log yet: its outbox holds them (a crash, or a stop whose last
/// append failed, came between the commit and the append). A listing of
/// the log cannot show them; the next `waku run`, or a re-drive, appends
/// them first.
pub fn owed(store: &StateStore, shelf: &Shelf) -> Result<u64, DeadLetterError> {
    Ok(store.outbox()?.iter().filter(|(_, entry)| entry.topic == shelf.dlq).count() as u64)
}

/// Whether this state store owns `partition` of `topic`: it holds a
/// position there, so it consumes it (see the [module documentation](self)).
fn owns(store: &StateStore, topic: &str, partition: u32) -> Result<bool, StateError> {
    Ok(store.position(topic, partition)?.is_some())
}

/// One dead letter of `projection`, with its body.
pub async fn show<L: EventLog>(
    log: &L,
    topic: &str,
    projection: &str,
    store: &StateStore,
    partition: u32,
    offset: u64,
) -> Result<ShownLetter, DeadLetterError> {
    show_on(log, topic, &Shelf::shared(topic, projection), store, partition, offset).await
}

/// One dead letter on `shelf`, as [`show`]: reads that record alone.
pub async fn show_on<L: EventLog>(
    log: &L,
    topic: &str,
    shelf: &Shelf,
    store: &StateStore,
    partition: u32,
    offset: u64,
) -> Result<ShownLetter, DeadLetterError> {
    let not_found = || DeadLetterError::NotFound { projection: shelf.tag.clone(), partition, offset };
    if partition >= log.partitions(&shelf.dlq).await? {
        return Err(not_found());
    }
    let Some(stored) = log.read(&shelf.dlq, partition, offset, 1).await?.into_iter().find(|s| s.offset == offset)
    else {
        return Err(not_found());
    };
    let marks = Marks::read(shelf, store, topic, partition)?;
    let body = stored.record.body;
    match letter_at(shelf, &marks, partition, offset, &stored.record.headers, body.len())? {
        Some(letter) => Ok(ShownLetter { letter, body }),
        None => Err(not_found()),
    }
}

/// Re-drives the selected dead letters of `projection` in the partitions
/// this state store owns: queues each, in dead-letter order, in the retry
/// topic for another attempt, and marks it re-driven, in commits of one
/// [`Slice`] each, appending each slice's records before reading the next.
///
/// A store that owns no partition of the topic, and a partition or record
/// named in `selection` that it does not own, are errors and nothing is
/// re-driven; selected letters of other partitions are left alone and
/// counted ([`Redriven::others`], [`Redriven::left`]). A record asked for by
/// place that cannot be re-driven (its headers are unreadable, or it is an
/// undeliverable emitted message) is an error and nothing is re-driven;
/// unselected by place, such records are left out. One that was re-driven
/// before is counted in [`Redriven::already`] and left alone. An error
/// after the first slice (the log or the state failed) leaves the slices
/// committed before it re-driven, and the rest for the next call.
pub async fn redrive<L: EventLog>(
    log: &L,
    topic: &str,
    projection: &str,
    store: &StateStore,
    selection: &Selection,
) -> Result<Redriven, DeadLetterError> {
    redrive_on(log, topic, projection, &Shelf::shared(topic, projection), store, selection).await
}

/// Re-drives the selected dead letters on `shelf` as [`redrive`], into
/// `projection`'s retry topic `retry_<topic>`, tagged with `projection`.
pub async fn redrive_on<L: EventLog>(
    log: &L,
    topic: &str,
    projection: &str,
    shelf: &Shelf,
    store: &StateStore,
    selection: &Selection,
) -> Result<Redriven, DeadLetterError> {
    redrive_in_slices(log, topic, projection, shelf, store, selection, Slice::default()).await
}

/// [`redrive_on`] in slices of `slice`.
pub async fn redrive_in_slices<L: EventLog>(
    log: &L,
    topic: &str,
    projection: &str,
    shelf: &Shelf,
    store: &StateStore,
    selection: &Selection,
    slice: Slice,
) -> Result<Redriven, DeadLetterError> {
    let partitions = log.partitions(&shelf.dlq).await?;
    let mut owned = Vec::new();
    for partition in 0..partitions {
        if shelf.owned_by(store, topic, partition)? {
            owned.push(partition);
        }
    }
    if owned.is_empty() {
        return Err(DeadLetterError::NothingOwned { projection: projection.to_owned(), topic: topic.to_owned() });
    }
    // What the outbox still owes the log first, so this pass reads every
    // dead letter a listing counts (shown or owed), and leaves none for a
    // second pass.
    outbox::publish(log, store, projection, &RoutedTopics::shared(topic), &owned)
        .await
        .map_err(DeadLetterError::Publish)?;
    let named = checked_named(log, topic, projection, shelf, store, selection, &owned).await?;

    let mut slicer = Slicer {
        log,
        store,
        projection,
        topic,
        dlq: &shelf.dlq,
        slice,
        pending: Vec::new(),
        pending_bytes: 0,
        report: Redriven {
            partitions: owned.iter().copied().filter(|&partition| selection.covers(partition)).collect(),
            ..Redriven::default()
        },
    };
    for partition in (0..partitions).filter(|&partition| selection.covers(partition)) {
        let marks = Marks::read(shelf, store, topic, partition)?;
        if !selection.records.is_empty() {
            // Only the named records, each read alone.
            for &(_, offset) in named.iter().filter(|&&(p, _)| p == partition) {
                let ShownLetter { letter, body } = show_on(log, topic, shelf, store, partition, offset).await?;
                slicer.offer(letter, &marks, selection, || body).await?;
            }
            continue;
        }
        let mut pages = Pages::new(log, &shelf.dlq, partition, 0).await?;
        while let Some(batch) = pages.next_page().await? {
            for view in batch.iter() {
                let Some(letter) = letter_of(shelf, &marks, partition, view)? else { continue };
                slicer.offer(letter, &marks, selection, || view.body().to_vec()).await?;
            }
        }
    }
    slicer.flush().await?;
    Ok(slicer.report)
}

/// The records `selection` names by place, sorted, once each: refused
/// unless each is there, in a partition of `owned` and re-drivable, so
/// that nothing is committed for a selection that cannot be done whole.
async fn checked_named<L: EventLog>(
    log: &L,
    topic: &str,
    projection: &str,
    shelf: &Shelf,
    store: &StateStore,
    selection: &Selection,
    owned: &[u32],
) -> Result<Vec<(u32, u64)>, DeadLetterError> {
    let mut named = selection.records.clone();
    named.sort_unstable();
    named.dedup();
    let mut named_letters = Vec::new();
    // Read one at a time.
    for &(partition, offset) in &named {
        let shown = show_on(log, topic, shelf, store, partition, offset).await.map_err(|error| match error {
            DeadLetterError::NotFound { partition, offset, .. } => {
                DeadLetterError::NotFound { projection: projection.to_owned(), partition, offset }
            }
            error => error,
        })?;
        named_letters.push(shown.letter);
    }
    let mut named_partitions = selection.partitions.iter().chain(named.iter().map(|(partition, _)| partition));
    if let Some(&partition) = named_partitions.find(|partition| !owned.contains(partition)) {
        return Err(DeadLetterError::NotOwned { topic: topic.to_owned(), partition });
    }
    for letter in named_letters.iter().filter(|l| selection.picks(l) && !l.redriven) {
        if let Err(reason) = redrivable(letter) {
            return Err(DeadLetterError::CannotRedrive { partition: letter.partition, offset: letter.offset, reason });
        }
    }
    Ok(named)
}

/// Why `letter` cannot go back through the normal path, if it cannot: only
/// events go back through the projection; an unreadable message needs a
/// corrected one, an undeliverable message its own topic.
fn redrivable(letter: &DeadLetter) -> Result<(), String> {
    let emitted = letter.routed.failure.as_ref().is_some_and(|f| f.class == FailureClass::Undeliverable);
    match &letter.envelope {
        _ if emitted => Err("it is a message a module emitted, not an event of the topic".to_owned()),
        Err(error) => Err(format!("its headers cannot be read ({error}); publish a corrected message instead")),
        Ok(_) => Ok(()),
    }
}

/// A re-drive under way: the letters of the slice being gathered, and what
/// was done so far.
struct Slicer<'a, L> {
    log: &'a L,
    store: &'a StateStore,
    projection: &'a str,
    topic: &'a str,
    dlq: &'a str,
    slice: Slice,
    /// The slice's letters, in dead-letter order, with their bodies.
    pending: Vec<(DeadLetter, Vec<u8>)>,
    pending_bytes: usize,
    report: Redriven,
}

impl<L: EventLog> Slicer<'_, L> {
    /// Counts `letter` or takes it into the slice (its body from `body`),
    /// committing the slice once it is full.
    async fn offer(
        &mut self,
        letter: DeadLetter,
        marks: &Marks,
        selection: &Selection,
        body: impl FnOnce() -> Vec<u8>,
    ) -> Result<(), DeadLetterError> {
        if !selection.picks(&letter) {
            return Ok(());
        }
        if !marks.owned {
            if self.report.others.last() != Some(&letter.partition) {
                self.report.others.push(letter.partition);
            }
            self.report.left += 1;
            return Ok(());
        }
        if letter.redriven {
            self.report.already += 1;
            return Ok(());
        }
        if redrivable(&letter).is_err() {
            return Ok(());
        }
        let body = body();
        self.pending_bytes += body.len();
        self.pending.push((letter, body));
        if self.pending.len() >= self.slice.records || self.pending_bytes >= self.slice.bytes {
            self.flush().await?;
        }
        Ok(())
    }

    /// Queues the slice's letters in the retry topic and marks them
    /// re-driven in one commit, then appends them.
    async fn flush(&mut self) -> Result<(), DeadLetterError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let now = crate::platform::clock::now_ms();
        let retry = retry_topic(self.topic);
        let pending = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        let orderings = routing::rewrite_orderings(0..pending.len());
        let (mut records, mut events) = (0, 0);
        let mut commit = BatchCommit::default();
        for ((letter, body), ordering) in pending.into_iter().zip(orderings) {
            let Ok(envelope) = letter.envelope else { continue };
            let envelope = EventHeaders { ordering, ..envelope };
            let topic = match letter.routed.topic.is_empty() {
                true => self.topic.to_owned(),
                false => letter.routed.topic,
            };
            let routed = Routed {
                projection: self.projection.to_owned(),
                topic,
                attempts: 0,
                failed_at_ms: now,
                ahead_of: None,
                ..letter.routed
            };
            records += 1;
            events += routed.events;
            commit.outbox.push(OutboxEntry {
                topic: retry.clone(),
                partition_key: envelope.key.key_hash(),
                partition: Some(letter.partition),
                record: routing::routed_record(&envelope, &routed, body),
                origin: None,
            });
            commit.done.push((self.dlq.to_owned(), letter.partition, letter.offset));
        }
        commit.stat_deltas = [(Stat::Redriven, events), (Stat::RetryIn, events)].into_iter().collect();
        self.store.commit(commit)?;
        self.report.records += records;
        self.report.events += events;
        outbox::publish(
            self.log,
            self.store,
            self.projection,
            &RoutedTopics::shared(self.topic),
            &self.report.partitions,
        )
        .await
        .map_err(DeadLetterError::Publish)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    use super::*;
    use crate::engine::routing::Failure;
    use crate::event::{Algebra, EventAtomicOrdering, EventTypeTag};
    use crate::storage::log::{self, EmbeddedLog, Record, StoredRecord};

    const TOPIC: &str = "t";
    const PROJECTION: &str = "p";

    /// The embedded log, counting what is read of the dead-letter topic and
    /// failing appends to the retry topic after `retry_appends_allowed`.
    struct Watched {
        log: EmbeddedLog,
        /// Body bytes read from `dlq_t`, in all.
        dlq_bytes: AtomicUsize,
        /// The most body bytes one read of `dlq_t` returned.
        dlq_largest_read: AtomicUsize,
        retry_appends: AtomicUsize,
        retry_appends_allowed: AtomicUsize,
    }

    impl Watched {
        fn new(log: EmbeddedLog) -> Self {
            Self {
                log,
                dlq_bytes: AtomicUsize::new(0),
                dlq_largest_read: AtomicUsize::new(0),
                retry_appends: AtomicUsize::new(0),
                retry_appends_allowed: AtomicUsize::new(usize::MAX),
            }
        }

        fn saw(&self, topic: &str, bytes: usize) {
            if topic == "dlq_t" {
                self.dlq_bytes.fetch_add(bytes, SeqCst);
                self.dlq_largest_read.fetch_max(bytes, SeqCst);
            }
        }

        fn appending(&self, topic: &str) -> Result<(), LogError> {
            if topic == "retry_t" && self.retry_appends.fetch_add(1, SeqCst) >= self.retry_appends_allowed.load(SeqCst)
            {
                return Err(LogError::Unavailable { address: "test".into(), reason: "cut off".into() });
            }
            Ok(())
        }
    }

    impl log::ForwardingLog for Watched {
        type Inner = EmbeddedLog;

        fn inner(&self) -> impl std::ops::Deref<Target = EmbeddedLog> + Send + '_ {
            &self.log
        }

        async fn append(&self, topic: &str, batches: Vec<(u32, Vec<Record>)>) -> Result<(), LogError> {
            self.appending(topic)?;
            self.log.append(topic, batches).await
        }
        async fn append_as(
            &self,
            topic: &str,
            batches: Vec<(u32, Vec<Record>)>,
            producer: &str,
            sequence: u64,
        ) -> Result<bool, LogError> {
            self.appending(topic)?;
            self.log.append_as(topic, batches, producer, sequence).await
        }
        async fn read(
            &self,
            topic: &str,
            partition: u32,
            from: u64,
            max: usize,
        ) -> Result<Vec<StoredRecord>, LogError> {
            let records = self.log.read(topic, partition, from, max).await?;
            self.saw(topic, records.iter().map(|r| r.record.body.len()).sum());
            Ok(records)
        }
        async fn poll(
            &self,
            topic: &str,
            partition: u32,
            from: u64,
            max: usize,
            batch: PolledBatch,
        ) -> Result<PolledBatch, LogError> {
            let batch = self.log.poll(topic, partition, from, max, batch).await?;
            self.saw(topic, batch.iter().map(|view| view.body().len()).sum());
            Ok(batch)
        }
    }

    /// A log whose `dlq_t` partition 0 holds `letters` dead letters of
    /// [`PROJECTION`] with bodies of `body_bytes` each (every third one
    /// another projection's, in between), and a store that owns partition 0.
    async fn shelf_of(dir: &tempfile::TempDir, letters: u64, body_bytes: usize) -> (Watched, StateStore) {
        shelf_written_by(dir, letters, body_bytes, routing::routed_record).await
    }

    /// [`shelf_of`] with the records written by `write`.
    async fn shelf_written_by(
        dir: &tempfile::TempDir,
        letters: u64,
        body_bytes: usize,
        write: fn(&EventHeaders, &Routed, Vec<u8>) -> Record,
    ) -> (Watched, StateStore) {
        let log = Watched::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
        for topic in [TOPIC, "retry_t", "dlq_t"] {
            log.create_topic(topic, 1).await.unwrap();
        }
        for origin in 0..letters {
            let envelope = EventHeaders {
                tag: EventTypeTag::new(1),
                key: Key::int(origin % 5),
                ordering: EventAtomicOrdering::Relaxed,
                algebra: Algebra::NonAssociative,
                event_time: None,
            };
            let failure = Failure {
                class: FailureClass::Unrecoverable,
                message: "broken".into(),
                module: "m".into(),
                version: "v".into(),
            };
            let routed = Routed {
                projection: PROJECTION.into(),
                topic: TOPIC.into(),
                event_type: "e".into(),
                origin_partition: 0,
                origin_offset: origin,
                events: 1,
                attempts: 1,
                failed_at_ms: 1,
                first_failed_at_ms: Some(1),
                failure: Some(failure),
                ahead_of: None,
                ordering: None,
            };
            let mut records = vec![write(&envelope, &routed, vec![b'x'; body_bytes])];
            if origin % 3 == 0 {
                let other = Routed { projection: "other".into(), ..routed };
                records.push(write(&envelope, &other, vec![b'y'; body_bytes]));
            }
            log.append("dlq_t", vec![(0, records)]).await.unwrap();
        }
        let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
        let owned = BatchCommit { positions: vec![(TOPIC.into(), 0, letters)], ..BatchCommit::default() };
        store.commit(owned).unwrap();
        (log, store)
    }

    /// A record as versions before the text context headers wrote it.
    fn old_record(envelope: &EventHeaders, routed: &Routed, body: Vec<u8>) -> Record {
        let mut headers = envelope.to_headers();
        headers.extend(routing::context::legacy_headers(routed));
        Record { headers, body }
    }

    #[tokio::test]
    async fn letters_an_older_version_wrote_still_list_show_and_redrive() {
        let dir = tempfile::tempdir().unwrap();
        let (log, store) = shelf_written_by(&dir, 6, 10, old_record).await;
        let raw = log.log.read("dlq_t", 0, 0, 1).await.unwrap().remove(0).record.headers;
        assert!(raw.iter().any(|h| h.name == "waku-origin-offset" && h.value == 0u64.to_le_bytes()), "{raw:?}");
        assert!(raw.iter().all(|h| !h.name.starts_with("waku.error.")));

        let shelf = Shelf::shared(TOPIC, PROJECTION);
        let listed = list_on(&log, TOPIC, &shelf, &store).await.unwrap();
        assert_eq!(origins(&listed), (0..6).collect::<Vec<_>>());
        let first = &listed[0].routed;
        assert_eq!((first.topic.as_str(), first.first_failed_at_ms), ("", None), "older records had neither");
        assert_eq!(first.failure.as_ref().unwrap().message, "broken");
        let shown = show_on(&log, TOPIC, &shelf, &store, 0, listed[3].offset).await.unwrap();
        assert_eq!((shown.letter.routed.origin_offset, shown.body), (3, vec![b'x'; 10]));

        let done = redrive(&log, TOPIC, PROJECTION, &store, &Selection::default()).await.unwrap();
        assert_eq!((done.records, done.events), (6, 6));
        // Re-driven in the text scheme, naming the topic they came from.
        let retried = log.log.read("retry_t", 0, 0, 100).await.unwrap();
        let headers = &retried[0].record.headers;
        let text = |name: &str| headers.iter().find(|h| h.name == name).map(|h| h.value.clone());
        assert_eq!(text("waku.error.topic"), Some(TOPIC.as_bytes().to_vec()));
        assert_eq!(text("waku.error.offset"), Some(b"0".to_vec()));
        assert_eq!(text("waku-origin-offset"), None);
        let retried: Vec<u64> =
            retried.iter().map(|r| Routed::parse(&r.record.headers).unwrap().origin_offset).collect();
        assert_eq!(retried, (0..6).collect::<Vec<_>>());
        assert!(list_on(&log, TOPIC, &shelf, &store).await.unwrap().iter().all(|l| l.redriven));
    }

    fn origins(letters: &[DeadLetter]) -> Vec<u64> {
        letters.iter().map(|l| l.routed.origin_offset).collect()
    }

    #[tokio::test]
    async fn show_reads_one_record_and_listing_reads_bounded_pages() {
        let dir = tempfile::tempdir().unwrap();
        let body = 256 << 10;
        // 60 letters and 20 of another projection: 20 MiB of bodies.
        let (log, store) = shelf_of(&dir, 60, body).await;
        let shelf = Shelf::shared(TOPIC, PROJECTION);

        // Offset 40 is the letter of event 30 (41 is another projection's).
        let shown = show_on(&log, TOPIC, &shelf, &store, 0, 40).await.unwrap();
        assert_eq!((shown.letter.routed.origin_offset, shown.body.len(), shown.letter.body_bytes), (30, body, body));
        assert_eq!(log.dlq_bytes.load(SeqCst), body, "show reads the one record");
        let missing = show_on(&log, TOPIC, &shelf, &store, 0, 10_000).await.unwrap_err();
        assert!(matches!(missing, DeadLetterError::NotFound { partition: 0, offset: 10_000, .. }), "{missing}");
        let elsewhere = show_on(&log, TOPIC, &shelf, &store, 3, 0).await.unwrap_err();
        assert!(matches!(elsewhere, DeadLetterError::NotFound { partition: 3, .. }), "{elsewhere}");
        // Another projection's letter is not this one's.
        let other = show_on(&log, TOPIC, &shelf, &store, 0, 41).await.unwrap_err();
        assert!(matches!(other, DeadLetterError::NotFound { offset: 41, .. }), "{other}");

        let all = list_on(&log, TOPIC, &shelf, &store).await.unwrap();
        assert_eq!(origins(&all), (0..60).collect::<Vec<_>>());
        assert!(all.iter().all(|l| l.body_bytes == body && l.owned && !l.redriven));
        let largest = log.dlq_largest_read.load(SeqCst);
        assert!(largest <= PAGE_BYTES + body, "one read held {largest} bytes");

        // Page by page, each letter once, in order.
        let (mut after, mut paged) = (None, Vec::new());
        loop {
            let page = list_page_on(&log, TOPIC, &shelf, &store, after, 7).await.unwrap();
            assert!(page.letters.len() <= 7);
            paged.extend(page.letters);
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(paged, all);
        let last = list_page_on(&log, TOPIC, &shelf, &store, Some((0, all[59].offset)), 7).await.unwrap();
        assert_eq!(last, LetterPage::default());
        // A projection whose dead-letter topic was never created has none.
        let never = Shelf::shared("never", PROJECTION);
        assert_eq!(list_page_on(&log, "never", &never, &store, None, 7).await.unwrap(), LetterPage::default());
    }

    #[tokio::test]
    async fn letters_still_in_the_outbox_are_counted_and_one_redrive_takes_them_with_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let (log, store) = shelf_of(&dir, 5, 10).await;
        let shelf = Shelf::shared(TOPIC, PROJECTION);
        // Three letters committed, not appended yet (a stop before the append).
        let listed = list_on(&log, TOPIC, &shelf, &store).await.unwrap();
        let mut owed_letters = BatchCommit::default();
        for letter in listed.iter().take(3) {
            let mut record = log.log.read("dlq_t", 0, letter.offset, 1).await.unwrap().remove(0).record;
            record.body = b"owed".to_vec();
            owed_letters.outbox.push(OutboxEntry {
                topic: "dlq_t".into(),
                partition_key: letter.envelope.as_ref().unwrap().key.key_hash(),
                partition: Some(0),
                record,
                origin: None,
            });
        }
        store.commit(owed_letters).unwrap();
        assert_eq!(owed(&store, &shelf).unwrap(), 3);
        assert_eq!(list_on(&log, TOPIC, &shelf, &store).await.unwrap().len(), 5, "the log holds 5 of them");

        let done = redrive(&log, TOPIC, PROJECTION, &store, &Selection::default()).await.unwrap();
        assert_eq!((done.records, done.already), (8, 0), "one pass re-drives every letter, owed ones too");
        assert_eq!(owed(&store, &shelf).unwrap(), 0);
        let after = list_on(&log, TOPIC, &shelf, &store).await.unwrap();
        assert_eq!(after.len(), 8);
        assert!(after.iter().all(|l| l.redriven), "{after:?}");
    }

    #[tokio::test]
    async fn redrive_commits_slice_by_slice_and_a_second_run_redrives_only_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let (log, store) = shelf_of(&dir, 20, 1000).await;
        let shelf = Shelf::shared(TOPIC, PROJECTION);
        let all = Selection::default();
        let slice = Slice { records: 3, bytes: usize::MAX };

        // The second slice's records cannot be appended: the run stops
        // there, with two slices committed and one of them appended.
        log.retry_appends_allowed.store(1, SeqCst);
        let error = redrive_in_slices(&log, TOPIC, PROJECTION, &shelf, &store, &all, slice).await.unwrap_err();
        assert!(matches!(error, DeadLetterError::Publish(_)), "{error}");
        assert_eq!(log.log.end_offset("retry_t", 0).await.unwrap(), 3, "the first slice is appended");
        let marked = list_on(&log, TOPIC, &shelf, &store).await.unwrap();
        assert_eq!(marked.iter().filter(|l| l.redriven).count(), 6, "two slices are committed");

        // Run again: the rest, none twice; the second slice's records are
        // appended from the outbox.
        log.retry_appends_allowed.store(usize::MAX, SeqCst);
        let done = redrive_in_slices(&log, TOPIC, PROJECTION, &shelf, &store, &all, slice).await.unwrap();
        assert_eq!((done.records, done.events, done.already), (14, 14, 6));
        let retried = log.log.read("retry_t", 0, 0, 100).await.unwrap();
        let retried: Vec<u64> =
            retried.iter().map(|r| Routed::parse(&r.record.headers).unwrap().origin_offset).collect();
        assert_eq!(retried, (0..20).collect::<Vec<_>>(), "each letter once, in dead-letter order");
        assert!(list_on(&log, TOPIC, &shelf, &store).await.unwrap().iter().all(|l| l.redriven));
        assert!(store.outbox().unwrap().is_empty());
        let again = redrive_in_slices(&log, TOPIC, PROJECTION, &shelf, &store, &all, slice).await.unwrap();
        assert_eq!((again.records, again.already), (0, 20));
    }

    #[tokio::test]
    async fn redrive_reads_bounded_pages_and_slices_by_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let body = 256 << 10;
        let (log, store) = shelf_of(&dir, 40, body).await;
        let shelf = Shelf::shared(TOPIC, PROJECTION);
        let slice = Slice { records: 1000, bytes: 4 * body };
        let done =
            redrive_in_slices(&log, TOPIC, PROJECTION, &shelf, &store, &Selection::default(), slice).await.unwrap();
        assert_eq!(done.records, 40);
        let largest = log.dlq_largest_read.load(SeqCst);
        assert!(largest <= PAGE_BYTES + body, "one read held {largest} bytes");
        // Ten slices of four letters, each appended on its own.
        assert!(log.retry_appends.load(SeqCst) >= 10, "{} appends", log.retry_appends.load(SeqCst));

        // By place: the one record named is read, not the topic.
        let fresh = tempfile::tempdir().unwrap();
        let (log, store) = shelf_of(&fresh, 40, body).await;
        let named = Selection { records: vec![(0, 30)], ..Selection::default() };
        let done = redrive_in_slices(&log, TOPIC, PROJECTION, &shelf, &store, &named, slice).await.unwrap();
        assert_eq!(done.records, 1);
        assert!(log.dlq_bytes.load(SeqCst) <= 2 * body, "{} bytes read", log.dlq_bytes.load(SeqCst));
    }
}
