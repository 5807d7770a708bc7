//! Who may ask the admin endpoint: the token `run`, `demo` and `dev`
//! protect it with, and the token `status` and `state` send to it.
//!
//! The token comes from the file `--admin-token-file` names (a setting
//! like the others, `WAKU_ADMIN_TOKEN_FILE` or `admin-token-file` in
//! `waku.toml`, shared by `run`, `status` and `state`), else from the environment variable [`TOKEN_VARIABLE`],
//! which holds the token itself. Never from a flag's value, which `ps`
//! shows to every user of the machine; and the token is never printed
//! (the settings show the file's name, errors name the file or the
//! variable). A token file its group or others may read draws a warning.
//!
//! TLS: `run`, `demo` and `dev` serve it with `--admin-tls-cert` and
//! `--admin-tls-key` (a key file others may read draws a warning), and
//! `status` and `state` check an `https://` endpoint against the CAs of
//! `--admin-ca-file`, else the machine's, with the host's crypto
//! provider. A refused handshake is said in plain words
//! ([`crate::platform::tls::refusal`]), and the token is sent only once the
//! endpoint passed the check.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::operations::admin::{self, AdminToken};

/// The environment variable holding the token itself.
pub(super) const TOKEN_VARIABLE: &str = "WAKU_ADMIN_TOKEN";

/// How `run` and `demo` protect their admin endpoint.
#[derive(Args, Debug, Clone)]
pub(super) struct AdminServeArgs {
    /// Ask every caller of the admin endpoint but `/health` and `/ready`
    /// for the bearer token in this file (a trailing newline is trimmed;
    /// keep it `chmod 600`). Without it, the token in WAKU_ADMIN_TOKEN if
    /// set, else the endpoint is open.
    #[arg(long, value_name = "FILE")]
    pub(super) admin_token_file: Option<PathBuf>,
    /// Also take the token in this file, for reading only: the routes that
    /// read and the console's pages, never its actions (re-drive,
    /// rollback). Keep it `chmod 600`.
    #[arg(long, value_name = "FILE")]
    pub(super) admin_read_token_file: Option<PathBuf>,
    /// Serve the admin endpoint without a token on an address other than
    /// loopback (refused otherwise: anyone who reaches it reads the state).
    #[arg(long)]
    pub(super) admin_insecure: bool,
    /// Serve the admin endpoint over TLS with the certificate chain in
    /// this PEM file (with --admin-tls-key).
    #[arg(long, value_name = "FILE", requires = "admin_tls_key")]
    pub(super) admin_tls_cert: Option<PathBuf>,
    /// The private key of --admin-tls-cert (PEM; keep it `chmod 600`).
    #[arg(long, value_name = "FILE", requires = "admin_tls_cert")]
    pub(super) admin_tls_key: Option<PathBuf>,
}

impl AdminServeArgs {
    /// Sets the token, the opt-in and the TLS of `settings`.
    pub(super) fn apply(&self, settings: &mut crate::operations::host::HostSettings) -> Result<()> {
        settings.admin_token = token(self.admin_token_file.as_deref())?;
        settings.admin_read_token = self.read_token()?;
        settings.admin_insecure = self.admin_insecure;
        settings.admin_tls = self.tls()?;
        Ok(())
    }

    /// The read-only token, from its file when given.
    pub(super) fn read_token(&self) -> Result<Option<AdminToken>> {
        self.admin_read_token_file.as_deref().map(read_token).transpose()
    }

    /// The certificate and key to serve TLS with, read now.
    pub(super) fn tls(&self) -> Result<Option<admin::AdminTls>> {
        let (Some(cert), Some(key)) = (&self.admin_tls_cert, &self.admin_tls_key) else { return Ok(None) };
        if crate::platform::files::readable_by_others(key) {
            errln!(
                "waku: warning: the admin TLS key file {} is readable by its group or others; `chmod 600` it",
                key.display()
            );
        }
        Ok(Some(admin::AdminTls::from_files(cert, key).context("the admin endpoint's TLS")?))
    }
}

/// The endpoint's URL at `address`: `https://` when it serves TLS.
pub(super) fn served_url(address: std::net::SocketAddr, tls: bool) -> String {
    format!("{}://{address}", if tls { "https" } else { "http" })
}

/// The token `status` and `state` send to the admin endpoint.
#[derive(Args, Debug, Clone)]
pub(super) struct AdminClientArgs {
    /// With --admin: send the bearer token in this file (else the one in
    /// WAKU_ADMIN_TOKEN, if set).
    #[arg(long, value_name = "FILE")]
    pub(super) admin_token_file: Option<PathBuf>,
    /// With an https:// --admin: trust the CAs in this PEM file (else the
    /// machine's trusted CAs).
    #[arg(long, value_name = "FILE")]
    pub(super) admin_ca_file: Option<PathBuf>,
}

/// `--admin` of `status` and `state`: the endpoint's URL. An address
/// without a scheme (`127.0.0.1:9100`, as `run --admin` takes it) is taken
/// as `http://127.0.0.1:9100`, so one value serves both.
pub(super) fn endpoint_url(value: &str) -> Result<String, String> {
    let value = value.trim().trim_end_matches('/');
    if value.is_empty() {
        return Err("give the admin endpoint's address, e.g. 127.0.0.1:9100".to_owned());
    }
    match value.split_once("://") {
        Some(("http" | "https", rest)) if !rest.is_empty() => Ok(value.to_owned()),
        Some((scheme, _)) => Err(format!("`{value}`: the admin endpoint speaks http or https, not `{scheme}`")),
        None => Ok(format!("http://{value}")),
    }
}

