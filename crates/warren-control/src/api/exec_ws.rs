//! Exec over a WebSocket, for terminals (a browser's, `warren exec -it`):
//! `GET /v1/sandboxes/{id}/exec/ws`. One connection carries the whole
//! session both ways, so a keystroke costs one small frame, not a request.
//!
//! The protocol (docs/api.md): the client's first message is a text
//! message holding an `ExecRequest` (the command travels in the body, never
//! in the URL; stdin is kept open). Then the client sends binary messages
//! (stdin bytes) and text messages `{"resize": {"rows": R, "cols": C}}` or
//! `{"close_stdin": true}`. The server sends the exec's events: binary
//! messages are its output (stdout, which is everything a terminal
//! shows), text messages are the other events of the NDJSON stream
//! (`start`, `stderr`, `exit`) as JSON; after `exit` it closes (1000). A
//! request that fails gets Warren's error body as a text message and a
//! close with code 4000 + the HTTP status it would have had (4400, 4404,
//! 4409, ...). Closing the connection kills the exec, as dropping the
//! NDJSON stream does.
//!
//! Authentication is the API's, checked before the upgrade by the router's
//! middleware: the bearer token, or (browsers cannot set that header on a
//! WebSocket) the console's session cookie, which the middleware takes for
//! an upgrade only with the console's own `Origin`, since a cookie rides
//! along on a cross-site WebSocket where a header does not (see
//! `console`).

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::Response;
use futures_util::stream::SplitStream;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use warren_core::{ApiError, ExecEvent, ExecRequest, WindowSize};

use super::{ApiResult, St};

/// How long the client has to send its request after the upgrade.
const REQUEST_WITHIN: Duration = Duration::from_secs(30);

/// A text message from the client after its request.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Control {
    #[serde(default)]
    resize: Option<WindowSize>,
    #[serde(default)]
    close_stdin: bool,
}

/// Run a command over a WebSocket (see the module's documentation and
/// docs/api.md for the messages).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/exec/ws",
    responses((status = 101, description = "WebSocket open; the first message is the ExecRequest"),
        (status = 400, body = warren_core::ErrorBody), (status = 404, body = warren_core::ErrorBody)))]
pub(crate) async fn exec_ws(
    State(st): St,
    Path(id): Path<String>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let upgrade = upgrade.map_err(|e| {
        ApiError::bad_request(format!(
            "this endpoint speaks WebSocket only ({e}); POST /v1/sandboxes/{{id}}/exec runs a command over plain HTTP"
        ))
    })?;
    // An unknown sandbox is answered in HTTP, before the upgrade.
    st.control.records().get(&id).await?;
    Ok(upgrade.on_upgrade(move |socket| session(st, id, socket)))
}

async fn session(st: std::sync::Arc<super::AppState>, id: String, socket: WebSocket) {
    let (mut tx, mut rx) = socket.split();
    let req = match first_request(&mut rx).await {
        Ok(r) => r,
        Err(e) => {
            let _ = fail(&mut tx, e).await;
            return;
        }
    };
    let started = std::time::Instant::now();
    let mut events = match st.control.io().exec(&id, &req).await {
        Ok(events) => events,
        Err(e) => {
            let _ = fail(&mut tx, e).await;
            return;
        }
    };
    st.control
        .metrics
        .exec_start_seconds
        .observe(started.elapsed().as_secs_f64());
    // The start event names the exec that input and resizes go to.
    let exec_id = match events.next().await {
        Some(ExecEvent::Start { exec_id, pid }) => {
            let start = ExecEvent::Start {
                exec_id: exec_id.clone(),
                pid,
            };
            if tx.send(event_message(&start)).await.is_err() {
                return;
            }
            exec_id
        }
        Some(other) => {
            // Not started (an error event): say so and end.
            let _ = tx.send(event_message(&other)).await;
            let _ = tx.send(close(1011, "the exec did not start")).await;
            return;
        }
        None => {
            let _ = tx.send(close(1011, "the exec did not start")).await;
            return;
        }
    };
    // Input goes on in a task of its own, so a command that does not read
    // its terminal never holds up its output.
    let input = tokio::spawn(forward_input(st.clone(), id.clone(), exec_id, rx));
    let stopped = st.control.lifecycle().stopped();
    tokio::pin!(stopped);
    tokio::pin!(input);
    loop {
        tokio::select! {
            ev = events.next() => {
                let Some(ev) = ev else {
                    let _ = tx.send(close(1011, "the exec's stream ended without an exit")).await;
                    break;
                };
                let end = match ev {
                    ExecEvent::Exit { .. } => Some(1000),
                    ExecEvent::Error { .. } => Some(1011),
                    _ => None,
                };
                let msg = match &ev {
                    ExecEvent::Keepalive => Message::Ping(Default::default()),
                    other => event_message(other),
                };
                if tx.send(msg).await.is_err() {
                    break;
                }
                if let Some(code) = end {
                    let _ = tx.send(close(code, "")).await;
                    break;
                }
            }
            // The client went away, or broke the protocol: the exec dies
            // with the stream (dropped below).
            ended = &mut input => {
                if let Ok(Some(e)) = ended {
                    let _ = fail(&mut tx, e).await;
                }
                break;
            }
            _ = &mut stopped => {
                let _ = tx.send(close(1001, "warren up is stopping")).await;
                break;
            }
        }
    }
    input.abort();
}

