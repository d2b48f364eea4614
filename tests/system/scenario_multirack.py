#!/usr/bin/python3
"""System scenario 'multirack': one job over two racks through a tree of
three real boxes, over real Soft-RoCE.

Set-up: nrlab's two-rack lab (nrlab.py, "Two racks"): guests g0, g1 in rack
A behind leaf box leafA, g2, g3 in rack B behind leafB, a spine box above
them; each rack's switch steers its guests' RoCE into its leaf, and the
leaf-spine links upA and upB carry whatever crosses between racks. Three
real netreduced run host-side, one per box, with the same fabric section
(only `self` differs): rack A is 10.77.0.1-2, rack B 10.77.0.3-4, the spine
the root with leafA and leafB as children in that order. Each job is
netreduce-allreduce-perf in the four guests (rank r in g<r>, P = 4) with
NETREDUCE_DAEMON at leafA's daemon: rank 0's one registration installs the
ring's tree on all three boxes (leafA publishes the others' entries in a
real etcd, host-side, which the other two daemons watch).

Steps, each reported on its own and each able to fail:
  tree: every dtype x every op, 8 B..32 KiB, with --check-order --rack-size 2:
     fp32/fp64 sums of order-sensitive values checked by the tool against the
     tree's rule ((r0 + r1) + (r2 + r3): each rack in rank order at its leaf,
     then the racks in child order at the spine), every other dtype x op
     exact. Required: every rank exits 0, path ina, 0 errors on every row,
     and elements that would differ under another nesting (the check tells
     the orders apart). The origin's GET shows every box's entry published
     and installed; each box's list_rings shows its node (leaves: their two
     ranks, the spine: two child boxes). Per-link byte counts (tcpdump on
     upA and upB, decoded here from the IBTA and box-to-box layouts): the
     distinct partials leafA sends up are exactly the distinct RDMA WRITE
     packets of g0 (one partial per rack per position, not every worker's
     data), likewise leafB and g2, one result comes down for each, and no
     RoCE frame between two guests of one rack crosses a leaf-spine link.
     The boxes' tree counters agree (the spine took every partial).
  tree-loss: 2% of all frames dropped on rack A's leaf-spine link, both
     directions (nftables on the link's ends): fp32, int64, bf16 sums,
     8 B..32 KiB, --check-order --rack-size 2: still exact and still INA;
     the link dropped frames, the workers' RC recovered (no retry_exceeded).
  fabric-order: ranks alternate between the racks (rank r on g0, g2, g1,
     g3) and name no rack: rank 0 reads the racks from its daemon's status
     (the fabric section) and every rank its rack from its address, so the
     ring the origin registers holds g0, g1 (rack A) then g2, g3 (rack B):
     two rack crossings where rank order makes four. fp32 sums 8 B..32 KiB,
     exact, on the INA path.
  rina: Rina mode (--rina) with rack B taken as a rack without a box (its
     ranks labelled rackB, no leaf of the fabric): rack A (g0, g1, its
     label from the fabric) reduces through leafA, a ring of 3 groups runs
     in 2 lanes (g0 and g1 each carry one, g2 and g3 both), and leafA
     spreads the lanes. fp32, int64 and bf16 sums, 8 B..32 KiB,
     exact; every rank names the plan; ranks 0 and 1 report their rack
     stage on the INA path through one ring at leafA, which aggregated
     exactly the two passes of every call (the rack's sum, the spread);
     ranks 2 and 3 have no rack stage. The leaf-spine link upA carries
     the lanes, g0 and g1 one each (equal WRITE payloads up), and no
     box-to-box frame. The same calls then run on the flat ring (rank
     order, --force-ring) for the figures beside Rina's: time per call and
     bytes on upA.
  rina-bypass: the same job (NETREDUCE_RINA=1 this time), fp32 sums of 256
     KiB, while leafA, restarted with fault injection, bypasses every ring
     for 3 s: only rack A's stage fails over to its ring (ranks 0 and 1 log
     the switch; 2 and 3 do not), the job goes on exact, and rack A is back
     on its box at the end (failback after 8 calls).
A report per step (figures, counters) is printed and saved next to the run.
"""
import os
import re
import socket
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))
from lab_box import Capture, pcap_frames  # noqa: E402
from lab_common import HOST_IP, ROCE_PORT, Failed, LabError, expect  # noqa: E402
from lab_report import Report, run_step, scenario_args  # noqa: E402
from nrlab import B2B, Lab  # noqa: E402
import scenario_allreduce as sa  # noqa: E402  (Daemon, Job, sweep rules, capture parsing)
from b2b_golden import B2B_PORT, KINDS  # noqa: E402  (the box-to-box layout's independent description)
from etcd_cluster import EtcdCluster  # noqa: E402

