#!/usr/bin/python3
"""MPI jobs across the Soft-RoCE lab's guests.

mpirun_argv(lab, hosts) is the mpirun command line up to the program: mpirun
runs in the lab's namespace, one rank per guest, Open MPI's own traffic is
TCP over the lab's switch, and its daemons start in the guests through this
file run as Open MPI's remote shell (--mca plm_rsh_agent). Where mpirun
would run `ssh HOST COMMAND`, the agent runs COMMAND (an orted) in the guest
whose address is HOST, through the guest's request directory
(guest_init.sh: req/<id>.sh in, res/<id>.{out,err,rc} back), and lives
until it ends, with its output and exit status:

  lab_mpi.py HOST COMMAND...

NRLAB_MPI_SHARES (set by mpirun_argv) maps guest addresses to their shares
on this machine: "10.77.0.1=/path/g0,10.77.0.2=/path/g1"."""
import os
import signal
import sys
import time

from lab_common import HOST_IP


def mpirun_argv(lab, guests=None):
    """mpirun in the lab's namespace, one rank per guest (all of them, or
    `guests`), up to the program; the caller adds -x settings and the
    program."""
    guests = guests or lab.guests
    # SHELL: Open MPI writes the orted's line for mpirun's shell; the guests run it with bash.
    return ["ip", "netns", "exec", lab.ns, "env", "SHELL=/bin/sh",
            "NRLAB_MPI_SHARES=" + ",".join("%s=%s" % (g.ip, g.dir) for g in guests),
            "mpirun", "--allow-run-as-root", "-np", str(len(guests)),
            "--host", ",".join("%s:1" % g.ip for g in guests),
            "--mca", "plm_rsh_agent", os.path.abspath(__file__),
            "--mca", "plm_rsh_no_tree_spawn", "1",
            "--mca", "oob_tcp_if_include", HOST_IP + "/24",
            "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", HOST_IP + "/24",
            "--mca", "pml", "ob1"]


def kill_job(share, jid):
    """Withdraws the request if the guest has not taken it yet, else asks
    the guest to SIGKILL the job's process group (res/<id>.pid)."""
    try:
        os.remove(os.path.join(share, "req", jid + ".sh"))
        return
    except OSError:
        pass  # taken: it runs, or is about to
    deadline = time.monotonic() + 5
    while not os.path.exists(os.path.join(share, "res", jid + ".pid")) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        with open(os.path.join(share, "res", jid + ".pid")) as f:
            pid = f.read().strip()
        tmp = os.path.join(share, "req", ".%s-kill.tmp" % jid)
        with open(tmp, "w") as f:
            f.write("kill -KILL -- -%s 2>/dev/null; true\n" % pid)
        os.rename(tmp, os.path.join(share, "req", jid + "-kill.sh"))
    except OSError:
        pass


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: lab_mpi.py HOST COMMAND...")
    host, command = sys.argv[1], sys.argv[2:]
    shares = dict(kv.split("=", 1) for kv in os.environ.get("NRLAB_MPI_SHARES", "").split(",") if kv)
    if host not in shares:
        sys.exit("lab_mpi: no guest at %r (NRLAB_MPI_SHARES: %s)" % (host, ", ".join(shares)))
    share = shares[host]
    jid = "mpi-%d-%d" % (os.getpid(), time.monotonic_ns() % 1000000)
    # ssh hands its arguments to the remote shell as one line: do the same.
    script = "cd /tmp\n%s\n" % " ".join(command)
    # Never an orphan polling forever: gone with mpirun (re-parented), with
    # the guest (its share stopped or removed), or at the deadline; then the
    # guest's job goes too.
    deadline = time.monotonic() + float(os.environ.get("NRLAB_MPI_DEADLINE", "900"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))
    parent = os.getppid()
    tmp = os.path.join(share, "req", ".%s.tmp" % jid)
    with open(tmp, "w") as f:
        f.write(script)
    os.rename(tmp, os.path.join(share, "req", jid + ".sh"))
    rc_path = os.path.join(share, "res", jid + ".rc")
    try:
        while not os.path.exists(rc_path):
            if (os.getppid() != parent or not os.path.isdir(share) or
                    os.path.exists(os.path.join(share, "stop")) or time.monotonic() > deadline):
                sys.exit("lab_mpi: gave up on %s in %s (mpirun gone, guest stopped, or the "
                         "deadline)" % (" ".join(command)[:80], host))
            time.sleep(0.2)
    except SystemExit:
        kill_job(share, jid)
        raise
    for name, stream in ((".out", sys.stdout), (".err", sys.stderr)):
        with open(os.path.join(share, "res", jid + name)) as f:
            stream.write(f.read())
    with open(rc_path) as f:
        sys.exit(int(f.read().strip() or "1"))


if __name__ == "__main__":
    main()
