#!/usr/bin/python3
"""System scenario 1 (transparent forwarding) with scenario 5's capture check.

Two Soft-RoCE guests run perftest through the real netreduce-dataplane, in
aggregate mode with no ring installed: ib_write_bw (RDMA WRITE, RC, 64 KiB
messages, path MTU 1024) and ib_send_lat (SEND, 2 bytes). Meanwhile tcpdump
captures what the switch steers into the box's port A (swa) and what the box
sends back out of port B (swb).

Checks (each can fail):
  - both perftest pairs complete (rxe checks every PSN and ICRC: a frame the
    box damaged would be dropped by the receiver and the run would stall);
  - the box saw the RoCE traffic and forwarded it untouched: fwd_no_ina counts
    at least every WRITE packet perftest must have sent, fwd_not_write the
    ACKs and SENDs; no drop reason, nothing held, nothing that is not RoCE
    (the switch steers only UDP 4791 to the box);
  - every frame the taps' steering rule redirected entered the box, and the
    box sent out of port B what it received on port A;
  - scenario 5: every RoCE frame captured on both sides has a valid ICRC
    according to netreduce-pcap-inspect (frames made by Linux rxe, checked by
    our ICRC code) and, for the frames the box emitted, according to scapy;
    with no capture drops the two captures are the same multiset of frames,
    byte for byte.
A report (figures and counters) is printed and saved next to the run.
"""
import argparse
import collections
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from lab_box import inspect_capture, pcap_frames, scapy_icrc_check  # noqa: E402
from lab_common import Failed, LabError, expect  # noqa: E402
from lab_guest import perftest  # noqa: E402
from lab_report import Report  # noqa: E402
from nrlab import Lab  # noqa: E402

WRITE_SIZE, WRITE_ITERS = 65536, 200
LAT_SIZE, LAT_ITERS = 2, 100
DROP_REASONS = ["bad_icrc", "first_packet_lost", "duplicate", "stale_message", "unknown_ring",
                "rank_address_mismatch", "bad_ina_header", "dtype_mismatch", "length_mismatch", "malformed",
                "evicted_incomplete", "ring_removed", "ring_retired", "clt_full", "alloc_failed"]


def perftest_pair(server, client, tool, args, port, report):
    """perftest (lab_guest.py), both ends required to succeed: (client
    Result, server Result)."""
    cli, s = perftest(server, client, tool, args, port, on_hang=report.line)
    for who, r in (("client", cli), ("server", s)):
        expect(r.rc == 0, "%s %s exited %d\n--- stdout\n%s\n--- stderr\n%s" % (tool, who, r.rc, r.out[-2000:],
                                                                            r.err[-2000:]))
    return cli, s


