//! `GET /v1/usage`: every matching sandbox's state, labels, requests and
//! latest usage in one answer, so a console watching ten thousand
//! sandboxes asks once a second, not once per sandbox per second.

use axum::extract::{Query, State};
use axum::Json;
use serde::Serialize;
use warren_core::{Labels, SandboxState};

use super::sandboxes::{list_filter, ListQuery};
use axum::Extension;

use super::{ApiResult, St, Who};

/// One sandbox as the console's tables and matrix need it.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct UsageRow {
    id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    state: SandboxState,
    reason: String,
    node: String,
    labels: Labels,
    image: String,
    created_at: String,
    /// What admission counts (millicores, bytes).
    cpu_request_millis: u64,
    memory_request: u64,
    /// The cgroup limits.
    cpu_limit_millis: u64,
    memory_limit: u64,
    /// CPU time used so far; the rate is the difference between two
    /// answers over `time_ms`. Absent when the sandbox is not live.
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_usage_ns: Option<u64>,
    /// CPU in use at the newest reading (millicores).
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_millis: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    oom_kills: Option<u64>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct UsageList {
    /// When the answer was made (Unix milliseconds).
    time_ms: u64,
    /// The newest event's sequence number, read before the sandboxes:
    /// `GET /v1/events?follow=true&after=event_seq` brings every change
    /// since this answer, without the history before it.
    event_seq: i64,
    sandboxes: Vec<UsageRow>,
}

/// Every sandbox that matches (live ones unless `state` or `all` say
/// otherwise) with its latest usage sample, in one answer.
#[utoipa::path(get, path = "/v1/usage", params(("label" = Option<String>, Query), ("state" = Option<String>, Query), ("all" = Option<bool>, Query)),
    responses((status = 200, body = UsageList), (status = 400, body = warren_core::ErrorBody)))]
pub(crate) async fn usage(
    State(st): St,
    Extension(who): Who,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<UsageList>> {
    let (states, selector) = list_filter(&q)?;
    let event_seq = st.control.records().last_event_seq().await?;
    let rows = st
        .control
        .records()
        .rows_owned(who.scope(), &states)
        .await?;
    let held = if rows.iter().any(|r| r.state.is_live()) {
        st.control.records().inventory().await
    } else {
        Default::default()
    };
    let time_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let sandboxes = rows
        .into_iter()
        .filter(|r| selector.matches(r.labels()))
        .map(|r| {
            let usage = held
                .get(&r.id)
                .filter(|_| r.state.is_live())
                .and_then(|s| s.usage.as_ref());
            UsageRow {
                cpu_request_millis: r.resources.cpu_request(),
                memory_request: r.resources.memory_request(),
                cpu_limit_millis: r.resources.cpu_millis,
                memory_limit: r.resources.memory,
                cpu_usage_ns: usage.map(|u| u.cpu_usage_ns),
                cpu_millis: usage.map(|u| u.cpu_millis_last),
                memory_bytes: usage.map(|u| u.memory_bytes),
                oom_kills: usage.map(|u| u.oom_kills),
                labels: r.spec.labels.clone(),
                image: r.spec.image.clone(),
                name: r.spec.name.as_ref().map(|n| n.to_string()),
                id: r.id,
                state: r.state,
                reason: r.reason,
                node: r.node,
                created_at: r.created_at,
            }
        })
        .collect();
    Ok(Json(UsageList {
        time_ms,
        event_seq,
        sandboxes,
    }))
}
