#!/usr/bin/env bash
# The effect dispatcher's claim alone: the schedule-based claim of migration
# 0011 (`urutan_efek_klaim` + `urutan_efek_hasil`) against the claim it
# replaced (walk the pending effects oldest first, prove each one heads its
# order; bitmap scans and sorts off, as in 23f58dc), in one scratch
# database, alternating, ROUNDS times.
#
# Each round starts from ORDERS orders × VERSIONS pending effects (written
# version-major, as a pool applying orders round-robin writes them; the
# statistics taken while the table was empty, as when a backlog outgrows
# autovacuum). The dispatcher's situation in a backlog: every order's head
# is in flight (CONCURRENCY ≥ the orders with work, or their heads in
# backoff), and each finished send wakes a claim for its one free slot.
#   idle:  EMPTY claims of one effect while every head is held (they find
#          nothing): milliseconds per claim.
#   drain: STEPS steps of "record the oldest in-flight effect sent, claim
#          up to SLOTS", each its own transaction: steps per second. Only
#          the order just recorded has a head due: with SLOTS=1 the old claim
#          stops at it, with SLOTS>1 (a dispatcher with more free slots than
#          orders due: few orders, many effects each) it walks the backlog.
#
#   bash benches/sql/effects-claim.sh        # ROUNDS=3 ORDERS=300 VERSIONS=120 STEPS=1000 EMPTY=20 SLOTS=1
#   SLOTS=4 bash benches/sql/effects-claim.sh
#   PGURL=postgres://postgres@127.0.0.1:5432 bash benches/sql/effects-claim.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ROUNDS=${ROUNDS:-3} ORDERS=${ORDERS:-300} VERSIONS=${VERSIONS:-120}
STEPS=${STEPS:-1000} EMPTY=${EMPTY:-20} SLOTS=${SLOTS:-1}
db=urutan_effectsql_$$
psql "$PGURL/postgres" -qc "CREATE DATABASE $db"
trap 'psql "$PGURL/postgres" -qc "DROP DATABASE IF EXISTS $db" >/dev/null' EXIT
for f in migrations/*.sql; do psql "$PGURL/$db" -q -v ON_ERROR_STOP=1 -f "$f"; done

psql "$PGURL/$db" -q -v ON_ERROR_STOP=1 <<'SQL'
INSERT INTO urutan_efek_tujuan (url) VALUES ('http://127.0.0.1:9/pay');
ALTER TABLE urutan_efek_p1 SET (autovacuum_enabled = false);  -- the first id-range partition (migration 0033)
ALTER TABLE urutan_efek_kepala SET (autovacuum_enabled = false);
ANALYZE urutan_efek; ANALYZE urutan_efek_kepala;
-- The dispatcher's slots: effects claimed and not yet recorded, oldest first.
CREATE TABLE bench_held (n BIGSERIAL PRIMARY KEY, efek BIGINT, percobaan INT);

-- The claim before migration 0011 (src/effects/store.rs at 23f58dc).
CREATE FUNCTION bench_old_claim(p_batas INT, p_sewa FLOAT8, p_oleh TEXT)
RETURNS TABLE (efek BIGINT, percobaan INT) LANGUAGE sql
SET enable_bitmapscan = off SET enable_sort = off AS $$
    WITH calon AS (
        SELECT e.efek FROM urutan_efek e
        WHERE e.keadaan = 'menunggu' AND e.coba_pada <= now()
          AND (e.sewa_sampai IS NULL OR e.sewa_sampai < now())
          AND NOT EXISTS (
              SELECT 1 FROM urutan_efek d
              WHERE d.pesanan_id = e.pesanan_id AND d.keadaan = 'menunggu'
                AND (d.versi, d.tujuan) < (e.versi, e.tujuan))
        ORDER BY e.efek
        LIMIT p_batas
        FOR UPDATE SKIP LOCKED)
    UPDATE urutan_efek e
    SET sewa_sampai = now() + make_interval(secs => p_sewa), sewa_oleh = p_oleh,
        percobaan = e.percobaan + 1
    FROM calon WHERE e.efek = calon.efek
    RETURNING e.efek, e.percobaan
$$;
CREATE FUNCTION bench_old_record(p_efek BIGINT, p_percobaan INT) RETURNS BOOLEAN
LANGUAGE sql AS $$
    WITH done AS (
        UPDATE urutan_efek
        SET keadaan = 'terkirim', kode = 200, sewa_sampai = NULL, sewa_oleh = NULL,
            selesai_pada = now()
        WHERE efek = p_efek AND percobaan = p_percobaan AND keadaan = 'menunggu'
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM done)
$$;

CREATE FUNCTION bench_claim(p_old BOOLEAN, p_batas INT) RETURNS INT LANGUAGE plpgsql AS $$
DECLARE n INT;
BEGIN
    IF p_old THEN
        INSERT INTO bench_held (efek, percobaan)
        SELECT c.efek, c.percobaan FROM bench_old_claim(p_batas, 600, 'bench') c;
    ELSE
        INSERT INTO bench_held (efek, percobaan)
        SELECT c.efek, c.percobaan FROM urutan_efek_klaim(p_batas, 600, 'bench') c;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- The round's starting point, for both variants alike.
CREATE PROCEDURE bench_reset(p_orders INT, p_versions INT) LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE urutan_efek, urutan_efek_kepala, bench_held;
    INSERT INTO urutan_efek (pesanan_id, versi, tujuan, message_id, isi)
    SELECT 'B-' || lpad(o::text, 4, '0'), v, 1, 'B-' || o || '/' || v, '{}'
    FROM generate_series(1, p_versions) v, generate_series(1, p_orders) o
    ORDER BY v, o;
END $$;

-- p_empty claims finding nothing, then p_steps drain steps, each statement
-- its own transaction; reports milliseconds per empty claim and steps/s.
CREATE PROCEDURE bench_run(p_old BOOLEAN, p_orders INT, p_empty INT, p_steps INT, p_slots INT,
                           INOUT idle_ms FLOAT8 DEFAULT NULL, INOUT steps_s FLOAT8 DEFAULT NULL,
                           INOUT claimed INT DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE t0 TIMESTAMPTZ; h RECORD; i INT; v_total INT := 0;
BEGIN
    PERFORM bench_claim(p_old, p_orders);
    COMMIT;
    t0 := clock_timestamp();
    FOR i IN 1..p_empty LOOP
        PERFORM bench_claim(p_old, 1);
        COMMIT;
    END LOOP;
    idle_ms := extract(epoch FROM clock_timestamp() - t0) * 1000 / p_empty;
    t0 := clock_timestamp();
    FOR i IN 1..p_steps LOOP
        DELETE FROM bench_held WHERE n = (SELECT min(b.n) FROM bench_held b) RETURNING * INTO h;
        IF p_old THEN
            PERFORM bench_old_record(h.efek, h.percobaan);
        ELSE
            PERFORM urutan_efek_hasil(h.efek, h.percobaan, 'terkirim', 200, NULL, 0);
        END IF;
        COMMIT;
        v_total := v_total + bench_claim(p_old, p_slots);
        COMMIT;
    END LOOP;
    steps_s := p_steps / extract(epoch FROM clock_timestamp() - t0);
    claimed := v_total;
END $$;
SQL

run() { # old|new -> "idle_ms steps_s claimed"
    local old=false
    [[ $1 == old ]] && old=true
    psql "$PGURL/$db" -qAt -v ON_ERROR_STOP=1 -c "CALL bench_reset($ORDERS, $VERSIONS)" >/dev/null
    psql "$PGURL/$db" -qAt -F ' ' -v ON_ERROR_STOP=1 \
        -c "CALL bench_run($old, $ORDERS, $EMPTY, $STEPS, $SLOTS)"
}

echo "effects claim: $ORDERS orders × $VERSIONS pending effects, every head held; $EMPTY empty claims, $STEPS drain steps claiming up to $SLOTS; $ROUNDS rounds"
printf '%-6s %-5s %14s %14s %8s\n' round claim "idle ms/claim" "drain steps/s" claimed
for round in $(seq 1 "$ROUNDS"); do
    for variant in old new; do
        read -r idle steps claimed < <(run $variant)
        printf '%-6s %-5s %14.2f %14.0f %8s\n' "$round" "$variant" "$idle" "$steps" "$claimed"
    done
done
