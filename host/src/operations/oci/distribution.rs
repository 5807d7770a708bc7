//! The registry requests of a pull (a manifest, a layer, a token) and of
//! a push (a blob's check and upload, a manifest's upload, a token), made
//! here with reqwest rather than through oci-client, which reads every
//! manifest, token answer and error body whole, with no bound, and sends
//! credentials to whatever token service a registry names. Pull and push
//! keep the same rules, here, in one place.
//!
//! Rules kept here:
//! - **Bounded before read.** Every body has a bound known before its
//!   first byte: a manifest (or image index) at most
//!   [`MAX_MANIFEST_BYTES_ENV`] (default [`DEFAULT_MAX_MANIFEST_BYTES`]), a
//!   layer at most the size its manifest gives (itself at most
//!   [`MAX_COMPONENT_BYTES`](crate::sandbox::runtime::component_file::MAX_COMPONENT_BYTES)),
//!   a token service's answer [`MAX_TOKEN_BYTES`], an error body
//!   [`MAX_ERROR_BYTES`]. A `Content-Length` over the bound is refused
//!   before the body is read; a body without one, or longer than it says,
//!   is cut at the bound and refused. The config blob is never read.
//!   A push reads no body but error bodies and the token service's
//!   answer, under the same bounds.
//! - **A total time bound.** A pull, a push, or a tag's lookup, ends within
//!   [`TIMEOUT_ENV`] (default [`DEFAULT_TIMEOUT`]) as a whole, however
//!   slowly the registry sends: a registry trickling bytes cannot hold a
//!   pull or a start-up. Besides, connecting waits at most 10 s and each
//!   read at most 60 s.
//! - **Credentials only to the registry or its own token service, over
//!   TLS.** Basic credentials go to a token service named by the
//!   registry's challenge only when it is on the registry's own host and
//!   spoken to over HTTPS, or when its origin (`scheme://host[:port]`) is
//!   listed in [`TOKEN_SERVICES_ENV`]; otherwise the pull stops with an
//!   error naming the token URL and that setting, and nothing is sent. A
//!   token asked anonymously carries nothing and goes where the registry
//!   says. A redirect that leaves the host drops the `Authorization`
//!   header (reqwest's rule).
//! - **Errors a person can act on.** A missing tag or repository names the
//!   reference and the registry, not the registry's raw text; what a
//!   registry's error body says is shown cut and escaped.

use std::sync::Mutex;
use std::time::Duration;

use oci_client::secrets::RegistryAuth;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue, LOCATION, WWW_AUTHENTICATE};
use reqwest::{Method, Response, StatusCode};

use super::{ModuleRef, OciError};

/// The variable bounding a manifest's bytes.
pub const MAX_MANIFEST_BYTES_ENV: &str = "WAKU_OCI_MAX_MANIFEST_BYTES";
/// A manifest's bound without it: 4 MiB, what registries accept at most.
pub const DEFAULT_MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// The variable bounding the time of a whole pull (humantime: `30s`, `5m`).
pub const TIMEOUT_ENV: &str = "WAKU_OCI_TIMEOUT";
/// A pull's time bound without it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// The variable listing token services credentials may go to besides
/// the registry's own (comma-separated origins, `https://auth.example`).
pub const TOKEN_SERVICES_ENV: &str = "WAKU_OCI_TOKEN_SERVICES";
/// The bound of a token service's answer.
pub const MAX_TOKEN_BYTES: u64 = 64 << 10;
/// The bound of an error body (only its start is shown).
pub const MAX_ERROR_BYTES: u64 = 16 << 10;

/// The manifest media types a pull accepts.
const MANIFEST_TYPES: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, \
                              application/vnd.docker.distribution.manifest.v2+json, \
                              application/vnd.docker.distribution.manifest.list.v2+json";

/// The bounds and allowances of a registry's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounds {
    /// The most bytes of a manifest.
    pub max_manifest_bytes: u64,
    /// The most time of a whole pull.
    pub timeout: Duration,
    /// Origins credentials may go to besides the registry's own token
    /// service over HTTPS.
    pub token_services: Vec<String>,
}

