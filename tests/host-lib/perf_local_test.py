"""netreduce-allreduce-perf --local-size n over the loopback box: H hosts of
n local ranks (threads), ring l = local rank l of every host, striped R
ways. The report's table lists host 0's n x R rings: ring l R + s carries
stripe s of shard l of every call (the rules written out here: shard l of
count elements holds count // n, one more for l < count % n; stripe s of a
shard likewise over R), the box counts H copies of it, and each host's
payload bytes into the box equal one rank's data, not n x. Exit status 0
(every size checked exact).

--check-order: fp32 and fp64 sums of order-sensitive values, checked by the
tool against parallel NetReduce's nested rule (local ranks, then hosts), with
elements that would differ under the other nesting (so the check
discriminates); on the ring path (--force-ring) the tool refuses to claim it.
--rack-size K: the multi-rack tree's nesting, which the flat loopback box meets
only for racks of one rank."""
import re
import subprocess
import sys

exe = sys.argv[1]
H, N, R, ESIZE = 2, 3, 2, 4
SIZES_B = [4, 32, 256, 2048, 16384]  # -b 4 -e 16K -f 8, fp32 (all within one local chunk)
CALLS = 1 + 2 + 1                    # -w 1, -n 2, the check call


def part(count, parts, i):
    return count // parts + (1 if i < count % parts else 0)


p = subprocess.run([exe, "--loopback", "--loopback-box", "--world", str(H * N), "--local-size", str(N),
                    "--rings", str(R), "-b", "4", "-e", "16K", "-f", "8", "-n", "2", "-w", "1",
                    "-d", "fp32", "-o", "sum"], capture_output=True, text=True, timeout=120)
out = p.stdout + p.stderr
failures = []
if p.returncode != 0:
    failures.append(f"exit {p.returncode}: {out}")
if not re.search(rf"^# local size {N}: {H} hosts; local rank l of every host forms ring l \({N} x {R} rings\)",
                 out, re.M):
    failures.append("no '# local size' line")
want = [0] * (N * R)
one_rank = 0
for b in SIZES_B:
    count = b // ESIZE
    one_rank += count * ESIZE * CALLS
    for l in range(N):
        shard = part(count, N, l)
        for s in range(R):
            want[l * R + s] += part(shard, R, s) * ESIZE * CALLS
rows = {m.group(1): (int(m.group(2)), int(m.group(3)), int(m.group(4)) if m.group(4) else None)
        for m in re.finditer(r"^#\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$", out, re.M)}
for g in range(N * R):
    got = rows.get(str(g))
    if got != (1 + g, want[g], H * want[g]):
        failures.append(f"ring {g}: {got}, expected {(1 + g, want[g], H * want[g])}")
m = re.search(r"^#\s+all\s+(\d+)\s+(\d+)$", out, re.M)
if not m or (int(m.group(1)), int(m.group(2))) != (one_rank, H * one_rank):
    failures.append(f"all: {m and m.groups()}, expected {(one_rank, H * one_rank)}")
for h in range(H):
    if not re.search(rf"^# host {h}: {one_rank} payload bytes on the wire into the box "
                     rf"\(one rank's data: {one_rank}\)$", out, re.M):
        failures.append(f"host {h}: no line with {one_rank} bytes")
p = subprocess.run([exe, "--loopback", "--loopback-box", "--world", str(H * N), "--local-size", str(N),
                    "--rings", str(R), "-b", "8", "-e", "64K", "-f", "4", "-n", "1", "-w", "0",
                    "-d", "fp32,fp64", "-o", "sum", "--check-order"], capture_output=True, text=True,
                   timeout=120)
m = re.search(r"^# order check: (\d+) elements against the nested rule \(local ranks in local order, "
              rf"then {H} hosts in ring order\); (\d+) of them differ under the other nesting$",
              p.stdout, re.M)
# fp32: 2 + 8 + ... + 16384 elements over sizes 8 B .. 64 KB (x4); fp64 half of that
want_checked = sum(b // 4 for b in (8, 32, 128, 512, 2048, 8192, 32768)) + \
    sum(b // 8 for b in (8, 32, 128, 512, 2048, 8192, 32768))
if p.returncode != 0 or not m or int(m.group(1)) != want_checked or int(m.group(2)) == 0:
    failures.append(f"--check-order: exit {p.returncode}, {m and m.groups()} (want {want_checked} "
                    f"checked, some differing): {p.stdout}{p.stderr}")
p = subprocess.run([exe, "--loopback", "--loopback-box", "--force-ring", "--world", "4", "--local-size", "2",
                    "-b", "8", "-e", "8", "--check-order"], capture_output=True, text=True, timeout=120)
if p.returncode != 1 or "# order check: the path is ring" not in p.stdout:
    failures.append(f"--check-order on the ring path: exit {p.returncode}: {p.stdout}{p.stderr}")
# --rack-size K: the multi-rack tree's nesting (racks of K ranks, then the racks), which the lab's
# trees must meet. The loopback box is one flat ring ((r0 + r1) + r2) + r3: it meets racks of 1
# and must fail racks of 2 (the check tells the tree's order from the flat one).
for k, want_ok in ((1, True), (2, False)):
    p = subprocess.run([exe, "--loopback", "--loopback-box", "--world", "4", "-b", "4K", "-e", "4K", "-n", "1",
                        "-w", "0", "-d", "fp32", "-o", "sum", "--check-order", "--rack-size", str(k)],
                       capture_output=True, text=True, timeout=120)
    m = re.search(rf"^# order check: 1024 elements against the nested rule \(racks of {k} ranks in rank order, "
                  rf"then {4 // k} racks in order\); (\d+) of them differ under the flat ring order", p.stdout, re.M)
    e = re.search(r"^# errors: (\d+), status: (\w+)$", p.stdout, re.M)
    got_ok = p.returncode == 0 and e and e.groups() == ("0", "ok")
    # The flat box's result is the flat order: rank 0's errors are exactly the elements that differ.
    if not m or got_ok != want_ok or not e or int(e.group(1)) != int(m.group(1)):
        failures.append(f"--rack-size {k}: exit {p.returncode}, expected {'success' if want_ok else 'errors'}: "
                        f"{p.stdout}{p.stderr}")
p = subprocess.run([exe, "--loopback", "--world", "4", "--rack-size", "3", "--check-order"],
                   capture_output=True, text=True, timeout=120)
if p.returncode != 1 or "--rack-size: needs --check-order, one rank per host and must divide --world" \
        not in p.stderr:
    failures.append(f"--rack-size 3 of 4 ranks: exit {p.returncode}: {p.stderr}")
for f in failures:
    print("FAIL", f)
print(out if failures else "ok")
sys.exit(1 if failures else 0)
