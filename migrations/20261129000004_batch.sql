-- Ordered batch mode: several deliveries of one shard, in arrival order, in
-- ONE transaction and one round trip. Item i is an epoch marker when
-- p_markers[i] is not NULL, otherwise a message applied exactly as
-- urutan_terapkan would apply it on its own (so a batch has the same
-- outcomes as the same messages one by one). Returns one answer per item:
-- 'marker', 'duplicate', 'applied', 'stale' or 'parked'.
CREATE OR REPLACE FUNCTION urutan_terapkan_batch(
    p_message_ids TEXT[], p_ids TEXT[], p_statuses TEXT[], p_versis BIGINT[],
    p_datas TEXT[], p_markers BIGINT[], p_shard INT)
RETURNS TEXT[] LANGUAGE plpgsql AS $$
DECLARE
    v_hasil TEXT[] := '{}';
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_markers, 1), 0) LOOP
        IF p_markers[i] IS NOT NULL THEN
            INSERT INTO urutan_shard (shard, epoch) VALUES (p_shard, p_markers[i])
            ON CONFLICT (shard) DO UPDATE
                SET epoch = greatest(urutan_shard.epoch, EXCLUDED.epoch);
            v_hasil := v_hasil || 'marker'::text;
        ELSE
            v_hasil := v_hasil || urutan_terapkan(p_message_ids[i], p_ids[i], p_statuses[i],
                                                  p_versis[i], p_datas[i]::jsonb, p_shard);
        END IF;
    END LOOP;
    RETURN v_hasil;
END
$$;
