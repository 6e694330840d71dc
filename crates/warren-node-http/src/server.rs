//! The node side: every call of the contract as `POST /node/v2/{call}`,
//! behind the node credential; the dispatch is made from the call list.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt, TryStreamExt};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use tracing::Instrument;
use warren_node_api::{ByteStream, FileKind, FileRead, NodeApi, NodeError, Tunnel};

use crate::access::{auth, fenced, replaced, Credential};
use crate::fence::{Admitted, Fence};
use crate::ndjson;
use crate::wire::{self, *};
use warren_core::sync::lock;

type Node = State<Arc<dyn NodeApi>>;

/// The node's HTTP API. Every route takes `Authorization: Bearer
/// <credential>`; the node credential is shared with the control plane
/// only, never with users. An empty credential refuses every request.
///
/// Every call of [`NodeApi`] is `POST /node/v2/{call}`, named as its
/// method; its arguments are a JSON object of the method's arguments by
/// name (as [`warren_node_api::calls`] declares them: `Duration`s as
/// `{"secs","nanos"}`, exec input as base64). By the call's shape:
///
/// | shape | arguments | answer |
/// |---|---|---|
/// | `unary` | JSON body | JSON |
/// | `stream` | JSON body | NDJSON, one value a line, as they happen (the event feed: a blank line every 15 s when quiet) |
/// | `bytes` | JSON body | raw bytes (a log) |
/// | `file` | JSON body | raw bytes; `x-warren-file-kind: file` with its `Content-Length`, or `dir` for a tar archive |
/// | `upload` | `?args=` JSON | JSON; the request body is the bytes |
/// | `tunnel` | `?args=` JSON | `Upgrade: tcp`: 101, then the port's bytes both ways |
///
/// A refusal is the `NodeError` as JSON, with a status chosen from its kind.
///
/// `fence` refuses the calls of a control plane that another replica
/// replaced (see [`crate::fence`]).
pub fn router(node: Arc<dyn NodeApi>, credential: impl Into<Credential>, fence: Fence) -> Router {
    let credential = credential.into();
    if credential.is_empty() {
        // A node agent before its join: the control plane gives it one.
        tracing::info!(
            "the node API has no credential yet: it refuses every request until the node joins"
        );
    }
    let api = Router::new()
        .route("/{call}", post(call))
        .method_not_allowed_fallback(wrong_method)
        .with_state(node);
    Router::new()
        .nest(&format!("/{}", PREFIX.join("/")), api)
        .fallback(no_route)
        // Only JSON arguments are buffered (through `Bytes`); file and
        // archive bodies are taken as a stream and are not bound by it.
        .layer(DefaultBodyLimit::max(JSON_LIMIT))
        .layer(middleware::from_fn_with_state(fence, fenced))
        .layer(middleware::from_fn_with_state(credential, auth))
}

async fn no_route(req: Request) -> Failure {
    Failure(NodeError::not_found(format!(
        "no node API route {} {}",
        req.method(),
        req.uri().path()
    )))
}

async fn wrong_method(req: Request) -> Failure {
    Failure(NodeError::invalid(format!(
        "{} does not take {}",
        req.uri().path(),
        req.method()
    )))
}

/// A contract error as the answer: its kind picks the status, its JSON is
/// the body, which is what the client reads.
struct Failure(NodeError);

impl From<NodeError> for Failure {
    fn from(e: NodeError) -> Failure {
        Failure(e)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (wire::status_of(self.0.kind), Json(self.0)).into_response()
    }
}

type Answer<T> = Result<T, Failure>;

