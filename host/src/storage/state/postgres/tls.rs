//! How the PostgreSQL state store reaches its server: the connection
//! string with the TLS settings libpq users know, and the rustls
//! connector (`tokio-postgres-rustls`) made from them.
//!
//! The URL (`postgres://user:password@host:port/db?sslmode=verify-full&sslrootcert=ca.pem`)
//! or key=value string (`host=db sslmode=verify-full sslrootcert=ca.pem`)
//! takes, beside tokio-postgres's own options:
//!
//! | option | meaning |
//! | --- | --- |
//! | `sslmode=disable` | plain TCP |
//! | `sslmode=prefer` (default) | TLS when the server offers it, else plain; the certificate is not checked |
//! | `sslmode=require` | TLS or no connection; the certificate is not checked, unless `sslrootcert` is given: then as `verify-ca` (libpq's rule) |
//! | `sslmode=verify-ca` | TLS; the certificate must chain to a CA of `sslrootcert`; its names are not checked |
//! | `sslmode=verify-full` | TLS; the chain, and the certificate must name the host connected to |
//! | `sslrootcert=FILE` | the trusted CAs (PEM); `system`: the machine's; without it `verify-*` reads `~/.postgresql/root.crt`, as libpq does |
//! | `sslcert=FILE`, `sslkey=FILE` | a client certificate (PEM) and its key, for servers that ask for one |
//! | `synchronous_commit=off` (or another of PostgreSQL's values) | not TLS: each batch's transaction runs `SET LOCAL synchronous_commit` to it (opt-in; without it the server's setting, durable by default) |
//!
//! Rules kept here:
//! - **The default is `prefer`, as libpq's**: a URL means what it means
//!   to `psql`, and local servers (loopback, Unix sockets), which mostly
//!   run without TLS, keep working. `prefer` only stops a reader, not
//!   someone in the middle, so a connection to a host other than loopback
//!   or a socket without `verify-ca`/`verify-full` draws a warning at
//!   start-up ([`PostgresTls::warn_if_unchecked`]) saying what to set.
//! - **tokio-postgres parses only `disable`, `prefer` and `require`**:
//!   the options above are taken out of the string before it parses the
//!   rest, and the connector checks the server as they say.
//! - **`allow` is refused** (tokio-postgres cannot try plain first), and
//!   so is `sslpassword` (keys are read unencrypted: keep them `chmod
//!   600`); a key file its group or others may read draws a warning.
//! - **Nothing secret is kept or shown**: the settings hold file names,
//!   never a key's bytes, and the rest of the string (with its password)
//!   goes to tokio-postgres only.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use tokio_postgres::config::{Host, SslMode as WireMode};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::platform::tls::{self, ServerCheck, TlsError};

/// How much of the server's certificate is checked (`sslmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when offered, unchecked; plain otherwise (the default).
    #[default]
    Prefer,
    /// TLS, unchecked (checked as [`SslMode::VerifyCa`] with a root file).
    Require,
    /// TLS; the chain is checked, the names are not.
    VerifyCa,
    /// TLS; the chain and the host's name are checked.
    VerifyFull,
}

impl SslMode {
    /// The mode as the URL spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

impl FromStr for SslMode {
    type Err = SettingError;

    fn from_str(text: &str) -> Result<Self, SettingError> {
        Ok(match text {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            "allow" => {
                return Err(SettingError::Invalid {
                    option: "sslmode",
                    reason: "`allow` is not supported; use prefer (TLS when offered) or disable".to_owned(),
                });
            }
            other => {
                return Err(SettingError::Invalid {
                    option: "sslmode",
                    reason: format!(
                        "`{}` is none of disable, prefer, require, verify-ca, verify-full",
                        wakuwaku_core::terminal::printable(other)
                    ),
                });
            }
        })
    }
}

/// Where the trusted CAs come from (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file.
    File(PathBuf),
    /// The machine's trusted CAs (`sslrootcert=system`).
    System,
}

/// The TLS settings of a connection string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PostgresTls {
    /// `sslmode`.
    pub mode: SslMode,
    /// `sslrootcert`.
    pub root_cert: Option<RootCert>,
    /// `sslcert`: the client certificate.
    pub client_cert: Option<PathBuf>,
    /// `sslkey`: its key.
    pub client_key: Option<PathBuf>,
}

