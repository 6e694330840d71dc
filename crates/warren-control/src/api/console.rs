//! The web console (`/ui/`, docs/dashboard.md): its assets, embedded in the
//! binary, and the cookie sessions a browser uses the API with.
//!
//! The token is typed once into the login page and checked here; the
//! browser then holds only a random session id, in an HttpOnly,
//! SameSite=Strict cookie, so no script, URL or page ever holds the token.
//! A cookie rides along on requests other sites make, which a bearer
//! header never does: a request authenticated by the cookie that changes
//! something (any method but GET and HEAD) or opens a WebSocket must come
//! from the console's own origin (its `Origin` header), or, with no
//! `Origin`, carry `X-Warren-Console: 1`, a header a cross-site form cannot
//! send. A session may do exactly what the token may.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use warren_core::sync::lock;

use super::{AppState, St};

/// The session cookie's name.
pub const COOKIE: &str = "warren_session";

/// How long a session lasts after its login.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// Sessions held at once; a login beyond this drops the oldest.
const MAX_SESSIONS: usize = 1024;

/// The header the console's own scripts send on every request.
pub const CONSOLE_HEADER: &str = "x-warren-console";

/// The console's sessions and where it is served from.
pub struct Console {
    /// Session id -> when it ends, and the token it logged in with (kept
    /// here only, checked again on each request, so a revoked token's
    /// sessions end with it).
    sessions: Mutex<HashMap<String, (Instant, String)>>,
    /// `scheme://host[:port]` from `--public-url`; None: `http://` and the
    /// request's Host.
    public_origin: Option<String>,
}

impl Console {
    /// `public_url`: where browsers reach the console (behind a proxy or
    /// TLS); its scheme, host and port are the origin requests must carry.
    pub fn new(public_url: Option<&str>) -> Result<Self, OriginError> {
        let public_origin = public_url
            .map(|u| origin_of("--public-url", u))
            .transpose()?;
        Ok(Console {
            sessions: Mutex::new(HashMap::new()),
            public_origin,
        })
    }

    /// Whether cookies must be marked Secure (the console is on https).
    fn secure(&self) -> bool {
        self.public_origin
            .as_deref()
            .is_some_and(|o| o.starts_with("https://"))
    }

    fn open_session(&self, token: &str) -> String {
        let id = hex(&rand::random::<[u8; 32]>());
        let now = Instant::now();
        let mut s = lock(&self.sessions);
        s.retain(|_, (end, _)| *end > now);
        if s.len() >= MAX_SESSIONS {
            if let Some(oldest) = s
                .iter()
                .min_by_key(|(_, (end, _))| *end)
                .map(|(k, _)| k.clone())
            {
                s.remove(&oldest);
            }
        }
        s.insert(id.clone(), (now + SESSION_TTL, token.to_string()));
        id
    }

    /// The token of the live session the request's cookie names.
    pub fn session_token(&self, headers: &HeaderMap) -> Option<String> {
        let id = session_cookie(headers)?;
        let mut s = lock(&self.sessions);
        match s.get(id) {
            Some((end, token)) if *end > Instant::now() => Some(token.clone()),
            Some(_) => {
                s.remove(id);
                None
            }
            None => None,
        }
    }

    fn close_session(&self, headers: &HeaderMap) {
        if let Some(id) = session_cookie(headers) {
            lock(&self.sessions).remove(id);
        }
    }

    /// The console's own origin, as browsers name it in `Origin`.
    fn own_origin(&self, headers: &HeaderMap) -> Option<String> {
        if let Some(o) = &self.public_origin {
            return Some(o.clone());
        }
        let host = headers.get(header::HOST)?.to_str().ok()?;
        Some(format!("http://{}", host.to_ascii_lowercase()))
    }

