-- Issue 30: SQL that documents itself, and an apply that takes the event as
-- ONE value. No change in behaviour: same outcomes, same rows, same locks.
--
-- 1. The apply functions take the event as one jsonb object, the contract's
--    body plus its message id: {"message_id", "id", "status", "versi",
--    "data"} ("data" absent when the body had none). The batch takes one
--    jsonb array of such objects, an epoch marker being {"marker": <epoch>}.
--    A new optional field of the message therefore no longer changes every
--    signature, and flows on its own through everything that only carries
--    the event: a parked message keeps the whole event (urutan_parkir.pesan)
--    and is applied from it when released. Only the versioned write, which
--    names pesanan's columns (urutan_tulis and the set-based
--    urutan_terapkan_batch_himpun), says where a stored field goes.
-- 2. COMMENT ON every table, non-obvious column and function, so that
--    sql/schema.sql (the generated dump) carries the documentation.
--
-- Rolling upgrade: workers of the previous version keep calling
-- urutan_terapkan(text, text, text, bigint, jsonb, int) and
-- urutan_terapkan_batch(text[], ..., int) until they are replaced; both stay
-- as thin wrappers that build the event and call the new signature. Only the
-- internal functions that no binary calls are dropped (a call of the old
-- body in flight at the very moment this migration commits fails with an
-- error the worker retries).
--
-- Every statement is idempotent (a migration may be re-applied by its owner).

-- A parked message keeps the event it came with, whole: urutan_lepas applies
-- it from there. The other columns stay what the release and the operators
-- query. Rows parked before this migration get their event from their
-- columns; a row without one (written by a body older than this migration
-- while it committed) is read from its columns by urutan_lepas.
ALTER TABLE urutan_parkir ADD COLUMN IF NOT EXISTS pesan JSONB;
UPDATE urutan_parkir
SET pesan = jsonb_build_object('message_id', message_id, 'id', pesanan_id,
                               'status', status, 'versi', versi)
            || CASE WHEN data IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('data', data) END
WHERE pesan IS NULL;

-- The versioned write: moves the order forward only; one history row per
-- applied version. Returns 'applied' or 'stale'. Called with the order's
-- lock held. The one place (with the set-based batch below) that names
-- pesanan's columns: a field stored in the state is written here.
CREATE OR REPLACE FUNCTION urutan_tulis(p_pesan JSONB, p_shard INT, p_epoch BIGINT)
RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    v_id    TEXT := p_pesan->>'id';
    v_versi BIGINT := (p_pesan->>'versi')::bigint;
BEGIN
    INSERT INTO pesanan AS p (id, status, versi, data, epoch)
    VALUES (v_id, p_pesan->>'status', v_versi, p_pesan->'data', p_epoch)
    ON CONFLICT (id) DO UPDATE
        SET status = EXCLUDED.status, versi = EXCLUDED.versi, data = EXCLUDED.data,
            diperbarui_pada = now(), epoch = greatest(p.epoch, EXCLUDED.epoch)
        WHERE p.versi < EXCLUDED.versi;
    IF NOT FOUND THEN
        RETURN 'stale';
    END IF;
    INSERT INTO pesanan_riwayat (pesanan_id, versi, status, message_id, shard)
    VALUES (v_id, v_versi, p_pesan->>'status', p_pesan->>'message_id', p_shard);
    RETURN 'applied';
END
$$;

