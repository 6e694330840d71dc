//! Batches: a first-class group of sandboxes made from one spec. Members
//! carry the `warren.dev/batch` label; status, usage and deletion all go
//! through that label, so a batch is never out of step with its sandboxes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use warren_core::tenant::Principal;

use tokio::sync::Semaphore;
use warren_core::batch::{BatchCost, BatchFailure, BATCH_LABEL, MAX_BATCH};
use warren_core::clock::now_rfc3339;
use warren_core::fleet::Outcome;
use warren_core::labels::{self, Requirement};
use warren_core::state::reason;
use warren_core::{ApiError, BatchInfo, BatchRequest, ErrorCode, SandboxState, Selector, Usage};

use crate::control::{new_id_with, Control};
use crate::store::BatchRow;

/// Creates of one batch in flight at once; the node's own start queue
/// bounds the real work further.
const BATCH_PARALLELISM: usize = 16;

impl Control {
    /// A batch of `who`'s tenant: its members are that tenant's.
    pub async fn create_batch(
        self: &Arc<Self>,
        who: &Principal,
        mut req: BatchRequest,
    ) -> Result<BatchInfo, ApiError> {
        let tenant = crate::access::changer(who)?;
        if req.count == 0 || req.count > MAX_BATCH {
            return Err(ApiError::bad_request(format!(
                "count must be between 1 and {MAX_BATCH}"
            )));
        }
        labels::validate(&req.labels).map_err(|e| ApiError::bad_request(e.to_string()))?;
        if req.labels.contains_key(BATCH_LABEL) || req.spec.labels.contains_key(BATCH_LABEL) {
            return Err(ApiError::bad_request(format!(
                "the label {BATCH_LABEL} is set by Warren"
            )));
        }
        if req.spec.name.is_some() {
            return Err(ApiError::bad_request(
                "name is one sandbox's; a batch's members are told apart by their batch label",
            ));
        }
        if req.spec.request_id.is_some() {
            return Err(ApiError::bad_request(
                "request_id is per sandbox; leave it out of a batch spec",
            ));
        }
        let resources = req
            .spec
            .resolve()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        // What its tenant may not make (egress, priority) and members no
        // node would take (its labels, its isolation class) are refused
        // now, as one such create is, not each in the background.
        self.gate.tenant_for_create(&tenant, &req.spec).await?;
        self.admission
            .check_placeable(&crate::admission::Request::of(&req.spec, &resources, ""))
            .map_err(crate::admission::admit_error)?;
        // The tag is resolved once, here: every member runs this digest,
        // whatever the tag points at later and on whichever node.
        let resolved = self
            .images
            .resolve(
                &tenant,
                self.images.resolver(&req.spec.node_selector)?.as_ref(),
                &req.spec.image,
            )
            .await
            .map_err(crate::node_errors::node_error)?;
        if let Some(pinned) = resolved.source {
            req.spec.image = pinned;
        }
        let row = BatchRow {
            id: new_id_with("bat"),
            count: req.count,
            spec: req.spec,
            labels: req.labels,
            created_at: now_rfc3339(),
            deleted_at: None,
            retry_on_oom: req.retry_on_oom,
            retry_on_lost: req.retry_on_lost,
            tenant,
        };
        self.store.insert_batch(&row).await?;
        tokio::spawn(self.clone().fill_batch(row.clone()));
        self.batch_info(&row.id).await
    }