    /// Whether a cookie-authenticated request may go on: reads may; a
    /// change or a WebSocket must come from the console itself.
    pub fn same_site(&self, method: &Method, headers: &HeaderMap) -> Result<(), CrossSite> {
        // Browsers say where a request comes from: a page on another
        // origin of the same site (a sandbox's port below the console's
        // domain) carries the Strict cookie too, but never the session's
        // power, not even to read.
        let fetched_from = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
        if fetched_from.is_some_and(|s| s != "same-origin" && s != "none") {
            return Err(CrossSite::OtherOrigin);
        }
        let upgrade = headers.contains_key(header::UPGRADE);
        if !upgrade && (method == Method::GET || method == Method::HEAD) {
            return Ok(());
        }
        self.check_origin(headers, upgrade)
    }

    /// `Origin` must be the console's; without one (never the case for a
    /// WebSocket from a browser) the console's header must be there.
    fn check_origin(&self, headers: &HeaderMap, upgrade: bool) -> Result<(), CrossSite> {
        match headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
            Some(origin) => {
                let own = self.own_origin(headers);
                if own.as_deref() == Some(origin.to_ascii_lowercase().as_str()) {
                    Ok(())
                } else {
                    Err(CrossSite::OtherSite)
                }
            }
            None if !upgrade
                && headers.get(CONSOLE_HEADER).and_then(|v| v.to_str().ok()) == Some("1") =>
            {
                Ok(())
            }
            None => Err(CrossSite::NotFromConsole),
        }
    }

    fn cookie(&self, value: &str, max_age: u64) -> String {
        let secure = if self.secure() { "; Secure" } else { "" };
        format!("{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}")
    }
}

/// Why a request on a console session is refused: it did not come from
/// the console's own pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CrossSite {
    /// A page on another origin of the same site (a sandbox's port below
    /// the console's domain), by the browser's `Sec-Fetch-Site`.
    #[error("this request came from a page on another origin: a console session serves the console's own pages only")]
    OtherOrigin,
    #[error("this request came from another site's page (its Origin is not this server's): refused for a console session")]
    OtherSite,
    #[error(
        "a console session's changes must come from the console (Origin or X-Warren-Console: 1)"
    )]
    NotFromConsole,
}

/// Why a URL given for where browsers reach Warren (`--public-url`,
/// `--ports-url`) names no origin Warren can serve; `flag` is the option it
/// came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OriginError {
    #[error("{flag} {url}: expected http://HOST[:PORT] or https://HOST[:PORT]")]
    Scheme { flag: &'static str, url: String },
    /// No host, or a user and password before it (never in an `Origin`).
    #[error("{flag} {url}: no host in it")]
    NoHost { flag: &'static str, url: String },
    /// Sandbox ports are hosts below it (`PORT-ID.HOST`): an IP address
    /// has nothing below it.
    #[error("{flag} {url}: needs a host name (each sandbox port is a host below it, PORT-ID.HOST), not an IP address; on one machine use http://localhost:PORT")]
    NotAName { flag: &'static str, url: String },
}

/// `scheme://host[:port]` of a URL, lower-cased, as `Origin` carries it
/// (`flag`: the option it came from, for errors).
pub(crate) fn origin_of(flag: &'static str, url: &str) -> Result<String, OriginError> {
    let lower = url.trim().to_ascii_lowercase();
    let (scheme, rest) = lower
        .split_once("://")
        .filter(|(s, _)| *s == "http" || *s == "https")
        .ok_or_else(|| OriginError::Scheme {
            flag,
            url: url.to_string(),
        })?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() || authority.contains('@') {
        return Err(OriginError::NoHost {
            flag,
            url: url.to_string(),
        });
    }
    let authority = match (scheme, authority.rsplit_once(':')) {
        ("http", Some((h, "80"))) | ("https", Some((h, "443"))) => h,
        _ => authority,
    };
    Ok(format!("{scheme}://{authority}"))
}

fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    cookie_value(headers, COOKIE)
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub(crate) fn cookie_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The console's files: name, content type, bytes.
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("../../ui/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../ui/app.js"),
    ),
    (
        "views.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../ui/views.js"),
    ),
    (
        "lib.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../ui/lib.js"),
    ),
    (
        "charts.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../ui/charts.js"),
    ),
    (
        "dashboard.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../ui/dashboard.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_bytes!("../../ui/style.css"),
    ),
    (
        "vendor/xterm.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../ui/vendor/xterm.js"),
    ),
    (
        "vendor/xterm.css",
        "text/css; charset=utf-8",
        include_bytes!("../../ui/vendor/xterm.css"),
    ),
    (
        "vendor/addon-fit.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../ui/vendor/addon-fit.js"),
    ),
];

