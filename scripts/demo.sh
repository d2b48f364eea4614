#!/usr/bin/env bash
# The README's demo command: the box on virtual ports, end to end.
#
#   ./scripts/demo.sh            install, build, run the demo, stop everything
#   ./scripts/demo.sh --keep     leave netreduced and the data plane running at
#                                the end (Ctrl-C stops them), to scrape /metrics
#
# What it does (no NIC, no hugepages, no RDMA hardware needed):
#   1. netreduce-dataplane on two DPDK memif ports (the box's port A and B),
#      one worker lcore, aggregate mode, its control socket in a temp dir;
#   2. netreduced in front of it (HTTP API and /metrics on 127.0.0.1);
#   3. a ring of 4 workers installed through the API with netreducectl;
#   4. netreduce-loopback in a second DPDK process, cabled to the box over
#      memif: 4 synthetic RoCEv2 workers RDMA-WRITE fp32 messages (1 KB
#      payloads) into port A, every frame the box releases on port B is
#      checked byte for byte against the expected sum and ICRC; the same ports
#      are measured in forward-only mode first, for the ratio;
#   5. the figures, the counters through the API and /metrics.
# The run itself is scripts/demo-run.sh (the test suite runs it too, as
# 'demo'); this script installs and builds first.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  --keep | "") ;;
  *) echo "usage: $0 [--keep]" >&2; exit 2 ;;
esac

# shellcheck source=scripts/step.sh
. ./scripts/step.sh

./scripts/install-deps.sh demo

# A release build of the four programs the demo runs, in its own directory:
# no tests (their golden data needs the test profile's tools), nothing the
# demo does not run, and nothing shared with ./scripts/test.sh's build.
build=build-demo
targets=(netreduce-dataplane netreduced netreducectl netreduce-loopback)
hint="the output above says why; ./scripts/install-deps.sh demo installs what the build needs"
meson_setup "$build" "$hint" --buildtype=release -Dtests=disabled -Ddpdk=enabled
run_step "compile ${targets[*]} (a few minutes on 2 cores)" "$hint" \
  meson compile -C "$build" "${targets[@]}"

exec ./scripts/demo-run.sh "$build" "$@"
