#!/usr/bin/python3
"""System test of the lab itself, with three guests: the interface the
scenarios rely on does what nrlab.py says, and RoCE really has no way around
the box.

Checks (each can fail):
  - a command runs in a guest with its arguments intact (spaces, quotes, $),
    its stdout, stderr and exit status come back; a file written to /nrlab
    in the guest appears in the guest's directory on the host;
  - a host-side program started with Lab.spawn inside the namespace is
    reachable from a guest over TCP at HOST_IP (where netreduced will listen);
  - RoCE between two guests crosses the box (its counters move);
  - with the box stopped mid-transfer, the sender's rxe keeps retransmitting
    and the receiver's rxe receives nothing (the switch has no path around
    the box); Job.kill ends the stalled pair (rxe treats retry_cnt 7 as
    "forever"); restarted, the box carries RoCE again;
  - netem loss on a guest's link (Guest.netem) reaches the RoCE traffic: the
    transfer completes through go-back-N and rxe counts the recovery;
  - a guest booted again (Lab.reboot, as run_step does when a guest's rxe
    wedges) has fresh files and carries TCP and RoCE through the box again.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from lab_common import HOST_IP, Failed, LabError, expect  # noqa: E402
from lab_guest import perftest, perftest_spawn  # noqa: E402
from lab_report import Report  # noqa: E402
from nrlab import Lab  # noqa: E402


def roce_packets(stats):
    return stats["ports"][0]["rx_packets"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataplane", required=True)
    ap.add_argument("--workdir")
    a = ap.parse_args()
    t0 = time.monotonic()
    report, ok = None, False
    try:
        with Lab(guests=3, dataplane=a.dataplane, workdir=a.workdir) as lab:
            report = Report("lab", lab.run_dir)
            g0, g1, g2 = lab.guests
            report.figure("lab setup, 3 guests (boot to rxe0 ready)", "%.1f" % lab.setup_seconds, "s")

            # Commands, arguments, output, status, files.
            r = g0.run(["printf", "%s|", "a b", "c'd", "$HOME", ""], check=True)
            expect(r.out == "a b|c'd|$HOME||", "arguments mangled: %r" % r.out)
            r = g1.run("echo to-stderr >&2; echo to-stdout; exit 7")
            expect((r.rc, r.out, r.err) == (7, "to-stdout\n", "to-stderr\n"), "status/output lost: %r" % r)
            g2.run("echo hello from $(hostname) > /nrlab/hello", check=True)
            with open(os.path.join(g2.dir, "hello")) as f:
                expect(f.read() == "hello from g2\n", "guest file not on the host")
            report.line("guest commands: arguments, stdout, stderr, exit status and /nrlab files round-trip")

            # A host-side service in the namespace, reached from a guest over TCP.
            with open(os.path.join(lab.run_dir, "index.txt"), "w") as f:
                f.write("netreduce lab\n")
            lab.spawn(["/usr/bin/python3", "-m", "http.server", "--bind", HOST_IP, "--directory",
                       lab.run_dir, "8000"], "http")
            r = g0.run("for i in $(seq 100); do exec 3<>/dev/tcp/%s/8000 && break; sleep 0.2; done; "
                       "printf 'GET /index.txt HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3" % HOST_IP, timeout=60)
            expect(r.rc == 0 and "netreduce lab" in r.out, "HOST_IP service unreachable from g0: %r" % r)
            report.line("host service in the namespace reachable from a guest at %s" % HOST_IP)

            # RoCE crosses the box.
            before = roce_packets(lab.box.stats())
            rc, rs = perftest(g0, g2, "ib_send_lat", ["-s", "2", "-n", "20"], 18510, on_hang=report.line)
            expect(rc.rc == 0 and rs.rc == 0, "ib_send_lat g2->g0 failed: %r %r" % (rc, rs))
            moved = roce_packets(lab.box.stats()) - before
            expect(moved >= 40, "only %d RoCE packets crossed the box for 20 round trips" % moved)
            report.figure("ib_send_lat g2 <-> g0: packets through the box", moved)

            # The box stopped mid-transfer: the stream must stall, not find a way around.
            srv, cli = perftest_spawn(g2, g1, "ib_write_bw", ["-s", "65536", "-n", "5000"], 18520)
            deadline = time.monotonic() + 120
            while roce_packets(lab.box.stats()) < 200 and not cli.done():
                expect(time.monotonic() < deadline, "ib_write_bw never got going")
                time.sleep(0.2)
            final = lab.box.stop()
            report.figure("box stopped mid-transfer after forwarding", final["ports"][0]["rx_packets"], "packets")
            time.sleep(2)
            s0, r0 = g1.rxe_counters(), g2.rxe_counters()
            time.sleep(5)
            s1, r1 = g1.rxe_counters(), g2.rxe_counters()
            sent, rcvd = s1["sent_pkts"] - s0["sent_pkts"], r1["rcvd_pkts"] - r0["rcvd_pkts"]
            report.figure("box down 5 s: g1 rxe sent / g2 rxe received", "%d / %d" % (sent, rcvd), "packets")
            expect(rcvd == 0, "g2 received %d RoCE packets with the box stopped: RoCE bypasses the box" % rcvd)
            expect(sent > 0, "g1 did not retransmit while the box was down")
            expect(not cli.done() or cli.wait(1).rc != 0, "ib_write_bw completed with the box stopped")
            # rdma_rxe treats retry_cnt 7 (perftest's value) as "retry forever": the stalled
            # pair does not end by itself. Job.kill ends it.
            for j in (cli, srv):
                j.kill("KILL")
                j.wait(60)
            lab.box.start()
            rc, rs = perftest(g1, g2, "ib_send_lat", ["-s", "2", "-n", "20"], 18530, on_hang=report.line)
            expect(rc.rc == 0 and rs.rc == 0, "ib_send_lat after the box restarted failed: %r %r" % (rc, rs))
            expect(roce_packets(lab.box.stats()) >= 40, "restarted box carried no RoCE")
            report.line("box restarted: ib_send_lat g2 <-> g1 through it again")

            # Loss on a guest link (perftest retries a transfer rxe leaves hanging).
            b0, b1 = g0.rxe_counters(), g1.rxe_counters()
            g0.netem("loss 5%")
            rc, rs = perftest(g1, g0, "ib_write_bw", ["-s", "65536", "-n", "20"], 18540, on_hang=report.line)
            g0.netem(None)
            expect(rc.rc == 0 and rs.rc == 0, "ib_write_bw under 5%% loss failed: %r %r" % (rc, rs))
            e0, e1 = g0.rxe_counters(), g1.rxe_counters()
            recov = {k: v for k, v in ((k, e0.get(k, 0) - b0.get(k, 0)) for k in ("completer_retry_err",
                     "rcvd_seq_err")) if v}
            recov.update({k: v for k, v in ((k, e1.get(k, 0) - b1.get(k, 0)) for k in ("out_of_seq_request",
                          "duplicate_request")) if v})
            report.figure("ib_write_bw g0 -> g1 with netem loss 5% on g0: rxe recovery", recov)
            expect(recov, "netem loss on g0 left no trace in rxe's counters")

            # A guest booted again (what run_step does after an rxe wedge) is whole again.
            g0.run("echo before > /nrlab/marker", check=True)
            lab.reboot([g0])
            expect(os.path.exists(os.path.join(g0.dir + ".1", "marker")) and
                   not os.path.exists(os.path.join(g0.dir, "marker")), "Lab.reboot left g0's old files in place")
            r = g0.run("for i in $(seq 100); do exec 3<>/dev/tcp/%s/8000 && break; sleep 0.2; done; "
                       "printf 'GET /index.txt HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3" % HOST_IP, timeout=60)
            expect(r.rc == 0 and "netreduce lab" in r.out, "HOST_IP unreachable from g0 booted again: %r" % r)
            before = roce_packets(lab.box.stats())
            rc, rs = perftest(g1, g0, "ib_send_lat", ["-s", "2", "-n", "20"], 18550, on_hang=report.line)
            expect(rc.rc == 0 and rs.rc == 0, "ib_send_lat g0 -> g1 after g0 booted again: %r %r" % (rc, rs))
            expect(roce_packets(lab.box.stats()) - before >= 40, "g0 booted again sent no RoCE through the box")
            report.figure("g0 booted again (Lab.reboot): ready in", "%.1f" % g0.ready_seconds, "s")
            report.figure("scenario wall time", "%.1f" % (time.monotonic() - t0), "s")
            ok = True
    except (Failed, LabError) as e:
        print("FAILED: %s" % e, file=sys.stderr)
        if report:
            report.failed(e)
    if report:
        report.save(ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
