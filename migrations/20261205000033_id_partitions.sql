-- Issue 33: retention that costs nothing, for the two other tables that grow
-- with traffic. `outbox` (a row per message a producer enqueues) and
-- `urutan_efek` (a row per applied version and endpoint) are partitioned by
-- RANGE of their id, which grows with time: the contract's
-- `id BIGSERIAL PRIMARY KEY` stays a primary key only if the partition key
-- is the id itself. A partition is a range of ids sized to about a day of
-- traffic (measured from the partition being filled, at least 2^22 ids),
-- created ahead by urutan (urutan_partisi_id_siapkan, called with the day
-- partitions of migration 0026), named `<table>_p<first id>`.
--
-- Expiry drops a whole partition, never a row that still has work to do: a
-- partition goes (urutan_partisi_id_buang) only when every id of its range
-- has been handed out, its newest row was written longer than the retention
-- ago (OUTBOX_RETENTION, EFFECTS_RETENTION), and, under an exclusive lock
-- taken first, none of its rows is waiting: no outbox row unsent (an
-- unroutable row included) and no effect pending or dead-lettered. Such a
-- partition stays until its last rows are settled.
--
-- As in migration 0026, the table as it was becomes the DEFAULT partition
-- (`<table>_awal`), attached without a copy or a scan, with a CHECK (id <
-- bound) added NOT VALID; urutan_partisi_id_siapkan validates it (SHARE
-- UPDATE EXCLUSIVE: writes go on) before it creates the first range
-- partition, so no creation ever scans the old rows. The bound leaves 2^24
-- ids of room, so producers go on writing into the default partition until
-- the first range partition exists. Its rows keep going by the old bounded
-- DELETEs (urutan_awal_id_pangkas).

-- A role granted rights on the table as it was (deploy/postgres/
-- least-privilege.sql) keeps them on the partitioned table that takes its
-- name: table and column grants are copied (pg_temp: gone at the end of the
-- session).
CREATE FUNCTION pg_temp.urutan_hak_salin(p_dari REGCLASS, p_ke REGCLASS) RETURNS VOID
LANGUAGE plpgsql AS $$
DECLARE
    r RECORD;
BEGIN
    FOR r IN
        SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.rolname) END AS siapa,
               a.privilege_type AS hak, NULL::name AS kolom
        FROM pg_class c, aclexplode(c.relacl) a LEFT JOIN pg_roles g ON g.oid = a.grantee
        WHERE c.oid = p_dari AND a.grantee <> c.relowner
        UNION ALL
        SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.rolname) END,
               a.privilege_type, t.attname
        FROM pg_attribute t, aclexplode(t.attacl) a LEFT JOIN pg_roles g ON g.oid = a.grantee
        WHERE t.attrelid = p_dari AND t.attacl IS NOT NULL AND t.attnum > 0
    LOOP
        IF r.kolom IS NULL THEN
            EXECUTE format('GRANT %s ON %s TO %s', r.hak, p_ke, r.siapa);
        ELSE
            EXECUTE format('GRANT %s (%I) ON %s TO %s', r.hak, r.kolom, p_ke, r.siapa);
        END IF;
    END LOOP;
END
$$;

-- The bound of the old table, now the default partition: ids from p_batas
-- (or past the highest id in it) on go to range partitions. A small table (under 64 MB: a scan of a few
-- hundred milliseconds at most) is checked here and now. A larger one
-- gets 2^24 ids of room and a CHECK added NOT VALID, which
-- urutan_partisi_id_siapkan validates later, while writes go on
-- (`urutan migrate` calls it as soon as the migrations are in).
CREATE FUNCTION pg_temp.urutan_awal_batasi(p_tabel REGCLASS, p_kolom TEXT, p_batas BIGINT)
RETURNS VOID LANGUAGE plpgsql AS $$
DECLARE
    v_kecil BOOLEAN := pg_relation_size(p_tabel) < 64 * 1024 * 1024;
    v_nama TEXT := (SELECT relname FROM pg_class WHERE oid = p_tabel) || '_batas';
    v_maks BIGINT;
