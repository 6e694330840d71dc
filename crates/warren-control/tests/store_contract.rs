//! The `Store` contract, one table of cases run against both stores: SQLite
//! always, PostgreSQL when `WARREN_TEST_DATABASE_URL` names a server these
//! tests may create databases on (each case gets a database of its own,
//! dropped afterwards). `scripts/test.sh` starts a throw-away server
//! (`scripts/pg-temp.sh`) and sets it; by hand:
//!
//! ```sh
//! url=$(scripts/pg-temp.sh start /tmp/warren-pg)   # as root or any user
//! WARREN_TEST_DATABASE_URL=$url cargo test -p warren-control --test store_contract
//! scripts/pg-temp.sh stop /tmp/warren-pg
//! ```
//!
//! With the variable set, a server that cannot be reached fails the tests:
//! it never quietly skips them.

// Tests may unwrap (clippy.toml covers only #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use sqlx::{AssertSqlSafe, Connection, PgConnection, SqliteConnection};
use tokio::sync::watch;
use warren_control::store::{
    self, BatchRow, LogCursor, LogEntry, LogKind, PgStore, PoolRow, SandboxRow, SqliteStore, Store,
    TenantRow, TokenRow, Transition,
};
use warren_core::profile::{Profile, Request, Run};
use warren_core::{ResolvedResources, SandboxSpec, SandboxState};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const PG_URL_VAR: &str = "WARREN_TEST_DATABASE_URL";

/// A store under test, and a way around it to its tables.
struct Fixture {
    store: Arc<dyn Store>,
    raw: Raw,
}

enum Raw {
    Sqlite(PathBuf),
    Pg(String),
}

impl Raw {
    /// Runs SQL on a connection of its own, beside the store's.
    async fn exec(&self, sql: &str) -> TestResult {
        let sql = AssertSqlSafe(sql.to_string());
        match self {
            Raw::Sqlite(path) => {
                let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
                let mut c = SqliteConnection::connect_with(&opts).await?;
                sqlx::raw_sql(sql).execute(&mut c).await?;
                c.close().await?;
            }
            Raw::Pg(url) => {
                let mut c = PgConnection::connect(url).await?;
                sqlx::raw_sql(sql).execute(&mut c).await?;
                c.close().await?;
            }
        }
        Ok(())
    }
}

type Case = for<'a> fn(&'a Fixture) -> LocalBoxFuture<'a, TestResult>;

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        const CASES: &[(&str, Case)] = &[$((stringify!($name), |f| Box::pin($name(f)))),*];
    };
}

cases![
    insert_get_and_event,
    transitions_and_event_order,
    events_filters_and_limits,
    duplicate_request_id,
    concurrent_writes_answer_each,
    list_filters_and_order,
    window_pages,
    unreadable_rows,
    set_spec_and_exit_code,
    batches,
    profiles_and_runs,
    profile_and_node_events,
    nodes,
    leader_lease,
    pools_and_claims,
    tenants_and_tokens,
    owners,
    central_logs,
];

#[tokio::test]
async fn sqlite_store_contract() -> TestResult {
    for (name, case) in CASES {
        eprintln!("-- sqlite: {name}");
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("warren.db");
        let f = Fixture {
            store: Arc::new(SqliteStore::open(&path).await?),
            raw: Raw::Sqlite(path),
        };
        case(&f).await.map_err(|e| format!("sqlite: {name}: {e}"))?;
    }
    Ok(())
}

#[tokio::test]
async fn postgres_store_contract() -> TestResult {
    let Some(server) = pg_server() else {
        return Ok(());
    };
    for (name, case) in CASES {
        eprintln!("-- postgres: {name}");
        let db = PgDb::create(&server).await?;
        let f = Fixture {
            store: Arc::new(PgStore::connect(&db.url).await?),
            raw: Raw::Pg(db.url.clone()),
        };
        case(&f)
            .await
            .map_err(|e| format!("postgres: {name}: {e}"))?;
        drop(f);
        db.drop().await?;
    }
    Ok(())
}

// ---- the cases ----

fn spec(image: &str) -> SandboxSpec {
    serde_json::from_value(serde_json::json!({
        "image": image, "cpu": 1, "memory": "1G", "labels": {"task": "t"}
    }))
    .unwrap()
}

fn row(id: &str, state: SandboxState, created_at: &str) -> SandboxRow {
    SandboxRow {
        id: id.into(),
        state,
        reason: "requested".into(),
        spec: spec("busybox:latest"),
        resources: ResolvedResources {
            cpu_millis: 1000,
            memory: 1 << 30,
            pids: 128,
            disk: 0,
            gpus: 0,
            cpu_request_millis: Some(100),
            memory_request: Some(64 << 20),
        },
        node: "node-1".into(),
        image_digest: "sha256:abc".into(),
        created_at: created_at.into(),
        started_at: None,
        finished_at: None,
        exit_code: None,
        grace: false,
        usage: None,
        tenant: Default::default(),
    }
}

/// Waits for the next wake of `rx` (marking it seen).
async fn woken(rx: &mut watch::Receiver<u64>, what: &str) -> TestResult {
    tokio::time::timeout(Duration::from_secs(5), rx.changed())
        .await
        .map_err(|_| format!("followers not woken within 5 s after {what}"))??;
    rx.borrow_and_update();
    Ok(())
}

async fn insert_get_and_event(f: &Fixture) -> TestResult {
    let s = &f.store;
    let mut rx = s.subscribe_events();
    rx.borrow_and_update();
    let r = row("sbx-1", SandboxState::Creating, "2024-05-01T00:00:00.000Z");
    s.insert(&r, Some("req-1")).await?;
    woken(&mut rx, "insert").await?;

    let got = s.get("sbx-1").await?.expect("inserted row");
    assert_eq!(got.state, SandboxState::Creating);
    assert_eq!(got.reason, "requested");
    assert_eq!(got.spec, r.spec);
    assert_eq!(got.resources, r.resources);
    assert_eq!(got.node, "node-1");
    assert_eq!(got.image_digest, "sha256:abc");
    assert_eq!(got.created_at, r.created_at);
    assert_eq!(
        (&got.started_at, &got.finished_at, got.exit_code),
        (&None, &None, None)
    );
    assert!(!got.grace);
    assert_eq!(got.labels().get("task").map(String::as_str), Some("t"));
    assert!(s.get("sbx-nope").await?.is_none());

    let evs = s.events(None, 0, 100).await?;
    assert_eq!(evs.len(), 1, "{evs:?}");
    let e = &evs[0];
    assert_eq!(
        (
            e.sandbox_id.as_str(),
            e.kind.as_str(),
            e.state,
            e.reason.as_str()
        ),
        ("sbx-1", "state", Some(SandboxState::Creating), "requested")
    );
    assert_eq!(e.time, r.created_at);
    assert_eq!(e.message, "");
    Ok(())
}

