#!/usr/bin/env bash
# Make this Debian machine ready to build and run urutan: a C toolchain, the
# local RabbitMQ and PostgreSQL (Debian bookworm or later).
#
# Idempotent: installs only what is missing, starts only what is stopped, and
# takes a few seconds when everything is already up. Services are started
# without systemd, so they do not come back by themselves after a reboot:
# run this script again (demo.sh and test.sh do) and it starts what is stopped.
# Needs root; re-runs itself through sudo otherwise. Before it changes the
# machine it prints what it is about to change.
#
# Result:
# - gcc, libc6-dev (the C compiler and linker that rustc and the `ring` crate
#   need; rustup does not bring one) and ca-certificates (cargo's HTTPS to
#   the Rust crate registry) installed;
# - PostgreSQL 15+ accepting `psql -h 127.0.0.1 -U postgres` without a
#   password (loopback logins switched to `trust` in pg_hba.conf), database
#   `urutan` present;
# - RabbitMQ 3.10+ running with the plugin rabbitmq_consistent_hash_exchange
#   enabled (guest/guest on 127.0.0.1:5672), and rabbitmq_prometheus serving
#   the broker's metrics on 127.0.0.1:15692 (per-queue series on
#   /metrics/per-object; see deploy/prometheus/README.md).
set -euo pipefail

readonly DB_NAME=urutan
readonly PG_PORT=5432
readonly AMQP_PORT=5672
readonly PG_WAIT_SECS=60
readonly RMQ_WAIT_SECS=120
readonly PLUGINS=(rabbitmq_consistent_hash_exchange rabbitmq_prometheus)

log() { printf 'setup: %s\n' "$*"; }
warn() { printf 'setup: WARNING: %s\n' "$*" >&2; }
die() {
    printf 'setup: ERROR: %s\n' "$*" >&2
    exit 1
}

if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || die "must run as root (and sudo is not installed)"
    log "not root, re-running through sudo"
    exec sudo -- bash "$(readlink -f "${BASH_SOURCE[0]}")" "$@"
fi

# rabbitmqctl and friends live in /usr/sbin, which is not always on PATH.
export PATH="${PATH}:/usr/local/sbin:/usr/sbin:/sbin"
export DEBIAN_FRONTEND=noninteractive
# Never let psql stop and ask for a password: fail instead.
export PGCONNECT_TIMEOUT=5
unset PGPASSWORD PGHOST PGPORT PGUSER PGDATABASE PGSERVICE

# version_ge A B: true when version A >= version B.
version_ge() { [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]; }

# ---------------------------------------------------------------------------
# 1. what is missing, and what this run is about to change
# ---------------------------------------------------------------------------
have() { command -v "$1" >/dev/null 2>&1; }
pkg_installed() { [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]; }

pg_server_installed() {
    have pg_ctlcluster && [[ -d /etc/postgresql ]] &&
        compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null
}

# Building: rustc links through `cc`, and `ring` compiles C and assembly.
packages=()
have cc || packages+=(gcc)
pkg_installed libc6-dev || packages+=(libc6-dev)
# cargo fetches its registry over HTTPS and needs the CA bundle.
[[ -s /etc/ssl/certs/ca-certificates.crt ]] || packages+=(ca-certificates)
# Running: the two services and psql.
if ! have rabbitmq-server || ! have rabbitmqctl || ! have rabbitmq-plugins; then
    packages+=(rabbitmq-server)
fi
if ! pg_server_installed; then
    packages+=(postgresql)
fi
if ! have psql || ! have pg_isready; then
    packages+=(postgresql-client)
fi

pg_ready() { pg_isready -q -h 127.0.0.1 -p "$PG_PORT" -t 2; }
# psql as postgres over TCP on 127.0.0.1, never prompting (-w).
pg_tcp() { psql -w -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 "$@"; }
readonly HBA_MARKER='# urutan deploy/local/setup.sh: password-less loopback access'
rmq_running() { timeout 30 rabbitmqctl -q status >/dev/null 2>&1; }
plugin_file_has() { grep -qs -- "$1" /etc/rabbitmq/enabled_plugins; }

