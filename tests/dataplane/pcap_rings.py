#!/usr/bin/python3
"""The lifecycle and placement of rings, on the data plane's pcap box (tests/dataplane/pcapbox.py).

A ring removed while traffic flows releases exactly its held packets; removed
mid-message, nothing later of it leaves the box; set_mode forward against
installed and retiring rings; rings sharing links placed on workers.

Usage: pcap_rings.py <netreduce-dataplane> remove_while_flowing|remove_mid_message|modes|placement
"""
import time

from scapy.all import IP, wrpcap, raw
from scapy.contrib.roce import BTH

from pcapbox import (Control, VethBox, check_released, dump_box_on_failure, ina_packets, ip, main, other_traffic,
                     ring_spec, run_dataplane, start_dataplane, stop_by)


def remove_while_flowing_scenario(tmp, in_pcap, rng):
    """The input loops (ranks 0 and 1 only: every cell stays open, packets are held); the ring is
    removed mid-traffic and exactly its held packets are released, counted ring_removed."""
    pmtu, ppm = 1024, 4
    frames, data, cap = ina_packets(1, 3, 1, 2, ppm, pmtu, rng)
    # Only ranks 0 and 1 send: every cell stays open, packets are held.
    partial = [f for f in frames if f[IP].src != ip(2, 1)]
    wrpcap(in_pcap, partial)

    def remove(ctl):
        time.sleep(1.0)
        before = ctl(cmd="status")["mbufs"]["in_use"]
        remove.held = ctl(cmd="get_ring", id=1)["ring"]["held_packets"]
        r = ctl(cmd="remove_ring", id=1)
        assert r["ok"], r
        assert ctl(cmd="remove_ring", id=1)["error"]["code"] == "not_found"
        remove.before = before
    out, final, status, rings = run_dataplane(tmp, in_pcap, [ring_spec(1, 3, 1, ppm, pmtu)], 1,
                                              loop=True, during=remove)
    assert rings["rings"] == [], rings
    # Exactly the held packets were released with the reason, none leaked.
    assert final["reasons"]["ring_removed"] == remove.held > 0, (remove.held, final["reasons"])
    print("remove_while_flowing: %d packets held before removal, ring_removed=%d, after: unknown_ring=%d "
          "first_packet_lost=%d fwd_no_ina=%d, mbufs in use at the end %d" %
          (remove.before, final["reasons"]["ring_removed"], final["reasons"]["unknown_ring"],
           final["reasons"]["first_packet_lost"], final["reasons"]["fwd_no_ina"],
           status["mbufs"]["in_use"]))


