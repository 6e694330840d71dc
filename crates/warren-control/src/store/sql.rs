//! The SQL both stores share, written once. A statement is written with
//! `?` placeholders and `sql!` renders PostgreSQL's text of it (`$1`,
//! `$2`, …) at compile time, so no query is rewritten while running. The
//! [`Store`] methods are implemented once, here, for every [`Dialect`];
//! a dialect supplies only what truly differs: how a statement is bound
//! and run (SQLite's single-writer `BEGIN IMMEDIATE` transactions,
//! PostgreSQL's pool), how a hot write and its event share a trip (group
//! commit), the `state IN (…)` filter, and the leader lease, which reads
//! the database's own clock.

use std::future::Future;

use sqlx::{Database, Encode, Type};
use tokio::sync::watch;
use warren_core::profile::{Profile, Run};
use warren_core::tenant::TenantName;
use warren_core::{Event, SandboxSpec, SandboxState, Usage};

use super::group_commit::{GroupCommit, SpecChange, StateChange};
use super::{
    decode, decode_batch, decode_body, decode_event, decode_node, decode_pool, decode_readable,
    decode_secret, decode_tenant, decode_token, json, tenant_of_column, BatchRow, Leader,
    LogCursor, LogEntry, LogKind, NodeRecord, OwnedName, PoolRow, SandboxRow, SecretRow, Store,
    StoreError, StoreRow, TenantRow, TokenRow, Transition,
};

/// One statement: SQLite's text (`?` placeholders) and PostgreSQL's.
pub(super) struct Sql {
    pub sqlite: &'static str,
    pub pg: &'static str,
}

/// A `&'static Sql` of a constant text; PostgreSQL's is rendered while
/// compiling (see [`numbered`]).
macro_rules! sql {
    ($text:expr) => {{
        const SQLITE: &str = $text;
        const LEN: usize = $crate::store::sql::numbered(SQLITE, &mut []);
        const PG_BYTES: [u8; LEN] = {
            let mut out = [0; LEN];
            $crate::store::sql::numbered(SQLITE, &mut out);
            out
        };
        const SQL: $crate::store::sql::Sql = $crate::store::sql::Sql {
            sqlite: SQLITE,
            pg: match std::str::from_utf8(&PG_BYTES) {
                Ok(pg) => pg,
                Err(_) => panic!("a placeholder split a character"),
            },
        };
        &SQL
    }};
}

/// The event a state change records, bound as its time, sandbox id,
/// state, reason and message (see [`event`]).
macro_rules! event_insert {
    () => {
        "INSERT INTO events (time, sandbox_id, type, state, reason, message) \
         VALUES (?, ?, 'state', ?, ?, ?)"
    };
}

/// A hot write and its event, as group commit runs them (see
/// [`Dialect::write_evented`]): PostgreSQL sends the statement, then the
/// event; SQLite sends both as one text, one trip to its connection's
/// worker thread (on a busy machine a trip cost 0.1-0.2 ms: a write alone
/// made four, begin, statement, event and commit, now two), behind
/// `BEGIN IMMEDIATE` when it opens the transaction.
pub(super) struct Evented {
    pub pg: &'static str,
    pub sqlite: &'static str,
    pub sqlite_opening: &'static str,
    /// `sqlite_opening` for a transaction committed without a flush:
    /// SQLite takes the safety level only outside a transaction.
    pub sqlite_opening_unflushed: &'static str,
}

macro_rules! evented {
    ($sql:literal) => {{
        const E: Evented = Evented {
            pg: sql!($sql).pg,
            sqlite: concat!($sql, "; ", event_insert!()),
            sqlite_opening: concat!("BEGIN IMMEDIATE; ", $sql, "; ", event_insert!()),
            sqlite_opening_unflushed: concat!(
                "PRAGMA synchronous = NORMAL; BEGIN IMMEDIATE; ",
                $sql,
                "; ",
                event_insert!()
            ),
        };
        &E
    }};
}

pub(super) const EVENT_INSERT: &Sql = sql!(event_insert!());

