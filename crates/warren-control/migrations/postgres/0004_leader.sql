-- Which `warren server` replica leads (as sqlite 0010): one row, held until
-- expires_ms (epoch milliseconds, the database's clock) unless renewed.
CREATE TABLE leader (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    holder TEXT NOT NULL,
    url TEXT NOT NULL,
    expires_ms BIGINT NOT NULL
);
