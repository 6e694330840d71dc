//! How the control plane keeps its warm pools (state in `crate::pools`):
//! defines and removes them, serves creates from them, and refills them in
//! the background only when a node has room now and no create is waiting.

use std::sync::Arc;
use std::time::Duration;

use warren_core::clock::now_rfc3339;
use warren_core::pool::{PoolInfo, PoolSpec};
use warren_core::state::reason;
use warren_core::tenant::{Principal, TenantName};
use warren_core::{ApiError, SandboxInfo, SandboxSpec, SandboxState};

use super::{new_id_with, Control};
use crate::admission::Request;
use crate::node_errors::node_error;
use crate::store::{PoolRow, SandboxRow};

/// How often the pools are checked besides the wake-ups (a member that
/// ended, a node that came back).
const EVERY: Duration = Duration::from_secs(1);

impl Control {
    /// Defines or redefines a pool of `who`'s tenant (the caller has
    /// checked, with [`crate::gate::Gate::authorize`], that the name is not
    /// another's).
    pub async fn set_pool(
        self: &Arc<Self>,
        who: &Principal,
        name: &str,
        spec: PoolSpec,
    ) -> Result<PoolInfo, ApiError> {
        let tenant = crate::access::changer(who)?;
        self.lifecycle.refuse_if_stopping()?;
        spec.validate(name)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        // Members no node would take (a class no node offers) are refused
        // now, as such a create is, not at each refill.
        let template = spec.template(name);
        if let Ok(resources) = template.resolve() {
            self.admission
                .check_placeable(&Request::of(&template, &resources, ""))
                .map_err(crate::admission::admit_error)?;
        }
        // An image no node can resolve is refused now, not at each refill.
        self.images
            .for_create(
                &tenant,
                self.images.resolver(&Default::default())?.as_ref(),
                &spec.image,
            )
            .await
            .map_err(node_error)?;
        let row = PoolRow {
            name: name.to_string(),
            spec: spec.clone(),
            tenant: tenant.clone(),
        };
        if !self.store.put_pool(&row, &now_rfc3339()).await? {
            return Err(ApiError::conflict(format!(
                "the pool name {name:?} is taken; choose another"
            )));
        }
        // Members made for other resources must not serve the new ones.
        let stale = self.pools.define(name, spec, tenant);
        for id in stale {
            let _ = self.destroy(&id, reason::POOL_SHRUNK).await;
        }
        self.pools.wake();
        self.pools.info(name)
    }

    /// Removes a pool and destroys its ready members.
    pub async fn delete_pool(&self, name: &str) -> Result<PoolInfo, ApiError> {
        let info = self.pools.info(name)?;
        self.store.delete_pool(name).await?;
        let members = self.pools.remove(name);
        for id in members {
            let _ = self.destroy(&id, reason::POOL_SHRUNK).await;
        }
        Ok(info)
    }

    /// Serves a create from a warm pool when one matches and has a ready
    /// member: the member becomes the create's sandbox (its labels, env,
    /// TTL, lease, network policy, request id). None: make one instead.
    pub(crate) async fn claim_from_pool(
        &self,
        tenant: &TenantName,
        spec: &SandboxSpec,
    ) -> Result<Option<SandboxInfo>, ApiError> {
        while let Some((pool, id)) = self.pools.take(tenant, spec) {
            let _one = self.sandbox_locks.lock(&id).await;
            let Ok(row) = self.records.row(&id).await else {
                continue;
            };
            if row.state != SandboxState::Running {
                continue;
            }
            // It keeps the class it runs in (the create's, or the node's
            // default for a create and a pool that name none).
            let spec = &SandboxSpec {
                isolation: row.spec.isolation.or(spec.isolation),
                ..spec.clone()
            };
            let claimed = async {
                let phase = std::time::Instant::now();
                let status = self
                    .nodes
                    .api(&row.node)?
                    .claim(&id, spec.clone())
                    .await
                    .map_err(node_error)?;
                self.metrics.create_phase("claim_node", phase.elapsed());
                let phase = std::time::Instant::now();
                let stored = self
                    .store
                    .claim_pooled(
                        &id,
                        spec,
                        spec.request_id.as_deref(),
                        &now_rfc3339(),
                        &format!("taken from warm pool {pool}"),
                    )
                    .await
                    .map_err(ApiError::from);
                self.metrics.create_phase("claim_store", phase.elapsed());
                stored.map(|()| status)
            }
            .await;
            match claimed {
                Ok(status) => {
                    self.pools.count_claim(pool);
                    // The row as the claim left it (held under the
                    // sandbox's lock, nothing else changed it) and the
                    // node's answer: no second look at either.
                    let row = SandboxRow {
                        spec: spec.clone(),
                        ..row
                    };
                    let answer = self.records.info_with(row, Some(&status), false);
                    // The refill's create takes the CPUs for a while: only
                    // once this create has its answer.
                    self.pools.wake();
                    return Ok(Some(answer));
                }
                Err(e) => {
                    // Half-claimed: it belongs to nobody; make a fresh one.
                    tracing::warn!(%id, %pool, error = %e.message, "a pool member could not be claimed; destroying it");
                    let _ = self.destroy_locked(&id, reason::POOL_SHRUNK).await;
                    self.pools.wake();
                }
            }
        }
        Ok(None)
    }

