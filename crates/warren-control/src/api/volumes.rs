//! `/v1/volumes`: named, persistent storage on a node, mounted into
//! sandboxes (`volumes` in a create's spec).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use warren_core::volume::{VolumeInfo, VolumeName, VolumeRequest};
use warren_core::{ApiError, ErrorBody};

use super::{ApiResult, St, Who};
use crate::api::json_body::JsonBody;
use axum::Extension;

/// Every volume of the caller's tenant (the operator's token: every one),
/// with its node, size, bytes used and the sandboxes mounting it.
#[utoipa::path(get, path = "/v1/volumes", responses((status = 200, body = [VolumeInfo])))]
pub(crate) async fn list_volumes(
    State(st): St,
    Extension(who): Who,
) -> ApiResult<Json<Vec<VolumeInfo>>> {
    Ok(Json(st.control.volumes().list(&who).await?))
}

/// Makes a volume of the caller's tenant: a file system of `size` of its
/// own on a node carrying `node_selector`'s labels (any node without). 409
/// if the name is taken.
#[utoipa::path(post, path = "/v1/volumes", request_body = VolumeRequest,
    responses((status = 201, body = VolumeInfo), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn create_volume(
    State(st): St,
    Extension(who): Who,
    JsonBody(req): JsonBody<VolumeRequest>,
) -> ApiResult<Response> {
    let made = st.control.volumes().create(&who, req).await?;
    Ok((StatusCode::CREATED, Json(made)).into_response())
}

/// Removes a volume and everything in it; 409 while a sandbox mounts it.
#[utoipa::path(delete, path = "/v1/volumes/{name}",
    responses((status = 200, body = VolumeInfo), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn delete_volume(
    State(st): St,
    Extension(who): Who,
    Path(name): Path<String>,
) -> ApiResult<Json<VolumeInfo>> {
    let name = VolumeName::try_from(name).map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(Json(st.control.volumes().remove(&who, &name).await?))
}
