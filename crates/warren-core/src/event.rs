//! Lifecycle events: one per state change, with a reason.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::state::SandboxState;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    /// Monotonic sequence number in the store.
    pub seq: i64,
    /// RFC 3339 UTC time.
    pub time: String,
    pub sandbox_id: String,
    /// Event type, e.g. `state`.
    #[serde(rename = "type")]
    pub kind: String,
    pub state: Option<SandboxState>,
    pub reason: String,
    #[serde(default)]
    pub message: String,
}
