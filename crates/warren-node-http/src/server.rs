//! The node side: every route of the contract under `/node/v1`, behind the
//! node credential.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, BodyDataStream};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt, TryStreamExt};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use warren_core::spec::NetworkSpec;
use warren_core::{ExecRequest, SandboxSpec};
use warren_node_api::{
    ByteStream, CommitImage, CreateSandbox, DeriveImage, ErrorKind, FileKind, LogNote, NodeApi,
    NodeError, PathOp, WriteFile,
};

use crate::fence::{Admitted, Fence, Refusal, LEADER_EPOCH};
use crate::ndjson;
use crate::wire::{self, *};
use warren_core::sync::lock;

type Node = State<Arc<dyn NodeApi>>;

/// Serves `router` on `listener` until the listener fails. Every
/// connection gets TCP_NODELAY: exec output, events and the last chunk of
/// a stream are small writes that Nagle's algorithm would hold back until
/// the peer's delayed ACK (40 ms a round trip, measured).
pub async fn serve(listener: tokio::net::TcpListener, router: Router) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY on a node API connection");
        }
    });
    axum::serve(listener, router).await
}

/// A client that has not finished its TLS handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// As [`serve`], over TLS. Each connection's handshake runs in its own
/// task, so a slow or silent client holds up no other.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    router: Router,
    tls: tokio_rustls::TlsAcceptor,
) -> std::io::Result<()> {
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of descriptors and the like: back off, do not spin.
                tracing::warn!(error = %e, "accepting a node API connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY on a node API connection");
        }
        let (tls, router) = (tls.clone(), router.clone());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "TLS handshake on the node API");
                    return;
                }
                Err(_) => return,
            };
            let service = hyper_util::service::TowerToHyperService::new(router);
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "a node API connection");
            }
        });
    }
}

