#!/usr/bin/env bash
# What PostgreSQL writes per message (issue 33: rows and index entries,
# statements, WAL bytes), read from the WAL itself: in a scratch database
# migrated with every migration, ORDERS orders at version 0, then
#   - batch:  BATCHES calls of urutan_terapkan_batch with 128 new messages
#             each (the batch worker's statement), a COMMIT after each;
#   - strict: STRICT calls of urutan_terapkan, one message per transaction
#             (the strict worker's statement).
# Each is run twice: a warm-up, then the measured run right after a
# CHECKPOINT (so every page's first change after it writes a full-page image,
# as after any checkpoint). The WAL between the measured run's two positions
# goes through `pg_waldump --stats=record`: records, record bytes and
# full-page-image bytes per message, by kind.
#
# Reads the server's WAL directory: run it as root or postgres on the
# database's own machine. Leaves nothing behind (its database is dropped).
#
#   bash benches/sql/wal-per-message.sh        # ORDERS=2000 BATCHES=200 STRICT=5000
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ORDERS=${ORDERS:-2000} BATCHES=${BATCHES:-200} STRICT=${STRICT:-5000}
db=urutan_walmsg_$$
psql "$PGURL/postgres" -qc "CREATE DATABASE $db"
trap 'psql "$PGURL/postgres" -qc "DROP DATABASE IF EXISTS $db" >/dev/null' EXIT
for f in migrations/*.sql; do psql "$PGURL/$db" -q -v ON_ERROR_STOP=1 -f "$f" >/dev/null; done
psql "$PGURL/$db" -qAt -v ON_ERROR_STOP=1 -c "SELECT urutan_partisi_siapkan(7)" >/dev/null
wal_dir=$(psql "$PGURL/$db" -qAt -c "SHOW data_directory")/pg_wal
waldump=$(ls /usr/lib/postgresql/*/bin/pg_waldump 2>/dev/null | tail -1)
[[ -n $waldump && -r $wal_dir ]] || { echo "needs pg_waldump and read access to $wal_dir (run as root or postgres on the database's machine)" >&2; exit 1; }

# One pass: n messages as `mode` (batch|strict), message ids and versions
# continuing from `from` (so every message is new and the next version).
pass() { # mode from -> "start_lsn end_lsn"
    local mode=$1 from=$2 body
    if [[ $mode == batch ]]; then
        body="FOR b IN 0..$BATCHES - 1 LOOP
    PERFORM urutan_terapkan_batch((SELECT jsonb_agg(jsonb_build_object(
        'message_id', 'm' || i, 'id', 'E' || (i % $ORDERS), 'status', 'dibayar',
        'versi', i / $ORDERS + 1, 'data', '{\"catatan\": \"xxxxxxxxxxxxxxxxxxxx\"}'::jsonb) ORDER BY i)
      FROM generate_series($from + b * 128, $from + b * 128 + 127) i), 0);
    COMMIT;
  END LOOP;"
    else
        body="FOR i IN $from..$from + $STRICT - 1 LOOP
    PERFORM urutan_terapkan(jsonb_build_object(
        'message_id', 'm' || i, 'id', 'E' || (i % $ORDERS), 'status', 'dibayar',
        'versi', i / $ORDERS + 1, 'data', '{\"catatan\": \"xxxxxxxxxxxxxxxxxxxx\"}'::jsonb), 0);
    COMMIT;
  END LOOP;"
    fi
    psql "$PGURL/$db" -qAt -v ON_ERROR_STOP=1 -c "CHECKPOINT" \
        -c "SELECT pg_current_wal_lsn()" -c "DO \$\$ BEGIN $body END \$\$" \
        -c "SELECT pg_current_wal_lsn()" | paste -sd' '
}

report() { # mode messages start end
    local mode=$1 n=$2
    echo
    echo "## $mode: $n messages ($3 → $4)"
    "$waldump" -p "$wal_dir" -s "$3" -e "$4" --stats=record 2>/dev/null |
        awk -v n="$n" '
        /^Type/ || /^ *-/ || /^WAL statistics/ { next }
        {
            # Type N (%) record-size (%) FPI-size (%) combined-size (%)
            gsub(/\([^)]*\)|\[[^]]*\]/, "")
            if (NF < 5 || $2 == 0) next
            printf "%-22s %7.3f records/msg %7.1f B/msg in records %7.1f B/msg in full-page images\n", $1, $2 / n, $3 / n, $4 / n
        }'
}

psql "$PGURL/$db" -qc "INSERT INTO pesanan (id, status, versi) SELECT 'E' || g, 'dibuat', 0 FROM generate_series(0, $ORDERS - 1) g"
batch_n=$((BATCHES * 128))
echo "# WAL per message: $ORDERS orders, batch: $BATCHES × 128, strict: $STRICT × 1; after a CHECKPOINT"
pass batch 0 >/dev/null
read -r s e < <(pass batch "$batch_n")
report "batch (urutan_terapkan_batch, 128 per transaction)" "$batch_n" "$s" "$e"
from=$((2 * batch_n))
pass strict "$from" >/dev/null
read -r s e < <(pass strict $((from + STRICT)))
report "strict (urutan_terapkan, 1 per transaction)" "$STRICT" "$s" "$e"
n=$(psql "$PGURL/$db" -qAt -c "SELECT count(*) FROM pesanan_riwayat")
expected=$((2 * batch_n + 2 * STRICT))
[[ $n == "$expected" ]] || { echo "expected $expected history rows, got $n" >&2; exit 1; }
echo
echo "check: $n history rows, every message applied"
