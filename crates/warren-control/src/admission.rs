//! Admission, kept by the control plane for all its nodes: what each node
//! lends (its allocatable capacity), what live sandboxes hold on it, and
//! the creates that wait, one bounded queue per tenant. Where a create goes
//! is `placement`'s decision; whose create goes next is fair share's
//! (docs/tenants.md, "Sharing capacity"):
//!
//! - **Quota.** A tenant's live sandboxes may request at most its quota
//!   (cpu, memory, gpus, sandboxes). A create that would take it over
//!   waits in its tenant's queue, however much room the nodes have; one
//!   that asks more than the quota itself is refused.
//! - **Order.** Within a tenant, higher priority first, FIFO within a
//!   priority, and only the head of a queue may start: a smaller create
//!   never overtakes its tenant's head. Across tenants, whenever room
//!   frees (or a create arrives while others wait) the heads are tried in
//!   order of weighted dominant share (DRF: the largest of the tenant's
//!   cpu, memory and GPU fractions of the cluster, over its weight), the
//!   lowest first; a tenant whose head its own quota blocks is skipped.
//! - **No starvation.** The first head that fits starts, so a head that
//!   fits nowhere does not stop the others. But when the lowest-share
//!   tenant's head fits nowhere it *anchors*: room for it is reserved on the
//!   node nearest to fitting it, until it starts. Tenants after it in the
//!   order may not use that room; only one before it (a lower share, or an
//!   equal share with an older head) may. So the anchored head waits only
//!   for tenants of lower share than its own, whose shares rise as they
//!   start while its own only falls as its sandboxes end: once it holds
//!   least, the node only empties and it starts. One anchor at a time; the
//!   next lowest-share head that fits nowhere anchors after it.
//! - **Borrowing.** Shares order only those who wait: a tenant alone in
//!   wanting room takes whatever is free, above its share.
//! - **Preemption.** A tenant with `preempt` whose head fits nowhere, and
//!   that is below its fair share (its weight over the weights of the
//!   active tenants, those holding or waiting) by more than 5 %, reclaims:
//!   for each of its waiting creates, in order, while it would stay within
//!   its fair share and its quota, admission picks sandboxes of tenants more
//!   than 5 % above theirs on one node (lowest priority first, then newest;
//!   never taking a tenant below its own fair share), just enough for the
//!   create, and reserves that room for it. Admission ends nothing itself: the control plane
//!   drains [`Admission::preemptions`] (woken by
//!   [`Admission::preemption_signal`]) and destroys them, and the release
//!   of each lets the reserved create start.
//!
//! Background work (a warm pool's refill, `try_admit`) never queues and
//! never overtakes a create that could start.

mod fair_share;
mod preempt;
#[cfg(test)]
mod tenant_tests;
#[cfg(test)]
mod tests;
mod turns;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, Notify};
use warren_core::spec::Placement;
use warren_core::sync::lock;
use warren_core::tenant::{TenantName, TenantSpec, TenantUsage};
use warren_core::{ApiError, ErrorCode, Isolation, Labels};

use crate::placement::{self, Candidate};
pub use fair_share::{Preemption, Resource, Waiting};
use fair_share::{Tenant, Totals, Waiter};

/// Resources one sandbox holds while it is live (or kept).
pub use warren_node_api::Resources as Need;

/// One create asking for room.
#[derive(Debug, Clone)]
pub struct Request {
    pub need: Need,
    pub pids: u32,
    pub selector: Labels,
    pub placement: Placement,
    /// The image's digest (a node that holds it wins a tie).
    pub image: Option<String>,
    /// Only this node may take it (a fork's children go to their source's).
    pub node: Option<String>,
    /// Only a node that runs this isolation class may take it (none: any
    /// node, in its default class).
    pub isolation: Option<Isolation>,
    /// Whose quota and share it counts against.
    pub tenant: TenantName,
    /// Higher goes first within its tenant; lower is preempted first.
    pub priority: i32,
}

