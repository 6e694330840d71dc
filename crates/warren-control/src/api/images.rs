//! `/v1/images` and commits: the node's image store, through the node contract.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::StreamExt;
use serde::Deserialize;
use warren_core::{ApiError, ErrorBody};
use warren_node_api::PullUpdate;

use super::{ndjson, ApiResult, St, Who};
use crate::api::json_body::JsonBody;
use crate::node_errors::node_error;

#[utoipa::path(get, path = "/v1/images", responses((status = 200, description = "image records")))]
pub(crate) async fn list_images(
    State(st): St,
    Extension(who): Who,
) -> ApiResult<Json<Vec<serde_json::Value>>> {
    let list = st.control.images().list(&who).await?;
    Ok(Json(list.into_iter().map(|i| i.record).collect()))
}

/// Import an OCI image-layout or docker-archive tar sent as the body.
#[utoipa::path(post, path = "/v1/images/import", params(("name" = String, Query)),
    responses((status = 201, description = "imported"), (status = 400, body = ErrorBody)))]
pub(crate) async fn import_image(
    State(st): St,
    Extension(who): Who,
    Query(q): Query<HashMap<String, String>>,
    body: Body,
) -> ApiResult<Response> {
    let name = q
        .get("name")
        .cloned()
        .ok_or_else(|| ApiError::bad_request("name is required: ?name=NAME:TAG"))?;
    let archive = crate::streams::upload(body);
    st.control.images().claim(&who, &name).await?;
    let image = st.control.images().import(&name, archive).await?;
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
pub(crate) struct PullQuery {
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
pub(crate) async fn pull_image(
    State(st): St,
    Extension(who): Who,
    Query(q): Query<PullQuery>,
    JsonBody(req): JsonBody<PullRequest>,
) -> ApiResult<Response> {
    st.control.images().may_pull(&who, &req.reference).await?;
    let updates = st.control.images().pull(&req.reference).await?;
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
pub(crate) async fn gc_images(
    State(st): St,
    JsonBody(req): JsonBody<GcRequest>,
) -> ApiResult<Json<warren_node_api::GcReport>> {
    let budget = req
        .budget
        .as_deref()
        .map(warren_core::quantity::parse_size)
        .transpose()
        .map_err(|e| {
            ApiError::bad_request(format!("budget: {e}; use a size such as 500M or 20G"))
        })?;
    let report = st.control.images().gc(budget).await?;
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
pub(crate) async fn push_image(
    State(st): St,
    JsonBody(req): JsonBody<PushRequest>,
) -> ApiResult<Json<serde_json::Value>> {
    let pushed = st
        .control
        .images()
        .push(&req.reference, req.source.as_deref())
        .await?;
    Ok(Json(
        serde_json::json!({"image": pushed.image.record, "uploaded": pushed.uploaded, "mounted": pushed.mounted}),
    ))
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
    /// Only nodes carrying every one of these labels.
    #[serde(default)]
    pub node_selector: warren_core::Labels,
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
pub(crate) async fn prewarm_image(
    State(st): St,
    JsonBody(req): JsonBody<PrewarmRequest>,
) -> ApiResult<Json<PrewarmResult>> {
    let held = st
        .control
        .images()
        .prewarm(&req.reference, &req.nodes, &req.node_selector)
        .await?;
    Ok(Json(PrewarmResult {
        reference: req.reference,
        nodes: held
            .into_iter()
            .map(|(node, image)| PrewarmNode {
                node,
                digest: image.digest,
                layers: image.layers,
            })
            .collect(),
    }))
}

#[utoipa::path(delete, path = "/v1/images/{reference}", responses((status = 200, description = "removed"), (status = 409, body = ErrorBody)))]
pub(crate) async fn delete_image(
    State(st): St,
    Extension(who): Who,
    Path(reference): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let removed = st.control.images().remove(&who, &reference).await?;
    Ok(Json(removed.record))
}
