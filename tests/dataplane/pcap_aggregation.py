#!/usr/bin/python3
"""Aggregation and forwarding by the data plane on its pcap box (tests/dataplane/pcapbox.py).

Every released INA packet carries the rank-order reduction (numpy), the
sender's own headers and INA header, and a valid ICRC (scapy); ACKs and non-INA
traffic leave byte-identical; the final counters equal what was sent. One ring;
two rings on two workers, one fed through dispatch; the same over
net_af_packet; two stripes of one job over the same members, told apart by QP.

Usage: pcap_aggregation.py <netreduce-dataplane> one_ring|two_rings|af_packet|stripes|stripes_home
"""
import json
import os
import subprocess
import sys

from scapy.all import IP, ARP, rdpcap, wrpcap, raw
from scapy.contrib.roce import BTH

from pcapbox import Control, check_released, ina_packets, main, other_traffic, ring_spec, run_dataplane, sh


def one_ring_scenario(tmp, in_pcap, rng):
    """One ring of 3 ranks among ACKs, a non-INA WRITE and ARP, on 1 worker: every INA packet
    released exact, every other frame byte-identical, the counters (control socket and DPDK
    telemetry) equal to what was sent."""
    pmtu, ppm = 1024, 4
    frames, data, cap = ina_packets(1, 3, 1, 3, ppm, pmtu, rng)
    others = other_traffic(1)
    wrpcap(in_pcap, others[:3] + frames + others[3:])
    out, final, status, rings = run_dataplane(tmp, in_pcap, [ring_spec(1, 3, 1, ppm, pmtu)], 1)
    n = check_released(out, frames, data, 3, pmtu, cap)
    assert n == len(frames), "released %d of %d INA packets" % (n, len(frames))
    outs = {raw(f) for f in out}
    for o in others:
        assert raw(o) in outs, "non-INA frame not forwarded byte-identical: %s" % o.summary()
    reasons = final["reasons"]
    assert reasons["held"] == len(frames), reasons
    assert reasons["fwd_not_write"] == 5 and reasons["fwd_no_ina"] == 1 and reasons["fwd_not_roce"] == 1, reasons
    ring = rings["rings"][0]["counters"]
    assert ring["messages_completed"] == 3 and ring["cells_completed"] == 3 * ppm, ring
    assert len(out) == len(frames) + len(others)
    tel = run_dataplane.telemetry
    assert tel["held"] == len(frames) and tel["fwd_not_write"] == 5, tel
    print("one_ring: %d INA packets aggregated and checked, %d other frames forwarded unchanged" %
          (n, len(others)))


def two_rings_scenario(tmp, in_pcap, rng):
    """Two rings on two worker lcores, one RX queue, so the second worker is fed through the
    dispatch stage; both exact."""
    pmtu, ppm = 1024, 4
    fa, da, cap = ina_packets(1, 3, 1, 2, ppm, pmtu, rng)
    fb, db, _ = ina_packets(2, 2, 2, 2, ppm, pmtu, rng)
    mixed = [x for pair in zip(fa, fb) for x in pair] + fa[len(fb):] + fb[len(fa):]
    wrpcap(in_pcap, mixed)
    out, final, status, rings = run_dataplane(
        tmp, in_pcap, [ring_spec(1, 3, 1, ppm, pmtu), ring_spec(2, 2, 2, ppm, pmtu)], 2)
    owners = {r["spec"]["id"]: r["worker"] for r in rings["rings"]}
    assert owners[1] != owners[2], "rings should sit on different workers: %s" % owners
    oa = [f for f in out if IP in f and f[IP].src.startswith("10.1.")]
    ob = [f for f in out if IP in f and f[IP].src.startswith("10.2.")]
    n = check_released(oa, fa, da, 3, pmtu, cap) + check_released(ob, fb, db, 2, pmtu, cap)
    assert n == len(fa) + len(fb), "released %d of %d" % (n, len(fa) + len(fb))
    dispatched = sum(w["dispatched"] for w in final["workers"])
    assert dispatched > 0, "the second worker should have been fed through dispatch"
    print("two_rings: %d packets on workers %s, %d dispatched between workers" % (n, owners, dispatched))


