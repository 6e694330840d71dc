-- Which `warren server` replica leads (runs the scheduler and sweepers):
-- one row, held until expires_ms (epoch milliseconds, the database's
-- clock) unless its holder renews it.
CREATE TABLE leader (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    holder TEXT NOT NULL,
    url TEXT NOT NULL,
    expires_ms INTEGER NOT NULL
);
