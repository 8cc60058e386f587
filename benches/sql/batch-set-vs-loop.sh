#!/usr/bin/env bash
# The batch statement alone: the set-based urutan_terapkan_batch (migration
# 0006) against the per-message loop it replaced (urutan_terapkan_batch_urut),
# in one scratch database, alternating, ROUNDS times. Each round applies
# BATCHES batches of BATCH new messages (~60-byte data, 2,000 orders, every
# message a new version) inside one PL/pgSQL block, so only the server's work
# is timed: no client, no broker, no commit per batch.
#
#   bash benches/sql/batch-set-vs-loop.sh            # ROUNDS=5 BATCHES=300 BATCH=64
#   PGURL=postgres://postgres@127.0.0.1:5432 bash benches/sql/batch-set-vs-loop.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432}
ROUNDS=${ROUNDS:-5} BATCHES=${BATCHES:-300} BATCH=${BATCH:-64}
db=urutan_batchsql_$$
psql "$PGURL/postgres" -qc "CREATE DATABASE $db"
trap 'psql "$PGURL/postgres" -qc "DROP DATABASE IF EXISTS $db" >/dev/null' EXIT
for f in migrations/*.sql; do psql "$PGURL/$db" -q -v ON_ERROR_STOP=1 -f "$f"; done

run() { # function name -> milliseconds
    psql "$PGURL/$db" -qAt -v ON_ERROR_STOP=1 \
        -c "TRUNCATE pesanan, pesan_diproses, pesanan_riwayat" \
        -c '\timing on' -c "
DO \$\$
DECLARE b int; base int;
BEGIN
  FOR b IN 0..$BATCHES - 1 LOOP
    base := b * $BATCH;
    PERFORM $1(
      ARRAY(SELECT 'm' || (base + g) FROM generate_series(1, $BATCH) g),
      ARRAY(SELECT 'E' || ((base + g) * 7919 % 2000) FROM generate_series(1, $BATCH) g),
      ARRAY(SELECT 'dibayar' FROM generate_series(1, $BATCH) g),
      ARRAY(SELECT (b + 1)::bigint FROM generate_series(1, $BATCH) g),
      ARRAY(SELECT '{\"catatan\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}' FROM generate_series(1, $BATCH) g),
      ARRAY(SELECT NULL::bigint FROM generate_series(1, $BATCH) g), 0);
  END LOOP;
END \$\$;" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p'
}

msgs=$((BATCHES * BATCH))
echo "round  loop_ms  set_ms  loop_msg/s  set_msg/s  set/loop"
ratios=()
for r in $(seq 1 "$ROUNDS"); do
    if (( r % 2 )); then l=$(run urutan_terapkan_batch_urut); s=$(run urutan_terapkan_batch)
    else s=$(run urutan_terapkan_batch); l=$(run urutan_terapkan_batch_urut); fi
    ratio=$(awk -v l="$l" -v s="$s" 'BEGIN { printf "%.2f", l / s }')
    ratios+=("$ratio")
    awk -v r="$r" -v l="$l" -v s="$s" -v n="$msgs" -v q="$ratio" \
        'BEGIN { printf "%5d  %7.0f  %6.0f  %10.0f  %9.0f  %7s×\n", r, l, s, n*1000/l, n*1000/s, q }'
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ a[NR] = $1 } END { printf "median set/loop speed-up: %s× (%d rounds, %d messages each)\n", a[int((NR + 1) / 2)], NR, '"$msgs"' }'
