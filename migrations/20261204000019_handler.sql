-- Issue 31: the team's own handler (HANDLER_FUNCTION, docs/contract.md
-- section 10), called inside the apply transaction of every version urutan
-- applies: strict mode, batch mode and a parked message released later all
-- write through urutan_tulis, so all of them call it there, after the state
-- and history rows and before commit; never for a stale or duplicate one.
--
-- The worker names the function in its session setting `urutan.handler`
-- (a connection option); unset or empty, nothing is called and nothing
-- costs more than reading that setting.

-- The handler named in this session's `urutan.handler`, resolved to the
-- function taking one jsonb (NULL: no handler). A name that resolves to no
-- such function raises undefined_function (42883): the worker holds the
-- message and retries (a dropped handler is an operator's mistake, never a
-- reason to dead-letter events).
CREATE OR REPLACE FUNCTION urutan_penangan() RETURNS regprocedure
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_nama TEXT := nullif(current_setting('urutan.handler', true), '');
    v_fungsi regprocedure;
BEGIN
    IF v_nama IS NULL THEN
        RETURN NULL;
    END IF;
    v_fungsi := to_regprocedure(v_nama || '(jsonb)');
    IF v_fungsi IS NULL THEN
        RAISE EXCEPTION 'HANDLER_FUNCTION %: there is no function %(event jsonb) in this database', v_nama, v_nama
            USING ERRCODE = '42883',
                  HINT = 'create it (CREATE FUNCTION ... (event jsonb) RETURNS void) or unset HANDLER_FUNCTION';
    END IF;
    RETURN v_fungsi;
END
$$;

-- Calls handler p_penangan with the contract's event for p_pesan (applied
-- on p_shard over stored version p_versi_lama). Its transient errors
-- (URTRY: it asks to retry; class 40; 55P03; 57014) and the database's own
-- trouble (classes 53, 57, 58, XX) pass as they are; any other error is its
-- refusal, raised as URREF with the original SQLSTATE and message, so the
-- worker can tell it from a refusal of urutan's own writes.
CREATE OR REPLACE FUNCTION urutan_panggil_penangan(p_penangan regprocedure, p_pesan JSONB, p_shard INT,
                                        p_versi_lama BIGINT)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_event JSONB := jsonb_build_object(
        'message_id', p_pesan->>'message_id', 'id', p_pesan->>'id',
        'status', p_pesan->>'status', 'versi', (p_pesan->>'versi')::bigint,
        'data', p_pesan->'data', 'previous_versi', p_versi_lama, 'shard', p_shard);
    v_state TEXT;
    v_pesan TEXT;
BEGIN
    EXECUTE format('SELECT %s($1)', p_penangan::oid::regproc) USING v_event;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_pesan = MESSAGE_TEXT;
    IF v_state IN ('URTRY', '55P03', '57014')
       OR left(v_state, 2) IN ('40', '53', '57', '58', 'XX') THEN
        RAISE;
    END IF;
    RAISE EXCEPTION 'the handler refused: SQLSTATE %: %', v_state, v_pesan
        USING ERRCODE = 'URREF';
END
$$;

-- Migration 0018's urutan_tulis, calling the handler after the history row.
CREATE OR REPLACE FUNCTION urutan_tulis(p_pesan JSONB, p_shard INT, p_epoch BIGINT)
RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    v_id    TEXT := p_pesan->>'id';
    v_versi BIGINT := (p_pesan->>'versi')::bigint;
    v_penangan regprocedure;
    v_lama  BIGINT;  -- the stored version before this one (NULL: a new order)
BEGIN
    IF coalesce(current_setting('urutan.handler', true), '') <> '' THEN
        v_penangan := urutan_penangan();
        SELECT versi INTO v_lama FROM pesanan WHERE id = v_id;
    END IF;
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
    IF v_penangan IS NOT NULL THEN
        PERFORM urutan_panggil_penangan(v_penangan, p_pesan, p_shard, v_lama);
    END IF;
    RETURN 'applied';
END
$$;

-- Migration 0018's batch entry: with a handler, the per-message loop (each
-- version's handler call sees the state that version wrote).
CREATE OR REPLACE FUNCTION urutan_terapkan_batch(p_pesan JSONB, p_shard INT)
RETURNS TEXT[] LANGUAGE plpgsql AS $$
DECLARE
    v_ids TEXT[] := ARRAY(SELECT e->>'id' FROM jsonb_array_elements(p_pesan) e);
BEGIN
    IF coalesce(current_setting('urutan.handler', true), '') <> ''
       OR (urutan_efek_aktif()
           AND (SELECT count(DISTINCT id) < count(id) FROM unnest(v_ids) id))
       OR EXISTS (SELECT 1 FROM urutan_dikembalikan WHERE pesanan_id = ANY (v_ids)) THEN
        RETURN urutan_terapkan_batch_urut(p_pesan, p_shard);
    END IF;
    RETURN urutan_terapkan_batch_himpun(p_pesan, p_shard);
END
$$;

COMMENT ON FUNCTION urutan_penangan() IS
    'The handler (penangan) named in this session''s urutan.handler setting (HANDLER_FUNCTION), as the function taking one jsonb; NULL when none is set; raises 42883 when the name resolves to no such function.';
COMMENT ON FUNCTION urutan_panggil_penangan(regprocedure, JSONB, INT, BIGINT) IS
    'Calls (panggil) the handler with the contract''s event of an applied version; its transient errors pass as they are, any other is raised as URREF (the handler refused) with its SQLSTATE and message.';
COMMENT ON FUNCTION urutan_tulis(JSONB, INT, BIGINT) IS
    'The versioned write (tulis: write) of one event at epoch p_epoch: moves the order forward only, with one history row per applied version, then calls the handler (urutan.handler) if one is set. Returns applied or stale; the caller holds the order''s lock.';
COMMENT ON FUNCTION urutan_terapkan_batch(JSONB, INT) IS
    'Applies one shard''s batch in arrival order with the outcomes each message would have alone: set-based, or message by message when a handler is set, effects need each version''s state, or an order has a returned message.';
