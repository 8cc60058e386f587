#!/usr/bin/env bash
# One RabbitMQ node of a root made by install.sh: its own node name
# (NAME@localhost), AMQP port, distribution port, config, enabled plugins
# (rabbitmq_consistent_hash_exchange), data and logs; never the host's node.
#
#   node.sh start   VERSION NAME PORT [DIST_PORT]  start (unless running) and wait until booted
#   node.sh launch  VERSION NAME PORT [DIST_PORT]  start without waiting (a cluster's full start)
#   node.sh wait    NAME [SECS]     wait until booted (default 120 s)
#   node.sh stop    NAME            graceful stop (rabbitmqctl stop), thawed first if frozen
#   node.sh kill    NAME            SIGKILL of its Erlang VM (beam.smp)
#   node.sh freeze  NAME            SIGSTOP of its VM;  node.sh thaw NAME: SIGCONT
#   node.sh status  [NAME]          running (pid), frozen or stopped, for one node or all
#   node.sh pid     NAME            the VM's pid (also while frozen)
#   node.sh url     NAME [VHOST]    amqp://guest:guest@127.0.0.1:PORT[/VHOST]
#   node.sh env     NAME            exports that aim the tests at it:
#                                   eval "$(deploy/brokers/node.sh env NAME)"
#   node.sh ctl     NAME ARGS...    rabbitmqctl ARGS for that node, through the root
#   node.sh diag    NAME ARGS...    rabbitmq-diagnostics;  plugins: rabbitmq-plugins;
#   node.sh queues  NAME ARGS...    rabbitmq-queues;  upgrade: rabbitmq-upgrade
#   node.sh forget  NAME            stop it and delete its data, logs and record
#
# VERSION is 4.0 or 4.3 (deploy/brokers/install.sh VERSION first); DIST_PORT
# defaults to PORT + 20000. A started node is recorded in
# ${URUTAN_BROKERS_DIR:-/var/lib/urutan-brokers}/nodes/NAME.env, so the other
# commands take its NAME only. Data and logs live inside the root, under
# /var/lib/rabbitmq/urutan-nodes/NAME (owned by the root's rabbitmq user);
# the host's epmd (127.0.0.1:4369) serves these nodes too. Runs as root.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_TAG=node
# shellcheck source=deploy/brokers/lib.sh
source "$HERE/lib.sh"

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
    exit 2
}

NODES=$BROKERS_DIR/nodes
IN_ROOT_DIR=/var/lib/rabbitmq/urutan-nodes

valid_name() { [[ $1 =~ ^[a-z][a-z0-9-]{0,30}$ ]] || die "bad node name '$1' (lowercase letters, digits, -)"; }

# load NAME: VERSION, PORT, DIST_PORT, ROOT, DIR (in the root) of a recorded node.
load() {
    NAME=$1
    valid_name "$NAME"
    [[ -f "$NODES/$NAME.env" ]] || die "no node ${NAME} recorded (start it with: node.sh start VERSION ${NAME} PORT)"
    VERSION=$(sed -n 's/^VERSION=//p' "$NODES/$NAME.env")
    PORT=$(sed -n 's/^PORT=//p' "$NODES/$NAME.env")
    DIST_PORT=$(sed -n 's/^DIST_PORT=//p' "$NODES/$NAME.env")
    ROOT=$(root_of "$VERSION") || die "node ${NAME}: bad version '${VERSION}' in its record"
    DIR=$IN_ROOT_DIR/$NAME
}

