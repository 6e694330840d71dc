//! A small typed client for the HTTP API, used by every client command and
//! by the benchmark: one method per API call, so that each path, method and
//! body is written once and the commands deal only in what they send and
//! print.
//!
//! Answers the commands print as the API sent them (`inspect`-style JSON,
//! image records) stay `serde_json::Value`: decoding them into a type and
//! encoding them again would reorder or drop fields.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use futures_util::StreamExt;
use reqwest::{header, Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;
use warren_core::profile::Profile;
use warren_core::{
    BatchInfo, BatchRequest, ErrorBody, ExecEvent, ExecRequest, SandboxInfo, SandboxSpec,
};
use warren_node_api::{PathEntry, PathOp};

/// The exec WebSocket (see [`Client::exec_ws`]).
pub type ExecSocket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
    /// Where the token came from, for the message when it is refused.
    token_source: String,
}

/// Which sandboxes [`Client::list_sandboxes`] lists.
#[derive(Default)]
pub struct SandboxQuery {
    /// Label selectors, `K=V`.
    pub labels: Vec<String>,
    pub state: Option<String>,
    /// Include destroyed, failed and lost sandboxes.
    pub all: bool,
}

impl SandboxQuery {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut q = Vec::new();
        if !self.labels.is_empty() {
            q.push(("label", self.labels.join(",")));
        }
        if let Some(s) = &self.state {
            q.push(("state", s.clone()));
        }
        if self.all {
            q.push(("all", "true".into()));
        }
        q
    }
}

/// Which events [`Client::events`] and [`Client::follow_events`] return.
#[derive(Default)]
pub struct EventQuery {
    pub sandbox: Option<String>,
    /// Label selectors, `K=V`.
    pub labels: Vec<String>,
    pub batch: Option<String>,
    /// Reason or state, e.g. `ttl_expired` or `destroyed`.
    pub kind: Option<String>,
}

impl EventQuery {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut q = Vec::new();
        if let Some(s) = &self.sandbox {
            q.push(("sandbox", s.clone()));
        }
        if !self.labels.is_empty() {
            q.push(("label", self.labels.join(",")));
        }
        if let Some(b) = &self.batch {
            q.push(("batch", b.clone()));
        }
        if let Some(k) = &self.kind {
            q.push(("type", k.clone()));
        }
        q
    }
}

/// A file or directory read out of a sandbox.
pub struct RemoteFile {
    /// The path is a directory, sent as a tar of its contents.
    pub is_tar: bool,
    pub data: bytes::Bytes,
}

impl Client {
    pub fn new(url: &str, token: Option<String>, home: &Path) -> Result<Client> {
        let (token, token_source) = match token {
            Some(t) => (
                t,
                "the token given with --token or WARREN_TOKEN".to_string(),
            ),
            None => {
                let file = home.join("token");
                let t = std::fs::read_to_string(&file)
                    .map(|t| t.trim().to_string())
                    .with_context(|| {
                        format!(
                            "no API token: cannot read {} (start `warren up`, which writes it, \
                             or give the --home of a running one, or set WARREN_TOKEN)",
                            file.display(),
                        )
                    })?;
                (t, format!("the token in {}", file.display()))
            }
        };
        let mut builder = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .pool_idle_timeout(warren_control::serve::CLIENT_IDLE_LIMIT)
            .tcp_nodelay(true);
        if !url.starts_with("https:") {
            // Loading the host's CA store (hundreds of files) took ~10 ms
            // of every CLI call; plain HTTP needs none of it.
            builder = builder.tls_certs_only([]);
        }
        let http = builder.build().context("HTTP client")?;
        Ok(Client {
            http,
            base: url.trim_end_matches('/').to_string(),
            token,
            token_source,
        })
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{}", self.base, path))
            .bearer_auth(&self.token)
    }

