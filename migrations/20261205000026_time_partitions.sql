-- Issue 33: retention that costs nothing. The two tables that grow by a row
-- per message, pesan_diproses (dedup) and pesanan_riwayat (history), become
-- partitioned by time: one partition per UTC day (`<table>_hYYYYMMDD`),
-- created ahead by urutan itself (urutan_partisi_siapkan, called by
-- `urutan migrate` and by every retention pass of `urutan run`) and expired
-- by dropping whole days (urutan_partisi_buang), not by DELETE loops.
--
-- The table as it was becomes the DEFAULT partition (`<table>_awal`:
-- initial): attaching it is a catalog change, not a copy, so an existing
-- database is converted in milliseconds whatever it holds, and no row
-- moves. It keeps the rows from before partitioning (purged by the old
-- bounded DELETEs until none is left: urutan_awal_pangkas) and takes the
-- rows of the day the migration runs. A CHECK (time < the next UTC day)
-- on it, added NOT VALID here and validated by urutan_partisi_siapkan
-- (SHARE UPDATE EXCLUSIVE: the pool goes on writing), proves that no row
-- of a later day is in it, so creating a day's partition never scans it.
--
-- Dedup across partitions (contract section 4): each day's partition has a
-- UNIQUE index on message_id, so the claim (INSERT ... ON CONFLICT DO
-- NOTHING) still refuses a second copy within the day. A copy of a message
-- claimed on an earlier day is found where its outcome depends on it:
-- urutan_terapkan asks urutan_klaim_lama when the version is not newer than
-- the stored one (a redelivery of an applied or stale message: `duplicate`,
-- not `stale`) and the parked messages of the order (a copy parked or set
-- aside yesterday: `duplicate`), and the batch does the same for its
-- messages that are not newer. A newer version cannot have been applied
-- before, so the common path reads no older partition. See
-- docs/operations.md, "Retention".

-- ---------------------------------------------------------------------------
-- The conversion (once; a second run finds the tables partitioned)
-- ---------------------------------------------------------------------------
DO $$
DECLARE
    -- The next UTC midnight, written in UTC whatever the session's TimeZone.
    v_besok TEXT := to_char((now() AT TIME ZONE 'UTC')::date + 1, 'YYYY-MM-DD"T00:00:00Z"');
