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

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool, Postgres, Row};
use tokio::sync::watch;
use warren_core::{Event, SandboxSpec, SandboxState};

use super::group_commit::{self, GroupCommit, SpecChange, StateChange};
use super::{
    decode, decode_batch, decode_body, decode_event, decode_node, decode_readable, json, BatchRow,
    Leader, NodeRecord, SandboxRow, SecretRow, Store, StoreError, Transition,
};

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
    commits: GroupCommit<PgConnection>,
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

    async fn begin_write(&self) -> Result<PgTx, StoreError> {
        PgTx::begin(&self.pool).await
    }

    fn wrote_event(&self) {
        self.events_written.send_modify(|n| *n += 1);
    }

    /// A new spec (and, for a claim, a request id) with its event, through
    /// the group commit. `update` binds the spec as $1, the id as $2 and
    /// the request id, when given, as $3.
    async fn spec_write(&self, c: SpecChange, update: &'static str) -> Result<(), StoreError> {
        self.commits
            .write_with((c, update), true, |conn, args| {
                Box::pin(async move {
                    let (c, update) = &*args;
                    let mut q = sqlx::query(*update).bind(&c.spec).bind(&c.id);
                    if let Some(request_id) = &c.request_id {
                        q = q.bind(request_id);
                    }
                    q.execute(&mut *conn).await?;
                    insert_event(conn, &c.time, &c.id, None, &c.reason, &c.message).await
                })
            })
            .await?;
        self.wrote_event();
        Ok(())
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

#[async_trait::async_trait]
impl Store for PgStore {
    fn subscribe_events(&self) -> watch::Receiver<u64> {
        self.events_written.subscribe()
    }

    async fn insert(&self, row: &SandboxRow, request_id: Option<&str>) -> Result<(), StoreError> {
        self.commits
            .write_with((row.clone(), request_id.map(str::to_string)), true, |conn, args| {
                Box::pin(async move {
                    let (row, request_id) = &*args;
                    sqlx::query(
                        "INSERT INTO sandboxes (id, state, reason, spec, resources, node, image_digest, request_id, created_at)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                    )
                    .bind(&row.id)
                    .bind(row.state.as_str())
                    .bind(&row.reason)
                    .bind(json(&row.spec))
                    .bind(json(&row.resources))
                    .bind(&row.node)
                    .bind(&row.image_digest)
                    .bind(request_id)
                    .bind(&row.created_at)
                    .execute(&mut *conn)
                    .await?;
                    insert_event(
                        conn,
                        &row.created_at,
                        &row.id,
                        Some(row.state),
                        &row.reason,
                        "",
                    )
                    .await
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
        self.commits
            .write_with(
                StateChange::new(id, state, reason, time, &t),
                true,
                |conn, c| {
                    Box::pin(async move {
                        sqlx::query(
                            "UPDATE sandboxes SET state = $1, reason = $2,
                        started_at = COALESCE($3, started_at),
                        finished_at = COALESCE($4, finished_at),
                        exit_code = COALESCE($5, exit_code),
                        grace = $6,
                        node = COALESCE($7, node)
                     WHERE id = $8",
                        )
                        .bind(c.state.as_str())
                        .bind(&c.reason)
                        .bind(&c.started_at)
                        .bind(&c.finished_at)
                        .bind(c.exit_code)
                        .bind(c.grace)
                        .bind(&c.node)
                        .bind(&c.id)
                        .execute(&mut *conn)
                        .await?;
                        insert_event(conn, &c.time, &c.id, Some(c.state), &c.reason, &c.message)
                            .await
                    })
                },
            )
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
        self.spec_write(
            SpecChange::set(id, spec, time, reason, message),
            "UPDATE sandboxes SET spec = $1 WHERE id = $2",
        )
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
        self.spec_write(
            SpecChange::claim(id, spec, request_id, time, message),
            "UPDATE sandboxes SET spec = $1, request_id = $3 WHERE id = $2",
        )
        .await
    }

    async fn set_exit_code(&self, id: &str, code: i32) -> Result<(), StoreError> {
        sqlx::query("UPDATE sandboxes SET exit_code = $1 WHERE id = $2")
            .bind(code)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn set_usage(&self, id: &str, usage: &warren_core::Usage) -> Result<(), StoreError> {
        let body = serde_json::to_string(usage)
            .map_err(|e| StoreError::Corrupt(id.to_string(), e.to_string()))?;
        sqlx::query("UPDATE sandboxes SET usage = $1 WHERE id = $2")
            .bind(body)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn get(&self, id: &str) -> Result<Option<SandboxRow>, StoreError> {
        let row = sqlx::query("SELECT * FROM sandboxes WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| decode(&r)).transpose()
    }

    async fn by_request_id(&self, request_id: &str) -> Result<Option<SandboxRow>, StoreError> {
        let row = sqlx::query("SELECT * FROM sandboxes WHERE request_id = $1")
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
            let states: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
            sqlx::query("SELECT * FROM sandboxes WHERE state = ANY($1) ORDER BY created_at, id")
                .bind(states)
                .fetch_all(&self.pool)
                .await?
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
            let why = warren_core::state::reason::CORRUPT_RECORD;
            let mut tx = self.begin_write().await?;
            // Another server may have retired it since the read above.
            let updated = sqlx::query(
                "UPDATE sandboxes SET state = 'failed', reason = $1, finished_at = $2
                 WHERE id = $3 AND state NOT IN ('destroyed', 'failed', 'lost')",
            )
            .bind(why)
            .bind(time)
            .bind(&id)
            .execute(tx.conn())
            .await?;
            if updated.rows_affected() == 0 {
                tx.commit().await?;
                continue;
            }
            let message = format!("its record could not be read ({e}); its sandbox was removed");
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
        let (seq,): (i64,) = sqlx::query_as("SELECT COALESCE(MAX(seq), 0)::BIGINT FROM events")
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
        // A negative limit is no limit, as in SQLite (`LIMIT NULL` here).
        let limit = (limit >= 0).then_some(limit);
        let rows =
            match sandbox_id {
                Some(id) => sqlx::query(
                    "SELECT * FROM events WHERE sandbox_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                )
                .bind(id)
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?,
                None => {
                    sqlx::query("SELECT * FROM events WHERE seq > $1 ORDER BY seq LIMIT $2")
                        .bind(after)
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?
                }
            };
        rows.iter().map(decode_event).collect()
    }

    async fn insert_batch(&self, b: &BatchRow) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO batches (id, count, spec, labels, created_at, retry_on_oom, retry_on_lost)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&b.id)
        .bind(i64::from(b.count))
        .bind(json(&b.spec))
        .bind(json(&b.labels))
        .bind(&b.created_at)
        .bind(b.retry_on_oom)
        .bind(b.retry_on_lost)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn delete_batch(&self, id: &str, time: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE batches SET deleted_at = COALESCE(deleted_at, $1) WHERE id = $2")
            .bind(time)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn batches(&self, id: Option<&str>) -> Result<Vec<BatchRow>, StoreError> {
        let rows = match id {
            Some(id) => {
                sqlx::query("SELECT * FROM batches WHERE id = $1")
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
        let row = sqlx::query("SELECT body FROM profiles WHERE name = $1")
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
        sqlx::query(
            "INSERT INTO profiles (name, body, updated_at) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at",
        )
        .bind(&p.name)
        .bind(json(p))
        .bind(time)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn add_run(
        &self,
        profile: &str,
        sandbox_id: &str,
        run: &warren_core::profile::Run,
        time: &str,
    ) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "INSERT INTO profile_runs (profile, sandbox_id, body, finished_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (sandbox_id) DO NOTHING",
        )
        .bind(profile)
        .bind(sandbox_id)
        .bind(json(run))
        .bind(time)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn runs(
        &self,
        profile: &str,
        limit: usize,
    ) -> Result<Vec<warren_core::profile::Run>, StoreError> {
        let rows = sqlx::query(
            "SELECT body FROM profile_runs WHERE profile = $1 ORDER BY seq DESC LIMIT $2",
        )
        .bind(profile)
        .bind(i64::try_from(limit).ok())
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
        sqlx::query("DELETE FROM profile_runs WHERE profile = $1")
            .bind(profile)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn profile_event(
        &self,
        sandbox_id: &str,
        profile: &str,
        message: &str,
        time: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO events (time, sandbox_id, type, state, reason, message)
             VALUES ($1, $2, 'profile', NULL, 'profile_anomalous', $3)",
        )
        .bind(time)
        .bind(sandbox_id)
        .bind(format!("profile {profile}: {message}"))
        .execute(&self.pool)
        .await?;
        self.wrote_event();
        Ok(())
    }

    async fn node_event(&self, reason: &str, message: &str, time: &str) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO events (time, sandbox_id, type, state, reason, message)
             VALUES ($1, '', 'node', NULL, $2, $3)",
        )
        .bind(time)
        .bind(reason)
        .bind(message)
        .execute(&self.pool)
        .await?;
        self.wrote_event();
        Ok(())
    }

    async fn put_node(&self, node: &NodeRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO nodes (name, url, credential, labels, cordoned, joined_at, tls_fingerprint)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
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
        .execute(&self.pool)
        .await?;
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
            "INSERT INTO pools (name, spec, size, updated_at) VALUES ($1, $2, $3, $4)
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
        let gone = sqlx::query("DELETE FROM pools WHERE name = $1")
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
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
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
            "UPDATE secrets SET version = $1, metadata = $2, sealed = $3, updated_at = $4
             WHERE name = $5 AND version = $6",
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
        let gone = sqlx::query("DELETE FROM secrets WHERE name = $1")
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
        // One statement: the row lock orders claims that race, and the
        // database's clock judges expiry for every replica alike.
        let row = sqlx::query(
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
        .await?;
        Ok(Leader {
            holder: row.try_get("holder")?,
            url: row.try_get("url")?,
            epoch: row.try_get::<i64, _>("epoch")?.try_into().unwrap_or(0),
        })
    }

    async fn delete_node(&self, name: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM nodes WHERE name = $1")
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(())
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
    type Connection = PgConnection;
    type Tx = PgTx;

    /// Always flushed (see `Transition::unflushed`).
    async fn begin(&self, _flush: bool) -> Result<PgTx, StoreError> {
        PgTx::begin(self).await
    }

    fn conn(tx: &mut PgTx) -> &mut PgConnection {
        tx.conn()
    }

    async fn commit(tx: PgTx) -> Result<(), StoreError> {
        tx.commit().await
    }
}

async fn insert_event(
    conn: &mut PgConnection,
    time: &str,
    id: &str,
    state: Option<SandboxState>,
    reason: &str,
    message: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO events (time, sandbox_id, type, state, reason, message)
         VALUES ($1, $2, 'state', $3, $4, $5)",
    )
    .bind(time)
    .bind(id)
    .bind(state.map(|s| s.as_str()))
    .bind(reason)
    .bind(message)
    .execute(conn)
    .await?;
    Ok(())
}