    /// Sends and turns an API error body into an error with its message.
    async fn send(&self, req: RequestBuilder) -> Result<Response> {
        let resp = req.send().await.map_err(|e| self.unreachable(&e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(self.failure(resp).await)
    }

    /// A request that got no answer: what to start or which flag to fix,
    /// rather than reqwest's chain of wrappers.
    fn unreachable(&self, e: &reqwest::Error) -> anyhow::Error {
        let mut cause: &dyn std::error::Error = e;
        while let Some(next) = cause.source() {
            cause = next;
        }
        anyhow!(
            "cannot reach warren up at {} ({cause}): start it with `warren up` (or \
             `systemctl start warren-up`), or point --url / WARREN_URL at the one running",
            self.base
        )
    }

    /// An error answer, as the message a CLI user acts on: the API's
    /// message without the HTTP status, except where the status is the news.
    async fn failure(&self, resp: Response) -> anyhow::Error {
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED {
            return anyhow!(
                "warren up at {} refused {}: give the --home of that daemon (its token is \
                 <home>/token), or set --token / WARREN_TOKEN to its token",
                self.base,
                self.token_source
            );
        }
        let text = resp.text().await.unwrap_or_default();
        let message = match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => body.error.message,
            Err(_) => format!(
                "warren up at {} answered {status}: {}",
                self.base,
                text.trim()
            ),
        };
        if status.is_server_error() {
            anyhow!("{message} (an internal error of warren up; its log, <home>/warren-up.log, has the details)")
        } else {
            anyhow!(message)
        }
    }

    async fn json<T: DeserializeOwned>(&self, req: RequestBuilder) -> Result<T> {
        let resp = self.send(req).await?;
        resp.json().await.context("decoding the API response")
    }

    /// `method path?query` with an optional JSON body, its JSON answer
    /// decoded.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&(impl serde::Serialize + ?Sized)>,
    ) -> Result<T> {
        let mut req = self.request(method, path).query(query);
        if let Some(body) = body {
            req = req.json(body);
        }
        self.json(req).await
    }

    /// `method path`, its answer's body dropped.
    pub async fn call_only(&self, method: Method, path: &str) -> Result<()> {
        self.send(self.request(method, path)).await.map(drop)
    }

    pub async fn nodes(&self) -> Result<Vec<Value>> {
        self.json(self.request(Method::GET, "/v1/nodes")).await
    }

    /// Cordons (or uncordons) a node.
    pub async fn cordon_node(&self, name: &str, cordoned: bool) -> Result<()> {
        let action = if cordoned { "cordon" } else { "uncordon" };
        self.send(self.request(Method::POST, &format!("/v1/nodes/{name}/{action}")))
            .await
            .map(drop)
    }

    /// Starts draining a node (cordon, then destroy what is left at the
    /// deadline).
    pub async fn drain_node(&self, name: &str, deadline: &str) -> Result<()> {
        self.send(
            self.request(Method::POST, &format!("/v1/nodes/{name}/drain"))
                .json(&serde_json::json!({ "deadline": deadline })),
        )
        .await
        .map(drop)
    }

    pub async fn remove_node(&self, name: &str) -> Result<()> {
        self.send(self.request(Method::DELETE, &format!("/v1/nodes/{name}")))
            .await
            .map(drop)
    }

    pub async fn create_sandbox(&self, spec: &SandboxSpec) -> Result<SandboxInfo> {
        self.json(self.request(Method::POST, "/v1/sandboxes").json(spec))
            .await
    }

    /// Creates without waiting for capacity: a create that must wait
    /// answers at once as `queued`, with its place in the queue.
    pub async fn create_sandbox_queued(&self, spec: &SandboxSpec) -> Result<SandboxInfo> {
        self.json(
            self.request(Method::POST, "/v1/sandboxes")
                .query(&[("wait", "false")])
                .json(spec),
        )
        .await
    }

    pub async fn get_sandbox(&self, id: &str) -> Result<SandboxInfo> {
        self.json(self.request(Method::GET, &format!("/v1/sandboxes/{id}")))
            .await
    }

    pub async fn list_sandboxes(&self, query: &SandboxQuery) -> Result<Vec<SandboxInfo>> {
        self.json(
            self.request(Method::GET, "/v1/sandboxes")
                .query(&query.pairs()),
        )
        .await
    }

