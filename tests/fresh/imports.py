#!/usr/bin/env python3
"""Every Python module the repository's scripts import can be imported.

  imports.py SOURCE_DIR

Reads every .py file (and the Python scripts without a suffix) under
tests/, python/, tools/ and bench/, collects the modules they import
(`import a.b`, `from a.b import c`; not relative imports, not the
repository's own modules, not imports guarded by `except ImportError`) and
imports each with this interpreter. The fresh-machine test runs it in a
tree that has only the test profile of scripts/install-deps.sh installed:
a module missing there is a package missing from that profile.

Example: tests/wire/... imports scapy.all, tests/python/... imports torch;
on a tree without python3-scapy this prints
  missing: scapy.all (imported by tests/tools/roce_golden.py, ...)
and exits 1.
"""
import ast
import importlib
import os
import sys

DIRS = ("tests", "python", "tools", "bench")


def python_files(root):
    for top in DIRS:
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                path = os.path.join(d, f)
                if f.endswith(".py"):
                    yield path
                elif "." not in f:
                    with open(path, "rb") as fh:
                        first = fh.readline()
                    if first.startswith(b"#!") and b"python" in first:
                        yield path


def guarded(node, parents):
    """True when NODE sits in a try whose handlers catch ImportError."""
    for p in parents:
        if isinstance(p, ast.Try):
            for h in p.handlers:
                names = []
                if isinstance(h.type, ast.Name):
                    names = [h.type.id]
                elif isinstance(h.type, ast.Tuple):
                    names = [e.id for e in h.type.elts if isinstance(e, ast.Name)]
                if h.type is None or {"ImportError", "ModuleNotFoundError", "Exception"} & set(names):
                    return True
    return False


def imports(path):
    tree = ast.parse(open(path, encoding="utf-8", errors="replace").read(), path)
    found = []

    def walk(node, parents):
        if isinstance(node, ast.Import) and not guarded(node, parents):
            found.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and not guarded(node, parents):
            found.append(node.module)
        for child in ast.iter_child_nodes(node):
            walk(child, parents + [node])

    walk(tree, [])
    return found


def main():
    root = os.path.abspath(sys.argv[1])
    files = sorted(set(python_files(root)))
    # The repository's own modules: any .py file's name and any package dir.
    local = {os.path.splitext(os.path.basename(f))[0] for f in files}
    local |= {"netreduce"}
    wanted = {}
    for f in files:
        for mod in imports(f):
            if mod.split(".")[0] in local:
                continue
            wanted.setdefault(mod, []).append(os.path.relpath(f, root))
    missing = []
    for mod in sorted(wanted):
        try:
            importlib.import_module(mod)
        except Exception as e:  # ImportError, or a package that fails to load
            missing.append("missing: %s (%s; imported by %s)" % (mod, type(e).__name__, ", ".join(wanted[mod][:3])))
    for m in missing:
        print(m)
    if missing:
        print("FAIL: %d modules the tests import cannot be imported" % len(missing))
        return 1
    print("imports: %d modules imported by %d files, every one importable" % (len(wanted), len(files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