# The node's environment, for the server and for its CLI tools alike. The
# plugins directory as Debian's wrapper gives it to rabbitmq-plugins: without
# it, the 4.0 CLI finds no plugin command (consistent_hash_exchange_ring_state).
node_env() {
    local plugins
    plugins=$(cd "$ROOT/usr/lib/rabbitmq/lib" && echo rabbitmq_server-*/plugins)
    printf '%s\n' \
        "RABBITMQ_PLUGINS_DIR=/usr/lib/rabbitmq/lib/${plugins}" \
        "RABBITMQ_NODENAME=${NAME}@localhost" \
        "RABBITMQ_NODE_PORT=${PORT}" \
        "RABBITMQ_DIST_PORT=${DIST_PORT}" \
        "RABBITMQ_CONFIG_FILE=${DIR}/rabbitmq.conf" \
        "RABBITMQ_ENABLED_PLUGINS_FILE=${DIR}/enabled_plugins" \
        "RABBITMQ_MNESIA_BASE=${DIR}/mnesia" \
        "RABBITMQ_LOG_BASE=${DIR}/log" \
        "RABBITMQ_PID_FILE=${DIR}/pid" \
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}"
}

# tool_argv PROGRAM: ARGV becomes the command line of a RabbitMQ CLI tool
# (or the server) for this node, run in the root as its rabbitmq user
# (numeric ids: the host's own rabbitmq user has other ones). Not through
# Debian's wrapper in /usr/sbin: it runs the tool under `su`, where a
# timeout or signal never reaches it, and sends every node's boot output to
# one shared file.
tool_argv() {
    local env ids
    mapfile -t env < <(node_env)
    ids=$(awk -F: '$1 == "rabbitmq" { print $3 ":" $4 }' "$ROOT/etc/passwd")
    [[ -n "$ids" ]] || die "no rabbitmq user in ${ROOT}/etc/passwd"
    ARGV=(chroot --userspec="$ids" "$ROOT" /usr/bin/env -i -C /var/lib/rabbitmq
        "${ROOT_ENV[@]}" HOME=/var/lib/rabbitmq "${env[@]}" "/usr/lib/rabbitmq/bin/$1")
}

# tool PROGRAM ARGS...
tool() {
    tool_argv "$1"
    shift
    "${ARGV[@]}" "$@"
}

# exec_tool PROGRAM ARGS...: the same in place of this shell (so that a
# caller's timeout or signal reaches the tool itself).
exec_tool() {
    tool_argv "$1"
    shift
    exec "${ARGV[@]}" "$@"
}

# The node's VM: beam.smp whose environment names this node (found while
# frozen too, when the node answers nothing).
beam_pid() {
    local p
    for p in /proc/[0-9]*; do
        [[ "$(cat "$p/comm" 2>/dev/null)" == beam.smp ]] || continue
        if tr '\0' '\n' <"$p/environ" 2>/dev/null | grep -qx "RABBITMQ_NODENAME=${NAME}@localhost"; then
            echo "${p#/proc/}"
            return 0
        fi
    done
    return 1
}

frozen() {
    local pid=$1
    [[ "$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)" == T ]]
}

# answers: the node is up and its app booted (bounded: a frozen node answers nothing).
answers() {
    tool_argv rabbitmqctl
    timeout 20 "${ARGV[@]}" -q await_startup --timeout 10 >/dev/null 2>&1
}

port_user() { ss -Hltnp "sport = :$1" 2>/dev/null | head -n 1; }

