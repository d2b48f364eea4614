# shellcheck shell=bash
# Sourced by the scripts that set up a machine (demo.sh, test.sh): runs one
# set-up step with its output kept aside, and on failure shows that output
# and one line that says what to do. No step's errors go to /dev/null.
#
#   run_step "TITLE" "WHAT TO DO IF IT FAILS" COMMAND [ARGS...]
#
# Example: run_step "configure build/" "install the build tools:
# ./scripts/install-deps.sh demo" meson setup build
# prints "-- configure build/", and if meson fails, its whole output, then
# "error: configure build/ failed (exit 1): install the build tools: ...".

run_step() {
  local title=$1 hint=$2 log rc=0
  shift 2
  log=$(mktemp "${TMPDIR:-/tmp}/netreduce-step.XXXXXX")
  echo "-- $title"
  "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    cat "$log" >&2
    echo "error: $title failed (exit $rc): $hint" >&2
  fi
  rm -f "$log"
  return "$rc"
}

# meson_setup DIR "WHAT TO DO IF IT FAILS" [MESON OPTIONS...]: configures DIR,
# or reconfigures it with the options given when it was configured before.
meson_setup() {
  local dir=$1 hint=$2
  shift 2
  if [ -f "$dir/build.ninja" ]; then
    run_step "configure $dir/" "$hint" meson setup --reconfigure "$dir" "$@"
  else
    run_step "configure $dir/" "$hint" meson setup "$dir" "$@"
  fi
}
