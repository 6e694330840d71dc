//! The control plane's decisions: validating and recording sandboxes, asking
//! the node to run them (only through the node contract), and reacting to
//! what the node reports.

use std::collections::HashMap;
use std::sync::Arc;
use warren_core::tenant::{Principal, TenantName};

use futures_util::stream::BoxStream;
use rand::Rng;
use tracing::Instrument;
use warren_core::clock::now_rfc3339;
use warren_core::state::reason;
use warren_core::{ApiError, ExecEvent, ExecRequest, SandboxInfo, SandboxState, Selector};
use warren_node_api::{LogNote, NodeApi, SandboxStatus};

use crate::admission::Admission;
use crate::node_errors::node_error;
use crate::store::{SandboxRow, Store, StoreError, Transition};

mod access;
mod create;
mod fork;
mod names;
mod node_events;
mod node_set;
mod pools;
mod preemption;
mod recovery;
mod run;
mod tenancy;

pub struct Control {
    pub(crate) store: Arc<dyn Store>,
    /// The nodes, each through its contract (in-process or over the
    /// network); shared with the services that call them.
    pub(crate) nodes: Arc<crate::nodes::Nodes>,
    /// The FIFO queue and what each sandbox holds of its node.
    pub(crate) admission: Admission,
    /// When a silent node is given up; None: never (`warren up`'s node).
    pub(crate) liveness: Option<crate::nodes::Liveness>,
    /// Whether a clean stop destroys every sandbox (`warren up`); a
    /// control plane of a cluster stops without touching its nodes.
    pub(crate) destroy_on_stop: bool,
    pub(crate) metrics: crate::metrics::Metrics,
    pub(crate) sandbox_locks: crate::sandbox_locks::SandboxLocks,
    /// The learned profiles and how they learn.
    pub(crate) profiles: crate::profiles::Profiles,
    pub(crate) lifecycle: crate::lifecycle::Lifecycle,
    pub(crate) pools: crate::pools::Pools,
    /// Image builds, running and recent.
    pub(crate) builds: crate::build_log::Builds,
    /// The cluster's images, on its nodes and in its registry.
    pub(crate) images: crate::images::Images,
    /// The cluster's volumes, each on its node.
    pub(crate) volumes: crate::volumes::Volumes,
    /// Named creates, one at a time (see `claim_name`).
    pub(crate) naming: tokio::sync::Mutex<()>,
    /// How long and how much of the shipped logs the store keeps.
    log_limits: crate::log_shipping::LogLimits,
    /// Named values sealed in the store (refused without a key).
    pub(crate) secrets: crate::secrets::Secrets,
    /// Tenants, their tokens, and who a token is.
    pub(crate) tenants: crate::tenants::Tenants,
    /// Every change, with who asked.
    pub(crate) audit: crate::audit::Audit,
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::internal(format!("state store: {e}"))
    }
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

/// How long a sandbox's answer waits for its node's part (see
/// [`Control::info`]): a healthy node answers a status read in
/// milliseconds, and one that went silent is only known to be so after
/// `Liveness::unreachable_after`.
const STATUS_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn new_id() -> String {
    new_id_with("sbx")
}

impl Control {
    /// A control plane without nodes yet (see `add_node`).
    pub fn new(
        store: Arc<dyn Store>,
        queue_limit: usize,
        policy: warren_core::profile::Policy,
        destroy_on_stop: bool,
        liveness: Option<crate::nodes::Liveness>,
    ) -> Control {
        let nodes: Arc<crate::nodes::Nodes> = Default::default();
        Control {
            secrets: crate::secrets::Secrets::new(store.clone(), None),
            tenants: crate::tenants::Tenants::new(store.clone(), None),
            audit: crate::audit::Audit::new(None),
            images: crate::images::Images::new(nodes.clone(), store.clone(), None),
            volumes: crate::volumes::Volumes::new(nodes.clone(), store.clone()),
            profiles: crate::profiles::Profiles::new(store.clone(), policy),
            store,
            nodes,
            admission: Admission::new(queue_limit),
            liveness,
            destroy_on_stop,
            metrics: crate::metrics::Metrics::new(),
            sandbox_locks: Default::default(),
            lifecycle: Default::default(),
            pools: Default::default(),
            builds: Default::default(),
            naming: Default::default(),
            log_limits: Default::default(),
        }
    }

    /// Keeps shipped logs within `limits` (see `expire_kept_logs`).
    pub fn with_log_limits(mut self, limits: crate::log_shipping::LogLimits) -> Control {
        self.log_limits = limits;
        self
    }

