-- Parked versions are bounded per shard (issue 43): with GAP_POLICY=wait a
-- producer could plant any number of versions above a gap (v1000 of an
-- order that has v1), each parked and scanned by every release call of its
-- shard (5,000 of them: 7 -> 50 ms per call). A version that would wait for
-- a gap while its shard already keeps GAP_WAITING_MAX parked rows (the
-- session's `urutan.gap_max`) is dead-lettered instead, with reason
-- `gap_limit`, and its dedup claim is withdrawn so a replay applies it.
-- A held order's waiting versions are not refused (they wait for an
-- operator, and a hold is already visible), nor anything with GAP_POLICY=apply.

-- Whether shard p_shard keeps urutan.gap_max parked rows or more (counted
-- through urutan_parkir_shard_idx, at most that many entries read).
CREATE OR REPLACE FUNCTION urutan_celah_penuh(p_shard INT)
RETURNS BOOLEAN LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_maks BIGINT := coalesce(nullif(current_setting('urutan.gap_max', true), ''), '100000')::bigint;
BEGIN
    RETURN (SELECT count(*) FROM (SELECT 1 FROM urutan_parkir u WHERE u.shard = p_shard
                                  LIMIT v_maks) s) >= v_maks;
END
$$;
COMMENT ON FUNCTION urutan_celah_penuh(INT) IS 'Is the shard full (penuh) of parked versions: at least urutan.gap_max (GAP_WAITING_MAX) rows in urutan_parkir? A version that would wait for a gap is then dead-lettered as gap_limit.';

CREATE OR REPLACE FUNCTION urutan_terapkan(p_pesan JSONB, p_shard INT)
RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    v_message_id TEXT := p_pesan->>'message_id';
    v_id         TEXT := p_pesan->>'id';
    v_versi_baru BIGINT := (p_pesan->>'versi')::bigint;
    v_posisi BIGINT;  -- epochs this shard has passed: the message's epoch
    v_epoch  BIGINT;  -- epoch of the entity's last applied message (NULL: never seen)
    v_versi  BIGINT;  -- the entity's stored version (NULL: never seen)
    v_tahan  RECORD;  -- the order's hold
    v_ditahan BOOLEAN;  -- the order is held
    v_lewat  BOOLEAN := false;  -- this message is what holds the order: it goes through
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
    -- A copy of a message claimed on an earlier day (another partition) or
    -- parked for this order: possible only for a version not newer than the
    -- stored one, or one parked (migration 0026).
    IF v_versi_baru <= coalesce(v_versi, 0)
       OR EXISTS (SELECT 1 FROM urutan_parkir u
                  WHERE u.pesanan_id = v_id AND u.message_id = v_message_id) THEN
        v_hasil := urutan_klaim_lama(v_message_id, v_id);
        IF v_hasil IS NOT NULL THEN
            RETURN v_hasil;
        END IF;
    END IF;
    SELECT t.alasan, t.message_id INTO v_tahan FROM urutan_tahan t WHERE t.pesanan_id = v_id;
    v_ditahan := FOUND;
    IF v_ditahan THEN
        v_lewat := v_tahan.message_id = v_message_id
                   OR (v_tahan.alasan = 'gap' AND v_versi_baru = coalesce(v_versi, 0) + 1);
    END IF;
    IF (v_ditahan AND NOT v_lewat AND v_versi_baru > coalesce(v_versi, 0))
       OR (NOT v_lewat AND v_versi_baru > coalesce(v_versi, 0) + 1 AND (
           urutan_celah_tunggu()
           OR EXISTS (SELECT 1 FROM urutan_parkir WHERE pesanan_id = v_id AND epoch <= v_posisi)
           OR urutan_jendela_terbuka(v_posisi)
           OR (v_epoch IS DISTINCT FROM v_posisi
               AND v_posisi > coalesce(urutan_epoch_selesai(), v_posisi))
           OR urutan_menunggu_kembali(v_id, v_versi_baru, v_versi))) THEN
        -- A version waiting for a gap only (GAP_POLICY=wait, its order not
        -- held): refused once the shard already keeps urutan.gap_max parked
        -- rows, so what a producer plants stays bounded (issue 43). Its
        -- claim goes with it: a replay is applied, not a duplicate.
        IF NOT v_ditahan AND urutan_celah_tunggu()
           AND urutan_celah_penuh(p_shard) THEN
            DELETE FROM pesan_diproses d
            WHERE d.message_id = v_message_id AND d.pesanan_id = v_id
              AND d.diproses_pada = now();
            RETURN 'gap_limit';
        END IF;
        INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, data, shard, epoch, pesan)
        VALUES (v_id, v_message_id, p_pesan->>'status', v_versi_baru, p_pesan->'data',
                p_shard, v_posisi, p_pesan);
        RETURN 'parked';
    END IF;
    v_hasil := urutan_tulis(p_pesan, p_shard, v_posisi);
    IF v_lewat THEN
        DELETE FROM urutan_tahan WHERE pesanan_id = v_id;
    END IF;
    RETURN v_hasil;
END
$$;


COMMENT ON FUNCTION urutan_terapkan(JSONB, INT) IS 'Applies one message (terapkan: apply) in one transaction: dedup claim per order, then parking (a held order, or older versions that may still come; a gap''s waiting version refused as gap_limit once its shard keeps GAP_WAITING_MAX parked rows), else the versioned write; the message holding its order goes through and ends the hold.';
