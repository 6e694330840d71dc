//! `/v1/sandboxes`: create, list, inspect, delete, lifetimes, pause, exec, commit, fork.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde::Deserialize;
use warren_core::state::reason;
use warren_core::{
    ApiError, ErrorBody, ExecEvent, ExecRequest, RunEvent, RunRequest, SandboxInfo, SandboxSpec,
    SandboxState, Selector, WindowSize,
};

use axum::Extension;

use super::{ndjson, ApiResult, St, Who};
use crate::api::json_body::JsonBody;

#[derive(Deserialize)]
pub(crate) struct CreateQuery {
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
pub(crate) async fn create_sandbox(
    State(st): St,
    Extension(who): Who,
    Query(q): Query<CreateQuery>,
    JsonBody(spec): JsonBody<SandboxSpec>,
) -> ApiResult<Response> {
    let (info, created) = st
        .control
        .create(&who, spec, q.wait.unwrap_or(true))
        .await?;
    let status = match (created, info.state) {
        (true, SandboxState::Queued) => StatusCode::ACCEPTED,
        (true, _) => StatusCode::CREATED,
        (false, _) => StatusCode::OK,
    };
    Ok((status, Json(info)).into_response())
}

/// One command in a sandbox made for it, removed after it: the answer is
/// an NDJSON stream of the sandbox's state (`{"sandbox":{…}}`, with its
/// queue position while it waits) and then the command's exec events; it
/// ends with the exit event while the sandbox is removed.
#[utoipa::path(post, path = "/v1/run", request_body = RunRequest,
    responses((status = 200, body = RunEvent, content_type = "application/x-ndjson"),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 429, body = ErrorBody, description = "queue full; Retry-After says when to retry")))]
pub(crate) async fn run(
    State(st): St,
    Extension(who): Who,
    JsonBody(req): JsonBody<RunRequest>,
) -> ApiResult<Response> {
    let events = st.control.run(&who, req).await?;
    Ok(ndjson(&st, events))
}

#[derive(Deserialize, Default)]
pub(crate) struct ListQuery {
    label: Option<String>,
    state: Option<String>,
    all: Option<bool>,
}

pub(crate) fn list_filter(q: &ListQuery) -> Result<(Vec<SandboxState>, Selector), ApiError> {
    let selector = Selector::parse(q.label.as_deref().unwrap_or(""))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let states = match &q.state {
        Some(s) => s
            .split(',')
            .map(|x| x.trim().parse::<SandboxState>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ApiError::bad_request(e.to_string()))?,
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
pub(crate) async fn list_sandboxes(
    State(st): St,
    Extension(who): Who,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Vec<SandboxInfo>>> {
    let (states, selector) = list_filter(&q)?;
    Ok(Json(
        st.control.records().list(&who, &states, &selector).await?,
    ))
}

/// Renew the sandbox's lease (any other call on the sandbox renews it too).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/heartbeat", responses((status = 200, body = SandboxInfo), (status = 404, body = ErrorBody)))]
pub(crate) async fn heartbeat(
    State(st): St,
    Path(id): Path<String>,
) -> ApiResult<Json<SandboxInfo>> {
    st.control.records().get(&id).await?;
    st.control.io().touch(&id).await;
    Ok(Json(st.control.records().inspect(&id, false).await?))
}

/// Freeze every process of a running sandbox (cgroup freezer).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", responses((status = 200, body = SandboxInfo), (status = 409, body = ErrorBody)))]
pub(crate) async fn pause(State(st): St, Path(id): Path<String>) -> ApiResult<Json<SandboxInfo>> {
    st.control.io().touch(&id).await;
    Ok(Json(st.control.set_paused(&id, true).await?))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", responses((status = 200, body = SandboxInfo), (status = 409, body = ErrorBody)))]
pub(crate) async fn resume(State(st): St, Path(id): Path<String>) -> ApiResult<Json<SandboxInfo>> {
    st.control.io().touch(&id).await;
    Ok(Json(st.control.set_paused(&id, false).await?))
}

#[derive(Deserialize, utoipa::ToSchema)]
pub(crate) struct TtlBody {
    /// The sandbox may live this long from now, e.g. "30m".
    #[schema(value_type = String)]
    ttl: warren_core::spec::Dur,
}

/// Set the sandbox's remaining lifetime (extend or shorten its TTL).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/ttl", request_body = TtlBody, responses((status = 200, body = SandboxInfo), (status = 409, body = ErrorBody)))]
pub(crate) async fn set_ttl(
    State(st): St,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<TtlBody>,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(st.control.set_ttl(&id, req.ttl).await?))
}

#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReclaimBody {
    /// What happens when the sandbox ends: destroy, delay, keep,
    /// keep_on_failure.
    reclaim: warren_core::spec::ReclaimPolicy,
    /// How long a kept sandbox is held (or a delayed one frozen), e.g. "2h";
    /// unchanged when left out.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    keep_for: Option<warren_core::spec::Dur>,
}

/// Change what happens when a running sandbox ends, e.g. keep its scene
/// for debugging (`{"reclaim": "keep", "keep_for": "2h"}`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/reclaim", request_body = ReclaimBody, responses((status = 200, body = SandboxInfo), (status = 409, body = ErrorBody)))]
pub(crate) async fn set_reclaim(
    State(st): St,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<ReclaimBody>,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(
        st.control
            .set_reclaim(&id, req.reclaim, req.keep_for)
            .await?,
    ))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}", responses((status = 200, body = SandboxInfo), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_sandbox(
    State(st): St,
    Path(id): Path<String>,
) -> ApiResult<Json<SandboxInfo>> {
    st.control.io().touch(&id).await;
    let mut info = st.control.records().inspect(&id, true).await?;
    info.events = st.control.records().events(Some(&id), 0, 1000).await?;
    Ok(Json(info))
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}", responses((status = 200, body = SandboxInfo), (status = 404, body = ErrorBody)))]
pub(crate) async fn delete_sandbox(
    State(st): St,
    Path(id): Path<String>,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(st.control.destroy(&id, reason::USER_DELETED).await?))
}

