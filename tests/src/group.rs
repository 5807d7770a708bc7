//! Hosts of one projection in an Iggy consumer group, for the scale-out
//! test and benchmark: each as `waku run --group` starts it, killable as a
//! process is.

use std::path::Path;
use std::sync::Arc;

use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::operations::host::{Host, ModuleSource, RunningHost, StateSettings};
use wakuwaku::storage::log::IggyLog;

use crate::{bank_wasm, host_settings};

/// A `waku run` of the projection as the CLI starts it (a consumer group,
/// state in PostgreSQL, its own Iggy connection), on a runtime of its own
/// so that killing it ends its tasks and connections at once, as a dead
/// process's.
pub struct GroupHost {
    runtime: Option<tokio::runtime::Runtime>,
    host: Option<RunningHost<IggyLog>>,
}

impl GroupHost {
    /// Starts a host of `projection` over topic `accounts` of `stream`,
    /// in consumer group `group`, consuming with `config`, its compile
    /// cache in `data`.
    pub fn start(
        url: &str,
        stream: &str,
        postgres: &str,
        names: (&str, &str),
        config: ConsumerConfig,
        data: &Path,
    ) -> Self {
        Self::start_over(url, stream, postgres, names, (&["accounts"], &bank_wasm()), config, data)
    }

    /// [`GroupHost::start`] of the component `wasm` over `topics`
    /// (co-partitioned; the group is the first topic's, and a partition
    /// index it assigns is held across all of them), as `waku run --topic
    /// a --topic b --group G` starts one.
    pub fn start_over(
        url: &str,
        stream: &str,
        postgres: &str,
        (projection, group): (&str, &str),
        (topics, wasm): (&[&str], &Path),
        config: ConsumerConfig,
        data: &Path,
    ) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let mut settings = host_settings(data, projection, topics[0], Vec::new(), config);
        settings.more_topics = topics[1..].iter().map(|topic| (*topic).to_owned()).collect();
        settings.state = StateSettings::Postgres { url: postgres.to_owned() };
        settings.until_caught_up = false;
        settings.group = Some(group.to_owned());
        // Loaded through the compile cache in `data`, as `waku run` loads
        // its modules: only the first host of a shared `data` compiles.
        let sandbox = settings.sandbox().unwrap();
        let module = wakuwaku::engine::projection::load_module_file(&sandbox, wasm).expect("the module loads");
        settings.modules = ModuleSource::Loaded(vec![module]);
        let host = runtime.block_on(async {
            let log = Arc::new(IggyLog::connect(url, stream).await.unwrap());
            Host::start_on(log, settings).await.unwrap()
        });
        Self { runtime: Some(runtime), host: Some(host) }
    }

    /// Events it processed for nothing so far (commits refused by fencing).
    pub fn redone(&self) -> u64 {
        self.host.as_ref().unwrap().progress().redone()
    }

    /// Its caught-up gate: per partition held, the committed position and
    /// what was read past it (the batch in flight).
    pub fn progress(&self) -> Arc<wakuwaku::engine::progress::Progress> {
        self.host.as_ref().unwrap().progress().clone()
    }

    /// The partitions it holds now.
    pub fn held(&self) -> Vec<u32> {
        self.host.as_ref().unwrap().progress().partitions().iter().map(|p| p.partition).collect()
    }

    /// What its release stages show (a projection over several topics):
    /// per partition index held, each topic's input.
    pub fn timing(&self) -> Vec<wakuwaku::engine::consumer::PartitionTiming> {
        self.host.as_ref().unwrap().timing().snapshot()
    }

    /// Ends it abruptly: no batch finished, nothing settled, connection cut.
    pub fn kill(mut self) {
        self.runtime.take().unwrap().shutdown_background();
        drop(self.host.take());
    }

    /// Stops it as `waku run` stops on a signal (its batches in flight
    /// committed, its partitions let go, the group left) and says what it
    /// did.
    pub fn stop(mut self) -> wakuwaku::engine::consumer::Summary {
        let (runtime, host) = (self.runtime.take().unwrap(), self.host.take().unwrap());
        runtime.block_on(host.stop()).unwrap()
    }
}
