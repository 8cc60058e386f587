-- Issue 31, part 5 (docs/contract.md section 11): gaps can wait.
--
-- With GAP_POLICY=wait (the session option `urutan.gap` = 'wait', set by
-- the worker's connection URL) a version above stored + 1 parks until the
-- versions between are applied: urutan_terapkan parks it, and the release
-- step (urutan_lepas) lets a parked version go only once it is next
-- (versi = stored + 1), never past a gap. The default (`apply`) keeps the
-- previous rule: once no older version can be on its way from another
-- shard (no ring window open, no returned message), a parked version is
-- applied past any gap.
--
-- A missing version not applied within GAP_TIMEOUT holds its order
-- (urutan_tahan, reason 'gap', versi = the missing version, no message):
-- urutan_tahan_celah, called by each shard's worker about once a second.
-- The missing version arriving after all ends the hold (urutan_terapkan
-- lets it through); `urutan hold release` ends it without that version
-- (urutan_lepaskan records the skip in urutan_lewati) and the versions
-- that waited are then applied in order past the gap: a parked row may go
-- past a gap when a skip of its order (a missing or a refused version) was
-- recorded after it parked (urutan_celah_dilewati).

-- True when this session waits for missing versions (GAP_POLICY=wait).
CREATE OR REPLACE FUNCTION urutan_celah_tunggu() RETURNS BOOLEAN
LANGUAGE sql STABLE AS $$
    SELECT coalesce(current_setting('urutan.gap', true), '') = 'wait'
$$;

-- True when `urutan hold release` ended a hold of order p_id (a missing
-- or a refused version, skipped) after a version of it parked at
-- p_diparkir: that version may go past the gap the skip leaves.
CREATE OR REPLACE FUNCTION urutan_celah_dilewati(p_id TEXT, p_diparkir TIMESTAMPTZ)
RETURNS BOOLEAN LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM urutan_lewati l
                   WHERE l.pesanan_id = p_id AND l.alasan IN ('gap', 'refused')
                     AND l.dilewati_pada >= p_diparkir)
$$;

-- Holds the orders of shard p_shard whose next version has been missing
-- for longer than p_batas: their lowest parked version is above stored + 1
-- and has waited that long. Returns the orders held and their missing
-- version.
CREATE OR REPLACE FUNCTION urutan_tahan_celah(p_shard INT, p_batas INTERVAL)
RETURNS TABLE (pesanan_id TEXT, versi BIGINT, menunggu BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    r RECORD;
BEGIN
    FOR r IN
        SELECT u.pesanan_id AS id, coalesce(p.versi, 0) + 1 AS hilang, min(u.versi) AS terendah,
               count(*) AS n, min(u.diparkir_pada) AS sejak
        FROM urutan_parkir u LEFT JOIN pesanan p ON p.id = u.pesanan_id
        WHERE u.shard = p_shard
          AND NOT EXISTS (SELECT 1 FROM urutan_tahan t WHERE t.pesanan_id = u.pesanan_id)
        GROUP BY u.pesanan_id, p.versi
        HAVING min(u.versi) > coalesce(p.versi, 0) + 1
           AND min(u.diparkir_pada) < now() - p_batas
        ORDER BY u.pesanan_id
        LIMIT 1000
    LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(r.id, 7261));
        -- Checked again under the order's lock: the missing version may
        -- have been applied meanwhile.
        CONTINUE WHEN coalesce((SELECT p.versi FROM pesanan p WHERE p.id = r.id), 0) + 1 <> r.hilang;
        INSERT INTO urutan_tahan (pesanan_id, alasan, message_id, versi, shard, galat, sejak)
        VALUES (r.id, 'gap', NULL, r.hilang, p_shard,
                format('version %s never arrived (version %s waits since %s)',
                       r.hilang, r.terendah, r.sejak),
                now())
        ON CONFLICT DO NOTHING;
        CONTINUE WHEN NOT FOUND;
        pesanan_id := r.id;
        versi := r.hilang;
        menunggu := r.n;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Migration 0020's urutan_terapkan, with gaps that wait (a version above
