-- Issue 34: the console's lists stay fast however much is dead-lettered or
-- held (benches/console.rs: 100,000 dead letters, 10,000 held orders).
-- Without these, the overview counted the dead letters by reason by reading
-- the whole table (resolved records included, kept for DEAD_LETTER_RETENTION)
-- and the held orders by reading every hold; the dead-letter list walked
-- the resolved records before the first unresolved one; the hold and retry
-- lists sorted every row to show the oldest hundred.
--
-- Plain CREATE INDEX (a migration runs in a transaction): writes to these
-- tables wait while an index is built, about a second for a million rows.
-- They are written per dead letter and per hold, not per message.

-- Unresolved dead letters by reason (status, the overview: an index-only
-- count) and a reason's list in the order shown.
CREATE INDEX IF NOT EXISTS urutan_dead_letter_open_reason
    ON urutan_dead_letter (reason, dead_lettered_at, id) WHERE resolved_at IS NULL;
COMMENT ON INDEX urutan_dead_letter_open_reason IS 'Unresolved dead letters by reason, oldest first: the count by reason (urutan status, the console) and a reason''s list.';

-- The list of unresolved dead letters, oldest first, without the resolved.
CREATE INDEX IF NOT EXISTS urutan_dead_letter_open_at
    ON urutan_dead_letter (dead_lettered_at, id) WHERE resolved_at IS NULL;
COMMENT ON INDEX urutan_dead_letter_open_at IS 'Unresolved dead letters, oldest first (urutan dlq list, the console), past the resolved records kept for retention.';

-- Holds by reason with the oldest (status, metrics: index-only), and the
-- list of holds, oldest first.
CREATE INDEX IF NOT EXISTS urutan_tahan_alasan_sejak ON urutan_tahan (alasan, sejak);
COMMENT ON INDEX urutan_tahan_alasan_sejak IS 'Holds by reason with the oldest (urutan status, urutan_orders_held and urutan_hold_oldest_seconds).';
CREATE INDEX IF NOT EXISTS urutan_tahan_sejak ON urutan_tahan (sejak, pesanan_id);
COMMENT ON INDEX urutan_tahan_sejak IS 'Holds, oldest first (urutan hold list, the console).';

-- Messages set aside to retry, the next due first.
CREATE INDEX IF NOT EXISTS urutan_parkir_coba_lagi
    ON urutan_parkir (jatuh_tempo) WHERE jatuh_tempo IS NOT NULL;
COMMENT ON INDEX urutan_parkir_coba_lagi IS 'Messages set aside after a transient failure, the next due first (urutan hold list, the console).';
