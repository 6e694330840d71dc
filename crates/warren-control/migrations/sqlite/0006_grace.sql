-- A `stopping` sandbox is either being destroyed, or frozen in the grace
-- period of the `delay` reclaim policy (it is destroyed when that ends).
-- A restart finishes the first and adopts the second.
ALTER TABLE sandboxes ADD COLUMN grace INTEGER NOT NULL DEFAULT 0;
