//! What the API reports about a sandbox.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::event::Event;
use crate::spec::{ResolvedResources, SandboxSpec};
use crate::state::SandboxState;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxInfo {
    pub id: String,
    pub state: SandboxState,
    /// Why it is in this state.
    pub reason: String,
    pub spec: SandboxSpec,
    pub resources: ResolvedResources,
    pub node: String,
    /// Host PID of the sandbox's init while it is live (for host tools such
    /// as `nsenter`; the sandbox itself sees PID 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// Host uid and gid of root in the sandbox while it is live: its user
    /// namespace maps ids 0–65535 to 65536 host ids from here. Absent for a
    /// sandbox without a user namespace (`warren up --no-userns`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id_base: Option<u32>,
    /// Manifest digest of the image it runs.
    pub image_digest: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Exit code of the main process, once it has exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// 1-based place in its tenant's queue while `queued`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<usize>,
    /// Why it waits while `queued`: its tenant's quota (named), no node
    /// with room, or sandboxes being preempted for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// Time left before the TTL (or a kept sandbox's keep_for) ends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_remaining_ms: Option<u64>,
    /// Time left before the lease ends it without a heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_remaining_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<Event>,
    /// The tenant it belongs to.
    #[serde(default)]
    pub tenant: crate::tenant::TenantName,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    /// CPU time used so far.
    pub cpu_usage_ns: u64,
    pub memory_bytes: u64,
    pub memory_peak_bytes: u64,
    pub pids: u64,
    pub oom_kills: u64,
    /// Mean and peak CPU rate over the sampler's readings (millicores).
    #[serde(default)]
    pub cpu_millis_mean: u64,
    #[serde(default)]
    pub cpu_millis_peak: u64,
    /// The newest of those rates: CPU in use now.
    #[serde(default)]
    pub cpu_millis_last: u64,
    /// CFS periods, and those in which the sandbox hit its quota.
    #[serde(default)]
    pub cpu_periods: u64,
    #[serde(default)]
    pub cpu_throttled_periods: u64,
    /// Bytes written to the sandbox's own layer (its disk use).
    #[serde(default)]
    pub disk_bytes: u64,
    #[serde(default)]
    pub samples: u64,
    #[serde(default)]
    pub runtime_ms: u64,
    /// Memory held over time: each reading's bytes for the time until the
    /// next (byte-seconds; GB-seconds ÷ 10⁹), what a cluster bills.
    #[serde(default)]
    pub memory_byte_seconds: u64,
    /// GPU memory its processes hold (NVML, on a node with NVIDIA's
    /// driver, for a sandbox holding GPUs; else 0), now and at most.
    #[serde(default)]
    pub gpu_memory_bytes: u64,
    #[serde(default)]
    pub gpu_memory_peak_bytes: u64,
    /// The busiest of its GPUs over NVML's last sample period, in percent.
    #[serde(default)]
    pub gpu_utilization_percent: u32,
}
