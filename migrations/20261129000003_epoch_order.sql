-- A message older than the ones parked for its entity (an earlier epoch,
-- still queued on the entity's previous shard) must not wait behind them:
-- it parks only behind parked messages of its own epoch or earlier, and
-- parked messages are released in epoch order, then arrival order.

CREATE OR REPLACE FUNCTION urutan_terapkan(
    p_message_id TEXT, p_id TEXT, p_status TEXT, p_versi BIGINT, p_data JSONB, p_shard INT)
RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    v_posisi BIGINT;  -- epochs this shard has passed: the message's epoch
    v_epoch  BIGINT;  -- epoch of the entity's last applied message (NULL: never seen)
BEGIN
    INSERT INTO pesan_diproses (message_id) VALUES (p_message_id) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN 'duplicate';
    END IF;
    -- One entity at a time across shards (apply, park and release).
    PERFORM pg_advisory_xact_lock(hashtextextended(p_id, 7261));
    SELECT epoch INTO v_posisi FROM urutan_shard WHERE shard = p_shard;
    v_posisi := coalesce(v_posisi, 0);
    SELECT epoch INTO v_epoch FROM pesanan WHERE id = p_id;
    IF EXISTS (SELECT 1 FROM urutan_parkir WHERE pesanan_id = p_id AND epoch <= v_posisi)
       OR (v_epoch IS DISTINCT FROM v_posisi
           AND v_posisi > coalesce(urutan_epoch_selesai(), v_posisi)) THEN
        INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, data, shard, epoch)
        VALUES (p_id, p_message_id, p_status, p_versi, p_data, p_shard, v_posisi);
        RETURN 'parked';
    END IF;
    RETURN urutan_tulis(p_message_id, p_id, p_status, p_versi, p_data, p_shard, v_posisi);
END
$$;

CREATE OR REPLACE FUNCTION urutan_lepas(p_shard INT, p_batas INT)
RETURNS TABLE (message_id TEXT, hasil TEXT, tunggu DOUBLE PRECISION, pertama BOOLEAN)
LANGUAGE plpgsql AS $$
DECLARE
    v_selesai BIGINT := urutan_epoch_selesai();
    v_id TEXT;
    r RECORD;
BEGIN
    IF v_selesai IS NULL THEN
        RETURN;
    END IF;
    FOR v_id IN
        SELECT DISTINCT u.pesanan_id FROM urutan_parkir u
        WHERE u.shard = p_shard AND u.epoch <= v_selesai
        ORDER BY u.pesanan_id LIMIT p_batas
    LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(v_id, 7261));
        pertama := true;
        FOR r IN SELECT * FROM urutan_parkir u WHERE u.pesanan_id = v_id
                 ORDER BY u.epoch, u.seq LOOP
            EXIT WHEN r.epoch > v_selesai;
            message_id := r.message_id;
            hasil := urutan_tulis(r.message_id, r.pesanan_id, r.status, r.versi, r.data,
                                  r.shard, r.epoch);
            tunggu := extract(epoch FROM now() - r.diparkir_pada);
            DELETE FROM urutan_parkir u WHERE u.seq = r.seq;
            RETURN NEXT;
            pertama := false;
        END LOOP;
    END LOOP;
END
$$;
