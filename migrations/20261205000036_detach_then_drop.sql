-- Issue 33, expiry that costs the workers nothing. Dropping a day partition
-- (urutan_partisi_buang, migration 0026) holds an ACCESS EXCLUSIVE lock on
-- the parent table until its commit, and PostgreSQL removes the
-- partition's files at that commit, under that lock. With a day of a team
-- at 2,000 msg/s (172.8 million dedup and 172.8 million history rows,
-- 42.5 GiB) the two drops took 1.8 and 5.1 s, and every apply waited behind
-- them: p99 0.89 s in those seconds against 5.4 ms without
-- (`benches/sql/day-drop.sh`, on a disk mounted with `discard`, where
-- removing a file trims its blocks). The id-range partitions of the outbox
-- and the effects (migration 0033, urutan_partisi_id_buang) went the same
-- way: a producer's outbox INSERT waited while a settled partition's files
-- were removed.
--
-- Expiry is now two steps, each its own transaction:
-- - urutan_partisi_lepas (days) and urutan_partisi_id_lepas (id ranges,
--   with the same checks under the partition's lock as before) detach the
--   expired partitions: a catalog change, the parent's lock held for
--   milliseconds;
-- - urutan_partisi_hapus drops the tables they detached: removing their
--   files locks nothing a worker, the relay or a producer uses.
-- A detached table is marked by its comment; one left by a crash between
-- the two steps is dropped by the next pass. urutan_partisi_buang and
-- urutan_partisi_id_buang stay, for the previous version's processes
-- during a rolling upgrade.
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
                       format('urutan: detached, expired: a day of %s; urutan_partisi_hapus drops it.',
                              p_tabel));
        partisi := r.nama;
        baris := r.n;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION urutan_partisi_lepas(TEXT, INTERVAL) IS
    'Detaches (lepas) the day partitions of pesan_diproses or pesanan_riwayat whose whole UTC day is older than p_simpan, marking each by its comment; urutan_partisi_hapus then drops them in a transaction of its own, so removing their files never holds the parent''s lock. Waits at most 1 s for the lock. SECURITY DEFINER.';

CREATE OR REPLACE FUNCTION urutan_partisi_id_lepas(p_tabel TEXT, p_simpan INTERVAL)
RETURNS TABLE (partisi TEXT, baris BIGINT) LANGUAGE plpgsql SECURITY DEFINER
SET lock_timeout = '1s' AS $$
DECLARE
    v_kolom  TEXT;
    v_urutan TEXT;
    v_kini   BIGINT;
    v_menunggu TEXT;   -- a row of the partition that still has work to do
    v_terbaru TIMESTAMPTZ;
    v_ada    BOOLEAN;
    r RECORD;
BEGIN
    SELECT k.kolom, k.urutan INTO v_kolom, v_urutan FROM urutan_partisi_id_kolom(p_tabel) k;
    v_menunggu := CASE p_tabel WHEN 'outbox' THEN 'dikirim_pada IS NULL'
                               ELSE 'keadaan <> ''terkirim''' END;
    EXECUTE format('SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM %I',
                   v_urutan) INTO v_kini;
    FOR r IN
        SELECT d.partisi AS nama, d.ke, greatest(c.reltuples, 0)::bigint AS n
        FROM urutan_partisi_id_daftar(p_tabel) d
        JOIN pg_class c ON c.oid = to_regclass(format('%I.%I', current_schema(), d.partisi))
        WHERE d.ke <= v_kini
        ORDER BY d.dari
    LOOP
        -- Too recent: no lock needed to tell.
        EXECUTE format('SELECT dibuat_pada FROM %I ORDER BY %I DESC LIMIT 1', r.nama, v_kolom)
        INTO v_terbaru;
        CONTINUE WHEN v_terbaru >= now() - p_simpan;
        BEGIN
            EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', r.nama);
        EXCEPTION WHEN lock_not_available THEN
            CONTINUE;
        END;
        -- Under the lock: nothing waits, and no late row came in between.
        EXECUTE format('SELECT dibuat_pada FROM %I ORDER BY %I DESC LIMIT 1', r.nama, v_kolom)
        INTO v_terbaru;
        CONTINUE WHEN v_terbaru >= now() - p_simpan;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE %s)', r.nama, v_menunggu) INTO v_ada;
        CONTINUE WHEN v_ada;
        EXECUTE format('ALTER TABLE %I DETACH PARTITION %I', p_tabel, r.nama);
        EXECUTE format('COMMENT ON TABLE %I IS %L', r.nama,
                       format('urutan: detached, expired: ids of %s, every row settled; urutan_partisi_hapus drops it.',
                              p_tabel));
        partisi := r.nama;
        baris := r.n;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION urutan_partisi_id_lepas(TEXT, INTERVAL) IS
    'Detaches (lepas) the partitions of outbox or urutan_efek whose ids are all handed out, whose newest row is older than p_simpan and that hold no unsent row (outbox) or no pending or dead-lettered effect (urutan_efek), checked under an exclusive lock as urutan_partisi_id_buang did, marking each by its comment; urutan_partisi_hapus then drops them in a transaction of its own. Waits at most 1 s for a lock. SECURITY DEFINER.';

CREATE OR REPLACE FUNCTION urutan_partisi_hapus(p_tabel TEXT)
RETURNS TABLE (partisi TEXT, baris BIGINT) LANGUAGE plpgsql SECURITY DEFINER
SET lock_timeout = '1s' AS $$
DECLARE
    v_nama TEXT;  -- how the names of p_tabel's partitions end
    r RECORD;
BEGIN
    v_nama := CASE WHEN p_tabel IN ('pesan_diproses', 'pesanan_riwayat') THEN '_h[0-9]{8}$'
                   WHEN p_tabel IN ('outbox', 'urutan_efek') THEN '_p[0-9]+$' END;
    IF v_nama IS NULL THEN
        RAISE EXCEPTION 'urutan_partisi_hapus: % is not a partitioned table of urutan', p_tabel;
    END IF;
    FOR r IN
        SELECT c.relname::text AS nama, greatest(c.reltuples, 0)::bigint AS n
        FROM pg_class c
        WHERE c.relnamespace = current_schema()::regnamespace
          AND c.relkind = 'r' AND NOT c.relispartition
          AND c.relname ~ ('^' || p_tabel || v_nama)
          AND obj_description(c.oid, 'pg_class') LIKE 'urutan: detached, expired:%'
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
    'Drops (hapus) the expired partitions of pesan_diproses, pesanan_riwayat, outbox or urutan_efek that urutan_partisi_lepas or urutan_partisi_id_lepas detached (a crash between the two leaves them for the next pass); only tables they marked. SECURITY DEFINER.';

-- Every SECURITY DEFINER function searches this schema, then pg_temp
-- (migration 0016's rule).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION urutan_partisi_lepas(TEXT, INTERVAL) SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION urutan_partisi_id_lepas(TEXT, INTERVAL) SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION urutan_partisi_hapus(TEXT) SET search_path = %I, pg_temp',
                   current_schema());
END
$$;

-- Retention's, not every role's (deploy/postgres/least-privilege.sql grants
-- the worker, the relay and the dispatcher).
REVOKE EXECUTE ON FUNCTION urutan_partisi_lepas(TEXT, INTERVAL), urutan_partisi_id_lepas(TEXT, INTERVAL),
    urutan_partisi_hapus(TEXT) FROM PUBLIC;