def remove_mid_message_scenario(tmp, rng):
    """The real box, traffic in phases: message 0 complete, message 1 with
    positions 0-1 complete and position 2 held for two ranks. The ring is
    removed. Then the rest of message 1, go-back-N resends of everything
    rank 0 and 1 sent of it, and the first packets of message 2: none of them
    may leave the box (before retirement, these later packets were forwarded
    raw with valid ICRCs and receivers accepted them as results)."""
    pmtu, ppm, ranks = 256, 4, 3
    frames, data, cap = ina_packets(1, ranks, 1, 3, ppm, pmtu, rng)

    def pos(f):  # (message, position, rank) of a frame of ina_packets
        rank = int(f[IP].src.split(".")[3]) - 1
        rel = (f[BTH].psn - (1000 + rank * 100)) & 0xFFFFFF
        m, k = divmod(rel, ppm)
        return m, k, rank
    by = {pos(f): f for f in frames}
    phase1 = [by[(0, k, r)] for k in range(ppm) for r in range(ranks)]
    phase1 += [by[(1, k, r)] for k in (0, 1) for r in range(ranks)]
    phase1 += [by[(1, 2, r)] for r in (0, 1)]  # held: rank 2's position 2 never came
    late = [by[(1, 2, 2)]] + [by[(1, 3, r)] for r in range(ranks)]  # the rest of message 1
    resends = [by[(1, k, r)] for r in (0, 1) for k in range(ppm)]  # go-back-N from position 0
    nxt = [by[(2, 0, r)] for r in range(ranks)]  # the next message's first packets
    phase2 = late + resends + nxt
    others = other_traffic(1)
    with VethBox(tmp, [ring_spec(1, ranks, 1, ppm, pmtu)], extra={"rings": {"retire_grace_ms": 60000}}) as box:
        ctl = box.ctl
        got1 = box.send(phase1)
        n1 = check_released(got1, frames, data, ranks, pmtu, cap)
        assert n1 == 4 * ranks + 2 * ranks, "released %d before the removal, expected %d" % (n1, 6 * ranks)
        assert ctl(cmd="get_ring", id=1)["ring"]["held_packets"] == 2
        assert ctl(cmd="remove_ring", id=1)["ok"]
        before = ctl(cmd="stats")["reasons"]
        assert before["ring_removed"] == 2, before
        got2 = box.send(others[:3] + phase2 + others[3:])
        ina_out = [f for f in got2 if BTH in f and f[BTH].opcode in (0x06, 0x07, 0x08, 0x09)]
        assert not ina_out, "%d packets of the removed ring left the box, e.g. %s (psn %d)" % (
            len(ina_out), ina_out[0][IP].src, ina_out[0][BTH].psn)
        outs = {raw(f) for f in got2}
        for o in others:
            assert raw(o) in outs, "not forwarded unchanged after the removal: %s" % o.summary()
        after = ctl(cmd="stats")["reasons"]
        retired = after["ring_retired"] - before["ring_retired"]
        assert retired == len(phase2), "ring_retired counted %d of the %d late packets: %s" % (
            retired, len(phase2), after)
        final = box.stop()
    print("remove_mid_message: %d frames released byte-exact before the removal, 2 held ones freed "
          "(ring_removed); %d later packets, resends and next-message packets all dropped as "
          "ring_retired, none left the box; %d other frames forwarded unchanged" %
          (n1, len(phase2), len(others)))


def wait_retired(ctl, timeout=20):
    t_end = time.time() + timeout
    while ctl(cmd="status")["retiring"]:
        assert time.time() < t_end, "rings still retiring after %d s" % timeout
        time.sleep(0.1)


def modes_scenario(tmp, in_pcap):
    """set_mode forward is refused while a ring is installed or retiring, and
    rings are refused in forward mode (forward mode would hand a running job
    unreduced data)."""
    wrpcap(in_pcap, [])
    spec = ring_spec(1, 3, 1, 4, 1024)
    proc, sock, _ = start_dataplane(tmp, in_pcap, [spec], 1, extra={"rings": {"retire_grace_ms": 1000}})
    with dump_box_on_failure(proc):
        ctl = Control(sock)
        r = ctl(cmd="set_mode", mode="forward")
        assert r["ok"] is False and r["error"]["code"] == "conflict" and r["error"]["field"] == "mode", r
        assert "installed: 1" in r["error"]["message"], r
        refused_msg = r["error"]["message"]
        assert ctl(cmd="status")["mode"] == "aggregate"
        assert ctl(cmd="remove_ring", id=1)["ok"]
        st = ctl(cmd="status")
        assert [x["id"] for x in st["retiring"]] == [1] and 0 < st["retiring"][0]["seconds_left"] <= 1.2, st
        assert st["rings"] == 0 and st["retire_grace_ms"] == 1000, st
        r = ctl(cmd="set_mode", mode="forward")
        assert r["ok"] is False and "retiring: 1" in r["error"]["message"], r
        r = ctl(cmd="remove_ring", id=1)
        assert r["error"]["code"] == "not_found" and "retiring" in r["error"]["message"], r
        listed = ctl(cmd="list_rings")
        assert listed["rings"] == [] and [x["id"] for x in listed["retiring"]] == [1], listed
        # The same id may come back at once (a relaunched job); forward stays refused.
        assert ctl(cmd="install_ring", ring=spec)["ok"]
        r = ctl(cmd="set_mode", mode="forward")
        assert r["ok"] is False and "installed: 1; retiring: 1" in r["error"]["message"], r
        assert ctl(cmd="remove_ring", id=1)["ok"]
        assert [x["id"] for x in ctl(cmd="status")["retiring"]] == [1, 1]
        wait_retired(ctl)
        r = ctl(cmd="set_mode", mode="forward")
        assert r["ok"] and r["previous"] == "aggregate", r
        r = ctl(cmd="install_ring", ring=spec)
        assert r["ok"] is False and r["error"]["field"] == "mode", r
        assert ctl(cmd="set_mode", mode="aggregate")["ok"]
        assert ctl(cmd="install_ring", ring=spec)["ok"], "the id is free again after the grace"
    stop_by(proc, ctl)
    print("modes: forward refused with a ring installed (%r) and while it retired; allowed after the "
          "grace; rings refused in forward mode" % refused_msg[:70])


