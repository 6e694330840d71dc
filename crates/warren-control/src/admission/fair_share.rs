//! What admission keeps of each tenant, and the arithmetic of sharing
//! (docs/tenants.md, "Sharing capacity"): what a tenant's live sandboxes
//! hold, its quota, its queue (higher priority first, FIFO within a
//! priority), and its weighted dominant share, the key of fair share
//! (DRF: the largest of its cpu, memory and GPU fractions of the cluster,
//! over its weight).

use std::collections::VecDeque;

use tokio::sync::oneshot;
use warren_core::quantity::format_size;
use warren_core::tenant::{Quota, TenantName, TenantSpec, TenantUsage};

use super::{Need, Request};

/// Two shares closer than this are equal: sums of fractions are not exact,
/// and a rule decided by rounding would flip back and forth.
pub(super) const EPSILON: f64 = 1e-9;

/// What every node lends, summed: the denominators of dominant shares.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Totals {
    pub cpu_millis: u64,
    pub memory: u64,
    pub gpus: u64,
}

impl Totals {
    pub fn add(&mut self, n: &Need) {
        self.cpu_millis += n.cpu_millis;
        self.memory += n.memory;
        self.gpus += u64::from(n.gpus);
    }

    pub fn sub(&mut self, n: &Need) {
        self.cpu_millis = self.cpu_millis.saturating_sub(n.cpu_millis);
        self.memory = self.memory.saturating_sub(n.memory);
        self.gpus = self.gpus.saturating_sub(u64::from(n.gpus));
    }

    /// The dominant share of `held`: its largest fraction of any resource
    /// the cluster has (a resource it has none of counts for nothing).
    pub fn dominant(&self, held: &Need) -> f64 {
        let frac = |h: u64, t: u64| if t == 0 { 0.0 } else { h as f64 / t as f64 };
        frac(held.cpu_millis, self.cpu_millis)
            .max(frac(held.memory, self.memory))
            .max(frac(u64::from(held.gpus), self.gpus))
    }
}

/// A resource a quota bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Cpu,
    Memory,
    Gpus,
    Sandboxes,
}

impl Resource {
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Cpu => "cpu",
            Resource::Memory => "memory",
            Resource::Gpus => "gpus",
            Resource::Sandboxes => "sandboxes",
        }
    }

    /// An amount of it as people write it ("4 cores", "8G").
    pub fn show(self, amount: u64) -> String {
        match self {
            Resource::Cpu if amount == 1000 => "1 core".to_string(),
            Resource::Cpu if amount.is_multiple_of(1000) => format!("{} cores", amount / 1000),
            Resource::Cpu => format!("{} cores", amount as f64 / 1000.0),
            Resource::Memory => format_size(amount),
            Resource::Gpus => format!("{amount} gpus"),
            Resource::Sandboxes => format!("{amount} sandboxes"),
        }
    }
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a queued create has not started yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    /// Its tenant's live sandboxes hold the quota; it starts when they end
    /// (or the quota grows), whatever room the nodes have.
    Quota {
        tenant: TenantName,
        resource: Resource,
        quota: String,
    },
    /// No node has room for it (or for the create of its tenant ahead of it).
    Room,
    /// Sandboxes of tenants above their fair share are being preempted to
    /// make room for it.
    Reclaiming { victims: usize },
}

impl std::fmt::Display for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Waiting::Quota {
                tenant,
                resource,
                quota,
            } => write!(f, "tenant {tenant}'s {resource} quota ({quota}) is in use"),
            Waiting::Room => f.write_str("no node has room"),
            Waiting::Reclaiming { victims } => write!(
                f,
                "{victims} sandbox(es) of tenants above their fair share are being preempted to make room"
            ),
        }
    }
}

/// A sandbox admission asks the control plane to end so that a tenant
/// below its fair share gets its share back. Its capacity stays reserved
/// for `for_id` until that create starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    /// The sandbox to end.
    pub id: String,
    pub node: String,
    /// Whose sandbox it is (a tenant above its fair share).
    pub tenant: TenantName,
    /// The tenant that takes the room back, and its waiting create.
    pub for_tenant: TenantName,
    pub for_id: String,
}

