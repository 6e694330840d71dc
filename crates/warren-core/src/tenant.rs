//! Tenants: the teams and training runs that share one Warren. Each owns
//! its sandboxes, batches, pools, profiles, secrets, volumes and builds,
//! reaches them with its own tokens, and is lent capacity up to its quota
//! and by its weight when the cluster is full (weighted fair share of the
//! dominant resource, as Kueue's cohorts and YARN's capacity scheduler).
//! The operator's token (`<home>/token`) is admin of every tenant; what it
//! makes belongs to [`DEFAULT_TENANT`].

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::units::{ByteSize, Cpu};

/// The tenant every operator-made thing (and everything made before
/// tenants existed) belongs to. It always exists and has no quota.
pub const DEFAULT_TENANT: &str = "default";

/// The most a tenant's weight may be (weights are relative: 1:1:2).
pub const MAX_WEIGHT: u32 = 1000;

/// What every tenant token starts with, so one found in a log or a
/// repository is recognised (and never confused with the operator's).
pub const TOKEN_PREFIX: &str = "wrt_";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    #[error("tenant name {0:?}: 1 to 63 lower-case letters, digits and `-`, starting with a letter or digit")]
    Name(String),
    #[error("role {0:?}: use admin, user or viewer")]
    Role(String),
    #[error("weight {0}: use 1 to {MAX_WEIGHT}")]
    Weight(u32),
}

/// A tenant's name: lower-case, so it can be a label value, a path segment
/// and a metrics label as it is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "String", into = "String")]
#[schema(value_type = String, example = "team-a")]
pub struct TenantName(String);

impl TenantName {
    /// The tenant of the operator's own things.
    pub fn default_tenant() -> TenantName {
        TenantName(DEFAULT_TENANT.to_string())
    }

    pub fn is_default(&self) -> bool {
        self.0 == DEFAULT_TENANT
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TenantName {
    fn default() -> TenantName {
        TenantName::default_tenant()
    }
}

impl TryFrom<String> for TenantName {
    type Error = TenantError;

    fn try_from(s: String) -> Result<Self, TenantError> {
        let ok = (1..=63).contains(&s.len())
            && s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if ok {
            Ok(TenantName(s))
        } else {
            Err(TenantError::Name(s))
        }
    }
}

impl From<TenantName> for String {
    fn from(n: TenantName) -> String {
        n.0
    }
}

impl std::str::FromStr for TenantName {
    type Err = TenantError;

    fn from_str(s: &str) -> Result<Self, TenantError> {
        TenantName::try_from(s.to_string())
    }
}

impl std::fmt::Display for TenantName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, so tables can give it a width.
        f.pad(&self.0)
    }
}

/// What a token may do within its tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A user's rights, and the tenant's tokens to make and revoke.
    Admin,
    /// Makes, uses and removes the tenant's things.
    User,
    /// Reads the tenant's things; changes nothing, runs nothing.
    Viewer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::User => "user",
            Role::Viewer => "viewer",
        }
    }

    /// Whether it may change anything (create, exec, write, destroy).
    pub fn may_change(self) -> bool {
        self != Role::Viewer
    }
}

impl std::str::FromStr for Role {
    type Err = TenantError;

    fn from_str(s: &str) -> Result<Self, TenantError> {
        match s {
            "admin" => Ok(Role::Admin),
            "user" => Ok(Role::User),
            "viewer" => Ok(Role::Viewer),
            _ => Err(TenantError::Role(s.to_string())),
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// The most a tenant's live sandboxes may request in all (requests, not
/// limits, as Kubernetes' ResourceQuota counts them). `None`: no bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandboxes: Option<u32>,
}

/// A weight of 1 to [`MAX_WEIGHT`]; made only through validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "u32", into = "u32")]
#[schema(value_type = u32, example = 1)]
pub struct Weight(u32);

impl Weight {
    pub fn get(self) -> u32 {
        self.0
    }
}

impl Default for Weight {
    fn default() -> Weight {
        Weight(1)
    }
}

impl TryFrom<u32> for Weight {
    type Error = TenantError;

    fn try_from(w: u32) -> Result<Self, TenantError> {
        if (1..=MAX_WEIGHT).contains(&w) {
            Ok(Weight(w))
        } else {
            Err(TenantError::Weight(w))
        }
    }
}

impl From<Weight> for u32 {
    fn from(w: Weight) -> u32 {
        w.0
    }
}

/// How a tenant shares the cluster (`warren tenant create|set`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    #[serde(default)]
    pub quota: Quota,
    /// Its share of a full cluster, relative to the other waiting tenants'.
    #[serde(default)]
    pub weight: Weight,
    /// Its creates' priority when none gives: higher goes first within
    /// the tenant, and lower is preempted first.
    #[serde(default)]
    pub priority: i32,
    /// Whether it takes its share back by preempting the newest sandboxes
    /// other tenants run on borrowed capacity (else it waits for them to end).
    #[serde(default)]
    pub preempt: bool,
    /// Hosts its sandboxes may allow egress to (allowlist rules, as a
    /// sandbox's `network.allow`); `None`: any the node permits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<String>>,
}

impl TenantSpec {
    /// The priority a sandbox of this tenant waits and is preempted at:
    /// its create's, else the tenant's.
    pub fn priority_of(&self, spec: &crate::SandboxSpec) -> i32 {
        spec.priority.unwrap_or(self.priority)
    }
}

/// `POST /v1/tenants`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantRequest {
    pub name: TenantName,
    #[serde(flatten)]
    pub spec: TenantSpec,
}

