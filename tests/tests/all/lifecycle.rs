//! Module lifecycle: versions recorded with the state and run again after a
//! restart, rollback, the compile cache, and hot reload from a watched
//! directory, including 100 swaps under load that lose nothing.

use std::path::Path;

use sha2::Digest;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use wakuwaku::authoring::demo::{self, WorkloadSpec};
use wakuwaku::authoring::publish;
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::engine::projection::{Projection, load_module_file};
use wakuwaku::operations::host::{Host, HostSettings, ModuleSource};
use wakuwaku::operations::lifecycle::{Difference, EmitTopics, KEPT_VERSIONS, Library, LifecycleError, Reloader};
use wakuwaku::sandbox::handler::HandlerModule;
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits, WasmModule, content_version};
use wakuwaku::storage::log::EventLog;
use wakuwaku::storage::state::StateStore;
use wakuwaku::storage::stats::Stat;
use wakuwaku_tests::{
    Recorder, bank_fee_wasm, bank_log, bank_variant, bank_wasm, check_call_order, probe_wasm, read_partition,
};

/// Writes a file whole, through a rename, as a deployment tool would.
fn install(dir: &Path, name: &str, bytes: &[u8]) {
    let temporary = dir.join(format!(".{name}.tmp"));
    std::fs::write(&temporary, bytes).unwrap();
    std::fs::rename(temporary, dir.join(name)).unwrap();
}

fn sandbox() -> Sandbox {
    Sandbox::new(SandboxLimits::default()).unwrap()
}

struct Dirs {
    root: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("modules")).unwrap();
        Self { root }
    }
    fn modules(&self) -> std::path::PathBuf {
        self.root.path().join("modules")
    }
    fn library(&self) -> Library {
        let store = StateStore::open(&self.root.path().join("bank.redb")).unwrap();
        Library::new(self.root.path(), "bank", store, sandbox().with_compile_cache(&self.root.path().join("cache")))
    }
    /// The bank (version 0) running from the module directory.
    fn started(&self) -> (Library, Arc<Projection>) {
        install(&self.modules(), "bank.wasm", &bank_variant(0));
        let library = self.library();
        let projection = self.projection(&library);
        (library, projection)
    }
    /// The bank (version 0) running from a watched module directory.
    fn watched(&self) -> (Arc<Library>, Arc<Projection>, Reloader) {
        let (library, projection) = self.started();
        let library = Arc::new(library);
        let reloader = Reloader::watch(library.clone(), projection.clone(), &self.modules()).unwrap();
        (library, projection, reloader)
    }
    /// The bank projection running what `library` starts from the module
    /// directory.
    fn projection(&self, library: &Library) -> Arc<Projection> {
        let (modules, _) = library.start(&self.modules(), false).unwrap();
        let store = StateStore::open(&self.root.path().join("bank-state.redb")).unwrap();
        Arc::new(Projection::new("bank", "accounts", modules, store).unwrap())
    }
}

fn versions(modules: &[Arc<dyn HandlerModule>]) -> Vec<(String, String)> {
    modules.iter().map(|m| (m.name().to_owned(), m.version().to_owned())).collect()
}

#[test]
fn a_restart_runs_the_recorded_versions_and_reports_what_the_directory_changed() {
    let dirs = Dirs::new();
    let (v0, v1) = (bank_variant(0), bank_variant(1));
    let (h0, h1) = (content_version(&v0), content_version(&v1));
    install(&dirs.modules(), "bank.wasm", &v0);
    let (modules, differences) = dirs.library().start(&dirs.modules(), false).unwrap();
    assert_eq!(versions(&modules), [("bank".to_owned(), h0.clone())]);
    assert!(differences.is_empty());

    // Changed while down: the recorded version still runs, and it is said.
    install(&dirs.modules(), "bank.wasm", &v1);
    let (modules, differences) = dirs.library().start(&dirs.modules(), false).unwrap();
    assert_eq!(versions(&modules), [("bank".to_owned(), h0.clone())]);
    assert_eq!(
        differences,
        [Difference::Changed { module: "bank".into(), running: h0.clone(), in_directory: h1.clone() }]
    );
    assert!(differences[0].to_string().contains("--adopt-modules"));

    // Adopting takes the directory's version and records it.
    let (modules, differences) = dirs.library().start(&dirs.modules(), true).unwrap();
    assert_eq!(versions(&modules), [("bank".to_owned(), h1.clone())]);
    assert_eq!(differences, [Difference::Adopted { module: "bank".into(), from: Some(h0.clone()), to: h1.clone() }]);

    // Removed while down: the recorded version runs from its kept copy.
    std::fs::remove_file(dirs.modules().join("bank.wasm")).unwrap();
    let (modules, differences) = dirs.library().start(&dirs.modules(), false).unwrap();
    assert_eq!(versions(&modules), [("bank".to_owned(), h1.clone())]);
    assert_eq!(differences, [Difference::Missing { module: "bank".into(), running: h1.clone() }]);

    // Rollback returns to the version before; the next start runs it.
    let library = dirs.library();
    assert_eq!(library.rollback("bank", None).unwrap(), (h1.clone(), h0.clone()));
    let (modules, _) = library.start(&dirs.modules(), false).unwrap();
    assert_eq!(versions(&modules), [("bank".to_owned(), h0.clone())]);
    // … and forward again, by a prefix of the version.
    assert_eq!(library.rollback("bank", Some(&h1[..6])).unwrap(), (h0.clone(), h1.clone()));
    let error = library.rollback("bank", Some("ffff")).unwrap_err();
    assert!(matches!(error, LifecycleError::UnknownVersion { .. }), "{error}");
    let error = library.rollback("ledger", None).unwrap_err();
    assert_eq!(error.to_string(), "projection `bank` has no module `ledger` (it has: bank)");
}