# The plan: one line per change, printed before any of them is made. Checks
# that need a running service assume the worst when it is not running yet.
plan=()
((${#packages[@]} == 0)) || plan+=("install Debian packages: ${packages[*]} (apt-get)")
if ! have pg_isready || ! pg_ready; then
    plan+=("start PostgreSQL on 127.0.0.1:${PG_PORT} with pg_ctlcluster, without systemd (creating the cluster if there is none)")
fi
if ! have psql || ! pg_ready || ! pg_tcp -tAc 'select 1' >/dev/null 2>&1; then
    if ! grep -qsxF "$HBA_MARKER" /etc/postgresql/*/*/pg_hba.conf; then
        plan+=("switch PostgreSQL logins from 127.0.0.1 and ::1 to 'trust' (no password, any user) at the top of pg_hba.conf")
    fi
fi
if ! have psql || ! pg_ready ||
    [[ "$(pg_tcp -tAc "select 1 from pg_database where datname = '${DB_NAME}'" 2>/dev/null)" != 1 ]]; then
    plan+=("create the database ${DB_NAME} if it does not exist")
fi
rmq_was_running=0
have rabbitmqctl && rmq_running && rmq_was_running=1
if ((!rmq_was_running)); then
    plan+=("start RabbitMQ with rabbitmq-server -detached, without systemd")
fi
for plugin in "${PLUGINS[@]}"; do
    plugin_file_has "$plugin" || plan+=("enable the RabbitMQ plugin ${plugin}")
done
if ((${#plan[@]} == 0)); then
    log "nothing to change"
else
    log "about to change this machine:"
    for item in "${plan[@]}"; do log "  - ${item}"; done
    if [[ "${plan[*]}" == *"without systemd"* ]]; then
        log "services started without systemd do not come back after a reboot: run this script again"
    fi
fi

if ((${#packages[@]} > 0)); then
    log "installing ${packages[*]}"
    apt-get update -q
    apt-get install -y -q "${packages[@]}"
else
    log "the C toolchain, ca-certificates, rabbitmq-server and postgresql are installed"
fi

# ---------------------------------------------------------------------------
# 2. PostgreSQL
# ---------------------------------------------------------------------------
# The cluster serving port 5432: "version name status", or empty.
pg_cluster_line() { pg_lsclusters -h 2>/dev/null | awk -v p="$PG_PORT" '$3 == p { print $1, $2, $4; exit }'; }

if pg_ready; then
    log "postgresql is accepting connections on 127.0.0.1:${PG_PORT}"
else
    line=$(pg_cluster_line)
    if [[ -z "$line" ]]; then
        ver=$(find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/postgres' |
            awk -F/ '{ print $5 }' | sort -V | tail -n1)
        [[ -n "$ver" ]] || die "no PostgreSQL server binaries under /usr/lib/postgresql"
        log "creating postgresql cluster ${ver}/main on port ${PG_PORT}"
        pg_createcluster --port "$PG_PORT" "$ver" main
        line=$(pg_cluster_line)
        [[ -n "$line" ]] || die "pg_createcluster did not produce a cluster on port ${PG_PORT}"
    fi
    read -r pg_ver pg_name pg_status <<<"$line"
    if [[ "$pg_status" == online* ]]; then
        log "postgresql ${pg_ver}/${pg_name} is running but not ready yet, waiting"
    else
        log "starting postgresql ${pg_ver}/${pg_name}"
        pg_ctlcluster --skip-systemctl-redirect "$pg_ver" "$pg_name" start
    fi
    deadline=$((SECONDS + PG_WAIT_SECS))
    until pg_ready; do
        ((SECONDS < deadline)) ||
            die "postgresql not accepting connections on 127.0.0.1:${PG_PORT} after ${PG_WAIT_SECS}s (see /var/log/postgresql/)"
        sleep 1
    done
    log "postgresql is accepting connections on 127.0.0.1:${PG_PORT}"
fi

# Password-less TCP access for postgres from localhost. A fresh Debian install
# uses scram-sha-256 for host connections; switch loopback to trust.
if ! pg_tcp -tAc 'select 1' >/dev/null 2>&1; then
    line=$(pg_cluster_line)
    [[ -n "$line" ]] || die "cannot connect as postgres and no local cluster serves port ${PG_PORT}"
    read -r pg_ver pg_name _ <<<"$line"
    hba=$(runuser -u postgres -- psql -X -p "$PG_PORT" -tAc 'show hba_file' 2>/dev/null || true)
    [[ -n "$hba" ]] || hba="/etc/postgresql/${pg_ver}/${pg_name}/pg_hba.conf"
    [[ -f "$hba" ]] || die "pg_hba.conf not found at ${hba}"
    if grep -qxF "$HBA_MARKER" "$hba"; then
        log "trust lines already in ${hba}; reloading"
    else
        log "adding loopback trust entries at the top of ${hba}"
        cp -p "$hba" "${hba}.urutan.bak"
        tmp=$(mktemp)
        {
            printf '%s\n' "$HBA_MARKER" \
                'host    all             all             127.0.0.1/32            trust' \
                'host    all             all             ::1/128                 trust' ''
            cat "$hba"
        } >"$tmp"
        cat "$tmp" >"$hba" # keeps owner and mode of the original
        rm -f "$tmp"
    fi
    pg_ctlcluster --skip-systemctl-redirect "$pg_ver" "$pg_name" reload
    deadline=$((SECONDS + 10))
    until pg_tcp -tAc 'select 1' >/dev/null 2>&1; do
        ((SECONDS < deadline)) || {
            pg_tcp -tAc 'select 1' || true
            die "psql -h 127.0.0.1 -U postgres still fails after editing ${hba}"
        }
        sleep 1
    done
fi

pg_num=$(pg_tcp -tAc 'show server_version_num')
pg_human=$(pg_tcp -tAc 'show server_version')
if ((pg_num < 150000)); then
    warn "PostgreSQL ${pg_human} is older than 15; urutan needs 15+"
else
    log "postgresql ${pg_human%% *} ok"
fi

if [[ "$(pg_tcp -tAc "select 1 from pg_database where datname = '${DB_NAME}'")" == 1 ]]; then
    log "database ${DB_NAME} exists"
else
    log "creating database ${DB_NAME}"
    pg_tcp -c "create database ${DB_NAME}"
fi

# ---------------------------------------------------------------------------
# 3. RabbitMQ
# ---------------------------------------------------------------------------
rmq_log=/var/log/rabbitmq/urutan-setup-start.log

if ((rmq_was_running)) || rmq_running; then
    log "rabbitmq node is running"
else
    # The default node name is rabbit@<short hostname>, which must resolve.
    if ! grep -qs '^ *NODENAME=' /etc/rabbitmq/rabbitmq-env.conf && ! getent hosts "$(hostname -s)" >/dev/null; then
        warn "hostname $(hostname -s) does not resolve; RabbitMQ may fail to start (set NODENAME=rabbit@localhost in /etc/rabbitmq/rabbitmq-env.conf)"
    fi
    log "starting rabbitmq (rabbitmq-server -detached)"
    mkdir -p /var/log/rabbitmq
    rabbitmq-server -detached >"$rmq_log" 2>&1 || {
        cat "$rmq_log" >&2
        die "rabbitmq-server -detached failed"
    }
fi

# Wait until the broker application (not just the Erlang node) is up. Right
# after -detached the node may not be reachable yet, so retry until the deadline.
deadline=$((SECONDS + RMQ_WAIT_SECS))
until timeout 30 rabbitmqctl -q await_startup --timeout 25 >/dev/null 2>&1; do
    ((SECONDS < deadline)) ||
        die "rabbitmq did not start within ${RMQ_WAIT_SECS}s (see /var/log/rabbitmq/ and ${rmq_log})"
    sleep 1
done
log "rabbitmq is up"

rmq_ver=$(rabbitmq-diagnostics -q server_version 2>/dev/null || rabbitmqctl version 2>/dev/null || true)
rmq_ver=${rmq_ver//[[:space:]]/}
if [[ -z "$rmq_ver" ]]; then
    warn "could not determine the RabbitMQ version; urutan needs 3.10+"
elif ! version_ge "$rmq_ver" 3.10; then
    warn "RabbitMQ ${rmq_ver} is older than 3.10; urutan needs 3.10+ (quorum queue delivery limits, at-least-once dead lettering)"
else
    log "rabbitmq ${rmq_ver} ok"
fi

for plugin in "${PLUGINS[@]}"; do
    if rabbitmq-plugins -q is_enabled "$plugin" >/dev/null 2>&1; then
        log "plugin ${plugin} is enabled"
    else
        log "enabling plugin ${plugin}"
        rabbitmq-plugins -q enable "$plugin" >/dev/null
        rabbitmq-plugins -q is_enabled "$plugin" >/dev/null 2>&1 ||
            die "plugin ${plugin} is still not enabled"
    fi
done

if ! timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/${AMQP_PORT}" 2>/dev/null; then
    warn "nothing accepts TCP connections on 127.0.0.1:${AMQP_PORT} (check listeners in /etc/rabbitmq/rabbitmq.conf)"
fi

log "ready: amqp://guest:guest@127.0.0.1:${AMQP_PORT}/%2f and postgres://postgres@127.0.0.1:${PG_PORT}/${DB_NAME}"
