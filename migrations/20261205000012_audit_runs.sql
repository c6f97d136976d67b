-- Audits are recorded, so the console shows the last one instead of running
-- its own, and the periodic audit checks only what changed since the last
-- run (store::audit_delta) with a full pass now and then.
CREATE TABLE audit_runs (
    id               bigserial PRIMARY KEY,
    kind             text NOT NULL CHECK (kind IN ('full', 'incremental')),
    started_at       timestamptz NOT NULL,
    seconds          double precision NOT NULL,
    -- incremental: the event position the run checked from (exclusive)
    from_position    bigint,
    -- the highest event position the run's snapshot held
    to_position      bigint NOT NULL,
    orders           bigint NOT NULL,
    events           bigint NOT NULL,
    violation_count  bigint NOT NULL,
    -- violations by check, and the first ones listed
    checks           jsonb NOT NULL,
    violations       jsonb NOT NULL
);
CREATE INDEX audit_runs_started ON audit_runs (started_at);

-- Where the last recorded audit stopped: the highest event position and
-- stock_ledger id its snapshot held, the positions and ids below them it did
-- not see (transactions still in flight then, or rolled back: kept for a
-- while and looked for again), and each SKU's ledger sums in that snapshot.
-- `version` lets two auditors race without either moving it backwards.
CREATE TABLE audit_checkpoint (
    id                boolean PRIMARY KEY DEFAULT true CHECK (id),
    version           bigint NOT NULL,
    at                timestamptz NOT NULL,
    event_position    bigint NOT NULL,
    event_gaps        bigint[] NOT NULL,
    event_gaps_seen   timestamptz[] NOT NULL,
    ledger_id         bigint NOT NULL,
    ledger_gaps       bigint[] NOT NULL,
    ledger_gaps_seen  timestamptz[] NOT NULL
);
CREATE TABLE audit_ledger_sums (
    sku        text PRIMARY KEY,
    available  bigint NOT NULL,
    reserved   bigint NOT NULL,
    sold       bigint NOT NULL
);

-- The audit's compensation check reads open refunds without scanning payments.
CREATE INDEX payments_refund_open ON payments (recorded_at) WHERE refund_state IN ('pending', 'refused');
