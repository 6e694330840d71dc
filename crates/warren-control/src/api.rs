//! The public HTTP API (`/v1`, ARCHITECTURE §5).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use serde::Deserialize;
use utoipa::OpenApi;
use warren_core::image_ref::registry_host;
use warren_core::state::reason;
use warren_core::{
    ApiError, BatchInfo, BatchRequest, ErrorBody, ExecEvent, ExecRequest, SandboxInfo, SandboxSpec,
    SandboxState, Selector,
};
use warren_node_api::{FileKind, PullUpdate, WriteFile};

use crate::control::{node_error, Control};

pub struct AppState {
    pub control: Arc<Control>,
    pub token: String,
}

pub(crate) type St = State<Arc<AppState>>;

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
    paths(list_profiles, get_profile, reset_profile, export_profiles, import_profiles, logs_by_label, nodes, create_batch, list_batches, get_batch, delete_batch, create_sandbox, list_sandboxes, get_sandbox, delete_sandbox, delete_sandboxes, exec, heartbeat, pause, resume, set_ttl, put_file, get_file, logs, crate::net_api::set_network, crate::net_api::port_connect, crate::net_api::port_http, events, list_images, import_image, delete_image, pull_image, push_image, gc_images, prewarm_image, commit_sandbox, healthz),
    components(schemas(PullRequest, PushRequest, GcRequest, CommitRequest, PrewarmRequest, PrewarmResult, PrewarmNode, BatchRequest, BatchInfo, SandboxSpec, SandboxInfo, ExecRequest, ExecEvent, ErrorBody, warren_core::Event)),
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
        .route("/v1/sandboxes/{id}/exec", post(exec))
        .route("/v1/sandboxes/{id}/heartbeat", post(heartbeat))
        .route("/v1/sandboxes/{id}/pause", post(pause))
        .route("/v1/sandboxes/{id}/resume", post(resume))
        .route("/v1/sandboxes/{id}/ttl", post(set_ttl))
        .route("/v1/sandboxes/{id}/commit", post(commit_sandbox))
        .route("/v1/sandboxes/{id}/files", get(get_file).put(put_file))
        .route("/v1/sandboxes/{id}/logs", get(logs))
        .merge(crate::net_api::routes())
        .route("/v1/events", get(events))
        .route("/v1/logs", get(logs_by_label))
        .route("/v1/nodes", get(nodes))
        .route("/v1/profiles", get(list_profiles))
        .route("/v1/profiles/export", get(export_profiles))
        .route("/v1/profiles/import", post(import_profiles))
        .route("/v1/profiles/{name}", get(get_profile))
        .route("/v1/profiles/{name}/reset", post(reset_profile))
        .route("/v1/batches", post(create_batch).get(list_batches))
        .route("/v1/batches/{id}", get(get_batch).delete(delete_batch))
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
        .route("/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .layer(middleware::from_fn_with_state(state.clone(), ready_gate))
        .layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .route("/healthz", get(healthz))
        .merge(api)
        // For bodies read whole (JSON); uploads and image imports stream.
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY))
        .layer(middleware::from_fn(close_after_unread_body))
        .with_state(state)
}

/// The largest request body read into memory (a spec, an exec request with
/// its stdin): files go through the streaming upload instead.
pub const MAX_JSON_BODY: usize = 32 << 20;

/// API calls wait until the daemon has taken over its sandboxes after a
/// start (`/healthz` answers at once, with what recovery is doing).
async fn ready_gate(State(st): St, req: Request, next: Next) -> Response {
    if !st.control.lifecycle.is_ready() {
        if let Err(e) = st.control.lifecycle.wait_ready().await {
            return Failure(e).into_response();
        }
    }
    next.run(req).await
}

/// An error answered before the request body was read leaves that body in
/// the connection; say `Connection: close` so clients do not reuse it.
async fn close_after_unread_body(req: Request, next: Next) -> Response {
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

async fn auth(State(st): St, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    use subtle::ConstantTimeEq;
    if given.as_bytes().ct_eq(st.token.as_bytes()).into() {
        next.run(req).await
    } else {
        Failure(ApiError::new(
            warren_core::ErrorCode::Unauthorized,
            "missing or wrong API token: send 'Authorization: Bearer <token>' with the token from <home>/token or WARREN_TOKEN",
        ))
        .into_response()
    }
}

/// A streamed answer of one JSON object per line; it ends when the daemon
/// begins to stop (so a clean stop never waits on an open stream).
fn ndjson<S, T>(st: &AppState, items: S) -> Response
where
    S: futures_util::Stream<Item = T> + Send + 'static,
    T: serde::Serialize,
{
    let stream = items
        .take_until(st.control.lifecycle.stopped())
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

pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

/// Alive: `ok`, or what start-up recovery is doing (API calls wait for it).
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "alive")))]
async fn healthz(State(st): St) -> String {
    format!("{}\n", st.control.lifecycle.status())
}

