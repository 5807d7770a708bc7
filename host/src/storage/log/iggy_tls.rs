//! Iggy over TLS: the URL options of the Iggy client itself, and a
//! handshake of the host's own that says why the client's was refused.
//!
//! The `iggy` client takes TLS from its connection string:
//! `iggy://user:password@host:port?tls=true&tls_ca_file=/etc/waku/iggy-ca.pem&tls_domain=iggy.example`.
//! - `tls=true` turns TLS on (the server's `IGGY_TCP_TLS_ENABLED`);
//! - `tls_ca_file` names the trusted CAs (PEM); without it the client
//!   trusts the public web's CAs (Mozilla's list, `webpki-roots`);
//! - `tls_domain` is the name the certificate must hold; without it, the
//!   URL's host.
//!
//! The certificate is always checked, chain and name. When the client
//! fails to connect it says only that it could not (its reason goes to
//! its own log), so [`IggyTls::explain`] makes the same handshake with the
//! same CAs and name and turns a refusal into plain words
//! ([`crate::platform::tls::refusal`]): an unknown CA, a certificate for other
//! names, a server that speaks no TLS. It runs only after a failed
//! connect, so a working connection costs nothing more.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;

use crate::platform::tls::{self, ServerCheck};

/// The TLS options of an Iggy URL with `tls=true`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IggyTls {
    /// `host:port`.
    pub address: String,
    /// `tls_ca_file`.
    pub ca_file: Option<PathBuf>,
    /// `tls_domain`, else the URL's host.
    pub domain: String,
}

