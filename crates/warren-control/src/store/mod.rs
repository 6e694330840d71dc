//! The control plane's state: sandboxes and their events, behind the
//! [`Store`] trait; [`SqliteStore`] keeps them in SQLite (WAL,
//! `synchronous=FULL`), [`PgStore`] in PostgreSQL (a cluster's servers
//! share it). A state change is committed together with its event before
//! the API acknowledges it. [`open`] picks one by the database's URL. Both
//! run the same SQL, written once in `sql.rs`; their own files hold only
//! what each database does its own way.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use sqlx::Row;
use warren_core::tenant::{TenantError, TenantName, TenantSpec, TokenInfo};
use warren_core::{Event, Labels, ResolvedResources, SandboxSpec, SandboxState};

mod group_commit;
mod postgres;
mod sql;
mod sqlite;

pub use postgres::PgStore;
pub use sqlite::SqliteStore;

/// What [`open`] accepts, for its error.
const DATABASE_FORMS: &str = "postgres://USER[:PASSWORD]@HOST[:PORT]/DB (or postgresql://…), \
     sqlite:PATH, or a plain file path (SQLite)";

/// The store at `database`: `postgres://…` or `postgresql://…` is a
/// [`PgStore`]; `sqlite:PATH`, `sqlite://PATH` or a plain path is a
/// [`SqliteStore`] (the file is made when missing).
pub async fn open(database: &str) -> Result<Arc<dyn Store>, StoreError> {
    match Database::parse(database)? {
        Database::Postgres(url) => Ok(Arc::new(PgStore::connect(url).await?)),
        Database::Sqlite(path) => Ok(Arc::new(SqliteStore::open(path).await?)),
    }
}

