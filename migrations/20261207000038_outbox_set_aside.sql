-- Issue 43: one outbox row stopped the relay for every producer. A plain
-- INSERT INTO outbox (which the contract allows) was published unchecked: a
-- 300-byte routing_key panicked the relay, a 200 KB agregat_id made the
-- broker close its connection, on every restart.
--
-- Now (contract section 4) the relay publishes a row only if it meets the
-- contract's section 2; a row that does not, or that the broker refuses, is
-- set aside with its reason and never holds up the rows behind it. Set-aside
-- rows stay in `outbox`, in the columns the relay owns (migration 0017 set
-- aside unroutable rows the same way):
-- - `unroutable_at`: when it was set aside (for any reason, despite the
--   name: renaming it would break every runbook that clears it);
-- - `unroutable_reason`: why, in words;
-- - `alasan_sisih` (new): why, as a bounded code (`unroutable`,
--   `routing_key_empty`, `routing_key_too_long`, `entity_id_too_long`,
--   `entity_id_invalid`, `payload_invalid`, `body_too_large`,
--   `broker_refused`): the `reason` of `urutan status` and of the metrics.
-- A set-aside row keeps `dikirim_pada` NULL, so the expiry of id-range
-- partitions (urutan_partisi_id_lepas: no unsent row) and of the default
-- partition (urutan_awal_id_pangkas: sent rows only) never drops it: it
-- waits for an operator, who fixes the row and clears `unroutable_at` to
-- retry it, or deletes it.
--
-- CHECK constraints say the same to producers, in their own transaction: a
-- row that is not set aside must have an entity id of 1-128 bytes without
-- control characters, a routing key of 1-255 bytes and a contract body as
-- payload. They are ADDED NOT VALID (new and updated rows are checked at
-- once, no scan under this migration's exclusive lock); urutan_outbox_sahkan
-- validates them afterwards (`urutan migrate` calls it, SHARE UPDATE
-- EXCLUSIVE: writes go on). Old unsent rows that break them are set aside
-- here first, so neither the relay nor the validation trips on them; a sent
-- row from before that breaks them leaves its constraint NOT VALID (still
-- enforced for every new row) until its partition expires.
--
-- Re-runnable (IF NOT EXISTS, constraints dropped and added again).

ALTER TABLE outbox ADD COLUMN IF NOT EXISTS alasan_sisih TEXT;
COMMENT ON COLUMN outbox.alasan_sisih IS 'Why the relay set the row aside (alasan sisih: set-aside reason), a bounded code: unroutable, routing_key_empty, routing_key_too_long, entity_id_too_long, entity_id_invalid, payload_invalid, body_too_large, broker_refused. Set with unroutable_at; NULL while the row is not set aside.';
COMMENT ON COLUMN outbox.unroutable_at IS 'When the relay set the row aside instead of publishing it (the name is historical: for any reason, see alasan_sisih and unroutable_reason): not retried, reported by `urutan status` and `urutan explain`, never expired. Fix the row and clear unroutable_at, unroutable_reason and alasan_sisih to retry it.';
COMMENT ON COLUMN outbox.unroutable_reason IS 'Why the relay set the row aside, in words (alasan_sisih is the code).';

-- The rows set aside as unroutable before this migration.
UPDATE outbox SET alasan_sisih = 'unroutable'
WHERE unroutable_at IS NOT NULL AND alasan_sisih IS NULL;

-- Unsent rows that break the rules below are set aside now, with the code
-- the relay would give them (through the unsent index).
UPDATE outbox SET unroutable_at = now(), alasan_sisih = s.alasan,
       unroutable_reason = 'set aside by migration 0038: ' || s.alasan
FROM (
    SELECT id,
           CASE
               WHEN octet_length(routing_key) = 0 THEN 'routing_key_empty'
               WHEN octet_length(routing_key) > 255 THEN 'routing_key_too_long'
               WHEN octet_length(agregat_id) > 128 THEN 'entity_id_too_long'
               WHEN octet_length(agregat_id) = 0
                    OR agregat_id ~ '[\u0001-\u001f\u007f-\u009f\ufffd]' THEN 'entity_id_invalid'
               WHEN NOT coalesce(jsonb_typeof(payload) = 'object'
                         AND payload -> 'id' = to_jsonb(agregat_id)
                         AND jsonb_typeof(payload -> 'status') = 'string'
                         AND char_length(payload ->> 'status') BETWEEN 1 AND 64
                         AND jsonb_typeof(payload -> 'versi') = 'number'
                         AND CASE WHEN (payload ->> 'versi') ~ '^[0-9]{1,16}$'
                                  THEN (payload ->> 'versi')::bigint BETWEEN 1 AND 9007199254740991
                                  ELSE false END, false)
                    THEN 'payload_invalid'
           END AS alasan
    FROM outbox WHERE dikirim_pada IS NULL AND unroutable_at IS NULL
) s
WHERE outbox.id = s.id AND s.alasan IS NOT NULL;

-- A row the relay may publish meets section 2 of the contract (a set-aside
-- row is exempt: it is never published, and the relay must be able to mark
-- any row it refuses). The relay checks more (the body's size against
-- MAX_BODY_BYTES, `data`'s depth): what a constraint cannot see, or what
-- depends on a setting.
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_agregat_id_sah;
ALTER TABLE outbox ADD CONSTRAINT outbox_agregat_id_sah CHECK (
    unroutable_at IS NOT NULL
    OR (octet_length(agregat_id) BETWEEN 1 AND 128
        AND agregat_id !~ '[\u0001-\u001f\u007f-\u009f\ufffd]')
) NOT VALID;
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_routing_key_sah;
ALTER TABLE outbox ADD CONSTRAINT outbox_routing_key_sah CHECK (
    unroutable_at IS NOT NULL OR octet_length(routing_key) BETWEEN 1 AND 255
) NOT VALID;
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_payload_sah;
ALTER TABLE outbox ADD CONSTRAINT outbox_payload_sah CHECK (
    unroutable_at IS NOT NULL
    -- coalesce: a missing member makes NULL, which a CHECK would let pass.
    OR coalesce(jsonb_typeof(payload) = 'object'
        AND payload -> 'id' = to_jsonb(agregat_id)
        AND jsonb_typeof(payload -> 'status') = 'string'
        AND char_length(payload ->> 'status') BETWEEN 1 AND 64
        AND jsonb_typeof(payload -> 'versi') = 'number'
        -- CASE: AND does not say which side runs first, and '1.5'::bigint fails.
        AND CASE WHEN (payload ->> 'versi') ~ '^[0-9]{1,16}$'
                 THEN (payload ->> 'versi')::bigint BETWEEN 1 AND 9007199254740991
                 ELSE false END, false)
) NOT VALID;
-- The code is a metric label: bounded.
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_alasan_sisih_sah;
ALTER TABLE outbox ADD CONSTRAINT outbox_alasan_sisih_sah CHECK (
    alasan_sisih IS NULL OR alasan_sisih ~ '^[a-z_]{1,40}$'
) NOT VALID;

-- Validates the outbox's constraints added NOT VALID (SHARE UPDATE
-- EXCLUSIVE: producers and the relay go on). A constraint an old row still
-- breaks stays NOT VALID (it is enforced for new rows all the same), with a
-- warning. Returns how many stay NOT VALID; NULL when this role does not own
-- the table (only the owner may validate).
CREATE OR REPLACE FUNCTION urutan_outbox_sahkan() RETURNS INT LANGUAGE plpgsql AS $$
DECLARE
    v_tabel REGCLASS := to_regclass(format('%I.outbox', current_schema()));
    v_sisa  INT := 0;
    r RECORD;
BEGIN
    IF v_tabel IS NULL
       OR NOT pg_has_role((SELECT relowner FROM pg_class WHERE oid = v_tabel), 'USAGE') THEN
        RETURN NULL;
    END IF;
    FOR r IN
        SELECT conname FROM pg_constraint
        WHERE conrelid = v_tabel AND contype = 'c' AND NOT convalidated
          AND conname IN ('outbox_agregat_id_sah', 'outbox_routing_key_sah',
                          'outbox_payload_sah', 'outbox_alasan_sisih_sah')
        ORDER BY conname
    LOOP
        BEGIN
            EXECUTE format('ALTER TABLE %s VALIDATE CONSTRAINT %I', v_tabel, r.conname);
        EXCEPTION WHEN check_violation THEN
            v_sisa := v_sisa + 1;
            RAISE WARNING 'urutan: outbox constraint % stays NOT VALID: a row written before it breaks it (it is enforced for new rows)',
                r.conname
                USING HINT = 'sent rows expire with their partition (OUTBOX_RETENTION); `urutan migrate` validates it again';
        END;
    END LOOP;
    RETURN v_sisa;
END
$$;
COMMENT ON FUNCTION urutan_outbox_sahkan() IS 'Validates (sahkan) the outbox CHECK constraints of migration 0038 added NOT VALID, without blocking writes; one an old row breaks stays NOT VALID, with a warning. Returns how many stay NOT VALID, NULL if this role does not own outbox. Called by urutan migrate.';
-- SECURITY INVOKER: only the table's owner validates; any other role gets
-- NULL (so `urutan migrate` may run as any role), hence no REVOKE.