-- Migration 0014's urutan_terapkan, with the event as one value.
CREATE OR REPLACE FUNCTION urutan_terapkan(p_pesan JSONB, p_shard INT)
RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    v_message_id TEXT := p_pesan->>'message_id';
    v_id         TEXT := p_pesan->>'id';
    v_versi_baru BIGINT := (p_pesan->>'versi')::bigint;
    v_posisi BIGINT;  -- epochs this shard has passed: the message's epoch
    v_epoch  BIGINT;  -- epoch of the entity's last applied message (NULL: never seen)
    v_versi  BIGINT;  -- the entity's stored version (NULL: never seen)
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
    -- The next version (or an old one) never waits: nothing it could
    -- overtake exists.
    IF v_versi_baru > coalesce(v_versi, 0) + 1 AND (
           EXISTS (SELECT 1 FROM urutan_parkir WHERE pesanan_id = v_id AND epoch <= v_posisi)
           OR urutan_jendela_terbuka(v_posisi)
           OR (v_epoch IS DISTINCT FROM v_posisi
               AND v_posisi > coalesce(urutan_epoch_selesai(), v_posisi))
           OR urutan_menunggu_kembali(v_id, v_versi_baru, v_versi)) THEN
        INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, data, shard, epoch, pesan)
        VALUES (v_id, v_message_id, p_pesan->>'status', v_versi_baru, p_pesan->'data',
                p_shard, v_posisi, p_pesan);
        RETURN 'parked';
    END IF;
    RETURN urutan_tulis(p_pesan, p_shard, v_posisi);
END
$$;

-- Migration 0010's urutan_lepas, applying each parked message's own event.
CREATE OR REPLACE FUNCTION urutan_lepas(p_shard INT, p_batas INT)
RETURNS TABLE (message_id TEXT, hasil TEXT, tunggu DOUBLE PRECISION, pertama BOOLEAN)
LANGUAGE plpgsql AS $$
DECLARE
    v_selesai BIGINT := urutan_epoch_selesai();
    v_bebas   BOOLEAN;  -- no window open: an epoch every shard passed is enough
    v_versi   BIGINT;
    v_id      TEXT;
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
                AND NOT urutan_menunggu_kembali(u.pesanan_id, u.versi, p.versi))
               OR u.versi <= coalesce(p.versi, 0) + 1)
        ORDER BY u.pesanan_id LIMIT p_batas
    LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(v_id, 7261));
        SELECT p.versi INTO v_versi FROM pesanan p WHERE p.id = v_id;
        pertama := true;
        FOR r IN SELECT * FROM urutan_parkir u WHERE u.pesanan_id = v_id
                 ORDER BY u.versi, u.seq LOOP
            EXIT WHEN r.versi > coalesce(v_versi, 0) + 1
                      AND NOT (v_bebas AND r.epoch <= v_selesai
                               AND NOT urutan_menunggu_kembali(v_id, r.versi, v_versi));
            message_id := r.message_id;
            hasil := urutan_tulis(
                coalesce(r.pesan,
                         jsonb_build_object('message_id', r.message_id, 'id', r.pesanan_id,
                                            'status', r.status, 'versi', r.versi)
                         || CASE WHEN r.data IS NULL THEN '{}'::jsonb
                                 ELSE jsonb_build_object('data', r.data) END),
                r.shard, r.epoch);
            IF hasil = 'applied' THEN
                v_versi := r.versi;
            END IF;
            tunggu := extract(epoch FROM now() - r.diparkir_pada);
            DELETE FROM urutan_parkir u WHERE u.seq = r.seq;
            RETURN NEXT;
            pertama := false;
        END LOOP;
    END LOOP;
END
$$;

-- Migration 0013's per-message loop: each item as urutan_terapkan would
-- apply it alone, a marker passed (or refused as forged) in its place.
CREATE OR REPLACE FUNCTION urutan_terapkan_batch_urut(p_pesan JSONB, p_shard INT)
RETURNS TEXT[] LANGUAGE plpgsql AS $$
DECLARE
    v_hasil TEXT[] := '{}';
    v_item  JSONB;
BEGIN
    FOR v_item IN SELECT e FROM jsonb_array_elements(p_pesan) WITH ORDINALITY AS t(e, i)
                  ORDER BY i LOOP
        IF v_item ? 'marker' THEN
            v_hasil := v_hasil || CASE WHEN urutan_lewati_penanda(p_shard, (v_item->>'marker')::bigint)
                                       THEN 'marker' ELSE 'marker_forged' END;
        ELSE
            v_hasil := v_hasil || urutan_terapkan(v_item, p_shard);
        END IF;
    END LOOP;
    RETURN v_hasil;
END
$$;

