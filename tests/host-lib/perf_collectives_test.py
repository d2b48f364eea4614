"""netreduce-allreduce-perf --collective all over the loopback box: every
collective's rows are there and exact (exit status 0), and the box counted,
for every call, the bytes of exactly one all-reduce of what the collective
moves, worked out here from nccl-tests' size convention: broadcast and
all-gather move the buffer as int32 words (padded to 4 bytes; all-gather's
buffer is the world x count output), reduce-scatter and reduce all-reduce
their input, barrier one int32. A collective that went around the box, or
through it twice, changes the count."""
import re
import subprocess
import sys

exe = sys.argv[1]
P = 4
ESIZE = {"fp16": 2, "int64": 8}
CALLS = 1 + 2 + 1  # -w 1, -n 2, the check call (barrier: no check call)
COLLS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "reduce", "barrier")

p = subprocess.run([exe, "--loopback", "--loopback-box", "--world", str(P), "-b", "2", "-e", "8K", "-f", "8",
                    "-n", "2", "-w", "1", "-d", "fp16,int64", "-o", "sum,max", "--collective", "all",
                    "--root", "3"], capture_output=True, text=True, timeout=120)
out = p.stdout + p.stderr
failures = []
if p.returncode != 0:
    failures.append(f"exit {p.returncode}")
if not re.search(r"^# errors: 0, status: ok$", out, re.M):
    failures.append("no clean summary line")


def sizes(first, last=8192, factor=8):
    s = first
    while s <= last:
        yield s
        s = max(s * factor, s + 1)


want = 0
for coll in COLLS:
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+ina\s.*\s%s$" % coll, out, re.M)
    if not rows:
        failures.append(f"{coll}: no rows on the INA path")
    if coll == "barrier":
        want += (1 + 2) * 4
        continue
    ops = ("sum", "max") if coll in ("all_reduce", "reduce_scatter", "reduce") else ("-",)
    for dt, es in ESIZE.items():
        shards = P if coll in ("all_gather", "reduce_scatter") else 1
        expected_rows = []
        for op in ops:
            for b in sizes(max(2, es * shards)):
                count = b // es // shards * shards
                expected_rows.append((str(count * es), str(count), dt, op))
                moved = count * es
                if coll in ("broadcast", "all_gather"):
                    moved = (moved + 3) // 4 * 4
                want += CALLS * moved
        got = [r for r in rows if r[2] == dt]
        if got != expected_rows:
            failures.append(f"{coll} {dt}: rows {got}, expected {expected_rows}")
m = re.search(r"^#\s+0\s+1\s+(\d+)\s+(\d+)$", out, re.M)
if not m or (int(m.group(1)), int(m.group(2))) != (want, P * want):
    failures.append(f"ring 0 bytes / box bytes: {m and m.groups()}, expected {(want, P * want)}")
for f in failures:
    print("FAIL", f)
print(out if failures else "ok: %d bytes per rank through the box, every collective one all-reduce" % want)
sys.exit(1 if failures else 0)
