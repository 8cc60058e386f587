-- Issue 33, database CPU per message: the effect trigger on pesanan_riwayat
-- fired once per history row (migration 0009's FOR EACH ROW), and each call
-- asked urutan_efek_rute whether an effect was due, even with no route at
-- all: about 4 µs of the batch function's 28 µs per message (measured by
-- disabling it). It now fires once per statement, with the statement's new
-- history rows as a transition table (`baru`): the set-based batch inserts
-- up to PREFETCH history rows in one statement and pays one call; with no
-- route the call ends at its first query.
--
-- What it records is unchanged: per new history row and matching route, one
-- effect with the state the version wrote (every apply path writes the
-- state before its history row, in an earlier statement or earlier in the
-- same one; a stored version other than the row's is refused loudly) and
-- the apply span's traceparent, else the parked row's (migration 0032).
-- Effects are inserted in history order (seq), then endpoint.
--
-- Re-runnable: CREATE OR REPLACE, DROP TRIGGER IF EXISTS.

CREATE OR REPLACE FUNCTION urutan_efek_catat_pernyataan() RETURNS TRIGGER
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_salah RECORD;  -- a new history row whose stored state is another version's
BEGIN
    IF NOT EXISTS (SELECT 1 FROM urutan_efek_rute) THEN
        RETURN NULL;
    END IF;
    SELECT b.pesanan_id, b.versi, p.versi AS tersimpan INTO v_salah
    FROM baru b LEFT JOIN pesanan p ON p.id = b.pesanan_id
    WHERE p.versi IS DISTINCT FROM b.versi
      AND EXISTS (SELECT 1 FROM urutan_efek_rute r WHERE r.status IN (b.status, '*'))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'urutan: the effect of % version % cannot see its data (stored version %)',
            v_salah.pesanan_id, v_salah.versi, v_salah.tersimpan;
    END IF;
    INSERT INTO urutan_efek (pesanan_id, versi, tujuan, message_id, isi, traceparent)
    SELECT e.pesanan_id, e.versi, e.tujuan, e.message_id, e.isi,
           coalesce(urutan_traceparent_applied(e.message_id),
                    (SELECT u.traceparent FROM urutan_parkir u
                     WHERE u.pesanan_id = e.pesanan_id AND u.message_id = e.message_id
                       AND u.traceparent IS NOT NULL
                     LIMIT 1))
    FROM (SELECT DISTINCT ON (b.seq, r.tujuan) b.seq, b.pesanan_id, b.versi, r.tujuan, b.message_id,
                 jsonb_build_object('id', b.pesanan_id, 'status', b.status, 'versi', b.versi)
                 || CASE WHEN p.data IS NULL THEN '{}'::jsonb
                         ELSE jsonb_build_object('data', p.data) END AS isi
          FROM baru b
          JOIN urutan_efek_rute r ON r.status IN (b.status, '*')
          LEFT JOIN pesanan p ON p.id = b.pesanan_id
          ORDER BY b.seq, r.tujuan) e
    ORDER BY e.seq, e.tujuan
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS urutan_efek_catat ON pesanan_riwayat;
DROP TRIGGER IF EXISTS urutan_efek_catat_pernyataan ON pesanan_riwayat;
CREATE TRIGGER urutan_efek_catat_pernyataan AFTER INSERT ON pesanan_riwayat
    REFERENCING NEW TABLE AS baru
    FOR EACH STATEMENT EXECUTE FUNCTION urutan_efek_catat_pernyataan();

-- The row trigger's function: no trigger calls it any more.
DROP FUNCTION IF EXISTS urutan_efek_catat();

-- A SECURITY DEFINER function searches only its own schema (migration 0016).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION urutan_efek_catat_pernyataan() SET search_path = %I, pg_temp',
                   current_schema());
END
$$;

COMMENT ON FUNCTION urutan_efek_catat_pernyataan() IS
    'Statement trigger on pesanan_riwayat (catat: record; pernyataan: statement): records the effects of the statement''s new history rows (transition table baru), one per matching endpoint, with the state each version wrote and the apply span''s traceparent (the parked row''s, for a version applied later from urutan_parkir). One call per statement: with no route it reads urutan_efek_rute once. SECURITY DEFINER.';
COMMENT ON TRIGGER urutan_efek_catat_pernyataan ON pesanan_riwayat IS
    'Records the effects of the applied versions, once per INSERT statement (urutan_efek_catat_pernyataan).';
