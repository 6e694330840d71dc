-- Tenants (issue 43): teams sharing one Warren. A token is kept only as
-- the SHA-256 of its value; revoking one deletes its row. Everything made
-- before tenants belongs to the default tenant, the operator's.
CREATE TABLE tenants (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    role TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    description TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX tokens_tenant ON tokens(tenant);
ALTER TABLE sandboxes ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
ALTER TABLE batches ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
ALTER TABLE pools ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
ALTER TABLE secrets ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
