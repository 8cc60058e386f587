-- Issue 32: `urutan explain` shows stale arrivals. A version that arrived
-- after a newer one (outcome `stale`) left only its message id in
-- pesan_diproses, so explain showed a version that did arrive as "missing
-- ... never applied", and one older than the stored version not at all.
-- Each stale arrival is now recorded in urutan_basi (basi: stale) with its
-- order, version, message id, shard and time, by the two places that
-- decide `stale`: urutan_tulis (strict mode, the batch loop, releases) and
-- the set-based batch. Applied, parked and duplicate messages write nothing
-- more, so the cost is one small row per stale arrival only (measured in
-- docs/performance.md). Rows expire with DEDUP_RETENTION, like the
-- message ids they describe.

CREATE TABLE IF NOT EXISTS urutan_basi (
    seq        BIGSERIAL PRIMARY KEY,
    pesanan_id TEXT NOT NULL,
    versi      BIGINT NOT NULL,
    message_id TEXT NOT NULL,
    shard      INT NOT NULL,
    tiba_pada  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS urutan_basi_pesanan ON urutan_basi (pesanan_id, versi);
CREATE INDEX IF NOT EXISTS urutan_basi_tiba_pada ON urutan_basi (tiba_pada);

-- Migration 0023's urutan_tulis, recording a stale arrival.
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
        INSERT INTO urutan_basi (pesanan_id, versi, message_id, shard)
        VALUES (v_id, v_versi, p_pesan->>'message_id', p_shard);
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

-- Migration 0018's set-based batch, recording its stale arrivals.
CREATE OR REPLACE FUNCTION urutan_terapkan_batch_himpun(p_pesan JSONB, p_shard INT)
RETURNS TEXT[] LANGUAGE plpgsql AS $$
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
        RETURNING 1    ),
    basi AS (
        INSERT INTO urutan_basi (pesanan_id, versi, message_id, shard)
        SELECT id, versi, message_id, p_shard
        FROM nilai WHERE NOT diterapkan
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

COMMENT ON TABLE urutan_basi IS
    'Stale arrivals (basi: stale): each message that arrived after a newer version of its order was applied, for `urutan explain`. Rows older than DEDUP_RETENTION are purged.';
COMMENT ON COLUMN urutan_basi.versi IS 'The version that arrived stale.';
COMMENT ON COLUMN urutan_basi.tiba_pada IS 'When it arrived (tiba: arrive) and was found stale.';
COMMENT ON FUNCTION urutan_tulis(JSONB, INT, BIGINT) IS
    'Writes (tulis) an applied version: the forward-only state, its history row, the HANDLER_FUNCTION call; with the option urutan.acara, the event for a Rust handler in urutan.acara_terakhir. stale when not newer (recorded in urutan_basi).';
COMMENT ON FUNCTION urutan_terapkan_batch_himpun(JSONB, INT) IS
    'The set-based body of the batch (himpun: gathered): one dedup claim, one versioned upsert per order, one history insert, stale arrivals recorded. Hands the batch to the per-message loop when a marker is in it or any message could park.';
