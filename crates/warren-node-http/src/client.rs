//! The control plane's side: [`HttpNode`] drives a remote node through the
//! same trait the in-process node implements.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use reqwest::header::{self, HeaderValue};
use reqwest::{RequestBuilder, Response, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::Serialize;
use warren_node_api::calls::prelude::*;
use warren_node_api::{NodeApi, NodeError, NodeResult};

use crate::ndjson::Lines;
use crate::node_url::NodeUrl;
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
    /// The node's API root (`…/node/v2`).
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
        let url: NodeUrl = base_url.parse()?;
        let bad = |why: &str| NodeError::invalid(format!("node URL {base_url:?}: {why}"));
        match (url.is_tls(), pin) {
            (false, None) | (true, Some(_)) => {}
            (true, None) => {
                return Err(bad(
                    "https needs the node's certificate pin, which the node sends when it joins",
                ))
            }
            (false, Some(_)) => {
                return Err(bad(
                    "the node has a certificate pin but a plain http URL; it serves https",
                ))
            }
        }
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
            base: url.api,
            shown: url.shown,
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

    /// `POST {prefix}/{call}`, its arguments as the JSON body, or, where
    /// the body (or the connection) is something else, as JSON in the
    /// `args` query parameter.
    fn post<A: Serialize>(
        &self,
        call: &str,
        args: &A,
        in_query: bool,
    ) -> NodeResult<RequestBuilder> {
        let mut url = self.base.clone();
        url.set_path(&format!("{}/{call}", self.base.path()));
        if in_query {
            let json = serde_json::to_string(args).map_err(|e| {
                NodeError::internal(format!("encoding the arguments of {call}: {e}"))
            })?;
            url.query_pairs_mut().append_pair(ARGS, &json);
        }
        let rb = self.http.post(url);
        let rb = rb.header(header::AUTHORIZATION, self.auth.clone());
        let rb = match &self.epoch {
            Some(epoch) => rb.header(crate::fence::LEADER_EPOCH, epoch.clone()),
            None => rb,
        };
        let rb = crate::trace_context::inject(rb);
        Ok(if in_query { rb } else { rb.json(args) })
    }

    /// A call whose arguments are its body, sent.
    async fn call<A: Serialize>(
        &self,
        call: &str,
        deadline: Deadline,
        args: &A,
    ) -> NodeResult<Response> {
        self.send(self.post(call, args, false)?, deadline).await
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

    async fn json_of<T: DeserializeOwned>(&self, resp: Response) -> NodeResult<T> {
        let body = resp.bytes().await.map_err(|e| self.transport(&e))?;
        serde_json::from_slice(&body).map_err(|e| {
            NodeError::internal(format!(
                "node {} answered JSON this control plane cannot read (a version mismatch?): {e}",
                self.shown
            ))
        })
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
    /// connection (or, for a feed with heartbeats, a silent one) goes to
    /// `T::lost`, which may yield one last value. Dropping the stream drops
    /// the connection, which ends the call at the node.
    fn feed_of<T: Feed>(&self, resp: Response) -> BoxStream<'static, T> {
        let body = match T::HEARTBEAT {
            Some((_, idle)) => idle_limit(self.bytes_of(resp), idle, self.shown.clone()),
            None => self.bytes_of(resp),
        };
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
                    Err(e) => T::lost(e),
                };
                futures_util::future::ready(value)
            })
            .boxed()
    }

    /// A file's bytes (with their length) or a directory's archive.
    fn file_of(&self, resp: Response) -> NodeResult<FileRead> {
        let get = |name| resp.headers().get(name).and_then(|v| v.to_str().ok());
        let size = get(header::CONTENT_LENGTH.as_str()).and_then(|v| v.parse::<u64>().ok());
        let shown = &self.shown;
        let kind = match (get(FILE_KIND), size) {
            (Some("file"), Some(size)) => FileKind::File { size },
            (Some("dir"), _) => FileKind::Dir,
            (Some("file"), None) => Err(NodeError::internal(format!(
                "node {shown} sent a file without its length"
            )))?,
            (other, _) => Err(NodeError::internal(format!(
                "node {shown} answered a read with {FILE_KIND} {other:?}, not file or dir"
            )))?,
        };
        Ok(FileRead {
            kind,
            body: self.bytes_of(resp),
        })
    }

    /// `body` sent as it is read; when it fails, its own error is the
    /// call's, not the broken request it caused.
    async fn upload<A: Serialize, R: DeserializeOwned>(
        &self,
        call: &str,
        deadline: Deadline,
        args: &A,
        body: ByteStream,
    ) -> NodeResult<R> {
        let failed = Arc::new(Mutex::new(None));
        let failing = failed.clone();
        let body = body.inspect_err(move |e| {
            lock(&failing).get_or_insert_with(|| e.clone());
        });
        let rb = self
            .post(call, args, true)?
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(reqwest::Body::wrap_stream(body));
        let answer = async { self.json_of(self.send(rb, deadline).await?).await };
        answer.await.map_err(|e| lock(&failed).take().unwrap_or(e))
    }

    /// An HTTP/1 upgrade (`Upgrade: tcp`) that becomes the connection.
    /// The deadline bounds only its opening (so not reqwest's own, which
    /// would bound the life of the connection too).
    async fn tunnel<A: Serialize>(
        &self,
        call: &str,
        deadline: Deadline,
        args: &A,
    ) -> NodeResult<Box<dyn Tunnel>> {
        let rb = self
            .post(call, args, true)?
            .header(header::CONNECTION, "upgrade")
            .header(header::UPGRADE, "tcp");
        let open = async {
            let resp = self.send(rb, Deadline::Open).await?;
            if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
                return Err(NodeError::internal(format!(
                    "node {} answered {call} with {}, not 101 Switching Protocols",
                    self.shown,
                    resp.status()
                )));
            }
            resp.upgrade().await.map_err(|e| {
                NodeError::unavailable(format!(
                    "node {}: the tunnel of {call} did not open: {}",
                    self.shown,
                    chain(&e)
                ))
            })
        };
        let upgraded = match deadline {
            Deadline::Open => open.await?,
            Deadline::Quick => tokio::time::timeout(QUICK, open).await.map_err(|_| {
                NodeError::unavailable(format!(
                    "node {} did not open the tunnel of {call} within {}s",
                    self.shown,
                    QUICK.as_secs()
                ))
            })??,
        };
        Ok(Box::new(upgraded))
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

