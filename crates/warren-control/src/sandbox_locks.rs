//! One finishing decision at a time per sandbox.
//!
//! The main process and init often die together (an OOM kills the whole
//! group), and a user may delete at the same moment. Each path reads the
//! sandbox's state and acts on it; without this lock two of them both see
//! `running`, both destroy, and the loser can mark the sandbox destroyed
//! before the winner has recorded its run for the profile.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};
use warren_core::sync::lock;

#[derive(Default)]
pub struct SandboxLocks {
    held: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
}

/// Held while one path decides and acts on a sandbox's end.
pub struct SandboxGuard<'a> {
    locks: &'a SandboxLocks,
    id: String,
    held: OwnedMutexGuard<()>,
}

impl SandboxLocks {
    pub async fn lock(&self, id: &str) -> SandboxGuard<'_> {
        let lock = lock(&self.held).entry(id.to_string()).or_default().clone();
        SandboxGuard {
            locks: self,
            id: id.to_string(),
            held: lock.lock_owned().await,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.held).len()
    }
}

impl Drop for SandboxGuard<'_> {
    fn drop(&mut self) {
        let mut held = lock(&self.locks.held);
        // The map and this guard hold the only references: nobody waits, so
        // the entry goes (the map would otherwise grow with every sandbox).
        if Arc::strong_count(OwnedMutexGuard::mutex(&self.held)) == 2 {
            held.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_holder_per_sandbox_and_entries_are_dropped() {
        let locks = Arc::new(SandboxLocks::default());
        let a = locks.lock("a").await;
        // A different sandbox is not blocked.
        let b = tokio::time::timeout(Duration::from_millis(100), locks.lock("b")).await;
        assert!(b.is_ok());
        drop(b);
        // The same sandbox waits until the first holder is done.
        let l2 = locks.clone();
        let waiter = tokio::spawn(async move {
            let _g = l2.lock("a").await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        drop(a);
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("the waiter gets the lock")
            .expect("no panic");
        assert_eq!(locks.len(), 0);
    }
}
