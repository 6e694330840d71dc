//! The sandboxes of a window of time, a page at a time (the fleet over a
//! window, `GET /v1/fleet`): those not ended, by id, and those that ended
//! since a time, by when they ended (index `sandboxes_finished`). A page is
//! a bounded read; the caller sums each page and drops it.

use warren_core::tenant::TenantName;

use super::{decode_readable, Arg, Dialect};
use crate::store::{SandboxRow, StoreError};

/// The tenant filter's argument: "" stands for every tenant (no tenant is
/// named "").
fn tenant_arg(tenant: Option<&TenantName>) -> &str {
    tenant.map_or("", TenantName::as_str)
}

/// Every state but the final four, as SQL (a test holds it to
/// `SandboxState`).
macro_rules! unended_states {
    () => {
        "'queued', 'creating', 'running', 'paused', 'stopping', 'kept'"
    };
}

pub(super) async fn unended<D: Dialect>(
    store: &D,
    tenant: Option<&TenantName>,
    after_id: &str,
    limit: i64,
) -> Result<Vec<SandboxRow>, StoreError> {
    // The states named (every one but the final four), not the final ones
    // excluded: an `IN` walks the state index over the live few, where a
    // `NOT IN` would read every record ever kept.
    let sql = sql!(concat!(
        "SELECT * FROM sandboxes WHERE state IN (",
        unended_states!(),
        ") AND id > ? AND (? = '' OR tenant = ?) ORDER BY id LIMIT ?"
    ));
    let t = tenant_arg(tenant);
    let rows = store.fetch_all(sql, args![after_id, t, t, limit]).await?;
    Ok(decode_readable(&rows))
}

pub(super) async fn ended<D: Dialect>(
    store: &D,
    tenant: Option<&TenantName>,
    (after_time, after_id): (&str, &str),
    limit: i64,
) -> Result<Vec<SandboxRow>, StoreError> {
    // Every end, and only an end, records its time (`finished_at`): the
    // row comparison alone walks the index from where the last page
    // stopped. (A condition on the state beside it would have SQLite's
    // planner pick the state index, and read every ended record kept.)
    let sql = sql!(
        "SELECT * FROM sandboxes
         WHERE (finished_at, id) > (?, ?) AND (? = '' OR tenant = ?)
         ORDER BY finished_at, id LIMIT ?"
    );
    let t = tenant_arg(tenant);
    let rows = store
        .fetch_all(sql, args![after_time, after_id, t, t, limit])
        .await?;
    Ok(decode_readable(&rows))
}

#[cfg(test)]
mod tests {
    use warren_core::SandboxState;

    /// A state added to `SandboxState` is named here too, or sandboxes in
    /// it vanish from the fleet.
    #[test]
    fn the_unended_states_are_every_state_not_final() {
        let named: Vec<&str> = unended_states!()
            .split(", ")
            .map(|s| s.trim_matches('\''))
            .collect();
        let unended: Vec<&str> = SandboxState::ALL
            .into_iter()
            .filter(|s| !s.is_final())
            .map(SandboxState::as_str)
            .collect();
        assert_eq!(named, unended);
    }
}