/// The node's HTTP API. Every route takes `Authorization: Bearer
/// <credential>`; the node credential is shared with the control plane
/// only, never with users. An empty credential refuses every request.
///
/// Under `/node/v1`:
///
/// | route | call | answer |
/// |---|---|---|
/// | `GET /info` | `info` | `NodeInfo` |
/// | `GET /events?since=N` | `events` | NDJSON `Sequenced`, open-ended |
/// | `GET /sandboxes` | `inventory` | `[SandboxStatus]` |
/// | `POST /sandboxes` | `create` (`CreateSandbox`) | `SandboxStatus` |
/// | `GET /sandboxes/{id}` | `status` | `SandboxStatus` |
/// | `DELETE /sandboxes/{id}?why=` | `destroy` | `Usage` or `null` |
/// | `POST /sandboxes/{id}/main` | `start_main` | 204 |
/// | `POST /sandboxes/{id}/paused` | `set_paused` (`{"paused"}`) | 204 |
/// | `POST /sandboxes/{id}/hold` | `hold` (`{"hold_for_ms","note"}`) | `Usage` or `null` |
/// | `POST /sandboxes/{id}/ttl` | `set_ttl` (`{"ttl_ms"}`) | 204 |
/// | `POST /sandboxes/{id}/claim` | `claim` (a `SandboxSpec`) | 204 |
/// | `POST /sandboxes/{id}/lease` | `renew_lease` | 204 |
/// | `POST /sandboxes/{id}/note` | `note` (`LogNote`) | 204 |
/// | `POST /sandboxes/{id}/exec` | `exec` (`ExecRequest`) | NDJSON `ExecEvent` |
/// | `PUT /sandboxes/{id}/files?path=&mode=&tar=` | `write_file` (raw body) | 204 |
/// | `GET /sandboxes/{id}/files?path=` | `read_file` | raw body, `x-warren-file-kind` |
/// | `POST /sandboxes/{id}/paths` | `path_op` (a `PathOp`) | JSON `[PathEntry]` |
/// | `POST /sandboxes/{id}/execs/{exec_id}/stdin?close=` | `exec_input` (raw body) | 204 |
/// | `POST /sandboxes/{id}/execs/{exec_id}/resize` | `exec_resize` (a `WindowSize`) | 204 |
/// | `GET /sandboxes/{id}/watch?path=&recursive=` | `watch` | NDJSON `WatchEvent` |
/// | `GET /sandboxes/{id}/logs?follow=` | `logs` | raw body |
/// | `POST /sandboxes/{id}/ports/{port}` | `connect_port` (`Upgrade: tcp`) | 101, then the port's bytes |
/// | `PUT /sandboxes/{id}/network` | `set_network` (`NetworkSpec`) | `PolicyChange` |
/// | `POST /sandboxes/{id}/commit` | `commit` (`CommitImage`) | `ImageInfo` |
/// | `POST /sandboxes/{id}/fork-layer` | `fork_layer` | `ForkLayer` |
/// | `DELETE /fork-layers/{layer}` | `release_fork_layer` | 204 |
/// | `POST /network/check` | `check_network` (`NetworkSpec`) | 204 |
/// | `GET /images` | `image_list` | `[ImageInfo]` |
/// | `DELETE /images?reference=` | `image_remove` | `ImageInfo` |
/// | `POST /images/for-create` | `image_for_create` (`{"reference"}`) | `ImageInfo` |
/// | `POST /images/pull` | `image_pull` (`{"reference"}`) | NDJSON `PullUpdate` |
/// | `POST /images/import?name=` | `image_import` (raw body) | `ImageInfo` |
/// | `POST /images/push` | `image_push` (`{"reference","source"}`) | `Pushed` |
/// | `POST /images/gc` | `image_gc` (`{"budget"}`) | `GcReport` |
/// | `POST /images/derive` | `image_derive` (`DeriveImage`) | `ImageInfo` |
/// | `GET /images/steps/{key}` | `image_step` | `ImageInfo` or `null` |
/// | `POST /volumes` | `volume_create` (`VolumeRequest`) | `VolumeInfo` |
/// | `GET /volumes` | `volume_list` | `[VolumeInfo]` |
/// | `DELETE /volumes/{name}` | `volume_remove` | `VolumeInfo` |
/// | `PUT /volumes/{name}/files?path=&mode=&uid=&gid=&replace=` | `volume_write` (raw body) | `PathEntry` |
/// | `GET /volumes/{name}/files?path=` | `volume_read` | raw body, `x-warren-file-kind` |
/// | `POST /volumes/{name}/paths` | `volume_path_op` (a `PathOp`) | JSON `[PathEntry]` |
///
/// A refusal is the `NodeError` as JSON, with a status chosen from its kind.
///
/// `fence` refuses the calls of a control plane that another replica
/// replaced (see [`crate::fence`]).
pub fn router(node: Arc<dyn NodeApi>, credential: impl Into<Credential>, fence: Fence) -> Router {
    let credential = credential.into();
    if lock(&credential.0).is_empty() {
        // A node agent before its join: the control plane gives it one.
        tracing::info!(
            "the node API has no credential yet: it refuses every request until the node joins"
        );
    }
    let api = Router::new()
        .route("/info", get(info))
        .route("/events", get(events))
        .route("/sandboxes", get(inventory).post(create))
        .route("/sandboxes/{id}", get(status).delete(destroy))
        .route("/sandboxes/{id}/main", post(start_main))
        .route("/sandboxes/{id}/paused", post(set_paused))
        .route("/sandboxes/{id}/hold", post(hold))
        .route("/sandboxes/{id}/ttl", post(set_ttl))
        .route("/sandboxes/{id}/claim", post(claim))
        .route("/sandboxes/{id}/lease", post(renew_lease))
        .route("/sandboxes/{id}/note", post(note))
        .route("/sandboxes/{id}/exec", post(exec))
        .route("/sandboxes/{id}/files", put(write_file).get(read_file))
        .route("/sandboxes/{id}/paths", post(path_op))
        .route("/sandboxes/{id}/execs/{exec_id}/stdin", post(exec_input))
        .route("/sandboxes/{id}/execs/{exec_id}/resize", post(exec_resize))
        .route("/sandboxes/{id}/watch", get(watch))
        .route("/sandboxes/{id}/logs", get(logs))
        .route("/sandboxes/{id}/ports/{port}", post(connect_port))
        .route("/sandboxes/{id}/network", put(set_network))
        .route("/sandboxes/{id}/commit", post(commit))
        .route("/sandboxes/{id}/fork-layer", post(fork_layer))
        .route(
            "/fork-layers/{layer}",
            axum::routing::delete(release_fork_layer),
        )
        .route("/network/check", post(check_network))
        .route("/images", get(image_list).delete(image_remove))
        .route("/images/for-create", post(image_for_create))
        .route("/images/pull", post(image_pull))
        .route("/images/import", post(image_import))
        .route("/images/push", post(image_push))
        .route("/images/gc", post(image_gc))
        .route("/volumes", get(volume_list).post(volume_create))
        .route("/volumes/{name}", axum::routing::delete(volume_remove))
        .route("/volumes/{name}/files", put(volume_write).get(volume_read))
        .route("/volumes/{name}/paths", post(volume_path_op))
        .route("/images/derive", post(image_derive))
        .route("/images/steps/{key}", get(image_step))
        .method_not_allowed_fallback(wrong_method)
        .with_state(node);
    Router::new()
        .nest(&format!("/{}", PREFIX.join("/")), api)
        .fallback(no_route)
        // Only the JSON extractors buffer (through `Bytes`); file and
        // archive bodies are taken as a stream and are not bound by it.
        .layer(DefaultBodyLimit::max(JSON_LIMIT))
        .layer(middleware::from_fn_with_state(fence, fenced))
        .layer(middleware::from_fn_with_state(credential, auth))
}

