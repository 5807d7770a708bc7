//! Modules from an OCI registry: pushing a component as a Wasm OCI
//! artifact, pulling one by tag or by digest, and the references a
//! projection's modules are named by ([`pins`]).
//!
//! Rules kept here:
//! - **The Wasm OCI artifact layout**, as `wkg oci push` (wasm-pkg-tools)
//!   writes it: an image manifest whose config has media type
//!   [`WASM_CONFIG_MEDIA_TYPE`] and whose one layer, of media type
//!   [`WASM_LAYER_MEDIA_TYPE`], is the component's bytes as they are. A
//!   pull refuses any other manifest, so a container image is never taken
//!   for a module.
//! - **Verified against the digest.** A pull by digest refuses a manifest
//!   with another digest; every pull refuses a layer whose bytes do not
//!   hash to the digest the manifest names, or that is larger than it says
//!   or than [`MAX_COMPONENT_BYTES`]: a registry (or what sits between) that
//!   serves other bytes is refused, never run. The layer digest is the
//!   SHA-256 of the component, so the version the host records for it
//!   ([`crate::sandbox::runtime::content_version`]) is that digest's first 16 hex
//!   digits: a recorded version names what was pulled.
//! - **Credentials never on the command line**: from `WAKU_OCI_USERNAME`
//!   and `WAKU_OCI_PASSWORD`, else a Docker-style `config.json`
//!   ([`credentials`]), else anonymous.
//! - **HTTPS, except on loopback or on request.** A registry on a loopback
//!   address (`127.0.0.0/8`, `[::1]`, `localhost`) is spoken to in plain
//!   HTTP, and so is one listed in `WAKU_OCI_PLAIN_HTTP` (comma-separated
//!   `host:port`s); every other registry only over HTTPS.
//! - **A pull is bounded and checked before it writes.** Its requests
//!   are bounded in bytes and in total time, and credentials go only to
//!   the registry's own token service over TLS unless allowed
//!   ([`distribution`]). A pulled layer must be a component that loads
//!   ([`check_loads`], what `waku modules push` checks) before it replaces
//!   anything; a module file is written in one rename, with the ordinary
//!   mode (0644 under the usual umask).
//! - **A push keeps a pull's rules.** Its requests go through
//!   [`distribution`] too: the same bounds on what it reads (a token
//!   service's answer, error bodies), the same total time bound, the same
//!   token-service rule; the manifest digest it reports is the SHA-256 of
//!   the manifest it sent, not a second answer of the registry.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciImageManifest, OciManifest};
use sha2::{Digest, Sha256};

use crate::sandbox::runtime::component_file::MAX_COMPONENT_BYTES;

pub(crate) mod credentials;
pub(crate) mod distribution;
pub mod pins;

/// The config media type of a Wasm OCI artifact.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";

/// The media type of its layer: a component's bytes.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";

/// The environment variable listing registries spoken to in plain HTTP.
pub const PLAIN_HTTP_ENV: &str = "WAKU_OCI_PLAIN_HTTP";

