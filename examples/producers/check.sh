#!/usr/bin/env bash
# The producer examples end to end: for each of Python, Node, Go, Java and SQL,
# its own vhost and database, `urutan run` (and `urutan relay` for SQL), the
# producer, a broker restart in the middle of its stream, then every event
# applied exactly once: `urutan verify` passes and the counts are exact.
#
#   examples/producers/check.sh [python] [node] [go] [java] [sql]   (default: all five)
#
# Runs as root. The broker it restarts is a private RabbitMQ node of the
# machine's own installation (producers@localhost, 127.0.0.1:5674, data in
# /var/lib/rabbitmq/urutan-producers), as benches/faults/private-services.sh
# does: the machine's broker on 5672 is never restarted. Environment:
# PRODUCERS_ORDERS (200), PRODUCERS_VERSIONS (6), PRODUCERS_PAUSE_MS (700),
# URUTAN_BIN (default: the debug binary, built if missing).
#
# The last line sums up:
#   producers: PASS python 31s, node 25s, go 24s, java 25s, sql 20s; 125s
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"

log() { printf 'producers: %s\n' "$*"; }
die() {
    printf 'producers: FAIL %s\n' "$*"
    exit 1
}
[[ $(id -u) -eq 0 ]] || die "run this as root: it installs packages and starts a private broker node"

