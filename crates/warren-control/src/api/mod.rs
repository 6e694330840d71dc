//! The public HTTP API (`/v1`, docs/api.md): the router, authentication,
//! errors and streaming; the handlers, by resource, in the modules below.
//! Handlers parse HTTP and call `Control`; they decide nothing themselves.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use utoipa::OpenApi;
use warren_core::tenant::Principal;
use warren_core::{
    ApiError, BatchInfo, BatchRequest, ErrorBody, ExecEvent, ExecRequest, SandboxInfo, SandboxSpec,
};

use crate::control::Control;

mod access;
mod audit;
mod batches;
mod builds;
pub mod console;
mod exec_ws;
mod files;
mod fleet;
mod history;
mod images;
mod json_body;
mod logs;
pub mod network;
mod nodes;
mod pools;
pub mod port_door;
mod profiles;
mod sandboxes;
mod secrets;
mod tenants;
mod usage;
mod volumes;

use audit::*;
use batches::*;
use builds::*;
use exec_ws::*;
use files::*;
use fleet::*;
use history::*;
use images::*;
use logs::*;
use nodes::*;
use pools::*;
use profiles::*;
use sandboxes::*;
use secrets::*;
use tenants::*;
use usage::*;
use volumes::*;

pub struct AppState {
    pub control: Arc<Control>,
    pub token: String,
    /// How nodes join (a cluster's control plane); None for `warren up`.
    pub join: Option<Join>,
    /// The web console's sessions (`/ui/`).
    pub console: console::Console,
    /// Links to sandbox ports for browsers (their own origin); None when
    /// the daemon serves no port door.
    pub ports: Option<port_door::PortLinks>,
}

/// How a request proved it may call the API (a request extension set by
/// `auth`): a page a sandbox serves is never given what only the console
/// may do with its session.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Caller {
    Token,
    ConsoleSession,
}

pub use nodes::Join;

pub(crate) type St = State<Arc<AppState>>;

/// Who calls (set by `auth` on every API request).
pub(crate) type Who = axum::Extension<Principal>;

pub struct Failure(pub ApiError);

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        Failure(e)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, Json(self.0.body())).into_response();
        if let Some(ms) = self.0.retry_after_ms {
            if let Ok(v) = HeaderValue::from_str(&ms.div_ceil(1000).max(1).to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        resp
    }
}

pub(crate) type ApiResult<T> = Result<T, Failure>;

#[derive(OpenApi)]
#[openapi(
    info(title = "Warren API", version = "1", description = "Isolated, disposable sandboxes for agent and RL training."),
    paths(list_pools, get_pool, put_pool, delete_pool, list_profiles, get_profile, reset_profile, export_profiles, import_profiles, logs_by_label, nodes, create_batch, list_batches, get_batch, delete_batch, create_sandbox, list_sandboxes, get_sandbox, delete_sandbox, delete_sandboxes, run, exec, exec_stdin, exec_resize, exec_ws, heartbeat, pause, resume, set_ttl, set_reclaim, fork_sandbox, put_file, get_file, path_op, logs, watch, network::set_network, network::port_connect, network::port_link, network::port_http, events, usage, fleet, history, list_images, import_image, delete_image, pull_image, push_image, gc_images, prewarm_image, commit_sandbox, create_build, get_build, list_volumes, create_volume, delete_volume, list_secrets, create_secret, get_secret, update_secret, delete_secret, list_tenants, create_tenant, get_tenant, set_tenant, delete_tenant, list_tokens, create_token, revoke_token, whoami, audit, healthz),
    components(schemas(port_door::PortLink, warren_core::spec::ForkRequest, warren_core::spec::ForkOrigin, PullRequest, PushRequest, GcRequest, CommitRequest, UsageList, UsageRow, warren_core::fleet::Fleet, warren_core::fleet::FleetGroup, warren_core::fleet::CpuFigures, warren_core::fleet::MemoryFigures, warren_core::history::History, warren_core::history::HistoryPoint, PrewarmRequest, PrewarmResult, PrewarmNode, BatchRequest, BatchInfo, SandboxSpec, SandboxInfo, ExecRequest, ExecEvent, warren_core::pool::PoolSpec, warren_core::pool::PoolInfo, warren_core::RunRequest, warren_core::RunEvent, warren_core::run::RunSandbox, warren_core::WindowSize, ErrorBody, warren_core::Event, warren_node_api::PathOp, warren_node_api::PathEntry, warren_node_api::PathKind, warren_core::build::BuildEvent, warren_core::build::BuildInfo, warren_core::build::BuildState, warren_core::volume::VolumeRequest, warren_core::volume::VolumeInfo, warren_core::volume::VolumeMount, warren_core::secret::SecretRef, warren_core::secret::SecretRequest, warren_core::secret::SecretInfo, SecretUpdate, warren_core::tenant::TenantRequest, warren_core::tenant::TenantSpec, warren_core::tenant::TenantInfo, warren_core::tenant::TenantUsage, warren_core::tenant::Quota, warren_core::tenant::Role, warren_core::tenant::TokenRequest, warren_core::tenant::TokenInfo, warren_core::tenant::NewToken, WhoAmI, warren_core::audit::AuditEntry)),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

