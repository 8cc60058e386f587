#!/usr/bin/env bash
# Start a private RabbitMQ node (port 5673) and PostgreSQL cluster (port 5433)
# for the fault soak, so it can stop and restart them without disturbing the
# shared services other runs use. Idempotent; they are reused by later runs.
# Prints the exports to use:
#
#   eval "$(bash benches/faults/private-services.sh)"
#   cargo bench --bench faults -- --faults 100
#
# --pair: the database is a primary (5445) with a synchronous streaming
# standby (5446) instead (deploy/postgres/pair.sh up --sync), for the
# database failover kind:
#
#   eval "$(bash benches/faults/private-services.sh --pair)"
#   cargo bench --bench faults -- --pair --faults 30
#
# --down: stop and remove all of them (the node and its data, the 5433
# cluster, the pair): nothing is left behind.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
pair_script=$root/deploy/postgres/pair.sh
base=/var/lib/rabbitmq/faults
pg_version=$(ls /etc/postgresql | sort -V | tail -1)
mode=${1:-}
case $mode in
"" | --pair | --down) ;;
*)
    echo "usage: private-services.sh [--pair | --down]" >&2
    exit 2
    ;;
esac

if [[ $mode == --down ]]; then
    if rabbitmqctl -n faults@localhost status >/dev/null 2>&1; then
        timeout 120 rabbitmqctl -n faults@localhost stop >/dev/null
    fi
    rm -rf "$base"
    if pg_lsclusters -h | awk '{print $2}' | grep -qx faults; then
        pg_dropcluster --stop "$pg_version" faults
    fi
    bash "$pair_script" down >/dev/null
    echo "private-services: the node faults@localhost, the cluster $pg_version/faults and the pair are gone" >&2
    exit 0
fi

if [[ $mode == --pair ]]; then
    # Its progress to stderr: stdout is for eval.
    bash "$pair_script" up --sync >&2
elif ! pg_lsclusters -h | awk '{print $2}' | grep -qx faults; then
    pg_createcluster "$pg_version" faults -p 5433 -- --auth=trust >/dev/null
fi
if [[ $mode != --pair ]]; then
    pg_ctlcluster --skip-systemctl-redirect "$pg_version" faults start >/dev/null 2>&1 || true
fi

mkdir -p "$base"
echo '[rabbitmq_consistent_hash_exchange].' > "$base/enabled_plugins"
# Its own config: the machine's rabbitmq.conf may pin the listener to 5672.
echo 'listeners.tcp.local = 127.0.0.1:5673' > "$base/rabbitmq.conf"
chown -R rabbitmq:rabbitmq "$base" 2>/dev/null || true
export RABBITMQ_NODENAME=faults@localhost RABBITMQ_NODE_PORT=5673 \
    RABBITMQ_DIST_PORT=25673 RABBITMQ_MNESIA_BASE="$base/mnesia" \
    RABBITMQ_LOG_BASE="$base/log" RABBITMQ_PID_FILE="$base/faults.pid" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$base/enabled_plugins" \
    RABBITMQ_CONFIG_FILE="$base/rabbitmq.conf"
if ! rabbitmqctl -n faults@localhost status >/dev/null 2>&1; then
    rabbitmq-server -detached >/dev/null 2>&1
    rabbitmqctl -n faults@localhost wait "$base/faults.pid" --timeout 120 >/dev/null
fi

cat <<OUT
export FAULTS_AMQP_BASE=amqp://guest:guest@127.0.0.1:5673
export FAULTS_RABBITMQCTL="rabbitmqctl -n faults@localhost"
OUT
if [[ $mode == --pair ]]; then
    echo "export FAULTS_PG_PAIR=$pair_script"
    echo "unset FAULTS_PG_BASE FAULTS_PG_CTL"
else
    cat <<OUT
export FAULTS_PG_BASE=postgres://postgres@127.0.0.1:5433
export FAULTS_PG_CTL="pg_ctlcluster --skip-systemctl-redirect $pg_version faults"
unset FAULTS_PG_PAIR
OUT
fi