/// Prometheus metrics (text format).
async fn metrics(State(st): St) -> Response {
    let text = st.control.metrics.render(&st.control).await;
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

#[derive(Deserialize)]
struct CreateQuery {
    /// `false`: answer 202 at once when the create has to queue for capacity.
    wait: Option<bool>,
}

/// Create a sandbox; answers once it is ready for exec (waiting in the
/// node's FIFO queue first when it does not fit yet).
#[utoipa::path(post, path = "/v1/sandboxes", request_body = SandboxSpec, params(("wait" = Option<bool>, Query)),
    responses((status = 201, body = SandboxInfo), (status = 200, body = SandboxInfo, description = "request_id replay"),
              (status = 202, body = SandboxInfo, description = "queued (wait=false)"),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 429, body = ErrorBody, description = "queue full; Retry-After says when to retry")))]
async fn create_sandbox(
    State(st): St,
    Query(q): Query<CreateQuery>,
    body: Bytes,
) -> ApiResult<Response> {
    let spec: SandboxSpec = parse_json(&body)?;
    let (info, created) = st.control.create(spec, q.wait.unwrap_or(true)).await?;
    let status = match (created, info.state) {
        (true, SandboxState::Queued) => StatusCode::ACCEPTED,
        (true, _) => StatusCode::CREATED,
        (false, _) => StatusCode::OK,
    };
    Ok((status, Json(info)).into_response())
}

#[derive(Deserialize, Default)]
struct ListQuery {
    label: Option<String>,
    state: Option<String>,
    all: Option<bool>,
}

fn list_filter(q: &ListQuery) -> Result<(Vec<SandboxState>, Selector), ApiError> {
    let selector = Selector::parse(q.label.as_deref().unwrap_or(""))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let states = match &q.state {
        Some(s) => s
            .split(',')
            .map(|x| x.trim().parse::<SandboxState>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(ApiError::bad_request)?,
        None if q.all.unwrap_or(false) => vec![],
        None => SandboxState::ALL
            .into_iter()
            .filter(|s| !s.is_final())
            .collect(),
    };
    Ok((states, selector))
}

/// List sandboxes (live ones unless `state` or `all` say otherwise).
#[utoipa::path(get, path = "/v1/sandboxes", params(("label" = Option<String>, Query), ("state" = Option<String>, Query), ("all" = Option<bool>, Query)),
    responses((status = 200, body = [SandboxInfo])))]
