CREATE TABLE batches (
    id TEXT PRIMARY KEY,
    count INTEGER NOT NULL,
    spec TEXT NOT NULL,
    labels TEXT NOT NULL,
    created_at TEXT NOT NULL,
    deleted_at TEXT
);