/// A connection string taken apart: tokio-postgres's configuration and
/// the TLS settings.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// Everything but the TLS settings, as tokio-postgres parsed it (its
    /// `ssl_mode` set from [`PostgresTls::mode`]).
    pub pg: tokio_postgres::Config,
    /// The TLS settings.
    pub tls: PostgresTls,
    /// `synchronous_commit=…` of the URL: what each batch's transaction
    /// sets it to (`SET LOCAL`), or `None` for the server's own setting.
    /// Only the batch commits take it; see the README ("PostgreSQL for the
    /// state") for what `off` can lose.
    pub synchronous_commit: Option<&'static str>,
}

/// Why a connection string or its TLS files cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingError {
    /// An option has a value it does not take.
    #[error("the PostgreSQL URL's option `{option}`: {reason}")]
    Invalid {
        /// The option.
        option: &'static str,
        /// Why.
        reason: String,
    },
    /// tokio-postgres could not parse the rest of the string.
    #[error("the PostgreSQL URL cannot be read")]
    Parse(#[source] tokio_postgres::Error),
    /// A TLS file could not be used.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// The options taken out of the string before tokio-postgres reads it.
const TAKEN_OPTIONS: [&str; 6] = ["sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "synchronous_commit"];

/// The values PostgreSQL's `synchronous_commit` takes.
const SYNCHRONOUS_COMMIT: [&str; 5] = ["on", "off", "local", "remote_write", "remote_apply"];

impl FromStr for PostgresConfig {
    type Err = SettingError;

    fn from_str(text: &str) -> Result<Self, SettingError> {
        let (rest, options) = if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            split_url(text)
        } else {
            split_key_values(text)?
        };
        let mut tls = PostgresTls::default();
        let mut synchronous_commit = None;
        for (option, value) in options {
            match option.as_str() {
                "synchronous_commit" => {
                    let known = SYNCHRONOUS_COMMIT.iter().find(|known| **known == value);
                    synchronous_commit = Some(*known.ok_or_else(|| SettingError::Invalid {
                        option: "synchronous_commit",
                        reason: format!("`{value}` is none of {}", SYNCHRONOUS_COMMIT.join(", ")),
                    })?);
                }
                "sslmode" => tls.mode = value.parse()?,
                "sslrootcert" if value == "system" => tls.root_cert = Some(RootCert::System),
                "sslrootcert" => tls.root_cert = Some(RootCert::File(value.into())),
                "sslcert" => tls.client_cert = Some(value.into()),
                "sslkey" => tls.client_key = Some(value.into()),
                _ => {
                    return Err(SettingError::Invalid {
                        option: "sslpassword",
                        reason: "encrypted keys are not supported; give an unencrypted key file, `chmod 600`"
                            .to_owned(),
                    });
                }
            }
        }
        if tls.client_cert.is_some() != tls.client_key.is_some() {
            return Err(SettingError::Invalid {
                option: if tls.client_cert.is_some() { "sslkey" } else { "sslcert" },
                reason: "a client certificate needs both sslcert and sslkey".to_owned(),
            });
        }
        if tls.root_cert == Some(RootCert::System) && tls.mode != SslMode::VerifyFull {
            return Err(SettingError::Invalid {
                option: "sslrootcert",
                reason: "`system` needs sslmode=verify-full (as libpq says)".to_owned(),
            });
        }
        let mut pg = tokio_postgres::Config::from_str(&rest).map_err(SettingError::Parse)?;
        pg.ssl_mode(tls.wire_mode());
        Ok(Self { pg, tls, synchronous_commit })
    }
}

impl PostgresConfig {
    /// The connector for these settings (it reads the CA and client files
    /// now, so a missing one fails at start-up).
    pub fn connector(&self) -> Result<MakeRustlsConnect, SettingError> {
        self.tls.connector()
    }

    /// A client of its own (not pooled) with the connection driven on the
    /// current runtime: for tools and tests that run their own SQL.
    pub async fn connect_client(&self) -> Result<tokio_postgres::Client, Box<dyn std::error::Error + Send + Sync>> {
        let (client, connection) = self.pg.connect(self.connector()?).await?;
        tokio::spawn(connection);
        Ok(client)
    }
}

impl PostgresTls {
    /// What tokio-postgres is told: the checking is the connector's.
    fn wire_mode(&self) -> WireMode {
        match self.mode {
            SslMode::Disable => WireMode::Disable,
            SslMode::Prefer => WireMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => WireMode::Require,
        }
    }

    /// The connector: a rustls client checking the server as the mode
    /// says, presenting the client certificate when one is set.
    pub fn connector(&self) -> Result<MakeRustlsConnect, SettingError> {
        let check = match (self.mode, &self.root_cert) {
            (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, None) => ServerCheck::Nothing,
            (SslMode::Require | SslMode::VerifyCa, Some(root)) => ServerCheck::Chain(roots(root)?.into()),
            (SslMode::VerifyCa, None) => ServerCheck::Chain(roots(&default_root()?)?.into()),
            (SslMode::VerifyFull, Some(root)) => ServerCheck::Full(roots(root)?.into()),
            (SslMode::VerifyFull, None) => ServerCheck::Full(roots(&default_root()?)?.into()),
        };
        let identity = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => {
                tls::warn_if_readable_by_others(key, "PostgreSQL client key (sslkey)");
                Some((tls::read_certificates(cert, "client certificate")?, tls::read_key(key)?))
            }
            _ => None,
        };
        let config = tls::client_config(&check, identity).map_err(|error| {
            match (error, &self.client_cert, &self.client_key) {
                (TlsError::Refused { source, .. }, Some(cert), Some(key)) => TlsError::Refused {
                    what: format!("client certificate sslcert={} with key sslkey={}", cert.display(), key.display()),
                    source,
                },
                (error, ..) => error,
            }
        })?;
        Ok(MakeRustlsConnect::new(config))
    }

    /// Whether the server's certificate is checked.
    pub fn checks_certificate(&self) -> bool {
        matches!(self.mode, SslMode::VerifyCa | SslMode::VerifyFull)
            || (self.mode == SslMode::Require && self.root_cert.is_some())
    }

    /// Where the trusted CAs come from, for messages.
    pub fn roots_named(&self) -> String {
        match &self.root_cert {
            Some(RootCert::File(path)) => format!("sslrootcert={}", path.display()),
            Some(RootCert::System) => "the system's trusted CAs (sslrootcert=system)".to_owned(),
            None => "~/.postgresql/root.crt".to_owned(),
        }
    }

    /// Logs a warning when `hosts` reach beyond this machine and the
    /// server's certificate is not checked.
    pub fn warn_if_unchecked(&self, hosts: &[Host], location: &str) {
        let remote = hosts.iter().any(|host| match host {
            Host::Unix(_) => false,
            Host::Tcp(name) => !is_loopback(name),
        });
        if remote && !self.checks_certificate() {
            tracing::warn!(
                store = location,
                "the PostgreSQL server's certificate is not checked (sslmode={}): anyone on the path can pose \
                 as it; add sslmode=verify-full&sslrootcert=<CA file> to the URL",
                self.mode.name()
            );
        }
    }
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn roots(root: &RootCert) -> Result<rustls::RootCertStore, TlsError> {
    match root {
        RootCert::File(path) => tls::read_roots(path),
        RootCert::System => tls::system_roots(),
    }
}

/// libpq's default root file, `~/.postgresql/root.crt`.
fn default_root() -> Result<RootCert, SettingError> {
    let path = std::env::var_os("HOME").map(|home| Path::new(&home).join(".postgresql/root.crt"));
    match path {
        Some(path) if path.exists() => Ok(RootCert::File(path)),
        _ => Err(SettingError::Invalid {
            option: "sslrootcert",
            reason: "sslmode=verify-ca and verify-full check the server against trusted CAs: give \
                     sslrootcert=<CA file> (or sslrootcert=system), or put them in ~/.postgresql/root.crt"
                .to_owned(),
        }),
    }
}

/// A URL without its TLS options, and those options (percent-decoded).
fn split_url(url: &str) -> (String, Vec<(String, String)>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), Vec::new());
    };
    let mut kept = Vec::new();
    let mut taken = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match TAKEN_OPTIONS.contains(&key) {
            true => {
                let value = percent_encoding::percent_decode_str(value).decode_utf8_lossy().into_owned();
                taken.push((key.to_owned(), value));
            }
            false => kept.push(pair),
        }
    }
    let rest = match kept.is_empty() {
        true => base.to_owned(),
        false => format!("{base}?{}", kept.join("&")),
    };
    (rest, taken)
}

