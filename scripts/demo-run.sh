#!/usr/bin/env bash
# The demo's run, on an existing build: scripts/demo.sh installs, builds and
# calls this. Also the meson test 'demo' (short measurements, another port).
#
#   scripts/demo-run.sh BUILD_DIR [--keep]
#
# Environment: NETREDUCE_DEMO_PORT (API port, default 7470),
# NETREDUCE_DEMO_SECONDS (time per measurement, default 2).
# Exit status: 0 when every released frame verified, 1 otherwise or when a
# component fails to start (its log tail is printed).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [--keep]" >&2; exit 2; }
build=$1
keep=false
case "${2:-}" in
  --keep) keep=true ;;
  "") ;;
  *) echo "usage: $0 BUILD_DIR [--keep]" >&2; exit 2 ;;
esac

port=${NETREDUCE_DEMO_PORT:-7470}
seconds=${NETREDUCE_DEMO_SECONDS:-2}
ring=7
ranks=4
payload=1024
msg_len=4
window=16
api=http://127.0.0.1:$port
dp=$build/src/dataplane/netreduce-dataplane
nrd=$build/src/control/netreduced
ctl=$build/src/control/netreducectl
gen=$build/bench/netreduce-loopback

work=$(mktemp -d /tmp/netreduce-demo.XXXXXX)
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ $rc -ne 0 ]; then
    echo >&2
    echo "demo failed (exit $rc); the last lines of each log:" >&2
    for f in "$work"/*.log; do
      [ -f "$f" ] || continue
      echo "== $f" >&2
      # A crash report (common/fatal_signal.h) is shown whole, else the tail.
      if grep -q ': fatal SIG' "$f"; then sed -n '/: fatal SIG/,$p' "$f" | head -n 60 >&2
      else tail -n 15 "$f" >&2; fi
    done
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() { echo "demo: $*" >&2; exit 1; }

# Wait until COMMAND succeeds, up to SECONDS, while PID is alive.
wait_for() {
  local what=$1 secs=$2 pid=$3; shift 3
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || die "$what exited during start-up"
    [ $SECONDS -lt $end ] || die "$what not ready after ${secs}s"
    sleep 0.2
  done
}

if (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null; then
  die "127.0.0.1:$port is in use (another netreduced?); set NETREDUCE_DEMO_PORT"
fi

head -c 24 /dev/urandom | base64 >"$work/token"
chmod 600 "$work/token"

cat >"$work/dataplane.yaml" <<EOF
# The box: port A and port B are memif servers the generator connects to.
eal: ["-l", "0-1", "--no-huge", "-m", "1024", "--no-pci", "--file-prefix", "nrdemo-box-$$",
      "--log-level", "lib.eal:warning",
      "--vdev", "net_memif0,role=server,id=0,socket=$work/a.sock",
      "--vdev", "net_memif1,role=server,id=0,socket=$work/b.sock"]
ports:
  - name: net_memif0
  - name: net_memif1
mtu: 1500
mode: aggregate
workers: [1]
memory:
  mbufs: 16384
  engine: 64MiB
control:
  socket: $work/box.sock
EOF

cat >"$work/netreduced.yaml" <<EOF
listen: {address: 127.0.0.1, port: $port, threads: 2}
auth: {token_file: $work/token}
state: {file: $work/state.json}
dataplane: {socket: $work/box.sock, reconcile_interval_ms: 500}
EOF

echo
echo "netreduce demo: the box on DPDK virtual ports (memif), driven by its control daemon"
echo "work directory: $work"
echo
echo "1. netreduce-dataplane: ports net_memif0 (A) and net_memif1 (B), worker lcore 1"
${NETREDUCE_DEMO_WRAP:-} "$dp" -c "$work/dataplane.yaml" >"$work/dataplane.log" 2>&1 &
pids+=($!)
wait_for netreduce-dataplane 30 "${pids[-1]}" test -S "$work/box.sock"

echo "2. netreduced: API and /metrics on $api"
"$nrd" -c "$work/netreduced.yaml" >"$work/netreduced.log" 2>&1 &
pids+=($!)
export NETREDUCE_DAEMON=$api NETREDUCE_TOKEN_FILE=$work/token
wait_for netreduced 15 "${pids[-1]}" "$ctl" status
wait_for "netreduced's link to the data plane" 15 "${pids[-1]}" \
  sh -c "'$ctl' --json status | grep -q '\"connected\": *true'"

gen_args=(--mode ports --ring-id $ring --ranks $ranks --payloads $payload --dtypes fp32
  --msg-len $msg_len --window $window --seconds "$seconds" --latency-rounds 200
  --box-socket "$work/box.sock" --tx-port net_memif0 --rx-port net_memif1
  --pause-box-at-exit)  # the box must not poll memif while the generator detaches
gen_eal=(-l 0 --no-huge -m 512 --no-pci --log-level lib.eal:warning
  --vdev "net_memif0,role=client,id=0,socket=$work/a.sock"
  --vdev "net_memif1,role=client,id=0,socket=$work/b.sock")

echo "3. netreduce-loopback (a second DPDK process on memif clients): $ranks synthetic RoCEv2 workers,"
echo "   fp32 sum; first ${seconds}s with the box in forward-only mode, the baseline, before any ring"
echo "   is installed (the box refuses forward mode while a ring is installed or retiring)"
"$gen" "${gen_args[@]}" --forward-only --quiet --json "$work/forward.json" -- \
  "${gen_eal[@]}" --file-prefix "nrdemo-fwd-$$" 2>"$work/generator-forward.log"

members=$(for r in $(seq 1 $ranks); do printf '10.77.%d.%d,' $ring "$r"; done)
members=${members%,}
echo "4. netreducectl ring add: ring $ring, $ranks workers ($members), $msg_len packets per message,"
echo "   window $window, $payload-byte payloads"
"$ctl" ring add --id $ring --members "$members" --msg-len $msg_len --window $window \
  --payload $payload | sed 's/^/   /'
wait_for "ring $ring in the data plane" 15 "${pids[0]}" \
  sh -c "'$ctl' --json ring show $ring | grep -q '\"installed\": *true'"
echo

echo "5. netreduce-loopback again: ${seconds}s in aggregate mode through ring $ring, every released"
echo "   frame verified"
"$gen" "${gen_args[@]}" --no-install --no-forward --json "$work/report.json" -- \
  "${gen_eal[@]}" --file-prefix "nrdemo-gen-$$" 2>"$work/generator.log" \
  | sed 's/^/   /'

/usr/bin/python3 - "$work/report.json" "$work/forward.json" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))["points"][0]
a = p["aggregate"]
f = json.load(open(sys.argv[2]))["points"][0]["forward"]
v, fv = a["verified"], f["verified"]
bad = v["bad"] + v["unknown"] + v["duplicate"] + v["missing"]
fbad = fv["bad"] + fv["unknown"] + fv["duplicate"] + fv["missing"]
print()
print("   results verified: %d aggregated frames byte-exact (sum and ICRC), %d wrong, %d missing"
      % (v["good"], v["bad"] + v["unknown"] + v["duplicate"], v["missing"]))
print("   throughput:       %.2f Mpps out (%.2f Gb/s), goodput %.2f Gb/s of reduced tensors"
      % (a["mpps_out"], a["gbps_out"], a["goodput_gbps"]))
print("   forward-only:     %.2f Mpps on the same ports (%d frames verified untouched) ->"
      " aggregate/forward = %.2f" % (f["mpps_out"], fv["good"], a["mpps_out"] / max(1e-9, f["mpps_out"])))
busy = a["busy_per_lcore"][0] if a["busy_per_lcore"] else 0
print("   box worker:       %.0f ns per packet (%.2f Mpps per lcore), busy %.0f%%, latency p50 %.0f us"
      % (a["box_ns_per_packet"], a["box_mpps_per_lcore"], 100 * busy, a["latency_p50_us"]))
if busy < 0.9:
    print("   (the box worker was idle %.0f%% of the time: over memif on a small machine the"
          % (100 * (1 - busy)))
    print("    generator, not the box, sets the rate; the box's own limits:")
    print("    bench/README.md#loopback-benchmark-netreduce-loopback)")
sys.exit(1 if bad or fbad or v["good"] == 0 or fv["good"] == 0 else 0)
EOF
echo

echo "6. counters through the API (netreducectl stats) and Prometheus (/metrics):"
"$ctl" stats | sed 's/^/   /' | head -n 30
echo "   ..."
curl -sSf "$api/metrics" | grep -E "^netreduce_(ring_(aggregated_packets|messages_completed)_total|port_box_(received|transmitted)_packets_total|lcore_busy_ratio)" \
  | sed 's/^/   /' || die "no /metrics from netreduced"
echo
echo "/metrics:  $api/metrics   (scrape config: deploy/prometheus.yml)"
echo "API:       $api/v1/rings, $api/v1/status   (CLI: $ctl --help)"
if $keep; then
  echo
  echo "--keep: netreduced and the data plane keep running; Ctrl-C stops them."
  wait "${pids[0]}"
fi
