//! Removing images, pruning to a disk budget, and collecting the blobs and
//! snapshots nothing references any more.

use std::collections::HashSet;
use std::fs;

use super::pins::{blob_key, chain_key};
use super::ImageStore;
use crate::digest::sha256_hex;
use crate::error::{ImageError, IoContext};
use crate::fsutil::{fsync_dir, remove_path};
use crate::record::ImageRecord;

/// What [`ImageStore::prune`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PruneReport {
    /// Image names removed to meet the budget, oldest first.
    pub removed: Vec<String>,
    pub used_before: u64,
    pub used_after: u64,
}

impl ImageStore {
    /// Removes the image name, then every blob and snapshot that no
    /// remaining image references. A digest reference that matches several
    /// names is refused: remove the names one by one.
    pub fn remove(&self, reference: &str) -> Result<ImageRecord, ImageError> {
        let _exclusive = self.write_lock();
        let (record, by_digest) = self.lookup(reference)?;
        if by_digest {
            let names: Vec<String> = self
                .load_records(false)?
                .into_iter()
                .filter(|r| r.digest == record.digest)
                .map(|r| r.name)
                .collect();
            if names.len() > 1 {
                return Err(ImageError::Conflict(format!(
                    "image {} is tagged {}; remove each name instead of the digest",
                    record.digest,
                    names.join(", ")
                )));
            }
        }
        let path = self.record_path(&record.name);
        fs::remove_file(&path).ctx(|| format!("removing image record {}", path.display()))?;
        fsync_dir(&self.images_dir())?;
        if let Err(e) = self.gc_locked() {
            tracing::warn!(error = %e, "image removed but garbage collection failed; it is retried at the next open or removal");
        }
        Ok(record)
    }

    /// Bytes the store holds: blob files plus the regular-file bytes of the
    /// unpacked layers.
    pub fn disk_usage(&self) -> Result<u64, ImageError> {
        let dir = self.blob_dir();
        let mut total = 0;
        for entry in fs::read_dir(&dir).ctx(|| format!("listing {}", dir.display()))? {
            let entry = entry.ctx(|| format!("listing {}", dir.display()))?;
            total += entry.metadata().map(|m| m.len()).unwrap_or(0);
        }
        Ok(total
            + self
                .snapshots
                .all()
                .iter()
                .map(|s| s.meta.size)
                .sum::<u64>())
    }

    /// Collects unreferenced content, then, while the store holds more than
    /// `budget` bytes, removes registry images (they can be pulled again)
    /// oldest first; images that live sandboxes run and imported images
    /// (no registry to pull them back from) are never removed.
    pub fn prune(&self, budget: Option<u64>) -> Result<PruneReport, ImageError> {
        let _exclusive = self.write_lock();
        let used_before = self.disk_usage()?;
        self.gc_locked()?;
        let mut removed = Vec::new();
        if let Some(budget) = budget {
            let pinned: HashSet<String> = self.pinned();
            let mut candidates: Vec<ImageRecord> = self
                .load_records(true)?
                .into_iter()
                // Registry images can be pulled again, build steps built
                // again; `repo@digest` records are retired names kept for a
                // sandbox that has since ended.
                .filter(|r| {
                    crate::registry::registry_host(&r.name).is_some()
                        || r.name.contains('@')
                        || crate::steps::is_step_name(&r.name)
                })
                .filter(|r| {
                    sha256_hex(&r.digest).is_some_and(|hex| !pinned.contains(&blob_key(hex)))
                })
                .collect();
            // Build steps first (cheapest to make again), then oldest first.
            candidates.sort_by(|a, b| {
                let step = |r: &ImageRecord| !crate::steps::is_step_name(&r.name);
                (step(a), &a.created).cmp(&(step(b), &b.created))
            });
            for record in candidates {
                if self.disk_usage()? <= budget {
                    break;
                }
                let path = self.record_path(&record.name);
                fs::remove_file(&path)
                    .ctx(|| format!("removing image record {}", path.display()))?;
                fsync_dir(&self.images_dir())?;
                self.gc_locked()?;
                tracing::info!(name = %record.name, digest = %record.digest, "image pruned to meet the disk budget");
                removed.push(record.name);
            }
        }
        Ok(PruneReport {
            removed,
            used_before,
            used_after: self.disk_usage()?,
        })
    }

    /// Removes blobs and snapshots that no record and no pin refers to.
    pub fn collect_garbage(&self) {
        let _exclusive = self.write_lock();
        if let Err(e) = self.gc_locked() {
            tracing::warn!(error = %e, "garbage collection failed; it is retried at the next open or removal");
        }
    }

    /// Deletes snapshots and blobs no record references. Callers hold the
    /// exclusive lock.
    fn gc_locked(&self) -> Result<(), ImageError> {
        let records = self.load_records(true)?;
        let pinned: HashSet<String> = self.pinned();
        let mut chains = HashSet::new();
        let mut blobs = HashSet::new();
        for r in &records {
            for d in [&r.digest, &r.config_digest] {
                if let Some(hex) = sha256_hex(d) {
                    blobs.insert(hex.to_string());
                }
            }
            for l in &r.layers {
                chains.insert(l.chain_id.clone());
                if let Some(hex) = sha256_hex(&l.digest) {
                    blobs.insert(hex.to_string());
                }
            }
        }
        for snapshot in self.snapshots.all() {
            if !chains.contains(&snapshot.meta.chain_id)
                && !pinned.contains(&chain_key(&snapshot.meta.chain_id))
            {
                tracing::info!(chain = %snapshot.meta.chain_id, id = snapshot.id, "removing unreferenced snapshot");
                self.snapshots.remove(&snapshot.meta.chain_id)?;
            }
        }
        let dir = self.blob_dir();
        for entry in fs::read_dir(&dir).ctx(|| format!("listing {}", dir.display()))? {
            let entry = entry.ctx(|| format!("listing {}", dir.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !blobs.contains(&name) && !pinned.contains(&blob_key(&name)) {
                let path = entry.path();
                remove_path(&path)
                    .ctx(|| format!("removing unreferenced blob {}", path.display()))?;
            }
        }
        Ok(())
    }
}
