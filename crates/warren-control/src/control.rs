//! The control plane's decisions: validating and recording sandboxes, asking
//! the node to run them (only through the node contract), and reacting to
//! what the node reports.

use std::sync::Arc;

use rand::Rng;
use warren_core::clock::now_rfc3339;
use warren_core::state::reason;
use warren_core::{ApiError, SandboxInfo, SandboxState};
use warren_node_api::LogNote;

use crate::admission::Admission;
use crate::node_errors::node_error;
use crate::store::{SandboxRow, Store, StoreError, Transition};

mod batches;
mod commit;
mod create;
mod fork;
mod names;
mod node_events;
mod node_health;
mod pools;
mod preemption;
mod recovery;
mod run;

pub struct Control {
    pub(crate) store: Arc<dyn Store>,
    /// The nodes, each through its contract (in-process or over the
    /// network); shared with the services that call them.
    pub(crate) nodes: Arc<crate::nodes::Nodes>,
    /// The FIFO queue and what each sandbox holds of its node.
    pub(crate) admission: Arc<Admission>,
    /// The sandboxes' records and the reads of them.
    pub(crate) records: Arc<crate::records::Records>,
    /// Exec, files, logs and ports of a sandbox.
    pub(crate) io: crate::sandbox_io::SandboxIo,
    /// Who may reach what.
    pub(crate) gate: crate::gate::Gate,
    /// When a silent node is given up; None: never (`warren up`'s node).
    pub(crate) liveness: Option<crate::nodes::Liveness>,
    /// Whether a clean stop destroys every sandbox (`warren up`); a
    /// control plane of a cluster stops without touching its nodes.
    pub(crate) destroy_on_stop: bool,
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// Metrics, the recent history and alerts, as the control plane shows them.
    pub(crate) telemetry: Arc<crate::telemetry::Telemetry>,
    pub(crate) sandbox_locks: crate::sandbox_locks::SandboxLocks,
    /// The learned profiles and how they learn.
    pub(crate) profiles: crate::profiles::Profiles,
    pub(crate) lifecycle: Arc<crate::lifecycle::Lifecycle>,
    pub(crate) pools: Arc<crate::pools::Pools>,
    /// Batches' records and the decisions about them.
    pub(crate) batches: crate::batches::Batches,
    /// Image builds, running and recent.
    pub(crate) builds: crate::build_log::Builds,
    /// The cluster's images, on its nodes and in its registry.
    pub(crate) images: crate::images::Images,
    /// The cluster's volumes, each on its node.
    pub(crate) volumes: Arc<crate::volumes::Volumes>,
    /// Named creates, one at a time (see `claim_name`).
    pub(crate) naming: tokio::sync::Mutex<()>,
    /// The nodes' shipped logs, kept in the store.
    pub(crate) log_keeper: Arc<crate::log_keeper::LogKeeper>,
    /// Which nodes there are and how each joins.
    pub(crate) node_set: crate::node_set::NodeSet,
    /// Named values sealed in the store (refused without a key).
    pub(crate) secrets: Arc<crate::secrets::Secrets>,
    /// Tenants, their tokens, and who a token is.
    pub(crate) tenants: Arc<crate::tenants::Tenants>,
    /// Every change, with who asked.
    pub(crate) audit: Arc<crate::audit::Audit>,
}

/// How a control plane is set up (see [`Control::new`]).
pub struct Options {
    /// Creates each tenant may have waiting.
    pub queue_limit: usize,
    /// How learned profiles size sandboxes.
    pub policy: warren_core::profile::Policy,
    /// Whether a clean stop destroys every sandbox (`warren up`).
    pub destroy_on_stop: bool,
    /// When a silent node is given up; None: never.
    pub liveness: Option<crate::nodes::Liveness>,
    /// Where images made in the cluster are published (see
    /// [`crate::images::Images::publish`]).
    pub cluster_registry: Option<warren_core::image_ref::ClusterRegistry>,
    /// The operator's token (admin of every tenant).
    pub operator_token: Option<String>,
    /// Where the audit log is kept; None: not kept.
    pub audit_home: Option<std::path::PathBuf>,
    /// How long and how much of the shipped logs the store keeps.
    pub log_limits: crate::log_shipping::LogLimits,
    /// The key secrets are sealed with; None: secrets are refused.
    pub secret_box: Option<crate::secrets::SecretBox>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            queue_limit: 1024,
            policy: Default::default(),
            destroy_on_stop: true,
            liveness: None,
            cluster_registry: None,
            operator_token: None,
            audit_home: None,
            log_limits: Default::default(),
            secret_box: None,
        }
    }
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

