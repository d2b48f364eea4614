#!/usr/bin/python3
"""Multi-rack tree nodes on one data plane, on its pcap box (tests/dataplane/pcapbox.py).

A leaf's partials go up and the parent's results into its held packets; a
root's results go down through each child's port; on 2 workers box-to-box
frames are steered by tree id; malformed, forged, altered and stale box-to-box
frames for the box are dropped on every worker arrangement; malformed "tree"
fields are refused by name. Box-to-box frames are built and checked with
tests/tools/b2b_golden.py's scapy layer and mac, never with the box's code; the
test installation of a tree here (boxes, epoch, key) is also
tests/dataplane/tree_fabric_test.py's.

Usage: pcap_trees.py <netreduce-dataplane> tree_bad_json|tree_leaf|tree_root|tree_steering|tree_malformed
"""
import os
import struct
import sys

import numpy as np
from scapy.all import Ether, IP, IPOption_NOP, UDP, Raw, PcapWriter, fragment, rdpcap, wrpcap, raw
from scapy.contrib.roce import BTH

from pcapbox import FP32, SUM, check_headers, ina_packets, ip, main, ring_spec, run_dataplane

# Box-to-box frames are built and checked with tests/tools/b2b_golden.py's scapy
# layer (its own field description and rendering of the mac), never with the box's code.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from b2b_golden import B2B, HDR_LEN, key_id, mac_of, sealed  # noqa: E402


# The test installation of every tree here: its epoch and key.
TREE_EPOCH = 0x5EED0001
TREE_KEY = bytes(range(0x40, 0x60))

LEAF = {"ip": "10.9.0.1", "mac": "02:00:00:00:09:01"}
LEAF2 = {"ip": "10.9.0.2", "mac": "02:00:00:00:09:02"}
SPINE = {"ip": "10.9.0.9", "mac": "02:00:00:00:09:09"}
B2B_PORT = 4792


