//! The tenants service: tenants, their tokens, and who a token is. The
//! operator's token (`<home>/token`) is checked here too, so every front
//! door (the API, E2B, the console) learns a caller's [`Principal`] one
//! way. Tokens are kept as the SHA-256 of their value: a stolen database
//! gives no token. A token is 32 random bytes, so a plain hash suffices (a
//! slow password hash protects guessable secrets, which these are not).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use sha2::{Digest, Sha256};
use warren_core::clock::now_rfc3339;
use warren_core::sync::lock;
use warren_core::tenant::{
    NewToken, Principal, Role, TenantInfo, TenantName, TenantRequest, TenantSpec, TokenInfo,
    TokenRequest, TOKEN_PREFIX,
};
use warren_core::{ApiError, ErrorCode, SandboxState};

use crate::admission::Admission;
use crate::pools::Pools;
use crate::store::{SandboxRow, Store, TenantRow, TokenRow};

/// How long a token's check is remembered: a revocation made through
/// another replica of a cluster takes effect within this (at once on the
/// replica that made it).
const REMEMBER: Duration = Duration::from_secs(2);
/// Checks remembered at most (wrong tokens included), so a flood of made-up
/// tokens cannot grow memory.
const REMEMBERED_MAX: usize = 10_000;

pub struct Tenants {
    store: Arc<dyn Store>,
    /// Each tenant's quota, weight and priority, as admission holds them.
    admission: Arc<Admission>,
    /// The pools, whose owners a tenant's removal checks.
    pools: Arc<Pools>,
    /// The operator's token; None where the daemon has none (tests that
    /// build a control plane alone).
    operator: Option<String>,
    /// Hash of a token → its row (None: no such token), and when read.
    seen: Mutex<HashMap<String, (Option<TokenRow>, Instant)>>,
    /// Every tenant's spec and when it was made: read from the store once,
    /// then kept with each change made here (a cluster's changes all go
    /// through its leader, and a new leader reads them afresh), so a create
    /// reads no tenant from the store.
    known: tokio::sync::RwLock<Option<BTreeMap<TenantName, (TenantSpec, String)>>>,
}

fn hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn unknown_tenant(name: &TenantName) -> ApiError {
    ApiError::not_found(format!(
        "no tenant {name}; list them with `warren tenant ls`"
    ))
}

fn forbidden(m: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::Forbidden, m)
}

