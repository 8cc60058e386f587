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

bash deploy/local/setup.sh

# The deployment files (alert rules and their unit tests, dashboard queries,
# Kubernetes manifests, Dockerfile, compose stack): offline checks.
echo "test: deploy/validate.sh"
bash deploy/validate.sh

log=$(mktemp)
trap 'rm -f "$log"' EXIT

status=0
echo "test: parallel tests (everything except serial_*)"
cargo test --all-targets --no-fail-fast -- --skip serial_ 2>&1 | tee -a "$log" || status=$?

if ((status == 0)); then
    echo "test: serial tests (serial_*, one at a time)"
    cargo test --all-targets --no-fail-fast -- serial_ --test-threads=1 2>&1 | tee -a "$log" || status=$?
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
