-- The schema as urutan's migrations leave it (generated: do not edit).
-- Regenerate: URUTAN_BLESS_SCHEMA=1 cargo test --test it schema::
-- pg_dump major version: 15
--
-- PostgreSQL database dump
--



SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: urutan_dikembalikan_mati(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_dikembalikan_mati() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    DELETE FROM urutan_dikembalikan
    WHERE message_id = NEW.message_id AND pesanan_id = NEW.pesanan_id;
    RETURN NULL;
END
$$;


--
-- Name: urutan_efek_aktif(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_efek_aktif() RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
    SELECT EXISTS (SELECT 1 FROM urutan_efek_rute)
$$;


--
-- Name: urutan_efek_catat(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_efek_catat() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
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


--
-- Name: urutan_efek_hasil(bigint, integer, text, integer, text, double precision); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_efek_hasil(p_efek bigint, p_percobaan integer, p_keadaan text, p_kode integer, p_jawaban text, p_setelah double precision) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_order TEXT;
BEGIN
    SELECT e.pesanan_id INTO v_order FROM urutan_efek e WHERE e.efek = p_efek;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO urutan_efek_kepala AS k (pesanan_id, siap_pada) VALUES (v_order, now())
    ON CONFLICT (pesanan_id) DO UPDATE SET siap_pada = k.siap_pada WHERE false;
    UPDATE urutan_efek e
    SET keadaan = p_keadaan, kode = p_kode, jawaban = p_jawaban,
        sewa_sampai = NULL, sewa_oleh = NULL,
        coba_pada = now() + make_interval(secs => p_setelah),
        selesai_pada = CASE WHEN p_keadaan = 'menunggu' THEN NULL ELSE now() END
    WHERE e.efek = p_efek AND e.percobaan = p_percobaan AND e.keadaan = 'menunggu';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE urutan_efek_kepala k
    SET siap_pada = now() + make_interval(secs => p_setelah)
    WHERE k.pesanan_id = v_order;
    RETURN true;
END
$$;


--
-- Name: urutan_efek_kepala_baru(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_efek_kepala_baru() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO urutan_efek_kepala AS k (pesanan_id, siap_pada)
    SELECT DISTINCT b.pesanan_id, now() FROM baru b WHERE b.keadaan = 'menunggu'
    ORDER BY 1
    ON CONFLICT (pesanan_id) DO UPDATE SET siap_pada = k.siap_pada WHERE false;
    RETURN NULL;
END
$$;


--
-- Name: urutan_efek_kepala_lagi(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_efek_kepala_lagi() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO urutan_efek_kepala AS k (pesanan_id, siap_pada)
    VALUES (NEW.pesanan_id, now())
    ON CONFLICT (pesanan_id) DO UPDATE SET siap_pada = least(k.siap_pada, now());
    RETURN NULL;
END
$$;


--
-- Name: urutan_efek_klaim(integer, double precision, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_efek_klaim(p_batas integer, p_sewa double precision, p_oleh text) RETURNS TABLE(efek bigint, pesanan_id text, versi bigint, message_id text, isi text, url text, percobaan integer)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    v_order  TEXT;
    v_head   BIGINT;
    v_due    TIMESTAMPTZ;
    v_sampai TIMESTAMPTZ := now() + make_interval(secs => p_sewa);
    v_taken  INT := 0;
    v_seen   INT;
    v_rows   INT;
BEGIN
    IF p_sewa <= 0 THEN
        RAISE EXCEPTION 'urutan: a lease of % s would not hold a claim', p_sewa;
    END IF;
    LOOP
        v_seen := 0;
        FOR v_order IN
            SELECT k.pesanan_id FROM urutan_efek_kepala k
            WHERE k.siap_pada <= now()
            ORDER BY k.siap_pada
            LIMIT p_batas - v_taken
            FOR UPDATE SKIP LOCKED
        LOOP
            v_seen := v_seen + 1;
            SELECT e.efek, greatest(e.coba_pada, e.sewa_sampai) INTO v_head, v_due
            FROM urutan_efek e
            WHERE e.pesanan_id = v_order AND e.keadaan = 'menunggu'
            ORDER BY e.versi, e.tujuan
            LIMIT 1;
            IF NOT FOUND THEN
                DELETE FROM urutan_efek_kepala k WHERE k.pesanan_id = v_order;
            ELSIF v_due > now() THEN
                UPDATE urutan_efek_kepala k SET siap_pada = v_due WHERE k.pesanan_id = v_order;
            ELSE
                UPDATE urutan_efek_kepala k SET siap_pada = v_sampai WHERE k.pesanan_id = v_order;
                RETURN QUERY
                    UPDATE urutan_efek e
                    SET sewa_sampai = v_sampai, sewa_oleh = p_oleh, percobaan = e.percobaan + 1
                    FROM urutan_efek_tujuan t
                    WHERE e.efek = v_head AND t.tujuan = e.tujuan
                      -- Rechecked if a claim outside the schedule (a
                      -- dispatcher older than this migration, during an
                      -- upgrade) leased it meanwhile: then it is not ours.
                      AND e.keadaan = 'menunggu'
                      AND (e.sewa_sampai IS NULL OR e.sewa_sampai <= now())
                    RETURNING e.efek, e.pesanan_id, e.versi, e.message_id, e.isi::text, t.url,
                              e.percobaan;
                GET DIAGNOSTICS v_rows = ROW_COUNT;
                v_taken := v_taken + v_rows;
            END IF;
        END LOOP;
        EXIT WHEN v_seen = 0 OR v_taken >= p_batas;
    END LOOP;
END
$$;


--
-- Name: urutan_epoch_pangkas(integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_epoch_pangkas(p_simpan integer) RETURNS bigint
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
    WITH batas AS (
        SELECT least(
            coalesce((SELECT min(epoch) FROM urutan_shard WHERE aktif), 0),
            coalesce((SELECT epoch FROM urutan_epoch
                      ORDER BY epoch DESC OFFSET greatest(p_simpan, 1) - 1 LIMIT 1), 0)) AS b
    ), hapus AS (
        DELETE FROM urutan_epoch WHERE epoch < (SELECT b FROM batas) RETURNING 1
    )
    SELECT count(*) FROM hapus
$$;


--
-- Name: urutan_epoch_selesai(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_epoch_selesai() RETURNS bigint
    LANGUAGE sql STABLE
    AS $$
    SELECT min(epoch) FROM urutan_shard WHERE aktif
$$;


--
-- Name: urutan_jendela_terbuka(bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_jendela_terbuka(p_posisi bigint) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT EXISTS (SELECT 1 FROM urutan_jendela
                   WHERE ditutup_pada IS NULL AND (epoch IS NULL OR epoch > p_posisi))
$$;


--
-- Name: urutan_lepas(integer, integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_lepas(p_shard integer, p_batas integer) RETURNS TABLE(message_id text, hasil text, tunggu double precision, pertama boolean)
    LANGUAGE plpgsql
    AS $$
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
            hasil := urutan_tulis(r.message_id, r.pesanan_id, r.status, r.versi, r.data,
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


--
-- Name: urutan_lewati_penanda(integer, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_lewati_penanda(p_shard integer, p_epoch bigint) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM urutan_epoch WHERE epoch = p_epoch)
       AND p_epoch > coalesce((SELECT epoch FROM urutan_shard WHERE shard = p_shard), 0) THEN
        RETURN false;
    END IF;
    INSERT INTO urutan_shard (shard, epoch) VALUES (p_shard, p_epoch)
    ON CONFLICT (shard) DO UPDATE SET epoch = greatest(urutan_shard.epoch, EXCLUDED.epoch);
    RETURN true;
END
$$;


--
-- Name: urutan_menunggu_kembali(text, bigint, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_menunggu_kembali(p_id text, p_versi bigint, p_tersimpan bigint) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT EXISTS (SELECT 1 FROM urutan_dikembalikan
                   WHERE pesanan_id = p_id AND versi < p_versi
                     AND versi > coalesce(p_tersimpan, 0))
$$;


--
-- Name: urutan_sudah_diproses(text, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_sudah_diproses(p_message_id text, p_id text) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce((SELECT CASE WHEN d.pesanan_id IN (p_id, '') THEN 'duplicate'
                                 ELSE 'message_id_reused' END
                     FROM pesan_diproses d WHERE d.message_id = p_message_id),
                    'duplicate')
$$;


--
-- Name: urutan_terapkan(text, text, text, bigint, jsonb, integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_terapkan(p_message_id text, p_id text, p_status text, p_versi bigint, p_data jsonb, p_shard integer) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_posisi BIGINT;  -- epochs this shard has passed: the message's epoch
    v_epoch  BIGINT;  -- epoch of the entity's last applied message (NULL: never seen)
    v_versi  BIGINT;  -- the entity's stored version (NULL: never seen)
BEGIN
    -- Back after a return (whatever this delivery's outcome).
    DELETE FROM urutan_dikembalikan WHERE message_id = p_message_id AND pesanan_id = p_id;
    INSERT INTO pesan_diproses (message_id, pesanan_id) VALUES (p_message_id, p_id)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN urutan_sudah_diproses(p_message_id, p_id);
    END IF;
    -- One entity at a time across shards (apply, park and release).
    PERFORM pg_advisory_xact_lock(hashtextextended(p_id, 7261));
    SELECT epoch INTO v_posisi FROM urutan_shard WHERE shard = p_shard;
    v_posisi := coalesce(v_posisi, 0);
    SELECT epoch, versi INTO v_epoch, v_versi FROM pesanan WHERE id = p_id;
    -- The next version (or an old one) never waits: nothing it could
    -- overtake exists.
    IF p_versi > coalesce(v_versi, 0) + 1 AND (
           EXISTS (SELECT 1 FROM urutan_parkir WHERE pesanan_id = p_id AND epoch <= v_posisi)
           OR urutan_jendela_terbuka(v_posisi)
           OR (v_epoch IS DISTINCT FROM v_posisi
               AND v_posisi > coalesce(urutan_epoch_selesai(), v_posisi))
           OR urutan_menunggu_kembali(p_id, p_versi, v_versi)) THEN
        INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, data, shard, epoch)
        VALUES (p_id, p_message_id, p_status, p_versi, p_data, p_shard, v_posisi);
        RETURN 'parked';
    END IF;
    RETURN urutan_tulis(p_message_id, p_id, p_status, p_versi, p_data, p_shard, v_posisi);
END
$$;


--
-- Name: urutan_terapkan_batch(text[], text[], text[], bigint[], text[], bigint[], integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_terapkan_batch(p_message_ids text[], p_ids text[], p_statuses text[], p_versis bigint[], p_datas text[], p_markers bigint[], p_shard integer) RETURNS text[]
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF (urutan_efek_aktif()
        AND (SELECT count(DISTINCT id) < count(id) FROM unnest(p_ids) id))
       OR EXISTS (SELECT 1 FROM urutan_dikembalikan WHERE pesanan_id = ANY (p_ids)) THEN
        RETURN urutan_terapkan_batch_urut(p_message_ids, p_ids, p_statuses, p_versis,
                                          p_datas, p_markers, p_shard);
    END IF;
    RETURN urutan_terapkan_batch_himpun(p_message_ids, p_ids, p_statuses, p_versis,
                                        p_datas, p_markers, p_shard);
END
$$;


--
-- Name: urutan_terapkan_batch_himpun(text[], text[], text[], bigint[], text[], bigint[], integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_terapkan_batch_himpun(p_message_ids text[], p_ids text[], p_statuses text[], p_versis bigint[], p_datas text[], p_markers bigint[], p_shard integer) RETURNS text[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_posisi BIGINT;  -- epochs this shard has passed: the epoch of every message here
    v_klaim  TEXT[];  -- message ids claimed now (not seen before)
    v_hasil  TEXT[];
BEGIN
    IF coalesce(array_length(p_markers, 1), 0) = 0 THEN
        RETURN '{}';
    END IF;
    -- A marker moves the shard's epoch in the middle of the batch: loop.
    IF EXISTS (SELECT 1 FROM unnest(p_markers) m WHERE m IS NOT NULL) THEN
        RETURN urutan_terapkan_batch_urut(p_message_ids, p_ids, p_statuses, p_versis,
                                          p_datas, p_markers, p_shard);
    END IF;

    -- Every entity of the batch, one at a time across shards (the loop takes
    -- the same locks one by one; a fixed order here avoids deadlocks).
    PERFORM pg_advisory_xact_lock(k)
    FROM (SELECT DISTINCT hashtextextended(id, 7261) AS k FROM unnest(p_ids) id ORDER BY 1) s;

    -- Could any message park (urutan_terapkan's rule, without its exemption
    -- of next versions)? Then the loop decides, message by message. The
    -- shard's epoch cannot move within this batch.
    SELECT epoch INTO v_posisi FROM urutan_shard WHERE shard = p_shard;
    v_posisi := coalesce(v_posisi, 0);
    IF EXISTS (SELECT 1 FROM urutan_parkir WHERE pesanan_id = ANY (p_ids) AND epoch <= v_posisi)
       OR urutan_jendela_terbuka(v_posisi)
       OR (v_posisi > coalesce(urutan_epoch_selesai(), v_posisi)
           AND EXISTS (SELECT 1 FROM unnest(p_ids) d(id) LEFT JOIN pesanan p ON p.id = d.id
                       WHERE p.epoch IS DISTINCT FROM v_posisi)) THEN
        RETURN urutan_terapkan_batch_urut(p_message_ids, p_ids, p_statuses, p_versis,
                                          p_datas, p_markers, p_shard);
    END IF;

    -- Dedup: the first copy of a message id not seen before is new, for its
    -- order; later copies (in this batch or after it) are not.
    WITH klaim AS (
        INSERT INTO pesan_diproses (message_id, pesanan_id)
        SELECT DISTINCT ON (message_id) message_id, id
        FROM unnest(p_message_ids, p_ids) WITH ORDINALITY AS t(message_id, id, i)
        ORDER BY message_id, i
        ON CONFLICT DO NOTHING
        RETURNING message_id
    )
    SELECT coalesce(array_agg(message_id), '{}') INTO v_klaim FROM klaim;

    -- A new message is applied when its version is above the stored one and
    -- above every earlier new message of its entity in this batch; otherwise
    -- it is stale. The entity ends at its last applied message.
    WITH masuk AS (
        SELECT *
        FROM unnest(p_message_ids, p_ids, p_statuses, p_versis, p_datas)
             WITH ORDINALITY AS t(message_id, id, status, versi, data, i)
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
        SELECT DISTINCT ON (id) id, status, versi, data::jsonb, v_posisi
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


--
-- Name: urutan_terapkan_batch_urut(text[], text[], text[], bigint[], text[], bigint[], integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_terapkan_batch_urut(p_message_ids text[], p_ids text[], p_statuses text[], p_versis bigint[], p_datas text[], p_markers bigint[], p_shard integer) RETURNS text[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_hasil TEXT[] := '{}';
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_markers, 1), 0) LOOP
        IF p_markers[i] IS NOT NULL THEN
            v_hasil := v_hasil || CASE WHEN urutan_lewati_penanda(p_shard, p_markers[i])
                                       THEN 'marker' ELSE 'marker_forged' END;
        ELSE
            v_hasil := v_hasil || urutan_terapkan(p_message_ids[i], p_ids[i], p_statuses[i],
                                                  p_versis[i], p_datas[i]::jsonb, p_shard);
        END IF;
    END LOOP;
    RETURN v_hasil;
END
$$;


--
-- Name: urutan_tulis(text, text, text, bigint, jsonb, integer, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_tulis(p_message_id text, p_id text, p_status text, p_versi bigint, p_data jsonb, p_shard integer, p_epoch bigint) RETURNS text
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO pesanan AS p (id, status, versi, data, epoch)
    VALUES (p_id, p_status, p_versi, p_data, p_epoch)
    ON CONFLICT (id) DO UPDATE
        SET status = EXCLUDED.status, versi = EXCLUDED.versi, data = EXCLUDED.data,
            diperbarui_pada = now(), epoch = greatest(p.epoch, EXCLUDED.epoch)
        WHERE p.versi < EXCLUDED.versi;
    IF NOT FOUND THEN
        RETURN 'stale';
    END IF;
    INSERT INTO pesanan_riwayat (pesanan_id, versi, status, message_id, shard)
    VALUES (p_id, p_versi, p_status, p_message_id, p_shard);
    RETURN 'applied';
END
$$;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: _sqlx_migrations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public._sqlx_migrations (
    version bigint NOT NULL,
    description text NOT NULL,
    installed_on timestamp with time zone DEFAULT now() NOT NULL,
    success boolean NOT NULL,
    checksum bytea NOT NULL,
    execution_time bigint NOT NULL
);


--
-- Name: outbox; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.outbox (
    id bigint NOT NULL,
    agregat_tipe text NOT NULL,
    agregat_id text NOT NULL,
    routing_key text NOT NULL,
    payload jsonb NOT NULL,
    dibuat_pada timestamp with time zone DEFAULT now() NOT NULL,
    dikirim_pada timestamp with time zone,
    unroutable_at timestamp with time zone,
    unroutable_reason text
);


--
-- Name: outbox_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.outbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: outbox_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.outbox_id_seq OWNED BY public.outbox.id;


--
-- Name: pesan_diproses; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.pesan_diproses (
    message_id text NOT NULL,
    diproses_pada timestamp with time zone DEFAULT now() NOT NULL,
    pesanan_id text NOT NULL
);


--
-- Name: pesanan; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.pesanan (
    id text NOT NULL,
    status text NOT NULL,
    versi bigint NOT NULL,
    data jsonb,
    diperbarui_pada timestamp with time zone DEFAULT now() NOT NULL,
    epoch bigint DEFAULT 0 NOT NULL
);


--
-- Name: pesanan_riwayat; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.pesanan_riwayat (
    seq bigint NOT NULL,
    pesanan_id text NOT NULL,
    versi bigint NOT NULL,
    status text NOT NULL,
    message_id text NOT NULL,
    shard integer NOT NULL,
    diterapkan_pada timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: pesanan_riwayat_seq_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.pesanan_riwayat_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: pesanan_riwayat_seq_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.pesanan_riwayat_seq_seq OWNED BY public.pesanan_riwayat.seq;


--
-- Name: urutan_dead_letter; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_dead_letter (
    id bigint NOT NULL,
    delivery_key text NOT NULL,
    message_id text,
    pesanan_id text,
    versi bigint,
    shard integer NOT NULL,
    reason text NOT NULL,
    detail text NOT NULL,
    last_error text,
    dead_lettered_at timestamp with time zone DEFAULT now() NOT NULL,
    resolved_at timestamp with time zone,
    resolution text,
    recorded_by text DEFAULT 'worker'::text NOT NULL,
    exchange text,
    routing_key text,
    properties jsonb DEFAULT '{}'::jsonb NOT NULL,
    headers jsonb DEFAULT '{}'::jsonb NOT NULL,
    body bytea DEFAULT '\x'::bytea NOT NULL,
    body_bytes integer DEFAULT 0 NOT NULL,
    x_death jsonb,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT urutan_dead_letter_check CHECK (((resolved_at IS NULL) = (resolution IS NULL))),
    CONSTRAINT urutan_dead_letter_recorded_by_check CHECK ((recorded_by = ANY (ARRAY['worker'::text, 'queue'::text]))),
    CONSTRAINT urutan_dead_letter_resolution_check CHECK ((resolution = ANY (ARRAY['replayed'::text, 'purged'::text])))
);


--
-- Name: urutan_dead_letter_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.urutan_dead_letter_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: urutan_dead_letter_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.urutan_dead_letter_id_seq OWNED BY public.urutan_dead_letter.id;


--
-- Name: urutan_dikembalikan; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_dikembalikan (
    message_id text NOT NULL,
    pesanan_id text NOT NULL,
    versi bigint NOT NULL,
    shard integer NOT NULL,
    dikembalikan_pada timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: urutan_efek; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_efek (
    efek bigint NOT NULL,
    pesanan_id text NOT NULL,
    versi bigint NOT NULL,
    tujuan integer NOT NULL,
    message_id text NOT NULL,
    isi jsonb NOT NULL,
    keadaan text DEFAULT 'menunggu'::text NOT NULL,
    percobaan integer DEFAULT 0 NOT NULL,
    coba_pada timestamp with time zone DEFAULT now() NOT NULL,
    sewa_sampai timestamp with time zone,
    sewa_oleh text,
    dibuat_pada timestamp with time zone DEFAULT now() NOT NULL,
    selesai_pada timestamp with time zone,
    kode integer,
    jawaban text,
    CONSTRAINT urutan_efek_keadaan_check CHECK ((keadaan = ANY (ARRAY['menunggu'::text, 'terkirim'::text, 'gagal'::text])))
);


--
-- Name: urutan_efek_efek_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.urutan_efek_efek_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: urutan_efek_efek_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.urutan_efek_efek_seq OWNED BY public.urutan_efek.efek;


--
-- Name: urutan_efek_kepala; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_efek_kepala (
    pesanan_id text NOT NULL,
    siap_pada timestamp with time zone NOT NULL
);


--
-- Name: urutan_efek_rute; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_efek_rute (
    status text NOT NULL,
    tujuan integer NOT NULL
);


--
-- Name: urutan_efek_tujuan; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_efek_tujuan (
    tujuan integer NOT NULL,
    url text NOT NULL
);


--
-- Name: urutan_efek_tujuan_tujuan_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.urutan_efek_tujuan_tujuan_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: urutan_efek_tujuan_tujuan_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.urutan_efek_tujuan_tujuan_seq OWNED BY public.urutan_efek_tujuan.tujuan;


--
-- Name: urutan_epoch; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_epoch (
    epoch bigint NOT NULL,
    alasan text NOT NULL,
    dibuka_pada timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: urutan_epoch_epoch_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.urutan_epoch_epoch_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: urutan_epoch_epoch_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.urutan_epoch_epoch_seq OWNED BY public.urutan_epoch.epoch;


--
-- Name: urutan_jendela; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_jendela (
    jendela bigint NOT NULL,
    sebab text NOT NULL,
    epoch bigint,
    dibuka_pada timestamp with time zone DEFAULT now() NOT NULL,
    ditutup_pada timestamp with time zone
);


--
-- Name: urutan_jendela_jendela_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.urutan_jendela_jendela_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: urutan_jendela_jendela_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.urutan_jendela_jendela_seq OWNED BY public.urutan_jendela.jendela;


--
-- Name: urutan_parkir; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_parkir (
    seq bigint NOT NULL,
    pesanan_id text NOT NULL,
    message_id text NOT NULL,
    status text NOT NULL,
    versi bigint NOT NULL,
    data jsonb,
    shard integer NOT NULL,
    epoch bigint NOT NULL,
    diparkir_pada timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: urutan_parkir_seq_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.urutan_parkir_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: urutan_parkir_seq_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.urutan_parkir_seq_seq OWNED BY public.urutan_parkir.seq;


--
-- Name: urutan_ring; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_ring (
    versi bigint NOT NULL,
    shard_count integer NOT NULL,
    dari integer,
    epoch bigint NOT NULL,
    oleh text NOT NULL,
    mulai timestamp with time zone DEFAULT now() NOT NULL,
    selesai timestamp with time zone,
    CONSTRAINT urutan_ring_dari_check CHECK (((dari >= 1) AND (dari <= 999))),
    CONSTRAINT urutan_ring_shard_count_check CHECK (((shard_count >= 1) AND (shard_count <= 999)))
);


--
-- Name: urutan_ring_berubah; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_ring_berubah (
    satu boolean DEFAULT true NOT NULL,
    sejak timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT urutan_ring_berubah_satu_check CHECK (satu)
);


--
-- Name: urutan_ring_versi_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.urutan_ring_versi_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: urutan_ring_versi_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.urutan_ring_versi_seq OWNED BY public.urutan_ring.versi;


--
-- Name: urutan_shard; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_shard (
    shard integer NOT NULL,
    epoch bigint DEFAULT 0 NOT NULL,
    aktif boolean DEFAULT true NOT NULL
);


--
-- Name: outbox id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox ALTER COLUMN id SET DEFAULT nextval('public.outbox_id_seq'::regclass);


--
-- Name: pesanan_riwayat seq; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pesanan_riwayat ALTER COLUMN seq SET DEFAULT nextval('public.pesanan_riwayat_seq_seq'::regclass);


--
-- Name: urutan_dead_letter id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_dead_letter ALTER COLUMN id SET DEFAULT nextval('public.urutan_dead_letter_id_seq'::regclass);


--
-- Name: urutan_efek efek; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek ALTER COLUMN efek SET DEFAULT nextval('public.urutan_efek_efek_seq'::regclass);


--
-- Name: urutan_efek_tujuan tujuan; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek_tujuan ALTER COLUMN tujuan SET DEFAULT nextval('public.urutan_efek_tujuan_tujuan_seq'::regclass);


--
-- Name: urutan_epoch epoch; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_epoch ALTER COLUMN epoch SET DEFAULT nextval('public.urutan_epoch_epoch_seq'::regclass);


--
-- Name: urutan_jendela jendela; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_jendela ALTER COLUMN jendela SET DEFAULT nextval('public.urutan_jendela_jendela_seq'::regclass);


--
-- Name: urutan_parkir seq; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_parkir ALTER COLUMN seq SET DEFAULT nextval('public.urutan_parkir_seq_seq'::regclass);


--
-- Name: urutan_ring versi; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_ring ALTER COLUMN versi SET DEFAULT nextval('public.urutan_ring_versi_seq'::regclass);


--
-- Name: _sqlx_migrations _sqlx_migrations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public._sqlx_migrations
    ADD CONSTRAINT _sqlx_migrations_pkey PRIMARY KEY (version);


--
-- Name: outbox outbox_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);


--
-- Name: pesan_diproses pesan_diproses_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pesan_diproses
    ADD CONSTRAINT pesan_diproses_pkey PRIMARY KEY (message_id);


--
-- Name: pesanan pesanan_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pesanan
    ADD CONSTRAINT pesanan_pkey PRIMARY KEY (id);


--
-- Name: pesanan_riwayat pesanan_riwayat_pesanan_id_versi_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pesanan_riwayat
    ADD CONSTRAINT pesanan_riwayat_pesanan_id_versi_key UNIQUE (pesanan_id, versi);


--
-- Name: pesanan_riwayat pesanan_riwayat_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pesanan_riwayat
    ADD CONSTRAINT pesanan_riwayat_pkey PRIMARY KEY (seq);


--
-- Name: urutan_dead_letter urutan_dead_letter_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_dead_letter
    ADD CONSTRAINT urutan_dead_letter_pkey PRIMARY KEY (id);


--
-- Name: urutan_dikembalikan urutan_dikembalikan_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_dikembalikan
    ADD CONSTRAINT urutan_dikembalikan_pkey PRIMARY KEY (message_id);


--
-- Name: urutan_efek_kepala urutan_efek_kepala_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek_kepala
    ADD CONSTRAINT urutan_efek_kepala_pkey PRIMARY KEY (pesanan_id);


--
-- Name: urutan_efek urutan_efek_pesanan_id_versi_tujuan_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek
    ADD CONSTRAINT urutan_efek_pesanan_id_versi_tujuan_key UNIQUE (pesanan_id, versi, tujuan);


--
-- Name: urutan_efek urutan_efek_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek
    ADD CONSTRAINT urutan_efek_pkey PRIMARY KEY (efek);


--
-- Name: urutan_efek_rute urutan_efek_rute_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek_rute
    ADD CONSTRAINT urutan_efek_rute_pkey PRIMARY KEY (status, tujuan);


--
-- Name: urutan_efek_tujuan urutan_efek_tujuan_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek_tujuan
    ADD CONSTRAINT urutan_efek_tujuan_pkey PRIMARY KEY (tujuan);


--
-- Name: urutan_efek_tujuan urutan_efek_tujuan_url_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek_tujuan
    ADD CONSTRAINT urutan_efek_tujuan_url_key UNIQUE (url);


--
-- Name: urutan_epoch urutan_epoch_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_epoch
    ADD CONSTRAINT urutan_epoch_pkey PRIMARY KEY (epoch);


--
-- Name: urutan_jendela urutan_jendela_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_jendela
    ADD CONSTRAINT urutan_jendela_pkey PRIMARY KEY (jendela);


--
-- Name: urutan_parkir urutan_parkir_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_parkir
    ADD CONSTRAINT urutan_parkir_pkey PRIMARY KEY (seq);


--
-- Name: urutan_ring_berubah urutan_ring_berubah_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_ring_berubah
    ADD CONSTRAINT urutan_ring_berubah_pkey PRIMARY KEY (satu);


--
-- Name: urutan_ring urutan_ring_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_ring
    ADD CONSTRAINT urutan_ring_pkey PRIMARY KEY (versi);


--
-- Name: urutan_shard urutan_shard_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_shard
    ADD CONSTRAINT urutan_shard_pkey PRIMARY KEY (shard);


--
-- Name: outbox_unroutable_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_unroutable_idx ON public.outbox USING btree (id) WHERE ((unroutable_at IS NOT NULL) AND (dikirim_pada IS NULL));


--
-- Name: outbox_unsent_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_unsent_idx ON public.outbox USING btree (id) WHERE (dikirim_pada IS NULL);


--
-- Name: pesan_diproses_diproses_pada_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX pesan_diproses_diproses_pada_idx ON public.pesan_diproses USING btree (diproses_pada);


--
-- Name: urutan_dead_letter_at_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_dead_letter_at_idx ON public.urutan_dead_letter USING btree (dead_lettered_at);


--
-- Name: urutan_dead_letter_message_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_dead_letter_message_idx ON public.urutan_dead_letter USING btree (message_id);


--
-- Name: urutan_dead_letter_pesanan_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_dead_letter_pesanan_idx ON public.urutan_dead_letter USING btree (pesanan_id);


--
-- Name: urutan_dead_letter_reason_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_dead_letter_reason_idx ON public.urutan_dead_letter USING btree (reason);


--
-- Name: urutan_dead_letter_resolved_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_dead_letter_resolved_idx ON public.urutan_dead_letter USING btree (resolved_at) WHERE (resolved_at IS NOT NULL);


--
-- Name: urutan_dead_letter_unresolved_key; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX urutan_dead_letter_unresolved_key ON public.urutan_dead_letter USING btree (delivery_key) WHERE (resolved_at IS NULL);


--
-- Name: urutan_dead_letter_unresolved_recorded_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_dead_letter_unresolved_recorded_idx ON public.urutan_dead_letter USING btree (recorded_at) WHERE (resolved_at IS NULL);


--
-- Name: urutan_dikembalikan_pesanan_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_dikembalikan_pesanan_idx ON public.urutan_dikembalikan USING btree (pesanan_id, versi);


--
-- Name: urutan_efek_kepala_siap_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_kepala_siap_idx ON public.urutan_efek_kepala USING btree (siap_pada);


--
-- Name: urutan_efek_menunggu_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_menunggu_idx ON public.urutan_efek USING btree (efek) WHERE (keadaan = 'menunggu'::text);


--
-- Name: urutan_efek_pesanan_menunggu_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_pesanan_menunggu_idx ON public.urutan_efek USING btree (pesanan_id, versi, tujuan) WHERE (keadaan = 'menunggu'::text);


--
-- Name: urutan_efek_selesai_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_selesai_idx ON public.urutan_efek USING btree (selesai_pada) WHERE (keadaan = 'terkirim'::text);


--
-- Name: urutan_jendela_terbuka_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_jendela_terbuka_idx ON public.urutan_jendela USING btree (epoch) WHERE (ditutup_pada IS NULL);


--
-- Name: urutan_parkir_pesanan_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_parkir_pesanan_idx ON public.urutan_parkir USING btree (pesanan_id, seq);


--
-- Name: urutan_parkir_shard_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_parkir_shard_idx ON public.urutan_parkir USING btree (shard, epoch);


--
-- Name: urutan_dead_letter urutan_dikembalikan_mati; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER urutan_dikembalikan_mati AFTER INSERT ON public.urutan_dead_letter FOR EACH ROW WHEN ((new.message_id IS NOT NULL)) EXECUTE FUNCTION public.urutan_dikembalikan_mati();


--
-- Name: pesanan_riwayat urutan_efek_catat; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER urutan_efek_catat AFTER INSERT ON public.pesanan_riwayat FOR EACH ROW EXECUTE FUNCTION public.urutan_efek_catat();


--
-- Name: urutan_efek urutan_efek_kepala_baru; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER urutan_efek_kepala_baru AFTER INSERT ON public.urutan_efek REFERENCING NEW TABLE AS baru FOR EACH STATEMENT EXECUTE FUNCTION public.urutan_efek_kepala_baru();


--
-- Name: urutan_efek urutan_efek_kepala_lagi; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER urutan_efek_kepala_lagi AFTER UPDATE OF keadaan ON public.urutan_efek FOR EACH ROW WHEN (((old.keadaan <> 'menunggu'::text) AND (new.keadaan = 'menunggu'::text))) EXECUTE FUNCTION public.urutan_efek_kepala_lagi();


--
-- Name: urutan_efek_rute urutan_efek_rute_tujuan_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek_rute
    ADD CONSTRAINT urutan_efek_rute_tujuan_fkey FOREIGN KEY (tujuan) REFERENCES public.urutan_efek_tujuan(tujuan);


--
-- Name: urutan_efek urutan_efek_tujuan_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek
    ADD CONSTRAINT urutan_efek_tujuan_fkey FOREIGN KEY (tujuan) REFERENCES public.urutan_efek_tujuan(tujuan);


--
-- PostgreSQL database dump complete
--


