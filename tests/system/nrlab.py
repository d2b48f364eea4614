#!/usr/bin/python3
"""The Soft-RoCE lab: real RoCEv2 endpoints (Linux rdma_rxe in QEMU guests)
talking through the real netreduce-dataplane, wired the way the box is
deployed. Scenarios are short scripts over this module:
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
import gzip
import hashlib
import json
import lzma
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ROCE_PORT = 4791
SUBNET = "10.77.0"
HOST_IP = SUBNET + ".254"  # br0's address in the namespace: host-side services (netreduced) listen here
# The two-rack lab's boxes: name -> (port A, port B) interfaces, and their
# box-to-box addresses (ip, mac) that the scenario's fabric config names.
RACK_BOXES = {"leafA": ("lAa", "lAb"), "leafB": ("lBa", "lBb"), "spine": ("sSa", "sSb")}
B2B = {"leafA": ("10.78.0.1", "02:00:00:78:00:01"), "leafB": ("10.78.0.2", "02:00:00:78:00:02"),
       "spine": ("10.78.0.9", "02:00:00:78:00:09")}
GUEST_MODULES = ["virtio_pci", "virtio_net", "9pnet_virtio", "9p", "overlay"]
QEMU = "qemu-system-x86_64"
VIRTIO_NET_OFFLOADS_OFF = ("csum=off,guest_csum=off,gso=off,host_tso4=off,host_tso6=off,host_ecn=off,"
                           "host_ufo=off,guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off")


class Failed(Exception):
    """A scenario's check did not hold (the scenario fails; the lab is fine)."""


def expect(cond, what):
    """Raise Failed(what) unless cond: the scenarios' one assertion."""
    if not cond:
        raise Failed(what)


class LabError(RuntimeError):
    """The lab could not do what was asked; the message says why."""


class FanoutClash(LabError):
    """A box refused by DPDK's af_packet fanout group id (Box.start)."""


def log(msg):
    print("[nrlab %6.1fs] %s" % (time.monotonic() - _T0, msg), flush=True)


_T0 = time.monotonic()


