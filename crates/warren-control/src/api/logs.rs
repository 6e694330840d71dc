//! Logs of one sandbox or of a label selector, and the event stream.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde::Deserialize;
use warren_core::files::WatchEvent;
use warren_core::{ApiError, ErrorBody, Selector};

use axum::Extension;
use warren_core::tenant::Principal;

use super::{ndjson, ndjson_lines, ApiResult, St, Who};
use crate::control::Control;

#[derive(Deserialize)]
pub(crate) struct LogQuery {
    follow: Option<bool>,
    /// The usage samples kept of the sandbox instead of its log.
    usage: Option<bool>,
}

/// The sandbox's JSON-lines log, whether or not the sandbox or its node
/// still exists (its node ships every line to the control plane); with
/// `follow=true` the stream stays open until the sandbox has ended. With
/// `usage=true`, its usage samples instead, oldest first:
/// `{"kind":"usage","sandbox_id":…,"time_ms":…,"usage":{…}}`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/logs", params(("follow" = Option<bool>, Query), ("usage" = Option<bool>, Query)),
    responses((status = 200, content_type = "application/x-ndjson"), (status = 404, body = ErrorBody)))]
pub(crate) async fn logs(
    State(st): St,
    Path(id): Path<String>,
    Query(q): Query<LogQuery>,
) -> ApiResult<Response> {
    if q.usage.unwrap_or(false) {
        return Ok(ndjson_lines(st.control.io().usage_history(&id).await?));
    }
    let lines = st.control.io().logs(&id, q.follow.unwrap_or(false)).await?;
    Ok(ndjson_lines(lines))
}

#[derive(Deserialize)]
pub(crate) struct WatchQuery {
    path: String,
    recursive: Option<bool>,
}

/// The events of a directory in the sandbox as they happen, one JSON line
/// each: `{"type":"event","name":N,"kind":"create"|"write"|"remove"|
/// "rename"|"chmod"}` (names relative to the directory), or a last
/// `{"type":"error","error":…}` when the watch failed. Ends when the
/// client hangs up or the directory goes.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/watch",
    params(("path" = String, Query), ("recursive" = Option<bool>, Query)),
    responses((status = 200, content_type = "application/x-ndjson"), (status = 404, body = ErrorBody),
        (status = 400, body = ErrorBody)))]
pub(crate) async fn watch(
    State(st): St,
    Path(id): Path<String>,
    Query(q): Query<WatchQuery>,
) -> ApiResult<Response> {
    let events = st
        .control
        .io()
        .watch(&id, &q.path, q.recursive.unwrap_or(false))
        .await?;
    // An error line carries the API's error, as every other stream's does.
    let lines = events.map(|e| match e {
        WatchEvent::Event { name, kind } => WatchEvent::Event { name, kind },
        WatchEvent::Error { error } => WatchEvent::Error {
            error: error.body().error,
        },
    });
    Ok(ndjson(&st, lines))
}

#[derive(Deserialize)]
pub(crate) struct LabelQuery {
    label: Option<String>,
    /// Only lines written this long ago or later (e.g. `1h`, `30m`).
    since: Option<String>,
}

/// The logs of every sandbox (live or finished, its node alive or gone)
/// matching a label selector, one after another in creation order; every
/// line names its sandbox.
#[utoipa::path(get, path = "/v1/logs", params(("label" = String, Query), ("since" = Option<String>, Query)),
    responses((status = 200, content_type = "application/x-ndjson"), (status = 400, body = ErrorBody)))]
pub(crate) async fn logs_by_label(
    State(st): St,
    Extension(who): Who,
    Query(q): Query<LabelQuery>,
) -> ApiResult<Response> {
    let label = q.label.unwrap_or_default();
    if label.trim().is_empty() {
        return Err(ApiError::bad_request("give a label selector, e.g. ?label=task=swe").into());
    }
    let sel = Selector::parse(&label).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let since_ms = match q.since.as_deref() {
        None | Some("") => 0,
        Some(s) => {
            let ago = warren_core::quantity::parse_duration(s).map_err(|e| {
                ApiError::bad_request(format!("since {s:?}: {e} (write e.g. 1h, 30m, 2d)"))
            })?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            now.saturating_sub(ago).as_millis() as i64
        }
    };
    // Streamed line by line, never a whole log in memory.
    Ok(ndjson_lines(
        st.control.io().logs_by_label(&who, &sel, since_ms).await?,
    ))
}

