"""The box and what it sends: Box runs the real netreduce-dataplane in the
lab namespace on net_af_packet and talks to its control socket; Capture
runs tcpdump on the lab's interfaces; inspect_capture, pcap_frames and
scapy_icrc_check read the captures (with netreduce-pcap-inspect, and
independently with scapy). Where the box sits is in nrlab.py's docstring.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

from lab_common import HERE, ROCE_PORT, LabError, log, run


class FanoutClash(LabError):
    """A box refused by DPDK's af_packet fanout group id (Box.start)."""


class Box:
    """The real netreduce-dataplane on `ifaces` (port A, port B; boxa and
    boxb in the one-box lab), inside the lab namespace, on net_af_packet.
    `name` names its files (<name>.sock, <name><start>.yaml, ...)."""

    def __init__(self, lab, exe, nice=0, name="box", ifaces=("boxa", "boxb")):
        self.lab, self.exe, self.nice, self.name, self.ifaces = lab, exe, nice, name, ifaces
        self.proc = None
        self.socket = os.path.join(lab.run_dir, name + ".sock")
        self.final = None
        self.starts = 0

    def config(self, mode="aggregate", extra=None):
        prefix = "nrlab%d_%s%d" % (os.getpid(), self.name, self.starts)
        cfg = {"eal": ["--lcores", "0@0,1@1", "--no-huge", "-m", "512", "--no-pci", "--file-prefix", prefix,
                       "--log-level", "lib.eal:warning",
                       "--vdev", "net_af_packet0,iface=" + self.ifaces[0],
                       "--vdev", "net_af_packet1,iface=" + self.ifaces[1]],
               "ports": [{"name": "net_af_packet0"}, {"name": "net_af_packet1"}],
               "mtu": self.lab.mtu, "mode": mode, "workers": [1],
               "memory": {"mbufs": 8192, "mbuf_cache": 256, "engine": "64MiB"},
               # TCG guests stall for seconds (the scenarios raise their
               # qp_timeout for it): a message waiting that long here is a
               # stalled guest, not a bypass, so no resend is forwarded
               # raw within the hosts' RC budgets.
               "rings": {"stalled_forward_ms": 120000},
               "control": {"socket": self.socket}}
        for k, v in (extra or {}).items():
            if isinstance(v, dict) and isinstance(cfg.get(k), dict):
                cfg[k].update(v)
            else:
                cfg[k] = v
        return cfg

    def start(self, mode="aggregate", rings=None, extra=None, timeout=60):
        """Starts the box (mode aggregate|forward), optionally with rings (a
        list of ring specs, common/ring_json.h), `extra` merged into its YAML
        config; returns when its control socket answers.

        DPDK 22.11's net_af_packet joins each socket to the fanout group
        (getpid() ^ ifindex) & 0xffff, and group ids are per network
        namespace: with several boxes in one namespace (the two-rack lab),
        a box whose id matches another box's group on another interface is
        refused (PACKET_FANOUT: Invalid argument) and exits at start-up.
        Its next process has another pid, hence another id: that exit is
        tried again, up to three times."""
        for attempt in range(3):
            try:
                return self._start(mode, rings, extra, timeout)
            except FanoutClash as e:
                log("%s: %s; starting it again" % (self.name, e))
        return self._start(mode, rings, extra, timeout)

    def _start(self, mode, rings, extra, timeout):
        if self.proc is not None and self.proc.poll() is None:
            raise LabError("the box is already running")
        if not os.access(self.exe, os.X_OK):
            raise LabError("netreduce-dataplane not found at %s (build it: ninja -C build)" % self.exe)
        self.starts += 1
        cfg = self.config(mode, extra)
        self.prefix = cfg["eal"][cfg["eal"].index("--file-prefix") + 1]
        tag = "%s%d" % (self.name, self.starts)
        cfg_path = os.path.join(self.lab.run_dir, tag + ".yaml")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=1)  # JSON is YAML
        cmd = ["nice", "-n", str(self.nice), "ip", "netns", "exec", self.lab.ns, self.exe, "-c", cfg_path]
        if rings:
            rp = os.path.join(self.lab.run_dir, tag + "-rings.json")
            with open(rp, "w") as f:
                json.dump(rings, f)
            cmd += ["--rings", rp]
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        self.out_path = os.path.join(self.lab.run_dir, tag + ".out")
        self.err_path = os.path.join(self.lab.run_dir, tag + ".err")
        self._out, self._err = open(self.out_path, "w"), open(self.err_path, "w")
        self.final = None
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                rc, tail = self.proc.returncode, self._tail()
                self._out.close()
                self._err.close()
                self.proc = None
                if "could not set PACKET_FANOUT" in tail:
                    raise FanoutClash("its af_packet fanout group id clashed with another box's")
                raise LabError("the box exited with %d at start-up:\n%s" % (rc, tail))
            try:
                if self.control(cmd="ping").get("ok"):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise LabError("the box's control socket did not answer within %ss:\n%s" % (timeout, self._tail()))
            time.sleep(0.2)
        log("%s started (%s mode, %d ring(s))" % (self.name, mode, len(rings or [])))

    def _tail(self):
        with open(self.err_path, errors="replace") as f:
            return f.read()[-3000:]

    def control(self, timeout=10, **req):
        """One request on the control socket, e.g. control(cmd="stats")."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(self.socket)
            s.sendall((json.dumps(req) + "\n").encode())
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(1 << 16)
                if not chunk:
                    raise OSError("the box closed the control connection")
                buf += chunk
        finally:
            s.close()
        return json.loads(buf)

    def stats(self):
        st = self.control(cmd="stats")
        if st.get("ok") is not True:
            raise LabError("stats failed: %s" % st)
        return st

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def ring(self, rid):
        """The box's own report of ring `rid` (list_rings), None if it holds none."""
        for r in self.control(cmd="list_rings")["rings"]:
            if r["spec"]["id"] == rid:
                return r
        return None

    def stop(self, timeout=30):
        """SIGTERM (the box flushes and frees everything) and returns its
        final counters line (the same shape as `stats`). Usable mid-run to
        emulate a box failure; start() brings it back."""
        if self.proc is None:
            return self.final
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                raise LabError("the box did not stop within %ss of SIGTERM" % timeout)
        self._out.close()
        self._err.close()
        rc = self.proc.returncode
        self.proc = None
        with open(self.out_path) as f:
            lines = [l for l in f.read().splitlines() if l.startswith("{")]
        self.final = json.loads(lines[-1]) if lines else None
        if rc != 0:
            raise LabError("the box exited with %d:\n%s" % (rc, self._tail()))
        if self.final is None:
            raise LabError("the box printed no final counters line")
        return self.final

    def kill(self):
        """SIGKILL: the box vanishes without flushing (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc is not None:
            self._out.close()
            self._err.close()
            self.proc = None


# ----------------------------------------------------------------------------
# Captures


class Capture:
    """tcpdump on interfaces of the lab namespace (e.g. swa = what enters the
    box's port A, swb = what leaves its port B). stop() returns
    {iface: (pcap path, kernel drops)}."""

    def __init__(self, lab, ifaces, bpf="udp dst port %d" % ROCE_PORT):
        if shutil.which("tcpdump") is None:
            raise LabError("tcpdump not found (apt-get install tcpdump)")
        self.lab, self.procs = lab, {}
        for i in ifaces:
            path = os.path.join(lab.run_dir, "cap-%s-%d.pcap" % (i, len(os.listdir(lab.run_dir))))
            err = open(path + ".log", "w")
            p = subprocess.Popen(["ip", "netns", "exec", lab.ns, "tcpdump", "-i", i, "-s", "0", "-B", "32768",
                                  "-U", "-n", "-w", path, bpf], stdout=err, stderr=err, stdin=subprocess.DEVNULL)
            self.procs[i] = (p, path, err)
        deadline = time.monotonic() + 20
        for i, (p, path, err) in self.procs.items():  # tcpdump says "listening on" once capturing
            while "listening on" not in open(path + ".log").read():
                if p.poll() is not None or time.monotonic() > deadline:
                    raise LabError("tcpdump on %s did not start: %s" % (i, open(path + ".log").read()))
                time.sleep(0.05)

    def stop(self):
        out = {}
        for i, (p, path, err) in self.procs.items():
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            err.close()
            text = open(path + ".log").read()
            m = re.search(r"(\d+) packets? dropped by kernel", text)
            out[i] = (path, int(m.group(1)) if m else -1)
        self.procs = {}
        return out


def inspect_capture(pcap, inspect_exe):
    """netreduce-pcap-inspect's verdict on a capture (our parser and ICRC
    code): {"ok": exit status 0 (no bad ICRC, nothing malformed), "frames",
    "roce", "icrc_ok", "icrc_bad", "text"}."""
    p = run([inspect_exe, "--summary", pcap], timeout=300, check=False)
    m = re.search(r"(\d+) frames: (\d+) RoCEv2 \(ICRC ok (\d+), bad (\d+)\)", p.stdout)
    if not m or p.returncode not in (0, 1):
        raise LabError("netreduce-pcap-inspect %s: unexpected output (%d): %s %s" %
                       (pcap, p.returncode, p.stdout, p.stderr))
    return {"ok": p.returncode == 0, "frames": int(m.group(1)), "roce": int(m.group(2)),
            "icrc_ok": int(m.group(3)), "icrc_bad": int(m.group(4)), "text": p.stdout.strip()}


def pcap_frames(pcap):
    """The frames of a capture, as bytes."""
    from scapy.utils import RawPcapReader
    return [bytes(d) for d, _ in RawPcapReader(pcap)]


def scapy_icrc_check(frames, limit=1500):
    """Checks the ICRC of up to `limit` RoCE frames (evenly spread) with scapy
    (tests/tools/roce_golden.py), independently of netreduce's code:
    (checked, bad)."""
    import struct
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))
    from roce_golden import scapy_icrc
    step = max(1, len(frames) // limit)
    sample = frames[::step][:limit]
    bad = sum(1 for f in sample if scapy_icrc(f) != struct.unpack("<I", f[-4:])[0])
    return len(sample), bad
