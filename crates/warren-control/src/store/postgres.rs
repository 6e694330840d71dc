//! [`PgStore`]: the store of a cluster, PostgreSQL shared by every
//! `warren server` replica.
//!
//! Same semantics as [`super::SqliteStore`]; what differs is that other
//! processes write to the same database. Two consequences:
//! - event numbers are handed out in commit order by the schema itself (a
//!   trigger on `events`, see `migrations/postgres/0001_init.sql`), so a
//!   follower that reads "after the last seq I saw" never skips one;
//! - followers are woken by `LISTEN warren_events` (the same trigger
//!   notifies) as well as by this process's own writes.
//!
//! Because that trigger lets one transaction commit at a time, the hot
//! writes (creates, state changes, spec changes, claims) share
//! transactions: see [`super::group_commit`].
//!
//! Its SQL, and its [`Store`](super::Store) methods, are shared with
//! SQLite's (see [`super::sql`]); here is only what PostgreSQL does its
//! own way: connecting, following notifications, writes outside group
//! commit in autocommit, `state = ANY($1)`, and the leader lease by the
//! server's clock in one statement.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions, PgRow};
use sqlx::{Connection, PgConnection, PgPool, Postgres};
use tokio::sync::watch;
use warren_core::SandboxState;

use super::group_commit::{self, GroupCommit};
use super::sql::{query, Arg, Dialect, Evented, Sql, EVENT_INSERT};
use super::StoreError;

/// The channel the `events` trigger notifies on.
const EVENTS_CHANNEL: &str = "warren_events";
/// Connections per process. Every write holds one for its transaction; a
/// server's requests beyond this wait for one (up to `ACQUIRE_TIMEOUT`).
const POOL_SIZE: u32 = 16;
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// The listener's connection may die without a word (a peer gone behind a
/// network partition leaves a half-open TCP connection that never errors):
/// after this long without a notification it is asked a question, and
/// replaced when no answer comes within `LISTEN_PROBE_TIMEOUT`.
const LISTEN_IDLE_PROBE: Duration = Duration::from_secs(15);
const LISTEN_PROBE_TIMEOUT: Duration = Duration::from_secs(5);
const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The hot writes (creates, state changes, claims) go through it.
    commits: GroupCommit<PgTx>,
    /// Bumped after every event this process commits, and by the listener
    /// for every notification (events of any process), so followers wait
    /// instead of polling.
    events_written: Arc<watch::Sender<u64>>,
    /// The listener task; it ends when the last clone of the store goes.
    _listener: Arc<AbortOnDrop>,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl PgStore {
    /// How the listener's connection shows in `pg_stat_activity`.
    pub const LISTENER_APPLICATION_NAME: &str = "warren-events-listener";

    /// Connects to `url` (`postgres://…` or `postgresql://…`, libpq's URI
    /// form: `postgres://USER:PASS@HOST:PORT/DB?sslmode=…`, a unix socket
    /// as `postgres://USER@%2Frun%2Fpostgresql/DB`), brings the schema up
    /// to date and starts following events. Several processes may do this
    /// at once on one database: migrations take a lock.
    pub async fn connect(url: &str) -> Result<PgStore, StoreError> {
        // sqlx's message names the part that is wrong, never the password.
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::BadUrl(format!("not a PostgreSQL URL: {e}")))?;
        PgStore::connect_with(options).await
    }

    pub async fn connect_with(options: PgConnectOptions) -> Result<PgStore, StoreError> {
        let options = match options.get_application_name() {
            Some(_) => options,
            None => options.application_name("warren"),
        };
        // The pool retries a refused connection until its timeout, then
        // says only that it timed out: one connection first says why.
        match PgConnection::connect_with(&options).await {
            Ok(c) => {
                let _ = c.close().await;
            }
            Err(e) => return Err(StoreError::Connect(describe(&options), e)),
        }
        let pool = PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options.clone())
            .await?;
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        let events_written = Arc::new(watch::Sender::new(0));
        // Listening before the store is handed out: a follower that
        // subscribes right after this returns misses nothing.
        let listen_options = options.application_name(PgStore::LISTENER_APPLICATION_NAME);
        let listener = listen(&listen_options).await?;
        let task = tokio::spawn(follow_notifications(
            listen_options,
            listener,
            events_written.clone(),
        ));
        Ok(PgStore {
            commits: GroupCommit::start(pool.clone()),
            pool,
            events_written,
            _listener: Arc::new(AbortOnDrop(task)),
        })
    }
}