/// A create waiting for room or quota.
pub(super) struct Waiter {
    pub id: String,
    pub req: Request,
    pub ready: oneshot::Sender<String>,
    /// Admission order: FIFO within a priority.
    pub seq: u64,
}

/// What admission keeps of one tenant.
#[derive(Default)]
pub(super) struct Tenant {
    pub spec: TenantSpec,
    /// Set by `set_tenant` (kept while idle); otherwise the entry exists
    /// only while the tenant holds or waits.
    pub explicit: bool,
    /// What its live sandboxes request in all (`slots` unused).
    pub held: Need,
    pub sandboxes: u32,
    /// What of `held` is preempted and about to be freed.
    pub leaving: Need,
    pub queue: VecDeque<Waiter>,
}

impl Tenant {
    pub fn usage(&self) -> TenantUsage {
        TenantUsage {
            cpu_millis: self.held.cpu_millis,
            memory: self.held.memory,
            gpus: self.held.gpus,
            sandboxes: self.sandboxes,
        }
    }

    /// Whether it holds or waits: only active tenants divide the cluster.
    pub fn active(&self) -> bool {
        self.sandboxes > 0 || !self.queue.is_empty()
    }

    pub fn weight(&self) -> f64 {
        f64::from(self.spec.weight.get())
    }

    /// The first quota that holding `need` more would exceed.
    pub fn over_quota(&self, need: &Need) -> Option<(Resource, u64)> {
        quota_hit(&self.spec.quota, &self.held, self.sandboxes, need)
    }

    /// The quota its head is waiting for, if any.
    pub fn head_blocked(&self) -> Option<(Resource, u64)> {
        let head = self.queue.front()?;
        self.over_quota(&head.req.need)
    }

    /// Queues `w` behind every create of a higher or equal priority.
    pub fn enqueue(&mut self, w: Waiter) -> usize {
        let at = self
            .queue
            .iter()
            .position(|o| o.req.priority < w.req.priority)
            .unwrap_or(self.queue.len());
        self.queue.insert(at, w);
        at + 1
    }

    pub fn hold(&mut self, need: &Need) {
        super::add(&mut self.held, need);
        self.sandboxes += 1;
    }

    pub fn free(&mut self, need: &Need) {
        super::sub(&mut self.held, need);
        self.sandboxes = self.sandboxes.saturating_sub(1);
    }
}

/// The first quota of `q` that holding `need` more (on top of `held`
/// and `sandboxes`, one sandbox more) would exceed, with its amount.
pub(super) fn quota_hit(
    q: &Quota,
    held: &Need,
    sandboxes: u32,
    need: &Need,
) -> Option<(Resource, u64)> {
    let over =
        |limit: Option<u64>, have: u64, more: u64| limit.filter(|&l| have.saturating_add(more) > l);
    if let Some(l) = over(q.cpu.map(|c| c.0), held.cpu_millis, need.cpu_millis) {
        return Some((Resource::Cpu, l));
    }
    if let Some(l) = over(q.memory.map(|m| m.0), held.memory, need.memory) {
        return Some((Resource::Memory, l));
    }
    if let Some(l) = over(
        q.gpus.map(u64::from),
        u64::from(held.gpus),
        u64::from(need.gpus),
    ) {
        return Some((Resource::Gpus, l));
    }
    over(q.sandboxes.map(u64::from), u64::from(sandboxes), 1).map(|l| (Resource::Sandboxes, l))
}

/// What asking `need` alone would exceed of quota `q`, as (resource, asked,
/// quota): such a create could never start, so it is refused, not queued.
pub(super) fn never_fits(q: &Quota, need: &Need) -> Option<(Resource, u64, u64)> {
    let (resource, quota) = quota_hit(q, &Need::default(), 0, need)?;
    let asked = match resource {
        Resource::Cpu => need.cpu_millis,
        Resource::Memory => need.memory,
        Resource::Gpus => u64::from(need.gpus),
        Resource::Sandboxes => 1,
    };
    Some((resource, asked, quota))
}
