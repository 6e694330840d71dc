-- Warm pools: a template spec and how many ready sandboxes of it to keep.
-- The members are ordinary sandboxes labelled warren.pool=NAME.
CREATE TABLE pools (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    size INTEGER NOT NULL,
    updated_at TEXT NOT NULL
);