impl Request {
    /// A create of the default tenant at priority 0 ([`Request::for_tenant`]
    /// names another).
    pub fn of(
        spec: &warren_core::SandboxSpec,
        r: &warren_core::ResolvedResources,
        digest: &str,
    ) -> Request {
        let mut selector = spec.node_selector.clone();
        if spec.network.mode == warren_core::spec::NetworkMode::Open {
            selector.insert(
                warren_core::network::EGRESS_OPEN_LABEL.to_string(),
                "true".to_string(),
            );
        }
        Request {
            need: Need::of(r),
            pids: r.pids,
            selector,
            placement: spec.placement,
            image: (!digest.is_empty()).then(|| digest.to_string()),
            node: None,
            isolation: spec.isolation,
            tenant: TenantName::default_tenant(),
            priority: 0,
        }
    }

    /// The same create, counted against `tenant`'s quota and share.
    pub fn for_tenant(mut self, tenant: TenantName, priority: i32) -> Request {
        self.tenant = tenant;
        self.priority = priority;
        self
    }

    fn placement(&self) -> placement::Request<'_> {
        placement::Request {
            need: self.need,
            pids: self.pids,
            selector: &self.selector,
            placement: self.placement,
            image: self.image.as_deref(),
            node: self.node.as_deref(),
            isolation: self.isolation,
        }
    }
}