BEGIN
    IF (SELECT c.relkind FROM pg_class c
        WHERE c.oid = to_regclass(format('%I.pesan_diproses', current_schema()))) = 'r' THEN
        ALTER TABLE pesan_diproses RENAME TO pesan_diproses_awal;
        CREATE TABLE pesan_diproses (
            message_id    TEXT NOT NULL,
            diproses_pada TIMESTAMPTZ NOT NULL DEFAULT now(),
            pesanan_id    TEXT NOT NULL
        ) PARTITION BY RANGE (diproses_pada);
        ALTER TABLE pesan_diproses ATTACH PARTITION pesan_diproses_awal DEFAULT;
        EXECUTE format('ALTER TABLE pesan_diproses_awal ADD CONSTRAINT pesan_diproses_awal_batas
                        CHECK (diproses_pada < %L) NOT VALID', v_besok);
    END IF;

    IF (SELECT c.relkind FROM pg_class c
        WHERE c.oid = to_regclass(format('%I.pesanan_riwayat', current_schema()))) = 'r' THEN
        ALTER TABLE pesanan_riwayat RENAME TO pesanan_riwayat_awal;
        DROP TRIGGER IF EXISTS urutan_efek_catat ON pesanan_riwayat_awal;
        CREATE TABLE pesanan_riwayat (
            seq             BIGINT NOT NULL DEFAULT nextval('pesanan_riwayat_seq_seq'),
            pesanan_id      TEXT NOT NULL,
            versi           BIGINT NOT NULL,
            status          TEXT NOT NULL,
            message_id      TEXT NOT NULL,
            shard           INT NOT NULL,
            diterapkan_pada TIMESTAMPTZ NOT NULL DEFAULT now()
        ) PARTITION BY RANGE (diterapkan_pada);
        ALTER SEQUENCE pesanan_riwayat_seq_seq OWNED BY pesanan_riwayat.seq;
        ALTER TABLE pesanan_riwayat ATTACH PARTITION pesanan_riwayat_awal DEFAULT;
        EXECUTE format('ALTER TABLE pesanan_riwayat_awal ADD CONSTRAINT pesanan_riwayat_awal_batas
                        CHECK (diterapkan_pada < %L) NOT VALID', v_besok);
        -- On the partitioned table: cloned to every partition, now and later.
        CREATE TRIGGER urutan_efek_catat AFTER INSERT ON pesanan_riwayat
            FOR EACH ROW EXECUTE FUNCTION urutan_efek_catat();
    END IF;
END
$$;

COMMENT ON TABLE pesan_diproses IS 'Deduplication: every message id processed (applied, stale or parked) with the order it was claimed for. Partitioned by UTC day of diproses_pada (pesan_diproses_hYYYYMMDD, each UNIQUE on message_id); days older than DEDUP_RETENTION are dropped whole. Dedup holds across days: see urutan_klaim_lama.';
COMMENT ON TABLE pesan_diproses_awal IS 'The DEFAULT partition of pesan_diproses: the rows from before partitioning and those of the day partitioning began; purged in bounded batches (urutan_awal_pangkas) until empty.';
COMMENT ON TABLE pesanan_riwayat IS 'One row per applied version, in apply order (seq). Partitioned by UTC day of diterapkan_pada (pesanan_riwayat_hYYYYMMDD, each UNIQUE on seq and on (pesanan_id, versi)); HISTORY_RETENTION (keep: forever) drops whole days. Its AFTER INSERT trigger records the version''s effects.';
COMMENT ON TABLE pesanan_riwayat_awal IS 'The DEFAULT partition of pesanan_riwayat: the rows from before partitioning and those of the day partitioning began; purged oldest first in bounded batches (urutan_awal_pangkas) under HISTORY_RETENTION.';
COMMENT ON COLUMN pesanan_riwayat.shard IS 'The shard whose worker applied the version (for a released parked message: the shard it was parked by).';

-- ---------------------------------------------------------------------------
-- Partitions: created ahead, dropped whole
-- ---------------------------------------------------------------------------

-- One UTC day's partition of p_tabel (pesan_diproses or pesanan_riwayat),
-- with its indexes and comment, unless it exists. true when created.
CREATE OR REPLACE FUNCTION urutan_partisi_buat(p_tabel TEXT, p_hari DATE)
RETURNS BOOLEAN LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_nama TEXT := p_tabel || '_h' || to_char(p_hari, 'YYYYMMDD');
    v_dari TEXT := to_char(p_hari, 'YYYY-MM-DD"T00:00:00Z"');
    v_ke   TEXT := to_char(p_hari + 1, 'YYYY-MM-DD"T00:00:00Z"');
BEGIN
    IF p_tabel NOT IN ('pesan_diproses', 'pesanan_riwayat') THEN
        RAISE EXCEPTION 'urutan_partisi_buat: % is not a partitioned table of urutan', p_tabel;
    END IF;
    IF to_regclass(format('%I.%I', current_schema(), v_nama)) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                   v_nama, p_tabel, v_dari, v_ke);
    IF p_tabel = 'pesan_diproses' THEN
        EXECUTE format('CREATE UNIQUE INDEX %I ON %I (message_id)', v_nama || '_message_id', v_nama);
    ELSE
        EXECUTE format('CREATE UNIQUE INDEX %I ON %I (seq)', v_nama || '_seq', v_nama);
        EXECUTE format('CREATE UNIQUE INDEX %I ON %I (pesanan_id, versi)',
                       v_nama || '_pesanan_versi', v_nama);
    END IF;
    EXECUTE format('COMMENT ON TABLE %I IS %L', v_nama,
                   format('The %s rows of %s (UTC), a partition of %s.', p_tabel, p_hari, p_tabel));
    RETURN true;
END
$$;
COMMENT ON FUNCTION urutan_partisi_buat(TEXT, DATE) IS 'Creates (buat) one UTC day''s partition of pesan_diproses or pesanan_riwayat with its indexes, unless it exists; true when created. SECURITY DEFINER.';

-- Validates the default partitions' bound (once; SHARE UPDATE EXCLUSIVE, so
-- writes go on) and creates the partitions of the days from today (or the
-- first day after the bound) to p_hari days ahead. Returns the partitions
-- created.
CREATE OR REPLACE FUNCTION urutan_partisi_siapkan(p_hari INT DEFAULT 7)
RETURNS INT LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_tabel TEXT;
    v_batas TIMESTAMPTZ;
    v_hari  DATE;
    v_dibuat INT := 0;
