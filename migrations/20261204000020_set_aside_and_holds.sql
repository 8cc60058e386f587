-- Issue 31, parts 3 and 4 (docs/contract.md section 11): one failing
-- message never stalls its shard, and a refused version holds its order.
--
-- Set aside: a message whose own transaction failed transiently (the
-- handler asked to retry, a serialization failure or deadlock, a lock or
-- statement timeout) is claimed and kept as a parked row with a due time
-- (urutan_sisihkan), acked, and the shard goes on. Its order's later
-- versions park behind it (the parking rule of urutan_terapkan: a version
-- above stored + 1 waits while its order has parked rows). The shard's
-- release step (urutan_lepas) tries it again when due, each version in a
-- subtransaction of its own: a transient failure sets it aside again with
-- a longer wait; the last attempt, or any other failure, refuses it.
--
-- Holds: a refused version (the handler refused it, the database refused
-- its data, its retries ran out, the delivery limit) is dead-lettered, and
-- with ON_REFUSED=hold its order is held (urutan_tahan): every later
-- version is recorded and waits, until the refused message is replayed
-- and applied (urutan_terapkan lets exactly that message through and ends
-- the hold) or an operator releases the order without it (urutan_lepaskan,
-- `urutan hold release`: the skip is recorded in urutan_lewati).

ALTER TABLE urutan_parkir
    ADD COLUMN IF NOT EXISTS percobaan   INT NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS jatuh_tempo TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS galat       TEXT;
CREATE INDEX IF NOT EXISTS urutan_parkir_jatuh_tempo ON urutan_parkir (pesanan_id) WHERE jatuh_tempo IS NOT NULL;

CREATE TABLE IF NOT EXISTS urutan_tahan (
    pesanan_id TEXT PRIMARY KEY,
    alasan     TEXT NOT NULL CHECK (alasan IN ('refused', 'gap', 'effect')),
    message_id TEXT,
    versi      BIGINT,
    shard      INT,
    sejak      TIMESTAMPTZ NOT NULL DEFAULT now(),
    galat      TEXT
);

CREATE TABLE IF NOT EXISTS urutan_lewati (
    seq           BIGSERIAL PRIMARY KEY,
    pesanan_id    TEXT NOT NULL,
    versi         BIGINT,
    message_id    TEXT,
    alasan        TEXT NOT NULL,
    galat         TEXT,
    ditahan_sejak TIMESTAMPTZ NOT NULL,
    dilewati_pada TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS urutan_lewati_pesanan ON urutan_lewati (pesanan_id);

-- The wait before attempt p_percobaan + 1: p_min × 2^(p_percobaan − 1),
-- capped at p_max, jittered by ±25 % within [p_min, p_max].
CREATE OR REPLACE FUNCTION urutan_jeda(p_percobaan INT, p_min DOUBLE PRECISION, p_max DOUBLE PRECISION)
RETURNS INTERVAL LANGUAGE sql VOLATILE AS $$
    SELECT make_interval(secs => greatest(p_min, least(p_max,
        least(p_max, p_min * 2 ^ least(greatest(p_percobaan - 1, 0), 40)) * (0.75 + random() * 0.5))))
$$;

-- Which failures of one message's transaction set it aside (transient for
-- that message alone); NULL for any other SQLSTATE.
CREATE OR REPLACE FUNCTION urutan_alasan_ulang(p_state TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_state
        WHEN 'URTRY' THEN 'handler_retry'
        WHEN '40001' THEN 'serialization'
        WHEN '40P01' THEN 'deadlock'
        WHEN '55P03' THEN 'lock_timeout'
        WHEN '57014' THEN 'statement_timeout'
    END
$$;

-- Holds order p_id because version p_versi (message p_message_id) was
-- refused; a hold already there stays as it is. Nothing for a version no
-- longer ahead of the stored one.
CREATE OR REPLACE FUNCTION urutan_tahan_tolak(p_id TEXT, p_message_id TEXT, p_versi BIGINT, p_shard INT,
                                   p_galat TEXT)
RETURNS BOOLEAN LANGUAGE plpgsql AS $$
BEGIN
    IF p_versi <= coalesce((SELECT versi FROM pesanan WHERE id = p_id), 0) THEN
        RETURN false;
    END IF;
    INSERT INTO urutan_tahan (pesanan_id, alasan, message_id, versi, shard, galat)
    VALUES (p_id, 'refused', p_message_id, p_versi, p_shard, p_galat)
    ON CONFLICT (pesanan_id) DO NOTHING;
    RETURN FOUND;
END
$$;

-- Sets message p_pesan aside on shard p_shard after its first failure
-- (p_galat), due after urutan_jeda(1, ...): claims its id (a message
-- already recorded is a duplicate, or message_id_reused) and parks it with
-- its attempt count. Returns set_aside, duplicate or message_id_reused.
CREATE OR REPLACE FUNCTION urutan_sisihkan(p_pesan JSONB, p_shard INT, p_galat TEXT,
                                p_min DOUBLE PRECISION, p_max DOUBLE PRECISION)
RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    v_message_id TEXT := p_pesan->>'message_id';
    v_id         TEXT := p_pesan->>'id';
    v_posisi     BIGINT;
BEGIN
    DELETE FROM urutan_dikembalikan WHERE message_id = v_message_id AND pesanan_id = v_id;
    INSERT INTO pesan_diproses (message_id, pesanan_id) VALUES (v_message_id, v_id)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN urutan_sudah_diproses(v_message_id, v_id);
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(v_id, 7261));
    SELECT epoch INTO v_posisi FROM urutan_shard WHERE shard = p_shard;
    INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, data, shard, epoch, pesan,
                               percobaan, jatuh_tempo, galat)
    VALUES (v_id, v_message_id, p_pesan->>'status', (p_pesan->>'versi')::bigint, p_pesan->'data',
            p_shard, coalesce(v_posisi, 0), p_pesan, 1, now() + urutan_jeda(1, p_min, p_max), p_galat);
    RETURN 'set_aside';