async fn list_sandboxes(
    State(st): St,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Vec<SandboxInfo>>> {
    let (states, selector) = list_filter(&q)?;
    Ok(Json(st.control.list(&states, &selector).await?))
}

/// Renew the sandbox's lease (any other call on the sandbox renews it too).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/heartbeat", responses((status = 200, body = SandboxInfo), (status = 404, body = ErrorBody)))]
async fn heartbeat(State(st): St, Path(id): Path<String>) -> ApiResult<Json<SandboxInfo>> {
    let row = st.control.get(&id).await?;
    st.control.touch(&id).await;
    Ok(Json(st.control.info(row, false).await))
}

/// Freeze every process of a running sandbox (cgroup freezer).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", responses((status = 200, body = SandboxInfo), (status = 409, body = ErrorBody)))]
async fn pause(State(st): St, Path(id): Path<String>) -> ApiResult<Json<SandboxInfo>> {
    st.control.touch(&id).await;
    let row = st.control.set_paused(&id, true).await?;
    Ok(Json(st.control.info(row, false).await))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", responses((status = 200, body = SandboxInfo), (status = 409, body = ErrorBody)))]
async fn resume(State(st): St, Path(id): Path<String>) -> ApiResult<Json<SandboxInfo>> {
    st.control.touch(&id).await;
    let row = st.control.set_paused(&id, false).await?;
    Ok(Json(st.control.info(row, false).await))
}

#[derive(Deserialize, utoipa::ToSchema)]
struct TtlBody {
    /// The sandbox may live this long from now, e.g. "30m".
    #[schema(value_type = String)]
    ttl: warren_core::spec::Dur,
}

/// Set the sandbox's remaining lifetime (extend or shorten its TTL).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/ttl", request_body = TtlBody, responses((status = 200, body = SandboxInfo), (status = 409, body = ErrorBody)))]
async fn set_ttl(
    State(st): St,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<SandboxInfo>> {
    let req: TtlBody = parse_json(&body)?;
    if req.ttl.0.is_zero() {
        return Err(ApiError::bad_request("ttl must be greater than zero").into());
    }
    let row = st.control.get(&id).await?;
    if !matches!(row.state, SandboxState::Running | SandboxState::Paused) {
        return Err(ApiError::conflict(format!(
            "sandbox {id} is {}; only a running or paused sandbox has a TTL to change",
            row.state
        ))
        .into());
    }
    st.control
        .node
        .set_ttl(&id, req.ttl.0)
        .await
        .map_err(node_error)?;
    st.control.touch(&id).await;
    Ok(Json(st.control.info(row, false).await))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}", responses((status = 200, body = SandboxInfo), (status = 404, body = ErrorBody)))]
async fn get_sandbox(State(st): St, Path(id): Path<String>) -> ApiResult<Json<SandboxInfo>> {
    st.control.touch(&id).await;
    let row = st.control.get(&id).await?;
    let mut info = st.control.info(row, true).await;
    info.events = st
        .control
        .store
        .events(Some(&id), 0, 1000)
        .await
        .map_err(ApiError::from)?;
    Ok(Json(info))
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}", responses((status = 200, body = SandboxInfo), (status = 404, body = ErrorBody)))]
async fn delete_sandbox(State(st): St, Path(id): Path<String>) -> ApiResult<Json<SandboxInfo>> {
    let row = st.control.destroy(&id, reason::USER_DELETED).await?;
    Ok(Json(st.control.info(row, false).await))
}

/// Delete every live sandbox matching a label selector (required).
#[utoipa::path(delete, path = "/v1/sandboxes", params(("label" = String, Query)), responses((status = 200, body = [SandboxInfo])))]
async fn delete_sandboxes(
    State(st): St,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Vec<SandboxInfo>>> {
    if q.label.as_deref().unwrap_or("").trim().is_empty() {
        return Err(ApiError::bad_request(
            "bulk delete needs a label selector, e.g. ?label=task=swe",
        )
        .into());
    }
    let (states, selector) = list_filter(&ListQuery {
        all: Some(false),
        ..q
    })?;
    let victims = st.control.list(&states, &selector).await?;
    let deletes = victims
        .iter()
        .map(|s| st.control.destroy(&s.id, reason::USER_DELETED));
    let mut out = Vec::new();
    for r in futures_util::future::join_all(deletes).await {
        out.push(st.control.info(r?, false).await);
    }
    Ok(Json(out))
}

/// Run a command; the answer is an NDJSON stream of exec events.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", request_body = ExecRequest,
    responses((status = 200, body = ExecEvent, content_type = "application/x-ndjson"), (status = 409, body = ErrorBody)))]
async fn exec(State(st): St, Path(id): Path<String>, body: Bytes) -> ApiResult<Response> {
    let req: ExecRequest = parse_json(&body)?;
    st.control.touch(&id).await;
    let started = std::time::Instant::now();
    let events = st.control.exec(&id, &req).await?;
    st.control
        .metrics
        .exec_start_seconds
        .observe(started.elapsed().as_secs_f64());
    Ok(ndjson(&st, events))
}

#[derive(Deserialize)]
struct FileQuery {
    path: String,
    mode: Option<String>,
}

/// The `path` parameter exactly as sent. Query decoding replaces bytes that
/// are not UTF-8 with U+FFFD, which would write (or read) a different file
/// than the one named; such a path is refused instead.
fn exact_path(uri: &axum::http::Uri) -> Result<(), ApiError> {
    let raw = uri.query().unwrap_or("");
    for pair in raw.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != "path" {
            continue;
        }
        let v = v.replace('+', " ");
        if percent_encoding::percent_decode_str(&v)
            .decode_utf8()
            .is_err()
        {
            return Err(ApiError::bad_request(
                "path is not valid UTF-8 once percent-decoded; Warren's file API takes UTF-8 paths \
                 (for other names, upload or download the directory holding them as a tar)",
            ));
        }
    }
    Ok(())
}

fn file_state_ok(state: SandboxState) -> bool {
    matches!(
        state,
        SandboxState::Running | SandboxState::Paused | SandboxState::Kept | SandboxState::Stopping
    )
}

/// A file call may go ahead: the sandbox exists and has files now.
async fn file_access(st: &AppState, id: &str) -> Result<(), ApiError> {
    let row = st.control.get(id).await?;
    st.control.touch(id).await;
    if !file_state_ok(row.state) {
        return Err(ApiError::conflict(format!(
            "sandbox {id} is {}; files need a running or kept sandbox",
            row.state
        )));
    }
    Ok(())
}

/// Upload a file (raw body) or a directory (body is a tar archive, sent with
/// `Content-Type: application/x-tar`).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", params(("path" = String, Query), ("mode" = Option<String>, Query)),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn put_file(
    State(st): St,
    Path(id): Path<String>,
    Query(q): Query<FileQuery>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<StatusCode> {
    exact_path(&uri)?;
    file_access(&st, &id).await?;
    let tar = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        == Some("application/x-tar");
    let mode = match &q.mode {
        Some(m) => u32::from_str_radix(m, 8)
            .map_err(|_| ApiError::bad_request(format!("mode {m:?} must be octal, e.g. 0644")))?,
        None => 0o644,
    };
    let body = body
        .into_data_stream()
        .map(|r| {
            r.map_err(|e| warren_node_api::NodeError::invalid(format!("upload interrupted: {e}")))
        })
        .boxed();
    let req = WriteFile {
        path: q.path,
        mode,
        tar,
    };
    st.control
        .node
        .write_file(&id, req, body)
        .await
        .map_err(node_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Download a file (raw bytes) or a directory (a tar archive).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", params(("path" = String, Query)),
    responses((status = 200, content_type = "application/octet-stream"), (status = 404, body = ErrorBody)))]
async fn get_file(
    State(st): St,
    Path(id): Path<String>,
    Query(q): Query<FileQuery>,
    uri: axum::http::Uri,
) -> ApiResult<Response> {
    exact_path(&uri)?;
    file_access(&st, &id).await?;
    let read = st
        .control
        .node
        .read_file(&id, &q.path)
        .await
        .map_err(node_error)?;
    let body = Body::from_stream(read.body.map(|r| r.map_err(std::io::Error::other)));
    Ok(match read.kind {
        // Never more than the length announced (a file that shrinks ends
        // the response early, which the client sees as an incomplete body).
        FileKind::File { size } => (
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                (header::CONTENT_LENGTH, size.to_string()),
            ],
            body,
        )
            .into_response(),
        FileKind::Dir => ([(header::CONTENT_TYPE, "application/x-tar")], body).into_response(),
    })
}