-- stored + 1 parks when urutan_celah_tunggu()) and gap holds (the missing
-- version goes through and ends the hold).
CREATE OR REPLACE FUNCTION urutan_terapkan(p_pesan JSONB, p_shard INT)
RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    v_message_id TEXT := p_pesan->>'message_id';
    v_id         TEXT := p_pesan->>'id';
    v_versi_baru BIGINT := (p_pesan->>'versi')::bigint;
    v_posisi BIGINT;  -- epochs this shard has passed: the message's epoch
    v_epoch  BIGINT;  -- epoch of the entity's last applied message (NULL: never seen)
    v_versi  BIGINT;  -- the entity's stored version (NULL: never seen)
    v_tahan  RECORD;  -- the order's hold
    v_ditahan BOOLEAN;  -- the order is held
    v_lewat  BOOLEAN := false;  -- this message is what holds the order: it goes through
    v_hasil  TEXT;
BEGIN
    -- Back after a return (whatever this delivery's outcome).
    DELETE FROM urutan_dikembalikan WHERE message_id = v_message_id AND pesanan_id = v_id;
    INSERT INTO pesan_diproses (message_id, pesanan_id) VALUES (v_message_id, v_id)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN urutan_sudah_diproses(v_message_id, v_id);
    END IF;
    -- One entity at a time across shards (apply, park and release).
    PERFORM pg_advisory_xact_lock(hashtextextended(v_id, 7261));
    SELECT epoch INTO v_posisi FROM urutan_shard WHERE shard = p_shard;
    v_posisi := coalesce(v_posisi, 0);
    SELECT epoch, versi INTO v_epoch, v_versi FROM pesanan WHERE id = v_id;
    SELECT t.alasan, t.message_id INTO v_tahan FROM urutan_tahan t WHERE t.pesanan_id = v_id;
    v_ditahan := FOUND;
    IF v_ditahan THEN
        v_lewat := v_tahan.message_id = v_message_id
                   OR (v_tahan.alasan = 'gap' AND v_versi_baru = coalesce(v_versi, 0) + 1);
    END IF;
    IF (v_ditahan AND NOT v_lewat AND v_versi_baru > coalesce(v_versi, 0))
       OR (NOT v_lewat AND v_versi_baru > coalesce(v_versi, 0) + 1 AND (
           urutan_celah_tunggu()
           OR EXISTS (SELECT 1 FROM urutan_parkir WHERE pesanan_id = v_id AND epoch <= v_posisi)
           OR urutan_jendela_terbuka(v_posisi)
           OR (v_epoch IS DISTINCT FROM v_posisi
               AND v_posisi > coalesce(urutan_epoch_selesai(), v_posisi))
           OR urutan_menunggu_kembali(v_id, v_versi_baru, v_versi))) THEN
        INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, data, shard, epoch, pesan)
        VALUES (v_id, v_message_id, p_pesan->>'status', v_versi_baru, p_pesan->'data',
                p_shard, v_posisi, p_pesan);
        RETURN 'parked';
    END IF;
    v_hasil := urutan_tulis(p_pesan, p_shard, v_posisi);
    IF v_lewat THEN
        DELETE FROM urutan_tahan WHERE pesanan_id = v_id;
    END IF;
    RETURN v_hasil;
END
$$;

-- Migration 0020's batch entry: also message by message when gaps wait.
CREATE OR REPLACE FUNCTION urutan_terapkan_batch(p_pesan JSONB, p_shard INT)
RETURNS TEXT[] LANGUAGE plpgsql AS $$
DECLARE
    v_ids TEXT[] := ARRAY(SELECT e->>'id' FROM jsonb_array_elements(p_pesan) e);
BEGIN
    IF coalesce(current_setting('urutan.handler', true), '') <> ''
       OR urutan_celah_tunggu()
       OR (urutan_efek_aktif()
           AND (SELECT count(DISTINCT id) < count(id) FROM unnest(v_ids) id))
       OR EXISTS (SELECT 1 FROM urutan_dikembalikan WHERE pesanan_id = ANY (v_ids))
       OR EXISTS (SELECT 1 FROM urutan_tahan WHERE pesanan_id = ANY (v_ids)) THEN
        RETURN urutan_terapkan_batch_urut(p_pesan, p_shard);
    END IF;
    RETURN urutan_terapkan_batch_himpun(p_pesan, p_shard);
