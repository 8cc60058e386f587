#!/usr/bin/env bash
# Database time per message of the set-based batch, inside PostgreSQL:
# BATCHES calls of urutan_terapkan_batch with 128 new messages each (ORDERS
# orders, default 2,000, every message the next version of its order, no order twice in a
# batch), a COMMIT after each, synchronous_commit off. Two scratch
# databases side by side: `before` migrated up to BEFORE (default: every
# migration but the newest), `after` with all of them. Rounds alternate
# which runs first; each run starts from the same state (tables emptied,
# 2,000 orders at version 0, VACUUM ANALYZE).
#
#   bash benches/sql/batch-db-cost.sh          # ROUNDS=7 BATCHES=400
#   EFFECTS=1 bash benches/sql/batch-db-cost.sh  # with a route '*' (effects on)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ROUNDS=${ROUNDS:-7} BATCHES=${BATCHES:-400} EFFECTS=${EFFECTS:-0} ORDERS=${ORDERS:-2000}
mapfile -t all < <(ls migrations/*.sql)
BEFORE=${BEFORE:-$(basename "${all[-2]}" .sql)}
before=urutan_batchcost_a_$$ after=urutan_batchcost_b_$$
for db in $before $after; do psql "$PGURL/postgres" -qc "CREATE DATABASE $db"; done
trap 'for db in $before $after; do psql "$PGURL/postgres" -qc "DROP DATABASE IF EXISTS $db" >/dev/null; done' EXIT
for f in "${all[@]}"; do
    psql "$PGURL/$after" -q -v ON_ERROR_STOP=1 -f "$f" >/dev/null
    [[ $(basename "$f" .sql) > $BEFORE ]] || psql "$PGURL/$before" -q -v ON_ERROR_STOP=1 -f "$f" >/dev/null
done
for db in $before $after; do
    psql "$PGURL/$db" -qAt -v ON_ERROR_STOP=1 -c "SELECT urutan_partisi_siapkan(7)" \
        -c "INSERT INTO urutan_efek_tujuan (url) VALUES ('http://127.0.0.1:9/pay')" >/dev/null
    # The batches, built once (their building is not timed).
    psql "$PGURL/$db" -q -v ON_ERROR_STOP=1 -c "
CREATE TABLE bench_batch AS
SELECT b, (SELECT jsonb_agg(jsonb_build_object('message_id', 'm' || i, 'id', 'E' || (i % $ORDERS),
                                              'status', 'dibayar', 'versi', i / $ORDERS + 1,
                                              'data', '{\"catatan\": \"xxxxxxxxxxxxxxxxxxxx\"}'::jsonb)
                           ORDER BY i)
          FROM generate_series(b * 128, b * 128 + 127) i) AS pesan
FROM generate_series(0, $BATCHES - 1) b;
CREATE UNIQUE INDEX ON bench_batch (b);"
    if [[ $EFFECTS == 1 ]]; then
        psql "$PGURL/$db" -qc "INSERT INTO urutan_efek_rute VALUES ('*', 1)"
    fi
done

run() { # database -> "ms history_rows effect_rows"
    psql "$PGURL/$1" -qAt -v ON_ERROR_STOP=1 \
        -c "TRUNCATE pesanan, pesan_diproses, pesanan_riwayat, urutan_efek, urutan_efek_kepala" \
        -c "INSERT INTO pesanan (id, status, versi) SELECT 'E' || g, 'dibuat', 0 FROM generate_series(0, $ORDERS - 1) g" \
        -c "VACUUM ANALYZE" -c "CHECKPOINT" -c "SET synchronous_commit = off" -c '\timing on' -c "
DO \$\$
DECLARE
  v TEXT[];
BEGIN
  FOR n IN 0..$BATCHES - 1 LOOP
    v := urutan_terapkan_batch((SELECT pesan FROM bench_batch WHERE bench_batch.b = n), 0);
    COMMIT;
  END LOOP;
END \$\$;" -c '\timing off' \
        -c "SELECT 'check', (SELECT count(*) FROM pesanan_riwayat), (SELECT count(*) FROM urutan_efek)" |
        awk -F'|' '/^Time:/ { sub(/^Time: /, ""); split($0, t, " "); ms = t[1] }
                   /^check/ { rows = $2; effects = $3 }
                   END { print ms, rows, effects }'
}

messages=$((BATCHES * 128))
echo "set-based batch: $BATCHES batches of 128 ($messages messages) per run over $ORDERS orders, $ROUNDS rounds, effects route: $EFFECTS"
echo "before: migrations up to $BEFORE; after: all ($(basename "${all[-1]}" .sql))"
printf '%-6s %-7s %10s %9s %9s %9s\n' round variant ms us/msg applied effects
declare -a a_us b_us
for round in $(seq 1 "$ROUNDS"); do
    order=(before after)
    ((round % 2 == 0)) && order=(after before)
    for variant in "${order[@]}"; do
        db=$before; [[ $variant == after ]] && db=$after
        read -r ms rows effects < <(run "$db")
        us=$(awk -v ms="$ms" -v n="$messages" 'BEGIN { printf "%.2f", ms * 1000 / n }')
        printf '%-6s %-7s %10.0f %9s %9s %9s\n' "$round" "$variant" "$ms" "$us" "$rows" "$effects"
        [[ $rows == "$messages" ]] || { echo "expected $messages history rows, got $rows" >&2; exit 1; }
        if [[ $variant == before ]]; then a_us+=("$us"); else b_us+=("$us"); fi
    done
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ma=$(median "${a_us[@]}") mb=$(median "${b_us[@]}")
echo "median us/msg: before $ma, after $mb, after/before $(awk -v a="$ma" -v b="$mb" 'BEGIN { printf "%.3f", b / a }')"
