#!/usr/bin/python3
"""System scenario 'parallel': parallel NetReduce and striped rings
over real Soft-RoCE through the box, in one lab of three guests.

Set-up as scenario_allreduce.py: the real netreduced host-side on HOST_IP
(token file), the box in aggregate mode with no ring; every job is
netreduce-allreduce-perf with NETREDUCE_DAEMON and NETREDUCE_TOKEN_FILE, so
global rank 0 registers the job's rings and every rank probes the box.

Steps, each reported on its own and each able to fail:
  parallel-ina: 3 guests x 2 local ranks (P = 6). Local ranks are processes:
     two perf processes per guest, global rank 2 g + l in guest g with
     --local-size 2 --local-rank l (the host identity is the guest's boot id,
     so the bootstrap finds the hosts itself). Ring l = local rank l of every
     guest (ranks l, 2 + l, 4 + l), each its own RC QPs and its own ring id
     at the box: two rings, registered by rank 0 in one call. fp32 and fp64
     sums, 8 B..256 KiB, with --check-order: order-sensitive values checked
     by the tool against the nested rule (local ranks in local order, then
     hosts in ring order), and the tool reports how many elements would
     differ under the other nesting (> 0 required: the check discriminates).
     Required: every rank exits 0, path ina, 0 errors on every row. The box
     (netreduced GET /v1/rings/{id}) counts for ring l exactly 3 x the bytes
     of shard l of every call (shard l of c elements: c // 2, plus one if
     l < c % 2), probe included, and every message completed. Per guest,
     the RDMA WRITE payload it sent (captured on the box's port A, each
     packet once) is exactly one rank's M plus a 24-byte header per message
     (both local ranks together), and its eth0 tx bytes are reported
     against M.
  striped: one rank per guest (P = 3), --rings 2: each tensor cut into two
     stripes (stripe s of c elements: c // 2, plus one if s < c % 2), each on
     its own ring with its own QPs and id; same checks (the nested rule with
     one local rank is the ring order), box counts per ring exactly 3 x its
     stripes' bytes, per-guest payload exactly M plus headers.
  parallel-discover: as parallel-ina (fp32 sum, 8 B..32 KiB) with neither
     --local-size nor --local-rank: the bootstrap finds that each guest (one
     boot id) runs two ranks and numbers them in rank order.
  mpi-local (with --mpi-lib and --mpi-check): tests/mpi/mpi_test.py in g0,
     served: Open MPI's mpirun, 4 ranks in the guest with libnetreduce-mpi
     preloaded, each MPI communicator's netreduce communicator over rxe0 (the
     ring path: rxe delivers a guest's writes to itself, never through the
     box). Every intercepted call x dtype x op equals Open MPI's own result,
     every call netreduce can serve is served on the ring path (also with
     NETREDUCE_MPI_MIN_BYTES=1000), a bad setting stops the job, and mpi4py
     under the preload.
  mpi-box (with --mpi-lib and --mpi-check): one MPI job across the three
     guests, one rank each: mpirun runs in the lab's namespace and starts its
     orteds in the guests through lab_mpi.py (Open MPI's own traffic is
     TCP between the guests). mpi-check --allreduce-only under the preload
     with netreduced: every MPI_Allreduce type x op x size and its in-place
     form equals Open MPI's own result and is served through the box (path
     ina), the delegated calls are counted as such, and the box's ring of
     MPI_COMM_WORLD aggregated exactly 3 x (the bytes of those all-reduces +
     the 4-byte probe).
A report per step (figures, counters) is printed and saved next to the run.
"""
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from lab_box import pcap_frames  # noqa: E402
from lab_common import Failed, LabError, expect  # noqa: E402
import lab_report  # noqa: E402  (its run_step: this file has its own)
from lab_report import Report, scenario_args  # noqa: E402
from nrlab import Lab  # noqa: E402
import scenario_allreduce as sa  # noqa: E402  (Daemon, sweep rules, capture parsing)
sys.path.insert(0, os.path.join(HERE, "..", "mpi"))
import mpi_test  # noqa: E402  (mpi-check under mpirun, and its checks)
import lab_mpi  # noqa: E402  (mpirun across the guests)