#[derive(Deserialize, Clone)]
pub(crate) struct EventQuery {
    sandbox: Option<String>,
    /// Label selector over the sandboxes whose events to show.
    label: Option<String>,
    batch: Option<String>,
    /// Event reason (e.g. `ttl_expired`) or state (e.g. `destroyed`).
    #[serde(rename = "type")]
    kind: Option<String>,
    after: Option<i64>,
    limit: Option<i64>,
    /// Keep the NDJSON stream open and send new events as they happen.
    follow: Option<bool>,
}

impl EventQuery {
    fn selector(&self) -> Result<Selector, ApiError> {
        let mut sel = Selector::parse(self.label.as_deref().unwrap_or(""))
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        if let Some(b) = &self.batch {
            sel.0.push(warren_core::labels::Requirement::Equals(
                warren_core::batch::BATCH_LABEL.into(),
                b.clone(),
            ));
        }
        Ok(sel)
    }
}

/// Events after `after` that pass the filters, and the last sequence seen.
pub(crate) async fn filtered_events(
    control: &Control,
    who: &Principal,
    q: &EventQuery,
    sel: &Selector,
    after: i64,
) -> Result<(Vec<warren_core::Event>, i64), ApiError> {
    let limit = q.limit.unwrap_or(1000).clamp(1, 10_000);
    let evs = control
        .records()
        .events(q.sandbox.as_deref(), after, limit)
        .await?;
    let last = evs.last().map_or(after, |e| e.seq);
    // A tenant sees its own sandboxes' events only (no node's).
    let members: Option<std::collections::HashSet<String>> = if sel.is_empty() && who.is_operator()
    {
        None
    } else {
        Some(
            control
                .records()
                .rows_owned(who.scope(), &[])
                .await?
                .into_iter()
                .filter(|r| sel.matches(r.labels()))
                .map(|r| r.id)
                .collect(),
        )
    };
    let kept = evs
        .into_iter()
        .filter(|e| members.as_ref().is_none_or(|m| m.contains(&e.sandbox_id)))
        .filter(|e| {
            q.kind.as_deref().is_none_or(|k| {
                e.reason == k || e.kind == k || e.state.is_some_and(|s| s.as_str() == k)
            })
        })
        .collect();
    Ok((kept, last))
}

/// The event stream: state changes with reasons, filterable by sandbox,
/// label selector, batch and type; `follow=true` streams NDJSON.
#[utoipa::path(get, path = "/v1/events", params(("sandbox" = Option<String>, Query), ("label" = Option<String>, Query),
    ("batch" = Option<String>, Query), ("type" = Option<String>, Query), ("after" = Option<i64>, Query),
    ("limit" = Option<i64>, Query), ("follow" = Option<bool>, Query)),
    responses((status = 200, body = [warren_core::Event])))]
pub(crate) async fn events(
    State(st): St,
    Extension(who): Who,
    Query(q): Query<EventQuery>,
) -> ApiResult<Response> {
    let sel = q.selector()?;
    let after = q.after.unwrap_or(0);
    if !q.follow.unwrap_or(false) {
        let (evs, _) = filtered_events(&st.control, &who, &q, &sel, after).await?;
        return Ok(Json(evs).into_response());
    }
    let control = st.control.clone();
    let written = st.control.records().event_writes();
    let stream = futures_util::stream::unfold(
        (after, Vec::<warren_core::Event>::new(), written),
        move |(mut seq, mut pending, mut written)| {
            let (control, q, sel, who) = (control.clone(), q.clone(), sel.clone(), who.clone());
            async move {
                loop {
                    if let Some(ev) = pending.pop() {
                        let mut line = serde_json::to_vec(&ev).unwrap_or_default();
                        line.push(b'\n');
                        let next = (seq, pending, written);
                        return Some((Ok::<_, std::io::Error>(Bytes::from(line)), next));
                    }
                    // Marked seen before reading, so a write in between
                    // wakes the wait below.
                    written.borrow_and_update();
                    match filtered_events(&control, &who, &q, &sel, seq).await {
                        Ok((evs, last)) => {
                            seq = last;
                            pending = evs.into_iter().rev().collect();
                            if pending.is_empty() {
                                let _ =
                                    tokio::time::timeout(Duration::from_secs(5), written.changed())
                                        .await;
                            }
                        }
                        Err(_) => return None,
                    }
                }
            }
        },
    )
    .take_until(st.control.lifecycle().stopped());
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}