/// Writes `sql` with each `?` outside quotes numbered (`$1`, `$2`, …)
/// into `out`, as much as fits; returns the whole length.
pub(super) const fn numbered(sql: &str, out: &mut [u8]) -> usize {
    const fn put(out: &mut [u8], len: usize, c: u8) -> usize {
        if len < out.len() {
            out[len] = c;
        }
        len + 1
    }
    let sql = sql.as_bytes();
    let (mut i, mut len, mut n, mut quoted) = (0, 0, 0, false);
    while i < sql.len() {
        let c = sql[i];
        i += 1;
        quoted ^= c == b'\'';
        if c != b'?' || quoted {
            len = put(out, len, c);
            continue;
        }
        n += 1;
        len = put(out, len, b'$');
        let mut scale = 1;
        while scale * 10 <= n {
            scale *= 10;
        }
        while scale > 0 {
            len = put(out, len, b'0' + (n / scale % 10) as u8);
            scale /= 10;
        }
    }
    len
}

/// A value bound to a placeholder.
#[derive(Clone, Copy)]
pub(super) enum Arg<'a> {
    Text(Option<&'a str>),
    Int(i64),
    Int32(Option<i32>),
    Flag(bool),
}

macro_rules! arg_from {
    ($($t:ty => |$v:ident| $arg:expr;)*) => {
        $(impl<'a> From<$t> for Arg<'a> {
            fn from($v: $t) -> Self {
                $arg
            }
        })*
    };
}

arg_from! {
    &'a str => |v| Arg::Text(Some(v));
    &'a String => |v| Arg::Text(Some(v));
    Option<&'a str> => |v| Arg::Text(v);
    &'a Option<String> => |v| Arg::Text(v.as_deref());
    i64 => |v| Arg::Int(v);
    Option<i32> => |v| Arg::Int32(v);
    bool => |v| Arg::Flag(v);
}

/// `&[Arg]` of values that convert.
macro_rules! args {
    ($($v:expr),* $(,)?) => { &[$(Arg::from($v)),*] };
}

/// `text` with `args` bound, for a database that takes every kind of
/// [`Arg`].
pub(super) fn query<'a, DB>(
    text: &'static str,
    args: impl IntoIterator<Item = &'a Arg<'a>>,
) -> sqlx::query::Query<'static, DB, DB::Arguments>
where
    DB: Database,
    Option<&'a str>: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
    Option<i32>: Encode<'a, DB> + Type<DB>,
    bool: Encode<'a, DB> + Type<DB>,
{
    args.into_iter()
        .fold(sqlx::query(text), |q, arg| match *arg {
            Arg::Text(v) => q.bind(v),
            Arg::Int(v) => q.bind(v),
            Arg::Int32(v) => q.bind(v),
            Arg::Flag(v) => q.bind(v),
        })
}

/// The arguments of [`EVENT_INSERT`].
pub(super) fn event<'a>(
    time: &'a str,
    id: &'a str,
    state: Option<SandboxState>,
    reason: &'a str,
    message: &'a str,
) -> [Arg<'a>; 5] {
    [
        time.into(),
        id.into(),
        state.map(|s| s.as_str()).into(),
        reason.into(),
        message.into(),
    ]
}

