CREATE TABLE sandboxes (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    reason TEXT NOT NULL,
    spec TEXT NOT NULL,
    resources TEXT NOT NULL,
    node TEXT NOT NULL,
    image_digest TEXT NOT NULL,
    pid INTEGER,
    request_id TEXT UNIQUE,
    created_at TEXT NOT NULL,
    started_at TEXT,
    finished_at TEXT,
    exit_code INTEGER
);
CREATE INDEX sandboxes_state ON sandboxes(state);

CREATE TABLE events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    time TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    type TEXT NOT NULL,
    state TEXT,
    reason TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT ''
);
CREATE INDEX events_sandbox ON events(sandbox_id, seq);