/// Runs after `auth`: only a caller with the node credential can move the
/// fence. A call without an epoch (a control plane in the same process as
/// its node, or one that leads alone) is let through.
async fn fenced(State(fence): State<Fence>, mut req: Request, next: Next) -> Response {
    let Some(given) = req.headers().get(LEADER_EPOCH) else {
        return next.run(req).await;
    };
    let Some(given) = given.to_str().ok().and_then(|v| v.parse::<u64>().ok()) else {
        let e = NodeError::invalid(format!("{LEADER_EPOCH} must be a number"));
        return (StatusCode::BAD_REQUEST, Json(e)).into_response();
    };
    match fence.admit(given) {
        Ok(()) => {
            req.extensions_mut().insert(Admitted { given, fence });
            next.run(req).await
        }
        Err(Refusal::Stale { current }) => {
            tracing::warn!(
                given,
                current,
                path = %req.uri().path(),
                "refused a call of a replaced control plane"
            );
            Failure(replaced(given, current)).into_response()
        }
        Err(Refusal::Unsaved(e)) => {
            tracing::error!(error = %e, "writing the leader epoch");
            let e =
                NodeError::unavailable(format!("the node could not record the leader epoch: {e}"));
            (StatusCode::SERVICE_UNAVAILABLE, Json(e)).into_response()
        }
    }
}

/// What a replaced control plane is told.
fn replaced(given: u64, current: u64) -> NodeError {
    NodeError::new(
        ErrorKind::Fenced,
        format!(
            "this node follows a newer leader (epoch {current}); this control plane \
             (epoch {given}) was replaced and must not act on it"
        ),
    )
}

/// The credential the node API takes; a node that joins a cluster learns
/// it from the control plane after its API is up, and again at a re-join.
#[derive(Clone, Default)]
pub struct Credential(Arc<Mutex<Arc<[u8]>>>);

impl Credential {
    pub fn set(&self, credential: &str) {
        *lock(&self.0) = credential.as_bytes().into();
    }
}

impl From<String> for Credential {
    fn from(s: String) -> Self {
        Credential(Arc::new(Mutex::new(s.into_bytes().into())))
    }
}

async fn auth(State(credential): State<Credential>, req: Request, next: Next) -> Response {
    use subtle::ConstantTimeEq;
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes)
        .and_then(bearer)
        .unwrap_or(b"");
    let credential = lock(&credential.0).clone();
    // An empty credential would let a request without any header in.
    if !credential.is_empty() && bool::from(given.ct_eq(&credential)) {
        return next.run(req).await;
    }
    let e = NodeError::invalid(
        "missing or wrong node credential: the node API takes the node credential \
         (Authorization: Bearer <node credential>), not a user's API token",
    );
    (StatusCode::UNAUTHORIZED, Json(e)).into_response()
}

