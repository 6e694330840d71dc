//! The live connections of one sandbox, so a policy change can close the
//! ones it no longer allows.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use warren_core::network::{Policy, Target};
use warren_core::sync::lock;

pub(crate) struct Conn {
    pub target: Target,
    pub port: u16,
    /// The address the proxy connected to.
    pub address: IpAddr,
    /// Whether that address was the operator's pin for the name.
    pub pinned: bool,
    pub cancel: CancellationToken,
}

#[derive(Default)]
pub(crate) struct Conns {
    next: AtomicU64,
    map: Mutex<HashMap<u64, Conn>>,
}

/// Held for as long as a connection is open: unregisters it and returns
/// its slots (the sandbox's and the node's) when dropped.
pub(crate) struct ConnGuard {
    conns: Arc<Conns>,
    id: u64,
    _permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        {
            let mut m = lock(&self.conns.map);
            m.remove(&self.id);
        }
    }
}

impl Conns {
    pub(crate) fn register(
        self: &Arc<Self>,
        conn: Conn,
        permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    ) -> ConnGuard {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        {
            let mut m = lock(&self.map);
            m.insert(id, conn);
        }
        ConnGuard {
            conns: self.clone(),
            id,
            _permits: permits,
        }
    }

    /// Closes every connection the policy no longer allows; returns what
    /// was closed as `target:port`.
    pub(crate) fn revoke(&self, policy: &Policy) -> Vec<String> {
        let m = lock(&self.map);
        let mut closed = Vec::new();
        for c in m.values() {
            let still = policy.check(&c.target, c.port).allowed
                && match &c.target {
                    Target::Name(n) => {
                        policy
                            .check_resolved(n, c.address, c.port, c.pinned)
                            .allowed
                    }
                    Target::Ip(_) => true,
                };
            if !still {
                c.cancel.cancel();
                closed.push(format!("{}:{}", c.target, c.port));
            }
        }
        closed
    }

    pub(crate) fn count(&self) -> usize {
        lock(&self.map).len()
    }
}
