//! `/v1/builds`: image builds from a Dockerfile and a context.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use axum::{Extension, Json};
use warren_core::build::{BuildInfo, BuildRequest};
use warren_core::{ApiError, ErrorBody};

use super::{ndjson, ApiResult, St, Who};

/// Build an image. The body is the build context as a tar archive (the
/// Dockerfile inside it; `.dockerignore` applies). Query: `tag`,
/// `dockerfile` (default `Dockerfile`), `build_arg=K=V` (repeated),
/// `target`, `allow=HOST:PORT` (repeated: what `RUN` may reach), `test`,
/// `push`, `no_cache`. The answer is an NDJSON stream of build events:
/// first `{"type":"build","id":..}`, last `done` (the digest) or `failed`.
/// The build goes on if the client leaves; `GET /v1/builds/{id}` shows it.
#[utoipa::path(post, path = "/v1/builds",
    params(("tag" = Option<String>, Query), ("dockerfile" = Option<String>, Query),
        ("build_arg" = Option<Vec<String>>, Query), ("target" = Option<String>, Query),
        ("allow" = Option<Vec<String>>, Query), ("test" = Option<String>, Query),
        ("push" = Option<String>, Query), ("no_cache" = Option<bool>, Query)),
    responses((status = 200, description = "NDJSON BuildEvent stream", body = warren_core::build::BuildEvent),
        (status = 400, body = ErrorBody)))]
pub(crate) async fn create_build(
    State(st): St,
    Extension(who): Who,
    Query(pairs): Query<Vec<(String, String)>>,
    body: Body,
) -> ApiResult<Response> {
    let req = BuildRequest::from_pairs(&pairs).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let context = crate::streams::upload(body);
    let events = st.control.start_build(&who, req, context).await?;
    Ok(ndjson(&st, events))
}

/// A build: its state, its result and every event so far.
#[utoipa::path(get, path = "/v1/builds/{id}",
    responses((status = 200, body = BuildInfo), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_build(
    State(st): St,
    Extension(who): Who,
    Path(id): Path<String>,
) -> ApiResult<Json<BuildInfo>> {
    Ok(Json(st.control.build_info(&who, &id)?))
}