#[derive(Deserialize)]
struct LogQuery {
    follow: Option<bool>,
}

/// The sandbox's JSON-lines log; with `follow=true` the stream stays open
/// until the sandbox has ended.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/logs", params(("follow" = Option<bool>, Query)),
    responses((status = 200, content_type = "application/x-ndjson"), (status = 404, body = ErrorBody)))]
async fn logs(
    State(st): St,
    Path(id): Path<String>,
    Query(q): Query<LogQuery>,
) -> ApiResult<Response> {
    st.control.get(&id).await?;
    let stream = st
        .control
        .node
        .logs(&id, q.follow.unwrap_or(false))
        .await
        .map_err(node_error)?
        .map(|r| r.map_err(std::io::Error::other))
        .take_until(st.control.lifecycle.stopped());
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}

#[derive(serde::Serialize, utoipa::ToSchema)]
struct NodeInfo {
    name: String,
    allocatable: crate::admission::Need,
    allocated: crate::admission::Need,
    queued: usize,
}

/// Nodes with their allocatable and allocated capacity and queue length.
#[utoipa::path(get, path = "/v1/nodes", responses((status = 200, body = [NodeInfo])))]
async fn nodes(State(st): St) -> Json<Vec<NodeInfo>> {
    let admission = &st.control.admission;
    Json(vec![NodeInfo {
        name: st.control.node_name.clone(),
        allocatable: admission.total(),
        allocated: admission.used(),
        queued: admission.queued(),
    }])
}

/// Every resource profile with its current request and anomaly flag.
#[utoipa::path(get, path = "/v1/profiles", responses((status = 200, body = [warren_core::profile::Profile])))]
async fn list_profiles(State(st): St) -> ApiResult<Json<Vec<warren_core::profile::Profile>>> {
    Ok(Json(
        st.control.store.profiles().await.map_err(ApiError::from)?,
    ))
}

#[derive(serde::Serialize, utoipa::ToSchema)]
struct ProfileDetail {
    profile: warren_core::profile::Profile,
    /// peak × margin over the window of recent runs.
    recommendation: Option<warren_core::profile::Request>,
    runs: Vec<warren_core::profile::Run>,
}

#[utoipa::path(get, path = "/v1/profiles/{name}", responses((status = 200, body = ProfileDetail), (status = 404, body = ErrorBody)))]
async fn get_profile(State(st): St, Path(name): Path<String>) -> ApiResult<Json<ProfileDetail>> {
    let store = &st.control.store;
    let profile = store
        .profile(&name)
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "no profile named {name:?}; see `warren profile ls`"
            ))
        })?;
    let policy = st.control.policy();
    let runs = store
        .runs(&name, policy.window)
        .await
        .map_err(ApiError::from)?;
    let recommendation = warren_core::profile::recommend(&runs, &policy);
    Ok(Json(ProfileDetail {
        profile,
        recommendation,
        runs,
    }))
}

