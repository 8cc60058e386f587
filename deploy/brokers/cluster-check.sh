#!/usr/bin/env bash
# The fault suite against the three-node RabbitMQ 4.3 cluster (issue 15):
# starts the cluster (deploy/brokers/cluster.sh start, which installs 4.3
# if needed), runs tests/cluster.rs (serial_cluster_faults_keep_every_promise:
# a SIGKILL of the busiest node, a rolling restart, a node frozen 30 s, a
# node cut off from the other two for 30 s and a full stop/start with a
# backlog, under the relay and a direct producer),
# and stops the cluster afterwards, pass or fail.
#
#   deploy/brokers/cluster-check.sh           start, test, stop
#   deploy/brokers/cluster-check.sh --keep    leave the cluster running
#
# The last line sums up:
#   cluster: PASS 4.3.6 4 faults, recovery max 3.1 s, 41234 versions, 312 s
#   cluster: FAIL 4.3.6 <why> (logs in /tmp/urutan-cluster.XXXXXX)
# and the exit status is nonzero on failure. The test uses the machine's
# PostgreSQL (127.0.0.1:5432, a database of its own) and never the
# machine's RabbitMQ. FAULTS_SEED replays a run. Runs as root, from the
# repository (it builds the test binary first); every wait is bounded.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_TAG=cluster
# shellcheck source=deploy/brokers/lib.sh
source "$HERE/lib.sh"
cd "$HERE/../.."

KEEP=0
for arg in "$@"; do
    case $arg in
    --keep) KEEP=1 ;;
    -h | --help) print_help "${BASH_SOURCE[0]}" ;;
    *)
        echo "usage: deploy/brokers/cluster-check.sh [--keep]" >&2
        exit 2
        ;;
    esac
done
need_root
export RUST_BACKTRACE=1

# The whole test (the Rust side bounds its run by 20 min; this is the outer net).
readonly TEST_LIMIT=${CLUSTER_TEST_LIMIT:-1500}
LOGDIR=$(mktemp -d /tmp/urutan-cluster.XXXXXX)
started=$SECONDS
version=unknown

fail() {
    echo "cluster: FAIL ${version} $* ($((SECONDS - started)) s, logs in ${LOGDIR})"
    exit 1
}

cleanup() {
    ((KEEP)) && return 0
    timeout 300 bash "$HERE/cluster.sh" stop >"$LOGDIR/stop.log" 2>&1 ||
        log "stopping the cluster failed (${LOGDIR}/stop.log)"
}
trap cleanup EXIT

log "logs in ${LOGDIR}"
log "starting the cluster (cluster.sh start)"
timeout 1200 bash "$HERE/cluster.sh" start >"$LOGDIR/start.log" 2>&1 || {
    tail -n 20 "$LOGDIR/start.log" >&2
    fail "the cluster did not start (start.log)"
}
version=$(timeout 60 bash "$HERE/cluster.sh" ctl -q eval 'rabbit_misc:version().' | tr -d '"\r\n') ||
    fail "no cluster node answers"
log "RabbitMQ ${version}: $(bash "$HERE/cluster.sh" status | tail -n 1)"

log "building the test binary (cargo test --test cluster --no-run)"
timeout 1800 cargo test --test cluster --no-run >"$LOGDIR/build.log" 2>&1 || {
    tail -n 30 "$LOGDIR/build.log" >&2
    fail "the test build failed (build.log)"
}

log "running serial_cluster_faults_keep_every_promise (${LOGDIR}/test.log)"
test_start=$SECONDS
rc=0
FAULTS_CLUSTER="$HERE/cluster.sh" FAULTS_REPORT="$LOGDIR/report.md" \
    timeout "$TEST_LIMIT" cargo test --test cluster -- \
    serial_cluster_faults_keep_every_promise --exact --nocapture --test-threads=1 \
    >"$LOGDIR/test.log" 2>&1 || rc=$?
took=$((SECONDS - test_start))
# Why a run failed, for a log read far from this machine (CI): the panic,
# the report's summary and tables, and the processes' last warnings.
explain_failure() {
    grep -E -A4 "panicked|assertion|seed [0-9]+:" "$LOGDIR/test.log" | head -n 40 >&2 || true
    if [[ -f $LOGDIR/report.md ]]; then
        echo "--- report (${LOGDIR}/report.md), up to its fault list:" >&2
        sed -n '1,/^## Faults/p' "$LOGDIR/report.md" | cut -c1-400 >&2
    fi
    local seed dir f
    seed=$(grep -oE 'seed [0-9]+' "$LOGDIR/test.log" | head -n 1 | awk '{ print $2 }')
    dir=target/tmp/faults-cluster-${seed}
    [[ -n $seed && -d $dir ]] || return 0
    for f in "$dir"/*.log; do
        [[ -f $f ]] || continue
        echo "--- last warnings of $(basename "$f" .log) (${f}):" >&2
        grep -E ' (WARN|ERROR) ' "$f" | tail -n 5 | cut -c1-300 >&2 || true
    done
}

if ((rc != 0)); then
    explain_failure
    ((rc == 124)) && fail "the test took over ${TEST_LIMIT} s"
    fail "the test failed after ${took} s (test.log, report.md)"
fi
# The test's own summary: "cluster faults: PASS <n> faults, recovery max <x> s,
# <v> versions, <o> out of order, <t> s".
summary=$(grep -m1 '^cluster faults: PASS ' "$LOGDIR/test.log") ||
    fail "the test passed without running (FAULTS_CLUSTER not seen?)"
read -r faults recovery versions reordered < <(
    sed -E 's/^cluster faults: PASS ([0-9]+) faults, recovery max ([0-9.]+) s, ([0-9]+) versions, ([0-9]+) out of order.*/\1 \2 \3 \4/' <<<"$summary"
)
log "report: ${LOGDIR}/report.md; ${reordered} events out of version order at a worker"
echo "cluster: PASS ${version} ${faults} faults, recovery max ${recovery} s, ${versions} versions, $((SECONDS - started)) s"
