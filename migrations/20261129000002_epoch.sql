-- Per-entity order across hash-ring changes (see src/handoff.rs).
--
-- An epoch is a point where the consistent-hash ring may have changed (a
-- broker restart, a resharding, a (re)connect). Opening epoch n puts a marker
-- into every shard queue; a shard "passes" epoch n when its worker reaches
-- that marker, so every message queued on it before the marker is done.
-- A message is tagged with the epochs its shard has passed when it arrives.
-- It may be applied at once if its entity was last applied in the same
-- epoch (then it can only come from the same shard); otherwise it waits
-- (parked, not blocking the shard) until every shard has passed its epoch,
-- i.e. until no older message of the entity can still be queued anywhere.

ALTER TABLE pesanan ADD COLUMN IF NOT EXISTS epoch BIGINT NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS urutan_epoch (
    epoch       BIGSERIAL PRIMARY KEY,
    alasan      TEXT NOT NULL,
    dibuka_pada TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Every shard queue, and the highest epoch marker its worker has passed.
CREATE TABLE IF NOT EXISTS urutan_shard (
    shard INT PRIMARY KEY,
    epoch BIGINT NOT NULL DEFAULT 0,
    aktif BOOLEAN NOT NULL DEFAULT true
);

-- Messages waiting for older messages of their entity on other shards.
CREATE TABLE IF NOT EXISTS urutan_parkir (
    seq           BIGSERIAL PRIMARY KEY,
    pesanan_id    TEXT NOT NULL,
    message_id    TEXT NOT NULL,
    status        TEXT NOT NULL,
    versi         BIGINT NOT NULL,
    data          JSONB,
    shard         INT NOT NULL,
    epoch         BIGINT NOT NULL,
    diparkir_pada TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS urutan_parkir_pesanan_idx ON urutan_parkir (pesanan_id, seq);
CREATE INDEX IF NOT EXISTS urutan_parkir_shard_idx ON urutan_parkir (shard, epoch);

-- The highest epoch every active shard has passed (NULL: no shard registered).
CREATE OR REPLACE FUNCTION urutan_epoch_selesai() RETURNS BIGINT
LANGUAGE sql STABLE AS $$
    SELECT min(epoch) FROM urutan_shard WHERE aktif
$$;

-- The versioned write: moves the entity forward only; one history row per
-- applied version. Returns 'applied' or 'stale'.
CREATE OR REPLACE FUNCTION urutan_tulis(
    p_message_id TEXT, p_id TEXT, p_status TEXT, p_versi BIGINT, p_data JSONB,
    p_shard INT, p_epoch BIGINT)
RETURNS TEXT LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pesanan AS p (id, status, versi, data, epoch)
    VALUES (p_id, p_status, p_versi, p_data, p_epoch)
    ON CONFLICT (id) DO UPDATE
        SET status = EXCLUDED.status, versi = EXCLUDED.versi, data = EXCLUDED.data,
            diperbarui_pada = now(), epoch = greatest(p.epoch, EXCLUDED.epoch)
        WHERE p.versi < EXCLUDED.versi;
    IF NOT FOUND THEN
        UPDATE pesanan SET epoch = p_epoch WHERE id = p_id AND epoch < p_epoch;
        RETURN 'stale';
    END IF;
    INSERT INTO pesanan_riwayat (pesanan_id, versi, status, message_id, shard)
    VALUES (p_id, p_versi, p_status, p_message_id, p_shard);
    RETURN 'applied';
END
$$;

-- One delivery, in one transaction: dedup claim, then apply or park.
-- Returns 'duplicate', 'applied', 'stale' or 'parked'.
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
    IF EXISTS (SELECT 1 FROM urutan_parkir WHERE pesanan_id = p_id)
       OR (v_epoch IS DISTINCT FROM v_posisi
           AND v_posisi > coalesce(urutan_epoch_selesai(), v_posisi)) THEN
        INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, data, shard, epoch)
        VALUES (p_id, p_message_id, p_status, p_versi, p_data, p_shard, v_posisi);
        RETURN 'parked';
    END IF;
    RETURN urutan_tulis(p_message_id, p_id, p_status, p_versi, p_data, p_shard, v_posisi);
END
$$;

-- Applies, in arrival order, the parked messages of entities parked by
-- p_shard whose epoch every shard has now passed (at most p_batas entities).
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
        FOR r IN SELECT * FROM urutan_parkir u WHERE u.pesanan_id = v_id ORDER BY u.seq LOOP
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
