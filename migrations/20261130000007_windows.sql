-- Per-order order for EVERY producer, not only the relay (see src/handoff.rs).
--
-- Epoch markers separate the old ring from the new only if they are queued
-- before anything the new ring routes. urutan's relay waits for them; a
-- producer that publishes straight to the exchange does not: after a broker
-- restart (the ring is rebuilt in another order up to RabbitMQ 4.1) or
-- during a resharding its messages can be routed by the new ring ahead of
-- the markers, and then "same epoch" no longer means "same shard".
--
-- A *window* covers that: it is opened (recorded) before a ring change can
-- route anything in a way the markers do not separate (before a resharding
-- touches the bindings; on the first connection after a broker restart,
-- before anything is consumed), and it is closed by the epoch opened after
-- the change (`epoch`, NULL until that epoch is open). Until every shard has
-- passed that epoch, a message that arrives before it (position below it)
-- may have been overtaken by nothing or may overtake an older message of
-- its order still queued on another shard.
--
-- The rule for one message of order X at version v, position p:
--   * v <= stored version + 1 (1 for a new order): nothing older can still
--     be on its way: applied (or stale) at once, whatever else holds.
--   * otherwise it waits (parked) while an older message of X may still be
--     queued elsewhere: X has a parked message at or before p, or a window
--     is open for p, or X was last applied in another epoch than p and not
--     every shard has passed p. Parked messages are released in version
--     order, each as soon as it is the next version of its order, or once
--     every shard has passed its epoch and no window is open.

CREATE TABLE IF NOT EXISTS urutan_jendela (
    jendela      BIGSERIAL PRIMARY KEY,
    -- Why: 'broker restarted', 'resharding 4 -> 6', ...
    sebab        TEXT NOT NULL,
    -- The epoch opened after the ring change (NULL: not open yet).
    epoch        BIGINT,
    dibuka_pada  TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Set once every shard has passed `epoch` (bookkeeping: a window whose
    -- epoch every shard passed is closed whether or not this is set).
    ditutup_pada TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS urutan_jendela_terbuka_idx ON urutan_jendela (epoch)
    WHERE ditutup_pada IS NULL;

-- Migration 0005's "ring change cut short" flag is a window whose epoch is
-- not open yet: carry it over. The table stays (empty, no longer read by
-- this version) so that replicas of the previous version keep working during
-- a rolling upgrade; a later migration drops it.
WITH flag AS (DELETE FROM urutan_ring_berubah RETURNING sejak)
INSERT INTO urutan_jendela (sebab, dibuka_pada)
SELECT 'ring change cut short', sejak FROM flag;

-- Is a ring change not yet behind a message at position p_posisi? True while
-- a window's epoch is not open, or is above p_posisi (the message may sit
-- before that epoch's marker, among messages of both rings).
CREATE OR REPLACE FUNCTION urutan_jendela_terbuka(p_posisi BIGINT) RETURNS BOOLEAN
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM urutan_jendela
                   WHERE ditutup_pada IS NULL AND (epoch IS NULL OR epoch > p_posisi))
$$;

-- The versioned write: moves the entity forward only; one history row per
-- applied version. Returns 'applied' or 'stale'. A stale message no longer
-- carries its entity into its epoch (migration 0002 did): an old version
-- (a replay, a producer's resend) says nothing about where the entity's
-- newer messages are routed, so it must not let them skip the wait.
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
    v_versi  BIGINT;  -- the entity's stored version (NULL: never seen)
BEGIN
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
               AND v_posisi > coalesce(urutan_epoch_selesai(), v_posisi))) THEN
        INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, data, shard, epoch)
        VALUES (p_id, p_message_id, p_status, p_versi, p_data, p_shard, v_posisi);
        RETURN 'parked';
    END IF;
    RETURN urutan_tulis(p_message_id, p_id, p_status, p_versi, p_data, p_shard, v_posisi);
END
$$;

-- Applies the parked messages of entities parked by p_shard that may go now
-- (at most p_batas entities), each entity's in version order: a message goes
-- when it is the entity's next version (or older: stale), or when every
-- shard has passed its epoch and no window is open; the first that may not
-- go keeps the rest of its entity waiting.
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
          AND ((v_bebas AND u.epoch <= v_selesai) OR u.versi <= coalesce(p.versi, 0) + 1)
        ORDER BY u.pesanan_id LIMIT p_batas
    LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(v_id, 7261));
        SELECT p.versi INTO v_versi FROM pesanan p WHERE p.id = v_id;
        pertama := true;
        FOR r IN SELECT * FROM urutan_parkir u WHERE u.pesanan_id = v_id
                 ORDER BY u.versi, u.seq LOOP
            EXIT WHEN r.versi > coalesce(v_versi, 0) + 1
                      AND NOT (v_bebas AND r.epoch <= v_selesai);
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

