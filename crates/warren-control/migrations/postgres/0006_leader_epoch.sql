-- As sqlite 0012: the leader lease's epoch, one more each time the lease
-- changes hands, sent by the leader on every node call.
ALTER TABLE leader ADD COLUMN epoch BIGINT NOT NULL DEFAULT 1;
