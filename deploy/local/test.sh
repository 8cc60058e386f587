#!/usr/bin/env bash
# Run the whole test suite against the local RabbitMQ and PostgreSQL.
#
# Tests whose names contain `serial_` disturb the shared broker or database
# (a broker restart, for example), so they run alone, one at a time, after
# all the others. The last line sums up both runs ("test: N passed, N failed,
# N skipped"), since the serial run alone may legitimately run few or no tests.
# --no-fail-fast: on a failure, still run the other test targets and report all.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

export RUST_BACKTRACE=1

if [[ $(id -u) -ne 0 ]]; then
    echo "test: run this as root (with Rust installed for root): the tests create and delete vhosts and restart the broker with rabbitmqctl" >&2
    exit 1
fi

bash deploy/local/setup.sh

# The console's browser test (tests/it/console.rs) drives Debian's chromium
# headless through chromedriver: installed here if missing (said first).
if [[ ! -x /usr/bin/chromium || ! -x /usr/bin/chromedriver ]]; then
    echo "test: installing Debian's chromium and chromium-driver (apt-get) for the console's browser test"
    apt-get update -q && apt-get install -y -q --no-install-recommends chromium chromium-driver
fi

# The deployment files (alert rules and their unit tests, dashboard queries,
# Kubernetes manifests, Dockerfile, compose stack): offline checks.
echo "test: deploy/validate.sh"
bash deploy/validate.sh

log=$(mktemp)
trap 'rm -f "$log"' EXIT

# RabbitMQ 3.10's dead-letter supervisor race (deploy/rabbitmq/README.md):
# once `rabbit_fifo_dlx_sup` is down, no quorum queue with at-least-once
# dead-lettering can be declared, and every test that declares a shard queue
# fails with INTERNAL_ERROR / NOT_FOUND. Say so in one line, and restart the
# broker app (which brings the supervisor back) so the next run can pass.
dlx_supervisor_ok() {
    local when=$1 state
    # "n/a" where the broker has no such supervisor (other versions).
    state=$(rabbitmqctl -q eval 'case code:which(rabbit_fifo_dlx_sup) of
        non_existing -> "n/a";
        _ -> case whereis(rabbit_fifo_dlx_sup) of undefined -> "down"; _ -> "up" end
    end.' 2>/dev/null | tr -d '"') || state=unknown
    case $state in
    down)
        echo "test: BROKER BROKEN $when: RabbitMQ's dead-letter supervisor (rabbit_fifo_dlx_sup) is down, so every at-least-once quorum queue fails to start (INTERNAL_ERROR / NOT_FOUND); recovery: rabbitmqctl stop_app && rabbitmqctl start_app (a RabbitMQ 3.10 race, see deploy/rabbitmq/README.md)"
        return 1
        ;;
    unknown) echo "test: could not ask the broker whether its dead-letter supervisor is up ($when)" ;;
    esac
    return 0
}

dlx_broke=0
dlx_supervisor_recover() {
    dlx_broke=1
    echo "test: restarting the broker app to bring the dead-letter supervisor back"
    rabbitmqctl -q stop_app && rabbitmqctl -q start_app && rabbitmqctl -q await_startup --timeout 120
}

status=0
if ! dlx_supervisor_ok "before the tests (broken by an earlier run)"; then
    dlx_supervisor_recover
fi
echo "test: parallel tests (everything except serial_*)"
cargo test --all-targets --no-fail-fast -- --skip serial_ 2>&1 | tee -a "$log" || status=$?
if ! dlx_supervisor_ok "after the parallel tests (their failures above may be this, not bugs)"; then
    status=1
    dlx_supervisor_recover
fi

if ((status == 0)); then
    echo "test: serial tests (serial_*, one at a time)"
    cargo test --all-targets --no-fail-fast -- serial_ --test-threads=1 2>&1 | tee -a "$log" || status=$?
    if ! dlx_supervisor_ok "after the serial tests (their failures above may be this, not bugs)"; then
        status=1
        dlx_supervisor_recover
    fi
fi

if ((dlx_broke)); then
    echo "test: the broker's dead-letter supervisor was down in this run (BROKER BROKEN above); the broker app was restarted"
fi

# Sum the libtest summaries: "test result: ok. 3 passed; 0 failed; 1 ignored; ..."
awk '
    /^test result: / {
        for (i = 1; i < NF; i++) {
            if ($(i + 1) ~ /^passed;?$/) passed += $i
            if ($(i + 1) ~ /^failed;?$/) failed += $i
            if ($(i + 1) ~ /^ignored;?$/) ignored += $i
        }
    }
    END { printf "test: %d passed, %d failed, %d skipped\n", passed, failed, ignored }
' "$log"

exit "$status"
