#!/usr/bin/python3
"""The Soft-RoCE lab: real RoCEv2 endpoints (Linux rdma_rxe in QEMU guests)
talking through the real netreduce-dataplane, wired the way the box is
deployed. This module builds the lab (Lab: namespace, switches, taps,
steering, racks, teardown) over the lab_*.py modules: lab_common.py
(errors, log, host commands, addresses), lab_boot.py (the guests' kernel
and initramfs), lab_guest.py (guests and their jobs, perftest), lab_box.py
(the box, captures) and lab_report.py (a scenario's report, step retry and
command line). Scenarios are short scripts over them:
scenario_forwarding.py (1, and 5 for frames rxe made), scenario_allreduce.py
(2, 5 for the box's aggregated frames, 3 and 4: libnetreduce with
netreduced), scenario_lab.py (the lab itself), scenario_parallel.py (local
ranks and striped rings), scenario_multirack.py (two racks, a tree of three
boxes). `nrlab.py --help` is a CLI for running things by hand.

Theory of operation
-------------------
Everything lives in one network namespace, `nrlab-<pid>`, created at start and
always deleted at the end (also on an exception, SIGINT, SIGTERM or SIGHUP; a
namespace left by a process that was SIGKILLed is removed by the next run).

          guest g0            guest g1    ...  (QEMU, TCG, 1 vCPU, 512 MiB;
          eth0 10.77.0.1      eth0 10.77.0.2    rdma_rxe on eth0)
             |                   |
           tap0                tap1        <- tc ingress (clsact) on every tap:
             |                   |            u32 "ip proto 17, udp dport 4791"
     +-------+-------------------+------+     -> mirred egress redirect dev swa
     |   br0: the emulated switch       |
     |   (everything else is switched   |  br0 itself has HOST_IP 10.77.0.254:
     |    normally by MAC learning)     |  host-side services (Lab.spawn) listen
     +--------------------------+-------+  there
        (swa: NOT a bridge port)   | swb: bridge port, learning off,
             ^                     |      flood/mcast_flood/bcast_flood off
             | veth                | veth
           boxa ---[ netreduce-dataplane ]--- boxb
           port A   net_af_packet0/1        port B

RoCEv2 frames a guest sends never reach the bridge: its tap's ingress filter
redirects them to swa, so they arrive on the box's port A. The box sends them
out of port B (transparently, or aggregated), they enter the bridge at swb and
are switched by destination MAC to the receiving guest's tap. Why this cannot
loop or leak:
  - swa is not a bridge port, so the bridge never floods into port A; what the
    box might send out of port A arrives on swa and is dropped (no IP, no
    master).
  - swb is a bridge port with learning off, so guest MACs are never learnt on
    it and no unicast is ever switched to it, and with flooding off no
    unknown-unicast, multicast or broadcast frame is either. Multicast
    snooping is off on br0 and swb is no multicast-router port, or the
    guests' IGMP reports would be forwarded to it. Nothing enters port B, so
    nothing comes back out of port A (scenario 1 checks both counters).
  - the redirect filter sits only on the guests' taps, not on swb, so a RoCE
    frame coming back from the box is switched, not redirected again.
  - ARP and the TCP connections that perftest and rdma-cm use to exchange QP
    numbers do not cross the box (they are not UDP 4791), exactly as in the
    deployment (deploy/switch-steering.md#why-it-cannot-loop: an ACL/PBR rule redirecting UDP 4791
    to the box's port A, with port B an ordinary access port that does not
    learn and is excluded from flooding).
The u32 match assumes a 20-byte IPv4 header; RoCE with IP options (which the
box would forward untouched anyway) is switched normally.

Guests boot Debian's stock kernel (linux-image-amd64: the host kernel may have
no RDMA) with -kernel on the uncompressed ELF (PVH entry, cached under the work
directory) and a busybox initramfs (initramfs_init.sh) that mounts the host's
/ read-only over 9p with a tmpfs overlay and runs guest_init.sh from this
directory. guest_init.sh brings up eth0 and rxe0, writes `ready` into the
guest's writable 9p share (<run dir>/g<i>/, /nrlab inside the guest) and
serves requests: the host writes req/<id>.sh, the guest runs it with bash and
writes res/<id>.out/.err/.rc. Host binaries (perftest, build/ outputs) run
unchanged in the guest: same root filesystem, same libc and rdma-core.

Two racks (Lab(racks=[2, 2]), scenario_multirack.py)
----------------------------------------------------
One L2 network of three switches: a switch per rack (brA, brB) and a spine
switch (brS, HOST_IP), joined by the leaf-spine links upA-upAs and upB-upBs
(veth pairs, the only way between racks), and three boxes, each on two
veths: leafA (lAa, lAb), leafB (lBa, lBb), spine (sSa, sSb).

        g0   g1                           g2   g3
         |    |                            |    |
        tap0 tap1                         tap2 tap3   (their RoCE redirected
         |    |                            |    |      into the leaf's port a)
    +----+----+----+                  +----+----+----+
    | brA (rack A) |                  | brB (rack B) |
    +--+--------+--+                  +--+--------+--+
       |        | swAb                   |        | swBb
       |   lAb [leafA] lAa--swAa         |   lBb [leafB] lBa--swBa
      upA                               upB
       |     (leaf-spine links)          |
      upAs                              upBs
    +--+---------------------------------+--+
    | brS (spine switch, HOST_IP)           |
    +--------+----------------+-------------+
             | swSa           | swSb
         sSa [     spine      ] sSb

  - each guest's tap steers its RoCE (UDP 4791) into its leaf's port a
    (swAa/swBa: no bridge port); the leaf releases it out of port b, a port
    of the rack's switch (learning and flooding off, as swb above), and the
    switches deliver it by MAC: to a guest of the rack, or over the
    leaf-spine links to the other rack. The spine box sees no worker frame.
  - box-to-box frames (UDP 4792) are switched by their destination MAC, with
    static entries for the boxes' B2B MACs: a leaf's partial leaves its port
    b, crosses its leaf-spine link and reaches the spine's port a; the
    spine's result for leafA leaves its port a (for leafB port b) and
    reaches the leaf's port b. So every frame between racks, RoCE or
    box-to-box, crosses upA/upB, where captures count it per link.
  - Lab.link_loss(rack, percent) drops frames on a leaf-spine link in both
    directions (nftables netdev ingress on both ends: the host kernel may
    lack sch_netem, and tc's gact has no probability here).

virtio-net offloads are off (csum, gso, tso, ufo, ecn) because frames cross a
packet-socket relay (the box) that does not complete checksums.

The host kernel may lack sch_netem: loss is injected inside a guest, on its
eth0 egress (Guest.netem), which covers every frame the guest sends (RoCE data,
ACKs and TCP).

Requirements (failures say which is missing; nothing is ever skipped):
qemu-system-x86_64, a /boot/vmlinuz-* with rdma_rxe.ko under /lib/modules,
busybox (static), cpio, ip/tc/bridge (iproute2), tcpdump for captures, nft
(nftables) for Lab.link_loss, root.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from lab_box import Box, Capture
from lab_boot import prepare_boot
from lab_common import HOST_IP, ROCE_PORT, ROOT, LabError, log, run
from lab_guest import Guest

# The two-rack lab's boxes: name -> (port A, port B) interfaces, and their
# box-to-box addresses (ip, mac) that the scenario's fabric config names.
RACK_BOXES = {"leafA": ("lAa", "lAb"), "leafB": ("lBa", "lBb"), "spine": ("sSa", "sSb")}
B2B = {"leafA": ("10.78.0.1", "02:00:00:78:00:01"), "leafB": ("10.78.0.2", "02:00:00:78:00:02"),
       "spine": ("10.78.0.9", "02:00:00:78:00:09")}


# ----------------------------------------------------------------------------
# The lab


class Lab:
    """with Lab(guests=2, dataplane=...) as lab: lab.guests[0].run([...]);
    lab.box.stats(); ...  Everything is torn down on exit."""

    def __init__(self, guests=2, dataplane=None, workdir=None, mem_mb=512, mtu=1500, box_mode="aggregate",
                 rings=None, boot_timeout=240, start_box=True, box_extra=None,
                 box_nice=int(os.environ.get("NRLAB_BOX_NICE", "0")), racks=None):
        """racks: None (one box, `guests` guests) or the guest counts of two
        racks, e.g. [2, 2]: a leaf box per rack and a spine (see "Two racks"
        at the top); `guests` is then their sum."""
        if racks is not None:
            if len(racks) != 2 or min(racks) < 1:
                raise LabError("the two-rack lab takes two racks of 1.. guests, not %r" % (racks,))
            guests = sum(racks)
        if not 1 <= guests <= 4:
            raise LabError("the lab runs 1..4 guests, not %d" % guests)
        self.racks = racks
        if os.geteuid() != 0:
            raise LabError("the lab needs root (network namespaces, taps)")
        self.n, self.mem_mb, self.mtu = guests, mem_mb, mtu
        self.workdir = os.path.abspath(workdir or os.path.join(ROOT, "build", "tests", "system", "lab"))
        self.dataplane = dataplane or os.path.join(ROOT, "build", "src", "dataplane", "netreduce-dataplane")
        self.box_mode, self.rings, self.boot_timeout, self.start_box = box_mode, rings, boot_timeout, start_box
        self.box_extra = box_extra  # merged into the box's YAML (Box.start's extra)
        self.box_nice = box_nice
        self.ns = "nrlab-%d" % os.getpid()
        self.run_dir = os.path.join(self.workdir, "run-%d" % os.getpid())
        self.guests, self.box, self.boxes, self._old_handlers, self._ns_made = [], None, {}, {}, False
        self._spawned = []

    # -- setup
    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _on_signal(self, sig, frame):
        raise SystemExit("nrlab: interrupted by signal %d, tearing down" % sig)

    def sh(self, *cmd, **kw):
        """A command inside the lab namespace."""
        return run(["ip", "netns", "exec", self.ns] + list(cmd), **kw)

    def start(self):
        t0 = time.monotonic()
        cleanup_stale()
        prune_runs(self.workdir)
        ver, vmlinux, initrd = prepare_boot(os.path.join(self.workdir, "cache"))
        self._boot_files = (vmlinux, initrd)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        os.makedirs(self.run_dir)
        self.kernel = ver
        self.guests = [Guest(self, i) for i in range(self.n)]
        if self.racks:
            for g in self.guests:
                g.rack = 0 if g.index < self.racks[0] else 1
            self._make_racks()
            self.boxes = {name: Box(self, self.dataplane, self.box_nice, name, ifaces)
                          for name, ifaces in RACK_BOXES.items()}
        else:
            self._make_network()
            self.boxes = {"box": Box(self, self.dataplane, self.box_nice)}
        self.box = next(iter(self.boxes.values()))
        for g in self.guests:
            g.boot(vmlinux, initrd)
        log("booting %d guest(s) (kernel %s), namespace %s, files in %s" % (self.n, ver, self.ns, self.run_dir))
        deadline = time.monotonic() + self.boot_timeout
        for g in self.guests:
            g.wait_ready(deadline)
            log("%s ready in %.1fs: %s gid index %s" % (g.name, g.ready_seconds, g.ip, g.gid_index))
        # After the boots: its polling worker would take a core from them.
        if self.start_box:
            for b in self.boxes.values():
                b.start(self.box_mode, self.rings, extra=self.box_extra)
        self.setup_seconds = time.monotonic() - t0

    def reboot(self, guests):
        """Boots `guests` again on a fresh kernel (same address, MAC and tap)
        after a fault of a guest's kernel; their old files move to
        <dir>.<n>. Returns when all are ready."""
        for g in guests:
            g.shutdown()
            n = 1
            while os.path.exists("%s.%d" % (g.dir, n)):
                n += 1
            os.rename(g.dir, "%s.%d" % (g.dir, n))
            g._next = 0
            g.jobs = []
            g.boot(*self._boot_files)
        deadline = time.monotonic() + self.boot_timeout
        for g in guests:
            g.wait_ready(deadline)
            log("%s booted again, ready in %.1fs: gid index %s" % (g.name, g.ready_seconds, g.gid_index))

    def _new_namespace(self):
        """The lab's namespace (IPv6 off, lo up); returns an `ip -n ns` runner."""
        run(["ip", "netns", "add", self.ns])
        self._ns_made = True
        self.sh("sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", check=False)
        self.sh("sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1", check=False)
        ip = lambda *a: run(["ip", "-n", self.ns] + list(a))
        ip("link", "set", "lo", "up")
        return ip

    def _add_tap(self, ip, tap, bridge, steer_to):
        """A guest's tap on `bridge`, its RoCE (UDP 4791) redirected into `steer_to`."""
        ip("tuntap", "add", "dev", tap, "mode", "tap")
        ip("link", "set", tap, "mtu", str(self.mtu), "master", bridge)
        run(["tc", "-n", self.ns, "qdisc", "add", "dev", tap, "clsact"])
        self._steer(tap, steer_to)

    def _steer(self, tap, steer_to):
        run(["tc", "-n", self.ns, "filter", "add", "dev", tap, "ingress", "protocol", "ip", "prio", "1", "u32",
             "match", "ip", "protocol", "17", "0xff", "match", "ip", "dport", str(ROCE_PORT), "0xffff",
             "action", "mirred", "egress", "redirect", "dev", steer_to])

    def bypass_relay(self, closed):
        """The one-box lab's bypass relay: closed, the guests' RoCE no longer
        enters the box but goes straight over the bridge to its receiver, as
        a bypass NIC or a withdrawn steering rule does when the box's host
        dies; open, it is steered into the box (port A) again."""
        if self.racks:
            raise LabError("bypass_relay: the one-box lab only")
        for i in range(self.n):
            tap = "tap%d" % i
            if closed:
                run(["tc", "-n", self.ns, "filter", "del", "dev", tap, "ingress", "prio", "1"])
            else:
                self._steer(tap, "swa")

    def _make_network(self):
        ns = self.ns
        ip = self._new_namespace()
        ip("link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0", "mcast_snooping", "0")
        ip("link", "add", "boxa", "mtu", str(self.mtu), "type", "veth", "peer", "name", "swa", "mtu", str(self.mtu))
        ip("link", "add", "boxb", "mtu", str(self.mtu), "type", "veth", "peer", "name", "swb", "mtu", str(self.mtu))
        ip("link", "set", "swb", "master", "br0")
        run(["bridge", "-n", ns, "link", "set", "dev", "swb", "learning", "off", "flood", "off",
             "mcast_flood", "off", "bcast_flood", "off", "mcast_router", "0"])
        for i in range(self.n):
            self._add_tap(ip, "tap%d" % i, "br0", "swa")
        for dev in ["br0", "boxa", "swa", "boxb", "swb"] + ["tap%d" % i for i in range(self.n)]:
            ip("link", "set", dev, "up")
        ip("addr", "add", HOST_IP + "/24", "dev", "br0")

    def _make_racks(self):
        """The two-rack network (see "Two racks" at the top)."""
        ns = self.ns
        ip = self._new_namespace()
        devs = []

        def veth(a, b, bridge=None, switch_port=False):
            ip("link", "add", a, "mtu", str(self.mtu), "type", "veth", "peer", "name", b, "mtu", str(self.mtu))
            devs.extend([a, b])
            if bridge:
                ip("link", "set", b, "master", bridge)
            if switch_port:  # a box's port on a switch: never learnt, never flooded to
                run(["bridge", "-n", ns, "link", "set", "dev", b, "learning", "off", "flood", "off",
                     "mcast_flood", "off", "bcast_flood", "off", "mcast_router", "0"])

        for br in ("brA", "brB", "brS"):
            ip("link", "add", br, "type", "bridge", "stp_state", "0", "forward_delay", "0", "mcast_snooping", "0")
            devs.append(br)
        for r in "AB":  # the leaf-spine links: up<r> in the rack's switch, up<r>s in the spine's
            veth("up%ss" % r, "up" + r, "br" + r)
            ip("link", "set", "up%ss" % r, "master", "brS")
            # each leaf: port a takes the rack's steered RoCE (no bridge port), port b on the rack switch
            veth("l%sa" % r, "sw%sa" % r)
            veth("l%sb" % r, "sw%sb" % r, "br" + r, switch_port=True)
        veth("sSa", "swSa", "brS", switch_port=True)
        veth("sSb", "swSb", "brS", switch_port=True)
        for g in self.guests:
            r = "AB"[g.rack]
            self._add_tap(ip, g.tap, "br" + r, "sw%sa" % r)
            devs.append(g.tap)
        # Box-to-box frames are switched by their destination MAC (static entries).
        mac = {name: m for name, (_, m) in B2B.items()}
        for br, entries in (("brA", [("spine", "upA"), ("leafA", "swAb")]),
                            ("brB", [("spine", "upB"), ("leafB", "swBb")]),
                            ("brS", [("spine", "swSa"), ("leafA", "upAs"), ("leafB", "upBs")])):
            for box, port in entries:
                run(["bridge", "-n", ns, "fdb", "add", mac[box], "dev", port, "master", "static"])
        for dev in devs:
            ip("link", "set", dev, "up")
        ip("addr", "add", HOST_IP + "/24", "dev", "brS")

    def link_loss(self, rack, percent):
        """Drops `percent` % of the frames crossing rack `rack`'s leaf-spine
        link (0 or 1), in both directions, everything (RoCE, box-to-box, TCP,
        ARP): nftables netdev ingress on both of its ends (the host kernel has
        no sch_netem). None removes it; returns the frames dropped so far
        {"up": n, "down": n}."""
        r = "AB"[rack]
        table = "nrloss_" + r
        dropped = {}
        listed = run(["ip", "netns", "exec", self.ns, "nft", "-j", "list", "table", "netdev", table], check=False)
        if listed.returncode != 0 and "No such file or directory" not in listed.stderr:
            raise LabError("nft list table netdev %s: %s" % (table, listed.stderr.strip()))
        if listed.returncode == 0:
            for item in json.loads(listed.stdout)["nftables"]:
                rule = item.get("rule")
                if rule:
                    for e in rule["expr"]:
                        if "counter" in e:
                            dropped[rule["chain"]] = e["counter"]["packets"]
            run(["ip", "netns", "exec", self.ns, "nft", "delete", "table", "netdev", table])
        if percent:
            per_mille = int(round(percent * 10))
            rules = "table netdev %s {\n" % table
            for chain, dev in (("up", "up%ss" % r), ("down", "up" + r)):
                rules += ("  chain %s {\n    type filter hook ingress device \"%s\" priority 0;\n"
                          "    numgen random mod 1000 < %d counter drop\n  }\n" % (chain, dev, per_mille))
            rules += "}\n"
            if shutil.which("nft") is None:
                raise LabError("nft not found (apt-get install nftables)")
            run(["ip", "netns", "exec", self.ns, "nft", "-f", "-"], input=rules)
        return dropped

    def spawn(self, cmd, name):
        """Starts a host-side program (e.g. netreduced) inside the lab
        namespace, where it reaches the guests at HOST_IP over br0 and the
        box's control socket at lab.box.socket. Output goes to
        <run dir>/<name>.out/.err; it is killed at teardown if still running.
        Returns the Popen."""
        out = open(os.path.join(self.run_dir, name + ".out"), "w")
        err = open(os.path.join(self.run_dir, name + ".err"), "w")
        p = subprocess.Popen(["ip", "netns", "exec", self.ns] + list(cmd), stdout=out, stderr=err,
                             stdin=subprocess.DEVNULL)
        self._spawned.append((p, out, err))
        return p

    def steering_hits(self):
        """Packets each tap's RoCE redirect rule has matched: {tap: n}."""
        hits = {}
        for i in range(self.n):
            out = run(["tc", "-n", self.ns, "-s", "filter", "show", "dev", "tap%d" % i, "ingress"]).stdout
            m = re.search(r"Sent \d+ bytes (\d+) pkt", out)
            hits["tap%d" % i] = int(m.group(1)) if m else 0
        return hits

    def capture(self, ifaces=("swa", "swb")):
        return Capture(self, ifaces)

    # -- teardown
    def close(self):
        for g in self.guests:
            try:
                g.shutdown()
            except Exception as e:  # keep tearing down
                print("nrlab: %s: %s" % (g.name, e), file=sys.stderr)
        for b in self.boxes.values():
            try:
                if b.running():
                    b.stop()
            except Exception as e:
                print("nrlab: %s: %s" % (b.name, e), file=sys.stderr)
                b.kill()
        for p, out, err in self._spawned:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
            out.close()
            err.close()
        self._spawned = []
        if self._ns_made:
            delete_namespace(self.ns)
            self._ns_made = False
        for sig, h in self._old_handlers.items():
            signal.signal(sig, h)
        self._old_handlers = {}


