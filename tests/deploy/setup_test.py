#!/usr/bin/python3
"""netreduce-setup on a fake host: a /sys and /proc tree under a temp dir
(--sysfs-root), and stand-ins for dpdk-devbind.py and modprobe that record
their arguments and change the fake tree the way the real ones change the
real one. No NIC, no root, no change to this machine.

    setup_test.py NETREDUCE_SETUP

Cases:
  virtual    the shipped config (net_ring vdevs, --no-huge): ready, nothing to do
  nic        two PCI ports (an ixgbe port on its kernel driver, down, and a
             Mellanox port), hugepages short, vfio-pci not loaded:
             --check reports what it would do, changes nothing, exits 1;
             prepare raises nr_hugepages by the missing pages, loads
             vfio-pci, binds only the ixgbe port, prints the undo commands;
             a second --check exits 0
  refusals   no IOMMU; a port whose interface is up; a PCI address with no
             device; 1 GiB pages only and too few: each is an "error:" line
             naming the fix, exit 1, and nothing is bound
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

SETUP = os.path.abspath(sys.argv[1])
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def fake_host(root, iommu=True, free_2m=100, nr_2m=100, sizes=(2048,), up_iface=False):
    for kb in sizes:
        d = os.path.join(root, "sys/kernel/mm/hugepages/hugepages-%dkB" % kb)
        write(os.path.join(d, "nr_hugepages"), "%d\n" % (nr_2m if kb == 2048 else 1))
        write(os.path.join(d, "free_hugepages"), "%d\n" % (free_2m if kb == 2048 else 0))
    write(os.path.join(root, "proc/mounts"),
          "sysfs /sys sysfs rw 0 0\nhugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n")
    if iommu:
        os.makedirs(os.path.join(root, "sys/kernel/iommu_groups/17"))
    drivers = os.path.join(root, "sys/bus/pci/drivers")
    for drv in ("ixgbe", "mlx5_core"):
        os.makedirs(os.path.join(drivers, drv), exist_ok=True)
    for addr, drv, vendor, iface in (("0000:3b:00.0", "ixgbe", "0x8086", "enp59s0f0"),
                                     ("0000:af:00.1", "mlx5_core", "0x15b3", "enp175s0f1")):
        dev = os.path.join(root, "sys/bus/pci/devices", addr)
        write(os.path.join(dev, "vendor"), vendor + "\n")
        os.symlink(os.path.join(drivers, drv), os.path.join(dev, "driver"))
        write(os.path.join(dev, "net", iface, "operstate"), ("up" if up_iface and drv == "ixgbe" else "down") + "\n")


def fake_tools(root, log):
    """devbind: records its arguments and re-points the device's driver link;
    modprobe: records and creates /sys/module/<name>."""
    bindir = os.path.join(root, "fake-bin")
    os.makedirs(bindir)
    devbind = os.path.join(bindir, "devbind")
    write(devbind, "#!/usr/bin/python3\nimport os, sys\n"
          "open(%r, 'a').write('devbind ' + ' '.join(sys.argv[1:]) + '\\n')\n"
          "drv = sys.argv[1].split('=', 1)[1]; addr = sys.argv[2]\n"
          "os.makedirs(%r + '/sys/bus/pci/drivers/' + drv, exist_ok=True)\n"
          "link = %r + '/sys/bus/pci/devices/' + addr + '/driver'\n"
          "os.remove(link); os.symlink(%r + '/sys/bus/pci/drivers/' + drv, link)\n" % (log, root, root, root))
    modprobe = os.path.join(bindir, "modprobe")
    write(modprobe, "#!/usr/bin/python3\nimport os, sys\n"
          "open(%r, 'a').write('modprobe ' + ' '.join(sys.argv[1:]) + '\\n')\n"
          "os.makedirs(%r + '/sys/module/' + sys.argv[1].replace('-', '_'), exist_ok=True)\n" % (log, root))
    for f in (devbind, modprobe):
        os.chmod(f, 0o755)
    return devbind, modprobe


def nic_config(path, eal_mem=("-m", "1024"), ports=("0000:3b:00.0", "0000:af:00.1")):
    cfg = {"eal": ["-l", "0-2", "-n", "4"] + list(eal_mem) + ["-a", ports[0], "-a", ports[1]],
           "ports": [{"name": p} for p in ports]}
    with open(path, "w") as f:
        json.dump(cfg, f)  # JSON is YAML


def run(root, cfg, *extra):
    devbind, modprobe = os.path.join(root, "fake-bin/devbind"), os.path.join(root, "fake-bin/modprobe")
    p = subprocess.run([SETUP, "--config", cfg, "--sysfs-root", root, "--devbind", devbind, "--modprobe", modprobe]
                       + list(extra), capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def read(root, rel):
    with open(os.path.join(root, rel)) as f:
        return f.read().strip()


def driver(root, addr):
    return os.path.basename(os.readlink(os.path.join(root, "sys/bus/pci/devices", addr, "driver")))


def lines(out, kind):
    return [line[len(kind) + 1:].strip() for line in out.splitlines() if line.startswith(kind + ":")]


def case_virtual(tmp):
    p = subprocess.run([SETUP, "--check", "--config", os.path.join(REPO, "config", "dataplane.yaml"),
                        "--sysfs-root", tmp], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "not needed (the EAL arguments say --no-huge)" in p.stdout, p.stdout
    assert lines(p.stdout, "ok")[1:] == ["port net_ring0: a virtual device, nothing to bind",
                                         "port net_ring1: a virtual device, nothing to bind"], p.stdout
    assert not lines(p.stdout, "needed") and not lines(p.stdout, "error"), p.stdout
    print("virtual: the shipped configuration needs nothing (exit 0)")


def case_nic(tmp):
    root = os.path.join(tmp, "nic")
    log = os.path.join(tmp, "nic.log")
    fake_host(root, free_2m=100, nr_2m=100)  # 200 MiB free; 1024 MiB needed: 412 more pages
    fake_tools(root, log)
    cfg = os.path.join(tmp, "nic.yaml")
    nic_config(cfg)
    nr = "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"

    rc, out = run(root, cfg, "--check")
    assert rc == 1, out
    assert lines(out, "needed") == [
        "hugepages: 200 MiB free, 1024 MiB needed: /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages 100 -> 512",
        "vfio-pci: module not loaded: modprobe vfio-pci",
        "port 0000:3b:00.0: on driver ixgbe: dpdk-devbind.py --bind=vfio-pci 0000:3b:00.0"], out
    assert "port 0000:af:00.1: Mellanox/NVIDIA (driver mlx5_core), stays on its kernel driver" in lines(out, "ok"), out
    assert not lines(out, "change") and not os.path.exists(log), out
    assert read(root, nr) == "100" and driver(root, "0000:3b:00.0") == "ixgbe"

    # The kernel grants the pages: the fake nr_hugepages keeps what is written.
    rc, out = run(root, cfg)
    assert rc == 0, out
    assert read(root, nr) == "512", read(root, nr)
    assert driver(root, "0000:3b:00.0") == "vfio-pci" and driver(root, "0000:af:00.1") == "mlx5_core"
    with open(log) as f:
        assert f.read().splitlines() == ["modprobe vfio-pci", "devbind --bind=vfio-pci 0000:3b:00.0"]
    assert lines(out, "change") == [
        "hugepages: /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages 100 -> 512 (200 MiB were free, 1024 MiB needed)",
        "vfio-pci: module loaded",
        "port 0000:3b:00.0: ixgbe -> vfio-pci"], out
    assert lines(out, "undo") == ["echo 100 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
                                  "modprobe -r vfio-pci", "dpdk-devbind.py --bind=ixgbe 0000:3b:00.0"], out

    # Now ready (the fake kernel's free pages follow the new total).
    with open(os.path.join(root, "sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"), "w") as f:
        f.write("512\n")
    rc, out = run(root, cfg, "--check")
    assert rc == 0 and not lines(out, "needed"), out
    assert "port 0000:3b:00.0: bound to vfio-pci" in lines(out, "ok"), out
    print("nic: --check listed 3 needs and changed nothing; prepare made 3 changes with their undo; then ready")


def case_refusals(tmp):
    def fresh(name, **kw):
        root = os.path.join(tmp, name)
        fake_host(root, **kw)
        fake_tools(root, os.path.join(tmp, name + ".log"))
        return root

    cfg = os.path.join(tmp, "r.yaml")
    nic_config(cfg, eal_mem=("--socket-mem", "512,512"))

    root = fresh("noiommu", iommu=False, free_2m=1024)
    rc, out = run(root, cfg)
    assert rc == 1 and any("iommu: no IOMMU groups" in e and "intel_iommu=on" in e for e in lines(out, "error")), out
    assert "port 0000:3b:00.0: not bound to vfio-pci (vfio is not usable, see above)" in lines(out, "error"), out
    assert driver(root, "0000:3b:00.0") == "ixgbe"

    root = fresh("up", free_2m=1024, up_iface=True)
    rc, out = run(root, cfg)
    assert rc == 1 and lines(out, "error") == [
        "port 0000:3b:00.0: its kernel interface enp59s0f0 is up; take it down first (ip link set enp59s0f0 down)"], out
    assert driver(root, "0000:3b:00.0") == "ixgbe"

    root = fresh("nodev", free_2m=1024)
    cfg2 = os.path.join(tmp, "nodev.yaml")
    nic_config(cfg2, ports=("3b:00.0", "0000:5e:00.0"))  # short form of a present one, and an absent one
    rc, out = run(root, cfg2)
    assert rc == 1 and lines(out, "error") == [
        "port 0000:5e:00.0: no PCI device 0000:5e:00.0 (lspci -D lists the host's devices)"], out
    assert lines(out, "change") == ["vfio-pci: module loaded", "port 0000:3b:00.0: ixgbe -> vfio-pci"], out

    root = fresh("gig", sizes=(1048576,))
    rc, out = run(root, cfg, "--check")
    assert rc == 1 and lines(out, "error") == [
        "hugepages: 0 MiB free, 1024 MiB needed, and no 2 MiB pages to add; reserve them on the kernel command line "
        "(hugepagesz=1G hugepages=N)"], out

    bad = os.path.join(tmp, "bad.yaml")
    with open(bad, "w") as f:
        f.write("ports: [{name: a}]\n")
    rc, out = run(root, bad, "--check")
    assert rc == 2 and "ports: needs exactly 2 entries" in out, out
    print("refusals: no IOMMU, interface up, absent device, no 2 MiB pages, bad config: each named, nothing bound")


def main():
    tmp = tempfile.mkdtemp(prefix="nrsetup-")
    try:
        case = sys.argv[2] if len(sys.argv) > 2 else "all"
        for name, fn in (("virtual", case_virtual), ("nic", case_nic), ("refusals", case_refusals)):
            if case in ("all", name):
                fn(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
