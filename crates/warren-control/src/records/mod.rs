//! The sandboxes' records and what a client reads of them: one sandbox as
//! recorded or as its node sees it now, lists, a name's sandbox (`names`),
//! the fleet over a window (`fleet`), the event log. Reads only: changes
//! are the lifecycle's (`control`), which writes through the same store.

use std::collections::HashMap;
use std::sync::Arc;

use warren_core::tenant::{Principal, TenantName};
use warren_core::{ApiError, SandboxInfo, SandboxState, Selector};
use warren_node_api::SandboxStatus;

use crate::admission::Admission;
use crate::nodes::Nodes;
use crate::store::{SandboxRow, Store};

mod fleet;
mod names;

/// How long a sandbox's answer waits for its node's part (see
/// [`Records::info`]): a healthy node answers a status read in
/// milliseconds, and one that went silent is only known to be so after
/// `Liveness::unreachable_after`.
const STATUS_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The records service: the store's sandbox rows, what the nodes say of
/// them, and the queue's view of those still waiting.
pub struct Records {
    store: Arc<dyn Store>,
    nodes: Arc<Nodes>,
    admission: Arc<Admission>,
}

impl Records {
    pub(crate) fn new(store: Arc<dyn Store>, nodes: Arc<Nodes>, admission: Arc<Admission>) -> Self {
        Records {
            store,
            nodes,
            admission,
        }
    }

    /// A record as a client sees it, with what its node says of it now.
    /// A node that does not answer within [`STATUS_WAIT`] (its link cut,
    /// say, before it is known to be silent) leaves out what only it knows
    /// (pid, TTL left, usage) rather than holding up the answer.
    pub(crate) async fn info(&self, row: SandboxRow, detailed: bool) -> SandboxInfo {
        let status = match (row.state.is_live(), self.nodes.reachable(&row.node)) {
            // Only a detailed answer shows usage: read it now for that.
            (true, Some(node)) => {
                match tokio::time::timeout(STATUS_WAIT, node.status(&row.id, detailed)).await {
                    Ok(status) => status.ok(),
                    Err(_) => {
                        tracing::warn!(sandbox = %row.id, node = %row.node, "its node did not answer a status read within {STATUS_WAIT:?}; answering the record alone");
                        None
                    }
                }
            }
            _ => None,
        };
        self.info_with(row, status.as_ref(), detailed)
    }

    pub(crate) fn info_with(
        &self,
        row: SandboxRow,
        status: Option<&SandboxStatus>,
        detailed: bool,
    ) -> SandboxInfo {
        let status = status.filter(|_| row.state.is_live());
        let (queue_position, waiting_for) = if row.state == SandboxState::Queued {
            (
                self.admission.position(&row.id),
                self.admission
                    .waiting_reason(&row.id)
                    .map(|w| w.to_string()),
            )
        } else {
            (None, None)
        };
        SandboxInfo {
            host_id_base: status.and_then(|s| s.host_id_base).filter(|_| detailed),
            queue_position,
            waiting_for,
            ttl_remaining_ms: status.map(|s| s.ttl_remaining_ms),
            lease_remaining_ms: status.and_then(|s| s.lease_remaining_ms),
            // A live sandbox's from its node; an ended one's as it ended.
            usage: match status {
                Some(s) => s.usage.clone(),
                None => row.usage.clone(),
            }
            .filter(|_| detailed),
            pid: status.map(|s| s.pid),
            id: row.id,
            state: row.state,
            reason: row.reason,
            spec: row.spec,
            resources: row.resources,
            node: row.node,
            image_digest: row.image_digest,
            created_at: row.created_at,
            started_at: row.started_at,
            finished_at: row.finished_at,
            exit_code: row.exit_code,
            events: vec![],
            tenant: row.tenant,
        }
    }

    /// What the reachable nodes hold, by sandbox (a node that cannot be
    /// asked adds nothing).
    pub async fn inventory(&self) -> HashMap<String, SandboxStatus> {
        let asks = self
            .nodes
            .all()
            .into_iter()
            .filter(|n| n.view().health == crate::nodes::Health::Ready)
            .map(|n| async move {
                match n.api.inventory().await {
                    Ok(list) => list,
                    Err(e) => {
                        tracing::warn!(node = %n.name, error = %e, "asking a node for its sandboxes");
                        Vec::new()
                    }
                }
            });
        futures_util::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .map(|s| (s.id.clone(), s))
            .collect()
    }

    /// Events after `after` (of one sandbox, or all), oldest first.
    pub async fn events(
        &self,
        sandbox: Option<&str>,
        after: i64,
        limit: i64,
    ) -> Result<Vec<warren_core::Event>, ApiError> {
        Ok(self.store.events(sandbox, after, limit).await?)
    }

    /// The newest event's sequence number: where a snapshot's follower
    /// starts (`GET /v1/usage`'s `event_seq`).
    pub async fn last_event_seq(&self) -> Result<i64, ApiError> {
        Ok(self.store.last_event_seq().await?)
    }

    /// Changes whenever an event is written (for followers).
    pub fn event_writes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.store.subscribe_events()
    }

    /// The sandbox as recorded (no node is asked); NotFound when there is
    /// none.
    pub async fn get(&self, id: &str) -> Result<SandboxInfo, ApiError> {
        Ok(self.info_with(self.row(id).await?, None, false))
    }

    /// The sandbox as its node sees it now (its TTL and lease left, and,
    /// `detailed`, its usage read now), or as recorded when the node does
    /// not answer.
    pub async fn inspect(&self, id: &str, detailed: bool) -> Result<SandboxInfo, ApiError> {
        Ok(self.info(self.row(id).await?, detailed).await)
    }

    /// The sandbox's record; NotFound when there is none.
    pub(crate) async fn row(&self, id: &str) -> Result<SandboxRow, ApiError> {
        self.store.get(id).await?.ok_or_else(|| {
            ApiError::not_found(format!(
                "no sandbox with id {id:?}; list them with `warren ps`"
            ))
        })
    }

    /// The sandboxes `who` reaches in `states` (all when empty) that
    /// match `selector`.
    pub async fn list(
        &self,
        who: &Principal,
        states: &[SandboxState],
        selector: &Selector,
    ) -> Result<Vec<SandboxInfo>, ApiError> {
        self.list_owned(who.scope(), states, selector).await
    }

    /// [`Records::list`] of one tenant's sandboxes, or every tenant's.
    pub(crate) async fn list_owned(
        &self,
        tenant: Option<&TenantName>,
        states: &[SandboxState],
        selector: &Selector,
    ) -> Result<Vec<SandboxInfo>, ApiError> {
        let rows: Vec<SandboxRow> = self
            .rows_owned(tenant, states)
            .await?
            .into_iter()
            .filter(|r| selector.matches(r.labels()))
            .collect();
        let held = if rows.iter().any(|r| r.state.is_live()) {
            self.inventory().await
        } else {
            HashMap::new()
        };
        Ok(rows
            .into_iter()
            .map(|r| {
                let status = held.get(&r.id);
                self.info_with(r, status, false)
            })
            .collect())
    }

    /// The records of one tenant's sandboxes (every tenant's with None) in
    /// `states` (all when empty).
    pub(crate) async fn rows_owned(
        &self,
        tenant: Option<&TenantName>,
        states: &[SandboxState],
    ) -> Result<Vec<SandboxRow>, ApiError> {
        let mut rows = self.store.list(states).await?;
        if let Some(t) = tenant {
            rows.retain(|r| &r.tenant == t);
        }
        Ok(rows)
    }
}
