-- A version arriving after its order was held for a gap waits for the gap
-- (issue 44). A gap hold (`urutan_tahan.alasan = 'gap'`) has no message id:
-- `v_tahan.message_id = v_message_id` was NULL, so "this message is what
-- holds the order" was NULL, the whole park condition NULL, and plpgsql's IF
-- treated it as false: v4 of an order held for a missing v2 was applied past
-- the gap (found by the interleaving model and the fault soak with holds).
-- The comparison is now false for a gap hold.
--
-- And the missing version itself gets through a gap hold from the release
-- step too: a version that arrives after the hold and is then set aside (its
-- handler asked to retry) waited in `urutan_parkir` behind its own order's
-- gap hold forever (`urutan_lepas` let only the hold's message through, and
-- a gap hold has none). Applied there, it ends the hold, as it does in
-- `urutan_terapkan`.

CREATE OR REPLACE FUNCTION urutan_terapkan(p_pesan jsonb, p_shard integer) RETURNS text
    LANGUAGE plpgsql
    AS $$
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
    -- A copy of a message claimed on an earlier day (another partition) or
    -- parked for this order: possible only for a version not newer than the
    -- stored one, or one parked (migration 0026).
    IF v_versi_baru <= coalesce(v_versi, 0)
       OR EXISTS (SELECT 1 FROM urutan_parkir u
                  WHERE u.pesanan_id = v_id AND u.message_id = v_message_id) THEN
        v_hasil := urutan_klaim_lama(v_message_id, v_id);
        IF v_hasil IS NOT NULL THEN
            RETURN v_hasil;
        END IF;
    END IF;
    SELECT t.alasan, t.message_id INTO v_tahan FROM urutan_tahan t WHERE t.pesanan_id = v_id;
    v_ditahan := FOUND;
    IF v_ditahan THEN
        -- A gap hold has no message: `=` on its NULL id would make v_lewat
        -- NULL, the park condition NULL, and the version be written past the
        -- gap (issue 44's interleaving model and fault soak found it).
        v_lewat := coalesce(v_tahan.message_id = v_message_id, false)
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
        -- A version waiting for a gap only (GAP_POLICY=wait, its order not
        -- held): refused once the shard already keeps urutan.gap_max parked
        -- rows, so what a producer plants stays bounded (issue 43). Its
        -- claim goes with it: a replay is applied, not a duplicate.
        IF NOT v_ditahan AND urutan_celah_tunggu()
           AND urutan_celah_penuh(p_shard) THEN
            DELETE FROM pesan_diproses d
            WHERE d.message_id = v_message_id AND d.pesanan_id = v_id
              AND d.diproses_pada = now();
            RETURN 'gap_limit';
        END IF;
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
          -- set aside after a transient failure) may be tried, or, for a
          -- gap hold, the missing version itself (set aside after the hold).
          AND NOT EXISTS (SELECT 1 FROM urutan_tahan t WHERE t.pesanan_id = u.pesanan_id
                                                        AND t.message_id IS DISTINCT FROM u.message_id
                                                        AND NOT (t.alasan = 'gap'
                                                                 AND u.versi = coalesce(p.versi, 0) + 1))
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
                              WHERE t.pesanan_id = v_id AND t.message_id IS DISTINCT FROM r.message_id
                                AND NOT (t.alasan = 'gap' AND r.versi = coalesce(v_versi, 0) + 1));
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
            -- The message holding its order is through: the hold ends; so
            -- does a gap hold once the missing version is applied.
            DELETE FROM urutan_tahan t
            WHERE t.pesanan_id = v_id
              AND (t.message_id = r.message_id
                   OR (t.alasan = 'gap' AND hasil = 'applied'
                       AND r.versi = coalesce(v_versi, 0) + 1));
            IF hasil = 'applied' THEN
                v_versi := r.versi;
            END IF;
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