LANGS=("$@")
((${#LANGS[@]})) || LANGS=(python node go java sql)
ORDERS=${PRODUCERS_ORDERS:-200}
VERSIONS=${PRODUCERS_VERSIONS:-6}
PAUSE_MS=${PRODUCERS_PAUSE_MS:-700}
TOTAL=$((ORDERS * VERSIONS))
NODE=producers@localhost
PORT=5674
BASE=/var/lib/rabbitmq/urutan-producers
PG=postgres://postgres@127.0.0.1:5432
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=$TARGET/producers
mkdir -p "$WORK"
start=$SECONDS

# ---------------------------------------------------------------------------
# What it changes on this machine, said first (as deploy/local/setup.sh does)
# ---------------------------------------------------------------------------
need=()
[[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
command -v go >/dev/null || need+=(golang-go)
[[ -d /usr/share/gocode/src/github.com/rabbitmq/amqp091-go ]] || need+=(golang-github-rabbitmq-amqp091-go-dev)
command -v javac >/dev/null || need+=(default-jdk-headless)
[[ -f /usr/share/java/amqp-client.jar ]] || need+=(librabbitmq-client-java)
command -v psql >/dev/null || need+=(postgresql-client)
log "this check changes on this machine:"
if ((${#need[@]})); then
    log "  - installs Debian packages: ${need[*]}"
else
    log "  - installs no Debian package (nodejs, npm, golang-go, the Go AMQP client, a JDK, the Java AMQP client, python3-venv are there)"
fi
log "  - puts pika (PyPI) in the virtual environment ${WORK}/venv, amqplib (npm) in examples/producers/node/node_modules"
log "  - starts a private RabbitMQ node ${NODE} on 127.0.0.1:${PORT} (data in ${BASE}), stopped and removed at the end"
log "  - creates, then drops, one database and one vhost per language (urutan_producers_<language>)"
if ((${#need[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null || die "apt-get update failed"
    apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null || die "apt-get install ${need[*]} failed"
fi

# ---------------------------------------------------------------------------
# Cleanup: every process started here (by pid), the node, databases, vhosts
# ---------------------------------------------------------------------------
PIDS=()
ctl() { timeout 120 rabbitmqctl -q -n "$NODE" "$@"; }
node_env() {
    export RABBITMQ_NODENAME=$NODE RABBITMQ_NODE_PORT=$PORT RABBITMQ_DIST_PORT=$((PORT + 20000)) \
        RABBITMQ_MNESIA_BASE=$BASE/mnesia RABBITMQ_LOG_BASE=$BASE/log \
        RABBITMQ_PID_FILE=$BASE/node.pid RABBITMQ_ENABLED_PLUGINS_FILE=$BASE/enabled_plugins \
        RABBITMQ_CONFIG_FILE=$BASE/rabbitmq.conf
}
stop_pid() {
    local pid=$1 deadline
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    set +e
    for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
    if rabbitmqctl -q -n "$NODE" status >/dev/null 2>&1; then
        timeout 120 rabbitmqctl -q -n "$NODE" stop >/dev/null 2>&1
    fi
    rm -rf "$BASE"
    for lang in "${LANGS[@]}"; do
        dropdb -h 127.0.0.1 -U postgres --if-exists "urutan_producers_${lang}" >/dev/null 2>&1
    done
}
trap cleanup EXIT

# ---------------------------------------------------------------------------
# The private broker node, the urutan binary, the producers' dependencies
# ---------------------------------------------------------------------------
t0=$SECONDS
rm -rf "$BASE"
mkdir -p "$BASE"
echo '[rabbitmq_consistent_hash_exchange].' >"$BASE/enabled_plugins"
echo "listeners.tcp.local = 127.0.0.1:${PORT}" >"$BASE/rabbitmq.conf"
chown -R rabbitmq:rabbitmq "$BASE"
(node_env && rabbitmq-server -detached >/dev/null 2>&1) || die "cannot start the private node ${NODE}"
(node_env && timeout 120 rabbitmqctl -q -n "$NODE" wait "$BASE/node.pid" --timeout 120 >/dev/null) ||
    die "the private node ${NODE} did not start (logs in ${BASE}/log)"
URUTAN=${URUTAN_BIN:-$TARGET/debug/urutan}
if [[ ! -x $URUTAN ]]; then
    log "building the urutan binary"
    cargo build -q --bin urutan || die "cargo build --bin urutan failed"
fi
[[ -d $WORK/venv ]] || /usr/bin/python3 -m venv "$WORK/venv" || die "python3 -m venv failed"
"$WORK/venv/bin/pip" install -q --disable-pip-version-check -r examples/producers/python/requirements.txt ||
    die "pip install pika failed"
(cd examples/producers/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || die "npm ci failed"
mkdir -p "$WORK/gocache"
(cd examples/producers/go && GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE=$WORK/gocache GOPROXY=off \
    GOFLAGS='' go build -o "$WORK/produce-go" .) || die "go build failed"
# The Java client (Debian's librabbitmq-client-java) logs through SLF4J
# (libslf4j-java, its dependency): slf4j-simple prints the client's own
# warnings on stderr, into the producer's log.
JAVA_CP=$WORK/produce-java:/usr/share/java/amqp-client.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-simple.jar
rm -rf "$WORK/produce-java"
timeout 300 javac -d "$WORK/produce-java" -cp /usr/share/java/amqp-client.jar examples/producers/java/Produce.java ||
    die "javac failed"
log "prepared in $((SECONDS - t0))s: node ${NODE}, ${URUTAN}, pika, amqplib, the Go and Java producers"

# ---------------------------------------------------------------------------
# One language
# ---------------------------------------------------------------------------
count() { psql -X -q -t -A -h 127.0.0.1 -U postgres -d "$1" -c "$2"; }

# wait_count DB SQL N SECS: until SQL counts at least N.
wait_count() {
    local db=$1 sql=$2 n=$3 deadline=$((SECONDS + $4)) got
    while true; do
        got=$(count "$db" "$sql" 2>/dev/null || echo 0)
        ((got >= n)) && return 0
        ((SECONDS < deadline)) || {
            log "timed out: ${sql} counts ${got}, not ${n}"
            return 1
        }
        sleep 0.2
    done
}

restart_broker() {
    ctl stop_app && sleep 1 && ctl start_app && ctl await_startup --timeout 120
}

check_one() {
    local lang=$1 t=$SECONDS db=urutan_producers_$1 vhost=producers-$1 dir=$WORK/$1
    local amqp=amqp://guest:guest@127.0.0.1:${PORT}/${vhost} url=$PG/$db
    rm -rf "$dir" && mkdir -p "$dir"
    ctl delete_vhost "$vhost" >/dev/null 2>&1 || true
    ctl add_vhost "$vhost" >/dev/null && ctl set_permissions -p "$vhost" guest '.*' '.*' '.*' >/dev/null
    dropdb -h 127.0.0.1 -U postgres --if-exists "$db" 2>/dev/null
    export AMQP_URL=$amqp DATABASE_URL=$url RUST_LOG=warn
    "$URUTAN" migrate --create-database >"$dir/migrate.log" 2>&1 || {
        cat "$dir/migrate.log"
        return 1
    }
    METRICS_ADDR=127.0.0.1:0 "$URUTAN" run >"$dir/run.log" 2>&1 &
    PIDS+=($!)
    local run_pid=$!
    local relay_pid=""
    if [[ $lang == sql ]]; then
        METRICS_ADDR=127.0.0.1:0 "$URUTAN" relay >"$dir/relay.log" 2>&1 &
        PIDS+=($!)
        relay_pid=$!
    fi
    # Ready: the four shard queues have their consumer.
    local deadline=$((SECONDS + 60))
    until [[ $(ctl list_queues -p "$vhost" name consumers 2>/dev/null |
        awk '$1 ~ /^pesanan\.shard-/ && $2 > 0' | wc -l) -ge 4 ]]; do
        ((SECONDS < deadline)) || {
            log "${lang}: urutan run not ready in 60 s"
            tail -n 20 "$dir/run.log"
            return 1
        }
        sleep 0.3
    done

    local p0=$SECONDS
    case $lang in
    python) "$WORK/venv/bin/python" examples/producers/python/produce.py \
        --orders "$ORDERS" --versions "$VERSIONS" --pause-ms "$PAUSE_MS" >"$dir/produce.out" 2>"$dir/produce.log" & ;;
    node) node examples/producers/node/produce.js \
        --orders "$ORDERS" --versions "$VERSIONS" --pause-ms "$PAUSE_MS" >"$dir/produce.out" 2>"$dir/produce.log" & ;;
    go) "$WORK/produce-go" \
        --orders "$ORDERS" --versions "$VERSIONS" --pause-ms "$PAUSE_MS" >"$dir/produce.out" 2>"$dir/produce.log" & ;;
    java) java -cp "$JAVA_CP" Produce \
        --orders "$ORDERS" --versions "$VERSIONS" --pause-ms "$PAUSE_MS" >"$dir/produce.out" 2>"$dir/produce.log" & ;;
    sql) psql -X -q -h 127.0.0.1 -U postgres -d "$db" -v ON_ERROR_STOP=1 -v orders="$ORDERS" \
        -v versions="$VERSIONS" -f examples/producers/sql/enqueue.sql >"$dir/produce.out" 2>"$dir/produce.log" & ;;
    esac
    local producer=$!
    PIDS+=("$producer")
    # The broker restarts once a third of the events are applied: mid-stream.
    wait_count "$db" "SELECT count(*) FROM pesanan_riwayat" $((TOTAL / 3)) 120 || return 1
    log "${lang}: restarting the broker node with $(count "$db" "SELECT count(*) FROM pesanan_riwayat") of ${TOTAL} applied"
    restart_broker || {
        log "${lang}: the broker restart failed"
        return 1
    }
    local rc=0
    # A producer that hangs (a client library blocked on a dead connection)
    # fails the check in bounded time instead of holding it forever.
    timeout 300 tail --pid="$producer" -f /dev/null || true
    if kill -0 "$producer" 2>/dev/null; then
        log "${lang}: the producer did not finish within 300 s of the restart; stopping it"
        stop_pid "$producer"
        tail -n 20 "$dir/produce.log"
        return 1
    fi
    wait "$producer" || rc=$?
    local produced=$((SECONDS - p0))
    if ((rc != 0)); then
        log "${lang}: the producer exited ${rc}"
        tail -n 20 "$dir/produce.log"
        return 1
    fi
    local expected=$TOTAL
    [[ $lang == sql ]] && expected=$((TOTAL + 1)) # and its one demo event
    wait_count "$db" "SELECT count(*) FROM pesanan_riwayat" "$expected" 180 || {
        tail -n 20 "$dir/run.log"
        return 1
    }
    stop_pid "$run_pid"
    [[ -n $relay_pid ]] && stop_pid "$relay_pid"
    local verify
    verify=$(timeout 120 "$URUTAN" verify 2>&1) || {
        printf '%s\n' "$verify"
        log "${lang}: urutan verify failed"
        return 1
    }
    local counts want
    counts=$(count "$db" "SELECT (SELECT count(*) FROM pesanan_riwayat) || ' ' ||
        (SELECT count(*) FROM pesan_diproses) || ' ' ||
        (SELECT count(*) FROM pesanan WHERE versi = ${VERSIONS} AND id <> 'SQL-demo') || ' ' ||
        (SELECT count(*) FROM urutan_dead_letter)")
    want="$expected $expected $ORDERS 0"
    if [[ $counts != "$want" ]]; then
        log "${lang}: counts (applied, processed ids, orders at version ${VERSIONS}, dead letters) are ${counts}, not ${want}"
        return 1
    fi
    # The restart must have hit the producer's stream (not after it): the
    # direct producers say how often they reconnected.
    if [[ $lang != sql ]] && grep -q ' 0 reconnect' "$dir/produce.out"; then
        log "${lang}: the broker restart came after the producer finished: $(cat "$dir/produce.out")"
        return 1
    fi
    ctl delete_vhost "$vhost" >/dev/null 2>&1 || true
    dropdb -h 127.0.0.1 -U postgres --if-exists "$db" 2>/dev/null
    RESULT[$lang]="$((SECONDS - t))s"
    local said
    said=$(tail -n 1 "$dir/produce.out" | sed 's/^produce\[[a-z]*\]: //')
    [[ $lang == sql ]] && said="psql committed $((TOTAL + 1)) events with urutan_enqueue"
    log "${lang}: PASS in $((SECONDS - t))s (producer ${produced}s: ${said}); verify ok; ${counts%% *} versions applied once each, nothing dead-lettered"
}

declare -A RESULT=()
failed=()
for lang in "${LANGS[@]}"; do
    case $lang in python | node | go | java | sql) ;; *) die "unknown language ${lang} (python, node, go, java, sql)" ;; esac
    log "== ${lang}: ${ORDERS} orders x ${VERSIONS} versions, broker restarted mid-stream"
    check_one "$lang" || {
        failed+=("$lang")
        log "${lang}: FAIL (logs in ${WORK}/${lang})"
    }
done
summary=""
for lang in "${LANGS[@]}"; do summary+="${summary:+, }${lang} ${RESULT[$lang]:-FAIL}"; done
if ((${#failed[@]})); then
    echo "producers: FAIL ${failed[*]}: ${summary}; $((SECONDS - start))s"
    exit 1
fi
echo "producers: PASS ${summary}; $((SECONDS - start))s"
