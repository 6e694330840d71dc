//! `GET /v1/fleet`: the fleet over a window of time, grouped by a label
//! key (see `crate::fleet`).

use axum::extract::{Query, State};
use axum::{Extension, Json};
use serde::Deserialize;
use warren_core::fleet::Fleet;
use warren_core::ApiError;

use super::{ApiResult, St, Who};

#[derive(Deserialize)]
pub(crate) struct FleetQuery {
    key: Option<String>,
    since: Option<String>,
}

/// The window when none is asked for.
const DEFAULT_SINCE: &str = "1h";

/// Every sandbox not ended and every one that ended within `since`
/// (default 1h), grouped by the values of the label `key`: per value, an
/// `unlabelled` row and a total, the count per state or outcome, the
/// success rate, CPU and memory used against requests and limits, and CPU
/// throttling. A tenant's token counts its own sandboxes only.
#[utoipa::path(get, path = "/v1/fleet", params(("key" = String, Query), ("since" = Option<String>, Query)),
    responses((status = 200, body = Fleet), (status = 400, body = warren_core::ErrorBody)))]
pub(crate) async fn fleet(
    State(st): St,
    Extension(who): Who,
    Query(q): Query<FleetQuery>,
) -> ApiResult<Json<Fleet>> {
    let key = q.key.ok_or_else(|| {
        ApiError::bad_request("key is required: the label key to group by, e.g. ?key=task")
    })?;
    let since = q.since.as_deref().unwrap_or(DEFAULT_SINCE);
    Ok(Json(st.control.records().fleet(&who, &key, since).await?))
}
