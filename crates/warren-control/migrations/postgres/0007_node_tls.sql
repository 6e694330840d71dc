-- As sqlite 0013: the pinned SHA-256 of a node API's certificate.
ALTER TABLE nodes ADD COLUMN tls_fingerprint TEXT;