/// Scripts and styles from the console itself only; xterm.js writes
/// `<style>` elements, hence the inline styles. No framing (clickjacking).
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
    connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'";

pub(crate) fn routes() -> Router<std::sync::Arc<AppState>> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(|| async { asset("index.html") }))
        .route("/ui/login", post(login))
        .route("/ui/logout", post(logout))
        .route(
            "/ui/{*file}",
            get(|axum::extract::Path(file): axum::extract::Path<String>| async move {
                asset(&file)
            }),
        )
}

fn asset(name: &str) -> Response {
    let Some((_, kind, body)) = ASSETS.iter().find(|(n, _, _)| *n == name) else {
        return (StatusCode::NOT_FOUND, "no such file in the console\n").into_response();
    };
    let mut resp = (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(kind)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
        ],
        *body,
    )
        .into_response();
    resp.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    resp
}

#[derive(Deserialize)]
struct Login {
    token: String,
}

fn refused(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        Json(serde_json::json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

/// 403 for a cookie-authenticated request from elsewhere.
pub(crate) fn forbidden(why: CrossSite) -> Response {
    refused(StatusCode::FORBIDDEN, "forbidden", &why.to_string())
}

/// Checks the token and opens a session (the cookie); the answer never
/// carries the token or the session id in its body.
async fn login(State(st): St, headers: HeaderMap, body: Json<Login>) -> Response {
    // Another site must not log a browser into its own session either.
    if let Err(why) = st.console.check_origin(&headers, false) {
        return forbidden(why);
    }
    let token = body.token.trim();
    match st.control.tenants().authenticate(token).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            return refused(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "wrong API token (the operator's is in <home>/token; a tenant's comes from `warren token create`)",
            )
        }
        Err(e) => return refused(StatusCode::INTERNAL_SERVER_ERROR, "internal", &e.message),
    }
    let id = st.console.open_session(token);
    let cookie = st.console.cookie(&id, SESSION_TTL.as_secs());
    match HeaderValue::from_str(&cookie) {
        Ok(v) => (StatusCode::NO_CONTENT, [(header::SET_COOKIE, v)]).into_response(),
        Err(_) => refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "session cookie",
        ),
    }
}