    /// `GET /v1/usage`: each matching sandbox's latest usage reading.
    pub async fn usage(&self, query: &SandboxQuery) -> Result<Value> {
        self.json(self.request(Method::GET, "/v1/usage").query(&query.pairs()))
            .await
    }

    pub async fn delete_sandbox(&self, id: &str) -> Result<SandboxInfo> {
        self.json(self.request(Method::DELETE, &format!("/v1/sandboxes/{id}")))
            .await
    }

    /// Destroys every sandbox the label selectors match.
    pub async fn delete_sandboxes(&self, labels: &[String]) -> Result<Vec<SandboxInfo>> {
        self.json(
            self.request(Method::DELETE, "/v1/sandboxes")
                .query(&[("label", labels.join(","))]),
        )
        .await
    }

    pub async fn pause_sandbox(&self, id: &str) -> Result<SandboxInfo> {
        self.lifecycle(id, "pause", None).await
    }

    pub async fn resume_sandbox(&self, id: &str) -> Result<SandboxInfo> {
        self.lifecycle(id, "resume", None).await
    }

    pub async fn heartbeat(&self, id: &str) -> Result<SandboxInfo> {
        self.lifecycle(id, "heartbeat", None).await
    }

    pub async fn set_ttl(&self, id: &str, ttl: &str) -> Result<SandboxInfo> {
        self.lifecycle(id, "ttl", Some(serde_json::json!({ "ttl": ttl })))
            .await
    }

    pub async fn set_reclaim(
        &self,
        id: &str,
        reclaim: &str,
        keep_for: Option<&str>,
    ) -> Result<SandboxInfo> {
        let mut body = serde_json::json!({ "reclaim": reclaim });
        if let Some(k) = keep_for {
            body["keep_for"] = serde_json::json!(k);
        }
        self.lifecycle(id, "reclaim", Some(body)).await
    }

    async fn lifecycle(&self, id: &str, action: &str, body: Option<Value>) -> Result<SandboxInfo> {
        let mut req = self.request(Method::POST, &format!("/v1/sandboxes/{id}/{action}"));
        if let Some(b) = body {
            req = req.json(&b);
        }
        self.json(req).await
    }

    /// `POST /v1/run`: one command in a sandbox made for it and removed
    /// after it; calls `on_event` for each line and returns the exit event
    /// once the sandbox is gone.
    pub async fn run(
        &self,
        req: &warren_core::RunRequest,
        mut on_event: impl FnMut(&warren_core::RunEvent),
    ) -> Result<ExecEvent> {
        use warren_core::RunEvent;
        let resp = self
            .send(self.request(Method::POST, "/v1/run").json(req))
            .await?;
        let mut lines = LineStream::new(resp);
        let mut exit = None;
        // On to the end: its last line comes once the sandbox is removed.
        while let Some(line) = lines.next_line().await? {
            let ev: RunEvent = serde_json::from_slice(&line).context("decoding a run event")?;
            on_event(&ev);
            match ev {
                RunEvent::Exec(ev @ ExecEvent::Exit { .. }) => exit = Some(ev),
                RunEvent::Exec(ExecEvent::Error { message }) => bail!("run failed: {message}"),
                _ => {}
            }
        }
        exit.ok_or_else(|| {
            anyhow!("the run's stream ended without an exit event (daemon stopping?)")
        })
    }

    /// Starts an exec and calls `on_event` for each event; returns the exit event.
    pub async fn exec(
        &self,
        id: &str,
        req: &ExecRequest,
        mut on_event: impl FnMut(&ExecEvent),
    ) -> Result<ExecEvent> {
        let resp = self
            .send(
                self.request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                    .json(req),
            )
            .await?;
        let mut lines = LineStream::new(resp);
        while let Some(line) = lines.next_line().await? {
            let ev: ExecEvent = serde_json::from_slice(&line).context("decoding an exec event")?;
            on_event(&ev);
            match ev {
                ExecEvent::Exit { .. } => return Ok(ev),
                ExecEvent::Error { message } => bail!("exec failed: {message}"),
                _ => {}
            }
        }
        Err(anyhow!(
            "the exec stream ended without an exit event (sandbox destroyed?)"
        ))
    }

