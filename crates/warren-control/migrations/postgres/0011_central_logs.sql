-- Logs and usage kept centrally (issue 44): every sandbox's log lines and
-- usage samples as its node shipped them, kept after the node and the
-- sandbox are gone (retention by age and total size deletes oldest first).
CREATE TABLE sandbox_logs (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sandbox_id TEXT NOT NULL,
    node TEXT NOT NULL,
    -- The node's journal sequence number (a log line carries it as `seq`).
    seq BIGINT NOT NULL,
    -- 'log' or 'usage'.
    kind TEXT NOT NULL,
    -- When the node wrote it (Unix milliseconds).
    time_ms BIGINT NOT NULL,
    body TEXT NOT NULL,
    bytes BIGINT NOT NULL
);
CREATE INDEX sandbox_logs_by_sandbox ON sandbox_logs(sandbox_id, kind, id);

-- How far each node's journal has been taken, written in the same
-- transaction as the lines: a crash neither loses nor repeats any.
CREATE TABLE log_cursors (
    node TEXT PRIMARY KEY,
    journal TEXT NOT NULL,
    seq BIGINT NOT NULL,
    -- Entries the node dropped before they were taken (its bound).
    dropped BIGINT NOT NULL DEFAULT 0
);

-- The bytes sandbox_logs holds, kept with every write so that the size
-- bound needs no scan.
CREATE TABLE log_total (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    bytes BIGINT NOT NULL
);
INSERT INTO log_total (id, bytes) VALUES (1, 0);
