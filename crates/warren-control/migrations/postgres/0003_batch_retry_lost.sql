-- A batch may re-queue members lost with their node (as sqlite 0009).
ALTER TABLE batches ADD COLUMN retry_on_lost BOOLEAN NOT NULL DEFAULT FALSE;
