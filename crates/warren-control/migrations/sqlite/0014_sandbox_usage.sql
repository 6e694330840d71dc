-- A finished sandbox's last usage reading (JSON), kept after its node forgot it.
ALTER TABLE sandboxes ADD COLUMN usage TEXT;
