//! [`SqliteStore`]: the store of `warren up` (and of a one-machine
//! `warren server --database sqlite:PATH`).

use std::path::Path;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, Sqlite, SqliteConnection, SqlitePool};
use warren_core::{Event, SandboxSpec, SandboxState};

use super::group_commit::{self, GroupCommit, SpecChange, StateChange};
use super::{
    decode, decode_batch, decode_body, decode_event, decode_node, decode_readable, json, BatchRow,
    Leader, NodeRecord, SandboxRow, SecretRow, Store, StoreError, Transition,
};

/// The statements of a group-committed write, each followed by its event;
/// the same text also behind `BEGIN IMMEDIATE`, for the first write of a
/// transaction. Every statement is one trip to the connection's worker
/// thread, and on a busy machine a trip cost 0.1-0.2 ms: a write alone made
/// four (begin, statement, event, commit), now two.
pub(super) struct TxSql {
    alone: &'static str,
    opening: &'static str,
    /// `opening` for a transaction committed without a flush: SQLite
    /// takes the safety level only outside a transaction.
    opening_unflushed: &'static str,
}

/// The event that goes with a write binds its time, sandbox id, state,
/// reason and message.
macro_rules! tx_sql {
    ($sql:literal) => {
        TxSql {
            alone: concat!($sql, EVENT_INSERT!()),
            opening: concat!("BEGIN IMMEDIATE; ", $sql, EVENT_INSERT!()),
            opening_unflushed: concat!(
                "PRAGMA synchronous = NORMAL; BEGIN IMMEDIATE; ",
                $sql,
                EVENT_INSERT!()
            ),
        }
    };
}

#[allow(non_snake_case)]
macro_rules! EVENT_INSERT {
    () => {
        "INSERT INTO events (time, sandbox_id, type, state, reason, message) VALUES (?, ?, 'state', ?, ?, ?)"
    };
}

