-- urutan_enqueue from psql (or any language that speaks SQL): the event is
-- written in the same transaction as the business change, exists if and
-- only if it commits, and wakes `urutan relay` at commit.
--
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -v orders=100 -v versions=5 -f enqueue.sql
--
-- The message id is the returned outbox id; the routing key defaults to
-- <prefix>.<status> (e.g. pesanan.dibayar); the body is the contract's
-- {"id", "status", "versi", "data"}. A bad call (NULL id, versi < 1, an
-- empty status, a routing key outside <prefix>.#) fails here, in the
-- producer's transaction, with SQLSTATE 22023, never as a dead letter.
\if :{?orders}
\else
\set orders 3
\endif
\if :{?versions}
\else
\set versions 2
\endif

-- One event, the way a service writes it:
BEGIN;
-- UPDATE my_orders SET status = 'dibuat' WHERE id = 'SQL-demo';  -- your own write
SELECT urutan_enqueue('SQL-demo', 'dibuat', 1, '{"kota": "jakarta"}') AS message_id;
COMMIT;

-- Many: version 1 of every order, then version 2, ... (ids increase in
-- that order, and the relay publishes each order's rows in id order).
BEGIN;
SELECT count(urutan_enqueue('SQL-' || o, s.status, v, jsonb_build_object('producer', 'sql')))
       AS enqueued
FROM generate_series(1, :versions) v
CROSS JOIN LATERAL (SELECT (ARRAY['dibuat', 'menunggu_bayar', 'dibayar', 'dikirim', 'selesai'])
                           [1 + (v - 1) % 5] AS status) s
CROSS JOIN generate_series(0, :orders - 1) o;
COMMIT;
