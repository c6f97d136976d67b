-- An event's data and metadata are stored as the JSON text they were
-- written with (`json`), not parsed into `jsonb` (issue 40). Nothing reads
-- inside them in SQL on the hot path: the relay and a repair read them
-- whole and build the message from them, and `jsonb` cost PostgreSQL a parse
-- into its binary form on every insert and a print back to text on every
-- read. Measured on the benchmark machine with 200,000 order.placed-sized
-- rows: inserting data and metadata from text took 2.55 s as `jsonb`
-- against 1.24 s as `json`, and reading them back as text 1.07 s against
-- 0.43 s: about 10 µs of PostgreSQL's CPU per event, 80 µs per order of
-- eight events. Key order and spacing may differ from what `jsonb` printed;
-- every reader parses the JSON, and the published message is built from
-- the parsed value either way.
--
-- This rewrites `events` and rebuilds its indexes under an exclusive lock:
-- writers wait until it is done, about 11 s per million events on the
-- benchmark machine (2 cores; 822 MB of events and indexes became 741 MB).
-- See docs/reference.md, Upgrading.
ALTER TABLE events
    ALTER COLUMN data TYPE json USING data::json,
    ALTER COLUMN metadata TYPE json USING metadata::json;
