//! `/v1/secrets`: named values kept sealed by the server and given to the
//! sandboxes that name them (`secrets` in a create's spec). No answer ever
//! carries a value.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use utoipa::ToSchema;
use warren_core::secret::{SecretInfo, SecretMetadata, SecretRequest, SecretValue};
use warren_core::ErrorBody;

use axum::Extension;

use super::{ApiResult, St, Who};
use crate::api::json_body::JsonBody;

/// Every secret, by name (never a value).
#[utoipa::path(get, path = "/v1/secrets", responses((status = 200, body = [SecretInfo])))]
pub(crate) async fn list_secrets(
    State(st): St,
    Extension(who): Who,
) -> ApiResult<Json<Vec<SecretInfo>>> {
    Ok(Json(st.control.secrets().list(&who).await?))
}

/// Keeps a secret (version 1). 409 if the name is taken.
#[utoipa::path(post, path = "/v1/secrets", request_body = SecretRequest,
    responses((status = 201, body = SecretInfo), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn create_secret(
    State(st): St,
    Extension(who): Who,
    JsonBody(req): JsonBody<SecretRequest>,
) -> ApiResult<Response> {
    let made = st.control.secrets().create(&who, req).await?;
    Ok((StatusCode::CREATED, Json(made)).into_response())
}

/// One secret by name or id (never its value).
#[utoipa::path(get, path = "/v1/secrets/{name}",
    responses((status = 200, body = SecretInfo), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_secret(
    State(st): St,
    Path(name): Path<String>,
) -> ApiResult<Json<SecretInfo>> {
    Ok(Json(st.control.secrets().get(&name).await?))
}

/// `PUT /v1/secrets/{name}`: a new value (and metadata, when given).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SecretUpdate {
    value: SecretValue,
    #[serde(default)]
    metadata: Option<SecretMetadata>,
}

/// Replaces a secret's value: its version grows by one; sandboxes made
/// from now on get the new value, running ones keep theirs.
#[utoipa::path(put, path = "/v1/secrets/{name}", request_body = SecretUpdate,
    responses((status = 200, body = SecretInfo), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn update_secret(
    State(st): St,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<SecretUpdate>,
) -> ApiResult<Json<SecretInfo>> {
    Ok(Json(
        st.control
            .secrets()
            .update(&name, req.value, req.metadata)
            .await?,
    ))
}

/// Removes a secret; sandboxes given it keep their copy.
#[utoipa::path(delete, path = "/v1/secrets/{name}",
    responses((status = 200, body = SecretInfo), (status = 404, body = ErrorBody)))]
pub(crate) async fn delete_secret(
    State(st): St,
    Path(name): Path<String>,
) -> ApiResult<Json<SecretInfo>> {
    Ok(Json(st.control.secrets().delete(&name).await?))
}
