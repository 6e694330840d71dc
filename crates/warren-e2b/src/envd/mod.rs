//! The sandbox side of E2B (`E2B_SANDBOX_URL`): what envd serves inside an
//! E2B sandbox, served here for Warren sandboxes. Every request names its
//! sandbox with `E2b-Sandbox-Id` (old SDKs only send the access token,
//! which identifies it too) and a port with `E2b-Sandbox-Port`: envd's port
//! is answered here, any other is forwarded to that port in the sandbox
//! (an E2B sandbox's, with its traffic or access token).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use warren_control::access::Call;
use warren_control::Control;
use warren_core::tenant::{Principal, Role};
use warren_core::{SandboxInfo, SandboxState, Selector};

use crate::{E2b, ENVD_PORT, FRONT_LABEL};

pub mod files;
pub mod filesystem;
pub mod paths;
pub mod ports;
pub mod process;
pub mod users;

/// The sandbox a request is for, once routing found it live.
#[derive(Clone)]
pub struct Target {
    pub id: String,
    pub control: Arc<Control>,
    /// Its accounts: who a call that names no user acts as, owner names.
    pub accounts: Arc<users::Accounts>,
}

impl Target {
    /// The user a call acts as: the one it names, else the default.
    pub fn user(&self, headers: &HeaderMap) -> Option<String> {
        paths::user(headers).or_else(|| self.accounts.default_user.clone())
    }
}

pub fn router(e2b: Arc<E2b>) -> Router {
    Router::new()
        .route("/health", get(health))
        // Uploads stream to the sandbox, whatever their size.
        .route(
            "/files",
            get(files::read)
                .post(files::write)
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/process.Process/{method}", post(process::rpc))
        .route("/filesystem.Filesystem/{method}", post(filesystem::rpc))
        .layer(middleware::from_fn_with_state(e2b.clone(), route))
        .with_state(e2b)
}

/// E2B's answer for a sandbox that is not there: the SDK recognises "was
/// not found" and reports the sandbox as not running.
fn not_found(id: &str) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        Json(json!({"sandboxId": id, "message": "The sandbox was not found", "code": 502})),
    )
        .into_response()
}

fn plain_error(status: StatusCode, message: impl Into<String>) -> Response {
    let message = message.into();
    (
        status,
        Json(json!({"code": status.as_u16(), "message": message})),
    )
        .into_response()
}

