"""netreduce-allreduce-perf --rings R over the loopback box: the report's
per-ring table. Each ring's bytes are this rank's stripes of every call (the
stripe rule written out here: count // R elements, one more for the first
count % R stripes), the box counts P copies of them per ring, and the totals
add up. Exit status 0 (every size checked exact)."""
import re
import subprocess
import sys

exe = sys.argv[1]
P, R, ESIZE = 3, 3, 4
SIZES_B = [4, 32, 256, 2048, 16384]  # -b 4 -e 16K -f 8, fp32
CALLS = 1 + 2 + 1                    # -w 1, -n 2, the check call

p = subprocess.run([exe, "--loopback", "--loopback-box", "--world", str(P), "--rings", str(R),
                    "-b", "4", "-e", "16K", "-f", "8", "-n", "2", "-w", "1", "-d", "fp32",
                    "-o", "sum"], capture_output=True, text=True, timeout=120)
out = p.stdout + p.stderr
failures = []
if p.returncode != 0:
    failures.append(f"exit {p.returncode}: {out}")
if not re.search(rf"^# rings {R} \(ids 1 2 3\)", out, re.M):
    failures.append("no '# rings' line")
want = [0] * R
for b in SIZES_B:
    count = b // ESIZE
    for g in range(R):
        want[g] += (count // R + (1 if g < count % R else 0)) * ESIZE * CALLS
rows = {m.group(1): (int(m.group(2)), int(m.group(3)))
        for m in re.finditer(r"^#\s+(\d+|all)\s+(?:\d+\s+)?(\d+)\s+(\d+)$", out, re.M)}
for g in range(R):
    got = rows.get(str(g))
    if got != (want[g], P * want[g]):
        failures.append(f"ring {g}: {got}, expected {(want[g], P * want[g])}")
if rows.get("all") != (sum(want), P * sum(want)):
    failures.append(f"all: {rows.get('all')}, expected {(sum(want), P * sum(want))}")
for f in failures:
    print("FAIL", f)
print(out if failures else "ok")
sys.exit(1 if failures else 0)