async fn transitions_and_event_order(f: &Fixture) -> TestResult {
    let s = &f.store;
    s.insert(&row("sbx-1", SandboxState::Creating, "t0"), None)
        .await?;
    let mut rx = s.subscribe_events();
    rx.borrow_and_update();
    s.transition(
        "sbx-1",
        SandboxState::Running,
        "started",
        "t1",
        Transition {
            started_at: Some("t1"),
            message: "up",
            ..Default::default()
        },
    )
    .await?;
    woken(&mut rx, "transition").await?;
    s.transition(
        "sbx-1",
        SandboxState::Stopping,
        "exited",
        "t2",
        Transition {
            exit_code: Some(3),
            grace: true,
            // Committed and read back like any other; only its flush waits
            // for the next write's.
            unflushed: true,
            ..Default::default()
        },
    )
    .await?;
    let got = s.get("sbx-1").await?.unwrap();
    assert_eq!(got.state, SandboxState::Stopping);
    assert_eq!(got.reason, "exited");
    // Fields a transition leaves out keep their values.
    assert_eq!(got.started_at.as_deref(), Some("t1"));
    assert_eq!(got.exit_code, Some(3));
    assert!(got.grace);
    s.transition(
        "sbx-1",
        SandboxState::Destroyed,
        "destroyed",
        "t3",
        Transition {
            finished_at: Some("t3"),
            ..Default::default()
        },
    )
    .await?;
    let got = s.get("sbx-1").await?.unwrap();
    assert_eq!(got.finished_at.as_deref(), Some("t3"));
    assert_eq!(got.exit_code, Some(3));
    assert!(!got.grace, "grace is set by every transition");

    let evs = s.events(Some("sbx-1"), 0, 100).await?;
    let states: Vec<_> = evs.iter().map(|e| e.state).collect();
    assert_eq!(
        states,
        [
            Some(SandboxState::Creating),
            Some(SandboxState::Running),
            Some(SandboxState::Stopping),
            Some(SandboxState::Destroyed)
        ]
    );
    assert!(evs.windows(2).all(|w| w[0].seq < w[1].seq), "{evs:?}");
    assert_eq!(evs[1].message, "up");
    assert_eq!(evs[1].time, "t1");

    // A queued create's turn: its node, and the spec placement completed
    // (its isolation class), in the same write; a spec left out is kept.
    let queued = SandboxRow {
        node: String::new(),
        ..row("sbx-2", SandboxState::Queued, "t4")
    };
    s.insert(&queued, None).await?;
    let mut placed = queued.spec.clone();
    placed.isolation = Some(warren_core::Isolation::Gvisor);
    s.transition(
        "sbx-2",
        SandboxState::Creating,
        "admitted",
        "t5",
        Transition {
            node: Some("n2"),
            spec: Some(&placed),
            ..Default::default()
        },
    )
    .await?;
    let got = s.get("sbx-2").await?.unwrap();
    assert_eq!((got.node.as_str(), &got.spec), ("n2", &placed));
    s.transition(
        "sbx-2",
        SandboxState::Running,
        "ready",
        "t6",
        Transition::default(),
    )
    .await?;
    assert_eq!(s.get("sbx-2").await?.unwrap().spec, placed);
    Ok(())
}

async fn events_filters_and_limits(f: &Fixture) -> TestResult {
    let s = &f.store;
    for i in 0..5 {
        s.insert(&row(&format!("a-{i}"), SandboxState::Creating, "t"), None)
            .await?;
        s.insert(&row(&format!("b-{i}"), SandboxState::Creating, "t"), None)
            .await?;
    }
    let all = s.events(None, 0, 1000).await?;
    assert_eq!(all.len(), 10);
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
    let ids: Vec<_> = all.iter().map(|e| e.sandbox_id.as_str()).collect();
    assert_eq!(ids[..4], ["a-0", "b-0", "a-1", "b-1"]);

    let after = all[3].seq;
    let page = s.events(None, after, 3).await?;
    assert_eq!(page, all[4..7]);
    let of_a = s.events(Some("a-3"), 0, 10).await?;
    assert_eq!(of_a.len(), 1);
    assert_eq!(of_a[0], all[6]);
    assert!(s.events(Some("a-3"), of_a[0].seq, 10).await?.is_empty());
    assert!(s.events(None, all[9].seq, 10).await?.is_empty());
    // A negative limit is no limit.
    assert_eq!(s.events(None, 0, -1).await?.len(), 10);
    assert_eq!(s.last_event_seq().await?, all[9].seq);
    Ok(())
}

/// Writes sent at once (PostgreSQL commits them together): each gets its
/// own answer, a clash fails only its own write, and every write that
/// succeeded has its row and its one event.
async fn concurrent_writes_answer_each(f: &Fixture) -> TestResult {
    let s = &f.store;
    s.insert(
        &row("sbx-taken", SandboxState::Creating, "t0"),
        Some("req-taken"),
    )
    .await?;
    let rows: Vec<(SandboxRow, String)> = (0..40)
        .map(|i| {
            let request = if i == 17 {
                "req-taken".to_string()
            } else {
                format!("req-{i}")
            };
            (
                row(&format!("sbx-{i:02}"), SandboxState::Creating, "t1"),
                request,
            )
        })
        .collect();
    let results = futures_util::future::join_all(
        rows.iter()
            .map(|(r, request)| s.insert(r, Some(request.as_str()))),
    )
    .await;
    for (i, result) in results.iter().enumerate() {
        match (i, result) {
            (17, Err(e)) => assert!(e.is_duplicate(), "{e}"),
            (17, Ok(())) => panic!("a second create with one request id succeeded"),
            (_, Err(e)) => panic!("write {i} failed beside a clash: {e}"),
            (_, Ok(())) => {}
        }
    }
    assert!(s.get("sbx-17").await?.is_none());
    // Every state change of the survivors at once, too.
    let ids: Vec<String> = (0..40)
        .filter(|i| *i != 17)
        .map(|i| format!("sbx-{i:02}"))
        .collect();
    let moved = futures_util::future::join_all(ids.iter().map(|id| {
        s.transition(
            id,
            SandboxState::Running,
            "ready",
            "t2",
            Transition {
                started_at: Some("t2"),
                finished_at: None,
                exit_code: None,
                grace: false,
                message: "",
                node: None,
                spec: None,
                unflushed: false,
            },
        )
    }))
    .await;
    assert!(moved.iter().all(Result::is_ok), "{moved:?}");
    for id in &ids {
        assert_eq!(
            s.get(id).await?.unwrap().state,
            SandboxState::Running,
            "{id}"
        );
    }
    let events = s.events(None, 0, -1).await?;
    assert_eq!(events.len(), 1 + 39 + 39);
    assert!(events.windows(2).all(|w| w[0].seq < w[1].seq));
    Ok(())
}

