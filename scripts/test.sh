#!/usr/bin/env bash
# The whole netreduce test suite, from a fresh clone on Debian 12:
#   1. installs the Debian packages it needs (scripts/install-deps.sh);
#   2. builds and tests build/ (debugoptimized, warnings as errors);
#   3. builds the DPDK-free code with ASan + UBSan (build-asan/) and runs its
#      tests there too;
#   4. compiles a release build of the whole tree (build-release/,
#      --buildtype=release as users build it, warnings as errors, no tests);
#   5. ends with one line "netreduce: N passed, M failed, K skipped".
# Exit status 0 only if every test passed. Extra arguments go to `meson test`
# (e.g. --suite wire).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/step.sh
. ./scripts/step.sh

./scripts/install-deps.sh test

jobs=$(nproc)
hint="the output above says why; ./scripts/install-deps.sh test installs what the build needs"

# Warnings are errors in the project's own builds (not in users' builds:
# meson.build leaves werror off by default).
echo "== build (debugoptimized) =="
meson_setup build "$hint" --buildtype=debugoptimized -Dwerror=true -Dtests=enabled -Ddpdk=enabled -Dmpi=enabled
meson compile -C build -j "$jobs"

echo "== build (ASan + UBSan, DPDK-free code) =="
# Sanitized runs are ~10x slower: the same randomized tests with fewer seeds
# (build/ runs the full counts). No MPI interposer: preloaded into mpirun's
# unsanitized programs, a sanitized library cannot load.
meson_setup build-asan "$hint" --buildtype=debug -Dwerror=true -Dtests=enabled -Db_sanitize=address,undefined -Db_lundef=false \
  -Ddpdk=disabled -Dmpi=disabled -Dfuzz_iterations=1000000 -Dsim_seeds=1000 -Dsim_tree_seeds=1000 -Dfailover_sim_seeds=1000 -Dengine_fuzz_iterations=60000
meson compile -C build-asan -j "$jobs"

echo "== build (release, as users build it; compiled, not tested) =="
meson_setup build-release "$hint" --buildtype=release -Dwerror=true -Dtests=disabled -Ddpdk=enabled -Dmpi=enabled
meson compile -C build-release -j "$jobs"

status=0
echo "== test (build/) =="
meson test -C build --print-errorlogs --num-processes "$jobs" "$@" || status=1
echo "== test (ASan + UBSan) =="
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  meson test -C build-asan --print-errorlogs --num-processes "$jobs" "$@" || status=1

# One closing line over both builds, from meson's machine-readable logs.
/usr/bin/python3 - build/meson-logs/testlog.json build-asan/meson-logs/testlog.json <<'PY'
import json, sys
passed = failed = skipped = 0
for path in sys.argv[1:]:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        failed += 1
        continue
    for line in lines:
        r = json.loads(line)["result"]
        if r in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif r == "SKIP":
            skipped += 1
        else:
            failed += 1
print("netreduce: %d passed, %d failed, %d skipped" % (passed, failed, skipped))
PY
exit $status
