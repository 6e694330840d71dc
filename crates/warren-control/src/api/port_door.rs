//! Web pages that sandboxes serve, for browsers, on an origin of their own.
//!
//! A page a sandbox serves is the sandbox's code, untrusted. Served on the
//! API's origin it would run beside the console's session and could drive
//! the API as the operator (issue 38). So each sandbox port is a host of
//! its own below `--ports-url`, `PORT-ID.<host>` (as E2B's `PORT-ID.domain`),
//! on a listener of its own (`--ports-listen`): a page there shares neither
//! origin nor site with the console, the API or another sandbox's port.
//!
//! Who may open it: whoever holds a link from `GET
//! /v1/sandboxes/{id}/ports/{port}` (the console's "Open" button), a signed
//! capability for that sandbox and port that lives [`LINK_TTL`]. The door
//! trades it for a cookie of that host only ([`SESSION_TTL`]) and sends the
//! browser on without the token in the URL. Warren's cookie and the API
//! token are taken off every request before it reaches the sandbox.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde::Serialize;

use super::console::OriginError;
use crate::signing::Signer;
use crate::ControlCell;

/// How long a link from the API may be opened.
pub const LINK_TTL: Duration = Duration::from_secs(300);

/// How long a browser that opened a link keeps the port open.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// The door's cookie (host-only: each sandbox port's host has its own).
const COOKIE: &str = "warren_port";

/// The query parameter a link carries its token in.
const LINK_PARAM: &str = "warren_port_token";

/// What a token is for: opening a link, or a browser's session after it.
#[derive(Clone, Copy)]
enum Use {
    Link,
    Session,
}

impl Use {
    fn purpose(self) -> &'static str {
        match self {
            Use::Link => "port-link",
            Use::Session => "port-session",
        }
    }
}

/// Bytes of the MAC a token carries.
const TAG_BYTES: usize = 16;

/// Where browsers reach sandbox ports, and the key that signs links to
/// them.
#[derive(Clone)]
pub struct PortLinks {
    scheme: String,
    /// `host[:port]` below which each sandbox port is a host.
    authority: String,
    signer: Signer,
}

/// A link to a sandbox's port for a browser.
#[derive(Serialize, utoipa::ToSchema)]
pub struct PortLink {
    /// Open it in a browser: the port's own origin, `PORT-ID.<ports host>`.
    pub url: String,
    /// Seconds the link may still be opened; the browser that opens it
    /// keeps access for 12 hours.
    pub expires_in_s: u64,
}

impl PortLinks {
    /// `ports_url`: `http(s)://HOST[:PORT]` of the door (`--ports-url`).
    pub fn new(ports_url: &str, api_token: &str) -> Result<PortLinks, OriginError> {
        const FLAG: &str = "--ports-url";
        let origin = super::console::origin_of(FLAG, ports_url)?;
        // `origin_of` answers `scheme://authority`; were it ever otherwise,
        // the URL given is still what is at fault.
        let (scheme, authority) = origin
            .split_once("://")
            .map(|(s, a)| (s.to_string(), a.to_string()))
            .ok_or_else(|| OriginError::Scheme {
                flag: FLAG,
                url: ports_url.to_string(),
            })?;
        if authority.starts_with('[') || authority.parse::<std::net::SocketAddr>().is_ok() {
            return Err(OriginError::NotAName {
                flag: FLAG,
                url: ports_url.to_string(),
            });
        }
        Ok(PortLinks {
            scheme,
            authority,
            signer: Signer::new(api_token),
        })
    }

    /// A link to `port` of sandbox `id`, valid for [`LINK_TTL`].
    pub fn link(&self, id: &str, port: u16) -> PortLink {
        let token = self.token(Use::Link, id, port, now() + LINK_TTL.as_secs());
        PortLink {
            url: format!(
                "{}://{port}-{id}.{}/?{LINK_PARAM}={token}",
                self.scheme, self.authority
            ),
            expires_in_s: LINK_TTL.as_secs(),
        }
    }

    /// `EXPIRY.TAG`: the MAC binds the use, sandbox, port and expiry.
    fn token(&self, what: Use, id: &str, port: u16, expires: u64) -> String {
        let tag = self.signer.tag(
            what.purpose(),
            &[
                id.as_bytes(),
                &port.to_be_bytes(),
                expires.to_string().as_bytes(),
            ],
            TAG_BYTES,
        );
        format!("{expires}.{tag}")
    }

