//! Admission to a node, kept by the control plane: what the node lends
//! (its allocatable capacity), what live sandboxes hold, and a bounded FIFO queue for creates that do not
//! fit yet. Freed capacity goes to the head of the queue at once; the queue
//! is strictly FIFO (no small request overtakes a big one), so nothing starves.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::oneshot;
use warren_core::sync::lock;

/// Resources one sandbox holds while it is live (or kept).
pub use warren_node_api::Resources as Need;

trait Count {
    fn fits(&self, used: &Need, total: &Need) -> bool;
    fn add(&mut self, n: &Need);
    fn sub(&mut self, n: &Need);
}

impl Count for Need {
    fn fits(&self, used: &Need, total: &Need) -> bool {
        used.cpu_millis + self.cpu_millis <= total.cpu_millis
            && used.memory + self.memory <= total.memory
            && used.slots + self.slots <= total.slots
    }
    fn add(&mut self, n: &Need) {
        self.cpu_millis += n.cpu_millis;
        self.memory += n.memory;
        self.slots += n.slots;
    }
    fn sub(&mut self, n: &Need) {
        self.cpu_millis = self.cpu_millis.saturating_sub(n.cpu_millis);
        self.memory = self.memory.saturating_sub(n.memory);
        self.slots = self.slots.saturating_sub(n.slots);
    }
}

pub enum Admit {
    /// Resources are reserved; go ahead.
    Now,
    /// Wait for the receiver; `position` is 1 for the head of the queue.
    Queued {
        position: usize,
        ready: oneshot::Receiver<()>,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdmitError {
    #[error("the node's queue is full ({0} creates waiting); retry later")]
    QueueFull(usize),
    #[error("the node is shutting down; it starts no more sandboxes")]
    Closed,
    #[error("pids {pids} is more than this node's process table lends one sandbox ({max}): ask for fewer")]
    TooManyPids { pids: u32, max: u32 },
    #[error("the request (cpu {cpu} millicores, memory {memory} bytes) exceeds what this node can ever allocate (cpu {max_cpu} millicores, memory {max_memory} bytes); ask for less")]
    NeverFits {
        cpu: u64,
        memory: u64,
        max_cpu: u64,
        max_memory: u64,
    },
}

struct Waiter {
    id: String,
    need: Need,
    ready: oneshot::Sender<()>,
}

struct State {
    closed: bool,
    used: Need,
    held: HashMap<String, Need>,
    queue: VecDeque<Waiter>,
}

pub struct Admission {
    total: Need,
    /// Most processes one sandbox may ask for (see `warren_runtime::host`).
    max_pids: u32,
    queue_limit: usize,
    state: Mutex<State>,
}

impl Admission {
    pub fn new(total: Need, max_pids: u32, queue_limit: usize) -> Admission {
        Admission {
            total,
            max_pids,
            queue_limit,
            state: Mutex::new(State {
                closed: false,
                used: Need::default(),
                held: HashMap::new(),
                queue: VecDeque::new(),
            }),
        }
    }

    pub fn total(&self) -> Need {
        self.total
    }

    pub fn used(&self) -> Need {
        lock(&self.state).used
    }

    pub fn queued(&self) -> usize {
        lock(&self.state).queue.len()
    }

    pub fn admit(&self, id: &str, need: Need, pids: u32) -> Result<Admit, AdmitError> {
        if pids > self.max_pids {
            return Err(AdmitError::TooManyPids {
                pids,
                max: self.max_pids,
            });
        }
        if !need.fits(&Need::default(), &self.total) {
            return Err(AdmitError::NeverFits {
                cpu: need.cpu_millis,
                memory: need.memory,
                max_cpu: self.total.cpu_millis,
                max_memory: self.total.memory,
            });
        }
        let mut s = self.lock();
        if s.closed {
            return Err(AdmitError::Closed);
        }
        if s.held.contains_key(id) {
            return Ok(Admit::Now);
        }
        if s.queue.is_empty() && need.fits(&s.used, &self.total) {
            s.used.add(&need);
            s.held.insert(id.to_string(), need);
            return Ok(Admit::Now);
        }
        if s.queue.len() >= self.queue_limit {
            return Err(AdmitError::QueueFull(s.queue.len()));
        }
        let (tx, rx) = oneshot::channel();
        s.queue.push_back(Waiter {
            id: id.to_string(),
            need,
            ready: tx,
        });
        Ok(Admit::Queued {
            position: s.queue.len(),
            ready: rx,
        })
    }

    /// Records a sandbox that already runs (adopted after a restart),
    /// whether or not it fits.
    pub fn hold(&self, id: &str, need: Need) {
        let mut s = self.lock();
        if !s.held.contains_key(id) {
            s.used.add(&need);
            s.held.insert(id.to_string(), need);
        }
    }

    /// Frees what `id` held (or takes it out of the queue) and starts as
    /// many queued creates, in order, as now fit. Idempotent.
    pub fn release(&self, id: &str) {
        let mut s = self.lock();
        if let Some(need) = s.held.remove(id) {
            s.used.sub(&need);
        }
        s.queue.retain(|w| w.id != id);
        self.start_queued(&mut s);
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
        lock(&self.state)
            .queue
            .iter()
            .position(|w| w.id == id)
            .map(|p| p + 1)
    }

    fn start_queued(&self, s: &mut State) {
        while let Some(head) = s.queue.front() {
            if !head.need.fits(&s.used, &self.total) {
                break;
            }
            let Some(w) = s.queue.pop_front() else { break };
            // A waiter whose client left still gets the capacity; it gives it
            // back through release() when its create is abandoned.
            s.used.add(&w.need);
            s.held.insert(w.id.clone(), w.need);
            let _ = w.ready.send(());
        }
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

    fn need(cpu: u64) -> Need {
        Need {
            cpu_millis: cpu,
            memory: 1,
            slots: 1,
        }
    }

    #[test]
    fn fifo_queue_starts_on_release_and_is_bounded() {
        let a = Admission::new(
            Need {
                cpu_millis: 1000,
                memory: 100,
                slots: 10,
            },
            u32::MAX,
            2,
        );
        assert!(matches!(a.admit("a", need(600), 8), Ok(Admit::Now)));
        let Ok(Admit::Queued {
            position: 1,
            ready: mut b,
        }) = a.admit("b", need(600), 8)
        else {
            panic!("b should queue first")
        };
        // A small request does not overtake the head of the queue.
        let Ok(Admit::Queued {
            position: 2,
            ready: mut c,
        }) = a.admit("c", need(100), 8)
        else {
            panic!("c should queue second")
        };
        assert_eq!(
            a.admit("d", need(100), 8).err(),
            Some(AdmitError::QueueFull(2))
        );
        assert!(b.try_recv().is_err());
        a.release("a");
        assert!(b.try_recv().is_ok());
        assert!(c.try_recv().is_ok());
        assert_eq!(a.used().cpu_millis, 700);
        a.release("b");
        a.release("b");
        assert_eq!(a.used().cpu_millis, 100);
        assert!(matches!(
            a.admit("e", need(5000), 8),
            Err(AdmitError::NeverFits { .. })
        ));
    }
}
