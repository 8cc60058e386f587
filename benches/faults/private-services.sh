#!/usr/bin/env bash
# Start a private RabbitMQ node (port 5673) and PostgreSQL cluster (port 5433)
# for the fault soak, so it can stop and restart them without disturbing the
# shared services other runs use. Idempotent. Prints the exports to use:
#
#   eval "$(bash benches/faults/private-services.sh)"
#   cargo bench --bench faults -- --faults 100
set -euo pipefail

pg_version=$(ls /etc/postgresql | sort -V | tail -1)
if ! pg_lsclusters -h | awk '{print $2}' | grep -qx faults; then
    pg_createcluster "$pg_version" faults -p 5433 -- --auth=trust >/dev/null
fi
pg_ctlcluster --skip-systemctl-redirect "$pg_version" faults start >/dev/null 2>&1 || true

base=/var/lib/rabbitmq/faults
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
export FAULTS_PG_BASE=postgres://postgres@127.0.0.1:5433
export FAULTS_RABBITMQCTL="rabbitmqctl -n faults@localhost"
export FAULTS_PG_CTL="pg_ctlcluster --skip-systemctl-redirect $pg_version faults"
OUT
