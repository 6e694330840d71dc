//! Forks: N new sandboxes that start from a running or paused sandbox's
//! filesystem as it is now (not its processes), on its node. The node
//! copies the source's changes once into a read-only fork layer; each
//! child is built on it with an upper directory of its own, and is
//! admitted, recorded and created like any other sandbox.

use std::sync::Arc;

use warren_core::clock::now_rfc3339;
use warren_core::spec::{ForkOrigin, ForkRequest};
use warren_core::state::reason;
use warren_core::{ApiError, SandboxInfo, SandboxState};

use super::{new_id, Control};
use crate::admission::admit_error;
use crate::admission::{Admit, Request};
use crate::node_errors::node_error;
use crate::store::SandboxRow;

impl Control {
    /// Makes `req.count` children of sandbox `id`, all or none: answers
    /// once every child is running (queued children wait their turn), or
    /// with the first failure after removing the children already made.
    /// The work runs in its own task, so a client that leaves cannot leave
    /// a fork half made.
    pub async fn fork(
        self: &Arc<Self>,
        id: &str,
        req: ForkRequest,
    ) -> Result<Vec<SandboxInfo>, ApiError> {
        self.lifecycle.refuse_if_stopping()?;
        let this = self.clone();
        let id = id.to_string();
        tokio::spawn(async move { this.fork_now(&id, req).await })
            .await
            .map_err(|e| ApiError::internal(format!("fork task: {e}")))?
    }

    async fn fork_now(
        self: Arc<Self>,
        id: &str,
        req: ForkRequest,
    ) -> Result<Vec<SandboxInfo>, ApiError> {
        // The source stays as it is (no pause, resume or destroy) until its
        // layer is copied.
        let source_lock = self.sandbox_locks.lock(id).await;
        let source = self.records.row(id).await?;
        let mut spec = req
            .child_spec(id, &source.spec)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        if !matches!(source.state, SandboxState::Running | SandboxState::Paused) {
            return Err(ApiError::conflict(format!(
                "sandbox {id} is {}; only a running or paused sandbox can be forked",
                source.state
            )));
        }
        let resources = spec
            .resolve()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let node = self.nodes.api(&source.node)?;
        // The children are the source's tenant's, in its quota and share.
        let priority = self.tenants.spec(&source.tenant).await?.priority_of(&spec);
        // Room for every child on the source's node, in order, before
        // anything is made: a refusal leaves nothing behind.
        let ids: Vec<String> = (0..req.count).map(|_| new_id()).collect();
        let mut admitted = Vec::with_capacity(ids.len());
        for child in &ids {
            let mut ask = Request::of(&spec, &resources, &source.image_digest)
                .for_tenant(source.tenant.clone(), priority);
            ask.node = Some(source.node.clone());
            match self.admission.admit(child, ask) {
                Ok(a) => admitted.push(a),
                Err(e) => {
                    for child in &ids[..admitted.len()] {
                        self.admission.release(child);
                    }
                    return Err(admit_error(e));
                }
            }
        }
        let layer = match node.fork_layer(id, req.with_processes).await {
            Ok(layer) => layer,
            Err(e) => {
                for child in &ids {
                    self.admission.release(child);
                }
                return Err(node_error(e));
            }
        };
        drop(source_lock);
        let top = layer.layers.first().cloned().unwrap_or_default();
        spec.fork = Some(ForkOrigin {
            source: id.to_string(),
            layers: layer.layers.clone(),
            processes: req.with_processes,
        });
        let created_at = now_rfc3339();
        let mut tasks = Vec::with_capacity(ids.len());
        for (child, admit) in ids.iter().zip(admitted) {
            let (state, node_name, ready) = match admit {
                Admit::Now(node) => (SandboxState::Creating, node, None),
                Admit::Queued { ready, .. } => (SandboxState::Queued, String::new(), Some(ready)),
            };
            let row = SandboxRow {
                id: child.clone(),
                state,
                reason: reason::FORKED.into(),
                spec: spec.clone(),
                resources: resources.clone(),
                node: node_name,
                image_digest: source.image_digest.clone(),
                created_at: created_at.clone(),
                started_at: None,
                finished_at: None,
                exit_code: None,
                grace: false,
                usage: None,
                tenant: source.tenant.clone(),
            };
            let this = self.clone();
            tasks.push(tokio::spawn(async move {
                match ready {
                    None => this.create_admitted(row).await,
                    Some(ready) => {
                        // The queued record is what a client polls.
                        if let Err(e) = this.store.insert(&row, None).await {
                            this.admission.release(&row.id);
                            return Err(e.into());
                        }
                        this.wait_then_start(row, ready).await
                    }
                }
            }));
        }
        let results = futures_util::future::join_all(tasks).await;
        // Every child that will ever be made on the layer is made: from now
        // on the children alone keep it.
        if let Err(e) = node.release_fork_layer(&top).await {
            tracing::warn!(layer = %top, error = %e, "releasing a fork layer; its node removes it at its next start");
        }
        let mut made = Vec::with_capacity(results.len());
        let mut failure = None;
        for (child, result) in ids.iter().zip(results) {
            match result {
                Ok(Ok((info, _))) => made.push(info),
                Ok(Err(e)) => {
                    failure.get_or_insert((child.clone(), e));
                }
                Err(e) => {
                    failure.get_or_insert((
                        child.clone(),
                        ApiError::internal(format!("create task: {e}")),
                    ));
                }
            }
        }
        if let Some((child, mut e)) = failure {
            let removed = futures_util::future::join_all(
                made.iter()
                    .map(|info| self.destroy(&info.id, reason::CREATE_FAILED)),
            )
            .await;
            let kept = removed.iter().filter(|r| r.is_err()).count();
            e.message = format!(
                "fork of {id}: child {child}: {}; {}",
                e.message,
                if kept == 0 {
                    "no child of this fork was kept".to_string()
                } else {
                    format!("{kept} children could not be removed yet and are retried")
                }
            );
            return Err(e);
        }
        let children: Vec<&str> = made.iter().map(|i| i.id.as_str()).collect();
        let held = if req.with_processes {
            format!(
                "with its processes: {} bytes of memory image; stopped {} ms",
                layer.memory_bytes, layer.frozen_ms
            )
        } else {
            format!("frozen {} ms", layer.frozen_ms)
        };
        let message = format!(
            "forked into {} (fork layer {top}: {} bytes, {} entries; {held})",
            children.join(", "),
            layer.bytes,
            layer.entries,
        );
        {
            let _one = self.sandbox_locks.lock(id).await;
            if let Ok(now) = self.records.row(id).await {
                if let Err(e) = self
                    .store
                    .set_spec(id, &now.spec, &now_rfc3339(), reason::FORKED, &message)
                    .await
                {
                    tracing::warn!(sandbox = %id, error = %e, "recording a fork on its source");
                }
            }
        }
        Ok(made)
    }
}