def run(cmd, timeout=60, check=True, **kw):
    """Runs a host command with a deadline; a failure raises LabError with its stderr."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        raise LabError("timed out after %ss: %s" % (timeout, " ".join(cmd)))
    except FileNotFoundError:
        raise LabError("command not found: %s" % cmd[0])
    if check and p.returncode != 0:
        raise LabError("%s failed (%d): %s" % (" ".join(cmd), p.returncode, (p.stderr or p.stdout).strip()))
    return p


# ----------------------------------------------------------------------------
# Guest kernel and initramfs


def find_guest_kernel():
    """(version, vmlinuz path, modules dir) of the newest installed kernel that
    ships rdma_rxe; LabError naming the package otherwise."""
    found = []
    for name in os.listdir("/boot") if os.path.isdir("/boot") else []:
        if not name.startswith("vmlinuz-"):
            continue
        ver = name[len("vmlinuz-"):]
        mod = "/lib/modules/" + ver
        rxe = os.path.join(mod, "kernel/drivers/infiniband/sw/rxe")
        if os.path.isdir(rxe) and any(f.startswith("rdma_rxe.ko") for f in os.listdir(rxe)):
            found.append((ver, "/boot/" + name, mod))
    if not found:
        raise LabError("no guest kernel: need /boot/vmlinuz-<v> with /lib/modules/<v>/.../rdma_rxe.ko "
                       "(apt-get install linux-image-amd64; scripts/install-deps.sh does it)")
    return sorted(found, key=lambda f: [int(x) if x.isdigit() else x for x in re.split(r"[.-]", f[0])])[-1]


def extract_vmlinux(vmlinuz, out):
    """The uncompressed ELF inside a bzImage (QEMU boots it through its PVH
    note, ~3 s faster than the bzImage under TCG)."""
    data = open(vmlinuz, "rb").read()
    decoders = [(b"\xfd7zXZ\x00", lambda: lzma.LZMADecompressor(lzma.FORMAT_XZ)),
                (b"\x1f\x8b\x08", lambda: __import__("zlib").decompressobj(31))]
    for magic, make in decoders:
        off = data.find(magic)
        while off >= 0:
            try:
                elf = make().decompress(data[off:])
            except Exception:
                elf = b""
            if elf[:4] == b"\x7fELF":
                tmp = out + ".tmp"
                with open(tmp, "wb") as f:
                    f.write(elf)
                os.replace(tmp, out)
                return
            off = data.find(magic, off + 1)
    raise LabError("%s: no xz or gzip compressed ELF kernel found inside" % vmlinuz)


def module_closure(moddir, names):
    """Module files for `names` and their dependencies, dependencies first
    (from modules.dep). Built-in modules (modules.builtin) need no file."""
    deps, by_name = {}, {}
    with open(os.path.join(moddir, "modules.dep")) as f:
        for line in f:
            path, _, rest = line.partition(":")
            deps[path] = rest.split()
            by_name[os.path.basename(path).split(".ko")[0].replace("-", "_")] = path
    builtin = set()
    if os.path.exists(os.path.join(moddir, "modules.builtin")):
        with open(os.path.join(moddir, "modules.builtin")) as f:
            builtin = {os.path.basename(l.strip()).split(".ko")[0].replace("-", "_") for l in f}
    order, seen = [], set()

    def visit(path):
        if path in seen:
            return
        seen.add(path)
        for d in deps.get(path, []):
            visit(d)
        order.append(path)

    for n in names:
        n = n.replace("-", "_")
        if n in builtin:
            continue
        if n not in by_name:
            raise LabError("module %s not found in %s/modules.dep" % (n, moddir))
        visit(by_name[n])
    return order


def build_initramfs(moddir, out):
    stage = out + ".d"
    shutil.rmtree(stage, ignore_errors=True)
    for d in ("bin", "dev", "proc", "sys", "modules"):
        os.makedirs(os.path.join(stage, d))
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not os.path.exists(busybox):
        raise LabError("busybox not found (apt-get install busybox-static)")
    shutil.copy(busybox, os.path.join(stage, "bin/busybox"))
    shutil.copy(os.path.join(HERE, "initramfs_init.sh"), os.path.join(stage, "init"))
    os.chmod(os.path.join(stage, "init"), 0o755)
    os.mknod(os.path.join(stage, "dev/console"), 0o600 | 0o020000, os.makedev(5, 1))
    names = []
    for rel in module_closure(moddir, GUEST_MODULES):
        src = os.path.join(moddir, rel)
        base = os.path.basename(rel)
        if base.endswith(".xz"):
            data, base = lzma.open(src).read(), base[:-3]
        elif base.endswith(".zst"):
            raise LabError("zstd-compressed modules are not supported (%s)" % src)
        else:
            data = open(src, "rb").read()
        with open(os.path.join(stage, "modules", base), "wb") as f:
            f.write(data)
        names.append(base)
    with open(os.path.join(stage, "modules.order"), "w") as f:
        f.write("\n".join(names) + "\n")
    files = run(["find", "."], cwd=stage).stdout
    if shutil.which("cpio") is None:
        raise LabError("cpio not found (apt-get install cpio)")
    archive = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], input=files.encode(), cwd=stage,
                             capture_output=True, timeout=60, check=True).stdout
    tmp = out + ".tmp"
    with gzip.open(tmp, "wb", compresslevel=1) as f:
        f.write(archive)
    os.replace(tmp, out)
    shutil.rmtree(stage, ignore_errors=True)


def prepare_boot(cache_dir):
    """(kernel version, vmlinux ELF, initramfs), built once per kernel and
    initramfs script into cache_dir."""
    if shutil.which(QEMU) is None:
        raise LabError("%s not found (apt-get install --no-install-recommends qemu-system-x86)" % QEMU)
    ver, vmlinuz, moddir = find_guest_kernel()
    os.makedirs(cache_dir, exist_ok=True)
    vmlinux = os.path.join(cache_dir, "vmlinux-" + ver)
    if not os.path.exists(vmlinux) or os.path.getmtime(vmlinux) < os.path.getmtime(vmlinuz):
        log("extracting the ELF kernel from %s" % vmlinuz)
        extract_vmlinux(vmlinuz, vmlinux)
    h = hashlib.sha256(open(os.path.join(HERE, "initramfs_init.sh"), "rb").read())
    h.update(repr(GUEST_MODULES).encode())
    initrd = os.path.join(cache_dir, "initramfs-%s-%s.cpio.gz" % (ver, h.hexdigest()[:12]))
    if not os.path.exists(initrd):
        log("building the guest initramfs for %s" % ver)
        build_initramfs(moddir, initrd)
    return ver, vmlinux, initrd


# ----------------------------------------------------------------------------
# Guests


class Result:
    """A finished guest command."""

    def __init__(self, rc, out, err, seconds):
        self.rc, self.out, self.err, self.seconds = rc, out, err, seconds

    def __repr__(self):
        return "Result(rc=%d, %.1fs, out=%r, err=%r)" % (self.rc, self.seconds, self.out[-300:], self.err[-300:])


class Job:
    """A command running in a guest (Guest.spawn)."""

    def __init__(self, guest, jid, what):
        self.guest, self.id, self.what, self.t0 = guest, jid, what, time.monotonic()

    def _res(self, ext):
        return os.path.join(self.guest.dir, "res", "%s.%s" % (self.id, ext))

    def done(self):
        return os.path.exists(self._res("rc"))

    def output(self):
        """(stdout, stderr) so far."""
        def rd(p):
            try:
                with open(p, errors="replace") as f:
                    return f.read()
            except FileNotFoundError:
                return ""
        return rd(self._res("out")), rd(self._res("err"))

    def kill(self, sig="TERM"):
        """Signals the command's whole process group in the guest (no effect
        once it has ended)."""
        deadline = time.monotonic() + 30
        while not os.path.exists(self._res("pid")):
            if self.done() or time.monotonic() > deadline:
                return
            time.sleep(0.1)
        pid = open(self._res("pid")).read().strip()
        self.guest.run("kill -%s -- -%s 2>/dev/null; true" % (sig, pid), timeout=60)

    def wait(self, timeout):
        """The Result; LabError (with the output so far) if it is not done
        within `timeout` seconds or the guest died."""
        deadline = time.monotonic() + timeout
        while not self.done():
            self.guest.check_alive()
            if time.monotonic() > deadline:
                out, err = self.output()
                raise LabError("%s: `%s` still running after %ss\n--- stdout\n%s\n--- stderr\n%s" %
                               (self.guest.name, self.what, timeout, out[-2000:], err[-2000:]))
            time.sleep(0.1)
        with open(self._res("rc")) as f:
            rc = int(f.read().strip() or "255")
        out, err = self.output()
        return Result(rc, out, err, time.monotonic() - self.t0)


class Guest:
    """One QEMU guest: `name` g<i>, `ip`, `mac`, `tap` (in the lab namespace),
    `dir` (its writable share, /nrlab inside), `info` (its ready file:
    gid_index, gid, kernel, uptime)."""

    def __init__(self, lab, index):
        self.lab, self.index = lab, index
        self.name = "g%d" % index
        self.ip = "%s.%d" % (SUBNET, index + 1)
        self.mac = "52:54:00:77:00:%02x" % (index + 1)
        self.tap = "tap%d" % index
        self.dir = os.path.join(lab.run_dir, self.name)
        self.console_path = os.path.join(self.dir, "console.log")
        self.proc = None
        self.info = {}
        self._next = 0
        self.jobs = []  # every Job spawned since the last boot

    # -- lifecycle (Lab calls these)
    def boot(self, vmlinux, initrd):
        os.makedirs(self.dir)
        append = ("console=ttyS0 panic=-1 quiet loglevel=4 mitigations=off 8250.nr_uarts=1 "
                  "nrlab.init=%s nrlab.name=%s nrlab.ip=%s/24 nrlab.mtu=%d" %
                  (os.path.join(HERE, "guest_init.sh"), self.name, self.ip, self.lab.mtu))
        cmd = ["ip", "netns", "exec", self.lab.ns, QEMU,
               "-name", self.name, "-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none",
               "-no-reboot", "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "1", "-m", str(self.lab.mem_mb),
               "-kernel", vmlinux, "-initrd", initrd, "-append", append,
               "-serial", "file:" + self.console_path,
               "-fsdev", "local,id=hostroot,path=/,readonly=on,security_model=none,multidevs=remap",
               "-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
               "-fsdev", "local,id=nrlab,path=%s,security_model=none" % self.dir,
               "-device", "virtio-9p-pci,fsdev=nrlab,mount_tag=nrlab",
               "-netdev", "tap,id=net0,ifname=%s,script=no,downscript=no,vhost=off" % self.tap,
               "-device", "virtio-net-pci,netdev=net0,mac=%s,romfile=,%s" % (self.mac, VIRTIO_NET_OFFLOADS_OFF)]
        self.qemu_log = open(os.path.join(self.dir, "qemu.log"), "w")
        self.proc = subprocess.Popen(cmd, stdout=self.qemu_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.t_boot = time.monotonic()

    def console(self):
        try:
            with open(self.console_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def check_alive(self):
        if self.proc is None or self.proc.poll() is not None:
            with open(os.path.join(self.dir, "qemu.log"), errors="replace") as f:
                qlog = f.read()
            failed = ""
            if os.path.exists(os.path.join(self.dir, "failed")):
                failed = open(os.path.join(self.dir, "failed")).read().strip()
            raise LabError("%s: QEMU exited (%s). %s\n--- qemu\n%s\n--- console (tail)\n%s" %
                           (self.name, self.proc and self.proc.returncode, failed, qlog[-2000:],
                            self.console()[-3000:]))

    def wait_ready(self, deadline):
        ready = os.path.join(self.dir, "ready")
        while not os.path.exists(ready):
            self.check_alive()
            if os.path.exists(os.path.join(self.dir, "failed")):
                raise LabError("%s failed to come up: %s\n--- console (tail)\n%s" %
                               (self.name, open(os.path.join(self.dir, "failed")).read().strip(),
                                self.console()[-3000:]))
            if "nrlab-init: FAILED" in self.console():
                raise LabError("%s initramfs failed:\n%s" % (self.name, self.console()[-3000:]))
            if time.monotonic() > deadline:
                raise LabError("%s not ready after %.0fs\n--- console (tail)\n%s" %
                               (self.name, time.monotonic() - self.t_boot, self.console()[-3000:]))
            time.sleep(0.1)
        with open(ready) as f:
            self.info = dict(l.strip().split("=", 1) for l in f if "=" in l)
        self.ready_seconds = time.monotonic() - self.t_boot
        self.gid_index = int(self.info["gid_index"])

    def shutdown(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.qemu_log.close()

    # -- the interface scenarios use
    def spawn(self, argv, env=None, cwd="/tmp"):
        """Starts `argv` (a list, or a string run by bash) in the guest and
        returns a Job. `env` adds environment variables. The job's working
        directory is /tmp in the guest (tmpfs); /nrlab is this guest's share
        (host: self.dir), the rest of the host filesystem is read-only."""
        script = argv if isinstance(argv, str) else " ".join(shlex.quote(str(a)) for a in argv)
        lines = ["cd %s" % shlex.quote(cwd)]
        for k, v in (env or {}).items():
            lines.append("export %s=%s" % (k, shlex.quote(str(v))))
        lines.append(script)
        self._next += 1
        jid = "%04d" % self._next
        tmp = os.path.join(self.dir, "req", ".%s.tmp" % jid)
        with open(tmp, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.rename(tmp, os.path.join(self.dir, "req", jid + ".sh"))
        job = Job(self, jid, script)
        self.jobs.append(job)
        return job

    def end_jobs(self, timeout=60):
        """SIGKILLs every job still running and waits until each has ended
        (its process exited, so the kernel has destroyed its QPs)."""
        running = [j for j in self.jobs if not j.done()]
        for j in running:
            j.kill("KILL")
        deadline = time.monotonic() + timeout
        for j in running:
            while not j.done() and time.monotonic() < deadline:
                self.check_alive()
                time.sleep(0.1)

    def rxe_state(self):
        """One line for a failure report: rxe0's non-zero counters and the
        kernel's last rxe messages."""
        r = self.run("cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep -H . * | grep -v ':0$' | "
                     "tr '\\n' ' '; echo; dmesg | grep -i rxe | tail -3", timeout=60)
        return "%s: %s" % (self.name, " | ".join(l for l in r.out.splitlines() if l.strip()))

    def run(self, argv, timeout=120, env=None, check=False):
        """Runs `argv` in the guest to completion: Result(rc, out, err, seconds).
        check=True raises LabError when rc != 0."""
        r = self.spawn(argv, env).wait(timeout)
        if check and r.rc != 0:
            raise LabError("%s: `%s` exited %d\n--- stdout\n%s\n--- stderr\n%s" %
                           (self.name, argv, r.rc, r.out[-2000:], r.err[-2000:]))
        return r

    def wait_listening(self, port, timeout=60):
        """Waits until a TCP socket listens on `port` in the guest (a perftest
        server before its client starts)."""
        r = self.run("for i in $(seq %d); do ss -Hltn 'sport = :%d' | grep -q . && exit 0; sleep 0.2; done; exit 1"
                     % (timeout * 5, port), timeout=timeout + 30)
        if r.rc != 0:
            raise LabError("%s: nothing listens on TCP port %d after %ss" % (self.name, port, timeout))

    def netem(self, spec=None):
        """Impairs everything this guest sends (netem on its eth0 egress,
        inside the guest): e.g. "loss 2%", "loss 1% duplicate 1% delay 1ms
        reorder 10%". None removes it."""
        if spec is None:
            self.run("tc qdisc del dev eth0 root 2>/dev/null; true", timeout=60, check=True)
        else:
            self.run("tc qdisc replace dev eth0 root netem %s" % spec, timeout=60, check=True)

    def link_stats(self):
        """eth0's kernel counters in the guest: {tx_bytes, rx_bytes,
        tx_packets, rx_packets, ...} (everything the guest sent/received,
        RoCE and TCP)."""
        r = self.run("cd /sys/class/net/eth0/statistics && grep -H . *", timeout=60, check=True)
        return {k: int(v) for k, _, v in (l.partition(":") for l in r.out.splitlines()) if v.strip().isdigit()}

    def rxe_counters(self):
        """rdma_rxe's hw_counters of rxe0 (sent_pkts, rcvd_pkts, rcvd_seq_err,
        duplicate_request, out_of_seq_request, retry_exceeded_err, ...)."""
        r = self.run("cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep -H . *", timeout=60, check=True)
        out = {}
        for line in r.out.splitlines():
            k, _, v = line.partition(":")
            if v.strip().lstrip("-").isdigit():
                out[k] = int(v)
        return out


