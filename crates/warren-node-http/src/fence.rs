//! Fencing a replaced control plane. Replicas of `warren server` take
//! turns leading through a lease in their database; each new leader gets
//! a higher epoch and sends it on every call to a node. A leader that
//! stalled (a long pause, a frozen VM) past its lease may wake up and act
//! before it notices that another replica took over: the node refuses any
//! call carrying an epoch lower than the highest it has seen, so the stale
//! leader cannot create, destroy or change anything there. The node keeps
//! that epoch on disk, so a restart of the node does not forget it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use warren_core::sync::lock;

/// The header a control plane's calls carry its leader epoch in.
pub const LEADER_EPOCH: &str = "x-warren-leader-epoch";

/// The highest leader epoch this node has obeyed.
#[derive(Clone, Default)]
pub struct Fence(Arc<Inner>);

#[derive(Default)]
struct Inner {
    epoch: Mutex<u64>,
    /// Where it is kept; none for a node whose control plane runs in the
    /// same process (nothing can replace it).
    path: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {text:?} is not a leader epoch (a number); remove the file if the node's home was copied from elsewhere", path.display())]
    Corrupt { path: PathBuf, text: String },
}

impl Fence {
    /// The fence kept in `path` (0 while the file does not exist yet).
    pub fn open(path: impl Into<PathBuf>) -> Result<Fence, FenceError> {
        let path = path.into();
        let epoch = match std::fs::read_to_string(&path) {
            Ok(text) => text.trim().parse().map_err(|_| FenceError::Corrupt {
                path: path.clone(),
                text: text.chars().take(40).collect(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(source) => return Err(FenceError::Io { path, source }),
        };
        Ok(Fence(Arc::new(Inner {
            epoch: Mutex::new(epoch),
            path: Some(path),
        })))
    }

    /// The highest epoch seen so far.
    pub fn epoch(&self) -> u64 {
        *lock(&self.0.epoch)
    }

    /// Whether a call carrying `given` may go on: refused (with the epoch
    /// that holds) when a newer leader has been seen; a newer epoch is
    /// written down before the call goes on, so no call of an older leader
    /// is obeyed after one of the newer leader was, even across a restart.
    pub(crate) fn admit(&self, given: u64) -> Result<(), Refusal> {
        let mut epoch = lock(&self.0.epoch);
        if given < *epoch {
            return Err(Refusal::Stale { current: *epoch });
        }
        if given > *epoch {
            if let Some(path) = &self.0.path {
                // A few bytes once per change of leader: written while the
                // lock is held so that two new epochs cannot race on disk.
                persist(path, given).map_err(Refusal::Unsaved)?;
            }
            *epoch = given;
        }
        Ok(())
    }
}

/// The epoch a call was let through with. A call whose work outlasts a
/// change of leader (a create) checks it again at the end: the new leader
/// read the node's inventory before that work was done, so it cannot know
/// of what the work made.
#[derive(Clone)]
pub(crate) struct Admitted {
    pub(crate) given: u64,
    pub(crate) fence: Fence,
}

impl Admitted {
    /// The newer epoch seen since the call was let through, if any.
    pub(crate) fn superseded_by(&self) -> Option<u64> {
        let current = self.fence.epoch();
        (current > self.given).then_some(current)
    }
}

pub(crate) enum Refusal {
    Stale { current: u64 },
    Unsaved(FenceError),
}

fn persist(path: &Path, epoch: u64) -> Result<(), FenceError> {
    let io = |source| FenceError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    writeln!(tmp, "{epoch}").map_err(io)?;
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_epoch_is_refused_and_the_newest_survives_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("leader-epoch");
        let fence = Fence::open(&path).expect("open");
        assert_eq!(fence.epoch(), 0);
        assert!(fence.admit(1).is_ok());
        assert!(fence.admit(3).is_ok());
        assert!(fence.admit(3).is_ok(), "the same leader again");
        assert!(matches!(fence.admit(2), Err(Refusal::Stale { current: 3 })));
        let again = Fence::open(&path).expect("reopen");
        assert_eq!(again.epoch(), 3);
        assert!(matches!(again.admit(1), Err(Refusal::Stale { .. })));
    }

    #[test]
    fn a_garbled_file_is_an_error_not_epoch_zero() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("leader-epoch");
        std::fs::write(&path, "seven\n").expect("write");
        assert!(matches!(
            Fence::open(&path),
            Err(FenceError::Corrupt { .. })
        ));
    }

    #[test]
    fn in_memory_fence_needs_no_file() {
        let fence = Fence::default();
        assert!(fence.admit(5).is_ok());
        assert!(fence.admit(4).is_err());
    }
}
