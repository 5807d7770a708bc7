//! Modules from an OCI registry (`WAKU_OCI_REGISTRY`, which `.ci/run`
//! starts): push, pull by tag and by digest, the Wasm artifact layout
//! `wkg oci push` writes, a tampered blob refused, a projection started
//! from references, and a restart after the tag moved.

use std::path::Path;
use std::sync::Arc;

use wakuwaku::operations::host::{HostSettings, ModuleSource};
use wakuwaku::operations::oci::{ModuleRef, OciError, Registry, pins, sha256_digest};
use wakuwaku::sandbox::runtime::content_version;
use wakuwaku::storage::log::EventLog;
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::state::StateStore;
use wakuwaku_tests::{bank_variant, catch_up, oci_registry};

/// A repository no earlier run used, ending in `bank` (the module it names).
fn fresh_reference(registry: &str, tag: &str) -> ModuleRef {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("oci://{registry}/waku-test/r{now}/bank:{tag}").parse().unwrap()
}

/// The manifest at `reference` as any HTTP client reads it.
fn raw_manifest(reference: &ModuleRef) -> serde_json::Value {
    let url = format!(
        "http://{}/v2/{}/manifests/{}",
        reference.registry(),
        reference.repository(),
        reference.digest().or(reference.tag()).unwrap()
    );
    let mut response = ureq::get(&url).header("Accept", "application/vnd.oci.image.manifest.v1+json").call().unwrap();
    serde_json::from_slice(&response.body_mut().read_to_vec().unwrap()).unwrap()
}

#[tokio::test]
async fn a_component_is_pushed_and_pulled_by_tag_and_by_digest() {
    let Some(registry) = oci_registry("pushing and pulling modules") else { return };
    let bytes = bank_variant(0);
    let reference = fresh_reference(&registry, "v1");
    let client = Registry::for_registry(reference.registry()).unwrap();
    let pushed = client.push(bytes.clone(), &reference).await.unwrap();
    assert_eq!(pushed.layer, sha256_digest(&bytes));
    // The version the host records is the layer digest's first 16 digits.
    assert_eq!(content_version(&bytes), pushed.layer["sha256:".len()..][..16]);

    let by_tag = client.pull(&reference).await.unwrap();
    assert_eq!((by_tag.bytes == bytes, &by_tag.artifact), (true, &pushed));
    let by_digest = client.pull(&reference.at_digest(&pushed.manifest)).await.unwrap();
    assert_eq!((by_digest.bytes == bytes, &by_digest.artifact), (true, &pushed));
    let digest_only: ModuleRef =
        format!("oci://{registry}/{}@{}", reference.repository(), pushed.manifest).parse().unwrap();
    assert_eq!(client.pull(&digest_only).await.unwrap().bytes, bytes);

    // The Wasm OCI artifact layout, read without this project's code.
    let manifest = raw_manifest(&reference);
    assert_eq!(manifest["config"]["mediaType"], "application/vnd.wasm.config.v0+json");
    assert_eq!(manifest["layers"].as_array().unwrap().len(), 1);
    assert_eq!(manifest["layers"][0]["mediaType"], "application/wasm");
    assert_eq!(manifest["layers"][0]["digest"], pushed.layer.as_str());

    // A digest nothing was pushed as is refused.
    let unknown: ModuleRef =
        format!("oci://{registry}/{}@sha256:{}", reference.repository(), "0".repeat(64)).parse().unwrap();
    assert!(client.pull(&unknown).await.is_err());
    // Not a component: refused before anything is sent.
    let error = client.push(b"\0asm\x01\0\0\0".to_vec(), &reference).await.unwrap_err();
    assert!(matches!(error, OciError::NotAComponentFile(_)), "{error}");
}

