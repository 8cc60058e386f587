-- Messages a worker handed back to its shard queue (`basic.reject` with
-- requeue, after the handler failed on them), until they come back.
--
-- Per-shard order rests on the broker redelivering a returned message
-- before the messages behind it. RabbitMQ 3.10.8 stops doing so on a queue
-- once one of its messages was dead-lettered by the delivery limit: from
-- then on the next message overtakes each returned one (seen here: X-v1
-- returned, X-v2 delivered and applied, X-v1 then stale). So a worker
-- records each message it hands back (src/shard/steps.rs, `requeue`), and a
-- newer version of that order waits, parked like a message in a handoff,
-- until the returned one is back: applied, stale, a duplicate, or
-- dead-lettered (its dead-letter record ends the wait).

CREATE TABLE IF NOT EXISTS urutan_dikembalikan (
    message_id        TEXT PRIMARY KEY,
    pesanan_id        TEXT NOT NULL,
    versi             BIGINT NOT NULL,
    shard             INT NOT NULL,
    dikembalikan_pada TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS urutan_dikembalikan_pesanan_idx
    ON urutan_dikembalikan (pesanan_id, versi);

-- Must version p_versi of order p_id wait for a returned older version?
-- True while one is handed back and not back yet, unless it is no newer
-- than the stored version p_tersimpan (it will be stale: nothing to wait for).
CREATE OR REPLACE FUNCTION urutan_menunggu_kembali(p_id TEXT, p_versi BIGINT, p_tersimpan BIGINT)
RETURNS BOOLEAN LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM urutan_dikembalikan
                   WHERE pesanan_id = p_id AND versi < p_versi
                     AND versi > coalesce(p_tersimpan, 0))
$$;

-- A dead-lettered message does not come back: stop waiting for it.
CREATE OR REPLACE FUNCTION urutan_dikembalikan_mati() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM urutan_dikembalikan WHERE message_id = NEW.message_id;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS urutan_dikembalikan_mati ON urutan_dead_letter;
CREATE TRIGGER urutan_dikembalikan_mati AFTER INSERT ON urutan_dead_letter
    FOR EACH ROW WHEN (NEW.message_id IS NOT NULL)
    EXECUTE FUNCTION urutan_dikembalikan_mati();

-- Migration 0007's urutan_terapkan, plus: a returned message that is back
-- is no longer waited for, and a newer version waits for a returned one.
CREATE OR REPLACE FUNCTION urutan_terapkan(
    p_message_id TEXT, p_id TEXT, p_status TEXT, p_versi BIGINT, p_data JSONB, p_shard INT)
RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    v_posisi BIGINT;  -- epochs this shard has passed: the message's epoch
    v_epoch  BIGINT;  -- epoch of the entity's last applied message (NULL: never seen)
    v_versi  BIGINT;  -- the entity's stored version (NULL: never seen)
BEGIN
    -- Back after a return (whatever this delivery's outcome).
    DELETE FROM urutan_dikembalikan WHERE message_id = p_message_id;
    INSERT INTO pesan_diproses (message_id) VALUES (p_message_id) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN 'duplicate';
    END IF;
    -- One entity at a time across shards (apply, park and release).
    PERFORM pg_advisory_xact_lock(hashtextextended(p_id, 7261));
    SELECT epoch INTO v_posisi FROM urutan_shard WHERE shard = p_shard;
    v_posisi := coalesce(v_posisi, 0);
    SELECT epoch, versi INTO v_epoch, v_versi FROM pesanan WHERE id = p_id;
    -- The next version (or an old one) never waits: nothing it could
    -- overtake exists.
    IF p_versi > coalesce(v_versi, 0) + 1 AND (
           EXISTS (SELECT 1 FROM urutan_parkir WHERE pesanan_id = p_id AND epoch <= v_posisi)
           OR urutan_jendela_terbuka(v_posisi)
           OR (v_epoch IS DISTINCT FROM v_posisi
               AND v_posisi > coalesce(urutan_epoch_selesai(), v_posisi))
           OR urutan_menunggu_kembali(p_id, p_versi, v_versi)) THEN
        INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, data, shard, epoch)
        VALUES (p_id, p_message_id, p_status, p_versi, p_data, p_shard, v_posisi);
        RETURN 'parked';
    END IF;
    RETURN urutan_tulis(p_message_id, p_id, p_status, p_versi, p_data, p_shard, v_posisi);
END
$$;

-- Migration 0007's urutan_lepas, plus: a parked message that is not its
-- order's next version also waits for a returned older version.
CREATE OR REPLACE FUNCTION urutan_lepas(p_shard INT, p_batas INT)
RETURNS TABLE (message_id TEXT, hasil TEXT, tunggu DOUBLE PRECISION, pertama BOOLEAN)
LANGUAGE plpgsql AS $$
DECLARE
    v_selesai BIGINT := urutan_epoch_selesai();
    v_bebas   BOOLEAN;  -- no window open: an epoch every shard passed is enough
    v_versi   BIGINT;
    v_id      TEXT;
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
            message_id := r.message_id;
            hasil := urutan_tulis(r.message_id, r.pesanan_id, r.status, r.versi, r.data,
                                  r.shard, r.epoch);
            IF hasil = 'applied' THEN
                v_versi := r.versi;
            END IF;
            tunggu := extract(epoch FROM now() - r.diparkir_pada);
            DELETE FROM urutan_parkir u WHERE u.seq = r.seq;
            RETURN NEXT;
            pertama := false;
        END LOOP;
    END LOOP;
END
$$;

-- Migration 0009's batch entry, plus: a batch with an order that has a
-- returned message goes through the per-message loop (urutan_terapkan
-- above decides each message).
CREATE OR REPLACE FUNCTION urutan_terapkan_batch(
    p_message_ids TEXT[], p_ids TEXT[], p_statuses TEXT[], p_versis BIGINT[],
    p_datas TEXT[], p_markers BIGINT[], p_shard INT)
RETURNS TEXT[] LANGUAGE plpgsql AS $$
BEGIN
    IF (urutan_efek_aktif()
        AND (SELECT count(DISTINCT id) < count(id) FROM unnest(p_ids) id))
       OR EXISTS (SELECT 1 FROM urutan_dikembalikan WHERE pesanan_id = ANY (p_ids)) THEN
        RETURN urutan_terapkan_batch_urut(p_message_ids, p_ids, p_statuses, p_versis,
                                          p_datas, p_markers, p_shard);
    END IF;
    RETURN urutan_terapkan_batch_himpun(p_message_ids, p_ids, p_statuses, p_versis,
                                        p_datas, p_markers, p_shard);
END
$$;
