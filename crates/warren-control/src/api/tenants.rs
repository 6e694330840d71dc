//! `/v1/tenants` and `/v1/tokens`: who shares this Warren, how much each
//! may hold, and the tokens they call with. The operator manages tenants;
//! a tenant's token reads its own tenant; a tenant's admin token makes and
//! revokes its tenant's tokens.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use warren_core::tenant::{
    NewToken, Principal, TenantInfo, TenantName, TenantRequest, TenantSpec, TokenInfo, TokenRequest,
};
use warren_core::{ApiError, ErrorBody};

use super::{ApiResult, St, Who};
use crate::api::json_body::JsonBody;

fn tenant_name(name: &str) -> Result<TenantName, ApiError> {
    name.parse()
        .map_err(|e: warren_core::tenant::TenantError| ApiError::bad_request(e.to_string()))
}

/// Who the caller is, as its token says.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub(crate) struct WhoAmI {
    /// The tenant whose things it acts on (`default` for the operator).
    tenant: TenantName,
    /// `operator`, or its role in its tenant.
    role: String,
    /// Its token's id (`operator` for the operator's).
    token: String,
}

/// Who the token is: its tenant and role (the console shows it, and leaves
/// out what a tenant may not open).
#[utoipa::path(get, path = "/v1/whoami", responses((status = 200, body = WhoAmI)))]
pub(crate) async fn whoami(Extension(who): Who) -> Json<WhoAmI> {
    let role = match &who {
        Principal::Operator => "operator".to_string(),
        Principal::Tenant { role, .. } => role.to_string(),
    };
    Json(WhoAmI {
        tenant: who.tenant(),
        role,
        token: who.token_id().to_string(),
    })
}

/// Every tenant the caller reaches (a tenant's token: its own), with what
/// its sandboxes hold and its queue.
#[utoipa::path(get, path = "/v1/tenants", responses((status = 200, body = [TenantInfo])))]
pub(crate) async fn list_tenants(
    State(st): St,
    Extension(who): Who,
) -> ApiResult<Json<Vec<TenantInfo>>> {
    Ok(Json(st.control.tenants().infos(&who).await?))
}

/// Makes a tenant (operator only). Its first token comes from `POST /v1/tokens`.
#[utoipa::path(post, path = "/v1/tenants", request_body = TenantRequest,
    responses((status = 201, body = TenantInfo), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn create_tenant(
    State(st): St,
    JsonBody(req): JsonBody<TenantRequest>,
) -> ApiResult<Response> {
    let made = st.control.tenants().create(&req).await?;
    Ok((StatusCode::CREATED, Json(made)).into_response())
}

#[utoipa::path(get, path = "/v1/tenants/{name}", responses((status = 200, body = TenantInfo), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_tenant(
    State(st): St,
    Extension(who): Who,
    Path(name): Path<String>,
) -> ApiResult<Json<TenantInfo>> {
    let name = tenant_name(&name)?;
    st.control
        .tenants()
        .infos(&who)
        .await?
        .into_iter()
        .find(|t| t.name == name)
        .map(Json)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "no tenant {name}; list them with `warren tenant ls`"
            ))
            .into()
        })
}

/// Replaces a tenant's quota, weight, priority, preemption and egress (operator only).
#[utoipa::path(put, path = "/v1/tenants/{name}", request_body = TenantSpec,
    responses((status = 200, body = TenantInfo), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn set_tenant(
    State(st): St,
    Path(name): Path<String>,
    JsonBody(spec): JsonBody<TenantSpec>,
) -> ApiResult<Json<TenantInfo>> {
    Ok(Json(
        st.control.tenants().set(&tenant_name(&name)?, spec).await?,
    ))
}

/// Removes a tenant and its tokens (operator only); refused (409) while it
/// has sandboxes that are not ended, batches, pools or secrets.
#[utoipa::path(delete, path = "/v1/tenants/{name}",
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn delete_tenant(
    State(st): St,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    st.control.tenants().remove(&tenant_name(&name)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The tokens the caller may manage (never their values).
#[utoipa::path(get, path = "/v1/tokens", responses((status = 200, body = [TokenInfo]), (status = 403, body = ErrorBody)))]
pub(crate) async fn list_tokens(
    State(st): St,
    Extension(who): Who,
) -> ApiResult<Json<Vec<TokenInfo>>> {
    Ok(Json(st.control.tenants().tokens(&who).await?))
}

/// Makes a token for a tenant; its value is in this answer only.
#[utoipa::path(post, path = "/v1/tokens", request_body = TokenRequest,
    responses((status = 201, body = NewToken), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn create_token(
    State(st): St,
    Extension(who): Who,
    JsonBody(req): JsonBody<TokenRequest>,
) -> ApiResult<Response> {
    let made = st.control.tenants().create_token(&who, &req).await?;
    Ok((StatusCode::CREATED, Json(made)).into_response())
}

/// Revokes a token at once.
#[utoipa::path(delete, path = "/v1/tokens/{id}",
    responses((status = 200, body = TokenInfo), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn revoke_token(
    State(st): St,
    Extension(who): Who,
    Path(id): Path<String>,
) -> ApiResult<Json<TokenInfo>> {
    Ok(Json(st.control.tenants().revoke(&who, &id).await?))
}
