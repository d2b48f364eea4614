#!/usr/bin/python3
"""Fault injection (src/dataplane/faults.h), on the data plane's pcap box (tests/dataplane/pcapbox.py).

Refused unless faults.enabled; bad arguments refused by field; bypass forwards
byte-identical past the engine; drop, its expiry, and duplicate with exact sums
(numpy); reorder under full bursts, nothing held after the clear.

Usage: pcap_faults.py <netreduce-dataplane> faults_refused|faults|faults_reorder
"""
import time

from scapy.all import wrpcap, raw
from scapy.contrib.roce import BTH

from pcapbox import (Control, VethBox, check_reason_surfaces, check_released, dump_box_on_failure, ina_packets, main,
                     ordinary_write, other_traffic, port1_tx, ring_spec, start_dataplane, stop_by, wait_port1_tx)


def faults_refused_scenario(tmp, in_pcap):
    """Without faults.enabled every set_fault is refused, naming the key; listing
    and clearing still answer. A bad faults section stops the box at start-up,
    naming the field."""
    wrpcap(in_pcap, [])
    proc, sock, _ = start_dataplane(tmp, in_pcap, [ring_spec(1, 3, 1, 4, 256)], 1)
    with dump_box_on_failure(proc):
        ctl = Control(sock)
        for req in ({"ring": 1, "kind": "drop", "fraction": 1.0, "duration_ms": 1000},
                    {"ring": "all", "kind": "bypass", "duration_ms": 1000},
                    {"ring": 1, "kind": "drop", "fraction": 7, "duration_ms": 0}):  # refused before its arguments
            r = ctl(cmd="set_fault", **req)
            assert r["ok"] is False and r["error"]["code"] == "conflict", (req, r)
            assert r["error"]["field"] == "faults.enabled" and "faults.enabled: true" in r["error"]["message"], r
        why = r["error"]["message"]
        listed = ctl(cmd="list_faults")
        assert listed["ok"] and listed["enabled"] is False and listed["faults"] == [], listed
        r = ctl(cmd="clear_faults")
        assert r["ok"] and r["cleared"] == 0, r
        st = ctl(cmd="stats")["dataplane_reasons"]
        assert all(st[k] == 0 for k in ("fault_drop", "fault_duplicate", "fault_reorder", "fault_bypass")), st
    stop_by(proc, ctl)
    refused = None
    for bad, field in (({"enabled": "yes"}, "faults.enabled"), ({"max_duration_ms": 0}, "faults.max_duration_ms"),
                       ({"enable": True}, "faults.enable")):
        p2, _, _ = start_dataplane(tmp, in_pcap, [], 1, extra={"faults": bad})
        _, err = p2.communicate(timeout=60)
        assert p2.returncode != 0 and field in err, (bad, p2.returncode, err[-2000:])
        refused = err.strip().splitlines()[-1]
    print("faults_refused: set_fault refused without faults.enabled (%r); a bad faults section stops the box "
          "(%r)" % (why[:60], refused[:90]))


def fault_counts(ctl):
    st = ctl(cmd="stats")
    return st["dataplane_reasons"], st["reasons"]


