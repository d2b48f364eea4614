#!/usr/bin/env python3
"""The README's run command on a fresh Debian 12 machine.

A newcomer clones the repository onto a machine with nothing but the base
system and types ./scripts/demo.sh. This test does the same in a minimal
Debian 12 tree made with debootstrap (--variant=minbase: no compiler, no
curl, no python3), so a package the demo needs but its install profile lacks
fails here, not on the newcomer's machine:

  1. the tree: debootstrap once, cached under --cache (default
     ~/.cache/netreduce/fresh); each run mounts an overlay over the cached
     tree, so the cache itself never changes;
  2. the source: `git archive HEAD` of this checkout (what a clone gives),
     unpacked at /root/netreduce inside the tree;
  3. inside a private mount and pid namespace (chroot, with /proc, /sys, /dev,
     a fresh /dev/shm and /tmp: what DPDK's --no-huge memif demo needs):
     exactly `./scripts/demo.sh`, which must exit 0 and report a non-zero
     count of verified frames with none wrong or missing;
  4. then `./scripts/install-deps.sh test` in the same tree, and there a
     configure of the whole tree with its tests (every library and program
     meson looks for) and an import of every Python module the tests and
     the package import (tests/fresh/imports.py): a test dependency missing
     from the apt list fails here.

Downloaded .deb files are shared with the host's apt cache
(/var/cache/apt/archives, bind-mounted): the same Debian packages, fetched
once. The demo's API port is a free one (NETREDUCE_DEMO_PORT). Needs root
(mount, chroot): without it the test fails with that reason. Each step's
output is kept as fresh-STEP.log in --workdir; the tree is removed.
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

DEFAULT_MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
READY = "netreduce-fresh: the tree is mounted"
# What the test profile's tree must then do: configure everything the suite
# builds, and import what the Python tests import.
TEST_DEPS_CHECK = ("./scripts/install-deps.sh test"
                   " && meson setup /tmp/fresh-build -Dtests=enabled -Ddpdk=enabled -Dman=enabled -Dmpi=enabled"
                   " && /usr/bin/python3 tests/fresh/imports.py .")


def log(msg):
    print(msg, flush=True)


def host_mirror():
    """The Debian mirror the host's apt uses (its first 'URIs:' or deb line)."""
    for path in ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"):
        try:
            text = open(path).read()
        except OSError:
            continue
        m = re.search(r"^URIs:\s*(\S+/debian)\s*$", text, re.M) or re.search(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)\s", text, re.M)
        if m:
            return m.group(1)
    return DEFAULT_MIRROR


def ensure_base(cache, mirror, timeout):
    """The cached minbase tree, made once (atomically: a half-made tree is never used)."""
    base = os.path.join(cache, SUITE + "-minbase")
    if os.path.exists(os.path.join(base, ".netreduce-complete")):
        log("base tree: %s (cached)" % base)
        return base
    os.makedirs(cache, exist_ok=True)
    for old in os.listdir(cache):  # left by a run that was killed
        if old.startswith(SUITE + "-minbase.partial."):
            shutil.rmtree(os.path.join(cache, old), ignore_errors=True)
    partial = tempfile.mkdtemp(prefix=SUITE + "-minbase.partial.", dir=cache)
    t0 = time.monotonic()
    cmd = ["debootstrap", "--variant=minbase", SUITE, partial, mirror]
    log("base tree: %s" % " ".join(cmd))
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        shutil.rmtree(partial, ignore_errors=True)
        sys.exit("FAIL: debootstrap did not finish in %d s (mirror %s)" % (timeout, mirror))
    if p.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        sys.exit("FAIL: debootstrap exited %d:\n%s" % (p.returncode, p.stdout[-4000:]))
    open(os.path.join(partial, ".netreduce-complete"), "w").close()
    shutil.rmtree(base, ignore_errors=True)
    os.rename(partial, base)
    log("base tree: made in %.0f s" % (time.monotonic() - t0))
    return base


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def source_archive(source, dest):
    """HEAD of the checkout at SOURCE, as a clone would give it, into DEST."""
    # A checkout owned by another user is still this test's to read.
    git = ["git", "-c", "safe.directory=" + source, "-C", source]
    p = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("FAIL: git rev-parse HEAD in %s: %s (the test runs `git archive HEAD`)" % (source, p.stderr.strip()))
    dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    if dirty:
        log("note: the checkout has uncommitted changes; this test runs HEAD as committed")
    head = subprocess.run(git + ["log", "-1", "--format=%h %s"], capture_output=True, text=True).stdout.strip()
    os.makedirs(dest)
    archive = subprocess.Popen(git + ["archive", "--format=tar", "HEAD"], stdout=subprocess.PIPE)
    tar = subprocess.run(["tar", "-x", "-C", dest], stdin=archive.stdout)
    archive.stdout.close()
    if archive.wait() != 0 or tar.returncode != 0:
        sys.exit("FAIL: git archive HEAD | tar -x failed")
    log("source: git archive of %s" % head)