RACKS = [2, 2]
BOOT_PORT = 29520
PORTS = {"leafA": 7470, "leafB": 7471, "spine": 7472}
ORIGIN = "leafA"
ORDER = ["--check-order", "--rack-size", "2"]
RUN = sa.SMALL + ORDER
LOSS_PERCENT = 2
LOSS_RUN = ["-d", "fp32,int64,bf16", "-o", "sum", "-b", "8", "-e", "32K", "-f", "8", "-n", "1", "-w", "0",
            "-c", "1"] + ORDER
JOB_TIMEOUT = 300  # the jobs take 10-15 s; well inside meson's 900 s, so a hang is reported


def fabric(lab, name, etcd):
    """The fabric section every daemon gets (only `self` differs)."""
    boxes = []
    for box, parent in (("spine", "none"), ("leafA", "spine"), ("leafB", "spine")):
        b = {"name": box, "daemon": "http://%s:%d" % (HOST_IP, PORTS[box]), "b2b_ip": B2B[box][0],
             "b2b_mac": B2B[box][1], "parent": parent}
        if box == "spine":
            b["ports"] = {"leafA": "a", "leafB": "b"}
        else:
            b["port_to_parent"] = "b"
        boxes.append(b)
    racks = [{"leaf": leaf, "workers": ["%s/32" % g.ip for g in lab.guests if g.rack == i]}
             for i, leaf in enumerate(("leafA", "leafB"))]
    return {"fabric": {"self": name, "etcd": {"endpoints": etcd.endpoints}, "boxes": boxes,
                       "racks": racks}}


def start_daemons(lab, exe, etcd):
    return {n: sa.Daemon(lab, exe, port=PORTS[n], box=lab.boxes[n], name="netreduced-" + n,
                         extra=fabric(lab, n, etcd)) for n in ("spine", "leafA", "leafB")}


def tree_counters(lab, rid):
    out = {}
    for n, b in lab.boxes.items():
        r = b.ring(rid)
        expect(r is not None, "%s holds no ring %d" % (n, rid))
        out[n] = r["counters"]["tree"]
    return out


def ip(b):
    return socket.inet_ntoa(b)


def link_traffic(pcap, rack_ips, leaf_ip):
    """One leaf-spine link's capture, decoded: RoCE frames up (from the rack)
    and down, whether any connects two guests of the rack, box-to-box frames
    by kind and direction with their distinct (tree, message, position) keys
    and data bytes."""
    t = {"roce_up": [0, 0], "roce_down": [0, 0], "in_rack": 0, "other": [0, 0]}
    b2b = {}
    for f in pcap_frames(pcap):
        if len(f) < 42 or f[12:14] != b"\x08\x00" or f[23] != 17:
            continue
        l4 = 14 + (f[14] & 0xF) * 4
        dport = struct.unpack(">H", f[l4 + 2:l4 + 4])[0]
        src, dst = ip(f[26:30]), ip(f[30:34])
        if dport == ROCE_PORT:
            key = "roce_up" if src in rack_ips else "roce_down"
            t[key][0] += 1
            t[key][1] += len(f)
            t["in_rack"] += src in rack_ips and dst in rack_ips
        elif dport == B2B_PORT:
            h = f[l4 + 8:]
            kind, tree, msg, k = h[3], struct.unpack(">I", h[4:8])[0], struct.unpack(">I", h[8:12])[0], \
                struct.unpack(">H", h[12:14])[0]
            length = struct.unpack(">H", h[20:22])[0]
            d = "up" if src == leaf_ip else "down"
            e = b2b.setdefault((KINDS.get(kind, str(kind)), d), {"frames": 0, "bytes": 0, "keys": {}})
            e["frames"] += 1
            e["bytes"] += len(f)
            e["keys"][(tree, msg, k)] = length
        else:
            t["other"][0] += 1
            t["other"][1] += len(f)
    t["b2b"] = b2b
    return t


