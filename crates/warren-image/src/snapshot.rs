//! Unpacked layers, one per ChainID, laid out like containerd's overlay
//! snapshotter: `snapshots/<n>/fs` with a small integer `n` (overlay mount
//! options must fit in one page, digests would not) and `snapshots/<n>/meta.json`
//! naming the chain. A snapshot is built in `snapshots/new-*` and renamed
//! into place only when complete, so `<n>` directories are always whole.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::error::{ImageError, IoContext};
use crate::fsutil::{fsync_dir, remove_path, unique_name, write_atomic};
use warren_core::sync::lock;

const META: &str = "meta.json";
const STAGING_PREFIX: &str = "new-";
const DOOMED_PREFIX: &str = "rm-";

#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct SnapshotMeta {
    pub chain_id: String,
    pub diff_id: String,
    /// Bytes of regular-file content in the layer.
    pub size: u64,
    pub created: String,
}

#[derive(Clone, Debug)]
pub(crate) struct Snapshot {
    pub id: u64,
    pub meta: SnapshotMeta,
}

struct Index {
    by_chain: HashMap<String, Snapshot>,
    next_id: u64,
}

pub(crate) struct Snapshots {
    dir: PathBuf,
    index: Mutex<Index>,
    /// One mutex per ChainID being built, so concurrent imports that share a
    /// layer unpack it once: the second waits and then finds it committed.
    building: Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

impl Snapshots {
    /// Loads `dir`, discarding what a crash left behind: staging and
    /// half-deleted directories, and numbered ones without valid metadata.
    pub(crate) fn load(dir: &Path) -> Result<Snapshots, ImageError> {
        let mut by_chain: HashMap<String, Snapshot> = HashMap::new();
        let mut max_id = 0;
        let listing = fs::read_dir(dir).ctx(|| format!("listing {}", dir.display()))?;
        for entry in listing {
            let entry = entry.ctx(|| format!("listing {}", dir.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.starts_with(STAGING_PREFIX) || name.starts_with(DOOMED_PREFIX) {
                tracing::info!(path = %path.display(), "removing leftover snapshot directory");
                remove_path(&path).ctx(|| format!("removing leftover {}", path.display()))?;
                continue;
            }
            let Ok(id) = name.parse::<u64>() else {
                tracing::warn!(path = %path.display(), "unexpected entry in snapshots directory; left alone");
                continue;
            };
            max_id = max_id.max(id);
            let meta = fs::read(path.join(META))
                .ok()
                .and_then(|b| serde_json::from_slice::<SnapshotMeta>(&b).ok());
            let Some(meta) = meta.filter(|_| path.join("fs").is_dir()) else {
                tracing::warn!(path = %path.display(), "snapshot without valid meta.json or fs/; removing");
                remove_path(&path).ctx(|| format!("removing broken {}", path.display()))?;
                continue;
            };
            match by_chain.get(&meta.chain_id) {
                Some(existing) if existing.id < id => {
                    remove_path(&path).ctx(|| format!("removing duplicate {}", path.display()))?;
                }
                _ => {
                    if let Some(old) = by_chain.insert(meta.chain_id.clone(), Snapshot { id, meta })
                    {
                        let old_path = dir.join(old.id.to_string());
                        remove_path(&old_path)
                            .ctx(|| format!("removing duplicate {}", old_path.display()))?;
                    }
                }
            }
        }
        Ok(Snapshots {
            dir: dir.to_path_buf(),
            index: Mutex::new(Index {
                by_chain,
                next_id: max_id + 1,
            }),
            building: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn get(&self, chain_id: &str) -> Option<Snapshot> {
        lock(&self.index).by_chain.get(chain_id).cloned()
    }

    pub(crate) fn all(&self) -> Vec<Snapshot> {
        lock(&self.index).by_chain.values().cloned().collect()
    }

    /// The directory to use as an overlay lower layer.
    pub(crate) fn fs_path(&self, id: u64) -> PathBuf {
        self.dir.join(id.to_string()).join("fs")
    }

    /// Returns the snapshot for `chain_id`, building it with `build` (which
    /// fills the given empty directory and returns the content size) if it
    /// does not exist. The bool says whether this call built it.
    pub(crate) fn ensure<F>(
        &self,
        chain_id: &str,
        diff_id: &str,
        tmp_dir: &Path,
        build: F,
    ) -> Result<(Snapshot, bool), ImageError>
    where
        F: FnOnce(&Path) -> Result<u64, ImageError>,
    {
        let gate = {
            let mut building = lock(&self.building);
            building
                .entry(chain_id.to_string())
                .or_insert_with(|| Arc::new(Mutex::new(())))
                .clone()
        };
        let result = {
            let _held = lock(&gate);
            match self.get(chain_id) {
                Some(existing) => Ok((existing, false)),
                None => self
                    .build(chain_id, diff_id, tmp_dir, build)
                    .map(|s| (s, true)),
            }
        };
        let mut building = lock(&self.building);
        // Two references left (the map's and ours) means nobody else is
        // waiting on this chain; any new waiter must take the map lock first.
        if Arc::strong_count(&gate) == 2 {
            building.remove(chain_id);
        }
        result
    }

    fn build<F>(
        &self,
        chain_id: &str,
        diff_id: &str,
        tmp_dir: &Path,
        build: F,
    ) -> Result<Snapshot, ImageError>
    where
        F: FnOnce(&Path) -> Result<u64, ImageError>,
    {
        let staging = self.dir.join(unique_name(STAGING_PREFIX));
        let fs_dir = staging.join("fs");
        let result = (|| {
            fs::create_dir(&staging).ctx(|| format!("creating {}", staging.display()))?;
            fs::create_dir(&fs_dir).ctx(|| format!("creating {}", fs_dir.display()))?;
            let size = build(&fs_dir)?;
            let meta = SnapshotMeta {
                chain_id: chain_id.to_string(),
                diff_id: diff_id.to_string(),
                size,
                created: crate::time::now_rfc3339(),
            };
            let bytes = serde_json::to_vec_pretty(&meta).map_err(|e| {
                ImageError::io("encoding snapshot metadata", std::io::Error::other(e))
            })?;
            write_atomic(&staging.join(META), &bytes, tmp_dir)?;
            // One syncfs instead of an fsync per file: the rename below must
            // not become durable before the layer's contents.
            let dir_fd =
                fs::File::open(&staging).ctx(|| format!("opening {}", staging.display()))?;
            rustix::fs::syncfs(&dir_fd).ctx(|| format!("syncing {}", staging.display()))?;
            let id = {
                let mut index = lock(&self.index);
                let id = index.next_id;
                index.next_id += 1;
                id
            };
            let final_dir = self.dir.join(id.to_string());
            fs::rename(&staging, &final_dir)
                .ctx(|| format!("renaming {} to {}", staging.display(), final_dir.display()))?;
            fsync_dir(&self.dir)?;
            Ok(Snapshot { id, meta })
        })();
        match result {
            Ok(snapshot) => {
                lock(&self.index)
                    .by_chain
                    .insert(chain_id.to_string(), snapshot.clone());
                Ok(snapshot)
            }
            Err(e) => {
                if let Err(rm) = remove_path(&staging) {
                    tracing::warn!(path = %staging.display(), error = %rm, "could not remove failed snapshot; it is removed at the next open");
                }
                Err(e)
            }
        }
    }

    /// Deletes the snapshot of `chain_id`. The directory is first renamed to
    /// `rm-*` so a crash mid-delete cannot leave a numbered, partial layer.
    pub(crate) fn remove(&self, chain_id: &str) -> Result<(), ImageError> {
        let Some(snapshot) = lock(&self.index).by_chain.remove(chain_id) else {
            return Ok(());
        };
        let from = self.dir.join(snapshot.id.to_string());
        let doomed = self.dir.join(unique_name(DOOMED_PREFIX));
        match fs::rename(&from, &doomed) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(ImageError::io(
                    format!("renaming {} for removal", from.display()),
                    e,
                ))
            }
        }
        remove_path(&doomed).ctx(|| format!("removing {}", doomed.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_commit_reload_remove() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("snapshots");
        let tmp = root.path().join("tmp");
        fs::create_dir(&dir).unwrap();
        fs::create_dir(&tmp).unwrap();
        // Leftovers of a crash.
        fs::create_dir_all(dir.join("new-abc/fs")).unwrap();
        fs::create_dir_all(dir.join("7")).unwrap();

        let snaps = Snapshots::load(&dir).unwrap();
        assert!(!dir.join("new-abc").exists());
        assert!(!dir.join("7").exists());

        let (s, built) = snaps
            .ensure("sha256:c1", "sha256:d1", &tmp, |fs_dir| {
                fs::write(fs_dir.join("f"), b"abc").unwrap();
                Ok(3)
            })
            .unwrap();
        assert!(built);
        assert_eq!(s.id, 8, "ids continue after the highest seen");
        let (again, built) = snaps
            .ensure("sha256:c1", "sha256:d1", &tmp, |_| {
                panic!("must not rebuild")
            })
            .unwrap();
        assert!(!built);
        assert_eq!(again.id, s.id);

        let err = snaps
            .ensure("sha256:c2", "sha256:d2", &tmp, |_| {
                Err(ImageError::InvalidArchive("boom".into()))
            })
            .unwrap_err();
        assert!(matches!(err, ImageError::InvalidArchive(_)));
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["8".to_string()]);

        drop(snaps);
        let snaps = Snapshots::load(&dir).unwrap();
        let s = snaps.get("sha256:c1").unwrap();
        assert_eq!(s.meta.size, 3);
        assert_eq!(fs::read(snaps.fs_path(s.id).join("f")).unwrap(), b"abc");
        snaps.remove("sha256:c1").unwrap();
        assert!(snaps.get("sha256:c1").is_none());
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
    }
}
