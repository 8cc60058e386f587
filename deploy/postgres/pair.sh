#!/usr/bin/env bash
# A PostgreSQL primary with a streaming standby on this machine, from Debian's
# own packages (postgresql-common's pg_createcluster / pg_ctlcluster), for
# trying a database failover (tests/it/failover.rs).
#
#   pair.sh up [--sync|--async] [--replication-port P]
#       create and start both clusters (a no-op if they already run as a
#       healthy pair; the replication mode is applied either way). --sync
#       (default): synchronous_standby_names='*', synchronous_commit=on, so a
#       commit returns only once the standby has its WAL. --async: commits do
#       not wait for the standby. --replication-port P: the standby streams
#       from 127.0.0.1:P instead of the primary's port (a test puts a proxy
#       there to cut or delay the replication link).
#   pair.sh kill-primary   stop the primary at once (`-m immediate`: a crash)
#   pair.sh promote        promote the standby (waits until it accepts writes)
#   pair.sh status         both clusters, their role and the replication state
#   pair.sh down           stop and drop both clusters; nothing is left behind
#
# Both clusters are owned by `postgres`, listen on 127.0.0.1 only, trust every
# local connection (a test fixture, never a production setup), and are not
# started at boot (start.conf manual). Ports: PAIR_PRIMARY_PORT (5445) and
# PAIR_STANDBY_PORT (5446); cluster names urutan-primary and urutan-standby.
# Runs as root; every wait is bounded (PAIR_WAIT_SECS, 60).
set -euo pipefail

PRIMARY=urutan-primary
STANDBY=urutan-standby
PRIMARY_PORT=${PAIR_PRIMARY_PORT:-5445}
STANDBY_PORT=${PAIR_STANDBY_PORT:-5446}
WAIT_SECS=${PAIR_WAIT_SECS:-60}
SLOT=urutan_standby
CONF_FILE=urutan-pair.conf

log() { printf 'pair: %s\n' "$*"; }
die() {
    printf 'pair: %s\n' "$*" >&2
    exit 1
}

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
    exit "${1:-0}"
}

[[ $(id -u) -eq 0 ]] || die "run this as root (it creates PostgreSQL clusters with pg_createcluster)"
command -v pg_createcluster >/dev/null 2>&1 ||
    die "pg_createcluster not found: install Debian's postgresql package"

# The newest installed PostgreSQL major version (PAIR_PG_VERSION overrides).
VERSION=${PAIR_PG_VERSION:-$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -n | tail -1)}
[[ -n $VERSION && -x /usr/lib/postgresql/$VERSION/bin/pg_basebackup ]] ||
    die "no PostgreSQL server binaries under /usr/lib/postgresql"
BIN=/usr/lib/postgresql/$VERSION/bin

exists() { [[ -d /etc/postgresql/$VERSION/$1 ]]; }
running() { pg_ctlcluster --skip-systemctl-redirect "$VERSION" "$1" status >/dev/null 2>&1; }
ctl() { pg_ctlcluster --skip-systemctl-redirect "$VERSION" "$@"; }
# psql as postgres on 127.0.0.1:PORT, unaligned, no headers, one try of 5 s.
q() {
    local port=$1
    shift
    PGCONNECT_TIMEOUT=5 runuser -u postgres -- psql -X -qAt -h 127.0.0.1 -p "$port" -d postgres \
        -v ON_ERROR_STOP=1 -c "$*"
}

# wait_until WHAT COMMAND...: retries COMMAND every 0.2 s for WAIT_SECS.
wait_until() {
    local what=$1 deadline=$((SECONDS + WAIT_SECS))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "timed out after ${WAIT_SECS}s waiting for ${what}"
        sleep 0.2
    done
}

ready() { "$BIN/pg_isready" -q -h 127.0.0.1 -p "$1"; }
in_recovery() { [[ $(q "$1" 'SELECT pg_is_in_recovery()') == "$2" ]]; }
streaming() { [[ $(q "$PRIMARY_PORT" "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'") -ge 1 ]]; }

