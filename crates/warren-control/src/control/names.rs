//! Sandbox names: unique among a tenant's sandboxes not yet ended, and a
//! way to name a sandbox wherever its id goes.

use warren_core::tenant::{Principal, TenantName};
use warren_core::{ApiError, SandboxState};

use crate::store::SandboxRow;

use super::Control;

/// The states in which a sandbox holds its name.
const HOLDING: [SandboxState; 6] = [
    SandboxState::Queued,
    SandboxState::Creating,
    SandboxState::Running,
    SandboxState::Paused,
    SandboxState::Stopping,
    SandboxState::Kept,
];

impl Control {
    /// The sandboxes of every tenant that hold `name`.
    async fn holders(&self, name: &str) -> Result<Vec<SandboxRow>, ApiError> {
        let live = self.store.list(&HOLDING).await?;
        let named = |r: &SandboxRow| r.spec.name.as_ref().is_some_and(|n| n.as_str() == name);
        Ok(live.into_iter().filter(named).collect())
    }

    /// The id of the sandbox `who` means by `name`: its tenant's names
    /// are its own, so two tenants may each hold one. The operator reaches
    /// every tenant's: its own (the default tenant's) first, else the one
    /// holder, and Conflict when several tenants hold the name.
    pub async fn named(&self, who: &Principal, name: &str) -> Result<Option<String>, ApiError> {
        let own = who.tenant();
        let mut holders = self.holders(name).await?;
        holders.retain(|r| who.reaches(&r.tenant));
        if let Some(mine) = holders.iter().position(|r| r.tenant == own) {
            return Ok(Some(holders.swap_remove(mine).id));
        }
        match holders.len() {
            0 => Ok(None),
            1 => Ok(holders.pop().map(|r| r.id)),
            _ => {
                let mut tenants: Vec<&str> = holders.iter().map(|r| r.tenant.as_str()).collect();
                tenants.sort_unstable();
                Err(ApiError::conflict(format!(
                    "the name {name} is held by sandboxes of tenants {}: use the sandbox's id",
                    tenants.join(", ")
                )))
            }
        }
    }

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
        let holders = self.holders(name.as_str()).await?;
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
