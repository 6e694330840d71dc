//! The lifecycle's side of batches (their records and decisions are the
//! batches service's, `crate::batches`): submitting a batch's members,
//! removing them, and retrying a member that ended.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use warren_core::clock::now_rfc3339;
use warren_core::state::reason;
use warren_core::tenant::Principal;
use warren_core::{ApiError, BatchInfo, BatchRequest, ErrorCode, SandboxState};

use super::{new_id_with, Control};
use crate::batches::Batches;
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
        Batches::check(&req)?;
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
        self.batches.insert(&row).await?;
        tokio::spawn(self.clone().fill_batch(row.clone()));
        self.batches.info(&row.id).await
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
        let spec = Batches::member_spec(&batch);
        let permits = Arc::new(Semaphore::new(BATCH_PARALLELISM));
        let mut tasks = Vec::with_capacity(batch.count as usize);
        for _ in 0..batch.count {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            if self.batches.deleted(&batch.id).await {
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

    /// Makes a batch member that ended for `why` again, if its batch asks
    /// for that (see [`Batches::retry_of`]).
    pub(crate) async fn retry_member(self: &Arc<Self>, row: &crate::store::SandboxRow, why: &str) {
        let Some((tenant, spec)) = self.batches.retry_of(row, why).await else {
            return;
        };
        let this = self.clone();
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

    /// Stops submitting and destroys every sandbox of the batch.
    pub async fn delete_batch(&self, id: &str) -> Result<BatchInfo, ApiError> {
        let tenant = self.batches.mark_deleted(id).await?;
        let open: Vec<SandboxState> = SandboxState::ALL
            .into_iter()
            .filter(|s| !s.is_final())
            .collect();
        // Members submitted while we delete are caught by a second pass.
        for _ in 0..2 {
            let members = self
                .records
                .list_owned(Some(&tenant), &open, &Batches::selector(id))
                .await?;
            let deletes = members
                .iter()
                .map(|m| self.destroy(&m.id, reason::USER_DELETED));
            for r in futures_util::future::join_all(deletes).await {
                r?;
            }
        }
        self.batches.info(id).await
    }
}
