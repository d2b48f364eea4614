"""The box of the data plane's pcap tests (tests/dataplane/pcap_*.py), shared by them.

The real netreduce-dataplane binary (argv[1]) runs with --no-huge on two DPDK
virtual ports: net_pcap (start_dataplane: port 0 replays an input capture, what
leaves port 1 is captured) or net_af_packet over veth pairs whose far ends sit
in a network namespace (VethBox). Here: starting and stopping it, its control
socket and DPDK telemetry; traffic built with scapy, not with netreduce's own
builder (BTH from scapy.contrib.roce, RETH, INA header and ImmDt packed with
struct from the protocol description); and the checks of what it released
(rank-order sums by numpy, headers byte by byte, ICRC by scapy). main() runs
the scenario a topic file names in argv[2]. tests/dataplane/tree_fabric_test.py
and tests/control/control_test.py use its box and traffic too.
"""
import contextlib
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np
from scapy.all import Ether, IP, UDP, Raw, ARP, rdpcap, wrpcap, raw
from scapy.contrib.roce import BTH


INA_MAGIC = 0x494E4554


FP32, SUM = 1, 1


def ip(r, base):
    return "10.%d.0.%d" % (base, r + 1)


def ina_packets(ring_id, ranks, base, msgs, pkts_per_msg, pmtu, rng, psn_base=1000, qpn_base=0x100):
    """Frames of `msgs` messages from every rank, interleaved rank by rank per
    packet position, plus the data each rank sent. Rank r receives on QP
    qpn_base + r."""
    cap = pkts_per_msg * pmtu - 24
    data = {}  # (rank, msg) -> float32 array
    frames = []
    for m in range(msgs):
        for r in range(ranks):
            data[(r, m)] = (rng.integers(-1000, 1000, cap // 4) / 8).astype(np.float32)
        for k in range(pkts_per_msg):
            for r in range(ranks):
                d = data[(r, m)].tobytes()
                if k == 0:
                    hdr = struct.pack("!IBBBBIHHII", INA_MAGIC, 1, FP32, SUM, 0, ring_id, r, pkts_per_msg, m, 0)
                    payload = hdr + d[: pmtu - 24]
                    op = 0x06
                    ext = struct.pack("!QII", 0x10000 + m * cap, 0x1234, cap + 24)
                else:
                    off = k * pmtu - 24
                    payload = d[off: off + pmtu]
                    op = 0x09 if k == pkts_per_msg - 1 else 0x07
                    ext = b""
                imm = struct.pack("!I", m) if op == 0x09 else b""
                psn = (psn_base + r * 100 + m * pkts_per_msg + k) & 0xFFFFFF
                pkt = (Ether(src="02:00:00:00:%02x:%02x" % (base, r), dst="02:00:00:00:%02x:%02x" % (base, (r + 1) % ranks))
                       / IP(src=ip(r, base), dst=ip((r + 1) % ranks, base), flags="DF", ttl=64)
                       / UDP(sport=0xC000 + r, dport=4791, chksum=0)
                       / BTH(opcode=op, dqpn=qpn_base + (r + 1) % ranks, psn=psn, ackreq=int(op == 0x09))
                       / Raw(ext + imm + payload))
                frames.append(pkt)
    return frames, data, cap


def other_traffic(base):
    """ACKs, a non-INA RDMA WRITE between non-members, ARP: must pass untouched."""
    out = []
    for i in range(5):
        out.append(Ether() / IP(src=ip(1, base), dst=ip(0, base)) / UDP(sport=0xD000, dport=4791, chksum=0)
                   / BTH(opcode=0x11, dqpn=0x200, psn=2000 + i) / Raw(struct.pack("!I", i)))
    out.append(Ether() / IP(src="192.168.9.1", dst="192.168.9.2") / UDP(sport=0xC100, dport=4791, chksum=0)
               / BTH(opcode=0x0A, dqpn=0x300, psn=7) / Raw(struct.pack("!QII", 0, 1, 8) + b"ordinary"))
    out.append(Ether(dst="ff:ff:ff:ff:ff:ff") / ARP(pdst="10.9.9.9"))
    return out


def ordinary_write(base, pmtu, psn=5000):
    """The two packets (WRITE FIRST, WRITE LAST) of an ordinary RDMA WRITE
    from rank 0 to rank 1 on ina_packets' ring link (no INA header: a ring
    path write)."""
    def pkt(op, psn_, body):
        return (Ether(src="02:00:00:00:%02x:00" % base, dst="02:00:00:00:%02x:01" % base)
                / IP(src=ip(0, base), dst=ip(1, base), flags="DF", ttl=64) / UDP(sport=0xC000, dport=4791, chksum=0)
                / BTH(opcode=op, dqpn=0x101, psn=psn_) / Raw(body))
    return (pkt(0x06, psn, struct.pack("!QII", 0x20000, 0x1234, 2 * pmtu) + b"\x5a" * pmtu),
            pkt(0x08, psn + 1, b"\xa5" * pmtu))


def ring_spec(ring_id, ranks, base, pkts_per_msg, pmtu):
    return {"id": ring_id, "members": [ip(r, base) for r in range(ranks)], "msg_len": pkts_per_msg,
            "window": 4, "payload_bytes": pmtu}


class Control:
    def __init__(self, path, timeout=20, reply_timeout=60):
        deadline = time.time() + timeout
        while True:
            try:
                self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.s.connect(path)
                break
            except OSError:
                self.s.close()
                if time.time() > deadline:
                    raise RuntimeError("control socket %s never came up" % path)
                time.sleep(0.1)
        self.s.settimeout(reply_timeout)  # a wedged box fails the test instead of hanging it
        self.f = self.s.makefile("rw")

    def __call__(self, **req):
        self.f.write(json.dumps(req) + "\n")
        self.f.flush()
        return json.loads(self.f.readline())

    def raw(self, data):
        """Sends bytes as they are (not necessarily UTF-8); returns the parsed reply."""
        self.s.sendall(data)
        return json.loads(self.f.readline())

    def close(self):
        self.f.close()
        self.s.close()


def sh(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def query_telemetry(prefix, cmd):
    """Asks DPDK's telemetry socket, as dpdk-telemetry.py does."""
    path = "/var/run/dpdk/%s/dpdk_telemetry.v2" % prefix
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    json.loads(s.recv(4096))  # greeting
    s.send(cmd.encode())
    return json.loads(s.recv(1 << 16))[cmd]


def dataplane_reasons():
    """The data plane's own reasons, read from the X-macro in src/dataplane/reasons.h (not
    from the binary): a reason missing from any surface fails check_reason_surfaces."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "dataplane", "reasons.h")
    with open(path) as f:
        text = f.read()
    body = text[text.index("#define NETREDUCE_DATAPLANE_REASONS(X)"):]
    body = body[:body.index("NETREDUCE_DEFINE_REASONS(")]
    names = re.findall(r"\bX\((\w+),", body)
    assert len(names) >= 3, names
    return names


def check_reason_surfaces(stats, telemetry):
    """Every data plane reason in the stats (summed, per worker, per port) and in DPDK
    telemetry, and the sums agree."""
    names = dataplane_reasons()
    top = stats["dataplane_reasons"]
    for name in names:
        assert name in top, "stats lacks dataplane_reasons.%s: %s" % (name, top)
        assert name in telemetry, "telemetry /netreduce/stats lacks %s: %s" % (name, telemetry)
        per_worker = [w["dataplane_reasons"][name] for w in stats["workers"]]
        per_port = [p["box_reasons"][name] for p in stats["ports"]]
        assert sum(per_worker) == top[name] == sum(per_port), (name, top, per_worker, per_port)
    assert sorted(top) == sorted(names), (sorted(top), names)


def start_dataplane(tmp, in_pcap, rings, workers, loop=False, extra=None, umask=None, env=None):
    """Starts the binary on two net_pcap ports; returns (proc, control socket path).
    `extra` is merged into the configuration (top-level keys, one level deep)."""
    out0, out1 = os.path.join(tmp, "out0.pcap"), os.path.join(tmp, "out1.pcap")
    if loop:  # a looping input floods the output: nothing to read back, do not store it
        out0 = out1 = "/dev/null"
    empty = os.path.join(tmp, "empty.pcap")
    wrpcap(empty, [])
    sock = os.path.join(tmp, "dp.sock")
    lcores = "0@0," + ",".join("%d@1" % (w + 1) for w in range(workers))
    cfg = {
        "eal": ["--lcores", lcores, "--no-huge", "-m", "512", "--no-pci", "--log-level", "lib.eal:warning",
                "--file-prefix", "nr%d" % os.getpid(),
                "--vdev", "net_pcap0,rx_pcap=%s,tx_pcap=%s%s" % (in_pcap, out0, ",infinite_rx=1" if loop else ""),
                "--vdev", "net_pcap1,rx_pcap=%s,tx_pcap=%s" % (empty, out1)],
        "ports": [{"name": "net_pcap0"}, {"name": "net_pcap1"}],
        "memory": {"mbufs": 8192},
        "control": {"socket": sock},
    }
    for k, v in (extra or {}).items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k].update(v)
        else:
            cfg[k] = v
    cfg_path = os.path.join(tmp, "dp.yaml")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)  # JSON is YAML
    rings_path = os.path.join(tmp, "rings.json")
    with open(rings_path, "w") as f:
        json.dump(rings, f)

    def pre():
        if umask is not None:
            os.umask(umask)
    proc = subprocess.Popen([sys.argv[1], "-c", cfg_path, "--rings", rings_path],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pre,
                            env=dict(os.environ, **(env or {})))
    return proc, sock, out1


def drive(proc, sock, body):
    """Runs body(ctl) against a started box, then shuts it down; returns (body's
    result, stdout, stderr). Any failure kills the box and shows its stderr."""
    try:
        ctl = Control(sock)
        result = body(ctl)
    except Exception:
        proc.kill()
        print(proc.communicate()[1][-3000:], file=sys.stderr)
        raise
    return (result,) + stop_by(proc, ctl)


def run_dataplane(tmp, in_pcap, rings, workers, loop=False, during=None, extra=None):
    proc, sock, out1 = start_dataplane(tmp, in_pcap, rings, workers, loop, extra)

    def body(ctl):
        nonlocal during
        # Wait until the counters stop moving (the capture has been replayed).
        last, stable = None, 0
        t0 = time.time()
        while stable < 3 and time.time() - t0 < 60:
            if during:
                during(ctl)
                during = None
            st = ctl(cmd="stats")
            assert st["ok"], st
            cur = sum(w["rx_packets"][0] for w in st["workers"])
            stable = stable + 1 if cur == last and not loop else 0
            last = cur
            if loop and time.time() - t0 > 3:
                break
            time.sleep(0.3)
        status = ctl(cmd="status")
        assert status["instance"].split("-")[0] == str(proc.pid), status  # the daemon's restart detector
        # What hosts check before they trust the box (host-lib box_unfit): it seals every result.
        assert status["capabilities"] == ["result_digest"] and status["retire_grace_ms"] >= 1000, status
        telemetry = query_telemetry("nr%d" % os.getpid(), "/netreduce/stats")
        return status, telemetry, ctl(cmd="list_rings")
    (status, telemetry, rings_now), out, err = drive(proc, sock, body)
    final = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    frames = rdpcap(out1) if not loop and os.path.getsize(out1) > 24 else []
    run_dataplane.telemetry = telemetry
    check_reason_surfaces(final, telemetry)
    return frames, final, status, rings_now


def check_headers(b, orig, off, opcode, msg_id, result):
    """A released frame's bytes before its data `off` are the sender's, but a
    last packet's ImmDt (WRITE LAST WITH IMMEDIATE: the 4 bytes before the
    data) is the box's seal: msg_id ^ crc32 of the message's whole result,
    zlib's CRC computed here (src/engine/digest.h)."""
    if opcode != 0x09:
        assert b[:off] == orig[:off], "headers changed"
        return
    assert b[:off - 4] == orig[:off - 4], "headers changed"
    want = (msg_id ^ zlib.crc32(np.ascontiguousarray(result).tobytes())) & 0xFFFFFFFF
    got = struct.unpack("!I", b[off - 4:off])[0]
    assert got == want, "message %d: immediate 0x%08x, the seal is 0x%08x" % (msg_id, got, want)


def check_released(out_frames, in_frames, data, ranks, pmtu, cap, psn_base=1000):
    """Every INA frame in the output: reduced data, own headers, valid ICRC."""
    by_key = {}
    for f in in_frames:
        if BTH in f:
            by_key[(f[IP].src, f[BTH].psn)] = raw(f)
    checked = 0
    for f in out_frames:
        if BTH not in f or f[BTH].opcode not in (0x06, 0x07, 0x08, 0x09):
            continue
        b = raw(f)
        src = f[IP].src
        orig = by_key.get((src, f[BTH].psn))
        assert orig is not None, "output frame from %s psn %d was never sent" % (src, f[BTH].psn)
        assert len(b) == len(orig), "length changed"
        # ICRC by scapy
        f2 = Ether(b)
        assert struct.unpack("<I", f2[BTH].compute_icrc(None))[0] == struct.unpack("<I", b[-4:])[0], "bad ICRC"
        opcode = f[BTH].opcode
        pay_off = 14 + 20 + 8 + 12 + (16 if opcode == 0x06 else 0) + (4 if opcode == 0x09 else 0)
        if opcode == 0x06:
            assert b[:pay_off + 24] == orig[:pay_off + 24], "headers or INA header changed"
            hdr = struct.unpack("!IBBBBIHHII", b[pay_off:pay_off + 24])
            rank, m, k = hdr[6], hdr[8], 0
            got = np.frombuffer(b[pay_off + 24:-4], dtype=np.float32)
            lo = 0
        else:
            rank = [r for r in range(ranks) if ip(r, int(src.split(".")[1])) == src][0]
            rel = (f[BTH].psn - (psn_base + rank * 100)) & 0xFFFFFF
            m, k = divmod(rel, (cap + 24) // pmtu)  # packets per message
            got = np.frombuffer(b[pay_off:-4], dtype=np.float32)
            lo = (k * pmtu - 24) // 4
        whole = data[(0, m)].copy()
        for r in range(1, ranks):
            whole = (whole + data[(r, m)]).astype(np.float32)  # rank order, fp32 each step
        if opcode != 0x06:
            check_headers(b, orig, pay_off, opcode, m, whole)
        want = whole[lo: lo + len(got)]
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), \
            "message %d packet %d from rank %d: data is not the rank-order sum" % (m, k, rank)
        checked += 1
    return checked


def port1_tx(ctl):
    return sum(w["tx_packets"][1] for w in ctl(cmd="stats")["workers"])


def wait_port1_tx(ctl, timeout, packets=1000):
    """Waits until a looping input has sent `packets` out of port 1."""
    deadline = time.time() + timeout
    while port1_tx(ctl) < packets:
        assert time.time() < deadline, "no traffic from the looping input"
        time.sleep(0.05)


def stop_by(proc, ctl=None, sig=None, timeout=30):
    """Stops the box by "shutdown" (or a signal); returns (stdout, stderr); fails on a bad exit."""
    try:
        if sig is None:
            assert ctl(cmd="shutdown")["ok"]
        else:
            proc.send_signal(sig)
        out, err = proc.communicate(timeout=timeout)
    except Exception:
        proc.kill()
        out, err = proc.communicate()
        print(err[-3000:], file=sys.stderr)
        raise
    if proc.returncode != 0:
        print(err[-3000:], file=sys.stderr)
        raise SystemExit("dataplane exited with %d" % proc.returncode)
    return out, err


@contextlib.contextmanager
def dump_box_on_failure(proc):
    """On a failure inside, kills the box if it still runs and prints the tail
    of its stderr (the test's own error follows)."""
    try:
        yield
    except Exception:
        if proc.poll() is None:
            proc.kill()
        print(proc.communicate()[1][-3000:], file=sys.stderr)
        raise


class VethBox:
    """The box on net_af_packet over two veth pairs whose far ends sit in a
    network namespace this test creates and always deletes. Traffic is sent in
    phases: each send() injects frames on port A's pair and returns what the
    box released on port B's pair, so control requests can go in between."""

    def __init__(self, tmp, rings, workers=1, extra=None):
        self.tmp, self.rings, self.workers, self.extra = tmp, rings, workers, extra or {}
        self.ns = "nrtest%d" % os.getpid()
        tag = os.getpid() % 10000
        self.a0, self.b0 = "nrA0%d" % tag, "nrB0%d" % tag
        self.proc, self.phase = None, 0

    def __enter__(self):
        sh("ip", "netns", "add", self.ns)
        for side, near in (("A", self.a0), ("B", self.b0)):
            sh("ip", "link", "add", near, "type", "veth", "peer", "name", "nr%s1" % side, "netns", self.ns)
            sh("ip", "link", "set", near, "up")
            sh("ip", "-n", self.ns, "link", "set", "nr%s1" % side, "up")
        self.sock = os.path.join(self.tmp, "dp.sock")
        lcores = "0@0,1@1" if self.workers == 1 else "0@0,1@1,2@1"
        cfg = {"eal": ["--lcores", lcores, "--no-huge", "-m", "512", "--no-pci", "--log-level", "lib.eal:warning",
                       "--file-prefix", "nr%d" % os.getpid(),
                       "--vdev", "net_af_packet0,iface=%s" % self.a0, "--vdev", "net_af_packet1,iface=%s" % self.b0],
               "ports": [{"name": "net_af_packet0"}, {"name": "net_af_packet1"}],
               "mtu": 1500, "memory": {"mbufs": 8192}, "control": {"socket": self.sock}}
        for k, v in self.extra.items():
            if isinstance(v, dict) and isinstance(cfg.get(k), dict):
                cfg[k].update(v)
            else:
                cfg[k] = v
        with open(os.path.join(self.tmp, "dp.yaml"), "w") as f:
            json.dump(cfg, f)
        with open(os.path.join(self.tmp, "rings.json"), "w") as f:
            json.dump(self.rings, f)
        self.proc = subprocess.Popen([sys.argv[1], "-c", os.path.join(self.tmp, "dp.yaml"), "--rings",
                                      os.path.join(self.tmp, "rings.json")], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.ctl = Control(self.sock)
        return self

    def send(self, frames, settle=2.0):
        """Injects `frames` into port A; returns the IP/ARP frames port B released meanwhile."""
        self.phase += 1
        in_pcap = os.path.join(self.tmp, "in%d.pcap" % self.phase)
        got_pcap = os.path.join(self.tmp, "got%d.pcap" % self.phase)
        wrpcap(in_pcap, frames)
        code = ("from scapy.all import *\n"
                "s = AsyncSniffer(iface='nrB1', store=True); s.start(); time.sleep(1)\n"
                "sendp(rdpcap(%r), iface='nrA1', verbose=False, inter=0.001); time.sleep(%r); s.stop()\n"
                "wrpcap(%r, s.results)\n") % (in_pcap, settle, got_pcap)
        subprocess.run(["ip", "netns", "exec", self.ns, "/usr/bin/python3", "-c", code], check=True, timeout=120)
        return [f for f in rdpcap(got_pcap) if IP in f or ARP in f]

    def stop(self):
        """Shuts the box down; returns its final counters."""
        out, _ = stop_by(self.proc, self.ctl)
        return json.loads([l for l in out.splitlines() if l.startswith("{")][-1])

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            print(self.proc.communicate()[1][-3000:], file=sys.stderr)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)  # takes the veth pairs with it
        for near in (self.a0, self.b0):
            subprocess.run(["ip", "link", "del", near], capture_output=True)
        return False


def main(scenarios):
    """Runs the scenario named by argv[2] (a key of `scenarios`; argv[1] is the binary) in a
    temporary folder that is always deleted: scenarios[name](tmp, in_pcap, rng), in_pcap a
    path in tmp for the input capture, rng numpy's generator seeded 7."""
    scenario = sys.argv[2]
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        in_pcap = os.path.join(tmp, "in.pcap")
        if scenario not in scenarios:
            raise SystemExit("unknown scenario " + scenario)
        scenarios[scenario](tmp, in_pcap, rng)