struct BearerAuth;
impl utoipa::Modify for BearerAuth {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let comps = api.components.get_or_insert_with(Default::default);
        comps.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route(
            "/v1/sandboxes",
            post(create_sandbox)
                .get(list_sandboxes)
                .delete(delete_sandboxes),
        )
        .route(
            "/v1/sandboxes/{id}",
            get(get_sandbox).delete(delete_sandbox),
        )
        .route("/v1/run", post(run))
        .route("/v1/pools", get(list_pools))
        .route(
            "/v1/pools/{name}",
            get(get_pool).put(put_pool).delete(delete_pool),
        )
        .route("/v1/sandboxes/{id}/exec", post(exec))
        .route("/v1/sandboxes/{id}/execs/{exec_id}/stdin", post(exec_stdin))
        .route(
            "/v1/sandboxes/{id}/execs/{exec_id}/resize",
            post(exec_resize),
        )
        .route("/v1/sandboxes/{id}/exec/ws", get(exec_ws))
        .route("/v1/sandboxes/{id}/heartbeat", post(heartbeat))
        .route("/v1/sandboxes/{id}/pause", post(pause))
        .route("/v1/sandboxes/{id}/resume", post(resume))
        .route("/v1/sandboxes/{id}/ttl", post(set_ttl))
        .route("/v1/sandboxes/{id}/reclaim", post(set_reclaim))
        .route("/v1/sandboxes/{id}/commit", post(commit_sandbox))
        .route("/v1/sandboxes/{id}/fork", post(fork_sandbox))
        .route("/v1/sandboxes/{id}/files", get(get_file).put(put_file))
        .route("/v1/sandboxes/{id}/paths", post(path_op))
        .route("/v1/sandboxes/{id}/logs", get(logs))
        .route("/v1/sandboxes/{id}/watch", get(watch))
        .merge(network::routes())
        .route("/v1/events", get(events))
        .route("/v1/usage", get(usage))
        .route("/v1/fleet", get(fleet))
        .route("/v1/history", get(history))
        .route("/v1/logs", get(logs_by_label))
        .route("/v1/nodes", get(nodes))
        .route("/v1/nodes/{name}/cordon", post(cordon))
        .route("/v1/nodes/{name}/uncordon", post(uncordon))
        .route("/v1/nodes/{name}/drain", post(drain))
        .route("/v1/nodes/{name}", axum::routing::delete(remove))
        .route("/v1/profiles", get(list_profiles))
        .route("/v1/profiles/export", get(export_profiles))
        .route("/v1/profiles/import", post(import_profiles))
        .route("/v1/profiles/{name}", get(get_profile))
        .route("/v1/profiles/{name}/reset", post(reset_profile))
        .route("/v1/batches", post(create_batch).get(list_batches))
        .route("/v1/batches/{id}", get(get_batch).delete(delete_batch))
        .route("/v1/builds", post(create_build))
        .route("/v1/builds/{id}", get(get_build))
        .route("/v1/volumes", get(list_volumes).post(create_volume))
        .route("/v1/volumes/{name}", axum::routing::delete(delete_volume))
        .route("/v1/secrets", get(list_secrets).post(create_secret))
        .route(
            "/v1/secrets/{name}",
            get(get_secret).put(update_secret).delete(delete_secret),
        )
        .route("/v1/images", get(list_images))
        .route("/v1/images/import", post(import_image))
        .route("/v1/images/pull", post(pull_image))
        .route("/v1/images/push", post(push_image))
        .route("/v1/images/gc", post(gc_images))
        .route("/v1/images/prewarm", post(prewarm_image))
        .route(
            "/v1/images/{*reference}",
            axum::routing::delete(delete_image),
        )
        .route("/v1/tenants", get(list_tenants).post(create_tenant))
        .route(
            "/v1/tenants/{name}",
            get(get_tenant).put(set_tenant).delete(delete_tenant),
        )
        .route("/v1/tokens", get(list_tokens).post(create_token))
        .route("/v1/whoami", get(whoami))
        .route("/v1/audit", get(audit))
        .route("/v1/tokens/{id}", axum::routing::delete(revoke_token))
        .route("/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), access::gate))
        .layer(middleware::from_fn_with_state(state.clone(), ready_gate))
        .layer(middleware::from_fn_with_state(state.clone(), auth));
    let routed = Router::new()
        .route("/healthz", get(healthz))
        .merge(nodes::agent_routes())
        .merge(console::routes())
        .merge(api)
        // For bodies read whole (JSON); uploads and image imports stream.
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY))
        .layer(middleware::from_fn(close_after_unread_body))
        .with_state(state.clone());
    // Names become ids before the routes above see the path.
    Router::new()
        .fallback_service(routed)
        .layer(middleware::from_fn_with_state(state.clone(), names_to_ids))
        .with_state(state)
}

