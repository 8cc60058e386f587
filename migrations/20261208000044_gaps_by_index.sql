-- Issue 43, the rest of it:
--
-- 1. Versions waiting for a gap are released through an index, not a scan.
--    With GAP_POLICY=wait, every release call (urutan_lepas, every 200 ms per
--    shard with anything parked) read every parked row of its shard and
--    joined each with its order to find the few that may go; 5,000 rows
--    planted by a producer above a gap (v3 of orders that have v1) made a
--    call 7 -> 50 ms. Such a row cannot go before its order changes: its
--    stored version reaches versi - 1, or an operator skips what is missing
--    (`urutan hold release`). So it is marked when it parks
--    (urutan_parkir.celah, by the trigger urutan_parkir_celah) and unmarked
--    by what changes its order (urutan_pesanan_maju on pesanan,
--    urutan_lewati_celah on urutan_lewati), each under the order's lock;
--    the release step reads only unmarked rows, through
--    urutan_parkir_lepas_idx. Rows parked before this migration are
--    unmarked: looked at by every release call until they go, as before.
--
-- 2. Dead-letter records per (entity id, message id): the unresolved key
--    was the delivery key (the message id) alone, so a second order's
--    message dead-lettered with the same id was absorbed by the first's
--    record. Now one unresolved record per (delivery key, order id); a
--    record without an order id ('' in the index) as before. The old
--    records are unique by key alone, so by the pair too: nothing to move.
--
-- 3. A message's traceparent is looked up by (order id, message id): the
--    worker lists it in `urutan.apply_traces` (lines "\n<order id>\t<message
--    id>\t<traceparent>"). `urutan.apply_traceparents` (by message id alone)
--    is still read, for a worker of the previous version during a rolling
--    upgrade.
--
-- 4. The worker role may read pesan_diproses_awal (see below).

-- ---------------------------------------------------------------------------
-- 1. Rows waiting for a gap, marked
-- ---------------------------------------------------------------------------

ALTER TABLE urutan_parkir ADD COLUMN IF NOT EXISTS celah BOOLEAN NOT NULL DEFAULT false;
COMMENT ON COLUMN urutan_parkir.celah IS
    'Waits for a gap (celah) below it (GAP_POLICY=wait): it cannot go before its order''s stored version reaches versi - 1 or an operator skips the missing version, and the release step does not read it (urutan_parkir_lepas_idx). Unmarked by what changes its order (triggers urutan_pesanan_maju, urutan_lewati_celah) and by a release with GAP_POLICY=apply.';

CREATE INDEX IF NOT EXISTS urutan_parkir_lepas_idx ON urutan_parkir (shard, pesanan_id) WHERE NOT celah;
COMMENT ON INDEX urutan_parkir_lepas_idx IS
    'The parked rows the release step (urutan_lepas) looks at: those not waiting for a gap.';
CREATE INDEX IF NOT EXISTS urutan_parkir_celah_idx ON urutan_parkir (pesanan_id, versi) WHERE celah;
COMMENT ON INDEX urutan_parkir_celah_idx IS
    'The rows waiting for a gap, per order and version: what a change of the order unmarks.';

-- Marks a row that parks waiting for a gap. Runs inside urutan_terapkan,
-- under the order's lock: the stored version it reads is the latest.
CREATE OR REPLACE FUNCTION urutan_parkir_celah() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    NEW.celah := urutan_celah_tunggu() AND NEW.jatuh_tempo IS NULL
                 AND NEW.versi > coalesce((SELECT p.versi FROM pesanan p
                                           WHERE p.id = NEW.pesanan_id), 0) + 1;
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION urutan_parkir_celah() IS
    'Trigger on urutan_parkir: marks (celah) a version parked above a gap with GAP_POLICY=wait (above its order''s stored version + 1, not set aside): the release step does not read it until its order changes.';
DROP TRIGGER IF EXISTS urutan_parkir_celah ON urutan_parkir;
CREATE TRIGGER urutan_parkir_celah BEFORE INSERT ON urutan_parkir
    FOR EACH ROW EXECUTE FUNCTION urutan_parkir_celah();
COMMENT ON TRIGGER urutan_parkir_celah ON urutan_parkir IS
    'Marks a version parked above a gap (urutan_parkir_celah).';

-- Unmarks the rows an order's new stored version lets go (versi <= stored
-- + 1), once per statement: every writer of pesanan (urutan_tulis, the
-- set-based batch) holds the order's lock. With nothing marked, one probe
-- of an empty partial index.
CREATE OR REPLACE FUNCTION urutan_pesanan_maju() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE urutan_parkir u SET celah = false
    FROM baru b
    WHERE u.celah AND u.pesanan_id = b.id AND u.versi <= b.versi + 1;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION urutan_pesanan_maju() IS
    'Statement trigger on pesanan (maju: moves forward): unmarks the parked versions waiting for a gap that the orders'' new stored versions close (versi <= stored + 1), so the release step reads them again.';
