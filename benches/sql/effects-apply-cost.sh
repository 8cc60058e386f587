#!/usr/bin/env bash
# What effects cost the apply transaction, inside PostgreSQL: APPLIES strict
# applies (`urutan_terapkan`, 2,000 orders, every message a new version) in
# one PL/pgSQL block, in one scratch database, alternating, ROUNDS times:
#   off:       no routes (EFFECTS unset: the trigger finds none and returns)
#   effects:   one route '*' (an effect per applied version), without the
#              schedule trigger of migration 0011
#   scheduled: the same with it (the order's row inserted or locked)
#
#   bash benches/sql/effects-apply-cost.sh     # ROUNDS=5 APPLIES=20000
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ROUNDS=${ROUNDS:-5} APPLIES=${APPLIES:-20000}
db=urutan_effectcost_$$
psql "$PGURL/postgres" -qc "CREATE DATABASE $db"
trap 'psql "$PGURL/postgres" -qc "DROP DATABASE IF EXISTS $db" >/dev/null' EXIT
for f in migrations/*.sql; do psql "$PGURL/$db" -q -v ON_ERROR_STOP=1 -f "$f"; done
psql "$PGURL/$db" -q -v ON_ERROR_STOP=1 \
    -c "INSERT INTO urutan_efek_tujuan (url) VALUES ('http://127.0.0.1:9/pay')"

run() { # off|effects|scheduled -> milliseconds
    local setup
    case $1 in
    off) setup="DELETE FROM urutan_efek_rute" ;;
    effects) setup="INSERT INTO urutan_efek_rute VALUES ('*', 1) ON CONFLICT DO NOTHING;
                    ALTER TABLE urutan_efek DISABLE TRIGGER urutan_efek_kepala_baru" ;;
    scheduled) setup="INSERT INTO urutan_efek_rute VALUES ('*', 1) ON CONFLICT DO NOTHING;
                      ALTER TABLE urutan_efek ENABLE TRIGGER urutan_efek_kepala_baru" ;;
    esac
    psql "$PGURL/$db" -qAt -v ON_ERROR_STOP=1 \
        -c "TRUNCATE pesanan, pesan_diproses, pesanan_riwayat, urutan_efek, urutan_efek_kepala" \
        -c "$setup" -c "VACUUM ANALYZE" -c '\timing on' -c "
DO \$\$
BEGIN
  FOR i IN 0..$APPLIES - 1 LOOP
    PERFORM urutan_terapkan(jsonb_build_object('message_id', 'm' || i, 'id', 'E' || (i % 2000),
                            'status', 'dibayar', 'versi', i / 2000 + 1,
                            'data', '{\"catatan\": \"xxxxxxxxxxxxxxxxxxxx\"}'::jsonb), 0);
  END LOOP;
END \$\$;" -c '\timing off' \
        -c "SELECT 'check', (SELECT count(*) FROM pesanan_riwayat), (SELECT count(*) FROM urutan_efek)" |
        awk -F'|' '/^Time:/ { sub(/^Time: /, ""); split($0, t, " "); ms = t[1] }
                   /^check/ { rows = $2; effects = $3 }
                   END { print ms, rows, effects }'
}

echo "effects on the apply path: $APPLIES applies per run, $ROUNDS rounds"
printf '%-6s %-10s %10s %8s %8s\n' round variant ms applied effects
for round in $(seq 1 "$ROUNDS"); do
    for variant in off effects scheduled; do
        read -r ms rows effects < <(run $variant)
        printf '%-6s %-10s %10.0f %8s %8s\n' "$round" "$variant" "$ms" "$rows" "$effects"
    done
done