/// The scheme of a module reference.
pub const SCHEME: &str = "oci://";

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OciError {
    /// The reference does not parse.
    #[error("`{reference}` is not a module reference (oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]): {reason}")]
    BadReference {
        /// The reference as given.
        reference: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The registry refused, or could not be reached.
    #[error("registry `{registry}`: {reason}")]
    Registry {
        /// The registry.
        registry: String,
        /// What it said, or why it could not be asked.
        reason: String,
    },
    /// What the reference names is not a Wasm component artifact.
    #[error("`{reference}` is not a Wasm component artifact: {reason}")]
    NotAComponent {
        /// The reference.
        reference: String,
        /// Why.
        reason: String,
    },
    /// The bytes served are not the ones the digest names.
    #[error(
        "`{reference}`: the registry served {what} that does not match its digest {expected} (got {actual}); refused"
    )]
    Tampered {
        /// The reference.
        reference: String,
        /// The manifest or the layer.
        what: &'static str,
        /// The digest asked for.
        expected: String,
        /// The digest of what was served.
        actual: String,
    },
    /// A file to push is not a component.
    #[error("{0}")]
    NotAComponentFile(String),
    /// The credentials cannot be read.
    #[error(transparent)]
    Credentials(#[from] credentials::CredentialsError),
    /// A setting's value is not one.
    #[error("{name}={value:?} is not {reason}")]
    Setting {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it must be.
        reason: String,
    },
    /// Something the registry sent is over its bound.
    #[error(
        "`{reference}`: the registry's {what} is over the bound of {limit} bytes{}{}; refused",
        length.map(|length| format!(" (it says {length})")).unwrap_or_default(),
        setting.map(|name| format!(", which {name} sets")).unwrap_or_default()
    )]
    TooLarge {
        /// The reference.
        reference: String,
        /// What was being read.
        what: &'static str,
        /// The bound.
        limit: u64,
        /// The length the registry gave, if it gave one.
        length: Option<u64>,
        /// The setting that changes the bound, if one does.
        setting: Option<&'static str>,
    },
    /// The whole pull (or push) took over its time bound.
    #[error(
        "{doing} `{reference}` {} registry `{registry}` took over {}, the bound {} sets; stopped",
        if *doing == "pushing" { "to" } else { "from" }, humantime::format_duration(*limit), distribution::TIMEOUT_ENV
    )]
    TimedOut {
        /// `pulling` or `pushing`.
        doing: &'static str,
        /// The reference.
        reference: String,
        /// The registry.
        registry: String,
        /// The bound.
        limit: std::time::Duration,
    },
    /// The registry has no such tag, repository or manifest.
    #[error(
        "registry `{registry}` has no {missing} for `{reference}`; check the reference (`waku modules push` puts one \
         there)"
    )]
    NotFound {
        /// The reference.
        reference: String,
        /// The registry.
        registry: String,
        /// What is missing: `tag`, `repository`, `manifest`, or `tag or repository`.
        missing: &'static str,
    },
    /// The registry refused access.
    #[error(
        "registry `{registry}` refused access to `{reference}` (HTTP {status}); check {} and {} or the \
         Docker config.json entry",
        credentials::USERNAME_ENV,
        credentials::PASSWORD_ENV
    )]
    Denied {
        /// The reference.
        reference: String,
        /// The registry.
        registry: String,
        /// The HTTP status.
        status: u16,
    },
    /// The registry names a token service credentials must not go to.
    #[error(
        "registry `{registry}` asks for credentials at the token service {realm}, {why}; they were not sent (to \
         allow it, add `{origin}` to {})",
        distribution::TOKEN_SERVICES_ENV
    )]
    TokenService {
        /// The registry.
        registry: String,
        /// The token URL, escaped.
        realm: String,
        /// Why it is refused.
        why: &'static str,
        /// The origin that would allow it.
        origin: String,
    },
    /// The pulled (or pushed) component does not load.
    #[error("`{reference}`: the component does not load, so nothing was written: {reason}")]
    DoesNotLoad {
        /// The reference.
        reference: String,
        /// Why, as loading says.
        reason: String,
    },
}

/// A module reference: `oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`.
/// Without a tag or digest the tag is `latest`. The module it names is
/// the last segment of the repository (`oci://r/team/bank:v1` names
/// `bank`, pulled into `bank.wasm`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ModuleRef {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<String>,
}

impl ModuleRef {
    /// The registry (`host[:port]`).
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The repository.
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The tag, if it names one.
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The manifest digest, if it names one.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// The module it names: the repository's last segment.
    pub fn module(&self) -> &str {
        self.repository.rsplit('/').next().unwrap_or(&self.repository)
    }

    /// The same repository at manifest `digest` (the tag kept, for show).
    pub fn at_digest(&self, digest: &str) -> Self {
        Self { digest: Some(digest.to_owned()), ..self.clone() }
    }
}

impl fmt::Display for ModuleRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl FromStr for ModuleRef {
    type Err = OciError;

