//! Network routes: changing an `allowlist` sandbox's rules at runtime, and
//! inbound access to a TCP port inside a sandbox (a raw tunnel for
//! `warren port-forward`, and an HTTP route for servers the trainer calls).

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, patch, post};
use axum::Extension;
use axum::{Json, Router};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use warren_core::{ApiError, SandboxInfo};

use crate::api::json_body::JsonBody;
use crate::api::port_door::PortLink;
use crate::api::{ApiResult, AppState, Caller, St};

pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/sandboxes/{id}/network", patch(set_network))
        .route(
            "/v1/sandboxes/{id}/ports/{port}",
            post(port_connect).get(port_link),
        )
        .route("/v1/sandboxes/{id}/ports/{port}/", any(port_http_root))
        .route("/v1/sandboxes/{id}/ports/{port}/{*path}", any(port_http))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NetworkRules {
    /// `HOST:PORT` rules (names, `*.suffix`, IPv4 addresses, CIDRs).
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct NetworkChange {
    sandbox: SandboxInfo,
    /// Live connections the new rules no longer allow, now closed.
    closed: Vec<String>,
    /// Ports the new rules name that a server in the sandbox already
    /// listens on: those destinations are reached through the explicit
    /// proxy (`HTTP(S)_PROXY`) only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unlistened_ports: Vec<u16>,
}

/// Replace an `allowlist` sandbox's rules. Applied atomically; live
/// connections the new rules do not allow are closed.
#[utoipa::path(patch, path = "/v1/sandboxes/{id}/network", request_body = NetworkRules,
    responses((status = 200, body = NetworkChange), (status = 400, body = warren_core::ErrorBody), (status = 409, body = warren_core::ErrorBody)))]
pub(crate) async fn set_network(
    State(st): St,
    Path(id): Path<String>,
    JsonBody(rules): JsonBody<NetworkRules>,
) -> ApiResult<Json<NetworkChange>> {
    st.control.io().touch(&id).await;
    let (sandbox, change) = st.control.set_network(&id, rules.allow, rules.deny).await?;
    Ok(Json(NetworkChange {
        sandbox,
        closed: change.closed,
        unlistened_ports: change.unlistened,
    }))
}

/// A connection to `port` on the sandbox's loopback; any call on a sandbox
/// renews its lease.
async fn open_port(
    st: &AppState,
    id: &str,
    port: u16,
) -> Result<Box<dyn warren_node_api::Tunnel>, ApiError> {
    st.control.io().connect_port(id, port).await
}

fn port_of(raw: &str) -> Result<u16, ApiError> {
    raw.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
        ApiError::bad_request(format!("port {raw:?} must be a number from 1 to 65535"))
    })
}

/// A raw TCP tunnel to a port on the sandbox's loopback: send
/// `Connection: Upgrade` and `Upgrade: tcp`; after `101 Switching
/// Protocols` the connection carries the port's bytes both ways.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/ports/{port}",
    responses((status = 101, description = "tunnel open"), (status = 409, body = warren_core::ErrorBody)))]
pub(crate) async fn port_connect(
    State(st): St,
    Path((id, port)): Path<(String, String)>,
    mut req: Request,
) -> ApiResult<Response> {
    let port = port_of(&port)?;
    let wants_tcp = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("tcp"));
    if !wants_tcp {
        return Err(ApiError::bad_request(
            "send 'Connection: Upgrade' and 'Upgrade: tcp' to open a tunnel, or use /v1/sandboxes/{id}/ports/{port}/PATH for HTTP",
        )
        .into());
    }
    let upstream = open_port(&st, &id, port).await?;
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        if let Ok(up) = on_upgrade.await {
            let mut up = TokioIo::new(up);
            let mut upstream = upstream;
            let _ = tokio::io::copy_bidirectional(&mut up, &mut upstream).await;
        }
    });
    let mut resp = StatusCode::SWITCHING_PROTOCOLS.into_response();
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    resp.headers_mut()
        .insert(header::UPGRADE, HeaderValue::from_static("tcp"));
    Ok(resp)
}

/// A link that opens the port in a browser, on an origin of its own
/// (`PORT-ID.<ports host>`, see `port_door`): how the console's Open button
/// shows a sandbox's web page without letting it near the console.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports/{port}",
    responses((status = 200, body = PortLink), (status = 404, body = warren_core::ErrorBody), (status = 409, body = warren_core::ErrorBody)))]
pub(crate) async fn port_link(
    State(st): St,
    Path((id, port)): Path<(String, String)>,
) -> ApiResult<Json<PortLink>> {
    let port = port_of(&port)?;
    st.control.records().get(&id).await?;
    let links = st.ports.as_ref().ok_or_else(|| {
        ApiError::conflict(
            "this daemon serves no sandbox ports to browsers (start it with --ports-listen); use /v1/sandboxes/{id}/ports/{port}/PATH with the API token",
        )
    })?;
    Ok(Json(links.link(&id, port)))
}

async fn port_http_root(
    st: St,
    caller: Option<Extension<Caller>>,
    Path((id, port)): Path<(String, String)>,
    req: Request,
) -> ApiResult<Response> {
    proxy_http(st, caller, id, port, String::new(), req).await
}

/// Any HTTP request, forwarded to `PATH` on the sandbox's port (on its
/// loopback); the response streams back.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports/{port}/{path}",
    responses((status = 200, description = "the sandbox server's response"), (status = 409, body = warren_core::ErrorBody)))]
pub(crate) async fn port_http(
    st: St,
    caller: Option<Extension<Caller>>,
    Path((id, port, path)): Path<(String, String, String)>,
    req: Request,
) -> ApiResult<Response> {
    proxy_http(st, caller, id, port, path, req).await
}

/// For programs holding the API token (a trainer calling a server in the
/// sandbox). A browser never gets a sandbox's page on the API's origin:
/// a console session is refused here (the page would run beside it), and
/// what comes back is marked `Content-Security-Policy: sandbox` (no script,
/// an opaque origin) should a browser see it anyway.
async fn proxy_http(
    State(st): St,
    caller: Option<Extension<Caller>>,
    id: String,
    port: String,
    path: String,
    req: Request,
) -> ApiResult<Response> {
    let port = port_of(&port)?;
    if caller.map(|Extension(c)| c) != Some(Caller::Token) {
        return Err(ApiError::new(
            warren_core::ErrorCode::Forbidden,
            format!(
                "a sandbox's pages open on their own origin, never the console's: GET /v1/sandboxes/{id}/ports/{port} for a link (this route takes the API token only)"
            ),
        )
        .into());
    }
    let (mut parts, body) = req.into_parts();
    let query = parts
        .uri
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    parts.uri = format!("/{path}{query}")
        .parse()
        .map_err(|e| ApiError::bad_request(format!("path {path:?}: {e}")))?;
    // The trainer's token and cookies are for Warren, not for the sandbox.
    parts.headers.remove(header::AUTHORIZATION);
    crate::api::port_door::strip_credentials(&mut parts.headers, &st.token);
    let mut resp = st
        .control
        .io()
        .forward_http(&id, port, Request::from_parts(parts, body), None)
        .await?;
    resp.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox"),
    );
    Ok(resp)
}