BEGIN
    FOREACH v_tabel IN ARRAY ARRAY['pesan_diproses', 'pesanan_riwayat'] LOOP
        IF EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conname = v_tabel || '_awal_batas' AND NOT convalidated
                     AND conrelid = to_regclass(format('%I.%I', current_schema(), v_tabel || '_awal'))) THEN
            EXECUTE format('ALTER TABLE %I VALIDATE CONSTRAINT %I', v_tabel || '_awal',
                           v_tabel || '_awal_batas');
        END IF;
        -- The bound: the first instant the default partition may not hold.
        SELECT substring(pg_get_constraintdef(oid) FROM '''([^'']+)''')::timestamptz
        INTO v_batas
        FROM pg_constraint
        WHERE conname = v_tabel || '_awal_batas'
          AND conrelid = to_regclass(format('%I.%I', current_schema(), v_tabel || '_awal'));
        v_hari := greatest((now() AT TIME ZONE 'UTC')::date,
                           (coalesce(v_batas, now()) AT TIME ZONE 'UTC')::date);
        WHILE v_hari <= (now() AT TIME ZONE 'UTC')::date + p_hari LOOP
            IF urutan_partisi_buat(v_tabel, v_hari) THEN
                v_dibuat := v_dibuat + 1;
            END IF;
            v_hari := v_hari + 1;
        END LOOP;
    END LOOP;
    RETURN v_dibuat;
END
$$;
COMMENT ON FUNCTION urutan_partisi_siapkan(INT) IS 'Prepares (siapkan) the day partitions of pesan_diproses and pesanan_riwayat from today to p_hari days ahead, after validating the default partitions'' bound. Called by urutan migrate and every retention pass. SECURITY DEFINER.';

-- Drops the day partitions of p_tabel whose whole day is older than
-- p_simpan; one row per partition dropped, with its estimated rows. The
-- drop takes the parent's lock for a moment: at most a second's wait
-- (lock_timeout), else it fails and the next pass tries again.
CREATE OR REPLACE FUNCTION urutan_partisi_buang(p_tabel TEXT, p_simpan INTERVAL)
RETURNS TABLE (partisi TEXT, baris BIGINT) LANGUAGE plpgsql SECURITY DEFINER
SET lock_timeout = '1s' AS $$
DECLARE
    r RECORD;
BEGIN
    IF p_tabel NOT IN ('pesan_diproses', 'pesanan_riwayat') THEN
        RAISE EXCEPTION 'urutan_partisi_buang: % is not a partitioned table of urutan', p_tabel;
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
        EXECUTE format('DROP TABLE %I', r.nama);
        partisi := r.nama;
        baris := r.n;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION urutan_partisi_buang(TEXT, INTERVAL) IS 'Drops (buang) the day partitions of pesan_diproses or pesanan_riwayat whose whole UTC day is older than p_simpan: expiry without DELETE. Waits at most 1 s for the lock. SECURITY DEFINER.';

-- Deletes up to p_batas rows older than p_simpan from the DEFAULT partition
-- of p_tabel (the rows from before partitioning); returns how many went.
-- History goes oldest first by seq, looking at the p_batas oldest rows only,
-- so a pass never scans the table for rows that are not due.
CREATE OR REPLACE FUNCTION urutan_awal_pangkas(p_tabel TEXT, p_simpan INTERVAL, p_batas INT)
RETURNS BIGINT LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_n BIGINT;
BEGIN
    IF p_tabel = 'pesan_diproses' THEN
        DELETE FROM pesan_diproses_awal WHERE message_id IN (
            SELECT message_id FROM pesan_diproses_awal
            WHERE diproses_pada < now() - p_simpan
            LIMIT p_batas FOR UPDATE SKIP LOCKED);
    ELSIF p_tabel = 'pesanan_riwayat' THEN
        DELETE FROM pesanan_riwayat_awal WHERE seq IN (
            SELECT seq FROM (SELECT seq, diterapkan_pada FROM pesanan_riwayat_awal
                             ORDER BY seq LIMIT p_batas) s
            WHERE s.diterapkan_pada < now() - p_simpan);
    ELSE
        RAISE EXCEPTION 'urutan_awal_pangkas: % is not a partitioned table of urutan', p_tabel;
    END IF;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION urutan_awal_pangkas(TEXT, INTERVAL, INT) IS 'Trims (pangkas) up to p_batas rows older than p_simpan from the default partition of pesan_diproses or pesanan_riwayat (rows from before partitioning). SECURITY DEFINER.';

-- ---------------------------------------------------------------------------
-- Dedup across days
-- ---------------------------------------------------------------------------

