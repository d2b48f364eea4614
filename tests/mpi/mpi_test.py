#!/usr/bin/env python3
"""libnetreduce-mpi under a real mpirun (Open MPI, 4 ranks on localhost,
--oversubscribe): mpi-check's every collective must equal Open MPI's own
result (the PMPI_ call), and the interposer's report line per communicator
must count what mpi-check says it made: each delegated call under its
reason, and each call netreduce could serve as served, or, on a machine
without an RDMA device, as "no communicator" with the device named. Then
an mpi4py program under the same preload, against numpy."""
import argparse
import os
import re
import subprocess
import sys

import mpi4py  # noqa: F401  (the ranks' program below needs it: fail here, plainly, without it)

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4",
          "--mca", "btl", "self,vader,tcp", "--mca", "pml", "ob1"]

REPORT = re.compile(r"^netreduce-mpi: rank (\d+) \(rank (\d+) of (\S+), (\d+) ranks\): (\d+) served "
                    r"\(ina (\d+), ring (\d+)\), (\d+) to MPI(?: \(([^)]*)\))?; (.*)$")
EXPECT = re.compile(r"^mpi-check: rank (\d+) expect (\S+) (\d+): (.*)$")


class MpiTestFailed(Exception):
    pass


def fail(msg, out=""):
    raise MpiTestFailed(msg + ("\n" + out[-6000:] if out else ""))


def has_rdma_device():
    return os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband")


def run(argv, env_extra, mpirun=None, timeout=600):
    """mpirun (MPIRUN, or the caller's command line up to the program) + "-x"
    for each NETREDUCE_MPI_* setting here and in env_extra, so that every
    rank gets them, + argv."""
    env = dict(os.environ)
    env.update(env_extra)
    passed = sorted(k for k in env if k.startswith("NETREDUCE_") or k == "LD_PRELOAD")
    argv = list(mpirun or MPIRUN) + [x for k in passed for x in ("-x", k)] + list(argv)
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def parse_reports(err):
    """{(world rank, label): (served, ina, ring, {reason: n}, path, size)}"""
    out = {}
    for line in err.splitlines():
        m = REPORT.match(line)
        if not m:
            continue
        reasons = {}
        if m.group(9):
            for part in m.group(9).split(", "):
                what, n = part.rsplit(" ", 1)
                reasons[what] = int(n)
        key = (int(m.group(1)), m.group(3))
        if key in out:
            fail("two reports for rank %d of %s" % key, err)
        out[key] = (int(m.group(5)), int(m.group(6)), int(m.group(7)), reasons, m.group(10),
                    int(m.group(4)))
    return out


