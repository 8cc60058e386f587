#!/usr/bin/env bash
# Run the urutan demo (the whole pipeline with a generated workload) on the
# local RabbitMQ and PostgreSQL. Extra arguments go to `urutan demo`.
#
# A guest on this machine (deploy/local/guest.sh): it uses the services when
# they are up and changes nothing; only a first run on a machine without
# them runs deploy/local/setup.sh. Services that are stopped are reported,
# not started.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

# shellcheck source=deploy/local/guest.sh
source deploy/local/guest.sh
guest_check || exit 1

exec cargo run --release -- demo "$@"
