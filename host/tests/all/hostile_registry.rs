//! `waku modules pull` and `waku modules push` against a registry on
//! loopback that this test runs itself (no `WAKU_OCI_REGISTRY` needed):
//! what they read is bounded in bytes and in time, a layer that does not
//! load replaces nothing,
//! credentials go to no token service but the registry's own over TLS
//! unless allowed, a missing tag says which, and a pulled module file has
//! the ordinary mode.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use crate::common::registry::{Reply, TestRegistry, serving, storing};
use crate::common::{bank_wasm, text, waku_command};

/// `waku modules pull oci://{registry}/team/bank:v1 --modules modules` in
/// `dir`, with the variables `env`.
fn pull(dir: &Path, registry: &TestRegistry, env: &[(&str, &str)]) -> Output {
    let reference = format!("oci://{}/team/bank:v1", registry.address);
    let mut command = waku_command(dir);
    command.args(["modules", "pull", &reference, "--modules", "modules"]);
    command.env_remove("WAKU_OCI_USERNAME").env_remove("WAKU_OCI_PASSWORD").env("DOCKER_CONFIG", dir);
    command.envs(env.iter().copied());
    command.output().unwrap()
}

fn failed(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{}{}", text(&out.stdout), text(&out.stderr));
    text(&out.stderr)
}

#[test]
fn a_huge_manifest_is_refused_at_the_bound_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let bound = [("WAKU_OCI_MAX_MANIFEST_BYTES", "4096")];
    // Says 1 GiB: refused on its Content-Length.
    let says = TestRegistry::start(|_| Reply::Endless { content_length: Some(1 << 30) });
    let error = failed(&pull(dir.path(), &says, &bound));
    assert!(error.contains("manifest is over the bound of 4096 bytes (it says 1073741824)"), "{error}");
    assert!(error.contains("WAKU_OCI_MAX_MANIFEST_BYTES"), "{error}");
    // Says nothing, and never ends: cut at the bound. What the registry got
    // out is what the socket buffers took, nowhere near the endless body.
    let endless = TestRegistry::start(|_| Reply::Endless { content_length: None });
    let error = failed(&pull(dir.path(), &endless, &bound));
    assert!(
        error.contains("manifest is over the bound of 4096 bytes, which WAKU_OCI_MAX_MANIFEST_BYTES sets"),
        "{error}"
    );
    assert!(endless.sent() < 32 << 20, "the registry sent {} bytes", endless.sent());
    assert!(!dir.path().join("modules").exists(), "nothing written");
}

#[test]
fn a_trickling_registry_ends_the_pull_at_the_time_bound() {
    let dir = tempfile::tempdir().unwrap();
    let trickle = TestRegistry::start(|_| Reply::Trickle { content_length: 1000, every: Duration::from_millis(200) });
    let out = pull(dir.path(), &trickle, &[("WAKU_OCI_TIMEOUT", "2s")]);
    let error = failed(&out);
    assert!(error.contains("took over 2s, the bound WAKU_OCI_TIMEOUT sets; stopped"), "{error}");
    assert!(trickle.sent() < 100, "stopped early: {} of 1000 bytes sent", trickle.sent());
}

#[test]
fn a_layer_that_is_not_a_component_replaces_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("modules")).unwrap();
    let existing = std::fs::read(bank_wasm()).unwrap();
    std::fs::write(dir.path().join("modules/bank.wasm"), &existing).unwrap();
    for layer in [b"not a component at all".to_vec(), [&existing[..8], b"broken"].concat()] {
        let registry = serving(layer);
        let error = failed(&pull(dir.path(), &registry, &[]));
        assert!(error.contains("the component does not load, so nothing was written"), "{error}");
        assert_eq!(std::fs::read(dir.path().join("modules/bank.wasm")).unwrap(), existing, "unchanged");
        let names: Vec<_> = std::fs::read_dir(dir.path().join("modules")).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "no file left behind");
    }
}

/// A registry whose every answer is a 401 naming the token service `realm`.
fn challenging(realm: String) -> TestRegistry {
    TestRegistry::start(move |_| Reply::Full {
        status: 401,
        headers: vec![("WWW-Authenticate".into(), format!("Bearer realm=\"{realm}\",service=\"r\""))],
        body: Vec::new(),
    })
}