/// Forget a profile's runs and anomaly; it restarts from its original request.
#[utoipa::path(post, path = "/v1/profiles/{name}/reset", responses((status = 200, body = warren_core::profile::Profile), (status = 404, body = ErrorBody)))]
async fn reset_profile(
    State(st): St,
    Path(name): Path<String>,
) -> ApiResult<Json<warren_core::profile::Profile>> {
    Ok(Json(st.control.reset_profile(&name).await?))
}

/// The profile table as TOML, to edit by hand and load again.
#[utoipa::path(get, path = "/v1/profiles/export", responses((status = 200, content_type = "application/toml")))]
async fn export_profiles(State(st): St) -> ApiResult<Response> {
    let profiles = st.control.store.profiles().await.map_err(ApiError::from)?;
    let text = crate::profiles::table::export(&profiles).map_err(ApiError::internal)?;
    Ok(([(header::CONTENT_TYPE, "application/toml")], text).into_response())
}

/// Load a TOML profile table; listed profiles are replaced.
#[utoipa::path(post, path = "/v1/profiles/import", request_body(content = String, content_type = "application/toml"),
    responses((status = 200, body = [warren_core::profile::Profile]), (status = 400, body = ErrorBody)))]
async fn import_profiles(
    State(st): St,
    body: Bytes,
) -> ApiResult<Json<Vec<warren_core::profile::Profile>>> {
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::bad_request("the profile table must be UTF-8 TOML"))?;
    let profiles = crate::profiles::table::import(text).map_err(ApiError::bad_request)?;
    let now = warren_core::clock::now_rfc3339();
    for p in &profiles {
        st.control
            .store
            .put_profile(p, &now)
            .await
            .map_err(ApiError::from)?;
    }
    Ok(Json(profiles))
}

#[derive(Deserialize)]
struct LabelQuery {
    label: Option<String>,
}

/// The logs of every sandbox (live or finished) matching a label selector,
/// one after another in creation order; every line names its sandbox.
#[utoipa::path(get, path = "/v1/logs", params(("label" = String, Query)),
    responses((status = 200, content_type = "application/x-ndjson"), (status = 400, body = ErrorBody)))]
async fn logs_by_label(State(st): St, Query(q): Query<LabelQuery>) -> ApiResult<Response> {
    let label = q.label.unwrap_or_default();
    if label.trim().is_empty() {
        return Err(ApiError::bad_request("give a label selector, e.g. ?label=task=swe").into());
    }
    let sel = Selector::parse(&label).map_err(|e| ApiError::bad_request(e.to_string()))?;
    // Streamed line by line, never a whole log in memory.
    let node = st.control.node.clone();
    let stream = futures_util::stream::iter(st.control.list(&[], &sel).await?)
        .then(move |s| {
            let node = node.clone();
            async move {
                // A sandbox whose log has expired has no lines to give.
                node.logs(&s.id, false)
                    .await
                    .unwrap_or_else(|_| futures_util::stream::empty().boxed())
            }
        })
        .flatten()
        .map(|r| r.map_err(std::io::Error::other))
        .take_until(st.control.lifecycle.stopped());
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}

#[derive(Deserialize, Clone)]
struct EventQuery {
    sandbox: Option<String>,
    /// Label selector over the sandboxes whose events to show.
    label: Option<String>,
    batch: Option<String>,
    /// Event reason (e.g. `ttl_expired`) or state (e.g. `destroyed`).
    #[serde(rename = "type")]
    kind: Option<String>,
    after: Option<i64>,
    limit: Option<i64>,
    /// Keep the NDJSON stream open and send new events as they happen.
    follow: Option<bool>,
}

impl EventQuery {
    fn selector(&self) -> Result<Selector, ApiError> {
        let mut sel = Selector::parse(self.label.as_deref().unwrap_or(""))
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        if let Some(b) = &self.batch {
            sel.0.push(warren_core::labels::Requirement::Equals(
                warren_core::batch::BATCH_LABEL.into(),
                b.clone(),
            ));
        }
        Ok(sel)
    }
}