    fn valid(&self, what: Use, id: &str, port: u16, token: &str) -> bool {
        let Some((expires, tag)) = token.split_once('.') else {
            return false;
        };
        let Ok(at) = expires.parse::<u64>() else {
            return false;
        };
        at > now()
            && self.signer.verify(
                what.purpose(),
                &[id.as_bytes(), &port.to_be_bytes(), expires.as_bytes()],
                TAG_BYTES,
                tag,
            )
    }

    /// The sandbox and port a request's `Host` names, if it is one of the
    /// door's hosts.
    fn target(&self, host: &str) -> Option<(String, u16)> {
        let host = host.trim().to_ascii_lowercase();
        let host = match self.scheme.as_str() {
            "http" => host.strip_suffix(":80").unwrap_or(&host),
            _ => host.strip_suffix(":443").unwrap_or(&host),
        };
        let label = host.strip_suffix(&self.authority)?.strip_suffix('.')?;
        let (port, id) = label.split_once('-')?;
        let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
        (!id.is_empty() && !id.contains('.')).then(|| (id.to_string(), port))
    }

    fn cookie(&self, token: &str) -> String {
        let secure = if self.scheme == "https" {
            "; Secure"
        } else {
            ""
        };
        format!(
            "{COOKIE}={token}; Path=/; HttpOnly; SameSite=Lax; Max-Age={}{secure}",
            SESSION_TTL.as_secs()
        )
    }
}

fn now() -> u64 {
    warren_core::clock::unix_now().max(0) as u64
}

struct Door {
    cell: ControlCell,
    links: PortLinks,
    api_token: String,
}

/// The door's router: every path of every sandbox port host.
pub fn router(cell: ControlCell, links: PortLinks, api_token: String) -> Router {
    Router::new()
        .fallback(serve)
        .with_state(std::sync::Arc::new(Door {
            cell,
            links,
            api_token,
        }))
}

fn refuse(status: StatusCode, message: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        message + "\n",
    )
        .into_response()
}

async fn serve(State(door): State<std::sync::Arc<Door>>, mut req: Request) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some((id, port)) = door.links.target(host) else {
        return refuse(
            StatusCode::NOT_FOUND,
            format!(
                "this listener serves sandbox ports at PORT-ID.{} only; get a link with GET /v1/sandboxes/ID/ports/PORT",
                door.links.authority
            ),
        );
    };
    if let Some(token) = link_token(req.uri().query()) {
        if !door.links.valid(Use::Link, &id, port, token) {
            return refuse(
                StatusCode::UNAUTHORIZED,
                format!("this link to port {port} of sandbox {id} is wrong or expired (links live {} s): get a new one with GET /v1/sandboxes/{id}/ports/{port}", LINK_TTL.as_secs()),
            );
        }
        let session = door
            .links
            .token(Use::Session, &id, port, now() + SESSION_TTL.as_secs());
        return enter(&door.links, &session, req.uri());
    }
    let session = super::console::cookie_value(req.headers(), COOKIE);
    if !session.is_some_and(|t| door.links.valid(Use::Session, &id, port, t)) {
        return refuse(
            StatusCode::UNAUTHORIZED,
            format!("open port {port} of sandbox {id} through a link: GET /v1/sandboxes/{id}/ports/{port} (the console's Open button)"),
        );
    }
    strip_credentials(req.headers_mut(), &door.api_token);
    let Some(control) = door.cell.get().cloned() else {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "this Warren replica does not lead the cluster yet; retry in a moment".into(),
        );
    };
    match control.io().forward_http(&id, port, req, None).await {
        Ok(resp) => resp,
        Err(e) => refuse(StatusCode::BAD_GATEWAY, e.message),
    }
}

/// The link token in a query string, if any.
fn link_token(query: Option<&str>) -> Option<&str> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == LINK_PARAM)
        .map(|(_, v)| v)
}

