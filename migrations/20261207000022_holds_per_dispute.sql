-- A shipment may be held by several disputes (two payments of one order,
-- two partial disputes of one payment): one hold per dispute, so releasing
-- one dispute's finding never ships goods another dispute still holds.
-- The warehouse moves a shipment only while none of its holds stands.
ALTER TABLE shipment_holds DROP CONSTRAINT shipment_holds_pkey,
    ADD PRIMARY KEY (order_id, dispute_id);
