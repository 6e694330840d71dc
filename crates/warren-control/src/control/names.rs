//! Claiming a sandbox name at create: unique among a tenant's sandboxes
//! not yet ended (the lookup of a name is `records::names`).

use warren_core::tenant::TenantName;
use warren_core::ApiError;

use super::Control;

impl Control {
    /// Holds the naming lock when `name` is free in `tenant` (named
    /// creates go one at a time, so two cannot both find a name free);
    /// Conflict when one of its sandboxes holds it.
    pub(crate) async fn claim_name(
        &self,
        tenant: &TenantName,
        name: Option<&warren_core::sandbox_name::SandboxName>,
    ) -> Result<Option<tokio::sync::MutexGuard<'_, ()>>, ApiError> {
        let Some(name) = name else {
            return Ok(None);
        };
        let guard = self.naming.lock().await;
        let holders = self.records.holders(name.as_str()).await?;
        let holder = holders.into_iter().find(|r| &r.tenant == tenant);
        if let Some(holder) = holder {
            return Err(ApiError::conflict(format!(
                "the name {name} is taken by sandbox {}; remove it (`warren rm {name}`) or choose another",
                holder.id
            )));
        }
        Ok(Some(guard))
    }
}
