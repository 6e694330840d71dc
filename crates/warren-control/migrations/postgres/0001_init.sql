-- The SQLite schema after its migrations 0001-0007, in PostgreSQL. Later
-- changes to one schema are made to the other in a migration of its own.
--
-- Columns keep SQLite's types where the code reads them the same way
-- (TEXT timestamps and JSON, as written by the control plane), so one
-- decoder serves both stores. Text that is sorted on uses the "C"
-- collation: SQLite compares bytes, and the database's default collation
-- (often a locale's) would order ids differently.

CREATE TABLE sandboxes (
    id TEXT COLLATE "C" PRIMARY KEY,
    state TEXT NOT NULL,
    reason TEXT NOT NULL,
    spec TEXT NOT NULL,
    resources TEXT NOT NULL,
    node TEXT NOT NULL,
    image_digest TEXT NOT NULL,
    request_id TEXT UNIQUE,
    created_at TEXT COLLATE "C" NOT NULL,
    started_at TEXT,
    finished_at TEXT,
    exit_code INTEGER,
    -- A `stopping` sandbox either being destroyed, or frozen in the grace
    -- period of the `delay` reclaim policy.
    grace BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX sandboxes_state ON sandboxes(state);

CREATE TABLE events (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    time TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    type TEXT NOT NULL,
    state TEXT,
    reason TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT ''
);
CREATE INDEX events_sandbox ON events(sandbox_id, seq);

-- Followers read events after the last `seq` they saw, so an event must
-- never become visible after one with a higher `seq`. Several writers
-- (the control plane's own connections, other `warren server` replicas)
-- take numbers from the identity concurrently and may commit out of that
-- order; a reader in between would skip the lower number for good. Every
-- statement that inserts events therefore first takes a lock held to the
-- end of its transaction, before its rows get their numbers: numbers are
-- then handed out in commit order. (Write the event last in a transaction,
-- so the lock is held only for the commit.)
--
-- The same trigger wakes every process following the events (LISTEN
-- warren_events); a notification is delivered only if, and once, the
-- transaction commits.
CREATE FUNCTION warren_events_before_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- 512735998565 is 0x7761727265, "warre": any constant will do, as
    -- long as every writer uses this one.
    PERFORM pg_advisory_xact_lock(512735998565);
    PERFORM pg_notify('warren_events', '');
    RETURN NULL;
END;
$$;
CREATE TRIGGER events_in_commit_order
    BEFORE INSERT ON events
    FOR EACH STATEMENT EXECUTE FUNCTION warren_events_before_insert();

CREATE TABLE batches (
    id TEXT COLLATE "C" PRIMARY KEY,
    count BIGINT NOT NULL,
    spec TEXT NOT NULL,
    labels TEXT NOT NULL,
    created_at TEXT COLLATE "C" NOT NULL,
    deleted_at TEXT,
    retry_on_oom BOOLEAN NOT NULL DEFAULT FALSE
);

CREATE TABLE profiles (
    name TEXT COLLATE "C" PRIMARY KEY,
    body TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE profile_runs (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    profile TEXT NOT NULL,
    sandbox_id TEXT NOT NULL UNIQUE,
    body TEXT NOT NULL,
    finished_at TEXT NOT NULL
);
CREATE INDEX profile_runs_profile ON profile_runs(profile, seq);