DROP TRIGGER IF EXISTS urutan_pesanan_maju_baru ON pesanan;
CREATE TRIGGER urutan_pesanan_maju_baru AFTER INSERT ON pesanan
    REFERENCING NEW TABLE AS baru FOR EACH STATEMENT EXECUTE FUNCTION urutan_pesanan_maju();
COMMENT ON TRIGGER urutan_pesanan_maju_baru ON pesanan IS
    'A new order''s parked versions waiting for a gap it closes are read again (urutan_pesanan_maju).';
DROP TRIGGER IF EXISTS urutan_pesanan_maju_ubah ON pesanan;
CREATE TRIGGER urutan_pesanan_maju_ubah AFTER UPDATE ON pesanan
    REFERENCING NEW TABLE AS baru FOR EACH STATEMENT EXECUTE FUNCTION urutan_pesanan_maju();
COMMENT ON TRIGGER urutan_pesanan_maju_ubah ON pesanan IS
    'An order''s parked versions waiting for a gap its new version closes are read again (urutan_pesanan_maju).';

-- Unmarks an order's rows when an operator skips its missing or refused
-- version (urutan_lepaskan, under the order's lock): the rows parked before
-- the skip may go past the gap (urutan_celah_dilewati). SECURITY DEFINER:
-- the operator's role may skip, not write urutan_parkir.
CREATE OR REPLACE FUNCTION urutan_lewati_celah() RETURNS TRIGGER
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF NEW.alasan IN ('gap', 'refused') THEN
        UPDATE urutan_parkir u SET celah = false
        WHERE u.celah AND u.pesanan_id = NEW.pesanan_id AND u.diparkir_pada <= NEW.dilewati_pada;
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION urutan_lewati_celah() IS
    'Trigger on urutan_lewati: a skipped missing or refused version (`urutan hold release`) lets the order''s versions parked before it go past the gap: they are unmarked, and the release step reads them again. SECURITY DEFINER.';
DROP TRIGGER IF EXISTS urutan_lewati_celah ON urutan_lewati;
CREATE TRIGGER urutan_lewati_celah AFTER INSERT ON urutan_lewati
    FOR EACH ROW EXECUTE FUNCTION urutan_lewati_celah();
COMMENT ON TRIGGER urutan_lewati_celah ON urutan_lewati IS
    'A skip unmarks the order''s versions waiting for the gap (urutan_lewati_celah).';

-- Migration 0037's release, reading only unmarked rows; with
-- GAP_POLICY=apply it first unmarks its shard's rows (marked by a run with
-- =wait: under =apply they go by their epoch).
CREATE OR REPLACE FUNCTION urutan_lepas(p_shard integer, p_batas integer, p_min double precision, p_max double precision, p_maks integer, p_tahan boolean, p_satu boolean) RETURNS TABLE(message_id text, hasil text, tunggu double precision, pertama boolean, alasan text, galat text, pesan jsonb, pesanan_id text)
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_selesai BIGINT := urutan_epoch_selesai();
    v_bebas   BOOLEAN;  -- no window open: an epoch every shard passed is enough
    v_celah   BOOLEAN := urutan_celah_tunggu();
    v_versi   BIGINT;
    v_id      TEXT;
    v_event   JSONB;
    v_state   TEXT;
    v_teks    TEXT;
    g RECORD;
    r RECORD;
