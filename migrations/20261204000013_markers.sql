-- Markers only from urutan (docs/security.md, "Epoch markers").
--
-- A worker passes a marker only when it came the way urutan sends markers
-- (the default exchange, the shard's own queue as routing key: checked in
-- src/broker/delivery.rs) AND names an epoch urutan recorded. A marker for
-- an epoch above the highest recorded one, or for one never recorded, does
-- not move the shard's position: the worker dead-letters it
-- (`reserved_header`). A marker at or below the shard's position changes
-- nothing and is passed as before (a redelivered marker, also of an epoch
-- pruned since: see urutan_epoch_pangkas).

-- Passes the marker of p_epoch on p_shard if urutan recorded that epoch;
-- false (the position untouched) for a forged one.
CREATE OR REPLACE FUNCTION urutan_lewati_penanda(p_shard INT, p_epoch BIGINT)
RETURNS BOOLEAN LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM urutan_epoch WHERE epoch = p_epoch)
       AND p_epoch > coalesce((SELECT epoch FROM urutan_shard WHERE shard = p_shard), 0) THEN
        RETURN false;
    END IF;
    INSERT INTO urutan_shard (shard, epoch) VALUES (p_shard, p_epoch)
    ON CONFLICT (shard) DO UPDATE SET epoch = greatest(urutan_shard.epoch, EXCLUDED.epoch);
    RETURN true;
END
$$;

-- Migration 0004's loop (renamed by 0006), with its markers checked: a
-- forged one answers 'marker_forged' and moves nothing.
CREATE OR REPLACE FUNCTION urutan_terapkan_batch_urut(
    p_message_ids TEXT[], p_ids TEXT[], p_statuses TEXT[], p_versis BIGINT[],
    p_datas TEXT[], p_markers BIGINT[], p_shard INT)
RETURNS TEXT[] LANGUAGE plpgsql AS $$
DECLARE
    v_hasil TEXT[] := '{}';
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_markers, 1), 0) LOOP
        IF p_markers[i] IS NOT NULL THEN
            v_hasil := v_hasil || CASE WHEN urutan_lewati_penanda(p_shard, p_markers[i])
                                       THEN 'marker' ELSE 'marker_forged' END;
        ELSE
            v_hasil := v_hasil || urutan_terapkan(p_message_ids[i], p_ids[i], p_statuses[i],
                                                  p_versis[i], p_datas[i]::jsonb, p_shard);
        END IF;
    END LOOP;
    RETURN v_hasil;
END
$$;

-- Every (re)connect of a pool or a relay opens an epoch, so urutan_epoch
-- grew by a row per reconnect. Called after each new epoch: deletes the
-- oldest epochs, keeping the newest p_simpan and every epoch some active
-- shard has not passed yet (those are awaited; windows and the ring
-- compare epoch numbers, never rows). What is deleted lies below every
-- active shard's position, so a redelivered marker of it changes nothing,
-- and `urutan explain` answers "-" for versions applied before the oldest
-- epoch kept instead of a wrong epoch. SECURITY DEFINER: the worker and
-- relay roles may insert epochs but not delete them. Returns the rows
-- deleted.
CREATE OR REPLACE FUNCTION urutan_epoch_pangkas(p_simpan INT) RETURNS BIGINT
LANGUAGE sql SECURITY DEFINER AS $$
    WITH batas AS (
        SELECT least(
            coalesce((SELECT min(epoch) FROM urutan_shard WHERE aktif), 0),
            coalesce((SELECT epoch FROM urutan_epoch
                      ORDER BY epoch DESC OFFSET greatest(p_simpan, 1) - 1 LIMIT 1), 0)) AS b
    ), hapus AS (
        DELETE FROM urutan_epoch WHERE epoch < (SELECT b FROM batas) RETURNING 1
    )
    SELECT count(*) FROM hapus
$$;

-- Its search path: this schema, then pg_temp last (a caller's temporary
-- table must never stand in for urutan_epoch or urutan_shard).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION urutan_epoch_pangkas(INT) SET search_path = %s, pg_temp',
                   current_setting('search_path'));
END
$$;
