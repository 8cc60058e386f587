#!/usr/bin/env bash
# Run the urutan demo (the whole pipeline with a generated workload) on the
# local RabbitMQ and PostgreSQL. Extra arguments go to `urutan demo`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

bash deploy/local/setup.sh

exec cargo run --release -- demo "$@"