/// A bad file dropped in while the host ran (refused by the hot reload)
/// must not keep the projection down after a crash: at a restart, a file
/// the record does not know that does not load, or whose tags clash, is
/// refused alone and the rest starts. At the first start every file must
/// load.
#[test]
fn a_restart_refuses_a_new_file_that_does_not_load_alone() {
    let dirs = Dirs::new();
    install(&dirs.modules(), "junk.wasm", b"not a component");
    install(&dirs.modules(), "bank.wasm", &bank_variant(0));
    let error = dirs.library().start(&dirs.modules(), false).err().expect("the first start loads every file");
    assert!(
        error
            .to_string()
            .contains("not a valid WebAssembly component: component-header: this is not a WebAssembly component"),
        "{error}"
    );
    std::fs::remove_file(dirs.modules().join("junk.wasm")).unwrap();
    dirs.library().start(&dirs.modules(), false).unwrap();

    install(&dirs.modules(), "junk.wasm", b"not a component");
    install(&dirs.modules(), "a-twin.wasm", &bank_variant(2)); // the bank's tags, and loaded first
    let library = dirs.library();
    let (modules, differences) = library.start(&dirs.modules(), false).unwrap();
    assert_eq!(versions(&modules), [("bank".to_owned(), content_version(&bank_variant(0)))]);
    let refused: Vec<&str> = differences
        .iter()
        .map(|difference| match difference {
            Difference::Refused { module, .. } => module.as_str(),
            other => panic!("{other}"),
        })
        .collect();
    assert_eq!(refused, ["a-twin", "junk"]);
    assert!(differences[0].to_string().contains("is declared by both `bank` and `a-twin`"), "{}", differences[0]);
    assert!(library.reloads()["junk"].error.is_some());
    assert!(!library.recorded().unwrap().active.contains_key("a-twin"), "a refused file is not recorded");
}

#[test]
fn only_the_last_versions_are_kept() {
    let dirs = Dirs::new();
    let library = dirs.library();
    for n in 0..(KEPT_VERSIONS as u8 + 2) {
        install(&dirs.modules(), "bank.wasm", &bank_variant(n));
        library.start(&dirs.modules(), true).unwrap();
    }
    let recorded = library.recorded().unwrap();
    let kept = &recorded.kept["bank"];
    assert_eq!(kept.len(), KEPT_VERSIONS);
    assert_eq!(kept[0], content_version(&bank_variant(KEPT_VERSIONS as u8 + 1)));
    let copies = std::fs::read_dir(dirs.root.path().join("modules/bank/bank")).unwrap().count();
    assert_eq!(copies, KEPT_VERSIONS, "copies of forgotten versions are deleted");
}

/// Each store's record keeps its copies apart (a rebuild's shadow in its
/// own directory): a store that forgets a version deletes its own copy,
/// never the one another store's record still names.
#[test]
fn a_store_forgetting_a_version_never_deletes_the_copy_another_stores_record_names() {
    let dirs = Dirs::new();
    let (v0, h0) = (bank_variant(0), content_version(&bank_variant(0)));
    install(&dirs.modules(), "bank.wasm", &v0);
    let live = dirs.library();
    live.start(&dirs.modules(), true).unwrap();
    let shadow_store = StateStore::open(&dirs.root.path().join("shadow.redb")).unwrap();
    let copies = Path::new("rebuilds/bank/1/kept");
    let shadow = Library::new(dirs.root.path(), "bank", shadow_store.clone(), sandbox()).with_copies_in(copies.into());
    shadow.start(&dirs.modules(), true).unwrap();
    assert_eq!(shadow.recorded().unwrap().copies.as_deref(), Some(copies));

    // The live store moves past KEPT_VERSIONS other versions: it forgets
    // version 0 and deletes its copy of it.
    for n in 1..=KEPT_VERSIONS as u8 {
        install(&dirs.modules(), "bank.wasm", &bank_variant(n));
        live.start(&dirs.modules(), true).unwrap();
    }
    assert!(!dirs.root.path().join(format!("modules/bank/bank/{h0}.wasm")).exists());
    // The shadow's record still names version 0, and a restart on it runs
    // it from the shadow's own copy.
    let (modules, _) = shadow.start(&dirs.modules(), false).unwrap();
    assert_eq!(versions(&modules), [("bank".to_owned(), h0)]);

    // A record naming a copies directory outside the data directory is
    // refused, never read from or written to.
    for outside in ["../elsewhere", "/tmp/elsewhere", ""] {
        let record = serde_json::json!({ "active": {}, "kept": {}, "copies": outside });
        shadow_store.set_meta("modules", record.to_string().as_bytes()).unwrap();
        let error = shadow.recorded().unwrap_err();
        assert!(matches!(error, LifecycleError::Corrupt(_)), "{outside}: {error}");
        assert!(shadow.start(&dirs.modules(), false).is_err(), "{outside}");
    }
}