END
$$;

-- Migration 0018's urutan_terapkan, with holds: a held order's later
-- versions park (recorded, they wait); the message holding it goes
-- through, and once it is decided the hold ends.
CREATE OR REPLACE FUNCTION urutan_terapkan(p_pesan JSONB, p_shard INT)
RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    v_message_id TEXT := p_pesan->>'message_id';
    v_id         TEXT := p_pesan->>'id';
    v_versi_baru BIGINT := (p_pesan->>'versi')::bigint;
    v_posisi BIGINT;  -- epochs this shard has passed: the message's epoch
    v_epoch  BIGINT;  -- epoch of the entity's last applied message (NULL: never seen)
    v_versi  BIGINT;  -- the entity's stored version (NULL: never seen)
    v_tahan  TEXT;    -- the message holding the order
    v_ditahan BOOLEAN := false;
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
    SELECT t.message_id, true INTO v_tahan, v_ditahan FROM urutan_tahan t WHERE t.pesanan_id = v_id;
    v_ditahan := coalesce(v_ditahan, false);
    IF (v_ditahan AND v_tahan IS DISTINCT FROM v_message_id
        AND v_versi_baru > coalesce(v_versi, 0))
       OR (NOT (v_ditahan AND v_tahan = v_message_id)
           AND v_versi_baru > coalesce(v_versi, 0) + 1 AND (
           EXISTS (SELECT 1 FROM urutan_parkir WHERE pesanan_id = v_id AND epoch <= v_posisi)
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
    IF v_ditahan AND v_tahan = v_message_id THEN
        DELETE FROM urutan_tahan WHERE pesanan_id = v_id;
    END IF;
    RETURN v_hasil;
END
$$;

-- Migration 0019's batch entry: the per-message loop also when an order
-- of the batch is held (its versions park).
CREATE OR REPLACE FUNCTION urutan_terapkan_batch(p_pesan JSONB, p_shard INT)
RETURNS TEXT[] LANGUAGE plpgsql AS $$
DECLARE
    v_ids TEXT[] := ARRAY(SELECT e->>'id' FROM jsonb_array_elements(p_pesan) e);
BEGIN
    IF coalesce(current_setting('urutan.handler', true), '') <> ''
       OR (urutan_efek_aktif()
           AND (SELECT count(DISTINCT id) < count(id) FROM unnest(v_ids) id))
       OR EXISTS (SELECT 1 FROM urutan_dikembalikan WHERE pesanan_id = ANY (v_ids))
       OR EXISTS (SELECT 1 FROM urutan_tahan WHERE pesanan_id = ANY (v_ids)) THEN
        RETURN urutan_terapkan_batch_urut(p_pesan, p_shard);
    END IF;
    RETURN urutan_terapkan_batch_himpun(p_pesan, p_shard);
END
$$;

-- Releases the parked and set-aside messages of shard p_shard that may go
-- now, for at most p_batas orders, each version in a subtransaction of its
-- own. hasil: applied or stale; retry (set aside again: alasan is the
-- retry reason, galat the error); refused (alasan handler_refused,
-- database_refused or retries_exhausted; the message leaves the sequence:
-- its claim is dropped, so that a replay of it is new, and with p_tahan
-- its order is held). A failure that is the database's own (connection,
-- resources) fails the whole call: the release waits.
CREATE OR REPLACE FUNCTION urutan_lepas(p_shard INT, p_batas INT, p_min DOUBLE PRECISION,
                             p_max DOUBLE PRECISION, p_maks INT, p_tahan BOOLEAN)
RETURNS TABLE (message_id TEXT, hasil TEXT, tunggu DOUBLE PRECISION, pertama BOOLEAN,
               alasan TEXT, galat TEXT, pesan JSONB)
LANGUAGE plpgsql AS $$
DECLARE
    v_selesai BIGINT := urutan_epoch_selesai();
    v_bebas   BOOLEAN;  -- no window open: an epoch every shard passed is enough
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
                AND NOT urutan_menunggu_kembali(u.pesanan_id, u.versi, p.versi))
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
                               AND NOT urutan_menunggu_kembali(v_id, r.versi, v_versi));
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