/// What a database does differently. Every future is `Send`: the stores
/// serve a multi-threaded server.
pub(super) trait Dialect: Send + Sync + 'static {
    type Row: for<'r> StoreRow<'r> + Send + Sync;
    /// A write transaction (of its own, or the group commit's); dropped
    /// uncommitted, nothing of it is kept and its connection is not reused.
    type Tx: Send + 'static;

    fn commits(&self) -> &GroupCommit<Self::Tx>;
    /// Bumped after every event this process commits.
    fn events_written(&self) -> &watch::Sender<u64>;

    fn fetch_all(
        &self,
        sql: &'static Sql,
        args: &[Arg<'_>],
    ) -> impl Future<Output = Result<Vec<Self::Row>, StoreError>> + Send;
    fn fetch_optional(
        &self,
        sql: &'static Sql,
        args: &[Arg<'_>],
    ) -> impl Future<Output = Result<Option<Self::Row>, StoreError>> + Send;

    fn begin(&self) -> impl Future<Output = Result<Self::Tx, StoreError>> + Send;
    /// Runs one statement in `tx`; returns the rows it changed.
    fn execute_in(
        tx: &mut Self::Tx,
        sql: &'static Sql,
        args: &[Arg<'_>],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
    fn commit(tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// One statement, committed before it returns; returns the rows it
    /// changed.
    fn execute(
        &self,
        sql: &'static Sql,
        args: &[Arg<'_>],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        async move {
            let mut tx = self.begin().await?;
            let changed = Self::execute_in(&mut tx, sql, args).await?;
            Self::commit(tx).await?;
            Ok(changed)
        }
    }

    /// A write's statement (binding `args`) and its event (binding
    /// `event`), in a transaction of the group commit.
    fn write_evented(
        tx: &mut Self::Tx,
        sql: &'static Evented,
        args: &[Arg<'_>],
        event: &[Arg<'_>; 5],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Every sandbox in one of `states`, oldest first.
    fn select_in_states(
        &self,
        states: &[SandboxState],
    ) -> impl Future<Output = Result<Vec<Self::Row>, StoreError>> + Send;

    /// See [`Store::claim_leader`]; the lease's row after the attempt.
    fn claim_lease(
        &self,
        holder: &str,
        url: &str,
        ttl_ms: i64,
    ) -> impl Future<Output = Result<Self::Row, StoreError>> + Send;

    fn wrote_event(&self) {
        self.events_written().send_modify(|n| *n += 1);
    }
}

/// A new spec (and, for a claim, a request id) with its event, through
/// the group commit.
async fn spec_write<D: Dialect>(store: &D, c: SpecChange) -> Result<(), StoreError> {
    store
        .commits()
        .write_with(c, true, |tx, c| {
            Box::pin(async move {
                let event = event(&c.time, &c.id, None, &c.reason, &c.message);
                match &c.request_id {
                    None => {
                        let sql = evented!("UPDATE sandboxes SET spec = ? WHERE id = ?");
                        D::write_evented(tx, sql, args![&c.spec, &c.id], &event).await
                    }
                    Some(request_id) => {
                        let sql =
                            evented!("UPDATE sandboxes SET spec = ?, request_id = ? WHERE id = ?");
                        let args = args![&c.spec, request_id, &c.id];
                        D::write_evented(tx, sql, args, &event).await
                    }
                }
            })
        })
        .await?;
    store.wrote_event();
    Ok(())
}

#[async_trait::async_trait]
impl<D: Dialect> Store for D {
    fn subscribe_events(&self) -> watch::Receiver<u64> {
        self.events_written().subscribe()
    }

    async fn insert(&self, row: &SandboxRow, request_id: Option<&str>) -> Result<(), StoreError> {
        let args = (row.clone(), request_id.map(str::to_string));
        self.commits()
            .write_with(args, true, |tx, args| {
                Box::pin(async move {
                    let (row, request_id) = &*args;
                    let sql = evented!(
                        "INSERT INTO sandboxes (id, state, reason, spec, resources, node,
                            image_digest, request_id, created_at, tenant)
                         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    );
                    let (state, spec, resources) =
                        (row.state.as_str(), json(&row.spec), json(&row.resources));
                    let args = args![
                        &row.id,
                        state,
                        &row.reason,
                        &spec,
                        &resources,
                        &row.node,
                        &row.image_digest,
                        request_id,
                        &row.created_at,
                        row.tenant.as_str(),
                    ];
                    let event = event(&row.created_at, &row.id, Some(row.state), &row.reason, "");
                    D::write_evented(tx, sql, args, &event).await
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
        self.commits()
            .write_with(change, flush, |tx, c| {
                Box::pin(async move {
                    let sql = evented!(
                        "UPDATE sandboxes SET state = ?, reason = ?,
                            started_at = COALESCE(?, started_at),
                            finished_at = COALESCE(?, finished_at),
                            exit_code = COALESCE(?, exit_code),
                            grace = ?,
                            node = COALESCE(?, node),
                            spec = COALESCE(?, spec)
                         WHERE id = ?"
                    );
                    let args = args![
                        c.state.as_str(),
                        &c.reason,
                        &c.started_at,
                        &c.finished_at,
                        c.exit_code,
                        c.grace,
                        &c.node,
                        &c.spec,
                        &c.id,
                    ];
                    let event = event(&c.time, &c.id, Some(c.state), &c.reason, &c.message);
                    D::write_evented(tx, sql, args, &event).await
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
        spec_write(self, SpecChange::set(id, spec, time, reason, message)).await
    }

    async fn claim_pooled(
        &self,
        id: &str,
        spec: &SandboxSpec,
        request_id: Option<&str>,
        time: &str,
        message: &str,
    ) -> Result<(), StoreError> {
        spec_write(self, SpecChange::claim(id, spec, request_id, time, message)).await
    }

    async fn set_exit_code(&self, id: &str, code: i32) -> Result<(), StoreError> {
        let sql = sql!("UPDATE sandboxes SET exit_code = ? WHERE id = ?");
        self.execute(sql, args![Some(code), id]).await?;
        Ok(())
    }

    async fn set_usage(&self, id: &str, usage: &Usage) -> Result<(), StoreError> {
        let body = serde_json::to_string(usage).map_err(|e| StoreError::corrupt(id, e))?;
        let sql = sql!("UPDATE sandboxes SET usage = ? WHERE id = ?");
        self.execute(sql, args![&body, id]).await?;
        Ok(())
    }

    async fn get(&self, id: &str) -> Result<Option<SandboxRow>, StoreError> {
        let sql = sql!("SELECT * FROM sandboxes WHERE id = ?");
        let row = self.fetch_optional(sql, args![id]).await?;
        row.map(|r| decode(&r)).transpose()
    }

    async fn by_request_id(&self, request_id: &str) -> Result<Option<SandboxRow>, StoreError> {
        let sql = sql!("SELECT * FROM sandboxes WHERE request_id = ?");
        let row = self.fetch_optional(sql, args![request_id]).await?;
        row.map(|r| decode(&r)).transpose()
    }

    async fn list(&self, states: &[SandboxState]) -> Result<Vec<SandboxRow>, StoreError> {
        let rows = if states.is_empty() {
            let sql = sql!("SELECT * FROM sandboxes ORDER BY created_at, id");
            self.fetch_all(sql, &[]).await?
        } else {
            self.select_in_states(states).await?
        };
        Ok(decode_readable(&rows))
    }

    async fn unended_page(
        &self,
        tenant: Option<&TenantName>,
        after_id: &str,
        limit: i64,
    ) -> Result<Vec<SandboxRow>, StoreError> {
        window::unended(self, tenant, after_id, limit).await
    }

    async fn ended_page(
        &self,
        tenant: Option<&TenantName>,
        after: (&str, &str),
        limit: i64,
    ) -> Result<Vec<SandboxRow>, StoreError> {
        window::ended(self, tenant, after, limit).await
    }

    async fn fail_unreadable(&self, time: &str) -> Result<Vec<String>, StoreError> {
        let sql =
            sql!("SELECT * FROM sandboxes WHERE state NOT IN ('destroyed', 'failed', 'lost', 'preempted')");
        let rows = self.fetch_all(sql, &[]).await?;
        let mut failed = Vec::new();
        for r in &rows {
            let Err(e) = decode(r) else { continue };
            let id = r.text("id")?;
            let why = warren_core::state::reason::CORRUPT_RECORD;
            let mut tx = self.begin().await?;
            // Another server may have retired it since the read above.
            let sql = sql!(
                "UPDATE sandboxes SET state = 'failed', reason = ?, finished_at = ?
                 WHERE id = ? AND state NOT IN ('destroyed', 'failed', 'lost', 'preempted')"
            );
            if D::execute_in(&mut tx, sql, args![why, time, &id]).await? == 0 {
                D::commit(tx).await?;
                continue;
            }
            let message = format!("its record could not be read ({e}); its sandbox was removed");
            let event = event(time, &id, Some(SandboxState::Failed), why, &message);
            D::execute_in(&mut tx, EVENT_INSERT, &event).await?;
            D::commit(tx).await?;
            self.wrote_event();
            failed.push(id);
        }
        Ok(failed)
    }

    async fn last_event_seq(&self) -> Result<i64, StoreError> {
        let sql = sql!("SELECT CAST(COALESCE(MAX(seq), 0) AS BIGINT) AS seq FROM events");
        let row = self.fetch_optional(sql, &[]).await?;
        Ok(row.map(|r| r.int("seq")).transpose()?.unwrap_or(0))
    }

    async fn events(
        &self,
        sandbox_id: Option<&str>,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        // A negative limit is no limit.
        let limit = if limit < 0 { i64::MAX } else { limit };
        let rows = match sandbox_id {
            Some(id) => {
                let sql = sql!(
                    "SELECT * FROM events WHERE sandbox_id = ? AND seq > ? ORDER BY seq LIMIT ?"
                );
                self.fetch_all(sql, args![id, after, limit]).await?
            }
            None => {
                let sql = sql!("SELECT * FROM events WHERE seq > ? ORDER BY seq LIMIT ?");
                self.fetch_all(sql, args![after, limit]).await?
            }
        };
        rows.iter().map(decode_event).collect()
    }

    async fn insert_batch(&self, b: &BatchRow) -> Result<(), StoreError> {
        let sql = sql!(
            "INSERT INTO batches (id, count, spec, labels, created_at, retry_on_oom, retry_on_lost,
                tenant)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        );
        let (spec, labels) = (json(&b.spec), json(&b.labels));
        let args = args![
            &b.id,
            i64::from(b.count),
            &spec,
            &labels,
            &b.created_at,
            b.retry_on_oom,
            b.retry_on_lost,
            b.tenant.as_str(),
        ];
        self.execute(sql, args).await?;
        Ok(())
    }

    async fn delete_batch(&self, id: &str, time: &str) -> Result<(), StoreError> {
        let sql = sql!("UPDATE batches SET deleted_at = COALESCE(deleted_at, ?) WHERE id = ?");
        self.execute(sql, args![time, id]).await?;
        Ok(())
    }

    async fn batches(&self, id: Option<&str>) -> Result<Vec<BatchRow>, StoreError> {
        let rows = match id {
            Some(id) => {
                let sql = sql!("SELECT * FROM batches WHERE id = ?");
                self.fetch_all(sql, args![id]).await?
            }
            None => {
                let sql = sql!("SELECT * FROM batches ORDER BY created_at, id");
                self.fetch_all(sql, &[]).await?
            }
        };
        rows.iter().map(decode_batch).collect()
    }

    async fn profile(&self, name: &str) -> Result<Option<Profile>, StoreError> {
        let sql = sql!("SELECT body FROM profiles WHERE name = ?");
        let row = self.fetch_optional(sql, args![name]).await?;
        row.map(|r| decode_body(name, &r.text("body")?)).transpose()
    }

    async fn profiles(&self) -> Result<Vec<Profile>, StoreError> {
        let sql = sql!("SELECT name, body FROM profiles ORDER BY name");
        let rows = self.fetch_all(sql, &[]).await?;
        rows.iter()
            .map(|r| decode_body(&r.text("name")?, &r.text("body")?))
            .collect()
    }

    async fn put_profile(&self, p: &Profile, time: &str) -> Result<(), StoreError> {
        let sql = sql!(
            "INSERT INTO profiles (name, body, updated_at) VALUES (?, ?, ?)
             ON CONFLICT (name) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at"
        );
        self.execute(sql, args![&p.name, &json(p), time]).await?;
        Ok(())
    }

    async fn add_run(
        &self,
        profile: &str,
        sandbox_id: &str,
        run: &Run,
        time: &str,
    ) -> Result<bool, StoreError> {
        let sql = sql!(
            "INSERT INTO profile_runs (profile, sandbox_id, body, finished_at) VALUES (?, ?, ?, ?)
             ON CONFLICT (sandbox_id) DO NOTHING"
        );
        let added = self
            .execute(sql, args![profile, sandbox_id, &json(run), time])
            .await?;
        Ok(added == 1)
    }

    async fn runs(&self, profile: &str, limit: usize) -> Result<Vec<Run>, StoreError> {
        let sql = sql!("SELECT body FROM profile_runs WHERE profile = ? ORDER BY seq DESC LIMIT ?");
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.fetch_all(sql, args![profile, limit]).await?;
        let mut runs = rows
            .iter()
            .map(|r| decode_body(profile, &r.text("body")?))
            .collect::<Result<Vec<_>, StoreError>>()?;
        runs.reverse();
        Ok(runs)
    }

    async fn delete_runs(&self, profile: &str) -> Result<(), StoreError> {
        let sql = sql!("DELETE FROM profile_runs WHERE profile = ?");
        self.execute(sql, args![profile]).await?;
        Ok(())
    }

    async fn profile_event(
        &self,
        sandbox_id: &str,
        profile: &str,
        message: &str,
        time: &str,
    ) -> Result<(), StoreError> {
        let sql = sql!(
            "INSERT INTO events (time, sandbox_id, type, state, reason, message)
             VALUES (?, ?, 'profile', NULL, 'profile_anomalous', ?)"
        );
        let message = format!("profile {profile}: {message}");
        self.execute(sql, args![time, sandbox_id, &message]).await?;
        self.wrote_event();
        Ok(())
    }

    async fn node_event(&self, reason: &str, message: &str, time: &str) -> Result<(), StoreError> {
        let sql = sql!(
            "INSERT INTO events (time, sandbox_id, type, state, reason, message)
             VALUES (?, '', 'node', NULL, ?, ?)"
        );
        self.execute(sql, args![time, reason, message]).await?;
        self.wrote_event();
        Ok(())
    }

    async fn put_pool(&self, pool: &PoolRow, time: &str) -> Result<bool, StoreError> {
        // The owner is part of the condition: a name another tenant holds
        // is never taken over, whatever the caller checked before.
        let sql = sql!(
            "INSERT INTO pools (name, spec, size, updated_at, tenant) VALUES (?, ?, ?, ?, ?)
             ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, size = excluded.size,
                updated_at = excluded.updated_at
             WHERE pools.tenant = excluded.tenant"
        );
        let body = json(&pool.spec);
        let size = i64::from(pool.spec.size);
        let args = args![&pool.name, &body, size, time, pool.tenant.as_str()];
        Ok(self.execute(sql, args).await? > 0)
    }

    async fn pools(&self) -> Result<Vec<PoolRow>, StoreError> {
        let sql = sql!("SELECT name, spec, tenant FROM pools ORDER BY name");
        let rows = self.fetch_all(sql, &[]).await?;
        rows.iter().map(decode_pool).collect()
    }

    async fn delete_pool(&self, name: &str) -> Result<bool, StoreError> {
        let sql = sql!("DELETE FROM pools WHERE name = ?");
        Ok(self.execute(sql, args![name]).await? > 0)
    }

    async fn insert_secret(&self, s: &SecretRow) -> Result<(), StoreError> {
        let sql = sql!(
            "INSERT INTO secrets (name, id, version, metadata, sealed, created_at, updated_at,
                tenant)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        );
        let args = args![
            &s.name,
            &s.id,
            s.version,
            &s.metadata,
            &s.sealed,
            &s.created_at,
            &s.updated_at,
            s.tenant.as_str(),
        ];
        self.execute(sql, args).await?;
        Ok(())
    }

    async fn update_secret(&self, s: &SecretRow, version: i64) -> Result<bool, StoreError> {
        let sql = sql!(
            "UPDATE secrets SET version = ?, metadata = ?, sealed = ?, updated_at = ?
             WHERE name = ? AND version = ?"
        );
        let args = args![
            s.version,
            &s.metadata,
            &s.sealed,
            &s.updated_at,
            &s.name,
            version
        ];
        Ok(self.execute(sql, args).await? > 0)
    }

    async fn secrets(&self) -> Result<Vec<SecretRow>, StoreError> {
        let sql = sql!("SELECT * FROM secrets ORDER BY name");
        let rows = self.fetch_all(sql, &[]).await?;
        rows.iter().map(decode_secret).collect()
    }

    async fn delete_secret(&self, name: &str) -> Result<bool, StoreError> {
        let sql = sql!("DELETE FROM secrets WHERE name = ?");
        Ok(self.execute(sql, args![name]).await? > 0)
    }

    async fn put_owner(
        &self,
        kind: OwnedName,
        name: &str,
        tenant: &TenantName,
    ) -> Result<(), StoreError> {
        let sql = sql!(
            "INSERT INTO owners (kind, name, tenant) VALUES (?, ?, ?)
             ON CONFLICT (kind, name) DO UPDATE SET tenant = excluded.tenant"
        );
        self.execute(sql, args![kind.as_str(), name, tenant.as_str()])
            .await?;
        Ok(())
    }

    async fn owners(&self, kind: OwnedName) -> Result<Vec<(String, TenantName)>, StoreError> {
        let sql = sql!("SELECT name, tenant FROM owners WHERE kind = ? ORDER BY name");
        let rows = self.fetch_all(sql, args![kind.as_str()]).await?;
        rows.iter()
            .map(|r| Ok((r.text("name")?, tenant_of_column(r, "tenant")?)))
            .collect()
    }

    async fn owner(&self, kind: OwnedName, name: &str) -> Result<Option<TenantName>, StoreError> {
        let sql = sql!("SELECT tenant FROM owners WHERE kind = ? AND name = ?");
        let row = self.fetch_optional(sql, args![kind.as_str(), name]).await?;
        row.map(|r| tenant_of_column(&r, "tenant")).transpose()
    }

    async fn delete_owner(&self, kind: OwnedName, name: &str) -> Result<(), StoreError> {
        let sql = sql!("DELETE FROM owners WHERE kind = ? AND name = ?");
        self.execute(sql, args![kind.as_str(), name]).await?;
        Ok(())
    }

    async fn put_tenant(&self, t: &TenantRow) -> Result<(), StoreError> {
        let sql = sql!(
            "INSERT INTO tenants (name, spec, created_at) VALUES (?, ?, ?)
             ON CONFLICT (name) DO UPDATE SET spec = excluded.spec"
        );
        self.execute(sql, args![t.name.as_str(), &json(&t.spec), &t.created_at])
            .await?;
        Ok(())
    }

    async fn tenants(&self) -> Result<Vec<TenantRow>, StoreError> {
        let sql = sql!("SELECT * FROM tenants ORDER BY name");
        let rows = self.fetch_all(sql, &[]).await?;
        rows.iter().map(decode_tenant).collect()
    }

    async fn delete_tenant(&self, name: &TenantName) -> Result<bool, StoreError> {
        let sql = sql!("DELETE FROM tokens WHERE tenant = ?");
        self.execute(sql, args![name.as_str()]).await?;
        let sql = sql!("DELETE FROM tenants WHERE name = ?");
        Ok(self.execute(sql, args![name.as_str()]).await? > 0)
    }

    async fn insert_token(&self, t: &TokenRow) -> Result<(), StoreError> {
        let sql = sql!(
            "INSERT INTO tokens (id, tenant, role, hash, description, created_at)
             VALUES (?, ?, ?, ?, ?, ?)"
        );
        let i = &t.info;
        let args = args![
            &i.id,
            i.tenant.as_str(),
            i.role.as_str(),
            &t.hash,
            &i.description,
            &i.created_at,
        ];
        self.execute(sql, args).await?;
        Ok(())
    }

    async fn tokens(&self) -> Result<Vec<TokenRow>, StoreError> {
        let sql = sql!("SELECT * FROM tokens ORDER BY tenant, created_at, id");
        let rows = self.fetch_all(sql, &[]).await?;
        rows.iter().map(decode_token).collect()
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRow>, StoreError> {
        let sql = sql!("SELECT * FROM tokens WHERE hash = ?");
        let row = self.fetch_optional(sql, args![hash]).await?;
        row.as_ref().map(decode_token).transpose()
    }

    async fn delete_token(&self, id: &str) -> Result<bool, StoreError> {
        let sql = sql!("DELETE FROM tokens WHERE id = ?");
        Ok(self.execute(sql, args![id]).await? > 0)
    }

    async fn put_node(&self, node: &NodeRecord) -> Result<(), StoreError> {
        let sql = sql!(
            "INSERT INTO nodes (name, url, credential, labels, cordoned, joined_at, tls_fingerprint)
             VALUES (?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (name) DO UPDATE SET url = excluded.url,
                credential = excluded.credential, labels = excluded.labels,
                cordoned = excluded.cordoned, joined_at = excluded.joined_at,
                tls_fingerprint = excluded.tls_fingerprint"
        );
        let labels = json(&node.labels);
        let args = args![
            &node.name,
            &node.url,
            &node.credential,
            &labels,
            node.cordoned,
            &node.joined_at,
            &node.tls_fingerprint,
        ];
        self.execute(sql, args).await?;
        Ok(())
    }

    async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        let sql = sql!("SELECT * FROM nodes ORDER BY name");
        let rows = self.fetch_all(sql, &[]).await?;
        rows.iter().map(decode_node).collect()
    }

    async fn delete_node(&self, name: &str) -> Result<(), StoreError> {
        let sql = sql!("DELETE FROM nodes WHERE name = ?");
        self.execute(sql, args![name]).await?;
        Ok(())
    }

    async fn log_cursor(&self, node: &str) -> Result<Option<LogCursor>, StoreError> {
        central_logs::cursor(self, node).await
    }

    async fn keep_shipped(
        &self,
        node: &str,
        from: Option<&LogCursor>,
        to: &LogCursor,
        entries: &[LogEntry],
    ) -> Result<bool, StoreError> {
        central_logs::keep(self, node, from, to, entries).await
    }

    async fn log_entries(
        &self,
        sandbox_id: &str,
        kind: LogKind,
        after: i64,
        since_ms: i64,
        limit: i64,
    ) -> Result<Vec<LogEntry>, StoreError> {
        central_logs::entries(self, sandbox_id, kind, after, since_ms, limit).await
    }

    async fn expire_log_entries(
        &self,
        before_ms: i64,
        max_bytes: Option<i64>,
    ) -> Result<u64, StoreError> {
        central_logs::expire(self, before_ms, max_bytes).await
    }

    async fn log_bytes(&self) -> Result<i64, StoreError> {
        central_logs::total(self).await
    }

    async fn drop_rotated_lines(
        &self,
        sandbox_id: &str,
        node: &str,
        before_seq: i64,
    ) -> Result<u64, StoreError> {
        central_logs::drop_rotated(self, sandbox_id, node, before_seq).await
    }

    async fn claim_leader(
        &self,
        holder: &str,
        url: &str,
        ttl_ms: i64,
    ) -> Result<Leader, StoreError> {
        let row = self.claim_lease(holder, url, ttl_ms).await?;
        Ok(Leader {
            holder: row.text("holder")?,
            url: row.text("url")?,
            epoch: row.int("epoch")?.try_into().unwrap_or(0),
        })
    }
}

/// Logs and usage kept centrally (here: the macros above are in scope).
mod central_logs;
/// The sandboxes of a window of time, a page at a time.
mod window;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_for_postgres() {
        let q = sql!("SELECT '?', x FROM t WHERE a = ? AND b IN (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
        assert_eq!(
            q.pg,
            "SELECT '?', x FROM t WHERE a = $1 AND b IN ($2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
        );
        assert_eq!(q.sqlite.matches('?').count(), 12);
        assert_eq!(
            EVENT_INSERT.pg,
            "INSERT INTO events (time, sandbox_id, type, state, reason, message) \
             VALUES ($1, $2, 'state', $3, $4, $5)"
        );
        let e = evented!("UPDATE t SET a = ? WHERE id = ?");
        assert_eq!(e.pg, "UPDATE t SET a = $1 WHERE id = $2");
        assert!(e.sqlite_opening.starts_with("BEGIN IMMEDIATE; UPDATE t"));
    }
}