async fn duplicate_request_id(f: &Fixture) -> TestResult {
    let s = &f.store;
    s.insert(&row("sbx-1", SandboxState::Creating, "t0"), Some("req-1"))
        .await?;
    let e = s
        .insert(&row("sbx-2", SandboxState::Creating, "t1"), Some("req-1"))
        .await
        .expect_err("a second create with one request id");
    assert!(e.is_duplicate(), "{e}");
    // One id twice is a clash as well.
    let e = s
        .insert(&row("sbx-1", SandboxState::Creating, "t1"), Some("req-2"))
        .await
        .expect_err("one id twice");
    assert!(e.is_duplicate(), "{e}");
    // Neither failed insert left its event behind.
    assert_eq!(s.events(None, 0, 100).await?.len(), 1);
    assert!(s.get("sbx-2").await?.is_none());

    assert_eq!(s.by_request_id("req-1").await?.unwrap().id, "sbx-1");
    assert!(s.by_request_id("req-2").await?.is_none());
    // Rows without a request id do not clash with one another.
    s.insert(&row("sbx-3", SandboxState::Creating, "t2"), None)
        .await?;
    s.insert(&row("sbx-4", SandboxState::Creating, "t2"), None)
        .await?;
    // Failed writes leave the store working (their connections closed).
    s.transition(
        "sbx-1",
        SandboxState::Running,
        "started",
        "t3",
        Transition::default(),
    )
    .await?;
    assert_eq!(s.list(&[]).await?.len(), 3);
    Ok(())
}

async fn list_filters_and_order(f: &Fixture) -> TestResult {
    let s = &f.store;
    // Created out of order; two at the same time, told apart by id, which
    // sorts by bytes ("B" before "a"), not by a locale's rules.
    s.insert(
        &row("sbx-z", SandboxState::Running, "2024-05-01T00:00:03Z"),
        None,
    )
    .await?;
    s.insert(
        &row("sbx-a", SandboxState::Creating, "2024-05-01T00:00:01Z"),
        None,
    )
    .await?;
    s.insert(
        &row("sbx-B", SandboxState::Queued, "2024-05-01T00:00:01Z"),
        None,
    )
    .await?;
    s.insert(
        &row("sbx-m", SandboxState::Destroyed, "2024-05-01T00:00:02Z"),
        None,
    )
    .await?;
    let ids = |rows: Vec<SandboxRow>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(
        ids(s.list(&[]).await?),
        ["sbx-B", "sbx-a", "sbx-m", "sbx-z"]
    );
    assert_eq!(ids(s.list(&[SandboxState::Running]).await?), ["sbx-z"]);
    assert_eq!(
        ids(s
            .list(&[
                SandboxState::Running,
                SandboxState::Queued,
                SandboxState::Creating
            ])
            .await?),
        ["sbx-B", "sbx-a", "sbx-z"]
    );
    assert!(s.list(&[SandboxState::Lost]).await?.is_empty());
    Ok(())
}

/// The sandboxes of a window, a page at a time: those not ended by id,
/// those that ended since a time by (end, id), each of one tenant or all.
async fn window_pages(f: &Fixture) -> TestResult {
    let s = &f.store;
    let other: warren_core::tenant::TenantName = "other".parse()?;
    let put = |id: &'static str, state, tenant: bool| {
        let mut r = row(id, state, "2024-05-01T00:00:00Z");
        if tenant {
            r.tenant = other.clone();
        }
        r
    };
    let live = [
        put("sbx-r", SandboxState::Running, false),
        put("sbx-B", SandboxState::Queued, false),
        put("sbx-k", SandboxState::Kept, true),
    ];
    for r in &live {
        s.insert(r, None).await?;
    }
    // Ended: before the window, then two in one second (told apart by id),
    // then another tenant's.
    let ends = [
        (
            "sbx-0",
            SandboxState::Destroyed,
            "2024-05-01T00:00:00Z",
            false,
        ),
        ("sbx-1", SandboxState::Failed, "2024-05-01T00:00:01Z", false),
        ("sbx-3", SandboxState::Lost, "2024-05-01T00:00:02Z", false),
        (
            "sbx-2",
            SandboxState::Destroyed,
            "2024-05-01T00:00:02Z",
            false,
        ),
        (
            "sbx-4",
            SandboxState::Preempted,
            "2024-05-01T00:00:03Z",
            true,
        ),
    ];
    for (id, state, at, tenant) in ends {
        s.insert(&put(id, SandboxState::Running, tenant), None)
            .await?;
        let t = Transition {
            finished_at: Some(at),
            ..Default::default()
        };
        s.transition(id, state, "ended", at, t).await?;
    }
    let ids = |rows: &[SandboxRow]| rows.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
    let since = "2024-05-01T00:00:01Z";
    let first = s.ended_page(None, (since, ""), 2).await?;
    assert_eq!(ids(&first), ["sbx-1", "sbx-2"]);
    let last = &first[1];
    let at = last.finished_at.as_deref().unwrap_or_default();
    let second = s.ended_page(None, (at, &last.id), 2).await?;
    assert_eq!(ids(&second), ["sbx-3", "sbx-4"]);
    let at = second[1].finished_at.as_deref().unwrap_or_default();
    assert!(s.ended_page(None, (at, "sbx-4"), 2).await?.is_empty());
    let default = warren_core::tenant::TenantName::default();
    assert_eq!(
        ids(&s.ended_page(Some(&default), (since, ""), 10).await?),
        ["sbx-1", "sbx-2", "sbx-3"]
    );
    assert_eq!(ids(&s.unended_page(None, "", 2).await?), ["sbx-B", "sbx-k"]);
    assert_eq!(ids(&s.unended_page(None, "sbx-k", 2).await?), ["sbx-r"]);
    assert_eq!(ids(&s.unended_page(Some(&other), "", 10).await?), ["sbx-k"]);
    Ok(())
}

