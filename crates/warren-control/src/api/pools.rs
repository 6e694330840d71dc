//! `/v1/pools`: warm pools of ready sandboxes that matching creates take.

use axum::extract::{Path, State};
use axum::Json;
use warren_core::pool::{PoolInfo, PoolSpec};
use warren_core::ErrorBody;

use axum::Extension;

use super::{ApiResult, St, Who};
use crate::api::json_body::JsonBody;

/// Every pool with its spec, ready members and creates served.
#[utoipa::path(get, path = "/v1/pools", responses((status = 200, body = [PoolInfo])))]
pub(crate) async fn list_pools(State(st): St, Extension(who): Who) -> Json<Vec<PoolInfo>> {
    Json(st.control.pools().infos_for(&who))
}

#[utoipa::path(get, path = "/v1/pools/{name}", responses((status = 200, body = PoolInfo), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_pool(State(st): St, Path(name): Path<String>) -> ApiResult<Json<PoolInfo>> {
    Ok(Json(st.control.pools().info(&name)?))
}

/// Creates or changes a pool: the node keeps `size` ready sandboxes of this
/// image and size; a create asking for the same image and resources (no
/// main command, own disk or node selector) takes one.
#[utoipa::path(put, path = "/v1/pools/{name}", request_body = PoolSpec,
    responses((status = 200, body = PoolInfo), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn put_pool(
    State(st): St,
    Extension(who): Who,
    Path(name): Path<String>,
    JsonBody(spec): JsonBody<PoolSpec>,
) -> ApiResult<Json<PoolInfo>> {
    Ok(Json(st.control.set_pool(&who, &name, spec).await?))
}

/// Removes a pool and destroys its ready sandboxes (claimed ones stay).
#[utoipa::path(delete, path = "/v1/pools/{name}", responses((status = 200, body = PoolInfo), (status = 404, body = ErrorBody)))]
pub(crate) async fn delete_pool(
    State(st): St,
    Path(name): Path<String>,
) -> ApiResult<Json<PoolInfo>> {
    Ok(Json(st.control.delete_pool(&name).await?))
}
