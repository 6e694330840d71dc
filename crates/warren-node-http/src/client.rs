//! The control plane's side: [`HttpNode`] drives a remote node through the
//! same trait the in-process node implements.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use reqwest::header::{self, HeaderValue};
use reqwest::{Method, RequestBuilder, Response, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::Serialize;
use warren_core::spec::NetworkSpec;
use warren_core::volume::{VolumeInfo, VolumeName, VolumeRequest};
use warren_core::{ExecEvent, ExecRequest, SandboxSpec, Usage};
use warren_node_api::{
    ByteStream, CommitImage, CreateSandbox, DeriveImage, FileKind, FileRead, ForkLayer, GcReport,
    ImageInfo, LogNote, NodeApi, NodeError, NodeInfo, NodeResult, PathEntry, PathOp, PolicyChange,
    PullUpdate, Pushed, SandboxStatus, Sequenced, Tunnel, VolumeWrite, WatchEvent, WriteFile,
};

use crate::ndjson::Lines;
use crate::wire::*;
use warren_core::sync::lock;

/// A node that does not take the connection by then is down or unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The whole of a call that only reads or flips node state: a node that
/// takes longer is stuck, and the control plane should move on.
const QUICK: Duration = Duration::from_secs(30);

/// Finds a peer that vanished without closing (a host that lost power)
/// on connections that idle legitimately (a followed log).
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

/// The most of an error answer read: a NodeError is small, and anything
/// else is only shown in part.
const ERROR_BODY_LIMIT: usize = 64 << 10;

/// A remote node, reached over HTTP with its node credential.
#[derive(Clone)]
pub struct HttpNode {
    http: reqwest::Client,
    /// The node's API root (`…/node/v1`).
    base: Url,
    /// The URL as configured, for messages.
    shown: Arc<str>,
    auth: HeaderValue,
    /// The leader epoch of the replica that drives the node, sent on
    /// every call (see [`crate::fence`]).
    epoch: Option<HeaderValue>,
}

impl fmt::Debug for HttpNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the credential.
        f.debug_struct("HttpNode")
            .field("url", &self.shown)
            .finish_non_exhaustive()
    }
}

/// Whether a call gets the quick deadline or may take as long as it takes.
#[derive(Clone, Copy)]
enum Deadline {
    Quick,
    Open,
}

impl HttpNode {
    /// A client for the node at `base_url` (`http://host:port`, or with a
    /// path prefix the node's API is mounted under). Nothing is sent yet.
    pub fn new(base_url: &str, credential: &str) -> Result<HttpNode, NodeError> {
        Self::build(base_url, credential, None)
    }

    /// A client for a node that serves its API over TLS (`https://…`),
    /// accepting only the certificate whose SHA-256 is `pin` (the one the
    /// node joined with; see [`crate::tls`]).
    pub fn pinned(base_url: &str, credential: &str, pin: &str) -> Result<HttpNode, NodeError> {
        Self::build(base_url, credential, Some(pin))
    }