async fn unreadable_rows(f: &Fixture) -> TestResult {
    let s = &f.store;
    s.insert(&row("sbx-ok", SandboxState::Running, "t0"), None)
        .await?;
    s.insert(&row("sbx-bad-spec", SandboxState::Running, "t1"), None)
        .await?;
    s.insert(&row("sbx-bad-state", SandboxState::Creating, "t2"), None)
        .await?;
    s.insert(&row("sbx-bad-done", SandboxState::Destroyed, "t3"), None)
        .await?;
    f.raw
        .exec(
            "UPDATE sandboxes SET spec = '{\"image\": 7}' WHERE id = 'sbx-bad-spec';
             UPDATE sandboxes SET state = 'bogus' WHERE id = 'sbx-bad-state';
             UPDATE sandboxes SET resources = 'not json' WHERE id = 'sbx-bad-done';",
        )
        .await?;
    // One bad row never fails a list, nor a filtered one.
    let ids: Vec<_> = s.list(&[]).await?.into_iter().map(|r| r.id).collect();
    assert_eq!(ids, ["sbx-ok"]);
    assert_eq!(s.list(&[SandboxState::Running]).await?.len(), 1);
    let e = s.get("sbx-bad-spec").await.expect_err("a corrupt record");
    assert!(e.to_string().contains("sbx-bad-spec"), "{e}");
    assert!(!e.is_duplicate());

    let mut rx = s.subscribe_events();
    rx.borrow_and_update();
    let mut failed = s.fail_unreadable("t9").await?;
    failed.sort();
    // Open records only: a destroyed one is left as it is.
    assert_eq!(failed, ["sbx-bad-spec", "sbx-bad-state"]);
    woken(&mut rx, "fail_unreadable").await?;
    for id in &failed {
        let evs = s.events(Some(id), 0, 10).await?;
        let last = evs.last().unwrap();
        assert_eq!(last.state, Some(SandboxState::Failed));
        assert_eq!(last.reason, warren_core::state::reason::CORRUPT_RECORD);
        assert_eq!(last.time, "t9");
        assert!(
            last.message.contains("could not be read"),
            "{}",
            last.message
        );
    }
    // Failed now: a second pass has nothing to do.
    assert!(s.fail_unreadable("t10").await?.is_empty());
    // The spec is still unreadable; the state was the trouble of the other.
    f.raw
        .exec("UPDATE sandboxes SET spec = (SELECT spec FROM sandboxes WHERE id = 'sbx-ok') WHERE id = 'sbx-bad-spec'")
        .await?;
    let fixed = s.get("sbx-bad-spec").await?.unwrap();
    assert_eq!(fixed.state, SandboxState::Failed);
    assert_eq!(fixed.finished_at.as_deref(), Some("t9"));
    Ok(())
}

async fn pools_and_claims(f: &Fixture) -> TestResult {
    use warren_core::pool::PoolSpec;
    let s = &f.store;
    let pool = |size| PoolSpec {
        image: "bb:1".into(),
        cpu: None,
        memory: Some(warren_core::spec::ByteSize(64 << 20)),
        cpu_request: None,
        memory_request: None,
        pids: None,
        cmd: None,
        isolation: Some(warren_core::Isolation::Gvisor),
        size,
    };
    let of = |name: &str, size, tenant: &str| PoolRow {
        name: name.into(),
        spec: pool(size),
        tenant: tenant.parse().unwrap(),
    };
    assert!(s.put_pool(&of("b", 2, "default"), "t0").await?);
    assert!(s.put_pool(&of("a", 1, "team-a"), "t0").await?);
    assert!(s.put_pool(&of("b", 5, "default"), "t1").await?);
    // A name another tenant holds is not taken over.
    assert!(!s.put_pool(&of("a", 9, "team-b"), "t2").await?);
    let got: Vec<_> = s
        .pools()
        .await?
        .into_iter()
        .map(|p| (p.name, p.spec, p.tenant.to_string()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("a".to_string(), pool(1), "team-a".to_string()),
            ("b".to_string(), pool(5), "default".to_string())
        ]
    );
    assert!(s.delete_pool("a").await?);
    assert!(!s.delete_pool("a").await?, "a second delete finds nothing");
    assert_eq!(s.pools().await?.len(), 1);

    // A claim gives the member the create's spec and request id, with an
    // event, in one write.
    s.insert(&row("sbx-p", SandboxState::Running, "t0"), None)
        .await?;
    let mut rx = s.subscribe_events();
    rx.borrow_and_update();
    let mine = spec("bb:1");
    s.claim_pooled(
        "sbx-p",
        &mine,
        Some("req-7"),
        "t2",
        "taken from warm pool b",
    )
    .await?;
    woken(&mut rx, "claim_pooled").await?;
    assert_eq!(s.get("sbx-p").await?.unwrap().spec, mine);
    assert_eq!(s.by_request_id("req-7").await?.unwrap().id, "sbx-p");
    let last = s.events(Some("sbx-p"), 0, 10).await?.pop().unwrap();
    assert_eq!(
        (last.reason.as_str(), last.message.as_str()),
        ("claimed", "taken from warm pool b")
    );
    Ok(())
}

async fn set_spec_and_exit_code(f: &Fixture) -> TestResult {
    let s = &f.store;
    s.insert(&row("sbx-1", SandboxState::Running, "t0"), None)
        .await?;
    let mut rx = s.subscribe_events();
    rx.borrow_and_update();
    let new = spec("alpine:3");
    s.set_spec(
        "sbx-1",
        &new,
        "t1",
        "network_changed",
        "egress: pypi.org:443",
    )
    .await?;
    woken(&mut rx, "set_spec").await?;
    assert_eq!(s.get("sbx-1").await?.unwrap().spec, new);
    let evs = s.events(Some("sbx-1"), 0, 10).await?;
    let last = evs.last().unwrap();
    assert_eq!(
        (
            last.kind.as_str(),
            last.state,
            last.reason.as_str(),
            last.message.as_str()
        ),
        ("state", None, "network_changed", "egress: pypi.org:443")
    );

    s.set_exit_code("sbx-1", -9).await?;
    assert_eq!(s.get("sbx-1").await?.unwrap().exit_code, Some(-9));
    assert_eq!(s.events(Some("sbx-1"), 0, 10).await?.len(), 2, "no event");
    Ok(())
}

