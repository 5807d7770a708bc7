//! Registry credentials: from the environment or a Docker-style config
//! file, never from the command line (where `ps` and shell history would
//! show them).
//!
//! Rules kept here, first match wins:
//! 1. `WAKU_OCI_USERNAME` and `WAKU_OCI_PASSWORD` (both, or neither), for
//!    every registry.
//! 2. The `auths` entry of the registry in `$DOCKER_CONFIG/config.json`,
//!    else `~/.docker/config.json` (what `docker login`, `podman login
//!    --authfile` and `wkg` write): its `auth` (base64 `user:password`),
//!    or its `username` and `password`, or its `identitytoken`. An entry is
//!    found by the registry's `host[:port]`, with or without `https://`.
//! 3. Anonymous.
//!
//! Credential helpers (`credsStore`, `credHelpers`) are not run: a config
//! that names one for the registry and has no `auths` entry is an error
//! saying so, not a silent anonymous pull.

use std::path::{Path, PathBuf};

use base64::Engine;
use oci_client::secrets::RegistryAuth;

/// The variables of the username and password.
pub const USERNAME_ENV: &str = "WAKU_OCI_USERNAME";
/// See [`USERNAME_ENV`].
pub const PASSWORD_ENV: &str = "WAKU_OCI_PASSWORD";

/// Why the credentials cannot be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CredentialsError {
    /// Only one of the two variables is set.
    #[error("set both {USERNAME_ENV} and {PASSWORD_ENV}, or neither")]
    HalfSet,
    /// The config file cannot be read or parsed.
    #[error("the registry credentials file {}: {reason}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The config file leaves the registry to a credential helper.
    #[error(
        "the registry credentials file {} leaves `{registry}` to the credential helper `{helper}`, which waku does \
         not run; set {USERNAME_ENV} and {PASSWORD_ENV}, or add an `auths` entry",
        path.display()
    )]
    Helper {
        /// The file.
        path: PathBuf,
        /// The registry.
        registry: String,
        /// The helper named.
        helper: String,
    },
}

/// The credentials for `registry`, from the process's environment.
pub fn for_registry(registry: &str) -> Result<RegistryAuth, CredentialsError> {
    let var = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
    let file = var("DOCKER_CONFIG")
        .map(|dir| PathBuf::from(dir).join("config.json"))
        .or_else(|| var("HOME").map(|home| PathBuf::from(home).join(".docker/config.json")));
    resolve(registry, var(USERNAME_ENV), var(PASSWORD_ENV), file.as_deref())
}

/// The credentials for `registry` from the variables' values and the
/// config file, as the [module documentation](self) orders them.
pub fn resolve(
    registry: &str,
    username: Option<String>,
    password: Option<String>,
    file: Option<&Path>,
) -> Result<RegistryAuth, CredentialsError> {
    match (username, password) {
        (Some(username), Some(password)) => return Ok(RegistryAuth::Basic(username, password)),
        (None, None) => {}
        _ => return Err(CredentialsError::HalfSet),
    }
    let Some(path) = file else { return Ok(RegistryAuth::Anonymous) };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(RegistryAuth::Anonymous),
        Err(error) => return Err(CredentialsError::File { path: path.to_owned(), reason: error.to_string() }),
    };
    let bad = |reason: String| CredentialsError::File { path: path.to_owned(), reason };
    let config: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let entry = config.get("auths").and_then(|auths| auths.as_object()).and_then(|auths| {
        auths.iter().find(|(key, _)| {
            let key = key.strip_prefix("https://").or_else(|| key.strip_prefix("http://")).unwrap_or(key);
            key.trim_end_matches('/') == registry || key.split('/').next() == Some(registry)
        })
    });
    let Some((_, entry)) = entry else {
        let helper = config
            .get("credHelpers")
            .and_then(|helpers| helpers.get(registry))
            .or_else(|| config.get("credsStore"))
            .and_then(|helper| helper.as_str());
        return match helper {
            Some(helper) => Err(CredentialsError::Helper {
                path: path.to_owned(),
                registry: registry.to_owned(),
                helper: helper.to_owned(),
            }),
            None => Ok(RegistryAuth::Anonymous),
        };
    };
    let field = |name: &str| entry.get(name).and_then(|value| value.as_str()).filter(|value| !value.is_empty());
    if let Some(auth) = field("auth") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|_| bad(format!("the `auth` of `{registry}` is not base64")))?;
        let decoded =
            String::from_utf8(decoded).map_err(|_| bad(format!("the `auth` of `{registry}` is not UTF-8")))?;
        let (username, password) =
            decoded.split_once(':').ok_or_else(|| bad(format!("the `auth` of `{registry}` is not user:password")))?;
        return Ok(RegistryAuth::Basic(username.to_owned(), password.to_owned()));
    }
    if let (Some(username), Some(password)) = (field("username"), field("password")) {
        return Ok(RegistryAuth::Basic(username.to_owned(), password.to_owned()));
    }
    if let Some(token) = field("identitytoken").or_else(|| field("registrytoken")) {
        return Ok(RegistryAuth::Bearer(token.to_owned()));
    }
    Ok(RegistryAuth::Anonymous)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(auth: RegistryAuth) -> Option<(String, String)> {
        match auth {
            RegistryAuth::Basic(user, password) => Some((user, password)),
            _ => None,
        }
    }

    #[test]
    fn the_environment_then_the_file_then_anonymous() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.json");
        // "ann:s3cret"
        std::fs::write(
            &file,
            r#"{"auths": {"https://r.example:5000": {"auth": "YW5uOnMzY3JldA=="}, "other": {"username": "bo", "password": "pw"}}}"#,
        )
        .unwrap();
        let env = resolve("r.example:5000", Some("u".into()), Some("p".into()), Some(&file)).unwrap();
        assert_eq!(basic(env), Some(("u".into(), "p".into())));
        let from_file = resolve("r.example:5000", None, None, Some(&file)).unwrap();
        assert_eq!(basic(from_file), Some(("ann".into(), "s3cret".into())));
        assert_eq!(basic(resolve("other", None, None, Some(&file)).unwrap()), Some(("bo".into(), "pw".into())));
        assert!(matches!(resolve("unknown", None, None, Some(&file)).unwrap(), RegistryAuth::Anonymous));
        assert!(matches!(resolve("r", None, None, Some(&dir.path().join("none"))).unwrap(), RegistryAuth::Anonymous));
        assert!(matches!(resolve("r", Some("u".into()), None, None), Err(CredentialsError::HalfSet)));
    }

    #[test]
    fn a_helper_is_named_not_ignored_and_a_bad_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.json");
        std::fs::write(&file, r#"{"credsStore": "desktop"}"#).unwrap();
        let error = resolve("r.example", None, None, Some(&file)).unwrap_err();
        assert!(error.to_string().contains("credential helper `desktop`"), "{error}");
        std::fs::write(&file, "{").unwrap();
        assert!(matches!(resolve("r.example", None, None, Some(&file)), Err(CredentialsError::File { .. })));
        std::fs::write(&file, r#"{"auths": {"r.example": {"auth": "!!"}}}"#).unwrap();
        assert!(resolve("r.example", None, None, Some(&file)).unwrap_err().to_string().contains("not base64"));
    }
}
