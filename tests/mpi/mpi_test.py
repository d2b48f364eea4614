#!/usr/bin/env python3
"""libnetreduce-mpi under a real mpirun (Open MPI, 4 ranks on localhost,
--oversubscribe).

1. mpi-check: its every collective must equal Open MPI's own result (the
   PMPI_ call), and the interposer's report line per communicator must count
   what mpi-check says it made: each delegated call under its reason, and
   each call netreduce could serve as served (--served: a device and its
   settings are given) or, without, as "no communicator". Without --served
   the ranks are given a device that no machine has, so that the test does
   not depend on this machine's devices: every rank must say netreduce was
   not set up, naming it.
2. The same with NETREDUCE_MPI_MIN_BYTES=1000: the calls mpi-check counts
   below 1000 bytes go to MPI as such (the rule:
   docs/mpi.md#what-goes-to-mpi-and-why-it-is-counted).
3. A setting that does not parse stops the job, naming it.
4. An mpi4py program under the preload, against numpy.

Settings the caller's environment has (NETREDUCE_MPI_*) are not passed on:
each run's are its own."""
import argparse
import os
import re
import subprocess
import sys

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4",
          "--mca", "btl", "self,vader,tcp", "--mca", "pml", "ob1",
          # no process_vm_readv: containers without CAP_SYS_PTRACE refuse it
          "--mca", "btl_vader_single_copy_mechanism", "none"]
NO_DEVICE = "nr-test-no-such-device"

REPORT = re.compile(r"^netreduce-mpi: rank (\d+) \(rank (\d+) of (.+?), (\d+) ranks\): (\d+) served "
                    r"\(ina (\d+), ring (\d+)\), (\d+) to MPI(?: \(([^)]*)\))?; (.*)$")
EXPECT = re.compile(r"^mpi-check: rank (\d+) expect (.+) (\d+): (.*)$")


class MpiTestFailed(Exception):
    pass


def fail(msg, out=""):
    raise MpiTestFailed(msg + ("\n" + out[-6000:] if out else ""))


