//! Group commit: writes that arrive together share one transaction, so
//! they share one commit (one WAL flush) and, on PostgreSQL, one turn of
//! the events lock.
//!
//! On PostgreSQL every write that records an event holds the events lock
//! (see `migrations/postgres/0001_init.sql`) from its event to the end of
//! its commit, WAL flush included; on SQLite one writer at a time holds the
//! database. Either way one transaction at a time commits, and with a
//! transaction per write the store was bounded by flushes a second. Here
//! one task takes every write waiting, runs them in one transaction and
//! answers each once that transaction has committed: a write is
//! acknowledged only when it is durable, as before.
//!
//! A write that fails inside a shared transaction would take the others
//! with it; the transaction is then rolled back and each write run again
//! in a transaction of its own, so each gets its own answer. A failed
//! commit is not retried (it may have committed): every write in it gets
//! the error, as a lone write would.
//!
//! A write may ask not to wait for the disk's flush (see
//! `Transition::unflushed`); a transaction is flushed when any of its
//! writes asks for it.

use std::future::Future;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use warren_core::SandboxSpec;

use super::StoreError;

/// What group commit needs of a database: a write transaction and its
/// commit. A transaction dropped without a commit must leave nothing
/// behind.
pub(super) trait Database: Send + Sync + 'static {
    type Tx: Send + 'static;
    /// `flush`: whether its commit waits until the disk holds it; a
    /// database may flush anyway.
    fn begin(&self, flush: bool) -> impl Future<Output = Result<Self::Tx, StoreError>> + Send;
    fn commit(tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// One write: statements run inside an open transaction.
/// It may run twice (see the module's notes), so it owns what it binds.
type Write<C> =
    Box<dyn for<'c> Fn(&'c mut C) -> BoxFuture<'c, Result<(), StoreError>> + Send + Sync>;

/// The statements of a write, given its transaction and owned arguments.
pub(super) type Statements<C, A> =
    for<'c> fn(&'c mut C, Arc<A>) -> BoxFuture<'c, Result<(), StoreError>>;

/// Most writes in one transaction; more waiting go in the next.
const MAX_BATCH: usize = 256;

struct Pending<C> {
    write: Write<C>,
    flush: bool,
    done: oneshot::Sender<Result<(), StoreError>>,
}

pub(super) struct GroupCommit<C> {
    queue: mpsc::UnboundedSender<Pending<C>>,
}

impl<C> Clone for GroupCommit<C> {
    fn clone(&self) -> Self {
        GroupCommit {
            queue: self.queue.clone(),
        }
    }
}

impl<C: Send + 'static> GroupCommit<C> {
    /// Starts the committing task; it ends when the last clone is dropped.
    pub(super) fn start<D: Database<Tx = C>>(db: D) -> GroupCommit<C> {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(commit_loop(db, rx));
        GroupCommit { queue }
    }

    /// Runs `statements` with `args` in a shared transaction and returns
    /// once it is committed (or failed); with `flush`, once the disk holds
    /// it.
    pub(super) async fn write_with<A: Send + Sync + 'static>(
        &self,
        args: A,
        flush: bool,
        statements: Statements<C, A>,
    ) -> Result<(), StoreError> {
        let args = Arc::new(args);
        self.write(Box::new(move |conn| statements(conn, args.clone())), flush)
            .await
    }

    async fn write(&self, write: Write<C>, flush: bool) -> Result<(), StoreError> {
        let (done, answer) = oneshot::channel();
        self.queue
            .send(Pending { write, flush, done })
            .map_err(|_| StoreError::Commit("the store is shutting down".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Commit("the committing task ended".into()))?
    }
}

async fn commit_loop<D: Database>(db: D, mut rx: mpsc::UnboundedReceiver<Pending<D::Tx>>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let writes: Vec<(&Write<D::Tx>, bool)> =
            batch.iter().map(|p| (&p.write, p.flush)).collect();
        let results = commit_together(&db, &writes).await;
        for (pending, result) in batch.drain(..).zip(results) {
            let _ = pending.done.send(result);
        }
    }
}

/// One result per write, in order.
async fn commit_together<D: Database>(
    db: &D,
    writes: &[(&Write<D::Tx>, bool)],
) -> Vec<Result<(), StoreError>> {
    let all = |e: StoreError| {
        let message = e.to_string();
        writes
            .iter()
            .map(|_| Err(StoreError::Commit(message.clone())))
            .collect()
    };
    if let [(write, flush)] = writes {
        return vec![alone(db, write, *flush).await];
    }
    let flush = writes.iter().any(|(_, flush)| *flush);
    let mut tx = match db.begin(flush).await {
        Ok(tx) => tx,
        Err(e) => return all(e),
    };
    let mut failed = false;
    for (w, _) in writes {
        if w(&mut tx).await.is_err() {
            failed = true;
            break;
        }
    }
    if !failed {
        return match D::commit(tx).await {
            Ok(()) => writes.iter().map(|_| Ok(())).collect(),
            Err(e) => all(e),
        };
    }
    // Dropped uncommitted, so nothing of the batch is left; each write
    // runs again on its own.
    drop(tx);
    let mut results = Vec::with_capacity(writes.len());
    for (w, flush) in writes {
        results.push(alone(db, w, *flush).await);
    }
    results
}

async fn alone<D: Database>(db: &D, write: &Write<D::Tx>, flush: bool) -> Result<(), StoreError> {
    let mut tx = db.begin(flush).await?;
    write(&mut tx).await?;
    D::commit(tx).await
}

/// Owned copies of the hot writes' arguments, which a [`Write`] keeps (it
/// may run twice, after its caller's borrows are gone).
pub(super) struct StateChange {
    pub id: String,
    pub state: warren_core::SandboxState,
    pub reason: String,
    pub time: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub exit_code: Option<i32>,
    pub grace: bool,
    pub node: Option<String>,
    /// The new spec, as stored (JSON).
    pub spec: Option<String>,
    pub message: String,
    pub flush: bool,
}

impl StateChange {
    pub(super) fn new(
        id: &str,
        state: warren_core::SandboxState,
        reason: &str,
        time: &str,
        t: &super::Transition<'_>,
    ) -> StateChange {
        let owned = |v: Option<&str>| v.map(str::to_string);
        StateChange {
            id: id.into(),
            state,
            reason: reason.into(),
            time: time.into(),
            started_at: owned(t.started_at),
            finished_at: owned(t.finished_at),
            exit_code: t.exit_code,
            grace: t.grace,
            node: owned(t.node),
            spec: t.spec.map(super::json),
            message: t.message.into(),
            flush: !t.unflushed,
        }
    }
}

/// A new spec with its event; `request_id` is `Some` for a pool claim,
/// which also sets the request id.
pub(super) struct SpecChange {
    pub id: String,
    pub spec: String,
    pub request_id: Option<Option<String>>,
    pub time: String,
    pub reason: String,
    pub message: String,
}

impl SpecChange {
    pub(super) fn set(
        id: &str,
        spec: &SandboxSpec,
        time: &str,
        reason: &str,
        message: &str,
    ) -> SpecChange {
        SpecChange {
            id: id.into(),
            spec: super::json(spec),
            request_id: None,
            time: time.into(),
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// A pool member taken by a create: its spec and request id.
    pub(super) fn claim(
        id: &str,
        spec: &SandboxSpec,
        request_id: Option<&str>,
        time: &str,
        message: &str,
    ) -> SpecChange {
        SpecChange {
            request_id: Some(request_id.map(str::to_string)),
            ..SpecChange::set(id, spec, time, "claimed", message)
        }
    }
}