fn bearer(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    (value.len() >= SCHEME.len() && value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME))
        .then(|| &value[SCHEME.len()..])
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

/// A JSON body, refused as a `NodeError` (axum's own rejections are plain
/// text, which the client could not rebuild).
struct JsonBody<T>(T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = Failure;

    async fn from_request(req: Request, state: &S) -> Result<Self, Failure> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            NodeError::invalid(format!(
                "request body (at most {JSON_LIMIT} bytes): {}",
                e.body_text()
            ))
        })?;
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| Failure(NodeError::invalid(format!("request body: {e}"))))
    }
}

/// A query, refused as a `NodeError`.
struct Q<T>(T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Q<T> {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Failure> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| Q(q))
            .map_err(|e| Failure(NodeError::invalid(format!("query: {}", e.body_text()))))
    }
}

/// Path parameters, refused as a `NodeError`.
struct P<T>(T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for P<T> {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Failure> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(p)| P(p))
            .map_err(|e| Failure(NodeError::invalid(format!("path: {}", e.body_text()))))
    }
}

fn done() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

/// Values as NDJSON, each written as it comes. If the client goes away the
/// body, and so the node's stream, is dropped: for an exec that kills it.
fn ndjson_response<S>(lines: S) -> Response
where
    S: Stream<Item = Result<Bytes, serde_json::Error>> + Send + 'static,
{
    let lines = lines.inspect_err(|e| tracing::error!("cannot encode a stream value: {e}"));
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
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

/// A request body as the contract's byte stream, chunk by chunk, shared
/// with the handler so it can read what the node left unread.
#[derive(Clone)]
struct Upload(Arc<Mutex<BodyDataStream>>);

impl Upload {
    fn new(body: Body) -> Upload {
        Upload(Arc::new(Mutex::new(body.into_data_stream())))
    }

    fn poll_chunk(&self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, axum::Error>>> {
        lock(&self.0).poll_next_unpin(cx)
    }

    fn stream(&self) -> ByteStream {
        let upload = self.clone();
        futures_util::stream::poll_fn(move |cx| upload.poll_chunk(cx))
            .map_err(|e| NodeError::unavailable(format!("the upload broke off: {e}")))
            .boxed()
    }

    /// Reads the rest of the body (within bounds) once the node is done:
    /// a node that refuses an upload answers before reading it, and an
    /// answer sent while the client still writes is lost with the
    /// connection that is closed under it: the client would see a broken
    /// pipe, not the node's error.
    async fn linger(self) {
        let rest = async {
            let mut read = 0u64;
            while let Some(Ok(chunk)) =
                futures_util::future::poll_fn(|cx| self.poll_chunk(cx)).await
            {
                read += chunk.len() as u64;
                if read > LINGER_BYTES {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(LINGER_TIME, rest).await;
    }
}

async fn info(State(node): Node) -> Answer<Response> {
    Ok(Json(node.info().await?).into_response())
}

async fn inventory(State(node): Node) -> Answer<Response> {
    Ok(Json(node.inventory().await?).into_response())
}

async fn status(State(node): Node, P(id): P<String>, Q(q): Q<StatusQuery>) -> Answer<Response> {
    Ok(Json(node.status(&id, q.read_usage).await?).into_response())
}

async fn events(State(node): Node, Q(q): Q<SinceQuery>) -> Answer<Response> {
    let feed = node.events(q.since).await?;
    Ok(ndjson_response(with_heartbeat(
        ndjson::encode(feed),
        EVENTS_HEARTBEAT,
    )))
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

/// A caller replaced as leader while its create ran gets `fenced`, and
/// what it made is destroyed: the new leader took stock of the node
/// before it existed, so nothing else would ever remove it. The create
/// itself finishes without its caller (see [`NodeApi::create`]); the task
/// here is for that check, which must run even when the caller is gone.
async fn create(
    State(node): Node,
    admitted: Option<axum::Extension<Admitted>>,
    JsonBody(req): JsonBody<CreateSandbox>,
) -> Answer<Response> {
    let made = tokio::spawn(async move {
        let id = req.id.clone();
        let status = node.create(req).await?;
        let Some(axum::Extension(admitted)) = admitted else {
            return Ok(status);
        };
        let Some(current) = admitted.superseded_by() else {
            return Ok(status);
        };
        tracing::warn!(sandbox = %id, given = admitted.given, current, "a create of a replaced control plane ended after the new leader took stock; destroying what it made");
        if let Err(e) = node
            .destroy(&id, warren_core::state::reason::CREATE_FAILED)
            .await
        {
            tracing::warn!(sandbox = %id, error = %e, "destroying a replaced leader's create");
        }
        Err(replaced(admitted.given, current))
    });
    let status = made
        .await
        .map_err(|e| NodeError::internal(format!("create task: {e}")))??;
    Ok(Json(status).into_response())
}

async fn start_main(State(node): Node, P(id): P<String>) -> Answer<Response> {
    node.start_main(&id).await?;
    Ok(done())
}

async fn destroy(State(node): Node, P(id): P<String>, Q(q): Q<WhyQuery>) -> Answer<Response> {
    Ok(Json(node.destroy(&id, &q.why).await?).into_response())
}

async fn set_paused(
    State(node): Node,
    P(id): P<String>,
    JsonBody(b): JsonBody<PausedBody>,
) -> Answer<Response> {
    node.set_paused(&id, b.paused).await?;
    Ok(done())
}

async fn hold(
    State(node): Node,
    P(id): P<String>,
    JsonBody(b): JsonBody<HoldBody>,
) -> Answer<Response> {
    let usage = node
        .hold(&id, Duration::from_millis(b.hold_for_ms), b.note)
        .await?;
    Ok(Json(usage).into_response())
}

async fn set_ttl(
    State(node): Node,
    P(id): P<String>,
    JsonBody(b): JsonBody<TtlBody>,
) -> Answer<Response> {
    node.set_ttl(&id, Duration::from_millis(b.ttl_ms)).await?;
    Ok(done())
}

async fn claim(
    State(node): Node,
    P(id): P<String>,
    JsonBody(spec): JsonBody<SandboxSpec>,
) -> Answer<Response> {
    Ok(Json(node.claim(&id, spec).await?).into_response())
}

async fn renew_lease(State(node): Node, P(id): P<String>) -> Answer<Response> {
    node.renew_lease(&id).await?;
    Ok(done())
}

async fn note(
    State(node): Node,
    P(id): P<String>,
    JsonBody(n): JsonBody<LogNote>,
) -> Answer<Response> {
    node.note(&id, n).await?;
    Ok(done())
}

async fn exec(
    State(node): Node,
    P(id): P<String>,
    JsonBody(req): JsonBody<ExecRequest>,
) -> Answer<Response> {
    let events = node.exec(&id, req).await?;
    Ok(ndjson_response(ndjson::encode(events)))
}

async fn write_file(
    State(node): Node,
    P(id): P<String>,
    Q(q): Q<WriteQuery>,
    body: Body,
) -> Answer<Response> {
    let xattrs = xattrs_of(q.xattrs.as_deref())?;
    let req = WriteFile {
        path: q.path,
        mode: q.mode,
        tar: q.tar,
        xattrs,
    };
    let upload = Upload::new(body);
    let result = node.write_file(&id, req, upload.stream()).await;
    upload.linger().await;
    result?;
    Ok(done())
}

/// Extended attributes as the query carries them (a JSON object).
fn xattrs_of(json: Option<&str>) -> Result<std::collections::BTreeMap<String, String>, NodeError> {
    match json {
        None => Ok(Default::default()),
        Some(json) => serde_json::from_str(json).map_err(|e| {
            NodeError::new(
                ErrorKind::Invalid,
                format!("xattrs is not a JSON object of strings: {e}"),
            )
        }),
    }
}

async fn watch(State(node): Node, P(id): P<String>, Q(q): Q<WatchQuery>) -> Answer<Response> {
    let events = node.watch(&id, &q.path, q.recursive).await?;
    Ok(ndjson_response(ndjson::encode(events)))
}

async fn read_file(State(node): Node, P(id): P<String>, Q(q): Q<PathQuery>) -> Answer<Response> {
    let read = node.read_file(&id, &q.path).await?;
    Ok(file_response(read))
}

/// A read's answer: the bytes, with what they are (and a file's length).
fn file_response(read: warren_node_api::FileRead) -> Response {
    let mut resp = byte_body("a file read", read.body).into_response();
    let headers = resp.headers_mut();
    match read.kind {
        FileKind::File { size } => {
            headers.insert(FILE_KIND, HeaderValue::from_static("file"));
            // hyper sends exactly this many bytes, or cuts the connection:
            // the client can tell a short read from a whole one.
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
        }
        FileKind::Dir => {
            headers.insert(FILE_KIND, HeaderValue::from_static("dir"));
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-tar"),
            );
        }
    }
    resp
}

async fn logs(State(node): Node, P(id): P<String>, Q(q): Q<FollowQuery>) -> Answer<Response> {
    let body = node.logs(&id, q.follow).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        byte_body("a log", body),
    )
        .into_response())
}

/// `Upgrade: tcp`: once the port is reached, `101 Switching Protocols`,
/// then the connection carries its bytes both ways until either side
/// closes.
async fn connect_port(
    State(node): Node,
    P((id, port)): P<(String, String)>,
    mut req: Request,
) -> Answer<Response> {
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| NodeError::invalid(format!("port {port:?}: a port is 1 to 65535")))?;
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
    // Reach the port first, so a failure is still an ordinary answer.
    let mut tunnel = node.connect_port(&id, port).await?;
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let mut client = TokioIo::new(upgraded);
                if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut tunnel).await {
                    tracing::debug!("tunnel to {id} port {port} ended: {e}");
                }
            }
            Err(e) => tracing::warn!("tunnel to {id} port {port}: the upgrade failed: {e}"),
        }
    });
    Ok((
        StatusCode::SWITCHING_PROTOCOLS,
        [(header::CONNECTION, "upgrade"), (header::UPGRADE, "tcp")],
    )
        .into_response())
}

