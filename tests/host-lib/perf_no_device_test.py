"""netreduce-allreduce-perf on a machine without RDMA devices: it must exit
non-zero with a clear "no RDMA device" message and must not crash (no signal,
no sanitizer report). Also: bad arguments give a usage error, not a crash."""
import subprocess
import sys

exe = sys.argv[1]


def run(args):
    p = subprocess.run([exe] + args, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


failures = []
rc, out = run(["--rank", "0", "--world", "2", "--bootstrap", "127.0.0.1:29517"])
if rc <= 0 or "no RDMA device" not in out or "AddressSanitizer" in out or "runtime error" in out:
    failures.append(f"no device: rc={rc} output={out!r}")
rc, out = run(["--rank", "0", "--world", "2", "--bootstrap", "127.0.0.1:29517",
               "--device", "mlx5_404"])
if rc <= 0 or "no RDMA device" not in out:
    failures.append(f"named device: rc={rc} output={out!r}")
for bad in (["--rank", "5", "--world", "2", "--bootstrap", "127.0.0.1:1"],
            ["--rank", "0", "--world", "2", "--bootstrap", "nohostport"],
            ["--rank", "0", "--world", "2", "--bootstrap", "127.0.0.1:1", "-d", "fp8"],
            ["--rank", "0", "--world", "2", "--bootstrap", "127.0.0.1:1", "-o", "prod"],
            ["--rank", "0", "--world", "2", "--bootstrap", "127.0.0.1:1", "-d", "fp32,fp8"],
            ["--rank", "0", "--world", "2", "--bootstrap", "127.0.0.1:1", "-o", "sum,"],
            ["--rank", "0", "--world", "2", "--bootstrap", "127.0.0.1:1", "-b", "1M", "-e", "1K"],
            ["--rank", "0", "--world", "2", "--bootstrap", "127.0.0.1:1", "--rings", "9"]):
    rc, out = run(bad)
    if rc <= 0 or "AddressSanitizer" in out:
        failures.append(f"{bad}: rc={rc} output={out!r}")
for f in failures:
    print("FAIL", f)
print("ok" if not failures else f"{len(failures)} failures")
sys.exit(1 if failures else 0)
