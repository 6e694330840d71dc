//! Who may reach what: every front door asks here, with the caller's
//! [`Principal`], before it acts on a sandbox, batch, pool or secret. A tenant's token reaches its own tenant's things only, and what
//! it may not reach answers as what does not exist (404), so a tenant
//! cannot even learn another's ids; a viewer's token reads and never
//! changes (403). The operator's token reaches everything.

use warren_core::tenant::{Principal, TenantName};
use warren_core::{ApiError, ErrorCode};

use crate::control::Control;

/// Something a tenant owns, by how a request names it.
#[derive(Debug, Clone, Copy)]
pub enum Owned<'a> {
    Sandbox(&'a str),
    Batch(&'a str),
    Pool(&'a str),
    /// By name or id.
    Secret(&'a str),
}

/// Whether a request only reads, or changes (runs, writes, destroys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Change,
}

/// What kind of thing a route's `{id}` or `{name}` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sandbox,
    Batch,
    Pool,
    Secret,
}

/// Who may make a call: each front door declares one per route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Any token with this access; the call keeps to the caller's tenant
    /// (lists are filtered, what it makes is the tenant's).
    Tenant(Access),
    /// The thing the path names must be the caller's tenant's.
    Owned(Kind, Access),
    /// The operator's token only.
    Operator,
}

impl Rule {
    /// Whether a call under it changes something (and so is audited): a
    /// change by its rule, or any operator's call but a GET.
    pub fn changes(self, is_get: bool) -> bool {
        match self {
            Rule::Tenant(a) | Rule::Owned(_, a) => a == Access::Change,
            Rule::Operator => !is_get,
        }
    }
}

/// A viewer's refusal.
pub fn read_only() -> ApiError {
    ApiError::new(
        ErrorCode::Forbidden,
        "this token's role is viewer: it reads, and changes nothing (ask the tenant's admin for a user token)",
    )
}

/// What only the operator's token may do.
pub fn operator_only(what: &str) -> ApiError {
    ApiError::new(
        ErrorCode::Forbidden,
        format!("{what} is the operator's: it takes the operator's token (<home>/token), not a tenant's"),
    )
}

/// The tenant `who` makes things for, if it may change anything.
pub fn changer(who: &Principal) -> Result<TenantName, ApiError> {
    if !who.may_change() {
        return Err(read_only());
    }
    Ok(who.tenant())
}

impl Control {
    /// Records a change a door answered for `tenant`, asked with the token
    /// `token` names (an id, never a value; see [`crate::audit`]).
    #[allow(clippy::too_many_arguments)]
    pub fn audit_call(
        &self,
        tenant: &TenantName,
        token: &str,
        door: &str,
        method: &str,
        route: &str,
        target: &str,
        status: u16,
    ) {
        self.audit.record(&warren_core::audit::AuditEntry {
            time: warren_core::clock::now_rfc3339(),
            tenant: tenant.clone(),
            token: token.to_string(),
            door: door.to_string(),
            method: method.to_string(),
            route: route.to_string(),
            target: target.to_string(),
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
    /// rules outside its egress policy, volumes (the operator's only, for
    /// now).
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
        if !spec.volumes.is_empty() {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "volumes are the operator's for now: a tenant's sandbox cannot mount one",
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
        })
    }
}

/// The answer for what another tenant owns: the same as for nothing.
fn hidden(what: Owned<'_>) -> ApiError {
    let m = match what {
        Owned::Sandbox(id) => format!("no sandbox with id {id:?}; list them with `warren ps`"),
        Owned::Batch(id) => format!("no batch {id}; see `warren batch ls`"),
        Owned::Pool(name) => format!("no pool named {name:?}; see `warren pool ls`"),
        Owned::Secret(which) => format!("no secret {which}; see `warren secret ls`"),
    };
    ApiError::not_found(m)
}
