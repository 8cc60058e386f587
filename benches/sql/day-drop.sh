#!/usr/bin/env bash
# Expiring one UTC day of a team that runs urutan at 2,000 msg/s (issue 33):
# a day of ROWS dedup rows and ROWS history rows (default 172,800,000 each:
# 2,000 × 86,400), in the day partitions urutan creates
# (urutan_partisi_buat), expired as the pool's retention does it
# (migration 0036: urutan_partisi_lepas detaches, then urutan_partisi_hapus
# drops, each its own transaction; WAY=drop: urutan_partisi_buang, the
# previous way, one DROP under the parent's lock), while a strict-mode load
# applies messages.
#
#   bash benches/sql/day-drop.sh                  # the full day: ~45 GiB of disk, ~40 min
#   ROWS=5000000 bash benches/sql/day-drop.sh     # a quick look
#   WAY=drop bash benches/sql/day-drop.sh         # the previous way: urutan_partisi_buang
#
# It changes nothing on the machine but a scratch database, dropped at the
# end (it needs free disk for the day: about 270 bytes per row pair).
#
# Steps:
# 1. A scratch database with every migration; the partitions of a day 40
#    days ago (past DEDUP_RETENTION's 30 days), filled in bulk without their
#    indexes, which are then built as urutan_partisi_buat names them;
#    ANALYZE, CHECKPOINT.
# 2. Three times, LOAD_SECS each: pgbench applies one message per transaction
#    (`urutan_terapkan`, new message ids, versions moving forward) at RATE
#    per second from 4 clients, with synchronous_commit on, as a strict-mode
#    worker does. The first and the last run drop nothing; in the second, at DROP_AT
#    seconds, the day is expired for both tables (each call timed, its
#    commit and lock wait included), then a CHECKPOINT is timed (PostgreSQL removes a dropped table's first file at
#    the next checkpoint).
# 3. Latency per transaction from pgbench's log: p50/p99/max of each run,
#    and of the DROP_WINDOW seconds from DROP_AT in each (the same seconds
#    of the runs without the drop).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ROWS=${ROWS:-172800000} CHUNK=${CHUNK:-20000000} ORDERS=${ORDERS:-10000000}
WAY=${WAY:-detach} RATE=${RATE:-800} LOAD_SECS=${LOAD_SECS:-30} DROP_AT=${DROP_AT:-10} DROP_WINDOW=${DROP_WINDOW:-5}
db=urutan_daydrop_$$ work=$(mktemp -d)
psql "$PGURL/postgres" -qc "CREATE DATABASE $db"
trap 'psql "$PGURL/postgres" -qc "DROP DATABASE IF EXISTS $db" >/dev/null; rm -rf "$work"' EXIT
sql() { psql "$PGURL/$db" -qAt -v ON_ERROR_STOP=1 "$@"; }
for f in migrations/*.sql; do sql -f "$f" >/dev/null; done
sql -c "SELECT urutan_partisi_siapkan(7)" >/dev/null
day=$(sql -c "SELECT (now() AT TIME ZONE 'UTC')::date - 40")
tag=$(date -u -d "$day" +%Y%m%d)
dedup=pesan_diproses_h$tag history=pesanan_riwayat_h$tag

echo "day-drop: $ROWS dedup + $ROWS history rows on $day, load $RATE/s for ${LOAD_SECS}s, drop at ${DROP_AT}s"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), $(psql "$PGURL/postgres" -qAt -c 'SHOW server_version'), commit $(git rev-parse --short=12 HEAD)"

# 1. The day, bulk-loaded: the partitions as urutan makes them, indexes
# dropped for the load and built after under the same names.
sql -c "SELECT urutan_partisi_buat('pesan_diproses', '$day'), urutan_partisi_buat('pesanan_riwayat', '$day')" >/dev/null
sql -c "DROP INDEX ${dedup}_message_id, ${history}_seq, ${history}_pesanan_versi"
began=$SECONDS
# Row i: order H-<i mod ORDERS>, version i div ORDERS + 1, at i × 86,400 / ROWS s into the day.
rows() { # from to: the generated rows
    echo "SELECT i, 'H-' || lpad((i % $ORDERS)::text, 9, '0') AS pesanan_id, i / $ORDERS + 1 AS versi,
            '$day'::timestamp AT TIME ZONE 'UTC' + make_interval(secs => i * 86400.0 / $ROWS) AS pada
     FROM generate_series($1::bigint, $2::bigint - 1) i"
}
for ((a = 0; a < ROWS; a += CHUNK)); do
    b=$((a + CHUNK < ROWS ? a + CHUNK : ROWS))
    sql -c "SET synchronous_commit = off" -c "
INSERT INTO $dedup (message_id, diproses_pada, pesanan_id)
SELECT r.pesanan_id || '-v' || r.versi, r.pada, r.pesanan_id FROM ($(rows "$a" "$b")) r" -c "
INSERT INTO $history (seq, pesanan_id, versi, status, message_id, shard, diterapkan_pada)
SELECT r.i + 1, r.pesanan_id, r.versi, (ARRAY['dibuat','dibayar','dikirim','selesai'])[(r.versi - 1) % 4 + 1],
       r.pesanan_id || '-v' || r.versi, (r.i % $ORDERS) % 4, r.pada FROM ($(rows "$a" "$b")) r"
    echo "  rows $a..$b loaded, $((SECONDS - began)) s so far"
done
sql -c "SET maintenance_work_mem = '1GB'" \
    -c "CREATE UNIQUE INDEX ${dedup}_message_id ON $dedup (message_id)" \
    -c "CREATE UNIQUE INDEX ${history}_seq ON $history (seq)" \
    -c "CREATE UNIQUE INDEX ${history}_pesanan_versi ON $history (pesanan_id, versi)"
sql -c "SELECT setval('pesanan_riwayat_seq_seq', $ROWS)" -c "ANALYZE" -c "CHECKPOINT" >/dev/null
echo "  indexes built, ANALYZE and CHECKPOINT done: $((SECONDS - began)) s"
sizes=$(sql -F' ' -c "SELECT c, pg_total_relation_size(c), pg_relation_size(c) FROM unnest(ARRAY['$dedup', '$history']::regclass[]) c")
echo "$sizes" | awk '{ printf "  %s: %.2f GiB (heap %.2f GiB)\n", $1, $2 / 2^30, $3 / 2^30 }'
total_bytes=$(echo "$sizes" | awk '{ s += $2 } END { print s }')

# 2. The load, without and with the drop.
cat > "$work/apply.sql" <<'EOF'
\set e random(1, 200000)
SELECT urutan_terapkan(gen_random_uuid()::text, 'L-' || :e, 'dibayar', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, NULL::jsonb, 0);
EOF
load() { # name: pgbench's per-transaction log in $work/name.*
    pgbench -n -c 4 -j 2 -R "$RATE" -T "$LOAD_SECS" -f "$work/apply.sql" -l --log-prefix="$work/log-$1" \
        "$PGURL/$db" > "$work/out-$1.txt" 2>&1
}
load plain
start=$(date +%s.%N)
load dropped &
loader=$!
sleep "$DROP_AT"
drop_at=$(date +%s.%N)
if [[ $WAY == detach ]]; then
    steps=("SELECT * FROM urutan_partisi_lepas('pesan_diproses', interval '30 days')"
           "SELECT * FROM urutan_partisi_lepas('pesanan_riwayat', interval '30 days')"
           "SELECT * FROM urutan_partisi_hapus('pesan_diproses')"
           "SELECT * FROM urutan_partisi_hapus('pesanan_riwayat')")
else
    steps=("SELECT * FROM urutan_partisi_buang('pesan_diproses', interval '30 days')"
           "SELECT * FROM urutan_partisi_buang('pesanan_riwayat', interval '30 days')")
fi
steps+=("CHECKPOINT")
for step in "${steps[@]}"; do
    printf '%s\n' '\timing on' "$step;" | psql "$PGURL/$db" -qAt -v ON_ERROR_STOP=1 |
        awk -v step="$step" '/^Time:/ { ms = $2 } /\|/ { split($0, f, "|"); rows = rows " " f[1] " (" f[2] " rows)" }
                             END { printf "%s|%s|%s\n", step, ms, rows }' >> "$work/drop.out"
done
wait "$loader"
load after
left=$(sql -c "SELECT count(*) FROM pg_class WHERE relname IN ('$dedup', '$history')")
[[ $left == 0 ]] || { echo "the day's tables are still there" >&2; exit 1; }

# 3. Figures.
echo
echo "expiry, $WAY (psql \\timing of each call: its commit and lock waits included):"
awk -F'|' '{ printf "  %-78s %10.1f ms %s\n", $1, $2, $3 }' "$work/drop.out"
drop_ms=$(awk -F'|' '$1 != "CHECKPOINT" { s += $2 } END { print s }' "$work/drop.out")
echo "  all calls but the CHECKPOINT: $drop_ms ms for $(awk -v b="$total_bytes" 'BEGIN { printf "%.1f GiB", b / 2^30 }') of table and index"
offset=$(awk -v s="$start" -v d="$drop_at" 'BEGIN { printf "%.3f", d - s }')
stats() { # name from to (seconds into the run, -1: all) -> "n p50 p99 max" in ms
    cat "$work/log-$1".* | awk -v from="$2" -v to="$3" '
        NR == 1 { t0 = $5 + $6 / 1e6 }
        { t = $5 + $6 / 1e6; if (t < t0) t0 = t; row[NR] = t; lat[NR] = $3 / 1000 }
        END { for (i = 1; i <= NR; i++) { s = row[i] - t0; if (from < 0 || (s >= from && s < to)) print lat[i] } }' |
        sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) { print 0, 0, 0, 0; exit }
            i = int(NR * 0.99); if (i < 1) i = 1; printf "%d %.2f %.2f %.2f\n", NR, v[int((NR + 1) / 2)], v[i], v[NR] }'
}
echo
echo "apply latency (pgbench, one urutan_terapkan per transaction; ms):"
printf '  %-40s %7s %7s %7s %8s\n' window transactions p50 p99 max
read -r n1 p50a p99a maxa < <(stats plain -1 0)
read -r n2 p50b p99b maxb < <(stats dropped -1 0)
from=$(awk -v o="$offset" 'BEGIN { printf "%.1f", o }') to=$(awk -v o="$offset" -v w="$DROP_WINDOW" 'BEGIN { printf "%.1f", o + w }')
read -r n3 p50c p99c maxc < <(stats plain "$from" "$to")
read -r n4 p50d p99d maxd < <(stats dropped "$from" "$to")
read -r n5 p50e p99e maxe < <(stats after -1 0)
read -r n6 p50f p99f maxf < <(stats after "$from" "$to")
printf '  %-40s %7s %7s %7s %8s\n' "whole run, no drop (before)" "$n1" "$p50a" "$p99a" "$maxa" \
    "whole run, day dropped" "$n2" "$p50b" "$p99b" "$maxb" \
    "whole run, no drop (after)" "$n5" "$p50e" "$p99e" "$maxe" \
    "${from}-${to} s, no drop (before)" "$n3" "$p50c" "$p99c" "$maxc" \
    "${from}-${to} s, the drop's seconds" "$n4" "$p50d" "$p99d" "$maxd" \
    "${from}-${to} s, no drop (after)" "$n6" "$p50f" "$p99f" "$maxf"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b / a }'; }
echo "  p99 with the drop / without (before, after): whole run $(ratio "$p99a" "$p99b")×, $(ratio "$p99e" "$p99b")×;" \
    "its ${DROP_WINDOW} s $(ratio "$p99c" "$p99d")×, $(ratio "$p99f" "$p99d")×"
for run in plain dropped after; do
    grep -h -E "^(number of failed|latency average|tps)" "$work/out-$run.txt" | sed "s/^/  $run: /"
done
