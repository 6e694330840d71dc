-- The leader lease's epoch: one more each time the lease changes hands, sent
-- by the leader on every node call so that nodes refuse a replaced leader.
ALTER TABLE leader ADD COLUMN epoch INTEGER NOT NULL DEFAULT 1;