def faults_scenario(tmp, rng):
    """faults.enabled, ring 1 of 3 ranks, traffic in phases over veth pairs:
    bad arguments refused by field; bypass forwards every INA frame of the ring
    byte-identical (scapy compares bytes) past the engine; cleared, drop 1.0 drops
    every one and counts it; the drop fault expires on time and the same frames
    then aggregate exactly (numpy); duplicate 1.0 hands the engine every packet
    twice and the sums stay exact."""
    pmtu, ppm, ranks = 256, 4, 3
    frames, data, cap = ina_packets(1, ranks, 1, 2, ppm, pmtu, rng)
    msg0, msg1 = frames[:ppm * ranks], frames[ppm * ranks:]
    others = other_traffic(1)
    extra = {"faults": {"enabled": True, "max_duration_ms": 60000, "seed": 7}}
    with VethBox(tmp, [ring_spec(1, ranks, 1, ppm, pmtu)], extra=extra) as box:
        ctl = box.ctl

        def bad(req, field, code="invalid_argument"):
            r = ctl(cmd="set_fault", **req)
            assert r["ok"] is False and r["error"]["code"] == code and r["error"]["field"] == field, (req, r)
            return r["error"]["message"]
        ok = {"ring": 1, "kind": "drop", "fraction": 0.5, "duration_ms": 1000}
        msgs = [bad(dict(ok, fraction=1.5), "fraction"), bad(dict(ok, fraction=-0.1), "fraction"),
                bad(dict(ok, fraction="half"), "fraction"), bad(dict(ok, duration_ms=0), "duration_ms"),
                bad(dict(ok, duration_ms=60001), "duration_ms"), bad({k: v for k, v in ok.items() if k != "duration_ms"},
                                                                     "duration_ms"),
                bad(dict(ok, ring=9), "ring", "not_found"), bad(dict(ok, ring="some"), "ring"),
                bad(dict(ok, kind="explode"), "kind")]
        assert "faults.max_duration_ms" in msgs[4], msgs[4]
        assert ctl(cmd="list_faults")["faults"] == [], "a refused request left a fault"

        # Bypass: the ring's frames leave untouched; the engine never sees them.
        dp0, en0 = fault_counts(ctl)
        r = ctl(cmd="set_fault", ring=1, kind="bypass", duration_ms=60000)
        assert r["ok"] and [(f["ring"], f["kind"], f["fraction"]) for f in r["faults"]] == [(1, "bypass", 1.0)], r
        got = box.send(others[:3] + frames + others[3:])
        outs = [raw(f) for f in got]
        for f in frames + others:
            assert raw(f) in outs, "not forwarded byte-identical under bypass: %s" % f.summary()
        ina_out = [f for f in got if BTH in f and f[BTH].opcode in (0x06, 0x07, 0x08, 0x09)]
        assert len(ina_out) == len(frames), (len(ina_out), len(frames))
        dp1, en1 = fault_counts(ctl)
        assert dp1["fault_bypass"] - dp0["fault_bypass"] == len(frames), dp1
        engine_seen = sum(en1[k] - en0[k] for k in en1 if k not in ("fwd_not_write", "fwd_not_roce", "fwd_unparsed",
                                                                        "fwd_no_ina", "fwd_not_ring_link"))
        assert engine_seen == 0, "the engine saw %d of the bypassed packets: %s" % (engine_seen, en1)
        listed = ctl(cmd="list_faults")["faults"]
        assert listed[0]["packets"] == len(frames) and 0 < listed[0]["remaining_ms"] <= 60000, listed
        # An ordinary WRITE on a ring link (a job that failed over to the ring
        # path) whose first packet passes under the bypass and whose last one
        # after it ends: the engine saw the first (recorded its write), so
        # the last is forwarded too, not dropped as first_packet_lost.
        first, last = ordinary_write(1, pmtu)
        got = box.send([first])
        assert raw(first) in [raw(f) for f in got], "the ordinary first packet was not forwarded under bypass"
        r = ctl(cmd="clear_faults", ring=1)
        assert r["ok"] and r["cleared"] == 1 and r["faults"] == [], r
        got = box.send([last])
        _, en_last = fault_counts(ctl)
        assert raw(last) in [raw(f) for f in got], "the write's last packet was dropped after the bypass ended: %s" % {
            k: en_last[k] - en1[k] for k in en_last if en_last[k] != en1[k]}

        # Drop 1.0 on every ring, for 4 s: nothing of the ring leaves; then it expires.
        r = ctl(cmd="set_fault", ring="all", kind="drop", fraction=1.0, duration_ms=4000)
        assert r["ok"], r
        t_set = time.time()
        got = box.send(msg0 + others[3:], settle=1.0)
        ina_out = [f for f in got if BTH in f and f[BTH].opcode in (0x06, 0x07, 0x08, 0x09)]
        assert not ina_out, "%d packets left the box under drop 1.0" % len(ina_out)
        for o in others[3:]:
            assert raw(o) in {raw(f) for f in got}, "other traffic dropped: %s" % o.summary()
        dp2, _ = fault_counts(ctl)
        assert dp2["fault_drop"] - dp1["fault_drop"] == len(msg0), dp2
        listed = ctl(cmd="list_faults")["faults"]
        assert len(listed) == 1 and listed[0]["packets"] == len(msg0) and listed[0]["kind"] == "drop", listed
        while ctl(cmd="list_faults")["faults"]:
            assert time.time() - t_set < 10, "the 4 s drop fault is still listed after 10 s"
            time.sleep(0.1)
        expired_after = time.time() - t_set
        assert expired_after >= 3.9, "the drop fault ended after %.1f s of 4" % expired_after
        got = box.send(msg0)
        n = check_released(got, frames, data, ranks, pmtu, cap)
        assert n == len(msg0), "after the fault expired: released %d of %d" % (n, len(msg0))

        # Duplicate 1.0: every packet reaches the engine twice; the sums stay exact.
        _, en2 = fault_counts(ctl)
        dp2, _ = fault_counts(ctl)
        assert ctl(cmd="set_fault", ring=1, kind="duplicate", fraction=1.0, duration_ms=60000)["ok"]
        got = box.send(msg1)
        n = check_released(got, frames, data, ranks, pmtu, cap)
        assert n >= len(msg1), "under duplicate: released %d of %d" % (n, len(msg1))
        dp3, en3 = fault_counts(ctl)
        assert dp3["fault_duplicate"] - dp2["fault_duplicate"] == len(msg1), dp3
        engine_seen = sum(en3[k] - en2[k] for k in ("held", "duplicate", "served_from_cell"))
        assert engine_seen == 2 * len(msg1), "the engine saw %d packets, not twice %d: %s" % (
            engine_seen, len(msg1), {k: en3[k] - en2[k] for k in en3 if en3[k] != en2[k]})
        r = ctl(cmd="clear_faults")
        assert r["ok"] and r["cleared"] == 1, r
        final = box.stop()
    check_reason_surfaces(final, {k: 0 for k in final["dataplane_reasons"]})
    assert final["dataplane_reasons"]["fault_bypass"] == len(frames)
    assert final["dataplane_reasons"]["fault_drop"] == len(msg0)
    assert final["dataplane_reasons"]["fault_duplicate"] == len(msg1)
    print("faults: %d bad requests refused by field (e.g. %r); bypass: %d frames byte-identical, engine untouched; "
          "drop 1.0: %d dropped, expired after %.1f s, then exact; duplicate 1.0: %d copies, sums exact" % (
              len(msgs), msgs[4][:70], len(frames), len(msg0), expired_after, len(msg1)))


