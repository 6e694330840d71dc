-- The SHA-256 of the certificate a node's API presents (sent at join): the
-- control plane accepts that certificate only. NULL for a plain-HTTP node.
ALTER TABLE nodes ADD COLUMN tls_fingerprint TEXT;
