//! The control plane's own life: reconciling its records with the node at
//! start, retrying failed destroys, and a clean stop.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt;
use warren_core::clock::now_rfc3339;
use warren_core::state::reason;
use warren_core::{ApiError, SandboxState};
use warren_node_api::{NodeEvent, Phase, SandboxStatus};

use super::{note, Control};
use crate::admission::{Admit, Request};
use crate::node_errors::node_error;
use crate::nodes::NodeEntry;
use crate::store::{SandboxRow, Transition};

/// Every state a record can still leave.
pub(crate) fn open_states() -> Vec<SandboxState> {
    SandboxState::ALL
        .into_iter()
        .filter(|s| !s.is_final())
        .collect()
}

/// The expiries a node reported and still keeps in its feed, by sandbox
/// (the newest): what is there is read at once, not waited for.
async fn expiries(entry: &NodeEntry) -> HashMap<String, String> {
    const QUIET: std::time::Duration = std::time::Duration::from_millis(200);
    let mut found = HashMap::new();
    let Ok(mut feed) = entry.api.events(0).await else {
        return found;
    };
    while let Ok(Some(ev)) = tokio::time::timeout(QUIET, feed.next()).await {
        if let NodeEvent::Expired { id, reason } = ev.event {
            found.insert(id, reason);
        }
    }
    found
}

/// Records brought in line at once after a restart.
pub(crate) const RECOVER_PARALLELISM: usize = 32;
impl Control {
    /// At start-up: every open record is reconciled with what the node
    /// holds (the node takes its sandboxes over by itself, from its own
    /// journal). A record whose sandbox the node holds keeps its state (and
    /// its capacity); one whose sandbox is gone becomes `lost`; interrupted
    /// creates and destroys are finished; queued creates queue again in
    /// their order; a sandbox the node holds without an open record is
    /// destroyed. The API answers once this is done (`/healthz` at once).
    pub async fn recover(self: &Arc<Self>) -> Result<(), ApiError> {
        let now = now_rfc3339();
        for id in self.store.fail_unreadable(&now).await? {
            tracing::warn!(sandbox = %id, "its record could not be read; marked failed");
        }
        self.tenants.load().await?;
        let rows = self.store.list(&open_states()).await?;
        let total = rows.len();
        self.lifecycle.recovering(0, total);
        let done = std::sync::atomic::AtomicUsize::new(0);
        let progress = || {
            let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            self.lifecycle.recovering(n, total);
        };
        // Queued creates wait for what the held sandboxes hold, in their
        // old order: admitted after every other record, one by one.
        let (queued, mut others): (Vec<SandboxRow>, Vec<SandboxRow>) = rows
            .into_iter()
            .partition(|r| r.state == SandboxState::Queued);
        // Records on a node that is no longer part of the cluster.
        let (orphaned, placed): (Vec<SandboxRow>, Vec<SandboxRow>) = others
            .drain(..)
            .partition(|r| self.nodes.get(&r.node).is_none());
        for row in orphaned {
            let message = format!("its node {:?} is no longer part of the cluster", row.node);
            self.mark_lost(&row.id, &message).await?;
            progress();
        }
        let mut by_node: HashMap<String, Vec<SandboxRow>> = HashMap::new();
        for row in placed {
            by_node.entry(row.node.clone()).or_default().push(row);
        }
        let nodes = self.nodes.all().into_iter().map(|entry| {
            let rows = by_node.remove(&entry.name).unwrap_or_default();
            let progress = &progress;
            async move {
                let n = rows.len();
                if let Err(e) = self.recover_node(&entry, Some(rows)).await {
                    // It is reconciled when it is heard from again, or given
                    // up when it stays silent.
                    tracing::warn!(node = %entry.name, error = %e.message, "reconciling a node at start-up");
                }
                for _ in 0..n {
                    progress();
                }
            }
        });
        futures_util::future::join_all(nodes).await;
        for row in queued {
            if let Err(e) = self.requeue(row.clone()).await {
                tracing::warn!(sandbox = %row.id, error = %e.message, "queueing a create again");
            }
            progress();
        }
        Ok(())
    }