async fn tenants_and_tokens(f: &Fixture) -> TestResult {
    use warren_core::tenant::{Role, TenantSpec, TokenInfo};
    let s = &f.store;
    let spec: TenantSpec = serde_json::from_str(r#"{"quota":{"cpu":"4"},"weight":2}"#)?;
    let team = |name: &str, spec: &TenantSpec| TenantRow {
        name: name.parse().unwrap(),
        spec: spec.clone(),
        created_at: "t0".into(),
    };
    s.put_tenant(&team("team-b", &TenantSpec::default()))
        .await?;
    s.put_tenant(&team("team-a", &TenantSpec::default()))
        .await?;
    // A change replaces the spec and keeps when it was made.
    s.put_tenant(&TenantRow {
        created_at: "t9".into(),
        ..team("team-a", &spec)
    })
    .await?;
    let got: Vec<_> = s
        .tenants()
        .await?
        .into_iter()
        .map(|t| (t.name.to_string(), t.spec, t.created_at))
        .collect();
    assert_eq!(
        got,
        vec![
            ("team-a".into(), spec, "t0".into()),
            ("team-b".into(), TenantSpec::default(), "t0".into())
        ]
    );
    let token = |id: &str, tenant: &str, hash: &str| TokenRow {
        info: TokenInfo {
            id: id.into(),
            tenant: tenant.parse().unwrap(),
            role: Role::Viewer,
            description: "d".into(),
            created_at: "t1".into(),
        },
        hash: hash.into(),
    };
    s.insert_token(&token("tok-1", "team-a", "h1")).await?;
    s.insert_token(&token("tok-2", "team-b", "h2")).await?;
    let e = s.insert_token(&token("tok-3", "team-b", "h2")).await;
    assert!(e.is_err_and(|e| e.is_duplicate()), "one hash, one token");
    let found = s.token_by_hash("h1").await?.expect("tok-1");
    assert_eq!(
        (found.info.id.as_str(), found.info.role),
        ("tok-1", Role::Viewer)
    );
    assert!(s.token_by_hash("h9").await?.is_none());
    assert_eq!(s.tokens().await?.len(), 2);
    assert!(s.delete_token("tok-2").await?);
    assert!(!s.delete_token("tok-2").await?);
    // A tenant goes with its tokens.
    assert!(s.delete_tenant(&"team-a".parse()?).await?);
    assert!(s.token_by_hash("h1").await?.is_none());
    assert_eq!(s.tenants().await?.len(), 1);
    Ok(())
}

async fn owners(f: &Fixture) -> TestResult {
    use warren_control::store::OwnedName::{Image, Volume};
    let s = &f.store;
    s.put_owner(Volume, "data", &"team-a".parse()?).await?;
    s.put_owner(Volume, "cache", &"team-b".parse()?).await?;
    // A name a removed volume left is taken over by the next one's owner.
    s.put_owner(Volume, "data", &"team-b".parse()?).await?;
    s.delete_owner(Volume, "cache").await?;
    s.delete_owner(Volume, "never-made").await?;
    // Kinds are apart: an image may have a volume's name.
    s.put_owner(Image, "data", &"team-a".parse()?).await?;
    let got = |kind| async move {
        let owners = s.owners(kind).await?;
        let owners: Vec<_> = owners
            .into_iter()
            .map(|(n, t)| (n, t.to_string()))
            .collect();
        Ok::<_, warren_control::store::StoreError>(owners)
    };
    assert_eq!(
        got(Volume).await?,
        vec![("data".to_string(), "team-b".to_string())]
    );
    assert_eq!(
        got(Image).await?,
        vec![("data".to_string(), "team-a".to_string())]
    );
    assert_eq!(
        s.owner(Volume, "data").await?.map(|t| t.to_string()),
        Some("team-b".to_string())
    );
    assert_eq!(s.owner(Volume, "cache").await?, None);
    s.delete_owner(Image, "data").await?;
    assert_eq!(got(Image).await?, vec![]);
    assert_eq!(s.owner(Image, "data").await?, None);
    assert_eq!(got(Volume).await?.len(), 1);
    Ok(())
}

async fn batches(f: &Fixture) -> TestResult {
    let s = &f.store;
    let batch = |id: &str, created_at: &str, count: u32, retry: bool| BatchRow {
        id: id.into(),
        count,
        spec: spec("busybox:latest"),
        labels: serde_json::from_value(serde_json::json!({"task": id})).unwrap(),
        created_at: created_at.into(),
        deleted_at: None,
        retry_on_oom: retry,
        retry_on_lost: !retry,
        tenant: Default::default(),
    };
    // A count past i32's range comes back whole.
    s.insert_batch(&batch("b-2", "t2", 4_000_000_000, true))
        .await?;
    s.insert_batch(&batch("b-1", "t1", 50, false)).await?;
    let e = s
        .insert_batch(&batch("b-1", "t3", 1, false))
        .await
        .expect_err("one batch id twice");
    assert!(e.is_duplicate(), "{e}");

    let all = s.batches(None).await?;
    let ids: Vec<_> = all.iter().map(|b| b.id.as_str()).collect();
    assert_eq!(ids, ["b-1", "b-2"]);
    assert_eq!(
        (all[0].count, all[0].retry_on_oom),
        (50, false),
        "{:?}",
        all[0]
    );
    assert_eq!((all[1].count, all[1].retry_on_oom), (4_000_000_000, true));
    assert_eq!((all[0].retry_on_lost, all[1].retry_on_lost), (true, false));
    assert_eq!(all[1].labels.get("task").map(String::as_str), Some("b-2"));
    assert_eq!(all[1].spec, spec("busybox:latest"));

    s.delete_batch("b-2", "t5").await?;
    s.delete_batch("b-2", "t6").await?;
    let one = s.batches(Some("b-2")).await?;
    assert_eq!(one.len(), 1);
    assert_eq!(
        one[0].deleted_at.as_deref(),
        Some("t5"),
        "the first delete's time stays"
    );
    assert_eq!(s.batches(Some("b-1")).await?[0].deleted_at, None);
    assert!(s.batches(Some("b-3")).await?.is_empty());
    Ok(())
}

async fn profiles_and_runs(f: &Fixture) -> TestResult {
    let s = &f.store;
    let req = Request {
        cpu_millis: 500,
        memory: 1 << 28,
        gpu_memory: 3 << 30,
    };
    assert!(s.profile("swe").await?.is_none());
    let mut p = Profile::new("swe", req);
    s.put_profile(&p, "t0").await?;
    s.put_profile(&Profile::new("Alpha", req), "t0").await?;
    s.put_profile(&Profile::new("beta", req), "t0").await?;
    p.runs = 7;
    p.anomalous = true;
    p.anomaly = "grew past the cap".into();
    s.put_profile(&p, "t1").await?;
    assert_eq!(s.profile("swe").await?, Some(p.clone()));
    let names: Vec<_> = s.profiles().await?.into_iter().map(|p| p.name).collect();
    assert_eq!(names, ["Alpha", "beta", "swe"]);

    let run = |peak: u64| Run {
        cpu_millis_peak: peak,
        memory_peak: 1 << 20,
        runtime_ms: 10,
        oom_killed: false,
        throttled_ratio: 0.25,
        requested: req,
        gpu_memory_peak: 2 << 30,
    };
    for i in 0..5u64 {
        assert!(s.add_run("swe", &format!("sbx-{i}"), &run(i), "t").await?);
    }
    assert!(s.add_run("beta", "sbx-b", &run(99), "t").await?);
    // Once per sandbox.
    assert!(!s.add_run("swe", "sbx-3", &run(42), "t").await?);
    let peaks = |runs: Vec<Run>| runs.iter().map(|r| r.cpu_millis_peak).collect::<Vec<_>>();
    // The newest three, oldest first.
    assert_eq!(peaks(s.runs("swe", 3).await?), [2, 3, 4]);
    assert_eq!(peaks(s.runs("swe", 100).await?), [0, 1, 2, 3, 4]);
    assert_eq!(s.runs("swe", 1).await?[0], run(4));
    s.delete_runs("swe").await?;
    assert!(s.runs("swe", 100).await?.is_empty());
    assert_eq!(peaks(s.runs("beta", 100).await?), [99]);
    // A deleted run's sandbox may be recorded again.
    assert!(s.add_run("swe", "sbx-3", &run(3), "t").await?);
    Ok(())
}

async fn profile_and_node_events(f: &Fixture) -> TestResult {
    let s = &f.store;
    let mut rx = s.subscribe_events();
    rx.borrow_and_update();
    s.profile_event("sbx-1", "swe", "grew past the cap", "t1")
        .await?;
    woken(&mut rx, "profile_event").await?;
    s.node_event("disk_low", "disk below its floor", "t2")
        .await?;
    woken(&mut rx, "node_event").await?;
    let evs = s.events(None, 0, 10).await?;
    assert_eq!(evs.len(), 2);
    let (p, n) = (&evs[0], &evs[1]);
    assert_eq!(
        (
            p.sandbox_id.as_str(),
            p.kind.as_str(),
            p.state,
            p.reason.as_str()
        ),
        ("sbx-1", "profile", None, "profile_anomalous")
    );
    assert_eq!(p.message, "profile swe: grew past the cap");
    assert_eq!(
        (
            n.sandbox_id.as_str(),
            n.kind.as_str(),
            n.state,
            n.reason.as_str()
        ),
        ("", "node", None, "disk_low")
    );
    assert_eq!(
        (n.message.as_str(), n.time.as_str()),
        ("disk below its floor", "t2")
    );
    Ok(())
}

// ---- PostgreSQL: several processes on one database ----

/// The server under `WARREN_TEST_DATABASE_URL`, or None (and a note) when
/// the variable is unset.
fn pg_server() -> Option<String> {
    match std::env::var(PG_URL_VAR) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            eprintln!("{PG_URL_VAR} is not set: the PostgreSQL half is not run");
            None
        }
    }
}

