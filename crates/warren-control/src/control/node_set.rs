//! The nodes' side of the control plane: which node a call goes to, what
//! each node reports of itself (heartbeats), and what happens when one
//! falls silent (unreachable, then lost) or comes back (reconciled).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use warren_core::clock::now_rfc3339;
use warren_core::state::reason;
use warren_core::{ApiError, SandboxState};
use warren_node_api::{JoinRequest, Joined, NodeApi, NodeInfo};

use super::Control;
use crate::nodes::{Connector, Health, NodeEntry};
use crate::nodes::{NodeListing, NodeLoad};
use crate::store::NodeRecord;

impl Control {
    /// What each node lends and what its sandboxes hold of it, as
    /// admission counts (requests, not usage).
    pub fn node_usage(&self) -> Vec<crate::admission::NodeUse> {
        self.admission.nodes()
    }

    /// Every node with its state, labels, capacity, allocation and load.
    pub fn node_list(&self) -> Vec<NodeListing> {
        let usage: std::collections::HashMap<String, crate::admission::NodeUse> = self
            .node_usage()
            .into_iter()
            .map(|n| (n.name.clone(), n))
            .collect();
        let queued = self.admission.queued();
        self.nodes
            .all()
            .into_iter()
            .map(|n| {
                let v = n.view();
                let used = usage.get(&n.name);
                NodeListing {
                    name: n.name.clone(),
                    state: v.health,
                    cordoned: v.cordoned,
                    labels: v.info.labels.clone(),
                    url: v.url.clone(),
                    allocatable: v.info.allocatable,
                    allocated: used.map(|u| u.used).unwrap_or_default(),
                    initializing: used.map_or(0, |u| u.initializing),
                    sandboxes: v.info.load.sandboxes,
                    load: NodeLoad {
                        cpu_busy: v.info.load.cpu_busy,
                        disk_pressure: v.info.load.disk_pressure,
                        memory_pressure: v.info.load.memory_pressure,
                    },
                    last_seen_ms: v.last_seen.elapsed().as_millis() as u64,
                    queued,
                    devices: v.info.devices.clone(),
                    isolation: warren_core::Isolation::offered(&v.info.isolation).to_vec(),
                }
            })
            .collect()
    }

    /// Whether some node of the cluster permits open egress (front doors
    /// whose protocol assumes the internet, E2B's, use it when one does).
    pub fn offers_open_egress(&self) -> bool {
        self.nodes.all().iter().any(|n| {
            n.view()
                .info
                .labels
                .get(warren_core::network::EGRESS_OPEN_LABEL)
                .is_some_and(|v| v == "true")
        })
    }

    /// Registers a node (or replaces the one of the same name) as it
    /// described itself; it takes placements once it is reconciled.
    pub fn add_node(
        &self,
        api: Arc<dyn NodeApi>,
        info: NodeInfo,
        url: String,
        credential: String,
        cordoned: bool,
    ) -> Arc<NodeEntry> {
        let entry = Arc::new(NodeEntry::new(api, info.clone(), url, credential, cordoned));
        self.nodes.insert(entry.clone());
        // A node known only from the store (a restarted control plane) lends
        // nothing admission can count until its first heartbeat says what.
        if info.allocatable.slots > 0 {
            self.admission.set_node(
                &info.name,
                info.allocatable,
                info.max_pids,
                info.labels,
                &info.isolation,
            );
            self.admission.set_schedulable(&info.name, false);
        }
        entry
    }

    /// A node reported itself: it is alive, and this is what it lends and
    /// how busy it is. False if no node has that name.
    pub fn heartbeat(self: &Arc<Self>, name: &str, info: NodeInfo) -> bool {
        let Some(entry) = self.nodes.get(name) else {
            return false;
        };
        let (was, reconcile, schedulable) = entry.update(|v| {
            let was = v.health;
            v.info = info.clone();
            v.last_seen = std::time::Instant::now();
            v.health = Health::Ready;
            let reconcile = !v.reconciled && !v.reconciling && self.lifecycle.is_ready();
            (was, reconcile, v.schedulable())
        });
        self.admission.set_node(
            name,
            info.allocatable,
            info.max_pids,
            info.labels,
            &info.isolation,
        );
        self.admission.set_images(name, &info.images);
        self.admission.set_schedulable(name, schedulable);
        if was != Health::Ready {
            tracing::info!(node = %name, "node heard from again");
            let (this, name) = (self.clone(), name.to_string());
            tokio::spawn(async move {
                let message = format!("node {name} is heard from again");
                let _ = this
                    .store
                    .node_event("node_ready", &message, &now_rfc3339())
                    .await;
            });
        }
        if reconcile {
            let this = self.clone();
            tokio::spawn(async move {
                if let Err(e) = this.recover_node(&entry, None).await {
                    tracing::warn!(node = %entry.name, error = %e.message, "reconciling a node");
                }
            });
        }
        true
    }

