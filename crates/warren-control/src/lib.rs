//! Warren's control plane: the public HTTP API, the state store, the queue,
//! and the decisions about sandboxes. It drives its node only through the
//! node contract (`warren_node_api::NodeApi`): `warren up` hands it a node
//! in the same process.

#![forbid(unsafe_code)]

pub mod access;
pub mod admission;
pub mod alerts;
pub mod api;
pub mod audit;
pub mod batches;
mod build_log;
mod builds;
pub use builds::tar_bytes;
pub mod control;
mod gate;
mod history;
mod images;
pub mod lifecycle;
mod log_keeper;
mod log_shipping;
mod samples;
pub use log_shipping::LogLimits;
mod metrics;
mod node_errors;
mod node_set;
pub mod nodes;
mod placement;
mod pools;
mod profiles;
mod records;
pub mod replica;
mod sandbox_io;
pub use streams::{upload, ByteStream, FileRead, WatchEvent};

// The facade every front door (the /v1 API, E2B, SandboxFusion, the
// console) goes through: `Control`'s methods take and answer core types
// (`warren_core`) and the few above, and check everything they are given.
// Front-door crates name nothing of this crate but these and
// `ControlCell`.
pub use control::{new_id_with, Control, Options};
pub use gate::Gate;
pub use images::Images;
pub use node_set::NodeSet;
pub use profiles::Profiles;
pub use records::Records;
pub use sandbox_io::{ExecHandle, SandboxIo};
pub use secrets::Secrets;
pub use signing::Signer;
pub use telemetry::Telemetry;
pub use tenants::Tenants;
pub use volumes::{VolumeFiles, Volumes};
mod sandbox_locks;
mod secrets;
pub mod serve;
pub mod signing;
pub mod store;
mod streams;
mod telemetry;
mod tenants;
mod traces;
mod volumes;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use warren_node_api::NodeApi;

/// The control plane a daemon runs, once it runs one: set when `warren up`
/// starts, or when a server replica takes the lead (never while it follows).
/// Front doors other than the API (E2B, SandboxFusion) answer through it.
pub type ControlCell = Arc<tokio::sync::OnceCell<Arc<control::Control>>>;

pub struct UpConfig {
    /// Where the store and the API token live.
    pub home: PathBuf,
    pub listen: SocketAddr,
    /// Creates that may wait for capacity; beyond this they get 429.
    pub queue_limit: usize,
    pub policy: warren_core::profile::Policy,
    /// Whether a clean stop destroys every sandbox.
    pub destroy_on_stop: bool,
    /// The store: None for `<home>/warren.db`; else `sqlite:PATH` or
    /// `postgres://…` (see `store::open`).
    pub database: Option<String>,
    /// What the control plane drives: its own node (`warren up`), or the
    /// nodes that join it (a cluster).
    pub nodes: NodeSource,
    /// Where browsers reach the console (`--public-url`, behind a proxy or
    /// TLS); None: `http://` and the request's Host.
    pub public_url: Option<String>,
    /// Where browsers reach sandbox ports (`--ports-url`, each port a host
    /// `PORT-ID.<host>` below it); None: links to ports are not offered.
    pub ports_url: Option<String>,
    /// Where alerts are sent (`--alert-webhook`; see `alerts`).
    pub alert_webhooks: Vec<alerts::Webhook>,
    /// How long and how much of the nodes' shipped logs the store keeps.
    pub log_limits: LogLimits,
}

pub enum NodeSource {
    /// One node, never given up (`warren up`).
    Local(Arc<dyn NodeApi>),
    /// Nodes join with the join token and are reached through `connect`;
    /// a silent one is given up after `liveness`.
    Cluster {
        join_token: String,
        connect: nodes::Connector,
        check_proof: nodes::ProofCheck,
        liveness: nodes::Liveness,
        /// What joining nodes take of the server's `registries.toml`.
        registries: Option<String>,
        /// Where images made in the cluster are published for every node.
        cluster_registry: Option<warren_core::image_ref::ClusterRegistry>,
    },
}

/// Reads the API token from `<home>/token`, creating it (mode 0600) first.
pub fn ensure_token(home: &Path) -> std::io::Result<String> {
    ensure_secret(&home.join("token"))
}

/// Reads a secret (a token, a credential) from `path`, creating it first:
/// 32 random bytes as hex, mode 0600, written whole.
pub fn ensure_secret(path: &Path) -> std::io::Result<String> {
    if let Ok(t) = std::fs::read_to_string(path) {
        if !t.trim().is_empty() {
            return Ok(t.trim().to_string());
        }
    }
    write_secret(path, &new_secret())
}

/// 32 random bytes as hex.
pub fn new_secret() -> String {
    (0..32)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect()
}