    /// Opens the exec WebSocket of a sandbox (`GET
    /// /v1/sandboxes/{id}/exec/ws`); the caller sends the request first.
    pub async fn exec_ws(&self, id: &str) -> Result<ExecSocket> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let url = match self.base.split_once("://") {
            Some(("http", rest)) => format!("ws://{rest}/v1/sandboxes/{id}/exec/ws"),
            _ => bail!(
                "`warren exec -t` speaks plain ws:// to an http:// WARREN_URL; {} is not one",
                self.base
            ),
        };
        let mut req = url
            .into_client_request()
            .with_context(|| format!("the WebSocket address of sandbox {id}"))?;
        let bearer = header::HeaderValue::from_str(&format!("Bearer {}", self.token))
            .context("the API token is not a valid header value")?;
        req.headers_mut().insert(header::AUTHORIZATION, bearer);
        // Keystrokes are single bytes: each goes out at once.
        match tokio_tungstenite::connect_async_with_config(req, None, true).await {
            Ok((socket, _)) => Ok(socket),
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                let status = resp.status();
                if status == StatusCode::UNAUTHORIZED {
                    bail!(
                        "warren up at {} refused {}: give the --home of that daemon (its token is \
                         <home>/token), or set --token / WARREN_TOKEN to its token",
                        self.base,
                        self.token_source
                    );
                }
                let body = resp.body().as_deref().unwrap_or_default();
                match serde_json::from_slice::<ErrorBody>(body) {
                    Ok(b) => bail!(b.error.message),
                    Err(_) => bail!(
                        "warren up at {} answered {status} to the exec WebSocket: {}",
                        self.base,
                        String::from_utf8_lossy(body).trim()
                    ),
                }
            }
            Err(e) => Err(anyhow!(
                "cannot open the exec WebSocket of warren up at {} ({e}): start it with `warren up`, \
                 or point --url / WARREN_URL at the one running",
                self.base
            )),
        }
    }

    /// Makes children of a sandbox from its filesystem as it is now.
    pub async fn fork_sandbox(
        &self,
        id: &str,
        req: &warren_core::spec::ForkRequest,
    ) -> Result<Vec<SandboxInfo>> {
        self.json(
            self.request(Method::POST, &format!("/v1/sandboxes/{id}/fork"))
                .json(req),
        )
        .await
    }

    /// Stores the sandbox's filesystem changes as image `name`; returns the
    /// image record.
    pub async fn commit_sandbox(&self, id: &str, name: &str) -> Result<Value> {
        self.json(
            self.request(Method::POST, &format!("/v1/sandboxes/{id}/commit"))
                .json(&serde_json::json!({ "name": name })),
        )
        .await
    }

    /// Replaces an `allowlist` sandbox's egress rules; returns the change.
    pub async fn set_network_rules(
        &self,
        id: &str,
        allow: &[String],
        deny: &[String],
    ) -> Result<Value> {
        self.json(
            self.request(Method::PATCH, &format!("/v1/sandboxes/{id}/network"))
                .json(&serde_json::json!({ "allow": allow, "deny": deny })),
        )
        .await
    }

    /// Opens a TCP tunnel to `port` inside the sandbox (`Upgrade: tcp`).
    pub async fn open_port_tunnel(&self, id: &str, port: u16) -> Result<reqwest::Upgraded> {
        // Not through `send`: success here is 101, not 2xx.
        let resp = self
            .request(Method::POST, &format!("/v1/sandboxes/{id}/ports/{port}"))
            .header(header::CONNECTION, "upgrade")
            .header(header::UPGRADE, "tcp")
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            return Err(self.failure(resp).await);
        }
        resp.upgrade().await.context("opening the tunnel")
    }

    /// Writes one file at `path` in the sandbox with permissions `mode`
    /// (octal).
    pub async fn put_file(&self, id: &str, path: &str, mode: &str, data: Vec<u8>) -> Result<()> {
        self.send(
            self.request(Method::PUT, &format!("/v1/sandboxes/{id}/files"))
                .query(&[("path", path), ("mode", mode)])
                .body(data),
        )
        .await?;
        Ok(())
    }

    /// Unpacks a tar into the directory `path` in the sandbox.
    pub async fn put_tar(&self, id: &str, path: &str, tar: Vec<u8>) -> Result<()> {
        self.send(
            self.request(Method::PUT, &format!("/v1/sandboxes/{id}/files"))
                .query(&[("path", path)])
                .header("content-type", "application/x-tar")
                .body(tar),
        )
        .await?;
        Ok(())
    }

    pub async fn get_file(&self, id: &str, path: &str) -> Result<RemoteFile> {
        let resp = self
            .send(
                self.request(Method::GET, &format!("/v1/sandboxes/{id}/files"))
                    .query(&[("path", path)]),
            )
            .await?;
        let is_tar = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            == Some("application/x-tar");
        let data = resp.bytes().await?;
        Ok(RemoteFile { is_tar, data })
    }

    /// Looks at or changes paths in the sandbox; answers the entries the
    /// operation found or made.
    pub async fn path_op(&self, id: &str, op: &PathOp) -> Result<Vec<PathEntry>> {
        self.json(
            self.request(Method::POST, &format!("/v1/sandboxes/{id}/paths"))
                .json(op),
        )
        .await
    }

    /// `GET /metrics`, the Prometheus text.
    pub async fn metrics_text(&self) -> Result<String> {
        Ok(self
            .send(self.request(Method::GET, "/metrics"))
            .await?
            .text()
            .await?)
    }

    /// The sandbox's log so far, JSON lines.
    pub async fn sandbox_log(&self, id: &str) -> Result<bytes::Bytes> {
        Ok(self
            .send(self.request(Method::GET, &format!("/v1/sandboxes/{id}/logs")))
            .await?
            .bytes()
            .await?)
    }

    /// The sandbox's log, then each new line until the sandbox ends.
    pub async fn follow_sandbox_log(&self, id: &str) -> Result<LineStream> {
        let resp = self
            .send(
                self.request(Method::GET, &format!("/v1/sandboxes/{id}/logs"))
                    .query(&[("follow", "true")]),
            )
            .await?;
        Ok(LineStream::new(resp))
    }

    /// The logs of every sandbox the label selectors match, JSON lines;
    /// with `since` (e.g. `1h`), only lines written since.
    pub async fn logs_by_label(
        &self,
        labels: &[String],
        since: Option<&str>,
    ) -> Result<bytes::Bytes> {
        let mut query = vec![("label", labels.join(","))];
        if let Some(since) = since {
            query.push(("since", since.to_string()));
        }
        Ok(self
            .send(self.request(Method::GET, "/v1/logs").query(&query))
            .await?
            .bytes()
            .await?)
    }

    /// The sandbox's usage samples kept by the control plane, JSON lines.
    pub async fn sandbox_usage_history(&self, id: &str) -> Result<bytes::Bytes> {
        Ok(self
            .send(
                self.request(Method::GET, &format!("/v1/sandboxes/{id}/logs"))
                    .query(&[("usage", "true")]),
            )
            .await?
            .bytes()
            .await?)
    }

    pub async fn events(&self, query: &EventQuery) -> Result<Vec<Value>> {
        self.json(
            self.request(Method::GET, "/v1/events")
                .query(&query.pairs()),
        )
        .await
    }

    /// The matching events so far, then each new one as it happens.
    pub async fn follow_events(&self, query: &EventQuery) -> Result<LineStream> {
        let mut q = query.pairs();
        q.push(("follow", "true".into()));
        let resp = self
            .send(self.request(Method::GET, "/v1/events").query(&q))
            .await?;
        Ok(LineStream::new(resp))
    }

    /// Streams an image archive to the store under `name`; returns the
    /// image record.
    pub async fn import_image(&self, name: &str, archive: tokio::fs::File) -> Result<Value> {
        let body = reqwest::Body::wrap_stream(file_stream(archive));
        self.json(
            self.request(Method::POST, "/v1/images/import")
                .query(&[("name", name)])
                .body(body),
        )
        .await
    }

    /// Starts a build of the context archive `context`; the stream's lines
    /// are its events (`warren_core::build::BuildEvent`).
    pub async fn build(
        &self,
        query: &[(String, String)],
        context: tokio::fs::File,
    ) -> Result<LineStream> {
        let body = reqwest::Body::wrap_stream(file_stream(context));
        let resp = self
            .send(
                self.request(Method::POST, "/v1/builds")
                    .query(query)
                    .header(reqwest::header::CONTENT_TYPE, "application/x-tar")
                    .body(body),
            )
            .await?;
        Ok(LineStream::new(resp))
    }

    /// Starts a pull; the stream's lines are its progress events, the last
    /// one the image record or the error.
    pub async fn pull_image(&self, reference: &str) -> Result<LineStream> {
        let resp = self
            .send(
                self.request(Method::POST, "/v1/images/pull")
                    .query(&[("progress", "true")])
                    .json(&serde_json::json!({ "reference": reference })),
            )
            .await?;
        Ok(LineStream::new(resp))
    }

    /// Pushes the stored image `source` (default: the one named
    /// `reference`) to `reference`; returns what was sent.
    pub async fn push_image(&self, reference: &str, source: Option<&str>) -> Result<Value> {
        self.json(
            self.request(Method::POST, "/v1/images/push")
                .json(&serde_json::json!({ "reference": reference, "source": source })),
        )
        .await
    }

    /// Pulls `reference` onto `nodes` (all when empty); returns each node's
    /// digest.
    pub async fn prewarm_image(
        &self,
        reference: &str,
        nodes: &[String],
        node_selector: &std::collections::BTreeMap<String, String>,
    ) -> Result<Value> {
        self.json(self.request(Method::POST, "/v1/images/prewarm").json(
            &serde_json::json!({ "reference": reference, "nodes": nodes, "node_selector": node_selector }),
        ))
        .await
    }

    /// Collects unreferenced image content, down to `budget` (a size such
    /// as 20G) when given; returns the report.
    pub async fn gc_images(&self, budget: Option<&str>) -> Result<Value> {
        self.json(
            self.request(Method::POST, "/v1/images/gc")
                .json(&serde_json::json!({ "budget": budget })),
        )
        .await
    }

    pub async fn list_images(&self) -> Result<Vec<Value>> {
        self.json(self.request(Method::GET, "/v1/images")).await
    }

    pub async fn delete_image(&self, reference: &str) -> Result<Value> {
        self.json(self.request(Method::DELETE, &format!("/v1/images/{reference}")))
            .await
    }

    pub async fn create_batch(&self, req: &BatchRequest) -> Result<BatchInfo> {
        self.json(self.request(Method::POST, "/v1/batches").json(req))
            .await
    }

    pub async fn get_batch(&self, id: &str) -> Result<BatchInfo> {
        self.json(self.request(Method::GET, &format!("/v1/batches/{id}")))
            .await
    }

    /// The batch as the API sent it, for printing.
    pub async fn get_batch_json(&self, id: &str) -> Result<Value> {
        self.json(self.request(Method::GET, &format!("/v1/batches/{id}")))
            .await
    }

    pub async fn list_batches(&self) -> Result<Vec<BatchInfo>> {
        self.json(self.request(Method::GET, "/v1/batches")).await
    }

    pub async fn delete_batch(&self, id: &str) -> Result<BatchInfo> {
        self.json(self.request(Method::DELETE, &format!("/v1/batches/{id}")))
            .await
    }

    pub async fn list_profiles(&self) -> Result<Vec<Profile>> {
        self.json(self.request(Method::GET, "/v1/profiles")).await
    }

    /// The profile as the API sent it, for printing.
    pub async fn get_profile_json(&self, name: &str) -> Result<Value> {
        self.json(self.request(Method::GET, &format!("/v1/profiles/{name}")))
            .await
    }

    /// The profile table as TOML.
    pub async fn export_profiles(&self) -> Result<String> {
        Ok(self
            .send(self.request(Method::GET, "/v1/profiles/export"))
            .await?
            .text()
            .await?)
    }

    /// Loads a TOML profile table (as `export_profiles` writes it).
    pub async fn import_profiles(&self, toml: String) -> Result<Vec<Profile>> {
        self.json(
            self.request(Method::POST, "/v1/profiles/import")
                .header("content-type", "application/toml")
                .body(toml),
        )
        .await
    }

    pub async fn pools(&self) -> Result<Vec<warren_core::pool::PoolInfo>> {
        self.json(self.request(Method::GET, "/v1/pools")).await
    }

    pub async fn set_pool(
        &self,
        name: &str,
        spec: &warren_core::pool::PoolSpec,
    ) -> Result<warren_core::pool::PoolInfo> {
        self.json(
            self.request(Method::PUT, &format!("/v1/pools/{name}"))
                .json(spec),
        )
        .await
    }

    pub async fn delete_pool(&self, name: &str) -> Result<warren_core::pool::PoolInfo> {
        self.json(self.request(Method::DELETE, &format!("/v1/pools/{name}")))
            .await
    }

    pub async fn volumes(&self) -> Result<Vec<warren_core::volume::VolumeInfo>> {
        self.json(self.request(Method::GET, "/v1/volumes")).await
    }

    pub async fn create_volume(
        &self,
        req: &warren_core::volume::VolumeRequest,
    ) -> Result<warren_core::volume::VolumeInfo> {
        self.json(self.request(Method::POST, "/v1/volumes").json(req))
            .await
    }

    pub async fn remove_volume(&self, name: &str) -> Result<warren_core::volume::VolumeInfo> {
        self.json(self.request(Method::DELETE, &format!("/v1/volumes/{name}")))
            .await
    }

    pub async fn secrets(&self) -> Result<Vec<warren_core::secret::SecretInfo>> {
        self.json(self.request(Method::GET, "/v1/secrets")).await
    }

    /// Creates (`name` None: updates `path_name`) a secret from `body`
    /// (`value` and `metadata`, plus `name` for a create).
    pub async fn put_secret(
        &self,
        create: bool,
        name: &str,
        body: &serde_json::Value,
    ) -> Result<warren_core::secret::SecretInfo> {
        let req = if create {
            self.request(Method::POST, "/v1/secrets")
        } else {
            self.request(Method::PUT, &format!("/v1/secrets/{name}"))
        };
        self.json(req.json(body)).await
    }

    pub async fn remove_secret(&self, name: &str) -> Result<warren_core::secret::SecretInfo> {
        self.json(self.request(Method::DELETE, &format!("/v1/secrets/{name}")))
            .await
    }

    pub async fn reset_profile(&self, name: &str) -> Result<Profile> {
        self.json(self.request(Method::POST, &format!("/v1/profiles/{name}/reset")))
            .await
    }
}

/// A file as a request body, read in chunks rather than all at once: image
/// archives can be larger than memory.
fn file_stream(
    f: tokio::fs::File,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static {
    use tokio::io::AsyncReadExt;
    futures_util::stream::unfold(f, |mut f| async move {
        let mut buf = vec![0u8; 256 * 1024];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(bytes::Bytes::from(buf)), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    })
}

/// Splits a streamed response body into lines.
pub struct LineStream {
    body: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buf: Vec<u8>,
    done: bool,
}

impl LineStream {
    pub fn new(resp: Response) -> LineStream {
        LineStream {
            body: Box::pin(resp.bytes_stream()),
            buf: Vec::new(),
            done: false,
        }
    }

    pub async fn next_line(&mut self) -> Result<Option<Vec<u8>>> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
                line.pop();
                return Ok(Some(line));
            }
            if self.done {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(std::mem::take(&mut self.buf)));
            }
            match self.body.next().await {
                Some(chunk) => self
                    .buf
                    .extend_from_slice(&chunk.context("reading the response stream")?),
                None => self.done = true,
            }
        }
    }
}