def position_data(d, k, pmtu):
    """The data of packet position k of a message (float32 elements of d; the INA header
    is not data)."""
    lo = 0 if k == 0 else (k * pmtu - 24) // 4
    return d[lo: lo + ((pmtu - 24) // 4 if k == 0 else pmtu // 4)]


def b2b_frame(src, dst, kind, tree_id, m, k, msg_len, child, data, epoch=TREE_EPOCH, key=TREE_KEY):
    d = data.tobytes()
    return (Ether(src=src["mac"], dst=dst["mac"]) / IP(src=src["ip"], dst=dst["ip"], flags="DF", ttl=64)
            / UDP(sport=0xC123, dport=B2B_PORT, chksum=0)
            / sealed(key, d, kind=kind, tree_id=tree_id, msg_id=m, k=k, msg_len=msg_len, child=child,
                     dtype=FP32, op=SUM, epoch=epoch)
            / Raw(d))


def check_b2b(f, src, dst, kind, tree_id, msg_len, child):
    """A frame the box sent: addresses, a valid IPv4 checksum, UDP checksum 0, the header's
    fields, epoch and mac (recomputed here with the tree's key). Returns (m, k, data as float32)."""
    b = raw(f)
    assert f[Ether].src == src["mac"] and f[Ether].dst == dst["mac"], f.summary()
    assert f[IP].src == src["ip"] and f[IP].dst == dst["ip"], f.summary()
    ipc = f[IP].chksum
    again = f[IP].copy()
    again.chksum = None
    assert IP(raw(again)).chksum == ipc, "bad IPv4 checksum"
    assert f[UDP].chksum == 0 and f[UDP].dport == B2B_PORT, f.summary()
    h = f[B2B]
    payload = raw(f[UDP].payload)
    assert mac_of(payload, TREE_KEY) == h.mac, "bad mac"
    assert (h.magic, h.version, h.kind, h.tree_id, h.msg_len, h.child, h.dtype, h.op, h.epoch) == \
        (0x4E52, 2, kind, tree_id, msg_len, child, FP32, SUM, TREE_EPOCH), h.show(dump=True)
    data = payload[HDR_LEN:]
    assert h.length == len(data)
    assert len(b) == 14 + 20 + 8 + HDR_LEN + len(data), "frame length"
    return h.msg_id, h.k, np.frombuffer(data, dtype=np.float32)


def leaf_tree():
    return {"self": LEAF, "children": [{"rank": 0}, {"rank": 1}],
            "parent": dict(SPINE, port="b"), "index_at_parent": 1,
            "epoch": TREE_EPOCH, "key": TREE_KEY.hex()}


def reported(tree):
    """A tree as the box reports it: boxes written out, the key (a secret) replaced by its
    key_id."""
    out = {k: v for k, v in dict({"boxes": []}, **tree).items() if k != "key"}
    out["key_id"] = key_id(bytes.fromhex(tree["key"]))
    return out


def tree_leaf_scenario(tmp, in_pcap, rng, workers=1):
    """A leaf with ranks 0 and 1 of a 4-rank ring: their WRITEs are held, the partial
    (numpy sum of the two) goes up toward the parent by port B; the parent's results
    (later in the same capture) are written into the held packets, which leave with valid
    ICRCs; ranks 2 and 3 (another rack) pass untouched. With 2 workers the ring sits on the
    one without the RX queue: its local ranks' packets (by link) and the parent's results
    (by tree id) must both reach it."""
    pmtu, ppm, msgs, rid = 1024, 4, 2, 21
    frames, data, cap = ina_packets(rid, 4, 5, msgs, ppm, pmtu, rng)
    total = {}
    results = []
    for m in range(msgs):
        rack0 = (data[(0, m)] + data[(1, m)]).astype(np.float32)
        rack1 = (data[(2, m)] + data[(3, m)]).astype(np.float32)
        total[m] = (rack0 + rack1).astype(np.float32)  # the parent's result, in child order
        for k in range(ppm):
            results.append(b2b_frame(SPINE, LEAF, 2, rid, m, k, ppm, 1, position_data(total[m], k, pmtu)))
    wrpcap(in_pcap, frames + results)
    specs = [dict(ring_spec(rid, 4, 5, ppm, pmtu), tree=leaf_tree())]
    if workers > 1:  # an ordinary ring first takes worker 0 (the one with the RX queue)
        specs.insert(0, ring_spec(1, 2, 1, ppm, pmtu))
    out, final, status, rings = run_dataplane(tmp, in_pcap, specs, workers)
    local = {ip(0, 5), ip(1, 5)}
    # Ranks 2 and 3: byte-identical.
    outs = {raw(f) for f in out}
    remote = [f for f in frames if f[IP].src not in local]
    for f in remote:
        assert raw(f) in outs, "a frame of another rack was changed or lost: %s" % f.summary()
    # Partials: one per position, the numpy sum of ranks 0 and 1, to the parent.
    partials = [f for f in out if UDP in f and f[UDP].dport == B2B_PORT]
    assert len(partials) == msgs * ppm, "%d partials" % len(partials)
    seen = set()
    for f in partials:
        m, k, got = check_b2b(f, LEAF, SPINE, 1, rid, ppm, 1)
        want = position_data((data[(0, m)] + data[(1, m)]).astype(np.float32), k, pmtu)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "partial (%d, %d)" % (m, k)
        seen.add((m, k))
    assert seen == {(m, k) for m in range(msgs) for k in range(ppm)}
    # The held packets left with the parent's result and a valid ICRC (scapy).
    by_key = {(f[IP].src, f[BTH].psn): raw(f) for f in frames}
    released = 0
    for f in out:
        if BTH not in f or f[IP].src not in local:
            continue
        b = raw(f)
        orig = by_key[(f[IP].src, f[BTH].psn)]
        assert len(b) == len(orig)
        assert struct.unpack("<I", Ether(b)[BTH].compute_icrc(None))[0] == struct.unpack("<I", b[-4:])[0], \
            "bad ICRC"
        op = f[BTH].opcode
        off = 14 + 20 + 8 + 12 + (16 + 24 if op == 0x06 else 0) + (4 if op == 0x09 else 0)
        r = 0 if f[IP].src == ip(0, 5) else 1
        m, k = divmod((f[BTH].psn - (1000 + r * 100)) & 0xFFFFFF, ppm)
        check_headers(b, orig, off, op, m, total[m])
        got = np.frombuffer(b[off:-4], dtype=np.float32)
        want = position_data(total[m], k, pmtu)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "result (%d, %d) rank %d" % (m, k, r)
        released += 1
    assert released == 2 * msgs * ppm, "released %d" % released
    assert len(out) == len(remote) + len(partials) + released, "unexpected frames out: %d" % len(out)
    ring = [r for r in rings["rings"] if r["spec"]["id"] == rid][0]
    assert ring["spec"]["tree"] == reported(leaf_tree()), ring["spec"]
    tree = ring["counters"]["tree"]
    want = {"partials_sent": msgs * ppm, "partials_resent": 0, "partials_received": 0,
            "results_received": msgs * ppm, "results_sent": 0, "results_resent": 0,
            "queries_sent": 0, "finals_sent": 0, "finals_received": 0}
    assert {k: tree.get(k) for k in want} == want, tree
    assert ring["counters"]["cells_completed"] == msgs * ppm and ring["held_packets"] == 0, ring
    reasons = final["reasons"]
    assert reasons["held"] == 2 * msgs * ppm and reasons["result_taken"] == msgs * ppm, reasons
    # The other rack's first packets meet no ring link of this box; their later ones then
    # belong to no message the box tracks (ordinary traffic): all forwarded.
    firsts = sum(1 for f in remote if f[BTH].opcode == 0x06)
    assert reasons["fwd_not_ring_link"] == firsts and \
        reasons["fwd_not_ring_link"] + reasons["fwd_no_ina"] == len(remote), reasons
    # Memory: the leaf keeps no child box data; the reservation is the ring's.
    assert status["memory"]["engine_reserved_bytes"] == sum(r["memory_bytes"] for r in rings["rings"]), \
        (status["memory"], rings["rings"])
    dispatched = [w["dispatched"] for w in final["workers"]]
    if workers > 1:
        assert ring["worker"] == 1, ring["worker"]
        # The local ranks' packets and the parent's results went over; the other rack's did not.
        assert dispatched == [2 * msgs * ppm + len(results), 0], dispatched
    print("tree_leaf (%d worker%s): %d partials up (numpy sums, mac ok), %d held packets released with "
          "the parent's result (ICRC ok), %d frames of the other rack untouched; dispatched %s" %
          (workers, "s" if workers > 1 else "", len(partials), released, len(remote), dispatched))


def root_tree():
    return {"self": SPINE, "children": [{"box": 0}, {"box": 1}],
            "boxes": [dict(LEAF, port="a"), dict(LEAF2, port="b")],
            "epoch": TREE_EPOCH, "key": TREE_KEY.hex()}


def tree_root_scenario(tmp, in_pcap, rng, workers):
    """A root with two child boxes and no local rank: partials from both in (port A), the
    result (numpy, child order) out to each child through its own port: leaf 1 by port A,
    leaf 2 by port B. With 2 workers the ring sits on the worker without the RX queue: the
    box-to-box frames must be steered to it by tree id."""
    pmtu, ppm, msgs, rid = 1024, 3, 2, 22
    cap = ppm * pmtu - 24
    parts, frames = {}, []
    for m in range(msgs):
        for c in range(2):
            parts[(c, m)] = (rng.integers(-1000, 1000, cap // 4) / 8).astype(np.float32)
        for k in range(ppm):
            for c, box in ((1, LEAF2), (0, LEAF)):  # arrival order is not child order
                frames.append(b2b_frame(box, SPINE, 1, rid, m, k, ppm, c, position_data(parts[(c, m)], k, pmtu)))
    # A frame for another box crosses untouched.
    transit = b2b_frame(LEAF, {"ip": "10.9.0.7", "mac": "02:00:00:00:09:07"}, 1, rid, 0, 0, ppm, 0,
                        position_data(parts[(0, 0)], 0, pmtu))
    wrpcap(in_pcap, frames + [transit])
    rings = [dict(ring_spec(rid, 4, 6, ppm, pmtu), tree=root_tree())]
    if workers > 1:  # an ordinary ring first takes worker 0 (the one with the RX queue)
        rings.insert(0, ring_spec(1, 2, 1, ppm, pmtu))
    out1, final, status, listed = run_dataplane(tmp, in_pcap, rings, workers)
    out0 = rdpcap(os.path.join(tmp, "out0.pcap"))
    ring = [r for r in listed["rings"] if r["spec"]["id"] == rid][0]
    for port, out, child, box in ((0, out0, 0, LEAF), (1, out1, 1, LEAF2)):
        res = [f for f in out if UDP in f and f[UDP].dport == B2B_PORT and f[IP].dst == box["ip"]]
        assert len(res) == msgs * ppm, "port %d: %d results for child %d" % (port, len(res), child)
        seen = set()
        for f in res:
            m, k, got = check_b2b(f, SPINE, box, 2, rid, ppm, child)
            want = position_data((parts[(0, m)] + parts[(1, m)]).astype(np.float32), k, pmtu)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "result (%d, %d)" % (m, k)
            seen.add((m, k))
        assert len(seen) == msgs * ppm
    assert raw(transit) in {raw(f) for f in out1}, "a frame for another box was not forwarded untouched"
    assert len(out0) == msgs * ppm and len(out1) == msgs * ppm + 1, (len(out0), len(out1))
    tree = ring["counters"]["tree"]
    assert tree["partials_received"] == 2 * msgs * ppm and tree["results_sent"] == 2 * msgs * ppm, tree
    assert tree["partials_sent"] == 0 and tree["results_received"] == 0, tree
    reasons = final["reasons"]
    assert reasons["partial_taken"] == 2 * msgs * ppm and reasons["fwd_b2b_transit"] == 1, reasons
    # The child boxes' partials are part of the ring's reservation (box_data).
    slots = 8  # window 4 -> 2N rounded up
    assert ring["memory_bytes"] >= slots * ppm * 2 * pmtu, ring
    assert status["memory"]["engine_reserved_bytes"] == ring["memory_bytes"] + (
        sum(r["memory_bytes"] for r in listed["rings"] if r["spec"]["id"] != rid)), status["memory"]
    dispatched = [w["dispatched"] for w in final["workers"]]
    if workers > 1:
        assert ring["worker"] == 1, ring["worker"]
        # Every partial, and the frame for another box (its tree id is this ring's), went over.
        assert dispatched[0] == len(frames) + 1 and dispatched[1] == 0, dispatched
    print("tree_root (%d worker%s): %d partials in, %d results out (port A %d, port B %d), exact; "
          "dispatched %s" % (workers, "s" if workers > 1 else "", len(frames), 2 * msgs * ppm,
                             msgs * ppm, msgs * ppm, dispatched))


def tree_steering_scenario(tmp, in_pcap, rng):
    """The root, then the leaf, on 2 workers with the tree on the worker without the RX queue:
    box-to-box frames steered to it by tree id."""
    tree_root_scenario(tmp, in_pcap, rng, 2)
    leaf = os.path.join(tmp, "leaf")
    os.mkdir(leaf)
    tree_leaf_scenario(leaf, os.path.join(leaf, "in.pcap"), rng, 2)


def broken_b2b(src, dst, tree_id, data):
    """A partial from src to dst, broken in each way a box-to-box frame can be malformed, as
    (what, frame bytes): cut short of its IPv4 total length, as IPv4 fragments (scapy's, the
    later ones without a UDP header), with IPv4 options, with 20 of the header's 32 bytes; and
    a valid one of an unknown tree."""
    def partial(tree, **ip_over):
        return (Ether(src=src["mac"], dst=dst["mac"]) / IP(src=src["ip"], dst=dst["ip"], ttl=64, **ip_over)
                / UDP(sport=0xC123, dport=B2B_PORT, chksum=0)
                / B2B(kind=1, tree_id=tree, msg_id=0, k=0, msg_len=3, child=0, dtype=FP32, op=SUM)
                / Raw(data.tobytes()))
    out = [("cut short", raw(partial(tree_id, flags="DF"))[:-3])]
    whole = partial(tree_id)
    for i, frag in enumerate(fragment(whole[IP], fragsize=256)):
        out.append(("fragment %d" % i, raw(Ether(src=src["mac"], dst=dst["mac"]) / frag)))
    out.append(("IPv4 options", raw(partial(tree_id, flags="DF", options=[IPOption_NOP()] * 4))))
    short = raw(partial(tree_id, flags="DF")[B2B])[:20]
    out.append(("short header", raw(Ether(src=src["mac"], dst=dst["mac"])
                                    / IP(src=src["ip"], dst=dst["ip"], flags="DF", ttl=64)
                                    / UDP(sport=0xC123, dport=B2B_PORT, chksum=0) / Raw(short))))
    out.append(("unknown tree", raw(partial(99, flags="DF"))))
    return out


def untrusted_b2b(src, dst, tree_id, data):
    """A well-formed partial from src to dst that no box of this installation sent, as
    (what, frame bytes, reason): sealed with a guessed key, altered after sealing (one data
    bit), replayed from an earlier installation of the tree (its epoch and key)."""
    def partial(epoch=TREE_EPOCH, key=TREE_KEY):
        return raw(b2b_frame(src, dst, 1, tree_id, 0, 0, 3, 0, data, epoch, key))
    altered = bytearray(partial())
    altered[-1] ^= 0x01
    return [("forged", partial(key=bytes(32 * [0x11])), "b2b_bad_mac"),
            ("altered", bytes(altered), "b2b_bad_mac"),
            ("stale", partial(TREE_EPOCH - 1, bytes(32 * [0x22])), "b2b_stale_epoch")]


def write_frames(path, frames):
    """Frame bytes into a pcap as they are (scapy would rebuild a cut-short frame)."""
    w = PcapWriter(path, linktype=1, sync=True)
    for f in frames:
        w.write(f)
    w.close()


def tree_malformed_scenario(tmp, rng):
    """Malformed box-to-box frames for the box (cut short, fragments, IPv4 options, a short
    header, an unknown tree) are dropped under b2b_malformed / b2b_unknown_tree and never leave,
    and well-formed ones no box of the installation sent (forged, altered, stale) under
    b2b_bad_mac / b2b_stale_epoch,
    on 1 worker, on 2 with the tree on the worker without the RX queue (the frames reach an
    engine without the tree: dispatch cannot steer them by tree id), and on 2 with the tree on
    the RX worker. The same frames for another box, and UDP to the box's address on another
    port, leave byte-identical; the root still sums its children's partials."""
    pmtu, ppm, rid = 1024, 3, 22
    cap = ppm * pmtu - 24
    parts = {c: (rng.integers(-1000, 1000, cap // 4) / 8).astype(np.float32) for c in range(2)}
    partials = [raw(b2b_frame(box, SPINE, 1, rid, 0, k, ppm, c, position_data(parts[c], k, pmtu)))
                for k in range(ppm) for c, box in ((1, LEAF2), (0, LEAF))]
    d = position_data(parts[0], 0, pmtu)
    mine = broken_b2b(LEAF, SPINE, rid, d)
    untrusted = untrusted_b2b(LEAF, SPINE, rid, d)
    other = {"ip": "10.9.0.7", "mac": "02:00:00:00:09:07"}
    transit = broken_b2b(LEAF, other, rid, d)
    ordinary = raw(Ether(src=LEAF["mac"], dst=SPINE["mac"]) / IP(src=LEAF["ip"], dst=SPINE["ip"], flags="DF")
                   / UDP(sport=0xC123, dport=9999) / Raw(b"not box-to-box" * 8))
    # The untrusted frames come first: the cells they would poison are the ones summed.
    frames = [f for _, f, _ in untrusted] + [f for _, f in mine] + [f for _, f in transit] + [ordinary] + partials
    fragments = sum(1 for what, _ in mine if what.startswith("fragment"))
    assert fragments >= 3, fragments
    later = fragments - 1  # no UDP header: to another box not even known as box-to-box
    for name, workers, tree_first in (("1 worker", 1, True), ("2 workers, tree on the other", 2, False),
                                      ("2 workers, tree on the RX worker", 2, True)):
        run = os.path.join(tmp, name.replace(" ", "_").replace(",", ""))
        os.mkdir(run)
        in_pcap = os.path.join(run, "in.pcap")
        write_frames(in_pcap, frames)
        rings = [dict(ring_spec(rid, 4, 6, ppm, pmtu), tree=root_tree())]
        if workers > 1:
            plain = ring_spec(1, 2, 1, ppm, pmtu)
            rings = rings + [plain] if tree_first else [plain] + rings
        out1, final, status, listed = run_dataplane(run, in_pcap, rings, workers)
        out0 = rdpcap(os.path.join(run, "out0.pcap"))
        ring = [r for r in listed["rings"] if r["spec"]["id"] == rid][0]
        if workers > 1:
            assert ring["worker"] == (0 if tree_first else 1), (name, ring["worker"])
        left = [raw(f) for f in out0] + [raw(f) for f in out1]
        for what, f in mine + [(w, f) for w, f, _ in untrusted]:
            assert f not in left, "%s: a %s frame for the box was forwarded" % (name, what)
        got1 = [raw(f) for f in out1]
        for what, f in transit:
            assert got1.count(f) == 1, "%s: a %s frame for another box did not pass untouched" % (name, what)
        assert got1.count(ordinary) == 1, "%s: UDP to the box on another port did not pass untouched" % name
        results = [f for f in out0 + out1 if UDP in f and f[UDP].dport == B2B_PORT and f[IP].src == SPINE["ip"]]
        assert len(results) == 2 * ppm, "%s: %d results" % (name, len(results))
        for f in results:
            child, box = (0, LEAF) if f[IP].dst == LEAF["ip"] else (1, LEAF2)
            m, k, got = check_b2b(f, SPINE, box, 2, rid, ppm, child)
            want = position_data((parts[0] + parts[1]).astype(np.float32), k, pmtu)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "%s: result %d" % (name, k)
        assert len(out0) == ppm and len(out1) == ppm + len(transit) + 1, (name, len(out0), len(out1))
        reasons = final["reasons"]
        want = {"b2b_malformed": len(mine) - 1, "b2b_unknown_tree": 1, "partial_taken": 2 * ppm,
                "fwd_b2b_transit": len(transit) - later, "fwd_unparsed": later, "fwd_not_roce": 1,
                "b2b_bad_mac": 2, "b2b_stale_epoch": 1}
        assert {r: reasons[r] for r in want} == want, (name, {r: reasons[r] for r in want})
        dispatched = [w["dispatched"] for w in final["workers"]]
        if workers > 1 and not tree_first:
            # Only the well-formed frames of the tree went over (the valid partials and the
            # untrusted ones, judged by the tree's engine): the rest was judged by the RX
            # worker's engine, which holds no tree.
            assert dispatched == [2 * ppm + len(untrusted), 0], (name, dispatched)
            w0 = final["workers"][0]["reasons"]
            assert w0["b2b_malformed"] == len(mine) - 1 and w0["b2b_unknown_tree"] == 1, (name, w0)
        elif workers > 1:
            assert dispatched == [0, 0], (name, dispatched)
        print("tree_malformed (%s): %d malformed and %d untrusted frames for the box dropped (%d fragments), "
              "%d for another box and 1 other UDP frame forwarded untouched, %d partials summed; dispatched %s" %
              (name, len(mine), len(untrusted), fragments, len(transit), len(partials), dispatched))


def tree_bad_json_scenario(tmp, in_pcap):
    """Each malformed tree field refused with its field named, nothing installed; the
    same ring and tree again is ok, another tree a conflict; accumulate mode refuses trees."""
    wrpcap(in_pcap, [])
    good = dict(ring_spec(31, 4, 7, 4, 1024), tree=leaf_tree())
    msgs = []

    def bad(ctl, tree, field, code="invalid_argument", ring=None):
        r = ctl(cmd="install_ring", ring=dict(ring or good, tree=tree))
        assert r["ok"] is False, (tree, r)
        assert r["error"]["code"] == code and r["error"]["field"] == field, (tree, field, r)
        msgs.append(r["error"]["message"])

    def during(ctl):
        t = leaf_tree
        bad(ctl, [], "tree")
        bad(ctl, dict(t(), colour=1), "tree.colour")
        bad(ctl, {k: v for k, v in t().items() if k != "self"}, "tree.self")
        bad(ctl, dict(t(), self=dict(LEAF, ip="10.9.0.256")), "tree.self.ip")
        bad(ctl, dict(t(), self=dict(LEAF, mac="02:00:00:00:09")), "tree.self.mac")
        bad(ctl, dict(t(), children=[]), "tree.children")
        bad(ctl, dict(t(), children=[{"rank": 0}, {"node": 1}]), "tree.children[1]")
        bad(ctl, dict(t(), children=[{"rank": 0}, {"rank": 4}]), "tree.children")
        bad(ctl, dict(t(), children=[{"rank": 0}, {"rank": 0}]), "tree.children")
        bad(ctl, dict(t(), children=[{"rank": 0}, {"box": 0}]), "tree.children")
        bad(ctl, dict(t(), boxes=[dict(LEAF2)], children=[{"rank": 0}, {"box": 0}]), "tree.boxes[0].port")
        bad(ctl, dict(t(), boxes=[dict(LEAF2, port="c")], children=[{"rank": 0}, {"box": 0}]),
            "tree.boxes[0].port")
        bad(ctl, dict(t(), boxes=[dict(LEAF, port="a")], children=[{"rank": 0}, {"box": 0}]), "tree.boxes")
        bad(ctl, dict(t(), parent=dict(SPINE)), "tree.parent.port")
        bad(ctl, dict(t(), parent=dict(LEAF, port="b")), "tree.parent")
        bad(ctl, {k: v for k, v in t().items() if k not in ("parent", "index_at_parent")}, "tree.parent")
        bad(ctl, dict(t(), index_at_parent=16), "tree.index_at_parent")
        bad(ctl, dict(t(), index_at_parent=-1), "tree.index_at_parent")
        bad(ctl, {k: v for k, v in t().items() if k != "epoch"}, "tree.epoch")
        bad(ctl, dict(t(), epoch=1 << 32), "tree.epoch")
        bad(ctl, {k: v for k, v in t().items() if k != "key"}, "tree.key")
        bad(ctl, dict(t(), key=TREE_KEY.hex()[:-2]), "tree.key")
        bad(ctl, dict(t(), key="00" * 32), "tree.key")
        bad(ctl, t(), "window", ring=dict(good, window=0))  # the ring's own fields first
        listed = ctl(cmd="list_rings")
        assert listed["rings"] == [], listed
        assert ctl(cmd="status")["memory"]["engine_reserved_bytes"] == 0
        assert ctl(cmd="install_ring", ring=good)["ok"]
        assert ctl(cmd="install_ring", ring=good)["ok"]  # the same ring and tree: ok
        bad(ctl, dict(t(), index_at_parent=2), "tree", "conflict")
        bad(ctl, dict(t(), epoch=TREE_EPOCH + 1), "tree", "conflict")  # another installation
        plain = {k: v for k, v in good.items() if k != "tree"}
        r = ctl(cmd="install_ring", ring=plain)
        assert r["ok"] is False and r["error"]["code"] == "conflict" and r["error"]["field"] == "tree", r
        got = ctl(cmd="get_ring", id=31)["ring"]
        assert got["spec"]["tree"] == reported(leaf_tree()), got["spec"]
        assert set(got["counters"]["tree"]) >= {"partials_sent", "partials_resent", "partials_received",
                                                "results_received", "results_sent", "results_resent"}, got
    run_dataplane(tmp, in_pcap, [], 1, during=during)
    # Accumulate mode: a tree is refused, the box stays empty.
    tmp2 = os.path.join(tmp, "acc")
    os.mkdir(tmp2)

    def during_acc(ctl):
        r = ctl(cmd="install_ring", ring=good)
        assert r["ok"] is False and r["error"]["code"] == "unimplemented" and r["error"]["field"] == "tree", r
        msgs.append(r["error"]["message"])
        assert ctl(cmd="list_rings")["rings"] == []
    run_dataplane(tmp2, in_pcap, [], 1, during=during_acc, extra={"engine": {"reduce_mode": "accumulate"}})
    print("tree_bad_json: %d malformed trees refused with their field named; same tree ok, another a "
          "conflict" % len(msgs))
    for m in msgs[:4] + msgs[-2:]:
        print("  e.g. " + m)


SCENARIOS = {
    "tree_bad_json": lambda tmp, in_pcap, rng: tree_bad_json_scenario(tmp, in_pcap),
    "tree_leaf": tree_leaf_scenario,
    "tree_root": lambda tmp, in_pcap, rng: tree_root_scenario(tmp, in_pcap, rng, 1),
    "tree_steering": tree_steering_scenario,
    "tree_malformed": lambda tmp, in_pcap, rng: tree_malformed_scenario(tmp, rng),
}


if __name__ == "__main__":
    main(SCENARIOS)
