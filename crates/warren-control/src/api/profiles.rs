//! `/v1/profiles`: learned resource profiles.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use warren_core::{ApiError, ErrorBody};

use super::{ApiResult, St};

/// Every resource profile with its current request and anomaly flag.
#[utoipa::path(get, path = "/v1/profiles", responses((status = 200, body = [warren_core::profile::Profile])))]
pub(crate) async fn list_profiles(
    State(st): St,
) -> ApiResult<Json<Vec<warren_core::profile::Profile>>> {
    Ok(Json(st.control.profiles().list().await?))
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub(crate) struct ProfileDetail {
    profile: warren_core::profile::Profile,
    /// peak × margin over the window of recent runs.
    recommendation: Option<warren_core::profile::Request>,
    runs: Vec<warren_core::profile::Run>,
}

#[utoipa::path(get, path = "/v1/profiles/{name}", responses((status = 200, body = ProfileDetail), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_profile(
    State(st): St,
    Path(name): Path<String>,
) -> ApiResult<Json<ProfileDetail>> {
    let (profile, recommendation, runs) = st.control.profiles().detail(&name).await?;
    Ok(Json(ProfileDetail {
        profile,
        recommendation,
        runs,
    }))
}

/// Forget a profile's runs and anomaly; it restarts from its original request.
#[utoipa::path(post, path = "/v1/profiles/{name}/reset", responses((status = 200, body = warren_core::profile::Profile), (status = 404, body = ErrorBody)))]
pub(crate) async fn reset_profile(
    State(st): St,
    Path(name): Path<String>,
) -> ApiResult<Json<warren_core::profile::Profile>> {
    Ok(Json(st.control.profiles().reset(&name).await?))
}

/// The profile table as TOML, to edit by hand and load again.
#[utoipa::path(get, path = "/v1/profiles/export", responses((status = 200, content_type = "application/toml")))]
pub(crate) async fn export_profiles(State(st): St) -> ApiResult<Response> {
    let text = st.control.profiles().export().await?;
    Ok(([(header::CONTENT_TYPE, "application/toml")], text).into_response())
}

/// Load a TOML profile table; listed profiles are replaced.
#[utoipa::path(post, path = "/v1/profiles/import", request_body(content = String, content_type = "application/toml"),
    responses((status = 200, body = [warren_core::profile::Profile]), (status = 400, body = ErrorBody)))]
pub(crate) async fn import_profiles(
    State(st): St,
    body: Bytes,
) -> ApiResult<Json<Vec<warren_core::profile::Profile>>> {
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::bad_request("the profile table must be UTF-8 TOML"))?;
    let profiles = st.control.profiles().import(text).await?;
    Ok(Json(profiles))
}
