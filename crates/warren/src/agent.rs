//! A node agent's tie to the control plane: serves a node's API (a real
//! node for `warren node`, in-memory ones for `warren-bench fake-nodes`),
//! joins the control plane and heartbeats, joining again whenever the
//! control plane no longer knows the node.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use warren_node_api::{JoinRequest, Joined, NodeApi};

const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// One node's agent: its served API and its place in the control plane.
pub struct Agent {
    /// Where its node API listens.
    pub listening: std::net::SocketAddr,
    http: reqwest::Client,
    /// The control plane's replicas (any of them answers); the one in use
    /// changes when it stops answering.
    servers: Vec<String>,
    current: std::sync::atomic::AtomicUsize,
    token: String,
    name: String,
    pub advertise: String,
    /// The node API's certificate and key: its SHA-256 is sent at join,
    /// with a signature that proves this node holds the key.
    identity: Option<warren_node_http::tls::Identity>,
    node: Arc<dyn NodeApi>,
    credential: warren_node_http::Credential,
    /// The node whose pulls take the registries the join answer gives
    /// (none for fake nodes).
    pub puller: Option<Arc<warren_node::Node>>,
}

impl Agent {
    /// Serves `node`'s API on `listen` (refusing everything until the join
    /// answers), over TLS with `identity`, and prepares to join `server` as
    /// `name`.
    #[allow(clippy::too_many_arguments)]
    pub async fn serve(
        node: Arc<dyn NodeApi>,
        fence: warren_node_http::Fence,
        identity: Option<warren_node_http::tls::Identity>,
        name: &str,
        listen: std::net::SocketAddr,
        advertise: Option<String>,
        server: &str,
        token: &str,
    ) -> Result<Agent> {
        let credential = warren_node_http::Credential::default();
        let listener = crate::serving::listen(listen)
            .with_context(|| format!("node API: listen on {listen} (--listen)"))?;
        let listening = listener.local_addr().context("node API address")?;
        let router = warren_node_http::router(node.clone(), credential.clone(), fence);
        let scheme = if identity.is_some() { "https" } else { "http" };
        if let Some(given) = &advertise {
            if !given.starts_with(&format!("{scheme}://")) {
                anyhow::bail!(
                    "--advertise {given:?}: the node API serves {scheme}; advertise {scheme}://HOST:PORT"
                );
            }
        }
        let acceptor = identity.as_ref().map(|i| i.acceptor()).transpose()?;
        tokio::spawn(async move {
            let served = match acceptor {
                Some(tls) => warren_node_http::serve_tls(listener, router, tls).await,
                None => warren_node_http::serve(listener, router).await,
            };
            if let Err(e) = served {
                tracing::error!(error = %e, "the node API stopped");
            }
        });
        Ok(Agent {
            listening,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .pool_idle_timeout(warren_control::serve::CLIENT_IDLE_LIMIT)
                .build()
                .context("HTTP client")?,
            servers: server
                .split(',')
                .map(|s| s.trim().trim_end_matches('/').to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            current: Default::default(),
            token: token.to_string(),
            name: name.to_string(),
            advertise: advertise.unwrap_or_else(|| format!("{scheme}://{listening}")),
            identity,
            node,
            credential,
            puller: None,
        })
    }

    fn server(&self) -> &str {
        let i = self.current.load(std::sync::atomic::Ordering::Relaxed);
        self.servers
            .get(i % self.servers.len().max(1))
            .map_or("", String::as_str)
    }

    /// Tries the next replica from now on.
    fn next_server(&self) {
        self.current
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Joins, then heartbeats; joins again whenever the control plane no
    /// longer knows this node (removed, or its records lost).
    pub async fn run(&self) {
        loop {
            let credential = match self.join().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(server = %self.server(), error = %format!("{e:#}"), "joining; retrying");
                    self.next_server();
                    tokio::time::sleep(HEARTBEAT_EVERY).await;
                    continue;
                }
            };
            self.credential.set(&credential);
            tracing::info!(server = %self.server(), node = %self.name, "joined");
            self.heartbeats(&credential).await;
            tracing::warn!(node = %self.name, "the control plane no longer knows this node; joining again");
        }
    }

    async fn join(&self) -> Result<String> {
        let info = self.node.info().await.map_err(|e| anyhow::anyhow!("{e}"))?;
        let now = warren_core::clock::unix_now();
        let tls_proof = self
            .identity
            .as_ref()
            .map(|i| i.prove_join(&info.name, &self.advertise, now))
            .transpose()?;
        let req = JoinRequest {
            url: self.advertise.clone(),
            info,
            tls_fingerprint: self.identity.as_ref().map(|i| i.fingerprint()),
            tls_proof,
        };
        let resp = self
            .http
            .post(format!("{}/v1/nodes/join", self.server()))
            .bearer_auth(&self.token)
            .json(&req)
            .send()
            .await
            .context("reaching the control plane")?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            anyhow::bail!("the control plane refused the join ({status}): {body}");
        }
        let joined: Joined = resp.json().await.context("reading the join answer")?;
        if let Some(node) = &self.puller {
            // Mirrors the cluster names (its pull-through cache), beneath
            // this node's own registries.toml.
            node.set_cluster_registries(joined.registries.as_deref())
                .context("the registries the control plane gives")?;
        }
        Ok(joined.credential)
    }

    /// Returns when the control plane refuses this node's credential.
    async fn heartbeats(&self, credential: &str) {
        loop {
            let url = format!("{}/v1/nodes/{}/heartbeat", self.server(), self.name);
            let info = match self.node.info().await {
                Ok(info) => info,
                Err(e) => {
                    tracing::warn!(error = %e, "describing this node");
                    tokio::time::sleep(HEARTBEAT_EVERY).await;
                    continue;
                }
            };
            match self
                .http
                .post(&url)
                .bearer_auth(credential)
                .json(&info)
                .send()
                .await
            {
                Ok(r) if r.status() == reqwest::StatusCode::UNAUTHORIZED => return,
                Ok(r) if !r.status().is_success() => {
                    tracing::warn!(status = %r.status(), "a heartbeat was refused");
                    if r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE {
                        self.next_server();
                    }
                }
                Ok(_) => {}
                // The control plane (or this replica of it) is away:
                // sandboxes run on, TTLs and leases still hold (the node
                // enforces them itself); the next replica is tried.
                Err(e) => {
                    tracing::debug!(error = %e, "a heartbeat did not arrive");
                    self.next_server();
                }
            }
            tokio::time::sleep(HEARTBEAT_EVERY).await;
        }
    }
}
