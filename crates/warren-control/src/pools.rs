//! Warm pools: ready sandboxes of one image and size, kept by the control
//! plane, so that a create that matches takes one (a record update and
//! one node call) instead of making a sandbox. Members are ordinary
//! sandboxes labelled `warren.pool=NAME`; a claimed one leaves its pool for
//! good (it is never handed out twice) and the pool refills in the
//! background, only when a node has room now and no create is waiting.

//!
//! This module holds the pools' state (definitions, ready members, members
//! being made, claims); `control::pools` keeps them with the control
//! plane's creates and destroys.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use warren_core::pool::{PoolInfo, PoolSpec, POOL_LABEL};
use warren_core::sync::lock;
use warren_core::{SandboxInfo, SandboxSpec, SandboxState};

use warren_core::tenant::{Principal, TenantName};

use crate::store::{PoolRow, SandboxRow};

/// The warm pools' state; every change is one short critical section.
#[derive(Default)]
pub struct Pools {
    state: Mutex<State>,
    wake: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    defs: BTreeMap<String, PoolSpec>,
    /// Each pool's tenant: its members are that tenant's, and only that
    /// tenant's creates take them.
    owners: HashMap<String, TenantName>,
    /// Ready members by pool, oldest first.
    ready: HashMap<String, VecDeque<String>>,
    /// Members being made.
    filling: HashMap<String, u32>,
    claimed: HashMap<String, u64>,
}

impl Pools {
    /// A ready member of a pool of `tenant`'s that serves `spec`, taken
    /// out of it.
    pub(crate) fn take(&self, tenant: &TenantName, spec: &SandboxSpec) -> Option<(String, String)> {
        let mut s = lock(&self.state);
        let name = s
            .defs
            .iter()
            .find(|(name, def)| s.owners.get(*name) == Some(tenant) && def.serves(name, spec))
            .map(|(name, _)| name.clone())?;
        let id = s.ready.get_mut(&name)?.pop_front()?;
        Some((name, id))
    }

    /// The tenant a pool belongs to.
    pub(crate) fn owner(&self, name: &str) -> Option<TenantName> {
        lock(&self.state).owners.get(name).cloned()
    }

    /// The pools `who` reaches.
    pub fn infos_for(&self, who: &Principal) -> Vec<PoolInfo> {
        let owners = lock(&self.state).owners.clone();
        self.infos()
            .into_iter()
            .filter(|p| owners.get(&p.name).is_some_and(|t| who.reaches(t)))
            .collect()
    }

    pub fn infos(&self) -> Vec<PoolInfo> {
        let s = lock(&self.state);
        s.defs
            .iter()
            .map(|(name, spec)| PoolInfo {
                name: name.clone(),
                spec: spec.clone(),
                ready: s.ready.get(name).map_or(0, |r| r.len() as u32),
                claimed: s.claimed.get(name).copied().unwrap_or(0),
            })
            .collect()
    }

    /// One pool, or a 404 that says where to look.
    pub fn info(&self, name: &str) -> Result<PoolInfo, warren_core::ApiError> {
        self.infos()
            .into_iter()
            .find(|p| p.name == name)
            .ok_or_else(|| {
                warren_core::ApiError::not_found(format!(
                    "no pool named {name:?}; see `warren pool ls`"
                ))
            })
    }

    /// Defines (or redefines) a pool; answers the ready members that no
    /// longer serve it (made for other resources), taken out of it.
    pub(crate) fn define(&self, name: &str, spec: PoolSpec, tenant: TenantName) -> Vec<String> {
        let mut s = lock(&self.state);
        s.owners.insert(name.to_string(), tenant);
        let resized_only = s.defs.get(name).is_some_and(|old| {
            PoolSpec {
                size: spec.size,
                ..old.clone()
            } == spec
        });
        s.defs.insert(name.to_string(), spec);
        if resized_only {
            Vec::new()
        } else {
            s.ready.remove(name).unwrap_or_default().into()
        }
    }

    /// Forgets a pool; answers its ready members.
    pub(crate) fn remove(&self, name: &str) -> VecDeque<String> {
        let mut s = lock(&self.state);
        s.defs.remove(name);
        s.owners.remove(name);
        s.ready.remove(name).unwrap_or_default()
    }

    /// A member of `pool` served a create.
    pub(crate) fn count_claim(&self, pool: String) {
        *lock(&self.state).claimed.entry(pool).or_default() += 1;
    }

    /// Asks the keeper for a pass now (a member claimed or lost, a pool
    /// changed).
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    pub(crate) async fn woken(&self) {
        self.wake.notified().await
    }

    /// The definitions as stored, and their members from the running
    /// records; answers the members of pools that are gone (or that no
    /// longer serve theirs).
    pub(crate) fn load(&self, pools: Vec<PoolRow>, rows: Vec<SandboxRow>) -> Vec<String> {
        let mut orphans = Vec::new();
        let mut s = lock(&self.state);
        let mut defs = BTreeMap::new();
        for p in pools {
            s.owners.insert(p.name.clone(), p.tenant);
            defs.insert(p.name, p.spec);
        }
        for row in rows {
            let Some(pool) = row.spec.labels.get(POOL_LABEL) else {
                continue;
            };
            match defs.get(pool) {
                Some(def)
                    if def.has_member(pool, &row.spec)
                        && s.owners.get(pool) == Some(&row.tenant) =>
                {
                    s.ready.entry(pool.clone()).or_default().push_back(row.id)
                }
                _ => orphans.push(row.id),
            }
        }
        s.defs = defs;
        orphans
    }

    /// Every pool: its name, spec and tenant.
    pub(crate) fn defs(&self) -> Vec<(String, PoolSpec, TenantName)> {
        let s = lock(&self.state);
        s.defs
            .iter()
            .map(|(k, v)| {
                let owner = s.owners.get(k).cloned().unwrap_or_default();
                (k.clone(), v.clone(), owner)
            })
            .collect()
    }

    /// Takes the oldest ready members beyond `keep` out of the pool.
    pub(crate) fn shed(&self, name: &str, keep: impl FnOnce(usize) -> usize) -> Vec<String> {
        let mut s = lock(&self.state);
        let ready = s.ready.entry(name.to_string()).or_default();
        let n = ready.len().saturating_sub(keep(ready.len()));
        ready.drain(..n).collect()
    }

    /// How many members the pool lacks of `size`, counting those being made.
    pub(crate) fn missing(&self, name: &str, size: u32) -> u32 {
        let s = lock(&self.state);
        let have = s.ready.get(name).map_or(0, VecDeque::len) as u32
            + s.filling.get(name).copied().unwrap_or(0);
        size.saturating_sub(have)
    }

    /// A member of `name` is being made.
    pub(crate) fn filling(&self, name: &str) {
        *lock(&self.state)
            .filling
            .entry(name.to_string())
            .or_default() += 1;
    }

    /// A member of `name` was made (`made`: what it became, None: it
    /// failed). Answers it when it is not wanted after all: the pool went
    /// or changed meanwhile, or it did not come up running.
    pub(crate) fn made(&self, name: &str, made: Option<SandboxInfo>) -> Option<String> {
        let mut s = lock(&self.state);
        if let Some(f) = s.filling.get_mut(name) {
            *f = f.saturating_sub(1);
        }
        let info = made?;
        let wanted = info.state == SandboxState::Running
            && s.defs
                .get(name)
                .is_some_and(|d| d.has_member(name, &info.spec));
        if wanted {
            s.ready
                .entry(name.to_string())
                .or_default()
                .push_back(info.id);
            None
        } else {
            Some(info.id)
        }
    }
}
