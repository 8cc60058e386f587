-- One NOTIFY channel per pipeline (issue 44): `urutan_enqueue` notified
-- `urutan_outbox` in every schema, so an enqueue in one pipeline woke the
-- relays of all the others in its database (each found nothing and slept
-- again). The channel is now the pipeline's own, computed here and by the
-- relay (`urutan::outbox::notify_channel`, a test holds the two equal):
-- `urutan_outbox` in public (unchanged), `urutan_outbox_<schema>` in any
-- other schema, or `urutan_outbox_` and the first 32 hex digits of the
-- schema name's SHA-256 where that passes the 63-byte identifier limit.

CREATE OR REPLACE FUNCTION urutan_saluran_outbox() RETURNS TEXT
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN current_schema() = 'public' THEN 'urutan_outbox'
        WHEN octet_length('urutan_outbox_' || current_schema()) <= 63
            THEN 'urutan_outbox_' || current_schema()
        ELSE 'urutan_outbox_'
             || left(encode(sha256(convert_to(current_schema(), 'UTF8')), 'hex'), 32)
    END
$$;

-- Its schema's channel whatever the caller's search_path (as urutan_enqueue).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION urutan_saluran_outbox() SET search_path = %I, pg_temp',
                   current_schema());
END
$$;

COMMENT ON FUNCTION urutan_saluran_outbox() IS
    'The NOTIFY channel (saluran) of this schema''s pipeline: urutan_outbox in public, urutan_outbox_<schema> elsewhere (urutan_outbox_ and 32 hex digits of the name''s SHA-256 beyond 63 bytes). urutan_enqueue notifies it; the relay LISTENs on it.';

CREATE OR REPLACE FUNCTION urutan_enqueue(id text, status text, versi bigint, data jsonb DEFAULT NULL::jsonb, routing_key text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
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
    -- Delivered at commit (never on rollback), once per transaction, on
    -- this pipeline's own channel.
    PERFORM pg_notify(urutan_saluran_outbox(), '');
    RETURN v_baru;
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION urutan_enqueue(TEXT, TEXT, BIGINT, JSONB, TEXT) SET search_path = %I, pg_temp',
                   current_schema());
END
$$;

COMMENT ON FUNCTION urutan_enqueue(TEXT, TEXT, BIGINT, JSONB, TEXT) IS
    'Enqueues one event in the caller''s transaction (contract section 4): checks it against the contract (22023 otherwise), inserts the outbox row with the contract body as payload and routing key <prefix>.<status> unless given, NOTIFY on its pipeline''s channel (urutan_saluran_outbox()) at commit; returns the outbox id (the message id).';
