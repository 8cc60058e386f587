-- Issue 43: deduplication per (entity id, message id) (contract sections 2,
-- 3 and 4). A message id was unique across every order: the first order to
-- claim an id kept it, and the same id for another order was dead-lettered
-- as `message_id_reused`. A producer that may only publish to the broker
-- could therefore claim the outbox's future ids ("1".."50") with events of
-- its own entity, and the victim's events, published later with those ids
-- by the relay, were dead-lettered (and again on every replay). Now the
-- same id on two entities is two messages, each applied on its own;
-- `message_id_reused` is retired (old dead-letter records keep the reason).
--
-- - pesan_diproses: each partition (the day partitions, the DEFAULT one
--   pesan_diproses_awal, and the days created ahead) is unique on
--   (message_id, pesanan_id) instead of message_id alone. One index per
--   partition, as before: the claim (INSERT ... ON CONFLICT DO NOTHING) stays
--   one probe. message_id leads, so a lookup by message id alone (operator
--   tools) still uses it. The indexes are rebuilt in this transaction: each
--   partition is locked against writes (SHARE) from its rebuild until the
--   commit; the old days first, today's and the empty future days last.
-- - A claim that conflicts now always means the same (entity, id) was
--   recorded: `duplicate` (urutan_sudah_diproses, kept for any caller).
-- - urutan_klaim_lama (a copy claimed on an earlier day) looks for the
--   pair. A row of migration 0014 whose order is unknown (pesanan_id '',
--   only ever in pesan_diproses_awal) stays a duplicate for any order on
--   that path. Every redelivery of a processed message reaches it (a
--   processed message is applied or stale: its version is not above its
--   order's stored version), so those rows keep suppressing the redelivery
--   of the message they recorded. Only a NEWER version of an order with that
--   id goes through: it cannot be the message recorded, and the pair rule
--   applies it. No probe for them on the common path.
-- - urutan_dikembalikan (messages handed back): key (message_id, pesanan_id),
--   so two orders' messages with one id are both awaited.
-- - urutan_lepas returns the released message's order (pesanan_id): the
--   release step no longer looks it up by message id (which fails with "more
--   than one row" once ids repeat).
-- - urutan_lepas_gagal, urutan_awal_pangkas: delete the claim of the pair.

-- ---------------------------------------------------------------------------
-- The unique indexes of pesan_diproses, partition by partition
-- ---------------------------------------------------------------------------
DO $$
DECLARE
    r RECORD;
    x RECORD;
BEGIN
    FOR r IN
        SELECT c.oid, c.relname::text AS nama
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = to_regclass(format('%I.pesan_diproses', current_schema()))
        -- The default partition and the past days first (nobody writes them),
        -- then today's and the days ahead.
        ORDER BY c.relname <> 'pesan_diproses_awal', c.relname
    LOOP
        IF to_regclass(format('%I.%I', current_schema(), r.nama || '_message_pesanan')) IS NULL THEN
            EXECUTE format('CREATE UNIQUE INDEX %I ON %I (message_id, pesanan_id)',
                           r.nama || '_message_pesanan', r.nama);
        END IF;
        -- Every unique index on message_id alone (the day partitions'
        -- <name>_message_id, the default partition's primary key).
        FOR x IN
            SELECT ic.relname::text AS indeks, co.conname::text AS batasan
            FROM pg_index ix
            JOIN pg_class ic ON ic.oid = ix.indexrelid
            JOIN pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = ix.indkey[0]
            LEFT JOIN pg_constraint co ON co.conindid = ix.indexrelid AND co.conrelid = ix.indrelid
            WHERE ix.indrelid = r.oid AND ix.indisunique AND ix.indnkeyatts = 1
              AND a.attname = 'message_id'
        LOOP
            IF x.batasan IS NOT NULL THEN
                EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', r.nama, x.batasan);
            ELSE
                EXECUTE format('DROP INDEX %I', x.indeks);
            END IF;
        END LOOP;
    END LOOP;
END
$$;

COMMENT ON TABLE pesan_diproses IS 'Deduplication: every message id processed (applied, stale or parked) with the order it was claimed for; the key is the pair (an order''s id, a message id). Partitioned by UTC day of diproses_pada (pesan_diproses_hYYYYMMDD, each UNIQUE on (message_id, pesanan_id)); days older than DEDUP_RETENTION are dropped whole. Dedup holds across days: see urutan_klaim_lama.';
COMMENT ON COLUMN pesan_diproses_awal.pesanan_id IS 'The order that claimed the id: the same id for another order is another message. '''' for rows recorded before orders were recorded (migration 0014): a redelivery of any order that is not newer than its stored version is a duplicate (urutan_klaim_lama).';

-- One UTC day's partition of p_tabel (pesan_diproses or pesanan_riwayat),
-- with its indexes and comment, unless it exists (migration 0026's, the
-- dedup partition unique on the pair).
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
        EXECUTE format('CREATE UNIQUE INDEX %I ON %I (message_id, pesanan_id)',
                       v_nama || '_message_pesanan', v_nama);
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
COMMENT ON FUNCTION urutan_partisi_buat(TEXT, DATE) IS 'Creates (buat) one UTC day''s partition of pesan_diproses (unique on (message_id, pesanan_id)) or pesanan_riwayat with its indexes, unless it exists; true when created. SECURITY DEFINER.';

-- Migration 0026's, deleting the expired claims by their pair (an id may be
-- recorded for several orders, not all expired).
CREATE OR REPLACE FUNCTION urutan_awal_pangkas(p_tabel TEXT, p_simpan INTERVAL, p_batas INT)
RETURNS BIGINT LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_n BIGINT;
BEGIN
    IF p_tabel = 'pesan_diproses' THEN
        DELETE FROM pesan_diproses_awal WHERE (message_id, pesanan_id) IN (
            SELECT message_id, pesanan_id FROM pesan_diproses_awal
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

-- Every SECURITY DEFINER function searches this schema, then pg_temp
-- (migration 0016's rule; CREATE OR REPLACE reset it for the two above).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION urutan_partisi_buat(TEXT, DATE) SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION urutan_awal_pangkas(TEXT, INTERVAL, INT) SET search_path = %I, pg_temp',
                   current_schema());
END
$$;

-- ---------------------------------------------------------------------------
-- Dedup: the claim and its lookups
-- ---------------------------------------------------------------------------

-- Was message p_message_id of order p_id, just claimed in this transaction,
-- claimed before for this order (on an earlier day, in another partition,
-- or parked)? NULL when not; otherwise 'duplicate', and this transaction's
-- claim is withdrawn so the earlier one stays the only one. A row of
-- migration 0014 (pesanan_id '', its order unknown) counts for any order.
CREATE OR REPLACE FUNCTION urutan_klaim_lama(p_message_id TEXT, p_id TEXT)
RETURNS TEXT LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pesan_diproses d
                   WHERE d.message_id = p_message_id AND d.pesanan_id = p_id
                     AND d.diproses_pada < now())
       AND NOT EXISTS (SELECT 1 FROM pesan_diproses_awal d
                       WHERE d.message_id = p_message_id AND d.pesanan_id = '')
       AND NOT EXISTS (SELECT 1 FROM urutan_parkir u
                       WHERE u.pesanan_id = p_id AND u.message_id = p_message_id) THEN
        RETURN NULL;
    END IF;
    DELETE FROM pesan_diproses d
    WHERE d.message_id = p_message_id AND d.pesanan_id = p_id AND d.diproses_pada = now();
    RETURN 'duplicate';
END
$$;
COMMENT ON FUNCTION urutan_klaim_lama(TEXT, TEXT) IS 'Dedup across day partitions, per (order, message id): was a message just claimed (klaim) claimed before (lama: earlier) for its order on another day (or recorded before orders were, pesanan_id ''''), or parked for its order? NULL if not, else duplicate (withdrawing this transaction''s claim).';

-- A claim that could not be made (ON CONFLICT): the same (order, message id)
-- is recorded. Kept for the functions that call it.
CREATE OR REPLACE FUNCTION urutan_sudah_diproses(p_message_id TEXT, p_id TEXT)
RETURNS TEXT LANGUAGE sql STABLE AS $$
    SELECT 'duplicate'::text
$$;
COMMENT ON FUNCTION urutan_sudah_diproses(TEXT, TEXT) IS 'What a message id that could not be claimed for order p_id means: duplicate (the claim is unique per (order, message id), so only the same pair conflicts).';

-- Migration 0035's set-based batch, claiming per (order, message id).
CREATE OR REPLACE FUNCTION urutan_terapkan_batch_himpun(p_pesan jsonb, p_shard integer) RETURNS text[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_posisi BIGINT;  -- epochs this shard has passed: the epoch of every message here
    v_ids    TEXT[];  -- the order of each item, in arrival order
    v_klaim_m TEXT[];  -- the (message id, order) pairs claimed now (not seen before):
    v_klaim_p TEXT[];  --   their message ids and their orders
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

    -- Dedup: the first copy of an (order, message id) not seen before is
    -- new; later copies (in this batch or after it) are not.
    WITH klaim AS (
        INSERT INTO pesan_diproses (message_id, pesanan_id)
        SELECT DISTINCT ON (message_id, id) message_id, id
        FROM (SELECT e->>'message_id' AS message_id, e->>'id' AS id, i
              FROM jsonb_array_elements(p_pesan) WITH ORDINALITY AS t(e, i)) m
        ORDER BY message_id, id, i
        ON CONFLICT DO NOTHING
        RETURNING message_id, pesanan_id
    )
    SELECT coalesce(array_agg(message_id), '{}'), coalesce(array_agg(pesanan_id), '{}')
    INTO v_klaim_m, v_klaim_p FROM klaim;

    -- A new message is applied when its version is above the stored one and
    -- above every earlier new message of its entity in this batch; otherwise
    -- it is stale. The entity ends at its last applied message.
    WITH masuk AS (
        SELECT e->>'message_id' AS message_id, e->>'id' AS id, e->>'status' AS status,
               (e->>'versi')::bigint AS versi, e->'data' AS data, i
        FROM jsonb_array_elements(p_pesan) WITH ORDINALITY AS t(e, i)
    ),
    baru AS (
        SELECT DISTINCT ON (message_id, id) *
        FROM masuk WHERE (message_id, id) IN (SELECT * FROM unnest(v_klaim_m, v_klaim_p))
        ORDER BY message_id, id, i
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
    -- Not newer: a copy of a message claimed for its order on an earlier
    -- day is a duplicate, not stale (migration 0026).
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
    SELECT array_agg(CASE WHEN n.i IS NULL THEN 'duplicate'
                          WHEN n.diterapkan THEN 'applied'
                          ELSE coalesce(l.hasil, 'stale') END ORDER BY m.i)
    INTO v_hasil
    FROM masuk m LEFT JOIN nilai n ON n.i = m.i LEFT JOIN lama l ON l.i = m.i;

    RETURN v_hasil;
END
$$;
COMMENT ON FUNCTION urutan_terapkan_batch_himpun(JSONB, INT) IS
    'The set-based body of the batch (himpun: gathered): one dedup claim per (order, message id), one versioned upsert per order (its stored version read by primary key), one history insert, stale arrivals recorded. Hands the batch to the per-message loop when a marker is in it or any message could park.';

-- ---------------------------------------------------------------------------
-- Messages handed back: one per (message id, order)
-- ---------------------------------------------------------------------------
ALTER TABLE urutan_dikembalikan DROP CONSTRAINT IF EXISTS urutan_dikembalikan_pkey,
    ADD CONSTRAINT urutan_dikembalikan_pkey PRIMARY KEY (message_id, pesanan_id);

-- ---------------------------------------------------------------------------
-- The release step: the order of each released message, and its claim
-- ---------------------------------------------------------------------------

-- Migration 0020's, dropping the refused message's claim by its pair.
CREATE OR REPLACE FUNCTION urutan_lepas_gagal(p_message_id text, p_id text, p_state text, p_teks text, p_min double precision, p_max double precision, p_maks integer, p_tahan boolean) RETURNS TABLE(hasil text, alasan text, galat text, pesan jsonb)
    LANGUAGE plpgsql
    AS $$
DECLARE
    r RECORD;
BEGIN
    IF urutan_alasan_ulang(p_state) IS NULL
       AND p_state <> 'URREF' AND left(p_state, 2) NOT IN ('22', '23', '54') THEN
        RETURN;
    END IF;
    SELECT * INTO r FROM urutan_parkir u WHERE u.message_id = p_message_id AND u.pesanan_id = p_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    galat := CASE WHEN p_state = 'URREF' THEN p_teks
                  ELSE format('SQLSTATE %s: %s', p_state, p_teks) END;
    alasan := urutan_alasan_ulang(p_state);
    IF alasan IS NOT NULL AND r.percobaan + 1 < p_maks THEN
        UPDATE urutan_parkir u
        SET percobaan = r.percobaan + 1, galat = urutan_lepas_gagal.galat,
            jatuh_tempo = now() + urutan_jeda(r.percobaan + 1, p_min, p_max)
        WHERE u.seq = r.seq;
        hasil := 'retry';
    ELSE
        alasan := CASE WHEN alasan IS NOT NULL THEN 'retries_exhausted'
                       WHEN p_state = 'URREF' THEN 'handler_refused'
                       ELSE 'database_refused' END;
        DELETE FROM urutan_parkir u WHERE u.seq = r.seq;
        DELETE FROM pesan_diproses d WHERE d.message_id = r.message_id AND d.pesanan_id = r.pesanan_id;
        IF p_tahan THEN
            PERFORM urutan_tahan_tolak(p_id, r.message_id, r.versi, r.shard, galat);
        END IF;
        hasil := 'refused';
        pesan := coalesce(r.pesan,
                          jsonb_build_object('message_id', r.message_id, 'id', r.pesanan_id,
                                             'status', r.status, 'versi', r.versi)
                          || CASE WHEN r.data IS NULL THEN '{}'::jsonb
                                  ELSE jsonb_build_object('data', r.data) END);
    END IF;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION urutan_lepas_gagal(TEXT, TEXT, TEXT, TEXT, DOUBLE PRECISION, DOUBLE PRECISION, INT, BOOLEAN) IS 'Records the failure (gagal) of a parked message tried by the release step: set aside again (retry) or refused (out of the sequence, its claim for its order withdrawn, its order held with p_tahan); no row for a failure that is the database''s own.';

-- The release, returning each message's order too (a new result column:
-- dropped and created again).
DROP FUNCTION IF EXISTS urutan_lepas(INT, INT, DOUBLE PRECISION, DOUBLE PRECISION, INT, BOOLEAN, BOOLEAN);
CREATE FUNCTION urutan_lepas(p_shard integer, p_batas integer, p_min double precision, p_max double precision, p_maks integer, p_tahan boolean, p_satu boolean) RETURNS TABLE(message_id text, hasil text, tunggu double precision, pertama boolean, alasan text, galat text, pesan jsonb, pesanan_id text)
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_selesai BIGINT := urutan_epoch_selesai();
    v_bebas   BOOLEAN;  -- no window open: an epoch every shard passed is enough
    v_celah   BOOLEAN := urutan_celah_tunggu();
    v_versi   BIGINT;
    v_id      TEXT;
    v_event   JSONB;
    v_state   TEXT;
    v_teks    TEXT;
    g RECORD;
    r RECORD;
BEGIN
    IF v_selesai IS NULL THEN
        RETURN;
    END IF;
    UPDATE urutan_jendela SET ditutup_pada = now()
    WHERE ditutup_pada IS NULL AND epoch <= v_selesai;
    v_bebas := NOT urutan_jendela_terbuka(v_selesai);
    FOR v_id IN
        SELECT DISTINCT u.pesanan_id FROM urutan_parkir u LEFT JOIN pesanan p ON p.id = u.pesanan_id
        WHERE u.shard = p_shard
          AND ((v_bebas AND u.epoch <= v_selesai
                AND NOT urutan_menunggu_kembali(u.pesanan_id, u.versi, p.versi)
                AND (NOT v_celah OR urutan_celah_dilewati(u.pesanan_id, u.diparkir_pada)))
               OR u.versi <= coalesce(p.versi, 0) + 1)
          -- A held order waits; only the message holding it (replayed, then
          -- set aside after a transient failure) may be tried.
          AND NOT EXISTS (SELECT 1 FROM urutan_tahan t WHERE t.pesanan_id = u.pesanan_id
                                                        AND t.message_id IS DISTINCT FROM u.message_id)
          AND NOT EXISTS (SELECT 1 FROM urutan_parkir w
                          WHERE w.pesanan_id = u.pesanan_id AND w.jatuh_tempo > now())
        ORDER BY u.pesanan_id LIMIT p_batas
    LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(v_id, 7261));
        SELECT p.versi INTO v_versi FROM pesanan p WHERE p.id = v_id;
        pertama := true;
        FOR r IN SELECT * FROM urutan_parkir u WHERE u.pesanan_id = v_id
                 ORDER BY u.versi, u.seq LOOP
            EXIT WHEN r.versi > coalesce(v_versi, 0) + 1
                      AND NOT (v_bebas AND r.epoch <= v_selesai
                               AND NOT urutan_menunggu_kembali(v_id, r.versi, v_versi)
                               AND (NOT v_celah OR urutan_celah_dilewati(v_id, r.diparkir_pada)));
            EXIT WHEN r.jatuh_tempo > now();
            EXIT WHEN EXISTS (SELECT 1 FROM urutan_tahan t
                              WHERE t.pesanan_id = v_id AND t.message_id IS DISTINCT FROM r.message_id);
            message_id := r.message_id;
            pesanan_id := v_id;
            tunggu := extract(epoch FROM now() - r.diparkir_pada);
            v_event := coalesce(r.pesan,
                                jsonb_build_object('message_id', r.message_id, 'id', r.pesanan_id,
                                                   'status', r.status, 'versi', r.versi)
                                || CASE WHEN r.data IS NULL THEN '{}'::jsonb
                                        ELSE jsonb_build_object('data', r.data) END);
            alasan := NULL;
            galat := NULL;
            pesan := NULL;
            BEGIN
                hasil := urutan_tulis(v_event, r.shard, r.epoch);
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_teks = MESSAGE_TEXT;
                SELECT * INTO g FROM urutan_lepas_gagal(r.message_id, v_id, v_state, v_teks,
                                                        p_min, p_max, p_maks, p_tahan);
                IF g.hasil IS NULL THEN
                    RAISE;
                END IF;
                hasil := g.hasil;
                alasan := g.alasan;
                galat := g.galat;
                pesan := g.pesan;
                RETURN NEXT;
                EXIT;
            END;
            IF hasil = 'applied' THEN
                v_versi := r.versi;
            END IF;
            -- The message holding its order is through: the hold ends.
            DELETE FROM urutan_tahan t WHERE t.pesanan_id = v_id AND t.message_id = r.message_id;
            DELETE FROM urutan_parkir u WHERE u.seq = r.seq;
            RETURN NEXT;
            IF p_satu THEN
                RETURN;
            END IF;
            pertama := false;
        END LOOP;
        IF p_satu AND message_id IS NOT NULL THEN
            RETURN;
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION urutan_lepas(INT, INT, DOUBLE PRECISION, DOUBLE PRECISION, INT, BOOLEAN, BOOLEAN) IS 'Releases (lepas) the parked and due set-aside messages of a shard, each version in a subtransaction: applied, stale, retry (set aside again) or refused (out of the sequence; the order held if p_tahan); with p_satu, one version per call. Each row names its message and its order (pesanan_id).';

-- The form without p_satu (the previous version's workers): its columns as
-- they were.
CREATE OR REPLACE FUNCTION urutan_lepas(p_shard integer, p_batas integer, p_min double precision, p_max double precision, p_maks integer, p_tahan boolean) RETURNS TABLE(message_id text, hasil text, tunggu double precision, pertama boolean, alasan text, galat text, pesan jsonb)
    LANGUAGE sql
    AS $$
    SELECT l.message_id, l.hasil, l.tunggu, l.pertama, l.alasan, l.galat, l.pesan
    FROM urutan_lepas(p_shard, p_batas, p_min, p_max, p_maks, p_tahan, false) l
$$;
COMMENT ON FUNCTION urutan_lepas(INT, INT, DOUBLE PRECISION, DOUBLE PRECISION, INT, BOOLEAN) IS 'urutan_lepas for every version that may go (the form without p_satu).';