def faults_reorder_scenario(tmp, in_pcap, rng):
    """Reorder under full bursts: the input loops (net_pcap), so bursts are full
    and a held packet has a later one of its ring to follow. Reorder 1.0 swaps
    packets and counts them, the per-fault count matches the reason counter, and
    once cleared the counter stands still while the box keeps forwarding: nothing
    stays held. A 1 s fault of another kind ends by itself."""
    frames, _, _ = ina_packets(1, 3, 1, 2, 4, 256, rng)
    wrpcap(in_pcap, frames + other_traffic(1))
    proc, sock, _ = start_dataplane(tmp, in_pcap, [ring_spec(1, 3, 1, 4, 256)], 1, loop=True,
                                    extra={"faults": {"enabled": True}})
    with dump_box_on_failure(proc):
        ctl = Control(sock)
        wait_port1_tx(ctl, 30)
        assert ctl(cmd="set_fault", ring=1, kind="reorder", fraction=1.0, duration_ms=60000)["ok"]
        time.sleep(1.0)
        listed = ctl(cmd="list_faults")["faults"]
        assert ctl(cmd="clear_faults")["cleared"] == 1
        a, _ = fault_counts(ctl)
        assert a["fault_reorder"] > 100, a
        assert listed[0]["packets"] > 100 and listed[0]["packets"] <= a["fault_reorder"], (listed, a)
        tx = port1_tx(ctl)
        time.sleep(0.5)
        b, _ = fault_counts(ctl)
        assert b["fault_reorder"] == a["fault_reorder"], "reordering went on after the clear: %s" % b
        assert port1_tx(ctl) > tx, "the box stopped forwarding after the reorder fault"
        assert ctl(cmd="set_fault", ring=1, kind="drop", fraction=0.25, duration_ms=1000)["ok"]
        t0 = time.time()
        while ctl(cmd="list_faults")["faults"]:
            assert time.time() - t0 < 5, "a 1 s fault still listed after 5 s"
            time.sleep(0.05)
        c, _ = fault_counts(ctl)
        time.sleep(0.3)
        d, _ = fault_counts(ctl)
        assert c["fault_drop"] > 0 and d["fault_drop"] == c["fault_drop"], (c, d)
    stop_by(proc, ctl)
    print("faults_reorder: %d packets reordered in 1 s of a looping input, none after the clear; a 1 s drop "
          "0.25 fault dropped %d and ended by itself" % (a["fault_reorder"], c["fault_drop"]))


SCENARIOS = {
    "faults_refused": lambda tmp, in_pcap, rng: faults_refused_scenario(tmp, in_pcap),
    "faults": lambda tmp, in_pcap, rng: faults_scenario(tmp, rng),
    "faults_reorder": faults_reorder_scenario,
}


if __name__ == "__main__":
    main(SCENARIOS)
