//! `warren node`: a node agent that joins a `warren server`. It runs this
//! host's sandboxes, serves the node API to the control plane only (with
//! the credential it received at join) and reports itself every second.
//! Without the control plane it keeps its sandboxes and keeps enforcing
//! their TTLs and leases; when the control plane answers again it is
//! reconciled.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use warren_node_api::{JoinRequest, Joined, NodeApi};

use crate::cli::NodeArgs;

const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

pub async fn run(home: &std::path::Path, args: NodeArgs) -> Result<i32> {
    let (Some(server), Some(token_file)) = (args.server.clone(), args.join_token.clone()) else {
        anyhow::bail!("a node agent needs --server URL and --join-token FILE");
    };
    let token = std::fs::read_to_string(&token_file)
        .with_context(|| {
            format!(
                "read the join token {} (--join-token)",
                token_file.display()
            )
        })?
        .trim()
        .to_string();
    if token.is_empty() {
        anyhow::bail!(
            "{} is empty: put the output of `warren server join-token` in it",
            token_file.display()
        );
    }
    let labels = parse_labels(&args.labels)?;
    let name = args.name.clone().unwrap_or_else(super::hostname);
    let log_path = super::init_logging(home, "warren-node.log")?;
    let (node, _nofile) = super::start_node(home, name.clone(), labels, &args.node)?;
    let local: Arc<dyn NodeApi> = Arc::new(warren_node::LocalNode::new(node.clone()));
    let fence = warren_node_http::Fence::open(home.join("leader-epoch"))?;
    let identity = warren_node_http::tls::Identity::load_or_create(&home.join("node-tls"))?;
    let mut agent = Agent::serve(
        local,
        fence,
        Some(identity),
        &name,
        args.listen,
        args.advertise.clone(),
        &server,
        &token,
    )
    .await?;
    agent.puller = Some(node.clone());
    say!(
        "warren node: {name} serves the node API on {} (advertised as {}); joining {server}; log in {}",
        agent.listening,
        agent.advertise,
        log_path.display()
    );
    tokio::select! {
        _ = agent.run() => {}
        _ = super::first_signal() => {}
    }
    node.release_host();
    say!("warren node: stopped; its sandboxes keep running and are taken over at the next start");
    Ok(0)
}

/// `warren fake-nodes`: in-memory nodes (no kernel work) that join a server
/// through the real node API, for control-plane benchmarks.
pub async fn fake_nodes(args: crate::cli::FakeNodesArgs) -> Result<i32> {
    let token = std::fs::read_to_string(&args.join_token)
        .with_context(|| {
            format!(
                "read the join token {} (--join-token)",
                args.join_token.display()
            )
        })?
        .trim()
        .to_string();
    let lends = warren_node_api::Resources {
        cpu_millis: args.cpu * 1000,
        memory: args.memory_gib << 30,
        slots: 4096,
        gpus: 0,
    };
    let mut agents = Vec::new();
    for i in 0..args.count {
        let name = format!("fake-{i:03}");
        let node: Arc<dyn NodeApi> = warren_node_api::fake::FakeNode::new(&name, lends);
        let listen = "127.0.0.1:0".parse().context("loopback address")?;
        let fence = warren_node_http::Fence::default();
        // Plain HTTP: a benchmark of the control plane, on loopback.
        agents.push(
            Agent::serve(node, fence, None, &name, listen, None, &args.server, &token).await?,
        );
    }
    say!("{} fake nodes joining {}", agents.len(), args.server);
    let runs = futures_util::future::join_all(agents.iter().map(Agent::run));
    tokio::select! {
        _ = runs => {}
        _ = super::first_signal() => {}
    }
    Ok(0)
}

fn parse_labels(given: &[String]) -> Result<warren_core::Labels> {
    given
        .iter()
        .map(|l| {
            warren_core::labels::parse_pair(l)
                .with_context(|| format!("--label {l:?}: write KEY=VALUE, e.g. gpu=h200"))
        })
        .collect()
}

struct Agent {
    /// Where its node API listens.
    listening: std::net::SocketAddr,
    http: reqwest::Client,
    /// The control plane's replicas (any of them answers); the one in use
    /// changes when it stops answering.
    servers: Vec<String>,
    current: std::sync::atomic::AtomicUsize,
    token: String,
    name: String,
    advertise: String,
    /// The node API's certificate and key: its SHA-256 is sent at join,
    /// with a signature that proves this node holds the key.
    identity: Option<warren_node_http::tls::Identity>,
    node: Arc<dyn NodeApi>,
    credential: warren_node_http::Credential,
    /// The node whose pulls take the registries the join answer gives
    /// (none for fake nodes).
    puller: Option<Arc<warren_node::Node>>,
}

impl Agent {
    /// Serves `node`'s API on `listen` (refusing everything until the join
    /// answers), over TLS with `identity`, and prepares to join `server` as
    /// `name`.
    #[allow(clippy::too_many_arguments)]
    async fn serve(
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
        let listener = super::listen(listen)
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
    async fn run(&self) {
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
