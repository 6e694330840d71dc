//! Admission, kept by the control plane for all its nodes: what each node
//! lends (its allocatable capacity), what live sandboxes hold on it, and one
//! bounded FIFO queue for creates that fit nowhere yet. Freed capacity goes
//! to the head of the queue at once; the queue is strictly FIFO (no small
//! request overtakes a big one), so nothing starves. Where a create goes is
//! `placement`'s decision.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::oneshot;
use warren_core::spec::Placement;
use warren_core::sync::lock;
use warren_core::{ApiError, ErrorCode, Labels};

use crate::placement::{self, Candidate};

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
}

impl Request {
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
        }
    }

    fn placement(&self) -> placement::Request<'_> {
        placement::Request {
            need: self.need,
            pids: self.pids,
            selector: &self.selector,
            placement: self.placement,
            image: self.image.as_deref(),
            node: self.node.as_deref(),
        }
    }
}

pub enum Admit {
    /// Resources are reserved on the named node; go ahead.
    Now(String),
    /// Wait for the receiver, which names the node when the turn comes;
    /// `position` is 1 for the head of the queue.
    Queued {
        position: usize,
        ready: oneshot::Receiver<String>,
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
        AdmitError::NoNode(_) => {
            return ApiError {
                code: ErrorCode::NoCapacity,
                message: e.to_string(),
                retry_after_ms: Some(5000),
            }
        }
        AdmitError::Closed => ErrorCode::Unavailable,
        AdmitError::NeverFits { .. }
        | AdmitError::TooManyPids { .. }
        | AdmitError::TooManyGpus { .. } => ErrorCode::BadRequest,
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
    used: Need,
    initializing: u32,
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
}

struct Waiter {
    id: String,
    req: Request,
    ready: oneshot::Sender<String>,
}

struct State {
    closed: bool,
    /// In a vector, scanned whole for each placement (contiguous: the
    /// scan is the scheduler's cost).
    nodes: Vec<Slot>,
    index: HashMap<String, usize>,
    held: HashMap<String, Held>,
    queue: VecDeque<Waiter>,
}

pub struct Admission {
    queue_limit: usize,
    state: Mutex<State>,
}

impl State {
    fn slot(&mut self, name: &str) -> Option<&mut Slot> {
        let i = *self.index.get(name)?;
        self.nodes.get_mut(i)
    }

    fn candidates(&self) -> impl Iterator<Item = Candidate<'_>> {
        self.nodes.iter().map(|s| Candidate {
            name: &s.name,
            labels: &s.labels,
            total: s.total,
            inv_total: s.inv_total,
            used: s.used,
            max_pids: s.max_pids,
            schedulable: s.schedulable,
            initializing: s.initializing,
            sandboxes: s.used.slots,
            images: &s.images,
        })
    }

    fn place(&self, req: &Request) -> Option<String> {
        placement::choose(&req.placement(), self.candidates()).map(str::to_string)
    }

    fn take(&mut self, id: &str, node: &str, need: Need, initializing: bool) {
        if let Some(slot) = self.slot(node) {
            add(&mut slot.used, &need);
            if initializing {
                slot.initializing += 1;
            }
        }
        self.held.insert(
            id.to_string(),
            Held {
                node: node.to_string(),
                need,
                initializing,
            },
        );
    }

    /// Starts as many queued creates, in order, as now fit somewhere.
    fn start_queued(&mut self) {
        while let Some(head) = self.queue.front() {
            let Some(node) = self.place(&head.req) else {
                break;
            };
            let Some(w) = self.queue.pop_front() else {
                break;
            };
            // A waiter whose client left still gets the capacity; it gives it
            // back through release() when its create is abandoned.
            self.take(&w.id, &node, w.req.need, true);
            let _ = w.ready.send(node);
        }
    }
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

impl Admission {
    pub fn new(queue_limit: usize) -> Admission {
        Admission {
            queue_limit,
            state: Mutex::new(State {
                closed: false,
                nodes: Vec::new(),
                index: HashMap::new(),
                held: HashMap::new(),
                queue: VecDeque::new(),
            }),
        }
    }