-- Migration 0014's set-based batch, with the events as one jsonb array.
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

-- Migration 0010's batch entry: the per-message loop when effects are on and
-- an order appears twice (the effects trigger must see each version's
-- state), or when an order of the batch has a returned message.
CREATE OR REPLACE FUNCTION urutan_terapkan_batch(p_pesan JSONB, p_shard INT)
RETURNS TEXT[] LANGUAGE plpgsql AS $$
DECLARE
    v_ids TEXT[] := ARRAY(SELECT e->>'id' FROM jsonb_array_elements(p_pesan) e);
BEGIN
    IF (urutan_efek_aktif()
        AND (SELECT count(DISTINCT id) < count(id) FROM unnest(v_ids) id))
       OR EXISTS (SELECT 1 FROM urutan_dikembalikan WHERE pesanan_id = ANY (v_ids)) THEN
        RETURN urutan_terapkan_batch_urut(p_pesan, p_shard);
    END IF;
    RETURN urutan_terapkan_batch_himpun(p_pesan, p_shard);
END
$$;

-- The previous signatures, for workers of the previous version during a
-- rolling upgrade: one statement each, building the event.
CREATE OR REPLACE FUNCTION urutan_terapkan(p_message_id TEXT, p_id TEXT, p_status TEXT,
                                           p_versi BIGINT, p_data JSONB, p_shard INT)
RETURNS TEXT LANGUAGE sql AS $$
    SELECT urutan_terapkan(
        jsonb_build_object('message_id', p_message_id, 'id', p_id, 'status', p_status,
                           'versi', p_versi)
        || CASE WHEN p_data IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('data', p_data) END,
        p_shard)
$$;

CREATE OR REPLACE FUNCTION urutan_terapkan_batch(p_message_ids TEXT[], p_ids TEXT[],
                                                 p_statuses TEXT[], p_versis BIGINT[],
                                                 p_datas TEXT[], p_markers BIGINT[], p_shard INT)
RETURNS TEXT[] LANGUAGE sql AS $$
    SELECT urutan_terapkan_batch(
        coalesce(jsonb_agg(
            CASE WHEN m IS NOT NULL THEN jsonb_build_object('marker', m)
                 ELSE jsonb_build_object('message_id', mid, 'id', id, 'status', s, 'versi', v)
                      || CASE WHEN d IS NULL THEN '{}'::jsonb
                              ELSE jsonb_build_object('data', d::jsonb) END
            END ORDER BY i), '[]'::jsonb),
        p_shard)
    FROM unnest(p_message_ids, p_ids, p_statuses, p_versis, p_datas, p_markers)
         WITH ORDINALITY AS t(mid, id, s, v, d, m, i)
$$;

-- Internal functions no binary calls: replaced by the signatures above.
DROP FUNCTION IF EXISTS urutan_terapkan_batch_himpun(TEXT[], TEXT[], TEXT[], BIGINT[], TEXT[], BIGINT[], INT);
DROP FUNCTION IF EXISTS urutan_terapkan_batch_urut(TEXT[], TEXT[], TEXT[], BIGINT[], TEXT[], BIGINT[], INT);
DROP FUNCTION IF EXISTS urutan_tulis(TEXT, TEXT, TEXT, BIGINT, JSONB, INT, BIGINT);

-- Tables ---------------------------------------------------------------------

COMMENT ON TABLE pesanan IS
    'Each order''s current state (contract section 4): one row per order, only ever moved forward by versi. Written by the apply functions (urutan_tulis and the set-based batch), never by anyone else.';
COMMENT ON COLUMN pesanan.epoch IS
    'The epoch (shard position) of the message that last applied this order: a message of another epoch may have to wait (park) while an older one can still be queued on another shard.';
COMMENT ON COLUMN pesanan.data IS
    'The body''s optional "data" member as sent (NULL when absent or null).';

COMMENT ON TABLE pesan_diproses IS
    'Deduplication: every message id processed (applied, stale or parked) with the order it was claimed for. Rows older than DEDUP_RETENTION (30 days by default) are purged.';
