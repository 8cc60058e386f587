-- Issue 31, part 2 (docs/contract.md section 10): a handler written in Rust,
-- called by the worker in the apply transaction, after urutan's own rows
-- and before commit, exactly like HANDLER_FUNCTION.
--
-- The worker runs a Rust handler's transactions with the transaction-local
-- option `urutan.acara` = 'on'. urutan_tulis then leaves the event of each
-- version it applies in `urutan.acara_terakhir` (the same JSON a
-- HANDLER_FUNCTION gets, previous_versi and shard included), and the worker
-- reads it in the same statement to call the handler.
--
-- The release step of a worker with a Rust handler applies one parked
-- version per call (urutan_lepas with p_satu) in a savepoint, calls the
-- handler, and on the handler's failure rolls back to the savepoint and
-- records it with urutan_lepas_gagal: set aside again, or refused. The
-- release of every worker (with or without a Rust handler) records its
-- failures with that one function.

-- Migration 0019's urutan_tulis, also computing the event for a Rust handler.
CREATE OR REPLACE FUNCTION urutan_tulis(p_pesan JSONB, p_shard INT, p_epoch BIGINT)
RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    v_id    TEXT := p_pesan->>'id';
    v_versi BIGINT := (p_pesan->>'versi')::bigint;
    v_penangan regprocedure;
    v_acara BOOLEAN := coalesce(current_setting('urutan.acara', true), '') = 'on';
    v_lama  BIGINT;  -- the stored version before this one (NULL: a new order)
BEGIN
    IF coalesce(current_setting('urutan.handler', true), '') <> '' THEN
        v_penangan := urutan_penangan();
    END IF;
    IF v_penangan IS NOT NULL OR v_acara THEN
        SELECT versi INTO v_lama FROM pesanan WHERE id = v_id;
    END IF;
    INSERT INTO pesanan AS p (id, status, versi, data, epoch)
    VALUES (v_id, p_pesan->>'status', v_versi, p_pesan->'data', p_epoch)
    ON CONFLICT (id) DO UPDATE
        SET status = EXCLUDED.status, versi = EXCLUDED.versi, data = EXCLUDED.data,
            diperbarui_pada = now(), epoch = greatest(p.epoch, EXCLUDED.epoch)
        WHERE p.versi < EXCLUDED.versi;
    IF NOT FOUND THEN
        RETURN 'stale';
    END IF;
    INSERT INTO pesanan_riwayat (pesanan_id, versi, status, message_id, shard)
    VALUES (v_id, v_versi, p_pesan->>'status', p_pesan->>'message_id', p_shard);
    IF v_penangan IS NOT NULL THEN
        PERFORM urutan_panggil_penangan(v_penangan, p_pesan, p_shard, v_lama);
    END IF;
    IF v_acara THEN
        PERFORM set_config('urutan.acara_terakhir', jsonb_build_object(
            'message_id', p_pesan->>'message_id', 'id', v_id,
            'status', p_pesan->>'status', 'versi', v_versi,
            'data', p_pesan->'data', 'previous_versi', v_lama, 'shard', p_shard)::text, true);
    END IF;
    RETURN 'applied';
END
$$;

