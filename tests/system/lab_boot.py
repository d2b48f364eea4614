"""What the lab's guests boot: Debian's stock kernel (its uncompressed
ELF, cached) and a busybox initramfs with the modules that mount the host's
root over 9p (initramfs_init.sh), built once per kernel and init script
into the lab's cache directory. How a guest boots is in nrlab.py's
docstring; Guest.boot (lab_guest.py) starts QEMU on what prepare_boot returns.
"""
import gzip
import hashlib
import lzma
import os
import re
import shutil
import subprocess

from lab_common import HERE, QEMU, LabError, log, run

GUEST_MODULES = ["virtio_pci", "virtio_net", "9pnet_virtio", "9p", "overlay"]


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