/// A database of its own on the test server.
struct PgDb {
    server: String,
    name: String,
    url: String,
}

impl PgDb {
    async fn create(server: &str) -> Result<PgDb, Box<dyn std::error::Error>> {
        let mut admin = PgConnection::connect(server)
            .await
            .map_err(|e| format!("{PG_URL_VAR} is set but its server cannot be reached: {e}"))?;
        let name = warren_control::control::new_id_with("warren_test").replace('-', "_");
        // A collation that sorts by a language's rules ("a" before "B"),
        // as a production database's default often does: the store must
        // order ids by bytes anyway.
        let icu = format!(
            "CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'und'"
        );
        if let Err(e) = sqlx::raw_sql(AssertSqlSafe(icu)).execute(&mut admin).await {
            eprintln!("no ICU collation on the test server ({e}); its default it is");
            sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .execute(&mut admin)
                .await?;
        }
        admin.close().await?;
        // A later dbname overrides the one in the URL's path.
        let sep = if server.contains('?') { '&' } else { '?' };
        let url = format!("{server}{sep}dbname={name}");
        Ok(PgDb {
            server: server.into(),
            name,
            url,
        })
    }

    async fn drop(self) -> TestResult {
        let mut admin = PgConnection::connect(&self.server).await?;
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        Ok(())
    }
}

/// Two replicas on one database: a write by either wakes the other's
/// followers, whichever kind of write it is.
#[tokio::test]
async fn postgres_wakes_followers_of_other_processes() -> TestResult {
    let Some(server) = pg_server() else {
        return Ok(());
    };
    let db = PgDb::create(&server).await?;
    let a = PgStore::connect(&db.url).await?;
    let b = PgStore::connect(&db.url).await?;
    let mut rx = b.subscribe_events();
    rx.borrow_and_update();
    a.insert(&row("sbx-1", SandboxState::Creating, "t0"), None)
        .await?;
    woken(&mut rx, "an insert by another store").await?;
    assert_eq!(b.events(None, 0, 10).await?.len(), 1);
    a.transition(
        "sbx-1",
        SandboxState::Running,
        "started",
        "t1",
        Transition::default(),
    )
    .await?;
    woken(&mut rx, "a transition by another store").await?;
    a.node_event("disk_low", "", "t2").await?;
    woken(&mut rx, "a node event by another store").await?;
    // An event written by no store at all (another tool, a later version).
    Raw::Pg(db.url.clone())
        .exec("INSERT INTO events (time, sandbox_id, type, reason) VALUES ('t3', '', 'node', 'by_hand')")
        .await?;
    woken(&mut rx, "an insert by hand").await?;
    assert_eq!(b.events(None, 0, 10).await?.len(), 4);
    drop((a, b));
    db.drop().await
}

