-- Effect holds (docs/contract.md sections 5, 6, 8 and 11; EFFECTS_ON_DEAD):
-- with EFFECTS_ON_DEAD=hold (the default) a dead-lettered effect holds its
-- order's LATER effects (reason `effect`), until `urutan dlq replay
-- --effects ID` sends it or `urutan hold release ORDER_ID --effects` skips
-- it. With `skip` the order's next effect goes, as before this migration.
--
-- Design: the hold is recorded on the dead-lettered effect itself
-- (`urutan_efek.ditahan_sejak`, when the hold began), not as a row of
-- `urutan_tahan`. That table keys on the order (one hold per order) and
-- every apply path (`urutan_terapkan`, `urutan_lepas`) parks the versions
-- of any order in it; an effect hold must stop only effects: the order's
-- versions keep being applied, and their effects are recorded and wait.
--
-- - The dispatcher's result (`urutan_efek_hasil` with p_tahan) sets
--   `ditahan_sejak` when it dead-letters an effect under `hold`, and says
--   whether that made a new hold (`urutan_holds_total{reason="effect"}`).
--   So the hold is a fact in the database: `urutan hold list`, `urutan
--   status`, `urutan explain` and the `urutan_orders_held` gauge read it
--   and need no setting, and every dispatcher's claim respects it, whatever
--   its own EFFECTS_ON_DEAD (the setting decides only whether a new dead
--   letter holds).
-- - An order is effect-held while one of its effects has `ditahan_sejak`
--   set and is dead-lettered (`gagal`) or being sent again after a replay
--   (`menunggu`: the hold stays until it is sent). The claim
--   (`urutan_efek_klaim`) takes no pending effect of an order that comes
--   after, in (versi, tujuan) order, a dead-lettered holding effect: the
--   order leaves the schedule `urutan_efek_kepala` (a replay, a release or
--   a new effect puts it back, and a claim that finds it still held takes
--   it out again).
-- - The hold ends when the effect is sent (2xx: cleared), when it is
--   dead-lettered again by a dispatcher with `skip` (cleared), or when an
--   operator releases it (`urutan_efek_lepaskan`: cleared, the skip
--   recorded in `urutan_lewati` with alasan `effect`, the effect's version
--   and error; the effect stays dead-lettered). A replay keeps it: a replayed
--   effect that is dead-lettered again still holds.

ALTER TABLE urutan_efek ADD COLUMN IF NOT EXISTS ditahan_sejak TIMESTAMPTZ;
CREATE INDEX IF NOT EXISTS urutan_efek_ditahan_idx ON urutan_efek (pesanan_id, versi, tujuan)
    WHERE ditahan_sejak IS NOT NULL;

-- Migration 0011's claim, with effect holds: an order whose first pending
-- effect comes after a dead-lettered holding effect is held and leaves
-- the schedule.
CREATE OR REPLACE FUNCTION urutan_efek_klaim(p_batas INT, p_sewa FLOAT8, p_oleh TEXT)
RETURNS TABLE (efek BIGINT, pesanan_id TEXT, versi BIGINT, message_id TEXT, isi TEXT,
               url TEXT, percobaan INT)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_order  TEXT;
    v_head   BIGINT;
    v_versi  BIGINT;
    v_tujuan INT;
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
            SELECT e.efek, e.versi, e.tujuan, greatest(e.coba_pada, e.sewa_sampai)
            INTO v_head, v_versi, v_tujuan, v_due
            FROM urutan_efek e
            WHERE e.pesanan_id = v_order AND e.keadaan = 'menunggu'
            ORDER BY e.versi, e.tujuan
            LIMIT 1;
            IF NOT FOUND OR EXISTS (
                SELECT 1 FROM urutan_efek d
                WHERE d.pesanan_id = v_order AND d.ditahan_sejak IS NOT NULL
                  AND d.keadaan = 'gagal' AND (d.versi, d.tujuan) < (v_versi, v_tujuan)) THEN
                -- Nothing pending, or held: out of the schedule.
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

-- Records the result of attempt p_percobaan of effect p_efek, as migration
-- 0011's function did, and with p_tahan (EFFECTS_ON_DEAD=hold) a dead
-- letter holds the order's later effects. Returns `lost` (that claim was
-- lost meanwhile), `recorded`, or `held` (a dead letter that made a new
-- hold: the order had none).
CREATE OR REPLACE FUNCTION urutan_efek_hasil(
    p_efek BIGINT, p_percobaan INT, p_keadaan TEXT, p_kode INT, p_jawaban TEXT,
    p_setelah FLOAT8, p_tahan BOOLEAN)
RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    v_order   TEXT;
    v_ditahan BOOLEAN;
BEGIN
    SELECT e.pesanan_id INTO v_order FROM urutan_efek e WHERE e.efek = p_efek;
    IF NOT FOUND THEN
        RETURN 'lost';
    END IF;
    INSERT INTO urutan_efek_kepala AS k (pesanan_id, siap_pada) VALUES (v_order, now())
    ON CONFLICT (pesanan_id) DO UPDATE SET siap_pada = k.siap_pada WHERE false;
    v_ditahan := EXISTS (SELECT 1 FROM urutan_efek d
                         WHERE d.pesanan_id = v_order AND d.ditahan_sejak IS NOT NULL
                           AND d.keadaan IN ('gagal', 'menunggu'));
    UPDATE urutan_efek e
    SET keadaan = p_keadaan, kode = p_kode, jawaban = p_jawaban,
        sewa_sampai = NULL, sewa_oleh = NULL,
        coba_pada = now() + make_interval(secs => p_setelah),
        selesai_pada = CASE WHEN p_keadaan = 'menunggu' THEN NULL ELSE now() END,
        ditahan_sejak = CASE WHEN p_keadaan = 'menunggu' THEN e.ditahan_sejak
                             WHEN p_keadaan = 'gagal' AND p_tahan
                                 THEN coalesce(e.ditahan_sejak, now())
                        END
    WHERE e.efek = p_efek AND e.percobaan = p_percobaan AND e.keadaan = 'menunggu';
    IF NOT FOUND THEN
        RETURN 'lost';
    END IF;
    UPDATE urutan_efek_kepala k
    SET siap_pada = now() + make_interval(secs => p_setelah)
    WHERE k.pesanan_id = v_order;
    IF p_keadaan = 'gagal' AND p_tahan AND NOT v_ditahan THEN
        RETURN 'held';
    END IF;
    RETURN 'recorded';
END
$$;

-- The previous signature, for dispatchers of the previous version during a
-- rolling upgrade: their dead letters hold nothing (as before).
CREATE OR REPLACE FUNCTION urutan_efek_hasil(
    p_efek BIGINT, p_percobaan INT, p_keadaan TEXT, p_kode INT, p_jawaban TEXT,
    p_setelah FLOAT8)
RETURNS BOOLEAN LANGUAGE sql AS $$
    SELECT urutan_efek_hasil(p_efek, p_percobaan, p_keadaan, p_kode, p_jawaban, p_setelah,
                             false) <> 'lost'
$$;

-- Ends the effect hold of order p_id without its dead-lettered effect
-- (`urutan hold release ORDER_ID --effects`): each dead-lettered effect
-- holding it stops holding (it stays dead-lettered) and is recorded as a
-- skip; the order is due again, so its later effects go on in order.
-- Returns the skipped effects, none if the order has no dead-lettered
-- holding effect.
CREATE OR REPLACE FUNCTION urutan_efek_lepaskan(p_id TEXT)
RETURNS TABLE (efek BIGINT, versi BIGINT, message_id TEXT, galat TEXT,
               ditahan_sejak TIMESTAMPTZ, menunggu BIGINT)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r RECORD;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM urutan_efek e
                   WHERE e.pesanan_id = p_id AND e.ditahan_sejak IS NOT NULL
                     AND e.keadaan = 'gagal') THEN
        RETURN;
    END IF;
    -- The order's schedule row is its lock (as for a claim or a result),
    -- and due now: its next effect may go.
    INSERT INTO urutan_efek_kepala AS k (pesanan_id, siap_pada) VALUES (p_id, now())
    ON CONFLICT (pesanan_id) DO UPDATE SET siap_pada = least(k.siap_pada, now());
    FOR r IN SELECT e.efek, e.versi, e.message_id, e.kode, e.jawaban, e.ditahan_sejak
             FROM urutan_efek e
             WHERE e.pesanan_id = p_id AND e.ditahan_sejak IS NOT NULL AND e.keadaan = 'gagal'
             ORDER BY e.versi, e.tujuan
             FOR UPDATE
    LOOP
        UPDATE urutan_efek e SET ditahan_sejak = NULL WHERE e.efek = r.efek;
        efek := r.efek;
        versi := r.versi;
        message_id := r.message_id;
        ditahan_sejak := r.ditahan_sejak;
        galat := format('effect %s: %s', r.efek,
                        CASE WHEN r.kode IS NULL THEN coalesce(r.jawaban, 'no answer')
                             ELSE format('HTTP %s: %s', r.kode, coalesce(r.jawaban, '')) END);
        INSERT INTO urutan_lewati (pesanan_id, versi, message_id, alasan, galat, ditahan_sejak)
        VALUES (p_id, r.versi, r.message_id, 'effect', galat, r.ditahan_sejak);
        menunggu := (SELECT count(*) FROM urutan_efek w
                     WHERE w.pesanan_id = p_id AND w.keadaan = 'menunggu');
        RETURN NEXT;
    END LOOP;
END
$$;

COMMENT ON COLUMN urutan_efek.ditahan_sejak IS
    'When this dead-lettered effect began to hold its order''s later effects (ditahan sejak: held since; EFFECTS_ON_DEAD=hold); NULL: it holds nothing. Kept while a replay sends it again; cleared when it is sent, released (`urutan hold release --effects`) or dead-lettered again under skip.';
COMMENT ON INDEX urutan_efek_ditahan_idx IS
    'The effects that hold their order (few): the claim''s hold check, `urutan hold list` and the held gauge.';
COMMENT ON FUNCTION urutan_efek_klaim(INT, DOUBLE PRECISION, TEXT) IS
    'The dispatcher''s claim (klaim): leases up to p_batas due effects, the first pending one of each due order not held by a dead-lettered effect, for p_sewa seconds to p_oleh, from the schedule (urutan_efek_kepala).';
COMMENT ON FUNCTION urutan_efek_hasil(BIGINT, INTEGER, TEXT, INTEGER, TEXT, DOUBLE PRECISION, BOOLEAN) IS
    'Records an attempt''s result (hasil) under its claim: sent, retry later or dead-lettered; with p_tahan a dead letter holds the order''s later effects. Returns lost, recorded or held (a new hold).';
COMMENT ON FUNCTION urutan_efek_hasil(BIGINT, INTEGER, TEXT, INTEGER, TEXT, DOUBLE PRECISION) IS
    'The result of the previous version''s dispatchers (rolling upgrades): as the 7-argument one without holds; false if the claim was lost.';
COMMENT ON FUNCTION urutan_efek_lepaskan(TEXT) IS
    'Ends an order''s effect hold without its dead-lettered effect (lepaskan: let go; `urutan hold release --effects`): the effect stays dead-lettered, the skip is recorded in urutan_lewati (alasan effect), the later effects go on in order.';
