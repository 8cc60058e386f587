-- Issue 34, traces (docs/contract.md section 12): a W3C `traceparent` is
-- carried from the producer's outbox row through the relay's publish (AMQP
-- header), the apply and the webhook request (HTTP header).
--
-- 1. outbox.traceparent: the producer's trace context. A producer that
--    inserts rows sets the column; one that calls urutan_enqueue (whose
--    2-5 argument calls are unchanged) sets the transaction-local setting
--    first:
--        SELECT set_config('urutan.traceparent', '00-<trace>-<span>-01', true);
--        SELECT urutan_enqueue('P-1', 'dibayar', 3);
--    The column's default reads that setting (urutan_traceparent_producer).
--    NULL, or a value that is not a valid traceparent: the relay starts a
--    new trace.
-- 2. urutan_efek.traceparent: the apply span of the version whose effect
--    it is, so that the webhook request (sent later, by `urutan effects`)
--    continues that trace. The worker lists the traceparent of each message
--    of its apply transaction in the transaction-local setting
--    `urutan.apply_traceparents` (lines "\n<message id>\t<traceparent>");
--    the effect trigger looks its message up there
--    (urutan_traceparent_applied). An effect recorded without one (a
--    parked version released later) gets a new trace at its webhook.
--
-- Re-runnable: IF NOT EXISTS / CREATE OR REPLACE.

-- The producer's setting, if it is a version-00 traceparent (else NULL).
CREATE OR REPLACE FUNCTION urutan_traceparent_producer() RETURNS TEXT
LANGUAGE sql STABLE AS $$
    SELECT v FROM (SELECT current_setting('urutan.traceparent', true) AS v) s
    WHERE v ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
$$;

ALTER TABLE outbox ADD COLUMN IF NOT EXISTS traceparent TEXT;
ALTER TABLE outbox ALTER COLUMN traceparent SET DEFAULT urutan_traceparent_producer();

ALTER TABLE urutan_efek ADD COLUMN IF NOT EXISTS traceparent TEXT;

-- The traceparent the worker listed for message p_message_id in this
-- transaction's `urutan.apply_traceparents` (NULL if none).
CREATE OR REPLACE FUNCTION urutan_traceparent_applied(p_message_id TEXT) RETURNS TEXT
LANGUAGE sql STABLE AS $$
    SELECT substr(m, p + length(k), 55)
    FROM (SELECT current_setting('urutan.apply_traceparents', true) AS m,
                 E'\n' || p_message_id || E'\t' AS k) s,
         LATERAL (SELECT strpos(s.m, s.k) AS p) q
    WHERE q.p > 0
$$;

-- Migration 0009's trigger, recording the apply span's traceparent.
CREATE OR REPLACE FUNCTION urutan_efek_catat() RETURNS TRIGGER
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_versi BIGINT;
    v_data  JSONB;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM urutan_efek_rute WHERE status IN (NEW.status, '*')) THEN
        RETURN NULL;
    END IF;
    SELECT versi, data INTO v_versi, v_data FROM pesanan WHERE id = NEW.pesanan_id;
    -- Every apply path writes the state before its history row; anything
    -- else would send another version's data: refuse loudly.
    IF v_versi IS DISTINCT FROM NEW.versi THEN
        RAISE EXCEPTION 'urutan: the effect of % version % cannot see its data (stored version %)',
            NEW.pesanan_id, NEW.versi, v_versi;
    END IF;
    INSERT INTO urutan_efek (pesanan_id, versi, tujuan, message_id, isi, traceparent)
    SELECT DISTINCT NEW.pesanan_id, NEW.versi, r.tujuan, NEW.message_id,
           jsonb_build_object('id', NEW.pesanan_id, 'status', NEW.status, 'versi', NEW.versi)
           || CASE WHEN v_data IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('data', v_data) END,
           urutan_traceparent_applied(NEW.message_id)
    FROM urutan_efek_rute r
    WHERE r.status IN (NEW.status, '*')
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

-- A SECURITY DEFINER function searches only its own schema (migration 0016).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION urutan_efek_catat() SET search_path = %I, pg_temp',
                   current_schema());
END
$$;

COMMENT ON FUNCTION urutan_traceparent_producer() IS
    'Default of outbox.traceparent: the transaction-local setting urutan.traceparent when it is a version-00 W3C traceparent, else NULL (a producer calling urutan_enqueue sets it first to continue its trace).';
COMMENT ON COLUMN outbox.traceparent IS
    'The producer''s W3C trace context (00-<trace id>-<span id>-<flags>), continued by the relay''s publish span; NULL or invalid: a new trace. Defaults to the setting urutan.traceparent.';
COMMENT ON COLUMN urutan_efek.traceparent IS
    'The apply span''s W3C traceparent of the version this effect belongs to: its webhook request continues that trace (NULL: a new trace).';
COMMENT ON FUNCTION urutan_traceparent_applied(TEXT) IS
    'The traceparent the worker listed for a message in the transaction-local setting urutan.apply_traceparents (lines "\n<message id>\t<traceparent>"), or NULL.';
COMMENT ON FUNCTION urutan_efek_catat() IS
    'Trigger on pesanan_riwayat: records the applied version''s effects (catat: record), one per matching endpoint, with the state the version wrote and the apply span''s traceparent. SECURITY DEFINER.';
