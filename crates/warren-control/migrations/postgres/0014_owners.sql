-- Who owns each named thing that lives on the nodes (issue 43): volumes
-- and, now, images. The nodes keep the things; who may see, use and
-- remove one is the control plane's to keep, in one table for every kind.
-- A volume without a row is the default tenant's (made before volumes had
-- owners); an image without one is shared: the operator's, which every
-- tenant may run and build on.
CREATE TABLE owners (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    tenant TEXT NOT NULL,
    PRIMARY KEY (kind, name)
);
INSERT INTO owners (kind, name, tenant) SELECT 'volume', name, tenant FROM volume_owners;
DROP TABLE volume_owners;