BEGIN
    -- Past the highest id too: a row may have been written with an id of
    -- its own, ahead of the sequence (a read of the primary key's end).
    EXECUTE format('SELECT max(%I) FROM %s', p_kolom, p_tabel) INTO v_maks;
    p_batas := greatest(p_batas, coalesce(v_maks, 0) + 1);
    IF NOT v_kecil THEN
        p_batas := p_batas + 16777216;
    END IF;
    EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I CHECK (%I < %s) NOT VALID',
                   p_tabel, v_nama, p_kolom, p_batas);
    IF v_kecil THEN
        EXECUTE format('ALTER TABLE %s VALIDATE CONSTRAINT %I', p_tabel, v_nama);
    END IF;
END
$$;

DO $$
DECLARE
    v_batas BIGINT;
BEGIN
    IF (SELECT c.relkind FROM pg_class c
        WHERE c.oid = to_regclass(format('%I.outbox', current_schema()))) = 'r' THEN
        ALTER TABLE outbox RENAME TO outbox_awal;
        ALTER TABLE outbox_awal RENAME CONSTRAINT outbox_pkey TO outbox_awal_pkey;
        ALTER INDEX outbox_unsent_idx RENAME TO outbox_awal_unsent_idx;
        ALTER INDEX outbox_unroutable_idx RENAME TO outbox_awal_unroutable_idx;
        CREATE TABLE outbox (LIKE outbox_awal INCLUDING DEFAULTS INCLUDING CONSTRAINTS
                             INCLUDING COMMENTS) PARTITION BY RANGE (id);
        ALTER TABLE outbox ADD PRIMARY KEY (id);
        CREATE INDEX outbox_unsent_idx ON outbox (id) WHERE dikirim_pada IS NULL;
        CREATE INDEX outbox_unroutable_idx ON outbox (id)
            WHERE unroutable_at IS NOT NULL AND dikirim_pada IS NULL;
        ALTER SEQUENCE outbox_id_seq OWNED BY outbox.id;
        PERFORM pg_temp.urutan_hak_salin('outbox_awal', 'outbox');
        ALTER TABLE outbox ATTACH PARTITION outbox_awal DEFAULT;
        -- Read under the lock the rename took: past every id handed out.
        SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END
        INTO v_batas FROM outbox_id_seq;
        PERFORM pg_temp.urutan_awal_batasi('outbox_awal', 'id', v_batas);
    END IF;

    IF (SELECT c.relkind FROM pg_class c
        WHERE c.oid = to_regclass(format('%I.urutan_efek', current_schema()))) = 'r' THEN
        ALTER TABLE urutan_efek RENAME TO urutan_efek_awal;
        -- Transition-table triggers may not sit on a partition: they move
        -- to the partitioned table below, with the row trigger.
        DROP TRIGGER IF EXISTS urutan_efek_kepala_baru ON urutan_efek_awal;
        DROP TRIGGER IF EXISTS urutan_efek_kepala_lagi ON urutan_efek_awal;
        ALTER TABLE urutan_efek_awal RENAME CONSTRAINT urutan_efek_pkey TO urutan_efek_awal_pkey;
        ALTER TABLE urutan_efek_awal RENAME CONSTRAINT urutan_efek_pesanan_id_versi_tujuan_key
            TO urutan_efek_awal_pesanan_versi_tujuan;
        ALTER TABLE urutan_efek_awal RENAME CONSTRAINT urutan_efek_tujuan_fkey
            TO urutan_efek_awal_tujuan_fkey;
        ALTER INDEX urutan_efek_menunggu_idx RENAME TO urutan_efek_awal_menunggu_idx;
        ALTER INDEX urutan_efek_pesanan_menunggu_idx RENAME TO urutan_efek_awal_pesanan_menunggu_idx;
        ALTER INDEX urutan_efek_selesai_idx RENAME TO urutan_efek_awal_selesai_idx;
        ALTER INDEX urutan_efek_terbuka RENAME TO urutan_efek_awal_terbuka;
        ALTER INDEX urutan_efek_ditahan_idx RENAME TO urutan_efek_awal_ditahan_idx;
        CREATE TABLE urutan_efek (LIKE urutan_efek_awal INCLUDING DEFAULTS INCLUDING CONSTRAINTS
                                  INCLUDING COMMENTS) PARTITION BY RANGE (efek);
        ALTER TABLE urutan_efek ADD PRIMARY KEY (efek);
        ALTER TABLE urutan_efek ADD CONSTRAINT urutan_efek_tujuan_fkey
            FOREIGN KEY (tujuan) REFERENCES urutan_efek_tujuan;
        CREATE INDEX urutan_efek_menunggu_idx ON urutan_efek (efek) WHERE keadaan = 'menunggu';
        CREATE INDEX urutan_efek_pesanan_menunggu_idx ON urutan_efek (pesanan_id, versi, tujuan)
            WHERE keadaan = 'menunggu';
        CREATE INDEX urutan_efek_selesai_idx ON urutan_efek (selesai_pada)
            WHERE keadaan = 'terkirim';
        CREATE INDEX urutan_efek_terbuka ON urutan_efek (keadaan, tujuan)
            WHERE keadaan <> 'terkirim';
        CREATE INDEX urutan_efek_ditahan_idx ON urutan_efek (pesanan_id, versi, tujuan)
            WHERE ditahan_sejak IS NOT NULL;
        ALTER SEQUENCE urutan_efek_efek_seq OWNED BY urutan_efek.efek;
        PERFORM pg_temp.urutan_hak_salin('urutan_efek_awal', 'urutan_efek');
        ALTER TABLE urutan_efek ATTACH PARTITION urutan_efek_awal DEFAULT;
        SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END
        INTO v_batas FROM urutan_efek_efek_seq;
        PERFORM pg_temp.urutan_awal_batasi('urutan_efek_awal', 'efek', v_batas);
        CREATE TRIGGER urutan_efek_kepala_baru AFTER INSERT ON urutan_efek
            REFERENCING NEW TABLE AS baru
            FOR EACH STATEMENT EXECUTE FUNCTION urutan_efek_kepala_baru();
        CREATE TRIGGER urutan_efek_kepala_lagi AFTER UPDATE OF keadaan ON urutan_efek
            FOR EACH ROW
            WHEN (OLD.keadaan <> 'menunggu' AND NEW.keadaan = 'menunggu')
            EXECUTE FUNCTION urutan_efek_kepala_lagi();
    END IF;