impl Tenants {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        operator: Option<String>,
        admission: Arc<Admission>,
        pools: Arc<Pools>,
    ) -> Tenants {
        Tenants {
            store,
            admission,
            pools,
            operator,
            seen: Mutex::new(HashMap::new()),
            known: Default::default(),
        }
    }

    /// The tenants as kept (read from the store the first time).
    async fn table(&self) -> Result<BTreeMap<TenantName, (TenantSpec, String)>, ApiError> {
        self.with_table(BTreeMap::clone).await
    }

    /// `f` of the tenants as kept (read from the store the first time),
    /// under the read lock: a create's lookup copies one entry, not all.
    async fn with_table<T>(
        &self,
        f: impl FnOnce(&BTreeMap<TenantName, (TenantSpec, String)>) -> T,
    ) -> Result<T, ApiError> {
        if let Some(t) = self.known.read().await.as_ref() {
            return Ok(f(t));
        }
        let mut known = self.known.write().await;
        if known.is_none() {
            let table: BTreeMap<_, _> = self
                .store
                .tenants()
                .await?
                .into_iter()
                .map(|t| (t.name, (t.spec, t.created_at)))
                .collect();
            *known = Some(table);
        }
        Ok(f(known.as_ref().unwrap_or(&BTreeMap::new())))
    }

    /// Records a change made to the store in the kept table.
    async fn keep(&self, name: &TenantName, row: Option<(TenantSpec, String)>) {
        if let Some(t) = self.known.write().await.as_mut() {
            match row {
                Some(row) => t.insert(name.clone(), row),
                None => t.remove(name),
            };
        }
    }

    /// Who `token` is: the operator, a tenant's token, or nobody (None).
    pub async fn authenticate(&self, token: &str) -> Result<Option<Principal>, ApiError> {
        use subtle::ConstantTimeEq;
        if let Some(op) = &self.operator {
            if bool::from(token.as_bytes().ct_eq(op.as_bytes())) {
                return Ok(Some(Principal::Operator));
            }
        }
        if !token.starts_with(TOKEN_PREFIX) {
            return Ok(None);
        }
        let h = hash(token);
        let remembered = lock(&self.seen)
            .get(&h)
            .filter(|(_, at)| at.elapsed() < REMEMBER)
            .map(|(row, _)| row.clone());
        let row = match remembered {
            Some(row) => row,
            None => {
                let row = self.store.token_by_hash(&h).await?;
                let mut seen = lock(&self.seen);
                if seen.len() >= REMEMBERED_MAX {
                    seen.clear();
                }
                seen.insert(h, (row.clone(), Instant::now()));
                row
            }
        };
        Ok(row.map(|r| Principal::Tenant {
            tenant: r.info.tenant,
            role: r.info.role,
            token: r.info.id,
        }))
    }

    async fn row(&self, name: &TenantName) -> Result<Option<TenantRow>, ApiError> {
        self.with_table(|t| {
            t.get(name).map(|(spec, created_at)| TenantRow {
                name: name.clone(),
                spec: spec.clone(),
                created_at: created_at.clone(),
            })
        })
        .await
    }

    /// Whether `name` is a tenant (the default one always is).
    pub async fn exists(&self, name: &TenantName) -> Result<bool, ApiError> {
        Ok(name.is_default() || self.row(name).await?.is_some())
    }

    /// A tenant's spec (the default tenant's: no quota, weight 1).
    pub async fn spec(&self, name: &TenantName) -> Result<TenantSpec, ApiError> {
        match self.row(name).await? {
            Some(t) => Ok(t.spec),
            None if name.is_default() => Ok(TenantSpec::default()),
            None => Err(unknown_tenant(name)),
        }
    }

    /// Every tenant's spec, the default one's included.
    pub async fn specs(&self) -> Result<Vec<(TenantName, TenantSpec, String)>, ApiError> {
        let mut out: Vec<_> = self
            .table()
            .await?
            .into_iter()
            .map(|(name, (spec, created_at))| (name, spec, created_at))
            .collect();
        if !out.iter().any(|(n, _, _)| n.is_default()) {
            out.push((
                TenantName::default_tenant(),
                TenantSpec::default(),
                String::new(),
            ));
            out.sort_by(|a, b| a.0.cmp(&b.0));
        }
        Ok(out)
    }

    /// Makes a tenant; 409 if it exists.
    pub async fn create(&self, req: &TenantRequest) -> Result<TenantInfo, ApiError> {
        if self.exists(&req.name).await? {
            return Err(ApiError::conflict(format!(
                "tenant {} already exists; change it with `warren tenant set`",
                req.name
            )));
        }
        let row = TenantRow {
            name: req.name.clone(),
            spec: req.spec.clone(),
            created_at: now_rfc3339(),
        };
        self.store.put_tenant(&row).await?;
        self.keep(&row.name, Some((row.spec.clone(), row.created_at.clone())))
            .await;
        self.admission.set_tenant(&row.name, &row.spec);
        Ok(bare_info(row.name, row.spec, row.created_at))
    }

    /// Replaces a tenant's spec; its sandboxes keep running (a lower quota
    /// holds back its next creates, it ends none).
    pub async fn set(&self, name: &TenantName, spec: TenantSpec) -> Result<TenantInfo, ApiError> {
        let created_at = match self.row(name).await? {
            Some(t) => t.created_at,
            None if name.is_default() => now_rfc3339(),
            None => return Err(unknown_tenant(name)),
        };
        let row = TenantRow {
            name: name.clone(),
            spec,
            created_at,
        };
        self.store.put_tenant(&row).await?;
        self.keep(&row.name, Some((row.spec.clone(), row.created_at.clone())))
            .await;
        self.admission.set_tenant(&row.name, &row.spec);
        Ok(bare_info(row.name, row.spec, row.created_at))
    }

    /// Removes a tenant and its tokens once it owns nothing any more: its
    /// sandboxes ended, its batches, pools and secrets removed.
    pub async fn remove(&self, name: &TenantName) -> Result<(), ApiError> {
        self.owns_nothing(name).await?;
        if name.is_default() {
            return Err(ApiError::bad_request(
                "the default tenant holds the operator's things and cannot be removed",
            ));
        }
        if !self.store.delete_tenant(name).await? {
            return Err(unknown_tenant(name));
        }
        self.keep(name, None).await;
        lock(&self.seen).clear();
        self.admission.remove_tenant(name);
        Ok(())
    }

    /// Refuses to remove a tenant that still owns something.
    async fn owns_nothing(&self, name: &TenantName) -> Result<(), ApiError> {
        let open = self
            .store
            .list(&[])
            .await?
            .into_iter()
            .filter(|r| &r.tenant == name && !r.state.is_final())
            .count();
        let batches = self
            .store
            .batches(None)
            .await?
            .into_iter()
            .filter(|b| &b.tenant == name && b.deleted_at.is_none())
            .count();
        let pools = self
            .pools
            .defs()
            .into_iter()
            .filter(|(_, _, t)| t == name)
            .count();
        let secrets = self
            .store
            .secrets()
            .await?
            .into_iter()
            .filter(|s| &s.tenant == name)
            .count();
        if open + batches + pools + secrets > 0 {
            return Err(ApiError::conflict(format!(
                "tenant {name} still owns {open} sandboxes that have not ended, {batches} batches, {pools} pools and {secrets} secrets; remove them first"
            )));
        }
        Ok(())
    }

    /// Gives admission every tenant's spec (at start, and as a new leader
    /// of a cluster): quotas, weights and priorities hold from the first
    /// create.
    pub(crate) async fn load(&self) -> Result<(), ApiError> {
        for (name, spec, _) in self.specs().await? {
            self.admission.set_tenant(&name, &spec);
        }
        Ok(())
    }

    /// The tenants `who` reaches, with what their sandboxes hold and how
    /// many of their creates wait.
    pub async fn infos(&self, who: &Principal) -> Result<Vec<TenantInfo>, ApiError> {
        let rows = self.store.list(&[]).await?;
        self.infos_of(who, &rows).await
    }

    /// [`Tenants::infos`] from records already read.
    pub(crate) async fn infos_of(
        &self,
        who: &Principal,
        rows: &[SandboxRow],
    ) -> Result<Vec<TenantInfo>, ApiError> {
        let mut usage: HashMap<TenantName, (warren_core::tenant::TenantUsage, u32)> =
            HashMap::new();
        for row in rows {
            let (u, queued) = usage.entry(row.tenant.clone()).or_default();
            if row.state == SandboxState::Queued {
                *queued += 1;
            } else if row.state.is_live() {
                u.cpu_millis += row.resources.cpu_request();
                u.memory += row.resources.memory_request();
                u.gpus += row.resources.gpus;
                u.sandboxes += 1;
            }
        }
        Ok(self
            .specs()
            .await?
            .into_iter()
            .filter(|(name, _, _)| who.reaches(name))
            .map(|(name, spec, created_at)| {
                let (used, queued) = usage.remove(&name).unwrap_or_default();
                TenantInfo {
                    usage: used,
                    queued,
                    ..bare_info(name, spec, created_at)
                }
            })
            .collect())
    }

    /// Makes a token for a tenant: the operator for any, a tenant's admin
    /// for its own.
    pub async fn create_token(
        &self,
        by: &Principal,
        req: &TokenRequest,
    ) -> Result<NewToken, ApiError> {
        may_manage_tokens(by, &req.tenant)?;
        if !self.exists(&req.tenant).await? {
            return Err(unknown_tenant(&req.tenant));
        }
        let mut secret = [0u8; 32];
        rand::Rng::fill(&mut rand::rng(), &mut secret[..]);
        let token = format!(
            "{TOKEN_PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
        );
        let info = TokenInfo {
            id: crate::new_id_with("tok"),
            tenant: req.tenant.clone(),
            role: req.role,
            description: req.description.clone(),
            created_at: now_rfc3339(),
        };
        let row = TokenRow {
            info: info.clone(),
            hash: hash(&token),
        };
        self.store.insert_token(&row).await?;
        Ok(NewToken { info, token })
    }

    /// The tokens `by` may see: all for the operator, its tenant's for a
    /// tenant's admin.
    pub async fn tokens(&self, by: &Principal) -> Result<Vec<TokenInfo>, ApiError> {
        let rows = self.store.tokens().await?;
        match by {
            Principal::Operator => {}
            Principal::Tenant { tenant, .. } => may_manage_tokens(by, tenant)?,
        }
        Ok(rows
            .into_iter()
            .map(|r| r.info)
            .filter(|i| by.reaches(&i.tenant))
            .collect())
    }

    /// Revokes a token at once (on every replica within [`REMEMBER`]).
    pub async fn revoke(&self, by: &Principal, id: &str) -> Result<TokenInfo, ApiError> {
        let missing = || ApiError::not_found(format!("no token {id}; see `warren token ls`"));
        let row = self
            .store
            .tokens()
            .await?
            .into_iter()
            .find(|r| r.info.id == id && by.reaches(&r.info.tenant))
            .ok_or_else(missing)?;
        may_manage_tokens(by, &row.info.tenant)?;
        if !self.store.delete_token(id).await? {
            return Err(missing());
        }
        lock(&self.seen).remove(&row.hash);
        Ok(row.info)
    }
}