fn new_id() -> String {
    new_id_with("sbx")
}

impl Control {
    /// A control plane without nodes yet (see `add_node`). Each service
    /// is made here, once, and given the others it reads.
    pub fn new(store: Arc<dyn Store>, options: Options) -> Control {
        let nodes: Arc<crate::nodes::Nodes> = Default::default();
        let admission = Arc::new(Admission::new(options.queue_limit));
        let lifecycle: Arc<crate::lifecycle::Lifecycle> = Default::default();
        let records = Arc::new(crate::records::Records::new(
            store.clone(),
            nodes.clone(),
            admission.clone(),
        ));
        let io = crate::sandbox_io::SandboxIo::new(
            records.clone(),
            nodes.clone(),
            store.clone(),
            lifecycle.clone(),
        );
        let pools: Arc<crate::pools::Pools> = Default::default();
        let tenants = Arc::new(crate::tenants::Tenants::new(
            store.clone(),
            options.operator_token,
            admission.clone(),
            pools.clone(),
        ));
        let audit = Arc::new(crate::audit::Audit::new(options.audit_home.as_deref()));
        let secrets = Arc::new(crate::secrets::Secrets::new(
            store.clone(),
            options.secret_box,
        ));
        let volumes = Arc::new(crate::volumes::Volumes::new(nodes.clone(), store.clone()));
        let gate = crate::gate::Gate::new(
            store.clone(),
            tenants.clone(),
            audit.clone(),
            secrets.clone(),
            volumes.clone(),
            pools.clone(),
        );
        let log_keeper = Arc::new(crate::log_keeper::LogKeeper::new(
            store.clone(),
            nodes.clone(),
            lifecycle.clone(),
            options.log_limits,
        ));
        let node_set =
            crate::node_set::NodeSet::new(nodes.clone(), admission.clone(), store.clone());
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let telemetry = Arc::new(crate::telemetry::Telemetry {
            store: store.clone(),
            nodes: nodes.clone(),
            admission: admission.clone(),
            pools: pools.clone(),
            tenants: tenants.clone(),
            records: records.clone(),
            metrics: metrics.clone(),
            lifecycle: lifecycle.clone(),
        });
        let batches = crate::batches::Batches::new(
            store.clone(),
            records.clone(),
            nodes.clone(),
            options.policy.clone(),
        );
        Control {
            batches,
            records,
            io,
            gate,
            secrets,
            tenants,
            audit,
            images: crate::images::Images::new(
                nodes.clone(),
                store.clone(),
                options.cluster_registry,
            ),
            volumes,
            profiles: crate::profiles::Profiles::new(store.clone(), options.policy),
            store,
            nodes,
            admission,
            liveness: options.liveness,
            destroy_on_stop: options.destroy_on_stop,
            metrics,
            telemetry,
            sandbox_locks: Default::default(),
            lifecycle,
            pools,
            builds: Default::default(),
            naming: Default::default(),
            log_keeper,
            node_set,
        }
    }

    /// Where the control plane is in its life (recovering, ready,
    /// stopping): what a daemon waits on and stops.
    pub fn lifecycle(&self) -> &crate::lifecycle::Lifecycle {
        &self.lifecycle
    }

    /// The sandboxes' records: one sandbox, lists, the event log.
    pub fn records(&self) -> &crate::records::Records {
        &self.records
    }

    /// Exec, files, logs and ports of a sandbox.
    pub fn io(&self) -> &crate::sandbox_io::SandboxIo {
        &self.io
    }

    /// The cluster's membership: which nodes there are, joins, cordons.
    pub fn node_set(&self) -> &crate::node_set::NodeSet {
        &self.node_set
    }

