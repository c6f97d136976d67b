-- 3-D Secure: the buyer's action a payment waits for, shown with the order
-- (`payment.next_action.url`); its reservation was extended once for it
-- (`orders.expires_at` follows the order's `order.action_required` event).
ALTER TABLE orders ADD COLUMN next_action jsonb;
