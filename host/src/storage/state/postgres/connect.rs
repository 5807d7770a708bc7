//! From a parsed connection string to a pool of connections ([`pool`]),
//! and the words a failed connect is reported in.
//!
//! Rules kept here:
//! - **Nothing connects yet**: the pool opens its connections when a call
//!   first needs one; the TLS files are read now, so a missing one fails at
//!   start-up ([`super::tls`]).
//! - **A store is named without its password** ([`describe`]): host, port,
//!   database and projection, the name every error carries.
//! - **A refused handshake says why** ([`tls_refusal`]): an unknown CA, a
//!   certificate for other names, a server without TLS, a client
//!   certificate missing or refused become [`StateError::Tls`] with what to
//!   change; any other error passes unchanged.
//! - **The batch transaction's opening is fixed at connect** ([`begin`]):
//!   `BEGIN`, and `SET LOCAL synchronous_commit` when the URL opts in.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

use super::super::StateError;
use super::tls::PostgresConfig;

/// Connections kept per store: the batch workers share the reader's, so
/// a few serve a host.
const POOL_SIZE: usize = 8;

/// A store's pool, not connected yet, with what its calls and a TLS
/// refusal's message need.
pub(super) struct Pooled {
    pub(super) pool: Pool,
    /// What a batch's transaction begins with ([`begin`]).
    pub(super) begin: Arc<str>,
    /// Where the trusted CAs come from, for a refusal's message.
    pub(super) roots: String,
    /// The client certificate (`sslcert`), for a refusal's message.
    pub(super) client_cert: Option<PathBuf>,
}