async fn route(State(e2b): State<Arc<E2b>>, mut req: Request, next: Next) -> Response {
    let Some(control) = e2b.control() else {
        let mut resp = plain_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "this Warren replica does not lead the cluster yet; retry in a moment",
        );
        resp.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("1"),
        );
        return resp;
    };
    let headers = req.headers();
    let token = header(headers, "x-access-token");
    // `PORT-ID.DOMAIN` (E2B's `get_host`): the Host names sandbox and port.
    let by_host = e2b.domain.as_ref().and_then(|d| {
        headers
            .get(axum::http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .and_then(|h| d.target(h))
    });
    let signed = (req.uri().path() == "/files")
        .then(|| axum::extract::Query::<files::FileQuery>::try_from_uri(req.uri()).ok())
        .flatten()
        .filter(|q| q.0.signature.is_some());
    let id = match (header(headers, "e2b-sandbox-id"), &by_host) {
        (Some(id), _) => id.to_string(),
        (None, Some((id, _))) => id.clone(),
        (None, None) => {
            let found = match (token, &signed) {
                (Some(t), _) => live_e2b_sandboxes(&control)
                    .await
                    .into_iter()
                    .find(|id| e2b.token_ok(id, t)),
                // A signed URL (`download_url`, `upload_url`) is opened by
                // whatever holds it, with no header: its signature names
                // the sandbox (it is made with that sandbox's token).
                (None, Some(q)) if files::expired(&q.0) => return files::expired_answer(),
                (None, Some(q)) => {
                    let operation = files::operation_of(req.method());
                    let found = live_e2b_sandboxes(&control)
                        .await
                        .into_iter()
                        .find(|id| files::signed_for(&e2b, id, &q.0, operation));
                    if found.is_none() {
                        return plain_error(
                            StatusCode::UNAUTHORIZED,
                            "this signed URL matches no running sandbox: it expired, or was signed for another path, operation or user",
                        );
                    }
                    found
                }
                (None, None) => {
                    return plain_error(
                        StatusCode::BAD_REQUEST,
                        "no E2b-Sandbox-Id header: set E2B_SANDBOX_URL and use e2b >= 2.7, whose SDK sends it",
                    )
                }
            };
            match found {
                Some(id) => id,
                None => return not_found(""),
            }
        }
    };
    let row = match control.records().get(&id).await {
        Ok(row) if row.state == SandboxState::Running => row,
        Ok(row) if row.state == SandboxState::Paused => match auto_resume(&control, row).await {
            Some(row) => row,
            None => return not_found(&id),
        },
        _ => return not_found(&id),
    };
    let port = match header(headers, "e2b-sandbox-port").map(str::parse::<u16>) {
        None => by_host.as_ref().map_or(ENVD_PORT, |(_, p)| *p),
        Some(Ok(p)) => p,
        Some(Err(_)) => {
            return plain_error(
                StatusCode::BAD_REQUEST,
                "E2b-Sandbox-Port must be a port number",
            )
        }
    };
    if port != ENVD_PORT {
        // Another port: only of a sandbox made through E2B, with its
        // traffic token (E2B's SDKs send that or the access token). Where
        // the operator lets E2B's public traffic through
        // (`--e2b-public-traffic`), a sandbox made with
        // `allowPublicTraffic` (E2B's default) takes requests without one.
        let labels = &row.spec.labels;
        let made_by_e2b = labels.get(FRONT_LABEL.0).map(String::as_str) == Some(FRONT_LABEL.1);
        if !made_by_e2b {
            return plain_error(
                StatusCode::FORBIDDEN,
                "only the ports of sandboxes made through E2B's API are served here",
            );
        }
        let private = labels.contains_key(crate::PRIVATE_TRAFFIC_LABEL);
        let traffic = header(headers, "e2b-traffic-access-token");
        let allowed = (e2b.public_traffic && !private)
            || token.is_some_and(|t| e2b.token_ok(&id, t))
            || traffic.is_some_and(|t| e2b.traffic_ok(&id, t));
        if !allowed {
            return plain_error(
                StatusCode::FORBIDDEN,
                "a sandbox port needs the sandbox's E2B-Traffic-Access-Token (or X-Access-Token) from the create or connect call",
            );
        }
        let mask = labels.get(crate::MASK_HOST_LABEL).map(|host| {
            match labels.get(crate::MASK_PORT_LABEL).map(String::as_str) {
                Some("port") => format!("{host}:{port}"),
                Some(p) if !p.is_empty() => format!("{host}:{p}"),
                _ => host.clone(),
            }
        });
        let routed_by = by_host.is_some().then(|| {
            req.headers()
                .get(axum::http::header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        });
        return ports::forward(&control, &id, port, req, mask.or(routed_by)).await;
    }
    // envd's own token rule: everything but the health probe needs the
    // sandbox's access token; /files may instead carry a signed URL,
    // which its handler checks.
    let path = req.uri().path();
    let exempt = path == "/health" || path == "/files";
    if !exempt && !token.is_some_and(|t| e2b.token_ok(&id, t)) {
        return plain_error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong X-Access-Token: use the envdAccessToken the create or connect call returned",
        );
    }
    let accounts = e2b.accounts.of(&control, &id).await;
    let audited = changes(req.method(), req.uri().path())
        .then(|| (req.method().clone(), req.uri().path().to_string()));
    req.extensions_mut().insert(Target {
        id: id.clone(),
        control: control.clone(),
        accounts,
    });
    let resp = next.run(req).await;
    if let Some((method, path)) = audited {
        // Asked with the sandbox's access token, which only its tenant was
        // given (by the create or a connect).
        let who = Principal::Tenant {
            tenant: row.tenant.clone(),
            role: Role::User,
            token: "envd-access-token".into(),
        };
        let call = Call {
            who: &who,
            door: "envd",
            method: &method,
            route: &path,
            key: &id,
        };
        control.gate().audit_call(&call, resp.status().as_u16());
    }
    resp
}

/// Whether an envd call changes something (and so is audited): starting or
/// driving a process, writing, moving or removing a file.
fn changes(method: &axum::http::Method, path: &str) -> bool {
    match path.rsplit_once('/') {
        Some(("/process.Process", _)) => !path.ends_with("/List"),
        Some(("/filesystem.Filesystem", call)) => {
            matches!(call, "MakeDir" | "Move" | "Remove")
        }
        _ => path == "/files" && method != axum::http::Method::GET,
    }
}

/// E2B's auto-resume: a paused sandbox made with `autoResume` is resumed
/// by the traffic that reaches it (envd's calls, a port), with the timeout
/// it was made with. None: it stays paused (made without, or the resume
/// failed), and the caller is told it is not running.
async fn auto_resume(control: &Control, row: SandboxInfo) -> Option<SandboxInfo> {
    let secs: u64 = row
        .spec
        .labels
        .get(crate::AUTO_RESUME_LABEL)?
        .parse()
        .ok()?;
    let ttl = crate::api::ttl(secs).ok()?;
    let resumed = control.set_paused(&row.id, false).await;
    match resumed {
        Ok(row) => {
            if let Err(e) = control.set_ttl(&row.id, ttl).await {
                tracing::warn!(sandbox = %row.id, error = %e.message, "auto-resume: setting the timeout");
            }
            Some(row)
        }
        Err(e) => {
            tracing::warn!(sandbox = %row.id, error = %e.message, "auto-resume");
            None
        }
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// The live sandboxes made through E2B: among them, the one a token or a
/// signed URL was made for (old SDKs send no sandbox id after `connect`).
async fn live_e2b_sandboxes(control: &Control) -> Vec<String> {
    let Ok(selector) = Selector::parse(&format!("{}={}", FRONT_LABEL.0, FRONT_LABEL.1)) else {
        return Vec::new();
    };
    control
        .records()
        .list(
            // Every tenant's: the token's MAC, checked by the caller, says
            // which sandbox it was made for.
            &warren_core::tenant::Principal::Operator,
            &[SandboxState::Running, SandboxState::Paused],
            &selector,
        )
        .await
        .map(|live| live.into_iter().map(|s| s.id).collect())
        .unwrap_or_default()
}

async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}