#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// Bumped after every committed event, so followers wait instead of
    /// polling.
    events_written: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
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
            events_written: std::sync::Arc::new(tokio::sync::watch::Sender::new(0)),
        })
    }

    async fn begin_write(&self) -> Result<WriteTx, StoreError> {
        WriteTx::begin(&self.pool).await
    }

    /// A new spec (and, for a claim, a request id) with its event, through
    /// the group commit. `sql` binds the spec, the request id when given,
    /// the id, then the event's time, reason and message.
    async fn spec_write(&self, c: SpecChange, sql: &'static TxSql) -> Result<(), StoreError> {
        self.commits
            .write_with((c, sql), true, |tx, args| {
                Box::pin(async move {
                    let (c, sql) = &*args;
                    let mut q = sqlx::query(tx.sql(sql)).bind(&c.spec);
                    if let Some(request_id) = &c.request_id {
                        q = q.bind(request_id);
                    }
                    q.bind(&c.id)
                        .bind(&c.time)
                        .bind(&c.id)
                        .bind(None::<&str>)
                        .bind(&c.reason)
                        .bind(&c.message)
                        .execute(tx.conn())
                        .await?;
                    Ok(())
                })
            })
            .await?;
        self.wrote_event();
        Ok(())
    }

    fn wrote_event(&self) {
        self.events_written.send_modify(|n| *n += 1);
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    fn subscribe_events(&self) -> tokio::sync::watch::Receiver<u64> {
        self.events_written.subscribe()
    }

    async fn insert(&self, row: &SandboxRow, request_id: Option<&str>) -> Result<(), StoreError> {
        self.commits
            .write_with((row.clone(), request_id.map(str::to_string)), true, |tx, args| {
                Box::pin(async move {
                    let (row, request_id) = &*args;
                    static SQL: TxSql = tx_sql!(
                        "INSERT INTO sandboxes (id, state, reason, spec, resources, node, image_digest, request_id, created_at)
                         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?);"
                    );
                    sqlx::query(tx.sql(&SQL))
                    .bind(&row.id)
                    .bind(row.state.as_str())
                    .bind(&row.reason)
                    .bind(json(&row.spec))
                    .bind(json(&row.resources))
                    .bind(&row.node)
                    .bind(&row.image_digest)
                    .bind(request_id)
                    .bind(&row.created_at)
                    .bind(&row.created_at)
                    .bind(&row.id)
                    .bind(row.state.as_str())
                    .bind(&row.reason)
                    .bind("")
                    .execute(tx.conn())
                    .await?;
                    Ok(())
                })
            })
            .await?;
        self.wrote_event();
        Ok(())
    }

    async fn transition(
        &self,
        id: &str,
        state: SandboxState,
        reason: &str,
        time: &str,
        t: Transition<'_>,
    ) -> Result<(), StoreError> {
        let change = StateChange::new(id, state, reason, time, &t);
        let flush = change.flush;
        self.commits
            .write_with(change, flush, |tx, c| {
                Box::pin(async move {
                    static SQL: TxSql = tx_sql!(
                        "UPDATE sandboxes SET state = ?, reason = ?,
                        started_at = COALESCE(?, started_at),
                        finished_at = COALESCE(?, finished_at),
                        exit_code = COALESCE(?, exit_code),
                        grace = ?,
                        node = COALESCE(?, node)
                     WHERE id = ?;"
                    );
                    sqlx::query(tx.sql(&SQL))
                        .bind(c.state.as_str())
                        .bind(&c.reason)
                        .bind(&c.started_at)
                        .bind(&c.finished_at)
                        .bind(c.exit_code)
                        .bind(c.grace)
                        .bind(&c.node)
                        .bind(&c.id)
                        .bind(&c.time)
                        .bind(&c.id)
                        .bind(c.state.as_str())
                        .bind(&c.reason)
                        .bind(&c.message)
                        .execute(tx.conn())
                        .await?;
                    Ok(())
                })
            })
            .await?;
        self.wrote_event();
        Ok(())
    }

    async fn set_spec(
        &self,
        id: &str,
        spec: &SandboxSpec,
        time: &str,
        reason: &str,
        message: &str,
    ) -> Result<(), StoreError> {
        static SQL: TxSql = tx_sql!("UPDATE sandboxes SET spec = ? WHERE id = ?;");
        self.spec_write(SpecChange::set(id, spec, time, reason, message), &SQL)
            .await
    }

    async fn claim_pooled(
        &self,
        id: &str,
        spec: &SandboxSpec,
        request_id: Option<&str>,
        time: &str,
        message: &str,
    ) -> Result<(), StoreError> {
        static SQL: TxSql = tx_sql!("UPDATE sandboxes SET spec = ?, request_id = ? WHERE id = ?;");
        self.spec_write(SpecChange::claim(id, spec, request_id, time, message), &SQL)
            .await
    }

    async fn set_exit_code(&self, id: &str, code: i32) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query("UPDATE sandboxes SET exit_code = ? WHERE id = ?")
            .bind(code)
            .bind(id)
            .execute(tx.conn())
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn set_usage(&self, id: &str, usage: &warren_core::Usage) -> Result<(), StoreError> {
        let body = serde_json::to_string(usage)
            .map_err(|e| StoreError::Corrupt(id.to_string(), e.to_string()))?;
        let mut tx = self.begin_write().await?;
        sqlx::query("UPDATE sandboxes SET usage = ? WHERE id = ?")
            .bind(body)
            .bind(id)
            .execute(tx.conn())
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get(&self, id: &str) -> Result<Option<SandboxRow>, StoreError> {
        let row = sqlx::query("SELECT * FROM sandboxes WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| decode(&r)).transpose()
    }

    async fn by_request_id(&self, request_id: &str) -> Result<Option<SandboxRow>, StoreError> {
        let row = sqlx::query("SELECT * FROM sandboxes WHERE request_id = ?")
            .bind(request_id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| decode(&r)).transpose()
    }

    async fn list(&self, states: &[SandboxState]) -> Result<Vec<SandboxRow>, StoreError> {
        let rows = if states.is_empty() {
            sqlx::query("SELECT * FROM sandboxes ORDER BY created_at, id")
                .fetch_all(&self.pool)
                .await?
        } else {
            let marks = vec!["?"; states.len()].join(", ");
            let sql =
                format!("SELECT * FROM sandboxes WHERE state IN ({marks}) ORDER BY created_at, id");
            // Only placeholders are formatted in; the states are bound.
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for s in states {
                q = q.bind(s.as_str());
            }
            q.fetch_all(&self.pool).await?
        };
        Ok(decode_readable(&rows))
    }

    async fn fail_unreadable(&self, time: &str) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM sandboxes WHERE state NOT IN ('destroyed', 'failed', 'lost')",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut failed = Vec::new();
        for r in &rows {
            let Err(e) = decode(r) else { continue };
            let id: String = r.try_get("id")?;
            let mut tx = self.begin_write().await?;
            sqlx::query(
                "UPDATE sandboxes SET state = 'failed', reason = ?, finished_at = ? WHERE id = ?",
            )
            .bind(warren_core::state::reason::CORRUPT_RECORD)
            .bind(time)
            .bind(&id)
            .execute(tx.conn())
            .await?;
            let message = format!("its record could not be read ({e}); its sandbox was removed");
            let why = warren_core::state::reason::CORRUPT_RECORD;
            insert_event(
                tx.conn(),
                time,
                &id,
                Some(SandboxState::Failed),
                why,
                &message,
            )
            .await?;
            tx.commit().await?;
            self.wrote_event();
            failed.push(id);
        }
        Ok(failed)
    }

    async fn last_event_seq(&self) -> Result<i64, StoreError> {
        let (seq,): (i64,) = sqlx::query_as("SELECT COALESCE(MAX(seq), 0) FROM events")
            .fetch_one(&self.pool)
            .await?;
        Ok(seq)
    }

    async fn events(
        &self,
        sandbox_id: Option<&str>,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        let rows =
            match sandbox_id {
                Some(id) => sqlx::query(
                    "SELECT * FROM events WHERE sandbox_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                )
                .bind(id)
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?,
                None => {
                    sqlx::query("SELECT * FROM events WHERE seq > ? ORDER BY seq LIMIT ?")
                        .bind(after)
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?
                }
            };
        rows.iter().map(decode_event).collect()
    }

    async fn insert_batch(&self, b: &BatchRow) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO batches (id, count, spec, labels, created_at, retry_on_oom, retry_on_lost) VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&b.id)
        .bind(b.count)
        .bind(json(&b.spec))
        .bind(json(&b.labels))
        .bind(&b.created_at)
        .bind(b.retry_on_oom)
        .bind(b.retry_on_lost)
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn delete_batch(&self, id: &str, time: &str) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query("UPDATE batches SET deleted_at = COALESCE(deleted_at, ?) WHERE id = ?")
            .bind(time)
            .bind(id)
            .execute(tx.conn())
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn batches(&self, id: Option<&str>) -> Result<Vec<BatchRow>, StoreError> {
        let rows = match id {
            Some(id) => {
                sqlx::query("SELECT * FROM batches WHERE id = ?")
                    .bind(id)
                    .fetch_all(&self.pool)
                    .await?
            }
            None => {
                sqlx::query("SELECT * FROM batches ORDER BY created_at, id")
                    .fetch_all(&self.pool)
                    .await?
            }
        };
        rows.iter().map(decode_batch).collect()
    }

    async fn profile(
        &self,
        name: &str,
    ) -> Result<Option<warren_core::profile::Profile>, StoreError> {
        let row = sqlx::query("SELECT body FROM profiles WHERE name = ?")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| decode_body(name, &r.try_get::<String, _>("body")?))
            .transpose()
    }

    async fn profiles(&self) -> Result<Vec<warren_core::profile::Profile>, StoreError> {
        let rows = sqlx::query("SELECT name, body FROM profiles ORDER BY name")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let name: String = r.try_get("name")?;
                decode_body(&name, &r.try_get::<String, _>("body")?)
            })
            .collect()
    }

    async fn put_profile(
        &self,
        p: &warren_core::profile::Profile,
        time: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO profiles (name, body, updated_at) VALUES (?, ?, ?)
             ON CONFLICT(name) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at",
        )
        .bind(&p.name)
        .bind(json(p))
        .bind(time)
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn add_run(
        &self,
        profile: &str,
        sandbox_id: &str,
        run: &warren_core::profile::Run,
        time: &str,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin_write().await?;
        let r = sqlx::query(
            "INSERT OR IGNORE INTO profile_runs (profile, sandbox_id, body, finished_at) VALUES (?, ?, ?, ?)",
        )
        .bind(profile)
        .bind(sandbox_id)
        .bind(json(run))
        .bind(time)
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        Ok(r.rows_affected() == 1)
    }

    async fn runs(
        &self,
        profile: &str,
        limit: usize,
    ) -> Result<Vec<warren_core::profile::Run>, StoreError> {
        let rows = sqlx::query(
            "SELECT body FROM profile_runs WHERE profile = ? ORDER BY seq DESC LIMIT ?",
        )
        .bind(profile)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        let mut runs = rows
            .iter()
            .map(|r| decode_body(profile, &r.try_get::<String, _>("body")?))
            .collect::<Result<Vec<_>, StoreError>>()?;
        runs.reverse();
        Ok(runs)
    }

    async fn delete_runs(&self, profile: &str) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query("DELETE FROM profile_runs WHERE profile = ?")
            .bind(profile)
            .execute(tx.conn())
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn profile_event(
        &self,
        sandbox_id: &str,
        profile: &str,
        message: &str,
        time: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query("INSERT INTO events (time, sandbox_id, type, state, reason, message) VALUES (?, ?, 'profile', NULL, 'profile_anomalous', ?)")
            .bind(time)
            .bind(sandbox_id)
            .bind(format!("profile {profile}: {message}"))
            .execute(tx.conn())
            .await?;
        tx.commit().await?;
        self.wrote_event();
        Ok(())
    }

    async fn node_event(&self, reason: &str, message: &str, time: &str) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query("INSERT INTO events (time, sandbox_id, type, state, reason, message) VALUES (?, '', 'node', NULL, ?, ?)")
            .bind(time)
            .bind(reason)
            .bind(message)
            .execute(tx.conn())
            .await?;
        tx.commit().await?;
        self.wrote_event();
        Ok(())
    }

    async fn put_node(&self, node: &NodeRecord) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO nodes (name, url, credential, labels, cordoned, joined_at, tls_fingerprint)
             VALUES (?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (name) DO UPDATE SET url = excluded.url,
                credential = excluded.credential, labels = excluded.labels,
                cordoned = excluded.cordoned, joined_at = excluded.joined_at,
                tls_fingerprint = excluded.tls_fingerprint",
        )
        .bind(&node.name)
        .bind(&node.url)
        .bind(&node.credential)
        .bind(json(&node.labels))
        .bind(node.cordoned)
        .bind(&node.joined_at)
        .bind(&node.tls_fingerprint)
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn put_pool(
        &self,
        name: &str,
        spec: &warren_core::pool::PoolSpec,
        time: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO pools (name, spec, size, updated_at) VALUES (?, ?, ?, ?)
             ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, size = excluded.size,
                updated_at = excluded.updated_at",
        )
        .bind(name)
        .bind(json(spec))
        .bind(i64::from(spec.size))
        .bind(time)
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn pools(&self) -> Result<Vec<(String, warren_core::pool::PoolSpec)>, StoreError> {
        let rows = sqlx::query("SELECT name, spec FROM pools ORDER BY name")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| super::decode_pool(r.try_get("name")?, &r.try_get::<String, _>("spec")?))
            .collect()
    }

    async fn delete_pool(&self, name: &str) -> Result<bool, StoreError> {
        let mut tx = self.begin_write().await?;
        let gone = sqlx::query("DELETE FROM pools WHERE name = ?")
            .bind(name)
            .execute(tx.conn())
            .await?
            .rows_affected()
            > 0;
        tx.commit().await?;
        Ok(gone)
    }

    async fn insert_secret(&self, secret: &SecretRow) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO secrets (name, id, version, metadata, sealed, created_at, updated_at)
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&secret.name)
        .bind(&secret.id)
        .bind(secret.version)
        .bind(&secret.metadata)
        .bind(&secret.sealed)
        .bind(&secret.created_at)
        .bind(&secret.updated_at)
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn update_secret(&self, secret: &SecretRow, version: i64) -> Result<bool, StoreError> {
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE secrets SET version = ?, metadata = ?, sealed = ?, updated_at = ?
             WHERE name = ? AND version = ?",
        )
        .bind(secret.version)
        .bind(&secret.metadata)
        .bind(&secret.sealed)
        .bind(&secret.updated_at)
        .bind(&secret.name)
        .bind(version)
        .execute(tx.conn())
        .await?
        .rows_affected()
            > 0;
        tx.commit().await?;
        Ok(done)
    }

    async fn secrets(&self) -> Result<Vec<SecretRow>, StoreError> {
        let rows = sqlx::query("SELECT * FROM secrets ORDER BY name")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(super::decode_secret).collect()
    }

    async fn delete_secret(&self, name: &str) -> Result<bool, StoreError> {
        let mut tx = self.begin_write().await?;
        let gone = sqlx::query("DELETE FROM secrets WHERE name = ?")
            .bind(name)
            .execute(tx.conn())
            .await?
            .rows_affected()
            > 0;
        tx.commit().await?;
        Ok(gone)
    }

    async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        let rows = sqlx::query("SELECT * FROM nodes ORDER BY name")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(decode_node).collect()
    }

    async fn claim_leader(
        &self,
        holder: &str,
        url: &str,
        ttl_ms: i64,
    ) -> Result<Leader, StoreError> {
        let mut tx = self.begin_write().await?;
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
        Ok(Leader {
            holder: row.try_get("holder")?,
            url: row.try_get("url")?,
            epoch: row.try_get::<i64, _>("epoch")?.try_into().unwrap_or(0),
        })
    }

    async fn delete_node(&self, name: &str) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query("DELETE FROM nodes WHERE name = ?")
            .bind(name)
            .execute(tx.conn())
            .await?;
        tx.commit().await?;
        Ok(())
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
    /// statements (see [`TxSql`]). Dropped uncommitted, its connection is
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
    fn sql(&mut self, sql: &TxSql) -> &'static str {
        if std::mem::replace(&mut self.open, true) {
            sql.alone
        } else if self.flush {
            sql.opening
        } else {
            sql.opening_unflushed
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
    type Connection = WriteTx;
    type Tx = WriteTx;

    async fn begin(&self, flush: bool) -> Result<WriteTx, StoreError> {
        WriteTx::lazy(self, flush).await
    }

    fn conn(tx: &mut WriteTx) -> &mut WriteTx {
        tx
    }

    async fn commit(tx: WriteTx) -> Result<(), StoreError> {
        tx.commit().await
    }
}

async fn insert_event(
    conn: &mut SqliteConnection,
    time: &str,
    id: &str,
    state: Option<SandboxState>,
    reason: &str,
    message: &str,
) -> Result<(), StoreError> {
    sqlx::query(EVENT_INSERT!())
        .bind(time)
        .bind(id)
        .bind(state.map(|s| s.as_str()))
        .bind(reason)
        .bind(message)
        .execute(conn)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
