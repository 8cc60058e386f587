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
-- Name: urutan_alasan_ulang(text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_alasan_ulang(p_state text) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE p_state
        WHEN 'URTRY' THEN 'handler_retry'
        WHEN 'URPNC' THEN 'panic'
        WHEN '40001' THEN 'serialization'
        WHEN '40P01' THEN 'deadlock'
        WHEN '55P03' THEN 'lock_timeout'
        WHEN '57014' THEN 'statement_timeout'
    END
$$;


--
-- Name: FUNCTION urutan_alasan_ulang(p_state text); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_alasan_ulang(p_state text) IS 'The retry reason of an SQLSTATE that sets one message aside (handler_retry, serialization, deadlock, lock_timeout, statement_timeout); NULL for any other.';


--
-- Name: urutan_awal_id_pangkas(text, interval, integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_awal_id_pangkas(p_tabel text, p_simpan interval, p_batas integer) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
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


--
-- Name: FUNCTION urutan_awal_id_pangkas(p_tabel text, p_simpan interval, p_batas integer); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_awal_id_pangkas(p_tabel text, p_simpan interval, p_batas integer) IS 'Trims (pangkas) up to p_batas settled rows older than p_simpan from the default partition of outbox or urutan_efek (rows from before partitioning). SECURITY DEFINER.';


--
-- Name: urutan_awal_pangkas(text, interval, integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_awal_pangkas(p_tabel text, p_simpan interval, p_batas integer) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
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


--
-- Name: FUNCTION urutan_awal_pangkas(p_tabel text, p_simpan interval, p_batas integer); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_awal_pangkas(p_tabel text, p_simpan interval, p_batas integer) IS 'Trims (pangkas) up to p_batas rows older than p_simpan from the default partition of pesan_diproses or pesanan_riwayat (rows from before partitioning). SECURITY DEFINER.';


--
-- Name: urutan_celah_dilewati(text, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_celah_dilewati(p_id text, p_diparkir timestamp with time zone) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT EXISTS (SELECT 1 FROM urutan_lewati l
                   WHERE l.pesanan_id = p_id AND l.alasan IN ('gap', 'refused')
                     AND l.dilewati_pada >= p_diparkir)
$$;


--
-- Name: FUNCTION urutan_celah_dilewati(p_id text, p_diparkir timestamp with time zone); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_celah_dilewati(p_id text, p_diparkir timestamp with time zone) IS 'True when an operator released a hold of the order (a missing or refused version skipped) after the given parking time (`urutan hold release`): that parked version may go past the gap.';


--
-- Name: urutan_celah_penuh(integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_celah_penuh(p_shard integer) RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    v_maks BIGINT := coalesce(nullif(current_setting('urutan.gap_max', true), ''), '100000')::bigint;
BEGIN
    RETURN (SELECT count(*) FROM (SELECT 1 FROM urutan_parkir u WHERE u.shard = p_shard
                                  LIMIT v_maks) s) >= v_maks;
END
$$;


--
-- Name: FUNCTION urutan_celah_penuh(p_shard integer); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_celah_penuh(p_shard integer) IS 'Is the shard full (penuh) of parked versions: at least urutan.gap_max (GAP_WAITING_MAX) rows in urutan_parkir? A version that would wait for a gap is then dead-lettered as gap_limit.';


--
-- Name: urutan_celah_tunggu(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_celah_tunggu() RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(current_setting('urutan.gap', true), '') = 'wait'
$$;


--
-- Name: FUNCTION urutan_celah_tunggu(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_celah_tunggu() IS 'True when this session waits for missing versions (celah: gap; GAP_POLICY=wait, the session option urutan.gap).';


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
-- Name: FUNCTION urutan_dikembalikan_mati(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_dikembalikan_mati() IS 'Trigger on urutan_dead_letter: a dead-lettered message does not come back, so its order stops waiting for it (mati: dead).';


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
-- Name: FUNCTION urutan_efek_aktif(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_efek_aktif() IS 'Are effects configured (any route in force)? SECURITY DEFINER: the worker''s role needs no rights on the effect tables.';


--
-- Name: urutan_efek_catat_pernyataan(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_efek_catat_pernyataan() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_salah RECORD;  -- a new history row whose stored state is another version's
BEGIN
    IF NOT EXISTS (SELECT 1 FROM urutan_efek_rute) THEN
        RETURN NULL;
    END IF;
    SELECT b.pesanan_id, b.versi, p.versi AS tersimpan INTO v_salah
    FROM baru b LEFT JOIN pesanan p ON p.id = b.pesanan_id
    WHERE p.versi IS DISTINCT FROM b.versi
      AND EXISTS (SELECT 1 FROM urutan_efek_rute r WHERE r.status IN (b.status, '*'))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'urutan: the effect of % version % cannot see its data (stored version %)',
            v_salah.pesanan_id, v_salah.versi, v_salah.tersimpan;
    END IF;
    INSERT INTO urutan_efek (pesanan_id, versi, tujuan, message_id, isi, traceparent)
    SELECT e.pesanan_id, e.versi, e.tujuan, e.message_id, e.isi,
           coalesce(urutan_traceparent_applied(e.pesanan_id, e.message_id),
                    urutan_traceparent_applied(e.message_id),
                    (SELECT u.traceparent FROM urutan_parkir u
                     WHERE u.pesanan_id = e.pesanan_id AND u.message_id = e.message_id
                       AND u.traceparent IS NOT NULL
                     LIMIT 1))
    FROM (SELECT DISTINCT ON (b.seq, r.tujuan) b.seq, b.pesanan_id, b.versi, r.tujuan, b.message_id,
                 jsonb_build_object('id', b.pesanan_id, 'status', b.status, 'versi', b.versi)
                 || CASE WHEN p.data IS NULL THEN '{}'::jsonb
                         ELSE jsonb_build_object('data', p.data) END AS isi
          FROM baru b
          JOIN urutan_efek_rute r ON r.status IN (b.status, '*')
          LEFT JOIN pesanan p ON p.id = b.pesanan_id
          ORDER BY b.seq, r.tujuan) e
    ORDER BY e.seq, e.tujuan
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;


--
-- Name: FUNCTION urutan_efek_catat_pernyataan(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_efek_catat_pernyataan() IS 'Statement trigger on pesanan_riwayat (catat: record; pernyataan: statement): records the effects of the statement''s new history rows (transition table baru), one per matching endpoint, with the state each version wrote and the apply span''s traceparent, looked up by (order, message id) (the parked row''s, for a version applied later from urutan_parkir). One call per statement: with no route it reads urutan_efek_rute once. SECURITY DEFINER.';


--
-- Name: urutan_efek_hasil(bigint, integer, text, integer, text, double precision); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_efek_hasil(p_efek bigint, p_percobaan integer, p_keadaan text, p_kode integer, p_jawaban text, p_setelah double precision) RETURNS boolean
    LANGUAGE sql
    AS $$
    SELECT urutan_efek_hasil(p_efek, p_percobaan, p_keadaan, p_kode, p_jawaban, p_setelah,
                             false) <> 'lost'
$$;


--
-- Name: FUNCTION urutan_efek_hasil(p_efek bigint, p_percobaan integer, p_keadaan text, p_kode integer, p_jawaban text, p_setelah double precision); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_efek_hasil(p_efek bigint, p_percobaan integer, p_keadaan text, p_kode integer, p_jawaban text, p_setelah double precision) IS 'The result of the previous version''s dispatchers (rolling upgrades): as the 7-argument one without holds; false if the claim was lost.';


--
-- Name: urutan_efek_hasil(bigint, integer, text, integer, text, double precision, boolean); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_efek_hasil(p_efek bigint, p_percobaan integer, p_keadaan text, p_kode integer, p_jawaban text, p_setelah double precision, p_tahan boolean) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_order   TEXT;
    v_ditahan BOOLEAN;
BEGIN
    SELECT e.pesanan_id INTO v_order FROM urutan_efek e WHERE e.efek = p_efek;
    IF NOT FOUND THEN
        RETURN 'lost';
    END IF;
    INSERT INTO urutan_efek_kepala AS k (pesanan_id, siap_pada) VALUES (v_order, now())
    ON CONFLICT (pesanan_id) DO UPDATE SET siap_pada = k.siap_pada WHERE false;
    v_ditahan := EXISTS (SELECT 1 FROM urutan_efek d
                         WHERE d.pesanan_id = v_order AND d.ditahan_sejak IS NOT NULL
                           AND d.keadaan IN ('gagal', 'menunggu'));
    UPDATE urutan_efek e
    SET keadaan = p_keadaan, kode = p_kode, jawaban = p_jawaban,
        sewa_sampai = NULL, sewa_oleh = NULL,
        coba_pada = now() + make_interval(secs => p_setelah),
        selesai_pada = CASE WHEN p_keadaan = 'menunggu' THEN NULL ELSE now() END,
        ditahan_sejak = CASE WHEN p_keadaan = 'menunggu' THEN e.ditahan_sejak
                             WHEN p_keadaan = 'gagal' AND p_tahan
                                 THEN coalesce(e.ditahan_sejak, now())
                        END
    WHERE e.efek = p_efek AND e.percobaan = p_percobaan AND e.keadaan = 'menunggu';
    IF NOT FOUND THEN
        RETURN 'lost';
    END IF;
    UPDATE urutan_efek_kepala k
    SET siap_pada = now() + make_interval(secs => p_setelah)
    WHERE k.pesanan_id = v_order;
    IF p_keadaan = 'gagal' AND p_tahan AND NOT v_ditahan THEN
        RETURN 'held';
    END IF;
    RETURN 'recorded';
END
$$;


--
-- Name: FUNCTION urutan_efek_hasil(p_efek bigint, p_percobaan integer, p_keadaan text, p_kode integer, p_jawaban text, p_setelah double precision, p_tahan boolean); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_efek_hasil(p_efek bigint, p_percobaan integer, p_keadaan text, p_kode integer, p_jawaban text, p_setelah double precision, p_tahan boolean) IS 'Records an attempt''s result (hasil) under its claim: sent, retry later or dead-lettered; with p_tahan a dead letter holds the order''s later effects. Returns lost, recorded or held (a new hold).';


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
-- Name: FUNCTION urutan_efek_kepala_baru(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_efek_kepala_baru() IS 'Statement trigger on urutan_efek: new pending effects put their orders on the schedule. SECURITY DEFINER.';


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
-- Name: FUNCTION urutan_efek_kepala_lagi(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_efek_kepala_lagi() IS 'Row trigger on urutan_efek: an effect pending again (replayed) puts its order back on the schedule, due now. SECURITY DEFINER.';


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
    v_versi  BIGINT;
    v_tujuan INT;
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
            SELECT e.efek, e.versi, e.tujuan, greatest(e.coba_pada, e.sewa_sampai)
            INTO v_head, v_versi, v_tujuan, v_due
            FROM urutan_efek e
            WHERE e.pesanan_id = v_order AND e.keadaan = 'menunggu'
            ORDER BY e.versi, e.tujuan
            LIMIT 1;
            IF NOT FOUND OR EXISTS (
                SELECT 1 FROM urutan_efek d
                WHERE d.pesanan_id = v_order AND d.ditahan_sejak IS NOT NULL
                  AND d.keadaan = 'gagal' AND (d.versi, d.tujuan) < (v_versi, v_tujuan)) THEN
                -- Nothing pending, or held: out of the schedule.
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
-- Name: FUNCTION urutan_efek_klaim(p_batas integer, p_sewa double precision, p_oleh text); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_efek_klaim(p_batas integer, p_sewa double precision, p_oleh text) IS 'The dispatcher''s claim (klaim): leases up to p_batas due effects, the first pending one of each due order not held by a dead-lettered effect, for p_sewa seconds to p_oleh, from the schedule (urutan_efek_kepala).';


--
-- Name: urutan_efek_lepaskan(text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_efek_lepaskan(p_id text) RETURNS TABLE(efek bigint, versi bigint, message_id text, galat text, ditahan_sejak timestamp with time zone, menunggu bigint)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    r RECORD;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM urutan_efek e
                   WHERE e.pesanan_id = p_id AND e.ditahan_sejak IS NOT NULL
                     AND e.keadaan = 'gagal') THEN
        RETURN;
    END IF;
    -- The order's schedule row is its lock (as for a claim or a result),
    -- and due now: its next effect may go.
    INSERT INTO urutan_efek_kepala AS k (pesanan_id, siap_pada) VALUES (p_id, now())
    ON CONFLICT (pesanan_id) DO UPDATE SET siap_pada = least(k.siap_pada, now());
    FOR r IN SELECT e.efek, e.versi, e.message_id, e.kode, e.jawaban, e.ditahan_sejak
             FROM urutan_efek e
             WHERE e.pesanan_id = p_id AND e.ditahan_sejak IS NOT NULL AND e.keadaan = 'gagal'
             ORDER BY e.versi, e.tujuan
             FOR UPDATE
    LOOP
        UPDATE urutan_efek e SET ditahan_sejak = NULL WHERE e.efek = r.efek;
        efek := r.efek;
        versi := r.versi;
        message_id := r.message_id;
        ditahan_sejak := r.ditahan_sejak;
        galat := format('effect %s: %s', r.efek,
                        CASE WHEN r.kode IS NULL THEN coalesce(r.jawaban, 'no answer')
                             ELSE format('HTTP %s: %s', r.kode, coalesce(r.jawaban, '')) END);
        INSERT INTO urutan_lewati (pesanan_id, versi, message_id, alasan, galat, ditahan_sejak)
        VALUES (p_id, r.versi, r.message_id, 'effect', galat, r.ditahan_sejak);
        menunggu := (SELECT count(*) FROM urutan_efek w
                     WHERE w.pesanan_id = p_id AND w.keadaan = 'menunggu');
        RETURN NEXT;
    END LOOP;
END
$$;


--
-- Name: FUNCTION urutan_efek_lepaskan(p_id text); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_efek_lepaskan(p_id text) IS 'Ends an order''s effect hold without its dead-lettered effect (lepaskan: let go; `urutan hold release --effects`): the effect stays dead-lettered, the skip is recorded in urutan_lewati (alasan effect), the later effects go on in order.';


--
-- Name: urutan_enqueue(text, text, bigint, jsonb, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_enqueue(id text, status text, versi bigint, data jsonb DEFAULT NULL::jsonb, routing_key text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'public', 'pg_temp'
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


--
-- Name: FUNCTION urutan_enqueue(id text, status text, versi bigint, data jsonb, routing_key text); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_enqueue(id text, status text, versi bigint, data jsonb, routing_key text) IS 'Enqueues one event in the caller''s transaction (contract section 4): checks it against the contract (22023 otherwise), inserts the outbox row with the contract body as payload and routing key <prefix>.<status> unless given, NOTIFY on its pipeline''s channel (urutan_saluran_outbox()) at commit; returns the outbox id (the message id).';


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
-- Name: FUNCTION urutan_epoch_pangkas(p_simpan integer); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_epoch_pangkas(p_simpan integer) IS 'Deletes the oldest epochs, keeping the newest p_simpan and every epoch an active shard has not passed; returns the rows deleted. SECURITY DEFINER: the worker and relay may insert epochs, not delete them.';


--
-- Name: urutan_epoch_selesai(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_epoch_selesai() RETURNS bigint
    LANGUAGE sql STABLE
    AS $$
    SELECT min(epoch) FROM urutan_shard WHERE aktif
$$;


--
-- Name: FUNCTION urutan_epoch_selesai(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_epoch_selesai() IS 'The highest epoch every active shard has passed (NULL: no shard registered).';


--
-- Name: urutan_jeda(integer, double precision, double precision); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_jeda(p_percobaan integer, p_min double precision, p_max double precision) RETURNS interval
    LANGUAGE sql
    AS $$
    SELECT make_interval(secs => greatest(p_min, least(p_max,
        least(p_max, p_min * 2 ^ least(greatest(p_percobaan - 1, 0), 40)) * (0.75 + random() * 0.5))))
$$;


--
-- Name: FUNCTION urutan_jeda(p_percobaan integer, p_min double precision, p_max double precision); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_jeda(p_percobaan integer, p_min double precision, p_max double precision) IS 'The wait (jeda) before the next attempt of a set-aside message: RETRY_BACKOFF_MIN x 2^(attempts - 1), capped at RETRY_BACKOFF_MAX, jittered.';


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
-- Name: FUNCTION urutan_jendela_terbuka(p_posisi bigint); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_jendela_terbuka(p_posisi bigint) IS 'Is a ring change not yet behind a message at position p_posisi? True while a window''s epoch is not open, or is above p_posisi.';


--
-- Name: urutan_klaim_lama(text, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_klaim_lama(p_message_id text, p_id text) RETURNS text
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: FUNCTION urutan_klaim_lama(p_message_id text, p_id text); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_klaim_lama(p_message_id text, p_id text) IS 'Dedup across day partitions, per (order, message id): was a message just claimed (klaim) claimed before (lama: earlier) for its order on another day (or recorded before orders were, pesanan_id ''''), or parked for its order? NULL if not, else duplicate (withdrawing this transaction''s claim).';


--
-- Name: urutan_lepas(integer, integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_lepas(p_shard integer, p_batas integer) RETURNS TABLE(message_id text, hasil text, tunggu double precision, pertama boolean)
    LANGUAGE sql
    AS $$
    SELECT l.message_id, l.hasil, l.tunggu, l.pertama
    FROM urutan_lepas(p_shard, p_batas, 1, 300, 1000000, true) l
    WHERE l.hasil IN ('applied', 'stale')
$$;


--
-- Name: FUNCTION urutan_lepas(p_shard integer, p_batas integer); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_lepas(p_shard integer, p_batas integer) IS 'The release of the previous version''s workers (rolling upgrades): applied and stale ones only.';


--
-- Name: urutan_lepas(integer, integer, double precision, double precision, integer, boolean); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_lepas(p_shard integer, p_batas integer, p_min double precision, p_max double precision, p_maks integer, p_tahan boolean) RETURNS TABLE(message_id text, hasil text, tunggu double precision, pertama boolean, alasan text, galat text, pesan jsonb)
    LANGUAGE sql
    AS $$
    SELECT l.message_id, l.hasil, l.tunggu, l.pertama, l.alasan, l.galat, l.pesan
    FROM urutan_lepas(p_shard, p_batas, p_min, p_max, p_maks, p_tahan, false) l
$$;


--
-- Name: FUNCTION urutan_lepas(p_shard integer, p_batas integer, p_min double precision, p_max double precision, p_maks integer, p_tahan boolean); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_lepas(p_shard integer, p_batas integer, p_min double precision, p_max double precision, p_maks integer, p_tahan boolean) IS 'urutan_lepas for every version that may go (the form without p_satu).';


--
-- Name: urutan_lepas(integer, integer, double precision, double precision, integer, boolean, boolean); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_lepas(p_shard integer, p_batas integer, p_min double precision, p_max double precision, p_maks integer, p_tahan boolean, p_satu boolean) RETURNS TABLE(message_id text, hasil text, tunggu double precision, pertama boolean, alasan text, galat text, pesan jsonb, pesanan_id text)
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
    IF NOT v_celah THEN
        UPDATE urutan_parkir u SET celah = false WHERE u.celah AND u.shard = p_shard;
    END IF;
    FOR v_id IN
        SELECT DISTINCT u.pesanan_id FROM urutan_parkir u LEFT JOIN pesanan p ON p.id = u.pesanan_id
        WHERE u.shard = p_shard AND NOT u.celah
          AND ((v_bebas AND u.epoch <= v_selesai
                AND NOT urutan_menunggu_kembali(u.pesanan_id, u.versi, p.versi)
                AND (NOT v_celah OR urutan_celah_dilewati(u.pesanan_id, u.diparkir_pada)))
               OR u.versi <= coalesce(p.versi, 0) + 1)
          -- A held order waits; only the message holding it (replayed, then
          -- set aside after a transient failure) may be tried, or, for a
          -- gap hold, the missing version itself (set aside after the hold).
          AND NOT EXISTS (SELECT 1 FROM urutan_tahan t WHERE t.pesanan_id = u.pesanan_id
                                                        AND t.message_id IS DISTINCT FROM u.message_id
                                                        AND NOT (t.alasan = 'gap'
                                                                 AND u.versi = coalesce(p.versi, 0) + 1))
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
                              WHERE t.pesanan_id = v_id AND t.message_id IS DISTINCT FROM r.message_id
                                AND NOT (t.alasan = 'gap' AND r.versi = coalesce(v_versi, 0) + 1));
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
            -- The message holding its order is through: the hold ends; so
            -- does a gap hold once the missing version is applied.
            DELETE FROM urutan_tahan t
            WHERE t.pesanan_id = v_id
              AND (t.message_id = r.message_id
                   OR (t.alasan = 'gap' AND hasil = 'applied'
                       AND r.versi = coalesce(v_versi, 0) + 1));
            IF hasil = 'applied' THEN
                v_versi := r.versi;
            END IF;
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


--
-- Name: FUNCTION urutan_lepas(p_shard integer, p_batas integer, p_min double precision, p_max double precision, p_maks integer, p_tahan boolean, p_satu boolean); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_lepas(p_shard integer, p_batas integer, p_min double precision, p_max double precision, p_maks integer, p_tahan boolean, p_satu boolean) IS 'Releases (lepas) the parked and due set-aside messages of a shard, each version in a subtransaction: applied, stale, retry (set aside again) or refused (out of the sequence; the order held if p_tahan); with p_satu, one version per call. Each row names its message and its order (pesanan_id). Reads only the rows not waiting for a gap (urutan_parkir.celah), through urutan_parkir_lepas_idx.';


--
-- Name: urutan_lepas_gagal(text, text, text, text, double precision, double precision, integer, boolean); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_lepas_gagal(p_message_id text, p_id text, p_state text, p_teks text, p_min double precision, p_max double precision, p_maks integer, p_tahan boolean) RETURNS TABLE(hasil text, alasan text, galat text, pesan jsonb)
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


--
-- Name: FUNCTION urutan_lepas_gagal(p_message_id text, p_id text, p_state text, p_teks text, p_min double precision, p_max double precision, p_maks integer, p_tahan boolean); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_lepas_gagal(p_message_id text, p_id text, p_state text, p_teks text, p_min double precision, p_max double precision, p_maks integer, p_tahan boolean) IS 'Records the failure (gagal) of a parked message tried by the release step: set aside again (retry) or refused (out of the sequence, its claim for its order withdrawn, its order held with p_tahan); no row for a failure that is the database''s own.';


--
-- Name: urutan_lepaskan(text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_lepaskan(p_id text) RETURNS TABLE(alasan text, message_id text, versi bigint, menunggu bigint)
    LANGUAGE plpgsql
    AS $$
DECLARE
    t RECORD;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_id, 7261));
    DELETE FROM urutan_tahan h WHERE h.pesanan_id = p_id RETURNING h.* INTO t;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO urutan_lewati (pesanan_id, versi, message_id, alasan, galat, ditahan_sejak)
    VALUES (p_id, t.versi, t.message_id, t.alasan, t.galat, t.sejak);
    alasan := t.alasan;
    message_id := t.message_id;
    versi := t.versi;
    menunggu := (SELECT count(*) FROM urutan_parkir u WHERE u.pesanan_id = p_id);
    RETURN NEXT;
END
$$;


--
-- Name: FUNCTION urutan_lepaskan(p_id text); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_lepaskan(p_id text) IS 'Ends the hold of an order without its holding version (lepaskan: let go; `urutan hold release`), recording the skip; its waiting versions are then released by their shard.';


--
-- Name: urutan_lewati_celah(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_lewati_celah() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
BEGIN
    IF NEW.alasan IN ('gap', 'refused') THEN
        UPDATE urutan_parkir u SET celah = false
        WHERE u.celah AND u.pesanan_id = NEW.pesanan_id AND u.diparkir_pada <= NEW.dilewati_pada;
    END IF;
    RETURN NULL;
END
$$;


--
-- Name: FUNCTION urutan_lewati_celah(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_lewati_celah() IS 'Trigger on urutan_lewati: a skipped missing or refused version (`urutan hold release`) lets the order''s versions parked before it go past the gap: they are unmarked, and the release step reads them again. SECURITY DEFINER.';


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
-- Name: FUNCTION urutan_lewati_penanda(p_shard integer, p_epoch bigint); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_lewati_penanda(p_shard integer, p_epoch bigint) IS 'Passes the epoch marker of p_epoch on p_shard if urutan recorded that epoch; false, with the position untouched, for a forged one.';


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
-- Name: FUNCTION urutan_menunggu_kembali(p_id text, p_versi bigint, p_tersimpan bigint); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_menunggu_kembali(p_id text, p_versi bigint, p_tersimpan bigint) IS 'Must version p_versi of order p_id wait for a returned older version? True while one is handed back and not back yet, unless it is no newer than the stored version p_tersimpan.';


--
-- Name: urutan_outbox_sahkan(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_outbox_sahkan() RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_tabel REGCLASS := to_regclass(format('%I.outbox', current_schema()));
    v_sisa  INT := 0;
    r RECORD;
BEGIN
    IF v_tabel IS NULL
       OR NOT pg_has_role((SELECT relowner FROM pg_class WHERE oid = v_tabel), 'USAGE') THEN
        RETURN NULL;
    END IF;
    FOR r IN
        SELECT conname FROM pg_constraint
        WHERE conrelid = v_tabel AND contype = 'c' AND NOT convalidated
          AND conname IN ('outbox_agregat_id_sah', 'outbox_routing_key_sah',
                          'outbox_payload_sah', 'outbox_alasan_sisih_sah')
        ORDER BY conname
    LOOP
        BEGIN
            EXECUTE format('ALTER TABLE %s VALIDATE CONSTRAINT %I', v_tabel, r.conname);
        EXCEPTION WHEN check_violation THEN
            v_sisa := v_sisa + 1;
            RAISE WARNING 'urutan: outbox constraint % stays NOT VALID: a row written before it breaks it (it is enforced for new rows)',
                r.conname
                USING HINT = 'sent rows expire with their partition (OUTBOX_RETENTION); `urutan migrate` validates it again';
        END;
    END LOOP;
    RETURN v_sisa;
END
$$;


--
-- Name: FUNCTION urutan_outbox_sahkan(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_outbox_sahkan() IS 'Validates (sahkan) the outbox CHECK constraints of migration 0038 added NOT VALID, without blocking writes; one an old row breaks stays NOT VALID, with a warning. Returns how many stay NOT VALID, NULL if this role does not own outbox. Called by urutan migrate.';


--
-- Name: urutan_panggil_penangan(regprocedure, jsonb, integer, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_panggil_penangan(p_penangan regprocedure, p_pesan jsonb, p_shard integer, p_versi_lama bigint) RETURNS void
    LANGUAGE plpgsql
    AS $_$
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
$_$;


--
-- Name: FUNCTION urutan_panggil_penangan(p_penangan regprocedure, p_pesan jsonb, p_shard integer, p_versi_lama bigint); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_panggil_penangan(p_penangan regprocedure, p_pesan jsonb, p_shard integer, p_versi_lama bigint) IS 'Calls (panggil) the handler with the contract''s event of an applied version; its transient errors pass as they are, any other is raised as URREF (the handler refused) with its SQLSTATE and message.';


--
-- Name: urutan_parkir_celah(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_parkir_celah() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.celah := urutan_celah_tunggu() AND NEW.jatuh_tempo IS NULL
                 AND NEW.versi > coalesce((SELECT p.versi FROM pesanan p
                                           WHERE p.id = NEW.pesanan_id), 0) + 1;
    RETURN NEW;
END
$$;


--
-- Name: FUNCTION urutan_parkir_celah(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_parkir_celah() IS 'Trigger on urutan_parkir: marks (celah) a version parked above a gap with GAP_POLICY=wait (above its order''s stored version + 1, not set aside): the release step does not read it until its order changes.';


--
-- Name: urutan_parkir_jejak(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_parkir_jejak() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.traceparent := coalesce(NEW.traceparent,
                                urutan_traceparent_applied(NEW.pesanan_id, NEW.message_id),
                                urutan_traceparent_applied(NEW.message_id));
    RETURN NEW;
END
$$;


--
-- Name: FUNCTION urutan_parkir_jejak(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_parkir_jejak() IS 'Trigger on urutan_parkir (jejak: trace): a parked or set-aside version keeps the traceparent the worker listed for its (order, message id) in urutan.apply_traces.';


--
-- Name: urutan_partisi_buang(text, interval); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_partisi_buang(p_tabel text, p_simpan interval) RETURNS TABLE(partisi text, baris bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET lock_timeout TO '1s'
    SET search_path TO 'public', 'pg_temp'
    AS $_$
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
$_$;


--
-- Name: FUNCTION urutan_partisi_buang(p_tabel text, p_simpan interval); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_partisi_buang(p_tabel text, p_simpan interval) IS 'Drops (buang) the day partitions of pesan_diproses or pesanan_riwayat whose whole UTC day is older than p_simpan: expiry without DELETE. Waits at most 1 s for the lock. SECURITY DEFINER.';


--
-- Name: urutan_partisi_buat(text, date); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_partisi_buat(p_tabel text, p_hari date) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
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


--
-- Name: FUNCTION urutan_partisi_buat(p_tabel text, p_hari date); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_partisi_buat(p_tabel text, p_hari date) IS 'Creates (buat) one UTC day''s partition of pesan_diproses (unique on (message_id, pesanan_id)) or pesanan_riwayat with its indexes, unless it exists; true when created. SECURITY DEFINER.';


--
-- Name: urutan_partisi_hapus(text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_partisi_hapus(p_tabel text) RETURNS TABLE(partisi text, baris bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET lock_timeout TO '1s'
    SET search_path TO 'public', 'pg_temp'
    AS $_$
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
$_$;


--
-- Name: FUNCTION urutan_partisi_hapus(p_tabel text); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_partisi_hapus(p_tabel text) IS 'Drops (hapus) the expired partitions of pesan_diproses, pesanan_riwayat, outbox or urutan_efek that urutan_partisi_lepas or urutan_partisi_id_lepas detached (a crash between the two leaves them for the next pass); only tables they marked. SECURITY DEFINER.';


--
-- Name: urutan_partisi_id_buang(text, interval); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_partisi_id_buang(p_tabel text, p_simpan interval) RETURNS TABLE(partisi text, baris bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET lock_timeout TO '1s'
    SET search_path TO 'public', 'pg_temp'
    AS $$
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


--
-- Name: FUNCTION urutan_partisi_id_buang(p_tabel text, p_simpan interval); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_partisi_id_buang(p_tabel text, p_simpan interval) IS 'Drops (buang) the partitions of outbox or urutan_efek whose ids are all handed out, whose newest row is older than p_simpan and that hold no unsent row (outbox) or no pending or dead-lettered effect (urutan_efek), checked under an exclusive lock: expiry without DELETE that never loses work. Waits at most 1 s for a lock. SECURITY DEFINER.';


--
-- Name: urutan_partisi_id_buat(text, bigint, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_partisi_id_buat(p_tabel text, p_dari bigint, p_ke bigint) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
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


--
-- Name: FUNCTION urutan_partisi_id_buat(p_tabel text, p_dari bigint, p_ke bigint); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_partisi_id_buat(p_tabel text, p_dari bigint, p_ke bigint) IS 'Creates (buat) the partition of outbox or urutan_efek holding ids [p_dari, p_ke). SECURITY DEFINER.';


--
-- Name: urutan_partisi_id_daftar(text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_partisi_id_daftar(p_tabel text) RETURNS TABLE(partisi text, dari bigint, ke bigint)
    LANGUAGE sql STABLE
    AS $$
    SELECT c.relname::text,
           substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''?(-?[0-9]+)')::bigint,
           substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''?(-?[0-9]+)')::bigint
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = to_regclass(format('%I.%I', current_schema(), p_tabel))
      AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'
    ORDER BY 2
$$;


--
-- Name: FUNCTION urutan_partisi_id_daftar(p_tabel text); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_partisi_id_daftar(p_tabel text) IS 'Lists (daftar) the id-range partitions of outbox or urutan_efek with their bounds [dari, ke), in id order.';


--
-- Name: urutan_partisi_id_kolom(text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_partisi_id_kolom(p_tabel text, OUT kolom text, OUT urutan text) RETURNS record
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    CASE p_tabel
        WHEN 'outbox' THEN kolom := 'id'; urutan := 'outbox_id_seq';
        WHEN 'urutan_efek' THEN kolom := 'efek'; urutan := 'urutan_efek_efek_seq';
        ELSE RAISE EXCEPTION 'urutan: % is not a table of urutan partitioned by id', p_tabel;
    END CASE;
END
$$;


--
-- Name: FUNCTION urutan_partisi_id_kolom(p_tabel text, OUT kolom text, OUT urutan text); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_partisi_id_kolom(p_tabel text, OUT kolom text, OUT urutan text) IS 'The id column (kolom) and its sequence (urutan) of outbox or urutan_efek, the tables partitioned by id range; raises for any other table.';


--
-- Name: urutan_partisi_id_lepas(text, interval); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_partisi_id_lepas(p_tabel text, p_simpan interval) RETURNS TABLE(partisi text, baris bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET lock_timeout TO '1s'
    SET search_path TO 'public', 'pg_temp'
    AS $$
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


--
-- Name: FUNCTION urutan_partisi_id_lepas(p_tabel text, p_simpan interval); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_partisi_id_lepas(p_tabel text, p_simpan interval) IS 'Detaches (lepas) the partitions of outbox or urutan_efek whose ids are all handed out, whose newest row is older than p_simpan and that hold no unsent row (outbox) or no pending or dead-lettered effect (urutan_efek), checked under an exclusive lock as urutan_partisi_id_buang did, marking each by its comment; urutan_partisi_hapus then drops them in a transaction of its own. Waits at most 1 s for a lock. SECURITY DEFINER.';


--
-- Name: urutan_partisi_id_siapkan(boolean); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_partisi_id_siapkan(p_validasi boolean DEFAULT true) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
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


--
-- Name: FUNCTION urutan_partisi_id_siapkan(p_validasi boolean); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_partisi_id_siapkan(p_validasi boolean) IS 'Prepares (siapkan) the id-range partitions of outbox and urutan_efek: validates the default partition''s bound (unless p_validasi is false: then a table whose bound is not validated is left for later), then creates partitions until about a day of ids lies ahead. Called by urutan migrate, every retention pass and the relay. SECURITY DEFINER.';


--
-- Name: urutan_partisi_lepas(text, interval); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_partisi_lepas(p_tabel text, p_simpan interval) RETURNS TABLE(partisi text, baris bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET lock_timeout TO '1s'
    SET search_path TO 'public', 'pg_temp'
    AS $_$
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
$_$;


--
-- Name: FUNCTION urutan_partisi_lepas(p_tabel text, p_simpan interval); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_partisi_lepas(p_tabel text, p_simpan interval) IS 'Detaches (lepas) the day partitions of pesan_diproses or pesanan_riwayat whose whole UTC day is older than p_simpan, marking each by its comment; urutan_partisi_hapus then drops them in a transaction of its own, so removing their files never holds the parent''s lock. Waits at most 1 s for the lock. SECURITY DEFINER.';


--
-- Name: urutan_partisi_siapkan(integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_partisi_siapkan(p_hari integer DEFAULT 7) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
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


--
-- Name: FUNCTION urutan_partisi_siapkan(p_hari integer); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_partisi_siapkan(p_hari integer) IS 'Prepares (siapkan) the day partitions of pesan_diproses and pesanan_riwayat from today to p_hari days ahead, after validating the default partitions'' bound. Called by urutan migrate and every retention pass. SECURITY DEFINER.';


--
-- Name: urutan_penangan(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_penangan() RETURNS regprocedure
    LANGUAGE plpgsql STABLE
    AS $$
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


--
-- Name: FUNCTION urutan_penangan(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_penangan() IS 'The handler (penangan) named in this session''s urutan.handler setting (HANDLER_FUNCTION), as the function taking one jsonb; NULL when none is set; raises 42883 when the name resolves to no such function.';


--
-- Name: urutan_pesanan_maju(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_pesanan_maju() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE urutan_parkir u SET celah = false
    FROM baru b
    WHERE u.celah AND u.pesanan_id = b.id AND u.versi <= b.versi + 1;
    RETURN NULL;
END
$$;


--
-- Name: FUNCTION urutan_pesanan_maju(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_pesanan_maju() IS 'Statement trigger on pesanan (maju: moves forward): unmarks the parked versions waiting for a gap that the orders'' new stored versions close (versi <= stored + 1), so the release step reads them again.';


--
-- Name: urutan_saluran_outbox(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_saluran_outbox() RETURNS text
    LANGUAGE sql STABLE
    SET search_path TO 'public', 'pg_temp'
    AS $$
    SELECT CASE
        WHEN current_schema() = 'public' THEN 'urutan_outbox'
        WHEN octet_length('urutan_outbox_' || current_schema()) <= 63
            THEN 'urutan_outbox_' || current_schema()
        ELSE 'urutan_outbox_'
             || left(encode(sha256(convert_to(current_schema(), 'UTF8')), 'hex'), 32)
    END
$$;


--
-- Name: FUNCTION urutan_saluran_outbox(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_saluran_outbox() IS 'The NOTIFY channel (saluran) of this schema''s pipeline: urutan_outbox in public, urutan_outbox_<schema> elsewhere (urutan_outbox_ and 32 hex digits of the name''s SHA-256 beyond 63 bytes). urutan_enqueue notifies it; the relay LISTENs on it.';


--
-- Name: urutan_sisihkan(jsonb, integer, text, double precision, double precision); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_sisihkan(p_pesan jsonb, p_shard integer, p_galat text, p_min double precision, p_max double precision) RETURNS text
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


--
-- Name: FUNCTION urutan_sisihkan(p_pesan jsonb, p_shard integer, p_galat text, p_min double precision, p_max double precision); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_sisihkan(p_pesan jsonb, p_shard integer, p_galat text, p_min double precision, p_max double precision) IS 'Sets a message aside (sisihkan) after a transient failure of its own transaction: claimed and parked with a due time; its order''s later versions wait behind it.';


--
-- Name: urutan_sudah_diproses(text, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_sudah_diproses(p_message_id text, p_id text) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT 'duplicate'::text
$$;


--
-- Name: FUNCTION urutan_sudah_diproses(p_message_id text, p_id text); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_sudah_diproses(p_message_id text, p_id text) IS 'What a message id that could not be claimed for order p_id means: duplicate (the claim is unique per (order, message id), so only the same pair conflicts).';


--
-- Name: urutan_tahan_celah(integer, interval); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_tahan_celah(p_shard integer, p_batas interval) RETURNS TABLE(pesanan_id text, versi bigint, menunggu bigint)
    LANGUAGE plpgsql
    AS $$
DECLARE
    r RECORD;
BEGIN
    FOR r IN
        SELECT u.pesanan_id AS id, coalesce(p.versi, 0) + 1 AS hilang, min(u.versi) AS terendah,
               count(*) AS n, min(u.diparkir_pada) AS sejak
        FROM urutan_parkir u LEFT JOIN pesanan p ON p.id = u.pesanan_id
        WHERE u.shard = p_shard
          AND NOT EXISTS (SELECT 1 FROM urutan_tahan t WHERE t.pesanan_id = u.pesanan_id)
        GROUP BY u.pesanan_id, p.versi
        HAVING min(u.versi) > coalesce(p.versi, 0) + 1
           AND min(u.diparkir_pada) < now() - p_batas
        ORDER BY u.pesanan_id
        LIMIT 1000
    LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(r.id, 7261));
        -- Checked again under the order's lock: the missing version may
        -- have been applied meanwhile.
        CONTINUE WHEN coalesce((SELECT p.versi FROM pesanan p WHERE p.id = r.id), 0) + 1 <> r.hilang;
        INSERT INTO urutan_tahan (pesanan_id, alasan, message_id, versi, shard, galat, sejak)
        VALUES (r.id, 'gap', NULL, r.hilang, p_shard,
                format('version %s never arrived (version %s waits since %s)',
                       r.hilang, r.terendah, r.sejak),
                now())
        ON CONFLICT DO NOTHING;
        CONTINUE WHEN NOT FOUND;
        pesanan_id := r.id;
        versi := r.hilang;
        menunggu := r.n;
        RETURN NEXT;
    END LOOP;
END
$$;


--
-- Name: FUNCTION urutan_tahan_celah(p_shard integer, p_batas interval); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_tahan_celah(p_shard integer, p_batas interval) IS 'Holds (reason gap) the orders of a shard whose next version has been missing longer than GAP_TIMEOUT; returns each order held, its missing version and how many versions wait.';


--
-- Name: urutan_tahan_tolak(text, text, bigint, integer, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_tahan_tolak(p_id text, p_message_id text, p_versi bigint, p_shard integer, p_galat text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF p_versi <= coalesce((SELECT versi FROM pesanan WHERE id = p_id), 0) THEN
        RETURN false;
    END IF;
    INSERT INTO urutan_tahan (pesanan_id, alasan, message_id, versi, shard, galat)
    VALUES (p_id, 'refused', p_message_id, p_versi, p_shard, p_galat)
    ON CONFLICT (pesanan_id) DO NOTHING;
    RETURN FOUND;
END
$$;


--
-- Name: FUNCTION urutan_tahan_tolak(p_id text, p_message_id text, p_versi bigint, p_shard integer, p_galat text); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_tahan_tolak(p_id text, p_message_id text, p_versi bigint, p_shard integer, p_galat text) IS 'Holds an order after its version p_versi was refused (tolak: refuse), unless that version is no longer ahead of the stored one; true if a new hold was made.';


--
-- Name: urutan_terapkan(jsonb, integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_terapkan(p_pesan jsonb, p_shard integer) RETURNS text
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
        -- A gap hold has no message: `=` on its NULL id would make v_lewat
        -- NULL, the park condition NULL, and the version be written past the
        -- gap (issue 44's interleaving model and fault soak found it).
        v_lewat := coalesce(v_tahan.message_id = v_message_id, false)
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
        -- A version waiting for a gap only (GAP_POLICY=wait, its order not
        -- held): refused once the shard already keeps urutan.gap_max parked
        -- rows, so what a producer plants stays bounded (issue 43). Its
        -- claim goes with it: a replay is applied, not a duplicate.
        IF NOT v_ditahan AND urutan_celah_tunggu()
           AND urutan_celah_penuh(p_shard) THEN
            DELETE FROM pesan_diproses d
            WHERE d.message_id = v_message_id AND d.pesanan_id = v_id
              AND d.diproses_pada = now();
            RETURN 'gap_limit';
        END IF;
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


--
-- Name: FUNCTION urutan_terapkan(p_pesan jsonb, p_shard integer); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_terapkan(p_pesan jsonb, p_shard integer) IS 'Applies one message (terapkan: apply) in one transaction: dedup claim per order, then parking (a held order, or older versions that may still come; a gap''s waiting version refused as gap_limit once its shard keeps GAP_WAITING_MAX parked rows), else the versioned write; the message holding its order goes through and ends the hold.';


--
-- Name: urutan_terapkan(text, text, text, bigint, jsonb, integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_terapkan(p_message_id text, p_id text, p_status text, p_versi bigint, p_data jsonb, p_shard integer) RETURNS text
    LANGUAGE sql
    AS $$
    SELECT urutan_terapkan(
        jsonb_build_object('message_id', p_message_id, 'id', p_id, 'status', p_status,
                           'versi', p_versi)
        || CASE WHEN p_data IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('data', p_data) END,
        p_shard)
$$;


--
-- Name: FUNCTION urutan_terapkan(p_message_id text, p_id text, p_status text, p_versi bigint, p_data jsonb, p_shard integer); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_terapkan(p_message_id text, p_id text, p_status text, p_versi bigint, p_data jsonb, p_shard integer) IS 'The previous signature, kept for workers of the previous version during a rolling upgrade: builds the event and calls urutan_terapkan(jsonb, int).';


--
-- Name: urutan_terapkan_batch(jsonb, integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_terapkan_batch(p_pesan jsonb, p_shard integer) RETURNS text[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_ids TEXT[] := ARRAY(SELECT e->>'id' FROM jsonb_array_elements(p_pesan) e);
BEGIN
    IF coalesce(current_setting('urutan.handler', true), '') <> ''
       OR coalesce(current_setting('urutan.acara', true), '') = 'on'
       OR urutan_celah_tunggu()
       OR (urutan_efek_aktif()
           AND (SELECT count(DISTINCT id) < count(id) FROM unnest(v_ids) id))
       OR EXISTS (SELECT 1 FROM urutan_dikembalikan WHERE pesanan_id = ANY (v_ids))
       OR EXISTS (SELECT 1 FROM urutan_tahan WHERE pesanan_id = ANY (v_ids)) THEN
        RETURN urutan_terapkan_batch_urut(p_pesan, p_shard);
    END IF;
    RETURN urutan_terapkan_batch_himpun(p_pesan, p_shard);
END
$$;


--
-- Name: FUNCTION urutan_terapkan_batch(p_pesan jsonb, p_shard integer); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_terapkan_batch(p_pesan jsonb, p_shard integer) IS 'Applies one shard''s batch in arrival order with the outcomes each message would have alone: set-based, or message by message when a handler (SQL or Rust) is set, gaps wait, effects need each version''s state, an order has a returned message or is held.';


--
-- Name: urutan_terapkan_batch(text[], text[], text[], bigint[], text[], bigint[], integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_terapkan_batch(p_message_ids text[], p_ids text[], p_statuses text[], p_versis bigint[], p_datas text[], p_markers bigint[], p_shard integer) RETURNS text[]
    LANGUAGE sql
    AS $$
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


--
-- Name: FUNCTION urutan_terapkan_batch(p_message_ids text[], p_ids text[], p_statuses text[], p_versis bigint[], p_datas text[], p_markers bigint[], p_shard integer); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_terapkan_batch(p_message_ids text[], p_ids text[], p_statuses text[], p_versis bigint[], p_datas text[], p_markers bigint[], p_shard integer) IS 'The previous signature (one array per field; a marker where p_markers is not NULL), kept for workers of the previous version during a rolling upgrade: calls urutan_terapkan_batch(jsonb, int).';


--
-- Name: urutan_terapkan_batch_himpun(jsonb, integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_terapkan_batch_himpun(p_pesan jsonb, p_shard integer) RETURNS text[]
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


--
-- Name: FUNCTION urutan_terapkan_batch_himpun(p_pesan jsonb, p_shard integer); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_terapkan_batch_himpun(p_pesan jsonb, p_shard integer) IS 'The set-based body of the batch (himpun: gathered): one dedup claim per (order, message id), one versioned upsert per order (its stored version read by primary key), one history insert, stale arrivals recorded. Hands the batch to the per-message loop when a marker is in it or any message could park.';


--
-- Name: urutan_terapkan_batch_urut(jsonb, integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_terapkan_batch_urut(p_pesan jsonb, p_shard integer) RETURNS text[]
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: FUNCTION urutan_terapkan_batch_urut(p_pesan jsonb, p_shard integer); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_terapkan_batch_urut(p_pesan jsonb, p_shard integer) IS 'The per-message loop of the batch (urut: in sequence), the reference the set-based body must match: urutan_terapkan per event, urutan_lewati_penanda per marker.';


--
-- Name: urutan_traceparent_applied(text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_traceparent_applied(p_message_id text) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT substr(m, p + length(k), 55)
    FROM (SELECT current_setting('urutan.apply_traceparents', true) AS m,
                 E'\n' || p_message_id || E'\t' AS k) s,
         LATERAL (SELECT strpos(s.m, s.k) AS p) q
    WHERE q.p > 0
$$;


--
-- Name: FUNCTION urutan_traceparent_applied(p_message_id text); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_traceparent_applied(p_message_id text) IS 'The traceparent a worker of the previous version listed for a message in urutan.apply_traceparents (lines "\n<message id>\t<traceparent>"), or NULL: read only during a rolling upgrade (the current worker lists them per order, urutan_traceparent_applied(TEXT, TEXT)).';


--
-- Name: urutan_traceparent_applied(text, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_traceparent_applied(p_id text, p_message_id text) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT substr(m, p + length(k), 55)
    FROM (SELECT current_setting('urutan.apply_traces', true) AS m,
                 E'\n' || p_id || E'\t' || p_message_id || E'\t' AS k) s,
         LATERAL (SELECT strpos(s.m, s.k) AS p) q
    WHERE q.p > 0
$$;


--
-- Name: FUNCTION urutan_traceparent_applied(p_id text, p_message_id text); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_traceparent_applied(p_id text, p_message_id text) IS 'The traceparent the worker listed for a message of order p_id in the transaction-local setting urutan.apply_traces (lines "\n<order id>\t<message id>\t<traceparent>"), or NULL.';


--
-- Name: urutan_traceparent_producer(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_traceparent_producer() RETURNS text
    LANGUAGE sql STABLE
    AS $_$
    SELECT v FROM (SELECT current_setting('urutan.traceparent', true) AS v) s
    WHERE v ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
$_$;


--
-- Name: FUNCTION urutan_traceparent_producer(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_traceparent_producer() IS 'Default of outbox.traceparent: the transaction-local setting urutan.traceparent when it is a version-00 W3C traceparent, else NULL (a producer calling urutan_enqueue sets it first to continue its trace).';


--
-- Name: urutan_tulis(jsonb, integer, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.urutan_tulis(p_pesan jsonb, p_shard integer, p_epoch bigint) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_id    TEXT := p_pesan->>'id';
    v_versi BIGINT := (p_pesan->>'versi')::bigint;
    v_penangan regprocedure;
    v_acara BOOLEAN := coalesce(current_setting('urutan.acara', true), '') = 'on';
    v_lama  BIGINT;  -- the stored version before this one (NULL: a new order)
BEGIN
    IF coalesce(current_setting('urutan.handler', true), '') <> '' THEN
        v_penangan := urutan_penangan();
    END IF;
    IF v_penangan IS NOT NULL OR v_acara THEN
        SELECT versi INTO v_lama FROM pesanan WHERE id = v_id;
    END IF;
    INSERT INTO pesanan AS p (id, status, versi, data, epoch)
    VALUES (v_id, p_pesan->>'status', v_versi, p_pesan->'data', p_epoch)
    ON CONFLICT (id) DO UPDATE
        SET status = EXCLUDED.status, versi = EXCLUDED.versi, data = EXCLUDED.data,
            diperbarui_pada = now(), epoch = greatest(p.epoch, EXCLUDED.epoch)
        WHERE p.versi < EXCLUDED.versi;
    IF NOT FOUND THEN
        INSERT INTO urutan_basi (pesanan_id, versi, message_id, shard)
        VALUES (v_id, v_versi, p_pesan->>'message_id', p_shard);
        RETURN 'stale';
    END IF;
    INSERT INTO pesanan_riwayat (pesanan_id, versi, status, message_id, shard)
    VALUES (v_id, v_versi, p_pesan->>'status', p_pesan->>'message_id', p_shard);
    IF v_penangan IS NOT NULL THEN
        PERFORM urutan_panggil_penangan(v_penangan, p_pesan, p_shard, v_lama);
    END IF;
    IF v_acara THEN
        PERFORM set_config('urutan.acara_terakhir', jsonb_build_object(
            'message_id', p_pesan->>'message_id', 'id', v_id,
            'status', p_pesan->>'status', 'versi', v_versi,
            'data', p_pesan->'data', 'previous_versi', v_lama, 'shard', p_shard)::text, true);
    END IF;
    RETURN 'applied';
END
$$;


--
-- Name: FUNCTION urutan_tulis(p_pesan jsonb, p_shard integer, p_epoch bigint); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.urutan_tulis(p_pesan jsonb, p_shard integer, p_epoch bigint) IS 'Writes (tulis) an applied version: the forward-only state, its history row, the HANDLER_FUNCTION call; with the option urutan.acara, the event for a Rust handler in urutan.acara_terakhir. stale when not newer (recorded in urutan_basi).';


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
    unroutable_reason text,
    traceparent text DEFAULT public.urutan_traceparent_producer(),
    alasan_sisih text,
    CONSTRAINT outbox_agregat_id_sah CHECK (((unroutable_at IS NOT NULL) OR (((octet_length(agregat_id) >= 1) AND (octet_length(agregat_id) <= 128)) AND (agregat_id !~ '[\u0001-\u001f\u007f-\u009f\ufffd]'::text)))),
    CONSTRAINT outbox_alasan_sisih_sah CHECK (((alasan_sisih IS NULL) OR (alasan_sisih ~ '^[a-z_]{1,40}$'::text))),
    CONSTRAINT outbox_payload_sah CHECK (((unroutable_at IS NOT NULL) OR COALESCE(((jsonb_typeof(payload) = 'object'::text) AND ((payload -> 'id'::text) = to_jsonb(agregat_id)) AND (jsonb_typeof((payload -> 'status'::text)) = 'string'::text) AND ((char_length((payload ->> 'status'::text)) >= 1) AND (char_length((payload ->> 'status'::text)) <= 64)) AND (jsonb_typeof((payload -> 'versi'::text)) = 'number'::text) AND
CASE
    WHEN ((payload ->> 'versi'::text) ~ '^[0-9]{1,16}$'::text) THEN ((((payload ->> 'versi'::text))::bigint >= 1) AND (((payload ->> 'versi'::text))::bigint <= '9007199254740991'::bigint))
    ELSE false
END), false))),
    CONSTRAINT outbox_routing_key_sah CHECK (((unroutable_at IS NOT NULL) OR ((octet_length(routing_key) >= 1) AND (octet_length(routing_key) <= 255))))
)
PARTITION BY RANGE (id);


--
-- Name: TABLE outbox; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.outbox IS 'Transactional outbox (contract section 4): producers insert rows in their own transaction, `urutan relay` publishes each to the entry exchange (message id = id, header x-pesanan-id = agregat_id) and marks it sent. Partitioned by RANGE (id), about a day of rows per partition (outbox_p<first id>); a partition whose rows are all sent and older than OUTBOX_RETENTION is dropped whole.';


--
-- Name: COLUMN outbox.dikirim_pada; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.outbox.dikirim_pada IS 'When the relay published the row (confirmed by the broker); NULL while unsent. Sent rows are purged after a while.';


--
-- Name: COLUMN outbox.unroutable_at; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.outbox.unroutable_at IS 'When the relay set the row aside instead of publishing it (the name is historical: for any reason, see alasan_sisih and unroutable_reason): not retried, reported by `urutan status` and `urutan explain`, never expired. Fix the row and clear unroutable_at, unroutable_reason and alasan_sisih to retry it.';


--
-- Name: COLUMN outbox.unroutable_reason; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.outbox.unroutable_reason IS 'Why the relay set the row aside, in words (alasan_sisih is the code).';


--
-- Name: COLUMN outbox.traceparent; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.outbox.traceparent IS 'The producer''s W3C trace context (00-<trace id>-<span id>-<flags>), continued by the relay''s publish span; NULL or invalid: a new trace. Defaults to the setting urutan.traceparent.';


--
-- Name: COLUMN outbox.alasan_sisih; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.outbox.alasan_sisih IS 'Why the relay set the row aside (alasan sisih: set-aside reason), a bounded code: unroutable, routing_key_empty, routing_key_too_long, entity_id_too_long, entity_id_invalid, payload_invalid, body_too_large, broker_refused. Set with unroutable_at; NULL while the row is not set aside.';


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
-- Name: outbox_awal; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.outbox_awal (
    id bigint DEFAULT nextval('public.outbox_id_seq'::regclass) NOT NULL,
    agregat_tipe text NOT NULL,
    agregat_id text NOT NULL,
    routing_key text NOT NULL,
    payload jsonb NOT NULL,
    dibuat_pada timestamp with time zone DEFAULT now() NOT NULL,
    dikirim_pada timestamp with time zone,
    unroutable_at timestamp with time zone,
    unroutable_reason text,
    traceparent text DEFAULT public.urutan_traceparent_producer(),
    alasan_sisih text,
    CONSTRAINT outbox_agregat_id_sah CHECK (((unroutable_at IS NOT NULL) OR (((octet_length(agregat_id) >= 1) AND (octet_length(agregat_id) <= 128)) AND (agregat_id !~ '[\u0001-\u001f\u007f-\u009f\ufffd]'::text)))),
    CONSTRAINT outbox_alasan_sisih_sah CHECK (((alasan_sisih IS NULL) OR (alasan_sisih ~ '^[a-z_]{1,40}$'::text))),
    CONSTRAINT outbox_awal_batas CHECK ((id < 1)),
    CONSTRAINT outbox_payload_sah CHECK (((unroutable_at IS NOT NULL) OR COALESCE(((jsonb_typeof(payload) = 'object'::text) AND ((payload -> 'id'::text) = to_jsonb(agregat_id)) AND (jsonb_typeof((payload -> 'status'::text)) = 'string'::text) AND ((char_length((payload ->> 'status'::text)) >= 1) AND (char_length((payload ->> 'status'::text)) <= 64)) AND (jsonb_typeof((payload -> 'versi'::text)) = 'number'::text) AND
CASE
    WHEN ((payload ->> 'versi'::text) ~ '^[0-9]{1,16}$'::text) THEN ((((payload ->> 'versi'::text))::bigint >= 1) AND (((payload ->> 'versi'::text))::bigint <= '9007199254740991'::bigint))
    ELSE false
END), false))),
    CONSTRAINT outbox_routing_key_sah CHECK (((unroutable_at IS NOT NULL) OR ((octet_length(routing_key) >= 1) AND (octet_length(routing_key) <= 255))))
);


--
-- Name: TABLE outbox_awal; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.outbox_awal IS 'The DEFAULT partition of outbox: the rows from before partitioning (and those written until the first range partition existed); sent rows are trimmed in bounded batches (urutan_awal_id_pangkas).';


--
-- Name: COLUMN outbox_awal.dikirim_pada; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.outbox_awal.dikirim_pada IS 'When the relay published the row (confirmed by the broker); NULL while unsent. Sent rows are purged after a while.';


--
-- Name: COLUMN outbox_awal.unroutable_at; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.outbox_awal.unroutable_at IS 'Set by the relay when the broker returned the row as unroutable (its routing key is outside <prefix>.#): set aside, not retried, reported by `urutan status`. Clear it (and unroutable_reason) to retry.';


--
-- Name: COLUMN outbox_awal.traceparent; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.outbox_awal.traceparent IS 'The producer''s W3C trace context (00-<trace id>-<span id>-<flags>), continued by the relay''s publish span; NULL or invalid: a new trace. Defaults to the setting urutan.traceparent.';


--
-- Name: outbox_p1; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.outbox_p1 (
    id bigint DEFAULT nextval('public.outbox_id_seq'::regclass) NOT NULL,
    agregat_tipe text NOT NULL,
    agregat_id text NOT NULL,
    routing_key text NOT NULL,
    payload jsonb NOT NULL,
    dibuat_pada timestamp with time zone DEFAULT now() NOT NULL,
    dikirim_pada timestamp with time zone,
    unroutable_at timestamp with time zone,
    unroutable_reason text,
    traceparent text DEFAULT public.urutan_traceparent_producer(),
    alasan_sisih text,
    CONSTRAINT outbox_agregat_id_sah CHECK (((unroutable_at IS NOT NULL) OR (((octet_length(agregat_id) >= 1) AND (octet_length(agregat_id) <= 128)) AND (agregat_id !~ '[\u0001-\u001f\u007f-\u009f\ufffd]'::text)))),
    CONSTRAINT outbox_alasan_sisih_sah CHECK (((alasan_sisih IS NULL) OR (alasan_sisih ~ '^[a-z_]{1,40}$'::text))),
    CONSTRAINT outbox_payload_sah CHECK (((unroutable_at IS NOT NULL) OR COALESCE(((jsonb_typeof(payload) = 'object'::text) AND ((payload -> 'id'::text) = to_jsonb(agregat_id)) AND (jsonb_typeof((payload -> 'status'::text)) = 'string'::text) AND ((char_length((payload ->> 'status'::text)) >= 1) AND (char_length((payload ->> 'status'::text)) <= 64)) AND (jsonb_typeof((payload -> 'versi'::text)) = 'number'::text) AND
CASE
    WHEN ((payload ->> 'versi'::text) ~ '^[0-9]{1,16}$'::text) THEN ((((payload ->> 'versi'::text))::bigint >= 1) AND (((payload ->> 'versi'::text))::bigint <= '9007199254740991'::bigint))
    ELSE false
END), false))),
    CONSTRAINT outbox_routing_key_sah CHECK (((unroutable_at IS NOT NULL) OR ((octet_length(routing_key) >= 1) AND (octet_length(routing_key) <= 255))))
);


--
-- Name: TABLE outbox_p1; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.outbox_p1 IS 'The outbox rows with ids from 1 to 16777216, a partition of outbox.';


--
-- Name: pesan_diproses; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.pesan_diproses (
    message_id text NOT NULL,
    diproses_pada timestamp with time zone DEFAULT now() NOT NULL,
    pesanan_id text NOT NULL
)
PARTITION BY RANGE (diproses_pada);


--
-- Name: TABLE pesan_diproses; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.pesan_diproses IS 'Deduplication: every message id processed (applied, stale or parked) with the order it was claimed for; the key is the pair (an order''s id, a message id). Partitioned by UTC day of diproses_pada (pesan_diproses_hYYYYMMDD, each UNIQUE on (message_id, pesanan_id)); days older than DEDUP_RETENTION are dropped whole. Dedup holds across days: see urutan_klaim_lama.';


--
-- Name: pesan_diproses_awal; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.pesan_diproses_awal (
    message_id text NOT NULL,
    diproses_pada timestamp with time zone DEFAULT now() NOT NULL,
    pesanan_id text NOT NULL,
    CONSTRAINT pesan_diproses_awal_batas CHECK ((diproses_pada < '<the day after migrating>'::timestamp with time zone))
);


--
-- Name: TABLE pesan_diproses_awal; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.pesan_diproses_awal IS 'The DEFAULT partition of pesan_diproses: the rows from before partitioning and those of the day partitioning began; purged in bounded batches (urutan_awal_pangkas) until empty.';


--
-- Name: COLUMN pesan_diproses_awal.pesanan_id; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.pesan_diproses_awal.pesanan_id IS 'The order that claimed the id: the same id for another order is another message. '''' for rows recorded before orders were recorded (migration 0014): a redelivery of any order that is not newer than its stored version is a duplicate (urutan_klaim_lama).';


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
-- Name: TABLE pesanan; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.pesanan IS 'Each order''s current state (contract section 4): one row per order, only ever moved forward by versi. Written by the apply functions (urutan_tulis and the set-based batch), never by anyone else.';


--
-- Name: COLUMN pesanan.data; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.pesanan.data IS 'The body''s optional "data" member as sent (NULL when absent or null).';


--
-- Name: COLUMN pesanan.epoch; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.pesanan.epoch IS 'The epoch (shard position) of the message that last applied this order: a message of another epoch may have to wait (park) while an older one can still be queued on another shard.';


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
)
PARTITION BY RANGE (diterapkan_pada);


--
-- Name: TABLE pesanan_riwayat; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.pesanan_riwayat IS 'One row per applied version, in apply order (seq). Partitioned by UTC day of diterapkan_pada (pesanan_riwayat_hYYYYMMDD, each UNIQUE on seq and on (pesanan_id, versi)); HISTORY_RETENTION (keep: forever) drops whole days. Its AFTER INSERT trigger records the version''s effects.';


--
-- Name: COLUMN pesanan_riwayat.shard; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.pesanan_riwayat.shard IS 'The shard whose worker applied the version (for a released parked message: the shard it was parked by).';


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
-- Name: pesanan_riwayat_awal; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.pesanan_riwayat_awal (
    seq bigint DEFAULT nextval('public.pesanan_riwayat_seq_seq'::regclass) NOT NULL,
    pesanan_id text NOT NULL,
    versi bigint NOT NULL,
    status text NOT NULL,
    message_id text NOT NULL,
    shard integer NOT NULL,
    diterapkan_pada timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT pesanan_riwayat_awal_batas CHECK ((diterapkan_pada < '<the day after migrating>'::timestamp with time zone))
);


--
-- Name: TABLE pesanan_riwayat_awal; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.pesanan_riwayat_awal IS 'The DEFAULT partition of pesanan_riwayat: the rows from before partitioning and those of the day partitioning began; purged oldest first in bounded batches (urutan_awal_pangkas) under HISTORY_RETENTION.';


--
-- Name: COLUMN pesanan_riwayat_awal.shard; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.pesanan_riwayat_awal.shard IS 'The shard whose worker applied the version (for a released parked message: the shard it was parked by).';


--
-- Name: urutan_audit; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_audit (
    seq bigint NOT NULL,
    pada timestamp with time zone DEFAULT now() NOT NULL,
    oleh text NOT NULL,
    tindakan text NOT NULL,
    pesanan_id text,
    sasaran text NOT NULL,
    hasil text NOT NULL
);


--
-- Name: TABLE urutan_audit; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_audit IS 'Audit (audit) of operator actions taken in the console: when (pada), by whom (oleh: the client address and how it was admitted), the action (tindakan, e.g. hold_release), its order (pesanan_id), target (sasaran) and result (hasil). Shown by the console and urutan explain.';


--
-- Name: urutan_audit_seq_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.urutan_audit_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: urutan_audit_seq_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.urutan_audit_seq_seq OWNED BY public.urutan_audit.seq;


--
-- Name: urutan_basi; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_basi (
    seq bigint NOT NULL,
    pesanan_id text NOT NULL,
    versi bigint NOT NULL,
    message_id text NOT NULL,
    shard integer NOT NULL,
    tiba_pada timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: TABLE urutan_basi; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_basi IS 'Stale arrivals (basi: stale): each message that arrived after a newer version of its order was applied, for `urutan explain`. Rows older than DEDUP_RETENTION are purged.';


--
-- Name: COLUMN urutan_basi.versi; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_basi.versi IS 'The version that arrived stale.';


--
-- Name: COLUMN urutan_basi.tiba_pada; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_basi.tiba_pada IS 'When it arrived (tiba: arrive) and was found stale.';


--
-- Name: urutan_basi_seq_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.urutan_basi_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: urutan_basi_seq_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.urutan_basi_seq_seq OWNED BY public.urutan_basi.seq;


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
-- Name: TABLE urutan_dead_letter; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_dead_letter IS 'Dead-letter records, committed before each reject into the DLQ (or by `urutan dlq` for a message found there without one). Rows with resolved_at NULL are in the DLQ now.';


--
-- Name: COLUMN urutan_dead_letter.delivery_key; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_dead_letter.delivery_key IS 'message_id, or ''sha256:<hex>'' of the message when the id is missing or invalid: one unresolved record per key.';


--
-- Name: COLUMN urutan_dead_letter.shard; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_dead_letter.shard IS 'The shard the delivery came from (-1: unknown, for a record made from the queue).';


--
-- Name: COLUMN urutan_dead_letter.reason; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_dead_letter.reason IS 'The reason label of urutan_dead_letters_total (or, recorded from the queue, the broker''s x-death reason).';


--
-- Name: COLUMN urutan_dead_letter.recorded_by; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_dead_letter.recorded_by IS '''worker'' (before its reject) or ''queue'' (found in the DLQ by `urutan dlq` with no record).';


--
-- Name: COLUMN urutan_dead_letter.recorded_at; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_dead_letter.recorded_at IS 'When this row was written (dead_lettered_at may be a producer''s x-death time): unresolved rows expire after DEAD_LETTER_UNRESOLVED_RETENTION from it.';


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
-- Name: TABLE urutan_dikembalikan; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_dikembalikan IS 'Messages a worker handed back to its queue after a failure, until they come back (applied, stale, duplicate or dead-lettered): a newer version of the order waits for them.';


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
    ditahan_sejak timestamp with time zone,
    traceparent text,
    CONSTRAINT urutan_efek_keadaan_check CHECK ((keadaan = ANY (ARRAY['menunggu'::text, 'terkirim'::text, 'gagal'::text])))
)
PARTITION BY RANGE (efek);


--
-- Name: TABLE urutan_efek; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_efek IS 'Downstream effects: one webhook per applied version and matching endpoint, recorded in the apply transaction. Per order they go out in (versi, tujuan) order, one at a time. Partitioned by RANGE (efek), about a day of rows per partition (urutan_efek_p<first id>, each UNIQUE on (pesanan_id, versi, tujuan)); a partition whose effects are all sent and older than EFFECTS_RETENTION is dropped whole.';


--
-- Name: COLUMN urutan_efek.message_id; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_efek.message_id IS 'The applied message''s id: the webhook-id and Idempotency-Key of the request.';


--
-- Name: COLUMN urutan_efek.isi; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_efek.isi IS 'What is sent: the applied event as the contract''s body (id, status, versi, data).';


--
-- Name: COLUMN urutan_efek.keadaan; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_efek.keadaan IS '''menunggu'' pending, ''terkirim'' sent (a 2xx answer), ''gagal'' dead-lettered (a 4xx other than 408/429, or retries exhausted).';


--
-- Name: COLUMN urutan_efek.percobaan; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_efek.percobaan IS 'Attempts started (counted when claimed, so a crash mid-request counts).';


--
-- Name: COLUMN urutan_efek.sewa_sampai; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_efek.sewa_sampai IS 'The claiming dispatcher (sewa_oleh) holds the effect until then; an expired lease is claimed again, with the same key.';


--
-- Name: COLUMN urutan_efek.ditahan_sejak; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_efek.ditahan_sejak IS 'When this dead-lettered effect began to hold its order''s later effects (ditahan sejak: held since; EFFECTS_ON_DEAD=hold); NULL: it holds nothing. Kept while a replay sends it again; cleared when it is sent, released (`urutan hold release --effects`) or dead-lettered again under skip.';


--
-- Name: COLUMN urutan_efek.traceparent; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_efek.traceparent IS 'The apply span''s W3C traceparent of the version this effect belongs to: its webhook request continues that trace (NULL: a new trace).';


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
-- Name: urutan_efek_awal; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_efek_awal (
    efek bigint DEFAULT nextval('public.urutan_efek_efek_seq'::regclass) NOT NULL,
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
    ditahan_sejak timestamp with time zone,
    traceparent text,
    CONSTRAINT urutan_efek_awal_batas CHECK ((efek < 1)),
    CONSTRAINT urutan_efek_keadaan_check CHECK ((keadaan = ANY (ARRAY['menunggu'::text, 'terkirim'::text, 'gagal'::text])))
);


--
-- Name: TABLE urutan_efek_awal; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_efek_awal IS 'The DEFAULT partition of urutan_efek: the rows from before partitioning (and those written until the first range partition existed); sent effects are trimmed in bounded batches (urutan_awal_id_pangkas).';


--
-- Name: COLUMN urutan_efek_awal.message_id; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_efek_awal.message_id IS 'The applied message''s id: the webhook-id and Idempotency-Key of the request.';


--
-- Name: COLUMN urutan_efek_awal.isi; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_efek_awal.isi IS 'What is sent: the applied event as the contract''s body (id, status, versi, data).';


--
-- Name: COLUMN urutan_efek_awal.keadaan; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_efek_awal.keadaan IS '''menunggu'' pending, ''terkirim'' sent (a 2xx answer), ''gagal'' dead-lettered (a 4xx other than 408/429, or retries exhausted).';


--
-- Name: COLUMN urutan_efek_awal.percobaan; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_efek_awal.percobaan IS 'Attempts started (counted when claimed, so a crash mid-request counts).';


--
-- Name: COLUMN urutan_efek_awal.sewa_sampai; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_efek_awal.sewa_sampai IS 'The claiming dispatcher (sewa_oleh) holds the effect until then; an expired lease is claimed again, with the same key.';


--
-- Name: COLUMN urutan_efek_awal.ditahan_sejak; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_efek_awal.ditahan_sejak IS 'When this dead-lettered effect began to hold its order''s later effects (ditahan sejak: held since; EFFECTS_ON_DEAD=hold); NULL: it holds nothing. Kept while a replay sends it again; cleared when it is sent, released (`urutan hold release --effects`) or dead-lettered again under skip.';


--
-- Name: COLUMN urutan_efek_awal.traceparent; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_efek_awal.traceparent IS 'The apply span''s W3C traceparent of the version this effect belongs to: its webhook request continues that trace (NULL: a new trace).';


--
-- Name: urutan_efek_kepala; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_efek_kepala (
    pesanan_id text NOT NULL,
    siap_pada timestamp with time zone NOT NULL
);


--
-- Name: TABLE urutan_efek_kepala; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_efek_kepala IS 'The dispatcher''s schedule: one row per order with a pending effect, also the order''s lock for scheduling (claims, results and inserts take it).';


--
-- Name: COLUMN urutan_efek_kepala.siap_pada; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_efek_kepala.siap_pada IS 'No later than the moment the order''s first pending effect may go (a claim that finds it not due moves it to the due time).';


--
-- Name: urutan_efek_p1; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_efek_p1 (
    efek bigint DEFAULT nextval('public.urutan_efek_efek_seq'::regclass) NOT NULL,
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
    ditahan_sejak timestamp with time zone,
    traceparent text,
    CONSTRAINT urutan_efek_keadaan_check CHECK ((keadaan = ANY (ARRAY['menunggu'::text, 'terkirim'::text, 'gagal'::text])))
);


--
-- Name: TABLE urutan_efek_p1; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_efek_p1 IS 'The urutan_efek rows with ids from 1 to 16777216, a partition of urutan_efek.';


--
-- Name: urutan_efek_rute; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_efek_rute (
    status text NOT NULL,
    tujuan integer NOT NULL
);


--
-- Name: TABLE urutan_efek_rute; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_efek_rute IS 'The effect routes in force (status, ''*'' for every status, to endpoint), written by the `urutan effects` started last.';


--
-- Name: urutan_efek_tujuan; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_efek_tujuan (
    tujuan integer NOT NULL,
    url text NOT NULL
);


--
-- Name: TABLE urutan_efek_tujuan; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_efek_tujuan IS 'Every effect endpoint ever configured (an effect keeps pointing at its own).';


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
-- Name: TABLE urutan_epoch; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_epoch IS 'Every epoch opened (a point where the hash ring may have changed: a (re)connect, a broker restart, a resharding), each announced by a marker in every shard queue. Old rows are pruned by urutan_epoch_pangkas.';


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
-- Name: TABLE urutan_jendela; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_jendela IS 'Windows: ring changes the epoch markers may not separate (a resharding, a broker restart). While one is open for a message''s position, a message that is not its order''s next version parks.';


--
-- Name: COLUMN urutan_jendela.epoch; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_jendela.epoch IS 'The epoch opened after the ring change (NULL: not open yet); the window ends once every shard has passed it.';


--
-- Name: COLUMN urutan_jendela.ditutup_pada; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_jendela.ditutup_pada IS 'Bookkeeping: set by urutan_lepas once every shard passed the epoch (such a window is closed whether or not this is set).';


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
-- Name: urutan_lewati; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_lewati (
    seq bigint NOT NULL,
    pesanan_id text NOT NULL,
    versi bigint,
    message_id text,
    alasan text NOT NULL,
    galat text,
    ditahan_sejak timestamp with time zone NOT NULL,
    dilewati_pada timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: TABLE urutan_lewati; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_lewati IS 'Skips (lewati: skip): each hold an operator released without its version (`urutan hold release`), for `urutan explain`.';


--
-- Name: urutan_lewati_seq_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.urutan_lewati_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: urutan_lewati_seq_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.urutan_lewati_seq_seq OWNED BY public.urutan_lewati.seq;


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
    diparkir_pada timestamp with time zone DEFAULT now() NOT NULL,
    pesan jsonb,
    percobaan integer DEFAULT 0 NOT NULL,
    jatuh_tempo timestamp with time zone,
    galat text,
    traceparent text,
    celah boolean DEFAULT false NOT NULL
);


--
-- Name: TABLE urutan_parkir; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_parkir IS 'Messages that must wait for an older message of their order that may still be queued on another shard (or handed back to its queue); urutan_lepas applies them in version, then arrival order.';


--
-- Name: COLUMN urutan_parkir.epoch; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_parkir.epoch IS 'The position (epochs passed by its shard) the message arrived at; it may go once every active shard has passed it and no window is open for it.';


--
-- Name: COLUMN urutan_parkir.pesan; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_parkir.pesan IS 'The event as received (the jsonb urutan_terapkan was given): what urutan_lepas applies. The other columns are what the release and the operators query.';


--
-- Name: COLUMN urutan_parkir.percobaan; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_parkir.percobaan IS 'Attempts (percobaan) of a message set aside after a transient failure; 0 for a message parked behind others.';


--
-- Name: COLUMN urutan_parkir.jatuh_tempo; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_parkir.jatuh_tempo IS 'When a set-aside message is tried again (jatuh tempo: due); NULL for a message parked behind others.';


--
-- Name: COLUMN urutan_parkir.galat; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_parkir.galat IS 'The last error (galat) of a set-aside message.';


--
-- Name: COLUMN urutan_parkir.traceparent; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_parkir.traceparent IS 'The W3C traceparent of the apply span that parked or set this version aside: the effect of the version, applied later by urutan_lepas, continues that trace.';


--
-- Name: COLUMN urutan_parkir.celah; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_parkir.celah IS 'Waits for a gap (celah) below it (GAP_POLICY=wait): it cannot go before its order''s stored version reaches versi - 1 or an operator skips the missing version, and the release step does not read it (urutan_parkir_lepas_idx). Unmarked by what changes its order (triggers urutan_pesanan_maju, urutan_lewati_celah) and by a release with GAP_POLICY=apply.';


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
-- Name: urutan_penempatan; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_penempatan (
    shard integer NOT NULL,
    replika text NOT NULL,
    alasan text NOT NULL,
    sejak timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT urutan_penempatan_alasan_check CHECK ((alasan = ANY (ARRAY['joined'::text, 'left'::text, 'lost'::text, 'rebalanced'::text])))
);


--
-- Name: TABLE urutan_penempatan; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_penempatan IS 'Placement: the replica active on each shard (`replika`), why it got it (`alasan`: joined, left, lost, rebalanced) and since when (`sejak`). The old owner settles what it holds and cancels its consumer before the new one takes any delivery (the shard''s handover lock).';


--
-- Name: urutan_pengaturan; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_pengaturan (
    satu boolean DEFAULT true NOT NULL,
    entitas text NOT NULL,
    awalan text NOT NULL,
    batas_badan integer NOT NULL,
    diperbarui_pada timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT urutan_pengaturan_batas_badan_check CHECK ((batas_badan > 0)),
    CONSTRAINT urutan_pengaturan_satu_check CHECK (satu)
);


--
-- Name: TABLE urutan_pengaturan; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_pengaturan IS 'The pipeline''s settings that SQL needs (pengaturan: settings), one row: the entity (ENTITY, the outbox rows'' agregat_tipe), the topology prefix (TOPOLOGY_PREFIX, urutan_enqueue''s default routing key <prefix>.<status>) and MAX_BODY_BYTES. Seeded with the defaults; written by `urutan migrate` and `urutan run`.';


--
-- Name: urutan_replika; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_replika (
    nama text NOT NULL,
    bergabung_pada timestamp with time zone DEFAULT now() NOT NULL,
    sewa_sampai timestamp with time zone NOT NULL,
    aktif integer[] DEFAULT '{}'::integer[] NOT NULL,
    hidup_pid integer
);


--
-- Name: TABLE urutan_replika; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_replika IS 'One row per live replica (`urutan run`) of the pipeline: `nama` (REPLICA_NAME), `bergabung_pada` (joined at), `sewa_sampai` (lease until: renewed every second, the replica is dead to the others after it), `aktif` (the shards it has a registered consumer on, as it last reported), `hidup_pid` (alive: the backend of the replica''s own connection holding its life lock; when that lock is gone the replica is dead at once, without waiting for the lease). A replica stopping gracefully deletes its row; an expired row is deleted by the next replica that renews.';


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
-- Name: TABLE urutan_ring; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_ring IS 'Every recorded hash ring, one row per change (the highest versi is current): replicas with different SHARD_COUNTs agree through it.';


--
-- Name: COLUMN urutan_ring.dari; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_ring.dari IS 'The shard count before the change (NULL: the first record).';


--
-- Name: COLUMN urutan_ring.epoch; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_ring.epoch IS 'The epoch opened right after the bindings changed: once every shard has passed it, nothing routed by the old ring is left.';


--
-- Name: COLUMN urutan_ring.selesai; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_ring.selesai IS 'When the old ring''s messages were all done and removed shards deleted (NULL while the resharding is in progress).';


--
-- Name: urutan_ring_berubah; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_ring_berubah (
    satu boolean DEFAULT true NOT NULL,
    sejak timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT urutan_ring_berubah_satu_check CHECK (satu)
);


--
-- Name: TABLE urutan_ring_berubah; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_ring_berubah IS 'The previous version''s "ring change under way" flag (migration 0005), replaced by urutan_jendela. Kept, empty, for replicas of that version during a rolling upgrade.';


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
-- Name: TABLE urutan_shard; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_shard IS 'Every shard queue and the highest epoch marker its worker has passed: the position a message arriving on it is tagged with.';


--
-- Name: COLUMN urutan_shard.aktif; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON COLUMN public.urutan_shard.aktif IS 'False once a shrink removed the shard: urutan_epoch_selesai() no longer waits for it.';


--
-- Name: urutan_tahan; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.urutan_tahan (
    pesanan_id text NOT NULL,
    alasan text NOT NULL,
    message_id text,
    versi bigint,
    shard integer,
    sejak timestamp with time zone DEFAULT now() NOT NULL,
    galat text,
    CONSTRAINT urutan_tahan_alasan_check CHECK ((alasan = ANY (ARRAY['refused'::text, 'gap'::text, 'effect'::text])))
);


--
-- Name: TABLE urutan_tahan; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.urutan_tahan IS 'Held orders (tahan: hold): why (refused, gap, effect), the message and version holding it, since when. Later versions wait in urutan_parkir until the holding message is replayed and applied, or `urutan hold release` ends the hold.';


--
-- Name: outbox_awal; Type: TABLE ATTACH; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox ATTACH PARTITION public.outbox_awal DEFAULT;


--
-- Name: outbox_p1; Type: TABLE ATTACH; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox ATTACH PARTITION public.outbox_p1 FOR VALUES FROM ('1') TO ('16777217');


--
-- Name: pesan_diproses_awal; Type: TABLE ATTACH; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pesan_diproses ATTACH PARTITION public.pesan_diproses_awal DEFAULT;


--
-- Name: pesanan_riwayat_awal; Type: TABLE ATTACH; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pesanan_riwayat ATTACH PARTITION public.pesanan_riwayat_awal DEFAULT;


--
-- Name: urutan_efek_awal; Type: TABLE ATTACH; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek ATTACH PARTITION public.urutan_efek_awal DEFAULT;


--
-- Name: urutan_efek_p1; Type: TABLE ATTACH; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek ATTACH PARTITION public.urutan_efek_p1 FOR VALUES FROM ('1') TO ('16777217');


--
-- Name: outbox id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox ALTER COLUMN id SET DEFAULT nextval('public.outbox_id_seq'::regclass);


--
-- Name: pesanan_riwayat seq; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pesanan_riwayat ALTER COLUMN seq SET DEFAULT nextval('public.pesanan_riwayat_seq_seq'::regclass);


--
-- Name: urutan_audit seq; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_audit ALTER COLUMN seq SET DEFAULT nextval('public.urutan_audit_seq_seq'::regclass);


--
-- Name: urutan_basi seq; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_basi ALTER COLUMN seq SET DEFAULT nextval('public.urutan_basi_seq_seq'::regclass);


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
-- Name: urutan_lewati seq; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_lewati ALTER COLUMN seq SET DEFAULT nextval('public.urutan_lewati_seq_seq'::regclass);


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
-- Name: outbox_awal outbox_awal_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox_awal
    ADD CONSTRAINT outbox_awal_pkey PRIMARY KEY (id);


--
-- Name: outbox_p1 outbox_p1_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox_p1
    ADD CONSTRAINT outbox_p1_pkey PRIMARY KEY (id);


--
-- Name: pesanan pesanan_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pesanan
    ADD CONSTRAINT pesanan_pkey PRIMARY KEY (id);


--
-- Name: pesanan_riwayat_awal pesanan_riwayat_pesanan_id_versi_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pesanan_riwayat_awal
    ADD CONSTRAINT pesanan_riwayat_pesanan_id_versi_key UNIQUE (pesanan_id, versi);


--
-- Name: pesanan_riwayat_awal pesanan_riwayat_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pesanan_riwayat_awal
    ADD CONSTRAINT pesanan_riwayat_pkey PRIMARY KEY (seq);


--
-- Name: urutan_audit urutan_audit_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_audit
    ADD CONSTRAINT urutan_audit_pkey PRIMARY KEY (seq);


--
-- Name: urutan_basi urutan_basi_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_basi
    ADD CONSTRAINT urutan_basi_pkey PRIMARY KEY (seq);


--
-- Name: urutan_dead_letter urutan_dead_letter_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_dead_letter
    ADD CONSTRAINT urutan_dead_letter_pkey PRIMARY KEY (id);


--
-- Name: urutan_dikembalikan urutan_dikembalikan_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_dikembalikan
    ADD CONSTRAINT urutan_dikembalikan_pkey PRIMARY KEY (message_id, pesanan_id);


--
-- Name: urutan_efek_awal urutan_efek_awal_pesanan_versi_tujuan; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek_awal
    ADD CONSTRAINT urutan_efek_awal_pesanan_versi_tujuan UNIQUE (pesanan_id, versi, tujuan);


--
-- Name: urutan_efek urutan_efek_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek
    ADD CONSTRAINT urutan_efek_pkey PRIMARY KEY (efek);


--
-- Name: urutan_efek_awal urutan_efek_awal_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek_awal
    ADD CONSTRAINT urutan_efek_awal_pkey PRIMARY KEY (efek);


--
-- Name: urutan_efek_kepala urutan_efek_kepala_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek_kepala
    ADD CONSTRAINT urutan_efek_kepala_pkey PRIMARY KEY (pesanan_id);


--
-- Name: urutan_efek_p1 urutan_efek_p1_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek_p1
    ADD CONSTRAINT urutan_efek_p1_pkey PRIMARY KEY (efek);


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
-- Name: urutan_lewati urutan_lewati_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_lewati
    ADD CONSTRAINT urutan_lewati_pkey PRIMARY KEY (seq);


--
-- Name: urutan_parkir urutan_parkir_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_parkir
    ADD CONSTRAINT urutan_parkir_pkey PRIMARY KEY (seq);


--
-- Name: urutan_penempatan urutan_penempatan_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_penempatan
    ADD CONSTRAINT urutan_penempatan_pkey PRIMARY KEY (shard);


--
-- Name: urutan_pengaturan urutan_pengaturan_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_pengaturan
    ADD CONSTRAINT urutan_pengaturan_pkey PRIMARY KEY (satu);


--
-- Name: urutan_replika urutan_replika_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_replika
    ADD CONSTRAINT urutan_replika_pkey PRIMARY KEY (nama);


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
-- Name: urutan_tahan urutan_tahan_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_tahan
    ADD CONSTRAINT urutan_tahan_pkey PRIMARY KEY (pesanan_id);


--
-- Name: outbox_unroutable_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_unroutable_idx ON ONLY public.outbox USING btree (id) WHERE ((unroutable_at IS NOT NULL) AND (dikirim_pada IS NULL));


--
-- Name: INDEX outbox_unroutable_idx; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.outbox_unroutable_idx IS 'Outbox rows set aside as unroutable and not sent: counted by urutan status and the relay''s gauge without a scan.';


--
-- Name: outbox_awal_unroutable_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_awal_unroutable_idx ON public.outbox_awal USING btree (id) WHERE ((unroutable_at IS NOT NULL) AND (dikirim_pada IS NULL));


--
-- Name: outbox_unsent_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_unsent_idx ON ONLY public.outbox USING btree (id) WHERE (dikirim_pada IS NULL);


--
-- Name: INDEX outbox_unsent_idx; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.outbox_unsent_idx IS 'Unsent outbox rows in id order: what the relay publishes next (contract section 4).';


--
-- Name: outbox_awal_unsent_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_awal_unsent_idx ON public.outbox_awal USING btree (id) WHERE (dikirim_pada IS NULL);


--
-- Name: outbox_p1_id_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_p1_id_idx ON public.outbox_p1 USING btree (id) WHERE (dikirim_pada IS NULL);


--
-- Name: outbox_p1_id_idx1; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_p1_id_idx1 ON public.outbox_p1 USING btree (id) WHERE ((unroutable_at IS NOT NULL) AND (dikirim_pada IS NULL));


--
-- Name: pesan_diproses_awal_message_pesanan; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX pesan_diproses_awal_message_pesanan ON public.pesan_diproses_awal USING btree (message_id, pesanan_id);


--
-- Name: pesan_diproses_diproses_pada_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX pesan_diproses_diproses_pada_idx ON public.pesan_diproses_awal USING btree (diproses_pada);


--
-- Name: urutan_audit_pesanan; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_audit_pesanan ON public.urutan_audit USING btree (pesanan_id, seq);


--
-- Name: urutan_basi_pesanan; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_basi_pesanan ON public.urutan_basi USING btree (pesanan_id, versi);


--
-- Name: urutan_basi_tiba_pada; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_basi_tiba_pada ON public.urutan_basi USING btree (tiba_pada);


--
-- Name: urutan_dead_letter_at_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_dead_letter_at_idx ON public.urutan_dead_letter USING btree (dead_lettered_at);


--
-- Name: urutan_dead_letter_message_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_dead_letter_message_idx ON public.urutan_dead_letter USING btree (message_id);


--
-- Name: urutan_dead_letter_open_at; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_dead_letter_open_at ON public.urutan_dead_letter USING btree (dead_lettered_at, id) WHERE (resolved_at IS NULL);


--
-- Name: INDEX urutan_dead_letter_open_at; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.urutan_dead_letter_open_at IS 'Unresolved dead letters, oldest first (urutan dlq list, the console), past the resolved records kept for retention.';


--
-- Name: urutan_dead_letter_open_reason; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_dead_letter_open_reason ON public.urutan_dead_letter USING btree (reason, dead_lettered_at, id) WHERE (resolved_at IS NULL);


--
-- Name: INDEX urutan_dead_letter_open_reason; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.urutan_dead_letter_open_reason IS 'Unresolved dead letters by reason, oldest first: the count by reason (urutan status, the console) and a reason''s list.';


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

CREATE UNIQUE INDEX urutan_dead_letter_unresolved_key ON public.urutan_dead_letter USING btree (delivery_key, COALESCE(pesanan_id, ''::text)) WHERE (resolved_at IS NULL);


--
-- Name: INDEX urutan_dead_letter_unresolved_key; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.urutan_dead_letter_unresolved_key IS 'One unresolved record per message: per (delivery key, order id), since dedup is per (order, message id); '''' for a record without an order id. A redelivery''s second record is absorbed.';


--
-- Name: urutan_dead_letter_unresolved_recorded_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_dead_letter_unresolved_recorded_idx ON public.urutan_dead_letter USING btree (recorded_at) WHERE (resolved_at IS NULL);


--
-- Name: urutan_dikembalikan_pesanan_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_dikembalikan_pesanan_idx ON public.urutan_dikembalikan USING btree (pesanan_id, versi);


--
-- Name: urutan_efek_ditahan_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_ditahan_idx ON ONLY public.urutan_efek USING btree (pesanan_id, versi, tujuan) WHERE (ditahan_sejak IS NOT NULL);


--
-- Name: INDEX urutan_efek_ditahan_idx; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.urutan_efek_ditahan_idx IS 'Dead-lettered effects that hold their order (EFFECTS_ON_DEAD=hold).';


--
-- Name: urutan_efek_awal_ditahan_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_awal_ditahan_idx ON public.urutan_efek_awal USING btree (pesanan_id, versi, tujuan) WHERE (ditahan_sejak IS NOT NULL);


--
-- Name: INDEX urutan_efek_awal_ditahan_idx; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.urutan_efek_awal_ditahan_idx IS 'The effects that hold their order (few): the claim''s hold check, `urutan hold list` and the held gauge.';


--
-- Name: urutan_efek_menunggu_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_menunggu_idx ON ONLY public.urutan_efek USING btree (efek) WHERE (keadaan = 'menunggu'::text);


--
-- Name: INDEX urutan_efek_menunggu_idx; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.urutan_efek_menunggu_idx IS 'Pending effects in id order.';


--
-- Name: urutan_efek_awal_menunggu_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_awal_menunggu_idx ON public.urutan_efek_awal USING btree (efek) WHERE (keadaan = 'menunggu'::text);


--
-- Name: urutan_efek_pesanan_menunggu_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_pesanan_menunggu_idx ON ONLY public.urutan_efek USING btree (pesanan_id, versi, tujuan) WHERE (keadaan = 'menunggu'::text);


--
-- Name: INDEX urutan_efek_pesanan_menunggu_idx; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.urutan_efek_pesanan_menunggu_idx IS 'Pending effects of an order in (versi, tujuan) order: the order''s next effect.';


--
-- Name: urutan_efek_awal_pesanan_menunggu_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_awal_pesanan_menunggu_idx ON public.urutan_efek_awal USING btree (pesanan_id, versi, tujuan) WHERE (keadaan = 'menunggu'::text);


--
-- Name: urutan_efek_selesai_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_selesai_idx ON ONLY public.urutan_efek USING btree (selesai_pada) WHERE (keadaan = 'terkirim'::text);


--
-- Name: INDEX urutan_efek_selesai_idx; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.urutan_efek_selesai_idx IS 'Sent effects by when they were sent: the trim of the default partition.';


--
-- Name: urutan_efek_awal_selesai_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_awal_selesai_idx ON public.urutan_efek_awal USING btree (selesai_pada) WHERE (keadaan = 'terkirim'::text);


--
-- Name: urutan_efek_terbuka; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_terbuka ON ONLY public.urutan_efek USING btree (keadaan, tujuan) WHERE (keadaan <> 'terkirim'::text);


--
-- Name: INDEX urutan_efek_terbuka; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.urutan_efek_terbuka IS 'Effects not sent (pending and dead-lettered) by state and endpoint: the effects by endpoint (the console) and the dead-lettered ones (urutan status, dlq list --effects), past the sent ones kept for EFFECTS_RETENTION.';


--
-- Name: urutan_efek_awal_terbuka; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_awal_terbuka ON public.urutan_efek_awal USING btree (keadaan, tujuan) WHERE (keadaan <> 'terkirim'::text);


--
-- Name: INDEX urutan_efek_awal_terbuka; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.urutan_efek_awal_terbuka IS 'Effects not sent (pending and dead-lettered) by state and endpoint: the effects by endpoint (the console) and the dead-lettered ones (urutan status, dlq list --effects), past the sent ones kept for EFFECTS_RETENTION.';


--
-- Name: urutan_efek_kepala_siap_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_kepala_siap_idx ON public.urutan_efek_kepala USING btree (siap_pada);


--
-- Name: urutan_efek_p1_efek_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_p1_efek_idx ON public.urutan_efek_p1 USING btree (efek) WHERE (keadaan = 'menunggu'::text);


--
-- Name: urutan_efek_p1_keadaan_tujuan_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_p1_keadaan_tujuan_idx ON public.urutan_efek_p1 USING btree (keadaan, tujuan) WHERE (keadaan <> 'terkirim'::text);


--
-- Name: urutan_efek_p1_pesanan_id_versi_tujuan_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_p1_pesanan_id_versi_tujuan_idx ON public.urutan_efek_p1 USING btree (pesanan_id, versi, tujuan) WHERE (keadaan = 'menunggu'::text);


--
-- Name: urutan_efek_p1_pesanan_id_versi_tujuan_idx1; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_p1_pesanan_id_versi_tujuan_idx1 ON public.urutan_efek_p1 USING btree (pesanan_id, versi, tujuan) WHERE (ditahan_sejak IS NOT NULL);


--
-- Name: urutan_efek_p1_pesanan_versi_tujuan; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX urutan_efek_p1_pesanan_versi_tujuan ON public.urutan_efek_p1 USING btree (pesanan_id, versi, tujuan);


--
-- Name: urutan_efek_p1_selesai_pada_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_efek_p1_selesai_pada_idx ON public.urutan_efek_p1 USING btree (selesai_pada) WHERE (keadaan = 'terkirim'::text);


--
-- Name: urutan_jendela_terbuka_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_jendela_terbuka_idx ON public.urutan_jendela USING btree (epoch) WHERE (ditutup_pada IS NULL);


--
-- Name: urutan_lewati_pesanan; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_lewati_pesanan ON public.urutan_lewati USING btree (pesanan_id);


--
-- Name: urutan_parkir_celah_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_parkir_celah_idx ON public.urutan_parkir USING btree (pesanan_id, versi) WHERE celah;


--
-- Name: INDEX urutan_parkir_celah_idx; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.urutan_parkir_celah_idx IS 'The rows waiting for a gap, per order and version: what a change of the order unmarks.';


--
-- Name: urutan_parkir_coba_lagi; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_parkir_coba_lagi ON public.urutan_parkir USING btree (jatuh_tempo) WHERE (jatuh_tempo IS NOT NULL);


--
-- Name: INDEX urutan_parkir_coba_lagi; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.urutan_parkir_coba_lagi IS 'Messages set aside after a transient failure, the next due first (urutan hold list, the console).';


--
-- Name: urutan_parkir_jatuh_tempo; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_parkir_jatuh_tempo ON public.urutan_parkir USING btree (pesanan_id) WHERE (jatuh_tempo IS NOT NULL);


--
-- Name: urutan_parkir_lepas_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_parkir_lepas_idx ON public.urutan_parkir USING btree (shard, pesanan_id) WHERE (NOT celah);


--
-- Name: INDEX urutan_parkir_lepas_idx; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.urutan_parkir_lepas_idx IS 'The parked rows the release step (urutan_lepas) looks at: those not waiting for a gap.';


--
-- Name: urutan_parkir_pesanan_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_parkir_pesanan_idx ON public.urutan_parkir USING btree (pesanan_id, seq);


--
-- Name: urutan_parkir_shard_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_parkir_shard_idx ON public.urutan_parkir USING btree (shard, epoch);


--
-- Name: urutan_tahan_alasan_sejak; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_tahan_alasan_sejak ON public.urutan_tahan USING btree (alasan, sejak);


--
-- Name: INDEX urutan_tahan_alasan_sejak; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.urutan_tahan_alasan_sejak IS 'Holds by reason with the oldest (urutan status, urutan_orders_held and urutan_hold_oldest_seconds).';


--
-- Name: urutan_tahan_sejak; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX urutan_tahan_sejak ON public.urutan_tahan USING btree (sejak, pesanan_id);


--
-- Name: INDEX urutan_tahan_sejak; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON INDEX public.urutan_tahan_sejak IS 'Holds, oldest first (urutan hold list, the console).';


--
-- Name: outbox_awal_pkey; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.outbox_pkey ATTACH PARTITION public.outbox_awal_pkey;


--
-- Name: outbox_awal_unroutable_idx; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.outbox_unroutable_idx ATTACH PARTITION public.outbox_awal_unroutable_idx;


--
-- Name: outbox_awal_unsent_idx; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.outbox_unsent_idx ATTACH PARTITION public.outbox_awal_unsent_idx;


--
-- Name: outbox_p1_id_idx; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.outbox_unsent_idx ATTACH PARTITION public.outbox_p1_id_idx;


--
-- Name: outbox_p1_id_idx1; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.outbox_unroutable_idx ATTACH PARTITION public.outbox_p1_id_idx1;


--
-- Name: outbox_p1_pkey; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.outbox_pkey ATTACH PARTITION public.outbox_p1_pkey;


--
-- Name: urutan_efek_awal_ditahan_idx; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.urutan_efek_ditahan_idx ATTACH PARTITION public.urutan_efek_awal_ditahan_idx;


--
-- Name: urutan_efek_awal_menunggu_idx; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.urutan_efek_menunggu_idx ATTACH PARTITION public.urutan_efek_awal_menunggu_idx;


--
-- Name: urutan_efek_awal_pesanan_menunggu_idx; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.urutan_efek_pesanan_menunggu_idx ATTACH PARTITION public.urutan_efek_awal_pesanan_menunggu_idx;


--
-- Name: urutan_efek_awal_pkey; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.urutan_efek_pkey ATTACH PARTITION public.urutan_efek_awal_pkey;


--
-- Name: urutan_efek_awal_selesai_idx; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.urutan_efek_selesai_idx ATTACH PARTITION public.urutan_efek_awal_selesai_idx;


--
-- Name: urutan_efek_awal_terbuka; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.urutan_efek_terbuka ATTACH PARTITION public.urutan_efek_awal_terbuka;


--
-- Name: urutan_efek_p1_efek_idx; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.urutan_efek_menunggu_idx ATTACH PARTITION public.urutan_efek_p1_efek_idx;


--
-- Name: urutan_efek_p1_keadaan_tujuan_idx; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.urutan_efek_terbuka ATTACH PARTITION public.urutan_efek_p1_keadaan_tujuan_idx;


--
-- Name: urutan_efek_p1_pesanan_id_versi_tujuan_idx; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.urutan_efek_pesanan_menunggu_idx ATTACH PARTITION public.urutan_efek_p1_pesanan_id_versi_tujuan_idx;


--
-- Name: urutan_efek_p1_pesanan_id_versi_tujuan_idx1; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.urutan_efek_ditahan_idx ATTACH PARTITION public.urutan_efek_p1_pesanan_id_versi_tujuan_idx1;


--
-- Name: urutan_efek_p1_pkey; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.urutan_efek_pkey ATTACH PARTITION public.urutan_efek_p1_pkey;


--
-- Name: urutan_efek_p1_selesai_pada_idx; Type: INDEX ATTACH; Schema: public; Owner: -
--

ALTER INDEX public.urutan_efek_selesai_idx ATTACH PARTITION public.urutan_efek_p1_selesai_pada_idx;


--
-- Name: urutan_dead_letter urutan_dikembalikan_mati; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER urutan_dikembalikan_mati AFTER INSERT ON public.urutan_dead_letter FOR EACH ROW WHEN ((new.message_id IS NOT NULL)) EXECUTE FUNCTION public.urutan_dikembalikan_mati();


--
-- Name: pesanan_riwayat urutan_efek_catat_pernyataan; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER urutan_efek_catat_pernyataan AFTER INSERT ON public.pesanan_riwayat REFERENCING NEW TABLE AS baru FOR EACH STATEMENT EXECUTE FUNCTION public.urutan_efek_catat_pernyataan();


--
-- Name: TRIGGER urutan_efek_catat_pernyataan ON pesanan_riwayat; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER urutan_efek_catat_pernyataan ON public.pesanan_riwayat IS 'Records the effects of the applied versions, once per INSERT statement (urutan_efek_catat_pernyataan).';


--
-- Name: urutan_efek urutan_efek_kepala_baru; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER urutan_efek_kepala_baru AFTER INSERT ON public.urutan_efek REFERENCING NEW TABLE AS baru FOR EACH STATEMENT EXECUTE FUNCTION public.urutan_efek_kepala_baru();


--
-- Name: urutan_efek urutan_efek_kepala_lagi; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER urutan_efek_kepala_lagi AFTER UPDATE OF keadaan ON public.urutan_efek FOR EACH ROW WHEN (((old.keadaan <> 'menunggu'::text) AND (new.keadaan = 'menunggu'::text))) EXECUTE FUNCTION public.urutan_efek_kepala_lagi();


--
-- Name: urutan_lewati urutan_lewati_celah; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER urutan_lewati_celah AFTER INSERT ON public.urutan_lewati FOR EACH ROW EXECUTE FUNCTION public.urutan_lewati_celah();


--
-- Name: TRIGGER urutan_lewati_celah ON urutan_lewati; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER urutan_lewati_celah ON public.urutan_lewati IS 'A skip unmarks the order''s versions waiting for the gap (urutan_lewati_celah).';


--
-- Name: urutan_parkir urutan_parkir_celah; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER urutan_parkir_celah BEFORE INSERT ON public.urutan_parkir FOR EACH ROW EXECUTE FUNCTION public.urutan_parkir_celah();


--
-- Name: TRIGGER urutan_parkir_celah ON urutan_parkir; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER urutan_parkir_celah ON public.urutan_parkir IS 'Marks a version parked above a gap (urutan_parkir_celah).';


--
-- Name: urutan_parkir urutan_parkir_jejak; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER urutan_parkir_jejak BEFORE INSERT ON public.urutan_parkir FOR EACH ROW EXECUTE FUNCTION public.urutan_parkir_jejak();


--
-- Name: pesanan urutan_pesanan_maju_baru; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER urutan_pesanan_maju_baru AFTER INSERT ON public.pesanan REFERENCING NEW TABLE AS baru FOR EACH STATEMENT EXECUTE FUNCTION public.urutan_pesanan_maju();


--
-- Name: TRIGGER urutan_pesanan_maju_baru ON pesanan; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER urutan_pesanan_maju_baru ON public.pesanan IS 'A new order''s parked versions waiting for a gap it closes are read again (urutan_pesanan_maju).';


--
-- Name: pesanan urutan_pesanan_maju_ubah; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER urutan_pesanan_maju_ubah AFTER UPDATE ON public.pesanan REFERENCING NEW TABLE AS baru FOR EACH STATEMENT EXECUTE FUNCTION public.urutan_pesanan_maju();


--
-- Name: TRIGGER urutan_pesanan_maju_ubah ON pesanan; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER urutan_pesanan_maju_ubah ON public.pesanan IS 'An order''s parked versions waiting for a gap its new version closes are read again (urutan_pesanan_maju).';


--
-- Name: urutan_efek_rute urutan_efek_rute_tujuan_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.urutan_efek_rute
    ADD CONSTRAINT urutan_efek_rute_tujuan_fkey FOREIGN KEY (tujuan) REFERENCES public.urutan_efek_tujuan(tujuan);


--
-- Name: urutan_efek urutan_efek_tujuan_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE public.urutan_efek
    ADD CONSTRAINT urutan_efek_tujuan_fkey FOREIGN KEY (tujuan) REFERENCES public.urutan_efek_tujuan(tujuan);


--
-- PostgreSQL database dump complete
--


