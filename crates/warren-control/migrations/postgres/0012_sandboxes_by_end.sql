-- The fleet over a window (issue 44) reads the sandboxes that ended since
-- a time, a page at a time in (finished_at, id) order: without this index
-- every page would scan every record ever kept.
CREATE INDEX sandboxes_finished ON sandboxes(finished_at, id);