/// Writes `token` to `path` (mode 0600, whole or not at all).
pub fn write_secret(path: &Path, token: &str) -> std::io::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(token.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(token.to_string())
}

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenStoreError {
    /// `<home>/warren.db`, the store without `--database`.
    #[error(transparent)]
    Home(store::StoreError),
    #[error("--database: {0}")]
    Database(#[source] store::StoreError),
}

/// The store `--database` names (`<home>/warren.db` without one).
pub async fn open_store(
    home: &Path,
    database: Option<&str>,
) -> Result<Arc<dyn store::Store>, OpenStoreError> {
    Ok(match database {
        None => Arc::new(
            store::SqliteStore::open(&home.join("warren.db"))
                .await
                .map_err(OpenStoreError::Home)?,
        ),
        Some(url) => store::open(url).await.map_err(OpenStoreError::Database)?,
    })
}

pub struct Up {
    pub control: Arc<control::Control>,
    pub token: String,
}

/// Why the control plane did not start. Each message says what was being
/// done and keeps its cause's words; the cause is also the source.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("create home {}: {source}", path.display())]
    Home {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("API token: {0}")]
    Token(#[source] std::io::Error),
    /// `--public-url` or `--ports-url`.
    #[error(transparent)]
    Url(#[from] api::console::OriginError),
    #[error(transparent)]
    Store(#[from] OpenStoreError),
    /// The key secrets are sealed with.
    #[error(transparent)]
    SecretKey(#[from] secrets::SealError),
    /// `warren up`'s own node did not say what it lends.
    #[error("asking the node what it lends: {0}")]
    NodeInfo(#[source] warren_node_api::NodeError),
    /// The nodes known from before could not be read from the store.
    #[error("reading the known nodes: {0}")]
    KnownNodes(#[source] store::StoreError),
    /// A known node's recorded URL or pin is one the transport refuses.
    #[error("node {name}: {source}")]
    Connect {
        name: String,
        source: nodes::ConnectError,
    },
}

/// Starts the store, the nodes and the control loops; returns the router to
/// serve.
pub async fn start(cfg: UpConfig) -> Result<(Up, axum::Router), StartError> {
    std::fs::create_dir_all(&cfg.home).map_err(|source| StartError::Home {
        path: cfg.home.clone(),
        source,
    })?;
    let token = ensure_token(&cfg.home).map_err(StartError::Token)?;
    let console = api::console::Console::new(cfg.public_url.as_deref())?;
    let ports = cfg
        .ports_url
        .as_deref()
        .map(|u| api::port_door::PortLinks::new(u, &token))
        .transpose()?;
    let store = open_store(&cfg.home, cfg.database.as_deref()).await?;
    let (liveness, cluster_registry) = match &cfg.nodes {
        NodeSource::Local(_) => (None, None),
        NodeSource::Cluster {
            liveness,
            cluster_registry,
            ..
        } => (Some(*liveness), cluster_registry.clone()),
    };
    let control = Arc::new(control::Control::new(
        store.clone(),
        control::Options {
            queue_limit: cfg.queue_limit,
            policy: cfg.policy.clone(),
            destroy_on_stop: cfg.destroy_on_stop,
            liveness,
            cluster_registry,
            operator_token: Some(token.clone()),
            audit_home: Some(cfg.home.clone()),
            log_limits: cfg.log_limits,
            secret_box: Some(secrets::SecretBox::open_home(&cfg.home)?),
        },
    ));
    let mut join = None;
    match cfg.nodes {
        NodeSource::Local(node) => {
            let info = node.info().await.map_err(StartError::NodeInfo)?;
            let entry = control
                .node_set()
                .add(node, info, String::new(), String::new(), false);
            tokio::spawn(control.clone().follow_load(entry));
        }
        NodeSource::Cluster {
            join_token,
            connect,
            check_proof,
            registries,
            ..
        } => {
            // Known nodes are expected back: silent ones are given up after
            // the liveness timeouts, counted from now.
            for rec in store.nodes().await.map_err(StartError::KnownNodes)? {
                let api = connect(&rec.url, &rec.credential, rec.tls_fingerprint.as_deref())
                    .map_err(|source| StartError::Connect {
                        name: rec.name.clone(),
                        source,
                    })?;
                let info = warren_node_api::NodeInfo {
                    name: rec.name.clone(),
                    labels: rec.labels.clone(),
                    allocatable: Default::default(),
                    max_pids: 0,
                    load: Default::default(),
                    images: Vec::new(),
                    devices: Vec::new(),
                    isolation: Vec::new(),
                };
                control.node_set().add(
                    api,
                    info,
                    rec.url.clone(),
                    rec.credential.clone(),
                    rec.cordoned,
                );
            }
            join = Some(api::Join {
                token: join_token,
                connect,
                check_proof,
                registries,
            });
        }
    }
    // The API is served while this runs (its calls wait for it); a
    // restart never waits on a sandbox before it answers `/healthz`.
    let recovering = control.clone();
    tokio::spawn(async move {
        match recovering.recover().await {
            // Each node's events are followed from its reconciliation on
            // (what it reported meanwhile waits in its feed).
            Ok(()) => recovering.lifecycle.set_ready(),
            Err(e) => {
                // The store cannot be read: nothing can be served.
                eprintln!("warren up: recovery failed: {e}");
                std::process::exit(1);
            }
        }
    });
    tokio::spawn(control.clone().reconcile());
    tokio::spawn(control.clone().keep_pools());
    tokio::spawn(control.clone().enforce_preemptions());
    tokio::spawn(control.clone().watch_nodes());
    tokio::spawn(control.log_keeper.clone().expire_kept_logs());
    tokio::spawn(control.telemetry().clone().keep_history());
    if !cfg.alert_webhooks.is_empty() {
        tokio::spawn(control.telemetry().clone().send_alerts(cfg.alert_webhooks));
    }
    let router = api::router(Arc::new(api::AppState {
        control: control.clone(),
        token: token.clone(),
        join,
        console,
        ports,
    }));
    Ok((Up { control, token }, router))
}
