//! The operator console: pages in the browser, served by the admin
//! endpoint at `/console`, that show a running projection and steer it
//! (re-drive dead letters, roll modules back and forth).
//!
//! - `session`: sign-in, the session cookie, access levels (full and
//!   read-only), the same-origin and CSRF checks of actions.
//! - `api`: the JSON views the pages poll and the actions they send, all
//!   paged.
//! - `history`: the ring buffer of throughput and lag samples the host
//!   keeps, so the plots show the last minutes as soon as a page opens.
//!
//! Rules kept here:
//! - **Every asset is in the binary** (`include_str!` of `assets/`: the
//!   page, its script and style, and uPlot, the vendored chart library),
//!   so the console needs no build step, and no page makes a request that
//!   leaves the endpoint (the Content-Security-Policy allows only its own
//!   origin).
//! - **Nothing but the sign-in page answers without a credential**
//!   ([`session`]): the console's page and script redirect to it, every
//!   JSON view and action is a 401.
//! - **Every answer** carries a Content-Security-Policy without inline
//!   scripts or styles (`script-src 'self'`, `style-src 'self'`,
//!   `default-src 'none'`, `frame-ancestors 'none'`), `nosniff`, a
//!   referrer for its own origin only (`same-origin`: with `no-referrer` a
//!   browser sends `Origin: null` with the sign-in form, which the origin
//!   check refuses) and no caching. The page writes every string it shows with
//!   `textContent`, never as markup, on top of the escaping of hidden
//!   characters [`api`] does.
//! - Polling is the page's: each view asks for its JSON every few seconds
//!   while it is shown, and each answer is a page, so an open console
//!   costs the host a few small requests a second.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use super::Admin;
use crate::storage::log::EventLog;

pub mod api;
pub mod history;
pub mod session;

use history::History;
use session::{Refusal, Sessions};

/// What the console serves from.
pub(super) struct Console<L> {
    pub(super) admin: Arc<Admin<L>>,
    pub(super) sessions: Sessions,
    pub(super) history: History,
}

/// The Content-Security-Policy of every console answer.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                                           connect-src 'self'; form-action 'self'; base-uri 'none'; \
                                           frame-ancestors 'none'";

/// The assets: (name, content type, text, needs a credential).
const ASSETS: &[(&str, &str, &str, bool)] = &[
    ("console.js", "text/javascript; charset=utf-8", include_str!("assets/console.js"), true),
    ("console.css", "text/css; charset=utf-8", include_str!("assets/console.css"), false),
    ("uPlot.iife.min.js", "text/javascript; charset=utf-8", include_str!("assets/uPlot.iife.min.js"), true),
    ("uPlot.min.css", "text/css; charset=utf-8", include_str!("assets/uPlot.min.css"), true),
];

const PAGE: &str = include_str!("assets/console.html");
const SIGN_IN: &str = include_str!("assets/sign-in.html");
const REFUSED_SIGN_IN: &str = include_str!("assets/sign-in-refused.html");

/// The most bytes a sign-in form may hold.
const MAX_FORM: usize = 4 << 10;

/// The console's routes, for the endpoint serving `admin` (over TLS when
/// `tls`).
pub(super) fn router<L: EventLog>(admin: Arc<Admin<L>>, tls: bool) -> Router {
    let sessions = Sessions::new(admin.token.clone(), admin.read_token.clone(), tls);
    let console = Arc::new(Console { admin, sessions, history: History::default() });
    History::start(&console);
    let guarded = Router::new()
        .route("/console", get(page))
        .route("/console/", get(page))
        .route("/console/assets/{name}", get(asset))
        .route("/console/api/session", get(api::session::<L>))
        .route("/console/api/overview", get(api::overview::<L>))
        .route("/console/api/history", get(api::history::<L>))
        .route("/console/api/late-events", get(api::late_events::<L>))
        .route("/console/api/dead-letters", get(api::dead_letters::<L>))
        .route("/console/api/dead-letter", get(api::dead_letter::<L>))
        .route("/console/api/redrive", post(api::redrive::<L>))
        .route("/console/api/modules", get(api::modules::<L>))
        .route("/console/api/module-log", get(api::module_log::<L>))
        .route("/console/api/rollback", post(api::rollback::<L>))
        .route("/console/api/topics", get(api::topics::<L>))
        .route("/console/api/messages", get(api::messages::<L>))
        .route("/console/sign-out", post(sign_out::<L>))
        .route_layer(axum::middleware::from_fn_with_state(console.clone(), guard::<L>));
    Router::new()
        .route("/console/sign-in", get(|| async { html(StatusCode::OK, SIGN_IN) }).post(sign_in::<L>))
        .route("/console/public/{name}", get(public_asset))
        .merge(guarded)
        .layer(axum::middleware::map_response(secure_headers))
        .with_state(console)
}