/// What `operation` (a pull or a push, given a directory, a registry and
/// variables) sends to token services: nothing to one over plain HTTP or
/// on another host (refused, the setting named), the credentials to one
/// allowed by name; returns the head of the request the allowed one got.
fn token_services_are_checked(operation: impl Fn(&Path, &TestRegistry, &[(&str, &str)]) -> Output) -> String {
    let dir = tempfile::tempdir().unwrap();
    let credentials = [("WAKU_OCI_USERNAME", "ann"), ("WAKU_OCI_PASSWORD", "s3cret")];
    let tokens = TestRegistry::start(|_| Reply::ok(br#"{"token": "t"}"#.to_vec()));
    let plain = format!("http://{}/token", tokens.address);
    for (realm, why) in
        [(plain.as_str(), "over plain HTTP"), ("https://auth.example/token", "on another host than the registry")]
    {
        let registry = challenging(realm.to_owned());
        let error = failed(&operation(dir.path(), &registry, &credentials));
        assert!(error.contains(&format!("the token service {realm}, {why}; they were not sent")), "{error}");
        assert!(error.contains("WAKU_OCI_TOKEN_SERVICES"), "{error}");
        let received = [registry.requests(), tokens.requests()].concat();
        assert!(received.iter().all(|head| !head.to_lowercase().contains("authorization")), "{received:?}");
        assert!(tokens.requests().is_empty(), "{:?}", tokens.requests());
    }
    // Allowed by name: the token service gets the credentials.
    let registry = challenging(plain.clone());
    let origin = format!("http://{}", tokens.address);
    let allowed = [credentials[0], credentials[1], ("WAKU_OCI_TOKEN_SERVICES", origin.as_str())];
    let error = failed(&operation(dir.path(), &registry, &allowed));
    assert!(error.contains("refused access"), "{error}");
    let asked = tokens.requests();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].contains("YW5uOnMzY3JldA=="), "{asked:?}");
    asked[0].clone()
}

#[test]
fn credentials_go_to_no_token_service_but_an_allowed_one() {
    let asked = token_services_are_checked(pull);
    assert!(asked.contains("%3Apull ") || asked.contains("%3Apull&"), "a pull asks to pull only: {asked:?}");
}

#[test]
fn a_missing_tag_names_the_reference_and_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    let registry = TestRegistry::start(|_| Reply::Full {
        status: 404,
        headers: Vec::new(),
        body: br#"{"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]}"#.to_vec(),
    });
    let error = failed(&pull(dir.path(), &registry, &[]));
    let expected = format!(
        "waku: error: registry `{0}` has no tag for `oci://{0}/team/bank:v1`; check the reference (`waku modules \
         push` puts one there)",
        registry.address
    );
    assert!(error.starts_with(&expected), "{error}");
}

#[test]
fn a_pulled_module_has_the_ordinary_mode() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let bank = std::fs::read(bank_wasm()).unwrap();
    let registry = serving(bank.clone());
    let out = pull(dir.path(), &registry, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let path = dir.path().join("modules/bank.wasm");
    assert_eq!(std::fs::read(&path).unwrap(), bank);
    // SAFETY: umask only swaps the process's mask; set back at once.
    let umask = unsafe {
        let umask = libc::umask(0o022);
        libc::umask(umask);
        umask
    };
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644 & !umask, "mode {mode:o}");
}

/// `waku modules push <bank.wasm> oci://{registry}/team/bank:v1` in `dir`,
/// with the variables `env`; killed after 60 s (a push that reads without
/// bound would run for as long as the registry likes).
fn push(dir: &Path, registry: &TestRegistry, env: &[(&str, &str)]) -> (Output, Duration) {
    let reference = format!("oci://{}/team/bank:v1", registry.address);
    let mut command = waku_command(dir);
    command.args(["modules", "push", bank_wasm().to_str().unwrap(), &reference]);
    command.env_remove("WAKU_OCI_USERNAME").env_remove("WAKU_OCI_PASSWORD").env("DOCKER_CONFIG", dir);
    command.envs(env.iter().copied());
    command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let started = std::time::Instant::now();
    let mut child = command.spawn().unwrap();
    while child.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    (child.wait_with_output().unwrap(), started.elapsed())
}

/// A registry whose every answer is a 401 naming the token service at
/// `tokens`, asked anonymously (no credentials, so it may be anywhere).
fn anonymous_challenge(tokens: &TestRegistry) -> TestRegistry {
    challenging(format!("http://{}/token", tokens.address))
}

#[test]
fn a_push_reads_a_token_answer_only_to_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = TestRegistry::start(|_| Reply::Endless { content_length: None });
    let registry = anonymous_challenge(&tokens);
    let (out, took) = push(dir.path(), &registry, &[]);
    let error = failed(&out);
    assert!(error.contains("the registry's token service's answer is over the bound of 65536 bytes"), "{error}");
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(tokens.sent() < 32 << 20, "the token service sent {} bytes", tokens.sent());
}

