//! `/v1/nodes`: what each node lends, holds and how it stands; joins and
//! heartbeats from node agents; cordons and removals by operators.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::routing::post;
use axum::{Json, Router};
use warren_core::ApiError;
use warren_node_api::{JoinRequest, Joined, NodeInfo as Described};

use super::{ApiResult, AppState, Failure, St};
use crate::api::json_body::{parse, JsonBody, RawBody};
use crate::nodes::{Connector, NodeListing, ProofCheck};

/// How nodes join a cluster's control plane.
pub struct Join {
    /// What `warren node --join-token FILE` must show.
    pub token: String,
    pub connect: Connector,
    pub check_proof: ProofCheck,
    /// What of the server's `registries.toml` joining nodes take (see
    /// `warren_node_api::Joined::registries`).
    pub registries: Option<String>,
}

/// Nodes with their state, labels, capacity, allocation and load.
#[utoipa::path(get, path = "/v1/nodes", responses((status = 200, body = [NodeListing])))]
pub(crate) async fn nodes(State(st): St) -> Json<Vec<NodeListing>> {
    Json(st.control.node_set().list())
}

pub(crate) async fn cordon(State(st): St, Path(name): Path<String>) -> ApiResult<Json<()>> {
    st.control.node_set().set_cordoned(&name, true).await?;
    Ok(Json(()))
}

pub(crate) async fn uncordon(State(st): St, Path(name): Path<String>) -> ApiResult<Json<()>> {
    st.control.node_set().set_cordoned(&name, false).await?;
    Ok(Json(()))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DrainRequest {
    /// How long sandboxes may run on (e.g. `10m`).
    deadline: String,
}

pub(crate) async fn drain(
    State(st): St,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<DrainRequest>,
) -> ApiResult<Json<()>> {
    let deadline = warren_core::quantity::parse_duration(&req.deadline)
        .map_err(|e| ApiError::bad_request(format!("deadline {:?}: {e}", req.deadline)))?;
    st.control.drain_node(&name, deadline).await?;
    Ok(Json(()))
}

pub(crate) async fn remove(State(st): St, Path(name): Path<String>) -> ApiResult<Json<()>> {
    st.control.remove_node(&name).await?;
    Ok(Json(()))
}

/// Routes node agents call, each with its own secret instead of the API
/// token: the join token to join, the node credential to heartbeat.
pub(crate) fn agent_routes() -> Router<std::sync::Arc<AppState>> {
    Router::new()
        .route("/v1/nodes/join", post(join))
        .route("/v1/nodes/{name}/heartbeat", post(heartbeat))
}

fn bearer(headers: &HeaderMap) -> &str {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
}

fn unauthorized(what: &str) -> Failure {
    Failure(ApiError::new(warren_core::ErrorCode::Unauthorized, what))
}

// Join and heartbeat read their bodies only once the caller proved who it
// is: a stranger learns nothing of the schema from a parse error.
async fn join(
    State(st): St,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> ApiResult<Json<Joined>> {
    let Some(join) = &st.join else {
        return Err(Failure(ApiError::conflict(
            "this control plane drives its own node (`warren up`); nodes join a `warren server`",
        )));
    };
    use subtle::ConstantTimeEq;
    let given = bearer(&headers);
    if join.token.is_empty() || !bool::from(given.as_bytes().ct_eq(join.token.as_bytes())) {
        return Err(unauthorized(
            "wrong join token: pass the file `warren server join-token` printed (--join-token FILE)",
        ));
    }
    let req: JoinRequest = parse(&body)?;
    (join.check_proof)(&req).map_err(|why| unauthorized(&format!("join refused: {why}")))?;
    let mut joined = st.control.node_set().join(req, &join.connect).await?;
    joined.registries = join.registries.clone();
    Ok(Json(joined))
}

async fn heartbeat(
    State(st): St,
    Path(name): Path<String>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> ApiResult<Json<()>> {
    if !st.control.node_set().credential_ok(&name, bearer(&headers)) {
        // Unknown (removed, or a control plane that lost its records) or a
        // stale credential: the agent joins again.
        return Err(unauthorized(&format!(
            "node {name:?} is not joined with this credential; join again"
        )));
    }
    let info: Described = parse(&body)?;
    if info.name != name {
        return Err(Failure(ApiError::bad_request(format!(
            "a heartbeat for {name:?} describes node {:?}",
            info.name
        ))));
    }
    st.control.heartbeat(&name, info);
    Ok(Json(()))
}