END
$$;

COMMENT ON TABLE outbox IS 'Transactional outbox (contract section 4): producers insert rows in their own transaction, `urutan relay` publishes each to the entry exchange (message id = id, header x-pesanan-id = agregat_id) and marks it sent. Partitioned by RANGE (id), about a day of rows per partition (outbox_p<first id>); a partition whose rows are all sent and older than OUTBOX_RETENTION is dropped whole.';
COMMENT ON TABLE outbox_awal IS 'The DEFAULT partition of outbox: the rows from before partitioning (and those written until the first range partition existed); sent rows are trimmed in bounded batches (urutan_awal_id_pangkas).';
COMMENT ON TABLE urutan_efek IS 'Downstream effects: one webhook per applied version and matching endpoint, recorded in the apply transaction. Per order they go out in (versi, tujuan) order, one at a time. Partitioned by RANGE (efek), about a day of rows per partition (urutan_efek_p<first id>, each UNIQUE on (pesanan_id, versi, tujuan)); a partition whose effects are all sent and older than EFFECTS_RETENTION is dropped whole.';
COMMENT ON TABLE urutan_efek_awal IS 'The DEFAULT partition of urutan_efek: the rows from before partitioning (and those written until the first range partition existed); sent effects are trimmed in bounded batches (urutan_awal_id_pangkas).';
COMMENT ON INDEX outbox_unsent_idx IS 'Unsent outbox rows in id order: what the relay publishes next (contract section 4).';
COMMENT ON INDEX outbox_unroutable_idx IS 'Outbox rows set aside as unroutable and not sent: counted by urutan status and the relay''s gauge without a scan.';
COMMENT ON INDEX urutan_efek_menunggu_idx IS 'Pending effects in id order.';
COMMENT ON INDEX urutan_efek_pesanan_menunggu_idx IS 'Pending effects of an order in (versi, tujuan) order: the order''s next effect.';
COMMENT ON INDEX urutan_efek_selesai_idx IS 'Sent effects by when they were sent: the trim of the default partition.';
COMMENT ON INDEX urutan_efek_terbuka IS 'Effects not sent (pending and dead-lettered) by state and endpoint: the effects by endpoint (the console) and the dead-lettered ones (urutan status, dlq list --effects), past the sent ones kept for EFFECTS_RETENTION.';
COMMENT ON INDEX urutan_efek_ditahan_idx IS 'Dead-lettered effects that hold their order (EFFECTS_ON_DEAD=hold).';

