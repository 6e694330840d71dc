//! The node's background loops that are not sampling: lifetimes (TTL, lease,
//! holds) and the expiry of old logs.

use std::sync::atomic::Ordering;

use crate::lifetime::ACT_ALONE_AFTER;
use crate::Node;
use warren_core::sync::lock;
use warren_node_api::NodeEvent;

/// Removes the logs of sandboxes that are gone and were last written
/// longer ago than `retention`.
pub(crate) async fn expire_logs(node: std::sync::Weak<Node>, retention: std::time::Duration) {
    let tick = (retention / 2).clamp(
        std::time::Duration::from_millis(200),
        std::time::Duration::from_secs(60),
    );
    loop {
        let Some(n) = node.upgrade() else { return };
        let logs = n.logs.clone();
        let live: Vec<String> = lock(&n.live).keys().cloned().collect();
        drop(n);
        let _ = tokio::task::spawn_blocking(move || logs.expire(&live, retention)).await;
        tokio::time::sleep(tick).await;
    }
}
/// Checks every live sandbox's TTL and lease on the monotonic clock and
/// reports the ones that ran out; acts alone on a report nobody answered
/// (see `lifetime`). Runs until the node is dropped.
pub(crate) async fn enforce_lifetimes(node: std::sync::Weak<Node>) {
    const TICK: std::time::Duration = std::time::Duration::from_millis(50);
    loop {
        tokio::time::sleep(TICK).await;
        let Some(node) = node.upgrade() else { return };
        let now = tokio::time::Instant::now();
        // One pass: what ran out now (reported), and what was reported
        // long enough ago that nobody answered (the node acts alone).
        let mut expired: Vec<(String, &'static str)> = Vec::new();
        let mut unanswered: Vec<(String, &'static str)> = Vec::new();
        for (id, l) in lock(&node.live).iter() {
            if l.destroying.load(Ordering::Acquire) {
                continue;
            }
            let mut lifetime = lock(&l.lifetime);
            if let Some(why) = lifetime.take_expiry(now) {
                expired.push((id.clone(), why));
            } else if let Some(why) = lifetime.take_unanswered(now, ACT_ALONE_AFTER) {
                unanswered.push((id.clone(), why));
            }
        }
        for (id, reason) in expired {
            node.feed.push(NodeEvent::Expired {
                id,
                reason: reason.into(),
            });
        }
        for (id, why) in unanswered {
            let node = node.clone();
            tokio::spawn(async move { node.end_alone(&id, why).await });
        }
    }
}