BEGIN
    IF v_selesai IS NULL THEN
        RETURN;
    END IF;
    UPDATE urutan_jendela SET ditutup_pada = now()
    WHERE ditutup_pada IS NULL AND epoch <= v_selesai;
    v_bebas := NOT urutan_jendela_terbuka(v_selesai);
    IF NOT v_celah THEN
        UPDATE urutan_parkir u SET celah = false WHERE u.celah AND u.shard = p_shard;
    END IF;
    FOR v_id IN
        SELECT DISTINCT u.pesanan_id FROM urutan_parkir u LEFT JOIN pesanan p ON p.id = u.pesanan_id
        WHERE u.shard = p_shard AND NOT u.celah
          AND ((v_bebas AND u.epoch <= v_selesai
                AND NOT urutan_menunggu_kembali(u.pesanan_id, u.versi, p.versi)
                AND (NOT v_celah OR urutan_celah_dilewati(u.pesanan_id, u.diparkir_pada)))
               OR u.versi <= coalesce(p.versi, 0) + 1)
          -- A held order waits; only the message holding it (replayed, then
          -- set aside after a transient failure) may be tried.
          AND NOT EXISTS (SELECT 1 FROM urutan_tahan t WHERE t.pesanan_id = u.pesanan_id
                                                        AND t.message_id IS DISTINCT FROM u.message_id)
          AND NOT EXISTS (SELECT 1 FROM urutan_parkir w
                          WHERE w.pesanan_id = u.pesanan_id AND w.jatuh_tempo > now())
        ORDER BY u.pesanan_id LIMIT p_batas
    LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(v_id, 7261));
        SELECT p.versi INTO v_versi FROM pesanan p WHERE p.id = v_id;
        pertama := true;
        FOR r IN SELECT * FROM urutan_parkir u WHERE u.pesanan_id = v_id
                 ORDER BY u.versi, u.seq LOOP
            EXIT WHEN r.versi > coalesce(v_versi, 0) + 1
                      AND NOT (v_bebas AND r.epoch <= v_selesai
                               AND NOT urutan_menunggu_kembali(v_id, r.versi, v_versi)
                               AND (NOT v_celah OR urutan_celah_dilewati(v_id, r.diparkir_pada)));
            EXIT WHEN r.jatuh_tempo > now();
            EXIT WHEN EXISTS (SELECT 1 FROM urutan_tahan t
                              WHERE t.pesanan_id = v_id AND t.message_id IS DISTINCT FROM r.message_id);
            message_id := r.message_id;
            pesanan_id := v_id;
            tunggu := extract(epoch FROM now() - r.diparkir_pada);
            v_event := coalesce(r.pesan,
                                jsonb_build_object('message_id', r.message_id, 'id', r.pesanan_id,
                                                   'status', r.status, 'versi', r.versi)
                                || CASE WHEN r.data IS NULL THEN '{}'::jsonb
                                        ELSE jsonb_build_object('data', r.data) END);
            alasan := NULL;
            galat := NULL;
            pesan := NULL;
            BEGIN
                hasil := urutan_tulis(v_event, r.shard, r.epoch);
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_teks = MESSAGE_TEXT;
                SELECT * INTO g FROM urutan_lepas_gagal(r.message_id, v_id, v_state, v_teks,
                                                        p_min, p_max, p_maks, p_tahan);
                IF g.hasil IS NULL THEN
                    RAISE;
                END IF;
                hasil := g.hasil;
                alasan := g.alasan;
                galat := g.galat;
                pesan := g.pesan;
                RETURN NEXT;
                EXIT;
            END;
            IF hasil = 'applied' THEN
                v_versi := r.versi;
            END IF;
            -- The message holding its order is through: the hold ends.
            DELETE FROM urutan_tahan t WHERE t.pesanan_id = v_id AND t.message_id = r.message_id;
            DELETE FROM urutan_parkir u WHERE u.seq = r.seq;
            RETURN NEXT;
            IF p_satu THEN
                RETURN;
            END IF;
            pertama := false;
        END LOOP;
        IF p_satu AND message_id IS NOT NULL THEN
            RETURN;
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION urutan_lepas(INT, INT, DOUBLE PRECISION, DOUBLE PRECISION, INT, BOOLEAN, BOOLEAN) IS 'Releases (lepas) the parked and due set-aside messages of a shard, each version in a subtransaction: applied, stale, retry (set aside again) or refused (out of the sequence; the order held if p_tahan); with p_satu, one version per call. Each row names its message and its order (pesanan_id). Reads only the rows not waiting for a gap (urutan_parkir.celah), through urutan_parkir_lepas_idx.';

