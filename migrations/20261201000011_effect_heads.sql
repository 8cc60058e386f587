-- The effect dispatcher's schedule: one row per order that has (or just
-- had) a pending effect, with the time its first pending effect may go.
--
-- Why: the claim used to find "the first pending effect of its order" by
-- walking every pending effect oldest first and proving, row by row, that
-- no earlier one of its order was pending. When fewer heads were free than
-- the claim asked for (each finished send wakes a claim for its one free
-- slot; the heads of busy orders are in flight or in backoff) it walked the
-- whole backlog for nothing: about 2 s per claim at 37,000 pending in a
-- cluster fault run, and the dispatcher never caught up. With this table a
-- claim reads the orders that are due, soonest first, and stops after
-- `limit` of them: the work is O(limit), whatever the backlog.
--
-- The row of an order is also its lock for scheduling: the claim
-- (`urutan_efek_klaim`), a result (`urutan_efek_hasil`) and an insert of
-- new effects take it before they read or change the order's pending
-- effects, so a claim never deletes the row of an order whose new effect is
-- being committed (the insert waits for the claim, then inserts the row
-- again), and no result is lost between two claims.
--
-- Invariant: every order with a pending effect has a row, and `siap_pada`
-- is no later than the moment its first pending effect may go (it may be
-- earlier: a claim that finds the head not due yet moves `siap_pada` to its
-- due time; one that finds no pending effect deletes the row).
CREATE TABLE IF NOT EXISTS urutan_efek_kepala (
    pesanan_id TEXT PRIMARY KEY,
    siap_pada  TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS urutan_efek_kepala_siap_idx ON urutan_efek_kepala (siap_pada);

-- Effects pending before this migration.
INSERT INTO urutan_efek_kepala (pesanan_id, siap_pada)
SELECT DISTINCT pesanan_id, now() FROM urutan_efek WHERE keadaan = 'menunggu'
ON CONFLICT (pesanan_id) DO NOTHING;

-- New pending effects (every apply path, through `urutan_efek_catat`):
-- their orders get a row, or keep theirs (locked, not changed: see above).
CREATE OR REPLACE FUNCTION urutan_efek_kepala_baru() RETURNS TRIGGER
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO urutan_efek_kepala AS k (pesanan_id, siap_pada)
    SELECT DISTINCT b.pesanan_id, now() FROM baru b WHERE b.keadaan = 'menunggu'
    ORDER BY 1
    ON CONFLICT (pesanan_id) DO UPDATE SET siap_pada = k.siap_pada WHERE false;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER urutan_efek_kepala_baru AFTER INSERT ON urutan_efek
    REFERENCING NEW TABLE AS baru
    FOR EACH STATEMENT EXECUTE FUNCTION urutan_efek_kepala_baru();

-- A settled effect made pending again (`urutan dlq replay --effects`, or by
-- hand): due now. (A replay of several orders locks their rows in its own
-- order; should a batch apply hold two of them in the other order,
-- PostgreSQL aborts one of the two as a deadlock, and the worker retries.)
CREATE OR REPLACE FUNCTION urutan_efek_kepala_lagi() RETURNS TRIGGER
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO urutan_efek_kepala AS k (pesanan_id, siap_pada)
    VALUES (NEW.pesanan_id, now())
    ON CONFLICT (pesanan_id) DO UPDATE SET siap_pada = least(k.siap_pada, now());
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER urutan_efek_kepala_lagi AFTER UPDATE OF keadaan ON urutan_efek
    FOR EACH ROW
    WHEN (OLD.keadaan <> 'menunggu' AND NEW.keadaan = 'menunggu')
    EXECUTE FUNCTION urutan_efek_kepala_lagi();

-- Claims at most p_batas effects for p_sewa seconds on behalf of p_oleh:
-- for each due order (soonest first, rows another transaction holds are
-- skipped), its first pending effect in (versi, tujuan) order, if that one
-- is due and its lease is free. Each statement in the loop runs after the
-- order's row is locked, so it sees every result and insert committed
-- under that lock before. A visited row is claimed, moved to its due time
-- or deleted: either way no longer due, so the passes end, and a claim
-- returns fewer than p_batas only when fewer orders are due.
CREATE OR REPLACE FUNCTION urutan_efek_klaim(p_batas INT, p_sewa FLOAT8, p_oleh TEXT)
RETURNS TABLE (efek BIGINT, pesanan_id TEXT, versi BIGINT, message_id TEXT, isi TEXT,
               url TEXT, percobaan INT)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_order  TEXT;
    v_head   BIGINT;
    v_due    TIMESTAMPTZ;
    v_sampai TIMESTAMPTZ := now() + make_interval(secs => p_sewa);
    v_taken  INT := 0;
    v_seen   INT;
    v_rows   INT;
BEGIN
    IF p_sewa <= 0 THEN
        RAISE EXCEPTION 'urutan: a lease of % s would not hold a claim', p_sewa;
    END IF;
    LOOP
        v_seen := 0;
        FOR v_order IN
            SELECT k.pesanan_id FROM urutan_efek_kepala k
            WHERE k.siap_pada <= now()
            ORDER BY k.siap_pada
            LIMIT p_batas - v_taken
            FOR UPDATE SKIP LOCKED
        LOOP
            v_seen := v_seen + 1;
            SELECT e.efek, greatest(e.coba_pada, e.sewa_sampai) INTO v_head, v_due
            FROM urutan_efek e
            WHERE e.pesanan_id = v_order AND e.keadaan = 'menunggu'
            ORDER BY e.versi, e.tujuan
            LIMIT 1;
            IF NOT FOUND THEN
                DELETE FROM urutan_efek_kepala k WHERE k.pesanan_id = v_order;
            ELSIF v_due > now() THEN
                UPDATE urutan_efek_kepala k SET siap_pada = v_due WHERE k.pesanan_id = v_order;
            ELSE
                UPDATE urutan_efek_kepala k SET siap_pada = v_sampai WHERE k.pesanan_id = v_order;
                RETURN QUERY
                    UPDATE urutan_efek e
                    SET sewa_sampai = v_sampai, sewa_oleh = p_oleh, percobaan = e.percobaan + 1
                    FROM urutan_efek_tujuan t
                    WHERE e.efek = v_head AND t.tujuan = e.tujuan
                      -- Rechecked if a claim outside the schedule (a
                      -- dispatcher older than this migration, during an
                      -- upgrade) leased it meanwhile: then it is not ours.
                      AND e.keadaan = 'menunggu'
                      AND (e.sewa_sampai IS NULL OR e.sewa_sampai <= now())
                    RETURNING e.efek, e.pesanan_id, e.versi, e.message_id, e.isi::text, t.url,
                              e.percobaan;
                GET DIAGNOSTICS v_rows = ROW_COUNT;
                v_taken := v_taken + v_rows;
            END IF;
        END LOOP;
        EXIT WHEN v_seen = 0 OR v_taken >= p_batas;
    END LOOP;
END
$$;

-- Records the result of attempt p_percobaan of effect p_efek: p_keadaan
-- 'terkirim' (sent), 'gagal' (dead-lettered) or 'menunggu' (retry after
-- p_setelah seconds). False if that claim was lost meanwhile (its lease
-- expired and the effect was claimed again, or it is settled). The order's
-- row is locked first (as a claim does) and then made due: now for its
-- next effect, or at the retry.
CREATE OR REPLACE FUNCTION urutan_efek_hasil(
    p_efek BIGINT, p_percobaan INT, p_keadaan TEXT, p_kode INT, p_jawaban TEXT,
    p_setelah FLOAT8)
RETURNS BOOLEAN LANGUAGE plpgsql AS $$
DECLARE
    v_order TEXT;
BEGIN
    SELECT e.pesanan_id INTO v_order FROM urutan_efek e WHERE e.efek = p_efek;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO urutan_efek_kepala AS k (pesanan_id, siap_pada) VALUES (v_order, now())
    ON CONFLICT (pesanan_id) DO UPDATE SET siap_pada = k.siap_pada WHERE false;
    UPDATE urutan_efek e
    SET keadaan = p_keadaan, kode = p_kode, jawaban = p_jawaban,
        sewa_sampai = NULL, sewa_oleh = NULL,
        coba_pada = now() + make_interval(secs => p_setelah),
        selesai_pada = CASE WHEN p_keadaan = 'menunggu' THEN NULL ELSE now() END
    WHERE e.efek = p_efek AND e.percobaan = p_percobaan AND e.keadaan = 'menunggu';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE urutan_efek_kepala k
    SET siap_pada = now() + make_interval(secs => p_setelah)
    WHERE k.pesanan_id = v_order;
    RETURN true;
END
$$;