-- ---------------------------------------------------------------------------
-- Id-range partitions: created ahead, dropped whole
-- ---------------------------------------------------------------------------

-- The id column and sequence of a table partitioned by id range; raises for
-- any other table (the functions below build SQL from these names only).
CREATE OR REPLACE FUNCTION urutan_partisi_id_kolom(p_tabel TEXT, OUT kolom TEXT, OUT urutan TEXT)
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    CASE p_tabel
        WHEN 'outbox' THEN kolom := 'id'; urutan := 'outbox_id_seq';
        WHEN 'urutan_efek' THEN kolom := 'efek'; urutan := 'urutan_efek_efek_seq';
        ELSE RAISE EXCEPTION 'urutan: % is not a table of urutan partitioned by id', p_tabel;
    END CASE;
END
$$;
COMMENT ON FUNCTION urutan_partisi_id_kolom(TEXT) IS 'The id column (kolom) and its sequence (urutan) of outbox or urutan_efek, the tables partitioned by id range; raises for any other table.';

-- The range partitions of p_tabel with their bounds [dari, ke), in id order.
CREATE OR REPLACE FUNCTION urutan_partisi_id_daftar(p_tabel TEXT)
RETURNS TABLE (partisi TEXT, dari BIGINT, ke BIGINT) LANGUAGE sql STABLE AS $$
    SELECT c.relname::text,
           substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''?(-?[0-9]+)')::bigint,
           substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''?(-?[0-9]+)')::bigint
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = to_regclass(format('%I.%I', current_schema(), p_tabel))
      AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'
    ORDER BY 2
$$;
COMMENT ON FUNCTION urutan_partisi_id_daftar(TEXT) IS 'Lists (daftar) the id-range partitions of outbox or urutan_efek with their bounds [dari, ke), in id order.';

-- Creates the partition [p_dari, p_ke) of p_tabel with its indexes.
CREATE OR REPLACE FUNCTION urutan_partisi_id_buat(p_tabel TEXT, p_dari BIGINT, p_ke BIGINT)
RETURNS VOID LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_nama TEXT := p_tabel || '_p' || p_dari;
BEGIN
    PERFORM urutan_partisi_id_kolom(p_tabel);
    EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%s) TO (%s)',
                   v_nama, p_tabel, p_dari, p_ke);
    IF p_tabel = 'urutan_efek' THEN
        -- The old table's UNIQUE (pesanan_id, versi, tujuan), per partition.
        EXECUTE format('CREATE UNIQUE INDEX %I ON %I (pesanan_id, versi, tujuan)',
                       v_nama || '_pesanan_versi_tujuan', v_nama);
    END IF;
    EXECUTE format('COMMENT ON TABLE %I IS %L', v_nama,
                   format('The %s rows with ids from %s to %s, a partition of %s.',
                          p_tabel, p_dari, p_ke - 1, p_tabel));
END
$$;
COMMENT ON FUNCTION urutan_partisi_id_buat(TEXT, BIGINT, BIGINT) IS 'Creates (buat) the partition of outbox or urutan_efek holding ids [p_dari, p_ke). SECURITY DEFINER.';

