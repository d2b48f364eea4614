#!/usr/bin/env python3
"""The installed libnetreduce.so is the host library alone: it neither
contains nor links the box's engine or the in-process test transport
(LoopbackFabric), which live in libraries of their own for the tests and
allreduce-perf. Reads the library's symbol table with nm (binutils)."""
import subprocess
import sys

lib = sys.argv[1]
out = subprocess.run(["nm", "-C", lib], check=True, capture_output=True, text=True).stdout
names = [line.split(" ", 2)[-1] for line in out.splitlines() if line.strip()]
if not any("netreduce::" in n for n in names):
    sys.exit("%s: no netreduce symbols at all: not the host library?" % lib)
bad = sorted({n for n in names if "netreduce::engine::" in n or "LoopbackFabric" in n})
if bad:
    print("%s ships %d engine/test-transport symbols, e.g.:" % (lib, len(bad)))
    for n in bad[:10]:
        print("  " + n)
    sys.exit(1)
print("%s: %d symbols, none from the engine or the test transport" % (lib, len(names)))
