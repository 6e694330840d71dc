//! `/v1/audit`: the audit log (see `crate::audit`).

use axum::extract::{Query, State};
use axum::{Extension, Json};
use serde::Deserialize;
use warren_core::audit::AuditEntry;
use warren_core::tenant::{Principal, Role, TenantName};
use warren_core::{ApiError, ErrorBody, ErrorCode};

use super::{ApiResult, St, Who};
use crate::audit::AuditQuery;

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
    params(("tenant" = Option<String>, Query), ("since" = Option<String>, Query, description = "RFC 3339"),
           ("until" = Option<String>, Query, description = "RFC 3339"), ("limit" = Option<usize>, Query)),
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
    for (name, t) in [("since", &p.since), ("until", &p.until)] {
        if let Some(t) = t {
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                .map_err(|e| {
                    ApiError::bad_request(format!("{name} {t:?}: an RFC 3339 time ({e})"))
                })?;
        }
    }
    let q = AuditQuery {
        tenant,
        since: p.since,
        until: p.until,
        limit: p.limit,
    };
    Ok(Json(st.control.audit().query(&q)?))
}
