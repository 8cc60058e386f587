-- Issue 33, database CPU per message: two lookups of the set-based batch
-- (migration 0026's urutan_terapkan_batch_himpun) cost more than their
-- work, measured with `perf` on `benches/sql/batch-db-cost.sh`:
--
-- - Each message's stored version was read by joining the batch to
--   `pesanan`. The planner cannot know how many rows the batch has (a
--   jsonb_array_elements) and, while `pesanan` is small enough, hashed the
--   batch and scanned the whole table for every batch (2,000 rows per 128
--   messages in the benchmark). It is now a scalar subquery per message: one
--   probe of the primary key each, whatever the table's size.
-- - The new messages were picked with `message_id = ANY (v_klaim)`, every
--   message compared with every claimed id (128 x 128 per batch); it is now
--   `IN (SELECT unnest(v_klaim))`, a hashed lookup.
--
-- Same decisions, same outcomes. Re-runnable: CREATE OR REPLACE.

CREATE OR REPLACE FUNCTION urutan_terapkan_batch_himpun(p_pesan jsonb, p_shard integer) RETURNS text[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_posisi BIGINT;  -- epochs this shard has passed: the epoch of every message here
    v_ids    TEXT[];  -- the order of each item, in arrival order
    v_klaim  TEXT[];  -- message ids claimed now (not seen before)
    v_hasil  TEXT[];
BEGIN
    IF coalesce(jsonb_array_length(p_pesan), 0) = 0 THEN
        RETURN '{}';
    END IF;
    -- A marker moves the shard's epoch in the middle of the batch: loop.
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_pesan) e WHERE e ? 'marker') THEN
        RETURN urutan_terapkan_batch_urut(p_pesan, p_shard);
    END IF;
    v_ids := ARRAY(SELECT e->>'id' FROM jsonb_array_elements(p_pesan) WITH ORDINALITY AS t(e, i)
                   ORDER BY i);

    -- Every entity of the batch, one at a time across shards (the loop takes
    -- the same locks one by one; a fixed order here avoids deadlocks).
    PERFORM pg_advisory_xact_lock(k)
    FROM (SELECT DISTINCT hashtextextended(id, 7261) AS k FROM unnest(v_ids) id ORDER BY 1) s;

    -- Could any message park (urutan_terapkan's rule, without its exemption
    -- of next versions)? Then the loop decides, message by message. The
    -- shard's epoch cannot move within this batch.
    SELECT epoch INTO v_posisi FROM urutan_shard WHERE shard = p_shard;
    v_posisi := coalesce(v_posisi, 0);
    IF EXISTS (SELECT 1 FROM urutan_parkir WHERE pesanan_id = ANY (v_ids) AND epoch <= v_posisi)
       OR urutan_jendela_terbuka(v_posisi)
       OR (v_posisi > coalesce(urutan_epoch_selesai(), v_posisi)
           AND EXISTS (SELECT 1 FROM unnest(v_ids) d(id) LEFT JOIN pesanan p ON p.id = d.id
                       WHERE p.epoch IS DISTINCT FROM v_posisi)) THEN
        RETURN urutan_terapkan_batch_urut(p_pesan, p_shard);
    END IF;

    -- Dedup: the first copy of a message id not seen before is new, for its
    -- order; later copies (in this batch or after it) are not.
    WITH klaim AS (
        INSERT INTO pesan_diproses (message_id, pesanan_id)
        SELECT DISTINCT ON (message_id) message_id, id
        FROM (SELECT e->>'message_id' AS message_id, e->>'id' AS id, i
              FROM jsonb_array_elements(p_pesan) WITH ORDINALITY AS t(e, i)) m
        ORDER BY message_id, i
        ON CONFLICT DO NOTHING
        RETURNING message_id
    )
    SELECT coalesce(array_agg(message_id), '{}') INTO v_klaim FROM klaim;

    -- A new message is applied when its version is above the stored one and
    -- above every earlier new message of its entity in this batch; otherwise
    -- it is stale. The entity ends at its last applied message.
    WITH masuk AS (
        SELECT e->>'message_id' AS message_id, e->>'id' AS id, e->>'status' AS status,
               (e->>'versi')::bigint AS versi, e->'data' AS data, i
        FROM jsonb_array_elements(p_pesan) WITH ORDINALITY AS t(e, i)
    ),
    baru AS (
        SELECT DISTINCT ON (message_id) *
        FROM masuk WHERE message_id IN (SELECT unnest(v_klaim))
        ORDER BY message_id, i
    ),
    nilai AS (
        SELECT b.*,
               coalesce(b.versi > greatest((SELECT p.versi FROM pesanan p WHERE p.id = b.id),
                                           max(b.versi) OVER sebelumnya), true)
                   AS diterapkan
        FROM baru b
        WINDOW sebelumnya AS (PARTITION BY b.id ORDER BY b.i
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
    ),
    tulis AS (
        INSERT INTO pesanan AS p (id, status, versi, data, epoch)
        SELECT DISTINCT ON (id) id, status, versi, data, v_posisi
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
    ),
    -- Not newer: a copy of a message claimed on an earlier day is a
    -- duplicate (or a reused id), not stale (migration 0026).
    lama AS (
        SELECT i, urutan_klaim_lama(message_id, id) AS hasil
        FROM nilai WHERE NOT diterapkan
    ),
    basi AS (
        INSERT INTO urutan_basi (pesanan_id, versi, message_id, shard)
        SELECT n.id, n.versi, n.message_id, p_shard
        FROM nilai n JOIN lama l ON l.i = n.i WHERE l.hasil IS NULL
        RETURNING 1
    )
    SELECT array_agg(CASE WHEN n.i IS NULL THEN urutan_sudah_diproses(m.message_id, m.id)
                          WHEN n.diterapkan THEN 'applied'
                          ELSE coalesce(l.hasil, 'stale') END ORDER BY m.i)
    INTO v_hasil
    FROM masuk m LEFT JOIN nilai n ON n.i = m.i LEFT JOIN lama l ON l.i = m.i;

    RETURN v_hasil;
END
$$;

COMMENT ON FUNCTION urutan_terapkan_batch_himpun(JSONB, INT) IS
    'The set-based body of the batch (himpun: gathered): one dedup claim, one versioned upsert per order (its stored version read by primary key), one history insert, stale arrivals recorded. Hands the batch to the per-message loop when a marker is in it or any message could park.';