def check_mpi_check(lib, check, served_expected, np=4, mpirun=None, env=None, args=(),
                    want_path=None):
    """Runs mpi-check under the preload and checks it (see the module's
    doc). want_path: "ina" or "ring", the path every served call must have
    taken. Returns {communicator: its servable all-reduces' bytes} (rank 0's)."""
    env = dict(env or {}, LD_PRELOAD=lib, NETREDUCE_MPI_VERBOSE="1")
    rc, out, err = run([check] + list(args), env, mpirun)
    if rc != 0:
        fail("mpi-check exited %d" % rc, out + err)
    ranks = re.findall(r"^mpi-check: rank (\d+): (\d+) checks, (\d+) mismatches$", out, re.M)
    if sorted(int(r) for r, _, _ in ranks) != list(range(np)):
        fail("not every rank reported", out + err)
    least = 70 if "--allreduce-only" in args else 300  # what mpi-check makes, give or take
    if any(int(m) != 0 for _, _, m in ranks) or any(int(c) < least for _, c, _ in ranks):
        fail("mismatches against Open MPI, or too few checks: %s" % ranks, out + err)
    reports = parse_reports(err)
    matched = 0
    for line in out.splitlines():
        m = EXPECT.match(line)
        if not m:
            continue
        key, size = (int(m.group(1)), m.group(2)), int(m.group(3))
        want = {k.strip(): int(v) for k, v in re.findall(r"([\w -]+)=(\d+);", m.group(4))}
        if key not in reports:
            fail("no report for rank %d of %s" % key, err)
        served, ina, ring, reasons, path, rsize = reports[key]
        matched += 1
        eligible = want.pop("eligible", 0)
        if rsize != size:
            fail("rank %d of %s: report says %d ranks, mpi-check %d" % (key + (rsize, size)), err)
        if served_expected:
            if served != eligible or ina + ring != served:
                fail("rank %d of %s: %d calls served, %d could be" % (key + (served, eligible)),
                     err)
            if want_path and served and (ina if want_path == "ina" else ring) != served:
                fail("rank %d of %s: %d of %d served calls on the %s path" %
                     (key + (ina if want_path == "ina" else ring, served, want_path)), err)
        elif served != 0 or reasons.pop("no communicator", 0) != eligible:
            fail("rank %d of %s: without a device the %d servable calls must go to MPI as "
                 "'no communicator'" % (key + (eligible,)), err)
        if reasons != want:
            fail("rank %d of %s: delegated %s, mpi-check made %s" % (key + (reasons, want)), err)
    if matched == 0 or matched != len(reports):
        fail("%d report lines, %d matching mpi-check's 'expect' lines" % (len(reports), matched),
             out + err)
    if not served_expected:
        why = [l for l in err.splitlines() if "its collectives go to MPI" in l]
        set_up = [k for k in reports if k[1] != "inter"]  # an intercommunicator never tries
        if len(why) != len(set_up) or not all("no RDMA device" in l for l in why):
            fail("every rank of world and halves must say netreduce was not set up, naming the "
                 "missing device", err)
        print("  no RDMA device here: every servable call went to MPI, and every rank said why")
    print("  mpi-check, %d ranks: %s checks per rank, 0 mismatches against Open MPI; %d report "
          "lines agree with what it made" % (np, ranks[0][1], matched))
    return {name: int(b) for r, name, b in
            re.findall(r"^mpi-check: rank (\d+) allreduce-bytes (\S+): (\d+)$", out, re.M)
            if r == "0"}


MPI4PY = r"""
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
r, p = comm.Get_rank(), comm.Get_size()
x = (np.arange(10000, dtype=np.float64) % 17 - 8 + r) / 8
y = np.empty_like(x)
comm.Allreduce(x, y, op=MPI.SUM)
want = sum((np.arange(10000, dtype=np.float64) % 17 - 8 + k) / 8 for k in range(p))
assert np.array_equal(y, want), "Allreduce differs from numpy"
z = np.arange(64, dtype=np.int32) * (r + 1)
out = np.empty(64 * p, dtype=np.int32)
comm.Allgather(z, out)
assert np.array_equal(out, np.concatenate([np.arange(64, dtype=np.int32) * (k + 1) for k in range(p)]))
obj = comm.bcast({"step": 7, "lr": 0.1} if r == 0 else None, root=0)
assert obj == {"step": 7, "lr": 0.1}
print("mpi4py: rank %d ok" % r, flush=True)
"""


def check_mpi4py(lib):
    rc, out, err = run([sys.executable, "-c", MPI4PY], {"LD_PRELOAD": lib})
    if rc != 0 or out.count("mpi4py: rank") != 4:
        fail("mpi4py under the preload: exit %d" % rc, out + err)
    world = [l for l in err.splitlines()
             if l.startswith("netreduce-mpi: rank 0 (rank 0 of MPI_COMM_WORLD, 4 ranks)")]
    if len(world) != 1:
        fail("mpi4py: no report line for MPI_COMM_WORLD from rank 0", err)
    print("  mpi4py (numpy Allreduce, Allgather, pickled bcast): 4 ranks ok; " + world[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--check", required=True)
    ap.add_argument("--served", action="store_true",
                    help="a device is there: servable calls must be served")
    a = ap.parse_args()
    served = a.served
    if not served and has_rdma_device():
        print("this machine has an RDMA device: expecting served calls")
        served = True
    try:
        check_mpi_check(os.path.abspath(a.lib), os.path.abspath(a.check), served)
        check_mpi4py(os.path.abspath(a.lib))
    except MpiTestFailed as e:
        print("FAIL: %s" % e)
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