    fn from_str(text: &str) -> Result<Self, OciError> {
        let bad = |reason: &str| OciError::BadReference { reference: text.to_owned(), reason: reason.to_owned() };
        let rest = text.strip_prefix(SCHEME).ok_or_else(|| bad("it must start with oci://"))?;
        let (registry, path) = rest.split_once('/').ok_or_else(|| bad("it names no repository"))?;
        let registry_ok =
            !registry.is_empty() && registry.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b));
        if !registry_ok {
            return Err(bad("the registry must be a host name or address, with an optional :port"));
        }
        let (path, digest) = match path.split_once('@') {
            Some((path, digest)) => (path, Some(digest)),
            None => (path, None),
        };
        if let Some(digest) = digest {
            let hex = digest.strip_prefix("sha256:").ok_or_else(|| bad("the digest must be sha256:<64 hex digits>"))?;
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                return Err(bad("the digest must be sha256:<64 lowercase hex digits>"));
            }
        }
        let (repository, tag) = match path.rsplit_once(':') {
            Some((repository, tag)) if !tag.contains('/') => (repository, Some(tag)),
            _ => (path, None),
        };
        let segment_ok = |segment: &str| {
            !segment.is_empty()
                && segment.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && segment.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        };
        if repository.len() > 255 || !repository.split('/').all(segment_ok) {
            return Err(bad("the repository must be lowercase letters, digits, `.`, `_`, `-`, in `/` segments"));
        }
        if let Some(tag) = tag {
            let tag_ok = (1..=128).contains(&tag.len())
                && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                && !tag.starts_with(['.', '-']);
            if !tag_ok {
                return Err(bad("the tag must be 1 to 128 letters, digits, `.`, `_`, `-`"));
            }
        }
        Ok(Self {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            tag: tag.map(str::to_owned),
            digest: digest.map(str::to_owned),
        })
    }
}

/// What a push or pull found: the manifest's digest and the layer's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// The manifest digest (`sha256:…`): what `@…` pins.
    pub manifest: String,
    /// The layer digest: the SHA-256 of the component.
    pub layer: String,
}

/// A component pulled from a registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// Its digests.
    pub artifact: Artifact,
    /// The component's bytes, verified against the layer digest.
    pub bytes: Vec<u8>,
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// Whether `registry` (`host[:port]`) is spoken to in plain HTTP: it is on
/// loopback, or `plain_http` (the value of [`PLAIN_HTTP_ENV`]) lists it.
pub fn plain_http(registry: &str, plain_http: Option<&str>) -> bool {
    let host = match registry.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or(""),
        None => registry.rsplit_once(':').map_or(registry, |(host, _)| host),
    };
    let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    loopback || plain_http.is_some_and(|list| list.split(',').any(|listed| listed.trim() == registry))
}

/// A registry client: one per operation's registry.
pub struct Registry {
    registry: String,
    distribution: distribution::Distribution,
}

impl Registry {
    /// A client for `registry`, with its credentials and protocol from the
    /// environment ([`credentials`], [`plain_http`]).
    pub fn for_registry(registry: &str) -> Result<Self, OciError> {
        let plain = plain_http(registry, std::env::var(PLAIN_HTTP_ENV).ok().as_deref());
        let auth = credentials::for_registry(registry)?;
        let distribution = distribution::Distribution::new(registry, plain, auth, distribution::Bounds::from_env()?)?;
        Ok(Self { registry: registry.to_owned(), distribution })
    }

    fn failed(&self, error: impl fmt::Display) -> OciError {
        OciError::Registry { registry: self.registry.clone(), reason: error.to_string() }
    }

