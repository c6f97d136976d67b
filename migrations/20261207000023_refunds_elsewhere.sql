-- A refund of an order's payment made outside soldonce (the PSP's
-- dashboard, another system on a shared account) is named to a person like
-- a dispute: a finding of its own kind, its refund id the subject, and a
-- hold on the order's shipment (`shipment_holds.dispute_id` then holds the
-- refund's id: the hold's cause).
ALTER TABLE findings DROP CONSTRAINT findings_kind_check,
    ADD CONSTRAINT findings_kind_check CHECK (kind IN ('dispute', 'refund_elsewhere'));