-- Ordered batch mode, set-based (migration 0006), with the window in the
-- test that sends a batch through the per-message loop.
CREATE OR REPLACE FUNCTION urutan_terapkan_batch(
    p_message_ids TEXT[], p_ids TEXT[], p_statuses TEXT[], p_versis BIGINT[],
    p_datas TEXT[], p_markers BIGINT[], p_shard INT)
RETURNS TEXT[] LANGUAGE plpgsql AS $$
DECLARE
    v_posisi BIGINT;  -- epochs this shard has passed: the epoch of every message here
    v_klaim  TEXT[];  -- message ids claimed now (not seen before)
    v_hasil  TEXT[];
BEGIN
    IF coalesce(array_length(p_markers, 1), 0) = 0 THEN
        RETURN '{}';
    END IF;
    -- A marker moves the shard's epoch in the middle of the batch: loop.
    IF EXISTS (SELECT 1 FROM unnest(p_markers) m WHERE m IS NOT NULL) THEN
        RETURN urutan_terapkan_batch_urut(p_message_ids, p_ids, p_statuses, p_versis,
                                          p_datas, p_markers, p_shard);
    END IF;

    -- Every entity of the batch, one at a time across shards (the loop takes
    -- the same locks one by one; a fixed order here avoids deadlocks).
    PERFORM pg_advisory_xact_lock(k)
    FROM (SELECT DISTINCT hashtextextended(id, 7261) AS k FROM unnest(p_ids) id ORDER BY 1) s;

    -- Could any message park (urutan_terapkan's rule, without its exemption
    -- of next versions)? Then the loop decides, message by message. The
    -- shard's epoch cannot move within this batch.
    SELECT epoch INTO v_posisi FROM urutan_shard WHERE shard = p_shard;
    v_posisi := coalesce(v_posisi, 0);
    IF EXISTS (SELECT 1 FROM urutan_parkir WHERE pesanan_id = ANY (p_ids) AND epoch <= v_posisi)
       OR urutan_jendela_terbuka(v_posisi)
       OR (v_posisi > coalesce(urutan_epoch_selesai(), v_posisi)
           AND EXISTS (SELECT 1 FROM unnest(p_ids) d(id) LEFT JOIN pesanan p ON p.id = d.id
                       WHERE p.epoch IS DISTINCT FROM v_posisi)) THEN
        RETURN urutan_terapkan_batch_urut(p_message_ids, p_ids, p_statuses, p_versis,
                                          p_datas, p_markers, p_shard);
    END IF;

    -- Dedup: the first copy of a message id not seen before is new; later
    -- copies (in this batch or after it) are duplicates.
    WITH klaim AS (
        INSERT INTO pesan_diproses (message_id)
        SELECT DISTINCT message_id FROM unnest(p_message_ids) message_id
        ON CONFLICT DO NOTHING
        RETURNING message_id
    )
    SELECT coalesce(array_agg(message_id), '{}') INTO v_klaim FROM klaim;

    -- A new message is applied when its version is above the stored one and
    -- above every earlier new message of its entity in this batch; otherwise
    -- it is stale. The entity ends at its last applied message.
    WITH masuk AS (
        SELECT *
        FROM unnest(p_message_ids, p_ids, p_statuses, p_versis, p_datas)
             WITH ORDINALITY AS t(message_id, id, status, versi, data, i)
    ),
    baru AS (
        SELECT DISTINCT ON (message_id) *
        FROM masuk WHERE message_id = ANY (v_klaim)
        ORDER BY message_id, i
    ),
    nilai AS (
        SELECT b.*,
               coalesce(b.versi > greatest(p.versi, max(b.versi) OVER sebelumnya), true)
                   AS diterapkan
        FROM baru b LEFT JOIN pesanan p ON p.id = b.id
        WINDOW sebelumnya AS (PARTITION BY b.id ORDER BY b.i
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
    ),
    tulis AS (
        INSERT INTO pesanan AS p (id, status, versi, data, epoch)
        SELECT DISTINCT ON (id) id, status, versi, data::jsonb, v_posisi
        FROM nilai WHERE diterapkan
        ORDER BY id, i DESC
        ON CONFLICT (id) DO UPDATE
            SET status = EXCLUDED.status, versi = EXCLUDED.versi, data = EXCLUDED.data,
                diperbarui_pada = now(), epoch = greatest(p.epoch, EXCLUDED.epoch)
            WHERE p.versi < EXCLUDED.versi
        RETURNING 1
    ),
    riwayat AS (
        INSERT INTO pesanan_riwayat (pesanan_id, versi, status, message_id, shard)
        SELECT id, versi, status, message_id, p_shard
        FROM nilai WHERE diterapkan
        ORDER BY i
        RETURNING 1
    )
    SELECT array_agg(CASE WHEN n.i IS NULL THEN 'duplicate'
                          WHEN n.diterapkan THEN 'applied'
                          ELSE 'stale' END ORDER BY m.i)
    INTO v_hasil
    FROM masuk m LEFT JOIN nilai n ON n.i = m.i;

    RETURN v_hasil;
END
$$;
