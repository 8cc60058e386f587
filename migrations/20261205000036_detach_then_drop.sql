-- Issue 33, expiry that costs the workers nothing. Dropping a day partition
-- (urutan_partisi_buang, migration 0026) holds an ACCESS EXCLUSIVE lock on
-- the parent table until its commit, and PostgreSQL removes the
-- partition's files at that commit, under that lock. With a day of a team
-- at 2,000 msg/s (172.8 million dedup and 172.8 million history rows,
-- 42.5 GiB) the two drops took 1.8 and 5.1 s, and every apply waited behind
-- them: p99 0.89 s in those seconds against 5.4 ms without
-- (`benches/sql/day-drop.sh`, on a disk mounted with `discard`, where
-- removing a file trims its blocks).
--
-- Expiry is now two steps, each its own transaction:
-- - urutan_partisi_lepas detaches the expired day partitions: a catalog
--   change, the parent's lock held for milliseconds;
-- - urutan_partisi_hapus drops the tables it detached: removing their
--   files locks nothing a worker uses.
-- A detached table is marked by its comment; one left by a crash between
-- the two steps is dropped by the next pass. urutan_partisi_buang stays,
-- for workers of the previous version during a rolling upgrade.
--
-- Re-runnable: CREATE OR REPLACE.

CREATE OR REPLACE FUNCTION urutan_partisi_lepas(p_tabel TEXT, p_simpan INTERVAL)
RETURNS TABLE (partisi TEXT, baris BIGINT) LANGUAGE plpgsql SECURITY DEFINER
SET lock_timeout = '1s' AS $$
DECLARE
    r RECORD;
BEGIN
    IF p_tabel NOT IN ('pesan_diproses', 'pesanan_riwayat') THEN
        RAISE EXCEPTION 'urutan_partisi_lepas: % is not a partitioned table of urutan', p_tabel;
    END IF;
    FOR r IN
        SELECT c.relname::text AS nama, greatest(c.reltuples, 0)::bigint AS n,
               to_date(right(c.relname, 8), 'YYYYMMDD') AS hari
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = to_regclass(format('%I.%I', current_schema(), p_tabel))
          AND c.relname ~ ('^' || p_tabel || '_h[0-9]{8}$')
        ORDER BY 3
    LOOP
        EXIT WHEN ((r.hari + 1)::timestamp AT TIME ZONE 'UTC') > now() - p_simpan;
        EXECUTE format('ALTER TABLE %I DETACH PARTITION %I', p_tabel, r.nama);
        EXECUTE format('COMMENT ON TABLE %I IS %L', r.nama,
                       format('urutan: an expired day of %s, detached; urutan_partisi_hapus drops it.',
                              p_tabel));
        partisi := r.nama;
        baris := r.n;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION urutan_partisi_lepas(TEXT, INTERVAL) IS
    'Detaches (lepas) the day partitions of pesan_diproses or pesanan_riwayat whose whole UTC day is older than p_simpan, marking each by its comment; urutan_partisi_hapus then drops them in a transaction of its own, so removing their files never holds the parent''s lock. Waits at most 1 s for the lock. SECURITY DEFINER.';

CREATE OR REPLACE FUNCTION urutan_partisi_hapus(p_tabel TEXT)
RETURNS TABLE (partisi TEXT, baris BIGINT) LANGUAGE plpgsql SECURITY DEFINER
SET lock_timeout = '1s' AS $$
DECLARE
    r RECORD;
BEGIN
    IF p_tabel NOT IN ('pesan_diproses', 'pesanan_riwayat') THEN
        RAISE EXCEPTION 'urutan_partisi_hapus: % is not a partitioned table of urutan', p_tabel;
    END IF;
    FOR r IN
        SELECT c.relname::text AS nama, greatest(c.reltuples, 0)::bigint AS n
        FROM pg_class c
        WHERE c.relnamespace = current_schema()::regnamespace
          AND c.relkind = 'r' AND NOT c.relispartition
          AND c.relname ~ ('^' || p_tabel || '_h[0-9]{8}$')
          AND obj_description(c.oid, 'pg_class') LIKE 'urutan: an expired day of %'
        ORDER BY 1
    LOOP
        EXECUTE format('DROP TABLE %I', r.nama);
        partisi := r.nama;
        baris := r.n;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION urutan_partisi_hapus(TEXT) IS
    'Drops (hapus) the expired days of pesan_diproses or pesanan_riwayat that urutan_partisi_lepas detached (a crash between the two leaves them for the next pass); only tables it marked. SECURITY DEFINER.';

-- Every SECURITY DEFINER function searches this schema, then pg_temp
-- (migration 0016's rule).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION urutan_partisi_lepas(TEXT, INTERVAL) SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION urutan_partisi_hapus(TEXT) SET search_path = %I, pg_temp',
                   current_schema());
END
$$;

-- The pool's retention's, not every role's (deploy/postgres/least-privilege.sql
-- grants the worker).
REVOKE EXECUTE ON FUNCTION urutan_partisi_lepas(TEXT, INTERVAL), urutan_partisi_hapus(TEXT) FROM PUBLIC;