/// Values as NDJSON, each written as it comes (with heartbeats where the
/// feed has them). If the client goes away the body, and so the node's
/// stream, is dropped: for an exec that kills it.
fn feed_response<T: Feed>(values: BoxStream<'static, T>) -> Response {
    let lines = ndjson::encode(values)
        .inspect_err(|e| tracing::error!("cannot encode a stream value: {e}"));
    let body = match T::HEARTBEAT {
        Some((every, _)) => Body::from_stream(with_heartbeat(lines, every)),
        None => Body::from_stream(lines),
    };
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

/// A byte stream as a body. A failure mid-way can only cut the body short
/// (the status is sent): the client sees a broken body, not the error, so
/// the error is logged here.
fn byte_body(what: &'static str, body: ByteStream) -> Body {
    Body::from_stream(body.inspect_err(move |e| tracing::warn!("{what} broke off: {e}")))
}

/// How much of an upload the node left unread is still read (and dropped)
/// so that its answer reaches the client; past that the connection is cut.
const LINGER_BYTES: u64 = 256 << 20;
const LINGER_TIME: Duration = Duration::from_secs(15);

/// A request body as the contract's byte stream, chunk by chunk, and
/// what reads the rest of it (within bounds) once the node is done: a
/// node that refuses an upload answers before reading it, and an answer
/// sent while the client still writes is lost with the connection that
/// is closed under it: the client would see a broken pipe, not the
/// node's error.
fn upload(body: Body) -> (ByteStream, impl Future<Output = ()>) {
    let body = Arc::new(Mutex::new(body.into_data_stream()));
    let shared = body.clone();
    let chunks = futures_util::stream::poll_fn(move |cx| lock(&shared).poll_next_unpin(cx))
        .map_err(|e| NodeError::unavailable(format!("the upload broke off: {e}")))
        .boxed();
    let linger = async move {
        let rest = async {
            let mut read = 0u64;
            let next = || futures_util::future::poll_fn(|cx| lock(&body).poll_next_unpin(cx));
            while let Some(Ok(chunk)) = next().await {
                read += chunk.len() as u64;
                if read > LINGER_BYTES {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(LINGER_TIME, rest).await;
    };
    (chunks, linger)
}

/// A blank line whenever the feed was quiet for a heartbeat's time.
fn with_heartbeat<S>(lines: S, every: Duration) -> impl Stream<Item = S::Item> + Send
where
    S: Stream<Item = Result<Bytes, serde_json::Error>> + Send + Unpin,
{
    futures_util::stream::unfold(lines, move |mut lines| async move {
        match tokio::time::timeout(every, lines.next()).await {
            Ok(Some(line)) => Some((line, lines)),
            Ok(None) => None,
            Err(_) => Some((Ok(Bytes::from_static(b"\n")), lines)),
        }
    })
}

/// A read's answer: the bytes, with what they are (and a file's length).
fn file_response(read: FileRead) -> Response {
    let mut resp = byte_body("a file read", read.body).into_response();
    let headers = resp.headers_mut();
    let (kind, content_type) = match read.kind {
        FileKind::File { size } => {
            // hyper sends exactly this many bytes, or cuts the connection:
            // the client can tell a short read from a whole one.
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
            ("file", "application/octet-stream")
        }
        FileKind::Dir => ("dir", "application/x-tar"),
    };
    headers.insert(FILE_KIND, HeaderValue::from_static(kind));
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// A caller replaced as leader while its create ran gets `fenced`, and
/// what it made is destroyed: the new leader took stock of the node
/// before it existed, so nothing else would ever remove it. The create
/// itself finishes without its caller (see [`NodeApi::create`]); the task
/// here is for that check, which must run even when the caller is gone.
async fn create(node: Arc<dyn NodeApi>, req: Request) -> Answer<Response> {
    let admitted = req.extensions().get::<Admitted>().cloned();
    let args: args::create = json_args(req).await?;
    let made = tokio::spawn(
        async move {
        let id = args.req.id.clone();
        let status = node.create(args.req).await?;
        let Some((given, current)) = admitted.and_then(|a| Some((a.given, a.superseded_by()?)))
        else {
            return Ok(status);
        };
        tracing::warn!(sandbox = %id, given, current, "a create of a replaced control plane ended after the new leader took stock; destroying what it made");
        if let Err(e) = node
            .destroy(&id, warren_core::state::reason::CREATE_FAILED)
            .await
        {
            tracing::warn!(sandbox = %id, error = %e, "destroying a replaced leader's create");
        }
        Err(replaced(given, current))
        }
        .in_current_span(),
    );
    let status = made
        .await
        .map_err(|e| NodeError::internal(format!("create task: {e}")))??;
    Ok(Json(status).into_response())
}

/// Makes [`call`], which answers one call, from the call list: `create`
/// with its fencing (see [`create`]); every other's arguments are read in
/// their wire form and lent to the node's method, and its answer written
/// by its shape (see `answer!`).
macro_rules! dispatch {
    ($(
        $(#[$meta:meta])*
        $shape:ident $deadline:ident fn $name:ident(
            $($arg:ident : $ty:ty $(=> $wire:ty)?),* $(; $body:ident : $body_ty:ty)?
        ) -> $reply:ty;
    )*) => {
        async fn call(
            State(node): Node,
            call: Result<Path<String>, PathRejection>,
            mut req: Request,
        ) -> Answer<Response> {
            let Path(call): Path<String> =
                call.map_err(|e| NodeError::invalid(format!("path: {}", e.body_text())))?;
            let span = crate::trace_context::call_span(&call, req.headers());
            async move {
                if call == "create" {
                    return create(node, req).await;
                }
                match call.as_str() {
                    $(stringify!($name) => answer!($shape req, args::$name { $($arg),* } $(, $body)? =>
                        node.$name($(warren_node_api::wire_lend!($arg $(, $wire)?),)* $($body)?)),)*
                    _ => Err(NodeError::not_found(format!("the node API has no call {call:?}")).into()),
                }
            }
            .instrument(span)
            .await
        }
    };
}

/// One call by its shape: its arguments read into `$args` (from the JSON
/// body, or from `?args=` where the body is an upload's bytes or the
/// connection a tunnel's), `$call` made, its answer written.
macro_rules! answer {
    (unary $req:ident, $args:pat => $call:expr) => {{
        let $args = json_args($req).await?;
        Ok(Json($call.await?).into_response())
    }};
    (stream $req:ident, $args:pat => $call:expr) => {{
        let $args = json_args($req).await?;
        Ok(feed_response($call.await?))
    }};
    (bytes $req:ident, $args:pat => $call:expr) => {{
        let $args = json_args($req).await?;
        let body = byte_body("a byte stream", $call.await?);
        Ok(([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response())
    }};
    (file $req:ident, $args:pat => $call:expr) => {{
        let $args = json_args($req).await?;
        Ok(file_response($call.await?))
    }};
    // The node's answer waits for what it left of the upload (see
    // [`upload`]).
    (upload $req:ident, $args:pat, $body:ident => $call:expr) => {{
        let $args = query_args(&$req)?;
        let ($body, linger) = upload($req.into_body());
        let answer = $call.await;
        linger.await;
        Ok(Json(answer?).into_response())
    }};
    (tunnel $req:ident, $args:pat => $call:expr) => {{
        let upgrade = upgrade_of(&mut $req)?;
        let $args = query_args(&$req)?;
        // Reach the port first, so a failure is still an ordinary answer.
        Ok(tunnel_response(upgrade, $call.await?))
    }};
}

warren_node_api::node_calls!(dispatch);

/// A call's arguments from its JSON body (an empty body is `{}`, for calls
/// without any), refused as a `NodeError`.
async fn json_args<A: DeserializeOwned>(req: Request) -> Result<A, Failure> {
    let bytes = Bytes::from_request(req, &()).await.map_err(|e| {
        NodeError::invalid(format!(
            "request body (at most {JSON_LIMIT} bytes): {}",
            e.body_text()
        ))
    })?;
    let bytes: &[u8] = if bytes.is_empty() { b"{}" } else { &bytes };
    serde_json::from_slice(bytes)
        .map_err(|e| Failure(NodeError::invalid(format!("arguments: {e}"))))
}

/// A call's arguments from the `args` query parameter.
fn query_args<A: DeserializeOwned>(req: &Request) -> Result<A, Failure> {
    let Query(q) = Query::<ArgsQuery>::try_from_uri(req.uri())
        .map_err(|e| NodeError::invalid(format!("query: {}", e.body_text())))?;
    serde_json::from_str(&q.args)
        .map_err(|e| Failure(NodeError::invalid(format!("arguments ({ARGS}): {e}"))))
}

/// A tunnel's request is an upgrade (`Upgrade: tcp`): the connection it
/// becomes once the answer is sent.
fn upgrade_of(req: &mut Request) -> Result<OnUpgrade, Failure> {
    let wants_tcp = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("tcp"));
    if !wants_tcp {
        return Err(NodeError::invalid(
            "a port connection is an upgrade: send 'Connection: Upgrade' and 'Upgrade: tcp'",
        )
        .into());
    }
    Ok(hyper::upgrade::on(req))
}

/// Once the node reached the port, `101 Switching Protocols`, then the
/// connection carries its bytes both ways until either side closes.
fn tunnel_response(upgrade: OnUpgrade, mut tunnel: Box<dyn Tunnel>) -> Response {
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let mut client = TokioIo::new(upgraded);
                if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut tunnel).await {
                    tracing::debug!("a port tunnel ended: {e}");
                }
            }
            Err(e) => tracing::warn!("a port tunnel: the upgrade failed: {e}"),
        }
    });
    (
        StatusCode::SWITCHING_PROTOCOLS,
        [(header::CONNECTION, "upgrade"), (header::UPGRADE, "tcp")],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_quiet_feed_sends_heartbeats_and_a_busy_one_does_not() {
        let quiet = futures_util::stream::pending::<Result<Bytes, serde_json::Error>>();
        let beats: Vec<Bytes> = with_heartbeat(quiet, Duration::from_millis(10))
            .take(3)
            .map(|r| r.unwrap())
            .collect()
            .await;
        assert_eq!(beats, vec![Bytes::from_static(b"\n"); 3]);

        let busy = ndjson::encode(futures_util::stream::iter([1, 2]));
        let lines: Vec<Bytes> = with_heartbeat(busy, Duration::from_secs(60))
            .map(|r| r.unwrap())
            .collect()
            .await;
        assert_eq!(lines, vec![&b"1\n"[..], b"2\n"]);
    }
}