/// Many writers in several processes: a follower that reads after the
/// last seq it saw misses none, because numbers are handed out in commit
/// order.
#[tokio::test]
async fn postgres_event_numbers_follow_commit_order() -> TestResult {
    let Some(server) = pg_server() else {
        return Ok(());
    };
    let db = PgDb::create(&server).await?;
    let stores = [
        PgStore::connect(&db.url).await?,
        PgStore::connect(&db.url).await?,
    ];
    const WRITERS: usize = 8;
    const EACH: usize = 40;
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let s = stores[w % 2].clone();
        writers.spawn(async move {
            for i in 0..EACH {
                let id = format!("sbx-{w}-{i}");
                s.insert(&row(&id, SandboxState::Creating, "t"), None)
                    .await?;
                s.transition(
                    &id,
                    SandboxState::Running,
                    "started",
                    "t",
                    Transition::default(),
                )
                .await?;
            }
            Ok::<(), warren_control::store::StoreError>(())
        });
    }
    let follower = stores[0].clone();
    let mut rx = follower.subscribe_events();
    let mut seen = Vec::new();
    let mut cursor = 0;
    loop {
        // Whether every writer had committed before the read below.
        let finished = {
            while let Some(r) = writers.try_join_next() {
                r??;
            }
            writers.is_empty()
        };
        let evs = follower.events(None, cursor, 50).await?;
        let Some(last) = evs.last() else {
            if finished {
                break;
            }
            // Wakes are not what this checks: a late one only slows it.
            let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
            continue;
        };
        cursor = last.seq;
        seen.extend(evs.into_iter().map(|e| e.seq));
    }
    while let Some(r) = writers.join_next().await {
        r??;
    }
    let all: Vec<i64> = follower
        .events(None, 0, -1)
        .await?
        .into_iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(all.len(), WRITERS * EACH * 2);
    assert_eq!(seen, all, "the follower skipped events");
    drop((stores, follower));
    db.drop().await
}

/// The listener's connection dies (a server restart, a network cut): it
/// comes back by itself and followers are woken again. Twice: once when
/// it can reconnect at once, once when the server refuses connections for
/// a while (sqlx's own reconnection gives up; the store's retries).
#[tokio::test]
async fn postgres_listener_reconnects() -> TestResult {
    let Some(server) = pg_server() else {
        return Ok(());
    };
    let db = PgDb::create(&server).await?;
    let a = PgStore::connect(&db.url).await?;
    let b = PgStore::connect(&db.url).await?;
    // On the server's own database: a database cannot refuse connections
    // to itself.
    let mut admin = PgConnection::connect(&db.server).await?;
    for refuse_for in [None, Some(Duration::from_millis(1500))] {
        eprintln!("-- listener connections cut, then refused for {refuse_for:?}");
        let before = listener_pids(&mut admin, &db.name).await?;
        assert_eq!(before.len(), 2, "one listener per store: {before:?}");
        if refuse_for.is_some() {
            let sql = format!("ALTER DATABASE {} ALLOW_CONNECTIONS false", db.name);
            sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(&mut admin)
                .await?;
        }
        let killed: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = $1 AND application_name = $2",
        )
        .bind(&db.name)
        .bind(PgStore::LISTENER_APPLICATION_NAME)
        .fetch_all(&mut admin)
        .await?;
        assert_eq!(killed, [true, true]);
        if let Some(d) = refuse_for {
            tokio::time::sleep(d).await;
            let sql = format!("ALTER DATABASE {} ALLOW_CONNECTIONS true", db.name);
            sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(&mut admin)
                .await?;
        }
        // Both listeners are back, on new connections.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let now = listener_pids(&mut admin, &db.name).await?;
            if now.len() == 2 && now.iter().all(|p| !before.contains(p)) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "listeners not back within 15 s: {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut rx = b.subscribe_events();
        rx.borrow_and_update();
        a.node_event("after_reconnect", "", "t").await?;
        woken(&mut rx, "an event after the listener reconnected").await?;
    }
    admin.close().await?;
    drop((a, b));
    db.drop().await
}

async fn listener_pids(admin: &mut PgConnection, db: &str) -> Result<Vec<i32>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = $2",
    )
    .bind(db)
    .bind(PgStore::LISTENER_APPLICATION_NAME)
    .fetch_all(admin)
    .await
}

/// Replicas starting together on an empty database: one migrates, the
/// others wait for it; `open` picks the store by URL.
#[tokio::test]
async fn postgres_concurrent_start_and_open_by_url() -> TestResult {
    let Some(server) = pg_server() else {
        return Ok(());
    };
    let db = PgDb::create(&server).await?;
    let (a, b, c) = tokio::join!(
        store::open(&db.url),
        store::open(&db.url),
        PgStore::connect(&db.url)
    );
    let (a, b, c) = (a?, b?, c?);
    a.insert(&row("sbx-1", SandboxState::Creating, "t0"), Some("r"))
        .await?;
    assert_eq!(b.by_request_id("r").await?.unwrap().id, "sbx-1");
    assert_eq!(c.list(&[]).await?.len(), 1);
    drop((a, b, c));
    db.drop().await
}

#[tokio::test]
async fn open_picks_sqlite_by_url() -> TestResult {
    let dir = tempfile::tempdir()?;
    for given in [
        format!("sqlite:{}", dir.path().join("a.db").display()),
        dir.path().join("b.db").display().to_string(),
    ] {
        let s = store::open(&given).await?;
        s.insert(&row("sbx-1", SandboxState::Creating, "t0"), None)
            .await?;
    }
    assert!(dir.path().join("a.db").exists());
    assert!(dir.path().join("b.db").exists());
    let e = store::open("mysql://root@db/warren")
        .await
        .err()
        .expect("mysql");
    assert!(matches!(e, store::StoreError::BadUrl(_)), "{e}");
    Ok(())
}

