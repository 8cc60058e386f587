# Summarizes a fault run's log (its "[faults] #N" lines) per kind: python3 benches/results/cluster-soak/summarize.py [LOG]
import re, statistics, json, sys
lines=open(sys.argv[1] if len(sys.argv) > 1 else 'benches/results/cluster-soak/seed-2269081246.log').read().splitlines()
kinds={}; starts={}
faults=[]
for l in lines:
    m=re.match(r'\[faults\] #(\d+) (cluster: .*) \.\.\.$', l)
    if m: starts[int(m.group(1))]=m.group(2); continue
    m=re.match(r'\[faults\] #(\d+) (.*): recovery (Some\(([\d.]+)\)|None) ms, end to end (Some\(([\d.]+)\)|None) ms$', l)
    if m:
        i=int(m.group(1)); detail=m.group(2)
        rec=float(m.group(4)) if m.group(4) else None
        e2e=float(m.group(6)) if m.group(6) else None
        wait=re.search(r'after ([\d.]+) s\)', detail)
        faults.append(dict(index=i, kind=starts[i], detail=detail, recovery_ms=rec, e2e_ms=e2e, waited_s=float(wait.group(1)) if wait else 0.0))
goal={'cluster: SIGKILL of the busiest node (then restarted)':70,'cluster: rolling restart of the three nodes':70,'cluster: busiest node frozen 30 s':70,'cluster: busiest node cut off from the others 30 s':70,'cluster: full stop and start with a backlog':60}
out=[]
out.append('| fault kind | injected | workers back p50 / max (s) | end to end p50 / max (s) | over 60 s (workers / e2e) | not recovered |')
out.append('|---|---:|---:|---:|---:|---:|')
by={}
for f in faults: by.setdefault(f['kind'],[]).append(f)
for k in sorted(by):
    fs=by[k]
    r=[f['recovery_ms']/1000 for f in fs if f['recovery_ms'] is not None]
    e=[f['e2e_ms']/1000 for f in fs if f['e2e_ms'] is not None]
    none=sum(1 for f in fs if f['recovery_ms'] is None or f['e2e_ms'] is None)
    out.append(f"| {k} | {len(fs)} | {statistics.median(r):.2f} / {max(r):.1f} | {statistics.median(e):.2f} / {max(e):.1f} | {sum(1 for x in r if x>60)} / {sum(1 for x in e if x>60)} | {none} |")
r=[f['recovery_ms']/1000 for f in faults]; e=[f['e2e_ms']/1000 for f in faults]
out.append(f"| **all** | **{len(faults)}** | {statistics.median(r):.2f} / {max(r):.1f} | {statistics.median(e):.2f} / {max(e):.1f} | {sum(1 for x in r if x>60)} / {sum(1 for x in e if x>60)} | 0 |")
w=[f['waited_s'] for f in faults]
print('\n'.join(out))
print()
print(f"waits before faults (backlog of the previous one): {sum(1 for x in w if x>0)} faults waited, median {statistics.median([x for x in w if x>0]):.1f} s, max {max(w):.1f} s")
# SIGKILL split: stall ~58-61 s vs fast
sk=[f['recovery_ms']/1000 for f in by.get('cluster: SIGKILL of the busiest node (then restarted)',[])]
print('SIGKILL recoveries sorted:', ' '.join(f'{x:.1f}' for x in sorted(sk)))
json.dump(faults, open('benches/results/cluster-soak/seed-2269081246-faults.json','w'), indent=1)