END
$$;

-- Migration 0020's urutan_lepas, with gaps that wait: with
-- urutan_celah_tunggu() a parked version goes only when it is next, or
-- past a gap an operator released (urutan_celah_dilewati); a gap hold
-- (no holding message) keeps every version of its order waiting.
CREATE OR REPLACE FUNCTION urutan_lepas(p_shard INT, p_batas INT, p_min DOUBLE PRECISION,
                             p_max DOUBLE PRECISION, p_maks INT, p_tahan BOOLEAN)
RETURNS TABLE (message_id TEXT, hasil TEXT, tunggu DOUBLE PRECISION, pertama BOOLEAN,
               alasan TEXT, galat TEXT, pesan JSONB)
LANGUAGE plpgsql AS $$
DECLARE
    v_selesai BIGINT := urutan_epoch_selesai();
    v_bebas   BOOLEAN;  -- no window open: an epoch every shard passed is enough
    v_celah   BOOLEAN := urutan_celah_tunggu();
    v_versi   BIGINT;
    v_id      TEXT;
    v_event   JSONB;
    v_state   TEXT;
    v_teks    TEXT;
    r RECORD;
BEGIN
    IF v_selesai IS NULL THEN
        RETURN;
    END IF;
    UPDATE urutan_jendela SET ditutup_pada = now()
    WHERE ditutup_pada IS NULL AND epoch <= v_selesai;
    v_bebas := NOT urutan_jendela_terbuka(v_selesai);
    FOR v_id IN
        SELECT DISTINCT u.pesanan_id FROM urutan_parkir u LEFT JOIN pesanan p ON p.id = u.pesanan_id
        WHERE u.shard = p_shard
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
                IF urutan_alasan_ulang(v_state) IS NULL
                   AND v_state <> 'URREF' AND left(v_state, 2) NOT IN ('22', '23', '54') THEN
                    RAISE;
                END IF;
                galat := CASE WHEN v_state = 'URREF' THEN v_teks
                              ELSE format('SQLSTATE %s: %s', v_state, v_teks) END;
                alasan := urutan_alasan_ulang(v_state);
                IF alasan IS NOT NULL AND r.percobaan + 1 < p_maks THEN
                    UPDATE urutan_parkir u
                    SET percobaan = r.percobaan + 1, galat = urutan_lepas.galat,
                        jatuh_tempo = now() + urutan_jeda(r.percobaan + 1, p_min, p_max)
                    WHERE u.seq = r.seq;
                    hasil := 'retry';
                ELSE
                    alasan := CASE WHEN alasan IS NOT NULL THEN 'retries_exhausted'
                                   WHEN v_state = 'URREF' THEN 'handler_refused'
                                   ELSE 'database_refused' END;
                    DELETE FROM urutan_parkir u WHERE u.seq = r.seq;
                    DELETE FROM pesan_diproses d WHERE d.message_id = r.message_id;
                    IF p_tahan THEN
                        PERFORM urutan_tahan_tolak(v_id, r.message_id, r.versi, r.shard, galat);
                    END IF;
                    hasil := 'refused';
                    pesan := v_event;
                END IF;
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
            pertama := false;
        END LOOP;
    END LOOP;
END
$$;

COMMENT ON FUNCTION urutan_celah_tunggu() IS
    'True when this session waits for missing versions (celah: gap; GAP_POLICY=wait, the session option urutan.gap).';
COMMENT ON FUNCTION urutan_celah_dilewati(TEXT, TIMESTAMPTZ) IS
    'True when an operator released a hold of the order (a missing or refused version skipped) after the given parking time (`urutan hold release`): that parked version may go past the gap.';
COMMENT ON FUNCTION urutan_tahan_celah(INT, INTERVAL) IS
    'Holds (reason gap) the orders of a shard whose next version has been missing longer than GAP_TIMEOUT; returns each order held, its missing version and how many versions wait.';
