//! The nodes the control plane drives: each one's contract client and what
//! the control plane last learnt of it (its description, load, when it was
//! last heard from, whether it is cordoned).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use warren_core::sync::lock;
use warren_core::ApiError;
use warren_node_api::{NodeApi, NodeError, NodeInfo};

/// How a node stands, as the control plane judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// Heard from recently: takes placements (unless cordoned).
    Ready,
    /// Silent past `Liveness::unreachable_after`: no placements.
    Unreachable,
    /// Silent past `Liveness::lost_after`: its sandboxes are `lost`; when
    /// it is heard from again it is reconciled.
    Lost,
}

/// When a silent node stops taking placements, and when its sandboxes are
/// given up (a cluster; `warren up`'s own node is never given up).
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    pub unreachable_after: Duration,
    pub lost_after: Duration,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            unreachable_after: Duration::from_secs(5),
            lost_after: Duration::from_secs(10),
        }
    }
}

/// What the control plane knows of one node now.
#[derive(Debug, Clone)]
pub struct View {
    pub info: NodeInfo,
    pub url: String,
    pub health: Health,
    pub cordoned: bool,
    pub last_seen: Instant,
    /// Its sandboxes were checked against the records since it was added
    /// or last given up; until then it takes no placements (a sandbox
    /// created meanwhile would look like one nobody knows).
    pub reconciled: bool,
    pub reconciling: bool,
}

impl View {
    /// Whether placement may choose it.
    pub fn schedulable(&self) -> bool {
        self.health == Health::Ready
            && self.reconciled
            && !self.cordoned
            && !self.info.load.disk_pressure
            && !self.info.load.memory_pressure
    }
}

pub struct NodeEntry {
    pub name: String,
    pub api: Arc<dyn NodeApi>,
    /// What the node shows with its heartbeats (issued at join; empty for
    /// `warren up`'s own node, which sends none).
    pub credential: String,
    view: Mutex<View>,
    /// Whether its event feed is followed (once, from its first
    /// reconciliation on).
    pub(crate) following: std::sync::atomic::AtomicBool,
}

impl NodeEntry {
    pub fn new(
        api: Arc<dyn NodeApi>,
        info: NodeInfo,
        url: String,
        credential: String,
        cordoned: bool,
    ) -> NodeEntry {
        NodeEntry {
            name: info.name.clone(),
            api,
            credential,
            view: Mutex::new(View {
                info,
                url,
                health: Health::Ready,
                cordoned,
                last_seen: Instant::now(),
                reconciled: false,
                reconciling: false,
            }),
            following: Default::default(),
        }
    }

    pub fn view(&self) -> View {
        lock(&self.view).clone()
    }

    /// Changes the view under its lock; returns what `f` returns.
    pub fn update<T>(&self, f: impl FnOnce(&mut View) -> T) -> T {
        f(&mut lock(&self.view))
    }
}

#[derive(Default)]
pub struct Nodes {
    map: RwLock<BTreeMap<String, Arc<NodeEntry>>>,
}

impl Nodes {
    pub fn get(&self, name: &str) -> Option<Arc<NodeEntry>> {
        self.read().get(name).cloned()
    }

    pub fn all(&self) -> Vec<Arc<NodeEntry>> {
        self.read().values().cloned().collect()
    }

    /// The contract client of `node`, whatever its health (a call to a
    /// silent node fails as `unavailable`).
    pub(crate) fn api(&self, node: &str) -> Result<Arc<dyn NodeApi>, ApiError> {
        self.get(node).map(|n| n.api.clone()).ok_or_else(|| {
            ApiError::new(
                warren_core::ErrorCode::Unavailable,
                format!(
                    "node {node:?} is not part of this cluster (removed?); see `warren node ls`"
                ),
            )
        })
    }

    /// The client of `node` if it is heard from (reads that only add
    /// detail skip a silent node instead of waiting for it).
    pub(crate) fn reachable(&self, node: &str) -> Option<Arc<dyn NodeApi>> {
        self.get(node)
            .filter(|n| n.view().health == Health::Ready)
            .map(|n| n.api.clone())
    }

    /// Adds a node or replaces the entry of the same name (a re-join);
    /// returns the entry it replaced.
    pub fn insert(&self, entry: Arc<NodeEntry>) -> Option<Arc<NodeEntry>> {
        self.write().insert(entry.name.clone(), entry)
    }

    pub fn remove(&self, name: &str) -> Option<Arc<NodeEntry>> {
        self.write().remove(name)
    }

    /// Whether `entry` is still the one registered under its name.
    pub fn is_current(&self, entry: &Arc<NodeEntry>) -> bool {
        self.get(&entry.name)
            .is_some_and(|e| Arc::ptr_eq(&e, entry))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<NodeEntry>>> {
        warren_core::sync::read(&self.map)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Arc<NodeEntry>>> {
        warren_core::sync::write(&self.map)
    }
}

/// Makes the contract client of a node the control plane reaches over the
/// network: its URL, the credential it shows there, and the SHA-256 of its
/// certificate when it serves TLS. The binary supplies it (the HTTP
/// transport), so the control plane names no transport.
pub type Connector =
    Arc<dyn Fn(&str, &str, Option<&str>) -> Result<Arc<dyn NodeApi>, ConnectError> + Send + Sync>;

/// Checks that a join comes from the holder of the key of the certificate
/// it pins (the transport's business, supplied with the `Connector`).
pub type ProofCheck =
    Arc<dyn Fn(&warren_node_api::JoinRequest) -> Result<(), ProofError> + Send + Sync>;

/// The transport made no client for a node: the URL, credential or
/// certificate pin it was given is not one it can use. The contract's
/// error says which, in words the node's operator can act on.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ConnectError(#[from] pub NodeError);

/// A joining node did not prove that it holds the key of the certificate
/// it pins. The transport checks the proof, so its error is the
/// transport's own, kept whole.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ProofError(Box<dyn std::error::Error + Send + Sync>);

impl ProofError {
    pub fn new(why: impl std::error::Error + Send + Sync + 'static) -> ProofError {
        ProofError(Box::new(why))
    }
}

/// A join whose node cannot be reached as it says: the joining node's
/// request is at fault, whatever category the transport gave it.
impl From<ConnectError> for ApiError {
    fn from(e: ConnectError) -> ApiError {
        ApiError::bad_request(e.0.message)
    }
}

/// A node as `/v1/nodes` lists it.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct NodeLoad {
    pub cpu_busy: f64,
    pub disk_pressure: bool,
    pub memory_pressure: bool,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(as = NodeInfo)]
pub struct NodeListing {
    pub name: String,
    /// ready, unreachable or lost.
    pub state: Health,
    pub cordoned: bool,
    pub labels: warren_core::Labels,
    /// Where the control plane reaches it (empty for `warren up`'s own).
    pub url: String,
    pub allocatable: crate::admission::Need,
    pub allocated: crate::admission::Need,
    /// Sandboxes being created on it now.
    pub initializing: u32,
    /// Sandboxes it holds, as it last reported.
    pub sandboxes: u32,
    pub load: NodeLoad,
    /// Milliseconds since it was last heard from.
    pub last_seen_ms: u64,
    /// Creates waiting for room (the queue is the cluster's, shared).
    pub queued: usize,
    /// Its CDI devices by kind, with those in use (docs/gpu.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<warren_node_api::DeviceClass>,
    /// The isolation classes it runs, its default first (`warren doctor` on
    /// the node says why one is missing).
    pub isolation: Vec<warren_core::Isolation>,
}
