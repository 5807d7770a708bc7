//! Who is using the console and what they may do: sign-in with a token,
//! the session cookie it sets, the two levels of access, and the checks
//! every request and every action passes.
//!
//! Rules kept here:
//! - **Two tokens, two levels.** The admin token gives [`Access::Full`]
//!   (look and act); the read-only token ([`super::super::Admin::read_token`])
//!   gives [`Access::Read`]: every page and JSON view, no action (a 403
//!   that says so). An endpoint without a token is open as the rest of it
//!   is (loopback only, unless told otherwise), and its console then
//!   answers only requests whose `Host` is an IP address or `localhost`, so
//!   a page of another site whose name resolves to the loopback address
//!   (DNS rebinding) cannot reach it.
//! - **Sign-in sets a cookie, never shows the token.** `POST
//!   /console/sign-in` with the token in a form field, compared in
//!   constant time, sets the cookie `waku_console` (`HttpOnly`,
//!   `SameSite=Strict`, `Path=/console`, `Secure` over TLS) holding a
//!   fresh random session id; the token itself is never stored in the
//!   browser nor written back in any answer. A tool may instead send the
//!   token as `Authorization: Bearer` on every request.
//! - **Sessions are bounded.** At most [`MAX_SESSIONS`] at once (the
//!   oldest goes first), each ending [`SESSION_LIFETIME`] after sign-in or
//!   at sign-out.
//! - **Actions come from the console's own pages.** Every request that
//!   changes something (a `POST`) is refused with a 403 when its `Origin`
//!   is another origin than the endpoint's own, or when the browser says
//!   it comes from another site (`Sec-Fetch-Site` other than
//!   `same-origin`); one signed in by cookie must also carry the session's
//!   CSRF token in the header [`CSRF_HEADER`], which only a page of the
//!   console can read (from `/console/api/session`), and which a page of
//!   another origin cannot send without a CORS preflight the endpoint never
//!   grants. The sign-in form itself needs a same-origin `Origin`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, Method, header};

use crate::operations::admin::AdminToken;

/// The session cookie's name.
pub const COOKIE: &str = "waku_console";

/// The header an action carries the session's CSRF token in.
pub const CSRF_HEADER: &str = "x-waku-csrf";

/// The most sessions held at once; a sign-in past it ends the oldest.
pub const MAX_SESSIONS: usize = 256;

/// How long a session lasts after its sign-in.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// What a request may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Look only: every page and view, no action.
    Read,
    /// Look and act: re-drive dead letters, roll modules back and forth.
    Full,
}

/// How a request proved who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// A session cookie; actions need its CSRF token too.
    Session {
        /// Its access.
        access: Access,
        /// The CSRF token actions must carry.
        csrf: String,
    },
    /// The token as a bearer header (a tool, not a browser's ambient
    /// credential), or an endpoint without a token.
    Direct(Access),
}

impl Credential {
    /// What it may do.
    pub fn access(&self) -> Access {
        match self {
            Self::Session { access, .. } | Self::Direct(access) => *access,
        }
    }
}

/// One signed-in browser.
#[derive(Debug, Clone)]
struct Session {
    access: Access,
    csrf: String,
    since: Instant,
    /// Its place in the order of sign-ins (the oldest goes first).
    serial: u64,
}

/// Why a request was refused: said in the answer, never naming a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// No valid credential.
    #[error("sign in first")]
    SignIn,
    /// A read-only token asked for an action.
    #[error("this token may only look; sign in with the admin token to act")]
    ReadOnly,
    /// The request came from another origin or site.
    #[error("refused: the request came from another origin")]
    CrossOrigin,
    /// An action without the session's CSRF token.
    #[error("refused: the action lacks the console's CSRF token")]
    Csrf,
    /// An open endpoint asked under a host name.
    #[error("refused: an endpoint without a token answers its console by IP address or localhost only")]
    HostName,
}

/// The tokens and the sessions of one endpoint.
#[derive(Debug)]
pub struct Sessions {
    token: Option<AdminToken>,
    read_token: Option<AdminToken>,
    /// Whether the endpoint serves TLS (the cookie is then `Secure`, and
    /// its origin `https`).
    tls: bool,
    sessions: Mutex<HashMap<String, Session>>,
    opened: std::sync::atomic::AtomicU64,
}

impl Sessions {
    /// The sessions of an endpoint protected by `token` and `read_token`.
    pub fn new(token: Option<AdminToken>, read_token: Option<AdminToken>, tls: bool) -> Self {
        Self { token, read_token, tls, sessions: Mutex::new(HashMap::new()), opened: Default::default() }
    }

    /// Whether the endpoint asks for a token at all.
    pub fn protected(&self) -> bool {
        self.token.is_some() || self.read_token.is_some()
    }

    /// What `presented` gives: the admin token full access, the read-only
    /// token reading, anything else nothing; without tokens, full access.
    pub fn access_of(&self, presented: &[u8]) -> Option<Access> {
        if !self.protected() {
            return Some(Access::Full);
        }
        // Both compared, whichever matches, so the time says nothing of which.
        let full = self.token.as_ref().is_some_and(|token| token.matches(presented));
        let read = self.read_token.as_ref().is_some_and(|token| token.matches(presented));
        match (full, read) {
            (true, _) => Some(Access::Full),
            (false, true) => Some(Access::Read),
            (false, false) => None,
        }
    }