    fn build(base_url: &str, credential: &str, pin: Option<&str>) -> Result<HttpNode, NodeError> {
        let mut base = Url::parse(base_url)
            .map_err(|e| NodeError::invalid(format!("node URL {base_url:?}: {e}")))?;
        match (base.scheme(), pin) {
            ("http", None) | ("https", Some(_)) => {}
            ("https", None) => {
                return Err(NodeError::invalid(format!(
                    "node URL {base_url:?}: https needs the node's certificate pin, which the \
                     node sends when it joins"
                )))
            }
            ("http", Some(_)) => {
                return Err(NodeError::invalid(format!(
                    "node URL {base_url:?}: the node has a certificate pin but a plain http URL; \
                     it serves https"
                )))
            }
            (other, _) => {
                return Err(NodeError::invalid(format!(
                    "node URL {base_url:?}: scheme {other:?} is not http or https"
                )))
            }
        }
        if base.host().is_none() {
            return Err(NodeError::invalid(format!(
                "node URL {base_url:?} has no host"
            )));
        }
        if !base.username().is_empty() || base.password().is_some() {
            // It would be shown in messages, and the node takes only its
            // credential anyway.
            return Err(NodeError::invalid(
                "the node URL takes no user or password: pass the node credential on its own",
            ));
        }
        base.set_query(None);
        base.set_fragment(None);
        base.path_segments_mut()
            .map_err(|()| NodeError::invalid(format!("node URL {base_url:?} cannot take a path")))?
            .pop_if_empty()
            .extend(PREFIX);
        if credential.is_empty() {
            return Err(NodeError::invalid("the node credential is empty"));
        }
        let mut auth = HeaderValue::from_str(&format!("Bearer {credential}")).map_err(|_| {
            NodeError::invalid("the node credential must be visible ASCII characters")
        })?;
        auth.set_sensitive(true);
        // See Cargo.toml: a no-op when one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder();
        if let Some(pin) = pin {
            let config = crate::tls::pinned_client_config(pin)
                .map_err(|e| NodeError::invalid(e.to_string()))?;
            builder = builder.tls_backend_preconfigured(config);
        }
        let http = builder
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_keepalive(TCP_KEEPALIVE)
            .tcp_nodelay(true)
            // The control plane reaches its nodes directly: a proxy set in
            // the environment for registry pulls must not divert (or
            // buffer) node streams and tunnels.
            .no_proxy()
            .build()
            .map_err(|e| NodeError::internal(format!("HTTP client: {}", chain(&e))))?;
        Ok(HttpNode {
            http,
            base,
            shown: base_url.trim_end_matches('/').into(),
            auth,
            epoch: None,
        })
    }

    /// Sends `epoch` with every call: the node refuses the calls once it
    /// has seen a higher one (a newer leader).
    pub fn with_leader_epoch(mut self, epoch: u64) -> HttpNode {
        self.epoch = Some(HeaderValue::from(epoch));
        self
    }

    /// The node's URL, as configured.
    pub fn url(&self) -> &str {
        &self.shown
    }

