-- Issue 29 (low): an outbox row the broker returns as unroutable (its
-- routing key is outside `<prefix>.#`, e.g. written with a plain INSERT INTO
-- outbox) is set aside instead of being retried forever: the relay stamps
-- `unroutable_at` and says why in `unroutable_reason`, and publishes the
-- rows behind it. The row is never deleted (the purge of sent rows only
-- takes rows with dikirim_pada) and `urutan status` reports it
-- (`outbox_unroutable`). After fixing the key or the topology, an operator
-- retries it with:
--   UPDATE outbox SET unroutable_at = NULL, unroutable_reason = NULL WHERE id = <id>;
--
-- Every statement is idempotent (a migration may be re-applied by its owner).

ALTER TABLE outbox ADD COLUMN IF NOT EXISTS unroutable_at TIMESTAMPTZ;
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS unroutable_reason TEXT;

-- Status and the relay's gauge count set-aside rows without a scan.
CREATE INDEX IF NOT EXISTS outbox_unroutable_idx ON outbox (id)
    WHERE unroutable_at IS NOT NULL AND dikirim_pada IS NULL;

-- Unresolved dead-letter records expire after DEAD_LETTER_UNRESOLVED_RETENTION,
-- counted from when they were recorded (dead_lettered_at may be a producer's
-- x-death time): the purge finds them through this index.
ALTER TABLE urutan_dead_letter ADD COLUMN IF NOT EXISTS recorded_at TIMESTAMPTZ NOT NULL DEFAULT now();
CREATE INDEX IF NOT EXISTS urutan_dead_letter_unresolved_recorded_idx
    ON urutan_dead_letter (recorded_at) WHERE resolved_at IS NULL;
