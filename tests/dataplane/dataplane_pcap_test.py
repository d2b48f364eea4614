#!/usr/bin/python3
"""Integration test of the real netreduce-dataplane binary on DPDK net_pcap ports.

Traffic is generated here with scapy (BTH from scapy.contrib.roce, RETH, INA
header and ImmDt packed with struct from the protocol description), not with
netreduce's own builder. The expected sums are computed with numpy in rank
order. The binary runs with --no-huge on two net_pcap ports: port 0 replays
the input capture, and what leaves port 1 is captured and checked byte by byte:
  - every released INA packet: data == the rank-order reduction, the INA
    header bytes of first packets are the sender's own, headers otherwise
    unchanged, ICRC valid according to scapy;
  - ACKs and non-INA traffic come out byte-identical;
  - the final counters equal what was sent.

Scenarios (argv[2]): one_ring | af_packet (the same over veth pairs in a netns) |
two_rings (two rings on two worker lcores,
one RX queue, so the second worker is fed through the dispatch stage) |
remove_while_flowing (the input loops; the ring is removed mid-traffic) |
bad_bytes (invalid UTF-8 and other bytes on the control socket: answered, the
box keeps forwarding) | lcore_stalls (a busy worker stopped mid-burst counts
stalls) | slow_client (clients that flood requests and never
read: others are answered within 1 s, SIGTERM still stops the box) |
control_access (socket mode 0660 whatever the umask, peers of other uids refused
unless in control.group, control.max_clients, a second box refused) |
tree_leaf / tree_root / tree_steering / tree_malformed / tree_bad_json (multi-rack tree
nodes: a leaf's partials up and results into held packets; a root's results down through
each child's port; the same root and leaf on 2 workers, box-to-box frames steered by tree
id; malformed, forged, altered and stale box-to-box frames for the box dropped on every
worker arrangement; malformed "tree" fields refused by name) |
faults_refused / faults / faults_reorder (fault injection: refused unless faults.enabled;
bypass byte-identical, drop, expiry, duplicate with exact sums, bad arguments by field;
reorder under full bursts, nothing held after the clear). Box-to-box frames come from
tests/tools/b2b_golden.py's scapy layer and mac, sums from numpy.
"""
import ctypes
import json
import os
import re
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
from scapy.all import Ether, IP, IPOption_NOP, UDP, Raw, ARP, PcapWriter, fragment, rdpcap, wrpcap, raw
from scapy.contrib.roce import BTH

from pcapbox import (FP32, SUM, Control, VethBox, check_headers, check_reason_surfaces, check_released, drive,
                     dump_box_on_failure, ina_packets, ip, ordinary_write, other_traffic, port1_tx, query_telemetry,
                     ring_spec, run_dataplane, sh, start_dataplane, stop_by, wait_port1_tx)


