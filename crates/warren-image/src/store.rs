//! The image store: content-addressed blobs, per-chain snapshots and one
//! JSON record per image name.
//!
//! ```text
//! <root>/lock                  flock'ed by the owning process
//! <root>/content/sha256/<hex>  verified blobs (manifests, configs, layers)
//! <root>/snapshots/<n>/fs      unpacked layers (overlay lowerdirs)
//! <root>/images/<name>.json    image records, name %-escaped
//! <root>/tmp/                  scratch; emptied at open
//! ```
//!
//! Imports run concurrently with each other; removal and garbage collection
//! exclude them (a `RwLock`: imports read, GC writes), so GC never deletes
//! a snapshot or blob that an import in flight is about to reference.

mod assemble;
mod blobs;
mod derived;
mod gc;
mod import;
mod layers;
mod pins;
mod pulled;
mod records;

use std::collections::HashMap;
use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::error::{ImageError, IoContext};
use crate::fsutil::remove_path;
use crate::reference::escape_name;
use crate::snapshot::Snapshots;

pub(crate) use derived::DerivedImage;
pub use gc::PruneReport;
pub(crate) use pins::blob_key;
pub use pins::Pin;
pub(crate) use pulled::PulledImage;

/// Content-addressed image store rooted at one directory. All methods block;
/// async callers should use `spawn_blocking`. One process may open a root
/// at a time.
pub struct ImageStore {
    root: PathBuf,
    snapshots: Snapshots,
    gc_lock: RwLock<()>,
    /// Blobs (`blob:<hex>`) and snapshots (`chain:<id>`) that garbage
    /// collection must keep although no record names them: content of a
    /// pull in flight, and images live sandboxes run after their name moved
    /// on to a new digest. Counted, since several holders can share a key.
    pins: Mutex<HashMap<String, usize>>,
    /// Held for the store's lifetime: the flock lives as long as the fd.
    _lock_file: File,
}

impl ImageStore {
    /// Opens (creating if needed) the store at `root` and recovers from a
    /// crash: scratch files and half-built snapshots are deleted, and
    /// snapshots and blobs no image references are collected.
    pub fn open(root: &Path) -> Result<ImageStore, ImageError> {
        let created = !root.exists();
        fs::create_dir_all(root).ctx(|| format!("creating image store root {}", root.display()))?;
        let root = root
            .canonicalize()
            .ctx(|| format!("resolving image store root {}", root.display()))?;
        for sub in ["content/sha256", "snapshots", "images", "tmp"] {
            let dir = root.join(sub);
            fs::create_dir_all(&dir).ctx(|| format!("creating {}", dir.display()))?;
        }
        // Unpacked layers hold setuid binaries and device-free but otherwise
        // arbitrary trees: keep unprivileged users out of them.
        let mut private = vec![root.join("snapshots"), root.join("tmp")];
        if created {
            private.push(root.clone());
        }
        for dir in private {
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
                .ctx(|| format!("restricting permissions of {}", dir.display()))?;
        }

        let lock_path = root.join("lock");
        let lock_file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .ctx(|| format!("opening {}", lock_path.display()))?;
        match rustix::fs::flock(
            &lock_file,
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        ) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(ImageError::Conflict(format!(
                    "image store {} is in use by another process (lock {}): is another \
                     `warren up` running with this --home? Stop it, or give this one a \
                     different --home",
                    root.display(),
                    lock_path.display()
                )))
            }
            Err(e) => {
                return Err(ImageError::io(
                    format!("locking {}", lock_path.display()),
                    e.into(),
                ))
            }
        }

        let tmp = root.join("tmp");
        for entry in fs::read_dir(&tmp).ctx(|| format!("listing {}", tmp.display()))? {
            let path = entry.ctx(|| format!("listing {}", tmp.display()))?.path();
            remove_path(&path).ctx(|| format!("removing leftover {}", path.display()))?;
        }
        let snapshots = Snapshots::load(&root.join("snapshots"))?;
        let store = ImageStore {
            root,
            snapshots,
            gc_lock: RwLock::new(()),
            pins: Mutex::new(HashMap::new()),
            _lock_file: lock_file,
        };
        store.collect_garbage();
        Ok(store)
    }

    fn read_lock(&self) -> RwLockReadGuard<'_, ()> {
        self.gc_lock.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, ()> {
        self.gc_lock.write().unwrap_or_else(|p| p.into_inner())
    }

    fn blob_dir(&self) -> PathBuf {
        self.root.join("content/sha256")
    }

    fn images_dir(&self) -> PathBuf {
        self.root.join("images")
    }

    pub(crate) fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    fn record_path(&self, name: &str) -> PathBuf {
        self.images_dir()
            .join(format!("{}.json", escape_name(name)))
    }
}