    fn url_of(&self, segments: &[&str], query: &[(&str, &str)]) -> NodeResult<Url> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| {
                NodeError::internal(format!("node URL {} cannot take a path", self.shown))
            })?
            .extend(segments);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        Ok(url)
    }

    fn request(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> NodeResult<RequestBuilder> {
        let rb = self
            .http
            .request(method, self.url_of(segments, query)?)
            .header(header::AUTHORIZATION, self.auth.clone());
        Ok(match &self.epoch {
            Some(epoch) => rb.header(crate::fence::LEADER_EPOCH, epoch.clone()),
            None => rb,
        })
    }

    /// Sends a request; an answer other than success is the node's error.
    async fn send(&self, rb: RequestBuilder, deadline: Deadline) -> NodeResult<Response> {
        let rb = match deadline {
            Deadline::Quick => rb.timeout(QUICK),
            Deadline::Open => rb,
        };
        let resp = rb.send().await.map_err(|e| self.transport(&e))?;
        let status = resp.status();
        if status.is_success() || status == StatusCode::SWITCHING_PROTOCOLS {
            return Ok(resp);
        }
        Err(self.refusal(resp).await)
    }

    /// The node's error, rebuilt from the body: the status is only a guess
    /// when the body is not a `NodeError` (something else answered).
    async fn refusal(&self, resp: Response) -> NodeError {
        let status = resp.status();
        let mut body = Vec::new();
        let mut chunks = resp.bytes_stream();
        while let Some(Ok(chunk)) = chunks.next().await {
            body.extend_from_slice(&chunk);
            if body.len() >= ERROR_BODY_LIMIT {
                body.truncate(ERROR_BODY_LIMIT);
                break;
            }
        }
        if let Ok(e) = serde_json::from_slice::<NodeError>(&body) {
            return e;
        }
        let text = String::from_utf8_lossy(&body);
        let text = text.trim();
        let shown: String = text.chars().take(300).collect();
        NodeError::new(
            kind_of_status(status),
            format!("node {} answered {status}: {shown}", self.shown),
        )
    }

    fn transport(&self, e: &reqwest::Error) -> NodeError {
        if e.is_builder() {
            return NodeError::internal(format!("a request to node {}: {}", self.shown, chain(e)));
        }
        if e.is_timeout() {
            return NodeError::unavailable(format!(
                "node {} did not answer in time: {}",
                self.shown,
                chain(e)
            ));
        }
        NodeError::unavailable(format!("cannot reach node {}: {}", self.shown, chain(e)))
    }

    async fn call(&self, rb: RequestBuilder, deadline: Deadline) -> NodeResult<()> {
        self.send(rb, deadline).await.map(drop)
    }

    async fn call_json<T: DeserializeOwned>(
        &self,
        rb: RequestBuilder,
        deadline: Deadline,
    ) -> NodeResult<T> {
        let resp = self.send(rb, deadline).await?;
        let body = resp.bytes().await.map_err(|e| self.transport(&e))?;
        serde_json::from_slice(&body).map_err(|e| {
            NodeError::internal(format!(
                "node {} answered JSON this control plane cannot read (a version mismatch?): {e}",
                self.shown
            ))
        })
    }

    fn post_json<B: Serialize>(&self, segments: &[&str], body: &B) -> NodeResult<RequestBuilder> {
        Ok(self.request(Method::POST, segments, &[])?.json(body))
    }

    /// The answer's body as the contract's byte stream; a broken
    /// connection is its last item.
    fn bytes_of(&self, resp: Response) -> ByteStream {
        let shown = self.shown.clone();
        resp.bytes_stream()
            .map_err(move |e| {
                NodeError::unavailable(format!("lost node {shown} mid-stream: {}", chain(&e)))
            })
            .boxed()
    }

    /// The answer's NDJSON lines, parsed as they arrive. A line this client
    /// cannot read (a newer node's kind of value) is skipped; a broken
    /// connection goes to `lost`, which may yield one last value.
    fn values_of<T, L>(&self, body: ByteStream, lost: L) -> BoxStream<'static, T>
    where
        T: DeserializeOwned + Send + 'static,
        L: Fn(NodeError) -> Option<T> + Send + Sync + 'static,
    {
        let shown = self.shown.clone();
        Lines::new(body)
            .filter_map(move |line| {
                let value = match line {
                    Ok(line) => serde_json::from_slice::<T>(&line)
                        .map_err(|e| {
                            tracing::warn!(
                                "node {shown} sent a line this control plane cannot read, skipped: {e}"
                            )
                        })
                        .ok(),
                    Err(e) => lost(e),
                };
                futures_util::future::ready(value)
            })
            .boxed()
    }
}

/// An error with its causes: reqwest's own message leaves out the one that
/// says what happened (refused, reset, timed out).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

/// Ends a stream with an error after `idle` without an item.
fn idle_limit(body: ByteStream, idle: Duration, shown: Arc<str>) -> ByteStream {
    futures_util::stream::unfold(Some(body), move |body| {
        let shown = shown.clone();
        async move {
            let mut body = body?;
            match tokio::time::timeout(idle, body.next()).await {
                Ok(Some(item)) => Some((item, Some(body))),
                Ok(None) => None,
                Err(_) => Some((
                    Err(NodeError::unavailable(format!(
                        "node {shown} sent nothing for {}s, not even a heartbeat",
                        idle.as_secs()
                    ))),
                    None,
                )),
            }
        }
    })
    .boxed()
}

fn uploaded(body: ByteStream, failed: &Arc<Mutex<Option<NodeError>>>) -> reqwest::Body {
    let failed = failed.clone();
    reqwest::Body::wrap_stream(body.inspect_err(move |e| {
        let mut slot = lock(&failed);
        slot.get_or_insert_with(|| e.clone());
    }))
}

/// The upload's own failure when it broke the request: the caller's stream
/// failed, which says more than the connection that broke because of it.
fn upload_failure<T>(
    result: NodeResult<T>,
    failed: &Arc<Mutex<Option<NodeError>>>,
) -> NodeResult<T> {
    match result {
        Err(e) => Err({
            let mut f = lock(failed);
            f.take()
        }
        .unwrap_or(e)),
        ok => ok,
    }
}

