//! Batches: N sandboxes from one spec, watched and deleted together.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::labels::Labels;
use crate::sandbox::Usage;
use crate::spec::SandboxSpec;
use crate::state::SandboxState;

// The labels live with the other labels, so a spec can drop them from a
// fork without knowing about batches.
pub use crate::labels::{BATCH_LABEL, RETRY_LABEL};
pub const MAX_BATCH: u32 = 100_000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    pub count: u32,
    pub spec: SandboxSpec,
    /// Batch labels (task, code version, dataset version, ...), added to
    /// every sandbox's own labels.
    #[serde(default)]
    pub labels: Labels,
    /// Retry a member that was OOM-killed, once, with the grown request.
    #[serde(default)]
    pub retry_on_oom: bool,
    /// Retry a member that was lost with its node, once, on another node.
    #[serde(default)]
    pub retry_on_lost: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchFailure {
    pub sandbox_id: String,
    pub state: SandboxState,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchInfo {
    pub id: String,
    pub count: u32,
    pub labels: Labels,
    pub spec: SandboxSpec,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at: Option<String>,
    #[serde(default)]
    pub retry_on_oom: bool,
    #[serde(default)]
    pub retry_on_lost: bool,
    /// Sandboxes submitted so far (any state), retries included.
    pub submitted: u32,
    /// Sandboxes per state.
    pub states: BTreeMap<String, u32>,
    /// Usage summed over the batch's members: live ones as last sampled,
    /// ended ones as they ended.
    pub usage: Usage,
    /// Sandboxes that failed: create errors, lost, OOM kills, non-zero exits.
    pub failures: Vec<BatchFailure>,
    /// The tenant it belongs to.
    #[serde(default)]
    pub tenant: crate::tenant::TenantName,
}