    /// A new session of `access`: its id, for the cookie.
    pub fn open(&self, access: Access) -> String {
        let id = random_hex();
        let mut sessions = self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        sessions.retain(|_, session| session.since.elapsed() < SESSION_LIFETIME);
        while sessions.len() >= MAX_SESSIONS {
            let Some(oldest) = sessions.iter().min_by_key(|(_, session)| session.serial).map(|(id, _)| id.clone())
            else {
                break;
            };
            sessions.remove(&oldest);
        }
        let serial = self.opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        sessions.insert(id.clone(), Session { access, csrf: random_hex(), since: Instant::now(), serial });
        id
    }

    /// Ends the session of `headers`' cookie, if any.
    pub fn close(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers) {
            self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id);
        }
    }

    /// The `Set-Cookie` value of session `id`.
    pub fn set_cookie(&self, id: &str) -> String {
        let secure = if self.tls { "; Secure" } else { "" };
        format!(
            "{COOKIE}={id}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
            SESSION_LIFETIME.as_secs()
        )
    }

    /// The `Set-Cookie` value that clears the cookie.
    pub fn clear_cookie(&self) -> String {
        let secure = if self.tls { "; Secure" } else { "" };
        format!("{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0{secure}")
    }

    /// Who sent a request with `headers`: its bearer token, else its
    /// session cookie; without tokens, anyone (by IP address or
    /// `localhost` only).
    pub fn credential(&self, headers: &HeaderMap) -> Result<Credential, Refusal> {
        if !self.protected() {
            if !local_host_name(headers) {
                return Err(Refusal::HostName);
            }
            return Ok(match self.session_of(headers) {
                Some(session) => Credential::Session { access: Access::Full, csrf: session.csrf },
                None => Credential::Direct(Access::Full),
            });
        }
        let bearer =
            headers.get(header::AUTHORIZATION).and_then(|value| value.as_bytes().strip_prefix(b"Bearer ".as_slice()));
        if let Some(presented) = bearer {
            return self.access_of(presented).map(Credential::Direct).ok_or(Refusal::SignIn);
        }
        let session = self.session_of(headers).ok_or(Refusal::SignIn)?;
        Ok(Credential::Session { access: session.access, csrf: session.csrf })
    }

    fn session_of(&self, headers: &HeaderMap) -> Option<Session> {
        let id = cookie(headers)?;
        let sessions = self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        sessions.get(&id).filter(|session| session.since.elapsed() < SESSION_LIFETIME).cloned()
    }

    /// Whether a request of `method` with `headers` from `credential` may
    /// go on: reading needs any access; an action a same-origin request,
    /// with a session its CSRF token, and the access `needs` (signing out
    /// needs only reading).
    pub fn allow(
        &self,
        method: &Method,
        headers: &HeaderMap,
        credential: &Credential,
        needs: Access,
    ) -> Result<(), Refusal> {
        if method == Method::GET || method == Method::HEAD {
            return Ok(());
        }
        self.same_origin(headers)?;
        if let Credential::Session { csrf, .. } = credential {
            let sent = headers.get(CSRF_HEADER).map(|value| value.as_bytes()).unwrap_or_default();
            use subtle::ConstantTimeEq;
            if sent.is_empty() || !bool::from(sent.ct_eq(csrf.as_bytes())) {
                return Err(Refusal::Csrf);
            }
        }
        if credential.access() < needs {
            return Err(Refusal::ReadOnly);
        }
        Ok(())
    }

    /// Whether `headers` say the request comes from the endpoint's own
    /// origin: its `Origin` (when sent) is `http(s)://<Host>`, and its
    /// `Sec-Fetch-Site` (when sent) is `same-origin`.
    pub fn same_origin(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        if let Some(site) = headers.get("sec-fetch-site")
            && site.as_bytes() != b"same-origin"
        {
            return Err(Refusal::CrossOrigin);
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let host = headers.get(header::HOST).map(|host| host.as_bytes()).unwrap_or_default();
            let scheme: &[u8] = if self.tls { b"https://" } else { b"http://" };
            if host.is_empty() || origin.as_bytes() != [scheme, host].concat().as_slice() {
                return Err(Refusal::CrossOrigin);
            }
        }
        Ok(())
    }

    /// [`Sessions::same_origin`], with the `Origin` required (a browser's
    /// form sends it): for the sign-in form.
    pub fn same_origin_form(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        if !headers.contains_key(header::ORIGIN) {
            return Err(Refusal::CrossOrigin);
        }
        self.same_origin(headers)
    }
}

/// The session id in the `Cookie` header, if any.
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|value| value.to_str().ok()).find_map(|value| {
        value.split(';').find_map(|pair| {
            let (name, id) = pair.trim().split_once('=')?;
            (name == COOKIE && !id.is_empty() && id.len() <= 128).then(|| id.to_owned())
        })
    })
}