impl Bounds {
    /// From the variables' values (`None`: the default).
    pub fn parse(
        max_manifest_bytes: Option<&str>,
        timeout: Option<&str>,
        token_services: Option<&str>,
    ) -> Result<Self, OciError> {
        let setting = |name: &'static str, value: &str, reason: String| OciError::Setting {
            name,
            value: wakuwaku_core::terminal::printable(value).into_owned(),
            reason,
        };
        let max_manifest_bytes = match max_manifest_bytes {
            None => DEFAULT_MAX_MANIFEST_BYTES,
            Some(text) => text
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|bytes| *bytes > 0)
                .ok_or_else(|| setting(MAX_MANIFEST_BYTES_ENV, text, "a number of bytes above 0".to_owned()))?,
        };
        let timeout = match timeout {
            None => DEFAULT_TIMEOUT,
            Some(text) => humantime::parse_duration(text.trim())
                .ok()
                .filter(|time| !time.is_zero())
                .ok_or_else(|| setting(TIMEOUT_ENV, text, "a duration above 0, such as `30s` or `5m`".to_owned()))?,
        };
        let token_services = token_services
            .into_iter()
            .flat_map(|list| list.split(','))
            .map(|origin| origin.trim().trim_end_matches('/').to_owned())
            .filter(|origin| !origin.is_empty())
            .collect();
        Ok(Self { max_manifest_bytes, timeout, token_services })
    }

    /// From the process's environment.
    pub fn from_env() -> Result<Self, OciError> {
        let var = |name: &str| std::env::var(name).ok().filter(|value| !value.trim().is_empty());
        Self::parse(
            var(MAX_MANIFEST_BYTES_ENV).as_deref(),
            var(TIMEOUT_ENV).as_deref(),
            var(TOKEN_SERVICES_ENV).as_deref(),
        )
    }
}

/// What a request may do in its repository, as a token's scope says.
#[derive(Debug, Clone, Copy)]
enum Access {
    Pull,
    Push,
}

/// A registry's HTTP side for pulls and pushes: its base URL, credentials and the
/// authorization its challenge gave.
pub(super) struct Distribution {
    http: reqwest::Client,
    base: String,
    registry: String,
    credentials: RegistryAuth,
    pub(super) bounds: Bounds,
    authorization: Mutex<Option<HeaderValue>>,
}

