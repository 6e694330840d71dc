//! Warren's control plane: the public HTTP API, the state store, and the
//! decisions about sandboxes. `serve` runs it with an embedded node agent
//! (`warren up`).

pub mod api;
pub mod batch;
pub mod control;
pub mod lifecycle;
pub mod metrics;
mod net_api;
pub mod profiles;
mod sandbox_locks;
pub mod serve;
pub mod store;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use warren_node::{Node, NodeConfig};

pub struct UpConfig {
    pub home: PathBuf,
    pub listen: SocketAddr,
    pub spawner_exe: PathBuf,
    pub spawner_args: Vec<String>,
    pub spawners: usize,
    pub settings: warren_node::NodeSettings,
    pub policy: warren_core::profile::Policy,
}

/// Reads the API token from `<home>/token`, creating it (mode 0600) first.
pub fn ensure_token(home: &Path) -> std::io::Result<String> {
    let path = home.join("token");
    if let Ok(t) = std::fs::read_to_string(&path) {
        if !t.trim().is_empty() {
            return Ok(t.trim().to_string());
        }
    }
    let token: String = (0..32)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect();
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = home.join("token.tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(token.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    Ok(token)
}

pub struct Up {
    pub control: Arc<control::Control>,
    pub token: String,
}

/// Starts node, store and the event loop; returns the router to serve.
pub async fn start(cfg: &UpConfig) -> Result<(Up, axum::Router), String> {
    std::fs::create_dir_all(&cfg.home)
        .map_err(|e| format!("create home {}: {e}", cfg.home.display()))?;
    let token = ensure_token(&cfg.home).map_err(|e| format!("API token: {e}"))?;
    let store = store::Store::open(&cfg.home.join("warren.db"))
        .await
        .map_err(|e| e.to_string())?;
    let (node, node_events) = Node::start(NodeConfig {
        home: cfg.home.clone(),
        name: hostname(),
        spawner_exe: cfg.spawner_exe.clone(),
        spawner_args: cfg.spawner_args.clone(),
        spawners: cfg.spawners,
        settings: cfg.settings.clone(),
    })
    .map_err(|e| format!("node agent: {e}"))?;
    let control = Arc::new(control::Control {
        store,
        node,
        metrics: metrics::Metrics::new(),
        profile_lock: tokio::sync::Mutex::new(()),
        sandbox_locks: Default::default(),
        policy: cfg.policy.clone(),
        lifecycle: Default::default(),
    });
    // The API is served while this runs (its calls wait for it); a
    // restart never waits on a sandbox before it answers `/healthz`.
    let recovering = control.clone();
    tokio::spawn(async move {
        match recovering.recover().await {
            Ok(()) => recovering.lifecycle.set_ready(),
            Err(e) => {
                // The store cannot be read: nothing can be served.
                eprintln!("warren up: recovery failed: {e}");
                std::process::exit(1);
            }
        }
    });
    tokio::spawn(control.clone().handle_node_events(node_events));
    tokio::spawn(control.clone().reconcile());
    let router = api::router(Arc::new(api::AppState {
        control: control.clone(),
        token: token.clone(),
    }));
    Ok((Up { control, token }, router))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "local".into())
}
