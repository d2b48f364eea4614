"""The lab's guests and what runs in them: a Guest is one QEMU guest with
rdma_rxe whose agent (guest_init.sh) runs the commands the host drops into
its share; a Job is one such command, a Result its end. perftest pairs
between two guests, and the count of rdma_rxe's wedge warnings that
run_step (lab_report.py) retries on. Lab (nrlab.py) boots and wires them.
"""
import os
import shlex
import subprocess
import time

from lab_common import HERE, QEMU, SUBNET, LabError

VIRTIO_NET_OFFLOADS_OFF = ("csum=off,guest_csum=off,gso=off,host_tso4=off,host_tso6=off,host_ecn=off,"
                           "host_ufo=off,guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off")


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