/// Whether the request's `Host` is an IP address or `localhost` (with or
/// without a port).
fn local_host_name(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|host| host.to_str().ok()) else { return false };
    let name = match host.strip_prefix('[') {
        // [::1]:9100
        Some(rest) => return rest.split(']').next().is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok()),
        None => {
            host.rsplit_once(':').map_or(host, |(name, port)| if port.parse::<u16>().is_ok() { name } else { host })
        }
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

/// 32 random bytes as hex.
fn random_hex() -> String {
    rand::random::<[u8; 32]>().iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, value.parse().unwrap());
        }
        headers
    }

    fn sessions() -> Sessions {
        let token = AdminToken::new("admin-secret", "test").unwrap();
        let read = AdminToken::new("read-secret", "test").unwrap();
        Sessions::new(token, read, false)
    }

    #[test]
    fn tokens_give_their_access_and_a_session_carries_it() {
        let sessions = sessions();
        assert_eq!(sessions.access_of(b"admin-secret"), Some(Access::Full));
        assert_eq!(sessions.access_of(b"read-secret"), Some(Access::Read));
        assert_eq!(sessions.access_of(b"admin-secre"), None);
        assert_eq!(sessions.credential(&headers(&[])), Err(Refusal::SignIn));
        let id = sessions.open(Access::Read);
        let cookie = sessions.set_cookie(&id);
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
        assert!(!cookie.contains("secret"), "{cookie}");
        let asked = headers(&[("cookie", &format!("other=1; {COOKIE}={id}"))]);
        let credential = sessions.credential(&asked).unwrap();
        assert_eq!(credential.access(), Access::Read);
        assert_eq!(sessions.credential(&headers(&[("cookie", &format!("{COOKIE}=forged"))])), Err(Refusal::SignIn));
        sessions.close(&asked);
        assert_eq!(sessions.credential(&asked), Err(Refusal::SignIn));
        let bearer = headers(&[("authorization", "Bearer admin-secret")]);
        assert_eq!(sessions.credential(&bearer), Ok(Credential::Direct(Access::Full)));
    }

    #[test]
    fn an_action_needs_full_access_the_same_origin_and_the_csrf_token() {
        let sessions = sessions();
        let id = sessions.open(Access::Full);
        let with_cookie = headers(&[("cookie", &format!("{COOKIE}={id}")), ("host", "127.0.0.1:9100")]);
        let credential = sessions.credential(&with_cookie).unwrap();
        let Credential::Session { csrf, .. } = &credential else { panic!("{credential:?}") };
        assert_eq!(sessions.allow(&Method::GET, &with_cookie, &credential, Access::Full), Ok(()));
        assert_eq!(sessions.allow(&Method::POST, &with_cookie, &credential, Access::Full), Err(Refusal::Csrf));
        let mut good = with_cookie.clone();
        good.insert(CSRF_HEADER, csrf.parse().unwrap());
        good.insert("origin", "http://127.0.0.1:9100".parse().unwrap());
        good.insert("sec-fetch-site", "same-origin".parse().unwrap());
        assert_eq!(sessions.allow(&Method::POST, &good, &credential, Access::Full), Ok(()));
        for (name, value) in [("origin", "http://evil.example"), ("sec-fetch-site", "cross-site")] {
            let mut bad = good.clone();
            bad.insert(name, value.parse().unwrap());
            assert_eq!(
                sessions.allow(&Method::POST, &bad, &credential, Access::Full),
                Err(Refusal::CrossOrigin),
                "{value}"
            );
        }
        let read = Credential::Session { access: Access::Read, csrf: csrf.clone() };
        assert_eq!(sessions.allow(&Method::POST, &good, &read, Access::Full), Err(Refusal::ReadOnly));
        assert_eq!(sessions.allow(&Method::POST, &good, &read, Access::Read), Ok(()), "a read-only session signs out");
        assert_eq!(sessions.same_origin_form(&with_cookie), Err(Refusal::CrossOrigin), "a form needs its origin");
    }

    #[test]
    fn an_open_endpoint_answers_its_console_by_address_only() {
        let open = Sessions::new(None, None, false);
        for host in ["127.0.0.1:9100", "localhost:9100", "[::1]:9100", "localhost"] {
            assert!(open.credential(&headers(&[("host", host)])).is_ok(), "{host}");
        }
        for host in ["evil.example:9100", "evil.example", "127.0.0.1.evil.example:80"] {
            assert_eq!(open.credential(&headers(&[("host", host)])), Err(Refusal::HostName), "{host}");
        }
        assert_eq!(open.credential(&headers(&[])), Err(Refusal::HostName));
    }

    #[test]
    fn sessions_are_bounded() {
        let sessions = sessions();
        let first = sessions.open(Access::Full);
        for _ in 0..MAX_SESSIONS {
            sessions.open(Access::Full);
        }
        let asked = headers(&[("cookie", &format!("{COOKIE}={first}"))]);
        assert_eq!(sessions.credential(&asked), Err(Refusal::SignIn), "the oldest went first");
        assert_eq!(sessions.sessions.lock().unwrap().len(), MAX_SESSIONS);
    }
}
