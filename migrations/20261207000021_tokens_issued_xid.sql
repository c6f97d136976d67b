-- Which transaction issued each token. checkout holds every issued digest
-- in memory and refuses a made-up token without a lookup; to stay current
-- it reads the tokens issued at or after the oldest transaction its last
-- read could not see (that snapshot's xmin), so a token whose transaction
-- committed late is never skipped, as a time cursor would skip it. Tokens
-- issued before this migration have none: checkout reads every digest at
-- start. Added without a default first, so the table is not rewritten.
ALTER TABLE api_tokens ADD COLUMN issued_xid xid8;
ALTER TABLE api_tokens ALTER COLUMN issued_xid SET DEFAULT pg_current_xact_id();
CREATE INDEX api_tokens_issued_xid ON api_tokens (issued_xid);