-- Validates the default partition's bound (once; SHARE UPDATE EXCLUSIVE, so
-- writes go on), then creates partitions until a day of ids (estimated from
-- how fast the partition now being filled was filled, else the last
-- partition's size; at least 2^22) lies ahead of the sequence. Returns the
-- partitions created.
CREATE OR REPLACE FUNCTION urutan_partisi_id_siapkan(p_validasi BOOLEAN DEFAULT true)
RETURNS INT LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_tabel  TEXT;
    v_kolom  TEXT;
    v_urutan TEXT;
    v_kini   BIGINT;       -- the last id handed out
    v_atas   BIGINT;       -- the first id no partition holds
    v_ukuran BIGINT;       -- ids per new partition
    v_isi    TEXT;         -- the partition now being filled
    v_pertama BOOLEAN;     -- no range partition yet
    v_dari   BIGINT;
    v_id0    BIGINT;
    v_t0     TIMESTAMPTZ;
    v_detik  FLOAT8;
    v_dibuat INT := 0;
BEGIN
    FOREACH v_tabel IN ARRAY ARRAY['outbox', 'urutan_efek'] LOOP
        CONTINUE WHEN (SELECT c.relkind FROM pg_class c
                       WHERE c.oid = to_regclass(format('%I.%I', current_schema(), v_tabel))) <> 'p';
        SELECT k.kolom, k.urutan INTO v_kolom, v_urutan FROM urutan_partisi_id_kolom(v_tabel) k;
        IF EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conname = v_tabel || '_awal_batas' AND NOT convalidated
                     AND conrelid = to_regclass(format('%I.%I', current_schema(), v_tabel || '_awal'))) THEN
            -- Within the migration (p_validasi false) the scan would hold
            -- the rename's exclusive lock: it waits for urutan migrate.
            CONTINUE WHEN NOT p_validasi;
            EXECUTE format('ALTER TABLE %I VALIDATE CONSTRAINT %I', v_tabel || '_awal',
                           v_tabel || '_awal_batas');
        END IF;
        EXECUTE format('SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM %I',
                       v_urutan) INTO v_kini;
        SELECT max(d.ke), (array_agg(d.ke - d.dari ORDER BY d.dari DESC))[1]
        INTO v_atas, v_ukuran
        FROM urutan_partisi_id_daftar(v_tabel) d;
        v_pertama := v_atas IS NULL;
        IF v_pertama THEN
            -- No range partition yet: they start at the default's bound.
            SELECT substring(pg_get_constraintdef(oid) FROM '< \(?''?(-?[0-9]+)')::bigint
            INTO v_atas
            FROM pg_constraint
            WHERE conname = v_tabel || '_awal_batas'
              AND conrelid = to_regclass(format('%I.%I', current_schema(), v_tabel || '_awal'));
            v_atas := coalesce(v_atas, v_kini + 1);
            v_ukuran := 16777216;  -- 2^24 ids until a rate is known
        ELSE
            -- The partition now being filled, and when its first row came.
            SELECT d.partisi, d.dari INTO v_isi, v_dari
            FROM urutan_partisi_id_daftar(v_tabel) d
            WHERE d.dari <= v_kini AND v_kini < d.ke;
            IF FOUND THEN
                EXECUTE format('SELECT %I, dibuat_pada FROM %I ORDER BY %I LIMIT 1',
                               v_kolom, v_isi, v_kolom) INTO v_id0, v_t0;
                v_detik := extract(epoch FROM now() - v_t0);
                IF v_detik >= 3600 AND v_kini > v_id0 THEN
                    -- A day of ids at the rate this partition filled.
                    v_ukuran := ceil((v_kini - v_id0) / v_detik * 86400);
                END IF;
            END IF;
        END IF;
        -- A power of two from 2^22 to 2^34 ids.
        v_ukuran := power(2, least(34, greatest(22, ceil(log(2, greatest(v_ukuran, 2)::numeric)))))::bigint;
        -- The first range partition at once, then until the room ahead is
        -- more than a partition.
        WHILE v_pertama OR v_atas - v_kini <= v_ukuran LOOP
            PERFORM urutan_partisi_id_buat(v_tabel, v_atas, v_atas + v_ukuran);
            v_pertama := false;
            v_atas := v_atas + v_ukuran;
            v_dibuat := v_dibuat + 1;
        END LOOP;
    END LOOP;
    RETURN v_dibuat;