-- Migration 0021's batch entry: also message by message for a Rust handler
-- (each applied version's event comes from urutan_tulis).
CREATE OR REPLACE FUNCTION urutan_terapkan_batch(p_pesan JSONB, p_shard INT)
RETURNS TEXT[] LANGUAGE plpgsql AS $$
DECLARE
    v_ids TEXT[] := ARRAY(SELECT e->>'id' FROM jsonb_array_elements(p_pesan) e);
BEGIN
    IF coalesce(current_setting('urutan.handler', true), '') <> ''
       OR coalesce(current_setting('urutan.acara', true), '') = 'on'
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

-- Migration 0020's retry reasons, and a Rust handler's panic (URPNC).
CREATE OR REPLACE FUNCTION urutan_alasan_ulang(p_state TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_state
        WHEN 'URTRY' THEN 'handler_retry'
        WHEN 'URPNC' THEN 'panic'
        WHEN '40001' THEN 'serialization'
        WHEN '40P01' THEN 'deadlock'
        WHEN '55P03' THEN 'lock_timeout'
        WHEN '57014' THEN 'statement_timeout'
    END
$$;

-- Records the failure (SQLSTATE p_state, message p_teks) of parked message
-- p_message_id of order p_id, tried by the release step: a transient one
-- (urutan_alasan_ulang) with attempts left sets it aside again, after
-- urutan_jeda(attempts, p_min, p_max); anything else, or the last attempt,
-- refuses it (out of the sequence: its claim dropped so that a replay is
-- new; with p_tahan its order held). NULL hasil for a state that is the
-- database's own (the caller re-raises it: the release waits).
CREATE OR REPLACE FUNCTION urutan_lepas_gagal(p_message_id TEXT, p_id TEXT, p_state TEXT, p_teks TEXT,
                                   p_min DOUBLE PRECISION, p_max DOUBLE PRECISION, p_maks INT,
                                   p_tahan BOOLEAN)
RETURNS TABLE (hasil TEXT, alasan TEXT, galat TEXT, pesan JSONB)
LANGUAGE plpgsql AS $$
DECLARE
    r RECORD;
BEGIN
    IF urutan_alasan_ulang(p_state) IS NULL
       AND p_state <> 'URREF' AND left(p_state, 2) NOT IN ('22', '23', '54') THEN
        RETURN;
    END IF;
    SELECT * INTO r FROM urutan_parkir u WHERE u.message_id = p_message_id AND u.pesanan_id = p_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    galat := CASE WHEN p_state = 'URREF' THEN p_teks
                  ELSE format('SQLSTATE %s: %s', p_state, p_teks) END;
    alasan := urutan_alasan_ulang(p_state);
    IF alasan IS NOT NULL AND r.percobaan + 1 < p_maks THEN
        UPDATE urutan_parkir u
        SET percobaan = r.percobaan + 1, galat = urutan_lepas_gagal.galat,
            jatuh_tempo = now() + urutan_jeda(r.percobaan + 1, p_min, p_max)
        WHERE u.seq = r.seq;
        hasil := 'retry';
    ELSE
        alasan := CASE WHEN alasan IS NOT NULL THEN 'retries_exhausted'
                       WHEN p_state = 'URREF' THEN 'handler_refused'
                       ELSE 'database_refused' END;
        DELETE FROM urutan_parkir u WHERE u.seq = r.seq;
        DELETE FROM pesan_diproses d WHERE d.message_id = r.message_id;
        IF p_tahan THEN
            PERFORM urutan_tahan_tolak(p_id, r.message_id, r.versi, r.shard, galat);
        END IF;
        hasil := 'refused';
        pesan := coalesce(r.pesan,
                          jsonb_build_object('message_id', r.message_id, 'id', r.pesanan_id,
                                             'status', r.status, 'versi', r.versi)
                          || CASE WHEN r.data IS NULL THEN '{}'::jsonb
                                  ELSE jsonb_build_object('data', r.data) END);
    END IF;
    RETURN NEXT;
END
$$;

-- Migration 0021's urutan_lepas, its failures recorded by
-- urutan_lepas_gagal, and with p_satu: at most one version per call (the
-- caller runs a Rust handler on it before the next).
CREATE OR REPLACE FUNCTION urutan_lepas(p_shard INT, p_batas INT, p_min DOUBLE PRECISION,
                             p_max DOUBLE PRECISION, p_maks INT, p_tahan BOOLEAN,
                             p_satu BOOLEAN)
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
    g RECORD;
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

-- The six-argument form (migration 0020's callers): every version that may go.
CREATE OR REPLACE FUNCTION urutan_lepas(p_shard INT, p_batas INT, p_min DOUBLE PRECISION,
                             p_max DOUBLE PRECISION, p_maks INT, p_tahan BOOLEAN)
RETURNS TABLE (message_id TEXT, hasil TEXT, tunggu DOUBLE PRECISION, pertama BOOLEAN,
               alasan TEXT, galat TEXT, pesan JSONB)
LANGUAGE sql AS $$
    SELECT * FROM urutan_lepas(p_shard, p_batas, p_min, p_max, p_maks, p_tahan, false)
$$;

COMMENT ON FUNCTION urutan_tulis(JSONB, INT, BIGINT) IS
    'Writes (tulis) an applied version: the forward-only state, its history row, the HANDLER_FUNCTION call; with the option urutan.acara, the event for a Rust handler in urutan.acara_terakhir. stale when not newer.';
COMMENT ON FUNCTION urutan_terapkan_batch(JSONB, INT) IS
    'Applies one shard''s batch in arrival order with the outcomes each message would have alone: set-based, or message by message when a handler (SQL or Rust) is set, gaps wait, effects need each version''s state, an order has a returned message or is held.';
COMMENT ON FUNCTION urutan_lepas_gagal(TEXT, TEXT, TEXT, TEXT, DOUBLE PRECISION, DOUBLE PRECISION, INT, BOOLEAN) IS
    'Records the failure (gagal) of a parked message tried by the release step: set aside again (retry) or refused (out of the sequence, its order held with p_tahan); no row for a failure that is the database''s own.';
COMMENT ON FUNCTION urutan_lepas(INT, INT, DOUBLE PRECISION, DOUBLE PRECISION, INT, BOOLEAN, BOOLEAN) IS
    'Releases (lepas) the parked and due set-aside messages of a shard, each version in a subtransaction: applied, stale, retry (set aside again) or refused (out of the sequence; the order held if p_tahan); with p_satu, one version per call.';
COMMENT ON FUNCTION urutan_lepas(INT, INT, DOUBLE PRECISION, DOUBLE PRECISION, INT, BOOLEAN) IS
    'urutan_lepas for every version that may go (the form without p_satu).';