    /// Brings one node and the records of its sandboxes in line (`rows`:
    /// its open records, read here when None): a record whose sandbox the
    /// node holds keeps its state (and its capacity); one whose sandbox is
    /// gone becomes `lost`; interrupted creates and destroys are finished;
    /// a sandbox the node holds without an open record is destroyed. Then
    /// the node takes placements and its events are followed.
    pub(crate) async fn recover_node(
        self: &Arc<Self>,
        entry: &Arc<NodeEntry>,
        rows: Option<Vec<SandboxRow>>,
    ) -> Result<(), ApiError> {
        if entry.update(|v| std::mem::replace(&mut v.reconciling, true)) {
            return Ok(());
        }
        let result = self.recover_node_now(entry, rows).await;
        let schedulable = entry.update(|v| {
            v.reconciling = false;
            v.reconciled = result.is_ok();
            v.schedulable()
        });
        self.admission.set_schedulable(&entry.name, schedulable);
        if result.is_ok() {
            self.follow_events_once(entry);
        }
        result
    }

    async fn recover_node_now(
        self: &Arc<Self>,
        entry: &Arc<NodeEntry>,
        rows: Option<Vec<SandboxRow>>,
    ) -> Result<(), ApiError> {
        let rows = match rows {
            Some(rows) => rows,
            None => self
                .store
                .list(&open_states())
                .await?
                .into_iter()
                .filter(|r| r.node == entry.name && r.state != SandboxState::Queued)
                .collect(),
        };
        let held = match entry.api.inventory().await {
            Ok(held) => held,
            Err(e) => {
                // Until it answers, what its sandboxes hold stays taken.
                for row in rows.iter().filter(|r| r.state.is_live()) {
                    self.hold_row(row).await;
                }
                return Err(node_error(e));
            }
        };
        tracing::info!(
            node = %entry.name,
            records = rows.len(),
            held = held.len(),
            "reconciling records with a node"
        );
        let held: HashMap<String, SandboxStatus> =
            held.into_iter().map(|s| (s.id.clone(), s)).collect();
        let known: std::collections::HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        for id in held.keys().filter(|id| !known.contains(id.as_str())) {
            tracing::info!(node = %entry.name, sandbox = %id, "the node holds a sandbox without an open record; destroying it");
            if let Err(e) = entry.api.destroy(id, reason::NODE_LOST).await {
                tracing::warn!(sandbox = %id, error = %e, "destroying an unknown sandbox");
            }
        }
        // A record whose sandbox the node no longer holds may have been
        // ended by the node alone (an expiry nobody answered while the
        // control plane was away): its report says so.
        let missing = rows
            .iter()
            .any(|r| r.state.is_live() && !held.contains_key(&r.id));
        let expired = if missing {
            expiries(entry).await
        } else {
            HashMap::new()
        };
        futures_util::stream::iter(&rows)
            .for_each_concurrent(RECOVER_PARALLELISM, |row| {
                let (held, expired) = (&held, &expired);
                async move {
                    let ended = expired.get(&row.id).map(String::as_str);
                    if let Err(e) = self.recover_one(row, held.get(&row.id), ended).await {
                        tracing::warn!(sandbox = %row.id, error = %e.message, "recovering a sandbox");
                    }
                }
            })
            .await;
        Ok(())
    }

    /// Marks an open record `lost` (its sandbox is gone, or cannot be
    /// reached any more); its capacity is free again.
    /// A batch that asked for it gets the sandbox again, elsewhere.
    pub(crate) async fn mark_lost(
        self: &Arc<Self>,
        id: &str,
        message: &str,
    ) -> Result<(), ApiError> {
        let _one = self.sandbox_locks.lock(id).await;
        let row = self.records.row(id).await?;
        if row.state.is_final() {
            return Ok(());
        }
        let now = now_rfc3339();
        let t = Transition {
            finished_at: Some(&now),
            message,
            ..Default::default()
        };
        self.store
            .transition(id, SandboxState::Lost, reason::NODE_LOST, &now, t)
            .await?;
        self.admission.release(id);
        self.retry_member(&row, reason::NODE_LOST).await;
        Ok(())
    }

