//! Who may call the door. SandboxFusion's clients (the `sandbox-fusion`
//! package, verl's reward code) send JSON from a program, never from a web
//! page, and most send no token. So a call is refused when:
//!
//! - a token is set (`--sandbox-fusion-token`) and the call does not carry
//!   it as `Authorization: Bearer TOKEN` (401);
//! - it comes from a web page of another origin: an `Origin` other than the
//!   door's own, or `Sec-Fetch-Site: cross-site` (403);
//! - a POST's body is declared as something other than JSON (415), as
//!   SandboxFusion's own server (FastAPI) reads only `application/json`,
//!   `application/*+json` or a body without a type. A page may send
//!   `text/plain` or a form to any address without asking first (a
//!   "simple" request that a browser fires without CORS preflight); JSON it
//!   cannot, and a typeless body from a page still carries its `Origin`.
//!
//! Together they keep a page the operator happens to open from running code
//! through a door on their machine (cross-site request forgery).

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// The token calls must carry, if any.
#[derive(Clone, Default)]
pub struct Guard {
    pub token: Option<String>,
}

fn refuse(status: StatusCode, detail: String) -> Response {
    (status, Json(serde_json::json!({ "detail": detail }))).into_response()
}

/// Why a call is refused, or None when it may go on.
pub(crate) fn check(guard: &Guard, method: &Method, headers: &HeaderMap) -> Option<Response> {
    if let Some(token) = &guard.token {
        use subtle::ConstantTimeEq;
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !bool::from(given.trim().as_bytes().ct_eq(token.as_bytes())) {
            return Some(refuse(
                StatusCode::UNAUTHORIZED,
                "this SandboxFusion door takes a token: send it as 'Authorization: Bearer TOKEN'"
                    .into(),
            ));
        }
    }
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(origin) = text("origin") {
        let own = text("host").map(|host| format!("http://{host}"));
        if own.as_deref() != Some(origin) {
            return Some(refuse(
                StatusCode::FORBIDDEN,
                format!("calls from web pages of another origin ({origin}) are refused"),
            ));
        }
    }
    if text("sec-fetch-site") == Some("cross-site") {
        return Some(refuse(
            StatusCode::FORBIDDEN,
            "calls from web pages of another site are refused".into(),
        ));
    }
    if method == Method::POST {
        let json = match headers.get(header::CONTENT_TYPE) {
            None => true,
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|v| v.split(';').next())
                .map(|v| v.trim().to_ascii_lowercase())
                .and_then(|v| v.strip_prefix("application/").map(str::to_string))
                .is_some_and(|sub| sub == "json" || sub.ends_with("+json")),
        };
        if !json {
            return Some(refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "send the request as JSON (Content-Type: application/json)".into(),
            ));
        }
    }
    None
}

pub(crate) async fn layer(State(guard): State<Guard>, req: Request, next: Next) -> Response {
    match check(&guard, req.method(), req.headers()) {
        Some(refusal) => refusal,
        None => next.run(req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    fn status(guard: &Guard, method: Method, pairs: &[(&'static str, &str)]) -> Option<StatusCode> {
        check(guard, &method, &headers(pairs)).map(|r| r.status())
    }

    const JSON: (&str, &str) = ("content-type", "application/json");

    #[test]
    fn programs_sending_json_pass_and_pages_do_not() {
        let open = Guard::default();
        assert_eq!(status(&open, Method::POST, &[JSON]), None);
        assert_eq!(
            status(
                &open,
                Method::POST,
                &[("content-type", "Application/JSON; charset=utf-8")]
            ),
            None
        );
        assert_eq!(status(&open, Method::GET, &[]), None);
        // A simple request a page may fire at any address.
        assert_eq!(
            status(&open, Method::POST, &[("content-type", "text/plain")]),
            Some(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        );
        assert_eq!(
            status(
                &open,
                Method::POST,
                &[("content-type", "application/x-www-form-urlencoded")]
            ),
            Some(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        );
        // As FastAPI: a body without a type is read as JSON.
        assert_eq!(status(&open, Method::POST, &[]), None);
        assert_eq!(
            status(
                &open,
                Method::POST,
                &[("content-type", "application/vnd.x+json")]
            ),
            None
        );
        let page = [
            JSON,
            ("host", "127.0.0.1:8080"),
            ("origin", "http://evil.example"),
        ];
        assert_eq!(
            status(&open, Method::POST, &page),
            Some(StatusCode::FORBIDDEN)
        );
        let same = [
            JSON,
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080"),
        ];
        assert_eq!(status(&open, Method::POST, &same), None);
        let cross = [JSON, ("sec-fetch-site", "cross-site")];
        assert_eq!(
            status(&open, Method::POST, &cross),
            Some(StatusCode::FORBIDDEN)
        );
    }

    #[test]
    fn a_token_once_set_is_required() {
        let guard = Guard {
            token: Some("s3cret".into()),
        };
        assert_eq!(
            status(&guard, Method::POST, &[JSON]),
            Some(StatusCode::UNAUTHORIZED)
        );
        let wrong = [JSON, ("authorization", "Bearer nope")];
        assert_eq!(
            status(&guard, Method::POST, &wrong),
            Some(StatusCode::UNAUTHORIZED)
        );
        let right = [JSON, ("authorization", "Bearer s3cret")];
        assert_eq!(status(&guard, Method::POST, &right), None);
        assert_eq!(
            status(&guard, Method::GET, &[]),
            Some(StatusCode::UNAUTHORIZED)
        );
    }
}