/// A new version is recorded before it runs: one that cannot be recorded
/// (its kept copy cannot be written) is refused, and the old one keeps
/// running, so what runs and what a restart would run never differ.
#[test]
fn a_version_that_cannot_be_recorded_is_not_swapped_in() {
    let dirs = Dirs::new();
    let (v0, v1) = (bank_variant(0), bank_variant(1));
    install(&dirs.modules(), "bank.wasm", &v0);
    let library = dirs.library();
    let projection = dirs.projection(&library);
    // A file where the kept copies go: the new version's copy cannot be made.
    let kept = dirs.root.path().join("modules/bank/bank");
    std::fs::remove_dir_all(&kept).unwrap();
    std::fs::write(&kept, b"in the way").unwrap();

    install(&dirs.modules(), "bank.wasm", &v1);
    assert!(library.reload(&projection, &dirs.modules()).unwrap().is_empty());
    assert_eq!(versions(&projection.modules()), [("bank".to_owned(), content_version(&v0))]);
    assert_eq!(library.recorded().unwrap().active["bank"], content_version(&v0));
    let status = &library.reloads()["bank"];
    assert!(status.error.as_ref().is_some_and(|e| e.contains("creating")), "{status:?}");

    // Once the copy can be made, the same file is recorded and swapped in.
    std::fs::remove_file(&kept).unwrap();
    assert_eq!(library.reload(&projection, &dirs.modules()).unwrap(), ["bank"]);
    assert_eq!(versions(&projection.modules()), [("bank".to_owned(), content_version(&v1))]);
    assert_eq!(library.recorded().unwrap().active["bank"], content_version(&v1));
    assert!(library.reloads()["bank"].error.is_none());
}

/// A module file removed while the host runs takes its kept copies with
/// it: a large module renamed again and again used to leave a copy of
/// itself under every name (20 renames of 20 MB, 421 MB of copies).
#[test]
fn a_module_removed_while_running_leaves_no_kept_copies_behind() {
    let dirs = Dirs::new();
    let (library, projection) = dirs.started();
    let copies = dirs.root.path().join("modules/bank");
    let mut name = "bank".to_owned();
    for n in 1..6 {
        let next = format!("bank{n}");
        std::fs::rename(dirs.modules().join(format!("{name}.wasm")), dirs.modules().join(format!("{next}.wasm")))
            .unwrap();
        library.reload(&projection, &dirs.modules()).unwrap();
        assert_eq!(versions(&projection.modules()), [(next.clone(), content_version(&bank_variant(0)))]);
        name = next;
    }
    let left: Vec<String> =
        std::fs::read_dir(&copies).unwrap().map(|entry| entry.unwrap().file_name().to_string_lossy().into()).collect();
    assert_eq!(left, [name.clone()], "only the running module's copies are kept");
    let recorded = library.recorded().unwrap();
    assert_eq!(recorded.kept.keys().collect::<Vec<_>>(), [&name]);
}

#[test]
fn a_module_that_emits_to_the_topic_its_projection_consumes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = |name: &str| StateStore::open(&dir.path().join(format!("{name}.redb"))).unwrap();
    let probe = wakuwaku_tests::probe_module(); // emits to `notes-out` and `out`
    let error = Projection::new("p", "out", vec![probe.clone()], store("a")).err().unwrap().to_string();
    assert_eq!(
        error,
        "emit-loop: module `probe` declares it emits to `out`, the topic projection `p` consumes; a module may not \
         feed its own projection"
    );
    // A swap (a hot reload) is refused alike; what ran keeps running.
    let projection = Projection::new("p", "out", Vec::new(), store("b")).unwrap();
    let error = projection.swap_modules().replace(vec![probe.clone()]).unwrap_err();
    assert!(error.to_string().starts_with("emit-loop:"), "{error}");
    assert!(projection.modules().is_empty());
    Projection::new("p", "events", vec![probe], store("c")).unwrap();
}

#[test]
fn the_reload_status_of_a_refused_file_goes_with_the_file() {
    let dirs = Dirs::new();
    let (library, projection) = dirs.started();

    install(&dirs.modules(), "junk.wasm", b"not a component");
    assert!(library.reload(&projection, &dirs.modules()).unwrap().is_empty());
    assert!(library.reloads()["junk"].error.is_some(), "{:?}", library.reloads());
    std::fs::remove_file(dirs.modules().join("junk.wasm")).unwrap();
    assert!(library.reload(&projection, &dirs.modules()).unwrap().is_empty());
    assert!(!library.reloads().contains_key("junk"), "{:?}", library.reloads());
}

