-- Issue 34, traces: a version applied later from PostgreSQL keeps its
-- event's trace to the webhook. Such a version was parked (during a ring
-- change, or by GAP_POLICY=wait) or set aside after a transient failure,
-- and urutan_lepas applies it without its delivery. Migration 0028 gave
-- its effect no trace context (its webhook started a new trace).
--
-- 1. urutan_parkir.traceparent: the apply span of the delivery that parked
--    or set the version aside. A BEFORE INSERT trigger takes it from the
--    transaction's `urutan.apply_traceparents`: the worker sets that list
--    in the statement that parks (the apply) or sets aside
--    (urutan_sisihkan).
-- 2. The effect trigger falls back to it. urutan_lepas applies the version
--    before it deletes the parked row, so the row is there when the
--    version's history row fires the trigger.
--
-- Re-runnable: IF NOT EXISTS / CREATE OR REPLACE.

ALTER TABLE urutan_parkir ADD COLUMN IF NOT EXISTS traceparent TEXT;

CREATE OR REPLACE FUNCTION urutan_parkir_jejak() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    NEW.traceparent := coalesce(NEW.traceparent, urutan_traceparent_applied(NEW.message_id));
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS urutan_parkir_jejak ON urutan_parkir;
CREATE TRIGGER urutan_parkir_jejak BEFORE INSERT ON urutan_parkir
    FOR EACH ROW EXECUTE FUNCTION urutan_parkir_jejak();

-- Migration 0028's trigger, falling back to the parked row's context.
CREATE OR REPLACE FUNCTION urutan_efek_catat() RETURNS TRIGGER
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_versi BIGINT;
    v_data  JSONB;
    v_jejak TEXT;
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
    v_jejak := coalesce(urutan_traceparent_applied(NEW.message_id),
                        (SELECT u.traceparent FROM urutan_parkir u
                         WHERE u.pesanan_id = NEW.pesanan_id AND u.message_id = NEW.message_id
                           AND u.traceparent IS NOT NULL
                         LIMIT 1));
    INSERT INTO urutan_efek (pesanan_id, versi, tujuan, message_id, isi, traceparent)
    SELECT DISTINCT NEW.pesanan_id, NEW.versi, r.tujuan, NEW.message_id,
           jsonb_build_object('id', NEW.pesanan_id, 'status', NEW.status, 'versi', NEW.versi)
           || CASE WHEN v_data IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('data', v_data) END,
           v_jejak
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

COMMENT ON COLUMN urutan_parkir.traceparent IS
    'The W3C traceparent of the apply span that parked or set this version aside: the effect of the version, applied later by urutan_lepas, continues that trace.';
COMMENT ON FUNCTION urutan_parkir_jejak() IS
    'Trigger on urutan_parkir (jejak: trace): a parked or set-aside version keeps the traceparent the worker listed for its message in urutan.apply_traceparents.';
COMMENT ON FUNCTION urutan_efek_catat() IS
    'Trigger on pesanan_riwayat: records the applied version''s effects (catat: record), one per matching endpoint, with the state the version wrote and the apply span''s traceparent (the parked row''s, for a version applied later from urutan_parkir). SECURITY DEFINER.';