async fn check_network(
    State(node): Node,
    JsonBody(spec): JsonBody<NetworkSpec>,
) -> Answer<Response> {
    node.check_network(spec).await?;
    Ok(done())
}

#[derive(serde::Deserialize)]
struct InputQuery {
    #[serde(default)]
    close: bool,
}

async fn exec_input(
    State(node): Node,
    P((id, exec_id)): P<(String, String)>,
    Q(q): Q<InputQuery>,
    body: Bytes,
) -> Answer<Response> {
    node.exec_input(&id, &exec_id, body, q.close).await?;
    Ok(done())
}

async fn exec_resize(
    State(node): Node,
    P((id, exec_id)): P<(String, String)>,
    JsonBody(size): JsonBody<warren_core::WindowSize>,
) -> Answer<Response> {
    node.exec_resize(&id, &exec_id, size).await?;
    Ok(done())
}

async fn path_op(
    State(node): Node,
    P(id): P<String>,
    JsonBody(op): JsonBody<PathOp>,
) -> Answer<Response> {
    Ok(Json(node.path_op(&id, op).await?).into_response())
}

async fn set_network(
    State(node): Node,
    P(id): P<String>,
    JsonBody(spec): JsonBody<NetworkSpec>,
) -> Answer<Response> {
    Ok(Json(node.set_network(&id, spec).await?).into_response())
}