#[test]
fn the_compile_cache_is_used_and_a_damaged_entry_is_compiled_again() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let bytes = std::fs::read(bank_wasm()).unwrap();
    let load = |limits: SandboxLimits| -> WasmModule {
        Sandbox::new(limits).unwrap().with_compile_cache(&cache).load("bank", &bytes).unwrap()
    };
    assert!(!load(SandboxLimits::default()).from_cache(), "a cold cache compiles");
    assert!(load(SandboxLimits::default()).from_cache(), "a warm cache is used");

    let entry = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .unwrap();
    type Damage = fn(&mut Vec<u8>);
    let damages: [(&str, Damage); 3] = [
        ("a flipped byte", |file| {
            let middle = file.len() / 2;
            file[middle] ^= 0xff;
        }),
        ("a truncated file", |file| file.truncate(file.len() / 3)),
        ("garbage", |file| *file = b"not a cached component".to_vec()),
    ];
    for (what, damage) in damages {
        let mut file = std::fs::read(&entry).unwrap();
        damage(&mut file);
        std::fs::write(&entry, file).unwrap();
        let module = load(SandboxLimits::default());
        assert!(!module.from_cache(), "{what}: the damaged entry was trusted");
        assert_eq!(module.event_types().len(), 5, "{what}: the recompiled module works");
        assert!(load(SandboxLimits::default()).from_cache(), "{what}: the entry was rewritten");
    }
    // An entry whose frame is intact but whose artifact wasmtime refuses
    // (another engine's, say) is compiled again too.
    let artifact = b"an artifact of some other engine".to_vec();
    let mut framed = b"wakuCW01".to_vec();
    framed.extend(sha2::Sha256::digest(&artifact));
    framed.extend(artifact);
    std::fs::write(&entry, framed).unwrap();
    assert!(!load(SandboxLimits::default()).from_cache(), "wasmtime's refusal was not noticed");
    assert!(load(SandboxLimits::default()).from_cache());
}

/// A cache entry is native code the host runs; its checksum proves it
/// whole, not who wrote it. An entry or a cache directory others may write
/// to (or an entry that is not a regular file) is compiled again, never
/// run.
#[cfg(unix)]
#[test]
fn a_cache_entry_others_could_have_written_is_compiled_again() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let bytes = std::fs::read(bank_wasm()).unwrap();
    let from_cache = || {
        let sandbox = Sandbox::new(SandboxLimits::default()).unwrap().with_compile_cache(&cache);
        sandbox.load("bank", &bytes).unwrap().from_cache()
    };
    assert!(!from_cache());
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&cache), 0o700, "the cache directory is private");
    assert!(from_cache());
    let entry = std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().path()).next().unwrap();
    let set_mode = |path: &Path, mode| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();

    set_mode(&entry, 0o666);
    assert!(!from_cache(), "a world-writable entry was run");
    assert!(from_cache(), "the entry was rewritten private");

    set_mode(&cache, 0o777);
    assert!(!from_cache(), "an entry in a world-writable directory was run");
    set_mode(&cache, 0o700);
    assert!(from_cache());

    // A symlink to a good entry is not one.
    let elsewhere = dir.path().join("elsewhere.cwasm");
    std::fs::rename(&entry, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &entry).unwrap();
    assert!(!from_cache(), "a symlinked entry was run");
}

/// Waits until `f` holds, or fails after a while.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let started = Instant::now();
    while !f() {
        assert!(started.elapsed() < Duration::from_secs(20), "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_directory_swaps_new_versions_in_and_refuses_broken_ones() {
    let dirs = Dirs::new();
    let (library, projection, _reloader) = dirs.watched();
    let running = |version: &str| projection.modules().iter().any(|m| m.version() == version);

    let v1 = bank_variant(1);
    install(&dirs.modules(), "bank.wasm", &v1);
    eventually("version 1 runs", || running(&content_version(&v1)));
    // Recorded before the swap: whoever sees a version run sees it recorded.
    assert_eq!(library.recorded().unwrap().active["bank"], content_version(&v1));

    // A broken file: the old version keeps running, the error is kept.
    install(&dirs.modules(), "bank.wasm", b"\0asm broken");
    eventually("the broken file is refused", || library.reloads().get("bank").is_some_and(|r| r.error.is_some()));
    assert!(running(&content_version(&v1)));
    let status = &library.reloads()["bank"];
    assert!(
        status.error.as_ref().unwrap().contains("component-header: this is WebAssembly of another version"),
        "{status:?}"
    );
    assert!(library.load_counts().1 >= 1);

    // A second module whose tags clash with the first is refused too.
    install(&dirs.modules(), "twin.wasm", &bank_variant(2));
    eventually("the clashing module is refused", || library.reloads().get("twin").is_some_and(|r| r.error.is_some()));
    assert!(library.reloads()["twin"].error.as_ref().unwrap().contains("tags must be unique"));
    assert_eq!(projection.modules().len(), 1);

    // Removing the file takes the module out: its types are unhandled.
    std::fs::remove_file(dirs.modules().join("twin.wasm")).unwrap();
    std::fs::remove_file(dirs.modules().join("bank.wasm")).unwrap();
    eventually("the module is gone", || projection.modules().is_empty());
    assert!(library.recorded().unwrap().active.is_empty(), "{:?}", library.recorded());
}

/// Only a change to a module file reloads: a stream of changes to other
/// files in the directory used to have every module read and hashed again
/// at each (5.5 s of CPU per 10 s, with 7 large files present).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_changes_to_module_files_reload() {
    let dirs = Dirs::new();
    let (library, _projection, _reloader) = dirs.watched();
    // A file refused for clashing with the bank is loaded again at every
    // reload: the loads count the reloads.
    let loads = || library.load_counts().0;
    let started = loads();
    install(&dirs.modules(), "twin.wasm", &bank_variant(2));
    eventually("the twin is refused", || library.reloads().get("twin").is_some_and(|r| r.error.is_some()));
    tokio::time::sleep(Reloader::SETTLE * 4).await;
    let reloads = loads();
    assert!(reloads > started);
    for n in 0..20 {
        std::fs::write(dirs.modules().join("notes.txt"), format!("{n}")).unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Reloader::SETTLE * 6).await;
    assert_eq!(loads(), reloads, "a change to another file reloaded");
    std::fs::write(dirs.modules().join("junk.wasm"), b"not a component").unwrap();
    eventually("the twin is tried again", || loads() > reloads);
}