#[tokio::test]
async fn a_tampered_blob_is_refused() {
    let Some(registry) = oci_registry("a tampered module blob") else { return };
    let Ok(storage) = std::env::var("WAKU_OCI_REGISTRY_STORAGE") else {
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), ".ci/run sets WAKU_OCI_REGISTRY_STORAGE");
        eprintln!("skipped: a tampered module blob needs WAKU_OCI_REGISTRY_STORAGE (the registry's storage)");
        return;
    };
    let bytes = bank_variant(3);
    let reference = fresh_reference(&registry, "v1");
    let client = Registry::for_registry(reference.registry()).unwrap();
    let pushed = client.push(bytes.clone(), &reference).await.unwrap();
    // The distribution registry's filesystem layout: one byte changed, the
    // length kept, so only the digest can tell.
    let hex = &pushed.layer["sha256:".len()..];
    let blob = Path::new(&storage).join(format!("docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2]));
    let mut tampered = std::fs::read(&blob).unwrap();
    assert_eq!(tampered, bytes);
    let last = tampered.len() - 1;
    tampered[last] ^= 0xff;
    std::fs::write(&blob, &tampered).unwrap();

    for target in [reference.clone(), reference.at_digest(&pushed.manifest)] {
        let error = client.pull(&target).await.unwrap_err();
        assert!(matches!(error, OciError::Tampered { what: "a layer", .. }), "{error}");
    }
}

/// A host of the bank projection whose module comes from `reference`, its
/// module directory and data in `dir`.
fn settings(dir: &Path, reference: &ModuleRef, adopt: bool) -> HostSettings {
    let modules = ModuleSource::Directory { path: dir.join("modules"), adopt, watch: false };
    let mut settings = HostSettings::new(dir.join("data"), "bank", "accounts", modules);
    settings.module_refs = vec![reference.clone()];
    settings.create_emit_topics = Some(1);
    settings.until_caught_up = true;
    settings
}

/// What a restart of the projection would run: its recorded bank version,
/// and the manifest digest its reference is pinned to.
async fn runs(log: &Arc<EmbeddedLog>, settings: HostSettings) -> (String, String) {
    let (_, projection) = catch_up(log, settings).await.unwrap();
    let store: &StateStore = projection.store();
    let recorded: serde_json::Value = serde_json::from_slice(&store.meta("modules").unwrap().unwrap()).unwrap();
    let pinned = pins::read(store).unwrap().remove("bank").unwrap();
    (recorded["active"]["bank"].as_str().unwrap().to_owned(), pinned.manifest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projection_runs_its_pinned_digest_until_the_operator_adopts_a_moved_tag() {
    let Some(registry) = oci_registry("a projection of modules from a registry") else { return };
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("data/log.redb")).unwrap());
    log.create_topic("accounts", 1).await.unwrap();
    let live = fresh_reference(&registry, "live");
    let client = Registry::for_registry(live.registry()).unwrap();
    let (one, two) = (bank_variant(1), bank_variant(2));
    let first = client.push(one.clone(), &live).await.unwrap();

    // Started from the reference: pulled, pinned, recorded.
    assert_eq!(runs(&log, settings(dir.path(), &live, false)).await, (content_version(&one), first.manifest.clone()));
    assert_eq!(std::fs::read(dir.path().join("modules/bank.wasm")).unwrap(), one);

    // The tag moves. A restart runs exactly what ran before.
    let second = client.push(two.clone(), &live).await.unwrap();
    assert_ne!(first.manifest, second.manifest);
    assert_eq!(runs(&log, settings(dir.path(), &live, false)).await, (content_version(&one), first.manifest.clone()));
    assert_eq!(std::fs::read(dir.path().join("modules/bank.wasm")).unwrap(), one, "the pinned file stays");
    // Even with the file gone: pulled again by the pinned digest.
    std::fs::remove_file(dir.path().join("modules/bank.wasm")).unwrap();
    assert_eq!(runs(&log, settings(dir.path(), &live, false)).await, (content_version(&one), first.manifest.clone()));
    assert_eq!(std::fs::read(dir.path().join("modules/bank.wasm")).unwrap(), one);

    // Adopted explicitly: the tag's new digest runs from then on.
    assert_eq!(runs(&log, settings(dir.path(), &live, true)).await, (content_version(&two), second.manifest.clone()));
    assert_eq!(runs(&log, settings(dir.path(), &live, false)).await, (content_version(&two), second.manifest.clone()));

    // A changed reference is the operator's choice: taken at the next start.
    let pinned_first = live.at_digest(&first.manifest);
    assert_eq!(runs(&log, settings(dir.path(), &pinned_first, false)).await, (content_version(&one), first.manifest));
}