    /// Asks `entry` for its description every second: the heartbeat of a
    /// node the control plane reaches itself (`warren up`'s own node).
    pub async fn follow_load(self: Arc<Self>, entry: Arc<NodeEntry>) {
        const EVERY: std::time::Duration = std::time::Duration::from_secs(1);
        while self.nodes.is_current(&entry) {
            tokio::select! {
                _ = tokio::time::sleep(EVERY) => {}
                _ = self.lifecycle.stopped() => return,
            }
            match entry.api.info().await {
                Ok(info) => {
                    self.heartbeat(&entry.name, info);
                }
                Err(e) => {
                    tracing::debug!(node = %entry.name, error = %e, "asking a node for its load")
                }
            }
        }
    }

    /// Gives up silent nodes (a cluster's control plane): no placements
    /// after `unreachable_after`, their sandboxes `lost` after
    /// `lost_after`. Runs until the control plane stops.
    pub async fn watch_nodes(self: Arc<Self>) {
        let Some(liveness) = self.liveness else {
            return;
        };
        loop {
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_millis(250)) => {}
                _ = self.lifecycle.stopped() => return,
            }
            for entry in self.nodes.all() {
                let v = entry.view();
                let silent = v.last_seen.elapsed();
                if silent >= liveness.lost_after && v.health != Health::Lost {
                    self.node_lost(&entry, silent).await;
                } else if silent >= liveness.unreachable_after && v.health == Health::Ready {
                    entry.update(|v| v.health = Health::Unreachable);
                    self.admission.set_schedulable(&entry.name, false);
                    let message = format!(
                        "node {} silent for {:.1}s: no placements on it",
                        entry.name,
                        silent.as_secs_f64()
                    );
                    tracing::warn!("{message}");
                    let _ = self
                        .store
                        .node_event("node_unreachable", &message, &now_rfc3339())
                        .await;
                }
            }
        }
    }

    /// A node silent too long: every sandbox on it is `lost` and gives its
    /// capacity back. What still runs there is destroyed when the node is
    /// heard from again (it is reconciled first).
    async fn node_lost(self: &Arc<Self>, entry: &Arc<NodeEntry>, silent: std::time::Duration) {
        entry.update(|v| {
            v.health = Health::Lost;
            v.reconciled = false;
        });
        self.admission.set_schedulable(&entry.name, false);
        let message = format!(
            "node {} silent for {:.1}s: its sandboxes are lost",
            entry.name,
            silent.as_secs_f64()
        );
        tracing::warn!("{message}");
        let _ = self
            .store
            .node_event("node_lost", &message, &now_rfc3339())
            .await;
        let Ok(rows) = self.store.list(&super::recovery::open_states()).await else {
            return;
        };
        for row in rows
            .into_iter()
            .filter(|r| r.node == entry.name && r.state != SandboxState::Queued)
        {
            if let Err(e) = self.mark_lost(&row.id, &message).await {
                tracing::warn!(sandbox = %row.id, error = %e.message, "marking a sandbox lost");
            }
        }
    }

    /// Follows `entry`'s event feed from its first reconciliation on, once,
    /// and keeps the logs it ships.
    pub(crate) fn follow_events_once(self: &Arc<Self>, entry: &Arc<NodeEntry>) {
        if !entry.following.swap(true, Ordering::SeqCst) {
            tokio::spawn(self.clone().handle_node_events(entry.clone()));
            tokio::spawn(self.clone().ship_node_logs(entry.clone()));
        }
    }

    /// A node joins (or joins again): it is recorded with a new
    /// credential, which is returned to it, and reconciled on its first
    /// heartbeat. A re-join keeps the node's cordon.
    pub async fn join_node(
        self: &Arc<Self>,
        req: JoinRequest,
        connect: &Connector,
    ) -> Result<Joined, ApiError> {
        let name = req.info.name.clone();
        warren_core::labels::validate_value("node name", &name)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        if name.is_empty() {
            return Err(ApiError::bad_request("a node needs a name (--name)"));
        }
        warren_core::labels::validate(&req.info.labels)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        if !(req.url.starts_with("http://") || req.url.starts_with("https://")) {
            return Err(ApiError::bad_request(format!(
                "node URL {:?} must start with http:// or https:// (see `warren node --advertise`)",
                req.url
            )));
        }
        let known = self
            .store
            .nodes()
            .await?
            .into_iter()
            .find(|n| n.name == name);
        // A name stays bound to the key it joined with (the caller checked
        // that this join holds the key it pins): a join-token holder with
        // another key cannot take over a node's name and credential.
        if let Some(pin) = known.as_ref().and_then(|n| n.tls_fingerprint.as_deref()) {
            if req.tls_fingerprint.as_deref() != Some(pin) {
                return Err(ApiError::conflict(format!(
                    "node {name} joined with another TLS key (certificate SHA-256 {pin}); a node that lost its node-tls directory joins again after `warren node rm {name}`"
                )));
            }
        }
        let cordoned = known.is_some_and(|n| n.cordoned);
        let credential = crate::new_secret();
        let api = connect(&req.url, &credential, req.tls_fingerprint.as_deref())
            .map_err(ApiError::from)?;
        let now = now_rfc3339();
        self.store
            .put_node(&NodeRecord {
                name: name.clone(),
                url: req.url.clone(),
                credential: credential.clone(),
                labels: req.info.labels.clone(),
                cordoned,
                joined_at: now.clone(),
                tls_fingerprint: req.tls_fingerprint.clone(),
            })
            .await?;
        self.add_node(api, req.info, req.url.clone(), credential.clone(), cordoned);
        let message = format!("node {name} joined from {}", req.url);
        tracing::info!("{message}");
        self.store.node_event("node_joined", &message, &now).await?;
        Ok(Joined {
            credential,
            registries: None,
        })
    }

    /// Whether `credential` is the one issued to `node` at its join.
    pub fn node_credential_ok(&self, node: &str, credential: &str) -> bool {
        use subtle::ConstantTimeEq;
        self.nodes.get(node).is_some_and(|n| {
            !n.credential.is_empty()
                && bool::from(n.credential.as_bytes().ct_eq(credential.as_bytes()))
        })
    }

    /// Stops (or resumes) placing sandboxes on a node; what runs there
    /// stays.
    pub async fn set_cordoned(&self, name: &str, cordoned: bool) -> Result<(), ApiError> {
        let entry = self.known_node(name)?;
        if let Some(mut rec) = self
            .store
            .nodes()
            .await?
            .into_iter()
            .find(|n| n.name == name)
        {
            rec.cordoned = cordoned;
            self.store.put_node(&rec).await?;
        }
        let schedulable = entry.update(|v| {
            v.cordoned = cordoned;
            v.schedulable()
        });
        self.admission.set_schedulable(name, schedulable);
        let (why, what) = if cordoned {
            ("node_cordoned", "takes no new sandboxes")
        } else {
            ("node_uncordoned", "takes sandboxes again")
        };
        self.store
            .node_event(why, &format!("node {name} {what}"), &now_rfc3339())
            .await?;
        Ok(())
    }

    /// Removes a node from the cluster: its sandboxes are `lost` (what
    /// still runs there is the node's to clean up: it destroys what the
    /// control plane no longer knows when it joins again).
    pub async fn remove_node(self: &Arc<Self>, name: &str) -> Result<(), ApiError> {
        let entry = self.known_node(name)?;
        self.nodes.remove(name);
        self.admission.remove_node(name);
        self.store.delete_node(name).await?;
        let rows = self.store.list(&super::recovery::open_states()).await?;
        let message = format!("its node {name} was removed from the cluster");
        for row in rows.into_iter().filter(|r| r.node == entry.name) {
            self.mark_lost(&row.id, &message).await?;
        }
        self.store
            .node_event(
                "node_removed",
                &format!("node {name} was removed"),
                &now_rfc3339(),
            )
            .await?;
        Ok(())
    }

    /// Cordons a node, lets its sandboxes end by themselves until
    /// `deadline`, then destroys those left (reason `node_drained`). Runs
    /// in the background; the node's sandbox count shows the progress.
    pub async fn drain_node(
        self: &Arc<Self>,
        name: &str,
        deadline: std::time::Duration,
    ) -> Result<(), ApiError> {
        self.set_cordoned(name, true).await?;
        let message = format!(
            "node {name} drains: its sandboxes are destroyed in {}s unless they end first",
            deadline.as_secs()
        );
        self.store
            .node_event("node_draining", &message, &now_rfc3339())
            .await?;
        let (this, name) = (self.clone(), name.to_string());
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + deadline;
            loop {
                let left = this.live_on(&name).await;
                if left.is_empty() {
                    return;
                }
                if tokio::time::Instant::now() >= until {
                    for id in left {
                        if let Err(e) = this.destroy(&id, reason::NODE_DRAINED).await {
                            tracing::warn!(sandbox = %id, error = %e.message, "destroying a drained sandbox");
                        }
                    }
                    return;
                }
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                    _ = this.lifecycle.stopped() => return,
                }
            }
        });
        Ok(())
    }

    /// The open records on `node` (queued ones have no node yet).
    async fn live_on(&self, node: &str) -> Vec<String> {
        match self.store.list(&super::recovery::open_states()).await {
            Ok(rows) => rows
                .into_iter()
                .filter(|r| r.node == node && r.state != SandboxState::Queued)
                .map(|r| r.id)
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "listing a draining node's sandboxes");
                vec![node.to_string()]
            }
        }
    }

    /// Pulls `entry`'s shipping journal into the store for as long as it is
    /// the node registered under its name and the control plane runs (see
    /// `log_shipping`).
    pub(crate) async fn ship_node_logs(self: Arc<Self>, entry: Arc<NodeEntry>) {
        use crate::log_shipping::{pull, retry_after, PULL_WAIT};
        use std::time::Duration;
        // None: read it from the store (at start, and after a failure).
        let mut cursor: Option<Option<crate::store::LogCursor>> = None;
        let mut backoff = Duration::from_millis(500);
        while self.nodes.is_current(&entry) && !self.lifecycle.is_stopping() {
            let known = match &cursor {
                Some(c) => c.clone(),
                None => match self.store.log_cursor(&entry.name).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(node = %entry.name, error = %e, "reading a node's log cursor");
                        self.pause(backoff).await;
                        continue;
                    }
                },
            };
            let step = pull(
                self.store.as_ref(),
                entry.api.as_ref(),
                &entry.name,
                known.as_ref(),
                PULL_WAIT,
            );
            let done = tokio::select! {
                r = step => r,
                _ = self.lifecycle.stopped() => return,
            };
            match done {
                Ok(next) => {
                    cursor = Some(next);
                    backoff = Duration::from_millis(500);
                }
                Err(e) => match retry_after(&e) {
                    Some(later) => {
                        tracing::debug!(node = %entry.name, error = %e, "the node ships no logs");
                        cursor = Some(known);
                        self.pause(later).await;
                    }
                    None => {
                        tracing::debug!(node = %entry.name, error = %e, "shipping a node's logs; retrying");
                        // Read again: another writer, or a write whose
                        // commit is in doubt, may have moved it.
                        cursor = None;
                        self.pause(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                    }
                },
            }
        }
    }

    async fn pause(&self, d: std::time::Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.lifecycle.stopped() => {}
        }
    }

    /// Deletes kept logs past the retention and the size bound, every
    /// minute (a short retention: every half of it), until the control
    /// plane stops.
    pub async fn expire_kept_logs(self: Arc<Self>) {
        let every = (self.log_limits().retention / 2).clamp(
            std::time::Duration::from_millis(200),
            std::time::Duration::from_secs(60),
        );
        loop {
            let (before, max) = crate::log_shipping::expiry(self.log_limits());
            match self.store.expire_log_entries(before, max).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    deleted = n,
                    "kept logs past their retention or size bound deleted"
                ),
                Err(e) => tracing::warn!(error = %e, "deleting old kept logs"),
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = self.lifecycle.stopped() => return,
            }
        }
    }

    fn known_node(&self, name: &str) -> Result<Arc<NodeEntry>, ApiError> {
        self.nodes.get(name).ok_or_else(|| {
            ApiError::not_found(format!("no node named {name:?}; see `warren node ls`"))
        })
    }
}