#[test]
fn a_trickling_registry_ends_the_push_at_the_time_bound() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = TestRegistry::start(|_| Reply::Trickle { content_length: 1000, every: Duration::from_millis(200) });
    let registry = anonymous_challenge(&tokens);
    let (out, took) = push(dir.path(), &registry, &[("WAKU_OCI_TIMEOUT", "2s")]);
    let error = failed(&out);
    assert!(error.contains("took over 2s, the bound WAKU_OCI_TIMEOUT sets; stopped"), "{error}");
    assert!(error.contains("pushing `oci://"), "{error}");
    assert!(took < Duration::from_secs(20), "{took:?}");
}

#[test]
fn a_push_sends_credentials_to_no_token_service_but_an_allowed_one() {
    let asked = token_services_are_checked(|dir, registry, env| push(dir, registry, env).0);
    assert!(asked.contains("pull%2Cpush"), "a push asks to push: {asked:?}");
}

#[test]
fn a_pushed_module_pulls_back_the_same_and_its_pin_names_the_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let registry = storing();
    let (out, _) = push(dir.path(), &registry, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    let pin =
        said.lines().find_map(|line| line.trim().strip_prefix("pin it with ")).unwrap_or_else(|| panic!("{said}"));
    let out = pull(dir.path(), &registry, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(dir.path().join("modules/bank.wasm")).unwrap(), std::fs::read(bank_wasm()).unwrap());
    // Pulled by the pin: the manifest's digest is the one the push printed.
    let mut command = waku_command(dir.path());
    command.args(["modules", "pull", pin, "--modules", "pinned"]).env("DOCKER_CONFIG", dir.path());
    let out = command.env_remove("WAKU_OCI_USERNAME").env_remove("WAKU_OCI_PASSWORD").output().unwrap();
    assert!(out.status.success(), "{pin}: {}", text(&out.stderr));
}

/// Every file under `dir`, with the digest of its bytes.
fn files(dir: &Path) -> std::collections::BTreeMap<std::path::PathBuf, String> {
    let mut found = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                found.insert(
                    path.clone(),
                    wakuwaku::operations::oci::sha256_digest(&std::fs::read(&path).unwrap_or_default()),
                );
            }
        }
    }
    found
}

/// `waku run --module-ref` at start-up from a registry that sends a huge
/// manifest, or a layer that is not a component: refused with the bound
/// or the reason named, and the module directory is as it was (nothing
/// written beside the module, nothing replaced).
#[test]
fn a_run_refuses_a_hostile_module_ref_at_start_up_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::create_dir(dir.join("modules")).unwrap();
    let bank = std::fs::read(bank_wasm()).unwrap();
    std::fs::write(dir.join("modules/bank.wasm"), &bank).unwrap();
    let events = dir.join("open.jsonl");
    std::fs::write(&events, r#"{"type": "AccountOpened", "body": {"account": 42, "owner": "ann"}}"#).unwrap();
    let mut publish = waku_command(dir);
    publish.args(["publish", "--data", "data", "--topic", "accounts", "--partitions", "1", "--module"]);
    let published = publish.arg(bank_wasm()).arg(&events).output().unwrap();
    assert!(published.status.success(), "{}", text(&published.stderr));
    let before = files(&dir.join("modules"));
    let data_files = || files(&dir.join("data")).into_keys().collect::<Vec<_>>();
    let data_before = data_files();

    let huge = TestRegistry::start(|_| Reply::Endless { content_length: None });
    let not_a_component = serving(b"not a component at all".to_vec());
    for (registry, said) in [
        (&huge, "manifest is over the bound of 4096 bytes, which WAKU_OCI_MAX_MANIFEST_BYTES sets"),
        (&not_a_component, "the component does not load, so nothing was written"),
    ] {
        let reference = format!("oci://{}/team/bank:v1", registry.address);
        let mut run = waku_command(dir);
        run.args(["run", "--data", "data", "--projection", "bank", "--topic", "accounts", "--modules", "modules"]);
        run.args(["--module-ref", &reference, "--until-caught-up"]);
        run.env_remove("WAKU_OCI_USERNAME").env_remove("WAKU_OCI_PASSWORD").env("DOCKER_CONFIG", dir);
        let out = run.env("WAKU_OCI_MAX_MANIFEST_BYTES", "4096").env("WAKU_OCI_TIMEOUT", "20s").output().unwrap();
        let error = failed(&out);
        assert!(error.starts_with("waku: error: ") && error.contains(said), "{error}");
        assert!(error.contains(&reference), "{error}");
        assert_eq!(files(&dir.join("modules")), before, "{reference}: nothing created, nothing replaced");
        assert_eq!(data_files(), data_before, "{reference}: no projection state or rebuild folder left");
    }
}