pub enum Admit {
    /// Resources are reserved on the named node; go ahead.
    Now(String),
    /// Wait for the receiver, which names the node when the turn comes;
    /// `position` is 1 for the head of its tenant's queue, and `why` says
    /// what it waits for (as [`Admission::waiting_reason`], later).
    Queued {
        position: usize,
        ready: oneshot::Receiver<String>,
        why: Waiting,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdmitError {
    #[error("the queue is full ({0} creates waiting); retry later")]
    QueueFull(usize),
    #[error("the control plane is shutting down; it starts no more sandboxes")]
    Closed,
    #[error("no node {0}; see `warren node ls` (a node joins with `warren node --server URL --join-token FILE`)")]
    NoNode(String),
    #[error("no node {among}offers isolation class {class} ({})", class.how_offered())]
    NoClass {
        class: Isolation,
        /// "carrying the labels … " or "named … " when the request has a
        /// selector or a node.
        among: String,
    },
    #[error("pids {pids} is more than any node's process table lends one sandbox ({max}): ask for fewer")]
    TooManyPids { pids: u32, max: u32 },
    #[error("gpus {gpus} is more than any node has ({max} at most, of its --gpu-kind; `warren doctor` on a node lists its CDI devices, docs/gpu.md): ask for fewer")]
    TooManyGpus { gpus: u32, max: u32 },
    #[error("the request (cpu {cpu} millicores, memory {memory} bytes) exceeds what any node can ever allocate (at most cpu {max_cpu} millicores, memory {max_memory} bytes); ask for less")]
    NeverFits {
        cpu: u64,
        memory: u64,
        max_cpu: u64,
        max_memory: u64,
    },
    #[error("the request's {resource} ({asked}) is more than tenant {tenant}'s {resource} quota ({quota}) allows, so it could never start: ask for less, or raise the quota (`warren tenant set`)")]
    OverQuota {
        tenant: TenantName,
        resource: Resource,
        asked: String,
        quota: String,
    },
}

/// What a client is told when admission refuses.
pub(crate) fn admit_error(e: AdmitError) -> ApiError {
    let code = match e {
        AdmitError::QueueFull(_) => {
            return ApiError {
                code: ErrorCode::TooManyRequests,
                message: e.to_string(),
                retry_after_ms: Some(1000),
            }
        }
        // As a selector no node matches: a node that offers it may join.
        AdmitError::NoNode(_) | AdmitError::NoClass { .. } => {
            return ApiError {
                code: ErrorCode::NoCapacity,
                message: e.to_string(),
                retry_after_ms: Some(5000),
            }
        }
        AdmitError::Closed => ErrorCode::Unavailable,
        AdmitError::NeverFits { .. }
        | AdmitError::TooManyPids { .. }
        | AdmitError::TooManyGpus { .. }
        | AdmitError::OverQuota { .. } => ErrorCode::BadRequest,
    };
    ApiError::new(code, e.to_string())
}

/// What admission keeps of one node.
#[derive(Debug, Clone)]
struct Slot {
    name: String,
    total: Need,
    inv_total: [f64; 3],
    max_pids: u32,
    labels: Labels,
    /// Ready and not cordoned.
    schedulable: bool,
    /// Digests of the images it holds, as it last reported.
    images: std::collections::HashSet<String>,
    /// The isolation classes it runs, its default first.
    isolation: Vec<Isolation>,
    used: Need,
    initializing: u32,
    /// Room kept for particular waiting creates (an anchored head, a
    /// preempting tenant's): counted as used by everyone else.
    reserved: Need,
    /// What of `used` is preempted and about to be freed.
    leaving: Need,
}

/// A node as admission sees it (for `/v1/nodes` and the metrics).
#[derive(Debug, Clone)]
pub struct NodeUse {
    pub name: String,
    pub total: Need,
    pub used: Need,
    pub initializing: u32,
}

struct Held {
    node: String,
    need: Need,
    initializing: bool,
    tenant: TenantName,
    priority: i32,
    /// Admission order: the newest is preempted first.
    seq: u64,
    /// Named in a preemption: no longer a candidate victim.
    preempted: bool,
}

/// Room kept on `node` for one waiting create.
struct Reservation {
    node: String,
    need: Need,
    /// The sandboxes preempted to make it (empty for an anchor).
    victims: Vec<String>,
}

struct State {
    closed: bool,
    /// In a vector, scanned whole for each placement (contiguous: the
    /// scan is the scheduler's cost).
    nodes: Vec<Slot>,
    index: HashMap<String, usize>,
    held: HashMap<String, Held>,
    tenants: HashMap<TenantName, Tenant>,
    /// The tenant of each waiting create.
    waiting: HashMap<String, TenantName>,
    /// What all nodes lend: the denominators of dominant shares.
    totals: Totals,
    seq: u64,
    /// By waiting create.
    reserved: HashMap<String, Reservation>,
    /// The waiting create whose reservation guarantees progress.
    anchor: Option<String>,
    /// Not yet drained by the control plane.
    preemptions: Vec<Preemption>,
}

pub struct Admission {
    /// Per tenant.
    queue_limit: usize,
    state: Mutex<State>,
    /// Woken when preemptions wait to be drained.
    signal: Arc<Notify>,
}

fn candidate(s: &Slot) -> Candidate<'_> {
    Candidate {
        name: &s.name,
        labels: &s.labels,
        total: s.total,
        inv_total: s.inv_total,
        // What is reserved is no one else's to take.
        used: sum(&s.used, &s.reserved),
        max_pids: s.max_pids,
        schedulable: s.schedulable,
        initializing: s.initializing,
        sandboxes: s.used.slots,
        images: &s.images,
        isolation: &s.isolation,
    }
}

impl State {
    fn slot(&mut self, name: &str) -> Option<&mut Slot> {
        let i = *self.index.get(name)?;
        self.nodes.get_mut(i)
    }

    fn slot_ref(&self, name: &str) -> Option<&Slot> {
        self.nodes.get(*self.index.get(name)?)
    }

    fn candidates(&self) -> impl Iterator<Item = Candidate<'_>> {
        self.nodes.iter().map(candidate)
    }

    fn place(&self, req: &Request) -> Option<String> {
        placement::choose(&req.placement(), self.candidates()).map(str::to_string)
    }

    fn tenant(&mut self, name: &TenantName) -> &mut Tenant {
        self.tenants.entry(name.clone()).or_default()
    }

