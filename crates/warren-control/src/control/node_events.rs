//! What the node reports, and the reclaim policy it triggers: destroy,
//! keep, or hold for a grace period.

use std::sync::Arc;

use futures_util::StreamExt;
use warren_core::clock::now_rfc3339;
use warren_core::spec::ReclaimPolicy;
use warren_core::state::reason;
use warren_core::{ApiError, SandboxState};
use warren_node_api::NodeEvent;

use super::{note, Control};
use crate::store::{SandboxRow, Transition};

impl Control {
    /// Follows the node's event feed and applies the reclaim policy when a
    /// main process ends, a lifetime runs out or init dies. A decision that
    /// could not be recorded (the store failed) is tried again: the node
    /// reports each end once, and a TTL that fired must still end its
    /// sandbox when the store works again. A feed that ends (a lost
    /// connection) is followed again from the last event handled.
    ///
    /// Runs while `entry` is the node registered under its name and the
    /// control plane runs.
    pub async fn handle_node_events(self: Arc<Self>, entry: Arc<crate::nodes::NodeEntry>) {
        let mut seen = 0u64;
        while self.nodes.is_current(&entry) && !self.lifecycle.is_stopping() {
            let mut feed = match entry.api.events(seen).await {
                Ok(feed) => feed,
                Err(e) => {
                    tracing::debug!(node = %entry.name, error = %e, "following a node's events; retrying");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    continue;
                }
            };
            while let Some(ev) = feed.next().await {
                seen = ev.seq;
                let this = self.clone();
                let node = entry.name.clone();
                tokio::spawn(async move { this.handle_node_event(&node, ev.event).await });
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    pub(crate) async fn handle_node_event(self: Arc<Self>, node: &str, ev: NodeEvent) {
        let mut wait = std::time::Duration::from_millis(200);
        loop {
            match self.on_node_event(node, ev.clone()).await {
                Ok(()) => return,
                Err(e) if e.code != warren_core::ErrorCode::Internal => {
                    tracing::warn!(error = %e, "handling node event");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "handling node event; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(std::time::Duration::from_secs(30));
                }
            }
        }
    }

    pub(crate) async fn on_node_event(
        self: &Arc<Self>,
        node: &str,
        ev: NodeEvent,
    ) -> Result<(), ApiError> {
        // (sandbox, counts as a failure for keep_on_failure, why, may be kept)
        let (id, failed, why, keepable) = match &ev {
            NodeEvent::MainExited {
                id,
                exit,
                oom_killed,
            } => {
                self.store.set_exit_code(id, exit.code).await?;
                let why = if *oom_killed && exit.signal == Some(9) {
                    reason::OOM_KILLED
                } else {
                    reason::MAIN_EXITED
                };
                (id.clone(), exit.code != 0 || *oom_killed, why, true)
            }
            NodeEvent::Expired { id, reason } => (id.clone(), false, reason.as_str(), true),
            NodeEvent::DiskExceeded {
                id,
                used,
                limit,
                node_full,
            } => {
                let message = if *node_full {
                    format!(
                        "the node's disk ran low and this sandbox wrote the most ({used} bytes)"
                    )
                } else {
                    format!("its writable layer holds {used} bytes, over its disk limit of {limit}")
                };
                if let Some(api) = self.nodes.reachable(node) {
                    let _ = api
                        .note(id, note("running", reason::DISK_EXCEEDED, &message))
                        .await;
                }
                // Kept, its processes are frozen and write no more; but a
                // node short of disk needs the space back.
                (id.clone(), true, reason::DISK_EXCEEDED, !*node_full)
            }
            NodeEvent::MemoryPressure {
                id,
                used,
                request,
                available,
            } => {
                let message = format!(
                    "the host's available memory fell to {available} bytes, under the node's floor, and this sandbox used the most above its memory request ({used} bytes used, {request} requested)"
                );
                if let Some(api) = self.nodes.reachable(node) {
                    let _ = api
                        .note(id, note("running", reason::MEMORY_PRESSURE, &message))
                        .await;
                }
                (id.clone(), true, reason::MEMORY_PRESSURE, false)
            }
            NodeEvent::CpuSaturated { busy } => {
                let message = format!("node {node} CPU {:.0}% busy for over 30s", busy * 100.0);
                tracing::warn!("{message}");
                self.store
                    .node_event("node_cpu_saturated", &message, &now_rfc3339())
                    .await?;
                return Ok(());
            }
            NodeEvent::ImagePull { reason, message } => {
                self.store
                    .node_event(reason, message, &now_rfc3339())
                    .await?;
                return Ok(());
            }
            NodeEvent::InitDied { id, oom_killed } => {
                let why = if *oom_killed {
                    reason::OOM_KILLED
                } else {
                    reason::INIT_DIED
                };
                (id.clone(), true, why, false)
            }
        };
        let _one = self.sandbox_locks.lock(&id).await;
        let row = self.records.row(&id).await?;
        // A report from a node the sandbox is not (or no longer) on.
        if row.node != node {
            return Ok(());
        }
        match row.state {
            SandboxState::Running | SandboxState::Paused => {}
            // A kept sandbox's own expiry ends it.
            SandboxState::Kept if matches!(ev, NodeEvent::Expired { .. }) => {
                return self
                    .destroy_locked(&id, reason::KEEP_EXPIRED)
                    .await
                    .map(|_| ());
            }
            SandboxState::Kept if matches!(ev, NodeEvent::InitDied { .. }) => {
                return self.destroy_locked(&id, why).await.map(|_| ());
            }
            // Held sandboxes give their disk and memory back when the node
            // runs out.
            SandboxState::Kept | SandboxState::Stopping
                if matches!(
                    ev,
                    NodeEvent::DiskExceeded {
                        node_full: true,
                        ..
                    } | NodeEvent::MemoryPressure { .. }
                ) =>
            {
                return self.destroy_locked(&id, why).await.map(|_| ());
            }
            // A delayed destroy's grace period is over.
            SandboxState::Stopping if row.grace && matches!(ev, NodeEvent::Expired { .. }) => {
                return self.destroy_locked(&id, &row.reason).await.map(|_| ());
            }
            _ => return Ok(()),
        }
        if row.spec.reclaim == ReclaimPolicy::Pause && matches!(ev, NodeEvent::Expired { .. }) {
            return match row.state {
                SandboxState::Running => self.pause_at_expiry(&row, why).await,
                // Paused past its hold.
                _ => self
                    .destroy_locked(&id, reason::KEEP_EXPIRED)
                    .await
                    .map(|_| ()),
            };
        }
        let keep = match row.spec.reclaim {
            ReclaimPolicy::Keep => true,
            ReclaimPolicy::KeepOnFailure => failed,
            ReclaimPolicy::Destroy | ReclaimPolicy::Delay | ReclaimPolicy::Pause => false,
        };
        match (keepable, row.spec.reclaim) {
            // Grace period: frozen, files and logs readable, then destroyed.
            (true, ReclaimPolicy::Delay) => {
                let note = "destroyed after the grace period";
                self.hold(
                    &row,
                    SandboxState::Stopping,
                    why,
                    row.spec.delay_for(),
                    note,
                )
                .await?
            }
            // Processes the main one left behind stop where they are; the
            // filesystem stays for `inspect`, `cp` and `logs` until keep_for ends.
            (true, _) if keep => {
                self.hold(&row, SandboxState::Kept, why, row.spec.keep_for(), "")
                    .await?
            }
            _ => {
                self.destroy_locked(&id, why).await?;
            }
        }
        self.retry_member(&row, why).await;
        Ok(())
    }

    /// The `pause` policy at the sandbox's expiry: frozen with its memory,
    /// paused for `keep_for`, resumable (the caller holds its lock).
    async fn pause_at_expiry(&self, row: &SandboxRow, why: &str) -> Result<(), ApiError> {
        let node = self.nodes.api(&row.node)?;
        node.set_paused(&row.id, true)
            .await
            .map_err(super::node_error)?;
        node.set_ttl(&row.id, row.spec.keep_for())
            .await
            .map_err(super::node_error)?;
        let message = format!("paused for {:?} (reclaim pause)", row.spec.keep_for());
        self.store
            .transition(
                &row.id,
                SandboxState::Paused,
                why,
                &now_rfc3339(),
                Transition {
                    message: &message,
                    ..Default::default()
                },
            )
            .await?;
        let _ = node
            .note(&row.id, note(SandboxState::Paused.as_str(), why, &message))
            .await;
        Ok(())
    }

    /// Freezes a finished sandbox and holds it in `state` for `hold_for`
    /// (its run is recorded for its profile first).
    pub(crate) async fn hold(
        &self,
        row: &SandboxRow,
        state: SandboxState,
        why: &str,
        hold_for: std::time::Duration,
        message: &str,
    ) -> Result<(), ApiError> {
        let id = &row.id;
        let held = self
            .nodes
            .api(&row.node)?
            .hold(id, hold_for, note(state.as_str(), why, message))
            .await;
        match held {
            Ok(Some(u)) => {
                if let Err(e) = self.store.set_usage(id, &u).await {
                    tracing::warn!(sandbox = %id, error = %e, "keeping a held sandbox's usage");
                }
                let _ = self
                    .profiles
                    .record_run(row, &u, why == reason::OOM_KILLED)
                    .await;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(sandbox = %id, error = %e, "holding a finished sandbox"),
        }
        let t = Transition {
            grace: state == SandboxState::Stopping,
            ..Default::default()
        };
        self.store
            .transition(id, state, why, &now_rfc3339(), t)
            .await?;
        Ok(())
    }
}