    pub(crate) fn log_limits(&self) -> crate::log_shipping::LogLimits {
        self.log_limits
    }

    /// Where the control plane is in its life (recovering, ready,
    /// stopping): what a daemon waits on and stops.
    pub fn lifecycle(&self) -> &crate::lifecycle::Lifecycle {
        &self.lifecycle
    }

    /// The secrets service.
    pub fn secrets(&self) -> &crate::secrets::Secrets {
        &self.secrets
    }

    /// The tenants service.
    pub fn tenants(&self) -> &crate::tenants::Tenants {
        &self.tenants
    }

    /// The audit log.
    pub fn audit(&self) -> &crate::audit::Audit {
        &self.audit
    }

    /// Keeps the audit log under `home`.
    pub fn with_audit(mut self, home: &std::path::Path) -> Control {
        self.audit = crate::audit::Audit::new(Some(home));
        self
    }

    /// Takes `token` as the operator's (admin of every tenant).
    pub fn with_operator_token(mut self, token: &str) -> Control {
        self.tenants = crate::tenants::Tenants::new(self.store.clone(), Some(token.to_string()));
        self
    }

    /// The images service.
    pub fn images(&self) -> &crate::images::Images {
        &self.images
    }

    /// The volumes service.
    pub fn volumes(&self) -> &crate::volumes::Volumes {
        &self.volumes
    }

    /// The profiles service.
    pub fn profiles(&self) -> &crate::profiles::Profiles {
        &self.profiles
    }

    /// Prometheus metrics, in the text format.
    pub async fn metrics_text(&self) -> String {
        let sandboxes = self.store.list(&[]).await.ok();
        let tenants = match &sandboxes {
            Some(rows) => self.tenant_infos_of(&Principal::Operator, rows).await.ok(),
            None => None,
        };
        let held = match sandboxes {
            Some(_) => self.inventory().await,
            None => Default::default(),
        };
        self.metrics.render(crate::metrics::Snapshot {
            nodes: self.admission.nodes(),
            queued: self.admission.queued(),
            cpu_busy: self
                .nodes
                .all()
                .iter()
                .map(|n| n.view().info.load.cpu_busy)
                .collect(),
            pools: self.pools.infos(),
            sandboxes,
            held,
            profiles: self.store.profiles().await.ok(),
            tenants,
        })
    }

    /// Keeps secrets, sealed with this key.
    pub fn with_secret_box(mut self, sealer: crate::secrets::SecretBox) -> Control {
        self.secrets = crate::secrets::Secrets::new(self.store.clone(), Some(sealer));
        self
    }

    /// Publishes images made in the cluster to `registry` (see
    /// [`crate::images::Images::publish`]).
    pub fn with_cluster_registry(
        mut self,
        registry: Option<warren_core::image_ref::ClusterRegistry>,
    ) -> Control {
        self.images = crate::images::Images::new(self.nodes.clone(), self.store.clone(), registry);
        self
    }

    /// A record as a client sees it, with what its node says of it now.
    /// A node that does not answer within [`STATUS_WAIT`] (its link cut,
    /// say, before it is known to be silent) leaves out what only it knows
    /// (pid, TTL left, usage) rather than holding up the answer.
    pub(crate) async fn info(&self, row: SandboxRow, detailed: bool) -> SandboxInfo {
        let status = match (row.state.is_live(), self.reachable(&row.node)) {
            // Only a detailed answer shows usage: read it now for that.
            (true, Some(node)) => {
                match tokio::time::timeout(STATUS_WAIT, node.status(&row.id, detailed)).await {
                    Ok(status) => status.ok(),
                    Err(_) => {
                        tracing::warn!(sandbox = %row.id, node = %row.node, "its node did not answer a status read within {STATUS_WAIT:?}; answering the record alone");
                        None
                    }
                }
            }
            _ => None,
        };
        self.info_with(row, status.as_ref(), detailed)
    }

    pub(crate) fn info_with(
        &self,
        row: SandboxRow,
        status: Option<&SandboxStatus>,
        detailed: bool,
    ) -> SandboxInfo {
        let status = status.filter(|_| row.state.is_live());
        let (queue_position, waiting_for) = if row.state == SandboxState::Queued {
            (
                self.admission.position(&row.id),
                self.admission
                    .waiting_reason(&row.id)
                    .map(|w| w.to_string()),
            )
        } else {
            (None, None)
        };
        SandboxInfo {
            host_id_base: status.and_then(|s| s.host_id_base).filter(|_| detailed),
            queue_position,
            waiting_for,
            ttl_remaining_ms: status.map(|s| s.ttl_remaining_ms),
            lease_remaining_ms: status.and_then(|s| s.lease_remaining_ms),
            // A live sandbox's from its node; an ended one's as it ended.
            usage: match status {
                Some(s) => s.usage.clone(),
                None => row.usage.clone(),
            }
            .filter(|_| detailed),
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
            tenant: row.tenant,
        }
    }