END
$$;
COMMENT ON FUNCTION urutan_partisi_id_siapkan(BOOLEAN) IS 'Prepares (siapkan) the id-range partitions of outbox and urutan_efek: validates the default partition''s bound (unless p_validasi is false: then a table whose bound is not validated is left for later), then creates partitions until about a day of ids lies ahead. Called by urutan migrate, every retention pass and the relay. SECURITY DEFINER.';

-- Drops the partitions of p_tabel whose ids have all been handed out, whose
-- newest row is older than p_simpan and that hold nothing waiting (checked
-- under an exclusive lock on the partition, so no row can come or change
-- in between); one row per partition dropped, with its estimated rows.
-- Waits at most a second for a lock: a partition that is busy is skipped
-- and tried again by the next pass.
CREATE OR REPLACE FUNCTION urutan_partisi_id_buang(p_tabel TEXT, p_simpan INTERVAL)
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
        EXECUTE format('DROP TABLE %I', r.nama);
        partisi := r.nama;
        baris := r.n;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION urutan_partisi_id_buang(TEXT, INTERVAL) IS 'Drops (buang) the partitions of outbox or urutan_efek whose ids are all handed out, whose newest row is older than p_simpan and that hold no unsent row (outbox) or no pending or dead-lettered effect (urutan_efek), checked under an exclusive lock: expiry without DELETE that never loses work. Waits at most 1 s for a lock. SECURITY DEFINER.';

-- Deletes up to p_batas settled rows older than p_simpan from the DEFAULT
-- partition of p_tabel (the rows from before partitioning): sent outbox rows
-- by dikirim_pada, sent effects by selesai_pada. Returns how many went.
CREATE OR REPLACE FUNCTION urutan_awal_id_pangkas(p_tabel TEXT, p_simpan INTERVAL, p_batas INT)
RETURNS BIGINT LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_n BIGINT;
BEGIN
    IF p_tabel = 'outbox' THEN
        DELETE FROM outbox_awal WHERE id IN (
            SELECT id FROM outbox_awal WHERE dikirim_pada < now() - p_simpan
            LIMIT p_batas FOR UPDATE SKIP LOCKED);
    ELSIF p_tabel = 'urutan_efek' THEN
        DELETE FROM urutan_efek_awal WHERE efek IN (
            SELECT efek FROM urutan_efek_awal
            WHERE keadaan = 'terkirim' AND selesai_pada < now() - p_simpan
            LIMIT p_batas FOR UPDATE SKIP LOCKED);
    ELSE
        PERFORM urutan_partisi_id_kolom(p_tabel);
    END IF;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION urutan_awal_id_pangkas(TEXT, INTERVAL, INT) IS 'Trims (pangkas) up to p_batas settled rows older than p_simpan from the default partition of outbox or urutan_efek (rows from before partitioning). SECURITY DEFINER.';

-- The first partitions, unless a large table's bound waits for validation.
SELECT urutan_partisi_id_siapkan(false);

-- Every SECURITY DEFINER function searches this schema, then pg_temp
-- (migration 0016's rule, for the functions added here).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.prosecdef AND p.pronamespace = current_schema()::regnamespace
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END
$$;

-- Creating, dropping and trimming partitions is retention's, not every
-- role's: only the owner and the roles granted it (deploy/postgres/
-- least-privilege.sql grants the worker, the relay and the dispatcher).
REVOKE EXECUTE ON FUNCTION urutan_partisi_id_buat(TEXT, BIGINT, BIGINT), urutan_partisi_id_siapkan(BOOLEAN),
    urutan_partisi_id_buang(TEXT, INTERVAL), urutan_awal_id_pangkas(TEXT, INTERVAL, INT) FROM PUBLIC;