/// Where `options` lead, for errors: never the password.
fn describe(options: &PgConnectOptions) -> String {
    let at = match options.get_socket() {
        Some(dir) => format!("the unix socket in {}", dir.display()),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    };
    let db = options.get_database().unwrap_or(options.get_username());
    format!("{at} (database {db:?}, user {:?})", options.get_username())
}

/// A fresh listener on a pool of its own (one connection, never retired by
/// age): a listener that is replaced takes its pool with it, so a
/// connection stuck on a dead peer never blocks the next one.
async fn listen(options: &PgConnectOptions) -> Result<PgListener, sqlx::Error> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options.clone())
        .await?;
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.listen(EVENTS_CHANNEL).await?;
    Ok(listener)
}

/// Wakes followers for every notification, for as long as the store lives.
/// Whenever the connection was lost, notifications sent meanwhile are lost
/// with it, so followers are woken once more after every reconnection:
/// they read the events table, which loses nothing.
async fn follow_notifications(
    options: PgConnectOptions,
    mut listener: PgListener,
    events_written: Arc<watch::Sender<u64>>,
) {
    let wake = || events_written.send_modify(|n| *n += 1);
    loop {
        let failure = match tokio::time::timeout(LISTEN_IDLE_PROBE, listener.try_recv()).await {
            Ok(Ok(Some(_))) => {
                wake();
                continue;
            }
            // sqlx saw the connection drop and made a new one.
            Ok(Ok(None)) => {
                tracing::warn!("event listener reconnected; waking followers");
                wake();
                continue;
            }
            Ok(Err(e)) => e.to_string(),
            // Quiet: is the connection still there? (try_recv is cancel
            // safe: a message half read stays in its buffer.)
            Err(_) => {
                let probe = sqlx::query("SELECT 1").execute(&mut listener);
                match tokio::time::timeout(LISTEN_PROBE_TIMEOUT, probe).await {
                    Ok(Ok(_)) => continue,
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => format!("no answer in {LISTEN_PROBE_TIMEOUT:?}"),
                }
            }
        };
        tracing::warn!(error = %failure, "event listener lost its connection; reconnecting");
        drop(listener);
        let mut backoff = RECONNECT_MIN;
        listener = loop {
            tokio::time::sleep(backoff).await;
            // Bounded: a connection attempt into a dead network path
            // might otherwise wait for good.
            let attempt = tokio::time::timeout(ACQUIRE_TIMEOUT * 2, listen(&options)).await;
            match attempt.unwrap_or_else(|_| Err(sqlx::Error::PoolTimedOut)) {
                Ok(l) => break l,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "event listener cannot reconnect");
                    backoff = (backoff * 2).min(RECONNECT_MAX);
                }
            }
        };
        tracing::info!("event listener reconnected; waking followers");
        wake();
    }
}

impl Dialect for PgStore {
    type Row = PgRow;
    type Tx = PgTx;

    fn commits(&self) -> &GroupCommit<PgTx> {
        &self.commits
    }

    fn events_written(&self) -> &watch::Sender<u64> {
        &self.events_written
    }

