-- Deduplication per order (issue 29, docs/security.md "Deduplication per order").
--
-- A message id used to be a duplicate for every order once any order had
-- recorded it: a producer that reused (or guessed: `order-17-v3`) another
-- producer's id had the victim's event dropped as `duplicate`. Now the claim
-- records the order, and an id already recorded
--   * for the same order is a `duplicate` (as before: a redelivery, a resend);
--   * for ANOTHER order is `message_id_reused`: the worker dead-letters that
--     delivery with its record (visible, counted, never silently dropped),
--     and the order that recorded the id keeps it.
--
-- Existing rows: the order is taken from the history (applied versions),
-- from the parked messages, and from the outbox (the relay publishes outbox
-- row n as message id 'n' for its `agregat_id`). A row whose order cannot be
-- known (a stale delivery of a producer publishing directly) keeps
-- pesanan_id = '' ("recorded before orders were recorded"): its id stays a
-- duplicate for ANY order, as before this migration, until retention
-- (DEDUP_RETENTION, 30 days by default) purges it. No order id is '' (the
-- contract's ids are 1-128 bytes), and no new row gets '': the column has no
-- default once this migration ends, so every claim names its order.
--
-- ADD COLUMN with a constant default is a catalog change (PostgreSQL 11+):
-- no table rewrite, the ACCESS EXCLUSIVE lock is held for milliseconds. The
-- backfill updates only rows it finds an order for (row locks, no table lock).

ALTER TABLE pesan_diproses ADD COLUMN IF NOT EXISTS pesanan_id TEXT NOT NULL DEFAULT '';

UPDATE pesan_diproses d SET pesanan_id = r.pesanan_id
FROM pesanan_riwayat r
WHERE r.message_id = d.message_id AND d.pesanan_id = '';

UPDATE pesan_diproses d SET pesanan_id = u.pesanan_id
FROM urutan_parkir u
WHERE u.message_id = d.message_id AND d.pesanan_id = '';

UPDATE pesan_diproses d SET pesanan_id = o.agregat_id
FROM outbox o
WHERE o.id::text = d.message_id AND d.pesanan_id = '';

ALTER TABLE pesan_diproses ALTER COLUMN pesanan_id DROP DEFAULT;

-- What an id that could not be claimed (already recorded) means for order
-- p_id: 'duplicate' (recorded for p_id, or for an unknown order before this
-- migration, or purged meanwhile) or 'message_id_reused'.
CREATE OR REPLACE FUNCTION urutan_sudah_diproses(p_message_id TEXT, p_id TEXT)
RETURNS TEXT LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT CASE WHEN d.pesanan_id IN (p_id, '') THEN 'duplicate'
                                 ELSE 'message_id_reused' END
                     FROM pesan_diproses d WHERE d.message_id = p_message_id),
                    'duplicate')
$$;

-- Migration 0010's urutan_terapkan; the claim records the order, and only
-- this order's returned message is no longer waited for. Returns
-- 'duplicate', 'message_id_reused', 'applied', 'stale' or 'parked'.
-- (The batch's per-message loop calls this one.)
CREATE OR REPLACE FUNCTION urutan_terapkan(
    p_message_id TEXT, p_id TEXT, p_status TEXT, p_versi BIGINT, p_data JSONB, p_shard INT)
RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    v_posisi BIGINT;  -- epochs this shard has passed: the message's epoch
    v_epoch  BIGINT;  -- epoch of the entity's last applied message (NULL: never seen)
    v_versi  BIGINT;  -- the entity's stored version (NULL: never seen)
BEGIN
    -- Back after a return (whatever this delivery's outcome).
    DELETE FROM urutan_dikembalikan WHERE message_id = p_message_id AND pesanan_id = p_id;
    INSERT INTO pesan_diproses (message_id, pesanan_id) VALUES (p_message_id, p_id)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN urutan_sudah_diproses(p_message_id, p_id);
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

-- Migration 0010's trigger: a dead letter ends the wait for its own order's
-- returned message only (a reused id dead-lettered for another order must
-- not release the order that recorded it).
CREATE OR REPLACE FUNCTION urutan_dikembalikan_mati() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM urutan_dikembalikan
    WHERE message_id = NEW.message_id AND pesanan_id = NEW.pesanan_id;
    RETURN NULL;
END
$$;

-- The set-based batch (migration 0007, renamed in 0009): the claim records
-- each id with the order of its first copy in the batch; a copy that is not
-- claimed is a 'duplicate' or 'message_id_reused' exactly as
-- urutan_sudah_diproses says for it (the per-message loop's answers).
CREATE OR REPLACE FUNCTION urutan_terapkan_batch_himpun(
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

    -- Dedup: the first copy of a message id not seen before is new, for its
    -- order; later copies (in this batch or after it) are not.
    WITH klaim AS (
        INSERT INTO pesan_diproses (message_id, pesanan_id)
        SELECT DISTINCT ON (message_id) message_id, id
        FROM unnest(p_message_ids, p_ids) WITH ORDINALITY AS t(message_id, id, i)
        ORDER BY message_id, i
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
    SELECT array_agg(CASE WHEN n.i IS NULL THEN urutan_sudah_diproses(m.message_id, m.id)
                          WHEN n.diterapkan THEN 'applied'
                          ELSE 'stale' END ORDER BY m.i)
    INTO v_hasil
    FROM masuk m LEFT JOIN nilai n ON n.i = m.i;

    RETURN v_hasil;
END
$$;