def run(argv, lib=None, settings=None, mpirun=None, timeout=120):
    """mpirun (MPIRUN, or the caller's command line up to the program) with
    -x LD_PRELOAD=lib and -x for each of `settings` (and nothing of the
    caller's NETREDUCE_MPI_*), then argv. (rc, stdout, stderr); a run past
    `timeout` fails with its output."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NETREDUCE_MPI_") and k != "LD_PRELOAD"}
    env.update(settings or {})
    argv = (list(mpirun or MPIRUN) + (["-x", "LD_PRELOAD=" + lib] if lib else []) +
            [x for k in sorted(settings or {}) for x in ("-x", k)] + list(argv))
    try:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        fail("%s still running after %d s" % (" ".join(argv[-2:]), timeout), out + err)
    return p.returncode, p.stdout, p.stderr


def parse_reports(err):
    """{(world rank, label): (served, ina, ring, {reason: n}, path, size)};
    a report line that does not parse fails."""
    out = {}
    for line in err.splitlines():
        m = REPORT.match(line)
        if not m:
            if re.match(r"^netreduce-mpi: rank \d+ .* served ", line):
                fail("a report line that does not parse: " + line)
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


def check_mpi_check(lib, check, served_expected, np=4, mpirun=None, settings=None, args=(),
                    want_path=None, timeout=120):
    """Runs mpi-check under the preload and checks it (see the module's
    doc). served_expected: the settings give a device, every servable call
    must be served (on want_path, "ina" or "ring", when given); otherwise
    the ranks get a device no machine has. Returns {communicator: its
    servable all-reduces' bytes} (rank 0's)."""
    settings = dict(settings or {}, NETREDUCE_MPI_VERBOSE="1")
    if not served_expected:
        settings["NETREDUCE_MPI_DEVICE"] = NO_DEVICE
    rc, out, err = run([check] + list(args), lib, settings, mpirun, timeout)
    if rc != 0:
        fail("mpi-check exited %d" % rc, out + err)
    ranks = re.findall(r"^mpi-check: rank (\d+): (\d+) checks, (\d+) mismatches$", out, re.M)
    if sorted(int(r) for r, _, _ in ranks) != list(range(np)):
        fail("not every rank reported", out + err)
    least = 70 if "--allreduce-only" in args else 300  # what mpi-check makes, give or take
    if any(int(m) != 0 for _, _, m in ranks) or any(int(c) < least for _, c, _ in ranks):
        fail("mismatches against Open MPI, or too few checks: %s" % ranks, out + err)
    reports = parse_reports(err)
    matched, served_total = 0, 0
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
        served_total += served
        eligible = want.pop("eligible", 0)
        if rsize != size:
            fail("rank %d of %s: report says %d ranks, mpi-check %d" % (key + (rsize, size)), err)
        if served_expected:
            if served != eligible or ina + ring != served:
                fail("rank %d of %s: %d calls served, %d could be" % (key + (served, eligible)),
                     err)
            # A barrier always takes the ring path (the box's would fail
            # ranks that enter it far apart): one per communicator, when
            # mpi-check makes one.
            barriers = 0 if "--allreduce-only" in args else 1
            on_path = ina + min(ring, barriers) if want_path == "ina" else ring
            if want_path and served and on_path != served:
                fail("rank %d of %s: %d of %d served calls on the %s path" %
                     (key + (on_path, served, want_path)), err)
        elif served != 0 or reasons.pop("no communicator", 0) != eligible:
            fail("rank %d of %s: without a device the %d servable calls must go to MPI as "
                 "'no communicator'" % (key + (eligible,)), err)
        if reasons != want:
            fail("rank %d of %s: delegated %s, mpi-check made %s" % (key + (reasons, want)), err)
    if matched == 0 or matched != len(reports):
        fail("%d report lines, %d matching mpi-check's 'expect' lines" % (len(reports), matched),
             out + err)
    if served_expected and served_total == 0:
        fail("nothing was served", err)
    if not served_expected:
        why = [l for l in err.splitlines() if "its collectives go to MPI" in l]
        tried = [k for k, v in reports.items() if v[4].startswith("not set up: ")]
        # "no RDMA device named '<NO_DEVICE>'", or none at all on this machine
        if not why or len(why) != len(tried) or not all("no RDMA device" in l for l in why):
            fail("every rank of a communicator netreduce tried must say it was not set up, naming "
                 "the device", err)
        print("  no device (%s): every servable call went to MPI, and every rank said why"
              % NO_DEVICE)
    print("  mpi-check, %d ranks%s: %s checks per rank, 0 mismatches against Open MPI's own "
          "results; %d report lines agree with what it made" %
          (np, "" if not settings.get("NETREDUCE_MPI_MIN_BYTES") else
           ", NETREDUCE_MPI_MIN_BYTES=" + settings["NETREDUCE_MPI_MIN_BYTES"], ranks[0][1], matched))
    return {name: int(b) for r, name, b in
            re.findall(r"^mpi-check: rank (\d+) allreduce-bytes (.+): (\d+)$", out, re.M)
            if r == "0"}


def check_bad_setting(lib, check):
    """A setting that does not parse stops the job, naming it."""
    rc, out, err = run([check], lib, {"NETREDUCE_MPI_MIN_BYTES": "1k"})
    want = "NETREDUCE_MPI_MIN_BYTES='1k' is not a byte count"
    if rc == 0 or want not in err:
        fail("a bad NETREDUCE_MPI_MIN_BYTES: exit %d, and no %r" % (rc, want), out + err)
    print("  a bad setting stops the job: " + next(l for l in err.splitlines() if want in l))


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


def check_mpi4py(lib, served_expected, settings=None):
    """The program above under the preload: numpy's results, and the
    Allreduce and Allgather served (or, without a device, both counted as
    'no communicator')."""
    import mpi4py  # noqa: F401  (the ranks' program needs it: fail here, plainly, without it)
    settings = dict(settings or {})
    if not served_expected:
        settings["NETREDUCE_MPI_DEVICE"] = NO_DEVICE
    rc, out, err = run([sys.executable, "-c", MPI4PY], lib, settings, timeout=180)
    if rc != 0 or out.count("mpi4py: rank") != 4:
        fail("mpi4py under the preload: exit %d" % rc, out + err)
    world = parse_reports(err).get((0, "MPI_COMM_WORLD"))
    if not world:
        fail("mpi4py: no report line for MPI_COMM_WORLD from rank 0", err)
    served, _, _, reasons, _, _ = world
    if (served < 2) if served_expected else (served != 0 or reasons.get("no communicator", 0) < 2):
        fail("mpi4py: Allreduce and Allgather must be %s" %
             ("served" if served_expected else "counted as 'no communicator'"), err)
    print("  mpi4py (numpy Allreduce, Allgather, pickled bcast): 4 ranks ok; %d served, %s to MPI"
          % (served, reasons))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--check", required=True)
    ap.add_argument("--served", action="store_true",
                    help="a device is there (NETREDUCE_MPI_DEVICE and the rest in this "
                         "environment): servable calls must be served")
    ap.add_argument("--want-path", choices=("ina", "ring"))
    a = ap.parse_args()
    lib, check = os.path.abspath(a.lib), os.path.abspath(a.check)
    # --served: this environment's settings are the run's (the lab gives the device).
    settings = {k: v for k, v in os.environ.items() if k.startswith("NETREDUCE_MPI_")} \
        if a.served else {}
    try:
        check_mpi_check(lib, check, a.served, settings=settings, want_path=a.want_path)
        check_mpi_check(lib, check, a.served, settings=dict(settings, NETREDUCE_MPI_MIN_BYTES="1000"),
                        want_path=a.want_path)
        check_bad_setting(lib, check)
        check_mpi4py(lib, a.served, settings)
    except MpiTestFailed as e:
        print("FAIL: %s" % e)
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
