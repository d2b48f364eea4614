#!/usr/bin/env bash
# Installs the Debian 12 packages netreduce needs, by profile:
#
#   scripts/install-deps.sh demo   build and run the demo (scripts/demo.sh)
#   scripts/install-deps.sh test   everything: the demo's, plus the test
#                                  suite's tools, the Soft-RoCE lab (QEMU, a
#                                  kernel image) and the packaging tools
#                                  (scripts/test.sh, .ci/run; the default)
#
# Idempotent: packages already present are not touched, so a second run
# costs one dpkg query.
set -euo pipefail

profile=${1:-test}

DEMO=(
  # toolchain and build (the demo's build has its tests off: no Catch2)
  g++ meson ninja-build pkg-config
  # data plane and wire layer
  libdpdk-dev dpdk libisal-dev
  # box-to-box frames' keyed MAC (OpenSSL's Poly1305, AES, HMAC)
  libssl-dev
  # host library
  libibverbs-dev rdma-core ibverbs-providers
  # outbound HTTP with a total deadline (host library to daemon, etcd, CLI)
  libcurl4-openssl-dev
  # control plane (fmt: the host library's error texts too)
  libyaml-cpp-dev prometheus-cpp-dev nlohmann-json3-dev libcpp-httplib-dev
  libspdlog-dev libfmt-dev libcli11-dev
  # the demo's report: its figures (python3) and /metrics (curl)
  python3 curl
)
TEST=(
  # tests and benchmarks
  catch2 clang-format libbenchmark-dev python3-scapy iproute2 python3-numpy python3-matplotlib prometheus
  # AES for the box-to-box MAC's independent reference (tests/tools/b2b_golden.py)
  python3-cryptography
  # zlib: the C++ tests' independent CRC-32 (golden result digests)
  zlib1g-dev
  # the Python package (python/netreduce) and its tests: PyTorch (CPU, Gloo)
  python3-torch
  # the MPI interposer (libnetreduce-mpi) and its tests: Open MPI, mpirun, mpi4py
  libopenmpi-dev openmpi-bin python3-mpi4py
  # system tests: the Soft-RoCE lab (QEMU guests on Debian's kernel, rdma_rxe)
  qemu-system-x86 linux-image-amd64 busybox-static kmod cpio ibverbs-utils
  perftest tcpdump
  # the two-rack lab: loss on a leaf-spine link (nftables; the host kernel may lack sch_netem)
  nftables
  # etcd: the multi-rack fabric's state store (the control tests start their own members)
  etcd-server etcd-client
  # Debian packages and deployment (suite deploy): build, lint, unit files,
  # netreduce-setup (python3-yaml), promtool (prometheus, above); the man
  # pages (scdoc builds them, groff and man-db check how they render)
  debhelper dpkg-dev fakeroot lintian systemd python3-yaml scdoc groff-base man-db
  # the fresh-machine test (suite fresh): a minimal Debian 12 tree; git for
  # the tests that read the checkout (git archive, commit subjects)
  debootstrap git
)

case "$profile" in
  demo) PACKAGES=("${DEMO[@]}") ;;
  test) PACKAGES=("${DEMO[@]}" "${TEST[@]}") ;;
  *) echo "usage: $0 [demo|test]" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps ($profile): all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=(sudo); else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi

echo "install-deps ($profile): installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
