//! The task that keeps the nodes' logs in the store: one pull loop per node
//! (see `log_shipping` for one pull) and the expiry of what is kept.

use std::sync::Arc;

use crate::lifecycle::Lifecycle;
use crate::log_shipping::LogLimits;
use crate::nodes::{NodeEntry, Nodes};
use crate::store::Store;

/// The log keeper service.
pub struct LogKeeper {
    store: Arc<dyn Store>,
    nodes: Arc<Nodes>,
    lifecycle: Arc<Lifecycle>,
    limits: LogLimits,
}

impl LogKeeper {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        nodes: Arc<Nodes>,
        lifecycle: Arc<Lifecycle>,
        limits: LogLimits,
    ) -> LogKeeper {
        LogKeeper {
            store,
            nodes,
            lifecycle,
            limits,
        }
    }

    /// Pulls `entry`'s shipping journal into the store for as long as it is
    /// the node registered under its name and the control plane runs (see
    /// `log_shipping`).
    pub(crate) async fn ship_node_logs(self: Arc<Self>, entry: Arc<NodeEntry>) {
        use crate::log_shipping::{pull, retry_after, PULL_WAIT};
        use std::time::Duration;
        // None: read it from the store (at start, and after a failure).
        let mut cursor: Option<Option<crate::store::LogCursor>> = None;
        let mut backoff = Duration::from_millis(500);
        while self.nodes.is_current(&entry) && !self.lifecycle.is_stopping() {
            let known = match &cursor {
                Some(c) => c.clone(),
                None => match self.store.log_cursor(&entry.name).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(node = %entry.name, error = %e, "reading a node's log cursor");
                        self.pause(backoff).await;
                        continue;
                    }
                },
            };
            let step = pull(
                self.store.as_ref(),
                entry.api.as_ref(),
                &entry.name,
                known.as_ref(),
                PULL_WAIT,
            );
            let done = tokio::select! {
                r = step => r,
                _ = self.lifecycle.stopped() => return,
            };
            match done {
                Ok(next) => {
                    cursor = Some(next);
                    backoff = Duration::from_millis(500);
                }
                Err(e) => match retry_after(&e) {
                    Some(later) => {
                        tracing::debug!(node = %entry.name, error = %e, "the node ships no logs");
                        cursor = Some(known);
                        self.pause(later).await;
                    }
                    None => {
                        tracing::debug!(node = %entry.name, error = %e, "shipping a node's logs; retrying");
                        // Read again: another writer, or a write whose
                        // commit is in doubt, may have moved it.
                        cursor = None;
                        self.pause(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                    }
                },
            }
        }
    }

    async fn pause(&self, d: std::time::Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.lifecycle.stopped() => {}
        }
    }

    /// Deletes kept logs past the retention and the size bound, every
    /// minute (a short retention: every half of it), until the control
    /// plane stops.
    pub(crate) async fn expire_kept_logs(self: Arc<Self>) {
        let every = (self.limits.retention / 2).clamp(
            std::time::Duration::from_millis(200),
            std::time::Duration::from_secs(60),
        );
        loop {
            let (before, max) = crate::log_shipping::expiry(self.limits);
            match self.store.expire_log_entries(before, max).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    deleted = n,
                    "kept logs past their retention or size bound deleted"
                ),
                Err(e) => tracing::warn!(error = %e, "deleting old kept logs"),
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = self.lifecycle.stopped() => return,
            }
        }
    }
}