/// The browser's session cookie, and on to the same path without the
/// token (so it is neither kept in history nor sent on as a Referer).
fn enter(links: &PortLinks, session: &str, uri: &axum::http::Uri) -> Response {
    let rest: Vec<&str> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty() && kv.split('=').next() != Some(LINK_PARAM))
        .collect();
    let mut location = uri.path().to_string();
    if !rest.is_empty() {
        location.push('?');
        location.push_str(&rest.join("&"));
    }
    let mut resp = StatusCode::SEE_OTHER.into_response();
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&location) {
        h.insert(header::LOCATION, v);
    }
    if let Ok(v) = HeaderValue::from_str(&links.cookie(session)) {
        h.insert(header::SET_COOKIE, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

/// Takes Warren's own credentials off a request for a sandbox: the door's
/// and the console's cookies, and an `Authorization` carrying the API
/// token. The sandbox's own cookies (set on its own host) go through.
pub(crate) fn strip_credentials(headers: &mut HeaderMap, api_token: &str) {
    const OURS: [&str; 2] = [COOKIE, super::console::COOKIE];
    let kept: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|kv| !kv.is_empty())
        .filter(|kv| !OURS.contains(&kv.split('=').next().unwrap_or("").trim()))
        .map(String::from)
        .collect();
    headers.remove(header::COOKIE);
    if !kept.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&kept.join("; ")) {
            headers.insert(header::COOKIE, v);
        }
    }
    let carries_token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains(api_token));
    if carries_token {
        headers.remove(header::AUTHORIZATION);
    }
    headers.remove(super::console::CONSOLE_HEADER);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links() -> PortLinks {
        PortLinks::new("http://LocalHost:7071/", "tok").expect("links")
    }

    #[test]
    fn each_sandbox_port_is_a_host_of_its_own() {
        let l = links();
        let link = l.link("sbx-abc", 8000);
        assert!(
            link.url
                .starts_with("http://8000-sbx-abc.localhost:7071/?warren_port_token="),
            "{}",
            link.url
        );
        assert_eq!(
            l.target("8000-sbx-abc.localhost:7071"),
            Some(("sbx-abc".into(), 8000))
        );
        for wrong in [
            "localhost:7071",
            "8000-sbx-abc.localhost:7072",
            "8000-sbx-abc.evil.localhost:7071",
            "0-sbx-abc.localhost:7071",
            "x-sbx-abc.localhost:7071",
            "8000-.localhost:7071",
            "8000-sbx-abc.other.test",
        ] {
            assert_eq!(l.target(wrong), None, "{wrong}");
        }
        assert!(matches!(
            PortLinks::new("http://127.0.0.1:7071", "tok"),
            Err(OriginError::NotAName { .. })
        ));
        assert!(matches!(
            PortLinks::new("ftp://x", "tok"),
            Err(OriginError::Scheme { .. })
        ));
    }

    #[test]
    fn a_token_opens_only_its_sandbox_port_for_its_use() {
        let l = links();
        let t = l.token(Use::Link, "sbx-a", 80, now() + 60);
        assert!(l.valid(Use::Link, "sbx-a", 80, &t));
        assert!(!l.valid(Use::Session, "sbx-a", 80, &t));
        assert!(!l.valid(Use::Link, "sbx-b", 80, &t));
        assert!(!l.valid(Use::Link, "sbx-a", 81, &t));
        let (_, tag) = t.split_once('.').expect("tag");
        let later = format!("{}.{tag}", now() + 3600);
        assert!(!l.valid(Use::Link, "sbx-a", 80, &later), "expiry is signed");
        let old = l.token(Use::Link, "sbx-a", 80, now() - 1);
        assert!(!l.valid(Use::Link, "sbx-a", 80, &old));
        assert!(!l.valid(Use::Link, "sbx-a", 80, "junk"));
    }

    #[test]
    fn entering_sets_a_host_cookie_and_drops_the_token_from_the_url() {
        let l = links();
        let uri: axum::http::Uri = "/app/?a=1&warren_port_token=9.ff&b=2".parse().expect("uri");
        let resp = enter(&l, "S", &uri);
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);
        assert_eq!(resp.headers()[header::LOCATION], "/app/?a=1&b=2");
        let cookie = resp.headers()[header::SET_COOKIE].to_str().expect("ascii");
        assert!(cookie.starts_with("warren_port=S; Path=/; HttpOnly; SameSite=Lax"));
        assert!(!cookie.contains("Domain"), "host-only: {cookie}");
        assert_eq!(link_token(Some("x=1&warren_port_token=T")), Some("T"));
    }

    #[test]
    fn warren_credentials_never_reach_the_sandbox() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("warren_port=1.aa; app=1"),
        );
        h.append(
            header::COOKIE,
            HeaderValue::from_static("warren_session=s; other=2"),
        );
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer tok"),
        );
        h.insert("x-warren-console", HeaderValue::from_static("1"));
        strip_credentials(&mut h, "tok");
        assert_eq!(h[header::COOKIE], "app=1; other=2");
        assert!(!h.contains_key(header::AUTHORIZATION));
        assert!(!h.contains_key("x-warren-console"));
        let mut own = HeaderMap::new();
        own.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic dXNlcjpwdw=="),
        );
        strip_credentials(&mut own, "tok");
        assert!(
            own.contains_key(header::AUTHORIZATION),
            "the app's own auth goes through"
        );
    }
}
