-- Authorized orders by age: the payment worker reads the oldest every round
-- (soldonce_authorizations_oldest_seconds) and fulfillment's sweep takes the
-- oldest first. On the id alone, min(updated_at) read every authorized
-- order each round — a week of unshipped orders, twice a second.
DROP INDEX IF EXISTS orders_capture_authorized;
CREATE INDEX orders_authorized_since ON orders (updated_at, id) WHERE capture = 'authorized';
