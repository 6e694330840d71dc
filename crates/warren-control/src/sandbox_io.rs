//! What a client does with a sandbox beyond its lifecycle: files, logs,
//! ports, its TTL, commits. The control plane checks the sandbox's state
//! and renews its lease, then hands the call to the node.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use hyper_util::rt::TokioIo;
use tracing::Instrument;
use warren_core::files::{PathEntry, PathOp, WriteFile};
use warren_core::tenant::Principal;
use warren_core::{ApiError, ExecEvent, ExecRequest, SandboxState, Selector};
use warren_node_api::{NodeApi, Tunnel};

use std::sync::Arc;

use crate::lifecycle::Lifecycle;
use crate::node_errors::node_error;
use crate::nodes::Nodes;
use crate::records::Records;
use crate::store::Store;

use crate::streams::{file_read, to_node, ByteStream, FileRead, WatchEvent};

/// The span of a file read or write of `path`.
fn file_span(name: &'static str, path: &str) -> tracing::Span {
    // `name` is a literal at each call: tracing needs a span's name at
    // compile time, so it is given as OpenTelemetry's `otel.name`.
    tracing::info_span!("file", otel.name = name, warren.file.path = path)
}

/// States in which a sandbox has files: live, or held after it finished.
fn has_files(state: SandboxState) -> bool {
    matches!(
        state,
        SandboxState::Running | SandboxState::Paused | SandboxState::Kept | SandboxState::Stopping
    )
}

/// The sandbox I/O service: exec, files, logs and ports, each a check of
/// the sandbox's record and a call to its node. It changes no record.
#[derive(Clone)]
pub struct SandboxIo {
    records: Arc<Records>,
    nodes: Arc<Nodes>,
    store: Arc<dyn Store>,
    lifecycle: Arc<Lifecycle>,
}

impl SandboxIo {
    pub(crate) fn new(
        records: Arc<Records>,
        nodes: Arc<Nodes>,
        store: Arc<dyn Store>,
        lifecycle: Arc<Lifecycle>,
    ) -> Self {
        SandboxIo {
            records,
            nodes,
            store,
            lifecycle,
        }
    }

    /// Renews a sandbox's lease (any call on a sandbox does).
    pub async fn touch(&self, id: &str) {
        let Ok(row) = self.records.row(id).await else {
            return;
        };
        let Some(node) = self.nodes.reachable(&row.node) else {
            return;
        };
        if let Err(e) = node.renew_lease(id).await {
            tracing::debug!(sandbox = %id, error = %e, "renewing a lease");
        }
    }