/// A reload reads again only what changed and may load now: a file
/// refused for its bytes is neither read nor refused again until it
/// changes, once its times are old enough to be trusted (7 large refused
/// files, one touched every 0.5 s, took 5.5 s of
/// CPU per 10 s to read and hash at every reload), while one refused for a
/// clash with another module is tried again at every reload, as the clash
/// may be gone.
#[test]
fn a_reload_reads_again_only_files_that_changed_or_may_load_now() {
    let dirs = Dirs::new();
    let (library, projection) = dirs.started();
    // Loads tried since the start (a clash is found after a load).
    let (ok, failed) = library.load_counts();
    let tried = || {
        let (now_ok, now_failed) = library.load_counts();
        (now_ok - ok, now_failed - failed)
    };
    install(&dirs.modules(), "junk.wasm", b"not a component");
    install(&dirs.modules(), "twin.wasm", &bank_variant(2));
    assert!(library.reload(&projection, &dirs.modules()).unwrap().is_empty());
    assert_eq!(tried(), (1, 1), "{:?}", library.reloads());
    // A file whose times are fresh may still be written within the same
    // tick of the clock: it is read again.
    assert!(library.reload(&projection, &dirs.modules()).unwrap().is_empty());
    assert_eq!(tried(), (2, 2), "{:?}", library.reloads());
    // Once they are two seconds old, the refused junk is taken at its stamp.
    std::thread::sleep(Duration::from_millis(2_100));
    assert!(library.reload(&projection, &dirs.modules()).unwrap().is_empty());
    assert_eq!(tried(), (3, 3), "{:?}", library.reloads());

    // The bank changes: it and the twin are loaded again, the junk is not.
    install(&dirs.modules(), "bank.wasm", &bank_variant(1));
    assert_eq!(library.reload(&projection, &dirs.modules()).unwrap(), ["bank"]);
    assert_eq!(tried(), (5, 3), "{:?}", library.reloads());
    assert!(library.reloads()["junk"].error.as_ref().is_some_and(|e| e.contains("component-header")));

    // The junk changes (a new file in its place): it is read and refused
    // again, and the twin tried again.
    install(&dirs.modules(), "junk.wasm", b"still not a component");
    assert!(library.reload(&projection, &dirs.modules()).unwrap().is_empty());
    assert_eq!(tried(), (6, 4), "{:?}", library.reloads());

    // Unchanged files that were taken in stay as they are; a removed one goes.
    std::fs::remove_file(dirs.modules().join("junk.wasm")).unwrap();
    std::fs::remove_file(dirs.modules().join("twin.wasm")).unwrap();
    assert!(library.reload(&projection, &dirs.modules()).unwrap().is_empty());
    assert_eq!(library.reloads().keys().collect::<Vec<_>>(), ["bank"]);
    assert_eq!(versions(&projection.modules()), [("bank".to_owned(), content_version(&bank_variant(1)))]);
}

/// An emit-topic check that holds the first load of one version until the
/// test releases it: a reload has then compiled that version and not yet
/// swapped it in.
struct HoldLoad {
    version: String,
    held: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>,
}

impl EmitTopics for HoldLoad {
    fn ensure(&self, module: &dyn HandlerModule) -> Result<(), LifecycleError> {
        if module.version() == self.version
            && let Some((loaded, release)) = self.held.lock().unwrap().take()
        {
            loaded.send(()).unwrap();
            release.recv_timeout(PATIENCE).expect("the test releases the load");
        }
        Ok(())
    }
}

/// How long a wait may take on a busy machine.
const PATIENCE: Duration = Duration::from_secs(120);

