-- The nodes of a cluster (as sqlite 0008): where the control plane reaches
-- each one and the credential it shows there, its labels, its cordon.
CREATE TABLE nodes (
    name TEXT COLLATE "C" PRIMARY KEY,
    url TEXT NOT NULL,
    credential TEXT NOT NULL,
    labels TEXT NOT NULL,
    cordoned BOOLEAN NOT NULL DEFAULT FALSE,
    joined_at TEXT NOT NULL
);