    /// Runs a command in the sandbox: its events as they happen, in a span
    /// that lasts until the stream ends or is dropped and records the
    /// command's exit code.
    pub async fn exec(
        &self,
        id: &str,
        req: &ExecRequest,
    ) -> Result<BoxStream<'static, ExecEvent>, ApiError> {
        let span = tracing::info_span!(
            "sandbox exec",
            warren.exec.exit_code = tracing::field::Empty,
            warren.exec.signal = tracing::field::Empty,
            warren.exec.timed_out = tracing::field::Empty,
        );
        let events = self.exec_traced(id, req).instrument(span.clone()).await;
        crate::traces::outcome(&span, &events);
        Ok(crate::traces::exec_events(span, events?))
    }

    async fn exec_traced(
        &self,
        id: &str,
        req: &ExecRequest,
    ) -> Result<BoxStream<'static, ExecEvent>, ApiError> {
        let runnable = async {
            req.validate()
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            let row = self.records.row(id).await?;
            crate::traces::sandbox(&tracing::Span::current(), &row);
            // A kept sandbox's scene is there to be looked at: the node
            // thaws it while an exec runs.
            if !matches!(row.state, SandboxState::Running | SandboxState::Kept) {
                return Err(ApiError::conflict(format!(
                    "sandbox {id} is {}; exec needs a running or kept sandbox",
                    row.state
                )));
            }
            self.nodes.api(&row.node)
        };
        let node = match runnable.await {
            Ok(node) => node,
            Err(e) => {
                // Any call on a sandbox renews its lease; the node renews it
                // itself on an exec it runs (no extra call on this path).
                self.touch(id).await;
                return Err(e);
            }
        };
        node.exec(id, req.clone()).await.map_err(node_error)
    }

    /// More stdin for a running exec started with `stdin_open`.
    pub async fn exec_input(
        &self,
        id: &str,
        exec_id: &str,
        data: axum::body::Bytes,
        close: bool,
    ) -> Result<(), ApiError> {
        let row = self.records.row(id).await?;
        self.nodes
            .api(&row.node)?
            .exec_input(id, exec_id, data, close)
            .await
            .map_err(node_error)
    }

    /// Sets the window size of a running exec's terminal.
    pub async fn exec_resize(
        &self,
        id: &str,
        exec_id: &str,
        size: warren_core::WindowSize,
    ) -> Result<(), ApiError> {
        self.exec_handle(id, exec_id).await?.resize(size).await
    }

    /// A running exec's input and terminal, for a session that sends many
    /// (a WebSocket): the sandbox's node is looked up once, not per
    /// keystroke.
    pub async fn exec_handle(&self, id: &str, exec_id: &str) -> Result<ExecHandle, ApiError> {
        let row = self.records.row(id).await?;
        Ok(ExecHandle {
            node: self.nodes.api(&row.node)?,
            id: id.to_string(),
            exec_id: exec_id.to_string(),
        })
    }

    /// The sandbox exists and has files now (the node renews its lease on
    /// the file call; a refused one renews it here).
    async fn file_access(
        &self,
        id: &str,
    ) -> Result<std::sync::Arc<dyn warren_node_api::NodeApi>, ApiError> {
        let row = self.records.row(id).await?;
        // The span of the file call this is for (see `file_span`).
        crate::traces::sandbox(&tracing::Span::current(), &row);
        if !has_files(row.state) {
            self.touch(id).await;
            return Err(ApiError::conflict(format!(
                "sandbox {id} is {}; files need a running or kept sandbox",
                row.state
            )));
        }
        self.nodes.api(&row.node)
    }

    pub async fn write_file(
        &self,
        id: &str,
        req: WriteFile,
        body: ByteStream,
    ) -> Result<(), ApiError> {
        let span = file_span("sandbox file write", &req.path);
        let written = async {
            self.file_access(id)
                .await?
                .write_file(id, req, to_node(body))
                .await
                .map_err(node_error)
        }
        .instrument(span.clone())
        .await;
        crate::traces::outcome(&span, &written);
        written
    }

    /// A file's bytes (or a directory's archive). Its span ends when the
    /// read begins: the bytes stream on as the client takes them.
    pub async fn read_file(&self, id: &str, path: &str) -> Result<FileRead, ApiError> {
        let span = file_span("sandbox file read", path);
        let read = async {
            self.file_access(id)
                .await?
                .read_file(id, path)
                .await
                .map(file_read)
                .map_err(node_error)
        }
        .instrument(span.clone())
        .await;
        crate::traces::outcome(&span, &read);
        read
    }

    /// Looks at or changes paths in the sandbox (stat, list, make a
    /// directory, rename, remove).
    pub async fn path_op(&self, id: &str, op: PathOp) -> Result<Vec<PathEntry>, ApiError> {
        self.file_access(id)
            .await?
            .path_op(id, op)
            .await
            .map_err(node_error)
    }

    /// The events of directory `path` in the sandbox (with `recursive`,
    /// of its subdirectories too) as they happen, until the stream is
    /// dropped, the directory goes, or the control plane stops.
    pub async fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<BoxStream<'static, WatchEvent>, ApiError> {
        let events = self
            .file_access(id)
            .await?
            .watch(id, path, recursive)
            .await
            .map_err(node_error)?;
        Ok(events
            .map(|e| match e {
                warren_node_api::WatchEvent::Event { name, kind } => {
                    WatchEvent::Event { name, kind }
                }
                warren_node_api::WatchEvent::Error { error } => WatchEvent::Error {
                    error: node_error(error),
                },
            })
            .take_until(self.lifecycle.stopped())
            .boxed())
    }

    /// The sandbox's log; with `follow`, until it has ended (or is held).
    pub async fn logs(&self, id: &str, follow: bool) -> Result<ByteStream, ApiError> {
        let row = self.records.row(id).await?;
        let lines = self.log_lines(id, &row.node, follow, 0).await?;
        Ok(lines.take_until(self.lifecycle.stopped()).boxed())
    }

    /// The usage samples kept of the sandbox, oldest first (one JSON line
    /// each), whether or not it or its node still exists.
    pub async fn usage_history(&self, id: &str) -> Result<ByteStream, ApiError> {
        self.records.row(id).await?;
        crate::log_shipping::usage_lines(self.store.as_ref(), id).await
    }

    /// The sandbox's log: the copy its node shipped (see `log_shipping`),
    /// then what its node wrote after it (with `follow`, until the sandbox
    /// is over). A sandbox with nothing kept (its node does not ship) is
    /// read from its node alone. With `since_ms`, only the lines written
    /// then or later.
    async fn log_lines(
        &self,
        id: &str,
        node: &str,
        follow: bool,
        since_ms: i64,
    ) -> Result<ByteStream, ApiError> {
        use crate::log_shipping::{has_kept, kept_then, newer_lines, Newer};
        if !has_kept(self.store.as_ref(), id).await? {
            let lines = self
                .nodes
                .api(node)?
                .logs(id, follow)
                .await
                .map_err(node_error)?;
            return Ok(newer_lines(
                crate::streams::from_node(lines),
                None,
                since_ms,
            ));
        }
        let live = self.nodes.reachable(node);
        let owned = id.to_string();
        let newer: Newer = Box::new(move |last| {
            Box::pin(async move {
                let Some(api) = live else {
                    return futures_util::stream::empty().boxed();
                };
                match api.logs(&owned, follow).await {
                    Ok(lines) => newer_lines(crate::streams::from_node(lines), last, since_ms),
                    // Its log is gone from the node: the kept copy is all.
                    Err(_) => futures_util::stream::empty().boxed(),
                }
            })
        });
        Ok(kept_then(
            self.store.clone(),
            id.to_string(),
            since_ms,
            newer,
        ))
    }

    /// The logs of every sandbox matching `selector`, one after another in
    /// creation order, streamed line by line; with `since_ms`, only lines
    /// written then or later.
    pub async fn logs_by_label(
        &self,
        who: &Principal,
        selector: &Selector,
        since_ms: i64,
    ) -> Result<ByteStream, ApiError> {
        let members: Vec<_> = self
            .records
            .list(who, &[], selector)
            .await?
            .into_iter()
            .map(|s| (s.node, s.id))
            .collect();
        let this = self.clone();
        Ok(futures_util::stream::iter(members)
            .then(move |(node, id)| {
                let this = this.clone();
                async move {
                    // A sandbox with no log kept or left on its node has no
                    // lines to give.
                    this.log_lines(&id, &node, false, since_ms)
                        .await
                        .unwrap_or_else(|_| futures_util::stream::empty().boxed())
                }
            })
            .flatten()
            .take_until(self.lifecycle.stopped())
            .boxed())
    }

    /// A connection to `port` on the sandbox's loopback.
    pub async fn connect_port(&self, id: &str, port: u16) -> Result<Box<dyn Tunnel>, ApiError> {
        let row = self.records.row(id).await?;
        self.nodes
            .api(&row.node)?
            .connect_port(id, port)
            .await
            .map_err(node_error)
    }

    /// Forwards one HTTP request to `port` on the sandbox's loopback over
    /// HTTP/1.1 and answers what the server there answers, the bodies
    /// streamed both ways: what every front door's port routing does.
    /// `host`: the Host the sandbox's server sees (default `localhost`,
    /// what a server reached on its own loopback expects).
    pub async fn forward_http(
        &self,
        id: &str,
        port: u16,
        req: Request,
        host: Option<HeaderValue>,
    ) -> Result<Response, ApiError> {
        let upstream = self.connect_port(id, port).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(upstream))
                .await
                .map_err(|e| {
                    ApiError::conflict(format!(
                        "port {port} in sandbox {id} does not speak HTTP: {e}"
                    ))
                })?;
        tokio::spawn(conn);
        let (mut parts, body) = req.into_parts();
        parts.headers.insert(
            header::HOST,
            host.unwrap_or_else(|| HeaderValue::from_static("localhost")),
        );
        let resp = sender
            .send_request(axum::http::Request::from_parts(parts, body))
            .await
            .map_err(|e| ApiError::conflict(format!("port {port} in sandbox {id}: {e}")))?;
        let (parts, body) = resp.into_parts();
        Ok(Response::from_parts(parts, Body::new(body)))
    }
}

/// See [`SandboxIo::exec_handle`].
pub struct ExecHandle {
    node: Arc<dyn NodeApi>,
    id: String,
    exec_id: String,
}

impl ExecHandle {
    /// More stdin; `close` ends it after `data`.
    pub async fn input(&self, data: axum::body::Bytes, close: bool) -> Result<(), ApiError> {
        self.node
            .exec_input(&self.id, &self.exec_id, data, close)
            .await
            .map_err(node_error)
    }

    /// Sets the terminal's window size.
    pub async fn resize(&self, size: warren_core::WindowSize) -> Result<(), ApiError> {
        size.validate()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        self.node
            .exec_resize(&self.id, &self.exec_id, size)
            .await
            .map_err(node_error)
    }
}