/// A reload compiles a new file; before it swaps it in, the set is replaced
/// as a whole (as a rebuild's promotion does). The reload then neither
/// swaps in nor records what it prepared: the promoted set runs, a reload
/// that finds nothing new keeps it, and only a later change of the
/// directory applies on top of it.
#[test]
fn a_reload_prepared_before_the_set_was_replaced_as_a_whole_never_lands_on_it() {
    let dirs = Dirs::new();
    let [v0, v1, v2, v3] = [0, 1, 2, 3].map(bank_variant);
    let [h0, h1, h2, h3] = [&v0, &v1, &v2, &v3].map(|v| content_version(v));
    install(&dirs.modules(), "bank.wasm", &v0);
    let (loaded, held) = (mpsc::channel(), mpsc::channel());
    let hold = HoldLoad { version: h1.clone(), held: Mutex::new(Some((loaded.0, held.1))) };
    let library = Arc::new(dirs.library().with_emit_topics(Arc::new(hold)));
    let projection = dirs.projection(&library);

    install(&dirs.modules(), "bank.wasm", &v1);
    let reloading = std::thread::spawn({
        let (library, projection, modules) = (library.clone(), projection.clone(), dirs.modules());
        move || library.reload(&projection, &modules)
    });
    loaded.1.recv_timeout(PATIENCE).expect("the reload compiled version 1");
    let promoted_dir = dirs.root.path().join("promoted");
    std::fs::create_dir(&promoted_dir).unwrap();
    install(&promoted_dir, "bank.wasm", &v2);
    let promoted = load_module_file(&sandbox(), &promoted_dir.join("bank.wasm")).unwrap();
    {
        let mut swap = projection.swap_modules();
        swap.replace(vec![promoted]).unwrap();
        let differences = library.replaced(&swap, &dirs.modules());
        let expected = Difference::Changed { module: "bank".into(), running: h2.clone(), in_directory: h1.clone() };
        assert_eq!(differences, [expected]);
    }
    held.0.send(()).unwrap();
    let changed = reloading.join().unwrap().unwrap();
    assert!(changed.is_empty(), "{changed:?}");
    assert_eq!(versions(&projection.modules()), [("bank".to_owned(), h2.clone())], "the promotion was undone");
    assert_eq!(library.recorded().unwrap().active["bank"], h0, "the reload recorded what it did not run");

    assert!(library.reload(&projection, &dirs.modules()).unwrap().is_empty());
    assert_eq!(versions(&projection.modules()), [("bank".to_owned(), h2)], "the directory's older file came back");

    install(&dirs.modules(), "bank.wasm", &v3);
    assert_eq!(library.reload(&projection, &dirs.modules()).unwrap(), ["bank"]);
    assert_eq!(versions(&projection.modules()), [("bank".to_owned(), h3.clone())]);
    assert_eq!(library.recorded().unwrap().active["bank"], h3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_swaps_under_load_lose_nothing_and_apply_nothing_twice() {
    let dirs = Dirs::new();
    let (v0, v1) = (bank_variant(0), bank_variant(1));
    install(&dirs.modules(), "bank.wasm", &v0);
    let module = load_module_file(&sandbox(), &dirs.modules().join("bank.wasm")).unwrap();

    // The log starts with part of the workload; the rest is published
    // while the host follows and the modules swap.
    let spec = WorkloadSpec { events: 60_000, accounts: 200, seed: 3 };
    let (log, _) = bank_log(dirs.root.path(), module.clone(), WorkloadSpec { events: 0, ..spec }, 2).await;
    let (events, oracle) = demo::workload(spec);
    let recorder = Arc::new(Recorder::default());
    let mut settings = HostSettings::new(dirs.root.path(), "bank", "accounts", ModuleSource::directory(dirs.modules()));
    settings.consumer = ConsumerConfig { batch_size: 512, idle_poll: Duration::from_millis(5), ..Default::default() };
    settings.observer = Some(recorder.clone());
    let host = Host::start_on(log.clone(), settings).await.unwrap();
    let (projection, library) = (host.projection().clone(), host.library().unwrap().clone());

    // Events arrive in small chunks all through the swaps, then the rest.
    let swapping = Arc::new(AtomicBool::new(true));
    let producer = {
        let (log, module, swapping) = (log.clone(), module.clone(), swapping.clone());
        tokio::spawn(async move {
            let mut published_while_swapping = 0;
            for chunk in events.chunks(100) {
                let outgoing = demo::outgoing(&*module, chunk).expect("the bank module");
                publish::publish(&*log, "accounts", module.clone(), outgoing, None, 1).await.unwrap();
                if swapping.load(Ordering::SeqCst) {
                    published_while_swapping += chunk.len();
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
            }
            published_while_swapping
        })
    };

    let mut swaps = 0;
    while swaps < 100 {
        let next = if swaps % 2 == 0 { &v1 } else { &v0 };
        install(&dirs.modules(), "bank.wasm", next);
        let version = content_version(next);
        let projection = projection.clone();
        tokio::task::spawn_blocking(move || {
            eventually("the swap is applied", || projection.modules().iter().any(|m| m.version() == version))
        })
        .await
        .unwrap();
        swaps += 1;
    }
    swapping.store(false, Ordering::SeqCst);
    let published_while_swapping = producer.await.unwrap();
    // Let the consumer reach the end, then stop it.
    let ends: u64 = log.end_offset("accounts", 0).await.unwrap() + log.end_offset("accounts", 1).await.unwrap();
    let store = projection.store().clone();
    tokio::task::spawn_blocking(move || {
        eventually("the consumer caught up", || {
            (0..2).map(|p| store.position("accounts", p).unwrap().unwrap_or(0)).sum::<u64>() == ends
        })
    })
    .await
    .unwrap();
    host.stop().await.unwrap();

    assert!(
        published_while_swapping < spec.events,
        "the load ended before the swaps did; publish more slowly or more events"
    );
    assert!(published_while_swapping > 0);
    assert_eq!(library.load_counts(), (101, 0));
    let check = demo::check_projection(&oracle, &*module, projection.store()).unwrap();
    assert!(check.matches(), "{}", check.report(5));
    let stats = projection.store().stats().unwrap();
    assert_eq!(stats[Stat::Applied], spec.events as u64);
    let calls = recorder.calls();
    for partition in 0..2 {
        let records = read_partition(&log, "accounts", partition).await;
        check_call_order(partition, &records, &calls).unwrap_or_else(|e| panic!("partition {partition}: {e}"));
    }
}

/// Files planted where the host reads modules (the module directory, the
/// kept versions under the data directory) are refused by the rule they
/// break, naming the file: a sparse file of a terabyte is never read (it
/// would take the host's memory), nor a directory of large files past
/// what the host may hold, and a FIFO is never waited on (opening it for
/// reading waits for a writer, holding start-up or the reloader forever).
#[test]
fn planted_module_files_are_refused_by_name_never_read_whole_or_waited_on() {
    let dirs = Dirs::new();
    let v0 = bank_variant(0);
    install(&dirs.modules(), "bank.wasm", &v0);
    let (modules, _) = dirs.library().start(&dirs.modules(), false).unwrap();
    assert_eq!(modules.len(), 1);

    // A terabyte, sparse, in the module directory.
    let huge = dirs.modules().join("huge.wasm");
    std::fs::File::create(&huge).unwrap().set_len(1 << 40).unwrap();
    let error = dirs.library().start(&dirs.modules(), false).map(drop).unwrap_err().to_string();
    assert!(error.contains("huge.wasm") && error.contains("component-size: a component has at most"), "{error}");
    std::fs::remove_file(&huge).unwrap();

    // Files each within the size limit, more than the host may hold in
    // all (sparse: no disk, but read they would be memory).
    for n in 0..9 {
        std::fs::File::create(dirs.modules().join(format!("big{n}.wasm"))).unwrap().set_len(128 << 20).unwrap();
    }
    let error = dirs.library().start(&dirs.modules(), false).map(drop).unwrap_err().to_string();
    assert!(error.contains("module-dir-size: the components of a module directory hold at most 1073741824"), "{error}");
    for n in 0..9 {
        std::fs::remove_file(dirs.modules().join(format!("big{n}.wasm"))).unwrap();
    }

    // More module files than a directory may hold, refused before any is
    // read (4 000 small modules took 71 s to start, and more would take
    // hours): `bank` and 63 others are the most.
    for n in 0..63 {
        std::fs::write(dirs.modules().join(format!("junk{n}.wasm")), b"not a component").unwrap();
    }
    // (At a restart the files the record does not know are refused alone.)
    let (modules, _) = dirs.library().start(&dirs.modules(), false).expect("64 modules are allowed");
    assert_eq!(modules.len(), 1);
    std::fs::write(dirs.modules().join("junk63.wasm"), b"not a component").unwrap();
    let error = dirs.library().start(&dirs.modules(), false).map(drop).unwrap_err().to_string();
    assert!(error.contains("module-count: a module directory holds at most 64 modules"), "{error}");
    for n in 0..64 {
        std::fs::remove_file(dirs.modules().join(format!("junk{n}.wasm"))).unwrap();
    }

    // The kept copy of the running version replaced by a FIFO, the module
    // file gone: start-up needs the kept copy.
    std::fs::remove_file(dirs.modules().join("bank.wasm")).unwrap();
    let kept = dirs.modules().join("bank/bank").join(format!("{}.wasm", content_version(&v0)));
    std::fs::remove_file(&kept).unwrap();
    assert!(std::process::Command::new("mkfifo").arg(&kept).status().unwrap().success());
    let library = dirs.library();
    let modules = dirs.modules();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(library.start(&modules, false).map(drop).map_err(|e| e.to_string())));
    let error = finished.recv_timeout(Duration::from_secs(30)).expect("start-up waited on a FIFO").unwrap_err();
    assert!(error.contains("component-file-kind: a module file must be a regular file; this one is a FIFO"), "{error}");
}

/// A module's name is its file's stem, and its kept versions live in a
/// directory of that name: the file `...wasm` (stem `..`) put them in the
/// directory above the projection's, among every projection's. Names that
/// could do that, or that no log line could show, are refused naming the
/// rule, before anything is compiled or kept.
#[test]
fn a_module_file_whose_name_could_leave_the_projections_directory_is_refused() {
    for file in ["...wasm", "..wasm", ".hidden.wasm", "tab\there.wasm", "dir\\up.wasm"] {
        let dirs = Dirs::new();
        install(&dirs.modules(), file, &bank_variant(0));
        let error = dirs.library().start(&dirs.modules(), false).map(drop).unwrap_err().to_string();
        assert!(
            error.contains("module-name: a module's name (its file's name without `.wasm`) is 1 to 128"),
            "{error}"
        );
        let left: Vec<_> = std::fs::read_dir(dirs.modules()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, [file], "nothing was kept for {file:?}");
    }
    let dirs = Dirs::new();
    install(&dirs.modules(), "bank.v2-final_1.wasm", &bank_variant(0));
    let (modules, _) = dirs.library().start(&dirs.modules(), false).unwrap();
    assert_eq!(modules[0].name(), "bank.v2-final_1");
}

/// A file a reload cannot read (too large, a FIFO) is refused on its own,
/// shown under the reloads with the rule it broke: the other files of the
/// directory are still applied, and a module whose file became unreadable
/// keeps running as it was. Before, one such file failed every reload.
#[test]
fn a_file_a_reload_cannot_read_is_refused_alone_and_the_others_are_applied() {
    let dirs = Dirs::new();
    let [v0, v1] = [0, 1].map(bank_variant);
    install(&dirs.modules(), "bank.wasm", &v0);
    let library = dirs.library();
    let projection = dirs.projection(&library);

    std::fs::File::create(dirs.modules().join("big.wasm")).unwrap().set_len(200 << 20).unwrap();
    install(&dirs.modules(), "bank.wasm", &v1);
    assert_eq!(library.reload(&projection, &dirs.modules()).unwrap(), ["bank"]);
    assert_eq!(versions(&projection.modules()), [("bank".to_owned(), content_version(&v1))]);
    let refused = library.reloads()["big"].error.clone().unwrap();
    assert!(refused.contains("big.wasm") && refused.contains("component-size:"), "{refused}");

    // The running module's file replaced by a FIFO: not read, not waited
    // on, not taken for a removed file.
    let file = dirs.modules().join("bank.wasm");
    std::fs::remove_file(&file).unwrap();
    assert!(std::process::Command::new("mkfifo").arg(&file).status().unwrap().success());
    assert!(library.reload(&projection, &dirs.modules()).unwrap().is_empty());
    assert_eq!(versions(&projection.modules()), [("bank".to_owned(), content_version(&v1))]);
    let refused = library.reloads()["bank"].error.clone().unwrap();
    assert!(refused.contains("component-file-kind:"), "{refused}");
    // At start-up every file must be usable, and the error names it.
    drop(library);
    let error = dirs.library().start(&dirs.modules(), false).map(drop).unwrap_err().to_string();
    assert!(error.contains("component-"), "{error}");
}

/// The compile cache stays under its bound: writing an entry removes the
/// least recently used ones past it (a hit counts as a use), never the
/// entries of the versions the sandbox runs.
#[test]
fn the_compile_cache_removes_the_least_recently_used_entries_past_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let modules: Vec<(&str, Vec<u8>)> = [("bank", bank_wasm()), ("fee", bank_fee_wasm()), ("probe", probe_wasm())]
        .into_iter()
        .map(|(name, path)| (name, std::fs::read(path).unwrap()))
        .collect();
    let entries = |cache: &Path| -> Vec<(String, u64)> {
        let mut entries: Vec<(String, u64)> = std::fs::read_dir(cache)
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap().len()))
            .collect();
        entries.sort();
        entries
    };
    // How large each entry is.
    let scratch = dir.path().join("scratch");
    let sizes: Vec<u64> = modules
        .iter()
        .map(|(name, bytes)| {
            let sandbox = Sandbox::new(SandboxLimits::default()).unwrap().with_compile_cache(&scratch);
            sandbox.load(name, bytes).unwrap();
            let version = content_version(bytes);
            entries(&scratch).into_iter().find(|(file, _)| file.starts_with(&version)).unwrap().1
        })
        .collect();

    // Room for all three but one byte: the third entry written removes the
    // least recently used one.
    let cache = dir.path().join("cache");
    let bound = sizes.iter().sum::<u64>() - 1;
    // A fresh sandbox per load, as a process each: nothing of its own in use.
    let load = |index: usize, bound: u64| {
        let sandbox = Sandbox::new(SandboxLimits::default())
            .unwrap()
            .with_compile_cache(&cache)
            .with_compile_cache_max_bytes(bound);
        sandbox.load(modules[index].0, &modules[index].1).unwrap().from_cache()
    };
    let pause = || std::thread::sleep(Duration::from_millis(20));
    assert!(!load(0, bound));
    pause();
    assert!(!load(1, bound));
    pause();
    assert!(load(0, bound), "bank is cached");
    pause();
    assert!(!load(2, bound));
    let kept: u64 = entries(&cache).iter().map(|(_, bytes)| bytes).sum();
    assert_eq!(kept, sizes[0] + sizes[2], "fee, the least recently used, was removed: {:?}", entries(&cache));
    assert!(load(0, bound), "bank, used after fee, is kept");
    assert!(load(2, bound), "probe, just written, is kept");

    // The entries of what a sandbox runs are kept even past the bound:
    // bank's (a hit) and fee's (just written) stay, probe's goes.
    let sandbox =
        Sandbox::new(SandboxLimits::default()).unwrap().with_compile_cache(&cache).with_compile_cache_max_bytes(1);
    assert!(sandbox.load(modules[0].0, &modules[0].1).unwrap().from_cache());
    assert!(!sandbox.load(modules[1].0, &modules[1].1).unwrap().from_cache());
    let kept: u64 = entries(&cache).iter().map(|(_, bytes)| bytes).sum();
    assert_eq!(kept, sizes[0] + sizes[1], "bank and fee are running: {:?}", entries(&cache));
}
