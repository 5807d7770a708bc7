//! Metrics in the Prometheus text format, served by the admin endpoint.
//!
//! | metric | labels | what |
//! | --- | --- | --- |
//! | `waku_events_applied_total` | projection, module, event_type | events handed to a handler successfully |
//! | `waku_events_retried_total` | projection, module, event_type | events sent to the retry topic (failed, or behind a failed event of their key) |
//! | `waku_events_dead_lettered_total` | projection, module, event_type | events sent to the dead-letter topic (`event_type="malformed"` for unreadable headers) |
//! | `waku_events_skipped_total` | projection | events whose type no module declares |
//! | `waku_handler_call_seconds` | projection, module | handler call latency (per module: a module may declare 256 event types, and a histogram per type would be 18 series each) |
//! | `waku_traps_total` | projection, module | calls that trapped |
//! | `waku_instances_recycled_total` | projection, module | instances replaced by fresh ones because their linear memory passed its high-water mark ([`crate::sandbox::runtime::high_water_mark`]) |
//! | `waku_partition_lag` | projection, partition | end offset minus committed position, at scrape time |
//! | `waku_module_loads_total` | projection, result (`ok`, `failed`) | module loads, at start-up and by hot reload |
//! | `waku_log_unavailable_total` | projection | times a partition found the log unreachable and backed off |
//! | `waku_log_failovers_total` | projection | times the host moved to another node of its Iggy cluster after its node failed (read from the log at scrape time) |
//! | `waku_messages_undeliverable_total` | projection | emitted messages that could never be delivered and were dead-lettered |
//! | `waku_partitions_fenced_total` | projection | partitions dropped because another host took them (a commit was refused, [`crate::storage::state::StateError::Fenced`]) |
//! | `waku_events_redone_total` | projection | events processed for nothing: their batch's commit was refused because another host took the partition, or done again because the database had forgotten commits (the position check, `StateError::PositionMoved`) (a host moving partitions as the group asks, and stopping gracefully, redoes none; see `Consumer::with_assignment`) |
//! | `waku_partition_takes_failed_total` | projection | attempts to take an assigned partition that failed (log or state store unreachable) and are tried again after a backoff |
//! | `waku_log_truncated_total` | topic, partition | times a partition's end offset was found below the host's position or below an end offset read earlier: the log lost messages it had acknowledged, or the topic was deleted and created again ([`crate::storage::log::loss`]) |
//! | `waku_order_violations_total` | projection | late events of a projection over several topics: read after the clock passed their event time, applied at once, out of event-time order (counted when committed) |
//! | `waku_watermark_lag_ms` | projection, partition | processing time minus the partition index's clock (event time), when it last moved or read |
//! | `waku_held_events`, `waku_held_bytes` | projection, partition | events (and their bytes) waiting for the clock |
//! | `waku_input_clock_ms` | projection, topic, partition | the latest event time read from an input partition |
//! | `waku_input_idle` | projection, topic, partition | 1 when the input partition reached an end offset the log reported (it no longer holds the clock), else 0 |
//! | `waku_timers_pending` | projection | timers waiting for the projection's clock, at scrape time ([`crate::storage::state::StateBackend::timer_summary`]) |
//! | `waku_timer_next_due_ms` | projection | the earliest time among them (absent while there are none), at scrape time |
//! | `waku_timers_fired_total` | projection, module | timers handed to a module's `fire` call that succeeded |
//! | `waku_timers_dead_lettered_total` | projection, module | timers whose `fire` call failed, sent to the dead-letter topic |
//! | `waku_batch_phase_seconds` | projection, phase (`poll`, `decode`, `plan`, `reduce`, `calls`, `commit`, `outbox`) | time per batch in each phase ([`crate::engine::consumer::phase`]); `outbox` is observed once per commit it follows |
//!
//! The consumer tallies what a batch did per event type ([`BatchTally`])
//! and records it once the batch is committed, so the hot path touches no
//! shared metric and the counts never run ahead of the state.
//!
//! Series labelled by module and event type go when their module or type
//! leaves the projection: the first batch recorded with a newer module set
//! removes the series of modules and types it does not declare, so names a
//! stream of hot-loaded modules chose do not pile up.

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::engine::consumer::PhaseTimes;
use crate::engine::projection::ModuleSet;
use crate::event::EventTypeTag;
use crate::storage::stats::Counts;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabels {
    projection: String,
    module: String,
    event_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProjectionLabels {
    projection: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModuleLabels {
    projection: String,
    module: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartitionLabels {
    projection: String,
    partition: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicPartitionLabels {
    topic: String,
    partition: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InputLabels {
    projection: String,
    topic: String,
    partition: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    projection: String,
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LoadLabels {
    projection: String,
    result: &'static str,
}

fn latency_histogram() -> Histogram {
    // 10 µs to about 5 s.
    Histogram::new(exponential_buckets(1e-5, 2.5, 15))
}

/// Every metric of the host, registered once.
pub struct Metrics {
    registry: Registry,
    applied: Family<TypeLabels, Counter>,
    retried: Family<TypeLabels, Counter>,
    dead_lettered: Family<TypeLabels, Counter>,
    skipped: Family<ProjectionLabels, Counter>,
    calls: Family<ModuleLabels, Histogram, fn() -> Histogram>,
    traps: Family<ModuleLabels, Counter>,
    recycled: Family<ModuleLabels, Counter>,
    lag: Family<PartitionLabels, Gauge>,
    loads: Family<LoadLabels, Counter>,
    unavailable: Family<ProjectionLabels, Counter>,
    failovers: Family<ProjectionLabels, Counter>,
    undeliverable: Family<ProjectionLabels, Counter>,
    fenced: Family<ProjectionLabels, Counter>,
    redone: Family<ProjectionLabels, Counter>,
    take_failed: Family<ProjectionLabels, Counter>,
    truncated: Family<TopicPartitionLabels, Counter>,
    phases: Family<PhaseLabels, Histogram, fn() -> Histogram>,
    order_violations: Family<ProjectionLabels, Counter>,
    watermark_lag: Family<PartitionLabels, Gauge>,
    held_events: Family<PartitionLabels, Gauge>,
    held_bytes: Family<PartitionLabels, Gauge>,
    input_clock: Family<InputLabels, Gauge>,
    input_idle: Family<InputLabels, Gauge>,
    timers_pending: Family<ProjectionLabels, Gauge>,
    timer_next_due: Family<ProjectionLabels, Gauge>,
    timers_fired: Family<ModuleLabels, Counter>,
    timers_dead_lettered: Family<ModuleLabels, Counter>,
    /// Per projection, the series labelled by module and type, and the
    /// newest module set recorded.
    by_module: Mutex<FxHashMap<String, ModuleSeries>>,
}

/// A projection's series labelled by module (and type).
#[derive(Default)]
struct ModuleSeries {
    /// [`ModuleSet::sequence`] of the newest set recorded.
    newest: u64,
    /// Whether a batch of an older set recorded series since the newest
    /// set pruned them.
    stale: bool,
    types: FxHashSet<TypeLabels>,
    /// The modules whose timers were counted.
    timer_modules: FxHashSet<ModuleLabels>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    // Every metric registered with its name and help, one after another:
    // long, and flat on purpose, so each name is found where it is made.
    fn default() -> Self {
        let mut registry = Registry::default();
        let metrics = Self {
            applied: Family::default(),
            retried: Family::default(),
            dead_lettered: Family::default(),
            skipped: Family::default(),
            calls: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            traps: Family::default(),
            recycled: Family::default(),
            lag: Family::default(),
            loads: Family::default(),
            unavailable: Family::default(),
            failovers: Family::default(),
            undeliverable: Family::default(),
            fenced: Family::default(),
            redone: Family::default(),
            take_failed: Family::default(),
            truncated: Family::default(),
            phases: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            order_violations: Family::default(),
            watermark_lag: Family::default(),
            held_events: Family::default(),
            held_bytes: Family::default(),
            input_clock: Family::default(),
            input_idle: Family::default(),
            timers_pending: Family::default(),
            timer_next_due: Family::default(),
            timers_fired: Family::default(),
            timers_dead_lettered: Family::default(),
            registry: Registry::default(),
            by_module: Mutex::default(),
        };
        registry.register("waku_events_applied", "Events handed to a handler successfully", metrics.applied.clone());
        registry.register("waku_events_retried", "Events sent to the retry topic", metrics.retried.clone());
        registry.register(
            "waku_events_dead_lettered",
            "Events sent to the dead-letter topic",
            metrics.dead_lettered.clone(),
        );
        registry.register("waku_events_skipped", "Events whose type no module declares", metrics.skipped.clone());
        registry.register("waku_handler_call_seconds", "Handler call latency", metrics.calls.clone());
        registry.register("waku_traps", "Handler calls that trapped", metrics.traps.clone());
        registry.register(
            "waku_instances_recycled",
            "Instances replaced because their memory passed its high-water mark",
            metrics.recycled.clone(),
        );
        registry.register("waku_partition_lag", "End offset minus committed position", metrics.lag.clone());
        registry.register("waku_timers_pending", "Timers waiting for the clock", metrics.timers_pending.clone());
        registry.register(
            "waku_timer_next_due_ms",
            "The earliest time among the pending timers, ms since the epoch",
            metrics.timer_next_due.clone(),
        );
        registry.register(
            "waku_timers_fired",
            "Timers handed to a module's fire call that succeeded",
            metrics.timers_fired.clone(),
        );
        registry.register(
            "waku_timers_dead_lettered",
            "Timers whose fire call failed, sent to the dead-letter topic",
            metrics.timers_dead_lettered.clone(),
        );
        registry.register("waku_module_loads", "Module loads by result", metrics.loads.clone());
        registry.register("waku_log_unavailable", "Times the log was unreachable", metrics.unavailable.clone());
        registry.register(
            "waku_log_failovers",
            "Times the host moved to another node of its log cluster",
            metrics.failovers.clone(),
        );
        registry.register(
            "waku_messages_undeliverable",
            "Emitted messages dead-lettered because they could never be delivered",
            metrics.undeliverable.clone(),
        );
        registry.register(
            "waku_partitions_fenced",
            "Partitions dropped because another host took them",
            metrics.fenced.clone(),
        );
        registry.register(
            "waku_events_redone",
            "Events processed for nothing: their batch's commit was refused because another host took the partition",
            metrics.redone.clone(),
        );
        registry.register(
            "waku_partition_takes_failed",
            "Attempts to take an assigned partition that failed and will be tried again",
            metrics.take_failed.clone(),
        );
        registry.register(
            "waku_log_truncated",
            "Times a partition's end offset went back: the log lost acknowledged messages or the topic was created again",
            metrics.truncated.clone(),
        );
        registry.register("waku_batch_phase_seconds", "Time per batch in each phase", metrics.phases.clone());
        registry.register(
            "waku_order_violations",
            "Late events: read after the clock passed their event time, applied at once out of event-time order",
            metrics.order_violations.clone(),
        );
        registry.register(
            "waku_watermark_lag_ms",
            "Processing time minus the clock of a partition index, in ms",
            metrics.watermark_lag.clone(),
        );
        registry.register("waku_held_events", "Events waiting for the clock", metrics.held_events.clone());
        registry.register("waku_held_bytes", "Bytes of the events waiting for the clock", metrics.held_bytes.clone());
        registry.register(
            "waku_input_clock_ms",
            "The latest event time read from an input partition, in ms since the epoch",
            metrics.input_clock.clone(),
        );
        registry.register(
            "waku_input_idle",
            "1 when an input partition reached an end offset the log reported, else 0",
            metrics.input_idle.clone(),
        );
        Self { registry, ..metrics }
    }
}

impl Metrics {
    /// Everything, in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }

    /// Records what one committed batch did: its per-type tally, and the
    /// events it skipped and the messages it could not read.
    pub fn record(&self, projection: &str, modules: &ModuleSet, tally: &BatchTally, skipped: u64, malformed: u64) {
        let mut by_module = self.by_module.lock().unwrap_or_else(|e| e.into_inner());
        let series = by_module.entry(projection.to_owned()).or_default();
        if modules.sequence() > series.newest || (modules.sequence() == series.newest && series.stale) {
            self.forget_undeclared(series, modules);
            series.newest = modules.sequence();
        } else if modules.sequence() < series.newest && !tally.types.is_empty() {
            series.stale = true;
        }
        for (&(module, tag), counts) in &tally.types {
            let (module_name, event_type) = match modules.modules().get(module) {
                Some(m) => (
                    m.name().to_owned(),
                    m.event_types().iter().find(|t| t.tag == tag).map_or_else(|| tag.to_string(), |t| t.name.clone()),
                ),
                None => (String::new(), tag.to_string()),
            };
            let labels = TypeLabels { projection: projection.to_owned(), module: module_name.clone(), event_type };
            series.types.insert(labels.clone());
            let statistics = [
                (&self.applied, counts.counts.applied),
                (&self.retried, counts.counts.retry_in),
                (&self.dead_lettered, counts.counts.dead_lettered),
            ];
            for (family, count) in statistics.into_iter().filter(|(_, count)| *count > 0) {
                family.get_or_create(&labels).inc_by(count);
            }
            let labels = ModuleLabels { projection: projection.to_owned(), module: module_name };
            if !counts.call_times.is_empty() {
                let histogram = self.calls.get_or_create(&labels);
                counts.call_times.iter().for_each(|t| histogram.observe(t.as_secs_f64()));
            }
            if counts.traps > 0 {
                self.traps.get_or_create(&labels).inc_by(counts.traps);
            }
        }
        for (&module, timers) in &tally.timers {
            let module_name = modules.modules().get(module).map_or_else(String::new, |m| m.name().to_owned());
            let labels = ModuleLabels { projection: projection.to_owned(), module: module_name };
            series.timer_modules.insert(labels.clone());
            if timers.fired > 0 {
                self.timers_fired.get_or_create(&labels).inc_by(timers.fired);
            }
            if timers.dead_lettered > 0 {
                self.timers_dead_lettered.get_or_create(&labels).inc_by(timers.dead_lettered);
            }
        }
        for module in modules.modules() {
            let recycled = module.take_instances_recycled();
            if recycled > 0 {
                let labels = ModuleLabels { projection: projection.to_owned(), module: module.name().to_owned() };
                self.recycled.get_or_create(&labels).inc_by(recycled);
            }
        }
        if skipped > 0 {
            self.skipped.get_or_create(&ProjectionLabels { projection: projection.to_owned() }).inc_by(skipped);
        }
        if malformed > 0 {
            let labels =
                TypeLabels { projection: projection.to_owned(), module: String::new(), event_type: "malformed".into() };
            self.dead_lettered.get_or_create(&labels).inc_by(malformed);
        }
    }

    /// Removes the series of `series` whose module or type `modules` does
    /// not declare.
    fn forget_undeclared(&self, series: &mut ModuleSeries, modules: &ModuleSet) {
        let declared = |labels: &TypeLabels| {
            modules.modules().iter().any(|module| {
                module.name() == labels.module && module.event_types().iter().any(|t| t.name == labels.event_type)
            })
        };
        series.types.retain(|labels| {
            if declared(labels) {
                return true;
            }
            self.applied.remove(labels);
            self.retried.remove(labels);
            self.dead_lettered.remove(labels);
            if !modules.modules().iter().any(|module| module.name() == labels.module) {
                let module = ModuleLabels { projection: labels.projection.clone(), module: labels.module.clone() };
                self.calls.remove(&module);
                self.traps.remove(&module);
                self.recycled.remove(&module);
            }
            false
        });
        series.timer_modules.retain(|labels| {
            if modules.modules().iter().any(|module| module.name() == labels.module) {
                return true;
            }
            self.timers_fired.remove(labels);
            self.timers_dead_lettered.remove(labels);
            false
        });
        series.stale = false;
    }

    /// The instances of `module` replaced at their memory's high-water mark
    /// so far, as `waku_instances_recycled_total` counts them.
    pub fn instances_recycled(&self, projection: &str, module: &str) -> u64 {
        let labels = ModuleLabels { projection: projection.to_owned(), module: module.to_owned() };
        self.recycled.get(&labels).map_or(0, |counter| counter.get())
    }

    /// Observes the phases a batch (or the outbox step after its commit)
    /// spent time in; phases it did not go through are left alone.
    pub fn batch_phases(&self, projection: &str, phases: &PhaseTimes) {
        for (phase, time) in phases.iter() {
            let labels = PhaseLabels { projection: projection.to_owned(), phase: phase.name() };
            self.phases.get_or_create(&labels).observe(time.as_secs_f64());
        }
    }

    /// Sets a partition's lag.
    pub fn set_lag(&self, projection: &str, partition: u32, lag: u64) {
        let labels = PartitionLabels { projection: projection.to_owned(), partition };
        self.lag.get_or_create(&labels).set(i64::try_from(lag).unwrap_or(i64::MAX));
    }

    /// Sets a projection's pending timers and the earliest of their times
    /// (none: the series goes).
    pub fn set_timers(&self, projection: &str, pending: u64, next_due: Option<i64>) {
        let labels = ProjectionLabels { projection: projection.to_owned() };
        self.timers_pending.get_or_create(&labels).set(i64::try_from(pending).unwrap_or(i64::MAX));
        match next_due {
            Some(at) => {
                self.timer_next_due.get_or_create(&labels).set(at);
            }
            None => {
                self.timer_next_due.remove(&labels);
            }
        }
    }

    /// Counts a time the log could not be reached.
    pub fn log_unavailable(&self, projection: &str) {
        self.unavailable.get_or_create(&ProjectionLabels { projection: projection.to_owned() }).inc();
    }

    /// Shows the log's failovers so far ([`crate::storage::log::EventLog::failovers`]).
    pub fn set_failovers(&self, projection: &str, failovers: u64) {
        let counter = self.failovers.get_or_create(&ProjectionLabels { projection: projection.to_owned() });
        counter.inc_by(failovers.saturating_sub(counter.get()));
    }

    /// Counts emitted messages dead-lettered as undeliverable.
    pub fn undeliverable(&self, projection: &str, messages: u64) {
        self.undeliverable.get_or_create(&ProjectionLabels { projection: projection.to_owned() }).inc_by(messages);
    }

    /// Counts a partition dropped because another host took it.
    pub fn partition_fenced(&self, projection: &str) {
        self.fenced.get_or_create(&ProjectionLabels { projection: projection.to_owned() }).inc();
    }

    /// Counts `events` processed for nothing (their batch's commit was
    /// refused by fencing).
    pub fn events_redone(&self, projection: &str, events: u64) {
        self.redone.get_or_create(&ProjectionLabels { projection: projection.to_owned() }).inc_by(events);
    }

    /// Counts a failed attempt to take an assigned partition (it is tried
    /// again after a backoff).
    pub fn partition_take_failed(&self, projection: &str) {
        self.take_failed.get_or_create(&ProjectionLabels { projection: projection.to_owned() }).inc();
    }

    /// Counts a partition found to have lost its tail ([`crate::storage::log::loss::Truncation`]).
    pub fn log_truncated(&self, topic: &str, partition: u32) {
        self.truncated.get_or_create(&TopicPartitionLabels { topic: topic.to_owned(), partition }).inc();
    }

    /// Counts late events a committed batch applied.
    pub fn order_violations(&self, projection: &str, events: u64) {
        self.order_violations.get_or_create(&ProjectionLabels { projection: projection.to_owned() }).inc_by(events);
    }

    /// Shows a partition index's release stage: its clock's lag, what it
    /// holds, and each input's clock and idleness.
    pub fn event_time(&self, projection: &str, timing: &crate::engine::consumer::PartitionTiming) {
        let labels = PartitionLabels { projection: projection.to_owned(), partition: timing.partition };
        if let Some(lag) = timing.watermark_lag_ms {
            self.watermark_lag.get_or_create(&labels).set(lag);
        }
        self.held_events.get_or_create(&labels).set(i64::try_from(timing.held_events).unwrap_or(i64::MAX));
        self.held_bytes.get_or_create(&labels).set(i64::try_from(timing.held_bytes).unwrap_or(i64::MAX));
        for input in &timing.inputs {
            let labels = InputLabels {
                projection: projection.to_owned(),
                topic: input.topic.clone(),
                partition: timing.partition,
            };
            if let Some(clock) = input.clock_ms {
                self.input_clock.get_or_create(&labels).set(clock);
            }
            self.input_idle.get_or_create(&labels).set(i64::from(input.idle));
        }
    }

    /// Counts a module load.
    pub fn module_loaded(&self, projection: &str, ok: bool) {
        let labels = LoadLabels { projection: projection.to_owned(), result: if ok { "ok" } else { "failed" } };
        self.loads.get_or_create(&labels).inc();
    }
}

/// What a batch did, per (module index in its [`ModuleSet`], event type),
/// and the timers it fired per module.
#[derive(Debug, Default)]
pub struct BatchTally {
    /// Per module and type.
    pub types: FxHashMap<(usize, EventTypeTag), TypeTally>,
    /// Per module: the timers its `fire` calls were handed.
    pub timers: FxHashMap<usize, TimerTally>,
}

/// The timers a batch handed one module's `fire` calls.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TimerTally {
    /// In calls that succeeded.
    pub fired: u64,
    /// In calls that failed (their timers dead-lettered).
    pub dead_lettered: u64,
}

impl BatchTally {
    /// The tally of one module's event type.
    pub fn of(&mut self, module: usize, tag: EventTypeTag) -> &mut TypeTally {
        self.types.entry((module, tag)).or_default()
    }

    /// Adds `other` in.
    pub fn absorb(&mut self, other: BatchTally) {
        for (key, counts) in other.types {
            let mine = self.types.entry(key).or_default();
            mine.counts.absorb(&counts.counts);
            mine.traps += counts.traps;
            mine.call_times.extend(counts.call_times);
        }
        for (module, timers) in other.timers {
            let mine = self.timers.entry(module).or_default();
            mine.fired += timers.fired;
            mine.dead_lettered += timers.dead_lettered;
        }
    }
}

/// What a batch did to one event type of one module.
#[derive(Debug, Default)]
pub struct TypeTally {
    /// Its statistics: events applied, sent to retry (`retry_in`) and
    /// dead-lettered; the others stay 0.
    pub counts: Counts,
    /// Calls that trapped.
    pub traps: u64,
    /// How long each call took.
    pub call_times: Vec<Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::consumer::Phase;

    #[test]
    fn the_text_format_names_every_metric_with_its_labels() {
        let metrics = Metrics::default();
        let modules = ModuleSet::new("bank", "accounts", Vec::new()).unwrap();
        let mut tally = BatchTally::default();
        let counts = tally.of(0, EventTypeTag::new(3));
        counts.counts.applied = 5;
        counts.call_times.push(Duration::from_millis(3));
        tally.timers.insert(0, TimerTally { fired: 4, dead_lettered: 1 });
        metrics.record("bank", &modules, &tally, 2, 1);
        metrics.set_lag("bank", 1, 42);
        metrics.set_timers("bank", 3, Some(1_796_212_800_000));
        metrics.module_loaded("bank", true);
        let mut phases = PhaseTimes::default();
        phases.add(Phase::Commit, Duration::from_millis(2));
        metrics.batch_phases("bank", &phases);
        let text = metrics.encode();
        for line in [
            r#"waku_events_applied_total{projection="bank",module="",event_type="3"} 5"#,
            r#"waku_events_skipped_total{projection="bank"} 2"#,
            r#"waku_events_dead_lettered_total{projection="bank",module="",event_type="malformed"} 1"#,
            r#"waku_handler_call_seconds_count{projection="bank",module=""} 1"#,
            r#"waku_partition_lag{projection="bank",partition="1"} 42"#,
            r#"waku_timers_pending{projection="bank"} 3"#,
            r#"waku_timer_next_due_ms{projection="bank"} 1796212800000"#,
            r#"waku_timers_fired_total{projection="bank",module=""} 4"#,
            r#"waku_timers_dead_lettered_total{projection="bank",module=""} 1"#,
            r#"waku_module_loads_total{projection="bank",result="ok"} 1"#,
            r#"waku_batch_phase_seconds_count{projection="bank",phase="commit"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(!text.contains(r#"phase="poll""#), "a phase the batch did not go through is observed:\n{text}");
        metrics.set_timers("bank", 0, None);
        let text = metrics.encode();
        assert!(text.contains(r#"waku_timers_pending{projection="bank"} 0"#), "{text}");
        assert!(!text.contains("waku_timer_next_due_ms{"), "no next due time without timers:\n{text}");
    }

    /// A module that declares one type, is never called, and says it
    /// replaced 2 instances.
    struct Named(String, Vec<crate::sandbox::handler::EventType>);

    impl crate::sandbox::handler::HandlerModule for Named {
        fn name(&self) -> &str {
            &self.0
        }
        fn version(&self) -> &str {
            "1"
        }
        fn event_types(&self) -> &[crate::sandbox::handler::EventType] {
            &self.1
        }
        fn instantiate(
            &self,
        ) -> Result<Box<dyn crate::sandbox::handler::HandlerInstance>, crate::sandbox::handler::CallError> {
            unreachable!("never called")
        }
        fn take_instances_recycled(&self) -> u64 {
            2
        }
    }

    fn set_of(name: &str, type_name: &str) -> ModuleSet {
        let event_type = crate::sandbox::handler::EventType {
            tag: EventTypeTag::new(1),
            name: type_name.to_owned(),
            algebra: crate::event::Algebra::NonAssociative,
            max_batch: 1,
            timing: crate::event::EventTiming::Untimed,
        };
        ModuleSet::new("bank", "accounts", vec![std::sync::Arc::new(Named(name.to_owned(), vec![event_type]))]).unwrap()
    }

    fn applied_and_trapped() -> BatchTally {
        let mut tally = BatchTally::default();
        let counts = tally.of(0, EventTypeTag::new(1));
        counts.counts.applied = 1;
        counts.traps = 1;
        counts.call_times.push(std::time::Duration::from_millis(1));
        tally.timers.insert(0, TimerTally { fired: 1, dead_lettered: 0 });
        tally
    }

    #[test]
    fn the_series_of_a_module_that_left_go_with_it() {
        let metrics = Metrics::default();
        let old = set_of("m0001", "Visited");
        let new = set_of("m0002", "Visited");
        let applied = |module: &str| {
            format!(r#"waku_events_applied_total{{projection="bank",module="{module}",event_type="Visited"}} 1"#)
        };
        let trapped = |module: &str| format!(r#"waku_traps_total{{projection="bank",module="{module}"}} 1"#);
        metrics.record("bank", &old, &applied_and_trapped(), 0, 0);
        assert!(metrics.encode().contains(&applied("m0001")));
        metrics.record("bank", &new, &applied_and_trapped(), 0, 0);
        let text = metrics.encode();
        assert!(text.contains(&applied("m0002")) && text.contains(&trapped("m0002")), "{text}");
        assert!(text.contains(r#"waku_timers_fired_total{projection="bank",module="m0002"} 1"#), "{text}");
        assert!(text.contains(r#"waku_handler_call_seconds_count{projection="bank",module="m0002"} 1"#), "{text}");
        assert!(text.contains(r#"waku_instances_recycled_total{projection="bank",module="m0002"} 2"#), "{text}");
        assert_eq!(metrics.instances_recycled("bank", "m0002"), 2);
        assert!(!text.contains("m0001"), "the series of a module that left stay:\n{text}");
        // A batch of the old set that ends late records its series again;
        // the next batch of the new set removes them, and keeps its own.
        metrics.record("bank", &old, &applied_and_trapped(), 0, 0);
        assert!(metrics.encode().contains("m0001"));
        metrics.record("bank", &new, &BatchTally::default(), 0, 0);
        let text = metrics.encode();
        assert!(!text.contains("m0001") && text.contains(&applied("m0002")), "{text}");
    }
}
