"""What a scenario keeps around the lab: its command line (scenario_args),
its report (Report: lines and figures, printed and saved in the run
directory) and its steps, each run again once when a guest's rdma_rxe
wedged (run_step).
"""
import argparse
import json
import os

from lab_common import Failed, log
from lab_guest import rxe_wedge_warnings


class Report:
    """A scenario's short report: lines and figures, printed and saved as
    <dir>/<name>-report.txt and .json."""

    def __init__(self, name, directory):
        self.name, self.dir, self.lines, self.figures = name, directory, [], {}

    def line(self, text):
        self.lines.append(text)

    def figure(self, key, value, unit=""):
        self.figures[key] = value
        self.lines.append("  %-40s %s %s" % (key, value, unit))

    def failed(self, e, detail=12):
        """The failure's first line and up to `detail` of the lines after it
        (the report is what CI logs keep: the cause must be in it)."""
        lines = [l for l in str(e).splitlines() if l.strip()] or [repr(e)]
        self.lines.append("FAILED: %s" % lines[0])
        for l in lines[1:1 + detail]:
            self.lines.append("  | %s" % l[:240])
        if len(lines) > 1 + detail:
            self.lines.append("  | ... (%d more lines in the scenario's stderr)" % (len(lines) - 1 - detail))

    def save(self, ok):
        head = "=== system test: %s: %s ===" % (self.name, "PASSED" if ok else "FAILED")
        text = "\n".join([head] + self.lines) + "\n"
        print(text, flush=True)
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, self.name + "-report.txt"), "w") as f:
            f.write(text)
        with open(os.path.join(self.dir, self.name + "-report.json"), "w") as f:
            json.dump({"scenario": self.name, "ok": ok, "figures": self.figures, "lines": self.lines}, f, indent=1)


def run_step(lab, reports, step, *args):
    """step(*args), run once more if it failed (Failed) while a guest's
    rdma_rxe wedged (rxe_wedge_warnings moved): a fault of the guest kernel,
    not of what is under test. The kernel warns only when the wedged QP is
    destroyed, so the failed attempt's guest jobs are killed and waited for
    first (a rank still inside its own deadline would hide the signature).
    The wedged guests boot again (a wedged guest can stop answering on TCP
    too, so the retry could never connect). The retry must pass on its own
    (fresh captures, counters and ring, as the step makes them); a failure
    without the signature, or a second one, is the step's failure, and then
    the error carries every guest's rxe counters and last rxe messages.
    `reports` get back the lines and figures they had before the first
    attempt, and a line saying what happened."""
    saved = [(list(r.lines), dict(r.figures)) for r in reports]
    before = rxe_wedge_warnings(lab)
    try:
        return step(*args)
    except Failed as e:
        for g in lab.guests:
            g.end_jobs()
        wedged = [g.name for g, b, a in zip(lab.guests, before, rxe_wedge_warnings(lab)) if a > b]
        if not wedged:
            raise Failed("%s\n--- rxe after the failure\n%s" % (e, "\n".join(g.rxe_state() for g in lab.guests)))
        for r, (lines, figures) in zip(reports, saved):
            r.lines, r.figures = lines, figures
            r.line("first attempt failed while rdma_rxe wedged in %s (kernel WARNING in __rxe_cleanup); "
                   "booted it again and ran the step again. Its error: %s" % (", ".join(wedged), str(e).splitlines()[0][:300]))
        log("rdma_rxe wedged in %s: booting it again and running the step again" % ", ".join(wedged))
    lab.reboot([g for g in lab.guests if g.name in wedged])
    return step(*args)


TOOLS = {"dataplane": "netreduce-dataplane", "daemon": "netreduced", "perf": "netreduce-allreduce-perf",
         "inspect": "netreduce-pcap-inspect"}


def scenario_args(tools, extra=None):
    """A scenario's command line: --<tool> (required) for each of `tools`
    (TOOLS' keys), --workdir, and what extra(parser) adds. The tools' paths
    are made absolute: the guests run them from their own working
    directory. Returns (args, parser)."""
    ap = argparse.ArgumentParser()
    for t in tools:
        ap.add_argument("--" + t, required=True, help=TOOLS[t])
    ap.add_argument("--workdir")
    if extra:
        extra(ap)
    a = ap.parse_args()
    for t in tools:
        setattr(a, t, os.path.abspath(getattr(a, t)))
    return a, ap
