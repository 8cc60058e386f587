-- Ordered batch mode, set-based. urutan_terapkan_batch (migration 0004)
-- applied a batch by calling urutan_terapkan once per message: correct, but
-- five to eight statements per message inside PL/pgSQL. The common batch
-- (no epoch marker in it, no entity of it parked or waiting for an epoch)
-- is now applied with a handful of set-based statements over the arrays:
-- one dedup claim for all message ids, one versioned upsert per entity, one
-- history insert, in arrival order. Everything else still goes through the
-- per-message loop, which stays the reference: both give the same outcomes,
-- rows and history order (tests/it/batch.rs compares them on random streams).

-- The per-message loop of migration 0004 keeps its body under a new name.
-- (Re-runnable, like every migration here: renamed only the first time.)
DO $$
BEGIN
    IF to_regprocedure('urutan_terapkan_batch_urut(text[], text[], text[], bigint[], text[], bigint[], integer)') IS NULL THEN
        ALTER FUNCTION urutan_terapkan_batch(TEXT[], TEXT[], TEXT[], BIGINT[], TEXT[], BIGINT[], INT)
            RENAME TO urutan_terapkan_batch_urut;
    END IF;
END
$$;

-- Same arguments and answers as before ('marker', 'duplicate', 'applied',
-- 'stale', 'parked', one per item, in order).
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

    -- Would any message park (urutan_terapkan's rule)? Then the loop decides,
    -- message by message. The shard's epoch cannot move within this batch.
    SELECT epoch INTO v_posisi FROM urutan_shard WHERE shard = p_shard;
    v_posisi := coalesce(v_posisi, 0);
    IF EXISTS (SELECT 1 FROM urutan_parkir WHERE pesanan_id = ANY (p_ids) AND epoch <= v_posisi)
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

    -- A stale message still carries the entity into this epoch (urutan_tulis).
    UPDATE pesanan SET epoch = v_posisi
    WHERE epoch < v_posisi
      AND id IN (SELECT p_ids[i] FROM generate_subscripts(v_hasil, 1) i WHERE v_hasil[i] = 'stale');

    RETURN v_hasil;
END
$$;