    /// Forgets a tenant that nobody set and that neither holds nor waits.
    fn tidy(&mut self, name: &TenantName) {
        if self
            .tenants
            .get(name)
            .is_some_and(|t| !t.explicit && !t.active())
        {
            self.tenants.remove(name);
        }
    }

    fn take(&mut self, id: &str, node: &str, req: &Request, initializing: bool) {
        let need = req.need;
        if let Some(slot) = self.slot(node) {
            add(&mut slot.used, &need);
            if initializing {
                slot.initializing += 1;
            }
        }
        self.tenant(&req.tenant).hold(&need);
        self.seq += 1;
        self.held.insert(
            id.to_string(),
            Held {
                node: node.to_string(),
                need,
                initializing,
                tenant: req.tenant.clone(),
                priority: req.priority,
                seq: self.seq,
                preempted: false,
            },
        );
    }

    /// Frees what a live sandbox holds.
    fn free(&mut self, id: &str) {
        let Some(h) = self.held.remove(id) else {
            return;
        };
        if let Some(slot) = self.slot(&h.node) {
            sub(&mut slot.used, &h.need);
            if h.initializing {
                slot.initializing = slot.initializing.saturating_sub(1);
            }
            if h.preempted {
                sub(&mut slot.leaving, &h.need);
            }
        }
        if let Some(t) = self.tenants.get_mut(&h.tenant) {
            t.free(&h.need);
            if h.preempted {
                sub(&mut t.leaving, &h.need);
            }
        }
        self.tidy(&h.tenant);
    }

    fn reserve(&mut self, waiter: &str, node: &str, need: Need, victims: Vec<String>) {
        if let Some(slot) = self.slot(node) {
            add(&mut slot.reserved, &need);
        }
        self.reserved.insert(
            waiter.to_string(),
            Reservation {
                node: node.to_string(),
                need,
                victims,
            },
        );
    }

    fn unreserve(&mut self, waiter: &str) -> Option<Reservation> {
        let r = self.reserved.remove(waiter)?;
        if let Some(slot) = self.slot(&r.node) {
            sub(&mut slot.reserved, &r.need);
        }
        if self.anchor.as_deref() == Some(waiter) {
            self.anchor = None;
        }
        Some(r)
    }

    /// Drops every reservation on `node` (it left or takes nothing now):
    /// their creates plan again.
    fn unreserve_node(&mut self, node: &str) {
        let on: Vec<String> = self
            .reserved
            .iter()
            .filter(|(_, r)| r.node == node)
            .map(|(w, _)| w.clone())
            .collect();
        for w in on {
            self.unreserve(&w);
        }
    }

    /// The weighted dominant share of a tenant: the fair-share key.
    fn share(&self, t: &Tenant) -> f64 {
        self.totals.dominant(&t.held) / t.weight()
    }

    /// The sum of the weights of the tenants that hold or wait.
    fn active_weight(&self) -> f64 {
        self.tenants
            .values()
            .filter(|t| t.active())
            .map(Tenant::weight)
            .sum()
    }

    /// Whether some create waits that could start if room were free (its
    /// quota allows it): background work must not take that room.
    fn any_eligible(&self) -> bool {
        self.tenants
            .values()
            .any(|t| !t.queue.is_empty() && t.head_blocked().is_none())
    }
}

/// `k=v,k2=v2`, as a selector is written.
fn labels_text(selector: &Labels) -> String {
    let sel: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    sel.join(",")
}

fn add(a: &mut Need, n: &Need) {
    a.cpu_millis += n.cpu_millis;
    a.memory += n.memory;
    a.slots += n.slots;
    a.gpus += n.gpus;
}

fn sub(a: &mut Need, n: &Need) {
    a.cpu_millis = a.cpu_millis.saturating_sub(n.cpu_millis);
    a.memory = a.memory.saturating_sub(n.memory);
    a.slots = a.slots.saturating_sub(n.slots);
    a.gpus = a.gpus.saturating_sub(n.gpus);
}