/// Which store a database URL names.
#[derive(Debug, PartialEq)]
enum Database<'a> {
    Postgres(&'a str),
    Sqlite(&'a Path),
}

impl<'a> Database<'a> {
    fn parse(database: &'a str) -> Result<Database<'a>, StoreError> {
        let bad = |why: String| StoreError::BadUrl(format!("{why}; use {DATABASE_FORMS}"));
        if database.starts_with("postgres://") || database.starts_with("postgresql://") {
            return Ok(Database::Postgres(database));
        }
        let path = match database.strip_prefix("sqlite:") {
            Some(rest) => rest.strip_prefix("//").unwrap_or(rest),
            None => {
                // Only the scheme is quoted back: a URL may carry a password.
                if let Some((scheme, _)) = database.split_once(':') {
                    let looks_like_scheme = !scheme.is_empty()
                        && scheme
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
                    if looks_like_scheme {
                        return Err(bad(format!("{scheme:?}: is not a database this takes")));
                    }
                }
                database
            }
        };
        if path.is_empty() {
            return Err(bad("no database given".into()));
        }
        Ok(Database::Sqlite(Path::new(path)))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The database URL given to [`open`] or [`PgStore::connect`] is not
    /// one they take.
    #[error("database URL: {0}")]
    BadUrl(String),
    /// PostgreSQL could not be reached at start (where, and why).
    #[error("cannot connect to PostgreSQL at {0}: {1}")]
    Connect(String, #[source] sqlx::Error),
    /// A record that cannot be read back (which, and why).
    #[error("corrupt record {record}: {cause}")]
    Corrupt {
        record: String,
        #[source]
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A write committed together with others (PostgreSQL's group commit)
    /// whose shared commit failed; it may or may not have committed.
    #[error("database commit: {0}")]
    Commit(String),
}

impl StoreError {
    pub(crate) fn corrupt(
        record: impl Into<String>,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> StoreError {
        StoreError::Corrupt {
            record: record.into(),
            cause: cause.into(),
        }
    }

    /// A write that clashed with a unique key (two creates with one
    /// request id).
    pub fn is_duplicate(&self) -> bool {
        matches!(self, StoreError::Db(sqlx::Error::Database(db)) if db.is_unique_violation())
    }
}

/// The kinds of named things the nodes keep whose owners the store keeps
/// (the `owners` table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnedName {
    /// A name without an owner is the default tenant's (made before
    /// volumes had owners).
    Volume,
    /// A name without an owner is shared: the operator's, which every
    /// tenant may run and build on.
    Image,
}

impl OwnedName {
    pub fn as_str(self) -> &'static str {
        match self {
            OwnedName::Volume => "volume",
            OwnedName::Image => "image",
        }
    }
}

#[derive(Debug, Clone)]
pub struct SandboxRow {
    pub id: String,
    pub state: SandboxState,
    pub reason: String,
    pub spec: SandboxSpec,
    pub resources: ResolvedResources,
    pub node: String,
    pub image_digest: String,
    pub created_at: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub exit_code: Option<i32>,
    /// `stopping` in the grace period of the `delay` policy, not destroying.
    pub grace: bool,
    /// Its last usage reading, once it ended (its node forgets it).
    pub usage: Option<warren_core::Usage>,
    /// Who owns it (the default tenant for the operator's).
    pub tenant: TenantName,
}

/// A row of the secrets table: the value only sealed.
#[derive(Clone)]
pub struct SecretRow {
    pub name: String,
    pub id: String,
    pub version: i64,
    /// JSON object.
    pub metadata: String,
    /// base64 of nonce and ciphertext (see `crate::secrets`).
    pub sealed: String,
    pub created_at: String,
    pub updated_at: String,
    pub tenant: TenantName,
}

fn decode_secret<'r, R>(r: &'r R) -> Result<SecretRow, StoreError>
where
    R: StoreRow<'r>,
{
    Ok(SecretRow {
        name: r.text("name")?,
        id: r.text("id")?,
        version: r.int("version")?,
        metadata: r.text("metadata")?,
        sealed: r.text("sealed")?,
        created_at: r.text("created_at")?,
        updated_at: r.text("updated_at")?,
        tenant: tenant_of(r)?,
    })
}

/// A row's owner, from its `tenant` column.
fn tenant_of<'r, R>(r: &'r R) -> Result<TenantName, StoreError>
where
    R: StoreRow<'r>,
{
    tenant_of_column(r, "tenant")
}

/// A row of the pools table: its name, spec and owner.
#[derive(Debug, Clone)]
pub struct PoolRow {
    pub name: String,
    pub spec: warren_core::pool::PoolSpec,
    pub tenant: TenantName,
}

fn decode_pool<'r, R>(r: &'r R) -> Result<PoolRow, StoreError>
where
    R: StoreRow<'r>,
{
    let name = r.text("name")?;
    let spec = serde_json::from_str(&r.text("spec")?)
        .map_err(|e| StoreError::corrupt(format!("pool {name}"), e))?;
    Ok(PoolRow {
        spec,
        tenant: tenant_of(r)?,
        name,
    })
}

impl SandboxRow {
    /// The record of a create admitted (`creating`, on `node`) or waiting
    /// for capacity (`queued`, no node yet).
    pub fn new(
        id: &str,
        spec: SandboxSpec,
        resources: ResolvedResources,
        node: String,
        image_digest: String,
        state: SandboxState,
    ) -> SandboxRow {
        let reason = if state == SandboxState::Queued {
            warren_core::state::reason::QUEUED
        } else {
            warren_core::state::reason::CREATED
        };
        SandboxRow {
            id: id.to_string(),
            state,
            reason: reason.into(),
            spec,
            resources,
            node,
            image_digest,
            created_at: warren_core::clock::now_rfc3339(),
            started_at: None,
            finished_at: None,
            exit_code: None,
            grace: false,
            usage: None,
            tenant: TenantName::default_tenant(),
        }
    }
}

/// Fields a transition may set besides state and reason.
#[derive(Debug, Default, Clone)]
pub struct Transition<'a> {
    pub started_at: Option<&'a str>,
    /// Given with the move to a final state, and only then: the sandboxes
    /// that ended since a time are read by it (`Store::ended_page`).
    pub finished_at: Option<&'a str>,
    pub exit_code: Option<i32>,
    /// Whether a `stopping` sandbox waits out a grace period (false for
    /// every other transition).
    pub grace: bool,
    pub message: &'a str,
    /// The node a queued create was placed on, when its turn came.
    pub node: Option<&'a str>,
    /// Its spec as the node runs it, when placement decided something of it
    /// (a queued create's isolation class, once its node is known).
    pub spec: Option<&'a SandboxSpec>,
    /// Committed without waiting for the disk's flush: only for a record
    /// that a flushed write of the same sandbox always follows (the
    /// `stopping` before a destroy, whose `destroyed`, or retry message, is
    /// flushed). A crash of the process keeps it (SQLite's WAL is in the
    /// kernel's cache, and the next flush of the WAL writes it too); a
    /// crash of the host may lose it, with the host's sandboxes, which end
    /// `lost` at the next start either way. PostgreSQL flushes it anyway:
    /// there an unflushed commit could be lost by a crash of the database
    /// server alone.
    pub unflushed: bool,
}

/// The replica that leads, as the lease says.
#[derive(Debug, Clone, PartialEq)]
pub struct Leader {
    pub holder: String,
    /// Where the other replicas forward requests to.
    pub url: String,
    /// One more each time the lease changes hands; the leader sends it on
    /// every node call, and a node refuses a lower one than it has seen.
    pub epoch: u64,
}

/// A node of a cluster, as the control plane remembers it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRecord {
    pub name: String,
    /// Its node API (`http://host:port`).
    pub url: String,
    /// What the control plane shows the node (issued at join).
    pub credential: String,
    pub labels: warren_core::Labels,
    /// Takes no new sandboxes (an operator's `warren node cordon`).
    pub cordoned: bool,
    pub joined_at: String,
    /// The SHA-256 of its API's certificate, pinned at join (None: plain
    /// HTTP).
    pub tls_fingerprint: Option<String>,
}

