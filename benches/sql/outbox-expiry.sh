#!/usr/bin/env bash
# Expiring 5 million sent outbox rows (1.25 GB with indexes): their
# id-range partition detached, then dropped, as the pool does it (migration
# 0036: urutan_partisi_id_lepas, checks included, then urutan_partisi_hapus;
# WAY=drop for migration 0033's urutan_partisi_id_buang, one DROP under the
# parent's lock), against the DELETE loop of 5,000 rows per statement that
# the relay ran before. Uses a scratch database of its own, dropped at the end.
#   bash benches/sql/outbox-expiry.sh
#   WAY=drop bash benches/sql/outbox-expiry.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
P="psql -h 127.0.0.1 -U postgres -v ON_ERROR_STOP=1 -q"
db=urutan_outboxexpiry_$$
$P -c "CREATE DATABASE $db"
trap '$P -c "DROP DATABASE IF EXISTS $db" >/dev/null' EXIT
for f in migrations/*.sql; do $P -d $db -1 -f $f >/dev/null 2>&1 || { echo FAIL $f; exit 1; }; done
$P -d $db -c "\timing on" -c "insert into outbox (agregat_tipe, agregat_id, routing_key, payload, dibuat_pada, dikirim_pada) select 'pesanan', 'O'||g, 'pesanan.jakarta.bench', jsonb_build_object('id','O'||g,'status','dibayar','versi',g,'data',jsonb_build_object('total', g, 'kota','jakarta')), now()-interval '8 days', now()-interval '8 days' from generate_series(1,5000000) g" -c "select setval('outbox_id_seq', (1<<24)+10)" -c "select urutan_partisi_id_siapkan()" -c "vacuum analyze outbox" -c "checkpoint" -c "select pg_size_pretty(pg_total_relation_size('outbox_p1'))"
if [[ ${WAY:-detach} == drop ]]; then
    echo "--- drop (urutan_partisi_id_buang)"
    $P -d $db -c "\timing on" -c "select * from urutan_partisi_id_buang('outbox', '7 days')"
else
    echo "--- detach (urutan_partisi_id_lepas), then drop (urutan_partisi_hapus)"
    $P -d $db -c "\timing on" -c "select * from urutan_partisi_id_lepas('outbox', '7 days')" -c "select * from urutan_partisi_hapus('outbox')"
fi
echo "--- delete of the same rows (refill, then DELETE in batches of 5000 as before 0033)"
$P -d $db -c "select urutan_partisi_id_buat('outbox', 1, (1<<24)+1)" -c "insert into outbox (id, agregat_tipe, agregat_id, routing_key, payload, dibuat_pada, dikirim_pada) select g, 'pesanan', 'O'||g, 'pesanan.jakarta.bench', jsonb_build_object('id','O'||g,'status','dibayar','versi',g,'data',jsonb_build_object('total', g, 'kota','jakarta')), now()-interval '8 days', now()-interval '8 days' from generate_series(1,5000000) g" -c "vacuum analyze outbox" -c "checkpoint"
s=$(date +%s.%N)
while :; do n=$($P -d $db -At -c "with d as (DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE dikirim_pada < now() - interval '7 days' LIMIT 5000 FOR UPDATE SKIP LOCKED) returning 1) select count(*) from d"); [ "$n" -lt 5000 ] && break; done
e=$(date +%s.%N); awk -v s="$s" -v e="$e" 'BEGIN { printf "delete loop: %.1f s\n", e - s }'