fn sum(a: &Need, b: &Need) -> Need {
    let mut s = *a;
    add(&mut s, b);
    s
}

impl Admission {
    pub fn new(queue_limit: usize) -> Admission {
        Admission {
            queue_limit,
            state: Mutex::new(State {
                closed: false,
                nodes: Vec::new(),
                index: HashMap::new(),
                held: HashMap::new(),
                tenants: HashMap::new(),
                waiting: HashMap::new(),
                totals: Totals::default(),
                seq: 0,
                reserved: HashMap::new(),
                anchor: None,
                preemptions: Vec::new(),
            }),
            signal: Arc::new(Notify::new()),
        }
    }

    /// Adds a node or updates what it lends (and its labels and isolation
    /// classes); what its sandboxes hold is kept. A node starts
    /// unschedulable.
    pub fn set_node(
        &self,
        name: &str,
        total: Need,
        max_pids: u32,
        labels: Labels,
        isolation: &[Isolation],
    ) {
        let mut s = self.lock();
        let old = match s.slot(name) {
            Some(slot) => {
                let old = slot.total;
                slot.total = total;
                slot.inv_total = placement::reciprocals(&total);
                slot.max_pids = max_pids;
                if slot.labels != labels {
                    slot.labels = labels;
                }
                if slot.isolation != isolation {
                    slot.isolation = isolation.to_vec();
                }
                old
            }
            None => {
                let i = s.nodes.len();
                s.nodes.push(Slot {
                    name: name.to_string(),
                    total,
                    inv_total: placement::reciprocals(&total),
                    max_pids,
                    labels,
                    schedulable: false,
                    images: Default::default(),
                    isolation: isolation.to_vec(),
                    used: Need::default(),
                    initializing: 0,
                    reserved: Need::default(),
                    leaving: Need::default(),
                });
                s.index.insert(name.to_string(), i);
                Need::default()
            }
        };
        s.totals.sub(&old);
        s.totals.add(&total);
        s.start_queued();
        self.wake(&s);
    }

    /// Whether the node takes placements (ready and not cordoned).
    pub fn set_schedulable(&self, name: &str, schedulable: bool) {
        let mut s = self.lock();
        if let Some(slot) = s.slot(name) {
            slot.schedulable = schedulable;
        }
        if !schedulable {
            // Room kept there would wait for a node that takes nothing.
            s.unreserve_node(name);
        }
        s.start_queued();
        self.wake(&s);
    }

    /// What images the node holds (placement prefers it for those).
    pub fn set_images(&self, name: &str, images: &[String]) {
        let mut s = self.lock();
        if let Some(slot) = s.slot(name) {
            if slot.images.len() != images.len() || !images.iter().all(|d| slot.images.contains(d))
            {
                slot.images = images.iter().cloned().collect();
            }
        }
    }

    /// Forgets a node (its sandboxes are released one by one by whoever
    /// decides their end).
    pub fn remove_node(&self, name: &str) {
        let mut s = self.lock();
        s.unreserve_node(name);
        let Some(i) = s.index.remove(name) else {
            return;
        };
        let gone = s.nodes.swap_remove(i);
        s.totals.sub(&gone.total);
        if let Some(moved) = s.nodes.get(i).map(|n| n.name.clone()) {
            s.index.insert(moved, i);
        }
        s.start_queued();
        self.wake(&s);
    }

    pub fn nodes(&self) -> Vec<NodeUse> {
        self.lock()
            .nodes
            .iter()
            .map(|s| NodeUse {
                name: s.name.clone(),
                total: s.total,
                used: s.used,
                initializing: s.initializing,
            })
            .collect()
    }

    /// Creates waiting, all tenants together.
    pub fn queued(&self) -> usize {
        self.lock().waiting.len()
    }

    /// The node a live sandbox holds capacity on.
    pub fn node_of(&self, id: &str) -> Option<String> {
        self.lock().held.get(id).map(|h| h.node.clone())
    }