/// The pool `config` describes, for the store named `location`.
pub(super) fn pool(config: PostgresConfig, location: &str) -> Result<Pooled, StateError> {
    let failed =
        |e: Box<dyn std::error::Error + Send + Sync>| StateError::Storage { store: location.to_owned(), source: e };
    let connector = config.connector().map_err(|e| failed(Box::new(e)))?;
    config.tls.warn_if_unchecked(config.pg.get_hosts(), location);
    let roots = config.tls.roots_named();
    let client_cert = config.tls.client_cert.clone();
    let begin = begin(config.synchronous_commit);
    let manager = Manager::from_config(config.pg, connector, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    let pool = Pool::builder(manager).max_size(POOL_SIZE).build().map_err(|e| failed(Box::new(e)))?;
    Ok(Pooled { pool, begin, roots, client_cert })
}

/// What a batch's transaction begins with: `BEGIN`, and `SET LOCAL
/// synchronous_commit` when the URL opts in ([`PostgresConfig::synchronous_commit`]).
pub(super) fn begin(synchronous_commit: Option<&str>) -> Arc<str> {
    match synchronous_commit {
        Some(setting) => format!("BEGIN; SET LOCAL synchronous_commit = {setting}").into(),
        None => "BEGIN".into(),
    }
}

/// `error`, as [`StateError::Tls`] when a TLS handshake was refused or the
/// server asked for a client certificate it did not get or did not take
/// (`roots`: where the trusted CAs came from; `client_cert`: `sslcert`).
pub(super) fn tls_refusal(error: StateError, roots: &str, client_cert: Option<&Path>) -> StateError {
    let StateError::Storage { store, source } = &error else { return error };
    let chain = || std::iter::successors(Some(source.as_ref() as &(dyn std::error::Error + 'static)), |e| e.source());
    let refused = crate::platform::tls::refusal(source.as_ref(), "the PostgreSQL server", roots)
        .or_else(|| {
            // tokio-postgres's own words when `require` meets a server without TLS.
            chain().map(ToString::to_string).any(|text| text.contains("server does not support TLS")).then(|| {
                "the PostgreSQL server does not offer TLS, and the URL's sslmode asks for it: turn `ssl = on` at the \
                 server, or set sslmode=prefer or disable"
                    .to_owned()
            })
        })
        .or_else(|| {
            let db = chain().find_map(|e| e.downcast_ref::<tokio_postgres::Error>()?.as_db_error())?;
            let about_certificate = db.code() == &tokio_postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION
                && db.message().contains("certificate");
            about_certificate.then(|| client_certificate_refused(db.message(), client_cert))
        });
    match refused {
        Some(reason) => StateError::Tls { store: store.clone(), reason },
        None => error,
    }
}

/// What to do when the server's pg_hba asks for a client certificate
/// (`cert` or `clientcert=`) and refused the login (`said`: its words).
fn client_certificate_refused(said: &str, client_cert: Option<&Path>) -> String {
    match client_cert {
        None => format!(
            "the PostgreSQL server asks for a client certificate (it said: {said}): add \
             sslcert=<certificate file>&sslkey=<key file> to the URL, a certificate signed by a CA in the server's \
             ssl_ca_file whose CN is the URL's user"
        ),
        Some(cert) => format!(
            "the PostgreSQL server refused the client certificate sslcert={} (it said: {said}): its CN must be the \
             URL's user, and a CA in the server's ssl_ca_file must have signed it",
            cert.display()
        ),
    }
}

/// `postgres host:port/db projection `p``, without the password.
pub(super) fn describe(config: &tokio_postgres::Config, projection: &str) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().or(config.get_user()).unwrap_or("postgres");
    format!("postgres `{host}:{port}/{db}` projection `{projection}`")
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn config(url: &str) -> tokio_postgres::Config {
        tokio_postgres::Config::from_str(url).unwrap()
    }

    #[test]
    fn a_store_is_named_by_host_port_database_and_projection_never_its_password() {
        let named = describe(&config("postgres://waku:secret@db.example:6432/state"), "bank");
        assert_eq!(named, "postgres `db.example:6432/state` projection `bank`");
        assert!(!named.contains("secret"));
        // A socket directory; no database: the user's; nothing: libpq's defaults.
        assert_eq!(describe(&config("host=/tmp port=5442 user=ann"), "p"), "postgres `/tmp:5442/ann` projection `p`");
        assert_eq!(describe(&tokio_postgres::Config::new(), "p"), "postgres `localhost:5432/postgres` projection `p`");
    }

    #[test]
    fn a_batch_begins_with_synchronous_commit_only_when_the_url_opts_in() {
        assert_eq!(&*begin(None), "BEGIN");
        assert_eq!(&*begin(Some("off")), "BEGIN; SET LOCAL synchronous_commit = off");
    }

    #[test]
    fn a_server_without_tls_is_a_tls_refusal_saying_what_to_set_and_other_errors_pass() {
        let storage = |cause: &str| StateError::Storage { store: "s".into(), source: cause.to_owned().into() };
        let refused = tls_refusal(storage("error performing TLS handshake: server does not support TLS"), "r", None);
        let StateError::Tls { store, reason } = &refused else { panic!("not a TLS refusal: {refused}") };
        assert_eq!(store, "s");
        assert!(reason.contains("does not offer TLS") && reason.contains("sslmode=prefer or disable"), "{reason}");
        let other = tls_refusal(storage("connection refused"), "r", None);
        assert!(matches!(&other, StateError::Storage { source, .. } if source.to_string() == "connection refused"));
        let in_use = tls_refusal(StateError::InUse { store: "s".into() }, "r", None);
        assert!(matches!(in_use, StateError::InUse { .. }));
    }

    #[test]
    fn a_refused_client_certificate_names_the_file_or_says_how_to_give_one() {
        let missing = client_certificate_refused("no certificate", None);
        assert!(missing.contains("asks for a client certificate (it said: no certificate)"), "{missing}");
        assert!(missing.contains("sslcert=<certificate file>&sslkey=<key file>"), "{missing}");
        let refused = client_certificate_refused("bad CN", Some(Path::new("/c.pem")));
        assert!(refused.contains("refused the client certificate sslcert=/c.pem (it said: bad CN)"), "{refused}");
    }

    #[test]
    fn the_pool_opens_no_connection_and_names_a_missing_ca_file() {
        let parsed: PostgresConfig = "postgres://u@127.0.0.1:1/db?synchronous_commit=off".parse().unwrap();
        let pooled = pool(parsed, "here").unwrap();
        assert_eq!(pooled.pool.status().size, 0, "no connection before a call needs one");
        assert_eq!(&*pooled.begin, "BEGIN; SET LOCAL synchronous_commit = off");
        assert_eq!(pooled.pool.status().max_size, POOL_SIZE);
        let parsed: PostgresConfig =
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem".parse().unwrap();
        let error = pool(parsed, "here").err().expect("no CA file");
        assert!(matches!(&error, StateError::Storage { store, .. } if store == "here"), "{error}");
    }
}