def distinct_writes(frames):
    """{source ip: distinct RDMA WRITE packets (src, dst, QPN, PSN)} of the
    frames into a leaf (retransmissions counted once)."""
    out = {}
    for (src, _, _, _) in sa.frames_by_key(frames):
        out[ip(src)] = out.get(ip(src), 0) + 1
    return out


def box_cpu(box):
    """A running box's CPU seconds and lifetime (/proc/<pid>/stat), as text."""
    with open("/proc/%d/stat" % box.proc.pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    hz = os.sysconf("SC_CLK_TCK")
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    cpu, life = (int(fields[11]) + int(fields[12])) / hz, up - int(fields[19]) / hz
    return "%.1f s / %.1f s (%.0f%% of a core)" % (cpu, life, 100 * cpu / life)


def run_job(lab, a, daemon, args, tag, rep):
    t = time.monotonic()
    job = sa.Job(lab, a.perf, args, daemon=daemon, tag=tag)
    res = job.wait(JOB_TIMEOUT)
    head, rows = job.check_ok(res, "ina")
    rep.figure("job wall time", "%.1f" % (time.monotonic() - t), "s")
    rep.figure("rows checked exact (dtype x op x size)", len(rows))
    om = re.search(r"^# order check: (\d+) elements against the nested rule \(racks of 2 ranks in rank order, "
                   r"then 2 racks in order\); (\d+) of them differ under the flat ring order$", res[0].out, re.M)
    want = sum(b // sa.DTYPES[d] for d, o, b in set(sa.expected_calls(args[:args.index("--check-order")]))
               if o == "sum" and d in ("fp32", "fp64"))
    expect(om and int(om.group(1)) == want, "%s: order check line %s, expected %d elements" %
           (tag, om and om.group(0), want))
    expect(int(om.group(2)) > 0, "%s: no element differs under the flat ring order: the check cannot tell "
           "a tree from one box" % tag)
    rep.figure("order check (tree rule): elements / differing under the flat ring order",
               "%s / %s" % om.groups())
    return head


def step_tree(lab, a, daemons, rep):
    rack_ips = [{g.ip for g in lab.guests if g.rack == r} for r in (0, 1)]
    cap = Capture(lab, ("upA", "upB"), bpf="udp")
    into = lab.capture(("swAa", "swBa"))
    spine = Capture(lab, ("swSa", "swSb"), bpf="udp dst port %d" % B2B_PORT)
    head = run_job(lab, a, daemons[ORIGIN], RUN, "tree", rep)
    rid = head["ring"]
    time.sleep(1)  # last ACKs and results into the captures
    caps, ins, sp = cap.stop(), into.stop(), spine.stop()
    for name, (path, kdrops) in list(caps.items()) + list(ins.items()) + list(sp.items()):
        expect(kdrops == 0, "the capture on %s dropped %d frames: the exact counts below need every one" %
               (name, kdrops))
    rep.line("ring %d: %d ranks, racks %s" % (rid, len(lab.guests), [sorted(s) for s in rack_ips]))

    # One registration installed the tree on every box.
    view = daemons[ORIGIN].ring(rid)
    peers = view["fabric"]["peers"]
    expect(sorted(p["box"] for p in peers) == ["leafB", "spine"] and all(p["installed"] for p in peers),
           "origin's view of its peers: %s" % peers)
    rep.figure("fabric: published and installed at", ", ".join(sorted(p["box"] for p in peers)))
    nodes = {n: b.ring(rid)["spec"]["tree"] for n, b in lab.boxes.items()}
    expect([c.get("rank") for c in nodes["leafA"]["children"]] == [0, 1], "leafA node %s" % nodes["leafA"])
    expect([c.get("rank") for c in nodes["leafB"]["children"]] == [2, 3], "leafB node %s" % nodes["leafB"])
    expect([c.get("box") for c in nodes["spine"]["children"]] == [0, 1] and "parent" not in nodes["spine"],
           "spine node %s" % nodes["spine"])
    rep.line("tree: leafA ranks 0, 1 -> spine <- leafB ranks 2, 3 (each box's list_rings)")

    # Per-link byte counts.
    for r, (leaf, link, guest) in enumerate((("leafA", "upA", lab.guests[0]), ("leafB", "upB", lab.guests[2]))):
        t = link_traffic(caps[link][0], rack_ips[r], B2B[leaf][0])
        into_leaf = pcap_frames(ins["sw%sa" % "AB"[r]][0])
        mates = [g for g in lab.guests if g.rack == r and g is not guest]
        counts = distinct_writes(into_leaf)
        writes, writes_mate = counts.get(guest.ip, 0), counts.get(mates[0].ip, 0)
        payload = sa.write_payload_by_source(into_leaf)
        rep.line("link %s (%s <-> spine):" % (link, leaf))
        for k in ("roce_up", "roce_down", "other"):
            rep.figure("  %s frames / bytes" % k, "%d / %d" % tuple(t[k]))
        for (kind, d), e in sorted(t["b2b"].items()):
            rep.figure("  box-to-box %s %s frames / bytes / distinct" % (kind, d),
                       "%d / %d / %d" % (e["frames"], e["bytes"], len(e["keys"])))
        rep.figure("  distinct RDMA WRITE packets into %s from %s / %s" % (leaf, guest.name, mates[0].name),
                   "%d / %d" % (writes, writes_mate))
        up = t["b2b"].get(("partial", "up"), {"keys": {}})["keys"]
        down = t["b2b"].get(("result", "down"), {"keys": {}})["keys"]
        rack_payload = sum(payload.get(g.ip, 0) for g in lab.guests if g.rack == r)
        rep.figure("  RDMA WRITE payload into %s from the rack / partial data up %s" % (leaf, link),
                   "%d / %d" % (rack_payload, sum(up.values())), "B")
        expect(0 < sum(up.values()) <= payload.get(guest.ip, 0),
               "%s: partial data up %d B, more than one rank's WRITE payload %d B" %
               (leaf, sum(up.values()), payload.get(guest.ip, 0)))
        expect(writes > 0 and writes == writes_mate, "%s: %d and %d distinct WRITE packets from the rack's two "
               "ranks" % (leaf, writes, writes_mate))
        expect(len(up) == writes, "%s sent %d distinct partials up %s, expected one per position: %d" %
               (leaf, len(up), link, writes))
        expect(set(down) == set(up), "%s: results down %d, partials up %d, keys differ" % (leaf, len(down), len(up)))
        expect(t["in_rack"] == 0, "%d RoCE frames between two guests of rack %s crossed %s" %
               (t["in_rack"], "AB"[r], link))
    # The spine sends each leaf its results by the port the fabric names for it
    # (ports: {leafA: a, leafB: b}); the switch brings every partial to port a.
    results = {}
    for port, (path, _) in (("a", sp["swSa"]), ("b", sp["swSb"])):
        for f in pcap_frames(path):
            l4 = 14 + (f[14] & 0xF) * 4
            if f[l4 + 8 + 3] == 2:  # a result
                results.setdefault((port, ip(f[30:34])), 0)
                results[(port, ip(f[30:34]))] += 1
    want = {("a", B2B["leafA"][0]), ("b", B2B["leafB"][0])}
    rep.figure("spine results out of port -> leaf", {"%s -> %s" % k: v for k, v in sorted(results.items())})
    expect(set(results) == want, "the spine's results left by %s, expected leafA's by port a and leafB's by "
           "port b" % sorted(results))
    tc = tree_counters(lab, rid)
    for n in ("leafA", "leafB", "spine"):
        rep.figure("%s tree counters" % n, {k: v for k, v in tc[n].items() if v})
    expect(tc["spine"]["partials_received"] == tc["leafA"]["partials_sent"] + tc["leafB"]["partials_sent"],
           "the spine took %d partials, the leaves sent %d + %d" % (tc["spine"]["partials_received"],
                                                                      tc["leafA"]["partials_sent"],
                                                                      tc["leafB"]["partials_sent"]))
    expect(tc["leafA"]["results_received"] == tc["leafA"]["partials_sent"] > 0, "leafA: %s" % tc["leafA"])
    return rid


def step_loss(lab, a, daemons, rep):
    rx0 = sa.rxe_all(lab)
    lab.link_loss(0, LOSS_PERCENT)
    try:
        head = run_job(lab, a, daemons[ORIGIN], LOSS_RUN, "tree-loss", rep)
    finally:
        dropped = lab.link_loss(0, None)
    rep.figure("link upA: frames dropped (up / down)", "%d / %d" % (dropped.get("up", 0), dropped.get("down", 0)))
    expect(sum(dropped.values()) > 0, "%d%% loss on upA dropped nothing" % LOSS_PERCENT)
    tc = tree_counters(lab, head["ring"])
    for n in ("leafA", "leafB", "spine"):
        rep.figure("%s tree counters" % n, {k: v for k, v in tc[n].items() if v})
    sa.check_rxe_clean(rep, lab, rx0, sa.rxe_all(lab), "rxe (all guests)")


def step_fabric_order(lab, a, daemons, rep):
    guests = [lab.guests[i] for i in (0, 2, 1, 3)]  # rank r's guest: racks A, B, A, B
    job = sa.Job(lab, a.perf, sa.AFTER_RESTART, daemon=daemons[ORIGIN], tag="fabric order", guests=guests)
    head, rows = job.check_ok(job.wait(JOB_TIMEOUT), "ina")
    members = [m["address"] if isinstance(m, dict) else m for m in daemons[ORIGIN].ring(head["ring"])["members"]]
    racks = {g.ip: g.rack for g in lab.guests}
    crossings = sum(racks[members[i]] != racks[members[(i + 1) % len(members)]] for i in range(len(members)))
    rank_order = sum(guests[i].rack != guests[(i + 1) % len(guests)].rack for i in range(len(guests)))
    expect(members == [g.ip for g in lab.guests] and crossings == 2,
           "ring members %s (racks %s), expected rack A's guests then rack B's: %d rack crossings" %
           (members, [racks[m] for m in members], crossings))
    rep.figure("ring members (ranks alternate between the racks)", ", ".join(members))
    rep.figure("rack crossings of the ring / of rank order", "%d / %d" % (crossings, rank_order))
    rep.figure("rows checked exact (fp32 sum 8 B..32 KiB)", len(rows))


RINA_RUN = ["-d", "fp32,int64,bf16", "-o", "sum", "-b", "8", "-e", "32K", "-f", "8", "-n", "3", "-w", "0",
            "-c", "1", "--rina"]


RINA_PLAN = "rina: 3 groups, 2 lanes: leafA (ranks 0, 1) through its box; rank 2 alone; rank 3 alone"
NO_BOX = [{}, {}, {"NETREDUCE_RACK": "rackB"}, {"NETREDUCE_RACK": "rackB"}]  # rack B: a label no leaf has


def rina_stages(res):
    """{rank: (rack stage path, its ring id, its failovers)} from each rank's
    Rina line, which must name RINA_PLAN."""
    stages = {}
    for r, out in enumerate(x.out for x in res):
        m = re.search(r"^# rank %d: (.*); this rank's rack stage: (\w+) \(ring (\d+), (\d+) failovers\)$" % r,
                      out, re.M)
        expect(m and m.group(1) == RINA_PLAN, "rank %d's Rina line %s, expected the plan %r" %
               (r, m and m.group(0), RINA_PLAN))
        stages[r] = (m.group(2), int(m.group(3)), int(m.group(4)))
    return stages


def step_rina(lab, a, daemons, rep):
    rack_a = {g.ip for g in lab.guests if g.rack == 0}
    cap = Capture(lab, ("upA",), bpf="udp")
    job = sa.Job(lab, a.perf, RINA_RUN, daemon=daemons[ORIGIN], tag="rina", rank_env=NO_BOX)
    res = job.wait(JOB_TIMEOUT)
    time.sleep(1)  # last ACKs into the capture
    caps = cap.stop()
    head, rows = job.check_ok(res, "ring", row_path="ina")  # a row's path: rank 0's rack stage
    stages = rina_stages(res)
    expect(stages[0] == stages[1] and stages[0][0] == "ina" and stages[0][1] != 0 and stages[0][2] == 0,
           "ranks 0 and 1: rack stages %s, expected one ring at leafA on the INA path" % [stages[0], stages[1]])
    expect(all(stages[r][1] == 0 for r in (2, 3)), "ranks 2 and 3 have a rack ring: %s" % stages)
    # Rack A's two ranks, per call of b bytes: the rack's pass (b each) and
    # the spread (b as int32 words, plus the count word), and the probe.
    calls = sa.expected_calls(RINA_RUN)
    want = 2 * (sum(b + 4 * (-(-b // 4)) + 4 for _, _, b in calls) + 4)
    ring = lab.boxes["leafA"].ring(stages[0][1])
    expect(ring is not None and ring["counters"]["bytes_aggregated"] == want,
           "leafA's rack ring %d aggregated %s data bytes, expected %d (%d calls: pass and spread)" %
           (stages[0][1], ring and ring["counters"]["bytes_aggregated"], want, len(calls)))
    path, kdrops = caps["upA"]
    expect(kdrops == 0, "the capture on upA dropped %d frames" % kdrops)
    t = link_traffic(path, rack_a, B2B["leafA"][0])
    up = sa.write_payload_by_source(pcap_frames(path))
    expect(t["in_rack"] == 0 and not t["b2b"] and t["roce_up"][0] > 0 and t["roce_down"][0] > 0,
           "upA during Rina: %d RoCE frames between rack A's guests, box-to-box %s, RoCE up / down %s / %s "
           "(expected lanes only)" % (t["in_rack"], sorted(t["b2b"]), t["roce_up"], t["roce_down"]))
    g0, g1 = up.get(lab.guests[0].ip, 0), up.get(lab.guests[1].ip, 0)
    expect(g0 > 0 and abs(g0 - g1) <= 0.05 * max(g0, g1),
           "WRITE payload up upA from g0 / g1: %d / %d B, expected their two equal lanes" % (g0, g1))
    rep.figure("plan", RINA_PLAN)
    rep.figure("rows checked exact (fp32, int64, bf16 sums, 8 B..32 KiB)", len(rows))
    rep.figure("rack A's ring at leafA: data bytes aggregated", ring["counters"]["bytes_aggregated"])
    rep.figure("upA: RoCE frames / bytes up, down", "%d / %d, %d / %d" % tuple(t["roce_up"] + t["roce_down"]))
    rep.figure("upA: RDMA WRITE payload up from g0 / g1 (their lanes)",
               "%d / %d" % (up.get(lab.guests[0].ip, 0), up.get(lab.guests[1].ip, 0)), "B")

    # The same calls on the flat ring (rank order, the box forwarding), for
    # the figures beside Rina's: time per call and bytes on upA.
    cap = Capture(lab, ("upA",), bpf="udp")
    flat = sa.Job(lab, a.perf, RINA_RUN[:-1] + ["--force-ring"], daemon=daemons[ORIGIN], tag="flat ring")
    fres = flat.wait(JOB_TIMEOUT)
    time.sleep(1)
    fpath, _ = cap.stop()["upA"]
    _, frows = flat.check_ok(fres, "ring")
    ft = link_traffic(fpath, rack_a, B2B["leafA"][0])
    us = {(x["type"], x["bytes"]): x["us"] for x in rows}
    fus = {(x["type"], x["bytes"]): x["us"] for x in frows}
    for key in sorted(k for k in us if k[0] == "fp32"):
        rep.figure("%s %d B: us per call, Rina / flat ring" % key, "%.0f / %.0f" % (us[key], fus[key]))
    rep.figure("upA: RoCE bytes up + down, Rina / flat ring",
               "%d / %d" % (t["roce_up"][1] + t["roce_down"][1], ft["roce_up"][1] + ft["roce_down"][1]))


RINA_BYPASS_RUN = ["-d", "fp32", "-o", "sum", "-b", "256K", "-e", "256K", "-n", "120", "-w", "0", "-c", "1",
                   "--timeout-ms", "30000", "--failback-calls", "8"]


def rack_a_rings(box, ips):
    return {r["spec"]["id"]: r for r in box.control(cmd="list_rings")["rings"]
            if [m["address"] if isinstance(m, dict) else m for m in r["spec"]["members"]] == ips}


def step_rina_bypass(lab, a, daemons, rep):
    box, daemon = lab.boxes["leafA"], daemons["leafA"]
    box.stop()
    box.start(extra={"faults": {"enabled": True}})
    deadline = time.monotonic() + 60
    while not (daemon.get("/v1/health", check=False) or {}).get("dataplane_connected"):
        expect(time.monotonic() < deadline, "netreduced-leafA did not reconnect to the restarted box")
        time.sleep(0.3)
    ips = [g.ip for g in lab.guests if g.rack == 0]
    before = set(rack_a_rings(box, ips))
    job = sa.Job(lab, a.perf, RINA_BYPASS_RUN, daemon=daemons[ORIGIN], tag="rina bypass",
                 qp_timeout=sa.BYPASS_QP_TIMEOUT, env={"NETREDUCE_RINA": "1"}, rank_env=NO_BOX)
    try:
        # Once rack A's new ring aggregates, every ring at leafA is bypassed for 3 s.
        deadline = time.monotonic() + 300
        while True:
            fresh = {i: r for i, r in rack_a_rings(box, ips).items() if i not in before}
            if any(r["counters"]["bytes_aggregated"] > 0 for r in fresh.values()):
                break
            expect(time.monotonic() < deadline and not any(j.done() for j in job.jobs),
                   "rack A's ring never aggregated before the bypass (rings %s)" % sorted(fresh))
            time.sleep(0.2)
        daemon.post("/v1/faults", {"ring": "all", "kind": "bypass", "duration_ms": 3000})
        res = job.wait(900)
    finally:
        daemon.delete("/v1/faults")
    expect(all(x.rc == 0 for x in res), "ranks exited %s after rack A's bypass\n%s" % (
        [x.rc for x in res], "\n".join("rank %d:\n%s" % (r, x.err.strip()[-1500:]) for r, x in enumerate(res))))
    expect("status: ok" in res[0].out, "rank 0 did not report every call exact:\n%s" % res[0].out[-2000:])
    stages = rina_stages(res)
    switches = [sum("switched to the ring path" in ln for ln in x.err.splitlines()) for x in res]
    expect(switches[0] >= 1 and switches[1] >= 1 and switches[2] == 0 and switches[3] == 0,
           "switches to the ring path logged per rank %s: expected rack A's two ranks only" % switches)
    expect(all(stages[r][0] == "ina" and stages[r][2] >= 1 for r in (0, 1)),
           "rack A's stages at the end %s: expected back on its box after its failover" % [stages[0], stages[1]])
    rep.figure("rack stage at the end, failovers (ranks 0, 1)", "%s, %d / %s, %d" % (
        stages[0][0], stages[0][2], stages[1][0], stages[1][2]))
    rep.figure("switches to the ring path logged per rank", switches)
    rep.line("rack A fell back during the bypass and rejoined its box; ranks 2, 3 ran on unchanged")


def main():
    a, _ = scenario_args(("dataplane", "daemon", "perf"))
    sa.BOOT_PORT = BOOT_PORT
    t0 = time.monotonic()
    reports, ok = [], False
    try:
        with Lab(racks=RACKS, dataplane=a.dataplane, workdir=a.workdir) as lab:
            head = Report("multirack", lab.run_dir)
            reports.append(head)
            head.line("2 racks x 2 guests (kernel %s, rdma_rxe), a leaf box per rack and a spine, "
                      "net_af_packet" % lab.kernel)
            head.figure("lab setup (boot to rxe0 ready, three boxes)", "%.1f" % lab.setup_seconds, "s")
            # In the lab namespace, beside the daemons, on the host's lab address.
            etcd = EtcdCluster(lab.run_dir, wrap=["ip", "netns", "exec", lab.ns], host=HOST_IP)
            try:
                daemons = start_daemons(lab, a.daemon, etcd)
                for name, step in (("multirack-tree", step_tree), ("multirack-loss", step_loss),
                                   ("multirack-fabric-order", step_fabric_order),
                                   ("multirack-rina", step_rina), ("multirack-rina-bypass", step_rina_bypass)):
                    reports.append(Report(name, lab.run_dir))
                    run_step(lab, [reports[-1]], step, lab, a, daemons, reports[-1])
            finally:
                etcd.close()
            for n, b in lab.boxes.items():  # three polling boxes beside four guests on 2 cores
                head.figure("%s CPU time (user + system) / its wall time" % n, box_cpu(b))
            head.figure("scenario wall time", "%.1f" % (time.monotonic() - t0), "s")
            ok = True
    except (Failed, LabError) as e:
        print("FAILED: %s" % e, file=sys.stderr)
        if reports:
            reports[-1].failed(e)
    for r in reports:
        r.save(ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
