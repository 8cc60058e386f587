-- Issue 32, part 1: producers in any language enqueue with one SQL call in
-- their own transaction (docs/contract.md section 4):
--
--   SELECT urutan_enqueue(id, status, versi [, data] [, routing_key]);
--
-- It checks the event against the contract (section 2) so that a bad call
-- fails in the producer's transaction instead of becoming a dead letter,
-- inserts the outbox row (payload = the contract body), wakes the relay with
-- NOTIFY urutan_outbox (delivered at commit, like the Rust `enqueue`) and
-- returns the row's id, the message id it will be published with.
--
-- The default routing key is `<prefix>.<status>`. The SQL learns the
-- pipeline's topology prefix (and entity, and largest body) from the one row
-- of urutan_pengaturan: seeded here with the contract's defaults, then
-- written by `urutan migrate` and `urutan run` with their own settings
-- (ENTITY, TOPOLOGY_PREFIX, MAX_BODY_BYTES) whenever they differ. Each
-- DATABASE_SCHEMA has its own row, as it has its own outbox.
--
-- Re-runnable: IF NOT EXISTS / ON CONFLICT DO NOTHING / CREATE OR REPLACE.

CREATE TABLE IF NOT EXISTS urutan_pengaturan (
    satu            BOOLEAN PRIMARY KEY DEFAULT true CHECK (satu),
    entitas         TEXT NOT NULL,
    awalan          TEXT NOT NULL,
    batas_badan     INT NOT NULL CHECK (batas_badan > 0),
    diperbarui_pada TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO urutan_pengaturan (entitas, awalan, batas_badan)
VALUES ('pesanan', 'pesanan', 1048576)
ON CONFLICT (satu) DO NOTHING;

CREATE OR REPLACE FUNCTION urutan_enqueue(id TEXT, status TEXT, versi BIGINT, data JSONB DEFAULT NULL,
                                          routing_key TEXT DEFAULT NULL)
RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    v_atur    urutan_pengaturan%ROWTYPE;
    v_kunci   TEXT;
    v_payload JSONB;
    v_baru    BIGINT;
BEGIN
    SELECT * INTO v_atur FROM urutan_pengaturan;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'urutan_enqueue: urutan_pengaturan has no row'
            USING ERRCODE = '55000', HINT = 'run `urutan migrate` as the database owner';
    END IF;
    IF urutan_enqueue.id IS NULL OR octet_length(urutan_enqueue.id) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'urutan_enqueue: id must be 1-128 bytes (got %)',
                coalesce(octet_length(urutan_enqueue.id) || ' bytes', 'NULL')
            USING ERRCODE = '22023', HINT = 'the entity id: the body''s id and the hash header';
    END IF;
    IF urutan_enqueue.status IS NULL OR char_length(urutan_enqueue.status) NOT BETWEEN 1 AND 64 THEN
        RAISE EXCEPTION 'urutan_enqueue: status must be 1-64 characters (got %)',
                coalesce(char_length(urutan_enqueue.status) || ' characters', 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF urutan_enqueue.versi IS NULL OR urutan_enqueue.versi NOT BETWEEN 1 AND 9007199254740991 THEN
        RAISE EXCEPTION 'urutan_enqueue: versi must be from 1 to 9007199254740991 (got %)',
                coalesce(urutan_enqueue.versi::text, 'NULL')
            USING ERRCODE = '22023', HINT = 'versions start at 1 and increase per entity';
    END IF;
    v_kunci := coalesce(urutan_enqueue.routing_key, v_atur.awalan || '.' || urutan_enqueue.status);
    IF octet_length(v_kunci) NOT BETWEEN 1 AND 255
       OR NOT (v_kunci = v_atur.awalan OR left(v_kunci, length(v_atur.awalan) + 1) = v_atur.awalan || '.') THEN
        RAISE EXCEPTION 'urutan_enqueue: routing key % is not 1-255 bytes under %.#', v_kunci, v_atur.awalan
            USING ERRCODE = '22023',
                  HINT = format('pass a routing key starting with %s. (or none: %s.<status>)',
                                v_atur.awalan, v_atur.awalan);
    END IF;
    v_payload := jsonb_build_object('id', urutan_enqueue.id, 'status', urutan_enqueue.status,
                                    'versi', urutan_enqueue.versi)
                 || CASE WHEN urutan_enqueue.data IS NULL THEN '{}'::jsonb
                         ELSE jsonb_build_object('data', urutan_enqueue.data) END;
    -- The relay publishes payload::text as the body: its size is this.
    IF octet_length(v_payload::text) > v_atur.batas_badan THEN
        RAISE EXCEPTION 'urutan_enqueue: the body is % bytes, above the % of MAX_BODY_BYTES',
                octet_length(v_payload::text), v_atur.batas_badan
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
    VALUES (v_atur.entitas, urutan_enqueue.id, v_kunci, v_payload)
    RETURNING outbox.id INTO v_baru;
    -- Delivered at commit (never on rollback), once per transaction.
    PERFORM pg_notify('urutan_outbox', '');
    RETURN v_baru;
END
$$;

-- Its tables are its own schema's (DATABASE_SCHEMA) whatever the caller's
-- search_path: `SELECT pengiriman.urutan_enqueue(...)` from a session on
-- public writes pengiriman's outbox. pg_temp last: a caller's temporary
-- table never stands in for them (as migration 0016 does for the definers).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION urutan_enqueue(TEXT, TEXT, BIGINT, JSONB, TEXT) SET search_path = %I, pg_temp',
                   current_schema());
END
$$;

COMMENT ON TABLE urutan_pengaturan IS
    'The pipeline''s settings that SQL needs (pengaturan: settings), one row: the entity (ENTITY, the outbox rows'' agregat_tipe), the topology prefix (TOPOLOGY_PREFIX, urutan_enqueue''s default routing key <prefix>.<status>) and MAX_BODY_BYTES. Seeded with the defaults; written by `urutan migrate` and `urutan run`.';
COMMENT ON FUNCTION urutan_enqueue(TEXT, TEXT, BIGINT, JSONB, TEXT) IS
    'Enqueues one event in the caller''s transaction (contract section 4): checks it against the contract (22023 otherwise), inserts the outbox row with the contract body as payload and routing key <prefix>.<status> unless given, NOTIFY urutan_outbox at commit; returns the outbox id (the message id).';
