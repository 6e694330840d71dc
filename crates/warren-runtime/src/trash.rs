//! Sandbox directories on their way out. A destroy renames the sandbox's
//! directory into `<home>/trash` (one metadata operation) and answers; one
//! thread removes the trash's contents behind it. Removing a directory tree
//! on ext4 costs a journal update per entry, 0.15-0.4 ms each on this
//! project's development disk, about a millisecond of every destroy, which
//! nothing waiting on the destroy needs: the sandbox's processes are dead
//! before its directory moves, and nothing reaches the trash but this
//! thread. What a crash leaves in the trash is removed at the next start.
//!
//! The trash is made `0700` under the home, so the files a sandbox left
//! (owned by its host uid range, which is given back as the directory
//! moves) are out of reach of any later holder of that range.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use crate::RuntimeError;

pub struct Trash {
    dir: PathBuf,
    queue: mpsc::Sender<PathBuf>,
    /// Makes every entry's name unique within this run; `discard` copes with
    /// a name an earlier run left.
    next: AtomicU64,
    /// Entries not yet removed: their space is on its way back (the node's
    /// disk floor waits for it before it stops another sandbox).
    pending: std::sync::Arc<AtomicU64>,
}

impl Trash {
    /// Opens (or makes) the trash at `dir` and starts the thread that
    /// empties it, beginning with whatever an earlier run left there.
    pub fn open(dir: PathBuf) -> Result<Trash, RuntimeError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(RuntimeError::io("create the trash directory"))?;
        let (queue, emptied) = mpsc::channel::<PathBuf>();
        let pending = std::sync::Arc::new(AtomicU64::new(0));
        let done = pending.clone();
        std::thread::Builder::new()
            .name("warren-trash".into())
            .spawn(move || {
                for path in emptied {
                    if let Err(e) = remove_tree(&path) {
                        tracing::warn!(path = %path.display(), error = %e, "emptying the trash");
                    }
                    done.fetch_sub(1, Ordering::AcqRel);
                }
            })
            .map_err(RuntimeError::io("start the trash thread"))?;
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                pending.fetch_add(1, Ordering::AcqRel);
                if queue.send(e.path()).is_err() {
                    pending.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        Ok(Trash {
            dir,
            queue,
            next: AtomicU64::new(0),
            pending,
        })
    }

    /// Whether removed sandboxes' directories are still being deleted.
    pub fn emptying(&self) -> bool {
        self.pending.load(Ordering::Acquire) > 0
    }

    /// Takes `victim` (a directory on the trash's file system) off its
    /// path at once and has it removed in the background. A victim already
    /// gone is fine; one that cannot be moved (another file system) is
    /// removed before this returns.
    pub fn discard(&self, victim: &Path) -> Result<(), RuntimeError> {
        let name = victim.file_name().unwrap_or(victim.as_os_str());
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut entry = name.to_os_string();
        entry.push(format!(".{}.{n}", std::process::id()));
        let to = self.dir.join(entry);
        match std::fs::rename(victim, &to) {
            Ok(()) => {
                // The thread lives as long as the queue; a send fails only
                // if it died, and then the removal happens here.
                self.pending.fetch_add(1, Ordering::AcqRel);
                if let Err(mpsc::SendError(path)) = self.queue.send(to) {
                    self.pending.fetch_sub(1, Ordering::AcqRel);
                    remove_tree(&path)?;
                }
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(_) => remove_tree(victim),
        }
    }
}

/// Removes a directory and everything in it; one already gone is fine.
pub(crate) fn remove_tree(dir: &Path) -> Result<(), RuntimeError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(RuntimeError::Destroy(format!(
            "remove {}: {e}",
            dir.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_empty(dir: &Path) -> bool {
        for _ in 0..500 {
            if std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none()) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        false
    }

    fn tree(at: &Path) {
        std::fs::create_dir_all(at.join("upper/a/b")).unwrap();
        std::fs::write(at.join("upper/a/b/f"), b"x").unwrap();
        std::fs::write(at.join("config.json"), b"{}").unwrap();
    }

    #[test]
    fn a_discarded_directory_leaves_its_path_at_once_and_the_disk_soon() {
        let home = tempfile::tempdir().unwrap();
        let trash = Trash::open(home.path().join("trash")).unwrap();
        let victim = home.path().join("sandboxes/sbx-000000000001");
        tree(&victim);
        trash.discard(&victim).unwrap();
        assert!(!victim.exists());
        assert!(wait_empty(&home.path().join("trash")));
        // Twice is fine: the second finds nothing to move.
        trash.discard(&victim).unwrap();
    }

    #[test]
    fn what_an_earlier_run_left_in_the_trash_is_removed_at_open() {
        let home = tempfile::tempdir().unwrap();
        let left = home.path().join("trash/sbx-000000000002.1.0");
        tree(&left);
        let _trash = Trash::open(home.path().join("trash")).unwrap();
        assert!(wait_empty(&home.path().join("trash")));
    }

    #[test]
    fn a_name_an_earlier_run_left_does_not_stop_a_discard() {
        let home = tempfile::tempdir().unwrap();
        let trash_dir = home.path().join("trash");
        let trash = Trash::open(trash_dir.clone()).unwrap();
        // The entry this discard will be renamed to, already there and
        // not empty (a rename over it fails).
        let taken = trash_dir.join(format!("sbx-000000000003.{}.0", std::process::id()));
        tree(&taken);
        let victim = home.path().join("sbx-000000000003");
        tree(&victim);
        trash.discard(&victim).unwrap();
        assert!(!victim.exists());
    }
}
