//! `/v1/batches`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use warren_core::{BatchInfo, BatchRequest, ErrorBody};

use axum::Extension;

use super::{ApiResult, St, Who};
use crate::api::json_body::JsonBody;

/// Create a batch of sandboxes from one spec; answers at once (202) while
/// the sandboxes are submitted; poll `GET /v1/batches/{id}` for progress.
#[utoipa::path(post, path = "/v1/batches", request_body = BatchRequest,
    responses((status = 202, body = BatchInfo), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn create_batch(
    State(st): St,
    Extension(who): Who,
    JsonBody(req): JsonBody<BatchRequest>,
) -> ApiResult<Response> {
    let info = st.control.create_batch(&who, req).await?;
    Ok((StatusCode::ACCEPTED, Json(info)).into_response())
}

#[utoipa::path(get, path = "/v1/batches", responses((status = 200, body = [BatchInfo])))]
pub(crate) async fn list_batches(
    State(st): St,
    Extension(who): Who,
) -> ApiResult<Json<Vec<BatchInfo>>> {
    Ok(Json(st.control.batches().list(&who).await?))
}

/// Counts per state, summed usage and failures of a batch.
#[utoipa::path(get, path = "/v1/batches/{id}", responses((status = 200, body = BatchInfo), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_batch(State(st): St, Path(id): Path<String>) -> ApiResult<Json<BatchInfo>> {
    Ok(Json(st.control.batches().info(&id).await?))
}

/// Destroy every sandbox of the batch.
#[utoipa::path(delete, path = "/v1/batches/{id}", responses((status = 200, body = BatchInfo), (status = 404, body = ErrorBody)))]
pub(crate) async fn delete_batch(
    State(st): St,
    Path(id): Path<String>,
) -> ApiResult<Json<BatchInfo>> {
    Ok(Json(st.control.delete_batch(&id).await?))
}