/// Reads the client's request: its first message.
async fn first_request(rx: &mut SplitStream<WebSocket>) -> Result<ExecRequest, ApiError> {
    let bad = |m: String| ApiError::bad_request(m);
    loop {
        let msg = match tokio::time::timeout(REQUEST_WITHIN, rx.next()).await {
            Err(_) => {
                return Err(bad(format!(
                    "no exec request within {}s of opening the WebSocket",
                    REQUEST_WITHIN.as_secs()
                )))
            }
            Ok(None) | Ok(Some(Err(_))) => return Err(bad("the WebSocket closed".into())),
            Ok(Some(Ok(m))) => m,
        };
        match msg {
            Message::Text(text) => {
                let mut req: ExecRequest = serde_json::from_str(text.as_str())
                    .map_err(|e| bad(format!("the first message must be an exec request: {e}")))?;
                // The socket is stdin: it stays open while the exec runs.
                req.stdin_open = true;
                return Ok(req);
            }
            Message::Ping(_) | Message::Pong(_) => continue,
            _ => {
                return Err(bad(
                    "the first message must be an exec request as JSON text".into(),
                ))
            }
        }
    }
}

/// Passes the client's messages on, in order, until it closes (None) or
/// breaks the protocol (the error it is told); either ends the exec.
async fn forward_input(
    st: std::sync::Arc<super::AppState>,
    id: String,
    exec_id: String,
    mut rx: SplitStream<WebSocket>,
) -> Option<ApiError> {
    let exec = match st.control.io().exec_handle(&id, &exec_id).await {
        Ok(h) => h,
        Err(e) => return Some(e),
    };
    while let Some(Ok(msg)) = rx.next().await {
        let sent = match msg {
            Message::Binary(data) => exec.input(data, false).await,
            Message::Text(text) => match serde_json::from_str::<Control>(text.as_str()) {
                Ok(Control {
                    resize: Some(size), ..
                }) => match size.validate() {
                    Ok(()) => exec.resize(size).await,
                    Err(e) => return Some(ApiError::bad_request(e.to_string())),
                },
                Ok(Control {
                    close_stdin: true, ..
                }) => exec.input(Default::default(), true).await,
                _ => {
                    return Some(ApiError::bad_request(format!(
                        "after the exec request, text messages are {{\"resize\": {{\"rows\": R, \"cols\": C}}}} or {{\"close_stdin\": true}}; got {:?}",
                        text.as_str().chars().take(200).collect::<String>()
                    )))
                }
            },
            Message::Close(_) => return None,
            Message::Ping(_) | Message::Pong(_) => Ok(()),
        };
        // Input that came after the exec ended or closed its stdin, or a
        // resize of an exec without a terminal, changes nothing: the
        // session goes on to the exit event.
        let _ = sent;
    }
    None
}

fn event_message(ev: &ExecEvent) -> Message {
    match ev {
        ExecEvent::Stdout { .. } => Message::Binary(ev.output_bytes().unwrap_or_default().into()),
        other => Message::Text(serde_json::to_string(other).unwrap_or_default().into()),
    }
}

fn close(code: u16, reason: &str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: Utf8Bytes::from(reason),
    }))
}

/// Warren's error body, then a close whose code carries the HTTP status.
async fn fail(
    tx: &mut futures_util::stream::SplitSink<WebSocket, Message>,
    e: ApiError,
) -> Result<(), axum::Error> {
    let body = serde_json::to_string(&e.body()).unwrap_or_default();
    tx.send(Message::Text(body.into())).await?;
    let code = 4000 + e.code.http_status();
    tx.send(close(code, "")).await
}
