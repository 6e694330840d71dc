//! Warren's one policy for poisoned locks: recover. A mutex is poisoned
//! when a thread panicked while it held it; that panic is the bug, and it
//! is reported where it happened. Every other user goes on with the data
//! as the panicking holder left it (each critical section leaves it
//! consistent at every step it can be interrupted at), rather than
//! silently skipping work, which left sandboxes unsampled or unreaped.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_used_as_left() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let mut g = lock(&m2);
            *g = 2;
            panic!("a holder panics");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 2);
    }
}
