//! Sandbox names: a way to name a sandbox wherever its id goes. A name is
//! unique among a tenant's sandboxes not yet ended (claimed at create, see
//! `control::names`).

use warren_core::tenant::Principal;
use warren_core::{ApiError, SandboxState};

use super::Records;
use crate::store::SandboxRow;

/// The states in which a sandbox holds its name.
const HOLDING: [SandboxState; 6] = [
    SandboxState::Queued,
    SandboxState::Creating,
    SandboxState::Running,
    SandboxState::Paused,
    SandboxState::Stopping,
    SandboxState::Kept,
];

impl Records {
    /// The sandboxes of every tenant that hold `name`.
    pub(crate) async fn holders(&self, name: &str) -> Result<Vec<SandboxRow>, ApiError> {
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
}