def perftest_spawn(server, client, tool, args, port):
    """Starts one perftest pair (`tool` -F on rxe0, server in `server`, client
    in `client`, `args` added to both, TCP `port`): (server Job, client Job)."""
    common = [tool, "-F", "-d", "rxe0", "-p", str(port)] + list(args)
    srv = server.spawn(common + ["-x", str(server.gid_index)])
    server.wait_listening(port)
    return srv, client.spawn(common + ["-x", str(client.gid_index), server.ip])


def perftest(server, client, tool, args, port, attempt_timeout=120, attempts=2, on_hang=None):
    """One perftest pair (`tool` -F on rxe0, server in `server`, client in
    `client`, `args` added to both): (client Result, server Result), not
    checked. rdma_rxe now and then leaves a transfer hanging for good (perftest
    asks retry_cnt 7, which rxe treats as "retry forever"; seen in about one
    clean CI run in three, with and without netem loss, with and without a
    ring in the box: no output, no error). Such transfers normally take
    seconds, so an attempt still running after `attempt_timeout` seconds is
    killed and the pair tried again on fresh QPs (the next TCP port);
    `on_hang(text)` hears what hung and both guests' rxe counters at that
    moment. The last attempt's hang raises LabError."""
    for attempt in range(1, attempts + 1):
        srv, cli = perftest_spawn(server, client, tool, args, port + attempt - 1)
        try:
            return cli.wait(attempt_timeout), srv.wait(60)
        except LabError as e:
            seen = {g.name: {k: v for k, v in g.rxe_counters().items() if v} for g in (client, server)}
            cli.kill("KILL")
            srv.kill("KILL")
            if attempt == attempts:
                raise LabError("%s (attempt %d of %d; rxe counters %s)" % (e, attempt, attempts, seen))
            if on_hang:
                on_hang("%s %s -> %s hung in rxe after %ss (attempt %d of %d; rxe counters %s); tried again" %
                        (tool, client.name, server.name, attempt_timeout, attempt, attempts, seen))


RXE_WEDGED = "at drivers/infiniband/sw/rxe/rxe_pool.c"  # the kernel's WARNING in __rxe_cleanup


def rxe_wedge_warnings(lab):
    """Per guest, how often its kernel has warned that rdma_rxe could not
    release an object (a WARNING in rxe_pool.c's __rxe_cleanup when a
    process's QPs are destroyed): the signature of the guest kernel's rxe
    wedging. Seen with Debian 12's 6.1 kernel about once in five lab runs:
    the guest stops sending anything on one QP (no ACK, no retransmission)
    while its peers retransmit to it, with a clean path (captures show no
    loss before it); the job then fails at its deadline or retry limit."""
    return [int(g.run("dmesg | grep -c '%s' || true" % RXE_WEDGED, timeout=60).out.strip() or 0)
            for g in lab.guests]


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


# ----------------------------------------------------------------------------
# The box


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
# Reports


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


# ----------------------------------------------------------------------------
# Scenario arguments

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
