//! Group commit for [`super::PgStore`]: writes that arrive together share
//! one transaction, so they share one turn of the events lock and one WAL
//! flush.
//!
//! Every write that records an event holds the events lock (see
//! `migrations/postgres/0001_init.sql`) from its event to the end of its
//! commit, WAL flush included, so one transaction at a time commits: with
//! a transaction per write, a server's creates were bounded by flushes a
//! second. Here one task takes every write waiting, runs them in one
//! transaction and answers each once that transaction has committed: a
//! write is acknowledged only when it is durable, as before.
//!
//! A write that fails inside a shared transaction would take the others
//! with it; the transaction is then rolled back and each write run again
//! in a transaction of its own, so each gets its own answer. A failed
//! commit is not retried (it may have committed): every write in it gets
//! the error, as a lone write would.

use futures_util::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};
use tokio::sync::{mpsc, oneshot};

use super::StoreError;

/// One write: statements run on the connection inside an open transaction.
/// It may run twice (see the module's notes), so it owns what it binds.
pub(super) type Write = Box<
    dyn for<'c> Fn(&'c mut PgConnection) -> BoxFuture<'c, Result<(), StoreError>> + Send + Sync,
>;

/// Most writes in one transaction; more waiting go in the next.
const MAX_BATCH: usize = 256;

struct Pending {
    write: Write,
    done: oneshot::Sender<Result<(), StoreError>>,
}

#[derive(Clone)]
pub(super) struct GroupCommit {
    queue: mpsc::UnboundedSender<Pending>,
}

impl GroupCommit {
    /// Starts the committing task; it ends when the last clone is dropped.
    pub(super) fn start(pool: PgPool) -> GroupCommit {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(commit_loop(pool, rx));
        GroupCommit { queue }
    }

    /// Runs `write` and returns once it is committed (or failed).
    pub(super) async fn write(&self, write: Write) -> Result<(), StoreError> {
        let (done, answer) = oneshot::channel();
        self.queue
            .send(Pending { write, done })
            .map_err(|_| StoreError::Commit("the store is shutting down".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Commit("the committing task ended".into()))?
    }
}

async fn commit_loop(pool: PgPool, mut rx: mpsc::UnboundedReceiver<Pending>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let writes: Vec<&Write> = batch.iter().map(|p| &p.write).collect();
        let results = commit_together(&pool, &writes).await;
        for (pending, result) in batch.drain(..).zip(results) {
            let _ = pending.done.send(result);
        }
    }
}

/// One result per write, in order.
async fn commit_together(pool: &PgPool, writes: &[&Write]) -> Vec<Result<(), StoreError>> {
    let all = |e: StoreError| {
        let message = e.to_string();
        writes
            .iter()
            .map(|_| Err(StoreError::Commit(message.clone())))
            .collect()
    };
    if writes.len() == 1 {
        return vec![alone(pool, writes[0]).await];
    }
    let mut conn = match Tx::begin(pool).await {
        Ok(c) => c,
        Err(e) => return all(e),
    };
    let mut failed = false;
    for w in writes {
        if w(conn.conn()).await.is_err() {
            failed = true;
            break;
        }
    }
    if !failed {
        return match conn.commit().await {
            Ok(()) => writes.iter().map(|_| Ok(())).collect(),
            Err(e) => all(e),
        };
    }
    // Rolled back when dropped (its connection is closed); nothing of the
    // batch committed, so each write runs again on its own.
    drop(conn);
    let mut results = Vec::with_capacity(writes.len());
    for w in writes {
        results.push(alone(pool, w).await);
    }
    results
}

async fn alone(pool: &PgPool, write: &Write) -> Result<(), StoreError> {
    let mut tx = Tx::begin(pool).await?;
    write(tx.conn()).await?;
    tx.commit().await
}

/// A transaction on a pooled connection. One dropped without a commit has
/// its connection closed instead (the server rolls back what it had open),
/// so no connection in a state nobody can vouch for is handed out again.
pub(super) struct Tx {
    conn: PoolConnection<Postgres>,
    committed: bool,
}

impl Tx {
    pub(super) async fn begin(pool: &PgPool) -> Result<Tx, StoreError> {
        let mut conn = pool.acquire().await?;
        if let Err(e) = sqlx::query("BEGIN").execute(&mut *conn).await {
            conn.close_on_drop();
            return Err(e.into());
        }
        Ok(Tx {
            conn,
            committed: false,
        })
    }

    pub(super) fn conn(&mut self) -> &mut PgConnection {
        &mut self.conn
    }

    pub(super) async fn commit(mut self) -> Result<(), StoreError> {
        sqlx::query("COMMIT").execute(&mut *self.conn).await?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        if !self.committed {
            self.conn.close_on_drop();
        }
    }
}
