#!/usr/bin/env bash
# Installs every Debian 12 package netreduce needs to build, test and run its
# demo. Idempotent: packages already present are not touched, so a second run
# costs one dpkg query. Used by scripts/demo.sh, scripts/test.sh and .ci/run.
set -euo pipefail

PACKAGES=(
  # toolchain and build
  g++ meson ninja-build pkg-config clang-format
  # data plane and wire layer
  libdpdk-dev dpdk libisal-dev
  # host library
  libibverbs-dev rdma-core ibverbs-providers
  # control plane
  libyaml-cpp-dev prometheus-cpp-dev nlohmann-json3-dev libcpp-httplib-dev
  libspdlog-dev libfmt-dev libcli11-dev
  # tests and benchmarks
  catch2 libbenchmark-dev python3 python3-scapy iproute2 python3-numpy python3-matplotlib prometheus
  # the Python package (python/netreduce) and its tests: PyTorch (CPU, Gloo)
  python3-torch
  # system tests: the Soft-RoCE lab (QEMU guests on Debian's kernel, rdma_rxe)
  qemu-system-x86 linux-image-amd64 busybox-static kmod cpio ibverbs-utils
  perftest tcpdump
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=(sudo); else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
