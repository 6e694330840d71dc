//! Who may reach what: the rules every front door declares per route, and
//! the refusals. A tenant's token reaches its own tenant's sandboxes,
//! batches, pools and secrets only, and what it may not reach answers as
//! what does not exist (404), so a tenant cannot even learn another's ids;
//! a viewer's token reads and never changes (403). The operator's token
//! reaches everything. The checks themselves, which need the control
//! plane's records, are `Gate::check` and `Gate::authorize`
//! (`gate.rs`).

use warren_core::tenant::{Principal, TenantName};
use warren_core::{ApiError, ErrorCode};

/// Something a tenant owns, by how a request names it.
#[derive(Debug, Clone, Copy)]
pub enum Owned<'a> {
    Sandbox(&'a str),
    Batch(&'a str),
    Pool(&'a str),
    /// By name or id.
    Secret(&'a str),
    Volume(&'a str),
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
    Volume,
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

/// One call at a door's gate: who asks, through which door, by which
/// route (its pattern) and naming what (the path's `{id}` or `{name}`).
pub struct Call<'a> {
    pub who: &'a Principal,
    /// `api`, `e2b`, `envd`.
    pub door: &'static str,
    pub method: &'a axum::http::Method,
    pub route: &'a str,
    pub key: &'a str,
}

/// The id or name a routed path names (its `{id}` or `{name}`).
pub fn path_key(params: &axum::extract::RawPathParams) -> String {
    params
        .iter()
        .find(|(k, _)| matches!(*k, "id" | "name"))
        .map(|(_, v)| v.to_string())
        .unwrap_or_default()
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

/// The answer for what another tenant owns: the same as for nothing.
pub(crate) fn hidden(what: Owned<'_>) -> ApiError {
    let m = match what {
        Owned::Sandbox(id) => format!("no sandbox with id {id:?}; list them with `warren ps`"),
        Owned::Batch(id) => format!("no batch {id}; see `warren batch ls`"),
        Owned::Pool(name) => format!("no pool named {name:?}; see `warren pool ls`"),
        Owned::Secret(which) => format!("no secret {which}; see `warren secret ls`"),
        Owned::Volume(name) => format!("volume {name} does not exist (see `warren volume ls`)"),
    };
    ApiError::not_found(m)
}