/// What a tenant's live sandboxes request in all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantUsage {
    pub cpu_millis: u64,
    pub memory: u64,
    pub gpus: u32,
    pub sandboxes: u32,
}

/// A tenant as `GET /v1/tenants` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantInfo {
    pub name: TenantName,
    #[serde(flatten)]
    pub spec: TenantSpec,
    /// What its live sandboxes hold now.
    #[serde(default)]
    pub usage: TenantUsage,
    /// Its creates waiting for quota or capacity.
    #[serde(default)]
    pub queued: u32,
    pub created_at: String,
}

/// `POST /v1/tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TokenRequest {
    pub tenant: TenantName,
    #[serde(default = "default_role")]
    pub role: Role,
    /// What it is for (shown by `warren token ls`).
    #[serde(default)]
    pub description: String,
}

fn default_role() -> Role {
    Role::User
}

/// A token as listed: never its value (only its hash is kept).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TokenInfo {
    pub id: String,
    pub tenant: TenantName,
    pub role: Role,
    #[serde(default)]
    pub description: String,
    pub created_at: String,
}

/// A token just made: its value is shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NewToken {
    #[serde(flatten)]
    pub info: TokenInfo,
    pub token: String,
}

/// Who is calling, once their token is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The operator's token: admin of every tenant.
    Operator,
    /// A tenant's token.
    Tenant {
        tenant: TenantName,
        role: Role,
        /// The token's id (recorded in the audit log; never its value).
        token: String,
    },
}

impl Principal {
    /// The tenant whose things it acts on and makes: the operator's are
    /// the default tenant's.
    pub fn tenant(&self) -> TenantName {
        match self {
            Principal::Operator => TenantName::default_tenant(),
            Principal::Tenant { tenant, .. } => tenant.clone(),
        }
    }

    /// Whether it may see and act on what `owner` owns.
    pub fn reaches(&self, owner: &TenantName) -> bool {
        match self {
            Principal::Operator => true,
            Principal::Tenant { tenant, .. } => tenant == owner,
        }
    }

    /// Whether it may change anything at all.
    pub fn may_change(&self) -> bool {
        match self {
            Principal::Operator => true,
            Principal::Tenant { role, .. } => role.may_change(),
        }
    }

    /// The one tenant whose things it sees; None: every tenant's.
    pub fn scope(&self) -> Option<&TenantName> {
        match self {
            Principal::Operator => None,
            Principal::Tenant { tenant, .. } => Some(tenant),
        }
    }

    pub fn is_operator(&self) -> bool {
        matches!(self, Principal::Operator)
    }

    /// Its token's id, for the audit log (`operator` for the operator's).
    pub fn token_id(&self) -> &str {
        match self {
            Principal::Operator => "operator",
            Principal::Tenant { token, .. } => token,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lower_case_labels() {
        for ok in ["team-a", "a", "0x", DEFAULT_TENANT] {
            assert!(ok.parse::<TenantName>().is_ok(), "{ok}");
        }
        for bad in ["", "Team", "-a", "a_b", "a.b", "a b", &"x".repeat(64)] {
            assert!(bad.parse::<TenantName>().is_err(), "{bad}");
        }
    }

    #[test]
    fn specs_parse_quantities_and_refuse_what_they_do_not_know() {
        let spec: TenantSpec = serde_json::from_str(
            r#"{"quota":{"cpu":"4","memory":"8G","gpus":1,"sandboxes":100},"weight":2}"#,
        )
        .unwrap();
        assert_eq!(spec.quota.cpu, Some(Cpu(4000)));
        assert_eq!(spec.weight.get(), 2);
        assert!(serde_json::from_str::<TenantSpec>(r#"{"weight":0}"#).is_err());
        assert!(serde_json::from_str::<TenantSpec>(r#"{"weigth":2}"#).is_err());
        assert!(serde_json::from_str::<TenantSpec>(r#"{"quota":{"cpus":2}}"#).is_err());
    }

    #[test]
    fn a_tenant_reaches_only_its_own() {
        let a = Principal::Tenant {
            tenant: "a".parse().unwrap(),
            role: Role::Viewer,
            token: "tok-1".into(),
        };
        assert!(a.reaches(&"a".parse().unwrap()));
        assert!(!a.reaches(&"b".parse().unwrap()));
        assert!(!a.may_change());
        assert!(Principal::Operator.reaches(&"b".parse().unwrap()));
    }
}
