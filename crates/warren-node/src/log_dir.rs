//! The node's directory of sandbox logs (`<home>/logs`): a log opened for
//! each new or adopted sandbox, read back as a stream, and removed once its
//! sandbox has been gone longer than the retention. The format of one log
//! is `logs`' business.

use std::path::PathBuf;
use std::sync::Arc;

use crate::logs::{self, SandboxLog};
use crate::ship_journal::ShipJournal;
use crate::NodeError;

/// Cheap to clone: the expiry scan takes a copy to a blocking thread.
#[derive(Clone)]
pub(crate) struct LogDir {
    dir: PathBuf,
    /// Bytes each sandbox's log keeps (see `logs`).
    max: u64,
    /// Where every line is also written for the control plane (None:
    /// shipping is off).
    ship: Option<Arc<ShipJournal>>,
}

impl LogDir {
    pub(crate) fn new(dir: PathBuf, max: u64, ship: Option<Arc<ShipJournal>>) -> LogDir {
        LogDir { dir, max, ship }
    }

    /// The shipping journal, if shipping is on.
    pub(crate) fn journal(&self) -> Option<&Arc<ShipJournal>> {
        self.ship.as_ref()
    }

    /// The sandbox's JSON-lines log, opened for appending.
    pub(crate) fn open(&self, id: &str) -> Result<Arc<SandboxLog>, NodeError> {
        SandboxLog::open(&self.dir, id, self.max)
            .map(|log| Arc::new(log.shipping(self.ship.clone())))
            .map_err(|e| NodeError::Internal(format!("open log: {e}")))
    }

    /// Whether there is a log for the sandbox.
    pub(crate) fn has(&self, id: &str) -> bool {
        logs::files(&self.dir, id).iter().any(|f| f.exists())
    }

    /// The sandbox's log as whole JSON lines, oldest first; with `follow`,
    /// until it says the sandbox has ended.
    pub(crate) fn stream(
        &self,
        id: &str,
        follow: Option<logs::Follow>,
    ) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static {
        logs::stream(&self.dir, id, follow)
    }

    /// Removes the logs of sandboxes not in `live` that were last written
    /// longer ago than `retention`. Blocking: it reads the directory.
    pub(crate) fn expire(&self, live: &[String], retention: std::time::Duration) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in rd.filter_map(|e| e.ok()) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(id) = logs::owner(&name) else {
                continue;
            };
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > retention);
            if old && !live.iter().any(|l| l == id) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}