    /// Sets how a tenant shares the cluster (its quota, weight and whether
    /// it preempts); what it holds stays counted. Tenants never set share
    /// with the default spec (no quota, weight 1).
    pub fn set_tenant(&self, name: &TenantName, spec: &TenantSpec) {
        let mut s = self.lock();
        let t = s.tenant(name);
        t.spec = spec.clone();
        t.explicit = true;
        // Its reservations were planned under the old quota and weight.
        let mine: Vec<String> = t.queue.iter().map(|w| w.id.clone()).collect();
        for w in mine {
            s.unreserve(&w);
        }
        s.start_queued();
        self.wake(&s);
    }

    /// The tenant goes back to the default spec (its live sandboxes and
    /// waiting creates stay counted until they end).
    pub fn remove_tenant(&self, name: &TenantName) {
        let mut s = self.lock();
        if let Some(t) = s.tenants.get_mut(name) {
            t.spec = TenantSpec::default();
            t.explicit = false;
        }
        s.tidy(name);
        s.start_queued();
        self.wake(&s);
    }

    /// What a tenant's live sandboxes hold, and how many of its creates wait.
    pub fn tenant_usage(&self, name: &TenantName) -> (TenantUsage, usize) {
        self.lock()
            .tenants
            .get(name)
            .map_or((TenantUsage::default(), 0), |t| (t.usage(), t.queue.len()))
    }