/// How far a node's shipping journal has been taken (see
/// [`Store::keep_shipped`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogCursor {
    /// The node's journal (a new one when its home was replaced).
    pub journal: String,
    /// The last entry kept.
    pub seq: i64,
}

/// What a kept entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogKind {
    /// One JSON line of the sandbox's log.
    Log,
    /// A usage sample (JSON).
    Usage,
}

impl LogKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LogKind::Log => "log",
            LogKind::Usage => "usage",
        }
    }
}

/// A log line or usage sample a node shipped, as kept centrally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// Its row (0 before it is kept): entries are read in this order.
    pub id: i64,
    pub sandbox_id: String,
    pub node: String,
    /// Its number in the node's journal (a log line carries it as `seq`).
    pub seq: i64,
    pub kind: LogKind,
    /// When the node wrote it (Unix milliseconds).
    pub time_ms: i64,
    pub body: String,
}

/// Where the control plane keeps its state: SQLite (`warren up`), and
/// PostgreSQL for a cluster. Every write is committed with its event
/// before it returns.
#[async_trait::async_trait]
pub trait Store: Send + Sync {
    /// Changes after every event written.
    fn subscribe_events(&self) -> tokio::sync::watch::Receiver<u64>;
    async fn insert(&self, row: &SandboxRow, request_id: Option<&str>) -> Result<(), StoreError>;
    async fn transition(
        &self,
        id: &str,
        state: SandboxState,
        reason: &str,
        time: &str,
        t: Transition<'_>,
    ) -> Result<(), StoreError>;
    /// Replaces a sandbox's recorded spec (its network policy changed), with
    /// an event saying why, in one transaction.
    async fn set_spec(
        &self,
        id: &str,
        spec: &SandboxSpec,
        time: &str,
        reason: &str,
        message: &str,
    ) -> Result<(), StoreError>;
    /// A pool member taken by a create: its spec becomes the create's, it
    /// takes the create's request id, and an event says so, at once.
    async fn claim_pooled(
        &self,
        id: &str,
        spec: &SandboxSpec,
        request_id: Option<&str>,
        time: &str,
        message: &str,
    ) -> Result<(), StoreError>;
    async fn set_exit_code(&self, id: &str, code: i32) -> Result<(), StoreError>;
    /// Keeps a sandbox's last usage reading (it ended).
    async fn set_usage(&self, id: &str, usage: &warren_core::Usage) -> Result<(), StoreError>;
    async fn get(&self, id: &str) -> Result<Option<SandboxRow>, StoreError>;
    async fn by_request_id(&self, request_id: &str) -> Result<Option<SandboxRow>, StoreError>;
    /// Sandboxes in `states` (all when empty), oldest first. A record that
    /// cannot be read is left out (and logged), so one bad row never fails
    /// a list; `fail_unreadable` retires such rows at start-up.
    async fn list(&self, states: &[SandboxState]) -> Result<Vec<SandboxRow>, StoreError>;
    /// Sandboxes that have not ended, of one tenant (every tenant's with
    /// None), `limit` at a time in id order after `after_id` (from "").
    async fn unended_page(
        &self,
        tenant: Option<&TenantName>,
        after_id: &str,
        limit: i64,
    ) -> Result<Vec<SandboxRow>, StoreError>;
    /// Sandboxes that have ended, of one tenant (every tenant's with None),
    /// `limit` at a time in (finished_at, id) order after `after` (from
    /// `(since, "")`: those that ended at `since` or later).
    async fn ended_page(
        &self,
        tenant: Option<&TenantName>,
        after: (&str, &str),
        limit: i64,
    ) -> Result<Vec<SandboxRow>, StoreError>;
    /// Marks every open record that cannot be read as `failed` (reason
    /// `corrupt_record`); returns their ids. Their sandboxes, unknown to
    /// the node from now on, are swept as orphans.
    async fn fail_unreadable(&self, time: &str) -> Result<Vec<String>, StoreError>;
    async fn events(
        &self,
        sandbox_id: Option<&str>,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError>;
    /// The sequence number of the newest event (0 when there is none), so
    /// a follower can start from now instead of replaying the history.
    async fn last_event_seq(&self) -> Result<i64, StoreError>;
    async fn insert_batch(&self, b: &BatchRow) -> Result<(), StoreError>;
    async fn delete_batch(&self, id: &str, time: &str) -> Result<(), StoreError>;
    async fn batches(&self, id: Option<&str>) -> Result<Vec<BatchRow>, StoreError>;
    async fn profile(
        &self,
        name: &str,
    ) -> Result<Option<warren_core::profile::Profile>, StoreError>;
    async fn profiles(&self) -> Result<Vec<warren_core::profile::Profile>, StoreError>;
    async fn put_profile(
        &self,
        p: &warren_core::profile::Profile,
        time: &str,
    ) -> Result<(), StoreError>;
    /// Records a finished run once per sandbox; false if it was already there.
    async fn add_run(
        &self,
        profile: &str,
        sandbox_id: &str,
        run: &warren_core::profile::Run,
        time: &str,
    ) -> Result<bool, StoreError>;
    /// The newest `limit` runs of a profile, oldest first.
    async fn runs(
        &self,
        profile: &str,
        limit: usize,
    ) -> Result<Vec<warren_core::profile::Run>, StoreError>;
    async fn delete_runs(&self, profile: &str) -> Result<(), StoreError>;
    /// A profile-level event (type `profile`), attached to the sandbox whose
    /// run triggered it.
    async fn profile_event(
        &self,
        sandbox_id: &str,
        profile: &str,
        message: &str,
        time: &str,
    ) -> Result<(), StoreError>;
    /// A node-level event (type `node`); its sandbox id is empty.
    async fn node_event(&self, reason: &str, message: &str, time: &str) -> Result<(), StoreError>;
    /// Adds or replaces a node (a join, a re-join, a cordon).
    /// Makes or replaces a pool; false when the name is another tenant's.
    async fn put_pool(&self, pool: &PoolRow, time: &str) -> Result<bool, StoreError>;
    async fn pools(&self) -> Result<Vec<PoolRow>, StoreError>;
    async fn delete_pool(&self, name: &str) -> Result<bool, StoreError>;
    /// Adds a secret; a name taken already is a duplicate.
    async fn insert_secret(&self, secret: &SecretRow) -> Result<(), StoreError>;
    /// Replaces the secret of that name if it is still at `version`; false
    /// when it is gone or another update came first.
    async fn update_secret(&self, secret: &SecretRow, version: i64) -> Result<bool, StoreError>;
    async fn secrets(&self) -> Result<Vec<SecretRow>, StoreError>;
    async fn delete_secret(&self, name: &str) -> Result<bool, StoreError>;
    /// Records `tenant` as the owner of the `kind` named `name` (replacing
    /// a row one of that name left).
    async fn put_owner(
        &self,
        kind: OwnedName,
        name: &str,
        tenant: &TenantName,
    ) -> Result<(), StoreError>;
    /// Every owner of a `kind`, by name (what a name without one means is
    /// the kind's: see [`OwnedName`]).
    async fn owners(&self, kind: OwnedName) -> Result<Vec<(String, TenantName)>, StoreError>;
    /// The owner of the `kind` named `name`, if it has one.
    async fn owner(&self, kind: OwnedName, name: &str) -> Result<Option<TenantName>, StoreError>;
    async fn delete_owner(&self, kind: OwnedName, name: &str) -> Result<(), StoreError>;
    /// Makes or replaces a tenant's spec (its `created_at` kept).
    async fn put_tenant(&self, t: &TenantRow) -> Result<(), StoreError>;
    async fn tenants(&self) -> Result<Vec<TenantRow>, StoreError>;
    /// Removes a tenant's tokens, then the tenant (a crash between leaves
    /// a tenant nobody can reach but the operator, never a live token).
    async fn delete_tenant(&self, name: &TenantName) -> Result<bool, StoreError>;
    async fn insert_token(&self, t: &TokenRow) -> Result<(), StoreError>;
    async fn tokens(&self) -> Result<Vec<TokenRow>, StoreError>;
    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRow>, StoreError>;
    async fn delete_token(&self, id: &str) -> Result<bool, StoreError>;
    async fn put_node(&self, node: &NodeRecord) -> Result<(), StoreError>;
    async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError>;
    async fn delete_node(&self, name: &str) -> Result<(), StoreError>;
    /// How far `node`'s shipping journal has been taken (None: never).
    async fn log_cursor(&self, node: &str) -> Result<Option<LogCursor>, StoreError>;
    /// Keeps `entries` shipped by `node` and moves its cursor from `from`
    /// to `to`, in one transaction, so that a crash neither loses nor
    /// repeats an entry. False, and nothing kept, when the cursor is not
    /// at `from` (another writer moved it). A usage sample also becomes
    /// its live sandbox's last usage (the one `inspect` shows once the
    /// node is gone).
    async fn keep_shipped(
        &self,
        node: &str,
        from: Option<&LogCursor>,
        to: &LogCursor,
        entries: &[LogEntry],
    ) -> Result<bool, StoreError>;
    /// A sandbox's kept entries of `kind` after row `after`, written at
    /// `since_ms` or later, oldest first, at most `limit`.
    async fn log_entries(
        &self,
        sandbox_id: &str,
        kind: LogKind,
        after: i64,
        since_ms: i64,
        limit: i64,
    ) -> Result<Vec<LogEntry>, StoreError>;
    /// Deletes kept entries oldest first while they were written before
    /// `before_ms` or the total is above `max_bytes`; returns how many.
    async fn expire_log_entries(
        &self,
        before_ms: i64,
        max_bytes: Option<i64>,
    ) -> Result<u64, StoreError>;
    /// The bytes of the kept entries' bodies.
    async fn log_bytes(&self) -> Result<i64, StoreError>;
    /// Drops a sandbox's kept log lines from `node` numbered below
    /// `before_seq` (its node rotated them out: the kept copy is capped as
    /// the node's log is). Answers how many went.
    async fn drop_rotated_lines(
        &self,
        sandbox_id: &str,
        node: &str,
        before_seq: i64,
    ) -> Result<u64, StoreError>;
    /// Takes (or renews) the leader lease for `ttl_ms` when it is free,
    /// expired or already `holder`'s, by the database's clock; returns who
    /// leads after the attempt. Taken from another holder, the lease's
    /// epoch grows by one; renewed, it stays.
    async fn claim_leader(
        &self,
        holder: &str,
        url: &str,
        ttl_ms: i64,
    ) -> Result<Leader, StoreError>;
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// A row of `sandboxes`, `events` or `batches` as either backend returns
/// it: both keep the same columns with the same types, so one decoder
/// serves both and they cannot drift apart.
trait StoreRow<'r> {
    fn text(&'r self, column: &str) -> Result<String, sqlx::Error>;
    fn text_opt(&'r self, column: &str) -> Result<Option<String>, sqlx::Error>;
    fn int(&'r self, column: &str) -> Result<i64, sqlx::Error>;
    fn int32_opt(&'r self, column: &str) -> Result<Option<i32>, sqlx::Error>;
    fn flag(&'r self, column: &str) -> Result<bool, sqlx::Error>;
}

impl<'r, R> StoreRow<'r> for R
where
    R: Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i32>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn text(&'r self, column: &str) -> Result<String, sqlx::Error> {
        self.try_get(column)
    }
    fn text_opt(&'r self, column: &str) -> Result<Option<String>, sqlx::Error> {
        self.try_get(column)
    }
    fn int(&'r self, column: &str) -> Result<i64, sqlx::Error> {
        self.try_get(column)
    }
    fn int32_opt(&'r self, column: &str) -> Result<Option<i32>, sqlx::Error> {
        self.try_get(column)
    }
    fn flag(&'r self, column: &str) -> Result<bool, sqlx::Error> {
        self.try_get(column)
    }
}

fn decode<'r, R>(r: &'r R) -> Result<SandboxRow, StoreError>
where
    R: StoreRow<'r>,
{
    let id = r.text("id")?;
    let corrupt = |what: &str, e: Box<dyn std::error::Error + Send + Sync>| {
        StoreError::corrupt(format!("{id} ({what})"), e)
    };
    let state = r.text("state")?;
    let spec = r.text("spec")?;
    let resources = r.text("resources")?;
    Ok(SandboxRow {
        state: SandboxState::from_str(&state).map_err(|e| corrupt("state", e.into()))?,
        reason: r.text("reason")?,
        spec: serde_json::from_str(&spec).map_err(|e| corrupt("spec", e.into()))?,
        resources: serde_json::from_str(&resources).map_err(|e| corrupt("resources", e.into()))?,
        node: r.text("node")?,
        image_digest: r.text("image_digest")?,
        created_at: r.text("created_at")?,
        started_at: r.text_opt("started_at")?,
        finished_at: r.text_opt("finished_at")?,
        exit_code: r.int32_opt("exit_code")?,
        grace: r.flag("grace")?,
        usage: r
            .text_opt("usage")?
            .map(|u| serde_json::from_str(&u))
            .transpose()
            .map_err(|e| corrupt("usage", e.into()))?,
        tenant: tenant_of(r)?,
        id,
    })
}

/// Sandbox rows in the order given, less those that cannot be read (each
/// logged): one bad row never fails a list.
fn decode_readable<'r, R>(rows: &'r [R]) -> Vec<SandboxRow>
where
    R: StoreRow<'r>,
{
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        match decode(r) {
            Ok(row) => out.push(row),
            Err(e) => tracing::warn!(error = %e, "skipping an unreadable sandbox record"),
        }
    }
    out
}

fn decode_event<'r, R>(r: &'r R) -> Result<Event, StoreError>
where
    R: StoreRow<'r>,
{
    let state = r.text_opt("state")?;
    Ok(Event {
        seq: r.int("seq")?,
        time: r.text("time")?,
        sandbox_id: r.text("sandbox_id")?,
        kind: r.text("type")?,
        state: state.and_then(|s| SandboxState::from_str(&s).ok()),
        reason: r.text("reason")?,
        message: r.text("message")?,
    })
}

fn decode_batch<'r, R>(r: &'r R) -> Result<BatchRow, StoreError>
where
    R: StoreRow<'r>,
{
    let id = r.text("id")?;
    let spec = r.text("spec")?;
    let labels = r.text("labels")?;
    Ok(BatchRow {
        spec: serde_json::from_str(&spec).map_err(|e| StoreError::corrupt(id.clone(), e))?,
        labels: serde_json::from_str(&labels).map_err(|e| StoreError::corrupt(id.clone(), e))?,
        count: r.int("count")? as u32,
        created_at: r.text("created_at")?,
        deleted_at: r.text_opt("deleted_at")?,
        retry_on_oom: r.flag("retry_on_oom")?,
        retry_on_lost: r.flag("retry_on_lost")?,
        tenant: tenant_of(r)?,
        id,
    })
}

