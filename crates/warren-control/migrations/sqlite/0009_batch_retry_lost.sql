-- A batch may re-queue members lost with their node (cluster mode).
ALTER TABLE batches ADD COLUMN retry_on_lost INTEGER NOT NULL DEFAULT 0;
