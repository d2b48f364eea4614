#!/usr/bin/python3
"""engine-bench run as a functional test: every benchmark it has, briefly.

A benchmark checks its own work (every packet released, every frame
reduced) and reports a failure with SkipWithError, which does not change
Google Benchmark's exit status; this test fails on any such error, so a
change that breaks a benchmark's traffic (as retiring removed rings once
did to BM_Aggregate's re-installed ring) is caught. Figures are not read.
"""
import json
import subprocess
import sys

exe = sys.argv[1]
r = subprocess.run([exe, "--benchmark_min_time=0.001", "--benchmark_format=json"],
                   capture_output=True, text=True, timeout=600)
if r.returncode != 0:
    sys.exit("engine-bench exited %d:\n%s" % (r.returncode, r.stderr[-3000:]))
runs = json.loads(r.stdout)["benchmarks"]
bad = ["%s: %s" % (b["name"], b.get("error_message", "")) for b in runs if b.get("error_occurred")]
if not runs:
    sys.exit("engine-bench ran no benchmark")
if bad:
    sys.exit("%d of %d benchmarks reported errors:\n  %s" % (len(bad), len(runs), "\n  ".join(bad)))
print("%d benchmarks ran without error" % len(runs))
