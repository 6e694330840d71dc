//! The control plane's decisions: validating and recording sandboxes, asking
//! the node to run them (only through the node contract), and reacting to
//! what the node reports.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use rand::Rng;
use warren_core::clock::now_rfc3339;
use warren_core::spec::ReclaimPolicy;
use warren_core::state::reason;
use warren_core::{
    ApiError, ExecEvent, ExecRequest, SandboxInfo, SandboxSpec, SandboxState, Selector,
};
use warren_node_api::{
    CreateSandbox, ErrorKind, LogNote, NodeApi, NodeError, NodeEvent, Phase, SandboxStatus,
};

use crate::admission::{Admission, Admit, AdmitError, Need};
use crate::store::{SandboxRow, Store, StoreError, Transition};

pub struct Control {
    pub store: Arc<dyn Store>,
    /// The node, through its contract (in-process or over the network).
    pub node: Arc<dyn NodeApi>,
    pub node_name: String,
    /// The FIFO queue and what each sandbox holds of the node.
    pub admission: Admission,
    /// Whether a clean stop destroys every sandbox (`warren up`); a
    /// control plane of a cluster stops without touching its nodes.
    pub destroy_on_stop: bool,
    pub metrics: crate::metrics::Metrics,
    /// Profile updates are read-modify-write; runs finishing together must
    /// not lose each other's update.
    pub profile_lock: tokio::sync::Mutex<()>,
    pub(crate) sandbox_locks: crate::sandbox_locks::SandboxLocks,
    /// How profiles learn (margins, window, growth cap).
    pub policy: warren_core::profile::Policy,
    pub lifecycle: crate::lifecycle::Lifecycle,
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::internal(format!("state store: {e}"))
    }
}

/// What a client sees of a node's error: the category decides the status,
/// the node's message (which says what to do) is kept.
pub fn node_error(e: NodeError) -> ApiError {
    use warren_core::ErrorCode;
    let (code, retry_after_ms) = match e.kind {
        ErrorKind::NotFound => (ErrorCode::NotFound, None),
        ErrorKind::Conflict => (ErrorCode::Conflict, None),
        ErrorKind::Invalid => (ErrorCode::BadRequest, None),
        ErrorKind::NoRoom => (ErrorCode::NoCapacity, Some(5000)),
        ErrorKind::Unavailable => (ErrorCode::Unavailable, Some(1000)),
        ErrorKind::Upstream => (ErrorCode::BadGateway, None),
        ErrorKind::Internal => (ErrorCode::Internal, None),
    };
    ApiError {
        code,
        message: e.message,
        retry_after_ms,
    }
}

/// What a sandbox holds of its node.
pub fn need_of(r: &warren_core::ResolvedResources) -> Need {
    Need::of(r)
}

fn note(state: &str, reason: &str, message: &str) -> LogNote {
    LogNote {
        state: state.into(),
        reason: reason.into(),
        message: message.into(),
    }
}

/// `<prefix>-` and 12 random lowercase letters or digits.
pub fn new_id_with(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut rng = rand::rng();
    let suffix: String = (0..12)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}-{suffix}")
}

fn new_id() -> String {
    new_id_with("sbx")
}

impl Control {
    /// A control plane over `node` (which described itself as `info`).
    pub fn new(
        store: Arc<dyn Store>,
        node: Arc<dyn NodeApi>,
        info: warren_node_api::NodeInfo,
        queue_limit: usize,
        policy: warren_core::profile::Policy,
        destroy_on_stop: bool,
    ) -> Control {
        Control {
            store,
            node,
            node_name: info.name,
            admission: Admission::new(info.allocatable, info.max_pids, queue_limit),
            destroy_on_stop,
            metrics: crate::metrics::Metrics::new(),
            profile_lock: tokio::sync::Mutex::new(()),
            sandbox_locks: Default::default(),
            policy,
            lifecycle: Default::default(),
        }
    }

    /// A record as a client sees it, with what its node says of it now.
    pub async fn info(&self, row: SandboxRow, detailed: bool) -> SandboxInfo {
        let status = if row.state.is_live() {
            self.node.status(&row.id).await.ok()
        } else {
            None
        };
        self.info_with(row, status.as_ref(), detailed)
    }

