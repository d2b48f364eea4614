#!/usr/bin/python3
"""System scenarios 2, 5 (the box's emitted packets), 3 and 4: all-reduce
through the box with libnetreduce over real Soft-RoCE, in one lab of three
guests (one boot for all four steps, to stay within the suite's budget).

Set-up: the real netreduced runs host-side in the lab namespace, listening on
HOST_IP with a token file, talking to the box's control socket; the box runs
in aggregate mode with no ring. Each job is netreduce-allreduce-perf in the
three guests (rank r in guest g<r>, bootstrap at g0), with
NETREDUCE_DAEMON=http://HOST_IP:7470 and NETREDUCE_TOKEN_FILE, so rank 0
registers the ring with the daemon (deleting the one the previous job left)
and every rank probes the box before trusting it.

Steps, each reported on its own and each able to fail:
  2. INA all-reduce, P=3. Every dtype x every op at small sizes (8 B..32 KiB,
     one to nine messages), then fp32 sum at 4 MiB. Every rank's tool checks
     every element of every size against the exact expected values and exits
     non-zero on any mismatch; the test requires exit 0 on every rank, a row
     per size with 0 errors and path "ina" on each row. The box's ring
     counters (through netreduced's GET /v1/rings/{id}) must show exactly
     P x the data bytes of every call (probe included) aggregated and every
     message completed. Then the same fp32 4 MiB job without NETREDUCE_DAEMON
     (the library's ring fallback, path "ring"): each worker's transmitted
     bytes (eth0 tx_bytes in the guest, everything it sent) under INA must be
     about M and under the ring about 2(P-1)/P x M, INA clearly lower. rxe
     must report no unrecovered error (retry_exceeded_err, completer errors)
     and no bad ICRC (kernel log).
  5. (the box's emitted packets) tcpdump on both sides of the box during the
     small-size INA job: frames out of port B whose payload differs from the
     same frame (src, dst, QPN, PSN) into port A carry aggregated results;
     scapy must find their ICRC valid, and netreduce-pcap-inspect must find
     every RoCE frame on both sides valid.
  3. Loss: netem loss on g1's link (its data, ACKs and NAKs): still bit-exact,
     still INA, and the box served retransmissions from completed cells
     (retransmissions_served > 0, served_from_cell moved); rxe recovered
     (go-back-N counters moved, no retry_exceeded_err).
  4. Box failure: the box is killed (SIGKILL) in the middle of a long INA job
     with a 5 s deadline per call: every rank exits non-zero within the
     deadline plus a margin, with an error naming the peer rank and the
     message (a timeout at message N, or the write to the successor failing
     once rxe's finite retry count is exhausted); none reports success.
     Again with a 60 s deadline: now the QPs' retry count (6, not rxe's
     endless 7) must end every rank with "transport retry counter exceeded"
     and rxe must count retry_exceeded_err.
     Restarted with fault injection enabled, the box gets its ring back;
     the operator's bypass drill (POST /v1/faults, bypass, every ring)
     mid-job: every rank meets raw data (the seal, an early raw write) or
     its deadline, the ranks agree and finish that call on the ring path,
     and the job ends there, exact, each rank logging one switch. Cleared,
     the next job runs on the INA path again, exact.
A report per step (figures, counters) is printed and saved next to the run.
"""
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from lab_box import inspect_capture, pcap_frames, scapy_icrc_check  # noqa: E402
from lab_common import HOST_IP, Failed, LabError, expect  # noqa: E402
from lab_guest import rxe_wedge_warnings  # noqa: E402
from lab_report import Report, run_step, scenario_args  # noqa: E402
from nrlab import Lab  # noqa: E402

P = 3
DAEMON_PORT = 7470
BOOT_PORT = 29500
MSG_LEN, PAYLOAD = 4, 1024  # the library's defaults: 4 packets of 1024 bytes per message
# RC retransmission timeout 4.096 us x 2^18 = 1.07 s: under TCG an ACK often
# takes longer than the default 67 ms, and spurious go-back-N retransmissions
# would inflate the transmitted bytes this test compares. With rxe's 7 tries
# a QP survives about 7.5 s without an ACK: three TCG guests on two shared
# cores have stalled longer than 0.54 s x 7 (2^17; one CI run's ring step).
QP_TIMEOUT = 18
INA_HEADER = 24
DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2, "int32": 4, "int64": 8, "fp64": 8}
OPS = ["sum", "min", "max"]
SMALL = ["-d", "all", "-o", "all", "-b", "8", "-e", "32K", "-f", "8", "-n", "1", "-w", "0", "-c", "1"]
BIG_BYTES = 4 << 20
BIG = ["-d", "fp32", "-o", "sum", "-b", "4M", "-e", "4M", "-n", "1", "-w", "0", "-c", "1"]
LOSS = "loss 2%"
LOSS_RUN = ["-d", "fp32,int64,bf16", "-o", "sum", "-b", "8", "-e", "256K", "-f", "8", "-n", "1", "-w", "0",
            "-c", "1"]
FAIL_DEADLINE_MS = 5000
FAIL_MARGIN_S = 30  # TCG guests on a shared 2-core machine: process exit and 9p are slow
FAIL_RUN = ["-d", "fp32", "-o", "sum", "-b", "1M", "-e", "1M", "-n", "1000", "-w", "0", "-c", "0"]
# The bypass drill's job: long enough to be running when the bypass comes,
# short enough to finish on the ring path; its last call's result is checked.
# A failover does not wait for the deadline (every rank meets raw data or
# its predecessor's stop notice); the long one keeps a slow TCG guest's
# ring-path call from failing the drill.
BYPASS_DEADLINE_MS = 30000
# Its QPs outlast a starved guest for the whole deadline (4.3 s x 7 tries,
# still under the box's 60 s retire grace): the drill checks failover, and
# a run of this step lost two ranks' QPs to rxe's retry limit (7.5 s at
# QP_TIMEOUT) before the bypass came, with no loss at the box.
BYPASS_QP_TIMEOUT = 20
BYPASS_RUN = ["-d", "fp32", "-o", "sum", "-b", "256K", "-e", "256K", "-n", "60", "-w", "0", "-c", "1",
              "--timeout-ms", str(BYPASS_DEADLINE_MS)]
