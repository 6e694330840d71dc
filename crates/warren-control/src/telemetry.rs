//! What the control plane shows of itself: Prometheus metrics (below), the
//! last hour's history the console charts (`history.rs`) and the alerts sent
//! to webhooks (`alerts.rs`). It reads the other services and changes
//! nothing of theirs; the lifecycle counts into `metrics` as it works.

use std::sync::Arc;

use warren_core::tenant::Principal;

use crate::admission::Admission;
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::nodes::Nodes;
use crate::pools::Pools;
use crate::records::Records;
use crate::store::Store;
use crate::tenants::Tenants;

/// The telemetry service.
pub struct Telemetry {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) nodes: Arc<Nodes>,
    pub(crate) admission: Arc<Admission>,
    pub(crate) pools: Arc<Pools>,
    pub(crate) tenants: Arc<Tenants>,
    pub(crate) records: Arc<Records>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) lifecycle: Arc<Lifecycle>,
}

impl Telemetry {
    /// Prometheus metrics, in the text format.
    pub async fn metrics_text(&self) -> String {
        let sandboxes = self.store.list(&[]).await.ok();
        let tenants = match &sandboxes {
            Some(rows) => self.tenants.infos_of(&Principal::Operator, rows).await.ok(),
            None => None,
        };
        let held = match sandboxes {
            Some(_) => self.records.inventory().await,
            None => Default::default(),
        };
        self.metrics.render(crate::metrics::Snapshot {
            nodes: self.admission.nodes(),
            queued: self.admission.queued(),
            cpu_busy: self
                .nodes
                .all()
                .iter()
                .map(|n| n.view().info.load.cpu_busy)
                .collect(),
            pools: self.pools.infos(),
            sandboxes,
            held,
            profiles: self.store.profiles().await.ok(),
            tenants,
        })
    }
}