fn decode_node<'r, R>(r: &'r R) -> Result<NodeRecord, StoreError>
where
    R: StoreRow<'r>,
{
    let name = r.text("name")?;
    let labels = r.text("labels")?;
    Ok(NodeRecord {
        labels: serde_json::from_str(&labels).map_err(|e| StoreError::corrupt(name.clone(), e))?,
        url: r.text("url")?,
        credential: r.text("credential")?,
        cordoned: r.flag("cordoned")?,
        joined_at: r.text("joined_at")?,
        tls_fingerprint: r.text_opt("tls_fingerprint")?,
        name,
    })
}

/// A profile's stored body, or a run's.
fn decode_body<T: serde::de::DeserializeOwned>(owner: &str, body: &str) -> Result<T, StoreError> {
    serde_json::from_str(body).map_err(|e| StoreError::corrupt(owner.to_string(), e))
}

impl SandboxRow {
    pub fn labels(&self) -> &Labels {
        &self.spec.labels
    }
}

#[derive(Debug, Clone)]
pub struct BatchRow {
    pub id: String,
    pub count: u32,
    pub spec: SandboxSpec,
    pub labels: Labels,
    pub created_at: String,
    pub deleted_at: Option<String>,
    pub retry_on_oom: bool,
    pub retry_on_lost: bool,
    pub tenant: TenantName,
}

