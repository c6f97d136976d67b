-- The outbox's `stream_id` goes, as migration 30 (`outbox_rows_by_position_only`)
-- said a later release would: nothing has read it since then, and the
-- services of this release and the one before it leave it NULL. Relays and
-- writers of the releases before migration 30 must not run after this one
-- (they insert the column); see docs/reference.md, Upgrading. The drop
-- only marks the column dropped: no rewrite, a moment's exclusive lock.
ALTER TABLE outbox DROP COLUMN IF EXISTS stream_id;
