//! TLS for the host's links: the PostgreSQL connections
//! ([`crate::storage::state::postgres::tls`]), the check that explains a refused
//! Iggy handshake ([`crate::storage::log::iggy`]), the admin endpoint's server side
//! ([`crate::operations::admin`]) and the commands that ask it.
//!
//! Rules kept here:
//! - **One crypto provider, named.** rustls is built with both of its
//!   providers in this binary (the `iggy` crate brings aws-lc-rs, others
//!   ring), so it cannot pick one by itself: every configuration here is
//!   built with [`provider`] (aws-lc-rs, the one the Iggy client installs).
//! - **Three ways to check a server**, as PostgreSQL's `sslmode` has them
//!   ([`ServerCheck`]): not at all (the link is private against a reader,
//!   not against someone in the middle), the chain only (signed by a
//!   trusted CA, any name), or the chain and the name. The handshake's
//!   signatures are checked in every case.
//! - **Files are read whole and named in errors**; a key file its group
//!   or others may read draws a warning ([`warn_if_readable_by_others`]),
//!   and a key's bytes never show in an error or a log line.
//! - **A refused handshake is said in plain words** ([`refusal`]): an
//!   unknown CA, a name the certificate does not hold, an expired
//!   certificate, or a peer that speaks no TLS.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

/// Why a TLS configuration could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read the {what} {}", path.display())]
    Read {
        /// What the file was to hold (`CA file`, `certificate`, `private key`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no PEM section of the kind it was named for, or a
    /// damaged one.
    #[error("the {what} {} holds no readable PEM {kind} ({reason})", path.display())]
    Pem {
        /// What the file was to hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The section looked for (`CERTIFICATE`, `PRIVATE KEY`).
        kind: &'static str,
        /// What the PEM reader said.
        reason: String,
    },
    /// rustls refused a certificate or key (one it cannot use, or a key
    /// that is not the certificate's).
    #[error("the {what} cannot be used: {source}{}", version_hint(.source))]
    Refused {
        /// What was refused, with its file.
        what: String,
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// The machine's trusted CAs (`sslrootcert=system`) could not be read.
    #[error("cannot read the system's trusted CAs: {reason}")]
    SystemRoots {
        /// Why.
        reason: String,
    },
}

/// The crypto provider every configuration here is built with.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// How a client checks the server it reached.
#[derive(Debug, Clone)]
pub enum ServerCheck {
    /// No check of the certificate: encrypted, but anyone in the middle
    /// can pose as the server (PostgreSQL's `prefer` and `require`).
    Nothing,
    /// The certificate chains to one of these CAs; its names are not
    /// looked at (`verify-ca`).
    Chain(Arc<RootCertStore>),
    /// The certificate chains to one of these CAs and names the host
    /// connected to (`verify-full`).
    Full(Arc<RootCertStore>),
}

/// The CAs in the PEM file at `path` (one or more certificates).
pub fn read_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let certificates = read_certificates(path, "CA file")?;
    let mut roots = RootCertStore::empty();
    for certificate in certificates {
        roots
            .add(certificate)
            .map_err(|source| TlsError::Refused { what: format!("CA file {}", path.display()), source })?;
    }
    Ok(roots)
}

/// The machine's trusted CAs, as its TLS library finds them.
pub fn system_roots() -> Result<RootCertStore, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let reason = found.errors.first().map_or_else(|| "none found".to_owned(), ToString::to_string);
        return Err(TlsError::SystemRoots { reason });
    }
    Ok(roots)
}

/// The certificates in the PEM file at `path`, at least one.
pub fn read_certificates(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(path, what)?;
    let pem = |reason: String| TlsError::Pem { what, path: path.to_owned(), kind: "CERTIFICATE", reason };
    let certificates: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&bytes).collect::<Result<_, _>>().map_err(|e| pem(e.to_string()))?;
    if certificates.is_empty() {
        return Err(pem("none found".to_owned()));
    }
    Ok(certificates)
}

/// The private key in the PEM file at `path` (PKCS#8, PKCS#1 or SEC1).
/// Callers warn of a file others may read ([`warn_if_readable_by_others`]),
/// each where its user looks.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(path, "private key")?;
    // The PEM reader's errors quote no bytes of the file.
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| TlsError::Pem {
        what: "private key",
        path: path.to_owned(),
        kind: "PRIVATE KEY",
        reason: e.to_string(),
    })
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { what, path: path.to_owned(), source })
}

/// Logs a warning when the file at `path`, holding a secret (`what`), may
/// be read by its group or by others.
pub fn warn_if_readable_by_others(path: &Path, what: &str) {
    if crate::platform::files::readable_by_others(path) {
        tracing::warn!(file = %path.display(), "the {what} file is readable by its group or others; `chmod 600` it");
    }
}