# The replication mode, in a file of the primary's own conf.d (never in
# postgresql.auto.conf: pg_basebackup would copy that to the standby, and a
# promoted standby that waits for a synchronous standby of its own would
# hang every commit).
set_mode() {
    local mode=$1 names
    [[ $mode == sync ]] && names="'*'" || names="''"
    cat >"/etc/postgresql/$VERSION/$PRIMARY/conf.d/$CONF_FILE" <<EOF
# Written by deploy/postgres/pair.sh (mode: $mode).
synchronous_standby_names = $names
synchronous_commit = on
EOF
    chown postgres:postgres "/etc/postgresql/$VERSION/$PRIMARY/conf.d/$CONF_FILE"
    if running "$PRIMARY"; then
        ctl "$PRIMARY" reload >/dev/null
        wait_until "the primary to apply synchronous_standby_names = $names" \
            test "$(q "$PRIMARY_PORT" 'SHOW synchronous_standby_names')" == "${names//\'/}"
    fi
    log "replication mode: $mode"
}

create_cluster() {
    local name=$1 port=$2
    pg_createcluster --quiet --start-conf=manual -p "$port" "$VERSION" "$name" \
        -- --auth-local=trust --auth-host=trust >/dev/null
    cat >"/etc/postgresql/$VERSION/$name/conf.d/urutan-pair-base.conf" <<EOF
# Written by deploy/postgres/pair.sh.
listen_addresses = '127.0.0.1'
cluster_name = '$name'
wal_level = replica
max_wal_senders = 5
max_replication_slots = 5
hot_standby = on
wal_keep_size = '256MB'
EOF
    chown postgres:postgres "/etc/postgresql/$VERSION/$name/conf.d/urutan-pair-base.conf"
}

healthy_pair() {
    exists "$PRIMARY" && exists "$STANDBY" && running "$PRIMARY" && running "$STANDBY" &&
        in_recovery "$PRIMARY_PORT" f && in_recovery "$STANDBY_PORT" t && streaming
}

cmd_up() {
    local mode=sync repl_port=$PRIMARY_PORT
    while (($#)); do
        case $1 in
        --sync) mode=sync ;;
        --async) mode=async ;;
        --replication-port)
            [[ ${2:-} =~ ^[0-9]+$ ]] || die "--replication-port needs a port number"
            repl_port=$2
            shift
            ;;
        -h | --help) usage ;;
        *) die "unknown option for up: $1 (see pair.sh --help)" ;;
        esac
        shift
    done
    if healthy_pair; then
        local current
        current=$(q "$STANDBY_PORT" 'SHOW primary_conninfo')
        if [[ $current == *"port=$repl_port "* ]]; then
            log "the pair already runs (primary :$PRIMARY_PORT, standby :$STANDBY_PORT)"
            set_mode "$mode"
            return
        fi
        log "the pair runs with another replication port: recreating it"
    fi
    # Anything half made (an earlier run that died, a promoted standby) goes.
    cmd_down >/dev/null

    log "creating the primary $VERSION/$PRIMARY on :$PRIMARY_PORT"
    create_cluster "$PRIMARY" "$PRIMARY_PORT"
    set_mode "$mode"
    ctl "$PRIMARY" start
    wait_until "the primary to accept connections on :$PRIMARY_PORT" ready "$PRIMARY_PORT"

    log "creating the standby $VERSION/$STANDBY on :$STANDBY_PORT (pg_basebackup -R, slot $SLOT)"
    create_cluster "$STANDBY" "$STANDBY_PORT"
    local data=/var/lib/postgresql/$VERSION/$STANDBY
    find "$data" -mindepth 1 -delete
    # Straight from the primary's port: the copy does not depend on a proxy.
    timeout "$WAIT_SECS" runuser -u postgres -- "$BIN/pg_basebackup" -h 127.0.0.1 -p "$PRIMARY_PORT" \
        -U postgres -D "$data" -R -C -S "$SLOT" -X stream --checkpoint=fast ||
        die "pg_basebackup failed or took longer than ${WAIT_SECS}s"
    # -R wrote the primary's port into primary_conninfo; stream through
    # --replication-port instead (the last setting in the file wins, but one
    # line is clearer to read).
    sed -i '/^primary_conninfo/d' "$data/postgresql.auto.conf"
    echo "primary_conninfo = 'host=127.0.0.1 port=$repl_port user=postgres application_name=$STANDBY connect_timeout=5'" \
        >>"$data/postgresql.auto.conf"
    ctl "$STANDBY" start
    wait_until "the standby to accept connections on :$STANDBY_PORT" ready "$STANDBY_PORT"
    wait_until "the standby to stream from the primary (through :$repl_port)" streaming
    set_mode "$mode"
    log "up: primary 127.0.0.1:$PRIMARY_PORT, standby 127.0.0.1:$STANDBY_PORT streaming through :$repl_port ($mode)"
}