-- Was message p_message_id, just claimed for order p_id in this transaction,
-- claimed before (on an earlier day, in another partition, or parked for
-- this order)? NULL when not; otherwise the outcome (`duplicate`, or
-- `message_id_reused` when the earlier claim is another order's), and this
-- transaction's claim is withdrawn so the earlier one stays the only one.
CREATE OR REPLACE FUNCTION urutan_klaim_lama(p_message_id TEXT, p_id TEXT)
RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    v_pemilik TEXT;  -- the order of the earlier claim
BEGIN
    SELECT d.pesanan_id INTO v_pemilik FROM pesan_diproses d
    WHERE d.message_id = p_message_id AND d.diproses_pada < now()
    ORDER BY d.diproses_pada LIMIT 1;
    IF NOT FOUND THEN
        IF NOT EXISTS (SELECT 1 FROM urutan_parkir u
                       WHERE u.pesanan_id = p_id AND u.message_id = p_message_id) THEN
            RETURN NULL;
        END IF;
        v_pemilik := p_id;
    END IF;
    DELETE FROM pesan_diproses d WHERE d.message_id = p_message_id AND d.diproses_pada = now();
    RETURN CASE WHEN v_pemilik IN (p_id, '') THEN 'duplicate' ELSE 'message_id_reused' END;
END
$$;
COMMENT ON FUNCTION urutan_klaim_lama(TEXT, TEXT) IS 'Dedup across day partitions: was a message just claimed (klaim) claimed before (lama: earlier) on another day, or parked for its order? NULL if not, else duplicate or message_id_reused (withdrawing this transaction''s claim).';

-- A claim that could not be made (ON CONFLICT): the earliest claim decides.
CREATE OR REPLACE FUNCTION urutan_sudah_diproses(p_message_id TEXT, p_id TEXT)
RETURNS TEXT LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT CASE WHEN d.pesanan_id IN (p_id, '') THEN 'duplicate'
                                 ELSE 'message_id_reused' END
                     FROM pesan_diproses d WHERE d.message_id = p_message_id
                     ORDER BY d.diproses_pada LIMIT 1),
                    'duplicate')
$$;

-- ---------------------------------------------------------------------------
-- The three places that claim a message id, asking urutan_klaim_lama
-- ---------------------------------------------------------------------------

-- Migration 0021's urutan_terapkan: a copy of a message claimed on an
-- earlier day is found when the version is not newer, or parked.
CREATE OR REPLACE FUNCTION urutan_terapkan(p_pesan jsonb, p_shard integer) RETURNS text
    LANGUAGE plpgsql
    AS $$
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

-- Migration 0025's set-based batch: its messages that are not newer ask
-- urutan_klaim_lama before they are recorded as stale.
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

-- Migration 0020's urutan_sisihkan: a message set aside that was claimed on
-- an earlier day (or is parked already) is a duplicate.
CREATE OR REPLACE FUNCTION urutan_sisihkan(p_pesan jsonb, p_shard integer, p_galat text, p_min double precision, p_max double precision) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_message_id TEXT := p_pesan->>'message_id';
    v_id         TEXT := p_pesan->>'id';
    v_posisi     BIGINT;
    v_lama       TEXT;
BEGIN
    DELETE FROM urutan_dikembalikan WHERE message_id = v_message_id AND pesanan_id = v_id;
    INSERT INTO pesan_diproses (message_id, pesanan_id) VALUES (v_message_id, v_id)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN urutan_sudah_diproses(v_message_id, v_id);
    END IF;
    -- Claimed on an earlier day, or parked already (migration 0026).
    v_lama := urutan_klaim_lama(v_message_id, v_id);
    IF v_lama IS NOT NULL THEN
        RETURN v_lama;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(v_id, 7261));
    SELECT epoch INTO v_posisi FROM urutan_shard WHERE shard = p_shard;
    INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, data, shard, epoch, pesan,
                               percobaan, jatuh_tempo, galat)
    VALUES (v_id, v_message_id, p_pesan->>'status', (p_pesan->>'versi')::bigint, p_pesan->'data',
            p_shard, coalesce(v_posisi, 0), p_pesan, 1, now() + urutan_jeda(1, p_min, p_max), p_galat);
    RETURN 'set_aside';
END
$$;

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

-- Dropping and trimming rows is the pool's retention's, not every role's:
-- only the owner and the roles granted it (deploy/postgres/least-privilege.sql
-- grants the worker) may call them.
REVOKE EXECUTE ON FUNCTION urutan_partisi_buat(TEXT, DATE), urutan_partisi_siapkan(INT),
    urutan_partisi_buang(TEXT, INTERVAL), urutan_awal_pangkas(TEXT, INTERVAL, INT) FROM PUBLIC;
