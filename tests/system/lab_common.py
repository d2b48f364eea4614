"""The Soft-RoCE lab's shared core, imported by every lab_*.py module,
nrlab.py and the scenarios: the lab's addresses and paths, the scenarios'
assertion (Failed, expect), the lab's own error (LabError), its log line
and its host command runner. How the lab works is in nrlab.py's docstring.
"""
import os
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ROCE_PORT = 4791
SUBNET = "10.77.0"
HOST_IP = SUBNET + ".254"  # br0's address in the namespace: host-side services (netreduced) listen here
QEMU = "qemu-system-x86_64"


class Failed(Exception):
    """A scenario's check did not hold (the scenario fails; the lab is fine)."""


def expect(cond, what):
    """Raise Failed(what) unless cond: the scenarios' one assertion."""
    if not cond:
        raise Failed(what)


class LabError(RuntimeError):
    """The lab could not do what was asked; the message says why."""


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
