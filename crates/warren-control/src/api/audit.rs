//! `/v1/audit`: the audit log (see `crate::audit`).

use axum::extract::{Query, State};
use axum::{Extension, Json};
use serde::Deserialize;
use warren_core::audit::AuditEntry;
use warren_core::tenant::{Principal, Role, TenantName};
use warren_core::{ApiError, ErrorBody, ErrorCode};

use super::{ApiResult, St, Who};
use crate::audit::AuditQuery;

/// `30m` (that long ago) or an RFC 3339 time.
fn moment(name: &str, given: &str) -> Result<time::OffsetDateTime, ApiError> {
    use time::format_description::well_known::Rfc3339;
    match warren_core::quantity::parse_duration(given) {
        Ok(ago) => Ok(time::OffsetDateTime::now_utc() - ago),
        Err(_) => time::OffsetDateTime::parse(given, &Rfc3339).map_err(|e| {
            ApiError::bad_request(format!(
                "{name} {given:?}: a duration (30m, 2h) or an RFC 3339 time ({e})"
            ))
        }),
    }
}

#[derive(Deserialize)]
pub(crate) struct AuditParams {
    tenant: Option<TenantName>,
    since: Option<String>,
    until: Option<String>,
    limit: Option<usize>,
}

/// The audited calls (every change, with its tenant and token), oldest
/// first, the newest `limit` (default 1,000) of those that match. The
/// operator's token reads every tenant's; a tenant's admin token its own.
#[utoipa::path(get, path = "/v1/audit",
    params(("tenant" = Option<String>, Query), ("since" = Option<String>, Query, description = "30m (ago) or RFC 3339"),
           ("until" = Option<String>, Query, description = "30m (ago) or RFC 3339"), ("limit" = Option<usize>, Query)),
    responses((status = 200, body = [AuditEntry]), (status = 403, body = ErrorBody)))]
pub(crate) async fn audit(
    State(st): St,
    Extension(who): Who,
    Query(p): Query<AuditParams>,
) -> ApiResult<Json<Vec<AuditEntry>>> {
    let tenant = match &who {
        Principal::Operator => p.tenant,
        Principal::Tenant {
            tenant,
            role: Role::Admin,
            ..
        } => Some(tenant.clone()),
        Principal::Tenant { .. } => {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "the audit log is read with the operator's token or a tenant's admin token",
            )
            .into())
        }
    };
    let q = AuditQuery {
        tenant,
        since: p.since.as_deref().map(|t| moment("since", t)).transpose()?,
        until: p.until.as_deref().map(|t| moment("until", t)).transpose()?,
        limit: p.limit,
    };
    Ok(Json(st.control.audit().query(&q)?))
}