fn file_kind(resp: &Response, shown: &str) -> NodeResult<FileKind> {
    let kind = resp.headers().get(FILE_KIND).and_then(|v| v.to_str().ok());
    match kind {
        Some("file") => {
            let size = resp
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| {
                    NodeError::internal(format!("node {shown} sent a file without its length"))
                })?;
            Ok(FileKind::File { size })
        }
        Some("dir") => Ok(FileKind::Dir),
        other => Err(NodeError::internal(format!(
            "node {shown} answered a read with {FILE_KIND} {other:?}, not file or dir"
        ))),
    }
}

#[async_trait::async_trait]
impl NodeApi for HttpNode {
    async fn info(&self) -> NodeResult<NodeInfo> {
        self.call_json(self.request(Method::GET, &["info"], &[])?, Deadline::Quick)
            .await
    }

    async fn inventory(&self) -> NodeResult<Vec<SandboxStatus>> {
        // A node just started answers once it has taken its sandboxes over:
        // no deadline.
        self.call_json(
            self.request(Method::GET, &["sandboxes"], &[])?,
            Deadline::Open,
        )
        .await
    }

    async fn status(&self, id: &str, read_usage: bool) -> NodeResult<SandboxStatus> {
        let read_usage = if read_usage { "true" } else { "false" };
        self.call_json(
            self.request(
                Method::GET,
                &["sandboxes", id],
                &[("read_usage", read_usage)],
            )?,
            Deadline::Quick,
        )
        .await
    }