/// Destroys a bulk delete runs at once.
const BULK_DESTROYS: usize = 32;

/// Delete every live sandbox matching a label selector (required).
#[utoipa::path(delete, path = "/v1/sandboxes", params(("label" = String, Query)), responses((status = 200, body = [SandboxInfo])))]
pub(crate) async fn delete_sandboxes(
    State(st): St,
    Extension(who): Who,
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
    let victims = st.control.records().list(&who, &states, &selector).await?;
    let total = victims.len();
    // A few at a time: thousands of destroys at once only queue on the
    // node's cores and time out. Every one is tried; one failure does not
    // leave the rest running.
    let results: Vec<Result<_, ApiError>> = futures_util::stream::iter(victims)
        .map(|s| {
            let control = st.control.clone();
            async move { control.destroy(&s.id, reason::USER_DELETED).await }
        })
        .buffer_unordered(BULK_DESTROYS)
        .collect()
        .await;
    let mut out = Vec::with_capacity(total);
    let mut failed = Vec::new();
    for r in results {
        match r {
            Ok(info) => out.push(info),
            Err(e) => failed.push(e),
        }
    }
    if let Some(first) = failed.first() {
        return Err(ApiError {
            code: first.code,
            message: format!(
                "destroyed {} of {total} sandboxes; {} failed (first: {}); they stay `stopping` and are retried every 10 s",
                out.len(),
                failed.len(),
                first.message
            ),
            retry_after_ms: Some(10_000),
        }
        .into());
    }
    Ok(Json(out))
}

/// Run a command; the answer is an NDJSON stream of exec events.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", request_body = ExecRequest,
    responses((status = 200, body = ExecEvent, content_type = "application/x-ndjson"), (status = 409, body = ErrorBody)))]
pub(crate) async fn exec(
    State(st): St,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<ExecRequest>,
) -> ApiResult<Response> {
    let started = std::time::Instant::now();
    let events = st.control.io().exec(&id, &req).await?;
    st.control
        .metrics
        .exec_start_seconds
        .observe(started.elapsed().as_secs_f64());
    Ok(ndjson(&st, events))
}

#[derive(Deserialize)]
pub(crate) struct StdinQuery {
    #[serde(default)]
    close: bool,
}

/// More stdin for a running exec started with `stdin_open` (the body, raw;
/// `close=true` ends its stdin after it). `exec_id` is in the exec's
/// `start` event.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/execs/{exec_id}/stdin", params(("close" = Option<bool>, Query)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204, description = "written"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn exec_stdin(
    State(st): St,
    Path((id, exec_id)): Path<(String, String)>,
    Query(q): Query<StdinQuery>,
    body: axum::body::Bytes,
) -> ApiResult<StatusCode> {
    st.control
        .io()
        .exec_input(&id, &exec_id, body, q.close)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Set the window size of a running exec's terminal (one started with
/// `tty`); its foreground process gets SIGWINCH.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/execs/{exec_id}/resize", request_body = WindowSize,
    responses((status = 204, description = "resized"), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn exec_resize(
    State(st): St,
    Path((id, exec_id)): Path<(String, String)>,
    JsonBody(size): JsonBody<WindowSize>,
) -> ApiResult<StatusCode> {
    st.control.io().exec_resize(&id, &exec_id, size).await?;
    Ok(StatusCode::NO_CONTENT)
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
pub(crate) async fn commit_sandbox(
    State(st): St,
    Extension(who): Who,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<CommitRequest>,
) -> ApiResult<Response> {
    let commit = warren_node_api::CommitImage {
        into: warren_node_api::ImageTarget::Name(req.name),
        created_by: None,
    };
    let image = st.control.commit(&who, &id, commit).await?;
    Ok((StatusCode::CREATED, Json(image.record)).into_response())
}

/// Make `count` new sandboxes that start from this one's filesystem as it
/// is now: its changes are copied once (a running sandbox is frozen
/// meanwhile), and each child gets its own writable layer on top. Processes
/// are not carried over; each child runs the source's main process anew,
/// if it has one. Labels, sizes and lifetimes are the source's unless the
/// body says otherwise. All or none: 201 with the children once every one
/// is running.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/fork", request_body = warren_core::spec::ForkRequest,
    responses((status = 201, body = [SandboxInfo]), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 429, body = ErrorBody, description = "queue full; Retry-After says when to retry"),
        (status = 503, body = ErrorBody)))]
pub(crate) async fn fork_sandbox(
    State(st): St,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<warren_core::spec::ForkRequest>,
) -> ApiResult<Response> {
    let children = st.control.fork(&id, req).await?;
    Ok((StatusCode::CREATED, Json(children)).into_response())
}