QP_RETRY_ERROR = (r"rank %(r)d: write of message id \d+ to successor rank \d failed "
                  r"\(transport retry counter exceeded, status 12\)")
DEADLINE_OR_QP_ERROR = (r"rank %(r)d: all-reduce \(ina path, ring \d+\) timed out after \d+ ms at message \d+ "
                        r"of \d+: .*(predecessor|successor) rank \d|" + QP_RETRY_ERROR)
BYPASS_ERROR = (r"rank %(r)d: (message id \d+ from predecessor rank \d (fails the box's seal|has a wrong INA "
                r"header or length)|from predecessor "
                r"rank \d: immediate 0x[0-9a-f]+ for message id \d+, not sent yet by this rank \(the predecessor's raw "
                r"write: box bypassed\?\))|" + DEADLINE_OR_QP_ERROR)
AFTER_RESTART = ["-d", "fp32", "-o", "sum", "-b", "8", "-e", "32K", "-f", "8", "-n", "1", "-w", "0", "-c", "1"]
UNRECOVERED = ["retry_exceeded_err", "retry_rnr_exceeded_err"]  # rxe gave up: the QP went to error


# ----------------------------------------------------------------------------
# What the tool must do, computed here from its documented arguments


def sweep_sizes(min_b, max_b, factor, es):
    """The sizes the tool's sweep visits (tools/allreduce_perf.cc)."""
    sizes, b = [], max(min_b, es)
    while b <= max_b:
        sizes.append(b // es * es)
        nxt = -(-b * factor // 1)
        b = nxt if nxt > b else b + 1
    return sizes


def parse_size(s):
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if mul > 1 else s) * mul


def expected_calls(args):
    """[(dtype, op, bytes)] for every all-reduce call a run makes (warm-up,
    timed and checked calls), from the tool's arguments."""
    a = dict(zip(args[::2], args[1::2]))
    dts = list(DTYPES) if a["-d"] == "all" else a["-d"].split(",")
    ops = OPS if a["-o"] == "all" else a["-o"].split(",")
    per_size = int(a["-w"]) + int(a["-n"]) + (1 if a["-c"] == "1" else 0)
    calls = []
    for d in dts:
        for o in ops:
            for b in sweep_sizes(parse_size(a["-b"]), parse_size(a["-e"]), int(a.get("-f", "2")), DTYPES[d]):
                calls += [(d, o, b)] * per_size
    return calls


def messages(nbytes, es):
    per = (MSG_LEN * PAYLOAD - INA_HEADER) // es * es
    return -(-nbytes // per)


def expected_box_counts(args):
    """(data bytes aggregated, messages completed) for one job on a fresh ring:
    every rank's data once, the probe (int32 x 1) included."""
    calls = expected_calls(args) + [("int32", "sum", 4)]
    return (P * sum(b for _, _, b in calls), sum(messages(b, DTYPES[d]) for d, _, b in calls))


# ----------------------------------------------------------------------------
# The lab's pieces


class Daemon:
    """netreduced host-side in the lab namespace, on HOST_IP:port, for `box`
    (default the lab's box); `name` names its files, `extra` is merged into
    its config (e.g. a fabric section)."""

    def __init__(self, lab, exe, port=DAEMON_PORT, box=None, name="netreduced", extra=None):
        self.lab = lab
        self.url = "http://%s:%d" % (HOST_IP, port)
        self.token_file = os.path.join(lab.run_dir, "token")
        if not os.path.exists(self.token_file):  # one operator token for the lab's daemons
            with open(self.token_file, "w") as f:
                f.write("lab-%d-token\n" % os.getpid())
            os.chmod(self.token_file, 0o600)
        cfg = {"listen": {"address": HOST_IP, "port": port, "threads": 4},
               "auth": {"token_file": self.token_file},
               "state": {"file": os.path.join(lab.run_dir, name + "-state.json")},
               "dataplane": {"socket": (box or lab.box).socket, "timeout_ms": 3000, "reconcile_interval_ms": 500}}
        cfg.update(extra or {})
        path = os.path.join(lab.run_dir, name + ".yaml")
        with open(path, "w") as f:
            json.dump(cfg, f, indent=1)  # JSON is YAML
        self.proc = lab.spawn([exe, "-c", path], name)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise LabError("%s exited with %d: %s" % (
                    name, self.proc.returncode, open(os.path.join(lab.run_dir, name + ".err")).read()[-2000:]))
            h = self.get("/v1/health", check=False)
            if h and h.get("dataplane_connected"):
                break
            if time.monotonic() > deadline:
                raise LabError("%s not healthy with its box connected after 60 s: %s" % (name, h))
            time.sleep(0.3)

    def get(self, path, check=True):
        """GET from inside the namespace (curl), parsed JSON or text; None on
        failure unless check."""
        r = self.lab.sh("curl", "-sS", "--max-time", "10", "-f", self.url + path, timeout=30, check=False)
        if r.returncode != 0:
            if check:
                raise LabError("GET %s: %s" % (path, r.stderr.strip()))
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return r.stdout

    def post(self, path, body):
        """POST (operator token) from inside the namespace; the parsed answer."""
        return self._send("POST", path, body)

    def delete(self, path):
        return self._send("DELETE", path, None)

    def _send(self, method, path, body):
        with open(self.token_file) as f:
            token = f.read().strip()
        cmd = ["curl", "-sS", "--max-time", "10", "-f", "-X", method, "-H", "Authorization: Bearer " + token]
        if body is not None:
            cmd += ["-H", "Content-Type: application/json", "--data", json.dumps(body)]
        r = self.lab.sh(*(cmd + [self.url + path]), timeout=30, check=False)
        if r.returncode != 0:
            raise LabError("%s %s: %s" % (method, path, r.stderr.strip()))
        return json.loads(r.stdout) if r.stdout.strip() else None

    def ring(self, ring_id):
        r = self.get("/v1/rings/%d" % ring_id)
        expect(r.get("installed") is True, "ring %d not installed at the box: %s" % (ring_id, r))
        return r

    def metric(self, name, labels=""):
        text = self.get("/metrics")
        m = re.search(r"^%s%s (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
        return float(m.group(1)) if m else None


class Job:
    """One netreduce-allreduce-perf run over the lab's guests (rank r in guest
    g<r>, or in guests[r] when given; rank r's environment also has
    rank_env[r] when given)."""

    def __init__(self, lab, exe, args, daemon=None, tag="", qp_timeout=QP_TIMEOUT, env=None, guests=None,
                 rank_env=None):
        self.lab, self.args, self.tag = lab, args, tag
        guests = guests or lab.guests
        env = dict(env or {})
        if daemon:
            env.update({"NETREDUCE_DAEMON": daemon.url, "NETREDUCE_TOKEN_FILE": daemon.token_file})
            # Rank 0 would delete its ring at exit; the ring's counters are read after the job
            # (the ring then goes when its lease, 30 s by default, runs out).
            args = list(args) + ["--keep-ring"]
        g0 = guests[0]
        self.jobs = []
        self.t0 = time.monotonic()
        for r, g in enumerate(guests):
            argv = [exe, "--rank", r, "--world", len(guests), "--bootstrap", "%s:%d" % (g0.ip, BOOT_PORT), "--device",
                    "rxe0", "--gid-index", g.gid_index, "--qp-timeout", qp_timeout, "--path", "ina"] + list(args)
            self.jobs.append(g.spawn(argv, env=dict(env, **(rank_env[r] if rank_env else {}))))

    def wait(self, timeout):
        return [j.wait(timeout) for j in self.jobs]

    def check_ok(self, results, want_path, row_path=None):
        """Every rank exited 0, rank 0's header says path want_path and its
        table has one row per expected size with 0 errors on path row_path
        (default want_path); returns (header info, rows)."""
        if any(res.rc != 0 for res in results):
            # Every rank's error first (CI logs keep only the start of a long
            # message), then what the box saw, then rank 0's table.
            boxes = []
            for b in self.lab.boxes.values():
                line = "%s: unreachable" % b.name
                if b.running():
                    try:
                        st = b.stats()
                        line = "%s: reasons %s; ports %s" % (
                            b.name, {k: v for k, v in st["reasons"].items() if v},
                            [{k: p[k] for k in ("name", "rx_packets", "tx_packets", "rx_missed", "rx_errors",
                                                 "tx_errors", "box_tx_dropped") if k in p} for p in st["ports"]])
                    except (LabError, KeyError, OSError) as e:
                        line = "%s: stats failed: %s" % (b.name, e)
                boxes.append(line)
            box = "\n".join(boxes)
            # Each guest's own view of its link: a guest whose virtio-net
            # stopped sending shows tx counters frozen and a kernel warning.
            guests = []
            for g in self.lab.guests:
                try:
                    # A kernel warning's first lines say where it fired (its tail is only registers).
                    r = g.run(["sh", "-c", "ip -s link show eth0 | tail -n 4; "
                               "dmesg | grep -m 3 -A 6 -E 'WARNING:|BUG:|NETDEV WATCHDOG|timed out' | cut -c1-160; "
                               "dmesg | tail -n 3"], timeout=30)
                    guests.append("%s:\n%s" % (g.name, r.out.strip()))
                except LabError as e:
                    guests.append("%s: %s" % (g.name, e))
            # The last line each rank wrote (its error) right after the first.
            last = ["rank %d: %s" % (r, (res.err.strip().splitlines() or ["(no stderr)"])[-1])
                    for r, res in enumerate(results)]
            raise Failed("%s: ranks exited %s\n%s\n--- stderr of each rank\n%s\n--- boxes (whole run)\n%s\n"
                         "--- guests\n%s\n--- rank 0 stdout\n%s" % (
                             self.tag, [res.rc for res in results], "\n".join(last),
                             "\n".join("rank %d: %s" % (r, res.err.strip()[-1500:]) for r, res in enumerate(results)),
                             box, "\n".join(guests), results[0].out[-2000:]))
        out = results[0].out
        m = re.search(r"^# netreduce-allreduce-perf: world (\d+), path (\w+) \((.*)\), ring (\d+), window (\d+)$",
                      out, re.M)
        expect(m, "%s: no header line in rank 0's output:\n%s" % (self.tag, out[-2000:]))
        head = {"world": int(m.group(1)), "path": m.group(2), "reason": m.group(3), "ring": int(m.group(4)),
                "window": int(m.group(5))}
        expect(head["path"] == want_path, "%s: path %s (%s), expected %s" %
               (self.tag, head["path"], head["reason"], want_path))
        # The cost model's figures: configured (these jobs pin --path ina, and
        # only the model's choice measures them, with traffic of its own).
        m = re.search(r"^# links \((\w+)\): alpha (\S+) us, (\S+) Gb/s, box (\S+) us$", out, re.M)
        expect(m and m.group(1) == "configured", "%s: no '# links (configured)' line in rank 0's output" %
               self.tag)
        head["links"] = (m.group(1), float(m.group(2)), float(m.group(3)), float(m.group(4)))
        rows = []
        for line in out.splitlines():
            f = line.split()
            if len(f) == 11 and f[10] == "all_reduce" and not line.startswith("#") and f[0].isdigit():
                rows.append({"bytes": int(f[0]), "type": f[2], "op": f[3], "path": f[4], "us": float(f[5]),
                             "errors": f[8]})
        want = sorted({(d, o, b) for d, o, b in expected_calls(self.args)})
        got = sorted((x["type"], x["op"], x["bytes"]) for x in rows)
        expect(got == want, "%s: rank 0 reported sizes %s, expected %s" % (self.tag, got, want))
        for x in rows:
            expect(x["errors"] == "0", "%s: %s %s %d B: %s element errors" %
                   (self.tag, x["type"], x["op"], x["bytes"], x["errors"]))
            expect(x["path"] == (row_path or want_path), "%s: row on path %s" % (self.tag, x["path"]))
        expect(re.search(r"^# errors: 0, status: ok$", out, re.M), "%s: no clean summary line" % self.tag)
        for r, res in enumerate(results[1:], 1):  # other ranks print only rows with errors
            expect(not re.search(r"^\s+\d+ ", res.out, re.M), "%s: rank %d reported errors:\n%s" %
                   (self.tag, r, res.out[-2000:]))
        return head, rows


def tx_bytes(lab):
    return [g.link_stats()["tx_bytes"] for g in lab.guests]


def rxe_all(lab):
    return [g.rxe_counters() for g in lab.guests]


def delta(a, b):
    return {k: b[k] - a.get(k, 0) for k in b if b[k] - a.get(k, 0)}


def kernel_icrc_errors(lab):
    """Lines where rdma_rxe complained about a bad ICRC, per guest."""
    out = []
    for g in lab.guests:
        r = g.run("dmesg | grep -i 'icrc' || true", timeout=60)
        out.append(r.out.strip())
    return out


def check_rxe_clean(report, lab, before, after, label):
    for g, b, e in zip(lab.guests, before, after):
        d = delta(b, e)
        report.line("  %s rxe0 delta (%s): %s" % (g.name, label, d))
        for k in UNRECOVERED:
            expect(k in e, "rxe has no counter %s: %s" % (k, sorted(e)))
            expect(d.get(k, 0) == 0, "%s: %s rxe %s = %d: an error rxe could not recover" %
                   (label, g.name, k, d.get(k, 0)))
    icrc = kernel_icrc_errors(lab)
    for g, t in zip(lab.guests, icrc):
        expect(not t, "%s: %s's rxe logged bad ICRCs:\n%s" % (label, g.name, t))


# ----------------------------------------------------------------------------
# Steps


def frames_by_key(frames):
    """{(ip src, ip dst, dest QPN, PSN): [RoCE payload, ...]} of RDMA WRITE
    frames (plain Ethernet + IPv4 + UDP 4791, as the lab's guests send)."""
    import struct
    out = {}
    for f in frames:
        if len(f) < 14 + 20 + 8 + 12 + 4 or f[12:14] != b"\x08\x00":
            continue
        ihl = (f[14] & 0xF) * 4
        bth = 14 + ihl + 8
        op = f[bth]
        if not 0x06 <= op <= 0x0B:
            continue
        qpn = struct.unpack(">I", f[bth + 4:bth + 8])[0] & 0xFFFFFF
        psn = struct.unpack(">I", f[bth + 8:bth + 12])[0] & 0xFFFFFF
        out.setdefault((f[26:30], f[30:34], qpn, psn), []).append(f)
    return out


def write_payload_by_source(frames):
    """{source IPv4 (dotted): RDMA WRITE payload bytes}, each (src, dst, QPN,
    PSN) counted once: what each worker put on the wire, retransmissions
    left out. Payload = after BTH, RETH and ImmDt, before the pad and ICRC."""
    import socket as so
    out = {}
    for (src, _, _, _), fs in frames_by_key(frames).items():
        f = fs[0]
        bth = 14 + (f[14] & 0xF) * 4 + 8
        op, pad = f[bth], (f[bth + 1] >> 4) & 3
        ext = {0x06: 16, 0x07: 0, 0x08: 0, 0x09: 4, 0x0A: 16, 0x0B: 20}[op]
        ip = so.inet_ntoa(src)
        out[ip] = out.get(ip, 0) + len(f) - (bth + 12 + ext) - pad - 4
    return out


def ring_payload(nbytes, es, rank):
    """Data bytes rank `rank` writes in one ring all-reduce of nbytes
    (src/host-lib: segments of P x (ring stride / es) elements, chunk c of a
    segment of n holds n/P elements plus one if c < n mod P; every rank sends
    every chunk but one in the reduce-scatter and every chunk but one in the
    all-gather)."""
    stride = (4 << 20) // (4 * (P - 1)) // 64 * 64  # ring_buffer_bytes 4 MiB (> window x message)
    seg_max, count, total = P * (stride // es), nbytes // es, 0
    for first in range(0, count, seg_max):
        n = min(count - first, seg_max)
        chunk = [n // P + (1 if c < n % P else 0) for c in range(P)]
        # reduce-scatter step s sends chunk (r - s) mod P; all-gather step s sends (r + 1 - s) mod P
        total += sum(chunk[(rank - s) % P] for s in range(P - 1))
        total += sum(chunk[(rank + 1 - s) % P] for s in range(P - 1))
    return total * es


def step2_5(lab, a, daemon, reports):
    rep = reports["allreduce-ina"]
    rep5 = reports["box-icrc"]
    # Small sizes, every dtype x op, with captures on both sides of the box.
    cap = lab.capture(("swa", "swb"))
    rx0, t = rxe_all(lab), time.monotonic()
    job = Job(lab, a.perf, SMALL, daemon, "INA small")
    head, rows = job.check_ok(job.wait(600), "ina")
    small_s = time.monotonic() - t
    time.sleep(1)
    caps = cap.stop()
    ring = daemon.ring(head["ring"])
    c = ring["counters"]
    want_bytes, want_msgs = expected_box_counts(SMALL)
    rep.line("INA, P=3, %d dtypes x %d ops, %d sizes each (8 B..32 KiB), each size timed once and checked "
             "once: %d rows, all 0 errors, path ina" % (len(DTYPES), len(OPS), len(rows) // 18, len(rows)))
    rep.figure("path reason", head["reason"])
    rep.figure("links (configured): alpha us / Gb/s / box us", "%.1f / %.3f / %.1f" % head["links"][1:])
    rep.figure("ring id / window", "%d / %d" % (head["ring"], head["window"]))
    rep.figure("small-size job wall time", "%.1f" % small_s, "s")
    rep.figure("box: data bytes aggregated (expected P x data)", "%d (%d)" % (c["bytes_aggregated"], want_bytes))
    rep.figure("box: messages completed (expected)", "%d (%d)" % (c["messages_completed"], want_msgs))
    rep.figure("box: packets aggregated / cells completed", "%d / %d" % (c["packets_aggregated"],
                                                                         c["cells_completed"]))
    rep.figure("box: retransmissions served / drops", "%d / %s" % (c["retransmissions_served"],
                                                                  {k: v for k, v in c["drops"].items() if v}))
    expect(c["bytes_aggregated"] == want_bytes, "box aggregated %d data bytes, expected %d (3 ranks x every call)"
           % (c["bytes_aggregated"], want_bytes))
    expect(c["messages_completed"] == want_msgs, "box completed %d messages, expected %d" %
           (c["messages_completed"], want_msgs))
    expect(ring["held_packets"] == 0 and ring["open_cells"] == 0, "cells still open after the job: %s" % ring)
    # /metrics is a cache (metrics.refresh_interval_ms, 1 s by default): give it a few refreshes.
    for _ in range(20):
        prom = daemon.metric("netreduce_ring_aggregated_bytes_total", '{ring="%d"}' % head["ring"])
        if prom == c["bytes_aggregated"]:
            break
        time.sleep(0.25)
    rep.figure("netreduced /metrics: netreduce_ring_aggregated_bytes_total", prom)
    expect(prom == c["bytes_aggregated"], "/metrics says %s aggregated bytes, the ring %d" %
           (prom, c["bytes_aggregated"]))
    check_rxe_clean(rep, lab, rx0, rxe_all(lab), "INA small")

    # Scenario 5: what the box emitted, checked by scapy and by our inspector.
    rep5.line("captures on both sides of the box during the small-size INA job (every dtype x op):")
    seen = {}
    for side, (path, kdrops) in caps.items():
        v = inspect_capture(path, a.inspect)
        rep5.figure("%s: RoCE frames / ICRC ok / bad (netreduce-pcap-inspect) / capture drops" % side,
                    "%d / %d / %d / %d" % (v["roce"], v["icrc_ok"], v["icrc_bad"], kdrops))
        expect(v["ok"] and v["icrc_bad"] == 0, "netreduce-pcap-inspect %s failed:\n%s" % (path, v["text"]))
        seen[side] = frames_by_key(pcap_frames(path))
    rewritten, unchanged = [], 0
    for key, outs in seen["swb"].items():
        ins = seen["swa"].get(key, [])
        for f in outs:
            if not ins:
                continue
            if any(f == i for i in ins):
                unchanged += 1
            else:
                rewritten.append(f)
    n, bad = scapy_icrc_check(rewritten, limit=len(rewritten))
    rep5.figure("WRITE frames out of port B with aggregated payload (differs from port A)", len(rewritten))
    rep5.figure("WRITE frames out of port B unchanged", unchanged)
    rep5.figure("aggregated frames checked by scapy / bad ICRC", "%d / %d" % (n, bad))
    expect(len(rewritten) >= c["packets_aggregated"] // 2,
           "only %d rewritten frames captured for %d packets aggregated" % (len(rewritten),
                                                                           c["packets_aggregated"]))
    expect(n == len(rewritten) and bad == 0, "scapy finds %d bad ICRCs among %d aggregated frames" % (bad, n))

    # fp32 4 MiB: INA, then the library's ring fallback, same tensor. Per
    # worker: eth0 tx bytes (everything sent, retransmissions and TCP
    # included) and, from a capture of what enters the box, the RDMA WRITE
    # payload bytes it sent, each packet once.
    calls = expected_calls(BIG)
    m = BIG_BYTES * len(calls)
    want_wire = {"ina": [sum(b + INA_HEADER * messages(b, DTYPES[d]) for d, _, b in calls) + 4 + INA_HEADER] * P,
                 "ring": [sum(ring_payload(b, DTYPES[d], r) for d, _, b in calls) for r in range(P)]}
    tx, wire = {}, {}
    rep.line("fp32 sum, 4 MiB x %d calls (M = %d bytes per worker), on the INA path and then on the library's "
             "ring fallback (no NETREDUCE_DAEMON):" % (len(calls), m))
    for label, d in (("ina", daemon), ("ring", None)):
        # Both sides of the box on the INA run: a failed job leaves them for
        # diagnosis (their paths are printed), a good one uses port A's.
        cap = lab.capture(("swa", "swb") if label == "ina" else ("swa",))
        rx0, tx0, t = rxe_all(lab), tx_bytes(lab), time.monotonic()
        job = Job(lab, a.perf, BIG, d, "fp32 4 MiB " + label)
        try:
            head_b, rows_b = job.check_ok(job.wait(900), label)
        except BaseException:
            for side, (path, kdrops) in cap.stop().items():
                print("captures kept for diagnosis: %s %s (kernel drops %d)" % (side, path, kdrops),
                      file=sys.stderr)
            raise
        secs = time.monotonic() - t
        tx[label] = [b - a_ for a_, b in zip(tx0, tx_bytes(lab))]
        time.sleep(1)
        path, kdrops = cap.stop()["swa"]
        expect(kdrops == 0, "the capture of the %s run dropped %d frames: per-worker bytes unknown" %
               (label, kdrops))
        by_src = write_payload_by_source(pcap_frames(path))
        wire[label] = [by_src.get(g.ip, 0) for g in lab.guests]
        rep.figure("%s path: wall time" % label, "%.1f" % secs, "s")
        rep.figure("  path reason", head_b["reason"])
        rep.figure("  eth0 tx bytes per worker (g0, g1, g2)", ", ".join(str(x) for x in tx[label]))
        rep.figure("  eth0 tx bytes per worker / M", ", ".join("%.3f" % (x / m) for x in tx[label]))
        rep.figure("  RDMA WRITE payload bytes sent per worker (captured, once each)",
                   ", ".join(str(x) for x in wire[label]))
        rep.figure("  the same / M", ", ".join("%.4f" % (x / m) for x in wire[label]))
        rep.figure("  expected (INA: M + 24-byte header per message; ring: the library's chunks)",
                   ", ".join(str(x) for x in want_wire[label]))
        if label == "ina":
            ringc = daemon.ring(head_b["ring"])["counters"]
            wb, wm = expected_box_counts(BIG)
            rep.figure("  box: data bytes aggregated (expected)", "%d (%d)" % (ringc["bytes_aggregated"], wb))
            expect(ringc["bytes_aggregated"] == wb, "box aggregated %d data bytes for the 4 MiB job, expected %d" %
                   (ringc["bytes_aggregated"], wb))
            expect(ringc["messages_completed"] == wm, "box completed %d messages, expected %d" %
                   (ringc["messages_completed"], wm))
        else:
            expect("NETREDUCE_DAEMON unset" in head_b["reason"], "fallback for another reason: %s" %
                   head_b["reason"])
        check_rxe_clean(rep, lab, rx0, rxe_all(lab), "fp32 4 MiB " + label)
        expect(wire[label] == want_wire[label], "%s path: workers sent %s RDMA WRITE payload bytes, expected %s" %
               (label, wire[label], want_wire[label]))
    rep.figure("eth0 tx bytes INA / ring per worker (ideal P/(2(P-1)) = %.3f)" % (P / (2 * (P - 1))),
               ", ".join("%.3f" % (i / r) for i, r in zip(tx["ina"], tx["ring"])))
    rep.figure("RDMA WRITE payload INA / ring per worker",
               ", ".join("%.4f" % (i / r) for i, r in zip(wire["ina"], wire["ring"])))
    for g, i, r in zip(lab.guests, tx["ina"], tx["ring"]):
        # Link bytes add RoCE headers (~6%), ACKs, the bootstrap's TCP and any retransmission.
        expect(i >= m and r >= 2 * (P - 1) / P * m, "%s: eth0 sent %d (INA) / %d (ring) bytes, less than the "
               "data it must send" % (g.name, i, r))
        expect(i < 0.85 * r, "%s: INA %d bytes is not clearly below ring %d" % (g.name, i, r))
    return head["ring"]


def step3(lab, a, daemon, reports):
    rep = reports["allreduce-loss"]
    g1 = lab.guests[1]
    rx0 = rxe_all(lab)
    st0 = lab.box.stats()["reasons"]
    g1.netem(LOSS)
    try:
        t = time.monotonic()
        job = Job(lab, a.perf, LOSS_RUN, daemon, "INA with loss")
        results = job.wait(900)
    finally:
        g1.netem(None)
    head, rows = job.check_ok(results, "ina")  # a failure reports the box's reasons (Job.check_ok)
    secs = time.monotonic() - t
    ring = daemon.ring(head["ring"])
    c = ring["counters"]
    st1 = lab.box.stats()["reasons"]
    rx1 = rxe_all(lab)
    wb, wm = expected_box_counts(LOSS_RUN)
    rep.line("netem %s on g1's eth0 egress (rank 1's data, its ACKs and NAKs to rank 0); fp32, int64, bf16 "
             "sum, 8 B..256 KiB: %d rows, all 0 errors, path ina" % (LOSS, len(rows)))
    rep.figure("job wall time", "%.1f" % secs, "s")
    rep.figure("box: retransmissions served from completed cells", c["retransmissions_served"])
    rep.figure("box: served_from_cell / duplicate / first_packet_lost (all rings)",
               "%d / %d / %d" % (st1["served_from_cell"] - st0["served_from_cell"],
                                 st1["duplicate"] - st0["duplicate"],
                                 st1["first_packet_lost"] - st0["first_packet_lost"]))
    rep.figure("box: data bytes aggregated (expected)", "%d (%d)" % (c["bytes_aggregated"], wb))
    rep.figure("box: drops", {k: v for k, v in c["drops"].items() if v})
    recov = {}
    for g, b, e in zip(lab.guests, rx0, rx1):
        d = delta(b, e)
        recov[g.name] = {k: v for k, v in d.items() if k in ("rcvd_seq_err", "out_of_seq_request",
                                                              "duplicate_request", "completer_retry_err")}
    rep.figure("rxe recovery counters", recov)
    expect(c["retransmissions_served"] > 0, "no retransmission was served from a completed cell")
    expect(st1["served_from_cell"] > st0["served_from_cell"], "served_from_cell did not move")
    expect(c["bytes_aggregated"] == wb, "box aggregated %d data bytes under loss, expected %d (each rank's data "
           "exactly once)" % (c["bytes_aggregated"], wb))
    expect(c["messages_completed"] == wm, "box completed %d messages under loss, expected %d" %
           (c["messages_completed"], wm))
    expect(any(recov.values()), "netem loss left no go-back-N trace in rxe's counters")
    check_rxe_clean(rep, lab, rx0, rx1, "INA with loss")


def start_through_box(lab, job):
    """Waits until `job` runs through the box: its rings aggregated 2 MiB per
    rank more than when this was called."""
    deadline = time.monotonic() + 300
    base = None
    while True:
        if any(j.done() for j in job.jobs):
            # Before any fault the box forwards and aggregates: a rank that
            # ended is a stalled or wedged guest, or a bug. Say which guests'
            # rxe retried, and whether one wedged (the others' jobs ended
            # first: the kernel warns when the wedged QP is destroyed).
            ended = [(r, j.output()[1].strip()[-600:]) for r, j in enumerate(job.jobs) if j.done()]
            for g in lab.guests:
                g.end_jobs()
            raise Failed("a rank ended before the fault: %s\n--- rxe (wedge warnings per guest %s)\n%s" % (
                "\n".join("rank %d: %s" % e for e in ended), rxe_wedge_warnings(lab),
                "\n".join(g.rxe_state() for g in lab.guests)))
        rings = lab.box.control(cmd="list_rings").get("rings", [])
        agg = sum(r.get("counters", {}).get("bytes_aggregated", 0) for r in rings)
        if base is None:
            base = agg
        if agg - base >= 2 * P * (1 << 20):
            return agg
        expect(time.monotonic() < deadline, "the long job never got going (aggregated %d bytes)" % agg)
        time.sleep(0.5)


def kill_mid_job(lab, a, daemon, rep, deadline_ms, want, what):
    """Starts a long INA job with a per-call deadline, kills the box once the
    job is aggregating, and checks every rank's end: exit 1 within the
    deadline + margin, an error matching `want` (names the rank's peer and
    the message). Returns rxe's counters before and after."""
    rx0 = rxe_all(lab)
    fault_mid_job(lab, a, daemon, rep, deadline_ms, want, what, lab.box.kill, "box SIGKILLed")
    return rx0, rxe_all(lab)


def fault_mid_job(lab, a, daemon, rep, deadline_ms, want, what, strike, struck):
    """kill_mid_job's run with `strike()` (`struck` says what it did) for the
    kill. Returns every rank's error text."""
    job = Job(lab, a.perf, FAIL_RUN + ["--timeout-ms", str(deadline_ms)], daemon, "INA, %s (%s)" % (struck, what))
    agg = start_through_box(lab, job)
    strike()
    t_kill = time.monotonic()
    rep.line("%s: fp32 1 MiB x 1000 calls through the box, deadline %d ms per call; %s after %d data "
             "bytes aggregated" % (what, deadline_ms, struck, agg))
    limit = deadline_ms / 1000 + FAIL_MARGIN_S
    errs = []
    for r, j in enumerate(job.jobs):
        res = j.wait(max(1, limit - (time.monotonic() - t_kill)) + 5)
        end = time.monotonic() - t_kill
        err = res.err.strip()
        rep.figure("  rank %d: exit status / seconds after the kill" % r, "%d / %.1f" % (res.rc, end))
        rep.line("      %s" % (err.splitlines()[-1] if err else "(no error text)"))
        expect(res.rc == 1, "rank %d exited %d after the box died (expected 1)\n%s" % (r, res.rc, err[-2000:]))
        expect(end <= limit, "rank %d ended %.1f s after the kill, past the %d ms deadline + %d s margin" %
               (r, end, deadline_ms, FAIL_MARGIN_S))
        expect(re.search(want % {"r": r}, err), "rank %d's error is not the expected one (%s):\n%s" %
               (r, want % {"r": r}, err[-2000:]))
        expect("status: ok" not in res.out, "rank %d reported success" % r)
        errs.append(err)
    return errs


def bypass_mid_job(lab, a, daemon, rep):
    """The operator's bypass drill (POST /v1/faults, kind bypass, every
    ring): the box forwards the running job's WRITEs raw, as a bypass relay
    would. No rank may take its predecessor's data for a result: each meets
    raw data (a failed seal, a raw write of a message it has not sent yet or
    over the header it was reading) or, once its predecessor stopped, its
    deadline; the ranks agree over the bootstrap and finish that call on the
    ring path, and the job goes on there: every call exact (the run checks
    its last result), every rank logs the switch once."""
    job = Job(lab, a.perf, BYPASS_RUN, daemon, "INA, bypass drill", BYPASS_QP_TIMEOUT)
    agg = start_through_box(lab, job)
    # For longer than the job runs: it ends on the ring path (its one try
    # back, 64 calls after the failover, if it comes, meets the bypass).
    daemon.post("/v1/faults", {"ring": "all", "kind": "bypass", "duration_ms": 600000})
    try:
        t_bypass = time.monotonic()
        rep.line("bypass drill: fp32 256 KiB x %s calls through the box, deadline %d ms per call; every ring "
                 "bypassed (fault injection) after %d data bytes aggregated" % (BYPASS_RUN[9], BYPASS_DEADLINE_MS, agg))
        # The faults are read while the job's ring is still installed (a fault
        # goes with its ring, which goes when its lease ends).
        seen, switched = 0, [None] * P
        while time.monotonic() < t_bypass + 60 and (None in switched or not seen):
            if not seen:
                seen = sum(f["packets"] for f in daemon.get("/v1/faults")["faults"] if f["kind"] == "bypass")
            for r, j in enumerate(job.jobs):
                if switched[r] is None and "switched to the ring path" in j.output()[1]:
                    switched[r] = time.monotonic() - t_bypass
            time.sleep(0.1)
        expect(seen > 0, "the bypass fault forwarded no packet within 60 s")
        rep.figure("  packets the bypass had forwarded raw (first count above 0)", seen)
        rep.figure("  seconds from the bypass to each rank's switch to the ring path",
                   ", ".join("-" if x is None else "%.1f" % x for x in switched))
        results = job.wait(900)
        # Every rank's end first: the first rank to fail is seldom the one that
        # shows why (a rank waiting on a predecessor whose write failed).
        expect(all(res.rc == 0 for res in results), "ranks exited %s after the bypass (expected 0: the call "
               "finished on the ring path)\n%s" % ([res.rc for res in results], "\n".join(
                   "rank %d:\n%s" % (r, res.err.strip()[-1500:]) for r, res in enumerate(results))))
        for r, res in enumerate(results):
            err = res.err.strip()
            switch = [ln for ln in err.splitlines() if "switched to the ring path" in ln]
            rep.line("  rank %d: %s" % (r, switch[0][:300] if switch else "(no switch logged)"))
            expect(len(switch) == 1, "rank %d logged %d switches to the ring path:\n%s" % (r, len(switch), err[-2000:]))
            expect(re.search(BYPASS_ERROR % {"r": r}, switch[0]) or "the ranks' first error: rank " in switch[0],
                   "rank %d's switch does not say why:\n%s" % (r, switch[0]))
            expect(re.search(r"# rank %d: failovers 1, path now ring" % r, res.out),
                   "rank %d does not report its failover:\n%s" % (r, res.out[-1500:]))
        expect("status: ok" in results[0].out, "rank 0 did not report every call exact:\n%s" % results[0].out[-2000:])
    finally:  # also when it failed: a retry (run_step) posts its own
        daemon.delete("/v1/faults")


def restart_box(lab, daemon, extra=None):
    lab.box.start(extra=extra)
    deadline = time.monotonic() + 60
    while not (daemon.get("/v1/health", check=False) or {}).get("dataplane_connected"):
        expect(time.monotonic() < deadline, "netreduced did not reconnect to the restarted box")
        time.sleep(0.3)


def step4(lab, a, daemon, reports):
    rep = reports["allreduce-box-failure"]
    # The library's own deadline (5 s) or rxe's finite retry count, whichever
    # ends the call first: both errors name the peer and the message.
    kill_mid_job(lab, a, daemon, rep, FAIL_DEADLINE_MS, DEADLINE_OR_QP_ERROR, "short deadline")
    # With a long deadline (60 s) the QP's retry count must end it: 7
    # retransmission timeouts of 1.07 s without an ACK, then the write fails
    # with IBV_WC_RETRY_EXC_ERR. (retry_cnt 7 would retry forever on rxe.)
    restart_box(lab, daemon)
    rx0, rx1 = kill_mid_job(lab, a, daemon, rep, 60000, QP_RETRY_ERROR, "long deadline")
    exceeded = [delta(b, e).get("retry_exceeded_err", 0) for b, e in zip(rx0, rx1)]
    rep.figure("  rxe retry_exceeded_err per guest", exceeded)
    expect(all(x > 0 for x in exceeded), "rxe did not give up retrying on every guest: %s" % exceeded)

    # Restarted (fault injection enabled), the box gets the ring back from
    # netreduced (reconciler). The bypass drill's job finishes on the ring
    # path (its jobs must succeed, so it runs again if a guest's rxe wedged,
    # as other steps do); with the fault cleared, the next job runs on the
    # INA path again, exact.
    restart_box(lab, daemon, {"faults": {"enabled": True}})
    run_step(lab, [rep], bypass_mid_job, lab, a, daemon, rep)
    # The next job pins its ring's order (NETREDUCE_RING_ORDER): rank 0
    # writes to rank 2, which writes to rank 1; the box holds the ring with
    # its members in that order.
    order = [0, 2, 1]
    job = Job(lab, a.perf, AFTER_RESTART, daemon, "INA after the box restarted",
              env={"NETREDUCE_RING_ORDER": ",".join(map(str, order))})
    head, rows = job.check_ok(job.wait(600), "ina")
    ring = daemon.ring(head["ring"])
    c = ring["counters"]
    wb, _ = expected_box_counts(AFTER_RESTART)
    expect(c["bytes_aggregated"] == wb, "after the restart the box aggregated %d data bytes, expected %d" %
           (c["bytes_aggregated"], wb))
    members = [m["address"] if isinstance(m, dict) else m for m in ring["members"]]
    expect(members == [lab.guests[r].ip for r in order], "ring members %s, expected the order %s" %
           (members, order))
    rep.figure("box restarted: next job (fp32 sum 8 B..32 KiB, ring order %s) path / rows / data bytes "
               "aggregated" % ",".join(map(str, order)),
               "%s / %d / %d" % (head["path"], len(rows), c["bytes_aggregated"]))


def main():
    def extra(ap):
        ap.add_argument("--steps", default="allreduce-ina,allreduce-loss,allreduce-box-failure",
                        help="steps to run, in order (diagnosis: e.g. allreduce-loss alone)")
        ap.add_argument("--repeat", type=int, default=1, help="run the chosen steps this many times")
    a, ap = scenario_args(("dataplane", "daemon", "perf", "inspect"), extra)
    t0 = time.monotonic()
    steps = {"allreduce-ina": step2_5, "allreduce-loss": step3, "allreduce-box-failure": step4}
    chosen = a.steps.split(",")
    for n in chosen:
        if n not in steps:
            ap.error("--steps: unknown step %r (known: %s)" % (n, ", ".join(steps)))
    names = [n for n in ["allreduce-ina", "box-icrc", "allreduce-loss", "allreduce-box-failure"]
             if n in chosen or (n == "box-icrc" and "allreduce-ina" in chosen)]
    reports, done, failed = {}, [], None
    try:
        with Lab(guests=P, dataplane=a.dataplane, workdir=a.workdir, box_mode="aggregate") as lab:
            reports = {n: Report(n, lab.run_dir) for n in names}
            for r in reports.values():
                r.figure("lab setup, 3 guests (boot to rxe0 ready)", "%.1f" % lab.setup_seconds, "s")
            daemon = Daemon(lab, a.daemon)
            for i in range(a.repeat):
                for name in chosen:
                    failed = name
                    t = time.monotonic()
                    if name == "allreduce-box-failure":  # its jobs fail on purpose: never run again
                        steps[name](lab, a, daemon, reports)
                    else:
                        rs = [reports[n] for n in (name, "box-icrc") if n in reports and
                              (n == name or name == "allreduce-ina")]
                        run_step(lab, rs, steps[name], lab, a, daemon, reports)
                    reports[name].figure("step wall time" + (" (run %d)" % (i + 1) if a.repeat > 1 else ""),
                                         "%.1f" % (time.monotonic() - t), "s")
                    if i == a.repeat - 1:
                        done.append(name)
                        if name == "allreduce-ina":
                            done.append("box-icrc")
            failed = None
    except (Failed, LabError) as e:
        print("FAILED (%s): %s" % (failed, e), file=sys.stderr)
        if failed in reports:
            reports[failed].failed(e)
            if failed == "allreduce-ina" and "box-icrc" in reports:
                reports["box-icrc"].line("not reached or failed with step 2: %s" % str(e).splitlines()[0])
    for n, r in reports.items():
        if n not in done and not any(l.startswith(("FAILED", "not reached")) for l in r.lines):
            r.line("not run (an earlier step failed)")
        r.save(n in done)
    print("scenario wall time %.1f s" % (time.monotonic() - t0), flush=True)
    return 0 if failed is None and len(done) == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())