-- ---------------------------------------------------------------------------
-- 2. One unresolved dead-letter record per (delivery key, order)
-- ---------------------------------------------------------------------------

DROP INDEX IF EXISTS urutan_dead_letter_unresolved_key;
CREATE UNIQUE INDEX urutan_dead_letter_unresolved_key
    ON urutan_dead_letter (delivery_key, (coalesce(pesanan_id, ''))) WHERE resolved_at IS NULL;
COMMENT ON INDEX urutan_dead_letter_unresolved_key IS
    'One unresolved record per message: per (delivery key, order id), since dedup is per (order, message id); '''' for a record without an order id. A redelivery''s second record is absorbed.';

-- ---------------------------------------------------------------------------
-- 3. Traceparents per (order, message id)
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION urutan_traceparent_applied(p_id TEXT, p_message_id TEXT) RETURNS TEXT
LANGUAGE sql STABLE AS $$
    SELECT substr(m, p + length(k), 55)
    FROM (SELECT current_setting('urutan.apply_traces', true) AS m,
                 E'\n' || p_id || E'\t' || p_message_id || E'\t' AS k) s,
         LATERAL (SELECT strpos(s.m, s.k) AS p) q
    WHERE q.p > 0
$$;
COMMENT ON FUNCTION urutan_traceparent_applied(TEXT, TEXT) IS
    'The traceparent the worker listed for a message of order p_id in the transaction-local setting urutan.apply_traces (lines "\n<order id>\t<message id>\t<traceparent>"), or NULL.';
COMMENT ON FUNCTION urutan_traceparent_applied(TEXT) IS
    'The traceparent a worker of the previous version listed for a message in urutan.apply_traceparents (lines "\n<message id>\t<traceparent>"), or NULL: read only during a rolling upgrade (the current worker lists them per order, urutan_traceparent_applied(TEXT, TEXT)).';

CREATE OR REPLACE FUNCTION urutan_parkir_jejak() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    NEW.traceparent := coalesce(NEW.traceparent,
                                urutan_traceparent_applied(NEW.pesanan_id, NEW.message_id),
                                urutan_traceparent_applied(NEW.message_id));
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION urutan_parkir_jejak() IS 'Trigger on urutan_parkir (jejak: trace): a parked or set-aside version keeps the traceparent the worker listed for its (order, message id) in urutan.apply_traces.';

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
           coalesce(urutan_traceparent_applied(e.pesanan_id, e.message_id),
                    urutan_traceparent_applied(e.message_id),
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
COMMENT ON FUNCTION urutan_efek_catat_pernyataan() IS 'Statement trigger on pesanan_riwayat (catat: record; pernyataan: statement): records the effects of the statement''s new history rows (transition table baru), one per matching endpoint, with the state each version wrote and the apply span''s traceparent, looked up by (order, message id) (the parked row''s, for a version applied later from urutan_parkir). One call per statement: with no route it reads urutan_efek_rute once. SECURITY DEFINER.';

-- ---------------------------------------------------------------------------
-- 4. urutan_klaim_lama (migration 0037) reads the default partition
--    pesan_diproses_awal itself, which a role granted only pesan_diproses
--    (deploy/postgres/least-privilege.sql's worker) may not read: every stale
--    version and every set-aside failed with "permission denied", and its
--    shard waited on it for good. Whoever may read pesan_diproses may read it.
-- ---------------------------------------------------------------------------
DO $$
DECLARE
    r RECORD;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee::regrole AS rolle
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.oid = 'pesan_diproses'::regclass AND a.privilege_type = 'SELECT'
          AND a.grantee <> 0 AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT ON pesan_diproses_awal TO %s', r.rolle);
    END LOOP;
END
$$;

-- ---------------------------------------------------------------------------
-- SECURITY DEFINER functions replaced or added above: this schema, then
-- pg_temp (migration 0016), and not PUBLIC's to run (migration 0039).
-- ---------------------------------------------------------------------------
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.prosecdef AND p.pronamespace = current_schema()::regnamespace
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