/// How long the explaining handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl IggyTls {
    /// The TLS options of `url`; `None` unless it says `tls=true`.
    pub fn of_url(url: &str) -> Option<Self> {
        let after_credentials = url.rsplit_once('@').map_or(url, |(_, rest)| rest);
        let after_scheme = after_credentials.split_once("://").map_or(after_credentials, |(_, rest)| rest);
        let (address, query) = after_scheme.split_once('?')?;
        let option = |name: &str| {
            query.split('&').find_map(|pair| pair.strip_prefix(name).and_then(|rest| rest.strip_prefix('=')))
        };
        if option("tls") != Some("true") {
            return None;
        }
        let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
        let domain = option("tls_domain").filter(|domain| !domain.is_empty()).unwrap_or(host);
        Some(Self {
            address: address.to_owned(),
            ca_file: option("tls_ca_file").map(PathBuf::from),
            domain: domain.trim_start_matches('[').trim_end_matches(']').to_owned(),
        })
    }

    /// Where the trusted CAs come from, for messages.
    pub fn roots_named(&self) -> String {
        match &self.ca_file {
            Some(path) => format!("tls_ca_file={}", path.display()),
            None => "the public CAs the Iggy client trusts without tls_ca_file".to_owned(),
        }
    }

    /// Why a TLS connection to the server is refused, by a handshake of
    /// the host's own with the client's CAs and name; `None` when the
    /// handshake succeeds or the server cannot be reached at all (the
    /// client's own error says that).
    pub async fn explain(&self) -> Option<String> {
        let roots = match &self.ca_file {
            Some(path) => match tls::read_roots(path) {
                Ok(roots) => roots,
                Err(error) => return Some(error.to_string()),
            },
            None => rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() },
        };
        let name = match ServerName::try_from(self.domain.clone()) {
            Ok(name) => name,
            Err(_) => return Some(format!("`{}` is no host name or address (tls_domain)", self.domain)),
        };
        let config = tls::client_config(&ServerCheck::Full(Arc::new(roots)), None).ok()?;
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let handshake = async {
            let stream = tokio::net::TcpStream::connect(&self.address).await.ok()?;
            connector.connect(name, stream).await.err()
        };
        let error = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await.ok()??;
        let peer = format!("the Iggy server at {}", self.address);
        Some(tls::refusal(&error, &peer, &self.roots_named()).unwrap_or_else(|| {
            format!("{peer} closed the connection during the TLS handshake ({error}; is TLS on at the server?)")
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_options_are_read_as_the_iggy_client_reads_them() {
        assert_eq!(IggyTls::of_url("iggy://u:p@h:8090"), None);
        assert_eq!(IggyTls::of_url("iggy://u:p@h:8090?tls=false&tls_ca_file=/ca.pem"), None);
        assert_eq!(
            IggyTls::of_url("iggy://u:p@ss@iggy.example:8090?reconnection_retries=3&tls=true&tls_ca_file=/ca.pem"),
            Some(IggyTls {
                address: "iggy.example:8090".into(),
                ca_file: Some("/ca.pem".into()),
                domain: "iggy.example".into()
            })
        );
        let named = IggyTls::of_url("iggy+tcp://u:p@127.0.0.1:8090?tls=true&tls_domain=iggy.example").unwrap();
        assert_eq!(
            (named.address.as_str(), named.domain.as_str(), named.ca_file),
            ("127.0.0.1:8090", "iggy.example", None)
        );
    }

    /// Against the TLS Iggy server named by `WAKU_IGGY_TLS_URL` (its
    /// options `tls=true&tls_ca_file=…&tls_domain=<the certificate's name>`,
    /// reached by an address the certificate does not name): records go
    /// both ways over TLS, and a wrong CA and a wrong name are each refused
    /// at connect with their reason.
    #[tokio::test]
    async fn a_tls_server_is_reached_with_its_ca_and_name_and_refused_with_others() {
        use crate::storage::log::{EventLog, LogError, Record};
        let Ok(url) = std::env::var("WAKU_IGGY_TLS_URL") else {
            eprintln!("skipped: the Iggy TLS test needs a TLS Iggy server named by WAKU_IGGY_TLS_URL");
            return;
        };
        let tls = IggyTls::of_url(&url).expect("WAKU_IGGY_TLS_URL says tls=true");
        let stream = format!("waku-tls-{}", std::process::id());
        let log = crate::storage::log::IggyLog::connect(&url, &stream).await.unwrap();
        log.create_topic("t", 1).await.unwrap();
        log.append("t", vec![(0, vec![Record { headers: vec![], body: b"over tls".to_vec() }])]).await.unwrap();
        let read = log.read("t", 0, 0, 10).await.unwrap();
        assert_eq!(read.first().map(|stored| stored.record.body.as_slice()), Some(&b"over tls"[..]));

        let without_name = url.replace(&format!("&tls_domain={}", tls.domain), "");
        assert_ne!(without_name, url, "WAKU_IGGY_TLS_URL ends its options with tls_domain");
        let error = crate::storage::log::IggyLog::connect(&without_name, &stream).await.err().expect("a wrong name");
        assert!(matches!(&error, LogError::Tls { reason, .. } if reason.contains("not valid for the name")), "{error}");

        let other = crate::platform::tls::test_pki::make(&[&tls.domain]);
        let ca = tls.ca_file.as_ref().expect("WAKU_IGGY_TLS_URL names tls_ca_file").display().to_string();
        let other_ca = url.replace(&ca, &other.ca.display().to_string());
        let error = crate::storage::log::IggyLog::connect(&other_ca, &stream).await.err().expect("an unknown CA");
        assert!(matches!(&error, LogError::Tls { reason, .. } if reason.contains("not signed by a CA")), "{error}");
        assert!(!error.to_string().contains(":iggy@"), "the password is masked: {error}");
    }

    #[tokio::test]
    async fn an_unreadable_ca_file_is_named() {
        let tls = IggyTls::of_url("iggy://u:p@127.0.0.1:1?tls=true&tls_ca_file=/nonexistent/ca.pem").unwrap();
        let reason = tls.explain().await.unwrap();
        assert!(reason.contains("CA file /nonexistent/ca.pem"), "{reason}");
    }

    #[tokio::test]
    async fn a_server_signed_by_another_ca_or_for_another_name_is_refused_saying_which() {
        // A TLS server of the test's own, with a certificate for `localhost`.
        let served = crate::platform::tls::test_pki::make(&["localhost"]);
        let config = crate::platform::tls::server_config(&served.cert, &served.key).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move { drop(acceptor.accept(stream).await) });
            }
        });
        let url = |options: String| format!("iggy://u:p@127.0.0.1:{port}?tls=true&{options}");
        let ca = served.ca.display();
        let good = IggyTls::of_url(&url(format!("tls_ca_file={ca}&tls_domain=localhost"))).unwrap();
        assert_eq!(good.explain().await, None, "the right CA and name pass");
        let wrong_name = IggyTls::of_url(&url(format!("tls_ca_file={ca}"))).unwrap().explain().await.unwrap();
        assert!(wrong_name.contains("not valid for the name `127.0.0.1`"), "{wrong_name}");
        let other = crate::platform::tls::test_pki::make(&["localhost"]);
        let options = format!("tls_ca_file={}&tls_domain=localhost", other.ca.display());
        let wrong_ca = IggyTls::of_url(&url(options)).unwrap().explain().await.unwrap();
        assert!(wrong_ca.contains("not signed by a CA in tls_ca_file="), "{wrong_ca}");
        // A plain server: no TLS answer.
        let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let plain_port = plain.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = plain.accept().await {
                use tokio::io::AsyncWriteExt;
                let _ = stream.write_all(b"\x00\x00\x00\x04nope").await;
            }
        });
        let tls = IggyTls::of_url(&format!("iggy://u:p@127.0.0.1:{plain_port}?tls=true&tls_ca_file={ca}")).unwrap();
        let reason = tls.explain().await.unwrap();
        assert!(reason.contains("TLS"), "{reason}");
    }
}