/// Events after `after` that pass the filters, and the last sequence seen.
async fn filtered_events(
    control: &Control,
    q: &EventQuery,
    sel: &Selector,
    after: i64,
) -> Result<(Vec<warren_core::Event>, i64), ApiError> {
    let limit = q.limit.unwrap_or(1000).clamp(1, 10_000);
    let evs = control
        .store
        .events(q.sandbox.as_deref(), after, limit)
        .await?;
    let last = evs.last().map_or(after, |e| e.seq);
    let members: Option<std::collections::HashSet<String>> = if sel.is_empty() {
        None
    } else {
        Some(
            control
                .list(&[], sel)
                .await?
                .into_iter()
                .map(|s| s.id)
                .collect(),
        )
    };
    let kept = evs
        .into_iter()
        .filter(|e| members.as_ref().is_none_or(|m| m.contains(&e.sandbox_id)))
        .filter(|e| {
            q.kind.as_deref().is_none_or(|k| {
                e.reason == k || e.kind == k || e.state.is_some_and(|s| s.as_str() == k)
            })
        })
        .collect();
    Ok((kept, last))
}

/// The event stream: state changes with reasons, filterable by sandbox,
/// label selector, batch and type; `follow=true` streams NDJSON.
#[utoipa::path(get, path = "/v1/events", params(("sandbox" = Option<String>, Query), ("label" = Option<String>, Query),
    ("batch" = Option<String>, Query), ("type" = Option<String>, Query), ("after" = Option<i64>, Query),
    ("limit" = Option<i64>, Query), ("follow" = Option<bool>, Query)),
    responses((status = 200, body = [warren_core::Event])))]
async fn events(State(st): St, Query(q): Query<EventQuery>) -> ApiResult<Response> {
    let sel = q.selector()?;
    let after = q.after.unwrap_or(0);
    if !q.follow.unwrap_or(false) {
        let (evs, _) = filtered_events(&st.control, &q, &sel, after).await?;
        return Ok(Json(evs).into_response());
    }
    let control = st.control.clone();
    let written = st.control.store.subscribe_events();
    let stream = futures_util::stream::unfold(
        (after, Vec::<warren_core::Event>::new(), written),
        move |(mut seq, mut pending, mut written)| {
            let (control, q, sel) = (control.clone(), q.clone(), sel.clone());
            async move {
                loop {
                    if let Some(ev) = pending.pop() {
                        let mut line = serde_json::to_vec(&ev).unwrap_or_default();
                        line.push(b'\n');
                        let next = (seq, pending, written);
                        return Some((Ok::<_, std::io::Error>(Bytes::from(line)), next));
                    }
                    // Marked seen before reading, so a write in between
                    // wakes the wait below.
                    written.borrow_and_update();
                    match filtered_events(&control, &q, &sel, seq).await {
                        Ok((evs, last)) => {
                            seq = last;
                            pending = evs.into_iter().rev().collect();
                            if pending.is_empty() {
                                let _ =
                                    tokio::time::timeout(Duration::from_secs(5), written.changed())
                                        .await;
                            }
                        }
                        Err(_) => return None,
                    }
                }
            }
        },
    )
    .take_until(st.control.lifecycle.stopped());
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Create a batch of sandboxes from one spec; answers at once (202) while
/// the sandboxes are submitted; poll `GET /v1/batches/{id}` for progress.
#[utoipa::path(post, path = "/v1/batches", request_body = BatchRequest,
    responses((status = 202, body = BatchInfo), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn create_batch(State(st): St, body: Bytes) -> ApiResult<Response> {
    let req: BatchRequest = parse_json(&body)?;
    let info = st.control.create_batch(req).await?;
    Ok((StatusCode::ACCEPTED, Json(info)).into_response())
}

#[utoipa::path(get, path = "/v1/batches", responses((status = 200, body = [BatchInfo])))]
async fn list_batches(State(st): St) -> ApiResult<Json<Vec<BatchInfo>>> {
    Ok(Json(st.control.list_batches().await?))
}

/// Counts per state, summed usage and failures of a batch.
#[utoipa::path(get, path = "/v1/batches/{id}", responses((status = 200, body = BatchInfo), (status = 404, body = ErrorBody)))]
async fn get_batch(State(st): St, Path(id): Path<String>) -> ApiResult<Json<BatchInfo>> {
    Ok(Json(st.control.batch_info(&id).await?))
}

/// Destroy every sandbox of the batch.
#[utoipa::path(delete, path = "/v1/batches/{id}", responses((status = 200, body = BatchInfo), (status = 404, body = ErrorBody)))]
async fn delete_batch(State(st): St, Path(id): Path<String>) -> ApiResult<Json<BatchInfo>> {
    Ok(Json(st.control.delete_batch(&id).await?))
}

#[utoipa::path(get, path = "/v1/images", responses((status = 200, description = "image records")))]
async fn list_images(State(st): St) -> ApiResult<Json<Vec<serde_json::Value>>> {
    let list = st.control.node.image_list().await.map_err(node_error)?;
    Ok(Json(list.into_iter().map(|i| i.record).collect()))
}

/// Import an OCI image-layout or docker-archive tar sent as the body.
#[utoipa::path(post, path = "/v1/images/import", params(("name" = String, Query)),
    responses((status = 201, description = "imported"), (status = 400, body = ErrorBody)))]
