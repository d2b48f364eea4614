#!/usr/bin/env python3
"""netreduce-loopback --quiet prints the result table and nothing else; with
--json as well it prints nothing, and the report is in the file.

  loopback_quiet_test.py LOOPBACK_EXE WORKDIR

One short in-process run each way (the box on net_ring ports). Stdout must
hold no JSON (the in-process box's final counters must not follow the table
as one multi-kilobyte line) and no log line of the box, and neither stream a
progress line; the JSON report must parse and say ok.
"""
import json
import os
import re
import subprocess
import sys

exe, workdir = sys.argv[1], sys.argv[2]
os.makedirs(workdir, exist_ok=True)
args = [exe, "--ranks", "2", "--payloads", "1024", "--dtypes", "fp32", "--seconds", "0.05",
        "--latency-rounds", "5", "--idle-seconds", "0", "--quiet"]

r = subprocess.run(args, capture_output=True, text=True, timeout=120)
assert r.returncode == 0, "--quiet run failed (exit %d):\n%s" % (r.returncode, r.stderr[-3000:])
lines = [l for l in r.stdout.splitlines() if l.strip()]
assert lines, "--quiet printed no table"
logs = [l for l in lines if re.match(r"\[\d{4}-\d\d-\d\d ", l)]
assert not logs, "--quiet printed the box's log lines on stdout: %s" % logs[:3]
json_lines = [l for l in lines if l.lstrip().startswith("{")]
assert not json_lines, "--quiet printed JSON on stdout (%d bytes): %s..." % (
    sum(map(len, json_lines)), json_lines[0][:200])
# Progress lines ("  P=2 payload=1024 fp32: aggregate ...") go to stderr.
progress = [l for l in (r.stdout + r.stderr).splitlines() if l.startswith(("  P=", "per-worker:"))]
assert not progress, "--quiet printed progress lines: %s" % progress
assert max(map(len, lines)) < 400, "--quiet printed a line of %d characters" % max(map(len, lines))
print("--quiet: %d lines, the longest %d characters, no JSON" % (len(lines), max(map(len, lines))))

report = os.path.join(workdir, "quiet-report.json")
r = subprocess.run(args + ["--json", report], capture_output=True, text=True, timeout=120)
assert r.returncode == 0, "--quiet --json run failed (exit %d):\n%s" % (r.returncode, r.stderr[-3000:])
assert r.stdout == "", "--quiet --json printed %d bytes on stdout: %r" % (len(r.stdout), r.stdout[:300])
with open(report) as f:
    rep = json.load(f)
assert rep["ok"] is True and rep["points"], "the JSON report says %s" % {k: rep[k] for k in ("ok",) if k in rep}
print("--quiet --json: stdout empty, %s holds %d points, ok" % (report, len(rep["points"])))

# The lcores' CPUs: the box worker (lcore 1) and the generator (lcore 2) on
# CPUs of their own where the process may use three, else the 2-CPU layout.
cpus = sorted(os.sched_getaffinity(0))
want = cpus[:3] if len(cpus) >= 3 else [cpus[0], cpus[1 % len(cpus)], cpus[0]]
assert rep["lcore_cpus"] == want, "lcores on CPUs %s, expected %s with %d CPUs usable" % (
    rep["lcore_cpus"], want, len(cpus))
print("lcore CPUs %s with %d CPUs usable" % (rep["lcore_cpus"], len(cpus)))

# Two box workers: workers on the CPUs after the first, generators after
# them, round the CPUs (the 2-CPU layout: workers on the second, the rest on
# the first).
report2 = os.path.join(workdir, "quiet-report-2.json")
r = subprocess.run([exe, "--workers", "2", "--ranks", "2", "--payloads", "1024", "--dtypes", "fp32",
                    "--seconds", "0.05", "--quiet", "--json", report2], capture_output=True, text=True, timeout=120)
assert r.returncode == 0, "--workers 2 run failed (exit %d):\n%s" % (r.returncode, r.stderr[-3000:])
with open(report2) as f:
    got = json.load(f)["lcore_cpus"]
n = len(cpus)
if n <= 2:
    want = [cpus[0], cpus[1 % n], cpus[0], cpus[1 % n], cpus[0]]
else:
    want = [cpus[0], cpus[1 % n], cpus[3 % n], cpus[2 % n], cpus[4 % n]]
assert got == want, "--workers 2: lcores on CPUs %s, expected %s with %d CPUs usable" % (got, want, n)
print("--workers 2: lcore CPUs %s" % got)
