-- Who owns each volume (issue 43). Volumes live on their nodes; who may
-- see, mount and remove one is the control plane's to keep. A volume
-- without a row (made before tenants owned volumes) is the default
-- tenant's, the operator's.
CREATE TABLE volume_owners (
    name TEXT PRIMARY KEY,
    tenant TEXT NOT NULL
);
