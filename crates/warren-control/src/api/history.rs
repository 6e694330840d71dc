//! `GET /v1/history`: the last hour of queue length, create latency and
//! node CPU, and its alert events (see `crate::history`).

use axum::extract::{Query, State};
use axum::Json;
use serde::Deserialize;
use warren_core::history::History;

use super::{ApiResult, St};

#[derive(Deserialize)]
pub(crate) struct HistoryQuery {
    since: Option<String>,
}

/// The samples (every 5 s: queue length, create latency p50/p99 of the
/// creates answered since the sample before, each node's CPU busy share)
/// and alert events of the last `since` (default 15m, at most 1h, what the
/// control plane keeps in memory).
#[utoipa::path(get, path = "/v1/history", params(("since" = Option<String>, Query)),
    responses((status = 200, body = History), (status = 400, body = warren_core::ErrorBody)))]
pub(crate) async fn history(
    State(st): St,
    Query(q): Query<HistoryQuery>,
) -> ApiResult<Json<History>> {
    Ok(Json(
        st.control
            .telemetry()
            .history(q.since.as_deref().unwrap_or("15m"))?,
    ))
}
