//! Watching a sandbox's directory: the runtime's inotify watch, polled by
//! a thread of its own, as a stream of changes.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use warren_node_api::WatchKind;
use warren_runtime::watch::{Change, Watch};

use crate::{Node, NodeError};

/// How often a watch's thread reads its (non-blocking) descriptor.
const POLL: Duration = Duration::from_millis(100);

/// A change (the entry's name relative to the watched directory), or the
/// error that ended the watch, as its last item.
pub(crate) type DirChange = Result<(String, WatchKind), NodeError>;

impl Node {
    /// Changes of `path` in the sandbox (and its subdirectories with
    /// `recursive`) as they happen. The stream ends when it is dropped,
    /// the directory goes, or the sandbox is no longer on the node.
    pub(crate) async fn watch_dir(
        self: &Arc<Self>,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<BoxStream<'static, DirChange>, NodeError> {
        self.renew_lease(id);
        let root = self.root(id)?;
        let path = path.to_string();
        let watch = tokio::task::spawn_blocking(move || Watch::new(root, &path, recursive))
            .await
            .map_err(|e| NodeError::Internal(format!("node task: {e}")))??;
        let (tx, rx) = tokio::sync::mpsc::channel::<DirChange>(256);
        let (node, id) = (Arc::downgrade(self), id.to_string());
        // A thread, not a task: reading the watch is a system call, and a
        // watch is rare enough that a thread each costs little.
        std::thread::Builder::new()
            .name("warren-watch".into())
            .spawn(move || {
                poll(watch, &tx, || {
                    node.upgrade().is_some_and(|n| n.is_live(&id))
                })
            })
            .map_err(|e| NodeError::Internal(format!("watch thread: {e}")))?;
        Ok(tokio_stream::wrappers::ReceiverStream::new(rx).boxed())
    }
}

/// Sends the watch's changes every [`POLL`] until the receiver is
/// dropped, the sandbox is gone (`alive`), the directory goes, or reading
/// fails (sent as the last item).
fn poll(mut watch: Watch, tx: &tokio::sync::mpsc::Sender<DirChange>, alive: impl Fn() -> bool) {
    while !tx.is_closed() && alive() {
        match watch.read() {
            Ok(changes) => {
                for (name, change) in changes {
                    if tx.blocking_send(Ok((name, kind(change)))).is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let _ = tx.blocking_send(Err(e.into()));
                return;
            }
        }
        if watch.is_over() {
            return;
        }
        std::thread::sleep(POLL);
    }
}

fn kind(change: Change) -> WatchKind {
    match change {
        Change::Create => WatchKind::Create,
        Change::Write => WatchKind::Write,
        Change::Remove => WatchKind::Remove,
        Change::Rename => WatchKind::Rename,
        Change::Chmod => WatchKind::Chmod,
    }
}
