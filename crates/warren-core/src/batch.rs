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

/// A batch's usage in billing units, summed over its members, ended ones
/// included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchCost {
    /// CPU time used, in seconds.
    pub cpu_seconds: f64,
    /// Memory held over time, in GB-seconds (byte-seconds ÷ 10⁹).
    pub memory_gb_seconds: f64,
    /// GPUs held over time: each member's GPUs × its run time, in seconds.
    pub gpu_seconds: f64,
}

impl BatchCost {
    /// Adds one member's usage; it held `gpus` GPUs while it ran.
    pub fn add(&mut self, usage: &Usage, gpus: u32) {
        self.cpu_seconds += usage.cpu_usage_ns as f64 / 1e9;
        self.memory_gb_seconds += usage.memory_byte_seconds as f64 / 1e9;
        self.gpu_seconds += f64::from(gpus) * usage.runtime_ms as f64 / 1e3;
    }
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
    /// Members that ended and are not among the failures: their command
    /// exited 0, or they were destroyed without a failure.
    #[serde(default)]
    pub succeeded: u32,
    /// What the members used, in the units a cluster bills.
    #[serde(default)]
    pub cost: BatchCost,
    /// The tenant it belongs to.
    #[serde(default)]
    pub tenant: crate::tenant::TenantName,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_is_in_billing_units_and_gpus_count_for_their_run_time() {
        let mut cost = BatchCost::default();
        let ran = Usage {
            cpu_usage_ns: 1_500_000_000,
            memory_byte_seconds: 2_000_000_000,
            runtime_ms: 4_000,
            ..Usage::default()
        };
        cost.add(&ran, 2);
        cost.add(&ran, 0);
        assert_eq!(
            cost,
            BatchCost {
                cpu_seconds: 3.0,
                memory_gb_seconds: 4.0,
                gpu_seconds: 8.0
            }
        );
    }
}