async fn import_image(
    State(st): St,
    Query(q): Query<HashMap<String, String>>,
    body: Body,
) -> ApiResult<Response> {
    let name = q
        .get("name")
        .cloned()
        .ok_or_else(|| ApiError::bad_request("name is required: ?name=NAME:TAG"))?;
    let archive = body
        .into_data_stream()
        .map(|r| {
            r.map_err(|e| warren_node_api::NodeError::invalid(format!("upload interrupted: {e}")))
        })
        .boxed();
    let image = st
        .control
        .node
        .image_import(&name, archive)
        .await
        .map_err(node_error)?;
    Ok((StatusCode::CREATED, Json(image.record)).into_response())
}

/// Body of `POST /v1/images/pull`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// `host[:port]/repository[:tag|@sha256:digest]`.
    pub reference: String,
}

#[derive(Deserialize)]
struct PullQuery {
    #[serde(default)]
    progress: bool,
}

/// Pull an image from an OCI registry. The tag is resolved to a digest at
/// the registry; only what the store lacks is downloaded, every blob and
/// layer verified. With `progress=true` the answer is an NDJSON stream of
/// pull events (`resolved`, `manifest`, `progress`, `layer`, `done`) that
/// ends with `{"type":"image","image":{..}}` or `{"type":"error","error":{..}}`.
#[utoipa::path(post, path = "/v1/images/pull", request_body = PullRequest,
    params(("progress" = Option<bool>, Query)),
    responses((status = 200, description = "the image record (or the NDJSON stream)"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 502, body = ErrorBody)))]
async fn pull_image(
    State(st): St,
    Query(q): Query<PullQuery>,
    Json(req): Json<PullRequest>,
) -> ApiResult<Response> {
    if registry_host(&req.reference).is_none() {
        return Err(ApiError::bad_request(format!(
            "{:?} names no registry; pull takes host[:port]/repository[:tag|@sha256:digest], e.g. \
             registry.example.com/team/app:v1 (local archives are imported with `warren image import`)",
            req.reference
        ))
        .into());
    }
    let updates = st
        .control
        .node
        .image_pull(&req.reference)
        .await
        .map_err(node_error)?;
    if !q.progress {
        let last = updates
            .filter(|u| futures_util::future::ready(!matches!(u, PullUpdate::Progress { .. })))
            .next()
            .await;
        return match last {
            Some(PullUpdate::Image { image }) => Ok(Json(image.record).into_response()),
            Some(PullUpdate::Error { error }) => Err(node_error(error).into()),
            _ => Err(ApiError::internal("the pull ended without an answer").into()),
        };
    }
    let lines = updates.map(|u| match u {
        PullUpdate::Progress { event } => event,
        PullUpdate::Image { image } => serde_json::json!({"type": "image", "image": image.record}),
        PullUpdate::Error { error } => {
            serde_json::json!({"type": "error", "error": node_error(error).body().error})
        }
    });
    Ok(ndjson(&st, lines))
}

/// Body of `POST /v1/images/gc`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GcRequest {
    /// Most bytes the image store may hold, e.g. "20G"; without it only
    /// unreferenced content is collected.
    #[serde(default)]
    pub budget: Option<String>,
}

/// Collect unreferenced image content; with a budget, also remove registry
/// images (oldest first) until the store fits it. Images live sandboxes
/// run and imported images are never removed. Answers
/// `{"removed": [names], "used_before": bytes, "used_after": bytes}`.
#[utoipa::path(post, path = "/v1/images/gc", request_body = GcRequest,
    responses((status = 200, description = "what was removed"), (status = 400, body = ErrorBody)))]
async fn gc_images(
    State(st): St,
    Json(req): Json<GcRequest>,
) -> ApiResult<Json<warren_node_api::GcReport>> {
    let budget = req
        .budget
        .as_deref()
        .map(warren_core::quantity::parse_size)
        .transpose()
        .map_err(|e| {
            ApiError::bad_request(format!("budget: {e}; use a size such as 500M or 20G"))
        })?;
    let report = st.control.node.image_gc(budget).await.map_err(node_error)?;
    Ok(Json(report))
}