    async fn fetch_all(
        &self,
        sql: &'static Sql,
        args: &[Arg<'_>],
    ) -> Result<Vec<PgRow>, StoreError> {
        Ok(query(sql.pg, args).fetch_all(&self.pool).await?)
    }

    async fn fetch_optional(
        &self,
        sql: &'static Sql,
        args: &[Arg<'_>],
    ) -> Result<Option<PgRow>, StoreError> {
        Ok(query(sql.pg, args).fetch_optional(&self.pool).await?)
    }

    async fn begin(&self) -> Result<PgTx, StoreError> {
        PgTx::begin(&self.pool).await
    }

    async fn execute_in(
        tx: &mut PgTx,
        sql: &'static Sql,
        args: &[Arg<'_>],
    ) -> Result<u64, StoreError> {
        let done = query(sql.pg, args).execute(tx.conn()).await?;
        Ok(done.rows_affected())
    }

    async fn commit(tx: PgTx) -> Result<(), StoreError> {
        tx.commit().await
    }

    /// A statement alone commits alone: no transaction around it.
    async fn execute(&self, sql: &'static Sql, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let done = query(sql.pg, args).execute(&self.pool).await?;
        Ok(done.rows_affected())
    }

    async fn write_evented(
        tx: &mut PgTx,
        sql: &'static Evented,
        args: &[Arg<'_>],
        event: &[Arg<'_>; 5],
    ) -> Result<(), StoreError> {
        query(sql.pg, args).execute(tx.conn()).await?;
        query(EVENT_INSERT.pg, event).execute(tx.conn()).await?;
        Ok(())
    }

    async fn select_in_states(&self, states: &[SandboxState]) -> Result<Vec<PgRow>, StoreError> {
        let states: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        let rows =
            sqlx::query("SELECT * FROM sandboxes WHERE state = ANY($1) ORDER BY created_at, id")
                .bind(states)
                .fetch_all(&self.pool)
                .await?;
        Ok(rows)
    }

    async fn claim_lease(&self, holder: &str, url: &str, ttl_ms: i64) -> Result<PgRow, StoreError> {
        // One statement: the row lock orders claims that race, and the
        // database's clock judges expiry for every replica alike.
        Ok(sqlx::query(
            "WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms),
             claim AS (
                INSERT INTO leader (id, holder, url, expires_ms)
                SELECT 1, $1, $2, ms + $3 FROM now
                ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, url = excluded.url,
                    expires_ms = excluded.expires_ms,
                    epoch = leader.epoch + CASE WHEN leader.holder = excluded.holder THEN 0 ELSE 1 END
                WHERE leader.holder = excluded.holder OR leader.expires_ms < (SELECT ms FROM now)
                RETURNING holder, url, epoch
             )
             SELECT holder, url, epoch FROM claim
             UNION ALL
             SELECT holder, url, epoch FROM leader WHERE id = 1 AND NOT EXISTS (SELECT 1 FROM claim)",
        )
        .bind(holder)
        .bind(url)
        .bind(ttl_ms)
        .fetch_one(&self.pool)
        .await?)
    }
}

/// One write transaction, as `SqliteStore`'s: committed, its connection
/// goes back to the pool; dropped or failed at any point, the connection is
/// closed instead (the server rolls back what it had open), so no
/// connection in a state nobody can vouch for is ever handed out again.
pub(super) struct PgTx {
    conn: PoolConnection<Postgres>,
    committed: bool,
}

impl PgTx {
    async fn begin(pool: &PgPool) -> Result<PgTx, StoreError> {
        let mut conn = pool.acquire().await?;
        if let Err(e) = sqlx::query("BEGIN").execute(&mut *conn).await {
            conn.close_on_drop();
            return Err(e.into());
        }
        Ok(PgTx {
            conn,
            committed: false,
        })
    }

    fn conn(&mut self) -> &mut PgConnection {
        &mut self.conn
    }

    async fn commit(mut self) -> Result<(), StoreError> {
        sqlx::query("COMMIT").execute(&mut *self.conn).await?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for PgTx {
    fn drop(&mut self) {
        if !self.committed {
            self.conn.close_on_drop();
        }
    }
}

impl group_commit::Database for PgPool {
    type Tx = PgTx;

    /// Always flushed (see `Transition::unflushed`).
    async fn begin(&self, _flush: bool) -> Result<PgTx, StoreError> {
        PgTx::begin(self).await
    }

    async fn commit(tx: PgTx) -> Result<(), StoreError> {
        tx.commit().await
    }
}
