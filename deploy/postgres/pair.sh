#!/usr/bin/env bash
# A PostgreSQL primary with a streaming standby on this machine, from Debian's
# own packages (postgresql-common's pg_createcluster / pg_ctlcluster), for
# trying database failovers (tests/it/failover.rs, and the fault suite's
# pair mode: urutan_testkit::faults::services).
#
#   pair.sh up [--sync|--async] [--replication-port P]
#       create and start both clusters (a no-op if they already run as a
#       healthy pair, in either layout, streaming through the same port; the
#       replication mode is applied either way). --sync (default):
#       synchronous_standby_names='*', synchronous_commit=on, so a commit
#       returns only once the standby has its WAL. --async: commits do not
#       wait for the standby. --replication-port P: the standby streams from
#       127.0.0.1:P instead of the primary's port (a test puts a proxy there
#       to cut or delay the replication link). A pair made anew has its
#       primary on PAIR_PRIMARY_PORT.
#   pair.sh kill-primary   stop the current primary at once (`-m immediate`: a crash)
#   pair.sh promote        promote the standby (refused while the primary
#                          still runs; waits until it accepts writes): it is
#                          the primary from now on
#   pair.sh rejoin         after a promote: make the old primary a standby of
#                          the new one (pg_rewind, or a fresh pg_basebackup if
#                          that fails), wait until it streams, then apply the
#                          pair's replication mode to the new primary, so the
#                          next failover has a standby again
#   pair.sh primary-port   print the port of the current primary
#   pair.sh ctl ACTION     pg_ctlcluster ACTION (stop, start or restart) on
#                          the current primary
#   pair.sh status         both clusters, their role and the replication state
#   pair.sh down           stop and drop both clusters; nothing is left
#                          behind (a no-op when there is no pair)
#
# Both clusters are owned by `postgres`, listen on 127.0.0.1 only, trust every
# local connection (a test fixture, never a production setup), and are not
# started at boot (start.conf manual). Ports: PAIR_PRIMARY_PORT (5445, cluster
# urutan-primary) and PAIR_STANDBY_PORT (5446, cluster urutan-standby), the
# layout `up` makes; after a failover the roles are swapped. Which cluster is
# the primary now, and the replication mode, are in the state file
# /var/lib/postgresql/urutan-pair.state (written by up, promote and rejoin).
# Runs as root; every wait is bounded (PAIR_WAIT_SECS, 60).
set -euo pipefail

A=urutan-primary
B=urutan-standby
A_PORT=${PAIR_PRIMARY_PORT:-5445}
B_PORT=${PAIR_STANDBY_PORT:-5446}
WAIT_SECS=${PAIR_WAIT_SECS:-60}
SLOT=urutan_standby
CONF_FILE=urutan-pair.conf
STATE=/var/lib/postgresql/urutan-pair.state

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
ctl() { timeout "$WAIT_SECS" pg_ctlcluster --skip-systemctl-redirect "$VERSION" "$@"; }
port_of() { if [[ $1 == "$A" ]]; then echo "$A_PORT"; else echo "$B_PORT"; fi; }
other() { if [[ $1 == "$A" ]]; then echo "$B"; else echo "$A"; fi; }
datadir() { echo "/var/lib/postgresql/$VERSION/$1"; }

# state KEY: a value of the state file (primary=NAME, mode=sync|async);
# without the file, the layout `up` makes.
state() {
    local value=
    if [[ -f $STATE ]]; then
        value=$(sed -n "s/^$1=//p" "$STATE")
    fi
    if [[ -z $value ]]; then
        if [[ $1 == primary ]]; then value=$A; else value=sync; fi
    fi
    echo "$value"
}
write_state() {
    printf 'primary=%s\nmode=%s\n' "$1" "$2" >"$STATE.tmp"
    mv "$STATE.tmp" "$STATE"
}