/// A row of the tenants table.
#[derive(Debug, Clone)]
pub struct TenantRow {
    pub name: TenantName,
    pub spec: TenantSpec,
    pub created_at: String,
}

fn decode_tenant<'r, R>(r: &'r R) -> Result<TenantRow, StoreError>
where
    R: StoreRow<'r>,
{
    let name = tenant_of_column(r, "name")?;
    let spec = serde_json::from_str(&r.text("spec")?)
        .map_err(|e| StoreError::corrupt(format!("tenant {name}"), e))?;
    Ok(TenantRow {
        name,
        spec,
        created_at: r.text("created_at")?,
    })
}

/// A row of the tokens table: the token's hash, never its value.
#[derive(Debug, Clone)]
pub struct TokenRow {
    pub info: TokenInfo,
    /// Hex SHA-256 of the token.
    pub hash: String,
}

fn decode_token<'r, R>(r: &'r R) -> Result<TokenRow, StoreError>
where
    R: StoreRow<'r>,
{
    let id = r.text("id")?;
    let role = r.text("role")?;
    Ok(TokenRow {
        info: TokenInfo {
            tenant: tenant_of(r)?,
            role: role
                .parse()
                .map_err(|e: TenantError| StoreError::corrupt(id.clone(), e))?,
            description: r.text("description")?,
            created_at: r.text("created_at")?,
            id,
        },
        hash: r.text("hash")?,
    })
}