/// Implements [`NodeApi`] from the call list: each method sends its
/// arguments in their wire form and reads its answer by its call's shape.
macro_rules! http_node {
    ($(
        $(#[$meta:meta])*
        $shape:ident $deadline:ident fn $name:ident(
            $($arg:ident : $ty:ty $(=> $wire:ty)?),* $(; $body:ident : $body_ty:ty)?
        ) -> $reply:ty;
    )*) => {
        #[async_trait::async_trait]
        impl NodeApi for HttpNode {
            $(
                async fn $name(&self, $($arg: $ty,)* $($body: $body_ty)?) -> NodeResult<$reply> {
                    let args = args::$name {
                        $($arg: warren_node_api::wire_own!($arg $(, $wire)?),)*
                    };
                    let (call, deadline) = (stringify!($name), Deadline::$deadline);
                    shape!($shape self, call, deadline, &args $(, $body)?)
                }
            )*
        }
    };
}

/// A call sent and its answer read by its shape: JSON, NDJSON values as
/// they arrive, raw bytes, a file (or a directory's archive), an upload's
/// answer, or a tunnel.
macro_rules! shape {
    (unary $node:ident, $($a:expr),*) => { $node.json_of($node.call($($a),*).await?).await };
    (stream $node:ident, $($a:expr),*) => { Ok($node.feed_of($node.call($($a),*).await?)) };
    (bytes $node:ident, $($a:expr),*) => { Ok($node.bytes_of($node.call($($a),*).await?)) };
    (file $node:ident, $($a:expr),*) => { $node.file_of($node.call($($a),*).await?) };
    (upload $node:ident, $($a:expr),*) => { $node.upload($($a),*).await };
    (tunnel $node:ident, $($a:expr),*) => { $node.tunnel($($a),*).await };
}

warren_node_api::node_calls!(http_node);

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