COMMENT ON COLUMN pesan_diproses.pesanan_id IS
    'The order that claimed the id: the same id for another order is message_id_reused (dead-lettered). '''' for rows recorded before orders were recorded (migration 0014): a duplicate for any order.';

COMMENT ON TABLE pesanan_riwayat IS
    'One row per applied version, in apply order (seq); UNIQUE (pesanan_id, versi). Its AFTER INSERT trigger records the version''s effects.';
COMMENT ON COLUMN pesanan_riwayat.shard IS
    'The shard whose worker applied the version (for a released parked message: the shard it was parked by).';

COMMENT ON TABLE outbox IS
    'Transactional outbox (contract section 4): producers insert rows in their own transaction, `urutan relay` publishes each to the entry exchange (message id = id, header x-pesanan-id = agregat_id) and marks it sent.';
COMMENT ON COLUMN outbox.dikirim_pada IS
    'When the relay published the row (confirmed by the broker); NULL while unsent. Sent rows are purged after a while.';
COMMENT ON COLUMN outbox.unroutable_at IS
    'Set by the relay when the broker returned the row as unroutable (its routing key is outside <prefix>.#): set aside, not retried, reported by `urutan status`. Clear it (and unroutable_reason) to retry.';

COMMENT ON TABLE urutan_shard IS
    'Every shard queue and the highest epoch marker its worker has passed: the position a message arriving on it is tagged with.';
COMMENT ON COLUMN urutan_shard.aktif IS
    'False once a shrink removed the shard: urutan_epoch_selesai() no longer waits for it.';

COMMENT ON TABLE urutan_epoch IS
    'Every epoch opened (a point where the hash ring may have changed: a (re)connect, a broker restart, a resharding), each announced by a marker in every shard queue. Old rows are pruned by urutan_epoch_pangkas.';

COMMENT ON TABLE urutan_parkir IS
    'Messages that must wait for an older message of their order that may still be queued on another shard (or handed back to its queue); urutan_lepas applies them in version, then arrival order.';
COMMENT ON COLUMN urutan_parkir.epoch IS
    'The position (epochs passed by its shard) the message arrived at; it may go once every active shard has passed it and no window is open for it.';
COMMENT ON COLUMN urutan_parkir.pesan IS
    'The event as received (the jsonb urutan_terapkan was given): what urutan_lepas applies. The other columns are what the release and the operators query.';

COMMENT ON TABLE urutan_ring IS
    'Every recorded hash ring, one row per change (the highest versi is current): replicas with different SHARD_COUNTs agree through it.';
COMMENT ON COLUMN urutan_ring.dari IS
    'The shard count before the change (NULL: the first record).';
COMMENT ON COLUMN urutan_ring.epoch IS
    'The epoch opened right after the bindings changed: once every shard has passed it, nothing routed by the old ring is left.';
COMMENT ON COLUMN urutan_ring.selesai IS
    'When the old ring''s messages were all done and removed shards deleted (NULL while the resharding is in progress).';

COMMENT ON TABLE urutan_ring_berubah IS
    'The previous version''s "ring change under way" flag (migration 0005), replaced by urutan_jendela. Kept, empty, for replicas of that version during a rolling upgrade.';

COMMENT ON TABLE urutan_jendela IS
    'Windows: ring changes the epoch markers may not separate (a resharding, a broker restart). While one is open for a message''s position, a message that is not its order''s next version parks.';
COMMENT ON COLUMN urutan_jendela.epoch IS
    'The epoch opened after the ring change (NULL: not open yet); the window ends once every shard has passed it.';
COMMENT ON COLUMN urutan_jendela.ditutup_pada IS
    'Bookkeeping: set by urutan_lepas once every shard passed the epoch (such a window is closed whether or not this is set).';

COMMENT ON TABLE urutan_dikembalikan IS
    'Messages a worker handed back to its queue after a failure, until they come back (applied, stale, duplicate or dead-lettered): a newer version of the order waits for them.';

COMMENT ON TABLE urutan_dead_letter IS
    'Dead-letter records, committed before each reject into the DLQ (or by `urutan dlq` for a message found there without one). Rows with resolved_at NULL are in the DLQ now.';
COMMENT ON COLUMN urutan_dead_letter.delivery_key IS
    'message_id, or ''sha256:<hex>'' of the message when the id is missing or invalid: one unresolved record per key.';
COMMENT ON COLUMN urutan_dead_letter.shard IS
    'The shard the delivery came from (-1: unknown, for a record made from the queue).';
COMMENT ON COLUMN urutan_dead_letter.reason IS
    'The reason label of urutan_dead_letters_total (or, recorded from the queue, the broker''s x-death reason).';
COMMENT ON COLUMN urutan_dead_letter.recorded_by IS
    '''worker'' (before its reject) or ''queue'' (found in the DLQ by `urutan dlq` with no record).';
