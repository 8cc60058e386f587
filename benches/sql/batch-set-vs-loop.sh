#!/usr/bin/env bash
# The batch statement alone: the set-based urutan_terapkan_batch (migration
# 0006) against the per-message loop it replaced (urutan_terapkan_batch_urut),
# in one scratch database, alternating, ROUNDS times. Each round applies
# BATCHES batches of BATCH new messages (~60-byte data, 2,000 orders, every
# message a new version) twice: inside one PL/pgSQL block (only the server's
# work: no client, no commit per batch) and as one autocommit statement per
# batch from psql (\gexec: a round trip and a WAL flush per batch, as the
# worker commits).
#
#   bash benches/sql/batch-set-vs-loop.sh            # ROUNDS=5 BATCHES=300 BATCH=64
#   PGURL=postgres://postgres@127.0.0.1:5432 bash benches/sql/batch-set-vs-loop.sh
set -euo pipefail
shopt -s inherit_errexit
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
    PERFORM $1((SELECT jsonb_agg(jsonb_build_object(
        'message_id', 'm' || (base + g), 'id', 'E' || ((base + g) * 7919 % 2000),
        'status', 'dibayar', 'versi', b + 1,
        'data', '{\"catatan\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}'::jsonb) ORDER BY g)
      FROM generate_series(1, $BATCH) g), 0);
  END LOOP;
END \$\$;" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p'
}

# The same batches, one statement and one commit each.
run_commits() { # function name -> milliseconds
    psql "$PGURL/$db" -qAt -v ON_ERROR_STOP=1 -c "TRUNCATE pesanan, pesan_diproses, pesanan_riwayat"
    local start end
    start=$(date +%s%N)
    psql "$PGURL/$db" -qAt -v ON_ERROR_STOP=1 -o /dev/null <<SQL
SELECT format(\$f\$SELECT $1((SELECT jsonb_agg(jsonb_build_object(
      'message_id', 'm' || (%1\$s + g), 'id', 'E' || ((%1\$s + g) * 7919 %% 2000),
      'status', 'dibayar', 'versi', %2\$s,
      'data', '{"catatan": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'::jsonb) ORDER BY g)
    FROM generate_series(1, $BATCH) g), 0)\$f\$, b * $BATCH, b + 1)
FROM generate_series(0, $BATCHES - 1) b
\\gexec
SQL
    end=$(date +%s%N)
    echo $(((end - start) / 1000000))
}

msgs=$((BATCHES * BATCH))
compare() { # runner label
    local runner=$1 label=$2 ratios=() r l s ratio
    echo "$label: $BATCHES batches of $BATCH"
    echo "round  loop_ms  set_ms  loop_msg/s  set_msg/s  set/loop"
    for r in $(seq 1 "$ROUNDS"); do
        if (( r % 2 )); then l=$($runner urutan_terapkan_batch_urut); s=$($runner urutan_terapkan_batch)
        else s=$($runner urutan_terapkan_batch); l=$($runner urutan_terapkan_batch_urut); fi
        ratio=$(awk -v l="$l" -v s="$s" 'BEGIN { printf "%.2f", l / s }')
        ratios+=("$ratio")
        awk -v r="$r" -v l="$l" -v s="$s" -v n="$msgs" -v q="$ratio" \
            'BEGIN { printf "%5d  %7.0f  %6.0f  %10.0f  %9.0f  %7s×\n", r, l, s, n*1000/l, n*1000/s, q }'
    done
    printf '%s\n' "${ratios[@]}" | sort -n |
        awk -v label="$label" '{ a[NR] = $1 } END { printf "%s: median set/loop speed-up %s× over %d rounds\n\n", label, a[int((NR + 1) / 2)], NR }'
}

compare run "in-server (one PL/pgSQL block)"
compare run_commits "one autocommit statement per batch"
