//! [`SqliteStore`]: the store of `warren up` (and of a one-machine
//! `warren server --database sqlite:PATH`). Its SQL, and its
//! [`Store`](super::Store) methods, are shared with PostgreSQL's (see
//! [`super::sql`]); here is only what SQLite does its own way: one writer
//! at a time, each write in a `BEGIN IMMEDIATE` transaction ([`WriteTx`]),
//! a hot write and its event sent as one text, `state IN (?, …)`, and the
//! leader lease by SQLite's clock.

use std::path::Path;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Sqlite, SqliteConnection, SqlitePool};
use tokio::sync::watch;
use warren_core::SandboxState;

use super::group_commit::{self, GroupCommit};
use super::sql::{query, Arg, Dialect, Evented, Sql};
use super::StoreError;

#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// Bumped after every committed event, so followers wait instead of
    /// polling.
    events_written: std::sync::Arc<watch::Sender<u64>>,
    /// The hot writes (creates, state changes, claims) go through it.
    commits: GroupCommit<WriteTx>,
}

impl SqliteStore {
    pub async fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(std::time::Duration::from_secs(10))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            // A connection to a local file cannot go stale; the ping
            // before each use was one more trip to its worker thread on
            // every read and write.
            .test_before_acquire(false)
            .connect_with(opts)
            .await?;
        sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        Ok(SqliteStore {
            commits: GroupCommit::start(pool.clone()),
            pool,
            events_written: std::sync::Arc::new(watch::Sender::new(0)),
        })
    }
}

impl Dialect for SqliteStore {
    type Row = SqliteRow;
    type Tx = WriteTx;

    fn commits(&self) -> &GroupCommit<WriteTx> {
        &self.commits
    }

    fn events_written(&self) -> &watch::Sender<u64> {
        &self.events_written
    }

    async fn fetch_all(
        &self,
        sql: &'static Sql,
        args: &[Arg<'_>],
    ) -> Result<Vec<SqliteRow>, StoreError> {
        Ok(query(sql.sqlite, args).fetch_all(&self.pool).await?)
    }

    async fn fetch_optional(
        &self,
        sql: &'static Sql,
        args: &[Arg<'_>],
    ) -> Result<Option<SqliteRow>, StoreError> {
        Ok(query(sql.sqlite, args).fetch_optional(&self.pool).await?)
    }

    async fn begin(&self) -> Result<WriteTx, StoreError> {
        WriteTx::begin(&self.pool).await
    }

    async fn execute_in(
        tx: &mut WriteTx,
        sql: &'static Sql,
        args: &[Arg<'_>],
    ) -> Result<u64, StoreError> {
        let done = query(sql.sqlite, args).execute(tx.conn()).await?;
        Ok(done.rows_affected())
    }

    async fn commit(tx: WriteTx) -> Result<(), StoreError> {
        tx.commit().await
    }

    async fn write_evented(
        tx: &mut WriteTx,
        sql: &'static Evented,
        args: &[Arg<'_>],
        event: &[Arg<'_>; 5],
    ) -> Result<(), StoreError> {
        let text = tx.sql(sql);
        query(text, args.iter().chain(event))
            .execute(tx.conn())
            .await?;
        Ok(())
    }

    async fn select_in_states(
        &self,
        states: &[SandboxState],
    ) -> Result<Vec<SqliteRow>, StoreError> {
        let marks = vec!["?"; states.len()].join(", ");
        let sql =
            format!("SELECT * FROM sandboxes WHERE state IN ({marks}) ORDER BY created_at, id");
        // Only placeholders are formatted in; the states are bound.
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for s in states {
            q = q.bind(s.as_str());
        }
        Ok(q.fetch_all(&self.pool).await?)
    }

    async fn claim_lease(
        &self,
        holder: &str,
        url: &str,
        ttl_ms: i64,
    ) -> Result<SqliteRow, StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO leader (id, holder, url, expires_ms)
             VALUES (1, ?1, ?2, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + ?3)
             ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, url = excluded.url,
                expires_ms = excluded.expires_ms,
                epoch = leader.epoch + (leader.holder <> excluded.holder)
             WHERE leader.holder = excluded.holder
                OR leader.expires_ms < CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
        )
        .bind(holder)
        .bind(url)
        .bind(ttl_ms)
        .execute(tx.conn())
        .await?;
        let row = sqlx::query("SELECT holder, url, epoch FROM leader WHERE id = 1")
            .fetch_one(tx.conn())
            .await?;
        tx.commit().await?;
        Ok(row)
    }
}

/// One write transaction. Committed, its connection goes back to the pool;
/// dropped or failed at any point, its connection is closed instead (SQLite
/// rolls back what is open when it closes). A connection whose commit or
/// rollback failed is in a state nobody can vouch for: sqlx kept such
/// connections (with a transaction still open and the write lock held),
/// and every later write waited on it or, worse, was answered as committed
/// while nothing was (the store made read-only for two seconds by the
/// fault-injection suite).
pub(super) struct WriteTx {
    conn: PoolConnection<Sqlite>,
    committed: bool,
    /// `BEGIN IMMEDIATE` has been sent.
    open: bool,
    /// Its commit waits for the disk's flush (the connection's own
    /// setting, `synchronous=FULL`); when not, the connection is set back
    /// by the commit, or closed.
    flush: bool,
}

impl WriteTx {
    /// `BEGIN IMMEDIATE` on a connection of its own (the write lock is
    /// taken at once, so two writers never deadlock upgrading a read lock,
    /// which SQLite's busy timeout does not wait out).
    async fn begin(pool: &SqlitePool) -> Result<WriteTx, StoreError> {
        let mut conn = pool.acquire().await?;
        if let Err(e) = sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await {
            // Nothing is open on it; but a connection that fails to begin
            // may hold state from a failure before, so it goes too.
            conn.close_on_drop();
            return Err(e.into());
        }
        Ok(WriteTx {
            conn,
            committed: false,
            open: true,
            flush: true,
        })
    }

    /// A transaction whose `BEGIN IMMEDIATE` goes with its first write's
    /// statements (see [`Evented`]). Dropped uncommitted, its connection is
    /// closed, which rolls back whatever of it ran.
    async fn lazy(pool: &SqlitePool, flush: bool) -> Result<WriteTx, StoreError> {
        Ok(WriteTx {
            conn: pool.acquire().await?,
            committed: false,
            open: false,
            flush,
        })
    }

    /// The text of a write's statements, opening the transaction if this
    /// is its first.
    fn sql(&mut self, sql: &Evented) -> &'static str {
        if std::mem::replace(&mut self.open, true) {
            sql.sqlite
        } else if self.flush {
            sql.sqlite_opening
        } else {
            sql.sqlite_opening_unflushed
        }
    }

    fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.conn
    }

    async fn commit(mut self) -> Result<(), StoreError> {
        if !self.open {
            self.committed = true;
            return Ok(());
        }
        let commit = if self.flush {
            "COMMIT"
        } else {
            "COMMIT; PRAGMA synchronous = FULL"
        };
        match sqlx::query(commit).execute(&mut *self.conn).await {
            Ok(_) => {
                self.committed = true;
                Ok(())
            }
            Err(e) => {
                let _ = sqlx::query("ROLLBACK").execute(&mut *self.conn).await;
                Err(e.into())
            }
        }
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        // Closing the connection rolls back what ran of the transaction;
        // one where nothing ran goes back to the pool as it came.
        if self.open && !self.committed {
            self.conn.close_on_drop();
        }
    }
}

impl group_commit::Database for SqlitePool {
    type Tx = WriteTx;

