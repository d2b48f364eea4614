#!/usr/bin/python3
"""The Debian packages, built from a clean copy of the tree and checked from
their contents (no installation on this machine).

    package_test.py SOURCE_ROOT [--keep DIR]

1. Copies the tree (git's tracked and untracked-not-ignored files, or the
   whole tree without build*/ outside git) to a temp dir, so no build
   directory leaks in, and checks that debian/changelog's version is the one
   in meson.build's project().
2. dpkg-buildpackage -us -uc -b (tests off: debian/rules), timed.
3. Every .deb: its files (each package holds what it must), its conffiles,
   a man page beside every program (usr/bin/X: usr/share/man/man1/X.1.gz,
   usr/sbin/X: man8/X.8.gz, in the same package), and for every ELF file in
   it, every NEEDED library is provided by the package itself or by a
   package in its Depends (found with dpkg -S on this machine, or among the
   packages just built).
4. From the unpacked tree (dpkg-deb -x into one root, LD_LIBRARY_PATH on its
   library directory): netreduced --check and netreduce-dataplane --check on
   the packaged configuration, netreduce-setup --check, a C program built
   against the packaged headers and pkg-config file and linked with the
   packaged library, and systemd-analyze verify --root on the packaged units.
5. lintian: no error (warnings are printed), and no tag about man pages
   (binary-without-manpage, manpage-*, groff-message; info tags included).
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SRC = os.path.abspath(sys.argv[1])
KEEP = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--keep" else None
ARCH_LIB = "usr/lib/x86_64-linux-gnu"
PY_DIR = "usr/lib/python3/dist-packages"

# What each package must hold (paths relative to /); a missing one fails.
EXPECT = {
    "netreduce-box": ["usr/bin/netreduce-dataplane", "usr/bin/netreduced", "usr/bin/netreducectl",
                      "usr/sbin/netreduce-setup", "etc/netreduce/dataplane.yaml", "etc/netreduce/netreduced.yaml",
                      "lib/systemd/system/netreduce-dataplane.service", "lib/systemd/system/netreduced.service",
                      "usr/share/netreduce/monitoring/prometheus.yml", "usr/share/netreduce/monitoring/alerts.yml",
                      "usr/share/netreduce/monitoring/grafana/netreduce.json",
                      "usr/share/doc/netreduce-box/README.md", "usr/share/doc/netreduce-box/docs/operations.md",
                      "usr/share/doc/netreduce-box/docs/dataplane.md", "usr/share/doc/netreduce-box/docs/api.md"],
    "netreduce-tools": ["usr/bin/netreduce-allreduce-perf", "usr/bin/netreduce-loopback",
                        "usr/bin/netreduce-pcap-inspect"],
    "libnetreduce1": [ARCH_LIB + "/libnetreduce.so.1"],
    "libnetreduce-mpi1": [ARCH_LIB + "/libnetreduce-mpi.so.1"],
    "libnetreduce-dev": ["usr/include/netreduce/netreduce.h", "usr/include/netreduce/netreduce.hpp",
                         ARCH_LIB + "/libnetreduce.so", ARCH_LIB + "/pkgconfig/netreduce.pc"],
    "python3-netreduce": [PY_DIR + "/netreduce/" + f for f in ("__init__.py", "_lib.py", "_config.py", "torch.py")],
}
CONFFILES = {"netreduce-box": {"/etc/netreduce/dataplane.yaml", "/etc/netreduce/netreduced.yaml"}}


def run(cmd, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    p = subprocess.run(cmd, **kw)
    return p


def must(cmd, what, **kw):
    p = run(cmd, **kw)
    assert p.returncode == 0, "%s failed (exit %d): %s\n%s%s" % (what, p.returncode, " ".join(cmd),
                                                               (p.stdout or "")[-4000:], (p.stderr or "")[-4000:])
    return p.stdout


def clean_copy(dst):
    """The tree as a fresh clone plus uncommitted work would have it."""
    p = run(["git", "-C", SRC, "ls-files", "-z", "--cached", "--others", "--exclude-standard"])
    if p.returncode == 0:
        files = [f for f in p.stdout.split("\0") if f and os.path.lexists(os.path.join(SRC, f))]
        for f in files:
            os.makedirs(os.path.dirname(os.path.join(dst, f)), exist_ok=True)
            shutil.copy2(os.path.join(SRC, f), os.path.join(dst, f), follow_symlinks=False)
        return "git ls-files (%d files)" % len(files)
    shutil.copytree(SRC, dst, symlinks=True, dirs_exist_ok=True,
                    ignore=lambda d, names: [n for n in names if d == SRC and (n.startswith("build") or n == ".git")])
    return "copy without build*/"


def versions(tree):
    with open(os.path.join(tree, "meson.build")) as f:
        m = re.search(r"project\(\s*'netreduce'.*?version\s*:\s*'([^']+)'", f.read(), re.S)
    assert m, "no version in meson.build's project()"
    deb = must(["dpkg-parsechangelog", "-l", os.path.join(tree, "debian", "changelog"), "-S", "Version"],
               "dpkg-parsechangelog").strip()
    upstream = re.sub(r"-[^-]*$", "", re.sub(r"^\d+:", "", deb))
    assert upstream == m.group(1), "debian/changelog says %s, meson.build says %s: update one of them" % (
        deb, m.group(1))
    return m.group(1), deb


def field(deb, name):
    return run(["dpkg-deb", "-f", deb, name]).stdout.strip()


def depends_names(text):
    """Package names in a Depends field (alternatives included, versions dropped)."""
    names = set()
    for part in text.split(","):
        for alt in part.split("|"):
            alt = alt.strip()
            if alt:
                names.add(re.split(r"[\s(:]", alt)[0])
    return names


def elf_files(root):
    for dirpath, _, files in os.walk(root):
        for f in files:
            path = os.path.join(dirpath, f)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as fh:
                if fh.read(4) == b"\x7fELF":
                    yield path


def needed(path):
    out = must(["readelf", "-d", path], "readelf")
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


_system_owner = {}


def system_owner(soname):
    """The Debian package that provides soname on this machine."""
    if soname not in _system_owner:
        owner = None
        for line in run(["ldconfig", "-p"]).stdout.splitlines():
            m = re.match(r"\s*(\S+) \(libc6,x86-64[^)]*\) => (\S+)$", line)
            if m and m.group(1) == soname:
                p = run(["dpkg", "-S", os.path.realpath(m.group(2))])
                if p.returncode != 0:
                    p = run(["dpkg", "-S", m.group(2)])
                if p.returncode == 0:
                    owner = p.stdout.split(":")[0].strip()
                    break
        _system_owner[soname] = owner
    return _system_owner[soname]


def provides(package):
    """The virtual package names an installed package provides (libspdlog1.10 provides
    libspdlog1.10-fmt9, which shlibs names)."""
    text = run(["dpkg-query", "-W", "-f=${Provides}", package]).stdout
    return depends_names(text)


def check_packages(debs, root):
    built = {}  # package -> set of sonames it ships
    contents = {}
    for deb in debs:
        pkg = field(deb, "Package")
        listing = must(["dpkg-deb", "-c", deb], "dpkg-deb -c")
        contents[pkg] = {re.sub(r"^\./", "", line.split()[5]).rstrip("/") for line in listing.splitlines()}
        must(["dpkg-deb", "-x", deb, root], "dpkg-deb -x")
        built[pkg] = {os.path.basename(p) for p in contents[pkg] if re.search(r"\.so(\.\d+)+$", p)}
    assert set(EXPECT) <= set(contents), "packages built: %s, expected at least %s" % (sorted(contents), sorted(EXPECT))
    for pkg, files in EXPECT.items():
        missing = [f for f in files if f not in contents[pkg]]
        assert not missing, "%s lacks %s" % (pkg, missing)
    for pkg, want in CONFFILES.items():
        deb = [d for d in debs if field(d, "Package") == pkg][0]
        with tempfile.TemporaryDirectory() as ctl:
            must(["dpkg-deb", "-e", deb, ctl], "dpkg-deb -e")
            have = set(open(os.path.join(ctl, "conffiles")).read().split())
        assert want <= have, "%s conffiles %s, expected %s" % (pkg, sorted(have), sorted(want))
    n_pages = 0
    for pkg, files in sorted(contents.items()):
        for f in sorted(files):
            m = re.match(r"usr/(s?)bin/([^/]+)$", f)
            if not m:
                continue
            section = "8" if m.group(1) else "1"
            page = "usr/share/man/man%s/%s.%s.gz" % (section, m.group(2), section)
            assert page in files, "%s ships %s without its man page %s (docs/man/%s.%s.scd, debian/%s.install)" % (
                pkg, f, page, m.group(2), section, pkg)
            n_pages += 1
    assert n_pages >= 7, "only %d programs with man pages in the packages" % n_pages

    n_elf = n_needed = 0
    for deb in debs:
        pkg = field(deb, "Package")
        deps = depends_names(field(deb, "Depends") + "," + field(deb, "Pre-Depends"))
        with tempfile.TemporaryDirectory() as one:
            must(["dpkg-deb", "-x", deb, one], "dpkg-deb -x")
            for path in elf_files(one):
                n_elf += 1
                for soname in needed(path):
                    n_needed += 1
                    ours = [p for p, libs in built.items() if soname in libs]
                    if ours:
                        assert pkg in ours or set(ours) & deps, \
                            "%s: %s needs %s (in package %s), which is not in Depends: %s" % (
                                pkg, os.path.relpath(path, one), soname, ours[0], sorted(deps))
                        continue
                    owner = system_owner(soname)
                    assert owner, "%s: %s needs %s, which no installed package provides" % (
                        pkg, os.path.relpath(path, one), soname)
                    assert ({owner} | provides(owner)) & deps, \
                        "%s: %s needs %s (package %s), which is not in Depends: %s" % (
                            pkg, os.path.relpath(path, one), soname, owner, sorted(deps))
        dev_deps = [d for d in deps if d.endswith("-dev")]
        assert not dev_deps, "%s depends on development packages %s" % (pkg, dev_deps)
    return n_elf, n_needed


def check_unpacked(root, tmp, version, debs):
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(root, ARCH_LIB))
    etc = os.path.join(root, "etc", "netreduce")
    out = must([os.path.join(root, "usr/bin/netreduce-dataplane"), "--check", "-c", os.path.join(etc, "dataplane.yaml")],
               "netreduce-dataplane --check", env=env)
    print("  " + out.strip())
    with open(os.path.join(etc, "dataplane.yaml")) as f:
        assert re.search(r"^  group: netreduce$", f.read(), re.M), \
            "the packaged dataplane.yaml does not give the control socket to group netreduce"
    # The packaged daemon configuration, with its token and state where this test may write.
    import yaml
    with open(os.path.join(etc, "netreduced.yaml")) as f:
        cfg = yaml.safe_load(f)
    assert cfg["auth"]["token_file"] == "/etc/netreduce/token", cfg["auth"]
    assert cfg["dataplane"]["socket"] == "/run/netreduce/dataplane.sock", cfg["dataplane"]
    token = os.path.join(tmp, "token")
    with open(token, "w") as f:
        f.write("packaged-check-token\n")
    os.chmod(token, 0o600)
    cfg["auth"]["token_file"] = token
    cfg["state"]["file"] = os.path.join(tmp, "state.json")
    daemon_cfg = os.path.join(tmp, "netreduced.yaml")
    with open(daemon_cfg, "w") as f:
        yaml.safe_dump(cfg, f)
    out = must([os.path.join(root, "usr/bin/netreduced"), "--check", "-c", daemon_cfg], "netreduced --check", env=env)
    print("  " + out.strip())
    out = must([os.path.join(root, "usr/bin/netreducectl"), "--help"], "netreducectl --help", env=env)
    out = must([os.path.join(root, "usr/sbin/netreduce-setup"), "--check", "--config",
                os.path.join(etc, "dataplane.yaml")], "netreduce-setup --check", env=env)
    print("  netreduce-setup --check: " + out.strip().splitlines()[-1])

    # The host library as a user builds against it: headers + pkg-config + .so link.
    prog = os.path.join(tmp, "use_lib.c")
    with open(prog, "w") as f:
        f.write('#include <netreduce/netreduce.h>\n#include <stdio.h>\n'
                'int main(void) { const char* e = nr_last_error(); printf("nr_last_error: \\"%s\\"\\n", e ? e : "");'
                ' return 0; }\n')
    pc_env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(root, ARCH_LIB, "pkgconfig"), PKG_CONFIG_LIBDIR="")
    flags = must(["pkg-config", "--define-variable=prefix=" + os.path.join(root, "usr"), "--cflags", "--libs", "netreduce"], "pkg-config netreduce",
                 env=pc_env).split()
    assert any(f.startswith("-I" + root) for f in flags) and "-lnetreduce" in flags, flags
    exe = os.path.join(tmp, "use_lib")
    must(["gcc", "-Wall", "-Werror", prog, "-o", exe] + flags, "a C program against the packaged library")
    out = must([exe], "the C program", env=env)
    libs = must(["ldd", exe], "ldd", env=env)
    assert os.path.join(root, ARCH_LIB, "libnetreduce.so.1") in libs, libs
    print("  C program built with pkg-config --cflags --libs netreduce, ran against the packaged libnetreduce.so.1")

    # The Python package as installed: its _config.py names the packaged
    # library, and it loads that library (here from the unpacked root).
    # Not NETREDUCE_LIBRARY: the package's own search runs. _config.LIBRARY
    # (/usr/lib/...) is not installed here, so the soname it names next is
    # what the loader finds, on LD_LIBRARY_PATH: the packaged library.
    py_env = dict(os.environ, PYTHONPATH=os.path.join(root, PY_DIR),
                  LD_LIBRARY_PATH=os.path.join(root, ARCH_LIB))
    py_env.pop("NETREDUCE_LIBRARY", None)
    out = must(["/usr/bin/python3", "-c", "import netreduce, netreduce._config as c, netreduce._lib as l; "
                "print(netreduce.__file__); print(c.LIBRARY); l.lib(); print('loaded'); print(netreduce.__version__)"],
               "python3 -c 'import netreduce' from the packaged tree", env=py_env).split()
    assert out[0].startswith(os.path.join(root, PY_DIR)), out
    assert out[1] == "/" + ARCH_LIB + "/libnetreduce.so.1", "python3-netreduce's _config.py names %s" % out[1]
    assert out[2] == "loaded", out
    assert out[3] == version, "python3-netreduce says version %s, meson.build %s" % (out[3], version)
    deb = [d for d in debs if field(d, "Package") == "python3-netreduce"][0]
    want = "libnetreduce1 (= %s)" % field(deb, "Version")
    assert want in field(deb, "Depends"), "python3-netreduce Depends %r lacks %r" % (field(deb, "Depends"), want)
    print("  python3-netreduce: imports from the unpacked tree, names %s, loads the packaged library" % out[1])

    units = sorted(glob.glob(os.path.join(root, "lib/systemd/system/*.service")))
    # --man=no: verify would look for the units' man: pages on this host;
    # the Documentation= check below finds them in the packages instead.
    out = run(["systemd-analyze", "verify", "--root=" + root, "--recursive-errors=no", "--man=no"] +
              [os.path.join("/lib/systemd/system", os.path.basename(u)) for u in units])
    text = (out.stdout + out.stderr).strip()
    assert out.returncode == 0 and not text, "systemd-analyze verify: exit %d\n%s" % (out.returncode, text)
    print("  systemd-analyze verify --root: %s clean" % ", ".join(os.path.basename(u) for u in units))
    # Each unit's Documentation= must lead somewhere the packages install.
    n_docs = 0
    for u in units:
        for line in open(u):
            if not line.startswith("Documentation="):
                continue
            for uri in line.split("=", 1)[1].split():
                m = re.match(r"man:([\w.-]+)\((\d)\)$", uri)
                path = ("usr/share/man/man%s/%s.%s.gz" % (m.group(2), m.group(1), m.group(2)) if m
                        else uri[len("file:///"):] if uri.startswith("file:///") else None)
                assert path, "%s: Documentation=%s is neither man: nor file:///" % (os.path.basename(u), uri)
                assert os.path.exists(os.path.join(root, path)), "%s: Documentation=%s: the packages have no /%s" % (
                    os.path.basename(u), uri, path)
                n_docs += 1
    assert n_docs >= len(units), "the units name only %d Documentation= targets" % n_docs
    print("  Documentation= of the units: %d targets, each installed" % n_docs)


MAN_TAG_RE = re.compile(r"^[EWIP]: [^:]+: (binary-without-manpage|manpage-[\w-]+|groff-message)\b")


def lintian(changes):
    p = run(["lintian", "--no-tag-display-limit", "--display-info", changes])
    tags = [line for line in p.stdout.splitlines() if re.match(r"^[EWIP]: ", line)]
    errors = [t for t in tags if t.startswith("E: ")]
    for t in tags:
        if t.startswith(("E: ", "W: ")):
            print("  lintian " + t)
    assert not errors, "lintian errors:\n" + "\n".join(errors)
    man = [t for t in tags if MAN_TAG_RE.match(t)]
    assert not man, "lintian about the man pages (docs/man):\n" + "\n".join(man)
    assert p.returncode in (0, 2) or not errors, p.stdout + p.stderr
    return len([t for t in tags if t.startswith("W: ")])


def main():
    tmp = KEEP or tempfile.mkdtemp(prefix="nrdeb-")
    os.makedirs(tmp, exist_ok=True)
    ok = False
    try:
        tree = os.path.join(tmp, "netreduce")
        how = clean_copy(tree)
        version, deb_version = versions(tree)
        print("source: %s; version %s (meson.build) = %s (debian/changelog)" % (how, version, deb_version))
        jobs = os.cpu_count() or 1
        env = dict(os.environ, DEB_BUILD_OPTIONS="nocheck noautodbgsym parallel=%d" % jobs, LC_ALL="C.UTF-8")
        t0 = time.monotonic()
        p = run(["dpkg-buildpackage", "-us", "-uc", "-b"], cwd=tree, env=env)
        took = time.monotonic() - t0
        if p.returncode != 0:
            raise AssertionError("dpkg-buildpackage failed (exit %d):\n%s" % (p.returncode, (p.stdout + p.stderr)[-6000:]))
        print("dpkg-buildpackage -us -uc -b: %.0f s on %d cores" % (took, jobs))
        debs = sorted(glob.glob(os.path.join(tmp, "*.deb")))
        for d in debs:
            assert field(d, "Version") == deb_version, (d, field(d, "Version"))
            print("  %s  (%d KiB)  Depends: %s" % (os.path.basename(d), os.path.getsize(d) // 1024, field(d, "Depends")))
        root = os.path.join(tmp, "root")
        n_elf, n_needed = check_packages(debs, root)
        print("contents: every expected file and conffile present, a man page beside every program; %d ELF "
              "files, %d NEEDED entries, each provided by the package or its Depends" % (n_elf, n_needed))
        check_unpacked(root, tmp, version, debs)
        changes = glob.glob(os.path.join(tmp, "*.changes"))
        assert len(changes) == 1, changes
        t0 = time.monotonic()
        warnings = lintian(changes[0])
        print("lintian: no errors, %d warnings (%.0f s)" % (warnings, time.monotonic() - t0))
        ok = True
    finally:
        if not KEEP:
            shutil.rmtree(tmp, ignore_errors=True)
        if not ok:
            print("package test FAILED", file=sys.stderr)


if __name__ == "__main__":
    main()