    /// Pushes the component `bytes` to `reference` in the Wasm OCI artifact
    /// layout, within the bounds of a pull (the same requests' rules:
    /// [`distribution`]); returns its digests.
    pub async fn push(&self, bytes: Vec<u8>, reference: &ModuleRef) -> Result<Artifact, OciError> {
        check_component(&bytes)?;
        let layer = sha256_digest(&bytes);
        let created = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        // What `wkg oci push` writes (wasm-pkg-tools' WasmConfig), without
        // the component's WIT summary, which is optional.
        let config = serde_json::json!({
            "created": created,
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [layer],
        });
        let config = Config::new(config.to_string().into_bytes(), WASM_CONFIG_MEDIA_TYPE.to_owned(), None);
        let config_digest = sha256_digest(&config.data);
        let annotations = BTreeMap::from([("org.opencontainers.image.created".to_owned(), created)]);
        let layers = [ImageLayer::new(bytes, WASM_LAYER_MEDIA_TYPE.to_owned(), None)];
        let mut manifest = OciImageManifest::build(&layers, &config, Some(annotations));
        manifest.artifact_type = Some(WASM_CONFIG_MEDIA_TYPE.to_owned());
        let manifest = serde_json::to_vec(&manifest).map_err(|e| self.failed(e))?;
        let [layer_bytes] = layers;
        let distribution = &self.distribution;
        let pushed = async {
            distribution.push_blob(reference, &config_digest, config.data).await?;
            distribution.push_blob(reference, &layer, layer_bytes.data).await?;
            distribution.push_manifest(reference, OCI_IMAGE_MEDIA_TYPE, manifest.clone().into()).await
        };
        self.within_time(reference, "pushing", pushed).await?;
        Ok(Artifact { manifest: sha256_digest(&manifest), layer })
    }

    /// The manifest digest `reference` names now (a tag's current one),
    /// read within the bounds of a pull.
    pub async fn resolve(&self, reference: &ModuleRef) -> Result<String, OciError> {
        let manifest = self.within_time(reference, "pulling", self.distribution.manifest(reference)).await?;
        Ok(sha256_digest(&manifest))
    }

    /// Pulls the component `reference` names, verified (see the [module
    /// documentation](self)), within the time bound of a pull.
    pub async fn pull(&self, reference: &ModuleRef) -> Result<Pulled, OciError> {
        self.within_time(reference, "pulling", self.pull_unbounded_in_time(reference)).await
    }

    async fn within_time<T>(
        &self,
        reference: &ModuleRef,
        doing: &'static str,
        operation: impl Future<Output = Result<T, OciError>>,
    ) -> Result<T, OciError> {
        let limit = self.distribution.bounds.timeout;
        tokio::time::timeout(limit, operation).await.unwrap_or_else(|_| {
            let (reference, registry) = (reference.to_string(), self.registry.clone());
            Err(OciError::TimedOut { doing, reference, registry, limit })
        })
    }

    async fn pull_unbounded_in_time(&self, reference: &ModuleRef) -> Result<Pulled, OciError> {
        let not_component = |reason: String| OciError::NotAComponent { reference: reference.to_string(), reason };
        let body = self.distribution.manifest(reference).await?;
        let digest = sha256_digest(&body);
        if let Some(expected) = reference.digest()
            && expected != digest
        {
            let (expected, actual) = (expected.to_owned(), digest);
            return Err(OciError::Tampered { reference: reference.to_string(), what: "a manifest", expected, actual });
        }
        let manifest = match serde_json::from_slice::<OciManifest>(&body) {
            Ok(OciManifest::Image(manifest)) => manifest,
            Ok(OciManifest::ImageIndex(_)) => return Err(not_component("it is an image index".to_owned())),
            Err(_) => return Err(not_component("its manifest is not an image manifest".to_owned())),
        };
        if manifest.config.media_type != WASM_CONFIG_MEDIA_TYPE {
            return Err(not_component(format!("its config has media type {:?}", manifest.config.media_type)));
        }
        let [layer] = manifest.layers.as_slice() else {
            return Err(not_component(format!("it has {} layers, not one", manifest.layers.len())));
        };
        if layer.media_type != WASM_LAYER_MEDIA_TYPE {
            return Err(not_component(format!("its layer has media type {:?}", layer.media_type)));
        }
        let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
        if size > MAX_COMPONENT_BYTES {
            return Err(not_component(format!(
                "its layer has {size} bytes, over the {MAX_COMPONENT_BYTES} a module may"
            )));
        }
        let tampered = |actual: String| OciError::Tampered {
            reference: reference.to_string(),
            what: "a layer",
            expected: layer.digest.clone(),
            actual,
        };
        let bytes = self.distribution.layer(reference, &layer.digest, size, tampered).await?;
        let actual = sha256_digest(&bytes);
        if actual != layer.digest {
            return Err(tampered(actual));
        }
        Ok(Pulled { artifact: Artifact { manifest: digest, layer: actual }, bytes })
    }
}