# psql as postgres on 127.0.0.1:PORT, unaligned, no headers, one try of 5 s,
# a statement at most 10 s.
q() {
    local port=$1
    shift
    PGCONNECT_TIMEOUT=5 PGOPTIONS='-c statement_timeout=10s' timeout 20 \
        runuser -u postgres -- psql -X -qAt -h 127.0.0.1 -p "$port" -d postgres \
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

# within SECS COMMAND...: whether COMMAND succeeds within SECS (every 0.2 s).
within() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

ready() { "$BIN/pg_isready" -q -h 127.0.0.1 -p "$1"; }
in_recovery() { [[ $(q "$1" 'SELECT pg_is_in_recovery()') == "$2" ]]; }
# streaming PRIMARY_PORT: a standby streams from that primary.
streaming() { [[ $(q "$1" "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'") -ge 1 ]]; }

# set_mode MODE: the replication mode, in a file of the current primary's own
# conf.d (never in postgresql.auto.conf: pg_basebackup and pg_rewind copy
# that to the standby, and a promoted standby that waits for a synchronous
# standby of its own hangs every commit until a standby streams again).
set_mode() {
    local mode=$1 names primary
    primary=$(state primary)
    if [[ $mode == sync ]]; then names="'*'"; else names="''"; fi
    no_sync_names "$(other "$primary")"
    cat >"/etc/postgresql/$VERSION/$primary/conf.d/$CONF_FILE" <<EOF
# Written by deploy/postgres/pair.sh (mode: $mode).
synchronous_standby_names = $names
synchronous_commit = on
EOF
    chown postgres:postgres "/etc/postgresql/$VERSION/$primary/conf.d/$CONF_FILE"
    write_state "$primary" "$mode"
    if running "$primary"; then
        local port
        port=$(port_of "$primary")
        ctl "$primary" reload >/dev/null
        wait_until "the primary to apply synchronous_standby_names = $names" \
            test "$(q "$port" 'SHOW synchronous_standby_names')" == "${names//\'/}"
    fi
    log "replication mode: $mode"
}

# no_sync_names STANDBY: the standby's copy of the mode goes (it was a
# primary before), also from its running configuration, so that it comes up
# without a synchronous standby of its own when promoted.
no_sync_names() {
    local name=$1
    rm -f "/etc/postgresql/$VERSION/$name/conf.d/$CONF_FILE"
    if running "$name"; then
        ctl "$name" reload >/dev/null
        wait_until "$name to drop synchronous_standby_names" \
            test -z "$(q "$(port_of "$name")" 'SHOW synchronous_standby_names')"
    fi
}

create_cluster() {
    local name=$1 port=$2
    pg_createcluster --quiet --start-conf=manual -p "$port" "$VERSION" "$name" \
        -- --auth-local=trust --auth-host=trust >/dev/null
    # wal_log_hints: pg_rewind can bring a crashed primary back as a standby.
    cat >"/etc/postgresql/$VERSION/$name/conf.d/urutan-pair-base.conf" <<EOF
# Written by deploy/postgres/pair.sh.
listen_addresses = '127.0.0.1'
cluster_name = '$name'
wal_level = replica
wal_log_hints = on
max_wal_senders = 5
max_replication_slots = 5
hot_standby = on
wal_keep_size = '256MB'
EOF
    chown postgres:postgres "/etc/postgresql/$VERSION/$name/conf.d/urutan-pair-base.conf"
}

# stream_from STANDBY PORT: the standby's replication settings (slot $SLOT,
# application_name its cluster name) instead of those pg_basebackup -R or
# pg_rewind left (the last setting in the file wins, but one line is
# clearer to read), and standby.signal.
stream_from() {
    local name=$1 port=$2 data
    data=$(datadir "$name")
    sed -i '/^primary_conninfo/d; /^primary_slot_name/d' "$data/postgresql.auto.conf"
    cat >>"$data/postgresql.auto.conf" <<EOF
primary_conninfo = 'host=127.0.0.1 port=$port user=postgres application_name=$name connect_timeout=5'
primary_slot_name = '$SLOT'
EOF
    runuser -u postgres -- touch "$data/standby.signal"
}

# basebackup STANDBY PRIMARY_PORT: the standby's data anew, copied from the
# primary (straight from its port: the copy does not depend on a proxy).
basebackup() {
    local name=$1 port=$2 data
    data=$(datadir "$name")
    find "$data" -mindepth 1 -delete
    timeout "$WAIT_SECS" runuser -u postgres -- "$BIN/pg_basebackup" -h 127.0.0.1 -p "$port" \
        -U postgres -D "$data" -S "$SLOT" -X stream --checkpoint=fast ||
        die "pg_basebackup failed or took longer than ${WAIT_SECS}s"
}

# new_slot PRIMARY_PORT: the standby's replication slot on the primary, made
# afresh (an old one may hold a position from before a failover).
new_slot() {
    local port=$1
    q "$port" "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
               WHERE slot_name = '$SLOT' AND NOT active" >/dev/null
    q "$port" "SELECT pg_create_physical_replication_slot('$SLOT', true)" >/dev/null
}

healthy_pair() {
    local primary standby
    primary=$(state primary)
    standby=$(other "$primary")
    exists "$primary" && exists "$standby" && running "$primary" && running "$standby" &&
        in_recovery "$(port_of "$primary")" f && in_recovery "$(port_of "$standby")" t &&
        # A standby retries every 5 s (wal_retrieve_retry_interval) after
        # its primary restarted: a pair that just did is still healthy.
        within 15 streaming "$(port_of "$primary")"
}

cmd_up() {
    local mode=sync repl_port=
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
        local primary standby current
        primary=$(state primary)
        standby=$(other "$primary")
        current=$(q "$(port_of "$standby")" 'SHOW primary_conninfo')
        if [[ $current == *"port=${repl_port:-$(port_of "$primary")} "* ]]; then
            log "the pair already runs (primary :$(port_of "$primary"), standby :$(port_of "$standby"))"
            set_mode "$mode"
            return
        fi
        log "the pair runs with another replication port: recreating it"
    fi
    # Anything half made (an earlier run that died, a promoted standby) goes.
    cmd_down >/dev/null
    repl_port=${repl_port:-$A_PORT}

    log "creating the primary $VERSION/$A on :$A_PORT"
    create_cluster "$A" "$A_PORT"
    write_state "$A" "$mode"
    set_mode "$mode"
    ctl "$A" start
    wait_until "the primary to accept connections on :$A_PORT" ready "$A_PORT"

    log "creating the standby $VERSION/$B on :$B_PORT (pg_basebackup, slot $SLOT)"
    create_cluster "$B" "$B_PORT"
    new_slot "$A_PORT"
    basebackup "$B" "$A_PORT"
    # Through --replication-port (the primary's own port by default).
    stream_from "$B" "$repl_port"
    ctl "$B" start
    wait_until "the standby to accept connections on :$B_PORT" ready "$B_PORT"
    wait_until "the standby to stream from the primary (through :$repl_port)" streaming "$A_PORT"
    set_mode "$mode"
    log "up: primary 127.0.0.1:$A_PORT, standby 127.0.0.1:$B_PORT streaming through :$repl_port ($mode)"
}

cmd_kill_primary() {
    local primary
    primary=$(state primary)
    exists "$primary" || die "no cluster $VERSION/$primary"
    if running "$primary"; then
        ctl "$primary" stop -m immediate
    fi
    log "primary $primary (:$(port_of "$primary")) stopped (immediate)"
}

cmd_promote() {
    local old standby port
    old=$(state primary)
    standby=$(other "$old")
    port=$(port_of "$standby")
    exists "$standby" || die "no cluster $VERSION/$standby"
    running "$standby" || die "the standby $standby does not run"
    if running "$old"; then
        die "the primary $old (:$(port_of "$old")) still runs: kill-primary first (two primaries would split the history)"
    fi
    if in_recovery "$port" t; then
        no_sync_names "$standby"
        # pg_ctl promote waits for the end of recovery (bounded by ctl).
        ctl "$standby" promote ||
            die "pg_ctlcluster promote failed or took longer than ${WAIT_SECS}s"
    fi
    wait_until "the promoted standby to accept writes" in_recovery "$port" f
    write_state "$standby" "$(state mode)"
    log "promoted: 127.0.0.1:$port ($standby) is the primary now"
}

cmd_rejoin() {
    local primary old pport oport data how=pg_rewind
    primary=$(state primary)
    old=$(other "$primary")
    pport=$(port_of "$primary")
    oport=$(port_of "$old")
    if ! { exists "$primary" && running "$primary" && in_recovery "$pport" f; }; then
        die "the primary $primary (:$pport) does not run as a primary"
    fi
    exists "$old" || die "no cluster $VERSION/$old to rejoin"
    if running "$old"; then
        if in_recovery "$oport" t && streaming "$pport"; then
            log "$old already streams from $primary"
            set_mode "$(state mode)"
            return
        fi
        ctl "$old" stop -m fast || ctl "$old" stop -m immediate
    fi
    data=$(datadir "$old")
    new_slot "$pport"
    # The promotion's timeline is in the new primary's control file only after
    # a checkpoint: before that, pg_rewind sees one timeline and rewinds
    # nothing, and the old primary cannot follow.
    q "$pport" 'CHECKPOINT' >/dev/null
    # pg_rewind first recovers a crashed target in single-user mode, with its
    # own configuration (Debian keeps it outside the data directory).
    if ! timeout "$WAIT_SECS" runuser -u postgres -- "$BIN/pg_rewind" -D "$data" \
        --source-server="host=127.0.0.1 port=$pport user=postgres dbname=postgres connect_timeout=5" \
        --config-file="/etc/postgresql/$VERSION/$old/postgresql.conf" >"$data.rewind.log" 2>&1; then
        log "pg_rewind failed ($(tail -1 "$data.rewind.log")): copying the primary anew"
        how=pg_basebackup
        basebackup "$old" "$pport"
    fi
    rm -f "$data.rewind.log"
    start_standby "$old" "$pport"
    if ! within "$WAIT_SECS" streaming "$pport"; then
        [[ $how == pg_rewind ]] || die "timed out after ${WAIT_SECS}s waiting for $old to stream from $primary"
        log "$old does not stream after pg_rewind: copying the primary anew"
        ctl "$old" stop -m fast || ctl "$old" stop -m immediate
        how=pg_basebackup
        basebackup "$old" "$pport"
        start_standby "$old" "$pport"
        wait_until "$old to stream from $primary" streaming "$pport"
    fi
    set_mode "$(state mode)"
    log "rejoined ($how): $old (:$oport) streams from the primary $primary (:$pport)"
}

# start_standby NAME PRIMARY_PORT: start NAME as a standby streaming from
# the primary; returns once it accepts connections.
start_standby() {
    local name=$1 pport=$2 data
    data=$(datadir "$name")
    # The slots of its time as a primary are stale (pg_rewind keeps them).
    find "$data/pg_replslot" -mindepth 1 -delete
    no_sync_names "$name"
    stream_from "$name" "$pport"
    ctl "$name" start
    wait_until "$name to accept connections on :$(port_of "$name")" ready "$(port_of "$name")"
}

cmd_primary_port() {
    local primary
    primary=$(state primary)
    exists "$primary" || die "no pair (no cluster $VERSION/$primary): run pair.sh up"
    port_of "$primary"
}

cmd_ctl() {
    local action=${1:-} primary
    [[ $action =~ ^(stop|start|restart)$ ]] || die "ctl needs stop, start or restart"
    primary=$(state primary)
    exists "$primary" || die "no cluster $VERSION/$primary"
    ctl "$primary" "$action"
}

cmd_status() {
    local name port
    log "state: primary $(state primary), mode $(state mode)"
    for name in "$A" "$B"; do
        port=$(port_of "$name")
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
    for name in "$B" "$A"; do
        if exists "$name"; then
            if running "$name"; then
                ctl "$name" stop -m immediate || true
            fi
            pg_dropcluster "$VERSION" "$name" || true
            log "dropped $VERSION/$name"
        fi
        # pg_dropcluster removes the data, the configuration and the log; a
        # data directory left by an interrupted create goes too.
        rm -rf "/var/lib/postgresql/$VERSION/$name" "/etc/postgresql/$VERSION/$name"
        rm -f "/var/lib/postgresql/$VERSION/$name.rewind.log"
        rm -f "/var/log/postgresql/postgresql-$VERSION-$name.log"*
    done
    rm -f "$STATE" "$STATE.tmp"
}

case ${1:-} in
up) shift && cmd_up "$@" ;;
kill-primary) cmd_kill_primary ;;
promote) cmd_promote ;;
rejoin) cmd_rejoin ;;
primary-port) cmd_primary_port ;;
ctl) shift && cmd_ctl "$@" ;;
status) cmd_status ;;
down) cmd_down ;;
-h | --help | help) usage ;;
*) usage 1 >&2 ;;
esac