    /// One record at start-up, against what the node holds of it.
    pub(crate) async fn recover_one(
        self: &Arc<Self>,
        row: &SandboxRow,
        held: Option<&SandboxStatus>,
        expired: Option<&str>,
    ) -> Result<(), ApiError> {
        if held.is_some() {
            self.hold_row(row).await;
        }
        // What the node reported meanwhile (an expiry at take-over) may
        // have finished it already.
        let one = self.sandbox_locks.lock(&row.id).await;
        let row = &self.records.row(&row.id).await?;
        if row.state.is_final() {
            self.admission.release(&row.id);
            return Ok(());
        }
        drop(one);
        // Removing what is left of a sandbox can take seconds (processes
        // that die slowly); it runs beside the API, under the sandbox's lock.
        match row.state {
            SandboxState::Creating => {
                let (this, id) = (self.clone(), row.id.clone());
                let node = self.nodes.api(&row.node)?;
                tokio::spawn(async move {
                    let _one = this.sandbox_locks.lock(&id).await;
                    let _ = node.destroy(&id, reason::CREATE_FAILED).await;
                    this.admission.release(&id);
                    let now = now_rfc3339();
                    let t = Transition {
                        finished_at: Some(&now),
                        message: "the daemon stopped while creating it; its remains were removed",
                        ..Default::default()
                    };
                    let failed = SandboxState::Failed;
                    let why = reason::CREATE_FAILED;
                    if let Err(e) = this.store.transition(&id, failed, why, &now, t).await {
                        tracing::warn!(sandbox = %id, error = %e, "recording an interrupted create");
                    }
                });
                return Ok(());
            }
            SandboxState::Stopping if !row.grace => {
                // Failures stay `stopping` and are retried (reconcile).
                let (this, id, why) = (self.clone(), row.id.clone(), row.reason.clone());
                tokio::spawn(async move {
                    let _one = this.sandbox_locks.lock(&id).await;
                    if let Err(e) = this.destroy_locked(&id, &why).await {
                        tracing::warn!(sandbox = %id, error = %e.message, "finishing a destroy");
                    }
                });
                return Ok(());
            }
            _ => {}
        }
        // Running, paused, kept, or frozen in a grace period.
        let Some(held) = held else {
            if let Some(why) = expired {
                // Ended by its node on its expiry while the control plane
                // was away: destroyed for that reason (the node's destroy
                // is idempotent), not lost.
                tracing::info!(sandbox = %row.id, reason = why, "its node ended it on its expiry while the control plane was away");
                let why = if row.state == SandboxState::Kept {
                    reason::KEEP_EXPIRED
                } else {
                    why
                };
                let _one = self.sandbox_locks.lock(&row.id).await;
                return self.destroy_locked(&row.id, why).await.map(|_| ());
            }
            tracing::warn!(sandbox = %row.id, state = %row.state, "its node does not hold it; marked lost");
            return self
                .mark_lost(
                    &row.id,
                    "its processes were gone when its node was reconciled",
                )
                .await;
        };
        // A crash between the node's change and its record: the node
        // follows the record, which is what a client was told.
        let node = self.nodes.api(&row.node)?;
        let fix = match (row.state, held.phase) {
            (SandboxState::Running, Phase::Paused) => node.set_paused(&row.id, false).await,
            (SandboxState::Paused, Phase::Running) => node.set_paused(&row.id, true).await,
            (SandboxState::Kept, Phase::Running | Phase::Paused) => node
                .hold(&row.id, row.spec.keep_for(), note("kept", &row.reason, ""))
                .await
                .map(|_| ()),
            (SandboxState::Stopping, Phase::Running | Phase::Paused) => node
                .hold(
                    &row.id,
                    row.spec.delay_for(),
                    note("stopping", &row.reason, ""),
                )
                .await
                .map(|_| ()),
            _ => Ok(()),
        };
        if let Err(e) = fix {
            tracing::warn!(sandbox = %row.id, error = %e, "bringing the sandbox in line with its record");
        }
        tracing::info!(sandbox = %row.id, state = %row.state, "adopted after restart");
        Ok(())
    }