/// A client configuration checking the server as `check` says, and
/// presenting `identity` (certificate chain, key) when given.
pub fn client_config(
    check: &ServerCheck,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<ClientConfig, TlsError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("the provider supports the default protocol versions");
    let builder = match check {
        ServerCheck::Full(roots) => builder.with_root_certificates(roots.clone()),
        ServerCheck::Chain(roots) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NamesUnchecked { roots: Some(roots.clone()), provider })),
        ServerCheck::Nothing => {
            builder.dangerous().with_custom_certificate_verifier(Arc::new(NamesUnchecked { roots: None, provider }))
        }
    };
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|source| TlsError::Refused { what: "client certificate and key".to_owned(), source }),
    }
}

/// How to fix a certificate rustls refuses for being X.509 v1 (what
/// `openssl x509 -req` makes when given no extension), else nothing.
fn version_hint(error: &rustls::Error) -> &'static str {
    // webpki's error sits behind rustls' `OtherError`; its name is the
    // only handle without depending on webpki itself.
    match error {
        rustls::Error::InvalidCertificate(CertificateError::Other(other))
            if format!("{other:?}").contains("UnsupportedCertVersion") =>
        {
            " (an X.509 v1 certificate; rustls takes v3 only: sign it with an extension, e.g. \
             `openssl x509 -req … -extfile FILE` with FILE holding `extendedKeyUsage=clientAuth`)"
        }
        _ => "",
    }
}

/// A server configuration presenting the chain in `certificate` with the
/// key in `key` (both PEM files).
pub fn server_config(certificate: &Path, key: &Path) -> Result<ServerConfig, TlsError> {
    let chain = read_certificates(certificate, "certificate")?;
    let key_der = read_key(key)?;
    ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("the provider supports the default protocol versions")
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|source| TlsError::Refused {
            what: format!("certificate {} with key {}", certificate.display(), key.display()),
            source,
        })
}

/// Checks a server's chain against `roots` and not its names
/// ([`ServerCheck::Chain`]), or with no roots takes any certificate
/// ([`ServerCheck::Nothing`]); either way the handshake must be signed by
/// the certificate's key.
#[derive(Debug)]
struct NamesUnchecked {
    roots: Option<Arc<RootCertStore>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for NamesUnchecked {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let certificate = rustls::server::ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &certificate,
                roots,
                intermediates,
                now,
                self.provider.signature_verification_algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// The TLS error somewhere in `error`'s chain (rustls errors travel
/// inside `std::io::Error`s, whose `source` skips them).
pub fn find_rustls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(found) = error.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        if let Some(found) = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(found);
        }
        next = error.source();
    }
    None
}

/// Why a handshake with `peer` was refused, in plain words, when `error`
/// holds a TLS error; `ca` names where the trusted CAs came from.
pub fn refusal(error: &(dyn std::error::Error + 'static), peer: &str, ca: &str) -> Option<String> {
    let error = find_rustls_error(error)?;
    Some(match error {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            format!("the certificate of {peer} is not signed by a CA in {ca} (unknown issuer)")
        }
        rustls::Error::InvalidCertificate(CertificateError::BadSignature) => format!(
            "the certificate of {peer} is not signed by a CA in {ca} (one there has its issuer's name, not its key)"
        ),
        rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext { expected, presented }) => {
            format!(
                "the certificate of {peer} is not valid for the name `{}` the host connected to (it names {}); \
                 connect by one of those names",
                expected.to_str(),
                presented.join(", ")
            )
        }
        rustls::Error::InvalidCertificate(CertificateError::NotValidForName) => {
            format!("the certificate of {peer} is not valid for the name the host connected to")
        }
        rustls::Error::InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. }) => {
            format!("the certificate of {peer} has expired")
        }
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. },
        ) => format!("the certificate of {peer} is not valid yet (check the clocks)"),
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            format!("{peer} did not answer in TLS (is TLS on at the server?)")
        }
        other => format!("the TLS handshake with {peer} failed: {other}"),
    })
}

/// A CA and a server certificate signed by it, made for a test.
#[cfg(test)]
pub(crate) mod test_pki {
    use std::path::PathBuf;

    /// The files of a test CA and of a certificate it signed.
    pub(crate) struct TestPki {
        /// Holds the files.
        pub(crate) _dir: tempfile::TempDir,
        /// The CA's certificate (PEM).
        pub(crate) ca: PathBuf,
        /// The server's certificate (PEM).
        pub(crate) cert: PathBuf,
        /// Its key (PEM, mode 0600).
        pub(crate) key: PathBuf,
    }

    /// A fresh CA, and a certificate for `names` (DNS names or IP
    /// addresses) signed by it.
    pub(crate) fn make(names: &[&str]) -> TestPki {
        let dir = tempfile::tempdir().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "waku test CA");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|name| name.to_string()).collect::<Vec<_>>()).unwrap();
        let cert = params.signed_by(&key, &ca).unwrap();
        let write = |name: &str, text: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let (ca, cert, key) =
            (write("ca.pem", ca.pem()), write("cert.pem", cert.pem()), write("key.pem", key.serialize_pem()));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        TestPki { _dir: dir, ca, cert, key }
    }
}