    /// What the reachable nodes hold, by sandbox (a node that cannot be
    /// asked adds nothing).
    pub async fn inventory(&self) -> HashMap<String, SandboxStatus> {
        let asks = self
            .nodes
            .all()
            .into_iter()
            .filter(|n| n.view().health == crate::nodes::Health::Ready)
            .map(|n| async move {
                match n.api.inventory().await {
                    Ok(list) => list,
                    Err(e) => {
                        tracing::warn!(node = %n.name, error = %e, "asking a node for its sandboxes");
                        Vec::new()
                    }
                }
            });
        futures_util::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .map(|s| (s.id.clone(), s))
            .collect()
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

    /// The newest event's sequence number: where a snapshot's follower
    /// starts (`GET /v1/usage`'s `event_seq`).
    pub async fn last_event_seq(&self) -> Result<i64, ApiError> {
        Ok(self.store.last_event_seq().await?)
    }

    /// Changes whenever an event is written (for followers).
    pub fn event_writes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.store.subscribe_events()
    }

    /// Renews a sandbox's lease (any call on a sandbox does).
    pub async fn touch(&self, id: &str) {
        let Ok(row) = self.row(id).await else { return };
        let Some(node) = self.reachable(&row.node) else {
            return;
        };
        if let Err(e) = node.renew_lease(id).await {
            tracing::debug!(sandbox = %id, error = %e, "renewing a lease");
        }
    }

    /// The sandbox as recorded (no node is asked); NotFound when there is
    /// none.
    pub async fn get(&self, id: &str) -> Result<SandboxInfo, ApiError> {
        Ok(self.info_with(self.row(id).await?, None, false))
    }

    /// The sandbox as its node sees it now (its TTL and lease left, and,
    /// `detailed`, its usage read now), or as recorded when the node does
    /// not answer.
    pub async fn inspect(&self, id: &str, detailed: bool) -> Result<SandboxInfo, ApiError> {
        Ok(self.info(self.row(id).await?, detailed).await)
    }

    /// The sandbox's record; NotFound when there is none.
    pub(crate) async fn row(&self, id: &str) -> Result<SandboxRow, ApiError> {
        self.store.get(id).await?.ok_or_else(|| {
            ApiError::not_found(format!(
                "no sandbox with id {id:?}; list them with `warren ps`"
            ))
        })
    }

    /// The sandboxes `who` reaches in `states` (all when empty) that
    /// match `selector`.
    pub async fn list(
        &self,
        who: &Principal,
        states: &[SandboxState],
        selector: &Selector,
    ) -> Result<Vec<SandboxInfo>, ApiError> {
        self.list_owned(who.scope(), states, selector).await
    }