def af_packet_scenario(tmp, rng):
    """The box on net_af_packet over two veth pairs. Their far ends sit in a
    network namespace this test creates and always deletes. Frames are
    injected into one pair and captured from the other, inside that namespace."""
    ns = "nrtest%d" % os.getpid()
    frames, data, cap = ina_packets(1, 3, 1, 2, 4, 256, rng)
    others = other_traffic(1)
    in_pcap, got_pcap = os.path.join(tmp, "in.pcap"), os.path.join(tmp, "got.pcap")
    wrpcap(in_pcap, others[:3] + frames + others[3:])
    sock = os.path.join(tmp, "dp.sock")
    try:
        sh("ip", "netns", "add", ns)
        for side in "AB":
            sh("ip", "link", "add", "nr%s0%d" % (side, os.getpid() % 10000), "type", "veth", "peer", "name",
               "nr%s1" % side, "netns", ns)
            sh("ip", "link", "set", "nr%s0%d" % (side, os.getpid() % 10000), "up")
            sh("ip", "-n", ns, "link", "set", "nr%s1" % side, "up")
        a0, b0 = "nrA0%d" % (os.getpid() % 10000), "nrB0%d" % (os.getpid() % 10000)
        cfg = {"eal": ["-l", "0-1", "--no-huge", "-m", "512", "--no-pci", "--log-level", "lib.eal:warning",
                       "--file-prefix", "nr%d" % os.getpid(),
                       "--vdev", "net_af_packet0,iface=%s" % a0, "--vdev", "net_af_packet1,iface=%s" % b0],
               "ports": [{"name": "net_af_packet0"}, {"name": "net_af_packet1"}],
               "mtu": 1500, "memory": {"mbufs": 8192}, "control": {"socket": sock}}
        with open(os.path.join(tmp, "dp.yaml"), "w") as f:
            json.dump(cfg, f)
        with open(os.path.join(tmp, "rings.json"), "w") as f:
            json.dump([ring_spec(1, 3, 1, 4, 256)], f)
        proc = subprocess.Popen([sys.argv[1], "-c", os.path.join(tmp, "dp.yaml"), "--rings",
                                 os.path.join(tmp, "rings.json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            try:
                ctl = Control(sock)
            except RuntimeError:
                proc.kill()
                print(proc.communicate()[1][-3000:], file=sys.stderr)
                raise
            # Inject on A1, capture on B1, inside the namespace.
            code = ("from scapy.all import *\n"
                    "s = AsyncSniffer(iface='nrB1', store=True); s.start(); time.sleep(1)\n"
                    "sendp(rdpcap(%r), iface='nrA1', verbose=False, inter=0.001); time.sleep(2); s.stop()\n"
                    "wrpcap(%r, s.results)\n") % (in_pcap, got_pcap)
            subprocess.run(["ip", "netns", "exec", ns, "/usr/bin/python3", "-c", code], check=True, timeout=120)
            rings_now = ctl(cmd="list_rings")
            ctl(cmd="shutdown")
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        got = [f for f in rdpcap(got_pcap) if IP in f or ARP in f]
        n = check_released(got, frames, data, 3, 256, cap)
        assert n == len(frames), "released %d of %d INA packets over af_packet" % (n, len(frames))
        outs = {raw(f) for f in got}
        for o in others:
            assert raw(o) in outs, "not forwarded unchanged over af_packet: %s" % o.summary()
        assert rings_now["rings"][0]["counters"]["messages_completed"] == 2, rings_now
        print("af_packet: %d INA packets aggregated across veth pairs in netns %s, %d other frames unchanged" %
              (n, ns, len(others)))
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # takes the veth pairs with it
        for side in "AB":
            subprocess.run(["ip", "link", "del", "nr%s0%d" % (side, os.getpid() % 10000)], capture_output=True)


def stripes_scenario(tmp, in_pcap, rng, workers=2):
    """Two stripes of one job: rings 41 and 42 over the same three members,
    each with its own QPs (qpns). On 2 workers with one RX queue the box spreads them:
    ring 41 on worker 0, ring 42 on worker 1, their links split; ring 42's packets reach
    worker 1 by their receiving connection (dst, dest QP), ring 41's stay. Both exact
    (numpy, scapy ICRC). A ring over those members without qpns is refused naming
    "qpns"; one reusing ring 41's QPs is refused on field qpns. Messages on QPs no
    ring names (claiming ring 41, or ring 42) go to the split links' home worker and
    are dropped there (qpn_mismatch, unknown_ring, first_packet_lost), never forwarded
    unreduced. With 3 workers an ordinary ring takes worker 0 (the one with the RX
    queue) first: the stripes sit on workers 1 and 2, and the strays, arriving on
    worker 0, which has no ring on their links, must still go to the home worker
    (worker 1) to be dropped, not be forwarded from worker 0."""
    pmtu, ppm = 1024, 4
    first = 1 if workers == 3 else 0
    fa, da, cap = ina_packets(41, 3, 7, 2, ppm, pmtu, rng, psn_base=1000, qpn_base=0x100)
    fb, db, _ = ina_packets(42, 3, 7, 2, ppm, pmtu, rng, psn_base=60000, qpn_base=0x200)
    stray41, _, _ = ina_packets(41, 3, 7, 1, ppm, pmtu, rng, psn_base=90000, qpn_base=0x300)
    stray42, _, _ = ina_packets(42, 3, 7, 1, ppm, pmtu, rng, psn_base=95000, qpn_base=0x380)
    wrpcap(in_pcap, [x for pair in zip(fa, fb) for x in pair] + stray41 + stray42)
    qa, qb = [0x100 + r for r in range(3)], [0x200 + r for r in range(3)]
    specs = [dict(ring_spec(41, 3, 7, ppm, pmtu), qpns=qa), dict(ring_spec(42, 3, 7, ppm, pmtu), qpns=qb)]
    if workers == 3:
        specs.insert(0, ring_spec(1, 2, 1, ppm, pmtu))
    refused = []

    def during(ctl):
        r = ctl(cmd="install_ring", ring=ring_spec(43, 3, 7, ppm, pmtu))
        assert not r["ok"] and r["error"]["code"] == "conflict" and '"qpns"' in r["error"]["message"], r
        r2 = ctl(cmd="install_ring", ring=dict(ring_spec(44, 3, 7, ppm, pmtu), qpns=qa))
        assert not r2["ok"] and r2["error"]["code"] == "conflict" and r2["error"]["field"] == "qpns", r2
        r3 = ctl(cmd="install_ring", ring=dict(ring_spec(45, 3, 7, ppm, pmtu), qpns=[1, 2]))
        assert not r3["ok"] and r3["error"]["field"] == "qpns", r3
        refused.extend([r, r2, r3])
    out, final, status, rings = run_dataplane(tmp, in_pcap, specs, workers, during=during)
    owners = {r["spec"]["id"]: r["worker"] for r in rings["rings"] if r["spec"]["id"] in (41, 42)}
    assert owners == {41: first, 42: first + 1}, owners
    assert [r["spec"].get("qpns") for r in sorted(rings["rings"], key=lambda r: r["spec"]["id"])
            if r["spec"]["id"] in (41, 42)] == [qa, qb]
    oa = [f for f in out if BTH in f and f[BTH].dqpn in qa]
    ob = [f for f in out if BTH in f and f[BTH].dqpn in qb]
    na = check_released(oa, fa, da, 3, pmtu, cap)
    nb = check_released(ob, fb, db, 3, pmtu, cap, psn_base=60000)
    assert (na, nb) == (len(fa), len(fb)), (na, len(fa), nb, len(fb))
    for r in rings["rings"]:
        if r["spec"]["id"] in (41, 42):
            assert r["counters"]["messages_completed"] == 2 and r["counters"]["cells_completed"] == 2 * ppm, r
    dispatched = [w["dispatched"] for w in final["workers"]]
    strays = len(stray41) + len(stray42)
    want = [len(fb), 0] if workers == 2 else [len(fa) + len(fb) + strays, 0, 0]
    assert dispatched == want, "each stripe's packets to its worker, strays to the home: %s" % dispatched
    assert not [f for f in out if BTH in f and f[BTH].dqpn >= 0x300], "a stray packet left the box"
    reasons = final["workers"][first]["reasons"]
    assert (reasons["qpn_mismatch"], reasons["unknown_ring"], reasons["first_packet_lost"]) == \
        (3, 3, 2 * 3 * (ppm - 1)), reasons
    print("stripes: rings 41 and 42 over the same members on workers %s; %d + %d packets exact; "
          "dispatched %s; refused: %s" % (owners, na, nb, dispatched,
                                          "; ".join(x["error"]["message"][:70] for x in refused)))


SCENARIOS = {
    "one_ring": one_ring_scenario,
    "two_rings": two_rings_scenario,
    "af_packet": lambda tmp, in_pcap, rng: af_packet_scenario(tmp, rng),
    "stripes": stripes_scenario,
    "stripes_home": lambda tmp, in_pcap, rng: stripes_scenario(tmp, in_pcap, rng, workers=3),
}


if __name__ == "__main__":
    main(SCENARIOS)
