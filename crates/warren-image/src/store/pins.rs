//! Pins: content that garbage collection keeps although no record names it
//! (a pull in flight, the image a live sandbox runs).

use std::collections::HashSet;
use std::sync::Arc;

use super::ImageStore;
use crate::digest::sha256_hex;
use crate::record::ImageRecord;
use warren_core::sync::lock;

/// Keeps content from garbage collection while it lives.
pub struct Pin {
    store: Arc<ImageStore>,
    keys: Vec<String>,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut pins = lock(&self.store.pins);
        for key in &self.keys {
            if let Some(n) = pins.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    pins.remove(key);
                }
            }
        }
    }
}

pub(crate) fn blob_key(hex: &str) -> String {
    format!("blob:{hex}")
}

pub(super) fn chain_key(chain_id: &str) -> String {
    format!("chain:{chain_id}")
}

impl ImageStore {
    /// Keeps `record`'s layers and blobs from garbage collection while the
    /// returned pin lives, even once no name refers to that digest.
    pub fn pin_image(self: &Arc<Self>, record: &ImageRecord) -> Pin {
        let mut keys: Vec<String> = record
            .layers
            .iter()
            .map(|l| chain_key(&l.chain_id))
            .collect();
        for d in record
            .layers
            .iter()
            .map(|l| &l.digest)
            .chain([&record.digest, &record.config_digest])
        {
            if let Some(hex) = sha256_hex(d) {
                keys.push(blob_key(hex));
            }
        }
        self.pin_keys(keys)
    }

    /// Pins keys (see `pins`). Taken under the GC lock, so a collection
    /// either finished before (and the caller sees what it removed) or
    /// starts after and sees the pin.
    pub(crate) fn pin_keys(self: &Arc<Self>, keys: Vec<String>) -> Pin {
        let _no_gc = self.read_lock();
        let mut pins = lock(&self.pins);
        for key in &keys {
            *pins.entry(key.clone()).or_insert(0) += 1;
        }
        drop(pins);
        Pin {
            store: self.clone(),
            keys,
        }
    }

    pub(super) fn is_pinned(&self, digest: &str) -> bool {
        sha256_hex(digest).is_some_and(|hex| lock(&self.pins).contains_key(&blob_key(hex)))
    }

    /// Names of images a live or kept sandbox uses.
    pub(super) fn pinned(&self) -> HashSet<String> {
        lock(&self.pins).keys().cloned().collect()
    }
}