    async fn begin(&self, flush: bool) -> Result<WriteTx, StoreError> {
        WriteTx::lazy(self, flush).await
    }

    async fn commit(tx: WriteTx) -> Result<(), StoreError> {
        tx.commit().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Store, Transition};

    /// An unflushed commit lowers its connection's safety level for itself
    /// only: every connection of the pool flushes again afterwards, alone
    /// or when unflushed and flushed writes shared a transaction.
    #[tokio::test]
    async fn unflushed_writes_leave_every_connection_flushing() -> Result<(), StoreError> {
        let dir = tempfile::tempdir().map_err(|e| StoreError::Commit(e.to_string()))?;
        let store = SqliteStore::open(&dir.path().join("warren.db")).await?;
        let unflushed = |yes: bool| Transition {
            unflushed: yes,
            ..Default::default()
        };
        // No rows: each transition is still its event, committed.
        store
            .transition(
                "sbx-0",
                SandboxState::Stopping,
                "requested",
                "t1",
                unflushed(true),
            )
            .await?;
        let ids: Vec<String> = (0..8).map(|i| format!("sbx-{i}")).collect();
        let together = ids.iter().enumerate().map(|(i, id)| {
            store.transition(
                id,
                SandboxState::Destroyed,
                "requested",
                "t2",
                unflushed(i % 2 == 0),
            )
        });
        for result in futures_util::future::join_all(together).await {
            result?;
        }
        assert_eq!(store.events(None, 0, -1).await?.len(), 1 + ids.len());
        // Every connection the pool holds, at once.
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(store.pool.acquire().await?);
        }
        for conn in &mut held {
            let level: i64 = sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(&mut **conn)
                .await?;
            assert_eq!(
                level, 2,
                "a connection left at synchronous={level}, not FULL (2)"
            );
        }
        Ok(())
    }
}
