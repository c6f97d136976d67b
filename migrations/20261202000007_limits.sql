-- soldonce schema, part 7: flash-sale limits on what one account may hold.
-- `max_per_order`: units of the SKU one order may ask for (422 beyond it).
-- `per_account_limit`: units of the SKU one account may hold in pending or
-- confirmed orders, ever ("one per customer"; 409 beyond it).
ALTER TABLE products
    ADD COLUMN max_per_order bigint CHECK (max_per_order > 0),
    ADD COLUMN per_account_limit bigint CHECK (per_account_limit > 0);

-- The units an account holds in open reservations, counted per placement
-- when ACCOUNT_MAX_RESERVED_UNITS is on.
CREATE INDEX orders_account_pending ON orders (account_id) WHERE state = 'payment_pending';