# Runs as root inside `unshare --mount --pid --fork`: every mount and every
# process it starts goes away with the namespace, whatever happens.
INSIDE = r"""
set -euo pipefail
base=$1 work=$2 step=$3; shift 3
root=$work/root
mount -t overlay overlay -o "lowerdir=$base,upperdir=$work/upper,workdir=$work/ovl" "$root" ||
  { echo "overlay mount failed: the kernel or this container does not allow it" >&2; exit 1; }
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
if [ -d /var/cache/apt/archives ]; then
  mount --bind /var/cache/apt/archives "$root/var/cache/apt/archives"
fi
echo "$READY"
exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@" \
  /bin/bash -c "cd /root/netreduce && $step"
"""


def run_inside(base, work, step, env, timeout, logfile):
    """Runs STEP (a shell command) in the tree's /root/netreduce; returns (rc, seconds, output)."""
    cmd = ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--propagation", "private",
           "/usr/bin/env", "READY=" + READY, "/bin/bash", "-c", INSIDE, "inside", base, work, step] + [
               "%s=%s" % kv for kv in env.items()]
    t0 = time.monotonic()
    with open(logfile, "w") as out:
        try:
            p = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = None
    took = time.monotonic() - t0
    return rc, took, open(logfile, errors="replace").read()


def tail(text, n=80):
    return "\n".join(text.splitlines()[-n:])


def step(base, work, name, command, env, timeout, logdir):
    """Runs COMMAND in the tree; exits with a FAIL line naming what went wrong. Returns (seconds, output)."""
    logfile = os.path.join(logdir, "fresh-%s.log" % name)
    rc, took, out = run_inside(base, work, command, env, timeout, logfile)
    if READY not in out:
        sys.exit("FAIL: the tree could not be mounted for `%s` (exit %s), so nothing ran in it:\n%s\n(log: %s)"
                 % (command, rc, tail(out), logfile))
    if rc is None:
        sys.exit("FAIL: `%s` did not finish in %d s on the fresh tree; its output:\n%s\n(log: %s)"
                 % (command, timeout, tail(out), logfile))
    if rc != 0:
        sys.exit("FAIL: `%s` exited %d on the fresh tree after %.0f s; its output:\n%s\n(log: %s)"
                 % (command, rc, took, tail(out), logfile))
    return took, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True, help="the repository checkout to test (HEAD is used)")
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/netreduce/fresh"),
                    help="where the debootstrap tree is kept between runs")
    ap.add_argument("--workdir", default=tempfile.gettempdir(), help="where the run's overlay and logs go")
    ap.add_argument("--mirror", default=None, help="Debian mirror for debootstrap (default: the host's)")
    # Within meson's 2700 s for the test: 600 + 1200 + 600.
    ap.add_argument("--debootstrap-timeout", type=int, default=600)
    ap.add_argument("--demo-timeout", type=int, default=1200)
    ap.add_argument("--deps-timeout", type=int, default=600)
    ap.add_argument("--skip-test-deps", action="store_true", help="run the demo only")
    args = ap.parse_args()
    # meson's timeout sends SIGTERM: leave through the finally below, which
    # removes the tree (the mounts and processes die with their namespace).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("FAIL: terminated (the test's time limit?)"))

    if os.geteuid() != 0:
        sys.exit("FAIL: needs root (debootstrap, mount, chroot); run the suite as root")
    for tool in ("debootstrap", "unshare", "chroot", "git", "tar"):
        if shutil.which(tool) is None:
            sys.exit("FAIL: %s not found (./scripts/install-deps.sh test installs it)" % tool)

    base = ensure_base(os.path.abspath(args.cache), args.mirror or host_mirror(), args.debootstrap_timeout)
    logdir = os.path.abspath(args.workdir)
    os.makedirs(logdir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="netreduce-fresh.", dir=logdir)
    try:
        for d in ("upper", "ovl", "root"):
            os.makedirs(os.path.join(work, d))
        # The source and resolv.conf go into the overlay's upper layer before
        # it is mounted; the cached tree stays as debootstrap left it.
        source_archive(os.path.abspath(args.source), os.path.join(work, "upper", "root", "netreduce"))
        os.makedirs(os.path.join(work, "upper", "etc"), exist_ok=True)
        shutil.copy("/etc/resolv.conf", os.path.join(work, "upper", "etc", "resolv.conf"))

        took, out = step(base, work, "demo", "./scripts/demo.sh", {"NETREDUCE_DEMO_PORT": str(free_port())},
                         args.demo_timeout, logdir)
        m = re.search(r"results verified: (\d+) aggregated frames byte-exact \(sum and ICRC\), (\d+) wrong, (\d+) missing", out)
        if not m:
            sys.exit("FAIL: ./scripts/demo.sh exited 0 but printed no 'results verified' line:\n%s" % tail(out))
        good, wrong, missing = map(int, m.groups())
        if good == 0 or wrong or missing:
            sys.exit("FAIL: the demo verified %d frames, %d wrong, %d missing:\n%s" % (good, wrong, missing, tail(out)))
        log("demo: ./scripts/demo.sh exit 0 in %.0f s on a fresh Debian 12 tree, %d frames verified, 0 wrong, 0 missing"
            % (took, good))
        for line in out.splitlines():
            if re.match(r"\s*(throughput|forward-only|box worker):", line):
                log("  " + line.strip())

        if not args.skip_test_deps:
            took, out = step(base, work, "test-deps", TEST_DEPS_CHECK, {}, args.deps_timeout, logdir)
            log("test profile: `%s` exit 0 in %.0f s on the same tree" % (TEST_DEPS_CHECK, took))
            log("  " + tail(out, 1).strip())
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