cmd_kill_primary() {
    exists "$PRIMARY" || die "no cluster $VERSION/$PRIMARY"
    if running "$PRIMARY"; then
        ctl "$PRIMARY" stop -m immediate
    fi
    log "primary stopped (immediate)"
}

cmd_promote() {
    exists "$STANDBY" || die "no cluster $VERSION/$STANDBY"
    running "$STANDBY" || die "the standby does not run"
    if in_recovery "$STANDBY_PORT" t; then
        # pg_ctl promote waits for the end of recovery (60 s at most).
        timeout "$WAIT_SECS" pg_ctlcluster --skip-systemctl-redirect "$VERSION" "$STANDBY" promote ||
            die "pg_ctlcluster promote failed or took longer than ${WAIT_SECS}s"
    fi
    wait_until "the promoted standby to accept writes" in_recovery "$STANDBY_PORT" f
    log "promoted: 127.0.0.1:$STANDBY_PORT is the primary now"
}

cmd_status() {
    local name port
    for name in "$PRIMARY" "$STANDBY"; do
        [[ $name == "$PRIMARY" ]] && port=$PRIMARY_PORT || port=$STANDBY_PORT
        if ! exists "$name"; then
            log "$name: absent"
        elif ! running "$name"; then
            log "$name (:$port): stopped"
        elif [[ $(q "$port" 'SELECT pg_is_in_recovery()') == t ]]; then
            log "$name (:$port): standby, received $(q "$port" 'SELECT pg_last_wal_receive_lsn()'), replayed $(q "$port" 'SELECT pg_last_wal_replay_lsn()')"
        else
            log "$name (:$port): primary at $(q "$port" 'SELECT pg_current_wal_lsn()'), synchronous_standby_names='$(q "$port" 'SHOW synchronous_standby_names')'"
            q "$port" "SELECT application_name, state, sync_state, replay_lsn FROM pg_stat_replication" |
                sed 's/^/pair:   replica /'
        fi
    done
}

cmd_down() {
    local name
    for name in "$STANDBY" "$PRIMARY"; do
        if exists "$name"; then
            if running "$name"; then
                ctl "$name" stop -m immediate || true
            fi
            pg_dropcluster "$VERSION" "$name"
            log "dropped $VERSION/$name"
        fi
        # pg_dropcluster removes the data, the configuration and the log; a
        # data directory left by an interrupted create goes too.
        rm -rf "/var/lib/postgresql/$VERSION/$name" "/etc/postgresql/$VERSION/$name"
        rm -f "/var/log/postgresql/postgresql-$VERSION-$name.log"*
    done
}

case ${1:-} in
up) shift && cmd_up "$@" ;;
kill-primary) cmd_kill_primary ;;
promote) cmd_promote ;;
status) cmd_status ;;
down) cmd_down ;;
-h | --help | help) usage ;;
*) usage 1 >&2 ;;
esac
