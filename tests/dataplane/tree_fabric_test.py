#!/usr/bin/python3
"""Three real netreduce-dataplane processes as one multi-rack fabric:
two leaf boxes and a spine, on DPDK net_af_packet ports over veth pairs, wired
as a chain so that every frame has exactly one way to go:

    rack A (ranks 0, 1)                                      rack B (ranks 2, 3)
    fA1 [netns] --- a| leaf A |b --- a| spine |b --- b| leaf B |a --- fB1 [netns]

The far ends of the two rack links sit in a network namespace this test creates
(and always deletes); a scapy process in it plays the workers: it sends each
rack's RDMA WRITEs (the INA frames of pcapbox.py, built with scapy) into
its leaf and captures what comes back out. A leaf holds its local ranks' packets
and sends their partial up by port b; the spine reduces the two partials in child
order and sends the result down to each leaf by the port the tree names; each
leaf writes it into its held packets and releases them, and they cross the spine
and the other leaf untouched to the far rack (no box owns them there). Checked
with numpy and scapy, not the code under test: every released packet carries
(r0 + r1) + (r2 + r3) in float32, a valid ICRC and the sender's own headers.

Then the spine is killed (SIGKILL) mid-message: leaf A's partials of message 1
had reached it, leaf B's not yet. It is started again with the same --rings file
and gets its tree entry back (list_rings shows it). Rack B's packets arrive, and
rank 0 retransmits (its RC timeout: the same bytes), which makes leaf A send its
partial again; the spine completes the message and every worker's message 1 is
exact. The boxes use idle-aware polling (the default idle_sleep_max_us), so
three boxes and the workers share the 2-core machine.

Usage: tree_fabric_test.py <netreduce-dataplane>
"""
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
from scapy.all import Ether, IP, UDP, rdpcap, wrpcap, raw
from scapy.contrib.roce import BTH

import pcapbox as dp
from pcap_trees import LEAF, LEAF2, SPINE, B2B_PORT, TREE_EPOCH, TREE_KEY, position_data, reported

RID, RANKS, BASE, PPM, PMTU = 31, 4, 5, 4, 1024
RACK = {0: "A", 1: "A", 2: "B", 3: "B"}


def trees():
    """Each box's node of the ring's tree (the data plane's "tree" JSON), one installation."""
    same = {"epoch": TREE_EPOCH, "key": TREE_KEY.hex()}
    leaf_a = dict(same, self=LEAF, children=[{"rank": 0}, {"rank": 1}],
                  parent=dict(SPINE, port="b"), index_at_parent=0)
    leaf_b = dict(same, self=LEAF2, children=[{"rank": 2}, {"rank": 3}],
                  parent=dict(SPINE, port="b"), index_at_parent=1)
    spine = dict(same, self=SPINE, children=[{"box": 0}, {"box": 1}],
                 boxes=[dict(LEAF, port="a"), dict(LEAF2, port="b")])
    return {"leafA": leaf_a, "spine": spine, "leafB": leaf_b}