/// Refuses `bytes` that are not a component that loads in `sandbox`
/// (compiles, links, describes itself) as module `module`: what `waku
/// modules push` checks before sending and every pull before writing.
/// Compiles: call it off the async runtime's threads.
pub fn check_loads(
    sandbox: &crate::sandbox::runtime::Sandbox,
    reference: &ModuleRef,
    bytes: &[u8],
) -> Result<(), OciError> {
    match sandbox.load(reference.module(), bytes) {
        Ok(_) => Ok(()),
        Err(error) => Err(OciError::DoesNotLoad { reference: reference.to_string(), reason: error.to_string() }),
    }
}

/// Refuses bytes that are not a WebAssembly component (a core module, or
/// anything else), before they are pushed.
fn check_component(bytes: &[u8]) -> Result<(), OciError> {
    // The preamble of a component: the magic, then version 0x0d, layer 1.
    const PREAMBLE: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];
    if bytes.len() as u64 > MAX_COMPONENT_BYTES {
        return Err(OciError::NotAComponentFile(format!(
            "the file has {} bytes, over the {MAX_COMPONENT_BYTES} a module may",
            bytes.len()
        )));
    }
    match bytes.get(..8) {
        Some(preamble) if preamble == PREAMBLE => Ok(()),
        _ => Err(OciError::NotAComponentFile("the file is not a WebAssembly component".to_owned())),
    }
}

/// Writes `bytes` to `<dir>/<module>.wasm`, replacing any file there in one
/// rename, so a watcher never reads half a module.
pub fn write_module(dir: &std::path::Path, module: &str, bytes: &[u8]) -> std::io::Result<std::path::PathBuf> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{module}.wasm"));
    let mut builder = tempfile::Builder::new();
    #[cfg(unix)]
    {
        // Created with the ordinary mode, less the umask (tempfile's own
        // default is 0600, which a module file has no reason for).
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o644));
    }
    let mut file = builder.prefix(".").suffix(".part").tempfile_in(dir)?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    file.persist(&path).map_err(|e| e.error)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_and_print_back() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        for text in [
            "oci://127.0.0.1:5000/waku/bank:v1".to_owned(),
            format!("oci://registry.example/bank@{digest}"),
            format!("oci://localhost:5000/a/b/bank:v2@{digest}"),
            "oci://[::1]:5000/bank".to_owned(),
        ] {
            let parsed: ModuleRef = text.parse().unwrap();
            assert_eq!(parsed.to_string(), text);
            assert_eq!(parsed.module(), "bank");
        }
        let tagged: ModuleRef = "oci://r:1/team/bank:v1".parse().unwrap();
        assert_eq!(
            (tagged.registry(), tagged.repository(), tagged.tag(), tagged.digest()),
            ("r:1", "team/bank", Some("v1"), None)
        );
    }

    #[test]
    fn bad_references_are_refused() {
        for text in [
            "127.0.0.1:5000/bank:v1",
            "oci://bank",
            "oci:///bank",
            "oci://r/Bank:v1",
            "oci://r/bank:v1@sha256:abc",
            "oci://r/bank@md5:00",
            "oci://r/bank:-v",
            "oci://r/../bank",
            "oci://r b/bank",
        ] {
            assert!(text.parse::<ModuleRef>().is_err(), "{text}");
        }
    }

    #[test]
    fn plain_http_only_on_loopback_or_when_listed() {
        assert!(plain_http("127.0.0.1:5000", None));
        assert!(plain_http("127.3.4.5", None));
        assert!(plain_http("localhost:5000", None));
        assert!(plain_http("[::1]:5000", None));
        assert!(!plain_http("registry.example", None));
        assert!(!plain_http("10.0.0.1:5000", None));
        assert!(plain_http("10.0.0.1:5000", Some("a:1, 10.0.0.1:5000")));
        assert!(!plain_http("10.0.0.1:5001", Some("10.0.0.1:5000")));
    }

    #[test]
    fn only_components_are_pushed() {
        assert!(check_component(b"\0asm\x01\0\0\0").is_err(), "a core module");
        assert!(check_component(b"hello").is_err());
        assert!(check_component(&[0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00, 1]).is_ok());
    }
}
