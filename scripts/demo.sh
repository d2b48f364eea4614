#!/usr/bin/env bash
# The README's "run" command.
#
# The full demo (netreduced + netreduce-dataplane on virtual ports, a ring
# installed through the API, the loopback generator, throughput and the ratio
# to plain forwarding) arrives with the loopback-benchmark work. Until then
# this is a smaller demo of what exists: the RoCEv2 wire layer cross-checked
# live against scapy, and the real data plane aggregating a scapy-generated
# job on DPDK virtual ports.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh
if [ -f build/build.ninja ]; then meson setup --reconfigure build >/dev/null; else meson setup build >/dev/null; fi
meson compile -C build >/dev/null
echo
echo "netreduce demo (smaller than the final one: no daemon, no throughput figures yet)"
echo

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "1. scapy writes 300 RoCEv2 frames (RDMA WRITE with/without ImmDt, ACK, SEND, READ, CNP);"
echo "   netreduce's parser decodes them and checks every ICRC:"
/usr/bin/python3 tests/tools/roce_golden.py generate --count 300 --seed "$RANDOM" \
  --pcap "$work/scapy.pcap" --manifest "$work/scapy.jsonl" >/dev/null
./build/tools/netreduce-pcap-inspect "$work/scapy.pcap" | sed -n 1,8p
echo "   ..."
./build/tools/netreduce-pcap-inspect --summary "$work/scapy.pcap" | sed 's/^/   /'
echo
echo "2. netreduce's builder writes 300 random frames; scapy checks ICRC, IPv4 checksum, lengths:"
/usr/bin/python3 tests/tools/roce_golden.py verify --exe build/tests/wire/write-built-frames \
  --count 300 --seed "$RANDOM" | sed 's/^/   /'
echo
echo "3. netreduce-dataplane on two DPDK net_pcap ports (--no-huge): scapy plays three workers"
echo "   RDMA-WRITing 3 messages of 4 packets each (fp32 sum) plus ACK/ARP/other traffic; every"
echo "   released packet is checked against numpy's rank-order sum and scapy's ICRC:"
/usr/bin/python3 tests/dataplane/dataplane_pcap_test.py build/src/dataplane/netreduce-dataplane one_ring \
  2>/dev/null | sed 's/^/   /'
echo
echo "Decode your own capture: build/tools/netreduce-pcap-inspect FILE.pcap"
echo "Run the box yourself:    build/src/dataplane/netreduce-dataplane -c config/dataplane.yaml"
