-- Secrets: a value sealed with the server's key (XChaCha20-Poly1305,
-- <home>/secrets-key), never stored in the clear; the version grows with
-- each update and is bound into the seal.
CREATE TABLE secrets (
    name TEXT PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    version BIGINT NOT NULL,
    metadata TEXT NOT NULL,
    sealed TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
