//! What the node reports through the contract: itself (capacity, load,
//! images), each sandbox as it stands, and a sandbox's log.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use warren_node_api::{Load, NodeInfo, Phase, Resources, SandboxStatus, ShipBatch};

use crate::{logs, Node, NodeError};
use warren_core::sync::lock;

/// Bounds of one shipping answer: the control plane writes each batch in
/// one transaction, and a long poll must end well within the call's quick
/// deadline.
const SHIP_MOST: u32 = 10_000;
const SHIP_MOST_BYTES: usize = 4 << 20;
const SHIP_LONGEST_WAIT: Duration = Duration::from_secs(10);

impl Node {
    /// The next of the shipping journal after `after` (see
    /// [`crate::ship_journal`]), within one answer's bounds.
    pub(crate) async fn ship(
        &self,
        journal: Option<&str>,
        after: u64,
        max: u32,
        wait: Duration,
    ) -> Result<ShipBatch, NodeError> {
        let Some(j) = self.logs.journal() else {
            return Err(NodeError::BadRequest(
                "this node does not ship its logs (started with --no-log-shipping)".into(),
            ));
        };
        let (max, wait) = (max.clamp(1, SHIP_MOST), wait.min(SHIP_LONGEST_WAIT));
        j.read(journal, after, max, SHIP_MOST_BYTES, wait)
            .await
            .map_err(|e| NodeError::Internal(e.to_string()))
    }

    /// The classes this node runs, its default first.
    pub(crate) fn isolation_classes(&self) -> Vec<warren_core::Isolation> {
        let mut classes = vec![self.offer.default_isolation];
        classes.extend(
            warren_core::Isolation::ALL
                .into_iter()
                .filter(|c| *c != self.offer.default_isolation && self.runtime.offers(*c)),
        );
        classes
    }

    /// The class a sandbox of `spec` runs in here.
    pub(crate) fn isolation_of(&self, spec: &warren_core::SandboxSpec) -> warren_core::Isolation {
        spec.isolation.unwrap_or(self.offer.default_isolation)
    }

    /// Name, labels, capacity, load and the digests of its images.
    pub(crate) async fn node_info(&self) -> NodeInfo {
        // A store that cannot be read reports no images (placement then
        // only loses its locality preference for this node).
        let images = self
            .images
            .records()
            .await
            .ok()
            .map(|list| list.into_iter().map(|r| r.digest).collect())
            .unwrap_or_default();
        let mut labels = self.offer.labels.clone();
        if self.egress.open_permitted() {
            labels.insert(
                warren_core::network::EGRESS_OPEN_LABEL.to_string(),
                "true".to_string(),
            );
        }
        NodeInfo {
            name: self.offer.name.clone(),
            labels,
            allocatable: Resources {
                gpus: self.devices.gpus(),
                ..self.offer.allocatable
            },
            max_pids: self.offer.max_pids,
            load: Load {
                cpu_busy: self.meter.pressure.cpu_busy(),
                disk_pressure: self.meter.pressure.disk(),
                memory_pressure: self.meter.pressure.memory(),
                sandboxes: lock(&self.live).len() as u32,
            },
            images,
            devices: self.devices.classes(),
            isolation: self.isolation_classes(),
        }
    }

    /// Every sandbox the node holds, once it has taken over those of its
    /// journal.
    pub(crate) async fn statuses(&self) -> Vec<SandboxStatus> {
        self.wait_ready().await;
        let ids: Vec<String> = lock(&self.live).keys().cloned().collect();
        ids.iter()
            .filter_map(|id| self.status_of(id, false))
            .collect()
    }

    /// A sandbox as it stands; its usage sampled now with `fresh`, else
    /// the last periodic sample's. None when the node does not hold it.
    pub(crate) fn status_of(&self, id: &str, fresh: bool) -> Option<SandboxStatus> {
        let live = self.get(id).ok()?;
        if fresh {
            self.meter.sample_one(&self.runtime, id, &live, false);
        }
        let usage = lock(&live.usage).usage();
        let (ttl, lease) = {
            let l = lock(&live.lifetime);
            (
                l.ttl_remaining().as_millis() as u64,
                l.lease_remaining().map(|d| d.as_millis() as u64),
            )
        };
        Some(SandboxStatus {
            id: id.to_string(),
            phase: live.phase(),
            image_digest: live.image_digest.clone(),
            pid: live.pid,
            host_id_base: self.host_id_base(id),
            ttl_remaining_ms: ttl,
            lease_remaining_ms: lease,
            usage: Some(usage),
            phases: Vec::new(),
        })
    }

    /// The sandbox's log as whole JSON lines; with `follow`, until the
    /// sandbox is over (gone, or held after it finished).
    pub(crate) fn log_lines(
        self: &Arc<Self>,
        id: &str,
        follow: bool,
    ) -> Result<BoxStream<'static, std::io::Result<bytes::Bytes>>, NodeError> {
        if !self.logs.has(id) {
            return Err(NodeError::NotFound(format!(
                "no log for sandbox {id} (logs are kept for the node's --log-retention)"
            )));
        }
        type Over = Box<dyn FnMut() -> BoxFuture<'static, bool> + Send>;
        let over = follow.then(|| {
            let (node, id) = (Arc::downgrade(self), id.to_string());
            Box::new(move || {
                let over = node
                    .upgrade()
                    .and_then(|n| n.get(&id).ok())
                    .is_none_or(|l| l.phase() == Phase::Held);
                Box::pin(async move { over }) as BoxFuture<'static, bool>
            }) as Over
        });
        let follow = over.map(|over| logs::Follow {
            changes: self.log(id).map(|l| l.subscribe()),
            over,
        });
        Ok(self.logs.stream(id, follow).boxed())
    }
}
