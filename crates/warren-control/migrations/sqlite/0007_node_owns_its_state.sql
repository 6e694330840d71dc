-- A sandbox's host pid and its boot-clock deadline belong to its node (the
-- node journals them); the control plane keeps intent and state only.
ALTER TABLE sandboxes DROP COLUMN pid;
ALTER TABLE sandboxes DROP COLUMN expires_boot_ms;