def delete_namespace(ns):
    """Kills what still runs in `ns` and deletes it (taps and veths go with it)."""
    pids = run(["ip", "netns", "pids", ns], check=False).stdout.split()
    for p in pids:
        try:
            os.kill(int(p), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    deadline = time.monotonic() + 10
    while run(["ip", "netns", "pids", ns], check=False).stdout.strip() and time.monotonic() < deadline:
        time.sleep(0.1)
    run(["ip", "netns", "del", ns], check=False)


def cleanup_stale():
    """Deletes lab namespaces whose creating process is gone (SIGKILLed runs)."""
    for line in run(["ip", "netns", "list"], check=False).stdout.splitlines():
        m = re.match(r"nrlab-(\d+)\b", line)
        if m and not os.path.exists("/proc/" + m.group(1)):
            log("removing stale namespace %s" % m.group(0))
            delete_namespace(m.group(0))


def prune_runs(workdir, keep=6):
    """Keeps the newest `keep` finished run directories (captures are large)."""
    if not os.path.isdir(workdir):
        return
    runs = []
    for d in os.listdir(workdir):
        m = re.fullmatch(r"run-(\d+)", d)
        if m and not os.path.exists("/proc/" + m.group(1)):
            runs.append(os.path.join(workdir, d))
    runs.sort(key=os.path.getmtime)
    for d in runs[:-keep] if len(runs) > keep else []:
        shutil.rmtree(d, ignore_errors=True)


# ----------------------------------------------------------------------------
# CLI


def main():
    ap = argparse.ArgumentParser(description="Soft-RoCE lab: boot guests behind the netreduce box and run commands",
                                 epilog="example: nrlab.py --guests 2 --exec 0 'ibv_devinfo -d rxe0' "
                                        "--exec 1 'ip -br addr'")
    ap.add_argument("--guests", type=int, default=2, help="number of guests, 1..4 (default 2)")
    ap.add_argument("--dataplane", help="netreduce-dataplane binary (default build/src/dataplane/...)")
    ap.add_argument("--workdir", help="where runs and the boot cache go (default build/tests/system/lab)")
    ap.add_argument("--racks", help="two racks behind a leaf box each and a spine, e.g. 2,2 guests (instead "
                    "of --guests)")
    ap.add_argument("--mode", default="aggregate", choices=["aggregate", "forward"], help="box mode")
    ap.add_argument("--no-box", action="store_true", help="do not start the box (RoCE then goes nowhere)")
    ap.add_argument("--exec", nargs=2, action="append", default=[], metavar=("GUEST", "COMMAND"),
                    help="run COMMAND (bash) in guest GUEST and print its output; repeatable, in order")
    ap.add_argument("--timeout", type=int, default=300, help="per command, seconds")
    ap.add_argument("--hold", type=int, default=0, metavar="S",
                    help="keep the lab up S seconds after the commands (inspect it with ip netns exec)")
    a = ap.parse_args()
    try:
        racks = [int(x) for x in a.racks.split(",")] if a.racks else None
        with Lab(guests=a.guests, dataplane=a.dataplane, workdir=a.workdir, box_mode=a.mode,
                 start_box=not a.no_box, racks=racks) as lab:
            log("lab up in %.1fs" % lab.setup_seconds)
            rc = 0
            for gi, cmd in a.exec:
                g = lab.guests[int(gi)]
                r = g.run(cmd, timeout=a.timeout)
                print("--- %s$ %s  (rc %d, %.1fs)\n%s%s" % (g.name, cmd, r.rc, r.seconds, r.out, r.err), flush=True)
                rc = rc or r.rc
            if a.hold:
                log("holding for %ds: namespace %s, files %s" % (a.hold, lab.ns, lab.run_dir))
                time.sleep(a.hold)
            for b in lab.boxes.values():
                if b.running():
                    print(b.name, json.dumps(b.stats()["reasons"]))
            return rc
    except LabError as e:
        print("nrlab: FAILED: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