    /// Submits the batch's sandboxes; a full node queue is waited out.
    async fn fill_batch(self: Arc<Self>, batch: BatchRow) {
        // Every node the batch may use holds its image before the first
        // member is placed (one download per node, side by side).
        if warren_core::image_ref::registry_host(&batch.spec.image).is_some() {
            if let Err(e) = self
                .images
                .prewarm(&batch.spec.image, &[], &batch.spec.node_selector)
                .await
            {
                tracing::warn!(batch = %batch.id, error = %e.message, "prewarming the batch's image");
            }
        }
        let mut spec = batch.spec.clone();
        spec.labels.extend(batch.labels.clone());
        spec.labels.insert(BATCH_LABEL.into(), batch.id.clone());
        let permits = Arc::new(Semaphore::new(BATCH_PARALLELISM));
        let mut tasks = Vec::with_capacity(batch.count as usize);
        for _ in 0..batch.count {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            if self.batch_deleted(&batch.id).await {
                break;
            }
            let (this, spec, tenant) = (self.clone(), spec.clone(), batch.tenant.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    match this.create_pinned(&tenant, spec.clone(), false, None).await {
                        Err(e) if e.code == ErrorCode::TooManyRequests => {
                            let wait = e.retry_after_ms.unwrap_or(1000);
                            tokio::time::sleep(Duration::from_millis(wait)).await;
                        }
                        // Failed creates are recorded as failed sandboxes.
                        _ => break,
                    }
                }
                drop(permit);
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    }

    async fn batch_deleted(&self, id: &str) -> bool {
        matches!(self.store.batches(Some(id)).await.as_deref(), Ok([b]) if b.deleted_at.is_some())
    }

    fn batch_selector(id: &str) -> Selector {
        Selector(vec![Requirement::Equals(BATCH_LABEL.into(), id.into())])
    }

    pub async fn batch_info(&self, id: &str) -> Result<BatchInfo, ApiError> {
        let batch = self.store.batches(Some(id)).await?.pop().ok_or_else(|| {
            ApiError::not_found(format!(
                "no batch with id {id:?}; list them with `warren batch ls`"
            ))
        })?;
        // The records themselves: an ended member's carries its usage.
        let selector = Self::batch_selector(id);
        let members: Vec<crate::store::SandboxRow> = self
            .records
            .rows_owned(Some(&batch.tenant), &[])
            .await?
            .into_iter()
            .filter(|r| selector.matches(r.labels()))
            .collect();
        let mut states = BTreeMap::new();
        let mut usage = Usage::default();
        let mut failures = Vec::new();
        let (mut succeeded, mut cost) = (0, BatchCost::default());
        for m in &members {
            *states.entry(m.state.as_str().to_string()).or_insert(0) += 1;
            // Read now (as `inspect` does): a sandbox created a moment ago
            // has no periodic sample yet.
            // An ended member's usage as it ended: the batch's sums last
            // after its sandboxes are gone.
            let status = match (m.state.is_live(), self.nodes.reachable(&m.node)) {
                (true, Some(node)) => node.status(&m.id, true).await.ok(),
                _ => None,
            };
            let member = match &status {
                Some(s) => s.usage.clone(),
                None if !m.state.is_live() => m.usage.clone(),
                None => None,
            };
            if let Some(u) = &member {
                usage.cpu_usage_ns += u.cpu_usage_ns;
                if m.state.is_live() {
                    usage.memory_bytes += u.memory_bytes;
                    usage.pids += u.pids;
                }
                usage.memory_peak_bytes += u.memory_peak_bytes;
                usage.oom_kills += u.oom_kills;
                usage.runtime_ms += u.runtime_ms;
                usage.memory_byte_seconds += u.memory_byte_seconds;
                cost.add(u, m.resources.gpus);
            }
            // The fleet's rule (`Outcome`): a kept member OOM-killed has
            // failed already.
            let failed = Outcome::judge(m.state, &m.reason, m.exit_code).is_failure();
            if failed {
                failures.push(BatchFailure {
                    sandbox_id: m.id.clone(),
                    state: m.state,
                    reason: m.reason.clone(),
                    exit_code: m.exit_code,
                });
            } else if m.state.is_final() {
                succeeded += 1;
            }
        }
        Ok(BatchInfo {
            id: batch.id,
            count: batch.count,
            labels: batch.labels,
            spec: batch.spec,
            created_at: batch.created_at,
            deleted_at: batch.deleted_at,
            retry_on_oom: batch.retry_on_oom,
            retry_on_lost: batch.retry_on_lost,
            submitted: members.len() as u32,
            states,
            usage,
            failures,
            succeeded,
            cost,
            tenant: batch.tenant,
        })
    }

    /// A batch member that ended for `why` is created once more when its
    /// batch asks for it: OOM-killed (`retry_on_oom`), with the grown
    /// request of its profile (or, with no profile, its memory grown as the
    /// profile policy grows one, `grow_by`, at most `max_growth` times the
    /// batch's request); lost with its node
    /// (`retry_on_lost`), as it was, wherever there is room.
    pub(crate) async fn retry_member(self: &Arc<Self>, row: &crate::store::SandboxRow, why: &str) {
        let oom = why == reason::OOM_KILLED;
        if !(oom || why == reason::NODE_LOST)
            || row
                .spec
                .labels
                .contains_key(warren_core::batch::RETRY_LABEL)
        {
            return;
        }
        let Some(bid) = row.spec.labels.get(BATCH_LABEL) else {
            return;
        };
        let Ok(Some(batch)) = self.store.batches(Some(bid)).await.map(|mut b| b.pop()) else {
            return;
        };
        let asked = if oom {
            batch.retry_on_oom
        } else {
            batch.retry_on_lost
        };
        if !asked || batch.deleted_at.is_some() {
            return;
        }
        let mut spec = row.spec.clone();
        spec.labels
            .insert(warren_core::batch::RETRY_LABEL.into(), row.id.clone());
        let has_profile = match crate::profiles::profile_name(&batch.tenant, &spec) {
            Some(name) => matches!(self.store.profile(&name).await, Ok(Some(_))),
            None => false,
        };
        if !oom {
            // As it was.
        } else if has_profile {
            spec.cpu = None;
            spec.memory = None;
        } else {
            let policy = self.profiles.policy();
            let grown = (row.resources.memory as f64 * policy.grow_by) as u64;
            let asked = batch.spec.memory.map_or(row.resources.memory, |m| m.0);
            let cap = (asked as f64 * policy.max_growth) as u64;
            spec.memory = Some(warren_core::spec::ByteSize(grown.min(cap)));
        }
        let (this, tenant) = (self.clone(), batch.tenant.clone());
        let (retry_of, why) = (row.id.clone(), why.to_string());
        tokio::spawn(async move {
            match this.create_pinned(&tenant, spec, false, None).await {
                Ok((s, _)) => {
                    tracing::info!(sandbox = %s.id, %retry_of, %why, "retrying a batch member")
                }
                Err(e) => {
                    tracing::warn!(%retry_of, error = %e.message, %why, "retrying a batch member")
                }
            }
        });
    }

    /// The batches `who` reaches.
    pub async fn list_batches(&self, who: &Principal) -> Result<Vec<BatchInfo>, ApiError> {
        let mut out = Vec::new();
        for b in self.store.batches(None).await? {
            if !who.reaches(&b.tenant) {
                continue;
            }
            out.push(self.batch_info(&b.id).await?);
        }
        Ok(out)
    }

    /// Stops submitting and destroys every sandbox of the batch.
    pub async fn delete_batch(&self, id: &str) -> Result<BatchInfo, ApiError> {
        let tenant = self.batch_info(id).await?.tenant;
        self.store.delete_batch(id, &now_rfc3339()).await?;
        let open: Vec<SandboxState> = SandboxState::ALL
            .into_iter()
            .filter(|s| !s.is_final())
            .collect();
        // Members submitted while we delete are caught by a second pass.
        for _ in 0..2 {
            let members = self
                .records
                .list_owned(Some(&tenant), &open, &Self::batch_selector(id))
                .await?;
            let deletes = members
                .iter()
                .map(|m| self.destroy(&m.id, reason::USER_DELETED));
            for r in futures_util::future::join_all(deletes).await {
                r?;
            }
        }
        self.batch_info(id).await
    }
}
