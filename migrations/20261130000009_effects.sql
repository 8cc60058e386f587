-- Downstream effects (issue 18, src/effects/): webhooks sent after a version
-- is applied, exactly once in effect when the endpoint honours the
-- idempotency key.
--
-- The rule: a version that is `applied` gets, IN ITS APPLY TRANSACTION, one
-- effect row per configured endpoint whose status matches; a stale,
-- duplicate or parked delivery gets none. So an effect exists if and only if
-- its state change does, whatever crashes and when.
--
-- Every apply path (strict `urutan_terapkan`, the batch loop, the set-based
-- batch, a parked message released by `urutan_lepas`) inserts exactly one
-- `pesanan_riwayat` row per applied version, so an AFTER INSERT trigger on
-- that table catches them all without restating any of their bodies. The
-- trigger reads the event's data from `pesanan`, which at that moment holds
-- the version being recorded: every path writes the state before its
-- history row, and the set-based batch, which writes only an order's last
-- version of the batch, is sent through the per-message loop when effects
-- are on and an order appears twice in one batch (below).
--
-- Which status goes where is the dispatcher's configuration (EFFECTS); the
-- database must know it at apply time, so `urutan effects` writes it into
-- `urutan_efek_rute` when it starts (the last dispatcher started wins; see
-- the README). An effect row carries its endpoint, so any dispatcher
-- delivers it, whatever its own configuration.

-- Every endpoint ever configured (an effect keeps pointing at its own).
CREATE TABLE IF NOT EXISTS urutan_efek_tujuan (
    tujuan SERIAL PRIMARY KEY,
    url    TEXT NOT NULL UNIQUE
);

-- The routes now in force: status ('*': every status) -> endpoint.
CREATE TABLE IF NOT EXISTS urutan_efek_rute (
    status TEXT NOT NULL,
    tujuan INT NOT NULL REFERENCES urutan_efek_tujuan,
    PRIMARY KEY (status, tujuan)
);

-- One row per (applied version, endpoint). `keadaan` (state):
--   'menunggu'  pending: not yet answered with a 2xx nor given up;
--   'terkirim'  sent: the endpoint answered 2xx;
--   'gagal'     dead-lettered: a 4xx (not 408/429), or retries exhausted
--               (the last answer or error is kept in `jawaban`).
-- Per order, effects go out in (versi, tujuan) order, one at a time: the
-- next waits while an earlier one is pending.
CREATE TABLE IF NOT EXISTS urutan_efek (
    efek         BIGSERIAL PRIMARY KEY,
    pesanan_id   TEXT NOT NULL,
    versi        BIGINT NOT NULL,
    tujuan       INT NOT NULL REFERENCES urutan_efek_tujuan,
    -- The applied message's id: `webhook-id` and `Idempotency-Key`.
    message_id   TEXT NOT NULL,
    -- The applied event, as the contract's body: id, status, versi, data.
    isi          JSONB NOT NULL,
    keadaan      TEXT NOT NULL DEFAULT 'menunggu'
                 CHECK (keadaan IN ('menunggu', 'terkirim', 'gagal')),
    -- Attempts started (counted when claimed, so a crash mid-request counts).
    percobaan    INT NOT NULL DEFAULT 0,
    -- Not to be sent before (retry backoff).
    coba_pada    TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Claimed by `sewa_oleh` until `sewa_sampai` (a dispatcher's lease; an
    -- expired lease is claimed again, with the same key).
    sewa_sampai  TIMESTAMPTZ,
    sewa_oleh    TEXT,
    dibuat_pada  TIMESTAMPTZ NOT NULL DEFAULT now(),
    selesai_pada TIMESTAMPTZ,
    -- The last answer: HTTP status (NULL: no answer) and body or error.
    kode         INT,
    jawaban      TEXT,
    UNIQUE (pesanan_id, versi, tujuan)
);
CREATE INDEX IF NOT EXISTS urutan_efek_menunggu_idx ON urutan_efek (efek)
    WHERE keadaan = 'menunggu';
CREATE INDEX IF NOT EXISTS urutan_efek_pesanan_menunggu_idx ON urutan_efek (pesanan_id, versi, tujuan)
    WHERE keadaan = 'menunggu';
CREATE INDEX IF NOT EXISTS urutan_efek_selesai_idx ON urutan_efek (selesai_pada)
    WHERE keadaan = 'terkirim';

-- Are effects configured? (SECURITY DEFINER: the worker's role needs no
-- rights on the effect tables.)
CREATE OR REPLACE FUNCTION urutan_efek_aktif() RETURNS BOOLEAN
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT EXISTS (SELECT 1 FROM urutan_efek_rute)
$$;

-- Records the effects of one applied version (the history row NEW).
CREATE OR REPLACE FUNCTION urutan_efek_catat() RETURNS TRIGGER
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    v_versi BIGINT;
    v_data  JSONB;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM urutan_efek_rute WHERE status IN (NEW.status, '*')) THEN
        RETURN NULL;
    END IF;
    SELECT versi, data INTO v_versi, v_data FROM pesanan WHERE id = NEW.pesanan_id;
    -- Every apply path writes the state before its history row; anything
    -- else would send another version's data: refuse loudly.
    IF v_versi IS DISTINCT FROM NEW.versi THEN
        RAISE EXCEPTION 'urutan: the effect of % version % cannot see its data (stored version %)',
            NEW.pesanan_id, NEW.versi, v_versi;
    END IF;
    INSERT INTO urutan_efek (pesanan_id, versi, tujuan, message_id, isi)
    SELECT DISTINCT NEW.pesanan_id, NEW.versi, r.tujuan, NEW.message_id,
           jsonb_build_object('id', NEW.pesanan_id, 'status', NEW.status, 'versi', NEW.versi)
           || CASE WHEN v_data IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('data', v_data) END
    FROM urutan_efek_rute r
    WHERE r.status IN (NEW.status, '*')
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER urutan_efek_catat AFTER INSERT ON pesanan_riwayat
    FOR EACH ROW EXECUTE FUNCTION urutan_efek_catat();

-- The set-based batch writes only an order's last applied version of the
-- batch into `pesanan`, so the trigger could not see the data of the
-- earlier ones. With effects on and an order twice in one batch, the batch
-- goes through the per-message loop (same outcomes, rows and order; see
-- migration 0006). The set-based function keeps its body under a new name
-- (renamed only the first time: re-runnable).
DO $$
BEGIN
    IF to_regprocedure('urutan_terapkan_batch_himpun(text[], text[], text[], bigint[], text[], bigint[], integer)') IS NULL THEN
        ALTER FUNCTION urutan_terapkan_batch(TEXT[], TEXT[], TEXT[], BIGINT[], TEXT[], BIGINT[], INT)
            RENAME TO urutan_terapkan_batch_himpun;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION urutan_terapkan_batch(
    p_message_ids TEXT[], p_ids TEXT[], p_statuses TEXT[], p_versis BIGINT[],
    p_datas TEXT[], p_markers BIGINT[], p_shard INT)
RETURNS TEXT[] LANGUAGE plpgsql AS $$
BEGIN
    IF urutan_efek_aktif()
       AND (SELECT count(DISTINCT id) < count(id) FROM unnest(p_ids) id) THEN
        RETURN urutan_terapkan_batch_urut(p_message_ids, p_ids, p_statuses, p_versis,
                                          p_datas, p_markers, p_shard);
    END IF;
    RETURN urutan_terapkan_batch_himpun(p_message_ids, p_ids, p_statuses, p_versis,
                                        p_datas, p_markers, p_shard);
END
$$;
