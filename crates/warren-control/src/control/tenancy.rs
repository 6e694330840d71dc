//! Tenants as the control plane keeps them: made, changed and removed
//! through the tenants service, with what each holds now read from the
//! records (so every replica of a cluster answers the same).

use std::collections::HashMap;

use warren_core::tenant::{Principal, TenantInfo, TenantName, TenantRequest, TenantSpec};
use warren_core::{ApiError, SandboxState};

use super::Control;
use crate::store::SandboxRow;

impl Control {
    /// Gives admission every tenant's spec (at start, and as a new leader
    /// of a cluster): quotas, weights and priorities hold from the first
    /// create.
    pub(crate) async fn load_tenants(&self) -> Result<(), ApiError> {
        for (name, spec, _) in self.tenants.specs().await? {
            self.admission.set_tenant(&name, &spec);
        }
        Ok(())
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

    /// The tenants `who` reaches, with what their sandboxes hold and how
    /// many of their creates wait.
    pub async fn tenant_infos(&self, who: &Principal) -> Result<Vec<TenantInfo>, ApiError> {
        let rows = self.store.list(&[]).await?;
        self.tenant_infos_of(who, &rows).await
    }

    /// [`Control::tenant_infos`] from records already read.
    pub(crate) async fn tenant_infos_of(
        &self,
        who: &Principal,
        rows: &[SandboxRow],
    ) -> Result<Vec<TenantInfo>, ApiError> {
        let mut usage: HashMap<TenantName, (warren_core::tenant::TenantUsage, u32)> =
            HashMap::new();
        for row in rows {
            let (u, queued) = usage.entry(row.tenant.clone()).or_default();
            if row.state == SandboxState::Queued {
                *queued += 1;
            } else if row.state.is_live() {
                u.cpu_millis += row.resources.cpu_request();
                u.memory += row.resources.memory_request();
                u.gpus += row.resources.gpus;
                u.sandboxes += 1;
            }
        }
        Ok(self
            .tenants
            .specs()
            .await?
            .into_iter()
            .filter(|(name, _, _)| who.reaches(name))
            .map(|(name, spec, created_at)| {
                let (used, queued) = usage.remove(&name).unwrap_or_default();
                TenantInfo {
                    usage: used,
                    queued,
                    ..crate::tenants::bare_info(name, spec, created_at)
                }
            })
            .collect())
    }

    /// Makes a tenant.
    pub async fn create_tenant(&self, req: &TenantRequest) -> Result<TenantInfo, ApiError> {
        let made = self.tenants.create(req).await?;
        self.admission.set_tenant(&made.name, &made.spec);
        Ok(made)
    }

    /// Replaces a tenant's spec; its sandboxes keep running (a lower quota
    /// holds back its next creates, it ends none).
    pub async fn set_tenant(
        &self,
        name: &TenantName,
        spec: TenantSpec,
    ) -> Result<TenantInfo, ApiError> {
        let set = self.tenants.set(name, spec).await?;
        self.admission.set_tenant(&set.name, &set.spec);
        Ok(set)
    }

    /// Removes a tenant that owns nothing any more: its sandboxes ended,
    /// its batches, pools and secrets removed.
    pub async fn remove_tenant(&self, name: &TenantName) -> Result<(), ApiError> {
        let open = self
            .records
            .rows_owned(Some(name), &[])
            .await?
            .into_iter()
            .filter(|r| !r.state.is_final())
            .count();
        let batches = self
            .store
            .batches(None)
            .await?
            .into_iter()
            .filter(|b| &b.tenant == name && b.deleted_at.is_none())
            .count();
        let pools = self
            .pools
            .defs()
            .into_iter()
            .filter(|(_, _, t)| t == name)
            .count();
        let secrets = self
            .store
            .secrets()
            .await?
            .into_iter()
            .filter(|s| &s.tenant == name)
            .count();
        if open + batches + pools + secrets > 0 {
            return Err(ApiError::conflict(format!(
                "tenant {name} still owns {open} sandboxes that have not ended, {batches} batches, {pools} pools and {secrets} secrets; remove them first"
            )));
        }
        self.tenants.remove(name).await?;
        self.admission.remove_tenant(name);
        Ok(())
    }
}