    /// Loads the pools after recovery and keeps them filled until the
    /// control plane stops.
    pub async fn keep_pools(self: Arc<Self>) {
        if self.lifecycle.wait_ready().await.is_err() {
            return;
        }
        if let Err(e) = self.load_pools().await {
            tracing::warn!(error = %e.message, "could not load the warm pools; they stay empty");
            return;
        }
        loop {
            tokio::select! {
                _ = self.pools.woken() => {}
                _ = tokio::time::sleep(EVERY) => {}
                _ = self.lifecycle.stopped() => return,
            }
            self.refill().await;
        }
    }

    /// The definitions from the store, and their members from the records
    /// (they survive restarts like any sandbox); members of pools that are
    /// gone are destroyed.
    async fn load_pools(self: &Arc<Self>) -> Result<(), ApiError> {
        let defs = self.store.pools().await?;
        let rows = self.store.list(&[SandboxState::Running]).await?;
        for id in self.pools.load(defs, rows) {
            let _ = self.destroy(&id, reason::POOL_SHRUNK).await;
        }
        Ok(())
    }

    /// One pass: sheds members while a node's memory is short or a pool is
    /// over its size, and starts the missing ones that fit now.
    async fn refill(self: &Arc<Self>) {
        let pressure = self
            .nodes
            .all()
            .iter()
            .any(|n| n.view().info.load.memory_pressure);
        for (name, def, tenant) in self.pools.defs() {
            let surplus = self.pools.shed(&name, |ready| {
                if pressure {
                    ready.saturating_sub(1)
                } else {
                    def.size as usize
                }
            });
            for id in surplus {
                let _ = self.destroy(&id, reason::POOL_SHRUNK).await;
            }
            if pressure {
                continue;
            }
            let missing = self.pools.missing(&name, def.size);
            for _ in 0..missing {
                if !self.start_member(&name, &def, &tenant).await {
                    break;
                }
            }
        }
    }

    /// Starts one member if a node has room now; false when none has.
    async fn start_member(
        self: &Arc<Self>,
        name: &str,
        def: &PoolSpec,
        tenant: &TenantName,
    ) -> bool {
        let spec = def.template(name);
        let Ok(resources) = spec.resolve() else {
            return false;
        };
        let Ok(resolver) = self.images.resolver(&spec.node_selector) else {
            return false;
        };
        let Ok(image) = self
            .images
            .for_create(tenant, resolver.as_ref(), &spec.image)
            .await
        else {
            return false;
        };
        let Ok(owner) = self.tenants.spec(tenant).await else {
            return false;
        };
        let id = new_id_with("sbx");
        // Members count against their tenant's quota and share, as any
        // sandbox of its does.
        let ask = Request::of(&spec, &resources, &image.digest)
            .for_tenant(tenant.clone(), owner.priority_of(&spec));
        let Some(node) = self.admission.try_admit(&id, ask) else {
            return false;
        };
        self.pools.filling(name);
        let row = SandboxRow {
            tenant: tenant.clone(),
            ..SandboxRow::new(
                &id,
                spec,
                resources,
                node,
                image.digest,
                SandboxState::Creating,
            )
        };
        let (this, name) = (self.clone(), name.to_string());
        tokio::spawn(async move {
            let made = this.create_admitted(row).await;
            let made = match made {
                Ok((info, _)) => Some(info),
                Err(e) => {
                    tracing::warn!(pool = %name, error = %e.message, "a warm pool member could not be made");
                    None
                }
            };
            let unwanted = this.pools.made(&name, made);
            if let Some(id) = unwanted {
                let _ = this.destroy(&id, reason::POOL_SHRUNK).await;
            }
        });
        true
    }
}