/// Body of `POST /v1/images/push`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PushRequest {
    /// Where to push: `host[:port]/repository:tag`.
    pub reference: String,
    /// The stored image to push (name or digest); `reference` when absent.
    #[serde(default)]
    pub source: Option<String>,
}

/// Push a stored image to a registry: the blobs it lacks, then the
/// manifest as stored (the digest does not change). Blobs the image's
/// source repository on the same registry holds are mounted, not uploaded.
/// Answers `{"image": record, "uploaded": N, "mounted": M}`.
#[utoipa::path(post, path = "/v1/images/push", request_body = PushRequest,
    responses((status = 200, description = "pushed"), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 502, body = ErrorBody)))]
async fn push_image(
    State(st): St,
    Json(req): Json<PushRequest>,
) -> ApiResult<Json<serde_json::Value>> {
    if registry_host(&req.reference).is_none() {
        return Err(ApiError::bad_request(format!(
            "{:?} names no registry; push takes host[:port]/repository:tag (use --from to push \
             a local image under that name)",
            req.reference
        ))
        .into());
    }
    let pushed = st
        .control
        .node
        .image_push(&req.reference, req.source.as_deref())
        .await
        .map_err(node_error)?;
    Ok(Json(
        serde_json::json!({"image": pushed.image.record, "uploaded": pushed.uploaded, "mounted": pushed.mounted}),
    ))
}

/// Body of `POST /v1/sandboxes/{id}/commit`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitRequest {
    /// `repo[:tag]` (a registry reference if it is to be pushed).
    pub name: String,
}

/// Turn the sandbox's filesystem changes into a new layer on top of its
/// image, stored as image `name` (201 with the image record). A running
/// sandbox is frozen while the layer is written.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commit", request_body = CommitRequest,
    responses((status = 201, description = "the new image record"), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn commit_sandbox(
    State(st): St,
    Path(id): Path<String>,
    Json(req): Json<CommitRequest>,
) -> ApiResult<Response> {
    let row = st.control.get(&id).await?;
    match row.state {
        SandboxState::Running | SandboxState::Paused | SandboxState::Kept => {}
        other => {
            return Err(ApiError::conflict(format!(
                "sandbox {id} is {other:?}; only a running, paused or kept sandbox can be committed"
            ))
            .into())
        }
    };
    st.control.touch(&id).await;
    let image = st
        .control
        .node
        .commit(&id, &req.name)
        .await
        .map_err(node_error)?;
    Ok((StatusCode::CREATED, Json(image.record)).into_response())
}

/// Body of `POST /v1/images/prewarm`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PrewarmRequest {
    /// `host[:port]/repository[:tag|@sha256:digest]`.
    pub reference: String,
    /// Node names (see `GET /v1/nodes`); all nodes when absent or empty.
    #[serde(default)]
    pub nodes: Vec<String>,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct PrewarmNode {
    pub node: String,
    pub digest: String,
    pub layers: usize,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct PrewarmResult {
    pub reference: String,
    pub nodes: Vec<PrewarmNode>,
}

/// Pull an image onto nodes ahead of the sandboxes that will use it, so
/// their creates find every layer unpacked. Answers once every named node
/// holds the digest the reference names now.
#[utoipa::path(post, path = "/v1/images/prewarm", request_body = PrewarmRequest,
    responses((status = 200, body = PrewarmResult), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 502, body = ErrorBody)))]
async fn prewarm_image(
    State(st): St,
    Json(req): Json<PrewarmRequest>,
) -> ApiResult<Json<PrewarmResult>> {
    let name = st.control.node_name.clone();
    if let Some(unknown) = req.nodes.iter().find(|n| **n != name) {
        return Err(ApiError::bad_request(format!(
            "unknown node {unknown:?}; this cluster has {name:?} (see `GET /v1/nodes`), nothing was pulled"
        ))
        .into());
    }
    if registry_host(&req.reference).is_none() {
        return Err(ApiError::bad_request(format!(
            "{:?} names no registry; prewarm takes host[:port]/repository[:tag|@sha256:digest]",
            req.reference
        ))
        .into());
    }
    let image = st
        .control
        .node
        .image_for_create(&req.reference)
        .await
        .map_err(node_error)?;
    Ok(Json(PrewarmResult {
        reference: req.reference,
        nodes: vec![PrewarmNode {
            node: name,
            digest: image.digest,
            layers: image.layers,
        }],
    }))
}

#[utoipa::path(delete, path = "/v1/images/{reference}", responses((status = 200, description = "removed"), (status = 409, body = ErrorBody)))]
async fn delete_image(
    State(st): St,
    Path(reference): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let removed = st
        .control
        .node
        .image_remove(&reference)
        .await
        .map_err(node_error)?;
    Ok(Json(removed.record))
}
