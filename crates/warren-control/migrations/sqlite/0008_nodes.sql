-- The nodes of a cluster: where the control plane reaches each one and the
-- credential it shows there (issued at join), its labels, and whether an
-- operator cordoned it. Liveness is not stored: a node proves it by
-- heartbeats, and a restarted control plane waits for them.
CREATE TABLE nodes (
    name TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    credential TEXT NOT NULL,
    labels TEXT NOT NULL,
    cordoned INTEGER NOT NULL DEFAULT 0,
    joined_at TEXT NOT NULL
);
