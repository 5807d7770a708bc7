//! Which test servers (Iggy, PostgreSQL) the tests may use, and names
//! that keep runs on a shared server apart. Plain `std` only: the `waku`
//! binary's own integration tests (host/tests/common) include this file
//! by path, as they cannot depend on this crate.

/// The Iggy server the tests may use (`WAKU_IGGY_URL`, for example
/// `iggy://iggy:iggy@127.0.0.1:8090`). Without one, prints one line saying
/// `what` was skipped and returns `None`.
pub fn iggy_url(what: &str) -> Option<String> {
    let url = std::env::var("WAKU_IGGY_URL").ok();
    if url.is_none() {
        // Straight to stderr, past the test harness's capture, so it shows.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: {what} needs an Iggy server named by WAKU_IGGY_URL (e.g. iggy://iggy:iggy@127.0.0.1:8090)"
        );
    }
    url
}

/// The PostgreSQL server the tests may use (`WAKU_POSTGRES_URL`, for
/// example `postgres://postgres@127.0.0.1:5433/postgres`). Without one,
/// prints one line saying `what` was skipped and returns `None`; under CI
/// (`CI=true`), whose `.ci/run` starts a server, panics instead.
pub fn postgres_url(what: &str) -> Option<String> {
    let url = std::env::var("WAKU_POSTGRES_URL").ok();
    if url.is_none() {
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!("{what}: CI starts a PostgreSQL server (.ci/run), but WAKU_POSTGRES_URL is not set");
        }
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: {what} needs a PostgreSQL server named by WAKU_POSTGRES_URL \
             (e.g. postgres://postgres@127.0.0.1:5433/postgres)"
        );
    }
    url
}

/// The OCI registry the tests may push to and pull from
/// (`WAKU_OCI_REGISTRY`, `host:port` of a registry speaking plain HTTP on
/// loopback, as `.ci/run` starts one). Without one, prints one line saying
/// `what` was skipped and returns `None`; under CI (`CI=true`) panics
/// instead.
pub fn oci_registry(what: &str) -> Option<String> {
    let registry = std::env::var("WAKU_OCI_REGISTRY").ok().filter(|value| !value.is_empty());
    if registry.is_none() {
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!("{what}: CI starts an OCI registry (.ci/run), but WAKU_OCI_REGISTRY is not set");
        }
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: {what} needs an OCI registry named by WAKU_OCI_REGISTRY (e.g. 127.0.0.1:5000: apt-get install \
             docker-registry, see .ci/run)"
        );
    }
    registry
}

/// A stream name no earlier run used, for tests against a shared server.
pub fn fresh_stream(prefix: &str) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    format!("{prefix}-{}", now.as_nanos())
}
