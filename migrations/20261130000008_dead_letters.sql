-- Dead letters recorded where they can be queried (`urutan dlq`, `urutan
-- status`, `urutan explain`).
--
-- A worker commits one row BEFORE it rejects a delivery into the DLQ; a
-- crash in between redelivers the message, whose second row is absorbed by
-- the unique index on the delivery key (one unresolved row per key). A
-- message found in the DLQ without a row (dead-lettered by the broker itself,
-- e.g. its delivery limit during a crash loop, or by a version before this
-- one) gets its row when `urutan dlq` walks the queue (`recorded_by =
-- 'queue'`, reason from the message itself or its `x-death`).
--
-- "In the DLQ now" = rows with resolved_at IS NULL. `urutan dlq replay` and
-- `urutan dlq purge` resolve them ('replayed', 'purged'); resolved rows older
-- than DEAD_LETTER_RETENTION are deleted by `urutan run`.
--
-- Every statement is idempotent (a migration may be re-applied by its owner).

CREATE TABLE IF NOT EXISTS urutan_dead_letter (
    id               BIGSERIAL PRIMARY KEY,
    -- message_id, or 'sha256:<hex>' of the message (its producer's
    -- properties, headers and body) when the id is missing or invalid.
    delivery_key     TEXT NOT NULL,
    -- The message_id property as sent; NULL when missing or invalid.
    message_id       TEXT,
    -- The order id, when known (header, else body `id`).
    pesanan_id       TEXT,
    -- The body's `versi`, when it is an integer.
    versi            BIGINT,
    -- Shard the delivery came from (-1: unknown, for a row recorded from the queue).
    shard            INT NOT NULL,
    -- The `reason` label of urutan_dead_letters_total (or, recorded from the
    -- queue, the broker's x-death reason when the message itself is valid).
    reason           TEXT NOT NULL,
    -- Human-readable detail: the rejection's message.
    detail           TEXT NOT NULL,
    -- delivery_limit and database_refused: the last error the handler met.
    last_error       TEXT,
    dead_lettered_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Set when the message left the DLQ through `urutan dlq replay/purge`.
    resolved_at      TIMESTAMPTZ,
    resolution       TEXT CHECK (resolution IN ('replayed', 'purged')),
    -- 'worker' (before its reject) or 'queue' (found in the DLQ with no row).
    recorded_by      TEXT NOT NULL DEFAULT 'worker' CHECK (recorded_by IN ('worker', 'queue')),
    -- Where it was published: exchange and routing key (what a replay uses).
    exchange         TEXT,
    routing_key      TEXT,
    -- Message properties and headers as JSON (strings lossy UTF-8, capped).
    properties       JSONB NOT NULL DEFAULT '{}',
    headers          JSONB NOT NULL DEFAULT '{}',
    -- The body's first bytes (at most 64 KiB) and its full size.
    body             BYTEA NOT NULL DEFAULT '',
    body_bytes       INT NOT NULL DEFAULT 0,
    -- The broker's x-death header, once `urutan dlq` has read the message
    -- from the queue (a worker records before the broker writes it).
    x_death          JSONB,
    CHECK ((resolved_at IS NULL) = (resolution IS NULL))
);

-- One unresolved record per delivery key.
CREATE UNIQUE INDEX IF NOT EXISTS urutan_dead_letter_unresolved_key
    ON urutan_dead_letter (delivery_key) WHERE resolved_at IS NULL;
CREATE INDEX IF NOT EXISTS urutan_dead_letter_pesanan_idx ON urutan_dead_letter (pesanan_id);
CREATE INDEX IF NOT EXISTS urutan_dead_letter_reason_idx ON urutan_dead_letter (reason);
CREATE INDEX IF NOT EXISTS urutan_dead_letter_at_idx ON urutan_dead_letter (dead_lettered_at);
CREATE INDEX IF NOT EXISTS urutan_dead_letter_message_idx ON urutan_dead_letter (message_id);
-- Retention: resolved rows by age.
CREATE INDEX IF NOT EXISTS urutan_dead_letter_resolved_idx ON urutan_dead_letter (resolved_at)
    WHERE resolved_at IS NOT NULL;
