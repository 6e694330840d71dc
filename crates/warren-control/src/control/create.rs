//! Creating a sandbox: validation, the queue, the record and the node's
//! create side by side, and what a failure leaves.

use std::sync::Arc;

use tracing::Instrument;

use warren_core::clock::now_rfc3339;
use warren_core::state::reason;
use warren_core::tenant::{Principal, TenantName};
use warren_core::{ApiError, Isolation, SandboxInfo, SandboxSpec, SandboxState};
use warren_node_api::{CreateSandbox, ErrorKind, NodeError, SandboxStatus};

use super::{new_id, Control};
use crate::admission::{admit_error, Admit, Request};
use crate::node_errors::node_error;
use crate::store::{SandboxRow, StoreError, Transition};
use crate::traces;

/// What the node is asked to run for a record, with the values of the
/// secrets it names.
async fn create_request(row: &SandboxRow, control: &Control) -> Result<CreateSandbox, NodeError> {
    let secrets = control
        .secrets
        .resolve(&row.spec.secrets, &row.tenant)
        .await
        .map_err(|e| {
            use warren_core::ErrorCode;
            let kind = match e.code {
                ErrorCode::BadRequest => ErrorKind::Invalid,
                ErrorCode::Unavailable => ErrorKind::Unavailable,
                _ => ErrorKind::Internal,
            };
            NodeError::new(kind, e.message)
        })?;
    Ok(CreateSandbox {
        id: row.id.clone(),
        spec: row.spec.clone(),
        resources: row.resources.clone(),
        image_digest: row.image_digest.clone(),
        image_source: control.images.source(&row.spec.image, &row.image_digest),
        devices: Vec::new(),
        device_env: Default::default(),
        secrets,
    })
}

/// Creates the record's sandbox on `node`, in a span of the call whose
/// children are the node's phases (see [`traces::node_phases`]).
async fn create_on(
    node: &dyn warren_node_api::NodeApi,
    row: &SandboxRow,
    control: &Control,
) -> Result<SandboxStatus, NodeError> {
    let req = create_request(row, control).await?;
    let span = tracing::info_span!("node create", otel.kind = "client");
    traces::node(&span, &row.node);
    let began = std::time::SystemTime::now();
    let (created, took) = timed(node.create(req).instrument(span.clone())).await;
    match &created {
        Ok(status) => traces::node_phases(&span, began, took, &status.phases),
        Err(e) => traces::failed(&span, &e.message),
    }
    created
}
/// A request id answers with the sandbox it made only to its own tenant;
/// another tenant's reuse of it is refused without showing that sandbox.
fn same_tenant(existing: &SandboxRow, tenant: &TenantName, rid: &str) -> Result<(), ApiError> {
    if &existing.tenant == tenant {
        Ok(())
    } else {
        Err(ApiError::conflict(format!(
            "request_id {rid:?} is taken; use another"
        )))
    }
}

/// A future's output and how long it took.
async fn timed<T>(f: impl std::future::Future<Output = T>) -> (T, std::time::Duration) {
    let t = std::time::Instant::now();
    let out = f.await;
    (out, t.elapsed())
}

impl Control {
    /// Gives a spec that names no isolation class its node's default (the
    /// first class the node lists; `container` for a node that lists
    /// none), so that the record shows, and the node is told, the class it
    /// runs in. True when it changed the spec.
    pub(crate) fn resolve_isolation(&self, spec: &mut SandboxSpec, node: &str) -> bool {
        if spec.isolation.is_some() {
            return false;
        }
        let Some(entry) = self.nodes.get(node) else {
            return false;
        };
        let class = entry.update(|v| Isolation::default_of(&v.info.isolation));
        spec.isolation = Some(class);
        true
    }

    /// Validates, admits (or queues) and creates a sandbox. The work runs in
    /// its own task, so a client that disconnects cannot leave a sandbox
    /// half made. With `wait == false` a queued create answers at once.
    /// The sandbox belongs to `who`'s tenant.
    pub async fn create(
        self: &Arc<Self>,
        who: &Principal,
        spec: SandboxSpec,
        wait: bool,
    ) -> Result<(SandboxInfo, bool), ApiError> {
        let tenant = crate::access::changer(who)?;
        self.create_pinned(&tenant, spec, wait, None).await
    }

