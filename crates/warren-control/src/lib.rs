//! Warren's control plane: the public HTTP API, the state store, the queue,
//! and the decisions about sandboxes. It drives its node only through the
//! node contract (`warren_node_api::NodeApi`): `warren up` hands it a node
//! in the same process.

#![forbid(unsafe_code)]

pub mod admission;
pub mod api;
pub mod batch;
pub mod control;
mod images;
mod json_body;
pub mod lifecycle;
pub mod metrics;
pub mod profiles;
mod sandbox_io;
mod sandbox_locks;
pub mod serve;
pub mod store;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use warren_node_api::NodeApi;

pub struct UpConfig {
    /// Where the store and the API token live.
    pub home: PathBuf,
    pub listen: SocketAddr,
    /// Creates that may wait for capacity; beyond this they get 429.
    pub queue_limit: usize,
    pub policy: warren_core::profile::Policy,
    /// Whether a clean stop destroys every sandbox.
    pub destroy_on_stop: bool,
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
    let token: String = (0..32)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect();
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
    Ok(token)
}

pub struct Up {
    pub control: Arc<control::Control>,
    pub token: String,
}

/// Starts the store and the event loop over `node`; returns the router to
/// serve.
pub async fn start(cfg: &UpConfig, node: Arc<dyn NodeApi>) -> Result<(Up, axum::Router), String> {
    std::fs::create_dir_all(&cfg.home)
        .map_err(|e| format!("create home {}: {e}", cfg.home.display()))?;
    let token = ensure_token(&cfg.home).map_err(|e| format!("API token: {e}"))?;
    let store = store::SqliteStore::open(&cfg.home.join("warren.db"))
        .await
        .map_err(|e| e.to_string())?;
    let store = Arc::new(store);
    let info = node
        .info()
        .await
        .map_err(|e| format!("asking the node what it lends: {e}"))?;
    let control = Arc::new(control::Control::new(
        store,
        node,
        info,
        cfg.queue_limit,
        cfg.policy.clone(),
        cfg.destroy_on_stop,
    ));
    // The API is served while this runs (its calls wait for it); a
    // restart never waits on a sandbox before it answers `/healthz`.
    let recovering = control.clone();
    tokio::spawn(async move {
        match recovering.recover().await {
            Ok(()) => {
                recovering.lifecycle.set_ready();
                // Events the node reported meanwhile wait in its feed.
                tokio::spawn(recovering.clone().handle_node_events());
            }
            Err(e) => {
                // The store cannot be read: nothing can be served.
                eprintln!("warren up: recovery failed: {e}");
                std::process::exit(1);
            }
        }
    });
    tokio::spawn(control.clone().reconcile());
    tokio::spawn(control.clone().follow_load());
    let router = api::router(Arc::new(api::AppState {
        control: control.clone(),
        token: token.clone(),
    }));
    Ok((Up { control, token }, router))
}