GUESTS = 3
BOOT_PORT = 29510
INA_HEADER, QP_TIMEOUT = sa.INA_HEADER, sa.QP_TIMEOUT
DTYPES = sa.DTYPES
RUN = ["-d", "fp32,fp64", "-o", "sum", "-b", "8", "-e", "256K", "-f", "8", "-n", "1", "-w", "0", "-c", "1"]
RUN_SMALL = ["-d", "fp32", "-o", "sum", "-b", "8", "-e", "32K", "-f", "8", "-n", "1", "-w", "0", "-c", "1"]


def part(count, parts, i):
    """plan.h's stripe rule (and the local shard rule): count // parts, one
    more for i < count % parts."""
    return count // parts + (1 if i < count % parts else 0)


def ring_calls(n, R, run):
    """{ring k = l R + s: [(dtype, bytes) of every all-reduce it carries]}:
    stripe s of shard l of every call (one local chunk: the sizes stay far
    below ring_buffer_bytes), and the probe (int32 x 1 per ring)."""
    out = {}
    for d, _, b in sa.expected_calls(run):
        es = DTYPES[d]
        for l in range(n):
            shard = part(b // es, n, l)
            for s in range(R):
                out.setdefault(l * R + s, []).append((d, part(shard, R, s) * es))
    for k in out:
        out[k].append(("int32", 4))
    return out


class ParJob:
    """One perf run: `per_guest` processes in each guest, global rank
    g * per_guest + l, all at once."""

    def __init__(self, lab, a, daemon, per_guest, extra, tag, run, discover):
        self.lab, self.tag, self.per_guest = lab, tag, per_guest
        env = {"NETREDUCE_DAEMON": daemon.url, "NETREDUCE_TOKEN_FILE": daemon.token_file}
        world = GUESTS * per_guest
        g0 = lab.guests[0]
        self.jobs = []
        for g in lab.guests:
            for l in range(per_guest):
                rank = lab.guests.index(g) * per_guest + l
                argv = [a.perf, "--rank", rank, "--world", world, "--bootstrap", "%s:%d" % (g0.ip, BOOT_PORT),
                        "--device", "rxe0", "--gid-index", g.gid_index, "--qp-timeout", QP_TIMEOUT,
                        "--keep-ring", "--check-order", "--path", "ina"] + list(extra) + run
                if per_guest > 1 and not discover:
                    argv += ["--local-size", per_guest, "--local-rank", l]
                self.jobs.append(g.spawn(argv, env=env))

    def wait(self, timeout):
        results = [j.wait(timeout) for j in self.jobs]
        if any(r.rc != 0 for r in results):
            raise Failed("%s: ranks exited %s\n%s\n--- rank 0 stdout\n%s" % (
                self.tag, [r.rc for r in results],
                "\n".join("rank %d: %s" % (i, r.err.strip()[-1200:]) for i, r in enumerate(results)),
                results[0].out[-2000:]))
        return results


def check_output(tag, results, n, R, run):
    """Rank 0's table and summary; returns (reason, the job's ring ids)."""
    out = results[0].out
    m = re.search(r"^# netreduce-allreduce-perf: world (\d+), path (\w+) \((.*)\), ring (\d+), window (\d+)$",
                  out, re.M)
    expect(m, "%s: no header line in rank 0's output:\n%s" % (tag, out[-2000:]))
    expect(int(m.group(1)) == GUESTS * n and m.group(2) == "ina",
           "%s: world %s path %s (%s), expected %d, ina" % (tag, m.group(1), m.group(2), m.group(3), GUESTS * n))
    reason = m.group(3)
    ids_m = re.search(r"^(\d+) rings \(ids ([\d, ]+)\) installed by the daemon", reason)
    expect(ids_m and int(ids_m.group(1)) == n * R, "%s: reason names no %d rings: %s" % (tag, n * R, reason))
    ids = [int(x) for x in ids_m.group(2).split(", ")]
    if n > 1:
        expect(re.search(r"^# local size %d: %d hosts; local rank l of every host forms ring l \(%d x %d rings\)$"
                         % (n, GUESTS, n, R), out, re.M), "%s: no '# local size' line" % tag)
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) == 11 and f[10] == "all_reduce" and not line.startswith("#") and f[0].isdigit():
            rows.append((f[2], f[3], int(f[0]), f[4], f[8]))
    want = sorted({(d, o, b) for d, o, b in sa.expected_calls(run)})
    expect(sorted((d, o, b) for d, o, b, _, _ in rows) == want, "%s: rows %s, expected %s" % (tag, rows, want))
    for d, o, b, path, errors in rows:
        expect(path == "ina" and errors == "0", "%s: %s %s %d B: path %s, %s errors" % (tag, d, o, b, path, errors))
    om = re.search(r"^# order check: (\d+) elements against the nested rule .*; (\d+) of them differ under the "
                   r"other nesting$", out, re.M)
    want_checked = sum(b // DTYPES[d] for d, _, b in want)
    expect(om and int(om.group(1)) == want_checked,
           "%s: order check line %s, expected %d elements" % (tag, om and om.group(0), want_checked))
    if n > 1:
        expect(int(om.group(2)) > 0, "%s: no element differs between the nestings: the check proves nothing" % tag)
    expect(re.search(r"^# errors: 0, status: ok$", out, re.M), "%s: no clean summary line" % tag)
    for r, res in enumerate(results[1:], 1):
        expect(not re.search(r"^\s+\d+ ", res.out, re.M), "%s: rank %d reported rows:\n%s" % (tag, r, res.out))
    return reason, ids, (int(om.group(1)), int(om.group(2)))


def run_step(lab, a, daemon, rep, n, R, run=RUN, discover=False):
    tag = "%d guests x %d local ranks%s, %d stripe(s)" % (GUESTS, n, " (discovered)" if discover else "", R)
    cap = lab.capture(("swa",))
    rx0, tx0, t = sa.rxe_all(lab), sa.tx_bytes(lab), time.monotonic()
    try:
        job = ParJob(lab, a, daemon, n, ["--rings", str(R)] if R > 1 else [], tag, run, discover)
        results = job.wait(900)
    except BaseException:
        cap.stop()
        raise
    secs = time.monotonic() - t
    tx = [b - a_ for a_, b in zip(tx0, sa.tx_bytes(lab))]
    time.sleep(1)
    path, kdrops = cap.stop()["swa"]
    reason, ids, (checked, other) = check_output(tag, results, n, R, run)
    a_ = dict(zip(run[::2], run[1::2]))
    rep.line("%s: P = %d, %s sum, %s B..%s B, each size timed once and checked once against the nested order "
             "rule" % (tag, GUESTS * n, a_["-d"], a_["-b"], a_["-e"]))
    rep.figure("job wall time", "%.1f" % secs, "s")
    rep.figure("path reason", reason)
    rep.figure("order check: elements / differing under the other nesting", "%d / %d" % (checked, other))

    # The box's count per ring.
    calls = ring_calls(n, R, run)
    for k, rid in enumerate(ids):
        c = daemon.ring(rid)["counters"]
        wb = GUESTS * sum(b for _, b in calls[k])
        wm = sum(sa.messages(b, DTYPES[d]) for d, b in calls[k])
        rep.figure("box ring %d (id %d, local rank %d, stripe %d): data bytes aggregated (expected)" %
                   (k, rid, k // R, k % R), "%d (%d)" % (c["bytes_aggregated"], wb))
        rep.figure("  messages completed (expected) / retransmissions served",
                   "%d (%d) / %d" % (c["messages_completed"], wm, c["retransmissions_served"]))
        expect(c["bytes_aggregated"] == wb, "%s: box ring %d aggregated %d bytes, expected %d" %
               (tag, rid, c["bytes_aggregated"], wb))
        expect(c["messages_completed"] == wm, "%s: box ring %d completed %d messages, expected %d" %
               (tag, rid, c["messages_completed"], wm))

    # Per guest: one rank's M plus headers, whatever n and R.
    m = sum(b for _, _, b in sa.expected_calls(run))
    want_wire = sum(b + INA_HEADER * sa.messages(b, DTYPES[d]) for k in calls for d, b in calls[k])
    expect(kdrops == 0, "%s: the capture dropped %d frames" % (tag, kdrops))
    by_src = sa.write_payload_by_source(pcap_frames(path))
    wire = [by_src.get(g.ip, 0) for g in lab.guests]
    rep.figure("M (one rank's data, every call)", m, "bytes")
    rep.figure("RDMA WRITE payload per guest (g0, g1, g2), captured once each", ", ".join(str(x) for x in wire))
    rep.figure("  expected: M + 24 B per message + probes", want_wire)
    rep.figure("  per guest / M", ", ".join("%.4f" % (x / m) for x in wire))
    rep.figure("eth0 tx bytes per guest (everything: RoCE headers, ACKs, TCP)", ", ".join(str(x) for x in tx))
    rep.figure("  per guest / M", ", ".join("%.3f" % (x / m) for x in tx))
    expect(wire == [want_wire] * GUESTS, "%s: guests sent %s RDMA WRITE payload bytes, expected %d each" %
           (tag, wire, want_wire))
    sa.check_rxe_clean(rep, lab, rx0, sa.rxe_all(lab), tag)


def step_parallel(lab, a, daemon, reports):
    run_step(lab, a, daemon, reports["parallel-ina"], 2, 1)


def step_striped(lab, a, daemon, reports):
    run_step(lab, a, daemon, reports["striped"], 1, 2)


def step_discover(lab, a, daemon, reports):
    run_step(lab, a, daemon, reports["parallel-discover"], 2, 1, RUN_SMALL, discover=True)


def step_mpi_local(lab, a, daemon, reports):
    rep, g = reports["mpi-local"], lab.guests[0]
    env = {"NETREDUCE_MPI_DEVICE": "rxe0", "NETREDUCE_MPI_GID_INDEX": str(g.gid_index),
           "NETREDUCE_MPI_LOCAL_SIZE": "1", "NETREDUCE_MPI_REQUIRE": "1",
           "NETREDUCE_MPI_TIMEOUT_MS": "30000"}
    r = g.run(["/usr/bin/python3", os.path.join(HERE, "..", "mpi", "mpi_test.py"), "--served",
               "--want-path", "ring", "--lib", a.mpi_lib, "--check", a.mpi_check], env=env,
              timeout=420)
    expect(r.rc == 0 and r.out.rstrip().endswith("PASS"),
           "mpi_test.py in %s (exit %d):\n%s%s" % (g.name, r.rc, r.out[-4000:], r.err[-4000:]))
    for line in r.out.splitlines():
        if line.startswith("  "):
            rep.line(line.strip())
    rep.figure("mpirun, 4 ranks in %s: mpi-check and mpi4py" % g.name, "%.1f" % r.seconds, "s")


def step_mpi_box(lab, a, daemon, reports):
    rep = reports["mpi-box"]
    gids = {g.gid_index for g in lab.guests}
    expect(len(gids) == 1, "the guests' RoCEv2 GID indexes differ (%s): one setting cannot serve" % gids)
    mpirun = lab_mpi.mpirun_argv(lab)
    env = {"NETREDUCE_DAEMON": daemon.url, "NETREDUCE_TOKEN_FILE": daemon.token_file,
           "NETREDUCE_MPI_DEVICE": "rxe0", "NETREDUCE_MPI_GID_INDEX": str(gids.pop()),
           "NETREDUCE_MPI_QP_TIMEOUT": str(QP_TIMEOUT), "NETREDUCE_MPI_KEEP_RINGS": "1",
           "NETREDUCE_MPI_REQUIRE": "1", "NETREDUCE_MPI_LOCAL_SIZE": "1",
           "NETREDUCE_MPI_TIMEOUT_MS": "30000"}
    before = {r["spec"]["id"] for r in lab.box.control(cmd="list_rings").get("rings", [])}
    t = time.monotonic()
    try:
        ar = mpi_test.check_mpi_check(a.mpi_lib, a.mpi_check, True, np=GUESTS, mpirun=mpirun,
                                      settings=env, args=["--allreduce-only"], want_path="ina",
                                      timeout=240)
    except mpi_test.MpiTestFailed as e:
        raise Failed("mpi-check across the guests: %s" % e)
    rep.figure("mpirun, 3 ranks (one per guest): mpi-check --allreduce-only", "%.1f" % (time.monotonic() - t), "s")
    rings = [r for r in lab.box.control(cmd="list_rings").get("rings", []) if r["spec"]["id"] not in before]
    expect(len(rings) == 1, "expected one new ring at the box (MPI_COMM_WORLD's), found %s" %
           [r["spec"]["id"] for r in rings])
    c = rings[0]["counters"]
    want = GUESTS * (ar["MPI_COMM_WORLD"] + 4)
    rep.figure("box: MPI_COMM_WORLD's ring %d, data bytes aggregated (expected 3 x (all-reduces + probe))"
               % rings[0]["spec"]["id"], "%d (%d)" % (c["bytes_aggregated"], want))
    expect(c["bytes_aggregated"] == want, "the box aggregated %d bytes for MPI_COMM_WORLD's ring, expected %d"
           % (c["bytes_aggregated"], want))


def main():
    def extra(ap):
        ap.add_argument("--steps", default=None)
        ap.add_argument("--mpi-lib")
        ap.add_argument("--mpi-check")
    a, ap = scenario_args(("dataplane", "daemon", "perf"), extra)
    t0 = time.monotonic()
    steps = {"parallel-ina": step_parallel, "striped": step_striped, "parallel-discover": step_discover,
             "mpi-local": step_mpi_local, "mpi-box": step_mpi_box}
    if a.steps is None:
        a.steps = "parallel-ina,striped,parallel-discover" + (",mpi-local,mpi-box" if a.mpi_lib else "")
    if (a.mpi_lib is None) != (a.mpi_check is None):
        ap.error("--mpi-lib and --mpi-check go together")
    if a.mpi_lib:
        a.mpi_lib, a.mpi_check = os.path.abspath(a.mpi_lib), os.path.abspath(a.mpi_check)
    chosen = a.steps.split(",")
    if ("mpi-local" in chosen or "mpi-box" in chosen) and not a.mpi_lib:
        ap.error("--steps mpi-local and mpi-box need --mpi-lib and --mpi-check")
    for s in chosen:
        if s not in steps:
            ap.error("--steps: unknown step %r (known: %s)" % (s, ", ".join(steps)))
    reports, done, failed = {}, [], None
    try:
        with Lab(guests=GUESTS, dataplane=a.dataplane, workdir=a.workdir, box_mode="aggregate") as lab:
            reports = {s: Report(s, lab.run_dir) for s in chosen}
            for r in reports.values():
                r.figure("lab setup, 3 guests (boot to rxe0 ready)", "%.1f" % lab.setup_seconds, "s")
            daemon = sa.Daemon(lab, a.daemon)
            for s in chosen:
                failed = s
                t = time.monotonic()
                lab_report.run_step(lab, [reports[s]], steps[s], lab, a, daemon, reports)
                reports[s].figure("step wall time", "%.1f" % (time.monotonic() - t), "s")
                done.append(s)
            failed = None
    except (Failed, LabError) as e:
        print("FAILED (%s): %s" % (failed, e), file=sys.stderr)
        if failed in reports:
            reports[failed].failed(e)
    for s, r in reports.items():
        if s not in done and not any(l.startswith("FAILED") for l in r.lines):
            r.line("not run (an earlier step failed)")
        r.save(s in done)
    print("scenario wall time %.1f s" % (time.monotonic() - t0), flush=True)
    return 0 if failed is None and len(done) == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