def af_packet_scenario(tmp, rng):
    """The box on net_af_packet over two veth pairs. Their far ends sit in a
    network namespace this test creates and always deletes. Frames are
    injected into one pair and captured from the other, inside that namespace."""
    ns = "nrtest%d" % os.getpid()
    frames, data, cap = ina_packets(1, 3, 1, 2, 4, 256, rng)
    others = other_traffic(1)
    in_pcap, got_pcap = os.path.join(tmp, "in.pcap"), os.path.join(tmp, "got.pcap")
    wrpcap(in_pcap, others[:3] + frames + others[3:])
    sock = os.path.join(tmp, "dp.sock")
    try:
        sh("ip", "netns", "add", ns)
        for side in "AB":
            sh("ip", "link", "add", "nr%s0%d" % (side, os.getpid() % 10000), "type", "veth", "peer", "name",
               "nr%s1" % side, "netns", ns)
            sh("ip", "link", "set", "nr%s0%d" % (side, os.getpid() % 10000), "up")
            sh("ip", "-n", ns, "link", "set", "nr%s1" % side, "up")
        a0, b0 = "nrA0%d" % (os.getpid() % 10000), "nrB0%d" % (os.getpid() % 10000)
        cfg = {"eal": ["-l", "0-1", "--no-huge", "-m", "512", "--no-pci", "--log-level", "lib.eal:warning",
                       "--file-prefix", "nr%d" % os.getpid(),
                       "--vdev", "net_af_packet0,iface=%s" % a0, "--vdev", "net_af_packet1,iface=%s" % b0],
               "ports": [{"name": "net_af_packet0"}, {"name": "net_af_packet1"}],
               "mtu": 1500, "memory": {"mbufs": 8192}, "control": {"socket": sock}}
        with open(os.path.join(tmp, "dp.yaml"), "w") as f:
            json.dump(cfg, f)
        with open(os.path.join(tmp, "rings.json"), "w") as f:
            json.dump([ring_spec(1, 3, 1, 4, 256)], f)
        proc = subprocess.Popen([sys.argv[1], "-c", os.path.join(tmp, "dp.yaml"), "--rings",
                                 os.path.join(tmp, "rings.json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            try:
                ctl = Control(sock)
            except RuntimeError:
                proc.kill()
                print(proc.communicate()[1][-3000:], file=sys.stderr)
                raise
            # Inject on A1, capture on B1, inside the namespace.
            code = ("from scapy.all import *\n"
                    "s = AsyncSniffer(iface='nrB1', store=True); s.start(); time.sleep(1)\n"
                    "sendp(rdpcap(%r), iface='nrA1', verbose=False, inter=0.001); time.sleep(2); s.stop()\n"
                    "wrpcap(%r, s.results)\n") % (in_pcap, got_pcap)
            subprocess.run(["ip", "netns", "exec", ns, "/usr/bin/python3", "-c", code], check=True, timeout=120)
            rings_now = ctl(cmd="list_rings")
            ctl(cmd="shutdown")
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        got = [f for f in rdpcap(got_pcap) if IP in f or ARP in f]
        n = check_released(got, frames, data, 3, 256, cap)
        assert n == len(frames), "released %d of %d INA packets over af_packet" % (n, len(frames))
        outs = {raw(f) for f in got}
        for o in others:
            assert raw(o) in outs, "not forwarded unchanged over af_packet: %s" % o.summary()
        assert rings_now["rings"][0]["counters"]["messages_completed"] == 2, rings_now
        print("af_packet: %d INA packets aggregated across veth pairs in netns %s, %d other frames unchanged" %
              (n, ns, len(others)))
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # takes the veth pairs with it
        for side in "AB":
            subprocess.run(["ip", "link", "del", "nr%s0%d" % (side, os.getpid() % 10000)], capture_output=True)


def bad_bytes_scenario(tmp, in_pcap):
    """Lines that are not UTF-8: each is answered with an error, and the box keeps
    forwarding and answering."""
    wrpcap(in_pcap, other_traffic(1))
    proc, sock, _ = start_dataplane(tmp, in_pcap, [], 1, loop=True)
    with dump_box_on_failure(proc):
        ctl = Control(sock)
        before = port1_tx(ctl)
        messages = []
        for line in [b"\xff\n", b'{"cmd": "ping\xff"}\n', b'{"cmd": "\xc3"}\n', b"\xfe\xff\x00\x01\n",
                     b'"\xed\xa0\x80"\n', b'{"cmd": "install_ring", "ring": {"id": 1, "members": ["\xff"]}}\n',
                     b"\x00\n", b"\n"]:
            r = ctl.raw(line)
            assert r["ok"] is False and r["error"]["code"] == "invalid_argument", (line, r)
            messages.append(r["error"]["message"])
        assert ctl(cmd="ping")["ok"]
        assert Control(sock)(cmd="ping")["ok"]
        time.sleep(0.5)
        after = port1_tx(ctl)
        assert after > before, "the box stopped forwarding (%d then %d frames out)" % (before, after)
    stop_by(proc, ctl)
    print("bad_bytes: %d lines of invalid bytes answered with errors (e.g. %r); the box kept forwarding "
          "(%d -> %d frames out)" % (len(messages), messages[0][:80], before, after))


def lcore_stalls_scenario(tmp, in_pcap):
    """A worker preempted in the middle of its bursts counts stalls. The
    input loops, so the worker is busy nearly all the time; the whole box is
    stopped (SIGSTOP) 20 times for 20 ms while it forwards. Each stop that
    lands inside a busy poll makes that poll last over 100 us: a stall, with
    its cycles and received packets counted apart (what the bench subtracts
    to get an unshared core's cost per packet)."""
    wrpcap(in_pcap, other_traffic(1))
    proc, sock, _ = start_dataplane(tmp, in_pcap, [], 1, loop=True,
                                    extra={"idle_sleep_max_us": 0})  # pure polling: always busy
    with dump_box_on_failure(proc):
        ctl = Control(sock)
        wait_port1_tx(ctl, 20)
        w0 = ctl(cmd="stats")["workers"][0]
        for _ in range(20):
            proc.send_signal(signal.SIGSTOP)
            time.sleep(0.02)
            proc.send_signal(signal.SIGCONT)
            time.sleep(0.03)
        st = ctl(cmd="stats")
        w1 = st["workers"][0]
        stalls = w1["stalls"] - w0["stalls"]
        cycles = w1["stall_cycles"] - w0["stall_cycles"]
        busy = w1["busy_cycles"] - w0["busy_cycles"]
        rx = sum(w1["rx_packets"]) - sum(w0["rx_packets"])
        srx = w1["stall_rx_packets"] - w0["stall_rx_packets"]
        # Each stop lasts 20 ms: a stalled poll's cycles are a good part of the busy cycles.
        assert stalls >= 5, "only %d stalls counted for 20 stops of a busy worker: %s" % (stalls, w1)
        assert 0 < cycles <= busy and 0 < srx <= rx, (cycles, busy, srx, rx)
        # The stops themselves are in the stall time (preemption alone would not give 0.1 s).
        assert cycles / st["tsc_hz"] >= 5 * 0.015, \
            "%d stalls took %.3f s in all: the 20 ms stops are not in them" % (stalls, cycles / st["tsc_hz"])
    stop_by(proc, ctl)
    print("lcore_stalls: 20 stops of a busy box: %d stalls counted, %d%% of its busy cycles, %d of %d packets" %
          (stalls, 100 * cycles // busy, srx, rx))


def slow_client_scenario(tmp, in_pcap):
    """Clients that send requests as fast as they can and never read a reply.
    Meanwhile another client is answered within 1 s every time, rings are
    installed and removed, and at the end SIGTERM stops the box within 10 s
    while the flooders are still connected."""
    wrpcap(in_pcap, other_traffic(1))
    proc, sock, _ = start_dataplane(tmp, in_pcap, [], 1, loop=True)
    stop = threading.Event()
    sent = [0, 0]
    held = []  # flooders' sockets stay open (never read) until the end

    def flood(i, req):
        line = (json.dumps(req) + "\n").encode() * 64
        while not stop.is_set():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(sock)
            except OSError:
                s.close()
                time.sleep(0.05)
                continue
            s.settimeout(0.2)
            held.append(s)
            while not stop.is_set():
                try:
                    s.sendall(line)
                    sent[i] += 64
                except socket.timeout:
                    continue  # the box is not reading us now: keep the pressure on
                except OSError:
                    break  # the box dropped us: come back
    threads = [threading.Thread(target=flood, args=(0, {"cmd": "stats"}), daemon=True),
               threading.Thread(target=flood, args=(1, {"cmd": "ping"}), daemon=True)]
    try:
        ctl = Control(sock, reply_timeout=5)
        for t in threads:
            t.start()
        worst, pings, rings_done = 0.0, 0, 0
        t_end = time.time() + 8
        while time.time() < t_end:
            t0 = time.time()
            assert ctl(cmd="ping")["ok"]
            worst = max(worst, time.time() - t0)
            pings += 1
            if pings % 10 == 0:
                rid = 100 + rings_done
                spec = dict(ring_spec(rid, 2, 0, 4, 1024), members=["10.%d.0.1" % (100 + rings_done % 50),
                                                                    "10.%d.0.2" % (100 + rings_done % 50)])
                t0 = time.time()
                r = ctl(cmd="install_ring", ring=spec)
                assert r["ok"], r
                r = ctl(cmd="remove_ring", id=rid)
                assert r["ok"], r
                worst = max(worst, (time.time() - t0) / 2)
                rings_done += 1
            time.sleep(0.05)
        assert worst < 1.0, "a request waited %.2f s behind clients that do not read" % worst
        status = ctl(cmd="status")
        assert status["control"]["dropped_slow"] >= 1, status["control"]
        t0 = time.time()
        out, err = stop_by(proc, sig=signal.SIGTERM, timeout=10)
        took = time.time() - t0
    except Exception:
        if proc.poll() is None:
            proc.kill()
            print(proc.communicate()[1][-3000:], file=sys.stderr)
        raise
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        for s in held:
            s.close()
    print("slow_client: %d stats + %d ping requests flooded unread; %d pings and %d ring install/remove "
          "pairs answered, slowest %.0f ms; %d flooding clients dropped; SIGTERM exit in %.1f s" %
          (sent[0], sent[1], pings, rings_done, worst * 1000, status["control"]["dropped_slow"], took))


def as_user(sock, uid, groups):
    """Connects to the control socket as another user and sends a ping:
    returns the reply, or the connect error's name."""
    code = ("import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(10)\n"
            "try:\n"
            "    s.connect(sys.argv[1])\n"
            "except OSError as e:\n"
            "    print('connect: ' + type(e).__name__); sys.exit(0)\n"
            "try:\n"
            "    s.sendall(b'{\"cmd\": \"ping\"}\\n')\n"
            "except OSError:\n"
            "    pass\n"
            "print(s.makefile().readline().strip() or 'closed')\n")
    p = subprocess.run([sys.executable, "-c", code, sock], user=uid, group=uid, extra_groups=groups,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def control_access_scenario(tmp, in_pcap):
    wrpcap(in_pcap, [])
    nobody = 65534
    os.chmod(tmp, 0o755)  # other users must reach the socket's directory
    # 1. Started under umask 000, no control.group, at most 3 clients.
    proc, sock, _ = start_dataplane(tmp, in_pcap, [], 1, extra={"control": {"max_clients": 3}}, umask=0)
    with dump_box_on_failure(proc):
        ctl = Control(sock)
        st = os.stat(sock)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660, oct(st.st_mode)
        # Another uid in the socket file's group (root) passes the file mode: the box refuses it.
        r = as_user(sock, nobody, [0])
        assert r != "closed" and not r.startswith("connect"), r
        r = json.loads(r)
        assert r["ok"] is False and r["error"]["field"] == "control.group", r
        refused_msg = r["error"]["message"]
        # Another uid outside the group does not get past the file mode.
        assert as_user(sock, nobody, []) == "connect: PermissionError"
        # Three clients at most: the fourth gets one error line and is closed.
        c2, c3 = Control(sock), Control(sock)
        assert c2(cmd="ping")["ok"] and c3(cmd="ping")["ok"]
        c4 = Control(sock)
        r = json.loads(c4.f.readline())
        assert r["ok"] is False and r["error"]["field"] == "control.max_clients", r
        assert c4.f.readline() == "", "an over-limit client should be closed"
        c3.close()
        time.sleep(0.3)
        c5 = Control(sock)
        assert c5(cmd="ping")["ok"], "a slot freed by a closed client is usable again"
        control = ctl(cmd="status")["control"]
        assert control["refused_credentials"] == 1 and control["refused_full"] == 1, control
        # A second box on the same socket path refuses to start and names it.
        second = {"eal": ["-l", "0-1", "--no-huge", "-m", "256", "--no-pci", "--log-level", "lib.eal:warning",
                          "--file-prefix", "nr%db" % os.getpid(), "--vdev", "net_null0", "--vdev", "net_null1"],
                  "ports": [{"name": "net_null0"}, {"name": "net_null1"}], "control": {"socket": sock}}
        with open(os.path.join(tmp, "second.yaml"), "w") as f:
            json.dump(second, f)
        p = subprocess.run([sys.argv[1], "-c", os.path.join(tmp, "second.yaml")], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode != 0 and "another process answers on" in p.stderr, (p.returncode, p.stderr[-2000:])
        assert ctl(cmd="ping")["ok"], "the first box lost its socket to the second"
    stop_by(proc, ctl)
    assert not os.path.exists(sock), "the socket file should be removed at exit"
    # 2. control.group 4242: the socket file belongs to it; its members may connect.
    proc, sock, _ = start_dataplane(tmp, in_pcap, [], 1, extra={"control": {"group": "4242"}})
    with dump_box_on_failure(proc):
        ctl = Control(sock)
        st = os.stat(sock)
        assert st.st_gid == 4242 and stat.S_IMODE(st.st_mode) == 0o660, (st.st_gid, oct(st.st_mode))
        r = json.loads(as_user(sock, nobody, [4242]))
        assert r == {"ok": True}, r
        assert as_user(sock, nobody, []) == "connect: PermissionError"
    stop_by(proc, ctl)
    print("control_access: socket 0660 under umask 000; uid %d refused (%r), allowed in control.group; "
          "max_clients enforced; a second box refused" % (nobody, refused_msg[:60]))


def placement_scenario(tmp, rng):
    """Two workers: ring 1 on one, ring 2 on the other. A ring sharing a link
    with each is refused (it would re-point one of them); a ring sharing a link
    with ring 1 only joins ring 1's worker, and its removal leaves ring 1's
    link where it was. Then both rings aggregate byte-exact."""
    pmtu, ppm = 256, 4
    fa, da, cap = ina_packets(1, 3, 1, 2, ppm, pmtu, rng)
    fb, db, _ = ina_packets(2, 2, 2, 2, ppm, pmtu, rng)
    with VethBox(tmp, [ring_spec(1, 3, 1, ppm, pmtu), ring_spec(2, 2, 2, ppm, pmtu)], workers=2) as box:
        ctl = box.ctl
        owners = {r["spec"]["id"]: r["worker"] for r in ctl(cmd="list_rings")["rings"]}
        assert owners[1] != owners[2], owners
        both = dict(ring_spec(3, 4, 3, ppm, pmtu), members=[ip(0, 1), ip(1, 1), ip(0, 2), ip(1, 2)])
        r = ctl(cmd="install_ring", ring=both)
        assert r["ok"] is False and r["error"]["code"] == "conflict" and r["error"]["field"] == "members", r
        msg = r["error"]["message"]
        assert "ring 1 on worker %d" % owners[1] in msg and "ring 2 on worker %d" % owners[2] in msg, msg
        one = dict(ring_spec(4, 3, 4, ppm, pmtu), members=[ip(0, 1), ip(1, 1), "10.4.0.9"])
        assert ctl(cmd="install_ring", ring=one)["ok"]
        placed = {r["spec"]["id"]: r["worker"] for r in ctl(cmd="list_rings")["rings"]}
        assert placed == {1: owners[1], 2: owners[2], 4: owners[1]}, placed
        assert ctl(cmd="remove_ring", id=4)["ok"]
        mixed = [x for pair in zip(fa, fb) for x in pair] + fa[len(fb):] + fb[len(fa):]
        got = box.send(mixed)
        oa = [f for f in got if IP in f and f[IP].src.startswith("10.1.")]
        ob = [f for f in got if IP in f and f[IP].src.startswith("10.2.")]
        na = check_released(oa, fa, da, 3, pmtu, cap)
        nb = check_released(ob, fb, db, 2, pmtu, cap)
        assert (na, nb) == (len(fa), len(fb)), "released %d of %d (ring 1) and %d of %d (ring 2)" % (
            na, len(fa), nb, len(fb))
        final = box.stop()
        assert final["reasons"]["unknown_ring"] == 0, final["reasons"]
    print("placement: rings 1 and 2 on workers %d and %d; a ring sharing links with both refused (%r); "
          "a ring sharing ring 1's link joined worker %d and left; %d + %d frames aggregated byte-exact" %
          (owners[1], owners[2], msg[:90], owners[1], na, nb))


def stripes_scenario(tmp, in_pcap, rng, workers=2):
    """Two stripes of one job: rings 41 and 42 over the same three members,
    each with its own QPs (qpns). On 2 workers with one RX queue the box spreads them:
    ring 41 on worker 0, ring 42 on worker 1, their links split; ring 42's packets reach
    worker 1 by their receiving connection (dst, dest QP), ring 41's stay. Both exact
    (numpy, scapy ICRC). A ring over those members without qpns is refused naming
    "qpns"; one reusing ring 41's QPs is refused on field qpns. Messages on QPs no
    ring names (claiming ring 41, or ring 42) go to the split links' home worker and
    are dropped there (qpn_mismatch, unknown_ring, first_packet_lost), never forwarded
    unreduced. With 3 workers an ordinary ring takes worker 0 (the one with the RX
    queue) first: the stripes sit on workers 1 and 2, and the strays, arriving on
    worker 0, which has no ring on their links, must still go to the home worker
    (worker 1) to be dropped, not be forwarded from worker 0."""
    pmtu, ppm = 1024, 4
    first = 1 if workers == 3 else 0
    fa, da, cap = ina_packets(41, 3, 7, 2, ppm, pmtu, rng, psn_base=1000, qpn_base=0x100)
    fb, db, _ = ina_packets(42, 3, 7, 2, ppm, pmtu, rng, psn_base=60000, qpn_base=0x200)
    stray41, _, _ = ina_packets(41, 3, 7, 1, ppm, pmtu, rng, psn_base=90000, qpn_base=0x300)
    stray42, _, _ = ina_packets(42, 3, 7, 1, ppm, pmtu, rng, psn_base=95000, qpn_base=0x380)
    wrpcap(in_pcap, [x for pair in zip(fa, fb) for x in pair] + stray41 + stray42)
    qa, qb = [0x100 + r for r in range(3)], [0x200 + r for r in range(3)]
    specs = [dict(ring_spec(41, 3, 7, ppm, pmtu), qpns=qa), dict(ring_spec(42, 3, 7, ppm, pmtu), qpns=qb)]
    if workers == 3:
        specs.insert(0, ring_spec(1, 2, 1, ppm, pmtu))
    refused = []

    def during(ctl):
        r = ctl(cmd="install_ring", ring=ring_spec(43, 3, 7, ppm, pmtu))
        assert not r["ok"] and r["error"]["code"] == "conflict" and '"qpns"' in r["error"]["message"], r
        r2 = ctl(cmd="install_ring", ring=dict(ring_spec(44, 3, 7, ppm, pmtu), qpns=qa))
        assert not r2["ok"] and r2["error"]["code"] == "conflict" and r2["error"]["field"] == "qpns", r2
        r3 = ctl(cmd="install_ring", ring=dict(ring_spec(45, 3, 7, ppm, pmtu), qpns=[1, 2]))
        assert not r3["ok"] and r3["error"]["field"] == "qpns", r3
        refused.extend([r, r2, r3])
    out, final, status, rings = run_dataplane(tmp, in_pcap, specs, workers, during=during)
    owners = {r["spec"]["id"]: r["worker"] for r in rings["rings"] if r["spec"]["id"] in (41, 42)}
    assert owners == {41: first, 42: first + 1}, owners
    assert [r["spec"].get("qpns") for r in sorted(rings["rings"], key=lambda r: r["spec"]["id"])
            if r["spec"]["id"] in (41, 42)] == [qa, qb]
    oa = [f for f in out if BTH in f and f[BTH].dqpn in qa]
    ob = [f for f in out if BTH in f and f[BTH].dqpn in qb]
    na = check_released(oa, fa, da, 3, pmtu, cap)
    nb = check_released(ob, fb, db, 3, pmtu, cap, psn_base=60000)
    assert (na, nb) == (len(fa), len(fb)), (na, len(fa), nb, len(fb))
    for r in rings["rings"]:
        if r["spec"]["id"] in (41, 42):
            assert r["counters"]["messages_completed"] == 2 and r["counters"]["cells_completed"] == 2 * ppm, r
    dispatched = [w["dispatched"] for w in final["workers"]]
    strays = len(stray41) + len(stray42)
    want = [len(fb), 0] if workers == 2 else [len(fa) + len(fb) + strays, 0, 0]
    assert dispatched == want, "each stripe's packets to its worker, strays to the home: %s" % dispatched
    assert not [f for f in out if BTH in f and f[BTH].dqpn >= 0x300], "a stray packet left the box"
    reasons = final["workers"][first]["reasons"]
    assert (reasons["qpn_mismatch"], reasons["unknown_ring"], reasons["first_packet_lost"]) == \
        (3, 3, 2 * 3 * (ppm - 1)), reasons
    print("stripes: rings 41 and 42 over the same members on workers %s; %d + %d packets exact; "
          "dispatched %s; refused: %s" % (owners, na, nb, dispatched,
                                          "; ".join(x["error"]["message"][:70] for x in refused)))


def wait_retired(ctl, timeout=20):
    t_end = time.time() + timeout
    while ctl(cmd="status")["retiring"]:
        assert time.time() < t_end, "rings still retiring after %d s" % timeout
        time.sleep(0.1)


def modes_scenario(tmp, in_pcap):
    """set_mode forward is refused while a ring is installed or retiring, and
    rings are refused in forward mode (forward mode would hand a running job
    unreduced data)."""
    wrpcap(in_pcap, [])
    spec = ring_spec(1, 3, 1, 4, 1024)
    proc, sock, _ = start_dataplane(tmp, in_pcap, [spec], 1, extra={"rings": {"retire_grace_ms": 1000}})
    with dump_box_on_failure(proc):
        ctl = Control(sock)
        r = ctl(cmd="set_mode", mode="forward")
        assert r["ok"] is False and r["error"]["code"] == "conflict" and r["error"]["field"] == "mode", r
        assert "installed: 1" in r["error"]["message"], r
        refused_msg = r["error"]["message"]
        assert ctl(cmd="status")["mode"] == "aggregate"
        assert ctl(cmd="remove_ring", id=1)["ok"]
        st = ctl(cmd="status")
        assert [x["id"] for x in st["retiring"]] == [1] and 0 < st["retiring"][0]["seconds_left"] <= 1.2, st
        assert st["rings"] == 0 and st["retire_grace_ms"] == 1000, st
        r = ctl(cmd="set_mode", mode="forward")
        assert r["ok"] is False and "retiring: 1" in r["error"]["message"], r
        r = ctl(cmd="remove_ring", id=1)
        assert r["error"]["code"] == "not_found" and "retiring" in r["error"]["message"], r
        listed = ctl(cmd="list_rings")
        assert listed["rings"] == [] and [x["id"] for x in listed["retiring"]] == [1], listed
        # The same id may come back at once (a relaunched job); forward stays refused.
        assert ctl(cmd="install_ring", ring=spec)["ok"]
        r = ctl(cmd="set_mode", mode="forward")
        assert r["ok"] is False and "installed: 1; retiring: 1" in r["error"]["message"], r
        assert ctl(cmd="remove_ring", id=1)["ok"]
        assert [x["id"] for x in ctl(cmd="status")["retiring"]] == [1, 1]
        wait_retired(ctl)
        r = ctl(cmd="set_mode", mode="forward")
        assert r["ok"] and r["previous"] == "aggregate", r
        r = ctl(cmd="install_ring", ring=spec)
        assert r["ok"] is False and r["error"]["field"] == "mode", r
        assert ctl(cmd="set_mode", mode="aggregate")["ok"]
        assert ctl(cmd="install_ring", ring=spec)["ok"], "the id is free again after the grace"
    stop_by(proc, ctl)
    print("modes: forward refused with a ring installed (%r) and while it retired; allowed after the "
          "grace; rings refused in forward mode" % refused_msg[:70])


def idle_scenario(tmp, in_pcap, rng):
    """Adaptive polling: a box with no traffic sleeps (its worker counts the
    sleeps and their time, and the kernel charges its thread a fraction of a
    core), traffic after the idle period is still aggregated exactly, and
    idle_sleep_max_us: 0 polls without ever sleeping."""
    frames, data, cap = ina_packets(1, 3, 1, 2, 4, 1024, rng)
    wrpcap(in_pcap, frames)
    results = {}
    for max_us in (None, 0):
        extra = {} if max_us is None else {"idle_sleep_max_us": max_us}
        out, final, status, rings = run_dataplane(tmp, in_pcap, [ring_spec(1, 3, 1, 4, 1024)], 1,
                                                  extra=extra)
        n = check_released(out, frames, data, 3, 1024, cap)
        assert n == len(frames), "released %d of %d INA packets (idle_sleep_max_us %s)" % (n, len(frames), max_us)
        w = final["workers"][0]
        results[max_us] = (w["idle_sleeps"], w["idle_sleep_ns"], w["total_cycles"] / final["tsc_hz"])
        tel = run_dataplane.telemetry  # DPDK telemetry sums the same counters over workers
        assert (tel["idle_sleeps"] > 0) == (max_us is None) and tel["multi_segment"] == 0, tel
    sleeps, slept_ns, secs = results[None]
    # run_dataplane waits at least 0.9 s for the counters to settle: far beyond idle_after_us (1 ms).
    assert sleeps > 0 and slept_ns > 0, "an idle worker did not sleep with the default config: %s" % (results,)
    assert results[0][0] == 0 and results[0][1] == 0, "idle_sleep_max_us: 0 slept: %s" % (results,)
    print("idle: default config: %d sleeps, %.2f of %.2f s asleep; idle_sleep_max_us 0: no sleep; "
          "%d INA packets exact both times" % (sleeps, slept_ns / 1e9, secs, n))


def stuck_worker_scenario(tmp, in_pcap):
    """Command deadlines. Two workers (lcores 1 and 2); worker 1 stops polling its
    command ring (the test-only NETREDUCE_TEST_IGNORE_COMMANDS). Ring 1 goes to
    worker 0 and installs. Ring 2, placed on worker 1 (least loaded), gets an
    "unavailable" error naming worker 1 and lcore 2 and is not installed (the
    cancelled command never runs); ping and status still answer; ring 3 (worker 1
    again) fails at once with the same names. Reads need no command: list_rings,
    get_ring, stats and telemetry answer with fresh figures from both workers
    (worker 1 still polls its ports and publishes), and list_rings shows ring 1 on
    worker 0 only. Worker 0 keeps forwarding (every frame of the capture leaves
    port 1 byte-identical); shutdown still stops the box cleanly."""
    others = other_traffic(1)
    wrpcap(in_pcap, others)
    proc, sock, out1 = start_dataplane(tmp, in_pcap, [], 2, extra={"control": {"command_timeout_ms": 300}},
                                       env={"NETREDUCE_TEST_IGNORE_COMMANDS": "1"})

    def body(ctl):
        assert ctl(cmd="ping") == {"ok": True}
        st = ctl(cmd="status")
        assert st["ok"] and [w["lcore"] for w in st["workers"]] == [1, 2], st

        def refused(reply, words):
            assert reply["ok"] is False, reply
            err = reply["error"]
            assert err["code"] == "unavailable" and err["field"] == "control.command_timeout_ms", reply
            for w in ["worker 1 (lcore 2)"] + words:
                assert w in err["message"], (w, reply)
            return err["message"]

        assert ctl(cmd="install_ring", ring=ring_spec(1, 2, 1, 4, 1024))["ok"]
        first = refused(ctl(cmd="install_ring", ring=ring_spec(2, 2, 2, 4, 1024)),
                        ["did not take the command within 300 ms", "cancelled"])
        assert ctl(cmd="ping") == {"ok": True}  # the control socket still answers
        assert ctl(cmd="status")["ok"]
        again = refused(ctl(cmd="install_ring", ring=ring_spec(3, 2, 3, 4, 1024)),
                        ["has still not taken 1 earlier command"])
        assert ctl(cmd="status")["rings"] == 1
        listed = ctl(cmd="list_rings")
        assert listed["ok"] and [(r["spec"]["id"], r["worker"]) for r in listed["rings"]] == [(1, 0)], listed
        assert listed["rings"][0]["answering"] and listed["rings"][0]["published_age_ms"] == 0, listed
        got = ctl(cmd="get_ring", id=1)
        assert got["ok"] and got["ring"]["spec"] == listed["rings"][0]["spec"], got
        assert ctl(cmd="get_ring", id=2)["error"]["code"] == "not_found"
        stats = ctl(cmd="stats")
        assert stats["ok"] and [w["lcore"] for w in stats["workers"]] == [1, 2], stats
        assert all(w["published_age_ms"] == 0 for w in stats["workers"]), stats
        tel = query_telemetry("nr%d" % os.getpid(), "/netreduce/stats")
        assert "error" not in tel and "rx_packets" in tel, tel
        assert query_telemetry("nr%d" % os.getpid(), "/netreduce/rings") == [1]
        return first, again
    (first, again), out, err = drive(proc, sock, body)
    assert "TESTING: worker 1 (lcore 2) ignores its command ring" in out + err, (out + err)[-3000:]
    final = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    assert [w["lcore"] for w in final["workers"]] == [1, 2], final
    outs = {raw(f) for f in rdpcap(out1)}
    for o in others:
        assert raw(o) in outs, "worker 0 did not forward %s" % o.summary()
    print("stuck_worker: %r; then %r; ping/status answered, ring on worker 0 installed, %d frames "
          "forwarded by worker 0" % (first, again, len(others)))


def stalled_worker_scenario(tmp, in_pcap):
    """Every control wait is bounded. Two workers; worker 1 stalls as if stuck
    inside a PMD call (the test-only NETREDUCE_TEST_STALL_WORKER: it polls no
    port, takes no command, publishes nothing and reports no RCU quiescent
    state). stats answers: the first read waits out control.command_timeout_ms
    for worker 1, every read shows worker 1 not answering with the age of its
    figures and worker 0 answering. A ring placed on worker 0 installs: the
    new link table goes live and the old one waits for worker 1 instead of
    the control thread (before, the RCU wait never returned and the control
    socket hung for good). From then on grace waits fail at once while
    worker 1 has not passed that one: set_polling(false) is refused with
    "unavailable" naming worker 1 ("has still not finished"), as is a ring
    for worker 1 (its command); set_polling(true) needs no grace and
    answers. ping, status and telemetry keep answering; shutdown stops the
    box cleanly."""
    wrpcap(in_pcap, other_traffic(1))
    # Preloaded before the workers start: ring 5 on worker 0, ring 6 on worker 1 (least loaded).
    proc, sock, _ = start_dataplane(tmp, in_pcap, [ring_spec(5, 2, 20, 4, 1024), ring_spec(6, 2, 30, 4, 1024)], 2,
                                    extra={"control": {"command_timeout_ms": 300}},
                                    env={"NETREDUCE_TEST_STALL_WORKER": "1"})

    def unavailable(reply):
        assert reply["ok"] is False, reply
        err = reply["error"]
        assert err["code"] == "unavailable" and err["field"] == "control.command_timeout_ms", reply
        assert "worker 1 (lcore 2)" in err["message"] and "worker 0" not in err["message"], reply
        return err["message"]

    def body(ctl):
        assert ctl(cmd="ping") == {"ok": True}
        for _ in range(3):
            st = ctl(cmd="stats")
            assert st["ok"], st
            w = st["workers"]
            assert [x["lcore"] for x in w] == [1, 2], st
            assert w[0]["answering"] is True and w[0]["published_age_ms"] == 0, w[0]
            assert w[1]["answering"] is False and w[1]["published_age_ms"] > 0, w[1]
        assert ctl(cmd="install_ring", ring=ring_spec(1, 2, 1, 4, 1024))["ok"]
        # Reads copy publications: worker 0's rings are listed with fresh figures;
        # worker 1's ring with the figures copied when it was preloaded, their age
        # and answering false, without waiting for worker 1 again.
        for _ in range(2):
            listed = ctl(cmd="list_rings")
            assert listed["ok"], listed
            rings = {r["spec"]["id"]: r for r in listed["rings"]}
            assert sorted((i, r["worker"]) for i, r in rings.items()) == [(1, 0), (5, 0), (6, 1)], listed
            for i in (1, 5):
                assert rings[i]["answering"] and rings[i]["published_age_ms"] == 0 and rings[i]["published"], rings[i]
            assert rings[6]["answering"] is False and rings[6]["published_age_ms"] > 0, rings[6]
            assert rings[6]["published"] and rings[6]["held_packets"] == 0, rings[6]
        got = ctl(cmd="get_ring", id=6)
        assert got["ok"] and got["ring"]["answering"] is False and got["ring"]["worker"] == 1, got
        assert sorted(query_telemetry("nr%d" % os.getpid(), "/netreduce/rings")) == [1, 5, 6]
        msgs = [unavailable(ctl(cmd="install_ring", ring=ring_spec(2, 2, 2, 4, 1024)))]
        msgs.append(unavailable(ctl(cmd="set_polling", enabled=False)))
        assert "has still not finished" in msgs[-1] and "stuck" in msgs[-1], msgs[-1]
        assert ctl(cmd="set_polling", enabled=True)["ok"]
        assert ctl(cmd="ping") == {"ok": True}
        st = ctl(cmd="status")
        assert st["ok"] and st["rings"] == 3, st
        tel = query_telemetry("nr%d" % os.getpid(), "/netreduce/stats")
        assert "error" not in tel and "rx_packets" in tel, tel
        return msgs
    msgs, out, err = drive(proc, sock, body)
    assert "TESTING: worker 1 (lcore 2) stalls" in out + err, (out + err)[-3000:]
    assert re.search(r"the old one is kept until worker 1 \(lcore 2\) did not finish its loop iteration "
                     r"within 300 ms", out + err), (out + err)[-3000:]
    final = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    assert [w["lcore"] for w in final["workers"]] == [1, 2], final
    print("stalled_worker: stats answered 3 times (worker 1 not answering), a ring on worker 0 installed; "
          "refused: %r; %r" % tuple(msgs))


def idle_wake_scenario(tmp, rng):
    """A packet after a long idle still passes. Over net_af_packet, the box
    (default configuration) idles for 2 s, so its worker is at its longest
    sleep step; then a ring's traffic is sent 1 ms apart (the box dozes off
    between packets): every INA frame comes out byte-exact and other frames
    unchanged. Correctness only, no timing."""
    pmtu, ppm, ranks = 256, 4, 3
    frames, data, cap = ina_packets(1, ranks, 1, 2, ppm, pmtu, rng)
    others = other_traffic(1)
    with VethBox(tmp, [ring_spec(1, ranks, 1, ppm, pmtu)]) as box:
        time.sleep(2.0)
        w = box.ctl(cmd="stats")["workers"][0]
        assert w["idle_sleeps"] > 0 and w["idle_sleep_ns"] > 0, w
        got = box.send(others[:3] + frames + others[3:])
        n = check_released(got, frames, data, ranks, pmtu, cap)
        assert n == len(frames), "released %d of %d after idle" % (n, len(frames))
        outs = {raw(f) for f in got}
        for o in others:
            assert raw(o) in outs, "not forwarded unchanged after idle: %s" % o.summary()
        box.stop()
    print("idle_wake: %.1f s asleep in %d sleeps over 2 s idle, then %d INA frames released byte-exact "
          "and %d other frames unchanged" % (w["idle_sleep_ns"] / 1e9, w["idle_sleeps"], n, len(others)))


def remove_mid_message_scenario(tmp, rng):
    """The real box, traffic in phases: message 0 complete, message 1 with
    positions 0-1 complete and position 2 held for two ranks. The ring is
    removed. Then the rest of message 1, go-back-N resends of everything
    rank 0 and 1 sent of it, and the first packets of message 2: none of them
    may leave the box (before retirement, these later packets were forwarded
    raw with valid ICRCs and receivers accepted them as results)."""
    pmtu, ppm, ranks = 256, 4, 3
    frames, data, cap = ina_packets(1, ranks, 1, 3, ppm, pmtu, rng)

    def pos(f):  # (message, position, rank) of a frame of ina_packets
        rank = int(f[IP].src.split(".")[3]) - 1
        rel = (f[BTH].psn - (1000 + rank * 100)) & 0xFFFFFF
        m, k = divmod(rel, ppm)
        return m, k, rank
    by = {pos(f): f for f in frames}
    phase1 = [by[(0, k, r)] for k in range(ppm) for r in range(ranks)]
    phase1 += [by[(1, k, r)] for k in (0, 1) for r in range(ranks)]
    phase1 += [by[(1, 2, r)] for r in (0, 1)]  # held: rank 2's position 2 never came
    late = [by[(1, 2, 2)]] + [by[(1, 3, r)] for r in range(ranks)]  # the rest of message 1
    resends = [by[(1, k, r)] for r in (0, 1) for k in range(ppm)]  # go-back-N from position 0
    nxt = [by[(2, 0, r)] for r in range(ranks)]  # the next message's first packets
    phase2 = late + resends + nxt
    others = other_traffic(1)
    with VethBox(tmp, [ring_spec(1, ranks, 1, ppm, pmtu)], extra={"rings": {"retire_grace_ms": 60000}}) as box:
        ctl = box.ctl
        got1 = box.send(phase1)
        n1 = check_released(got1, frames, data, ranks, pmtu, cap)
        assert n1 == 4 * ranks + 2 * ranks, "released %d before the removal, expected %d" % (n1, 6 * ranks)
        assert ctl(cmd="get_ring", id=1)["ring"]["held_packets"] == 2
        assert ctl(cmd="remove_ring", id=1)["ok"]
        before = ctl(cmd="stats")["reasons"]
        assert before["ring_removed"] == 2, before
        got2 = box.send(others[:3] + phase2 + others[3:])
        ina_out = [f for f in got2 if BTH in f and f[BTH].opcode in (0x06, 0x07, 0x08, 0x09)]
        assert not ina_out, "%d packets of the removed ring left the box, e.g. %s (psn %d)" % (
            len(ina_out), ina_out[0][IP].src, ina_out[0][BTH].psn)
        outs = {raw(f) for f in got2}
        for o in others:
            assert raw(o) in outs, "not forwarded unchanged after the removal: %s" % o.summary()
        after = ctl(cmd="stats")["reasons"]
        retired = after["ring_retired"] - before["ring_retired"]
        assert retired == len(phase2), "ring_retired counted %d of the %d late packets: %s" % (
            retired, len(phase2), after)
        final = box.stop()
    print("remove_mid_message: %d frames released byte-exact before the removal, 2 held ones freed "
          "(ring_removed); %d later packets, resends and next-message packets all dropped as "
          "ring_retired, none left the box; %d other frames forwarded unchanged" %
          (n1, len(phase2), len(others)))


def crash_report_scenario(tmp, in_pcap, rng):
    """A box that dies of a fatal signal says so: which signal, which thread
    and a backtrace, then dies of that signal (exit status and core dump as
    without the report). The signal is sent to the worker lcore's thread with
    tgkill, as a fault in the data path would raise it there."""
    frames, _, _ = ina_packets(1, 3, 1, 1, 4, 1024, rng)
    wrpcap(in_pcap, frames)
    proc, sock, _ = start_dataplane(tmp, in_pcap, [ring_spec(1, 3, 1, 4, 1024)], 1)
    try:
        Control(sock)(cmd="ping")
        worker = None
        for tid in os.listdir("/proc/%d/task" % proc.pid):
            with open("/proc/%d/task/%s/comm" % (proc.pid, tid)) as f:
                if f.read().strip().startswith("rte-worker"):
                    worker = int(tid)
        assert worker, "no rte-worker thread in the data plane"
        libc = ctypes.CDLL(None, use_errno=True)
        SYS_tgkill = 234  # x86_64
        assert libc.syscall(SYS_tgkill, proc.pid, worker, signal.SIGSEGV) == 0, ctypes.get_errno()
        out, err = proc.communicate(timeout=30)
    except Exception:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, err[-2000:])
    lines = err[err.find("netreduce-dataplane: fatal SIGSEGV"):].splitlines()
    assert lines and lines[0].startswith("netreduce-dataplane: fatal SIGSEGV (11) in thread 'rte-worker"), err[-2000:]
    frames_shown = [l for l in lines[1:] if "netreduce-dataplane(" in l]
    assert len(frames_shown) >= 2, "no backtrace through the binary: %s" % err[-2000:]
    assert any("Dataplane" in l for l in frames_shown), "backtrace without symbols: %s" % "\n".join(lines)
    print("crash_report: %s; %d frames, e.g. %s" % (lines[0], len(lines) - 1, frames_shown[-1].strip()))


def polling_scenario(tmp, in_pcap):
    """set_polling: while paused no worker polls or transmits (the port
    counters stand still under a looping input), status says so, commands
    still run; resumed, traffic flows again; a bad request names its field."""
    wrpcap(in_pcap, other_traffic(1))
    proc, sock, _ = start_dataplane(tmp, in_pcap, [], 1, loop=True)
    try:
        ctl = Control(sock)

        def rx():
            return sum(w["rx_packets"][0] for w in ctl(cmd="stats")["workers"])
        deadline = time.time() + 30
        while rx() == 0:
            assert time.time() < deadline, "no traffic from the looping input"
            time.sleep(0.05)
        r = ctl(cmd="set_polling", enabled=False)
        assert r["ok"] and r["polling"] is False and r["previous"] is True, r
        assert ctl(cmd="status")["polling"] is False
        a = rx()
        time.sleep(0.5)
        b = rx()
        assert a == b, "paused, the box still received %d packets" % (b - a)
        r = ctl(cmd="set_polling", enabled=True)
        assert r["ok"] and r["polling"] is True and r["previous"] is False, r
        time.sleep(0.3)
        c = rx()
        assert c > b, "resumed, the box received nothing"
        bad = ctl(cmd="set_polling", enabled="no")
        assert not bad["ok"] and bad["error"]["field"] == "enabled", bad
        assert ctl(cmd="set_polling", enabled=False)["ok"]  # and it stops cleanly while paused
        stop_by(proc, ctl)
    except Exception:
        if proc.poll() is None:
            proc.kill()
        raise
    print("polling: paused for 0.5 s: %d packets received (were moving before); resumed: %d more" % (b - a, c - b))


# ---- multi-rack tree nodes: the data plane part ----------------------------------
# Box-to-box frames are built and checked with tests/tools/b2b_golden.py's scapy
# layer (its own field description and rendering of the mac), never with the box's code.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from b2b_golden import B2B, HDR_LEN, key_id, mac_of, sealed  # noqa: E402

# The test installation of every tree here: its epoch and key.
TREE_EPOCH = 0x5EED0001
TREE_KEY = bytes(range(0x40, 0x60))

LEAF = {"ip": "10.9.0.1", "mac": "02:00:00:00:09:01"}
LEAF2 = {"ip": "10.9.0.2", "mac": "02:00:00:00:09:02"}
SPINE = {"ip": "10.9.0.9", "mac": "02:00:00:00:09:09"}
B2B_PORT = 4792


def position_data(d, k, pmtu):
    """The data of packet position k of a message (float32 elements of d; the INA header
    is not data)."""
    lo = 0 if k == 0 else (k * pmtu - 24) // 4
    return d[lo: lo + ((pmtu - 24) // 4 if k == 0 else pmtu // 4)]


def b2b_frame(src, dst, kind, tree_id, m, k, msg_len, child, data, epoch=TREE_EPOCH, key=TREE_KEY):
    d = data.tobytes()
    return (Ether(src=src["mac"], dst=dst["mac"]) / IP(src=src["ip"], dst=dst["ip"], flags="DF", ttl=64)
            / UDP(sport=0xC123, dport=B2B_PORT, chksum=0)
            / sealed(key, d, kind=kind, tree_id=tree_id, msg_id=m, k=k, msg_len=msg_len, child=child,
                     dtype=FP32, op=SUM, epoch=epoch)
            / Raw(d))


def check_b2b(f, src, dst, kind, tree_id, msg_len, child):
    """A frame the box sent: addresses, a valid IPv4 checksum, UDP checksum 0, the header's
    fields, epoch and mac (recomputed here with the tree's key). Returns (m, k, data as float32)."""
    b = raw(f)
    assert f[Ether].src == src["mac"] and f[Ether].dst == dst["mac"], f.summary()
    assert f[IP].src == src["ip"] and f[IP].dst == dst["ip"], f.summary()
    ipc = f[IP].chksum
    again = f[IP].copy()
    again.chksum = None
    assert IP(raw(again)).chksum == ipc, "bad IPv4 checksum"
    assert f[UDP].chksum == 0 and f[UDP].dport == B2B_PORT, f.summary()
    h = f[B2B]
    payload = raw(f[UDP].payload)
    assert mac_of(payload, TREE_KEY) == h.mac, "bad mac"
    assert (h.magic, h.version, h.kind, h.tree_id, h.msg_len, h.child, h.dtype, h.op, h.epoch) == \
        (0x4E52, 2, kind, tree_id, msg_len, child, FP32, SUM, TREE_EPOCH), h.show(dump=True)
    data = payload[HDR_LEN:]
    assert h.length == len(data)
    assert len(b) == 14 + 20 + 8 + HDR_LEN + len(data), "frame length"
    return h.msg_id, h.k, np.frombuffer(data, dtype=np.float32)


def leaf_tree():
    return {"self": LEAF, "children": [{"rank": 0}, {"rank": 1}],
            "parent": dict(SPINE, port="b"), "index_at_parent": 1,
            "epoch": TREE_EPOCH, "key": TREE_KEY.hex()}


def reported(tree):
    """A tree as the box reports it: boxes written out, the key (a secret) replaced by its
    key_id."""
    out = {k: v for k, v in dict({"boxes": []}, **tree).items() if k != "key"}
    out["key_id"] = key_id(bytes.fromhex(tree["key"]))
    return out


def tree_leaf_scenario(tmp, in_pcap, rng, workers=1):
    """A leaf with ranks 0 and 1 of a 4-rank ring: their WRITEs are held, the partial
    (numpy sum of the two) goes up toward the parent by port B; the parent's results
    (later in the same capture) are written into the held packets, which leave with valid
    ICRCs; ranks 2 and 3 (another rack) pass untouched. With 2 workers the ring sits on the
    one without the RX queue: its local ranks' packets (by link) and the parent's results
    (by tree id) must both reach it."""
    pmtu, ppm, msgs, rid = 1024, 4, 2, 21
    frames, data, cap = ina_packets(rid, 4, 5, msgs, ppm, pmtu, rng)
    total = {}
    results = []
    for m in range(msgs):
        rack0 = (data[(0, m)] + data[(1, m)]).astype(np.float32)
        rack1 = (data[(2, m)] + data[(3, m)]).astype(np.float32)
        total[m] = (rack0 + rack1).astype(np.float32)  # the parent's result, in child order
        for k in range(ppm):
            results.append(b2b_frame(SPINE, LEAF, 2, rid, m, k, ppm, 1, position_data(total[m], k, pmtu)))
    wrpcap(in_pcap, frames + results)
    specs = [dict(ring_spec(rid, 4, 5, ppm, pmtu), tree=leaf_tree())]
    if workers > 1:  # an ordinary ring first takes worker 0 (the one with the RX queue)
        specs.insert(0, ring_spec(1, 2, 1, ppm, pmtu))
    out, final, status, rings = run_dataplane(tmp, in_pcap, specs, workers)
    local = {ip(0, 5), ip(1, 5)}
    # Ranks 2 and 3: byte-identical.
    outs = {raw(f) for f in out}
    remote = [f for f in frames if f[IP].src not in local]
    for f in remote:
        assert raw(f) in outs, "a frame of another rack was changed or lost: %s" % f.summary()
    # Partials: one per position, the numpy sum of ranks 0 and 1, to the parent.
    partials = [f for f in out if UDP in f and f[UDP].dport == B2B_PORT]
    assert len(partials) == msgs * ppm, "%d partials" % len(partials)
    seen = set()
    for f in partials:
        m, k, got = check_b2b(f, LEAF, SPINE, 1, rid, ppm, 1)
        want = position_data((data[(0, m)] + data[(1, m)]).astype(np.float32), k, pmtu)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "partial (%d, %d)" % (m, k)
        seen.add((m, k))
    assert seen == {(m, k) for m in range(msgs) for k in range(ppm)}
    # The held packets left with the parent's result and a valid ICRC (scapy).
    by_key = {(f[IP].src, f[BTH].psn): raw(f) for f in frames}
    released = 0
    for f in out:
        if BTH not in f or f[IP].src not in local:
            continue
        b = raw(f)
        orig = by_key[(f[IP].src, f[BTH].psn)]
        assert len(b) == len(orig)
        assert struct.unpack("<I", Ether(b)[BTH].compute_icrc(None))[0] == struct.unpack("<I", b[-4:])[0], \
            "bad ICRC"
        op = f[BTH].opcode
        off = 14 + 20 + 8 + 12 + (16 + 24 if op == 0x06 else 0) + (4 if op == 0x09 else 0)
        r = 0 if f[IP].src == ip(0, 5) else 1
        m, k = divmod((f[BTH].psn - (1000 + r * 100)) & 0xFFFFFF, ppm)
        check_headers(b, orig, off, op, m, total[m])
        got = np.frombuffer(b[off:-4], dtype=np.float32)
        want = position_data(total[m], k, pmtu)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "result (%d, %d) rank %d" % (m, k, r)
        released += 1
    assert released == 2 * msgs * ppm, "released %d" % released
    assert len(out) == len(remote) + len(partials) + released, "unexpected frames out: %d" % len(out)
    ring = [r for r in rings["rings"] if r["spec"]["id"] == rid][0]
    assert ring["spec"]["tree"] == reported(leaf_tree()), ring["spec"]
    tree = ring["counters"]["tree"]
    want = {"partials_sent": msgs * ppm, "partials_resent": 0, "partials_received": 0,
            "results_received": msgs * ppm, "results_sent": 0, "results_resent": 0,
            "queries_sent": 0, "finals_sent": 0, "finals_received": 0}
    assert {k: tree.get(k) for k in want} == want, tree
    assert ring["counters"]["cells_completed"] == msgs * ppm and ring["held_packets"] == 0, ring
    reasons = final["reasons"]
    assert reasons["held"] == 2 * msgs * ppm and reasons["result_taken"] == msgs * ppm, reasons
    # The other rack's first packets meet no ring link of this box; their later ones then
    # belong to no message the box tracks (ordinary traffic): all forwarded.
    firsts = sum(1 for f in remote if f[BTH].opcode == 0x06)
    assert reasons["fwd_not_ring_link"] == firsts and \
        reasons["fwd_not_ring_link"] + reasons["fwd_no_ina"] == len(remote), reasons
    # Memory: the leaf keeps no child box data; the reservation is the ring's.
    assert status["memory"]["engine_reserved_bytes"] == sum(r["memory_bytes"] for r in rings["rings"]), \
        (status["memory"], rings["rings"])
    dispatched = [w["dispatched"] for w in final["workers"]]
    if workers > 1:
        assert ring["worker"] == 1, ring["worker"]
        # The local ranks' packets and the parent's results went over; the other rack's did not.
        assert dispatched == [2 * msgs * ppm + len(results), 0], dispatched
    print("tree_leaf (%d worker%s): %d partials up (numpy sums, mac ok), %d held packets released with "
          "the parent's result (ICRC ok), %d frames of the other rack untouched; dispatched %s" %
          (workers, "s" if workers > 1 else "", len(partials), released, len(remote), dispatched))


def root_tree():
    return {"self": SPINE, "children": [{"box": 0}, {"box": 1}],
            "boxes": [dict(LEAF, port="a"), dict(LEAF2, port="b")],
            "epoch": TREE_EPOCH, "key": TREE_KEY.hex()}


def tree_root_scenario(tmp, in_pcap, rng, workers):
    """A root with two child boxes and no local rank: partials from both in (port A), the
    result (numpy, child order) out to each child through its own port: leaf 1 by port A,
    leaf 2 by port B. With 2 workers the ring sits on the worker without the RX queue: the
    box-to-box frames must be steered to it by tree id."""
    pmtu, ppm, msgs, rid = 1024, 3, 2, 22
    cap = ppm * pmtu - 24
    parts, frames = {}, []
    for m in range(msgs):
        for c in range(2):
            parts[(c, m)] = (rng.integers(-1000, 1000, cap // 4) / 8).astype(np.float32)
        for k in range(ppm):
            for c, box in ((1, LEAF2), (0, LEAF)):  # arrival order is not child order
                frames.append(b2b_frame(box, SPINE, 1, rid, m, k, ppm, c, position_data(parts[(c, m)], k, pmtu)))
    # A frame for another box crosses untouched.
    transit = b2b_frame(LEAF, {"ip": "10.9.0.7", "mac": "02:00:00:00:09:07"}, 1, rid, 0, 0, ppm, 0,
                        position_data(parts[(0, 0)], 0, pmtu))
    wrpcap(in_pcap, frames + [transit])
    rings = [dict(ring_spec(rid, 4, 6, ppm, pmtu), tree=root_tree())]
    if workers > 1:  # an ordinary ring first takes worker 0 (the one with the RX queue)
        rings.insert(0, ring_spec(1, 2, 1, ppm, pmtu))
    out1, final, status, listed = run_dataplane(tmp, in_pcap, rings, workers)
    out0 = rdpcap(os.path.join(tmp, "out0.pcap"))
    ring = [r for r in listed["rings"] if r["spec"]["id"] == rid][0]
    for port, out, child, box in ((0, out0, 0, LEAF), (1, out1, 1, LEAF2)):
        res = [f for f in out if UDP in f and f[UDP].dport == B2B_PORT and f[IP].dst == box["ip"]]
        assert len(res) == msgs * ppm, "port %d: %d results for child %d" % (port, len(res), child)
        seen = set()
        for f in res:
            m, k, got = check_b2b(f, SPINE, box, 2, rid, ppm, child)
            want = position_data((parts[(0, m)] + parts[(1, m)]).astype(np.float32), k, pmtu)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "result (%d, %d)" % (m, k)
            seen.add((m, k))
        assert len(seen) == msgs * ppm
    assert raw(transit) in {raw(f) for f in out1}, "a frame for another box was not forwarded untouched"
    assert len(out0) == msgs * ppm and len(out1) == msgs * ppm + 1, (len(out0), len(out1))
    tree = ring["counters"]["tree"]
    assert tree["partials_received"] == 2 * msgs * ppm and tree["results_sent"] == 2 * msgs * ppm, tree
    assert tree["partials_sent"] == 0 and tree["results_received"] == 0, tree
    reasons = final["reasons"]
    assert reasons["partial_taken"] == 2 * msgs * ppm and reasons["fwd_b2b_transit"] == 1, reasons
    # The child boxes' partials are part of the ring's reservation (box_data).
    slots = 8  # window 4 -> 2N rounded up
    assert ring["memory_bytes"] >= slots * ppm * 2 * pmtu, ring
    assert status["memory"]["engine_reserved_bytes"] == ring["memory_bytes"] + (
        sum(r["memory_bytes"] for r in listed["rings"] if r["spec"]["id"] != rid)), status["memory"]
    dispatched = [w["dispatched"] for w in final["workers"]]
    if workers > 1:
        assert ring["worker"] == 1, ring["worker"]
        # Every partial, and the frame for another box (its tree id is this ring's), went over.
        assert dispatched[0] == len(frames) + 1 and dispatched[1] == 0, dispatched
    print("tree_root (%d worker%s): %d partials in, %d results out (port A %d, port B %d), exact; "
          "dispatched %s" % (workers, "s" if workers > 1 else "", len(frames), 2 * msgs * ppm,
                             msgs * ppm, msgs * ppm, dispatched))


def broken_b2b(src, dst, tree_id, data):
    """A partial from src to dst, broken in each way a box-to-box frame can be malformed, as
    (what, frame bytes): cut short of its IPv4 total length, as IPv4 fragments (scapy's, the
    later ones without a UDP header), with IPv4 options, with 20 of the header's 32 bytes; and
    a valid one of an unknown tree."""
    def partial(tree, **ip_over):
        return (Ether(src=src["mac"], dst=dst["mac"]) / IP(src=src["ip"], dst=dst["ip"], ttl=64, **ip_over)
                / UDP(sport=0xC123, dport=B2B_PORT, chksum=0)
                / B2B(kind=1, tree_id=tree, msg_id=0, k=0, msg_len=3, child=0, dtype=FP32, op=SUM)
                / Raw(data.tobytes()))
    out = [("cut short", raw(partial(tree_id, flags="DF"))[:-3])]
    whole = partial(tree_id)
    for i, frag in enumerate(fragment(whole[IP], fragsize=256)):
        out.append(("fragment %d" % i, raw(Ether(src=src["mac"], dst=dst["mac"]) / frag)))
    out.append(("IPv4 options", raw(partial(tree_id, flags="DF", options=[IPOption_NOP()] * 4))))
    short = raw(partial(tree_id, flags="DF")[B2B])[:20]
    out.append(("short header", raw(Ether(src=src["mac"], dst=dst["mac"])
                                    / IP(src=src["ip"], dst=dst["ip"], flags="DF", ttl=64)
                                    / UDP(sport=0xC123, dport=B2B_PORT, chksum=0) / Raw(short))))
    out.append(("unknown tree", raw(partial(99, flags="DF"))))
    return out


def untrusted_b2b(src, dst, tree_id, data):
    """A well-formed partial from src to dst that no box of this installation sent, as
    (what, frame bytes, reason): sealed with a guessed key, altered after sealing (one data
    bit), replayed from an earlier installation of the tree (its epoch and key)."""
    def partial(epoch=TREE_EPOCH, key=TREE_KEY):
        return raw(b2b_frame(src, dst, 1, tree_id, 0, 0, 3, 0, data, epoch, key))
    altered = bytearray(partial())
    altered[-1] ^= 0x01
    return [("forged", partial(key=bytes(32 * [0x11])), "b2b_bad_mac"),
            ("altered", bytes(altered), "b2b_bad_mac"),
            ("stale", partial(TREE_EPOCH - 1, bytes(32 * [0x22])), "b2b_stale_epoch")]


def write_frames(path, frames):
    """Frame bytes into a pcap as they are (scapy would rebuild a cut-short frame)."""
    w = PcapWriter(path, linktype=1, sync=True)
    for f in frames:
        w.write(f)
    w.close()


def tree_malformed_scenario(tmp, rng):
    """Malformed box-to-box frames for the box (cut short, fragments, IPv4 options, a short
    header, an unknown tree) are dropped under b2b_malformed / b2b_unknown_tree and never leave,
    and well-formed ones no box of the installation sent (forged, altered, stale) under
    b2b_bad_mac / b2b_stale_epoch,
    on 1 worker, on 2 with the tree on the worker without the RX queue (the frames reach an
    engine without the tree: dispatch cannot steer them by tree id), and on 2 with the tree on
    the RX worker. The same frames for another box, and UDP to the box's address on another
    port, leave byte-identical; the root still sums its children's partials."""
    pmtu, ppm, rid = 1024, 3, 22
    cap = ppm * pmtu - 24
    parts = {c: (rng.integers(-1000, 1000, cap // 4) / 8).astype(np.float32) for c in range(2)}
    partials = [raw(b2b_frame(box, SPINE, 1, rid, 0, k, ppm, c, position_data(parts[c], k, pmtu)))
                for k in range(ppm) for c, box in ((1, LEAF2), (0, LEAF))]
    d = position_data(parts[0], 0, pmtu)
    mine = broken_b2b(LEAF, SPINE, rid, d)
    untrusted = untrusted_b2b(LEAF, SPINE, rid, d)
    other = {"ip": "10.9.0.7", "mac": "02:00:00:00:09:07"}
    transit = broken_b2b(LEAF, other, rid, d)
    ordinary = raw(Ether(src=LEAF["mac"], dst=SPINE["mac"]) / IP(src=LEAF["ip"], dst=SPINE["ip"], flags="DF")
                   / UDP(sport=0xC123, dport=9999) / Raw(b"not box-to-box" * 8))
    # The untrusted frames come first: the cells they would poison are the ones summed.
    frames = [f for _, f, _ in untrusted] + [f for _, f in mine] + [f for _, f in transit] + [ordinary] + partials
    fragments = sum(1 for what, _ in mine if what.startswith("fragment"))
    assert fragments >= 3, fragments
    later = fragments - 1  # no UDP header: to another box not even known as box-to-box
    for name, workers, tree_first in (("1 worker", 1, True), ("2 workers, tree on the other", 2, False),
                                      ("2 workers, tree on the RX worker", 2, True)):
        run = os.path.join(tmp, name.replace(" ", "_").replace(",", ""))
        os.mkdir(run)
        in_pcap = os.path.join(run, "in.pcap")
        write_frames(in_pcap, frames)
        rings = [dict(ring_spec(rid, 4, 6, ppm, pmtu), tree=root_tree())]
        if workers > 1:
            plain = ring_spec(1, 2, 1, ppm, pmtu)
            rings = rings + [plain] if tree_first else [plain] + rings
        out1, final, status, listed = run_dataplane(run, in_pcap, rings, workers)
        out0 = rdpcap(os.path.join(run, "out0.pcap"))
        ring = [r for r in listed["rings"] if r["spec"]["id"] == rid][0]
        if workers > 1:
            assert ring["worker"] == (0 if tree_first else 1), (name, ring["worker"])
        left = [raw(f) for f in out0] + [raw(f) for f in out1]
        for what, f in mine + [(w, f) for w, f, _ in untrusted]:
            assert f not in left, "%s: a %s frame for the box was forwarded" % (name, what)
        got1 = [raw(f) for f in out1]
        for what, f in transit:
            assert got1.count(f) == 1, "%s: a %s frame for another box did not pass untouched" % (name, what)
        assert got1.count(ordinary) == 1, "%s: UDP to the box on another port did not pass untouched" % name
        results = [f for f in out0 + out1 if UDP in f and f[UDP].dport == B2B_PORT and f[IP].src == SPINE["ip"]]
        assert len(results) == 2 * ppm, "%s: %d results" % (name, len(results))
        for f in results:
            child, box = (0, LEAF) if f[IP].dst == LEAF["ip"] else (1, LEAF2)
            m, k, got = check_b2b(f, SPINE, box, 2, rid, ppm, child)
            want = position_data((parts[0] + parts[1]).astype(np.float32), k, pmtu)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "%s: result %d" % (name, k)
        assert len(out0) == ppm and len(out1) == ppm + len(transit) + 1, (name, len(out0), len(out1))
        reasons = final["reasons"]
        want = {"b2b_malformed": len(mine) - 1, "b2b_unknown_tree": 1, "partial_taken": 2 * ppm,
                "fwd_b2b_transit": len(transit) - later, "fwd_unparsed": later, "fwd_not_roce": 1,
                "b2b_bad_mac": 2, "b2b_stale_epoch": 1}
        assert {r: reasons[r] for r in want} == want, (name, {r: reasons[r] for r in want})
        dispatched = [w["dispatched"] for w in final["workers"]]
        if workers > 1 and not tree_first:
            # Only the well-formed frames of the tree went over (the valid partials and the
            # untrusted ones, judged by the tree's engine): the rest was judged by the RX
            # worker's engine, which holds no tree.
            assert dispatched == [2 * ppm + len(untrusted), 0], (name, dispatched)
            w0 = final["workers"][0]["reasons"]
            assert w0["b2b_malformed"] == len(mine) - 1 and w0["b2b_unknown_tree"] == 1, (name, w0)
        elif workers > 1:
            assert dispatched == [0, 0], (name, dispatched)
        print("tree_malformed (%s): %d malformed and %d untrusted frames for the box dropped (%d fragments), "
              "%d for another box and 1 other UDP frame forwarded untouched, %d partials summed; dispatched %s" %
              (name, len(mine), len(untrusted), fragments, len(transit), len(partials), dispatched))


def tree_bad_json_scenario(tmp, in_pcap):
    """Each malformed tree field refused with its field named, nothing installed; the
    same ring and tree again is ok, another tree a conflict; accumulate mode refuses trees."""
    wrpcap(in_pcap, [])
    good = dict(ring_spec(31, 4, 7, 4, 1024), tree=leaf_tree())
    msgs = []

    def bad(ctl, tree, field, code="invalid_argument", ring=None):
        r = ctl(cmd="install_ring", ring=dict(ring or good, tree=tree))
        assert r["ok"] is False, (tree, r)
        assert r["error"]["code"] == code and r["error"]["field"] == field, (tree, field, r)
        msgs.append(r["error"]["message"])

    def during(ctl):
        t = leaf_tree
        bad(ctl, [], "tree")
        bad(ctl, dict(t(), colour=1), "tree.colour")
        bad(ctl, {k: v for k, v in t().items() if k != "self"}, "tree.self")
        bad(ctl, dict(t(), self=dict(LEAF, ip="10.9.0.256")), "tree.self.ip")
        bad(ctl, dict(t(), self=dict(LEAF, mac="02:00:00:00:09")), "tree.self.mac")
        bad(ctl, dict(t(), children=[]), "tree.children")
        bad(ctl, dict(t(), children=[{"rank": 0}, {"node": 1}]), "tree.children[1]")
        bad(ctl, dict(t(), children=[{"rank": 0}, {"rank": 4}]), "tree.children")
        bad(ctl, dict(t(), children=[{"rank": 0}, {"rank": 0}]), "tree.children")
        bad(ctl, dict(t(), children=[{"rank": 0}, {"box": 0}]), "tree.children")
        bad(ctl, dict(t(), boxes=[dict(LEAF2)], children=[{"rank": 0}, {"box": 0}]), "tree.boxes[0].port")
        bad(ctl, dict(t(), boxes=[dict(LEAF2, port="c")], children=[{"rank": 0}, {"box": 0}]),
            "tree.boxes[0].port")
        bad(ctl, dict(t(), boxes=[dict(LEAF, port="a")], children=[{"rank": 0}, {"box": 0}]), "tree.boxes")
        bad(ctl, dict(t(), parent=dict(SPINE)), "tree.parent.port")
        bad(ctl, dict(t(), parent=dict(LEAF, port="b")), "tree.parent")
        bad(ctl, {k: v for k, v in t().items() if k not in ("parent", "index_at_parent")}, "tree.parent")
        bad(ctl, dict(t(), index_at_parent=16), "tree.index_at_parent")
        bad(ctl, dict(t(), index_at_parent=-1), "tree.index_at_parent")
        bad(ctl, {k: v for k, v in t().items() if k != "epoch"}, "tree.epoch")
        bad(ctl, dict(t(), epoch=1 << 32), "tree.epoch")
        bad(ctl, {k: v for k, v in t().items() if k != "key"}, "tree.key")
        bad(ctl, dict(t(), key=TREE_KEY.hex()[:-2]), "tree.key")
        bad(ctl, dict(t(), key="00" * 32), "tree.key")
        bad(ctl, t(), "window", ring=dict(good, window=0))  # the ring's own fields first
        listed = ctl(cmd="list_rings")
        assert listed["rings"] == [], listed
        assert ctl(cmd="status")["memory"]["engine_reserved_bytes"] == 0
        assert ctl(cmd="install_ring", ring=good)["ok"]
        assert ctl(cmd="install_ring", ring=good)["ok"]  # the same ring and tree: ok
        bad(ctl, dict(t(), index_at_parent=2), "tree", "conflict")
        bad(ctl, dict(t(), epoch=TREE_EPOCH + 1), "tree", "conflict")  # another installation
        plain = {k: v for k, v in good.items() if k != "tree"}
        r = ctl(cmd="install_ring", ring=plain)
        assert r["ok"] is False and r["error"]["code"] == "conflict" and r["error"]["field"] == "tree", r
        got = ctl(cmd="get_ring", id=31)["ring"]
        assert got["spec"]["tree"] == reported(leaf_tree()), got["spec"]
        assert set(got["counters"]["tree"]) >= {"partials_sent", "partials_resent", "partials_received",
                                                "results_received", "results_sent", "results_resent"}, got
    run_dataplane(tmp, in_pcap, [], 1, during=during)
    # Accumulate mode: a tree is refused, the box stays empty.
    tmp2 = os.path.join(tmp, "acc")
    os.mkdir(tmp2)

    def during_acc(ctl):
        r = ctl(cmd="install_ring", ring=good)
        assert r["ok"] is False and r["error"]["code"] == "unimplemented" and r["error"]["field"] == "tree", r
        msgs.append(r["error"]["message"])
        assert ctl(cmd="list_rings")["rings"] == []
    run_dataplane(tmp2, in_pcap, [], 1, during=during_acc, extra={"engine": {"reduce_mode": "accumulate"}})
    print("tree_bad_json: %d malformed trees refused with their field named; same tree ok, another a "
          "conflict" % len(msgs))
    for m in msgs[:4] + msgs[-2:]:
        print("  e.g. " + m)


# ---- fault injection (src/dataplane/faults.h) ------------------------------------

def faults_refused_scenario(tmp, in_pcap):
    """Without faults.enabled every set_fault is refused, naming the key; listing
    and clearing still answer. A bad faults section stops the box at start-up,
    naming the field."""
    wrpcap(in_pcap, [])
    proc, sock, _ = start_dataplane(tmp, in_pcap, [ring_spec(1, 3, 1, 4, 256)], 1)
    with dump_box_on_failure(proc):
        ctl = Control(sock)
        for req in ({"ring": 1, "kind": "drop", "fraction": 1.0, "duration_ms": 1000},
                    {"ring": "all", "kind": "bypass", "duration_ms": 1000},
                    {"ring": 1, "kind": "drop", "fraction": 7, "duration_ms": 0}):  # refused before its arguments
            r = ctl(cmd="set_fault", **req)
            assert r["ok"] is False and r["error"]["code"] == "conflict", (req, r)
            assert r["error"]["field"] == "faults.enabled" and "faults.enabled: true" in r["error"]["message"], r
        why = r["error"]["message"]
        listed = ctl(cmd="list_faults")
        assert listed["ok"] and listed["enabled"] is False and listed["faults"] == [], listed
        r = ctl(cmd="clear_faults")
        assert r["ok"] and r["cleared"] == 0, r
        st = ctl(cmd="stats")["dataplane_reasons"]
        assert all(st[k] == 0 for k in ("fault_drop", "fault_duplicate", "fault_reorder", "fault_bypass")), st
    stop_by(proc, ctl)
    refused = None
    for bad, field in (({"enabled": "yes"}, "faults.enabled"), ({"max_duration_ms": 0}, "faults.max_duration_ms"),
                       ({"enable": True}, "faults.enable")):
        p2, _, _ = start_dataplane(tmp, in_pcap, [], 1, extra={"faults": bad})
        _, err = p2.communicate(timeout=60)
        assert p2.returncode != 0 and field in err, (bad, p2.returncode, err[-2000:])
        refused = err.strip().splitlines()[-1]
    print("faults_refused: set_fault refused without faults.enabled (%r); a bad faults section stops the box "
          "(%r)" % (why[:60], refused[:90]))


def fault_counts(ctl):
    st = ctl(cmd="stats")
    return st["dataplane_reasons"], st["reasons"]


def faults_scenario(tmp, rng):
    """faults.enabled, ring 1 of 3 ranks, traffic in phases over veth pairs:
    bad arguments refused by field; bypass forwards every INA frame of the ring
    byte-identical (scapy compares bytes) past the engine; cleared, drop 1.0 drops
    every one and counts it; the drop fault expires on time and the same frames
    then aggregate exactly (numpy); duplicate 1.0 hands the engine every packet
    twice and the sums stay exact."""
    pmtu, ppm, ranks = 256, 4, 3
    frames, data, cap = ina_packets(1, ranks, 1, 2, ppm, pmtu, rng)
    msg0, msg1 = frames[:ppm * ranks], frames[ppm * ranks:]
    others = other_traffic(1)
    extra = {"faults": {"enabled": True, "max_duration_ms": 60000, "seed": 7}}
    with VethBox(tmp, [ring_spec(1, ranks, 1, ppm, pmtu)], extra=extra) as box:
        ctl = box.ctl

        def bad(req, field, code="invalid_argument"):
            r = ctl(cmd="set_fault", **req)
            assert r["ok"] is False and r["error"]["code"] == code and r["error"]["field"] == field, (req, r)
            return r["error"]["message"]
        ok = {"ring": 1, "kind": "drop", "fraction": 0.5, "duration_ms": 1000}
        msgs = [bad(dict(ok, fraction=1.5), "fraction"), bad(dict(ok, fraction=-0.1), "fraction"),
                bad(dict(ok, fraction="half"), "fraction"), bad(dict(ok, duration_ms=0), "duration_ms"),
                bad(dict(ok, duration_ms=60001), "duration_ms"), bad({k: v for k, v in ok.items() if k != "duration_ms"},
                                                                     "duration_ms"),
                bad(dict(ok, ring=9), "ring", "not_found"), bad(dict(ok, ring="some"), "ring"),
                bad(dict(ok, kind="explode"), "kind")]
        assert "faults.max_duration_ms" in msgs[4], msgs[4]
        assert ctl(cmd="list_faults")["faults"] == [], "a refused request left a fault"

        # Bypass: the ring's frames leave untouched; the engine never sees them.
        dp0, en0 = fault_counts(ctl)
        r = ctl(cmd="set_fault", ring=1, kind="bypass", duration_ms=60000)
        assert r["ok"] and [(f["ring"], f["kind"], f["fraction"]) for f in r["faults"]] == [(1, "bypass", 1.0)], r
        got = box.send(others[:3] + frames + others[3:])
        outs = [raw(f) for f in got]
        for f in frames + others:
            assert raw(f) in outs, "not forwarded byte-identical under bypass: %s" % f.summary()
        ina_out = [f for f in got if BTH in f and f[BTH].opcode in (0x06, 0x07, 0x08, 0x09)]
        assert len(ina_out) == len(frames), (len(ina_out), len(frames))
        dp1, en1 = fault_counts(ctl)
        assert dp1["fault_bypass"] - dp0["fault_bypass"] == len(frames), dp1
        engine_seen = sum(en1[k] - en0[k] for k in en1 if k not in ("fwd_not_write", "fwd_not_roce", "fwd_unparsed",
                                                                        "fwd_no_ina", "fwd_not_ring_link"))
        assert engine_seen == 0, "the engine saw %d of the bypassed packets: %s" % (engine_seen, en1)
        listed = ctl(cmd="list_faults")["faults"]
        assert listed[0]["packets"] == len(frames) and 0 < listed[0]["remaining_ms"] <= 60000, listed
        # An ordinary WRITE on a ring link (a job that failed over to the ring
        # path) whose first packet passes under the bypass and whose last one
        # after it ends: the engine saw the first (recorded its write), so
        # the last is forwarded too, not dropped as first_packet_lost.
        first, last = ordinary_write(1, pmtu)
        got = box.send([first])
        assert raw(first) in [raw(f) for f in got], "the ordinary first packet was not forwarded under bypass"
        r = ctl(cmd="clear_faults", ring=1)
        assert r["ok"] and r["cleared"] == 1 and r["faults"] == [], r
        got = box.send([last])
        _, en_last = fault_counts(ctl)
        assert raw(last) in [raw(f) for f in got], "the write's last packet was dropped after the bypass ended: %s" % {
            k: en_last[k] - en1[k] for k in en_last if en_last[k] != en1[k]}

        # Drop 1.0 on every ring, for 4 s: nothing of the ring leaves; then it expires.
        r = ctl(cmd="set_fault", ring="all", kind="drop", fraction=1.0, duration_ms=4000)
        assert r["ok"], r
        t_set = time.time()
        got = box.send(msg0 + others[3:], settle=1.0)
        ina_out = [f for f in got if BTH in f and f[BTH].opcode in (0x06, 0x07, 0x08, 0x09)]
        assert not ina_out, "%d packets left the box under drop 1.0" % len(ina_out)
        for o in others[3:]:
            assert raw(o) in {raw(f) for f in got}, "other traffic dropped: %s" % o.summary()
        dp2, _ = fault_counts(ctl)
        assert dp2["fault_drop"] - dp1["fault_drop"] == len(msg0), dp2
        listed = ctl(cmd="list_faults")["faults"]
        assert len(listed) == 1 and listed[0]["packets"] == len(msg0) and listed[0]["kind"] == "drop", listed
        while ctl(cmd="list_faults")["faults"]:
            assert time.time() - t_set < 10, "the 4 s drop fault is still listed after 10 s"
            time.sleep(0.1)
        expired_after = time.time() - t_set
        assert expired_after >= 3.9, "the drop fault ended after %.1f s of 4" % expired_after
        got = box.send(msg0)
        n = check_released(got, frames, data, ranks, pmtu, cap)
        assert n == len(msg0), "after the fault expired: released %d of %d" % (n, len(msg0))

        # Duplicate 1.0: every packet reaches the engine twice; the sums stay exact.
        _, en2 = fault_counts(ctl)
        dp2, _ = fault_counts(ctl)
        assert ctl(cmd="set_fault", ring=1, kind="duplicate", fraction=1.0, duration_ms=60000)["ok"]
        got = box.send(msg1)
        n = check_released(got, frames, data, ranks, pmtu, cap)
        assert n >= len(msg1), "under duplicate: released %d of %d" % (n, len(msg1))
        dp3, en3 = fault_counts(ctl)
        assert dp3["fault_duplicate"] - dp2["fault_duplicate"] == len(msg1), dp3
        engine_seen = sum(en3[k] - en2[k] for k in ("held", "duplicate", "served_from_cell"))
        assert engine_seen == 2 * len(msg1), "the engine saw %d packets, not twice %d: %s" % (
            engine_seen, len(msg1), {k: en3[k] - en2[k] for k in en3 if en3[k] != en2[k]})
        r = ctl(cmd="clear_faults")
        assert r["ok"] and r["cleared"] == 1, r
        final = box.stop()
    check_reason_surfaces(final, {k: 0 for k in final["dataplane_reasons"]})
    assert final["dataplane_reasons"]["fault_bypass"] == len(frames)
    assert final["dataplane_reasons"]["fault_drop"] == len(msg0)
    assert final["dataplane_reasons"]["fault_duplicate"] == len(msg1)
    print("faults: %d bad requests refused by field (e.g. %r); bypass: %d frames byte-identical, engine untouched; "
          "drop 1.0: %d dropped, expired after %.1f s, then exact; duplicate 1.0: %d copies, sums exact" % (
              len(msgs), msgs[4][:70], len(frames), len(msg0), expired_after, len(msg1)))


def faults_reorder_scenario(tmp, in_pcap, rng):
    """Reorder under full bursts: the input loops (net_pcap), so bursts are full
    and a held packet has a later one of its ring to follow. Reorder 1.0 swaps
    packets and counts them, the per-fault count matches the reason counter, and
    once cleared the counter stands still while the box keeps forwarding: nothing
    stays held. A 1 s fault of another kind ends by itself."""
    frames, _, _ = ina_packets(1, 3, 1, 2, 4, 256, rng)
    wrpcap(in_pcap, frames + other_traffic(1))
    proc, sock, _ = start_dataplane(tmp, in_pcap, [ring_spec(1, 3, 1, 4, 256)], 1, loop=True,
                                    extra={"faults": {"enabled": True}})
    with dump_box_on_failure(proc):
        ctl = Control(sock)
        wait_port1_tx(ctl, 30)
        assert ctl(cmd="set_fault", ring=1, kind="reorder", fraction=1.0, duration_ms=60000)["ok"]
        time.sleep(1.0)
        listed = ctl(cmd="list_faults")["faults"]
        assert ctl(cmd="clear_faults")["cleared"] == 1
        a, _ = fault_counts(ctl)
        assert a["fault_reorder"] > 100, a
        assert listed[0]["packets"] > 100 and listed[0]["packets"] <= a["fault_reorder"], (listed, a)
        tx = port1_tx(ctl)
        time.sleep(0.5)
        b, _ = fault_counts(ctl)
        assert b["fault_reorder"] == a["fault_reorder"], "reordering went on after the clear: %s" % b
        assert port1_tx(ctl) > tx, "the box stopped forwarding after the reorder fault"
        assert ctl(cmd="set_fault", ring=1, kind="drop", fraction=0.25, duration_ms=1000)["ok"]
        t0 = time.time()
        while ctl(cmd="list_faults")["faults"]:
            assert time.time() - t0 < 5, "a 1 s fault still listed after 5 s"
            time.sleep(0.05)
        c, _ = fault_counts(ctl)
        time.sleep(0.3)
        d, _ = fault_counts(ctl)
        assert c["fault_drop"] > 0 and d["fault_drop"] == c["fault_drop"], (c, d)
    stop_by(proc, ctl)
    print("faults_reorder: %d packets reordered in 1 s of a looping input, none after the clear; a 1 s drop "
          "0.25 fault dropped %d and ended by itself" % (a["fault_reorder"], c["fault_drop"]))


def main():
    scenario = sys.argv[2]
    rng = np.random.default_rng(7)
    pmtu, ppm = 1024, 4
    with tempfile.TemporaryDirectory() as tmp:
        in_pcap = os.path.join(tmp, "in.pcap")
        if scenario == "one_ring":
            frames, data, cap = ina_packets(1, 3, 1, 3, ppm, pmtu, rng)
            others = other_traffic(1)
            wrpcap(in_pcap, others[:3] + frames + others[3:])
            out, final, status, rings = run_dataplane(tmp, in_pcap, [ring_spec(1, 3, 1, ppm, pmtu)], 1)
            n = check_released(out, frames, data, 3, pmtu, cap)
            assert n == len(frames), "released %d of %d INA packets" % (n, len(frames))
            outs = {raw(f) for f in out}
            for o in others:
                assert raw(o) in outs, "non-INA frame not forwarded byte-identical: %s" % o.summary()
            reasons = final["reasons"]
            assert reasons["held"] == len(frames), reasons
            assert reasons["fwd_not_write"] == 5 and reasons["fwd_no_ina"] == 1 and reasons["fwd_not_roce"] == 1, reasons
            ring = rings["rings"][0]["counters"]
            assert ring["messages_completed"] == 3 and ring["cells_completed"] == 3 * ppm, ring
            assert len(out) == len(frames) + len(others)
            tel = run_dataplane.telemetry
            assert tel["held"] == len(frames) and tel["fwd_not_write"] == 5, tel
            print("one_ring: %d INA packets aggregated and checked, %d other frames forwarded unchanged" %
                  (n, len(others)))
        elif scenario == "stripes":
            stripes_scenario(tmp, in_pcap, rng)
        elif scenario == "stripes_home":
            stripes_scenario(tmp, in_pcap, rng, workers=3)
        elif scenario == "two_rings":
            fa, da, cap = ina_packets(1, 3, 1, 2, ppm, pmtu, rng)
            fb, db, _ = ina_packets(2, 2, 2, 2, ppm, pmtu, rng)
            mixed = [x for pair in zip(fa, fb) for x in pair] + fa[len(fb):] + fb[len(fa):]
            wrpcap(in_pcap, mixed)
            out, final, status, rings = run_dataplane(
                tmp, in_pcap, [ring_spec(1, 3, 1, ppm, pmtu), ring_spec(2, 2, 2, ppm, pmtu)], 2)
            owners = {r["spec"]["id"]: r["worker"] for r in rings["rings"]}
            assert owners[1] != owners[2], "rings should sit on different workers: %s" % owners
            oa = [f for f in out if IP in f and f[IP].src.startswith("10.1.")]
            ob = [f for f in out if IP in f and f[IP].src.startswith("10.2.")]
            n = check_released(oa, fa, da, 3, pmtu, cap) + check_released(ob, fb, db, 2, pmtu, cap)
            assert n == len(fa) + len(fb), "released %d of %d" % (n, len(fa) + len(fb))
            dispatched = sum(w["dispatched"] for w in final["workers"])
            assert dispatched > 0, "the second worker should have been fed through dispatch"
            print("two_rings: %d packets on workers %s, %d dispatched between workers" % (n, owners, dispatched))
        elif scenario == "remove_while_flowing":
            frames, data, cap = ina_packets(1, 3, 1, 2, ppm, pmtu, rng)
            # Only ranks 0 and 1 send: every cell stays open, packets are held.
            partial = [f for f in frames if f[IP].src != ip(2, 1)]
            wrpcap(in_pcap, partial)

            def remove(ctl):
                time.sleep(1.0)
                before = ctl(cmd="status")["mbufs"]["in_use"]
                remove.held = ctl(cmd="get_ring", id=1)["ring"]["held_packets"]
                r = ctl(cmd="remove_ring", id=1)
                assert r["ok"], r
                assert ctl(cmd="remove_ring", id=1)["error"]["code"] == "not_found"
                remove.before = before
            out, final, status, rings = run_dataplane(tmp, in_pcap, [ring_spec(1, 3, 1, ppm, pmtu)], 1,
                                                      loop=True, during=remove)
            assert rings["rings"] == [], rings
            # Exactly the held packets were released with the reason, none leaked.
            assert final["reasons"]["ring_removed"] == remove.held > 0, (remove.held, final["reasons"])
            print("remove_while_flowing: %d packets held before removal, ring_removed=%d, after: unknown_ring=%d "
                  "first_packet_lost=%d fwd_no_ina=%d, mbufs in use at the end %d" %
                  (remove.before, final["reasons"]["ring_removed"], final["reasons"]["unknown_ring"],
                   final["reasons"]["first_packet_lost"], final["reasons"]["fwd_no_ina"],
                   status["mbufs"]["in_use"]))
        elif scenario == "bad_requests":
            wrpcap(in_pcap, [])
            results = []

            def hostile(ctl):
                good = ring_spec(5, 2, 3, 4, 1024)
                def bad(req, field, code="invalid_argument", raw_line=None):
                    if raw_line is not None:
                        ctl.f.write(raw_line + "\n")
                        ctl.f.flush()
                        r = json.loads(ctl.f.readline())
                    else:
                        r = ctl(**req)
                    assert r["ok"] is False, (req, r)
                    assert r["error"]["code"] == code and r["error"]["field"] == field, (req, r)
                    assert r["error"]["message"], r
                    results.append(r["error"]["message"])
                bad(None, "", raw_line="this is not json")
                bad(None, "cmd", raw_line="[1, 2, 3]")
                bad({"cmd": 5}, "cmd")
                bad({"cmd": "reboot"}, "cmd")
                bad({"cmd": "install_ring"}, "ring")
                bad({"cmd": "install_ring", "ring": "x"}, "")
                bad({"cmd": "install_ring", "ring": dict(good, members=["10.3.0.1"])}, "members")
                bad({"cmd": "install_ring", "ring": dict(good, members=["10.3.0.1", "10.3.0.1"])}, "members[1]")
                bad({"cmd": "install_ring", "ring": dict(good, members=["10.3.0.1", "10.3.0.300"])}, "members[1]")
                bad({"cmd": "install_ring", "ring": dict(good, dtypes=["float"])}, "dtypes")
                bad({"cmd": "install_ring", "ring": dict(good, ops=[])}, "ops")
                bad({"cmd": "install_ring", "ring": dict(good, colour="red")}, "colour")
                bad({"cmd": "install_ring", "ring": dict(good, id="abc")}, "id")
                bad({"cmd": "install_ring", "ring": dict(good, id=-1)}, "id")
                bad({"cmd": "install_ring", "ring": dict(good, payload_bytes=1000)}, "payload_bytes")
                bad({"cmd": "install_ring", "ring": dict(good, window=0)}, "window")
                bad({"cmd": "install_ring", "ring": dict(good, memory_quota=10)}, "memory_quota", "resource_exhausted")
                bad({"cmd": "install_ring", "ring": dict(good, id=6, msg_len=1024, window=1024, payload_bytes=4096,
                                                         members=["10.4.0.%d" % i for i in range(1, 65)])},
                    "memory", "resource_exhausted")
                # 8192 mbufs, half may be held: 1 other rank x 64 packets x 128 slots is more.
                bad({"cmd": "install_ring", "ring": dict(good, id=7, msg_len=64, window=64)},
                    "memory.mbufs", "resource_exhausted")
                assert ctl(cmd="install_ring", ring=good)["ok"]
                assert ctl(cmd="install_ring", ring=good)["ok"]  # same spec: idempotent
                bad({"cmd": "install_ring", "ring": dict(good, window=8)}, "id", "conflict")
                bad({"cmd": "remove_ring", "id": 77}, "id", "not_found")
                bad({"cmd": "remove_ring"}, "id")
                bad({"cmd": "get_ring", "id": "five"}, "id")
                bad({"cmd": "install_ctt"}, "cmd")  # trees replaced it: an unknown command
                # An endless line is refused and the connection closed; the box lives on.
                raw_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                raw_sock.connect(os.path.join(tmp, "dp.sock"))
                try:
                    raw_sock.sendall(b"x" * (1 << 21))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the box hung up while we were still writing: also fine
                try:
                    reply = raw_sock.makefile().readline()
                except ConnectionResetError:
                    reply = ""
                if reply:
                    r = json.loads(reply)
                    assert r["ok"] is False and "longer than" in r["error"]["message"], r
                    results.append(r["error"]["message"])

            def during(ctl):
                hostile(ctl)
                fresh = Control(os.path.join(tmp, "dp.sock"))
                assert fresh(cmd="ping")["ok"]
                ids = [x["spec"]["id"] for x in fresh(cmd="list_rings")["rings"]]
                assert ids == [5], ids
            out, final, status, rings = run_dataplane(tmp, in_pcap, [], 1, during=during)
            assert [x["spec"]["id"] for x in rings["rings"]] == [5]
            print("bad_requests: %d hostile requests refused with their field named; the box kept its state" %
                  len(results))
            for m in results[:6]:
                print("  e.g. " + m)
        elif scenario == "tree_leaf":
            tree_leaf_scenario(tmp, in_pcap, rng)
        elif scenario == "tree_root":
            tree_root_scenario(tmp, in_pcap, rng, 1)
        elif scenario == "tree_steering":
            tree_root_scenario(tmp, in_pcap, rng, 2)
            leaf = os.path.join(tmp, "leaf")
            os.mkdir(leaf)
            tree_leaf_scenario(leaf, os.path.join(leaf, "in.pcap"), rng, 2)
        elif scenario == "tree_malformed":
            tree_malformed_scenario(tmp, rng)
        elif scenario == "tree_bad_json":
            tree_bad_json_scenario(tmp, in_pcap)
        elif scenario == "idle":
            idle_scenario(tmp, in_pcap, rng)
        elif scenario == "polling":
            polling_scenario(tmp, in_pcap)
        elif scenario == "crash_report":
            crash_report_scenario(tmp, in_pcap, rng)
        elif scenario == "modes":
            modes_scenario(tmp, in_pcap)
        elif scenario == "stuck_worker":
            stuck_worker_scenario(tmp, in_pcap)
        elif scenario == "stalled_worker":
            stalled_worker_scenario(tmp, in_pcap)
        elif scenario == "idle_wake":
            idle_wake_scenario(tmp, rng)
        elif scenario == "remove_mid_message":
            remove_mid_message_scenario(tmp, rng)
        elif scenario == "placement":
            placement_scenario(tmp, rng)
        elif scenario == "bad_bytes":
            bad_bytes_scenario(tmp, in_pcap)
        elif scenario == "lcore_stalls":
            lcore_stalls_scenario(tmp, in_pcap)
        elif scenario == "slow_client":
            slow_client_scenario(tmp, in_pcap)
        elif scenario == "control_access":
            control_access_scenario(tmp, in_pcap)
        elif scenario == "faults_refused":
            faults_refused_scenario(tmp, in_pcap)
        elif scenario == "faults":
            faults_scenario(tmp, rng)
        elif scenario == "faults_reorder":
            faults_reorder_scenario(tmp, in_pcap, rng)
        elif scenario == "af_packet":
            af_packet_scenario(tmp, rng)
        elif scenario == "bad_setup":
            # The binary refuses to start and says what to fix.
            def refuse(cfg, expect):
                path = os.path.join(tmp, "bad.yaml")
                with open(path, "w") as f:
                    json.dump(cfg, f)
                p = subprocess.run([sys.argv[1], "-c", path], capture_output=True, text=True, timeout=60)
                assert p.returncode != 0 and expect in p.stderr, (p.returncode, p.stderr[-2000:])
                return p.stderr.strip().splitlines()[-1]
            base_eal = ["-l", "0-1", "--no-huge", "-m", "256", "--no-pci", "--log-level", "lib.eal:warning",
                        "--file-prefix", "nr%d" % os.getpid(),
                        "--vdev", "net_null0", "--vdev", "net_null1"]
            ok_ports = [{"name": "net_null0"}, {"name": "net_null1"}]
            msgs = [
                refuse({"eal": base_eal, "ports": [{"name": "net_null0"}, {"name": "net_pcap7"}]},
                       "no DPDK port named 'net_pcap7'"),
                refuse({"eal": base_eal, "ports": ok_ports, "workers": [5]}, "lcore 5 is not an EAL worker lcore"),
                refuse({"eal": base_eal, "ports": ok_ports, "memory": {"mbufs": 4000000}}, "memory.mbufs"),
                refuse({"eal": base_eal, "ports": ok_ports, "engine": {"reduce_mode": "fast"}}, "engine.reduce_mode"),
                refuse({"eal": ["-l", "0", "--no-huge", "-m", "256", "--no-pci", "--file-prefix", "nr%d" % os.getpid(),
                                "--vdev", "net_null0",
                                "--vdev", "net_null1"], "ports": ok_ports}, "no worker lcore"),
            ]
            for m in msgs:
                print("refused: " + m)
        else:
            raise SystemExit("unknown scenario " + scenario)


if __name__ == "__main__":
    main()
