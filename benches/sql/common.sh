# Sourced by the scripts beside it: strict mode, the repository's root as
# the working directory, the server (PGURL, default the local one) and
# psql without notices.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432}
export PGOPTIONS="-c client_min_messages=warning"
