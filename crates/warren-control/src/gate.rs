//! The gate: the control plane's side of who may reach what
//! (`crate::access` holds the rules and refusals): the owner of each thing,
//! the checks every door asks for, what a tenant may create, and the audit
//! log's lines. It reads the services that own things; it changes nothing
//! but the audit log.

use warren_core::tenant::{Principal, TenantName};
use warren_core::{ApiError, ErrorCode};

use std::sync::Arc;

use crate::access::{hidden, operator_only, read_only, Access, Call, Kind, Owned, Rule};
use crate::audit::Audit;
use crate::pools::Pools;
use crate::secrets::Secrets;
use crate::store::Store;
use crate::tenants::Tenants;
use crate::volumes::Volumes;
use axum::http::Method;
use axum::response::Response;

/// The gate service (see the module's words).
pub struct Gate {
    store: Arc<dyn Store>,
    tenants: Arc<Tenants>,
    audit: Arc<Audit>,
    secrets: Arc<Secrets>,
    volumes: Arc<Volumes>,
    pools: Arc<Pools>,
}

impl Gate {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        tenants: Arc<Tenants>,
        audit: Arc<Audit>,
        secrets: Arc<Secrets>,
        volumes: Arc<Volumes>,
        pools: Arc<Pools>,
    ) -> Gate {
        Gate {
            store,
            tenants,
            audit,
            secrets,
            volumes,
            pools,
        }
    }

    /// A door's gate: refuses `call` what its route's `rule` does not
    /// allow (answered by `refuse`, in the door's own words), runs it
    /// otherwise, and records it in the audit log when it changes
    /// something, before its answer leaves.
    pub async fn gated(
        &self,
        call: Call<'_>,
        rule: Option<Rule>,
        run: impl std::future::Future<Output = Response>,
        refuse: impl FnOnce(ApiError) -> Response,
    ) -> Response {
        let named = format!("{} {}", call.method, call.route);
        let resp = match self.check(call.who, rule, call.key, &named).await {
            Ok(()) => run.await,
            Err(e) => refuse(e),
        };
        let is_get = call.method == Method::GET || call.method == Method::HEAD;
        if rule.unwrap_or(Rule::Operator).changes(is_get) {
            self.audit_call(&call, resp.status().as_u16());
        }
        resp
    }

    /// Records a change a door answered (see [`crate::audit`]): the
    /// caller's tenant and token id, never a token.
    pub fn audit_call(&self, call: &Call<'_>, status: u16) {
        self.audit.record(&warren_core::audit::AuditEntry {
            time: warren_core::clock::now_rfc3339(),
            tenant: call.who.tenant(),
            token: call.who.token_id().to_string(),
            door: call.door.to_string(),
            method: call.method.to_string(),
            route: call.route.to_string(),
            target: call.key.to_string(),
            status,
        });
    }

    /// Refuses `who` a call under `rule` (None: undeclared, so the
    /// operator's only); `key` is the id or name the call's path names,
    /// `call` how the refusal names the call.
    pub async fn check(
        &self,
        who: &Principal,
        rule: Option<Rule>,
        key: &str,
        call: &str,
    ) -> Result<(), ApiError> {
        if who.is_operator() {
            return Ok(());
        }
        match rule.unwrap_or(Rule::Operator) {
            Rule::Operator => Err(operator_only(call)),
            Rule::Tenant(Access::Change) if !who.may_change() => Err(read_only()),
            Rule::Tenant(_) => Ok(()),
            Rule::Owned(kind, access) => {
                let what = match kind {
                    Kind::Sandbox => Owned::Sandbox(key),
                    Kind::Batch => Owned::Batch(key),
                    Kind::Pool => Owned::Pool(key),
                    Kind::Secret => Owned::Secret(key),
                    Kind::Volume => Owned::Volume(key),
                };
                self.authorize(who, what, access).await
            }
        }
    }

    /// Refuses `who` what it may not do to `what`. A thing that does not
    /// exist passes (the call that follows says so in its own words; a
    /// pool's PUT makes it): only its owner is checked here.
    pub async fn authorize(
        &self,
        who: &Principal,
        what: Owned<'_>,
        access: Access,
    ) -> Result<(), ApiError> {
        if who.is_operator() {
            return Ok(());
        }
        if access == Access::Change && !who.may_change() {
            return Err(read_only());
        }
        match self.owner(what).await? {
            Some(owner) if !who.reaches(&owner) => Err(hidden(what)),
            _ => Ok(()),
        }
    }

    /// `tenant`'s spec, for a create it asks for; refuses what it may not
    /// make: a tenant that is gone (its token read a moment ago), network
    /// rules outside its egress policy, a priority above its own. (Its volumes must be its own: the
    /// placement by volume checks that.)
    pub(crate) async fn tenant_for_create(
        &self,
        tenant: &TenantName,
        spec: &warren_core::SandboxSpec,
    ) -> Result<warren_core::tenant::TenantSpec, ApiError> {
        let t = self.tenants.spec(tenant).await?;
        if tenant.is_default() {
            return Ok(t);
        }
        self.egress_allowed(tenant, &spec.network).await?;
        // Else a tenant's borrowed sandboxes could outrank, and so
        // outlast, the tenants they borrow from.
        if let Some(asked) = spec.priority.filter(|&p| p > t.priority) {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "priority {asked} is above tenant {tenant}'s ({}): a create may lower its priority, not raise it (the operator sets a tenant's with `warren tenant set {tenant} --priority P`)",
                    t.priority
                ),
            ));
        }
        Ok(t)
    }

    /// Refuses network rules outside `tenant`'s egress policy: with one,
    /// each allow rule must be one of its rules, and `open` is refused.
    pub(crate) async fn egress_allowed(
        &self,
        tenant: &TenantName,
        network: &warren_core::spec::NetworkSpec,
    ) -> Result<(), ApiError> {
        if tenant.is_default() {
            return Ok(());
        }
        let Some(allowed) = self.tenants.spec(tenant).await?.egress else {
            return Ok(());
        };
        let refuse = |what: String| {
            ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "{what} is outside tenant {tenant}'s egress policy (its sandboxes may allow only: {})",
                    if allowed.is_empty() { "nothing".to_string() } else { allowed.join(", ") }
                ),
            )
        };
        if network.mode == warren_core::spec::NetworkMode::Open {
            return Err(refuse("network mode 'open'".into()));
        }
        match network
            .allow
            .iter()
            .find(|r| !allowed.iter().any(|a| a.trim() == r.trim()))
        {
            Some(rule) => Err(refuse(format!("the allow rule {rule:?}"))),
            None => Ok(()),
        }
    }

    /// Who owns `what`, if it exists.
    async fn owner(&self, what: Owned<'_>) -> Result<Option<TenantName>, ApiError> {
        Ok(match what {
            Owned::Sandbox(id) => self.store.get(id).await?.map(|r| r.tenant),
            Owned::Batch(id) => self
                .store
                .batches(Some(id))
                .await?
                .into_iter()
                .next()
                .map(|b| b.tenant),
            Owned::Pool(name) => self.pools.owner(name),
            Owned::Secret(which) => self.secrets.owner(which).await?,
            Owned::Volume(name) => Some(self.volumes.owner(name).await?),
        })
    }
}