/// A server that cannot be reached is named in the error (never its
/// password), at once: not after the pool's timeout.
#[tokio::test]
async fn open_says_where_postgres_cannot_be_reached() -> TestResult {
    let started = std::time::Instant::now();
    let e = store::open("postgres://warren:hunter2@127.0.0.1:1/warren")
        .await
        .err()
        .expect("nothing listens on port 1");
    let msg = e.to_string();
    assert!(matches!(e, store::StoreError::Connect(..)), "{msg}");
    assert!(
        msg.contains("127.0.0.1:1") && msg.contains("\"warren\""),
        "{msg}"
    );
    assert!(!msg.contains("hunter2"), "{msg}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    Ok(())
}

async fn nodes(f: &Fixture) -> TestResult {
    let s = &f.store;
    let node = |name: &str, cordoned: bool| warren_control::store::NodeRecord {
        name: name.into(),
        url: format!("http://{name}:7071"),
        credential: format!("secret-{name}"),
        labels: serde_json::from_value(serde_json::json!({"gpu": "h200"})).unwrap(),
        cordoned,
        joined_at: "t1".into(),
        // One node over TLS, one plain.
        tls_fingerprint: (name == "n1").then(|| "ab".repeat(32)),
    };
    assert_eq!(s.nodes().await?, vec![]);
    s.put_node(&node("n2", false)).await?;
    s.put_node(&node("n1", false)).await?;
    // A re-join (or a cordon) replaces the record.
    let mut again = node("n1", true);
    again.credential = "rotated".into();
    s.put_node(&again).await?;
    assert_eq!(s.nodes().await?, vec![again, node("n2", false)]);
    s.delete_node("n1").await?;
    s.delete_node("absent").await?;
    assert_eq!(s.nodes().await?, vec![node("n2", false)]);
    Ok(())
}

async fn leader_lease(f: &Fixture) -> TestResult {
    let s = &f.store;
    let holder = |l: warren_control::store::Leader| (l.holder, l.url, l.epoch);
    let a = || ("a".to_string(), "http://a".to_string(), 1);
    assert_eq!(holder(s.claim_leader("a", "http://a", 300).await?), a());
    // Held: another replica only learns who leads.
    assert_eq!(holder(s.claim_leader("b", "http://b", 300).await?), a());
    // Its holder renews it, in the same epoch.
    assert_eq!(holder(s.claim_leader("a", "http://a", 300).await?), a());
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    // Expired: the next claim takes it in a new epoch, and the old holder
    // cannot renew.
    let b = ("b".to_string(), "http://b".to_string(), 2);
    assert_eq!(holder(s.claim_leader("b", "http://b", 300).await?), b);
    assert_eq!(holder(s.claim_leader("a", "http://a", 300).await?), b);
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    // Back to the first holder: an epoch of its own, not its old one.
    let a3 = ("a".to_string(), "http://a".to_string(), 3);
    assert_eq!(holder(s.claim_leader("a", "http://a", 60_000).await?), a3);
    Ok(())
}

fn shipped(id: &str, seq: i64, kind: LogKind, time_ms: i64, body: &str) -> LogEntry {
    LogEntry {
        id: 0,
        sandbox_id: id.into(),
        node: String::new(),
        seq,
        kind,
        time_ms,
        body: body.into(),
    }
}

/// Shipped entries and their node's cursor move together, once: a writer
/// whose cursor is stale keeps nothing; a usage sample becomes a live
/// sandbox's usage, never an ended one's; retention deletes oldest first
/// by age, then by total size.
async fn central_logs(f: &Fixture) -> TestResult {
    let s = &f.store;
    s.insert(&row("sbx-live", SandboxState::Running, "t1"), None)
        .await?;
    s.insert(&row("sbx-done", SandboxState::Destroyed, "t1"), None)
        .await?;
    assert_eq!(s.log_cursor("node-1").await?, None);
    let at = |seq| LogCursor {
        journal: "j-1".into(),
        seq,
    };
    // 40 lines (more than one insert statement's rows) and two samples.
    let mut batch: Vec<LogEntry> = (1..=40)
        .map(|i| {
            shipped(
                "sbx-live",
                i,
                LogKind::Log,
                1000 + i,
                &format!("{{\"n\":{i}}}"),
            )
        })
        .collect();
    let usage = |ns| {
        serde_json::to_string(&warren_core::Usage {
            cpu_usage_ns: ns,
            ..Default::default()
        })
    };
    batch.push(shipped("sbx-live", 41, LogKind::Usage, 1041, &usage(7)?));
    batch.push(shipped("sbx-done", 42, LogKind::Usage, 1042, &usage(9)?));
    assert!(s.keep_shipped("node-1", None, &at(42), &batch).await?);
    assert_eq!(s.log_cursor("node-1").await?, Some(at(42)));
    // The same batch again from the old cursor: refused, nothing doubled.
    assert!(!s.keep_shipped("node-1", None, &at(42), &batch).await?);
    assert!(
        !s.keep_shipped("node-1", Some(&at(0)), &at(42), &batch)
            .await?
    );
    let lines = s.log_entries("sbx-live", LogKind::Log, 0, 0, 1000).await?;
    assert_eq!(lines.len(), 40);
    assert_eq!(lines[0].body, r#"{"n":1}"#);
    assert_eq!((lines[39].seq, lines[39].node.as_str()), (40, "node-1"));
    // Paged by row, and by time.
    let page = s
        .log_entries("sbx-live", LogKind::Log, lines[9].id, 0, 5)
        .await?;
    assert_eq!(
        page.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [11, 12, 13, 14, 15]
    );
    let recent = s
        .log_entries("sbx-live", LogKind::Log, 0, 1035, 1000)
        .await?;
    assert_eq!(recent.len(), 6);
    let samples = s
        .log_entries("sbx-live", LogKind::Usage, 0, 0, 1000)
        .await?;
    assert_eq!(samples.len(), 1);
    let live = s.get("sbx-live").await?.unwrap();
    assert_eq!(live.usage.map(|u| u.cpu_usage_ns), Some(7));
    assert_eq!(s.get("sbx-done").await?.unwrap().usage, None);
    // A rotation on the node: the kept copy drops the lines it dropped,
    // of that sandbox and node only.
    assert_eq!(s.drop_rotated_lines("sbx-live", "node-1", 11).await?, 10);
    assert_eq!(s.drop_rotated_lines("sbx-live", "node-2", 40).await?, 0);
    let dropped: i64 = batch[..10].iter().map(|e| e.body.len() as i64).sum();
    // A new journal (the node's home replaced) from the kept cursor.
    let next = LogCursor {
        journal: "j-2".into(),
        seq: 1,
    };
    let later = [shipped("sbx-live", 1, LogKind::Log, 5000, r#"{"n":"new"}"#)];
    assert!(
        s.keep_shipped("node-1", Some(&at(42)), &next, &later)
            .await?
    );
    let total: i64 = batch
        .iter()
        .chain(&later)
        .map(|e| e.body.len() as i64)
        .sum::<i64>()
        - dropped;
    assert_eq!(s.log_bytes().await?, total);
    // By age: what was written before 1021 goes (the 10 lines left of it).
    assert_eq!(s.expire_log_entries(1021, None).await?, 10);
    let left = s.log_entries("sbx-live", LogKind::Log, 0, 0, 1000).await?;
    assert_eq!(left.first().map(|e| e.seq), Some(21));
    // By size: down to the newest line's bytes.
    let newest = later[0].body.len() as i64;
    s.expire_log_entries(0, Some(newest)).await?;
    let left = s.log_entries("sbx-live", LogKind::Log, 0, 0, 1000).await?;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].body, later[0].body);
    assert_eq!(s.log_bytes().await?, newest);
    Ok(())
}