impl Distribution {
    pub(super) fn new(
        registry: &str,
        plain: bool,
        credentials: RegistryAuth,
        bounds: Bounds,
    ) -> Result<Self, OciError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| OciError::Registry { registry: registry.to_owned(), reason: e.to_string() })?;
        let base = format!("{}://{registry}", if plain { "http" } else { "https" });
        Ok(Self { http, base, registry: registry.to_owned(), credentials, bounds, authorization: Mutex::new(None) })
    }

    fn unreachable(&self, error: reqwest::Error) -> OciError {
        OciError::Registry { registry: self.registry.clone(), reason: error.without_url().to_string() }
    }

    /// The bytes of the manifest `reference` names, bounded.
    pub(super) async fn manifest(&self, reference: &ModuleRef) -> Result<Vec<u8>, OciError> {
        let name = reference.digest().or(reference.tag()).unwrap_or("latest");
        let url = format!("{}/v2/{}/manifests/{name}", self.base, reference.repository());
        let response = self.get(reference, &url, Some(MANIFEST_TYPES)).await?;
        let response = self.successful(reference, response, "manifest").await?;
        let limit = self.bounds.max_manifest_bytes;
        self.bounded(response, limit, |length| OciError::TooLarge {
            reference: reference.to_string(),
            what: "manifest",
            limit,
            length,
            setting: Some(MAX_MANIFEST_BYTES_ENV),
        })
        .await
    }

    /// The layer `digest` of `reference`'s repository, of at most `size`
    /// bytes: a larger one is refused as `tampered`.
    pub(super) async fn layer(
        &self,
        reference: &ModuleRef,
        digest: &str,
        size: u64,
        tampered: impl Fn(String) -> OciError,
    ) -> Result<Vec<u8>, OciError> {
        let url = format!("{}/v2/{}/blobs/{digest}", self.base, reference.repository());
        let response = self.get(reference, &url, None).await?;
        let response = self.successful(reference, response, "layer").await?;
        self.bounded(response, size, |_| tampered(format!("more than the {size} bytes the manifest says"))).await
    }

    /// Uploads the blob `bytes` of digest `digest` to `reference`'s
    /// repository, unless the registry has it already.
    pub(super) async fn push_blob(
        &self,
        reference: &ModuleRef,
        digest: &str,
        bytes: bytes::Bytes,
    ) -> Result<(), OciError> {
        let repository = reference.repository();
        let url = format!("{}/v2/{repository}/blobs/{digest}", self.base);
        let held = self.request(reference, Method::HEAD, &url, None, None, Access::Push).await?;
        if held.status().is_success() {
            return Ok(());
        }
        let url = format!("{}/v2/{repository}/blobs/uploads/", self.base);
        let started = self.request(reference, Method::POST, &url, None, None, Access::Push).await?;
        let started = self.successful(reference, started, "upload").await?;
        let location = started.headers().get(LOCATION).and_then(|value| value.to_str().ok());
        let mut url = location
            .and_then(|location| reqwest::Url::parse(&self.base).ok()?.join(location).ok())
            .ok_or_else(|| OciError::Registry {
                registry: self.registry.clone(),
                reason: format!("it started an upload to `{reference}` without saying where (no Location)"),
            })?;
        url.query_pairs_mut().append_pair("digest", digest);
        let body = Some(("application/octet-stream", bytes));
        let put = self.request(reference, Method::PUT, url.as_str(), None, body, Access::Push).await?;
        self.successful(reference, put, "upload").await.map(drop)
    }

    /// Uploads the manifest `bytes` of type `media_type` as `reference`'s
    /// tag (or digest).
    pub(super) async fn push_manifest(
        &self,
        reference: &ModuleRef,
        media_type: &'static str,
        bytes: bytes::Bytes,
    ) -> Result<(), OciError> {
        let name = reference.tag().or(reference.digest()).unwrap_or("latest");
        let url = format!("{}/v2/{}/manifests/{name}", self.base, reference.repository());
        let put = self.request(reference, Method::PUT, &url, None, Some((media_type, bytes)), Access::Push).await?;
        self.successful(reference, put, "manifest upload").await.map(drop)
    }

    /// GETs `url`, answering the registry's challenge once.
    async fn get(&self, reference: &ModuleRef, url: &str, accept: Option<&str>) -> Result<Response, OciError> {
        self.request(reference, Method::GET, url, accept, None, Access::Pull).await
    }

    /// Sends `method` to `url` with `body` (its content type and bytes),
    /// answering the registry's challenge once, for a token allowing
    /// `access`. The `Authorization` goes only to the registry's own
    /// origin (an upload's Location may name another).
    async fn request(
        &self,
        reference: &ModuleRef,
        method: Method,
        url: &str,
        accept: Option<&str>,
        body: Option<(&'static str, bytes::Bytes)>,
        access: Access,
    ) -> Result<Response, OciError> {
        let own_origin = url == self.base || url.starts_with(&format!("{}/", self.base));
        let send = |authorization: Option<HeaderValue>| {
            let mut request = self.http.request(method.clone(), url);
            if let Some(accept) = accept {
                request = request.header(ACCEPT, accept);
            }
            if let Some((content_type, bytes)) = &body {
                request = request.header(CONTENT_TYPE, *content_type).body(bytes.clone());
            }
            if let Some(authorization) = authorization.filter(|_| own_origin) {
                request = request.header(AUTHORIZATION, authorization);
            }
            request.send()
        };
        let known = self.authorization.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let response = send(known.clone()).await.map_err(|e| self.unreachable(e))?;
        if response.status() != StatusCode::UNAUTHORIZED || known.is_some() {
            return Ok(response);
        }
        let challenge = response.headers().get(WWW_AUTHENTICATE).cloned();
        let Some(authorization) = self.authorize(reference, challenge.as_ref(), access).await? else {
            return Ok(response);
        };
        *self.authorization.lock().unwrap_or_else(|e| e.into_inner()) = Some(authorization.clone());
        send(Some(authorization)).await.map_err(|e| self.unreachable(e))
    }

    /// The `Authorization` answering `challenge`, if the credentials can.
    async fn authorize(
        &self,
        reference: &ModuleRef,
        challenge: Option<&HeaderValue>,
        access: Access,
    ) -> Result<Option<HeaderValue>, OciError> {
        use base64::Engine;
        let header = |text: String| HeaderValue::from_str(&text).ok();
        if let RegistryAuth::Bearer(token) = &self.credentials {
            return Ok(header(format!("Bearer {token}")));
        }
        let basic = match &self.credentials {
            RegistryAuth::Basic(user, password) => {
                Some(base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
            }
            _ => None,
        };
        let Some(challenge) = challenge.and_then(|value| value.to_str().ok()) else { return Ok(None) };
        let mut bearer = None;
        let mut basic_asked = false;
        for parsed in http_auth::ChallengeParser::new(challenge).flatten() {
            if parsed.scheme.eq_ignore_ascii_case("basic") {
                basic_asked = true;
            } else if parsed.scheme.eq_ignore_ascii_case("bearer") {
                let param = |name: &str| {
                    parsed.params.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, v)| v.to_unescaped())
                };
                if let Some(realm) = param("realm") {
                    bearer = Some((realm, param("service")));
                }
            }
        }
        let Some((realm, service)) = bearer else {
            return Ok(basic.filter(|_| basic_asked).and_then(|basic| header(format!("Basic {basic}"))));
        };
        if basic.is_some() {
            self.check_token_service(&realm)?;
        }
        let actions = match access {
            Access::Pull => "pull",
            Access::Push => "pull,push",
        };
        let scope = format!("repository:{}:{actions}", reference.repository());
        let mut query = vec![("scope", scope)];
        query.extend(service.map(|service| ("service", service)));
        let mut request = self.http.get(realm.as_str()).query(&query);
        if let Some(basic) = &basic {
            request = request.header(AUTHORIZATION, format!("Basic {basic}"));
        }
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        if !response.status().is_success() {
            return Err(OciError::Denied {
                reference: reference.to_string(),
                registry: self.registry.clone(),
                status: response.status().as_u16(),
            });
        }
        let body = self
            .bounded(response, MAX_TOKEN_BYTES, |length| OciError::TooLarge {
                reference: reference.to_string(),
                what: "token service's answer",
                limit: MAX_TOKEN_BYTES,
                length,
                setting: None,
            })
            .await?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let token: Token = serde_json::from_slice(&body).map_err(|_| OciError::Registry {
            registry: self.registry.clone(),
            reason: format!("the token service {realm} answered no token"),
        })?;
        Ok(token.token.or(token.access_token).and_then(|token| header(format!("Bearer {token}"))))
    }

    /// Refuses a token service `realm` credentials must not go to.
    fn check_token_service(&self, realm: &str) -> Result<(), OciError> {
        let refused = |why: &'static str, origin: String| OciError::TokenService {
            registry: self.registry.clone(),
            realm: wakuwaku_core::terminal::printable(realm).into_owned(),
            why,
            origin,
        };
        let Ok(url) = reqwest::Url::parse(realm) else {
            return Err(refused("which is not a URL", realm.to_owned()));
        };
        let origin = url.origin().ascii_serialization();
        if self.bounds.token_services.contains(&origin) {
            return Ok(());
        }
        let registry_host = reqwest::Url::parse(&self.base).ok().and_then(|base| base.host_str().map(str::to_owned));
        if url.host_str().map(str::to_ascii_lowercase) != registry_host.map(|host| host.to_ascii_lowercase()) {
            return Err(refused("on another host than the registry", origin));
        }
        if url.scheme() != "https" {
            return Err(refused("over plain HTTP", origin));
        }
        Ok(())
    }

    /// `response` if it succeeded; else the error it means for `what`.
    async fn successful(&self, reference: &ModuleRef, response: Response, what: &str) -> Result<Response, OciError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            return Err(OciError::Denied {
                reference: reference.to_string(),
                registry: self.registry.clone(),
                status: status.as_u16(),
            });
        }
        let body = self.bounded(response, MAX_ERROR_BYTES, |_| OciError::Registry {
            registry: String::new(),
            reason: String::new(),
        });
        let body = body.await.unwrap_or_default();
        let codes = error_codes(&body);
        if status == StatusCode::NOT_FOUND && what == "manifest" {
            let missing = match codes.first().map(|(code, _)| code.as_str()) {
                Some("NAME_UNKNOWN") => "repository",
                Some("MANIFEST_UNKNOWN") if reference.digest().is_some() => "manifest",
                Some("MANIFEST_UNKNOWN") => "tag",
                _ => "tag or repository",
            };
            return Err(OciError::NotFound {
                reference: reference.to_string(),
                registry: self.registry.clone(),
                missing,
            });
        }
        let said = codes.first().map(|(code, message)| format!(": {code} {message}")).unwrap_or_default();
        let said: String = said.chars().take(200).collect();
        Err(OciError::Registry {
            registry: self.registry.clone(),
            reason: format!(
                "asked for the {what} of `{reference}`, it answered HTTP {}{}",
                status.as_u16(),
                wakuwaku_core::terminal::printable(&said)
            ),
        })
    }

    /// The body of `response`, refused by `too_large` (given the
    /// `Content-Length` when it says) past `limit` bytes.
    async fn bounded(
        &self,
        mut response: Response,
        limit: u64,
        too_large: impl Fn(Option<u64>) -> OciError,
    ) -> Result<Vec<u8>, OciError> {
        let length = response.content_length();
        if let Some(length) = length
            && length > limit
        {
            return Err(too_large(Some(length)));
        }
        let mut body = Vec::with_capacity(length.unwrap_or(0).min(limit) as usize);
        while let Some(chunk) = response.chunk().await.map_err(|e| self.unreachable(e))? {
            if (body.len() + chunk.len()) as u64 > limit {
                return Err(too_large(None));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// The `code` and `message` of each error of a registry's error body.
fn error_codes(body: &[u8]) -> Vec<(String, String)> {
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<Error>,
    }
    #[derive(serde::Deserialize)]
    struct Error {
        code: String,
        #[serde(default)]
        message: String,
    }
    serde_json::from_slice::<Errors>(body)
        .map(|errors| errors.errors.into_iter().map(|e| (e.code, e.message)).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_have_defaults_and_refuse_bad_values() {
        let defaults = Bounds::parse(None, None, None).unwrap();
        assert_eq!((defaults.max_manifest_bytes, defaults.timeout), (DEFAULT_MAX_MANIFEST_BYTES, DEFAULT_TIMEOUT));
        let set = Bounds::parse(Some("1024"), Some("2s"), Some("https://auth.example/, http://a:1")).unwrap();
        assert_eq!((set.max_manifest_bytes, set.timeout), (1024, Duration::from_secs(2)));
        assert_eq!(set.token_services, ["https://auth.example", "http://a:1"]);
        let error = Bounds::parse(Some("0"), None, None).unwrap_err().to_string();
        assert!(error.contains(MAX_MANIFEST_BYTES_ENV), "{error}");
        let error = Bounds::parse(None, Some("soon"), None).unwrap_err().to_string();
        assert!(error.contains(TIMEOUT_ENV), "{error}");
    }
}