async fn commit(
    State(node): Node,
    P(id): P<String>,
    JsonBody(req): JsonBody<CommitImage>,
) -> Answer<Response> {
    Ok(Json(node.commit(&id, req).await?).into_response())
}

async fn image_derive(State(node): Node, JsonBody(req): JsonBody<DeriveImage>) -> Answer<Response> {
    Ok(Json(node.image_derive(req).await?).into_response())
}

async fn image_step(State(node): Node, P(key): P<String>) -> Answer<Response> {
    Ok(Json(node.image_step(&key).await?).into_response())
}

async fn fork_layer(State(node): Node, P(id): P<String>) -> Answer<Response> {
    Ok(Json(node.fork_layer(&id).await?).into_response())
}

async fn release_fork_layer(State(node): Node, P(layer): P<String>) -> Answer<Response> {
    node.release_fork_layer(&layer).await?;
    Ok(done())
}

async fn image_list(State(node): Node) -> Answer<Response> {
    Ok(Json(node.image_list().await?).into_response())
}

async fn image_for_create(
    State(node): Node,
    JsonBody(b): JsonBody<ReferenceBody>,
) -> Answer<Response> {
    Ok(Json(node.image_for_create(&b.reference).await?).into_response())
}

async fn image_pull(State(node): Node, JsonBody(b): JsonBody<ReferenceBody>) -> Answer<Response> {
    let updates: BoxStream<'static, _> = node.image_pull(&b.reference).await?;
    Ok(ndjson_response(ndjson::encode(updates)))
}