    /// Every tenant set or active, by name: usage and creates waiting (for
    /// the metrics and `GET /v1/tenants`).
    pub fn tenants(&self) -> Vec<(TenantName, TenantUsage, usize)> {
        let s = self.lock();
        let mut v: Vec<_> = s
            .tenants
            .iter()
            .map(|(n, t)| (n.clone(), t.usage(), t.queue.len()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    pub fn admit(&self, id: &str, req: Request) -> Result<Admit, AdmitError> {
        let mut s = self.lock();
        if s.closed {
            return Err(AdmitError::Closed);
        }
        if let Some(h) = s.held.get(id) {
            return Ok(Admit::Now(h.node.clone()));
        }
        if let Some(t) = s.tenants.get(&req.tenant) {
            if let Some((resource, asked, quota)) = fair_share::never_fits(&t.spec.quota, &req.need)
            {
                return Err(AdmitError::OverQuota {
                    tenant: req.tenant.clone(),
                    resource,
                    asked: resource.show(asked),
                    quota: resource.show(quota),
                });
            }
        }
        // Nobody waits: no order to keep, the create takes what is free
        // (above its share too: borrowing), within its quota.
        if s.waiting.is_empty()
            && s.tenants
                .get(&req.tenant)
                .is_none_or(|t| t.over_quota(&req.need).is_none())
        {
            if let Some(node) = s.place(&req) {
                s.take(id, &node, &req, true);
                return Ok(Admit::Now(node));
            }
        }
        Self::check_possible(&s, &req)?;
        let tenant = req.tenant.clone();
        let queued = s.tenants.get(&tenant).map_or(0, |t| t.queue.len());
        if queued >= self.queue_limit {
            return Err(AdmitError::QueueFull(queued));
        }
        let (tx, rx) = oneshot::channel();
        s.seq += 1;
        let w = Waiter {
            id: id.to_string(),
            req,
            ready: tx,
            seq: s.seq,
        };
        let ahead = s.tenant(&tenant).queue.front().map(|w| w.id.clone());
        let position = s.tenant(&tenant).enqueue(w);
        if position == 1 {
            // It overtook its tenant's head by priority: an anchor kept for
            // that head would hold room for a create that is not next.
            if let Some(old) = ahead.filter(|a| s.anchor.as_ref() == Some(a)) {
                s.unreserve(&old);
            }
        }
        s.waiting.insert(id.to_string(), tenant.clone());
        s.start_queued();
        self.wake(&s);
        if let Some(h) = s.held.get(id) {
            return Ok(Admit::Now(h.node.clone()));
        }
        let position = s
            .tenants
            .get(&tenant)
            .and_then(|t| t.queue.iter().position(|w| w.id == id))
            .map_or(position, |p| p + 1);
        Ok(Admit::Queued {
            position,
            ready: rx,
            why: s.why(id, &tenant),
        })
    }

    /// Reserves room only if some node has it now, the tenant's quota
    /// allows it, and no create waits that could start: background work
    /// (a warm pool's refill) never queues and never overtakes a create.
    pub fn try_admit(&self, id: &str, req: Request) -> Option<String> {
        let mut s = self.lock();
        if s.closed || s.any_eligible() {
            return None;
        }
        if s.tenants
            .get(&req.tenant)
            .is_some_and(|t| t.over_quota(&req.need).is_some())
        {
            return None;
        }
        let node = s.place(&req)?;
        s.take(id, &node, &req, true);
        Some(node)
    }

    /// Refuses a request that no known node would take whatever its size:
    /// none carries its selector's labels, is the node it names, or runs
    /// the isolation class it names (a batch is checked so before any of
    /// its members is made).
    pub fn check_placeable(&self, req: &Request) -> Result<(), AdmitError> {
        Self::placeable(&self.lock(), req).map(drop)
    }

    /// Refuses what no known node could ever run, instead of queueing it
    /// for ever.
    fn check_possible(s: &State, req: &Request) -> Result<(), AdmitError> {
        let p = req.placement();
        let matching = Self::placeable(s, req)?;
        if matching.iter().any(|c| placement::could_ever(&p, c)) {
            return Ok(());
        }
        let max_gpus = matching.iter().map(|c| c.total.gpus).max().unwrap_or(0);
        if req.need.gpus > max_gpus {
            return Err(AdmitError::TooManyGpus {
                gpus: req.need.gpus,
                max: max_gpus,
            });
        }
        let max_pids = matching.iter().map(|c| c.max_pids).max().unwrap_or(0);
        if req.pids > max_pids {
            return Err(AdmitError::TooManyPids {
                pids: req.pids,
                max: max_pids,
            });
        }
        Err(AdmitError::NeverFits {
            cpu: req.need.cpu_millis,
            memory: req.need.memory,
            max_cpu: matching
                .iter()
                .map(|c| c.total.cpu_millis)
                .max()
                .unwrap_or(0),
            max_memory: matching.iter().map(|c| c.total.memory).max().unwrap_or(0),
        })
    }

    /// The nodes that carry the request's labels, are the node it names
    /// and run the class it names, whatever room they have; none: why.
    fn placeable<'s>(s: &'s State, req: &Request) -> Result<Vec<Candidate<'s>>, AdmitError> {
        let mut matching: Vec<Candidate<'_>> = s
            .candidates()
            .filter(|c| {
                placement::selects(&req.selector, c.labels)
                    && req.node.as_deref().is_none_or(|n| n == c.name)
            })
            .collect();
        if matching.is_empty() {
            let which = if let Some(n) = &req.node {
                format!("named {n} is known (it left the cluster)")
            } else if req.selector.is_empty() {
                "has joined".to_string()
            } else {
                let open = req
                    .selector
                    .contains_key(warren_core::network::EGRESS_OPEN_LABEL);
                let why = if open {
                    " (network mode 'open' needs a node started with --egress-open)"
                } else {
                    ""
                };
                format!("carries the labels {}{why}", labels_text(&req.selector))
            };
            return Err(AdmitError::NoNode(which));
        }
        if let Some(class) = req.isolation {
            matching.retain(|c| class.offered_by(c.isolation));
            if matching.is_empty() {
                let among = match &req.node {
                    Some(n) => format!("named {n} "),
                    None if req.selector.is_empty() => String::new(),
                    None => format!("carrying the labels {} ", labels_text(&req.selector)),
                };
                return Err(AdmitError::NoClass { class, among });
            }
        }
        Ok(matching)
    }

    /// Records a sandbox of the default tenant that already runs on `node`
    /// (adopted after a restart), whether or not it fits.
    pub fn hold(&self, id: &str, node: &str, need: Need) {
        self.hold_for(id, node, need, &TenantName::default_tenant(), 0);
    }

    /// Records a sandbox of `tenant` that already runs on `node` (adopted
    /// after a restart), whether or not it fits or its quota allows it: it
    /// counts against the tenant's quota and share from now on.
    pub fn hold_for(&self, id: &str, node: &str, need: Need, tenant: &TenantName, priority: i32) {
        let mut s = self.lock();
        if !s.held.contains_key(id) {
            let req = Request {
                need,
                pids: 0,
                selector: Labels::new(),
                placement: Placement::default(),
                image: None,
                node: None,
                isolation: None,
                tenant: tenant.clone(),
                priority,
            };
            s.take(id, node, &req, false);
        }
    }

    /// The sandbox is made: it no longer counts as initialising.
    pub fn started(&self, id: &str) {
        let mut s = self.lock();
        let Some(h) = s.held.get_mut(id) else { return };
        if !std::mem::replace(&mut h.initializing, false) {
            return;
        }
        let node = h.node.clone();
        if let Some(slot) = s.slot(&node) {
            slot.initializing = slot.initializing.saturating_sub(1);
        }
    }

    /// Frees what `id` held (or takes it out of its queue) and starts as
    /// many waiting creates as now may, in fair-share order. Idempotent.
    pub fn release(&self, id: &str) {
        let mut s = self.lock();
        s.free(id);
        if let Some(t) = s.waiting.remove(id) {
            s.unreserve(id);
            if let Some(tenant) = s.tenants.get_mut(&t) {
                tenant.queue.retain(|w| w.id != id);
            }
            s.tidy(&t);
        }
        s.start_queued();
        self.wake(&s);
    }

    /// Refuses every create from now on and empties the queues: each
    /// waiter learns that its turn will not come.
    pub fn close(&self) {
        let mut s = self.lock();
        s.closed = true;
        let waiting: Vec<String> = s.waiting.keys().cloned().collect();
        for id in &waiting {
            s.unreserve(id);
        }
        s.waiting.clear();
        let names: Vec<TenantName> = s.tenants.keys().cloned().collect();
        for n in &names {
            if let Some(t) = s.tenants.get_mut(n) {
                t.queue.clear();
            }
            s.tidy(n);
        }
    }

    /// 1-based position of a queued create in its tenant's queue.
    pub fn position(&self, id: &str) -> Option<usize> {
        let s = self.lock();
        let t = s.tenants.get(s.waiting.get(id)?)?;
        t.queue.iter().position(|w| w.id == id).map(|p| p + 1)
    }

    /// Why a queued create has not started (None: it does not wait): its
    /// tenant's quota, room, or sandboxes being preempted for it.
    pub fn waiting_reason(&self, id: &str) -> Option<Waiting> {
        let s = self.lock();
        let t = s.waiting.get(id)?;
        Some(s.why(id, t))
    }

    /// The sandboxes admission chose to preempt since the last call, for
    /// the control plane to end (each then `release`d as any other). The
    /// room they free is kept for the create each names.
    pub fn preemptions(&self) -> Vec<Preemption> {
        std::mem::take(&mut self.lock().preemptions)
    }

    /// Notified whenever [`Admission::preemptions`] has something to drain
    /// (a permit is kept if nobody waits, so no wake-up is lost).
    pub fn preemption_signal(&self) -> Arc<Notify> {
        self.signal.clone()
    }

    fn wake(&self, s: &State) {
        if !s.preemptions.is_empty() {
            self.signal.notify_one();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the counters half
        // updated in a way worse than refusing service, so recover the data.
        lock(&self.state)
    }
}