    async fn events(&self, since: u64) -> NodeResult<BoxStream<'static, Sequenced>> {
        let since = since.to_string();
        let rb = self.request(Method::GET, &["events"], &[("since", &since)])?;
        let resp = self.send(rb, Deadline::Open).await?;
        let body = idle_limit(self.bytes_of(resp), EVENTS_IDLE, self.shown.clone());
        // The feed ends with its connection; the consumer resumes from
        // the last seq it handled.
        Ok(self.values_of(body, |e| {
            tracing::info!("node event feed ended: {e}");
            None
        }))
    }

    async fn create(&self, req: CreateSandbox) -> NodeResult<SandboxStatus> {
        self.call_json(self.post_json(&["sandboxes"], &req)?, Deadline::Open)
            .await
    }

    async fn start_main(&self, id: &str) -> NodeResult<()> {
        let rb = self.request(Method::POST, &["sandboxes", id, "main"], &[])?;
        self.call(rb, Deadline::Quick).await
    }

    async fn destroy(&self, id: &str, why: &str) -> NodeResult<Option<Usage>> {
        let rb = self.request(Method::DELETE, &["sandboxes", id], &[("why", why)])?;
        self.call_json(rb, Deadline::Open).await
    }

    async fn set_paused(&self, id: &str, paused: bool) -> NodeResult<()> {
        let rb = self.post_json(&["sandboxes", id, "paused"], &PausedBody { paused })?;
        self.call(rb, Deadline::Quick).await
    }

    async fn hold(&self, id: &str, hold_for: Duration, note: LogNote) -> NodeResult<Option<Usage>> {
        let body = HoldBody {
            hold_for_ms: millis(hold_for),
            note,
        };
        let rb = self.post_json(&["sandboxes", id, "hold"], &body)?;
        self.call_json(rb, Deadline::Open).await
    }

    async fn set_ttl(&self, id: &str, ttl: Duration) -> NodeResult<()> {
        let rb = self.post_json(
            &["sandboxes", id, "ttl"],
            &TtlBody {
                ttl_ms: millis(ttl),
            },
        )?;
        self.call(rb, Deadline::Quick).await
    }

    async fn claim(&self, id: &str, spec: SandboxSpec) -> NodeResult<SandboxStatus> {
        let rb = self.post_json(&["sandboxes", id, "claim"], &spec)?;
        self.call_json(rb, Deadline::Quick).await
    }

    async fn renew_lease(&self, id: &str) -> NodeResult<()> {
        let rb = self.request(Method::POST, &["sandboxes", id, "lease"], &[])?;
        self.call(rb, Deadline::Quick).await
    }

    async fn note(&self, id: &str, note: LogNote) -> NodeResult<()> {
        let rb = self.post_json(&["sandboxes", id, "note"], &note)?;
        self.call(rb, Deadline::Quick).await
    }

    async fn exec(&self, id: &str, req: ExecRequest) -> NodeResult<BoxStream<'static, ExecEvent>> {
        let rb = self.post_json(&["sandboxes", id, "exec"], &req)?;
        let resp = self.send(rb, Deadline::Open).await?;
        // Dropping the stream drops the connection, which the node takes
        // as a kill.
        Ok(self.values_of(self.bytes_of(resp), |e| {
            Some(ExecEvent::Error {
                message: format!("the command's output stopped: {}", e.message),
            })
        }))
    }

    async fn write_file(&self, id: &str, req: WriteFile, body: ByteStream) -> NodeResult<()> {
        let mode = req.mode.to_string();
        let tar = req.tar.to_string();
        let xattrs = serde_json::to_string(&req.xattrs)
            .map_err(|e| NodeError::internal(format!("encoding xattrs: {e}")))?;
        let mut query = vec![("path", req.path.as_str()), ("mode", &mode), ("tar", &tar)];
        if !req.xattrs.is_empty() {
            query.push(("xattrs", &xattrs));
        }
        let failed = Arc::new(Mutex::new(None));
        let rb = self
            .request(Method::PUT, &["sandboxes", id, "files"], &query)?
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(uploaded(body, &failed));
        let result = self.call(rb, Deadline::Open).await;
        upload_failure(result, &failed)
    }

    async fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> NodeResult<BoxStream<'static, WatchEvent>> {
        let recursive = recursive.to_string();
        let query = [("path", path), ("recursive", recursive.as_str())];
        let rb = self.request(Method::GET, &["sandboxes", id, "watch"], &query)?;
        let resp = self.send(rb, Deadline::Open).await?;
        // Dropping the stream drops the connection, which ends the watch.
        Ok(self.values_of(self.bytes_of(resp), |error| {
            Some(WatchEvent::Error { error })
        }))
    }

    async fn read_file(&self, id: &str, path: &str) -> NodeResult<FileRead> {
        let rb = self.request(Method::GET, &["sandboxes", id, "files"], &[("path", path)])?;
        let resp = self.send(rb, Deadline::Open).await?;
        let kind = file_kind(&resp, &self.shown)?;
        Ok(FileRead {
            kind,
            body: self.bytes_of(resp),
        })
    }

    async fn exec_input(
        &self,
        id: &str,
        exec_id: &str,
        data: bytes::Bytes,
        close: bool,
    ) -> NodeResult<()> {
        let close = close.to_string();
        let rb = self
            .request(
                Method::POST,
                &["sandboxes", id, "execs", exec_id, "stdin"],
                &[("close", &close)],
            )?
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(data);
        self.call(rb, Deadline::Quick).await
    }

    async fn exec_resize(
        &self,
        id: &str,
        exec_id: &str,
        size: warren_core::WindowSize,
    ) -> NodeResult<()> {
        let rb = self.post_json(&["sandboxes", id, "execs", exec_id, "resize"], &size)?;
        self.call(rb, Deadline::Quick).await
    }

    async fn path_op(&self, id: &str, op: PathOp) -> NodeResult<Vec<PathEntry>> {
        let rb = self.post_json(&["sandboxes", id, "paths"], &op)?;
        self.call_json(rb, Deadline::Quick).await
    }

    async fn logs(&self, id: &str, follow: bool) -> NodeResult<ByteStream> {
        let follow = follow.to_string();
        let rb = self.request(
            Method::GET,
            &["sandboxes", id, "logs"],
            &[("follow", &follow)],
        )?;
        let resp = self.send(rb, Deadline::Open).await?;
        Ok(self.bytes_of(resp))
    }

    async fn connect_port(&self, id: &str, port: u16) -> NodeResult<Box<dyn Tunnel>> {
        let port_text = port.to_string();
        let rb = self
            .request(Method::POST, &["sandboxes", id, "ports", &port_text], &[])?
            .header(header::CONNECTION, "upgrade")
            .header(header::UPGRADE, "tcp");
        // Not reqwest's own timeout: only opening the tunnel is bounded,
        // not the life of the connection it becomes.
        let open = async {
            let resp = self.send(rb, Deadline::Open).await?;
            if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
                return Err(NodeError::internal(format!(
                    "node {} answered a port connection with {}, not 101 Switching Protocols",
                    self.shown,
                    resp.status()
                )));
            }
            resp.upgrade().await.map_err(|e| {
                NodeError::unavailable(format!(
                    "node {}: the tunnel to port {port} did not open: {}",
                    self.shown,
                    chain(&e)
                ))
            })
        };
        let upgraded = tokio::time::timeout(QUICK, open).await.map_err(|_| {
            NodeError::unavailable(format!(
                "node {} did not open a tunnel to port {port} within {}s",
                self.shown,
                QUICK.as_secs()
            ))
        })??;
        Ok(Box::new(upgraded))
    }

    async fn check_network(&self, network: NetworkSpec) -> NodeResult<()> {
        let rb = self.post_json(&["network", "check"], &network)?;
        self.call(rb, Deadline::Quick).await
    }

    async fn set_network(&self, id: &str, network: NetworkSpec) -> NodeResult<PolicyChange> {
        let rb = self
            .request(Method::PUT, &["sandboxes", id, "network"], &[])?
            .json(&network);
        self.call_json(rb, Deadline::Quick).await
    }

    async fn commit(&self, id: &str, req: CommitImage) -> NodeResult<ImageInfo> {
        self.call_json(
            self.post_json(&["sandboxes", id, "commit"], &req)?,
            Deadline::Open,
        )
        .await
    }

    async fn fork_layer(&self, id: &str) -> NodeResult<ForkLayer> {
        let rb = self.request(Method::POST, &["sandboxes", id, "fork-layer"], &[])?;
        self.call_json(rb, Deadline::Open).await
    }

    async fn release_fork_layer(&self, layer: &str) -> NodeResult<()> {
        let rb = self.request(Method::DELETE, &["fork-layers", layer], &[])?;
        self.call(rb, Deadline::Open).await
    }

    async fn image_list(&self) -> NodeResult<Vec<ImageInfo>> {
        self.call_json(self.request(Method::GET, &["images"], &[])?, Deadline::Open)
            .await
    }

    async fn image_for_create(&self, reference: &str) -> NodeResult<ImageInfo> {
        let body = ReferenceBody {
            reference: reference.into(),
        };
        self.call_json(
            self.post_json(&["images", "for-create"], &body)?,
            Deadline::Open,
        )
        .await
    }

    async fn image_pull(&self, reference: &str) -> NodeResult<BoxStream<'static, PullUpdate>> {
        let body = ReferenceBody {
            reference: reference.into(),
        };
        let resp = self
            .send(self.post_json(&["images", "pull"], &body)?, Deadline::Open)
            .await?;
        // The pull itself runs on at the node; only its progress is lost.
        Ok(self.values_of(self.bytes_of(resp), |error| {
            Some(PullUpdate::Error { error })
        }))
    }

    async fn image_import(&self, name: &str, archive: ByteStream) -> NodeResult<ImageInfo> {
        let failed = Arc::new(Mutex::new(None));
        let rb = self
            .request(Method::POST, &["images", "import"], &[("name", name)])?
            .header(header::CONTENT_TYPE, "application/x-tar")
            .body(uploaded(archive, &failed));
        let result = self.call_json(rb, Deadline::Open).await;
        upload_failure(result, &failed)
    }

    async fn image_push(&self, reference: &str, source: Option<&str>) -> NodeResult<Pushed> {
        let body = PushBody {
            reference: reference.into(),
            source: source.map(str::to_string),
        };
        self.call_json(self.post_json(&["images", "push"], &body)?, Deadline::Open)
            .await
    }

    async fn image_derive(&self, req: DeriveImage) -> NodeResult<ImageInfo> {
        self.call_json(self.post_json(&["images", "derive"], &req)?, Deadline::Open)
            .await
    }

    async fn image_step(&self, key: &str) -> NodeResult<Option<ImageInfo>> {
        let rb = self.request(Method::GET, &["images", "steps", key], &[])?;
        self.call_json(rb, Deadline::Quick).await
    }

    async fn image_remove(&self, reference: &str) -> NodeResult<ImageInfo> {
        let rb = self.request(Method::DELETE, &["images"], &[("reference", reference)])?;
        self.call_json(rb, Deadline::Open).await
    }

    async fn volume_create(&self, req: VolumeRequest) -> NodeResult<VolumeInfo> {
        self.call_json(self.post_json(&["volumes"], &req)?, Deadline::Open)
            .await
    }

    async fn volume_list(&self) -> NodeResult<Vec<VolumeInfo>> {
        let rb = self.request(Method::GET, &["volumes"], &[])?;
        self.call_json(rb, Deadline::Quick).await
    }

    async fn volume_remove(&self, name: &VolumeName) -> NodeResult<VolumeInfo> {
        let rb = self.request(Method::DELETE, &["volumes", name.as_str()], &[])?;
        self.call_json(rb, Deadline::Open).await
    }

    async fn volume_write(
        &self,
        volume: &VolumeName,
        req: VolumeWrite,
        body: ByteStream,
    ) -> NodeResult<PathEntry> {
        let (mode, uid, gid) = (
            req.file.mode.to_string(),
            req.owner.uid.to_string(),
            req.owner.gid.to_string(),
        );
        let replace = req.replace.to_string();
        let xattrs = serde_json::to_string(&req.file.xattrs)
            .map_err(|e| NodeError::internal(format!("encoding xattrs: {e}")))?;
        let mut query = vec![
            ("path", req.file.path.as_str()),
            ("mode", &mode),
            ("uid", &uid),
            ("gid", &gid),
            ("replace", &replace),
        ];
        if !req.file.xattrs.is_empty() {
            query.push(("xattrs", &xattrs));
        }
        if req.file.tar {
            return Err(NodeError::invalid(
                "a volume takes files one by one, not tar archives",
            ));
        }
        let failed = Arc::new(Mutex::new(None));
        let rb = self
            .request(Method::PUT, &["volumes", volume.as_str(), "files"], &query)?
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(uploaded(body, &failed));
        let result = self.call_json(rb, Deadline::Open).await;
        upload_failure(result, &failed)
    }

    async fn volume_read(&self, volume: &VolumeName, path: &str) -> NodeResult<FileRead> {
        let rb = self.request(
            Method::GET,
            &["volumes", volume.as_str(), "files"],
            &[("path", path)],
        )?;
        let resp = self.send(rb, Deadline::Open).await?;
        let kind = file_kind(&resp, &self.shown)?;
        Ok(FileRead {
            kind,
            body: self.bytes_of(resp),
        })
    }

    async fn volume_path_op(&self, volume: &VolumeName, op: PathOp) -> NodeResult<Vec<PathEntry>> {
        let rb = self.post_json(&["volumes", volume.as_str(), "paths"], &op)?;
        self.call_json(rb, Deadline::Quick).await
    }

    async fn image_gc(&self, budget: Option<u64>) -> NodeResult<GcReport> {
        self.call_json(
            self.post_json(&["images", "gc"], &GcBody { budget })?,
            Deadline::Open,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_silent_stream_ends_with_an_error() {
        let silent: ByteStream = futures_util::stream::pending().boxed();
        let items: Vec<_> = idle_limit(silent, Duration::from_millis(20), "http://n".into())
            .collect()
            .await;
        assert_eq!(items.len(), 1);
        let e = items[0].as_ref().unwrap_err();
        assert_eq!(e.kind, warren_node_api::ErrorKind::Unavailable);
        assert!(e.message.contains("http://n"), "{}", e.message);
    }

    #[test]
    fn chain_names_every_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        assert_eq!(chain(&e), "outer: refused");
    }
}
