//! The audit log's lines: every call that changes something (a create, a
//! destroy, an exec, a file write, a token made), with the tenant and the
//! token that asked, recorded before its answer goes out.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::tenant::TenantName;

/// One audited call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditEntry {
    /// When it was answered (RFC 3339, UTC).
    pub time: String,
    /// The tenant it acted for.
    pub tenant: TenantName,
    /// The id of the token that asked (`operator` for the operator's).
    pub token: String,
    /// The door it came through: `api`, `e2b`.
    pub door: String,
    pub method: String,
    /// The route, as declared (`/v1/sandboxes/{id}/exec`).
    pub route: String,
    /// The id or name the route's path named, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target: String,
    /// The answer's HTTP status.
    pub status: u16,
}