    /// A create that was waiting for capacity when the daemon stopped: its
    /// client was told `queued`, so it queues again (in its old order).
    pub(crate) async fn requeue(self: &Arc<Self>, row: SandboxRow) -> Result<(), ApiError> {
        let priority = self.tenants.spec(&row.tenant).await?.priority_of(&row.spec);
        let mut ask = Request::of(&row.spec, &row.resources, &row.image_digest)
            .for_tenant(row.tenant.clone(), priority);
        // A fork's child can only be made where its source's layers are.
        if let Some(fork) = &row.spec.fork {
            ask.node = self.store.get(&fork.source).await?.map(|s| s.node);
        }
        let admitted = self.admission.admit(&row.id, ask);
        let this = self.clone();
        match admitted {
            Ok(Admit::Now(node)) => {
                tokio::spawn(async move { this.start_queued(row, node).await });
            }
            Ok(Admit::Queued { ready, .. }) => {
                tokio::spawn(this.wait_then_start(row, ready));
            }
            Err(e) => {
                let now = now_rfc3339();
                let message = format!("could not queue it again after a restart: {e}");
                let t = Transition {
                    finished_at: Some(&now),
                    message: &message,
                    ..Default::default()
                };
                self.store
                    .transition(
                        &row.id,
                        SandboxState::Failed,
                        reason::CREATE_FAILED,
                        &now,
                        t,
                    )
                    .await?;
            }
        }
        Ok(())
    }

    /// Retries destroys that failed (they stay `stopping`), until they
    /// succeed. Runs until the daemon stops.
    pub async fn reconcile(self: Arc<Self>) {
        const EVERY: std::time::Duration = std::time::Duration::from_secs(10);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(EVERY) => {}
                _ = self.lifecycle.stopped() => return,
            }
            let Ok(rows) = self.store.list(&[SandboxState::Stopping]).await else {
                continue;
            };
            for row in rows.into_iter().filter(|r| !r.grace) {
                let _one = self.sandbox_locks.lock(&row.id).await;
                // Finished meanwhile by whoever held the lock?
                match self.records.row(&row.id).await {
                    Ok(now) if now.state == SandboxState::Stopping && !now.grace => {}
                    _ => continue,
                }
                if let Err(e) = self.destroy_locked(&row.id, &row.reason).await {
                    tracing::warn!(sandbox = %row.id, error = %e.message, "retrying a destroy");
                }
            }
        }
    }

    /// Clean stop: creates are refused and the queue is emptied (queued
    /// creates end `destroyed`, reason `shutdown`), streams end, the creates
    /// under way (a pool's refills among them) finish, then every live
    /// sandbox is destroyed, each within `grace`. What is not done by then
    /// stays for the next start to adopt or sweep.
    pub async fn shutdown(&self, grace: std::time::Duration) {
        self.lifecycle.stop();
        self.admission.close();
        if !self.destroy_on_stop {
            return;
        }
        // A create under way may write its record after the list below.
        if !self.lifecycle.creates_done(grace).await {
            tracing::warn!(
                "creates still under way at shutdown; the next start sweeps what they leave"
            );
        }
        let live: Vec<SandboxState> = SandboxState::ALL
            .into_iter()
            .filter(|s| !s.is_final())
            .collect();
        let rows = match self.store.list(&live).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "listing the live sandboxes at shutdown; the next start destroys them");
                return;
            }
        };
        let all = rows.iter().map(|r| async {
            match tokio::time::timeout(grace, self.destroy(&r.id, reason::SHUTDOWN)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(sandbox = %r.id, error = %e.message, "destroy at shutdown"),
                Err(_) => tracing::warn!(sandbox = %r.id, "destroy at shutdown did not finish in time; the next start finishes it"),
            }
        });
        futures_util::future::join_all(all).await;
    }

    /// Counts a record's sandbox, adopted as it runs, against its tenant's
    /// quota and share.
    pub(crate) async fn hold_row(&self, row: &SandboxRow) {
        // A tenant cannot be removed while it holds a sandbox; were its
        // spec unreadable, the sandbox still counts, at priority 0.
        let priority = match self.tenants.spec(&row.tenant).await {
            Ok(t) => t.priority_of(&row.spec),
            Err(_) => row.spec.priority.unwrap_or(0),
        };
        let need = crate::admission::Need::of(&row.resources);
        self.admission
            .hold_for(&row.id, &row.node, need, &row.tenant, priority);
    }
}
