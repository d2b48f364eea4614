#!/bin/busybox sh
# /init of the Soft-RoCE lab's guest initramfs (busybox sh, built by nrlab.py).
#
# Loads the modules copied next to it (virtio-pci, virtio-net, 9p, overlay, in
# dependency order from /modules.order), mounts the host's / read-only over
# 9p (tag "hostroot"), puts a tmpfs overlay on top so the guest may write
# anywhere, mounts the per-guest writable share (tag "nrlab") at /nrlab and
# switches to the host script named by nrlab.init= on the kernel command line
# (tests/system/guest_init.sh). Any failure is written to the console with the
# prefix "nrlab-init: FAILED" (the host reports it) and the guest powers off.
/bin/busybox --install -s /bin
export PATH=/bin

fail() {
  echo "nrlab-init: FAILED: $*"
  poweroff -f
  sleep 10
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

for m in $(cat /modules.order); do
  insmod "/modules/$m" || fail "insmod $m"
done

init=
for w in $(cat /proc/cmdline); do
  case "$w" in
    nrlab.init=*) init="${w#nrlab.init=}" ;;
  esac
done
[ -n "$init" ] || fail "no nrlab.init= on the kernel command line"

mkdir -p /host /rw /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro hostroot /host || fail "mount 9p hostroot"
mount -t tmpfs -o size=256m tmpfs /rw || fail "mount tmpfs"
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work /newroot ||
  fail "mount overlay"
mkdir -p /newroot/nrlab
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=none nrlab /newroot/nrlab ||
  fail "mount 9p nrlab share"
[ -x "/newroot$init" ] || fail "$init is not an executable file on the host"

mount --move /dev /newroot/dev
umount /proc /sys
echo "nrlab-init: switching to $init"
exec switch_root /newroot "$init"
