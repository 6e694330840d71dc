//! The cluster's membership: which nodes there are, what each lends, how
//! a node joins and is cordoned. What happens to a node's sandboxes when it
//! falls silent, comes back or leaves is the lifecycle's
//! (`control/node_health.rs`).

use std::sync::Arc;

use warren_core::clock::now_rfc3339;
use warren_core::ApiError;
use warren_node_api::{JoinRequest, Joined, NodeApi, NodeInfo};

use crate::admission::Admission;
use crate::nodes::{Connector, NodeEntry, NodeListing, NodeLoad, Nodes};
use crate::store::{NodeRecord, Store};

/// The membership service.
pub struct NodeSet {
    nodes: Arc<Nodes>,
    admission: Arc<Admission>,
    store: Arc<dyn Store>,
}

impl NodeSet {
    pub(crate) fn new(
        nodes: Arc<Nodes>,
        admission: Arc<Admission>,
        store: Arc<dyn Store>,
    ) -> NodeSet {
        NodeSet {
            nodes,
            admission,
            store,
        }
    }

    /// What each node lends and what its sandboxes hold of it, as
    /// admission counts (requests, not usage).
    pub fn usage(&self) -> Vec<crate::admission::NodeUse> {
        self.admission.nodes()
    }

    /// Every node with its state, labels, capacity, allocation and load.
    pub fn list(&self) -> Vec<NodeListing> {
        let usage: std::collections::HashMap<String, crate::admission::NodeUse> = self
            .usage()
            .into_iter()
            .map(|n| (n.name.clone(), n))
            .collect();
        let queued = self.admission.queued();
        self.nodes
            .all()
            .into_iter()
            .map(|n| {
                let v = n.view();
                let used = usage.get(&n.name);
                NodeListing {
                    name: n.name.clone(),
                    state: v.health,
                    cordoned: v.cordoned,
                    labels: v.info.labels.clone(),
                    url: v.url.clone(),
                    allocatable: v.info.allocatable,
                    allocated: used.map(|u| u.used).unwrap_or_default(),
                    initializing: used.map_or(0, |u| u.initializing),
                    sandboxes: v.info.load.sandboxes,
                    load: NodeLoad {
                        cpu_busy: v.info.load.cpu_busy,
                        disk_pressure: v.info.load.disk_pressure,
                        memory_pressure: v.info.load.memory_pressure,
                    },
                    last_seen_ms: v.last_seen.elapsed().as_millis() as u64,
                    queued,
                    devices: v.info.devices.clone(),
                    isolation: warren_core::Isolation::offered(&v.info.isolation).to_vec(),
                }
            })
            .collect()
    }

    /// Whether some node of the cluster permits open egress (front doors
    /// whose protocol assumes the internet, E2B's, use it when one does).
    pub fn offers_open_egress(&self) -> bool {
        self.nodes.all().iter().any(|n| {
            n.view()
                .info
                .labels
                .get(warren_core::network::EGRESS_OPEN_LABEL)
                .is_some_and(|v| v == "true")
        })
    }

    /// Registers a node (or replaces the one of the same name) as it
    /// described itself; it takes placements once it is reconciled.
    pub fn add(
        &self,
        api: Arc<dyn NodeApi>,
        info: NodeInfo,
        url: String,
        credential: String,
        cordoned: bool,
    ) -> Arc<NodeEntry> {
        let entry = Arc::new(NodeEntry::new(api, info.clone(), url, credential, cordoned));
        self.nodes.insert(entry.clone());
        // A node known only from the store (a restarted control plane) lends
        // nothing admission can count until its first heartbeat says what.
        if info.allocatable.slots > 0 {
            self.admission.set_node(
                &info.name,
                info.allocatable,
                info.max_pids,
                info.labels,
                &info.isolation,
            );
            self.admission.set_schedulable(&info.name, false);
        }
        entry
    }

    /// A node joins (or joins again): it is recorded with a new
    /// credential, which is returned to it, and reconciled on its first
    /// heartbeat. A re-join keeps the node's cordon.
    pub async fn join(&self, req: JoinRequest, connect: &Connector) -> Result<Joined, ApiError> {
        let name = req.info.name.clone();
        warren_core::labels::validate_value("node name", &name)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        if name.is_empty() {
            return Err(ApiError::bad_request("a node needs a name (--name)"));
        }
        warren_core::labels::validate(&req.info.labels)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        if !(req.url.starts_with("http://") || req.url.starts_with("https://")) {
            return Err(ApiError::bad_request(format!(
                "node URL {:?} must start with http:// or https:// (see `warren node --advertise`)",
                req.url
            )));
        }
        let known = self
            .store
            .nodes()
            .await?
            .into_iter()
            .find(|n| n.name == name);
        // A name stays bound to the key it joined with (the caller checked
        // that this join holds the key it pins): a join-token holder with
        // another key cannot take over a node's name and credential.
        if let Some(pin) = known.as_ref().and_then(|n| n.tls_fingerprint.as_deref()) {
            if req.tls_fingerprint.as_deref() != Some(pin) {
                return Err(ApiError::conflict(format!(
                    "node {name} joined with another TLS key (certificate SHA-256 {pin}); a node that lost its node-tls directory joins again after `warren node rm {name}`"
                )));
            }
        }
        let cordoned = known.is_some_and(|n| n.cordoned);
        let credential = crate::new_secret();
        let api = connect(&req.url, &credential, req.tls_fingerprint.as_deref())
            .map_err(ApiError::from)?;
        let now = now_rfc3339();
        self.store
            .put_node(&NodeRecord {
                name: name.clone(),
                url: req.url.clone(),
                credential: credential.clone(),
                labels: req.info.labels.clone(),
                cordoned,
                joined_at: now.clone(),
                tls_fingerprint: req.tls_fingerprint.clone(),
            })
            .await?;
        self.add(api, req.info, req.url.clone(), credential.clone(), cordoned);
        let message = format!("node {name} joined from {}", req.url);
        tracing::info!("{message}");
        self.store.node_event("node_joined", &message, &now).await?;
        Ok(Joined {
            credential,
            registries: None,
        })
    }

    /// Whether `credential` is the one issued to `node` at its join.
    pub fn credential_ok(&self, node: &str, credential: &str) -> bool {
        use subtle::ConstantTimeEq;
        self.nodes.get(node).is_some_and(|n| {
            !n.credential.is_empty()
                && bool::from(n.credential.as_bytes().ct_eq(credential.as_bytes()))
        })
    }

    /// Stops (or resumes) placing sandboxes on a node; what runs there
    /// stays.
    pub async fn set_cordoned(&self, name: &str, cordoned: bool) -> Result<(), ApiError> {
        let entry = self.known(name)?;
        if let Some(mut rec) = self
            .store
            .nodes()
            .await?
            .into_iter()
            .find(|n| n.name == name)
        {
            rec.cordoned = cordoned;
            self.store.put_node(&rec).await?;
        }
        let schedulable = entry.update(|v| {
            v.cordoned = cordoned;
            v.schedulable()
        });
        self.admission.set_schedulable(name, schedulable);
        let (why, what) = if cordoned {
            ("node_cordoned", "takes no new sandboxes")
        } else {
            ("node_uncordoned", "takes sandboxes again")
        };
        self.store
            .node_event(why, &format!("node {name} {what}"), &now_rfc3339())
            .await?;
        Ok(())
    }

    pub(crate) fn known(&self, name: &str) -> Result<Arc<NodeEntry>, ApiError> {
        self.nodes.get(name).ok_or_else(|| {
            ApiError::not_found(format!("no node named {name:?}; see `warren node ls`"))
        })
    }
}
