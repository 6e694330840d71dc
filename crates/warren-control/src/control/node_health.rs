//! The lifecycle's side of the nodes: what each node reports of itself
//! (heartbeats), and what happens to its sandboxes when it falls silent
//! (unreachable, then lost), comes back (reconciled), drains or is removed.
//! Which nodes there are is the membership's (`node_set.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use warren_core::clock::now_rfc3339;
use warren_core::state::reason;
use warren_core::{ApiError, SandboxState};
use warren_node_api::NodeInfo;

use super::Control;
use crate::nodes::{Health, NodeEntry};

impl Control {
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
            tokio::spawn(self.log_keeper.clone().ship_node_logs(entry.clone()));
        }
    }

    /// Removes a node from the cluster: its sandboxes are `lost` (what
    /// still runs there is the node's to clean up: it destroys what the
    /// control plane no longer knows when it joins again).
    pub async fn remove_node(self: &Arc<Self>, name: &str) -> Result<(), ApiError> {
        let entry = self.node_set.known(name)?;
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
        self.node_set.set_cordoned(name, true).await?;
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
}