def placement_scenario(tmp, rng):
    """Two workers: ring 1 on one, ring 2 on the other. A ring sharing a link
    with each is refused (it would re-point one of them); a ring sharing a link
    with ring 1 only joins ring 1's worker, and its removal leaves ring 1's
    link where it was. Then both rings aggregate byte-exact."""
    pmtu, ppm = 256, 4
    fa, da, cap = ina_packets(1, 3, 1, 2, ppm, pmtu, rng)
    fb, db, _ = ina_packets(2, 2, 2, 2, ppm, pmtu, rng)
    with VethBox(tmp, [ring_spec(1, 3, 1, ppm, pmtu), ring_spec(2, 2, 2, ppm, pmtu)], workers=2) as box:
        ctl = box.ctl
        owners = {r["spec"]["id"]: r["worker"] for r in ctl(cmd="list_rings")["rings"]}
        assert owners[1] != owners[2], owners
        both = dict(ring_spec(3, 4, 3, ppm, pmtu), members=[ip(0, 1), ip(1, 1), ip(0, 2), ip(1, 2)])
        r = ctl(cmd="install_ring", ring=both)
        assert r["ok"] is False and r["error"]["code"] == "conflict" and r["error"]["field"] == "members", r
        msg = r["error"]["message"]
        assert "ring 1 on worker %d" % owners[1] in msg and "ring 2 on worker %d" % owners[2] in msg, msg
        one = dict(ring_spec(4, 3, 4, ppm, pmtu), members=[ip(0, 1), ip(1, 1), "10.4.0.9"])
        assert ctl(cmd="install_ring", ring=one)["ok"]
        placed = {r["spec"]["id"]: r["worker"] for r in ctl(cmd="list_rings")["rings"]}
        assert placed == {1: owners[1], 2: owners[2], 4: owners[1]}, placed
        assert ctl(cmd="remove_ring", id=4)["ok"]
        mixed = [x for pair in zip(fa, fb) for x in pair] + fa[len(fb):] + fb[len(fa):]
        got = box.send(mixed)
        oa = [f for f in got if IP in f and f[IP].src.startswith("10.1.")]
        ob = [f for f in got if IP in f and f[IP].src.startswith("10.2.")]
        na = check_released(oa, fa, da, 3, pmtu, cap)
        nb = check_released(ob, fb, db, 2, pmtu, cap)
        assert (na, nb) == (len(fa), len(fb)), "released %d of %d (ring 1) and %d of %d (ring 2)" % (
            na, len(fa), nb, len(fb))
        final = box.stop()
        assert final["reasons"]["unknown_ring"] == 0, final["reasons"]
    print("placement: rings 1 and 2 on workers %d and %d; a ring sharing links with both refused (%r); "
          "a ring sharing ring 1's link joined worker %d and left; %d + %d frames aggregated byte-exact" %
          (owners[1], owners[2], msg[:90], owners[1], na, nb))


SCENARIOS = {
    "remove_while_flowing": remove_while_flowing_scenario,
    "remove_mid_message": lambda tmp, in_pcap, rng: remove_mid_message_scenario(tmp, rng),
    "modes": lambda tmp, in_pcap, rng: modes_scenario(tmp, in_pcap),
    "placement": lambda tmp, in_pcap, rng: placement_scenario(tmp, rng),
}


if __name__ == "__main__":
    main(SCENARIOS)