-- The previous signature, for workers of the previous version during a
-- rolling upgrade: what it released, never a retry or a refusal (those
-- stay parked for the new version).
CREATE OR REPLACE FUNCTION urutan_lepas(p_shard INT, p_batas INT)
RETURNS TABLE (message_id TEXT, hasil TEXT, tunggu DOUBLE PRECISION, pertama BOOLEAN)
LANGUAGE sql AS $$
    SELECT l.message_id, l.hasil, l.tunggu, l.pertama
    FROM urutan_lepas(p_shard, p_batas, 1, 300, 1000000, true) l
    WHERE l.hasil IN ('applied', 'stale')
$$;

-- Resumes held order p_id without what holds it (`urutan hold release`):
-- the hold ends and is recorded as a skip; its waiting versions are then
-- released in order by their shard. Returns the skip, none if not held.
CREATE OR REPLACE FUNCTION urutan_lepaskan(p_id TEXT)
RETURNS TABLE (alasan TEXT, message_id TEXT, versi BIGINT, menunggu BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    t RECORD;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_id, 7261));
    DELETE FROM urutan_tahan h WHERE h.pesanan_id = p_id RETURNING h.* INTO t;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO urutan_lewati (pesanan_id, versi, message_id, alasan, galat, ditahan_sejak)
    VALUES (p_id, t.versi, t.message_id, t.alasan, t.galat, t.sejak);
    alasan := t.alasan;
    message_id := t.message_id;
    versi := t.versi;
    menunggu := (SELECT count(*) FROM urutan_parkir u WHERE u.pesanan_id = p_id);
    RETURN NEXT;
END
$$;

COMMENT ON COLUMN urutan_parkir.percobaan IS
    'Attempts (percobaan) of a message set aside after a transient failure; 0 for a message parked behind others.';
COMMENT ON COLUMN urutan_parkir.jatuh_tempo IS
    'When a set-aside message is tried again (jatuh tempo: due); NULL for a message parked behind others.';
COMMENT ON COLUMN urutan_parkir.galat IS
    'The last error (galat) of a set-aside message.';
COMMENT ON TABLE urutan_tahan IS
    'Held orders (tahan: hold): why (refused, gap, effect), the message and version holding it, since when. Later versions wait in urutan_parkir until the holding message is replayed and applied, or `urutan hold release` ends the hold.';
COMMENT ON TABLE urutan_lewati IS
    'Skips (lewati: skip): each hold an operator released without its version (`urutan hold release`), for `urutan explain`.';
COMMENT ON FUNCTION urutan_jeda(INT, DOUBLE PRECISION, DOUBLE PRECISION) IS
    'The wait (jeda) before the next attempt of a set-aside message: RETRY_BACKOFF_MIN x 2^(attempts - 1), capped at RETRY_BACKOFF_MAX, jittered.';
COMMENT ON FUNCTION urutan_alasan_ulang(TEXT) IS
    'The retry reason of an SQLSTATE that sets one message aside (handler_retry, serialization, deadlock, lock_timeout, statement_timeout); NULL for any other.';
COMMENT ON FUNCTION urutan_tahan_tolak(TEXT, TEXT, BIGINT, INT, TEXT) IS
    'Holds an order after its version p_versi was refused (tolak: refuse), unless that version is no longer ahead of the stored one; true if a new hold was made.';
COMMENT ON FUNCTION urutan_sisihkan(JSONB, INT, TEXT, DOUBLE PRECISION, DOUBLE PRECISION) IS
    'Sets a message aside (sisihkan) after a transient failure of its own transaction: claimed and parked with a due time; its order''s later versions wait behind it.';
COMMENT ON FUNCTION urutan_terapkan(JSONB, INT) IS
    'Applies one message (terapkan: apply) in one transaction: dedup claim per order, then parking (a held order, or older versions that may still come), else the versioned write; the message holding its order goes through and ends the hold.';
COMMENT ON FUNCTION urutan_lepas(INT, INT, DOUBLE PRECISION, DOUBLE PRECISION, INT, BOOLEAN) IS
    'Releases (lepas) the parked and due set-aside messages of a shard, each version in a subtransaction: applied, stale, retry (set aside again) or refused (out of the sequence; the order held if p_tahan).';
COMMENT ON FUNCTION urutan_lepas(INT, INT) IS
    'The release of the previous version''s workers (rolling upgrades): applied and stale ones only.';
COMMENT ON FUNCTION urutan_lepaskan(TEXT) IS
    'Ends the hold of an order without its holding version (lepaskan: let go; `urutan hold release`), recording the skip; its waiting versions are then released by their shard.';
COMMENT ON FUNCTION urutan_terapkan_batch(JSONB, INT) IS
    'Applies one shard''s batch in arrival order with the outcomes each message would have alone: set-based, or message by message when a handler is set, effects need each version''s state, an order has a returned message or is held.';