/// Ends the session: the server forgets it, the browser drops the cookie.
async fn logout(State(st): St, headers: HeaderMap) -> Response {
    if let Err(why) = st.console.check_origin(&headers, false) {
        return forbidden(why);
    }
    st.console.close_session(&headers);
    let cookie = st.console.cookie("", 0);
    match HeaderValue::from_str(&cookie) {
        Ok(v) => (StatusCode::NO_CONTENT, [(header::SET_COOKIE, v)]).into_response(),
        Err(_) => StatusCode::NO_CONTENT.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).expect("header"));
        }
        h
    }

    #[test]
    fn every_page_script_and_style_of_the_console_is_embedded() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ui");
        let mut dirs = vec![root.clone()];
        let mut found = Vec::new();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("ui dir") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if matches!(
                    path.extension().and_then(|e| e.to_str()),
                    Some("html" | "js" | "css")
                ) {
                    let rel = path.strip_prefix(&root).expect("under ui");
                    found.push(rel.to_string_lossy().into_owned());
                }
            }
        }
        found.sort();
        let mut served: Vec<String> = ASSETS.iter().map(|(n, _, _)| n.to_string()).collect();
        served.sort();
        assert_eq!(found, served);
        assert_eq!(asset("../Cargo.toml").status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn public_urls_become_origins() {
        assert_eq!(
            origin_of("--public-url", "https://Warren.example:443/ui/").as_deref(),
            Ok("https://warren.example")
        );
        assert_eq!(
            origin_of("--public-url", "http://10.0.0.1:7070").as_deref(),
            Ok("http://10.0.0.1:7070")
        );
        assert!(matches!(
            origin_of("--public-url", "ftp://x"),
            Err(OriginError::Scheme { .. })
        ));
        assert!(matches!(
            origin_of("--public-url", "https://"),
            Err(OriginError::NoHost { .. })
        ));
    }

    #[test]
    fn sessions_open_close_and_are_found_in_the_cookie_header() {
        let c = Console::new(None).expect("console");
        let id = c.open_session("tok");
        assert_eq!(id.len(), 64);
        let h = headers(&[("cookie", &format!("a=b; {COOKIE}={id}; c=d"))]);
        assert_eq!(c.session_token(&h).as_deref(), Some("tok"));
        assert!(c
            .session_token(&headers(&[("cookie", &format!("{COOKIE}=nope"))]))
            .is_none());
        c.close_session(&h);
        assert!(c.session_token(&h).is_none());
    }

    #[test]
    fn changes_need_the_own_origin_or_the_console_header() {
        let c = Console::new(None).expect("console");
        let own = [
            ("host", "127.0.0.1:7070"),
            ("origin", "http://127.0.0.1:7070"),
        ];
        assert!(c.same_site(&Method::POST, &headers(&own)).is_ok());
        let other = [
            ("host", "127.0.0.1:7070"),
            ("origin", "https://evil.example"),
        ];
        assert!(c.same_site(&Method::POST, &headers(&other)).is_err());
        assert!(c.same_site(&Method::GET, &headers(&other)).is_ok());
        let ws = [
            ("host", "127.0.0.1:7070"),
            ("origin", "https://evil.example"),
            ("upgrade", "websocket"),
        ];
        assert!(c.same_site(&Method::GET, &headers(&ws)).is_err());
        let bare = [("host", "127.0.0.1:7070")];
        assert!(c.same_site(&Method::DELETE, &headers(&bare)).is_err());
        // A page of another origin on the same site: not even a read.
        for site in ["same-site", "cross-site"] {
            let sibling = [("host", "127.0.0.1:7070"), ("sec-fetch-site", site)];
            assert!(c.same_site(&Method::GET, &headers(&sibling)).is_err());
        }
        for site in ["same-origin", "none"] {
            let own = [("host", "127.0.0.1:7070"), ("sec-fetch-site", site)];
            assert!(c.same_site(&Method::GET, &headers(&own)).is_ok());
        }
        let marked = [("host", "127.0.0.1:7070"), (CONSOLE_HEADER, "1")];
        assert!(c.same_site(&Method::DELETE, &headers(&marked)).is_ok());
        let ws_bare = [
            ("host", "127.0.0.1:7070"),
            (CONSOLE_HEADER, "1"),
            ("upgrade", "websocket"),
        ];
        assert!(c.same_site(&Method::GET, &headers(&ws_bare)).is_err());
    }

    #[test]
    fn a_public_url_decides_the_origin_and_the_secure_flag() {
        let c = Console::new(Some("https://warren.example")).expect("console");
        let proxied = [
            ("host", "127.0.0.1:7070"),
            ("origin", "https://warren.example"),
        ];
        assert!(c.same_site(&Method::POST, &headers(&proxied)).is_ok());
        let direct = [
            ("host", "127.0.0.1:7070"),
            ("origin", "http://127.0.0.1:7070"),
        ];
        assert!(c.same_site(&Method::POST, &headers(&direct)).is_err());
        assert!(c.cookie("x", 1).contains("; Secure"));
        let plain = Console::new(None).expect("console");
        let cookie = plain.cookie("x", 1);
        assert!(
            cookie.contains("HttpOnly")
                && cookie.contains("SameSite=Strict")
                && !cookie.contains("Secure")
        );
    }
}