def result_row(out, columns):
    """The numbers of perftest's result line (the line after the header
    starting with #bytes)."""
    lines = out.splitlines()
    for i, l in enumerate(lines):
        if l.strip().startswith("#bytes"):
            for row in lines[i + 1:]:
                nums = row.split()
                if len(nums) >= columns and all(re.fullmatch(r"[0-9.]+", n) for n in nums[:columns]):
                    return [float(n) for n in nums[:columns]]
    raise Failed("no result line in perftest output:\n" + out[-2000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataplane", required=True)
    ap.add_argument("--inspect", required=True, help="netreduce-pcap-inspect")
    ap.add_argument("--workdir")
    a = ap.parse_args()
    t0 = time.monotonic()
    report = None
    ok = False
    try:
        with Lab(guests=2, dataplane=a.dataplane, workdir=a.workdir, box_mode="aggregate") as lab:
            report = Report("forwarding", lab.run_dir)
            g0, g1 = lab.guests
            report.line("2 guests (kernel %s, rdma_rxe), box in aggregate mode with no ring, net_af_packet" %
                        lab.kernel)
            report.figure("lab setup (boot to rxe0 ready)", "%.1f" % lab.setup_seconds, "s")
            for g in lab.guests:
                report.figure("%s ready after" % g.name, "%.1f" % g.ready_seconds, "s")
            rxe0 = [g.rxe_counters() for g in lab.guests]
            cap = lab.capture(("swa", "swb"))

            t = time.monotonic()
            cli, _ = perftest_pair(g1, g0, "ib_write_bw", ["-s", str(WRITE_SIZE), "-n", str(WRITE_ITERS),
                                                            "--report_gbits"], 18515, report)
            bw = result_row(cli.out, 5)  # bytes iters peak avg msgrate
            report.figure("ib_write_bw %d B x %d: average" % (WRITE_SIZE, WRITE_ITERS), "%.3f" % bw[3], "Gb/s")
            report.figure("ib_write_bw wall time", "%.1f" % (time.monotonic() - t), "s")
            t = time.monotonic()
            cli, _ = perftest_pair(g1, g0, "ib_send_lat", ["-s", str(LAT_SIZE), "-n", str(LAT_ITERS)], 18520, report)
            lat = result_row(cli.out, 6)  # bytes iters min max typical avg
            report.figure("ib_send_lat %d B x %d: typical / avg" % (LAT_SIZE, LAT_ITERS),
                          "%.1f / %.1f" % (lat[4], lat[5]), "us")
            report.figure("ib_send_lat wall time", "%.1f" % (time.monotonic() - t), "s")

            time.sleep(1)  # last ACKs through the box and into the captures
            caps = cap.stop()
            hits = lab.steering_hits()
            rxe1 = [g.rxe_counters() for g in lab.guests]
            final = lab.box.stop()

            r = final["reasons"]
            pa, pb = final["ports"]
            report.line("box counters (final line):")
            for k in ("fwd_not_roce", "fwd_unparsed", "fwd_not_write", "fwd_no_ina", "held"):
                report.figure("  " + k, r[k])
            report.figure("  drops (all drop reasons)", sum(r[k] for k in DROP_REASONS))
            report.figure("  port A rx / missed", "%d / %d" % (pa["rx_packets"], pa["rx_missed"]))
            report.figure("  port B tx / errors", "%d / %d" % (pb["tx_packets"], pb["tx_errors"]))
            report.figure("steering rule hits (taps)", sum(hits.values()), str(hits))
            for g, b, e in zip(lab.guests, rxe0, rxe1):
                d = {k: e[k] - b.get(k, 0) for k in e if e[k] - b.get(k, 0)}
                report.line("  %s rxe0 counters delta: %s" % (g.name, d))

            write_pkts = WRITE_ITERS * WRITE_SIZE // 1024  # path MTU 1024 on a 1500-byte link
            expect(r["fwd_no_ina"] >= write_pkts,
                   "fwd_no_ina %d < %d RDMA WRITE packets perftest sent" % (r["fwd_no_ina"], write_pkts))
            expect(r["fwd_not_write"] >= 2 * LAT_ITERS,
                   "fwd_not_write %d < %d SENDs of ib_send_lat" % (r["fwd_not_write"], 2 * LAT_ITERS))
            expect(r["fwd_not_roce"] == 0, "the box saw %d non-RoCE frames: steering leaks" % r["fwd_not_roce"])
            expect(r["held"] == 0, "packets held with no ring installed: %d" % r["held"])
            for k in DROP_REASONS:
                expect(r[k] == 0, "box dropped %d packets as %s" % (r[k], k))
            roce_in = r["fwd_no_ina"] + r["fwd_not_write"] + r["fwd_unparsed"]
            expect(pa["rx_packets"] == roce_in, "port A received %d, the engine forwarded %d" %
                   (pa["rx_packets"], roce_in))
            expect(pb["tx_packets"] == pa["rx_packets"], "port B sent %d of the %d received on port A" %
                   (pb["tx_packets"], pa["rx_packets"]))
            expect(pb["rx_packets"] == 0 and pa["tx_packets"] == 0,
                   "%d frames entered port B from the switch (and %d left port A): the switch leaks into the "
                   "box's return port" % (pb["rx_packets"], pa["tx_packets"]))
            expect(sum(hits.values()) == pa["rx_packets"] + pa["rx_missed"],
                   "the taps steered %d frames, port A took %d (+%d missed)" %
                   (sum(hits.values()), pa["rx_packets"], pa["rx_missed"]))

            # Scenario 5 (capture part): rxe's frames checked by our ICRC code and scapy.
            report.line("captures (scenario 5, independent ICRC check):")
            seen = {}
            for side, (path, kdrops) in caps.items():
                v = inspect_capture(path, a.inspect)
                report.figure("  %s: RoCE frames / ICRC ok / bad / capture drops" % side,
                              "%d / %d / %d / %d" % (v["roce"], v["icrc_ok"], v["icrc_bad"], kdrops))
                expect(v["ok"] and v["icrc_bad"] == 0,
                       "netreduce-pcap-inspect %s failed:\n%s" % (path, v["text"]))
                expect(v["roce"] >= write_pkts // 2, "%s capture holds only %d RoCE frames" % (side, v["roce"]))
                seen[side] = (pcap_frames(path), kdrops)
            n, bad = scapy_icrc_check(seen["swb"][0])
            report.figure("  frames the box emitted checked by scapy / bad ICRC", "%d / %d" % (n, bad))
            expect(bad == 0, "scapy finds %d bad ICRCs among %d frames the box emitted" % (bad, n))
            if seen["swa"][1] == 0 and seen["swb"][1] == 0:
                same = collections.Counter(seen["swa"][0]) == collections.Counter(seen["swb"][0])
                report.figure("  port A in == port B out, byte for byte", same)
                expect(same, "the frames out of port B differ from those into port A")
            else:
                report.line("  (capture drops: byte-for-byte comparison of the two sides skipped)")
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