    pub fn info_with(
        &self,
        row: SandboxRow,
        status: Option<&SandboxStatus>,
        detailed: bool,
    ) -> SandboxInfo {
        let status = status.filter(|_| row.state.is_live());
        let queue_position = if row.state == SandboxState::Queued {
            self.admission.position(&row.id)
        } else {
            None
        };
        SandboxInfo {
            host_id_base: status.and_then(|s| s.host_id_base).filter(|_| detailed),
            queue_position,
            ttl_remaining_ms: status.map(|s| s.ttl_remaining_ms),
            lease_remaining_ms: status.and_then(|s| s.lease_remaining_ms),
            usage: status.and_then(|s| s.usage.clone()).filter(|_| detailed),
            pid: status.map(|s| s.pid),
            id: row.id,
            state: row.state,
            reason: row.reason,
            spec: row.spec,
            resources: row.resources,
            node: row.node,
            image_digest: row.image_digest,
            created_at: row.created_at,
            started_at: row.started_at,
            finished_at: row.finished_at,
            exit_code: row.exit_code,
            events: vec![],
        }
    }

    /// What the node holds, by sandbox (empty when it cannot be asked).
    pub async fn inventory(&self) -> HashMap<String, SandboxStatus> {
        match self.node.inventory().await {
            Ok(list) => list.into_iter().map(|s| (s.id.clone(), s)).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "asking the node for its sandboxes");
                HashMap::new()
            }
        }
    }

    /// Events after `after` (of one sandbox, or all), oldest first.
    pub async fn events(
        &self,
        sandbox: Option<&str>,
        after: i64,
        limit: i64,
    ) -> Result<Vec<warren_core::Event>, ApiError> {
        Ok(self.store.events(sandbox, after, limit).await?)
    }

    /// Changes whenever an event is written (for followers).
    pub fn event_writes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.store.subscribe_events()
    }

    /// Renews a sandbox's lease (any call on a sandbox does).
    pub async fn touch(&self, id: &str) {
        if let Err(e) = self.node.renew_lease(id).await {
            tracing::debug!(sandbox = %id, error = %e, "renewing a lease");
        }
    }

    pub async fn get(&self, id: &str) -> Result<SandboxRow, ApiError> {
        self.store.get(id).await?.ok_or_else(|| {
            ApiError::not_found(format!(
                "no sandbox with id {id:?}; list them with `warren ps`"
            ))
        })
    }

    /// Validates, admits (or queues) and creates a sandbox. The work runs in
    /// its own task, so a client that disconnects cannot leave a sandbox
    /// half made. With `wait == false` a queued create answers at once.
    pub async fn create(
        self: &Arc<Self>,
        mut spec: SandboxSpec,
        wait: bool,
    ) -> Result<(SandboxInfo, bool), ApiError> {
        let started = std::time::Instant::now();
        self.lifecycle.refuse_if_stopping()?;
        self.apply_profile(&mut spec).await?;
        let resources = spec
            .resolve()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        if let Some(rid) = &spec.request_id {
            if let Some(existing) = self.store.by_request_id(rid).await? {
                let settled = self.settled(existing, wait).await?;
                return Ok((self.info(settled, false).await, false));
            }
        }
        let load = self.node.info().await.map_err(node_error)?.load;
        if load.disk_pressure {
            return Err(ApiError {
                code: warren_core::ErrorCode::NoCapacity,
                message: "the node's disk is below its free-space floor; no sandboxes start until space is freed (see `warren ps` and docs/configuration.md)".into(),
                retry_after_ms: Some(5000),
            });
        }
        let image = self
            .node
            .image_for_create(&spec.image)
            .await
            .map_err(node_error)?;
        let id = new_id();
        let admit = self
            .admission
            .admit(&id, need_of(&resources), resources.pids)
            .map_err(|e| match e {
                AdmitError::QueueFull(_) => ApiError {
                    code: warren_core::ErrorCode::TooManyRequests,
                    message: e.to_string(),
                    retry_after_ms: Some(1000),
                },
                AdmitError::Closed => {
                    ApiError::new(warren_core::ErrorCode::Unavailable, e.to_string())
                }
                AdmitError::NeverFits { .. } | AdmitError::TooManyPids { .. } => {
                    ApiError::bad_request(e.to_string())
                }
            })?;
        let queued = matches!(admit, Admit::Queued { .. });
        let row = SandboxRow {
            id: id.clone(),
            state: if queued {
                SandboxState::Queued
            } else {
                SandboxState::Creating
            },
            reason: if queued {
                reason::QUEUED.into()
            } else {
                reason::CREATED.into()
            },
            spec: spec.clone(),
            resources: resources.clone(),
            node: self.node_name.clone(),
            image_digest: image.digest.clone(),
            created_at: now_rfc3339(),
            started_at: None,
            finished_at: None,
            exit_code: None,
            grace: false,
        };
        let this = self.clone();
        let task = match admit {
            Admit::Now => tokio::spawn(async move { this.create_admitted(row).await }),
            Admit::Queued { ready, .. } => {
                // The queued record is what a client polls; it must exist first.
                if let Err(e) = self.store.insert(&row, spec.request_id.as_deref()).await {
                    self.admission.release(&id);
                    return self.insert_failed(e, &spec).await;
                }
                let task = tokio::spawn(this.wait_then_start(row, ready));
                if !wait {
                    let row = self.get(&id).await?;
                    return Ok((self.info(row, false).await, true));
                }
                task
            }
        };
        let result = task
            .await
            .map_err(|e| ApiError::internal(format!("create task: {e}")))?;
        if result.is_ok() {
            self.metrics
                .create_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        result
    }

    /// A queued create: waits for its capacity, then creates.
    async fn wait_then_start(
        self: Arc<Self>,
        row: SandboxRow,
        ready: tokio::sync::oneshot::Receiver<()>,
    ) -> Result<(SandboxInfo, bool), ApiError> {
        let queued_at = std::time::Instant::now();
        let waited = ready.await;
        self.metrics
            .queue_wait_seconds
            .observe(queued_at.elapsed().as_secs_f64());
        if waited.is_err() {
            return Err(ApiError::conflict(format!(
                "sandbox {} left the queue before its turn (deleted, or the daemon is stopping)",
                row.id
            )));
        }
        self.start_queued(row).await
    }

    /// A replayed create (same request id) answers what the first one
    /// made, once it is past `creating` (and `queued`, when the caller
    /// waits): the first create's answer would have been no earlier.
    async fn settled(&self, mut row: SandboxRow, wait: bool) -> Result<SandboxRow, ApiError> {
        loop {
            let busy =
                row.state == SandboxState::Creating || (wait && row.state == SandboxState::Queued);
            if !busy {
                return Ok(row);
            }
            // The create holds the sandbox's lock until it is done.
            drop(self.sandbox_locks.lock(&row.id).await);
            if row.state == SandboxState::Queued {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            row = self.get(&row.id).await?;
        }
    }

    async fn insert_failed(
        &self,
        e: StoreError,
        spec: &SandboxSpec,
    ) -> Result<(SandboxInfo, bool), ApiError> {
        // A concurrent create with the same request id won the race.
        if let (true, Some(rid)) = (e.is_duplicate(), &spec.request_id) {
            if let Some(existing) = self.store.by_request_id(rid).await? {
                let settled = self.settled(existing, true).await?;
                return Ok((self.info(settled, false).await, false));
            }
        }
        Err(e.into())
    }

    /// Capacity is reserved: record and create side by side. A crash in
    /// between leaves either a record without a sandbox (marked failed at
    /// restart) or a sandbox without a record (swept at restart).
    async fn create_admitted(&self, row: SandboxRow) -> Result<(SandboxInfo, bool), ApiError> {
        let id = row.id.clone();
        let _one = self.sandbox_locks.lock(&id).await;
        let (inserted, created) = tokio::join!(
            self.store.insert(&row, row.spec.request_id.as_deref()),
            self.node.create(create_request(&row))
        );
        if let Err(e) = inserted {
            if created.is_ok() {
                let _ = self.node.destroy(&id, reason::CREATE_FAILED).await;
            }
            self.admission.release(&id);
            return self.insert_failed(e, &row.spec).await;
        }
        warren_core::crashpoint::hit("create:recorded");
        self.finish_create(&id, created).await
    }

    /// A queued create whose turn has come.
    async fn start_queued(&self, row: SandboxRow) -> Result<(SandboxInfo, bool), ApiError> {
        let id = row.id.clone();
        let _one = self.sandbox_locks.lock(&id).await;
        // Deleted while it waited, after the capacity was granted?
        if self.get(&id).await?.state != SandboxState::Queued {
            self.admission.release(&id);
            return Err(ApiError::conflict(format!(
                "sandbox {id} was deleted while it waited for capacity"
            )));
        }
        let now = now_rfc3339();
        self.store
            .transition(
                &id,
                SandboxState::Creating,
                reason::ADMITTED,
                &now,
                Transition::default(),
            )
            .await?;
        let created = self.node.create(create_request(&row)).await;
        self.finish_create(&id, created).await
    }

    async fn finish_create(
        &self,
        id: &str,
        created: Result<(), NodeError>,
    ) -> Result<(SandboxInfo, bool), ApiError> {
        match created {
            Ok(()) => {
                let started = now_rfc3339();
                let t = Transition {
                    started_at: Some(&started),
                    ..Default::default()
                };
                self.store
                    .transition(id, SandboxState::Running, reason::READY, &started, t)
                    .await?;
                let _ = self.node.note(id, note("running", reason::READY, "")).await;
                let row = self.get(id).await?;
                if let Err(e) = self.node.start_main(id).await {
                    let message = e.to_string();
                    let _ = self.destroy_locked(id, reason::CREATE_FAILED).await;
                    return Err(ApiError::internal(format!(
                        "sandbox {id}: main process: {message}"
                    )));
                }
                Ok((self.info(row, false).await, true))
            }
            Err(e) => {
                self.admission.release(id);
                let message = e.to_string();
                let now = now_rfc3339();
                let t = Transition {
                    finished_at: Some(&now),
                    message: &message,
                    ..Default::default()
                };
                self.store
                    .transition(id, SandboxState::Failed, reason::CREATE_FAILED, &now, t)
                    .await?;
                Err(match node_error(e) {
                    ApiError {
                        code: warren_core::ErrorCode::Internal,
                        message,
                        ..
                    } => {
                        ApiError::internal(format!("sandbox {id} could not be created: {message}"))
                    }
                    other => other,
                })
            }
        }
    }

    pub async fn list(
        &self,
        states: &[SandboxState],
        selector: &Selector,
    ) -> Result<Vec<SandboxInfo>, ApiError> {
        let rows: Vec<SandboxRow> = self
            .store
            .list(states)
            .await?
            .into_iter()
            .filter(|r| selector.matches(r.labels()))
            .collect();
        let held = if rows.iter().any(|r| r.state.is_live()) {
            self.inventory().await
        } else {
            HashMap::new()
        };
        Ok(rows
            .into_iter()
            .map(|r| {
                let status = held.get(&r.id);
                self.info_with(r, status, false)
            })
            .collect())
    }

    /// Destroys a sandbox for `why`; an already final sandbox is left as is.
    pub async fn destroy(&self, id: &str, why: &str) -> Result<SandboxRow, ApiError> {
        let _one = self.sandbox_locks.lock(id).await;
        self.destroy_locked(id, why).await
    }

    /// `destroy` for a caller that holds the sandbox's lock.
    async fn destroy_locked(&self, id: &str, why: &str) -> Result<SandboxRow, ApiError> {
        let row = self.get(id).await?;
        if row.state.is_final() {
            return Ok(row);
        }
        if row.state == SandboxState::Queued {
            // Nothing exists on the host yet: leave the queue and finish.
            self.admission.release(id);
            let now = now_rfc3339();
            let t = Transition {
                finished_at: Some(&now),
                ..Default::default()
            };
            self.store
                .transition(id, SandboxState::Destroyed, why, &now, t)
                .await?;
            return self.get(id).await;
        }
        let now = now_rfc3339();
        if row.state != SandboxState::Stopping || row.grace {
            self.store
                .transition(id, SandboxState::Stopping, why, &now, Transition::default())
                .await?;
        }
        warren_core::crashpoint::hit("destroy:stopping");
        let usage = match self.node.destroy(id, why).await {
            Ok(usage) => usage,
            Err(e) => {
                // It stays `stopping`: a DELETE, the reconciler and a
                // restart all try again; nothing of it is forgotten.
                let message = format!("destroy failed, will be retried: {e}");
                self.store
                    .transition(
                        id,
                        SandboxState::Stopping,
                        why,
                        &now_rfc3339(),
                        Transition {
                            message: &message,
                            ..Default::default()
                        },
                    )
                    .await?;
                return Err(ApiError::internal(format!(
                    "destroy {id}: {e}; the sandbox stays 'stopping' and is retried (DELETE again to retry now)"
                )));
            }
        };
        self.admission.release(id);
        // Recorded before the sandbox shows as destroyed, so whoever sees
        // it destroyed also sees its run in the profile.
        if let Some(u) = &usage {
            if let Err(e) = self.record_run(&row, u, why == reason::OOM_KILLED).await {
                tracing::warn!(sandbox = %id, error = %e.message, "recording a profile run");
            }
        }
        let done = now_rfc3339();
        self.store
            .transition(
                id,
                SandboxState::Destroyed,
                why,
                &done,
                Transition {
                    finished_at: Some(&done),
                    ..Default::default()
                },
            )
            .await?;
        self.get(id).await
    }

    pub async fn exec(
        &self,
        id: &str,
        req: &ExecRequest,
    ) -> Result<BoxStream<'static, ExecEvent>, ApiError> {
        req.validate()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let row = self.get(id).await?;
        if row.state != SandboxState::Running {
            return Err(ApiError::conflict(format!(
                "sandbox {id} is {}; exec needs a running sandbox",
                row.state
            )));
        }
        self.node.exec(id, req.clone()).await.map_err(node_error)
    }

    /// Follows the node's event feed and applies the reclaim policy when a
    /// main process ends, a lifetime runs out or init dies. A decision that
    /// could not be recorded (the store failed) is tried again: the node
    /// reports each end once, and a TTL that fired must still end its
    /// sandbox when the store works again. A feed that ends (a lost
    /// connection) is followed again from the last event handled.
    pub async fn handle_node_events(self: Arc<Self>) {
        let mut seen = 0u64;
        loop {
            let mut feed = match self.node.events(seen).await {
                Ok(feed) => feed,
                Err(e) => {
                    tracing::warn!(error = %e, "following the node's events; retrying");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    continue;
                }
            };
            while let Some(ev) = feed.next().await {
                seen = ev.seq;
                let this = self.clone();
                tokio::spawn(async move { this.handle_node_event(ev.event).await });
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    async fn handle_node_event(self: Arc<Self>, ev: NodeEvent) {
        let mut wait = std::time::Duration::from_millis(200);
        loop {
            match self.on_node_event(ev.clone()).await {
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

    async fn on_node_event(self: &Arc<Self>, ev: NodeEvent) -> Result<(), ApiError> {
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
                let _ = self
                    .node
                    .note(id, note("running", reason::DISK_EXCEEDED, &message))
                    .await;
                // Kept, its processes are frozen and write no more; but a
                // node short of disk needs the space back.
                (id.clone(), true, reason::DISK_EXCEEDED, !*node_full)
            }
            NodeEvent::CpuSaturated { busy } => {
                let message = format!("node CPU {:.0}% busy for over 30s", busy * 100.0);
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
        let row = self.get(&id).await?;
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
            // Held sandboxes give their disk back when the node runs out.
            SandboxState::Kept | SandboxState::Stopping
                if matches!(
                    ev,
                    NodeEvent::DiskExceeded {
                        node_full: true,
                        ..
                    }
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
        let keep = match row.spec.reclaim {
            ReclaimPolicy::Keep => true,
            ReclaimPolicy::KeepOnFailure => failed,
            ReclaimPolicy::Destroy | ReclaimPolicy::Delay => false,
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
        self.retry_if_oom(&row, why).await;
        Ok(())
    }

    /// Freezes a finished sandbox and holds it in `state` for `hold_for`
    /// (its run is recorded for its profile first).
    async fn hold(
        &self,
        row: &SandboxRow,
        state: SandboxState,
        why: &str,
        hold_for: std::time::Duration,
        message: &str,
    ) -> Result<(), ApiError> {
        let id = &row.id;
        let held = self
            .node
            .hold(id, hold_for, note(state.as_str(), why, message))
            .await;
        match held {
            Ok(Some(u)) => {
                let _ = self.record_run(row, &u, why == reason::OOM_KILLED).await;
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

    /// Replaces a running sandbox's egress rules: recorded first (so a
    /// restart restores them), then applied, which cannot fail half-way: it
    /// closes the connections the new rules no longer allow, and reports
    /// ports that got no transparent listener.
    pub async fn set_network(
        &self,
        id: &str,
        allow: Vec<String>,
        deny: Vec<String>,
    ) -> Result<(SandboxRow, warren_node_api::PolicyChange), ApiError> {
        let _one = self.sandbox_locks.lock(id).await;
        let row = self.get(id).await?;
        if row.spec.network.mode != warren_core::spec::NetworkMode::Allowlist {
            return Err(ApiError::conflict(format!(
                "sandbox {id} has network mode '{}'; the mode is fixed at create, and only an 'allowlist' sandbox has rules to change",
                serde_json::to_value(row.spec.network.mode).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
            )));
        }
        if !matches!(row.state, SandboxState::Running | SandboxState::Paused) {
            return Err(ApiError::conflict(format!(
                "sandbox {id} is {}; only a running or paused sandbox has rules to change",
                row.state
            )));
        }
        let mut spec = row.spec.clone();
        spec.network.allow = allow;
        spec.network.deny = deny;
        spec.network
            .validate()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        self.node
            .check_network(spec.network.clone())
            .await
            .map_err(node_error)?;
        let message = format!(
            "allow {:?} deny {:?}",
            spec.network.allow, spec.network.deny
        );
        self.store
            .set_spec(
                id,
                &spec,
                &now_rfc3339(),
                "network_policy_changed",
                &message,
            )
            .await?;
        let change = self
            .node
            .set_network(id, spec.network.clone())
            .await
            .map_err(node_error)?;
        Ok((self.get(id).await?, change))
    }

    /// Pauses (freezes) or resumes a running sandbox, under the sandbox's
    /// lock, so a pause can never land on a sandbox being destroyed.
    pub async fn set_paused(&self, id: &str, paused: bool) -> Result<SandboxRow, ApiError> {
        let _one = self.sandbox_locks.lock(id).await;
        let row = self.get(id).await?;
        let (from, to, why) = if paused {
            (SandboxState::Running, SandboxState::Paused, reason::PAUSED)
        } else {
            (SandboxState::Paused, SandboxState::Running, reason::RESUMED)
        };
        if row.state == to {
            return Ok(row);
        }
        if row.state != from {
            return Err(ApiError::conflict(format!(
                "sandbox {id} is {}; only a {} sandbox can be {}",
                row.state,
                from,
                if paused { "paused" } else { "resumed" }
            )));
        }
        self.node.set_paused(id, paused).await.map_err(node_error)?;
        self.store
            .transition(id, to, why, &now_rfc3339(), Transition::default())
            .await?;
        let _ = self.node.note(id, note(to.as_str(), why, "")).await;
        self.get(id).await
    }
}

/// Records brought in line at once after a restart.
const RECOVER_PARALLELISM: usize = 32;

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
        let open: Vec<SandboxState> = SandboxState::ALL
            .into_iter()
            .filter(|s| !s.is_final())
            .collect();
        let rows = self.store.list(&open).await?;
        let total = rows.len();
        self.lifecycle.recovering(0, total);
        let held = self.node.inventory().await.map_err(node_error)?;
        tracing::info!(
            records = total,
            held = held.len(),
            "reconciling records with the node"
        );
        let held: HashMap<String, SandboxStatus> =
            held.into_iter().map(|s| (s.id.clone(), s)).collect();
        let known: std::collections::HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        for id in held.keys().filter(|id| !known.contains(id.as_str())) {
            tracing::info!(sandbox = %id, "the node holds a sandbox without an open record; destroying it");
            if let Err(e) = self.node.destroy(id, reason::NODE_LOST).await {
                tracing::warn!(sandbox = %id, error = %e, "destroying an unknown sandbox");
            }
        }
        // Queued creates wait for what the held sandboxes hold, in their
        // old order: admitted after every other record, one by one.
        let (queued, others): (Vec<SandboxRow>, Vec<SandboxRow>) = rows
            .into_iter()
            .partition(|r| r.state == SandboxState::Queued);
        let done = std::sync::atomic::AtomicUsize::new(0);
        futures_util::stream::iter(others)
            .for_each_concurrent(RECOVER_PARALLELISM, |row| {
                let (done, held) = (&done, &held);
                async move {
                    if let Err(e) = self.recover_one(&row, held.get(&row.id)).await {
                        tracing::warn!(sandbox = %row.id, error = %e.message, "recovering a sandbox");
                    }
                    let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    self.lifecycle.recovering(n, total);
                }
            })
            .await;
        for row in queued {
            if let Err(e) = self.requeue(row.clone()).await {
                tracing::warn!(sandbox = %row.id, error = %e.message, "queueing a create again");
            }
            let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            self.lifecycle.recovering(n, total);
        }
        Ok(())
    }

    /// One record at start-up, against what the node holds of it.
    async fn recover_one(
        self: &Arc<Self>,
        row: &SandboxRow,
        held: Option<&SandboxStatus>,
    ) -> Result<(), ApiError> {
        let now = now_rfc3339();
        if held.is_some() {
            self.admission.hold(&row.id, need_of(&row.resources));
        }
        // What the node reported meanwhile (an expiry at take-over) may
        // have finished it already.
        let one = self.sandbox_locks.lock(&row.id).await;
        let row = &self.get(&row.id).await?;
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
                tokio::spawn(async move {
                    let _one = this.sandbox_locks.lock(&id).await;
                    let _ = this.node.destroy(&id, reason::CREATE_FAILED).await;
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
            let _one = self.sandbox_locks.lock(&row.id).await;
            tracing::warn!(sandbox = %row.id, state = %row.state, "its node does not hold it; marked lost");
            let message = "its processes were gone after a daemon restart";
            let t = Transition {
                finished_at: Some(&now),
                message,
                ..Default::default()
            };
            self.store
                .transition(&row.id, SandboxState::Lost, reason::NODE_LOST, &now, t)
                .await?;
            return Ok(());
        };
        // A crash between the node's change and its record: the node
        // follows the record, which is what a client was told.
        let fix = match (row.state, held.phase) {
            (SandboxState::Running, Phase::Paused) => self.node.set_paused(&row.id, false).await,
            (SandboxState::Paused, Phase::Running) => self.node.set_paused(&row.id, true).await,
            (SandboxState::Kept, Phase::Running | Phase::Paused) => self
                .node
                .hold(&row.id, row.spec.keep_for(), note("kept", &row.reason, ""))
                .await
                .map(|_| ()),
            (SandboxState::Stopping, Phase::Running | Phase::Paused) => self
                .node
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
    async fn requeue(self: &Arc<Self>, row: SandboxRow) -> Result<(), ApiError> {
        let admitted = self
            .admission
            .admit(&row.id, need_of(&row.resources), row.resources.pids);
        let this = self.clone();
        match admitted {
            Ok(Admit::Now) => {
                tokio::spawn(async move { this.start_queued(row).await });
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
                match self.get(&row.id).await {
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
    /// creates end `destroyed`, reason `shutdown`), streams end, then every
    /// live sandbox is destroyed, each within `grace`. What is not done by
    /// then stays for the next start to adopt or sweep.
    pub async fn shutdown(&self, grace: std::time::Duration) {
        self.lifecycle.stop();
        self.admission.close();
        if !self.destroy_on_stop {
            return;
        }
        let live: Vec<SandboxState> = SandboxState::ALL
            .into_iter()
            .filter(|s| !s.is_final())
            .collect();
        let Ok(rows) = self.store.list(&live).await else {
            return;
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
}

/// What the node is asked to run for a record.
fn create_request(row: &SandboxRow) -> CreateSandbox {
    CreateSandbox {
        id: row.id.clone(),
        spec: row.spec.clone(),
        resources: row.resources.clone(),
        image_digest: row.image_digest.clone(),
    }
}