COMMENT ON COLUMN urutan_dead_letter.recorded_at IS
    'When this row was written (dead_lettered_at may be a producer''s x-death time): unresolved rows expire after DEAD_LETTER_UNRESOLVED_RETENTION from it.';

COMMENT ON TABLE urutan_efek IS
    'Downstream effects: one webhook per applied version and matching endpoint, recorded in the apply transaction. Per order they go out in (versi, tujuan) order, one at a time.';
COMMENT ON COLUMN urutan_efek.keadaan IS
    '''menunggu'' pending, ''terkirim'' sent (a 2xx answer), ''gagal'' dead-lettered (a 4xx other than 408/429, or retries exhausted).';
COMMENT ON COLUMN urutan_efek.message_id IS
    'The applied message''s id: the webhook-id and Idempotency-Key of the request.';
COMMENT ON COLUMN urutan_efek.isi IS
    'What is sent: the applied event as the contract''s body (id, status, versi, data).';
COMMENT ON COLUMN urutan_efek.percobaan IS
    'Attempts started (counted when claimed, so a crash mid-request counts).';
COMMENT ON COLUMN urutan_efek.sewa_sampai IS
    'The claiming dispatcher (sewa_oleh) holds the effect until then; an expired lease is claimed again, with the same key.';

COMMENT ON TABLE urutan_efek_kepala IS
    'The dispatcher''s schedule: one row per order with a pending effect, also the order''s lock for scheduling (claims, results and inserts take it).';
COMMENT ON COLUMN urutan_efek_kepala.siap_pada IS
    'No later than the moment the order''s first pending effect may go (a claim that finds it not due moves it to the due time).';

COMMENT ON TABLE urutan_efek_tujuan IS
    'Every effect endpoint ever configured (an effect keeps pointing at its own).';

COMMENT ON TABLE urutan_efek_rute IS
    'The effect routes in force (status, ''*'' for every status, to endpoint), written by the `urutan effects` started last.';

-- Functions --------------------------------------------------------------

COMMENT ON FUNCTION urutan_terapkan(JSONB, INT) IS
    'Applies one delivery in one transaction: dedup claim (per order), then the versioned write, or parking while an older message of the order may still be queued elsewhere. The event is one jsonb object {message_id, id, status, versi, data?}. Returns applied, stale, duplicate, message_id_reused or parked.';
COMMENT ON FUNCTION urutan_terapkan(TEXT, TEXT, TEXT, BIGINT, JSONB, INT) IS
    'The previous signature, kept for workers of the previous version during a rolling upgrade: builds the event and calls urutan_terapkan(jsonb, int).';
COMMENT ON FUNCTION urutan_terapkan_batch(JSONB, INT) IS
    'Ordered batch mode: a jsonb array of one shard''s deliveries (events, or {"marker": epoch}) in ONE transaction, with exactly the outcomes they would have one by one. Returns one answer per item (urutan_terapkan''s, or marker / marker_forged).';
COMMENT ON FUNCTION urutan_terapkan_batch(TEXT[], TEXT[], TEXT[], BIGINT[], TEXT[], BIGINT[], INT) IS
    'The previous signature (one array per field; a marker where p_markers is not NULL), kept for workers of the previous version during a rolling upgrade: calls urutan_terapkan_batch(jsonb, int).';
COMMENT ON FUNCTION urutan_terapkan_batch_himpun(JSONB, INT) IS
    'The set-based body of the batch (himpun: gathered): one dedup claim, one versioned upsert per order, one history insert. Hands the batch to the per-message loop when a marker is in it or any message could park.';
COMMENT ON FUNCTION urutan_terapkan_batch_urut(JSONB, INT) IS
    'The per-message loop of the batch (urut: in sequence), the reference the set-based body must match: urutan_terapkan per event, urutan_lewati_penanda per marker.';
COMMENT ON FUNCTION urutan_tulis(JSONB, INT, BIGINT) IS
    'The versioned write (tulis: write) of one event at epoch p_epoch: moves the order forward only, with one history row per applied version. Returns applied or stale; the caller holds the order''s lock.';
COMMENT ON FUNCTION urutan_lepas(INT, INT) IS
    'Releases (lepas) the parked messages of shard p_shard that may go now, for at most p_batas orders, in version then arrival order; returns each one''s outcome, wait and whether it was the first of its order.';
COMMENT ON FUNCTION urutan_sudah_diproses(TEXT, TEXT) IS
    'What a message id that could not be claimed means for order p_id: duplicate (recorded for it, or before orders were recorded) or message_id_reused.';
COMMENT ON FUNCTION urutan_lewati_penanda(INT, BIGINT) IS
    'Passes the epoch marker of p_epoch on p_shard if urutan recorded that epoch; false, with the position untouched, for a forged one.';
COMMENT ON FUNCTION urutan_epoch_selesai() IS
    'The highest epoch every active shard has passed (NULL: no shard registered).';
COMMENT ON FUNCTION urutan_epoch_pangkas(INT) IS
    'Deletes the oldest epochs, keeping the newest p_simpan and every epoch an active shard has not passed; returns the rows deleted. SECURITY DEFINER: the worker and relay may insert epochs, not delete them.';
COMMENT ON FUNCTION urutan_jendela_terbuka(BIGINT) IS
    'Is a ring change not yet behind a message at position p_posisi? True while a window''s epoch is not open, or is above p_posisi.';
COMMENT ON FUNCTION urutan_menunggu_kembali(TEXT, BIGINT, BIGINT) IS
    'Must version p_versi of order p_id wait for a returned older version? True while one is handed back and not back yet, unless it is no newer than the stored version p_tersimpan.';
COMMENT ON FUNCTION urutan_dikembalikan_mati() IS
    'Trigger on urutan_dead_letter: a dead-lettered message does not come back, so its order stops waiting for it (mati: dead).';
COMMENT ON FUNCTION urutan_efek_aktif() IS
    'Are effects configured (any route in force)? SECURITY DEFINER: the worker''s role needs no rights on the effect tables.';
COMMENT ON FUNCTION urutan_efek_catat() IS
    'Trigger on pesanan_riwayat: records the applied version''s effects (catat: record), one per matching endpoint, with the state the version wrote. SECURITY DEFINER.';
COMMENT ON FUNCTION urutan_efek_klaim(INT, DOUBLE PRECISION, TEXT) IS
    'The dispatcher''s claim (klaim): leases up to p_batas due effects, the first pending one of each due order, for p_sewa seconds to p_oleh, from the schedule (urutan_efek_kepala).';
COMMENT ON FUNCTION urutan_efek_hasil(BIGINT, INTEGER, TEXT, INTEGER, TEXT, DOUBLE PRECISION) IS
    'Records a dispatcher''s answer (hasil: result) for attempt p_percobaan of an effect and moves its order''s schedule; false if the effect is no longer that attempt''s.';
COMMENT ON FUNCTION urutan_efek_kepala_baru() IS
    'Statement trigger on urutan_efek: new pending effects put their orders on the schedule. SECURITY DEFINER.';
COMMENT ON FUNCTION urutan_efek_kepala_lagi() IS
    'Row trigger on urutan_efek: an effect pending again (replayed) puts its order back on the schedule, due now. SECURITY DEFINER.';