async fn image_import(State(node): Node, Q(q): Q<NameQuery>, body: Body) -> Answer<Response> {
    let upload = Upload::new(body);
    let result = node.image_import(&q.name, upload.stream()).await;
    upload.linger().await;
    Ok(Json(result?).into_response())
}

async fn image_push(State(node): Node, JsonBody(b): JsonBody<PushBody>) -> Answer<Response> {
    let pushed = node.image_push(&b.reference, b.source.as_deref()).await?;
    Ok(Json(pushed).into_response())
}

async fn image_remove(State(node): Node, Q(q): Q<ReferenceQuery>) -> Answer<Response> {
    Ok(Json(node.image_remove(&q.reference).await?).into_response())
}

async fn image_gc(State(node): Node, JsonBody(b): JsonBody<GcBody>) -> Answer<Response> {
    Ok(Json(node.image_gc(b.budget).await?).into_response())
}

async fn volume_create(
    State(node): Node,
    JsonBody(req): JsonBody<warren_core::volume::VolumeRequest>,
) -> Answer<Response> {
    Ok(Json(node.volume_create(req).await?).into_response())
}

async fn volume_list(State(node): Node) -> Answer<Response> {
    Ok(Json(node.volume_list().await?).into_response())
}

fn volume_name(name: String) -> Result<warren_core::volume::VolumeName, NodeError> {
    warren_core::volume::VolumeName::try_from(name)
        .map_err(|e| NodeError::new(ErrorKind::Invalid, e.to_string()))
}

async fn volume_write(
    State(node): Node,
    P(name): P<String>,
    Q(q): Q<VolumeWriteQuery>,
    body: Body,
) -> Answer<Response> {
    let name = volume_name(name)?;
    let req = warren_node_api::VolumeWrite {
        file: WriteFile {
            path: q.path,
            mode: q.mode,
            tar: false,
            xattrs: xattrs_of(q.xattrs.as_deref())?,
        },
        owner: warren_node_api::Owner {
            uid: q.uid,
            gid: q.gid,
        },
        replace: q.replace,
    };
    let upload = Upload::new(body);
    let result = node.volume_write(&name, req, upload.stream()).await;
    upload.linger().await;
    Ok(Json(result?).into_response())
}

async fn volume_read(
    State(node): Node,
    P(name): P<String>,
    Q(q): Q<PathQuery>,
) -> Answer<Response> {
    let read = node.volume_read(&volume_name(name)?, &q.path).await?;
    Ok(file_response(read))
}

async fn volume_path_op(
    State(node): Node,
    P(name): P<String>,
    JsonBody(op): JsonBody<PathOp>,
) -> Answer<Response> {
    let name = volume_name(name)?;
    Ok(Json(node.volume_path_op(&name, op).await?).into_response())
}

async fn volume_remove(State(node): Node, P(name): P<String>) -> Answer<Response> {
    let name = warren_core::volume::VolumeName::try_from(name)
        .map_err(|e| NodeError::new(ErrorKind::Invalid, e.to_string()))?;
    Ok(Json(node.volume_remove(&name).await?).into_response())
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

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bear"), None);
    }
}