/// A tenant as listed before its usage is added.
pub(crate) fn bare_info(name: TenantName, spec: TenantSpec, created_at: String) -> TenantInfo {
    TenantInfo {
        name,
        spec,
        usage: Default::default(),
        queued: 0,
        created_at,
    }
}

fn may_manage_tokens(by: &Principal, tenant: &TenantName) -> Result<(), ApiError> {
    match by {
        Principal::Operator => Ok(()),
        Principal::Tenant {
            tenant: own,
            role: Role::Admin,
            ..
        } if own == tenant => Ok(()),
        Principal::Tenant { tenant: own, .. } if own == tenant => Err(forbidden(
            "only an admin token of a tenant makes, lists and revokes its tokens",
        )),
        Principal::Tenant { .. } => Err(unknown_tenant(tenant)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_hashed_and_never_equal_their_hash() {
        let h = hash("wrt_abc");
        assert_eq!(h.len(), 64);
        assert_ne!(h, hash("wrt_abd"));
    }

    #[test]
    fn only_a_tenants_admin_or_the_operator_manages_its_tokens() {
        let a: TenantName = "a".parse().unwrap();
        let b: TenantName = "b".parse().unwrap();
        let admin = Principal::Tenant {
            tenant: a.clone(),
            role: Role::Admin,
            token: "t".into(),
        };
        let user = Principal::Tenant {
            tenant: a.clone(),
            role: Role::User,
            token: "t".into(),
        };
        assert!(may_manage_tokens(&Principal::Operator, &b).is_ok());
        assert!(may_manage_tokens(&admin, &a).is_ok());
        assert_eq!(
            may_manage_tokens(&admin, &b).unwrap_err().code,
            ErrorCode::NotFound
        );
        assert_eq!(
            may_manage_tokens(&user, &a).unwrap_err().code,
            ErrorCode::Forbidden
        );
    }
}