class Box:
    """One netreduce-dataplane on two af_packet ports."""

    def __init__(self, exe, tmp, name, port_a, port_b, tree):
        self.exe, self.name = exe, name
        self.dir = os.path.join(tmp, name)
        os.makedirs(self.dir, exist_ok=True)
        self.sock = os.path.join(self.dir, "dp.sock")
        self.cfg = os.path.join(self.dir, "dp.yaml")
        self.rings = os.path.join(self.dir, "rings.json")
        cfg = {"eal": ["--lcores", "0@0,1@1", "--no-huge", "-m", "256", "--no-pci", "--log-level",
                       "lib.eal:warning", "--file-prefix", "nr%s%d" % (name, os.getpid()),
                       "--vdev", "net_af_packet0,iface=%s" % port_a, "--vdev", "net_af_packet1,iface=%s" % port_b],
               "ports": [{"name": "net_af_packet0"}, {"name": "net_af_packet1"}],
               "mtu": 1500, "memory": {"mbufs": 4096}, "control": {"socket": self.sock}}
        with open(self.cfg, "w") as f:
            json.dump(cfg, f)
        with open(self.rings, "w") as f:  # the box's persisted entries: given again at every start
            json.dump([dict(dp.ring_spec(RID, RANKS, BASE, PPM, PMTU), tree=tree)], f)
        self.proc = self.ctl = None

    def start(self):
        # DPDK 22.11's net_af_packet puts each socket in fanout group (getpid() ^ ifindex) & 0xffff,
        # per network namespace: a box whose id matches another box's group (on another interface)
        # exits at start-up with "could not set PACKET_FANOUT". Its next pid gives another id.
        for attempt in range(4):
            if os.path.exists(self.sock):  # left by a killed process of this box
                os.unlink(self.sock)
            self.proc = subprocess.Popen([self.exe, "-c", self.cfg, "--rings", self.rings],
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            while self.proc.poll() is None and not os.path.exists(self.sock):
                time.sleep(0.05)
            if self.proc.poll() is None:
                break
            err = self.proc.communicate()[1]
            if "could not set PACKET_FANOUT" not in err or attempt == 3:
                raise AssertionError("%s exited at start-up: %s" % (self.name, err[-2000:]))
            print("%s: af_packet fanout group id clashed with another box's; starting it again" % self.name)
        self.ctl = dp.Control(self.sock)
        st = self.ctl(cmd="status")
        assert st["ok"], st
        return self

    def ring(self):
        r = self.ctl(cmd="get_ring", id=RID)
        assert r["ok"], (self.name, r)
        return r["ring"] if "ring" in r else r

    def kill(self):
        self.ctl.close()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=30)

    def stop(self):
        out, _ = dp.stop_by(self.proc, self.ctl)
        return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])

    def abort(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            print("%s: %s" % (self.name, self.proc.communicate()[1][-2000:]), file=sys.stderr)


class Fabric:
    def __init__(self, exe, tmp):
        self.exe, self.tmp = exe, tmp
        tag = os.getpid() % 10000
        self.ns = "nrfab%d" % tag
        # (near end in the root namespace, far end, far end in the netns?)
        self.links = {"rackA": ("nfa%d" % tag, "fA1", True), "AS": ("nfl%d" % tag, "nfs%d" % tag, False),
                      "SB": ("nfg%d" % tag, "nfh%d" % tag, False), "rackB": ("nfb%d" % tag, "fB1", True)}
        self.boxes, self.phase = {}, 0

    def __enter__(self):
        dp.sh("ip", "netns", "add", self.ns)
        for near, far, in_ns in self.links.values():
            if in_ns:
                dp.sh("ip", "link", "add", near, "type", "veth", "peer", "name", far, "netns", self.ns)
                dp.sh("ip", "-n", self.ns, "link", "set", far, "up")
            else:
                dp.sh("ip", "link", "add", near, "type", "veth", "peer", "name", far)
                dp.sh("ip", "link", "set", far, "up")
            dp.sh("ip", "link", "set", near, "up")
        t = trees()
        L = self.links
        self.boxes = {"leafA": Box(self.exe, self.tmp, "leafA", L["rackA"][0], L["AS"][0], t["leafA"]),
                      "spine": Box(self.exe, self.tmp, "spine", L["AS"][1], L["SB"][0], t["spine"]),
                      "leafB": Box(self.exe, self.tmp, "leafB", L["rackB"][0], L["SB"][1], t["leafB"])}
        for b in self.boxes.values():
            b.start()
        return self

    def exchange(self, sends, settle=2.0):
        """Sends, in order, (rack, frames) pairs into the racks' links; returns what came out
        at each rack: IPv4 UDP frames (the veths' own IPv6 chatter is not ours) not from the
        rack's own ranks (a capture also sees what is sent on its interface)."""
        self.phase += 1
        plan = []
        for i, (rack, frames) in enumerate(sends):
            p = os.path.join(self.tmp, "send%d_%d.pcap" % (self.phase, i))
            wrpcap(p, frames)
            plan.append(("f%s1" % rack, p))
        got = {r: os.path.join(self.tmp, "got%d_%s.pcap" % (self.phase, r)) for r in "AB"}
        code = ("from scapy.all import *\n"
                "sn = {r: AsyncSniffer(iface='f' + r + '1', store=True, filter='udp') for r in 'AB'}\n"
                "[s.start() for s in sn.values()]; time.sleep(1)\n"
                "for iface, p in %r:\n"
                "    sendp(rdpcap(p), iface=iface, verbose=False, inter=0.002)\n"
                "time.sleep(%r)\n"
                "for r, s in sn.items():\n"
                "    s.stop(); wrpcap(%r[r], s.results)\n") % (plan, settle, got)
        subprocess.run(["ip", "netns", "exec", self.ns, "/usr/bin/python3", "-c", code], check=True, timeout=120)
        own = {r: {dp.ip(x, BASE) for x in range(RANKS) if RACK[x] == r} for r in "AB"}
        return {r: [f for f in rdpcap(p) if IP in f and f[IP].src not in own[r]] for r, p in got.items()}

    def __exit__(self, *exc):
        for b in self.boxes.values():
            b.abort()
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        for near, far, in_ns in self.links.values():
            subprocess.run(["ip", "link", "del", near], capture_output=True)
        return False


def check_released(out, sent, total, m):
    """The released packets of message m arriving at one rack: each of the other rack's
    packets once, with the tree reference and a valid ICRC, headers as sent."""
    by_key = {(f[IP].src, f[BTH].psn): raw(f) for f in sent}
    seen = set()
    for f in out:
        if BTH not in f or f[UDP].dport != 4791:
            continue
        key = (f[IP].src, f[BTH].psn)
        assert key in by_key, "a frame nobody sent: %s" % f.summary()
        assert key not in seen, "released twice: %s" % f.summary()
        seen.add(key)
        b, orig = raw(f), by_key[key]
        assert len(b) == len(orig)
        assert struct.unpack("<I", Ether(b)[BTH].compute_icrc(None))[0] == struct.unpack("<I", b[-4:])[0], "bad ICRC"
        op = f[BTH].opcode
        off = 14 + 20 + 8 + 12 + (16 + 24 if op == 0x06 else 0) + (4 if op == 0x09 else 0)
        dp.check_headers(b, orig, off, op, m, total)
        r = [x for x in range(RANKS) if dp.ip(x, BASE) == f[IP].src][0]
        k = ((f[BTH].psn - (1000 + r * 100)) & 0xFFFFFF) - m * PPM
        got = np.frombuffer(b[off:-4], dtype=np.float32)
        want = position_data(total, k, PMTU)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "rank %d message %d packet %d" % (r, m, k)
    assert seen == set(by_key), "released %d of %d" % (len(seen), len(by_key))
    return len(seen)


def main():
    exe = sys.argv[1]
    rng = np.random.default_rng(15)
    frames, data, cap = dp.ina_packets(RID, RANKS, BASE, 2, PPM, PMTU, rng)
    # ina_packets interleaves rank by rank per position: message m's frames are a block.
    per_msg = RANKS * PPM
    msg = [frames[m * per_msg:(m + 1) * per_msg] for m in range(2)]

    def of(m, racks):
        return [f for f in msg[m] if RACK[[x for x in range(RANKS) if dp.ip(x, BASE) == f[IP].src][0]] in racks]

    def total(m):  # tree order: rack A in rank order, rack B in rank order, then A + B
        a = (data[(0, m)] + data[(1, m)]).astype(np.float32)
        b = (data[(2, m)] + data[(3, m)]).astype(np.float32)
        return (a + b).astype(np.float32)

    with tempfile.TemporaryDirectory() as tmp, Fabric(exe, tmp) as fab:
        leaf_a, spine, leaf_b = fab.boxes["leafA"], fab.boxes["spine"], fab.boxes["leafB"]
        # Message 0: both racks; each rack receives the other's released packets.
        got = fab.exchange([("A", of(0, "A")), ("B", of(0, "B"))])
        n0 = check_released(got["B"], of(0, "A"), total(0), 0) + check_released(got["A"], of(0, "B"), total(0), 0)
        assert not [f for f in got["A"] + got["B"] if f[UDP].dport == B2B_PORT], "a box-to-box frame leaked to a rack"
        sp = spine.ring()
        assert sp["counters"]["tree"]["partials_received"] == 2 * PPM, sp["counters"]
        assert sp["counters"]["tree"]["results_sent"] == 2 * PPM, sp["counters"]
        # Message 1: rack A's packets; leaf A's partials reach the spine; the spine dies.
        got_a = fab.exchange([("A", of(1, "A"))], settle=1.0)
        assert not got_a["A"] and not got_a["B"], "released before rack B sent anything"
        deadline = time.time() + 20
        while spine.ring()["counters"]["tree"]["partials_received"] < 3 * PPM:
            assert time.time() < deadline, spine.ring()["counters"]
            time.sleep(0.1)
        spine.kill()
        spine.start()
        listed = spine.ctl(cmd="list_rings")
        assert listed["ok"] and [r["spec"].get("tree") for r in listed["rings"]] == [dict(reported(trees()["spine"]), index_at_parent=0)], listed
        assert spine.ring()["counters"]["tree"]["partials_received"] == 0  # a fresh entry
        # Rack B's packets, then rank 0's retransmission of message 1 (the same bytes).
        resend = [f for f in of(1, "A") if f[IP].src == dp.ip(0, BASE)]
        got = fab.exchange([("B", of(1, "B")), ("A", resend)])
        n1 = check_released(got["B"], of(1, "A"), total(1), 1) + check_released(got["A"], of(1, "B"), total(1), 1)
        la, sp, lb = leaf_a.ring()["counters"], spine.ring()["counters"], leaf_b.ring()["counters"]
        assert la["tree"]["partials_sent"] == 2 * PPM and la["tree"]["partials_resent"] == PPM, la
        assert la["tree"]["results_received"] == 2 * PPM and lb["tree"]["results_received"] == 2 * PPM, (la, lb)
        assert sp["tree"]["partials_received"] == 2 * PPM and sp["tree"]["results_sent"] == 2 * PPM, sp
        for name, c in (("leafA", la), ("leafB", lb)):
            assert c["messages_completed"] == 2 and c["cells_completed"] == 2 * PPM, (name, c)
        finals = {name: b.stop() for name, b in fab.boxes.items()}
        for name, st in finals.items():
            bad = {k: v for k, v in st["reasons"].items()
                   if v and k in ("b2b_bad_mac", "b2b_stale_epoch", "b2b_malformed", "b2b_unknown_tree", "b2b_unknown_box",
                                  "bad_icrc", "alloc_failed")}
            assert not bad, (name, bad)
        print("tree fabric: 3 netreduce-dataplane processes (leaf A, spine, leaf B) over veth pairs; message 0: "
              "%d packets released exact (numpy) with valid ICRCs (scapy); spine SIGKILLed with message 1 half in, "
              "restarted with its entry back; leaf A resent %d partials on rank 0's retransmission; message 1: "
              "%d packets exact" % (n0, la["tree"]["partials_resent"], n1))


if __name__ == "__main__":
    main()