    /// [`Control::list`] of one tenant's sandboxes, or every tenant's.
    pub(crate) async fn list_owned(
        &self,
        tenant: Option<&TenantName>,
        states: &[SandboxState],
        selector: &Selector,
    ) -> Result<Vec<SandboxInfo>, ApiError> {
        let rows: Vec<SandboxRow> = self
            .rows_owned(tenant, states)
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

    /// The records of one tenant's sandboxes (every tenant's with None) in
    /// `states` (all when empty).
    pub(crate) async fn rows_owned(
        &self,
        tenant: Option<&TenantName>,
        states: &[SandboxState],
    ) -> Result<Vec<SandboxRow>, ApiError> {
        let mut rows = self.store.list(states).await?;
        if let Some(t) = tenant {
            rows.retain(|r| &r.tenant == t);
        }
        Ok(rows)
    }

    /// Destroys a sandbox for `why` (an already final one is left as is);
    /// it as it ended.
    pub async fn destroy(&self, id: &str, why: &str) -> Result<SandboxInfo, ApiError> {
        let row = self.destroy_row(id, why).await?;
        Ok(self.info(row, false).await)
    }

    /// Destroys a sandbox for `why`; an already final sandbox is left as is.
    pub(crate) async fn destroy_row(&self, id: &str, why: &str) -> Result<SandboxRow, ApiError> {
        let _one = self.sandbox_locks.lock(id).await;
        self.destroy_locked(id, why).await
    }

    /// `destroy` for a caller that holds the sandbox's lock.
    pub(crate) async fn destroy_locked(&self, id: &str, why: &str) -> Result<SandboxRow, ApiError> {
        let row = self.row(id).await?;
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
            return self.row(id).await;
        }
        let now = now_rfc3339();
        if row.state != SandboxState::Stopping || row.grace {
            // Unflushed: the `destroyed` below (or the retry's message) is
            // flushed, and a crash of the host ends the sandbox anyway.
            let t = Transition {
                unflushed: true,
                ..Default::default()
            };
            self.store
                .transition(id, SandboxState::Stopping, why, &now, t)
                .await?;
        }
        warren_crashpoint::hit("destroy:stopping");
        let usage = match self.api(&row.node)?.destroy(id, why).await {
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
        // it destroyed also sees its run in the profile and its usage.
        if let Some(u) = &usage {
            if let Err(e) = self.store.set_usage(id, u).await {
                tracing::warn!(sandbox = %id, error = %e, "keeping a finished sandbox's usage");
            }
            if let Err(e) = self
                .profiles
                .record_run(&row, u, why == reason::OOM_KILLED)
                .await
            {
                tracing::warn!(sandbox = %id, error = %e.message, "recording a profile run");
            }
        }
        let done = now_rfc3339();
        // A preemption ends it as `preempted`, so lists and batches tell it
        // from a destroy that was asked for.
        let end = if why == reason::PREEMPTED {
            SandboxState::Preempted
        } else {
            SandboxState::Destroyed
        };
        self.store
            .transition(
                id,
                end,
                why,
                &done,
                Transition {
                    finished_at: Some(&done),
                    ..Default::default()
                },
            )
            .await?;
        self.row(id).await
    }

    /// Runs a command in the sandbox: its events as they happen, in a span
    /// that lasts until the stream ends or is dropped and records the
    /// command's exit code.
    pub async fn exec(
        &self,
        id: &str,
        req: &ExecRequest,
    ) -> Result<BoxStream<'static, ExecEvent>, ApiError> {
        let span = tracing::info_span!(
            "sandbox exec",
            warren.exec.exit_code = tracing::field::Empty,
            warren.exec.signal = tracing::field::Empty,
            warren.exec.timed_out = tracing::field::Empty,
        );
        let events = self.exec_traced(id, req).instrument(span.clone()).await;
        crate::traces::outcome(&span, &events);
        Ok(crate::traces::exec_events(span, events?))
    }