cmd_launch() {
    (($# == 3 || $# == 4)) || usage
    local version=$1
    NAME=$2
    valid_name "$NAME"
    release_of "$version" >/dev/null || die "version must be 4.0 or 4.3, not '${version}'"
    [[ $3 =~ ^[0-9]+$ ]] || die "bad port '$3'"
    installed "$version" || die "RabbitMQ ${version} is not installed: run deploy/brokers/install.sh ${version}"
    if [[ -f "$NODES/$NAME.env" ]]; then
        load "$NAME"
        if beam_pid >/dev/null && [[ "$VERSION $PORT" != "$version $3" ]]; then
            die "node ${NAME} already runs as ${VERSION} on port ${PORT}; stop it first"
        fi
    fi
    VERSION=$version PORT=$3 DIST_PORT=${4:-$(($3 + 20000))}
    ROOT=$(root_of "$VERSION") DIR=$IN_ROOT_DIR/$NAME
    mount_root "$ROOT"
    local pid
    if pid=$(beam_pid); then
        log "${NAME}@localhost (RabbitMQ ${VERSION}) already runs, pid ${pid}, port ${PORT}"
        return 0
    fi
    local p who
    for p in "$PORT" "$DIST_PORT"; do
        who=$(port_user "$p")
        [[ -z "$who" ]] || die "port ${p} is already in use: ${who}"
    done
    mkdir -p "$NODES" "$ROOT$DIR/log" "$ROOT$DIR/mnesia"
    printf 'VERSION=%s\nPORT=%s\nDIST_PORT=%s\n' "$VERSION" "$PORT" "$DIST_PORT" >"$NODES/$NAME.env"
    # Its own listener on loopback (the root's rabbitmq.conf is not read), a
    # memory alarm fit for several nodes on one machine, and the message size
    # cap of every urutan broker (MAX_BODY_BYTES plus headroom, as in
    # deploy/compose/rabbitmq/rabbitmq.conf).
    cat >"$ROOT$DIR/rabbitmq.conf" <<EOF
listeners.tcp.1 = 127.0.0.1:${PORT}
vm_memory_high_watermark.relative = 0.2
max_message_size = 2097152
EOF
    echo '[rabbitmq_consistent_hash_exchange].' >"$ROOT$DIR/enabled_plugins"
    in_root "$ROOT" chown -R rabbitmq:rabbitmq "$DIR"
    log "starting ${NAME}@localhost: RabbitMQ ${VERSION}, amqp 127.0.0.1:${PORT}, dist ${DIST_PORT}, data ${ROOT}${DIR}"
    tool rabbitmq-server -detached >"$ROOT$DIR/log/start.out" 2>&1 || {
        sed 's/^/    /' "$ROOT$DIR/log/start.out" >&2
        die "rabbitmq-server -detached failed for ${NAME}"
    }
}

cmd_wait() {
    local secs=${1:-120} deadline pid
    deadline=$((SECONDS + secs))
    until answers; do
        if ((SECONDS >= deadline)); then
            tail -n 20 "$ROOT$DIR/log/${NAME}@localhost.log" 2>/dev/null | sed 's/^/    /' >&2
            die "${NAME}@localhost did not boot within ${secs}s (logs in ${ROOT}${DIR}/log)"
        fi
        # Launched a moment ago, the VM may not exist yet: give it 15 s.
        if ! beam_pid >/dev/null && ((SECONDS > deadline - secs + 15)); then
            tail -n 20 "$ROOT$DIR/log/start.out" "$ROOT$DIR/log/${NAME}@localhost.log" 2>/dev/null |
                sed 's/^/    /' >&2
            die "${NAME}@localhost is not running (logs in ${ROOT}${DIR}/log)"
        fi
        sleep 1
    done
    pid=$(beam_pid) || die "${NAME} answers but its VM was not found"
    log "${NAME}@localhost is up (RabbitMQ ${VERSION}, pid ${pid}, amqp 127.0.0.1:${PORT})"
}

cmd_stop() {
    local pid deadline
    if ! pid=$(beam_pid); then
        log "${NAME}@localhost is not running"
        return 0
    fi
    if frozen "$pid"; then
        log "${NAME}: thawing the frozen VM ${pid} before stopping it"
        kill -CONT "$pid"
    fi
    log "stopping ${NAME}@localhost (pid ${pid})"
    tool_argv rabbitmqctl
    timeout 120 "${ARGV[@]}" -q stop >/dev/null 2>&1 ||
        log "${NAME}: rabbitmqctl stop did not succeed; waiting for the VM anyway"
    deadline=$((SECONDS + 60))
    while kill -0 "$pid" 2>/dev/null; do
        ((SECONDS < deadline)) || die "${NAME}@localhost (pid ${pid}) still runs 60 s after stop (node.sh kill ${NAME})"
        sleep 0.5
    done
    log "${NAME}@localhost stopped"
}

signal() {
    local sig=$1 what=$2 pid
    pid=$(beam_pid) || die "${NAME}@localhost is not running"
    kill "-$sig" "$pid"
    log "${NAME}@localhost: ${what} (SIG${sig} to pid ${pid})"
    if [[ $sig == KILL ]]; then
        local deadline=$((SECONDS + 10))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    fi
}

cmd_status() {
    local names=("$@") n pid state
    if ((${#names[@]} == 0)); then
        for n in "$NODES"/*.env; do
            [[ -e "$n" ]] && names+=("$(basename "$n" .env)")
        done
    fi
    ((${#names[@]})) || {
        echo "no nodes recorded in ${NODES}"
        return 0
    }
    for n in "${names[@]}"; do
        load "$n"
        if pid=$(beam_pid); then
            if frozen "$pid"; then state="frozen (pid ${pid})"; else state="running (pid ${pid})"; fi
        else
            state=stopped
        fi
        printf '%-16s RabbitMQ %s  amqp 127.0.0.1:%s  dist %s  %s\n' "${NAME}@localhost" "$VERSION" "$PORT" "$DIST_PORT" "$state"
    done
}

cmd=${1:-}
shift || true
case $cmd in
start)
    need_root
    cmd_launch "$@"
    cmd_wait 120
    ;;
launch)
    need_root
    cmd_launch "$@"
    ;;
wait)
    (($# >= 1)) || usage
    load "$1"
    cmd_wait "${2:-120}"
    ;;
stop)
    (($# == 1)) || usage
    load "$1"
    cmd_stop
    ;;
kill)
    (($# == 1)) || usage
    load "$1"
    signal KILL "killed"
    ;;
freeze)
    (($# == 1)) || usage
    load "$1"
    signal STOP "frozen"
    ;;
thaw)
    (($# == 1)) || usage
    load "$1"
    signal CONT "thawed"
    ;;
pid)
    (($# == 1)) || usage
    load "$1"
    beam_pid || die "${NAME}@localhost is not running"
    ;;
status) cmd_status "$@" ;;
url)
    (($# >= 1)) || usage
    load "$1"
    echo "amqp://guest:guest@127.0.0.1:${PORT}${2:+/$2}"
    ;;
env)
    (($# == 1)) || usage
    load "$1"
    # The integration tests (urutan_testkit::fixtures) and the fault suite
    # (urutan_testkit::faults::services; its PostgreSQL stays as it is).
    self="bash ${HERE}/node.sh"
    cat <<EOF
export URUTAN_TEST_AMQP_BASE=amqp://guest:guest@127.0.0.1:${PORT}
export URUTAN_TEST_RABBITMQCTL="${self} ctl ${NAME}"
export URUTAN_TEST_RABBITMQ_DIAGNOSTICS="${self} diag ${NAME}"
export URUTAN_TEST_RABBITMQ_PLUGINS="${self} plugins ${NAME}"
export FAULTS_AMQP_BASE=amqp://guest:guest@127.0.0.1:${PORT}
export FAULTS_RABBITMQCTL="${self} ctl ${NAME}"
EOF
    ;;
ctl | diag | plugins | queues | upgrade)
    (($# >= 1)) || usage
    load "$1"
    shift
    case $cmd in
    ctl) exec_tool rabbitmqctl "$@" ;;
    diag) exec_tool rabbitmq-diagnostics "$@" ;;
    plugins) exec_tool rabbitmq-plugins "$@" ;;
    queues) exec_tool rabbitmq-queues "$@" ;;
    upgrade) exec_tool rabbitmq-upgrade "$@" ;;
    esac
    ;;
forget)
    (($# == 1)) || usage
    need_root
    load "$1"
    cmd_stop
    rm -rf --one-file-system "${ROOT:?}${DIR}"
    rm -f "$NODES/$NAME.env"
    log "${NAME}@localhost forgotten: data, logs and record deleted"
    ;;
*) usage ;;
esac
