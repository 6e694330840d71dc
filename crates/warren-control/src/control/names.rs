//! Sandbox names: unique among sandboxes not yet ended, and a way to name
//! a sandbox wherever its id goes.

use warren_core::{ApiError, SandboxState};

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
    /// The id of the sandbox holding `name`, if one does.
    pub async fn named(&self, name: &str) -> Result<Option<String>, ApiError> {
        Ok(self
            .store
            .list(&HOLDING)
            .await?
            .into_iter()
            .find(|r| r.spec.name.as_ref().is_some_and(|n| n.as_str() == name))
            .map(|r| r.id))
    }

    /// Holds the naming lock when `name` is free (named creates go one at
    /// a time, so two cannot both find a name free); Conflict when taken.
    pub(crate) async fn claim_name(
        &self,
        name: Option<&warren_core::sandbox_name::SandboxName>,
    ) -> Result<Option<tokio::sync::MutexGuard<'_, ()>>, ApiError> {
        let Some(name) = name else {
            return Ok(None);
        };
        let guard = self.naming.lock().await;
        if let Some(holder) = self.named(name.as_str()).await? {
            return Err(ApiError::conflict(format!(
                "the name {name} is taken by sandbox {holder}; remove it (`warren rm {name}`) or choose another"
            )));
        }
        Ok(Some(guard))
    }
}