    /// A create for `tenant`, on `node` only when given (a build's steps,
    /// whose images are on the node that made them); a pinned create takes
    /// no pooled sandbox. Its trace's root span: its phases are children.
    pub(crate) async fn create_pinned(
        self: &Arc<Self>,
        tenant: &TenantName,
        spec: SandboxSpec,
        wait: bool,
        node: Option<&str>,
    ) -> Result<(SandboxInfo, bool), ApiError> {
        let span = tracing::info_span!("sandbox create");
        traces::owner(&span, tenant, &spec.labels);
        let created = self
            .create_traced(tenant, spec, wait, node)
            .instrument(span.clone())
            .await;
        match &created {
            Ok((info, _)) => {
                traces::sandbox_id(&span, &info.id);
                traces::node(&span, &info.node);
            }
            Err(e) => traces::failed(&span, &e.message),
        }
        created
    }

    /// [`Control::create_pinned`] inside its span.
    async fn create_traced(
        self: &Arc<Self>,
        tenant: &TenantName,
        mut spec: SandboxSpec,
        wait: bool,
        node: Option<&str>,
    ) -> Result<(SandboxInfo, bool), ApiError> {
        let started = std::time::Instant::now();
        self.lifecycle.refuse_if_stopping()?;
        let priority = self
            .gate
            .tenant_for_create(tenant, &spec)
            .await?
            .priority_of(&spec);
        if spec.fork.is_some() {
            return Err(ApiError::bad_request(
                "fork is set by a fork (POST /v1/sandboxes/{id}/fork, `warren fork ID`) on its children; a create cannot name one",
            ));
        }
        self.profiles.apply(tenant, &mut spec).await?;
        let resources = spec
            .resolve()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        if let Some(rid) = &spec.request_id {
            if let Some(existing) = self.store.by_request_id(rid).await? {
                same_tenant(&existing, tenant, rid)?;
                let settled = self.settled(existing, wait).await?;
                return Ok((self.records.info(settled, false).await, false));
            }
        }
        self.secrets.check(&spec.secrets, tenant).await?;
        let _name = self.claim_name(tenant, spec.name.as_ref()).await?;
        // Volumes live on one node: the sandbox goes there.
        let volume_node = match node {
            None => self.volumes.node_of(tenant, &spec.volumes).await?,
            Some(_) => None,
        };
        let node = node.or(volume_node.as_deref());
        // A pool's members are nameless; a named sandbox is made anew.
        let pooled = match (node, &spec.name) {
            (None, None) => self.claim_from_pool(tenant, &spec).await?,
            _ => None,
        };
        if let Some(info) = pooled {
            self.metrics
                .create_seconds
                .observe(started.elapsed().as_secs_f64());
            return Ok((info, true));
        }
        let phase = std::time::Instant::now();
        let resolver = match node {
            Some(node) => self.nodes.api(node)?,
            None => self.images.resolver(&spec.node_selector)?,
        };
        let image = self
            .images
            .for_create(tenant, resolver.as_ref(), &spec.image)
            .instrument(tracing::info_span!("image resolve"))
            .await
            .map_err(node_error)?;
        self.metrics.create_phase("image_resolve", phase.elapsed());
        let id = new_id();
        traces::sandbox_id(&tracing::Span::current(), &id);
        let phase = std::time::Instant::now();
        // Admission and placement are one step (under one lock): the
        // tenant's quota and queue, then the node, or a place in the queue.
        let admitting = tracing::info_span!("admission", warren.queued = tracing::field::Empty);
        let admit = admitting
            .in_scope(|| {
                self.admission.admit(&id, {
                    let mut ask = Request::of(&spec, &resources, &image.digest)
                        .for_tenant(tenant.clone(), priority);
                    ask.node = node.map(str::to_string);
                    ask
                })
            })
            .map_err(admit_error)
            .inspect_err(|e| traces::failed(&admitting, &e.message))?;
        match &admit {
            Admit::Now(node) => traces::node(&admitting, node),
            Admit::Queued { .. } => {
                admitting.record("warren.queued", true);
            }
        }
        drop(admitting);
        self.metrics.create_phase("admission", phase.elapsed());
        let (queued, node) = match &admit {
            Admit::Now(node) => (false, node.clone()),
            Admit::Queued { .. } => (true, String::new()),
        };
        let state = if queued {
            SandboxState::Queued
        } else {
            SandboxState::Creating
        };
        let row = SandboxRow {
            tenant: tenant.clone(),
            ..SandboxRow::new(
                &id,
                spec.clone(),
                resources.clone(),
                node,
                image.digest.clone(),
                state,
            )
        };
        let this = self.clone();
        let task = match admit {
            Admit::Now(_) => {
                tokio::spawn(async move { this.create_admitted(row).await }.in_current_span())
            }
            Admit::Queued { ready, .. } => {
                // The queued record is what a client polls; it must exist first.
                if let Err(e) = self.store.insert(&row, spec.request_id.as_deref()).await {
                    self.admission.release(&id);
                    return self.insert_failed(e, &row).await;
                }
                let task = tokio::spawn(this.wait_then_start(row, ready).in_current_span());
                if !wait {
                    let row = self.records.row(&id).await?;
                    return Ok((self.records.info(row, false).await, true));
                }
                task
            }
        };
        let result = task
            .await
            .map_err(|e| ApiError::internal(format!("create task: {e}")))?;
        if result.is_ok() {
            self.metrics
                .create_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        result
    }

    /// A queued create: waits for its capacity, then creates.
    pub(crate) async fn wait_then_start(
        self: Arc<Self>,
        row: SandboxRow,
        ready: tokio::sync::oneshot::Receiver<String>,
    ) -> Result<(SandboxInfo, bool), ApiError> {
        let queued_at = std::time::Instant::now();
        let waited = ready.instrument(tracing::info_span!("queue wait")).await;
        self.metrics
            .queue_wait_seconds
            .observe(queued_at.elapsed().as_secs_f64());
        let Ok(node) = waited else {
            return Err(ApiError::conflict(format!(
                "sandbox {} left the queue before its turn (deleted, or the daemon is stopping)",
                row.id
            )));
        };
        self.start_queued(row, node).await
    }

    /// A replayed create (same request id) answers what the first one
    /// made, once it is past `creating` (and `queued`, when the caller
    /// waits): the first create's answer would have been no earlier.
    pub(crate) async fn settled(
        &self,
        mut row: SandboxRow,
        wait: bool,
    ) -> Result<SandboxRow, ApiError> {
        loop {
            let busy =
                row.state == SandboxState::Creating || (wait && row.state == SandboxState::Queued);
            if !busy {
                return Ok(row);
            }
            // The create holds the sandbox's lock until it is done.
            drop(self.sandbox_locks.lock(&row.id).await);
            if row.state == SandboxState::Queued {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            row = self.records.row(&row.id).await?;
        }
    }

    pub(crate) async fn insert_failed(
        &self,
        e: StoreError,
        row: &SandboxRow,
    ) -> Result<(SandboxInfo, bool), ApiError> {
        let (spec, row_tenant) = (&row.spec, row.tenant.clone());
        // A concurrent create with the same request id won the race.
        if let (true, Some(rid)) = (e.is_duplicate(), &spec.request_id) {
            if let Some(existing) = self.store.by_request_id(rid).await? {
                same_tenant(&existing, &row_tenant, rid)?;
                let settled = self.settled(existing, true).await?;
                return Ok((self.records.info(settled, false).await, false));
            }
        }
        Err(e.into())
    }

    /// Capacity is reserved: record and create side by side. A crash in
    /// between leaves either a record without a sandbox (marked failed at
    /// restart) or a sandbox without a record (swept at restart).
    pub(crate) async fn create_admitted(
        &self,
        mut row: SandboxRow,
    ) -> Result<(SandboxInfo, bool), ApiError> {
        let id = row.id.clone();
        self.resolve_isolation(&mut row.spec, &row.node);
        let _under_way = match self.lifecycle.begin_create() {
            Ok(under_way) => under_way,
            Err(e) => {
                self.admission.release(&id);
                return Err(e);
            }
        };
        let _one = self.sandbox_locks.lock(&id).await;
        let node = match self.nodes.api(&row.node) {
            Ok(node) => node,
            Err(e) => {
                self.admission.release(&id);
                return Err(e);
            }
        };
        let (inserted, created) = tokio::join!(
            timed(
                self.store
                    .insert(&row, row.spec.request_id.as_deref())
                    .instrument(tracing::info_span!("store insert"))
            ),
            timed(create_on(node.as_ref(), &row, self))
        );
        let ((inserted, insert_took), (created, create_took)) = (inserted, created);
        self.metrics.create_phase("store_insert", insert_took);
        if created.is_ok() {
            self.metrics.create_phase("node_create", create_took);
        }
        if let Err(e) = inserted {
            if created.is_ok() {
                let _ = node.destroy(&id, reason::CREATE_FAILED).await;
            }
            self.admission.release(&id);
            return self.insert_failed(e, &row).await;
        }
        warren_crashpoint::hit("create:recorded");
        self.finish_create(&id, created).await
    }

    /// A queued create whose turn has come, on `node`.
    pub(crate) async fn start_queued(
        &self,
        mut row: SandboxRow,
        node: String,
    ) -> Result<(SandboxInfo, bool), ApiError> {
        let id = row.id.clone();
        let _one = self.sandbox_locks.lock(&id).await;
        // Deleted while it waited, after the capacity was granted?
        if self.records.row(&id).await?.state != SandboxState::Queued {
            self.admission.release(&id);
            return Err(ApiError::conflict(format!(
                "sandbox {id} was deleted while it waited for capacity"
            )));
        }
        let now = now_rfc3339();
        let api = match self.nodes.api(&node) {
            Ok(api) => api,
            Err(e) => {
                self.admission.release(&id);
                return Err(e);
            }
        };
        // Its class is decided with its node, and recorded with it.
        let resolved = self.resolve_isolation(&mut row.spec, &node);
        let t = Transition {
            node: Some(&node),
            spec: resolved.then_some(&row.spec),
            ..Default::default()
        };
        self.store
            .transition(&id, SandboxState::Creating, reason::ADMITTED, &now, t)
            .await?;
        row.node = node;
        let (created, took) = timed(create_on(api.as_ref(), &row, self)).await;
        if created.is_ok() {
            self.metrics.create_phase("node_create", took);
        }
        self.finish_create(&id, created).await
    }

    /// The node made it: recorded as running, its main process started,
    /// the create's answer made.
    async fn record_started(
        &self,
        id: &str,
        status: SandboxStatus,
    ) -> Result<(SandboxInfo, bool), ApiError> {
        for p in &status.phases {
            self.metrics
                .create_phase(&p.phase, std::time::Duration::from_micros(p.micros));
        }
        let phase = std::time::Instant::now();
        let started = now_rfc3339();
        let t = Transition {
            started_at: Some(&started),
            ..Default::default()
        };
        self.admission.started(id);
        self.store
            .transition(id, SandboxState::Running, reason::READY, &started, t)
            .await?;
        let row = self.records.row(id).await?;
        if let Err(e) = self.nodes.api(&row.node)?.start_main(id).await {
            let message = e.to_string();
            let _ = self.destroy_locked(id, reason::CREATE_FAILED).await;
            return Err(ApiError::internal(format!(
                "sandbox {id}: main process: {message}"
            )));
        }
        let info = self.records.info_with(row, Some(&status), false);
        self.metrics.create_phase("answer", phase.elapsed());
        Ok((info, true))
    }

    pub(crate) async fn finish_create(
        &self,
        id: &str,
        created: Result<SandboxStatus, NodeError>,
    ) -> Result<(SandboxInfo, bool), ApiError> {
        match created {
            Ok(status) => {
                self.record_started(id, status)
                    .instrument(tracing::info_span!("answer"))
                    .await
            }
            Err(e) => {
                self.admission.release(id);
                let message = e.to_string();
                let now = now_rfc3339();
                let t = Transition {
                    finished_at: Some(&now),
                    message: &message,
                    ..Default::default()
                };
                self.store
                    .transition(id, SandboxState::Failed, reason::CREATE_FAILED, &now, t)
                    .await?;
                Err(match node_error(e) {
                    ApiError {
                        code: warren_core::ErrorCode::Internal,
                        message,
                        ..
                    } => {
                        ApiError::internal(format!("sandbox {id} could not be created: {message}"))
                    }
                    other => other,
                })
            }
        }
    }
}
