//! How the node's egress proxy is configured: node-wide settings and the
//! limits every `allowlist` sandbox gets.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

/// Where a sandbox's decisions go: one JSON object per decision.
pub type LogFn = Arc<dyn Fn(serde_json::Value) + Send + Sync>;

/// Per-sandbox limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// New connections (and plain-HTTP requests) per second, with a burst.
    pub conn_rate: f64,
    pub conn_burst: f64,
    /// Connections open at once.
    pub max_conns: usize,
    /// Bytes per second through all of the sandbox's connections, both ways.
    pub bytes_per_sec: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            conn_rate: 100.0,
            conn_burst: 200.0,
            max_conns: 512,
            bytes_per_sec: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Settings {
    /// Allow rules merged into every `allowlist` sandbox's policy (object
    /// storage, log service, model registry).
    pub defaults: Vec<String>,
    /// Whether sandboxes may ask for open egress (`NetworkMode::Open`).
    pub open: bool,
    /// Names the proxy resolves to fixed addresses instead of asking DNS.
    pub resolve: HashMap<String, Vec<IpAddr>>,
    pub sandbox: Limits,
    /// Node-wide caps over all sandboxes.
    pub node_max_conns: usize,
    pub node_conn_rate: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            defaults: Vec::new(),
            open: false,
            resolve: HashMap::new(),
            sandbox: Limits::default(),
            node_max_conns: 16384,
            node_conn_rate: 5000.0,
        }
    }
}