fn tenant_of_column<'r, R>(r: &'r R, column: &str) -> Result<TenantName, StoreError>
where
    R: StoreRow<'r>,
{
    let t = r.text(column)?;
    t.parse()
        .map_err(|e: TenantError| StoreError::corrupt(format!("tenant {t}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls() {
        let pg = "postgres://warren:secret@db.example:5432/warren?sslmode=disable";
        assert_eq!(Database::parse(pg).unwrap(), Database::Postgres(pg));
        let pg = "postgresql://%2Ftmp%2Fpg/warren";
        assert_eq!(Database::parse(pg).unwrap(), Database::Postgres(pg));
        for (given, path) in [
            (
                "sqlite:/var/lib/warren/warren.db",
                "/var/lib/warren/warren.db",
            ),
            (
                "sqlite:///var/lib/warren/warren.db",
                "/var/lib/warren/warren.db",
            ),
            ("sqlite:warren.db", "warren.db"),
            ("/var/lib/warren/warren.db", "/var/lib/warren/warren.db"),
            ("warren.db", "warren.db"),
            ("./odd:name.db", "./odd:name.db"),
        ] {
            assert_eq!(
                Database::parse(given).unwrap(),
                Database::Sqlite(Path::new(path)),
                "{given}"
            );
        }
        for bad in [
            "mysql://root:hunter2@db/warren",
            "postgres:warren",
            "http://db",
            "",
            "sqlite:",
        ] {
            let e = Database::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("postgres://") && e.contains("sqlite:PATH"),
                "{bad}: {e}"
            );
            assert!(
                !e.contains("hunter2"),
                "{bad}: the password is quoted back: {e}"
            );
        }
    }
}