    /// Who may reach what: every door's checks and the audit log's lines.
    pub fn gate(&self) -> &crate::gate::Gate {
        &self.gate
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

    /// The images service.
    pub fn images(&self) -> &crate::images::Images {
        &self.images
    }

    /// The volumes service.
    pub fn volumes(&self) -> &crate::volumes::Volumes {
        &self.volumes
    }

    /// Metrics, the recent history and alerts.
    pub fn telemetry(&self) -> &Arc<crate::telemetry::Telemetry> {
        &self.telemetry
    }

    /// The profiles service.
    pub fn profiles(&self) -> &crate::profiles::Profiles {
        &self.profiles
    }

    /// Warm pools: their definitions, ready members and claims.
    pub fn pools(&self) -> &crate::pools::Pools {
        &self.pools
    }

    /// Batches: their records, progress and cost.
    pub fn batches(&self) -> &crate::batches::Batches {
        &self.batches
    }

    /// Destroys a sandbox for `why` (an already final one is left as is);
    /// it as it ended.
    pub async fn destroy(&self, id: &str, why: &str) -> Result<SandboxInfo, ApiError> {
        let row = self.destroy_row(id, why).await?;
        Ok(self.records.info(row, false).await)
    }

    /// Destroys a sandbox for `why`; an already final sandbox is left as is.
    pub(crate) async fn destroy_row(&self, id: &str, why: &str) -> Result<SandboxRow, ApiError> {
        let _one = self.sandbox_locks.lock(id).await;
        self.destroy_locked(id, why).await
    }

    /// `destroy` for a caller that holds the sandbox's lock.
    pub(crate) async fn destroy_locked(&self, id: &str, why: &str) -> Result<SandboxRow, ApiError> {
        let row = self.records.row(id).await?;
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
            return self.records.row(id).await;
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
        let usage = match self.nodes.api(&row.node)?.destroy(id, why).await {
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
        self.records.row(id).await
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
        let row = self.records.row(id).await?;
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
        self.gate.egress_allowed(&row.tenant, &spec.network).await?;
        let node = self.nodes.api(&row.node)?;
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
        Ok((
            self.records.info(self.records.row(id).await?, false).await,
            change,
        ))
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
        let row = self.records.row(id).await?;
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
        Ok(self.records.info(self.records.row(id).await?, false).await)
    }

    /// The sandbox may live `ttl` from now.
    pub async fn set_ttl(
        &self,
        id: &str,
        ttl: warren_core::spec::Dur,
    ) -> Result<SandboxInfo, ApiError> {
        let ttl = ttl.get();
        if ttl.is_zero() {
            return Err(ApiError::bad_request("ttl must be greater than zero"));
        }
        let row = self.records.row(id).await?;
        if !matches!(row.state, SandboxState::Running | SandboxState::Paused) {
            return Err(ApiError::conflict(format!(
                "sandbox {id} is {}; only a running or paused sandbox has a TTL to change",
                row.state
            )));
        }
        self.nodes
            .api(&row.node)?
            .set_ttl(id, ttl)
            .await
            .map_err(node_error)?;
        Ok(self.records.info(row, false).await)
    }

    /// Pauses (freezes) or resumes a running sandbox; it as it is now.
    pub async fn set_paused(&self, id: &str, paused: bool) -> Result<SandboxInfo, ApiError> {
        let row = self.pause_row(id, paused).await?;
        Ok(self.records.info(row, false).await)
    }

    /// Pauses (freezes) or resumes a running sandbox, under the sandbox's
    /// lock, so a pause can never land on a sandbox being destroyed.
    async fn pause_row(&self, id: &str, paused: bool) -> Result<SandboxRow, ApiError> {
        let _one = self.sandbox_locks.lock(id).await;
        let row = self.records.row(id).await?;
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
        let node = self.nodes.api(&row.node)?;
        node.set_paused(id, paused).await.map_err(node_error)?;
        self.store
            .transition(id, to, why, &now_rfc3339(), Transition::default())
            .await?;
        let _ = node.note(id, note(to.as_str(), why, "")).await;
        self.records.row(id).await
    }
}
