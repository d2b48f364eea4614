#!/bin/bash
# PID 1 of a Soft-RoCE lab guest (started by initramfs_init.sh after
# switch_root onto the host's / read-only over 9p with a tmpfs overlay).
#
# 1. Mounts proc/sys/run, links /dev/fd (no udev here), configures eth0
#    from the kernel command line (nrlab.name=, nrlab.ip=, nrlab.mtu=).
# 2. Loads rdma_rxe (from the host's /lib/modules/<guest kernel>), creates
#    rxe0 on eth0 and waits for its RoCEv2 IPv4 GID.
# 3. Writes /nrlab/ready (key=value: name, ip, gid_index, gid, kernel,
#    uptime) — or /nrlab/failed with the reason — and becomes the agent:
#
# Agent protocol over the writable share /nrlab (the host's guest directory):
#   host writes  req/<id>.sh    (atomically, by rename)
#   guest moves  req/<id>.sh -> run/<id>.sh and runs it with bash in /tmp,
#                stdout to res/<id>.out, stderr to res/<id>.err, and when it
#                ends writes its exit status to res/<id>.rc (by rename)
#   host writes  stop           -> the guest powers off.
# Commands run concurrently (a perftest server and its client can be two
# requests); nothing in the guest waits for the host.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
OUT=/nrlab

say() { echo "nrlab-guest: $*" >/dev/console 2>/dev/null; }
die() {
  say "FAILED: $*"
  echo "$*" > "$OUT/failed"
  busybox poweroff -f
  sleep 10
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
# No tmpfs over /tmp: the host's /tmp must stay visible (through the overlay,
# writes stay in the guest), or a checkout under /tmp would have its build/
# binaries hidden from the guests ("No such file or directory").
mount -t tmpfs tmpfs /run
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
ln -sfn /proc/self/fd /dev/fd
ln -sfn /proc/self/fd/0 /dev/stdin
ln -sfn /proc/self/fd/1 /dev/stdout
ln -sfn /proc/self/fd/2 /dev/stderr

name=guest ip= mtu=1500
for w in $(cat /proc/cmdline); do
  case "$w" in
    nrlab.name=*) name="${w#nrlab.name=}" ;;
    nrlab.ip=*) ip="${w#nrlab.ip=}" ;;
    nrlab.mtu=*) mtu="${w#nrlab.mtu=}" ;;
  esac
done
[ -n "$ip" ] || die "no nrlab.ip= on the kernel command line"
hostname "$name"
mkdir -p "$OUT/req" "$OUT/run" "$OUT/res"

sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 2>/dev/null
ip link set lo up || die "lo up"
[ -e /sys/class/net/eth0 ] || die "no eth0 (virtio-net did not probe)"
ip link set eth0 mtu "$mtu" || die "eth0 mtu $mtu"
ip addr add "$ip" dev eth0 || die "eth0 address $ip"
ip link set eth0 up || die "eth0 up"

modprobe rdma_rxe || die "modprobe rdma_rxe (is linux-image-amd64's /lib/modules/$(uname -r) on the host?)"
rdma link add rxe0 type rxe netdev eth0 || die "rdma link add rxe0"

# The RoCEv2 GID of the IPv4 address: type "RoCE v2" and ::ffff:a.b.c.d.
gid_index=
for _ in $(seq 1 300); do
  for t in /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/*; do
    i="${t##*/}"
    [ "$(cat "$t" 2>/dev/null)" = "RoCE v2" ] || continue
    g="$(cat /sys/class/infiniband/rxe0/ports/1/gids/"$i" 2>/dev/null)"
    case "$g" in
      0000:0000:0000:0000:0000:ffff:*) gid_index="$i"; gid="$g"; break 2 ;;
    esac
  done
  sleep 0.1
done
[ -n "$gid_index" ] || die "rxe0 has no RoCEv2 IPv4 GID after 30 s"

{
  echo "name=$name"
  echo "ip=${ip%/*}"
  echo "gid_index=$gid_index"
  echo "gid=$gid"
  echo "kernel=$(uname -r)"
  echo "uptime=$(cut -d' ' -f1 /proc/uptime)"
} > "$OUT/ready.tmp" && mv "$OUT/ready.tmp" "$OUT/ready"
say "ready: $name ip ${ip%/*} rxe0 gid index $gid_index"

while [ ! -e "$OUT/stop" ]; do
  for f in "$OUT"/req/*.sh; do
    [ -e "$f" ] || continue
    id="${f##*/}"
    id="${id%.sh}"
    mv "$f" "$OUT/run/$id.sh" || continue
    (
      cd /tmp
      # Its own session and process group (id in res/<id>.pid), so the host
      # can signal the command and everything it started.
      setsid bash "$OUT/run/$id.sh" > "$OUT/res/$id.out" 2> "$OUT/res/$id.err" < /dev/null &
      echo $! > "$OUT/res/$id.pid"
      wait $!
      echo $? > "$OUT/res/$id.rc.tmp"
      mv "$OUT/res/$id.rc.tmp" "$OUT/res/$id.rc"
    ) &
  done
  sleep 0.2
done
say "stop requested"
busybox poweroff -f
