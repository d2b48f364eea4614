#!/usr/bin/python3
"""MPI_Allreduce latency and bus bandwidth in the Soft-RoCE lab, OSU-style:
the same MPI program (mpi-allreduce-bench) under the same mpirun across the
lab's guests (one rank each), first as Open MPI runs it (TCP between the
guests), then with libnetreduce-mpi preloaded and netreduced registering
the job's ring at the box. Every size's first call is checked against
Open MPI's own result in both runs.

    bench/mpi_lab.py --dataplane build/src/dataplane/netreduce-dataplane \\
        --daemon build/src/control/netreduced --lib build/src/mpi/libnetreduce-mpi.so \\
        --bench build/bench/mpi-allreduce-bench [--guests 3] [--max-bytes 256K] [--iters 5]

The guests are emulated (QEMU TCG, 1 vCPU each, rdma_rxe): the figures say
how the two paths compare on this lab's links, not what RDMA hardware does.
"""
import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "system"))
import lab_mpi  # noqa: E402
import scenario_allreduce as sa  # noqa: E402  (Daemon, QP_TIMEOUT)
from nrlab import Lab  # noqa: E402

ROW = re.compile(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$")


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def run(mpirun, bench, args, env):
    argv = list(mpirun) + [x for k in sorted(env) for x in ("-x", k)] + [bench] + args
    t = time.monotonic()
    p = subprocess.run(argv, env=dict(os.environ, **env), capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit("mpi-allreduce-bench failed (exit %d):\n%s%s" % (p.returncode, p.stdout[-3000:],
                                                                  p.stderr[-3000:]))
    rows = {int(m.group(1)): (float(m.group(2)), float(m.group(4)))
            for m in map(ROW.match, p.stdout.splitlines()) if m}
    report = [l for l in p.stderr.splitlines() if l.startswith("netreduce-mpi: rank 0 (rank 0 of MPI_COMM_WORLD")]
    return rows, report, time.monotonic() - t


def main():
    ap = argparse.ArgumentParser()
    for t in ("dataplane", "daemon", "lib", "bench"):
        ap.add_argument("--" + t, required=True)
    ap.add_argument("--guests", type=int, default=3)
    ap.add_argument("--max-bytes", default="256K")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--workdir")
    a = ap.parse_args()
    for t in ("dataplane", "daemon", "lib", "bench"):
        setattr(a, t, os.path.abspath(getattr(a, t)))
    args = ["-b", "8", "-e", str(parse_size(a.max_bytes)), "-f", "4", "-n", str(a.iters), "-w", "1"]
    with Lab(guests=a.guests, dataplane=a.dataplane, workdir=a.workdir, box_mode="aggregate") as lab:
        daemon = sa.Daemon(lab, a.daemon)
        mpirun = lab_mpi.mpirun_argv(lab)
        mpi, _, mpi_s = run(mpirun, a.bench, args, {})
        env = {"LD_PRELOAD": a.lib, "NETREDUCE_DAEMON": daemon.url,
               "NETREDUCE_TOKEN_FILE": daemon.token_file, "NETREDUCE_MPI_DEVICE": "rxe0",
               "NETREDUCE_MPI_GID_INDEX": str(lab.guests[0].gid_index),
               "NETREDUCE_MPI_QP_TIMEOUT": str(sa.QP_TIMEOUT), "NETREDUCE_MPI_REQUIRE": "1",
               "NETREDUCE_MPI_LOCAL_SIZE": "1"}
        nr, report, nr_s = run(mpirun, a.bench, args, env)
    # Every call with the preload went through the box: sizes x (warm-up +
    # checked + timed), all on the INA path, as rank 0's report line says.
    calls = len(nr) * (1 + 1 + a.iters)
    want = "%d served (ina %d, ring 0), 0 to MPI" % (calls, calls)
    if len(report) != 1 or want not in report[0]:
        sys.exit("with libnetreduce-mpi not every call was served through the box (want %r): %s"
                 % (want, report))
    print("# MPI_Allreduce, MPI_FLOAT sum, P = %d (one rank per lab guest), %d timed calls per size"
          % (a.guests, a.iters))
    print("# Open MPI alone (TCP): %.0f s; with libnetreduce-mpi: %.0f s" % (mpi_s, nr_s))
    for line in report:
        print("# " + line)
    print("| bytes | Open MPI us | netreduce us | Open MPI / netreduce | Open MPI busbw Gbit/s | "
          "netreduce busbw Gbit/s |")
    print("|---|---|---|---|---|---|")
    for b in sorted(mpi):
        if b in nr:
            print("| %d | %.0f | %.0f | %.2f | %.4f | %.4f |" % (b, mpi[b][0], nr[b][0], mpi[b][0] / nr[b][0],
                                                            mpi[b][1], nr[b][1]))


if __name__ == "__main__":
    main()