/// Lets a request through with its credential when it has one and may
/// do what it asks; the page without one goes to the sign-in.
async fn guard<L: EventLog>(State(console): State<Arc<Console<L>>>, mut request: Request, next: Next) -> Response {
    let headers = request.headers();
    let credential = console.sessions.credential(headers);
    let page = matches!(request.uri().path(), "/console" | "/console/");
    let credential = match credential {
        Ok(credential) => credential,
        Err(Refusal::SignIn) if page => return Redirect::to("/console/sign-in").into_response(),
        Err(refusal @ Refusal::SignIn) => {
            return (StatusCode::UNAUTHORIZED, format!("{refusal}\n")).into_response();
        }
        Err(refusal) => return (StatusCode::FORBIDDEN, format!("{refusal}\n")).into_response(),
    };
    let needs = if request.uri().path() == "/console/sign-out" { session::Access::Read } else { session::Access::Full };
    if let Err(refusal) = console.sessions.allow(request.method(), headers, &credential, needs) {
        return (StatusCode::FORBIDDEN, format!("{refusal}\n")).into_response();
    }
    request.extensions_mut().insert(credential);
    next.run(request).await
}

async fn page() -> Response {
    html(StatusCode::OK, PAGE)
}

fn html(status: StatusCode, text: &'static str) -> Response {
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], text).into_response()
}

async fn asset(axum::extract::Path(name): axum::extract::Path<String>) -> Response {
    match ASSETS.iter().find(|(asset, ..)| *asset == name) {
        Some((_, kind, text, _)) => ([(header::CONTENT_TYPE, *kind)], *text).into_response(),
        None => (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    }
}

/// The assets the sign-in page needs, without a credential.
async fn public_asset(axum::extract::Path(name): axum::extract::Path<String>) -> Response {
    match ASSETS.iter().find(|(asset, _, _, guarded)| *asset == name && !guarded) {
        Some((_, kind, text, _)) => ([(header::CONTENT_TYPE, *kind)], *text).into_response(),
        None => (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    }
}

/// `POST /console/sign-in`: the form's token, checked; a session cookie
/// and the console, or the sign-in again.
async fn sign_in<L: EventLog>(State(console): State<Arc<Console<L>>>, request: Request) -> Response {
    let sessions = &console.sessions;
    let (parts, body) = request.into_parts();
    if let Err(refusal) = sessions.same_origin_form(&parts.headers) {
        return (StatusCode::FORBIDDEN, format!("{refusal}\n")).into_response();
    }
    if !sessions.protected()
        && let Err(refusal) = sessions.credential(&parts.headers)
    {
        return (StatusCode::FORBIDDEN, format!("{refusal}\n")).into_response();
    }
    let Ok(form) = axum::body::to_bytes(body, MAX_FORM).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "the form is too large\n").into_response();
    };
    let token = form_field(&form, "token").unwrap_or_default();
    match sessions.access_of(token.as_bytes()) {
        Some(access) => {
            let id = sessions.open(access);
            let mut response = Redirect::to("/console/").into_response();
            if let Ok(cookie) = HeaderValue::from_str(&sessions.set_cookie(&id)) {
                response.headers_mut().insert(header::SET_COOKIE, cookie);
            }
            response
        }
        None => html(StatusCode::UNAUTHORIZED, REFUSED_SIGN_IN),
    }
}

/// `POST /console/sign-out`: the session ended, the cookie cleared.
async fn sign_out<L: EventLog>(State(console): State<Arc<Console<L>>>, request: Request) -> Response {
    console.sessions.close(request.headers());
    let mut response = Redirect::to("/console/sign-in").into_response();
    if let Ok(cookie) = HeaderValue::from_str(&console.sessions.clear_cookie()) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

/// The value of field `name` of a form (`application/x-www-form-urlencoded`).
fn form_field(form: &[u8], name: &str) -> Option<String> {
    let form = std::str::from_utf8(form).ok()?;
    form.split('&').find_map(|pair| {
        let (field, value) = pair.split_once('=')?;
        let value = value.replace('+', " ");
        (field == name).then(|| percent_encoding::percent_decode_str(&value).decode_utf8().ok().map(String::from))?
    })
}

/// The headers every console answer carries.
async fn secure_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("cross-origin-resource-policy", HeaderValue::from_static("same-origin"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_field_is_decoded() {
        assert_eq!(form_field(b"a=1&token=s%2F3+c", "token").as_deref(), Some("s/3 c"));
        assert_eq!(form_field(b"token=", "token").as_deref(), Some(""));
        assert_eq!(form_field(b"other=1", "token"), None);
        assert_eq!(form_field(&[0xff], "token"), None);
    }

    #[test]
    fn the_page_holds_no_inline_script_or_style() {
        for page in [PAGE, SIGN_IN, REFUSED_SIGN_IN] {
            assert!(!page.contains("<script>") && !page.contains("style=") && !page.contains("<style"), "{page}");
            for handler in ["onclick", "onload", "onerror", "onsubmit", "javascript:"] {
                assert!(!page.contains(handler), "no inline handler: {handler}");
            }
        }
        let script = ASSETS[0].2;
        assert!(!script.contains("innerHTML") && !script.contains("eval("), "text only");
    }
}