/// The largest request body read into memory (a spec, an exec request with
/// its stdin): files go through the streaming upload instead.
pub const MAX_JSON_BODY: usize = 32 << 20;

/// API calls wait until the daemon has taken over its sandboxes after a
/// start (`/healthz` answers at once, with what recovery is doing).
async fn ready_gate(State(st): St, req: Request, next: Next) -> Response {
    if !st.control.lifecycle().is_ready() {
        if let Err(e) = st.control.lifecycle().wait_ready().await {
            return Failure(e).into_response();
        }
    }
    next.run(req).await
}

/// An error answered before the request body was read leaves that body in
/// the connection; say `Connection: close` so clients do not reuse it.
pub(crate) async fn close_after_unread_body(req: Request, next: Next) -> Response {
    let has_body = req.headers().contains_key(header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v != "0");
    let mut resp = next.run(req).await;
    if resp.status() == StatusCode::PAYLOAD_TOO_LARGE
        && resp.headers().get(header::CONTENT_TYPE)
            != Some(&HeaderValue::from_static("application/json"))
    {
        resp = Failure(ApiError::new(
            warren_core::ErrorCode::PayloadTooLarge,
            format!(
                "the request body is larger than {} MiB; send large data as a file (PUT /v1/sandboxes/{{id}}/files) instead",
                MAX_JSON_BODY >> 20
            ),
        ))
        .into_response();
    }
    if has_body && (resp.status().is_client_error() || resp.status().is_server_error()) {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// The bearer token, or a console session's cookie (see `console`): one
/// that changes something or opens a WebSocket must come from the console.
/// Sets who calls ([`Principal`]) and how ([`Caller`]) for what follows.
async fn auth(State(st): St, mut req: Request, next: Next) -> Response {
    match caller(&st, req.method(), req.headers()).await {
        Ok((caller, who)) => {
            req.extensions_mut().insert(caller);
            req.extensions_mut().insert(who);
            next.run(req).await
        }
        Err(refused) => *refused,
    }
}

/// Who is calling, or the answer that refuses them.
async fn caller(
    st: &AppState,
    method: &axum::http::Method,
    headers: &axum::http::HeaderMap,
) -> Result<(Caller, Principal), Box<Response>> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let (how, token) = match given {
        Some(given) => (Caller::Token, given.to_string()),
        None => match st.console.session_token(headers) {
            Some(token) => {
                if let Err(why) = st.console.same_site(method, headers) {
                    return Err(Box::new(console::forbidden(why)));
                }
                (Caller::ConsoleSession, token)
            }
            None => return Err(Box::new(unauthorized())),
        },
    };
    match st.control.tenants().authenticate(&token).await {
        Ok(Some(who)) => Ok((how, who)),
        Ok(None) => Err(Box::new(unauthorized())),
        Err(e) => Err(Box::new(Failure(e).into_response())),
    }
}

fn unauthorized() -> Response {
    Failure(ApiError::new(
        warren_core::ErrorCode::Unauthorized,
        "missing or wrong API token: send 'Authorization: Bearer <token>' with the token from <home>/token, WARREN_TOKEN or `warren token create`",
    ))
    .into_response()
}

/// `/v1/sandboxes/NAME/...` is `/v1/sandboxes/ID/...` of the live sandbox
/// of that name (as Docker takes a container's name wherever its id goes).
/// Before routing, so every sandbox route takes names; only for a caller
/// the API would let in (no store read for a stranger).
async fn names_to_ids(State(st): St, mut req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let Some(rest) = path.strip_prefix("/v1/sandboxes/") else {
        return next.run(req).await;
    };
    let (segment, tail) = rest.split_once('/').map_or((rest, ""), |(s, t)| (s, t));
    let is_name = !segment.starts_with(warren_core::sandbox_name::ID_PREFIX)
        && segment
            .parse::<warren_core::sandbox_name::SandboxName>()
            .is_ok();
    if !is_name {
        return next.run(req).await;
    }
    let Ok((_, who)) = caller(&st, req.method(), req.headers()).await else {
        return next.run(req).await;
    };
    let unnamed = || {
        Failure(ApiError::not_found(format!(
            "no sandbox is named {segment} (`warren ps` lists them)"
        )))
        .into_response()
    };
    // Another tenant's name is no name at all (its id is not shown).
    let id = match st.control.records().named(&who, segment).await {
        Ok(Some(id)) => id,
        Ok(None) => return unnamed(),
        Err(e) => return Failure(e).into_response(),
    };
    let mut rewritten = format!("/v1/sandboxes/{id}");
    if !tail.is_empty() || path.ends_with('/') {
        rewritten.push('/');
        rewritten.push_str(tail);
    }
    if let Some(q) = req.uri().query() {
        rewritten.push('?');
        rewritten.push_str(q);
    }
    if let Ok(uri) = rewritten.parse() {
        *req.uri_mut() = uri;
    }
    next.run(req).await
}

/// A streamed answer of one JSON object per line; it ends when the daemon
/// begins to stop (so a clean stop never waits on an open stream).
fn ndjson<S, T>(st: &AppState, items: S) -> Response
where
    S: futures_util::Stream<Item = T> + Send + 'static,
    T: serde::Serialize,
{
    let stream = items
        .take_until(st.control.lifecycle().stopped())
        .map(|item| {
            let mut line = serde_json::to_vec(&item).unwrap_or_default();
            line.push(b'\n');
            Ok::<_, std::io::Error>(Bytes::from(line))
        });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// JSON lines that are bytes already (a log), streamed as they come.
fn ndjson_lines(lines: crate::streams::ByteStream) -> Response {
    let body = Body::from_stream(lines.map(|r| r.map_err(std::io::Error::other)));
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

/// Alive: `ok`, or what start-up recovery is doing (API calls wait for it).
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "alive")))]
async fn healthz(State(st): St) -> String {
    format!("{}\n", st.control.lifecycle().status())
}

/// Prometheus metrics (text format).
async fn metrics(State(st): St) -> Response {
    let text = st.control.telemetry().metrics_text().await;
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