    async fn exec_traced(
        &self,
        id: &str,
        req: &ExecRequest,
    ) -> Result<BoxStream<'static, ExecEvent>, ApiError> {
        let runnable = async {
            req.validate()
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            let row = self.row(id).await?;
            crate::traces::sandbox(&tracing::Span::current(), &row);
            // A kept sandbox's scene is there to be looked at: the node
            // thaws it while an exec runs.
            if !matches!(row.state, SandboxState::Running | SandboxState::Kept) {
                return Err(ApiError::conflict(format!(
                    "sandbox {id} is {}; exec needs a running or kept sandbox",
                    row.state
                )));
            }
            self.api(&row.node)
        };
        let node = match runnable.await {
            Ok(node) => node,
            Err(e) => {
                // Any call on a sandbox renews its lease; the node renews it
                // itself on an exec it runs (no extra call on this path).
                self.touch(id).await;
                return Err(e);
            }
        };
        node.exec(id, req.clone()).await.map_err(node_error)
    }

    /// More stdin for a running exec started with `stdin_open`.
    pub async fn exec_input(
        &self,
        id: &str,
        exec_id: &str,
        data: axum::body::Bytes,
        close: bool,
    ) -> Result<(), ApiError> {
        let row = self.row(id).await?;
        self.api(&row.node)?
            .exec_input(id, exec_id, data, close)
            .await
            .map_err(node_error)
    }

    /// Sets the window size of a running exec's terminal.
    pub async fn exec_resize(
        &self,
        id: &str,
        exec_id: &str,
        size: warren_core::WindowSize,
    ) -> Result<(), ApiError> {
        self.exec_handle(id, exec_id).await?.resize(size).await
    }

    /// A running exec's input and terminal, for a session that sends many
    /// (a WebSocket): the sandbox's node is looked up once, not per
    /// keystroke.
    pub async fn exec_handle(&self, id: &str, exec_id: &str) -> Result<ExecHandle, ApiError> {
        let row = self.row(id).await?;
        Ok(ExecHandle {
            node: self.api(&row.node)?,
            id: id.to_string(),
            exec_id: exec_id.to_string(),
        })
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
    ) -> Result<(SandboxInfo, warren_node_api::PolicyChange), ApiError> {
        let _one = self.sandbox_locks.lock(id).await;
        let row = self.row(id).await?;
        if !row.spec.network.mode.is_proxied() {
            return Err(ApiError::conflict(format!(
                "sandbox {id} has network mode 'none'; the mode is fixed at create, and only an 'allowlist' or 'open' sandbox has rules to change"
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
        self.egress_allowed(&row.tenant, &spec.network).await?;
        let node = self.api(&row.node)?;
        node.check_network(spec.network.clone())
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
        let change = node
            .set_network(id, spec.network.clone())
            .await
            .map_err(node_error)?;
        Ok((self.info(self.row(id).await?, false).await, change))
    }

    /// Changes what happens when a running or paused sandbox ends (its
    /// main process exits, its TTL or lease runs out): its reclaim policy
    /// and, when given, how long a kept one is held. Recorded with the
    /// sandbox, so a restart keeps it; applied when the end is reported.
    pub async fn set_reclaim(
        &self,
        id: &str,
        reclaim: warren_core::spec::ReclaimPolicy,
        keep_for: Option<warren_core::spec::Dur>,
    ) -> Result<SandboxInfo, ApiError> {
        if keep_for.is_some_and(|d| d.get().is_zero()) {
            return Err(ApiError::bad_request(
                "keep_for must be greater than zero, e.g. \"2h\"",
            ));
        }
        let _one = self.sandbox_locks.lock(id).await;
        let row = self.row(id).await?;
        if !matches!(row.state, SandboxState::Running | SandboxState::Paused) {
            return Err(ApiError::conflict(format!(
                "sandbox {id} is {}; only a running or paused sandbox has an end to decide",
                row.state
            )));
        }
        let mut spec = row.spec.clone();
        spec.reclaim = reclaim;
        if keep_for.is_some() {
            spec.keep_for = keep_for;
        }
        let message = match spec.reclaim {
            warren_core::spec::ReclaimPolicy::Keep
            | warren_core::spec::ReclaimPolicy::KeepOnFailure => {
                format!("reclaim {reclaim}, kept for {:?}", spec.keep_for())
            }
            warren_core::spec::ReclaimPolicy::Delay => {
                format!("reclaim {reclaim}, grace {:?}", spec.delay_for())
            }
            warren_core::spec::ReclaimPolicy::Pause => {
                format!("reclaim {reclaim}, paused for {:?}", spec.keep_for())
            }
            warren_core::spec::ReclaimPolicy::Destroy => format!("reclaim {reclaim}"),
        };
        self.store
            .set_spec(id, &spec, &now_rfc3339(), "reclaim_changed", &message)
            .await?;
        Ok(self.info(self.row(id).await?, false).await)
    }

    /// Pauses (freezes) or resumes a running sandbox; it as it is now.
    pub async fn set_paused(&self, id: &str, paused: bool) -> Result<SandboxInfo, ApiError> {
        let row = self.pause_row(id, paused).await?;
        Ok(self.info(row, false).await)
    }

    /// Pauses (freezes) or resumes a running sandbox, under the sandbox's
    /// lock, so a pause can never land on a sandbox being destroyed.
    async fn pause_row(&self, id: &str, paused: bool) -> Result<SandboxRow, ApiError> {
        let _one = self.sandbox_locks.lock(id).await;
        let row = self.row(id).await?;
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
        let node = self.api(&row.node)?;
        node.set_paused(id, paused).await.map_err(node_error)?;
        self.store
            .transition(id, to, why, &now_rfc3339(), Transition::default())
            .await?;
        let _ = node.note(id, note(to.as_str(), why, "")).await;
        self.row(id).await
    }
}

/// See [`Control::exec_handle`].
pub struct ExecHandle {
    node: Arc<dyn NodeApi>,
    id: String,
    exec_id: String,
}

impl ExecHandle {
    /// More stdin; `close` ends it after `data`.
    pub async fn input(&self, data: axum::body::Bytes, close: bool) -> Result<(), ApiError> {
        self.node
            .exec_input(&self.id, &self.exec_id, data, close)
            .await
            .map_err(node_error)
    }

    /// Sets the terminal's window size.
    pub async fn resize(&self, size: warren_core::WindowSize) -> Result<(), ApiError> {
        size.validate()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        self.node
            .exec_resize(&self.id, &self.exec_id, size)
            .await
            .map_err(node_error)
    }
}
