CREATE TABLE profiles (
    name TEXT PRIMARY KEY,
    body TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE profile_runs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    profile TEXT NOT NULL,
    sandbox_id TEXT NOT NULL UNIQUE,
    body TEXT NOT NULL,
    finished_at TEXT NOT NULL
);
CREATE INDEX profile_runs_profile ON profile_runs(profile, seq);
