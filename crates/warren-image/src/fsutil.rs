//! Small durable-file helpers for the store's own files.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{ImageError, IoContext};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A name no other call in this process (or an earlier run of it) has used:
/// pid, time and a counter. Only used for scratch names inside the store,
/// which one process owns (see the store's lock file).
pub(crate) fn unique_name(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:x}-{nanos:x}-{n}", std::process::id())
}

/// fsyncs a directory so that renames into it survive a crash.
pub(crate) fn fsync_dir(dir: &Path) -> Result<(), ImageError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx(|| format!("syncing directory {}", dir.display()))
}

/// Writes `bytes` to `dest` atomically: a temp file in `tmp_dir` (same
/// filesystem), fsync, rename, fsync of the parent.
pub(crate) fn write_atomic(dest: &Path, bytes: &[u8], tmp_dir: &Path) -> Result<(), ImageError> {
    let tmp = tmp_dir.join(unique_name("w-"));
    let result = (|| {
        let mut f = File::create_new(&tmp).ctx(|| format!("creating {}", tmp.display()))?;
        f.write_all(bytes)
            .and_then(|()| f.sync_all())
            .ctx(|| format!("writing {} (is the disk full?)", tmp.display()))?;
        fs::rename(&tmp, dest).ctx(|| format!("renaming {} to {}", tmp.display(), dest.display()))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    if let Some(parent) = dest.parent() {
        fsync_dir(parent)?;
    }
    Ok(())
}

/// Removes a file or directory tree; a missing path is not an error.
pub(crate) fn remove_path(path: &Path) -> io::Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let result = if meta.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join("tmp");
        fs::create_dir(&tmp).unwrap();
        let dest = dir.path().join("f.json");
        write_atomic(&dest, b"one", &tmp).unwrap();
        write_atomic(&dest, b"two", &tmp).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"two");
        assert_eq!(fs::read_dir(&tmp).unwrap().count(), 0);
        assert_ne!(unique_name("a"), unique_name("a"));
        remove_path(&dest).unwrap();
        remove_path(&dest).unwrap();
        remove_path(&tmp).unwrap();
        assert!(!tmp.exists());
    }
}