/// `--admin` of `run`, `dev` and `demo`: the address to serve on. A URL
/// (`http://127.0.0.1:9100` or `https://…`, as `status --admin` takes it) is taken as its
/// address, so one value serves both.
pub(super) fn serve_address(value: &str) -> Result<std::net::SocketAddr, String> {
    let value_trimmed = value.trim();
    let address = value_trimmed
        .strip_prefix("https://")
        .or_else(|| value_trimmed.strip_prefix("http://"))
        .unwrap_or(value_trimmed)
        .trim_end_matches('/');
    address.parse().map_err(|_| format!("`{value}` is no address to serve on: give <ip>:<port>, e.g. 127.0.0.1:9100"))
}

/// The read-only token in `file`; warns of a file its group or others
/// may read.
fn read_token(path: &Path) -> Result<AdminToken> {
    let token = AdminToken::from_file(path)?;
    if crate::platform::files::readable_by_others(path) {
        errln!(
            "waku: warning: the admin read-only token file {} is readable by its group or others; `chmod 600` it",
            path.display()
        );
    }
    Ok(token)
}

/// The token from `file`, else from [`TOKEN_VARIABLE`] (empty: unset),
/// else none; warns of a file its group or others may read.
pub(super) fn token(file: Option<&Path>) -> Result<Option<AdminToken>> {
    match file {
        Some(path) => {
            let token = AdminToken::from_file(path)?;
            if crate::platform::files::readable_by_others(path) {
                errln!(
                    "waku: warning: the admin token file {} is readable by its group or others; `chmod 600` it",
                    path.display()
                );
            }
            Ok(Some(token))
        }
        None => match std::env::var_os(TOKEN_VARIABLE) {
            None => Ok(None),
            Some(value) => {
                let origin = format!("environment variable {TOKEN_VARIABLE}");
                let Some(text) = value.to_str() else {
                    bail!("the admin token in {origin} is not UTF-8");
                };
                Ok(AdminToken::new(text, &origin)?)
            }
        },
    }
}

/// The body of `url`'s answer, asked with `token` as a bearer token; an
/// answer other than 2xx is an error, a 401 one that says how to give the
/// token.
pub(super) fn get(url: &str, token: Option<&AdminToken>, ca_file: Option<&Path>) -> Result<String> {
    let agent: ureq::Agent =
        ureq::Agent::config_builder().tls_config(tls_config(ca_file)?).http_status_as_error(false).build().into();
    let mut request = agent.get(url);
    if let Some(token) = token {
        request = request.header("Authorization", format!("Bearer {}", token.secret()));
    }
    let mut response = request.call().map_err(|error| refused(url, ca_file, error))?;
    let body = response.body_mut().read_to_string().with_context(|| format!("reading the answer of {url}"))?;
    if response.status() == ureq::http::StatusCode::UNAUTHORIZED {
        bail!(
            "{url}: the admin endpoint refused the token: give --admin-token-file <FILE> or {TOKEN_VARIABLE} (the \
             token `waku run` was given)"
        );
    }
    if !response.status().is_success() {
        bail!("{url} answered {}: {}", response.status(), body.trim());
    }
    Ok(body)
}

/// Whether `error` (from [`get`]) says nothing listens at the endpoint:
/// the connection was refused, or the address does not resolve.
pub(super) fn unreachable(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| match cause.downcast_ref::<ureq::Error>() {
        Some(ureq::Error::Io(io)) => {
            matches!(io.kind(), std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::AddrNotAvailable)
        }
        Some(ureq::Error::HostNotFound | ureq::Error::ConnectionFailed) => true,
        _ => false,
    })
}

/// How the commands check an https endpoint: against the CAs of
/// `ca_file`, else the machine's; the provider the host uses everywhere.
fn tls_config(ca_file: Option<&Path>) -> Result<ureq::tls::TlsConfig> {
    let roots: Vec<ureq::tls::Certificate<'static>> = match ca_file {
        Some(path) => crate::platform::tls::read_certificates(path, "CA file")?
            .iter()
            .map(|der| ureq::tls::Certificate::from_der(der.as_ref()).to_owned())
            .collect(),
        None => rustls_native_certs::load_native_certs()
            .certs
            .iter()
            .map(|der| ureq::tls::Certificate::from_der(der.as_ref()).to_owned())
            .collect(),
    };
    Ok(ureq::tls::TlsConfig::builder()
        .provider(ureq::tls::TlsProvider::Rustls)
        .root_certs(ureq::tls::RootCerts::new_with_certs(&roots))
        .unversioned_rustls_crypto_provider(crate::platform::tls::provider())
        .build())
}

/// `error` from asking `url`, in plain words when TLS refused it.
fn refused(url: &str, ca_file: Option<&Path>, error: ureq::Error) -> anyhow::Error {
    let ca = ca_file.map_or_else(
        || "the machine's trusted CAs (or give --admin-ca-file)".to_owned(),
        |path| format!("--admin-ca-file {}", path.display()),
    );
    let reason = match &error {
        ureq::Error::Rustls(tls) => crate::platform::tls::refusal(tls, "the admin endpoint", &ca),
        ureq::Error::Io(io) => crate::platform::tls::refusal(io, "the admin endpoint", &ca),
        other => crate::platform::tls::refusal(other, "the admin endpoint", &ca),
    };
    match reason {
        Some(reason) => anyhow::anyhow!("asking {url}: {reason}"),
        None => anyhow::Error::new(error).context(format!("asking {url}")),
    }
}