/// A key=value string without its TLS options, and those options, read
/// as tokio-postgres and libpq read values (`'quoted'`, `\` escapes).
fn split_key_values(text: &str) -> Result<(String, Vec<(String, String)>), SettingError> {
    let mut kept = String::new();
    let mut taken = Vec::new();
    let mut chars = text.char_indices().peekable();
    loop {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(start, _)) = chars.peek() else { break };
        let mut key = String::new();
        while let Some((_, c)) = chars.next_if(|(_, c)| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if(|(_, c)| *c == '=').is_some() {
            while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
            let quoted = chars.next_if(|(_, c)| *c == '\'').is_some();
            while let Some((_, c)) = chars.next_if(|(_, c)| if quoted { *c != '\'' } else { !c.is_whitespace() }) {
                match c {
                    '\\' => value.extend(chars.next().map(|(_, escaped)| escaped)),
                    c => value.push(c),
                }
            }
            if quoted && chars.next().is_none() {
                return Err(SettingError::Invalid {
                    option: "connection string",
                    reason: format!("the quoted value of `{}` is not closed", wakuwaku_core::terminal::printable(&key)),
                });
            }
        }
        let end = chars.peek().map_or(text.len(), |&(end, _)| end);
        match TAKEN_OPTIONS.contains(&key.as_str()) {
            true => taken.push((key, value)),
            false => {
                kept.push_str(&text[start..end]);
                kept.push(' ');
            }
        }
    }
    Ok((kept.trim_end().to_owned(), taken))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An X.509 v1 certificate (no extensions) and its key, as
    /// `openssl req -new -key KEY | openssl x509 -req -signkey KEY` makes
    /// them (valid until 2126).
    const V1_CERTIFICATE: &str = "-----BEGIN CERTIFICATE-----\n\
MIIBHzCBxwIUKy+vTmPt9Q+qNhIfyxGtbbhvD+QwCgYIKoZIzj0EAwIwEjEQMA4G\n\
A1UEAwwHd2FrdV92MTAgFw0yNjEyMDIxODE0NDFaGA8yMTI2MTEwODE4MTQ0MVow\n\
EjEQMA4GA1UEAwwHd2FrdV92MTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABGM9\n\
5gZbCZIuR3rRyhAEArL1fYfTPaa5o+feItgl9HstFE4aBi+HXCfn+ptYqt6mgYE8\n\
upvlX77IMLRneUtpgBQwCgYIKoZIzj0EAwIDRwAwRAIgC30FJD7epqvRwMHRWdyz\n\
zH+J/BubvG2HXQ1EioLiiKYCICw+LNonxhAhudka+qvmjnigBPC2Q4K2Y2D3hf7m\n\
9QWX\n\
-----END CERTIFICATE-----\n";
    const V1_KEY: &str = "-----BEGIN PRIVATE KEY-----\n\
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg459k7/awGX24qsWb\n\
wQKS5SIKx+I04auqpHgVIpvsAz6hRANCAARjPeYGWwmSLkd60coQBAKy9X2H0z2m\n\
uaPn3iLYJfR7LRROGgYvh1wn5/qbWKrepoGBPLqb5V++yDC0Z3lLaYAU\n\
-----END PRIVATE KEY-----\n";

    #[test]
    fn a_v1_client_certificate_is_refused_naming_its_files_and_how_to_make_a_v3_one() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("client.pem"), dir.path().join("client.key"));
        std::fs::write(&cert, V1_CERTIFICATE).unwrap();
        std::fs::write(&key, V1_KEY).unwrap();
        let tls =
            PostgresTls { client_cert: Some(cert.clone()), client_key: Some(key.clone()), ..PostgresTls::default() };
        let text = tls.connector().err().expect("a v1 certificate is refused").to_string();
        assert!(text.contains(&format!("sslcert={}", cert.display())), "{text}");
        assert!(text.contains(&format!("sslkey={}", key.display())), "{text}");
        assert!(text.contains("X.509 v1") && text.contains("-extfile"), "{text}");
    }

    fn parsed(text: &str) -> PostgresConfig {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn the_tls_options_are_taken_out_of_a_url_and_the_rest_goes_to_tokio_postgres() {
        let config = parsed(
            "postgres://waku:pa%40ss@db.example:6432/state?sslmode=verify-full&application_name=w&sslrootcert=%2Fca.pem\
             &sslcert=/c.pem&sslkey=/k.pem",
        );
        assert_eq!(config.tls.mode, SslMode::VerifyFull);
        assert_eq!(config.tls.root_cert, Some(RootCert::File("/ca.pem".into())));
        assert_eq!(config.tls.client_cert.as_deref(), Some(Path::new("/c.pem")));
        assert_eq!(config.tls.client_key.as_deref(), Some(Path::new("/k.pem")));
        assert_eq!(config.pg.get_password(), Some(&b"pa@ss"[..]));
        assert_eq!(config.pg.get_application_name(), Some("w"));
        assert_eq!(config.pg.get_dbname(), Some("state"));
        assert_eq!(config.pg.get_ssl_mode(), WireMode::Require);
        assert!(config.tls.checks_certificate());
    }

    #[test]
    fn key_value_strings_take_the_same_options_quoted_or_not() {
        let config = parsed(r"host=db  sslmode = verify-ca sslrootcert='/my dir/ca\'s.pem' user=waku password=x\ y");
        assert_eq!(config.tls.mode, SslMode::VerifyCa);
        assert_eq!(config.tls.root_cert, Some(RootCert::File("/my dir/ca's.pem".into())));
        assert_eq!(config.pg.get_user(), Some("waku"));
        assert_eq!(config.pg.get_password(), Some(&b"x y"[..]));
        assert_eq!(config.pg.get_hosts(), [Host::Tcp("db".into())]);
    }

    #[test]
    fn the_default_is_prefer_and_unknown_or_unsupported_modes_are_refused_by_name() {
        let config = parsed("postgres://u@localhost/db");
        assert_eq!(config.tls, PostgresTls::default());
        assert_eq!(config.tls.mode, SslMode::Prefer);
        assert_eq!(config.pg.get_ssl_mode(), WireMode::Prefer);
        assert!(!config.tls.checks_certificate());
        assert_eq!(parsed("postgres://u@h/db?sslmode=disable").pg.get_ssl_mode(), WireMode::Disable);
        for mode in [SslMode::Disable, SslMode::Prefer, SslMode::Require, SslMode::VerifyCa, SslMode::VerifyFull] {
            assert_eq!(mode.name().parse::<SslMode>().unwrap(), mode);
        }
        assert!(parsed("host=h sslmode=require sslrootcert=/ca.pem").tls.checks_certificate());
        for (text, says) in [
            ("postgres://u@h/db?sslmode=allow", "`allow` is not supported"),
            ("postgres://u@h/db?sslmode=strict", "`strict` is none of"),
            ("postgres://u@h/db?sslcert=/c.pem", "needs both sslcert and sslkey"),
            ("postgres://u@h/db?sslpassword=x", "encrypted keys are not supported"),
            ("postgres://u@h/db?sslmode=require&sslrootcert=system", "needs sslmode=verify-full"),
            ("host=h sslrootcert='/ca.pem", "not closed"),
        ] {
            let error = text.parse::<PostgresConfig>().unwrap_err().to_string();
            assert!(error.contains(says), "{text}: {error}");
            assert!(!error.contains("sslpassword=x"), "{error}");
        }
    }

    #[test]
    fn a_missing_ca_file_is_named_when_the_connector_is_made() {
        let config = parsed("postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem");
        let error = config.connector().err().expect("no CA file").to_string();
        assert!(error.contains("CA file /nonexistent/ca.pem"), "{error}");
    }

    #[test]
    fn only_hosts_off_this_machine_count_as_remote() {
        assert!(is_loopback("localhost") && is_loopback("127.0.0.1") && is_loopback("::1") && is_loopback("[::1]"));
        assert!(!is_loopback("db.example") && !is_loopback("10.0.0.1"));
    }
}
