#!/usr/bin/env bash
# Where the pipeline waits while a drain runs (issue 33: "where does each
# shard wait, on whom?"). Start a drain first (e.g. `cargo bench --bench e2e
# -- --ab …`), then run this while it drains; it only reads:
#   1. PostgreSQL: every 2 ms for SECS seconds, the wait event of each client
#      backend that is not idle (pg_stat_activity), counted: how much of the
#      apply backends' time is CPU, and how much waits for the WAL flush,
#      a lock, the disk.
#   2. The cores: `perf sched record -a` for SECS seconds, then the share of
#      time each core was idle, how much of it both were, and what ran on the
#      other core meanwhile (what everyone else waited for).
# Needs psql, perf and python3; run as root (perf sched reads every CPU).
#
#   SECS=3 bash benches/waits.sh
set -euo pipefail
SECS=${SECS:-3}
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432/postgres}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

perf sched record -a -o "$out/sched.data" -- sleep "$SECS" >/dev/null 2>&1 &
perf_pid=$!
cat >"$out/waits.sql" <<'SQL'
SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU (no wait event)')
FROM pg_stat_activity
WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND state = 'active'
\watch 0.002
SQL
timeout "$SECS" psql "$PGURL" -qAt -f "$out/waits.sql" >"$out/waits.txt" 2>/dev/null || true
wait "$perf_pid" || { echo "perf sched record failed (run as root?)" >&2; exit 1; }

echo "## PostgreSQL backends running a statement: what they wait for (share of samples)"
awk 'NF' "$out/waits.txt" | sort | uniq -c | sort -rn |
    awk '{ n[NR] = $1; $1 = ""; w[NR] = $0; t += n[NR] }
         END { for (i = 1; i <= NR && i <= 12; i++) printf "%6.1f %%  %s\n", 100 * n[i] / t, w[i]
               printf "(%d samples%s)\n", t, t ? "" : ": no backend ran a statement; is a drain running?" }'

echo
echo "## The cores over $SECS s"
perf sched timehist -i "$out/sched.data" 2>/dev/null >"$out/timehist.txt"
python3 - "$out/timehist.txt" <<'PY'
import collections, re, sys

rows = []
for line in open(sys.argv[1]).read().splitlines()[3:]:
    p = line.split()
    if len(p) < 6:
        continue
    try:
        end = float(p[0])
        run = float(p[-1]) / 1000
    except ValueError:
        continue
    rows.append((end - run, end, p[1], re.sub(r"\[\d+(/\d+)?\]", "", p[2])))
cpus = sorted({r[2] for r in rows})
per_cpu = {c: [r for r in rows if r[2] == c] for c in cpus}
span = max(r[1] for r in rows) - min(r[0] for r in rows)
idle = {c: sum(e - s for s, e, _, t in per_cpu[c] if t == "<idle>") for c in cpus}
print("idle: " + ", ".join(f"core {c.strip('[]').lstrip('0') or '0'} {idle[c] / span:.0%}" for c in cpus))
if len(cpus) != 2:
    print("(what ran beside an idle core: worked out for 2 cores only)")
else:
    beside = collections.Counter()  # task on the other core -> seconds
    for x, y in ((cpus[0], cpus[1]), (cpus[1], cpus[0])):
        others = per_cpu[y]
        j = 0
        for s, e, _, task in per_cpu[x]:
            if task != "<idle>":
                continue
            while j < len(others) and others[j][1] < s:
                j += 1
            k = j
            while k < len(others) and others[k][0] < e:
                overlap = min(e, others[k][1]) - max(s, others[k][0])
                if overlap > 0:
                    beside[others[k][3]] += overlap
                k += 1
    both = beside.pop("<idle>", 0.0) / 2
    print(f"both cores idle at once: {both / span:.1%} of the time")
    total = sum(beside.values()) or 1e-9
    print(f"one core idle while the other ran: {total / span:.1%} of the time; the other ran (share):")
    for task, t in beside.most_common(8):
        print(f"  {t / total:6.1%}  {task}")
PY