    /// Adds a node or updates what it lends (and its labels); what its
    /// sandboxes hold is kept. A node starts unschedulable.
    pub fn set_node(&self, name: &str, total: Need, max_pids: u32, labels: Labels) {
        let mut s = self.lock();
        match s.slot(name) {
            Some(slot) => {
                slot.total = total;
                slot.inv_total = placement::reciprocals(&total);
                slot.max_pids = max_pids;
                if slot.labels != labels {
                    slot.labels = labels;
                }
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
                    used: Need::default(),
                    initializing: 0,
                });
                s.index.insert(name.to_string(), i);
            }
        }
        s.start_queued();
    }

    /// Whether the node takes placements (ready and not cordoned).
    pub fn set_schedulable(&self, name: &str, schedulable: bool) {
        let mut s = self.lock();
        if let Some(slot) = s.slot(name) {
            slot.schedulable = schedulable;
        }
        if schedulable {
            s.start_queued();
        }
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
        let Some(i) = s.index.remove(name) else {
            return;
        };
        s.nodes.swap_remove(i);
        if let Some(moved) = s.nodes.get(i).map(|n| n.name.clone()) {
            s.index.insert(moved, i);
        }
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

    pub fn queued(&self) -> usize {
        self.lock().queue.len()
    }

    /// The node a live sandbox holds capacity on.
    pub fn node_of(&self, id: &str) -> Option<String> {
        self.lock().held.get(id).map(|h| h.node.clone())
    }

    pub fn admit(&self, id: &str, req: Request) -> Result<Admit, AdmitError> {
        let mut s = self.lock();
        if s.closed {
            return Err(AdmitError::Closed);
        }
        if let Some(h) = s.held.get(id) {
            return Ok(Admit::Now(h.node.clone()));
        }
        if s.queue.is_empty() {
            if let Some(node) = s.place(&req) {
                s.take(id, &node, req.need, true);
                return Ok(Admit::Now(node));
            }
        }
        Self::check_possible(&s, &req)?;
        if s.queue.len() >= self.queue_limit {
            return Err(AdmitError::QueueFull(s.queue.len()));
        }
        let (tx, rx) = oneshot::channel();
        s.queue.push_back(Waiter {
            id: id.to_string(),
            req,
            ready: tx,
        });
        Ok(Admit::Queued {
            position: s.queue.len(),
            ready: rx,
        })
    }

    /// Reserves room only if some node has it now and nobody is waiting:
    /// background work (a warm pool's refill) never queues and never
    /// overtakes a create.
    pub fn try_admit(&self, id: &str, req: Request) -> Option<String> {
        let mut s = self.lock();
        if s.closed || !s.queue.is_empty() {
            return None;
        }
        let node = s.place(&req)?;
        s.take(id, &node, req.need, true);
        Some(node)
    }

    /// Refuses what no known node could ever run, instead of queueing it
    /// for ever.
    fn check_possible(s: &State, req: &Request) -> Result<(), AdmitError> {
        let p = req.placement();
        let matching: Vec<Candidate<'_>> = s
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
                let sel: Vec<String> = req
                    .selector
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                let open = req
                    .selector
                    .contains_key(warren_core::network::EGRESS_OPEN_LABEL);
                let why = if open {
                    " (network mode 'open' needs a node started with --egress-open)"
                } else {
                    ""
                };
                format!("carries the labels {}{why}", sel.join(","))
            };
            return Err(AdmitError::NoNode(which));
        }
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

    /// Records a sandbox that already runs on `node` (adopted after a
    /// restart), whether or not it fits.
    pub fn hold(&self, id: &str, node: &str, need: Need) {
        let mut s = self.lock();
        if !s.held.contains_key(id) {
            s.take(id, node, need, false);
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

    /// Frees what `id` held (or takes it out of the queue) and starts as
    /// many queued creates, in order, as now fit. Idempotent.
    pub fn release(&self, id: &str) {
        let mut s = self.lock();
        if let Some(h) = s.held.remove(id) {
            if let Some(slot) = s.slot(&h.node) {
                sub(&mut slot.used, &h.need);
                if h.initializing {
                    slot.initializing = slot.initializing.saturating_sub(1);
                }
            }
        }
        s.queue.retain(|w| w.id != id);
        s.start_queued();
    }

    /// Refuses every create from now on and empties the queue: each waiter
    /// learns that its turn will not come.
    pub fn close(&self) {
        let mut s = self.lock();
        s.closed = true;
        s.queue.clear();
    }

    /// 1-based position of a queued create.
    pub fn position(&self, id: &str) -> Option<usize> {
        self.lock()
            .queue
            .iter()
            .position(|w| w.id == id)
            .map(|p| p + 1)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the counters half
        // updated in a way worse than refusing service, so recover the data.
        lock(&self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(cpu: u64) -> Request {
        Request {
            need: Need {
                cpu_millis: cpu,
                memory: 1,
                slots: 1,
                gpus: 0,
            },
            pids: 8,
            selector: Labels::new(),
            placement: Placement::Spread,
            image: None,
            node: None,
        }
    }

    fn one_node(a: &Admission, name: &str, cpu: u64) {
        a.set_node(
            name,
            Need {
                cpu_millis: cpu,
                memory: 100,
                slots: 10,
                gpus: 0,
            },
            u32::MAX,
            Labels::new(),
        );
        a.set_schedulable(name, true);
    }

    #[test]
    fn fifo_queue_starts_on_release_and_is_bounded() {
        let a = Admission::new(2);
        one_node(&a, "n", 1000);
        assert!(matches!(a.admit("a", req(600)), Ok(Admit::Now(n)) if n == "n"));
        let Ok(Admit::Queued {
            position: 1,
            ready: mut b,
        }) = a.admit("b", req(600))
        else {
            panic!("b should queue first")
        };
        // A small request does not overtake the head of the queue.
        let Ok(Admit::Queued {
            position: 2,
            ready: mut c,
        }) = a.admit("c", req(100))
        else {
            panic!("c should queue second")
        };
        assert_eq!(a.admit("d", req(100)).err(), Some(AdmitError::QueueFull(2)));
        assert!(b.try_recv().is_err());
        a.release("a");
        assert_eq!(b.try_recv().ok().as_deref(), Some("n"));
        assert_eq!(c.try_recv().ok().as_deref(), Some("n"));
        assert_eq!(a.nodes()[0].used.cpu_millis, 700);
        a.release("b");
        a.release("b");
        assert_eq!(a.nodes()[0].used.cpu_millis, 100);
        assert!(matches!(
            a.admit("e", req(5000)),
            Err(AdmitError::NeverFits { .. })
        ));
    }

    #[test]
    fn the_queue_waits_for_any_node_and_starts_where_room_frees() {
        let a = Admission::new(10);
        assert!(matches!(a.admit("x", req(100)), Err(AdmitError::NoNode(_))));
        one_node(&a, "n1", 1000);
        one_node(&a, "n2", 1000);
        // Spread: the second goes to the other node.
        let Ok(Admit::Now(first)) = a.admit("a", req(800)) else {
            panic!("a fits")
        };
        let Ok(Admit::Now(second)) = a.admit("b", req(800)) else {
            panic!("b fits")
        };
        assert_ne!(first, second);
        let Ok(Admit::Queued { mut ready, .. }) = a.admit("c", req(800)) else {
            panic!("c waits")
        };
        // A cordoned node takes nothing, even when it has room.
        a.set_schedulable(&second, false);
        a.release("b");
        assert!(ready.try_recv().is_err());
        a.release("a");
        assert_eq!(ready.try_recv().ok(), Some(first.clone()));
        assert_eq!(a.node_of("c"), Some(first));
    }

    #[test]
    fn a_pinned_request_goes_to_its_node_or_waits_for_it() {
        let a = Admission::new(10);
        one_node(&a, "n1", 1000);
        one_node(&a, "n2", 1000);
        let on = |node: &str, cpu| Request {
            node: Some(node.into()),
            ..req(cpu)
        };
        assert!(matches!(a.admit("a", on("n2", 800)), Ok(Admit::Now(n)) if n == "n2"));
        // n1 has room, but the request is n2's.
        let Ok(Admit::Queued { mut ready, .. }) = a.admit("b", on("n2", 800)) else {
            panic!("b waits for n2")
        };
        a.release("a");
        assert_eq!(ready.try_recv().ok().as_deref(), Some("n2"));
        assert!(
            matches!(a.admit("c", on("gone", 1)), Err(AdmitError::NoNode(m)) if m.contains("gone"))
        );
    }
}
